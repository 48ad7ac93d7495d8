//! Determinism and batch invariance (DESIGN §7): the planted property bugs break them
//! bitwise on the cases a campaign generates while every element stays within its
//! bound; the clean kernels keep them; a campaign reports them in their own section and
//! makes them findings (shrunk, saved, replayed) only under `--require`.

use mqa_fuzz::campaign::{case_seed, value_tree};
use mqa_fuzz::case::Case;
use mqa_fuzz::generate::strategy::draw_strategy_scaled;
use mqa_fuzz::generate::{Profile, Recipe};
use mqa_fuzz::harness::judge_once;
use mqa_fuzz::kernel::{self, Kernel, OutputBuffer};
use mqa_fuzz::oracle::Class;
use mqa_fuzz::property::{batch, determinism, Outcome};
use proptest::strategy::ValueTree;
use std::path::{Path, PathBuf};

mod support;
use support::binary::{run, scratch};

fn first_run(k: &dyn Kernel, case: &Case) -> OutputBuffer {
    let mut out = OutputBuffer::for_case(case);
    k.run(case, &mut out).expect("runs");
    out
}

/// The first `n` cases a `--profile all` campaign of seed 1 generates for `k`.
fn campaign_cases(k: &dyn Kernel, n: u64) -> Vec<Case> {
    (0..n)
        .map(|i| {
            let draw = value_tree(
                &draw_strategy_scaled(Profile::All, i, 1.0 / 64.0),
                case_seed(1, i),
            )
            .current();
            let (recipe, _) = draw.resolve(&[k.capabilities()]);
            recipe.materialize()
        })
        .filter(|c| c.validate().is_ok() && c.output_bytes() < (256 << 20))
        .collect()
}

fn broken(o: &Outcome) -> bool {
    matches!(o, Outcome::Broken(_))
}

#[test]
fn the_nondeterministic_plant_differs_bitwise_on_generated_cases_within_every_bound() {
    let bug = kernel::open("cpu:bug-nondeterministic").unwrap();
    let clean = kernel::open("cpu:chunked").unwrap();
    let (mut eligible, mut caught) = (0, 0);
    for case in campaign_cases(bug.as_ref(), 40) {
        // Within every error bound: the oracle alone sees nothing.
        let v = judge_once(bug.as_ref(), &case);
        assert!(
            v.classes.keys().all(|c| *c != Class::Mismatch),
            "the plant must stay within the bound: {v:?}"
        );
        let first = first_run(bug.as_ref(), &case);
        let (o, runs) = determinism::check(bug.as_ref(), &case, &first, 2);
        assert_eq!(runs, 1);
        // The clean kernel is bitwise deterministic on the same case.
        let cf = first_run(clean.as_ref(), &case);
        let (co, _) = determinism::check(clean.as_ref(), &case, &cf, 3);
        assert_eq!(co, Outcome::Held, "cpu:chunked is deterministic");
        if case.shape.heads >= 3 && case.valid_elements() >= 8 {
            eligible += 1;
            caught += broken(&o) as u32;
        } else if case.shape.heads <= 2 {
            // Two terms add the same in either order: nothing to see, and nothing claimed.
            assert!(!broken(&o), "H={} cannot reorder: {o:?}", case.shape.heads);
        }
    }
    eprintln!(
        "cpu:bug-nondeterministic differs on {caught}/{eligible} generated cases with H >= 3"
    );
    assert!(eligible >= 8, "too few cases with 3+ heads: {eligible}");
    assert!(
        caught * 4 >= eligible * 3,
        "the plant must change bits on most cases it can: {caught}/{eligible}"
    );
}

#[test]
fn the_batch_variant_plant_differs_alone_on_generated_cases_and_is_not_nondeterministic() {
    let bug = kernel::open("cpu:bug-batch-variant").unwrap();
    let clean = kernel::open("cpu:chunked").unwrap();
    let naive = kernel::open("cpu:naive").unwrap();
    let (mut eligible, mut caught) = (0, 0);
    for case in campaign_cases(bug.as_ref(), 40) {
        let first = first_run(bug.as_ref(), &case);
        // Deterministic: only its neighbours change its bits.
        let (d, _) = determinism::check(bug.as_ref(), &case, &first, 2);
        assert_eq!(d, Outcome::Held);
        let (o, _) = batch::check(bug.as_ref(), &case, &first);
        for k in [&clean, &naive] {
            let f = first_run(k.as_ref(), &case);
            let (co, _) = batch::check(k.as_ref(), &case, &f);
            assert!(!broken(&co), "{} is batch-invariant: {co:?}", k.name());
        }
        if case.shape.heads >= 3 && batch::chosen_sequence(&case).is_some() {
            eligible += 1;
            caught += broken(&o) as u32;
        }
    }
    eprintln!("cpu:bug-batch-variant differs on {caught}/{eligible} generated batches with H >= 3");
    assert!(
        eligible >= 5,
        "too few multi-sequence cases with 3+ heads: {eligible}"
    );
    assert!(
        caught * 2 >= eligible,
        "the plant must change bits on many batches: {caught}/{eligible}"
    );
}

