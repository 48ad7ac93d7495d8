//! The output buffer the harness owns: `rows x row_stride` f32 with guard zones before
//! and after, every element poisoned with a NaN of a distinctive payload before the
//! run. An element still holding exactly that bit pattern afterwards was never written;
//! a guard or row-padding element that changed was written out of bounds.

/// Quiet NaN with payload 0xC0FFEE: no arithmetic produces it (the canonical NaNs are
/// 0x7FC00000 and 0xFFC00000), so surviving bits mean "never written".
pub const POISON_BITS: u32 = 0x7FC0_FFEE;
/// Guard elements on each side of the buffer.
pub const GUARD_ELEMS: usize = 4096;

/// Allocations of at least this many elements (64 MiB) are recycled: an engine-sized
/// workspace (up to 4 GiB) costs its page faults once per campaign instead of once per
/// case, and is poisoned on every core.
const RECYCLE_MIN_ELEMS: usize = 16 << 20;
/// Recycled allocations kept at most (one per concurrent case of a CPU campaign).
const SPARE_MAX: usize = 2;
/// The capacity a recycled allocation is made with, at least (4 GiB, the largest
/// engine workspace the production profile draws). Only address space: a page is
/// backed when first written, so a later, larger case faults in only what it adds,
/// where a fresh allocation of its own size would fault in all of it again (the page
/// faults, not the poisoning, were most of a CPU campaign's output-buffer time).
const RECYCLE_RESERVE_ELEMS: usize = 1 << 30;

static SPARE: std::sync::Mutex<Vec<Vec<f32>>> = std::sync::Mutex::new(Vec::new());

/// `n` poisoned elements, in a recycled allocation where one fits.
fn poisoned(n: usize) -> Vec<f32> {
    use rayon::prelude::*;
    let poison = f32::from_bits(POISON_BITS);
    if n < RECYCLE_MIN_ELEMS {
        return vec![poison; n];
    }
    let spare = {
        let mut s = SPARE.lock().unwrap_or_else(|e| e.into_inner());
        pick_spare(&s, n).map(|i| s.swap_remove(i))
    };
    let mut v = spare.unwrap_or_else(|| reserved(n));
    v.clear();
    v.reserve_exact(n);
    v.spare_capacity_mut()[..n]
        .par_chunks_mut(1 << 20)
        .for_each(|c| {
            c.iter_mut().for_each(|x| {
                x.write(poison);
            })
        });
    // SAFETY: the first `n` elements were initialised just above.
    unsafe { v.set_len(n) };
    v
}

/// A new, empty allocation to recycle, for `n` elements and at least
/// [`RECYCLE_RESERVE_ELEMS`] (the case's own size where the address space is limited,
/// `ulimit -v`).
fn reserved(n: usize) -> Vec<f32> {
    let mut v = Vec::new();
    let _ = v.try_reserve_exact(n.max(RECYCLE_RESERVE_ELEMS));
    v
}

/// The spare allocation `n` elements go into: of those that fit, the one its last case
/// used most of (its pages are backed already), then the smallest.
fn pick_spare(spares: &[Vec<f32>], n: usize) -> Option<usize> {
    (0..spares.len())
        .filter(|&i| spares[i].capacity() >= n)
        .max_by_key(|&i| {
            (
                spares[i].len().min(n),
                std::cmp::Reverse(spares[i].capacity()),
            )
        })
}

/// Memory an output buffer can live in other than a heap allocation of its own: a
/// worker pool's shared region, which the worker writes in place, so that the output
/// never crosses between the processes as a copy.
pub trait OutputStorage: Send + Sync {
    /// The elements (at least the buffer's length; the buffer uses a prefix). Must be
    /// the same memory on every call for as long as the storage lives: the buffer keeps
    /// its address, so an element access is not a dynamic call.
    fn elems(&self) -> &[f32];
    fn elems_mut(&mut self) -> &mut [f32];
    /// For the kernel that made it to recognise its own storage.
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
}

enum Storage {
    Heap(Vec<f32>),
    /// The first `len` elements of the storage, at `ptr` (its `elems_mut()`).
    Shared {
        storage: Box<dyn OutputStorage>,
        ptr: *mut f32,
        len: usize,
    },
}

pub struct OutputBuffer {
    pub rows: usize,
    pub row_stride: usize,
    /// Columns that belong to the output (`max_model_len`).
    pub cols: usize,
    /// `GUARD_ELEMS + rows*row_stride + GUARD_ELEMS` elements.
    data: Storage,
    /// Every element still holds the poison (no `&mut` access since it was poisoned):
    /// a device kernel may then poison its own copy on the device instead of copying
    /// this one over, and a worker need not be sent it.
    pristine: bool,
}

// SAFETY: the raw pointer of a shared buffer points into the storage the buffer owns
// (itself `Send + Sync`), and is only used through `&self` (reads) or `&mut self`.
unsafe impl Send for OutputBuffer {}
unsafe impl Sync for OutputBuffer {}

