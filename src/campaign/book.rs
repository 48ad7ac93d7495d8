//! The finding book: every failure of a campaign goes through [`Book::file`], which
//! decides which bug it is. A failure that a known finding explains (same kernel, class
//! and crash reason; the case has every feature of the finding's trigger) is one more
//! occurrence. Anything else is shrunk (keeping its class and crash reason), ablated
//! (its [`Trigger`]: the features it needs) and given its [`Signature`]; a signature
//! not yet in the book is a new finding with a corpus file of its own. Failures of
//! another bug met while shrinking are filed the same way, so none is lost.

mod saved;

use super::engine::divergent_verdict;
use super::event::{Event, Source};
use super::save::{replay_command, save_finding, SaveRequest};
use super::shrink::{self, Shrunk};
use super::subject::{ablation_outcome, localise};
pub(super) use super::subject::{Ctx, Evidence, Failure, Subject};
use super::Detection;
use crate::case::Case;
use crate::finding::signature::{explains, same_bug_classes, BugFacts};
use crate::finding::{ablate, crash_reason, features_of, shows, Feature, Signature, Trigger};
use crate::generate::Recipe;
use crate::oracle::{Class, Verdict};
use crate::report::Finding;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

struct Known {
    kernel: String,
    class: Class,
    reason: Option<String>,
    trigger: Vec<Feature>,
    /// Whether the trigger's ablation ran to the end.
    complete: bool,
    index: usize,
}

impl Known {
    /// The finding as the same-bug rule reads it (as the one explaining: its trigger).
    fn facts(&self) -> BugFacts<'_> {
        BugFacts {
            kernel: &self.kernel,
            class: self.class,
            reason: self.reason.as_deref(),
            trigger: &self.trigger,
            complete: self.complete,
            features: &self.trigger,
        }
    }
}

#[derive(Default)]
pub(super) struct Book {
    /// Every finding filed; one merged into another by [`Book::generalise`] stays here
    /// (indices are stable) but is left out of [`Book::into_findings`].
    findings: Vec<Finding>,
    /// `merged_into[i]`: the finding that absorbed finding `i` (itself when live).
    merged_into: Vec<usize>,
    pub detections: Vec<Detection>,
    by_key: HashMap<String, usize>,
    known: Vec<Known>,
    /// Failures already filed, by kernel, class, reason and the case's feature set: the
    /// same raw failure is not shrunk twice.
    raw: HashMap<String, usize>,
    /// The corpus files' signatures not replayed by this campaign ([`saved`]).
    saved: Vec<saved::Saved>,
    /// Failures filed to such a file's finding without shrinking.
    pub known_from_corpus: u64,
}

impl Book {
    /// Distinct bugs so far.
    pub fn distinct(&self) -> usize {
        (0..self.findings.len())
            .filter(|&i| self.merged_into[i] == i)
            .count()
    }

    /// The live finding that index `i` stands for.
    fn live(&self, mut i: usize) -> usize {
        while self.merged_into[i] != i {
            i = self.merged_into[i];
        }
        i
    }

    fn count(&mut self, i: usize) {
        let i = self.live(i);
        self.findings[i].occurrences += 1;
    }

    /// The distinct findings, in the order they were made.
    pub fn into_findings(self) -> Vec<Finding> {
        let merged = self.merged_into;
        self.findings
            .into_iter()
            .enumerate()
            .filter(|(i, _)| merged[*i] == *i)
            .map(|(_, f)| f)
            .collect()
    }

    /// The live crash findings, which may predict cases ([`super::known_crash`]).
    pub fn known_crashes(&self) -> Vec<super::known_crash::KnownCrash> {
        self.known
            .iter()
            .filter(|k| self.merged_into[k.index] == k.index && k.class == Class::Crash)
            .map(|k| super::known_crash::KnownCrash {
                signature: self.findings[k.index].signature.clone(),
                kernel: k.kernel.clone(),
                reason: k.reason.clone(),
                trigger: k.trigger.clone(),
            })
            .collect()
    }

    /// The finding that explains `v` on a case with features `feats`, if any.
    fn explained(&self, name: &str, v: &Verdict, feats: &[Feature]) -> Option<usize> {
        let reason = crash_reason(v);
        v.finding_classes().into_iter().find_map(|c| {
            let r = if c == Class::Crash {
                reason.clone()
            } else {
                None
            };
            let case = BugFacts {
                kernel: name,
                class: c,
                reason: r.as_deref(),
                trigger: &[],
                complete: false,
                features: feats,
            };
            self.known
                .iter()
                .find(|k| self.merged_into[k.index] == k.index && explains(&k.facts(), &case))
                .map(|k| k.index)
        })
    }

