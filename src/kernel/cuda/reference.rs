//! The exact reference computed on the GPU (kernels/reference.cu), for cases too large for
//! the CPU reference at campaign speed, and the CPU re-check that keeps it honest.
//!
//! The GPU result is never trusted alone: [`cross_check`] recomputes on the CPU, with
//! the independent `reference::element`, a random sample of rows plus every boundary
//! position (context ends of every row; block, 64-token tile and 256-token chunk/split
//! edges of sampled rows) and requires bit-identical values and magnitudes.

use super::compile::Program;
use super::device::{with_gpu, Gpu, GpuFailure};
use super::memory::{failure, launch, CacheView, DeviceCase};
pub use super::reference_tuning::ReferenceTuning;
use super::sys::{DeviceMemory, Timer};
use crate::case::{Case, ScalePlacement, Shape};
use crate::reference::verify::check_positions;
use crate::reference::{self, Reference, RowReference};
use rand::RngExt;
use rayon::prelude::*;
use std::time::Duration;

/// Why the GPU reference cannot take a case (the caller falls back to the CPU).
pub fn rejects(case: &Case) -> Option<String> {
    rejects_shape(&case.shape)
}

pub(super) fn rejects_shape(s: &Shape) -> Option<String> {
    crate::kernel::device_judge::rejects(s)
}

/// Start of each row's V(r) in the compact value/magnitude arrays, and their length.
pub(super) fn row_offsets(case: &Case) -> Vec<u64> {
    let mut row_off = Vec::with_capacity(case.rows() + 1);
    let mut total = 0u64;
    for r in 0..case.rows() {
        row_off.push(total);
        total += case.valid_len(r) as u64;
    }
    row_off.push(total);
    row_off
}

fn message(e: GpuFailure) -> String {
    e.message()
}

/// The reference of every row, computed on the GPU, and the reference kernel's time.
pub fn compute_timed(
    case: &Case,
    placement: ScalePlacement,
) -> Result<(Reference, Duration), String> {
    compute_tuned(case, placement, None)
}

/// [`compute_timed`] with an explicit tuning, or the device's default for the shape
/// (uploads the case).
pub fn compute_tuned(
    case: &Case,
    placement: ScalePlacement,
    tuning: Option<ReferenceTuning>,
) -> Result<(Reference, Duration), String> {
    if let Some(why) = rejects(case) {
        return Err(why);
    }
    with_gpu(|gpu| {
        let tuning = tuning.unwrap_or_else(|| ReferenceTuning::for_shape(&case.shape, gpu.major));
        let dc = DeviceCase::upload_poisoned(gpu, case, CacheView::ReadBack)?;
        compute_on(gpu, &dc, case, placement, tuning, 1)
    })
    .map_err(message)
}

/// The exact reference of a case, left on the device: per row, positions `0..valid_len`
/// at `row_off[r]..row_off[r+1]` of the value and relu-magnitude arrays (f64).
pub struct DeviceReference {
    pub row_off: DeviceMemory,
    pub value: DeviceMemory,
    pub mag: DeviceMemory,
    /// The host copy of `row_off` (`rows + 1` entries).
    pub offsets: Vec<u64>,
    /// Median kernel time of the launches.
    pub kernel_time: Duration,
}

/// The reference of every row from the case already on the device (a kernel's own
/// `DeviceCase`: nothing is uploaded again), with the median kernel time of `reps`
/// launches (at least one).
pub fn compute_on(
    gpu: &mut Gpu,
    dc: &DeviceCase,
    case: &Case,
    placement: ScalePlacement,
    tuning: ReferenceTuning,
    reps: usize,
) -> Result<(Reference, Duration), GpuFailure> {
    let d = compute_device(gpu, dc, case, placement, tuning, reps)?;
    let total = *d.offsets.last().unwrap_or(&0) as usize;
    let mut v = vec![0f64; total];
    let mut m = vec![0f64; total];
    d.value.download(0, &mut v).map_err(failure)?;
    d.mag.download(0, &mut m).map_err(failure)?;
    let row_off = &d.offsets;
    let rows = (0..case.rows())
        .map(|r| {
            let (a, b) = (row_off[r] as usize, row_off[r + 1] as usize);
            Some(RowReference {
                positions: None,
                value: v[a..b].to_vec(),
                relu_mag: m[a..b].to_vec(),
            })
        })
        .collect();
    Ok((Reference { placement, rows }, d.kernel_time))
}

