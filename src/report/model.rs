//! The report model: what a campaign found, in a form that is stable on disk
//! (`report.json`, schema documented in `reports/README.md`), foldable across shards
//! and comparable across releases.
//!
//! Every float that can legitimately be non-finite (an error ratio of a NaN element is
//! infinite) goes through [`json_f64`]: plain serde_json would write `null`, which it
//! then refuses to read back as a number, so a report with a NaN finding would not load.

use super::stats::add;
use crate::oracle::{Class, Verdict};
use crate::shard::Shard;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Bumped on any change that an older reader would misread. `load` refuses newer ones.
pub const REPORT_VERSION: u32 = 1;

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Report {
    pub report_version: u32,
    pub tool_version: String,
    pub run_id: String,
    pub started_unix: u64,
    pub finished_unix: u64,
    /// Stopped early (Ctrl-C, SIGTERM): the counts cover what ran.
    pub interrupted: bool,
    /// Why the campaign stopped before its budget, when the environment stopped it (a
    /// worker that could not be restarted, a device gone): what ran is reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_early: Option<String>,
    pub environment: Environment,
    pub kernels: Vec<KernelInfo>,
    pub profile: String,
    pub seed: u64,
    pub shard: Option<Shard>,
    pub budget_secs: Option<f64>,
    pub max_cases: Option<u64>,
    /// `--min-tokens`: generated cases with fewer KV tokens were not run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_tokens: Option<u64>,
    /// Properties whose violation is a finding (`--require`): `deterministic`,
    /// `batch-invariant`.
    pub required: Vec<String>,
    pub counts: Counts,
    pub per_kernel: BTreeMap<String, KernelStats>,
    pub findings: Vec<Finding>,
    pub coverage: Coverage,
    pub timings: Timings,
    /// How shrinking was bounded (`--shrink-share`, `--shrink-budget`) and where it was
    /// cut short.
    pub shrinking: Shrinking,
    /// For a merged report: the shards folded into it, and the run ids they came from.
    pub merged_shards: Vec<Shard>,
    pub merged_runs: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Environment {
    pub hostname: String,
    pub os: String,
    pub cpus: usize,
    pub gpus: Vec<String>,
    pub command_line: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct KernelInfo {
    pub name: String,
    pub version: String,
    pub planted_bug: bool,
    pub capabilities: serde_json::Value,
    /// Worker processes (`exec:` kernels and isolated built-ins): protocol, fork
    /// server, restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<crate::kernel::WorkerReport>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Counts {
    /// Corpus cases replayed before generation.
    pub cases_replayed: u64,
    pub cases_generated: u64,
    /// Cases no kernel could run (outside every kernel's capabilities).
    pub cases_skipped: u64,
    pub skip_reasons: BTreeMap<String, u64>,
    /// Cases drawn near the budget's end and not run: each was expected to end past
    /// the budget (from its job's last case's time per unit of work).
    pub cases_left_at_deadline: u64,
    /// Generated cases not run: predicted to hit a known crash (`--known-crashes`).
    pub cases_not_run_known_crash: u64,
    /// Generated cases not run: fewer KV tokens than `--min-tokens`.
    pub cases_below_min_tokens: u64,
    /// Per known crash (signature): the generated cases predicted to hit it.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub known_crashes: BTreeMap<String, PredictedCrashes>,
}

/// The generated cases predicted to hit one known crash (every feature of its
/// trigger): those run, those of them that crashed that way, those not run.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct PredictedCrashes {
    pub run: u64,
    pub crashed: u64,
    pub not_run: u64,
}

impl std::ops::AddAssign<&PredictedCrashes> for PredictedCrashes {
    fn add_assign(&mut self, o: &PredictedCrashes) {
        self.run += o.run;
        self.crashed += o.crashed;
        self.not_run += o.not_run;
    }
}

/// What one kernel did over the campaign.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct KernelStats {
    /// Cases run (replayed or generated), skipped ones excluded.
    pub cases: u64,
    pub clean: u64,
    pub with_findings: u64,
    pub skipped: u64,
    /// Per class: the verdicts' counts summed (elements for value classes, 1 per case
    /// for case-level classes).
    pub class_totals: BTreeMap<Class, u64>,
    pub rows_checked: u64,
    /// Elements of V(r) compared with the reference.
    pub logits_checked: u64,
    pub guard: GuardSummary,
    /// The kernel's own time where it reports one (CUDA events, an adapter's clock),
    /// else the wall time of its run.
    pub kernel_secs: f64,
    /// Runs that reported no clock of their own, and their wall time (part of
    /// `kernel_secs`): every run of a CPU kernel (its clock is the call), the crashes of
    /// a GPU worker (a worker that died reports nothing; its run's wall is the fault,
    /// the death and the wait for it).
    pub unclocked_runs: u64,
    pub unclocked_secs: f64,
    /// Wall time of the kernel's runs, including worker protocol and device transfers.
    pub run_wall_secs: f64,
    /// The part of `run_wall_secs` before the kernel was called: the harness's output
    /// buffer, allocated and poisoned (see `harness::Judged::setup`).
    pub output_setup_secs: f64,
    /// The kernel's own launch times (CUDA events, an adapter's clock), per shape class
    /// ([`shape_class`]): medians per class, mergeable across shards.
    pub kernel_time_by_shape: BTreeMap<String, LaunchTimes>,
    /// Largest `|err| / bound` seen (infinite when an element was NaN or ±inf).
    #[serde(with = "json_f64")]
    pub max_err_over_bound: f64,
    /// What the production-profile cases whose guard verdict counts were: the population
    /// the verdict speaks for.
    pub population: Population,
    /// Determinism and batch invariance (DESIGN §7), checked where `--repeat` /
    /// `--batch-invariance` say; findings only under `--require`.
    pub properties: crate::property::PropertyStats,
    /// `kernel_secs` split by compile key, for kernels that declare one
    /// (`Kernel::compile_key`); empty for the others.
    pub compile: CompileTimes,
    /// Seconds per phase of the runs, summed (`RunInfo::phases`: a worker's own split
    /// of a call, the harness's copies into and out of its region); empty for kernels
    /// that report none.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub call_phases: BTreeMap<String, f64>,
    /// Where the cases were judged (DESIGN §8): on the device next to the output, or on
    /// the CPU, and how much of the device's work the CPU re-checked.
    #[serde(default)]
    pub judge: JudgeTally,
}

