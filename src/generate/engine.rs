//! `--profile production`: what a serving engine really feeds the kernel, drawn from a
//! model of the engine (vLLM's, whose history this kernel's bugs come from).
//!
//! Every number below is a documented choice with its source; nothing here is what an
//! engine would never produce (non-monotonic 2-D lengths, hostile values, tiny caches
//! and leading or middle zero-length rows belong to `layout` and `hostile`).
//!
//! * **Model** ([`MODELS`]): DeepSeek V3.2 (max_model_len 163,840, top-k 2048) or V4
//!   Flash/Pro (1,048,576; 512 / 1024). Indexer shape H 64, D 128. Operators often set a
//!   smaller `--max-model-len` ([`OPERATOR_MODEL_LENS`]).
//! * **Platform** ([`Platform`]): NVIDIA (DeepGEMM: block 64, e4m3fn, normal layout, 2-D
//!   per-token lengths), MI300 (gfx942: e4m3fnuz) and MI355 (gfx950: e4m3fn) through
//!   AITER: block 1, 16, 64 or 256, the preshuffled (`shuffle16`) layout for blocks > 1
//!   (`Preshuffle=block_size>1` in vLLM), 1-D lengths.
//! * **KV pool**: sized by the KV memory budget ([`BUDGETS_GIB`]); the indexer cache is
//!   a per-layer tensor (V3.2: tight stride `bs*(D+4)`) or a strided view into the
//!   per-block slab that holds every layer's caches (V4: [`SLAB_STRIDES`], the strides
//!   seen in the field); ids handed out by vLLM's free queue after a history of other
//!   requests ([`super::pool`]), so a churned multi-GiB pool puts byte offsets past 2^31
//!   and 2^32 as an engine does.
//! * **Batch** ([`Traffic`]): decode batches of chat, mixed or long-context traffic, up to
//!   `max_num_seqs` ([`MAX_NUM_SEQS`]) requests; context lengths long-tailed
//!   (log-logistic around the traffic's median) up to max_model_len, a request at the
//!   cap in 15% of the batches; the batch must fit the pool (the scheduler admits no more); MTP with 0-3
//!   speculative tokens (next_n 1-4), flattened to one row per token where the kernel
//!   takes fewer; per-token lengths only of the engine's form `[L-N+1 … L]`; CUDA-graph
//!   padding (trailing zero-length requests up to a capture size) and dummy batches
//!   (every length 0: the capture, and idle data-parallel ranks each step; DeepGEMM
//!   #353), one case in ten.
//! * **Values**: pipeline quantization (bf16 gaussians, per-token power-of-two scale).
//! * **Output**: the never-zeroed workspace `[rows, max_model_len]` (rows past 512 of a
//!   1M-column workspace pass 2^31 bytes: AITER #4244), poisoned by the harness; its row
//!   stride is aligned to 256 elements on NVIDIA (DeepGEMM allocates it) and is
//!   `max_model_len` on AMD (vLLM passes its workspace to AITER).
//!
//! `--scale F` multiplies every context length by F (the request drawn at the
//! max_model_len cap excepted: that edge is the point) after the batch was fitted to the pool, so a CPU run
//! judges the engine's geometry (pool, strides, ids, batch, workspace) with fewer tokens
//! in between.

use super::recipe::{Knobs, Padding, PoolRecipe, TableOrder};
use super::strategy::{weighted, Draw, LensDraw};
use crate::case::ValueLayout;
use crate::fp8::Fp8Format;
use proptest::prelude::*;
use serde::{Deserialize, Serialize};

/// A model's indexer: the output width and how its KV cache is laid out.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Model {
    pub name: &'static str,
    pub max_model_len: usize,
    pub topk: usize,
    /// The indexer cache lives in the per-block slab of every layer (V4) instead of a
    /// tensor of its own (V3.2).
    pub slab: bool,
    /// KV bytes per token over every layer, when the indexer has its own tensor: the
    /// pool's size in blocks follows from it (V3.2: 61 layers × (656 B fp8_ds_mla +
    /// 132 B indexer)).
    pub pool_bytes_per_token: u64,
}

