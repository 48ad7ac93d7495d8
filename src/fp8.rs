//! FP8 E4M3 codecs, written here because no crate gets both formats right.
//!
//! * `e4m3fn` (NVIDIA, MI355/gfx950): bias 7, max 448, NaN = `S.1111.111`, has -0, no inf.
//! * `e4m3fnuz` (MI300/gfx942): bias 8, max 240, NaN only `0x80`, no -0, no inf.
//!
//! Decoding is a 256-entry table per format. Encoding rounds to nearest, ties to even,
//! directly from `f64` (so an `f32` input is rounded once, never twice). Every finite
//! code is an integer multiple of 2^-9 (fn) or 2^-10 (fnuz), which is what makes the
//! reference's f64 dot products exact (see `reference`).

use serde::{Deserialize, Serialize};
use std::sync::LazyLock;

/// The two FP8 E4M3 encodings found in the wild.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fp8Format {
    E4m3fn,
    E4m3fnuz,
}

impl Fp8Format {
    pub const ALL: [Fp8Format; 2] = [Fp8Format::E4m3fn, Fp8Format::E4m3fnuz];

    pub fn name(self) -> &'static str {
        match self {
            Fp8Format::E4m3fn => "e4m3fn",
            Fp8Format::E4m3fnuz => "e4m3fnuz",
        }
    }

    /// Largest finite magnitude.
    pub fn max(self) -> f64 {
        match self {
            Fp8Format::E4m3fn => 448.0,
            Fp8Format::E4m3fnuz => 240.0,
        }
    }

    /// The canonical NaN code (what the encoder emits for NaN and overflow).
    pub fn nan_code(self) -> u8 {
        match self {
            Fp8Format::E4m3fn => 0x7F,
            Fp8Format::E4m3fnuz => 0x80,
        }
    }

    /// Code of the largest finite positive value.
    pub fn max_code(self) -> u8 {
        match self {
            Fp8Format::E4m3fn => 0x7E,
            Fp8Format::E4m3fnuz => 0x7F,
        }
    }

    pub fn is_nan_code(self, code: u8) -> bool {
        match self {
            Fp8Format::E4m3fn => code & 0x7F == 0x7F,
            Fp8Format::E4m3fnuz => code == 0x80,
        }
    }

    /// The decode table: `table()[code]` is the value of `code`.
    pub fn table(self) -> &'static [f32; 256] {
        match self {
            Fp8Format::E4m3fn => &FN_TABLE,
            Fp8Format::E4m3fnuz => &FNUZ_TABLE,
        }
    }

    #[inline]
    pub fn decode(self, code: u8) -> f32 {
        self.table()[code as usize]
    }

    /// Round-to-nearest-even encoding. `saturate`: values beyond the range (and ±inf)
    /// become ±max; otherwise they become NaN (neither format has an infinity).
    pub fn encode(self, x: f64, saturate: bool) -> u8 {
        encode(self, x, saturate)
    }
}

impl std::fmt::Display for Fp8Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn decode_slow(format: Fp8Format, code: u8) -> f32 {
    if format.is_nan_code(code) {
        return f32::NAN;
    }
    let bias = match format {
        Fp8Format::E4m3fn => 7,
        Fp8Format::E4m3fnuz => 8,
    };
    let sign = if code & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((code >> 3) & 0x0F) as i32;
    let man = (code & 0x07) as f32;
    let mag = if exp == 0 {
        man / 8.0 * 2f32.powi(1 - bias)
    } else {
        (1.0 + man / 8.0) * 2f32.powi(exp - bias)
    };
    sign * mag
}

static FN_TABLE: LazyLock<[f32; 256]> =
    LazyLock::new(|| std::array::from_fn(|c| decode_slow(Fp8Format::E4m3fn, c as u8)));
static FNUZ_TABLE: LazyLock<[f32; 256]> =
    LazyLock::new(|| std::array::from_fn(|c| decode_slow(Fp8Format::E4m3fnuz, c as u8)));

fn encode(format: Fp8Format, x: f64, saturate: bool) -> u8 {
    if x.is_nan() {
        return format.nan_code();
    }
    let negative = x.is_sign_negative();
    let a = x.abs();
    let max_code = format.max_code();
    let max = format.max();
    // Half an ulp above max: the top binade has ulp 2^(e-3).
    let top_ulp = max - format.decode(max_code - 1) as f64;
    let tie_above = max + top_ulp / 2.0;
    let mag_code: Option<u8> = if a > tie_above || (a == tie_above && max_code & 1 == 1) {
        None // overflow
    } else if a >= max {
        Some(max_code)
    } else {
        Some(round_to_code(format, a))
    };
    match mag_code {
        None if saturate => apply_sign(format, max_code, negative),
        None => format.nan_code(),
        Some(c) => apply_sign(format, c, negative),
    }
}

