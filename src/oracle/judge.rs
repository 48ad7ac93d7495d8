//! The verdict: the judge's sink of the element scan ([`super::scan`]), plus what lies
//! around V(r) (the outside contract, the guards of the output buffer, the inputs).

use super::scan::{scan, Element, ElementSink, Seen};
use super::{show_f32, topk_consistent, Class, ErrorBound, Offender, OracleConfig, TopKOutcome};
use super::{TopKStats, Verdict};
use crate::case::Case;
use crate::kernel::{Capabilities, OutputBuffer, OutsideContract, RunError, RunInfo, POISON_BITS};
use crate::reference::{self, Reference, RowReference};

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
    let mut sink = VerdictSink {
        v,
        case,
        reference,
        bound: &bound,
        cfg,
        outside: caps.outside,
        row_affected: false,
        sxy: 0.0,
        sxx: 0.0,
    };
    scan(case, reference, &bound, out, 0..case.rows(), &mut sink);
    let (mut v, sxy, sxx) = (sink.v, sink.sxy, sink.sxx);
    v.guard.redundant = v.guard.nan + v.guard.pos_inf + v.guard.neg_inf == 0;
    v.metrics.calc_diff = if sxx > 0.0 {
        1.0 - 2.0 * sxy / sxx
    } else {
        0.0
    };
    judge_guards(&mut v, out, cfg);
    v
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
    reference: &'a Reference,
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
        let (case, reference, bound) = (self.case, self.reference, self.bound);
        self.v.topk.rows_checked += 1;
        if let TopKOutcome::Inconsistent { detail } =
            topk_consistent(row, rref, bound, self.cfg.topk, |t| {
                let (_, m, a) = reference::element(case, reference.placement, r, t);
                bound.full(m, a)
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
