//! A finding's identity. [`Signature`] = kernel + class + (for a crash) normalised
//! reason + [`Trigger`]; the trigger is found by [`ablate`] on the shrunk case, and
//! the [`Tier`] follows from it. This is where a finding gets its identity: the
//! campaign computes a `Signature` for every shrunk failure and files the finding
//! under [`Signature::key`].

use super::feature::{features_of, Feature, Tier};
use super::reason::crash_reason;
use crate::case::Case;
use crate::generate::Recipe;
use crate::oracle::{Class, Verdict};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// The necessary features of a shrunk failing case, with the recipe they were read
/// from (for the sentences).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Trigger {
    pub features: Vec<Feature>,
    /// "KV byte offset ≥ 2^32", one per feature.
    pub sentences: Vec<String>,
    /// False when the ablation ran out of budget before trying every feature: a
    /// feature not listed may still be needed.
    pub complete: bool,
    /// Where the failure reproduces ([`ablate`]): `None` until checked, then the
    /// least benign tier the check needed.
    pub checked_tier: Option<Tier>,
    /// The failing case itself ran clean on a re-run ([`ablate`]'s control runs): the
    /// failure does not depend on the case alone (a worker that aborts every n-th
    /// request, a race), so no feature is called necessary.
    #[serde(default)]
    pub flaky: bool,
    /// Why no ablation ran at all (`--no-shrink`, no saved recipe): said instead of
    /// "cut short".
    #[serde(default)]
    pub not_ablated: Option<String>,
}

impl Trigger {
    /// No trigger, because no ablation ran, for the reason `why`.
    pub fn not_ablated(why: &str) -> Trigger {
        Trigger {
            not_ablated: Some(why.to_string()),
            ..Trigger::default()
        }
    }

    /// The trigger of `recipe` made of `features` (implied weaker features dropped).
    pub fn new(recipe: &Recipe, mut features: Vec<Feature>, complete: bool) -> Trigger {
        let all = features.clone();
        features.retain(|f| !f.implied_by().is_some_and(|s| all.contains(&s)));
        // A feature whose benign form also takes away another needed one (which in
        // its own benign form keeps the first) was called needed for that other one:
        // the ablation cannot tell them apart, and the other names the bug. next_n ≥ 2
        // when next_n ≥ 3 is needed; a batch's next_n when its rows only carry a
        // production logits buffer (`[B·next_n, max_model_len]`) past 2 GiB.
        let takes_away =
            |f: &Feature, g: &Feature| f != g && g.present(recipe) && !g.present(&f.benign(recipe));
        features.retain(|f| !all.iter().any(|g| takes_away(f, g) && !takes_away(g, f)));
        // A block size or a stride whose benign form only moves the blocks' (or rows')
        // byte offsets below the band is not a trigger of its own when the offset band
        // is: "needs: KV byte offset ≥ 2^32" names the bug, whatever carried the blocks
        // there (a padded stride in a layout case, a slab stride in an engine pool).
        let kv_offset = all
            .iter()
            .any(|f| matches!(f, Feature::KvOffset2g | Feature::KvOffset4g));
        let out_offset = all.contains(&Feature::OutOffset2g);
        features.retain(|f| match f {
            Feature::BlockSize | Feature::PaddedKvStride => !kv_offset,
            Feature::PaddedOutStride => !out_offset,
            _ => true,
        });
        Trigger {
            sentences: features.iter().map(|f| f.sentence(recipe)).collect(),
            features,
            complete,
            checked_tier: None,
            flaky: false,
            not_ablated: None,
        }
    }

    /// The finding's tier: the most benign domain in which the shrunk failure still
    /// reproduces. [`ablate`] rewrites every feature outside the trigger whose tier is
    /// less benign than the trigger's into its benign form, all at once, and re-runs:
    /// when the failure still shows, the tier is the trigger's (the least benign tier
    /// among its features; `production` for a bug that needs nothing special); when it
    /// does not, the least benign tier of every feature the case has. Unchecked: the
    /// trigger's when the ablation was complete; when it was cut short (budget spent),
    /// a feature not tried may be needed, so the case's own least benign tier (a bug
    /// whose ablation was cut short is never credited to a more benign tier than its
    /// case shows).
    pub fn tier(&self, recipe: &Recipe) -> Tier {
        self.checked_tier.unwrap_or_else(|| match self.complete {
            true => tier_of(&self.features, recipe),
            false => tier_of(&features_of(recipe), recipe),
        })
    }

