//! What of a case travels to a worker, in what types and where: the wire's integer
//! tensors ([`WireInts`]: keys as their recipe, a block table as its held entries and
//! padding rule for workers that draw them, [`WorkerDraws`]), the tensor list
//! ([`wire_tensors`]) and a version-2 region's layout ([`region_layout`]). The messages
//! themselves are [`super::protocol`]'s.

use super::safetensors_stream::{self as st, Data};
use super::shm::ShmTensors;
use crate::case::{Case, ContextLens, DrawnValues, TableTail, TailRule};
use crate::kernel::OutputBuffer;

/// What a worker makes from a recipe instead of receiving it (its hello's
/// `draws_values` and `draws_table_tails`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerDraws {
    /// A drawn cache's keys: only their ids and value recipe travel.
    pub values: bool,
    /// A generated block table's padding: only each row's used entries and the padding
    /// rule travel.
    pub table_tails: bool,
}

impl WorkerDraws {
    /// A built-in worker's: both.
    pub const ALL: WorkerDraws = WorkerDraws {
        values: true,
        table_tails: true,
    };
    /// A third-party worker's: neither.
    pub const NONE: WorkerDraws = WorkerDraws {
        values: false,
        table_tails: false,
    };
}

/// The integer tensors of a case in their wire types where the case keeps i64/u64 (the
/// block table is int32 in both).
pub struct WireInts {
    lens: Vec<i32>,
    lens_shape: Vec<usize>,
    ids: Vec<i64>,
    /// The keys travel as their recipe: `ids` in draw order, no `kv_blocks` tensor.
    drawn: Option<DrawnValues>,
    /// The table travels as each row's held entries (back to back), with their counts
    /// and the rule of the rest.
    tail: Option<(TailRule, Vec<i32>)>,
    /// The table's entries as they travel, where they are not the case's own: a whole
    /// table's held entries (with `tail`), or a compact one made whole (without).
    table: Option<Vec<i32>>,
}

impl WireInts {
    /// The stored blocks' ids, ascending (their bytes follow in `kv_blocks`).
    pub fn new(case: &Case) -> WireInts {
        Self::with(case, WorkerDraws::NONE)
    }

    /// For a worker that draws values: a drawn cache travels as its recipe and its ids
    /// in draw order; a stored one as [`Self::new`]. For one that draws table tails, a
    /// generated table travels as each row's used entries and the padding rule
    /// ([`table_tail_sent`]).
    pub fn with(case: &Case, draws: WorkerDraws) -> WireInts {
        let worker_draws = draws.values;
        let s = &case.shape;
        let t = &case.block_table;
        let sent = table_tail_sent(case, draws);
        let (lens, lens_shape) = match &case.context_lens {
            ContextLens::PerSequence(v) => (v.iter().map(|&x| x as i32).collect(), vec![s.batch]),
            ContextLens::PerToken(v) => (
                v.iter().flatten().map(|&x| x as i32).collect(),
                vec![s.batch, s.next_n],
            ),
        };
        WireInts {
            lens,
            lens_shape,
            ids: match case.kv.drawn_values().filter(|_| worker_draws) {
                Some((_, ids)) => ids.iter().map(|&id| id as i64).collect(),
                None => case.kv.ids().into_iter().map(|id| id as i64).collect(),
            },
            drawn: case
                .kv
                .drawn_values()
                .filter(|_| worker_draws)
                .map(|(v, _)| v),
            tail: sent.map(|t| (t.rule, t.held.iter().map(|&h| h as i32).collect())),
            table: match (sent, t.is_compact()) {
                (Some(_), false) => t.held_entries(),
                (None, true) => Some(t.whole_entries().into_owned()),
                _ => None,
            },
        }
    }

    /// The rule a request's `block_table_tail` carries (`None`: the whole table travels).
    pub fn table_tail(&self) -> Option<TailRule> {
        self.tail.as_ref().map(|(rule, _)| *rule)
    }

    /// The recipe a request's `kv_values` carries (`None`: the blocks travel).
    pub fn drawn(&self) -> Option<DrawnValues> {
        self.drawn
    }
}

/// Every tensor a worker receives, in order: the inputs, the sparse cache's stored
/// blocks and the poisoned, guarded output buffer (PROTOCOL.md's table). Version 1
/// writes them to a file, version 2 into the shared region.
pub fn wire_tensors<'a>(
    case: &'a Case,
    ints: &'a WireInts,
    out: &'a OutputBuffer,
) -> Vec<(&'static str, Vec<usize>, Data<'a>)> {
    let (raw, _) = out.raw();
    let mut v = wire_inputs(case, ints);
    v.push(("logits", vec![raw.len()], Data::F32(raw)));
    v
}

