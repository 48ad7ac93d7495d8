//! Report writer, loader, merge and diff, on reports built from real kernel runs.

mod support;

use mqa_fuzz::generate::Recipe;
use mqa_fuzz::oracle::Class;
use mqa_fuzz::report::picture::{FIRST_OUT_OF_BOUND_BIN, NON_FINITE_BIN};
use mqa_fuzz::report::*;
use mqa_fuzz::shard::Shard;
use std::path::Path;
use std::process::Command;
use support::campaign;

const FILES: [&str; 4] = ["report.json", "junit.xml", "summary.md", "index.html"];

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mqa-fuzz"))
}

/// Validates `xml` against tests/data/junit-10.xsd with xmllint; `false` (with the reason
/// printed) when xmllint is not installed.
fn xmllint_validates(xml: &Path) -> bool {
    let xsd = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/junit-10.xsd");
    match Command::new("xmllint")
        .arg("--noout")
        .arg("--schema")
        .arg(&xsd)
        .arg(xml)
        .output()
    {
        Err(e) => {
            eprintln!(
                "SKIP junit XSD validation: xmllint not runnable ({e}); install libxml2-utils"
            );
            false
        }
        Ok(o) => {
            assert!(
                o.status.success(),
                "{} fails junit-10.xsd:\n{}",
                xml.display(),
                String::from_utf8_lossy(&o.stderr)
            );
            true
        }
    }
}

#[test]
fn report_with_findings_writes_every_file_and_reads_back() {
    let report = campaign("cpu:bug-tail-unwritten", "production", &[1, 2, 3], None);
    assert!(
        !report.findings.is_empty(),
        "the planted bug must produce a finding"
    );
    let f = &report.findings[0];
    assert!(f.classes.contains_key(&Class::Unwritten), "{:?}", f.classes);

    // The picture agrees with the oracle, element for element, and is zoomed.
    let map = f.picture.as_ref().unwrap();
    assert_eq!(
        map.counts.get("unwritten").copied(),
        f.classes.get(&Class::Unwritten).copied()
    );
    assert!(!map.whole_case);
    assert!(map.cells.iter().any(|l| l.contains('u')) && map.cells.iter().any(|l| l.contains('o')));
    // The histogram counts every judged element, the unwritten ones as non-finite.
    assert_eq!(
        f.error_histogram.iter().sum::<u64>(),
        f.verdict.metrics.checked
    );
    assert_eq!(
        f.error_histogram[NON_FINITE_BIN],
        f.classes[&Class::Unwritten]
    );

    let dir = tempfile::tempdir().unwrap();
    write_all(dir.path(), &report).unwrap();
    for name in FILES {
        assert!(dir.path().join(name).is_file(), "{name} missing");
    }
    let (map_file, hist_file) = picture_files(0);
    let svg = std::fs::read_to_string(dir.path().join(&map_file)).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains(&CellClass::Unwritten.hex()));
    assert!(dir.path().join(&hist_file).is_file());

    // Round trip, including the infinite error ratio of the unwritten elements.
    let back = load(dir.path()).unwrap();
    assert_eq!(back, report);
    assert!(back.findings[0]
        .verdict
        .metrics
        .max_err_over_bound
        .is_infinite());

    let html = std::fs::read_to_string(dir.path().join("index.html")).unwrap();
    assert!(html.contains("<svg") && html.contains(&CellClass::Unwritten.hex()));
    assert!(
        !html.contains("src=") && !html.contains("href=") && !html.contains("<script"),
        "index.html must be self-contained"
    );
    let md = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
    assert!(
        md.contains("FINDINGS") && md.contains("guard NEEDED"),
        "{md}"
    );
    let xml = std::fs::read_to_string(dir.path().join("junit.xml")).unwrap();
    assert!(
        xml.contains("<failure") && xml.contains(&f.signature),
        "{xml}"
    );
    xmllint_validates(&dir.path().join("junit.xml"));

    let h = headline(&report);
    let g = &report.per_kernel["cpu:bug-tail-unwritten"].guard;
    assert!(
        h.starts_with("cpu:bug-tail-unwritten: guard NEEDED on 3/3 cases"),
        "{h}"
    );
    assert!(h.contains(&format!("nan {}", g.nan)) && g.nan > 0, "{h}");
}

