//! proptest strategies over [`Draw`]s, per profile, edge-biased: boundaries ±1 (zero,
//! one, next_n, block and chunk edges, `ctx == max_model_len`, byte offsets around 2^31
//! and 2^32) are drawn far more often than uniform sampling would.
//!
//! A `Draw` is independent of the kernel; [`Draw::resolve`] turns it into a [`Recipe`]
//! that fits the kernel's declared capabilities, recording every adjustment so the
//! campaign can count skipped combinations instead of silently dropping them.
//! Every component shrinks toward the simplest value (first alternative, zero, fewer
//! sequences), which is what makes shrunk cases minimal.

use super::engine::{self, EngineDraw};
use super::recipe::{Knobs, LensRecipe, OffsetClass, Padding, Recipe, TableOrder, ValueKind};
use crate::case::ValueLayout;
use crate::fp8::Fp8Format;
use crate::kernel::{Adjustment, Capabilities, Demands};
use proptest::prelude::*;
use serde::{Deserialize, Serialize};

/// What a campaign generates (DESIGN §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// What a serving engine really feeds: churned multi-GiB KV pools with slab strides,
    /// decode batches up to 512, long-tailed contexts to max_model_len, MTP, 1M-column
    /// workspaces, pipeline values (see `generate::engine`).
    Production,
    /// Addresses, strides, tables, lengths: small heads, every block size and edge.
    Layout,
    /// Invalid values: NaN codes, zero/negative/inf/NaN scales and weights.
    Hostile,
    /// A mix of the three.
    All,
}

impl Profile {
    pub fn name(self) -> &'static str {
        match self {
            Profile::Production => "production",
            Profile::Layout => "layout",
            Profile::Hostile => "hostile",
            Profile::All => "all",
        }
    }
}

/// A context length relative to the shape's edges.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LenSpec {
    Zero,
    /// `anchor * mult + delta`, clamped at 0.
    Edge {
        anchor: Anchor,
        mult: u8,
        delta: i8,
    },
    /// Any length up to the profile's maximum.
    Uniform(u16),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Anchor {
    One,
    NextN,
    Block,
    Chunk64,
    Chunk256,
}

/// The lengths of a batch.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LensDraw {
    /// Independent edge-biased lengths, one per sequence (zeros land leading, middle
    /// or trailing by chance).
    Each(Vec<LenSpec>),
    /// 0.7–1.3 × an average, as DeepGEMM's tests draw them.
    AroundAverage { batch: u8, avg: u16, seed: u64 },
    /// One long sequence among short ones.
    Skewed { short: Vec<LenSpec>, long: u16 },
    /// 32·k sequences, all of length 0.
    AllZero { groups: u8 },
    /// Exact lengths, one per request (the engine model's draws).
    Explicit(Vec<u32>),
}

/// Everything drawn for one case, before the kernel's capabilities are applied.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Draw {
    #[serde(flatten)]
    pub knobs: Knobs,
    /// The shuffle16 value layout, where the block size and head dim allow it.
    pub shuffle16: bool,
    pub lens: LensDraw,
    /// Per-token (2-D) lengths: perturbations of the standard causal lengths.
    pub per_token: Option<Vec<i8>>,
    /// The engine model of a production draw (`None` for the other profiles).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineDraw>,
}

impl Draw {
    /// A draw of the profiles without an engine model.
    fn dense(knobs: Knobs, shuffle16: bool, lens: LensDraw, per_token: Option<Vec<i8>>) -> Draw {
        Draw {
            knobs,
            shuffle16,
            lens,
            per_token,
            engine: None,
        }
    }
}

/// The knobs of a drawn shape, every hazard off ([`Knobs::production`]'s).
fn shaped(
    next_n: usize,
    heads: usize,
    head_dim: usize,
    block_size: usize,
    format: Fp8Format,
    seed: u64,
) -> Knobs {
    Knobs {
        heads,
        head_dim,
        block_size,
        format,
        ..Knobs::production(next_n, seed)
    }
}