pub const MODELS: [Model; 3] = [
    Model {
        name: "DeepSeek-V3.2",
        max_model_len: 163_840,
        topk: 2048,
        slab: false,
        pool_bytes_per_token: 61 * (656 + 132),
    },
    Model {
        name: "DeepSeek-V4-Flash",
        max_model_len: 1 << 20,
        topk: 512,
        slab: true,
        pool_bytes_per_token: 0,
    },
    Model {
        name: "DeepSeek-V4-Pro",
        max_model_len: 1 << 20,
        topk: 1024,
        slab: true,
        pool_bytes_per_token: 0,
    },
];

/// `--max-model-len` values operators set below the model's (V3.2; V4): 64K and 128K
/// deployments, the 655,360 of a long-context V4 deployment (vLLM #45350), and round
/// decimal numbers (`--max-model-len 32000` is common in deployment scripts), which are
/// not multiples of the kernels' 256-token chunk.
pub const OPERATOR_MODEL_LENS: [[usize; 4]; 2] = [
    [65_536, 131_072, 32_000, 100_000],
    [262_144, 655_360, 200_000, 500_000],
];

/// Per-block slab strides of 64-token blocks seen in the field (bytes):
/// 1,002,240 (AITER PR #4774 / vLLM #52109, the guard's trigger: ids ≥ 2,143 pass 2^31);
/// 1,435,968 (AITER PR #4427: block 4,564 at byte offset 6.5 G);
/// 1,308,672 and 1,228,800 (vLLM #48993, FlashInfer sparse layout before/after packing);
/// 1,473,408 and 1,315,008 (vLLM #48993, FlashMLA fp8_ds_mla layout before/after).
/// Other block sizes scale them per token, rounded up to 16 bytes.
pub const SLAB_STRIDES: [u64; 6] = [
    1_002_240, 1_435_968, 1_308_672, 1_228_800, 1_473_408, 1_315_008,
];

/// KV memory budgets (GiB): 26.46 as measured for DeepSeek-V4-Pro DEP8 on GB200
/// (vLLM #48993), 48, and 80 (an H200's 141 GB less weights and activations).
pub const BUDGETS_GIB: [f64; 3] = [26.46, 48.0, 80.0];

/// `max_num_seqs`: vLLM's default (256) and a high-throughput setting (512).
pub const MAX_NUM_SEQS: [usize; 2] = [256, 512];

/// The largest output workspace a production case gets (`rows × max_model_len × 4`):
/// 1,024 rows of a 1M-column workspace. Batches past it are cut, as a scheduler's token
/// budget would.
pub const MAX_WORKSPACE_BYTES: u64 = 4 << 30;

/// Block tables up to this many entries have the engine's full width
/// (`max_model_len / block_size` columns); wider ones (block 1 at 1M columns) keep 16
/// columns past the longest request.
pub const FULL_TABLE_ENTRIES: usize = 1 << 22;

/// vLLM's CUDA-graph capture sizes: 1, 2, 4, then steps of 8 to 256, of 16 to 512.
pub fn capture_sizes() -> Vec<usize> {
    let mut v = vec![1, 2, 4];
    v.extend((8..=256).step_by(8));
    v.extend((272..=512).step_by(16));
    v
}

/// The smallest capture size ≥ `b` (`b` itself past the largest).
pub fn capture_size_for(b: usize) -> usize {
    capture_sizes().into_iter().find(|&c| c >= b).unwrap_or(b)
}

/// Where the kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Platform {
    /// vLLM on NVIDIA with DeepGEMM.
    Nvidia,
    /// vLLM on MI300/MI325 with AITER (e4m3fnuz).
    Gfx942,
    /// vLLM on MI355 with AITER (e4m3fn).
    Gfx950,
}

