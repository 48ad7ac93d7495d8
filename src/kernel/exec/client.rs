//! [`ExecKernel`]: a pool of worker processes speaking the protocol, seen by the
//! harness as one [`Kernel`].
//!
//! Each worker is `sh -c <command>` in its own process group, with its own temporary
//! directory and (for multi-GPU hosts) its own environment. A worker that dies, hangs
//! past the per-case timeout, prints something that is not a protocol line, or answers
//! another request than the one asked is a `crash` of *that case*, reported with the
//! tail of its stderr; it is killed and a fresh one starts for the next case.

use super::protocol::{self, ErrorKind, Hello, RunRequest, WorkerLine};
use crate::case::Case;
use crate::kernel::{Capabilities, Kernel, OutputBuffer, RunError, RunInfo};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Longest protocol line accepted (a hello with long capability strings fits easily).
const MAX_LINE: u64 = 1 << 20;
/// Bytes of stderr kept per worker for crash reports.
const STDERR_TAIL: usize = 8 << 10;

/// How to start and supervise the workers.
#[derive(Clone, Debug)]
pub struct ExecConfig {
    /// Shell command line of one worker (run with `sh -c`).
    pub command: String,
    /// One entry per worker: extra environment variables (e.g. `CUDA_VISIBLE_DEVICES`).
    /// The pool has `worker_envs.len()` workers (at least one).
    pub worker_envs: Vec<Vec<(String, String)>>,
    /// Longest a case may take, from request to answer.
    pub case_timeout: Duration,
    /// Longest a worker may take to start and send its hello (imports, device init).
    pub handshake_timeout: Duration,
    /// Copy the workers' stderr to ours as it arrives (otherwise only kept for reports).
    pub forward_stderr: bool,
}

impl ExecConfig {
    pub fn new(command: impl Into<String>) -> Self {
        ExecConfig {
            command: command.into(),
            worker_envs: vec![Vec::new()],
            case_timeout: Duration::from_secs(120),
            handshake_timeout: Duration::from_secs(120),
            forward_stderr: false,
        }
    }

    /// Settings from the environment, for `exec:` names on the command line:
    /// `MQA_FUZZ_EXEC_TIMEOUT` (seconds per case), `MQA_FUZZ_EXEC_HANDSHAKE_TIMEOUT`,
    /// `MQA_FUZZ_EXEC_DEVICES` (`0,1,2,3`: one worker per device, each with
    /// `CUDA_VISIBLE_DEVICES`/`HIP_VISIBLE_DEVICES` set to it), `MQA_FUZZ_EXEC_WORKERS`
    /// (N workers, no device variables) and `MQA_FUZZ_EXEC_STDERR=1`.
    pub fn from_env(command: impl Into<String>) -> Result<Self, String> {
        let mut c = ExecConfig::new(command);
        let secs = |var: &str| -> Result<Option<Duration>, String> {
            match std::env::var(var) {
                Err(_) => Ok(None),
                Ok(v) => match v.trim().parse::<f64>() {
                    Ok(s) if s > 0.0 && s.is_finite() => Ok(Some(Duration::from_secs_f64(s))),
                    _ => Err(format!("{var}={v:?} is not a positive number of seconds")),
                },
            }
        };
        if let Some(t) = secs("MQA_FUZZ_EXEC_TIMEOUT")? {
            c.case_timeout = t;
        }
        if let Some(t) = secs("MQA_FUZZ_EXEC_HANDSHAKE_TIMEOUT")? {
            c.handshake_timeout = t;
        }
        if let Ok(devs) = std::env::var("MQA_FUZZ_EXEC_DEVICES") {
            let devs: Vec<&str> = devs
                .split(',')
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .collect();
            if devs.is_empty() {
                return Err("MQA_FUZZ_EXEC_DEVICES is empty (expected e.g. 0,1,2,3)".into());
            }
            c.worker_envs = devs.iter().map(|d| device_env(d)).collect();
        } else if let Ok(n) = std::env::var("MQA_FUZZ_EXEC_WORKERS") {
            match n.trim().parse::<usize>() {
                Ok(k) if (1..=256).contains(&k) => c.worker_envs = vec![Vec::new(); k],
                _ => {
                    return Err(format!(
                        "MQA_FUZZ_EXEC_WORKERS={n:?} is not a number in 1..=256"
                    ))
                }
            }
        }
        c.forward_stderr = std::env::var("MQA_FUZZ_EXEC_STDERR").is_ok_and(|v| v == "1");
        Ok(c)
    }
}

