//! `mqa-fuzz bench ...` and the GPU checks: measurements of this machine that the users
//! act on (how long the CPU reference takes, against what the hardware could do and what
//! numpy does; the CUDA kernels and the exact GPU reference) and the hidden
//! `gpu-selfcheck` / `gpu-precompile` commands. Application code: it drives the
//! backends, none of them imports it.

pub mod device_judge;
pub mod generator;
pub mod gpu;
pub mod host;
pub mod judge;
pub mod numpy;
pub mod peak;
pub mod reference;

pub use reference::{run_reference_bench, ReferenceBenchOptions};
