//! The one element scan: every element of V(r) is classified here, once, with the
//! oracle's rules, and handed to an [`ElementSink`]. The verdict
//! ([`super::judge`]) and a finding's picture ([`super::picture`]) are two sinks of
//! the same scan, so they can never disagree about an element.

use super::{classify, Class, ElementClass, ErrorBound};
use crate::case::Case;
use crate::kernel::{OutputBuffer, POISON_BITS};
use crate::reference::{self, Reference, RowMagnitudes, RowReference};
use std::ops::Range;

/// How the oracle saw one element of V(r).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Seen {
    /// Finite, and outside the reference sample: not judged.
    Unchecked,
    /// The exact value is not a finite f32 (hostile inputs): reported, not judged.
    Undefined,
    /// Within its bound; `bound` is what `|err|` is measured against (the cheap lower
    /// bound while the error is small against it, else the full one).
    Ok { err: f64, bound: f64 },
    /// A finding; `bound` is the full bound where one applies (finite values).
    Finding { class: Class, bound: Option<f64> },
}

/// One element of V(r) as the oracle saw it.
#[derive(Clone, Copy, Debug)]
pub struct Element {
    pub row: usize,
    pub pos: usize,
    pub got: f32,
    /// The exact value (`None` for an unchecked element).
    pub expected: Option<f64>,
    /// Whether the element is in the reference (dense rows: all; sampled: the listed
    /// positions). Elements outside it are judged only when not finite.
    pub listed: bool,
    pub seen: Seen,
}

impl Element {
    /// `|err| / bound` for the error histogram: `Some(Some(x))` for a finite value with
    /// a defined reference, `Some(None)` for NaN/±inf/unwritten, `None` when the element
    /// is not judged (unchecked, undefined).
    pub fn ratio(&self) -> Option<Option<f64>> {
        match self.seen {
            Seen::Unchecked | Seen::Undefined => None,
            Seen::Ok { err, bound } => Some(Some(ratio(err, bound))),
            Seen::Finding { bound, .. } if self.got.is_finite() => {
                let err = (self.got as f64 - self.expected.unwrap_or(f64::NAN)).abs();
                Some(Some(bound.map_or(f64::INFINITY, |b| ratio(err, b))))
            }
            Seen::Finding { .. } => Some(None),
        }
    }

    /// Whether `nan_to_num_(-inf)` would change this element: a NaN, ±inf or surviving
    /// poison where the exact value is a finite f32.
    pub fn guard_would_change(&self) -> bool {
        !self.got.is_finite() && self.seen != Seen::Undefined
    }
}

fn ratio(err: f64, bound: f64) -> f64 {
    if bound > 0.0 {
        err / bound
    } else if err == 0.0 {
        0.0
    } else {
        f64::INFINITY
    }
}

/// What consumes the scan.
pub trait ElementSink {
    fn element(&mut self, e: &Element);
    /// Whether an accepted element whose error is `err` against a cheap bound `lower`
    /// must be measured against its full bound, which costs a D×H recomputation. By
    /// default whenever the error is a noticeable part of the cheap bound, so every
    /// ratio is close to exact (the picture's histogram). A sink that keeps only the
    /// largest ratio asks only where the element could raise it (`err / lower` is at
    /// least `err / full`).
    fn wants_full_bound(&self, err: f64, lower: f64) -> bool {
        err > 0.25 * lower
    }
    /// Whether full bounds come from the plain per-element [`reference::element`]
    /// (the old judge, kept for `bench judge`) instead of [`RowMagnitudes`]: the same
    /// bits, many times slower.
    fn plain_magnitudes(&self) -> bool {
        false
    }
    /// After the elements of row `r`: the whole output row (V(r) is `row[..len]`) and
    /// the row's reference, if computed.
    fn row_end(&mut self, _r: usize, _row: &[f32], _len: usize, _rref: Option<&RowReference>) {}
}

