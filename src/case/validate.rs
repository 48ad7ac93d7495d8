//! Preconditions of the operation. Every violation names the field, the value and the
//! limit, so a hand-edited or foreign corpus file fails with one readable line.

use super::{Case, ContextLens, ValueLayout};

/// A violated precondition: `field` is a JSON-path-like name (`context_lens[3]`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct CaseError {
    pub field: String,
    pub message: String,
}

pub(crate) fn err(field: impl Into<String>, message: impl Into<String>) -> CaseError {
    CaseError {
        field: field.into(),
        message: message.into(),
    }
}

/// Largest next_n the model accepts (1 + up to 7 speculative tokens).
pub const MAX_NEXT_N: usize = 8;
/// Limits that keep a hostile file from making us allocate absurd memory before we
/// notice it is absurd. They are far above anything the libraries accept.
pub const MAX_HEADS: usize = 1024;
pub const MAX_HEAD_DIM: usize = 4096;
pub const MAX_BLOCK_SIZE: usize = 65536;
pub const MAX_ROWS: usize = 1 << 20;
pub const MAX_MODEL_LEN: usize = 1 << 24;
/// Largest host output buffer a case may ask for (rows * row_stride * 4 bytes).
pub const MAX_OUTPUT_BYTES: u64 = 8 << 30;

impl Case {
    /// Checks every precondition of DESIGN §1. A case that passes can be run by any
    /// kernel whose capabilities admit it, and by the reference.
    pub fn validate(&self) -> Result<(), CaseError> {
        validate_shape_dims(self)?;
        validate_tensor_sizes(self)?;
        validate_lengths(self)?;
        validate_table_and_cache(self)?;
        Ok(())
    }
}

fn range(field: &str, v: usize, lo: usize, hi: usize) -> Result<(), CaseError> {
    if v < lo || v > hi {
        return Err(err(field, format!("{v} is outside {lo}..={hi}")));
    }
    Ok(())
}

/// Dimension checks that need no tensor data: run before anything is allocated from
/// the dimensions of an untrusted file.
pub(crate) fn validate_shape_dims(c: &Case) -> Result<(), CaseError> {
    let s = &c.shape;
    range("batch", s.batch, 1, MAX_ROWS)?;
    range("next_n", s.next_n, 1, MAX_NEXT_N)?;
    range("rows (batch*next_n)", s.rows(), 1, MAX_ROWS)?;
    range("heads", s.heads, 1, MAX_HEADS)?;
    range("head_dim", s.head_dim, 16, MAX_HEAD_DIM)?;
    if !s.head_dim.is_multiple_of(16) {
        return Err(err(
            "head_dim",
            format!("{} is not a multiple of 16", s.head_dim),
        ));
    }
    range("block_size", s.block_size, 1, MAX_BLOCK_SIZE)?;
    if s.layout == ValueLayout::Shuffle16 {
        if !s.block_size.is_multiple_of(16) {
            return Err(err(
                "block_size",
                format!(
                    "{} must be a multiple of 16 for layout shuffle16",
                    s.block_size
                ),
            ));
        }
        if !s.head_dim.is_multiple_of(32) {
            return Err(err(
                "head_dim",
                format!(
                    "{} must be a multiple of 32 for layout shuffle16",
                    s.head_dim
                ),
            ));
        }
    }
    range("max_model_len", c.max_model_len, 1, MAX_MODEL_LEN)?;
    if c.out_row_stride < c.max_model_len {
        return Err(err(
            "out_row_stride",
            format!(
                "{} is less than max_model_len {}",
                c.out_row_stride, c.max_model_len
            ),
        ));
    }
    if c.output_bytes() > MAX_OUTPUT_BYTES {
        return Err(err(
            "out_row_stride",
            format!(
                "output of {} rows x {} floats is {} bytes, above the limit {}",
                s.rows(),
                c.out_row_stride,
                c.output_bytes(),
                MAX_OUTPUT_BYTES
            ),
        ));
    }
    Ok(())
}

fn validate_tensor_sizes(c: &Case) -> Result<(), CaseError> {
    let s = &c.shape;
    let q_len = s.rows() * s.heads * s.head_dim;
    if c.q.len() != q_len {
        return Err(err(
            "q",
            format!("has {} codes, shape needs {q_len}", c.q.len()),
        ));
    }
    let w_len = s.rows() * s.heads;
    if c.weights.len() != w_len {
        return Err(err(
            "weights",
            format!("has {} values, shape needs {w_len}", c.weights.len()),
        ));
    }
    let need = s.block_bytes() as u64;
    if c.kv_block_stride < need {
        return Err(err(
            "kv_block_stride",
            format!(
                "{} is less than block_size*(head_dim+4) = {need}",
                c.kv_block_stride
            ),
        ));
    }
    if !c.kv_block_stride.is_multiple_of(4) {
        return Err(err(
            "kv_block_stride",
            format!("{} is not a multiple of 4", c.kv_block_stride),
        ));
    }
    if c.num_blocks == 0 {
        return Err(err("num_blocks", "must be at least 1"));
    }
    if c.num_blocks.checked_mul(c.kv_block_stride).is_none() {
        return Err(err(
            "num_blocks",
            format!(
                "{} * kv_block_stride {} overflows 64 bits",
                c.num_blocks, c.kv_block_stride
            ),
        ));
    }
    if c.num_blocks > i32::MAX as u64 + 1 {
        return Err(err(
            "num_blocks",
            format!(
                "{} exceeds what an int32 block table can address (2^31)",
                c.num_blocks
            ),
        ));
    }
    Ok(())
}

