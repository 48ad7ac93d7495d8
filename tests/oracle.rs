//! The oracle: every class is produced by a deliberately wrong output and detected;
//! the guard verdict and the downstream top-k check.

mod support;

use mqa_fuzz::case::{Case, ScalePlacement};
use mqa_fuzz::harness::{run_and_judge, ReferenceCache};
use mqa_fuzz::kernel::{
    self, Capabilities, OutputBuffer, OutsideContract, RunError, RunInfo, POISON_BITS,
};
use mqa_fuzz::oracle::{judge, Class, ErrorBound, OracleConfig, Verdict};
use mqa_fuzz::reference::{self, Reference, RowSelection};
use support::*;

struct Fixture {
    case: Case,
    reference: Reference,
    caps: Capabilities,
    out: OutputBuffer,
}

/// A case, its reference, and cpu:chunked's (correct) output for it.
fn fixture(case: Case) -> Fixture {
    let k = kernel::open("cpu:chunked").unwrap();
    let mut refs = ReferenceCache::new(&case);
    let judged = run_and_judge(k.as_ref(), &case, &mut refs, &OracleConfig::default());
    assert!(judged.verdict.is_clean(), "{:?}", judged.verdict.classes);
    let reference = reference::compute(&case, ScalePlacement::AfterReluSum, &RowSelection::All);
    Fixture {
        caps: k.capabilities().clone(),
        out: judged.output.unwrap(),
        case,
        reference,
    }
}

fn small() -> Fixture {
    fixture(recipe(vec![300, 0, 17, 64], 2).materialize())
}

impl Fixture {
    fn judge(&self) -> Verdict {
        self.judge_cfg(&OracleConfig::default())
    }
    fn judge_cfg(&self, cfg: &OracleConfig) -> Verdict {
        let info = RunInfo {
            inputs_intact: Some(true),
            ..Default::default()
        };
        judge(
            &self.case,
            &self.reference,
            &self.caps,
            Ok((&info, &self.out)),
            cfg,
        )
    }
    fn exact(&self, r: usize, t: usize) -> f64 {
        self.reference.rows[r].as_ref().unwrap().value[t]
    }
    /// The full per-element bound of (r, t).
    fn bound(&self, r: usize, t: usize) -> f64 {
        let b = ErrorBound::for_kernel(self.caps.accumulation, &self.case.shape);
        let (_, m, a) = reference::element(&self.case, self.reference.placement, r, t);
        b.full(m, a)
    }
    /// Fills V(r) with the rounded reference and every other column with -inf.
    fn clean_logits(&mut self) {
        for r in 0..self.case.rows() {
            let len = self.case.valid_len(r);
            for t in 0..self.case.max_model_len {
                let v = if t < len {
                    self.exact(r, t) as f32
                } else {
                    f32::NEG_INFINITY
                };
                self.out.set(r, t, v);
            }
        }
    }
}

fn only(v: &Verdict, class: Class, n: u64) {
    assert_eq!(
        v.classes.get(&class),
        Some(&n),
        "expected {n} x {class}: {:?} {:?}",
        v.classes,
        v.examples
    );
    assert_eq!(v.classes.len(), 1, "only {class} expected: {:?}", v.classes);
}

#[test]
fn chunked_output_is_within_bounds() {
    let f = small();
    let v = f.judge();
    assert!(v.is_clean());
    assert_eq!(v.metrics.checked, f.case.valid_elements());
    assert!(v.metrics.max_err_over_bound <= 1.0);
    assert!(
        v.metrics.calc_diff.abs() < 1e-6,
        "calc_diff {}",
        v.metrics.calc_diff
    );
    assert!(v.guard.redundant);
}

#[test]
fn mismatch_beyond_bound_and_ok_within() {
    let mut f = small();
    let (r, t) = (0, 123);
    let (exp, b) = (f.exact(r, t), f.bound(r, t));
    assert!(b > 0.0 && exp != 0.0);
    f.out.set(r, t, (exp + 0.5 * b) as f32);
    assert!(f.judge().is_clean(), "half the bound is within it");
    f.out.set(r, t, (exp - 0.9 * b) as f32);
    assert!(f.judge().is_clean(), "0.9 of the bound is within it");
    f.out.set(r, t, (exp + 3.0 * b) as f32);
    let v = f.judge();
    only(&v, Class::Mismatch, 1);
    let ex = &v.examples[0];
    assert_eq!((ex.row, ex.pos), (Some(r), Some(t)));
    assert!(v.metrics.max_err_over_bound > 2.0);
    // A mismatch is finite: the guard stays redundant.
    assert!(v.guard.redundant);
}

