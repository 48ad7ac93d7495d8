//! A case on the device, laid out as production lays it out: the KV cache at its full
//! declared size (`num_blocks * kv_block_stride`, several GiB for high block ids) with
//! every byte the table does not reference poisoned exactly as
//! [`crate::kernel::cpu::poison_byte`] (by a device kernel: host copies of GiBs would
//! dominate the run), the referenced blocks copied to their slots, and the harness's
//! poisoned output buffer copied whole, guard zones included, so out-of-bounds
//! stores land in memory the oracle inspects. Inputs are hashed on the device before
//! and after the launch to detect writes to them.

use super::compile::Program;
use super::device::{Gpu, GpuFailure};
use super::sys::{DeviceMemory, Function};
use crate::case::{Case, ContextLens, ValueLayout};
use crate::fp8::Fp8Format;
use crate::kernel::OutputBuffer;
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

pub struct DeviceCase {
    /// Raw output including guards; element (0,0) at `out_base` elements.
    pub out: DeviceMemory,
    pub kv: DeviceMemory,
    pub q: DeviceMemory,
    pub weights: DeviceMemory,
    pub table: DeviceMemory,
    pub lens: DeviceMemory,
    pub decode: DeviceMemory,
    pub params: Params,
    /// Device bytes this case occupies.
    pub bytes: u64,
}

fn pad16(n: u64) -> u64 {
    n.div_ceil(16) * 16
}

/// Host-side i32 copies of the table and lengths (what the libraries take), or why not.
fn i32_inputs(case: &Case) -> Result<(Vec<i32>, Vec<i32>), String> {
    let table: Vec<i32> = case
        .block_table
        .entries
        .iter()
        .map(|&e| i32::try_from(e).map_err(|_| format!("block table entry {e} does not fit int32")))
        .collect::<Result<_, _>>()?;
    let lens: Vec<i64> = match &case.context_lens {
        ContextLens::PerSequence(v) => v.clone(),
        ContextLens::PerToken(v) => v.iter().flatten().copied().collect(),
    };
    let lens = lens
        .into_iter()
        .map(|l| i32::try_from(l).map_err(|_| format!("context length {l} does not fit int32")))
        .collect::<Result<_, _>>()?;
    Ok((table, lens))
}

/// The decode tables of both formats (fn then fnuz), as the CPU decodes.
fn decode_tables() -> Vec<f32> {
    let mut t = Fp8Format::E4m3fn.table().to_vec();
    t.extend_from_slice(Fp8Format::E4m3fnuz.table());
    t
}

impl DeviceCase {
    /// Device memory the case needs (before allocating), for the fit check.
    pub fn bytes_needed(case: &Case, out: &OutputBuffer) -> u64 {
        let (raw, _) = out.raw();
        (raw.len() as u64 * 4)
            + case.kv_cache_bytes()
            + case.q.len() as u64
            + case.weights.len() as u64 * 4
            + case.block_table.entries.len() as u64 * 4
            + 4 * (case.rows() as u64 + 64)
            + 4096
    }

