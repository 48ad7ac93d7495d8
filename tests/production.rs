//! `--profile production` is an engine: its cases have a serving engine's geometry
//! (multi-GiB churned pools with slab strides, decode batches up to 512, 1M-column
//! workspaces) and nothing an engine would not produce; the bugs that made engines add
//! the `nan_to_num_` guard are found by it.

use mqa_fuzz::campaign::{case_seed, value_tree};
use mqa_fuzz::case::{Case, ContextLens, ValueLayout};
use mqa_fuzz::fp8::Fp8Format;
use mqa_fuzz::generate::engine::{EngineDraw, MODELS};
use mqa_fuzz::generate::strategy::{draw_strategy_scaled, Draw};
use mqa_fuzz::generate::{LensRecipe, OffsetClass, Padding, Profile, Recipe, ValueKind};
use mqa_fuzz::kernel::{self, BlockSizes, Capabilities};
use proptest::strategy::ValueTree;
use std::path::PathBuf;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_mqa-fuzz");

fn draw(k: u64, scale: f64) -> Draw {
    value_tree(
        &draw_strategy_scaled(Profile::Production, k, scale),
        case_seed(42, k),
    )
    .current()
}

fn resolved(k: u64, caps: &Capabilities, scale: f64) -> (Draw, Recipe, Case) {
    let d = draw(k, scale);
    let (r, _) = d.resolve(&[caps]);
    let c = r.materialize();
    (d, r, c)
}

fn cpu_caps() -> Capabilities {
    kernel::open("cpu:chunked").unwrap().capabilities().clone()
}

/// What the DeepGEMM adapter declares on an H200 (SM90: block 64, next_n 1-2, 2-D
/// lengths only, e4m3fn, a share of the device memory).
fn deepgemm_caps() -> Capabilities {
    Capabilities {
        formats: vec![Fp8Format::E4m3fn],
        layouts: vec![ValueLayout::Normal],
        block_sizes: BlockSizes::List(vec![64]),
        next_n: (1, 2),
        heads: Some(vec![32, 64]),
        head_dims: Some(vec![32, 64, 128]),
        lens_1d: false,
        lens_2d: true,
        hostile_values: false,
        max_kv_bytes: Some(80 << 30),
        kv_stride_align: Some(16),
        ..cpu_caps()
    }
}

/// A kernel whose KV block stride must be a multiple of 16 bytes (DeepGEMM's TMA
/// descriptors) gets padded strides padded up to one, counted as adjusted, instead of
/// cases it would skip: on DeepGEMM a fifth of `--profile all`'s cases were such skips.
#[test]
fn a_kernel_that_needs_aligned_strides_gets_padded_strides_padded_up() {
    let caps = deepgemm_caps();
    let (mut padded, mut adjusted) = (0, 0);
    for k in 0..200 {
        let d = value_tree(
            &draw_strategy_scaled(Profile::All, k, 1.0 / 64.0),
            case_seed(7, k),
        )
        .current();
        let (r, adjust) = d.resolve(&[&caps]);
        let c = r.materialize();
        assert_eq!(
            c.kv_block_stride % 16,
            0,
            "case {k}: stride {}",
            c.kv_block_stride
        );
        assert!(
            caps.rejects(&c).is_none(),
            "case {k}: {:?}",
            caps.rejects(&c)
        );
        let pad = c.kv_block_stride - c.shape.block_bytes() as u64;
        padded += usize::from(pad > 0);
        if adjust.iter().any(|a| a.starts_with("kv block stride")) {
            adjusted += 1;
            assert!(pad >= d.knobs.kv_stride_pad, "case {k}: padded down");
        }
    }
    assert!(
        adjusted > 0 && padded >= adjusted,
        "{adjusted} adjusted, {padded} padded"
    );
    // Without the alignment, the same draws give strides DeepGEMM cannot take.
    let any_stride = Capabilities {
        kv_stride_align: None,
        ..caps
    };
    let unaligned = (0..200)
        .filter(|&k| {
            let d = value_tree(
                &draw_strategy_scaled(Profile::All, k, 1.0 / 64.0),
                case_seed(7, k),
            )
            .current();
            !d.resolve(&[&any_stride])
                .0
                .materialize()
                .kv_block_stride
                .is_multiple_of(16)
        })
        .count();
    assert!(unaligned > 0);
}

