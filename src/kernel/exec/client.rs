//! [`ExecKernel`]: a pool of worker processes speaking the protocol, seen by the
//! harness as one [`Kernel`].
//!
//! Each worker is `sh -c <command>` in its own process group, with its own temporary
//! directory and (for multi-GPU hosts) its own environment. A worker that dies, hangs
//! past the per-case timeout, prints something that is not a protocol line, or answers
//! another request than the one asked is a `crash` of *that case*, reported with the
//! tail of its stderr; it is killed and a fresh one starts for the next case.

use super::config::WORKER_DEVICE;
pub use super::config::{device_env, ExecConfig};
use super::process::{Launch, Source, Worker};
use super::protocol::{self, Hello, RunRequest, Transport};
use super::shm::{RegionOutput, RegionPool, SharedRegion};
use crate::case::Case;
use crate::kernel::{
    Capabilities, DeviceJudgeRequest, JudgedRun, Kernel, OutputBuffer, RunError, RunInfo,
};
use judged::Prepared;
use lanes::Lanes;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod exchange;
mod judged;
mod lanes;

/// Cases in flight per GPU worker: one runs on the device while the others are being
/// generated, transferred and judged on the host (a real library's kernel takes 0.1 ms;
/// judging its output on the CPU takes far longer).
const CASES_PER_GPU_WORKER: usize = 4;

/// Pauses before each retry of a worker start that failed after a crash (a device
/// still being torn down, a file system hiccup): about 4 s in all before giving up.
const RESTART_BACKOFF: [Duration; 4] = [
    Duration::from_millis(100),
    Duration::from_millis(400),
    Duration::from_millis(1000),
    Duration::from_millis(2500),
];

/// One pool slot: a worker (started on demand), where it comes from (the command or
/// its fork server), its temporary directory and its shared region (protocol 2).
struct Slot {
    env: Vec<(String, String)>,
    dir: PathBuf,
    worker: Option<Worker>,
    /// The protocol version the current worker speaks.
    protocol: u64,
    source: Source,
    region: Option<SharedRegion>,
    /// Counts the slot's worker lives (a request forwarded to one life is not
    /// answered by the next).
    life: u64,
}

impl Slot {
    fn kill_worker(&mut self) -> Option<(String, String)> {
        let mut w = self.worker.take()?;
        let status = w.kill(self.source.server.as_mut());
        Some((status, w.stderr_tail()))
    }

    /// Ends the worker of a crashed case; returns how long it took to be gone.
    fn end_crashed_worker(&mut self) -> std::time::Duration {
        let t0 = Instant::now();
        if let Some(w) = self.worker.take() {
            w.end_crashed(self.source.server.as_mut());
        }
        t0.elapsed()
    }
}

/// Restarts of a pool's workers (after crashes), for the report.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RestartStats {
    pub restarts: u64,
    /// Starts that failed and were retried.
    pub retries: u64,
    pub total_secs: f64,
    pub max_secs: f64,
    /// Restarts served by a fork server.
    pub forked: u64,
    /// Restarts served by a spare life forked ahead.
    pub from_spare: u64,
    /// Restarted lives that warmed up before their hello, and the seconds they took.
    pub warm_ups: u64,
    pub warm_up_secs: f64,
    /// Workers ended after a crashed case, and the seconds until each was gone.
    pub crash_exits: u64,
    pub crash_exit_secs: f64,
}

/// A kernel that lives in worker processes.
pub struct ExecKernel {
    name: String,
    config: ExecConfig,
    hello: Hello,
    /// Every worker's hello at start (device names differ across a multi-GPU pool).
    hellos: Vec<Hello>,
    slots: Vec<Mutex<Slot>>,
    lanes: Lanes,
    next_id: AtomicU64,
    offered: Vec<u64>,
    restarts: Mutex<RestartStats>,
    /// Whether the first worker came from a fork server.
    forked: bool,
    /// Regions the harness's output buffers live in ([`Kernel::output_for`]), when every
    /// worker speaks protocol 2: the worker writes the output in place.
    outputs: Option<std::sync::Arc<RegionPool>>,
}

