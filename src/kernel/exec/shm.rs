//! Protocol version 2's tensor transport: shared-memory regions mapped by both sides
//! and reused case after case, instead of a case file and an output file per case
//! (protocol 1).
//!
//! The harness's output buffer of a case lives in a region of a [`RegionPool`] (one
//! region per output alive: the cases in flight): the harness poisons it there, writes
//! the inputs after it, the worker writes the output in place ([`MappedOutput`] for
//! built-in kernels) and the harness judges it where it lies, so the output, up to
//! gigabytes, is never copied between the processes. An output buffer on the heap goes
//! through the slot's own region, there and back.
//!
//! A region is a `memfd` (an anonymous file in memory; a deleted temporary file where
//! memfd is unavailable). The worker opens it by the path `/proc/<pid>/fd/<fd>` named in
//! each request, so nothing is inherited and a fork server's children can open it too.
//! A slot's region only grows (by whole 64 MiB steps) unless a case needs less than a
//! quarter of a large region, which then shrinks; a pool's regions never shrink (the next
//! engine-sized case would fault its pages in again) and the pool keeps at most a few,
//! within a quarter of the host's memory.
//!
//! Every tensor of the wire ([`super::protocol::wire_tensors`]: the inputs, the sparse
//! cache's stored blocks and the poisoned, guarded output) is placed at a 64-byte
//! aligned offset; the request lists each one's dtype, shape and offset
//! ([`ShmTensors`]), and the worker writes `logits` in place.

use super::safetensors_stream::{Data, Dtype};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::Arc;

/// Alignment of every tensor inside the region.
const ALIGN: usize = 64;
/// The region grows in steps of this many bytes.
const GROW_STEP: usize = 64 << 20;
/// Regions above this size shrink when a case needs less than a quarter of them.
const SHRINK_ABOVE: usize = 256 << 20;

/// Where one tensor lies in the region.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShmTensor {
    pub dtype: String,
    pub shape: Vec<usize>,
    /// Byte offset from the start of the region.
    pub offset: usize,
}

impl ShmTensor {
    pub fn dtype(&self) -> Result<Dtype, String> {
        match self.dtype.as_str() {
            "U8" => Ok(Dtype::U8),
            "I32" => Ok(Dtype::I32),
            "I64" => Ok(Dtype::I64),
            "F32" => Ok(Dtype::F32),
            d => Err(format!("unknown dtype {d:?}")),
        }
    }

    /// Bytes of the tensor (`None` on overflow).
    pub fn byte_len(&self) -> Option<usize> {
        let elems = self
            .shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))?;
        elems.checked_mul(self.dtype().ok()?.size())
    }
}

/// The `shm` object of a version-2 request: the region and its tensors.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShmTensors {
    /// A path the worker can open read-write (`/proc/<pid>/fd/<fd>`).
    pub path: String,
    /// Bytes of the region the worker should map (at least the end of the last tensor).
    pub bytes: usize,
    pub tensors: BTreeMap<String, ShmTensor>,
}

impl ShmTensors {
    /// The offsets of `tensors` laid out back to back, each aligned.
    pub fn layout(path: String, tensors: &[(&str, Vec<usize>, Data)]) -> ShmTensors {
        let specs: Vec<(&str, Vec<usize>, Dtype, usize)> = tensors
            .iter()
            .map(|(n, shape, d)| (*n, shape.clone(), d.dtype(), d.byte_len()))
            .collect();
        Self::layout_of(path, &specs)
    }

    /// [`Self::layout`] from each tensor's name, shape, dtype and byte length.
    pub fn layout_of(path: String, tensors: &[(&str, Vec<usize>, Dtype, usize)]) -> ShmTensors {
        let mut at = 0usize;
        let mut map = BTreeMap::new();
        for (name, shape, dtype, bytes) in tensors {
            at = at.next_multiple_of(ALIGN);
            map.insert(
                name.to_string(),
                ShmTensor {
                    dtype: dtype.name().to_string(),
                    shape: shape.clone(),
                    offset: at,
                },
            );
            at += bytes;
        }
        ShmTensors {
            path,
            bytes: at.next_multiple_of(ALIGN).max(ALIGN),
            tensors: map,
        }
    }

