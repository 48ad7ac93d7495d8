//! Running the real `mqa-fuzz` binary from a test: a scratch directory per test and a
//! run that returns the exit code, stdout and stderr.

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_mqa-fuzz")
}

/// A fresh directory `mqa-<suite>-<pid>-<name>` under the system's temporary directory.
pub fn scratch(suite: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mqa-{suite}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs the binary in `dir` with `args`: `(exit code, stdout, stderr)`.
pub fn run(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin())
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run mqa-fuzz");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
