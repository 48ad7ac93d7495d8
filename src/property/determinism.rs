//! Bitwise determinism: a case run R times must give the same bits over V(r) every
//! time. The first run is the campaign's judged one; runs 2..=R are compared with it.

use super::{compare_rows, rerun, rerun_digests, show, Break, Diff, Outcome};
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
            // The first run finished; this one crashed: the same inputs, another fate.
            Err(RunError::Crash(m)) => return (crashed(k, repeat, &m), runs),
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

/// [`check`] for a first run judged on the device: the repeat runs are judged there too
/// and compared by their rows' digests of V(r). Where a digest differs, the case is run
/// again with its output fetched and [`check`]ed element by element to say where; a
/// difference that the fetched runs do not reproduce is still reported, by row.
pub fn check_digests(
    kernel: &dyn Kernel,
    case: &Case,
    first: &[u64],
    repeat: u32,
    read_only: bool,
) -> (Outcome, u64) {
    let mut runs = 0;
    for k in 2..=repeat.max(2) {
        runs += 1;
        let d = match rerun_digests(kernel, case, read_only) {
            Ok(d) => d,
            Err(RunError::Crash(m)) => return (crashed(k, repeat, &m), runs),
            Err(RunError::Skipped(m)) | Err(RunError::Environment(m)) => {
                return (Outcome::Skipped(format!("run {k} did not run: {m}")), runs)
            }
        };
        let differ: Vec<usize> = (0..case.rows()).filter(|&r| d[r] != first[r]).collect();
        if differ.is_empty() {
            continue;
        }
        // Where: fetch outputs and compare them element by element.
        runs += 1;
        let located = match rerun(kernel, case) {
            Ok(full) => {
                let (o, n) = check(kernel, case, &full, repeat);
                runs += n;
                o
            }
            Err(e) => Outcome::Skipped(format!("the fetched re-run did not run: {e}")),
        };
        if let Outcome::Broken(_) = located {
            return (located, runs);
        }
        let r = differ[0];
        let detail = format!(
            "run {k} of {repeat} differs from run 1 in the digest of V(r) of {} row(s), first row {r}; the runs with fetched outputs did not reproduce it",
            differ.len()
        );
        return (
            Outcome::Broken(Break {
                differing: differ.len() as u64,
                first: Some((r, 0)),
                values: Vec::new(),
                max_abs_diff: f64::NAN,
                max_ulps: 0,
                detail,
            }),
            runs,
        );
    }
    (Outcome::Held, runs)
}

/// Run `k` of `repeat` crashed where run 1 did not.
fn crashed(k: u32, repeat: u32, m: &str) -> Outcome {
    Outcome::Broken(Break {
        differing: 0,
        first: None,
        values: Vec::new(),
        max_abs_diff: f64::INFINITY,
        max_ulps: 0,
        detail: format!("run {k} of {repeat} crashed where run 1 did not: {m}"),
    })
}
