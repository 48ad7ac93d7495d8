//! The exact reference, checked against (1) an independent naive implementation
//! written here from the DESIGN formula — its own fp8 decode from the bit fields, exact
//! integer dot products, its own addressing — and (2) tiny cases computed by hand.

mod support;

use mqa_fuzz::case::{
    BlockTable, Case, ContextLens, ScalePlacement, Shape, SparseKvCache, ValueLayout,
};
use mqa_fuzz::fp8::Fp8Format;
use mqa_fuzz::generate::{LensRecipe, ValueKind};
use mqa_fuzz::reference::{compute, element, RowSelection};
use std::collections::BTreeMap;
use support::recipe;

// ---- the independent implementation ---------------------------------------------

/// An fp8 code as an exact integer times 2^-9 (fn) or 2^-10 (fnuz), or `None` for NaN.
/// Straight from the bit fields: sign, 4-bit exponent, 3-bit mantissa.
fn fixed_point(format: Fp8Format, code: u8) -> Option<i64> {
    let (sign, e, m) = (
        (code >> 7) as i64,
        ((code >> 3) & 15) as i64,
        (code & 7) as i64,
    );
    let nan = match format {
        Fp8Format::E4m3fn => e == 15 && m == 7,
        Fp8Format::E4m3fnuz => code == 0x80,
    };
    if nan {
        return None;
    }
    // Subnormal: m * 2^(1-bias) / 8; normal: (8+m) * 2^(e-bias) / 8. With the grid unit
    // 2^(-bias-2) both are integers: m, and (8+m) << (e-1).
    let mag = if e == 0 { m } else { (8 + m) << (e - 1) };
    Some(if sign == 1 { -mag } else { mag })
}

fn grid(format: Fp8Format) -> f64 {
    match format {
        Fp8Format::E4m3fn => 2f64.powi(-9),
        Fp8Format::E4m3fnuz => 2f64.powi(-10),
    }
}

/// `logit[r][t]` by the DESIGN formula.
fn naive_logit(c: &Case, placement: ScalePlacement, r: usize, t: usize) -> f64 {
    let s = &c.shape;
    let (n, h_, d_, bs) = (s.next_n, s.heads, s.head_dim, s.block_size);
    let (b, i) = (r / n, r % n);
    let id = c.block_table.entries[b * c.block_table.row_stride + t / bs] as u64;
    let block = c.kv.get(id).unwrap();
    let p = t % bs;
    let off = |d: usize| match s.layout {
        ValueLayout::Normal => p * d_ + d,
        ValueLayout::Shuffle16 => (p / 16) * 16 * d_ + (d / 16) * 256 + (p % 16) * 16 + d % 16,
    };
    let so = bs * d_ + 4 * p;
    let scale = f32::from_le_bytes([block[so], block[so + 1], block[so + 2], block[so + 3]]) as f64;
    let g = grid(s.format);
    let mut sum = 0f64;
    for h in 0..h_ {
        let mut dot: Option<i64> = Some(0);
        for d in 0..d_ {
            let q = c.q[((b * n + i) * h_ + h) * d_ + d];
            dot = match (
                dot,
                fixed_point(s.format, q),
                fixed_point(s.format, block[off(d)]),
            ) {
                (Some(acc), Some(x), Some(y)) => Some(acc + x * y),
                _ => None,
            };
        }
        let dot = dot.map_or(f64::NAN, |x| x as f64 * g * g);
        let w = c.weights[r * h_ + h] as f64;
        let relu = |x: f64| if x.is_nan() { f64::NAN } else { x.max(0.0) };
        sum += match placement {
            ScalePlacement::AfterReluSum => w * relu(dot),
            ScalePlacement::InsideRelu => w * relu(dot * scale),
        };
    }
    match placement {
        ScalePlacement::AfterReluSum => sum * scale,
        ScalePlacement::InsideRelu => sum,
    }
}

fn naive_valid_len(c: &Case, r: usize) -> usize {
    let n = c.shape.next_n as i64;
    match &c.context_lens {
        ContextLens::PerSequence(v) => (v[r / n as usize] - n + (r as i64 % n) + 1).max(0) as usize,
        ContextLens::PerToken(v) => v[r / n as usize][r % n as usize] as usize,
    }
}

fn same(a: f64, b: f64, mag: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= 1e-12 * mag
}

