//! The oracle (DESIGN §2): judges a kernel's output against the exact reference,
//! element by element, with a per-element error bound derived from the kernel's
//! declared accumulation — never a global threshold.
//!
//! Classes over V(r): `ok`, `mismatch`, `nan`, `inf`, `unwritten`. Outside V(r):
//! statistics and the `neg_inf` contract. Around the output: `oob_write`. Inputs:
//! `input_mutated`. Process: `crash`. Plus the guard verdict (would
//! `nan_to_num_(-inf)` change anything in V(r)) and the downstream top-k check.
//!
//! The same rules run on a GPU next to a kernel's output (`kernels/judge.cu`); [`device`]
//! turns what comes back into a [`Verdict`] and re-checks a sample of it on the CPU.

mod bound;
pub mod device;
mod display;
mod judge;
pub mod picture;
pub mod scan;
mod topk;

pub use bound::ErrorBound;
pub use device::JudgeMode;
pub use judge::{error_verdict, judge};
pub use topk::{topk_consistent, TopKOutcome};

use crate::case::Case;
use crate::kernel::{OutputBuffer, RunInfo, POISON_BITS};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub use crate::class::Class;

/// The class of one element of V(r).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElementClass {
    Ok,
    /// The reference itself is not a finite f32 (hostile inputs): reported, not judged.
    Undefined,
    Finding(Class),
}

/// Formats an f32 so NaN payloads and infinities survive JSON and read well.
pub fn show_f32(v: f32) -> String {
    if v.is_nan() {
        if v.to_bits() == POISON_BITS {
            "poison".to_string()
        } else {
            format!("NaN({:#010x})", v.to_bits())
        }
    } else if v.is_infinite() {
        if v > 0.0 {
            "+inf".into()
        } else {
            "-inf".into()
        }
    } else {
        format!("{v:e}")
    }
}

/// Classifies one element of V(r). `abs_mag` is asked for only when the cheap part of
/// the bound does not already accept the element (it costs a D×H recomputation).
#[inline]
pub fn classify(
    got: f32,
    expected: f64,
    relu_mag: f64,
    bound: &ErrorBound,
    abs_mag: impl FnOnce() -> f64,
) -> ElementClass {
    if got.to_bits() == POISON_BITS {
        return ElementClass::Finding(Class::Unwritten);
    }
    if !expected.is_finite() || expected.abs() > f32::MAX as f64 {
        return ElementClass::Undefined;
    }
    if got.is_nan() {
        return ElementClass::Finding(Class::Nan);
    }
    if got.is_infinite() {
        return ElementClass::Finding(Class::Inf);
    }
    let err = (got as f64 - expected).abs();
    if err <= bound.lower(relu_mag) || err <= bound.full(relu_mag, abs_mag()) {
        ElementClass::Ok
    } else {
        ElementClass::Finding(Class::Mismatch)
    }
}

/// One offending element (or region) shown to the user.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Offender {
    pub class: Class,
    pub row: Option<usize>,
    pub pos: Option<usize>,
    pub expected: Option<f64>,
    pub got: Option<String>,
    pub bound: Option<f64>,
    /// Free text (crash message, raw index of an out-of-bounds write).
    pub detail: Option<String>,
}

impl Offender {
    /// An offender of the whole case or output (no element): a crash, a guard-zone
    /// write, a divergence; `detail` says what and where.
    pub fn case_level(class: Class, detail: String) -> Offender {
        Offender {
            class,
            row: None,
            pos: None,
            expected: None,
            got: None,
            bound: None,
            detail: Some(detail),
        }
    }
}

/// Would `nan_to_num_(-inf)` after the kernel change anything in V(r)?
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GuardVerdict {
    /// True iff V(r) holds no NaN and no ±inf in any row.
    pub redundant: bool,
    pub nan: u64,
    pub pos_inf: u64,
    pub neg_inf: u64,
    pub rows_affected: u64,
}

/// What the kernel left outside V(r), in `[len, max_model_len)` of each row.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OutsideStats {
    pub elements: u64,
    pub unwritten: u64,
    pub nan: u64,
    pub neg_inf: u64,
    pub pos_inf: u64,
    pub finite: u64,
}

/// Elements whose reference is undefined (NaN/inf inputs) and what the kernel gave.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostileStats {
    pub undefined: u64,
    pub got_nan: u64,
    pub got_inf: u64,
    pub got_finite: u64,
}

/// Counts of later rows added (`redundant` is the caller's to recompute).
impl std::ops::AddAssign<&GuardVerdict> for GuardVerdict {
    fn add_assign(&mut self, o: &GuardVerdict) {
        self.nan += o.nan;
        self.pos_inf += o.pos_inf;
        self.neg_inf += o.neg_inf;
        self.rows_affected += o.rows_affected;
    }
}

