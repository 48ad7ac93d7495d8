//! What a run must never hide from a user or from CI, through the real binary: a
//! finding is saved (or says why, and lands in the report instead), a divergence is
//! reproducible, replay runs the kernel the file names, a run that judged nothing is not
//! a clean run, a closed stdout is no panic, a merge counts each shard once, and bad
//! values are exit 2 with one line.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_mqa-fuzz");

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn mqa(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .current_dir(dir)
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn show(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    )
}

fn report(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("report.json")).unwrap()).unwrap()
}

/// Exit 2, and the last stderr line (after the campaign's start line, if any) is the
/// one error line: it names every `needle`, and nothing panicked.
fn usage_error(out: &Output, needles: &[&str]) {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{}", show(out));
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.starts_with("mqa-fuzz: campaign seed") && !l.starts_with("mqa-fuzz: note"))
        .collect();
    assert_eq!(errors.len(), 1, "one error line expected: {}", show(out));
    for n in needles {
        assert!(errors[0].contains(n), "{n:?} not named: {}", show(out));
    }
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{}",
        show(out)
    );
}

fn seed_corpus_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(name)
}

// ---- 1. findings are never lost without a reason ---------------------------------

#[test]
fn corpus_that_cannot_take_findings_is_exit_2_before_fuzzing() {
    let d = tmp();
    std::fs::write(d.path().join("afile"), b"not a directory").unwrap();
    for corpus in ["afile", "afile/sub"] {
        let out = mqa(
            d.path(),
            &[
                "run",
                "--kernel",
                "cpu:bug-tail-unwritten",
                "--cases",
                "5",
                "--seed",
                "1",
                "--corpus",
                corpus,
                "--report",
                "r",
                "--quiet",
            ],
        );
        usage_error(&out, &[corpus, "corpus"]);
        assert!(!text(&out.stdout).contains("FINDING"), "{}", show(&out));
    }
}

