//! The worker protocol end to end against real child processes: built-in kernels
//! served by `mqa-fuzz worker`, and workers that crash, hang, babble, answer out of
//! order or speak another protocol version on purpose.

use mqa_fuzz::case::Case;
use mqa_fuzz::generate::*;
use mqa_fuzz::harness::judge_once;
use mqa_fuzz::kernel::exec::{device_env, ExecConfig, ExecKernel};
use mqa_fuzz::kernel::{self, Kernel, OutputBuffer, RunError};
use mqa_fuzz::oracle::Class;
use std::time::{Duration, Instant};

fn cases() -> Vec<Case> {
    (0..4)
        .map(|k| Recipe::small(vec![300 + k, 0, 17, 40], 2, k as u64).materialize())
        .collect()
}

fn worker_cmd(kernel: &str, fault: Option<&str>) -> String {
    let mut c = format!(
        "'{}' worker --kernel {kernel}",
        env!("CARGO_BIN_EXE_mqa-fuzz")
    );
    if let Some(f) = fault {
        c.push_str(&format!(" --fault {f}"));
    }
    c
}

fn start(kernel: &str, fault: Option<&str>, timeout: Duration) -> ExecKernel {
    let mut cfg = ExecConfig::new(worker_cmd(kernel, fault));
    cfg.case_timeout = timeout;
    cfg.handshake_timeout = Duration::from_secs(30);
    ExecKernel::start(format!("exec:{kernel}"), cfg).expect("worker starts")
}

#[test]
fn served_kernel_matches_in_process_bit_for_bit() {
    for protocol in [2, 1] {
        served_kernel_matches_over(protocol);
    }
}

/// Protocol 2 (shared memory) and protocol 1 (files) carry the same bytes.
fn served_kernel_matches_over(protocol: u64) {
    let mut cfg = ExecConfig::new(worker_cmd("cpu:chunked", None));
    cfg.protocols = vec![protocol];
    let k = ExecKernel::start("exec:cpu:chunked", cfg).expect("worker starts");
    assert_eq!(
        k.hello().protocol,
        protocol,
        "the worker speaks what was offered"
    );
    let direct = kernel::open("cpu:chunked").unwrap();
    assert_eq!(k.capabilities(), direct.capabilities());
    assert_eq!(k.preferred_jobs(), 1);
    for (n, case) in cases().into_iter().enumerate() {
        let mut a = OutputBuffer::for_case(&case);
        let mut b = OutputBuffer::for_case(&case);
        let info = k.run(&case, &mut a).unwrap();
        direct.run(&case, &mut b).unwrap();
        assert!(info.kernel_time.is_some());
        // A worker's first case has its phases named apart (what a life pays once).
        let first = mqa_fuzz::kernel::exec::server::FIRST_CASE;
        let marked = info.phases.keys().filter(|p| p.ends_with(first)).count();
        let worker = info
            .phases
            .keys()
            .filter(|p| !p.starts_with("harness:"))
            .count();
        let expected = if n == 0 { worker } else { 0 };
        assert!(worker > 0 && marked == expected, "{n}: {info:?}");
        assert!(info
            .phases
            .keys()
            .any(|p| p.starts_with("worker: read case")));
        let (ra, rb) = (a.raw().0, b.raw().0);
        assert!(
            ra.iter().zip(rb).all(|(x, y)| x.to_bits() == y.to_bits()),
            "outputs differ"
        );
        assert!(judge_once(&k, &case).is_clean());
        // The harness's own output buffer for this kernel: in the shared region, written
        // in place by the worker (protocol 2), with the same bytes.
        let mut c = k.output_for(&case);
        assert!(c.is_pristine());
        let info = k.run(&case, &mut c).unwrap();
        assert!(
            c.raw()
                .0
                .iter()
                .zip(rb)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "in-place output differs"
        );
        if protocol == 2 {
            assert!(
                !info.phases.contains_key("harness: read output"),
                "{info:?}"
            );
            assert!(
                info.phases.contains_key("harness: write inputs"),
                "{info:?}"
            );
            // Nothing to write back: the kernel wrote into the region.
            assert!(info.phases["worker: write output"] < 0.05, "{info:?}");
        }
    }
    match protocol {
        // One case alive at a time: one region, handed back and reused case after case.
        2 => assert_eq!(k.spare_output_regions().map(|(n, _)| n), Some(1)),
        _ => assert_eq!(k.spare_output_regions(), None),
    }
}