#[test]
fn nan_and_inf_in_valid_set() {
    let mut f = small();
    f.out.set(0, 5, f32::NAN);
    f.out.set(1, 6, f32::INFINITY);
    f.out.set(4, 7, f32::NEG_INFINITY);
    let v = f.judge();
    assert_eq!(v.classes.get(&Class::Nan), Some(&1));
    assert_eq!(v.classes.get(&Class::Inf), Some(&2));
    assert_eq!(v.classes.len(), 2);
    assert!(!v.guard.redundant);
    assert_eq!((v.guard.nan, v.guard.pos_inf, v.guard.neg_inf), (1, 1, 1));
    assert_eq!(v.guard.rows_affected, 3);
}

#[test]
fn unwritten_poison_survives() {
    let mut f = small();
    f.out.set(7, 63, f32::from_bits(POISON_BITS));
    let v = f.judge();
    only(&v, Class::Unwritten, 1);
    // The poison is a NaN: the guard would rewrite it.
    assert!(!v.guard.redundant);
    assert_eq!(v.guard.nan, 1);
    // Any other NaN payload is a computed NaN, not "unwritten".
    f.out.set(7, 63, f32::from_bits(POISON_BITS + 1));
    only(&f.judge(), Class::Nan, 1);
}

#[test]
fn outside_valid_set_is_statistics_only_under_any() {
    let mut f = small();
    // Row 2 (sequence 1) has no valid positions; row 0 has 299.
    assert_eq!(f.case.valid_len(2), 0);
    f.out.set(2, 0, f32::NAN);
    f.out.set(0, 299, f32::INFINITY);
    f.out.set(0, 300, 12.5);
    let v = f.judge();
    assert!(v.is_clean(), "{:?}", v.classes);
    assert!(
        v.guard.redundant,
        "NaN/inf outside V(r) do not matter to the guard"
    );
    assert!(v.outside.nan >= 1 && v.outside.pos_inf >= 1 && v.outside.finite >= 1);
    let rows = f.case.rows() as u64;
    assert_eq!(
        v.outside.elements,
        rows * f.case.max_model_len as u64 - f.case.valid_elements()
    );
}

#[test]
fn neg_inf_contract() {
    let mut f = small();
    f.caps.outside = OutsideContract::NegInf;
    // cpu:chunked leaves columns past the last chunk unwritten: not clean logits.
    let v = f.judge();
    assert!(v.classes.contains_key(&Class::NegInfContract));
    f.clean_logits();
    assert!(f.judge().is_clean());
    f.out.set(2, 0, 0.0); // a finite value outside V(r) (row 2 has none)
    f.out.set(0, 301, -3.0);
    only(&f.judge(), Class::NegInfContract, 2);
    // Under the default contract the same output is fine.
    f.caps.outside = OutsideContract::Any;
    assert!(f.judge().is_clean());
}

#[test]
fn oob_write_into_guards_and_row_padding() {
    let mut f = small();
    assert!(
        f.case.out_row_stride > f.case.max_model_len,
        "the fixture has row padding"
    );
    let (rows, stride, cols) = (f.case.rows(), f.case.out_row_stride, f.case.max_model_len);
    {
        let (raw, base) = f.out.raw_mut();
        raw[base - 1] = 1.0; // guard before [0][0]
        raw[base + rows * stride] = 2.0; // guard after the last row
        raw[base + 3 * stride + cols] = 3.0; // row 3 padding
    }
    let v = f.judge();
    only(&v, Class::OobWrite, 3);
    // Writing -inf or a NaN of another payload is still a write.
    let mut f = small();
    f.out.raw_mut().0[0] = f32::NEG_INFINITY;
    only(&f.judge(), Class::OobWrite, 1);
}

#[test]
fn input_mutated() {
    let f = small();
    let info = RunInfo {
        inputs_intact: Some(false),
        ..Default::default()
    };
    let v = judge(
        &f.case,
        &f.reference,
        &f.caps,
        Ok((&info, &f.out)),
        &OracleConfig::default(),
    );
    only(&v, Class::InputMutated, 1);
    // Unknown (None) is not a finding.
    let info = RunInfo::default();
    let v = judge(
        &f.case,
        &f.reference,
        &f.caps,
        Ok((&info, &f.out)),
        &OracleConfig::default(),
    );
    assert!(v.is_clean());
}