/// The inputs of [`wire_tensors`] (everything but `logits`).
pub fn wire_inputs<'a>(
    case: &'a Case,
    ints: &'a WireInts,
) -> Vec<(&'static str, Vec<usize>, Data<'a>)> {
    let s = &case.shape;
    let (lens, lens_shape, ids) = (&ints.lens, &ints.lens_shape, &ints.ids);
    let entries = ints.table.as_deref().unwrap_or(&case.block_table.entries);
    let table_shape = match &ints.tail {
        Some(_) => vec![entries.len()],
        None => vec![s.batch, case.block_table.row_stride],
    };
    let mut v = vec![
        (
            "q",
            vec![s.batch, s.next_n, s.heads, s.head_dim],
            Data::Bytes(&case.q),
        ),
        ("weights", vec![s.rows(), s.heads], Data::F32(&case.weights)),
        ("context_lens", lens_shape.clone(), Data::I32(lens)),
        ("block_table", table_shape, Data::I32(entries)),
        ("kv_block_ids", vec![ids.len()], Data::I64(ids)),
    ];
    if let Some((_, counts)) = &ints.tail {
        v.push(("block_table_held", vec![s.batch], Data::I32(counts)));
    }
    if ints.drawn.is_none() {
        let blocks: Vec<&[u8]> = case.kv.iter().map(|(_, b)| b).collect();
        v.push((
            "kv_blocks",
            vec![ids.len(), s.block_bytes()],
            Data::Pieces(blocks),
        ));
    }
    v
}

/// A version-2 region's layout for `case` (its keys as a recipe when `worker_draws` and
/// the case was drawn, as [`WireInts::with`] sends them): `logits` first, at offset 0 (so
/// that an output buffer can live in the region from its start), then the inputs of
/// [`wire_inputs`], sized from the case's dimensions without converting anything (an
/// engine's block table has tens of millions of entries).
pub fn region_layout(case: &Case, draws: WorkerDraws, path: String) -> ShmTensors {
    let worker_draws = draws.values;
    use st::Dtype::{F32, I32, I64, U8};
    let s = &case.shape;
    let raw = OutputBuffer::raw_len(case.rows(), case.out_row_stride);
    let lens_shape = match &case.context_lens {
        ContextLens::PerSequence(_) => vec![s.batch],
        ContextLens::PerToken(_) => vec![s.batch, s.next_n],
    };
    let lens = lens_shape.iter().product::<usize>();
    let tail = table_tail_sent(case, draws);
    let table_shape = match tail {
        Some(t) => vec![t.held.iter().sum::<usize>()],
        None => vec![s.batch, case.block_table.row_stride],
    };
    let table = table_shape.iter().product::<usize>();
    let drawn = case.kv.drawn_values().filter(|_| worker_draws);
    let ids = drawn.map_or(case.kv.len(), |(_, ids)| ids.len());
    let mut specs = vec![
        ("logits", vec![raw], F32, 4 * raw),
        (
            "q",
            vec![s.batch, s.next_n, s.heads, s.head_dim],
            U8,
            case.q.len(),
        ),
        (
            "weights",
            vec![s.rows(), s.heads],
            F32,
            4 * case.weights.len(),
        ),
        ("context_lens", lens_shape, I32, 4 * lens),
        ("block_table", table_shape, I32, 4 * table),
        ("kv_block_ids", vec![ids], I64, 8 * ids),
    ];
    if tail.is_some() {
        specs.push(("block_table_held", vec![s.batch], I32, 4 * s.batch));
    }
    if drawn.is_none() {
        let bb = s.block_bytes();
        specs.push(("kv_blocks", vec![ids, bb], U8, ids * bb));
    }
    ShmTensors::layout_of(path, &specs)
}

/// The tail of `case`'s table that travels as its rule to a worker that `draws`: a
/// generated table's (`BlockTable::tail`, checked on a sample), to a worker that draws
/// table tails. The region's layout and the tensors written both follow this.
pub fn table_tail_sent(case: &Case, draws: WorkerDraws) -> Option<&TableTail> {
    let t = &case.block_table;
    t.tail
        .as_ref()
        .filter(|_| draws.table_tails && (t.is_compact() || t.tail_holds()))
}
