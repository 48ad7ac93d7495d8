//! The case model: every input of the FP8 paged MQA logits operation (DESIGN §1).
//!
//! A [`Case`] is plain data: shapes, lengths, the block table, the query, the weights
//! and a *sparse* KV cache that holds only the blocks the table references, keyed by
//! physical block id. That is what lets a case describe a cache of many GiB (block ids
//! whose byte offsets pass 2^31 and 2^32) while holding a few MiB on the host.

mod encoding;
mod io;
mod kv;
mod validate;

pub use io::{
    load_case_bytes, load_case_file, save_case_file, tensors_to_safetensors, CaseFile,
    CaseFileError, Expected, Provenance, FORMAT_VERSION, TABLE_INLINE_MAX,
};
pub use kv::{BlockDrawer, DrawnValues, SparseKvCache};
pub(crate) use validate::validate_shape_dims;
pub use validate::{CaseError, MAX_NEXT_N};

use crate::fp8::Fp8Format;
use serde::{Deserialize, Serialize};

/// Where values sit inside a block (DESIGN §1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValueLayout {
    /// Token `p`, dim `d` at `p*D + d`.
    Normal,
    /// AMD preshuffle: 16x16 tiles, `(p/16)*16*D + (d/16)*256 + (p%16)*16 + d%16`.
    Shuffle16,
}

impl ValueLayout {
    pub const ALL: [ValueLayout; 2] = [ValueLayout::Normal, ValueLayout::Shuffle16];

    pub fn name(self) -> &'static str {
        match self {
            ValueLayout::Normal => "normal",
            ValueLayout::Shuffle16 => "shuffle16",
        }
    }

    /// Byte offset of token slot `p`, dim `d` inside a block's value area.
    #[inline]
    pub fn value_offset(self, head_dim: usize, p: usize, d: usize) -> usize {
        match self {
            ValueLayout::Normal => p * head_dim + d,
            ValueLayout::Shuffle16 => {
                (p / 16) * 16 * head_dim + (d / 16) * 256 + (p % 16) * 16 + d % 16
            }
        }
    }
}

/// Where the per-token KV scale is applied. Identical for positive scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScalePlacement {
    /// DeepGEMM: `s * Σ_h w_h * relu(q·k)`.
    AfterReluSum,
    /// AITER: `Σ_h w_h * relu(s * q·k)`.
    InsideRelu,
}

impl ScalePlacement {
    pub fn name(self) -> &'static str {
        match self {
            ScalePlacement::AfterReluSum => "after_relu_sum",
            ScalePlacement::InsideRelu => "inside_relu",
        }
    }
}

/// Context lengths: one per sequence (1-D) or one per query token (2-D).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContextLens {
    /// `[B]`: row `b*N+i` sees tokens `0..=ctx[b]-N+i`.
    PerSequence(Vec<i64>),
    /// `[B][N]`: row `b*N+i` sees tokens `0..ctx[b][i]`.
    PerToken(Vec<Vec<i64>>),
}

impl ContextLens {
    pub fn is_2d(&self) -> bool {
        matches!(self, ContextLens::PerToken(_))
    }
}

/// The block table `[B, max_blocks]`, stored with its row stride (which may exceed
/// `max_blocks`). Entries past a sequence's used blocks are padding.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BlockTable {
    pub max_blocks: usize,
    pub row_stride: usize,
    /// `B * row_stride` entries, row-major, int32 as every kernel reads them (files
    /// keep int64; a loader refuses an entry that does not fit). A compact table
    /// ([`Self::compact`]) holds only each row's first `tail.held[b]` entries, back to
    /// back.
    pub entries: Vec<i32>,
    /// How the generator made every entry past each row's first `held[b]` (its padding
    /// rule), so that a transport can send those first entries and the rule instead of
    /// an engine-sized table (hundreds of millions of entries at block size 1). Not part
    /// of the case: files never hold it, equality ignores it, and anything that builds
    /// or edits entries by other means leaves it `None`.
    #[serde(skip)]
    pub tail: Option<TableTail>,
    /// Set on a compact table (a generated one that is mostly padding, or a worker's
    /// read from a request that sent the table as its tail): where each row's held
    /// entries start in `entries`, and the end. [`Self::expand`] makes the table whole.
    #[serde(skip)]
    pub row_starts: Option<Vec<usize>>,
}

