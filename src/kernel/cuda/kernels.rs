//! The in-process CUDA kernels (`cuda-direct:*`): `naive`, `tiled` and the planted-bug
//! variants of `tiled`. Each run uploads the case ([`DeviceCase`]), hashes the inputs,
//! launches between CUDA events, hashes again, and copies the whole output back.

use super::compile::{Defines, Program};
use super::device::{with_gpu, Gpu, GpuFailure};
use super::hosted::{status, HostedCall, HostedLaunch};
use super::memory::{failure, launch, CacheView, DeviceCase, Params};
use super::sys::{DeviceMemory, Timer};
use crate::case::{Case, ScalePlacement};
use crate::fp8::Fp8Format;
use crate::kernel::Plant;
use crate::kernel::{
    Accumulation, BlockSizes, Capabilities, CompileField, DeviceJudgeRequest, JudgedRun, Kernel,
    OutputBuffer, OutsideContract, RunError, RunInfo,
};
use std::time::Duration;

/// Relative accumulation error declared by `cuda:tiled` (multiplies Σ_d |q_d k_d|).
///
/// Hopper's fp8 tensor cores are known to accumulate with a reduced-width aligned
/// accumulator inside `wgmma` (DeepSeek-V3 §3.3.2: about 14 bits on H800 for long K).
/// `cuda:tiled` uses `mma.sync` m16n8k32, whose K=32 partial sums are added to f32
/// accumulators: on the H200 the largest dot error observed (gpu-selfcheck, random
/// cases of every shape and value kind, see BENCHMARKS.md) was 7.6e-10 of
/// Σ|q_d k_d|, below f32 rounding. 2^-20 keeps a margin of more than 1000x over that
/// while staying far below the errors the planted bugs produce.
pub const TILED_REL: f64 = 1.0 / 1_048_576.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    Naive,
    Tiled(Option<Plant>),
    /// `cuda:tiled` with two planted bugs at once (`bug-A+B`): each is a define of its
    /// own line of `tiled.cu`, so they compose. Opened by name; not listed.
    TiledTwo(Plant, Plant),
    /// A library's kernel launched by the process hosting this crate ([`super::hosted`]).
    /// Never opened by name: the host's entry point ([`crate::hosted`]) builds it.
    Hosted(HostedLaunch),
}

impl Variant {
    pub fn short_name(self) -> String {
        match self {
            Variant::Naive => "naive".into(),
            Variant::Tiled(None) => "tiled".into(),
            Variant::Tiled(Some(p)) => format!("bug-{}", p.name()),
            Variant::TiledTwo(a, b) => format!("bug-{}+{}", a.name(), b.name()),
            Variant::Hosted(_) => "hosted".into(),
        }
    }

    pub fn parse(s: &str) -> Option<Variant> {
        match s {
            "naive" => Some(Variant::Naive),
            "tiled" => Some(Variant::Tiled(None)),
            _ => match Plant::parse_set(s.strip_prefix("bug-")?)?.as_slice() {
                [p] => Some(Variant::Tiled(Some(*p))),
                [a, b] => Some(Variant::TiledTwo(*a, *b)),
                _ => None,
            },
        }
    }

    pub fn all() -> Vec<Variant> {
        let mut v = vec![Variant::Naive, Variant::Tiled(None)];
        v.extend(Plant::every().map(|p| Variant::Tiled(Some(p))));
        v
    }

    pub fn describe(self) -> String {
        match self {
            Variant::Naive => "CUDA, one thread per logit: decode tables, exact products, f32 sums, 64-bit addressing, writes exactly V(r)".into(),
            Variant::Tiled(None) => "CUDA production-style: fp8 tensor-core MMA (f16 for e4m3fnuz), ChunkK=256, split-KV schedule over the SMs, chunked stores with -inf masks".into(),
            Variant::Tiled(Some(p)) => format!("planted bug in cuda:tiled: {}", p.describe()),
            Variant::TiledTwo(a, b) => format!(
                "two planted bugs in cuda:tiled: {}; and {}",
                a.describe(),
                b.describe()
            ),
            Variant::Hosted(_) => "a library kernel launched by the process hosting mqa-fuzz".into(),
        }
    }

    pub fn capabilities(self) -> Capabilities {
        let mut c = Capabilities::everything(ScalePlacement::AfterReluSum);
        c.nan_behaviour = "naive: NaN propagates through dot, relu and head sum".into();
        if let Variant::Tiled(_) | Variant::TiledTwo(..) = self {
            c.block_sizes = BlockSizes::Any;
            c.next_n = (1, 4);
            c.heads = Some(vec![32, 64, 128]);
            c.head_dims = Some(vec![64, 128]);
            c.accumulation = Accumulation::Reduced { rel: TILED_REL };
            c.nan_behaviour = "tiled: a NaN dot product becomes 0 in the relu (fmaxf(x, 0), as DeepGEMM); NaN or inf weights and scales propagate".into();
        }
        c
    }

