//! `index.html`: the report people read. Self-contained: inline CSS, pictures inline as
//! SVG, no scripts, nothing fetched — it opens from a CI artifact or an air-gapped box.

use super::fold::{missing_shards, shard_list};
use super::headline::{kernel_cells, kernel_headline, KERNEL_COLUMNS};
use super::model::{Finding, Report};
use super::svg::{class_map_svg, escape, histogram_svg};
use std::fmt::Write;

const CSS: &str = "body{font-family:sans-serif;margin:1.5em;color:#222;max-width:1100px}\
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ccc}h3{font-size:1em}\
.verdict{padding:.6em 1em;border-radius:4px;margin:.4em 0;font-weight:bold}\
.clean{background:#e3f4d7;border:1px solid #7fbf5f}.bad{background:#fbe0e0;border:1px solid #d05050}\
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;font-size:.9em;text-align:left}\
td.n{text-align:right}pre{background:#f4f4f4;padding:.5em;overflow-x:auto}\
.finding{border:1px solid #ddd;padding:.4em 1em;margin:1em 0;border-radius:4px}\
.cls{font-weight:bold;color:#b00}.muted{color:#666;font-size:.9em}";

/// Titles of the two pictures of finding `i` (shared by the inline and file copies).
pub fn picture_titles(i: usize, f: &Finding) -> (String, String) {
    (
        format!(
            "finding {} — {} on {}: classes per row × position",
            i + 1,
            f.class_name(),
            f.kernel
        ),
        format!(
            "finding {} — {} on {}: |err| / bound",
            i + 1,
            f.class_name(),
            f.kernel
        ),
    )
}

pub fn index_html(r: &Report) -> String {
    let mut s = String::new();
    let clean = r.findings.is_empty();
    let _ = write!(
        s,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>mqa-fuzz {} — {}</title><style>{CSS}</style></head><body>",
        if clean { "CLEAN" } else { "FINDINGS" },
        escape(&r.run_id)
    );
    let _ = write!(
        s,
        "<h1>mqa-fuzz: {}</h1>",
        if clean { "no findings" } else { "findings" }
    );
    for (name, k) in &r.per_kernel {
        let ok = k.with_findings == 0 && k.guard.redundant_cases == k.guard.cases;
        let _ = write!(
            s,
            "<div class=\"verdict {}\">{}</div>",
            if ok { "clean" } else { "bad" },
            escape(&kernel_headline(name, k))
        );
    }
    for line in crate::report::headline::property_lines(r) {
        let ok = !line.contains(": NOT ");
        let _ = write!(
            s,
            "<div class=\"verdict {}\">{}</div>",
            if ok { "clean" } else { "bad" },
            escape(&line)
        );
    }
    if r.interrupted {
        s.push_str("<p class=\"cls\">The run was interrupted: counts cover what ran.</p>");
    }
    // Findings first: the pictures are what a reader came for.
    if !r.findings.is_empty() {
        let _ = write!(
            s,
            "<h2>{}</h2><p>{}</p>",
            escape(&crate::report::headline::bugs_line(r)),
            escape(&crate::report::headline::guard_by_tier(r))
        );
        for (i, f) in r.findings.iter().enumerate() {
            finding_html(&mut s, i, f);
        }
    }
    s.push_str("<h2>Kernels</h2><table><tr><th>kernel</th><th>version</th>");
    for c in KERNEL_COLUMNS {
        let _ = write!(s, "<th>{c}</th>");
    }
    s.push_str("<th>kernel s</th></tr>");
    for (name, k) in &r.per_kernel {
        let version = r
            .kernels
            .iter()
            .find(|x| &x.name == name)
            .map(|x| x.version.clone())
            .unwrap_or_default();
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td>",
            escape(name),
            escape(&version)
        );
        for cell in kernel_cells(k) {
            let _ = write!(s, "<td class=n>{}</td>", escape(&cell));
        }
        let _ = write!(s, "<td class=n>{:.2}</td></tr>", k.kernel_secs);
    }
    s.push_str("</table>");
    run_html(&mut s, r);
    coverage_html(&mut s, r);
    s.push_str("</body></html>\n");
    s
}

