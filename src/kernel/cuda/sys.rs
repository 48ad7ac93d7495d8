//! The thin unsafe layer: every raw CUDA driver and NVRTC call of the backend lives
//! here, each wrapped so that callers above see owned handles and `Result`s. Nothing
//! here knows about cases or kernels. Libraries are loaded at run time (cudarc's
//! `dynamic-loading`), so a machine without CUDA builds and runs everything else;
//! [`driver_present`] and [`nvrtc_present`] must be checked before any other call,
//! because cudarc panics when a library is missing.

use cudarc::driver::{result, sys};
use cudarc::nvrtc::sys as nvrtc;
use std::ffi::{c_void, CStr, CString};

pub type DeviceError = String;

fn drv(e: result::DriverError) -> DeviceError {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    let what = e
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{name}: {what}")
}

/// Whether libcuda can be loaded (without it cudarc panics on first use).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names.
    unsafe { sys::is_culib_present() }
}

/// Whether libnvrtc can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: as above.
    unsafe { nvrtc::is_culib_present() }
}

/// Number of CUDA devices the driver sees (honours CUDA_VISIBLE_DEVICES).
pub fn device_count() -> Result<usize, DeviceError> {
    result::init().map_err(drv)?;
    result::device::get_count().map(|n| n as usize).map_err(drv)
}

/// One device's primary context, current on the thread that created it. The backend
/// runs one case at a time per process, so a single (null) stream suffices.
pub struct Context {
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
}

// SAFETY: the context handle may be made current on any thread (bind()).
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

impl Context {
    pub fn new(ordinal: usize) -> Result<Context, DeviceError> {
        result::init().map_err(drv)?;
        let dev = result::device::get(ordinal as i32).map_err(drv)?;
        // SAFETY: dev is a valid device handle.
        let ctx = unsafe { result::primary_ctx::retain(dev) }.map_err(drv)?;
        let c = Context { dev, ctx };
        c.bind()?;
        Ok(c)
    }

    /// Makes the context current on the calling thread.
    pub fn bind(&self) -> Result<(), DeviceError> {
        // SAFETY: ctx is a retained primary context.
        unsafe { result::ctx::set_current(self.ctx) }.map_err(drv)
    }

    /// The device's ordinal as the driver's memory calls take it.
    pub fn device(&self) -> i32 {
        self.dev
    }

    pub fn attribute(&self, a: sys::CUdevice_attribute) -> Result<i32, DeviceError> {
        // SAFETY: valid device handle.
        unsafe { result::device::get_attribute(self.dev, a) }.map_err(drv)
    }

    pub fn name(&self) -> String {
        result::device::get_name(self.dev).unwrap_or_else(|_| "unknown GPU".into())
    }

    pub fn total_mem(&self) -> Result<u64, DeviceError> {
        // SAFETY: valid device handle.
        unsafe { result::device::total_mem(self.dev) }
            .map(|b| b as u64)
            .map_err(drv)
    }

    /// Free and total device memory.
    pub fn mem_info(&self) -> Result<(u64, u64), DeviceError> {
        result::mem_get_info()
            .map(|(f, t)| (f as u64, t as u64))
            .map_err(drv)
    }

    /// Waits for all work; a kernel fault surfaces here.
    pub fn synchronize(&self) -> Result<(), DeviceError> {
        result::ctx::synchronize().map_err(drv)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: balances the retain in new(); errors after a fault are irrelevant.
        let _ = unsafe { result::primary_ctx::release(self.dev) };
    }
}

/// An owned device allocation.
pub struct DeviceMemory {
    ptr: sys::CUdeviceptr,
    bytes: u64,
}

