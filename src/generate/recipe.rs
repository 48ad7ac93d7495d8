//! Recipes: the small, shrinkable description of a case that the generators draw and
//! the materializer turns into tensors. Everything is derived deterministically from
//! the recipe (values from its `seed`), so the same recipe gives the same case, bit
//! for bit, on every machine.

use crate::case::{BlockTable, Case, ContextLens, Shape, SparseKvCache, TailRule, ValueLayout};
use crate::fp8::Fp8Format;
use proptest::test_runner::TestRng;
use rand::{Rng, RngExt};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

pub use super::values::rng_for;
use super::values::Values;

/// How physical blocks are assigned to the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TableOrder {
    /// Sequence b's blocks follow sequence b-1's.
    Sequential,
    /// A random permutation of the used ids.
    Permuted,
    /// Allocated from the top down.
    Reversed,
    /// Every sequence shares its first blocks with sequence 0 (prefix caching).
    SharedPrefix,
}

/// What stands in the table past a sequence's used blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Padding {
    Zero,
    MinusOne,
    /// i32::MAX.
    Huge,
    /// Random valid-looking ids of unreferenced blocks.
    Garbage,
    /// What an engine's reused table rows hold: ids of blocks anywhere in the pool that
    /// earlier requests of the row held (valid addresses, never read by a correct kernel).
    Stale,
}

/// Where the referenced block ids put byte offsets in the device cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OffsetClass {
    /// Ids from 0: a cache of a few blocks.
    Low,
    /// Ids straddling byte offset 2^31.
    Around2G,
    /// Ids straddling byte offset 2^32.
    Around4G,
    /// Ids handed out by a serving engine's allocator over a pool ([`PoolRecipe`]).
    Pool(PoolRecipe),
}

impl OffsetClass {
    pub fn target(self) -> Option<u64> {
        match self {
            OffsetClass::Low | OffsetClass::Pool(_) => None,
            OffsetClass::Around2G => Some(1 << 31),
            OffsetClass::Around4G => Some(1 << 32),
        }
    }
}

/// A serving engine's KV pool (`--profile production`): how many block slots it has, the
/// bytes from one slot to the next, and the history of its allocator
/// ([`super::pool::allocate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PoolRecipe {
    /// Slots (`num_blocks`); slot 0 is the null block.
    pub blocks: u64,
    /// Bytes from one slot to the next: `block_size * (D + 4)` for a per-layer tensor,
    /// more for a view into a per-block slab of every layer's caches.
    pub stride: u64,
    /// Other requests' allocations before this step (0: a freshly started engine).
    pub churn: u32,
    /// Share of the pool other requests hold while the batch runs, in percent.
    pub occupancy_pct: u8,
    /// Typical size of the other requests, in blocks.
    pub request_blocks: u32,
    /// Consecutive sequences that are the rows of one request (MTP flattened to one row
    /// per token because the kernel takes fewer `next_n`): they share its blocks.
    pub rows_per_request: u8,
}

pub use crate::case::ValueKind;

/// Context lengths: explicit, one per sequence or per token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LensRecipe {
    PerSequence(Vec<usize>),
    PerToken(Vec<Vec<usize>>),
}

/// The knobs a [`Draw`](super::Draw) draws and a [`Recipe`] keeps: the shape (but the
/// batch and the value layout, which the draw only wishes for), every layout hazard
/// and the value seed. One struct in both, so a new generator axis is one field here.
/// Flattened into both: a recipe's JSON (`provenance.recipe` of corpus files) names
/// these fields at its top level.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Knobs {
    pub next_n: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub format: Fp8Format,
    /// Extra columns beyond the longest row (0: `ctx == max_model_len` for the longest).
    pub model_len_slack: usize,
    /// Output row stride beyond `max_model_len`, in elements.
    pub out_stride_pad: usize,
    /// Extra rows of zero length appended to make the output pass 2 GiB (the output
    /// offset axis); 0 for none.
    pub big_output: bool,
    pub table_order: TableOrder,
    pub padding: Padding,
    /// Table columns beyond what the longest sequence needs.
    pub surplus_blocks: usize,
    /// Table row stride beyond `max_blocks`.
    pub table_stride_pad: usize,
    /// KV block stride padding in bytes (multiple of 4).
    pub kv_stride_pad: u64,
    pub offsets: OffsetClass,
    pub values: ValueKind,
    pub seed: u64,
}