/// The kind of traffic a decode batch serves: its concurrency and median context.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Traffic {
    /// Many short conversations: 32 to max_num_seqs requests, median 2,500 tokens.
    Chat,
    /// 8-128 requests, median 16,000 (DeepGEMM's benchmark: 64 × 32K ± 30%).
    Mixed,
    /// 1-16 agent sessions, median 55,000 tokens (P50 of a V4 deployment, vLLM #45350).
    Long,
}

impl Traffic {
    pub fn median_tokens(self) -> u32 {
        match self {
            Traffic::Chat => 2_500,
            Traffic::Mixed => 16_000,
            Traffic::Long => 55_000,
        }
    }

    fn batch(self, max_num_seqs: usize) -> std::ops::RangeInclusive<usize> {
        match self {
            Traffic::Chat => 32..=max_num_seqs,
            Traffic::Mixed => 8..=128,
            Traffic::Long => 1..=16,
        }
    }
}

/// The engine-level part of a production draw; `Draw::resolve` turns it into the pool,
/// the table width and the scaled, fitted, flattened and padded lengths.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineDraw {
    pub model: String,
    pub max_model_len: usize,
    pub platform: Platform,
    pub traffic: Traffic,
    pub budget_bytes: u64,
    /// Slab stride of a 64-token block; `None`: the indexer has its own tensor.
    pub slab_stride_64: Option<u64>,
    /// Pool bytes per token (all layers) when the indexer has its own tensor.
    pub pool_bytes_per_token: u64,
    pub churn: u32,
    pub occupancy_pct: u8,
    /// Pad the batch to a CUDA-graph capture size with zero-length requests.
    pub graph_padding: bool,
    /// The request that has run up to max_model_len (`--scale` leaves it there).
    pub capped: Option<usize>,
    /// Context lengths are multiplied by this (`--scale`).
    pub scale: f64,
}

impl EngineDraw {
    /// The pool for block size `bs` and head dim `d`, at most `max_bytes` large, its
    /// block stride a multiple of `align` bytes (1: any; a kernel's `kv_stride_align`).
    pub fn pool(&self, bs: usize, d: usize, max_bytes: Option<u64>, align: u64) -> PoolRecipe {
        let tight = (bs * (d + 4)) as u64;
        let (stride, slot_bytes) = match self.slab_stride_64 {
            Some(s) => {
                let st = (s * bs as u64).div_ceil(64).div_ceil(16) * 16;
                let st = st.max(tight).next_multiple_of(align.max(1));
                (st, st)
            }
            None => (
                tight.next_multiple_of(align.max(1)),
                self.pool_bytes_per_token * bs as u64,
            ),
        };
        let mut blocks = self.budget_bytes / slot_bytes.max(1);
        if let Some(m) = max_bytes {
            blocks = blocks.min(m / stride);
        }
        PoolRecipe {
            blocks: blocks.max(2),
            stride,
            churn: self.churn,
            occupancy_pct: self.occupancy_pct,
            request_blocks: (self.traffic.median_tokens() as usize).div_ceil(bs) as u32,
            rows_per_request: 1,
        }
    }
}

/// A context length from a quantile: log-logistic (shape 1.4: P90 ≈ 4.8 × median, as
/// in vLLM #45350's P50 55K / P90 280K) around `median`, within `[next_n, max]`.
/// Shrinking the quantile toward 0 shortens the request.
pub fn context_from_quantile(q: u16, median: u32, next_n: usize, max: usize) -> usize {
    let u = (q as f64 + 0.5) / 65_536.0;
    let x = median as f64 * (u / (1.0 - u)).powf(1.0 / 1.4);
    (x.round() as usize).clamp(next_n, max.max(next_n))
}

