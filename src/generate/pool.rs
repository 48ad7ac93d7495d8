//! The serving engine's KV block allocator, simulated: where a decode batch's blocks sit
//! in the pool after hours of other requests coming and going.
//!
//! The model is vLLM's `BlockPool`: `blocks` slots, slot 0 reserved as the null block
//! (table padding points there), a free queue that hands out blocks from its front and
//! takes freed blocks at its back, a request's blocks freed together (last block first).
//! A fresh engine hands out ids 1, 2, 3…; after enough churn the front of the queue has
//! cycled through the whole pool and a request's blocks are scattered over it, so byte
//! offsets `id * stride` past 2^31 and 2^32 are ordinary for a multi-GiB pool.
//!
//! A batch request arrives at a random moment of the simulated history and allocates
//! its prompt in one piece, then grows block by block (decode) in up to
//! [`GROWTH_STEPS`] steps at later moments, interleaved with the other requests'
//! allocations: the long requests of a real batch are exactly the scattered ones.
//! The free queue is kept as runs of consecutive ids, so a pool of millions of slots
//! costs as much as the number of runs, not the number of slots.

use super::recipe::PoolRecipe;
use proptest::test_runner::TestRng;
use rand::{Rng, RngExt};
use std::collections::VecDeque;

/// A request's decode growth is allocated in at most this many steps.
pub const GROWTH_STEPS: u64 = 16;

/// The free queue: runs `(first id, count)` in hand-out order.
struct FreeQueue {
    runs: VecDeque<(u64, u64)>,
    len: u64,
}

impl FreeQueue {
    /// Ids `1..blocks` (slot 0 is the null block and never handed out).
    fn new(blocks: u64) -> Self {
        let mut runs = VecDeque::new();
        if blocks > 1 {
            runs.push_back((1, blocks - 1));
        }
        FreeQueue {
            runs,
            len: blocks.saturating_sub(1),
        }
    }

    /// Takes `n` ids from the front (as runs, appended to `out`); `n <= self.len`.
    fn pop(&mut self, mut n: u64, out: &mut Vec<(u64, u64)>) {
        debug_assert!(n <= self.len);
        self.len -= n;
        while n > 0 {
            let (start, count) = self.runs.pop_front().expect("len counts the runs");
            if count > n {
                self.runs.push_front((start + n, count - n));
                out.push((start, n));
                n = 0;
            } else {
                out.push((start, count));
                n -= count;
            }
        }
    }

    /// Returns a request's runs to the back, its last run first (vLLM frees a request's
    /// blocks in reverse so that its tail is evicted first).
    fn push(&mut self, runs: &[(u64, u64)]) {
        for &r in runs.iter().rev() {
            self.len += r.1;
            self.runs.push_back(r);
        }
    }
}

/// The other requests holding blocks while the batch runs.
struct Others {
    live: Vec<Vec<(u64, u64)>>,
    held: u64,
}

impl Others {
    /// Frees random requests until at most `keep` blocks are held.
    fn free_down_to(&mut self, keep: u64, q: &mut FreeQueue, rng: &mut TestRng) {
        while self.held > keep && !self.live.is_empty() {
            let i = rng.random_range(0..self.live.len());
            let runs = self.live.swap_remove(i);
            self.held -= runs.iter().map(|r| r.1).sum::<u64>();
            q.push(&runs);
        }
    }
}

/// A long-tailed request size around `median` blocks (log-logistic, shape 1.4).
fn other_request_blocks(median: u64, max: u64, rng: &mut TestRng) -> u64 {
    let u: f64 = rng.random_range(1e-6..1.0 - 1e-6);
    let x = median.max(1) as f64 * (u / (1.0 - u)).powf(1.0 / 1.4);
    (x.round() as u64).clamp(1, max.max(1))
}

#[derive(Clone, Copy)]
enum Event {
    /// Another request allocates (and others finish when the pool is at its occupancy).
    Other,
    /// Batch request `r` takes `n` blocks.
    Take { r: usize, n: u64 },
}

