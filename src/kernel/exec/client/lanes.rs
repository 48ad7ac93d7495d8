//! Which worker a request goes to. A free worker first; while every worker is busy, a
//! request judged on the device may queue *behind* a busy worker, one deep: the worker
//! holding the slot forwards its line to the worker while its own case runs, so the
//! worker's reader decodes it meanwhile and starts it as soon as the case before is
//! answered (the worker serves its requests in order). The queued request owns the
//! slot when the one before gives it up; its deadline starts then, and if the worker
//! died or was replaced meanwhile (a crash is the running case's, not the queued one's)
//! it is sent again to the worker the slot has by then.
//!
//! Only requests whose output region a dying worker may scribble on harmlessly queue
//! behind: a device-judged request says its region is not poisoned and the worker
//! rewrites the whole of it when it writes it at all.

use std::sync::{Condvar, Mutex};

/// A request queued behind the one a slot runs.
struct Behind {
    /// The protocol line, until the slot's holder forwards it.
    line: Option<String>,
    /// The worker life it was forwarded to.
    sent_to: Option<u64>,
    /// The request before gave the slot up: the queued one owns it now.
    handed: bool,
}

#[derive(Default)]
struct Lane {
    busy: bool,
    behind: Option<Behind>,
}

struct State {
    free: Vec<usize>,
    lanes: Vec<Lane>,
    /// Requests waiting in [`Lanes::take`]: while any does, nothing queues behind a
    /// busy slot, so the next slot given up goes free and a waiting request can take it.
    waiting_plain: usize,
}

/// Where a request got a slot.
#[derive(Debug, PartialEq)]
pub(super) enum Taken {
    /// A free slot: send the request and wait for its answer.
    Own(usize),
    /// Behind the request slot `k` runs: wait for [`Lanes::wait_turn`] first.
    Behind(usize),
}

/// The slots of a pool: free, busy, and what waits behind a busy one.
pub(super) struct Lanes {
    state: Mutex<State>,
    changed: Condvar,
    /// Whether requests may queue behind a busy slot at all.
    pipelined: bool,
}

