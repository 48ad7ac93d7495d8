//! Robustness of the binary against what the world does to it: Ctrl-C in the middle of
//! a campaign (findings and corpus kept, report marked interrupted, no temp files), a
//! second Ctrl-C, report directories that cannot be written, and hostile files given to
//! `replay`, `run --corpus`, `merge` and `diff` (exit 2, one line naming the file).

use mqa_fuzz::case::load_case_file;
use mqa_fuzz::harness::judge_once;
use mqa_fuzz::kernel;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mqa-fuzz"))
}

fn sigint(child: &Child) {
    let ok = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -INT failed");
}

/// A `mqa-fuzz run` in the background with its stderr lines on a channel.
struct Campaign {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Campaign {
    fn start(kernel: &str, corpus: &Path, report: &Path) -> Campaign {
        let mut child = bin()
            .args(["run", "--kernel", kernel, "--profile", "all"])
            .args(["--budget", "120s", "--seed", "7", "--jobs", "1"])
            .arg("--corpus")
            .arg(corpus)
            .arg("--report")
            .arg(report)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Campaign {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a stderr line containing `needle`.
    fn wait_for(&mut self, needle: &str, limit: Duration) {
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let hit = l.contains(needle);
                    self.seen.push(l);
                    if hit {
                        return;
                    }
                }
                Err(_) => panic!(
                    "no {needle:?} on stderr within {limit:?}:\n{:#?}",
                    self.seen
                ),
            }
        }
    }