    /// Files the failures of a judged case: one per failing kernel, plus a divergence.
    /// Returns whether the case failed at all.
    pub fn on_event(&mut self, ctx: &mut Ctx, ev: &Event) -> bool {
        let Event::Judged {
            source,
            case,
            judgement,
        } = ev;
        let kernels = &ctx.engine.kernels;
        // Every failure of the case: a kernel's own verdict, or the first disagreement.
        let mut failures: Vec<(Subject, Verdict, String, f64)> = Vec::new();
        let secs = |i: usize| rerun_secs(case, judgement, i);
        for (i, (kern, run)) in kernels.iter().zip(&judgement.runs).enumerate() {
            if run.verdict.primary_class().is_some() {
                let line = format!("{} {}", kern.name(), run.verdict);
                let subject = Subject::Kernel(kern.as_ref());
                failures.push((subject, run.verdict.clone(), line, secs(i)));
            }
        }
        if let Some((bi, msg)) = &judgement.divergence {
            let subject = Subject::Pair(kernels[0].as_ref(), kernels[*bi].as_ref());
            let line = format!("{} divergent: {msg}", subject.name());
            failures.push((subject, divergent_verdict(msg), line, secs(0) + secs(*bi)));
        }
        let mut failed = !failures.is_empty();
        for (subject, verdict, line, run_secs) in failures {
            match source {
                Source::Generated(done) => {
                    let g = &done.generated;
                    let failure = Failure {
                        recipe: g.recipe.clone(),
                        case: (*case).clone(),
                        verdict,
                        origin: Some((g.k, g.seed)),
                        parent: None,
                        run_secs,
                    };
                    self.file(ctx, subject, failure);
                }
                Source::Corpus { path, file } => {
                    ctx.progress
                        .println(&format!("corpus {}: {line}", path.display()));
                    self.replayed(ctx, subject, path, file, verdict);
                }
            }
        }
        failed |= self.file_properties(ctx, source, case, judgement);
        failed
    }

    /// Property violations are findings only where required (`--require`): a generated
    /// case's failed checks, and a saved property finding checked again on replay.
    fn file_properties(
        &mut self,
        ctx: &mut Ctx,
        source: &Source,
        case: &Case,
        judgement: &super::engine::Judgement,
    ) -> bool {
        let (engine, mut failed) = (ctx.engine, false);
        for (i, (kern, run)) in engine.kernels.iter().zip(&judgement.runs).enumerate() {
            let props = &engine.cfg.properties;
            match source {
                Source::Generated(done) => {
                    let g = &done.generated;
                    for (p, verdict) in crate::property::required_failures(&run.properties, props) {
                        failed = true;
                        let failure = Failure {
                            recipe: g.recipe.clone(),
                            case: case.clone(),
                            verdict,
                            origin: Some((g.k, g.seed)),
                            parent: None,
                            run_secs: rerun_secs(case, judgement, i),
                        };
                        self.file(ctx, Subject::Property(kern.as_ref(), p), failure);
                    }
                }
                Source::Corpus { path, file } => {
                    let expected = crate::property::expected_properties(&file.expected.classes);
                    for p in expected.into_iter().filter(|p| props.requires(*p)) {
                        let oracle = &engine.cfg.oracle;
                        let v = crate::property::replay(kern.as_ref(), &file.case, p, oracle);
                        if v.classes.contains_key(&p.class()) {
                            failed = true;
                            let subject = Subject::Property(kern.as_ref(), p);
                            self.replayed(ctx, subject, path, file, v);
                        }
                    }
                }
            }
        }
        failed
    }