    /// The compile-time defines of this variant for a case's shape.
    pub fn defines_for(self, case: &Case) -> Defines {
        let s = &case.shape;
        let mut d: Defines = vec![
            ("NN".into(), s.next_n.to_string()),
            ("HH".into(), s.heads.to_string()),
            ("DD".into(), s.head_dim.to_string()),
            (
                "FNUZ".into(),
                ((s.format == Fp8Format::E4m3fnuz) as u8).to_string(),
            ),
        ];
        let plants = match self {
            Variant::Tiled(Some(p)) => vec![p],
            Variant::TiledTwo(a, b) => vec![a, b],
            _ => Vec::new(),
        };
        for p in plants {
            d.push((
                format!("BUG_{}", p.name().to_uppercase().replace('-', "_")),
                "1".into(),
            ));
        }
        d
    }
}

/// Seconds since the previous lap.
struct Lap(std::time::Instant);

impl Lap {
    fn new() -> Lap {
        Lap(std::time::Instant::now())
    }
    fn next(&mut self) -> f64 {
        let now = std::time::Instant::now();
        let t = now.duration_since(self.0).as_secs_f64();
        self.0 = now;
        t
    }
}

/// A CUDA kernel run in this process.
pub struct CudaDirect {
    name: String,
    variant: Variant,
    caps: Capabilities,
    /// The hosted library's version and compile key (built-in kernels: none).
    version: Option<String>,
    compile_key: Vec<CompileField>,
}

impl CudaDirect {
    pub fn new(variant: Variant) -> Self {
        CudaDirect {
            name: format!("cuda-direct:{}", variant.short_name()),
            variant,
            caps: variant.capabilities(),
            version: None,
            compile_key: Vec::new(),
        }
    }

    /// Declares the largest KV pool this device can take, from the memory free when the
    /// kernel opens: 85% of it, the rest for the output, the small inputs and the
    /// reference. The generator then fits a case's pool to the card (its offset class is
    /// what a draw gives up) instead of drawing engine-size pools an 80 GiB card must skip
    /// as out of memory; on a 141 GiB card the limit is above every profile's pools.
    pub fn fitted_to_device(mut self) -> Self {
        if let Ok((free, _)) = with_gpu(|gpu| gpu.ctx.mem_info().map_err(failure)) {
            let limit = free / 20 * 17;
            self.caps.max_kv_bytes = Some(self.caps.max_kv_bytes.map_or(limit, |m| m.min(limit)));
        }
        self
    }

    /// A library kernel its host launches ([`super::hosted`]), described by the host.
    pub fn hosted(
        name: String,
        version: String,
        caps: Capabilities,
        compile_key: Vec<CompileField>,
        launch: HostedLaunch,
    ) -> Self {
        CudaDirect {
            name,
            variant: Variant::Hosted(launch),
            caps,
            version: Some(version),
            compile_key,
        }
    }
}

/// Dynamic shared memory of the tiled kernel for a shape.
fn tiled_smem(case: &Case) -> u32 {
    let s = &case.shape;
    let rows = (s.next_n * s.heads) as u32;
    rows * (s.head_dim as u32 + 16) + rows * 4 + 512
}

