//! What a finding looks like: a class map of the case (rows × positions, zoomed to the
//! findings) and a histogram of `|err| / bound` over V(r).
//!
//! Both re-classify every element of V(r) with the oracle's own rules
//! ([`crate::oracle::classify`] semantics, the same [`ErrorBound`]), but keep the sign
//! of infinities apart because the guard question (`nan_to_num_(-inf)`) treats +inf and
//! -inf differently, and keep "unwritten" apart from a computed NaN because they point
//! at different bugs.

use super::model::{CellClass, ClassMap};
use crate::case::Case;
use crate::kernel::{Capabilities, OutputBuffer, POISON_BITS};
use crate::oracle::ErrorBound;
use crate::reference::{self, Reference};
use std::collections::BTreeMap;

/// Largest picture in cells; bigger windows aggregate several elements per cell.
pub const MAX_CELL_COLS: usize = 240;
pub const MAX_CELL_ROWS: usize = 96;
/// Context around the findings' bounding box: rows, and positions (at least this many,
/// or an eighth of the box's width).
const ROW_CONTEXT: usize = 2;
const COL_CONTEXT: usize = 8;

/// The histogram bins of `|err| / bound` (upper edges inclusive, so every bin from
/// index [`FIRST_OUT_OF_BOUND_BIN`] on holds mismatches):
///
/// | bin | ratio |
/// |---|---|
/// | 0 | exactly 0 (bit-exact) |
/// | 1 | (0, 1e-6] |
/// | 2..=10 | (10^(k-8), 10^(k-7)] — bin 7 is (0.1, 1], bin 8 is (1, 10] |
/// | 11 | > 1e3 (finite) |
/// | 12 | not finite: the kernel gave NaN, ±inf, or left the poison |
///
/// The bound of an element accepted by the oracle's cheap lower bound is that lower
/// bound (an over-estimate of the ratio, never an under-estimate), exactly as the
/// oracle's `max_err_over_bound` metric; elements whose reference is undefined
/// (hostile inputs) or was not computed are not counted.
pub const HISTOGRAM_BINS: [&str; 13] = [
    "0", "≤1e-6", "≤1e-5", "≤1e-4", "≤1e-3", "≤0.01", "≤0.1", "≤1", "≤10", "≤100", "≤1e3", ">1e3",
    "NaN/inf",
];
pub const FIRST_OUT_OF_BOUND_BIN: usize = 8;
pub const NON_FINITE_BIN: usize = 12;

/// The bin of one ratio (see [`HISTOGRAM_BINS`]); `None` for a non-finite kernel value.
pub fn histogram_bin(ratio: Option<f64>) -> usize {
    let Some(x) = ratio else {
        return NON_FINITE_BIN;
    };
    if x == 0.0 {
        return 0;
    }
    if x.is_nan() {
        return NON_FINITE_BIN;
    }
    // Bin k covers (10^(k-8), 10^(k-7)] for k in 1..=10 (bin 1 from 0).
    for k in 1..=10 {
        if x <= 10f64.powi(k as i32 - 7) {
            return k;
        }
    }
    11
}