impl DeviceMemory {
    pub fn alloc(bytes: u64) -> Result<DeviceMemory, DeviceError> {
        // SAFETY: plain cuMemAlloc; zero-sized allocations are rounded up to 16 bytes.
        let ptr = unsafe { result::malloc_sync(bytes.max(16) as usize) }.map_err(drv)?;
        Ok(DeviceMemory { ptr, bytes })
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Copies `src` to the start of the allocation (or at byte `offset`).
    pub fn upload<T: Copy>(&self, offset: u64, src: &[T]) -> Result<(), DeviceError> {
        let n = std::mem::size_of_val(src) as u64;
        assert!(
            offset + n <= self.bytes.max(16),
            "upload past the allocation"
        );
        if n == 0 {
            return Ok(());
        }
        // SAFETY: bounds checked above; synchronous copy from a live host slice.
        unsafe { result::memcpy_htod_sync(self.ptr + offset, src) }.map_err(drv)
    }

    pub fn download<T: Copy>(&self, offset: u64, dst: &mut [T]) -> Result<(), DeviceError> {
        let n = std::mem::size_of_val(dst) as u64;
        assert!(
            offset + n <= self.bytes.max(16),
            "download past the allocation"
        );
        if n == 0 {
            return Ok(());
        }
        // SAFETY: bounds checked above; synchronous copy into a live host slice.
        unsafe { result::memcpy_dtoh_sync(dst, self.ptr + offset) }.map_err(drv)
    }

    pub fn memset(&self, byte: u8) -> Result<(), DeviceError> {
        // SAFETY: the whole allocation.
        unsafe { result::memset_d8_sync(self.ptr, byte, self.bytes.max(16) as usize) }.map_err(drv)
    }

    /// Device-to-device copy of `bytes` from `src` (for the bandwidth ceiling).
    pub fn copy_from(&self, src: &DeviceMemory, bytes: u64) -> Result<(), DeviceError> {
        assert!(bytes <= self.bytes && bytes <= src.bytes);
        // SAFETY: both allocations hold `bytes`.
        unsafe {
            result::memcpy_dtod_async(self.ptr, src.ptr, bytes as usize, std::ptr::null_mut())
        }
        .map_err(drv)
    }
}

/// A byte range of live device memory (a region's mapped chunks lent to a case).
#[derive(Clone, Copy, Debug)]
pub struct DeviceSpan {
    pub ptr: u64,
    pub bytes: u64,
}

impl DeviceSpan {
    pub fn upload<T: Copy>(&self, offset: u64, src: &[T]) -> Result<(), DeviceError> {
        let n = std::mem::size_of_val(src) as u64;
        assert!(offset + n <= self.bytes, "upload past the span");
        if n == 0 {
            return Ok(());
        }
        // SAFETY: bounds checked above against a span of a live allocation.
        unsafe { result::memcpy_htod_sync(self.ptr + offset, src) }.map_err(drv)
    }

    pub fn download<T: Copy>(&self, offset: u64, dst: &mut [T]) -> Result<(), DeviceError> {
        let n = std::mem::size_of_val(dst) as u64;
        assert!(offset + n <= self.bytes, "download past the span");
        if n == 0 {
            return Ok(());
        }
        // SAFETY: bounds checked above against a span of a live allocation.
        unsafe { result::memcpy_dtoh_sync(dst, self.ptr + offset) }.map_err(drv)
    }

    /// Sets every whole 32-bit word of the span to `word`.
    pub fn fill_u32(&self, word: u32) -> Result<(), DeviceError> {
        let n = (self.bytes / 4) as usize;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: `n` words inside a span of a live allocation; the span is 4-aligned
        // (cuMemAlloc aligns to 256 bytes and spans start at multiples of 4).
        unsafe { sys::cuMemsetD32_v2(self.ptr, word, n).result() }.map_err(drv)
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // SAFETY: frees our own allocation once; after a fault the call fails harmlessly.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// A reserved range of device virtual addresses: nothing is behind it until
/// [`PhysicalMemory`] is mapped into it, so an access to an unmapped part faults.
pub struct AddressRange {
    base: u64,
    bytes: u64,
}

impl AddressRange {
    /// Reserves `bytes` (a multiple of the allocation granularity) of addresses.
    pub fn reserve(bytes: u64, align: u64) -> Result<AddressRange, DeviceError> {
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: reserves addresses only; `base` receives the start.
        unsafe {
            sys::cuMemAddressReserve(&mut base, bytes as usize, align as usize, 0, 0).result()
        }
        .map_err(drv)?;
        Ok(AddressRange { base, bytes })
    }

    pub fn base(&self) -> u64 {
        self.base
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Maps `mem` at byte `offset` of the range (no access yet: [`AddressRange::allow`]).
    ///
    /// # Safety
    /// `offset..offset + mem.bytes()` lies inside the range and is not mapped, and `mem`
    /// stays alive while it is mapped ([`AddressRange::unmap`] before dropping it).
    pub unsafe fn map(&self, offset: u64, mem: &PhysicalMemory) -> Result<(), DeviceError> {
        assert!(offset + mem.bytes <= self.bytes, "mapping past the range");
        sys::cuMemMap(self.base + offset, mem.bytes as usize, 0, mem.handle, 0)
            .result()
            .map_err(drv)
    }

    /// Makes `bytes` from byte `offset` (all of it mapped) readable and writable by
    /// `device`: one call for many mappings.
    pub fn allow(&self, offset: u64, bytes: u64, device: i32) -> Result<(), DeviceError> {
        self.set_access(offset, bytes, device, true)
    }

    /// Makes `bytes` from byte `offset` (all of it mapped) readable but not writable by
    /// `device`: a store through these addresses faults (the memory may be writable
    /// through another mapping of it).
    pub fn allow_read(&self, offset: u64, bytes: u64, device: i32) -> Result<(), DeviceError> {
        self.set_access(offset, bytes, device, false)
    }

    fn set_access(
        &self,
        offset: u64,
        bytes: u64,
        device: i32,
        write: bool,
    ) -> Result<(), DeviceError> {
        assert!(offset + bytes <= self.bytes, "access past the range");
        if bytes == 0 {
            return Ok(());
        }
        let desc = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: device,
            },
            flags: if write {
                sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            } else {
                sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ
            },
        };
        // SAFETY: sets access flags on addresses of our own reservation; the driver
        // refuses (an error, not UB) a span that is not wholly mapped.
        unsafe { sys::cuMemSetAccess(self.base + offset, bytes as usize, &desc, 1).result() }
            .map_err(drv)
    }

    /// Unmaps `bytes` from byte `offset` of the range.
    ///
    /// # Safety
    /// The span is a union of whole mappings made by [`AddressRange::map`], and no
    /// device work that uses it is in flight (synchronize first).
    pub unsafe fn unmap(&self, offset: u64, bytes: u64) -> Result<(), DeviceError> {
        assert!(offset + bytes <= self.bytes, "unmapping past the range");
        if bytes == 0 {
            return Ok(());
        }
        sys::cuMemUnmap(self.base + offset, bytes as usize)
            .result()
            .map_err(drv)
    }
}

impl Drop for AddressRange {
    fn drop(&mut self) {
        // SAFETY: our own reservation, freed once; its mappings were removed first (the
        // owner unmaps before dropping), and after a fault the call fails harmlessly.
        let _ = unsafe { sys::cuMemAddressFree(self.base, self.bytes as usize).result() };
    }
}

/// Device memory with no address of its own (`cuMemCreate`): mapped into an
/// [`AddressRange`] to be used; it keeps its contents while unmapped.
pub struct PhysicalMemory {
    handle: sys::CUmemGenericAllocationHandle,
    bytes: u64,
}

impl PhysicalMemory {
    fn prop(device: i32) -> sys::CUmemAllocationProp {
        // SAFETY: a plain C struct; all-zero is its documented default.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location = sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        };
        prop
    }

