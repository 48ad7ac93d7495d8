//! Ctrl-C: the first interrupt asks the campaign to stop after the case in hand (and
//! to cut shrinking short), so the report and every finding so far are written; a
//! second one exits at once.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Once;

static STOP: AtomicBool = AtomicBool::new(false);
static COUNT: AtomicUsize = AtomicUsize::new(0);
static INSTALL: Once = Once::new();

/// Installs the handler (once per process; later calls do nothing).
pub fn install() {
    INSTALL.call_once(|| {
        let _ = ctrlc::set_handler(|| {
            if COUNT.fetch_add(1, Ordering::SeqCst) == 0 {
                STOP.store(true, Ordering::SeqCst);
                eprintln!("\nmqa-fuzz: interrupted: finishing the case in hand and writing the report (Ctrl-C again to exit now)");
            } else {
                eprintln!("\nmqa-fuzz: second interrupt: exiting now");
                std::process::exit(130);
            }
        });
    });
}

/// Whether the campaign should stop.
pub fn requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// Asks the campaign to stop (tests, budget logic).
pub fn request() {
    STOP.store(true, Ordering::SeqCst);
}

/// Clears a stop request (between campaigns in one process, e.g. selftest).
pub fn reset() {
    STOP.store(false, Ordering::SeqCst);
    COUNT.store(0, Ordering::SeqCst);
}
