//! What a finding looks like: a class map of the case (rows × positions, zoomed to the
//! findings) and a histogram of `|err| / bound` over V(r).
//!
//! Both are sinks of the oracle's element scan ([`super::scan`]), so they classify
//! exactly as the verdict does; they keep the sign of infinities apart because the
//! guard question (`nan_to_num_(-inf)`) treats +inf and -inf differently, and keep
//! "unwritten" apart from a computed NaN because they point at different bugs. A
//! finding's picture is drawn by the campaign from the output in hand when the
//! finding is made; the report only renders it.

use super::scan::{scan, Element, ElementSink, Seen};
use super::ErrorBound;
use crate::case::Case;
use crate::kernel::{Capabilities, OutputBuffer, POISON_BITS};
use crate::reference::Reference;
use serde::{Deserialize, Serialize};
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

/// A picture of a case: rows × positions, each cell the worst class of the elements
/// it covers, zoomed to the rows and positions where findings are.
///
/// Cells are stored as one string per shown row, one character per cell (see
/// [`CellClass::code`]), so the JSON stays small and is readable by eye.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct ClassMap {
    /// Rows (`batch * next_n`) and columns (`max_model_len`) of the whole case.
    pub rows: usize,
    pub cols: usize,
    /// The window shown: rows `[row_start, row_end)`, positions `[col_start, col_end)`.
    pub row_start: usize,
    pub row_end: usize,
    pub col_start: usize,
    pub col_end: usize,
    /// Rows and positions covered by one cell (1 = no aggregation).
    pub rows_per_cell: usize,
    pub cols_per_cell: usize,
    /// One string per shown cell row; one [`CellClass::code`] per cell.
    pub cells: Vec<String>,
    /// Elements of the whole case per cell class name (not only the window).
    pub counts: BTreeMap<String, u64>,
    /// Whether the window is the whole case (no findings located in V(r)).
    pub whole_case: bool,
}

/// The class of one picture cell, in increasing order of severity: a cell covering
/// several elements shows the most severe one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CellClass {
    /// Outside V(r): not read downstream, not judged.
    Outside,
    /// Inside V(r) but no reference was computed for the row.
    Unchecked,
    Ok,
    /// The reference itself is not finite (hostile inputs): reported, not judged.
    Undefined,
    Mismatch,
    NegInf,
    PosInf,
    Nan,
    /// The launch-time poison survived: never written.
    Unwritten,
}

impl CellClass {
    pub const ALL: [CellClass; 9] = [
        CellClass::Outside,
        CellClass::Unchecked,
        CellClass::Ok,
        CellClass::Undefined,
        CellClass::Mismatch,
        CellClass::NegInf,
        CellClass::PosInf,
        CellClass::Nan,
        CellClass::Unwritten,
    ];

    pub fn code(self) -> char {
        match self {
            CellClass::Outside => '.',
            CellClass::Unchecked => '?',
            CellClass::Ok => 'o',
            CellClass::Undefined => 'h',
            CellClass::Mismatch => 'm',
            CellClass::NegInf => '-',
            CellClass::PosInf => '+',
            CellClass::Nan => 'n',
            CellClass::Unwritten => 'u',
        }
    }

    pub fn from_code(c: char) -> Option<CellClass> {
        CellClass::ALL.into_iter().find(|k| k.code() == c)
    }

    pub fn name(self) -> &'static str {
        match self {
            CellClass::Outside => "outside",
            CellClass::Unchecked => "unchecked",
            CellClass::Ok => "ok",
            CellClass::Undefined => "undefined",
            CellClass::Mismatch => "mismatch",
            CellClass::NegInf => "neg_inf",
            CellClass::PosInf => "pos_inf",
            CellClass::Nan => "nan",
            CellClass::Unwritten => "unwritten",
        }
    }

    /// Legend text.
    pub fn label(self) -> &'static str {
        match self {
            CellClass::Outside => "outside V(r)",
            CellClass::Unchecked => "in V(r), not checked",
            CellClass::Ok => "ok (within bound)",
            CellClass::Undefined => "reference undefined (hostile input)",
            CellClass::Mismatch => "mismatch (outside bound)",
            CellClass::NegInf => "-inf",
            CellClass::PosInf => "+inf",
            CellClass::Nan => "NaN (computed)",
            CellClass::Unwritten => "unwritten (poison survived)",
        }
    }

    /// Distinct colours (ColorBrewer-like, readable on white); RGB.
    pub fn rgb(self) -> (u8, u8, u8) {
        match self {
            CellClass::Outside => (0xe8, 0xe8, 0xe8),
            CellClass::Unchecked => (0xff, 0xff, 0xbf),
            CellClass::Ok => (0xa6, 0xd9, 0x6a),
            CellClass::Undefined => (0xbf, 0xa5, 0xcf),
            CellClass::Mismatch => (0xfd, 0xae, 0x61),
            CellClass::NegInf => (0x2c, 0x7b, 0xb6),
            CellClass::PosInf => (0x7b, 0x32, 0x94),
            CellClass::Nan => (0xd7, 0x19, 0x1c),
            CellClass::Unwritten => (0xe7, 0x29, 0x8a),
        }
    }

    pub fn hex(self) -> String {
        let (r, g, b) = self.rgb();
        format!("#{r:02x}{g:02x}{b:02x}")
    }
}

/// The picture cell class of a scanned element.
fn cell_class(e: &Element) -> CellClass {
    match e.seen {
        Seen::Unchecked => CellClass::Unchecked,
        Seen::Undefined => CellClass::Undefined,
        Seen::Ok { .. } => CellClass::Ok,
        Seen::Finding { .. } => {
            let got = e.got;
            if got.to_bits() == POISON_BITS {
                CellClass::Unwritten
            } else if got.is_nan() {
                CellClass::Nan
            } else if got == f32::INFINITY {
                CellClass::PosInf
            } else if got == f32::NEG_INFINITY {
                CellClass::NegInf
            } else {
                CellClass::Mismatch
            }
        }
    }
}

