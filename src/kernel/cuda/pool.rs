//! Where a case's two large buffers, the KV cache and the output, live on the device
//! between cases. Each has its own reserved range of addresses ([`Region`]) with
//! [`GAP`] unmapped bytes below it and everything past its mapped part unmapped, and
//! physical memory is mapped in whole chunks at its start as a case needs it. So:
//!
//! - **nothing is allocated per case**: the chunks stay (mapped, or kept unmapped for a
//!   larger case later) and a case of another size maps or unmaps only the difference
//!   (a 30 GiB `cuMemAlloc` and its free cost more than the run);
//! - **a wild access does not depend on the cases before**: a store or load below a
//!   buffer (a 32-bit-wrapped offset gone negative) or past its last chunk always lands
//!   in unmapped addresses and faults, so a shrunk crash replays in a fresh worker
//!   (seen on the H200 when allocations were reused at any larger size:
//!   `cuda:bug-offset32-out`'s saved crash replayed as a clean run);
//! - **the cache's poison is kept** ([`PoisonTag`] per chunk): after a case whose run
//!   wrote nothing outside its stored blocks (the integrity read proves it), only those
//!   blocks are poisoned again, and a case of another geometry of the same fp8 format
//!   rewrites only the scale slots (about 3% of a pool); only a new chunk, another
//!   format or a run that wrote into the pool costs a full pass.
//!
//! The mapped part of the cache is its bytes rounded up to whole chunks; the bytes past
//! the pool's last block are poisoned and verified like the rest, so what a read past
//! the pool sees is fixed by the case too.
//!
//! The cache's chunks are mapped twice: read-write at [`Region::base`] (where this crate
//! poisons, draws and references it) and **read-only** at [`Region::read_only_base`],
//! with the same gaps. A kernel handed the read-only view cannot change its cache: a
//! store into it faults, so the run needs no read of the whole pool afterwards to prove
//! it left the cache alone (`memory::CacheView`).

use super::compile::Program;
use super::device::{Gpu, GpuFailure};
use super::memory::{failure, launch};
use super::sys::{AddressRange, DeviceMemory, PhysicalMemory};
use std::ops::Range;

/// Unmapped addresses below each buffer: more than a 32-bit element offset gone
/// negative reaches (2^31 f32 elements = 8 GiB).
pub const GAP: u64 = 16 << 30;

/// Chunk sizes: the cache's chunks are large (pools are tens of GiB; fewer mappings),
/// the output's small (outputs are a few hundred MB; less mapped past their end).
const KV_CHUNK: u64 = 256 << 20;
const OUT_CHUNK: u64 = 32 << 20;

/// Device memory left free after a case's buffers are mapped, for the reference, the
/// judge and the small inputs: chunks kept for larger cases are released below it.
const KEEP_FREE: u64 = 12 << 30;

/// The poison a chunk of the cache holds: `nan_word` everywhere but the scale slots
/// `[values_end, scales_end)` of each `stride`-byte block counted from the cache's
/// base (see `poison_span` in kernels/util.cu).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoisonTag {
    pub nan_word: u32,
    pub stride: u64,
    pub values_end: u64,
    pub scales_end: u64,
}

/// The stored blocks of the last case, to be poisoned again before the next one.
struct Stored {
    bits: DeviceMemory,
    num_blocks: u64,
    tag: PoisonTag,
    /// The bytes the case had mapped.
    end: u64,
    /// Its run left every other word of the pool as it was.
    clean: bool,
}

/// One buffer's reserved addresses and the physical chunks behind them.
pub struct Region {
    range: AddressRange,
    /// A second reservation where the same chunks are mapped read-only (the cache's).
    view: Option<AddressRange>,
    chunk: u64,
    device: i32,
    /// Chunk `i` is mapped at `base() + i * chunk` while `i < mapped`; the rest are
    /// kept for a larger case.
    chunks: Vec<PhysicalMemory>,
    mapped: usize,
    /// What each chunk holds (cache only; `None`: unknown).
    tags: Vec<Option<PoisonTag>>,
    stored: Option<Stored>,
}