/// Classifies every element of V(r) of `rows` and feeds `sink`.
pub fn scan<S: ElementSink>(
    case: &Case,
    reference: &Reference,
    bound: &ErrorBound,
    out: &OutputBuffer,
    rows: Range<usize>,
    sink: &mut S,
) {
    let end = rows.end.min(case.rows()).min(out.rows);
    for r in rows.start..end {
        let row = out.row(r);
        let len = case.valid_len(r).min(row.len());
        let rref = reference.rows.get(r).and_then(|x| x.as_ref());
        let mut listed = rref.map(|rr| rr.elements().take_while(|&(t, _, _)| t < len).peekable());
        let batch = unlisted_batch(case, reference, rref, (r, &row[..len]));
        let mut batched = batch.as_ref().map(|b| b.elements().peekable());
        let mut bounded = 0;
        let mut mags = None;
        for (t, &got) in row[..len].iter().enumerate() {
            let e = match listed
                .as_mut()
                .and_then(|it| it.next_if(|&(p, _, _)| p == t))
            {
                Some((_, exp, relu_mag)) => {
                    let wants = |err: f64, lower: f64| sink.wants_full_bound(err, lower);
                    let e = (got, exp, relu_mag);
                    let mags = match sink.plain_magnitudes() {
                        true => Magnitudes::Plain(reference),
                        false => Magnitudes::Row(&mut mags),
                    };
                    listed_element(case, bound, mags, (r, t), e, wants)
                }
                None if got.is_finite() => Element {
                    row: r,
                    pos: t,
                    got,
                    expected: None,
                    listed: false,
                    seen: Seen::Unchecked,
                },
                None => match batched
                    .as_mut()
                    .and_then(|it| it.next_if(|&(p, _, _)| p == t))
                {
                    Some((_, exp, relu_mag)) => {
                        // The first few get their full bound (what examples show).
                        bounded += 1;
                        let abs_mag = (bounded <= BOUNDED_UNLISTED)
                            .then(|| Magnitudes::Row(&mut mags).abs_mag(case, r, t));
                        batched_element(bound, (r, t), got, (exp, relu_mag, abs_mag))
                    }
                    None => unlisted_element(case, reference, bound, (r, t), got),
                },
            };
            sink.element(&e);
        }
        sink.row_end(r, row, len, rref);
    }
}

/// Where an element's `abs_mag` comes from.
enum Magnitudes<'m, 'c> {
    /// The row's, decoded on first use.
    Row(&'m mut Option<RowMagnitudes<'c>>),
    /// [`reference::element`], one element at a time.
    Plain(&'m Reference),
}

impl<'c> Magnitudes<'_, 'c> {
    fn abs_mag(&mut self, case: &'c Case, r: usize, t: usize) -> f64 {
        match self {
            Magnitudes::Row(m) => m
                .get_or_insert_with(|| RowMagnitudes::new(case, r))
                .abs_mag(t),
            Magnitudes::Plain(reference) => reference::element(case, reference.placement, r, t).2,
        }
    }
}

/// An element with a reference value: classified, with the bound its error is
/// measured against. `mags` holds the row's decoded queries once a full bound was
/// needed in it.
fn listed_element<'c>(
    case: &'c Case,
    bound: &ErrorBound,
    mut mags: Magnitudes<'_, 'c>,
    (r, t): (usize, usize),
    (got, exp, relu_mag): (f32, f64, f64),
    wants_full_bound: impl Fn(f64, f64) -> bool,
) -> Element {
    let mut asked = None;
    let class = classify(got, exp, relu_mag, bound, || {
        *asked.insert(mags.abs_mag(case, r, t))
    });
    let full_bound = asked.map(|a| bound.full(relu_mag, a));
    let seen = match class {
        ElementClass::Ok => {
            let err = (got as f64 - exp).abs();
            // The cheap lower bound accepted it; for the reported ratio use the full
            // bound where the sink asks for it, so "max err/bound" is not inflated by
            // the cheap shortcut.
            let b = full_bound.unwrap_or_else(|| {
                let lo = bound.lower(relu_mag);
                if wants_full_bound(err, lo) {
                    bound.full(relu_mag, mags.abs_mag(case, r, t))
                } else {
                    lo
                }
            });
            Seen::Ok { err, bound: b }
        }
        ElementClass::Undefined => Seen::Undefined,
        ElementClass::Finding(class) => Seen::Finding {
            class,
            bound: full_bound,
        },
    };
    Element {
        row: r,
        pos: t,
        got,
        expected: Some(exp),
        listed: true,
        seen,
    }
}

/// Unlisted non-finite elements of a row from which their references are computed
/// together by the fast path (one GEMM for the row) rather than one plain
/// `reference::element` each: a kernel that writes NaN over whole rows put 4.4 M of
/// them in one case of a CPU campaign, 87 s of judging one at a time.
const BATCH_UNLISTED: usize = 16;
/// Of a batch, the elements given their full bound (a D×H recomputation each): the
/// first of a row, which are the ones a verdict's examples show.
const BOUNDED_UNLISTED: usize = 8;

/// The references of row `r`'s non-finite elements outside its sample, computed
/// together when there are at least [`BATCH_UNLISTED`] of them.
fn unlisted_batch(
    case: &Case,
    reference: &Reference,
    rref: Option<&RowReference>,
    (r, row): (usize, &[f32]),
) -> Option<RowReference> {
    if rref.is_some_and(|rr| rr.is_dense()) {
        return None;
    }
    let listed = rref.and_then(|rr| rr.positions.as_deref()).unwrap_or(&[]);
    let positions: Vec<usize> = (0..row.len())
        .filter(|&t| !row[t].is_finite() && listed.binary_search(&t).is_err())
        .collect();
    if positions.len() < BATCH_UNLISTED {
        return None;
    }
    let mut wants = vec![None; case.rows()];
    wants[r] = Some(reference::fast::Want::Sparse(positions));
    let mut rows =
        reference::fast::compute(case, reference.placement, &wants, reference::Backend::Fused);
    rows[r].take()
}