#[test]
fn the_junit_schema_rejects_what_ci_would_reject() {
    // Negative control: the schema check can fail (testsuite without its required counts).
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.xml");
    std::fs::write(
        &bad,
        "<testsuites><testsuite name=\"x\"><testcase name=\"t\"/></testsuite></testsuites>",
    )
    .unwrap();
    let xsd = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/junit-10.xsd");
    match Command::new("xmllint")
        .arg("--noout")
        .arg("--schema")
        .arg(&xsd)
        .arg(&bad)
        .output()
    {
        Err(e) => eprintln!(
            "SKIP junit XSD negative control: xmllint not runnable ({e}); install libxml2-utils"
        ),
        Ok(o) => assert!(
            !o.status.success(),
            "the schema must reject a testsuite without tests/failures/errors"
        ),
    }
}

#[test]
fn clean_report_writes_every_file_with_the_guard_headline() {
    let report = campaign("cpu:chunked", "production", &[1, 2, 3, 4], None);
    assert!(report.findings.is_empty());
    let dir = tempfile::tempdir().unwrap();
    write_all(dir.path(), &report).unwrap();
    for name in FILES {
        assert!(dir.path().join(name).is_file(), "{name} missing");
    }
    let k = &report.per_kernel["cpu:chunked"];
    let h = headline(&report);
    let want = format!(
        "cpu:chunked: guard redundant on 4/4 cases ({} rows, {} logits checked in the valid range); 95% upper bound on the per-case failure rate 3/4 = 75.0%",
        headline::group(k.rows_checked),
        headline::group(k.logits_checked)
    );
    assert_eq!(h, want);
    let xml = std::fs::read_to_string(dir.path().join("junit.xml")).unwrap();
    assert!(
        !xml.contains("<failure") && xml.contains("production: no findings"),
        "{xml}"
    );
    xmllint_validates(&dir.path().join("junit.xml"));
    assert_eq!(load(dir.path()).unwrap(), report);
}

#[test]
fn mismatch_findings_land_beyond_the_bound_in_the_histogram() {
    // e4m3fnuz data decoded with the e4m3fn table: every nonzero value doubled.
    let report =
        support::campaign_with("cpu:bug-fnuz-as-fn", "production", &[1, 2, 3], None, |r| {
            r.knobs.format = mqa_fuzz::fp8::Fp8Format::E4m3fnuz
        });
    let f = report
        .findings
        .iter()
        .find(|f| f.classes.contains_key(&Class::Mismatch))
        .expect("a mismatch finding");
    let beyond: u64 = f.error_histogram[FIRST_OUT_OF_BOUND_BIN..NON_FINITE_BIN]
        .iter()
        .sum();
    assert_eq!(
        beyond,
        f.classes[&Class::Mismatch],
        "{:?}",
        f.error_histogram
    );
    assert!(f
        .picture
        .as_ref()
        .unwrap()
        .cells
        .iter()
        .any(|l| l.contains('m')));
    let clean = campaign("cpu:chunked", "production", &[1, 2, 3], None);
    assert_eq!(clean.per_kernel["cpu:chunked"].guard.redundant_cases, 3);
}

#[test]
fn picture_zooms_to_where_the_findings_are() {
    // Split-KV drop: only the rows and positions past a split boundary are wrong.
    let report = campaign("cpu:bug-split-boundary-drop", "production", &[1], None);
    let map = report.findings[0].picture.as_ref().unwrap();
    assert!(
        !map.whole_case && map.row_start > 0 && map.col_start > 0,
        "{map:?}"
    );
    assert!(map.col_end <= map.cols && map.row_end <= map.rows);
    // Every finding element of the case is inside the window: the window's finding
    // cells cover what the oracle counted (cells are 1×k here, so count elements).
    let shown: usize = map
        .cells
        .iter()
        .map(|l| l.chars().filter(|c| *c == 'u').count())
        .sum();
    assert!(
        shown as u64 * map.cols_per_cell as u64 >= report.findings[0].classes[&Class::Unwritten]
    );
}