impl Region {
    /// `read_only_view`: map the chunks a second time, read-only ([`Region::read_only_base`]).
    fn new(gpu: &Gpu, chunk: u64, read_only_view: bool) -> Result<Region, GpuFailure> {
        // A device or driver without virtual memory management cannot lay out a case
        // at all: an environment error, not a crash of the case.
        let env = |what: &str| {
            let what = what.to_string();
            move |e: String| GpuFailure::Environment(format!("{what}: {e}"))
        };
        let device = gpu.ctx.device();
        let g = PhysicalMemory::granularity(device).map_err(env("device memory granularity"))?;
        let chunk = chunk.div_ceil(g) * g;
        let total = gpu.ctx.total_mem().map_err(failure)?;
        let capacity = total.div_ceil(chunk) * chunk;
        // Gap, buffer, gap: the end of the range is never mapped either.
        let reserve = || {
            AddressRange::reserve(GAP + capacity + GAP, g)
                .map_err(env("reserving device addresses"))
        };
        let range = reserve()?;
        let view = read_only_view.then(reserve).transpose()?;
        Ok(Region {
            range,
            view,
            chunk,
            device,
            chunks: Vec::new(),
            mapped: 0,
            tags: Vec::new(),
            stored: None,
        })
    }

    /// Where the buffer starts.
    pub fn base(&self) -> u64 {
        self.range.base() + GAP
    }

    /// Where the read-only view of the buffer starts (the same bytes as at `base()`;
    /// a store through it faults), if it has one.
    pub fn read_only_base(&self) -> Option<u64> {
        self.view.as_ref().map(|v| v.base() + GAP)
    }

    /// Bytes mapped from `base()`.
    pub fn mapped_bytes(&self) -> u64 {
        self.mapped as u64 * self.chunk
    }

    fn chunks_for(&self, bytes: u64) -> usize {
        bytes.max(1).div_ceil(self.chunk) as usize
    }

    /// Bytes of physical memory mapping `bytes` would create.
    fn to_create(&self, bytes: u64) -> u64 {
        self.chunks_for(bytes).saturating_sub(self.chunks.len()) as u64 * self.chunk
    }

    /// Maps exactly the chunks `bytes` needs (the device must be idle).
    fn map(&mut self, bytes: u64) -> Result<(), GpuFailure> {
        let want = self.chunks_for(bytes);
        if want as u64 * self.chunk > self.range.bytes() - 2 * GAP {
            return Err(GpuFailure::OutOfMemory(format!(
                "{bytes} bytes are more than the device has"
            )));
        }
        if want < self.mapped {
            let (offset, bytes) = (
                GAP + want as u64 * self.chunk,
                (self.mapped - want) as u64 * self.chunk,
            );
            for range in std::iter::once(&self.range).chain(&self.view) {
                // SAFETY: chunks want..mapped were mapped by this region, in both
                // ranges; the caller synchronized the device.
                unsafe { range.unmap(offset, bytes) }.map_err(failure)?;
            }
            self.mapped = want;
        }
        while self.chunks.len() < want {
            let mem = PhysicalMemory::create(self.device, self.chunk)
                .map_err(|e| failure(format!("a {} MiB chunk: {e}", self.chunk >> 20)))?;
            self.chunks.push(mem);
            self.tags.push(None);
        }
        let first = self.mapped;
        while self.mapped < want {
            let i = self.mapped;
            // SAFETY: chunk i's span lies inside the range (checked above) and is not
            // mapped; the chunk outlives its mappings (unmapped in `Drop` first).
            unsafe { self.range.map(GAP + i as u64 * self.chunk, &self.chunks[i]) }
                .map_err(failure)?;
            self.mapped += 1;
        }
        let (offset, new) = (
            GAP + first as u64 * self.chunk,
            (want.saturating_sub(first)) as u64 * self.chunk,
        );
        self.range
            .allow(offset, new, self.device)
            .map_err(failure)?;
        if let Err((held, e)) = self.map_view(first, want, (offset, new)) {
            self.drop_view(held, &e);
        }
        Ok(())
    }

