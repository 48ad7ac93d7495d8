//! Values: the query, weight and KV block values of each [`ValueKind`] (pipeline
//! quantisation, extremes, the relu edge, hostile codes). Each row and block draws
//! from its own stream of the counter-based generator ([`super::philox`]), so the same
//! recipe gives the same bytes on any number of threads, and on the device.

use super::philox::{self, Stream};
use super::recipe::ValueKind;
use crate::case::{BlockDrawer, Case, DrawnValues, Shape, SparseKvCache};
use crate::fp8::Fp8Format;
use proptest::test_runner::{RngAlgorithm, TestRng};
use rand::{Rng, RngExt};
use rayon::prelude::*;

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

/// One draw per stream of `seed`, in order: on every core when `parallel`.
fn per_stream<T: Send>(
    seed: u64,
    streams: &[u64],
    parallel: bool,
    draw: impl Fn(&mut Stream) -> T + Sync,
) -> Vec<T> {
    let one = |&s: &u64| draw(&mut Stream::new(seed, s));
    if parallel {
        streams.par_iter().map(one).collect()
    } else {
        streams.iter().map(one).collect()
    }
}

pub(crate) struct Values {
    pub(super) q: Vec<u8>,
    pub(super) weights: Vec<f32>,
    /// The keys' recipe: block `l` is [`Values::draw_block`] of stream
    /// `BLOCK_STREAM | l` of this seed.
    pub(super) drawn: DrawnValues,
    /// The blocks themselves where they are not a function of the recipe alone (hostile
    /// values are sprinkled in afterwards); `None`: draw them from `drawn` on use.
    pub(super) blocks: Option<Vec<Vec<u8>>>,
}

/// Draws the blocks of a drawn cache (see [`drawn_cache`]).
struct KvDrawer {
    shape: Shape,
    values: DrawnValues,
}

impl BlockDrawer for KvDrawer {
    fn draw(&self, l: usize) -> Vec<u8> {
        let mut st = Stream::new(self.values.seed, philox::BLOCK_STREAM | l as u64);
        Values::draw_block(&self.shape, self.values.kind, &mut st)
    }
}

/// The KV cache of a generated case whose block `l` has physical id `ids[l]`, each block
/// drawn from the recipe on first use: the same bytes [`Values::draw`] gives, without
/// holding them until someone reads them. Hostile values are not a function of the
/// recipe alone and cannot be drawn so.
pub fn drawn_cache(
    shape: &Shape,
    values: DrawnValues,
    ids: Vec<u64>,
) -> Result<SparseKvCache, String> {
    if values.kind.is_hostile() {
        return Err("hostile values cannot be drawn from their seed alone".into());
    }
    let drawer = KvDrawer {
        shape: shape.clone(),
        values,
    };
    Ok(SparseKvCache::drawn(values, ids, Box::new(drawer)))
}

/// The weights' model scale `1/sqrt(D·H)`, in f32 as the weights are.
pub(crate) fn head_scale(shape: &Shape) -> f32 {
    (shape.head_dim as f32).powf(-0.5) * (shape.heads as f32).powf(-0.5)
}

fn neg_code(format: Fp8Format, c: u8) -> u8 {
    match format {
        Fp8Format::E4m3fnuz if c == 0 => 0,
        _ => c ^ 0x80,
    }
}

/// A random finite code of the format.
fn finite_code(format: Fp8Format, rng: &mut impl Rng) -> u8 {
    loop {
        let c = rng.next_u32() as u8;
        if !format.is_nan_code(c) {
            return c;
        }
    }
}

impl Values {
    pub(super) fn draw(
        shape: &Shape,
        kind: ValueKind,
        rng: &mut TestRng,
        n_blocks: usize,
    ) -> Values {
        let (h, d, bs) = (shape.heads, shape.head_dim, shape.block_size);
        let rows = shape.rows();
        // Queries and weights, row by row, and keys, block by block: each from its own
        // stream of the value seed (the next word of the case's RNG), so large cases are
        // drawn on every core and the case is the same whatever the thread count.
        let seed = rng.next_u64();
        let parallel = (rows * h + n_blocks * bs) * d >= PARALLEL_DRAW_VALUES;
        let row_streams: Vec<u64> = (0..rows as u64).collect();
        let drawn = per_stream(seed, &row_streams, parallel, |st| {
            Values::draw_row(shape, kind, st)
        });
        let mut q = Vec::with_capacity(rows * h * d);
        let mut weights = Vec::with_capacity(rows * h);
        for (codes, w) in drawn {
            q.extend(codes);
            weights.extend(w);
        }
        let mut v = Values {
            q,
            weights,
            drawn: DrawnValues { seed, kind },
            blocks: None,
        };
        if kind.is_hostile() {
            let block_streams: Vec<u64> = (0..n_blocks as u64)
                .map(|i| philox::BLOCK_STREAM | i)
                .collect();
            v.blocks = Some(per_stream(seed, &block_streams, parallel, |st| {
                Values::draw_block(shape, kind, st)
            }));
            v.make_hostile(shape, rng);
        }
        v
    }

    /// One row's queries (H x D codes) and head weights from its stream.
    pub(crate) fn draw_row(
        shape: &Shape,
        kind: ValueKind,
        rng: &mut Stream,
    ) -> (Vec<u8>, Vec<f32>) {
        let (h, d, f) = (shape.heads, shape.head_dim, shape.format);
        let head_scale = head_scale(shape);
        let mut q = Vec::with_capacity(h * d);
        let mut weights = Vec::with_capacity(h);
        for _ in 0..h {
            let w_model = rng.gauss();
            let (codes, q_scale) = match kind {
                ValueKind::Pipeline | ValueKind::Hostile => {
                    let words: Vec<u32> = (0..d).map(|_| rng.next_word()).collect();
                    let mut codes = Vec::with_capacity(d);
                    let scale = philox::quantize_words(f, &words, &mut codes);
                    (codes, scale)
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

    /// One block of keys and their scales from its stream.
    pub(crate) fn draw_block(shape: &Shape, kind: ValueKind, rng: &mut Stream) -> Vec<u8> {
        let (d, bs, f) = (shape.head_dim, shape.block_size, shape.format);
        let mut block = vec![0u8; shape.block_bytes()];
        for p in 0..bs {
            let (codes, scale): (Vec<u8>, f32) = match kind {
                ValueKind::Pipeline | ValueKind::Hostile => {
                    let words: Vec<u32> = (0..d).map(|_| rng.next_word()).collect();
                    let mut codes = Vec::with_capacity(d);
                    let scale = philox::quantize_words(f, &words, &mut codes);
                    (codes, scale)
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
        for block in self.blocks.iter_mut().flatten() {
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

fn extreme_code(f: Fp8Format, rng: &mut impl Rng) -> u8 {
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

fn positive_code(f: Fp8Format, rng: &mut impl Rng) -> u8 {
    rng.random_range(1..=f.max_code())
}
