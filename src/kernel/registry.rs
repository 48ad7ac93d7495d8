//! The registry: every kernel name the command line accepts, which backend opens it and
//! whether this machine can run it. The one module of `kernel` that knows the backends
//! (`cpu`, `cuda`, `exec`); a new backend adds its `entries`/`open` here.

use super::contract::{Kernel, KernelEntry, OpenError};
use super::plant::Plant;
use super::{cpu, cuda, exec};

/// Every built-in kernel with its availability on this machine.
pub fn registry() -> Vec<KernelEntry> {
    let mut v = cpu::entries();
    v.extend(extra_entries());
    v
}

/// Whether `name` is a planted-bug kernel: listed as one, or planted bugs composed
/// (`cpu:bug-A+B`, which the registry does not list).
pub fn is_planted_bug(name: &str) -> bool {
    registry().iter().any(|e| e.name == name && e.planted_bug)
        || ["cpu:bug-", "cuda:bug-", "cuda-direct:bug-"]
            .iter()
            .any(|p| {
                name.strip_prefix(p)
                    .is_some_and(|b| Plant::parse_set(b).is_some())
            })
}

/// Opens a kernel by name.
pub fn open(name: &str) -> Result<Box<dyn Kernel>, OpenError> {
    if let Some(k) = cpu::open(name) {
        return Ok(k);
    }
    open_extra(name)
}

/// The best built-in kernel this machine can run (`run` with no `--kernel`): the
/// production-style CUDA kernel when a GPU is usable, else the CPU one.
pub fn default_kernel_name() -> &'static str {
    if cuda::device::availability().is_ok_and(|n| n > 0) {
        "cuda:tiled"
    } else {
        "cpu:chunked"
    }
}

fn extra_entries() -> Vec<KernelEntry> {
    let mut v = Vec::new();
    v.extend(cuda::entries());
    v.extend(exec::entries());
    v
}

fn open_extra(name: &str) -> Result<Box<dyn Kernel>, OpenError> {
    if let Some(k) = cuda::open(name) {
        return k;
    }
    if let Some(k) = exec::open(name) {
        return k;
    }
    Err(OpenError::Unknown(name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn composed_plants_are_planted_bugs() {
        // Moved from the CUDA backend's tests: the registry answers for every backend.
        assert!(is_planted_bug("cuda:bug-offset32-kv+scale-before-relu"));
        assert!(is_planted_bug("cpu:bug-offset32-kv+scale-before-relu"));
        assert!(!is_planted_bug("cpu:chunked"));
    }
}
