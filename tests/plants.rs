//! Every planted bug is caught, with the class its mechanism produces, on a case the
//! production kernels (`cpu:chunked`, `cpu:naive`) pass.

mod support;

use mqa_fuzz::case::{Case, ContextLens};
use mqa_fuzz::fp8::Fp8Format;
use mqa_fuzz::generate::*;
use mqa_fuzz::kernel::Plant;
use mqa_fuzz::oracle::Class;
use support::*;

/// Asserts `cpu:bug-<plant>` finds `class` on `case` and the good kernels are clean.
fn caught(plant: Plant, case: &Case, class: Class) {
    assert_clean_on_good_kernels(case);
    let name = format!("cpu:bug-{}", plant.name());
    let v = judge(&name, case);
    assert!(
        v.classes.contains_key(&class),
        "{name}: expected {class}, got {:?} (examples {:?})",
        v.classes,
        v.examples
    );
}

#[test]
fn tail_unwritten() {
    // 300 tokens: one full chunk of 256 and a partial one of 44.
    caught(
        Plant::TailUnwritten,
        &recipe(vec![300, 7], 1).materialize(),
        Class::Unwritten,
    );
}

#[test]
fn offset32_kv() {
    let mut r = recipe(vec![40, 70, 33], 1);
    r.knobs.offsets = OffsetClass::Around4G;
    r.knobs.kv_stride_pad = 1000; // padded stride: offsets are not a multiple of the block
    let case = r.materialize();
    let stride = case.kv_block_stride;
    let ids: Vec<u64> = case.kv.ids();
    assert!(
        ids.iter().any(|&id| id * stride < 1 << 32),
        "some blocks below 4 GiB"
    );
    assert!(
        ids.iter().any(|&id| id * stride >= 1 << 32),
        "some blocks past 4 GiB"
    );
    assert!(case.kv.len() < 20, "the host holds only referenced blocks");
    // Wrapped offsets read poisoned (NaN) memory.
    caught(Plant::Offset32Kv, &case, Class::Nan);
}

#[test]
fn offset32_out() {
    let mut r = recipe(vec![20, 9], 1);
    r.knobs.big_output = true;
    // Wide rows keep the number of padding rows (and the recipe's work) small.
    r.knobs.model_len_slack = (1 << 20) - 20;
    let case = r.materialize();
    assert!(
        case.output_bytes() > 1 << 31,
        "output passes 2 GiB: {}",
        case.output_bytes()
    );
    // The real sequences are the last rows, past 2 GiB.
    let last = case.rows() - 1;
    assert!(case.valid_len(last) > 0);
    assert!((last * case.out_row_stride * 4) as u64 >= 1 << 31);
    caught(Plant::Offset32Out, &case, Class::Crash);
}

#[test]
fn mask_off_by_one() {
    caught(
        Plant::MaskOffByOne,
        &recipe(vec![300, 17, 2], 2).materialize(),
        Class::Inf,
    );
}

#[test]
fn ctx2d_ignored() {
    // The bug reads context_lens[b] of the flattened [B,N] array as a 1-D length:
    // row lengths come out shorter than the per-token ones, so valid positions get -inf.
    let mut r = recipe(vec![], 2);
    r.lens = LensRecipe::PerToken(vec![vec![40, 41], vec![50, 52]]);
    caught(Plant::Ctx2dIgnored, &r.materialize(), Class::Inf);
}

#[test]
fn table_padding_read() {
    // 17 tokens in blocks of 16: the last chunk covers table entry 2, which is -1.
    for padding in [Padding::MinusOne, Padding::Huge] {
        let mut r = recipe(vec![17, 33], 1);
        r.knobs.padding = padding;
        caught(Plant::TablePaddingRead, &r.materialize(), Class::Crash);
    }
}

/// The same on a table held compact (mostly padding: each row's used entries and the
/// padding rule): the kernel reads the padding from the rule and faults all the same.
#[test]
fn table_padding_read_on_a_compact_table() {
    for padding in [Padding::MinusOne, Padding::Huge] {
        let mut r = recipe(vec![17, 33], 1);
        r.knobs.padding = padding;
        r.knobs.surplus_blocks = COMPACT_TABLE_PADDING / 2;
        let case = r.materialize();
        assert!(case.block_table.is_compact());
        caught(Plant::TablePaddingRead, &case, Class::Crash);
    }
}

#[test]
fn table_padding_read_is_harmless_with_zero_padding() {
    // Padding 0 names a real block: the read is masked and nothing shows, as on a GPU.
    let mut r = recipe(vec![17, 33], 1);
    r.knobs.padding = Padding::Zero;
    let v = judge("cpu:bug-table-padding-read", &r.materialize());
    assert!(v.is_clean(), "{:?}", v.classes);
}

#[test]
fn zero_batch() {
    let case = recipe(vec![0; 32], 1).materialize();
    assert_eq!(case.valid_elements(), 0);
    caught(Plant::ZeroBatch, &case, Class::OobWrite);
    // A batch that is not a multiple of 32 takes the normal path.
    let v = judge("cpu:bug-zero-batch", &recipe(vec![0; 31], 1).materialize());
    assert!(v.is_clean(), "{:?}", v.classes);
}