/// The entries of a block table past each row's first `held[b]`, as a rule of the
/// entry's index `b * row_stride + j` ([`TailRule::entry`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableTail {
    pub rule: TailRule,
    /// Entries held per row (the generator's: each row's used blocks).
    pub held: Vec<usize>,
}

/// The value of a padding entry, a pure function of its index in the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TailRule {
    /// Every entry is this value.
    Fill(i32),
    /// `min(lo + splitmix64(key ^ splitmix64(index)) % span, i32::MAX)`
    /// (`kernels/generate.cu`'s `table_tail` computes the same).
    Hash { key: u64, lo: u64, span: u64 },
}

impl TailRule {
    /// The entry at table index `index`.
    #[inline]
    pub fn entry(&self, index: u64) -> i32 {
        use crate::util::splitmix64;
        match *self {
            TailRule::Fill(v) => v,
            TailRule::Hash { key, lo, span } => {
                let h = splitmix64(key ^ splitmix64(index));
                lo.saturating_add(h % span.max(1)).min(i32::MAX as u64) as i32
            }
        }
    }
}

impl BlockTable {
    #[inline]
    pub fn get(&self, b: usize, j: usize) -> i64 {
        match (&self.row_starts, &self.tail) {
            (Some(starts), Some(t)) => {
                let (start, end) = (starts[b], starts[b + 1]);
                if j < end - start {
                    self.entries[start + j] as i64
                } else {
                    t.rule.entry((b * self.row_stride + j) as u64) as i64
                }
            }
            _ => self.entries[b * self.row_stride + j] as i64,
        }
    }

    /// Whether only each row's held entries are here ([`Self::row_starts`]).
    pub fn is_compact(&self) -> bool {
        self.row_starts.is_some()
    }

    /// Entries held by row `b`: `row_stride`, or its held count when compact.
    pub fn held_by(&self, b: usize) -> usize {
        match &self.row_starts {
            Some(starts) => starts[b + 1] - starts[b],
            None => self.row_stride,
        }
    }

    /// Rows of the table.
    pub fn rows(&self) -> usize {
        match &self.row_starts {
            Some(starts) => starts.len().saturating_sub(1),
            None => self.entries.len().checked_div(self.row_stride).unwrap_or(0),
        }
    }

    /// Makes a compact table whole (every entry held), on every core.
    pub fn expand(&mut self) {
        use rayon::prelude::*;
        let (Some(starts), Some(t)) = (&self.row_starts, &self.tail) else {
            return;
        };
        let stride = self.row_stride;
        // Zero padding is left as the zeroed allocation has it.
        let zero = t.rule == TailRule::Fill(0);
        let mut full = vec![0i32; self.rows() * stride];
        full.par_chunks_mut(stride.max(1))
            .enumerate()
            .for_each(|(b, row)| {
                let held = &self.entries[starts[b]..starts[b + 1]];
                row[..held.len()].copy_from_slice(held);
                if !zero {
                    for (j, e) in row.iter_mut().enumerate().skip(held.len()) {
                        *e = t.rule.entry((b * stride + j) as u64);
                    }
                }
            });
        self.entries = full;
        self.row_starts = None;
    }

    /// Whether a whole table's tail follows its rule, checked on a sample of the
    /// tail's entries (every row's first and last included): a table whose entries
    /// were edited after the generator set its tail fails it, and travels whole.
    pub fn tail_holds(&self) -> bool {
        let Some(t) = self.tail.as_ref().filter(|_| !self.is_compact()) else {
            return false;
        };
        let (stride, rows) = (self.row_stride, self.rows());
        if t.held.len() != rows || t.held.iter().any(|&h| h > stride) || stride == 0 {
            return false;
        }
        let agrees = |b: usize, j: usize| {
            j < t.held[b] || self.entries[b * stride + j] == t.rule.entry((b * stride + j) as u64)
        };
        let mut x = 0x5eed_7a11u64;
        (0..rows).all(|b| agrees(b, t.held[b].min(stride - 1)) && agrees(b, stride - 1))
            && (rows == 0
                || (0..256).all(|_| {
                    x = crate::util::splitmix64(x);
                    let b = (x >> 32) as usize % rows;
                    let j = t.held[b] + (x as u32 as usize) % (stride - t.held[b]).max(1);
                    agrees(b, j.min(stride - 1))
                }))
    }