fn shard_reports() -> Vec<Report> {
    [[1u64, 2], [3, 4], [5, 6]]
        .iter()
        .enumerate()
        .map(|(i, seeds)| {
            let mut r = campaign(
                "cpu:bug-tail-unwritten",
                "production",
                seeds,
                Some(Shard {
                    index: i as u32,
                    count: 3,
                }),
            );
            let clean = campaign("cpu:chunked", "production", seeds, None);
            r.per_kernel.extend(clean.per_kernel);
            r.counts.cases_skipped = i as u64;
            *r.counts
                .skip_reasons
                .entry("block size".into())
                .or_default() += i as u64;
            r.timings.wall_secs = 10.0 + i as f64;
            r.timings.kernel_secs = 1.0;
            r
        })
        .collect()
}

#[test]
fn merge_of_three_shards_is_their_sum() {
    let shards = shard_reports();
    let m = merge(&shards);
    let sum = |f: &dyn Fn(&Report) -> u64| shards.iter().map(f).sum::<u64>();
    assert_eq!(m.counts.cases_generated, sum(&|r| r.counts.cases_generated));
    assert_eq!(m.counts.cases_skipped, 3);
    assert_eq!(m.counts.skip_reasons["block size"], 3);
    for kernel in ["cpu:bug-tail-unwritten", "cpu:chunked"] {
        let k = &m.per_kernel[kernel];
        assert_eq!(k.cases, sum(&|r| r.per_kernel[kernel].cases));
        assert_eq!(
            k.logits_checked,
            sum(&|r| r.per_kernel[kernel].logits_checked)
        );
        assert_eq!(k.guard.cases, sum(&|r| r.per_kernel[kernel].guard.cases));
        assert_eq!(k.guard.nan, sum(&|r| r.per_kernel[kernel].guard.nan));
        assert_eq!(
            k.guard.redundant_cases,
            sum(&|r| r.per_kernel[kernel].guard.redundant_cases)
        );
    }
    // The same signature in every shard: one finding, occurrences summed.
    let sigs: std::collections::BTreeSet<_> = shards
        .iter()
        .flat_map(|r| r.findings.iter().map(|f| f.signature.clone()))
        .collect();
    assert_eq!(m.findings.len(), sigs.len());
    let total: u64 = shards
        .iter()
        .flat_map(|r| &r.findings)
        .map(|f| f.occurrences)
        .sum();
    assert_eq!(m.findings.iter().map(|f| f.occurrences).sum::<u64>(), total);
    assert_eq!(m.coverage.axes["block_size"]["16"], 6);
    assert_eq!(
        m.timings.wall_secs, 12.0,
        "shards run side by side: the longest"
    );
    assert_eq!(m.timings.kernel_secs, 3.0);
    assert_eq!(m.merged_shards.len(), 3);
    assert!(missing_shards(&m).is_empty());
    assert!(missing_shards(&merge(&shards[..2])) == vec![Shard { index: 2, count: 3 }]);

    // Merging shards gives the report of the unsharded campaign (up to bookkeeping).
    let whole = campaign(
        "cpu:bug-tail-unwritten",
        "production",
        &[1, 2, 3, 4, 5, 6],
        None,
    );
    assert_eq!(
        m.per_kernel["cpu:bug-tail-unwritten"],
        whole.per_kernel["cpu:bug-tail-unwritten"]
    );
    assert_eq!(
        m.findings
            .iter()
            .map(|f| (&f.signature, f.occurrences))
            .collect::<Vec<_>>(),
        whole
            .findings
            .iter()
            .map(|f| (&f.signature, f.occurrences))
            .collect::<Vec<_>>()
    );

    // Through the CLI.
    let dirs: Vec<_> = shards
        .iter()
        .map(|r| {
            let d = tempfile::tempdir().unwrap();
            write_all(d.path(), r).unwrap();
            d
        })
        .collect();
    let out = tempfile::tempdir().unwrap();
    let st = bin()
        .arg("merge")
        .args(dirs.iter().map(|d| d.path()))
        .arg("--out")
        .arg(out.path())
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(1), "findings → exit 1");
    assert_eq!(load(out.path()).unwrap(), m);
}