/// Classifies every element of V(r) and calls `visit(row, pos, class, ratio)`; the
/// ratio is `|err| / bound` for finite kernel values with a defined reference, `None`
/// for NaN/±inf/unwritten, and absent (the class says why) otherwise.
fn scan(
    case: &Case,
    reference: &Reference,
    caps: &Capabilities,
    out: &OutputBuffer,
    mut visit: impl FnMut(usize, usize, CellClass, Option<Option<f64>>),
) {
    let bound = ErrorBound::for_kernel(caps.accumulation, &case.shape);
    for r in 0..case.rows().min(out.rows) {
        let row = out.row(r);
        let len = case.valid_len(r).min(row.len());
        let rref = reference.rows.get(r).and_then(|x| x.as_ref());
        for (t, &got) in row[..len].iter().enumerate() {
            let non_finite = if got.to_bits() == POISON_BITS {
                Some(CellClass::Unwritten)
            } else if got.is_nan() {
                Some(CellClass::Nan)
            } else if got == f32::INFINITY {
                Some(CellClass::PosInf)
            } else if got == f32::NEG_INFINITY {
                Some(CellClass::NegInf)
            } else {
                None
            };
            let Some(rref) = rref else {
                visit(r, t, non_finite.unwrap_or(CellClass::Unchecked), None);
                continue;
            };
            let exp = rref.value[t];
            if !exp.is_finite() || exp.abs() > f32::MAX as f64 {
                // Unwritten stays a finding even here: the kernel never wrote the element.
                match non_finite {
                    Some(CellClass::Unwritten) => visit(r, t, CellClass::Unwritten, Some(None)),
                    _ => visit(r, t, CellClass::Undefined, None),
                }
                continue;
            }
            if let Some(c) = non_finite {
                visit(r, t, c, Some(None));
                continue;
            }
            let err = (got as f64 - exp).abs();
            let lower = bound.lower(rref.relu_mag[t]);
            let (class, b) = if err <= lower {
                (CellClass::Ok, lower)
            } else {
                let (_, m, a) = reference::element(case, reference.placement, r, t);
                let full = bound.full(m, a);
                (
                    if err <= full {
                        CellClass::Ok
                    } else {
                        CellClass::Mismatch
                    },
                    full,
                )
            };
            let ratio = if b > 0.0 {
                err / b
            } else if err == 0.0 {
                0.0
            } else {
                f64::INFINITY
            };
            visit(r, t, class, Some(Some(ratio)));
        }
    }
}

/// Counts of `|err| / bound` over V(r) in the bins of [`HISTOGRAM_BINS`].
pub fn error_histogram(
    case: &Case,
    reference: &Reference,
    caps: &Capabilities,
    out: &OutputBuffer,
) -> Vec<u64> {
    let mut hist = vec![0u64; HISTOGRAM_BINS.len()];
    scan(case, reference, caps, out, |_, _, _, ratio| {
        if let Some(ratio) = ratio {
            hist[histogram_bin(ratio)] += 1;
        }
    });
    hist
}

/// The class map of a case: every element of V(r) classified, outside V(r) shown as
/// such, the window zoomed to the bounding box of the finding elements (with a little
/// context), or the whole case when no element of V(r) is a finding (crash, oob_write).
pub fn class_map(
    case: &Case,
    reference: &Reference,
    caps: &Capabilities,
    out: &OutputBuffer,
) -> ClassMap {
    let rows = case.rows();
    let cols = case.max_model_len;
    // Classes per row over V(r) (one byte per element: only V(r) is stored).
    let mut classes: Vec<Vec<CellClass>> = (0..rows)
        .map(|r| Vec::with_capacity(case.valid_len(r).min(cols)))
        .collect();
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let (mut rmin, mut rmax, mut cmin, mut cmax) = (usize::MAX, 0, usize::MAX, 0);
    scan(case, reference, caps, out, |r, t, c, _| {
        classes[r].push(c);
        *counts.entry(c.name().to_string()).or_default() += 1;
        if c >= CellClass::Mismatch {
            rmin = rmin.min(r);
            rmax = rmax.max(r);
            cmin = cmin.min(t);
            cmax = cmax.max(t);
        }
    });
    let inside: u64 = classes.iter().map(|c| c.len() as u64).sum();
    let outside = (rows as u64 * cols as u64).saturating_sub(inside);
    if outside > 0 {
        counts.insert(CellClass::Outside.name().to_string(), outside);
    }
    let whole_case = rmin == usize::MAX;
    let (row_start, row_end, col_start, col_end) = if whole_case {
        (0, rows, 0, cols)
    } else {
        let pad = COL_CONTEXT.max((cmax - cmin + 1) / 8);
        (
            rmin.saturating_sub(ROW_CONTEXT),
            (rmax + 1 + ROW_CONTEXT).min(rows),
            cmin.saturating_sub(pad),
            (cmax + 1 + pad).min(cols),
        )
    };
    let rows_per_cell = (row_end - row_start).div_ceil(MAX_CELL_ROWS).max(1);
    let cols_per_cell = (col_end - col_start).div_ceil(MAX_CELL_COLS).max(1);
    let mut cells = Vec::new();
    let mut r0 = row_start;
    while r0 < row_end {
        let r1 = (r0 + rows_per_cell).min(row_end);
        let mut line = String::new();
        let mut c0 = col_start;
        while c0 < col_end {
            let c1 = (c0 + cols_per_cell).min(col_end);
            let mut worst = None;
            for row in &classes[r0..r1] {
                if c1 > row.len() {
                    worst = worst.max(Some(CellClass::Outside));
                }
                if c0 < row.len() {
                    worst = worst.max(row[c0..c1.min(row.len())].iter().copied().max());
                }
            }
            line.push(worst.unwrap_or(CellClass::Outside).code());
            c0 = c1;
        }
        cells.push(line);
        r0 = r1;
    }
    ClassMap {
        rows,
        cols,
        row_start,
        row_end,
        col_start,
        col_end,
        rows_per_cell,
        cols_per_cell,
        cells,
        counts,
        whole_case,
    }
}

