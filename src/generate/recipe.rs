//! Recipes: the small, shrinkable description of a case that the generators draw and
//! the materializer turns into tensors. Everything is derived deterministically from
//! the recipe (values from its `seed`), so the same recipe gives the same case, bit
//! for bit, on every machine.

use crate::case::{BlockTable, Case, ContextLens, Shape, SparseKvCache, ValueLayout};
use crate::fp8::Fp8Format;
use proptest::test_runner::{RngAlgorithm, TestRng};
use rand::{Rng, RngExt};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

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

/// How values are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ValueKind {
    /// The real pipeline: bf16 gaussians, per-token amax scale rounded up to a power of
    /// two (ue8m0), clamped at 1e-4, saturating fp8 cast; weights folded as engines do.
    Pipeline,
    /// Uniform random finite codes, random positive scales.
    UniformCodes,
    /// ±max, subnormals and zeros.
    Extreme,
    /// Dots that are exactly 0 or one ulp away: the relu boundary.
    ReluBoundary,
    /// Every dot negative: logits exactly 0.
    AllNegative,
    /// Hostile: NaN codes (and 0x80 in fnuz), zero/negative/inf/NaN scales and weights.
    Hostile,
}

impl ValueKind {
    pub const ALL: [ValueKind; 6] = [
        ValueKind::Pipeline,
        ValueKind::UniformCodes,
        ValueKind::Extreme,
        ValueKind::ReluBoundary,
        ValueKind::AllNegative,
        ValueKind::Hostile,
    ];
    pub fn is_hostile(self) -> bool {
        self == ValueKind::Hostile
    }
}

/// Context lengths: explicit, one per sequence or per token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LensRecipe {
    PerSequence(Vec<usize>),
    PerToken(Vec<Vec<usize>>),
}

/// Everything needed to build a case.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Recipe {
    pub next_n: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub layout: ValueLayout,
    pub format: Fp8Format,
    /// Context lengths; their count is the batch.
    pub lens: LensRecipe,
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