impl Knobs {
    /// Every layout hazard switched on at a small shape: 8 heads, D 64, block 16,
    /// e4m3fn, a permuted block table with `-1` padding, padded table/KV/output strides,
    /// one surplus block and pipeline-quantized values.
    pub fn small(next_n: usize, seed: u64) -> Knobs {
        Knobs {
            next_n,
            heads: 8,
            head_dim: 64,
            block_size: 16,
            format: Fp8Format::E4m3fn,
            model_len_slack: 5,
            out_stride_pad: 3,
            big_output: false,
            table_order: TableOrder::Permuted,
            padding: Padding::MinusOne,
            surplus_blocks: 1,
            table_stride_pad: 2,
            kv_stride_pad: 8,
            offsets: OffsetClass::Low,
            values: ValueKind::Pipeline,
            seed,
        }
    }

    /// The production shape of the engines (H 64, D 128, block 64, e4m3fn) with no
    /// layout hazards: tight strides, zero table padding, no spare blocks, low offsets,
    /// pipeline values.
    pub fn production(next_n: usize, seed: u64) -> Knobs {
        Knobs {
            heads: 64,
            head_dim: 128,
            block_size: 64,
            model_len_slack: 0,
            out_stride_pad: 0,
            padding: Padding::Zero,
            surplus_blocks: 0,
            table_stride_pad: 0,
            kv_stride_pad: 0,
            ..Knobs::small(next_n, seed)
        }
    }
}

/// Everything needed to build a case: the knobs, the value layout and the lengths.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Recipe {
    #[serde(flatten)]
    pub knobs: Knobs,
    pub layout: ValueLayout,
    /// Context lengths; their count is the batch.
    pub lens: LensRecipe,
}

impl Recipe {
    /// A small recipe with every layout hazard switched on ([`Knobs::small`]), normal
    /// value layout, one length per sequence. Tests and benchmarks start here and change
    /// knobs with [`Recipe::with`] (`Recipe::small(..).with(|k| k.heads = 32)`).
    pub fn small(lens: Vec<usize>, next_n: usize, seed: u64) -> Recipe {
        Recipe {
            knobs: Knobs::small(next_n, seed),
            layout: ValueLayout::Normal,
            lens: LensRecipe::PerSequence(lens),
        }
    }

    /// The production shape of the engines with no layout hazards
    /// ([`Knobs::production`]). Benchmarks time this one.
    pub fn production(lens: Vec<usize>, next_n: usize, seed: u64) -> Recipe {
        Recipe {
            knobs: Knobs::production(next_n, seed),
            ..Recipe::small(lens, next_n, seed)
        }
    }

    /// This recipe with its knobs changed by `edit`.
    pub fn with(mut self, edit: impl FnOnce(&mut Knobs)) -> Recipe {
        edit(&mut self.knobs);
        self
    }

    /// Tokens of each sequence (a 2-D sequence: its longest row).
    pub fn seq_lens(&self) -> Vec<usize> {
        match &self.lens {
            LensRecipe::PerSequence(v) => v.clone(),
            LensRecipe::PerToken(v) => v
                .iter()
                .map(|row| row.iter().copied().max().unwrap_or(0))
                .collect(),
        }
    }

    /// The KV tokens the case's sequences hold in all.
    pub fn tokens(&self) -> u64 {
        self.seq_lens().iter().map(|&l| l as u64).sum()
    }

    pub fn batch(&self) -> usize {
        match &self.lens {
            LensRecipe::PerSequence(v) => v.len(),
            LensRecipe::PerToken(v) => v.len(),
        }
    }

    fn seq_tokens(&self, b: usize) -> usize {
        match &self.lens {
            LensRecipe::PerSequence(v) => v[b],
            LensRecipe::PerToken(v) => v[b].iter().copied().max().unwrap_or(0),
        }
    }

    /// `max_model_len`: the longest sequence plus the slack (at least 1).
    pub fn max_model_len(&self) -> usize {
        let longest = (0..self.batch()).map(|b| self.seq_tokens(b)).max();
        (longest.unwrap_or(0) + self.knobs.model_len_slack).max(1)
    }

    /// The output's row stride in elements: `max_model_len` plus the padding; on the
    /// output-offset axis at least 2^20 floats (max_model_len = 1<<20 in AITER #4244),
    /// so a few hundred rows pass 2^31 bytes.
    pub fn out_row_stride(&self) -> usize {
        let stride = self.max_model_len() + self.knobs.out_stride_pad;
        match self.knobs.big_output {
            true => stride.max(1 << 20),
            false => stride,
        }
    }

