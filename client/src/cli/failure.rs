//! reconctl's exit codes, and the failure a command ends with.

use std::fmt;

/// How a command ended; each maps to one exit code (docs/reconctl.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    /// 0: done (for `reconcile --wait`: converged).
    Success,
    /// 1: the request failed (server unreachable, refused, invalid input).
    Error,
    /// 2: the command line or configuration is wrong.
    Usage,
    /// 3: `reconcile --wait` ended stalled or without progress.
    Stalled,
    /// 4: `reconcile --wait` timed out with work remaining.
    TimedOut,
}

impl Exit {
    /// The process exit code.
    pub(crate) fn code(self) -> u8 {
        match self {
            Exit::Success => 0,
            Exit::Error => 1,
            Exit::Usage => 2,
            Exit::Stalled => 3,
            Exit::TimedOut => 4,
        }
    }
}

/// A command that failed: the message to print and the exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    /// What went wrong and what to do.
    pub(crate) message: String,
    /// The exit code.
    pub(crate) exit: Exit,
}

impl Failure {
    /// A request or input failure (exit 1).
    pub(crate) fn error(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            exit: Exit::Error,
        }
    }

    /// A command-line or configuration mistake (exit 2).
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            exit: Exit::Usage,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.message)
    }
}
