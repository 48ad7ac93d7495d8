//! Known crashes do not eat the budget (`--known-crashes`): against a worker that dies
//! on every all-zero batch (as DeepGEMM 2.8.2 does, #353), a campaign finds the crash
//! once, with its trigger, and then runs only a share of the cases predicted to hit it;
//! every predicted case it runs still crashes that way. `--known-crashes 1` runs them all.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mqa-known-crashes-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A 300-case campaign of seed 3 against the crashing worker; its report.json.
fn campaign(dir: &Path, name: &str, extra: &[&str]) -> Value {
    campaign_with(dir, name, "fault-exit-on=all-zero-batch", extra)
}

/// The same against a worker with `fault` (`cpu:chunked` underneath).
fn campaign_with(dir: &Path, name: &str, fault: &str, extra: &[&str]) -> Value {
    let bin = env!("CARGO_BIN_EXE_mqa-fuzz");
    let kernel = format!("exec:'{bin}' worker --kernel cpu:chunked --fault {fault}");
    let mut args = vec![
        "run",
        "--kernel",
        &kernel,
        "--profile",
        "all",
        "--cases",
        "300",
        "--budget",
        "400",
        "--seed",
        "3",
        "--shrink-share",
        "100%",
        "--shrink-budget",
        "60s",
        "--no-replay",
        "--report",
        name,
        "--corpus",
        name,
        "-q",
    ];
    args.extend_from_slice(extra);
    let out = Command::new(bin)
        .current_dir(dir)
        .args(&args)
        .output()
        .expect("run mqa-fuzz");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "a crash is a finding: {text}");
    let report = std::fs::read_to_string(dir.join(name).join("report.json")).unwrap();
    serde_json::from_str(&report).unwrap()
}

fn counts(r: &Value) -> (u64, u64, u64) {
    let c = &r["counts"];
    let n = |k: &str| c[k].as_u64().unwrap_or(0);
    (
        n("cases_generated"),
        n("cases_not_run_known_crash"),
        n("cases_left_at_deadline"),
    )
}

/// The one known crash's predicted cases: (run, crashed that way, not run).
fn predicted(r: &Value) -> (u64, u64, u64) {
    let m = r["counts"]["known_crashes"]
        .as_object()
        .expect("known_crashes");
    assert_eq!(m.len(), 1, "{m:?}");
    let (sig, c) = m.iter().next().unwrap();
    assert!(
        sig.ends_with("|crash|illegal memory access|needs:all-zero-batch"),
        "{sig}"
    );
    let n = |k: &str| c[k].as_u64().unwrap();
    (n("run"), n("crashed"), n("not_run"))
}

#[test]
fn cases_predicted_to_hit_a_known_crash_run_at_their_share_and_all_with_share_one() {
    let d = tmp("share");
    let r = campaign(&d, "eighth", &[]);
    let f = &r["findings"].as_array().unwrap()[..];
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(
        f[0]["trigger"],
        serde_json::json!(["all-zero-batch"]),
        "{}",
        f[0]
    );
    assert_eq!(f[0]["trigger_complete"], true, "{}", f[0]);
    let (generated, not_run, left) = counts(&r);
    assert_eq!(generated + not_run + left, 300, "every drawn case counted");
    let (run, crashed, skipped) = predicted(&r);
    assert_eq!(skipped, not_run);
    assert!(
        not_run > 0,
        "some predicted cases were left out: {:?}",
        r["counts"]
    );
    assert_eq!(crashed, run, "every predicted case run crashed that way");
    assert!(
        run >= 1 && not_run > run,
        "most predicted cases were left out: {run} run, {not_run} not"
    );
    let summary = std::fs::read_to_string(d.join("eighth/summary.md")).unwrap();
    assert!(summary.contains("known crashes: "), "{summary}");

    // The same campaign running them all: every predicted case runs, and crashes.
    let all = campaign(&d, "all", &["--known-crashes", "1"]);
    let (generated_all, not_run_all, _) = counts(&all);
    assert_eq!(not_run_all, 0);
    let (run_all, crashed_all, skipped_all) = predicted(&all);
    assert_eq!((crashed_all, skipped_all), (run_all, 0));
    assert!(
        run_all > run,
        "{run_all} predicted cases run, against {run} at 1/8"
    );
    assert!(generated_all > generated);
}

/// `mqa-fuzz diff BASE CAND --json` run in `dir`: its exit code and JSON.
fn diff(dir: &Path, base: &str, cand: &str) -> (i32, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_mqa-fuzz"))
        .current_dir(dir)
        .args(["diff", base, cand, "--json", "--no-replay"])
        .output()
        .unwrap();
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stdout));
    });
    (out.status.code().unwrap(), json)
}

