//! The one-line verdict per kernel: the question users ask ("can we drop the
//! `nan_to_num_(-inf)` guard after this kernel?") answered with the evidence behind it.

use super::model::{KernelStats, Population, Report, Span};

pub use crate::util::group;

/// A ratio for a table cell: three decimals, `inf`, or `n/a` for NaN.
pub fn ratio(x: f64) -> String {
    if x.is_infinite() {
        "inf".into()
    } else if x.is_nan() {
        "n/a".into()
    } else {
        format!("{x:.3}")
    }
}

/// The counting columns of the kernels table, after the kernel's name; both
/// `summary.md` and `index.html` show them ([`kernel_cells`] gives a kernel's).
pub const KERNEL_COLUMNS: [&str; 8] = [
    "cases",
    "clean",
    "with findings",
    "skipped",
    "guard redundant",
    "rows",
    "logits",
    "max err/bound",
];

/// A kernel's cells under [`KERNEL_COLUMNS`].
pub fn kernel_cells(k: &KernelStats) -> [String; 8] {
    [
        group(k.cases),
        group(k.clean),
        group(k.with_findings),
        group(k.skipped),
        format!(
            "{}/{}",
            group(k.guard.redundant_cases),
            group(k.guard.cases)
        ),
        group(k.rows_checked),
        group(k.logits_checked),
        ratio(k.max_err_over_bound),
    ]
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", group(n), if n == 1 { one } else { many })
}

/// The verdict of one kernel, e.g.
/// `cpu:chunked: guard redundant on 120/120 cases (3,400 rows, 1,234,567 logits checked
/// in the valid range); 95% upper bound on the per-case failure rate 3/120 = 2.5%`.
///
/// "3/n" is the rule of three: with 0 failures in n independent cases, the per-case
/// failure probability is below 3/n with 95% confidence (exactly `1 - 0.05^(1/n)`).
pub fn kernel_headline(name: &str, k: &KernelStats) -> String {
    let g = &k.guard;
    let p = &k.population;
    // The population the verdict speaks for: all production cases, or some of them.
    let (label, all_production) = if p.cases > 0 && p.cases == g.cases {
        (
            "production-profile cases",
            format!("{}; ", population_words(p)),
        )
    } else {
        ("cases", String::new())
    };
    let mut s = format!("{name}: ");
    // Crashed cases have no output for the guard verdict: lead with them, or a crash
    // campaign would read "guard redundant on 4/4 cases" first.
    let crashed = k
        .class_totals
        .get(&crate::oracle::Class::Crash)
        .copied()
        .unwrap_or(0);
    if crashed > 0 {
        s.push_str(&format!(
            "CRASHED on {}/{} (no output to judge)",
            group(crashed),
            plural(k.cases, "case", "cases")
        ));
        if g.cases > 0 || k.skipped > 0 {
            s.push_str("; on the rest: ");
        }
    }
    if g.cases == 0 && crashed > 0 && k.skipped == 0 {
        // Every case crashed: the crash is the whole verdict.
    } else if g.cases == 0 {
        s.push_str(&format!(
            "no case judged ({} skipped",
            plural(k.skipped, "case", "cases")
        ));
        if k.cases > 0 {
            s.push_str(&format!(
                ", {} crashed or unjudged",
                plural(k.cases, "case", "cases")
            ));
        }
        s.push(')');
    } else if g.redundant_cases == g.cases {
        s.push_str(&format!(
            "guard redundant on {}/{} {label} ({all_production}{}, {} checked in the valid range); 95% upper bound on the per-case failure rate 3/{} = {}",
            group(g.redundant_cases),
            group(g.cases),
            plural(k.rows_checked, "row", "rows"),
            plural(k.logits_checked, "logit", "logits"),
            g.cases,
            percent(3.0 / g.cases as f64)
        ));
    } else if g.nan.saturating_add(g.pos_inf).saturating_add(g.neg_inf) == 0 {
        // Cases counted as not redundant without a single NaN/inf element: they had no
        // output to judge (a crash counted by the campaign). Say so instead of "NEEDED".
        s.push_str(&format!(
            "guard redundant on {}/{} cases; the other {} had no output to judge (crash)",
            group(g.redundant_cases),
            group(g.cases),
            plural(g.cases.saturating_sub(g.redundant_cases), "case", "cases")
        ));
    } else {
        let bad = g.cases.saturating_sub(g.redundant_cases);
        s.push_str(&format!(
            "guard NEEDED on {}/{} {label}: it changes {} in {} (nan {}, +inf {}, -inf {}) of {} checked",
            group(bad),
            group(g.cases),
            plural(g.nan.saturating_add(g.pos_inf).saturating_add(g.neg_inf), "element", "elements"),
            plural(g.rows_affected, "row", "rows"),
            group(g.nan),
            group(g.pos_inf),
            group(g.neg_inf),
            plural(k.logits_checked, "logit", "logits"),
        ));
    }
    if p.cases > 0 && p.cases != g.cases {
        s.push_str(&format!(
            "; {} of them production-profile ({})",
            plural(p.cases, "case", "cases"),
            population_words(p)
        ));
    } else if p.cases > 0 && g.redundant_cases != g.cases {
        s.push_str(&format!(" ({})", population_words(p)));
    }
    if k.with_findings > 0 {
        let classes: Vec<String> = k
            .class_totals
            .iter()
            .map(|(c, n)| format!("{c} {}", group(*n)))
            .collect();
        s.push_str(&format!(
            "; findings in {} ({})",
            plural(k.with_findings, "case", "cases"),
            classes.join(", ")
        ));
    }
    s
}

