//! Properties beyond the reference (DESIGN §7): what one judged output cannot show.
//!
//! - [`determinism`]: the case run R times; the valid range V(r) must be bitwise the same
//!   every time (DeepGEMM's own tests ask this of 20 repeats).
//! - [`batch`]: a sequence's rows must be bitwise the same in the batch, alone, and with
//!   the batch permuted, on the same physical blocks of the same KV pool (deterministic
//!   inference and RL rollouts need it; a schedule tuned to the whole batch breaks it
//!   within every error bound).
//!
//! Both are pure functions of a kernel, a case and the first run's output. A property
//! that does not hold is counted in the report's own section ("bitwise deterministic on
//! n/n cases"); it is a finding (class `nondeterministic` / `batch_variant`) only when
//! required (`--require deterministic,batch-invariant`). The campaign calls
//! [`check_case`] once per judged case; [`judge`] is what shrinking and ablation run.

pub mod batch;
pub mod determinism;

use crate::case::Case;
use crate::generate::Profile;
use crate::harness::{self, ReferenceCache};
use crate::kernel::{DeviceJudgeRequest, Kernel, OutputBuffer, RunError};
use crate::oracle::{show_f32, Class, Offender, OracleConfig, Verdict};
use serde::{Deserialize, Serialize};

/// A property a kernel may be required to have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Property {
    /// Repeat runs of a case are bitwise identical over V(r).
    Deterministic,
    /// A sequence's rows do not depend on the rest of the batch or its position in it.
    BatchInvariant,
}

impl Property {
    pub const ALL: [Property; 2] = [Property::Deterministic, Property::BatchInvariant];

    /// The name `--require` takes.
    pub fn name(self) -> &'static str {
        match self {
            Property::Deterministic => "deterministic",
            Property::BatchInvariant => "batch-invariant",
        }
    }

    /// The finding class of a violation.
    pub fn class(self) -> Class {
        match self {
            Property::Deterministic => Class::Nondeterministic,
            Property::BatchInvariant => Class::BatchVariant,
        }
    }

    pub fn of_class(c: Class) -> Option<Property> {
        Property::ALL.into_iter().find(|p| p.class() == c)
    }

    pub fn parse(s: &str) -> Option<Property> {
        Property::ALL.into_iter().find(|p| p.name() == s.trim())
    }

    /// `deterministic,batch-invariant` (each once; `all` for both).
    pub fn parse_list(s: &str) -> Result<Vec<Property>, String> {
        if s.trim() == "all" {
            return Ok(Property::ALL.to_vec());
        }
        let mut v = Vec::new();
        for part in s.split(',').filter(|p| !p.trim().is_empty()) {
            let p = Property::parse(part).ok_or_else(|| {
                format!(
                    "unknown property {:?} (choose from deterministic, batch-invariant, all)",
                    part.trim()
                )
            })?;
            if !v.contains(&p) {
                v.push(p);
            }
        }
        if v.is_empty() {
            return Err(
                "no property named (choose from deterministic, batch-invariant, all)".into(),
            );
        }
        Ok(v)
    }
}

impl std::fmt::Display for Property {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `on`, `off`, or `auto` (the same rule as `--repeat`'s default).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Switch {
    On,
    Off,
    #[default]
    Auto,
}

/// Runs per case where repeat is on by default (GPU kernels, production profile) or
/// implied (`--require deterministic` without `--repeat`).
pub const DEFAULT_REPEAT: u32 = 2;

/// What the user asked for (`--repeat`, `--batch-invariance`, `--require`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PropertyConfig {
    /// Runs per case (`None`: [`DEFAULT_REPEAT`] where auto applies, else 1 = off).
    pub repeat: Option<u32>,
    pub batch: Switch,
    /// Properties whose violation is a finding.
    pub require: Vec<Property>,
}

/// What is checked on one kernel's cases.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Runs per case (1: determinism not checked).
    pub repeat: u32,
    pub batch: bool,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.repeat < 2 && !self.batch
    }

    /// This plan restricted to one property (for shrinking that property's finding).
    pub fn only(self, p: Property) -> Plan {
        match p {
            Property::Deterministic => Plan {
                repeat: self.repeat.max(DEFAULT_REPEAT),
                batch: false,
            },
            Property::BatchInvariant => Plan {
                repeat: 1,
                batch: true,
            },
        }
    }
}

