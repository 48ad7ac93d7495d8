//! The generator of case values: Philox-4x32-10 (Salmon et al., "Parallel random
//! numbers: as easy as 1, 2, 3", SC 2011), counter-based, and transforms from its words
//! to values that use integer and exactly rounded operations only. Any word of any
//! stream is computed on its own, so a case is drawn on every core, and
//! `kernels/generate.cu` (its device twin) gives the same bytes for the same recipe.
//!
//! The definition, which the device twin follows:
//! - **Key**: a case's 64-bit value seed, low word first.
//! - **Word `n` of stream `s`**: lane `n % 4` of Philox-4x32-10 of the counter
//!   `[n/4 low, n/4 high, s low, s high]`. Rows use stream `r`, KV blocks
//!   [`BLOCK_STREAM`]` | i` (`i`: the block's index in the draw), words in draw order.
//! - **A Gaussian** from one word: bit 31 is the sign, bits 0..12 index [`gauss_table`],
//!   the bf16 half-normal quantiles at `(i + 1/2) / 4096` (to 3.84 sigma).
//! - **Pipeline quantisation** (per token of D values): `amax = max |x|`; the scale is
//!   the smallest power of two ≥ `max(amax, 1e-4) / fp8_max` (an f64 division, then the
//!   exponent bits: [`pow2_ceil`]); each code is the round-to-nearest-even fp8 of
//!   `x / scale` (exact: a division by a power of two).

use crate::fp8::Fp8Format;
use std::sync::LazyLock;

/// The stream of KV block `i` is `BLOCK_STREAM | i`; row `r` uses stream `r`.
pub const BLOCK_STREAM: u64 = 1 << 63;

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

#[inline]
fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = a as u64 * b as u64;
    ((p >> 32) as u32, p as u32)
}

/// Philox-4x32 with 10 rounds of `ctr` under `key` (the Random123 reference).
#[inline]
pub fn philox4x32_10(mut ctr: [u32; 4], mut key: [u32; 2]) -> [u32; 4] {
    for round in 0..10 {
        if round > 0 {
            key = [key[0].wrapping_add(W0), key[1].wrapping_add(W1)];
        }
        let (hi0, lo0) = mulhilo(M0, ctr[0]);
        let (hi1, lo1) = mulhilo(M1, ctr[2]);
        ctr = [hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0];
    }
    ctr
}

/// Word `n` of stream `s` under the key of `seed` (see the module's definition).
pub fn word(seed: u64, s: u64, n: u64) -> u32 {
    let q = n / 4;
    let key = [seed as u32, (seed >> 32) as u32];
    philox4x32_10(
        [q as u32, (q >> 32) as u32, s as u32, (s >> 32) as u32],
        key,
    )[(n % 4) as usize]
}

/// One stream's words in order, as an RNG (`rand`'s distributions for the value kinds
/// that are not Gaussian draw from it too).
#[derive(Clone, Debug)]
pub struct Stream {
    key: [u32; 2],
    stream: [u32; 2],
    /// The next word's index.
    n: u64,
    block: [u32; 4],
}

impl Stream {
    pub fn new(seed: u64, stream: u64) -> Stream {
        Stream {
            key: [seed as u32, (seed >> 32) as u32],
            stream: [stream as u32, (stream >> 32) as u32],
            n: 0,
            block: [0; 4],
        }
    }

    #[inline]
    pub fn next_word(&mut self) -> u32 {
        let lane = (self.n % 4) as usize;
        if lane == 0 {
            let q = self.n / 4;
            let ctr = [q as u32, (q >> 32) as u32, self.stream[0], self.stream[1]];
            self.block = philox4x32_10(ctr, self.key);
        }
        self.n += 1;
        self.block[lane]
    }

    /// A bf16 standard normal from the next word ([`gauss_bf16`]).
    #[inline]
    pub fn gauss(&mut self) -> f32 {
        gauss_bf16(self.next_word())
    }
}

impl rand::TryRng for Stream {
    type Error = std::convert::Infallible;
    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        Ok(self.next_word())
    }
    /// Two words, the first one low.
    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        let lo = self.next_word() as u64;
        Ok(lo | (self.next_word() as u64) << 32)
    }
    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        for chunk in dst.chunks_mut(4) {
            let w = self.next_word().to_le_bytes();
            chunk.copy_from_slice(&w[..chunk.len()]);
        }
        Ok(())
    }
}

/// Entries of [`gauss_table`]: 12 bits of a word.
pub const GAUSS_TABLE_LEN: usize = 4096;

/// `Φ⁻¹(p)` by Acklam's rational approximation (relative error < 1.2e-9, far below a
/// bf16 step); only used to build [`gauss_table`], which is the definition.
fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

