//! The CUDA backend (`cuda:<name>`, `cuda-direct:<name>`).
//!
//! Layers, bottom up: [`sys`] (every raw driver/NVRTC call, unsafe, thin), [`compile`]
//! (NVRTC + disk cache of the embedded `kernels/*.cu`), [`device`] (the process's GPU,
//! recovery after faults), [`pool`] (the address ranges a case's cache and output live
//! in between cases, with the cache's poison), [`memory`] (a case laid out on the
//! device as production lays it out, poisoned), [`kernels`] (the `Kernel` implementations), [`reference`] (the
//! exact f64 reference on the GPU, checked against the CPU one), [`judge`] (the oracle's
//! rules applied on the device, next to the output). The GPU commands that
//! drive them (`gpu-selfcheck`, `bench gpu`, `gpu-precompile`) are application code and
//! live in `crate::bench::gpu`.
//!
//! `cuda-direct:<name>` runs in this process; `cuda:<name>` (what users name) runs
//! each case in a worker process per GPU, so an illegal address kills a worker, not
//! the campaign. Everything loads CUDA at run time: on a machine without it the
//! kernels are listed as unavailable with the reason and opening one is an
//! environment error (exit 3).

pub mod compile;
pub mod device;
pub mod generate;
pub mod hosted;
pub mod judge;
pub mod kernels;
pub mod memory;
pub mod pool;
pub mod reference;
pub mod reference_tuning;
pub mod sys;
pub mod warm_up;

use super::{Kernel, KernelEntry, OpenError};
pub use kernels::{CudaDirect, Variant};

/// Every user-facing CUDA kernel with its availability here.
pub fn entries() -> Vec<KernelEntry> {
    let available = device::availability().map(|_| ());
    Variant::all()
        .into_iter()
        .map(|v| KernelEntry {
            name: format!("cuda:{}", v.short_name()),
            description: v.describe(),
            available: available.clone(),
            planted_bug: matches!(v, Variant::Tiled(Some(_))),
        })
        .collect()
}

/// Opens `cuda:<name>` (worker processes on all visible GPUs) or
/// `cuda-direct:<name>` (in this process); `None` for names of other backends.
pub fn open(name: &str) -> Option<Result<Box<dyn Kernel>, OpenError>> {
    if let Some(rest) = name.strip_prefix("cuda-direct:") {
        return Some(open_direct(name, rest));
    }
    let rest = name.strip_prefix("cuda:")?;
    Some(open_pooled(name, rest, None))
}

fn unavailable(name: &str, reason: String) -> OpenError {
    OpenError::Unavailable {
        name: name.to_string(),
        reason,
    }
}

fn open_direct(name: &str, rest: &str) -> Result<Box<dyn Kernel>, OpenError> {
    let v = Variant::parse(rest).ok_or_else(|| OpenError::Unknown(name.to_string()))?;
    device::availability().map_err(|r| unavailable(name, r))?;
    Ok(Box::new(CudaDirect::new(v).fitted_to_device()))
}

/// Opens `cuda:<rest>` on the given GPUs (indices as [`select_gpus`] returns them;
/// `None`: all visible), one worker process per GPU.
pub fn open_pooled(
    name: &str,
    rest: &str,
    gpus: Option<&[usize]>,
) -> Result<Box<dyn Kernel>, OpenError> {
    let v = Variant::parse(rest).ok_or_else(|| OpenError::Unknown(name.to_string()))?;
    let count = device::availability().map_err(|r| unavailable(name, r))?;
    let gpus: Vec<usize> = match gpus {
        Some(g) => g.to_vec(),
        None => (0..count).collect(),
    };
    worker::pool(v, &gpus).map_err(|r| unavailable(name, r))
}

/// Opens a CUDA kernel name on the GPUs `--gpus` selected ([`select_gpus`]): `cuda:`
/// names get one worker per listed GPU; `cuda-direct:` names run in this process on
/// the first visible GPU. `None` for names of other backends.
pub fn open_on_gpus(name: &str, gpus: &[usize]) -> Option<Result<Box<dyn Kernel>, OpenError>> {
    if let Some(rest) = name.strip_prefix("cuda:") {
        return Some(open_pooled(name, rest, Some(gpus)));
    }
    open(name)
}

/// Why `--gpus` cannot be honoured.
#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    /// The spec is malformed or names a GPU that does not exist (exit 2).
    #[error("{0}")]
    Usage(String),
    /// No usable GPU on this machine (exit 3).
    #[error("{0}")]
    Unavailable(String),
}

impl From<SelectError> for crate::error::Fatal {
    fn from(e: SelectError) -> Self {
        match e {
            SelectError::Usage(m) => crate::error::Fatal::usage(m),
            SelectError::Unavailable(m) => crate::error::Fatal::environment(m),
        }
    }
}

/// Parses `--gpus all|0,1,...` against the GPUs this process sees.
pub fn select_gpus(spec: &str) -> Result<Vec<usize>, SelectError> {
    let count = device::availability().map_err(SelectError::Unavailable)?;
    parse_gpus(spec, count).map_err(SelectError::Usage)
}

/// [`select_gpus`] without touching the driver (testable anywhere).
pub fn parse_gpus(spec: &str, count: usize) -> Result<Vec<usize>, String> {
    let spec = spec.trim();
    if spec == "all" {
        return Ok((0..count).collect());
    }
    let mut v = Vec::new();
    for part in spec.split(',') {
        let i: usize = part.trim().parse().map_err(|_| {
            format!("--gpus: {part:?} is not a GPU index (use `all` or e.g. `0,1`)")
        })?;
        if i >= count {
            return Err(format!(
                "--gpus: GPU {i} does not exist (this machine sees {count})"
            ));
        }
        if !v.contains(&i) {
            v.push(i);
        }
    }
    if v.is_empty() {
        return Err("--gpus: no GPU selected".into());
    }
    Ok(v)
}