    /// Tensor `name`, checked to lie inside a region of `len` bytes and to have `dtype`.
    pub fn get(&self, name: &str, dtype: Dtype, len: usize) -> Result<(&ShmTensor, usize), String> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| format!("the request's shm lists no tensor {name:?}"))?;
        let got = t.dtype().map_err(|e| format!("tensor {name}: {e}"))?;
        if got != dtype {
            return Err(format!(
                "tensor {name} is {}, expected {}",
                got.name(),
                dtype.name()
            ));
        }
        let n = t
            .byte_len()
            .ok_or_else(|| format!("tensor {name}: shape {:?} overflows", t.shape))?;
        if t.offset.checked_add(n).is_none_or(|end| end > len) {
            return Err(format!(
                "tensor {name} ({n} bytes at offset {}) lies past the {len}-byte region",
                t.offset
            ));
        }
        Ok((t, n))
    }
}

/// A shared-memory region mapped read-write into this process.
pub struct SharedRegion {
    file: File,
    ptr: *mut u8,
    len: usize,
    path: String,
}

// SAFETY: the mapping is owned by this value alone; access goes through `&mut self`
// (writes) or `&self` (reads), so Rust's aliasing rules hold within this process. The
// other process writes only while this one waits for its answer.
unsafe impl Send for SharedRegion {}
// SAFETY: `&self` gives only reads of the mapping (`bytes`); writes need `&mut self`.
unsafe impl Sync for SharedRegion {}

impl SharedRegion {
    /// A new, empty region named `tag` (seen in `/proc/<pid>/fd`).
    pub fn create(tag: &str) -> std::io::Result<SharedRegion> {
        let file = memfd(tag).or_else(|_| unlinked_temp_file(tag))?;
        let path = format!("/proc/{}/fd/{}", std::process::id(), file.as_raw_fd());
        Ok(SharedRegion {
            file,
            ptr: std::ptr::null_mut(),
            len: 0,
            path,
        })
    }

    /// Opens an existing region by path, `len` bytes (the worker side).
    pub fn open(path: &str, len: usize) -> std::io::Result<SharedRegion> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        let have = file.metadata()?.len();
        if have < len as u64 {
            return Err(std::io::Error::other(format!(
                "{path} holds {have} bytes, the request maps {len}"
            )));
        }
        let mut r = SharedRegion {
            file,
            ptr: std::ptr::null_mut(),
            len: 0,
            path: path.to_string(),
        };
        r.map(len)?;
        Ok(r)
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Makes the region at least `need` bytes (grown in steps, shrunk when far too big).
    pub fn ensure(&mut self, need: usize) -> std::io::Result<()> {
        let want = need.max(1).next_multiple_of(GROW_STEP);
        let too_big = self.len > SHRINK_ABOVE && want < self.len / 4;
        if need <= self.len && !too_big {
            return Ok(());
        }
        self.unmap();
        self.file.set_len(want as u64)?;
        self.map(want)
    }

    /// Gives the region's memory back (unmapped, its file emptied) and keeps it open;
    /// [`SharedRegion::ensure`] grows it again.
    fn release(&mut self) {
        self.unmap();
        self.len = 0;
        let _ = self.file.set_len(0);
    }

    fn map(&mut self, len: usize) -> std::io::Result<()> {
        // SAFETY: a shared read-write mapping of a file we hold open, `len` bytes, which
        // the file has (set_len above or checked by `open`).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        self.ptr = p.cast();
        self.len = len;
        Ok(())
    }