fn len_spec(max: u16) -> impl Strategy<Value = LenSpec> {
    let anchor = prop_oneof![
        Just(Anchor::One),
        Just(Anchor::NextN),
        Just(Anchor::Block),
        Just(Anchor::Chunk64),
        Just(Anchor::Chunk256),
    ];
    prop_oneof![
        2 => Just(LenSpec::Zero),
        6 => (anchor, prop_oneof![4 => Just(1u8), 1 => 2u8..=4], -2i8..=2).prop_map(|(anchor, mult, delta)| LenSpec::Edge { anchor, mult, delta }),
        3 => (0..=max).prop_map(LenSpec::Uniform),
    ]
}

fn lens_draw(max: u16, max_batch: usize, production: bool) -> impl Strategy<Value = LensDraw> {
    let each = proptest::collection::vec(len_spec(max), 1..=max_batch).prop_map(LensDraw::Each);
    let avg = (1u8..=8, 64u16..=max.max(64), any::<u64>())
        .prop_map(|(batch, avg, seed)| LensDraw::AroundAverage { batch, avg, seed });
    let skewed = (
        proptest::collection::vec(len_spec(64), 1..=4),
        256u16..=max.max(256),
    )
        .prop_map(|(short, long)| LensDraw::Skewed { short, long });
    let zero = (1u8..=2).prop_map(|groups| LensDraw::AllZero { groups });
    if production {
        prop_oneof![3 => each, 6 => avg, 2 => skewed, 1 => zero].sboxed()
    } else {
        prop_oneof![10 => each, 1 => avg, 1 => skewed, 1 => zero].sboxed()
    }
}

/// One of the values, with the given weights (shrinks toward the first).
pub(crate) fn weighted<T: Clone + std::fmt::Debug + Send + Sync + 'static>(
    v: Vec<(u32, T)>,
) -> SBoxedStrategy<T> {
    proptest::strategy::Union::new_weighted(
        v.into_iter().map(|(w, x)| (w, Just(x).sboxed())).collect(),
    )
    .sboxed()
}

fn per_token(max_rows: usize) -> impl Strategy<Value = Option<Vec<i8>>> {
    prop_oneof![
        3 => Just(None),
        1 => proptest::collection::vec(prop_oneof![3 => Just(0i8), 1 => -3i8..=3], 1..=max_rows).prop_map(Some),
    ]
}

/// The strategy of one profile (`All` mixes the other three).
pub fn draw_strategy(profile: Profile) -> SBoxedStrategy<Draw> {
    draw_strategy_for_case(profile, 0)
}

/// The strategy for case `k` of a campaign: the stratified branch of the risky axes
/// takes combination `k mod 74`, so a campaign of a few hundred cases reaches every
/// combination (uniform draws would leave a coupon-collector tail).
pub fn draw_strategy_for_case(profile: Profile, k: u64) -> SBoxedStrategy<Draw> {
    draw_strategy_scaled(profile, k, 1.0)
}

/// As [`draw_strategy_for_case`], with the production profile's context lengths
/// multiplied by `scale` (`--scale`; see `generate::engine`).
pub fn draw_strategy_scaled(profile: Profile, k: u64, scale: f64) -> SBoxedStrategy<Draw> {
    match profile {
        Profile::Production => engine::production(scale).sboxed(),
        Profile::Layout => layout(false, k).sboxed(),
        Profile::Hostile => prop_oneof![
            layout(true, k),
            production().prop_map(|mut d| {
                d.knobs.values = ValueKind::Hostile;
                d
            })
        ]
        .sboxed(),
        Profile::All => prop_oneof![
            2 => layout(false, k),
            1 => engine::production(scale),
            1 => layout(true, k),
        ]
        .sboxed(),
    }
}

fn formats() -> SBoxedStrategy<Fp8Format> {
    weighted(vec![(3, Fp8Format::E4m3fn), (1, Fp8Format::E4m3fnuz)])
}