/// Launches the kernel of `variant` on an uploaded case (between the timer's events).
/// A hosted kernel's own clock, when its host measured it, comes back in milliseconds
/// (the timer's events then also span the host's wrapping of the call).
pub fn launch_variant(
    gpu: &mut Gpu,
    variant: Variant,
    case: &Case,
    dc: &mut DeviceCase,
    timer: &Timer,
) -> Result<Option<f64>, GpuFailure> {
    let env = GpuFailure::Environment;
    match variant {
        Variant::Hosted(h) => return launch_hosted(gpu, h, case, dc, timer),
        Variant::Naive => {
            let f = gpu
                .function(Program::Naive, "naive_logits", &vec![])
                .map_err(env)?;
            let max_len = (0..case.rows())
                .map(|r| case.valid_len(r))
                .max()
                .unwrap_or(0);
            let gx = max_len.div_ceil(128).clamp(1, 65535) as u32;
            let gy = case.rows().clamp(1, 65535) as u32;
            let mut p = dc.params;
            timer.start().map_err(failure)?;
            launch(&f, (gx, gy, 1), 128, 0, &mut [&mut p])?;
            timer.stop().map_err(failure)?;
        }
        Variant::Tiled(_) | Variant::TiledTwo(..) => {
            let defines = variant.defines_for(case);
            let sched = gpu
                .function(Program::Tiled, "tiled_schedule", &defines)
                .map_err(env)?;
            let main = gpu
                .function(Program::Tiled, "tiled_logits", &defines)
                .map_err(env)?;
            let smem = tiled_smem(case);
            if smem > gpu.max_smem_optin {
                return Err(GpuFailure::OutOfMemory(format!(
                    "needs {smem} bytes of shared memory, the GPU allows {}",
                    gpu.max_smem_optin
                )));
            }
            if smem > 48 * 1024 {
                main.set_max_dynamic_smem(smem).map_err(failure)?;
            }
            let per_sm = main.occupancy(128, smem).map_err(failure)?.clamp(1, 4);
            let mut p: Params = dc.params;
            p.num_workers = (gpu.sms * per_sm) as i32;
            let prefix = DeviceMemory::alloc((case.shape.batch as u64 + 1) * 4).map_err(failure)?;
            let mut prefix_ptr = prefix.ptr();
            timer.start().map_err(failure)?;
            launch(&sched, (1, 1, 1), 1024, 0, &mut [&mut p, &mut prefix_ptr])?;
            launch(
                &main,
                (p.num_workers as u32, 1, 1),
                128,
                smem,
                &mut [&mut p, &mut prefix_ptr],
            )?;
            timer.stop().map_err(failure)?;
            gpu.ctx.synchronize().map_err(failure)?;
            drop(prefix);
        }
    }
    gpu.ctx.synchronize().map_err(failure)?;
    Ok(None)
}

/// Hands the laid-out case to the host's callback and classifies what came back: an
/// error with the context lost is a fault (the process's end); one with the context
/// intact is the library's refusal or its crash on this case.
fn launch_hosted(
    gpu: &mut Gpu,
    h: HostedLaunch,
    case: &Case,
    dc: &mut DeviceCase,
    timer: &Timer,
) -> Result<Option<f64>, GpuFailure> {
    gpu.ctx.synchronize().map_err(failure)?;
    let mut call = HostedCall::new(dc.params, case.num_blocks, case.rows() as u64);
    timer.start().map_err(failure)?;
    // SAFETY: the host keeps its callback alive while it serves ([`crate::hosted`]);
    // the call's pointers stay valid until `dc` is dropped, after the synchronize below.
    let code = unsafe { h.call(&mut call) };
    timer.stop().map_err(failure)?;
    let synced = gpu.ctx.synchronize().map_err(failure);
    let message = call.message();
    match (code, synced) {
        (status::OK, Ok(())) => Ok((call.kernel_us >= 0.0).then_some(call.kernel_us / 1e3)),
        (_, Err(GpuFailure::Fault(e))) => Err(GpuFailure::Fault(if message.is_empty() {
            e
        } else {
            format!("{message} ({e})")
        })),
        (_, Err(e)) => Err(e),
        (status::SKIPPED, Ok(())) => Err(GpuFailure::Skipped(message)),
        (status::ENVIRONMENT, Ok(())) => Err(GpuFailure::Environment(message)),
        (status::RAISED, Ok(())) => Err(GpuFailure::Raised(message)),
        (other, Ok(())) => Err(GpuFailure::Environment(format!(
            "the host's launch callback returned {other}, which means nothing ({message})"
        ))),
    }
}

/// A case laid out and run on the device, its inputs checked: the part of a run that
/// judging on the CPU and on the device share.
struct Ran {
    dc: DeviceCase,
    info: RunInfo,
    lap: Lap,
}

/// Lays `case` out (with the harness's `out`, or an output poisoned on the device when
/// `None`; the kernel seeing the cache through `view`), hashes the inputs, launches
/// `variant` between events, checks the inputs.
fn lay_out_and_run(
    gpu: &mut Gpu,
    variant: Variant,
    case: &Case,
    out: Option<&OutputBuffer>,
    view: CacheView,
) -> Result<Ran, GpuFailure> {
    let mut phases = std::collections::BTreeMap::new();
    let mut lap = Lap::new();
    let mut dc = match out {
        Some(out) => DeviceCase::upload(gpu, case, out, view)?,
        None => DeviceCase::upload_poisoned(gpu, case, view)?,
    };
    lap.next();
    for (name, secs) in &dc.upload_phases {
        *phases.entry(format!("upload: {name}")).or_insert(0.0) += secs;
    }
    let before = dc.input_hashes(gpu, false)?;
    let timer = Timer::new().map_err(failure)?;
    phases.insert("check inputs: before the run".to_string(), lap.next());
    let own_ms = launch_variant(gpu, variant, case, &mut dc, &timer)?;
    phases.insert("launch".to_string(), lap.next());
    let ms = match own_ms {
        Some(ms) => ms,
        None => timer.elapsed_ms().map_err(failure)? as f64,
    };
    let after = dc.input_hashes(gpu, true)?;
    let checked = match dc.view {
        CacheView::ReadBack => "check inputs: after (the whole cache read)",
        CacheView::ReadOnly => "check inputs: after (the cache was read-only)",
    };
    phases.insert(checked.to_string(), lap.next());
    let info = RunInfo {
        kernel_time: Some(Duration::from_secs_f64(ms / 1e3)),
        inputs_intact: Some(before == after),
        device_bytes: Some(dc.bytes),
        queue_wait: None,
        phases,
    };
    Ok(Ran { dc, info, lap })
}