/// Physical block ids for each batch request: `needs[r]` new blocks of request `r`, in
/// the order the request allocated them (its block-table order). The pool must hold
/// them all: `needs.sum() < pool.blocks`.
pub fn allocate(pool: &PoolRecipe, needs: &[u64], rng: &mut TestRng) -> Vec<Vec<u64>> {
    let capacity = pool.blocks.saturating_sub(1);
    let total: u64 = needs.iter().sum();
    assert!(
        total <= capacity,
        "a batch of {total} blocks does not fit a pool of {capacity}"
    );
    let mut q = FreeQueue::new(pool.blocks);
    let mut others = Others {
        live: Vec::new(),
        held: 0,
    };
    // What other requests may hold: the occupancy, less what the batch itself needs.
    let room = (capacity as f64 * pool.occupancy_pct.min(100) as f64 / 100.0) as u64;
    let room = room.min(capacity - total);
    let history = pool.churn as u64;
    let mut events: Vec<(u64, u32, Event)> = (0..history)
        .map(|t| (t, rng.next_u32(), Event::Other))
        .collect();
    for (r, &need) in needs.iter().enumerate() {
        if need == 0 {
            continue;
        }
        let arrive = rng.random_range(0..=history);
        let share: f64 = rng.random_range(0.3..=1.0);
        let prompt = ((need as f64 * share).ceil() as u64).clamp(1, need);
        events.push((arrive, rng.next_u32(), Event::Take { r, n: prompt }));
        let growth = need - prompt;
        let steps = growth.min(GROWTH_STEPS);
        for k in 0..steps {
            let n = growth / steps + u64::from(k < growth % steps);
            let at = rng.random_range(arrive..=history);
            events.push((at, rng.next_u32(), Event::Take { r, n }));
        }
    }
    events.sort_by_key(|&(t, tie, _)| (t, tie));
    let mut taken: Vec<Vec<(u64, u64)>> = vec![Vec::new(); needs.len()];
    let mut batch_held = 0u64;
    for (_, _, e) in events {
        match e {
            Event::Other => {
                let size = other_request_blocks(pool.request_blocks as u64, room / 4, rng);
                if size > room {
                    continue;
                }
                others.free_down_to(room - size, &mut q, rng);
                if q.len < size {
                    continue;
                }
                let mut runs = Vec::new();
                q.pop(size, &mut runs);
                others.held += size;
                others.live.push(runs);
            }
            Event::Take { r, n } => {
                // The scheduler makes room for a running request by preempting others.
                if q.len < n {
                    let keep = capacity - batch_held - n;
                    others.free_down_to(keep, &mut q, rng);
                }
                q.pop(n, &mut taken[r]);
                batch_held += n;
            }
        }
    }
    taken
        .into_iter()
        .map(|runs| runs.into_iter().flat_map(|(s, n)| s..s + n).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::recipe::rng_for;

    fn pool(blocks: u64, churn: u32, occupancy_pct: u8) -> PoolRecipe {
        PoolRecipe {
            blocks,
            stride: 1_002_240,
            churn,
            occupancy_pct,
            request_blocks: 300,
            rows_per_request: 1,
        }
    }

    #[test]
    fn every_request_gets_distinct_ids_inside_the_pool_and_never_the_null_block() {
        for (churn, occ) in [(0, 0), (64, 50), (4096, 90), (16384, 95)] {
            let p = pool(30_000, churn, occ);
            let needs = [500u64, 0, 1, 2_000, 37];
            let ids = allocate(&p, &needs, &mut rng_for(7));
            let mut all: Vec<u64> = ids.iter().flatten().copied().collect();
            for (r, v) in ids.iter().enumerate() {
                assert_eq!(v.len() as u64, needs[r], "churn {churn}");
            }
            assert!(all.iter().all(|&id| id >= 1 && id < p.blocks));
            let n = all.len();
            all.sort_unstable();
            all.dedup();
            assert_eq!(all.len(), n, "an id handed out twice (churn {churn})");
        }
    }

    #[test]
    fn a_fresh_engine_hands_out_low_ids_and_churn_spreads_them_over_the_pool() {
        let needs = vec![64u64; 32];
        let fresh = allocate(&pool(100_000, 0, 0), &needs, &mut rng_for(1));
        let max_fresh = fresh.iter().flatten().max().copied().unwrap();
        assert_eq!(max_fresh, 32 * 64, "fresh: the first 2048 ids");
        let churned = allocate(&pool(100_000, 16_384, 90), &needs, &mut rng_for(1));
        let ids: Vec<u64> = churned.iter().flatten().copied().collect();
        let above_half = ids.iter().filter(|&&id| id > 50_000).count();
        assert!(
            above_half > ids.len() / 4,
            "after churn the ids spread over the pool: {above_half} of {} above half",
            ids.len()
        );
        // Past 2^32 bytes at a 1,002,240-byte stride: ids >= 4286.
        assert!(ids.iter().any(|&id| id * 1_002_240 >= 1 << 32));
    }

    #[test]
    fn the_same_seed_gives_the_same_ids() {
        let p = pool(50_000, 4096, 80);
        let needs = [100u64, 3, 900];
        assert_eq!(
            allocate(&p, &needs, &mut rng_for(3)),
            allocate(&p, &needs, &mut rng_for(3))
        );
    }

    #[test]
    fn a_batch_that_fills_the_pool_preempts_the_others() {
        let p = pool(1_001, 2_000, 100);
        let ids = allocate(&p, &[1_000], &mut rng_for(5));
        assert_eq!(ids[0].len(), 1_000);
    }
}