/// Engine-like shapes at small sizes with pipeline values: the base of the hostile
/// profile's value mutations.
fn production() -> impl Strategy<Value = Draw> {
    let shape = (
        weighted(vec![(3, 1usize), (3, 2), (1, 3), (1, 4)]),
        weighted(vec![(1, 32usize), (3, 64)]),
        weighted(vec![(1, 64usize), (3, 128)]),
        weighted(vec![(4, 64usize), (1, 1), (2, 16), (1, 256)]),
        any::<bool>(),
        formats(),
    );
    let lens = (
        lens_draw(1024, 8, true),
        per_token(4),
        weighted(vec![(1, 0usize), (1, 1), (2, 255)]),
    );
    let table = (
        weighted(vec![
            (2, TableOrder::Permuted),
            (1, TableOrder::Sequential),
            (1, TableOrder::SharedPrefix),
        ]),
        weighted(vec![(2, Padding::Zero), (1, Padding::MinusOne)]),
        0usize..=2,
    );
    (shape, lens, table, any::<u64>()).prop_map(
        |(
            (next_n, heads, head_dim, block_size, shuffle16, format),
            (lens, per_token, slack),
            (order, padding, surplus),
            seed,
        )| {
            let knobs = Knobs {
                model_len_slack: slack,
                table_order: order,
                padding,
                surplus_blocks: surplus,
                ..shaped(next_n, heads, head_dim, block_size, format, seed)
            };
            Draw::dense(knobs, shuffle16, lens, per_token)
        },
    )
}

/// The risky combinations of DESIGN §3 (block size class × next_n class × layout ×
/// offset class), listed so a draw can pick one uniformly: independent weights alone
/// would leave the rare corners (bs 256, next_n ≥ 3, shuffle16, offsets past 4 GiB)
/// unreached for thousands of cases.
fn risky_combos() -> Vec<(u8, u8, bool, OffsetClass)> {
    let mut v = Vec::new();
    for bs in 0u8..5 {
        for n in 0u8..3 {
            for shuffle in [false, true] {
                if shuffle && (bs == 0 || bs == 4) {
                    continue;
                }
                for off in [
                    OffsetClass::Low,
                    OffsetClass::Around2G,
                    OffsetClass::Around4G,
                ] {
                    v.push((bs, n, shuffle, off));
                }
            }
        }
    }
    v
}

/// (next_n, block_size, shuffle16, offsets): independent and edge-biased, or one of the
/// risky combinations drawn uniformly.
fn risky_axes(k: u64) -> impl Strategy<Value = (usize, usize, bool, OffsetClass)> {
    let independent = (
        prop_oneof![4 => Just(1usize), 4 => Just(2usize), 2 => 3usize..=5, 1 => 6usize..=8],
        prop_oneof![
            3 => Just(16usize), 3 => Just(1usize), 3 => Just(64usize), 1 => Just(256usize),
            1 => 2usize..=15, 1 => Just(32usize), 1 => 17usize..=100,
        ],
        any::<bool>(),
        weighted(vec![
            (4, OffsetClass::Low),
            (2, OffsetClass::Around2G),
            (2, OffsetClass::Around4G),
        ]),
    );
    let combos = risky_combos();
    let i = (k % combos.len() as u64) as usize;
    let uniform = (3usize..=8, 2usize..=100).prop_map(move |(n3, other)| {
        let (bs, n, shuffle, off) = combos[i];
        let block_size = match bs {
            0 => 1,
            1 => 16,
            2 => 64,
            3 => 256,
            _ => {
                if [16, 64].contains(&other) {
                    other + 1
                } else {
                    other
                }
            }
        };
        let next_n = match n {
            0 => 1,
            1 => 2,
            _ => n3,
        };
        (next_n, block_size, shuffle, off)
    });
    prop_oneof![1 => independent, 3 => uniform]
}

