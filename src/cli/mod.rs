//! Command line (clap derive). Each subcommand parses here and runs in its module
//! (`run` in [`run`], `replay` in [`replay`], the reports' commands in `report::cli`, the
//! benchmarks and GPU checks in `bench`); errors come back as [`Fatal`] and are rendered
//! once in `main`.

mod replay;
mod run;

use crate::error::{exit, Fatal};
use crate::generate::Profile;
use crate::kernel;
use crate::shard::Shard;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "mqa-fuzz",
    version,
    about = "Differential fuzzer for FP8 paged MQA logits kernels (DeepGEMM, AITER, your own)",
    long_about = "Generates cases of the DeepSeek V3.2/V4 indexer's fp8_paged_mqa_logits operation, runs a kernel \
on them, compares with an exact reference element by element, and says where and why the output diverges.\n\n\
Exit codes: 0 clean, 1 findings, 2 bad usage or input, 3 environment (e.g. GPU required but absent)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a fuzz campaign: replay the corpus, generate cases, shrink and save findings, write a report.
    Run(Box<RunArgs>),
    /// Measure detection power: fuzz every planted-bug kernel from several seeds, and clean kernels for false positives.
    Selftest {
        /// Which planted bugs to fuzz.
        #[arg(long, value_enum, default_value_t = crate::selftest::Backend::Cpu)]
        backend: crate::selftest::Backend,
        /// Budget of each campaign.
        #[arg(long, value_parser = parse_duration, default_value = "60s", allow_hyphen_values = true)]
        budget: Duration,
        /// Seeds per planted bug.
        #[arg(long, default_value_t = 5)]
        seeds: u64,
        /// Only kernels whose name contains one of these (repeatable).
        #[arg(long)]
        only: Vec<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List kernels and whether this machine can run them.
    Kernels {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Replay saved cases (corpus files) on a kernel and judge them.
    Replay {
        /// Corpus JSON files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Kernel to run (repeatable: with two or more, their outputs are also compared, as a
        /// campaign does). Default: the kernel(s) recorded in each file (exit 3 when one is
        /// not available here); files without a recorded kernel (hand-made) use the default kernel.
        #[arg(long = "kernel", short = 'k')]
        kernels: Vec<String>,
        /// k of the downstream top-k check.
        #[arg(long, default_value_t = 2048)]
        topk: usize,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Benchmarks.
    #[command(subcommand)]
    Bench(Bench),
    /// Checks the CUDA kernels, planted bugs and the exact GPU reference on this machine's GPU.
    #[command(hide = true)]
    GpuSelfcheck {
        /// Random cases per kernel.
        #[arg(long, default_value_t = 60)]
        cases: usize,
        /// Random cases for the GPU reference's bit-identity check (`--oracle-cases`: the
        /// old name, kept for scripts).
        #[arg(long, default_value_t = 60, alias = "oracle-cases")]
        reference_cases: usize,
        /// Random shapes and value seeds for the device generator's byte-identity check.
        #[arg(long, default_value_t = 200)]
        generator_cases: usize,
        /// Cases (a third of them production-profile) judged both on the device and on
        /// the CPU, whose verdicts must be the same.
        #[arg(long, default_value_t = 60)]
        judge_cases: usize,
    },
    /// Compiles every CUDA kernel variant into the disk cache (NVRTC only, no GPU needed).
    #[command(hide = true)]
    GpuPrecompile {
        /// NVRTC architecture.
        #[arg(long, default_value = "sm_90a")]
        arch: String,
    },
    /// Serve a built-in kernel over the worker protocol on stdin/stdout (used by
    /// `exec:` pools to isolate kernels in child processes).
    #[command(hide = true)]
    Worker {
        /// Kernel to serve (any name `mqa-fuzz kernels` lists).
        #[arg(long)]
        kernel: String,
        /// Misbehave on purpose (tests): crash-at=N, hang-at=N, garbage-at=N, wrong-id-at=N, fault-exit-at=N, fault-exit-on=all-zero-batch (every all-zero batch), skew.
        #[arg(long)]
        fault: Option<String>,
    },
    /// Re-render a report directory (junit.xml, summary.md, index.html, pictures) from its report.json.
    Report {
        /// Report directory (or its report.json).
        dir: PathBuf,
    },
    /// Fold shard reports into one (counts add, findings deduplicate by signature).
    Merge {
        /// Shard report directories (or their report.json files).
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// Directory to write the merged report into.
        #[arg(long)]
        out: PathBuf,
    },
    /// Compare two reports by finding signature: new, fixed and unchanged bugs. Exit 1
    /// on a new signature, even of a class the base already had. A base finding the
    /// candidate lacks is "fixed" only when its saved case no longer fails on replay;
    /// one that still fails is listed as STILL-FAILS (the candidate did not meet it).
    Diff {
        /// The baseline report directory (or report.json).
        base: PathBuf,
        /// The candidate report directory (or report.json).
        cand: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Do not replay the base's missing findings (they are listed UNCONFIRMED).
        #[arg(long)]
        no_replay: bool,
    },
}
#[derive(Subcommand, Debug)]
pub enum Bench {
    /// Time the exact CPU reference on three production-like cases, 1 thread vs all,
    /// against the measured f64 FMA peak and numpy's BLAS (when numpy is installed).
    Reference {
        /// Threads of the "all threads" column (default: all cores).
        #[arg(long)]
        threads: Option<usize>,
        /// Minimum seconds of repeats per timing.
        #[arg(long, default_value_t = 1.0)]
        min_seconds: f64,
        /// Skip the numpy column.
        #[arg(long)]
        no_numpy: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// GPU: kernel time, exact GPU reference time, CPU cross-check time and verified
    /// logits/s (`bench oracle`: the old name, kept for scripts).
    #[command(alias = "oracle")]
    Gpu,
    /// Time the host side of full-scale production cases, the CPU work around each
    /// launch of a cuda: campaign: materialising the case, validating it, the harness
    /// writing the request into a shared region and the worker reading it back (checked
    /// equal). Prints each step summed, per case (mean and median) and on the slowest case.
    Host {
        /// Production cases to time.
        #[arg(long, default_value_t = 40)]
        cases: u64,
        /// Campaign seed the cases are drawn from (as `run --seed`).
        #[arg(long, default_value_t = 11)]
        seed: u64,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Time the CPU judge (the reference excluded) on the three production-like cases,
    /// with a reduced-precision and an accurate kernel's errors: the old judge (a plain
    /// per-element recomputation of each noticeable error's full bound) against the
    /// judge now, interleaved in one run on one thread, and the judge now on every
    /// thread. Exits 1 if the two disagree.
    Judge {
        /// Minimum seconds of repeats per timing.
        #[arg(long, default_value_t = 1.0)]
        min_seconds: f64,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Runs the parsed command; returns the exit code.
pub fn dispatch(cli: Cli) -> Result<i32, Fatal> {
    // Read by every device-judged request; a value it cannot use is refused here, once.
    crate::kernel::CacheCheck::from_env().map_err(Fatal::usage)?;
    match cli.command {
        Command::Run(args) => run::cmd_run(*args),
        Command::Selftest {
            backend,
            budget,
            seeds,
            only,
            json,
        } => {
            if seeds == 0 {
                return Err(Fatal::usage(
                    "nothing was judged: --seeds 0 runs no campaign (give at least 1 seed per planted bug)",
                ));
            }
            crate::interrupt::install();
            crate::selftest::run(&crate::selftest::Options {
                backend,
                budget,
                seeds,
                json,
                only,
                workdir: None,
            })
        }
        Command::Kernels { json } => cmd_kernels(json),
        Command::Replay {
            files,
            kernels,
            topk,
            json,
        } => replay::cmd_replay(&files, &kernels, topk, json),
        Command::Bench(Bench::Gpu) => crate::bench::gpu::bench_gpu(),
        Command::Bench(Bench::Host { cases, seed, json }) => {
            crate::bench::host::run_host_bench(cases, seed, json)
        }
        Command::Bench(Bench::Judge { min_seconds, json }) => {
            crate::bench::judge::run_judge_bench(min_seconds, json)
        }
        Command::GpuSelfcheck {
            cases,
            reference_cases,
            generator_cases,
            judge_cases,
        } => crate::bench::gpu::selfcheck(cases, reference_cases, generator_cases, judge_cases),
        Command::GpuPrecompile { arch } => {
            let n = crate::bench::gpu::precompile(&arch).map_err(Fatal::environment)?;
            crate::outln!(
                "compiled {n} kernel variants for {arch} into {:?}",
                kernel::cuda::compile::cache_dir()
            );
            Ok(exit::CLEAN)
        }
        Command::Worker { kernel, fault } => cmd_worker(&kernel, fault.as_deref()),
        Command::Report { dir } => crate::report::cli::cmd_report(&dir),
        Command::Merge { dirs, out } => crate::report::cli::cmd_merge(&dirs, &out),
        Command::Diff {
            base,
            cand,
            json,
            no_replay,
        } => {
            let oracle = crate::oracle::OracleConfig::default();
            let mut replay =
                |f: &crate::report::Finding| crate::campaign::corpus::reproduces(f, &oracle);
            crate::report::cli::cmd_diff(
                &base,
                &cand,
                json,
                (!no_replay).then_some(&mut replay as _),
            )
        }
        Command::Bench(Bench::Reference {
            threads,
            min_seconds,
            no_numpy,
            json,
        }) => crate::bench::run_reference_bench(&crate::bench::ReferenceBenchOptions {
            threads,
            json,
            min_seconds,
            no_numpy,
        }),
    }
}

fn cmd_worker(name: &str, fault: Option<&str>) -> Result<i32, Fatal> {
    let fault = fault
        .map(kernel::exec::server::Fault::parse)
        .transpose()
        .map_err(Fatal::usage)?;
    kernel::exec::server::serve(name, kernel::open(name), fault)
}

fn cmd_kernels(json: bool) -> Result<i32, Fatal> {
    let entries = kernel::registry();
    if json {
        let v: Vec<_> = entries
            .iter()
            .map(|e| {
                serde_json::json!({
                    "name": e.name,
                    "description": e.description,
                    "available": e.available.is_ok(),
                    "unavailable_reason": e.available.as_ref().err(),
                    "planted_bug": e.planted_bug,
                })
            })
            .collect();
        crate::outln!("{}", serde_json::to_string_pretty(&v).unwrap());
        return Ok(exit::CLEAN);
    }
    let width = entries.iter().map(|e| e.name.len()).max().unwrap_or(10);
    for e in &entries {
        let status = match &e.available {
            Ok(()) => "available".to_string(),
            Err(why) => format!("unavailable: {why}"),
        };
        crate::outln!(
            "{:width$}  {:<11}  {}",
            e.name,
            if e.planted_bug { "planted bug" } else { "" },
            status
        );
        crate::outln!("{:width$}  {:<11}  {}", "", "", e.description);
    }
    Ok(exit::CLEAN)
}

#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Kernel to fuzz (repeatable; with two or more, they are also compared to each other).
    /// Default: the best built-in kernel this machine can run.
    #[arg(long = "kernel", short = 'k')]
    pub kernels: Vec<String>,
    /// What to generate.
    #[arg(long, value_enum, default_value_t = Profile::All)]
    pub profile: Profile,
    /// Time budget, e.g. 90s, 10m, 1h (default 60s unless --cases is given).
    #[arg(long, value_parser = parse_duration, allow_hyphen_values = true)]
    pub budget: Option<Duration>,
    /// Number of generated cases (stops at whichever of budget and cases comes first).
    #[arg(long)]
    pub cases: Option<u64>,
    /// Campaign seed (default: random, printed). The same seed gives the same cases.
    #[arg(long, value_parser = parse_seed)]
    pub seed: Option<u64>,
    /// Cases run at once (default: what the kernels prefer: 1 on the CPU, one per GPU).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Corpus directory: replayed first; new findings are saved here. Default: corpus/,
    /// except when a kernel is a planted bug (cpu:bug-*, cuda:bug-*): then <report>/corpus,
    /// so that planted-bug findings stay out of the tracked corpus and the checkout.
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// Report directory (default: reports/<UTC timestamp>).
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Run shard I of N (seeds and corpus files are partitioned); default from SLURM_ARRAY_TASK_ID/COUNT or JOB_COMPLETION_INDEX/JOB_COMPLETIONS.
    #[arg(long, value_parser = parse_shard)]
    pub shard: Option<Shard>,
    /// Save findings as generated, without shrinking them.
    #[arg(long)]
    pub no_shrink: bool,
    /// Do not replay the corpus first.
    #[arg(long)]
    pub no_replay: bool,
    /// Longest time spent shrinking one finding.
    #[arg(long, value_parser = parse_duration, default_value = "30s", allow_hyphen_values = true)]
    pub shrink_budget: Duration,
    /// The share of --budget that shrinking may use in total, all findings together: 0.3
    /// or 30%, in (0, 1]. Generation goes on in between. A finding met once the share is
    /// spent, or near the budget's end, is still shrunk for up to min(5s, --shrink-budget),
    /// one such floor per campaign; the report says which findings were cut short and why.
    #[arg(
        long,
        value_name = "FRACTION",
        default_value = "30%",
        allow_hyphen_values = true
    )]
    pub shrink_share: String,
    /// k of the downstream top-k check (V3.2: 2048, V4-Pro: 1024, V4-Flash: 512).
    #[arg(long, default_value_t = 2048)]
    pub topk: usize,
    /// GPUs for cuda: kernels: all, or a list like 0,1 (one worker per GPU).
    #[arg(long)]
    pub gpus: Option<String>,
    /// How much of each generated case the reference checks: full, sample:<fraction> (rows,
    /// plus every boundary position) or boundaries (block, chunk and context edges only).
    /// Default: full, except production cases of CPU kernels (sample:0.05).
    #[arg(long, value_parser = |s: &str| s.parse::<crate::reference::verify::VerifyMode>())]
    pub verify: Option<crate::reference::verify::VerifyMode>,
    /// Where outputs are judged: auto, cpu or gpu. gpu: on the GPU next to the kernel's
    /// output (the exact GPU reference and the oracle's per-element rules there; only
    /// the verdict comes back), the CPU re-checking both ends of every row and the
    /// block, tile and chunk edges of a few rows of each case (a disagreement is an
    /// oracle_disagreement finding); a case with a finding brings its output back for
    /// the CPU judge too. A kernel that cannot is a usage error. auto: gpu for cuda:
    /// kernels on a GPU whose shape the GPU reference takes (heads % 8 == 0, head_dim a
    /// multiple of 16 up to 128), else cpu, said in one line. cpu: always on the CPU.
    /// A device-judged case is verified in full whatever --verify says.
    #[arg(long, default_value = "auto", value_parser = |s: &str| s.parse::<crate::oracle::JudgeMode>())]
    pub judge: crate::oracle::JudgeMode,
    /// Production profile: multiply the engine's context lengths by this (0 < F <= 1;
    /// requests at max_model_len stay there). Pools, strides, block ids, batch sizes and
    /// workspaces keep an engine's size. Default: 1 for kernels on an accelerator,
    /// 1/64 for CPU kernels.
    #[arg(long, value_parser = parse_scale, allow_hyphen_values = true)]
    pub scale: Option<f64>,
    /// Cases per shape epoch for kernels that declare a compile key (libraries that
    /// JIT-compile per heads, head dim, next_n...): consecutive cases share the key's
    /// fields, everything else varies. Default 64 where a kernel declares a key; 1 turns
    /// it off.
    #[arg(long, value_name = "N")]
    pub shape_epoch: Option<u64>,
    /// Consecutive production-profile cases that share a deployment: the model,
    /// max_model_len, platform, MTP depth and KV pool of one server (its batches, churn
    /// and values vary), as the steps of a server do. Default 16; 1 gives every case a
    /// server of its own.
    #[arg(long, value_name = "N")]
    pub deployment_epoch: Option<u64>,
    /// Generated cases predicted to hit a known crash: the share of them still run, in
    /// (0, 1] (1/8, 0.125, 12.5%; 1 runs them all). A crash finding predicts the cases
    /// with every feature that all of this campaign's generated cases crashing that way
    /// had (its trigger's, and what they share where ablation named none); each crash
    /// costs a worker's death and restart and tells nothing new. The cases still run
    /// (chosen by seed) check the prediction: while more than one in nine of them does
    /// not crash that way, every case runs. The report counts the cases not run.
    #[arg(
        long,
        value_name = "FRACTION",
        default_value = "1/8",
        value_parser = parse_known_crash_share,
        allow_hyphen_values = true
    )]
    pub known_crashes: f64,
    /// Run only generated cases whose sequences hold at least N KV tokens in all (a 2-D
    /// sequence counts its longest row): smaller ones are drawn, counted in the report
    /// and not run. For engine-sized cases only, e.g. a throughput figure on
    /// `--profile production` (`--min-tokens 100000`); it leaves out the small and
    /// all-zero batches where some bugs live.
    #[arg(long, value_name = "N")]
    pub min_tokens: Option<u64>,
    /// Stop generating after this many distinct findings (e.g. 1 for a quick gate).
    #[arg(long)]
    pub max_findings: Option<usize>,
    /// Determinism: run each generated case R times and compare the valid range bitwise
    /// (a property, reported in its own section; a finding only with --require
    /// deterministic). 1 turns it off. Default: 2 for kernels on a GPU in the production
    /// profile (and wherever --require deterministic asks), else 1.
    #[arg(long, value_name = "R")]
    pub repeat: Option<u32>,
    /// Batch invariance: re-run one sequence of each multi-sequence case alone and with
    /// the batch reversed, on the same physical blocks, and compare its rows bitwise (a
    /// property; a finding only with --require batch-invariant). auto: on for kernels on a
    /// GPU in the production profile and wherever --require batch-invariant asks.
    #[arg(long, value_enum, default_value_t = crate::property::Switch::Auto)]
    pub batch_invariance: crate::property::Switch,
    /// Properties whose violation is a finding (exit 1, saved and shrunk like any other):
    /// deterministic, batch-invariant (comma-separated) or all. Turns the checks on. Without
    /// it, violations are only reported in the report's properties section.
    #[arg(long, value_name = "LIST", value_parser = crate::property::Property::parse_list)]
    pub require: Option<std::vec::Vec<crate::property::Property>>,
    /// Crash localisation on NVIDIA: re-run each shrunk crash once under compute-sanitizer
    /// memcheck (when it is on PATH and the kernel runs on a GPU) and attach the first
    /// error record (kernel, access, address, thread/block, nearest allocation, source
    /// line) to the finding. `memcheck,initcheck` also runs initcheck on shrunk
    /// `unwritten` findings; `off` turns it off. A finding says why when it is not localised.
    #[arg(long, value_name = "TOOLS", default_value = "memcheck", value_parser = crate::finding::sanitizer::SanitizeConfig::parse)]
    pub sanitize: crate::finding::sanitizer::SanitizeConfig,
    /// Longest sanitized re-run of one finding (compute-sanitizer slows kernels 10-100x).
    #[arg(long, value_parser = parse_duration, default_value = "300s", allow_hyphen_values = true)]
    pub sanitize_timeout: Duration,
    /// No progress output.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

/// Parses `90`, `90s`, `10m`, `1h`, `500ms`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, "s"),
    };
    if s.starts_with('-') {
        return Err(format!(
            "{s:?} is negative: a duration is at least 0, like 90s, 10m or 1h"
        ));
    }
    let x: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 90s, 10m or 1h"))?;
    let secs = match unit {
        "ms" => x / 1000.0,
        "s" | "sec" => x,
        "m" | "min" => x * 60.0,
        "h" => x * 3600.0,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in {s:?} (use ms, s, m or h)"
            ))
        }
    };
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses `--shrink-share`: a fraction in (0, 1] (`0.3`) or a percentage (`30%`).
pub fn parse_share(s: &str) -> Result<f64, String> {
    fraction(s).ok_or_else(|| format!(
        "--shrink-share {s}: the share of the budget shrinking may use is a fraction in (0, 1] or a percentage, like 0.3 or 30%"
    ))
}

