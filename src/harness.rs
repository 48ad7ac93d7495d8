//! Runs one case on one kernel and judges it: the unit of work of every command.
//!
//! The harness owns the output buffer (poisoned, guarded), computes the reference once
//! per scale placement and case, and hands both to the oracle. A kernel whose output is
//! on a GPU that can judge it is judged there instead (DESIGN §8, `oracle::device`): only
//! the judgement comes back, the CPU re-checks a sample of it, and the output and the CPU
//! reference are fetched only for a judgement with findings.

use crate::case::{Case, ScalePlacement};
use crate::kernel::{DeviceJudgeRequest, Kernel, OutputBuffer, RunError};
use crate::oracle::{self, Class, JudgeMode, OracleConfig, Verdict};
use crate::reference::{self, Reference, RowSelection};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// References of one case, computed on first use for each placement.
pub struct ReferenceCache<'a> {
    case: &'a Case,
    selection: RowSelection,
    by_placement: HashMap<ScalePlacement, Reference>,
    /// Time spent computing references.
    pub time: Duration,
}

impl<'a> ReferenceCache<'a> {
    pub fn new(case: &'a Case) -> Self {
        Self::with_selection(case, RowSelection::All)
    }

    pub fn with_selection(case: &'a Case, selection: RowSelection) -> Self {
        ReferenceCache {
            case,
            selection,
            by_placement: HashMap::new(),
            time: Duration::ZERO,
        }
    }

    /// Whether every row and position is computed (not a sampled verification).
    pub fn is_full(&self) -> bool {
        self.selection == RowSelection::All
    }

    pub fn get(&mut self, placement: ScalePlacement) -> &Reference {
        if !self.by_placement.contains_key(&placement) {
            let start = Instant::now();
            // Positive finite scales make both placements identical: share the work.
            let other = match placement {
                ScalePlacement::AfterReluSum => ScalePlacement::InsideRelu,
                ScalePlacement::InsideRelu => ScalePlacement::AfterReluSum,
            };
            let r = match self.by_placement.get(&other) {
                Some(r) if scales_positive(self.case) => Reference {
                    placement,
                    rows: r.rows.clone(),
                },
                _ => reference::compute(self.case, placement, &self.selection),
            };
            self.time += start.elapsed();
            self.by_placement.insert(placement, r);
        }
        &self.by_placement[&placement]
    }

    /// The reference for `placement` (computed if it was not), kept after the cache.
    pub fn into_reference(mut self, placement: ScalePlacement) -> Reference {
        self.get(placement);
        self.by_placement
            .remove(&placement)
            .expect("computed just above")
    }
}

fn scales_positive(case: &Case) -> bool {
    let s = &case.shape;
    case.kv.iter().all(|(_, b)| {
        (0..s.block_size).all(|p| {
            let x = case.k_scale(b, p);
            x.is_finite() && x > 0.0
        })
    })
}

/// One judged run, with the kernel's output kept for pictures and comparisons.
pub struct Judged {
    pub verdict: Verdict,
    pub output: Option<OutputBuffer>,
    pub wall: Duration,
    /// The part of `wall` spent before the kernel was called: the capability check and
    /// the harness's output buffer (allocated and poisoned with NaN, guard zones and row
    /// padding included), which for the 2^31-byte output axis is GiBs of stores.
    pub setup: Duration,
    /// Time the oracle took to judge the output (the reference excluded).
    pub judge: Duration,
    /// Set when the environment broke (driver gone, adapter missing): stop, exit 3.
    pub environment_error: Option<String>,
    /// Judged on the device: each row's digest of V(r) (what properties compare when
    /// there is no `output`), and whether the CPU then judged the fetched output too.
    pub device: Option<DeviceSide>,
}

/// What a run judged on the device leaves for the rest of the campaign.
pub struct DeviceSide {
    pub row_digests: Vec<u64>,
    /// Elements the CPU re-checked.
    pub rechecked: u64,
    /// The judgement held a finding: the output came back and the CPU judged it.
    pub cpu_judged: bool,
    /// The judged run had its cache read-only (property re-runs are laid out alike).
    pub read_only_cache: bool,
}

