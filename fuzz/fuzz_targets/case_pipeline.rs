//! Cases built by the fuzzer (bounded sizes, any values, any table) pushed through
//! validation, the reference and the oracle, and generated cases from the proptest
//! strategies under fuzzer-chosen seeds. Invariants:
//! - nothing panics; a case either validates or is refused with a field;
//! - |V(r)| follows DESIGN §1 (1-D: max(0, ctx-N+i+1); 2-D: max(0, ctx2[b][i]));
//! - the reference is finite on production-domain cases (no NaN codes, finite weights
//!   and scales);
//! - the oracle never calls the reference's own output (rounded to f32) a finding, and
//!   the clean cpu:chunked kernel has no finding, when every value fits in f32.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use mqa_fuzz::case::{BlockTable, Case, ContextLens, Shape, SparseKvCache, ValueLayout};
use mqa_fuzz::fp8::Fp8Format;
use mqa_fuzz::kernel::{self, OutputBuffer, RunInfo};
use mqa_fuzz::oracle::{self, OracleConfig};
use mqa_fuzz::reference::{self, RowSelection};

#[derive(Arbitrary, Debug)]
struct RawCase {
    batch: u8,
    next_n: u8,
    heads: u8,
    head_dim: u8,
    block_size: u8,
    shuffle16: bool,
    fnuz: bool,
    lens_2d: bool,
    lens: Vec<i16>,
    table: Vec<i16>,
    extra_blocks: u8,
    table_stride_pad: u8,
    num_blocks_extra: u16,
    kv_stride_pad: u8,
    model_len_slack: u8,
    out_stride_pad: u8,
    q: Vec<u8>,
    weights: Vec<f32>,
    kv: Vec<u8>,
    scales: Vec<f32>,
    /// Store one block more or fewer than the table references.
    store_fault: u8,
}

#[derive(Arbitrary, Debug)]
enum Input {
    Raw(RawCase),
    Generated { production: bool, seed: u64 },
}

fn cycle<T: Copy>(v: &[T], i: usize, default: T) -> T {
    if v.is_empty() {
        default
    } else {
        v[i % v.len()]
    }
}

fn build(r: &RawCase) -> Case {
    let batch = 1 + r.batch as usize % 4;
    let next_n = 1 + r.next_n as usize % 4;
    let heads = 1 + r.heads as usize % 4;
    let head_dim = [16, 32, 64, 48][r.head_dim as usize % 4];
    let block_size = [1, 2, 16, 3][r.block_size as usize % 4];
    let layout = if r.shuffle16 {
        ValueLayout::Shuffle16
    } else {
        ValueLayout::Normal
    };
    let format = if r.fnuz {
        Fp8Format::E4m3fnuz
    } else {
        Fp8Format::E4m3fn
    };
    let shape = Shape {
        batch,
        next_n,
        heads,
        head_dim,
        block_size,
        layout,
        format,
    };
    // Lengths mostly small and non-negative; a negative or huge one must be refused.
    let len = |i: usize| -> i64 {
        let x = cycle(&r.lens, i, 0) as i64;
        if x.abs() < 200 {
            x.abs() % 40
        } else {
            x
        }
    };
    let context_lens = if r.lens_2d {
        ContextLens::PerToken(
            (0..batch)
                .map(|b| (0..next_n).map(|i| len(b * next_n + i)).collect())
                .collect(),
        )
    } else {
        ContextLens::PerSequence((0..batch).map(len).collect())
    };
    let longest = match &context_lens {
        ContextLens::PerSequence(v) => v.iter().copied().max().unwrap_or(0),
        ContextLens::PerToken(v) => v.iter().flatten().copied().max().unwrap_or(0),
    }
    .clamp(0, 1 << 20) as usize;
    let max_blocks = longest.div_ceil(block_size) + r.extra_blocks as usize % 3;
    let row_stride = max_blocks + r.table_stride_pad as usize % 3;
    let entries: Vec<i32> = (0..batch * row_stride)
        .map(|i| cycle(&r.table, i, i as i16) as i32)
        .collect();
    let referenced = entries
        .iter()
        .copied()
        .filter(|&e| e >= 0)
        .max()
        .unwrap_or(0) as u64;
    let num_blocks = referenced + 1 + r.num_blocks_extra as u64 % 4;
    let bb = block_size * (head_dim + 4);
    let kv_block_stride =
        bb as u64 + 4 * (r.kv_stride_pad as u64 % 4) + (r.kv_stride_pad as u64 >> 7);
    let max_model_len = longest.max(1) + r.model_len_slack as usize % 5;
    let out_row_stride = max_model_len + r.out_stride_pad as usize % 3;
    let rows = batch * next_n;
    let q = (0..rows * heads * head_dim)
        .map(|i| cycle(&r.q, i, 0x38))
        .collect();
    let weights = (0..rows * heads)
        .map(|i| cycle(&r.weights, i, 1.0))
        .collect();
    let mut case = Case {
        shape,
        num_blocks,
        kv_block_stride,
        context_lens,
        block_table: BlockTable::whole(max_blocks, row_stride, entries),
        max_model_len,
        out_row_stride,
        q,
        weights,
        kv: SparseKvCache::default(),
    };
    // Store exactly the blocks the used table entries reference (then maybe one fault).
    let mut ids = std::collections::BTreeSet::new();
    if longest <= 4096 {
        for b in 0..batch {
            for j in 0..case.blocks_used(b).min(max_blocks) {
                let e = case.block_table.get(b, j);
                if e >= 0 {
                    ids.insert(e as u64);
                }
            }
        }
    }
    match r.store_fault % 8 {
        0 => {
            ids.pop_first();
        }
        1 => {
            ids.insert(num_blocks + 1);
        }
        _ => {}
    }
    let mut n = 0usize;
    for id in ids {
        let mut block: Vec<u8> = (0..block_size * head_dim)
            .map(|_| {
                n += 1;
                cycle(&r.kv, n, 0x38)
            })
            .collect();
        for _ in 0..block_size {
            n += 1;
            block.extend_from_slice(&cycle(&r.scales, n, 1.0).to_le_bytes());
        }
        case.kv.insert(id, block);
    }
    case
}