/// An engine's pool has its own stride (a per-layer tensor's tight `bs * (D + 4)`, or a
/// slab's): a kernel that needs 16-byte aligned strides gets it padded up, counted as
/// adjusted only where it moved (block size 1 makes every tight stride unaligned).
#[test]
fn an_engine_pool_stride_is_padded_up_to_the_kernels_alignment() {
    let bs1 = |align| Capabilities {
        block_sizes: BlockSizes::List(vec![1]),
        kv_stride_align: align,
        max_kv_bytes: Some(1 << 30),
        ..cpu_caps()
    };
    let (aligned, any) = (bs1(Some(16)), bs1(None));
    let (mut moved, mut counted) = (0, 0);
    for k in 0..40 {
        let d = draw(k, 1.0 / 64.0);
        let (r, adjust) = d.resolve(&[&aligned]);
        let c = r.materialize();
        assert_eq!(c.kv_block_stride % 16, 0, "case {k}");
        assert!(aligned.rejects(&c).is_none(), "case {k}");
        let before = d.resolve(&[&any]).0.materialize().kv_block_stride;
        let was_moved = before != c.kv_block_stride;
        let was_counted = adjust.iter().any(|a| a == "kv block stride (unaligned)");
        assert_eq!(
            was_moved, was_counted,
            "case {k}: {before} -> {}",
            c.kv_block_stride
        );
        moved += usize::from(was_moved);
        counted += usize::from(was_counted);
    }
    assert!(moved > 0 && counted == moved, "{moved} moved");
}

fn top_offset(c: &Case) -> u64 {
    c.max_kv_offset()
}

fn engine(d: &Draw) -> &EngineDraw {
    d.engine
        .as_ref()
        .expect("production draws carry the engine model")
}

/// Every production case is one an engine produces: the indexer's shape, pipeline
/// values, valid tables, trailing zero-length requests only, lengths of the engine's
/// form, within max_model_len, in a pool no larger than its budget.
#[test]
fn production_cases_are_what_an_engine_feeds() {
    let caps = cpu_caps();
    for k in 0..60 {
        let (d, r, c) = resolved(k, &caps, 1.0 / 64.0);
        let e = engine(&d);
        c.validate().unwrap_or_else(|err| panic!("case {k}: {err}"));
        assert_eq!((c.shape.heads, c.shape.head_dim), (64, 128));
        assert_eq!(r.knobs.values, ValueKind::Pipeline);
        assert!(matches!(r.knobs.padding, Padding::Zero | Padding::Stale));
        let OffsetClass::Pool(pool) = r.knobs.offsets else {
            panic!("case {k}: not a pool recipe")
        };
        assert_eq!(c.num_blocks, pool.blocks);
        assert!(
            pool.blocks * pool.stride <= e.budget_bytes,
            "case {k}: pool over budget"
        );
        assert!(c.kv_block_stride >= c.shape.block_bytes() as u64);
        assert_eq!(c.kv_block_stride % 4, 0);
        assert!(MODELS.iter().any(|m| m.max_model_len >= c.max_model_len));
        assert_eq!(
            c.max_model_len, e.max_model_len,
            "case {k}: the model's output width"
        );
        // Table entries are block ids of the pool (0 is the null block).
        assert!(c
            .block_table
            .whole_entries()
            .iter()
            .all(|&id| id >= 0 && (id as u64) < c.num_blocks));
        // Zero-length requests only at the end (CUDA-graph padding) or everywhere (dummy).
        let seq: Vec<usize> = (0..c.shape.batch).map(|b| c.seq_tokens(b)).collect();
        let live = seq.iter().take_while(|&&t| t > 0).count();
        assert!(
            seq[live..].iter().all(|&t| t == 0),
            "case {k}: zero in the middle: {seq:?}"
        );
        let n = c.shape.next_n;
        match &c.context_lens {
            ContextLens::PerToken(v) => {
                for row in v {
                    let l = *row.last().unwrap();
                    let want: Vec<i64> = (0..n as i64)
                        .map(|i| (l - n as i64 + 1 + i).max(0))
                        .collect();
                    assert_eq!(row, &want, "case {k}: per-token lengths not [L-N+1 … L]");
                }
            }
            ContextLens::PerSequence(v) => assert!(v.iter().all(|&l| l == 0 || l as usize >= n)),
        }
        assert!(seq.iter().all(|&t| t <= c.max_model_len));
    }
}

