//! Folding reports: shards of one campaign into one (`merge`), and two campaigns into
//! what changed between them (`diff`), both keyed on finding signatures.

use super::model::*;
use super::stats::{add, add_map};
use crate::finding::feature::{trigger_within, Feature};
use crate::finding::signature::{explains, same_bug_classes, shown_apart, BugFacts};
use crate::shard::Shard;
use std::collections::{BTreeSet, HashMap};

/// The copy of a finding that is easiest to debug: shrunk first, then the smallest case.
fn better(a: &Finding, b: &Finding) -> bool {
    (!a.shrunk, a.tokens, a.rows) < (!b.shrunk, b.tokens, b.rows)
}

/// The same bug found by two shards on cases of different specialness: same kernel and
/// crash reason, the same class (or two value classes of a bug with a trigger), and one
/// trigger contains the other (the campaign's own rule, see `campaign::book`). The finding
/// with the smaller trigger is kept, occurrences add; but of a finding whose ablation was
/// cut short and a complete one that explains its case ([`explains`]), the complete one;
/// and a finding shown to need a feature the other could not have needed stays apart.
fn fold_special_cases(findings: &mut Vec<Finding>) {
    // By feature where the names are known (a stronger feature contains the weaker it
    // implies), else by name.
    let within = |a: &[String], b: &[String]| {
        let parse = |v: &[String]| -> Option<Vec<Feature>> {
            v.iter().map(|s| Feature::parse(s)).collect()
        };
        match (parse(a), parse(b)) {
            (Some(a), Some(b)) => trigger_within(&a, &b),
            _ => a.iter().all(|x| b.contains(x)),
        }
    };
    let same = |a: &Finding, b: &Finding| {
        let special = !a.trigger.is_empty() && !b.trigger.is_empty();
        let classes = match (a.class, b.class) {
            (Some(x), Some(y)) => same_bug_classes(x, y, special),
            (x, y) => x == y,
        };
        a.kernel == b.kernel && classes && a.reason == b.reason
    };
    // `b`'s ablation was cut short, and complete `a` explains `b`'s case.
    let cut_short_of = |a: &Finding, b: &Finding| {
        a.trigger_complete && !b.trigger_complete && ReadFacts::pair(a, b, explains)
    };
    // `a`'s complete ablation shows it is not `b`'s bug ([`shown_apart`]): `b` needs
    // nothing special, or was never ablated on a case without a feature `a` needs.
    let apart = |a: &Finding, b: &Finding| ReadFacts::pair(a, b, |fa, fb| shown_apart(fb, fa));
    let mut i = 0;
    while i < findings.len() {
        let general = (0..findings.len()).find(|&j| {
            let (a, b) = (&findings[i], &findings[j]);
            j != i
                && same(a, b)
                && (cut_short_of(b, a)
                    || (!cut_short_of(a, b)
                        && !apart(a, b)
                        && within(&b.trigger, &a.trigger)
                        && (!within(&a.trigger, &b.trigger) || j < i)))
        });
        match general {
            Some(j) => {
                let f = findings.remove(i);
                let j = if j > i { j - 1 } else { j };
                add(&mut findings[j].occurrences, f.occurrences);
                i = 0;
            }
            None => i += 1,
        }
    }
}

fn join_distinct<'a>(items: impl Iterator<Item = &'a str>) -> String {
    let mut seen = Vec::new();
    for s in items.filter(|s| !s.is_empty()) {
        if !seen.contains(&s) {
            seen.push(s);
        }
    }
    seen.join(",")
}

