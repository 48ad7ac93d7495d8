//! `cpu:chunked`: the production algorithm of the paged MQA logits kernels, on the CPU.
//!
//! Like DeepGEMM and AITER it (1) splits every sequence into ChunkK=256-token chunks,
//! (2) builds a split-KV schedule that hands each of a fixed number of workers ("SMs")
//! a contiguous range of (sequence, chunk) items, (3) computes each item with f32
//! accumulation, and (4) stores whole chunks: a value for positions in V(r), -inf for
//! masked positions inside the chunk, nothing past the last chunk and nothing past
//! `max_model_len`. The planted bugs ([`Plant`]) are small edits of exactly this code.

use crate::case::{Case, ContextLens, ScalePlacement};
use crate::fp8::Fp8Format;
use crate::kernel::cpu::DeviceView;
use crate::kernel::plant::Plant;
use crate::kernel::{Capabilities, Kernel, OutputBuffer, RunError, RunInfo};
use rayon::prelude::*;
use std::time::Instant;

/// Tokens per chunk (DeepGEMM's split size; AITER's default ChunkK).
pub const CHUNK_K: usize = 256;
/// Workers of the split-KV schedule.
pub const SCHEDULE_SMS: usize = 8;

pub struct ChunkedKernel {
    name: String,
    /// The planted bugs, composed (empty: the clean kernel).
    plants: Vec<Plant>,
    /// Plain loop over V(r) instead of chunks and schedule.
    naive: bool,
    caps: Capabilities,
}

thread_local! {
    /// Runs of any chunked kernel made by this thread so far: the nondeterministic
    /// plant's order follows it. Per thread, so that the two runs of a determinism
    /// check (made back to back by one thread) always differ, even while other threads
    /// (a campaign's workers, when the book shrinks on the main thread) run the same
    /// kernel; a counter shared by all threads made a shrink step's check see two runs
    /// of one parity now and then and reject a candidate that still failed.
    static RUNS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How one logit's head sum is ordered. The default (heads in order, one partial) is
/// the clean kernel's; the property plants change it, never the terms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct HeadOrder {
    /// Heads summed last to first.
    reverse: bool,
    /// The head sum is cut here into two partials added at the end (0: not cut).
    split: usize,
}

impl ChunkedKernel {
    pub fn new(plant: Option<Plant>) -> Self {
        Self::with_plants(plant.into_iter().collect())
    }

    /// The chunked kernel with every bug of `plants` planted at once (`cpu:bug-A+B`):
    /// the bugs are independent edits, so each fails through its own mechanism.
    pub fn with_plants(plants: Vec<Plant>) -> Self {
        let name = if plants.is_empty() {
            "cpu:chunked".to_string()
        } else {
            let names: Vec<&str> = plants.iter().map(|p| p.name()).collect();
            format!("cpu:bug-{}", names.join("+"))
        };
        ChunkedKernel {
            name,
            plants,
            naive: false,
            caps: Capabilities::everything(ScalePlacement::AfterReluSum),
        }
    }

    pub fn naive() -> Self {
        ChunkedKernel {
            name: "cpu:naive".into(),
            plants: Vec::new(),
            naive: true,
            caps: Capabilities::everything(ScalePlacement::AfterReluSum),
        }
    }

    fn has(&self, p: Plant) -> bool {
        self.plants.contains(&p)
    }

    /// V(r) length as this kernel believes it.
    fn believed_len(&self, case: &Case, r: usize) -> usize {
        let n = case.shape.next_n;
        let (b, i) = (r / n, r % n);
        if self.has(Plant::Ctx2dIgnored) {
            if let ContextLens::PerToken(c) = &case.context_lens {
                let flat = c[b / n][b % n]; // context_lens[b] of the flattened [B, N] array
                return (flat - n as i64 + i as i64 + 1).max(0) as usize;
            }
        }
        let len = case.valid_len(r);
        if self.has(Plant::MaskOffByOne) && n > 1 {
            return len.saturating_sub(1);
        }
        len
    }