/// First pass: counts per cell class, the histogram, the findings' bounding box.
#[derive(Default)]
struct Survey {
    counts: BTreeMap<String, u64>,
    hist: Vec<u64>,
    inside: u64,
    bbox: Option<(usize, usize, usize, usize)>,
}

impl ElementSink for Survey {
    fn element(&mut self, e: &Element) {
        let c = cell_class(e);
        *self.counts.entry(c.name().to_string()).or_default() += 1;
        self.inside += 1;
        if let Some(ratio) = e.ratio() {
            self.hist[histogram_bin(ratio)] += 1;
        }
        if c >= CellClass::Mismatch {
            let b = self.bbox.get_or_insert((e.row, e.row, e.pos, e.pos));
            *b = (
                b.0.min(e.row),
                b.1.max(e.row),
                b.2.min(e.pos),
                b.3.max(e.pos),
            );
        }
    }
}

/// Second pass: the worst class of each cell of the window.
struct Cells {
    window: (usize, usize, usize, usize),
    per_cell: (usize, usize),
    grid: Vec<Vec<Option<CellClass>>>,
}

impl Cells {
    fn mark(&mut self, r: usize, t: usize, c: CellClass) {
        let (r0, r1, c0, c1) = self.window;
        if r < r0 || r >= r1 || t < c0 || t >= c1 {
            return;
        }
        let cell = &mut self.grid[(r - r0) / self.per_cell.0][(t - c0) / self.per_cell.1];
        *cell = (*cell).max(Some(c));
    }
}

impl ElementSink for Cells {
    fn element(&mut self, e: &Element) {
        self.mark(e.row, e.pos, cell_class(e));
    }

    fn row_end(
        &mut self,
        r: usize,
        _row: &[f32],
        len: usize,
        _rref: Option<&crate::reference::RowReference>,
    ) {
        // Cells reaching past V(r) also cover "outside" elements.
        let (_, _, c0, c1) = self.window;
        let cols_per_cell = self.per_cell.1;
        let mut start = c0;
        while start < c1 {
            let end = (start + cols_per_cell).min(c1);
            if end > len {
                self.mark(r, start, CellClass::Outside);
            }
            start = end;
        }
    }
}

/// The class map and the error histogram of a case: every element of V(r) classified,
/// outside V(r) shown as such, the window zoomed to the bounding box of the finding
/// elements (with a little context), or the whole case when no element of V(r) is a
/// finding (crash, oob_write). Two scans: one to find the window, one to fill it.
pub fn draw(
    case: &Case,
    reference: &Reference,
    caps: &Capabilities,
    out: &OutputBuffer,
) -> (ClassMap, Vec<u64>) {
    let bound = ErrorBound::for_kernel(caps.accumulation, &case.shape);
    let rows = case.rows().min(out.rows);
    let cols = case.max_model_len;
    let mut survey = Survey {
        hist: vec![0; HISTOGRAM_BINS.len()],
        ..Default::default()
    };
    scan(case, reference, &bound, out, 0..rows, &mut survey);
    let outside = (case.rows() as u64 * cols as u64).saturating_sub(survey.inside);
    if outside > 0 {
        survey
            .counts
            .insert(CellClass::Outside.name().to_string(), outside);
    }
    let whole_case = survey.bbox.is_none();
    let (row_start, row_end, col_start, col_end) = match survey.bbox {
        None => (0, case.rows(), 0, cols),
        Some((rmin, rmax, cmin, cmax)) => {
            let pad = COL_CONTEXT.max((cmax - cmin + 1) / 8);
            (
                rmin.saturating_sub(ROW_CONTEXT),
                (rmax + 1 + ROW_CONTEXT).min(case.rows()),
                cmin.saturating_sub(pad),
                (cmax + 1 + pad).min(cols),
            )
        }
    };
    let rows_per_cell = (row_end - row_start).div_ceil(MAX_CELL_ROWS).max(1);
    let cols_per_cell = (col_end - col_start).div_ceil(MAX_CELL_COLS).max(1);
    let n_rows = (row_end - row_start).div_ceil(rows_per_cell);
    let n_cols = (col_end - col_start).div_ceil(cols_per_cell);
    let mut cells = Cells {
        window: (row_start, row_end, col_start, col_end),
        per_cell: (rows_per_cell, cols_per_cell),
        grid: vec![vec![None; n_cols]; n_rows],
    };
    scan(case, reference, &bound, out, row_start..row_end, &mut cells);
    let cells = cells
        .grid
        .iter()
        .map(|line| {
            line.iter()
                .map(|c| c.unwrap_or(CellClass::Outside).code())
                .collect()
        })
        .collect();
    let map = ClassMap {
        rows: case.rows(),
        cols,
        row_start,
        row_end,
        col_start,
        col_end,
        rows_per_cell,
        cols_per_cell,
        cells,
        counts: survey.counts,
        whole_case,
    };
    (map, survey.hist)
}

/// The class map of a case (see [`draw`]).
pub fn class_map(
    case: &Case,
    reference: &Reference,
    caps: &Capabilities,
    out: &OutputBuffer,
) -> ClassMap {
    draw(case, reference, caps, out).0
}

/// Counts of `|err| / bound` over V(r) in the bins of [`HISTOGRAM_BINS`].
pub fn error_histogram(
    case: &Case,
    reference: &Reference,
    caps: &Capabilities,
    out: &OutputBuffer,
) -> Vec<u64> {
    draw(case, reference, caps, out).1
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
