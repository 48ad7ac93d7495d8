//! Errors that end a command, each rendered once at the top with its exit code.
//!
//! A leaf: the modules whose errors end a command convert them here (`From<…> for
//! Fatal` lives beside each error type), so this module imports nothing of the crate.

use std::fmt;

/// Exit codes of every command.
pub mod exit {
    /// Clean: nothing found.
    pub const CLEAN: i32 = 0;
    /// Findings.
    pub const FINDINGS: i32 = 1;
    /// Bad usage or bad input.
    pub const USAGE: i32 = 2;
    /// Environment (GPU required but absent, adapter missing, ...).
    pub const ENVIRONMENT: i32 = 3;
}

/// A fatal error: a one-line message and its exit code.
#[derive(Debug)]
pub struct Fatal {
    pub code: i32,
    pub message: String,
}

impl Fatal {
    pub fn usage(message: impl Into<String>) -> Self {
        Fatal {
            code: exit::USAGE,
            message: message.into(),
        }
    }
    pub fn environment(message: impl Into<String>) -> Self {
        Fatal {
            code: exit::ENVIRONMENT,
            message: message.into(),
        }
    }
}

impl fmt::Display for Fatal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Fatal {}