/// Where one kernel's cases were judged.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct JudgeTally {
    /// Cases judged on the device (the exact GPU reference and the oracle's rules next
    /// to the output).
    pub device_cases: u64,
    /// Of those, cases whose judgement held a finding: the output came back and the CPU
    /// judged it too, with the same counts required.
    pub device_then_cpu: u64,
    /// Elements of device judgements the CPU re-checked (reference bits and class).
    pub rechecked_elements: u64,
    /// Cases judged on the CPU, by reason.
    pub cpu_cases: u64,
    pub cpu_reasons: BTreeMap<String, u64>,
}

/// A kernel's time split by compile key ([`crate::kernel::compile_key_of`]): a run whose
/// key value the kernel had not run before in this campaign (a shard: in this shard)
/// counts as a first call, its library's JIT compile included; every later run of that
/// value is steady.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct CompileTimes {
    /// The key values run (`heads=64 head_dim=128`); merged: the union over shards.
    pub keys: std::collections::BTreeSet<String>,
    /// `keys.len()`: the distinct keys visited.
    pub distinct_keys: u64,
    /// First calls of a key and their kernel time (compile included). Merged: summed
    /// over shards, each of which compiled its own.
    pub first_calls: u64,
    pub first_call_secs: f64,
    /// Every other run of a key, and its kernel time.
    pub steady_calls: u64,
    pub steady_secs: f64,
}

impl CompileTimes {
    /// Counts one run of key value `key` that took `secs` of kernel time.
    pub fn record(&mut self, key: &str, secs: f64) {
        if self.keys.insert(key.to_string()) {
            self.first_calls += 1;
            self.first_call_secs += secs;
        } else {
            self.steady_calls += 1;
            self.steady_secs += secs;
        }
        self.distinct_keys = self.keys.len() as u64;
    }

    /// Folds `b` (another shard's) into `self`.
    pub fn merge(&mut self, b: &CompileTimes) {
        self.keys.extend(b.keys.iter().cloned());
        self.distinct_keys = self.keys.len() as u64;
        add(&mut self.first_calls, b.first_calls);
        self.first_call_secs += b.first_call_secs;
        add(&mut self.steady_calls, b.steady_calls);
        self.steady_secs += b.steady_secs;
    }
}

/// The smallest and largest value seen (`None` before the first).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Span {
    pub min: u64,
    pub max: u64,
}

