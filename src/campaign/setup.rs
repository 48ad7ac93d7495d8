//! Before the first case: the kernels opened, the corpus and report directories
//! checked writable, the scale and verification in force decided, the report's header.

use super::{interrupt, Config, Engine, CPU_PRODUCTION_SCALE, CPU_PRODUCTION_VERIFY};
use crate::error::Fatal;
use crate::generate::epoch::Epochs;
use crate::generate::Profile;
use crate::kernel::{self, CompileField, Kernel};
use crate::oracle::JudgeMode;
use crate::reference::verify::VerifyMode;
use crate::report::{self, KernelInfo, KernelStats, Report, REPORT_VERSION};
use std::path::Path;

pub(super) fn tool_version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}

fn environment(command_line: &str) -> report::Environment {
    report::Environment {
        hostname: std::fs::read_to_string("/etc/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
        cpus: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        gpus: Vec::new(),
        command_line: command_line.to_string(),
    }
}

/// Fails before the campaign starts when `dir` (the `what` directory: report, corpus)
/// cannot take a file (read only, full disk, not a directory), instead of after hours
/// of fuzzing.
fn check_writable(dir: &Path, what: &str) -> Result<(), Fatal> {
    let probe = dir.join(".mqa-fuzz-write-probe");
    crate::util::write_atomic(&probe, b"probe\n")
        .and_then(|()| std::fs::remove_file(&probe))
        .map_err(|e| {
            Fatal::usage(format!(
                "{}: {what} directory is not writable: {e}",
                dir.display()
            ))
        })
}

/// Fails before the campaign starts when the corpus directory cannot take the findings
/// (`--corpus` names a file, a path under a file, a read-only directory): a finding
/// that cannot be saved is a finding that cannot be reproduced.
fn check_corpus_dir(dir: &Path) -> Result<(), Fatal> {
    if dir.exists() && !dir.is_dir() {
        return Err(Fatal::usage(format!(
            "{}: corpus directory is not a directory (--corpus must name a directory)",
            dir.display()
        )));
    }
    std::fs::create_dir_all(dir).map_err(|e| {
        Fatal::usage(format!(
            "{}: cannot create corpus directory: {e}",
            dir.display()
        ))
    })?;
    check_writable(dir, "corpus")
}

/// Opens the kernels, checks the directories, loads the corpus to replay and decides
/// the scale and verification in force (said in one line for engine-sized profiles).
pub(super) fn start(
    cfg: &Config,
) -> Result<(Engine<'_>, Vec<(std::path::PathBuf, crate::case::CaseFile)>), Fatal> {
    if cfg.kernels.is_empty() {
        return Err(Fatal::usage("no kernel given"));
    }
    let kernels: Vec<Box<dyn Kernel>> = cfg
        .kernels
        .iter()
        .map(|k| match &cfg.gpus {
            Some(g) => kernel::cuda::open_on_gpus(k, g).unwrap_or_else(|| kernel::open(k)),
            None => kernel::open(k),
        })
        .collect::<Result<_, _>>()?;
    let (host_values, judge_line) = judge_sites(cfg, &kernels)?;
    if cfg.save_corpus {
        check_corpus_dir(&cfg.corpus_dir)?;
    }
    let corpus = if cfg.replay_corpus {
        super::corpus::load_all(&cfg.corpus_dir)?
    } else {
        Vec::new()
    };
    std::fs::create_dir_all(&cfg.report_dir).map_err(|e| {
        Fatal::usage(format!(
            "{}: cannot create report directory: {e}",
            cfg.report_dir.display()
        ))
    })?;
    check_writable(&cfg.report_dir, "report")?;
    interrupt::install();
    if !cfg.quiet {
        eprintln!("mqa-fuzz: judge: {judge_line}");
    }

    let full_size = kernels.iter().any(|k| k.on_accelerator());
    let scale = cfg
        .scale
        .unwrap_or(if full_size { 1.0 } else { CPU_PRODUCTION_SCALE });
    let engine_sized = matches!(cfg.profile, Profile::Production | Profile::All);
    let production_verify = cfg.verify.unwrap_or(if full_size {
        VerifyMode::Full
    } else {
        CPU_PRODUCTION_VERIFY
    });
    if engine_sized && !cfg.quiet {
        eprintln!(
            "mqa-fuzz: production cases at {} an engine's context lengths ({}), verified {production_verify}",
            super::scale_words(scale),
            if cfg.scale.is_some() {
                "--scale"
            } else if full_size {
                "a kernel on an accelerator"
            } else {
                "CPU kernels; --scale 1 for full size"
            }
        );
    }
    let epochs = shape_epochs(cfg, &kernels);
    let deployments = cfg
        .deployment_epoch
        .unwrap_or(super::DEFAULT_DEPLOYMENT_EPOCH);
    let deployments = (engine_sized && deployments > 1).then_some(deployments);
    if let (Some(n), false) = (deployments, cfg.quiet) {
        eprintln!(
            "mqa-fuzz: production cases in deployments of {n}: consecutive cases share a server's model, platform and KV pool (--deployment-epoch 1 turns this off)"
        );
    }
    let engine = Engine {
        cfg,
        kernels,
        profile: cfg.profile,
        scale,
        verify: cfg.verify.unwrap_or_default(),
        production_verify,
        epochs,
        deployments,
        host_values,
    };
    Ok((engine, corpus))
}

/// Where each kernel's cases are judged (`--judge`), in words for the campaign's judge
/// line; a kernel that cannot judge on its device under `--judge gpu` is a usage error.
/// Also whether the host needs every case's values (a kernel judged on the CPU: its
/// reference reads them all, so they are drawn with the case, on every core, and
/// counted as generation).
fn judge_sites(cfg: &Config, kernels: &[Box<dyn Kernel>]) -> Result<(bool, String), Fatal> {
    let mut words = Vec::new();
    let mut host_values = false;
    for k in kernels {
        let site = match (cfg.oracle.judge, k.device_judge()) {
            // A kernel that cannot judge on its device says why, whatever chose the CPU.
            (JudgeMode::Cpu, Err(why)) if cfg.judge_reason.is_some() => {
                format!("on the CPU ({why})")
            }
            (JudgeMode::Cpu, _) => format!(
                "on the CPU ({})",
                cfg.judge_reason.as_deref().unwrap_or("--judge cpu")
            ),
            (_, Ok(())) => {
                "on the GPU next to its output (exact GPU reference; the CPU re-checks both ends of every row and the edges of a few)".to_string()
            }
            (JudgeMode::Gpu, Err(why)) => {
                return Err(Fatal::usage(format!(
                    "--judge gpu: {why}; --judge auto judges it on the CPU"
                )))
            }
            (JudgeMode::Auto, Err(why)) => format!("on the CPU ({why})"),
        };
        host_values |= !site.starts_with("on the GPU");
        words.push(format!("{} {site}", k.name()));
    }
    Ok((host_values, words.join("; ")))
}

/// Shape epochs over the union of the kernels' compile keys: `--shape-epoch N`, by
/// default [`DEFAULT_SHAPE_EPOCH`] cases where any kernel declares a key (said in one
/// line), none otherwise.
fn shape_epochs(cfg: &Config, kernels: &[Box<dyn Kernel>]) -> Option<Epochs> {
    let fields: Vec<CompileField> = kernels
        .iter()
        .flat_map(|k| k.compile_key().iter().copied())
        .collect();
    let len = cfg.shape_epoch.unwrap_or(DEFAULT_SHAPE_EPOCH);
    let epochs = Epochs::new(len, fields)?;
    if !cfg.quiet {
        let names: Vec<&str> = epochs.fields.iter().map(|f| f.name()).collect();
        eprintln!(
            "mqa-fuzz: shape epochs of {len} cases: the kernels compile per {} (--shape-epoch 1 turns this off)",
            names.join(", ")
        );
    }
    Some(epochs)
}

/// Cases per shape epoch by default: long enough that a JIT compile of ~10 s is a
/// fraction of the epoch at tens of cases a second, short enough that a 3-minute
/// campaign still visits several keys.
pub const DEFAULT_SHAPE_EPOCH: u64 = 64;

/// The report before the first case: who, what, where, and an empty tally per kernel.
pub(super) fn new_report(engine: &Engine, started_unix: u64) -> Report {
    let cfg = engine.cfg;
    let mut report = Report {
        report_version: REPORT_VERSION,
        tool_version: tool_version(),
        run_id: cfg
            .report_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        started_unix,
        environment: environment(&cfg.command_line),
        kernels: engine
            .kernels
            .iter()
            .map(|k| KernelInfo {
                name: k.name().to_string(),
                version: k.version(),
                planted_bug: kernel::is_planted_bug(k.name()),
                capabilities: serde_json::to_value(k.capabilities()).unwrap_or_default(),
                worker: k.worker_report(),
            })
            .collect(),
        profile: cfg.profile.name().to_string(),
        seed: cfg.seed,
        shard: cfg.shard,
        budget_secs: cfg.budget.map(|d| d.as_secs_f64()),
        max_cases: cfg.max_cases,
        min_tokens: cfg.min_tokens,
        required: cfg
            .properties
            .require
            .iter()
            .map(|p| p.name().to_string())
            .collect(),
        coverage: super::coverage::expected(&engine.caps(), cfg.profile),
        ..Default::default()
    };
    for k in &engine.kernels {
        report
            .per_kernel
            .insert(k.name().to_string(), KernelStats::default());
    }
    report
}

/// Writes the report, `cases.jsonl` and `timings.jsonl` (each atomically).
pub(super) fn write_report(
    dir: &Path,
    report: &Report,
    cases_log: &str,
    timings: &str,
) -> Result<(), Fatal> {
    report::write_all(dir, report)
        .map_err(|e| Fatal::usage(format!("{}: cannot write the report: {e}", dir.display())))?;
    for (name, text) in [("cases.jsonl", cases_log), ("timings.jsonl", timings)] {
        crate::util::write_atomic(&dir.join(name), text.as_bytes())
            .map_err(|e| Fatal::usage(format!("{}: cannot write {name}: {e}", dir.display())))?;
    }
    Ok(())
}
