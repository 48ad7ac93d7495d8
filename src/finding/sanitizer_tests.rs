//! Tests of the compute-sanitizer record parser on the tool's real wordings.
use super::*;

/// The record the issue quotes, as CUDA 12 prints it around a Triton kernel.
const AITER_CUDA12: &str = "\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 16 bytes
=========     at _deepgemm_fp8_paged_mqa_logits+0x1a10 in pa_mqa_logits.py:434
=========     by thread (64,0,0) in block (1187,0,0)
=========     Address 0x7f1b96000000 is out of bounds
=========     and is 1,760,633,344 bytes before the nearest allocation at 0x7f1bff000000 of size 34,359,738,368 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========     Host Frame: [0x2dc6ef] in libcuda.so.1
=========     Host Frame: [0x15803] in libtriton.so
=========
========= Invalid __global__ read of size 16 bytes
=========     at _deepgemm_fp8_paged_mqa_logits+0x1a10 in pa_mqa_logits.py:434
=========     by thread (65,0,0) in block (1187,0,0)
=========     Address 0x7f1b96000010 is out of bounds
=========     and is 1,760,633,328 bytes before the nearest allocation at 0x7f1bff000000 of size 34,359,738,368 bytes
=========
========= Program hit cudaErrorLaunchFailure (error 719) due to \"unspecified launch failure\" on CUDA API call to cuStreamSynchronize.
========= ERROR SUMMARY: 3 errors
";

/// CUDA 12.8 / 13 wording ("Access at"), device frames, a write past the end.
const CUDA13_WRITE: &str = "\
mqa-fuzz: replaying corpus/x.json
========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at tiled_logits+0x2b70
=========     by thread (0,0,0) in block (3,0,0)
=========     Access at 0x7f5e2a400000 is out of bounds
=========     and is 4 bytes after the nearest allocation at 0x7f5e0a400000 of size 536,870,912 bytes
=========         Device Frame: store_chunk(float *, long long, float)+0x30 in tiled.cu:241
=========     Saved host backtrace up to driver entry point at kernel launch time
========= ERROR SUMMARY: 1 error
";

/// cuda-memcheck (CUDA 11): the offset first, then file:line:kernel.
const CUDA11: &str = "\
========= CUDA-MEMCHECK
========= Invalid __global__ read of size 8
=========     at 0x000002e8 in /src/qs/CycleTracking.cu:88:CycleTrackingGuts(MonteCarlo*, int)
=========     by thread (127,0,0) in block (194,0,0)
=========     Address 0x7f153e0002e8 is out of bounds
=========     Device Frame:CycleTrackingKernel(MonteCarlo*, int) (CycleTrackingKernel(MonteCarlo*, int) : 0xa0)
=========     Saved host backtrace up to driver entry point at kernel launch time
========= ERROR SUMMARY: 1 error
";

const INITCHECK: &str = "\
========= COMPUTE-SANITIZER
========= Uninitialized __global__ memory read of size 4 bytes
=========     at topk_per_row+0x8a70 in topk.cuh:260
=========     by thread (16,0,0) in block (80,0,0)
=========     Address 0x7f615d40daf0
=========
========= ERROR SUMMARY: 1 error
";

#[test]
fn parses_the_record_the_issue_quotes() {
    let l = parse_record(Tool::Memcheck, AITER_CUDA12).unwrap();
    assert_eq!(l.error, "Invalid __global__ read of size 16 bytes");
    assert_eq!(l.access.as_deref(), Some("read"));
    assert_eq!(l.memory.as_deref(), Some("global"));
    assert_eq!(l.size, Some(16));
    assert_eq!(l.kernel.as_deref(), Some("_deepgemm_fp8_paged_mqa_logits"));
    assert_eq!(l.pc_offset.as_deref(), Some("0x1a10"));
    assert_eq!(l.source.as_deref(), Some("pa_mqa_logits.py:434"));
    assert_eq!(l.thread, Some([64, 0, 0]));
    assert_eq!(l.block, Some([1187, 0, 0]));
    assert_eq!(l.address.as_deref(), Some("0x7f1b96000000"));
    assert_eq!(l.address_note.as_deref(), Some("is out of bounds"));
    let n = l.nearest_allocation.as_ref().unwrap();
    assert_eq!(n.distance_bytes, 1_760_633_344);
    assert_eq!(n.relation, "before");
    assert_eq!(n.address, "0x7f1bff000000");
    assert_eq!(n.size_bytes, 34_359_738_368);
    // Only the first record; the summary counts all.
    assert_eq!(l.record.len(), 5, "{:?}", l.record);
    assert_eq!(l.errors, Some(3));
    let s = l.sentence();
    assert!(
        s.contains("_deepgemm_fp8_paged_mqa_logits+0x1a10 (pa_mqa_logits.py:434)")
            && s.contains("1,760,633,344 bytes before the nearest allocation"),
        "{s}"
    );
}