    /// `bytes` (a multiple of [`PhysicalMemory::granularity`]) on `device`.
    pub fn create(device: i32, bytes: u64) -> Result<PhysicalMemory, DeviceError> {
        let prop = Self::prop(device);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `prop` describes plain device memory; `handle` receives it.
        unsafe { sys::cuMemCreate(&mut handle, bytes as usize, &prop, 0).result() }.map_err(drv)?;
        Ok(PhysicalMemory { handle, bytes })
    }

    /// The size every physical allocation and mapping must be a multiple of.
    pub fn granularity(device: i32) -> Result<u64, DeviceError> {
        let prop = Self::prop(device);
        let mut g = 0usize;
        // SAFETY: `prop` is valid; `g` receives the granularity.
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut g,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
            .result()
        }
        .map_err(drv)?;
        Ok(g as u64)
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for PhysicalMemory {
    fn drop(&mut self) {
        // SAFETY: our own handle, released once (memory still mapped is freed when
        // unmapped).
        let _ = unsafe { sys::cuMemRelease(self.handle).result() };
    }
}

/// A loaded module and one of its functions.
pub struct Function {
    module: sys::CUmodule,
    func: sys::CUfunction,
}

// SAFETY: module/function handles are usable from any thread with the context current.
unsafe impl Send for Function {}
unsafe impl Sync for Function {}

impl Function {
    /// Loads a cubin image and looks up `name`.
    pub fn load(image: &[u8], name: &str) -> Result<Function, DeviceError> {
        let mut img = image.to_vec();
        img.push(0);
        // SAFETY: the image is a complete cubin (or NUL-terminated PTX) that outlives the call.
        let module =
            unsafe { result::module::load_data(img.as_ptr() as *const c_void) }.map_err(drv)?;
        let cname = CString::new(name).expect("kernel names have no NUL");
        // SAFETY: module was just loaded.
        let func = unsafe { result::module::get_function(module, cname) }.map_err(drv)?;
        Ok(Function { module, func })
    }

