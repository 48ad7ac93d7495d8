//! A case on the device, laid out as production lays it out: the KV cache at its full
//! declared size (`num_blocks * kv_block_stride`, several GiB for high block ids) with
//! every byte the table does not reference poisoned exactly as
//! [`crate::kernel::cpu::poison_byte`] (by a device kernel: host copies of GiBs would
//! dominate the run), the referenced blocks drawn in their slots by the device twin of
//! the value generator (pipeline values) or copied there, and the output buffer
//! poisoned on the device (or the harness's copied whole, guard zones included), so
//! out-of-bounds stores land in memory the oracle inspects. Inputs are hashed on the
//! device before and after the launch to detect writes to them; the cache is either
//! handed to the kernel read-only (a store faults) or read whole after the run
//! ([`CacheView`]). The two large buffers live in address ranges kept between cases,
//! with their poison ([`super::pool`]).

use super::compile::Program;
use super::device::{Gpu, GpuFailure};
use super::pool::{Lease, PoisonTag};
use super::sys::{DeviceMemory, DeviceSpan, Function};
use crate::case::{Case, ContextLens, ValueKind, ValueLayout};
use crate::fp8::Fp8Format;
use crate::kernel::{OutputBuffer, GUARD_ELEMS, POISON_BITS};
use std::ffi::c_void;

/// Mirrors `struct Params` in kernels/common.cuh, field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Params {
    pub q: u64,
    pub weights: u64,
    pub kv: u64,
    pub table: u64,
    pub lens: u64,
    pub out: u64,
    pub decode: u64,
    pub kv_bytes: u64,
    pub kv_stride: u64,
    pub out_stride: i64,
    pub batch: i32,
    pub next_n: i32,
    pub heads: i32,
    pub head_dim: i32,
    pub block_size: i32,
    pub layout: i32,
    pub lens_2d: i32,
    pub fnuz: i32,
    pub max_blocks: i32,
    pub table_stride: i32,
    pub max_model_len: i32,
    pub num_workers: i32,
}

/// Classifies a CUDA error string: out of memory is a skip, anything else a fault.
pub fn failure(e: String) -> GpuFailure {
    if e.contains("OUT_OF_MEMORY") {
        GpuFailure::OutOfMemory(e)
    } else {
        GpuFailure::Fault(e)
    }
}

/// Allocation whose failure means "does not fit".
pub(super) fn alloc(bytes: u64) -> Result<DeviceMemory, GpuFailure> {
    DeviceMemory::alloc(bytes).map_err(|e| {
        if e.contains("OUT_OF_MEMORY") {
            GpuFailure::OutOfMemory(format!("allocating {bytes} bytes: {e}"))
        } else {
            GpuFailure::Fault(e)
        }
    })
}

/// How the kernel sees the KV cache, and so how a run proves it left the cache alone
/// (the other inputs are hashed before and after either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheView {
    /// Writable; after the run every word of the mapped cache is read (each still the
    /// poison, the stored blocks still their bytes): ~8 ms for a 32 GiB pool.
    ReadBack,
    /// Through a read-only mapping of the same memory: a store into it faults (the
    /// process's context is lost, so the run is a crash), and nothing is read after.
    ReadOnly,
}

