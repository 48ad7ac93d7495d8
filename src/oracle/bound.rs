//! The per-element error bound.
//!
//! For an element with exact head dots `dot_h`, a kernel that accumulates in f32 makes
//! at most D-1 roundings inside each dot (products of two fp8 values are exact in f32),
//! then one per weight multiply, H-1 in the head sum and one for the scale. Standard
//! forward error analysis (γ_n = n·u / (1 - n·u), u = 2^-24) gives
//!
//!   |got - exact| ≤ γ_D · abs_mag + γ_{H+2} · relu_mag + tiny
//!
//! with `abs_mag = Σ_h |w_h|·|s|·Σ_d |q_d k_d|` and `relu_mag = Σ_h |w_h · relu_term_h|`.
//! Kernels with reduced-precision accumulators (Hopper fp8 MMA) declare a larger dot
//! term. Summation order does not matter: the bound holds for any order, which is why
//! split-KV and tensor-core kernels can be judged by the same rule. A factor of 2 of
//! slack absorbs the second-order terms; real bugs are orders of magnitude larger.

use crate::case::Shape;
use crate::kernel::Accumulation;

const U: f64 = 1.0 / 16_777_216.0; // 2^-24

fn gamma(n: usize) -> f64 {
    let nu = n as f64 * U;
    nu / (1.0 - nu)
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ErrorBound {
    /// Multiplies `abs_mag`.
    pub dot_rel: f64,
    /// Multiplies `relu_mag`.
    pub head_rel: f64,
    /// Absolute floor (f32 subnormal flushing).
    pub abs: f64,
}

impl ErrorBound {
    pub fn for_kernel(acc: Accumulation, shape: &Shape) -> Self {
        let dot_rel = match acc {
            Accumulation::F32 => gamma(shape.head_dim),
            Accumulation::Reduced { rel } => rel + gamma(shape.head_dim),
        };
        ErrorBound {
            dot_rel: 2.0 * dot_rel,
            head_rel: 2.0 * gamma(shape.heads + 2),
            abs: (shape.heads as f64 + 2.0) * f32::MIN_POSITIVE as f64,
        }
    }

    /// A lower bound of [`full`](Self::full) that needs no extra work: `abs_mag ≥
    /// relu_mag` always, so an error within this is within the bound.
    #[inline]
    pub fn lower(&self, relu_mag: f64) -> f64 {
        (self.dot_rel + self.head_rel) * relu_mag + self.abs
    }

    #[inline]
    pub fn full(&self, relu_mag: f64, abs_mag: f64) -> f64 {
        self.dot_rel * abs_mag + self.head_rel * relu_mag + self.abs
    }
}