/// A region whose worker crashed mid-case is not handed to the next case.
#[test]
fn a_crashed_case_does_not_give_its_region_back() {
    let k = start("cpu:chunked", Some("crash-at=2"), Duration::from_secs(60));
    let case = &cases()[0];
    let mut a = k.output_for(case);
    k.run(case, &mut a).unwrap();
    drop(a);
    assert_eq!(k.spare_output_regions().map(|(n, _)| n), Some(1));
    let mut b = k.output_for(case);
    assert!(matches!(k.run(case, &mut b), Err(RunError::Crash(_))));
    drop(b);
    assert_eq!(
        k.spare_output_regions().map(|(n, _)| n),
        Some(0),
        "the crashed case's region was freed, not kept"
    );
    let mut c = k.output_for(case);
    k.run(case, &mut c)
        .expect("a fresh worker runs the next case");
}

#[test]
fn planted_bugs_are_caught_through_the_protocol() {
    let case = Recipe::small(vec![300, 0, 17, 512], 2, 7).materialize();
    let k = start("cpu:bug-tail-unwritten", None, Duration::from_secs(60));
    let v = judge_once(&k, &case);
    assert!(v.classes.contains_key(&Class::Unwritten), "{v:?}");
    // A write past the end of a full row lands in the row padding or the trailing
    // guard: the whole guarded buffer travels, so the oob check still works.
    let mut r = Recipe::small(vec![300, 0, 17, 290], 2, 7);
    r.knobs.model_len_slack = 0;
    let case = r.materialize();
    assert!(judge_once(
        kernel::open("cpu:bug-store-past-end").unwrap().as_ref(),
        &case
    )
    .classes
    .contains_key(&Class::OobWrite));
    let k = start("cpu:bug-store-past-end", None, Duration::from_secs(60));
    let v = judge_once(&k, &case);
    assert!(v.classes.contains_key(&Class::OobWrite), "{v:?}");
}

/// Runs four cases on a worker that misbehaves on the second request it serves;
/// returns the results. The first and third succeed; the restarted worker counts from
/// 1 again, so it misbehaves on the fourth.
fn misbehaving(fault: &str, timeout: Duration) -> Vec<Result<(), RunError>> {
    let k = start("cpu:chunked", Some(fault), timeout);
    cases()
        .iter()
        .map(|c| {
            let mut out = OutputBuffer::for_case(c);
            k.run(c, &mut out).map(|_| ())
        })
        .collect()
}

fn assert_second_crashed(results: &[Result<(), RunError>], want: &[&str]) {
    assert!(results[0].is_ok(), "{:?}", results[0]);
    match &results[1] {
        Err(RunError::Crash(m)) => {
            for w in want {
                assert!(m.contains(w), "crash message lacks {w:?}: {m}");
            }
        }
        other => panic!("expected a crash, got {other:?}"),
    }
    assert!(
        results[2].is_ok(),
        "next case after the crash: {:?}",
        results[2]
    );
    assert!(
        matches!(results[3], Err(RunError::Crash(_))),
        "the restarted worker's second request: {:?}",
        results[3]
    );
}

#[test]
fn dying_worker_is_a_crash_with_its_stderr_and_restarts() {
    let r = misbehaving("crash-at=2", Duration::from_secs(60));
    assert_second_crashed(
        &r,
        &[
            "worker exited",
            "SIGABRT",
            "fault injection: aborting on request 2",
        ],
    );
}

#[test]
fn hanging_worker_times_out_and_restarts() {
    let t0 = Instant::now();
    let r = misbehaving("hang-at=2", Duration::from_secs(2));
    assert_second_crashed(&r, &["no answer within 2 s", "fault injection: hanging"]);
    assert!(t0.elapsed() < Duration::from_secs(30));
}

#[test]
fn garbage_on_stdout_is_a_crash() {
    let r = misbehaving("garbage-at=2", Duration::from_secs(60));
    assert_second_crashed(&r, &["not a protocol message", "chatter on stdout"]);
}