/// A case laid out on the device: its inputs, its poisoned KV cache and output.
pub struct DeviceCase {
    /// Raw output including guards; element (0,0) at `GUARD_ELEMS` elements.
    pub out: DeviceSpan,
    pub kv: DeviceSpan,
    pub q: DeviceMemory,
    pub weights: DeviceMemory,
    pub table: DeviceMemory,
    pub lens: DeviceMemory,
    pub decode: DeviceMemory,
    pub params: Params,
    /// Device bytes this case occupies.
    pub bytes: u64,
    /// How the keys got there: drawn on the device from the case's recipe, or copied.
    pub keys_drawn_on_device: bool,
    /// Seconds of each step of laying the case out, in order.
    pub upload_phases: Vec<(&'static str, f64)>,
    /// Bytes of the cache poisoned for this case (the rest held the poison already).
    pub poisoned_bytes: u64,
    /// How the kernel sees the cache (`params.kv` points into that view).
    pub view: CacheView,
    /// The poison's layout in a block.
    poison: PoisonTag,
    num_blocks: u64,
    block_bytes: u64,
    /// Declared last: the spans above point into it until it is dropped. It holds the
    /// stored blocks' bitmap (one bit per block of the pool).
    lease: Lease,
}

pub(super) fn pad16(n: u64) -> u64 {
    n.div_ceil(16) * 16
}

/// The cache's bytes rounded to whole 256-byte units (the allocation's alignment).
fn pad256(n: u64) -> u64 {
    n.div_ceil(256) * 256
}

/// Host-side i32 copies of the lengths (what the libraries take), or why not (the
/// table is int32 already).
fn i32_lens(case: &Case) -> Result<Vec<i32>, String> {
    let lens: Vec<i64> = match &case.context_lens {
        ContextLens::PerSequence(v) => v.clone(),
        ContextLens::PerToken(v) => v.iter().flatten().copied().collect(),
    };
    let lens = lens
        .into_iter()
        .map(|l| i32::try_from(l).map_err(|_| format!("context length {l} does not fit int32")))
        .collect::<Result<_, _>>()?;
    Ok(lens)
}

/// The decode tables of both formats (fn then fnuz), as the CPU decodes.
fn decode_tables() -> Vec<f32> {
    let mut t = Fp8Format::E4m3fn.table().to_vec();
    t.extend_from_slice(Fp8Format::E4m3fnuz.table());
    t
}

/// A small input buffer holding `data`, zero-padded to 16 bytes.
pub(super) fn small<T: Copy>(data: &[T]) -> Result<DeviceMemory, GpuFailure> {
    let m = alloc(pad16(std::mem::size_of_val(data) as u64))?;
    m.memset(0).map_err(failure)?;
    m.upload(0, data).map_err(failure)?;
    Ok(m)
}

/// Whether the device draws this case's keys (`kernels/generate.cu`): a drawn cache of
/// pipeline values the device generator takes.
pub fn keys_drawn_on_device(case: &Case) -> bool {
    case.kv
        .drawn_values()
        .is_some_and(|(v, _)| v.kind == ValueKind::Pipeline)
        && super::generate::rejects(&case.shape).is_none()
}

impl DeviceCase {
    /// Lays `case` out on the device with the harness's poisoned `out` (copied unless it
    /// is still pristine: then poisoned on the device).
    pub fn upload(
        gpu: &mut Gpu,
        case: &Case,
        out: &OutputBuffer,
        view: CacheView,
    ) -> Result<DeviceCase, GpuFailure> {
        let raw = (!out.is_pristine()).then(|| out.raw().0);
        Self::lay_out(gpu, case, raw, view)
    }

    /// Lays `case` out on the device with an output poisoned there (nothing crosses
    /// from the host for it).
    pub fn upload_poisoned(
        gpu: &mut Gpu,
        case: &Case,
        view: CacheView,
    ) -> Result<DeviceCase, GpuFailure> {
        Self::lay_out(gpu, case, None, view)
    }