    /// Every entry, row-major (`B * row_stride`): the entries themselves, or a compact
    /// table's made whole.
    pub fn whole_entries(&self) -> std::borrow::Cow<'_, [i32]> {
        if self.is_compact() {
            let mut t = self.clone();
            t.expand();
            std::borrow::Cow::Owned(t.entries)
        } else {
            std::borrow::Cow::Borrowed(&self.entries)
        }
    }

    /// Entries of the whole table (`B * row_stride`), however many are held.
    pub fn len(&self) -> usize {
        self.rows() * self.row_stride
    }

    /// Whether the table has no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Each row's held entries of a whole table with a tail, back to back: what a
    /// transport sends with the rule (after [`Self::tail_holds`]; a compact table's
    /// `entries` are these already).
    pub fn held_entries(&self) -> Option<Vec<i32>> {
        let t = self.tail.as_ref().filter(|_| !self.is_compact())?;
        let stride = self.row_stride;
        let mut held = Vec::with_capacity(t.held.iter().sum());
        for (b, &h) in t.held.iter().enumerate() {
            held.extend_from_slice(&self.entries[b * stride..b * stride + h]);
        }
        Some(held)
    }

    /// A compact table: row `b` holds `held[b]` of the `held_entries` (back to back),
    /// the rest of it is `rule`'s. `None` when the counts do not add up or pass the
    /// stride.
    pub fn compact(
        max_blocks: usize,
        row_stride: usize,
        held_entries: Vec<i32>,
        rule: TailRule,
        held: Vec<usize>,
    ) -> Option<Self> {
        let mut starts = Vec::with_capacity(held.len() + 1);
        let mut at = 0usize;
        starts.push(0);
        for &h in &held {
            if h > row_stride {
                return None;
            }
            at = at.checked_add(h)?;
            starts.push(at);
        }
        (at == held_entries.len()).then_some(BlockTable {
            max_blocks,
            row_stride,
            entries: held_entries,
            tail: Some(TableTail { rule, held }),
            row_starts: Some(starts),
        })
    }

    /// A whole table of `entries` (no tail rule).
    pub fn whole(max_blocks: usize, row_stride: usize, entries: Vec<i32>) -> Self {
        BlockTable {
            max_blocks,
            row_stride,
            entries,
            tail: None,
            row_starts: None,
        }
    }
}

/// Tables are equal when every entry is, however they are held.
impl PartialEq for BlockTable {
    fn eq(&self, other: &Self) -> bool {
        use rayon::prelude::*;
        if self.max_blocks != other.max_blocks || self.row_stride != other.row_stride {
            return false;
        }
        if !self.is_compact() && !other.is_compact() {
            return self.entries == other.entries;
        }
        let rows = self.rows();
        rows == other.rows()
            && (0..rows)
                .into_par_iter()
                .all(|b| (0..self.row_stride).all(|j| self.get(b, j) == other.get(b, j)))
    }
}

impl Eq for BlockTable {}

/// The shape and encoding of a case.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shape {
    /// B: sequences.
    pub batch: usize,
    /// N: query tokens per sequence (1 + speculative tokens).
    pub next_n: usize,
    /// H: index heads.
    pub heads: usize,
    /// D: head dimension.
    pub head_dim: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    pub layout: ValueLayout,
    pub format: Fp8Format,
}

impl Shape {
    pub fn rows(&self) -> usize {
        self.batch * self.next_n
    }
    /// Bytes of one block's contents: `bs*D` fp8 codes then `bs` f32 scales.
    pub fn block_bytes(&self) -> usize {
        self.block_size * (self.head_dim + 4)
    }
}

/// How a case's values were drawn (DESIGN §3): a property of the case's data that the
/// value generator (`generate::values`) implements and a device worker reproduces.
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

/// One complete test case of the operation.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    pub shape: Shape,
    /// Blocks in the full (device) cache.
    pub num_blocks: u64,
    /// Bytes from one block to the next (≥ `block_bytes`, multiple of 4).
    pub kv_block_stride: u64,
    pub context_lens: ContextLens,
    pub block_table: BlockTable,
    /// Output columns.
    pub max_model_len: usize,
    /// Output row stride in elements (≥ `max_model_len`).
    pub out_row_stride: usize,
    /// fp8 codes `[B, N, H, D]`.
    pub q: Vec<u8>,
    /// `[B*N, H]`.
    pub weights: Vec<f32>,
    pub kv: SparseKvCache,
}