fn validate_lengths(c: &Case) -> Result<(), CaseError> {
    let s = &c.shape;
    let mml = c.max_model_len as i64;
    match &c.context_lens {
        ContextLens::PerSequence(v) => {
            if v.len() != s.batch {
                return Err(err(
                    "context_lens",
                    format!("has {} entries, batch is {}", v.len(), s.batch),
                ));
            }
            for (b, &x) in v.iter().enumerate() {
                if x < 0 || x > mml {
                    return Err(err(
                        format!("context_lens[{b}]"),
                        format!("{x} is outside 0..=max_model_len ({mml})"),
                    ));
                }
            }
        }
        ContextLens::PerToken(v) => {
            if v.len() != s.batch {
                return Err(err(
                    "context_lens",
                    format!("has {} rows, batch is {}", v.len(), s.batch),
                ));
            }
            for (b, row) in v.iter().enumerate() {
                if row.len() != s.next_n {
                    return Err(err(
                        format!("context_lens[{b}]"),
                        format!("has {} entries, next_n is {}", row.len(), s.next_n),
                    ));
                }
                for (i, &x) in row.iter().enumerate() {
                    if x < 0 || x > mml {
                        return Err(err(
                            format!("context_lens[{b}][{i}]"),
                            format!("{x} is outside 0..=max_model_len ({mml})"),
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

fn validate_table_and_cache(c: &Case) -> Result<(), CaseError> {
    let s = &c.shape;
    let t = &c.block_table;
    if t.row_stride < t.max_blocks {
        return Err(err(
            "block_table.row_stride",
            format!("{} is less than max_blocks {}", t.row_stride, t.max_blocks),
        ));
    }
    // A compact table (a worker's, [`crate::case::BlockTable::compact`]) holds each
    // row's first entries; every used block must be among them.
    if let Some(starts) = &t.row_starts {
        if starts.len() != s.batch + 1 || starts.last() != Some(&t.entries.len()) {
            return Err(err(
                "block_table_held",
                format!(
                    "counts {} rows holding {} entries, the case has {} rows and {} entries",
                    starts.len().saturating_sub(1),
                    starts.last().copied().unwrap_or(0),
                    s.batch,
                    t.entries.len()
                ),
            ));
        }
    } else if s.batch.checked_mul(t.row_stride) != Some(t.entries.len()) {
        return Err(err(
            "block_table.entries",
            format!(
                "has {} entries, batch {} x row_stride {} needs {}",
                t.entries.len(),
                s.batch,
                t.row_stride,
                s.batch.saturating_mul(t.row_stride)
            ),
        ));
    }
    for b in 0..s.batch {
        let used = c.blocks_used(b);
        if used > t.max_blocks {
            return Err(err(
                format!("context_lens[{b}]"),
                format!(
                    "{} tokens need {used} blocks of {}, block_table.max_blocks is {}",
                    c.seq_tokens(b),
                    s.block_size,
                    t.max_blocks
                ),
            ));
        }
        if used > t.held_by(b) {
            return Err(err(
                format!("block_table_held[{b}]"),
                format!(
                    "{} entries are held, the row uses {used} blocks",
                    t.held_by(b)
                ),
            ));
        }
        for j in 0..used {
            let id = t.get(b, j);
            if id < 0 || id as u64 >= c.num_blocks {
                return Err(err(
                    format!("block_table.entries[{b}][{j}]"),
                    format!("block id {id} is outside 0..num_blocks ({})", c.num_blocks),
                ));
            }
            if !c.kv.contains(id as u64) {
                return Err(err(
                    format!("block_table.entries[{b}][{j}]"),
                    format!("block {id} is referenced but not stored in kv_blocks"),
                ));
            }
        }
    }
    let bb = s.block_bytes();
    if let Some(id) = c.kv.max_id().filter(|&id| id >= c.num_blocks) {
        return Err(err(
            "kv_block_ids",
            format!(
                "stored block {id} is outside 0..num_blocks ({})",
                c.num_blocks
            ),
        ));
    }
    // A drawn cache's blocks are made at the right size; only stored ones are checked
    // (without drawing a drawn cache's hundreds of MB here).
    for (id, bytes) in c.kv.stored_blocks().into_iter().flatten() {
        if bytes.len() != bb {
            return Err(err(
                format!("kv_blocks[{id}]"),
                format!("has {} bytes, block_size*(head_dim+4) is {bb}", bytes.len()),
            ));
        }
    }
    Ok(())
}
