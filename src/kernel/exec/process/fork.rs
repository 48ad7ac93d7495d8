//! Fork servers (see the parent module): the server's lines, forking a life and
//! opening its pipes ([`ForkServer::begin`]), waiting for its hello
//! ([`ForkServer::finish`]), and the FIFOs between them.

use super::*;

/// A fork server's lines.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ServerLine {
    Forked {
        life: u64,
        pid: i32,
    },
    Exited {
        life: u64,
        #[serde(default)]
        status: Option<String>,
    },
    /// The fork itself failed (or the life could not start).
    Error {
        #[serde(default)]
        life: Option<u64>,
        message: String,
    },
}

/// A life forked and connected whose hello has not been read yet.
pub(in crate::kernel::exec) struct Forked {
    pub(super) worker: Worker,
    pub(super) life: u64,
    /// Its stdout FIFO (removed once the hello came).
    pub(super) outp: PathBuf,
    pub(super) opened: Receiver<()>,
    /// By when its hello must come.
    pub(super) deadline: Instant,
}

impl Forked {
    /// Kills a life that will not be used (a spare at the end of a campaign).
    pub(super) fn discard(mut self, server: &mut ForkServer) {
        self.worker.kill(Some(server));
        unblock_reader(&self.outp);
        let _ = std::fs::remove_file(&self.outp);
    }
}

/// A fork server: a started command that forks worker lives.
pub(in crate::kernel::exec) struct ForkServer {
    pub(super) process: Spawned,
    pub(super) lives: u64,
    /// How lives ended that no one has asked about yet (life → status).
    pub(super) ended: Vec<(u64, String)>,
    /// Set when the server itself misbehaved or died: start it again.
    pub(super) broken: Option<String>,
}

impl ForkServer {
    /// Reads what the server has said without waiting; returns `Some(status)` if `life`
    /// has ended.
    pub(super) fn poll(&mut self, life: u64) -> Option<String> {
        loop {
            match self.process.lines.try_recv() {
                Ok(Event::Line(l)) => match serde_json::from_str::<ServerLine>(&l) {
                    Ok(ServerLine::Exited { life, status }) => self
                        .ended
                        .push((life, status.unwrap_or_else(|| "ended".into()))),
                    Ok(ServerLine::Error {
                        life: Some(n),
                        message,
                    }) => self.ended.push((n, format!("could not start: {message}"))),
                    Ok(ServerLine::Error {
                        life: None,
                        message,
                    }) => self.broken = Some(format!("fork server failed: {message}")),
                    Ok(ServerLine::Forked { .. }) => {}
                    Err(e) => {
                        self.broken = Some(format!(
                            "fork server printed a line that is not a server message ({e}): {}",
                            protocol::clip(&l)
                        ))
                    }
                },
                Ok(Event::Garbage(g)) => self.broken = Some(format!("fork server printed {g}")),
                Ok(Event::Eof) | Err(TryRecvError::Disconnected) => {
                    self.broken
                        .get_or_insert_with(|| "fork server exited".to_string());
                    break;
                }
                Err(TryRecvError::Empty) => break,
            }
        }
        let at = self.ended.iter().position(|(n, _)| *n == life)?;
        Some(self.ended.swap_remove(at).1)
    }