fn finding_html(s: &mut String, i: usize, f: &Finding) {
    let _ = write!(s, "<div class=\"finding\" id=\"finding-{}\"><h3>{}. <span class=\"cls\">{}</span> on {} <span class=\"muted\">({} profile, {} case(s))</span></h3>", i + 1, i + 1, f.class_name(), escape(&f.kernel), escape(&f.profile), f.occurrences);
    s.push_str("<table>");
    let classes: Vec<String> = f.classes.iter().map(|(c, n)| format!("{c} ×{n}")).collect();
    let rows = [
        ("signature", f.signature.clone()),
        ("tier", f.tier.name().to_string()),
        ("trigger", f.needs.clone()),
        ("first offender at", f.position.join(", ")),
        ("classes", classes.join(", ")),
        ("verdict", f.verdict.to_string()),
        (
            "case",
            // The same numbers as the picture's caption, each named: rows of the
            // output, positions per row, and the KV tokens the case reads.
            format!(
                "{} rows (batch × next_n){}; {} KV tokens (context lengths summed); {}shrunk{}",
                f.rows,
                f.picture
                    .as_ref()
                    .map(|p| format!(" × {} positions (max_model_len)", p.cols))
                    .unwrap_or_default(),
                f.tokens,
                if f.shrunk { "" } else { "not " },
                f.shrink_cut_short
                    .map(|c| format!(", cut short ({})", c.words()))
                    .unwrap_or_default()
            ),
        ),
        (
            "seed",
            f.seed.map(|x| x.to_string()).unwrap_or_else(|| "—".into()),
        ),
        (
            "case file",
            f.case_file.clone().unwrap_or_else(|| "—".into()),
        ),
        (
            "guard",
            if f.verdict.guard.redundant {
                "redundant on this case".into()
            } else {
                format!(
                    "would change {} element(s) in {} row(s): nan {}, +inf {}, -inf {}",
                    f.verdict
                        .guard
                        .nan
                        .saturating_add(f.verdict.guard.pos_inf)
                        .saturating_add(f.verdict.guard.neg_inf),
                    f.verdict.guard.rows_affected,
                    f.verdict.guard.nan,
                    f.verdict.guard.pos_inf,
                    f.verdict.guard.neg_inf
                )
            },
        ),
    ];
    for (k, v) in rows {
        let _ = write!(s, "<tr><th>{k}</th><td>{}</td></tr>", escape(&v));
    }
    if let Some(l) = &f.localisation {
        let _ = write!(
            s,
            "<tr><th>localisation</th><td>{}<pre>{}</pre></td></tr>",
            escape(&l.sentence()),
            escape(&l.record.join("\n"))
        );
    } else if let Some(why) = &f.localisation_skipped {
        let _ = write!(
            s,
            "<tr><th>localisation</th><td>not localised: {}</td></tr>",
            escape(why)
        );
    }
    s.push_str("</table>");
    let _ = write!(s, "<pre>{}</pre>", escape(&f.replay_command));
    if !f.verdict.examples.is_empty() {
        s.push_str("<table><tr><th>class</th><th>row</th><th>pos</th><th>expected</th><th>got</th><th>bound</th><th>detail</th></tr>");
        let opt = |x: Option<String>| escape(&x.unwrap_or_default());
        for e in &f.verdict.examples {
            let _ = write!(
                s,
                "<tr><td>{}</td><td class=n>{}</td><td class=n>{}</td><td class=n>{}</td><td>{}</td><td class=n>{}</td><td>{}</td></tr>",
                e.class,
                opt(e.row.map(|x| x.to_string())),
                opt(e.pos.map(|x| x.to_string())),
                opt(e.expected.map(|x| format!("{x:e}"))),
                opt(e.got.clone()),
                opt(e.bound.map(|x| format!("{x:.3e}"))),
                opt(e.detail.clone())
            );
        }
        s.push_str("</table>");
    }
    let (map_title, hist_title) = picture_titles(i, f);
    if let Some(map) = &f.picture {
        let _ = write!(s, "<div>{}</div>", class_map_svg(map, &map_title));
    }
    if f.error_histogram.iter().any(|&n| n > 0) {
        let _ = write!(
            s,
            "<div>{}</div>",
            histogram_svg(&f.error_histogram, &hist_title)
        );
    }
    s.push_str("</div>");
}

