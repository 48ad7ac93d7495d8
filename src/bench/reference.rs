//! `mqa-fuzz bench reference`: the exact CPU reference on three production-like cases,
//! against this machine's measured f64 FMA peak and numpy's BLAS, 1 thread vs all.

use super::{numpy, peak};
use crate::case::{Case, ScalePlacement};
use crate::error::Fatal;
use crate::generate::recipe::{rng_for, LensRecipe, Recipe};
use crate::reference::{self, Backend, RowSelection};
use rand::RngExt;
use serde::Serialize;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct ReferenceBenchOptions {
    /// Threads of the "all threads" column (default: every core rayon sees).
    pub threads: Option<usize>,
    pub json: bool,
    /// Minimum seconds of repeats per timing.
    pub min_seconds: f64,
    /// Skip the numpy column.
    pub no_numpy: bool,
}

/// One production-like case.
pub struct BenchCase {
    pub name: &'static str,
    pub description: String,
    pub case: Case,
}

/// The three cases of the brief: (a) a decode batch with MTP, (b) one long context,
/// (c) many short ones. DeepSeek indexer shapes (H=64, D=128, block 64), pipeline
/// values (bf16 gaussians, ue8m0 per-token scales).
pub fn cases() -> Vec<BenchCase> {
    let mut rng = rng_for(0xBE7C);
    let a: Vec<usize> = (0..8).map(|_| rng.random_range(2867..=5325)).collect();
    vec![
        BenchCase {
            name: "a",
            description: "B=8 N=2 ctx 4096±30%".into(),
            case: recipe(2, LensRecipe::PerSequence(a), 1).materialize(),
        },
        BenchCase {
            name: "b",
            description: "B=1 N=1 ctx 65536".into(),
            case: recipe(1, LensRecipe::PerSequence(vec![65536]), 2).materialize(),
        },
        BenchCase {
            name: "c",
            description: "B=64 N=1 ctx 512".into(),
            case: recipe(1, LensRecipe::PerSequence(vec![512; 64]), 3).materialize(),
        },
    ]
}

fn recipe(next_n: usize, lens: LensRecipe, seed: u64) -> Recipe {
    Recipe {
        lens,
        ..Recipe::production(Vec::new(), next_n, seed)
    }
}

/// Flops of the dots of a case: `2·H·D` per valid logit.
pub fn dot_flops(case: &Case) -> f64 {
    2.0 * case.shape.heads as f64 * case.shape.head_dim as f64 * case.valid_elements() as f64
}

/// Best and median seconds of `f` over ≥ 3 repeats and ≥ `min_seconds` (after one
/// warm-up run).
pub fn time<F: FnMut()>(min_seconds: f64, mut f: F) -> (f64, f64) {
    f();
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 3 || start.elapsed().as_secs_f64() < min_seconds {
        let t = Instant::now();
        f();
        times.push(t.elapsed().as_secs_f64());
    }
    best_and_median(times)
}

/// Like [`time`] for each pool, with the pools' repeats interleaved: on a shared or
/// throttling machine, the slow phases then hit every thread count alike and the
/// scaling figure compares like with like.
pub fn time_pools<F: Fn() + Sync>(
    pools: &[(usize, rayon::ThreadPool)],
    min_seconds: f64,
    f: F,
) -> Vec<(f64, f64)> {
    let runs: Vec<(&rayon::ThreadPool, &(dyn Fn() + Sync))> = pools
        .iter()
        .map(|(_, p)| (p, &f as &(dyn Fn() + Sync)))
        .collect();
    time_interleaved(&runs, min_seconds)
}