#[test]
fn diff_and_merge_take_a_crash_whose_ablation_was_cut_short_for_the_same_bug_not_another() {
    let d = tmp("diff");
    let full = campaign(&d, "full", &[]);
    let f = &full["findings"][0];
    assert_eq!(f["trigger"], serde_json::json!(["all-zero-batch"]), "{f}");
    let full_sig = f["signature"].as_str().unwrap();
    // The same bug, its trigger never ablated (as when the shrink share runs out): the
    // signature has no trigger, and its case has every feature the full one needs.
    let short = campaign(&d, "short", &["--no-shrink"]);
    let s = &short["findings"].as_array().unwrap()[..];
    assert_eq!(s.len(), 1, "{s:#?}");
    assert_eq!(
        (s[0]["trigger"].clone(), s[0]["trigger_complete"].clone()),
        (serde_json::json!([]), serde_json::json!(false))
    );
    assert_eq!(
        s[0]["needs"],
        "trigger not determined (not ablated: --no-shrink)"
    );
    let short_sig = s[0]["signature"].as_str().unwrap();
    assert_ne!(short_sig, full_sig);
    assert!(
        s[0]["case_features"]
            .as_array()
            .unwrap()
            .contains(&"all-zero-batch".into()),
        "{}",
        s[0]
    );
    for (base, cand) in [("full", "short"), ("short", "full")] {
        let (code, j) = diff(&d, base, cand);
        assert_eq!(code, 0, "{base} → {cand}: one bug, not a new one: {j}");
        assert_eq!(j["new"], serde_json::json!([]), "{j}");
        assert_eq!(j["unchanged"].as_array().unwrap().len(), 1, "{j}");
        assert_eq!(j["same_bug"].as_array().unwrap().len(), 1, "{j}");
    }
    // Merged, the two are one finding with the trigger the complete ablation found.
    let out = Command::new(env!("CARGO_BIN_EXE_mqa-fuzz"))
        .current_dir(&d)
        .args(["merge", "short", "full", "--out", "merged"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let merged: Value =
        serde_json::from_slice(&std::fs::read(d.join("merged/report.json")).unwrap()).unwrap();
    let m = merged["findings"].as_array().unwrap();
    assert_eq!(m.len(), 1, "{m:#?}");
    assert_eq!(m[0]["signature"].as_str(), Some(full_sig));
    let occ = |r: &Value| r["findings"][0]["occurrences"].as_u64().unwrap();
    assert_eq!(occ(&merged), occ(&full) + occ(&short));
    // A crash of the same kernel, class and reason on a case without an all-zero batch
    // (the short report with that feature taken from its case): a second bug, new.
    let mut other = short.clone();
    other["findings"][0]["case_features"]
        .as_array_mut()
        .unwrap()
        .retain(|f| f != "all-zero-batch");
    std::fs::create_dir_all(d.join("other")).unwrap();
    std::fs::write(d.join("other/report.json"), other.to_string()).unwrap();
    let (code, j) = diff(&d, "full", "other");
    assert_eq!(code, 1, "{j}");
    assert_eq!(j["new"], serde_json::json!([short_sig]), "{j}");
    // The other way round: that trigger-less base finding, whose case had no all-zero
    // batch, does not hide a candidate bug shown to need one (its bug cannot be it).
    let (code, j) = diff(&d, "other", "full");
    assert_eq!(code, 1, "a trigger-less base finding hid a new bug: {j}");
    assert_eq!(j["new"], serde_json::json!([full_sig]), "{j}");
    // The text names the base finding a renamed one is.
    let out = Command::new(env!("CARGO_BIN_EXE_mqa-fuzz"))
        .current_dir(&d)
        .args(["diff", "full", "short", "--no-replay"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(short_sig) && text.contains(&format!("(the base's {full_sig})")),
        "{text}"
    );
}

#[test]
fn a_known_crash_share_outside_zero_to_one_is_a_usage_error() {
    let d = tmp("usage");
    for bad in ["0", "1.5", "-1", "x", "9/8"] {
        let out = Command::new(env!("CARGO_BIN_EXE_mqa-fuzz"))
            .current_dir(&d)
            .args([
                "run",
                "--kernel",
                "cpu:chunked",
                "--cases",
                "1",
                "--known-crashes",
                bad,
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains("--known-crashes"), "{bad}: {err}");
    }
}