fn run_html(s: &mut String, r: &Report) {
    s.push_str("<h2>Run</h2><table>");
    let shards = if let Some(sh) = r.shard {
        format!("shard {sh}")
    } else if !r.merged_shards.is_empty() {
        let missing = missing_shards(r);
        let list = shard_list(&r.merged_shards);
        if missing.is_empty() {
            format!("merged: {list}")
        } else {
            format!("merged: {list}; MISSING: {}", shard_list(&missing))
        }
    } else {
        "not sharded".into()
    };
    let mut rows = vec![
        ("run id", r.run_id.clone()),
        ("tool version", r.tool_version.clone()),
        ("profile / seed", format!("{} / {}", r.profile, r.seed)),
        ("shards", shards),
        ("budget", format!("{} s, max cases {}", r.budget_secs.map(|b| format!("{b}")).unwrap_or_else(|| "—".into()), r.max_cases.map(|c| c.to_string()).unwrap_or_else(|| "—".into()))),
        ("cases", format!("{} generated, {} replayed, {} skipped", r.counts.cases_generated, r.counts.cases_replayed, r.counts.cases_skipped)),
        ("started / finished", format!("{} / {}", super::markdown::utc_time(r.started_unix), super::markdown::utc_time(r.finished_unix))),
        ("host", format!("{} ({}, {} CPUs; GPUs: {})", r.environment.hostname, r.environment.os, r.environment.cpus, if r.environment.gpus.is_empty() { "none".into() } else { r.environment.gpus.join(", ") })),
        ("command", r.environment.command_line.clone()),
        (
            "time (s)",
            format!(
                "wall {:.1}; generate {:.1}, kernel {:.1}, reference {:.1}, oracle {:.1}, shrink {:.1}",
                r.timings.wall_secs, r.timings.generate_secs, r.timings.kernel_secs, r.timings.reference_secs, r.timings.oracle_secs, r.timings.shrink_secs
            ),
        ),
    ];
    // Shrinking against its caps, and a compile-keyed kernel's first calls (JIT included).
    rows.push(("shrinking", super::headline::shrink_words(r)));
    for (name, k) in &r.per_kernel {
        if let Some(c) = super::headline::compile_words(k) {
            rows.push(("kernel time by compile key", format!("{name}: {c}")));
        }
    }
    for (k, v) in rows {
        let _ = write!(s, "<tr><th>{k}</th><td>{}</td></tr>", escape(&v));
    }
    s.push_str("</table>");
    if !r.counts.skip_reasons.is_empty() {
        s.push_str("<h3>Skip reasons</h3><table>");
        for (why, n) in &r.counts.skip_reasons {
            let _ = write!(s, "<tr><td>{}</td><td class=n>{n}</td></tr>", escape(why));
        }
        s.push_str("</table>");
    }
}

fn coverage_html(s: &mut String, r: &Report) {
    if r.coverage.axes.is_empty() {
        return;
    }
    s.push_str("<h2>Coverage</h2><p class=\"muted\">Cases per value of each axis (a zero or missing value is an axis the campaign never reached).</p><table><tr><th>axis</th><th>values (cases)</th></tr>");
    for (axis, values) in &r.coverage.axes {
        let v: Vec<String> = values.iter().map(|(k, n)| format!("{k} ({n})")).collect();
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td></tr>",
            escape(axis),
            escape(&v.join(", "))
        );
    }
    s.push_str("</table>");
    if !r.coverage.combos.is_empty() {
        let _ = write!(
            s,
            "<p class=\"muted\">{} distinct axis combinations reached.</p>",
            r.coverage.combos.len()
        );
    }
}
