//! Shrinking within its share of the budget, through the binary: a campaign of a
//! many-bug planted kernel shrinks for at most `--shrink-share` × `--budget` plus one
//! floor, says which findings were cut short and keeps generating; a signature a corpus
//! file holds shrunk is not shrunk again, replayed or not.

use serde_json::Value;
use std::path::Path;

mod support;
use support::binary::{run, scratch};

/// Five planted bugs at once: in the `all` profile its first findings are production
/// cases whose shrink steps take a good part of a second each, so shrinking them all
/// to the end takes far longer than the share below allows (seed 7: 24.2 s with
/// `--shrink-share 100%` against the 2 s + 5 s allowed, with the Philox generator's
/// values).
const MANY_BUGS: &str =
    "cpu:bug-mask-off-by-one+fnuz-as-fn+scale-before-relu+store-past-end+short-row-skipped";

fn report(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap()
}

#[test]
fn shrinking_stays_within_its_share_of_the_budget_plus_one_floor() {
    let d = scratch("shrink-share", "bound");
    let (budget, share, per_finding) = (100.0, 0.02, 10.0);
    let (code, out, err) = run(
        &d,
        &[
            "run",
            "--kernel",
            MANY_BUGS,
            "--profile",
            "all",
            "--cases",
            "40",
            "--budget",
            "100s",
            "--shrink-share",
            "2%",
            "--shrink-budget",
            "10s",
            "--seed",
            "7",
            "--jobs",
            "2",
            "--corpus",
            "corpus",
            "--report",
            "r",
            "--quiet",
        ],
    );
    assert_eq!(code, 1, "{out}\n{err}");
    let r = report(&d.join("r"));
    let s = &r["shrinking"];
    assert_eq!(s["share"], share);
    assert!(
        (s["cap_secs"].as_f64().unwrap() - budget * share).abs() < 1e-9,
        "{s}"
    );
    let floor = s["floor_secs"].as_f64().unwrap();
    assert_eq!(floor, f64::min(5.0, per_finding));
    // The bound, plus the runs in flight when the caps were reached: at most one per
    // job (2 here) that took longer than its guess, each at most the longest run the
    // report records. That run is ~1-3 s here (a production case's output buffer, up
    // to 4 GiB, to allocate and poison) but 12 s on a machine busy with other work,
    // so the allowance is measured, not assumed. Unbounded, the same campaign shrinks
    // for 24 s.
    let shrink = r["timings"]["shrink_secs"].as_f64().unwrap();
    let longest = s["longest_run_secs"].as_f64().unwrap();
    assert!(longest > 0.0, "{s}");
    let in_flight = 2.0 * longest + 0.5;
    assert!(
        shrink <= budget * share + floor + in_flight,
        "shrinking took {shrink} s (longest run {longest} s): {s}\n{out}"
    );
    // The share was what stopped it, and the report says so, per finding and in all.
    let cut = s["cut_short_share"].as_u64().unwrap() + s["cut_short_budget_end"].as_u64().unwrap();
    assert!(cut >= 1, "{s}");
    let findings = r["findings"].as_array().unwrap();
    let marked = findings
        .iter()
        .filter(|f| !f["shrink_cut_short"].is_null())
        .count();
    assert!(marked >= 1 && marked as u64 <= cut, "{s}\n{out}");
    assert!(out.contains("shrinking cut short: share spent"), "{out}");
    let summary = std::fs::read_to_string(d.join("r/summary.md")).unwrap();
    assert!(
        summary.contains("at most 2% of the budget: 2.0 s"),
        "{summary}"
    );
    assert!(summary.contains("cut short (share spent)"), "{summary}");
    // Generation went on past the findings cut short: every case ran.
    assert_eq!(r["counts"]["cases_generated"], 40, "{out}");
    assert!(findings.len() >= 3, "{out}");
}