impl std::ops::AddAssign<&OutsideStats> for OutsideStats {
    fn add_assign(&mut self, o: &OutsideStats) {
        self.elements += o.elements;
        self.unwritten += o.unwritten;
        self.nan += o.nan;
        self.neg_inf += o.neg_inf;
        self.pos_inf += o.pos_inf;
        self.finite += o.finite;
    }
}

impl std::ops::AddAssign<&HostileStats> for HostileStats {
    fn add_assign(&mut self, o: &HostileStats) {
        self.undefined += o.undefined;
        self.got_nan += o.got_nan;
        self.got_inf += o.got_inf;
        self.got_finite += o.got_finite;
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// Elements of V(r) compared against the reference.
    pub checked: u64,
    pub rows_checked: u64,
    pub max_abs_err: f64,
    /// Largest `|got - expected| / bound` (> 1 means a mismatch).
    pub max_err_over_bound: f64,
    /// DeepGEMM's `1 - 2Σxy / Σ(x²+y²)` over finite elements (their bar: < 1e-3).
    pub calc_diff: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TopKStats {
    pub k: usize,
    pub rows_checked: u64,
    pub rows_failed: u64,
}

/// Everything the oracle says about one kernel on one case.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// Finding classes with their element counts (1 for case-level classes).
    pub classes: BTreeMap<Class, u64>,
    /// The first offenders of each class.
    pub examples: Vec<Offender>,
    pub metrics: Metrics,
    pub guard: GuardVerdict,
    pub outside: OutsideStats,
    pub topk: TopKStats,
    pub hostile: HostileStats,
    pub run: RunInfo,
    /// Set when the kernel could not run the case (not a finding).
    pub skipped: Option<String>,
}

impl Verdict {
    pub fn is_clean(&self) -> bool {
        self.classes.is_empty()
    }
    pub fn finding_classes(&self) -> Vec<Class> {
        self.classes.keys().copied().collect()
    }
    /// The most telling class (for signatures and headlines): the first in `Class::ALL`
    /// order, which puts value classes before case-level ones.
    pub fn primary_class(&self) -> Option<Class> {
        Class::ALL
            .into_iter()
            .find(|c| self.classes.contains_key(c))
    }
    fn add(&mut self, class: Class, n: u64, ex: Option<Offender>, max_examples: usize) {
        *self.classes.entry(class).or_default() += n;
        if let Some(ex) = ex {
            if self.examples.iter().filter(|e| e.class == class).count() < max_examples {
                self.examples.push(ex);
            }
        }
    }
    /// A case-level finding (crash, input mutation, nondeterminism, divergence).
    pub fn add_case_finding(&mut self, class: Class, detail: String) {
        self.add(
            class,
            1,
            Some(Offender::case_level(class, detail)),
            usize::MAX,
        );
    }
}

#[derive(Clone, Debug)]
pub struct OracleConfig {
    /// k of the downstream top-k (V3.2: 2048; V4-Pro 1024; V4-Flash 512).
    pub topk: usize,
    /// Offenders kept per class.
    pub max_examples: usize,
    /// Judge as before `bench judge` existed: every accepted element whose error is a
    /// noticeable part of its cheap bound measured against its full bound, each one
    /// recomputed by the plain `reference::element`. The same verdict, many times
    /// slower; kept for `bench judge` to compare against.
    pub plain_judge: bool,
    /// Where outputs are judged (`--judge`): on the device next to a GPU kernel's output
    /// (DESIGN §8), or on the CPU.
    pub judge: JudgeMode,
    /// What handing kernels their cache read-only has cost (shared by clones).
    pub read_only: crate::kernel::ReadOnlyTally,
}

impl Default for OracleConfig {
    fn default() -> Self {
        OracleConfig {
            topk: 2048,
            max_examples: 4,
            plain_judge: false,
            judge: JudgeMode::Auto,
            read_only: Default::default(),
        }
    }
}

/// Bitwise comparison of two runs over V(r): the number of differing elements and
/// the first one (for `nondeterministic`).
pub fn compare_runs(
    case: &Case,
    a: &OutputBuffer,
    b: &OutputBuffer,
) -> (u64, Option<(usize, usize)>) {
    let (mut n, mut first) = (0u64, None);
    for r in 0..case.rows() {
        let len = case.valid_len(r);
        for (t, (x, y)) in a.row(r)[..len].iter().zip(&b.row(r)[..len]).enumerate() {
            if x.to_bits() != y.to_bits() {
                n += 1;
                first.get_or_insert((r, t));
            }
        }
    }
    (n, first)
}