impl Span {
    fn add(this: &mut Option<Span>, x: u64) {
        *this = Some(match *this {
            None => Span { min: x, max: x },
            Some(s) => Span {
                min: s.min.min(x),
                max: s.max.max(x),
            },
        });
    }

    /// Folds `b` into `a` (shards, kernels).
    pub fn merge(a: &mut Option<Span>, b: Option<Span>) {
        if let Some(b) = b {
            Span::add(a, b.min);
            Span::add(a, b.max);
        }
    }
}

/// The engine-model (production-profile) cases a kernel's guard verdict covers.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Population {
    /// Production cases judged (crashes and skips excluded, as for the guard).
    pub cases: u64,
    /// KV pool size, in blocks.
    pub pool_blocks: Option<Span>,
    /// Bytes from one block to the next.
    pub kv_stride: Option<Span>,
    /// Largest referenced KV byte offset.
    pub kv_offset: Option<Span>,
    /// Requests in the batch (MTP rows of one request counted once).
    pub batch: Option<Span>,
    /// Output rows.
    pub rows: Option<Span>,
    /// The longest context of a case.
    pub context: Option<Span>,
    pub max_model_len: Option<Span>,
    /// Output workspace bytes.
    pub workspace_bytes: Option<Span>,
    /// The `--scale` the cases were drawn at (smallest and largest, as `1/scale`).
    pub inverse_scale: Option<Span>,
}

impl Population {
    /// Counts one judged production case.
    pub fn record(
        &mut self,
        case: &crate::case::Case,
        pool: &crate::generate::PoolRecipe,
        scale: f64,
    ) {
        self.cases += 1;
        Span::add(&mut self.pool_blocks, pool.blocks);
        Span::add(&mut self.kv_stride, case.kv_block_stride);
        Span::add(&mut self.kv_offset, case.max_kv_offset());
        let requests = case.shape.batch / (pool.rows_per_request.max(1) as usize);
        Span::add(&mut self.batch, requests as u64);
        Span::add(&mut self.rows, case.rows() as u64);
        let longest = (0..case.shape.batch).map(|b| case.seq_tokens(b)).max();
        Span::add(&mut self.context, longest.unwrap_or(0) as u64);
        Span::add(&mut self.max_model_len, case.max_model_len as u64);
        Span::add(&mut self.workspace_bytes, case.output_bytes());
        Span::add(&mut self.inverse_scale, (1.0 / scale).round() as u64);
    }

    /// Folds `b` into `self`.
    pub fn merge(&mut self, b: &Population) {
        add(&mut self.cases, b.cases);
        Span::merge(&mut self.pool_blocks, b.pool_blocks);
        Span::merge(&mut self.kv_stride, b.kv_stride);
        Span::merge(&mut self.kv_offset, b.kv_offset);
        Span::merge(&mut self.batch, b.batch);
        Span::merge(&mut self.rows, b.rows);
        Span::merge(&mut self.context, b.context);
        Span::merge(&mut self.max_model_len, b.max_model_len);
        Span::merge(&mut self.workspace_bytes, b.workspace_bytes);
        Span::merge(&mut self.inverse_scale, b.inverse_scale);
    }
}

/// A case's shape class for kernel timings: heads, head dim, next_n and the KV tokens
/// read rounded up to a power of two (`H64 D128 N2 tokens<=2M`), so that medians
/// compare launches of comparable work (block size and layout left out: they change
/// addressing, not the work).
pub fn shape_class(case: &crate::case::Case) -> String {
    let s = &case.shape;
    let tokens: u64 = (0..s.batch).map(|b| case.seq_tokens(b) as u64).sum();
    let bucket = tokens.max(1).next_power_of_two();
    let human = match bucket {
        b if b >= 1 << 20 => format!("{}M", b >> 20),
        b if b >= 1 << 10 => format!("{}K", b >> 10),
        b => b.to_string(),
    };
    format!("H{} D{} N{} tokens<={human}", s.heads, s.head_dim, s.next_n)
}

/// Launch times of one kernel on one shape class, as a histogram with 16 buckets per
/// octave (bucket `floor(16 * log2(µs))`, ±2.2% from its centre): the median needs no
/// stored samples, and shards merge by adding counts.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct LaunchTimes {
    pub launches: u64,
    pub log2_us_x16: BTreeMap<i32, u64>,
}