    /// Uploads `case` and the poisoned `out`.
    pub fn upload(
        gpu: &mut Gpu,
        case: &Case,
        out: &OutputBuffer,
    ) -> Result<DeviceCase, GpuFailure> {
        let s = &case.shape;
        let (table, lens) = i32_inputs(case).map_err(GpuFailure::OutOfMemory)?;
        let need = Self::bytes_needed(case, out);
        let (free, total) = gpu.ctx.mem_info().map_err(GpuFailure::Fault)?;
        // Leave room for the schedule, hashes and module images.
        if need + (256 << 20) > free {
            return Err(GpuFailure::OutOfMemory(format!(
                "case needs {:.2} GiB of device memory, {:.2} of {:.2} GiB free",
                need as f64 / (1u64 << 30) as f64,
                free as f64 / (1u64 << 30) as f64,
                total as f64 / (1u64 << 30) as f64
            )));
        }
        // The output first: its 32-bit-wrapped addresses then point below it, outside
        // every allocation of ours, as in a real engine where it is one of many buffers.
        let (raw, base) = out.raw();
        let out_mem = alloc(raw.len() as u64 * 4)?;
        out_mem.upload(0, raw).map_err(failure)?;

        let kv_bytes = case.kv_cache_bytes();
        let kv = alloc(pad16(kv_bytes))?;
        let util_poison = gpu
            .function(Program::Util, "poison_kv", &vec![])
            .map_err(GpuFailure::Environment)?;
        let util_scatter = gpu
            .function(Program::Util, "scatter_blocks", &vec![])
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
                &mut kv.ptr(),
                &mut case.num_blocks.clone(),
                &mut stride.clone(),
                &mut values_end.clone(),
                &mut scales_end.clone(),
                &mut nan.clone(),
            ],
        )?;
        // Referenced blocks, packed, then scattered to their slots.
        let block_bytes = s.block_bytes() as u64;
        let ids: Vec<u64> = case.kv.blocks.keys().copied().collect();
        if !ids.is_empty() {
            let mut packed = Vec::with_capacity(ids.len() * block_bytes as usize);
            for b in case.kv.blocks.values() {
                packed.extend_from_slice(b);
            }
            let packed_mem = alloc(pad16(packed.len() as u64))?;
            packed_mem.upload(0, &packed).map_err(failure)?;
            let ids_mem = alloc(ids.len() as u64 * 8)?;
            ids_mem.upload(0, &ids).map_err(failure)?;
            let grid = (ids.len() as u64).clamp(1, 65535) as u32;
            launch(
                &util_scatter,
                (grid, 1, 1),
                128,
                0,
                &mut [
                    &mut kv.ptr(),
                    &mut packed_mem.ptr(),
                    &mut ids_mem.ptr(),
                    &mut (ids.len() as u64),
                    &mut stride.clone(),
                    &mut block_bytes.clone(),
                ],
            )?;
            gpu.ctx.synchronize().map_err(failure)?;
        }
        let q = alloc(pad16(case.q.len() as u64))?;
        q.memset(0).map_err(failure)?;
        q.upload(0, &case.q).map_err(failure)?;
        let weights = alloc(pad16(case.weights.len() as u64 * 4))?;
        weights.memset(0).map_err(failure)?;
        weights.upload(0, &case.weights).map_err(failure)?;
        let table_mem = alloc(pad16(table.len() as u64 * 4))?;
        table_mem.memset(0).map_err(failure)?;
        table_mem.upload(0, &table).map_err(failure)?;
        let lens_mem = alloc(pad16((lens.len() as u64 + 64) * 4))?;
        lens_mem.memset(0).map_err(failure)?;
        lens_mem.upload(0, &lens).map_err(failure)?;
        let decode = alloc(512 * 4)?;
        decode.upload(0, &decode_tables()).map_err(failure)?;
        let params = Params {
            q: q.ptr(),
            weights: weights.ptr(),
            kv: kv.ptr(),
            table: table_mem.ptr(),
            lens: lens_mem.ptr(),
            out: out_mem.ptr() + base as u64 * 4,
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
        let bytes = out_mem.bytes()
            + kv.bytes()
            + q.bytes()
            + weights.bytes()
            + table_mem.bytes()
            + lens_mem.bytes()
            + decode.bytes();
        Ok(DeviceCase {
            out: out_mem,
            kv,
            q,
            weights,
            table: table_mem,
            lens: lens_mem,
            decode,
            params,
            bytes,
        })
    }

    /// Hashes of every input buffer (q, weights, table, lengths, the whole KV cache).
    pub fn input_hashes(&self, gpu: &mut Gpu) -> Result<Vec<u64>, GpuFailure> {
        let f = gpu
            .function(Program::Util, "hash_words", &vec![])
            .map_err(GpuFailure::Environment)?;
        let acc = alloc(8 * 5)?;
        acc.memset(0).map_err(failure)?;
        let bufs = [&self.q, &self.weights, &self.table, &self.lens, &self.kv];
        for (k, b) in bufs.iter().enumerate() {
            let words = b.bytes() / 4;
            let grid = (words / 256).clamp(1, 4 * gpu.sms as u64 * 8) as u32;
            launch(
                &f,
                (grid, 1, 1),
                256,
                0,
                &mut [
                    &mut b.ptr(),
                    &mut words.clone(),
                    &mut (acc.ptr() + 8 * k as u64),
                ],
            )?;
        }
        let mut h = vec![0u64; 5];
        acc.download(0, &mut h).map_err(failure)?;
        Ok(h)
    }

    /// Copies the whole output allocation (guards included) back into `out`.
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
