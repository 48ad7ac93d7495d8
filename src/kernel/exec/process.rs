//! Worker processes: starting one (`sh -c <command>` in its own process group, or a
//! fresh life forked by a fork server), reading its protocol lines and its stderr,
//! killing it and saying how it ended.
//!
//! **Fork servers** (PROTOCOL.md §4). A command started with `MQA_FUZZ_FORK_SERVER=1`
//! may answer `{"type":"fork_server"}` instead of a hello: it has imported its library
//! (torch, DeepGEMM) once, touched no GPU, and now forks a worker per *life* on request.
//! For each life mqa-fuzz makes two FIFOs in the worker's directory and sends
//! `{"type":"fork","life":N,"stdin":..,"stdout":..}`; the server answers
//! `{"type":"forked","life":N,"pid":P}`, the child opens the FIFOs as its protocol pipes,
//! makes itself a process group and speaks the protocol as any worker (hello first);
//! when it ends, the server reports `{"type":"exited","life":N,"status":".."}`. A restart
//! after a device fault then costs a fork and a device context, not a Python start-up
//! and a library import (~5 s with torch).

use super::protocol::{self, Hello};
use crate::kernel::RunError;
use serde::Deserialize;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod fork;
use fork::{ForkServer, Forked};

/// Longest protocol line accepted (a hello with long capability strings fits easily).
const MAX_LINE: u64 = 1 << 20;
/// Bytes of stderr kept per worker for crash reports.
const STDERR_TAIL: usize = 8 << 10;

/// What a stdout reader thread hands over.
pub(super) enum Event {
    Line(String),
    /// Not a line: too long or not UTF-8.
    Garbage(String),
    Eof,
}

/// The last bytes a process (or a fork server and its lives) wrote to stderr.
pub(super) type Tail = Arc<Mutex<VecDeque<u8>>>;

/// How to start a process.
pub(super) struct Launch<'a> {
    pub command: &'a str,
    pub env: Vec<(String, String)>,
    pub dir: &'a Path,
    pub forward_stderr: bool,
}

/// A process mqa-fuzz started itself.
pub(super) struct Spawned {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<Event>,
    stderr: Tail,
    stderr_done: Receiver<()>,
}

fn read_lines(r: impl Read + Send + 'static) -> Receiver<Event> {
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        let mut r = BufReader::new(r);
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
    lines
}

impl Spawned {
    pub fn spawn(l: &Launch) -> Result<Spawned, RunError> {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(l.command)
            .envs(l.env.iter().map(|(k, v)| (k, v)))
            .env("MQA_FUZZ_WORKER_DIR", l.dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Own process group: a kill reaches whatever the shell started.
            .process_group(0);
        let mut child = cmd.spawn().map_err(|e| {
            RunError::Environment(format!("cannot start worker `sh -c {:?}`: {e}", l.command))
        })?;
        let stdin = child.stdin.take().expect("piped stdin");
        let lines = read_lines(child.stdout.take().expect("piped stdout"));
        let mut stderr_pipe = child.stderr.take().expect("piped stderr");
        let stderr: Tail = Arc::new(Mutex::new(VecDeque::new()));
        let (done_tx, stderr_done) = mpsc::channel();
        let tail = Arc::clone(&stderr);
        let forward = l.forward_stderr;
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
        Ok(Spawned {
            child,
            stdin,
            lines,
            stderr,
            stderr_done,
        })
    }

    /// This process as a worker speaking on its own stdin/stdout.
    fn into_worker(self) -> Worker {
        Worker {
            stdin: Box::new(self.stdin),
            lines: self.lines,
            stderr: self.stderr,
            kind: WorkerKind::Spawned {
                child: self.child,
                stderr_done: self.stderr_done,
            },
        }
    }

    fn kill(&mut self) -> String {
        kill_child(&mut self.child, &self.stderr_done)
    }

    fn shut_down(self) {
        shut_down_child(self.child, self.stdin, &self.stderr_done)
    }
}

/// Kills the whole process group, reaps the shell and waits (briefly) for stderr to
/// drain, so the tail read afterwards holds its last words; returns how it ended.
fn kill_child(child: &mut Child, stderr_done: &Receiver<()>) -> String {
    let pid = child.id() as i32;
    // SAFETY: plain syscall on the process group this worker created (its leader's id).
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
    }
    let status = child
        .wait()
        .map(|s| describe_status(&s))
        .unwrap_or_else(|e| e.to_string());
    let _ = stderr_done.recv_timeout(Duration::from_millis(500));
    status
}