fn check_against_naive(c: &Case) -> usize {
    c.validate().unwrap();
    let mut compared = 0;
    for placement in [ScalePlacement::AfterReluSum, ScalePlacement::InsideRelu] {
        let reference = compute(c, placement, &RowSelection::All);
        for r in 0..c.rows() {
            let row = reference.rows[r].as_ref().unwrap();
            assert_eq!(row.value.len(), naive_valid_len(c, r), "row {r}");
            for (t, &v) in row.value.iter().enumerate() {
                let want = naive_logit(c, placement, r, t);
                assert!(
                    same(v, want, row.relu_mag[t]),
                    "{placement:?} row {r} t {t}: reference {v}, naive {want}"
                );
                let (e, m, a) = element(c, placement, r, t);
                assert!(same(e, want, m), "element() row {r} t {t}: {e} vs {want}");
                assert!(
                    a >= m || a.is_nan() || m.is_nan(),
                    "abs_mag {a} < relu_mag {m}"
                );
                compared += 1;
            }
        }
    }
    compared
}

#[test]
fn decode_table_matches_the_bit_fields_for_all_256_codes() {
    for f in Fp8Format::ALL {
        for code in 0..=255u8 {
            let table = f.decode(code);
            match fixed_point(f, code) {
                None => assert!(table.is_nan() && f.is_nan_code(code), "{f} {code:#04x}"),
                Some(m) => {
                    assert_eq!(table as f64, m as f64 * grid(f), "{f} {code:#04x}");
                    assert!(!f.is_nan_code(code));
                    if m == 0 && code & 0x80 != 0 {
                        assert!(table.is_sign_negative(), "fn 0x80 is -0");
                    }
                }
            }
        }
    }
}

#[test]
fn reference_matches_naive_on_generated_cases() {
    let mut total = 0;
    type Edit = Box<dyn Fn(&mut mqa_fuzz::generate::Recipe)>;
    let variants: Vec<Edit> = vec![
        Box::new(|_| {}),
        Box::new(|r| r.knobs.format = Fp8Format::E4m3fnuz),
        Box::new(|r| {
            r.layout = ValueLayout::Shuffle16;
            r.knobs.block_size = 32;
        }),
        Box::new(|r| {
            r.lens = LensRecipe::PerToken(vec![vec![5, 19, 0], vec![33, 1, 33]]);
            r.knobs.next_n = 3;
        }),
        Box::new(|r| r.knobs.values = ValueKind::Extreme),
        Box::new(|r| r.knobs.values = ValueKind::UniformCodes),
        Box::new(|r| r.knobs.values = ValueKind::ReluBoundary),
        Box::new(|r| r.knobs.values = ValueKind::AllNegative),
        Box::new(|r| {
            r.knobs.values = ValueKind::Hostile;
            r.knobs.format = Fp8Format::E4m3fnuz;
        }),
        Box::new(|r| r.knobs.values = ValueKind::Hostile),
        Box::new(|r| {
            r.knobs.block_size = 1;
            r.knobs.head_dim = 128;
        }),
    ];
    for (k, edit) in variants.iter().enumerate() {
        for seed in 0..3 {
            let mut r = recipe(vec![37, 0, 70], 2);
            r.knobs.seed = seed * 100 + k as u64;
            edit(&mut r);
            total += check_against_naive(&r.materialize());
        }
    }
    assert!(total > 1000, "compared {total}");
}

#[test]
fn negative_scales_compared_in_both_placements() {
    let mut c = recipe(vec![40], 1).materialize();
    let s = c.shape.clone();
    for block in c.kv.values_mut() {
        for p in 0..s.block_size {
            let o = s.block_size * s.head_dim + 4 * p;
            let x = -f32::from_le_bytes(block[o..o + 4].try_into().unwrap());
            block[o..o + 4].copy_from_slice(&x.to_le_bytes());
        }
    }
    check_against_naive(&c);
    let a = compute(&c, ScalePlacement::AfterReluSum, &RowSelection::All);
    let b = compute(&c, ScalePlacement::InsideRelu, &RowSelection::All);
    assert_ne!(
        a.rows[0].as_ref().unwrap().value,
        b.rows[0].as_ref().unwrap().value
    );
}

// ---- hand-computed cases -------------------------------------------------------

/// One sequence, H heads, D = 16, block size 2, physical block of logical block j is
/// 3j+1 (table padded with -1). `keys[t] = (code for every d, scale)`.
fn hand_case(
    format: Fp8Format,
    next_n: usize,
    q: Vec<u8>,
    weights: Vec<f32>,
    keys: &[(Vec<u8>, f32)],
    lens: ContextLens,
    mml: usize,
) -> Case {
    let (d, bs) = (16, 2);
    let heads = weights.len() / next_n;
    let shape = Shape {
        batch: 1,
        next_n,
        heads,
        head_dim: d,
        block_size: bs,
        layout: ValueLayout::Normal,
        format,
    };
    let nblk = keys.len().div_ceil(bs);
    let mut blocks = BTreeMap::new();
    for (t, (codes, scale)) in keys.iter().enumerate() {
        let b = blocks
            .entry(3 * (t / bs) as u64 + 1)
            .or_insert_with(|| vec![0u8; shape.block_bytes()]);
        Case::write_token(&shape, b, t % bs, codes, *scale);
    }
    let mut entries: Vec<i32> = (0..nblk).map(|j| 3 * j as i32 + 1).collect();
    entries.extend([-1, -1]);
    let case = Case {
        shape,
        num_blocks: 3 * nblk as u64 + 2,
        kv_block_stride: 2 * (16 + 4) + 12,
        context_lens: lens,
        block_table: BlockTable::whole(nblk + 1, nblk + 2, entries),
        max_model_len: mml,
        out_row_stride: mml + 1,
        q,
        weights,
        kv: SparseKvCache::stored(blocks),
    };
    case.validate().unwrap();
    case
}

