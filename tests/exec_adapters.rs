//! The Python adapters in `kernels/external/` through the worker protocol.
//!
//! `numpy` needs only python3 + numpy (CI has both): it must be clean on varied cases,
//! and each `--plant BUG` must produce the same finding classes as `cpu:bug-BUG` on a
//! case where that bug is caught. The torch-based adapters run against fake library
//! modules (`kernels/external/testing/`) when torch is importable, else the tests say
//! why they skipped.

use mqa_fuzz::case::{Case, ValueLayout};
use mqa_fuzz::fp8::Fp8Format;
use mqa_fuzz::generate::*;
use mqa_fuzz::harness::judge_once;
use mqa_fuzz::kernel::exec::{ExecConfig, ExecKernel};
use mqa_fuzz::kernel::{self, Kernel};
use mqa_fuzz::oracle::{Class, Verdict};
use std::process::Command;

fn python_has(modules: &[&str]) -> bool {
    let script = format!("import {}", modules.join(", "));
    Command::new("python3")
        .args(["-c", &script])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Skips (with the reason on stderr) unless python3 can import `modules`.
macro_rules! require_python {
    ($($m:expr),+) => {
        if !python_has(&[$($m),+]) {
            eprintln!("SKIPPED: python3 cannot import {:?}", [$($m),+]);
            return;
        }
    };
}

fn adapter(name: &str) -> Box<dyn Kernel> {
    kernel::open(name).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Opens an alias with extra environment for its worker (no process-wide `set_var`:
/// tests run in parallel threads).
fn adapter_with_env(name: &str, env: &[(&str, &str)]) -> Box<dyn Kernel> {
    // Not through the alias: its availability probe does not see this environment.
    let mut words = name.split_whitespace();
    let script = format!("{FAKES}/../{}_adapter.py", words.next().unwrap());
    let cmd = format!("python3 {script} {}", words.collect::<Vec<_>>().join(" "));
    let mut cfg = ExecConfig::new(cmd);
    cfg.worker_envs = vec![env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()];
    Box::new(ExecKernel::start(name, cfg).unwrap_or_else(|e| panic!("{name}: {e}")))
}

const FAKES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels/external/testing");

pub fn recipe(lens: Vec<usize>, next_n: usize) -> Recipe {
    Recipe::small(lens, next_n, 7)
}

/// Varied cases every correct kernel must pass.
fn clean_cases() -> Vec<Case> {
    let mut v = Vec::new();
    v.push(recipe(vec![300, 0, 17, 512], 2).materialize());
    let mut r = recipe(vec![40, 33], 3);
    r.layout = ValueLayout::Shuffle16;
    r.knobs.format = Fp8Format::E4m3fnuz;
    r.knobs.head_dim = 32;
    v.push(r.materialize());
    let mut r = recipe(vec![], 2);
    r.lens = LensRecipe::PerToken(vec![vec![5, 70], vec![0, 1], vec![64, 64]]);
    r.knobs.block_size = 1;
    r.knobs.padding = Padding::Huge;
    v.push(r.materialize());
    let mut r = recipe(vec![700, 129], 1);
    r.knobs.block_size = 64;
    r.knobs.offsets = OffsetClass::Around4G;
    r.knobs.table_order = TableOrder::Reversed;
    r.knobs.values = ValueKind::UniformCodes;
    v.push(r.materialize());
    let mut r = recipe(vec![260, 3], 2);
    r.knobs.values = ValueKind::Hostile;
    r.knobs.seed = 11;
    v.push(r.materialize());
    v
}

#[test]
fn numpy_adapter_is_clean_and_agrees_with_cpu_chunked() {
    require_python!("numpy");
    let k = adapter("numpy");
    assert!(k.version().starts_with("numpy "), "{}", k.version());
    let cpu = kernel::open("cpu:chunked").unwrap();
    for (n, case) in clean_cases().iter().enumerate() {
        let v = judge_once(k.as_ref(), case);
        assert!(v.is_clean(), "case {n}: {v:?}");
        assert!(v.metrics.checked > 0 || n == 2);
        let mut a = mqa_fuzz::kernel::OutputBuffer::for_case(case);
        let mut b = a.clone();
        k.run(case, &mut a).unwrap();
        cpu.run(case, &mut b).unwrap();
        if let Some(d) = mqa_fuzz::harness::divergence(case, (k.as_ref(), &a), (cpu.as_ref(), &b)) {
            panic!("case {n}: {d}");
        }
        // Same chunked stores: the same positions were written outside V(r) too.
        let written = |o: &mqa_fuzz::kernel::OutputBuffer| -> Vec<bool> {
            o.interior()
                .iter()
                .map(|x| x.to_bits() != mqa_fuzz::kernel::POISON_BITS)
                .collect()
        };
        assert_eq!(written(&a), written(&b), "case {n}: written sets differ");
    }
}

/// A case on which `cpu:bug-<plant>` is caught.
fn case_for(plant: &str) -> Case {
    let r = match plant {
        "tail-unwritten" => recipe(vec![300, 0, 17, 512], 2),
        "offset32-kv" => recipe(vec![700, 300], 1).with(|k| {
            k.offsets = OffsetClass::Around4G;
            k.block_size = 64;
        }),
        // The sequence ends past byte 2^31 of the output.
        "offset32-out" => recipe(vec![1 << 20], 1).with(|k| {
            k.big_output = true;
            k.model_len_slack = 0;
            k.block_size = 256;
            k.head_dim = 32;
        }),
        "mask-off-by-one" => recipe(vec![300, 40], 2),
        "ctx2d-ignored" => Recipe {
            lens: LensRecipe::PerToken(vec![vec![10, 300], vec![5, 6]]),
            ..recipe(vec![], 2)
        },
        "table-padding-read" => recipe(vec![40, 3], 1),
        "zero-batch" => recipe(vec![0; 32], 1),
        "fnuz-as-fn" => recipe(vec![100, 7], 1).with(|k| k.format = Fp8Format::E4m3fnuz),
        "scale-before-relu" => recipe(vec![600, 500], 1).with(|k| {
            k.values = ValueKind::Hostile;
            k.seed = 1;
        }),
        "split-boundary-drop" => recipe(vec![3000, 2000], 1),
        "short-row-skipped" => recipe(vec![1, 300], 2),
        "store-past-end" => recipe(vec![300, 0, 17, 290], 2).with(|k| k.model_len_slack = 0),
        other => panic!("no case for {other}"),
    };
    r.materialize()
}

fn classes(v: &Verdict) -> Vec<Class> {
    v.finding_classes()
}

#[test]
fn numpy_plants_are_caught_like_the_cpu_bugs() {
    require_python!("numpy");
    for plant in mqa_fuzz::kernel::Plant::ALL {
        let name = plant.name();
        let case = case_for(name);
        let cpu = kernel::open(&format!("cpu:bug-{name}")).unwrap();
        let want = classes(&judge_once(cpu.as_ref(), &case));
        assert!(!want.is_empty(), "cpu:bug-{name} is not caught by its case");
        let clean = judge_once(kernel::open("cpu:chunked").unwrap().as_ref(), &case);
        assert!(
            clean.is_clean(),
            "{name}'s case is not clean on cpu:chunked: {clean:?}"
        );
        let k = adapter(&format!("numpy --plant {name}"));
        let got = classes(&judge_once(k.as_ref(), &case));
        assert_eq!(got, want, "numpy --plant {name} vs cpu:bug-{name}");
        eprintln!("numpy --plant {name}: caught as {got:?}");
    }
}

#[test]
fn numpy_composed_plants_are_caught_like_the_composed_cpu_bugs() {
    require_python!("numpy");
    // `--plant A,B` plants both bugs: each one's case shows what `cpu:bug-A+B` shows.
    let k = adapter("numpy --plant offset32-kv,scale-before-relu");
    let cpu = kernel::open("cpu:bug-offset32-kv+scale-before-relu").unwrap();
    for name in ["offset32-kv", "scale-before-relu"] {
        let case = case_for(name);
        let want = classes(&judge_once(cpu.as_ref(), &case));
        assert!(
            !want.is_empty(),
            "{name}'s case is not caught by the composed cpu bug"
        );
        let got = classes(&judge_once(k.as_ref(), &case));
        assert_eq!(
            got, want,
            "numpy --plant offset32-kv,scale-before-relu on {name}'s case"
        );
    }
    // A clean case of both stays clean.
    assert!(judge_once(k.as_ref(), &recipe(vec![40, 9], 1).materialize()).is_clean());
}

#[test]
fn numpy_fault_flag_crashes_deterministically_mid_campaign() {
    require_python!("numpy");
    let k = adapter("numpy --fault crash-if-ctx-over=400");
    let short = recipe(vec![300, 17], 2).materialize();
    let long = recipe(vec![500, 17], 2).materialize();
    assert!(judge_once(k.as_ref(), &short).is_clean());
    let v = judge_once(k.as_ref(), &long);
    assert_eq!(classes(&v), vec![Class::Crash]);
    let msg = v.examples[0].detail.clone().unwrap_or_default();
    assert!(msg.contains("fault injection: aborting"), "{msg}");
    assert!(
        judge_once(k.as_ref(), &short).is_clean(),
        "the restarted worker runs the next case"
    );
}

#[test]
fn replay_command_exit_codes_with_the_numpy_adapter() {
    require_python!("numpy");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tail.json");
    let cf = mqa_fuzz::case::CaseFile {
        provenance: Default::default(),
        expected: Default::default(),
        case: case_for("tail-unwritten"),
    };
    mqa_fuzz::case::save_case_file(&file, &cf).unwrap();
    let run = |k: &str| {
        Command::new(env!("CARGO_BIN_EXE_mqa-fuzz"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["replay", "--kernel", k])
            .arg(&file)
            .output()
            .unwrap()
    };
    let o = run("numpy");
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let o = run("numpy --plant tail-unwritten");
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout).contains("unwritten"));
    let o = run("numpy --plant no-such-bug");
    assert_eq!(
        o.status.code(),
        Some(3),
        "an adapter that refuses its arguments cannot run: environment"
    );
}

#[test]
fn torch_adapter_is_clean_on_the_cpu() {
    require_python!("numpy", "torch");
    let k = adapter("torch --cpu");
    assert_eq!(
        k.capabilities().outside,
        mqa_fuzz::kernel::OutsideContract::NegInf
    );
    let mut judged = 0;
    for (n, case) in clean_cases().iter().enumerate() {
        let v = judge_once(k.as_ref(), case);
        if v.skipped.is_some() {
            continue; // shuffle16 is not the layout engines' torch code reads
        }
        judged += 1;
        assert!(v.is_clean(), "case {n}: {v:?}");
    }
    assert!(judged >= 3);
}

fn dg_case(lens: Vec<usize>, next_n: usize) -> Case {
    dg_recipe(lens, next_n).materialize()
}

fn dg_recipe(lens: Vec<usize>, next_n: usize) -> Recipe {
    recipe(lens, next_n).with(|k| {
        k.heads = 32;
        k.head_dim = 64;
        k.block_size = 64;
        // DeepGEMM's TMA descriptors need a 16-byte aligned block stride.
        k.kv_stride_pad = 16;
    })
}

#[test]
fn deepgemm_adapter_against_a_fake_deep_gemm() {
    require_python!("numpy", "torch");
    let k = adapter_with_env("deepgemm", &[("PYTHONPATH", FAKES)]);
    assert!(k.version().contains("2.8.2+fake"), "{}", k.version());
    let caps = k.capabilities();
    assert_eq!(
        caps.block_sizes,
        mqa_fuzz::kernel::BlockSizes::List(vec![64])
    );
    for case in [
        dg_case(vec![300, 0, 17, 513], 2),
        dg_case(vec![64, 1000], 1),
    ] {
        let v = judge_once(k.as_ref(), &case);
        assert!(v.is_clean(), "{v:?}");
        assert_eq!(v.run.inputs_intact, Some(true));
    }
    // Outside the declared shapes: skipped by the harness, never sent.
    let v = judge_once(k.as_ref(), &recipe(vec![30], 1).materialize());
    assert!(v.skipped.is_some());
    // A padded stride DeepGEMM asserts on: declared, so campaigns pad it up instead;
    // a case that has one anyway is skipped with the reason, never sent.
    assert_eq!(caps.kv_stride_align, Some(16));
    let unaligned = dg_recipe(vec![100], 1)
        .with(|k| k.kv_stride_pad = 8)
        .materialize();
    assert_ne!(unaligned.kv_block_stride % 16, 0);
    let v = judge_once(k.as_ref(), &unaligned);
    assert!(
        v.skipped
            .as_deref()
            .is_some_and(|w| w.contains("(unaligned)")),
        "{v:?}"
    );
    drop(k);
    let k = adapter_with_env(
        "deepgemm",
        &[("PYTHONPATH", FAKES), ("MQA_FUZZ_FAKE_BUG", "nan-last")],
    );
    let v = judge_once(k.as_ref(), &dg_case(vec![300, 17], 2));
    assert_eq!(classes(&v), vec![Class::Nan], "{v:?}");
    assert!(!v.guard.redundant);
}

fn aiter_case(layout: ValueLayout, block_size: usize) -> Case {
    Recipe {
        layout,
        ..recipe(vec![300, 0, 17, 129], 2).with(|k| {
            k.heads = 32;
            k.head_dim = 64;
            k.block_size = block_size;
            k.format = Fp8Format::E4m3fnuz;
        })
    }
    .materialize()
}

#[test]
fn aiter_adapter_against_a_fake_aiter() {
    require_python!("numpy", "torch");
    let k = adapter_with_env("aiter --format e4m3fnuz", &[("PYTHONPATH", FAKES)]);
    assert_eq!(
        k.capabilities().scale_placement,
        mqa_fuzz::case::ScalePlacement::InsideRelu
    );
    for case in [
        aiter_case(ValueLayout::Normal, 1),
        aiter_case(ValueLayout::Shuffle16, 16),
        aiter_case(ValueLayout::Normal, 16),
    ] {
        let v = judge_once(k.as_ref(), &case);
        assert!(v.is_clean(), "{v:?}");
    }
    drop(k);
    // AITER #5591 (Preshuffle=False with bs > 1 reads token 0 of each block): caught.
    let k = adapter_with_env(
        "aiter --format e4m3fnuz",
        &[("PYTHONPATH", FAKES), ("MQA_FUZZ_FAKE_BUG", "token0")],
    );
    assert!(judge_once(k.as_ref(), &aiter_case(ValueLayout::Shuffle16, 16)).is_clean());
    let v = judge_once(k.as_ref(), &aiter_case(ValueLayout::Normal, 16));
    assert!(classes(&v).contains(&Class::Mismatch), "{v:?}");
    drop(k);
    // The engines' guard turns a NaN in V(r) into -inf: still wrong, no longer NaN.
    let bug = [("PYTHONPATH", FAKES), ("MQA_FUZZ_FAKE_BUG", "nan-last")];
    let v = judge_once(
        adapter_with_env("aiter --format e4m3fnuz", &bug).as_ref(),
        &aiter_case(ValueLayout::Normal, 1),
    );
    assert_eq!(classes(&v), vec![Class::Nan]);
    let v = judge_once(
        adapter_with_env("aiter --format e4m3fnuz --guard", &bug).as_ref(),
        &aiter_case(ValueLayout::Normal, 1),
    );
    assert_eq!(classes(&v), vec![Class::Inf]);
}

#[test]
fn vllm_adapter_against_fake_vllm_and_aiter() {
    require_python!("numpy", "torch");
    let k = adapter_with_env("vllm --format e4m3fnuz", &[("PYTHONPATH", FAKES)]);
    assert!(
        k.version().starts_with("vllm 0.0.0+fake"),
        "{}",
        k.version()
    );
    assert!(k.version().contains("(AITER)"));
    for case in [
        aiter_case(ValueLayout::Normal, 1),
        aiter_case(ValueLayout::Shuffle16, 16),
        aiter_case(ValueLayout::Shuffle16, 16),
    ] {
        let v = judge_once(k.as_ref(), &case);
        assert!(v.is_clean(), "{v:?}");
    }
    // vLLM passes Preshuffle = bs > 1: a normal-layout bs=16 case is not a vLLM case.
    assert!(judge_once(k.as_ref(), &aiter_case(ValueLayout::Normal, 16))
        .skipped
        .is_some());
    drop(k);
    let bug = [("PYTHONPATH", FAKES), ("MQA_FUZZ_FAKE_BUG", "nan-last")];
    let v = judge_once(
        adapter_with_env("vllm --format e4m3fnuz", &bug).as_ref(),
        &aiter_case(ValueLayout::Shuffle16, 16),
    );
    assert_eq!(classes(&v), vec![Class::Nan]);
    // The torch fallback pre-fills -inf: it promises the neg_inf contract and keeps it.
    let k = adapter_with_env(
        "vllm --format e4m3fnuz",
        &[("PYTHONPATH", FAKES), ("VLLM_ROCM_USE_AITER", "0")],
    );
    assert_eq!(
        k.capabilities().outside,
        mqa_fuzz::kernel::OutsideContract::NegInf
    );
    assert!(judge_once(k.as_ref(), &aiter_case(ValueLayout::Normal, 16)).is_clean());
}

/// A library that runs out of device memory (torch's `OutOfMemoryError`) on a case has
/// met the machine's limit, not a bug: the case is skipped with the library's message,
/// and any other exception stays a crash.
#[test]
fn an_adapter_out_of_device_memory_is_a_skip_not_a_crash() {
    require_python!("numpy");
    let dir = std::env::temp_dir().join(format!("mqa-fuzz-oom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("oom_adapter.py");
    std::fs::write(
        &script,
        format!(
            r#"import sys
sys.path.insert(0, {ext:?})
import protocol_common as pc
class OutOfMemoryError(RuntimeError):
    pass
out = pc.protocol_stdout()
hello = {{"name": "oom", "library": "fake", "version": "0", "device": "fake GPU", "capabilities": pc.capabilities()}}
def run(case):
    if case.max_model_len > 100:
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate 52.92 GiB")
    raise ValueError("a real failure")
pc.serve(hello, run, None, out)
"#,
            ext = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels/external"),
        ),
    )
    .unwrap();
    let k = ExecKernel::start(
        "exec:oom",
        ExecConfig::new(format!("python3 {}", script.display())),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let big = recipe(vec![300, 17], 2).materialize();
    let v = judge_once(&k, &big);
    assert!(
        v.skipped
            .as_deref()
            .is_some_and(|w| w.contains("out of device memory")),
        "{v:?}"
    );
    assert!(!v.classes.contains_key(&Class::Crash));
    let small = recipe(vec![20], 1).materialize();
    assert!(small.max_model_len <= 100);
    let v = judge_once(&k, &small);
    assert!(v.classes.contains_key(&Class::Crash), "{v:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The numpy adapter as a fork server (its default when mqa-fuzz offers one), killed
/// with SIGKILL in the middle of its second case: that case is a crash naming the
/// signal, the next life is forked (well under a second) and runs the next case, all
/// over protocol 2. Without the fork server the same happens through a full start.
#[test]
fn a_forked_worker_killed_mid_case_is_a_crash_and_the_next_life_runs_on() {
    require_python!("numpy");
    let script = format!("{FAKES}/../numpy_adapter.py");
    for fork in [true, false] {
        let mut cfg = ExecConfig::new(format!("python3 {script} --fault kill-at=2"));
        cfg.fork_server = fork;
        let k = ExecKernel::start("numpy", cfg).expect("adapter starts");
        assert_eq!(k.hello().protocol, 2, "the adapter speaks protocol 2");
        let cases: Vec<Case> = (0..3)
            .map(|s| Recipe::small(vec![300, 17], 2, s).materialize())
            .collect();
        let results: Vec<_> = cases.iter().map(|c| judge_once(&k, c)).collect();
        assert!(results[0].is_clean(), "{:?}", results[0]);
        assert_eq!(classes(&results[1]), vec![Class::Crash]);
        let msg = results[1].examples[0].detail.clone().unwrap_or_default();
        assert!(
            msg.contains("SIGKILL") && msg.contains("fault injection: SIGKILL on request 2"),
            "{msg}"
        );
        assert!(results[2].is_clean(), "the next life runs the next case");
        let r = k.restart_stats();
        assert_eq!(r.restarts, 1, "{r:?}");
        if fork {
            assert_eq!(r.forked, 1, "{r:?}");
            assert!(
                r.max_secs < 1.0,
                "a forked restart took {:.2} s",
                r.max_secs
            );
        } else {
            assert_eq!(r.forked, 0, "{r:?}");
        }
    }
}

/// A fork server forks each next life ahead: a worker whose set-up takes 0.6 s (as a
/// device initialisation does) is SIGKILLed on its second case, and the restart takes
/// the life that set itself up meanwhile (well under the set-up time); with spares off
/// (`MQA_FUZZ_EXEC_SPARE=off`) the restart waits for a whole set-up.
#[test]
fn a_restart_takes_the_life_forked_ahead() {
    require_python!("numpy");
    let script = format!("{FAKES}/../numpy_adapter.py");
    for spare in [true, false] {
        let mut cfg = ExecConfig::new(format!(
            "python3 {script} --setup-delay 0.6 --fault kill-at=2"
        ));
        cfg.spare_lives = spare;
        let k = ExecKernel::start("numpy", cfg).expect("adapter starts");
        let cases: Vec<Case> = (0..3)
            .map(|s| Recipe::small(vec![300, 17], 2, s).materialize())
            .collect();
        assert!(judge_once(&k, &cases[0]).is_clean());
        // The spare sets itself up while the first life serves.
        std::thread::sleep(std::time::Duration::from_millis(1200));
        assert_eq!(classes(&judge_once(&k, &cases[1])), vec![Class::Crash]);
        assert!(
            judge_once(&k, &cases[2]).is_clean(),
            "the next life runs on"
        );
        let r = k.restart_stats();
        assert_eq!((r.restarts, r.forked), (1, 1), "{r:?}");
        if spare {
            assert_eq!(r.from_spare, 1, "{r:?}");
            assert!(
                r.max_secs < 0.4,
                "restart into the spare took {:.2} s",
                r.max_secs
            );
        } else {
            assert_eq!(r.from_spare, 0, "{r:?}");
            assert!(
                r.max_secs >= 0.55,
                "a fresh life sets up: {:.2} s",
                r.max_secs
            );
        }
    }
}

/// An empty scratch directory of this test process.
fn fresh_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("mqa-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `mqa-fuzz run` of `kernel` over `--profile layout` for `cases` cases of `seed`, without
/// replay or shrinking, its report in `dir/r` and its corpus in `dir/c`.
fn layout_campaign(kernel: &str, cases: u32, seed: u32, dir: &std::path::Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mqa-fuzz"));
    c.args(["run", "--kernel", kernel, "--profile", "layout"])
        .args(["--cases", &cases.to_string(), "--seed", &seed.to_string()])
        .args(["--no-replay", "--no-shrink", "-q", "--report"])
        .arg(dir.join("r"))
        .arg("--corpus")
        .arg(dir.join("c"));
    c
}

/// The shape-epoch key fields of every generated case of a `--cases 48` campaign of the
/// numpy adapter declaring `compile_key` (empty: none), with `extra` arguments.
fn epoch_keys(name: &str, compile_key: &str, extra: &[&str]) -> Vec<(u64, u64, u64)> {
    let dir = fresh_dir(&format!("epochs-{name}"));
    let script = format!("{FAKES}/../numpy_adapter.py");
    let kernel = match compile_key {
        "" => format!("exec:python3 {script}"),
        k => format!("exec:python3 {script} --compile-key {k}"),
    };
    let report = dir.join("r");
    let out = layout_campaign(&kernel, 48, 4, &dir)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.code().unwrap_or(9) <= 1,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = std::fs::read_to_string(report.join("cases.jsonl")).unwrap();
    let mut keys: Vec<(u64, (u64, u64, u64))> = log
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let r = &v["recipe"];
            let f = |n: &str| r[n].as_u64().unwrap();
            (
                v["k"].as_u64().unwrap(),
                (f("heads"), f("head_dim"), f("next_n")),
            )
        })
        .collect();
    keys.sort();
    let _ = std::fs::remove_dir_all(&dir);
    keys.into_iter().map(|(_, k)| k).collect()
}

/// A kernel that declares a compile key gets cases in shape epochs: 16 consecutive cases
/// share heads and head dim (their next_n, lengths and the rest vary), and the epochs
/// differ from each other; without a key, or with `--shape-epoch 1`, shapes change from
/// case to case.
#[test]
fn shape_epochs_group_cases_by_the_declared_compile_key() {
    require_python!("numpy");
    let distinct = |v: &[(u64, u64, u64)]| {
        let mut s: Vec<_> = v.iter().map(|&(h, d, _)| (h, d)).collect();
        s.sort();
        s.dedup();
        s.len()
    };
    let pinned = epoch_keys("key", "heads,head_dim", &["--shape-epoch", "16"]);
    assert_eq!(pinned.len(), 48);
    for epoch in pinned.chunks(16) {
        assert_eq!(distinct(epoch), 1, "one key per epoch: {epoch:?}");
    }
    assert!(distinct(&pinned) >= 2, "epochs draw new keys: {pinned:?}");
    let next_n: std::collections::BTreeSet<u64> = pinned.iter().map(|k| k.2).collect();
    assert!(
        next_n.len() >= 2,
        "fields outside the key still vary: {pinned:?}"
    );
    let free = epoch_keys("nokey", "", &[]);
    assert!(distinct(&free[..16]) >= 3, "no key, no epochs: {free:?}");
    let off = epoch_keys("off", "heads,head_dim", &["--shape-epoch", "1"]);
    assert_eq!(off, free, "--shape-epoch 1 is the campaign without epochs");
}

/// A worker that cannot start again after a crash (its library fails to import a second
/// time): mqa-fuzz retries with back-off, then stops with exit 3, keeps the crash it
/// found (saved to the corpus, in the report) and says in the headline why it stopped.
#[test]
fn a_worker_that_cannot_restart_stops_the_campaign_but_keeps_its_findings() {
    require_python!("numpy");
    let dir = fresh_dir("norestart");
    let script = dir.join("w.sh");
    let flag = dir.join("started");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nif [ -e '{}' ]; then echo 'cannot import the library a second time' >&2; exit 1; fi\ntouch '{}'\nexec python3 {FAKES}/../numpy_adapter.py --fault crash-at=2\n",
            flag.display(),
            flag.display()
        ),
    )
    .unwrap();
    let kernel = format!("exec:sh {}", script.display());
    let (report, corpus) = (dir.join("r"), dir.join("c"));
    let t0 = std::time::Instant::now();
    let out = layout_campaign(&kernel, 12, 1, &dir)
        .env("MQA_FUZZ_EXEC_FORK", "0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("retrying in"),
        "each failed restart is logged: {stderr}"
    );
    assert!(
        stderr.contains("cannot import the library a second time"),
        "{stderr}"
    );
    assert!(t0.elapsed().as_secs() < 60);
    let summary = std::fs::read_to_string(report.join("summary.md")).unwrap();
    assert!(
        summary.contains("STOPPED EARLY: the worker could not be restarted"),
        "{summary}"
    );
    let saved: Vec<_> = std::fs::read_dir(&corpus).unwrap().collect();
    assert_eq!(saved.len(), 1, "the crash found before is saved");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(report.join("report.json")).unwrap())
            .unwrap();
    assert_eq!(r["findings"].as_array().map(Vec::len), Some(1));
    let _ = std::fs::remove_dir_all(&dir);
}

/// An adapter whose forked lives cannot start (a library that initialised the device
/// before the fork) still runs: mqa-fuzz notices the first life fail and starts the same
/// command without a fork server.
#[test]
fn a_fork_server_whose_lives_fail_falls_back_to_plain_workers() {
    require_python!("numpy");
    let dir = fresh_dir("forkfail");
    let script = dir.join("adapter.py");
    std::fs::write(
        &script,
        format!(
            r#"import os, sys
sys.path.insert(0, "{FAKES}/..")
import protocol_common as pc
import numpy_adapter as na
server = os.getpid()
def setup():
    if os.getpid() != server:
        raise pc.Environment("the device was initialised before the fork")
    hello = {{"name": "numpy:chunked", "library": "numpy", "version": "1", "device": "cpu",
             "capabilities": pc.capabilities()}}
    return hello, na.Kernel().run
pc.serve_forking(setup)
"#
        ),
    )
    .unwrap();
    let cfg = ExecConfig::new(format!("python3 {}", script.display()));
    let k = ExecKernel::start("fallback", cfg).expect("starts without the fork server");
    let report = k.worker_report().unwrap();
    assert!(!report.fork_server, "{report:?}");
    let case = Recipe::small(vec![300, 17], 2, 1).materialize();
    assert!(judge_once(&k, &case).is_clean());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A hosted life's warm-up (hosted.py `warm_up`) makes the launch's torch operations
/// through the same `Call` methods a case uses: here over host memory standing in for
/// the device's (the test's `Call` wraps pointers with numpy), so the per-token lengths
/// of a 1-D case and the copy into the output are checked where no GPU is; on a GPU the
/// hosted campaigns of `scripts/gpu-check.sh` run it for real. A warm-up whose own
/// results are wrong raises (and the life goes on without it).
#[test]
fn the_hosted_warm_up_makes_the_launch_operations() {
    require_python!("numpy", "torch");
    let script = r#"
import ctypes, os, sys
import numpy as np, torch
sys.path.insert(0, os.environ["ADAPTERS"])
import hosted

class HostCall(hosted.Call):
    def _t(self, ptr, shape, strides, typestr):
        item = int(typestr[2:])
        dt = {"u": np.uint8, "i": np.int32, "f": np.float32}[typestr[1]]
        span = sum((s - 1) * st for s, st in zip(shape, strides)) + item
        buf = (ctypes.c_uint8 * span).from_address(ptr)
        return torch.from_numpy(np.ndarray(shape, dtype=dt, buffer=buf, strides=strides))

secs = hosted.warm_up(torch, device="cpu", make_call=HostCall)
assert 0 < secs < 30, secs
os.environ["MQA_FUZZ_WARM_UP"] = "off"
assert not hosted.warm_up_wanted()
os.environ["MQA_FUZZ_WARM_UP"] = "on"
assert hosted.warm_up_wanted()

class WrongLengths(HostCall):
    def lens_per_token(self):
        return super().lens_per_token() + 1
try:
    hosted.warm_up(torch, device="cpu", make_call=WrongLengths)
    raise SystemExit("a warm-up with wrong lengths passed")
except RuntimeError as e:
    assert "lengths" in str(e), e
print("ok")
"#;
    let out = Command::new("python3")
        .args(["-c", script])
        .env("ADAPTERS", format!("{FAKES}/.."))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
        "{stderr}"
    );
}

/// `libmqa_fuzz.so` as `cargo` built it: beside the binary after `cargo build` (what
/// mqa-fuzz hands its adapters as `MQA_FUZZ_HOSTED_LIB`), in `deps/` after `cargo test`
/// alone (which builds it but does not copy it up).
fn hosted_library() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_BIN_EXE_mqa-fuzz"))
        .parent()
        .unwrap();
    let lib = [dir.join("libmqa_fuzz.so"), dir.join("deps/libmqa_fuzz.so")]
        .into_iter()
        .find(|p| p.is_file());
    lib.unwrap_or_else(|| panic!("libmqa_fuzz.so was not built in {}", dir.display()))
}

/// The hosted path's Python half (`hosted.py`) against the real library, without a GPU:
/// the ctypes mirror of the call has the library's layout (the numbers of
/// `kernel::cuda::hosted`'s layout test), a library of another ABI or a CPU device is
/// refused with the reason, and the library's server, handed pipes on a machine
/// without a usable GPU, answers with one environment error line and status 3.
#[test]
fn the_hosted_path_loads_the_library_and_refuses_clearly_without_a_gpu() {
    require_python!("numpy");
    let gpu = mqa_fuzz::kernel::cuda::device::availability().is_ok();
    let script = r#"
import ctypes, json, os, sys
sys.path.insert(0, os.environ["ADAPTERS"])
import hosted, protocol_common as pc
H = hosted.HostedCall
assert ctypes.sizeof(hosted.Params) == 128, ctypes.sizeof(hosted.Params)
assert (H.num_blocks.offset, H.kernel_us.offset, H.message.offset, ctypes.sizeof(H)) == (128, 144, 152, 2200)
lib, why = hosted.library()
assert lib is not None, why
class Dev: type = "cpu"
assert "not a CUDA GPU" in hosted.wanted(Dev, None)[1]
os.environ["MQA_FUZZ_HOSTED"] = "on"
try:
    hosted.wanted(Dev, None)
    raise SystemExit("MQA_FUZZ_HOSTED=on with a CPU device was not refused")
except pc.Environment as e:
    assert "MQA_FUZZ_HOSTED=on" in str(e), e
os.environ["MQA_FUZZ_HOSTED"] = "off"
assert hosted.library() == (None, "MQA_FUZZ_HOSTED=off")
os.environ["MQA_FUZZ_HOSTED"] = "auto"
hosted.ABI = 99
assert "ABI 1" in hosted.library()[1]
hosted.ABI = 1
if os.environ["GPU"] == "0":
    r_in, w_in = os.pipe()
    r_out, w_out = os.pipe()
    os.close(w_in)
    calls = []
    LAUNCH = hosted.LAUNCH(lambda c: calls.append(c) or 0)
    hello = json.dumps({"name": "x", "library": "y", "version": "1", "device": "d", "capabilities": pc.capabilities()}).encode()
    code = lib.mqa_fuzz_hosted_serve(r_in, w_out, hello, None, LAUNCH)
    os.close(w_out)
    line = json.loads(os.read(r_out, 1 << 16).decode().splitlines()[0])
    assert code == 3, code
    assert line["type"] == "error" and line["kind"] == "environment", line
    assert "CUDA" in line["message"] or "GPU" in line["message"] or "NVRTC" in line["message"], line
    assert not calls
print("ok")
"#;
    let out = Command::new("python3")
        .args(["-c", script])
        .env("ADAPTERS", format!("{FAKES}/.."))
        .env("MQA_FUZZ_HOSTED_LIB", hosted_library())
        .env("GPU", if gpu { "1" } else { "0" })
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
        "{stderr}"
    );
}

/// An adapter that declares `kv_stride_align` (DeepGEMM: 16) gets padded strides padded
/// up to a multiple, counted as adjusted, and never a case it would skip for its stride:
/// the numpy adapter, told to skip unaligned strides as DeepGEMM does, skips none.
#[test]
fn a_declared_stride_alignment_pads_strides_instead_of_skipping_cases() {
    require_python!("numpy");
    let dir = fresh_dir("stride-align");
    let kernel = format!("exec:python3 {FAKES}/../numpy_adapter.py --kv-stride-align 16");
    let report = dir.join("r");
    let out = layout_campaign(&kernel, 40, 6, &dir).output().unwrap();
    assert!(
        out.status.code().unwrap_or(9) <= 1,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(report.join("report.json")).unwrap())
            .unwrap();
    let adjusted = r["counts"]["skip_reasons"]["adjusted: kv block stride (unaligned)"]
        .as_u64()
        .unwrap_or(0);
    assert!(adjusted > 0, "no stride padded up: {}", r["counts"]);
    let log = std::fs::read_to_string(report.join("cases.jsonl")).unwrap();
    assert!(
        !log.contains("must be a multiple of 16"),
        "a case skipped for its stride"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
