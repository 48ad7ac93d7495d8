//! The verdict of a case judged on the device (DESIGN §8), and the CPU's re-check that
//! keeps the device honest.
//!
//! A kernel on a GPU worker judges its output where it lies (`kernels/judge.cu`, the
//! oracle's rules) and sends back a [`DeviceJudgement`]; [`device_verdict`] turns it into
//! the same [`Verdict`] the CPU judge gives. The CPU never trusts it alone:
//! [`check_plan`] picks elements (the context edges of every row, the block, tile and
//! chunk edges and random positions of a few rows) whose output, GPU reference and device
//! class come back, and [`recheck`] recomputes each with the independent
//! `reference::element` and the CPU's `classify`. Any difference is an
//! `oracle_disagreement` finding. A judgement with findings comes with the output, and
//! the CPU judges it as always ([`compare_counts`] then holds the two to the same counts).

use super::{classify, Class, ElementClass, ErrorBound, OracleConfig, Verdict};
use crate::case::Case;
use crate::kernel::{
    CacheCheck, Capabilities, CheckedElement, DeviceClass, DeviceJudgeRequest, DeviceJudgement,
    JudgedRun, OutsideContract,
};
use crate::reference;
use crate::reference::verify::check_positions;
use rand::RngExt;
use rayon::prelude::*;

/// How a campaign judges (`--judge`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum JudgeMode {
    /// On the device where the kernel's output is on a GPU that can judge it, else on
    /// the CPU.
    #[default]
    Auto,
    Cpu,
    /// On the device; a kernel that cannot is a usage error.
    Gpu,
}

impl std::str::FromStr for JudgeMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(JudgeMode::Auto),
            "cpu" => Ok(JudgeMode::Cpu),
            "gpu" => Ok(JudgeMode::Gpu),
            _ => Err(format!("`{s}`: expected auto, cpu or gpu")),
        }
    }
}

impl JudgeMode {
    pub fn name(self) -> &'static str {
        match self {
            JudgeMode::Auto => "auto",
            JudgeMode::Cpu => "cpu",
            JudgeMode::Gpu => "gpu",
        }
    }
}

/// Elements re-checked per case at most (each costs the CPU a D×H dot, and a drawn
/// cache the draw of its block).
pub const CHECK_BUDGET: usize = 2048;
/// Rows re-checked in full detail (every block, tile and chunk edge, random positions).
const DETAILED_ROWS: usize = 3;
/// Random positions of a detailed row.
const RANDOM_PER_ROW: usize = 48;

/// The elements the CPU re-checks for `case` ([`check_positions`]): both ends of V(r) of
/// every row (of a deterministic sample of rows when there are more than the budget
/// allows), and for a few rows the block, 64-token tile and 256-token chunk edges and
/// random positions; at most [`CHECK_BUDGET`], sorted, each inside V(r). `seed` makes the
/// choice (the case's own seed: the same case is checked the same way).
pub fn check_plan(case: &Case, seed: u64) -> Vec<(u32, u32)> {
    let mut rng = crate::generate::recipe::rng_for(seed ^ 0xc4ec_c0de);
    let rows: Vec<usize> = (0..case.rows())
        .filter(|&r| case.valid_len(r) > 0)
        .collect();
    let mut v: Vec<(u32, u32)> = Vec::new();
    let add = |v: &mut Vec<(u32, u32)>, r: usize, full: bool, rng: &mut _| {
        let edges = (CHECK_BUDGET / 4) / (3 * DETAILED_ROWS);
        let random = if full { RANDOM_PER_ROW } else { 0 };
        v.extend(
            check_positions(case, r, full, random, edges, rng)
                .into_iter()
                .map(|t| (r as u32, t as u32)),
        );
    };
    // Detailed rows first, so the cap never cuts them.
    for _ in 0..DETAILED_ROWS.min(rows.len()) {
        let r = rows[rng.random_range(0..rows.len())];
        add(&mut v, r, true, &mut rng);
    }
    // Context edges of every row (or of a sample when rows are many).
    let room = CHECK_BUDGET.saturating_sub(v.len()) / 4;
    let every = rows.len().div_ceil(room.max(1)).max(1);
    let offset = if every > 1 {
        rng.random_range(0..every)
    } else {
        0
    };
    for &r in rows.iter().skip(offset).step_by(every) {
        add(&mut v, r, false, &mut rng);
    }
    v.sort_unstable();
    v.dedup();
    v.truncate(CHECK_BUDGET);
    v
}

