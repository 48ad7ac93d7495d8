//! The campaign engine behind `mqa-fuzz run`: replay the corpus, then generate cases
//! (proptest strategies driven by a `TestRunner` per case seed), run every kernel,
//! judge, shrink each new finding to a minimal case, save it to the corpus, and write
//! the report. Execution (worker threads) is separate from reporting (the main thread
//! consumes one stream of case results).

mod book;
pub mod corpus;
pub mod coverage;
pub mod interrupt;
mod progress;
mod shrink;

use crate::case::{Case, CaseFile, Provenance};
use crate::error::Fatal;
use crate::generate::strategy::draw_strategy_scaled;
use crate::generate::{Draw, Profile, Recipe};
use crate::harness::{self, ReferenceCache};
use crate::kernel::{self, Kernel};
use crate::oracle::{Class, OracleConfig, Verdict};
use crate::report::{self, KernelInfo, KernelStats, Report, Shard, Timings, REPORT_VERSION};
use proptest::strategy::{SBoxedStrategy, Strategy, ValueTree};
use proptest::test_runner::{Config as PtConfig, TestRunner};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Everything a campaign needs to know.
#[derive(Clone, Debug)]
pub struct Config {
    pub kernels: Vec<String>,
    pub profile: Profile,
    pub budget: Option<Duration>,
    pub max_cases: Option<u64>,
    pub seed: u64,
    /// Cases run at once (default: the kernels' preferred parallelism).
    pub jobs: Option<usize>,
    pub corpus_dir: PathBuf,
    pub report_dir: PathBuf,
    pub shard: Option<Shard>,
    pub shrink: bool,
    /// Longest time spent shrinking one finding.
    pub shrink_budget: Duration,
    pub replay_corpus: bool,
    pub save_corpus: bool,
    pub oracle: OracleConfig,
    pub quiet: bool,
    pub command_line: String,
    /// Stop generating once this many distinct findings were made (selftest).
    pub stop_after_findings: Option<usize>,
    /// GPUs for `cuda:` kernels (`--gpus`); `None`: all visible.
    pub gpus: Option<Vec<usize>>,
    /// How much of each generated case the reference checks (`None`: full, except
    /// production cases of CPU kernels: [`CPU_PRODUCTION_VERIFY`]).
    pub verify: Option<crate::reference::verify::VerifyMode>,
    /// The production profile's context-length scale (`None`: 1 for kernels on an
    /// accelerator, [`CPU_PRODUCTION_SCALE`] for CPU kernels).
    pub scale: Option<f64>,
    /// Determinism and batch-invariance checks, and which are required (`crate::property`).
    pub properties: crate::property::PropertyConfig,
    /// compute-sanitizer re-runs of shrunk crashes (`crate::finding::sanitizer`).
    pub sanitize: crate::finding::sanitizer::SanitizeConfig,
}

/// Production cases of CPU kernels have an engine's geometry (pool, strides, ids, batch,
/// workspace) with context lengths scaled by this, so that a 2-core machine judges a
/// few cases a second instead of one a minute.
pub const CPU_PRODUCTION_SCALE: f64 = 1.0 / 64.0;

/// Production cases of CPU kernels are verified on every boundary position and 5% of
/// the rows.
pub const CPU_PRODUCTION_VERIFY: crate::reference::verify::VerifyMode =
    crate::reference::verify::VerifyMode::Sample(0.05);

impl Config {
    pub fn new(kernels: Vec<String>, report_dir: PathBuf) -> Self {
        Config {
            kernels,
            profile: Profile::All,
            budget: Some(Duration::from_secs(60)),
            max_cases: None,
            seed: 0,
            jobs: None,
            corpus_dir: PathBuf::from("corpus"),
            report_dir,
            shard: None,
            shrink: true,
            shrink_budget: Duration::from_secs(30),
            replay_corpus: true,
            save_corpus: true,
            oracle: OracleConfig::default(),
            quiet: false,
            command_line: String::new(),
            stop_after_findings: None,
            gpus: None,
            verify: None,
            scale: None,
            properties: Default::default(),
            sanitize: Default::default(),
        }
    }
}