/// The first run's corpus: one shrunk finding of `cpu:bug-fnuz-as-fn`.
fn first_run(d: &Path) -> (String, String) {
    let (code, out, err) = run(
        d,
        &[
            "run",
            "--kernel",
            "cpu:bug-fnuz-as-fn",
            "--profile",
            "layout",
            "--cases",
            "40",
            "--seed",
            "1",
            "--corpus",
            "corpus",
            "--report",
            "r1",
            "--quiet",
        ],
    );
    assert_eq!(code, 1, "{out}\n{err}");
    let r = report(&d.join("r1"));
    let findings = r["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 1, "{out}");
    assert_eq!(findings[0]["shrunk"], true);
    let sig = findings[0]["signature"].as_str().unwrap().to_string();
    let file = findings[0]["case_file"].as_str().unwrap().to_string();
    (sig, file)
}

fn second_run(d: &Path, report_dir: &str, extra: &[&str]) -> (Value, String) {
    let args = [
        &[
            "run",
            "--kernel",
            "cpu:bug-fnuz-as-fn",
            "--profile",
            "layout",
            "--cases",
            "40",
            "--seed",
            "2",
            "--corpus",
            "corpus",
            "--report",
            report_dir,
        ][..],
        extra,
    ]
    .concat();
    let (code, out, err) = run(d, &args);
    assert_eq!(code, 1, "{out}\n{err}");
    (report(&d.join(report_dir)), err)
}

#[test]
fn a_signature_the_corpus_holds_shrunk_is_not_shrunk_again() {
    let d = scratch("shrink-share", "known");
    let (sig, file) = first_run(&d);
    // Replayed first: the generated failures are that finding's, none is shrunk.
    let (r, err) = second_run(&d, "r2", &[]);
    assert!(!err.contains("shrinking..."), "{err}");
    let f = &r["findings"].as_array().unwrap()[..];
    assert_eq!(f.len(), 1, "{err}");
    assert_eq!(f[0]["signature"], sig.as_str());
    assert!(f[0]["occurrences"].as_u64().unwrap() >= 2, "{}", f[0]);
    // Not replayed (`--no-replay`; a shard that does not replay that file is the same):
    // the saved signature still names the failures, which are not shrunk again.
    for (dir, extra) in [("r3", &["--no-replay"][..]), ("r4", &["--shard", "1/2"])] {
        let (r, err) = second_run(&d, dir, extra);
        assert!(!err.contains("shrinking..."), "{extra:?}: {err}");
        assert!(err.contains("not shrunk again"), "{extra:?}: {err}");
        assert_eq!(r["timings"]["shrink_secs"], 0.0, "{extra:?}");
        let f = &r["findings"].as_array().unwrap()[..];
        assert_eq!(f.len(), 1, "{extra:?}: {err}");
        assert_eq!(f[0]["signature"], sig.as_str());
        assert_eq!(f[0]["case_file"], file.as_str());
        assert_eq!(f[0]["shrunk"], true);
        assert!(f[0]["picture"].is_object(), "judged once for its picture");
        let occurrences = f[0]["occurrences"].as_u64().unwrap();
        assert_eq!(r["shrinking"]["known_from_corpus"], 1);
        assert!(occurrences >= 2, "{}", f[0]);
    }
    // One bug, one corpus file: no second file under a signature shrinking would give.
    let files = std::fs::read_dir(d.join("corpus")).unwrap().count();
    assert_eq!(files, 1);
}

#[test]
fn bad_shrink_shares_are_exit_2_with_one_line() {
    let d = scratch("shrink-share", "bad");
    for bad in ["0", "1.5", "150%", "-0.2", "abc", "0%"] {
        let (code, out, err) = run(
            &d,
            &[
                "run",
                "--kernel",
                "cpu:chunked",
                "--cases",
                "1",
                "--no-replay",
                "--report",
                "r",
                "--quiet",
                "--shrink-share",
                bad,
            ],
        );
        let lines: Vec<&str> = err
            .lines()
            .filter(|l| !l.starts_with("mqa-fuzz: campaign seed"))
            .collect();
        assert_eq!(code, 2, "{bad}: {out}\n{err}");
        assert_eq!(lines.len(), 1, "{bad}: {err}");
        assert!(lines[0].contains("--shrink-share"), "{bad}: {err}");
    }
    for good in ["0.3", "30%", "1", "100%"] {
        let (code, _, err) = run(
            &d,
            &[
                "run",
                "--kernel",
                "cpu:chunked",
                "--cases",
                "1",
                "--no-replay",
                "--report",
                "r",
                "--quiet",
                "--shrink-share",
                good,
            ],
        );
        assert_eq!(code, 0, "{good}: {err}");
    }
}
