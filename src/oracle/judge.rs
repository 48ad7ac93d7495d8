//! The verdict: the judge's sink of the element scan ([`super::scan`]), plus what lies
//! around V(r) (the outside contract, the guards of the output buffer, the inputs).

use super::scan::{scan, Element, ElementSink, Seen};
use super::{show_f32, topk_consistent, Class, ErrorBound, Offender, OracleConfig, TopKOutcome};
use super::{TopKStats, Verdict};
use crate::case::Case;
use crate::kernel::{Capabilities, OutputBuffer, OutsideContract, RunError, RunInfo, POISON_BITS};
use crate::reference::{Reference, RowMagnitudes, RowReference};
use rayon::prelude::*;

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
        Err(e) => {
            return Verdict {
                topk: v.topk,
                ..error_verdict(e)
            }
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
    // Rows are judged in parallel, each by its own sink, and folded in row order: the
    // same counts and the same first offenders as one sink over every row.
    let parts: Vec<VerdictSink> = (0..case.rows())
        .into_par_iter()
        .map(|r| {
            let mut sink = VerdictSink {
                v: Verdict::default(),
                case,
                bound: &bound,
                cfg,
                outside: caps.outside,
                row_affected: false,
                sxy: 0.0,
                sxx: 0.0,
            };
            scan(case, reference, &bound, out, r..r + 1, &mut sink);
            sink
        })
        .collect();
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for part in parts {
        sxy += part.sxy;
        sxx += part.sxx;
        v.absorb(part.v, cfg.max_examples);
    }
    v.guard.redundant = v.guard.nan + v.guard.pos_inf + v.guard.neg_inf == 0;
    v.metrics.calc_diff = if sxx > 0.0 {
        1.0 - 2.0 * sxy / sxx
    } else {
        0.0
    };
    judge_guards(&mut v, out, cfg);
    v
}

/// The verdict of a run that produced no output: a crash is a finding, anything else
/// (skipped, a broken environment) is not judged.
pub fn error_verdict(e: &RunError) -> Verdict {
    let mut v = Verdict::default();
    match e {
        RunError::Crash(msg) => v.add_case_finding(Class::Crash, msg.clone()),
        RunError::Skipped(why) | RunError::Environment(why) => v.skipped = Some(why.clone()),
    }
    v
}

impl Verdict {
    /// Adds the verdict of later rows: counts summed, offenders appended while their
    /// class has fewer than `max_examples`, maxima kept.
    fn absorb(&mut self, part: Verdict, max_examples: usize) {
        for (class, n) in part.classes {
            *self.classes.entry(class).or_default() += n;
        }
        for ex in part.examples {
            if self.examples.iter().filter(|e| e.class == ex.class).count() < max_examples {
                self.examples.push(ex);
            }
        }
        let (m, pm) = (&mut self.metrics, part.metrics);
        m.checked += pm.checked;
        m.rows_checked += pm.rows_checked;
        m.max_abs_err = m.max_abs_err.max(pm.max_abs_err);
        m.max_err_over_bound = m.max_err_over_bound.max(pm.max_err_over_bound);
        self.guard += &part.guard;
        self.outside += &part.outside;
        self.topk.rows_checked += part.topk.rows_checked;
        self.topk.rows_failed += part.topk.rows_failed;
        self.hostile += &part.hostile;
    }
}

/// Around the output: guard zones and row padding the kernel must not touch.
fn judge_guards(v: &mut Verdict, out: &OutputBuffer, cfg: &OracleConfig) {
    let oob = out.out_of_bounds_writes();
    if oob.is_empty() {
        return;
    }
    let (_, base) = out.raw();
    let first = oob[0] as i64 - base as i64;
    let detail = format!(
        "{} element(s) outside the output changed; first at element offset {first} from [0][0] (row stride {}, cols {})",
        oob.len(),
        out.row_stride,
        out.cols
    );
    let ex = Offender::case_level(Class::OobWrite, detail);
    v.add(
        Class::OobWrite,
        oob.len() as u64,
        Some(ex),
        cfg.max_examples,
    );
}

/// Builds the verdict from the scan.
struct VerdictSink<'a> {
    v: Verdict,
    case: &'a Case,
    bound: &'a ErrorBound,
    cfg: &'a OracleConfig,
    outside: OutsideContract,
    /// Whether the current row has an element the guard would change.
    row_affected: bool,
    /// DeepGEMM's `calc_diff` sums over finite judged elements.
    sxy: f64,
    sxx: f64,
}

