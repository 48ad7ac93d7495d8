//! `summary.md`: the one-screen verdict (CI job summaries, PR comments).

use super::fold::{missing_shards, shard_list};
use super::headline::{group, headline, kernel_cells, KERNEL_COLUMNS};
use super::model::Report;
use std::fmt::Write;

/// Findings listed by name; the rest are counted (all are in report.json / index.html).
const MAX_LISTED: usize = 15;

/// `2026-11-30 00:53:20 UTC` (report.json keeps the raw Unix seconds); `—` for 0.
pub fn utc_time(secs: u64) -> String {
    if secs == 0 {
        return "—".into();
    }
    let s = crate::util::utc_stamp(secs); // YYYYMMDD-HHMMSS (more year digits far out)
    match s.split_once('-') {
        Some((d, t)) if d.len() >= 8 && t.len() == 6 => {
            let y = d.len() - 4;
            format!(
                "{}-{}-{} {}:{}:{} UTC",
                &d[..y],
                &d[y..y + 2],
                &d[y + 2..],
                &t[0..2],
                &t[2..4],
                &t[4..6]
            )
        }
        _ => format!("{secs} (unix)"),
    }
}

pub fn summary_md(r: &Report) -> String {
    let mut s = String::new();
    let verdict = if r.findings.is_empty() {
        "CLEAN"
    } else {
        "FINDINGS"
    };
    let _ = writeln!(s, "# mqa-fuzz {verdict}: run `{}`\n", r.run_id);
    for line in headline(r).lines() {
        let _ = writeln!(s, "> {line}  ");
    }
    let _ = writeln!(s);
    let shard = match (&r.shard, r.merged_shards.len()) {
        (Some(sh), _) => format!(", shard {sh}"),
        (None, 0) => String::new(),
        (None, n) => {
            let missing = missing_shards(r);
            if missing.is_empty() {
                format!(", {n} shards merged")
            } else {
                format!(", {n} shards merged, MISSING {}", shard_list(&missing))
            }
        }
    };
    let _ = writeln!(
        s,
        "Profile `{}`, seed {}{shard}; {} cases generated, {} replayed, {} skipped{}; {:.1} s wall{}.\n",
        r.profile,
        r.seed,
        group(r.counts.cases_generated),
        group(r.counts.cases_replayed),
        group(r.counts.cases_skipped),
        match r.counts.cases_left_at_deadline {
            0 => String::new(),
            n => format!(", {} left unrun at the budget's end", group(n)),
        },
        r.timings.wall_secs,
        if r.interrupted { ", INTERRUPTED" } else { "" }
    );
    let _ = writeln!(
        s,
        "Started {}, finished {}.\n",
        utc_time(r.started_unix),
        utc_time(r.finished_unix)
    );
    let _ = writeln!(s, "| kernel | {} |", KERNEL_COLUMNS.join(" | "));
    let _ = writeln!(s, "|---|{}", "---:|".repeat(KERNEL_COLUMNS.len()));
    for (name, k) in &r.per_kernel {
        let _ = writeln!(s, "| `{name}` | {} |", kernel_cells(k).join(" | "));
    }
    let _ = writeln!(s);
    for l in super::headline::not_run_lines(r) {
        let _ = writeln!(s, "{l}\n");
    }
    for l in super::headline::throughput(r) {
        let _ = writeln!(s, "{l}  ");
    }
    let medians = super::launches::launch_medians(r, 12);
    if !medians.is_empty() {
        let _ = writeln!(
            s,
            "\n| kernel | shape class | median kernel time (own clock) | launches |"
        );
        let _ = writeln!(s, "|---|---|---:|---:|");
        for (k, class, us, n) in medians {
            let _ = writeln!(
                s,
                "| `{k}` | {class} | {} | {} |",
                super::launches::show_us(us),
                group(n)
            );
        }
    }
    properties_md(&mut s, r);
    if !r.findings.is_empty() {
        let _ = writeln!(s, "\n## {}\n", crate::report::headline::bugs_line(r));
        let _ = writeln!(s, "{}\n", crate::report::headline::guard_by_tier(r));
        let _ = writeln!(
            s,
            "| kernel | profile | class | tier | trigger | cases | shrunk | rows × tokens | replay |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---:|---|---|---|");
        for f in r.findings.iter().take(MAX_LISTED) {
            let _ = writeln!(
                s,
                "| `{}` | {} | **{}**{} | {} | {} | {} | {} | {} × {} | `{}` |",
                f.kernel,
                f.profile,
                f.class_name(),
                f.reason
                    .as_deref()
                    .map(|r| format!(": {}", r.replace('|', "\\|")))
                    .unwrap_or_default(),
                f.tier.name(),
                f.needs,
                f.occurrences,
                crate::report::headline::shrunk_words(f),
                f.rows,
                f.tokens,
                f.replay_command.replace('|', "\\|")
            );
        }
        localisation_md(&mut s, r);
        if r.findings.len() > MAX_LISTED {
            let _ = writeln!(
                s,
                "\n… and {} more in `report.json` / `index.html`.",
                r.findings.len() - MAX_LISTED
            );
        }
    }
    if !r.coverage.axes.is_empty() {
        let _ = writeln!(
            s,
            "\n## Coverage\n\nCases per value of each axis (0: never reached).\n"
        );
        let _ = writeln!(s, "| axis | values (cases) |\n|---|---|");
        for (axis, values) in &r.coverage.axes {
            let v: Vec<String> = values.iter().map(|(k, n)| format!("{k} {n}")).collect();
            let _ = writeln!(s, "| {axis} | {} |", v.join(", "));
        }
    }
    let _ = writeln!(
        s,
        "\nDetails and pictures: `index.html`; machine-readable: `report.json`, `junit.xml`."
    );
    s
}

