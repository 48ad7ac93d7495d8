//! The kernel contract: what every kernel under test implements ([`Kernel`]), declares
//! ([`Capabilities`]) and reports ([`RunInfo`], [`RunError`]). A leaf: it knows the case
//! model and nothing of any backend, so the generator and the oracle depend on the
//! contract, never on CPU, CUDA or exec code.

use super::device_judge::{DeviceJudgeRequest, DeviceJudgement};
use super::output::OutputBuffer;
use crate::case::{Case, ScalePlacement, ValueLayout};
use crate::error::Fatal;
use crate::fp8::Fp8Format;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How a kernel accumulates; decides the per-element error bound.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Accumulation {
    /// Exact products, f32 sums (each dot: D-1 roundings of 2^-24).
    F32,
    /// Tensor-core fp8 MMA whose accumulator keeps fewer bits (Hopper: about 2^-13
    /// relative to the magnitude per dot). `rel` multiplies `Σ_d |q_d k_d|`.
    Reduced { rel: f64 },
}

/// What a kernel leaves outside the valid set V(r) in `[0, max_model_len)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutsideContract {
    /// Anything (stale, unwritten, partial-chunk garbage): statistics only.
    Any,
    /// Every position outside V(r) is -inf (DeepGEMM `clean_logits=True`).
    NegInf,
}

/// Which block sizes a kernel accepts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockSizes {
    Any,
    List(Vec<usize>),
}

impl BlockSizes {
    pub fn allows(&self, bs: usize) -> bool {
        match self {
            BlockSizes::Any => true,
            BlockSizes::List(v) => v.contains(&bs),
        }
    }
}

/// Everything the generator and the oracle need to know about a kernel.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Capabilities {
    pub formats: Vec<Fp8Format>,
    pub layouts: Vec<ValueLayout>,
    pub block_sizes: BlockSizes,
    /// Inclusive range of next_n.
    pub next_n: (usize, usize),
    /// `None`: any H (multiple of 1); otherwise the accepted list.
    pub heads: Option<Vec<usize>>,
    /// `None`: any D (multiple of 16).
    pub head_dims: Option<Vec<usize>>,
    pub lens_1d: bool,
    pub lens_2d: bool,
    pub scale_placement: ScalePlacement,
    pub accumulation: Accumulation,
    pub outside: OutsideContract,
    /// Largest KV cache (bytes) it can be given; `None`: no limit of its own.
    pub max_kv_bytes: Option<u64>,
    /// Bytes the KV block stride must be a multiple of (DeepGEMM's TMA descriptors: 16);
    /// `None`: any stride. A padded stride is then padded up to the next multiple.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_stride_align: Option<u64>,
    /// Whether hostile values (NaN codes, non-finite scales/weights) may be sent.
    pub hostile_values: bool,
    /// What the kernel does with NaN inputs, in words (reported, never judged).
    pub nan_behaviour: String,
}

impl Capabilities {
    /// The production-style CPU kernels: everything the case model can express.
    pub fn everything(placement: ScalePlacement) -> Self {
        Capabilities {
            formats: Fp8Format::ALL.to_vec(),
            layouts: ValueLayout::ALL.to_vec(),
            block_sizes: BlockSizes::Any,
            next_n: (1, crate::case::MAX_NEXT_N),
            heads: None,
            head_dims: None,
            lens_1d: true,
            lens_2d: true,
            scale_placement: placement,
            accumulation: Accumulation::F32,
            outside: OutsideContract::Any,
            max_kv_bytes: None,
            kv_stride_align: None,
            hostile_values: true,
            nan_behaviour: "propagates NaN through dot and head sum".into(),
        }
    }

    /// Why this kernel cannot run `case`, or `None` when it can: the first change
    /// [`Capabilities::fit`] would make to it.
    pub fn rejects(&self, case: &Case) -> Option<String> {
        self.first_change(Demands::of_case(case))
    }