#[test]
fn fnuz_as_fn() {
    let mut r = recipe(vec![40, 9], 1);
    r.knobs.format = Fp8Format::E4m3fnuz;
    caught(Plant::FnuzAsFn, &r.materialize(), Class::Mismatch);
    // On e4m3fn data the swap is a no-op.
    let v = judge("cpu:bug-fnuz-as-fn", &recipe(vec![40, 9], 1).materialize());
    assert!(v.is_clean(), "{:?}", v.classes);
}

/// Negates every stored scale.
fn negate_scales(case: &mut Case) {
    let s = case.shape.clone();
    for block in case.kv.values_mut() {
        for p in 0..s.block_size {
            let off = s.block_size * s.head_dim + 4 * p;
            let x = f32::from_le_bytes(block[off..off + 4].try_into().unwrap());
            block[off..off + 4].copy_from_slice(&(-x).to_le_bytes());
        }
    }
}

#[test]
fn scale_before_relu() {
    let mut case = recipe(vec![40, 9], 1).materialize();
    // Positive scales: both placements agree and the bug is invisible.
    let v = judge("cpu:bug-scale-before-relu", &case);
    assert!(v.is_clean(), "{:?}", v.classes);
    negate_scales(&mut case);
    caught(Plant::ScaleBeforeRelu, &case, Class::Mismatch);
}

#[test]
fn composed_plants_each_fail_through_their_own_mechanism() {
    let name = "cpu:bug-offset32-kv+scale-before-relu";
    assert!(mqa_fuzz::kernel::is_planted_bug(name));
    assert_eq!(mqa_fuzz::kernel::open(name).unwrap().name(), name);
    // The scale bug's case (negative scales, low offsets).
    let mut case = recipe(vec![40, 9], 1).materialize();
    assert!(
        judge(name, &case).is_clean(),
        "positive scales, low offsets"
    );
    negate_scales(&mut case);
    assert!(judge(name, &case).classes.contains_key(&Class::Mismatch));
    assert!(judge("cpu:bug-offset32-kv", &case).is_clean());
    // The offset bug's case (past 4 GiB, positive scales).
    let mut r = recipe(vec![40, 70, 33], 1);
    r.knobs.offsets = OffsetClass::Around4G;
    let case = r.materialize();
    assert!(judge(name, &case).classes.contains_key(&Class::Nan));
    assert!(judge("cpu:bug-scale-before-relu", &case).is_clean());
    // A repeat or an unknown part is no kernel.
    assert!(mqa_fuzz::kernel::open("cpu:bug-offset32-kv+offset32-kv").is_err());
    assert!(mqa_fuzz::kernel::open("cpu:bug-offset32-kv+nope").is_err());
}

#[test]
fn split_boundary_drop() {
    // One sequence of 10 chunks over 8 workers: ranges of 2 chunks, the second worker
    // starts at chunk 2 of the same sequence and drops it.
    let mut r = recipe(vec![256 * 9 + 5], 1);
    r.knobs.block_size = 64;
    caught(Plant::SplitBoundaryDrop, &r.materialize(), Class::Unwritten);
}

#[test]
fn short_row_skipped() {
    // next_n = 3, context 2 < next_n: row 2 still sees positions 0 and 1.
    let case = recipe(vec![2, 40, 1], 3).materialize();
    assert_eq!(case.valid_len(2), 2);
    caught(Plant::ShortRowSkipped, &case, Class::Unwritten);
}

#[test]
fn store_past_end() {
    // ctx == max_model_len, rows padded to a larger stride: position max_model_len
    // lands in the padding.
    let mut r = recipe(vec![100, 60], 1);
    r.knobs.model_len_slack = 0;
    let case = r.materialize();
    assert_eq!(case.max_model_len, 100);
    caught(Plant::StorePastEnd, &case, Class::OobWrite);
}

#[test]
fn every_plant_has_a_test() {
    // Keep this list in step with the tests above.
    let tested = [
        "tail-unwritten",
        "offset32-kv",
        "offset32-out",
        "mask-off-by-one",
        "ctx2d-ignored",
        "table-padding-read",
        "zero-batch",
        "fnuz-as-fn",
        "scale-before-relu",
        "split-boundary-drop",
        "short-row-skipped",
        "store-past-end",
    ];
    for p in Plant::ALL {
        assert!(
            tested.contains(&p.name()),
            "planted bug {} has no test",
            p.name()
        );
    }
    let _ = ContextLens::PerSequence(vec![]);
}

#[test]
fn good_kernels_are_clean_on_hostile_values() {
    // NaN codes, 0x80 in fnuz, zero/negative/inf/NaN scales and weights: the reference
    // is undefined where they reach V(r), and reported, not judged, so the production
    // kernels must come out clean; the values are still reported as hostile statistics.
    let mut undefined = 0;
    for seed in 0..40 {
        let mut r = recipe(vec![40, 3, 70], 2);
        r.knobs.values = ValueKind::Hostile;
        r.knobs.seed = seed;
        if seed % 2 == 1 {
            r.knobs.format = Fp8Format::E4m3fnuz;
        }
        let case = r.materialize();
        assert_clean_on_good_kernels(&case);
        undefined += judge("cpu:chunked", &case).hostile.undefined;
    }
    assert!(undefined > 0, "the hostile draws reached V(r)");
}