fn with_signatures(sigs: &[&str]) -> Report {
    let base = campaign("cpu:bug-tail-unwritten", "production", &[1], None);
    let template = base.findings[0].clone();
    Report {
        findings: sigs
            .iter()
            .map(|s| Finding {
                // Findings of different kernels: different bugs by any rule.
                signature: s.to_string(),
                kernel: s.to_string(),
                ..template.clone()
            })
            .collect(),
        ..base
    }
}

#[test]
fn diff_sorts_new_fixed_unchanged_and_gates_on_new() {
    let base = with_signatures(&["A", "B"]);
    let cand = with_signatures(&["B", "C"]);
    let d = diff(&base, &cand);
    let sigs = |v: &[Finding]| v.iter().map(|f| f.signature.clone()).collect::<Vec<_>>();
    assert_eq!(sigs(&d.new), ["C"]);
    assert_eq!(sigs(&d.fixed), ["A"]);
    assert_eq!(sigs(&d.unchanged), ["B"]);

    let (b, c) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write_all(b.path(), &base).unwrap();
    write_all(c.path(), &cand).unwrap();
    let o = bin()
        .arg("diff")
        .arg(b.path())
        .arg(c.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let text = String::from_utf8_lossy(&o.stdout);
    // A is gone from the candidate, but its saved case is not here to replay, so nobody
    // can say it is fixed: it is listed as unconfirmed, with why.
    assert!(
        text.contains("1 new, 0 fixed, 1 unchanged finding(s), 1 not met and not replayable here")
            && text.contains("NEW")
            && text.contains("UNCONFIRMED")
            && text.contains("No such file or directory"),
        "{text}"
    );
    // Only fixed findings: no gate.
    let fixed_only = with_signatures(&["B"]);
    write_all(c.path(), &fixed_only).unwrap();
    assert_eq!(
        bin()
            .arg("diff")
            .arg(b.path())
            .arg(c.path())
            .status()
            .unwrap()
            .code(),
        Some(0)
    );
    // Bad input: exit 2.
    let missing = b.path().join("nope");
    assert_eq!(
        bin()
            .arg("diff")
            .arg(&missing)
            .arg(c.path())
            .status()
            .unwrap()
            .code(),
        Some(2)
    );
}

#[test]
fn bad_report_json_is_exit_2_naming_file_and_field() {
    let report = campaign("cpu:bug-tail-unwritten", "production", &[1], None);
    let dir = tempfile::tempdir().unwrap();
    write_all(dir.path(), &report).unwrap();
    let path = dir.path().join("report.json");
    let text = std::fs::read_to_string(&path).unwrap();

    let cases: Vec<(String, &str)> = vec![
        // Truncated mid-file: the field being read when the input ended.
        (
            text[..text.find("\"per_kernel\"").unwrap() + 40].to_string(),
            "per_kernel",
        ),
        (
            text.replacen("\"cases_generated\": 1", "\"cases_generated\": \"many\"", 1),
            "counts.cases_generated",
        ),
        (
            text.replacen("\"class\": \"unwritten\"", "\"class\": \"purple\"", 1),
            "findings[0].class",
        ),
        (
            text.replacen("\"report_version\": 1", "\"report_version\": 99", 1),
            "report_version",
        ),
        ("garbage".to_string(), "(top level)"),
        // Truncated inside a key: the key is not known yet, the object it is in is.
        (
            text[..text.find("\"counts\"").unwrap() + 4].to_string(),
            "field (top level): file is truncated",
        ),
        (
            text[..text.find("\"cases_generated\"").unwrap() + 4].to_string(),
            "field counts (a key): file is truncated",
        ),
    ];
    for (bad, field) in cases {
        assert_ne!(bad, text);
        std::fs::write(&path, &bad).unwrap();
        let e = load(dir.path()).unwrap_err();
        assert_eq!(e.code, 2);
        assert!(
            e.message.contains("report.json") && e.message.contains(field),
            "want {field}: {}",
            e.message
        );
        let o = bin().arg("report").arg(dir.path()).output().unwrap();
        assert_eq!(o.status.code(), Some(2));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(err.contains(field), "{err}");
    }
}

#[test]
fn report_subcommand_rerenders_from_report_json() {
    let report = campaign("cpu:bug-tail-unwritten", "production", &[1], None);
    let dir = tempfile::tempdir().unwrap();
    write_all(dir.path(), &report).unwrap();
    for name in ["junit.xml", "summary.md", "index.html"] {
        std::fs::remove_file(dir.path().join(name)).unwrap();
    }
    std::fs::remove_dir_all(dir.path().join("pictures")).unwrap();
    let o = bin().arg("report").arg(dir.path()).output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for name in FILES {
        assert!(dir.path().join(name).is_file(), "{name} not re-rendered");
    }
    assert!(dir.path().join(picture_files(0).0).is_file());
    assert!(String::from_utf8_lossy(&o.stdout).contains("guard NEEDED"));
}

/// Cost of the pictures on a realistic decode batch (run with
/// `cargo test --release --test report -- --ignored --nocapture picture_cost`).
#[test]
#[ignore]
fn picture_cost() {
    use mqa_fuzz::harness::{run_and_judge, ReferenceCache};
    let mut r = Recipe::small(vec![16384, 9000, 12000, 16000], 2, 9);
    r.knobs.heads = 64;
    r.knobs.head_dim = 128;
    r.knobs.block_size = 64;
    let case = r.materialize();
    let k = mqa_fuzz::kernel::open("cpu:bug-tail-unwritten").unwrap();
    let mut refs = ReferenceCache::new(&case);
    let t = std::time::Instant::now();
    let j = run_and_judge(k.as_ref(), &case, &mut refs, &Default::default());
    let judge = t.elapsed();
    let out = j.output.unwrap();
    let reference = refs.get(k.capabilities().scale_placement);
    let t = std::time::Instant::now();
    let map = class_map(&case, reference, k.capabilities(), &out);
    let map_time = t.elapsed();
    let t = std::time::Instant::now();
    let hist = error_histogram(&case, reference, k.capabilities(), &out);
    let hist_time = t.elapsed();
    let report = Report {
        report_version: REPORT_VERSION,
        findings: vec![Finding {
            signature: "x".into(),
            picture: Some(map.clone()),
            error_histogram: hist.clone(),
            verdict: j.verdict.clone(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let t = std::time::Instant::now();
    write_all(dir.path(), &report).unwrap();
    let write_time = t.elapsed();
    let t = std::time::Instant::now();
    load(dir.path()).unwrap();
    let load_time = t.elapsed();
    let html = std::fs::metadata(dir.path().join("index.html"))
        .unwrap()
        .len();
    let json = std::fs::metadata(dir.path().join("report.json"))
        .unwrap()
        .len();
    eprintln!(
        "rows {} cols {} logits {}: run+judge {judge:?}; class_map {map_time:?} ({}x{} cells, {}x{} per cell); histogram {hist_time:?}; write_all {write_time:?} (index.html {html} B, report.json {json} B); load {load_time:?}",
        case.rows(),
        case.max_model_len,
        j.verdict.metrics.checked,
        map.cells.len(),
        map.cells[0].len(),
        map.rows_per_cell,
        map.cols_per_cell
    );
}

#[test]
fn big_cases_aggregate_cells_keeping_the_worst_class() {
    use mqa_fuzz::harness::{run_and_judge, ReferenceCache};
    use mqa_fuzz::report::picture::{MAX_CELL_COLS, MAX_CELL_ROWS};
    // 150 sequences × next_n 2 = 300 rows, rows up to 1,500 positions: more than one
    // row and position per cell.
    let lens: Vec<usize> = (0..150).map(|b| 300 + (b * 97) % 1200).collect();
    let case = Recipe::small(lens, 2, 3).materialize();
    let k = mqa_fuzz::kernel::open("cpu:bug-tail-unwritten").unwrap();
    let mut refs = ReferenceCache::new(&case);
    let j = run_and_judge(k.as_ref(), &case, &mut refs, &Default::default());
    let map = class_map(
        &case,
        refs.get(k.capabilities().scale_placement),
        k.capabilities(),
        j.output.as_ref().unwrap(),
    );
    assert!(
        map.rows_per_cell > 1 && map.cols_per_cell > 1,
        "{} x {}",
        map.rows_per_cell,
        map.cols_per_cell
    );
    assert!(
        map.cells.len() <= MAX_CELL_ROWS
            && map.cells.iter().all(|l| l.chars().count() <= MAX_CELL_COLS)
    );
    // Unwritten elements are rarer than ok ones, yet every cell row that covers one shows it.
    let unwritten_rows: std::collections::BTreeSet<usize> = j
        .verdict
        .examples
        .iter()
        .filter_map(|e| e.row)
        .map(|r| (r - map.row_start) / map.rows_per_cell)
        .collect();
    for cr in unwritten_rows {
        assert!(
            map.cells[cr].contains('u'),
            "cell row {cr}: {}",
            map.cells[cr]
        );
    }
    assert_eq!(
        map.counts["unwritten"],
        j.verdict.classes[&Class::Unwritten]
    );
}

/// Shard `k` of two, `base` with `findings`.
fn shard_of_two(base: &Report, k: u32, findings: Vec<Finding>) -> Report {
    Report {
        shard: Some(Shard { index: k, count: 2 }),
        findings,
        ..base.clone()
    }
}

/// Two shards that found one bug on cases past 2^31 and past 2^32 (triggers
/// `kv-offset-2g` and `kv-offset-4g`: the stronger band implies the weaker) merge into
/// one finding, the more general one, their occurrences added; an unrelated trigger
/// stays apart.
#[test]
fn merge_folds_a_stronger_offset_band_into_the_weaker() {
    let base = with_signatures(&["x"]);
    let f = |sig: &str, trigger: &[&str], occ: u64| Finding {
        signature: sig.into(),
        trigger: trigger.iter().map(|s| s.to_string()).collect(),
        occurrences: occ,
        class: Some(Class::Nan),
        ..base.findings[0].clone()
    };
    let shard = |k: u32, findings: Vec<Finding>| shard_of_two(&base, k, findings);
    let m = merge(&[
        shard(0, vec![f("k|nan|needs:kv-offset-4g", &["kv-offset-4g"], 2)]),
        shard(
            1,
            vec![
                f("k|nan|needs:kv-offset-2g", &["kv-offset-2g"], 3),
                f("k|nan|needs:layout", &["layout"], 1),
            ],
        ),
    ]);
    let sigs: Vec<(&str, u64)> = m
        .findings
        .iter()
        .map(|f| (f.signature.as_str(), f.occurrences))
        .collect();
    assert_eq!(
        sigs,
        [("k|nan|needs:kv-offset-2g", 5), ("k|nan|needs:layout", 1)]
    );
}

/// A bug shown to need something is not folded into one that could not have needed it:
/// one whose complete ablation needs nothing special, or one never ablated whose case
/// lacked that feature (its bug cannot be the other). Never ablated on a case that had the
/// feature, it is that bug, folded into the complete finding.
#[test]
fn merge_keeps_a_bug_shown_to_need_a_feature_apart_from_one_that_could_not_need_it() {
    let base = with_signatures(&["x"]);
    let f = |sig: &str, trigger: &[&str], complete: bool, case: &[&str]| Finding {
        signature: sig.into(),
        trigger: trigger.iter().map(|s| s.to_string()).collect(),
        trigger_complete: complete,
        case_features: case.iter().map(|s| s.to_string()).collect(),
        occurrences: 1,
        class: Some(Class::Nan),
        ..base.findings[0].clone()
    };
    let shard = |k: u32, findings: Vec<Finding>| shard_of_two(&base, k, findings);
    let needs_layout = || f("k|nan|needs:layout", &["layout"], true, &["layout"]);
    let sigs = |m: &Report| {
        let mut v: Vec<(String, u64)> = m
            .findings
            .iter()
            .map(|f| (f.signature.clone(), f.occurrences))
            .collect();
        v.sort();
        v
    };
    let apart = |other: Finding| {
        let m = merge(&[shard(0, vec![other]), shard(1, vec![needs_layout()])]);
        assert_eq!(
            sigs(&m),
            [
                ("k|nan".to_string(), 1),
                ("k|nan|needs:layout".to_string(), 1)
            ]
        );
    };
    apart(f("k|nan", &[], true, &["hostile-values"]));
    apart(f("k|nan", &[], false, &["hostile-values"]));
    let m = merge(&[
        shard(
            0,
            vec![f("k|nan", &[], false, &["layout", "hostile-values"])],
        ),
        shard(1, vec![needs_layout()]),
    ]);
    assert_eq!(sigs(&m), [("k|nan|needs:layout".to_string(), 2)]);
}

/// Counts in a report come from a file another machine wrote: shards whose every count
/// is `u64::MAX` (or that contradict each other) merge and render without an overflow (tests build with overflow checks:
/// an unchecked `+` panics here), and the sums stay at `u64::MAX`.
#[test]
fn counts_at_u64_max_merge_and_render_saturated() {
    fn saturate(v: &mut serde_json::Value, key: &str) {
        use serde_json::Value;
        match v {
            // Fields of other widths (the property repeat, the shard index) and the
            // verdicts (positions, times) are not counts.
            _ if matches!(key, "verdict" | "repeat" | "shard" | "report_version") => {}
            Value::Number(n) if n.is_u64() => *v = Value::from(u64::MAX),
            Value::Array(a) => a.iter_mut().for_each(|x| saturate(x, key)),
            Value::Object(o) => o.iter_mut().for_each(|(k, x)| saturate(x, k)),
            _ => {}
        }
    }
    let shards: Vec<Report> = shard_reports()
        .into_iter()
        .map(|r| {
            let mut v = serde_json::to_value(&r).unwrap();
            saturate(&mut v, "");
            let text = serde_json::to_vec(&v).unwrap();
            parse(Path::new("max.json"), &text).expect("a saturated report parses")
        })
        .collect();
    assert_eq!(shards[0].counts.cases_generated, u64::MAX);
    let m = merge(&shards);
    assert_eq!(m.counts.cases_generated, u64::MAX);
    assert_eq!(m.per_kernel["cpu:chunked"].cases, u64::MAX);
    assert!(m.findings.iter().all(|f| f.occurrences == u64::MAX));
    for r in [&shards[0], &m] {
        assert!(headline(r).contains("18,446,744,073,709,551,615"));
        let _ = (
            junit::junit_xml(r),
            markdown::summary_md(r),
            html::index_html(r),
        );
    }
    let text = serde_json::to_vec(&m).unwrap();
    parse(Path::new("merged.json"), &text).expect("the merged report parses back");
    // Counts that contradict each other (a hand-edited file): more redundant cases
    // than cases.
    let mut odd = shard_reports().remove(0);
    for k in odd.per_kernel.values_mut() {
        k.guard.redundant_cases = k.guard.cases + 1;
    }
    let _ = (
        headline(&odd),
        markdown::summary_md(&odd),
        html::index_html(&odd),
    );
}

/// A GPU worker's crashes report no clock: their walls are counted apart from the
/// kernel's own clock, not in it.
#[test]
fn runs_without_a_clock_are_not_the_kernels_time() {
    let mut r = Report::default();
    r.counts.cases_generated = 100;
    r.timings.wall_secs = 30.0;
    r.per_kernel.insert(
        "deepgemm".into(),
        KernelStats {
            cases: 100,
            kernel_secs: 9.01,
            unclocked_runs: 5,
            unclocked_secs: 9.0,
            run_wall_secs: 29.0,
            ..Default::default()
        },
    );
    let lines = headline::throughput(&r);
    assert!(
        lines[1].contains("kernel's own clock 0.010 s, 5 runs without a clock of their own (crashes: the fault, the worker's death) 9.0 s, rest of the call (worker protocol, transfers) 20.0 s"),
        "{lines:?}"
    );
    // A CPU kernel: no run has a clock of its own; the call is its clock.
    let k = r.per_kernel.get_mut("deepgemm").unwrap();
    k.unclocked_runs = 100;
    k.unclocked_secs = 9.01;
    let lines = headline::throughput(&r);
    assert!(
        lines[1].contains("kernel's own clock 9.010 s, rest"),
        "{lines:?}"
    );
}