    /// Sequences of length 0 prepended on the output-offset axis so that their rows
    /// alone cover 2^31 bytes (every row of the real sequences starts past 2 GiB); 0
    /// off the axis.
    pub fn output_pad_seqs(&self) -> usize {
        if !self.knobs.big_output {
            return 0;
        }
        let row_bytes = self.out_row_stride() as u64 * 4;
        let pad_rows = (1u64 << 31).div_ceil(row_bytes) as usize;
        pad_rows.div_ceil(self.knobs.next_n)
    }

    /// Bytes the output spans, rows × row stride × 4: past 2^31, the byte offset of
    /// its last rows overflows an int32, whether the rows were prepended for that
    /// (`big_output`) or come from a wide `max_model_len` and a big batch (a
    /// production server's logits buffer, `[B·next_n, max_model_len]`).
    pub fn output_bytes(&self) -> u64 {
        let rows = (self.batch() + self.output_pad_seqs()) * self.knobs.next_n;
        rows as u64 * self.out_row_stride() as u64 * 4
    }

    /// Materializes the case. Panics only on recipes the strategies never produce
    /// (e.g. zero batch); generated recipes always validate.
    pub fn materialize(&self) -> Case {
        let k = &self.knobs;
        let mut rng = rng_for(k.seed);
        let batch = self.batch();
        let shape = Shape {
            batch,
            next_n: k.next_n,
            heads: k.heads,
            head_dim: k.head_dim,
            block_size: k.block_size,
            layout: self.layout,
            format: k.format,
        };
        let bs = k.block_size;
        let max_model_len = self.max_model_len();
        let used: Vec<usize> = (0..batch)
            .map(|b| self.seq_tokens(b).div_ceil(bs))
            .collect();
        let max_blocks = used.iter().copied().max().unwrap_or(0) + k.surplus_blocks;
        let max_blocks = max_blocks.max(1);
        let row_stride = max_blocks + k.table_stride_pad;
        let blocks = match k.offsets {
            OffsetClass::Pool(pool) => self.pool_layout(&pool, &used),
            _ => self.dense_layout(&shape, &used, &mut rng),
        };
        let (base, n_logical, num_blocks) = (blocks.base, blocks.n_logical, blocks.num_blocks);
        let phys = |l: usize| blocks.phys[l];

        let rule = self.tail_rule(&blocks);
        let mut table = self.block_table(&blocks, max_blocks, row_stride, rule);

        let context_lens = match &self.lens {
            LensRecipe::PerSequence(v) => {
                ContextLens::PerSequence(v.iter().map(|&x| x as i64).collect())
            }
            LensRecipe::PerToken(v) => ContextLens::PerToken(
                v.iter()
                    .map(|r| r.iter().map(|&x| x as i64).collect())
                    .collect(),
            ),
        };
        let mut rows = shape.rows();
        let out_row_stride = self.out_row_stride();
        let mut context_lens = context_lens;
        let mut shape = shape;
        if k.big_output {
            // Prepend zero-length sequences until their rows alone cover 2^31 bytes, so
            // every row of the real sequences starts past 2 GiB (an int32 byte offset of
            // any of their stores overflows). Built in one pass: prepending one sequence
            // at a time is quadratic in the (possibly millions of) padding rows.
            let pad_seqs = self.output_pad_seqs();
            shape.batch += pad_seqs;
            rows += pad_seqs * k.next_n;
            match &mut context_lens {
                ContextLens::PerSequence(v) => {
                    v.splice(0..0, std::iter::repeat_n(0, pad_seqs));
                }
                ContextLens::PerToken(v) => {
                    v.splice(0..0, std::iter::repeat_n(vec![0; k.next_n], pad_seqs));
                }
            }
            // Indices past the table's own: another stream of the same hash.
            let pad: Vec<i32> = (0..pad_seqs * row_stride)
                .map(|i| rule.entry((1 << 48) + i as u64))
                .collect();
            table.entries.splice(0..0, pad);
        }
        let values = Values::draw(&shape, k.values, &mut rng, n_logical);
        let kv = match values.blocks {
            Some(blocks) => SparseKvCache::stored(
                blocks
                    .into_iter()
                    .enumerate()
                    .map(|(l, bytes)| (phys(l), bytes))
                    .collect(),
            ),
            None => {
                let ids = (0..n_logical).map(phys).collect();
                super::values::drawn_cache(&shape, values.drawn, ids)
                    .expect("only hostile values are stored")
            }
        };
        // Padding::Garbage may name an unreferenced id past num_blocks: keep it inside.
        let num_blocks = if matches!(k.offsets, OffsetClass::Pool(_)) {
            num_blocks
        } else {
            num_blocks.max(base + n_logical as u64 + 2)
        };
        let _ = rows;
        Case {
            shape,
            num_blocks,
            kv_block_stride: blocks.kv_block_stride,
            context_lens,
            block_table: table,
            max_model_len,
            out_row_stride,
            q: values.q,
            weights: values.weights,
            kv,
        }
    }
    /// The padding rule. Padding entry `i` is a hash of its index, not the case's
    /// stream, so that an engine-sized table (hundreds of millions of padding entries at
    /// block size 1) is cheap to draw, the values do not depend on the padding chosen,
    /// and a transport can send the rule instead of the entries (`BlockTable::tail`).
    fn tail_rule(&self, blocks: &BlockLayout) -> TailRule {
        let k = &self.knobs;
        match k.padding {
            Padding::Zero => TailRule::Fill(0),
            Padding::MinusOne => TailRule::Fill(-1),
            Padding::Huge => TailRule::Fill(i32::MAX),
            Padding::Garbage => TailRule::Hash {
                key: k.seed ^ PAD_SALT,
                lo: blocks.base + blocks.n_logical as u64,
                span: 2,
            },
            Padding::Stale => TailRule::Hash {
                key: k.seed ^ PAD_SALT,
                lo: 1,
                span: blocks.num_blocks.max(2) - 1,
            },
        }
    }