/// [`compute_on`] without the download: the reference stays on the device for the
/// device judge (`super::judge`).
pub fn compute_device(
    gpu: &mut Gpu,
    dc: &DeviceCase,
    case: &Case,
    placement: ScalePlacement,
    tuning: ReferenceTuning,
    reps: usize,
) -> Result<DeviceReference, GpuFailure> {
    if let Some(why) = rejects(case) {
        return Err(GpuFailure::Environment(why));
    }
    let s = &case.shape;
    if !tuning.runs_on(gpu.major) {
        return Err(GpuFailure::Environment(format!(
            "GPU reference tuning ({}) needs compute capability 9.0 or newer",
            tuning.label()
        )));
    }
    if !tuning.fits(s) {
        return Err(GpuFailure::Environment(format!(
            "GPU reference tuning ({}) does not fit H={} D={}",
            tuning.label(),
            s.heads,
            s.head_dim
        )));
    }
    let row_off = row_offsets(case);
    let total = *row_off.last().unwrap_or(&0);
    let f = gpu
        .function(
            Program::Reference,
            "reference_f64",
            &tuning.defines(s.head_dim),
        )
        .map_err(GpuFailure::Environment)?;
    // Query rows at a time: as many as fit the CTA's share of shared memory, at least one.
    let row_bytes = tuning.row_bytes(s);
    let fixed = tuning.fixed_bytes(s);
    let nr = (tuning.smem_budget().saturating_sub(fixed) / row_bytes).clamp(1, s.next_n);
    let smem = (fixed + nr * row_bytes) as u32;
    if smem > gpu.max_smem_optin {
        return Err(GpuFailure::OutOfMemory(format!(
            "GPU reference needs {smem} bytes of shared memory"
        )));
    }
    f.set_max_dynamic_smem(smem).map_err(failure)?;
    let off_mem = DeviceMemory::alloc(row_off.len() as u64 * 8).map_err(failure)?;
    off_mem.upload(0, &row_off).map_err(failure)?;
    let value = DeviceMemory::alloc(total.max(1) * 8).map_err(failure)?;
    let mag = DeviceMemory::alloc(total.max(1) * 8).map_err(failure)?;
    let chunks = |b: usize| case.seq_tokens(b).div_ceil(tuning.chunk_tokens());
    let max_chunks = (0..s.batch).map(chunks).max().unwrap_or(0);
    let total_chunks: usize = (0..s.batch).map(chunks).sum();
    // Each CTA takes up to `chunks_per_cta` chunks of one sequence (its queries decoded
    // once), fewer when that would not fill one wave of CTAs: a single long sequence
    // would otherwise run on a fraction of the SMs.
    let slots = gpu.sms as usize * tuning.ctas_per_sm;
    let per_cta = (total_chunks / slots).clamp(1, tuning.chunks_per_cta);
    let (mut gx, mut gy) = (
        max_chunks.div_ceil(per_cta).clamp(1, 65535) as u32,
        s.batch.clamp(1, 65535) as u32,
    );
    // A flat grid: one wave of CTAs, each an equal share of every sequence's chunks (the
    // kernel finds its sequences in the chunk counts' prefix sums).
    let chunk_prefix = if tuning.flat_grid {
        let mut prefix = vec![0i32; s.batch + 1];
        for b in 0..s.batch {
            prefix[b + 1] = prefix[b] + chunks(b) as i32;
        }
        let mem = DeviceMemory::alloc(prefix.len() as u64 * 4).map_err(failure)?;
        mem.upload(0, &prefix).map_err(failure)?;
        (gx, gy) = (slots.clamp(1, total_chunks.max(1)) as u32, 1);
        Some(mem)
    } else {
        None
    };
    let mut prefix_ptr = chunk_prefix.as_ref().map_or(0u64, |m| m.ptr());
    let mut p = dc.params;
    let mut inside = (placement == ScalePlacement::InsideRelu) as i32;
    let mut nr = nr as i32;
    let timer = Timer::new().map_err(failure)?;
    let mut times = Vec::new();
    for _ in 0..reps.max(1) {
        timer.start().map_err(failure)?;
        launch(
            &f,
            (gx, gy, 1),
            128,
            smem,
            &mut [
                &mut p,
                &mut off_mem.ptr(),
                &mut value.ptr(),
                &mut mag.ptr(),
                &mut inside,
                &mut nr,
                &mut prefix_ptr,
            ],
        )?;
        timer.stop().map_err(failure)?;
        times.push(timer.elapsed_ms().map_err(failure)? as f64);
    }
    times.sort_by(f64::total_cmp);
    gpu.ctx.synchronize().map_err(failure)?;
    Ok(DeviceReference {
        row_off: off_mem,
        value,
        mag,
        offsets: row_off,
        kernel_time: Duration::from_secs_f64(times[times.len() / 2] / 1e3),
    })
}

/// The exact reference of every row, computed on the GPU (not yet cross-checked:
/// call [`cross_check`] before trusting it).
pub fn compute(case: &Case, placement: ScalePlacement) -> Result<Reference, String> {
    compute_timed(case, placement).map(|(r, _)| r)
}

/// Re-checks a GPU reference on the CPU: `sample_rows` random rows in full detail
/// (see [`check_positions`](crate::reference::verify::check_positions)) and the context edges of every row. `Err` names the
/// first element whose bits differ.
pub fn cross_check(
    case: &Case,
    gpu_ref: &Reference,
    sample_rows: usize,
    seed: u64,
) -> Result<u64, String> {
    let mut rng = crate::generate::recipe::rng_for(seed);
    let rows = case.rows();
    let mut full = vec![false; rows];
    for _ in 0..sample_rows.min(rows) {
        full[rng.random_range(0..rows)] = true;
    }
    // Positions drawn up front (deterministic for the seed), then checked in parallel.
    let plan: Vec<(usize, Vec<usize>)> = full
        .iter()
        .enumerate()
        .map(|(r, &f)| (r, check_positions(case, r, f, 64, usize::MAX, &mut rng)))
        .collect();
    let counts: Vec<Result<u64, String>> = plan
        .par_iter()
        .map(|(r, positions)| {
            let r = *r;
            let Some(row) = &gpu_ref.rows[r] else { return Err(format!("GPU reference lacks row {r}")) };
            if row.value.len() != case.valid_len(r) {
                return Err(format!("GPU reference row {r} has {} positions, V(r) has {}", row.value.len(), case.valid_len(r)));
            }
            for &t in positions {
                let (v, m, _) = reference::element(case, gpu_ref.placement, r, t);
                let same = |a: f64, b: f64| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
                if !same(v, row.value[t]) || !same(m, row.relu_mag[t]) {
                    return Err(format!(
                        "GPU reference differs from the CPU at row {r} position {t}: value {:e} vs {:e}, magnitude {:e} vs {:e}",
                        row.value[t], v, row.relu_mag[t], m
                    ));
                }
            }
            Ok(positions.len() as u64)
        })
        .collect();
    let mut checked = 0;
    for c in counts {
        checked += c?;
    }
    Ok(checked)
}
