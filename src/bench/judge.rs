//! `mqa-fuzz bench judge`: the CPU judge on the three production-like cases of `bench
//! reference`, with the error profile of a reduced-precision kernel, timed the old way
//! (`OracleConfig::plain_judge`: every noticeable ratio from a plain per-element
//! recomputation) and the way it judges now, interleaved in one run. Both must give the
//! same verdict and the same `max_err_over_bound`.

use super::reference::{cases, time_interleaved};
use crate::case::{Case, ScalePlacement};
use crate::error::exit;
use crate::error::Fatal;
use crate::kernel::{Capabilities, OutputBuffer, RunInfo};
use crate::oracle::{self, ErrorBound, OracleConfig, Verdict};
use crate::reference::{self, Reference, RowSelection};
use serde::Serialize;

/// Declared like `cuda:tiled` (a Hopper-style reduced-precision dot accumulator).
const REL: f64 = 1.0 / 1_048_576.0;
/// Error profiles: each element is off its exact value by `u · spread · cheap bound`,
/// `u` uniform in [-1, 1]. `reduced` puts three quarters of the elements past a quarter
/// of the cheap bound (where the old judge recomputed the full one); `accurate` (an f32
/// accumulator) none.
const PROFILES: [(&str, f64); 2] = [("reduced", 0.9), ("accurate", 0.01)];

#[derive(Serialize)]
struct Row {
    case: &'static str,
    errors: &'static str,
    description: String,
    logits: u64,
    plain_judge_s: f64,
    judge_s: f64,
    speedup: f64,
    /// The judge now, on every thread (rows in parallel).
    judge_all_threads_s: f64,
    max_err_over_bound: f64,
    old_max_err_over_bound: f64,
}

fn output_with_errors(case: &Case, r: &Reference, bound: &ErrorBound, spread: f64) -> OutputBuffer {
    let mut out = OutputBuffer::for_case(case);
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for (row, rr) in r.rows.iter().enumerate() {
        let Some(rr) = rr else { continue };
        for (t, v, m) in rr.elements() {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let u = (state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
            out.set(row, t, (v + u * spread * bound.lower(m)) as f32);
        }
        // Outside V(r): what DeepGEMM writes.
        for t in case.valid_len(row)..case.max_model_len {
            out.set(row, t, f32::NEG_INFINITY);
        }
    }
    out
}

/// Runs the benchmark; prints a table (or JSON). Exit 0 when both ways give the same
/// clean verdict on every case, 1 (a bug of ours) when they do not.
pub fn run_judge_bench(min_seconds: f64, json: bool) -> Result<i32, Fatal> {
    let mut caps = Capabilities::everything(ScalePlacement::AfterReluSum);
    caps.accumulation = crate::kernel::Accumulation::Reduced { rel: REL };
    let pool = |n: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .map_err(|e| Fatal::environment(format!("cannot start a thread pool: {e}")))
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (one, all) = (pool(1)?, pool(threads)?);
    let mut rows = Vec::new();
    for bc in cases() {
        let case = &bc.case;
        for (errors, spread) in PROFILES {
            let r = reference::compute(case, caps.scale_placement, &RowSelection::All);
            let bound = ErrorBound::for_kernel(caps.accumulation, &case.shape);
            let out = output_with_errors(case, &r, &bound, spread);
            let info = RunInfo::default();
            let judge = |plain_judge: bool| -> Verdict {
                let cfg = OracleConfig {
                    plain_judge,
                    ..Default::default()
                };
                oracle::judge(case, &r, &caps, Ok((&info, &out)), &cfg)
            };
            let (old, new) = (judge(true), judge(false));
            let same_ratio = new.metrics.max_err_over_bound == old.metrics.max_err_over_bound;
            if old.classes != new.classes
                || old.guard != new.guard
                || !new.classes.is_empty()
                || !same_ratio
            {
                eprintln!(
                "mqa-fuzz: bench judge: case {}: the two ways disagree or find something: {:?} vs {:?}, max err/bound {} vs {}",
                bc.name, old.classes, new.classes, old.metrics.max_err_over_bound, new.metrics.max_err_over_bound
            );
                return Ok(exit::FINDINGS);
            }
            let (f_old, f_new) = (|| drop(judge(true)), || drop(judge(false)));
            let runs = [
                (&one, &f_old as _),
                (&one, &f_new as _),
                (&all, &f_new as _),
            ];
            let t = time_interleaved(&runs, min_seconds);
            rows.push(Row {
                case: bc.name,
                errors,
                description: bc.description.clone(),
                logits: case.valid_elements(),
                plain_judge_s: t[0].1,
                judge_s: t[1].1,
                speedup: t[0].1 / t[1].1,
                judge_all_threads_s: t[2].1,
                max_err_over_bound: new.metrics.max_err_over_bound,
                old_max_err_over_bound: old.metrics.max_err_over_bound,
            });
        }
    }
    if json {
        crate::outln!(
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        );
        return Ok(exit::CLEAN);
    }
    crate::outln!(
        "CPU judge of a Reduced{{rel={REL:e}}} kernel, errors u·0.9 (reduced) or u·0.01 (accurate) of the cheap bound; medians; 1 thread, and the judge on {threads}"
    );
    crate::outln!(
        "{:<5} {:<24} {:<9} {:>10} {:>12} {:>10} {:>8} {:>12} {:>12} {:>10}",
        "case",
        "shape",
        "errors",
        "logits",
        "old judge s",
        "judge s",
        "speedup",
        "all threads",
        "old max e/b",
        "max e/b"
    );
    for r in &rows {
        crate::outln!(
            "{:<5} {:<24} {:<9} {:>10} {:>12.4} {:>10.4} {:>7.1}x {:>11.4}s {:>12.3} {:>10.3}",
            r.case,
            r.description,
            r.errors,
            r.logits,
            r.plain_judge_s,
            r.judge_s,
            r.speedup,
            r.judge_all_threads_s,
            r.old_max_err_over_bound,
            r.max_err_over_bound
        );
    }
    Ok(exit::CLEAN)
}