    /// Maps chunks `first..want` (the bytes `span` of the range) into the read-only view
    /// too; on failure, how many chunks (from 0) the view then holds, and why.
    fn map_view(
        &self,
        first: usize,
        want: usize,
        (offset, new): (u64, u64),
    ) -> Result<(), (usize, String)> {
        let Some(view) = &self.view else {
            return Ok(());
        };
        for i in first..want {
            // SAFETY: as for the range: the view mirrors it chunk for chunk.
            unsafe { view.map(GAP + i as u64 * self.chunk, &self.chunks[i]) }
                .map_err(|e| (i, e))?;
        }
        view.allow_read(offset, new, self.device)
            .map_err(|e| (want, e))
    }

    /// A device or driver that refuses the read-only view: its `held` chunks unmapped,
    /// the view gone (the kernel then gets the cache's own addresses and the cache is
    /// read back after each run), said once.
    fn drop_view(&mut self, held: usize, why: &str) {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            eprintln!(
                "mqa-fuzz: the device refuses a read-only mapping of the KV cache ({why}): \
                 the cache is read back after each run instead"
            )
        });
        if let Some(view) = self.view.take() {
            for i in 0..held {
                // SAFETY: chunk i was mapped into the view by `map_view`; the device is
                // idle (mapping happens between cases).
                let _ = unsafe { view.unmap(GAP + i as u64 * self.chunk, self.chunk) };
            }
        }
    }

    /// Frees the chunks past `keep` that are not mapped.
    fn release_beyond(&mut self, keep: usize) {
        let keep = keep.max(self.mapped);
        self.chunks.truncate(keep);
        self.tags.truncate(keep);
    }

    /// Launches `poison_span` over the cache's bytes `[start, end)`: in each block of
    /// `t`'s geometry its bytes `[lo, hi)` get the poison of (`values_end`,
    /// `scales_end`, `t.nan_word`); `only`: a device bitmap of the blocks to write and
    /// its length in bits, or `(0, 0)` for all.
    #[allow(clippy::too_many_arguments)]
    fn span(
        &self,
        gpu: &mut Gpu,
        (start, end): (u64, u64),
        t: PoisonTag,
        (lo, hi): (u64, u64),
        (values_end, scales_end): (u64, u64),
        only: (u64, u64),
    ) -> Result<(), GpuFailure> {
        let f = gpu
            .function(Program::Util, "poison_span", &vec![])
            .map_err(GpuFailure::Environment)?;
        let blocks = end.div_ceil(t.stride) - start / t.stride;
        let grid = blocks.min(gpu.sms as u64 * 64).div_ceil(8).max(1) as u32;
        launch(
            &f,
            (grid, 1, 1),
            256,
            0,
            &mut [
                &mut self.base(),
                &mut start.clone(),
                &mut end.clone(),
                &mut t.stride.clone(),
                &mut lo.clone(),
                &mut hi.clone(),
                &mut values_end.clone(),
                &mut scales_end.clone(),
                &mut t.nan_word.clone(),
                &mut only.0.clone(),
                &mut only.1.clone(),
            ],
        )
    }

    /// Poisons the last case's stored blocks again (in its geometry, before anything is
    /// unmapped); if its run wrote elsewhere in the pool (or was never checked),
    /// nothing it had mapped is known any more.
    fn restore(&mut self, gpu: &mut Gpu) -> Result<(), GpuFailure> {
        let Some(s) = self.stored.take() else {
            return Ok(());
        };
        let n = self.chunks_for(s.end).min(self.mapped);
        if restorable(s.clean, &self.tags[..n], s.tag) {
            let t = s.tag;
            let end = s.end.min(self.mapped_bytes());
            // Only the blocks' own bytes were written (values, then scales); their
            // stride padding was proved intact.
            let all = (t.values_end, t.scales_end);
            let own = (0, t.scales_end);
            self.span(gpu, (0, end), t, own, all, (s.bits.ptr(), s.num_blocks))?;
            // The bitmap is freed once the launch is done.
            gpu.ctx.synchronize().map_err(failure)?;
        } else {
            self.tags[..n].iter_mut().for_each(|t| *t = None);
        }
        Ok(())
    }

    /// Makes the mapped chunks hold `tag`'s poison, rewriting only what differs from
    /// what each holds ([`plan`]); returns the bytes written.
    fn poison(&mut self, gpu: &mut Gpu, tag: PoisonTag) -> Result<u64, GpuFailure> {
        let mut written = 0u64;
        let slots = (tag.values_end, tag.scales_end);
        for (run, rewrite) in plan(&self.tags[..self.mapped], tag) {
            let span = (run.start as u64 * self.chunk, run.end as u64 * self.chunk);
            match rewrite {
                Rewrite::Nothing => {}
                Rewrite::Slots(h) => {
                    self.span(gpu, span, h, (h.values_end, h.scales_end), (0, 0), (0, 0))?;
                    self.span(gpu, span, tag, slots, slots, (0, 0))?;
                }
                Rewrite::Full => {
                    self.span(gpu, span, tag, (0, tag.stride), slots, (0, 0))?;
                }
            }
            written += rewrite.bytes(span.1 - span.0, tag);
            self.tags[run].iter_mut().for_each(|t| *t = Some(tag));
        }
        Ok(written)
    }
}