/// When a finding was first made (for `selftest`).
#[derive(Clone, Debug)]
pub struct Detection {
    pub signature: String,
    pub class: Class,
    /// Generated cases run before and including the detecting one.
    pub cases: u64,
    pub secs: f64,
}

pub struct Outcome {
    pub report: Report,
    pub detections: Vec<Detection>,
    /// Exit code: 0 clean, 1 findings.
    pub exit_code: i32,
}

/// The seed of case `k` of a campaign: every case is reproducible from it alone.
pub fn case_seed(seed: u64, k: u64) -> u64 {
    fn mix(mut z: u64) -> u64 {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    mix(seed ^ mix(k))
}

/// The proptest value tree of a case seed (generation and shrinking start here).
pub fn value_tree(strategy: &SBoxedStrategy<Draw>, seed: u64) -> Box<dyn ValueTree<Value = Draw>> {
    let mut runner =
        TestRunner::new_with_rng(PtConfig::default(), crate::generate::recipe::rng_for(seed));
    strategy
        .new_tree(&mut runner)
        .expect("strategies have no filters, so generation cannot be rejected")
}

/// One generated case, run on every kernel.
struct CaseResult {
    k: u64,
    seed: u64,
    recipe: Recipe,
    case: Case,
    verdicts: Vec<Verdict>,
    adjustments: Vec<String>,
    /// The first kernel that disagrees with the first one (its index), and where.
    divergence: Option<(usize, String)>,
    environment_error: Option<String>,
    generate_secs: f64,
    reference_secs: f64,
    judge_secs: f64,
    /// Per kernel: the run's wall time and the part of it spent on the output buffer.
    run_wall_secs: Vec<(f64, f64)>,
    /// Per kernel: the property checks of the case (`crate::property::check_case`).
    properties: Vec<Vec<crate::property::PropertyOutcome>>,
}

struct Engine<'a> {
    cfg: &'a Config,
    kernels: Vec<Box<dyn Kernel>>,
    profile: Profile,
    /// The production profile's context-length scale in force.
    scale: f64,
    /// How the other profiles' cases are verified.
    verify: crate::reference::verify::VerifyMode,
    /// How production (engine-model) cases are verified.
    production_verify: crate::reference::verify::VerifyMode,
}

