//! A case on the device, laid out as production lays it out: the KV cache at its full
//! declared size (`num_blocks * kv_block_stride`, several GiB for high block ids) with
//! every byte the table does not reference poisoned exactly as
//! [`crate::kernel::cpu::poison_byte`] (by a device kernel: host copies of GiBs would
//! dominate the run), the referenced blocks drawn in their slots by the device twin of
//! the value generator (pipeline values) or copied there, and the output buffer
//! poisoned on the device (or the harness's copied whole, guard zones included), so
//! out-of-bounds stores land in memory the oracle inspects. Inputs are hashed on the
//! device before and after the launch to detect writes to them. The two large
//! allocations are kept between cases (an arena; see [`Arena`]).

use super::compile::Program;
use super::device::{Gpu, GpuFailure};
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
fn alloc(bytes: u64) -> Result<DeviceMemory, GpuFailure> {
    DeviceMemory::alloc(bytes).map_err(|e| {
        if e.contains("OUT_OF_MEMORY") {
            GpuFailure::OutOfMemory(format!("allocating {bytes} bytes: {e}"))
        } else {
            GpuFailure::Fault(e)
        }
    })
}

/// The output and KV allocations a process keeps for the next case of the same sizes (a
/// property's re-run, the cases of a shape): a case borrows them ([`Lease`]) and gives
/// them back when its [`DeviceCase`] is dropped. A case of other sizes frees both and
/// allocates both exactly, the output first, as every case did before there was an
/// arena: where a wild access lands (a 32-bit-wrapped output offset writes below the
/// output, outside every allocation of ours, and faults) must not depend on the cases
/// run before, or a shrunk crash would not replay in a fresh worker (seen on the H200
/// with allocations reused at any larger size: `cuda:bug-offset32-out`'s saved crash
/// replayed as a clean run).
struct Arena {
    out: Option<DeviceMemory>,
    kv: Option<DeviceMemory>,
}

static ARENA: std::sync::Mutex<Arena> = std::sync::Mutex::new(Arena {
    out: None,
    kv: None,
});

/// The arena's allocations lent to one case (or allocations of its own while another
/// case holds the arena).
struct Lease {
    out: Option<DeviceMemory>,
    kv: Option<DeviceMemory>,
}

impl Lease {
    /// Allocations of exactly `out_bytes` and `kv_bytes`: the held ones when they are
    /// those sizes, else both allocated again (see [`Arena`] for why exactly).
    fn take(gpu: &Gpu, out_bytes: u64, kv_bytes: u64) -> Result<Lease, GpuFailure> {
        let (out, kv) = {
            let mut a = ARENA.lock().unwrap_or_else(|p| p.into_inner());
            (a.out.take(), a.kv.take())
        };
        let cap = |m: &Option<DeviceMemory>| m.as_ref().map_or(0, |m| m.bytes());
        if cap(&out) == out_bytes && cap(&kv) == kv_bytes {
            return Ok(Lease { out, kv });
        }
        drop(out);
        drop(kv);
        let (free, total) = gpu.ctx.mem_info().map_err(GpuFailure::Fault)?;
        // Leave room for the small inputs, the reference, hashes and module images.
        let reserve = 256 << 20;
        let (o, k) = if out_bytes + kv_bytes + reserve <= free {
            (out_bytes, kv_bytes)
        } else {
            return Err(GpuFailure::OutOfMemory(format!(
                "case needs {:.2} GiB of device memory, {:.2} of {:.2} GiB free",
                (out_bytes + kv_bytes) as f64 / (1u64 << 30) as f64,
                free as f64 / (1u64 << 30) as f64,
                total as f64 / (1u64 << 30) as f64
            )));
        };
        let out = alloc(o)?;
        let kv = alloc(k)?;
        Ok(Lease {
            out: Some(out),
            kv: Some(kv),
        })
    }

    fn out(&self) -> &DeviceMemory {
        self.out.as_ref().expect("held until drop")
    }

    fn kv(&self) -> &DeviceMemory {
        self.kv.as_ref().expect("held until drop")
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut a = ARENA.lock().unwrap_or_else(|p| p.into_inner());
        // A case that ran while this one held the arena may have refilled it: then
        // ours are freed here.
        if a.out.is_none() && a.kv.is_none() {
            a.out = self.out.take();
            a.kv = self.kv.take();
        }
    }
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
    /// One bit per block of the cache: a stored block (the rest holds the poison).
    stored_bits: DeviceMemory,
    /// The poison's layout in a block: `values_end`, `scales_end`, the fp8 NaN word.
    poison: (u64, u64, u32),
    num_blocks: u64,
    block_bytes: u64,
    /// Declared last: the spans above point into it until it is dropped.
    _lease: Lease,
}

