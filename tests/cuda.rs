//! The CUDA backend from the outside: on a machine without a GPU (CI) the kernels are
//! listed as unavailable and asking for one is an environment error (exit 3, one
//! line); on a machine with one, the kernels run and a planted bug is caught through
//! its real mechanism. Tests that need a GPU say so visibly when they skip.

use mqa_fuzz::generate::Recipe;
use mqa_fuzz::harness::{self, ReferenceCache};
use mqa_fuzz::kernel::cuda;
use mqa_fuzz::oracle::{Class, OracleConfig};
use std::process::Command;

mod support;
use support::skip::{trial, Ran};

fn main() {
    support::skip::main(vec![
        trial(
            "kernels_lists_every_cuda_kernel_with_its_availability",
            kernels_lists_every_cuda_kernel_with_its_availability,
        ),
        trial(
            "asking_for_a_cuda_kernel_without_a_gpu_is_an_environment_error",
            asking_for_a_cuda_kernel_without_a_gpu_is_an_environment_error,
        ),
        trial(
            "naive_and_tiled_are_clean_and_a_planted_bug_is_caught_on_the_gpu",
            naive_and_tiled_are_clean_and_a_planted_bug_is_caught_on_the_gpu,
        ),
        trial(
            "gpu_selection_is_parsed_and_checked",
            gpu_selection_is_parsed_and_checked,
        ),
        trial(
            "a_write_anywhere_in_the_cache_is_an_input_mutation",
            a_write_anywhere_in_the_cache_is_an_input_mutation,
        ),
        trial(
            "the_cache_keeps_its_poison_between_cases",
            the_cache_keeps_its_poison_between_cases,
        ),
        trial(
            "the_kernel_reads_a_read_only_cache_through_its_own_addresses",
            the_kernel_reads_a_read_only_cache_through_its_own_addresses,
        ),
        trial(
            "judge_auto_chooses_the_cpu_without_a_gpu_and_gpu_is_refused",
            judge_auto_chooses_the_cpu_without_a_gpu_and_gpu_is_refused,
        ),
        trial(
            "a_device_judged_campaign_finds_a_planted_bug_and_agrees_with_the_cpu",
            a_device_judged_campaign_finds_a_planted_bug_and_agrees_with_the_cpu,
        ),
    ])
}

/// The mqa-fuzz binary (MQA_FUZZ_WORKER_EXE when the tests run on another machine).
fn bin() -> Command {
    match std::env::var_os("MQA_FUZZ_WORKER_EXE") {
        Some(p) => Command::new(p),
        None => Command::new(env!("CARGO_BIN_EXE_mqa-fuzz")),
    }
}

fn gpu() -> Result<usize, String> {
    cuda::device::availability().map_err(|why| format!("no usable GPU: {why}"))
}

fn recipe(lens: Vec<usize>, next_n: usize) -> Recipe {
    Recipe::small(lens, next_n, 5).with(|k| k.heads = 32)
}

fn kernels_lists_every_cuda_kernel_with_its_availability() -> Ran {
    let out = bin().args(["kernels", "--json"]).output().unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cuda: Vec<&serde_json::Value> = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"].as_str().unwrap().starts_with("cuda:"))
        .collect();
    for name in [
        "cuda:naive",
        "cuda:tiled",
        "cuda:bug-offset32-kv",
        "cuda:bug-offset32-out",
    ] {
        assert!(
            cuda.iter().any(|e| e["name"] == name),
            "{name} missing from `kernels`"
        );
    }
    assert!(
        !v.as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"].as_str().unwrap().starts_with("cuda-direct:")),
        "cuda-direct kernels are not listed"
    );
    if gpu().is_err() {
        for e in &cuda {
            assert_eq!(e["available"], false);
            assert!(
                e["unavailable_reason"].as_str().unwrap().contains("CUDA")
                    || e["unavailable_reason"].as_str().unwrap().contains("GPU")
            );
        }
    }
    Ok(())
}

