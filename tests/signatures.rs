//! Findings are bugs, not classes (issue 15), through real campaigns of the binary:
//! two planted bugs of one kernel give two findings with their own triggers and corpus
//! files, and `diff` sees the second bug of a class the baseline already had.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// These tests run timed campaigns whose ablation needs its share of a 2-core machine:
/// one at a time, so that a loaded machine does not turn a budget into a flaky verdict.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mqa-signatures-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn run(dir: &Path, args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mqa-fuzz"))
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run mqa-fuzz");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// A campaign of `kernel` stopping after `max` distinct bugs; its report.json. Each bug
/// may shrink and ablate to its end: identity is the question here, not the budget (with
/// the default 30% share, a CI machine running other tests cut the second bug's ablation
/// short and it lost its trigger; tests/shrink_share.rs holds the share).
fn campaign(dir: &Path, kernel: &str, profile: &str, max: &str, name: &str) -> Value {
    campaign_with(dir, kernel, profile, max, name, &["--shrink-share", "100%"])
}

/// [`campaign`] with `extra` arguments.
fn campaign_with(
    dir: &Path,
    kernel: &str,
    profile: &str,
    max: &str,
    name: &str,
    extra: &[&str],
) -> Value {
    let corpus = format!("{name}-corpus");
    let args = [
        &[
            "run",
            "--kernel",
            kernel,
            "--profile",
            profile,
            "--budget",
            "150",
            "--seed",
            "1",
            "--max-findings",
            max,
            // Under a loaded test machine, large cases are slow to shrink and ablate.
            "--shrink-budget",
            "60s",
            "--report",
            name,
            "--corpus",
            &corpus,
        ][..],
        extra,
    ]
    .concat();
    let (code, out) = run(dir, &args);
    assert_eq!(code, 1, "{out}");
    serde_json::from_str(&std::fs::read_to_string(dir.join(name).join("report.json")).unwrap())
        .unwrap()
}

fn findings(r: &Value) -> Vec<&Value> {
    r["findings"].as_array().unwrap().iter().collect()
}

fn triggers(r: &Value) -> Vec<Vec<String>> {
    findings(r)
        .iter()
        .map(|f| {
            f["trigger"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap().to_string())
                .collect()
        })
        .collect()
}

/// Both bugs found, each with the trigger of its own mechanism and its own file.
fn assert_two_bugs(dir: &Path, r: &Value, name: &str) {
    let fs = findings(r);
    assert_eq!(fs.len(), 2, "two distinct bugs: {:#?}", triggers(r));
    let t = triggers(r);
    assert_ne!(fs[0]["signature"], fs[1]["signature"]);
    assert!(
        t.iter().any(|t| t.contains(&"kv-offset-4g".to_string())),
        "the offset bug needs KV offsets past 2^32: {t:?}"
    );
    // The scale bug needs negative scales; a shrunk case of block size 1 may list the
    // block size too (hostile values are drawn per block, so block 64 rarely puts a
    // negative scale on one of a few tokens).
    assert!(
        t.iter().any(|t| t.contains(&"hostile-values".to_string())
            && !t.contains(&"kv-offset-4g".to_string())),
        "the scale bug needs (negative) hostile scales: {t:?}"
    );
    for f in &fs {
        let tier = f["tier"].as_str().unwrap();
        let hostile = f["trigger"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x == "hostile-values");
        assert_eq!(tier, if hostile { "hostile" } else { "production" }, "{f}");
        assert!(f["needs"].as_str().unwrap().starts_with("needs: "));
        assert!(
            !f["position"].as_array().unwrap().is_empty(),
            "a value finding says where its first offender sits: {f}"
        );
    }
    // One corpus file per bug (a large case keeps its tensors in a `.safetensors` beside
    // its JSON: that is part of the same file's case).
    let files = std::fs::read_dir(dir.join(format!("{name}-corpus")))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "json"))
        })
        .count();
    assert_eq!(files, 2, "one corpus file per bug");
}

#[test]
fn two_planted_bugs_of_one_class_are_two_findings_cpu() {
    let _one = serial();
    let d = tmp("cpu");
    let r = campaign(&d, "cpu:bug-offset32-kv+scale-before-relu", "all", "2", "r");
    assert_two_bugs(&d, &r, "r");
}