    /// `needs: KV byte offset ≥ 2^32; block size 1`, or `needs nothing special`; an
    /// incomplete trigger says so.
    pub fn sentence(&self) -> String {
        match (self.sentences.is_empty(), self.complete) {
            (true, true) => "needs nothing special".into(),
            (false, true) => format!("needs: {}", self.sentences.join("; ")),
            (true, false) if self.flaky => {
                "trigger not determined (the case does not fail on every run)".into()
            }
            (true, false) => match &self.not_ablated {
                Some(why) => format!("trigger not determined ({why})"),
                None => "trigger not determined (ablation cut short)".into(),
            },
            (false, false) => format!(
                "needs at least: {} (ablation cut short)",
                self.sentences.join("; ")
            ),
        }
    }
}

/// The least benign tier among `features` (`production` for none).
fn tier_of(features: &[Feature], recipe: &Recipe) -> Tier {
    features
        .iter()
        .map(|f| f.tier(recipe))
        .max()
        .unwrap_or(Tier::Production)
}

/// Who a finding is: the kernel, the class, the crash reason and the trigger.
#[derive(Clone, Debug, PartialEq)]
pub struct Signature {
    pub kernel: String,
    pub class: Class,
    /// The normalised crash reason ([`super::reason`]); `None` unless a crash.
    pub reason: Option<String>,
    pub trigger: Vec<Feature>,
}

impl Signature {
    /// The signature's string: `kernel|class[|reason][|needs:a+b]`. Stable across runs,
    /// so `diff` and `merge` compare findings of different reports by it.
    pub fn key(&self) -> String {
        let mut s = format!("{}|{}", self.kernel, self.class.name());
        if let Some(r) = &self.reason {
            s.push('|');
            s.push_str(r);
        }
        if !self.trigger.is_empty() {
            let names: Vec<&str> = self.trigger.iter().map(|f| f.name()).collect();
            s.push_str("|needs:");
            s.push_str(&names.join("+"));
        }
        s
    }
}

/// A finding as the "same bug?" question reads it: who failed and how, what ablation
/// found it needs, and what its case has. The campaign asks it of a known finding and
/// a newly failing case (`campaign::book`, `campaign::known_crash`); `diff` asks it of a
/// base report's finding and a candidate's (`report::fold`).
#[derive(Clone, Copy, Debug)]
pub struct BugFacts<'a> {
    pub kernel: &'a str,
    pub class: Class,
    /// The normalised crash reason (crashes only).
    pub reason: Option<&'a str>,
    /// The features ablation found necessary (none: nothing special, or not ablated).
    pub trigger: &'a [Feature],
    /// Whether that ablation ran to its end (false for a case not ablated at all).
    pub complete: bool,
    /// Every feature its case has (the trigger's among them).
    pub features: &'a [Feature],
}

/// Whether `known`'s bug explains `other`: a campaign that knows `known` counts a
/// failure like `other` as an occurrence of it, not as a new finding. Same kernel and
/// crash reason, classes of one bug ([`same_bug_classes`]), `other`'s case has every
/// feature `known` needs (itself or a stronger one), and `other`'s own ablation does
/// not show it is another bug ([`shown_apart`]).
pub fn explains(known: &BugFacts, other: &BugFacts) -> bool {
    known.kernel == other.kernel
        && known.reason == other.reason
        && same_bug_classes(known.class, other.class, !known.trigger.is_empty())
        && super::feature::trigger_within(known.trigger, other.features)
        && !shown_apart(known, other)
}

/// Whether `other`'s complete ablation shows it is not `known`'s bug. Each feature of
/// its trigger is needed: taking it away made its case clean, so `known`'s bug, were it
/// this one, would need that feature too. What `known` can need: its trigger when its
/// ablation was complete (so one that needs nothing special is apart from any `other`
/// that needs something); when cut short or never run, no more than the features its
/// own failing case has. A `known` with no recorded case features (a report or corpus
/// file without them) shows nothing: it could need anything.
pub fn shown_apart(known: &BugFacts, other: &BugFacts) -> bool {
    if !other.complete || other.trigger.is_empty() {
        return false;
    }
    if known.complete {
        known.trigger.is_empty()
    } else {
        !known.features.is_empty() && !super::feature::trigger_within(other.trigger, known.features)
    }
}