/// What a run of chunks needs to hold a tag's poison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rewrite {
    /// Nothing: it holds that poison already.
    Nothing,
    /// It holds another geometry's poison of the same fp8 NaN code (this one): that
    /// geometry's scale slots become NaN codes, then the new ones NaN scales.
    Slots(PoisonTag),
    /// Every byte: unknown contents or another format.
    Full,
}

impl Rewrite {
    /// Bytes written over `bytes` of cache to reach `tag`'s poison.
    pub fn bytes(self, bytes: u64, tag: PoisonTag) -> u64 {
        let slots = |t: PoisonTag| bytes / t.stride * (t.scales_end - t.values_end);
        match self {
            Rewrite::Nothing => 0,
            Rewrite::Slots(old) => slots(old) + slots(tag),
            Rewrite::Full => bytes,
        }
    }
}

/// The runs of consecutive chunks that hold the same thing (`held[i]`: chunk i's
/// poison, `None` unknown), each with what it needs to hold `tag`'s poison: one launch
/// or two per run.
pub fn plan(held: &[Option<PoisonTag>], tag: PoisonTag) -> Vec<(Range<usize>, Rewrite)> {
    let mut runs = Vec::new();
    let mut i = 0;
    while i < held.len() {
        let j = held[i..]
            .iter()
            .position(|t| *t != held[i])
            .map_or(held.len(), |n| i + n);
        let rewrite = match held[i] {
            Some(h) if h == tag => Rewrite::Nothing,
            Some(h) if h.nan_word == tag.nan_word => Rewrite::Slots(h),
            _ => Rewrite::Full,
        };
        runs.push((i..j, rewrite));
        i = j;
    }
    runs
}

/// Whether the last case's stored blocks may simply be poisoned again: its run left the
/// rest of the pool intact and every chunk it had mapped still holds its poison.
fn restorable(clean: bool, held: &[Option<PoisonTag>], tag: PoisonTag) -> bool {
    clean && held.iter().all(|t| *t == Some(tag))
}

impl Drop for Region {
    fn drop(&mut self) {
        for range in std::iter::once(&self.range).chain(&self.view) {
            // SAFETY: every mapped chunk was mapped here (in both ranges); a region is
            // dropped only between cases (or with the process), when no work uses it.
            let _ = unsafe { range.unmap(GAP, self.mapped_bytes()) };
        }
    }
}

/// The process's two regions, lent to one case at a time.
struct Arena {
    kv: Option<Region>,
    out: Option<Region>,
    /// A case holds the regions.
    lent: bool,
}

static ARENA: std::sync::Mutex<Arena> = std::sync::Mutex::new(Arena {
    kv: None,
    out: None,
    lent: false,
});

