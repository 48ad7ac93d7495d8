//! The tunings' fit, order and labels, and the integer path's exact arithmetic.

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
    let (int8, narrow) = (ReferenceTuning::INT8_FLAT, ReferenceTuning::NARROW);
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

/// The skewed stage (`SWZ=1`, kernels/reference.cu `STAGE_SLOT`) restated: a token's 16
/// heads keep distinct slots of its row, the head sum's loads (lane = token, one head) and
/// the epilogue's stores (lane g*4 + t4: token n*8 + 2*t4 + c, head 8*xh + g) hit 16
/// distinct 8-byte banks in each half-warp, so neither is conflicted; the padded stage
/// (`SPAD=1`, rows of 17) conflicts on the stores, which is what the skew removes.
#[test]
fn skewed_stage_is_free_of_bank_conflicts() {
    let skewed = |tok: usize, head: usize| {
        tok * 32 + head + ((((tok >> 1) & 3) << 2) | (tok & 1) | ((tok >> 2) & 2))
    };
    let padded = |tok: usize, head: usize| tok * 17 + head;
    let conflict_free = |slot: &dyn Fn(usize, usize) -> usize| {
        let halves_distinct = |lanes: &dyn Fn(usize) -> usize| {
            (0..2).all(|half| {
                let banks: std::collections::BTreeSet<usize> =
                    (half * 16..half * 16 + 16).map(|l| lanes(l) % 16).collect();
                banks.len() == 16
            })
        };
        let loads = (0..16).all(|hh| halves_distinct(&|lane| slot(lane, hh)));
        let stores = (0..4).all(|n| {
            (0..2).all(|c| {
                (0..2).all(|xh| {
                    halves_distinct(&|l| slot(n * 8 + 2 * (l & 3) + c, xh * 8 + (l >> 2)))
                })
            })
        });
        (loads, stores)
    };
    assert_eq!(conflict_free(&skewed), (true, true));
    assert_eq!(conflict_free(&padded), (true, false));
    for tok in 0..32 {
        let mut slots: Vec<usize> = (0..16).map(|h| skewed(tok, h) - tok * 32).collect();
        slots.sort();
        assert!(slots.windows(2).all(|w| w[0] < w[1]) && slots[15] < 32);
    }
}

/// The flat grid (`FLAT=1`) restated: CTA k of G takes chunks [k*T/G, (k+1)*T/G) of all
/// sequences' T chunks and finds its first sequence by a binary search in the prefix
/// sums; over random chunk counts (empty sequences included) every chunk of every
/// sequence is taken by exactly one CTA, and the shares differ by at most one chunk.
#[test]
fn flat_grid_shares_cover_every_chunk_once() {
    let mut rng = crate::generate::recipe::rng_for(7);
    use rand::RngExt;
    for _ in 0..300 {
        let batch = rng.random_range(1..40usize);
        let mut prefix = vec![0i64; batch + 1];
        for b in 0..batch {
            let n = if rng.random_range(0..4) == 0 {
                0
            } else {
                rng.random_range(1..50)
            };
            prefix[b + 1] = prefix[b] + n;
        }
        let total = prefix[batch];
        let grid = rng.random_range(1..300i64).min(total.max(1));
        let mut taken = vec![0u8; total as usize];
        let mut sizes = Vec::new();
        for k in 0..grid {
            let (g_begin, g_end) = (k * total / grid, (k + 1) * total / grid);
            sizes.push(g_end - g_begin);
            let (mut b_first, mut b_hi) = (0usize, batch - 1);
            while b_first < b_hi {
                let mid = (b_first + b_hi).div_ceil(2);
                if prefix[mid] <= g_begin {
                    b_first = mid;
                } else {
                    b_hi = mid - 1;
                }
            }
            let mut b = b_first;
            while b < batch && prefix[b] < g_end {
                let c_first = (g_begin - prefix[b]).max(0);
                let c_end = g_end.min(prefix[b + 1]) - prefix[b];
                for c in c_first..c_end {
                    taken[(prefix[b] + c) as usize] += 1;
                }
                b += 1;
            }
        }
        assert!(taken.iter().all(|&t| t == 1), "{prefix:?} over {grid}");
        let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
        assert!(hi - lo <= 1);
    }
}