/// A non-finite element outside the reference sample with its reference (computed in a
/// batch, [`unlisted_batch`], or alone); `abs_mag` where its full bound is wanted.
fn batched_element(
    bound: &ErrorBound,
    (r, t): (usize, usize),
    got: f32,
    (exp, relu_mag, abs_mag): (f64, f64, Option<f64>),
) -> Element {
    let seen = match classify(got, exp, relu_mag, bound, || abs_mag.unwrap_or(0.0)) {
        ElementClass::Finding(class) => Seen::Finding {
            class,
            bound: abs_mag.map(|a| bound.full(relu_mag, a)),
        },
        ElementClass::Undefined => Seen::Undefined,
        ElementClass::Ok => Seen::Ok {
            err: 0.0,
            bound: 0.0,
        },
    };
    debug_assert!(got.to_bits() == POISON_BITS || !got.is_finite());
    Element {
        row: r,
        pos: t,
        got,
        expected: Some(exp),
        listed: false,
        seen,
    }
}

/// A NaN, ±inf or poison outside the reference sample, judged against that one
/// element's plain reference (a sampled verdict is never "clean" while the guard says
/// it is needed).
fn unlisted_element(
    case: &Case,
    reference: &Reference,
    bound: &ErrorBound,
    (r, t): (usize, usize),
    got: f32,
) -> Element {
    let (exp, relu_mag, abs_mag) = reference::element(case, reference.placement, r, t);
    batched_element(bound, (r, t), got, (exp, relu_mag, Some(abs_mag)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::ScalePlacement;
    use crate::generate::Recipe;
    use crate::reference::{PositionSet, RowSelection};
    use std::collections::BTreeMap;

    /// Collects what the scan saw.
    struct Collect(Vec<Element>);
    impl ElementSink for Collect {
        fn element(&mut self, e: &Element) {
            self.0.push(*e);
        }
    }

    /// A row of NaNs outside a sampled reference: past [`BATCH_UNLISTED`] of them their
    /// references come from one fast-path batch, and every element is seen exactly as
    /// the one-at-a-time path sees it (class and exact value; the first few with the
    /// same full bound).
    #[test]
    fn a_batch_of_unlisted_nans_is_judged_as_one_at_a_time() {
        let case = Recipe::small(vec![300, 40], 2, 7).materialize();
        let placement = ScalePlacement::AfterReluSum;
        let map: BTreeMap<usize, PositionSet> = [
            (0, PositionSet::Some(vec![0, 5, 299])),
            (2, PositionSet::Some(vec![1])),
        ]
        .into();
        let reference = crate::reference::compute(&case, placement, &RowSelection::Positions(map));
        let bound = ErrorBound::for_kernel(crate::kernel::Accumulation::F32, &case.shape);
        let mut out = OutputBuffer::for_case(&case);
        out.interior_mut().fill(1.0);
        for t in 0..case.valid_len(0) {
            out.set(0, t, if t % 3 == 0 { f32::NAN } else { 1.0 });
        }
        for t in 0..5 {
            out.set(2, t, f32::INFINITY);
        }
        let mut sink = Collect(Vec::new());
        scan(&case, &reference, &bound, &out, 0..case.rows(), &mut sink);
        let unlisted: Vec<&Element> = sink
            .0
            .iter()
            .filter(|e| !e.listed && e.expected.is_some())
            .collect();
        let batched = unlisted.iter().filter(|e| e.row == 0).count();
        assert!(batched >= BATCH_UNLISTED, "row 0 is batched: {batched}");
        let mut bounded = 0;
        for e in &unlisted {
            let one = unlisted_element(&case, &reference, &bound, (e.row, e.pos), e.got);
            assert_eq!(
                e.expected.map(f64::to_bits),
                one.expected.map(f64::to_bits),
                "{e:?}"
            );
            match (e.seen, one.seen) {
                (
                    Seen::Finding {
                        class: a,
                        bound: ba,
                    },
                    Seen::Finding {
                        class: b,
                        bound: bb,
                    },
                ) => {
                    assert_eq!(a, b);
                    if let Some(ba) = ba {
                        bounded += 1;
                        assert_eq!(Some(ba), bb, "{e:?}");
                    }
                }
                (a, b) => assert_eq!(a, b, "{e:?}"),
            }
        }
        // Row 0's first few and row 2's four unlisted (too few to batch) carry bounds.
        assert_eq!(bounded, BOUNDED_UNLISTED + 4);
    }
}