impl LaunchTimes {
    pub fn record(&mut self, secs: f64) {
        let us = (secs * 1e6).max(1e-3);
        let b = (16.0 * us.log2()).floor() as i32;
        self.launches += 1;
        *self.log2_us_x16.entry(b).or_default() += 1;
    }

    pub fn merge(&mut self, other: &LaunchTimes) {
        add(&mut self.launches, other.launches);
        for (b, n) in &other.log2_us_x16 {
            add(self.log2_us_x16.entry(*b).or_default(), *n);
        }
    }

    /// Median launch time in µs (the centre of the median's bucket); 0 when empty.
    pub fn median_us(&self) -> f64 {
        let half = self.launches.div_ceil(2).max(1);
        let mut seen = 0;
        for (b, n) in &self.log2_us_x16 {
            seen = n.saturating_add(seen);
            if seen >= half {
                return 2f64.powf((*b as f64 + 0.5) / 16.0);
            }
        }
        0.0
    }
}

/// The guard question over a campaign: would `nan_to_num_(-inf)` after the kernel have
/// changed anything in V(r)?
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct GuardSummary {
    /// Cases whose output was judged (crashed and skipped cases excluded).
    pub cases: u64,
    /// Of those, cases where the guard would have changed nothing.
    pub redundant_cases: u64,
    /// Rows where the guard would have changed at least one element.
    pub rows_affected: u64,
    /// Elements of V(r) the guard would have changed, by class.
    pub nan: u64,
    pub pos_inf: u64,
    pub neg_inf: u64,
}

/// One distinct failure (by `signature`), with the smallest case that shows it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Finding {
    /// Stable identity across runs and releases (what `diff` and `merge` key on):
    /// kernel, class, crash reason and trigger ([`crate::finding::Signature::key`]).
    pub signature: String,
    /// Reachability: the least benign tier among the trigger's features.
    pub tier: crate::finding::Tier,
    /// The necessary features of the shrunk case ([`crate::finding::Feature`] names),
    /// empty for a bug that needs nothing special.
    pub trigger: Vec<String>,
    /// The trigger in words: `needs: KV byte offset ≥ 2^32; block size 1`.
    pub needs: String,
    /// False when ablation ran out of budget: a feature not in `trigger` may be needed.
    pub trigger_complete: bool,
    /// Every feature of the shrunk case, the trigger's among them (`diff`, `merge`).
    pub case_features: Vec<String>,
    /// The normalised crash reason (crashes only).
    pub reason: Option<String>,
    /// Where the first offending position sits ([`crate::finding::position`]):
    /// `last-valid-position`, `past-valid-range`, `context-start`, `block-edge`,
    /// `chunk-edge` or `interior`; empty for case-level classes.
    pub position: Vec<String>,
    pub kernel: String,
    pub profile: String,
    /// The primary class (for titles and sorting); an `Option` only so that the struct
    /// has a `Default` — the campaign always sets it.
    pub class: Option<Class>,
    /// All classes of the case with their element counts.
    pub classes: BTreeMap<Class, u64>,
    /// The saved corpus file, relative to the working directory of the run.
    pub case_file: Option<String>,
    pub replay_command: String,
    pub seed: Option<u64>,
    pub shrunk: bool,
    /// Rows of the case (`batch * next_n`).
    pub rows: usize,
    /// Tokens of the case (sum of the sequences' lengths).
    pub tokens: u64,
    /// How many cases of the campaign produced this signature.
    pub occurrences: u64,
    #[serde(with = "verdict_json")]
    pub verdict: Verdict,
    pub picture: Option<ClassMap>,
    /// Where a crash happened, from compute-sanitizer memcheck's first error record on
    /// the shrunk case (initcheck for `unwritten` under `--sanitize initcheck`).
    pub localisation: Option<crate::finding::sanitizer::Localisation>,
    /// Why the finding was not localised (tool missing, CPU kernel, no record), when a
    /// localisation was asked for and is absent.
    pub localisation_skipped: Option<String>,
    /// Counts of `|err| / bound` per bin, see [`crate::report::picture::HISTOGRAM_BINS`].
    pub error_histogram: Vec<u64>,
    /// Why its shrinking or ablation stopped before `--shrink-budget` did, if a cap of
    /// the campaign stopped it (the case may be larger, the trigger incomplete).
    pub shrink_cut_short: Option<ShrinkCut>,
}

/// What cut a finding's shrinking short.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShrinkCut {
    /// The campaign's shrinking had used its `--shrink-share` of the budget.
    ShareSpent,
    /// The campaign's `--budget` was at its end.
    BudgetEnd,
}

