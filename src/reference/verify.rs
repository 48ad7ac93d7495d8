//! How much of a case to check against the reference (`--verify`).
//!
//! The reference is the cost of a CPU-only campaign. Sampling spends it where kernels
//! break: every *boundary* position (block edges, 256-token chunk edges, the ends of
//! V(r)) of every row is always checked, because tail, mask and split bugs live there;
//! `sample:<f>` adds a deterministic fraction `f` of whole rows on top.

use super::{PositionSet, Reference, RowSelection};
use crate::case::Case;
use rand::RngExt;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// The chunk of the production kernels' stores and split-KV (DeepGEMM's 256-token
/// split, AITER's `ChunkK=256`).
pub const CHUNK_EDGE: usize = 256;

/// Which elements of V(r) the oracle compares.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum VerifyMode {
    /// Every element of every row.
    #[default]
    Full,
    /// Whole rows with probability `fraction` each, plus every boundary position.
    Sample(f64),
    /// Only boundary positions (block and chunk edges ±1, first, last valid ±1).
    Boundaries,
}

impl fmt::Display for VerifyMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerifyMode::Full => f.write_str("full"),
            VerifyMode::Sample(x) => write!(f, "sample:{x}"),
            VerifyMode::Boundaries => f.write_str("boundaries"),
        }
    }
}

impl FromStr for VerifyMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "full" => Ok(VerifyMode::Full),
            "boundaries" => Ok(VerifyMode::Boundaries),
            _ => {
                let Some(x) = s.strip_prefix("sample:") else {
                    return Err(format!(
                        "`{s}`: expected full, boundaries or sample:<fraction in [0, 1]>"
                    ));
                };
                match x.parse::<f64>() {
                    Ok(f) if (0.0..=1.0).contains(&f) => Ok(VerifyMode::Sample(f)),
                    _ => Err(format!(
                        "`{s}`: the fraction of sample:<fraction> must be a number in [0, 1]"
                    )),
                }
            }
        }
    }
}

impl VerifyMode {
    /// The rows and positions to compute and check for `case`. `seed` picks the sampled
    /// rows (use the case's seed: the same case is then checked the same way).
    pub fn selection(&self, case: &Case, seed: u64) -> RowSelection {
        let fraction = match *self {
            VerifyMode::Full => return RowSelection::All,
            VerifyMode::Sample(f) => f,
            VerifyMode::Boundaries => 0.0,
        };
        let mut map = BTreeMap::new();
        for r in 0..case.rows() {
            let len = case.valid_len(r);
            if len == 0 {
                continue;
            }
            let set = if fraction > 0.0 && unit_hash(seed, r as u64) < fraction {
                PositionSet::All
            } else {
                PositionSet::Some(boundary_positions(len, case.shape.block_size))
            };
            map.insert(r, set);
        }
        RowSelection::Positions(map)
    }
}

/// Boundary positions of a row with `len` valid positions, sorted: every block edge
/// (multiples of `block_size`) and 256-chunk edge ±1, the first position, and the last
/// valid one ±1 (those inside V(r)).
pub fn boundary_positions(len: usize, block_size: usize) -> Vec<usize> {
    let mut p = Vec::new();
    let mut edges = |step: usize| {
        for e in (step..=len).step_by(step.max(1)) {
            p.extend([e - 1, e, e + 1]);
        }
    };
    edges(block_size.max(1));
    edges(CHUNK_EDGE);
    p.push(0);
    p.push(1);
    if len > 0 {
        p.extend([len.saturating_sub(2), len - 1, len]);
    }
    p.retain(|&t| t < len);
    p.sort_unstable();
    p.dedup();
    p
}

/// The positions of row `r` the CPU re-checks of a reference or a judgement computed
/// elsewhere (the GPU): both context edges (`0, 1, len-2, len-1`) always; for `full` rows
/// also the block, 64-token tile and 256-token chunk edges (`e-1, e`), at most
/// `max_edges` of each kind, evenly spread, and `random` random positions. Sorted, unique,
/// inside V(r).
pub fn check_positions(
    case: &Case,
    r: usize,
    full: bool,
    random: usize,
    max_edges: usize,
    rng: &mut impl rand::Rng,
) -> Vec<usize> {
    let len = case.valid_len(r);
    if len == 0 {
        return Vec::new();
    }
    let mut v = vec![0, 1, len.saturating_sub(2), len - 1];
    if full {
        for step in [case.shape.block_size.max(1), 64, CHUNK_EDGE] {
            let edges = (len - 1) / step;
            let every = edges.div_ceil(max_edges.max(1)).max(1);
            for k in (1..=edges).step_by(every) {
                v.extend([k * step - 1, k * step]);
            }
        }
        for _ in 0..random {
            v.push(rng.random_range(0..len));
        }
    }
    v.retain(|&t| t < len);
    v.sort_unstable();
    v.dedup();
    v
}

/// The fraction of V(r) elements, over all rows, that `reference` holds (1 when the
/// case has no valid element).
pub fn fraction_checked(case: &Case, reference: &Reference) -> f64 {
    let total = case.valid_elements();
    if total == 0 {
        return 1.0;
    }
    let have: u64 = reference
        .rows
        .iter()
        .enumerate()
        .filter_map(|(r, row)| row.as_ref().map(|row| (r, row)))
        .map(|(r, row)| {
            let len = case.valid_len(r);
            match &row.positions {
                None => len as u64,
                Some(p) => p.iter().filter(|&&t| t < len).count() as u64,
            }
        })
        .sum();
    have as f64 / total as f64
}

/// A deterministic uniform number in [0, 1) from (seed, index) (SplitMix64).
fn unit_hash(seed: u64, i: u64) -> f64 {
    let mut z = seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}