    fn lay_out(
        gpu: &mut Gpu,
        case: &Case,
        raw_out: Option<&[f32]>,
        view: CacheView,
    ) -> Result<DeviceCase, GpuFailure> {
        let s = &case.shape;
        let lens = i32_lens(case).map_err(GpuFailure::OutOfMemory)?;
        let out_elems = OutputBuffer::raw_len(case.rows(), case.out_row_stride) as u64;
        let kv_bytes = case.kv_cache_bytes();
        let values_end = (s.block_size * s.head_dim) as u64;
        let tag = PoisonTag {
            nan_word: match s.format {
                Fp8Format::E4m3fn => 0x7F7F_7F7Fu32,
                Fp8Format::E4m3fnuz => 0x8080_8080u32,
            },
            stride: case.kv_block_stride,
            values_end,
            scales_end: values_end + 4 * s.block_size as u64,
        };
        let stride = case.kv_block_stride;
        let (mut lease, stats) = Lease::take(gpu, out_elems * 4, pad256(kv_bytes), tag)?;
        let mut phases = vec![
            ("map the buffers", stats.map_secs),
            ("poison the cache", stats.poison_secs),
        ];
        let mut lap = std::time::Instant::now();
        let mut step = |name: &'static str, gpu: &Gpu| -> Result<(), GpuFailure> {
            gpu.ctx.synchronize().map_err(failure)?;
            phases.push((name, lap.elapsed().as_secs_f64()));
            lap = std::time::Instant::now();
            Ok(())
        };
        let out_span = DeviceSpan {
            ptr: lease.out().base(),
            bytes: out_elems * 4,
        };
        match raw_out {
            Some(raw) => out_span.upload(0, raw).map_err(failure)?,
            None => out_span.fill_u32(POISON_BITS).map_err(failure)?,
        }
        let kv = DeviceSpan {
            ptr: lease.kv().base(),
            bytes: pad256(kv_bytes),
        };
        let mut bits = vec![0u32; (case.num_blocks as usize).div_ceil(32).max(1)];
        for id in case.kv.ids() {
            bits[(id / 32) as usize] |= 1 << (id % 32);
        }
        lease.stored = Some((small(&bits)?, case.num_blocks, tag));
        step("poison the output", gpu)?;
        let drawn_here = keys_drawn_on_device(case);
        if drawn_here {
            let (values, _) = case.kv.drawn_values().expect("checked above");
            let unique = case.kv.drawn_unique().expect("a drawn cache");
            let ids: Vec<u64> = unique.iter().map(|&(id, _)| id).collect();
            let index: Vec<u64> = unique.iter().map(|&(_, l)| l as u64).collect();
            super::generate::blocks_in_place(gpu, s, values.seed, kv.ptr, stride, &ids, &index)?;
            step("keys (drawn on the device)", gpu)?;
        } else {
            Self::copy_blocks(gpu, case, kv.ptr)?;
            step("keys (copied)", gpu)?;
        }
        let q = small(&case.q)?;
        let weights = small(&case.weights)?;
        // A compact table (its padding a rule, as sent or as generated) is made whole
        // here, on the device.
        let table_mem = if case.block_table.is_compact() {
            super::generate::whole_table(gpu, &case.block_table)?
        } else {
            small(&case.block_table.entries)?
        };
        let mut lens_padded = lens;
        lens_padded.resize(lens_padded.len() + 64, 0);
        let lens_mem = small(&lens_padded)?;
        let decode = small(&decode_tables())?;
        // Without a read-only view (the device refused one), the cache is read back.
        let (view, kernel_kv) = match (view, lease.kv().read_only_base()) {
            (CacheView::ReadOnly, Some(ro)) => (CacheView::ReadOnly, ro),
            _ => (CacheView::ReadBack, kv.ptr),
        };
        let params = Params {
            q: q.ptr(),
            weights: weights.ptr(),
            kv: kernel_kv,
            table: table_mem.ptr(),
            lens: lens_mem.ptr(),
            out: out_span.ptr + GUARD_ELEMS as u64 * 4,
            decode: decode.ptr(),
            kv_bytes,
            kv_stride: stride,
            out_stride: case.out_row_stride as i64,
            batch: s.batch as i32,
            next_n: s.next_n as i32,
            heads: s.heads as i32,
            head_dim: s.head_dim as i32,
            block_size: s.block_size as i32,
            layout: match s.layout {
                ValueLayout::Normal => 0,
                ValueLayout::Shuffle16 => 1,
            },
            lens_2d: case.context_lens.is_2d() as i32,
            fnuz: (s.format == Fp8Format::E4m3fnuz) as i32,
            max_blocks: case.block_table.max_blocks as i32,
            table_stride: case.block_table.row_stride as i32,
            max_model_len: case.max_model_len as i32,
            num_workers: 1,
        };
        let bytes = out_span.bytes
            + kv.bytes
            + q.bytes()
            + weights.bytes()
            + table_mem.bytes()
            + lens_mem.bytes()
            + decode.bytes();
        step("small inputs", gpu)?;
        Ok(DeviceCase {
            out: out_span,
            kv,
            q,
            weights,
            table: table_mem,
            lens: lens_mem,
            decode,
            params,
            bytes,
            keys_drawn_on_device: drawn_here,
            upload_phases: phases,
            poisoned_bytes: stats.poisoned_bytes,
            view,
            poison: tag,
            num_blocks: case.num_blocks,
            block_bytes: s.block_bytes() as u64,
            lease,
        })
    }

