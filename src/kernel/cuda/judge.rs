//! The judge on the device (kernels/judge.cu): the exact GPU reference of a case already
//! on the device ([`super::reference::compute_device`]) and the oracle's per-element
//! rules applied next to the kernel's output; only the [`DeviceJudgement`] comes back.
//! The harness re-checks the sampled elements on the CPU (`oracle::recheck`).

use super::compile::Program;
use super::device::{Gpu, GpuFailure};
use super::memory::{failure, launch, ArgPtr, DeviceCase};
use super::reference::{self, ReferenceTuning};
use super::sys::DeviceMemory;
use crate::case::Case;
use crate::kernel::{
    CheckedElement, DeviceClass, DeviceJudgeRequest, DeviceJudgement, GUARD_ELEMS,
};
use std::time::Instant;

/// Columns of a row one CTA of `judge_rows` takes (`JUDGE_CHUNK` in judge.cu).
const CHUNK: usize = 65536;
const PART_U64: usize = 20;
const PART_F64: usize = 4;

/// Mirrors `struct JudgePart` in judge.cu (20 counters, then 4 doubles).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct JudgePart {
    u: [u64; PART_U64],
    f: [f64; PART_F64],
}

/// Mirrors `struct Bound` in judge.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Bound {
    dot_rel: f64,
    head_rel: f64,
    abs: f64,
}

impl ArgPtr for Bound {
    fn arg_ptr(&mut self) -> *mut std::ffi::c_void {
        self as *mut Bound as *mut std::ffi::c_void
    }
}

/// The grid of the row kernels: (chunks of the row stride, rows), rows folded into at
/// most 65535 CTA rows.
fn row_grid(case: &Case, cols: usize) -> (u32, u32) {
    let gx = cols.div_ceil(CHUNK).clamp(1, 65535) as u32;
    let gy = case.rows().clamp(1, 65535) as u32;
    (gx, gy)
}

/// Where the device judge's wall time went, in seconds: the reference (its kernel and
/// its host side apart), the classification of every element, the guard zones, the
/// listed elements fetched for the CPU re-check.
#[derive(Clone, Copy, Debug, Default)]
pub struct JudgeTimes {
    pub reference_kernel: f64,
    pub reference_rest: f64,
    pub classify: f64,
    pub full_bound: f64,
    pub guard_zones: f64,
    pub checks: f64,
}