/// Whether findings of classes `a` and `b` can be one bug: the same class; or, when
/// both need something special (`special`: their triggers are not empty), two value
/// classes (`mismatch`, `nan`, `inf`, `unwritten`): a wrapped offset reads poisoned bytes (nan) in one case and
/// another block's values (mismatch) in the next, and one 2-D-lengths bug shows as
/// mismatch, unwritten and nan. Crashes and contract classes stay apart.
pub fn same_bug_classes(a: Class, b: Class, special: bool) -> bool {
    let value = |c: Class| {
        matches!(
            c,
            Class::Mismatch | Class::Nan | Class::Inf | Class::Unwritten
        )
    };
    a == b || (special && value(a) && value(b))
}

/// Whether `v` still shows the failure: the class and, for a crash, the same reason.
/// This is what shrinking and ablation keep (a step that shows another crash reason
/// is another bug).
pub fn shows(v: &Verdict, class: Class, reason: Option<&str>) -> bool {
    v.classes.contains_key(&class)
        && (class != Class::Crash || reason.is_none() || crash_reason(v).as_deref() == reason)
}

/// Value draws a benign form is tried with before its feature counts as necessary:
/// rewriting one feature redraws the case's values and block ids, and a small shrunk
/// case (one or two tokens) can lose its failure to an unlucky draw (no negative scale
/// on a valid token, no block past 2^32) rather than to the feature. A feature that
/// is not needed costs one run; a needed one costs all of them.
const ABLATION_DRAWS: u64 = 16;

/// Re-runs of the failing case itself before any feature is ablated: a failure that
/// does not show on each of them does not depend on the case alone, and ablating it
/// would call features necessary by chance (a benign form that happened to run clean).
const CONTROL_RUNS: u32 = 2;

/// A guess of how long judging a case takes, from the last judged case's time per unit
/// of [`RunCost::work`]: shrinking and ablation do not start a run they expect to end
/// past their time (a candidate can be far larger than the case before it: another
/// alternative of the profile, a production server).
#[derive(Clone, Copy, Debug, Default)]
pub struct RunCost {
    secs_per_work: f64,
    /// The longest run recorded (what a cap can be overrun by, at most, per job).
    longest_secs: f64,
}

impl RunCost {
    /// What judging `c` costs, roughly: its output (allocated, poisoned, scanned) and
    /// its dot products.
    pub fn work(c: &Case) -> f64 {
        let tokens: usize = (0..c.shape.batch).map(|b| c.seq_tokens(b)).sum();
        (c.rows() * c.out_row_stride.max(1)) as f64
            + (tokens * c.shape.next_n * c.shape.heads * c.shape.head_dim) as f64 / 8.0
            + 1.0
    }

    /// The time a run judging `c` took (a shrink or ablation run, a generated case).
    pub fn record(&mut self, c: &Case, took: Duration) {
        self.calibrate(c, took);
        self.longest_secs = self.longest_secs.max(took.as_secs_f64());
    }

    /// The time judging `c` took outside shrinking (the failing case's own run): a
    /// guide for the next guess, not a run of its own.
    pub fn calibrate(&mut self, c: &Case, took: Duration) {
        self.secs_per_work = took.as_secs_f64() / Self::work(c);
    }

    /// The longest run recorded.
    pub fn longest(&self) -> Duration {
        Duration::from_secs_f64(self.longest_secs)
    }

    /// The time judging `c` should take.
    pub fn guess(&self, c: &Case) -> Duration {
        Duration::from_secs_f64(self.secs_per_work * Self::work(c))
    }
}