#[test]
fn a_nondeterministic_kernel_is_not_also_called_batch_variant() {
    let bug = kernel::open("cpu:bug-nondeterministic").unwrap();
    let case = Recipe::small(vec![300, 700, 41], 1, 9).materialize();
    let first = first_run(bug.as_ref(), &case);
    let (o, runs) = batch::check(bug.as_ref(), &case, &first);
    assert!(
        matches!(&o, Outcome::Skipped(why) if why.contains("not deterministic")),
        "{o:?}"
    );
    assert_eq!(runs, 3, "alone, reversed, and the batch again");
    // And the batch-variant plant on the same case is caught, naming the sequence.
    let bv = kernel::open("cpu:bug-batch-variant").unwrap();
    let first = first_run(bv.as_ref(), &case);
    match batch::check(bv.as_ref(), &case, &first).0 {
        Outcome::Broken(b) => {
            assert!(b.detail.contains("sequence 0 of 3 differs"), "{}", b.detail);
            assert!(b.differing > 0 && b.max_ulps > 0, "{b:?}");
            let (r, t) = b.first.unwrap();
            assert!(
                r < 1 && t < 300,
                "the first difference is in sequence 0's row: {r} {t}"
            );
        }
        o => panic!("batch-variant plant not caught: {o:?}"),
    }
}

// ---- campaigns through the binary ----

fn tmp(name: &str) -> PathBuf {
    scratch("properties", name)
}

fn report(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap()
}

const CAMPAIGN: [&str; 9] = [
    "--cases",
    "12",
    "--seed",
    "1",
    "--no-replay",
    "--quiet",
    "--shrink-budget",
    "10s",
    "--profile",
];

#[test]
fn a_broken_property_is_reported_in_its_section_and_is_no_finding_unless_required() {
    let d = tmp("reported");
    let args = [
        &[
            "run",
            "--kernel",
            "cpu:bug-nondeterministic",
            "--repeat",
            "2",
        ][..],
        &CAMPAIGN,
        &["layout", "--report", "rep"],
    ]
    .concat();
    let (code, out, err) = run(&d, &args);
    assert_eq!(code, 0, "not required: no finding\n{out}\n{err}");
    assert!(
        out.contains("cpu:bug-nondeterministic: NOT bitwise deterministic on "),
        "{out}"
    );
    let r = report(&d.join("rep"));
    assert_eq!(r["findings"].as_array().unwrap().len(), 0);
    assert_eq!(r["required"], serde_json::json!([]));
    let t = &r["per_kernel"]["cpu:bug-nondeterministic"]["properties"];
    assert_eq!(t["repeat"], 2);
    assert!(t["deterministic"]["broken"].as_u64().unwrap() > 0, "{t}");
    assert!(
        t["deterministic"]["first_break"]
            .as_str()
            .unwrap()
            .contains("differ from run 1"),
        "{t}"
    );
    // Batch invariance was not asked for on the CPU (auto is off there).
    assert_eq!(t["batch_invariant"]["checked"], 0);
    let md = std::fs::read_to_string(d.join("rep/summary.md")).unwrap();
    assert!(
        md.contains("## Properties") && md.contains("NOT bitwise deterministic"),
        "{md}"
    );
    let junit = std::fs::read_to_string(d.join("rep/junit.xml")).unwrap();
    assert!(junit.contains("property: deterministic"), "{junit}");
    let html = std::fs::read_to_string(d.join("rep/index.html")).unwrap();
    assert!(html.contains("NOT bitwise deterministic"));

    // The clean kernel, both checks on: both hold, said in the headline.
    let (code, out, err) = run(
        &d,
        &[
            &[
                "run",
                "--kernel",
                "cpu:chunked",
                "--repeat",
                "2",
                "--batch-invariance",
                "on",
            ][..],
            &CAMPAIGN,
            &["all", "--report", "clean"],
        ]
        .concat(),
    );
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("cpu:chunked: bitwise deterministic on 12/12 cases (2 runs each)"),
        "{out}"
    );
    assert!(out.contains("cpu:chunked: batch-invariant on "), "{out}");
    assert!(!out.contains("NOT"), "{out}");
}