    /// Why this kernel cannot run `case` as a shape, its memory limit left out: what a
    /// worker life checks again. A life's `max_kv_bytes` is a share of the memory free
    /// when it started, which the life it replaces (still holding its pools) made
    /// smaller; the harness admitted the case against the pool's limit, and an
    /// allocation that fails is a skip (out of device memory) either way.
    pub fn rejects_shape(&self, case: &Case) -> Option<String> {
        self.first_change(Demands {
            kv_bytes: 0,
            ..Demands::of_case(case)
        })
    }

    /// The first change [`Capabilities::fit`] would make to `d`, in words.
    fn first_change(&self, mut d: Demands) -> Option<String> {
        let first = self.fit(&mut d).into_iter().next();
        first.map(|a| a.to_string())
    }

    /// Changes `d` to what this kernel takes, nearest first, and says what it changed
    /// (empty: `d` fits). The one rule set of the capabilities: a case is rejected when
    /// it would change ([`Capabilities::rejects`]), a draw is resolved into what it
    /// becomes (`generate::Draw::resolve`).
    pub fn fit(&self, d: &mut Demands) -> Vec<Adjustment> {
        let mut changed = Vec::new();
        if !self.formats.contains(&d.format) {
            changed.push(Adjustment::Format(d.format));
            d.format = self.formats[0];
        }
        if !self.layouts.contains(&d.layout) {
            changed.push(Adjustment::Layout(d.layout));
            d.layout = self.layouts.first().copied().unwrap_or(d.layout);
        }
        if let BlockSizes::List(v) = &self.block_sizes {
            if !v.contains(&d.block_size) {
                changed.push(Adjustment::BlockSize(d.block_size));
                d.block_size = *v
                    .iter()
                    .min_by_key(|&&b| b.abs_diff(d.block_size))
                    .unwrap_or(&64);
            }
        }
        let (lo, hi) = self.next_n;
        if d.next_n < lo || d.next_n > hi {
            changed.push(Adjustment::NextN(d.next_n));
            d.next_n = d.next_n.clamp(lo, hi);
        }
        if let Some(h) = &self.heads {
            if !h.contains(&d.heads) {
                changed.push(Adjustment::Heads(d.heads));
                d.heads = nearest(h, d.heads);
            }
        }
        if let Some(h) = &self.head_dims {
            if !h.contains(&d.head_dim) {
                changed.push(Adjustment::HeadDim(d.head_dim));
                d.head_dim = nearest(h, d.head_dim);
            }
        }
        if let Some(align) = self.kv_stride_align.filter(|&a| a > 1) {
            // After the block size and head dim moved: the stride is theirs plus the pad.
            let stride = (d.block_size * (d.head_dim + 4)) as u64 + d.kv_stride_pad;
            if !stride.is_multiple_of(align) {
                changed.push(Adjustment::KvStride(stride));
                d.kv_stride_pad += align - stride % align;
            }
        }
        if d.lens_2d && !self.lens_2d {
            changed.push(Adjustment::Lens2d(true));
            d.lens_2d = false;
        }
        if !d.lens_2d && !self.lens_1d {
            changed.push(Adjustment::Lens2d(false));
            d.lens_2d = true;
        }
        if d.hostile_values && !self.hostile_values {
            changed.push(Adjustment::HostileValues);
            d.hostile_values = false;
        }
        if let Some(limit) = self.max_kv_bytes {
            if d.kv_bytes > limit {
                changed.push(Adjustment::KvBytes {
                    bytes: d.kv_bytes,
                    limit,
                });
                d.kv_bytes = limit;
            }
        }
        changed
    }
}

/// The value of `list` nearest to `x` (the first of two as near).
fn nearest(list: &[usize], x: usize) -> usize {
    *list.iter().min_by_key(|&&v| v.abs_diff(x)).unwrap()
}

/// What a case asks of a kernel, in the terms its [`Capabilities`] limit: what
/// [`Capabilities::fit`] changes.
#[derive(Clone, Debug, PartialEq)]
pub struct Demands {
    pub format: Fp8Format,
    pub layout: ValueLayout,
    pub block_size: usize,
    pub next_n: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Per-token (2-D) context lengths.
    pub lens_2d: bool,
    /// Hostile values (NaN codes, non-finite scales and weights).
    pub hostile_values: bool,
    /// Bytes of the device KV cache.
    pub kv_bytes: u64,
    /// Bytes between KV blocks beyond the block's own (`block_size * (head_dim + 4)`).
    pub kv_stride_pad: u64,
}

