//! The oracle (DESIGN §2): judges a kernel's output against the exact reference,
//! element by element, with a per-element error bound derived from the kernel's
//! declared accumulation — never a global threshold.
//!
//! Classes over V(r): `ok`, `mismatch`, `nan`, `inf`, `unwritten`. Outside V(r):
//! statistics and the `neg_inf` contract. Around the output: `oob_write`. Inputs:
//! `input_mutated`. Process: `crash`. Plus the guard verdict (would
//! `nan_to_num_(-inf)` change anything in V(r)) and the downstream top-k check.

mod bound;
mod topk;

pub use bound::ErrorBound;
pub use topk::{topk_consistent, TopKOutcome};

use crate::case::Case;
use crate::kernel::{Capabilities, OutputBuffer, OutsideContract, RunError, RunInfo, POISON_BITS};
use crate::reference::Reference;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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
}

impl Class {
    pub const ALL: [Class; 12] = [
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
            Some(Offender {
                class,
                row: None,
                pos: None,
                expected: None,
                got: None,
                bound: None,
                detail: Some(detail),
            }),
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
}

impl Default for OracleConfig {
    fn default() -> Self {
        OracleConfig {
            topk: 2048,
            max_examples: 4,
        }
    }
}

/// Judges one run. `result` is the kernel's outcome; on `Ok` the buffer holds what it
/// wrote. The reference must be computed with the kernel's scale placement.
pub fn judge(
    case: &Case,
    reference: &Reference,
    caps: &Capabilities,
    result: Result<(&RunInfo, &OutputBuffer), &RunError>,
    cfg: &OracleConfig,
) -> Verdict {
    let mut v = Verdict {
        topk: TopKStats {
            k: cfg.topk,
            ..Default::default()
        },
        ..Default::default()
    };
    let (info, out) = match result {
        Ok(x) => x,
        Err(RunError::Crash(msg)) => {
            v.add_case_finding(Class::Crash, msg.clone());
            return v;
        }
        Err(RunError::Skipped(why)) | Err(RunError::Environment(why)) => {
            v.skipped = Some(why.clone());
            return v;
        }
    };
    debug_assert_eq!(reference.placement, caps.scale_placement);
    v.run = info.clone();
    if info.inputs_intact == Some(false) {
        v.add_case_finding(
            Class::InputMutated,
            "an input buffer changed during the run".into(),
        );
    }
    let bound = ErrorBound::for_kernel(caps.accumulation, &case.shape);
    let (mut sxy, mut sxx) = (0.0f64, 0.0f64);
    for r in 0..case.rows() {
        let row = out.row(r);
        let len = case.valid_len(r).min(row.len());
        // Outside V(r): statistics and the clean-logits contract.
        for (t, &x) in row.iter().enumerate().skip(len) {
            let o = &mut v.outside;
            o.elements += 1;
            if x.to_bits() == POISON_BITS {
                o.unwritten += 1;
            } else if x.is_nan() {
                o.nan += 1;
            } else if x == f32::NEG_INFINITY {
                o.neg_inf += 1;
            } else if x == f32::INFINITY {
                o.pos_inf += 1;
            } else {
                o.finite += 1;
            }
            if caps.outside == OutsideContract::NegInf && x != f32::NEG_INFINITY {
                let ex = Offender {
                    class: Class::NegInfContract,
                    row: Some(r),
                    pos: Some(t),
                    expected: Some(f64::NEG_INFINITY),
                    got: Some(show_f32(x)),
                    bound: None,
                    detail: None,
                };
                v.add(Class::NegInfContract, 1, Some(ex), cfg.max_examples);
            }
        }
        // Guard verdict over V(r). A NaN or inf where the exact value itself is not a
        // finite f32 (hostile inputs: NaN codes, inf scales) is the right answer, not
        // something the guard would repair; it is counted in `hostile` instead. Every
        // other NaN/inf, and the poison of an unwritten element, counts.
        let mut affected = false;
        for (t, &x) in row[..len].iter().enumerate() {
            if x.is_finite() {
                continue;
            }
            let expected_non_finite = x.to_bits() != POISON_BITS && {
                let exp = match &reference.rows[r] {
                    Some(rr) if t < rr.value.len() => rr.value[t],
                    _ => crate::reference::element(case, reference.placement, r, t).0,
                };
                !exp.is_finite() || exp.abs() > f32::MAX as f64
            };
            if expected_non_finite {
                continue;
            }
            if x.is_nan() {
                v.guard.nan += 1;
                affected = true;
            } else if x == f32::INFINITY {
                v.guard.pos_inf += 1;
                affected = true;
            } else if x == f32::NEG_INFINITY {
                v.guard.neg_inf += 1;
                affected = true;
            }
        }
        v.guard.rows_affected += affected as u64;
        let Some(rref) = &reference.rows[r] else {
            // A row outside the sample: its finite values go unjudged, but a NaN, ±inf or
            // surviving poison is judged against the reference of that one element, so a
            // sampled verdict is never "clean" while the guard says it is needed.
            if affected {
                for (t, &got) in row[..len].iter().enumerate() {
                    judge_outside_sample(&mut v, case, reference, &bound, cfg, r, t, got);
                }
            }
            continue;
        };
        v.metrics.rows_checked += 1;
        // The same for the positions a sampled row's reference leaves out.
        if let (true, Some(positions)) = (affected, rref.positions.as_deref()) {
            let mut listed = positions.iter().peekable();
            for (t, &got) in row[..len].iter().enumerate() {
                if listed.next_if_eq(&&t).is_none() {
                    judge_outside_sample(&mut v, case, reference, &bound, cfg, r, t, got);
                }
            }
        }
        // Dense rows hold every position of V(r); sampled rows only theirs.
        for (t, exp, relu_mag) in rref.elements().take_while(|&(t, _, _)| t < len) {
            let got = row[t];
            let mut full_bound = None;
            let class = classify(got, exp, relu_mag, &bound, || {
                let (_, m, a) = crate::reference::element(case, reference.placement, r, t);
                let b = bound.full(m, a);
                full_bound = Some(b);
                a
            });
            match class {
                ElementClass::Ok => {
                    v.metrics.checked += 1;
                    let err = (got as f64 - exp).abs();
                    v.metrics.max_abs_err = v.metrics.max_abs_err.max(err);
                    // The cheap lower bound accepted it; for the reported ratio use the
                    // full bound whenever the error is a noticeable part of the cheap
                    // one, so "max err/bound" is not inflated by the cheap shortcut.
                    let b = full_bound.unwrap_or_else(|| {
                        let lo = bound.lower(relu_mag);
                        if err > 0.25 * lo {
                            let (_, m, a) =
                                crate::reference::element(case, reference.placement, r, t);
                            bound.full(m, a)
                        } else {
                            lo
                        }
                    });
                    if b > 0.0 {
                        v.metrics.max_err_over_bound = v.metrics.max_err_over_bound.max(err / b);
                    }
                    sxy += got as f64 * exp;
                    sxx += (got as f64).powi(2) + exp * exp;
                }
                ElementClass::Undefined => {
                    let h = &mut v.hostile;
                    h.undefined += 1;
                    if got.is_nan() {
                        h.got_nan += 1;
                    } else if got.is_infinite() {
                        h.got_inf += 1;
                    } else {
                        h.got_finite += 1;
                    }
                }
                ElementClass::Finding(c) => {
                    v.metrics.checked += 1;
                    let b = full_bound;
                    if got.is_finite() {
                        let err = (got as f64 - exp).abs();
                        v.metrics.max_abs_err = v.metrics.max_abs_err.max(err);
                        if let Some(b) = b.filter(|b| *b > 0.0) {
                            v.metrics.max_err_over_bound =
                                v.metrics.max_err_over_bound.max(err / b);
                        }
                        sxy += got as f64 * exp;
                        sxx += (got as f64).powi(2) + exp * exp;
                    } else {
                        v.metrics.max_err_over_bound = f64::INFINITY;
                    }
                    let ex = Offender {
                        class: c,
                        row: Some(r),
                        pos: Some(t),
                        expected: Some(exp),
                        got: Some(show_f32(got)),
                        bound: b,
                        detail: None,
                    };
                    v.add(c, 1, Some(ex), cfg.max_examples);
                }
            }
        }
        // Downstream top-k for rows longer than k (needs the whole row's reference).
        if cfg.topk > 0 && len > cfg.topk && rref.is_dense() {
            v.topk.rows_checked += 1;
            if let TopKOutcome::Inconsistent { detail } =
                topk_consistent(&row[..len], rref, &bound, cfg.topk, |t| {
                    let (_, m, a) = crate::reference::element(case, reference.placement, r, t);
                    bound.full(m, a)
                })
            {
                v.topk.rows_failed += 1;
                let ex = Offender {
                    class: Class::Topk,
                    row: Some(r),
                    pos: None,
                    expected: None,
                    got: None,
                    bound: None,
                    detail: Some(detail),
                };
                v.add(Class::Topk, 1, Some(ex), cfg.max_examples);
            }
        }
    }
    v.guard.redundant = v.guard.nan + v.guard.pos_inf + v.guard.neg_inf == 0;
    v.metrics.calc_diff = if sxx > 0.0 {
        1.0 - 2.0 * sxy / sxx
    } else {
        0.0
    };
    // Around the output: guards and row padding.
    let oob = out.out_of_bounds_writes();
    if !oob.is_empty() {
        let (_, base) = out.raw();
        let first = oob[0] as i64 - base as i64;
        let detail = format!(
            "{} element(s) outside the output changed; first at element offset {first} from [0][0] (row stride {}, cols {})",
            oob.len(),
            out.row_stride,
            out.cols
        );
        let ex = Offender {
            class: Class::OobWrite,
            row: None,
            pos: None,
            expected: None,
            got: None,
            bound: None,
            detail: Some(detail),
        };
        v.add(
            Class::OobWrite,
            oob.len() as u64,
            Some(ex),
            cfg.max_examples,
        );
    }
    v
}

/// Judges one element of V(r) that the reference sample left out: finite values go
/// unjudged; NaN, ±inf and surviving poison are classified against that one element's
/// plain reference.
#[allow(clippy::too_many_arguments)]
fn judge_outside_sample(
    v: &mut Verdict,
    case: &Case,
    reference: &Reference,
    bound: &ErrorBound,
    cfg: &OracleConfig,
    r: usize,
    t: usize,
    got: f32,
) {
    if got.is_finite() {
        return;
    }
    let (exp, relu_mag, abs_mag) = crate::reference::element(case, reference.placement, r, t);
    match classify(got, exp, relu_mag, bound, || abs_mag) {
        ElementClass::Finding(c) => {
            let ex = Offender {
                class: c,
                row: Some(r),
                pos: Some(t),
                expected: Some(exp),
                got: Some(show_f32(got)),
                bound: Some(bound.full(relu_mag, abs_mag)),
                detail: Some("element outside the reference sample".into()),
            };
            v.add(c, 1, Some(ex), cfg.max_examples);
        }
        ElementClass::Undefined => v.hostile.undefined += 1,
        ElementClass::Ok => {}
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
