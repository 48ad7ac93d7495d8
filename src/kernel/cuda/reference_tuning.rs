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
    /// registers and no spills, against 255 and 96 bytes spilled), the default on sm_80
    /// and newer.
    pub const INT8_AHEAD_SPLIT: ReferenceTuning = ReferenceTuning::INT8_AHEAD.acc_tiles(2);
    /// The default before sm_90 (m8n8k4 only): high words, padded stage, float4 loads.
    pub const NARROW: ReferenceTuning = ReferenceTuning::VECTOR.hi_words().hi_keys().padded();

    /// Fastest first, as measured on the H200 (BENCHMARKS.md, sessions 3, 17, 19 and 23):
    /// [`Self::INT8_AHEAD_SPLIT`] takes the production case to 1.088 ms against 1.149-1.151
    /// ms for [`Self::INT8_AHEAD`] in the same call (1.071-1.081 ms on session 19's
    /// machine), and is as fast or faster on the two small cases (0.039/0.060 against
    /// 0.039/0.062 ms); [`Self::INT8`] takes it to 1.154-1.176 ms (1.267 ms before its
    /// query limbs sat in fragment order), from 1.649 ms ([`Self::WIDE`], the f64 MMAs at
    /// ~62% of the FP64 tensor peak). [`Self::WIDE`] had taken the production case from
    /// 3.22 ms ([`Self::VECTOR`]); [`Self::NARROW`] (2.51 ms) is the best without an
    /// integer or m16n8k16 MMA; the plain kernel takes every other shape.
    /// [`Self::INT8_AHEAD`] is not listed: it fits and runs exactly where
    /// [`Self::INT8_AHEAD_SPLIT`] does, so it would never be picked.
    pub const PREFERRED: [ReferenceTuning; 6] = [
        ReferenceTuning::INT8_AHEAD_SPLIT,
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
    pub const ALL: [ReferenceTuning; 26] = [
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
        let stage_row = 8 * self.head_tiles + self.padded_stage as usize;
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
            && passes_ok
            && wide_ok
            && queries_ok
            && int_ok
            && shape.heads.is_multiple_of(8 * self.head_tiles)
            && self.fixed_bytes(shape) + self.row_bytes(shape) <= self.smem_budget()
    }

    pub fn label(self) -> String {
        format!(
            "{} queries, {} head tile{}, {} CTAs/SM{}{}{}{}{}{}{}{}{}{}",
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
            }
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
        defines
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::ValueLayout;
    use crate::fp8::Fp8Format;

    fn shape(heads: usize, head_dim: usize, next_n: usize) -> Shape {
        Shape {
            batch: 4,
            next_n,
            heads,
            head_dim,
            block_size: 64,
            layout: ValueLayout::Normal,
            format: Fp8Format::E4m3fn,
        }
    }

    /// The measured order holds where it should and every shape the GPU reference takes gets
    /// a tuning that fits and runs on the device.
    #[test]
    fn default_tuning_fits_and_runs() {
        let (int8, narrow) = (ReferenceTuning::INT8_AHEAD_SPLIT, ReferenceTuning::NARROW);
        assert_eq!(ReferenceTuning::for_shape(&shape(64, 128, 2), 9), int8);
        assert_eq!(ReferenceTuning::for_shape(&shape(64, 128, 2), 8), int8);
        assert_eq!(ReferenceTuning::for_shape(&shape(64, 128, 2), 7), narrow);
        assert_eq!(ReferenceTuning::for_shape(&shape(128, 128, 4), 9), int8);
        // D 16 is not a multiple of the integer MMA's 32, nor one for 128-bit loads.
        assert_eq!(
            ReferenceTuning::for_shape(&shape(64, 16, 1), 9),
            ReferenceTuning::PLAIN
        );
        // A row of 128 heads of f32 queries takes more than a third of the SM.
        assert_eq!(
            ReferenceTuning::for_shape(&shape(128, 128, 4), 7),
            ReferenceTuning::PLAIN
        );
        // 8 heads: no 16-head tile; D 96: no 128-bit query loads.
        assert_eq!(ReferenceTuning::for_shape(&shape(8, 128, 1), 9), narrow);
        // D 96: not yet proved on a GPU on the integer path.
        assert_eq!(
            ReferenceTuning::for_shape(&shape(64, 96, 1), 9),
            ReferenceTuning::PLAIN
        );
        assert_eq!(
            ReferenceTuning::for_shape(&shape(64, 96, 1), 7),
            ReferenceTuning::PLAIN
        );
        for heads in [8, 16, 24, 32, 64, 128] {
            for head_dim in [16, 32, 64, 96, 128] {
                for next_n in 1..=5 {
                    let s = shape(heads, head_dim, next_n);
                    assert!(rejects_shape(&s).is_none());
                    for major in [7, 8, 9, 10] {
                        let t = ReferenceTuning::for_shape(&s, major);
                        assert!(t.fits(&s) && t.runs_on(major), "{s:?} on {major}: {t:?}");
                    }
                }
            }
        }
    }

    /// The integer-limb dots (`IMMA=1`, kernels/reference.cu) as the kernel does them,
    /// restated: every fp8 code of both formats splits into limbs that give back its
    /// integer exactly, and the worst case at D = 128 (every product at the largest
    /// limbs) overflows neither an MMA accumulator nor the combined T01/T234, and the
    /// combined integer stays below 2^51 (the exact int-to-double step).
    #[test]
    fn integer_limb_dots_are_exact_and_cannot_overflow() {
        let mut max = [0i64; 3];
        for format in Fp8Format::ALL {
            let unit = if format == Fp8Format::E4m3fnuz {
                1024.0
            } else {
                512.0
            };
            for code in 0..=255u8 {
                let f = format.decode(code);
                if f.is_nan() {
                    continue;
                }
                let v = f * unit;
                assert_eq!(
                    v,
                    v.trunc(),
                    "{format:?} {code:#x}: not an integer times 2^-9/2^-10"
                );
                let v = v as i64;
                let m = v.abs();
                let sign = v.signum();
                let limbs = [sign * (m & 127), sign * ((m >> 7) & 127), sign * (m >> 14)];
                assert_eq!(
                    limbs[0] + limbs[1] * 128 + limbs[2] * 16384,
                    v,
                    "{format:?} {code:#x}"
                );
                for (j, l) in limbs.iter().enumerate() {
                    assert!(
                        l.abs() <= 127,
                        "{format:?} {code:#x}: limb {j} is not an int8"
                    );
                    max[j] = max[j].max(l.abs());
                }
            }
        }
        assert!(max[2] <= 15, "top limb {}", max[2]);
        let d = 128i64;
        let p = |i: usize, j: usize| max[i] * max[j] * d;
        let s = [
            p(0, 0),
            p(0, 1) + p(1, 0),
            p(0, 2) + p(1, 1) + p(2, 0),
            p(1, 2) + p(2, 1),
            p(2, 2),
        ];
        for (k, v) in s.iter().enumerate() {
            assert!(*v <= i32::MAX as i64, "S{k} = {v}");
        }
        let t01 = s[0] + s[1] * 128;
        let t234 = s[2] + s[3] * 128 + s[4] * 16384;
        assert!(
            t01 <= i32::MAX as i64 && t234 <= i32::MAX as i64,
            "{t01} {t234}"
        );
        assert!(t234 * 16384 + t01 < 1 << 51);
        // And the integer dot is the exact one: max * max * D within 2^44.
        let vmax = max[0] + max[1] * 128 + max[2] * 16384;
        assert!(vmax * vmax * d < 1 << 44);
    }

    /// The integer path's head sum takes each dot as its integer (T234 * 2^14 + T01) and
    /// scales the sums by the dot's unit (2^-18 or 2^-20) once at the end
    /// (kernels/reference.cu, `exact_int_dot`): that must give the bits of the CPU
    /// reference's head sum over the dots themselves, for every weight and scale an f32
    /// can hold (subnormal, huge, infinite, NaN), both scale placements.
    #[test]
    fn integer_head_sum_scaled_at_the_end_is_the_reference() {
        use rand::{Rng, RngExt};
        let mut rng = crate::generate::values::rng_for(17);
        let relu = |x: f64| if x > 0.0 || x.is_nan() { x } else { 0.0 };
        let same = |a: f64, b: f64| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        let f32_any = |rng: &mut proptest::test_runner::TestRng| -> f64 {
            let bits = match rng.random_range(0..4) {
                0 => rng.next_u32(),
                1 => rng.next_u32() & 0x807f_ffff, // subnormal or zero
                2 => (rng.next_u32() & 0x8000_0000) | 0x7f80_0000 | (rng.random_range(0..2) as u32), // inf or NaN
                _ => (rng.next_u32() & 0x83ff_ffff) | 0x3c00_0000, // near 1
            };
            f32::from_bits(bits) as f64
        };
        for trial in 0..20_000 {
            let unit = if trial % 2 == 0 {
                2f64.powi(-18)
            } else {
                2f64.powi(-20)
            };
            let inside = trial % 4 < 2;
            let heads = 1 + rng.random_range(0..64);
            let scale = f32_any(&mut rng);
            let (mut v, mut m, mut vi, mut mi) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
            for _ in 0..heads {
                let int = match rng.random_range(0..3) {
                    0 => rng.random_range(-3i64..=3),
                    1 => rng.random_range(-(1i64 << 20)..(1 << 20)),
                    _ => rng.random_range(-(1i64 << 44) + 1..(1 << 44)),
                } as f64;
                let w = f32_any(&mut rng);
                let dot = int * unit; // exact: the reference's dot
                let (t, ti) = if inside {
                    (w * relu(dot * scale), w * relu(int * scale))
                } else {
                    (w * relu(dot), w * relu(int))
                };
                v += t;
                m += t.abs();
                vi += ti;
                mi += ti.abs();
            }
            let (vi, mi) = (vi * unit, mi * unit);
            let (want, got) = if inside {
                ((v, m), (vi, mi))
            } else {
                ((v * scale, m * scale.abs()), (vi * scale, mi * scale.abs()))
            };
            assert!(
                same(want.0, got.0) && same(want.1, got.1),
                "trial {trial}: {want:?} vs {got:?} (scale {scale:e}, inside {inside})"
            );
        }
    }

    /// `exact_int_dot` of kernels/reference.cu restated: the dot's integer made a double
    /// through the bias 1.5 * 2^52 added to its high word alone, with the ReLU taken on
    /// the integer (the scale after the sum) or not, is the integer (or its ReLU, +0.0 for
    /// a negative one) exactly, over the whole range the limb sums reach.
    #[test]
    fn integer_dots_become_doubles_with_their_relu_exactly() {
        use rand::RngExt;
        let mut rng = crate::generate::values::rng_for(23);
        let exact_int_dot = |t01: i32, t234: i32, relu_mask: i32| -> f64 {
            let t = ((t234 as i64) << 14) + t01 as i64;
            let (hi, lo) = ((t >> 32) as i32, t as i32);
            let drop = (hi >> 31) & relu_mask;
            let hi = (hi & !drop).wrapping_add(0x4338_0000);
            let bits = ((hi as u32 as u64) << 32) | (lo & !drop) as u32 as u64;
            f64::from_bits(bits) - 6_755_399_441_055_744.0
        };
        let bound = 1i32 << 29;
        for trial in 0..200_000 {
            let (t01, t234) = match trial % 4 {
                0 => (rng.random_range(-3..=3), rng.random_range(-3..=3)),
                1 => (rng.random_range(-bound..bound), 0),
                _ => (
                    rng.random_range(-bound..bound),
                    rng.random_range(-bound..bound),
                ),
            };
            let t = ((t234 as i64) << 14) + t01 as i64;
            let plain = exact_int_dot(t01, t234, 0);
            assert_eq!(plain, t as f64, "{t01} {t234}");
            let relu = exact_int_dot(t01, t234, -1);
            let want = if t > 0 { t as f64 } else { 0.0 };
            assert_eq!(
                relu.to_bits(),
                want.to_bits(),
                "{t01} {t234}: {relu} vs {want}"
            );
        }
    }

    #[test]
    fn tunings_are_distinct_and_labelled() {
        let labels: std::collections::BTreeSet<String> =
            ReferenceTuning::ALL.iter().map(|t| t.label()).collect();
        assert_eq!(labels.len(), ReferenceTuning::ALL.len());
        for t in ReferenceTuning::PREFERRED {
            assert!(ReferenceTuning::ALL.contains(&t), "{}", t.label());
        }
    }

    /// The preferred tunings compile for Hopper, and the m16n8k16 form is refused
    /// before Hopper (which `runs_on` mirrors). Needs NVRTC, not a GPU.
    #[test]
    fn preferred_tunings_compile_where_they_run() {
        use super::super::compile::{cubin, Program};
        if !super::super::sys::nvrtc_present() {
            eprintln!("SKIP preferred_tunings_compile_where_they_run: libnvrtc not found");
            return;
        }
        for t in ReferenceTuning::PREFERRED {
            for dd in [64, 128] {
                cubin(Program::Reference, "sm_90a", &t.defines(dd))
                    .unwrap_or_else(|e| panic!("{}: {e}", t.label()));
            }
            assert_eq!(t.runs_on(8), !t.wide_mma);
            if t.wide_mma {
                assert!(cubin(Program::Reference, "sm_89", &t.defines(128)).is_err());
            }
        }
    }
}
