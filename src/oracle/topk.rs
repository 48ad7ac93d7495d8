//! The downstream top-k check (DESIGN §2): would the engine's per-row top-k over the
//! kernel's logits pick a set the exact reference disagrees with, beyond the error
//! bounds? Ties at the k-th value are allowed: a selection is consistent iff no
//! unselected position is certainly larger than a selected one, i.e.
//! `max_{u∉S}(ref_u - b_u) ≤ min_{t∈S}(ref_t + b_t)`.

use super::ErrorBound;
use crate::reference::RowReference;

pub enum TopKOutcome {
    Consistent,
    Inconsistent { detail: String },
}

/// `row` is V(r) of the kernel's output; `full_bound(t)` gives the exact bound of t.
pub fn topk_consistent(
    row: &[f32],
    rref: &RowReference,
    bound: &ErrorBound,
    k: usize,
    full_bound: impl Fn(usize) -> f64,
) -> TopKOutcome {
    if let Some(t) = row.iter().position(|x| x.is_nan()) {
        // A radix select over float bits leaves slots unfilled: garbage indices.
        return TopKOutcome::Inconsistent { detail: format!("row holds NaN (first at {t}): the radix top-k emits garbage indices") };
    }
    if rref.value.iter().any(|v| !v.is_finite()) {
        return TopKOutcome::Consistent; // undefined reference: nothing to compare
    }
    let mut idx: Vec<usize> = (0..row.len()).collect();
    // Kernel's selection: k largest by value (index order breaks ties).
    idx.select_nth_unstable_by(k - 1, |&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    let (sel, rest) = idx.split_at(k);
    // Cheap bound first; refine only the two extreme candidates.
    let lo = |t: usize| rref.value[t] + bound.lower(rref.relu_mag[t]);
    let hi = |t: usize| rref.value[t] - bound.lower(rref.relu_mag[t]);
    let (mut worst_sel, mut min_sel) = (sel[0], f64::INFINITY);
    for &t in sel {
        if lo(t) < min_sel {
            min_sel = lo(t);
            worst_sel = t;
        }
    }
    let (mut best_rest, mut max_rest) = (usize::MAX, f64::NEG_INFINITY);
    for &u in rest {
        if hi(u) > max_rest {
            max_rest = hi(u);
            best_rest = u;
        }
    }
    if best_rest == usize::MAX || max_rest <= min_sel {
        return TopKOutcome::Consistent;
    }
    // Refine with full bounds (larger, so may accept) for the extreme pair.
    let sel_ub = rref.value[worst_sel] + full_bound(worst_sel);
    let rest_lb = rref.value[best_rest] - full_bound(best_rest);
    if rest_lb <= sel_ub {
        // The pair is tied within bounds; a full re-check of every pair would be
        // quadratic, and a violation elsewhere implies a worse element pair anyway.
        return TopKOutcome::Consistent;
    }
    TopKOutcome::Inconsistent {
        detail: format!(
            "top-{k} selects position {worst_sel} (exact {:e}) but leaves out {best_rest} (exact {:e})",
            rref.value[worst_sel], rref.value[best_rest]
        ),
    }
}