#[test]
fn parses_newer_and_older_wordings() {
    let l = parse_record(Tool::Memcheck, CUDA13_WRITE).unwrap();
    assert_eq!(l.access.as_deref(), Some("write"));
    assert_eq!(l.size, Some(4));
    assert_eq!(l.kernel.as_deref(), Some("tiled_logits"));
    assert_eq!(l.pc_offset.as_deref(), Some("0x2b70"));
    assert_eq!(l.source, None, "no line information");
    assert_eq!(l.address.as_deref(), Some("0x7f5e2a400000"));
    let n = l.nearest_allocation.unwrap();
    assert_eq!(
        (n.distance_bytes, n.relation.as_str(), n.size_bytes),
        (4, "after", 536_870_912)
    );
    assert_eq!(
        l.device_frames,
        vec!["store_chunk(float *, long long, float)+0x30 in tiled.cu:241"]
    );
    assert_eq!(l.errors, Some(1));

    let l = parse_record(Tool::Memcheck, CUDA11).unwrap();
    assert_eq!(l.size, Some(8));
    assert_eq!(l.pc_offset.as_deref(), Some("0x000002e8"));
    assert_eq!(l.source.as_deref(), Some("/src/qs/CycleTracking.cu:88"));
    assert_eq!(
        l.kernel.as_deref(),
        Some("CycleTrackingGuts(MonteCarlo*, int)")
    );
    assert_eq!(l.block, Some([194, 0, 0]));
    assert!(l.nearest_allocation.is_none());

    let l = parse_record(Tool::Initcheck, INITCHECK).unwrap();
    assert_eq!(l.tool, "initcheck");
    assert_eq!(l.access.as_deref(), Some("read"));
    assert_eq!(l.address.as_deref(), Some("0x7f615d40daf0"));
    assert_eq!(l.address_note, None);
}

#[test]
fn no_record_and_refusals_are_told_apart() {
    assert!(parse_record(
        Tool::Memcheck,
        "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n"
    )
    .is_none());
    assert!(parse_record(Tool::Memcheck, "").is_none());
    let refused = "========= COMPUTE-SANITIZER\n========= Error: Device not supported. Please refer to the \"Supported Devices\" section of the sanitizer documentation\n";
    assert!(refusal(refused).unwrap().contains("Device not supported"));
    assert_eq!(refusal("========= ERROR SUMMARY: 0 errors"), None);
}

#[test]
fn sanitize_flags_parse() {
    let c = SanitizeConfig::parse("memcheck,initcheck").unwrap();
    assert!(c.memcheck && c.initcheck);
    let off = SanitizeConfig::parse("off").unwrap();
    assert_eq!(off.tool_for(crate::oracle::Class::Crash), None);
    assert_eq!(
        SanitizeConfig::default().tool_for(crate::oracle::Class::Crash),
        Some(Tool::Memcheck)
    );
    assert_eq!(
        SanitizeConfig::default().tool_for(crate::oracle::Class::Unwritten),
        None
    );
    assert!(SanitizeConfig::parse("racecheck").is_err());
    assert_eq!(
        replay_kernel("cuda:bug-offset32-kv"),
        "cuda-direct:bug-offset32-kv"
    );
    assert_eq!(replay_kernel("exec:python3 a.py"), "exec:python3 a.py");
}

/// The whole path with a stand-in tool: the command line it is given, its output
/// parsed, and the timeout.
#[test]
fn runs_the_tool_with_a_timeout_and_parses_its_record() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("compute-sanitizer");
    let args_file = dir.path().join("args");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\necho \"$@\" > {}\ncat <<'EOF'\n{AITER_CUDA12}EOF\nexit 99\n",
            args_file.display()
        ),
    )
    .unwrap();
    let slow = dir.path().join("slow-sanitizer");
    std::fs::write(&slow, "#!/bin/sh\nsleep 30\n").unwrap();
    for f in [&fake, &slow] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let case = Path::new("/tmp/case.json");
    let l = run_tool(
        &fake,
        Tool::Memcheck,
        Path::new("/bin/mqa-fuzz"),
        case,
        "cuda:bug-offset32-kv",
        Duration::from_secs(20),
    )
    .unwrap();
    assert_eq!(l.kernel.as_deref(), Some("_deepgemm_fp8_paged_mqa_logits"));
    let args = std::fs::read_to_string(&args_file).unwrap();
    assert_eq!(
        args.trim(),
        "--tool memcheck --target-processes all --print-limit 10 /bin/mqa-fuzz replay /tmp/case.json --kernel cuda-direct:bug-offset32-kv"
    );
    assert!(l.command.contains("replay /tmp/case.json"), "{}", l.command);
    let t0 = Instant::now();
    let e = run_tool(
        &slow,
        Tool::Memcheck,
        Path::new("/bin/true"),
        case,
        "cuda:x",
        Duration::from_millis(300),
    )
    .unwrap_err();
    assert!(e.contains("did not finish within"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(10));
}