    /// The stored (or host-drawn) blocks, packed, uploaded and scattered to their slots.
    fn copy_blocks(gpu: &mut Gpu, case: &Case, kv: u64) -> Result<(), GpuFailure> {
        let s = &case.shape;
        let block_bytes = s.block_bytes() as u64;
        let ids = case.kv.ids();
        if ids.is_empty() {
            return Ok(());
        }
        let util_scatter = gpu
            .function(Program::Util, "scatter_blocks", &vec![])
            .map_err(GpuFailure::Environment)?;
        let mut packed = Vec::with_capacity(ids.len() * block_bytes as usize);
        for (_, b) in case.kv.iter() {
            packed.extend_from_slice(b);
        }
        let packed_mem = alloc(pad16(packed.len() as u64))?;
        packed_mem.upload(0, &packed).map_err(failure)?;
        let ids_mem = small(&ids)?;
        let grid = (ids.len() as u64).clamp(1, 65535) as u32;
        launch(
            &util_scatter,
            (grid, 1, 1),
            128,
            0,
            &mut [
                &mut kv.clone(),
                &mut packed_mem.ptr(),
                &mut ids_mem.ptr(),
                &mut (ids.len() as u64),
                &mut case.kv_block_stride.clone(),
                &mut block_bytes.clone(),
            ],
        )?;
        gpu.ctx.synchronize().map_err(failure)
    }

    /// What the run must leave as it found: hashes of q, weights, table and lengths,
    /// of the stored blocks, and the count of the cache's other words that are no
    /// longer the poison. `whole_cache`: read the whole mapped cache (after the run;
    /// when nothing changed, the next case re-poisons only the stored blocks); else
    /// only the stored blocks (before it, right after they were written: the rest is
    /// the poison), so the pool is read once per case, not twice. A cache the kernel
    /// saw read-only is not read at all (its words stay zero): the run could not
    /// change it.
    pub fn input_hashes(
        &mut self,
        gpu: &mut Gpu,
        whole_cache: bool,
    ) -> Result<Vec<u64>, GpuFailure> {
        let f = gpu
            .function(Program::Util, "hash_words", &vec![])
            .map_err(GpuFailure::Environment)?;
        let acc = alloc(8 * 6)?;
        acc.memset(0).map_err(failure)?;
        let bufs = [
            (self.q.ptr(), self.q.bytes()),
            (self.weights.ptr(), self.weights.bytes()),
            (self.table.ptr(), self.table.bytes()),
            (self.lens.ptr(), self.lens.bytes()),
        ];
        for (k, (ptr, bytes)) in bufs.into_iter().enumerate() {
            let words = bytes / 4;
            let grid = (words / 256).clamp(1, 4 * gpu.sms as u64 * 8) as u32;
            launch(
                &f,
                (grid, 1, 1),
                256,
                0,
                &mut [
                    &mut ptr.clone(),
                    &mut words.clone(),
                    &mut (acc.ptr() + 8 * k as u64),
                ],
            )?;
        }
        let t = self.poison;
        let end = self.lease.kv().mapped_bytes();
        let stored = self
            .lease
            .stored
            .as_ref()
            .expect("set when laid out")
            .0
            .ptr();
        if self.view == CacheView::ReadOnly {
            // Nothing to read: a store would have faulted.
        } else if whole_cache && t.stride.is_multiple_of(16) {
            // The whole span streamed (`verify_kv_stream`): the same counts and hash.
            let stream = gpu
                .function(Program::Util, "verify_kv_stream", &vec![])
                .map_err(GpuFailure::Environment)?;
            launch(
                &stream,
                (gpu.sms * 8, 1, 1),
                256,
                0,
                &mut [
                    &mut self.kv.ptr.clone(),
                    &mut end.clone(),
                    &mut t.stride.clone(),
                    &mut t.values_end.clone(),
                    &mut t.scales_end.clone(),
                    &mut t.nan_word.clone(),
                    &mut self.block_bytes.clone(),
                    &mut stored.clone(),
                    &mut self.num_blocks.clone(),
                    &mut STREAM_WINDOW.clone(),
                    &mut (acc.ptr() + 8 * 4),
                ],
            )?;
        } else {
            self.launch_verify_kv(gpu, whole_cache, end, stored, acc.ptr() + 8 * 4)?;
        }
        let mut h = vec![0u64; 6];
        acc.download(0, &mut h).map_err(failure)?;
        if whole_cache {
            self.lease.clean = self.view == CacheView::ReadOnly || h[4] == 0;
        }
        Ok(h)
    }