impl Engine<'_> {
    /// How a case of `recipe` is verified.
    fn verify_for(&self, recipe: &Recipe) -> crate::reference::verify::VerifyMode {
        if matches!(recipe.offsets, crate::generate::OffsetClass::Pool(_)) {
            self.production_verify
        } else {
            self.verify
        }
    }

    /// The strategy of case `k`.
    fn strategy(&self, k: u64) -> SBoxedStrategy<Draw> {
        draw_strategy_scaled(self.profile, k, self.scale)
    }

    fn caps(&self) -> Vec<&kernel::Capabilities> {
        self.kernels.iter().map(|k| k.capabilities()).collect()
    }

    /// Draw → recipe (fitted to the kernels) → case.
    fn materialize(&self, draw: &Draw) -> (Recipe, Case, Vec<String>) {
        let (recipe, adjust) = draw.resolve(&self.caps());
        let case = recipe.materialize();
        (recipe, case, adjust)
    }

    fn run_case(&self, k: u64, seed: u64) -> CaseResult {
        let t0 = Instant::now();
        let draw = value_tree(&self.strategy(k), seed).current();
        let (recipe, case, adjustments) = self.materialize(&draw);
        let generate_secs = t0.elapsed().as_secs_f64();
        if let Err(e) = case.validate() {
            // A generator bug: report it loudly as an environment problem of ours.
            return CaseResult {
                k,
                seed,
                recipe,
                case,
                verdicts: Vec::new(),
                adjustments,
                divergence: None,
                environment_error: Some(format!(
                    "internal error: generated case {seed:#x} is invalid: {e}"
                )),
                generate_secs,
                reference_secs: 0.0,
                judge_secs: 0.0,
                run_wall_secs: Vec::new(),
                properties: Vec::new(),
            };
        }
        let mut refs =
            ReferenceCache::with_selection(&case, self.verify_for(&recipe).selection(&case, seed));
        let mut verdicts = Vec::new();
        let mut outputs = Vec::new();
        let mut run_wall_secs = Vec::new();
        let mut judge_secs = 0.0;
        let mut environment_error = None;
        let mut properties = Vec::new();
        for kern in &self.kernels {
            let j = harness::run_and_judge(kern.as_ref(), &case, &mut refs, &self.cfg.oracle);
            let plan = self
                .cfg
                .properties
                .plan(kern.on_accelerator(), self.profile);
            properties.push(crate::property::check_case(
                kern.as_ref(),
                &case,
                &j.verdict,
                j.output.as_ref(),
                plan,
            ));
            run_wall_secs.push((j.wall.as_secs_f64(), j.setup.as_secs_f64()));
            judge_secs += j.judge.as_secs_f64();
            environment_error = environment_error.or(j.environment_error);
            verdicts.push(j.verdict);
            outputs.push(j.output);
        }
        let divergence = first_divergence(&self.kernels, &case, &outputs);
        let reference_secs = refs.time.as_secs_f64();
        drop(refs);
        CaseResult {
            k,
            seed,
            recipe,
            case,
            verdicts,
            adjustments,
            divergence,
            environment_error,
            generate_secs,
            reference_secs,
            judge_secs,
            run_wall_secs,
            properties,
        }
    }
}

/// The first kernel (index into `kernels`) whose output disagrees with the first
/// kernel's beyond both error bounds, and where (see [`harness::divergence`]). Kernels
/// without an output (skipped, crashed) are not compared.
pub fn first_divergence(
    kernels: &[Box<dyn Kernel>],
    case: &Case,
    outputs: &[Option<kernel::OutputBuffer>],
) -> Option<(usize, String)> {
    let a = outputs.first()?.as_ref()?;
    kernels
        .iter()
        .zip(outputs)
        .enumerate()
        .skip(1)
        .find_map(|(i, (kb, ob))| {
            let b = ob.as_ref()?;
            harness::divergence(case, (kernels[0].as_ref(), a), (kb.as_ref(), b)).map(|m| (i, m))
        })
}

/// The verdict of a divergence: one case-level `divergent` finding saying where.
pub fn divergent_verdict(msg: &str) -> Verdict {
    let mut v = Verdict::default();
    v.add_case_finding(Class::Divergent, msg.to_string());
    v
}

/// Runs `a` and `b` on `case`; where they disagree, if they do.
fn diverges(cfg: &OracleConfig, a: &dyn Kernel, b: &dyn Kernel, case: &Case) -> Option<String> {
    let mut refs = ReferenceCache::new(case);
    let oa = harness::run_and_judge(a, case, &mut refs, cfg).output?;
    let ob = harness::run_and_judge(b, case, &mut refs, cfg).output?;
    harness::divergence(case, (a, &oa), (b, &ob))
}

/// The name a divergent finding is filed under: `A vs B`.
pub fn pair_name(a: &str, b: &str) -> String {
    format!("{a} vs {b}")
}