impl Demands {
    /// What `case` asks. A case does not record how its values were drawn, so it never
    /// asks for hostile values: that rule holds for draws.
    pub fn of_case(case: &Case) -> Demands {
        let s = &case.shape;
        Demands {
            format: s.format,
            layout: s.layout,
            block_size: s.block_size,
            next_n: s.next_n,
            heads: s.heads,
            head_dim: s.head_dim,
            lens_2d: case.context_lens.is_2d(),
            hostile_values: false,
            kv_bytes: case.kv_cache_bytes(),
            kv_stride_pad: case.kv_block_stride.saturating_sub(s.block_bytes() as u64),
        }
    }
}

/// One change [`Capabilities::fit`] made: the value the kernel does not take.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Adjustment {
    Format(Fp8Format),
    Layout(ValueLayout),
    BlockSize(usize),
    NextN(usize),
    Heads(usize),
    HeadDim(usize),
    /// Per-token (`true`) or per-sequence (`false`) context lengths.
    Lens2d(bool),
    HostileValues,
    /// A KV cache of `bytes`, more than the kernel's `limit`.
    KvBytes {
        bytes: u64,
        limit: u64,
    },
    /// A KV block stride of this many bytes, not a multiple of the kernel's alignment.
    KvStride(u64),
}

impl Adjustment {
    /// Whether the change takes a hazard away (a combination the campaign skipped, and
    /// counts). Moving to the one value layout or length form a kernel takes, from the
    /// plain one, takes nothing away.
    pub fn drops_a_hazard(self) -> bool {
        !matches!(
            self,
            Adjustment::Layout(ValueLayout::Normal) | Adjustment::Lens2d(false)
        )
    }
}

impl std::fmt::Display for Adjustment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Adjustment::Format(x) => write!(f, "format {x}"),
            Adjustment::Layout(l) => write!(f, "layout {}", l.name()),
            Adjustment::BlockSize(b) => write!(f, "block_size {b}"),
            Adjustment::NextN(n) => write!(f, "next_n {n}"),
            Adjustment::Heads(h) => write!(f, "heads {h}"),
            Adjustment::HeadDim(d) => write!(f, "head_dim {d}"),
            Adjustment::Lens2d(true) => f.write_str("2-D context_lens"),
            Adjustment::Lens2d(false) => f.write_str("1-D context_lens"),
            Adjustment::HostileValues => f.write_str("hostile values"),
            Adjustment::KvBytes { bytes, limit } => {
                write!(f, "kv cache of {bytes} bytes > {limit}")
            }
            Adjustment::KvStride(s) => write!(f, "kv block stride {s} (unaligned)"),
        }
    }
}

/// What a run reports besides the output.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// Time of the kernel itself (device events for GPUs, wall time for CPU kernels).
    pub kernel_time: Option<Duration>,
    /// `Some(false)` when the kernel's inputs differed after the run from before.
    pub inputs_intact: Option<bool>,
    /// Device memory the case used, in bytes.
    pub device_bytes: Option<u64>,
    /// Time the call waited for a free worker before the case was sent (a pool with
    /// more cases in flight than workers); not part of the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_wait: Option<Duration>,
    /// Where the call's time went, in seconds per phase (a worker's `phases_us`, the
    /// harness's own copies into and out of the worker's region): `upload`, `kernel`,
    /// `download`, ... Summed per kernel in the report.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub phases: std::collections::BTreeMap<String, f64>,
}

/// Why a run produced no output.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum RunError {
    /// The kernel (or its worker) died: launch error, illegal address, timeout, abort.
    #[error("crash: {0}")]
    Crash(String),
    /// The kernel cannot take this case (capabilities, memory): not a finding.
    #[error("skipped: {0}")]
    Skipped(String),
    /// The environment is broken (driver gone, adapter not installed): stops the campaign.
    #[error("{0}")]
    Environment(String),
}

/// How a crash message says the kernel did not answer in time (it hung, or ran away).
pub const TIMEOUT_MARK: &str = "(timeout)";