fn span(s: Option<Span>, f: impl Fn(u64) -> String) -> String {
    match s {
        None => "?".into(),
        Some(s) if s.min == s.max => f(s.min),
        Some(s) => format!("{}–{}", f(s.min), f(s.max)),
    }
}

/// Bytes in the largest binary unit that keeps a number ≥ 1 (`75.3 GiB`).
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = n as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{} B", group(n))
    } else {
        format!("{x:.1} {}", UNITS[u])
    }
}

/// The production population in words: `pool 16,753–85,707 blocks × 8,448–1,473,408 B,
/// KV offsets to 75.3 GiB, B 1–512 (2–1,024 rows), ctx ≤ 163,840 of max_model_len
/// 65,536–1,048,576, workspace to 4.0 GiB, contexts at 1/64`.
pub fn population_words(p: &Population) -> String {
    let max = |s: Option<Span>| s.map_or(0, |s| s.max);
    let mut w = format!(
        "pool {} blocks × {} B, KV offsets to {}, B {} ({} rows), ctx ≤ {} of max_model_len {}, workspace to {}",
        span(p.pool_blocks, group),
        span(p.kv_stride, group),
        bytes(max(p.kv_offset)),
        span(p.batch, group),
        span(p.rows, group),
        group(max(p.context)),
        span(p.max_model_len, group),
        bytes(max(p.workspace_bytes)),
    );
    if let Some(s) = p.inverse_scale.filter(|s| s.max > 1) {
        w.push_str(&format!(
            ", contexts at {}",
            span(Some(s), |x| format!("1/{x}"))
        ));
    }
    w
}

fn percent(x: f64) -> String {
    let p = 100.0 * x.min(1.0);
    if p >= 1.0 {
        format!("{p:.1}%")
    } else {
        format!("{p:.2}%")
    }
}

/// The first line of a (possibly multi-line) message, without a stderr tail.
fn first_line(s: &str) -> &str {
    let line = s.lines().next().unwrap_or("");
    line.split("; stderr tail").next().unwrap_or(line)
}

/// One line per kernel (a single line for a single-kernel campaign).
pub fn headline(report: &Report) -> String {
    if report.per_kernel.is_empty() {
        return "no kernel ran".to_string();
    }
    let mut lines: Vec<String> = report
        .per_kernel
        .iter()
        .map(|(n, k)| kernel_headline(n, k))
        .collect();
    lines.extend(property_lines(report));
    if let Some(why) = &report.stopped_early {
        if let Some(first) = lines.first_mut() {
            first.insert_str(0, &format!("(STOPPED EARLY: {}) ", first_line(why)));
        }
    }
    if report.interrupted {
        if let Some(first) = lines.first_mut() {
            first.insert_str(0, "(interrupted) ");
        }
    }
    lines.join("\n")
}

/// The properties' verdict lines (DESIGN §7), one per kernel and property checked:
/// `cuda:tiled: bitwise deterministic on 120/120 cases (2 runs each)`.
pub fn property_lines(report: &Report) -> Vec<String> {
    use crate::property::{verdict_line, Property};
    let mut v = Vec::new();
    for (name, k) in &report.per_kernel {
        for p in Property::ALL {
            let required = report.required.iter().any(|r| r == p.name());
            v.extend(verdict_line(name, &k.properties, p, required));
        }
    }
    v
}