fn layout(hostile: bool, k: u64) -> impl Strategy<Value = Draw> {
    let shape = (
        risky_axes(k),
        prop_oneof![4 => Just(1usize), 2 => Just(2usize), 2 => Just(4usize), 1 => Just(8usize), 1 => Just(16usize)],
        weighted(vec![(2, 16usize), (2, 32), (1, 64), (1, 128)]),
        formats(),
    );
    let lens = (
        lens_draw(1100, 6, false),
        per_token(8),
        prop_oneof![3 => Just(0usize), 2 => 1usize..=3, 2 => 4usize..=300],
        prop_oneof![3 => Just(0usize), 1 => 1usize..=5, 1 => Just(256usize)],
    );
    let table = (
        weighted(vec![
            (1, TableOrder::Sequential),
            (1, TableOrder::Permuted),
            (1, TableOrder::Reversed),
            (1, TableOrder::SharedPrefix),
        ]),
        weighted(vec![
            (1, Padding::Zero),
            (1, Padding::MinusOne),
            (1, Padding::Huge),
            (1, Padding::Garbage),
        ]),
        prop_oneof![3 => Just(0usize), 1 => 1usize..=4],
        prop_oneof![3 => Just(0usize), 1 => 1usize..=8],
        prop_oneof![2 => Just(0u64), 1 => (1u64..=64).prop_map(|x| 4 * x)],
    );
    let big_output = weighted(vec![(24, false), (1, true)]);
    let values = if hostile {
        Just(ValueKind::Hostile).sboxed()
    } else {
        weighted(vec![
            (3, ValueKind::Pipeline),
            (2, ValueKind::UniformCodes),
            (1, ValueKind::Extreme),
            (1, ValueKind::ReluBoundary),
            (1, ValueKind::AllNegative),
        ])
    };
    // The 2 GiB-output axis comes first: proptest shrinks a tuple front to back, and
    // dropping it first makes every later shrink step cheap.
    (big_output, shape, lens, table, values, any::<u64>()).prop_map(
        |(
            big_output,
            ((next_n, block_size, shuffle16, offsets), heads, head_dim, format),
            (lens, per_token, slack, out_pad),
            (order, padding, surplus, tpad, kvpad),
            values,
            seed,
        )| {
            let knobs = Knobs {
                model_len_slack: slack,
                out_stride_pad: out_pad,
                big_output,
                table_order: order,
                padding,
                surplus_blocks: surplus,
                table_stride_pad: tpad,
                kv_stride_pad: kvpad,
                offsets,
                values,
                ..shaped(next_n, heads, head_dim, block_size, format, seed)
            };
            Draw::dense(knobs, shuffle16, lens, per_token)
        },
    )
}

const CHUNK: usize = 256;

impl LenSpec {
    fn resolve(self, next_n: usize, block_size: usize, max: usize) -> usize {
        match self {
            LenSpec::Zero => 0,
            LenSpec::Edge {
                anchor,
                mult,
                delta,
            } => {
                let a = match anchor {
                    Anchor::One => 1,
                    Anchor::NextN => next_n,
                    Anchor::Block => block_size,
                    Anchor::Chunk64 => 64,
                    Anchor::Chunk256 => CHUNK,
                };
                (a as i64 * mult as i64 + delta as i64).max(0) as usize
            }
            LenSpec::Uniform(x) => (x as usize).min(max),
        }
    }
}

impl Draw {
    /// The recipe this draw gives for a kernel, and the adjustments the kernel's
    /// capabilities forced (each one a skipped combination, counted by the campaign).
    pub fn resolve(&self, caps: &[&Capabilities]) -> (Recipe, Vec<String>) {
        let mut adjust = Vec::new();
        let mut d = self.clone();
        // An engine runs MTP the kernel does not take natively as one row per token.
        let mut rows_per_request = 1;
        let n = d.knobs.next_n;
        if d.engine.is_some() && caps.iter().any(|c| n < c.next_n.0 || n > c.next_n.1) {
            rows_per_request = n;
            d.knobs.next_n = 1;
        }
        for c in caps {
            let mut fitted = d.demands();
            for a in c.fit(&mut fitted) {
                // An engine's pool stride is its own, aligned in `engine_recipe`.
                if !a.drops_a_hazard()
                    || (self.engine.is_some() && matches!(a, Adjustment::KvStride(_)))
                {
                    continue;
                }
                adjust.push(match a {
                    // What the draw gives up is its offset class.
                    Adjustment::KvBytes { .. } => format!("offsets {:?}", d.knobs.offsets),
                    Adjustment::KvStride(_) => UNALIGNED_STRIDE.to_string(),
                    a => a.to_string(),
                });
            }
            d.take(&fitted);
        }
        let layout = engine::layout_of(d.shuffle16, d.knobs.block_size, d.knobs.head_dim);
        if let Some(e) = &self.engine {
            let max_bytes = caps.iter().filter_map(|c| c.max_kv_bytes).min();
            let align = (caps.iter().filter_map(|c| c.kv_stride_align))
                .filter(|&a| a > 1)
                .fold(1, lcm);
            return engine_recipe(&d, e, layout, rows_per_request, max_bytes, align, adjust);
        }
        let base: Vec<usize> = match &d.lens {
            LensDraw::Each(v) => v
                .iter()
                .map(|s| s.resolve(d.knobs.next_n, d.knobs.block_size, 4096))
                .collect(),
            LensDraw::AroundAverage { batch, avg, seed } => {
                let mut rng = super::recipe::rng_for(*seed);
                (0..*batch)
                    .map(|_| {
                        let f =
                            0.7 + 0.6 * (rand::Rng::next_u32(&mut rng) as f64 / u32::MAX as f64);
                        (*avg as f64 * f) as usize
                    })
                    .collect()
            }
            LensDraw::Skewed { short, long } => {
                let mut v: Vec<usize> = short
                    .iter()
                    .map(|s| s.resolve(d.knobs.next_n, d.knobs.block_size, 64))
                    .collect();
                v.insert(v.len() / 2, *long as usize);
                v
            }
            LensDraw::AllZero { groups } => vec![0; 32 * *groups as usize],
            LensDraw::Explicit(v) => v.iter().map(|&x| x as usize).collect(),
        };
        let lens = causal_lens(&d, base);
        let recipe = Recipe {
            knobs: d.knobs,
            layout,
            lens,
        };
        (recipe, adjust)
    }
}

