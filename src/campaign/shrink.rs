//! Shrinking: proptest's value tree of the failing case's seed is simplified step by
//! step; a step is kept when the same kernel still shows the same class. Because every
//! strategy component shrinks toward its simplest value (fewer sequences, length 0,
//! one head, the first alternative), the result has the fewest rows, shortest lengths
//! and smallest shapes that still fail. An interrupt or the time budget ends shrinking
//! with the best case so far, which is always a real failing case.

use super::{interrupt, value_tree, Engine};
use crate::case::Case;
use crate::generate::Recipe;
use crate::harness::{self, ReferenceCache};
use crate::kernel::Kernel;
use crate::oracle::{Class, Verdict};
use std::time::{Duration, Instant};

pub struct Shrunk {
    pub recipe: Recipe,
    pub case: Case,
    pub verdict: Verdict,
    pub steps: u32,
    pub shrunk: bool,
}

/// Largest number of candidate cases tried for one finding.
const MAX_STEPS: u32 = 2000;

pub(super) fn shrink(
    engine: &Engine,
    kern: &dyn Kernel,
    class: Class,
    origin: (u64, u64),
    case: &Case,
    verdict: &Verdict,
    budget: Duration,
) -> Shrunk {
    shrink_with(
        engine,
        &|cand: &Case| {
            let mut refs = ReferenceCache::new(cand);
            let j = harness::run_and_judge(kern, cand, &mut refs, &engine.cfg.oracle);
            j.verdict.classes.contains_key(&class).then_some(j.verdict)
        },
        origin,
        case,
        verdict,
        budget,
    )
}

/// [`shrink`] with any failure test: `fails` returns the candidate's verdict when it
/// still shows the failure (a divergence between two kernels is shrunk this way).
pub(super) fn shrink_with(
    engine: &Engine,
    fails: &dyn Fn(&Case) -> Option<Verdict>,
    (k, seed): (u64, u64),
    case: &Case,
    verdict: &Verdict,
    budget: Duration,
) -> Shrunk {
    let start = Instant::now();
    let mut tree = value_tree(&engine.strategy(k), seed);
    let (recipe, _, _) = engine.materialize(&tree.current());
    let mut best = Shrunk {
        recipe,
        case: case.clone(),
        verdict: verdict.clone(),
        steps: 0,
        shrunk: false,
    };
    if !tree.simplify() {
        return best;
    }
    let mut steps = 0;
    loop {
        if interrupt::requested() || start.elapsed() >= budget || steps >= MAX_STEPS {
            break;
        }
        steps += 1;
        let (recipe, cand, _) = engine.materialize(&tree.current());
        let fails = cand.validate().is_ok() && {
            match fails(&cand) {
                Some(verdict) => {
                    if size(&cand) <= size(&best.case) {
                        best = Shrunk {
                            recipe,
                            case: cand,
                            verdict,
                            steps,
                            shrunk: true,
                        };
                    }
                    true
                }
                None => false,
            }
        };
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
