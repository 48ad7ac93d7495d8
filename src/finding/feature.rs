//! The fixed vocabulary of case features a bug can need. Every feature is a property
//! of a case's recipe with a *benign form*: the same recipe with that one property made
//! ordinary (lower block ids, an unpadded stride, 1-D lengths, pipeline values, ...).
//! Ablation ([`super::ablate`]) rewrites a shrunk failing case into each benign form
//! and re-runs it; a feature whose removal makes the failure go away is necessary, and
//! the necessary features are the finding's trigger.
//!
//! This list is the vocabulary: names are stable (signatures, `report.json`'s
//! `trigger`), sentences are what reports print after "needs:". It is documented in
//! `reports/README.md` too; keep the two together.

use crate::case::ValueLayout;
use crate::fp8::Fp8Format;
use crate::generate::recipe::{LensRecipe, OffsetClass, Padding, ValueKind};
use crate::generate::Recipe;
use serde::{Deserialize, Serialize};

/// Reachability: which inputs a feature (and so a finding that needs it) belongs to:
/// what an engine feeds (`Production`: 1-D lengths or per-token `[L-N+1 … L]`, valid
/// tables, pipeline-quantised values), what the documented API allows beyond that
/// (`Api`: irregular 2-D lengths, -1 table padding, non-pipeline values), or invalid
/// values (`Hostile`). Ordered from most to least benign.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    #[default]
    Production,
    Api,
    Hostile,
}

impl Tier {
    pub const ALL: [Tier; 3] = [Tier::Production, Tier::Api, Tier::Hostile];
    pub fn name(self) -> &'static str {
        match self {
            Tier::Production => "production",
            Tier::Api => "api",
            Tier::Hostile => "hostile",
        }
    }
}

/// One case feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Feature {
    /// A referenced KV block lies at byte offset ≥ 2^31.
    KvOffset2g,
    /// A referenced KV block lies at byte offset ≥ 2^32.
    KvOffset4g,
    /// The output passes byte offset 2^31.
    OutOffset2g,
    /// Block size other than the engines' 64.
    BlockSize,
    /// A value layout other than the plain one.
    Layout,
    /// An fp8 format other than e4m3fn.
    Fp8Format,
    /// `next_n ≥ 2` (speculative decoding).
    NextN2,
    /// `next_n ≥ 3`.
    NextN3,
    /// Per-token (2-D) context lengths.
    Lens2d,
    /// 2-D lengths not of the engine's form `[L-N+1 … L]`.
    Lens2dIrregular,
    /// 2-D lengths where a later draft row is shorter than an earlier one.
    Lens2dNonMonotonic,
    /// Some sequences have length 0 (others do not).
    ZeroLengthRows,
    /// Every sequence has length 0: with 2-D lengths, every row's last (its longest in an
    /// engine's form), the one DeepGEMM's scheduler reads (`context_lens[b][next_n - 1]`).
    AllZeroBatch,
    /// A batch of 32 sequences or a multiple of it (DeepGEMM's scheduler aligns to 32).
    AlignedBatch,
    /// The longest sequence fills `max_model_len` exactly.
    CtxEqMaxModelLen,
    /// Block-table padding other than 0 (-1, i32::MAX, stale ids).
    TablePadding,
    /// KV block stride wider than the block.
    PaddedKvStride,
    /// Output row stride wider than `max_model_len`.
    PaddedOutStride,
    /// Block-table row stride wider than its columns.
    PaddedTableStride,
    /// Legal but non-pipeline values (uniform codes, extremes, relu boundary, all-negative dots).
    SpecialValues,
    /// Invalid values: NaN codes, zero/negative/inf/NaN scales and weights.
    HostileValues,
}

/// The batch alignment [`Feature::AlignedBatch`] names.
const ALIGNED_BATCH: usize = 32;

/// Tokens of benign `max_model_len` slack: past any chunk the longest sequence ends in.
const BENIGN_SLACK: usize = 256;