    fn unmap(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: `ptr`/`len` are exactly what mmap returned; no slice outlives
            // this call (they borrow `self`).
            unsafe {
                libc::munmap(self.ptr.cast(), self.len);
            }
            self.ptr = std::ptr::null_mut();
            self.len = 0;
        }
    }

    pub fn bytes(&self) -> &[u8] {
        if self.ptr.is_null() {
            return &[];
        }
        // SAFETY: the mapping is `len` bytes, valid until `unmap`, which needs `&mut`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        if self.ptr.is_null() {
            return &mut [];
        }
        // SAFETY: as in `bytes`, and `&mut self` makes this the only slice.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Writes `tensors` at the offsets of `layout` (the region must be large enough).
    pub fn write(&mut self, layout: &ShmTensors, tensors: &[(&str, Vec<usize>, Data)]) {
        let region = self.bytes_mut();
        for (name, _, data) in tensors {
            let at = layout.tensors[*name].offset;
            data.copy_to(&mut region[at..at + data.byte_len()]);
        }
    }

    /// Writes `src` as f32 tensor `name` of `layout` (checked: the layout may come from
    /// a request).
    pub fn write_f32s(
        &mut self,
        layout: &ShmTensors,
        name: &str,
        src: &[f32],
    ) -> Result<(), String> {
        let (t, n) = layout.get(name, Dtype::F32, self.len)?;
        if n != src.len() * 4 {
            return Err(format!(
                "tensor {name} has {} elements, the output has {}",
                n / 4,
                src.len()
            ));
        }
        let at = t.offset;
        Data::F32(src).copy_to(&mut self.bytes_mut()[at..at + n]);
        Ok(())
    }

    /// Reads f32 tensor `name` of `layout` into `dst` (whose length must match).
    pub fn read_f32s(
        &self,
        layout: &ShmTensors,
        name: &str,
        dst: &mut [f32],
    ) -> Result<(), String> {
        let (t, n) = layout.get(name, Dtype::F32, self.len)?;
        if n != dst.len() * 4 {
            return Err(format!(
                "tensor {name} has {} elements, expected {}",
                n / 4,
                dst.len()
            ));
        }
        let src = &self.bytes()[t.offset..t.offset + n];
        // f32 on the little-endian hosts this runs on: a plain byte copy, on every core
        // (the output buffer can pass 2 GiB).
        use rayon::prelude::*;
        let dst_bytes: &mut [u8] = bytemuck_f32(dst);
        dst_bytes
            .par_chunks_mut(1 << 22)
            .zip(src.par_chunks(1 << 22))
            .for_each(|(d, s)| d.copy_from_slice(s));
        Ok(())
    }
}

/// A version-2 request's tensors read from the region (worker side).
pub struct ShmReader<'a> {
    pub region: &'a SharedRegion,
    pub layout: &'a ShmTensors,
}

impl ShmReader<'_> {
    fn raw(&self, name: &str, dtype: Dtype) -> Result<(Vec<usize>, &[u8]), String> {
        let (t, n) = self.layout.get(name, dtype, self.region.len())?;
        Ok((
            t.shape.clone(),
            &self.region.bytes()[t.offset..t.offset + n],
        ))
    }

    fn ints<T: Send, const N: usize>(
        &self,
        name: &str,
        dtype: Dtype,
        f: impl Fn([u8; N]) -> T + Sync + Send,
    ) -> Result<(Vec<usize>, Vec<T>), String> {
        use rayon::prelude::*;
        let (shape, b) = self.raw(name, dtype)?;
        // An engine's block table is up to 100 MB: decoded on every core.
        let v = b
            .par_chunks_exact(N)
            .map(|c| f(c.try_into().expect("N-byte chunk")))
            .collect();
        Ok((shape, v))
    }
}

impl super::protocol::TensorSource for ShmReader<'_> {
    fn bytes(&mut self, name: &str) -> Result<(Vec<usize>, Vec<u8>), String> {
        let (shape, b) = self.raw(name, Dtype::U8)?;
        Ok((shape, b.to_vec()))
    }
    fn i32s(&mut self, name: &str) -> Result<(Vec<usize>, Vec<i32>), String> {
        self.ints(name, Dtype::I32, i32::from_le_bytes)
    }
    fn i64s(&mut self, name: &str) -> Result<(Vec<usize>, Vec<i64>), String> {
        self.ints(name, Dtype::I64, i64::from_le_bytes)
    }
    fn f32s(&mut self, name: &str) -> Result<(Vec<usize>, Vec<f32>), String> {
        self.ints(name, Dtype::F32, f32::from_le_bytes)
    }
    fn f32s_into(&mut self, name: &str, dst: &mut [f32]) -> Result<Vec<usize>, String> {
        self.region.read_f32s(self.layout, name, dst)?;
        Ok(self.layout.tensors[name].shape.clone())
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        self.unmap();
    }
}