    /// Tokens of sequence `b` the schedule covers.
    fn believed_seq_tokens(&self, case: &Case, b: usize) -> usize {
        let n = case.shape.next_n;
        if self.has(Plant::Ctx2dIgnored) && case.context_lens.is_2d() {
            return (0..n)
                .map(|i| self.believed_len(case, b * n + i))
                .max()
                .unwrap_or(0);
        }
        case.seq_tokens(b)
    }

    /// The split-KV schedule: work items `(sequence, chunk)` and the worker of each.
    fn schedule(&self, case: &Case) -> Vec<(usize, usize, usize)> {
        let s = &case.shape;
        let mut items = Vec::new();
        for b in 0..s.batch {
            let tokens = self.believed_seq_tokens(case, b);
            if self.has(Plant::ShortRowSkipped) && tokens < s.next_n {
                continue;
            }
            let chunks = if self.has(Plant::TailUnwritten) {
                tokens / CHUNK_K
            } else {
                tokens.div_ceil(CHUNK_K)
            };
            items.extend((0..chunks).map(|c| (b, c)));
        }
        if items.is_empty() && self.has(Plant::ZeroBatch) && s.batch.is_multiple_of(32) {
            // The scheduler's search runs off the end and worker 0 gets the sentinel.
            return vec![(s.batch, 0, 0)];
        }
        let per_sm = items.len().div_ceil(SCHEDULE_SMS).max(1);
        let mut out = Vec::with_capacity(items.len());
        for (k, (b, c)) in items.iter().copied().enumerate() {
            let sm = k / per_sm;
            let starts_range = k % per_sm == 0;
            if self.has(Plant::SplitBoundaryDrop) && sm > 0 && starts_range && c > 0 {
                continue;
            }
            out.push((b, c, sm));
        }
        out
    }
}

/// A decoded key: D values and the scale.
struct Key {
    k: Vec<f32>,
    scale: f32,
}

