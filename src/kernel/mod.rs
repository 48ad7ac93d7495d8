//! The one interface through which CPU, CUDA and external kernels run.
//!
//! A kernel declares [`Capabilities`] (what it accepts and how it computes); the harness
//! owns the output: it poisons it with a NaN of a distinctive payload, surrounds it
//! with guard zones, hands it to [`Kernel::run`], and judges what came back (`oracle`).
//!
//! Inside, bottom up: [`device_judge`] (what a kernel judged on its GPU exchanges with
//! the harness, a leaf), [`contract`] (the trait and the types every kernel speaks),
//! [`output`] (the harness-owned buffer), [`plant`] (the planted bugs both built-in
//! backends implement), the backends [`cpu`], [`cuda`], [`exec`], and on top
//! [`registry`], the only module that knows every backend. New kernels plug in by
//! implementing [`Kernel`] and adding a line to [`registry`].

pub mod contract;
pub mod cpu;
pub mod cuda;
pub mod device_judge;
pub mod exec;
mod output;
pub mod plant;
pub mod registry;

pub use contract::{
    compile_key_of, Accumulation, Adjustment, BlockSizes, Capabilities, CompileField, Demands,
    JudgedRun, Kernel, KernelEntry, OpenError, OutsideContract, RunError, RunInfo, WorkerReport,
    TIMEOUT_MARK,
};
pub use device_judge::{
    CacheCheck, CheckedElement, DeviceClass, DeviceJudgeRequest, DeviceJudgement, ReadOnlyTally,
    READ_ONLY_MIN_BYTES,
};
pub use output::{OutputBuffer, OutputStorage, GUARD_ELEMS, POISON_BITS};
pub use plant::Plant;
pub use registry::{default_kernel_name, is_planted_bug, open, registry};
