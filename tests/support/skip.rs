//! The harness of the test files that learn at run time whether they can run (a GPU, a
//! library, a browser): `libtest-mimic` instead of libtest, so that a skip counts as
//! *ignored* in cargo's summary line, with its reason printed, instead of as passed.
#![allow(dead_code)]

use libtest_mimic::{Arguments, Completion, Trial};

/// What a test returns: `Err(reason)` when it could not run here.
pub type Ran = Result<(), String>;

/// One test: it passes, fails (panics) or is ignored with the reason it gives.
pub fn trial(name: &'static str, test: fn() -> Ran) -> Trial {
    Trial::ignorable_test(name, move || {
        Ok(match test() {
            Ok(()) => Completion::Completed,
            Err(reason) => {
                eprintln!("SKIPPED {name}: {reason}");
                Completion::Ignored {
                    reason: Some(reason),
                }
            }
        })
    })
}

/// Runs the tests with cargo test's arguments (filters, --test-threads, ...) and exits.
pub fn main(trials: Vec<Trial>) -> ! {
    libtest_mimic::run(&Arguments::from_args(), trials).exit()
}
