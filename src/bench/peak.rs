//! This machine's f64 FMA peak, measured rather than looked up: a kernel of
//! independent FMA chains that never leave registers, timed until the clock is
//! trustworthy, on one core and on every core of a thread pool at once.

use std::hint::black_box;
use std::time::{Duration, Instant};

/// Independent accumulators: enough to cover FMA latency × pipes on current x86
/// cores (4-5 cycles × 2 pipes) with room to spare, few enough to stay in 16 registers.
const CHAINS: usize = 12;
/// Inner iterations between clock reads.
const INNER: u64 = 1 << 16;

/// GFLOP/s of one thread running the kernel for at least `min_time`.
pub fn one_thread(min_time: Duration) -> f64 {
    let mut iters = INNER;
    // Calibrate: double until a run takes ≥ min_time, keep the best rate of 3.
    loop {
        let start = Instant::now();
        let flops = run(iters);
        let el = start.elapsed();
        if el >= min_time {
            let mut best = flops / el.as_secs_f64();
            for _ in 0..2 {
                let start = Instant::now();
                let flops = run(iters);
                best = best.max(flops / start.elapsed().as_secs_f64());
            }
            return best / 1e9;
        }
        iters *= 2;
    }
}

/// Sum of GFLOP/s of every thread of `pool` running the kernel at the same time.
pub fn all_threads(pool: &rayon::ThreadPool, min_time: Duration) -> f64 {
    // Warm every core (frequency ramp) before measuring.
    pool.broadcast(|_| one_thread(min_time / 4));
    pool.broadcast(|_| one_thread(min_time)).iter().sum()
}

/// Which instruction set the peak kernel used.
pub fn isa() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        return "avx2+fma (4 f64 lanes)";
    }
    "portable mul+add"
}

/// Runs `iters` FMA steps on every chain; returns the flops done.
fn run(iters: u64) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: AVX2 and FMA detected.
        unsafe { avx2(iters) };
        return (iters * CHAINS as u64 * 4 * 2) as f64;
    }
    portable(iters);
    (iters * CHAINS as u64 * 2) as f64
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2(iters: u64) {
    use std::arch::x86_64::*;
    // a*x + b with a slightly below 1 and b tiny: values stay finite and normal forever.
    let a = _mm256_set1_pd(black_box(0.999_999_9));
    let b = _mm256_set1_pd(black_box(1e-9));
    let mut acc = [_mm256_set1_pd(1.0); CHAINS];
    for (i, x) in acc.iter_mut().enumerate() {
        *x = _mm256_set1_pd(1.0 + i as f64);
    }
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm256_fmadd_pd(*x, a, b);
        }
    }
    black_box(acc);
}

fn portable(iters: u64) {
    let (a, b) = (black_box(0.999_999_9f64), black_box(1e-9f64));
    let mut acc = [0.0f64; CHAINS];
    for (i, x) in acc.iter_mut().enumerate() {
        *x = 1.0 + i as f64;
    }
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = *x * a + b;
        }
    }
    black_box(acc);
}
