//! Known crashes kept from eating the budget (`--known-crashes`).
//!
//! A kernel that crashes takes its worker down: each crash costs the fault, the
//! worker's death and a restart (about half a second for DeepGEMM's all-zero-batch
//! crash, against 20 ms for a case that runs), and tells nothing the finding does not
//! already say. A crash finding *predicts* the generated cases that have every feature
//! (DESIGN §6's vocabulary) that all of this campaign's generated cases crashing that way
//! had: its trigger's features and what its occurrences share beyond them (where
//! ablation names too little: a crash that does not follow its trigger every time may
//! follow a benign form once). Only a share of the predicted cases
//! (`--known-crashes`, default [`DEFAULT_SHARE`]), chosen by their seed, are run; the
//! others are counted and not run. A crash predicts nothing until a generated case
//! crashed that way, nor while its occurrences share no feature; it predicts from that
//! case on, before its finding is shrunk and filed (the threads that run cases tell
//! this watch at once, not through the main thread, which may be shrinking).
//!
//! The prediction is watched, not assumed: shared features need not be the cause. The
//! predicted cases that do run must crash the same way; while more than one in
//! [`MISSES_PER_HIT`]` + 1` of them runs otherwise (clean, or another failure), that
//! crash predicts nothing and every case runs. A kernel that skips a case (it cannot
//! run it) teaches nothing.

use crate::finding::signature::{explains, BugFacts};
use crate::finding::{crash_reason, features_of, Feature};
use crate::generate::Recipe;
use crate::oracle::{Class, Verdict};
use crate::report::PredictedCrashes;
use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

/// `--known-crashes`' default: one predicted case in eight still runs.
pub const DEFAULT_SHARE: f64 = 0.125;

/// A crash predicts while its predicted cases that ran crashed that way at least this
/// many times per one that did not.
pub const MISSES_PER_HIT: u64 = 8;

/// A crash finding of the book that may predict cases: kernel, crash reason, trigger.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct KnownCrash {
    /// The finding's signature key (what the report names it by).
    pub signature: String,
    pub kernel: String,
    pub reason: Option<String>,
    /// The features ablation found the crash needs (maybe none).
    pub trigger: Vec<Feature>,
}

struct Watched {
    crash: KnownCrash,
    /// Still a live finding of the book (a finding generalised into another stops
    /// predicting; its counts stay in the report).
    live: bool,
    /// A crash seen on a generated case that no finding explains yet: it predicts while
    /// its finding is shrunk and localised, and the finding of its kernel and reason the
    /// book files next takes over what it learned.
    provisional: bool,
    /// The features every generated case that crashed that way had (`None`: none yet).
    common: Option<Vec<Feature>>,
    counts: PredictedCrashes,
}

impl Watched {
    fn predicts(&self, kernel: &str, feats: &[Feature]) -> bool {
        self.live
            && self.crash.kernel == kernel
            && self
                .common
                .as_ref()
                .is_some_and(|c| !c.is_empty() && c.iter().all(|f| feats.contains(f)))
    }

    /// Whether a crash of `reason` on `kernel`, on a case with `feats`, may be this one.
    fn explains(&self, kernel: &str, reason: &Option<String>, feats: &[Feature]) -> bool {
        let c = &self.crash;
        let facts = |kernel, reason, trigger, features| BugFacts {
            kernel,
            class: Class::Crash,
            reason,
            trigger,
            complete: false,
            features,
        };
        self.live
            && explains(
                &facts(&c.kernel, c.reason.as_deref(), &c.trigger, &c.trigger),
                &facts(kernel, reason.as_deref(), &[], feats),
            )
    }

    /// Seen crashing that way on a generated case, and seldom anything else.
    fn trusted(&self) -> bool {
        let c = &self.counts;
        c.crashed >= 1 && (c.run - c.crashed) * MISSES_PER_HIT <= c.crashed
    }
}

/// The campaign's known crashes: read by the threads that draw cases, kept up to date
/// by the main thread from the finding book and the judged cases.
pub(super) struct KnownCrashes {
    share: f64,
    /// The campaign's kernels, in its order.
    kernels: Vec<String>,
    watched: Mutex<Vec<Watched>>,
}