impl Case {
    pub fn rows(&self) -> usize {
        self.shape.rows()
    }

    /// Bytes of the full device cache: `num_blocks * kv_block_stride`.
    pub fn kv_cache_bytes(&self) -> u64 {
        self.num_blocks.saturating_mul(self.kv_block_stride)
    }

    /// Byte offset of the highest stored block (`id * kv_block_stride`; 0 without one):
    /// where 32-bit address arithmetic breaks.
    pub fn max_kv_offset(&self) -> u64 {
        self.kv
            .max_id()
            .map_or(0, |id| id.saturating_mul(self.kv_block_stride))
    }

    /// Bytes of the full output buffer (`rows * out_row_stride * 4`).
    pub fn output_bytes(&self) -> u64 {
        (self.rows() as u64)
            .saturating_mul(self.out_row_stride as u64)
            .saturating_mul(4)
    }

    /// Length of the valid set V(r) of row `r = b*N + i`: positions `0..valid_len(r)`.
    /// This is exactly what the downstream top-k reads.
    pub fn valid_len(&self, r: usize) -> usize {
        let n = self.shape.next_n;
        let (b, i) = (r / n, r % n);
        match &self.context_lens {
            ContextLens::PerSequence(c) => (c[b] - n as i64 + i as i64 + 1).max(0) as usize,
            ContextLens::PerToken(c) => c[b][i].max(0) as usize,
        }
    }

    /// Tokens of sequence `b` a kernel must read (the largest valid length of its rows;
    /// for 1-D lengths that is `ctx[b]`).
    pub fn seq_tokens(&self, b: usize) -> usize {
        match &self.context_lens {
            ContextLens::PerSequence(c) => c[b].max(0) as usize,
            ContextLens::PerToken(c) => c[b].iter().copied().max().unwrap_or(0).max(0) as usize,
        }
    }

    /// Blocks of the table row `b` that hold tokens.
    pub fn blocks_used(&self, b: usize) -> usize {
        self.seq_tokens(b).div_ceil(self.shape.block_size)
    }

    /// Physical block and slot of token `t` of sequence `b`.
    #[inline]
    pub fn token_location(&self, b: usize, t: usize) -> (u64, usize) {
        let bs = self.shape.block_size;
        (self.block_table.get(b, t / bs) as u64, t % bs)
    }

    /// The stored bytes of a referenced block (validation guarantees presence).
    #[inline]
    pub fn block(&self, id: u64) -> &[u8] {
        self.kv
            .get(id)
            .unwrap_or_else(|| panic!("block {id} is not in the cache"))
    }

    /// fp8 code of slot `p`, dim `d` of a block's bytes.
    #[inline]
    pub fn k_code(&self, block: &[u8], p: usize, d: usize) -> u8 {
        block[self.shape.layout.value_offset(self.shape.head_dim, p, d)]
    }

    /// Scale of slot `p` of a block's bytes.
    #[inline]
    pub fn k_scale(&self, block: &[u8], p: usize) -> f32 {
        let off = self.shape.block_size * self.shape.head_dim + 4 * p;
        f32::from_le_bytes(block[off..off + 4].try_into().unwrap())
    }

    /// The `D` query codes of sequence `b`, token `i`, head `h`.
    #[inline]
    pub fn q_codes(&self, b: usize, i: usize, h: usize) -> &[u8] {
        let s = &self.shape;
        let off = ((b * s.next_n + i) * s.heads + h) * s.head_dim;
        &self.q[off..off + s.head_dim]
    }

    #[inline]
    pub fn weight(&self, r: usize, h: usize) -> f32 {
        self.weights[r * self.shape.heads + h]
    }

    /// Total valid logits over all rows.
    pub fn valid_elements(&self) -> u64 {
        (0..self.rows()).map(|r| self.valid_len(r) as u64).sum()
    }

    /// Writes the key of token slot `p` (codes and scale) into a block's bytes.
    pub fn write_token(shape: &Shape, block: &mut [u8], p: usize, codes: &[u8], scale: f32) {
        for (d, &c) in codes.iter().enumerate() {
            block[shape.layout.value_offset(shape.head_dim, p, d)] = c;
        }
        let off = shape.block_size * shape.head_dim + 4 * p;
        block[off..off + 4].copy_from_slice(&scale.to_le_bytes());
    }
}