/// Parses `--known-crashes`: a fraction in (0, 1] (`0.125`, `1/8`, `12.5%`).
pub fn parse_known_crash_share(s: &str) -> Result<f64, String> {
    fraction(s).ok_or_else(|| format!(
        "--known-crashes {s}: the share of cases predicted to hit a known crash that still run is a fraction in (0, 1], like 1/8, 0.125 or 12.5% (1 runs them all)"
    ))
}

/// `0.3`, `30%` or `3/10`, when in (0, 1].
fn fraction(s: &str) -> Option<f64> {
    let t = s.trim();
    let x = if let Some(p) = t.strip_suffix('%') {
        p.trim().parse::<f64>().ok()? / 100.0
    } else if let Some((a, b)) = t.split_once('/') {
        a.trim().parse::<f64>().ok()? / b.trim().parse::<f64>().ok()?
    } else {
        t.parse::<f64>().ok()?
    };
    (x > 0.0 && x <= 1.0).then_some(x)
}

/// Parses `--scale`: a number in (0, 1] or a fraction `1/N`.
pub fn parse_scale(s: &str) -> Result<f64, String> {
    let x = match s.split_once('/') {
        Some((a, b)) => match (a.trim().parse::<f64>(), b.trim().parse::<f64>()) {
            (Ok(a), Ok(b)) if b != 0.0 => Ok(a / b),
            _ => Err(()),
        },
        None => s.trim().parse::<f64>().map_err(|_| ()),
    };
    match x {
        Ok(x) if x > 0.0 && x <= 1.0 => Ok(x),
        _ => Err(format!(
            "{s:?} is not a scale: a number in (0, 1] or a fraction like 1/64"
        )),
    }
}

fn parse_seed(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("{s:?} is not a seed (a decimal or 0x-hex 64-bit integer)"))
}

/// Parses `I/N` with 0 <= I < N (the one parser lives with [`Shard`]).
pub fn parse_shard(s: &str) -> Result<Shard, String> {
    s.parse()
}

/// Shard from a Slurm job array or a Kubernetes indexed Job, when present (see
/// [`crate::shard::shard_from_env`]: Slurm arrays not starting at 0 or with a step,
/// and an index without its count, are handled there).
pub fn shard_from_env() -> Result<Option<Shard>, Fatal> {
    crate::shard::shard_from_env()
}