    /// Waits for the server's `forked` answer for `life`.
    fn forked_pid(&mut self, life: u64, deadline: Instant) -> Result<i32, String> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self
                .process
                .lines
                .recv_timeout(left.min(Duration::from_millis(50)))
            {
                Ok(Event::Line(l)) => match serde_json::from_str::<ServerLine>(&l) {
                    Ok(ServerLine::Forked { life: n, pid }) if n == life => return Ok(pid),
                    Ok(ServerLine::Forked { .. }) => {}
                    Ok(ServerLine::Exited { life: n, status }) => {
                        let s = status.unwrap_or_else(|| "ended".into());
                        if n == life {
                            return Err(format!("life {life} {s} before it started"));
                        }
                        self.ended.push((n, s));
                    }
                    Ok(ServerLine::Error { message, .. }) => {
                        return Err(format!("fork server could not fork: {message}"))
                    }
                    Err(e) => {
                        return Err(format!(
                            "fork server printed a line that is not a server message ({e}): {}",
                            protocol::clip(&l)
                        ))
                    }
                },
                Ok(Event::Garbage(g)) => return Err(format!("fork server printed {g}")),
                Ok(Event::Eof) | Err(RecvTimeoutError::Disconnected) => {
                    return Err("fork server exited".into())
                }
                Err(RecvTimeoutError::Timeout) if Instant::now() >= deadline => {
                    return Err("fork server did not answer the fork request".into())
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }

    /// Forks a fresh life and performs its handshake.
    pub(super) fn fork(
        &mut self,
        dir: &Path,
        timeout: Duration,
        offered: &[u64],
    ) -> Result<(Worker, Hello), RunError> {
        let forked = self.begin(dir, timeout)?;
        self.finish(forked, timeout, offered)
    }

    /// Forks a fresh life and opens its pipes; its setup (device initialisation) and
    /// hello are still to come ([`ForkServer::finish`]).
    pub(super) fn begin(&mut self, dir: &Path, timeout: Duration) -> Result<Forked, RunError> {
        self.lives += 1;
        let life = self.lives;
        let env_err = |m: String| RunError::Environment(m);
        let fifo = |name: &str| -> Result<PathBuf, RunError> {
            let p = dir.join(format!("life-{life}.{name}"));
            let _ = std::fs::remove_file(&p);
            mkfifo(&p).map_err(|e| env_err(format!("cannot make FIFO {}: {e}", p.display())))?;
            Ok(p)
        };
        let (inp, outp) = (fifo("in")?, fifo("out")?);
        let req = serde_json::json!({"type": "fork", "life": life,
            "stdin": inp.display().to_string(), "stdout": outp.display().to_string()});
        let sent = writeln!(self.process.stdin, "{req}").and_then(|_| self.process.stdin.flush());
        if let Err(e) = sent {
            self.broken = Some(format!("cannot write to the fork server: {e}"));
            return Err(env_err(format!("cannot write to the fork server: {e}")));
        }
        let deadline = Instant::now() + timeout;
        let started = (|| {
            let pid = self.forked_pid(life, deadline)?;
            // The reader opens the child's stdout FIFO (blocking until the child does).
            let (tx, opened) = mpsc::channel();
            let out_path = outp.clone();
            let (ltx, lines) = mpsc::channel();
            std::thread::spawn(move || match std::fs::File::open(&out_path) {
                Ok(f) => {
                    let _ = tx.send(());
                    let inner = read_lines(f);
                    while let Ok(ev) = inner.recv() {
                        let eof = matches!(ev, Event::Eof);
                        if ltx.send(ev).is_err() || eof {
                            return;
                        }
                    }
                }
                Err(_) => {
                    let _ = ltx.send(Event::Eof);
                }
            });
            let stdin = loop {
                match open_fifo_writer(&inp) {
                    Ok(f) => break f,
                    Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {}
                    Err(e) => return Err(format!("cannot open FIFO {}: {e}", inp.display())),
                }
                if let Some(s) = self.poll(life) {
                    return Err(format!("worker {s} before opening its pipes"));
                }
                if Instant::now() >= deadline {
                    kill_group(pid);
                    return Err("forked worker did not open its pipes".into());
                }
                std::thread::sleep(Duration::from_millis(2));
            };
            Ok((pid, stdin, lines, opened))
        })();
        let (pid, stdin, lines, opened) = match started {
            Ok(x) => x,
            Err(m) => {
                unblock_reader(&outp);
                let _ = std::fs::remove_file(&inp);
                let _ = std::fs::remove_file(&outp);
                return Err(env_err(m));
            }
        };
        let _ = std::fs::remove_file(&inp);
        let worker = Worker {
            stdin: Box::new(stdin),
            lines,
            stderr: Arc::clone(&self.process.stderr),
            kind: WorkerKind::Forked { pid, life },
        };
        Ok(Forked {
            worker,
            life,
            outp,
            opened,
            deadline,
        })
    }

    /// Waits for a begun life's hello (by its deadline), watching the server in case
    /// the life dies first.
    pub(super) fn finish(
        &mut self,
        forked: Forked,
        timeout: Duration,
        offered: &[u64],
    ) -> Result<(Worker, Hello), RunError> {
        let Forked {
            worker: mut w,
            life,
            outp,
            opened,
            deadline,
        } = forked;
        // The hello, watching the server in case the life dies before it opens stdout.
        let hello = loop {
            match w.lines.recv_timeout(Duration::from_millis(20)) {
                Err(RecvTimeoutError::Timeout) => {
                    if let Some(s) = self.poll(life) {
                        unblock_reader(&outp);
                        break Err(RunError::Environment(format!(
                            "forked worker {s} before its hello"
                        )));
                    }
                    if Instant::now() >= deadline {
                        break Err(RunError::Environment(format!(
                            "forked worker sent no hello within {:.0} s",
                            timeout.as_secs_f64()
                        )));
                    }
                }
                Ok(ev) => {
                    let (tx, rx) = mpsc::channel();
                    let _ = tx.send(ev);
                    break match greeting(&rx, Duration::ZERO, offered) {
                        Ok(Greeting::Hello(h)) => Ok(*h),
                        Ok(Greeting::ForkServer) => Err(RunError::Crash(
                            "a forked worker announced itself as a fork server".into(),
                        )),
                        Err(e) => Err(e),
                    };
                }
                Err(RecvTimeoutError::Disconnected) => {
                    break Err(RunError::Environment("forked worker exited".into()))
                }
            }
        };
        let _ = opened.try_recv();
        let _ = std::fs::remove_file(&outp);
        match hello {
            Ok(h) => Ok((w, h)),
            Err(e) => {
                w.kill(Some(self));
                Err(e)
            }
        }
    }

    pub(super) fn shut_down(self) {
        self.process.shut_down()
    }
}

fn mkfifo(p: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: plain syscall with a NUL-terminated path.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Opens a FIFO for writing without blocking (ENXIO while no reader has it open), then
/// makes the descriptor blocking.
fn open_fifo_writer(p: &Path) -> std::io::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(p)?;
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let fl = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
    }
    Ok(f)
}

/// Releases a reader thread blocked opening `fifo` (its writer never came): opening the
/// write end lets the open return, and closing it gives the reader EOF.
fn unblock_reader(fifo: &Path) {
    drop(open_fifo_writer(fifo));
}