/// Folds shard reports into one: counts, per-kernel statistics (guard summaries
/// included), coverage and timings add; findings deduplicate by signature with their
/// occurrences summed, keeping the smallest (shrunk) reproduction.
///
/// Not sums: `wall_secs` is the longest shard's (shards run side by side),
/// `max_err_over_bound` and `budget_secs` the largest, `started_unix` the earliest and
/// `finished_unix` the latest; `interrupted` if any shard was. `merged_shards` lists the
/// shards folded in, so a missing shard shows (see [`missing_shards`]).
pub fn merge(reports: &[Report]) -> Report {
    let mut m = Report {
        report_version: REPORT_VERSION,
        ..Default::default()
    };
    let Some(first) = reports.first() else {
        return m;
    };
    m.tool_version = join_distinct(reports.iter().map(|r| r.tool_version.as_str()));
    m.profile = join_distinct(reports.iter().map(|r| r.profile.as_str()));
    m.seed = first.seed;
    m.environment = first.environment.clone();
    m.environment.hostname = join_distinct(reports.iter().map(|r| r.environment.hostname.as_str()));
    m.environment.gpus = reports
        .iter()
        .flat_map(|r| r.environment.gpus.iter().cloned())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    m.started_unix = reports
        .iter()
        .map(|r| r.started_unix)
        .filter(|&t| t > 0)
        .min()
        .unwrap_or(0);
    m.finished_unix = reports.iter().map(|r| r.finished_unix).max().unwrap_or(0);
    m.interrupted = reports.iter().any(|r| r.interrupted);
    m.stopped_early = reports.iter().find_map(|r| r.stopped_early.clone());
    m.budget_secs = reports
        .iter()
        .filter_map(|r| r.budget_secs)
        .reduce(f64::max);
    m.max_cases = reports
        .iter()
        .filter_map(|r| r.max_cases)
        .reduce(u64::saturating_add);
    m.min_tokens = reports.iter().filter_map(|r| r.min_tokens).max();
    m.required = reports
        .iter()
        .flat_map(|r| r.required.iter().cloned())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut shards = BTreeSet::new();
    let mut runs = Vec::new();
    for r in reports {
        shards.extend(r.shard);
        shards.extend(r.merged_shards.iter().copied());
        if r.merged_runs.is_empty() {
            runs.push(r.run_id.clone());
        } else {
            runs.extend(r.merged_runs.iter().cloned());
        }
        for k in &r.kernels {
            if !m.kernels.iter().any(|x| x.name == k.name) {
                m.kernels.push(k.clone());
            }
        }
        add(&mut m.counts.cases_replayed, r.counts.cases_replayed);
        add(&mut m.counts.cases_generated, r.counts.cases_generated);
        add(&mut m.counts.cases_skipped, r.counts.cases_skipped);
        add(
            &mut m.counts.cases_left_at_deadline,
            r.counts.cases_left_at_deadline,
        );
        add_map(&mut m.counts.skip_reasons, &r.counts.skip_reasons);
        add(
            &mut m.counts.cases_not_run_known_crash,
            r.counts.cases_not_run_known_crash,
        );
        add(
            &mut m.counts.cases_below_min_tokens,
            r.counts.cases_below_min_tokens,
        );
        for (sig, c) in &r.counts.known_crashes {
            *m.counts.known_crashes.entry(sig.clone()).or_default() += c;
        }
        for (name, k) in &r.per_kernel {
            *m.per_kernel.entry(name.clone()).or_default() += k;
        }
        for (axis, values) in &r.coverage.axes {
            add_map(m.coverage.axes.entry(axis.clone()).or_default(), values);
        }
        add_map(&mut m.coverage.combos, &r.coverage.combos);
        let (t, u) = (&mut m.timings, &r.timings);
        t.wall_secs = t.wall_secs.max(u.wall_secs);
        t.shard_wall_secs += if u.shard_wall_secs > 0.0 {
            u.shard_wall_secs
        } else {
            u.wall_secs
        };
        t.generate_secs += u.generate_secs;
        t.kernel_secs += u.kernel_secs;
        t.reference_secs += u.reference_secs;
        t.oracle_secs += u.oracle_secs;
        t.shrink_secs += u.shrink_secs;
        m.shrinking.merge(&r.shrinking);
    }
    let mut index: HashMap<String, usize> = HashMap::new();
    for f in reports.iter().flat_map(|r| &r.findings) {
        match index.get(&f.signature) {
            Some(&i) => {
                let kept = &mut m.findings[i];
                let occurrences = kept.occurrences.saturating_add(f.occurrences);
                if better(f, kept) {
                    *kept = f.clone();
                }
                kept.occurrences = occurrences;
            }
            None => {
                index.insert(f.signature.clone(), m.findings.len());
                m.findings.push(f.clone());
            }
        }
    }
    fold_special_cases(&mut m.findings);
    m.merged_shards = shards.into_iter().collect();
    m.run_id = if runs.len() == 1 {
        runs[0].clone()
    } else {
        format!(
            "merge-of-{}-runs-{}",
            runs.len(),
            runs.first().cloned().unwrap_or_default()
        )
    };
    m.merged_runs = runs;
    m
}

