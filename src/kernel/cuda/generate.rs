//! The value generator on the device (kernels/generate.cu): pipeline queries, weights
//! and KV blocks drawn straight into device memory from the case's value seed, the
//! very bytes `generate::values` draws on the CPU (`gpu-selfcheck` compares them).

use super::compile::Program;
use super::device::{Gpu, GpuFailure};
use super::memory::{failure, launch, ArgPtr};
use super::sys::DeviceMemory;
use crate::case::{BlockTable, Shape, TailRule, ValueLayout};
use crate::fp8::Fp8Format;
use crate::generate::philox;

/// Why the device generator cannot draw a shape's tokens (a key token is staged in
/// 128 bytes of registers).
pub fn rejects(shape: &Shape) -> Option<String> {
    (shape.head_dim > 128)
        .then(|| format!("device generator takes D <= 128, got {}", shape.head_dim))
}

fn table(_gpu: &mut Gpu) -> Result<DeviceMemory, GpuFailure> {
    let t = philox::gauss_table();
    let mem = DeviceMemory::alloc(2 * t.len() as u64).map_err(failure)?;
    mem.upload(0, &t[..]).map_err(failure)?;
    Ok(mem)
}

/// Launches kernel `name` of generate.cu with one thread per item, and waits for it.
fn run(
    gpu: &mut Gpu,
    name: &str,
    items: usize,
    args: &mut [&mut dyn ArgPtr],
) -> Result<(), GpuFailure> {
    let f = gpu
        .function(Program::Generate, name, &Vec::new())
        .map_err(GpuFailure::Environment)?;
    let blocks = (items as u32).div_ceil(128).max(1);
    launch(&f, (blocks, 1, 1), 128, 0, args)?;
    gpu.ctx.synchronize().map_err(failure)
}

fn fnuz(shape: &Shape) -> i32 {
    (shape.format == Fp8Format::E4m3fnuz) as i32
}

/// Pipeline queries (`rows × H × D` codes) and weights (`rows × H`) of value seed `seed`.
pub fn pipeline_rows(
    gpu: &mut Gpu,
    shape: &Shape,
    seed: u64,
) -> Result<(Vec<u8>, Vec<f32>), GpuFailure> {
    let (rows, h, d) = (shape.rows(), shape.heads, shape.head_dim);
    let table = table(gpu)?;
    let q = DeviceMemory::alloc((rows * h * d).max(1) as u64).map_err(failure)?;
    let w = DeviceMemory::alloc((rows * h * 4).max(4) as u64).map_err(failure)?;
    let mut args = (
        seed,
        rows as i32,
        h as i32,
        d as i32,
        fnuz(shape),
        crate::generate::values::head_scale(shape),
    );
    run(
        gpu,
        "pipeline_rows",
        rows * h,
        &mut [
            &mut args.0,
            &mut args.1,
            &mut args.2,
            &mut args.3,
            &mut args.4,
            &mut args.5,
            &mut table.ptr(),
            &mut q.ptr(),
            &mut w.ptr(),
        ],
    )?;
    let mut qh = vec![0u8; rows * h * d];
    let mut wh = vec![0f32; rows * h];
    q.download(0, &mut qh).map_err(failure)?;
    w.download(0, &mut wh).map_err(failure)?;
    Ok((qh, wh))
}

/// The first `n_blocks` pipeline KV blocks of value seed `seed`, each `block_bytes()`.
pub fn pipeline_blocks(
    gpu: &mut Gpu,
    shape: &Shape,
    seed: u64,
    n_blocks: usize,
) -> Result<Vec<u8>, GpuFailure> {
    let bytes = shape.block_bytes();
    let table = table(gpu)?;
    let out = DeviceMemory::alloc((n_blocks * bytes).max(1) as u64).map_err(failure)?;
    // Bytes no token covers stay zero, as on the host.
    out.upload(0, &vec![0u8; n_blocks * bytes])
        .map_err(failure)?;
    let mut args = (
        seed,
        n_blocks as i32,
        shape.block_size as i32,
        shape.head_dim as i32,
        fnuz(shape),
        (shape.layout == ValueLayout::Shuffle16) as i32,
        bytes as i64,
    );
    run(
        gpu,
        "pipeline_blocks",
        n_blocks * shape.block_size,
        &mut [
            &mut args.0,
            &mut args.1,
            &mut args.2,
            &mut args.3,
            &mut args.4,
            &mut args.5,
            &mut table.ptr(),
            &mut out.ptr(),
            &mut args.6,
        ],
    )?;
    let mut host = vec![0u8; n_blocks * bytes];
    out.download(0, &mut host).map_err(failure)?;
    Ok(host)
}