/// Asks a process to stop (EOF on stdin), then kills what is left.
fn shut_down_child(mut child: Child, stdin: impl Write, stderr_done: &Receiver<()>) {
    drop(stdin);
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: as in `kill_child`; the group may outlive its leader.
    unsafe {
        libc::kill(-(child.id() as i32), libc::SIGKILL);
    }
    let _ = child.wait();
    let _ = stderr_done.recv_timeout(Duration::from_millis(100));
}

/// The first line of a started command.
pub(super) enum Greeting {
    Hello(Box<Hello>),
    ForkServer,
}

/// Waits for a first line: a hello, or a fork server's announcement.
fn greeting(
    lines: &Receiver<Event>,
    timeout: Duration,
    offered: &[u64],
) -> Result<Greeting, RunError> {
    match lines.recv_timeout(timeout) {
        Ok(Event::Line(l)) => {
            if serde_json::from_str::<serde_json::Value>(&l)
                .is_ok_and(|v| v.get("type").and_then(|t| t.as_str()) == Some("fork_server"))
            {
                return Ok(Greeting::ForkServer);
            }
            protocol::parse_hello(&l, offered).map(|h| Greeting::Hello(Box::new(h)))
        }
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

/// Waits (up to 2 s, looking every `pause`) until the fork server reports that `life`
/// ended, or breaks.
fn await_exit(server: Option<&mut ForkServer>, life: u64, pause: Duration) {
    let Some(server) = server else {
        return;
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline && server.poll(life).is_none() && server.broken.is_none() {
        std::thread::sleep(pause);
    }
}

fn kill_group(pid: i32) {
    // SAFETY: plain syscalls; the forked worker made itself a process group, and may
    // not have yet, so the process is signalled too.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
        libc::kill(pid, libc::SIGKILL);
    }
}

enum WorkerKind {
    Spawned {
        child: Child,
        stderr_done: Receiver<()>,
    },
    Forked {
        pid: i32,
        life: u64,
    },
}

/// One worker life: the pipes the client speaks the protocol on.
pub(super) struct Worker {
    pub stdin: Box<dyn Write + Send>,
    pub lines: Receiver<Event>,
    stderr: Tail,
    kind: WorkerKind,
}

impl Worker {
    /// Kills the worker; returns how it ended (the fork server reports a life's status).
    pub fn kill(&mut self, server: Option<&mut ForkServer>) -> String {
        match &mut self.kind {
            WorkerKind::Spawned { child, stderr_done } => kill_child(child, stderr_done),
            WorkerKind::Forked { pid, life } => {
                kill_group(*pid);
                let (life, deadline) = (*life, Instant::now() + Duration::from_secs(2));
                let Some(server) = server else {
                    return "killed (SIGKILL)".into();
                };
                loop {
                    if let Some(s) = server.poll(life) {
                        // Its stderr shares the server's pipe: let the last words arrive.
                        std::thread::sleep(Duration::from_millis(30));
                        return s;
                    }
                    if Instant::now() >= deadline || server.broken.is_some() {
                        return "killed (SIGKILL)".into();
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }

    /// Ends a worker whose case crashed: killed at once (its device context may be
    /// gone, and nothing it could still say is wanted), then waited for until it is
    /// gone, so the device memory it held is free for the next life.
    pub fn end_crashed(self, server: Option<&mut ForkServer>) {
        match self.kind {
            WorkerKind::Spawned { mut child, .. } => {
                // SAFETY: as in `kill_child`.
                unsafe {
                    libc::kill(-(child.id() as i32), libc::SIGKILL);
                }
                let _ = child.wait();
            }
            WorkerKind::Forked { pid, life } => {
                kill_group(pid);
                await_exit(server, life, Duration::from_millis(2));
            }
        }
    }

    /// Asks the worker to stop (EOF on stdin), then kills what is left.
    pub fn shut_down(self, server: Option<&mut ForkServer>) {
        match self.kind {
            WorkerKind::Spawned { child, stderr_done } => {
                shut_down_child(child, self.stdin, &stderr_done)
            }
            WorkerKind::Forked { pid, life } => {
                drop(self.stdin);
                await_exit(server, life, Duration::from_millis(5));
                kill_group(pid);
            }
        }
    }

    pub fn stderr_tail(&self) -> String {
        tail_text(&self.stderr)
    }
}

/// Where a slot's workers come from: a fork server once one has announced itself.
///
/// With `spares` on, a fork server's next life is forked as soon as a life starts and
/// sets itself up (device context, library state) while the current one serves, so a
/// restart after a crash finds it ready: the restart costs the handshake already
/// done, not a device initialisation. It uses a device context's memory meanwhile.
#[derive(Default)]
pub(super) struct Source {
    pub server: Option<ForkServer>,
    /// Fork the next life ahead.
    spares: bool,
    spare: Option<Forked>,
    /// Starts served by a spare life.
    pub spares_used: u64,
}

impl Source {
    /// A source that forks spare lives ahead or not.
    pub fn new(spares: bool) -> Source {
        Source {
            spares,
            ..Source::default()
        }
    }

    /// Starts a worker life: the spare forked ahead or a fresh one from the fork server
    /// if there is a healthy one, otherwise by starting the command (which may turn out
    /// to be a fork server).
    pub fn start(
        &mut self,
        l: &Launch,
        timeout: Duration,
        offered: &[u64],
    ) -> Result<(Worker, Hello), RunError> {
        if let Some(s) = &mut self.server {
            let _ = s.poll(0);
            if s.broken.is_none() {
                let r = match self.spare.take() {
                    Some(mut spare) => {
                        spare.deadline = Instant::now() + timeout;
                        match s.finish(spare, timeout, offered) {
                            Ok(x) => {
                                self.spares_used += 1;
                                Ok(x)
                            }
                            // A spare that died (say, set up while the device was
                            // busy failing): a fresh life decides.
                            Err(_) if s.broken.is_none() => s.fork(l.dir, timeout, offered),
                            Err(e) => Err(e),
                        }
                    }
                    None => s.fork(l.dir, timeout, offered),
                };
                match r {
                    Ok(x) => {
                        self.fork_spare(l.dir, timeout);
                        return Ok(x);
                    }
                    // The server is fine but this life failed: a real start-up failure.
                    Err(e) if s.broken.is_none() => {
                        return Err(with_tail(e, &s.process.stderr, "forked worker"))
                    }
                    Err(_) => {}
                }
            }
            if let (Some(spare), Some(s)) = (self.spare.take(), self.server.as_mut()) {
                spare.discard(s);
            }
            if let Some(s) = self.server.take() {
                s.shut_down();
            }
        }
        let mut p = Spawned::spawn(l)?;
        match greeting(&p.lines, timeout, offered) {
            Ok(Greeting::Hello(h)) => Ok((p.into_worker(), *h)),
            Ok(Greeting::ForkServer) => {
                let mut server = ForkServer {
                    process: p,
                    lives: 0,
                    ended: Vec::new(),
                    broken: None,
                };
                let r = server.fork(l.dir, timeout, offered);
                let r = r.map_err(|e| with_tail(e, &server.process.stderr, "forked worker"));
                self.server = Some(server);
                if r.is_ok() {
                    self.fork_spare(l.dir, timeout);
                }
                r
            }
            Err(e) => {
                let status = p.kill();
                Err(with_tail(e, &p.stderr, &status))
            }
        }
    }

    /// Forks the next life ahead (with spares on and a healthy server); a failure
    /// here is left to the next start, which forks afresh and reports it.
    fn fork_spare(&mut self, dir: &Path, timeout: Duration) {
        if !self.spares {
            return;
        }
        if let Some(s) = self.server.as_mut().filter(|s| s.broken.is_none()) {
            self.spare = s.begin(dir, timeout).ok();
        }
    }

    pub fn shut_down(&mut self, w: Option<Worker>) {
        if let Some(w) = w {
            w.shut_down(self.server.as_mut());
        }
        if let (Some(spare), Some(s)) = (self.spare.take(), self.server.as_mut()) {
            spare.discard(s);
        }
        if let Some(s) = self.server.take() {
            s.shut_down();
        }
    }
}

/// The last 20 lines of a stderr tail.
fn tail_text(tail: &Tail) -> String {
    let t = tail.lock().unwrap_or_else(|e| e.into_inner());
    let bytes: Vec<u8> = t.iter().copied().collect();
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// `e` with the last lines of `tail` appended (what the process said before failing).
fn with_tail(e: RunError, tail: &Tail, what: &str) -> RunError {
    let text = tail_text(tail);
    let add = |m: String| {
        if text.is_empty() {
            format!("{m} ({what})")
        } else {
            format!("{m} ({what}); stderr tail:\n{text}")
        }
    };
    match e {
        RunError::Crash(m) => RunError::Crash(add(m)),
        RunError::Skipped(m) => RunError::Skipped(add(m)),
        RunError::Environment(m) => RunError::Environment(add(m)),
    }
}

pub(super) fn describe_status(s: &std::process::ExitStatus) -> String {
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