    /// The block table of `blocks`: each row's physical ids, then `rule`'s padding.
    /// Every row's entries past its used blocks are the rule's (`BlockTable::tail`; the
    /// big-output rows `materialize` prepends hash other indices, so none there). A
    /// table that is mostly padding past [`COMPACT_TABLE_PADDING`] (a block-size-1
    /// server's) stays compact: each row's used entries and the rule; any other is
    /// made whole by `BlockTable::expand`, the one place padding is filled on the host.
    fn block_table(
        &self,
        blocks: &BlockLayout,
        max_blocks: usize,
        row_stride: usize,
        rule: TailRule,
    ) -> BlockTable {
        let batch = self.batch();
        // Ids are below num_blocks, which validation holds to 2^31.
        let entries = (0..batch)
            .into_par_iter()
            .flat_map_iter(|b| {
                blocks
                    .row(b)
                    .iter()
                    .map(|&l| blocks.phys[l].min(i32::MAX as u64) as i32)
            })
            .collect();
        let held: Vec<usize> = (0..batch).map(|b| blocks.row(b).len()).collect();
        let padding_entries = (batch * row_stride).saturating_sub(held.iter().sum());
        let mut table = BlockTable::compact(max_blocks, row_stride, entries, rule, held)
            .expect("each row holds its used blocks");
        if self.knobs.big_output || padding_entries < COMPACT_TABLE_PADDING {
            table.expand();
        }
        if self.knobs.big_output {
            table.tail = None;
        }
        table
    }

    /// Block ids of the layout hazards' recipes: logical ids 0.. in sequence order
    /// (shared prefixes reused), permuted or reversed, shifted so that they straddle the
    /// offset class's byte offset, in a cache a few blocks larger than they need.
    fn dense_layout(&self, shape: &Shape, used: &[usize], rng: &mut TestRng) -> BlockLayout {
        let batch = used.len();
        let kv_block_stride = shape.block_bytes() as u64 + self.knobs.kv_stride_pad;
        let prefix = if self.knobs.table_order == TableOrder::SharedPrefix {
            used.iter().copied().min().unwrap_or(0).min(used[0])
        } else {
            0
        };
        let mut logical: Vec<Vec<usize>> = Vec::with_capacity(batch);
        let mut next = 0usize;
        for (b, &u) in used.iter().enumerate() {
            let row: Vec<usize> = (0..u)
                .map(|j| {
                    if b > 0 && j < prefix {
                        logical[0][j]
                    } else {
                        next += 1;
                        next - 1
                    }
                })
                .collect();
            logical.push(row);
        }
        let n_logical = next;
        let mut perm: Vec<usize> = (0..n_logical).collect();
        match self.knobs.table_order {
            TableOrder::Permuted => {
                for i in (1..perm.len()).rev() {
                    perm.swap(i, rng.random_range(0..=i));
                }
            }
            TableOrder::Reversed => perm.reverse(),
            _ => {}
        }
        // Physical base so that the ids straddle the target byte offset.
        let base: u64 = match self.knobs.offsets.target() {
            None => 0,
            Some(target) => {
                let at = target / kv_block_stride;
                at.saturating_sub(n_logical as u64 / 2)
            }
        };
        let phys: Vec<u64> = perm.iter().map(|&p| base + p as u64).collect();
        let num_blocks = base + n_logical as u64 + 1 + (rng.next_u32() % 3) as u64;
        BlockLayout {
            rows: (0..batch).map(|b| (b, logical[b].len())).collect(),
            requests: logical,
            n_logical,
            phys,
            num_blocks,
            kv_block_stride,
            base,
        }
    }

