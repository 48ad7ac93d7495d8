//! GPU self-check and benchmarks, run on the device machine in one call
//! (`scripts/gpu-check.sh`): `mqa-fuzz gpu-selfcheck` (hidden) and `mqa-fuzz bench gpu`.
//!
//! The self-check proves on real hardware what CI cannot: the kernels agree with the
//! exact CPU reference over many random cases, every planted bug is caught through its
//! real mechanism (one of them by crashing), the GPU reference is bit-identical to the CPU
//! reference, and the production case runs within the performance target.

use crate::case::{Case, ScalePlacement, ValueLayout};
use crate::error::{exit, Fatal};
use crate::fp8::Fp8Format;
use crate::generate::recipe::rng_for;
use crate::generate::{LensRecipe, OffsetClass, Padding, Recipe, TableOrder, ValueKind};
use crate::harness::{self, ReferenceCache};
use crate::kernel::cuda::compile::{self, Program};
use crate::kernel::cuda::device::{self, with_gpu, GpuFailure};
use crate::kernel::cuda::kernels::{self, launch_variant, CudaDirect, Variant};
use crate::kernel::cuda::memory::{failure, CacheView, DeviceCase};
use crate::kernel::cuda::reference::{self as gpu_reference, ReferenceTuning};
use crate::kernel::cuda::sys::{DeviceMemory, Timer};
use crate::kernel::Plant;
use crate::kernel::{Kernel, OutputBuffer};
use crate::oracle::OracleConfig;
use crate::reference::{self, RowSelection};
use rand::RngExt;
use std::time::{Duration, Instant};

fn recipe(heads: usize, head_dim: usize, next_n: usize, lens: LensRecipe, seed: u64) -> Recipe {
    Recipe {
        lens,
        ..Recipe::small(Vec::new(), next_n, seed).with(|k| {
            k.heads = heads;
            k.head_dim = head_dim;
        })
    }
}

fn seqs(v: &[usize]) -> LensRecipe {
    LensRecipe::PerSequence(v.to_vec())
}

/// A case that exposes `plant` through its mechanism (inside cuda:tiled's capabilities).
pub fn bug_recipe(plant: Plant) -> Recipe {
    let mut r = recipe(32, 64, 1, seqs(&[300, 700]), 11);
    match plant {
        Plant::TailUnwritten => {}
        Plant::Offset32Kv => {
            r.knobs.offsets = OffsetClass::Around4G;
            r.lens = seqs(&[600]);
        }
        Plant::Offset32Out => {
            r.knobs.big_output = true;
            r.lens = seqs(&[300]);
            r.knobs.model_len_slack = 1 << 14;
        }
        Plant::MaskOffByOne => {
            r.knobs.next_n = 2;
        }
        Plant::Ctx2dIgnored => {
            r.knobs.next_n = 2;
            r.lens = LensRecipe::PerToken(vec![vec![250, 251], vec![100, 400]]);
        }
        Plant::TablePaddingRead => {
            r.knobs.padding = Padding::Huge;
            r.knobs.surplus_blocks = 8;
        }
        Plant::ZeroBatch => {
            r.lens = seqs(&[0; 32]);
        }
        Plant::FnuzAsFn => r.knobs.format = Fp8Format::E4m3fnuz,
        Plant::ScaleBeforeRelu => r.knobs.values = ValueKind::Hostile,
        Plant::SplitBoundaryDrop => r.lens = seqs(&[3000, 2000, 1500]),
        Plant::ShortRowSkipped => {
            r.knobs.next_n = 2;
            r.lens = seqs(&[1, 300]);
        }
        Plant::StorePastEnd => {
            r.knobs.model_len_slack = 0;
            r.lens = seqs(&[300]);
        }
        // Property plants: the default two sequences (a batch, several heads) show them.
        Plant::Nondeterministic | Plant::BatchVariant => {}
    }
    r
}