/// The environment that pins a worker to one GPU, NVIDIA or AMD.
pub fn device_env(device: &str) -> Vec<(String, String)> {
    vec![
        ("CUDA_VISIBLE_DEVICES".into(), device.into()),
        ("HIP_VISIBLE_DEVICES".into(), device.into()),
        ("MQA_FUZZ_WORKER_DEVICE".into(), device.into()),
    ]
}

/// What the stdout reader thread hands over.
enum Event {
    Line(String),
    /// Not a line: too long or not UTF-8.
    Garbage(String),
    Eof,
}

/// One running worker process.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<Event>,
    stderr: Arc<Mutex<VecDeque<u8>>>,
    stderr_done: Receiver<()>,
}

impl Worker {
    fn spawn(cfg: &ExecConfig, env: &[(String, String)], dir: &Path) -> Result<Worker, RunError> {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(&cfg.command)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("MQA_FUZZ_WORKER_DIR", dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Own process group: a kill reaches whatever the shell started.
            .process_group(0);
        let mut child = cmd.spawn().map_err(|e| {
            RunError::Environment(format!(
                "cannot start worker `sh -c {:?}`: {e}",
                cfg.command
            ))
        })?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut stderr_pipe = child.stderr.take().expect("piped stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            loop {
                let mut buf = Vec::new();
                match (&mut r).take(MAX_LINE).read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => {
                        let _ = tx.send(Event::Eof);
                        return;
                    }
                    Ok(_) if !buf.ends_with(b"\n") && buf.len() as u64 >= MAX_LINE => {
                        let _ = tx.send(Event::Garbage(format!(
                            "a line longer than {MAX_LINE} bytes"
                        )));
                        return;
                    }
                    Ok(_) => {
                        let ev = match String::from_utf8(buf) {
                            Ok(s) => Event::Line(s),
                            Err(e) => Event::Garbage(format!(
                                "bytes that are not UTF-8: {}",
                                protocol::clip(&String::from_utf8_lossy(e.as_bytes()))
                            )),
                        };
                        if tx.send(ev).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let (done_tx, stderr_done) = mpsc::channel();
        let tail = Arc::clone(&stderr);
        let forward = cfg.forward_stderr;
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr_pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                if forward {
                    let _ = std::io::stderr().write_all(&buf[..n]);
                }
                let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                t.extend(&buf[..n]);
                let excess = t.len().saturating_sub(STDERR_TAIL);
                t.drain(..excess);
            }
            let _ = done_tx.send(());
        });
        Ok(Worker {
            child,
            stdin,
            lines,
            stderr,
            stderr_done,
        })
    }

    /// Waits for the hello line.
    fn handshake(&mut self, timeout: Duration) -> Result<Hello, RunError> {
        match self.lines.recv_timeout(timeout) {
            Ok(Event::Line(l)) => protocol::parse_hello(&l),
            Ok(Event::Garbage(g)) => Err(RunError::Crash(format!(
                "worker sent {g} instead of a hello"
            ))),
            Ok(Event::Eof) | Err(RecvTimeoutError::Disconnected) => Err(RunError::Environment(
                "worker exited before its hello".into(),
            )),
            Err(RecvTimeoutError::Timeout) => Err(RunError::Environment(format!(
                "worker sent no hello within {:.0} s",
                timeout.as_secs_f64()
            ))),
        }
    }

    /// Kills the whole process group and reaps the shell; returns how it ended.
    /// Kills the worker and waits (briefly) for its stderr to drain, so that
    /// [`Worker::stderr_tail`] read afterwards holds its last words (a crash reason).
    fn kill(&mut self) -> String {
        let pid = self.child.id() as i32;
        // SAFETY: plain syscall on the process group this worker created (its leader's id).
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
        let status = self
            .child
            .wait()
            .map(|s| describe_status(&s))
            .unwrap_or_else(|e| e.to_string());
        let _ = self.stderr_done.recv_timeout(Duration::from_millis(500));
        status
    }

    /// Asks the worker to stop (EOF on stdin), then kills what is left.
    fn shut_down(self) {
        let Worker {
            mut child,
            stdin,
            stderr_done,
            ..
        } = self;
        drop(stdin);
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: as in `kill`; the group may outlive its leader.
        unsafe {
            libc::kill(-(child.id() as i32), libc::SIGKILL);
        }
        let _ = child.wait();
        let _ = stderr_done.recv_timeout(Duration::from_millis(100));
    }

    fn stderr_tail(&self) -> String {
        let t = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        let bytes: Vec<u8> = t.iter().copied().collect();
        let text = String::from_utf8_lossy(&bytes);
        let lines: Vec<&str> = text.lines().collect();
        let keep = &lines[lines.len().saturating_sub(20)..];
        keep.join("\n")
    }
}