    /// Files a failure of `subject`: an occurrence of a known bug, or a new finding
    /// (shrunk, ablated, saved). Returns whether it was a new finding.
    pub fn file(&mut self, ctx: &mut Ctx, subject: Subject, f: Failure) -> bool {
        let name = subject.name();
        let Some(class) = f.verdict.primary_class() else {
            return false;
        };
        let feats = features_of(&f.recipe);
        if let Some(i) = self.explained(&name, &f.verdict, &feats) {
            self.count(i);
            return false;
        }
        let reason = if class == Class::Crash {
            crash_reason(&f.verdict)
        } else {
            None
        };
        let raw = format!("{name}|{class}|{reason:?}|{feats:?}");
        if let Some(&i) = self.raw.get(&raw) {
            self.count(i);
            return false;
        }
        if let Some(new) = self.file_as_saved(ctx, &subject, &f, (class, &reason, &feats)) {
            self.raw.insert(raw, new);
            return true;
        }
        let (k, seed) = f.origin.or(f.parent).unwrap_or((0, f.recipe.knobs.seed));
        ctx.progress.println(&format!(
            "finding: {name} {class}{} on {}; shrinking...",
            reason
                .as_deref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default(),
            match f.origin {
                Some(_) => format!("case {k} (seed {seed:#x})"),
                None => "a case met while shrinking another finding".into(),
            }
        ));
        let cfg = ctx.engine.cfg;
        let keep = |v: &Verdict| shows(v, class, reason.as_deref());
        let (mut shrunk, trigger, cut) = shrink::simplify(ctx, &subject, &f, &keep);
        if let Some(cut) = cut {
            ctx.progress
                .println(&format!("  shrinking cut short: {}", cut.words()));
        }
        let sig = Signature {
            kernel: name.clone(),
            class,
            reason: reason.clone(),
            trigger: trigger.features.clone(),
        };
        let key = sig.key();
        let others = std::mem::take(&mut shrunk.others);
        let same = self
            .by_key
            .get(&key)
            .copied()
            .map(|i| (i, false))
            .or_else(|| self.same_bug(&sig, trigger.complete));
        let new = if let Some((i, false)) = same {
            self.count(i);
            self.raw.insert(raw, i);
            false
        } else {
            let kernels = subject.kernels();
            let request = SaveRequest {
                kernels: &kernels,
                class,
                sig: &key,
                seed,
                k,
                shrunk: &shrunk,
            };
            let case_file = save_finding(cfg, &request, ctx.progress);
            let mut finding = self.finding(
                ctx,
                &subject,
                &sig,
                &trigger,
                &shrunk,
                case_file,
                Some(seed),
            );
            finding.shrink_cut_short = cut;
            if let Subject::Kernel(k) = subject {
                localise(ctx, &mut finding, k);
            }
            match same {
                Some((i, true)) => {
                    self.raw.insert(raw, i);
                    self.generalise(i, sig, finding);
                    false
                }
                _ => {
                    self.detections.push(Detection {
                        signature: key.clone(),
                        class,
                        cases: ctx.generated,
                        secs: ctx.started.elapsed().as_secs_f64(),
                    });
                    self.raw.insert(raw, self.findings.len());
                    self.add(sig, finding);
                    true
                }
            }
        };
        for (recipe, case, verdict) in others {
            if cfg
                .stop_after_findings
                .is_some_and(|n| self.distinct() >= n)
            {
                break;
            }
            self.file(
                ctx,
                subject,
                Failure {
                    recipe,
                    case,
                    verdict,
                    origin: None,
                    parent: Some((k, seed)),
                    run_secs: 0.0,
                },
            );
        }
        new
    }

    /// Files a corpus file's failure on replay: its trigger is ablated again from the
    /// saved recipe (a file without one keeps an empty trigger).
    pub fn replayed(
        &mut self,
        ctx: &mut Ctx,
        subject: Subject,
        path: &std::path::Path,
        file: &crate::case::CaseFile,
        verdict: Verdict,
    ) {
        let Some(class) = verdict.primary_class() else {
            return;
        };
        let name = subject.name();
        let reason = if class == Class::Crash {
            crash_reason(&verdict)
        } else {
            None
        };
        let recipe = saved::read_recipe(file).unwrap_or_else(|e| {
            ctx.progress.println(&format!(
                "warning: {}: {e}; its trigger is not ablated again",
                path.display()
            ));
            None
        });
        let engine = ctx.engine;
        let mut cut = None;
        let trigger = match &recipe {
            Some(r) if engine.cfg.shrink && r.materialize() == file.case => {
                let t0 = Instant::now();
                let grant = ctx.allowance.grant(false);
                let (t, _) = ablate(
                    r,
                    &mut |c: &Case| {
                        ablation_outcome(&subject.judge(engine, c).0, &|v: &Verdict| {
                            shows(v, class, reason.as_deref())
                        })
                    },
                    grant.end(),
                    &mut ctx.allowance.run_cost,
                );
                ctx.timings.shrink_secs += t0.elapsed().as_secs_f64();
                let short = !t.complete && !super::interrupt::requested();
                cut = ctx.allowance.charge(&grant, short);
                // Cut short by a campaign cap, the saved bug keeps its saved identity.
                match cut.and(saved::saved_trigger(&name, class, reason.as_deref(), file)) {
                    Some(features) => {
                        cut = None;
                        Trigger::new(r, features, true)
                    }
                    None => t,
                }
            }
            Some(_) if !engine.cfg.shrink => Trigger::not_ablated("not ablated: --no-shrink"),
            Some(_) => Trigger::not_ablated("its saved recipe does not rebuild the case"),
            None => Trigger::not_ablated("no saved recipe"),
        };
        let sig = Signature {
            kernel: name,
            class,
            reason,
            trigger: trigger.features.clone(),
        };
        if let Some((i, _)) = self
            .by_key
            .get(&sig.key())
            .map(|&i| (i, false))
            .or_else(|| self.same_bug(&sig, trigger.complete))
        {
            self.count(i);
            return;
        }
        let shrunk = Shrunk {
            shrunk: file.provenance.shrunk,
            ..Shrunk::unshrunk(
                recipe.as_ref().unwrap_or(&Recipe::small(vec![1], 1, 0)),
                &file.case,
                &verdict,
            )
        };
        // The same call as for a generated finding (its arguments, not its logic, repeat).
        let mut finding = self.finding(
            ctx,
            &subject,
            &sig,
            &trigger,
            &shrunk,
            Some(path.to_path_buf()),
            file.provenance.seed,
        );
        finding.profile = "corpus".into();
        finding.shrink_cut_short = cut;
        if recipe.is_none() {
            // The stand-in recipe's features are not the case's.
            finding.case_features.clear();
        }
        self.add(sig, finding);
    }