/// A random recipe inside cuda:tiled's capabilities.
pub fn random_recipe(seed: u64, hostile: bool) -> Recipe {
    let mut rng = rng_for(seed ^ 0x5eed);
    let pick = |rng: &mut proptest::test_runner::TestRng, n: usize| rng.random_range(0..n);
    let heads = [32, 64, 128][pick(&mut rng, 3)];
    let head_dim = [64, 128][pick(&mut rng, 2)];
    let next_n = 1 + pick(&mut rng, 4);
    let block_size = [1, 16, 64, 256][pick(&mut rng, 4)];
    let batch = 1 + pick(&mut rng, 4);
    let edge = |rng: &mut proptest::test_runner::TestRng| -> usize {
        let base = [0, 1, next_n, 63, 64, 255, 256, 257, 511, 1000, 1500][rng.random_range(0..11)];
        (base as i64 + rng.random_range(-1..=1i64)).max(0) as usize
    };
    let lens = if pick(&mut rng, 3) == 0 {
        LensRecipe::PerToken(
            (0..batch)
                .map(|_| (0..next_n).map(|_| edge(&mut rng)).collect())
                .collect(),
        )
    } else {
        LensRecipe::PerSequence((0..batch).map(|_| edge(&mut rng)).collect())
    };
    let mut r = recipe(heads, head_dim, next_n, lens, seed);
    r.knobs.block_size = block_size;
    r.layout = if block_size % 16 == 0 && pick(&mut rng, 2) == 0 {
        ValueLayout::Shuffle16
    } else {
        ValueLayout::Normal
    };
    r.knobs.format = Fp8Format::ALL[pick(&mut rng, 2)];
    r.knobs.table_order = [
        TableOrder::Sequential,
        TableOrder::Permuted,
        TableOrder::Reversed,
        TableOrder::SharedPrefix,
    ][pick(&mut rng, 4)];
    r.knobs.padding = [
        Padding::Zero,
        Padding::MinusOne,
        Padding::Huge,
        Padding::Garbage,
    ][pick(&mut rng, 4)];
    r.knobs.kv_stride_pad = 4 * pick(&mut rng, 5) as u64;
    r.knobs.out_stride_pad = pick(&mut rng, 40);
    r.knobs.model_len_slack = pick(&mut rng, 300);
    r.knobs.offsets = [
        OffsetClass::Low,
        OffsetClass::Low,
        OffsetClass::Low,
        OffsetClass::Around2G,
        OffsetClass::Around4G,
    ][pick(&mut rng, 5)];
    let kinds = [
        ValueKind::Pipeline,
        ValueKind::UniformCodes,
        ValueKind::Extreme,
        ValueKind::ReluBoundary,
        ValueKind::AllNegative,
    ];
    r.knobs.values = if hostile && pick(&mut rng, 4) == 0 {
        ValueKind::Hostile
    } else {
        kinds[pick(&mut rng, kinds.len())]
    };
    r
}

/// The production case of the performance target: B=64, N=2, H=64, D=128, block 64,
/// context 32768 ± 30%.
pub fn production_recipe(
    batch: usize,
    next_n: usize,
    ctx: usize,
    spread: f64,
    seed: u64,
) -> Recipe {
    let mut rng = rng_for(seed);
    let lens: Vec<usize> = (0..batch)
        .map(|_| ((ctx as f64) * (1.0 + spread * rng.random_range(-1.0..1.0f64))) as usize)
        .collect();
    let mut r = recipe(64, 128, next_n, seqs(&lens), seed);
    r.knobs.block_size = 64;
    r.knobs.kv_stride_pad = 0;
    r.knobs.out_stride_pad = 256 - (lens.iter().max().unwrap() + 5) % 256; // rows aligned to 256 like the libraries
    r.knobs.padding = Padding::Zero;
    r.knobs.values = ValueKind::UniformCodes;
    r
}

/// Compiles every kernel variant the self-check and benchmarks use into the disk cache
/// (NVRTC needs no GPU), so the device machine spends no time compiling.
pub fn precompile(arch: &str) -> Result<usize, String> {
    let mut n = 0;
    let mut one = |p: Program, d: compile::Defines| -> Result<(), String> {
        compile::cubin(p, arch, &d)?;
        n += 1;
        Ok(())
    };
    one(Program::Util, vec![])?;
    one(Program::Naive, vec![])?;
    one(Program::Generate, vec![])?;
    one(Program::Judge, vec![])?;
    for dd in [64, 128] {
        for tuning in ReferenceTuning::ALL {
            one(Program::Reference, tuning.defines(dd))?;
        }
    }
    let mut cases: Vec<Case> = (0..48).map(shape_case).collect();
    let plants: Vec<Plant> = Plant::every().collect();
    cases.extend(plants.iter().map(|&p| bug_recipe(p).materialize_small()));
    for (k, c) in cases.iter().enumerate() {
        let variants: Vec<Variant> = if k < 48 {
            vec![Variant::Tiled(None)]
        } else {
            vec![Variant::Tiled(Some(plants[k - 48]))]
        };
        for v in variants {
            one(Program::Tiled, v.defines_for(c))?;
        }
    }
    Ok(n)
}