/// What makes two inputs of a merge the same shard: the campaign (seed, kernels,
/// profile) and the shard index for a shard report; the run itself for a report that
/// is not sharded. Merging one twice would count its cases twice.
fn shard_identities(r: &Report) -> Vec<String> {
    let kernels: Vec<&str> = r.kernels.iter().map(|k| k.name.as_str()).collect();
    let campaign = format!(
        "shard {{}} of the campaign with seed {:#x} ({}, profile {})",
        r.seed,
        kernels.join(", "),
        r.profile
    );
    if !r.merged_shards.is_empty() {
        r.merged_shards
            .iter()
            .map(|s| campaign.replace("{}", &s.to_string()))
            .collect()
    } else if let Some(s) = r.shard {
        vec![campaign.replace("{}", &s.to_string())]
    } else {
        let runs = if r.merged_runs.is_empty() {
            vec![r.run_id.clone()]
        } else {
            r.merged_runs.clone()
        };
        runs.into_iter()
            .map(|run| format!("run {run} (started {})", r.started_unix))
            .collect()
    }
}

/// The first shard (or run) that two inputs share, as `(first input, second input,
/// what they share)`; `None` when every input adds something new.
pub fn repeated_shard(reports: &[Report]) -> Option<(usize, usize, String)> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, r) in reports.iter().enumerate() {
        for id in shard_identities(r) {
            if let Some(&j) = seen.get(&id) {
                return Some((j, i, id));
            }
            seen.insert(id, i);
        }
    }
    None
}

/// Shards of the campaign not folded into a merged report (empty when complete, or when
/// the report was not sharded).
pub fn missing_shards(r: &Report) -> Vec<Shard> {
    let Some(count) = r.merged_shards.iter().map(|s| s.count).max() else {
        return Vec::new();
    };
    (0..count)
        .map(|index| Shard { index, count })
        .filter(|s| !r.merged_shards.contains(s))
        .collect()
}

/// Shards as the reports list them: `0/4 2/4`.
pub fn shard_list(shards: &[Shard]) -> String {
    let v: Vec<String> = shards.iter().map(Shard::to_string).collect();
    v.join(" ")
}

/// A report's finding as the same-bug rule reads it: its trigger and its case's
/// features (the trigger where the report predates them). `None` where a name is not a
/// feature this version knows: such a finding matches by its exact signature only.
struct ReadFacts {
    trigger: Vec<Feature>,
    features: Vec<Feature>,
}

impl ReadFacts {
    fn of(f: &Finding) -> Option<ReadFacts> {
        let parse = |v: &[String]| -> Option<Vec<Feature>> {
            v.iter().map(|s| Feature::parse(s)).collect()
        };
        let trigger = parse(&f.trigger)?;
        let mut features = parse(&f.case_features)?;
        for &t in &trigger {
            if !features.contains(&t) {
                features.push(t);
            }
        }
        Some(ReadFacts { trigger, features })
    }

    /// `test` of the two findings' facts; false where either cannot be read.
    fn pair(a: &Finding, b: &Finding, test: impl Fn(&BugFacts, &BugFacts) -> bool) -> bool {
        let (Some(ra), Some(rb)) = (ReadFacts::of(a), ReadFacts::of(b)) else {
            return false;
        };
        match (ra.facts(a), rb.facts(b)) {
            (Some(fa), Some(fb)) => test(&fa, &fb),
            _ => false,
        }
    }

    fn facts<'a>(&'a self, f: &'a Finding) -> Option<BugFacts<'a>> {
        Some(BugFacts {
            kernel: &f.kernel,
            class: f.class?,
            reason: f.reason.as_deref(),
            trigger: &self.trigger,
            complete: f.trigger_complete,
            features: &self.features,
        })
    }
}