/// The device cache a dense draw at offsets past 2 GiB is counted as needing: its ids
/// straddle 2^31 or 2^32 bytes, so the cache stays within 2^33.
const HIGH_OFFSET_CACHE_BYTES: u64 = 1 << 33;

impl Draw {
    /// What this draw asks of a kernel. An engine draw asks for no cache size here: its
    /// pool is sized to the kernels' memory when it is resolved.
    fn demands(&self) -> Demands {
        let k = &self.knobs;
        let high = k.offsets != OffsetClass::Low && self.engine.is_none();
        Demands {
            format: k.format,
            layout: if self.shuffle16 {
                ValueLayout::Shuffle16
            } else {
                ValueLayout::Normal
            },
            block_size: k.block_size,
            next_n: k.next_n,
            heads: k.heads,
            head_dim: k.head_dim,
            lens_2d: self.per_token.is_some(),
            hostile_values: k.values.is_hostile(),
            kv_bytes: if high { HIGH_OFFSET_CACHE_BYTES } else { 0 },
            kv_stride_pad: k.kv_stride_pad,
        }
    }

    /// Takes the demands a kernel fitted ([`Capabilities::fit`]): a dropped hazard
    /// becomes the plain value (pipeline values, low offsets, 1-D lengths), 2-D lengths
    /// asked for become the standard causal ones.
    fn take(&mut self, fitted: &Demands) {
        let before = self.demands();
        let k = &mut self.knobs;
        k.format = fitted.format;
        k.block_size = fitted.block_size;
        k.next_n = fitted.next_n;
        k.heads = fitted.heads;
        k.head_dim = fitted.head_dim;
        k.kv_stride_pad = fitted.kv_stride_pad;
        self.shuffle16 = fitted.layout == ValueLayout::Shuffle16;
        if fitted.lens_2d != before.lens_2d {
            self.per_token = fitted.lens_2d.then(|| vec![0]);
        }
        if before.hostile_values && !fitted.hostile_values {
            k.values = ValueKind::Pipeline;
        }
        if fitted.kv_bytes < before.kv_bytes {
            k.offsets = OffsetClass::Low;
        }
    }
}

/// What a stride padded up to a kernel's alignment is counted as: one count for every
/// stride it pads up (a draw's padded stride or an engine pool's), not one per stride.
const UNALIGNED_STRIDE: &str = "kv block stride (unaligned)";

/// The least common multiple of two alignments.
fn lcm(a: u64, b: u64) -> u64 {
    let (mut x, mut y) = (a, b);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    a / x * b
}