    /// `verify_kv`: the whole span a block per warp, or only the stored blocks' bytes.
    fn launch_verify_kv(
        &self,
        gpu: &mut Gpu,
        whole_cache: bool,
        end: u64,
        stored: u64,
        counts: u64,
    ) -> Result<(), GpuFailure> {
        let verify = gpu
            .function(Program::Util, "verify_kv", &vec![])
            .map_err(GpuFailure::Environment)?;
        let t = self.poison;
        let blocks = end.div_ceil(t.stride);
        let grid = if whole_cache {
            blocks.div_ceil(8).clamp(1, 8 * 65535)
        } else {
            // A warp per bitmap word (32 blocks), a few waves of them.
            blocks.div_ceil(32 * 8).clamp(1, gpu.sms as u64 * 16)
        } as u32;
        launch(
            &verify,
            (grid, 1, 1),
            256,
            0,
            &mut [
                &mut self.kv.ptr.clone(),
                &mut end.clone(),
                &mut t.stride.clone(),
                &mut t.values_end.clone(),
                &mut t.scales_end.clone(),
                &mut t.nan_word.clone(),
                &mut self.block_bytes.clone(),
                &mut stored.clone(),
                &mut self.num_blocks.clone(),
                &mut (!whole_cache as i32),
                &mut counts.clone(),
            ],
        )
    }

    /// Bytes of the cache's address range mapped for this case (its bytes rounded up to
    /// whole chunks; all of them poisoned and verified).
    pub fn cache_mapped_bytes(&self) -> u64 {
        self.lease.kv().mapped_bytes()
    }

    /// Copies the whole output (guards included) back into `out`.
    pub fn download_output(&self, out: &mut OutputBuffer) -> Result<(), GpuFailure> {
        let (raw, _) = out.raw_mut();
        self.out.download(0, raw).map_err(failure)
    }
}

/// Bytes of the cache one warp of `verify_kv_stream` reads in a row: the warps in flight
/// together read about a hundred 2 MiB pages of it at a time.
const STREAM_WINDOW: u64 = 32 << 10;

/// Launches with scalar arguments given as mutable references of their exact types.
pub fn launch(
    f: &Function,
    grid: (u32, u32, u32),
    block: u32,
    smem: u32,
    args: &mut [&mut dyn ArgPtr],
) -> Result<(), GpuFailure> {
    let mut ptrs: Vec<*mut c_void> = args.iter_mut().map(|a| a.arg_ptr()).collect();
    // SAFETY: every call site passes arguments in the kernel's exact order and types
    // (checked against kernels/*.cu), and the buffers they point to outlive the
    // synchronize that follows every launch sequence.
    unsafe { f.launch(grid, block, smem, &mut ptrs) }.map_err(failure)
}

/// A value that can be passed as a kernel argument (its address).
pub trait ArgPtr {
    fn arg_ptr(&mut self) -> *mut c_void;
}

macro_rules! arg_ptr {
    ($($t:ty),*) => {$(
        impl ArgPtr for $t {
            fn arg_ptr(&mut self) -> *mut c_void {
                self as *mut $t as *mut c_void
            }
        }
    )*};
}
arg_ptr!(u64, u32, i32, i64, f32, Params);