    /// A known finding that is the same bug as `sig` though its trigger differs: same
    /// kernel and reason, classes of one bug ([`same_bug_classes`]), and one trigger
    /// contains the other (the larger one is the bug seen on a more special case, whose
    /// extra features only looked necessary there). `(index, true)` when `sig`'s trigger
    /// is the smaller one: the finding is to be generalised to it.
    ///
    /// An empty trigger contains nothing: a bug that needs nothing special is not the
    /// same as one whose complete ablation showed it needs some feature (removing that
    /// feature made its case clean, which the first bug would not), so the two stay
    /// apart unless the larger trigger's ablation was cut short.
    fn same_bug(&self, sig: &Signature, complete: bool) -> Option<(usize, bool)> {
        self.known.iter().find_map(|k| {
            if self.merged_into[k.index] != k.index
                || k.kernel != sig.kernel
                || !same_bug_classes(
                    k.class,
                    sig.class,
                    !k.trigger.is_empty() && !sig.trigger.is_empty(),
                )
                || k.reason != sig.reason
            {
                return None;
            }
            let within = crate::finding::feature::trigger_within;
            let apart = |small: &[Feature], large: &[Feature], large_complete: bool| {
                small.is_empty() && !large.is_empty() && large_complete
            };
            if within(&k.trigger, &sig.trigger) {
                (!apart(&k.trigger, &sig.trigger, complete)).then_some((k.index, false))
            } else if within(&sig.trigger, &k.trigger) {
                (!apart(&sig.trigger, &k.trigger, k.complete)).then_some((k.index, true))
            } else {
                None
            }
        })
    }

    /// Replaces finding `i` by the same bug with a smaller trigger: the new case and
    /// signature, the occurrences of both. Every other live finding that is this bug on
    /// a more special case (same kernel, class and reason; its trigger contains the new
    /// one) is merged into it too. The old corpus files (named by the old signatures)
    /// are removed, so that the bug keeps one file.
    fn generalise(&mut self, i: usize, sig: Signature, mut f: Finding) {
        let within = crate::finding::feature::trigger_within;
        let absorbed: Vec<usize> = self
            .known
            .iter()
            .filter(|k| {
                self.merged_into[k.index] == k.index
                    && k.kernel == sig.kernel
                    && same_bug_classes(k.class, sig.class, !sig.trigger.is_empty())
                    && k.reason == sig.reason
                    && within(&sig.trigger, &k.trigger)
                    && !(sig.trigger.is_empty() && !k.trigger.is_empty() && k.complete)
            })
            .map(|k| k.index)
            .collect();
        for &j in &absorbed {
            let old = &self.findings[j];
            f.occurrences += old.occurrences;
            if let (Some(a), Some(b)) = (&old.case_file, &f.case_file) {
                if a != b && old.profile != "corpus" {
                    let _ = std::fs::remove_file(a);
                }
            }
            let old_sig = old.signature.clone();
            self.detections.retain(|d| d.signature != old_sig || j == i);
            for d in &mut self.detections {
                if d.signature == old_sig {
                    d.signature = f.signature.clone();
                }
            }
            self.merged_into[j] = i;
        }
        self.merged_into[i] = i;
        self.by_key.insert(f.signature.clone(), i);
        self.known[i].trigger = sig.trigger;
        self.known[i].complete = f.trigger_complete;
        self.findings[i] = f;
    }

