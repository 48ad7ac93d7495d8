//! The exact reference computed on the GPU (kernels/oracle.cu), for cases too large for
//! the CPU reference at campaign speed, and the CPU re-check that keeps it honest.
//!
//! The GPU result is never trusted alone: [`cross_check`] recomputes on the CPU, with
//! the independent `reference::element`, a random sample of rows plus every boundary
//! position (context ends of every row; block, 64-token tile and 256-token chunk/split
//! edges of sampled rows) and requires bit-identical values and magnitudes.

use super::compile::Program;
use super::device::{with_gpu, GpuFailure};
use super::memory::{failure, launch, DeviceCase};
use super::sys::{DeviceMemory, Timer};
use crate::case::{Case, ScalePlacement};
use crate::kernel::OutputBuffer;
use crate::reference::{self, Reference, RowReference};
use rand::RngExt;
use rayon::prelude::*;
use std::time::Duration;

/// Why the GPU oracle cannot take a case (the caller falls back to the CPU).
pub fn rejects(case: &Case) -> Option<String> {
    let s = &case.shape;
    if !s.heads.is_multiple_of(8) {
        return Some(format!("GPU oracle needs heads % 8 == 0, got {}", s.heads));
    }
    if !s.head_dim.is_multiple_of(16) || s.head_dim > 128 {
        return Some(format!(
            "GPU oracle supports head_dim multiple of 16 up to 128, got {}",
            s.head_dim
        ));
    }
    None
}

/// The reference of every row, computed on the GPU, and the oracle kernel's time.
pub fn compute_timed(
    case: &Case,
    placement: ScalePlacement,
) -> Result<(Reference, Duration), String> {
    if let Some(why) = rejects(case) {
        return Err(why);
    }
    let s = &case.shape;
    let rows = case.rows();
    let mut row_off = Vec::with_capacity(rows + 1);
    let mut total = 0u64;
    for r in 0..rows {
        row_off.push(total);
        total += case.valid_len(r) as u64;
    }
    row_off.push(total);
    let dummy = OutputBuffer::new(1, 1, 1);
    let r = with_gpu(|gpu| {
        let dc = DeviceCase::upload(gpu, case, &dummy)?;
        let f = gpu
            .function(
                Program::Oracle,
                "oracle_f64",
                &vec![("DD".into(), s.head_dim.to_string())],
            )
            .map_err(GpuFailure::Environment)?;
        // Query rows at a time: as many as fit in ~80 KiB (three CTAs per SM), at least one.
        let row_bytes = s.heads * (s.head_dim + 4) * 4 + s.heads * 8;
        let fixed = (256 + 4 * 128) * 8;
        let nr = ((80 * 1024 - fixed) / row_bytes).clamp(1, s.next_n);
        let smem = (fixed + nr * row_bytes) as u32;
        if smem > gpu.max_smem_optin {
            return Err(GpuFailure::OutOfMemory(format!(
                "GPU oracle needs {smem} bytes of shared memory"
            )));
        }
        f.set_max_dynamic_smem(smem).map_err(failure)?;
        let off_mem = DeviceMemory::alloc(row_off.len() as u64 * 8).map_err(failure)?;
        off_mem.upload(0, &row_off).map_err(failure)?;
        let value = DeviceMemory::alloc(total.max(1) * 8).map_err(failure)?;
        let mag = DeviceMemory::alloc(total.max(1) * 8).map_err(failure)?;
        let max_tok = (0..s.batch).map(|b| case.seq_tokens(b)).max().unwrap_or(0);
        // Each CTA takes up to 8 chunks of 64 tokens of one sequence (queries decoded once).
        let gx = max_tok.div_ceil(64).div_ceil(8).clamp(1, 65535) as u32;
        let gy = s.batch.clamp(1, 65535) as u32;
        let mut p = dc.params;
        let mut inside = (placement == ScalePlacement::InsideRelu) as i32;
        let mut nr = nr as i32;
        let timer = Timer::new().map_err(failure)?;
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
            ],
        )?;
        timer.stop().map_err(failure)?;
        let ms = timer.elapsed_ms().map_err(failure)?;
        gpu.ctx.synchronize().map_err(failure)?;
        let mut v = vec![0f64; total as usize];
        let mut m = vec![0f64; total as usize];
        value.download(0, &mut v).map_err(failure)?;
        mag.download(0, &mut m).map_err(failure)?;
        Ok((v, m, Duration::from_secs_f64(ms as f64 / 1e3)))
    });
    let (v, m, t) = r.map_err(|e| match e {
        GpuFailure::Environment(m) | GpuFailure::Fault(m) | GpuFailure::OutOfMemory(m) => m,
    })?;
    let rows_ref = (0..rows)
        .map(|r| {
            let (a, b) = (row_off[r] as usize, row_off[r + 1] as usize);
            Some(RowReference {
                positions: None,
                value: v[a..b].to_vec(),
                relu_mag: m[a..b].to_vec(),
            })
        })
        .collect();
    Ok((
        Reference {
            placement,
            rows: rows_ref,
        },
        t,
    ))
}

/// The exact reference of every row, computed on the GPU (not yet cross-checked:
/// call [`cross_check`] before trusting it).
pub fn compute(case: &Case, placement: ScalePlacement) -> Result<Reference, String> {
    compute_timed(case, placement).map(|(r, _)| r)
}

/// The positions of row `r` the CPU re-checks: context edges always; for `full` rows
/// also every block, 64-token tile and 256-token chunk edge, and `random` random ones.
pub fn check_positions(
    case: &Case,
    r: usize,
    full: bool,
    random: usize,
    rng: &mut impl rand::Rng,
) -> Vec<usize> {
    let len = case.valid_len(r);
    if len == 0 {
        return Vec::new();
    }
    let mut v = vec![0, 1, len.saturating_sub(2), len - 1];
    if full {
        let bs = case.shape.block_size;
        for step in [bs, 64, 256] {
            let mut e = step;
            while e < len {
                v.push(e - 1);
                v.push(e);
                e += step;
            }
        }
        for _ in 0..random {
            v.push(rng.random_range(0..len));
        }
    }
    v.retain(|&t| t < len);
    v.sort_unstable();
    v.dedup();
    v
}

/// Re-checks a GPU reference on the CPU: `sample_rows` random rows in full detail
/// (see [`check_positions`]) and the context edges of every row. `Err` names the
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
        .map(|(r, &f)| (r, check_positions(case, r, f, 64, &mut rng)))
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
                        "GPU oracle differs from the CPU at row {r} position {t}: value {:e} vs {:e}, magnitude {:e} vs {:e}",
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