impl Feature {
    /// Every feature, in the order triggers list them.
    pub const ALL: [Feature; 21] = [
        Feature::KvOffset2g,
        Feature::KvOffset4g,
        Feature::OutOffset2g,
        Feature::BlockSize,
        Feature::Layout,
        Feature::Fp8Format,
        Feature::NextN2,
        Feature::NextN3,
        Feature::Lens2d,
        Feature::Lens2dIrregular,
        Feature::Lens2dNonMonotonic,
        Feature::ZeroLengthRows,
        Feature::AllZeroBatch,
        Feature::AlignedBatch,
        Feature::CtxEqMaxModelLen,
        Feature::TablePadding,
        Feature::PaddedKvStride,
        Feature::PaddedOutStride,
        Feature::PaddedTableStride,
        Feature::SpecialValues,
        Feature::HostileValues,
    ];

    /// The stable name (`report.json`'s `trigger`, signatures).
    pub fn name(self) -> &'static str {
        match self {
            Feature::KvOffset2g => "kv-offset-2g",
            Feature::KvOffset4g => "kv-offset-4g",
            Feature::OutOffset2g => "out-offset-2g",
            Feature::BlockSize => "block-size",
            Feature::Layout => "layout",
            Feature::Fp8Format => "fp8-format",
            Feature::NextN2 => "next-n-2",
            Feature::NextN3 => "next-n-3",
            Feature::Lens2d => "lens-2d",
            Feature::Lens2dIrregular => "lens-2d-irregular",
            Feature::Lens2dNonMonotonic => "lens-2d-non-monotonic",
            Feature::ZeroLengthRows => "zero-length-rows",
            Feature::AllZeroBatch => "all-zero-batch",
            Feature::AlignedBatch => "aligned-batch",
            Feature::CtxEqMaxModelLen => "ctx-eq-max-model-len",
            Feature::TablePadding => "table-padding",
            Feature::PaddedKvStride => "padded-kv-stride",
            Feature::PaddedOutStride => "padded-out-stride",
            Feature::PaddedTableStride => "padded-table-stride",
            Feature::SpecialValues => "special-values",
            Feature::HostileValues => "hostile-values",
        }
    }

    pub fn parse(s: &str) -> Option<Feature> {
        Feature::ALL.into_iter().find(|f| f.name() == s)
    }

    /// The feature in words, with the recipe's value where it has one.
    pub fn sentence(self, r: &Recipe) -> String {
        match self {
            Feature::KvOffset2g => "KV byte offset ≥ 2^31".into(),
            Feature::KvOffset4g => "KV byte offset ≥ 2^32".into(),
            Feature::OutOffset2g => "output byte offset ≥ 2^31".into(),
            Feature::BlockSize => format!("block size {}", r.knobs.block_size),
            Feature::Layout => format!("layout {:?}", r.layout).to_lowercase(),
            Feature::Fp8Format => format!("fp8 format {}", r.knobs.format.name()),
            Feature::NextN2 => "next_n ≥ 2".into(),
            Feature::NextN3 => "next_n ≥ 3".into(),
            Feature::Lens2d => "2-D (per-token) lengths".into(),
            Feature::Lens2dIrregular => "2-D lengths not of the form [L-N+1 … L]".into(),
            Feature::Lens2dNonMonotonic => {
                "non-monotonic 2-D lengths (a later draft row shorter)".into()
            }
            Feature::ZeroLengthRows => "zero-length rows".into(),
            // Some row's earlier tokens are longer (seq_lens takes each row's longest).
            Feature::AllZeroBatch if r.seq_lens().iter().any(|&l| l > 0) => {
                format!(
                    "a batch of {} whose rows' last lengths are all 0",
                    r.batch()
                )
            }
            Feature::AllZeroBatch => format!("an all-zero batch of {}", r.batch()),
            Feature::AlignedBatch => format!("a batch of {}, a multiple of 32", r.batch()),
            Feature::CtxEqMaxModelLen => "ctx == max_model_len".into(),
            Feature::TablePadding => format!("table padding {}", padding_name(r.knobs.padding)),
            Feature::PaddedKvStride => "padded KV block stride".into(),
            Feature::PaddedOutStride => "padded output row stride".into(),
            Feature::PaddedTableStride => "padded block-table stride".into(),
            Feature::SpecialValues => format!("{} values", value_name(r.knobs.values)),
            Feature::HostileValues => {
                "hostile values (NaN codes, negative/zero/inf/NaN scales and weights)".into()
            }
        }
    }

    /// Which inputs this feature (as `r` has it) belongs to.
    pub fn tier(self, r: &Recipe) -> Tier {
        match self {
            Feature::Lens2dIrregular | Feature::Lens2dNonMonotonic | Feature::SpecialValues => {
                Tier::Api
            }
            Feature::TablePadding => match r.knobs.padding {
                Padding::Huge => Tier::Hostile,
                Padding::MinusOne => Tier::Api,
                _ => Tier::Production,
            },
            Feature::HostileValues => Tier::Hostile,
            _ => Tier::Production,
        }
    }

    /// Whether the recipe has this feature.
    pub fn present(self, r: &Recipe) -> bool {
        match self {
            Feature::KvOffset2g => match r.knobs.offsets {
                OffsetClass::Pool(p) => p.blocks.saturating_mul(p.stride) > 1 << 31,
                o => o != OffsetClass::Low,
            },
            Feature::KvOffset4g => match r.knobs.offsets {
                OffsetClass::Pool(p) => p.blocks.saturating_mul(p.stride) > 1 << 32,
                o => o == OffsetClass::Around4G,
            },
            Feature::OutOffset2g => r.output_bytes() > 1 << 31,
            Feature::BlockSize => r.knobs.block_size != 64,
            Feature::Layout => r.layout != ValueLayout::Normal,
            Feature::Fp8Format => r.knobs.format != Fp8Format::E4m3fn,
            Feature::NextN2 => r.knobs.next_n >= 2,
            Feature::NextN3 => r.knobs.next_n >= 3,
            Feature::Lens2d => matches!(r.lens, LensRecipe::PerToken(_)),
            Feature::Lens2dIrregular => match &r.lens {
                LensRecipe::PerToken(v) => v.iter().any(|row| *row != engine_row(row)),
                LensRecipe::PerSequence(_) => false,
            },
            Feature::Lens2dNonMonotonic => match &r.lens {
                LensRecipe::PerToken(v) => v.iter().any(|row| row.windows(2).any(|w| w[1] < w[0])),
                LensRecipe::PerSequence(_) => false,
            },
            Feature::ZeroLengthRows => {
                let seqs = r.seq_lens();
                seqs.contains(&0) && seqs.iter().any(|&l| l > 0)
            }
            Feature::AllZeroBatch => last_lens(r).iter().all(|&l| l == 0),
            Feature::AlignedBatch => {
                r.batch() >= ALIGNED_BATCH && r.batch().is_multiple_of(ALIGNED_BATCH)
            }
            Feature::CtxEqMaxModelLen => r.knobs.model_len_slack == 0,
            Feature::TablePadding => r.knobs.padding != Padding::Zero,
            Feature::PaddedKvStride => match r.knobs.offsets {
                OffsetClass::Pool(p) => p.stride > block_bytes(r),
                _ => r.knobs.kv_stride_pad > 0,
            },
            Feature::PaddedOutStride => r.knobs.out_stride_pad > 0,
            Feature::PaddedTableStride => r.knobs.table_stride_pad > 0,
            Feature::SpecialValues => {
                !matches!(r.knobs.values, ValueKind::Pipeline | ValueKind::Hostile)
            }
            Feature::HostileValues => r.knobs.values == ValueKind::Hostile,
        }
    }

    /// The recipe with this feature in its benign form (everything else unchanged).
    pub fn benign(self, r: &Recipe) -> Recipe {
        let mut b = r.clone();
        match self {
            // An engine pool's ids become the dense layout's, at the pool's stride.
            Feature::KvOffset2g | Feature::KvOffset4g
                if matches!(r.knobs.offsets, OffsetClass::Pool(_)) =>
            {
                if let OffsetClass::Pool(p) = r.knobs.offsets {
                    b.knobs.kv_stride_pad = p.stride - block_bytes(r);
                    b.knobs.offsets = if self == Feature::KvOffset2g {
                        OffsetClass::Low
                    } else {
                        OffsetClass::Around2G
                    };
                }
            }
            Feature::KvOffset2g => b.knobs.offsets = OffsetClass::Low,
            Feature::KvOffset4g => b.knobs.offsets = OffsetClass::Around2G,
            Feature::OutOffset2g => {
                // Off the axis (no prepended rows); then, where a wide max_model_len
                // still carries the rows past 2 GiB, the least slack and padding
                // that keep them below it (a slack kept above 0, so the longest
                // sequence does not start filling max_model_len).
                b.knobs.big_output = false;
                let rows = (b.batch() * b.knobs.next_n).max(1) as u64;
                let room = ((1u64 << 31) / (4 * rows)) as usize;
                let longest = b.max_model_len() - b.knobs.model_len_slack;
                let room = room.saturating_sub(longest);
                let k = &mut b.knobs;
                if k.model_len_slack + k.out_stride_pad > room {
                    let floor = k.model_len_slack.min(1);
                    k.model_len_slack = k
                        .model_len_slack
                        .min(room.saturating_sub(k.out_stride_pad))
                        .max(floor);
                    k.out_stride_pad = k.out_stride_pad.min(room.saturating_sub(k.model_len_slack));
                }
            }
            Feature::BlockSize => b.knobs.block_size = 64,
            Feature::Layout => b.layout = ValueLayout::Normal,
            Feature::Fp8Format => b.knobs.format = Fp8Format::E4m3fn,
            Feature::NextN2 => {
                b.knobs.next_n = 1;
                b.lens = LensRecipe::PerSequence(r.seq_lens());
            }
            Feature::NextN3 => {
                b.knobs.next_n = 2;
                if let LensRecipe::PerToken(v) = &r.lens {
                    b.lens = LensRecipe::PerToken(
                        v.iter().map(|row| row[row.len() - 2..].to_vec()).collect(),
                    );
                }
            }
            Feature::Lens2d => b.lens = LensRecipe::PerSequence(r.seq_lens()),
            Feature::Lens2dIrregular => {
                if let LensRecipe::PerToken(v) = &r.lens {
                    b.lens = LensRecipe::PerToken(v.iter().map(|row| engine_row(row)).collect());
                }
            }
            Feature::Lens2dNonMonotonic => {
                if let LensRecipe::PerToken(v) = &r.lens {
                    b.lens = LensRecipe::PerToken(
                        v.iter()
                            .map(|row| {
                                let mut s = row.clone();
                                s.sort_unstable();
                                s
                            })
                            .collect(),
                    );
                }
            }
            Feature::ZeroLengthRows => {
                b.lens = match &r.lens {
                    LensRecipe::PerSequence(v) => {
                        LensRecipe::PerSequence(v.iter().map(|&l| l.max(1)).collect())
                    }
                    LensRecipe::PerToken(v) => LensRecipe::PerToken(
                        v.iter()
                            .map(|row| {
                                if row.iter().all(|&l| l == 0) {
                                    engine_row_for(row.len(), row.len())
                                } else {
                                    row.clone()
                                }
                            })
                            .collect(),
                    ),
                }
            }
            Feature::AllZeroBatch => {
                b.lens = match &r.lens {
                    LensRecipe::PerSequence(v) => {
                        let mut v = v.clone();
                        v[0] = 1;
                        LensRecipe::PerSequence(v)
                    }
                    LensRecipe::PerToken(v) => {
                        let mut v = v.clone();
                        v[0] = engine_row_for(v[0].len(), v[0].len());
                        LensRecipe::PerToken(v)
                    }
                }
            }
            // One sequence more, a copy of the last (a pool grows by what it needs),
            // so a bug that needs 32 sequences but not the alignment keeps them.
            Feature::AlignedBatch => {
                match &mut b.lens {
                    LensRecipe::PerSequence(v) => v.push(v.last().copied().unwrap_or(0)),
                    LensRecipe::PerToken(v) => v.push(v.last().cloned().unwrap_or_default()),
                }
                if let OffsetClass::Pool(p) = &mut b.knobs.offsets {
                    let last = r.seq_lens().last().copied().unwrap_or(0);
                    let bs = r.knobs.block_size.max(1);
                    p.blocks += last.div_ceil(bs) as u64 + 1;
                }
            }
            Feature::CtxEqMaxModelLen => b.knobs.model_len_slack = BENIGN_SLACK,
            Feature::TablePadding => b.knobs.padding = Padding::Zero,
            Feature::PaddedKvStride => match &mut b.knobs.offsets {
                OffsetClass::Pool(p) => p.stride = block_bytes(r),
                _ => b.knobs.kv_stride_pad = 0,
            },
            Feature::PaddedOutStride => b.knobs.out_stride_pad = 0,
            Feature::PaddedTableStride => b.knobs.table_stride_pad = 0,
            Feature::SpecialValues | Feature::HostileValues => b.knobs.values = ValueKind::Pipeline,
        }
        b
    }

    /// Whether a trigger that needs `self` needs `weaker` too: the same feature, or one
    /// that `self` implies, directly or through another ([`Self::implied_by`]).
    pub fn implies(self, weaker: Feature) -> bool {
        let mut f = weaker;
        loop {
            if f == self {
                return true;
            }
            match f.implied_by() {
                Some(stronger) => f = stronger,
                None => return false,
            }
        }
    }

    /// A feature that another one implies, so a trigger that needs the stronger one
    /// does not list the weaker (≥ 2^32 implies ≥ 2^31; next_n ≥ 3 implies ≥ 2).
    pub fn implied_by(self) -> Option<Feature> {
        match self {
            Feature::KvOffset2g => Some(Feature::KvOffset4g),
            Feature::NextN2 => Some(Feature::NextN3),
            Feature::Lens2d => Some(Feature::Lens2dIrregular),
            Feature::Lens2dIrregular => Some(Feature::Lens2dNonMonotonic),
            _ => None,
        }
    }
}

