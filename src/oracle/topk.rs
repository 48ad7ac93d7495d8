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
    // A NaN where the exact value is finite was made by the kernel; a NaN where the
    // exact value itself is undefined (hostile inputs) is reported with the hostile
    // statistics, not judged (DESIGN §3).
    let kernel_made = |t: usize| rref.value.get(t).is_some_and(|v| v.is_finite());
    if let Some(t) = row
        .iter()
        .enumerate()
        .position(|(t, x)| x.is_nan() && kernel_made(t))
    {
        // A radix select over float bits leaves slots unfilled: garbage indices.
        return TopKOutcome::Inconsistent {
            detail: format!("row holds NaN (first at {t}): the radix top-k emits garbage indices"),
        };
    }
    if k == 0 || k >= row.len() {
        return TopKOutcome::Consistent; // selects nothing, or everything
    }
    if rref.value.iter().any(|v| !v.is_finite()) {
        return TopKOutcome::Consistent; // undefined reference: nothing to compare
    }
    let mut idx: Vec<usize> = (0..row.len()).collect();
    // Kernel's selection: k largest by value (index order breaks ties).
    idx.select_nth_unstable_by(k - 1, |&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    let (sel, rest) = idx.split_at(k);
    // Cheap bounds first (`lower` ≤ full bound, so agreement under them is agreement).
    let up_cheap = |t: usize| rref.value[t] + bound.lower(rref.relu_mag[t]);
    let down_cheap = |u: usize| rref.value[u] - bound.lower(rref.relu_mag[u]);
    let min_sel = sel
        .iter()
        .map(|&t| up_cheap(t))
        .fold(f64::INFINITY, f64::min);
    let max_rest = rest
        .iter()
        .map(|&u| down_cheap(u))
        .fold(f64::NEG_INFINITY, f64::max);
    if max_rest <= min_sel {
        return TopKOutcome::Consistent;
    }
    // Refine with the full bounds. Only a selected t with up_cheap(t) < max_rest can be
    // certainly below some unselected u, and only a u with down_cheap(u) > min_sel can
    // be certainly above some t (full bounds only widen the intervals), so checking the
    // candidates with their full bounds is exact, not a heuristic.
    let mut worst_sel = (f64::INFINITY, usize::MAX);
    for &t in sel.iter().filter(|&&t| up_cheap(t) < max_rest) {
        let up = rref.value[t] + full_bound(t);
        if up < worst_sel.0 {
            worst_sel = (up, t);
        }
    }
    let mut best_rest = (f64::NEG_INFINITY, usize::MAX);
    for &u in rest.iter().filter(|&&u| down_cheap(u) > min_sel) {
        let down = rref.value[u] - full_bound(u);
        if down > best_rest.0 {
            best_rest = (down, u);
        }
    }
    if worst_sel.1 == usize::MAX || best_rest.1 == usize::MAX || best_rest.0 <= worst_sel.0 {
        return TopKOutcome::Consistent;
    }
    let (worst_sel, best_rest) = (worst_sel.1, best_rest.1);
    TopKOutcome::Inconsistent {
        detail: format!(
            "top-{k} selects position {worst_sel} (exact {:e}) but leaves out {best_rest} (exact {:e})",
            rref.value[worst_sel], rref.value[best_rest]
        ),
    }
}
