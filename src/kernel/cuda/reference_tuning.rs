//! How `kernels/reference.cu` is compiled for a shape ([`ReferenceTuning`]): the
//! defines of each tuning, which shapes and devices it takes, the measured order in which
//! one is picked, and the checks (no GPU needed) that keep the integer-limb path's
//! arithmetic exact.

use super::compile::Defines;
use super::reference::rejects_shape;
use crate::case::Shape;

/// How `kernels/reference.cu` is compiled for a shape. No choice changes a bit of the
/// result (the dots are exact, the head sum keeps its order); they trade shared memory
/// and registers for speed, so `bench gpu` times each one that fits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReferenceTuning {
    /// Queries kept as f64 in shared memory (no conversion in the inner loop).
    pub f64_queries: bool,
    /// m-tiles of 8 heads swept per pass (1 or 2).
    pub head_tiles: usize,
    /// CTAs per SM the kernel is compiled for (2 to 4: fewer give more registers).
    pub ctas_per_sm: usize,
    /// Head sums software-pipelined behind the next group's DMMAs.
    pub pipelined: bool,
    /// Each lane's queries contiguous, four k-steps per 128-bit shared load (f32
    /// queries, one head tile, D 64 or 128).
    pub vector_loads: bool,
    /// Chunks (4 warps x 8 x `token_tiles` tokens) per CTA at most (the grid's x size
    /// is the longest sequence's chunks over this): more amortize the query decode,
    /// fewer shorten the tail.
    pub chunks_per_cta: usize,
    /// Queries kept as the high 32 bits of their f64 (an fp8 value's low word is zero),
    /// so the operand is a register move instead of a conversion on the FP64 pipe.
    pub hi_word_queries: bool,
    /// Decoded keys held in registers as high words too: half the registers, so more
    /// warps per SM.
    pub hi_word_keys: bool,
    /// The m16n8k16 f64 MMA of sm_90 and newer (8x the work of one m8n8k4); takes two
    /// head tiles and vector loads.
    pub wide_mma: bool,
    /// n-tiles of 8 tokens per warp (2 or 4): more reuse each query fragment, and the
    /// head sum then keeps all 32 lanes busy, for twice the key registers.
    pub token_tiles: usize,
    /// Staged dots padded by one double per token, so the head sum's shared loads are
    /// free of bank conflicts.
    pub padded_stage: bool,
    /// The dots on the integer tensor cores (sm_80 and newer): each fp8 value as three
    /// signed 7-bit limbs of its integer, nine m16n8k32 s8 MMAs per 32 dimensions, the
    /// partial sums combined exactly (kernels/reference.cu, "Integer dots"). Takes two
    /// head tiles, D 64 or 128.
    pub int_mma: bool,
    /// The integer path with each warp's next chunk of keys copied into shared memory
    /// (`cp.async`) while it computes this one, its table ids loaded a step earlier:
    /// the warp no longer waits on two dependent global loads at each chunk. D 64 or 128.
    pub prefetch_keys: bool,
    /// n-tiles per accumulator pass on the integer path (divides `token_tiles`; 0: all
    /// of them): fewer hold fewer accumulator registers, so more CTAs fit an SM, for
    /// more loads of each query fragment.
    pub acc_tiles: usize,
    /// The integer path's staged dots skewed by a function of the token in rows of 32
    /// slots: free of bank conflicts for the stores as well as the head sum's loads (the
    /// padding frees only the loads). Takes no `padded_stage`.
    pub swizzled_stage: bool,
    /// One wave of CTAs, each an equal share of the chunks of all sequences, instead of a
    /// CTA per sequence and `chunks_per_cta` of its chunks: no CTA ends a wave late.
    pub flat_grid: bool,
}

impl ReferenceTuning {
    /// f32 queries, one head tile, three CTAs per SM: takes every shape.
    pub const PLAIN: ReferenceTuning = ReferenceTuning::new(false, 1, 3, false, false);
    /// [`Self::PLAIN`] with float4 query loads (D 64/128).
    pub const VECTOR: ReferenceTuning = ReferenceTuning::new(false, 1, 3, false, true);