fn tool_version() -> String {
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

/// Folds one verdict into the kernel's statistics; returns the kernel time it counted
/// (the kernel's own clock where it reports one, else the run's wall time).
fn add_verdict(
    stats: &mut KernelStats,
    v: &Verdict,
    (run_wall_secs, setup_secs): (f64, f64),
    case: &crate::case::Case,
) -> f64 {
    let kernel_secs = v.run.kernel_time.map_or(run_wall_secs, |d| d.as_secs_f64());
    if v.skipped.is_some() {
        stats.skipped += 1;
        return kernel_secs;
    }
    if let Some(t) = v.run.kernel_time {
        stats
            .kernel_time_by_shape
            .entry(crate::report::shape_class(case))
            .or_default()
            .record(t.as_secs_f64());
    }
    stats.cases += 1;
    if v.is_clean() {
        stats.clean += 1;
    } else {
        stats.with_findings += 1;
    }
    for (c, n) in &v.classes {
        *stats.class_totals.entry(*c).or_default() += n;
    }
    stats.run_wall_secs += run_wall_secs;
    stats.output_setup_secs += setup_secs;
    stats.rows_checked += v.metrics.rows_checked;
    stats.logits_checked += v.metrics.checked;
    // A crashed case has no output for the guard to act on: not counted either way.
    if v.classes.contains_key(&Class::Crash) {
        stats.kernel_secs += kernel_secs;
        return kernel_secs;
    }
    let g = &mut stats.guard;
    g.cases += 1;
    g.redundant_cases += v.guard.redundant as u64;
    g.rows_affected += v.guard.rows_affected;
    g.nan += v.guard.nan;
    g.pos_inf += v.guard.pos_inf;
    g.neg_inf += v.guard.neg_inf;
    stats.kernel_secs += kernel_secs;
    stats.max_err_over_bound = stats.max_err_over_bound.max(v.metrics.max_err_over_bound);
    kernel_secs
}

fn quote(s: &str) -> String {
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_:./=".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// `mqa-fuzz replay FILE --kernel A [--kernel B]`: one kernel for a finding of that
/// kernel, both for a divergence (replay compares them again).
pub fn replay_command(file: &Path, kernels: &[&str]) -> String {
    let mut s = format!("mqa-fuzz replay {}", quote(&file.display().to_string()));
    for k in kernels {
        s.push_str(" --kernel ");
        s.push_str(&quote(k));
    }
    s
}

/// `1/256 of` or `the full size of` (for the campaign's first lines).
pub fn scale_words(scale: f64) -> String {
    if scale >= 1.0 {
        "the full size of".into()
    } else if (1.0 / scale).fract().abs() < 1e-9 {
        format!("1/{} of", (1.0 / scale).round())
    } else {
        format!("{scale} ×")
    }
}

/// Runs a campaign.
pub fn run(cfg: &Config) -> Result<Outcome, Fatal> {
    let started = Instant::now();
    let started_unix = crate::util::unix_now();
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
    if cfg.save_corpus {
        check_corpus_dir(&cfg.corpus_dir)?;
    }
    let corpus = if cfg.replay_corpus {
        corpus::load_all(&cfg.corpus_dir)?
    } else {
        Vec::new()
    };
    std::fs::create_dir_all(&cfg.report_dir).map_err(|e| {
        Fatal::usage(format!(
            "{}: cannot create report directory: {e}",
            cfg.report_dir.display()
        ))
    })?;
    check_writable(&cfg.report_dir)?;
    interrupt::install();

    let full_size = kernels.iter().any(|k| k.on_accelerator());
    let scale = cfg
        .scale
        .unwrap_or(if full_size { 1.0 } else { CPU_PRODUCTION_SCALE });
    let engine_sized = matches!(cfg.profile, Profile::Production | Profile::All);
    let production_verify = cfg.verify.unwrap_or(if full_size {
        crate::reference::verify::VerifyMode::Full
    } else {
        CPU_PRODUCTION_VERIFY
    });
    if engine_sized && !cfg.quiet {
        eprintln!(
            "mqa-fuzz: production cases at {} an engine's context lengths ({}), verified {production_verify}",
            scale_words(scale),
            if cfg.scale.is_some() {
                "--scale"
            } else if full_size {
                "a kernel on an accelerator"
            } else {
                "CPU kernels; --scale 1 for full size"
            }
        );
    }
    let engine = Engine {
        cfg,
        kernels,
        profile: cfg.profile,
        scale,
        verify: cfg.verify.unwrap_or_default(),
        production_verify,
    };
    let caps = engine.caps();
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
            })
            .collect(),
        profile: cfg.profile.name().to_string(),
        seed: cfg.seed,
        shard: cfg.shard,
        budget_secs: cfg.budget.map(|d| d.as_secs_f64()),
        max_cases: cfg.max_cases,
        required: cfg
            .properties
            .require
            .iter()
            .map(|p| p.name().to_string())
            .collect(),
        coverage: coverage::expected(&caps, cfg.profile),
        ..Default::default()
    };
    for k in &engine.kernels {
        report
            .per_kernel
            .insert(k.name().to_string(), KernelStats::default());
    }
    let mut progress = progress::Progress::new(cfg.quiet, cfg.budget, cfg.max_cases);
    let mut timings = Timings::default();
    let mut book = book::Book::default();
    let mut any_finding = false;
    let mut env_error: Option<String> = None;

    // 1. Replay the corpus. Shards split it as they split the seeds (file j replays on
    // shard j mod N), so a merge of every shard has replayed each file exactly once.
    let (shard_index, shard_count) = cfg
        .shard
        .map(|s| (s.index as usize, s.count as usize))
        .unwrap_or((0, 1));
    for (path, file) in corpus
        .iter()
        .enumerate()
        .filter(|(j, _)| j % shard_count == shard_index)
        .map(|(_, c)| c)
    {
        if interrupt::requested() {
            break;
        }
        report.counts.cases_replayed += 1;
        let mut refs = ReferenceCache::new(&file.case);
        let mut outputs = Vec::new();
        for kern in &engine.kernels {
            let j = harness::run_and_judge(kern.as_ref(), &file.case, &mut refs, &cfg.oracle);
            if let Some(e) = j.environment_error {
                env_error = Some(e);
                break;
            }
            outputs.push(j.output);
            let v = j.verdict;
            timings.oracle_secs += j.judge.as_secs_f64();
            add_verdict(
                report.per_kernel.get_mut(kern.name()).unwrap(),
                &v,
                (j.wall.as_secs_f64(), j.setup.as_secs_f64()),
                &file.case,
            );
            if v.primary_class().is_some() {
                any_finding = true;
                progress.println(&format!(
                    "corpus {}: {} {}",
                    path.display(),
                    kern.name(),
                    crate::cli::verdict_line(&v)
                ));
                let mut ctx = book::Ctx {
                    engine: &engine,
                    progress: &mut progress,
                    timings: &mut timings,
                    generated: 0,
                    started,
                    deadline: None,
                };
                book.replayed(
                    &mut ctx,
                    book::Subject::Kernel(kern.as_ref()),
                    path,
                    file,
                    v,
                );
            }
            // A saved property finding is checked again where its property is required.
            let required = crate::property::expected_properties(&file.expected.classes);
            for p in required.into_iter().filter(|p| cfg.properties.requires(*p)) {
                let v = crate::property::replay(kern.as_ref(), &file.case, p, &cfg.oracle);
                if v.classes.contains_key(&p.class()) {
                    any_finding = true;
                    let mut ctx = book::Ctx {
                        engine: &engine,
                        progress: &mut progress,
                        timings: &mut timings,
                        generated: 0,
                        started,
                        deadline: None,
                    };
                    book.replayed(
                        &mut ctx,
                        book::Subject::Property(kern.as_ref(), p),
                        path,
                        file,
                        v,
                    );
                }
            }
        }
        if env_error.is_none() {
            if let Some((bi, msg)) = first_divergence(&engine.kernels, &file.case, &outputs) {
                any_finding = true;
                let (a, b) = (engine.kernels[0].as_ref(), engine.kernels[bi].as_ref());
                progress.println(&format!(
                    "corpus {}: {} divergent: {msg}",
                    path.display(),
                    pair_name(a.name(), b.name())
                ));
                let mut ctx = book::Ctx {
                    engine: &engine,
                    progress: &mut progress,
                    timings: &mut timings,
                    generated: 0,
                    started,
                    deadline: None,
                };
                book.replayed(
                    &mut ctx,
                    book::Subject::Pair(a, b),
                    path,
                    file,
                    divergent_verdict(&msg),
                );
            }
        }
        timings.reference_secs += refs.time.as_secs_f64();
    }

    // 2. Generate.
    let jobs = cfg
        .jobs
        .unwrap_or_else(|| {
            engine
                .kernels
                .iter()
                .map(|k| k.preferred_jobs())
                .min()
                .unwrap_or(1)
        })
        .max(1);
    let (shard_index, shard_count) = (shard_index as u64, shard_count as u64);
    let next_k = AtomicU64::new(0);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let started_cases = AtomicU64::new(0);
    let deadline = cfg.budget.map(|b| started + b);
    let mut cases_log = Vec::new();
    let mut generated = 0u64;
    if env_error.is_none() {
        std::thread::scope(|scope| {
            let (tx, rx) = mpsc::channel::<CaseResult>();
            for _ in 0..jobs {
                let tx = tx.clone();
                let engine = &engine;
                let next_k = &next_k;
                let started_cases = &started_cases;
                let stop = &stop;
                scope.spawn(move || loop {
                    if interrupt::requested()
                        || stop.load(Ordering::SeqCst)
                        || deadline.is_some_and(|d| Instant::now() >= d)
                    {
                        break;
                    }
                    if let Some(m) = cfg.max_cases {
                        if started_cases.fetch_add(1, Ordering::SeqCst) >= m {
                            break;
                        }
                    }
                    let i = next_k.fetch_add(1, Ordering::SeqCst);
                    let k = i * shard_count + shard_index;
                    let r = engine.run_case(k, case_seed(cfg.seed, k));
                    let stop = r.environment_error.is_some();
                    if tx.send(r).is_err() || stop {
                        break;
                    }
                });
            }
            drop(tx);
            for r in rx {
                if stop.load(Ordering::SeqCst) {
                    continue; // enough findings: drain what the workers had in hand
                }
                if let Some(e) = &r.environment_error {
                    env_error.get_or_insert(e.clone());
                    interrupt::request();
                    continue;
                }
                generated += 1;
                timings.generate_secs += r.generate_secs;
                timings.reference_secs += r.reference_secs;
                timings.oracle_secs += r.judge_secs;
                coverage::record(&mut report.coverage, &r.recipe, &r.case);
                for a in &r.adjustments {
                    *report
                        .counts
                        .skip_reasons
                        .entry(format!("adjusted: {a}"))
                        .or_default() += 1;
                }
                let mut line = serde_json::json!({"k": r.k, "seed": format!("{:#018x}", r.seed), "recipe": short_recipe(&r.recipe)});
                let mut kinds = Vec::new();
                for (ki, ((kern, v), wall)) in engine
                    .kernels
                    .iter()
                    .zip(&r.verdicts)
                    .zip(&r.run_wall_secs)
                    .enumerate()
                {
                    let stats = report.per_kernel.get_mut(kern.name()).unwrap();
                    timings.kernel_secs += add_verdict(stats, v, *wall, &r.case);
                    let plan = cfg.properties.plan(kern.on_accelerator(), engine.profile);
                    stats.properties.record(plan, &r.properties[ki]);
                    if let crate::generate::OffsetClass::Pool(pool) = &r.recipe.offsets {
                        if v.skipped.is_none() && !v.classes.contains_key(&Class::Crash) {
                            stats.population.record(&r.case, pool, engine.scale);
                        }
                    }
                    if let Some(why) = &v.skipped {
                        report.counts.cases_skipped += 1;
                        *report
                            .counts
                            .skip_reasons
                            .entry(format!("{}: {why}", kern.name()))
                            .or_default() += 1;
                    }
                    kinds.push(
                        serde_json::json!({"kernel": kern.name(), "classes": v.finding_classes()}),
                    );
                }
                line["verdicts"] = serde_json::Value::Array(kinds);
                cases_log.push(line);
                // Findings of this case, one per kernel (plus a divergence): the book
                // decides which bug each one is.
                let mut ctx = book::Ctx {
                    engine: &engine,
                    progress: &mut progress,
                    timings: &mut timings,
                    generated,
                    started,
                    deadline,
                };
                for (ki, v) in r.verdicts.iter().enumerate() {
                    if v.primary_class().is_none() {
                        continue;
                    }
                    any_finding = true;
                    book.file(
                        &mut ctx,
                        book::Subject::Kernel(engine.kernels[ki].as_ref()),
                        book::Failure {
                            recipe: r.recipe.clone(),
                            case: r.case.clone(),
                            verdict: v.clone(),
                            origin: Some((r.k, r.seed)),
                            parent: None,
                        },
                    );
                }
                // Property violations are findings only where required (`--require`).
                for (ki, outcomes) in r.properties.iter().enumerate() {
                    for (p, verdict) in
                        crate::property::required_failures(outcomes, &cfg.properties)
                    {
                        any_finding = true;
                        let subject = book::Subject::Property(engine.kernels[ki].as_ref(), p);
                        let (recipe, case, origin) =
                            (r.recipe.clone(), r.case.clone(), Some((r.k, r.seed)));
                        book.file(
                            &mut ctx,
                            subject,
                            book::Failure {
                                recipe,
                                case,
                                verdict,
                                origin,
                                parent: None,
                            },
                        );
                    }
                }
                if let Some((bi, msg)) = &r.divergence {
                    any_finding = true;
                    let (ka, kb) = (engine.kernels[0].as_ref(), engine.kernels[*bi].as_ref());
                    book.file(
                        &mut ctx,
                        book::Subject::Pair(ka, kb),
                        book::Failure {
                            recipe: r.recipe.clone(),
                            case: r.case.clone(),
                            verdict: divergent_verdict(msg),
                            origin: Some((r.k, r.seed)),
                            parent: None,
                        },
                    );
                }
                progress.update(generated, book.distinct(), "");
                if cfg
                    .stop_after_findings
                    .is_some_and(|n| book.distinct() >= n)
                {
                    stop.store(true, Ordering::SeqCst);
                }
            }
        });
    }
    progress.finish();
    report.counts.cases_generated = generated;
    let detections = std::mem::take(&mut book.detections);
    report.findings = book.into_findings();
    report.interrupted = interrupt::requested() && env_error.is_none();
    report.finished_unix = crate::util::unix_now();
    timings.wall_secs = started.elapsed().as_secs_f64();
    report.timings = timings;
    for note in report::picture::fill_pictures(&mut report, &cfg.oracle) {
        progress.println(&note);
    }
    report::write_all(&cfg.report_dir, &report).map_err(|e| {
        Fatal::usage(format!(
            "{}: cannot write the report: {e}",
            cfg.report_dir.display()
        ))
    })?;
    let log: String = cases_log.iter().map(|l| format!("{l}\n")).collect();
    crate::util::write_atomic(&cfg.report_dir.join("cases.jsonl"), log.as_bytes()).map_err(
        |e| {
            Fatal::usage(format!(
                "{}: cannot write cases.jsonl: {e}",
                cfg.report_dir.display()
            ))
        },
    )?;
    if let Some(e) = env_error {
        return Err(Fatal::environment(e));
    }
    Ok(Outcome {
        report,
        detections,
        exit_code: if any_finding { 1 } else { 0 },
    })
}