    fn add(&mut self, sig: Signature, f: Finding) {
        let i = self.findings.len();
        self.by_key.insert(f.signature.clone(), i);
        self.known.push(Known {
            kernel: sig.kernel,
            class: sig.class,
            reason: sig.reason,
            trigger: sig.trigger,
            complete: f.trigger_complete,
            index: i,
        });
        self.findings.push(f);
        self.merged_into.push(i);
    }

    #[allow(clippy::too_many_arguments)]
    fn finding(
        &self,
        ctx: &mut Ctx,
        subject: &Subject,
        sig: &Signature,
        trigger: &Trigger,
        shrunk: &Shrunk,
        case_file: Option<PathBuf>,
        seed: Option<u64>,
    ) -> Finding {
        let replay = case_file
            .as_ref()
            .map(|p| replay_command(p, &subject.kernels()))
            .unwrap_or_default();
        let tokens: usize = (0..shrunk.case.shape.batch)
            .map(|b| shrunk.case.seq_tokens(b))
            .sum();
        let tier = trigger.tier(&shrunk.recipe);
        let (picture, error_histogram) = Self::picture(ctx, subject, shrunk);
        ctx.progress.println(&format!(
            "  {} {}: {} row(s), {} token(s); {}; tier {}{}{}",
            sig.kernel,
            shrunk.verdict,
            shrunk.case.rows(),
            tokens,
            trigger.sentence(),
            tier.name(),
            case_file
                .as_ref()
                .map(|p| format!("\n  saved {}", p.display()))
                .unwrap_or_default(),
            if replay.is_empty() {
                String::new()
            } else {
                format!("\n  replay: {replay}")
            }
        ));
        Finding {
            signature: sig.key(),
            tier,
            trigger: trigger
                .features
                .iter()
                .map(|f| f.name().to_string())
                .collect(),
            needs: trigger.sentence(),
            trigger_complete: trigger.complete,
            case_features: features_of(&shrunk.recipe)
                .iter()
                .map(|f| f.name().to_string())
                .collect(),
            reason: sig.reason.clone(),
            position: crate::finding::position::first_offender_position(
                &shrunk.case,
                &shrunk.verdict,
            ),
            kernel: sig.kernel.clone(),
            profile: ctx.engine.cfg.profile.name().to_string(),
            class: Some(sig.class),
            classes: shrunk.verdict.classes.clone(),
            case_file: case_file.map(|p| p.display().to_string()),
            replay_command: replay,
            seed,
            shrunk: shrunk.shrunk,
            rows: shrunk.case.rows(),
            tokens: tokens as u64,
            occurrences: 1,
            verdict: shrunk.verdict.clone(),
            picture,
            error_histogram,
            localisation: None,
            localisation_skipped: None,
            shrink_cut_short: None,
        }
    }

    /// The finding's picture, from the output its last shrink step left in hand; a
    /// finding that was not shrunk (or not by a step that ran it) runs its case once.
    /// A crash has no output to picture.
    fn picture(
        ctx: &Ctx,
        subject: &Subject,
        shrunk: &Shrunk,
    ) -> (Option<crate::report::ClassMap>, Vec<u64>) {
        let rerun;
        let evidence = match &shrunk.evidence {
            Some(e) => Some(e),
            None if shrunk.verdict.classes.contains_key(&Class::Crash) => None,
            None => {
                rerun = subject.judge(ctx.engine, &shrunk.case).1;
                rerun.as_ref()
            }
        };
        match evidence {
            Some(e) => {
                let (map, hist) = e.draw(&shrunk.case);
                (Some(map), hist)
            }
            None => (None, Vec::new()),
        }
    }
}

/// What judging `case` again on kernel `i` costs a shrink step, which checks every row:
/// the run, and the reference and judge scaled up from the rows the campaign checked.
fn rerun_secs(case: &Case, judgement: &super::engine::Judgement, i: usize) -> f64 {
    let r = &judgement.runs[i];
    let checked = r.verdict.metrics.rows_checked.max(1) as f64;
    let scale = (case.rows() as f64 / checked).max(1.0);
    r.wall_secs + (r.judge_secs + judgement.reference_secs) * scale
}

#[cfg(test)]
mod tests;
