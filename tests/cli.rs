//! The binary: replaying the seed corpus, bad corpus files (exit 2, one line naming
//! the file and the field, no panic), and `kernels`.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_mqa-fuzz");

fn corpus() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    v.sort();
    v
}

fn run(args: &[&str], files: &[PathBuf]) -> Output {
    Command::new(BIN)
        .args(args)
        .args(files)
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap()
}

#[test]
fn seed_corpus_replays_clean() {
    let files = corpus();
    assert!(files.len() >= 6, "seed corpus has {} files", files.len());
    for args in [
        &["replay", "--kernel", "cpu:chunked"][..],
        &["replay", "--kernel", "cpu:naive"],
        &["replay"],
    ] {
        let out = run(args, &files);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            stdout.lines().filter(|l| l.contains(" clean (")).count(),
            files.len(),
            "{stdout}"
        );
    }
}

/// The cases real kernels failed on (docs/findings) are valid cases the built-in
/// kernels get right: what the library returned is what was wrong.
#[test]
fn findings_in_real_kernels_replay_clean_on_the_builtin_kernels() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/findings");
    let mut files = Vec::new();
    let mut stack = vec![root];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "json") {
                files.push(p);
            }
        }
    }
    assert!(files.len() >= 3, "{files:?}");
    let out = run(&["replay", "--kernel", "cpu:chunked"], &files);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert_eq!(
        stdout.lines().filter(|l| l.contains(" clean (")).count(),
        files.len(),
        "{stdout}"
    );
}

#[test]
fn seed_corpus_json_output_and_findings_exit_1() {
    let files: Vec<PathBuf> = corpus()
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("past-4g"))
        .collect();
    assert_eq!(files.len(), 1);
    let out = run(&["replay", "--json", "--kernel", "cpu:chunked"], &files);
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["kernel"], "cpu:chunked");
    assert!(v[0]["verdict"]["guard"]["redundant"].as_bool().unwrap());
    // The 32-bit block offset bug reads wrapped (poisoned) memory on this seed.
    let out = run(&["replay", "--kernel", "cpu:bug-offset32-kv"], &files);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("FINDING nan"));
}