/// Where a campaign's time went, e.g.
/// `throughput: 3.9 cases/s, 8.7e3 verified logits/s over 105.0 s wall` and
/// `time (summed over jobs): generate 12.3 s, reference 40.1 s, judge 5.2 s;
/// cuda:tiled runs 80.2 s (kernel's own clock 0.024 s)`: the split between the
/// kernel, the worker protocol and the oracle that tells a user what to speed up.
pub fn throughput(r: &Report) -> Vec<String> {
    let t = &r.timings;
    let wall = t.wall_secs.max(1e-9);
    let cases = r
        .counts
        .cases_generated
        .saturating_add(r.counts.cases_replayed);
    let logits = (r.per_kernel.values()).fold(0u64, |a, k| a.saturating_add(k.logits_checked));
    let mut kernels = Vec::new();
    for (name, k) in &r.per_kernel {
        // The run's wall splits into the harness's output buffer (allocated and poisoned
        // before the call), the kernel's own clock, and the rest of the call: for an
        // exec: or cuda: kernel the worker protocol and device transfers, for a CPU
        // kernel without its own clock nothing (its clock is the call).
        let rest = (k.run_wall_secs - k.output_setup_secs - k.kernel_secs).max(0.0);
        // Runs without a clock of their own beside runs with one (a GPU worker's crashes)
        // are told apart: their walls are not the kernel's time.
        let (clock, unclocked) = if k.unclocked_runs > 0 && k.unclocked_runs < k.cases {
            (
                k.kernel_secs - k.unclocked_secs,
                format!(
                    ", {} without a clock of their own (crashes: the fault, the worker's death) {:.1} s",
                    plural(k.unclocked_runs, "run", "runs"),
                    k.unclocked_secs
                ),
            )
        } else {
            (k.kernel_secs, String::new())
        };
        kernels.push(format!(
            "{name} runs {:.1} s: harness output buffer (allocate + NaN poison) {:.1} s, kernel's own clock {:.3} s{}{unclocked}, rest of the call (worker protocol, transfers) {:.1} s",
            k.run_wall_secs,
            k.output_setup_secs,
            clock,
            compile_words(k).map(|c| format!(" ({c})")).unwrap_or_default(),
            rest
        ));
    }
    // A merged report has no wall time of its own (its shards may have run side by
    // side or one after another): its rates are per shard, over the summed shard walls.
    // A case its one kernel skipped is generated, not tested: the rate of those run too.
    let (secs, over) = if t.shard_wall_secs > 0.0 {
        (
            t.shard_wall_secs,
            format!(
                " per shard, over {:.1} s of shard wall summed ({} runs merged)",
                t.shard_wall_secs,
                r.merged_runs.len().max(1)
            ),
        )
    } else {
        (wall, format!(" over {:.1} s wall", t.wall_secs))
    };
    let ran = match r.per_kernel.values().collect::<Vec<_>>()[..] {
        [k] if k.skipped > 0 => format!(
            " ({:.1} run, {} skipped)",
            k.cases as f64 / secs,
            group(k.skipped)
        ),
        _ => String::new(),
    };
    let rate = format!(
        "throughput: {:.1} cases/s{ran}, {:.2e} verified logits/s{over}",
        cases as f64 / secs,
        logits as f64 / secs,
    );
    let mut lines = vec![
        rate,
        format!(
            "time (summed over jobs): generate {:.1} s, reference {:.1} s, judge {:.1} s, {}; {}",
            t.generate_secs,
            t.reference_secs,
            t.oracle_secs,
            shrink_words(r),
            kernels.join("; ")
        ),
    ];
    let workers: Vec<String> = r
        .kernels
        .iter()
        .filter_map(|k| Some((k, k.worker.as_ref()?)))
        .map(|(k, w)| format!("{}: {}", k.name, super::workers::worker_words(w)))
        .collect();
    if !workers.is_empty() {
        lines.push(format!("workers: {}", workers.join("; ")));
    }
    for (name, k) in &r.per_kernel {
        if let Some(p) = phase_words(k) {
            lines.push(format!("{name} calls by phase (summed): {p}"));
        }
    }
    for (name, k) in &r.per_kernel {
        if let Some(j) = judge_words(k) {
            lines.push(format!("{name} judged {j}"));
        }
    }
    lines
}

