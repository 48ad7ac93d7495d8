//! The safe wrapper above [`sys`]: one process-wide [`Gpu`] (the first visible device;
//! a worker process sees exactly one through `CUDA_VISIBLE_DEVICES`) and its compiled
//! functions. A kernel fault (illegal address) leaves the process's CUDA context
//! unusable for good (seen on the H200: even a primary-context reset does not clear
//! it), so the fault is reported as a crash of that case and every later call in the
//! process is an environment error; `cuda:` workers exit instead, and their pool
//! restarts them.

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
    /// Compute capability major version (9 on Hopper).
    pub major: u32,
    pub sms: u32,
    pub max_smem_optin: u32,
    functions: HashMap<(Program, String, String), Arc<Function>>,
}

impl Gpu {
    fn open(ordinal: usize) -> Result<Gpu, String> {
        let ctx = Context::new(ordinal)?;
        let major =
            ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor =
            ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let sms =
            ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        let max_smem_optin = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?
            as u32;
        if major * 10 + minor < 89 {
            return Err(format!("compute capability {major}.{minor}: the kernels need fp8 tensor cores (8.9 or newer)"));
        }
        // Architecture-specific targets (sm_90a, sm_100a) unlock the chip's own instructions.
        let arch = if major >= 9 {
            format!("sm_{major}{minor}a")
        } else {
            format!("sm_{major}{minor}")
        };
        Ok(Gpu {
            name: ctx.name(),
            ctx,
            ordinal,
            arch,
            major: major as u32,
            sms,
            max_smem_optin,
            functions: HashMap::new(),
        })
    }

    /// A kernel function of a program variant, compiled (or loaded from the cache) once.
    pub fn function(
        &mut self,
        program: Program,
        name: &str,
        defines: &Defines,
    ) -> Result<Arc<Function>, String> {
        let def_key: String = defines.iter().map(|(k, v)| format!("{k}={v};")).collect();
        let key = (program, name.to_string(), def_key);
        if let Some(f) = self.functions.get(&key) {
            return Ok(f.clone());
        }
        let bin = compile::cubin(program, &self.arch, defines)?;
        self.load(key, &bin)
    }

    /// Loads a function ahead of its first use when its cubin is in the disk cache
    /// (never compiles): `Ok(true)` when it is loaded now or was already.
    pub fn preload(
        &mut self,
        program: Program,
        name: &str,
        defines: &Defines,
    ) -> Result<bool, String> {
        let def_key: String = defines.iter().map(|(k, v)| format!("{k}={v};")).collect();
        let key = (program, name.to_string(), def_key);
        if self.functions.contains_key(&key) {
            return Ok(true);
        }
        match compile::cached_cubin(program, &self.arch, defines) {
            Some(bin) => self.load(key, &bin).map(|_| true),
            None => Ok(false),
        }
    }

    fn load(
        &mut self,
        key: (Program, String, String),
        bin: &[u8],
    ) -> Result<Arc<Function>, String> {
        let (program, name) = (key.0, key.1.as_str());
        let f = Arc::new(
            Function::load(bin, name)
                .map_err(|e| format!("loading {name} from kernels/{}: {e}", program.file()))?,
        );
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
        return Err(
            "no NVRTC (libnvrtc.so not found; install the CUDA toolkit or set LD_LIBRARY_PATH)"
                .into(),
        );
    }
    match sys::device_count() {
        Ok(0) => Err("the CUDA driver sees no GPU".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("CUDA driver: {e}")),
    }
}

static GPU: Mutex<Option<Gpu>> = Mutex::new(None);

/// Set after a kernel fault: the CUDA context of this process is unusable for good
/// (an illegal address is a sticky error that only ending the process clears).
static FAULTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Environment variable set for `cuda:` worker processes: on a kernel fault the worker
/// exits at once (status 70), so its pool reports this case as a crash and starts a
/// fresh worker for the next one.
pub const EXIT_ON_FAULT: &str = "MQA_FUZZ_CUDA_EXIT_ON_FAULT";

/// What went wrong inside [`with_gpu`].
#[derive(Debug)]
pub enum GpuFailure {
    /// The device could not be opened or a kernel not compiled: environment.
    Environment(String),
    /// A launch or synchronize failed (fault, illegal address): the context is lost.
    Fault(String),
    /// Not enough device memory for the case.
    OutOfMemory(String),
    /// A hosted library kernel declined the case (an input it documents it cannot take).
    Skipped(String),
    /// A hosted library kernel raised an error and the context still works: this case's
    /// crash, not the process's.
    Raised(String),
}

impl GpuFailure {
    /// The message, whatever the kind.
    pub fn message(self) -> String {
        match self {
            GpuFailure::Environment(m)
            | GpuFailure::Fault(m)
            | GpuFailure::OutOfMemory(m)
            | GpuFailure::Skipped(m)
            | GpuFailure::Raised(m) => m,
        }
    }
}

/// Whether a kernel fault has made this process's CUDA context unusable (a hosted
/// server then stops after answering, so its host exits and a fresh worker follows).
pub fn faulted() -> bool {
    FAULTED.load(std::sync::atomic::Ordering::SeqCst)
}

/// Runs `f` with exclusive use of the process's GPU (device 0 of the visible ones),
/// opening it on first use.
pub fn with_gpu<T>(f: impl FnOnce(&mut Gpu) -> Result<T, GpuFailure>) -> Result<T, GpuFailure> {
    let mut guard = GPU.lock().unwrap_or_else(|p| p.into_inner());
    if FAULTED.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(GpuFailure::Environment(
            "the CUDA context of this process was lost to a kernel fault earlier; use cuda:<name> (worker processes) to isolate faults".into(),
        ));
    }
    if guard.is_none() {
        availability().map_err(GpuFailure::Environment)?;
        *guard = Some(Gpu::open(0).map_err(GpuFailure::Environment)?);
    }
    let gpu = guard.as_mut().unwrap();
    gpu.ctx.bind().map_err(GpuFailure::Environment)?;
    let r = f(gpu);
    if let Err(GpuFailure::Fault(m)) = &r {
        FAULTED.store(true, std::sync::atomic::Ordering::SeqCst);
        if std::env::var_os(EXIT_ON_FAULT).is_some() {
            eprintln!(
                "mqa-fuzz cuda worker: kernel fault, exiting so the pool restarts this worker: {m}"
            );
            std::process::exit(70);
        }
        // Drop modules and buffers while the handles are still known (frees fail harmlessly).
        guard.take();
    }
    r
}