/// Where `kernel` judges `case` under `mode`: `Err(why the CPU)` when not on its device.
pub fn judge_site(kernel: &dyn Kernel, case: &Case, mode: JudgeMode) -> Result<(), String> {
    if mode == JudgeMode::Cpu {
        return Err("--judge cpu".into());
    }
    kernel.device_judge()?;
    match crate::kernel::device_judge::rejects(&case.shape) {
        Some(why) => Err(why),
        None => Ok(()),
    }
}

/// Runs `case` on `kernel` and judges the result.
pub fn run_and_judge(
    kernel: &dyn Kernel,
    case: &Case,
    refs: &mut ReferenceCache,
    cfg: &OracleConfig,
) -> Judged {
    let caps = kernel.capabilities();
    let start = Instant::now();
    if let Some(why) = caps.rejects(case) {
        let verdict = Verdict {
            skipped: Some(why),
            ..Default::default()
        };
        return Judged {
            verdict,
            output: None,
            wall: start.elapsed(),
            setup: start.elapsed(),
            judge: Duration::ZERO,
            environment_error: None,
            device: None,
        };
    }
    if judge_site(kernel, case, cfg.judge).is_ok() {
        return run_and_judge_on_device(kernel, case, refs, cfg, start);
    }
    let mut out = kernel.output_for(case);
    let setup = start.elapsed();
    let result = kernel.run(case, &mut out);
    // Waiting for a free worker is not the run's time.
    let queued = result.as_ref().ok().and_then(|i| i.queue_wait);
    let wall = start.elapsed().saturating_sub(queued.unwrap_or_default());
    let reference = refs.get(caps.scale_placement);
    let judge_start = Instant::now();
    let verdict = match &result {
        Ok(info) => oracle::judge(case, reference, caps, Ok((info, &out)), cfg),
        Err(e) => oracle::judge(case, reference, caps, Err(e), cfg),
    };
    let environment_error = match &result {
        Err(crate::kernel::RunError::Environment(m)) => Some(m.clone()),
        _ => None,
    };
    let judge = judge_start.elapsed();
    let output = result.is_ok().then_some(out);
    Judged {
        verdict,
        output,
        wall,
        setup,
        judge,
        environment_error,
        device: None,
    }
}