impl KnownCrashes {
    /// `share` in (0, 1]: the share of predicted cases still run (1: all), for a
    /// campaign of `kernels`.
    pub fn new(share: f64, kernels: Vec<String>) -> KnownCrashes {
        KnownCrashes {
            share: share.clamp(f64::MIN_POSITIVE, 1.0),
            kernels,
            watched: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Watched>> {
        self.watched.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The book's crash findings now (see [`super::book::Book::known_crashes`]): new
    /// ones are watched, ones no longer live stop predicting.
    pub fn learn(&self, now: Vec<KnownCrash>) {
        let mut w = self.lock();
        for x in w.iter_mut().filter(|x| !x.provisional) {
            x.live = now.iter().any(|c| c.signature == x.crash.signature);
        }
        for c in now {
            if w.iter()
                .any(|x| x.crash.signature == c.signature && !x.provisional)
            {
                continue;
            }
            let seen = (w.iter()).position(|x| {
                x.provisional && x.crash.kernel == c.kernel && x.crash.reason == c.reason
            });
            let (common, counts) = match seen {
                Some(i) => {
                    let x = w.remove(i);
                    (x.common, x.counts)
                }
                None => (None, PredictedCrashes::default()),
            };
            w.push(Watched {
                crash: c,
                live: true,
                provisional: false,
                common,
                counts,
            });
        }
    }

    /// Whether generated case `recipe` (of seed `seed`) is run: `Some` (the signature
    /// it is counted under) when every kernel has a trusted prediction for it and its
    /// seed does not fall in the share that still runs.
    pub fn not_run(&self, recipe: &Recipe, seed: u64) -> Option<String> {
        let (mut w, kernels) = (self.lock(), &self.kernels);
        if w.is_empty() || kernels.is_empty() || sampled(seed, self.share) {
            return None;
        }
        let feats = features_of(recipe);
        let mut first = None;
        for k in kernels {
            let i = w
                .iter()
                .position(|x| x.predicts(k, &feats) && x.trusted())?;
            first.get_or_insert(i);
        }
        let x = &mut w[first?];
        x.counts.not_run += 1;
        Some(x.crash.signature.clone())
    }

    /// A generated case that ran (told by the thread that ran it, at once): a crash
    /// narrows what its finding's crashes share (the finding with the largest trigger it
    /// may be; a crash none explains is watched provisionally), and each prediction the
    /// case matches learns whether it held (`verdicts`: each kernel's, in the campaign's
    /// order; a kernel that did not run the case teaches nothing).
    pub fn observe(&self, recipe: &Recipe, verdicts: &[&Verdict]) {
        let (mut w, kernels) = (self.lock(), &self.kernels);
        let feats = features_of(recipe);
        for (k, v) in kernels.iter().zip(verdicts) {
            if v.skipped.is_some() {
                continue;
            }
            let reason = crash_reason(v);
            let mine = (w.iter_mut())
                .filter(|x| reason.is_some() && x.explains(k, &reason, &feats))
                .max_by_key(|x| (x.crash.trigger.len(), !x.provisional));
            if let Some(x) = mine {
                let common = x.common.get_or_insert_with(|| feats.clone());
                common.retain(|f| feats.contains(f));
            } else if let Some(r) = &reason {
                // A crash no finding explains yet: watched from now, not from when its
                // finding is filed (shrinking and memcheck take the main thread seconds).
                w.push(Watched {
                    crash: KnownCrash {
                        signature: format!("{k}|crash|{r} (not yet filed)"),
                        kernel: k.clone(),
                        reason: reason.clone(),
                        trigger: Vec::new(),
                    },
                    live: true,
                    provisional: true,
                    common: Some(feats.clone()),
                    counts: PredictedCrashes::default(),
                });
            }
            for x in w.iter_mut().filter(|x| x.predicts(k, &feats)) {
                x.counts.run += 1;
                if reason.is_some() && reason == x.crash.reason {
                    x.counts.crashed += 1;
                }
            }
        }
    }

    /// Per signature: its predicted cases run, crashed that way, and not run.
    pub fn counts(&self) -> BTreeMap<String, PredictedCrashes> {
        let w = self.lock();
        let mut m: BTreeMap<String, PredictedCrashes> = BTreeMap::new();
        for x in w.iter().filter(|x| x.counts != PredictedCrashes::default()) {
            *m.entry(x.crash.signature.clone()).or_default() += &x.counts;
        }
        m
    }
}

/// Whether a predicted case of `seed` is one of the `share` still run (by its seed, so
/// the same campaign runs the same ones).
fn sampled(seed: u64, share: f64) -> bool {
    if share >= 1.0 {
        return true;
    }
    let u = (crate::util::splitmix64(seed ^ 0x6b6e_6f77_6e63_7273) >> 11) as f64;
    u < share * (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle::Class;

    fn zero_batch() -> Recipe {
        Recipe::small(vec![0; 32], 2, 1)
    }

    fn crash(signature: &str, trigger: Vec<Feature>) -> KnownCrash {
        KnownCrash {
            signature: signature.into(),
            kernel: "k".into(),
            reason: Some("illegal memory access".into()),
            trigger,
        }
    }

    fn crashed() -> Verdict {
        let mut v = Verdict::default();
        v.add_case_finding(Class::Crash, "CUDA error: an illegal memory access".into());
        v
    }

    fn k() -> Vec<String> {
        vec!["k".to_string()]
    }

    /// The seeds of `n` cases, `(run, not run)` by a trusted prediction.
    fn split(known: &KnownCrashes, n: u64) -> (u64, u64) {
        let r = zero_batch();
        let not = (0..n).filter(|&s| known.not_run(&r, s).is_some()).count() as u64;
        (n - not, not)
    }

    #[test]
    fn a_crash_predicts_once_seen_and_then_runs_its_share() {
        let known = KnownCrashes::new(0.125, k());
        known.learn(vec![crash("k|crash|zero", vec![Feature::AllZeroBatch])]);
        // Known, but no generated case seen crashing that way yet: every case runs.
        assert_eq!(split(&known, 100), (100, 0));
        assert!(
            crash_reason(&crashed()).is_some_and(|r| r == "illegal memory access"),
            "{:?}",
            crash_reason(&crashed())
        );
        known.observe(&zero_batch(), &[&crashed()]);
        let (run, not) = split(&known, 4000);
        assert!((380..620).contains(&run), "about 1/8 of 4000 run: {run}");
        // The same seeds, the same choice.
        assert_eq!(split(&known, 4000), (run, not));
        let c = &known.counts()["k|crash|zero"];
        assert_eq!((c.run, c.crashed, c.not_run), (1, 1, 2 * not));
        // A case without the trigger's features is never predicted.
        let busy = Recipe::small(vec![5; 32], 2, 1);
        assert!((0..200).all(|s| known.not_run(&busy, s).is_none()));
        // Share 1: predicted, counted, all run.
        let all = KnownCrashes::new(1.0, k());
        all.learn(vec![crash("k|crash|zero", vec![Feature::AllZeroBatch])]);
        all.observe(&zero_batch(), &[&crashed()]);
        assert_eq!(split(&all, 200), (200, 0));
    }

    #[test]
    fn a_prediction_that_misses_stops_predicting_until_it_holds_again() {
        let known = KnownCrashes::new(0.125, k());
        known.learn(vec![crash("k|crash|zero", vec![Feature::AllZeroBatch])]);
        known.observe(&zero_batch(), &[&crashed()]);
        assert!(split(&known, 100).1 > 0);
        // One predicted case ran clean: one hit against one miss is not enough.
        known.observe(&zero_batch(), &[&Verdict::default()]);
        assert_eq!(split(&known, 100), (100, 0));
        for _ in 0..MISSES_PER_HIT - 2 {
            known.observe(&zero_batch(), &[&crashed()]);
        }
        assert_eq!(split(&known, 100), (100, 0), "7 hits, 1 miss");
        known.observe(&zero_batch(), &[&crashed()]);
        assert!(split(&known, 100).1 > 0, "8 hits, 1 miss");
        // A crash of another reason is a miss too; a skipped run teaches nothing.
        let mut other = Verdict::default();
        other.add_case_finding(Class::Crash, "worker exited".into());
        known.observe(&zero_batch(), &[&other]);
        let skipped = Verdict {
            skipped: Some("not supported".into()),
            ..Verdict::default()
        };
        known.observe(&zero_batch(), &[&skipped]);
        let counts = known.counts();
        let c = &counts["k|crash|zero"];
        assert_eq!((c.run, c.crashed), (10, 8));
        // The other reason, which no finding explains, is watched from its first crash.
        let p = &counts["k|crash|worker exited (not yet filed)"];
        assert_eq!((p.run, p.crashed), (1, 1));
        known.learn(vec![crash("k|crash|zero", vec![Feature::AllZeroBatch])]);
        let w = known.lock();
        assert!(!w[0].trusted() && w[1].provisional && w[1].trusted());
    }

    /// A crash is watched from the generated case it first crashed on, before its
    /// finding is filed (shrinking and memcheck hold the main thread): the finding the
    /// book then files for its kernel and reason takes over what was learned.
    #[test]
    fn a_crash_predicts_before_its_finding_is_filed() {
        let known = KnownCrashes::new(0.125, k());
        known.observe(&zero_batch(), &[&crashed()]);
        known.observe(&zero_batch(), &[&crashed()]);
        assert!(split(&known, 100).1 > 0);
        // A clean case of other features does not touch it.
        known.observe(&Recipe::small(vec![5; 32], 2, 1), &[&Verdict::default()]);
        let key = "k|crash|illegal memory access (not yet filed)";
        assert_eq!(known.counts()[key].run, 2);
        known.learn(vec![crash("k|crash|zero", vec![Feature::AllZeroBatch])]);
        let c = &known.counts()["k|crash|zero"];
        assert_eq!((c.run, c.crashed), (2, 2));
        assert!(!known.counts().contains_key(key));
        assert!(split(&known, 100).1 > 0);
        // Another finding of the same reason later starts from nothing.
        known.learn(vec![
            crash("k|crash|zero", vec![Feature::AllZeroBatch]),
            crash("k|crash|other", vec![Feature::NextN3]),
        ]);
        assert!(!known.counts().contains_key("k|crash|other"));
    }

    #[test]
    fn a_crash_that_needs_nothing_special_predicts_what_its_crashes_share() {
        let known = KnownCrashes::new(0.125, k());
        known.learn(vec![crash("k|crash", Vec::new())]);
        // The first crash: predicts cases with all its features (next_n 2 among them).
        let zero_n1 = Recipe::small(vec![0; 32], 1, 1);
        assert!(features_of(&zero_batch()).contains(&Feature::NextN2));
        known.observe(&zero_batch(), &[&crashed()]);
        assert!(split(&known, 100).1 > 0);
        assert!((0..100).all(|s| known.not_run(&zero_n1, s).is_none()));
        // A crash with next_n 1: what the two share is the all-zero batch.
        known.observe(&zero_n1, &[&crashed()]);
        assert!((0..100).any(|s| known.not_run(&zero_n1, s).is_some()));
        let busy = Recipe::small(vec![5; 32], 1, 1);
        assert!((0..100).all(|s| known.not_run(&busy, s).is_none()));
        // A crash on a batch that is not all zero: the prediction widens to what the
        // three share (the small recipe's strides and padding).
        known.observe(&busy, &[&crashed()]);
        assert!((0..100).any(|s| known.not_run(&busy, s).is_some()));
        // Crashes that share no feature predict nothing.
        let nothing = Watched {
            crash: crash("k|crash", Vec::new()),
            live: true,
            provisional: false,
            common: Some(Vec::new()),
            counts: PredictedCrashes {
                run: 3,
                crashed: 3,
                not_run: 0,
            },
        };
        assert!(nothing.trusted() && !nothing.predicts("k", &features_of(&busy)));
    }

    /// A crash on every all-zero batch of an aligned B (DeepGEMM's), filed with an
    /// empty trigger: its crashes share the aligned batch, so the all-zero batch of 33,
    /// which runs clean, is not predicted and does not spoil the prediction.
    #[test]
    fn a_crash_of_aligned_batches_predicts_only_those() {
        let known = KnownCrashes::new(0.125, k());
        known.learn(vec![crash("k|crash", Vec::new())]);
        let (aligned, unaligned) = (zero_batch(), Recipe::small(vec![0; 33], 2, 1));
        for _ in 0..8 {
            known.observe(&aligned, &[&crashed()]);
            known.observe(&unaligned, &[&Verdict::default()]);
        }
        let c = &known.counts()["k|crash"];
        assert_eq!((c.run, c.crashed), (8, 8));
        let (run, not) = split(&known, 800);
        assert!(not > 600 && run > 50, "{run} run, {not} not");
        assert!((0..200).all(|s| known.not_run(&unaligned, s).is_none()));
    }

    #[test]
    fn a_case_is_left_out_only_when_every_kernel_is_predicted_to_crash() {
        let known = KnownCrashes::new(0.125, k());
        known.learn(vec![crash("k|crash|zero", vec![Feature::AllZeroBatch])]);
        known.observe(&zero_batch(), &[&crashed()]);
        assert!(split(&known, 100).1 > 0);
        // The same crash in a campaign with a second kernel: the case still runs.
        let two = KnownCrashes::new(0.125, vec!["k".to_string(), "other".to_string()]);
        two.learn(vec![crash("k|crash|zero", vec![Feature::AllZeroBatch])]);
        two.observe(&zero_batch(), &[&crashed(), &Verdict::default()]);
        assert_eq!(split(&two, 100), (100, 0));
        // A finding merged into another (no longer live) predicts nothing.
        known.learn(Vec::new());
        assert_eq!(split(&known, 100), (100, 0));
    }
}