/// A tiny case of tiled shape number k (all 48 combinations of N, H, D, format).
fn shape_case(k: usize) -> Case {
    let mut r = recipe(
        [32, 64, 128][k % 3],
        [64, 128][(k / 3) % 2],
        1 + (k / 6) % 4,
        seqs(&[1]),
        1,
    );
    r.knobs.format = Fp8Format::ALL[(k / 24) % 2];
    r.materialize()
}

trait Small {
    fn materialize_small(&self) -> Case;
}
impl Small for Recipe {
    /// The shape only (big outputs and caches are irrelevant for compiling).
    fn materialize_small(&self) -> Case {
        let mut r = self.clone();
        r.knobs.big_output = false;
        r.knobs.offsets = OffsetClass::Low;
        r.materialize()
    }
}

pub(super) fn line(s: String) {
    crate::outln!("{s}");
}

/// Device-to-device copy bandwidth (bytes read + written per second) over `bytes`.
pub fn copy_bandwidth(bytes: u64) -> Result<f64, String> {
    with_gpu(|_gpu| {
        let a = DeviceMemory::alloc(bytes).map_err(failure)?;
        let b = DeviceMemory::alloc(bytes).map_err(failure)?;
        a.memset(1).map_err(failure)?;
        b.copy_from(&a, bytes).map_err(failure)?;
        let t = Timer::new().map_err(failure)?;
        let mut times = Vec::new();
        for _ in 0..5 {
            t.start().map_err(failure)?;
            b.copy_from(&a, bytes).map_err(failure)?;
            t.stop().map_err(failure)?;
            times.push(t.elapsed_ms().map_err(failure)? as f64);
        }
        times.sort_by(f64::total_cmp);
        Ok(2.0 * bytes as f64 / (times[2] / 1e3))
    })
    .map_err(|e| format!("{e:?}"))
}