/// Runs `variant` on `case` into `out`: the whole device-side protocol of a case.
pub fn run_variant(
    variant: Variant,
    case: &Case,
    out: &mut OutputBuffer,
) -> Result<RunInfo, RunError> {
    with_gpu(|gpu| {
        let Ran {
            dc,
            mut info,
            mut lap,
        } = lay_out_and_run(gpu, variant, case, Some(out), CacheView::ReadBack)?;
        dc.download_output(out)?;
        info.phases.insert("download".to_string(), lap.next());
        drop(dc);
        info.phases.insert("free".to_string(), lap.next());
        Ok(info)
    })
    .map_err(run_error)
}

fn run_error(e: GpuFailure) -> RunError {
    match e {
        GpuFailure::Environment(m) => RunError::Environment(m),
        GpuFailure::Fault(m) => RunError::Crash(format!("CUDA fault: {m}")),
        GpuFailure::OutOfMemory(m) | GpuFailure::Skipped(m) => RunError::Skipped(m),
        GpuFailure::Raised(m) => RunError::Crash(m),
    }
}

/// Runs `variant` on `case` and judges the output on the device (`super::judge`): the
/// output is poisoned there and copied into `out` only when the judgement holds a
/// finding (or breaks the kernel's `outside` contract).
pub fn run_variant_judged(
    variant: Variant,
    outside: OutsideContract,
    case: &Case,
    req: &DeviceJudgeRequest,
    out: &mut OutputBuffer,
) -> Result<JudgedRun, RunError> {
    let view = match req.read_only_cache {
        true => CacheView::ReadOnly,
        false => CacheView::ReadBack,
    };
    with_gpu(|gpu| {
        let Ran {
            dc,
            mut info,
            mut lap,
        } = lay_out_and_run(gpu, variant, case, None, view)?;
        let mut times = super::judge::JudgeTimes::default();
        let judgement = super::judge::judge_case(gpu, &dc, case, req, &mut times)?;
        let judged = lap.next();
        let phases = &mut info.phases;
        if req.digest_only {
            phases.insert("digest (device)".to_string(), judged);
        } else {
            for (name, secs) in times.phases() {
                phases.insert(name.to_string(), secs);
            }
        }
        let contract_broken = outside == OutsideContract::NegInf
            && judgement.outside_elements != judgement.outside_neg_inf;
        let output_written =
            !req.digest_only && (judgement.has_value_findings() || contract_broken);
        if output_written {
            dc.download_output(out)?;
            phases.insert("download".to_string(), lap.next());
        }
        Ok(JudgedRun {
            info,
            judgement,
            output_written,
        })
    })
    .map_err(run_error)
}

impl Kernel for CudaDirect {
    fn name(&self) -> &str {
        &self.name
    }

    fn version(&self) -> String {
        self.version
            .clone()
            .unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_string())
    }

    fn compile_key(&self) -> &[CompileField] {
        &self.compile_key
    }

    fn on_accelerator(&self) -> bool {
        true
    }

    fn lost(&self) -> bool {
        super::device::faulted()
    }

    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn warm_up(&self) -> Result<Option<String>, String> {
        let w = super::warm_up::warm_up(&self.caps)?;
        Ok(Some(format!(
            "warm-up: {} device functions loaded in {:.1} ms ({} not compiled here yet)",
            w.loaded,
            w.secs * 1e3,
            w.not_cached
        )))
    }

    fn run(&self, case: &Case, out: &mut OutputBuffer) -> Result<RunInfo, RunError> {
        run_variant(self.variant, case, out)
    }

    /// Opening it checked the GPU ([`super::open`]); the shapes it cannot judge are the
    /// GPU reference's, checked per case.
    fn device_judge(&self) -> Result<(), String> {
        Ok(())
    }

    fn run_judged(
        &self,
        case: &Case,
        req: &DeviceJudgeRequest,
        out: &mut OutputBuffer,
    ) -> Result<JudgedRun, RunError> {
        if let Some(why) = crate::kernel::device_judge::rejects(&case.shape) {
            if !req.digest_only {
                return Err(RunError::Environment(format!("device judge: {why}")));
            }
        }
        run_variant_judged(self.variant, self.caps.outside, case, req, out)
    }
}
