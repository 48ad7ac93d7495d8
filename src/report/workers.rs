//! The words of a kernel's worker processes in the summary: protocol, fork server,
//! restarts (and how many took a life started ahead), the lives' warm-up.

use crate::kernel::WorkerReport;
use crate::util::group;

/// E.g. `protocol 2, fork server, 3 restarts (mean 0.01 s, max 0.02 s, 3 into a life
/// started ahead), warm-up 83.4 ms a life (4 lives)`.
pub fn worker_words(w: &WorkerReport) -> String {
    let restarts = match w.restarts {
        0 => "no restarts".to_string(),
        n => format!(
            "{n} restart{} (mean {:.2} s, max {:.2} s{}{})",
            if n == 1 { "" } else { "s" },
            w.restart_mean_secs,
            w.restart_max_secs,
            match w.restart_retries {
                0 => String::new(),
                r => format!(", {r} failed attempts retried"),
            },
            match w.restarts_from_spare {
                0 => String::new(),
                s => format!(", {s} into a life started ahead"),
            }
        ),
    };
    let fork = if w.fork_server { ", fork server" } else { "" };
    let warm = match w.warm_ups {
        0 => String::new(),
        n => format!(
            ", warm-up {:.1} ms a life ({} {})",
            w.warm_up_mean_secs * 1e3,
            group(n),
            if n == 1 { "life" } else { "lives" }
        ),
    };
    let exits = match w.crash_exits {
        0 => String::new(),
        n => format!(
            ", a worker that reported a crash gone in {:.1} ms (mean of {})",
            w.crash_exit_mean_secs * 1e3,
            group(n)
        ),
    };
    format!("protocol {}{fork}, {restarts}{exits}{warm}", w.protocol)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_words_say_restarts_and_warm_ups() {
        let mut w = WorkerReport {
            protocol: 2,
            fork_server: true,
            restarts: 3,
            restart_mean_secs: 0.014,
            restart_max_secs: 0.02,
            restarts_from_spare: 3,
            warm_ups: 4,
            warm_up_mean_secs: 0.0834,
            ..Default::default()
        };
        assert_eq!(
            worker_words(&w),
            "protocol 2, fork server, 3 restarts (mean 0.01 s, max 0.02 s, 3 into a life started ahead), warm-up 83.4 ms a life (4 lives)"
        );
        w.crash_exits = 2;
        w.crash_exit_mean_secs = 0.1234;
        assert!(
            worker_words(&w).contains(
                "max 0.02 s, 3 into a life started ahead), a worker that reported a crash gone in 123.4 ms (mean of 2), warm-up"
            ),
            "{}",
            worker_words(&w)
        );
        w.crash_exits = 0;
        w.restarts = 0;
        w.warm_ups = 0;
        w.fork_server = false;
        assert_eq!(worker_words(&w), "protocol 2, no restarts");
    }
}