impl Lanes {
    pub fn new(slots: usize, pipelined: bool) -> Lanes {
        Lanes {
            state: Mutex::new(State {
                free: (0..slots).rev().collect(),
                lanes: (0..slots).map(|_| Lane::default()).collect(),
                waiting_plain: 0,
            }),
            changed: Condvar::new(),
            pipelined,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A free slot, waiting for one (and keeping other requests from queueing behind
    /// busy slots meanwhile, so it is not passed over for good).
    pub fn take(&self) -> usize {
        let mut s = self.lock();
        s.waiting_plain += 1;
        loop {
            if let Some(k) = s.free.pop() {
                s.lanes[k].busy = true;
                s.waiting_plain -= 1;
                return k;
            }
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// A free slot, or a place behind a busy slot with nothing queued (holding `line`
    /// for its holder to forward), waiting for either.
    pub fn take_or_queue(&self, line: &str) -> Taken {
        let mut s = self.lock();
        loop {
            if let Some(k) = s.free.pop() {
                s.lanes[k].busy = true;
                return Taken::Own(k);
            }
            if self.pipelined && s.waiting_plain == 0 {
                if let Some(k) = s.lanes.iter().position(|l| l.busy && l.behind.is_none()) {
                    s.lanes[k].behind = Some(Behind {
                        line: Some(line.to_string()),
                        sent_to: None,
                        handed: false,
                    });
                    return Taken::Behind(k);
                }
            }
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// For slot `k`'s holder: the queued line to forward, once.
    pub fn line_to_forward(&self, k: usize) -> Option<String> {
        self.lock().lanes[k].behind.as_mut()?.line.take()
    }

    /// For slot `k`'s holder: the queued line went to worker life `life`.
    pub fn forwarded(&self, k: usize, life: u64) {
        if let Some(b) = self.lock().lanes[k].behind.as_mut() {
            b.sent_to = Some(life);
        }
    }

    /// For the request queued behind slot `k`: waits until it owns the slot; the worker
    /// life its line went to, `None` when it was never forwarded.
    pub fn wait_turn(&self, k: usize) -> Option<u64> {
        let mut s = self.lock();
        loop {
            if s.lanes[k].behind.as_ref().is_some_and(|b| b.handed) {
                let sent_to = s.lanes[k].behind.take().and_then(|b| b.sent_to);
                drop(s);
                // The place behind this slot is open again.
                self.changed.notify_all();
                return sent_to;
            }
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Gives slot `k` up: to the request queued behind it, else back to the free ones.
    pub fn give(&self, k: usize) {
        let mut s = self.lock();
        match s.lanes[k].behind.as_mut() {
            Some(b) => b.handed = true,
            None => {
                s.lanes[k].busy = false;
                s.free.push(k);
            }
        }
        drop(s);
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_request_queues_behind_a_busy_slot_and_owns_it_when_the_one_before_gives_it_up() {
        let lanes = Arc::new(Lanes::new(1, true));
        assert_eq!(lanes.take_or_queue("a"), Taken::Own(0));
        assert_eq!(lanes.take_or_queue("b"), Taken::Behind(0));
        // The holder forwards the queued line once, to its worker's life 7.
        assert_eq!(lanes.line_to_forward(0).as_deref(), Some("b"));
        assert_eq!(lanes.line_to_forward(0), None);
        lanes.forwarded(0, 7);
        // A third request finds no slot to queue behind: it waits.
        let third = {
            let l = lanes.clone();
            std::thread::spawn(move || l.take_or_queue("c"))
        };
        let turn = {
            let l = lanes.clone();
            std::thread::spawn(move || l.wait_turn(0))
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !turn.is_finished(),
            "the queued request waits for the one before"
        );
        assert!(!third.is_finished());
        lanes.give(0);
        assert_eq!(
            turn.join().unwrap(),
            Some(7),
            "it owns the slot, its line at life 7"
        );
        // The slot went to the queued request, not back to the free ones: the third
        // request now queues behind it.
        assert_eq!(third.join().unwrap(), Taken::Behind(0));
        // A line never forwarded (the request before finished first) is sent again.
        lanes.give(0);
        assert_eq!(lanes.wait_turn(0), None);
        lanes.give(0);
        assert_eq!(lanes.take(), 0, "free again once nothing waits behind it");
    }

    #[test]
    fn a_request_waiting_for_a_free_slot_is_not_passed_over_by_queued_ones() {
        let lanes = Arc::new(Lanes::new(1, true));
        assert_eq!(lanes.take_or_queue("a"), Taken::Own(0));
        let plain = {
            let l = lanes.clone();
            std::thread::spawn(move || l.take())
        };
        std::thread::sleep(Duration::from_millis(50));
        // While it waits, nothing queues behind the busy slot.
        let queued = {
            let l = lanes.clone();
            std::thread::spawn(move || l.take_or_queue("b"))
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !queued.is_finished(),
            "no place behind while a plain request waits"
        );
        lanes.give(0);
        // The slot went free: one of the two has it; the other gets it (or, once no
        // plain request waits, the place behind it) after.
        std::thread::sleep(Duration::from_millis(50));
        lanes.give(0);
        assert_eq!(plain.join().unwrap(), 0);
        let q = queued.join().unwrap();
        assert!(matches!(q, Taken::Own(0) | Taken::Behind(0)), "{q:?}");
    }

    #[test]
    fn without_pipelining_requests_wait_for_a_free_slot() {
        let lanes = Arc::new(Lanes::new(2, false));
        assert_eq!(lanes.take_or_queue("a"), Taken::Own(0));
        assert_eq!(lanes.take_or_queue("b"), Taken::Own(1));
        let third = {
            let l = lanes.clone();
            std::thread::spawn(move || l.take_or_queue("c"))
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!third.is_finished());
        assert_eq!(lanes.line_to_forward(0), None);
        lanes.give(1);
        assert_eq!(third.join().unwrap(), Taken::Own(1));
    }
}