/// Regions that outputs live in ([`RegionOutput`]): a case's output buffer is made in
/// one (poisoned there by the harness), its inputs are written beside it, and the
/// worker writes the output in place, so the output never crosses between the
/// processes as a copy. One region per output alive; dropped outputs hand theirs back.
///
/// A region is never closed while the pool lives: a worker maps a region by its path,
/// `/proc/<pid>/fd/<fd>`, and keeps the mapping for the next request naming that path, so
/// a closed region's fd number given to a new region would show the worker the old
/// region's pages (seen on an H200 with 8 cases in flight: requests read as invalid
/// cases, device judgements of another case's inputs). Memory is given back by emptying
/// the file instead ([`SharedRegion::release`]); the fd, and so the path, stays this
/// region's.
pub struct RegionPool {
    spare: std::sync::Mutex<Vec<SharedRegion>>,
    /// Regions whose memory was given back, kept open; grown again before reuse.
    emptied: std::sync::Mutex<Vec<SharedRegion>>,
    /// Spare regions kept at most (more are freed, smallest first).
    keep: usize,
    /// Bytes of spare regions kept at most: a quarter of the host's memory.
    keep_bytes: usize,
}

impl RegionPool {
    pub fn new(keep: usize) -> std::sync::Arc<RegionPool> {
        // SAFETY: plain sysconf queries.
        let (pages, page) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let memory = (pages.max(0) as usize).saturating_mul(page.max(0) as usize);
        std::sync::Arc::new(RegionPool {
            spare: std::sync::Mutex::new(Vec::new()),
            emptied: std::sync::Mutex::new(Vec::new()),
            keep,
            keep_bytes: (memory / 4).max(1 << 30),
        })
    }

    /// A region of at least `bytes`: the smallest spare that holds them, else the
    /// largest spare grown, else an emptied one grown, else a new one. Pooled regions
    /// never shrink (the next engine-sized case would fault its pages in again); the
    /// pool empties whole ones.
    pub fn take(&self, bytes: usize) -> std::io::Result<SharedRegion> {
        let spare = {
            let mut s = self.spare.lock().unwrap_or_else(|e| e.into_inner());
            let fits = (0..s.len())
                .filter(|&i| s[i].len() >= bytes)
                .min_by_key(|&i| s[i].len());
            let pick = fits.or_else(|| (0..s.len()).max_by_key(|&i| s[i].len()));
            pick.map(|i| s.swap_remove(i))
        };
        let emptied = || {
            let mut e = self.emptied.lock().unwrap_or_else(|e| e.into_inner());
            e.pop()
        };
        let mut r = match spare.or_else(emptied) {
            Some(r) => r,
            None => SharedRegion::create("mqa-fuzz-output")?,
        };
        if r.len() < bytes {
            r.ensure(bytes)?;
        }
        Ok(r)
    }

    fn give(&self, r: SharedRegion) {
        let mut s = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        s.push(r);
        while s.len() > self.keep
            || (s.len() > 1 && s.iter().map(SharedRegion::len).sum::<usize>() > self.keep_bytes)
        {
            let smallest = (0..s.len()).min_by_key(|&i| s[i].len()).unwrap_or(0);
            self.retire(s.swap_remove(smallest));
        }
    }

    /// Empties `r` and keeps it open for reuse.
    fn retire(&self, mut r: SharedRegion) {
        r.release();
        self.emptied
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(r);
    }

    /// Spare regions and their bytes (for tests).
    pub fn spare(&self) -> (usize, usize) {
        let s = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        (s.len(), s.iter().map(SharedRegion::len).sum())
    }
}

/// An output buffer's storage in a pooled region: the `logits` tensor of `layout` at
/// offset 0, the case's inputs after it. Handed back to its pool when dropped, unless
/// `tainted` (a worker that was killed mid-case might, in theory, still have been
/// writing it).
pub struct RegionOutput {
    region: Option<SharedRegion>,
    pool: std::sync::Arc<RegionPool>,
    pub layout: ShmTensors,
    elems: usize,
    pub tainted: bool,
}

impl RegionOutput {
    /// A region from `pool` for `layout` (whose `logits` must lie at offset 0).
    pub fn new(
        pool: &std::sync::Arc<RegionPool>,
        mut layout: ShmTensors,
    ) -> std::io::Result<RegionOutput> {
        let logits = layout
            .tensors
            .get("logits")
            .filter(|t| t.offset == 0 && t.dtype == "F32")
            .ok_or_else(|| std::io::Error::other("the layout's logits are not f32 at offset 0"))?;
        let elems = logits.byte_len().unwrap_or(0) / 4;
        let region = pool.take(layout.bytes)?;
        layout.path = region.path().to_string();
        Ok(RegionOutput {
            region: Some(region),
            pool: pool.clone(),
            layout,
            elems,
            tainted: false,
        })
    }