/// New (in `cand` only), fixed (in `base` only) and unchanged findings. A candidate's
/// finding is unchanged when the base has its signature, or when a base finding
/// explains its case by the campaign's own rule ([`explains`]: the candidate's ablation
/// was cut short, or it met the bug on a more special case), so that one bug seen twice
/// is not a new one; `same_bug` lists those pairs.
pub fn diff(base: &Report, cand: &Report) -> ReportDiff {
    let base_sigs: BTreeSet<&str> = base.findings.iter().map(|f| f.signature.as_str()).collect();
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    let read: Vec<Option<ReadFacts>> = base.findings.iter().map(ReadFacts::of).collect();
    let mut d = ReportDiff::default();
    for f in &cand.findings {
        if base_sigs.contains(f.signature.as_str()) {
            seen.insert(&f.signature);
            d.unchanged.push(f.clone());
            continue;
        }
        let mine = ReadFacts::of(f);
        let explained_by = mine.as_ref().and_then(|m| m.facts(f)).and_then(|other| {
            base.findings.iter().zip(&read).find_map(|(g, r)| {
                let known = r.as_ref()?.facts(g)?;
                explains(&known, &other).then_some(g)
            })
        });
        match explained_by {
            Some(g) => {
                seen.insert(&g.signature);
                d.same_bug.push((g.signature.clone(), f.signature.clone()));
                d.unchanged.push(f.clone());
            }
            None => d.new.push(f.clone()),
        }
    }
    d.fixed = base
        .findings
        .iter()
        .filter(|f| !seen.contains(f.signature.as_str()))
        .cloned()
        .collect();
    d
}

/// Confirms each of `d.fixed` by replaying its saved case (`replay`: `Ok(true)` the
/// case still fails with the finding's class and reason, `Ok(false)` it does not,
/// `Err(why)` it cannot be replayed here): a bug is fixed only when its case no longer
/// fails, not because a campaign happened not to meet it.
pub fn confirm_fixed(d: &mut ReportDiff, replay: &mut dyn FnMut(&Finding) -> Result<bool, String>) {
    for f in std::mem::take(&mut d.fixed) {
        match replay(&f) {
            Ok(false) => d.fixed.push(f),
            Ok(true) => d.still_failing.push(f),
            Err(why) => d.unconfirmed.push((f, why)),
        }
    }
}

/// `diff` as text for the terminal: one line per finding, grouped.
pub fn diff_text(d: &ReportDiff) -> String {
    let mut s = format!(
        "{} new, {} fixed, {} unchanged finding(s)",
        d.new.len(),
        d.fixed.len(),
        d.unchanged.len()
    );
    if !d.still_failing.is_empty() {
        s.push_str(&format!(
            ", {} not met but still failing on replay",
            d.still_failing.len()
        ));
    }
    if !d.unconfirmed.is_empty() {
        s.push_str(&format!(
            ", {} not met and not replayable here",
            d.unconfirmed.len()
        ));
    }
    s.push('\n');
    let unconfirmed: Vec<Finding> = d.unconfirmed.iter().map(|(f, _)| f.clone()).collect();
    for (label, list) in [
        ("NEW", &d.new),
        ("FIXED", &d.fixed),
        ("STILL-FAILS", &d.still_failing),
        ("UNCONFIRMED", &unconfirmed),
        ("unchanged", &d.unchanged),
    ] {
        for f in list {
            s.push_str(&format!(
                "{label:11}  {}  {}  {}  x{}",
                f.signature,
                f.kernel,
                f.class_name(),
                f.occurrences
            ));
            if matches!(label, "NEW" | "STILL-FAILS") && !f.replay_command.is_empty() {
                s.push_str(&format!("  replay: {}", f.replay_command));
            }
            if label == "unchanged" {
                if let Some((base, _)) = d.same_bug.iter().find(|(_, c)| *c == f.signature) {
                    s.push_str(&format!("  (the base's {base})"));
                }
            }
            if label == "UNCONFIRMED" {
                if let Some((_, why)) = d
                    .unconfirmed
                    .iter()
                    .find(|(u, _)| u.signature == f.signature)
                {
                    s.push_str(&format!("  ({why})"));
                }
            }
            s.push('\n');
        }
    }
    s
}
