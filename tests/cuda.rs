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