fn pad16(n: u64) -> u64 {
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
fn small<T: Copy>(data: &[T]) -> Result<DeviceMemory, GpuFailure> {
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
    ) -> Result<DeviceCase, GpuFailure> {
        let raw = (!out.is_pristine()).then(|| out.raw().0);
        Self::lay_out(gpu, case, raw)
    }

    /// Lays `case` out on the device with an output poisoned there (nothing crosses
    /// from the host for it).
    pub fn upload_poisoned(gpu: &mut Gpu, case: &Case) -> Result<DeviceCase, GpuFailure> {
        Self::lay_out(gpu, case, None)
    }

    fn lay_out(
        gpu: &mut Gpu,
        case: &Case,
        raw_out: Option<&[f32]>,
    ) -> Result<DeviceCase, GpuFailure> {
        let s = &case.shape;
        let lens = i32_lens(case).map_err(GpuFailure::OutOfMemory)?;
        let out_elems = OutputBuffer::raw_len(case.rows(), case.out_row_stride) as u64;
        let kv_bytes = case.kv_cache_bytes();
        let lease = Lease::take(gpu, out_elems * 4, pad256(kv_bytes))?;
        let out_span = DeviceSpan::of(lease.out(), 0, out_elems * 4);
        match raw_out {
            Some(raw) => out_span.upload(0, raw).map_err(failure)?,
            None => out_span.fill_u32(POISON_BITS).map_err(failure)?,
        }
        let kv = DeviceSpan::of(lease.kv(), 0, pad256(kv_bytes));

        let util_poison = gpu
            .function(Program::Util, "poison_kv", &vec![])
            .map_err(GpuFailure::Environment)?;
        let values_end = (s.block_size * s.head_dim) as u64;
        let scales_end = values_end + 4 * s.block_size as u64;
        let nan = match s.format {
            Fp8Format::E4m3fn => 0x7F7F_7F7Fu32,
            Fp8Format::E4m3fnuz => 0x8080_8080u32,
        };
        let stride = case.kv_block_stride;
        let grid = case.num_blocks.clamp(1, 65535) as u32;
        launch(
            &util_poison,
            (grid, 1, 1),
            256,
            0,
            &mut [
                &mut kv.ptr.clone(),
                &mut case.num_blocks.clone(),
                &mut stride.clone(),
                &mut values_end.clone(),
                &mut scales_end.clone(),
                &mut nan.clone(),
            ],
        )?;
        let mut bits = vec![0u32; (case.num_blocks as usize).div_ceil(32).max(1)];
        for id in case.kv.ids() {
            bits[(id / 32) as usize] |= 1 << (id % 32);
        }
        let stored_bits = small(&bits)?;
        let drawn_here = keys_drawn_on_device(case);
        if drawn_here {
            let (values, _) = case.kv.drawn_values().expect("checked above");
            let unique = case.kv.drawn_unique().expect("a drawn cache");
            let ids: Vec<u64> = unique.iter().map(|&(id, _)| id).collect();
            let index: Vec<u64> = unique.iter().map(|&(_, l)| l as u64).collect();
            super::generate::blocks_in_place(gpu, s, values.seed, kv.ptr, stride, &ids, &index)?;
        } else {
            Self::copy_blocks(gpu, case, kv.ptr)?;
        }
        let q = small(&case.q)?;
        let weights = small(&case.weights)?;
        let table_mem = small(&case.block_table.entries)?;
        let mut lens_padded = lens;
        lens_padded.resize(lens_padded.len() + 64, 0);
        let lens_mem = small(&lens_padded)?;
        let decode = small(&decode_tables())?;
        let params = Params {
            q: q.ptr(),
            weights: weights.ptr(),
            kv: kv.ptr,
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
        gpu.ctx.synchronize().map_err(failure)?;
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
            stored_bits,
            poison: (values_end, scales_end, nan),
            num_blocks: case.num_blocks,
            block_bytes: s.block_bytes() as u64,
            _lease: lease,
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
    /// longer the poison. `whole_cache`: read the whole cache (after the run); else only
    /// the stored blocks (before it, right after they were written: the rest is the
    /// poison just written), so the pool is read once per case, not twice.
    pub fn input_hashes(&self, gpu: &mut Gpu, whole_cache: bool) -> Result<Vec<u64>, GpuFailure> {
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
        let verify = gpu
            .function(Program::Util, "verify_kv", &vec![])
            .map_err(GpuFailure::Environment)?;
        let (values_end, scales_end, nan) = self.poison;
        let grid = self.num_blocks.div_ceil(8).clamp(1, 8 * 65535) as u32;
        launch(
            &verify,
            (grid, 1, 1),
            256,
            0,
            &mut [
                &mut self.kv.ptr.clone(),
                &mut self.num_blocks.clone(),
                &mut self.params.kv_stride.clone(),
                &mut values_end.clone(),
                &mut scales_end.clone(),
                &mut nan.clone(),
                &mut self.block_bytes.clone(),
                &mut self.stored_bits.ptr(),
                &mut (!whole_cache as i32),
                &mut (acc.ptr() + 8 * 4),
            ],
        )?;
        let mut h = vec![0u64; 6];
        acc.download(0, &mut h).map_err(failure)?;
        Ok(h)
    }

    /// Copies the whole output (guards included) back into `out`.
    pub fn download_output(&self, out: &mut OutputBuffer) -> Result<(), GpuFailure> {
        let (raw, _) = out.raw_mut();
        self.out.download(0, raw).map_err(failure)
    }
}

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
