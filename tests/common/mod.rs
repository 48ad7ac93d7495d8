//! Helpers shared by the integration tests.
#![allow(dead_code)]

use mqa_fuzz::case::{Case, ValueLayout};
use mqa_fuzz::fp8::Fp8Format;
use mqa_fuzz::generate::*;
use mqa_fuzz::harness::{run_and_judge, ReferenceCache};
use mqa_fuzz::kernel;
use mqa_fuzz::oracle::{OracleConfig, Verdict};

/// A small, valid recipe: permuted table with -1 padding, padded strides, pipeline values.
pub fn recipe(lens: Vec<usize>, next_n: usize) -> Recipe {
    Recipe {
        next_n,
        heads: 4,
        head_dim: 32,
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

/// Runs `name` on `case` with a fresh reference.
pub fn judge(name: &str, case: &Case) -> Verdict {
    judge_cfg(name, case, &OracleConfig::default())
}

pub fn judge_cfg(name: &str, case: &Case, cfg: &OracleConfig) -> Verdict {
    let k = kernel::open(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut refs = ReferenceCache::new(case);
    run_and_judge(k.as_ref(), case, &mut refs, cfg).verdict
}

/// Asserts the production kernels are clean on `case`.
pub fn assert_clean_on_good_kernels(case: &Case) {
    case.validate().expect("case must be valid");
    for name in ["cpu:chunked", "cpu:naive"] {
        let v = judge(name, case);
        assert!(
            v.is_clean(),
            "{name} must be clean: {:?} {:?}",
            v.classes,
            v.examples
        );
        assert!(v.skipped.is_none(), "{name} skipped: {:?}", v.skipped);
    }
}