/// Where the findings crashed, as compute-sanitizer saw it (or why it did not).
fn localisation_md(s: &mut String, r: &Report) {
    let located: Vec<String> = r
        .findings
        .iter()
        .take(MAX_LISTED)
        .filter_map(|f| {
            let what = match (&f.localisation, &f.localisation_skipped) {
                (Some(l), _) => format!("localised: {}", l.sentence()),
                (None, Some(why)) => format!("not localised: {why}"),
                _ => return None,
            };
            Some(format!(
                "- `{}` {}: {}",
                f.kernel,
                f.class_name(),
                what.replace('|', "\\|")
            ))
        })
        .collect();
    if !located.is_empty() {
        let _ = writeln!(s, "\n### Where it crashed (compute-sanitizer)\n");
        for l in located {
            let _ = writeln!(s, "{l}");
        }
    }
}

/// The properties section (DESIGN §7): the verdict lines and a table per kernel.
fn properties_md(s: &mut String, r: &Report) {
    use crate::property::Property;
    let lines = super::headline::property_lines(r);
    if lines.is_empty() {
        return;
    }
    let required = if r.required.is_empty() {
        "none required: violations are reported here, not as findings (`--require` makes them findings)".to_string()
    } else {
        format!("required: {}", r.required.join(", "))
    };
    let _ = writeln!(s, "\n## Properties\n\n{required}.\n");
    for l in &lines {
        let _ = writeln!(s, "> {l}  ");
    }
    let _ = writeln!(
        s,
        "\n| kernel | property | checked | held | broken | not checked | extra runs |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|");
    for (name, k) in &r.per_kernel {
        for p in Property::ALL {
            let t = k.properties.tally(p);
            if t.checked.saturating_add(t.skipped) == 0 {
                continue;
            }
            let _ = writeln!(
                s,
                "| `{name}` | {} | {} | {} | {} | {} | {} |",
                p.name(),
                group(t.checked),
                group(t.held),
                group(t.broken),
                group(t.skipped),
                group(t.runs)
            );
        }
    }
}