impl ShrinkCut {
    pub fn words(self) -> &'static str {
        match self {
            ShrinkCut::ShareSpent => "share spent",
            ShrinkCut::BudgetEnd => "budget end",
        }
    }
}

/// How a campaign's shrinking (shrink steps and ablation, all findings together) was
/// bounded: at most `share` of the wall budget in total, at most `per_finding_secs` per
/// finding; a finding met once a cap is reached still gets up to `floor_secs`, from one
/// pool of that size per campaign.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Shrinking {
    /// `--shrink-share`.
    pub share: f64,
    /// `share` × the wall budget; 0 without one (then only the per-finding cap holds).
    /// Merged: summed over shards.
    pub cap_secs: f64,
    /// `--shrink-budget`.
    pub per_finding_secs: f64,
    /// The floor's pool (merged: summed).
    pub floor_secs: f64,
    /// Failures whose shrinking or ablation a cap stopped, by why (a failure shrunk so
    /// may still turn out to be a finding already made: then only the count shows it).
    pub cut_short_share: u64,
    pub cut_short_budget_end: u64,
    /// Failures filed to a finding a corpus file holds shrunk (its saved signature, not
    /// replayed in this campaign), without shrinking them.
    pub known_from_corpus: u64,
    /// The longest single shrink or ablation run (its case's materialisation and its
    /// judging): a run is not started when it is expected to end past a cap, so a cap
    /// is overrun by at most about this much per job (when a run takes longer than its
    /// guess). Merged: the largest.
    pub longest_run_secs: f64,
}

impl Shrinking {
    /// Folds `b` (another shard's) into `self`.
    pub fn merge(&mut self, b: &Shrinking) {
        self.share = self.share.max(b.share);
        self.cap_secs += b.cap_secs;
        self.per_finding_secs = self.per_finding_secs.max(b.per_finding_secs);
        self.floor_secs += b.floor_secs;
        add(&mut self.cut_short_share, b.cut_short_share);
        add(&mut self.cut_short_budget_end, b.cut_short_budget_end);
        add(&mut self.known_from_corpus, b.known_from_corpus);
        self.longest_run_secs = self.longest_run_secs.max(b.longest_run_secs);
    }
}

impl Finding {
    /// The primary class's name ("unknown" when the campaign did not set one).
    pub fn class_name(&self) -> &'static str {
        self.class.map(Class::name).unwrap_or("unknown")
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Coverage {
    /// Axis name → value → cases (e.g. `block_size` → `64` → 12).
    pub axes: BTreeMap<String, BTreeMap<String, u64>>,
    /// Combinations of axis values (joined by the campaign) → cases.
    pub combos: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Timings {
    pub wall_secs: f64,
    pub generate_secs: f64,
    pub kernel_secs: f64,
    pub reference_secs: f64,
    pub oracle_secs: f64,
    pub shrink_secs: f64,
    /// Merged reports only: the shards' wall times summed (`wall_secs` is the longest
    /// shard's), the time rates per shard are computed over. 0 in a campaign's report.
    pub shard_wall_secs: f64,
}

pub use crate::oracle::picture::{CellClass, ClassMap};

/// What changed between two reports, by finding signature.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct ReportDiff {
    /// In the candidate, not in the base: regressions.
    pub new: Vec<Finding>,
    /// In the base, not in the candidate, and its saved case no longer fails that way on
    /// replay (or, before [`crate::report::fold::confirm_fixed`], not yet replayed).
    pub fixed: Vec<Finding>,
    /// In both (the candidate's copy), by signature or by the same-bug rule.
    pub unchanged: Vec<Finding>,
    /// Of `unchanged`, `(base, candidate)` signatures that differ though the base finding
    /// explains the candidate's case ([`crate::finding::signature::explains`]).
    pub same_bug: Vec<(String, String)>,
    /// In the base, not in the candidate, but its saved case still fails that way on
    /// replay: the candidate's campaign did not meet the bug; it is not fixed.
    pub still_failing: Vec<Finding>,
    /// In the base, not in the candidate, and its case could not be replayed here (no
    /// case file, a kernel that does not open): neither fixed nor failing, and why.
    pub unconfirmed: Vec<(Finding, String)>,
}

/// Non-finite f64 as the strings `"inf"`, `"-inf"`, `"nan"`; numbers otherwise. Reads
/// numbers, those strings, and `null` (what older writers produced) as NaN.
pub mod json_f64 {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn to_json(x: f64) -> serde_json::Value {
        if x.is_finite() {
            serde_json::json!(x)
        } else if x.is_nan() {
            "nan".into()
        } else if x > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        }
    }

