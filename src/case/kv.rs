//! The host copy of the KV cache: only the blocks the table references, keyed by
//! physical id. A block's bytes are either stored (a case read from a file, a hostile
//! draw, an edited test case) or **drawn on first use** from the case's value recipe
//! ([`DrawnValues`]): a generated case of an engine-sized pool holds hundreds of MB of
//! keys that a device worker generates itself (`kernels/generate.cu`) and the host only
//! ever needs a few blocks of (the CPU re-check of a device verdict). Either way every
//! reader sees the same bytes: a drawn block is a pure function of the recipe and the
//! block's index in the draw.

use super::ValueKind;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

/// The recipe of a drawn cache's values: what a worker needs to draw the same bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DrawnValues {
    /// The value seed (the generator's key; see `generate::philox`).
    pub seed: u64,
    pub kind: ValueKind,
}

/// Ids up to which a drawn cache keeps a membership bitmap (8 MiB at most).
const BITMAP_MAX_ID: u64 = 1 << 26;

/// `(id, l)` for the ids in draw order, sorted by id, one per id (the last index `l` of
/// an id that repeats). An engine's pool hands out ids below a few times their count:
/// a slot per id up to the largest then beats sorting (millions of ids at block size 1).
fn by_id_unique(ids: &[u64]) -> Vec<(u64, u32)> {
    let max = ids.iter().copied().max().unwrap_or(0);
    if max < BITMAP_MAX_ID && max <= 4 * ids.len() as u64 + (1 << 20) {
        let mut slot = vec![u32::MAX; max as usize + 1];
        for (l, &id) in ids.iter().enumerate() {
            slot[id as usize] = l as u32;
        }
        return slot
            .iter()
            .enumerate()
            .filter(|&(_, &l)| l != u32::MAX)
            .map(|(id, &l)| (id as u64, l))
            .collect();
    }
    let mut by_id: Vec<(u64, u32)> = ids
        .iter()
        .enumerate()
        .map(|(l, &id)| (id, l as u32))
        .collect();
    // Sorted by id, then index: the last index of each id is kept.
    by_id.par_sort_unstable();
    let mut unique: Vec<(u64, u32)> = Vec::with_capacity(by_id.len());
    for p in by_id {
        match unique.last_mut() {
            Some(last) if last.0 == p.0 => *last = p,
            _ => unique.push(p),
        }
    }
    unique
}

/// Draws block `index` of a drawn cache (implemented by the value generator).
pub trait BlockDrawer: Send + Sync {
    fn draw(&self, index: usize) -> Vec<u8>;
}

/// A drawn cache: physical ids in draw order, the blocks drawn once each on first use.
struct Drawn {
    values: DrawnValues,
    /// Physical id of draw index `l`.
    ids: Vec<u64>,
    /// `(id, l)` sorted by id, one per id (where an id repeats in `ids`, the last index
    /// wins, as successive inserts into a map would).
    by_id: Vec<(u64, u32)>,
    /// One bit per id up to the largest (when that is at most [`BITMAP_MAX_ID`]): a
    /// validation of an engine-sized table asks millions of times.
    present: Option<Vec<u64>>,
    /// Drawn blocks, [`CELL_CHUNK`] to a chunk, each chunk made on first use: a device
    /// worker's case of millions of blocks reads a handful of them, if any.
    cells: Vec<OnceLock<Box<[Cell]>>>,
    drawer: Box<dyn BlockDrawer>,
}

type Cell = OnceLock<Box<[u8]>>;

/// Blocks per chunk of [`Drawn::cells`].
const CELL_CHUNK: usize = 1024;

impl Drawn {
    fn cell(&self, l: usize) -> &Cell {
        let chunk = self.cells[l / CELL_CHUNK]
            .get_or_init(|| (0..CELL_CHUNK).map(|_| OnceLock::new()).collect());
        &chunk[l % CELL_CHUNK]
    }

    fn block(&self, l: usize) -> &[u8] {
        self.cell(l)
            .get_or_init(|| self.drawer.draw(l).into_boxed_slice())
    }

    fn is_drawn(&self, l: usize) -> bool {
        self.cells[l / CELL_CHUNK]
            .get()
            .is_some_and(|c| c[l % CELL_CHUNK].get().is_some())
    }

    fn contains(&self, id: u64) -> bool {
        match &self.present {
            Some(bits) => bits
                .get((id / 64) as usize)
                .is_some_and(|w| w >> (id % 64) & 1 == 1),
            None => self.index_of(id).is_some(),
        }
    }