/// Fails before the campaign starts when the report directory cannot take a file (read
/// only, full disk, not a directory), instead of after hours of fuzzing.
fn check_writable(dir: &Path) -> Result<(), Fatal> {
    let probe = dir.join(".mqa-fuzz-write-probe");
    crate::util::write_atomic(&probe, b"probe\n")
        .and_then(|()| std::fs::remove_file(&probe))
        .map_err(|e| {
            Fatal::usage(format!(
                "{}: report directory is not writable: {e}",
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
    let probe = dir.join(".mqa-fuzz-write-probe");
    crate::util::write_atomic(&probe, b"probe\n")
        .and_then(|()| std::fs::remove_file(&probe))
        .map_err(|e| {
            Fatal::usage(format!(
                "{}: corpus directory is not writable: {e}",
                dir.display()
            ))
        })
}

/// Where a finding goes when the corpus directory refuses it mid-campaign: inside the
/// report directory (checked writable before the campaign), so the case is never lost.
pub const FALLBACK_DIR: &str = "findings";

/// The recipe without its bulky parts, for `cases.jsonl`.
fn short_recipe(r: &Recipe) -> serde_json::Value {
    serde_json::to_value(r).unwrap_or_default()
}

/// What a saved finding records besides the case itself.
struct SaveRequest<'a> {
    /// The kernel of the finding, or the two kernels of a divergence.
    kernels: &'a [&'a str],
    class: Class,
    sig: &'a str,
    seed: u64,
    k: u64,
    shrunk: &'a shrink::Shrunk,
}

/// Saves a finding into the corpus; when that fails, says why and saves it into the
/// report directory instead ([`FALLBACK_DIR`]). `None` only when both fail (said too).
fn save_finding(
    cfg: &Config,
    req: &SaveRequest,
    progress: &mut progress::Progress,
) -> Option<PathBuf> {
    if !cfg.save_corpus {
        return None;
    }
    let name = req.kernels.join(" vs ");
    let path = corpus::path_for(&cfg.corpus_dir, &name, req.class, req.sig);
    if path.is_file() {
        return Some(path);
    }
    let s = req.shrunk;
    let file = CaseFile {
        provenance: Provenance {
            tool_version: tool_version(),
            kernel: req.kernels.first().copied().unwrap_or_default().to_string(),
            kernels: if req.kernels.len() > 1 {
                req.kernels.iter().map(|k| k.to_string()).collect()
            } else {
                Vec::new()
            },
            profile: Some(cfg.profile.name().to_string()),
            seed: Some(req.seed),
            shrunk: s.shrunk,
            signature: Some(req.sig.to_string()),
            created_unix: Some(crate::util::unix_now()),
            note: Some(format!(
                "found by campaign seed {} at case {}; {} shrink steps",
                cfg.seed, req.k, s.steps
            )),
            recipe: serde_json::to_value(&s.recipe).ok(),
        },
        expected: crate::case::Expected {
            classes: s.verdict.finding_classes(),
        },
        case: s.case.clone(),
    };
    let e = match corpus::save(&path, &file) {
        Ok(()) => return Some(path),
        Err(e) => e,
    };
    let fallback = cfg
        .report_dir
        .join(FALLBACK_DIR)
        .join(path.file_name().unwrap_or_default());
    match corpus::save(&fallback, &file) {
        Ok(()) => {
            progress.warn(&format!(
                "mqa-fuzz: warning: cannot save the finding to {}: {e}; saved it to {} instead",
                path.display(),
                fallback.display()
            ));
            Some(fallback)
        }
        Err(e2) => {
            progress.warn(&format!(
                "mqa-fuzz: warning: cannot save the finding to {}: {e}, nor to {}: {e2}; only its verdict is in the report",
                path.display(),
                fallback.display()
            ));
            None
        }
    }
}