    /// The default on sm_90 and newer: m16n8k16, queries and keys as high words,
    /// padded stage, 32 tokens per warp, two CTAs per SM.
    pub const WIDE: ReferenceTuning = ReferenceTuning::wide(2)
        .hi_words()
        .hi_keys()
        .padded()
        .token_tiles(4);
    /// Integer-limb dots (sm_80 and newer, D 64 or 128): 32 tokens per warp, two CTAs
    /// per SM, padded stage.
    pub const INT8: ReferenceTuning = ReferenceTuning::int8(2, 4);
    /// [`Self::INT8`] with each warp's next chunk of keys copied ahead (D 64 or 128).
    pub const INT8_AHEAD: ReferenceTuning = ReferenceTuning::INT8.prefetched();
    /// [`Self::INT8_AHEAD`] accumulating two n-tiles of 8 tokens per pass over the limbs,
    /// not all four at once: 40 accumulator registers a warp instead of 80 (ptxas: 248
    /// registers and no spills, against 255 and 96 bytes spilled).
    pub const INT8_AHEAD_SPLIT: ReferenceTuning = ReferenceTuning::INT8_AHEAD.acc_tiles(2);
    /// [`Self::INT8_AHEAD_SPLIT`] on a flat grid (one wave of CTAs sharing all chunks
    /// equally) with the staged dots skewed instead of padded (no bank conflicts on the
    /// stores either): the default on sm_80 and newer.
    pub const INT8_FLAT: ReferenceTuning = ReferenceTuning::INT8_AHEAD_SPLIT.swizzled().flat();
    /// The default before sm_90 (m8n8k4 only): high words, padded stage, float4 loads.
    pub const NARROW: ReferenceTuning = ReferenceTuning::VECTOR.hi_words().hi_keys().padded();

    /// Fastest first, as measured on the H200 (BENCHMARKS.md, sessions 3, 17, 19 and 23)
    /// and the H100 (session 25): [`Self::INT8_FLAT`] takes the production case to
    /// 0.937-0.940 ms against 1.078-1.086 ms for [`Self::INT8_AHEAD_SPLIT`] in the same
    /// calls (H100), and the small cases to 0.032-0.033/0.055-0.056 against
    /// 0.035-0.040/0.056-0.057 ms. On the H200, [`Self::INT8_AHEAD_SPLIT`] takes the
    /// production case to 1.088 ms against 1.149-1.151
    /// ms for [`Self::INT8_AHEAD`] in the same call (1.071-1.081 ms on session 19's
    /// machine), and is as fast or faster on the two small cases (0.039/0.060 against
    /// 0.039/0.062 ms); [`Self::INT8`] takes it to 1.154-1.176 ms (1.267 ms before its
    /// query limbs sat in fragment order), from 1.649 ms ([`Self::WIDE`], the f64 MMAs at
    /// ~62% of the FP64 tensor peak). [`Self::WIDE`] had taken the production case from
    /// 3.22 ms ([`Self::VECTOR`]); [`Self::NARROW`] (2.51 ms) is the best without an
    /// integer or m16n8k16 MMA; the plain kernel takes every other shape.
    /// [`Self::INT8_AHEAD`] and [`Self::INT8_AHEAD_SPLIT`] are not listed: they fit and
    /// run exactly where [`Self::INT8_FLAT`] does (its larger stage still leaves room for a
    /// row of 128 heads), so they would never be picked.
    pub const PREFERRED: [ReferenceTuning; 6] = [
        ReferenceTuning::INT8_FLAT,
        ReferenceTuning::INT8,
        ReferenceTuning::WIDE,
        ReferenceTuning::NARROW,
        ReferenceTuning::VECTOR,
        ReferenceTuning::PLAIN,
    ];