/// The geometry where the guard's bug lived is ordinary in production: byte offsets past
/// 2^31 and 2^32, batches past 256 requests, outputs past 2 GiB, requests at the cap.
#[test]
fn production_reaches_big_offsets_big_batches_and_wide_workspaces() {
    let caps = cpu_caps();
    let (mut past_2g, mut past_4g, mut big_out, mut big_batch, mut capped, mut dummy) =
        (0, 0, 0, 0, 0, 0);
    let n = 200;
    for k in 0..n {
        let (d, _, c) = resolved(k, &caps, 1.0 / 256.0);
        past_2g += (top_offset(&c) >= 1 << 31) as u32;
        past_4g += (top_offset(&c) >= 1 << 32) as u32;
        big_out += (c.output_bytes() > 1 << 31) as u32;
        big_batch += (c.shape.batch > 256) as u32;
        capped += engine(&d).capped.is_some() as u32;
        dummy += (0..c.shape.batch).all(|b| c.seq_tokens(b) == 0) as u32;
    }
    assert!(past_4g > n as u32 / 4, "past 4 GiB in {past_4g}/{n}");
    assert!(past_2g >= past_4g);
    assert!(big_out > 0, "no output past 2 GiB in {n} cases");
    assert!(big_batch > 0, "no batch past 256 in {n} cases");
    assert!(capped > 0 && dummy > 0, "capped {capped}, dummy {dummy}");
}

/// `--scale` shrinks the context lengths and nothing else: the same draw at two scales
/// has the same pool, strides, batch and workspace (recipes compared: a full-size case
/// holds millions of tokens).
#[test]
fn scale_shrinks_contexts_only() {
    let caps = cpu_caps();
    let longest = |r: &Recipe| match &r.lens {
        LensRecipe::PerSequence(v) => v.iter().copied().max().unwrap_or(0),
        LensRecipe::PerToken(v) => v.iter().flatten().copied().max().unwrap_or(0),
    };
    let tokens = |r: &Recipe| match &r.lens {
        LensRecipe::PerSequence(v) => v.iter().sum::<usize>(),
        LensRecipe::PerToken(v) => v.iter().map(|r| r.iter().max().unwrap_or(&0)).sum(),
    };
    let mut shrunk = 0;
    for k in 0..60 {
        let (r1, _) = draw(k, 1.0).resolve(&[&caps]);
        let (r64, _) = draw(k, 1.0 / 64.0).resolve(&[&caps]);
        assert_eq!(r1.knobs.offsets, r64.knobs.offsets, "case {k}: same pool");
        assert_eq!(r1.batch(), r64.batch(), "case {k}: same batch");
        assert_eq!(
            (r1.knobs.next_n, r1.knobs.block_size, r1.layout),
            (r64.knobs.next_n, r64.knobs.block_size, r64.layout)
        );
        assert_eq!(
            longest(&r1) + r1.knobs.model_len_slack,
            longest(&r64) + r64.knobs.model_len_slack,
            "case {k}: same max_model_len (workspace)"
        );
        assert!(tokens(&r64) <= tokens(&r1));
        shrunk += (tokens(&r64) * 8 < tokens(&r1)) as u32;
    }
    assert!(shrunk > 30, "only {shrunk} of 60 cases shrank");
}

/// Against DeepGEMM's capabilities the engine flattens MTP past next_n 2 into one row
/// per token (sharing the request's blocks) instead of dropping it, and sizes its pool
/// from the memory the adapter declares.
#[test]
fn a_kernel_with_fewer_next_n_gets_flattened_mtp_and_a_pool_within_its_memory() {
    let caps = deepgemm_caps();
    let mut flattened = 0;
    for k in 0..80 {
        let (d, r, c) = resolved(k, &caps, 1.0 / 64.0);
        assert!(
            caps.rejects(&c).is_none(),
            "case {k}: {:?}",
            caps.rejects(&c)
        );
        assert!(c.kv_cache_bytes() <= 80 << 30);
        let OffsetClass::Pool(pool) = r.knobs.offsets else {
            panic!()
        };
        if d.knobs.next_n > 2 {
            flattened += 1;
            assert_eq!(pool.rows_per_request as usize, d.knobs.next_n);
            assert_eq!(c.shape.next_n, 1);
            // The rows of one request read the same blocks.
            let g = d.knobs.next_n;
            let row = |b: usize| -> Vec<i64> {
                (0..c.blocks_used(b))
                    .map(|j| c.block_table.get(b, j))
                    .collect()
            };
            for b in (0..c.shape.batch).step_by(g) {
                let last = b + g - 1;
                assert!(
                    row(last).starts_with(&row(b)),
                    "case {k}: request rows differ"
                );
            }
        }
    }
    assert!(flattened > 0);
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mqa-fuzz-prod-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn run(args: &[&str], name: &str) -> (i32, String, String) {
    let d = tmp(name);
    let out = Command::new(BIN)
        .args(args)
        .args(["--corpus", d.join("corpus").to_str().unwrap()])
        .args(["--report", d.join("report").to_str().unwrap()])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&d);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The headline bug: a 32-bit `block_id * kv_block_stride` passes the production
/// profile no more (it answered "guard redundant on 3,216/3,216" before).
#[test]
fn production_finds_the_32_bit_kv_offset_bug_and_names_the_population() {
    let (code, out, err) = run(
        &[
            "run",
            "--kernel",
            "cpu:bug-offset32-kv",
            "--profile",
            "production",
            "--cases",
            "6",
            "--seed",
            "5",
            "--no-shrink",
            "-q",
        ],
        "kv",
    );
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(out.contains("guard NEEDED on"), "{out}");
    let (code, out, err) = run(
        &[
            "run",
            "--kernel",
            "cpu:chunked",
            "--profile",
            "production",
            "--cases",
            "6",
            "--seed",
            "5",
            "-q",
        ],
        "clean",
    );
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("production-profile cases (pool ") && out.contains("contexts at 1/64"),
        "the verdict names its population: {out}"
    );
}