/// The regions lent to one case (or regions of its own while another case holds the
/// arena's; those are freed when it ends).
pub struct Lease {
    kv: Option<Region>,
    out: Option<Region>,
    own: bool,
    /// The case's stored blocks and whether its run left the rest of the pool intact,
    /// handed to the region when the case ends.
    pub(super) stored: Option<(DeviceMemory, u64, PoisonTag)>,
    pub(super) clean: bool,
}

/// What laying out a case's buffers cost.
#[derive(Clone, Copy, Debug, Default)]
pub struct MapStats {
    /// Bytes of the cache poisoned (whole chunks, or only scale slots).
    pub poisoned_bytes: u64,
    /// Seconds spent mapping and unmapping.
    pub map_secs: f64,
    /// Seconds spent poisoning the cache (the last case's stored blocks included).
    pub poison_secs: f64,
}

impl Lease {
    /// Both buffers mapped to the sizes a case needs (`kv_bytes` of cache holding
    /// `tag`'s poison, `out_bytes` of output, not yet poisoned).
    pub fn take(
        gpu: &mut Gpu,
        out_bytes: u64,
        kv_bytes: u64,
        tag: PoisonTag,
    ) -> Result<(Lease, MapStats), GpuFailure> {
        let held = {
            let mut a = ARENA.lock().unwrap_or_else(|p| p.into_inner());
            let own = a.lent;
            a.lent = true;
            match (own, a.kv.take(), a.out.take()) {
                (false, Some(kv), Some(out)) => Some((kv, out)),
                _ => None,
            }
            .ok_or(own)
        };
        // The first case makes the arena's regions; a case while another holds them
        // gets regions of its own.
        let (kv, out, own) = match held {
            Ok((kv, out)) => (kv, out, false),
            Err(own) => {
                let made = Region::new(gpu, KV_CHUNK, true)
                    .and_then(|kv| Ok((kv, Region::new(gpu, OUT_CHUNK, false)?)));
                match made {
                    Ok((kv, out)) => (kv, out, own),
                    Err(e) => {
                        if !own {
                            ARENA.lock().unwrap_or_else(|p| p.into_inner()).lent = false;
                        }
                        return Err(e);
                    }
                }
            }
        };
        let mut lease = Lease {
            kv: Some(kv),
            out: Some(out),
            own,
            stored: None,
            clean: false,
        };
        gpu.ctx.synchronize().map_err(failure)?;
        let stats = lease.map(gpu, out_bytes, kv_bytes, tag)?;
        Ok((lease, stats))
    }

    fn map(
        &mut self,
        gpu: &mut Gpu,
        out_bytes: u64,
        kv_bytes: u64,
        tag: PoisonTag,
    ) -> Result<MapStats, GpuFailure> {
        let (kv, out) = (
            self.kv.as_mut().expect("held"),
            self.out.as_mut().expect("held"),
        );
        let create = kv.to_create(kv_bytes) + out.to_create(out_bytes);
        let (free, total) = gpu.ctx.mem_info().map_err(failure)?;
        // Leave room for the small inputs, the reference, hashes and module images.
        let reserve = 256 << 20;
        if create + reserve > free {
            // Chunks kept for larger cases make room first.
            let (kw, ow) = (kv.chunks_for(kv_bytes), out.chunks_for(out_bytes));
            kv.release_beyond(kw);
            out.release_beyond(ow);
            let (free, _) = gpu.ctx.mem_info().map_err(failure)?;
            let create = kv.to_create(kv_bytes) + out.to_create(out_bytes);
            if create + reserve > free {
                return Err(GpuFailure::OutOfMemory(format!(
                    "case needs {:.2} GiB of device memory, {:.2} of {:.2} GiB free",
                    (out_bytes + kv_bytes) as f64 / (1u64 << 30) as f64,
                    (free + kv.mapped_bytes() + out.mapped_bytes()) as f64 / (1u64 << 30) as f64,
                    total as f64 / (1u64 << 30) as f64
                )));
            }
        }
        let t0 = std::time::Instant::now();
        kv.restore(gpu)?;
        let t1 = std::time::Instant::now();
        out.map(out_bytes)?;
        kv.map(kv_bytes)?;
        let (free, _) = gpu.ctx.mem_info().map_err(failure)?;
        if free < KEEP_FREE {
            kv.release_beyond(0);
            out.release_beyond(0);
        }
        let t2 = std::time::Instant::now();
        let poisoned_bytes = kv.poison(gpu, tag)?;
        gpu.ctx.synchronize().map_err(failure)?;
        Ok(MapStats {
            poisoned_bytes,
            map_secs: (t2 - t1).as_secs_f64(),
            poison_secs: (t1 - t0).as_secs_f64() + t2.elapsed().as_secs_f64(),
        })
    }