    /// Every tuning `bench gpu` times and `gpu-selfcheck` proves bit-identical to the
    /// CPU: the defaults, and the variants that show what each define is worth (every
    /// code path of `reference.cu` is in at least one). Earlier measured variants are in
    /// BENCHMARKS.md.
    pub const ALL: [ReferenceTuning; 29] = [
        ReferenceTuning::PLAIN,
        ReferenceTuning::new(true, 1, 3, false, false),
        ReferenceTuning::new(false, 2, 3, false, false),
        ReferenceTuning::new(false, 1, 3, true, false),
        ReferenceTuning::VECTOR,
        ReferenceTuning::NARROW,
        ReferenceTuning::wide(3),
        ReferenceTuning::wide(4).hi_words().hi_keys(),
        ReferenceTuning::wide(4).hi_words().hi_keys().padded(),
        ReferenceTuning::wide(3).hi_words().hi_keys().padded(),
        ReferenceTuning::wide(2).hi_words().hi_keys().padded(),
        ReferenceTuning::WIDE,
        ReferenceTuning::WIDE.pipelined(),
        ReferenceTuning::WIDE.chunks(4),
        ReferenceTuning::INT8,
        ReferenceTuning::INT8.chunks(16),
        ReferenceTuning::INT8_AHEAD,
        ReferenceTuning::INT8_AHEAD.chunks(4),
        ReferenceTuning::INT8_AHEAD.chunks(16),
        ReferenceTuning::INT8_AHEAD_SPLIT,
        ReferenceTuning::INT8_AHEAD_SPLIT.swizzled(),
        ReferenceTuning::INT8_AHEAD_SPLIT.flat(),
        ReferenceTuning::INT8_FLAT,
        ReferenceTuning::INT8_AHEAD.acc_tiles(2).ctas(3),
        ReferenceTuning::INT8_AHEAD.acc_tiles(1).ctas(3),
        ReferenceTuning::INT8_AHEAD.acc_tiles(2).ctas(3).chunks(16),
        ReferenceTuning::INT8.acc_tiles(2).ctas(3),
        ReferenceTuning::int8(3, 2),
        ReferenceTuning::int8(4, 2),
    ];

    const fn new(
        f64_queries: bool,
        head_tiles: usize,
        ctas_per_sm: usize,
        pipelined: bool,
        vector_loads: bool,
    ) -> Self {
        ReferenceTuning {
            f64_queries,
            head_tiles,
            ctas_per_sm,
            pipelined,
            vector_loads,
            chunks_per_cta: 8,
            hi_word_queries: false,
            hi_word_keys: false,
            wide_mma: false,
            token_tiles: 2,
            padded_stage: false,
            int_mma: false,
            prefetch_keys: false,
            acc_tiles: 0,
            swizzled_stage: false,
            flat_grid: false,
        }
    }

    /// Integer-limb dots, `ctas_per_sm` CTAs per SM, `token_tiles` n-tiles per warp,
    /// padded stage.
    const fn int8(ctas_per_sm: usize, token_tiles: usize) -> Self {
        ReferenceTuning {
            int_mma: true,
            ..ReferenceTuning::new(false, 2, ctas_per_sm, false, false)
                .padded()
                .token_tiles(token_tiles)
        }
    }

    /// m16n8k16 with two head tiles and vector loads, `ctas_per_sm` CTAs per SM.
    const fn wide(ctas_per_sm: usize) -> Self {
        ReferenceTuning {
            wide_mma: true,
            ..ReferenceTuning::new(false, 2, ctas_per_sm, false, true)
        }
    }

    const fn hi_words(self) -> Self {
        ReferenceTuning {
            hi_word_queries: true,
            ..self
        }
    }

    const fn hi_keys(self) -> Self {
        ReferenceTuning {
            hi_word_keys: true,
            ..self
        }
    }

    const fn padded(self) -> Self {
        ReferenceTuning {
            padded_stage: true,
            ..self
        }
    }

    const fn token_tiles(self, token_tiles: usize) -> Self {
        ReferenceTuning {
            token_tiles,
            ..self
        }
    }

    const fn pipelined(self) -> Self {
        ReferenceTuning {
            pipelined: true,
            ..self
        }
    }

    const fn prefetched(self) -> Self {
        ReferenceTuning {
            prefetch_keys: true,
            ..self
        }
    }

    /// The staged dots skewed instead of padded.
    const fn swizzled(self) -> Self {
        ReferenceTuning {
            swizzled_stage: true,
            padded_stage: false,
            ..self
        }
    }