    /// Whether this storage came from `pool`.
    pub fn is_from(&self, pool: &std::sync::Arc<RegionPool>) -> bool {
        std::sync::Arc::ptr_eq(&self.pool, pool)
    }

    pub fn region_mut(&mut self) -> &mut SharedRegion {
        self.region.as_mut().expect("held until drop")
    }
}

impl crate::kernel::OutputStorage for RegionOutput {
    fn elems(&self) -> &[f32] {
        let r = self.region.as_ref().expect("held until drop");
        let b = &r.bytes()[..4 * self.elems];
        assert!(b.as_ptr().align_offset(4) == 0);
        // SAFETY: the mapping is page-aligned and the logits start at offset 0 (checked
        // in new); f32 has no invalid bit patterns; the length is in bounds (sliced).
        unsafe { std::slice::from_raw_parts(b.as_ptr().cast(), self.elems) }
    }

    fn elems_mut(&mut self) -> &mut [f32] {
        let n = self.elems;
        let b = &mut self.region_mut().bytes_mut()[..4 * n];
        assert!(b.as_ptr().align_offset(4) == 0);
        // SAFETY: as in `elems`, through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr().cast(), n) }
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

impl Drop for RegionOutput {
    fn drop(&mut self) {
        if let Some(r) = self.region.take() {
            if self.tainted {
                // Its pages go; its fd stays this region's (see `RegionPool`).
                self.pool.retire(r);
            } else {
                self.pool.give(r);
            }
        }
    }
}

/// A worker's view of the `logits` tensor of a region it mapped: the output buffer the
/// kernel writes in place.
pub struct MappedOutput {
    ptr: *mut f32,
    elems: usize,
    /// Keeps the mapping alive (a worker may drop its own handle meanwhile).
    _region: Arc<SharedRegion>,
}

// SAFETY: the pointer is into a mapping the worker holds for the whole request, and is
// only dereferenced through `&self`/`&mut self` of this value.
unsafe impl Send for MappedOutput {}
unsafe impl Sync for MappedOutput {}

impl MappedOutput {
    /// The `logits` of `layout` in `region`, which stays mapped while this lives.
    ///
    /// # Safety
    /// Nothing else in this process may access the region's `logits` bytes while the
    /// returned value (and the output buffer over it) lives: the worker reads a
    /// request's other tensors, and the next request is in another region (the client
    /// hands a region out again only after its answer).
    pub unsafe fn new(
        region: Arc<SharedRegion>,
        layout: &ShmTensors,
    ) -> Result<MappedOutput, String> {
        let (t, n) = layout.get("logits", Dtype::F32, region.len())?;
        let at = t.offset;
        // The mapping's own pointer (not derived from a shared slice), `n` bytes in it.
        let ptr = region.ptr.wrapping_add(at);
        if ptr.align_offset(4) != 0 {
            return Err(format!("logits at offset {at} are not 4-byte aligned"));
        }
        Ok(MappedOutput {
            ptr: ptr.cast(),
            elems: n / 4,
            _region: region,
        })
    }
}

impl crate::kernel::OutputStorage for MappedOutput {
    fn elems(&self) -> &[f32] {
        // SAFETY: `new`'s contract keeps the mapping alive; in bounds and aligned.
        unsafe { std::slice::from_raw_parts(self.ptr, self.elems) }
    }
    fn elems_mut(&mut self) -> &mut [f32] {
        // SAFETY: as above, through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.elems) }
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

/// The bytes of an f32 slice (little-endian hosts only, checked at compile time).
fn bytemuck_f32(v: &mut [f32]) -> &mut [u8] {
    const _: () = assert!(cfg!(target_endian = "little"));
    // SAFETY: f32 has no invalid bit patterns and u8 has alignment 1; the length is
    // the same memory in bytes.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), std::mem::size_of_val(v)) }
}

fn memfd(tag: &str) -> std::io::Result<File> {
    let name = std::ffi::CString::new(tag).map_err(std::io::Error::other)?;
    // SAFETY: plain syscall with a NUL-terminated name; the fd is owned by the File.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// A temporary file, deleted at once, kept open (reachable through `/proc/<pid>/fd`).
fn unlinked_temp_file(tag: &str) -> std::io::Result<File> {
    let dir = std::env::var_os("MQA_FUZZ_EXEC_TMPDIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let k = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("{tag}.{}.{k}", std::process::id()));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    std::fs::remove_file(&path)?;
    Ok(f)
}

#[cfg(test)]
mod tests;