static GAUSS_TABLE: LazyLock<[u16; GAUSS_TABLE_LEN]> = LazyLock::new(|| {
    std::array::from_fn(|i| {
        let p = 0.5 + 0.5 * (i as f64 + 0.5) / GAUSS_TABLE_LEN as f64;
        half::bf16::from_f64(normal_quantile(p)).to_bits()
    })
});

/// The bf16 bits of the half-normal quantiles, ascending (uploaded to the device twin
/// as they are: the table is data, so both sides agree by construction).
pub fn gauss_table() -> &'static [u16; GAUSS_TABLE_LEN] {
    &GAUSS_TABLE
}

/// A bf16 standard normal from one word: bit 31 the sign, bits 0..12 the quantile.
#[inline]
pub fn gauss_bf16(w: u32) -> f32 {
    let mag = GAUSS_TABLE[(w as usize) & (GAUSS_TABLE_LEN - 1)];
    half::bf16::from_bits(mag | ((w >> 16) as u16 & 0x8000)).to_f32()
}

/// The smallest power of two ≥ `x` (finite, > 0), from its bits: `x` itself when its
/// mantissa is zero, else the next binade's first value.
#[inline]
pub fn pow2_ceil(x: f64) -> f64 {
    let bits = x.to_bits();
    let exp = bits >> 52 & 0x7FF;
    if bits & ((1 << 52) - 1) == 0 {
        x
    } else {
        f64::from_bits((exp + 1) << 52)
    }
}

/// Quantises one token's values as the pipeline does (see the module's definition):
/// the plain formula, which [`quantize_words`] must equal.
pub fn quantize(format: Fp8Format, xs: &[f32]) -> (Vec<u8>, f32) {
    let amax = xs.iter().fold(0f32, |m, x| m.max(x.abs())) as f64;
    let scale = pow2_ceil(amax.max(1e-4) / format.max());
    let codes = xs
        .iter()
        .map(|&x| format.encode(x as f64 / scale, true))
        .collect();
    (codes, scale as f32)
}

/// For one format: the scale of a token whose largest |value| is table entry `i`, and
/// for each such scale the magnitude code of every table entry.
struct Quantizer {
    /// Per table index: the token's scale, and the index into `codes` of its column.
    scale_of_amax: Vec<(f32, u8)>,
    codes: Vec<[u8; GAUSS_TABLE_LEN]>,
}

fn quantizer(format: Fp8Format) -> &'static Quantizer {
    static Q: LazyLock<[Quantizer; 2]> = LazyLock::new(|| {
        Fp8Format::ALL.map(|format| {
            let table: Vec<f64> = gauss_table()
                .iter()
                .map(|&b| half::bf16::from_bits(b).to_f64())
                .collect();
            let mut scales: Vec<f64> = Vec::new();
            let mut codes = Vec::new();
            let scale_of_amax = table
                .iter()
                .map(|&amax| {
                    let scale = pow2_ceil(amax.max(1e-4) / format.max());
                    let col = scales.iter().position(|&s| s == scale).unwrap_or_else(|| {
                        scales.push(scale);
                        codes.push(std::array::from_fn(|i| {
                            format.encode(table[i] / scale, true)
                        }));
                        scales.len() - 1
                    });
                    (scale as f32, col as u8)
                })
                .collect();
            Quantizer {
                scale_of_amax,
                codes,
            }
        })
    });
    &Q[Fp8Format::ALL
        .iter()
        .position(|&f| f == format)
        .unwrap_or(0)]
}

