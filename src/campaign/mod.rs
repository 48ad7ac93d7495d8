//! The campaign behind `mqa-fuzz run`: replay the corpus, then generate cases
//! (proptest strategies driven by a `TestRunner` per case seed), run every kernel,
//! judge, shrink each new finding to a minimal case, save it to the corpus, and write
//! the report.
//!
//! Execution is apart from reporting: worker threads draw cases and run them
//! ([`Engine::draw_case`], [`Engine::judge_drawn`]), and do not start one they expect to
//! end past the budget; the
//! main thread turns each result into an [`event::Event`] consumed by the tally, the
//! cases log, the finding book (where a finding gets its identity: [`book`]) and the
//! progress line.

mod allowance;
mod book;
pub mod corpus;
pub mod coverage;
mod engine;
mod event;
pub use crate::interrupt;
mod known_crash;
pub use known_crash::DEFAULT_SHARE as DEFAULT_KNOWN_CRASH_SHARE;
mod progress;
mod save;
mod setup;
mod shrink;
mod subject;

pub use allowance::FLOOR as SHRINK_FLOOR;
pub use engine::{divergent_verdict, first_divergence, pair_name};
pub use save::{replay_command, FALLBACK_DIR};

use crate::case::CaseFile;
use crate::error::Fatal;
use crate::generate::Draw;
use crate::oracle::{Class, OracleConfig};
use crate::report::Report;
use crate::shard::Shard;
use engine::Engine;
use event::{CasesLog, Event, Source, Tally};
use proptest::strategy::{SBoxedStrategy, Strategy, ValueTree};
use proptest::test_runner::{Config as PtConfig, TestRunner};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Everything a campaign needs to know.
#[derive(Clone, Debug)]
pub struct Config {
    pub kernels: Vec<String>,
    pub profile: crate::generate::Profile,
    pub budget: Option<Duration>,
    pub max_cases: Option<u64>,
    /// `--min-tokens`: generated cases with fewer KV tokens are counted, not run.
    pub min_tokens: Option<u64>,
    pub seed: u64,
    /// Cases run at once (default: the kernels' preferred parallelism).
    pub jobs: Option<usize>,
    pub corpus_dir: PathBuf,
    pub report_dir: PathBuf,
    pub shard: Option<Shard>,
    pub shrink: bool,
    /// Longest time spent shrinking one finding.
    pub shrink_budget: Duration,
    /// The share of `budget` all shrinking may use together, in (0, 1]
    /// ([`allowance`]).
    pub shrink_share: f64,
    pub replay_corpus: bool,
    pub save_corpus: bool,
    pub oracle: OracleConfig,
    /// Why `oracle.judge` is `cpu` when the user did not ask for it (said in the
    /// campaign's judge line).
    pub judge_reason: Option<String>,
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
    /// Cases per shape epoch (`--shape-epoch`; `None`: the default where a kernel
    /// declares a compile key; 0 or 1: off).
    pub shape_epoch: Option<u64>,
    /// Consecutive production cases per deployment (`--deployment-epoch`; `None`:
    /// [`DEFAULT_DEPLOYMENT_EPOCH`]; 0 or 1: off).
    pub deployment_epoch: Option<u64>,
    /// The share of generated cases predicted to hit a known crash that still run
    /// (`--known-crashes`, in (0, 1]; [`known_crash`]).
    pub known_crash_share: f64,
}

/// Production cases per deployment by default: a GPU worker maps and poisons a pool
/// once for this many cases (a third of a production case's device time when it is
/// done per case), and a one-minute campaign on a CPU still visits a few servers.
pub const DEFAULT_DEPLOYMENT_EPOCH: u64 = 16;