    pub fn from_json(v: &serde_json::Value) -> Result<f64, String> {
        match v {
            serde_json::Value::Number(n) => n.as_f64().ok_or_else(|| format!("{n} is not a float")),
            serde_json::Value::Null => Ok(f64::NAN),
            serde_json::Value::String(s) => match s.as_str() {
                "inf" | "+inf" | "infinity" => Ok(f64::INFINITY),
                "-inf" | "-infinity" => Ok(f64::NEG_INFINITY),
                "nan" | "NaN" => Ok(f64::NAN),
                other => Err(format!(
                    "expected a number, \"inf\", \"-inf\" or \"nan\", found {other:?}"
                )),
            },
            other => Err(format!("expected a number, found {other}")),
        }
    }

    pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
        if x.is_finite() {
            s.serialize_f64(*x)
        } else {
            s.serialize_str(to_json(*x).as_str().unwrap_or("nan"))
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        from_json(&v).map_err(D::Error::custom)
    }
}

/// The oracle's `Verdict` with its non-finite floats preserved (see [`json_f64`]): the
/// metrics and the offenders' `expected`/`bound` are patched after serde_json has
/// turned them into `null`, and restored on the way back in.
pub mod verdict_json {
    use super::json_f64::{from_json, to_json};
    use crate::oracle::Verdict;
    use serde::{de::Error, ser::Error as _, Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::Value;

    const METRICS: [&str; 3] = ["max_abs_err", "max_err_over_bound", "calc_diff"];
    const OFFENDER: [&str; 2] = ["expected", "bound"];

    fn metric(v: &Verdict, name: &str) -> f64 {
        match name {
            "max_abs_err" => v.metrics.max_abs_err,
            "max_err_over_bound" => v.metrics.max_err_over_bound,
            _ => v.metrics.calc_diff,
        }
    }

    pub fn serialize<S: Serializer>(v: &Verdict, s: S) -> Result<S::Ok, S::Error> {
        let mut val = serde_json::to_value(v).map_err(S::Error::custom)?;
        for name in METRICS {
            val["metrics"][name] = to_json(metric(v, name));
        }
        for (i, ex) in v.examples.iter().enumerate() {
            for (name, x) in OFFENDER.iter().zip([ex.expected, ex.bound]) {
                if let Some(x) = x.filter(|x| !x.is_finite()) {
                    val["examples"][i][*name] = to_json(x);
                }
            }
        }
        val.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Verdict, D::Error> {
        let mut val = Value::deserialize(d)?;
        let mut metrics = Vec::new();
        if let Some(m) = val.get_mut("metrics").and_then(Value::as_object_mut) {
            for name in METRICS {
                if let Some(x) = m.get_mut(name) {
                    let f = from_json(x)
                        .map_err(|e| D::Error::custom(format!("metrics.{name}: {e}")))?;
                    *x = Value::from(0.0);
                    metrics.push((name, f));
                }
            }
        }
        let mut offenders = Vec::new();
        if let Some(list) = val.get_mut("examples").and_then(Value::as_array_mut) {
            for (i, ex) in list.iter_mut().enumerate() {
                for name in OFFENDER {
                    if let Some(x) = ex.get_mut(name).filter(|x| x.is_string()) {
                        let f = from_json(x)
                            .map_err(|e| D::Error::custom(format!("examples[{i}].{name}: {e}")))?;
                        *x = Value::Null;
                        offenders.push((i, name, f));
                    }
                }
            }
        }
        let mut v: Verdict = serde_path_to_error::deserialize(val)
            .map_err(|e| D::Error::custom(format!("{}: {}", e.path(), e.inner())))?;
        for (name, f) in metrics {
            match name {
                "max_abs_err" => v.metrics.max_abs_err = f,
                "max_err_over_bound" => v.metrics.max_err_over_bound = f,
                _ => v.metrics.calc_diff = f,
            }
        }
        for (i, name, f) in offenders {
            let ex = &mut v.examples[i];
            if name == "expected" {
                ex.expected = Some(f);
            } else {
                ex.bound = Some(f);
            }
        }
        Ok(v)
    }
}
