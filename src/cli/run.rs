//! `mqa-fuzz run`: the arguments checked and turned into a campaign configuration, the
//! campaign run, its summary printed.

use super::{shard_from_env, RunArgs};
use crate::campaign;
use crate::error::Fatal;
use crate::kernel;
use std::path::PathBuf;
use std::time::Duration;

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

pub(super) fn cmd_run(args: RunArgs) -> Result<i32, Fatal> {
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
    cfg.shrink_share = super::parse_share(&args.shrink_share).map_err(Fatal::usage)?;
    cfg.replay_corpus = !args.no_replay;
    cfg.oracle.topk = args.topk;
    cfg.quiet = args.quiet;
    cfg.stop_after_findings = args.max_findings;
    cfg.verify = args.verify;
    cfg.oracle.judge = args.judge;
    if cfg.kernels.len() > 1 {
        // Two kernels' outputs are compared element by element (`divergent`) on the host.
        const WHY: &str =
            "two or more kernels: their outputs are compared element by element on the host";
        match args.judge {
            crate::oracle::JudgeMode::Gpu => {
                return Err(Fatal::usage(format!(
                    "--judge gpu: {WHY}; give one kernel, or --judge auto"
                )))
            }
            crate::oracle::JudgeMode::Auto => {
                cfg.oracle.judge = crate::oracle::JudgeMode::Cpu;
                cfg.judge_reason = Some(WHY.into());
            }
            crate::oracle::JudgeMode::Cpu => {}
        }
    }
    cfg.scale = args.scale;
    cfg.shape_epoch = args.shape_epoch;
    cfg.deployment_epoch = args.deployment_epoch;
    cfg.known_crash_share = args.known_crashes;
    cfg.min_tokens = args.min_tokens;
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
        "{} case(s) generated, {} replayed from the corpus, {:.1}s{}{}",
        r.counts.cases_generated,
        r.counts.cases_replayed,
        r.timings.wall_secs,
        match r.counts.cases_left_at_deadline {
            0 => String::new(),
            n => format!(" ({n} more drawn but not run: expected to end past the budget)"),
        },
        if r.interrupted { " (interrupted)" } else { "" }
    );
    crate::outln!("{}", crate::report::headline(r));
    for l in crate::report::headline::not_run_lines(r) {
        crate::outln!("{l}");
    }
    for l in crate::report::headline::throughput(r) {
        crate::outln!("{l}");
    }
    for l in crate::report::launches::launch_lines(r) {
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
        if let Some(c) = f.shrink_cut_short {
            crate::outln!("  shrinking cut short: {}", c.words());
        }
        if let Some(l) = &f.localisation {
            crate::outln!("  localised: {}", l.sentence());
        } else if let Some(why) = &f.localisation_skipped {
            crate::outln!("  not localised: {why}");
        }
    }
    crate::outln!("report: {}", dir.display());
}