/// Every feature the recipe has.
pub fn features_of(r: &Recipe) -> Vec<Feature> {
    Feature::ALL.into_iter().filter(|f| f.present(r)).collect()
}

/// Each row's last length (a 1-D length is its row's only one).
fn last_lens(r: &Recipe) -> Vec<usize> {
    match &r.lens {
        LensRecipe::PerSequence(v) => v.clone(),
        LensRecipe::PerToken(v) => v
            .iter()
            .map(|row| row.last().copied().unwrap_or(0))
            .collect(),
    }
}

/// The engine's per-token lengths of a sequence of `l` tokens: `[L-N+1 … L]`.
fn engine_row_for(n: usize, l: usize) -> Vec<usize> {
    (0..n).map(|i| (l + i + 1).saturating_sub(n)).collect()
}

/// `row` in the engine's form, ending at its longest length.
fn engine_row(row: &[usize]) -> Vec<usize> {
    engine_row_for(row.len(), row.iter().copied().max().unwrap_or(0))
}

/// Bytes of one block's values and scales (`bs·(D+4)`), the tight stride.
fn block_bytes(r: &Recipe) -> u64 {
    (r.knobs.block_size * (r.knobs.head_dim + 4)) as u64
}

fn padding_name(p: Padding) -> &'static str {
    match p {
        Padding::Zero => "0",
        Padding::MinusOne => "-1",
        Padding::Huge => "i32::MAX",
        Padding::Garbage => "of unreferenced block ids",
        Padding::Stale => "of stale ids from the pool",
    }
}