/// What happens to the batch besides its live requests.
#[derive(Clone, Copy, Debug)]
enum Shape {
    /// Only live requests.
    Live,
    /// One request has run up to max_model_len (`below` tokens short of it).
    Capped { at: u16, below: u8 },
    /// A dummy batch of a capture size, every length 0: what the CUDA-graph capture
    /// runs, and what an idle data-parallel rank runs every step to keep the
    /// expert-parallel collectives of a DP+EP deployment in step.
    DummyRun { size: u16 },
}

/// The production strategy with context lengths multiplied by `scale`.
pub fn production(scale: f64) -> impl Strategy<Value = Draw> {
    let model = (
        0usize..MODELS.len(),
        weighted(vec![
            (2, None),
            (1, Some(0usize)),
            (1, Some(1)),
            (1, Some(2)),
            (1, Some(3)),
        ]),
    );
    let platform = weighted(vec![
        (3, Platform::Nvidia),
        (1, Platform::Gfx942),
        (1, Platform::Gfx950),
    ]);
    let rocm_block = weighted(vec![(1, 1usize), (2, 16), (2, 64), (1, 256)]);
    let next_n = weighted(vec![(3, 1usize), (4, 2), (1, 3), (2, 4)]);
    let batch = (
        weighted(vec![
            (4, Traffic::Chat),
            (3, Traffic::Mixed),
            (3, Traffic::Long),
        ]),
        weighted(MAX_NUM_SEQS.iter().map(|&m| (1, m)).collect()),
    )
        .prop_flat_map(|(traffic, seqs)| {
            (
                Just(traffic),
                proptest::collection::vec(any::<u16>(), traffic.batch(seqs)),
            )
        });
    let shape = weighted(vec![(75, 0u8), (15, 1), (10, 2)]);
    let shape =
        (shape, any::<u16>(), any::<u8>(), any::<bool>()).prop_map(|(kind, x, below, exact)| {
            match kind {
                0 => Shape::Live,
                1 => Shape::Capped {
                    at: x,
                    below: if exact { 0 } else { below },
                },
                _ => Shape::DummyRun { size: x },
            }
        });
    let pool = (
        0usize..BUDGETS_GIB.len(),
        0usize..SLAB_STRIDES.len(),
        weighted(vec![(1, 0u32), (1, 256), (2, 4096), (2, 16_384)]),
        weighted(vec![(1, 0u8), (2, 50), (2, 90)]),
    );
    let table = (
        weighted(vec![
            (3, TableOrder::Sequential),
            (1, TableOrder::SharedPrefix),
        ]),
        weighted(vec![(1, Padding::Zero), (2, Padding::Stale)]),
        any::<bool>(),
    );
    (
        (model, platform, rocm_block, next_n),
        batch,
        shape,
        pool,
        table,
        any::<u64>(),
    )
        .prop_map(
            move |(
                ((mi, operator_len), platform, rocm_block, next_n),
                (traffic, quantiles),
                shape,
                (budget, slab, churn, occupancy),
                (order, padding, graph_padding),
                seed,
            )| {
                let m = MODELS[mi];
                let max_model_len = match operator_len {
                    None => m.max_model_len,
                    Some(i) => OPERATOR_MODEL_LENS[usize::from(m.slab)][i],
                };
                let median = traffic.median_tokens();
                let mut capped = None;
                let mut lens: Vec<u32> = quantiles
                    .iter()
                    .map(|&q| context_from_quantile(q, median, next_n, max_model_len) as u32)
                    .collect();
                match shape {
                    Shape::Live => {}
                    Shape::Capped { at, below } => {
                        let i = at as usize % lens.len();
                        lens[i] = (max_model_len - below as usize).max(next_n) as u32;
                        capped = Some(i);
                    }
                    Shape::DummyRun { size } => {
                        let sizes = capture_sizes();
                        lens = vec![0; sizes[size as usize % sizes.len()]];
                    }
                }
                let (format, block_size, shuffle16, per_token) = match platform {
                    Platform::Nvidia => (Fp8Format::E4m3fn, 64, false, Some(vec![0i8])),
                    Platform::Gfx942 => (Fp8Format::E4m3fnuz, rocm_block, rocm_block > 1, None),
                    Platform::Gfx950 => (Fp8Format::E4m3fn, rocm_block, rocm_block > 1, None),
                };
                Draw {
                    knobs: Knobs {
                        block_size,
                        format,
                        table_order: order,
                        padding,
                        ..Knobs::production(next_n, seed)
                    },
                    shuffle16,
                    lens: LensDraw::Explicit(lens),
                    per_token,
                    engine: Some(EngineDraw {
                        model: m.name.to_string(),
                        max_model_len,
                        platform,
                        traffic,
                        budget_bytes: (BUDGETS_GIB[budget] * (1u64 << 30) as f64) as u64,
                        slab_stride_64: m.slab.then_some(SLAB_STRIDES[slab]),
                        pool_bytes_per_token: m.pool_bytes_per_token,
                        churn,
                        occupancy_pct: occupancy,
                        graph_padding: graph_padding && !matches!(shape, Shape::DummyRun { .. }),
                        capped,
                        scale,
                    }),
                }
            },
        )
}