#[test]
fn out_of_order_answer_is_a_crash() {
    let r = misbehaving("wrong-id-at=2", Duration::from_secs(60));
    assert_second_crashed(&r, &["out of order"]);
}

#[test]
fn crash_answer_then_exit_is_not_blamed_on_the_next_case() {
    // Seen with DeepGEMM on the H200: the adapter answers `crash` for an illegal address
    // and exits; the next case must run on a fresh worker, not report "worker exited".
    let r = misbehaving("fault-exit-at=2", Duration::from_secs(60));
    assert_second_crashed(&r, &["simulated illegal memory access"]);
}

#[test]
fn crash_mid_campaign_is_judged_as_a_crash_finding() {
    let k = start("cpu:chunked", Some("crash-at=2"), Duration::from_secs(60));
    let verdicts: Vec<_> = cases().iter().map(|c| judge_once(&k, c)).collect();
    assert!(verdicts[0].is_clean());
    assert_eq!(verdicts[1].finding_classes(), vec![Class::Crash]);
    assert!(verdicts[2].is_clean());
    assert_eq!(verdicts[3].finding_classes(), vec![Class::Crash]);
}

#[test]
fn version_skew_is_an_environment_error() {
    let mut cfg = ExecConfig::new(worker_cmd("cpu:chunked", Some("skew")));
    cfg.handshake_timeout = Duration::from_secs(30);
    match ExecKernel::start("skew", cfg) {
        Err(RunError::Environment(m)) => assert!(
            m.contains("protocol 3") && m.contains("speaks protocols [1, 2]"),
            "{m}"
        ),
        Err(e) => panic!("expected an environment error, got {e:?}"),
        Ok(_) => panic!("a worker of protocol 3 was accepted"),
    }
    // Through the registry and the command line: exit 3 with the reason.
    let name = format!("exec:{}", worker_cmd("cpu:chunked", Some("skew")));
    assert!(matches!(
        kernel::open(&name),
        Err(kernel::OpenError::Unavailable { .. })
    ));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.json");
    let cf = mqa_fuzz::case::CaseFile {
        provenance: Default::default(),
        expected: Default::default(),
        case: cases().remove(0),
    };
    mqa_fuzz::case::save_case_file(&file, &cf).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mqa-fuzz"))
        .args(["replay", "--kernel", &name])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("protocol 3"));
}

#[test]
fn missing_command_and_unknown_kernel_are_reported() {
    let cfg = ExecConfig {
        handshake_timeout: Duration::from_secs(10),
        ..ExecConfig::new("exit 7")
    };
    match ExecKernel::start("x", cfg) {
        Err(RunError::Environment(m)) => assert!(
            m.contains("exited before its hello") && m.contains("exit status 7"),
            "{m}"
        ),
        other => panic!("{:?}", other.err()),
    }
    let cfg = ExecConfig::new(worker_cmd("cpu:no-such-kernel", None));
    match ExecKernel::start("x", cfg) {
        Err(RunError::Environment(m)) => assert!(m.contains("unknown kernel"), "{m}"),
        other => panic!("{:?}", other.err()),
    }
    assert!(matches!(
        kernel::open("exec:  "),
        Err(kernel::OpenError::Invalid { .. })
    ));
}

#[test]
fn pool_runs_cases_concurrently_one_worker_each() {
    let mut cfg = ExecConfig::new(worker_cmd("cpu:chunked", None));
    cfg.worker_envs = vec![device_env("0"), device_env("1")];
    let k = ExecKernel::start("pool", cfg).unwrap();
    assert_eq!(k.preferred_jobs(), 2);
    let devices: Vec<&str> = k.hellos().iter().map(|h| h.device.as_str()).collect();
    assert_eq!(devices, ["cpu (device 0)", "cpu (device 1)"]);
    let cs = cases();
    std::thread::scope(|s| {
        let handles: Vec<_> = cs.iter().map(|c| s.spawn(|| judge_once(&k, c))).collect();
        for h in handles {
            assert!(h.join().unwrap().is_clean());
        }
    });
}

