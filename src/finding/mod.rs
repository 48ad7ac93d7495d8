//! What a finding *is*: its identity. A finding is a bug, told apart from other bugs
//! of the same kernel and class by its [`Trigger`] (the case features it needs, found
//! by ablation) and, for crashes, by its normalised [`reason`]. The [`Signature`] is
//! that identity as one string: the corpus file name, `diff` and `merge` key on it.
//!
//! - [`reason`]: crash messages → reasons (numbers, addresses, paths, shapes stripped).
//! - [`feature`]: the fixed vocabulary of case features, each with its benign form.
//! - [`position`]: where the first offending position sits (block/chunk/context edge).
//! - [`sanitizer`]: a shrunk crash re-run under compute-sanitizer, its first record parsed.
//! - [`signature`]: [`Signature`], [`Trigger`], [`Tier`] and the ablation that finds them.

pub mod feature;
pub mod position;
pub mod reason;
pub mod sanitizer;
pub mod signature;

pub use feature::{features_of, Feature, Tier};
pub use reason::{crash_reason, normalise_reason};
pub use signature::{ablate, shows, RunCost, Signature, Trigger};