#[test]
fn two_planted_bugs_of_one_class_are_two_findings_numpy() {
    let _one = serial();
    let ok = Command::new("python3")
        .args(["-c", "import numpy"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: python3 with numpy is not installed");
        return;
    }
    let d = tmp("numpy");
    // Identity is the question, not the budget: each numpy bug may shrink and ablate to
    // its end (within the default share, 30% of 150 s, on a loaded machine the second
    // bug's ablation was cut short and it lost its trigger).
    let r = campaign_with(
        &d,
        "numpy --plant offset32-kv,scale-before-relu",
        "all",
        "2",
        "r",
        &["--shrink-share", "100%"],
    );
    assert_two_bugs(&d, &r, "r");
}

#[test]
fn diff_gates_on_a_second_bug_of_a_known_class() {
    let _one = serial();
    let d = tmp("diff");
    let kernel = "cpu:bug-offset32-kv+scale-before-relu";
    // The layout profile draws no hostile values: only the offset bug shows.
    let a = campaign(&d, kernel, "layout", "1", "a");
    assert_eq!(findings(&a).len(), 1);
    let b = campaign(&d, kernel, "all", "2", "b");
    assert_eq!(findings(&b).len(), 2);
    let (code, out) = run(&d, &["diff", "a/report.json", "b/report.json"]);
    assert_eq!(
        code, 1,
        "a new bug of a class the baseline had is new: {out}"
    );
    let new: Vec<&str> = out.lines().filter(|l| l.starts_with("NEW")).collect();
    assert_eq!(new.len(), 1, "{out}");
    assert!(
        new[0].contains("|mismatch|") && new[0].contains("hostile-values"),
        "{out}"
    );
}

#[test]
fn selftest_double_bug_rows_find_each_bug_by_its_own_trigger() {
    let _one = serial();
    let d = tmp("selftest");
    let (code, out) = run(
        &d,
        &[
            "selftest",
            "--backend",
            "cpu",
            "--only",
            "offset32-kv+scale-before-relu",
            "--seeds",
            "1",
            "--budget",
            "90s",
            "--json",
        ],
    );
    assert_eq!(code, 0, "{out}");
    let r: Value = serde_json::from_str(&out).unwrap();
    let rows = r["bugs"].as_array().unwrap();
    let bugs: Vec<&str> = rows.iter().map(|b| b["bug"].as_str().unwrap()).collect();
    assert_eq!(bugs, ["offset32-kv", "scale-before-relu"]);
    assert!(rows.iter().all(|b| b["detected"] == true), "{out}");
    assert_ne!(
        rows[0]["case_file"], rows[1]["case_file"],
        "two findings, two files"
    );
}

#[test]
fn two_crash_reasons_are_two_findings_and_shrinking_keeps_each() {
    let _one = serial();
    // A worker that aborts on every fifth request, serving a kernel whose int32 output
    // offsets crash on outputs past 2 GiB: two crashes, two bugs. Whichever comes first,
    // the other is not hidden behind it.
    let d = tmp("crash");
    let bin = env!("CARGO_BIN_EXE_mqa-fuzz");
    let kernel = format!("exec:'{bin}' worker --kernel cpu:bug-offset32-out --fault crash-at=5");
    let r = campaign(&d, &kernel, "all", "2", "r");
    let fs = findings(&r);
    assert_eq!(fs.len(), 2, "{fs:#?}");
    assert!(fs.iter().all(|f| f["class"] == "crash"));
    let reasons: Vec<&str> = fs.iter().map(|f| f["reason"].as_str().unwrap()).collect();
    assert_ne!(reasons[0], reasons[1]);
    let oob = fs
        .iter()
        .find(|f| f["reason"] == "illegal memory access")
        .unwrap_or_else(|| panic!("the offset bug's crash: {reasons:?}"));
    // Each big-output run is slow and the worker dies every fifth request, so on a
    // loaded machine ablation may run out of budget before reaching the offset feature:
    // the trigger is then marked incomplete and may miss it, but never lists another.
    if oob["trigger_complete"] == true {
        assert_eq!(
            oob["trigger"],
            serde_json::json!(["out-offset-2g"]),
            "{oob}"
        );
    } else {
        let t = oob["trigger"].as_array().unwrap();
        assert!(t.iter().all(|x| x == "out-offset-2g"), "{oob}");
        eprintln!("note: ablation of the offset crash ran out of budget");
    }
    let abort = fs
        .iter()
        .find(|f| f["reason"] != "illegal memory access")
        .unwrap();
    assert!(
        abort["reason"]
            .as_str()
            .unwrap()
            .contains("fault injection: aborting on request …"),
        "{abort}"
    );
}

#[test]
fn merge_folds_shards_by_signature_into_distinct_bugs() {
    let _one = serial();
    let d = tmp("merge");
    let kernel = "cpu:bug-offset32-kv+scale-before-relu";
    for (shard, name) in [("0/2", "s0"), ("1/2", "s1")] {
        let (code, out) = run(
            &d,
            &[
                "run",
                "--kernel",
                kernel,
                "--profile",
                "all",
                "--budget",
                "150",
                "--seed",
                "1",
                "--shard",
                shard,
                "--max-findings",
                "2",
                "--report",
                name,
                "--corpus",
                &format!("{name}-corpus"),
            ],
        );
        assert_eq!(code, 1, "{out}");
    }
    let (code, out) = run(&d, &["merge", "s0", "s1", "--out", "m"]);
    assert_eq!(code, 1, "{out}");
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("m/report.json")).unwrap()).unwrap();
    let t = triggers(&m);
    assert_eq!(findings(&m).len(), 2, "the two bugs, once each: {t:?}");
    let occ: u64 = findings(&m)
        .iter()
        .map(|f| f["occurrences"].as_u64().unwrap())
        .sum();
    let shard_occ: u64 = ["s0", "s1"]
        .iter()
        .map(|s| {
            let r: Value = serde_json::from_str(
                &std::fs::read_to_string(d.join(s).join("report.json")).unwrap(),
            )
            .unwrap();
            findings(&r)
                .iter()
                .map(|f| f["occurrences"].as_u64().unwrap())
                .sum::<u64>()
        })
        .sum();
    assert_eq!(occ, shard_occ, "occurrences add");
}