impl VerdictSink<'_> {
    fn add_finite(&mut self, got: f32, exp: f64, bound: Option<f64>) {
        let err = (got as f64 - exp).abs();
        let m = &mut self.v.metrics;
        m.max_abs_err = m.max_abs_err.max(err);
        if let Some(b) = bound.filter(|b| *b > 0.0) {
            m.max_err_over_bound = m.max_err_over_bound.max(err / b);
        }
        self.sxy += got as f64 * exp;
        self.sxx += (got as f64).powi(2) + exp * exp;
    }

    /// Outside V(r): statistics and the clean-logits contract.
    fn outside_row(&mut self, r: usize, row: &[f32], len: usize) {
        for (t, &x) in row.iter().enumerate().skip(len) {
            let o = &mut self.v.outside;
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
            if self.outside == OutsideContract::NegInf && x != f32::NEG_INFINITY {
                let ex = Offender {
                    class: Class::NegInfContract,
                    row: Some(r),
                    pos: Some(t),
                    expected: Some(f64::NEG_INFINITY),
                    got: Some(show_f32(x)),
                    bound: None,
                    detail: None,
                };
                self.v
                    .add(Class::NegInfContract, 1, Some(ex), self.cfg.max_examples);
            }
        }
    }

    /// Downstream top-k for rows longer than k (needs the whole row's reference).
    fn topk_row(&mut self, r: usize, row: &[f32], rref: &RowReference) {
        let (case, bound) = (self.case, self.bound);
        self.v.topk.rows_checked += 1;
        let mags = std::cell::RefCell::new(None);
        if let TopKOutcome::Inconsistent { detail } =
            topk_consistent(row, rref, bound, self.cfg.topk, |t| {
                let mut m = mags.borrow_mut();
                let a = m
                    .get_or_insert_with(|| RowMagnitudes::new(case, r))
                    .abs_mag(t);
                bound.full(rref.relu_mag[t], a)
            })
        {
            self.v.topk.rows_failed += 1;
            let ex = Offender {
                class: Class::Topk,
                row: Some(r),
                pos: None,
                expected: None,
                got: None,
                bound: None,
                detail: Some(detail),
            };
            self.v.add(Class::Topk, 1, Some(ex), self.cfg.max_examples);
        }
    }
}

impl ElementSink for VerdictSink<'_> {
    /// Only `max_err_over_bound` is kept, so of the errors past a quarter of the cheap
    /// bound (measured against the full one, as a picture measures them) only those
    /// that could raise the maximum are (`err / lower ≥ err / full`): the same ratio,
    /// with far fewer D×H recomputations. Below a quarter the cheap bound measures (an
    /// over-estimate, never above 0.25): an accurate kernel costs no recomputation.
    fn wants_full_bound(&self, err: f64, lower: f64) -> bool {
        let noticeable = err > 0.25 * lower;
        match self.cfg.plain_judge {
            true => noticeable,
            false => noticeable && err > self.v.metrics.max_err_over_bound * lower,
        }
    }
    fn plain_magnitudes(&self) -> bool {
        self.cfg.plain_judge
    }

    fn element(&mut self, e: &Element) {
        // The guard verdict over V(r). A NaN or inf where the exact value itself is not a
        // finite f32 (hostile inputs) is the right answer, not something the guard would
        // repair; it is counted in `hostile` instead.
        if e.guard_would_change() {
            let g = &mut self.v.guard;
            if e.got.is_nan() {
                g.nan += 1;
            } else if e.got > 0.0 {
                g.pos_inf += 1;
            } else {
                g.neg_inf += 1;
            }
            self.row_affected = true;
        }
        let exp = e.expected.unwrap_or(f64::NAN);
        match e.seen {
            Seen::Unchecked => {}
            Seen::Ok { bound, .. } => {
                self.v.metrics.checked += 1;
                self.add_finite(e.got, exp, Some(bound));
            }
            Seen::Undefined => {
                let h = &mut self.v.hostile;
                h.undefined += 1;
                // What the kernel gave is tallied where the reference was computed.
                if e.listed {
                    if e.got.is_nan() {
                        h.got_nan += 1;
                    } else if e.got.is_infinite() {
                        h.got_inf += 1;
                    } else {
                        h.got_finite += 1;
                    }
                }
            }
            Seen::Finding { class, bound } => {
                if e.listed {
                    self.v.metrics.checked += 1;
                    if e.got.is_finite() {
                        self.add_finite(e.got, exp, bound);
                    } else {
                        self.v.metrics.max_err_over_bound = f64::INFINITY;
                    }
                }
                let ex = Offender {
                    class,
                    row: Some(e.row),
                    pos: Some(e.pos),
                    expected: Some(exp),
                    got: Some(show_f32(e.got)),
                    bound,
                    detail: (!e.listed).then(|| "element outside the reference sample".into()),
                };
                self.v.add(class, 1, Some(ex), self.cfg.max_examples);
            }
        }
    }

    fn row_end(&mut self, r: usize, row: &[f32], len: usize, rref: Option<&RowReference>) {
        self.outside_row(r, row, len);
        self.v.guard.rows_affected += std::mem::take(&mut self.row_affected) as u64;
        let Some(rref) = rref else {
            return;
        };
        self.v.metrics.rows_checked += 1;
        if self.cfg.topk > 0 && len > self.cfg.topk && rref.is_dense() {
            self.topk_row(r, &row[..len], rref);
        }
    }
}
