//! Shrinking: proptest's value tree of the failing case's seed is simplified step by
//! step; a step is kept only when it still shows the *same bug*: the original class
//! and, for a crash, the same normalised reason ([`crate::finding::shows`]). A step
//! that fails differently is another bug: it is rejected here and handed back in
//! [`Shrunk::others`], for the finding book to file as a finding of its own. Because
//! every strategy component shrinks toward its simplest value (fewer sequences, length
//! 0, one head, the first alternative), the result has the fewest rows, shortest
//! lengths and smallest shapes that still fail. An interrupt or the time budget ends
//! shrinking with the best case so far, which is always a real failing case.

use super::book::Evidence;
use super::{interrupt, value_tree, Engine};
use crate::case::Case;
use crate::finding::crash_reason;
use crate::generate::Recipe;
use crate::oracle::{Class, Verdict};
use std::time::{Duration, Instant};

pub struct Shrunk {
    pub recipe: Recipe,
    pub case: Case,
    pub verdict: Verdict,
    pub steps: u32,
    pub shrunk: bool,
    /// Candidates that failed with another class or crash reason (one per pair).
    pub others: Vec<(Recipe, Case, Verdict)>,
    /// The output of `case` with its reference, when the last accepted step left one
    /// (the finding's picture is drawn from it).
    pub evidence: Option<Evidence>,
}

impl Shrunk {
    /// The unshrunk failure as it is.
    pub fn unshrunk(recipe: &Recipe, case: &Case, verdict: &Verdict) -> Shrunk {
        Shrunk {
            recipe: recipe.clone(),
            case: case.clone(),
            verdict: verdict.clone(),
            steps: 0,
            shrunk: false,
            others: Vec::new(),
            evidence: None,
        }
    }
}

/// Largest number of candidate cases tried for one finding.
const MAX_STEPS: u32 = 2000;

/// Shrinks the failure of case `(k, seed)`: `run` judges a candidate, `keep` says
/// whether its verdict still shows the bug being shrunk.
pub(super) fn shrink(
    engine: &Engine,
    run: &dyn Fn(&Case) -> (Verdict, Option<Evidence>),
    keep: &dyn Fn(&Verdict) -> bool,
    (k, seed): (u64, u64),
    start: (&Case, &Verdict),
    budget: Duration,
) -> Shrunk {
    let began = Instant::now();
    let mut tree = value_tree(&engine.strategy(k), seed);
    // Shrink steps keep the epoch's compile key: a shrink never waits for a compiler.
    let (recipe, _, _) = engine.materialize(&engine.in_epoch(k, tree.current()));
    let mut best = Shrunk::unshrunk(&recipe, start.0, start.1);
    if !tree.simplify() {
        return best;
    }
    let mut seen: Vec<(Class, Option<String>)> = Vec::new();
    let mut steps = 0;
    loop {
        if interrupt::requested() || began.elapsed() >= budget || steps >= MAX_STEPS {
            break;
        }
        steps += 1;
        let (recipe, cand, _) = engine.materialize(&engine.in_epoch(k, tree.current()));
        let mut fails = false;
        if cand.validate().is_ok() {
            let (verdict, evidence) = run(&cand);
            if keep(&verdict) {
                fails = true;
                if size(&cand) <= size(&best.case) {
                    best = Shrunk {
                        recipe,
                        case: cand,
                        verdict,
                        steps,
                        shrunk: true,
                        others: std::mem::take(&mut best.others),
                        evidence,
                    };
                }
            } else if let Some(class) = verdict.primary_class() {
                let id = (class, crash_reason(&verdict));
                if !seen.contains(&id) {
                    seen.push(id);
                    best.others.push((recipe, cand, verdict));
                }
            }
        }
        let more = if fails {
            tree.simplify()
        } else {
            tree.complicate()
        };
        if !more {
            break;
        }
    }
    best.steps = steps;
    best
}

/// Ordering of case sizes: rows, then tokens, then shape.
fn size(c: &Case) -> (usize, usize, usize, usize) {
    let tokens = (0..c.shape.batch).map(|b| c.seq_tokens(b)).sum();
    (
        c.rows(),
        tokens,
        c.shape.heads * c.shape.head_dim,
        c.shape.block_size,
    )
}
