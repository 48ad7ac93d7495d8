use mqa_fuzz::case::ValueLayout;
use mqa_fuzz::fp8::Fp8Format;
use mqa_fuzz::generate::*;
use mqa_fuzz::harness::judge_once;
use mqa_fuzz::kernel;
use mqa_fuzz::oracle::Class;

pub fn recipe(lens: Vec<usize>, next_n: usize) -> Recipe {
    Recipe {
        next_n,
        heads: 8,
        head_dim: 64,
        block_size: 16,
        layout: ValueLayout::Normal,
        format: Fp8Format::E4m3fn,
        lens: LensRecipe::PerSequence(lens),
        model_len_slack: 5,
        out_stride_pad: 3,
        big_output: false,
        table_order: TableOrder::Permuted,
        padding: Padding::MinusOne,
        surplus_blocks: 1,
        table_stride_pad: 2,
        kv_stride_pad: 8,
        offsets: OffsetClass::Low,
        values: ValueKind::Pipeline,
        seed: 7,
    }
}

#[test]
fn chunked_is_clean_and_tail_bug_is_caught() {
    let case = recipe(vec![300, 0, 17, 512], 2).materialize();
    case.validate().unwrap();
    for name in ["cpu:chunked", "cpu:naive"] {
        let k = kernel::open(name).unwrap();
        let v = judge_once(k.as_ref(), &case);
        assert!(v.is_clean(), "{name}: {v:?}");
        assert!(v.metrics.checked > 0);
    }
    let k = kernel::open("cpu:bug-tail-unwritten").unwrap();
    let v = judge_once(k.as_ref(), &case);
    assert!(v.classes.contains_key(&Class::Unwritten), "{v:?}");
}