/// 16 copies of a code.
fn v16(code: u8) -> Vec<u8> {
    vec![code; 16]
}

fn values(c: &Case, placement: ScalePlacement) -> Vec<Vec<f64>> {
    compute(c, placement, &RowSelection::All)
        .rows
        .into_iter()
        .map(|r| r.unwrap().value)
        .collect()
}

#[test]
fn hand_one_head() {
    // q = 1.0 (0x38) everywhere, k = 2.0 (0x40): dot = 16 * 2 = 32; w = 0.25; s = 0.5.
    // logit = 0.5 * 0.25 * 32 = 4. Token 1: k = -1.0 (0xB8), dot = -16, relu 0: logit 0.
    // Token 2: k = 0.5 (0x30) with s = 3: 3 * 0.25 * 8 = 6.
    let keys = vec![(v16(0x40), 0.5), (v16(0xB8), 0.5), (v16(0x30), 3.0)];
    let c = hand_case(
        Fp8Format::E4m3fn,
        1,
        v16(0x38),
        vec![0.25],
        &keys,
        ContextLens::PerSequence(vec![3]),
        4,
    );
    for p in [ScalePlacement::AfterReluSum, ScalePlacement::InsideRelu] {
        assert_eq!(values(&c, p), vec![vec![4.0, 0.0, 6.0]], "{p:?}");
    }
}

#[test]
fn hand_two_heads_and_negative_scale() {
    // Head 0: q = 1.0, head 1: q = -1.0 (0xB8). Key k = 2.0, dots 32 and -32.
    // Weights 0.25 and 3.0.
    let q = [v16(0x38), v16(0xB8)].concat();
    let w = vec![0.25, 3.0];
    // s = 0.5: after-relu-sum: 0.5 * (0.25*32 + 3*0) = 4; inside: 0.25*16 + 3*0 = 4.
    // s = -0.5: after: -0.5 * 8 = -4; inside: 0.25*relu(-16) + 3*relu(16) = 48.
    let keys = vec![(v16(0x40), 0.5), (v16(0x40), -0.5)];
    let c = hand_case(
        Fp8Format::E4m3fn,
        1,
        q,
        w,
        &keys,
        ContextLens::PerSequence(vec![2]),
        2,
    );
    assert_eq!(
        values(&c, ScalePlacement::AfterReluSum),
        vec![vec![4.0, -4.0]]
    );
    assert_eq!(
        values(&c, ScalePlacement::InsideRelu),
        vec![vec![4.0, 48.0]]
    );
}

#[test]
fn hand_fnuz_values() {
    // fnuz: 0x40 is 1.0 and 0x48 is 2.0 (bias 8). dot = 16 * 2 = 32, w = 1, s = 1.
    let keys = vec![(v16(0x48), 1.0)];
    let c = hand_case(
        Fp8Format::E4m3fnuz,
        1,
        v16(0x40),
        vec![1.0],
        &keys,
        ContextLens::PerSequence(vec![1]),
        1,
    );
    assert_eq!(values(&c, ScalePlacement::AfterReluSum), vec![vec![32.0]]);
    // The same codes read as e4m3fn are twice as large each: 128.
    let c = hand_case(
        Fp8Format::E4m3fn,
        1,
        v16(0x40),
        vec![1.0],
        &keys,
        ContextLens::PerSequence(vec![1]),
        1,
    );
    assert_eq!(values(&c, ScalePlacement::AfterReluSum), vec![vec![128.0]]);
}

#[test]
fn hand_smallest_subnormals_are_exact() {
    // fn subnormal 0x01 = 2^-9: dot = 16 * 2^-18 = 2^-14 exactly.
    let keys = vec![(v16(0x01), 1.0)];
    let c = hand_case(
        Fp8Format::E4m3fn,
        1,
        v16(0x01),
        vec![1.0],
        &keys,
        ContextLens::PerSequence(vec![1]),
        1,
    );
    assert_eq!(
        values(&c, ScalePlacement::AfterReluSum),
        vec![vec![2f64.powi(-14)]]
    );
}