/// Where a kernel's cases were judged: `on the GPU: 120 cases (230,400 elements
/// re-checked on the CPU, 1 case with findings judged on the CPU too); on the CPU: 3
/// (heads 4: ...)`; `None` when no case was judged on the device.
pub fn judge_words(k: &KernelStats) -> Option<String> {
    let j = &k.judge;
    if j.device_cases == 0 {
        return None;
    }
    let g = crate::util::group;
    let mut s = format!(
        "on the GPU: {} cases ({} elements re-checked on the CPU, all agreeing unless an oracle_disagreement says otherwise; {} with findings judged on the CPU too)",
        g(j.device_cases),
        g(j.rechecked_elements),
        g(j.device_then_cpu)
    );
    if j.cpu_cases > 0 {
        let reasons: Vec<String> = j
            .cpu_reasons
            .iter()
            .map(|(r, n)| format!("{r}: {n}"))
            .collect();
        s.push_str(&format!(
            "; on the CPU: {} ({})",
            g(j.cpu_cases),
            reasons.join(", ")
        ));
    }
    Some(s)
}

/// A kernel's calls split by phase, largest first: `download 12.1 s, harness: read
/// output 3.2 s, upload 2.0 s, ...`; `None` when its runs report no phases.
pub fn phase_words(k: &KernelStats) -> Option<String> {
    if k.call_phases.is_empty() {
        return None;
    }
    let mut v: Vec<(&String, &f64)> = k.call_phases.iter().collect();
    v.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.cmp(b.0)));
    Some(
        v.iter()
            .map(|(p, t)| format!("{p} {t:.2} s"))
            .collect::<Vec<_>>()
            .join(", "),
    )
}

/// The kernel time of a kernel with a compile key, split: `first call of a key
/// (compile included) 15.2 s over 12 keys, steady 5.7 s over 40 runs`; `None` for a
/// kernel without one.
pub fn compile_words(k: &KernelStats) -> Option<String> {
    let c = &k.compile;
    (c.first_calls > 0).then(|| {
        format!(
            "first call of a key (compile included) {:.3} s over {}, steady {:.3} s over {}",
            c.first_call_secs,
            plural(c.distinct_keys, "key", "keys"),
            c.steady_secs,
            plural(c.steady_calls, "run", "runs")
        )
    })
}

/// Whether a finding was shrunk: `yes`, `no`, or `yes, cut short (share spent)`.
pub fn shrunk_words(f: &super::model::Finding) -> String {
    let base = if f.shrunk { "yes" } else { "no" };
    match f.shrink_cut_short {
        Some(c) => format!("{base}, cut short ({})", c.words()),
        None => base.to_string(),
    }
}

/// `shrink 12.3 s (at most 30% of the budget: 18.0 s; 2 shrinks cut short: share
/// spent 1, budget end 1)`.
pub fn shrink_words(r: &Report) -> String {
    let (t, s) = (&r.timings, &r.shrinking);
    let mut notes = Vec::new();
    if s.cap_secs > 0.0 {
        notes.push(format!(
            "at most {:.0}% of the budget: {:.1} s",
            s.share * 100.0,
            s.cap_secs
        ));
    }
    let cut = s.cut_short_share.saturating_add(s.cut_short_budget_end);
    if cut > 0 {
        notes.push(format!(
            "{} cut short: share spent {}, budget end {}",
            plural(cut, "shrink", "shrinks"),
            s.cut_short_share,
            s.cut_short_budget_end
        ));
    }
    if s.known_from_corpus > 0 {
        notes.push(format!(
            "{} of signatures the corpus holds not shrunk again",
            plural(s.known_from_corpus, "failure", "failures")
        ));
    }
    if notes.is_empty() {
        format!("shrink {:.1} s", t.shrink_secs)
    } else {
        format!("shrink {:.1} s ({})", t.shrink_secs, notes.join("; "))
    }
}

/// The bugs of a report in one line, by tier: `2 distinct bugs (production 1, api 0,
/// hostile 1)`.
pub fn bugs_line(r: &Report) -> String {
    use crate::finding::Tier;
    let by: Vec<String> = Tier::ALL
        .iter()
        .map(|t| {
            format!(
                "{} {}",
                t.name(),
                r.findings.iter().filter(|f| f.tier == *t).count()
            )
        })
        .collect();
    format!(
        "{} ({})",
        plural(r.findings.len() as u64, "distinct bug", "distinct bugs"),
        by.join(", ")
    )
}

