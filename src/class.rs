//! The finding classes (DESIGN §2): the judge's vocabulary for what went wrong. A leaf
//! of the model layer, so that the corpus file (`case::io` records the classes a saved
//! case showed), the judge (`oracle`, which re-exports it) and the report share one
//! definition without the model importing the judge.

use serde::{Deserialize, Serialize};

/// A finding class (everything but `ok`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// Finite, outside the error bound.
    Mismatch,
    /// Computed NaN in V(r).
    Nan,
    /// ±inf in V(r).
    Inf,
    /// The poison survived in V(r): never written.
    Unwritten,
    /// Outside V(r), not -inf, for a kernel that promises clean logits.
    NegInfContract,
    /// A guard zone or row padding changed.
    OobWrite,
    /// An input buffer changed during the run.
    InputMutated,
    /// Launch error, illegal address, abort, timeout.
    Crash,
    /// Two runs of the same case differ bitwise in V(r) (a property: a finding only
    /// under `--require deterministic`, see `crate::property`).
    Nondeterministic,
    /// A sequence's rows differ bitwise between the batch, the sequence alone and the
    /// batch permuted (a property: a finding only under `--require batch-invariant`).
    BatchVariant,
    /// The downstream top-k of a row would select differently from the reference.
    Topk,
    /// Two kernels disagree beyond both their bounds.
    Divergent,
    /// The device judge and the CPU disagree (DESIGN §8): the GPU reference's bits at a
    /// re-checked element differ from the CPU reference's, the device classed an
    /// element otherwise than the CPU does, or the CPU judge of an output the device
    /// flagged counts other classes. A bug of mqa-fuzz or of the GPU, never of the
    /// kernel under test; loud on purpose.
    OracleDisagreement,
}

impl Class {
    pub const ALL: [Class; 13] = [
        Class::Mismatch,
        Class::Nan,
        Class::Inf,
        Class::Unwritten,
        Class::NegInfContract,
        Class::OobWrite,
        Class::InputMutated,
        Class::Crash,
        Class::Nondeterministic,
        Class::BatchVariant,
        Class::Topk,
        Class::Divergent,
        Class::OracleDisagreement,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Class::Mismatch => "mismatch",
            Class::Nan => "nan",
            Class::Inf => "inf",
            Class::Unwritten => "unwritten",
            Class::NegInfContract => "neg_inf_contract",
            Class::OobWrite => "oob_write",
            Class::InputMutated => "input_mutated",
            Class::Crash => "crash",
            Class::Nondeterministic => "nondeterministic",
            Class::BatchVariant => "batch_variant",
            Class::Topk => "topk",
            Class::Divergent => "divergent",
            Class::OracleDisagreement => "oracle_disagreement",
        }
    }

    pub fn parse(s: &str) -> Option<Class> {
        Class::ALL.into_iter().find(|c| c.name() == s)
    }
}

impl std::fmt::Display for Class {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