#[test]
fn hand_nan_propagates_through_relu() {
    // Head 1's dot would be negative (relu 0), but one NaN code in its query makes
    // it NaN, and relu must keep it: max(NaN, 0) = 0 would hide it.
    let mut q1 = v16(0xB8);
    q1[5] = 0x7F;
    let q = [v16(0x38), q1].concat();
    let keys = vec![(v16(0x40), 0.5)];
    let c = hand_case(
        Fp8Format::E4m3fn,
        1,
        q,
        vec![0.25, 3.0],
        &keys,
        ContextLens::PerSequence(vec![1]),
        1,
    );
    for p in [ScalePlacement::AfterReluSum, ScalePlacement::InsideRelu] {
        assert!(values(&c, p)[0][0].is_nan(), "{p:?}");
    }
    // A zero weight does not cancel it either (0 * NaN = NaN).
    let mut q0 = v16(0x38);
    q0[0] = 0xFF;
    let c = hand_case(
        Fp8Format::E4m3fn,
        1,
        q0,
        vec![0.0],
        &keys,
        ContextLens::PerSequence(vec![1]),
        1,
    );
    assert!(values(&c, ScalePlacement::AfterReluSum)[0][0].is_nan());
    // fnuz NaN is 0x80 in the key.
    let mut k = v16(0x40);
    k[15] = 0x80;
    let c = hand_case(
        Fp8Format::E4m3fnuz,
        1,
        v16(0x40),
        vec![1.0],
        &[(k, 1.0)],
        ContextLens::PerSequence(vec![1]),
        1,
    );
    assert!(values(&c, ScalePlacement::InsideRelu)[0][0].is_nan());
    // A NaN scale: NaN too.
    let c = hand_case(
        Fp8Format::E4m3fn,
        1,
        v16(0x38),
        vec![1.0],
        &[(v16(0x40), f32::NAN)],
        ContextLens::PerSequence(vec![1]),
        1,
    );
    assert!(values(&c, ScalePlacement::AfterReluSum)[0][0].is_nan());
}

#[test]
fn hand_valid_sets_1d_and_2d() {
    // next_n = 2, ctx = 3: row 0 sees t <= 3-2+0 = 1, row 1 sees t <= 2.
    // Keys: token t has k = 1.0 and scale t+1, q = 1.0, w = 1: logit = 16 (t+1).
    let keys: Vec<(Vec<u8>, f32)> = (0..5).map(|t| (v16(0x38), (t + 1) as f32)).collect();
    let q = [v16(0x38), v16(0x38)].concat();
    let c = hand_case(
        Fp8Format::E4m3fn,
        2,
        q.clone(),
        vec![1.0, 1.0],
        &keys,
        ContextLens::PerSequence(vec![3]),
        5,
    );
    assert_eq!(
        values(&c, ScalePlacement::AfterReluSum),
        vec![vec![16.0, 32.0], vec![16.0, 32.0, 48.0]]
    );
    // ctx = 1 < next_n = 2: row 0 sees nothing, row 1 sees token 0.
    let c = hand_case(
        Fp8Format::E4m3fn,
        2,
        q.clone(),
        vec![1.0, 1.0],
        &keys[..1],
        ContextLens::PerSequence(vec![1]),
        5,
    );
    assert_eq!(
        values(&c, ScalePlacement::AfterReluSum),
        vec![vec![], vec![16.0]]
    );
    // 2-D: lengths per token, not causal.
    let c = hand_case(
        Fp8Format::E4m3fn,
        2,
        q,
        vec![1.0, 1.0],
        &keys,
        ContextLens::PerToken(vec![vec![5, 2]]),
        5,
    );
    assert_eq!(
        values(&c, ScalePlacement::AfterReluSum),
        vec![vec![16.0, 32.0, 48.0, 64.0, 80.0], vec![16.0, 32.0]]
    );
}

#[test]
fn shuffle16_offsets_by_hand() {
    let l = ValueLayout::Shuffle16;
    // D = 32: token 0 dims 0..16 at 0..16; dims 16..32 at 256..272; token 1 dim 0 at 16.
    assert_eq!(l.value_offset(32, 0, 15), 15);
    assert_eq!(l.value_offset(32, 0, 16), 256);
    assert_eq!(l.value_offset(32, 1, 0), 16);
    assert_eq!(l.value_offset(32, 1, 17), 256 + 16 + 1);
    assert_eq!(l.value_offset(32, 15, 31), 256 + 15 * 16 + 15);
    // Token 16 starts the second 16-token tile: 16 * D.
    assert_eq!(l.value_offset(32, 16, 0), 512);
    // A bijection onto 0..bs*D.
    let mut seen = vec![false; 32 * 64];
    for p in 0..32 {
        for d in 0..64 {
            let o = l.value_offset(64, p, d);
            assert!(!seen[o]);
            seen[o] = true;
        }
    }
    assert!(seen.iter().all(|&x| x));
}