impl ExecKernel {
    /// Starts the pool and performs every worker's handshake (all must agree with the
    /// first on capabilities: the generator targets one set).
    pub fn start(name: impl Into<String>, mut config: ExecConfig) -> Result<ExecKernel, RunError> {
        let name = name.into();
        let offered = config.protocols.clone();
        let n = config.worker_envs.len().max(1);
        let mut slots = Vec::with_capacity(n);
        let mut hello: Option<Hello> = None;
        let mut hellos = Vec::with_capacity(n);
        let mut forked = false;
        let mut all_v2 = true;
        for k in 0..n {
            let env = config.worker_envs.get(k).cloned().unwrap_or_default();
            let dir = make_temp_dir()?;
            let mut slot = Slot {
                env,
                dir,
                worker: None,
                protocol: 1,
                source: Source::new(config.spare_lives),
                region: None,
                life: 0,
            };
            let what = format!("worker {k}");
            let h = match start_worker(&config, &mut slot, &offered, &what) {
                // A fork server whose first life cannot start (its library touched the
                // device before forking, say): the same command without the fork server.
                Err(e) if slot.source.server.is_some() => {
                    eprintln!(
                        "mqa-fuzz: {name}: the fork server's first worker failed ({}); starting workers without a fork server",
                        e.to_string().lines().next().unwrap_or("")
                    );
                    let w = slot.worker.take();
                    slot.source.shut_down(w);
                    config.fork_server = false;
                    start_worker(&config, &mut slot, &offered, &what)?
                }
                r => r?,
            };
            hellos.push(h.clone());
            match &hello {
                None => hello = Some(h),
                Some(first) if !same_contract(&first.capabilities, &h.capabilities) => {
                    return Err(RunError::Environment(format!(
                        "worker {k} declares other capabilities than worker 0 ({} on {} vs {} on {})",
                        h.name, h.device, first.name, first.device
                    )))
                }
                Some(_) => {}
            }
            forked = forked || slot.source.server.is_some();
            all_v2 = all_v2 && slot.protocol >= 2;
            slots.push(Mutex::new(slot));
        }
        let mut hello = hello.expect("at least one worker");
        // Workers on one device split its memory: each declared its share of what was
        // free when it started, which the others will take too.
        let sharing = workers_per_device(&config.worker_envs);
        if sharing > 1 {
            if let Some(m) = hello.capabilities.max_kv_bytes.as_mut() {
                *m /= sharing as u64;
            }
        }
        // Device-judged requests queue behind busy workers (see `lanes`).
        let pipelined = all_v2 && hello.judges_on_device && config.pipeline;
        Ok(ExecKernel {
            name,
            config,
            hello,
            hellos,
            slots,
            lanes: Lanes::new(n, pipelined),
            next_id: AtomicU64::new(1),
            offered,
            restarts: Mutex::new(RestartStats::default()),
            forked,
            outputs: all_v2.then(|| RegionPool::new(n * CASES_PER_GPU_WORKER + 2)),
        })
    }

