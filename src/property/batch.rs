//! Batch invariance: a sequence's rows must not depend on its neighbours or on its
//! position in the batch. One sequence of the case is re-run alone and with the batch
//! reversed, each time on the same physical blocks of the same KV pool (same block
//! ids, same cache, same strides, same output row stride), and its rows are compared
//! bitwise with the batched run. A difference counts only when the batch, run again,
//! reproduces its own bits: a nondeterministic kernel is not also called batch-variant.
//!
//! The sub-cases are plain data transforms ([`sub_batch`], [`alone`], [`reversed`]).

use super::{compare_rows, rerun, rerun_digests, show, Break, Diff, Outcome};
use crate::case::{BlockTable, Case, ContextLens};
use crate::kernel::{Kernel, OutputBuffer, RunError};

/// The case whose batch is `order` (sequence indices of `case`, each at most once):
/// sequence `order[j]` becomes sequence `j`, with its lengths, block-table row, queries
/// and weights. The KV pool is kept whole (every stored block, the same ids, the same
/// stride and block count), and so are `max_model_len` and the output row stride: the
/// sequence reads the same physical blocks it read in the batch.
pub fn sub_batch(case: &Case, order: &[usize]) -> Case {
    let s = &case.shape;
    let n = s.next_n;
    let mut shape = s.clone();
    shape.batch = order.len();
    let context_lens = match &case.context_lens {
        ContextLens::PerSequence(v) => {
            ContextLens::PerSequence(order.iter().map(|&b| v[b]).collect())
        }
        ContextLens::PerToken(v) => {
            ContextLens::PerToken(order.iter().map(|&b| v[b].clone()).collect())
        }
    };
    let t = &case.block_table;
    let entries = order
        .iter()
        .flat_map(|&b| (0..t.row_stride).map(move |j| t.get(b, j) as i32))
        .collect();
    let q_seq = n * s.heads * s.head_dim;
    let w_seq = n * s.heads;
    Case {
        shape,
        num_blocks: case.num_blocks,
        kv_block_stride: case.kv_block_stride,
        context_lens,
        block_table: BlockTable::whole(t.max_blocks, t.row_stride, entries),
        max_model_len: case.max_model_len,
        out_row_stride: case.out_row_stride,
        q: order
            .iter()
            .flat_map(|&b| case.q[b * q_seq..(b + 1) * q_seq].iter().copied())
            .collect(),
        weights: order
            .iter()
            .flat_map(|&b| case.weights[b * w_seq..(b + 1) * w_seq].iter().copied())
            .collect(),
        kv: case.kv.clone(),
    }
}

/// Sequence `b` of `case` alone (a batch of one).
pub fn alone(case: &Case, b: usize) -> Case {
    sub_batch(case, &[b])
}

/// `case` with its batch reversed: sequence `b` moves to `B - 1 - b`.
pub fn reversed(case: &Case) -> Case {
    let order: Vec<usize> = (0..case.shape.batch).rev().collect();
    sub_batch(case, &order)
}

/// The sequence to check: the longest one that the reversal moves (on ties the first),
/// or `None` when the case has one sequence or no valid position to compare.
pub fn chosen_sequence(case: &Case) -> Option<usize> {
    let bsz = case.shape.batch;
    if bsz < 2 {
        return None;
    }
    let n = case.shape.next_n;
    let valid = |b: usize| (0..n).map(|i| case.valid_len(b * n + i)).sum::<usize>();
    (0..bsz)
        .filter(|&b| b != bsz - 1 - b && valid(b) > 0)
        .max_by_key(|&b| (valid(b), std::cmp::Reverse(b)))
}