/// `mqa-fuzz gpu-selfcheck`: returns exit 0 when everything holds, 1 otherwise.
pub fn selfcheck(
    cases: usize,
    reference_cases: usize,
    generator_cases: usize,
    judge_cases: usize,
) -> Result<i32, Fatal> {
    device::availability().map_err(Fatal::environment)?;
    let mut failures = 0usize;
    let info = with_gpu(|g| {
        Ok(format!(
            "{} (sm arch {}, {} SMs, {:.1} GiB)",
            g.name,
            g.arch,
            g.sms,
            g.ctx.total_mem().unwrap_or(0) as f64 / (1u64 << 30) as f64
        ))
    })
    .map_err(|e| Fatal::environment(format!("{e:?}")))?;
    line(format!("device: {info}"));
    let cfg = OracleConfig::default();
    // Section 1 measures the kernels' own error on the CPU judge (it reads the output).
    let cpu_cfg = OracleConfig {
        judge: crate::oracle::JudgeMode::Cpu,
        ..OracleConfig::default()
    };

    // 1. Random cases against the exact CPU reference.
    for variant in [Variant::Naive, Variant::Tiled(None)] {
        let k = CudaDirect::new(variant);
        let (mut clean, mut skipped, mut worst, mut worst_rel) = (0, 0, 0.0f64, 0.0f64);
        let start = Instant::now();
        for seed in 0..cases as u64 {
            let case = random_recipe(seed, variant == Variant::Naive).materialize();
            let mut refs = ReferenceCache::new(&case);
            let j = harness::run_and_judge(&k, &case, &mut refs, &cpu_cfg);
            let v = &j.verdict;
            if v.skipped.is_some() {
                skipped += 1;
                continue;
            }
            if v.is_clean() {
                clean += 1;
                worst = worst.max(v.metrics.max_err_over_bound);
                if let (Variant::Tiled(None), Some(out)) = (variant, &j.output) {
                    worst_rel = worst_rel.max(observed_rel(&case, out));
                }
            } else {
                failures += 1;
                line(format!("  FAIL {} seed {seed}: {}", k.name(), v));
            }
        }
        line(format!(
            "{}: {clean}/{} random cases clean ({skipped} skipped), max err/bound {worst:.3}{}, {:.1}s",
            k.name(),
            cases - skipped,
            if variant == Variant::Tiled(None) { format!(", observed dot error up to {worst_rel:.3e} x sum|q*k| (declared {:.3e})", kernels::TILED_REL) } else { String::new() },
            start.elapsed().as_secs_f64()
        ));
    }

    // 2. Every planted bug must be caught, each through the worker pool (`cuda:`), so
    //    a fault kills a worker process and is reported as this case's crash.
    for p in Plant::ALL {
        let name = format!("cuda:bug-{}", p.name());
        let k = crate::kernel::open(&name).map_err(|e| Fatal::environment(e.to_string()))?;
        let case = bug_recipe(p).materialize();
        let mut refs = ReferenceCache::new(&case);
        let j = harness::run_and_judge(k.as_ref(), &case, &mut refs, &cfg);
        let v = &j.verdict;
        // Judged on the device, the finding brings its output back to the CPU judge,
        // whose counts must be the device's (else an oracle_disagreement).
        let caught = !v.is_clean()
            && v.skipped.is_none()
            && !v
                .classes
                .contains_key(&crate::oracle::Class::OracleDisagreement);
        if !caught {
            failures += 1;
        }
        let mem = v
            .run
            .device_bytes
            .map(|b| format!(", {:.2} GiB on device", b as f64 / (1u64 << 30) as f64))
            .unwrap_or_default();
        line(format!(
            "{name:32} {} {}{mem}",
            if caught { "caught:" } else { "MISSED:" },
            v
        ));
    }
    // The clean kernel on the same cases must be clean (the findings are the bugs').
    let clean_k =
        crate::kernel::open("cuda:tiled").map_err(|e| Fatal::environment(e.to_string()))?;
    for p in Plant::ALL {
        let case = bug_recipe(p).materialize();
        let mut refs = ReferenceCache::new(&case);
        let v = harness::run_and_judge(clean_k.as_ref(), &case, &mut refs, &cfg).verdict;
        if !v.is_clean() {
            failures += 1;
        }
        line(format!("cuda:tiled on the {} case: {}", p.name(), v));
    }

    // 3. GPU reference bit-identical to the CPU reference, in every tuning that fits.
    failures += reference_identity(reference_cases);

    // 3b. The device generator draws the CPU materialiser's bytes.
    failures += super::generator::identity(generator_cases);
    failures += super::generator::table_tails(generator_cases);

    // 3c. The device judge gives the CPU judge's verdicts; keys drawn in place.
    failures += super::device_judge::identity(judge_cases);

    // 4. Production case: tiled correctness (judged against the cross-checked GPU
    //    reference) and time.
    match production(&cfg) {
        Ok(ok) => failures += (!ok) as usize,
        Err(e) => {
            failures += 1;
            line(format!("  FAIL production case: {e}"));
        }
    }
    line(format!(
        "selfcheck: {}",
        if failures == 0 {
            "PASS".to_string()
        } else {
            format!("{failures} FAILURE(S)")
        }
    ));
    Ok(if failures == 0 {
        exit::CLEAN
    } else {
        exit::FINDINGS
    })
}

/// The GPU reference bit-identical to the CPU reference on `cases` random cases, in every
/// tuning that fits and runs here; returns the number of cases that were not.
fn reference_identity(cases: usize) -> usize {
    let mut failures = 0;
    let (mut same, mut total) = (0, 0);
    let major = with_gpu(|gpu| Ok(gpu.major)).unwrap_or(0);
    for seed in 0..cases as u64 {
        let case = random_recipe(1000 + seed, true).materialize();
        if gpu_reference::rejects(&case).is_some() {
            continue;
        }
        total += 1;
        let mut case_ok = true;
        'placements: for placement in [ScalePlacement::AfterReluSum, ScalePlacement::InsideRelu] {
            let cpu = reference::compute(&case, placement, &RowSelection::All);
            for tuning in ReferenceTuning::ALL
                .into_iter()
                .filter(|t| t.runs_on(major) && t.fits(&case.shape))
            {
                match gpu_reference::compute_tuned(&case, placement, Some(tuning)) {
                    Ok((gpu, _)) if bit_identical(&cpu, &gpu) => {}
                    Ok(_) => {
                        line(format!(
                            "  FAIL GPU reference ({}) differs from the CPU reference, seed {seed}, {}",
                            tuning.label(),
                            placement.name()
                        ));
                        case_ok = false;
                        break 'placements;
                    }
                    Err(e) => {
                        line(format!(
                            "  FAIL GPU reference ({}) error, seed {seed}: {e}",
                            tuning.label()
                        ));
                        case_ok = false;
                        break 'placements;
                    }
                }
            }
        }
        if case_ok {
            same += 1;
        } else {
            failures += 1;
        }
    }
    line(format!("GPU reference: bit-identical to reference::compute on {same}/{total} random cases (both scale placements, every tuning that fits)"));
    failures
}