#[test]
fn a_save_that_fails_mid_campaign_says_why_and_lands_in_the_report() {
    let d = tmp();
    let corpus = d.path().join("corpus");
    // A directory squats the finding's file name: the save fails (for root too).
    let squat = mqa_fuzz::campaign::corpus::path_for(
        &corpus,
        "cpu:bug-tail-unwritten",
        mqa_fuzz::oracle::Class::Unwritten,
        "cpu:bug-tail-unwritten|unwritten",
    );
    std::fs::create_dir_all(squat.join("inside")).unwrap();
    let out = mqa(
        d.path(),
        &[
            "run",
            "--kernel",
            "cpu:bug-tail-unwritten",
            "--cases",
            "5",
            "--seed",
            "1",
            "--no-replay",
            "--corpus",
            "corpus",
            "--report",
            "r",
            "--quiet",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("cannot save the finding to") && stderr.contains("saved it to r/findings/"),
        "{}",
        show(&out)
    );
    let r = report(&d.path().join("r"));
    let f = &r["findings"][0];
    let file = f["case_file"].as_str().unwrap();
    assert!(file.starts_with("r/findings/"), "{f}");
    assert!(d.path().join(file).is_file());
    assert!(f["replay_command"].as_str().unwrap().contains(file), "{f}");
    assert!(!text(&out.stdout).contains("(not saved)"), "{}", show(&out));
    let replay = mqa(d.path(), &["replay", file]);
    assert_eq!(replay.status.code(), Some(1), "{}", show(&replay));
}

// ---- 2. divergences are findings like any other ----------------------------------

fn divergent_campaign(dir: &Path, seed: &str, report_dir: &str) -> Value {
    let out = mqa(
        dir,
        &[
            "run",
            "--kernel",
            "cpu:chunked",
            "--kernel",
            "cpu:bug-tail-unwritten",
            "--cases",
            "6",
            "--seed",
            seed,
            "--no-replay",
            "--corpus",
            "corpus",
            "--report",
            report_dir,
            "--quiet",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    report(&dir.join(report_dir))
}

#[test]
fn divergent_findings_are_saved_replayable_and_stable_across_runs() {
    let d = tmp();
    let r = divergent_campaign(d.path(), "1", "r1");
    let findings = r["findings"].as_array().unwrap();
    let sigs: Vec<&str> = findings
        .iter()
        .map(|f| f["signature"].as_str().unwrap())
        .collect();
    assert_eq!(
        sigs,
        [
            "cpu:bug-tail-unwritten|unwritten",
            "cpu:chunked vs cpu:bug-tail-unwritten|divergent"
        ],
        "one real finding and one divergence, whatever the cases: {findings:?}"
    );
    let div = &findings[1];
    assert!(div["occurrences"].as_u64().unwrap() >= 2, "{div}");
    let file = div["case_file"].as_str().expect("the divergence is saved");
    assert!(d.path().join(file).is_file());
    let replay = div["replay_command"].as_str().unwrap();
    assert!(
        replay.contains("--kernel cpu:chunked --kernel cpu:bug-tail-unwritten"),
        "{replay}"
    );
    // The replay command, as printed, reports the divergence again.
    let args: Vec<&str> = replay.split(' ').skip(1).collect();
    let out = mqa(d.path(), &args);
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(
        text(&out.stdout).contains("cpu:chunked vs cpu:bug-tail-unwritten  FINDING divergent"),
        "{}",
        show(&out)
    );
    // Without --kernel, replay runs the two kernels the file records.
    let out = mqa(d.path(), &["replay", file]);
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(
        text(&out.stdout).contains("FINDING divergent"),
        "{}",
        show(&out)
    );
    // Two clean kernels agree on it: exit 0.
    let out = mqa(
        d.path(),
        &[
            "replay",
            file,
            "--kernel",
            "cpu:chunked",
            "--kernel",
            "cpu:naive",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    // Another night, other cases: the same findings, so a nightly diff reports none new.
    divergent_campaign(d.path(), "2", "r2");
    let out = mqa(d.path(), &["diff", "r1", "r2"]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(text(&out.stdout).starts_with("0 new"), "{}", show(&out));

    // A candidate without the base's bugs: they are "fixed" only if their saved cases no
    // longer fail on replay. Here they still do (the kernels are unchanged).
    let mut none = report(&d.path().join("r1"));
    none["findings"] = Value::Array(Vec::new());
    std::fs::create_dir_all(d.path().join("none")).unwrap();
    std::fs::write(d.path().join("none/report.json"), none.to_string()).unwrap();
    let out = mqa(d.path(), &["diff", "r1", "none"]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with(
            "0 new, 0 fixed, 0 unchanged finding(s), 2 not met but still failing on replay"
        ),
        "{}",
        show(&out)
    );
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.starts_with("STILL-FAILS"))
            .count(),
        2,
        "{stdout}"
    );
    // The same bug in a fixed kernel: the unwritten finding's kernel is now one whose
    // output is written, so its case no longer fails: fixed. The divergence still is.
    let mut fixed = report(&d.path().join("r1"));
    fixed["findings"][0]["kernel"] = "cpu:chunked".into();
    std::fs::create_dir_all(d.path().join("fixed")).unwrap();
    std::fs::write(d.path().join("fixed/report.json"), fixed.to_string()).unwrap();
    let out = mqa(d.path(), &["diff", "fixed", "none", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        j["fixed"],
        serde_json::json!(["cpu:bug-tail-unwritten|unwritten"]),
        "{j}"
    );
    assert_eq!(
        j["still_failing"],
        serde_json::json!(["cpu:chunked vs cpu:bug-tail-unwritten|divergent"]),
        "{j}"
    );
    // Without replay nothing is claimed fixed.
    let out = mqa(
        d.path(),
        &["diff", "fixed", "none", "--no-replay", "--json"],
    );
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["fixed"], serde_json::json!([]), "{j}");
    assert_eq!(j["unconfirmed"].as_array().unwrap().len(), 2, "{j}");
}

// ---- 3. replay runs the recorded kernel, or says it cannot -------------------------

#[test]
fn replay_without_kernel_never_falls_back_silently() {
    let d = tmp();
    let kernels: Value =
        serde_json::from_slice(&mqa(d.path(), &["kernels", "--json"]).stdout).unwrap();
    let deepgemm_here = kernels
        .as_array()
        .unwrap()
        .iter()
        .any(|k| k["name"] == "deepgemm" && k["available"] == true);
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs/findings/deepgemm-2.8.2/all-zero-lengths-1d/deepgemm__crash__41c6febc.json");
    if !deepgemm_here {
        let out = mqa(d.path(), &["replay", file.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(3), "{}", show(&out));
        let stderr = text(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{}", show(&out));
        assert!(
            stderr.contains("deepgemm is not available here")
                && stderr.contains("pass --kernel to replay on another"),
            "{}",
            show(&out)
        );
        assert!(out.stdout.is_empty(), "{}", show(&out));
    }
    // A kernel this version does not know: exit 2 naming the file and field.
    let mut v: Value =
        serde_json::from_slice(&std::fs::read(seed_corpus_file("seed-lens-2d.json")).unwrap())
            .unwrap();
    v["provenance"]["kernel"] = "cpu:renamed-away".into();
    let path = d.path().join("renamed.json");
    std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
    let out = mqa(d.path(), &["replay", "renamed.json"]);
    usage_error(
        &out,
        &["renamed.json", "provenance.kernel", "cpu:renamed-away"],
    );
    // With --kernel, the file replays on that kernel.
    let out = mqa(
        d.path(),
        &["replay", "renamed.json", "--kernel", "cpu:chunked"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
}

// ---- 4. a run that judged nothing is not a clean run -------------------------------

#[test]
fn empty_gates_are_exit_2() {
    let d = tmp();
    let out = mqa(d.path(), &["selftest", "--seeds", "0"]);
    usage_error(&out, &["nothing was judged", "--seeds"]);
    for limit in [["--budget", "0s"], ["--cases", "0"]] {
        let mut args = vec![
            "run",
            "--kernel",
            "cpu:chunked",
            "--no-replay",
            "--report",
            "r",
            "--quiet",
        ];
        args.extend(limit);
        let out = mqa(d.path(), &args);
        usage_error(&out, &["nothing was judged"]);
    }
    // Replaying the corpus is judging: --cases 0 over a corpus is a clean run.
    std::fs::create_dir_all(d.path().join("corpus")).unwrap();
    std::fs::copy(
        seed_corpus_file("seed-lens-2d.json"),
        d.path().join("corpus/seed-lens-2d.json"),
    )
    .unwrap();
    let out = mqa(
        d.path(),
        &[
            "run",
            "--kernel",
            "cpu:chunked",
            "--cases",
            "0",
            "--report",
            "r2",
            "--quiet",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert_eq!(report(&d.path().join("r2"))["counts"]["cases_replayed"], 1);
}

// ---- 5. a closed stdout is a quiet end, not a panic --------------------------------

/// Runs with stdout a pipe whose reading end is already closed (`| head -0`).
fn with_closed_stdout(dir: &Path, args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    Command::new(BIN)
        .current_dir(dir)
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn closed_stdout_is_no_panic_and_the_report_is_still_written() {
    let d = tmp();
    let file = seed_corpus_file("seed-lens-2d.json");
    let out = with_closed_stdout(
        d.path(),
        &["replay", file.to_str().unwrap(), "--kernel", "cpu:chunked"],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
        "{stderr}"
    );
    let out = with_closed_stdout(
        d.path(),
        &[
            "run",
            "--kernel",
            "cpu:bug-tail-unwritten",
            "--cases",
            "3",
            "--seed",
            "1",
            "--no-replay",
            "--report",
            "r",
            "--quiet",
        ],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
        "{stderr}"
    );
    let r = report(&d.path().join("r"));
    assert_eq!(r["counts"]["cases_generated"], 3);
    assert!(d.path().join("r/summary.md").is_file());
    let f = r["findings"][0]["case_file"].as_str().unwrap();
    assert!(d.path().join(f).is_file(), "{f}");
}

// ---- 6. a merge counts every shard, and the corpus, once ---------------------------

#[test]
fn merge_refuses_a_repeated_shard_and_counts_the_corpus_once() {
    let d = tmp();
    std::fs::create_dir_all(d.path().join("corpus")).unwrap();
    for f in ["seed-lens-2d.json", "seed-block-size-1.json"] {
        std::fs::copy(seed_corpus_file(f), d.path().join("corpus").join(f)).unwrap();
    }
    for shard in ["0/2", "1/2"] {
        let dir = format!("s{}", &shard[..1]);
        let out = mqa(
            d.path(),
            &[
                "run",
                "--kernel",
                "cpu:chunked",
                "--cases",
                "2",
                "--seed",
                "7",
                "--shard",
                shard,
                "--report",
                &dir,
                "--quiet",
            ],
        );
        assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    }
    let out = mqa(d.path(), &["merge", "s0", "s0", "--out", "m"]);
    usage_error(&out, &["s0", "shard 0/2", "twice"]);
    assert!(!d.path().join("m/report.json").exists());
    let out = mqa(d.path(), &["merge", "s0", "s1", "--out", "m"]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let m = report(&d.path().join("m"));
    assert_eq!(m["counts"]["cases_replayed"], 2, "each corpus file once");
    assert_eq!(m["counts"]["cases_generated"], 4);
    let cases: u64 = m["per_kernel"]["cpu:chunked"]["cases"].as_u64().unwrap();
    assert_eq!(cases, 6);
    let summary = std::fs::read_to_string(d.path().join("m/summary.md")).unwrap();
    assert!(summary.contains("per shard, over"), "{summary}");
    // A merged report merged again with one of its own shards is a repeat too.
    let out = mqa(d.path(), &["merge", "m", "s1", "--out", "m2"]);
    usage_error(&out, &["shard 1/2", "twice"]);
}

// ---- 7. values clap accepts but a run cannot use -----------------------------------

#[test]
fn bad_values_are_exit_2_with_one_line() {
    let d = tmp();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--kernel",
            "cpu:chunked",
            "--cases",
            "1",
            "--no-replay",
            "--report",
            "r",
            "--quiet",
        ];
        args.extend(extra);
        mqa(d.path(), &args)
    };
    usage_error(&run(&["--jobs", "0"]), &["--jobs 0"]);
    usage_error(&run(&["--topk", "0"]), &["--topk 0"]);
    usage_error(&run(&["--max-findings", "0"]), &["--max-findings 0"]);
    let file = seed_corpus_file("seed-lens-2d.json");
    usage_error(
        &mqa(d.path(), &["replay", file.to_str().unwrap(), "--topk", "0"]),
        &["--topk 0"],
    );
    // A negative budget gets the duration message however it is written.
    for args in [&["--budget", "-5s"][..], &["--budget=-5s"]] {
        let out = run(args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}", show(&out));
        assert!(
            stderr.contains("\"-5s\" is negative") && !stderr.contains("unexpected argument"),
            "{}",
            show(&out)
        );
    }
    usage_error(
        &mqa(d.path(), &["selftest", "--seeds", "0"]),
        &["--seeds 0"],
    );
}

// ---- 8. a crash campaign leads with the crash ---------------------------------------

#[test]
fn crash_campaign_headline_and_junit_lead_with_the_crash() {
    let d = tmp();
    // A worker that aborts on every second request: half the cases crash.
    let kernel = format!("exec:'{BIN}' worker --kernel cpu:chunked --fault crash-at=2");
    let out = mqa(
        d.path(),
        &[
            "run",
            "--kernel",
            &kernel,
            "--cases",
            "4",
            "--seed",
            "3",
            "--no-replay",
            "--no-shrink",
            "--report",
            "r",
            "--quiet",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    let stdout = text(&out.stdout);
    let headline = stdout.lines().nth(1).unwrap();
    assert!(
        headline.starts_with(&format!("{kernel}: CRASHED on ")),
        "the crash comes first: {}",
        show(&out)
    );
    let summary = std::fs::read_to_string(d.path().join("r/summary.md")).unwrap();
    assert!(summary.contains(": CRASHED on "), "{summary}");
    let junit = std::fs::read_to_string(d.path().join("r/junit.xml")).unwrap();
    assert!(junit.contains("<error"), "{junit}");
    assert!(
        !junit.contains("Offender {") && !junit.contains("Some("),
        "no Rust debug dump in junit.xml: {junit}"
    );
    assert!(junit.contains("fault injection: aborting"), "{junit}");
}

// ---- 9. smaller things a reader trips over -----------------------------------------

#[test]
fn planted_bug_campaign_keeps_out_of_corpus_and_its_report_reads_plainly() {
    let d = tmp();
    let out = mqa(
        d.path(),
        &[
            "run",
            "--kernel",
            "cpu:bug-tail-unwritten",
            "--cases",
            "4",
            "--seed",
            "1",
            "--report",
            "r",
            "--quiet",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    // Without --corpus, a planted bug's findings go into the report, not ./corpus.
    assert!(!d.path().join("corpus").exists(), "{}", show(&out));
    assert!(text(&out.stderr).contains("r/corpus"), "{}", show(&out));
    let r = report(&d.path().join("r"));
    let file = r["findings"][0]["case_file"].as_str().unwrap();
    assert!(file.starts_with("r/corpus/"), "{file}");
    // The time line says what the run's wall is made of, measured.
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("harness output buffer (allocate + NaN poison) ")
            && stdout.contains("kernel's own clock"),
        "{stdout}"
    );
    assert!(r["per_kernel"]["cpu:bug-tail-unwritten"]["output_setup_secs"].is_number());
    // Times are UTC date-times for people, raw seconds in report.json.
    assert!(r["started_unix"].as_u64().unwrap() > 1_700_000_000);
    let summary = std::fs::read_to_string(d.path().join("r/summary.md")).unwrap();
    assert!(
        summary.contains("Started 20") && summary.contains(" UTC, finished 20"),
        "{summary}"
    );
    let html = std::fs::read_to_string(d.path().join("r/index.html")).unwrap();
    assert!(!html.contains("(unix)"), "raw unix seconds in index.html");
    assert!(
        html.contains(" UTC / 20"),
        "started / finished as UTC date-times"
    );
    // The finding's case row and its picture name the same numbers, each said.
    let cols = r["findings"][0]["picture"]["cols"].as_u64().unwrap();
    let rows = r["findings"][0]["rows"].as_u64().unwrap();
    let shape = format!("{rows} rows (batch × next_n) × {cols} positions (max_model_len)");
    assert!(html.contains(&shape), "{shape} not in the case row");
    assert!(
        html.contains(&format!("{rows} rows × {cols} positions (max_model_len)")),
        "picture caption disagrees"
    );
    assert!(html.contains("KV tokens (context lengths summed)"));
}

#[test]
fn a_saved_recipe_this_version_cannot_read_is_named_on_replay_not_ignored() {
    let d = tmp();
    let corpus = d.path().join("corpus");
    std::fs::create_dir_all(&corpus).unwrap();
    let mut v: Value = serde_json::from_slice(
        &std::fs::read(seed_corpus_file("seed-block-offsets-past-4g.json")).unwrap(),
    )
    .unwrap();
    v["provenance"]["recipe"]["lens"] = serde_json::json!({"per_sequence": "forty"});
    let file = corpus.join("past-4g-bad-recipe.json");
    std::fs::write(&file, serde_json::to_vec(&v).unwrap()).unwrap();
    let out = mqa(
        d.path(),
        &[
            "run",
            "--kernel",
            "cpu:bug-offset32-kv",
            "--cases",
            "0",
            "--seed",
            "1",
            "--corpus",
            "corpus",
            "--report",
            "r",
        ],
    );
    // The saved case still replays and fails; the recipe beside it is named, not dropped.
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        all.contains("past-4g-bad-recipe.json: provenance.recipe")
            && all.contains("not ablated again"),
        "{}",
        show(&out)
    );
    // The finding says why it has no trigger: not an ablation cut short.
    let report: Value =
        serde_json::from_slice(&std::fs::read(d.path().join("r/report.json")).unwrap()).unwrap();
    assert_eq!(
        report["findings"][0]["needs"], "trigger not determined (no saved recipe)",
        "{report}"
    );
}