/// `--shrink-share`'s default: shrinking may use 30% of the wall budget.
pub const DEFAULT_SHRINK_SHARE: f64 = 0.30;

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
            profile: crate::generate::Profile::All,
            budget: Some(Duration::from_secs(60)),
            max_cases: None,
            min_tokens: None,
            seed: 0,
            jobs: None,
            corpus_dir: PathBuf::from("corpus"),
            report_dir,
            shard: None,
            shrink: true,
            shrink_budget: Duration::from_secs(30),
            shrink_share: DEFAULT_SHRINK_SHARE,
            replay_corpus: true,
            save_corpus: true,
            oracle: OracleConfig::default(),
            judge_reason: None,
            quiet: false,
            command_line: String::new(),
            stop_after_findings: None,
            gpus: None,
            verify: None,
            scale: None,
            properties: Default::default(),
            sanitize: Default::default(),
            shape_epoch: None,
            deployment_epoch: None,
            known_crash_share: DEFAULT_KNOWN_CRASH_SHARE,
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
    use crate::util::splitmix64;
    splitmix64(seed ^ splitmix64(k))
}

/// The proptest value tree of a case seed (generation and shrinking start here).
pub fn value_tree(strategy: &SBoxedStrategy<Draw>, seed: u64) -> Box<dyn ValueTree<Value = Draw>> {
    let mut runner =
        TestRunner::new_with_rng(PtConfig::default(), crate::generate::recipe::rng_for(seed));
    strategy
        .new_tree(&mut runner)
        .expect("strategies have no filters, so generation cannot be rejected")
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
    let (engine, corpus) = setup::start(cfg)?;
    let mut report = setup::new_report(&engine, started_unix);
    let deadline = cfg.budget.map(|b| started + b);
    let mut campaign = Campaign {
        engine: &engine,
        tally: Tally {
            per_kernel: std::mem::take(&mut report.per_kernel),
            coverage: std::mem::take(&mut report.coverage),
            ..Default::default()
        },
        log: CasesLog::default(),
        book: book::Book::default(),
        progress: progress::Progress::new(cfg.quiet, cfg.budget, cfg.max_cases),
        started,
        deadline,
        allowance: allowance::Allowance::new(cfg, deadline),
        known_crashes: std::sync::Arc::new(known_crash::KnownCrashes::new(
            cfg.known_crash_share,
            engine
                .kernels
                .iter()
                .map(|k| k.name().to_string())
                .collect(),
        )),
        any_finding: false,
        env_error: None,
    };
    let replayed = campaign.replay(&corpus);
    // The corpus files this campaign did not replay (another shard's, `--no-replay`):
    // a failure of a signature one of them holds shrunk is not shrunk again.
    campaign.book.index_corpus(cfg, &replayed);
    if campaign.env_error.is_none() {
        campaign.generate();
    }
    let Campaign {
        tally,
        log,
        book,
        progress,
        any_finding,
        env_error,
        allowance,
        known_crashes,
        ..
    } = campaign;
    progress.finish();
    report.per_kernel = tally.per_kernel;
    report.counts = tally.counts;
    report.counts.known_crashes = known_crashes.counts();
    report.coverage = tally.coverage;
    report.timings = tally.timings;
    report.shrinking = allowance.summary;
    report.shrinking.longest_run_secs = allowance.run_cost.longest().as_secs_f64();
    report.shrinking.known_from_corpus = book.known_from_corpus;
    let detections = book.detections.clone();
    report.findings = book.into_findings();
    report.interrupted = interrupt::requested() && env_error.is_none();
    report.stopped_early = env_error.clone();
    for (info, k) in report.kernels.iter_mut().zip(&engine.kernels) {
        info.worker = k.worker_report();
    }
    report.finished_unix = crate::util::unix_now();
    report.timings.wall_secs = started.elapsed().as_secs_f64();
    setup::write_report(&cfg.report_dir, &report, &log.text(), &log.timings_text())?;
    if let Some(e) = env_error {
        return Err(Fatal::environment(e));
    }
    Ok(Outcome {
        report,
        detections,
        exit_code: if any_finding { 1 } else { 0 },
    })
}

/// A running campaign: the engine and the consumers of its events.
struct Campaign<'e, 'c> {
    engine: &'e Engine<'c>,
    tally: Tally,
    log: CasesLog,
    book: book::Book,
    progress: progress::Progress,
    started: Instant,
    deadline: Option<Instant>,
    /// What shrinking may still use ([`allowance`]).
    allowance: allowance::Allowance,
    /// Crash findings that predict cases not worth running ([`known_crash`]).
    known_crashes: std::sync::Arc<known_crash::KnownCrashes>,
    any_finding: bool,
    /// The environment broke (driver gone, adapter missing): stop, exit 3.
    env_error: Option<String>,
}