fn bit_identical(a: &reference::Reference, b: &reference::Reference) -> bool {
    let same = |x: f64, y: f64| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan());
    a.rows.len() == b.rows.len()
        && a.rows.iter().zip(&b.rows).all(|(x, y)| match (x, y) {
            (Some(x), Some(y)) => {
                x.value.len() == y.value.len()
                    && x.value.iter().zip(&y.value).all(|(p, q)| same(*p, *q))
                    && x.relu_mag
                        .iter()
                        .zip(&y.relu_mag)
                        .all(|(p, q)| same(*p, *q))
            }
            _ => false,
        })
}

/// Largest `(|got - exact| - f32 head-sum allowance) / Σ_h|w_h||s|Σ_d|q_d k_d|` over
/// V(r): the accumulation error of the dots, to size `TILED_REL`.
fn observed_rel(case: &Case, out: &OutputBuffer) -> f64 {
    let mut worst = 0.0f64;
    let head = 2.0 * (case.shape.heads as f64 + 2.0) / 16_777_216.0;
    for r in 0..case.rows() {
        for t in 0..case.valid_len(r) {
            let (v, m, a) = reference::element(case, ScalePlacement::AfterReluSum, r, t);
            let got = out.get(r, t) as f64;
            if a > 0.0 && v.is_finite() && got.is_finite() {
                worst = worst.max(((got - v).abs() - head * m).max(0.0) / a);
            }
        }
    }
    worst
}

/// Runs and times the production case; prints one line per measurement.
fn production(cfg: &OracleConfig) -> Result<bool, String> {
    let case = production_recipe(64, 2, 32768, 0.3, 42).materialize();
    let r = bench_one(
        "production B=64 N=2 H=64 D=128 bs=64 ctx 32768+-30%",
        &case,
        cfg,
    )?;
    Ok(r)
}