impl PropertyConfig {
    pub fn requires(&self, p: Property) -> bool {
        self.require.contains(&p)
    }

    /// The checks for a kernel: `auto` is on for a kernel on an accelerator in the
    /// production profile, and for a required property; explicit settings win.
    pub fn plan(&self, on_accelerator: bool, profile: Profile) -> Plan {
        let auto = on_accelerator && profile == Profile::Production;
        let repeat = match self.repeat {
            Some(r) => r.max(1),
            None if auto || self.requires(Property::Deterministic) => DEFAULT_REPEAT,
            None => 1,
        };
        let batch = match self.batch {
            Switch::On => true,
            Switch::Off => false,
            Switch::Auto => auto || self.requires(Property::BatchInvariant),
        };
        Plan { repeat, batch }
    }

    /// Settings that contradict each other (exit 2 before anything runs).
    pub fn check(&self) -> Result<(), String> {
        if self.repeat == Some(0) {
            return Err("--repeat 0: a case runs at least once (--repeat 1 turns the determinism check off)".into());
        }
        if self.requires(Property::Deterministic) && self.repeat == Some(1) {
            return Err(
                "--require deterministic needs --repeat 2 or more (--repeat 1 turns the check off)"
                    .into(),
            );
        }
        if self.requires(Property::BatchInvariant) && self.batch == Switch::Off {
            return Err("--require batch-invariant contradicts --batch-invariance off".into());
        }
        Ok(())
    }
}

/// Where two runs (or the batch and a sub-batch) first differ, and by how much.
#[derive(Clone, Debug, PartialEq)]
pub struct Break {
    /// Elements of V(r) that differ bitwise (in the original case's rows).
    pub differing: u64,
    /// The first differing element (row, position) of the original case.
    pub first: Option<(usize, usize)>,
    /// The first element's values, one per run or variant, as [`show_f32`] writes them.
    pub values: Vec<String>,
    /// The largest `|a - b|` between runs over differing finite elements.
    pub max_abs_diff: f64,
    /// The largest distance in units in the last place between differing finite
    /// elements of the same sign.
    pub max_ulps: u64,
    /// The finding in words.
    pub detail: String,
}