    fn index_of(&self, id: u64) -> Option<usize> {
        self.by_id
            .binary_search_by_key(&id, |&(i, _)| i)
            .ok()
            .map(|k| self.by_id[k].1 as usize)
    }
}

/// The referenced blocks of a case's KV cache. Each block holds exactly
/// `Shape::block_bytes()` bytes (stride padding is not stored).
#[derive(Clone, Default)]
pub struct SparseKvCache {
    stored: BTreeMap<u64, Vec<u8>>,
    /// Set for a drawn cache (then `stored` is empty).
    drawn: Option<Arc<Drawn>>,
}

impl SparseKvCache {
    /// A cache of stored blocks.
    pub fn stored(blocks: BTreeMap<u64, Vec<u8>>) -> SparseKvCache {
        SparseKvCache {
            stored: blocks,
            drawn: None,
        }
    }

    /// A cache whose block `l` (physical id `ids[l]`) is `drawer.draw(l)`, drawn on
    /// first use.
    pub fn drawn(
        values: DrawnValues,
        ids: Vec<u64>,
        drawer: Box<dyn BlockDrawer>,
    ) -> SparseKvCache {
        let unique = by_id_unique(&ids);
        let present = unique
            .last()
            .filter(|&&(max, _)| max < BITMAP_MAX_ID)
            .map(|&(max, _)| {
                let mut bits = vec![0u64; (max / 64 + 1) as usize];
                for &(id, _) in &unique {
                    bits[(id / 64) as usize] |= 1 << (id % 64);
                }
                bits
            });
        let cells = (0..ids.len().div_ceil(CELL_CHUNK))
            .map(|_| OnceLock::new())
            .collect();
        SparseKvCache {
            stored: BTreeMap::new(),
            drawn: Some(Arc::new(Drawn {
                values,
                ids,
                by_id: unique,
                present,
                cells,
                drawer,
            })),
        }
    }

    /// The recipe and the physical ids in draw order, for a drawn cache.
    pub fn drawn_values(&self) -> Option<(DrawnValues, &[u64])> {
        self.drawn.as_ref().map(|d| (d.values, d.ids.as_slice()))
    }

    /// The blocks that exist, as `(id, draw index)` sorted by id (a drawn cache).
    pub fn drawn_unique(&self) -> Option<&[(u64, u32)]> {
        self.drawn.as_ref().map(|d| d.by_id.as_slice())
    }

    /// The stored blocks (`None` for a drawn cache, whose blocks are made, not kept).
    pub fn stored_blocks(&self) -> Option<&BTreeMap<u64, Vec<u8>>> {
        self.drawn.is_none().then_some(&self.stored)
    }

    /// The bytes of block `id`, drawn now if they were not yet.
    pub fn get(&self, id: u64) -> Option<&[u8]> {
        match &self.drawn {
            None => self.stored.get(&id).map(Vec::as_slice),
            Some(d) => d.index_of(id).map(|l| d.block(l)),
        }
    }

    pub fn contains(&self, id: u64) -> bool {
        match &self.drawn {
            None => self.stored.contains_key(&id),
            Some(d) => d.contains(id),
        }
    }