/// A valid seed file as a JSON value to break.
fn seed_value() -> Value {
    let path = corpus()
        .into_iter()
        .find(|p| p.to_string_lossy().contains("permuted-table"))
        .unwrap();
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Replays `bytes` written to a file and asserts exit 2 with exactly one stderr line
/// that names the file and contains `field`.
fn bad_input(name: &str, bytes: &[u8], field: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{name}.json"));
    std::fs::write(&path, bytes).unwrap();
    let out = run(
        &["replay", "--kernel", "cpu:chunked"],
        std::slice::from_ref(&path),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{name}: stderr {stderr}");
    assert_eq!(
        stderr.lines().count(),
        1,
        "{name}: one line expected:\n{stderr}"
    );
    assert!(
        stderr.contains(&path.display().to_string()),
        "{name}: file not named: {stderr}"
    );
    assert!(
        stderr.contains(field),
        "{name}: field {field:?} not named: {stderr}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{name}: {stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "{name}: nothing is replayed when an input is bad"
    );
}

fn edited(edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let mut v = seed_value();
    edit(&mut v);
    serde_json::to_vec(&v).unwrap()
}

#[test]
fn bad_files_exit_2_with_one_line() {
    let good = serde_json::to_vec_pretty(&seed_value()).unwrap();
    bad_input("truncated", &good[..good.len() / 2], "truncated");
    bad_input("empty", b"", "empty");
    bad_input("blank", b"  \n", "empty");
    bad_input("not-json", b"hello", "json");
    bad_input(
        "wrong-type",
        &edited(|v| v["case"]["heads"] = json!("four")),
        "case.heads",
    );
    bad_input(
        "wrong-type-lens",
        &edited(|v| v["case"]["context_lens"] = json!({"per_sequence": "x"})),
        "case.context_lens",
    );
    bad_input(
        "negative-dimension",
        &edited(|v| v["case"]["head_dim"] = json!(-32)),
        "case.head_dim",
    );
    bad_input(
        "negative-length",
        &edited(|v| v["case"]["context_lens"]["per_sequence"][0] = json!(-5)),
        "case.context_lens[0]",
    );
    bad_input(
        "block-id-out-of-range",
        &edited(|v| {
            let n = v["case"]["num_blocks"].as_u64().unwrap();
            v["case"]["block_table"]["entries"][0] = json!(n);
        }),
        "case.block_table.entries[0][0]",
    );
    bad_input(
        "block-id-past-int32",
        &edited(|v| v["case"]["block_table"]["entries"][0] = json!(1u64 << 40)),
        "case.block_table.entries[0][0]",
    );
    bad_input(
        "format-version",
        &edited(|v| v["format_version"] = json!(99)),
        "format_version",
    );
    bad_input(
        "format-version-missing",
        &edited(|v| drop(v.as_object_mut().unwrap().remove("format_version"))),
        "format_version",
    );
    bad_input(
        "batch-1e12",
        &edited(|v| v["case"]["batch"] = json!(1_000_000_000_000u64)),
        "case.batch",
    );
    bad_input(
        "unknown-field",
        &edited(|v| v["case"]["colour"] = json!("red")),
        "colour",
    );
    bad_input(
        "bad-hex",
        &edited(|v| v["case"]["tensors"]["inline"]["q"] = json!("zz")),
        "case.tensors.inline.q",
    );
    bad_input(
        "duplicate-block",
        &edited(|v| {
            let blocks = v["case"]["tensors"]["inline"]["kv_blocks"]
                .as_object_mut()
                .unwrap();
            let (k, b) = blocks
                .iter()
                .next()
                .map(|(k, b)| (k.clone(), b.clone()))
                .unwrap();
            blocks.insert(format!("0{k}"), b);
        }),
        "given twice",
    );
    bad_input(
        "bad-layout",
        &edited(|v| v["case"]["layout"] = json!("diagonal")),
        "case.layout",
    );
    bad_input(
        "stride-not-multiple-of-4",
        &edited(|v| v["case"]["kv_block_stride"] = json!(1001)),
        "case.kv_block_stride",
    );
    bad_input(
        "missing-safetensors",
        &edited(|v| v["case"]["tensors"] = json!({"safetensors": "nowhere.safetensors"})),
        "nowhere.safetensors",
    );
    bad_input(
        "safetensors-path-escape",
        &edited(|v| v["case"]["tensors"] = json!({"safetensors": "../etc/passwd"})),
        "case.tensors.safetensors",
    );
    // Deeply nested JSON: at the top and inside a field; never a stack overflow.
    let deep = "[".repeat(100_000);
    bad_input("deep-top", deep.as_bytes(), "json");
    let deep_field = format!(
        "{{\"format_version\": 1, \"case\": {{\"batch\": {}}}}}",
        "[".repeat(100_000)
    );
    bad_input("deep-field", deep_field.as_bytes(), "case.batch");
    // The recipe in the provenance is free-form JSON: the parser's depth limit holds.
    let deep_recipe = format!(
        "{{\"format_version\": 1, \"provenance\": {{\"recipe\": {}}}}}",
        "[".repeat(100_000)
    );
    bad_input("deep-recipe", deep_recipe.as_bytes(), "provenance.recipe");
}

#[test]
fn bad_safetensors_sibling() {
    let dir = tempfile::tempdir().unwrap();
    let mut v = seed_value();
    v["case"]["tensors"] = json!({"safetensors": "t.safetensors"});
    let path = dir.path().join("c.json");
    std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
    std::fs::write(
        dir.path().join("t.safetensors"),
        b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage",
    )
    .unwrap();
    let out = run(&["replay"], std::slice::from_ref(&path));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("t.safetensors"), "{stderr}");
}

#[test]
fn unknown_kernel_is_usage_error() {
    let out = run(&["replay", "--kernel", "cpu:nope"], &corpus()[..1]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cpu:nope"));
}

#[test]
fn kernels_lists_cpu_kernels_and_planted_bugs() {
    let out = run(&["kernels"], &[]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("cpu:chunked") && text.contains("cpu:bug-offset32-kv"),
        "{text}"
    );
    let out = run(&["kernels", "--json"], &[]);
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let list = v.as_array().unwrap();
    let chunked = list.iter().find(|e| e["name"] == "cpu:chunked").unwrap();
    assert_eq!(chunked["available"], true);
    assert_eq!(chunked["planted_bug"], false);
    let bugs = list
        .iter()
        .filter(|e| e["planted_bug"] == true && e["name"].as_str().unwrap().starts_with("cpu:"))
        .count();
    assert_eq!(bugs, mqa_fuzz::kernel::Plant::every().count());
}

/// `bench host` times full-scale production cases through a shared region and checks
/// each reads back as written; seed 11's case 1 has a 25 M-entry table at block size 1.
#[test]
fn bench_host_round_trips_full_scale_cases() {
    let out = run(
        &["bench", "host", "--cases", "2", "--seed", "11", "--json"],
        &[],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["cases"], 2);
    assert!(v["table_entries"].as_u64().unwrap() > 1 << 24, "{v}");
    assert_eq!(v["slowest_block_size"], 1);
    for step in [
        "materialize_s",
        "validate_s",
        "harness_write_s",
        "worker_read_s",
    ] {
        let (sum, median) = (
            v["summed"][step].as_f64().unwrap(),
            v["median"][step].as_f64().unwrap(),
        );
        assert!(sum > 0.0, "{step}: {v}");
        // One of the two cases' own times: above zero, below their sum.
        assert!(median > 0.0 && median < sum, "{step}: {v}");
    }
}