/// [`run_and_judge`] on the device: the kernel runs and its output is judged where it
/// lies; the CPU re-checks the sampled elements; a judgement with findings brings the
/// output back, and the CPU judges it as always (its counts must be the device's).
fn run_and_judge_on_device(
    kernel: &dyn Kernel,
    case: &Case,
    refs: &mut ReferenceCache,
    cfg: &OracleConfig,
    start: Instant,
) -> Judged {
    let caps = kernel.capabilities();
    let mut req = oracle::device::request(case, caps, oracle::device::case_seed(case));
    req.read_only_cache &= cfg.read_only.allows(kernel.name());
    let mut out = kernel.output_for_judged(case);
    let setup = start.elapsed();
    let mut result = kernel.run_judged(case, &req, &mut out);
    // A store into a read-only cache faults: such a crash runs again with the cache
    // writable (and read back after), so the verdict says what the kernel did to its
    // input, not how the mapping stopped it. A hang is no store: not run again.
    let mut read_only_crash = None;
    if req.read_only_cache {
        let crashed = matches!(&result, Err(e @ RunError::Crash(_)) if !e.is_timeout());
        if let Some(line) = cfg.read_only.count(kernel.name(), crashed) {
            eprintln!("mqa-fuzz: {line}");
        }
        if let (true, Err(RunError::Crash(m))) = (crashed, &result) {
            read_only_crash = Some(m.clone());
            let writable = DeviceJudgeRequest {
                read_only_cache: false,
                ..req.clone()
            };
            out = kernel.output_for_judged(case);
            result = kernel.run_judged(case, &writable, &mut out);
        }
    }
    let queued = result.as_ref().ok().and_then(|r| r.info.queue_wait);
    let wall = start.elapsed().saturating_sub(queued.unwrap_or_default());
    let judge_start = Instant::now();
    let run = match result {
        Ok(run) => run,
        Err(e) => {
            let environment_error = match &e {
                RunError::Environment(m) => Some(m.clone()),
                _ => None,
            };
            return Judged {
                verdict: oracle::error_verdict(&e),
                output: None,
                wall,
                setup,
                judge: judge_start.elapsed(),
                environment_error,
                device: None,
            };
        }
    };
    let j = &run.judgement;
    let (mut verdict, output) = if run.output_written {
        let reference = refs.get(caps.scale_placement);
        let mut v = oracle::judge(case, reference, caps, Ok((&run.info, &out)), cfg);
        if refs.is_full() {
            if let Some(msg) = oracle::device::compare_counts(caps, j, &v) {
                v.add_case_finding(Class::OracleDisagreement, msg);
            }
        }
        (v, Some(out))
    } else {
        (oracle::device::device_verdict(case, caps, &run, cfg), None)
    };
    let rechecked = match oracle::device::recheck(case, caps, j) {
        Ok(n) => n,
        Err(msg) => {
            verdict.add_case_finding(Class::OracleDisagreement, msg);
            0
        }
    };
    let read_only_cache = req.read_only_cache && read_only_crash.is_none();
    if let Some(m) = read_only_crash {
        if !verdict.classes.contains_key(&Class::InputMutated) {
            verdict.add_case_finding(
                Class::Crash,
                format!(
                    "{m} (with its KV cache read-only; run again with the cache writable \
                     it finished and left the cache as it was: a store that wrote the \
                     bytes already there, or a crash that comes and goes)"
                ),
            );
        }
    }
    Judged {
        verdict,
        output,
        wall,
        setup,
        judge: judge_start.elapsed(),
        environment_error: None,
        device: Some(DeviceSide {
            row_digests: run.judgement.row_digests.clone(),
            rechecked,
            cpu_judged: run.output_written,
            read_only_cache,
        }),
    }
}

/// Compares two kernels' outputs over V(r): elements where they differ by more than
/// both bounds together (`divergent`). Both must have run cleanly enough to compare.
pub fn divergence(
    case: &Case,
    a: (&dyn Kernel, &OutputBuffer),
    b: (&dyn Kernel, &OutputBuffer),
) -> Option<String> {
    let ba = oracle::ErrorBound::for_kernel(a.0.capabilities().accumulation, &case.shape);
    let bb = oracle::ErrorBound::for_kernel(b.0.capabilities().accumulation, &case.shape);
    let placement_a = a.0.capabilities().scale_placement;
    for r in 0..case.rows() {
        let len = case.valid_len(r);
        for t in 0..len {
            let (x, y) = (a.1.get(r, t), b.1.get(r, t));
            if x.to_bits() == y.to_bits() {
                continue;
            }
            let both_finite = x.is_finite() && y.is_finite();
            let differ = if both_finite {
                let (_, m, abs) = reference::element(case, placement_a, r, t);
                ((x - y).abs() as f64) > ba.full(m, abs) + bb.full(m, abs)
            } else {
                !(x.is_nan() && y.is_nan())
            };
            if differ {
                return Some(format!(
                    "{} and {} disagree at row {r} position {t}: {} vs {}",
                    a.0.name(),
                    b.0.name(),
                    oracle::show_f32(x),
                    oracle::show_f32(y)
                ));
            }
        }
    }
    None
}

/// Classes a verdict counts as findings for the exit code.
pub fn has_findings(v: &Verdict) -> bool {
    !v.classes.is_empty()
}

/// Convenience for tests: run and judge with a fresh reference.
pub fn judge_once(kernel: &dyn Kernel, case: &Case) -> Verdict {
    let mut refs = ReferenceCache::new(case);
    run_and_judge(kernel, case, &mut refs, &OracleConfig::default()).verdict
}
