//! Helpers shared by the integration tests.
#![allow(dead_code)]

use mqa_fuzz::case::Case;
use mqa_fuzz::generate::*;
use mqa_fuzz::harness::{run_and_judge, ReferenceCache};
use mqa_fuzz::kernel;
use mqa_fuzz::oracle::{OracleConfig, Verdict};

/// A small, valid recipe: permuted table with -1 padding, padded strides, pipeline values.
pub fn recipe(lens: Vec<usize>, next_n: usize) -> Recipe {
    Recipe {
        heads: 4,
        head_dim: 32,
        ..Recipe::small(lens, next_n, 7)
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
