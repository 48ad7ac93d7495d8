//! The pool's side of judging on the device (DESIGN §8): a case goes to a worker whose
//! hello says `judges_on_device` with the request's `judge`, its output region not
//! poisoned (the worker poisons its own buffer and writes the region only for a
//! judgement with findings), and the judgement comes back in the result line.

use super::super::protocol::{self, RunRequest, Transport};
use super::super::shm::RegionOutput;
use super::lanes::Taken;
use super::{ExecKernel, Slot};
use crate::case::Case;
use crate::kernel::{
    DeviceJudgeRequest, DeviceJudgement, JudgedRun, Kernel, OutputBuffer, RunError, RunInfo,
};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// A request whose inputs are in its output's region, ready to send.
pub(super) struct Prepared {
    pub req: RunRequest,
    /// Seconds the inputs took to write.
    pub written: f64,
}

/// A worker's answer to one request.
pub(super) struct Answer {
    pub info: RunInfo,
    /// The device judge's answer to a request's `judge`.
    pub judgement: Option<DeviceJudgement>,
    /// Whether the output is in the region (always, without a judgement).
    pub output_written: bool,
}

impl ExecKernel {
    /// [`Kernel::device_judge`]: the worker says it judges on its device (its hello)
    /// and the output can live in shared memory (protocol 2).
    pub(super) fn judges_on_device(&self) -> Result<(), String> {
        if !self.hello.judges_on_device {
            return Err(format!(
                "{}'s worker does not judge on its device",
                self.name
            ));
        }
        if self.outputs.is_none() {
            return Err(format!(
                "{}'s worker speaks protocol 1 (no shared memory for the output)",
                self.name
            ));
        }
        Ok(())
    }

    /// [`Kernel::output_for_judged`]: a region of the pool, not poisoned.
    pub(super) fn unpoisoned_output(&self, case: &Case) -> OutputBuffer {
        if let Some(pool) = &self.outputs {
            let layout = protocol::region_layout(case, self.hello.draws(), String::new());
            if let Ok(storage) = RegionOutput::new(pool, layout) {
                // Not poisoned: the worker poisons its device buffer, and copies the
                // whole of it (guards included) here only when the judgement says so.
                return OutputBuffer::over(
                    case.rows(),
                    case.max_model_len,
                    case.out_row_stride,
                    Box::new(storage),
                    false,
                );
            }
        }
        self.output_for(case)
    }

    /// [`Kernel::run_judged`]: the case to a worker with `judge`.
    pub(super) fn run_judged_in_worker(
        &self,
        case: &Case,
        req: &DeviceJudgeRequest,
        out: &mut OutputBuffer,
    ) -> Result<JudgedRun, RunError> {
        self.judges_on_device().map_err(RunError::Environment)?;
        let prepared = self
            .prepare_in_place(case, out, false, Some(req))
            .ok_or_else(|| {
                RunError::Environment(
                    "the output of a case judged on the device must be in shared memory".into(),
                )
            })?;
        let Prepared { mut req, written } = prepared;
        req.id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let t0 = Instant::now();
        // A free worker, or the queue behind a busy one (`lanes`): then the line may
        // already be at the worker when this request's turn comes.
        let (k, forwarded_to) = match self.lanes.take_or_queue(&req.to_line()) {
            Taken::Own(k) => (k, None),
            Taken::Behind(k) => (k, self.lanes.wait_turn(k)),
        };
        let waited = t0.elapsed();
        let result = {
            let mut slot = self.slots[k].lock().unwrap_or_else(|e| e.into_inner());
            (|| {
                if forwarded_to.is_some()
                    && slot.worker.is_some()
                    && forwarded_to == Some(slot.life)
                {
                    return self.await_answer(&mut slot, &req, Ok(()), Some(k));
                }
                // Never forwarded, or its worker is gone (the case before crashed it):
                // sent now, to the slot's worker.
                if slot.worker.is_none() {
                    self.restart(&mut slot)?;
                }
                if slot.protocol < 2 {
                    return Err(RunError::Environment(format!(
                        "{}'s restarted worker speaks protocol 1",
                        self.name
                    )));
                }
                self.exchange(&mut slot, &req, Some(k))
            })()
        };
        self.give_slot(k);
        let a = finish_prepared(result, written, out)?;
        let judgement = a
            .judgement
            .ok_or_else(|| RunError::Crash("the worker answered without a judgement".into()))?;
        Ok(JudgedRun {
            info: RunInfo {
                queue_wait: Some(waited),
                ..a.info
            },
            judgement,
            output_written: a.output_written,
        })
    }

    /// Protocol 2 with `out` in a region of the pool (`None` otherwise): the inputs are
    /// written beside it, before a worker is taken (so no worker waits while they are
    /// written), and the request to send is returned; the worker will write the output
    /// in place (or, with `judge`, judge it on its device and write it only when the
    /// judgement says so).
    pub(super) fn prepare_in_place(
        &self,
        case: &Case,
        out: &mut OutputBuffer,
        poisoned: bool,
        judge: Option<&DeviceJudgeRequest>,
    ) -> Option<Prepared> {
        let pool = self.outputs.as_ref()?;
        let storage = region_output(out).filter(|r| r.is_from(pool))?;
        let t0 = Instant::now();
        let ints = protocol::WireInts::with(case, self.hello.draws());
        let layout = storage.layout.clone();
        storage
            .region_mut()
            .write(&layout, &protocol::wire_inputs(case, &ints));
        let written = t0.elapsed().as_secs_f64();
        // The id is set when it is sent.
        let mut req = RunRequest::new(0, case, Transport::Shm(layout));
        req.logits_poisoned = poisoned;
        req.kv_values = ints.drawn();
        req.block_table_tail = ints.table_tail();
        req.judge = judge.cloned();
        Some(Prepared { req, written })
    }

    /// Sends a prepared request (as request `id`) to `slot`'s worker and waits for the
    /// answer; a worker that crashed mid-case taints the region (not reused).
    pub(super) fn send_prepared(
        &self,
        slot: &mut Slot,
        id: u64,
        mut p: Prepared,
        out: &mut OutputBuffer,
    ) -> Result<Answer, RunError> {
        p.req.id = id;
        let result = self.exchange(slot, &p.req, None);
        finish_prepared(result, p.written, out)
    }
}

/// The answer to a prepared request, with the time its inputs took to write; a worker
/// that crashed mid-case taints the region (not reused, in case it was still writing).
fn finish_prepared(
    result: Result<Answer, RunError>,
    written: f64,
    out: &mut OutputBuffer,
) -> Result<Answer, RunError> {
    if let Err(RunError::Crash(_)) = &result {
        if let Some(storage) = region_output(out) {
            storage.tainted = true;
        }
    }
    result.map(|mut a| {
        a.info
            .phases
            .insert("harness: write inputs".into(), written);
        a
    })
}

/// The shared region an output buffer lives in, if it lives in one.
fn region_output(out: &mut OutputBuffer) -> Option<&mut RegionOutput> {
    out.shared_storage_mut()
        .and_then(|s| s.as_any_mut().downcast_mut::<RegionOutput>())
}