    /// Waits for exit; kills the process and fails when it takes longer than `limit`.
    fn exit_code(&mut self, limit: Duration) -> (Option<i32>, Duration) {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(200)) {
                    self.seen.push(l);
                }
                return (st.code(), start.elapsed());
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                panic!("did not exit within {limit:?}:\n{:#?}", self.seen);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Every file under `dir` (recursively).
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(files(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

fn assert_no_temp_files(dir: &Path) {
    for p in files(dir) {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            !(name.starts_with('.') && name.contains(".tmp.")),
            "temporary file left behind: {}",
            p.display()
        );
    }
}

#[test]
fn ctrl_c_after_a_finding_keeps_it_in_report_and_corpus() {
    let tmp = tempfile::tempdir().unwrap();
    let (corpus, report) = (tmp.path().join("corpus"), tmp.path().join("report"));
    let mut c = Campaign::start("cpu:bug-tail-unwritten", &corpus, &report);
    // The finding line is printed just before shrinking starts: the interrupt lands in
    // the shrink (or in the generation of the next case).
    c.wait_for("finding:", Duration::from_secs(90));
    sigint(&c.child);
    let (code, took) = c.exit_code(Duration::from_secs(60));
    assert_eq!(code, Some(1), "findings give exit 1:\n{:#?}", c.seen);
    assert!(took < Duration::from_secs(30), "took {took:?} to stop");

    let r = mqa_fuzz::report::load(&report).expect("report.json parses");
    assert!(r.interrupted, "report marked interrupted");
    assert!(!r.findings.is_empty(), "the finding is in the report");
    let kern = kernel::open("cpu:bug-tail-unwritten").unwrap();
    let saved = mqa_fuzz::campaign::corpus::list(&corpus);
    assert!(!saved.is_empty(), "the finding is in the corpus");
    for f in &r.findings {
        assert_eq!(f.kernel, "cpu:bug-tail-unwritten");
        let path = PathBuf::from(f.case_file.as_ref().expect("finding names its case file"));
        assert!(saved.contains(&path), "{} is in the corpus", path.display());
    }
    for p in &saved {
        let file = load_case_file(p).unwrap_or_else(|e| panic!("{e}"));
        assert!(!file.expected.classes.is_empty(), "{}", p.display());
        let v = judge_once(kern.as_ref(), &file.case);
        for class in &file.expected.classes {
            assert!(
                v.classes.contains_key(class),
                "{} replays without {class}: {:?}",
                p.display(),
                v.classes
            );
        }
    }
    assert_no_temp_files(&corpus);
    assert_no_temp_files(&report);
}

#[test]
fn ctrl_c_during_generation_without_findings_exits_0_marked_interrupted() {
    let tmp = tempfile::tempdir().unwrap();
    let (corpus, report) = (tmp.path().join("corpus"), tmp.path().join("report"));
    let mut c = Campaign::start("cpu:chunked", &corpus, &report);
    c.wait_for("campaign seed", Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(3)); // handler installed, cases running
    sigint(&c.child);
    let (code, _) = c.exit_code(Duration::from_secs(60));
    assert_eq!(code, Some(0), "{:#?}", c.seen);
    let r = mqa_fuzz::report::load(&report).expect("report.json parses");
    assert!(r.interrupted);
    assert!(r.findings.is_empty());
    assert!(
        r.counts.cases_generated > 0,
        "cases before the interrupt counted"
    );
    assert!(mqa_fuzz::campaign::corpus::list(&corpus).is_empty());
    assert_no_temp_files(&report);
}

#[test]
fn second_ctrl_c_exits_at_once_with_130() {
    let tmp = tempfile::tempdir().unwrap();
    let (corpus, report) = (tmp.path().join("corpus"), tmp.path().join("report"));
    let mut c = Campaign::start("cpu:bug-tail-unwritten", &corpus, &report);
    c.wait_for("campaign seed", Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(2));
    // Interrupts every 20 ms until it exits: the second lands while the first is
    // still being honoured (finishing the case in hand, writing the report).
    let pid = c.child.id().to_string();
    let mut killer = Command::new("sh")
        .args([
            "-c",
            &format!("while kill -INT {pid} 2>/dev/null; do sleep 0.02; done"),
        ])
        .spawn()
        .unwrap();
    let (code, took) = c.exit_code(Duration::from_secs(10));
    let _ = killer.wait();
    assert_eq!(code, Some(130), "{:#?}", c.seen);
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(
        c.seen.iter().any(|l| l.contains("second interrupt")),
        "{:#?}",
        c.seen
    );
}

fn one_line_exit_2(out: &Output, names: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        // The campaign banner (seed, kernels) is printed before inputs are read.
        .filter(|l| !l.starts_with("mqa-fuzz: campaign seed"))
        .collect();
    assert_eq!(lines.len(), 1, "one line expected:\n{stderr}");
    for n in names {
        assert!(stderr.contains(n), "{n:?} not named: {stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn report_dir_that_cannot_be_written_is_exit_2_before_fuzzing() {
    let tmp = tempfile::tempdir().unwrap();
    // A directory below a regular file cannot be created, even by root (CI runs as root).
    let file = tmp.path().join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    let report = file.join("report");
    let out = bin()
        .args(["run", "--kernel", "cpu:chunked", "--budget", "30s"])
        .arg("--corpus")
        .arg(tmp.path().join("corpus"))
        .arg("--report")
        .arg(&report)
        .output()
        .unwrap();
    one_line_exit_2(&out, &[&report.display().to_string()]);

    // A read-only directory: only meaningful when not root (root writes anyway).
    let uid = Command::new("id").arg("-u").output().unwrap();
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        use std::os::unix::fs::PermissionsExt;
        let ro = tmp.path().join("read-only");
        std::fs::create_dir(&ro).unwrap();
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
        let out = bin()
            .args(["run", "--kernel", "cpu:chunked", "--budget", "30s"])
            .arg("--corpus")
            .arg(tmp.path().join("corpus"))
            .arg("--report")
            .arg(&ro)
            .output()
            .unwrap();
        one_line_exit_2(&out, &[&ro.display().to_string(), "not writable"]);
        assert!(files(&ro).is_empty(), "nothing half-written");
    }
}

#[test]
fn write_atomic_failure_leaves_no_temp_file() {
    let tmp = tempfile::tempdir().unwrap();
    // The target is a non-empty directory: the final rename fails after the data was
    // written to the temporary file.
    let target = tmp.path().join("report.json");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("keep"), b"x").unwrap();
    assert!(mqa_fuzz::util::write_atomic(&target, b"{}").is_err());
    assert_no_temp_files(tmp.path());
    assert!(target.join("keep").exists());
}

fn seed_json() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join("seed-permuted-table-minus-one-padding.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn run_with_a_bad_corpus_file_exits_2_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus = tmp.path().join("corpus");
    std::fs::create_dir(&corpus).unwrap();
    let good = serde_json::to_vec_pretty(&seed_json()).unwrap();
    std::fs::write(corpus.join("a-good.json"), &good).unwrap();
    let bad = corpus.join("b-bad.json");
    std::fs::write(&bad, &good[..good.len() / 3]).unwrap();
    let report = tmp.path().join("report");
    let out = bin()
        .args(["run", "--kernel", "cpu:chunked", "--budget", "30s"])
        .arg("--corpus")
        .arg(&corpus)
        .arg("--report")
        .arg(&report)
        .output()
        .unwrap();
    one_line_exit_2(&out, &[&bad.display().to_string(), "truncated"]);
    assert!(
        !report.join("report.json").exists(),
        "no run on a bad corpus"
    );
}

/// `replay` of a hostile corpus file (and optional safetensors sibling `t.safetensors`).
fn replay_bad(name: &str, json: &[u8], tensors: Option<&[u8]>, field: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(format!("{name}.json"));
    std::fs::write(&path, json).unwrap();
    if let Some(t) = tensors {
        std::fs::write(tmp.path().join("t.safetensors"), t).unwrap();
    }
    let out = bin()
        .args(["replay", "--kernel", "cpu:chunked"])
        .arg(&path)
        .output()
        .unwrap();
    one_line_exit_2(&out, &[&path.display().to_string(), field]);
}

fn edited(edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let mut v = seed_json();
    edit(&mut v);
    serde_json::to_vec(&v).unwrap()
}

#[test]
fn hostile_numbers_and_sizes_in_case_files() {
    replay_bad(
        "nan-batch",
        &edited(|v| v["case"]["batch"] = json!("nan")),
        None,
        "case.batch",
    );
    let text = String::from_utf8(edited(|v| v["case"]["heads"] = json!(12345))).unwrap();
    replay_bad(
        "inf-heads",
        text.replace("12345", "1e999").as_bytes(),
        None,
        "case.heads",
    );
    replay_bad(
        "float-heads",
        text.replace("12345", "4.5").as_bytes(),
        None,
        "case.heads",
    );
    replay_bad(
        "stride-overflow",
        &edited(|v| {
            v["case"]["num_blocks"] = json!(u64::MAX / 2);
            v["case"]["kv_block_stride"] = json!(1u64 << 40);
        }),
        None,
        "case.",
    );
    replay_bad(
        "max-blocks-1e12",
        &edited(|v| v["case"]["block_table"]["max_blocks"] = json!(1_000_000_000_000u64)),
        None,
        "case.block_table",
    );
    replay_bad(
        "row-stride-1e12",
        &edited(|v| v["case"]["block_table"]["row_stride"] = json!(1_000_000_000_000u64)),
        None,
        "case.block_table",
    );
    replay_bad(
        "output-1e12",
        &edited(|v| v["case"]["out_row_stride"] = json!(1_000_000_000_000u64)),
        None,
        "case.out_row_stride",
    );
    replay_bad(
        "max-model-len-huge",
        &edited(|v| v["case"]["max_model_len"] = json!(u64::MAX)),
        None,
        "case.max_model_len",
    );
    replay_bad(
        "context-len-huge",
        &edited(|v| v["case"]["context_lens"]["per_sequence"][1] = json!(i64::MAX)),
        None,
        "case.context_lens",
    );
    replay_bad(
        "negative-block-id",
        &edited(|v| v["case"]["block_table"]["entries"][0] = json!(-7)),
        None,
        "case.block_table",
    );
}

#[test]
fn safetensors_headers_that_lie() {
    let json = edited(|v| v["case"]["tensors"] = json!({"safetensors": "t.safetensors"}));
    // Header length far beyond the file.
    let mut huge = (u64::MAX / 2).to_le_bytes().to_vec();
    huge.extend_from_slice(b"{}");
    replay_bad("header-len-huge", &json, Some(&huge), "t.safetensors");
    // A tensor whose offsets claim 1 TB of data in a tiny file.
    let header =
        br#"{"q":{"dtype":"U8","shape":[1000000,1000000],"data_offsets":[0,1000000000000]}}"#;
    let mut lie = (header.len() as u64).to_le_bytes().to_vec();
    lie.extend_from_slice(header);
    lie.extend_from_slice(&[0; 16]);
    replay_bad("offsets-lie", &json, Some(&lie), "t.safetensors");
    // Truncated and empty tensor files.
    replay_bad("tensors-empty", &json, Some(b""), "t.safetensors");
    replay_bad("tensors-short", &json, Some(&[8, 0, 0]), "t.safetensors");
}

#[test]
fn bad_reports_for_merge_and_diff_exit_2_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let deep = "[".repeat(100_000);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        (
            "truncated",
            br#"{"report_version": 1, "findings": [{"#.to_vec(),
        ),
        ("deep", deep.into_bytes()),
        ("not-utf8", vec![b'{', 0xFF, 0xFE, b'}']),
        ("wrong-type", br#"{"report_version": "one"}"#.to_vec()),
        ("nan-version", br#"{"report_version": NaN}"#.to_vec()),
    ];
    for (name, bytes) in cases {
        let dir = tmp.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("report.json");
        std::fs::write(&path, &bytes).unwrap();
        let shown = path.display().to_string();
        let out = bin()
            .arg("merge")
            .arg(&dir)
            .arg("--out")
            .arg(tmp.path().join(format!("merged-{name}")))
            .output()
            .unwrap();
        one_line_exit_2(&out, &[&shown]);
        assert!(!tmp
            .path()
            .join(format!("merged-{name}"))
            .join("report.json")
            .exists());
        let out = bin().arg("diff").arg(&dir).arg(&dir).output().unwrap();
        one_line_exit_2(&out, &[&shown]);
        let out = bin().arg("report").arg(&dir).output().unwrap();
        one_line_exit_2(&out, &[&shown]);
    }
}

/// Regression (found by `fuzz/fuzz_targets/worker_protocol.rs`): a case file whose
/// `kv_block_ids` is 2-D (more ids than blocks) made the worker index past the block
/// tensor and panic. It must be refused with a message naming the tensor.
#[test]
fn worker_refuses_kv_block_ids_that_do_not_match_the_blocks() {
    use mqa_fuzz::kernel::exec::protocol::{read_case_file, write_case_file, RunRequest};
    use mqa_fuzz::kernel::OutputBuffer;
    use safetensors::tensor::TensorView;
    let seed = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join("seed-block-size-1.json");
    let case = load_case_file(&seed).unwrap().case;
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("case.st");
    write_case_file(&path, &case, &OutputBuffer::for_case(&case)).unwrap();
    let out = tmp.path().join("out.st");
    let transport = mqa_fuzz::kernel::exec::protocol::Transport::Files {
        case: &path,
        output: &out,
    };
    let req = RunRequest::new(1, &case, transport);
    read_case_file(&req).expect("the untouched file is accepted");

    // Rewrite the file with every id given twice, as a [n, 2] tensor.
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut owned: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(name, t)| (name, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
        .collect();
    for (name, _, shape, data) in &mut owned {
        if name == "kv_block_ids" {
            *shape = vec![shape[0], 2];
            *data = data.repeat(2);
        }
    }
    let views: Vec<(String, TensorView)> = owned
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
    let e = read_case_file(&req).unwrap_err();
    assert!(e.contains("kv_block_ids"), "{e}");

    // A request with absurd dimensions is refused before any size is computed from them.
    let mut huge = req.clone();
    huge.shape.batch = usize::MAX / 2;
    huge.shape.next_n = 8;
    let e = read_case_file(&huge).unwrap_err();
    assert!(e.contains("batch"), "{e}");
}