    /// Allows `bytes` of dynamic shared memory (above the 48 KiB default).
    pub fn set_max_dynamic_smem(&self, bytes: u32) -> Result<(), DeviceError> {
        // SAFETY: valid function handle.
        unsafe {
            result::function::set_function_attribute(
                self.func,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        }
        .map_err(drv)
    }

    /// Resident CTAs per SM for this block size and shared memory.
    pub fn occupancy(&self, block: u32, smem: u32) -> Result<u32, DeviceError> {
        // SAFETY: valid function handle.
        unsafe {
            result::occupancy::max_active_block_per_multiprocessor(
                self.func,
                block as i32,
                smem as usize,
            )
        }
        .map(|n| n as u32)
        .map_err(drv)
    }

    /// Launches on the null stream. Each argument is a pointer to a value of the exact
    /// type the kernel's parameter has.
    ///
    /// # Safety
    /// `args` must match the kernel's parameter list in number, order and type, and
    /// every device pointer inside must stay allocated until the launch completes.
    pub unsafe fn launch(
        &self,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &mut [*mut c_void],
    ) -> Result<(), DeviceError> {
        result::launch_kernel(
            self.func,
            grid,
            (block, 1, 1),
            smem,
            std::ptr::null_mut(),
            args,
        )
        .map_err(drv)
    }
}

impl Drop for Function {
    fn drop(&mut self) {
        // SAFETY: unloads our own module once.
        let _ = unsafe { result::module::unload(self.module) };
    }
}

/// A pair of timing events around device work.
pub struct Timer {
    start: sys::CUevent,
    stop: sys::CUevent,
}

impl Timer {
    pub fn new() -> Result<Timer, DeviceError> {
        let f = sys::CUevent_flags::CU_EVENT_DEFAULT;
        Ok(Timer {
            start: result::event::create(f).map_err(drv)?,
            stop: result::event::create(f).map_err(drv)?,
        })
    }
    pub fn start(&self) -> Result<(), DeviceError> {
        // SAFETY: valid event, null stream.
        unsafe { result::event::record(self.start, std::ptr::null_mut()) }.map_err(drv)
    }
    pub fn stop(&self) -> Result<(), DeviceError> {
        // SAFETY: valid event, null stream.
        unsafe { result::event::record(self.stop, std::ptr::null_mut()) }.map_err(drv)
    }
    /// Milliseconds between start and stop (waits for stop).
    pub fn elapsed_ms(&self) -> Result<f32, DeviceError> {
        // SAFETY: both events were recorded.
        unsafe {
            result::event::synchronize(self.stop).map_err(drv)?;
            result::event::elapsed(self.start, self.stop).map_err(drv)
        }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        // SAFETY: our own events.
        unsafe {
            let _ = result::event::destroy(self.start);
            let _ = result::event::destroy(self.stop);
        }
    }
}

/// Compiles CUDA C++ to a cubin with NVRTC. `Err` carries the compiler log.
pub fn nvrtc_compile(source: &str, name: &str, options: &[String]) -> Result<Vec<u8>, String> {
    let src = CString::new(source).map_err(|_| "kernel source contains NUL".to_string())?;
    let cname = CString::new(name).unwrap();
    let opts: Vec<CString> = options
        .iter()
        .map(|o| CString::new(o.as_str()).unwrap())
        .collect();
    let opt_ptrs: Vec<*const std::ffi::c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let check = |r: nvrtc::nvrtcResult, what: &str| -> Result<(), String> {
        if r == nvrtc::nvrtcResult::NVRTC_SUCCESS {
            Ok(())
        } else {
            // SAFETY: returns a static string.
            let s = unsafe { CStr::from_ptr(nvrtc::nvrtcGetErrorString(r)) };
            Err(format!("{what}: {}", s.to_string_lossy()))
        }
    };
    let mut prog: nvrtc::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: all pointers are valid NUL-terminated strings for the duration of the calls;
    // the program is destroyed on every path below.
    unsafe {
        check(
            nvrtc::nvrtcCreateProgram(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            ),
            "nvrtcCreateProgram",
        )?;
        let compiled = nvrtc::nvrtcCompileProgram(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr());
        let mut log_size = 0usize;
        let mut log = String::new();
        if nvrtc::nvrtcGetProgramLogSize(prog, &mut log_size) == nvrtc::nvrtcResult::NVRTC_SUCCESS
            && log_size > 1
        {
            let mut buf = vec![0u8; log_size];
            if nvrtc::nvrtcGetProgramLog(prog, buf.as_mut_ptr() as *mut _)
                == nvrtc::nvrtcResult::NVRTC_SUCCESS
            {
                log = String::from_utf8_lossy(&buf[..log_size - 1]).into_owned();
            }
        }
        let result = (|| {
            check(compiled, "nvrtcCompileProgram").map_err(|e| format!("{e}\n{log}"))?;
            let mut size = 0usize;
            check(
                nvrtc::nvrtcGetCUBINSize(prog, &mut size),
                "nvrtcGetCUBINSize",
            )?;
            let mut cubin = vec![0u8; size];
            check(
                nvrtc::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut _),
                "nvrtcGetCUBIN",
            )?;
            if std::env::var_os("MQA_FUZZ_NVRTC_LOG").is_some() && !log.is_empty() {
                eprintln!("nvrtc {name}: {log}");
            }
            Ok(cubin)
        })();
        let _ = nvrtc::nvrtcDestroyProgram(&mut prog);
        result
    }
}