fn describe_status(s: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        // `sh -c` reports a child killed by a signal as 128 + signal.
        (Some(c), _) if c > 128 && c <= 128 + 64 => format!(
            "exit status {c} (signal {}{})",
            c - 128,
            signal_name(c - 128)
        ),
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(sig)) => format!("killed by signal {sig}{}", signal_name(sig)),
        _ => s.to_string(),
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGSEGV => " (SIGSEGV)",
        libc::SIGABRT => " (SIGABRT)",
        libc::SIGKILL => " (SIGKILL)",
        libc::SIGBUS => " (SIGBUS)",
        libc::SIGFPE => " (SIGFPE)",
        libc::SIGILL => " (SIGILL)",
        _ => "",
    }
}

/// One pool slot: a worker (started on demand) and its temporary directory.
struct Slot {
    env: Vec<(String, String)>,
    dir: PathBuf,
    worker: Option<Worker>,
}

/// A kernel that lives in worker processes.
pub struct ExecKernel {
    name: String,
    config: ExecConfig,
    hello: Hello,
    /// Every worker's hello at start (device names differ across a multi-GPU pool).
    hellos: Vec<Hello>,
    slots: Vec<Mutex<Slot>>,
    free: Mutex<Vec<usize>>,
    freed: Condvar,
    next_id: AtomicU64,
}

impl ExecKernel {
    /// Starts the pool and performs every worker's handshake (all must agree with the
    /// first on capabilities: the generator targets one set).
    pub fn start(name: impl Into<String>, config: ExecConfig) -> Result<ExecKernel, RunError> {
        let name = name.into();
        let n = config.worker_envs.len().max(1);
        let mut slots = Vec::with_capacity(n);
        let mut hello: Option<Hello> = None;
        let mut hellos = Vec::with_capacity(n);
        for k in 0..n {
            let env = config.worker_envs.get(k).cloned().unwrap_or_default();
            let dir = make_temp_dir()?;
            let mut slot = Slot {
                env,
                dir,
                worker: None,
            };
            let h = start_worker(&config, &mut slot, &format!("worker {k}"))?;
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
            slots.push(Mutex::new(slot));
        }
        Ok(ExecKernel {
            name,
            config,
            hello: hello.expect("at least one worker"),
            hellos,
            slots,
            free: Mutex::new((0..n).rev().collect()),
            freed: Condvar::new(),
            next_id: AtomicU64::new(1),
        })
    }

    /// The first worker's handshake.
    pub fn hello(&self) -> &Hello {
        &self.hello
    }

    /// Every worker's handshake at start, in pool order.
    pub fn hellos(&self) -> &[Hello] {
        &self.hellos
    }

    fn take_slot(&self) -> usize {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(k) = free.pop() {
                return k;
            }
            free = self.freed.wait(free).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn give_slot(&self, k: usize) {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).push(k);
        self.freed.notify_one();
    }