    /// How often workers were restarted, and how long that took.
    pub fn restart_stats(&self) -> RestartStats {
        self.restarts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Starts `slot`'s worker again after a crash, retrying with back-off; every failed
    /// attempt is logged with its stderr tail, and the last one is the error.
    fn restart(&self, slot: &mut Slot) -> Result<(), RunError> {
        let t0 = Instant::now();
        let mut retries = 0;
        let spares_before = slot.source.spares_used;
        let h = loop {
            match start_worker(&self.config, slot, &self.offered, "restarted worker") {
                Ok(h) => break h,
                Err(e) if retries < RESTART_BACKOFF.len() => {
                    let pause = RESTART_BACKOFF[retries];
                    retries += 1;
                    eprintln!(
                        "mqa-fuzz: {}: worker restart failed (attempt {retries} of {}), retrying in {:.1} s: {e}",
                        self.name,
                        RESTART_BACKOFF.len() + 1,
                        pause.as_secs_f64()
                    );
                    std::thread::sleep(pause);
                }
                Err(e) => {
                    return Err(RunError::Environment(format!(
                        "the worker could not be restarted ({} attempts over {:.1} s): {e}",
                        retries + 1,
                        t0.elapsed().as_secs_f64()
                    )))
                }
            }
        };
        let secs = t0.elapsed().as_secs_f64();
        let mut r = self.restarts.lock().unwrap_or_else(|e| e.into_inner());
        r.restarts += 1;
        r.retries += retries as u64;
        r.total_secs += secs;
        r.max_secs = r.max_secs.max(secs);
        r.forked += u64::from(slot.source.server.is_some());
        r.from_spare += slot.source.spares_used - spares_before;
        if let Some(w) = h.warm_up_secs {
            r.warm_ups += 1;
            r.warm_up_secs += w;
        }
        drop(r);
        if !same_contract(&h.capabilities, &self.hello.capabilities) {
            return Err(RunError::Environment(
                "a restarted worker declares other capabilities than at start".into(),
            ));
        }
        Ok(())
    }

    /// The first worker's handshake.
    pub fn hello(&self) -> &Hello {
        &self.hello
    }

    /// Every worker's handshake at start, in pool order.
    pub fn hellos(&self) -> &[Hello] {
        &self.hellos
    }

    /// Spare regions of the output pool and their bytes (`None`: outputs are not
    /// shared, a worker speaks protocol 1).
    pub fn spare_output_regions(&self) -> Option<(usize, usize)> {
        self.outputs.as_ref().map(|p| p.spare())
    }

    fn take_slot(&self) -> usize {
        self.lanes.take()
    }

    fn give_slot(&self, k: usize) {
        self.lanes.give(k);
    }

    fn run_on(
        &self,
        slot: &mut Slot,
        case: &Case,
        out: &mut OutputBuffer,
        prepared: Option<Prepared>,
    ) -> Result<RunInfo, RunError> {
        if slot.worker.is_none() {
            self.restart(slot)?;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if slot.protocol >= 2 {
            if let Some(p) = prepared {
                return self.send_prepared(slot, id, p, out).map(|a| a.info);
            }
            return self.run_shm(slot, id, case, out);
        }
        let case_path = slot.dir.join(format!("case-{id}.safetensors"));
        let out_path = slot.dir.join(format!("out-{id}.safetensors"));
        let result = (|| {
            protocol::write_case_file(&case_path, case, out).map_err(|e| {
                RunError::Environment(format!(
                    "cannot write case file {}: {e}",
                    case_path.display()
                ))
            })?;
            let transport = Transport::Files {
                case: &case_path,
                output: &out_path,
            };
            let mut req = RunRequest::new(id, case, transport);
            req.logits_poisoned = out.is_pristine();
            let info = self.exchange(slot, &req, None)?.info;
            protocol::read_output(&out_path, out).map_err(|e| {
                RunError::Crash(format!("worker's output file {}: {e}", out_path.display()))
            })?;
            Ok(info)
        })();
        let _ = std::fs::remove_file(&case_path);
        let _ = std::fs::remove_file(&out_path);
        result
    }

    /// Protocol 2: the case goes into the shared region of its output buffer (made by
    /// [`Kernel::output_for`]), where the worker writes the output in place; an output
    /// buffer on the heap goes through the slot's region, there and back.
    fn run_shm(
        &self,
        slot: &mut Slot,
        id: u64,
        case: &Case,
        out: &mut OutputBuffer,
    ) -> Result<RunInfo, RunError> {
        let env = |e: std::io::Error| {
            RunError::Environment(format!("cannot set up the shared memory region: {e}"))
        };
        let pristine = out.is_pristine();
        if let Some(p) = self.prepare_in_place(case, out, pristine, None) {
            return self.send_prepared(slot, id, p, out).map(|a| a.info);
        }
        let t0 = Instant::now();
        let ints = protocol::WireInts::with(case, self.hello.draws());
        if slot.region.is_none() {
            slot.region = Some(SharedRegion::create("mqa-fuzz-case").map_err(env)?);
        }
        let region = slot.region.as_mut().expect("created above");
        let layout = protocol::region_layout(case, self.hello.draws(), region.path().to_string());
        region.ensure(layout.bytes).map_err(env)?;
        region.write(&layout, &protocol::wire_tensors(case, &ints, out));
        let written = t0.elapsed().as_secs_f64();
        let mut req = RunRequest::new(id, case, Transport::Shm(layout.clone()));
        req.logits_poisoned = pristine;
        req.kv_values = ints.drawn();
        req.block_table_tail = ints.table_tail();
        let mut info = self.exchange(slot, &req, None)?.info;
        let t1 = Instant::now();
        let region = slot.region.as_ref().expect("created above");
        let (raw, _) = out.raw_mut();
        region
            .read_f32s(&layout, "logits", raw)
            .map_err(|e| RunError::Crash(format!("worker's output in the shared region: {e}")))?;
        info.phases.insert("harness: write region".into(), written);
        info.phases
            .insert("harness: read output".into(), t1.elapsed().as_secs_f64());
        Ok(info)
    }
}

/// `libmqa_fuzz.so` beside this binary: what an adapter loads to be served hosted
/// (`kernels/external/hosted.py`). `None` when the user named one (workers inherit it)
/// or there is none.
fn hosted_library() -> Option<std::path::PathBuf> {
    if std::env::var_os("MQA_FUZZ_HOSTED_LIB").is_some() {
        return None;
    }
    let lib = std::env::current_exe()
        .ok()?
        .parent()?
        .join("libmqa_fuzz.so");
    lib.is_file().then_some(lib)
}

/// Starts `slot`'s worker (forked by its fork server when it has one) and returns its
/// hello; on failure, the error carries the worker's stderr.
fn start_worker(
    cfg: &ExecConfig,
    slot: &mut Slot,
    offered: &[u64],
    what: &str,
) -> Result<Hello, RunError> {
    let offer: Vec<String> = offered.iter().map(u64::to_string).collect();
    let mut env = slot.env.clone();
    env.push(("MQA_FUZZ_PROTOCOLS".into(), offer.join(",")));
    if let Some(lib) = hosted_library() {
        env.push((
            "MQA_FUZZ_HOSTED_LIB".into(),
            lib.to_string_lossy().into_owned(),
        ));
    }
    if cfg.fork_server {
        env.push(("MQA_FUZZ_FORK_SERVER".into(), "1".into()));
    }
    let launch = Launch {
        command: &cfg.command,
        env,
        dir: &slot.dir,
        forward_stderr: cfg.forward_stderr,
    };
    match slot.source.start(&launch, cfg.handshake_timeout, offered) {
        Ok((w, h)) => {
            slot.worker = Some(w);
            slot.life += 1;
            slot.protocol = h.protocol;
            Ok(h)
        }
        Err(e) => {
            let add = |m: String| format!("{what} `{}`: {m}", cfg.command);
            Err(match e {
                RunError::Crash(m) => RunError::Crash(add(m)),
                RunError::Skipped(m) => RunError::Skipped(add(m)),
                RunError::Environment(m) => RunError::Environment(add(m)),
            })
        }
    }
}

/// The most workers of a pool that share one device: those pinned to the same device
/// ([`WORKER_DEVICE`], set by [`device_env`]), and those pinned to none, which all
/// see the default one.
fn workers_per_device(envs: &[Vec<(String, String)>]) -> usize {
    let mut count: std::collections::HashMap<Option<&str>, usize> = Default::default();
    for env in envs {
        let device = env
            .iter()
            .find(|(k, _)| k == WORKER_DEVICE)
            .map(|(_, v)| v.as_str());
        *count.entry(device).or_default() += 1;
    }
    count.into_values().max().unwrap_or(1)
}

fn make_temp_dir() -> Result<PathBuf, RunError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let base = std::env::var_os("MQA_FUZZ_EXEC_TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    loop {
        let k = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!("mqa-fuzz-worker.{}.{k}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(RunError::Environment(format!(
                    "cannot create {}: {e}",
                    dir.display()
                )))
            }
        }
    }
}

