//! Real libraries on a GPU through the worker protocol. Runs only with `MQA_FUZZ_GPU=1`
//! (`scripts/gpu-check.sh deepgemm` sets it up on a GPU machine); elsewhere it says it skipped.
//!
//! Hand-built cases over the axes DeepGEMM must survive (lengths 0/1/<N, 2-D lengths,
//! caches past 2 and 4 GiB, an output past 2 GiB, hostile values, a production batch),
//! each judged by the oracle, plus a throughput loop; results are printed as a table for
//! BENCHMARKS.md.

use mqa_fuzz::case::Case;
use mqa_fuzz::generate::*;
use mqa_fuzz::harness::{run_and_judge, ReferenceCache};
use mqa_fuzz::kernel;
use mqa_fuzz::oracle::OracleConfig;
use std::time::Instant;

mod support;
use support::skip::{trial, Ran};

fn main() {
    support::skip::main(vec![
        trial("write_cases_for_replay", write_cases_for_replay),
        trial(
            "gpu_adapters_on_hand_built_cases",
            gpu_adapters_on_hand_built_cases,
        ),
    ])
}

fn base(lens: Vec<usize>, next_n: usize, seed: u64) -> Recipe {
    Recipe::small(lens, next_n, seed).with(|k| {
        k.heads = 64;
        k.head_dim = 128;
        k.block_size = 64;
        k.model_len_slack = 7;
        k.out_stride_pad = 0;
        k.table_stride_pad = 3;
        k.kv_stride_pad = 16;
    })
}

/// Lengths around `mean` ± `spread` (deterministic).
fn spread_lens(n: usize, mean: usize, spread: f64, seed: u64) -> Vec<usize> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (x >> 11) as f64 / (1u64 << 53) as f64;
            ((mean as f64) * (1.0 + spread * (2.0 * u - 1.0))) as usize
        })
        .collect()
}

fn cases(big: bool) -> Vec<(&'static str, Case)> {
    let mut v = vec![
        (
            "edges: ctx 300,0,1,513,64,65 N=2",
            base(vec![300, 0, 1, 513, 64, 65], 2, 1).materialize(),
        ),
        (
            "edges N=1: ctx 0,1,255,256,257",
            base(vec![0, 1, 255, 256, 257], 1, 2).materialize(),
        ),
        (
            "2-D lens N=2",
            Recipe {
                lens: LensRecipe::PerToken(vec![vec![100, 101], vec![0, 1], vec![700, 650]]),
                ..base(vec![], 2, 3)
            }
            .materialize(),
        ),
        (
            "cache ids past 2 GiB",
            base(vec![3000, 2000], 2, 4)
                .with(|k| k.offsets = OffsetClass::Around2G)
                .materialize(),
        ),
        (
            "cache ids past 4 GiB, stride pad 4 KiB",
            base(vec![3000, 2000, 7], 2, 5)
                .with(|k| {
                    k.offsets = OffsetClass::Around4G;
                    k.kv_stride_pad = 4096;
                })
                .materialize(),
        ),
        (
            "hostile values",
            base(vec![900, 300], 2, 6)
                .with(|k| k.values = ValueKind::Hostile)
                .materialize(),
        ),
        (
            "relu boundary",
            base(vec![900, 300], 1, 7)
                .with(|k| k.values = ValueKind::ReluBoundary)
                .materialize(),
        ),
        ("all-zero batch B=32", base(vec![0; 32], 1, 8).materialize()),
        (
            "production B=64 N=2 ctx 32768±30%",
            base(spread_lens(64, 32768, 0.3, 9), 2, 9).materialize(),
        ),
    ];
    if big {
        v.push((
            "output past 2 GiB (max_model_len 2^20)",
            base(vec![1 << 20], 1, 10)
                .with(|k| {
                    k.big_output = true;
                    k.model_len_slack = 0;
                })
                .materialize(),
        ));
    }
    v
}

/// Writes the small hand-built cases as corpus files (for `mqa-fuzz replay` there).
fn write_cases_for_replay() -> Ran {
    let Ok(dir) = std::env::var("MQA_FUZZ_WRITE_CASES") else {
        return Err("set MQA_FUZZ_WRITE_CASES=DIR to write the GPU cases as corpus files".into());
    };
    for (k, (what, case)) in cases(false).into_iter().take(3).enumerate() {
        let provenance = mqa_fuzz::case::Provenance {
            kernel: "hand-made".into(),
            note: Some(what.into()),
            ..Default::default()
        };
        let file = mqa_fuzz::case::CaseFile {
            provenance,
            expected: Default::default(),
            case,
        };
        mqa_fuzz::case::save_case_file(
            &std::path::Path::new(&dir).join(format!("gpu-{k}.json")),
            &file,
        )
        .unwrap();
    }
    Ok(())
}

fn gpu_adapters_on_hand_built_cases() -> Ran {
    if std::env::var("MQA_FUZZ_GPU").is_err() {
        return Err("set MQA_FUZZ_GPU=1 on a GPU machine (scripts/gpu-check.sh deepgemm)".into());
    }
    let kernels = std::env::var("MQA_FUZZ_GPU_KERNELS").unwrap_or_else(|_| "deepgemm,torch".into());
    let cfg = OracleConfig {
        topk: 512,
        ..Default::default()
    };
    for name in kernels.split(',') {
        let t0 = Instant::now();
        let k = match kernel::open(name) {
            Ok(k) => k,
            Err(e) => {
                println!("{name}: cannot open: {e}");
                continue;
            }
        };
        println!(
            "\n== {name}: {} (open {:.1} s)",
            k.version(),
            t0.elapsed().as_secs_f64()
        );
        let big = name == "deepgemm";
        for (what, case) in cases(big) {
            if name != "deepgemm" && what.starts_with("production") {
                continue; // the torch loop over 32K blocks takes minutes
            }
            let mut refs = ReferenceCache::new(&case);
            let j = run_and_judge(k.as_ref(), &case, &mut refs, &cfg);
            let kt = j
                .verdict
                .run
                .kernel_time
                .map(|t| format!("{:.1} us", t.as_secs_f64() * 1e6))
                .unwrap_or("-".into());
            println!(
                "| {what} | B={} rows={} kv={:.2} GiB | {kt} | wall {:.2} s (ref {:.2} s) | {}",
                case.shape.batch,
                case.rows(),
                case.kv_cache_bytes() as f64 / (1u64 << 30) as f64,
                j.wall.as_secs_f64(),
                refs.time.as_secs_f64(),
                j.verdict
            );
        }
        // Throughput on small mixed cases (after the JIT warm-up above).
        let n = 40;
        let small: Vec<Case> = (0..n)
            .map(|s| {
                base(
                    spread_lens(4, 2000, 0.9, 100 + s),
                    1 + (s as usize % 2),
                    100 + s,
                )
                .materialize()
            })
            .collect();
        let t = Instant::now();
        let mut ktime = 0.0;
        let mut findings = 0;
        for c in &small {
            let mut refs = ReferenceCache::new(c);
            let j = run_and_judge(k.as_ref(), c, &mut refs, &cfg);
            ktime += j
                .verdict
                .run
                .kernel_time
                .map(|t| t.as_secs_f64())
                .unwrap_or(0.0);
            findings += usize::from(!j.verdict.is_clean());
        }
        let wall = t.elapsed().as_secs_f64();
        println!(
            "| throughput: {n} cases B=4 ctx 2000±90% N=1/2 | {:.2} cases/s | mean kernel {:.1} us | {findings} with findings |",
            n as f64 / wall,
            ktime / n as f64 * 1e6
        );
    }
    Ok(())
}