impl ClassMap {
    /// The cell classes present in the window, in severity order.
    pub fn classes_shown(&self) -> Vec<CellClass> {
        let mut v: Vec<CellClass> = self
            .cells
            .iter()
            .flat_map(|l| l.chars())
            .filter_map(CellClass::from_code)
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

/// Fills in the picture and error histogram of every finding that has none, by
/// replaying its saved case file on its kernel (findings are few and shrunk, so this
/// costs one small run each). Findings without a loadable case file or an openable
/// kernel (e.g. `a vs b` divergences) are left as they are; the returned lines say why.
pub fn fill_pictures(
    report: &mut super::Report,
    oracle: &crate::oracle::OracleConfig,
) -> Vec<String> {
    let mut notes = Vec::new();
    for f in report.findings.iter_mut().filter(|f| f.picture.is_none()) {
        let Some(path) = f.case_file.clone() else {
            continue;
        };
        let file = match crate::case::load_case_file(std::path::Path::new(&path)) {
            Ok(file) => file,
            Err(e) => {
                notes.push(format!("no picture for {}: {e}", f.signature));
                continue;
            }
        };
        // A divergence (`A vs B`) is pictured on the kernel that disagreed with the first.
        let name = file
            .provenance
            .kernels
            .last()
            .filter(|_| f.class == Some(crate::oracle::Class::Divergent))
            .unwrap_or(&f.kernel);
        let Ok(kernel) = crate::kernel::open(name) else {
            notes.push(format!(
                "no picture for {}: kernel {name} cannot be opened here",
                f.signature
            ));
            continue;
        };
        let mut refs = crate::harness::ReferenceCache::new(&file.case);
        let judged = crate::harness::run_and_judge(kernel.as_ref(), &file.case, &mut refs, oracle);
        let Some(out) = judged.output else {
            notes.push(format!(
                "no picture for {}: the replay produced no output ({})",
                f.signature, judged.verdict
            ));
            continue;
        };
        let caps = kernel.capabilities();
        let reference = refs.get(caps.scale_placement);
        f.picture = Some(class_map(&file.case, reference, caps, &out));
        f.error_histogram = error_histogram(&file.case, reference, caps, &out);
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_follow_the_documented_edges() {
        assert_eq!(histogram_bin(Some(0.0)), 0);
        assert_eq!(histogram_bin(Some(1e-9)), 1);
        assert_eq!(histogram_bin(Some(1e-6)), 1);
        assert_eq!(histogram_bin(Some(2e-6)), 2);
        assert_eq!(histogram_bin(Some(0.5)), 7);
        assert_eq!(histogram_bin(Some(1.0)), 7, "ratio 1 is within the bound");
        assert_eq!(histogram_bin(Some(1.0001)), FIRST_OUT_OF_BOUND_BIN);
        assert_eq!(histogram_bin(Some(999.0)), 10);
        assert_eq!(histogram_bin(Some(1e6)), 11);
        assert_eq!(histogram_bin(Some(f64::INFINITY)), 11);
        assert_eq!(histogram_bin(None), NON_FINITE_BIN);
    }
}