impl Campaign<'_, '_> {
    /// Hands one event to every consumer, in order.
    fn on_event(&mut self, ev: Event) {
        self.tally.on_event(self.engine, &ev);
        self.log.on_event(self.engine, &ev);
        let Event::Judged { source, .. } = &ev;
        let generated = self.tally.counts.cases_generated;
        let mut ctx = book::Ctx {
            engine: self.engine,
            progress: &mut self.progress,
            timings: &mut self.tally.timings,
            allowance: &mut self.allowance,
            generated,
            started: self.started,
            deadline: match source {
                Source::Generated(_) => self.deadline,
                Source::Corpus { .. } => None,
            },
        };
        self.any_finding |= self.book.on_event(&mut ctx, &ev);
        self.known_crashes.learn(self.book.known_crashes());
        if let Source::Generated(_) = source {
            self.progress.update(generated, self.book.distinct(), "");
        }
    }

    /// Replays the corpus. Shards split it as they split the seeds (file j replays on
    /// shard j mod N), so a merge of every shard has replayed each file exactly once.
    /// Returns the files replayed.
    fn replay(&mut self, corpus: &[(PathBuf, CaseFile)]) -> Vec<PathBuf> {
        let (index, count) = shard_of(self.engine.cfg);
        let mut replayed = Vec::new();
        for (path, file) in corpus
            .iter()
            .enumerate()
            .filter(|(j, _)| *j as u64 % count == index)
            .map(|(_, c)| c)
        {
            if interrupt::requested() {
                break;
            }
            replayed.push(path.clone());
            let judgement = self.engine.judge_file(&file.case);
            if let Some(e) = &judgement.environment_error {
                self.env_error = Some(e.clone());
                break;
            }
            self.on_event(Event::Judged {
                source: Source::Corpus { path, file },
                case: &file.case,
                judgement: &judgement,
            });
        }
        replayed
    }

    /// Generates cases on worker threads until the budget, the case limit, an
    /// interrupt, enough findings or an environment error; consumes them here.
    fn generate(&mut self) {
        let cfg = self.engine.cfg;
        let jobs = cfg
            .jobs
            .unwrap_or_else(|| {
                let preferred = self.engine.kernels.iter().map(|k| k.preferred_jobs());
                preferred.min().unwrap_or(1)
            })
            .max(1);
        let (shard_index, shard_count) = shard_of(cfg);
        let next_k = AtomicU64::new(0);
        let stop = AtomicBool::new(false);
        let started_cases = AtomicU64::new(0);
        let left_at_deadline = AtomicU64::new(0);
        let not_run_known_crash = AtomicU64::new(0);
        let below_min_tokens = AtomicU64::new(0);
        let deadline = self.deadline;
        let engine = self.engine;
        let known = self.known_crashes.clone();
        let known = &*known;
        std::thread::scope(|scope| {
            let (tx, rx) = mpsc::channel::<engine::CaseDone>();
            for _ in 0..jobs {
                let (tx, next_k, started_cases, stop, left_at_deadline) = (
                    tx.clone(),
                    &next_k,
                    &started_cases,
                    &stop,
                    &left_at_deadline,
                );
                let (not_run_known_crash, below_min_tokens) =
                    (&not_run_known_crash, &below_min_tokens);
                // This job's guess of a case's time, from its last case's time per unit
                // of work, at most 1.5 times its longest case so far (a per-case
                // overhead makes small cases look costly per unit): a case drawn near
                // the budget's end that would end well past it is not run (on a mixed
                // CPU/GPU campaign, a full-size production case on the CPU kernel takes
                // tens of seconds).
                let mut cost = crate::finding::RunCost::default();
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
                    let k = next_k.fetch_add(1, Ordering::SeqCst) * shard_count + shard_index;
                    let seed = case_seed(cfg.seed, k);
                    // A case under `--min-tokens`, or predicted to hit a known crash
                    // (outside the share still run), is drawn (it counts towards
                    // `--cases`) but not run.
                    let mut small = false;
                    let keep = |r: &crate::generate::Recipe| {
                        small = cfg.min_tokens.is_some_and(|m| r.tokens() < m);
                        !small && known.not_run(r, seed).is_none()
                    };
                    let Some(drawn) = engine.draw_case_if(k, seed, keep) else {
                        let why = if small {
                            below_min_tokens
                        } else {
                            not_run_known_crash
                        };
                        why.fetch_add(1, Ordering::SeqCst);
                        continue;
                    };
                    let t0 = Instant::now();
                    if deadline.is_some_and(|d| !worth_starting(&cost, &drawn.case, t0, d)) {
                        left_at_deadline.fetch_add(1, Ordering::SeqCst);
                        break;
                    }
                    let r = engine.judge_drawn(drawn);
                    cost.record(&r.case, t0.elapsed());
                    // Here, not when the main thread gets to the case: it may be shrinking
                    // a crash for seconds while this thread draws cases that crash alike.
                    let verdicts: Vec<_> = r.judgement.runs.iter().map(|x| &x.verdict).collect();
                    known.observe(&r.generated.recipe, &verdicts);
                    let broken = r.judgement.environment_error.is_some();
                    if tx.send(r).is_err() || broken {
                        break;
                    }
                });
            }
            drop(tx);
            for r in rx {
                if stop.load(Ordering::SeqCst) {
                    continue; // enough findings: drain what the workers had in hand
                }
                if let Some(e) = &r.judgement.environment_error {
                    self.env_error.get_or_insert(e.clone());
                    interrupt::request();
                    continue;
                }
                self.on_event(Event::generated(&r));
                if cfg
                    .stop_after_findings
                    .is_some_and(|n| self.book.distinct() >= n)
                {
                    stop.store(true, Ordering::SeqCst);
                }
            }
        });
        self.tally.counts.cases_left_at_deadline += left_at_deadline.into_inner();
        self.tally.counts.cases_not_run_known_crash += not_run_known_crash.into_inner();
        self.tally.counts.cases_below_min_tokens += below_min_tokens.into_inner();
    }
}