#[test]
fn crash_and_skip() {
    let f = small();
    let e = RunError::Crash("illegal address".into());
    let v = judge(
        &f.case,
        &f.reference,
        &f.caps,
        Err(&e),
        &OracleConfig::default(),
    );
    only(&v, Class::Crash, 1);
    assert!(v.examples[0]
        .detail
        .as_deref()
        .unwrap()
        .contains("illegal address"));
    let e = RunError::Skipped("format".into());
    let v = judge(
        &f.case,
        &f.reference,
        &f.caps,
        Err(&e),
        &OracleConfig::default(),
    );
    assert!(v.is_clean() && v.skipped.is_some());
}

// ---- downstream top-k ----------------------------------------------------------

/// A single long row whose tokens 10, 20, 30 and 40 are copies of the key with the
/// largest logit: an exact four-way tie at the top.
fn tie_fixture() -> (Fixture, Vec<usize>) {
    let mut case = recipe(vec![64], 1).materialize();
    let rref = reference::compute_row(&case, ScalePlacement::AfterReluSum, 0);
    let top = (0..64)
        .max_by(|&a, &b| rref.value[a].total_cmp(&rref.value[b]))
        .unwrap();
    assert!(rref.value[top] > 0.0);
    let copies = [10usize, 20, 30, 40]
        .into_iter()
        .filter(|&t| t != top)
        .take(3)
        .collect::<Vec<_>>();
    let s = case.shape.clone();
    let (id, p) = case.token_location(0, top);
    let block = case.block(id).to_vec();
    let codes: Vec<u8> = (0..s.head_dim).map(|d| case.k_code(&block, p, d)).collect();
    let scale = case.k_scale(&block, p);
    for &t in &copies {
        let (id, p) = case.token_location(0, t);
        Case::write_token(&s, case.kv.get_mut(id).unwrap(), p, &codes, scale);
    }
    let mut tied = copies;
    tied.push(top);
    tied.sort();
    (fixture(case), tied)
}

#[test]
fn topk_ties_at_the_kth_value_pass() {
    let (mut f, tied) = tie_fixture();
    for k in [1, 2, 3] {
        let cfg = OracleConfig {
            topk: k,
            ..Default::default()
        };
        let v = f.judge_cfg(&cfg);
        assert!(v.is_clean(), "k={k}: {:?} {:?}", v.classes, v.examples);
        assert_eq!((v.topk.rows_checked, v.topk.rows_failed), (1, 0));
    }
    // Nudge the last tie member up within its bound: the kernel now selects it
    // instead of the first; still a valid top-k.
    let t = *tied.last().unwrap();
    let b = f.bound(0, t);
    f.out.set(0, t, (f.exact(0, t) + 0.5 * b) as f32);
    let v = f.judge_cfg(&OracleConfig {
        topk: 1,
        ..Default::default()
    });
    assert!(v.is_clean(), "{:?} {:?}", v.classes, v.examples);
}

#[test]
fn topk_swap_beyond_bounds_fails() {
    let (mut f, tied) = tie_fixture();
    let rref = f.reference.rows[0].clone().unwrap();
    // The smallest logit of the row, far below the top.
    let low = (0..64)
        .min_by(|&a, &b| rref.value[a].total_cmp(&rref.value[b]))
        .unwrap();
    let high = tied[0];
    assert!(rref.value[high] - rref.value[low] > 100.0 * (f.bound(0, high) + f.bound(0, low)));
    let (a, b) = (f.out.get(0, high), f.out.get(0, low));
    // Swap the top with the bottom, and give every other tie member the bottom value too.
    f.out.set(0, low, a);
    for &t in &tied {
        f.out.set(0, t, b);
    }
    let v = f.judge_cfg(&OracleConfig {
        topk: 1,
        ..Default::default()
    });
    assert_eq!(v.classes.get(&Class::Topk), Some(&1), "{:?}", v.classes);
    assert_eq!(v.topk.rows_failed, 1);
    // k = 0 disables the check.
    let v = f.judge_cfg(&OracleConfig {
        topk: 0,
        ..Default::default()
    });
    assert!(!v.classes.contains_key(&Class::Topk));
    assert_eq!(v.topk.rows_checked, 0);
}

#[test]
fn topk_fails_on_nan_in_row_and_skips_short_rows() {
    let (mut f, _) = tie_fixture();
    f.out.set(0, 50, f32::NAN);
    let v = f.judge_cfg(&OracleConfig {
        topk: 8,
        ..Default::default()
    });
    assert_eq!(v.classes.get(&Class::Topk), Some(&1));
    assert_eq!(v.classes.get(&Class::Nan), Some(&1));
    // |V(r)| = 64 is not longer than k = 64: no top-k check.
    let v = f.judge_cfg(&OracleConfig {
        topk: 64,
        ..Default::default()
    });
    assert_eq!(v.topk.rows_checked, 0);
    assert!(!v.classes.contains_key(&Class::Topk));
}