    fn run_on(
        &self,
        slot: &mut Slot,
        case: &Case,
        out: &mut OutputBuffer,
    ) -> Result<RunInfo, RunError> {
        if slot.worker.is_none() {
            let h = start_worker(&self.config, slot, "restarted worker")?;
            if !same_contract(&h.capabilities, &self.hello.capabilities) {
                return Err(RunError::Environment(
                    "a restarted worker declares other capabilities than at start".into(),
                ));
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let case_path = slot.dir.join(format!("case-{id}.safetensors"));
        let out_path = slot.dir.join(format!("out-{id}.safetensors"));
        let result = (|| {
            protocol::write_case_file(&case_path, case, out).map_err(|e| {
                RunError::Environment(format!(
                    "cannot write case file {}: {e}",
                    case_path.display()
                ))
            })?;
            let req = RunRequest::new(id, case, &case_path, &out_path);
            self.exchange(slot, &req, &out_path, out)
        })();
        let _ = std::fs::remove_file(&case_path);
        let _ = std::fs::remove_file(&out_path);
        result
    }

    /// Sends one request and waits for its answer; a misbehaving worker is killed.
    fn exchange(
        &self,
        slot: &mut Slot,
        req: &RunRequest,
        out_path: &Path,
        out: &mut OutputBuffer,
    ) -> Result<RunInfo, RunError> {
        let w = slot.worker.as_mut().expect("worker started");
        let id = req.id;
        let sent = w
            .stdin
            .write_all(req.to_line().as_bytes())
            .and_then(|_| w.stdin.flush());
        let deadline = Instant::now() + self.config.case_timeout;
        let failure: String = 'wait: {
            if let Err(e) = sent {
                break 'wait format!("cannot send the request ({e})");
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match w.lines.recv_timeout(left) {
                Ok(Event::Line(l)) => l,
                Ok(Event::Garbage(g)) => break 'wait format!("worker printed {g}"),
                Ok(Event::Eof) | Err(RecvTimeoutError::Disconnected) => {
                    break 'wait "worker exited".to_string()
                }
                Err(RecvTimeoutError::Timeout) => {
                    break 'wait format!(
                        "no answer within {:.0} s (timeout)",
                        self.config.case_timeout.as_secs_f64()
                    )
                }
            };
            let msg: WorkerLine = match serde_json::from_str(&line) {
                Ok(m) => m,
                Err(e) => {
                    break 'wait format!(
                        "worker printed a line that is not a protocol message ({e}): {}",
                        protocol::clip(&line)
                    )
                }
            };
            match msg {
                WorkerLine::Result {
                    id: got,
                    output,
                    kernel_time_us,
                    inputs_intact,
                    device_bytes,
                } if got == id => {
                    if Path::new(&output) != out_path {
                        break 'wait format!(
                            "worker wrote its output to {output:?}, not to the requested {}",
                            out_path.display()
                        );
                    }
                    return match protocol::read_output(out_path, out) {
                        Ok(()) => Ok(protocol::run_info(
                            kernel_time_us,
                            inputs_intact,
                            device_bytes,
                        )),
                        Err(e) => Err(RunError::Crash(format!(
                            "worker's output file {}: {e}",
                            out_path.display()
                        ))),
                    };
                }
                WorkerLine::Error {
                    id: Some(got),
                    kind,
                    message,
                } if got == id => {
                    return Err(match kind {
                        ErrorKind::Crash => {
                            // A kernel that crashed may have left its device context
                            // unusable, and adapters exit after a device fault: the next
                            // case gets a fresh worker, so it is never blamed for this one.
                            if let Some(w) = slot.worker.take() {
                                w.shut_down();
                            }
                            RunError::Crash(message)
                        }
                        ErrorKind::Skipped => RunError::Skipped(message),
                        ErrorKind::Environment => RunError::Environment(message),
                    });
                }
                _ => {
                    break 'wait format!(
                        "worker answered out of order (asked for request {id}): {}",
                        protocol::clip(&line)
                    )
                }
            }
        };
        let mut w = slot.worker.take().expect("worker started");
        let status = w.kill();
        let tail = w.stderr_tail();
        let stderr = if tail.is_empty() {
            "(stderr empty)".to_string()
        } else {
            format!("stderr tail:\n{tail}")
        };
        Err(RunError::Crash(format!(
            "{failure}; worker `{}` {status} during request {id}; {stderr}",
            self.config.command
        )))
    }
}

/// Starts `slot`'s worker and returns its hello; on failure, the worker is killed and
/// the error carries its stderr.
fn start_worker(cfg: &ExecConfig, slot: &mut Slot, what: &str) -> Result<Hello, RunError> {
    let mut w = Worker::spawn(cfg, &slot.env, &slot.dir)?;
    match w.handshake(cfg.handshake_timeout) {
        Ok(h) => {
            slot.worker = Some(w);
            Ok(h)
        }
        Err(e) => {
            let status = w.kill();
            let tail = w.stderr_tail();
            let add = |m: String| {
                if tail.is_empty() {
                    format!("{what} `{}`: {m} ({status})", cfg.command)
                } else {
                    format!(
                        "{what} `{}`: {m} ({status}); stderr tail:\n{tail}",
                        cfg.command
                    )
                }
            };
            Err(match e {
                RunError::Crash(m) => RunError::Crash(add(m)),
                RunError::Skipped(m) => RunError::Skipped(add(m)),
                RunError::Environment(m) => RunError::Environment(add(m)),
            })
        }
    }
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

    fn preferred_jobs(&self) -> usize {
        self.slots.len()
    }

    fn compile_key(&self) -> &[crate::kernel::CompileField] {
        &self.hello.compile_key
    }

    fn run(&self, case: &Case, out: &mut OutputBuffer) -> Result<RunInfo, RunError> {
        let k = self.take_slot();
        let result = {
            let mut slot = self.slots[k].lock().unwrap_or_else(|e| e.into_inner());
            self.run_on(&mut slot, case, out)
        };
        self.give_slot(k);
        result
    }
}

impl Drop for ExecKernel {
    fn drop(&mut self) {
        for slot in &self.slots {
            let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(w) = slot.worker.take() {
                w.shut_down();
            }
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
