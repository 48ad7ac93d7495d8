//! Errors that end a command, each rendered once at the top with its exit code.

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

impl From<crate::case::CaseFileError> for Fatal {
    fn from(e: crate::case::CaseFileError) -> Self {
        Fatal::usage(e.to_string())
    }
}

impl From<crate::kernel::OpenError> for Fatal {
    fn from(e: crate::kernel::OpenError) -> Self {
        match e {
            crate::kernel::OpenError::Unknown(_) | crate::kernel::OpenError::Invalid { .. } => {
                Fatal::usage(e.to_string())
            }
            crate::kernel::OpenError::Unavailable { .. } => Fatal::environment(e.to_string()),
        }
    }
}