    /// Blocks stored or drawable.
    pub fn len(&self) -> usize {
        match &self.drawn {
            None => self.stored.len(),
            Some(d) => d.by_id.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Block ids, ascending.
    pub fn ids(&self) -> Vec<u64> {
        match &self.drawn {
            None => self.stored.keys().copied().collect(),
            Some(d) => d.by_id.iter().map(|&(id, _)| id).collect(),
        }
    }

    /// The highest block id.
    pub fn max_id(&self) -> Option<u64> {
        match &self.drawn {
            None => self.stored.keys().next_back().copied(),
            Some(d) => d.by_id.last().map(|&(id, _)| id),
        }
    }

    /// Every block, ascending by id (a drawn cache is drawn in full first, on every core).
    pub fn iter(&self) -> impl Iterator<Item = (u64, &[u8])> + '_ {
        self.materialize();
        let stored = self.stored.iter().map(|(&id, b)| (id, b.as_slice()));
        let drawn = self.drawn.iter().flat_map(|d| {
            d.by_id
                .iter()
                .map(move |&(id, l)| (id, d.block(l as usize)))
        });
        stored.chain(drawn)
    }

    /// Draws every block not drawn yet, on every core (no-op for stored blocks).
    pub fn materialize(&self) {
        if let Some(d) = &self.drawn {
            d.by_id.par_iter().for_each(|&(_, l)| {
                d.block(l as usize);
            });
        }
    }

    /// Whether every block's bytes are in host memory.
    pub fn is_materialized(&self) -> bool {
        self.drawn
            .as_ref()
            .is_none_or(|d| d.by_id.iter().all(|&(_, l)| d.is_drawn(l as usize)))
    }

    /// Turns a drawn cache into stored blocks (to edit it).
    fn make_stored(&mut self) {
        if self.drawn.is_some() {
            let blocks: BTreeMap<u64, Vec<u8>> =
                self.iter().map(|(id, b)| (id, b.to_vec())).collect();
            self.drawn = None;
            self.stored = blocks;
        }
    }

    /// Stores `bytes` as block `id`; the previous bytes, if any.
    pub fn insert(&mut self, id: u64, bytes: Vec<u8>) -> Option<Vec<u8>> {
        self.make_stored();
        self.stored.insert(id, bytes)
    }

    pub fn get_mut(&mut self, id: u64) -> Option<&mut Vec<u8>> {
        self.make_stored();
        self.stored.get_mut(&id)
    }

    pub fn remove(&mut self, id: u64) -> Option<Vec<u8>> {
        self.make_stored();
        self.stored.remove(&id)
    }

    /// Every block, mutable (the cache becomes stored).
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut Vec<u8>> {
        self.make_stored();
        self.stored.values_mut()
    }
}

impl PartialEq for SparseKvCache {
    /// The same blocks with the same bytes, however they are held.
    fn eq(&self, other: &Self) -> bool {
        if let (Some(a), Some(b)) = (&self.drawn, &other.drawn) {
            if Arc::ptr_eq(a, b) || (a.values == b.values && a.ids == b.ids) {
                return true;
            }
        }
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for SparseKvCache {}

impl std::fmt::Debug for SparseKvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.drawn {
            None => f
                .debug_struct("SparseKvCache")
                .field("stored", &self.stored)
                .finish(),
            Some(d) => f
                .debug_struct("SparseKvCache")
                .field("drawn", &d.values)
                .field("blocks", &d.by_id.len())
                .finish(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fill;
    impl BlockDrawer for Fill {
        fn draw(&self, l: usize) -> Vec<u8> {
            vec![l as u8; 4]
        }
    }

    fn values() -> DrawnValues {
        DrawnValues {
            seed: 1,
            kind: ValueKind::Pipeline,
        }
    }

    /// The slot index (ids dense enough) and the sort (sparse ids) give the same list:
    /// sorted, one per id, the last draw index of a repeated id.
    #[test]
    fn ids_index_the_same_by_slot_and_by_sort() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for spread in [50u64, 5_000, 1 << 40] {
            let ids: Vec<u64> = (0..2_000).map(|_| next() % spread).collect();
            let mut want: std::collections::BTreeMap<u64, u32> = Default::default();
            for (l, &id) in ids.iter().enumerate() {
                want.insert(id, l as u32);
            }
            let want: Vec<(u64, u32)> = want.into_iter().collect();
            assert_eq!(by_id_unique(&ids), want, "ids below {spread}");
        }
        assert!(by_id_unique(&[]).is_empty());
    }

    #[test]
    fn a_drawn_cache_reads_like_the_stored_one() {
        // Id 9 appears twice: the later draw index wins, as map inserts would.
        let d = SparseKvCache::drawn(values(), vec![9, 3, 7, 9], Box::new(Fill));
        let mut s = BTreeMap::new();
        for (l, id) in [9u64, 3, 7, 9].into_iter().enumerate() {
            s.insert(id, vec![l as u8; 4]);
        }
        let s = SparseKvCache::stored(s);
        assert_eq!(d.len(), 3);
        assert_eq!(d.ids(), vec![3, 7, 9]);
        assert_eq!(d.max_id(), Some(9));
        assert_eq!(d.get(9), Some(&[3u8; 4][..]));
        assert!(d.get(4).is_none() && !d.contains(4) && d.contains(3));
        assert!(!d.is_materialized());
        assert_eq!(d, s);
        assert!(d.is_materialized());
        let mut e = d.clone();
        e.get_mut(3).unwrap()[0] = 99;
        assert_ne!(e, s);
        assert!(e.drawn_values().is_none());
        assert_eq!(d.drawn_values().unwrap().1, &[9, 3, 7, 9]);
    }
}