/// The request for `case` on a kernel with capabilities `caps` (its cache read-only
/// where the process's [`CacheCheck`] says so).
pub fn request(case: &Case, caps: &Capabilities, seed: u64) -> DeviceJudgeRequest {
    let b = ErrorBound::for_kernel(caps.accumulation, &case.shape);
    DeviceJudgeRequest {
        read_only_cache: CacheCheck::current().read_only_for(case),
        ..DeviceJudgeRequest::new(
            caps.scale_placement,
            [b.dot_rel, b.head_rel, b.abs],
            check_plan(case, seed),
        )
    }
}

/// The element-level classes a judgement counts, for a kernel's outside contract.
fn element_classes(caps: &Capabilities, j: &DeviceJudgement) -> [(Class, u64); 6] {
    let contract = match caps.outside {
        OutsideContract::NegInf => j.outside_elements - j.outside_neg_inf,
        OutsideContract::Any => 0,
    };
    [
        (Class::Mismatch, j.mismatch),
        (Class::Nan, j.nan),
        (Class::Inf, j.inf),
        (Class::Unwritten, j.unwritten),
        (Class::NegInfContract, contract),
        (Class::OobWrite, j.oob_writes),
    ]
}

/// The verdict of a run judged on the device, as the CPU judge would give it: classes
/// with their counts, the guard verdict, the error metrics, what lies outside V(r), the
/// top-k (every row whose elements are all within their bounds selects consistently:
/// `ref_u - b_u <= got_u <= got_t <= ref_t + b_t`), the hostile tallies. Offenders are
/// named only by the CPU judge, which gets the output whenever there is a finding.
pub fn device_verdict(
    case: &Case,
    caps: &Capabilities,
    run: &JudgedRun,
    cfg: &OracleConfig,
) -> Verdict {
    let j = &run.judgement;
    let mut v = Verdict {
        run: run.info.clone(),
        ..Default::default()
    };
    v.topk.k = cfg.topk;
    if run.info.inputs_intact == Some(false) {
        v.add_case_finding(
            Class::InputMutated,
            "an input buffer changed during the run".into(),
        );
    }
    for (class, n) in element_classes(caps, j) {
        if n > 0 {
            *v.classes.entry(class).or_default() += n;
        }
    }
    let m = &mut v.metrics;
    m.checked = j.ok + j.mismatch + j.nan + j.inf + j.unwritten;
    m.rows_checked = j.rows;
    m.max_abs_err = j.max_abs_err();
    m.max_err_over_bound = j.max_err_over_bound();
    m.calc_diff = j.calc_diff();
    let g = &mut v.guard;
    g.nan = j.guard_nan;
    g.pos_inf = j.guard_pos_inf;
    g.neg_inf = j.guard_neg_inf;
    g.rows_affected = j.guard_rows;
    g.redundant = j.guard_nan + j.guard_pos_inf + j.guard_neg_inf == 0;
    let o = &mut v.outside;
    o.elements = j.outside_elements;
    o.unwritten = j.outside_unwritten;
    o.nan = j.outside_nan;
    o.neg_inf = j.outside_neg_inf;
    o.pos_inf = j.outside_pos_inf;
    o.finite = j.outside_finite;
    let h = &mut v.hostile;
    h.undefined = j.undefined;
    h.got_nan = j.hostile_nan;
    h.got_inf = j.hostile_inf;
    h.got_finite = j.hostile_finite;
    if cfg.topk > 0 && !j.has_value_findings() {
        v.topk.rows_checked = (0..case.rows())
            .filter(|&r| case.valid_len(r) > cfg.topk)
            .count() as u64;
    }
    v
}