/// The lengths of a resolved draw: one per sequence, or per token as the standard
/// causal lengths `[ctx-N+1 … ctx]` perturbed by `per_token` (all-zero perturbations:
/// the engine's form).
fn causal_lens(d: &Draw, base: Vec<usize>) -> LensRecipe {
    let n = d.knobs.next_n;
    match &d.per_token {
        None => LensRecipe::PerSequence(base),
        Some(p) => LensRecipe::PerToken(
            base.iter()
                .enumerate()
                .map(|(b, &ctx)| {
                    (0..n)
                        .map(|i| {
                            let std = ctx as i64 - n as i64 + i as i64 + 1;
                            (std + p[(b * n + i) % p.len()] as i64).max(0) as usize
                        })
                        .collect()
                })
                .collect(),
        ),
    }
}

/// A production draw's recipe: the pool for the final block size (within the kernels'
/// device memory, its stride a multiple of `align`), the batch fitted to the pool and to the workspace limit, lengths
/// scaled, MTP flattened where the kernel takes fewer rows, CUDA-graph padding, the
/// model's max_model_len and the engine's full-width block table where it is small.
fn engine_recipe(
    d: &Draw,
    e: &EngineDraw,
    layout: ValueLayout,
    rows_per_request: usize,
    max_bytes: Option<u64>,
    align: u64,
    mut adjust: Vec<String>,
) -> (Recipe, Vec<String>) {
    let bs = d.knobs.block_size;
    let mml = e.max_model_len;
    let n = d.knobs.next_n * rows_per_request; // rows of one request
    let mut pool = e.pool(bs, d.knobs.head_dim, max_bytes, align);
    if pool.stride != e.pool(bs, d.knobs.head_dim, None, 1).stride {
        adjust.push(UNALIGNED_STRIDE.into());
    }
    if pool != e.pool(bs, d.knobs.head_dim, None, align) {
        adjust.push("pool capped at the kernel's device memory".into());
    }
    let mut lens: Vec<usize> = match &d.lens {
        LensDraw::Explicit(v) => v.iter().map(|&x| x as usize).collect(),
        _ => unreachable!("engine draws have explicit lengths"),
    };
    // The scheduler admits what the pool holds; the workspace stays within its limit.
    let capacity = (pool.blocks - 1) as usize;
    let blocks = |v: &[usize]| v.iter().map(|l| l.div_ceil(bs)).sum::<usize>();
    while lens.len() > 1 && blocks(&lens) > capacity {
        lens.pop();
    }
    if blocks(&lens) > capacity {
        lens[0] = lens[0].min(capacity * bs);
    }
    let padded = |b: usize| {
        if e.graph_padding {
            engine::capture_size_for(b)
        } else {
            b
        }
    };
    let workspace = |b: usize| (padded(b) * n) as u64 * mml.next_multiple_of(256) as u64 * 4;
    while lens.len() > 1 && workspace(lens.len()) > engine::MAX_WORKSPACE_BYTES {
        lens.pop();
    }
    for (i, l) in lens.iter_mut().enumerate() {
        if *l > 0 && e.capped != Some(i) {
            *l = ((*l as f64 * e.scale).round() as usize).clamp(n, mml);
        }
    }
    let requests = lens.len();
    lens.resize(padded(requests), 0);
    let base: Vec<usize> = if rows_per_request > 1 {
        lens.iter()
            .flat_map(|&l| (0..n).map(move |i| (l + i + 1).saturating_sub(n)))
            .collect()
    } else {
        lens
    };
    pool.rows_per_request = rows_per_request as u8;
    let longest = base.iter().copied().max().unwrap_or(0);
    let width = mml.div_ceil(bs);
    let need = longest.div_ceil(bs);
    let surplus = if base.len() * width <= engine::FULL_TABLE_ENTRIES {
        width - need
    } else {
        (width - need).min(16)
    };
    let recipe = Recipe {
        knobs: Knobs {
            model_len_slack: mml - longest,
            out_stride_pad: match e.platform {
                engine::Platform::Nvidia => mml.next_multiple_of(256) - mml,
                engine::Platform::Gfx942 | engine::Platform::Gfx950 => 0,
            },
            big_output: false,
            surplus_blocks: surplus,
            table_stride_pad: 0,
            kv_stride_pad: 0,
            offsets: OffsetClass::Pool(pool),
            ..d.knobs.clone()
        },
        layout,
        lens: causal_lens(d, base),
    };
    (recipe, adjust)
}