impl ChunkedKernel {
    fn table(&self, case: &Case) -> &'static [f32; 256] {
        if self.has(Plant::FnuzAsFn) {
            Fp8Format::E4m3fn.table()
        } else {
            case.shape.format.table()
        }
    }

    /// Reads the key of token `t` of sequence `b` the way this kernel addresses memory.
    fn load_key(&self, case: &Case, dev: &DeviceView, b: usize, t: usize) -> Result<Key, RunError> {
        let s = &case.shape;
        let table = self.table(case);
        let bs = s.block_size;
        let j = t / bs;
        let p = t % bs;
        // The entry at flat index `idx`, as a load from the table's memory would see it
        // (a column past the row stride is the next row's).
        let t = &case.block_table;
        let idx = b * t.row_stride + j;
        if idx >= t.len() {
            return Err(RunError::Crash(format!(
                "illegal address: block_table[{b}][{j}] is past the table"
            )));
        }
        let id = t.get(idx / t.row_stride, idx % t.row_stride);
        let stride = case.kv_block_stride;
        let base: i64 = if self.has(Plant::Offset32Kv) {
            (id as u32).wrapping_mul(stride as u32) as i64
        } else {
            id.wrapping_mul(stride as i64)
        };
        // The common case: a stored block at its true address. Anything else (wrapped
        // offsets, padding ids, unreferenced blocks) goes through the device view.
        let fast = id >= 0 && base == id * stride as i64 && case.kv.contains(id as u64);
        if fast {
            let block = case.block(id as u64);
            let k = (0..s.head_dim)
                .map(|d| table[case.k_code(block, p, d) as usize])
                .collect();
            return Ok(Key {
                k,
                scale: case.k_scale(block, p),
            });
        }
        let fault = |what: &str| {
            RunError::Crash(format!("illegal address: {what} of block id {id} (block_table[{b}][{j}]) at byte offset {base} of a {}-byte cache", dev.len()))
        };
        let mut k = Vec::with_capacity(s.head_dim);
        for d in 0..s.head_dim {
            let off = base + s.layout.value_offset(s.head_dim, p, d) as i64;
            k.push(table[dev.byte(off).ok_or_else(|| fault("value"))? as usize]);
        }
        let scale = dev
            .f32_le(base + (bs * s.head_dim + 4 * p) as i64)
            .ok_or_else(|| fault("scale"))?;
        Ok(Key { k, scale })
    }

    /// The f32 logit of one row against one key. Eight partial sums per dot (any order
    /// is within the f32 bound, and this one vectorizes); the head sum in `order`.
    fn logit(&self, q: &[f32], w: &[f32], key: &Key, head_dim: usize, order: HeadOrder) -> f32 {
        let inside = self.caps.scale_placement == ScalePlacement::InsideRelu
            || self.has(Plant::ScaleBeforeRelu);
        let term = |h: usize| {
            let qh = &q[h * head_dim..(h + 1) * head_dim];
            let mut lanes = [0f32; 8];
            for (qc, kc) in qh.chunks_exact(8).zip(key.k.chunks_exact(8)) {
                for l in 0..8 {
                    lanes[l] += qc[l] * kc[l];
                }
            }
            let dot = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
                + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
            let x = if inside { dot * key.scale } else { dot };
            w[h] * relu32(x)
        };
        let sum = |heads: std::ops::Range<usize>| {
            let mut acc = 0f32;
            if order.reverse {
                for h in heads.rev() {
                    acc += term(h);
                }
            } else {
                for h in heads {
                    acc += term(h);
                }
            }
            acc
        };
        let heads = w.len();
        let acc = if order.split > 0 && order.split < heads {
            sum(0..order.split) + sum(order.split..heads)
        } else {
            sum(0..heads)
        };
        if inside {
            acc
        } else {
            acc * key.scale
        }
    }

    /// The head order of this run of `case`: the clean kernel's, unless a property
    /// plant changes it (`run`: this kernel's run counter before the run).
    fn head_order(&self, case: &Case, run: u64) -> HeadOrder {
        let mut o = HeadOrder::default();
        if self.has(Plant::Nondeterministic) {
            // Partials combined in arrival order: another order every other run.
            o.reverse = run % 2 == 1;
        }
        if self.has(Plant::BatchVariant) {
            // Split where the whole batch's work says: a sequence's order depends on
            // its neighbours' lengths.
            let total: usize = (0..case.shape.batch)
                .map(|b| self.believed_seq_tokens(case, b))
                .sum();
            o.split = total % case.shape.heads.max(1);
        }
        o
    }

    fn decoded_q(&self, case: &Case, r: usize) -> Vec<f32> {
        let s = &case.shape;
        let table = self.table(case);
        let (b, i) = (r / s.next_n, r % s.next_n);
        (0..s.heads)
            .flat_map(|h| case.q_codes(b, i, h).iter().map(|&c| table[c as usize]))
            .collect()
    }

    fn run_naive(&self, case: &Case, out: &mut OutputBuffer) -> Result<(), RunError> {
        let s = &case.shape;
        let dev = DeviceView::new(case);
        let results: Vec<Result<Vec<f32>, RunError>> = (0..case.rows())
            .into_par_iter()
            .map(|r| {
                let q = self.decoded_q(case, r);
                let w = &case.weights[r * s.heads..(r + 1) * s.heads];
                (0..case.valid_len(r))
                    .map(|t| {
                        Ok(self.logit(
                            &q,
                            w,
                            &self.load_key(case, &dev, r / s.next_n, t)?,
                            s.head_dim,
                            HeadOrder::default(),
                        ))
                    })
                    .collect()
            })
            .collect();
        for (r, row) in results.into_iter().enumerate() {
            for (t, v) in row?.into_iter().enumerate() {
                out.set(r, t, v);
            }
        }
        Ok(())
    }

    fn run_chunked(&self, case: &Case, out: &mut OutputBuffer, run: u64) -> Result<(), RunError> {
        let s = &case.shape;
        let n = s.next_n;
        let order = self.head_order(case, run);
        let dev = DeviceView::new(case);
        let sched = self.schedule(case);
        let qs: Vec<Vec<f32>> = (0..case.rows()).map(|r| self.decoded_q(case, r)).collect();
        // Compute every item (in parallel, as the SMs would), then store.
        let tiles: Vec<Result<Vec<f32>, RunError>> = sched
            .par_iter()
            .map(|&(b, c, _sm)| {
                let mut tile = vec![f32::NEG_INFINITY; n * CHUNK_K];
                if b >= s.batch {
                    return Ok(tile); // sentinel item: masked everywhere
                }
                let lens: Vec<usize> = (0..n).map(|i| self.believed_len(case, b * n + i)).collect();
                let seq_tokens = self.believed_seq_tokens(case, b);
                let t0 = c * CHUNK_K;
                for dt in 0..CHUNK_K {
                    let t = t0 + dt;
                    let needed = lens.iter().any(|&l| t < l);
                    // The padding-reading mutant loads every key of the chunk it can
                    // address through the table, before masking.
                    let prefetch = self.has(Plant::TablePaddingRead)
                        && t >= seq_tokens
                        && t / s.block_size < case.block_table.max_blocks;
                    if !needed && !prefetch {
                        continue;
                    }
                    let key = self.load_key(case, &dev, b, t)?;
                    for i in 0..n {
                        if t < lens[i] {
                            let r = b * n + i;
                            tile[i * CHUNK_K + dt] = self.logit(
                                &qs[r],
                                &case.weights[r * s.heads..(r + 1) * s.heads],
                                &key,
                                s.head_dim,
                                order,
                            );
                        }
                    }
                }
                Ok(tile)
            })
            .collect();
        let (raw, base) = out.raw_mut();
        let mml = case.max_model_len;
        let end = if self.has(Plant::StorePastEnd) {
            mml + 1
        } else {
            mml
        };
        for (&(b, c, _), tile) in sched.iter().zip(tiles) {
            let tile = tile?;
            for i in 0..n {
                let r = b * n + i;
                for dt in 0..CHUNK_K {
                    let t = c * CHUNK_K + dt;
                    if t >= end {
                        break;
                    }
                    let elem = (r * case.out_row_stride + t) as i64;
                    let elem = if self.has(Plant::Offset32Out) {
                        ((elem * 4) as i32 as i64) / 4
                    } else {
                        elem
                    };
                    let at = base as i64 + elem;
                    if at < 0 || at as usize >= raw.len() {
                        return Err(RunError::Crash(format!(
                            "illegal address: store of row {r} position {t} at element offset {elem} of a {}-element output",
                            out_len(case)
                        )));
                    }
                    raw[at as usize] = tile[i * CHUNK_K + dt];
                }
            }
        }
        Ok(())
    }
}

fn out_len(case: &Case) -> usize {
    case.rows() * case.out_row_stride
}

#[inline]
fn relu32(x: f32) -> f32 {
    if x > 0.0 || x.is_nan() {
        x
    } else {
        0.0
    }
}

impl Kernel for ChunkedKernel {
    fn name(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn run(&self, case: &Case, out: &mut OutputBuffer) -> Result<RunInfo, RunError> {
        let start = Instant::now();
        let run = RUNS.with(|r| r.replace(r.get() + 1));
        if self.naive {
            self.run_naive(case, out)?;
        } else {
            self.run_chunked(case, out, run)?;
        }
        Ok(RunInfo {
            kernel_time: Some(start.elapsed()),
            inputs_intact: Some(true),
            device_bytes: None,
            queue_wait: None,
            phases: Default::default(),
        })
    }
}