/// The magnitude code nearest to `a` (0 <= a < max), ties to even, by arithmetic:
/// `encode` is the hot loop of materializing a case. Below the smallest normal the
/// codes step by 2^(-bias-2) (code = a / step); above, binade e holds codes
/// ((e + bias) << 3) + 0..7 stepping by 2^(e-3), and a * 2^(3-e) lies in [8, 16), so
/// the rounded value minus 8 is the mantissa — a carry to 16 lands on the next binade's
/// first code, as it should. Every scaling is by a power of two, so it is exact.
fn round_to_code(format: Fp8Format, a: f64) -> u8 {
    let bias = match format {
        Fp8Format::E4m3fn => 7,
        Fp8Format::E4m3fnuz => 8,
    };
    let pow2 = |e: i32| f64::from_bits(((1023 + e) as u64) << 52);
    if a < pow2(1 - bias) {
        return (a * pow2(bias + 2)).round_ties_even() as u8;
    }
    let e = ((a.to_bits() >> 52) & 0x7FF) as i32 - 1023;
    let q = (a * pow2(3 - e)).round_ties_even() as i32;
    (((e + bias) << 3) + q - 8) as u8
}

fn apply_sign(format: Fp8Format, mag_code: u8, negative: bool) -> u8 {
    if !negative {
        return mag_code;
    }
    match format {
        // fnuz has no -0: 0x80 is its NaN.
        Fp8Format::E4m3fnuz if mag_code == 0 => 0,
        _ => mag_code | 0x80,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Fp8Format::*;

    #[test]
    fn fn_table_known_values() {
        assert_eq!(E4m3fn.decode(0x00), 0.0);
        assert!(E4m3fn.decode(0x80).is_sign_negative() && E4m3fn.decode(0x80) == 0.0);
        assert_eq!(E4m3fn.decode(0x01), 2f32.powi(-9));
        assert_eq!(E4m3fn.decode(0x07), 7.0 * 2f32.powi(-9));
        assert_eq!(E4m3fn.decode(0x08), 2f32.powi(-6));
        assert_eq!(E4m3fn.decode(0x38), 1.0);
        assert_eq!(E4m3fn.decode(0x7E), 448.0);
        assert_eq!(E4m3fn.decode(0xFE), -448.0);
        assert!(E4m3fn.decode(0x7F).is_nan() && E4m3fn.decode(0xFF).is_nan());
        // Exactly two NaN codes, no inf anywhere.
        let t = E4m3fn.table();
        assert_eq!(t.iter().filter(|v| v.is_nan()).count(), 2);
        assert!(t.iter().all(|v| !v.is_infinite()));
    }

    #[test]
    fn fnuz_table_known_values() {
        assert_eq!(E4m3fnuz.decode(0x00), 0.0);
        assert!(E4m3fnuz.decode(0x80).is_nan());
        assert_eq!(E4m3fnuz.decode(0x01), 2f32.powi(-10));
        assert_eq!(E4m3fnuz.decode(0x08), 2f32.powi(-7));
        assert_eq!(E4m3fnuz.decode(0x40), 1.0);
        assert_eq!(E4m3fnuz.decode(0x7F), 240.0);
        assert_eq!(E4m3fnuz.decode(0xFF), -240.0);
        let t = E4m3fnuz.table();
        assert_eq!(t.iter().filter(|v| v.is_nan()).count(), 1);
        // No -0: the only zero is code 0.
        assert_eq!(t.iter().filter(|v| **v == 0.0).count(), 1);
        // fnuz(c) == fn(c) / 2 for every code that is not NaN in either format.
        for c in 0..=255u8 {
            if !E4m3fn.is_nan_code(c) && !E4m3fnuz.is_nan_code(c) {
                assert_eq!(E4m3fnuz.decode(c) * 2.0, E4m3fn.decode(c), "code {c:#04x}");
            }
        }
    }

    #[test]
    fn every_code_round_trips_and_is_on_the_grid() {
        for f in Fp8Format::ALL {
            let grid = match f {
                E4m3fn => 2f64.powi(9),
                E4m3fnuz => 2f64.powi(10),
            };
            for c in 0..=255u8 {
                let v = f.decode(c) as f64;
                if v.is_nan() {
                    assert!(f.is_nan_code(c));
                    assert_eq!(f.encode(v, false), f.nan_code());
                    continue;
                }
                assert_eq!((v * grid).fract(), 0.0, "{f} code {c:#04x} not on the grid");
                let back = f.encode(v, false);
                assert_eq!(
                    back, c,
                    "{f} code {c:#04x} value {v} re-encoded as {back:#04x}"
                );
                assert_eq!(f.encode(v, true), c);
            }
        }
    }

    /// The arithmetic rounding agrees with a search of the decode table (nearest
    /// magnitude, ties to the even code) on random magnitudes across every binade, the
    /// subnormals and the exact midpoints.
    #[test]
    fn arithmetic_rounding_matches_table_search() {
        // Non-negative magnitudes in increasing order, indexed by code.
        let magnitudes =
            |f: Fp8Format| -> Vec<f64> { (0..=f.max_code()).map(|c| f.decode(c) as f64).collect() };
        let by_search = |f: Fp8Format, a: f64| -> u8 {
            let mags = magnitudes(f);
            let lo = mags.iter().rposition(|&m| m <= a).unwrap();
            if mags[lo] == a {
                return lo as u8;
            }
            let (d_lo, d_hi) = (a - mags[lo], mags[lo + 1] - a);
            (if d_lo < d_hi || (d_lo == d_hi && lo % 2 == 0) {
                lo
            } else {
                lo + 1
            }) as u8
        };
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for f in Fp8Format::ALL {
            let mags = magnitudes(f);
            let max = f.max();
            let check = |a: f64| {
                if a < max {
                    assert_eq!(round_to_code(f, a), by_search(f, a), "{f} {a:e}");
                }
            };
            for w in mags.windows(2) {
                let mid = (w[0] + w[1]) / 2.0;
                for a in [w[0], mid, w[1], mid - 1e-12 * mid, mid + 1e-12 * mid] {
                    check(a);
                }
            }
            for _ in 0..200_000 {
                // Log-uniform over [2^-14, max): every binade and the subnormals.
                let u = (next() >> 11) as f64 / (1u64 << 53) as f64;
                check(2f64.powf(-14.0 + u * (max.log2() + 14.0)));
            }
        }
    }

    #[test]
    fn every_tie_rounds_to_even() {
        for f in Fp8Format::ALL {
            for c in 0..f.max_code() {
                let lo = f.decode(c) as f64;
                let hi = f.decode(c + 1) as f64;
                let mid = (lo + hi) / 2.0;
                let even = if c % 2 == 0 { c } else { c + 1 };
                assert_eq!(f.encode(mid, false), even, "{f} tie {mid}");
                assert_eq!(
                    f.encode(-mid, false),
                    apply_sign(f, even, true),
                    "{f} tie -{mid}"
                );
                // Just off the tie goes to the nearer neighbour.
                let eps = (hi - lo) / 1024.0;
                assert_eq!(f.encode(mid - eps, false), c);
                assert_eq!(f.encode(mid + eps, false), c + 1);
            }
        }
    }

    #[test]
    fn overflow_e4m3fn() {
        assert_eq!(E4m3fn.encode(464.0, false), 0x7E, "464 ties to even 448");
        assert_eq!(E4m3fn.encode(464.0001, false), 0x7F, "above 464 is NaN");
        assert_eq!(E4m3fn.encode(-464.0001, false) & 0x7F, 0x7F);
        assert_eq!(E4m3fn.encode(1e9, true), 0x7E);
        assert_eq!(E4m3fn.encode(-1e9, true), 0xFE);
        assert_eq!(E4m3fn.encode(f64::INFINITY, false), 0x7F);
        assert_eq!(E4m3fn.encode(f64::INFINITY, true), 0x7E);
        assert_eq!(E4m3fn.encode(f64::NEG_INFINITY, true), 0xFE);
    }

    #[test]
    fn overflow_e4m3fnuz() {
        assert_eq!(E4m3fnuz.encode(247.9, false), 0x7F);
        // 248 is the tie between 240 (odd mantissa) and 256 (not representable): overflow.
        assert_eq!(E4m3fnuz.encode(248.0, false), 0x80);
        assert_eq!(E4m3fnuz.encode(248.0, true), 0x7F);
        assert_eq!(E4m3fnuz.encode(-300.0, true), 0xFF);
        assert_eq!(E4m3fnuz.encode(f64::NAN, true), 0x80);
    }

    #[test]
    fn signed_zero_and_underflow() {
        assert_eq!(E4m3fn.encode(-0.0, false), 0x80);
        assert_eq!(E4m3fnuz.encode(-0.0, false), 0x00, "fnuz has no -0");
        // Half the smallest subnormal ties to zero (even).
        assert_eq!(E4m3fn.encode(2f64.powi(-10), false), 0x00);
        assert_eq!(E4m3fn.encode(-(2f64.powi(-10)), false), 0x80);
        assert_eq!(E4m3fnuz.encode(-(2f64.powi(-11)), false), 0x00);
        assert_eq!(E4m3fn.encode(2f64.powi(-10) * 1.01, false), 0x01);
        assert_eq!(E4m3fnuz.encode(-(2f64.powi(-11)) * 1.01, false), 0x81);
    }

    #[test]
    fn nan_codes_are_exactly_the_documented_ones() {
        let nan_codes = |f: Fp8Format| {
            (0..=255u8)
                .filter(|&c| f.is_nan_code(c))
                .collect::<Vec<_>>()
        };
        assert_eq!(nan_codes(E4m3fn), vec![0x7F, 0xFF]);
        assert_eq!(nan_codes(E4m3fnuz), vec![0x80]);
        for f in Fp8Format::ALL {
            assert!(f.is_nan_code(f.nan_code()));
            assert_eq!(f.decode(f.max_code()) as f64, f.max());
            // Non-saturating: NaN and both infinities become the NaN code.
            for x in [f64::NAN, -f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
                assert!(f.is_nan_code(f.encode(x, false)), "{f} {x}");
            }
            // Saturating: NaN stays NaN, infinities clamp to the signed max.
            assert!(f.is_nan_code(f.encode(f64::NAN, true)));
            assert_eq!(f.decode(f.encode(f64::NEG_INFINITY, true)) as f64, -f.max());
        }
    }
}
