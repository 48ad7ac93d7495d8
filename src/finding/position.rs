//! Where a finding's first offending position sits: the edge of a block, of a 256-token
//! chunk, of the context, the last valid position, or past the valid range. Reported
//! with each finding (`report.json`'s `position`), next to the trigger: a bug at every
//! block edge and a bug at the last valid position are different bugs to a kernel
//! engineer even when their triggers match.

use crate::case::Case;
use crate::oracle::Verdict;

/// Tokens per chunk of the production kernels (DeepGEMM's split, AITER's ChunkK).
const CHUNK: usize = 256;

/// Tags of the first offender of the verdict that has a row and a position.
pub fn first_offender_position(case: &Case, v: &Verdict) -> Vec<String> {
    let Some((row, pos)) = v.examples.iter().find_map(|e| Some((e.row?, e.pos?))) else {
        return Vec::new();
    };
    if row >= case.rows() {
        return Vec::new();
    }
    let len = case.valid_len(row);
    let bs = case.shape.block_size.max(1);
    let mut tags = Vec::new();
    if pos >= len {
        tags.push("past-valid-range");
    } else if pos + 1 == len {
        tags.push("last-valid-position");
    }
    if pos == 0 {
        tags.push("context-start");
    }
    if pos % bs == 0 || pos % bs == bs - 1 {
        tags.push("block-edge");
    }
    if pos % CHUNK == 0 || pos % CHUNK == CHUNK - 1 {
        tags.push("chunk-edge");
    }
    if tags.is_empty() {
        tags.push("interior");
    }
    tags.into_iter().map(String::from).collect()
}