impl Clone for OutputBuffer {
    /// A copy on the heap (of a shared buffer too).
    fn clone(&self) -> Self {
        OutputBuffer {
            rows: self.rows,
            row_stride: self.row_stride,
            cols: self.cols,
            data: Storage::Heap(self.data().to_vec()),
            pristine: self.pristine,
        }
    }
}

impl std::fmt::Debug for OutputBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputBuffer")
            .field("rows", &self.rows)
            .field("row_stride", &self.row_stride)
            .field("cols", &self.cols)
            .field("shared", &matches!(self.data, Storage::Shared { .. }))
            .field("pristine", &self.pristine)
            .finish()
    }
}

impl OutputBuffer {
    /// A poisoned buffer for `rows x cols` with the given row stride.
    pub fn new(rows: usize, cols: usize, row_stride: usize) -> Self {
        assert!(row_stride >= cols);
        OutputBuffer {
            rows,
            row_stride,
            cols,
            data: Storage::Heap(poisoned(2 * GUARD_ELEMS + rows * row_stride)),
            pristine: true,
        }
    }

    /// Elements a buffer of this shape holds, guards included.
    pub fn raw_len(rows: usize, row_stride: usize) -> usize {
        2 * GUARD_ELEMS + rows * row_stride
    }

    /// A buffer for `rows x cols` in `storage` (which must hold [`Self::raw_len`]
    /// elements), poisoned on every core.
    pub fn in_storage(
        rows: usize,
        cols: usize,
        row_stride: usize,
        storage: Box<dyn OutputStorage>,
    ) -> Self {
        let mut b = Self::over(rows, cols, row_stride, storage, false);
        b.repoison();
        b
    }

    /// A buffer over `storage` as it is (a worker's view of the region the harness
    /// poisoned): `pristine` says whether every element holds the poison.
    pub fn over(
        rows: usize,
        cols: usize,
        row_stride: usize,
        mut storage: Box<dyn OutputStorage>,
        pristine: bool,
    ) -> Self {
        assert!(row_stride >= cols);
        let len = Self::raw_len(rows, row_stride);
        let elems = storage.elems_mut();
        assert!(elems.len() >= len, "output storage too small");
        let ptr = elems.as_mut_ptr();
        OutputBuffer {
            rows,
            row_stride,
            cols,
            data: Storage::Shared { storage, ptr, len },
            pristine,
        }
    }

    /// The storage of a shared buffer (`None` for a heap one). Whoever it is handed to
    /// may write the elements, so the buffer is no longer pristine.
    pub fn shared_storage_mut(&mut self) -> Option<&mut dyn OutputStorage> {
        self.pristine = false;
        match &mut self.data {
            Storage::Heap(_) => None,
            Storage::Shared { storage, .. } => Some(storage.as_mut()),
        }
    }

    fn data(&self) -> &[f32] {
        match &self.data {
            Storage::Heap(v) => v,
            // SAFETY: `ptr` is the storage's own memory of at least `len` elements
            // (checked in `over`), the same for its whole life (the trait's contract),
            // and the storage lives as long as `self`.
            Storage::Shared { ptr, len, .. } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
        }
    }

    fn data_mut(&mut self) -> &mut [f32] {
        match &mut self.data {
            Storage::Heap(v) => v,
            // SAFETY: as in `data`, through `&mut self`.
            Storage::Shared { ptr, len, .. } => unsafe {
                std::slice::from_raw_parts_mut(*ptr, *len)
            },
        }
    }

    pub fn for_case(case: &crate::case::Case) -> Self {
        Self::new(case.rows(), case.max_model_len, case.out_row_stride)
    }

    /// Whether every element still holds the poison: nothing has had `&mut` access
    /// since the buffer was made or [`Self::repoison`]ed.
    pub fn is_pristine(&self) -> bool {
        self.pristine
    }

    /// Re-poisons every element (to reuse the allocation).
    pub fn repoison(&mut self) {
        use rayon::prelude::*;
        let poison = f32::from_bits(POISON_BITS);
        self.data_mut()
            .par_chunks_mut(1 << 20)
            .for_each(|c| c.fill(poison));
        self.pristine = true;
    }

    #[inline]
    pub fn get(&self, r: usize, t: usize) -> f32 {
        self.data()[GUARD_ELEMS + r * self.row_stride + t]
    }

    #[inline]
    pub fn set(&mut self, r: usize, t: usize, v: f32) {
        debug_assert!(t < self.row_stride);
        self.pristine = false;
        let at = GUARD_ELEMS + r * self.row_stride + t;
        self.data_mut()[at] = v;
    }

    /// Row `r`, columns `0..cols`.
    pub fn row(&self, r: usize) -> &[f32] {
        let o = GUARD_ELEMS + r * self.row_stride;
        &self.data()[o..o + self.cols]
    }

