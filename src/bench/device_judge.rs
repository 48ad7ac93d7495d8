//! `gpu-selfcheck`'s device-judge section (DESIGN §8): on random cases and engine-shaped
//! production cases, `cuda:tiled` judged on the device must get the verdict the CPU
//! judge gives the same output, its row digests must be the host's, and keys the
//! device drew in place must be the bytes the CPU materialiser draws.

use super::gpu::{line, random_recipe};
use crate::case::Case;
use crate::generate::Profile;
use crate::harness::{self, ReferenceCache};
use crate::kernel::cuda::device::with_gpu;
use crate::kernel::cuda::kernels::{CudaDirect, Variant};
use crate::kernel::cuda::memory::{failure, CacheView, DeviceCase};
use crate::kernel::device_judge::{rejects, row_digest};
use crate::kernel::{Capabilities, Kernel};
use crate::oracle::{JudgeMode, OracleConfig, Verdict};
use std::time::Instant;

/// A production-profile case at `1/16` of an engine's context lengths (engine pools,
/// strides and block ids at full size), fitted to `kernel` and to this device.
fn production_case(kernel: &dyn Kernel, k: u64) -> Case {
    let strategy =
        crate::generate::strategy::draw_strategy_scaled(Profile::Production, k, 1.0 / 16.0);
    let draw = crate::campaign::value_tree(&strategy, 0x0de_71ce ^ k).current();
    draw.resolve(&[&fitted_to_device(kernel)]).0.materialize()
}

/// The kernel's capabilities with its KV pool at most 60% of this device's memory: an
/// engine's 80 GiB pool and its output do not fit an 80 GiB card (on one, three of 20
/// cases were "not judged on the device" and failed the section), and fit a 141 GiB one
/// as before.
fn fitted_to_device(kernel: &dyn Kernel) -> Capabilities {
    let mut caps = kernel.capabilities().clone();
    if let Ok((_, total)) = with_gpu(|gpu| gpu.ctx.mem_info().map_err(failure)) {
        let limit = total / 10 * 6;
        caps.max_kv_bytes = Some(caps.max_kv_bytes.map_or(limit, |m| m.min(limit)));
    }
    caps
}

/// Where two verdicts of the same output differ, in words (`None`: the same).
pub fn verdict_difference(dev: &Verdict, cpu: &Verdict) -> Option<String> {
    let rel = |a: f64, b: f64| {
        if a == b || (a.is_infinite() && b.is_infinite()) {
            0.0
        } else {
            (a - b).abs() / a.abs().max(b.abs())
        }
    };
    let mut d = Vec::new();
    if dev.classes != cpu.classes {
        d.push(format!("classes {:?} vs {:?}", dev.classes, cpu.classes));
    }
    if dev.guard != cpu.guard {
        d.push(format!("guard {:?} vs {:?}", dev.guard, cpu.guard));
    }
    if dev.outside != cpu.outside {
        d.push(format!("outside {:?} vs {:?}", dev.outside, cpu.outside));
    }
    if dev.hostile != cpu.hostile {
        d.push(format!("hostile {:?} vs {:?}", dev.hostile, cpu.hostile));
    }
    if dev.topk != cpu.topk {
        d.push(format!("topk {:?} vs {:?}", dev.topk, cpu.topk));
    }
    let (m, n) = (&dev.metrics, &cpu.metrics);
    if m.checked != n.checked || m.rows_checked != n.rows_checked {
        d.push(format!(
            "checked {}/{} rows vs {}/{}",
            m.checked, m.rows_checked, n.checked, n.rows_checked
        ));
    }
    if m.max_abs_err != n.max_abs_err || rel(m.max_err_over_bound, n.max_err_over_bound) > 1e-12 {
        d.push(format!(
            "max err {:e} vs {:e}, max err/bound {:e} vs {:e}",
            m.max_abs_err, n.max_abs_err, m.max_err_over_bound, n.max_err_over_bound
        ));
    }
    if (m.calc_diff - n.calc_diff).abs() > 1e-9 {
        d.push(format!("calc_diff {:e} vs {:e}", m.calc_diff, n.calc_diff));
    }
    (!d.is_empty()).then(|| d.join("; "))
}