/// Workers that share a device split the KV-pool bytes the first one declared (each
/// declared a share of what was free as if it were alone); workers on devices of their
/// own keep them.
#[test]
fn workers_sharing_a_device_split_its_kv_budget() {
    let dir = tempfile::tempdir().unwrap();
    let real = start("cpu:chunked", None, Duration::from_secs(30));
    let mut hello = real.hello().clone();
    drop(real);
    hello.capabilities.max_kv_bytes = Some(6 << 30);
    let mut line = serde_json::to_value(&hello).unwrap();
    line["type"] = "hello".into();
    std::fs::write(dir.path().join("hello.json"), line.to_string()).unwrap();
    let script = "import sys\nprint(open(sys.argv[1]).read(), flush=True)\nsys.stdin.read()\n";
    std::fs::write(dir.path().join("hello_only.py"), script).unwrap();
    let pools = [
        (vec![Vec::new(), Vec::new()], 3u64 << 30),
        (vec![device_env("0"), device_env("1")], 6 << 30),
        (
            vec![device_env("0"), device_env("1"), device_env("0")],
            3 << 30,
        ),
    ];
    for (envs, want) in pools {
        let n = envs.len();
        let mut cfg = ExecConfig::new(format!(
            "python3 '{}' '{}'",
            dir.path().join("hello_only.py").display(),
            dir.path().join("hello.json").display()
        ));
        cfg.worker_envs = envs;
        cfg.fork_server = false;
        cfg.handshake_timeout = Duration::from_secs(30);
        let k = ExecKernel::start("split", cfg).expect("the stand-ins start");
        assert_eq!(k.capabilities().max_kv_bytes, Some(want), "{n} workers");
    }
}

/// A worker that judges "on its device" (a stand-in: each case takes 50 ms and is
/// judged clean), logging each request it starts and whether another had already
/// arrived; with `crash_once`, its second request kills it, once.
fn judging_stand_in(dir: &std::path::Path, crash_once: bool) -> ExecKernel {
    let real = start("cpu:chunked", None, Duration::from_secs(30));
    let mut hello = real.hello().clone();
    drop(real);
    hello.protocol = 2;
    hello.judges_on_device = true;
    hello.warm_up_secs = Some(0.08);
    let mut line = serde_json::to_value(&hello).unwrap();
    line["type"] = "hello".into();
    std::fs::write(dir.join("hello.json"), line.to_string()).unwrap();
    let script = r#"
import json, os, queue, sys, threading, time
d = sys.argv[1]
print(open(os.path.join(d, "hello.json")).read(), flush=True)
lines = queue.Queue()
def read():
    for line in sys.stdin:
        lines.put(line)
    lines.put(None)
threading.Thread(target=read, daemon=True).start()
n = 0
while True:
    line = lines.get()
    if line is None:
        break
    req = json.loads(line)
    n += 1
    marker = os.path.join(d, "crashed")
    if sys.argv[2] == "1" and n == 2 and not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(3)
    time.sleep(0.05)
    with open(os.path.join(d, "log"), "a") as log:
        log.write(f"{req['id']} {int(lines.qsize() > 0)}\n")
    print(json.dumps({"type": "result", "id": req["id"], "judgement": {}, "output_written": False}), flush=True)
"#;
    std::fs::write(dir.join("stand_in.py"), script).unwrap();
    let mut cfg = ExecConfig::new(format!(
        "python3 '{}' '{}' {}",
        dir.join("stand_in.py").display(),
        dir.display(),
        crash_once as u8
    ));
    cfg.protocols = vec![2];
    cfg.fork_server = false;
    cfg.case_timeout = Duration::from_secs(30);
    cfg.handshake_timeout = Duration::from_secs(30);
    ExecKernel::start("judging", cfg).expect("the stand-in starts")
}