fn asking_for_a_cuda_kernel_without_a_gpu_is_an_environment_error() -> Ran {
    if cuda::device::availability().is_ok() {
        return Err("this machine has a GPU: the no-GPU path cannot be seen here".into());
    }
    let dir = tempfile::tempdir().unwrap();
    let case = recipe(vec![40], 1).materialize();
    let path = dir.path().join("c.json");
    let file = mqa_fuzz::case::CaseFile {
        provenance: Default::default(),
        expected: Default::default(),
        case,
    };
    mqa_fuzz::case::save_case_file(&path, &file).unwrap();
    for k in ["cuda:tiled", "cuda-direct:naive"] {
        let out = bin()
            .args(["replay", path.to_str().unwrap(), "--kernel", k])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(3),
            "{k}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(err.contains("not available"), "{err}");
    }
    let out = bin()
        .args(["replay", path.to_str().unwrap(), "--kernel", "cuda:no-such"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    Ok(())
}

fn naive_and_tiled_are_clean_and_a_planted_bug_is_caught_on_the_gpu() -> Ran {
    gpu()?;
    // cuda: workers are `mqa-fuzz worker` processes; this test binary is not mqa-fuzz.
    if std::env::var_os("MQA_FUZZ_WORKER_EXE").is_none() {
        std::env::set_var("MQA_FUZZ_WORKER_EXE", env!("CARGO_BIN_EXE_mqa-fuzz"));
    }
    let cfg = OracleConfig::default();
    let case = recipe(vec![300, 700], 2).materialize();
    for name in ["cuda-direct:naive", "cuda-direct:tiled"] {
        let k = mqa_fuzz::kernel::open(name).unwrap();
        let mut refs = ReferenceCache::new(&case);
        let v = harness::run_and_judge(k.as_ref(), &case, &mut refs, &cfg).verdict;
        assert!(v.is_clean(), "{name}: {v:?}");
        assert_eq!(v.run.inputs_intact, Some(true));
        assert!(v.run.kernel_time.is_some() && v.run.device_bytes.is_some());
    }
    let k = mqa_fuzz::kernel::open("cuda:bug-tail-unwritten").unwrap();
    let mut refs = ReferenceCache::new(&case);
    let v = harness::run_and_judge(k.as_ref(), &case, &mut refs, &cfg).verdict;
    assert!(v.classes.contains_key(&Class::Unwritten), "{v:?}");
    Ok(())
}

fn gpu_selection_is_parsed_and_checked() -> Ran {
    assert_eq!(cuda::parse_gpus("all", 2).unwrap(), vec![0, 1]);
    assert!(cuda::parse_gpus("0,5", 2).is_err());
    if gpu().is_err() {
        assert!(cuda::select_gpus("all").is_err());
    }
    Ok(())
}

/// The cache is checked in one read after the run (`DeviceCase::input_hashes`): a word
/// changed in a stored block, in an unreferenced block or in a block's stride padding
/// each makes the hashes differ from the ones taken before the run.
fn a_write_anywhere_in_the_cache_is_an_input_mutation() -> Ran {
    gpu()?;
    // Strides of 16-byte multiples are read 16 bytes at a time, others a word at a time.
    // A pool past 4 GiB (its blocks around byte 2^32): its ends lie in windows of the
    // streamed read far apart, past 32-bit offsets.
    use mqa_fuzz::generate::OffsetClass;
    for (pad, offsets) in [
        (16, OffsetClass::Low),
        (12, OffsetClass::Low),
        (16, OffsetClass::Around4G),
        (12, OffsetClass::Around4G),
    ] {
        let case = recipe(vec![300, 700], 2)
            .with(|k| {
                k.kv_stride_pad = pad;
                k.offsets = offsets;
            })
            .materialize();
        if offsets == OffsetClass::Around4G {
            assert!(case.kv_cache_bytes() > 1 << 32, "a pool past 4 GiB");
        }
        assert_eq!(case.kv_block_stride.is_multiple_of(16), pad == 16);
        mutations_are_seen(&case)?;
    }
    Ok(())
}

fn mutations_are_seen(case: &mqa_fuzz::case::Case) -> Ran {
    use mqa_fuzz::kernel::cuda::memory::{CacheView, DeviceCase};
    let stored = case.kv.ids();
    let unreferenced = (0..case.num_blocks)
        .find(|id| !stored.contains(id))
        .unwrap();
    let last_unreferenced = (0..case.num_blocks)
        .rev()
        .find(|id| !stored.contains(id))
        .unwrap();
    let bb = case.shape.block_bytes() as u64;
    let stride = case.kv_block_stride;
    let values_end = (case.shape.block_size * case.shape.head_dim) as u64;
    // u64::MAX: the last word of the mapped span (past the pool's last block).
    for (what, at) in [
        ("a stored block", stored[0] * stride + 8),
        (
            "a stored block's scales",
            stored[0] * stride + values_end + 4,
        ),
        ("an unreferenced block", unreferenced * stride),
        (
            "an unreferenced block's scales",
            unreferenced * stride + values_end,
        ),
        ("the pool's last block", last_unreferenced * stride + bb - 4),
        ("stride padding", stored[1] * stride + bb + 4),
        ("the mapped span's last word", u64::MAX),
    ] {
        let changed = cuda::device::with_gpu(|gpu| {
            let mut dc = DeviceCase::upload_poisoned(gpu, case, CacheView::ReadBack)?;
            let before = dc.input_hashes(gpu, false)?;
            let same = dc.input_hashes(gpu, true)?;
            assert_eq!(before, same, "nothing written yet");
            let span = cuda::sys::DeviceSpan {
                ptr: dc.kv.ptr,
                bytes: dc.cache_mapped_bytes(),
            };
            let at = if at == u64::MAX { span.bytes - 4 } else { at };
            span.upload(at, &[0x1234_5678u32]).unwrap();
            Ok(before != dc.input_hashes(gpu, true)?)
        })
        .map_err(|e| format!("{e:?}"))?;
        assert!(changed, "a write into {what} went unnoticed");
    }
    Ok(())
}

/// A case laid out with `CacheView::ReadOnly` hands the kernel other addresses than
/// mqa-fuzz's own (the read-only mapping of the same memory): every word read through
/// them is the word at mqa-fuzz's, a store through mqa-fuzz's shows through them, and
/// `ReadBack` hands the kernel mqa-fuzz's own. (A store through the read-only view
/// faults and ends the process's context, so that is checked by a campaign:
/// `scripts/gpu-check.sh`'s `read-only-cache`.)
fn the_kernel_reads_a_read_only_cache_through_its_own_addresses() -> Ran {
    use mqa_fuzz::kernel::cuda::memory::{CacheView, DeviceCase};
    gpu()?;
    let case = recipe(vec![300, 700], 2)
        .with(|k| k.surplus_blocks = 5_000)
        .materialize();
    cuda::device::with_gpu(|gpu| {
        let dc = DeviceCase::upload_poisoned(gpu, &case, CacheView::ReadBack)?;
        assert_eq!(
            dc.params.kv, dc.kv.ptr,
            "read-back: the kernel gets our addresses"
        );
        drop(dc);
        let dc = DeviceCase::upload_poisoned(gpu, &case, CacheView::ReadOnly)?;
        assert_ne!(dc.params.kv, dc.kv.ptr, "read-only: another mapping");
        let view = cuda::sys::DeviceSpan {
            ptr: dc.params.kv,
            bytes: dc.kv.bytes,
        };
        let words = (dc.kv.bytes / 16).min(1 << 16) as usize;
        let (mut ours, mut theirs) = (vec![0u32; words], vec![0u32; words]);
        for at in [0, (dc.kv.bytes / 2) & !3, dc.kv.bytes - 4 * words as u64] {
            dc.kv.download(at, &mut ours).unwrap();
            view.download(at, &mut theirs).unwrap();
            assert_eq!(ours, theirs, "the two mappings differ at byte {at}");
        }
        dc.kv.upload(12, &[0x1234_5678u32]).unwrap();
        view.download(12, &mut theirs[..1]).unwrap();
        assert_eq!(
            theirs[0], 0x1234_5678,
            "a store of ours shows through the view"
        );
        Ok(())
    })
    .map_err(|e| format!("{e:?}"))
}

/// The cache's address range is kept between cases with its poison
/// (`kernel::cuda::pool`): each case below follows another of some other geometry,
/// size or fp8 format (or the same one), and the whole mapped cache must read as that
/// case's own poison (the integrity read counts every other word). What was rewritten
/// shows the mechanism: nothing for the same case again, only scale slots for another
/// geometry of the same format, everything for another format or after a run that
/// wrote into the pool.
fn the_cache_keeps_its_poison_between_cases() -> Ran {
    use mqa_fuzz::kernel::cuda::memory::{CacheView, DeviceCase};
    use mqa_fuzz::Fp8Format;
    gpu()?;
    let make = |pad: u64, block_size: usize, format: Fp8Format, ctx: usize| {
        recipe(vec![ctx, ctx / 2], 1)
            .with(|k| {
                k.kv_stride_pad = pad;
                k.block_size = block_size;
                k.format = format;
                k.surplus_blocks = 20_000;
            })
            .materialize()
    };
    let fnz = Fp8Format::E4m3fn;
    let cases = [
        ("fnuz first", make(0, 16, Fp8Format::E4m3fnuz, 900)),
        ("fn", make(16, 64, fnz, 3000)),
        ("same again", make(16, 64, fnz, 3000)),
        ("stride +12", make(12, 64, fnz, 3000)),
        ("block size 16", make(0, 16, fnz, 900)),
        ("fnuz", make(0, 16, Fp8Format::E4m3fnuz, 900)),
        ("fn, larger", make(64, 64, fnz, 9000)),
        ("written into", make(64, 64, fnz, 9000)),
        ("after the write", make(64, 64, fnz, 9000)),
    ];
    let mut rewritten = Vec::new();
    for (what, case) in &cases {
        let r = cuda::device::with_gpu(|gpu| {
            let mut dc = DeviceCase::upload_poisoned(gpu, case, CacheView::ReadBack)?;
            let before = dc.input_hashes(gpu, false)?;
            let after = dc.input_hashes(gpu, true)?;
            if *what == "written into" {
                dc.kv.upload(dc.kv.bytes - 4, &[0x1234_5678u32]).unwrap();
                assert_ne!(after, dc.input_hashes(gpu, true)?);
            }
            Ok((before == after, dc.poisoned_bytes, dc.cache_mapped_bytes()))
        })
        .map_err(|e| format!("{e:?}"))?;
        assert!(r.0, "{what}: the cache is not this case's poison");
        rewritten.push((*what, r.1, r.2));
    }
    eprintln!("bytes of the cache poisoned per case: {rewritten:?}");
    let by = |w: &str| rewritten.iter().find(|r| r.0 == w).unwrap();
    assert!(by("fn").1 >= by("fn").2, "another format: everything");
    assert_eq!(
        by("same again").1,
        0,
        "the same geometry again rewrites nothing"
    );
    let slots = by("stride +12");
    assert!(
        slots.1 > 0 && slots.1 < slots.2 / 8,
        "another stride: scale slots only {slots:?}"
    );
    assert!(by("fnuz").1 >= by("fnuz").2, "another format: everything");
    let after = by("after the write");
    assert!(
        after.1 >= after.2,
        "after a run that wrote into the pool: everything"
    );
    Ok(())
}

/// `--judge auto` says in one line where a kernel is judged (the CPU for a CPU kernel);
/// `--judge gpu` with a kernel that cannot is exit 2 with one line.
fn judge_auto_chooses_the_cpu_without_a_gpu_and_gpu_is_refused() -> Ran {
    let dir = tempfile::tempdir().unwrap();
    let run = |judge: &str| {
        bin()
            .current_dir(dir.path())
            .args([
                "run",
                "-k",
                "cpu:naive",
                "--cases",
                "1",
                "--no-replay",
                "--judge",
                judge,
            ])
            .output()
            .unwrap()
    };
    let out = run("auto");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("mqa-fuzz: judge:"))
        .unwrap();
    assert!(
        line.contains("cpu:naive on the CPU (cpu:naive leaves its output in host memory)"),
        "{line}"
    );
    let out = run("gpu");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    // The campaign's first line (seed, report), then the error in one line.
    let last = err.trim().lines().last().unwrap();
    assert!(
        last.starts_with("mqa-fuzz: --judge gpu: cpu:naive"),
        "{err}"
    );
    assert_eq!(err.matches("--judge").count(), 2, "one line: {err}");
    Ok(())
}

/// On the GPU: a planted bug is found by a campaign judged on the device (its output
/// then comes back, the CPU judges it too and the counts agree: no
/// `oracle_disagreement`), and the clean kernel's campaign is judged on the device.
fn a_device_judged_campaign_finds_a_planted_bug_and_agrees_with_the_cpu() -> Ran {
    gpu()?;
    let dir = tempfile::tempdir().unwrap();
    let campaign = |kernel: &str| {
        let out = bin()
            .current_dir(dir.path())
            .args([
                "run",
                "-k",
                kernel,
                "--profile",
                "production",
                "--cases",
                "6",
                "--seed",
                "3",
            ])
            .args([
                "--no-replay",
                "--judge",
                "gpu",
                "--report",
                kernel,
                "--no-shrink",
            ])
            .output()
            .unwrap();
        let report: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.path().join(kernel).join("report.json")).unwrap(),
        )
        .unwrap();
        (out.status.code(), report)
    };
    let (code, r) = campaign("cuda:tiled");
    assert_eq!(code, Some(0), "{r}");
    let judge = &r["per_kernel"]["cuda:tiled"]["judge"];
    assert_eq!(judge["device_cases"], 6, "{judge}");
    assert!(judge["rechecked_elements"].as_u64().unwrap() > 0, "{judge}");
    let (code, r) = campaign("cuda:bug-offset32-kv");
    assert_eq!(code, Some(1), "{r}");
    let text = r.to_string();
    assert!(!text.contains("oracle_disagreement"), "{text}");
    assert!(
        r["per_kernel"]["cuda:bug-offset32-kv"]["judge"]["device_then_cpu"]
            .as_u64()
            .unwrap()
            > 0
    );
    Ok(())
}