#[test]
fn guard_verdict_counts_neg_inf_in_valid_set() {
    let mut f = small();
    f.out.set(0, 0, f32::NEG_INFINITY);
    let v = f.judge();
    assert!(!v.guard.redundant);
    assert_eq!(
        (
            v.guard.nan,
            v.guard.pos_inf,
            v.guard.neg_inf,
            v.guard.rows_affected
        ),
        (0, 0, 1, 1)
    );
    // A run with no NaN/inf anywhere in V(r) makes the guard redundant.
    assert!(small().judge().guard.redundant);
}

#[test]
fn sampled_reference_still_reports_the_guard() {
    let mut f = small();
    f.reference = reference::compute(
        &f.case,
        ScalePlacement::AfterReluSum,
        &RowSelection::Rows(vec![0]),
    );
    f.out.set(5, 1, f32::NAN); // row 5 is not in the sample
    f.out.set(6, 2, 1e30); // a wrong finite value in an unsampled row goes unseen
    let v = f.judge();
    assert!(!v.guard.redundant);
    assert_eq!(v.metrics.rows_checked, 1);
    // The NaN is still judged, against that element's own reference.
    only(&v, Class::Nan, 1);
    assert_eq!(v.examples[0].row, Some(5));
}

// ---- tightness of the per-element bound ------------------------------------------

/// Fills V(r) with an honest f32 kernel's result whose dot products are summed in a
/// given order: sequentially forward, or backward. Products of two fp8 values are
/// exact in f32, so only the summation order differs from cpu:chunked's lanes.
fn f32_kernel_output(f: &mut Fixture, backward: bool) {
    let case = f.case.clone();
    let s = &case.shape;
    let table = s.format.table();
    for r in 0..case.rows() {
        let (b, i) = (r / s.next_n, r % s.next_n);
        for t in 0..case.valid_len(r) {
            let (id, p) = case.token_location(b, t);
            let block = case.block(id);
            let scale = case.k_scale(block, p);
            let mut acc = 0f32;
            for h in 0..s.heads {
                let q = case.q_codes(b, i, h);
                let mut dot = 0f32;
                let mut add = |d: usize| {
                    dot += table[q[d] as usize] * table[case.k_code(block, p, d) as usize]
                };
                if backward {
                    (0..s.head_dim).rev().for_each(&mut add);
                } else {
                    (0..s.head_dim).for_each(&mut add);
                }
                acc += case.weight(r, h) * dot.max(0.0);
            }
            f.out.set(r, t, acc * scale);
        }
    }
}

#[test]
fn any_f32_summation_order_is_within_the_bound() {
    use mqa_fuzz::generate::ValueKind;
    for kind in [
        ValueKind::Pipeline,
        ValueKind::UniformCodes,
        ValueKind::Extreme,
        ValueKind::ReluBoundary,
        ValueKind::AllNegative,
    ] {
        for seed in 0..2 {
            let mut r = recipe(vec![70, 33], 2);
            r.knobs.heads = 32;
            r.knobs.head_dim = 128;
            r.knobs.values = kind;
            r.knobs.seed = seed;
            let mut f = fixture(r.materialize());
            for backward in [false, true] {
                f32_kernel_output(&mut f, backward);
                let v = f.judge();
                assert!(
                    v.is_clean(),
                    "{kind:?} seed {seed} backward {backward}: {:?} {:?}",
                    v.classes,
                    v.examples
                );
            }
        }
    }
}

#[test]
fn bf16_rounded_output_is_a_mismatch() {
    // A kernel that stores logits in bf16 (8 significant bits) is far outside the f32
    // bound: the oracle must not be so loose that this passes.
    let mut f = fixture(recipe(vec![300, 77], 1).materialize());
    let mut nonzero = 0;
    for r in 0..f.case.rows() {
        for t in 0..f.case.valid_len(r) {
            let x = f.out.get(r, t);
            nonzero += (x != 0.0) as u64;
            f.out.set(r, t, half::bf16::from_f32(x).to_f32());
        }
    }
    let v = f.judge();
    let mismatches = v.classes.get(&Class::Mismatch).copied().unwrap_or(0);
    assert!(
        mismatches * 2 > nonzero,
        "{mismatches} of {nonzero} nonzero logits flagged"
    );
}