impl Recipe {
    /// A small recipe with every layout hazard switched on: 8 heads, D 64, block 16,
    /// e4m3fn, a permuted block table with `-1` padding, padded table/KV/output strides,
    /// one surplus block and pipeline-quantized values. Tests and benchmarks start here
    /// and change fields with struct-update syntax (`Recipe { heads: 32, ..small }`).
    pub fn small(lens: Vec<usize>, next_n: usize, seed: u64) -> Recipe {
        Recipe {
            next_n,
            heads: 8,
            head_dim: 64,
            block_size: 16,
            layout: ValueLayout::Normal,
            format: Fp8Format::E4m3fn,
            lens: LensRecipe::PerSequence(lens),
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
    /// layout hazards: tight strides, zero table padding, no spare blocks. Benchmarks
    /// time this one.
    pub fn production(lens: Vec<usize>, next_n: usize, seed: u64) -> Recipe {
        Recipe {
            heads: 64,
            head_dim: 128,
            block_size: 64,
            model_len_slack: 0,
            out_stride_pad: 0,
            padding: Padding::Zero,
            surplus_blocks: 0,
            table_stride_pad: 0,
            kv_stride_pad: 0,
            ..Recipe::small(lens, next_n, seed)
        }
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

    /// Materializes the case. Panics only on recipes the strategies never produce
    /// (e.g. zero batch); generated recipes always validate.
    pub fn materialize(&self) -> Case {
        let mut rng = rng_for(self.seed);
        let batch = self.batch();
        let shape = Shape {
            batch,
            next_n: self.next_n,
            heads: self.heads,
            head_dim: self.head_dim,
            block_size: self.block_size,
            layout: self.layout,
            format: self.format,
        };
        let bs = self.block_size;
        let longest = (0..batch).map(|b| self.seq_tokens(b)).max().unwrap_or(0);
        let max_model_len = (longest + self.model_len_slack).max(1);
        let used: Vec<usize> = (0..batch)
            .map(|b| self.seq_tokens(b).div_ceil(bs))
            .collect();
        let max_blocks = used.iter().copied().max().unwrap_or(0) + self.surplus_blocks;
        let max_blocks = max_blocks.max(1);
        let row_stride = max_blocks + self.table_stride_pad;
        let layout = match self.offsets {
            OffsetClass::Pool(pool) => self.pool_layout(&pool, &used),
            _ => self.dense_layout(&shape, &used, &mut rng),
        };
        let BlockLayout {
            logical,
            n_logical,
            phys,
            num_blocks,
            kv_block_stride,
            base,
        } = layout;
        let phys = |l: usize| phys[l];

        let pad_value = |rng: &mut TestRng| -> i64 {
            match self.padding {
                Padding::Zero => 0,
                Padding::MinusOne => -1,
                Padding::Huge => i32::MAX as i64,
                Padding::Garbage => (base + n_logical as u64 + (rng.next_u32() % 2) as u64)
                    .min(i32::MAX as u64) as i64,
                Padding::Stale => {
                    (rng.random_range(1..num_blocks.max(2))).min(i32::MAX as u64) as i64
                }
            }
        };
        let mut entries = Vec::with_capacity(batch * row_stride);
        for row in &logical {
            for j in 0..row_stride {
                entries.push(if j < row.len() {
                    phys(row[j]) as i64
                } else {
                    pad_value(&mut rng)
                });
            }
        }

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
        // The output-offset axis: a row stride of 2^20 floats (max_model_len = 1<<20 in
        // AITER #4244) so a few hundred rows pass 2^31 bytes.
        let out_row_stride = if self.big_output {
            (max_model_len + self.out_stride_pad).max(1 << 20)
        } else {
            max_model_len + self.out_stride_pad
        };
        let mut context_lens = context_lens;
        let mut shape = shape;
        if self.big_output {
            // Prepend zero-length sequences until their rows alone cover 2^31 bytes, so
            // every row of the real sequences starts past 2 GiB (an int32 byte offset of
            // any of their stores overflows). Built in one pass: prepending one sequence
            // at a time is quadratic in the (possibly millions of) padding rows.
            let row_bytes = out_row_stride as u64 * 4;
            let pad_rows = (1u64 << 31).div_ceil(row_bytes) as usize;
            let pad_seqs = pad_rows.div_ceil(self.next_n);
            shape.batch += pad_seqs;
            rows += pad_seqs * self.next_n;
            match &mut context_lens {
                ContextLens::PerSequence(v) => {
                    v.splice(0..0, std::iter::repeat_n(0, pad_seqs));
                }
                ContextLens::PerToken(v) => {
                    v.splice(0..0, std::iter::repeat_n(vec![0; self.next_n], pad_seqs));
                }
            }
            let pad: Vec<i64> = (0..pad_seqs * row_stride)
                .map(|_| pad_value(&mut rng))
                .collect();
            entries.splice(0..0, pad);
        }
        let values = Values::draw(&shape, self.values, &mut rng, n_logical);
        let mut kv = SparseKvCache::default();
        for (l, bytes) in values.blocks.into_iter().enumerate() {
            kv.blocks.insert(phys(l), bytes);
        }
        // Padding::Garbage may name an unreferenced id past num_blocks: keep it inside.
        let num_blocks = if matches!(self.offsets, OffsetClass::Pool(_)) {
            num_blocks
        } else {
            num_blocks.max(base + n_logical as u64 + 2)
        };
        let _ = rows;
        Case {
            shape,
            num_blocks,
            kv_block_stride,
            context_lens,
            block_table: BlockTable {
                max_blocks,
                row_stride,
                entries,
            },
            max_model_len,
            out_row_stride,
            q: values.q,
            weights: values.weights,
            kv,
        }
    }
    /// Block ids of the layout hazards' recipes: logical ids 0.. in sequence order
    /// (shared prefixes reused), permuted or reversed, shifted so that they straddle the
    /// offset class's byte offset, in a cache a few blocks larger than they need.
    fn dense_layout(&self, shape: &Shape, used: &[usize], rng: &mut TestRng) -> BlockLayout {
        let batch = used.len();
        let kv_block_stride = shape.block_bytes() as u64 + self.kv_stride_pad;
        let prefix = if self.table_order == TableOrder::SharedPrefix {
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
        match self.table_order {
            TableOrder::Permuted => {
                for i in (1..perm.len()).rev() {
                    perm.swap(i, rng.random_range(0..=i));
                }
            }
            TableOrder::Reversed => perm.reverse(),
            _ => {}
        }
        // Physical base so that the ids straddle the target byte offset.
        let base: u64 = match self.offsets.target() {
            None => 0,
            Some(target) => {
                let at = target / kv_block_stride;
                at.saturating_sub(n_logical as u64 / 2)
            }
        };
        let phys: Vec<u64> = perm.iter().map(|&p| base + p as u64).collect();
        let num_blocks = base + n_logical as u64 + 1 + (rng.next_u32() % 3) as u64;
        BlockLayout {
            logical,
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
        let prefix = if self.table_order == TableOrder::SharedPrefix {
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
        let ids = super::pool::allocate(pool, &fresh, &mut rng_for(self.seed ^ POOL_SALT));
        let mut phys = vec![0u64; next];
        for (g, row) in per_request.iter().enumerate() {
            let own = if g > 0 { prefix.min(row.len()) } else { 0 };
            for (k, &l) in row[own..].iter().enumerate() {
                phys[l] = ids[g][k];
            }
        }
        let logical: Vec<Vec<usize>> = (0..batch)
            .map(|b| per_request[b / group][..used[b]].to_vec())
            .collect();
        let base = phys_min(&logical, &phys);
        BlockLayout {
            logical,
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
    logical: Vec<Vec<usize>>,
    n_logical: usize,
    phys: Vec<u64>,
    num_blocks: u64,
    kv_block_stride: u64,
    /// The lowest physical id the layout hands out.
    base: u64,
}

/// The lowest physical id referenced (0 when none).
fn phys_min(logical: &[Vec<usize>], phys: &[u64]) -> u64 {
    logical
        .iter()
        .flatten()
        .map(|&l| phys[l])
        .min()
        .unwrap_or(0)
}

/// A deterministic RNG for a seed (ChaCha through proptest's `TestRng`).
pub fn rng_for(seed: u64) -> TestRng {
    let mut s = [0u8; 32];
    s[..8].copy_from_slice(&seed.to_le_bytes());
    s[8..16].copy_from_slice(&0x6d71_612d_6675_7a7au64.to_le_bytes());
    TestRng::from_seed(RngAlgorithm::ChaCha, &s)
}

/// Values (query and key codes) above which a case is drawn in parallel (below, the
/// threads would cost more than they save; the result is the same either way).
const PARALLEL_DRAW_VALUES: usize = 1 << 16;

/// One draw per seed, each from its own RNG, in order: on every core when `parallel`.
fn per_seed<T: Send>(
    seeds: &[u64],
    parallel: bool,
    draw: impl Fn(&mut TestRng) -> T + Sync,
) -> Vec<T> {
    let one = |&seed: &u64| draw(&mut rng_for(seed));
    if parallel {
        seeds.par_iter().map(one).collect()
    } else {
        seeds.iter().map(one).collect()
    }
}

struct Values {
    q: Vec<u8>,
    weights: Vec<f32>,
    blocks: Vec<Vec<u8>>,
}

/// A standard normal draw (Box-Muller), rounded through bf16 as the model's tensors are.
fn gauss_bf16(rng: &mut TestRng) -> f32 {
    let u1: f64 = rng.random_range(f64::EPSILON..1.0);
    let u2: f64 = rng.random::<f64>();
    let g = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    half::bf16::from_f64(g).to_f32()
}

/// ue8m0: the smallest power of two ≥ x.
fn pow2_ceil(x: f64) -> f64 {
    2f64.powi(x.log2().ceil() as i32)
}

/// Quantizes a vector as the pipeline does: scale = pow2_ceil(max(amax, 1e-4) / fp8max).
fn quantize(format: Fp8Format, xs: &[f32]) -> (Vec<u8>, f32) {
    let amax = xs.iter().fold(0f32, |m, x| m.max(x.abs())) as f64;
    let scale = pow2_ceil(amax.max(1e-4) / format.max());
    (
        xs.iter()
            .map(|&x| format.encode(x as f64 / scale, true))
            .collect(),
        scale as f32,
    )
}

fn neg_code(format: Fp8Format, c: u8) -> u8 {
    match format {
        Fp8Format::E4m3fnuz if c == 0 => 0,
        _ => c ^ 0x80,
    }
}

/// A random finite code of the format.
fn finite_code(format: Fp8Format, rng: &mut TestRng) -> u8 {
    loop {
        let c = rng.next_u32() as u8;
        if !format.is_nan_code(c) {
            return c;
        }
    }
}

impl Values {
    fn draw(shape: &Shape, kind: ValueKind, rng: &mut TestRng, n_blocks: usize) -> Values {
        let (h, d, bs) = (shape.heads, shape.head_dim, shape.block_size);
        let rows = shape.rows();
        // Queries and weights, row by row, and keys, block by block: each from its own
        // seed (drawn in order from the case's stream), so large cases are drawn on every
        // core and the case is the same whatever the thread count.
        let row_seeds: Vec<u64> = (0..rows).map(|_| rng.next_u64()).collect();
        let block_seeds: Vec<u64> = (0..n_blocks).map(|_| rng.next_u64()).collect();
        let parallel = (rows * h + n_blocks * bs) * d >= PARALLEL_DRAW_VALUES;
        let drawn = per_seed(&row_seeds, parallel, |r| Values::draw_row(shape, kind, r));
        let blocks = per_seed(&block_seeds, parallel, |r| {
            Values::draw_block(shape, kind, r)
        });
        let mut q = Vec::with_capacity(rows * h * d);
        let mut weights = Vec::with_capacity(rows * h);
        for (codes, w) in drawn {
            q.extend(codes);
            weights.extend(w);
        }
        let mut v = Values { q, weights, blocks };
        if kind.is_hostile() {
            v.make_hostile(shape, rng);
        }
        v
    }

    /// One row's queries (H x D codes) and head weights.
    fn draw_row(shape: &Shape, kind: ValueKind, rng: &mut TestRng) -> (Vec<u8>, Vec<f32>) {
        let (h, d, f) = (shape.heads, shape.head_dim, shape.format);
        let head_scale = (d as f32).powf(-0.5) * (h as f32).powf(-0.5);
        let mut q = Vec::with_capacity(h * d);
        let mut weights = Vec::with_capacity(h);
        for _ in 0..h {
            let w_model = gauss_bf16(rng);
            let (codes, q_scale) = match kind {
                ValueKind::Pipeline | ValueKind::Hostile => {
                    let xs: Vec<f32> = (0..d).map(|_| gauss_bf16(rng)).collect();
                    quantize(f, &xs)
                }
                ValueKind::UniformCodes => ((0..d).map(|_| finite_code(f, rng)).collect(), 1.0),
                ValueKind::Extreme => ((0..d).map(|_| extreme_code(f, rng)).collect(), 1.0),
                ValueKind::ReluBoundary => {
                    // Symmetric halves: q[d] == q[d + D/2].
                    let half: Vec<u8> = (0..d / 2).map(|_| finite_code(f, rng) & 0x7F).collect();
                    let half: Vec<u8> = half
                        .into_iter()
                        .map(|c| if f.is_nan_code(c) { 0x30 } else { c })
                        .collect();
                    (half.iter().chain(half.iter()).copied().collect(), 1.0)
                }
                ValueKind::AllNegative => ((0..d).map(|_| positive_code(f, rng)).collect(), 1.0),
            };
            q.extend(codes);
            let w = match kind {
                ValueKind::AllNegative => w_model.abs() * q_scale * head_scale,
                _ => w_model * q_scale * head_scale,
            };
            weights.push(w);
        }
        (q, weights)
    }

    /// One block of keys and their scales.
    fn draw_block(shape: &Shape, kind: ValueKind, rng: &mut TestRng) -> Vec<u8> {
        let (d, bs, f) = (shape.head_dim, shape.block_size, shape.format);
        let mut block = vec![0u8; shape.block_bytes()];
        for p in 0..bs {
            let (codes, scale): (Vec<u8>, f32) = match kind {
                ValueKind::Pipeline | ValueKind::Hostile => {
                    let xs: Vec<f32> = (0..d).map(|_| gauss_bf16(rng)).collect();
                    quantize(f, &xs)
                }
                ValueKind::UniformCodes => (
                    (0..d).map(|_| finite_code(f, rng)).collect(),
                    2f32.powi(rng.random_range(-12..4)),
                ),
                ValueKind::Extreme => (
                    (0..d).map(|_| extreme_code(f, rng)).collect(),
                    2f32.powi(rng.random_range(-14..-6)),
                ),
                ValueKind::ReluBoundary => {
                    // k[D/2 + j] = -k[j]: every dot against a symmetric query is exactly 0;
                    // then nudge one code by one step in a third of the tokens.
                    let half: Vec<u8> = (0..d / 2).map(|_| finite_code(f, rng)).collect();
                    let mut codes: Vec<u8> = half
                        .iter()
                        .copied()
                        .chain(half.iter().map(|&c| neg_code(f, c)))
                        .collect();
                    if rng.random_range(0..3) == 0 {
                        let j = rng.random_range(0..d);
                        let c = codes[j];
                        let bumped = if c & 0x7F < f.max_code() {
                            c + 1
                        } else {
                            c - 1
                        };
                        if !f.is_nan_code(bumped) {
                            codes[j] = bumped;
                        }
                    }
                    (codes, 2f32.powi(rng.random_range(-10..0)))
                }
                ValueKind::AllNegative => (
                    (0..d).map(|_| neg_code(f, positive_code(f, rng))).collect(),
                    2f32.powi(rng.random_range(-10..0)),
                ),
            };
            Case::write_token(shape, &mut block, p, &codes, scale);
        }
        block
    }

    /// Sprinkles invalid values into a pipeline draw.
    fn make_hostile(&mut self, shape: &Shape, rng: &mut TestRng) {
        let f = shape.format;
        let nan = f.nan_code();
        // fnuz data read as fn and back: 0x80 appears (NaN in fnuz, -0 in fn).
        let odd_codes = [nan, nan | 0x80, 0x80, f.max_code(), f.max_code() | 0x80];
        let n = self.q.len();
        for _ in 0..rng.random_range(0..=2) {
            let i = rng.random_range(0..n);
            self.q[i] = odd_codes[rng.random_range(0..odd_codes.len())];
        }
        let odd_f32 = [
            0.0f32,
            -0.0,
            -1.0,
            -0.015625,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        for _ in 0..rng.random_range(0..=2) {
            let i = rng.random_range(0..self.weights.len());
            self.weights[i] = odd_f32[rng.random_range(0..odd_f32.len())];
        }
        let (bs, d) = (shape.block_size, shape.head_dim);
        for block in &mut self.blocks {
            for _ in 0..rng.random_range(0..=2) {
                let p = rng.random_range(0..bs);
                if rng.random_bool(0.5) {
                    let off = shape.layout.value_offset(d, p, rng.random_range(0..d));
                    block[off] = odd_codes[rng.random_range(0..odd_codes.len())];
                } else {
                    let off = bs * d + 4 * p;
                    let s = odd_f32[rng.random_range(0..odd_f32.len())];
                    block[off..off + 4].copy_from_slice(&s.to_le_bytes());
                }
            }
        }
    }
}

fn extreme_code(f: Fp8Format, rng: &mut TestRng) -> u8 {
    let sign = if rng.random_bool(0.5) { 0x80 } else { 0 };
    let mag = match rng.random_range(0..4) {
        0 => f.max_code(),
        1 => rng.random_range(1..8u8), // subnormals
        2 => 0,
        _ => rng.random_range(1..f.max_code()),
    };
    let c = sign | mag;
    if f.is_nan_code(c) {
        mag
    } else {
        c
    }
}

fn positive_code(f: Fp8Format, rng: &mut TestRng) -> u8 {
    rng.random_range(1..=f.max_code())
}
