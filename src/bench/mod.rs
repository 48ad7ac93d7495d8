//! `mqa-fuzz bench ...`: measurements of this machine that the users act on (how long
//! the CPU oracle takes, against what the hardware could do and what numpy does).

pub mod numpy;
pub mod peak;
pub mod reference;

pub use reference::{run_reference_bench, ReferenceBenchOptions};