impl RunError {
    /// A crash by timeout: the kernel hung rather than faulted.
    pub fn is_timeout(&self) -> bool {
        matches!(self, RunError::Crash(m) if m.contains(TIMEOUT_MARK))
    }
}

/// A case field a library specialises (JIT-compiles) its kernel on: DeepGEMM compiles
/// per heads, head dim, next_n and block size; Triton per constexpr set. A kernel
/// declares its compile key (`Kernel::compile_key`, a worker's `compile_key` in its
/// hello); campaigns then run cases in shape epochs (many cases per key before the next)
/// and report a key's first call (compile included) apart from the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompileField {
    NextN,
    Heads,
    HeadDim,
    BlockSize,
    Layout,
    Format,
    /// Whether `context_lens` is 2-D (`[B, N]`).
    Lens2d,
    /// The batch size rounded up to a multiple of [`BATCH_CLASS`]: DeepGEMM compiles its
    /// scheduler (`get_paged_mqa_logits_metadata`) per such aligned batch size. Shape
    /// epochs do not pin it (a batch is drawn with its lengths); the report counts a
    /// class's first call as a compile.
    BatchClass,
}

/// The multiple [`CompileField::BatchClass`] rounds a batch size up to.
pub const BATCH_CLASS: usize = 32;

impl CompileField {
    pub const ALL: [CompileField; 8] = [
        CompileField::NextN,
        CompileField::Heads,
        CompileField::HeadDim,
        CompileField::BlockSize,
        CompileField::Layout,
        CompileField::Format,
        CompileField::Lens2d,
        CompileField::BatchClass,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CompileField::NextN => "next_n",
            CompileField::Heads => "heads",
            CompileField::HeadDim => "head_dim",
            CompileField::BlockSize => "block_size",
            CompileField::Layout => "layout",
            CompileField::Format => "format",
            CompileField::Lens2d => "lens_2d",
            CompileField::BatchClass => "batch_class",
        }
    }

    /// This field's value in `case`, as text.
    pub fn value(self, case: &Case) -> String {
        let s = &case.shape;
        match self {
            CompileField::NextN => s.next_n.to_string(),
            CompileField::Heads => s.heads.to_string(),
            CompileField::HeadDim => s.head_dim.to_string(),
            CompileField::BlockSize => s.block_size.to_string(),
            CompileField::Layout => s.layout.name().to_string(),
            CompileField::Format => s.format.name().to_string(),
            CompileField::Lens2d => case.context_lens.is_2d().to_string(),
            CompileField::BatchClass => (s.batch.div_ceil(BATCH_CLASS) * BATCH_CLASS).to_string(),
        }
    }
}

/// The compile key of `case` under `fields` (`heads=64 head_dim=128`); `None` when the
/// kernel declares none.
pub fn compile_key_of(fields: &[CompileField], case: &Case) -> Option<String> {
    if fields.is_empty() {
        return None;
    }
    let parts: Vec<String> = fields
        .iter()
        .map(|f| format!("{}={}", f.name(), f.value(case)))
        .collect();
    Some(parts.join(" "))
}

/// How a kernel's worker processes ran (`exec:` kernels), for the report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerReport {
    /// The protocol version the workers speak.
    pub protocol: u64,
    /// Whether workers are forked by a fork server.
    pub fork_server: bool,
    /// Workers started again after a crash, and how long that took.
    pub restarts: u64,
    /// Start attempts that failed and were retried.
    pub restart_retries: u64,
    pub restart_max_secs: f64,
    pub restart_mean_secs: f64,
    /// Restarts served by a life the fork server had started ahead (a spare).
    #[serde(default)]
    pub restarts_from_spare: u64,
    /// Worker lives that warmed up before their hello ([`Kernel::warm_up`]), and the
    /// mean seconds it took (off the campaign's path for lives started ahead).
    #[serde(default)]
    pub warm_ups: u64,
    #[serde(default)]
    pub warm_up_mean_secs: f64,
    /// Workers ended after their case crashed (the crash reported, not a death), and
    /// the mean seconds until one was gone (part of that case's run).
    #[serde(default)]
    pub crash_exits: u64,
    #[serde(default)]
    pub crash_exit_mean_secs: f64,
}