/// Best and median seconds of each `(pool, work)` pair, repeats taken round-robin
/// (≥ 3 each, ≥ `min_seconds` per pair in total) after one warm-up of each.
pub fn time_interleaved(
    runs: &[(&rayon::ThreadPool, &(dyn Fn() + Sync))],
    min_seconds: f64,
) -> Vec<(f64, f64)> {
    let mut times = vec![Vec::new(); runs.len()];
    for (p, f) in runs {
        p.install(f);
    }
    let start = Instant::now();
    while times[0].len() < 3 || start.elapsed().as_secs_f64() < min_seconds * runs.len() as f64 {
        for ((p, f), ts) in runs.iter().zip(times.iter_mut()) {
            let t = Instant::now();
            p.install(f);
            ts.push(t.elapsed().as_secs_f64());
        }
    }
    times.into_iter().map(best_and_median).collect()
}

/// The fastest of `times` and their median (`util::median` sorts them first).
fn best_and_median(mut times: Vec<f64>) -> (f64, f64) {
    let median = crate::util::median(&mut times).unwrap_or(f64::NAN);
    (times.first().copied().unwrap_or(f64::NAN), median)
}

#[derive(Clone, Debug, Serialize)]
struct Timing {
    threads: usize,
    best_s: f64,
    median_s: f64,
    gflops: f64,
    /// Of the measured f64 FMA peak at the same thread count.
    peak_fraction: f64,
    logits_per_s: f64,
}

#[derive(Clone, Debug, Serialize)]
struct CaseReport {
    name: &'static str,
    description: String,
    logits: u64,
    gflop: f64,
    rust: Vec<Timing>,
    scaling: f64,
    bit_identical_to_simple: Option<bool>,
    numpy: Vec<serde_json::Value>,
    numpy_skipped: Option<String>,
    /// Largest |numpy - rust| / (relu_mag + 1e-300) over V(r).
    numpy_max_rel_diff: Option<f64>,
    /// numpy time / rust time at all threads (> 1: rust is faster).
    speedup_vs_numpy: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
struct BackendTiming {
    backend: &'static str,
    threads: usize,
    best_s: f64,
    gflops: f64,
}

#[derive(Clone, Debug, Serialize)]
struct Report {
    threads: usize,
    peak_isa: &'static str,
    peak_gflops_1: f64,
    peak_gflops_all: f64,
    reference_path: &'static str,
    cases: Vec<CaseReport>,
    backends_case_a: Vec<BackendTiming>,
}

fn pool(threads: usize) -> Result<rayon::ThreadPool, Fatal> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| Fatal::environment(format!("cannot start {threads} threads: {e}")))
}