/// The guard verdict per tier, production first: whether a bug reachable from that
/// tier's inputs (a finding of that tier or a more benign one) leaves NaN or ±inf in
/// V(r) that `nan_to_num` after the kernel would change. "Can our engine drop the
/// guard" is the production entry.
pub fn guard_by_tier(r: &Report) -> String {
    use crate::finding::Tier;
    let parts: Vec<String> = Tier::ALL
        .iter()
        .map(|t| {
            let reach: Vec<&crate::report::Finding> =
                r.findings.iter().filter(|f| f.tier <= *t).collect();
            let guarded = reach
                .iter()
                .filter(|f| {
                    let g = &f.verdict.guard;
                    g.nan.saturating_add(g.pos_inf).saturating_add(g.neg_inf) > 0
                })
                .count() as u64;
            if guarded > 0 {
                format!(
                    "{}: guard NEEDED ({} put NaN/inf into V(r))",
                    t.name(),
                    plural(guarded, "bug", "bugs")
                )
            } else {
                format!(
                    "{}: no bug found needs the guard ({} reachable)",
                    t.name(),
                    plural(reach.len() as u64, "bug", "bugs")
                )
            }
        })
        .collect();
    format!("guard by tier: {}", parts.join("; "))
}

/// The lines on generated cases that were drawn and not run: under `--min-tokens`, and
/// predicted known crashes.
pub fn not_run_lines(r: &Report) -> Vec<String> {
    [min_tokens_line(r), known_crash_line(r)]
        .into_iter()
        .flatten()
        .collect()
}

/// The generated cases left out for holding fewer KV tokens than `--min-tokens`;
/// `None` without the option.
pub fn min_tokens_line(r: &Report) -> Option<String> {
    let m = r.min_tokens?;
    let cases = plural(
        r.counts.cases_below_min_tokens,
        "generated case",
        "generated cases",
    );
    Some(format!(
        "--min-tokens {m}: {cases} with fewer KV tokens did not run (every case run holds at least {m})"
    ))
}

/// The generated cases left out as predicted known crashes (`--known-crashes`), per
/// crash; `None` when none was.
pub fn known_crash_line(r: &Report) -> Option<String> {
    let n = r.counts.cases_not_run_known_crash;
    let each: Vec<String> = (r.counts.known_crashes.iter())
        .filter(|(_, c)| c.not_run > 0)
        .map(|(sig, c)| {
            let (run, hit) = (c.run, c.crashed);
            format!(
                "{sig}: {} not run, {run} run ({hit} crashed that way)",
                c.not_run
            )
        })
        .collect();
    (n > 0).then(|| {
        let cases = plural(n, "generated case", "generated cases");
        format!("known crashes: {cases} predicted to crash as a known finding did not run (`--known-crashes 1` runs them): {}", each.join("; "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::GuardSummary;

    #[test]
    fn throughput_splits_worker_time_from_kernel_time() {
        let mut r = Report::default();
        r.counts.cases_generated = 90;
        r.counts.cases_replayed = 10;
        r.timings.wall_secs = 50.0;
        r.timings.reference_secs = 7.0;
        r.per_kernel.insert(
            "cuda:tiled".into(),
            KernelStats {
                logits_checked: 1_000_000,
                kernel_secs: 0.25,
                run_wall_secs: 40.0,
                output_setup_secs: 30.0,
                ..Default::default()
            },
        );
        let lines = throughput(&r);
        assert!(
            lines[0].starts_with("throughput: 2.0 cases/s, 2.00e4 verified logits/s"),
            "{lines:?}"
        );
        r.per_kernel.get_mut("cuda:tiled").unwrap().cases = 75;
        r.per_kernel.get_mut("cuda:tiled").unwrap().skipped = 25;
        let rate = &throughput(&r)[0];
        assert!(
            rate.starts_with("throughput: 2.0 cases/s (1.5 run, 25 skipped), 2.00e4"),
            "{rate}"
        );
        assert!(lines[1].contains("reference 7.0 s"), "{lines:?}");
        assert!(
            lines[1].contains("cuda:tiled runs 40.0 s: harness output buffer (allocate + NaN poison) 30.0 s, kernel's own clock 0.250 s, rest of the call (worker protocol, transfers) 9.8 s"),
            "{lines:?}"
        );
    }

    #[test]
    fn crashes_are_not_called_guard_needed() {
        let k = KernelStats {
            cases: 5,
            guard: GuardSummary {
                cases: 5,
                redundant_cases: 4,
                ..Default::default()
            },
            ..Default::default()
        };
        let h = kernel_headline("k", &k);
        assert!(
            h.contains("4/5 cases; the other 1 case had no output"),
            "{h}"
        );
        let k = KernelStats {
            guard: GuardSummary {
                cases: 5,
                redundant_cases: 4,
                pos_inf: 2,
                rows_affected: 1,
                ..Default::default()
            },
            ..k
        };
        assert!(kernel_headline("k", &k).starts_with(
            "k: guard NEEDED on 1/5 cases: it changes 2 elements in 1 row (nan 0, +inf 2, -inf 0)"
        ));
        assert_eq!(group(1234567), "1,234,567");
    }
}