/// Every case judged "on the device" at once, one thread each, in the cases' order.
fn judge_at_once(k: &ExecKernel, cs: &[Case]) -> Vec<Result<kernel::JudgedRun, RunError>> {
    let req = kernel::DeviceJudgeRequest::new(
        mqa_fuzz::case::ScalePlacement::AfterReluSum,
        [1e-3, 1e-3, 1e-6],
        Vec::new(),
    );
    std::thread::scope(|s| {
        let hs: Vec<_> = cs
            .iter()
            .map(|c| {
                s.spawn(|| {
                    let mut out = k.output_for_judged(c);
                    k.run_judged(c, &req, &mut out)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Six device-judged cases at once on one worker: each result comes back to its own
/// case, and requests reach the worker while the one before runs (queued behind it).
#[test]
fn device_judged_requests_queue_behind_a_busy_worker() {
    let dir = tempfile::tempdir().unwrap();
    let k = judging_stand_in(dir.path(), false);
    k.device_judge().expect("the stand-in judges on its device");
    let cs: Vec<Case> = cases()
        .into_iter()
        .chain(cases().into_iter().take(2))
        .collect();
    let results = judge_at_once(&k, &cs);
    for r in &results {
        let run = r.as_ref().expect("every case answered");
        assert_eq!(run.judgement.rows, 0, "the stand-in's empty judgement");
        assert!(!run.output_written);
    }
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
    let started: Vec<(u64, bool)> = log
        .lines()
        .map(|l| {
            let (id, ahead) = l.split_once(' ').unwrap();
            (id.parse().unwrap(), ahead == "1")
        })
        .collect();
    assert_eq!(started.len(), 6, "{log}");
    assert!(
        started.iter().filter(|(_, ahead)| *ahead).count() >= 3,
        "the next request was at the worker while one ran: {log}"
    );
}

/// The worker dies on a case while the next one waits behind it: the dying case is a
/// crash, the one behind it is sent again to the restarted worker and answered.
#[test]
fn a_request_behind_a_crash_is_sent_again_not_blamed() {
    let dir = tempfile::tempdir().unwrap();
    let k = judging_stand_in(dir.path(), true);
    let cs = cases();
    let results = judge_at_once(&k, &cs);
    let crashes = results
        .iter()
        .filter(|r| matches!(r, Err(RunError::Crash(_))))
        .count();
    let answered = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!((crashes, answered), (1, 3), "{results:?}");
    assert_eq!(k.restart_stats().restarts, 1);
    // Both lives said they warmed up (80 ms each, in their hello): the report counts
    // the first life's and the restarted one's.
    let w = k.worker_report().unwrap();
    assert_eq!(w.warm_ups, 2, "{w:?}");
    assert!((w.warm_up_mean_secs - 0.08).abs() < 1e-9, "{w:?}");
}

/// A worker life checks a case's shape again, not its pool against the memory that was
/// free when the life started (less, while the life it replaced held its pools):
/// DeepGEMM's restarted lives skipped engine pools the campaign had drawn to the first
/// life's limit.
#[test]
fn a_life_checks_the_shape_not_the_memory_it_saw_free() {
    use mqa_fuzz::case::ScalePlacement;
    use mqa_fuzz::kernel::{BlockSizes, Capabilities};
    let case = Recipe::small(vec![300, 0, 17], 2, 1).materialize();
    let tight = Capabilities {
        max_kv_bytes: Some(case.kv_cache_bytes() - 1),
        ..Capabilities::everything(ScalePlacement::AfterReluSum)
    };
    assert!(tight.rejects(&case).unwrap().starts_with("kv cache of"));
    assert_eq!(tight.rejects_shape(&case), None);
    let other_block = Capabilities {
        block_sizes: BlockSizes::List(vec![case.shape.block_size + 1]),
        ..tight
    };
    let why = other_block
        .rejects_shape(&case)
        .expect("a shape it does not take");
    assert!(why.starts_with("block_size"), "{why}");
}

/// DeepGEMM's scheduler compiles per batch size rounded up to 32: batches of 1 and 32
/// share a compile, 33 starts the next.
#[test]
fn the_batch_class_is_the_batch_rounded_up_to_32() {
    use mqa_fuzz::kernel::{compile_key_of, CompileField};
    let key = |b: usize| {
        let case = Recipe::small(vec![40; b], 1, 3).materialize();
        compile_key_of(&[CompileField::Heads, CompileField::BatchClass], &case).unwrap()
    };
    let heads = Recipe::small(vec![40], 1, 3).materialize().shape.heads;
    assert_eq!(key(1), format!("heads={heads} batch_class=32"));
    assert_eq!(key(32), key(1));
    assert_eq!(key(33), format!("heads={heads} batch_class=64"));
}