fn value_name(v: ValueKind) -> &'static str {
    match v {
        ValueKind::Pipeline => "pipeline",
        ValueKind::UniformCodes => "uniform-code",
        ValueKind::Extreme => "extreme (±max, subnormal, zero)",
        ValueKind::ReluBoundary => "relu-boundary",
        ValueKind::AllNegative => "all-negative-dot",
        ValueKind::Hostile => "hostile",
    }
}

/// Whether trigger `small` is contained in trigger `large`: every feature `small` needs,
/// `large` needs too, itself or through a stronger one it implies (`kv-offset-4g`
/// contains `kv-offset-2g`, which a trigger never lists beside it). The larger trigger is
/// then the same bug seen on a more special case (`campaign::book`, `report::fold`).
pub fn trigger_within(small: &[Feature], large: &[Feature]) -> bool {
    small.iter().all(|&f| large.iter().any(|&g| g.implies(f)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_benign_form_removes_its_feature_and_validates() {
        let mut r = Recipe::small(vec![0, 40], 3, 1);
        r.lens = LensRecipe::PerToken(vec![vec![0, 0, 0], vec![40, 12, 39]]);
        r.knobs.offsets = OffsetClass::Around4G;
        r.knobs.big_output = false;
        r.knobs.model_len_slack = 0;
        r.knobs.values = ValueKind::Hostile;
        r.knobs.format = Fp8Format::E4m3fnuz;
        for f in features_of(&r) {
            let b = f.benign(&r);
            assert!(
                !f.present(&b),
                "{} still present in its benign form",
                f.name()
            );
            b.materialize()
                .validate()
                .unwrap_or_else(|e| panic!("{}: benign form invalid: {e}", f.name()));
        }
        assert!(Feature::ALL
            .iter()
            .all(|f| Feature::parse(f.name()) == Some(*f)));
    }

    /// DeepGEMM's scheduler reads each row's last 2-D length: a batch whose last draft
    /// tokens all have length 0 crashed it in session 30 although earlier tokens had 1,
    /// so that batch is all-zero, and its benign form (row 0 in the engine's form) is not.
    #[test]
    fn a_2d_batch_whose_last_lengths_are_zero_is_all_zero() {
        let mut r = Recipe::small(vec![0; 64], 2, 7);
        r.lens = LensRecipe::PerToken((0..64).map(|i| vec![i % 2, 0]).collect());
        assert!(Feature::AllZeroBatch.present(&r) && Feature::AlignedBatch.present(&r));
        assert!(Feature::AllZeroBatch
            .sentence(&r)
            .contains("last lengths are all 0"));
        assert!(!Feature::AllZeroBatch.present(&Feature::AllZeroBatch.benign(&r)));
        r.lens = LensRecipe::PerToken((0..64).map(|i| vec![0, i % 2]).collect());
        assert!(!Feature::AllZeroBatch.present(&r));
        r.lens = LensRecipe::PerToken(vec![vec![0, 0]; 64]);
        assert!(Feature::AllZeroBatch
            .sentence(&r)
            .starts_with("an all-zero batch"));
    }

    /// A batch of 32 loses its alignment by one sequence more, a copy of the last, and
    /// a pool that held the batch exactly still holds the longer one.
    #[test]
    fn an_aligned_batch_grows_by_one_sequence() {
        let mut r = Recipe::small(vec![0; 32], 1, 7);
        assert!(Feature::AlignedBatch.present(&r) && Feature::AllZeroBatch.present(&r));
        let b = Feature::AlignedBatch.benign(&r);
        assert_eq!(b.batch(), 33);
        assert!(!Feature::AlignedBatch.present(&b) && Feature::AllZeroBatch.present(&b));
        assert!(!Feature::AlignedBatch.present(&Recipe::small(vec![0; 16], 1, 7)));
        r.lens = LensRecipe::PerSequence((0..64).map(|i| 1 + i % 17).collect());
        r.knobs.block_size = 1;
        let used: u64 = (0..64).map(|i| 1 + i % 17).sum();
        r.knobs.offsets = OffsetClass::Pool(crate::generate::recipe::PoolRecipe {
            blocks: used + 1,
            stride: 132,
            churn: 8,
            occupancy_pct: 50,
            request_blocks: 4,
            rows_per_request: 1,
        });
        r.materialize().validate().unwrap();
        let b = Feature::AlignedBatch.benign(&r);
        assert_eq!(b.batch(), 65);
        assert_eq!(b.seq_lens()[64], r.seq_lens()[63]);
        b.materialize().validate().unwrap();
    }

    /// A production server's logits buffer (`[B·next_n, max_model_len]`, 1 Mi wide)
    /// passes 2 GiB with 768 rows and no prepended rows: the output-offset feature is
    /// the bytes, not the axis's knob. Its benign form keeps the batch and next_n and
    /// narrows the buffer below 2 GiB; next_n's benign form takes it away too (fewer
    /// rows), so a trigger that needs the offset does not also list next_n.
    #[test]
    fn a_wide_logits_buffer_passes_2_gib_without_the_output_axis() {
        let mut r = Recipe::small(vec![700; 192], 4, 1);
        r.knobs.model_len_slack = (1 << 20) - 700;
        r.knobs.out_stride_pad = 256;
        r.knobs.big_output = false;
        assert_eq!(r.output_bytes(), 768 * ((1 << 20) + 256) * 4);
        assert!(Feature::OutOffset2g.present(&r));
        let b = Feature::OutOffset2g.benign(&r);
        assert!(!Feature::OutOffset2g.present(&b), "{}", b.output_bytes());
        assert!(b.output_bytes() > 1 << 30, "as wide as still fits");
        assert_eq!((b.batch(), b.knobs.next_n), (192, 4));
        assert!(
            b.knobs.model_len_slack > 0,
            "no max_model_len feature appears"
        );
        assert!(!Feature::OutOffset2g.present(&Feature::NextN3.benign(&r)));
        let t = crate::finding::Trigger::new(
            &r,
            vec![Feature::OutOffset2g, Feature::NextN2, Feature::NextN3],
            true,
        );
        assert_eq!(t.features, [Feature::OutOffset2g]);
        // Without the offset, next_n stays the bug's own.
        let t = crate::finding::Trigger::new(&r, vec![Feature::NextN2, Feature::NextN3], true);
        assert_eq!(t.features, [Feature::NextN3]);
        // The output axis's prepended rows are counted too.
        let mut big = Recipe::small(vec![5, 9], 1, 1);
        big.knobs.big_output = true;
        assert!(Feature::OutOffset2g.present(&big));
        assert_eq!(
            big.materialize().shape.rows(),
            big.output_bytes() as usize / 4 / (1 << 20)
        );
    }

    #[test]
    fn a_stronger_feature_contains_the_weaker_it_implies() {
        use Feature::*;
        assert!(trigger_within(&[KvOffset2g], &[KvOffset4g]));
        assert!(!trigger_within(&[KvOffset4g], &[KvOffset2g]));
        assert!(trigger_within(&[Lens2d], &[Lens2dNonMonotonic]));
        assert!(trigger_within(&[], &[KvOffset4g]));
        assert!(!trigger_within(&[HostileValues], &[KvOffset4g]));
        assert!(trigger_within(&[KvOffset2g, NextN2], &[NextN3, KvOffset4g]));
    }
}