/// The layout the platform's kernel reads (shuffle16 needs a block of ≥ 16 tokens).
pub fn layout_of(shuffle16: bool, block_size: usize, head_dim: usize) -> ValueLayout {
    if shuffle16 && block_size.is_multiple_of(16) && head_dim.is_multiple_of(32) {
        ValueLayout::Shuffle16
    } else {
        ValueLayout::Normal
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_lengths_are_long_tailed_and_within_bounds() {
        let med = context_from_quantile(32_768, 55_000, 2, 1 << 20);
        assert!((54_000..=56_000).contains(&med), "median {med}");
        let p90 = context_from_quantile((0.9 * 65_536.0) as u16, 55_000, 2, 1 << 20);
        assert!((230_000..=300_000).contains(&p90), "P90 {p90}");
        assert_eq!(context_from_quantile(0, 2_500, 3, 1 << 20), 3);
        assert!(context_from_quantile(0, 55_000, 3, 1 << 20) < 20);
        assert_eq!(context_from_quantile(u16::MAX, 55_000, 2, 163_840), 163_840);
    }

    #[test]
    fn capture_sizes_round_batches_up() {
        assert_eq!(capture_size_for(3), 4);
        assert_eq!(capture_size_for(9), 16);
        assert_eq!(capture_size_for(257), 272);
        assert_eq!(capture_size_for(512), 512);
    }

    #[test]
    fn slab_pools_pass_4_gib_and_per_layer_tensors_do_not() {
        let e = EngineDraw {
            model: "DeepSeek-V4-Flash".into(),
            max_model_len: 1 << 20,
            platform: Platform::Nvidia,
            traffic: Traffic::Mixed,
            budget_bytes: 26 << 30,
            slab_stride_64: Some(1_002_240),
            pool_bytes_per_token: 0,
            churn: 0,
            occupancy_pct: 0,
            graph_padding: false,
            capped: None,
            scale: 1.0,
        };
        let p = e.pool(64, 128, None, 1);
        assert_eq!(p.stride, 1_002_240);
        assert!(p.blocks * p.stride > 1 << 34, "{p:?}");
        assert_eq!(e.pool(1, 128, None, 1).stride % 16, 0);
        let capped = e.pool(64, 128, Some(8 << 30), 1);
        assert!(capped.blocks * capped.stride <= 8 << 30);
        let v32 = EngineDraw {
            slab_stride_64: None,
            pool_bytes_per_token: 61 * (656 + 132),
            ..e
        };
        let p = v32.pool(64, 128, None, 1);
        assert_eq!(p.stride, 64 * 132);
        assert!(p.blocks * p.stride < 1 << 31, "{p:?}");
    }
}