impl JudgeTimes {
    /// The phases as a worker reports them.
    pub fn phases(&self) -> [(&'static str, f64); 6] {
        [
            ("reference (device)", self.reference_kernel),
            ("judge (device): reference's host side", self.reference_rest),
            ("judge (device): classify", self.classify),
            (
                "judge (device): elements needing the full bound",
                self.full_bound,
            ),
            ("judge (device): guard zones", self.guard_zones),
            ("judge (device): checked elements", self.checks),
        ]
    }
}

/// Judges the output of `dc` (the kernel has run) as `req` asks; `times` gets where the
/// wall time went.
pub fn judge_case(
    gpu: &mut Gpu,
    dc: &DeviceCase,
    case: &Case,
    req: &DeviceJudgeRequest,
    times: &mut JudgeTimes,
) -> Result<DeviceJudgement, GpuFailure> {
    if req.digest_only {
        return Ok(DeviceJudgement {
            rows: case.rows() as u64,
            row_digests: digests(gpu, dc, case)?,
            ..Default::default()
        });
    }
    let rows = case.rows();
    let tuning = ReferenceTuning::for_shape(&case.shape, gpu.major);
    let t_ref = Instant::now();
    let dref = reference::compute_device(gpu, dc, case, req.placement, tuning, 1)?;
    times.reference_kernel = dref.kernel_time.as_secs_f64();
    times.reference_rest = (t_ref.elapsed().as_secs_f64() - times.reference_kernel).max(0.0);
    let t0 = Instant::now();
    let [dot_rel, head_rel, abs] = req.bound();
    let mut bound = Bound {
        dot_rel,
        head_rel,
        abs,
    };
    let f = gpu
        .function(Program::Judge, "judge_rows", &Vec::new())
        .map_err(GpuFailure::Environment)?;
    let (gx, gy) = row_grid(case, case.out_row_stride);
    let n_parts = rows * gx as usize;
    let parts_mem = DeviceMemory::alloc((n_parts.max(1) * std::mem::size_of::<JudgePart>()) as u64)
        .map_err(failure)?;
    // The elements whose class or ratio needs the full bound, set aside (at most every
    // element of V); then [count, OK, mismatch, max ratio's bits] of them.
    let total = dref.offsets.last().copied().unwrap_or(0);
    let pending = DeviceMemory::alloc(8 * total.max(1)).map_err(failure)?;
    let tallies = DeviceMemory::alloc(8 * 4).map_err(failure)?;
    tallies.memset(0).map_err(failure)?;
    if rows > 0 {
        let mut p = dc.params;
        launch(
            &f,
            (gx, gy, 1),
            256,
            0,
            &mut [
                &mut p,
                &mut dref.row_off.ptr(),
                &mut dref.value.ptr(),
                &mut dref.mag.ptr(),
                &mut (rows as i32),
                &mut bound,
                &mut parts_mem.ptr(),
                &mut pending.ptr(),
                &mut tallies.ptr(),
            ],
        )?;
    }
    gpu.ctx.synchronize().map_err(failure)?;
    let mut parts = vec![JudgePart::default(); n_parts];
    parts_mem.download(0, &mut parts).map_err(failure)?;
    let mut j = fold(&parts, rows, gx as usize);
    times.classify = t0.elapsed().as_secs_f64();
    let t_full = Instant::now();
    let mut n = [0u64];
    tallies.download(0, &mut n).map_err(failure)?;
    if n[0] > 0 {
        let f = gpu
            .function(Program::Judge, "judge_pending", &Vec::new())
            .map_err(GpuFailure::Environment)?;
        // Eight warps a CTA, one element a warp, a few waves of CTAs at most.
        let blocks = n[0].div_ceil(8).clamp(1, 16 * gpu.sms as u64) as u32;
        let mut p = dc.params;
        launch(
            &f,
            (blocks, 1, 1),
            256,
            0,
            &mut [
                &mut p,
                &mut dref.row_off.ptr(),
                &mut dref.value.ptr(),
                &mut dref.mag.ptr(),
                &mut bound,
                &mut pending.ptr(),
                &mut n[0],
                &mut (tallies.ptr() + 8),
            ],
        )?;
        let mut t = [0u64; 3];
        tallies.download(8, &mut t).map_err(failure)?;
        j.ok += t[0];
        j.mismatch += t[1];
        let worst = f64::from_bits(t[2]);
        if worst > f64::from_bits(j.max_err_over_bound_bits) {
            j.max_err_over_bound_bits = t[2];
        }
    }
    times.full_bound = t_full.elapsed().as_secs_f64();
    let t1 = Instant::now();
    j.oob_writes += guard_writes(gpu, dc)?;
    times.guard_zones = t1.elapsed().as_secs_f64();
    let t2 = Instant::now();
    j.checks = gather(gpu, dc, &dref, bound, &req.checks)?;
    times.checks = t2.elapsed().as_secs_f64();
    j.reference_secs = dref.kernel_time.as_secs_f64();
    j.judge_secs = t0.elapsed().as_secs_f64();
    Ok(j)
}

/// The parts of every (row, chunk), in order: counts summed, maxima kept, sums added in
/// row and chunk order (the same bits on every run), digests per row.
fn fold(parts: &[JudgePart], rows: usize, per_row: usize) -> DeviceJudgement {
    let mut u = [0u64; PART_U64];
    let (mut max_abs, mut max_ratio, mut sxy, mut sxx) = (0f64, 0f64, 0f64, 0f64);
    let mut digests = vec![0u64; rows];
    let mut guard_rows = 0;
    for (r, digest) in digests.iter_mut().enumerate() {
        let mut guard = 0;
        for p in &parts[r * per_row..(r + 1) * per_row] {
            for (sum, x) in u.iter_mut().zip(&p.u[..PART_U64 - 1]) {
                *sum += x;
            }
            *digest = digest.wrapping_add(p.u[19]);
            guard += p.u[9] + p.u[10] + p.u[11];
            max_abs = max_abs.max(p.f[0]);
            max_ratio = max_ratio.max(p.f[1]);
            sxy += p.f[2];
            sxx += p.f[3];
        }
        guard_rows += (guard > 0) as u64;
    }
    DeviceJudgement {
        rows: rows as u64,
        ok: u[0],
        mismatch: u[1],
        nan: u[2],
        inf: u[3],
        unwritten: u[4],
        undefined: u[5],
        hostile_nan: u[6],
        hostile_inf: u[7],
        hostile_finite: u[8],
        guard_nan: u[9],
        guard_pos_inf: u[10],
        guard_neg_inf: u[11],
        guard_rows,
        outside_elements: u[12],
        outside_unwritten: u[13],
        outside_nan: u[14],
        outside_neg_inf: u[15],
        outside_pos_inf: u[16],
        outside_finite: u[17],
        oob_writes: u[18],
        max_abs_err_bits: max_abs.to_bits(),
        max_err_over_bound_bits: max_ratio.to_bits(),
        sxy_bits: sxy.to_bits(),
        sxx_bits: sxx.to_bits(),
        row_digests: digests,
        ..Default::default()
    }
}

/// Guard-zone elements (before and after the rows) that are no longer the poison.
fn guard_writes(gpu: &mut Gpu, dc: &DeviceCase) -> Result<u64, GpuFailure> {
    let f = gpu
        .function(Program::Judge, "count_changed", &Vec::new())
        .map_err(GpuFailure::Environment)?;
    let count = DeviceMemory::alloc(8).map_err(failure)?;
    count.memset(0).map_err(failure)?;
    let words = dc.out.bytes / 4;
    let guard = GUARD_ELEMS as u64;
    for start in [0, words.saturating_sub(guard)] {
        launch(
            &f,
            (16, 1, 1),
            256,
            0,
            &mut [
                &mut (dc.out.ptr + 4 * start),
                &mut guard.min(words),
                &mut count.ptr(),
            ],
        )?;
    }
    let mut n = [0u64];
    count.download(0, &mut n).map_err(failure)?;
    Ok(n[0])
}

/// The listed elements' output, reference and class.
fn gather(
    gpu: &mut Gpu,
    dc: &DeviceCase,
    dref: &reference::DeviceReference,
    mut bound: Bound,
    checks: &[(u32, u32)],
) -> Result<Vec<CheckedElement>, GpuFailure> {
    if checks.is_empty() {
        return Ok(Vec::new());
    }
    let n = checks.len();
    let rows: Vec<u32> = checks.iter().map(|c| c.0).collect();
    let pos: Vec<u32> = checks.iter().map(|c| c.1).collect();
    let up = |v: &[u32]| -> Result<DeviceMemory, GpuFailure> {
        let m = DeviceMemory::alloc(4 * n as u64).map_err(failure)?;
        m.upload(0, v).map_err(failure)?;
        Ok(m)
    };
    let (rows_mem, pos_mem) = (up(&rows)?, up(&pos)?);
    let got = DeviceMemory::alloc(4 * n as u64).map_err(failure)?;
    let val = DeviceMemory::alloc(8 * n as u64).map_err(failure)?;
    let mag = DeviceMemory::alloc(8 * n as u64).map_err(failure)?;
    let cls = DeviceMemory::alloc(4 * n as u64).map_err(failure)?;
    let f = gpu
        .function(Program::Judge, "gather_checks", &Vec::new())
        .map_err(GpuFailure::Environment)?;
    let mut p = dc.params;
    launch(
        &f,
        ((n as u32).div_ceil(128), 1, 1),
        128,
        0,
        &mut [
            &mut p,
            &mut dref.row_off.ptr(),
            &mut dref.value.ptr(),
            &mut dref.mag.ptr(),
            &mut bound,
            &mut (n as i32),
            &mut rows_mem.ptr(),
            &mut pos_mem.ptr(),
            &mut got.ptr(),
            &mut val.ptr(),
            &mut mag.ptr(),
            &mut cls.ptr(),
        ],
    )?;
    gpu.ctx.synchronize().map_err(failure)?;
    let mut g = vec![0u32; n];
    let mut v = vec![0u64; n];
    let mut m = vec![0u64; n];
    let mut c = vec![0i32; n];
    got.download(0, &mut g).map_err(failure)?;
    val.download(0, &mut v).map_err(failure)?;
    mag.download(0, &mut m).map_err(failure)?;
    cls.download(0, &mut c).map_err(failure)?;
    (0..n)
        .map(|j| {
            let class = DeviceClass::from_code(c[j]).ok_or_else(|| {
                GpuFailure::Fault(format!("device judge gave class code {} to a check", c[j]))
            })?;
            Ok(CheckedElement {
                row: rows[j],
                pos: pos[j],
                got_bits: g[j],
                value_bits: v[j],
                relu_mag_bits: m[j],
                class,
            })
        })
        .collect()
}

/// The digest of every row's V(r) (`DeviceJudgement::row_digests`).
pub fn digests(gpu: &mut Gpu, dc: &DeviceCase, case: &Case) -> Result<Vec<u64>, GpuFailure> {
    let rows = case.rows();
    let offsets = reference::row_offsets(case);
    let longest = (0..rows).map(|r| case.valid_len(r)).max().unwrap_or(0);
    let off_mem = DeviceMemory::alloc(8 * offsets.len() as u64).map_err(failure)?;
    off_mem.upload(0, &offsets).map_err(failure)?;
    let out = DeviceMemory::alloc(8 * rows.max(1) as u64).map_err(failure)?;
    out.memset(0).map_err(failure)?;
    if longest > 0 {
        let f = gpu
            .function(Program::Judge, "digest_rows", &Vec::new())
            .map_err(GpuFailure::Environment)?;
        let (gx, gy) = row_grid(case, longest);
        let mut p = dc.params;
        launch(
            &f,
            (gx, gy, 1),
            256,
            0,
            &mut [
                &mut p,
                &mut off_mem.ptr(),
                &mut (rows as i32),
                &mut out.ptr(),
            ],
        )?;
    }
    let mut d = vec![0u64; rows];
    out.download(0, &mut d).map_err(failure)?;
    Ok(d)
}