    /// Block ids of an engine's pool: each request (its flattened rows together) gets
    /// the blocks the simulated allocator hands it ([`super::pool::allocate`]); with a
    /// shared prefix, every request reuses request 0's first blocks (prefix caching).
    fn pool_layout(&self, pool: &PoolRecipe, used: &[usize]) -> BlockLayout {
        let batch = used.len();
        let group = (pool.rows_per_request.max(1) as usize).min(batch.max(1));
        let requests: Vec<std::ops::Range<usize>> = (0..batch.div_ceil(group))
            .map(|g| g * group..((g + 1) * group).min(batch))
            .collect();
        let need: Vec<usize> = requests
            .iter()
            .map(|m| used[m.clone()].iter().copied().max().unwrap_or(0))
            .collect();
        let prefix = if self.knobs.table_order == TableOrder::SharedPrefix {
            need.iter().copied().min().unwrap_or(0)
        } else {
            0
        };
        let mut per_request: Vec<Vec<usize>> = Vec::with_capacity(requests.len());
        let mut fresh: Vec<u64> = Vec::with_capacity(requests.len());
        let mut next = 0usize;
        for (g, &n) in need.iter().enumerate() {
            let shared = if g > 0 { prefix.min(n) } else { 0 };
            let mut row: Vec<usize> = per_request
                .first()
                .map_or(Vec::new(), |r0: &Vec<usize>| r0[..shared].to_vec());
            row.extend(next..next + (n - shared));
            next += n - shared;
            fresh.push((n - shared) as u64);
            per_request.push(row);
        }
        let ids = super::pool::allocate(pool, &fresh, &mut rng_for(self.knobs.seed ^ POOL_SALT));
        let mut phys = vec![0u64; next];
        for (g, row) in per_request.iter().enumerate() {
            let own = if g > 0 { prefix.min(row.len()) } else { 0 };
            for (k, &l) in row[own..].iter().enumerate() {
                phys[l] = ids[g][k];
            }
        }
        // A request's rows share its blocks: each row is a prefix of its request's list
        // (not a copy: at block size 1 the lists are one id per token).
        let base = phys_min(&per_request, &phys);
        BlockLayout {
            rows: (0..batch).map(|b| (b / group, used[b])).collect(),
            requests: per_request,
            n_logical: next,
            phys,
            num_blocks: pool.blocks,
            kv_block_stride: pool.stride,
            base,
        }
    }
}

/// Salt of the allocator's RNG stream (apart from the case's, so values do not depend
/// on the allocator's history).
const POOL_SALT: u64 = 0x706f_6f6c_2d61_6c6c;

/// Where a recipe's blocks live: logical block ids per sequence, the physical id of
/// each logical block, and the cache they live in.
struct BlockLayout {
    /// Logical block ids of each request (a sequence, or the rows of one request).
    requests: Vec<Vec<usize>>,
    /// Per sequence: its request and how many of the request's blocks it uses.
    rows: Vec<(usize, usize)>,
    n_logical: usize,
    phys: Vec<u64>,
    num_blocks: u64,
    kv_block_stride: u64,
    /// The lowest physical id the layout hands out.
    base: u64,
}

impl BlockLayout {
    /// Logical block ids of sequence `b`.
    fn row(&self, b: usize) -> &[usize] {
        let (g, n) = self.rows[b];
        &self.requests[g][..n]
    }
}

/// Padding entries past which a generated table is held compact (each row's used
/// entries and the padding rule, `BlockTable::row_starts`): 2^24 (64 MiB of entries).
pub const COMPACT_TABLE_PADDING: usize = 1 << 24;

/// Salt of the padding entries' hash (apart from the case's stream and the pool's).
const PAD_SALT: u64 = 0x7061_642d_656e_7472;

/// The lowest physical id of the requests' blocks (0 when none).
fn phys_min(logical: &[Vec<usize>], phys: &[u64]) -> u64 {
    logical
        .iter()
        .flatten()
        .map(|&l| phys[l])
        .min()
        .unwrap_or(0)
}
