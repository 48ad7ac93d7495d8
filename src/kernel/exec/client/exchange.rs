//! The conversation with one worker: a request sent, its answer awaited under the
//! per-case deadline, a request queued behind it forwarded meanwhile (`lanes`); a
//! worker that misbehaves is killed and the case reported as its crash.

use super::super::process::Event;
use super::super::protocol::{self, ErrorKind, RunRequest, WorkerLine};
use super::judged::Answer;
use super::{ExecKernel, Slot};
use crate::kernel::RunError;
use std::io::Write;
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

impl ExecKernel {
    /// Sends one request and waits for its answer; a misbehaving worker is killed.
    /// `lane`: the slot's index, when a request may be queued behind this one (its line
    /// is forwarded to the worker while this one runs).
    pub(super) fn exchange(
        &self,
        slot: &mut Slot,
        req: &RunRequest,
        lane: Option<usize>,
    ) -> Result<Answer, RunError> {
        let w = slot.worker.as_mut().expect("worker started");
        let sent = w
            .stdin
            .write_all(req.to_line().as_bytes())
            .and_then(|_| w.stdin.flush())
            .map_err(|e| format!("cannot send the request ({e})"));
        self.await_answer(slot, req, sent, lane)
    }

    /// Forwards the line queued behind slot `lane` to its worker (once).
    fn forward_queued(&self, slot: &mut Slot, lane: usize) {
        let Some(line) = self.lanes.line_to_forward(lane) else {
            return;
        };
        let Some(w) = slot.worker.as_mut() else {
            return;
        };
        // Not sent: the queued request sends it again when its turn comes.
        if w.stdin.write_all(line.as_bytes()).is_ok() && w.stdin.flush().is_ok() {
            self.lanes.forwarded(lane, slot.life);
        }
    }

    /// Waits for the answer to `req` (already sent, or `sent` says why not).
    pub(super) fn await_answer(
        &self,
        slot: &mut Slot,
        req: &RunRequest,
        sent: Result<(), String>,
        lane: Option<usize>,
    ) -> Result<Answer, RunError> {
        let id = req.id;
        let deadline = Instant::now() + self.config.case_timeout;
        let failure: String = 'wait: {
            if let Err(e) = sent {
                break 'wait e;
            }
            // While it runs, a request queued behind it goes to the worker too (looked
            // for every few milliseconds).
            let event = loop {
                if let Some(k) = lane {
                    self.forward_queued(slot, k);
                }
                let w = slot.worker.as_mut().expect("worker started");
                let left = deadline.saturating_duration_since(Instant::now());
                let slice = match lane {
                    Some(_) => left.min(Duration::from_millis(2)),
                    None => left,
                };
                match w.lines.recv_timeout(slice) {
                    Err(RecvTimeoutError::Timeout) if Instant::now() < deadline => continue,
                    r => break r,
                }
            };
            let line = match event {
                Ok(Event::Line(l)) => l,
                Ok(Event::Garbage(g)) => break 'wait format!("worker printed {g}"),
                Ok(Event::Eof) | Err(RecvTimeoutError::Disconnected) => {
                    break 'wait "worker exited".to_string()
                }
                Err(RecvTimeoutError::Timeout) => {
                    break 'wait format!(
                        "no answer within {:.0} s {}",
                        self.config.case_timeout.as_secs_f64(),
                        crate::kernel::TIMEOUT_MARK
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
                    phases_us,
                    judgement,
                    output_written,
                } if got == id => {
                    if let (Some(want), Some(got)) = (&req.output, &output) {
                        if want != got {
                            break 'wait format!(
                                "worker wrote its output to {got:?}, not to the requested {want}"
                            );
                        }
                    }
                    if req.judge.is_some() && judgement.is_none() {
                        break 'wait "worker answered a request to judge without a judgement"
                            .to_string();
                    }
                    return Ok(Answer {
                        info: protocol::run_info(
                            kernel_time_us,
                            inputs_intact,
                            device_bytes,
                            phases_us,
                        ),
                        judgement: judgement.map(|j| *j),
                        output_written: output_written.unwrap_or(true),
                    });
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
                            let gone = slot.end_crashed_worker();
                            let mut r = self.restarts.lock().unwrap_or_else(|e| e.into_inner());
                            r.crash_exits += 1;
                            r.crash_exit_secs += gone.as_secs_f64();
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
        let (status, tail) = slot.kill_worker().expect("worker started");
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
