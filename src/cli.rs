//! Command line (clap derive). Each subcommand parses here and runs in its module;
//! errors come back as [`Fatal`] and are rendered once in `main`.

use crate::campaign;
use crate::case::{load_case_file, CaseFile};
use crate::error::{exit, Fatal};
use crate::generate::Profile;
use crate::harness::{self, ReferenceCache};
use crate::kernel;
use crate::oracle::{OracleConfig, Verdict};
use crate::report::Shard;
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
    /// Checks the CUDA kernels, planted bugs and GPU oracle on this machine's GPU.
    #[command(hide = true)]
    GpuSelfcheck {
        /// Random cases per kernel.
        #[arg(long, default_value_t = 60)]
        cases: usize,
        /// Random cases for the GPU oracle's bit-identity check.
        #[arg(long, default_value_t = 60)]
        oracle_cases: usize,
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
        /// Misbehave on purpose (tests): crash-at=N, hang-at=N, garbage-at=N, wrong-id-at=N, fault-exit-at=N, skew.
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
    /// Compare two reports: new, fixed and unchanged findings. Exit 1 on new findings.
    Diff {
        /// The baseline report directory (or report.json).
        base: PathBuf,
        /// The candidate report directory (or report.json).
        cand: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
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
    /// GPU oracle: kernel time, GPU-oracle time, CPU cross-check time and verified logits/s.
    Oracle,
}

/// Runs the parsed command; returns the exit code.
pub fn dispatch(cli: Cli) -> Result<i32, Fatal> {
    match cli.command {
        Command::Run(args) => cmd_run(*args),
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
            crate::campaign::interrupt::install();
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
        } => cmd_replay(&files, &kernels, topk, json),
        Command::Bench(Bench::Oracle) => kernel::cuda::bench::bench_oracle(),
        Command::GpuSelfcheck {
            cases,
            oracle_cases,
        } => kernel::cuda::bench::selfcheck(cases, oracle_cases),
        Command::GpuPrecompile { arch } => {
            let n = kernel::cuda::bench::precompile(&arch).map_err(Fatal::environment)?;
            crate::outln!(
                "compiled {n} kernel variants for {arch} into {:?}",
                kernel::cuda::compile::cache_dir()
            );
            Ok(exit::CLEAN)
        }
        Command::Worker { kernel, fault } => cmd_worker(&kernel, fault.as_deref()),
        Command::Report { dir } => crate::report::cli::cmd_report(&dir),
        Command::Merge { dirs, out } => crate::report::cli::cmd_merge(&dirs, &out),
        Command::Diff { base, cand, json } => crate::report::cli::cmd_diff(&base, &cand, json),
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
    kernel::exec::server::serve(name, fault)
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

/// One line summarizing a verdict for the terminal.
pub fn verdict_line(v: &Verdict) -> String {
    if let Some(why) = &v.skipped {
        return format!("skipped ({why})");
    }
    if v.is_clean() {
        return format!(
            "clean ({} rows, {} logits checked, max err/bound {:.3}, calc_diff {:.2e}, guard {})",
            v.metrics.rows_checked,
            v.metrics.checked,
            v.metrics.max_err_over_bound,
            v.metrics.calc_diff,
            if v.guard.redundant {
                "redundant"
            } else {
                "NEEDED"
            }
        );
    }
    let classes: Vec<String> = v.classes.iter().map(|(c, n)| format!("{c} x{n}")).collect();
    let mut s = format!("FINDING {}", classes.join(", "));
    if let Some(e) = v.examples.first() {
        s.push_str(&format!("; first {}", e.class));
        if let (Some(r), Some(t)) = (e.row, e.pos) {
            s.push_str(&format!(" at row {r} position {t}"));
        }
        if let Some(x) = e.expected {
            s.push_str(&format!(" expected {x:e}"));
        }
        if let Some(g) = &e.got {
            s.push_str(&format!(" got {g}"));
        }
        if let Some(d) = &e.detail {
            s.push_str(&format!(": {d}"));
        }
    }
    s
}

/// The kernels a file replays on without `--kernel`: those recorded in it (both of a
/// divergence), or the default kernel for a file that records none (hand-made cases).
fn recorded_kernels(file: &CaseFile) -> Option<Vec<String>> {
    let p = &file.provenance;
    if !p.kernels.is_empty() {
        Some(p.kernels.clone())
    } else if !p.kernel.is_empty() && p.kernel != "hand-made" {
        Some(vec![p.kernel.clone()])
    } else {
        None
    }
}

fn cmd_replay(
    files: &[PathBuf],
    kernel_names: &[String],
    topk: usize,
    json: bool,
) -> Result<i32, Fatal> {
    if topk == 0 {
        return Err(Fatal::usage(
            "--topk 0: k of the top-k check must be at least 1",
        ));
    }
    // Load everything first: bad input is reported before any work is done.
    let cases: Vec<(PathBuf, CaseFile)> = files
        .iter()
        .map(|f| load_case_file(f).map(|c| (f.clone(), c)))
        .collect::<Result<_, _>>()?;
    // Then open every kernel: a recorded kernel this machine cannot run is exit 3 naming
    // it, never a silent replay on another kernel (which would read as "fixed").
    let mut opened: std::collections::BTreeMap<String, Box<dyn kernel::Kernel>> =
        Default::default();
    let mut plan: Vec<Vec<String>> = Vec::new();
    for (path, file) in &cases {
        let names = if !kernel_names.is_empty() {
            kernel_names.to_vec()
        } else {
            recorded_kernels(file)
                .unwrap_or_else(|| vec![kernel::default_kernel_name().to_string()])
        };
        for name in &names {
            if opened.contains_key(name) {
                continue;
            }
            let k = match kernel::open(name) {
                Ok(k) => k,
                Err(e) if !kernel_names.is_empty() => return Err(e.into()),
                Err(kernel::OpenError::Unavailable { reason, .. }) => {
                    return Err(Fatal::environment(format!(
                        "{}: {name} is not available here: {reason}; pass --kernel to replay on another",
                        path.display()
                    )))
                }
                Err(e) => {
                    return Err(Fatal::usage(format!(
                        "{}: field provenance.kernel: {e}; pass --kernel to replay on another",
                        path.display()
                    )))
                }
            };
            opened.insert(name.clone(), k);
        }
        plan.push(names);
    }
    let cfg = OracleConfig {
        topk,
        ..Default::default()
    };
    let mut any_finding = false;
    let mut out = Vec::new();
    for ((path, file), names) in cases.iter().zip(&plan) {
        let kernels: Vec<&dyn kernel::Kernel> = names.iter().map(|n| opened[n].as_ref()).collect();
        let mut refs = ReferenceCache::new(&file.case);
        let mut got = Vec::new();
        let mut outputs = Vec::new();
        for (name, k) in names.iter().zip(&kernels) {
            let judged = harness::run_and_judge(*k, &file.case, &mut refs, &cfg);
            if let Some(e) = judged.environment_error {
                return Err(Fatal::environment(format!("{name}: {e}")));
            }
            let mut v = judged.verdict;
            outputs.push(judged.output);
            // A property finding's file: its property is checked again (runs the case
            // more times); its class joins the verdict.
            for p in crate::property::expected_properties(&file.expected.classes) {
                let pv = crate::property::replay(*k, &file.case, p, &cfg);
                for (c, n) in pv.classes.iter().filter(|(c, _)| **c == p.class()) {
                    v.classes.insert(*c, *n);
                }
                v.examples
                    .extend(pv.examples.into_iter().filter(|e| e.class == p.class()));
            }
            any_finding |= harness::has_findings(&v);
            for c in v.finding_classes() {
                if !got.contains(&c) {
                    got.push(c);
                }
            }
            if json {
                out.push(serde_json::json!({
                    "file": path,
                    "kernel": name,
                    "expected_classes": file.expected.classes,
                    "verdict": v,
                }));
            } else {
                crate::outln!("{}  {}  {}", path.display(), name, verdict_line(&v));
            }
        }
        if kernels.len() >= 2 {
            let divergence = outputs.first().and_then(Option::as_ref).and_then(|a| {
                kernels.iter().zip(&outputs).skip(1).find_map(|(kb, ob)| {
                    harness::divergence(&file.case, (kernels[0], a), (*kb, ob.as_ref()?))
                })
            });
            if divergence.is_some() {
                any_finding = true;
                got.push(crate::oracle::Class::Divergent);
            }
            if json {
                out.push(serde_json::json!({
                    "file": path,
                    "kernels": names,
                    "divergent": divergence,
                }));
            } else {
                crate::outln!(
                    "{}  {}  {}",
                    path.display(),
                    names.join(" vs "),
                    match &divergence {
                        Some(msg) => format!("FINDING divergent: {msg}"),
                        None => "agree (no element differs by more than both bounds)".into(),
                    }
                );
            }
        }
        let want = &file.expected.classes;
        got.sort();
        let mut want_sorted = want.clone();
        want_sorted.sort();
        if !json && kernel_names.is_empty() && want_sorted != got {
            crate::outln!(
                "  note: the file expected [{}], this replay found [{}]",
                want.iter().map(|c| c.name()).collect::<Vec<_>>().join(", "),
                got.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ")
            );
        }
    }
    if json {
        crate::outln!("{}", serde_json::to_string_pretty(&out).unwrap());
    }
    Ok(if any_finding {
        exit::FINDINGS
    } else {
        exit::CLEAN
    })
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
    /// Production profile: multiply the engine's context lengths by this (0 < F <= 1;
    /// requests at max_model_len stay there). Pools, strides, block ids, batch sizes and
    /// workspaces keep an engine's size. Default: 1 for kernels on an accelerator,
    /// 1/64 for CPU kernels.
    #[arg(long, value_parser = parse_scale, allow_hyphen_values = true)]
    pub scale: Option<f64>,
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
/// [`crate::report::shard_from_env`]: Slurm arrays not starting at 0 or with a step,
/// and an index without its count, are handled there).
pub fn shard_from_env() -> Result<Option<Shard>, Fatal> {
    crate::report::shard_from_env()
}

/// Values clap accepts but a campaign cannot use: exit 2 with one line before anything runs.
fn check_run_args(args: &RunArgs) -> Result<(), Fatal> {
    if args.jobs == Some(0) {
        return Err(Fatal::usage(
            "--jobs 0: at least one case must run at a time",
        ));
    }
    if args.topk == 0 {
        return Err(Fatal::usage(
            "--topk 0: k of the top-k check must be at least 1 (0 would turn the check off)",
        ));
    }
    if args.max_findings == Some(0) {
        return Err(Fatal::usage(
            "--max-findings 0: a campaign stops after at least 1 distinct finding",
        ));
    }
    Ok(())
}

/// A campaign that judged no case (a zero budget, `--cases 0` without a corpus, every
/// case skipped) must not read as a clean run to CI: exit 2 saying so.
fn nothing_judged(r: &crate::report::Report, dir: &std::path::Path) -> Option<String> {
    let judged: u64 = r.per_kernel.values().map(|k| k.cases).sum();
    if judged > 0 || !r.findings.is_empty() {
        return None;
    }
    let skipped: u64 = r.per_kernel.values().map(|k| k.skipped).sum();
    Some(if skipped > 0 {
        format!(
            "nothing was judged: the kernel skipped all {skipped} case(s) it was given (skip reasons in {})",
            dir.join("summary.md").display()
        )
    } else if r.interrupted {
        "nothing was judged: interrupted before the first case".into()
    } else {
        format!(
            "nothing was judged: {} case(s) generated and {} replayed from the corpus (raise --budget or --cases)",
            r.counts.cases_generated, r.counts.cases_replayed
        )
    })
}

fn cmd_run(args: RunArgs) -> Result<i32, Fatal> {
    check_run_args(&args)?;
    let kernels = if args.kernels.is_empty() {
        let k = kernel::default_kernel_name().to_string();
        eprintln!("mqa-fuzz: no --kernel given: fuzzing {k}, the best built-in kernel this machine can run");
        vec![k]
    } else {
        args.kernels.clone()
    };
    let seed = args.seed.unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        (t.as_nanos() as u64) ^ ((std::process::id() as u64) << 32)
    });
    let shard = match args.shard {
        Some(s) => Some(s),
        None => shard_from_env()?,
    };
    let report_dir = args.report.clone().unwrap_or_else(|| {
        let base = PathBuf::from("reports").join(crate::util::utc_stamp(crate::util::unix_now()));
        let mut p = base.clone();
        let mut i = 2;
        while p.exists() {
            p = PathBuf::from(format!("{}-{i}", base.display()));
            i += 1;
        }
        p
    });
    let mut cfg = campaign::Config::new(kernels, report_dir);
    cfg.profile = args.profile;
    cfg.budget = match (args.budget, args.cases) {
        (Some(b), _) => Some(b),
        (None, Some(_)) => None,
        (None, None) => Some(Duration::from_secs(60)),
    };
    cfg.max_cases = args.cases;
    cfg.seed = seed;
    cfg.jobs = args.jobs;
    let planted: Vec<&str> = cfg
        .kernels
        .iter()
        .filter(|k| kernel::is_planted_bug(k))
        .map(String::as_str)
        .collect();
    cfg.corpus_dir = match &args.corpus {
        Some(dir) => dir.clone(),
        None if !planted.is_empty() => {
            let dir = cfg.report_dir.join("corpus");
            eprintln!(
                "mqa-fuzz: note: {} is a planted bug: its findings go to {} (not corpus/); --corpus chooses another directory",
                planted.join(", "),
                dir.display()
            );
            dir
        }
        None => PathBuf::from("corpus"),
    };
    cfg.shard = shard;
    cfg.shrink = !args.no_shrink;
    cfg.shrink_budget = args.shrink_budget;
    cfg.replay_corpus = !args.no_replay;
    cfg.oracle.topk = args.topk;
    cfg.quiet = args.quiet;
    cfg.stop_after_findings = args.max_findings;
    cfg.verify = args.verify;
    cfg.scale = args.scale;
    cfg.properties = crate::property::PropertyConfig {
        repeat: args.repeat,
        batch: args.batch_invariance,
        require: args.require.clone().unwrap_or_default(),
    };
    cfg.properties.check().map_err(Fatal::usage)?;
    cfg.sanitize = crate::finding::sanitizer::SanitizeConfig {
        timeout: args.sanitize_timeout,
        ..args.sanitize.clone()
    };
    if let Some(spec) = &args.gpus {
        cfg.gpus = Some(kernel::cuda::select_gpus(spec)?);
    }
    cfg.command_line = std::env::args().collect::<Vec<_>>().join(" ");
    let shard_txt = shard
        .map(|s| format!(", shard {}/{}", s.index, s.count))
        .unwrap_or_default();
    eprintln!(
        "mqa-fuzz: campaign seed {seed:#x}, profile {}{shard_txt}, kernels {}; report in {}",
        args.profile.name(),
        cfg.kernels.join(", "),
        cfg.report_dir.display()
    );
    let out = campaign::run(&cfg)?;
    if let Some(why) = nothing_judged(&out.report, &cfg.report_dir) {
        return Err(Fatal::usage(why));
    }
    print_summary(&out.report, &cfg.report_dir);
    Ok(out.exit_code)
}

fn print_summary(r: &crate::report::Report, dir: &std::path::Path) {
    crate::outln!(
        "{} case(s) generated, {} replayed from the corpus, {:.1}s{}",
        r.counts.cases_generated,
        r.counts.cases_replayed,
        r.timings.wall_secs,
        if r.interrupted { " (interrupted)" } else { "" }
    );
    crate::outln!("{}", crate::report::headline(r));
    for l in crate::report::headline::throughput(r) {
        crate::outln!("{l}");
    }
    for l in crate::report::headline::launch_lines(r) {
        crate::outln!("{l}");
    }
    if !r.findings.is_empty() {
        crate::outln!("{}", crate::report::headline::bugs_line(r));
        crate::outln!("{}", crate::report::headline::guard_by_tier(r));
    }
    for f in &r.findings {
        crate::outln!(
            "FINDING {} [{}{}] tier {}, {} x{}: {}{}",
            f.kernel,
            f.class.map(|c| c.name()).unwrap_or("?"),
            f.reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default(),
            f.tier.name(),
            f.needs,
            f.occurrences,
            f.case_file.as_deref().unwrap_or("(not saved)"),
            if f.replay_command.is_empty() {
                String::new()
            } else {
                format!("\n  replay: {}", f.replay_command)
            }
        );
        if let Some(l) = &f.localisation {
            crate::outln!("  localised: {}", l.sentence());
        } else if let Some(why) = &f.localisation_skipped {
            crate::outln!("  not localised: {why}");
        }
    }
    crate::outln!("report: {}", dir.display());
}