/// Runs the bench and prints it; returns the exit code.
pub fn run_reference_bench(opts: &ReferenceBenchOptions) -> Result<i32, Fatal> {
    let threads = opts.threads.unwrap_or_else(rayon::current_num_threads);
    if threads == 0 {
        return Err(Fatal::usage("--threads must be at least 1"));
    }
    let say = |s: String| {
        if !opts.json {
            crate::outln!("{s}");
        }
    };
    let pools = [(1, pool(1)?), (threads, pool(threads)?)];
    let placement = ScalePlacement::AfterReluSum;

    say(format!("f64 FMA peak ({}), calibrating...", peak::isa()));
    let peak1 = pools[0]
        .1
        .install(|| peak::one_thread(Duration::from_millis(300)));
    let peak_all = peak::all_threads(&pools[1].1, Duration::from_millis(300));
    say(format!(
        "  1 thread  {peak1:8.1} GFLOP/s\n  {threads} threads {peak_all:8.1} GFLOP/s"
    ));
    say(format!(
        "reference: fused GEMM + combine, {} micro-kernel",
        reference::fast::simd_path()
    ));

    let numpy_ok = if opts.no_numpy {
        Err("--no-numpy".to_string())
    } else {
        numpy::available()
    };
    match &numpy_ok {
        Ok(v) => say(format!("numpy {v}: run with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed from its environment")),
        Err(why) => say(format!("numpy column skipped: {why}")),
    }
    let tmp = tempdir()?;

    let mut reports = Vec::new();
    let mut backends = Vec::new();
    for bc in cases() {
        let case = &bc.case;
        let flops = dot_flops(case);
        let logits = case.valid_elements();
        say(format!(
            "\ncase {}: {} (H={} D={} block {}), {} logits, {:.2} GFLOP",
            bc.name,
            bc.description,
            case.shape.heads,
            case.shape.head_dim,
            case.shape.block_size,
            logits,
            flops / 1e9
        ));
        let mut rust = Vec::new();
        let timings = time_pools(&pools, opts.min_seconds, || {
            drop(reference::compute(case, placement, &RowSelection::All))
        });
        for ((n, _), &(best, median)) in pools.iter().zip(&timings) {
            let pk = if *n == 1 { peak1 } else { peak_all };
            let t = Timing {
                threads: *n,
                best_s: best,
                median_s: median,
                gflops: flops / best / 1e9,
                peak_fraction: flops / best / 1e9 / pk,
                logits_per_s: logits as f64 / best,
            };
            say(format!(
                "  rust   {:>2} thr  {:9.2} ms  {:7.1} GFLOP/s  {:5.1}% of peak  {:7.1} Mlogits/s",
                n,
                best * 1e3,
                t.gflops,
                100.0 * t.peak_fraction,
                t.logits_per_s / 1e6
            ));
            rust.push(t);
        }
        let scaling = rust[0].best_s / rust[1].best_s;
        say(format!("  scaling 1 -> {threads} threads: {scaling:.2}x"));
        let fast = pools[1]
            .1
            .install(|| reference::compute(case, placement, &RowSelection::All));
        // The bit-for-bit check against the simple reference (skipped on case b: the
        // simple path takes a while there and cases a/c cover the same code).
        let identical = (bc.name != "b").then(|| {
            let simple = pools[1]
                .1
                .install(|| reference::compute_simple(case, placement, &RowSelection::All));
            simple == fast
        });
        if let Some(same) = identical {
            say(format!(
                "  bit-identical to the simple reference: {}",
                if same { "yes" } else { "NO" }
            ));
        }
        if bc.name == "a" {
            backends = backend_timings(case, placement, &pools, opts.min_seconds, &say);
        }
        let mut report = CaseReport {
            name: bc.name,
            description: bc.description.clone(),
            logits,
            gflop: flops / 1e9,
            rust,
            scaling,
            bit_identical_to_simple: identical,
            numpy: Vec::new(),
            numpy_skipped: numpy_ok.as_ref().err().cloned(),
            numpy_max_rel_diff: None,
            speedup_vs_numpy: None,
        };
        if numpy_ok.is_ok() {
            numpy_column(
                &mut report,
                (bc.name, case, &fast),
                placement,
                &pools,
                (threads, peak1, peak_all),
                &tmp,
                opts.min_seconds,
                &say,
            )?;
        }
        reports.push(report);
    }
    let _ = std::fs::remove_dir_all(&tmp);
    if opts.json {
        let r = Report {
            threads,
            peak_isa: peak::isa(),
            peak_gflops_1: peak1,
            peak_gflops_all: peak_all,
            reference_path: reference::fast::simd_path(),
            cases: reports,
            backends_case_a: backends,
        };
        crate::outln!("{}", serde_json::to_string_pretty(&r).unwrap());
    }
    Ok(crate::error::exit::CLEAN)
}

type Pools = [(usize, rayon::ThreadPool); 2];