    /// The interior `rows*row_stride` elements, row-major (what a device copy fills).
    pub fn interior(&self) -> &[f32] {
        &self.data()[GUARD_ELEMS..GUARD_ELEMS + self.rows * self.row_stride]
    }

    pub fn interior_mut(&mut self) -> &mut [f32] {
        self.pristine = false;
        let n = self.rows * self.row_stride;
        &mut self.data_mut()[GUARD_ELEMS..GUARD_ELEMS + n]
    }

    /// Rows as disjoint mutable slices of `row_stride` (for parallel kernels).
    pub fn rows_mut(&mut self) -> std::slice::ChunksExactMut<'_, f32> {
        let rs = self.row_stride.max(1);
        self.interior_mut().chunks_exact_mut(rs)
    }

    /// The whole allocation including guards, and the index of element (0, 0) in it.
    /// Only for kernels that model out-of-bounds writes (planted bugs, devices).
    pub fn raw_mut(&mut self) -> (&mut [f32], usize) {
        self.pristine = false;
        (self.data_mut(), GUARD_ELEMS)
    }

    pub fn raw(&self) -> (&[f32], usize) {
        (self.data(), GUARD_ELEMS)
    }

    /// Indices (into the raw allocation) of elements outside `[r][0..cols)` (guards and
    /// row padding) whose bits changed.
    pub fn out_of_bounds_writes(&self) -> Vec<usize> {
        let data = self.data();
        let n = data.len();
        let mut v = Vec::new();
        // Whole-slice comparison first (vectorizes); indices only where something changed.
        let mut scan = |range: std::ops::Range<usize>| {
            let s = &data[range.clone()];
            if !s.iter().all(|x| x.to_bits() == POISON_BITS) {
                v.extend(range.filter(|&k| data[k].to_bits() != POISON_BITS));
            }
        };
        scan(0..GUARD_ELEMS);
        if self.row_stride > self.cols {
            for r in 0..self.rows {
                let o = GUARD_ELEMS + r * self.row_stride;
                scan(o + self.cols..o + self.row_stride);
            }
        }
        scan(n - GUARD_ELEMS..n);
        v
    }
}

impl Drop for OutputBuffer {
    /// Hands a large allocation back for the next case ([`RECYCLE_MIN_ELEMS`]).
    fn drop(&mut self) {
        let Storage::Heap(data) = &mut self.data else {
            return; // the storage's own drop hands it back
        };
        if data.capacity() < RECYCLE_MIN_ELEMS {
            return;
        }
        let v = std::mem::take(data);
        let evicted = {
            let mut s = SPARE.lock().unwrap_or_else(|e| e.into_inner());
            s.push(v);
            // The smallest goes, of equal ones the least used ([`poisoned`]'s choice).
            let smallest = (0..s.len()).min_by_key(|&i| (s[i].capacity(), s[i].len()));
            (s.len() > SPARE_MAX).then(|| s.swap_remove(smallest.unwrap_or(0)))
        };
        // Unmapped outside the lock: gigabytes take a while.
        drop(evicted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A recycled allocation is reserved large, so that a larger case later reuses it
    /// (faulting in only what it adds); reused, it is poisoned again all through.
    #[test]
    fn recycled_output_allocations_grow_in_place_and_come_back_poisoned() {
        assert!(reserved(RECYCLE_MIN_ELEMS).capacity() >= RECYCLE_RESERVE_ELEMS);
        let mut a = OutputBuffer::new(1, RECYCLE_MIN_ELEMS, RECYCLE_MIN_ELEMS);
        a.interior_mut().fill(1.0);
        drop(a);
        let b = OutputBuffer::new(2, RECYCLE_MIN_ELEMS, RECYCLE_MIN_ELEMS);
        assert!(b.raw().0.iter().all(|x| x.to_bits() == POISON_BITS));

        let spare = |len: usize, cap: usize| {
            let mut v = Vec::with_capacity(cap);
            v.resize(len, 0.0f32);
            v
        };
        // The most used that fits; of equally used, the smallest; none too small.
        let s = [
            spare(10, 100),
            spare(40, 200),
            spare(40, 100),
            spare(30, 50),
        ];
        assert_eq!(pick_spare(&s, 60), Some(2));
        assert_eq!(pick_spare(&s, 150), Some(1));
        assert_eq!(pick_spare(&s, 300), None);
    }

    #[test]
    fn pristine_until_written_and_again_after_repoison() {
        let mut b = OutputBuffer::new(2, 3, 4);
        assert!(b.is_pristine());
        let _ = b.raw();
        let _ = b.row(1);
        assert!(b.is_pristine(), "reads keep it pristine");
        b.set(0, 0, 1.0);
        assert!(!b.is_pristine());
        b.repoison();
        assert!(b.is_pristine());
        let _ = b.raw_mut();
        assert!(!b.is_pristine(), "a &mut view may have written");
        b.repoison();
        let _ = b.rows_mut();
        assert!(!b.is_pristine());
    }
}
