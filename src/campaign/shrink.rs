//! Shrinking: proptest's value tree of the failing case's seed is simplified step by
//! step; a step is kept only when it still shows the *same bug*: the original class
//! and, for a crash, the same normalised reason ([`crate::finding::shows`]), on a
//! case no larger than the best so far (rows, then tokens, then shape). A step
//! that fails differently is another bug: it is rejected here and handed back in
//! [`Shrunk::others`], for the finding book to file as a finding of its own. Because
//! every strategy component shrinks toward its simplest value (fewer sequences, length
//! 0, one head, the first alternative), the result has the fewest rows, shortest
//! lengths and smallest shapes that still fail. An interrupt or the time budget ends
//! shrinking with the best case so far, which is always a real failing case.

use super::subject::{ablation_outcome, Ctx, Evidence, Failure, Subject};
use super::{interrupt, value_tree, Engine};
use crate::case::Case;
use crate::finding::{ablate, crash_reason, RunCost, Trigger};
use crate::generate::Recipe;
use crate::oracle::{Class, Verdict};
use crate::report::ShrinkCut;
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
    /// Shrinking stopped because its time budget ran out (not at its end).
    pub timed_out: bool,
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
            timed_out: false,
        }
    }
}

/// Largest number of candidate cases tried for one finding.
const MAX_STEPS: u32 = 2000;

/// Consecutive candidates skipped as too slow for what is left, after which shrinking
/// stops (out of time).
const MAX_SKIPPED: u32 = 16;

/// Shrinks the failure of case `(k, seed)`: `run` judges a candidate, `keep` says
/// whether its verdict still shows the bug being shrunk. `cost`: the guess of a step's
/// time (from the failing case's own judging, to start with), learnt from each step.
pub(super) fn shrink(
    engine: &Engine,
    run: &dyn Fn(&Case) -> (Verdict, Option<Evidence>),
    keep: &dyn Fn(&Verdict) -> bool,
    (k, seed): (u64, u64),
    start: (&Case, &Verdict),
    budget: Duration,
    cost: &mut RunCost,
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
    // A step that would end past the budget is not started ([`RunCost`]): one too slow
    // for what is left is passed over as if it did not fail, so cheaper ones are tried;
    // after MAX_SKIPPED of them in a row shrinking stops.
    let mut skipped = 0;
    loop {
        if began.elapsed() >= budget || skipped >= MAX_SKIPPED {
            best.timed_out = true;
            break;
        }
        if interrupt::requested() || steps >= MAX_STEPS {
            break;
        }
        // A step is the candidate's materialisation and its judging: both are timed
        // (a production candidate's pool takes a while to lay out on a busy host).
        let made = Instant::now();
        let (recipe, cand, _) = engine.materialize(&engine.in_epoch(k, tree.current()));
        let made = made.elapsed();
        if began.elapsed() + cost.guess(&cand) >= budget {
            skipped += 1;
            if !tree.complicate() {
                best.timed_out = true;
                break;
            }
            continue;
        }
        skipped = 0;
        steps += 1;
        let mut fails = false;
        if cand.validate().is_ok() {
            let t0 = Instant::now();
            let (verdict, evidence) = run(&cand);
            cost.record(&cand, made + t0.elapsed());
            if !keep(&verdict) {
                // Another failure met on the way: kept once per class and crash reason.
                if let Some(class) = verdict.primary_class() {
                    let id = (class, crash_reason(&verdict));
                    if !seen.contains(&id) {
                        seen.push(id);
                        best.others.push((recipe, cand, verdict));
                    }
                }
            } else if size(&cand) <= size(&best.case) {
                fails = true;
                best = Shrunk {
                    recipe,
                    case: cand,
                    verdict,
                    steps,
                    shrunk: true,
                    others: std::mem::take(&mut best.others),
                    evidence,
                    timed_out: false,
                };
            }
            // Otherwise the failure holds on a case simpler to the value tree but larger
            // (a production draw's pinned max_model_len lengthens its longest sequence
            // when the draw's own shrinks): taken as a pass, so the tree stays at the
            // best case instead of wandering among cases larger than it.
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

/// Shrinks a failure (when it can be regenerated from its seed) and ablates its
/// trigger, within what the campaign's [`super::allowance`] grants: shrinking takes
/// three quarters, ablation the rest plus what shrinking left unused. Returns the
/// shrunk case, its trigger and, when a campaign cap cut it short, why. Without
/// shrinking (`--no-shrink`) the failure is kept as it is, with an empty trigger.
pub(super) fn simplify(
    ctx: &mut Ctx,
    subject: &Subject,
    f: &Failure,
    keep: &dyn Fn(&Verdict) -> bool,
) -> (Shrunk, Trigger, Option<ShrinkCut>) {
    let engine = ctx.engine;
    if !engine.cfg.shrink {
        let s = Shrunk::unshrunk(&f.recipe, &f.case, &f.verdict);
        return (s, Trigger::not_ablated("not ablated: --no-shrink"), None);
    }
    let t0 = Instant::now();
    let grant = ctx.allowance.grant(ctx.deadline.is_some());
    let budget = grant.budget;
    // The first step's guess: from how long the failing case itself took, not from
    // another finding's cases.
    if f.run_secs > 0.0 {
        ctx.allowance
            .run_cost
            .calibrate(&f.case, Duration::from_secs_f64(f.run_secs));
    }
    let shrunk = match f.origin {
        Some(origin) if !budget.is_zero() => shrink(
            engine,
            &|c: &Case| subject.judge(engine, c),
            keep,
            origin,
            (&f.case, &f.verdict),
            budget * 3 / 4,
            &mut ctx.allowance.run_cost,
        ),
        Some(_) => Shrunk {
            timed_out: true,
            ..Shrunk::unshrunk(&f.recipe, &f.case, &f.verdict)
        },
        None => Shrunk::unshrunk(&f.recipe, &f.case, &f.verdict),
    };
    // A shrink step on a large case can overrun its three quarters: ablation still gets
    // a quarter of the budget, so a trigger is not lost to it; but not past a campaign
    // cap, which shrinking would then overrun by more than the floor.
    let end = match grant.limit {
        None => grant.end().max(Instant::now() + budget / 4),
        Some(_) => grant.end(),
    };
    let (trigger, _runs) = ablate(
        &shrunk.recipe,
        &mut |c: &Case| ablation_outcome(&subject.judge(engine, c).0, keep),
        end,
        &mut ctx.allowance.run_cost,
    );
    ctx.timings.shrink_secs += t0.elapsed().as_secs_f64();
    let out_of_time = shrunk.timed_out || (!trigger.complete && !interrupt::requested());
    let cut = ctx.allowance.charge(&grant, out_of_time);
    (shrunk, trigger, cut)
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