/// The CPU's re-check of the device's sampled elements: the GPU reference's value and
/// magnitude must have the CPU reference's bits, and the device's class must be the
/// CPU's. `Ok(elements checked)`, or the first disagreement in words.
pub fn recheck(case: &Case, caps: &Capabilities, j: &DeviceJudgement) -> Result<u64, String> {
    let bound = ErrorBound::for_kernel(caps.accumulation, &case.shape);
    let placement = caps.scale_placement;
    let verdicts: Vec<Option<String>> = j
        .checks
        .par_iter()
        .map(|e| one_check(case, placement, &bound, e))
        .collect();
    match verdicts.into_iter().flatten().next() {
        Some(msg) => Err(msg),
        None => Ok(j.checks.len() as u64),
    }
}

fn one_check(
    case: &Case,
    placement: crate::case::ScalePlacement,
    bound: &ErrorBound,
    e: &CheckedElement,
) -> Option<String> {
    let (r, t) = (e.row as usize, e.pos as usize);
    if r >= case.rows() || t >= case.valid_len(r) {
        return Some(format!(
            "the device re-checked row {r} position {t}, outside V(r)"
        ));
    }
    let (v, m, a) = reference::element(case, placement, r, t);
    let (gv, gm) = (
        f64::from_bits(e.value_bits),
        f64::from_bits(e.relu_mag_bits),
    );
    let same = |x: f64, y: f64| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan());
    if !same(v, gv) || !same(m, gm) {
        return Some(format!(
            "GPU reference differs from the CPU at row {r} position {t}: value {gv:e} vs {v:e}, magnitude {gm:e} vs {m:e}"
        ));
    }
    let got = f32::from_bits(e.got_bits);
    let cpu = match classify(got, v, m, bound, || a) {
        ElementClass::Ok => DeviceClass::Ok,
        ElementClass::Undefined => DeviceClass::Undefined,
        ElementClass::Finding(Class::Mismatch) => DeviceClass::Mismatch,
        ElementClass::Finding(Class::Nan) => DeviceClass::Nan,
        ElementClass::Finding(Class::Inf) => DeviceClass::Inf,
        ElementClass::Finding(Class::Unwritten) => DeviceClass::Unwritten,
        ElementClass::Finding(c) => {
            return Some(format!("the CPU classed row {r} position {t} as {c}"))
        }
    };
    (cpu != e.class).then(|| {
        format!(
            "the device judge classed row {r} position {t} (got {}, exact {v:e}) as {:?}, the CPU as {cpu:?}",
            super::show_f32(got),
            e.class
        )
    })
}

/// For a judgement whose output came back: where the CPU judge's counts of the element
/// classes differ from the device's (both judged every element), in words.
pub fn compare_counts(caps: &Capabilities, j: &DeviceJudgement, cpu: &Verdict) -> Option<String> {
    let differ: Vec<String> = element_classes(caps, j)
        .iter()
        .filter_map(|&(c, n)| {
            let m = cpu.classes.get(&c).copied().unwrap_or(0);
            (m != n).then(|| format!("{c}: device {n}, CPU {m}"))
        })
        .collect();
    (!differ.is_empty()).then(|| {
        format!(
            "the device judge and the CPU judge count different classes on the same output ({})",
            differ.join(", ")
        )
    })
}

/// A seed for [`check_plan`] from the case itself (its value seed where it was drawn).
pub fn case_seed(case: &Case) -> u64 {
    let drawn = case.kv.drawn_values().map_or(0, |(v, _)| v.seed);
    drawn ^ (case.rows() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ case.num_blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_stays_inside_v_and_the_budget() {
        let case = crate::generate::Recipe::small(vec![700, 0, 5, 3000], 2, 3).materialize();
        let plan = check_plan(&case, 7);
        assert!(!plan.is_empty() && plan.len() <= CHECK_BUDGET);
        for &(r, t) in &plan {
            assert!((t as usize) < case.valid_len(r as usize), "({r}, {t})");
        }
        // Both ends of every non-empty row.
        for r in 0..case.rows() {
            let len = case.valid_len(r);
            if len > 0 {
                assert!(
                    plan.contains(&(r as u32, 0)) && plan.contains(&(r as u32, len as u32 - 1))
                );
            }
        }
        assert_eq!(plan, check_plan(&case, 7), "deterministic for a seed");
        assert!("gpu".parse::<JudgeMode>().is_ok() && "x".parse::<JudgeMode>().is_err());
    }
}