/// The keys of `case` as the device drew them in place, against the CPU's bytes (the
/// first and last 128 stored blocks); `Ok(false)` when the device did not draw them.
fn keys_identical(case: &Case) -> Result<bool, String> {
    let ids = case.kv.ids();
    let bb = case.shape.block_bytes();
    let picked: Vec<u64> = ids
        .iter()
        .take(128)
        .chain(ids.iter().rev().take(128))
        .copied()
        .collect();
    let device: Vec<(u64, Vec<u8>)> = with_gpu(|gpu| {
        let dc = DeviceCase::upload_poisoned(gpu, case, CacheView::ReadBack)?;
        if !dc.keys_drawn_on_device {
            return Ok(Vec::new());
        }
        picked
            .iter()
            .map(|&id| {
                let mut b = vec![0u8; bb];
                dc.kv
                    .download(id * case.kv_block_stride, &mut b)
                    .map_err(failure)?;
                Ok((id, b))
            })
            .collect()
    })
    .map_err(|e| format!("{e:?}"))?;
    if device.is_empty() {
        return Ok(false);
    }
    for (id, b) in device {
        if case.kv.get(id) != Some(b.as_slice()) {
            return Err(format!(
                "block {id} drawn on the device differs from the CPU's"
            ));
        }
    }
    Ok(true)
}

/// Runs the section on `cases` cases (a third of them production-profile); prints a
/// line each for the verdicts and the keys; returns the failures. Every other case runs
/// a planted value bug (scale inside the relu, e4m3fnuz decoded as e4m3fn), so elements
/// far outside and near the error bound go through the full bound on both judges.
pub fn identity(cases: usize) -> usize {
    use crate::kernel::plant::Plant;
    let kernels = [
        CudaDirect::new(Variant::Tiled(None)),
        CudaDirect::new(Variant::Tiled(Some(Plant::ScaleBeforeRelu))),
        CudaDirect::new(Variant::Tiled(Some(Plant::FnuzAsFn))),
    ];
    let gpu_cfg = OracleConfig {
        judge: JudgeMode::Gpu,
        ..Default::default()
    };
    let cpu_cfg = OracleConfig {
        judge: JudgeMode::Cpu,
        ..Default::default()
    };
    let start = Instant::now();
    let (mut compared, mut same, mut production, mut failures) = (0, 0, 0, 0);
    let (mut elements, mut rechecked, mut with_findings) = (0u64, 0u64, 0);
    let (mut keys_checked, mut keys_drawn) = (0, 0);
    for i in 0..cases as u64 {
        let k = &kernels[[0, 1, 0, 2][i as usize % 4]];
        let prod = i % 3 == 2;
        let case = if prod {
            production_case(k, i)
        } else {
            random_recipe(2000 + i, false).materialize()
        };
        if k.capabilities().rejects(&case).is_some() || rejects(&case.shape).is_some() {
            continue;
        }
        compared += 1;
        production += prod as usize;
        let mut refs = ReferenceCache::new(&case);
        let dev = harness::run_and_judge(k, &case, &mut refs, &gpu_cfg);
        let cpu = harness::run_and_judge(k, &case, &mut refs, &cpu_cfg);
        let Some(side) = &dev.device else {
            failures += 1;
            line(format!(
                "  FAIL case {i}: not judged on the device: {}",
                dev.verdict
            ));
            continue;
        };
        elements += dev.verdict.metrics.checked;
        rechecked += side.rechecked;
        with_findings += side.cpu_judged as usize;
        let mut bad = verdict_difference(&dev.verdict, &cpu.verdict);
        if let (None, Some(out)) = (&bad, &cpu.output) {
            let host: Vec<u64> = (0..case.rows())
                .map(|r| row_digest(&out.row(r)[..case.valid_len(r)]))
                .collect();
            if host != side.row_digests {
                bad = Some("row digests differ from the host's".into());
            }
        }
        match bad {
            None => same += 1,
            Some(why) => {
                failures += 1;
                line(format!(
                    "  FAIL case {i} (production {prod}): device vs CPU judge: {why}"
                ));
            }
        }
        if i % 2 == 0 && case.kv.drawn_values().is_some() {
            keys_checked += 1;
            match keys_identical(&case) {
                Ok(drawn) => keys_drawn += drawn as usize,
                Err(e) => {
                    failures += 1;
                    line(format!("  FAIL case {i}: {e}"));
                }
            }
        }
    }
    line(format!(
        "device judge: the CPU judge's verdict on {same}/{compared} cases ({production} production-profile at 1/16 context, {with_findings} with findings judged on both), {elements} elements, {rechecked} re-checked on the CPU, row digests equal; {:.1}s",
        start.elapsed().as_secs_f64()
    ));
    line(format!(
        "keys drawn in place on the device: byte-identical to the CPU's on {keys_drawn}/{keys_checked} drawn cases ({} drawn on the host: not pipeline values or D > 128)",
        keys_checked - keys_drawn
    ));
    failures
}
