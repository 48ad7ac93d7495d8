//! The safe wrapper above [`sys`]: one process-wide [`Gpu`] (the first visible device;
//! a worker process sees exactly one through `CUDA_VISIBLE_DEVICES`), its compiled
//! functions, and recovery after a kernel fault. A fault (illegal address) leaves the
//! CUDA context unusable; [`with_gpu`] then resets the device's primary context so the
//! next case starts clean, and reports the fault as a crash of this case only.

use super::compile::{self, Defines, Program};
use super::sys::{self, Context, Function};
use cudarc::driver::sys::CUdevice_attribute;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A device ready for work.
pub struct Gpu {
    pub ctx: Context,
    pub ordinal: usize,
    pub name: String,
    /// NVRTC architecture, e.g. `sm_90a`.
    pub arch: String,
    pub sms: u32,
    pub max_smem_optin: u32,
    functions: HashMap<(Program, String, String), Arc<Function>>,
}

impl Gpu {
    fn open(ordinal: usize) -> Result<Gpu, String> {
        let ctx = Context::new(ordinal)?;
        let major = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let sms = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        let max_smem_optin = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as u32;
        if major * 10 + minor < 89 {
            return Err(format!("compute capability {major}.{minor}: the kernels need fp8 tensor cores (8.9 or newer)"));
        }
        // Architecture-specific targets (sm_90a, sm_100a) unlock the chip's own instructions.
        let arch = if major >= 9 { format!("sm_{major}{minor}a") } else { format!("sm_{major}{minor}") };
        Ok(Gpu { name: ctx.name(), ctx, ordinal, arch, sms, max_smem_optin, functions: HashMap::new() })
    }

    /// A kernel function of a program variant, compiled (or loaded from the cache) once.
    pub fn function(&mut self, program: Program, name: &str, defines: &Defines) -> Result<Arc<Function>, String> {
        let def_key: String = defines.iter().map(|(k, v)| format!("{k}={v};")).collect();
        let key = (program, name.to_string(), def_key);
        if let Some(f) = self.functions.get(&key) {
            return Ok(f.clone());
        }
        let bin = compile::cubin(program, &self.arch, defines)?;
        let f = Arc::new(Function::load(&bin, name).map_err(|e| format!("loading {name} from kernels/{}: {e}", program.file()))?);
        self.functions.insert(key, f.clone());
        Ok(f)
    }
}

/// Why the GPU cannot be used, checked without panicking (cudarc panics when a library
/// is missing, so presence is tested first).
pub fn availability() -> Result<usize, String> {
    if !sys::driver_present() {
        return Err("no CUDA driver (libcuda.so not found)".into());
    }
    if !sys::nvrtc_present() {
        return Err("no NVRTC (libnvrtc.so not found; install the CUDA toolkit or set LD_LIBRARY_PATH)".into());
    }
    match sys::device_count() {
        Ok(0) => Err("the CUDA driver sees no GPU".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("CUDA driver: {e}")),
    }
}

static GPU: Mutex<Option<Gpu>> = Mutex::new(None);

/// What went wrong inside [`with_gpu`].
#[derive(Debug)]
pub enum GpuFailure {
    /// The device could not be opened or a kernel not compiled: environment.
    Environment(String),
    /// A launch or synchronize failed (fault, illegal address): the context was reset.
    Fault(String),
    /// Not enough device memory for the case.
    OutOfMemory(String),
}

/// Runs `f` with exclusive use of the process's GPU (device 0 of the visible ones),
/// opening it on first use. If `f` reports a fault the primary context is reset so
/// later calls work again.
pub fn with_gpu<T>(f: impl FnOnce(&mut Gpu) -> Result<T, GpuFailure>) -> Result<T, GpuFailure> {
    let mut guard = GPU.lock().unwrap_or_else(|p| p.into_inner());
    if guard.is_none() {
        availability().map_err(GpuFailure::Environment)?;
        *guard = Some(Gpu::open(0).map_err(GpuFailure::Environment)?);
    }
    let gpu = guard.as_mut().unwrap();
    gpu.ctx.bind().map_err(GpuFailure::Environment)?;
    let r = f(gpu);
    if matches!(r, Err(GpuFailure::Fault(_))) {
        // Drop modules and the context handle, then reset: a sticky error is cleared
        // only by destroying the context.
        let gpu = guard.take().unwrap();
        let ordinal = gpu.ordinal;
        drop(gpu);
        reset_device(ordinal);
    }
    r
}

fn reset_device(ordinal: usize) {
    if let Ok(dev) = cudarc::driver::result::device::get(ordinal as i32) {
        // SAFETY: resets the primary context of a valid device; nothing of ours uses it now.
        let _ = unsafe { cudarc::driver::sys::cuDevicePrimaryCtxReset_v2(dev) };
    }
}