/// A kernel under test.
pub trait Kernel: Send + Sync {
    /// Full name as given on the command line (`cpu:chunked`, `cuda:tiled`, `exec:...`).
    fn name(&self) -> &str;
    /// Library version or build, for reports.
    fn version(&self) -> String {
        env!("CARGO_PKG_VERSION").to_string()
    }
    fn capabilities(&self) -> &Capabilities;
    /// How many cases the campaign should run on this kernel at once: 1 for CPU kernels
    /// (they parallelize inside with rayon); for a pool of GPU workers, a few cases per
    /// worker, so the host generates and judges while the GPU runs.
    fn preferred_jobs(&self) -> usize {
        1
    }
    /// Whether the kernel runs on an accelerator (a GPU of its own): production cases
    /// then run at an engine's full size; CPU kernels get them scaled (`--scale`).
    fn on_accelerator(&self) -> bool {
        false
    }
    /// The case fields the kernel is compiled for (see [`CompileField`]); empty: one
    /// build serves every case.
    fn compile_key(&self) -> &[CompileField] {
        &[]
    }
    /// Whether the kernel's device is lost for this process (a fault left its context
    /// unusable): a worker serving it stops after answering, so a fresh one follows.
    fn lost(&self) -> bool {
        false
    }
    /// Loads what its first case would otherwise load (device modules), before a worker
    /// serving it says hello, so that a life started ahead of a restart takes its first
    /// case at full speed. `Ok(Some(line))` says what it did; `Err` why it could not
    /// (the first case meets the same and reports it). `MQA_FUZZ_WARM_UP=off` skips it.
    fn warm_up(&self) -> Result<Option<String>, String> {
        Ok(None)
    }
    /// Its worker processes, for kernels that run in them.
    fn worker_report(&self) -> Option<WorkerReport> {
        None
    }
    /// The poisoned, guarded buffer the harness runs `case` into: on the heap, or where
    /// the kernel can fill it without a copy (a worker pool's shared memory).
    fn output_for(&self, case: &Case) -> OutputBuffer {
        OutputBuffer::for_case(case)
    }
    /// Runs the case into `out` (poisoned, guarded, owned by the harness; made by
    /// [`Self::output_for`] or on the heap).
    fn run(&self, case: &Case, out: &mut OutputBuffer) -> Result<RunInfo, RunError>;
    /// Whether [`Self::run_judged`] works here: `Err(why not)`, in words that finish
    /// "the judge runs on the CPU: ...".
    fn device_judge(&self) -> Result<(), String> {
        Err(format!("{} leaves its output in host memory", self.name()))
    }
    /// The buffer [`Self::run_judged`] copies an output into when it must: where the
    /// kernel can fill it without a copy, and not poisoned (the copy overwrites every
    /// element, guards included).
    fn output_for_judged(&self, case: &Case) -> OutputBuffer {
        self.output_for(case)
    }
    /// Runs `case` and judges it where the output lies (DESIGN §8): the exact GPU
    /// reference and the oracle's rules on the device, only the judgement back. The
    /// output is copied into `out` only when the judgement holds a finding, for the CPU
    /// judge's offenders and picture (`JudgedRun::output_written`).
    fn run_judged(
        &self,
        _case: &Case,
        _req: &DeviceJudgeRequest,
        _out: &mut OutputBuffer,
    ) -> Result<JudgedRun, RunError> {
        Err(RunError::Environment(
            self.device_judge().err().unwrap_or_else(|| {
                format!("{} judges on its device but does not say how", self.name())
            }),
        ))
    }
}

/// A run judged on the device ([`Kernel::run_judged`]).
#[derive(Clone, Debug, Default)]
pub struct JudgedRun {
    pub info: RunInfo,
    pub judgement: DeviceJudgement,
    /// Whether the output buffer was filled (a judgement with findings: the CPU judge
    /// then names the offenders and draws the picture from it).
    pub output_written: bool,
}