/// Pool blocks and stride, block size, format and next_n.
type Server = (u64, u64, u64, String, u64);

/// Each generated case's server as `cases.jsonl` records it, in case order: pool
/// blocks and stride, block size, format and next_n, and the batch (requests).
fn servers(args: &[&str], name: &str) -> Vec<(Server, usize)> {
    let d = tmp(name);
    let out = Command::new(BIN)
        .args(["run", "--kernel", "cpu:chunked", "--profile", "production"])
        .args(["--seed", "7", "--no-replay", "--no-shrink", "-q"])
        .args(args)
        .args(["--corpus", d.join("corpus").to_str().unwrap()])
        .args(["--report", d.join("report").to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = std::fs::read_to_string(d.join("report/cases.jsonl")).unwrap();
    let _ = std::fs::remove_dir_all(&d);
    let mut cases: Vec<(u64, _)> = log
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let r = &v["recipe"];
            let pool = &r["offsets"]["pool"];
            let u = |x: &serde_json::Value| x.as_u64().unwrap();
            let server = (
                u(&pool["blocks"]),
                u(&pool["stride"]),
                u(&r["block_size"]),
                r["format"].as_str().unwrap().to_string(),
                u(&r["next_n"]),
            );
            let lens = r["lens"].as_object().unwrap().values().next().unwrap();
            (u(&v["k"]), (server, lens.as_array().unwrap().len()))
        })
        .collect();
    cases.sort_by_key(|c| c.0);
    cases.into_iter().map(|(_, c)| c).collect()
}

/// Production cases come in deployments: consecutive cases share one server's pool,
/// block size, format and MTP depth (a GPU worker maps and poisons the pool once for
/// all of them) while their batches vary; the next deployment is another server, and
/// `--deployment-epoch 1` gives every case its own.
#[test]
fn production_cases_share_a_server_for_a_deployment() {
    let pinned = servers(&["--cases", "8", "--deployment-epoch", "4"], "dep4");
    assert_eq!(pinned.len(), 8);
    for epoch in pinned.chunks(4) {
        assert!(
            epoch.iter().all(|c| c.0 == epoch[0].0),
            "one server per deployment: {epoch:?}"
        );
        assert!(
            epoch.iter().any(|c| c.1 != epoch[0].1),
            "batches vary within a deployment: {epoch:?}"
        );
    }
    assert_ne!(pinned[0].0, pinned[4].0, "deployments differ: {pinned:?}");
    let free = servers(&["--cases", "4", "--deployment-epoch", "1"], "dep1");
    assert!(
        free.iter().any(|c| c.0 != free[0].0),
        "--deployment-epoch 1: a server per case: {free:?}"
    );
}

#[test]
fn bad_scales_are_usage_errors() {
    for bad in ["0", "-1", "2", "1/0", "x"] {
        let (code, _, err) = run(
            &[
                "run",
                "--profile",
                "production",
                "--cases",
                "1",
                "--scale",
                bad,
            ],
            "bad",
        );
        assert_eq!(code, 2, "--scale {bad}: {err}");
        assert!(err.contains("scale"), "{err}");
    }
}