/// Kernel time, GPU reference (every tuning, on the kernel's own device copy of the case),
/// CPU sample check and the verdict of tiled on one case.
fn bench_one(label: &str, case: &Case, cfg: &OracleConfig) -> Result<bool, String> {
    let s = &case.shape;
    let valid = case.valid_elements();
    let tokens: u64 = (0..s.batch).map(|b| case.seq_tokens(b) as u64).sum();
    let flop = 2.0 * valid as f64 * (s.heads * s.head_dim) as f64;
    let kv_bytes = tokens as f64 * (s.head_dim + 4) as f64;
    let bw = copy_bandwidth(4 << 30)?;
    let mut out = OutputBuffer::for_case(case);
    let placement = ScalePlacement::AfterReluSum;
    // One upload serves the kernel and the GPU reference, as a campaign on the GPU would.
    let (kt, upload, tunings, verify_wall, default_tuning) = with_gpu(|gpu| {
        let default_tuning = ReferenceTuning::for_shape(&case.shape, gpu.major);
        let t = Instant::now();
        let mut dc = DeviceCase::upload(gpu, case, &out, CacheView::ReadBack)?;
        let upload = t.elapsed();
        let timer = Timer::new().map_err(failure)?;
        launch_variant(gpu, Variant::Tiled(None), case, &mut dc, &timer)?;
        let mut times = Vec::new();
        for _ in 0..20 {
            launch_variant(gpu, Variant::Tiled(None), case, &mut dc, &timer)?;
            times.push(timer.elapsed_ms().map_err(failure)? as f64);
        }
        times.sort_by(f64::total_cmp);
        dc.download_output(&mut out)?;
        let kt = Duration::from_secs_f64(times[times.len() / 2] / 1e3);
        // Wall of one verification on the shared copy: launch, wait, download, rows.
        let t = Instant::now();
        gpu_reference::compute_on(gpu, &dc, case, placement, default_tuning, 1)?;
        let verify_wall = t.elapsed();
        let mut tunings = Vec::new();
        let major = gpu.major;
        for tuning in ReferenceTuning::ALL
            .into_iter()
            .filter(|t| t.runs_on(major) && t.fits(&case.shape))
        {
            let (r, t) = gpu_reference::compute_on(gpu, &dc, case, placement, tuning, 5)?;
            tunings.push((tuning, r, t));
        }
        Ok((kt, upload, tunings, verify_wall, default_tuning))
    })
    .map_err(GpuFailure::message)?;
    let ks = kt.as_secs_f64();
    line(format!(
        "{label}: {tokens} tokens, {valid} logits, {:.1} GFLOP, {:.0} MB of KV; upload {:.1} ms",
        flop / 1e9,
        kv_bytes / 1e6,
        upload.as_secs_f64() * 1e3
    ));
    line(format!(
        "  cuda:tiled kernel {:.3} ms (median of 20): {:.0} TFLOP/s, KV {:.2} TB/s = {:.0}% of copy bandwidth {:.2} TB/s",
        ks * 1e3,
        flop / ks / 1e12,
        kv_bytes / ks / 1e12,
        100.0 * kv_bytes / ks / bw,
        bw / 1e12
    ));
    let (_, gref, _) = tunings
        .iter()
        .find(|(t, _, _)| *t == default_tuning)
        .ok_or("the default reference tuning does not fit this case")?;
    for (tuning, r, t) in &tunings {
        line(format!(
            "  GPU reference kernel, {:<26} {:.3} ms (median of 5, {:.1}x the kernel){}{}",
            tuning.label(),
            t.as_secs_f64() * 1e3,
            t.as_secs_f64() / ks,
            if bit_identical(r, gref) {
                ""
            } else {
                ", DIFFERS from the default tuning"
            },
            if *tuning == default_tuning {
                " [default]"
            } else {
                ""
            }
        ));
    }
    let okt = tunings
        .iter()
        .find(|(t, _, _)| *t == default_tuning)
        .map(|x| x.2)
        .unwrap_or_default();
    let all_same = tunings.iter().all(|(_, r, _)| bit_identical(r, gref));
    let t1 = Instant::now();
    let checked = gpu_reference::cross_check(case, gref, 4, 7)?;
    let cwall = t1.elapsed();
    line(format!(
        "  GPU reference {:.3} ms kernel, {:.1} ms wall on the kernel's device copy (launch+download); CPU cross-check {checked} elements in {:.1} ms; verified {:.2e} logits/s",
        okt.as_secs_f64() * 1e3,
        verify_wall.as_secs_f64() * 1e3,
        cwall.as_secs_f64() * 1e3,
        valid as f64 / (verify_wall + cwall).as_secs_f64()
    ));
    let k = CudaDirect::new(Variant::Tiled(None));
    let info = crate::kernel::RunInfo {
        kernel_time: Some(kt),
        inputs_intact: Some(true),
        device_bytes: None,
        queue_wait: None,
        phases: Default::default(),
    };
    let v = crate::oracle::judge(case, gref, k.capabilities(), Ok((&info, &out)), cfg);
    line(format!(
        "  cuda:tiled verdict against the GPU reference: {}",
        v
    ));
    Ok(v.is_clean() && all_same)
}

/// `mqa-fuzz bench gpu`.
pub fn bench_gpu() -> Result<i32, Fatal> {
    device::availability().map_err(Fatal::environment)?;
    let cfg = OracleConfig::default();
    let cases = [
        (
            "production B=64 N=2 H=64 D=128 bs=64 ctx 32768+-30%",
            production_recipe(64, 2, 32768, 0.3, 42),
        ),
        (
            "small batch B=1 N=1 ctx 65536",
            production_recipe(1, 1, 65536, 0.0, 43),
        ),
        (
            "large batch B=256 N=1 ctx 512",
            production_recipe(256, 1, 512, 0.0, 44),
        ),
    ];
    let mut all_clean = true;
    for (label, r) in cases {
        let t = Instant::now();
        let case = r.materialize();
        line(format!(
            "{label}: materialized in {:.1}s",
            t.elapsed().as_secs_f64()
        ));
        all_clean &= bench_one(label, &case, &cfg).map_err(Fatal::environment)?;
    }
    Ok(if all_clean {
        exit::CLEAN
    } else {
        exit::FINDINGS
    })
}
