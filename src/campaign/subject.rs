//! What the finding book files: a failure of a [`Subject`] (one kernel, or a pair that
//! disagrees), which it can run again on a candidate case (shrinking, ablation) and
//! whose output it keeps as [`Evidence`] for the finding's picture.

use super::engine::{divergent_verdict, diverges, pair_name, Engine};
use super::progress::Progress;
use crate::case::Case;
use crate::generate::Recipe;
use crate::harness::{self, ReferenceCache};
use crate::kernel::{Capabilities, Kernel, OutputBuffer};
use crate::oracle::Verdict;
use crate::reference::Reference;
use crate::report::Timings;
use std::time::Instant;

/// What failed: one kernel, or two kernels that disagree (a divergence).
#[derive(Clone, Copy)]
pub(super) enum Subject<'k> {
    Kernel(&'k dyn Kernel),
    Pair(&'k dyn Kernel, &'k dyn Kernel),
    /// A required property of one kernel (`--require`): judged by its property check.
    Property(&'k dyn Kernel, crate::property::Property),
}

impl Subject<'_> {
    pub fn name(&self) -> String {
        match self {
            Subject::Kernel(k) | Subject::Property(k, _) => k.name().to_string(),
            Subject::Pair(a, b) => pair_name(a.name(), b.name()),
        }
    }

    pub fn kernels(&self) -> Vec<&str> {
        match self {
            Subject::Kernel(k) | Subject::Property(k, _) => vec![k.name()],
            Subject::Pair(a, b) => vec![a.name(), b.name()],
        }
    }

    /// Runs and judges a candidate case (a divergence: runs both and compares), with
    /// the output it judged.
    pub fn judge(&self, engine: &Engine, case: &Case) -> (Verdict, Option<Evidence>) {
        match self {
            Subject::Kernel(k) => {
                let mut refs = ReferenceCache::new(case);
                let j = harness::run_and_judge(*k, case, &mut refs, &engine.cfg.oracle);
                let evidence = j.output.map(|out| Evidence::new(*k, out, refs));
                (j.verdict, evidence)
            }
            Subject::Pair(a, b) => {
                let (msg, evidence) = diverges(&engine.cfg.oracle, *a, *b, case);
                (
                    msg.map(|m| divergent_verdict(&m)).unwrap_or_default(),
                    evidence,
                )
            }
            // A property finding's picture would show only the oracle's classes.
            Subject::Property(k, p) => {
                let plan = engine.property_plan(*k);
                let v = crate::property::judge(*k, case, *p, &engine.cfg.oracle, plan);
                (v, None)
            }
        }
    }
}

/// A judged output with the reference it was judged against: what a finding's picture
/// is drawn from, by the oracle's own element scan.
pub(super) struct Evidence {
    caps: Capabilities,
    output: OutputBuffer,
    reference: Reference,
}

impl Evidence {
    pub fn new(kernel: &dyn Kernel, output: OutputBuffer, refs: ReferenceCache) -> Evidence {
        let caps = kernel.capabilities().clone();
        let reference = refs.into_reference(caps.scale_placement);
        Evidence {
            caps,
            output,
            reference,
        }
    }

    /// The class map and error histogram of `case` (the case this output is of).
    pub fn draw(&self, case: &Case) -> (crate::report::ClassMap, Vec<u64>) {
        crate::oracle::picture::draw(case, &self.reference, &self.caps, &self.output)
    }
}

/// An ablation run's answer ([`ablate`]): the failure still shows, the case is clean,
/// or neither (skipped, or another failure that may hide this one).
pub(super) fn ablation_outcome(v: &Verdict, keep: &dyn Fn(&Verdict) -> bool) -> Option<bool> {
    if v.skipped.is_some() {
        None
    } else if keep(v) {
        Some(true)
    } else if v.is_clean() {
        Some(false)
    } else {
        None
    }
}

/// One failing case to file.
pub(super) struct Failure {
    pub recipe: Recipe,
    pub case: Case,
    pub verdict: Verdict,
    /// The campaign case `(k, seed)` it came from; `None` for a case that cannot be
    /// regenerated from a seed (met while shrinking another), which is not shrunk.
    pub origin: Option<(u64, u64)>,
    /// For a case met while shrinking: the campaign case whose shrinking met it (for
    /// the corpus file's note).
    pub parent: Option<(u64, u64)>,
    /// Seconds its subject took to run and judge it (0 when not known): the guess for
    /// the first shrink step, which is not started when it would overrun the grant.
    pub run_secs: f64,
}

/// What the campaign lends the book for one failure.
pub(super) struct Ctx<'a, 'e> {
    pub engine: &'a Engine<'e>,
    pub progress: &'a mut Progress,
    pub timings: &'a mut Timings,
    /// What shrinking may still use.
    pub allowance: &'a mut super::allowance::Allowance,
    /// Generated cases so far (for detections).
    pub generated: u64,
    pub started: Instant,
    pub deadline: Option<Instant>,
}

/// Localises a new crash (or, on request, unwritten) finding of `kernel` under
/// compute-sanitizer from its saved case, and records the outcome on it: the first
/// error record, or why there is none.
pub(super) fn localise(
    ctx: &mut Ctx,
    finding: &mut crate::report::Finding,
    kernel: &dyn crate::kernel::Kernel,
) {
    use crate::finding::sanitizer;
    let Some(class) = finding.class else {
        return;
    };
    let file = finding.case_file.as_deref().map(std::path::Path::new);
    match sanitizer::localise(&ctx.engine.cfg.sanitize, class, kernel, file) {
        Ok(None) => {}
        Ok(Some(l)) => {
            ctx.progress
                .println(&format!("  localised: {}", l.sentence()));
            finding.localisation = Some(l);
        }
        Err(why) => {
            ctx.progress.println(&format!("  not localised: {why}"));
            finding.localisation_skipped = Some(why);
        }
    }
}