    /// One wave of CTAs sharing the chunks equally.
    const fn flat(self) -> Self {
        ReferenceTuning {
            flat_grid: true,
            ..self
        }
    }

    const fn acc_tiles(self, acc_tiles: usize) -> Self {
        ReferenceTuning { acc_tiles, ..self }
    }

    const fn ctas(self, ctas_per_sm: usize) -> Self {
        ReferenceTuning {
            ctas_per_sm,
            ..self
        }
    }

    const fn chunks(self, chunks_per_cta: usize) -> Self {
        ReferenceTuning {
            chunks_per_cta,
            ..self
        }
    }

    /// Whether a GPU of compute capability `major`.x has the instructions it uses.
    pub fn runs_on(self, major: u32) -> bool {
        (!self.wide_mma || major >= 9) && (!self.int_mma || major >= 8)
    }

    /// Tokens one CTA (4 warps) takes per chunk.
    pub(super) fn chunk_tokens(self) -> usize {
        4 * 8 * self.token_tiles
    }

    /// Shared memory one CTA may use: its share of the SM's 228 KiB, less 1 KiB each
    /// for the system.
    pub(super) fn smem_budget(self) -> usize {
        (228 / self.ctas_per_sm - 1) * 1024
    }

    /// The tuning used for `shape` on a GPU of compute capability `major`.x: the first
    /// of [`Self::PREFERRED`] that runs there and fits. Measured on the H200
    /// (BENCHMARKS.md, sessions 2 and 3); [`Self::PLAIN`] takes every shape
    /// [`rejects`] lets through.
    pub fn for_shape(shape: &Shape, major: u32) -> ReferenceTuning {
        debug_assert!(rejects_shape(shape).is_some() || Self::PLAIN.fits(shape));
        Self::PREFERRED
            .into_iter()
            .find(|t| t.runs_on(major) && t.fits(shape))
            .unwrap_or(Self::PLAIN)
    }

    /// Bytes of shared memory one next_n row of queries (and its weights) takes.
    pub(super) fn row_bytes(self, shape: &Shape) -> usize {
        if self.int_mma {
            // Three limb bytes per dimension (QFRAG), the weight; the row's output
            // offset and length (16 bytes).
            return shape.heads * 3 * shape.head_dim + shape.heads * 8 + 16;
        }
        let q = if self.f64_queries { 8 } else { 4 };
        let row = shape.head_dim + if self.vector_loads { 16 } else { 4 };
        shape.heads * row * q + shape.heads * 8
    }

    pub(super) fn fixed_bytes(self, shape: &Shape) -> usize {
        // A token's staged dots: a head tile's 8 each, a pad, or skewed in a row of 32.
        let stage_row = if self.swizzled_stage {
            32
        } else {
            8 * self.head_tiles + self.padded_stage as usize
        };
        let stage =
            (256 + 4 * (1 + self.pipelined as usize) * 8 * self.token_tiles * stage_row) * 8;
        // Keys copied ahead: each warp's 8 * token_tiles tokens of D bytes, and 32 scales.
        let keys = if self.prefetch_keys {
            4 * (8 * self.token_tiles * shape.head_dim + 32 * 4)
        } else {
            0
        };
        stage + keys
    }

    /// Whether the kernel compiled this way can take `shape` within the budget.
    pub fn fits(self, shape: &Shape) -> bool {
        let vector_ok = !self.vector_loads
            || (!self.f64_queries
                && (self.head_tiles == 1 || self.wide_mma)
                && matches!(shape.head_dim, 64 | 128));
        let wide_ok = !self.wide_mma || (self.vector_loads && self.head_tiles == 2);
        let queries_ok = !(self.f64_queries && self.hi_word_queries);
        let prefetch_ok = !self.prefetch_keys || self.int_mma;
        let swizzle_ok = !self.swizzled_stage || (self.int_mma && !self.padded_stage);
        let passes_ok = self.acc_tiles == 0
            || (self.int_mma && self.token_tiles.is_multiple_of(self.acc_tiles));
        let int_ok = !self.int_mma
            || (self.head_tiles == 2
                && !(self.f64_queries
                    || self.hi_word_queries
                    || self.hi_word_keys
                    || self.vector_loads
                    || self.wide_mma
                    || self.pipelined)
                // The kernel takes D a multiple of 32 up to 128; 64 and 128 are the
                // dims gpu-selfcheck's random cases have proved on a GPU (32 and 96,
                // one and three k-steps of the same code, have not run on one).
                && matches!(shape.head_dim, 64 | 128));
        vector_ok
            && prefetch_ok
            && swizzle_ok
            && passes_ok
            && wide_ok
            && queries_ok
            && int_ok
            && shape.heads.is_multiple_of(8 * self.head_tiles)
            && self.fixed_bytes(shape) + self.row_bytes(shape) <= self.smem_budget()
    }

