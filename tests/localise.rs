//! Crash localisation (DESIGN §7): a shrunk crash is re-run under compute-sanitizer
//! memcheck when the tool is on PATH and the kernel runs on a GPU; otherwise the crash
//! is still reported, without `localisation` and with the reason it is absent.

use mqa_fuzz::case::Case;
use mqa_fuzz::finding::sanitizer::{self, SanitizeConfig};
use mqa_fuzz::kernel::{self, Capabilities, Kernel, OutputBuffer, RunError, RunInfo};
use mqa_fuzz::oracle::Class;
use std::path::{Path, PathBuf};
use std::process::Command;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mqa-localise-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A crash campaign on the CPU (a planted bug that loads -1/huge table padding): the
/// crash is found, shrunk and saved; `path` is the PATH the binary sees.
fn crash_campaign(d: &Path, path: &str) -> (i32, String, serde_json::Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_mqa-fuzz"))
        .current_dir(d)
        .env("PATH", path)
        .env_remove("MQA_FUZZ_COMPUTE_SANITIZER")
        .args([
            "run",
            "--kernel",
            "cpu:bug-table-padding-read",
            "--profile",
            "layout",
            "--budget",
            "60s",
            "--max-findings",
            "1",
            "--seed",
            "1",
            "--no-replay",
            "--shrink-budget",
            "10s",
            "--quiet",
            "--report",
            "rep",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let r =
        serde_json::from_str(&std::fs::read_to_string(d.join("rep/report.json")).unwrap()).unwrap();
    (out.status.code().unwrap_or(-1), stdout, r)
}

#[test]
fn without_compute_sanitizer_a_crash_is_reported_unlocalised_with_the_reason() {
    let d = tmp("missing");
    let (code, out, r) = crash_campaign(&d, "/usr/bin:/bin");
    assert_eq!(code, 1, "{out}");
    let f = &r["findings"][0];
    assert_eq!(f["class"], "crash", "{f}");
    assert!(f["localisation"].is_null(), "{f}");
    assert_eq!(
        f["localisation_skipped"],
        "compute-sanitizer not found on PATH"
    );
    assert!(
        out.contains("not localised: compute-sanitizer not found on PATH"),
        "{out}"
    );
    let md = std::fs::read_to_string(d.join("rep/summary.md")).unwrap();
    assert!(
        md.contains("not localised: compute-sanitizer not found on PATH"),
        "{md}"
    );
}

#[test]
fn with_the_tool_but_a_cpu_kernel_the_reason_says_so() {
    let d = tmp("cpu");
    let bin = d.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let fake = bin.join("compute-sanitizer");
    // Were it run, the finding would carry this record; it must not be.
    std::fs::write(
        &fake,
        "#!/bin/sh\necho '========= Invalid __global__ read of size 4 bytes'\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (code, out, r) = crash_campaign(&d, &format!("{}:/usr/bin:/bin", bin.display()));
    assert_eq!(code, 1, "{out}");
    let f = &r["findings"][0];
    assert!(f["localisation"].is_null(), "{f}");
    let why = f["localisation_skipped"].as_str().unwrap();
    assert!(why.contains("does not run on a GPU"), "{why}");
}

/// A kernel on "a GPU" that crashes, for the attach path with a stand-in tool.
struct FakeGpuKernel(Capabilities);

impl Kernel for FakeGpuKernel {
    fn name(&self) -> &str {
        "cuda:bug-offset32-kv"
    }
    fn capabilities(&self) -> &Capabilities {
        &self.0
    }
    fn on_accelerator(&self) -> bool {
        true
    }
    fn run(&self, _: &Case, _: &mut OutputBuffer) -> Result<RunInfo, RunError> {
        Err(RunError::Crash(
            "CUDA fault: an illegal memory access was encountered".into(),
        ))
    }
}

#[test]
fn a_gpu_crash_is_localised_from_the_tools_first_record() {
    let d = tmp("gpu");
    let fake = d.join("compute-sanitizer");
    let record = "\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 16 bytes
=========     at tiled_logits+0x1a10
=========     by thread (37,0,0) in block (5,0,0)
=========     Address 0x7f00d0000040 is out of bounds
=========     and is 2,147,483,584 bytes before the nearest allocation at 0x7f0150000000 of size 6,442,450,944 bytes
=========
========= ERROR SUMMARY: 1 error
";
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\necho \"$@\" > {}/args\ncat <<'EOF'\n{record}EOF\n",
            d.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::env::set_var("MQA_FUZZ_COMPUTE_SANITIZER", &fake);
    std::env::set_var("MQA_FUZZ_WORKER_EXE", env!("CARGO_BIN_EXE_mqa-fuzz"));
    let k = FakeGpuKernel(kernel::open("cpu:chunked").unwrap().capabilities().clone());
    let case = d.join("case.json");
    let l = sanitizer::localise(&SanitizeConfig::default(), Class::Crash, &k, Some(&case))
        .unwrap()
        .expect("localised");
    assert_eq!(l.kernel.as_deref(), Some("tiled_logits"));
    assert_eq!((l.thread, l.block), (Some([37, 0, 0]), Some([5, 0, 0])));
    assert_eq!(
        l.nearest_allocation.as_ref().unwrap().distance_bytes,
        2_147_483_584
    );
    let line = l.sentence();
    assert!(
        line.contains("memcheck: Invalid __global__ read of size 16 bytes in tiled_logits+0x1a10"),
        "{line}"
    );
    // The replay ran in this process's binary, the CUDA kernel in-process.
    let args = std::fs::read_to_string(d.join("args")).unwrap();
    assert!(
        args.contains(" replay ") && args.ends_with("--kernel cuda-direct:bug-offset32-kv\n"),
        "{args}"
    );
    // The JSON carries it under `localisation`.
    let f = mqa_fuzz::report::Finding {
        class: Some(Class::Crash),
        localisation: Some(l),
        ..Default::default()
    };
    let j = serde_json::to_value(&f).unwrap();
    assert_eq!(j["localisation"]["access"], "read");
    assert_eq!(
        j["localisation"]["nearest_allocation"]["relation"],
        "before"
    );
    // An `unwritten` finding is localised only under --sanitize initcheck.
    let none = sanitizer::localise(
        &SanitizeConfig::default(),
        Class::Unwritten,
        &k,
        Some(&case),
    );
    assert!(none.unwrap().is_none());
    let ic = SanitizeConfig::parse("memcheck,initcheck").unwrap();
    let u = sanitizer::localise(&ic, Class::Unwritten, &k, Some(&case)).unwrap();
    assert_eq!(u.unwrap().tool, "initcheck");
}