#[test]
fn a_required_property_is_a_finding_shrunk_keeping_the_property_and_replayed() {
    for (bug, prop, class) in [
        (
            "cpu:bug-nondeterministic",
            "deterministic",
            "nondeterministic",
        ),
        ("cpu:bug-batch-variant", "batch-invariant", "batch_variant"),
    ] {
        let d = tmp(class);
        let args = [
            &[
                "run",
                "--kernel",
                bug,
                "--require",
                prop,
                "--max-findings",
                "1",
            ][..],
            &CAMPAIGN,
            &["layout", "--report", "rep", "--corpus", "corpus"],
        ]
        .concat();
        let (code, out, err) = run(&d, &args);
        assert_eq!(
            code, 1,
            "{bug}: a required property's violation is a finding\n{out}\n{err}"
        );
        let r = report(&d.join("rep"));
        assert_eq!(r["required"], serde_json::json!([prop]));
        let f = &r["findings"].as_array().unwrap()[0];
        assert_eq!(f["class"], class, "{f}");
        assert_eq!(
            f["signature"].as_str().unwrap().split('|').nth(1),
            Some(class)
        );
        // Shrunk, and the shrunk case still breaks the property (the book kept it).
        assert_eq!(f["shrunk"], true, "{f}");
        let file = f["case_file"].as_str().unwrap();
        let saved = mqa_fuzz::case::load_case_file(&d.join(file)).unwrap();
        assert_eq!(saved.expected.classes, vec![Class::parse(class).unwrap()]);
        let k = kernel::open(bug).unwrap();
        let p = mqa_fuzz::property::Property::parse(prop).unwrap();
        let v = mqa_fuzz::property::replay(k.as_ref(), &saved.case, p, &Default::default());
        assert!(
            v.classes.contains_key(&p.class()),
            "{bug}: shrunk case lost the property failure: {v:?}"
        );
        // The oracle alone finds nothing on it: the bug is only the property's.
        assert!(judge_once(k.as_ref(), &saved.case).is_clean());
        // `replay` checks the property again; the clean kernel passes it.
        let (rc, rout, _) = run(&d, &["replay", file]);
        assert_eq!(rc, 1, "{rout}");
        assert!(rout.contains(&format!("FINDING {class}")), "{rout}");
        let (rc, rout, _) = run(&d, &["replay", file, "--kernel", "cpu:chunked"]);
        assert_eq!(rc, 0, "{rout}");
        // A second campaign replays the corpus first and finds it there again.
        let (code, out, _) = run(
            &d,
            &[
                "run",
                "--kernel",
                bug,
                "--require",
                prop,
                "--cases",
                "1",
                "--seed",
                "5",
                "--quiet",
                "--corpus",
                "corpus",
                "--report",
                "rep2",
            ],
        );
        assert_eq!(code, 1, "{out}");
        let r2 = report(&d.join("rep2"));
        assert!(
            r2["findings"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["class"] == class && f["profile"] == "corpus"),
            "{r2}"
        );
    }
}

#[test]
fn contradicting_property_flags_are_usage_errors() {
    let d = tmp("usage");
    for args in [
        &[
            "run",
            "--kernel",
            "cpu:chunked",
            "--require",
            "deterministic",
            "--repeat",
            "1",
        ][..],
        &[
            "run",
            "--kernel",
            "cpu:chunked",
            "--require",
            "batch-invariant",
            "--batch-invariance",
            "off",
        ],
        &["run", "--kernel", "cpu:chunked", "--require", "fast"],
        &["run", "--kernel", "cpu:chunked", "--repeat", "0"],
    ] {
        let (code, out, err) = run(&d, args);
        assert_eq!(code, 2, "{args:?}\n{out}\n{err}");
    }
    let (_, help, _) = run(&d, &["run", "--help"]);
    for flag in [
        "--repeat",
        "--batch-invariance",
        "--require",
        "deterministic, batch-invariant",
    ] {
        assert!(help.contains(flag), "run --help documents {flag}");
    }
}