mod worker {
    //! `cuda:<name>`: one worker process per GPU (`mqa-fuzz worker --kernel
    //! cuda-direct:<name>` with `CUDA_VISIBLE_DEVICES` pinned), supervised by the exec
    //! pool: a kernel fault kills that worker (see [`super::device::EXIT_ON_FAULT`]),
    //! the case is reported as a crash and the worker is restarted.
    use super::*;
    use crate::kernel::exec::{device_env, ExecConfig, ExecKernel};
    use crate::kernel::RunError;
    use crate::util::shell_quote;
    use std::time::Duration;

    /// The parent's view of GPU `i` as the child must name it: with
    /// `CUDA_VISIBLE_DEVICES=2,3` in our environment, our GPU 1 is physical "3".
    fn child_device(i: usize) -> String {
        match std::env::var("CUDA_VISIBLE_DEVICES") {
            Ok(v) if !v.trim().is_empty() => v
                .split(',')
                .nth(i)
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|| i.to_string()),
            _ => i.to_string(),
        }
    }

    pub fn pool(v: Variant, gpus: &[usize]) -> Result<Box<dyn Kernel>, String> {
        // MQA_FUZZ_WORKER_EXE: the mqa-fuzz binary to start when we are not it (tests).
        let exe = match std::env::var_os("MQA_FUZZ_WORKER_EXE") {
            Some(p) => std::path::PathBuf::from(p),
            None => std::env::current_exe()
                .map_err(|e| format!("cannot find our own executable to start workers: {e}"))?,
        };
        let command = format!(
            "{} worker --kernel cuda-direct:{}",
            shell_quote(&exe.to_string_lossy()),
            v.short_name()
        );
        let mut config = ExecConfig::new(command);
        config.worker_envs = gpus
            .iter()
            .map(|&i| {
                let mut env = device_env(&child_device(i));
                env.push((device::EXIT_ON_FAULT.to_string(), "1".to_string()));
                env
            })
            .collect();
        // First use compiles kernels (seconds) and multi-GiB cases take a while to lay out.
        config.case_timeout = Duration::from_secs(300);
        let c = ExecConfig::from_env("")?;
        if std::env::var_os("MQA_FUZZ_EXEC_TIMEOUT").is_some() {
            config.case_timeout = c.case_timeout;
        }
        config.forward_stderr = c.forward_stderr;
        config.pipeline = c.pipeline;
        let name = format!("cuda:{}", v.short_name());
        match ExecKernel::start(name, config) {
            Ok(k) => Ok(Box::new(k)),
            Err(RunError::Crash(m) | RunError::Environment(m) | RunError::Skipped(m)) => Err(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_lists_parse() {
        assert_eq!(parse_gpus("all", 3).unwrap(), vec![0, 1, 2]);
        assert_eq!(parse_gpus("1, 0,1", 2).unwrap(), vec![1, 0]);
        assert!(parse_gpus("2", 2).unwrap_err().contains("does not exist"));
        assert!(parse_gpus("x", 2).is_err());
    }

    #[test]
    fn every_variant_name_round_trips() {
        for v in Variant::all() {
            assert_eq!(Variant::parse(&v.short_name()), Some(v));
        }
        assert_eq!(
            Variant::all().len(),
            2 + crate::kernel::Plant::every().count()
        );
        // Two planted bugs compose: both defines, one name.
        let two = Variant::parse("bug-offset32-kv+scale-before-relu").unwrap();
        assert_eq!(Variant::parse(&two.short_name()), Some(two));
        let case = crate::generate::Recipe::small(vec![4], 1, 1).materialize();
        let d = two.defines_for(&case);
        for bug in ["BUG_OFFSET32_KV", "BUG_SCALE_BEFORE_RELU"] {
            assert!(d.iter().any(|(k, _)| k == bug), "{d:?}");
        }
        assert_eq!(Variant::parse("bug-offset32-kv+offset32-kv"), None);
    }

    /// Every kernel source compiles with NVRTC for Hopper (when NVRTC is installed;
    /// no GPU is needed). A compile error here would be an exit-3 error at run time.
    #[test]
    fn kernels_compile_with_nvrtc() {
        if !sys::nvrtc_present() {
            eprintln!("SKIP kernels_compile_with_nvrtc: libnvrtc not found (set LD_LIBRARY_PATH to a CUDA 13 NVRTC)");
            return;
        }
        for p in compile::Program::ALL {
            compile::cubin(p, "sm_90a", &vec![]).unwrap_or_else(|e| panic!("{e}"));
        }
        // The selftest's double-bug kernel: both planted lines at once.
        let case = crate::generate::Recipe::small(vec![4], 1, 1).materialize();
        let two = Variant::parse("bug-offset32-kv+scale-before-relu").unwrap();
        compile::cubin(compile::Program::Tiled, "sm_90a", &two.defines_for(&case))
            .unwrap_or_else(|e| panic!("{e}"));
        // The property plants: a device-global launch counter, a batch-derived order.
        for p in crate::kernel::Plant::PROPERTY {
            let v = Variant::Tiled(Some(p));
            compile::cubin(compile::Program::Tiled, "sm_90a", &v.defines_for(&case))
                .unwrap_or_else(|e| panic!("{}: {e}", v.short_name()));
        }
    }
}