/// Draws the pipeline keys of a drawn cache into their slots of the device cache at
/// `kv` (stride `stride`): block `k` is physical id `ids[k]`, drawn as index `index[k]`
/// of value seed `seed` (the bytes `generate::values` draws on the CPU).
pub fn blocks_in_place(
    gpu: &mut Gpu,
    shape: &Shape,
    seed: u64,
    kv: u64,
    stride: u64,
    ids: &[u64],
    index: &[u64],
) -> Result<(), GpuFailure> {
    debug_assert_eq!(ids.len(), index.len());
    if ids.is_empty() {
        return Ok(());
    }
    let table = table(gpu)?;
    let ids_mem = DeviceMemory::alloc(8 * ids.len() as u64).map_err(failure)?;
    ids_mem.upload(0, ids).map_err(failure)?;
    let index_mem = DeviceMemory::alloc(8 * index.len() as u64).map_err(failure)?;
    index_mem.upload(0, index).map_err(failure)?;
    let mut args = (
        seed,
        ids.len() as i64,
        shape.block_size as i32,
        shape.head_dim as i32,
        fnuz(shape),
        (shape.layout == ValueLayout::Shuffle16) as i32,
        kv,
        stride,
    );
    run(
        gpu,
        "pipeline_blocks_at",
        ids.len() * shape.block_size,
        &mut [
            &mut args.0,
            &mut args.1,
            &mut args.2,
            &mut args.3,
            &mut args.4,
            &mut args.5,
            &mut table.ptr(),
            &mut args.6,
            &mut args.7,
            &mut ids_mem.ptr(),
            &mut index_mem.ptr(),
        ],
    )
}

/// A compact block table made whole on the device (`kernels/generate.cu`'s
/// `table_tail`): each row's held entries and where they start uploaded, every other
/// entry its tail rule's, the entries [`crate::case::BlockTable::expand`] makes on the
/// host.
pub fn whole_table(gpu: &mut Gpu, t: &BlockTable) -> Result<DeviceMemory, GpuFailure> {
    let (Some(starts), Some(tail)) = (&t.row_starts, &t.tail) else {
        panic!("whole_table takes a compact table");
    };
    let (rows, stride) = (t.rows(), t.row_stride);
    let n = rows * stride;
    let mem = super::memory::alloc(super::memory::pad16(4 * n as u64))?;
    mem.memset(0).map_err(failure)?;
    if n == 0 {
        return Ok(mem);
    }
    let held = super::memory::small(&t.entries)?;
    let starts: Vec<u64> = starts.iter().map(|&x| x as u64).collect();
    let starts_mem = super::memory::small(&starts)?;
    let (hashed, fill, key, lo, span) = match tail.rule {
        TailRule::Fill(v) => (0i32, v, 0u64, 0u64, 0u64),
        TailRule::Hash { key, lo, span } => (1, 0, key, lo, span),
    };
    let mut args = (rows as i64, stride as i64, hashed, fill, key, lo, span);
    run(
        gpu,
        "table_tail",
        n,
        &mut [
            &mut mem.ptr(),
            &mut held.ptr(),
            &mut starts_mem.ptr(),
            &mut args.0,
            &mut args.1,
            &mut args.2,
            &mut args.3,
            &mut args.4,
            &mut args.5,
            &mut args.6,
        ],
    )?;
    Ok(mem)
}
