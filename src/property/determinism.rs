//! Bitwise determinism: a case run R times must give the same bits over V(r) every
//! time. The first run is the campaign's judged one; runs 2..=R are compared with it.

use super::{compare_rows, rerun, show, Break, Diff, Outcome};
use crate::case::Case;
use crate::kernel::{Kernel, OutputBuffer, RunError};

/// Runs `case` `repeat - 1` more times and compares V(r) bitwise with `first`.
/// Returns the outcome and the extra runs made.
pub fn check(
    kernel: &dyn Kernel,
    case: &Case,
    first: &OutputBuffer,
    repeat: u32,
) -> (Outcome, u64) {
    let mut runs = 0;
    // Per differing run: its diff against run 1; the first run that differs is named.
    let mut worst: Option<(u32, Diff)> = None;
    let mut total = Diff::default();
    let mut differing_runs = 0;
    for k in 2..=repeat.max(2) {
        runs += 1;
        let out = match rerun(kernel, case) {
            Ok(o) => o,
            Err(RunError::Crash(m)) => {
                // The first run finished; this one crashed: the same inputs, another fate.
                let detail = format!("run {k} of {repeat} crashed where run 1 did not: {m}");
                return (
                    Outcome::Broken(Break {
                        differing: 0,
                        first: None,
                        values: Vec::new(),
                        max_abs_diff: f64::INFINITY,
                        max_ulps: 0,
                        detail,
                    }),
                    runs,
                );
            }
            Err(RunError::Skipped(m)) | Err(RunError::Environment(m)) => {
                return (Outcome::Skipped(format!("run {k} did not run: {m}")), runs)
            }
        };
        let mut d = Diff::default();
        compare_rows(
            &mut d,
            first,
            &out,
            (0..case.rows()).map(|r| (r, r, case.valid_len(r))),
        );
        if d.differing > 0 {
            differing_runs += 1;
            total.differing = total.differing.max(d.differing);
            total.max_abs = total.max_abs.max(d.max_abs);
            total.max_ulps = total.max_ulps.max(d.max_ulps);
            if worst.is_none() {
                worst = Some((k, d));
            }
        }
    }
    let Some((k, d)) = worst else {
        return (Outcome::Held, runs);
    };
    let (r, t, a, b) = d.first.expect("a differing run has a first difference");
    let detail = format!(
        "{differing_runs} of {} repeat runs differ from run 1; run {k} first at row {r} position {t}: {} vs {} ({} of {} valid elements differ; {})",
        repeat.max(2) - 1,
        show(a),
        show(b),
        d.differing,
        case.valid_elements(),
        total.spread_words()
    );
    (
        Outcome::Broken(Break {
            differing: total.differing,
            first: Some((r, t)),
            values: vec![show(a), show(b)],
            max_abs_diff: total.max_abs,
            max_ulps: total.max_ulps,
            detail,
        }),
        runs,
    )
}