/// [`quantize`] of the Gaussians of `words`, by table lookups: the table is ascending,
/// so the token's amax is the entry of its largest index, which fixes the scale; each
/// code is then the scale's code of its entry with the word's sign (fnuz has no -0).
pub fn quantize_words(format: Fp8Format, words: &[u32], codes: &mut Vec<u8>) -> f32 {
    let q = quantizer(format);
    let mask = GAUSS_TABLE_LEN as u32 - 1;
    let imax = words.iter().map(|w| w & mask).max().unwrap_or(0);
    let (scale, col) = q.scale_of_amax[imax as usize];
    let column = &q.codes[col as usize];
    codes.extend(words.iter().map(|&w| {
        let mag = column[(w & mask) as usize];
        let negative = w >> 31 != 0;
        match negative && !(format == Fp8Format::E4m3fnuz && mag == 0) {
            true => mag | 0x80,
            false => mag,
        }
    }));
    scale
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The known-answer vectors of the Random123 distribution (`kat_vectors`).
    #[test]
    fn philox_known_answers() {
        let kats = [
            (
                [0u32; 4],
                [0u32; 2],
                [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8],
            ),
            (
                [u32::MAX; 4],
                [u32::MAX; 2],
                [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd],
            ),
            (
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0],
                [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1],
            ),
        ];
        for (ctr, key, want) in kats {
            assert_eq!(philox4x32_10(ctr, key), want, "ctr {ctr:x?} key {key:x?}");
        }
    }

    /// A stream's words in order are the words computed one by one.
    #[test]
    fn stream_is_the_words_in_order() {
        for (seed, s) in [
            (0u64, 0u64),
            (0xDEAD_BEEF_1234_5678, 7),
            (3, BLOCK_STREAM | 9),
        ] {
            let mut st = Stream::new(seed, s);
            for n in 0..37 {
                assert_eq!(
                    st.next_word(),
                    word(seed, s, n),
                    "seed {seed} stream {s} word {n}"
                );
            }
        }
    }

    /// `pow2_ceil` from the bits agrees with the plain `2^ceil(log2 x)` over many
    /// magnitudes, exact powers of two included.
    #[test]
    fn pow2_ceil_matches_the_plain_formula() {
        let plain = |x: f64| 2f64.powi(x.log2().ceil() as i32);
        let mut st = Stream::new(42, 0);
        for e in -30..30 {
            let p = 2f64.powi(e);
            assert_eq!(pow2_ceil(p), p);
            for _ in 0..50 {
                let x = p * (1.0 + st.next_word() as f64 / 4_294_967_296.0);
                assert_eq!(pow2_ceil(x), plain(x), "x = {x:e}");
            }
        }
    }

    /// The table is the bf16 of the quantiles, ascending, and its draws look like a
    /// standard normal; its bytes are frozen (a libm that rounds one entry differently
    /// would change every case, so this must fail first).
    #[test]
    fn gauss_table_is_a_standard_normal() {
        let t = gauss_table();
        let v: Vec<f64> = t
            .iter()
            .map(|&b| half::bf16::from_bits(b).to_f64())
            .collect();
        assert!(v.windows(2).all(|w| w[0] <= w[1]) && v[0] > 0.0);
        assert!(
            (v[GAUSS_TABLE_LEN - 1] - 3.84).abs() < 0.02,
            "{}",
            v[GAUSS_TABLE_LEN - 1]
        );
        let var = v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64;
        assert!((var - 1.0).abs() < 0.01, "variance {var}");
        let mut st = Stream::new(9, 1);
        let draws: Vec<f64> = (0..100_000).map(|_| st.gauss() as f64).collect();
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!(mean.abs() < 0.02, "mean {mean}");
        let fnv = t.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
        });
        assert_eq!(fnv, 0xeb64_d0fa_5402_5b31, "gauss table hash {fnv:#x}");
    }

    /// The lookups of `quantize_words` give `quantize` of the words' Gaussians (the plain
    /// formula), on random tokens and on tokens whose amax sits at each end of the table.
    #[test]
    fn quantize_words_matches_quantize() {
        let mut st = Stream::new(77, 3);
        for format in Fp8Format::ALL {
            for k in 0..3000u32 {
                let mut words: Vec<u32> = (0..(16 + k % 113) as usize)
                    .map(|_| st.next_word())
                    .collect();
                if k % 3 == 1 {
                    words.iter_mut().for_each(|w| *w &= 0x8000_00FF); // small amax
                }
                if k % 7 == 2 {
                    words[0] = 0x0000_0000; // +smallest entry, and -0 cases below
                    words[1] = 0x8000_0000;
                }
                let xs: Vec<f32> = words.iter().map(|&w| gauss_bf16(w)).collect();
                let mut codes = Vec::new();
                let scale = quantize_words(format, &words, &mut codes);
                assert_eq!(
                    (codes, scale),
                    quantize(format, &xs),
                    "{format:?} token {k}"
                );
            }
        }
    }

    /// `quantize` gives the plain formula's codes and scale (`2^ceil(log2(..))`, then
    /// the encoder on `x / scale` in f64) on Gaussian tokens of both formats.
    #[test]
    fn quantize_matches_the_plain_formula() {
        let mut st = Stream::new(5, 2);
        for format in Fp8Format::ALL {
            for _ in 0..500 {
                let xs: Vec<f32> = (0..64).map(|_| st.gauss()).collect();
                let amax = xs.iter().fold(0f32, |m, x| m.max(x.abs())) as f64;
                let scale = 2f64.powi((amax.max(1e-4) / format.max()).log2().ceil() as i32);
                let codes: Vec<u8> = xs
                    .iter()
                    .map(|&x| format.encode(x as f64 / scale, true))
                    .collect();
                assert_eq!(quantize(format, &xs), (codes, scale as f32));
            }
        }
    }
}