/// |V(r)| by DESIGN §1, computed without the library's helpers.
fn design_valid_len(case: &Case, r: usize) -> i128 {
    let n = case.shape.next_n;
    let (b, i) = (r / n, r % n);
    match &case.context_lens {
        ContextLens::PerSequence(c) => (c[b] as i128 - n as i128 + i as i128 + 1).max(0),
        ContextLens::PerToken(c) => (c[b][i] as i128).max(0),
    }
}

fn production_domain(case: &Case) -> bool {
    let f = case.shape.format;
    let s = &case.shape;
    case.q.iter().all(|&c| !f.is_nan_code(c))
        && case.weights.iter().all(|w| w.is_finite())
        && case.kv.iter().all(|(_, blk)| {
            blk[..s.block_size * s.head_dim]
                .iter()
                .all(|&c| !f.is_nan_code(c))
                && (0..s.block_size).all(|p| case.k_scale(blk, p).is_finite())
        })
}

fn check(case: &Case) {
    if case.validate().is_err() {
        return;
    }
    if case.output_bytes() > 64 << 20 {
        return; // big-output axis: valid, but too slow for a fuzz iteration
    }
    // Keep an iteration in milliseconds: the reference and the kernel are O(work).
    let work: usize = (0..case.rows())
        .map(|r| case.valid_len(r) * case.shape.heads * case.shape.head_dim)
        .sum();
    if work > 1 << 21 {
        return;
    }
    for r in 0..case.rows() {
        assert_eq!(
            case.valid_len(r) as i128,
            design_valid_len(case, r),
            "valid set of row {r}"
        );
    }
    let chunked = kernel::open("cpu:chunked").expect("cpu:chunked exists");
    let caps = chunked.capabilities().clone();
    let reference = reference::compute(case, caps.scale_placement, &RowSelection::All);
    let production = production_domain(case);
    let mut fits = true;
    for (r, row) in reference.rows.iter().enumerate() {
        let row = row.as_ref().expect("all rows selected");
        assert_eq!(
            row.value.len(),
            case.valid_len(r),
            "reference row {r} length"
        );
        for (t, &v) in row.value.iter().enumerate() {
            if production {
                assert!(
                    v.is_finite(),
                    "reference not finite at row {r} position {t}: {v}"
                );
            }
            // Leave headroom: the bound itself is computed from magnitudes near v.
            fits &= v.is_finite() && row.relu_mag[t].is_finite() && row.relu_mag[t] < 1e37;
        }
    }
    if !(production && fits) {
        return;
    }
    // The reference's own output, rounded to f32, is never a finding.
    let mut out = OutputBuffer::for_case(case);
    for (r, row) in reference.rows.iter().enumerate() {
        let row = row.as_ref().unwrap();
        for t in 0..case.max_model_len {
            let v = row
                .value
                .get(t)
                .map(|&v| v as f32)
                .unwrap_or(f32::NEG_INFINITY);
            out.set(r, t, v);
        }
    }
    let info = RunInfo {
        kernel_time: None,
        inputs_intact: Some(true),
        device_bytes: None,
        queue_wait: None,
        phases: Default::default(),
    };
    let cfg = OracleConfig::default();
    let v = oracle::judge(case, &reference, &caps, Ok((&info, &out)), &cfg);
    assert!(
        v.is_clean(),
        "reference output judged a finding: {:?}",
        v.classes
    );
    // The clean production-style CPU kernel passes too.
    if caps.rejects(case).is_none() {
        let mut out = OutputBuffer::for_case(case);
        let info = chunked.run(case, &mut out).expect("cpu:chunked runs");
        let v = oracle::judge(case, &reference, &caps, Ok((&info, &out)), &cfg);
        assert!(
            v.is_clean(),
            "cpu:chunked judged a finding: {:?}",
            v.classes
        );
    }
}

fuzz_target!(|input: Input| {
    match input {
        Input::Raw(r) => check(&build(&r)),
        Input::Generated { production, seed } => {
            use mqa_fuzz::generate::strategy::draw_strategy_scaled;
            use mqa_fuzz::generate::Profile;
            let profile = if production {
                Profile::Production
            } else {
                Profile::Layout
            };
            // Engine-sized production cases at the smallest context scale: the pools,
            // ids and tables of an engine, few tokens.
            let strategy = draw_strategy_scaled(profile, 0, 1.0 / 256.0);
            let draw = mqa_fuzz::campaign::value_tree(&strategy, seed).current();
            let chunked = kernel::open("cpu:chunked").unwrap();
            let (recipe, _) = draw.resolve(&[chunked.capabilities()]);
            if recipe.knobs.big_output {
                return; // 2 GiB output: the campaign covers it, too slow here
            }
            let case = recipe.materialize();
            case.validate().expect("generated cases validate");
            if case.output_bytes() > 256 << 20 {
                return; // an engine's GiB workspace: the campaign covers it, too big here
            }
            check(&case);
        }
    }
});
