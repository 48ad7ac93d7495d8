//! mqa-fuzz: a differential fuzzer for the FP8 paged MQA logits kernel of the
//! DeepSeek V3.2/V4 sparse-attention indexer.
//!
//! The pipeline, one module per stage:
//! generate (`generate`) → materialize (`case`) → run kernel (`kernel`) →
//! reference (`reference`) → classify (`oracle`) → report (`report`).

pub mod bench;
pub mod campaign;
pub mod case;
pub mod class;
pub mod cli;
pub mod error;
pub mod finding;
pub mod fp8;
pub mod generate;
pub mod harness;
pub mod hosted;
pub mod interrupt;
pub mod kernel;
pub mod oracle;
pub mod property;
pub mod reference;
pub mod report;
pub mod selftest;
pub mod shard;
pub mod util;

pub use case::{Case, ContextLens, ScalePlacement, Shape, ValueLayout};
pub use fp8::Fp8Format;