/// A variant of the batch: what it is, the sub-case, where the sequence sits in it.
type SubBatch = (&'static str, Case, usize);

/// The sequence to check and its two variants, `(what, sub-case, its sequence there)`:
/// alone, and with the batch reversed; `Err(skipped)` when there is none to check.
fn variants(case: &Case) -> Result<(usize, [SubBatch; 2]), Outcome> {
    let Some(b) = chosen_sequence(case) else {
        let why = if case.shape.batch < 2 {
            "one sequence"
        } else {
            "no valid position in a sequence the reversal moves"
        };
        return Err(Outcome::Skipped(why.into()));
    };
    let bsz = case.shape.batch;
    Ok((
        b,
        [
            ("alone", alone(case, b), 0),
            ("with the batch reversed", reversed(case), bsz - 1 - b),
        ],
    ))
}

/// A variant that did not run: not checkable on this case.
fn not_run(what: &str, e: RunError) -> Outcome {
    Outcome::Skipped(match e {
        RunError::Crash(m) => format!("the sequence {what} crashed: {}", first_line(&m)),
        RunError::Skipped(m) | RunError::Environment(m) => {
            format!("the sequence {what} did not run: {m}")
        }
    })
}

/// Runs sequence [`chosen_sequence`] alone and the batch reversed, compares its rows
/// bitwise with `batched` (the first run of `case`). Returns the outcome and the runs.
pub fn check(kernel: &dyn Kernel, case: &Case, batched: &OutputBuffer) -> (Outcome, u64) {
    let (b, variants) = match variants(case) {
        Ok(v) => v,
        Err(skipped) => return (skipped, 0),
    };
    let bsz = case.shape.batch;
    let n = case.shape.next_n;
    let mut runs = 0;
    let mut seen: Vec<(String, Diff)> = Vec::new();
    for (what, sub, at) in variants {
        runs += 1;
        let out = match rerun(kernel, &sub) {
            Ok(o) => o,
            Err(e) => return (not_run(what, e), runs),
        };
        let mut d = Diff::default();
        compare_rows(
            &mut d,
            batched,
            &out,
            (0..n).map(|i| (b * n + i, at * n + i, case.valid_len(b * n + i))),
        );
        if d.differing > 0 {
            seen.push((what.to_string(), d));
        }
    }
    if seen.is_empty() {
        return (Outcome::Held, runs);
    }
    // A kernel that is not deterministic differs from itself: run the batch again, and
    // call the difference the batch's only when the batch reproduces its own bits.
    runs += 1;
    match rerun(kernel, case) {
        Ok(again) => {
            let mut d = Diff::default();
            compare_rows(
                &mut d,
                batched,
                &again,
                (0..n).map(|i| (b * n + i, b * n + i, case.valid_len(b * n + i))),
            );
            if d.differing > 0 {
                return (
                    Outcome::Skipped(
                        "the batch does not reproduce its own bits (not deterministic)".into(),
                    ),
                    runs,
                );
            }
        }
        Err(e) => {
            return (
                Outcome::Skipped(format!(
                    "the batch re-run failed: {}",
                    first_line(&e.to_string())
                )),
                runs,
            )
        }
    }
    let (what, d) = &seen[0];
    let (r, t, x, y) = d.first.expect("a differing variant has a first difference");
    let valid: usize = (0..n).map(|i| case.valid_len(b * n + i)).sum();
    let differing = seen.iter().map(|(_, d)| d.differing).max().unwrap_or(0);
    let max_abs = seen.iter().map(|(_, d)| d.max_abs).fold(0.0, f64::max);
    let max_ulps = seen.iter().map(|(_, d)| d.max_ulps).max().unwrap_or(0);
    let names: Vec<&str> = seen.iter().map(|(w, _)| w.as_str()).collect();
    let detail = format!(
        "sequence {b} of {bsz} differs {}; first {what} at row {r} position {t}: batched {} vs {} ({} of its {valid} valid elements differ; {})",
        names.join(" and "),
        show(x),
        show(y),
        d.differing,
        d.spread_words()
    );
    (
        Outcome::Broken(Break {
            differing,
            first: Some((r, t)),
            values: vec![show(x), show(y)],
            max_abs_diff: max_abs,
            max_ulps,
            detail,
        }),
        runs,
    )
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

/// [`check`] for a batch judged on the device: the sequence alone and the batch reversed
/// run judged there too, their rows compared by digests of V(r) with the batch's. Where
/// one differs, the batch is run again with its output fetched and [`check`]ed element
/// by element (which also tells a nondeterministic kernel from a batch-variant one).
pub fn check_digests(
    kernel: &dyn Kernel,
    case: &Case,
    batched: &[u64],
    read_only: bool,
) -> (Outcome, u64) {
    let (b, variants) = match variants(case) {
        Ok(v) => v,
        Err(skipped) => return (skipped, 0),
    };
    let n = case.shape.next_n;
    let mut runs = 0;
    let mut differs = false;
    for (what, sub, at) in variants {
        runs += 1;
        let d = match rerun_digests(kernel, &sub, read_only) {
            Ok(d) => d,
            Err(e) => return (not_run(what, e), runs),
        };
        differs |= (0..n).any(|i| d[at * n + i] != batched[b * n + i]);
    }
    if !differs {
        return (Outcome::Held, runs);
    }
    runs += 1;
    match rerun(kernel, case) {
        Ok(full) => {
            let (o, k) = check(kernel, case, &full);
            (o, runs + k)
        }
        Err(e) => (
            Outcome::Skipped(format!("the fetched batch re-run did not run: {e}")),
            runs,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{LensRecipe, Recipe};

    fn case(lens: Vec<usize>, next_n: usize) -> Case {
        Recipe::small(lens, next_n, 3).materialize()
    }

    #[test]
    fn a_sequence_alone_keeps_its_blocks_lengths_queries_and_weights() {
        let c = case(vec![40, 70, 0, 33], 2);
        let a = alone(&c, 1);
        a.validate().unwrap();
        assert_eq!(a.shape.batch, 1);
        assert_eq!(a.context_lens, ContextLens::PerSequence(vec![70]));
        // The same physical blocks in the same pool.
        assert_eq!(a.kv, c.kv);
        assert_eq!(
            (a.num_blocks, a.kv_block_stride),
            (c.num_blocks, c.kv_block_stride)
        );
        assert_eq!(a.out_row_stride, c.out_row_stride);
        assert_eq!(a.max_model_len, c.max_model_len);
        for j in 0..c.block_table.row_stride {
            assert_eq!(a.block_table.get(0, j), c.block_table.get(1, j));
        }
        for i in 0..2 {
            for h in 0..c.shape.heads {
                assert_eq!(a.q_codes(0, i, h), c.q_codes(1, i, h));
                assert_eq!(a.weight(i, h), c.weight(2 + i, h));
            }
            assert_eq!(a.valid_len(i), c.valid_len(2 + i));
        }
        // Every key a row reads is the same bytes.
        for t in 0..70 {
            assert_eq!(a.token_location(0, t), c.token_location(1, t));
        }
    }

    #[test]
    fn the_reversed_batch_moves_every_sequence_and_keeps_per_token_lengths() {
        let mut r = Recipe::small(vec![], 2, 5);
        r.lens = LensRecipe::PerToken(vec![vec![10, 11], vec![0, 3], vec![20, 19]]);
        let c = r.materialize();
        let rev = reversed(&c);
        rev.validate().unwrap();
        assert_eq!(
            rev.context_lens,
            ContextLens::PerToken(vec![vec![20, 19], vec![0, 3], vec![10, 11]])
        );
        for b in 0..3 {
            let to = 2 - b;
            assert_eq!(rev.seq_tokens(to), c.seq_tokens(b));
            for t in 0..c.seq_tokens(b) {
                assert_eq!(rev.token_location(to, t), c.token_location(b, t));
            }
            for h in 0..c.shape.heads {
                assert_eq!(rev.q_codes(to, 1, h), c.q_codes(b, 1, h));
            }
        }
        // Reversing twice is the identity.
        assert_eq!(reversed(&rev), c);
    }

    #[test]
    fn the_chosen_sequence_is_the_longest_that_moves() {
        // Sequence 1 is the middle of three: reversal leaves it in place.
        assert_eq!(chosen_sequence(&case(vec![5, 90, 30], 1)), Some(2));
        assert_eq!(chosen_sequence(&case(vec![50, 9], 1)), Some(0));
        assert_eq!(chosen_sequence(&case(vec![50], 1)), None);
        assert_eq!(chosen_sequence(&case(vec![0, 0], 1)), None);
    }
}