impl Kernel for ExecKernel {
    fn name(&self) -> &str {
        &self.name
    }

    fn version(&self) -> String {
        format!(
            "{} {} ({}, {})",
            self.hello.library, self.hello.version, self.hello.name, self.hello.device
        )
    }

    fn capabilities(&self) -> &Capabilities {
        &self.hello.capabilities
    }

    /// A worker that names a device other than the CPU (`NVIDIA H200 (sm90)`, `cuda`,
    /// `rocm`).
    fn on_accelerator(&self) -> bool {
        let d = self.hello.device.trim().to_ascii_lowercase();
        !(d.is_empty() || d.starts_with("cpu"))
    }

    /// One case per CPU worker; for accelerator workers [`CASES_PER_GPU_WORKER`] each,
    /// within the host's cores.
    fn preferred_jobs(&self) -> usize {
        if !self.on_accelerator() {
            return self.slots.len();
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (self.slots.len() * CASES_PER_GPU_WORKER).min(cores.max(self.slots.len()))
    }

    fn compile_key(&self) -> &[crate::kernel::CompileField] {
        &self.hello.compile_key
    }

    /// In a region of the pool when every worker speaks protocol 2 (the worker then
    /// writes the output in place); on the heap otherwise, or if shared memory fails.
    fn output_for(&self, case: &Case) -> OutputBuffer {
        if let Some(pool) = &self.outputs {
            let layout = protocol::region_layout(case, self.hello.draws(), String::new());
            match RegionOutput::new(pool, layout) {
                Ok(storage) => {
                    return OutputBuffer::in_storage(
                        case.rows(),
                        case.max_model_len,
                        case.out_row_stride,
                        Box::new(storage),
                    )
                }
                Err(e) => eprintln!(
                    "mqa-fuzz: {}: no shared memory for the output ({e}); this case's output is copied",
                    self.name
                ),
            }
        }
        OutputBuffer::for_case(case)
    }

    fn worker_report(&self) -> Option<crate::kernel::WorkerReport> {
        let r = self.restart_stats();
        let first: Vec<f64> = self.hellos.iter().filter_map(|h| h.warm_up_secs).collect();
        let warm_ups = r.warm_ups + first.len() as u64;
        let warm_up_secs = r.warm_up_secs + first.iter().sum::<f64>();
        Some(crate::kernel::WorkerReport {
            protocol: self.hello.protocol,
            fork_server: self.forked,
            restarts: r.restarts,
            restart_retries: r.retries,
            restart_max_secs: r.max_secs,
            restart_mean_secs: if r.restarts > 0 {
                r.total_secs / r.restarts as f64
            } else {
                0.0
            },
            restarts_from_spare: r.from_spare,
            crash_exits: r.crash_exits,
            crash_exit_mean_secs: r.crash_exit_secs / r.crash_exits.max(1) as f64,
            warm_ups,
            warm_up_mean_secs: if warm_ups > 0 {
                warm_up_secs / warm_ups as f64
            } else {
                0.0
            },
        })
    }

    fn device_judge(&self) -> Result<(), String> {
        self.judges_on_device()
    }

    fn output_for_judged(&self, case: &Case) -> OutputBuffer {
        self.unpoisoned_output(case)
    }

    fn run_judged(
        &self,
        case: &Case,
        req: &DeviceJudgeRequest,
        out: &mut OutputBuffer,
    ) -> Result<JudgedRun, RunError> {
        self.run_judged_in_worker(case, req, out)
    }

    fn run(&self, case: &Case, out: &mut OutputBuffer) -> Result<RunInfo, RunError> {
        // Inputs into the output's region first, while the workers serve other cases.
        let prepared = self.prepare_in_place(case, out, out.is_pristine(), None);
        let t0 = Instant::now();
        let k = self.take_slot();
        let waited = t0.elapsed();
        let result = {
            let mut slot = self.slots[k].lock().unwrap_or_else(|e| e.into_inner());
            self.run_on(&mut slot, case, out, prepared)
        };
        self.give_slot(k);
        result.map(|info| RunInfo {
            queue_wait: Some(waited),
            ..info
        })
    }
}

impl Drop for ExecKernel {
    fn drop(&mut self) {
        for slot in &self.slots {
            let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
            let w = slot.worker.take();
            slot.source.shut_down(w);
            let _ = std::fs::remove_dir_all(&slot.dir);
        }
    }
}

/// Whether two handshakes promise the same contract. `max_kv_bytes` is left out: adapters
/// derive it from the device's free memory, which other processes on the same GPU change
/// between a worker's start and its restart after a crash (seen with DeepGEMM on an H200:
/// every campaign that found a crash then stopped with "other capabilities").
fn same_contract(a: &Capabilities, b: &Capabilities) -> bool {
    let mut b = b.clone();
    b.max_kv_bytes = a.max_kv_bytes;
    *a == b
}

#[cfg(test)]
mod tests {
    use super::same_contract;
    use crate::case::ScalePlacement;
    use crate::kernel::Capabilities;

    #[test]
    fn workers_on_one_device_are_counted_together() {
        use super::{device_env, workers_per_device};
        assert_eq!(workers_per_device(&[]), 1);
        assert_eq!(workers_per_device(&[Vec::new(), Vec::new(), Vec::new()]), 3);
        assert_eq!(workers_per_device(&[device_env("0"), device_env("1")]), 1);
        let two_on_0 = [device_env("0"), device_env("1"), device_env("0")];
        assert_eq!(workers_per_device(&two_on_0), 2);
    }

    #[test]
    fn a_restart_may_see_other_free_memory_but_not_another_contract() {
        let a = Capabilities {
            max_kv_bytes: Some(80 << 30),
            ..Capabilities::everything(ScalePlacement::AfterReluSum)
        };
        let less_memory = Capabilities {
            max_kv_bytes: Some(60 << 30),
            ..a.clone()
        };
        assert!(same_contract(&a, &less_memory));
        let other_heads = Capabilities {
            heads: Some(vec![64]),
            ..less_memory.clone()
        };
        assert!(!same_contract(&a, &other_heads));
        let other_placement = Capabilities {
            scale_placement: ScalePlacement::InsideRelu,
            ..a.clone()
        };
        assert!(!same_contract(&a, &other_placement));
    }
}