/// A kernel the registry knows, and whether this machine can run it.
pub struct KernelEntry {
    pub name: String,
    pub description: String,
    /// `Err(reason)` when it cannot run here.
    pub available: Result<(), String>,
    /// A planted bug: the kernel is expected to fail.
    pub planted_bug: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("unknown kernel {0:?} (see `mqa-fuzz kernels`)")]
    Unknown(String),
    #[error("kernel {name} is not available on this machine: {reason}")]
    Unavailable { name: String, reason: String },
    /// A malformed kernel name or setting (`exec:` with no command, a bad
    /// `MQA_FUZZ_EXEC_*` value): bad usage, not a missing environment.
    #[error("kernel {name}: {reason}")]
    Invalid { name: String, reason: String },
}

impl From<OpenError> for Fatal {
    fn from(e: OpenError) -> Self {
        match e {
            OpenError::Unknown(_) | OpenError::Invalid { .. } => Fatal::usage(e.to_string()),
            OpenError::Unavailable { .. } => Fatal::environment(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demands() -> Demands {
        Demands {
            format: Fp8Format::E4m3fnuz,
            layout: ValueLayout::Shuffle16,
            block_size: 20,
            next_n: 5,
            heads: 40,
            head_dim: 64,
            lens_2d: true,
            hostile_values: true,
            kv_bytes: 1 << 33,
            kv_stride_pad: 0,
        }
    }

    #[test]
    fn a_padded_stride_is_padded_up_to_the_alignment_after_the_block_moved() {
        let aligned = Capabilities {
            block_sizes: BlockSizes::List(vec![64]),
            kv_stride_align: Some(16),
            ..Capabilities::everything(ScalePlacement::AfterReluSum)
        };
        // Block 20 moves to 64 first (64 * 68 = 4352 bytes); the pad of 92 then gives 4444.
        let mut d = Demands {
            kv_stride_pad: 92,
            ..demands()
        };
        let changed = aligned.fit(&mut d);
        assert_eq!(
            changed,
            vec![Adjustment::BlockSize(20), Adjustment::KvStride(4444)]
        );
        assert_eq!(d.kv_stride_pad, 96);
        assert_eq!(aligned.fit(&mut d), vec![], "an aligned stride fits");
        assert!(changed[1].drops_a_hazard());
    }

    #[test]
    fn fit_moves_every_demand_to_the_nearest_the_kernel_takes() {
        let everything = Capabilities::everything(ScalePlacement::AfterReluSum);
        let mut d = demands();
        assert_eq!(everything.fit(&mut d), vec![], "a demand that fits stays");
        assert_eq!(d, demands());
        let narrow = Capabilities {
            formats: vec![Fp8Format::E4m3fn],
            layouts: vec![ValueLayout::Normal],
            block_sizes: BlockSizes::List(vec![16, 64]),
            next_n: (1, 2),
            heads: Some(vec![32, 64]),
            head_dims: Some(vec![128]),
            lens_2d: false,
            hostile_values: false,
            max_kv_bytes: Some(1 << 32),
            ..everything
        };
        let changed = narrow.fit(&mut d);
        let words: Vec<String> = changed.iter().map(ToString::to_string).collect();
        assert_eq!(
            words,
            [
                "format e4m3fnuz",
                "layout shuffle16",
                "block_size 20",
                "next_n 5",
                "heads 40",
                "head_dim 64",
                "2-D context_lens",
                "hostile values",
                "kv cache of 8589934592 bytes > 4294967296",
            ]
        );
        let fitted = (d.block_size, d.next_n, d.heads, d.head_dim, d.lens_2d);
        assert_eq!(fitted, (16, 2, 32, 128, false));
        assert_eq!(narrow.fit(&mut d), vec![], "a fitted demand fits");
        assert!(changed.iter().all(|a| a.drops_a_hazard()));
        // Moving to the only layout a kernel takes drops nothing.
        let shuffle_only = Capabilities {
            layouts: vec![ValueLayout::Shuffle16],
            ..narrow
        };
        let changed = shuffle_only.fit(&mut d);
        assert_eq!(changed, vec![Adjustment::Layout(ValueLayout::Normal)]);
        assert!(!changed[0].drops_a_hazard());
    }
}