/// Case a on every reference backend × thread count, interleaved so that machine noise
/// hits all alike.
fn backend_timings(
    case: &Case,
    placement: ScalePlacement,
    pools: &Pools,
    min_seconds: f64,
    say: &dyn Fn(String),
) -> Vec<BackendTiming> {
    let flops = dot_flops(case);
    let mut out = Vec::new();
    let work: Vec<(Backend, Box<dyn Fn() + Sync>)> = Backend::all()
        .into_iter()
        .map(|backend| {
            let f: Box<dyn Fn() + Sync> = Box::new(move || {
                drop(reference::compute_with(
                    case,
                    placement,
                    &RowSelection::All,
                    backend,
                ))
            });
            (backend, f)
        })
        .collect();
    let runs: Vec<(&rayon::ThreadPool, &(dyn Fn() + Sync))> = work
        .iter()
        .flat_map(|(_, f)| pools.iter().map(move |(_, p)| (p, f.as_ref())))
        .collect();
    let timings = time_interleaved(&runs, min_seconds / 2.0);
    let labels = work
        .iter()
        .flat_map(|(b, _)| pools.iter().map(move |(n, _)| (*b, *n)));
    for ((backend, n), &(best, _)) in labels.zip(&timings) {
        say(format!(
            "  backend {:<15} {:>2} thr {:9.2} ms  {:7.1} GFLOP/s",
            backend.name(),
            n,
            best * 1e3,
            flops / best / 1e9
        ));
        out.push(BackendTiming {
            backend: backend.name(),
            threads: n,
            best_s: best,
            gflops: flops / best / 1e9,
        });
    }
    out
}

/// The numpy column of one case: numpy's time on each pool's thread count, its speed
/// against ours and its largest difference from the exact reference `fast`.
#[allow(clippy::too_many_arguments)] // one case's context, passed as the loop holds it
fn numpy_column(
    report: &mut CaseReport,
    (name, case, fast): (&str, &Case, &reference::Reference),
    placement: ScalePlacement,
    pools: &Pools,
    (threads, peak1, peak_all): (usize, f64, f64),
    tmp: &std::path::Path,
    min_seconds: f64,
    say: &dyn Fn(String),
) -> Result<(), Fatal> {
    let flops = dot_flops(case);
    let file = tmp.join(format!("case_{}.safetensors", name));
    numpy::write_case(case, placement, &file)
        .map_err(|e| Fatal::environment(format!("writing {}: {e}", file.display())))?;
    for (n, _) in pools {
        match numpy::run(tmp, &file, *n, min_seconds) {
            Ok(run) => {
                say(format!(
                    "  numpy  {:>2} thr  {:9.2} ms  {:7.1} GFLOP/s  {:5.1}% of peak   rust is {:.2}x faster",
                    n,
                    run.seconds * 1e3,
                    flops / run.seconds / 1e9,
                    100.0 * flops / run.seconds / 1e9 / if *n == 1 { peak1 } else { peak_all },
                    run.seconds / report.rust[if *n == 1 { 0 } else { 1 }].best_s
                ));
                if *n == threads {
                    report.speedup_vs_numpy = Some(run.seconds / report.rust[1].best_s);
                    report.numpy_max_rel_diff = Some(max_rel_diff(fast, &run.values));
                    say(format!("  numpy BLAS: {}", run.blas));
                    say(format!(
                        "  numpy vs rust: max |diff|/relu_mag {:.1e}",
                        report.numpy_max_rel_diff.unwrap()
                    ));
                }
                report.numpy.push(serde_json::to_value(&run).unwrap());
            }
            Err(why) => {
                say(format!("  numpy  {n:>2} thr  failed: {why}"));
                report.numpy_skipped = Some(why);
            }
        }
    }
    Ok(())
}

/// Largest `|numpy - rust| / relu_mag` over V(r), row by row (numpy sums in another
/// order, so only closeness is expected).
fn max_rel_diff(r: &reference::Reference, numpy: &[f64]) -> f64 {
    let ours: Vec<(f64, f64)> = r
        .rows
        .iter()
        .flatten()
        .flat_map(|row| row.value.iter().copied().zip(row.relu_mag.iter().copied()))
        .collect();
    if ours.len() != numpy.len() {
        return f64::INFINITY;
    }
    ours.iter()
        .zip(numpy)
        .map(|(&(v, m), &x)| (v - x).abs() / (m + 1e-300))
        .fold(0.0, f64::max)
}

fn tempdir() -> Result<std::path::PathBuf, Fatal> {
    let dir = std::env::temp_dir().join(format!("mqa-fuzz-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .map_err(|e| Fatal::environment(format!("creating {}: {e}", dir.display())))?;
    Ok(dir)
}