    pub fn label(self) -> String {
        format!(
            "{} queries, {} head tile{}, {} CTAs/SM{}{}{}{}{}{}{}{}{}{}{}{}",
            if self.int_mma {
                "limb"
            } else if self.f64_queries {
                "f64"
            } else {
                "f32"
            },
            self.head_tiles,
            if self.head_tiles == 1 { "" } else { "s" },
            self.ctas_per_sm,
            if self.pipelined { ", pipelined" } else { "" },
            if self.vector_loads {
                ", 128-bit loads"
            } else {
                ""
            },
            match (self.hi_word_queries, self.hi_word_keys) {
                (true, true) => ", hi-word queries and keys",
                (true, false) => ", hi-word queries",
                (false, true) => ", hi-word keys",
                (false, false) => "",
            },
            if self.wide_mma { ", m16n8k16" } else { "" },
            if self.int_mma {
                ", int8 limbs (m16n8k32 s8)"
            } else {
                ""
            },
            if self.token_tiles == 2 {
                String::new()
            } else {
                format!(", {} tokens/warp", 8 * self.token_tiles)
            },
            if self.padded_stage {
                ", padded stage"
            } else {
                ""
            },
            if self.chunks_per_cta == 8 {
                String::new()
            } else {
                format!(", {} chunks/CTA", self.chunks_per_cta)
            },
            if self.prefetch_keys {
                ", keys copied ahead"
            } else {
                ""
            },
            if self.acc_tiles == 0 {
                String::new()
            } else {
                format!(
                    ", {} n-tile{} per pass",
                    self.acc_tiles,
                    if self.acc_tiles == 1 { "" } else { "s" }
                )
            },
            if self.swizzled_stage {
                ", swizzled stage"
            } else {
                ""
            },
            if self.flat_grid { ", flat grid" } else { "" }
        )
    }

    pub fn defines(self, head_dim: usize) -> Defines {
        let mut defines: Defines = vec![
            ("DD".into(), head_dim.to_string()),
            ("QF64".into(), (self.f64_queries as u8).to_string()),
            ("MTG".into(), self.head_tiles.to_string()),
            ("OMINB".into(), self.ctas_per_sm.to_string()),
            ("PIPE".into(), (self.pipelined as u8).to_string()),
            ("QV".into(), (self.vector_loads as u8).to_string()),
            ("QHI".into(), (self.hi_word_queries as u8).to_string()),
            ("KHI".into(), (self.hi_word_keys as u8).to_string()),
            ("DW".into(), (self.wide_mma as u8).to_string()),
            ("ONT".into(), self.token_tiles.to_string()),
            ("SPAD".into(), (self.padded_stage as u8).to_string()),
            ("IMMA".into(), (self.int_mma as u8).to_string()),
            ("KPF".into(), (self.prefetch_keys as u8).to_string()),
        ];
        // Unset, the kernel takes every n-tile in one pass (NB = ONT).
        if self.acc_tiles != 0 {
            defines.push(("NB".into(), self.acc_tiles.to_string()));
        }
        // Unset, SWZ and FLAT are 0: the other tunings keep their compiled names.
        if self.swizzled_stage {
            defines.push(("SWZ".into(), "1".into()));
        }
        if self.flat_grid {
            defines.push(("FLAT".into(), "1".into()));
        }
        defines
    }
}

#[cfg(test)]
mod tests;