/// What one property check said about one case.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Held,
    Broken(Break),
    /// Not checkable on this case (one sequence, no output, a re-run the kernel
    /// skipped), with the reason.
    Skipped(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct PropertyOutcome {
    pub property: Property,
    pub outcome: Outcome,
    /// Extra kernel runs the check made.
    pub runs: u64,
}

/// The first run of a case as the properties see it.
#[derive(Clone, Copy)]
pub enum FirstRun<'a> {
    /// Its output (judged on the CPU, or fetched for a finding).
    Output(&'a OutputBuffer),
    /// Its rows' digests of V(r) (judged on the device: the output stayed there), and
    /// whether its cache was read-only (re-runs are laid out the same way).
    Digests(&'a [u64], bool),
    /// No output (the run crashed or was skipped).
    Nothing,
}

impl<'a> FirstRun<'a> {
    /// What a judged run left: its output, else its digests.
    pub fn of(judged: &'a harness::Judged) -> FirstRun<'a> {
        match (&judged.output, &judged.device) {
            (Some(o), _) => FirstRun::Output(o),
            (None, Some(d)) => FirstRun::Digests(&d.row_digests, d.read_only_cache),
            (None, None) => FirstRun::Nothing,
        }
    }
}

/// The property checks of one judged case: `verdict` and `first` are the first run's.
/// Empty when the plan checks nothing or the kernel did not run the case (skipped). A
/// first run judged on the device is compared by digests of V(r), its re-runs judged
/// there too (digests only); where digests differ, full outputs are fetched to say
/// where.
pub fn check_case(
    kernel: &dyn Kernel,
    case: &Case,
    verdict: &Verdict,
    first: FirstRun,
    plan: Plan,
) -> Vec<PropertyOutcome> {
    if plan.is_empty() || verdict.skipped.is_some() {
        return Vec::new();
    }
    let mut v = Vec::new();
    let mut planned = Vec::new();
    if plan.repeat >= 2 {
        planned.push(Property::Deterministic);
    }
    if plan.batch {
        planned.push(Property::BatchInvariant);
    }
    for p in planned {
        let (outcome, runs) = match (p, first) {
            (_, FirstRun::Nothing) => (
                Outcome::Skipped("no output to compare (the first run crashed)".into()),
                0,
            ),
            (Property::Deterministic, FirstRun::Output(o)) => {
                determinism::check(kernel, case, o, plan.repeat)
            }
            (Property::Deterministic, FirstRun::Digests(d, ro)) => {
                determinism::check_digests(kernel, case, d, plan.repeat, ro)
            }
            (Property::BatchInvariant, FirstRun::Output(o)) => batch::check(kernel, case, o),
            (Property::BatchInvariant, FirstRun::Digests(d, ro)) => {
                batch::check_digests(kernel, case, d, ro)
            }
        };
        v.push(PropertyOutcome {
            property: p,
            outcome,
            runs,
        });
    }
    v
}

/// The verdict of a property violation: one class (the property's) counting the
/// differing elements, the first of them as the offender.
pub fn break_verdict(p: Property, b: &Break) -> Verdict {
    let mut v = Verdict::default();
    add_break(&mut v, p, b);
    v
}

fn add_break(v: &mut Verdict, p: Property, b: &Break) {
    let class = p.class();
    *v.classes.entry(class).or_default() += b.differing.max(1);
    v.examples.push(Offender {
        class,
        row: b.first.map(|f| f.0),
        pos: b.first.map(|f| f.1),
        expected: None,
        got: (!b.values.is_empty()).then(|| b.values.join(" vs ")),
        bound: None,
        detail: Some(b.detail.clone()),
    });
}

/// The verdicts the campaign files under `--require`: one per required property that
/// is broken on this case.
pub fn required_failures(
    outcomes: &[PropertyOutcome],
    cfg: &PropertyConfig,
) -> Vec<(Property, Verdict)> {
    outcomes
        .iter()
        .filter(|o| cfg.requires(o.property))
        .filter_map(|o| match &o.outcome {
            Outcome::Broken(b) => Some((o.property, break_verdict(o.property, b))),
            _ => None,
        })
        .collect()
}

/// Runs, judges and checks `property` on `case` (shrinking and ablation of a property
/// finding): the verdict holds the property's class when it is broken, the crash when
/// the kernel crashed (another failure), `skipped` when the kernel cannot run the case,
/// and nothing else: a property finding is never mistaken for a value bug.
pub fn judge(
    kernel: &dyn Kernel,
    case: &Case,
    property: Property,
    oracle: &OracleConfig,
    plan: Plan,
) -> Verdict {
    let mut refs = ReferenceCache::new(case);
    let j = harness::run_and_judge(kernel, case, &mut refs, oracle);
    let mut v = Verdict {
        skipped: j.verdict.skipped.clone(),
        run: j.verdict.run.clone(),
        ..Default::default()
    };
    if j.verdict.classes.contains_key(&Class::Crash) {
        for e in j
            .verdict
            .examples
            .iter()
            .filter(|e| e.class == Class::Crash)
        {
            v.add_case_finding(Class::Crash, e.detail.clone().unwrap_or_default());
        }
        return v;
    }
    for o in check_case(
        kernel,
        case,
        &j.verdict,
        FirstRun::of(&j),
        plan.only(property),
    ) {
        if let Outcome::Broken(b) = &o.outcome {
            add_break(&mut v, o.property, b);
        }
    }
    v
}

/// The properties a saved case's expected classes name (a property finding's file).
pub fn expected_properties(classes: &[Class]) -> Vec<Property> {
    Property::ALL
        .into_iter()
        .filter(|p| classes.contains(&p.class()))
        .collect()
}

/// Re-checks `property` on a saved case (`replay`, selftest): the verdict of [`judge`]
/// with the checks of a required property (2 runs; the sequence alone and reversed).
pub fn replay(
    kernel: &dyn Kernel,
    case: &Case,
    property: Property,
    oracle: &OracleConfig,
) -> Verdict {
    let plan = Plan {
        repeat: DEFAULT_REPEAT,
        batch: true,
    };
    judge(kernel, case, property, oracle, plan)
}

/// The property a planted-bug kernel name breaks (`cpu:bug-batch-variant`), if any.
pub fn broken_by_plant(kernel: &str) -> Option<Property> {
    let (_, bugs) = kernel.split_once(":bug-")?;
    crate::kernel::Plant::parse_set(bugs)?
        .into_iter()
        .find_map(|p| p.breaks_property())
        .and_then(Property::parse)
}

/// Runs `case` once more, judged on the device for its rows' digests only (the output
/// stays there); `read_only`: the first run's cache was read-only, so this one's is
/// where its size allows.
pub(crate) fn rerun_digests(
    kernel: &dyn Kernel,
    case: &Case,
    read_only: bool,
) -> Result<Vec<u64>, RunError> {
    if let Some(why) = kernel.capabilities().rejects(case) {
        return Err(RunError::Skipped(why));
    }
    let req = DeviceJudgeRequest {
        read_only_cache: read_only && crate::kernel::CacheCheck::current().read_only_for(case),
        ..DeviceJudgeRequest::digests(kernel.capabilities().scale_placement)
    };
    let mut out = kernel.output_for_judged(case);
    let run = kernel.run_judged(case, &req, &mut out)?;
    if run.judgement.row_digests.len() != case.rows() {
        return Err(RunError::Crash(format!(
            "the device gave {} row digests for {} rows",
            run.judgement.row_digests.len(),
            case.rows()
        )));
    }
    Ok(run.judgement.row_digests)
}

/// Runs `case` once more into a fresh output (the harness's poisoned, guarded buffer).
pub(crate) fn rerun(kernel: &dyn Kernel, case: &Case) -> Result<OutputBuffer, RunError> {
    if let Some(why) = kernel.capabilities().rejects(case) {
        return Err(RunError::Skipped(why));
    }
    let mut out = kernel.output_for(case);
    kernel.run(case, &mut out)?;
    Ok(out)
}

/// Bitwise comparison of rows: `pairs` maps a row of `a` to a row of `b`, `len` is the
/// valid length of those rows. Folds into `acc` (first difference, counts, spread).
pub(crate) fn compare_rows(
    acc: &mut Diff,
    a: &OutputBuffer,
    b: &OutputBuffer,
    pairs: impl Iterator<Item = (usize, usize, usize)>,
) {
    for (ra, rb, len) in pairs {
        let (xa, xb) = (a.row(ra), b.row(rb));
        let len = len.min(xa.len()).min(xb.len());
        for t in 0..len {
            let (x, y) = (xa[t], xb[t]);
            if x.to_bits() == y.to_bits() {
                continue;
            }
            acc.differing += 1;
            if acc.first.is_none() {
                acc.first = Some((ra, t, x, y));
            }
            if x.is_finite() && y.is_finite() {
                acc.max_abs = acc.max_abs.max((x as f64 - y as f64).abs());
                if x.is_sign_negative() == y.is_sign_negative() {
                    let d = (x.to_bits() as i64 - y.to_bits() as i64).unsigned_abs();
                    acc.max_ulps = acc.max_ulps.max(d);
                }
            } else {
                acc.max_abs = f64::INFINITY;
            }
        }
    }
}

/// Differences found so far between two outputs.
#[derive(Clone, Debug, Default)]
pub(crate) struct Diff {
    pub differing: u64,
    /// Row and position (of the first output), and both values.
    pub first: Option<(usize, usize, f32, f32)>,
    pub max_abs: f64,
    pub max_ulps: u64,
}

impl Diff {
    pub fn spread_words(&self) -> String {
        let abs = if self.max_abs.is_finite() {
            format!("{:.3e}", self.max_abs)
        } else {
            "inf (a non-finite value differs)".into()
        };
        format!("largest difference {abs}, {} ulp", self.max_ulps)
    }
}

pub(crate) fn show(x: f32) -> String {
    show_f32(x)
}

/// One kernel's tally of one property over a campaign (report.json
/// `per_kernel.<k>.properties`; documented in `reports/README.md`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct PropertyTally {
    /// Cases the property was checked on (held + broken).
    pub checked: u64,
    pub held: u64,
    pub broken: u64,
    /// Cases where it could not be checked (one sequence, a crash), by reason.
    pub skipped: u64,
    pub skip_reasons: std::collections::BTreeMap<String, u64>,
    /// Extra kernel runs made for it.
    pub runs: u64,
    /// The first violation in words (kernel row, position, values, spread).
    pub first_break: Option<String>,
}

/// Both properties of one kernel.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct PropertyStats {
    /// Runs per case of the determinism check (0: never checked).
    pub repeat: u32,
    pub deterministic: PropertyTally,
    pub batch_invariant: PropertyTally,
}

impl PropertyStats {
    pub fn tally(&self, p: Property) -> &PropertyTally {
        match p {
            Property::Deterministic => &self.deterministic,
            Property::BatchInvariant => &self.batch_invariant,
        }
    }

    fn tally_mut(&mut self, p: Property) -> &mut PropertyTally {
        match p {
            Property::Deterministic => &mut self.deterministic,
            Property::BatchInvariant => &mut self.batch_invariant,
        }
    }

    /// Counts one case's outcomes (`plan`: what was checked).
    pub fn record(&mut self, plan: Plan, outcomes: &[PropertyOutcome]) {
        if plan.repeat >= 2 {
            self.repeat = self.repeat.max(plan.repeat);
        }
        for o in outcomes {
            let t = self.tally_mut(o.property);
            t.runs += o.runs;
            match &o.outcome {
                Outcome::Held => {
                    t.checked += 1;
                    t.held += 1;
                }
                Outcome::Broken(b) => {
                    t.checked += 1;
                    t.broken += 1;
                    t.first_break.get_or_insert_with(|| b.detail.clone());
                }
                Outcome::Skipped(why) => {
                    t.skipped += 1;
                    *t.skip_reasons.entry(why.clone()).or_default() += 1;
                }
            }
        }
    }

    /// Folds `b` into `self` (shards; counts read from files: sums saturate). Field-by-field sums, like `KernelStats`'s `+=`:
    /// deliberate boilerplate (each struct merges its own fields).
    pub fn merge(&mut self, b: &PropertyStats) {
        self.repeat = self.repeat.max(b.repeat);
        for p in Property::ALL {
            let (x, y) = (self.tally_mut(p), b.tally(p));
            x.checked = x.checked.saturating_add(y.checked);
            x.held = x.held.saturating_add(y.held);
            x.broken = x.broken.saturating_add(y.broken);
            x.skipped = x.skipped.saturating_add(y.skipped);
            x.runs = x.runs.saturating_add(y.runs);
            for (k, n) in &y.skip_reasons {
                let c = x.skip_reasons.entry(k.clone()).or_default();
                *c = c.saturating_add(*n);
            }
            if x.first_break.is_none() {
                x.first_break = y.first_break.clone();
            }
        }
    }

    /// Whether any property was checked or tried.
    pub fn any(&self) -> bool {
        Property::ALL.iter().any(|&p| {
            let t = self.tally(p);
            t.checked.saturating_add(t.skipped) > 0
        })
    }
}

/// The verdict line of one property of one kernel, e.g. `cuda:tiled: bitwise
/// deterministic on 120/120 cases (2 runs each)` or `cpu:bug-batch-variant: NOT
/// batch-invariant on 7/31 cases ...`; `None` when it was not checked.
pub fn verdict_line(
    kernel: &str,
    stats: &PropertyStats,
    p: Property,
    required: bool,
) -> Option<String> {
    let t = stats.tally(p);
    if t.checked.saturating_add(t.skipped) == 0 {
        return None;
    }
    let how = match p {
        Property::Deterministic => format!("{} runs each", stats.repeat.max(2)),
        Property::BatchInvariant => {
            "a sequence alone and the batch reversed, same physical blocks".to_string()
        }
    };
    let words = match p {
        Property::Deterministic => "bitwise deterministic",
        Property::BatchInvariant => "batch-invariant",
    };
    let skipped = if t.skipped > 0 {
        let reasons: Vec<String> = t
            .skip_reasons
            .iter()
            .map(|(r, n)| format!("{r}: {n}"))
            .collect();
        format!("; {} not checked ({})", t.skipped, reasons.join(", "))
    } else {
        String::new()
    };
    let g = crate::util::group;
    Some(if t.broken == 0 {
        format!(
            "{kernel}: {words} on {}/{} cases ({how}){skipped}",
            g(t.held),
            g(t.checked)
        )
    } else {
        format!(
            "{kernel}: NOT {words} on {}/{} cases ({how}){}; first: {}{skipped}",
            g(t.broken),
            g(t.checked),
            if required {
                ", required (findings)"
            } else {
                "; not required (--require makes it a finding)"
            },
            t.first_break.as_deref().unwrap_or("?")
        )
    })
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