/// Whether `case`, drawn at `now`, should run before `deadline`: its guessed time (from
/// `cost`, the job's last case's time per unit of work, at most 1.5 times its longest
/// case so far) ends before the deadline, or past it by at most a second or a tenth of
/// the guess (a guess is rough; a case that overruns a little is worth more than an
/// idle end). A job with no case behind it starts one.
fn worth_starting(
    cost: &crate::finding::RunCost,
    case: &crate::case::Case,
    now: Instant,
    deadline: Instant,
) -> bool {
    let guess = cost.guess(case).min(cost.longest().mul_f64(1.5));
    let slack = Duration::from_secs(1).max(guess / 10);
    now + guess <= deadline + slack
}

/// `(index, count)` of the campaign's shard (`(0, 1)` unsharded).
fn shard_of(cfg: &Config) -> (u64, u64) {
    cfg.shard
        .map(|s| (s.index as u64, s.count as u64))
        .unwrap_or((0, 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finding::RunCost;

    #[test]
    fn a_case_expected_to_end_past_the_deadline_is_not_started() {
        let small = crate::generate::Recipe::small(vec![300, 17], 2, 1).materialize();
        let big = crate::generate::Recipe::small(vec![30_000, 17_000], 2, 1).materialize();
        let now = Instant::now();
        let s = Duration::from_secs;
        // Nothing run yet: no guess, start.
        assert!(worth_starting(&RunCost::default(), &big, now, now));
        let mut cost = RunCost::default();
        cost.record(&small, s(10));
        // The same case again: 10 s, with 12 s left yes, with 5 s left no, with 9.5 s
        // left yes (it overruns by the slack at most).
        assert!(worth_starting(&cost, &small, now, now + s(12)));
        assert!(!worth_starting(&cost, &small, now, now + s(5)));
        assert!(worth_starting(
            &cost,
            &small,
            now,
            now + Duration::from_millis(9_500)
        ));
        // A case a hundred times the work: guessed at most 1.5 x the longest (15 s).
        assert!(worth_starting(&cost, &big, now, now + s(14)));
        assert!(!worth_starting(&cost, &big, now, now + s(12)));
    }
}