/// `recipe` with value draw `draw` of its seed, materialised, and how long that took.
fn drawn(recipe: Recipe, draw: u64) -> (Case, Duration) {
    let t0 = Instant::now();
    let case = recipe
        .with(|k| k.seed ^= draw.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .materialize();
    (case, t0.elapsed())
}

/// Ablation: for each feature `recipe` has, its benign form is materialised and run
/// (`still_fails`: `Some(true)` the failure still shows, `Some(false)` the case is
/// clean, `None` inconclusive: the kernel skips the rewritten case, or it fails in
/// another way that may hide this failure). A feature is necessary when its benign
/// form shows the failure under none of [`ABLATION_DRAWS`] value draws and at least
/// one draw is clean. Stops
/// before a run that would end past `deadline` (the trigger is then marked incomplete):
/// `cost` guesses each run's time from the last one's and learns from each. Returns the
/// trigger and the runs made.
pub fn ablate(
    recipe: &Recipe,
    still_fails: &mut dyn FnMut(&Case) -> Option<bool>,
    deadline: Instant,
    cost: &mut RunCost,
) -> (Trigger, u32) {
    let mut needed = Vec::new();
    let mut runs = 0;
    let mut complete = true;
    let case = recipe.materialize();
    let out_of_time = |c: &Case, cost: &RunCost| {
        Instant::now() + cost.guess(c) >= deadline || crate::interrupt::requested()
    };
    // A run's time counts its case's materialisation (`made`) with its judging.
    let mut still_fails = |c: &Case, made: Duration, cost: &mut RunCost| {
        let t0 = Instant::now();
        let r = still_fails(c);
        cost.record(c, made + t0.elapsed());
        r
    };
    for _ in 0..CONTROL_RUNS {
        if out_of_time(&case, cost) {
            return (Trigger::new(recipe, Vec::new(), false), runs);
        }
        runs += 1;
        if still_fails(&case, Duration::ZERO, cost) == Some(false) {
            let mut t = Trigger::new(recipe, Vec::new(), false);
            t.flaky = true;
            return (t, runs);
        }
    }
    'features: for f in features_of(recipe) {
        let benign = f.benign(recipe);
        let mut clean = false;
        for draw in 0..ABLATION_DRAWS {
            if crate::interrupt::requested() || Instant::now() >= deadline {
                complete = false;
                break 'features;
            }
            let (case, made) = drawn(benign.clone(), draw);
            if out_of_time(&case, cost) {
                complete = false;
                break 'features;
            }
            if case.validate().is_err() {
                continue 'features;
            }
            runs += 1;
            match still_fails(&case, made, cost) {
                Some(false) => clean = true,
                Some(true) => continue 'features,
                None => {}
            }
        }
        if clean {
            needed.push(f);
        }
    }
    let mut trigger = Trigger::new(recipe, needed.clone(), complete);
    // The tier check: everything outside the trigger that lies in a less benign tier
    // than the trigger's, rewritten at once.
    let want = tier_of(&needed, recipe);
    let mut joint = recipe.clone();
    let mut rewritten = false;
    for f in features_of(recipe) {
        if !needed.contains(&f) && f.tier(recipe) > want && f.present(&joint) {
            joint = f.benign(&joint);
            rewritten = true;
        }
    }
    if !rewritten {
        trigger.checked_tier = Some(want);
    } else if complete {
        for draw in 0..ABLATION_DRAWS {
            let (case, made) = drawn(joint.clone(), draw);
            if out_of_time(&case, cost) || case.validate().is_err() {
                break;
            }
            runs += 1;
            if still_fails(&case, made, cost) == Some(true) {
                trigger.checked_tier = Some(want);
                break;
            }
        }
        if trigger.checked_tier.is_none() && Instant::now() < deadline {
            let all = features_of(recipe);
            trigger.checked_tier = Some(tier_of(&all, recipe));
        }
    }
    (trigger, runs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::recipe::ValueKind;

    #[test]
    fn a_known_bug_explains_cases_with_its_trigger_but_not_a_bug_shown_to_need_more() {
        use Feature::*;
        let facts = |trigger, complete, features| BugFacts {
            kernel: "k",
            class: Class::Crash,
            reason: Some("illegal memory access"),
            trigger,
            complete,
            features,
        };
        let known = facts(&[KvOffset4g], true, &[KvOffset4g]);
        // A case with the trigger (its stronger form counts too), ablated or not.
        assert!(explains(
            &known,
            &facts(&[], false, &[KvOffset4g, BlockSize])
        ));
        let weaker = facts(&[KvOffset2g], true, &[KvOffset2g]);
        assert!(explains(&weaker, &facts(&[], false, &[KvOffset4g])));
        // Without it: another bug; with another reason or kernel: another bug.
        assert!(!explains(&known, &facts(&[], false, &[BlockSize])));
        let other_reason = BugFacts {
            reason: Some("misaligned address"),
            ..facts(&[], false, &[KvOffset4g])
        };
        assert!(!explains(&known, &other_reason));
        // Needs nothing (complete) explains any case, but not one whose complete
        // ablation showed it needs something; cut short, it proves nothing.
        let nothing = facts(&[], true, &[]);
        assert!(explains(&nothing, &facts(&[], false, &[BlockSize])));
        assert!(!explains(
            &nothing,
            &facts(&[BlockSize], true, &[BlockSize])
        ));
        assert!(explains(
            &nothing,
            &facts(&[BlockSize], false, &[BlockSize])
        ));
        // Cut short or never ablated, a bug needs no more than its case has: a case
        // without block size 1 failing does not explain a bug shown to need it, a case
        // with it may; with no case features recorded, anything may be needed.
        let cut_short = facts(&[], false, &[HostileValues]);
        assert!(!explains(
            &cut_short,
            &facts(&[BlockSize], true, &[BlockSize, HostileValues])
        ));
        assert!(explains(
            &cut_short,
            &facts(&[HostileValues], true, &[BlockSize, HostileValues])
        ));
        assert!(explains(
            &cut_short,
            &facts(&[BlockSize], false, &[BlockSize, HostileValues])
        ));
        let at_least = facts(&[KvOffset4g], false, &[KvOffset4g, BlockSize]);
        assert!(explains(
            &at_least,
            &facts(&[KvOffset4g, BlockSize], true, &[KvOffset4g, BlockSize])
        ));
        assert!(!explains(
            &at_least,
            &facts(
                &[KvOffset4g, HostileValues],
                true,
                &[KvOffset4g, HostileValues]
            )
        ));
        assert!(explains(
            &facts(&[], false, &[]),
            &facts(&[BlockSize], true, &[BlockSize])
        ));
    }

    /// An ablation cut short before it tried anything claims no trigger and no benign
    /// tier: a hostile-valued case stays hostile, and the sentence says why; a complete
    /// ablation that found nothing needed is "needs nothing special", production.
    #[test]
    fn a_cut_short_ablation_keeps_the_case_tier() {
        let mut r = Recipe::small(vec![5, 9], 1, 1);
        r.knobs.values = ValueKind::Hostile;
        assert!(features_of(&r).contains(&Feature::HostileValues));
        let (cut, runs) = ablate(
            &r,
            &mut |_| Some(true),
            Instant::now(),
            &mut RunCost::default(),
        );
        assert_eq!(runs, 0);
        assert!(!cut.complete);
        assert_eq!(cut.tier(&r), Tier::Hostile);
        assert_eq!(
            cut.sentence(),
            "trigger not determined (ablation cut short)"
        );
        let done = Trigger::new(&r, Vec::new(), true);
        assert_eq!(done.tier(&r), Tier::Production);
        assert_eq!(done.sentence(), "needs nothing special");
    }

    /// A failure that goes away when its own case is re-run (a worker that aborts every
    /// n-th request) gets no trigger, so its findings share one identity; a case that
    /// fails every time is ablated as before.
    #[test]
    fn a_failure_that_does_not_repeat_on_its_own_case_gets_no_trigger() {
        let r = Recipe::small(vec![5, 9], 1, 1);
        let far = Instant::now() + std::time::Duration::from_secs(60);
        let mut n = 0;
        let (t, _) = ablate(
            &r,
            &mut |_| {
                n += 1;
                Some(n % 5 == 0)
            },
            far,
            &mut RunCost::default(),
        );
        assert!(t.flaky && !t.complete && t.features.is_empty(), "{t:?}");
        assert_eq!(
            t.sentence(),
            "trigger not determined (the case does not fail on every run)"
        );
        // Deterministic: every benign form runs clean, so every feature is needed.
        let (t, _) = ablate(
            &r,
            &mut |c| Some(*c == r.materialize()),
            far,
            &mut RunCost::default(),
        );
        assert!(!t.flaky && t.complete, "{t:?}");
        assert_eq!(t.features, features_of(&r));
    }

    /// A run that would end past the deadline is not started: after a 50 ms run, with
    /// 30 ms left, ablation stops (it used to start the next run and overrun).
    #[test]
    fn ablation_does_not_start_a_run_it_expects_to_end_past_its_deadline() {
        let r = Recipe::small(vec![5, 9], 1, 1);
        let deadline = Instant::now() + Duration::from_millis(80);
        let mut cost = RunCost::default();
        let (cut, runs) = ablate(
            &r,
            &mut |_| {
                std::thread::sleep(Duration::from_millis(50));
                Some(true)
            },
            deadline,
            &mut cost,
        );
        assert_eq!(runs, 1, "the second run would end at ~100 ms, past 80");
        assert!(!cut.complete);
        let took = cost.guess(&r.materialize());
        assert!(
            took >= Duration::from_millis(50),
            "the run's time is kept: {took:?}"
        );
        assert!(Instant::now() < deadline, "stopped before its deadline");
    }
}