    pub fn kv(&self) -> &Region {
        self.kv.as_ref().expect("held until drop")
    }

    pub fn out(&self) -> &Region {
        self.out.as_ref().expect("held until drop")
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let (Some(mut kv), Some(out)) = (self.kv.take(), self.out.take()) else {
            return;
        };
        if let Some((bits, num_blocks, tag)) = self.stored.take() {
            kv.stored = Some(Stored {
                bits,
                num_blocks,
                tag,
                end: kv.mapped_bytes(),
                clean: self.clean,
            });
        } else {
            kv.tags.iter_mut().for_each(|t| *t = None);
        }
        if self.own {
            return;
        }
        let mut a = ARENA.lock().unwrap_or_else(|p| p.into_inner());
        a.kv = Some(kv);
        a.out = Some(out);
        a.lent = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(nan_word: u32, stride: u64, block_size: u64) -> PoisonTag {
        let values_end = block_size * 128;
        PoisonTag {
            nan_word,
            stride,
            values_end,
            scales_end: values_end + 4 * block_size,
        }
    }

    const FN: u32 = 0x7F7F_7F7F;
    const FNUZ: u32 = 0x8080_8080;

    #[test]
    fn chunks_holding_the_same_poison_are_one_run_and_each_run_gets_the_least_rewrite() {
        let want = tag(FN, 8448, 64);
        let other_stride = tag(FN, 1_002_240, 64);
        let fnuz = tag(FNUZ, 8448, 64);
        let held = [
            Some(want),
            Some(want),
            Some(other_stride),
            None,
            None,
            Some(fnuz),
            Some(want),
        ];
        assert_eq!(
            plan(&held, want),
            vec![
                (0..2, Rewrite::Nothing),
                (2..3, Rewrite::Slots(other_stride)),
                (3..5, Rewrite::Full),
                (5..6, Rewrite::Full),
                (6..7, Rewrite::Nothing),
            ]
        );
        assert!(plan(&[], want).is_empty());
    }

    #[test]
    fn a_slot_rewrite_writes_both_geometries_scale_slots_and_no_more() {
        let want = tag(FN, 8448, 64);
        let old = tag(FN, 2112, 16);
        let chunk = 256u64 << 20;
        let written = Rewrite::Slots(old).bytes(chunk, want);
        // 256 B of scales per 8,448 B block, 64 B per 2,112 B block: ~6% of the chunk.
        assert_eq!(written, chunk / 2112 * 64 + chunk / 8448 * 256);
        assert!(written < chunk / 16);
        assert_eq!(Rewrite::Full.bytes(chunk, want), chunk);
        assert_eq!(Rewrite::Nothing.bytes(chunk, want), 0);
    }

    #[test]
    fn stored_blocks_are_restored_only_after_a_clean_run_over_chunks_still_holding_their_poison() {
        let t = tag(FN, 8448, 64);
        assert!(restorable(true, &[Some(t), Some(t)], t));
        assert!(
            !restorable(false, &[Some(t), Some(t)], t),
            "the run wrote into the pool"
        );
        assert!(!restorable(true, &[Some(t), None], t));
        assert!(!restorable(true, &[Some(tag(FNUZ, 8448, 64))], t));
    }
}
