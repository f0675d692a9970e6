//! The live progress display of `reconcile --wait`: items by state and
//! operations in flight, as one line redrawn in place on a terminal, or as
//! plain lines (only when something changed) otherwise.

use std::time::Duration;

use super::failure::Failure;
use super::output::{emit, emit_control};
use super::status::{condition_value, counts};
use crate::proto as v1;

/// The longest progress line drawn on a terminal, so that it never wraps
/// (a wrapped line cannot be redrawn in place).
const TERMINAL_WIDTH: usize = 100;

/// The progress display.
#[derive(Debug)]
pub(crate) struct Progress {
    terminal: bool,
    last: Option<String>,
    drawn: bool,
}

impl Progress {
    /// A display that redraws one line if `terminal`, else prints lines.
    pub(crate) fn new(terminal: bool) -> Self {
        Self {
            terminal,
            last: None,
            drawn: false,
        }
    }

    /// Shows `status` as of `elapsed`.
    pub(crate) fn update(
        &mut self,
        elapsed: Duration,
        status: &v1::TenantStatus,
    ) -> Result<(), Failure> {
        let summary = summary(status);
        if self.terminal {
            let line = format!("[{:>5.1}s] {summary}", elapsed.as_secs_f64());
            let line: String = line.chars().take(TERMINAL_WIDTH).collect();
            self.drawn = true;
            // Carriage return and "erase line": redraw in place.
            emit_control("\r\x1b[2K")?;
            emit(&line)
        } else if self.last.as_deref() != Some(summary.as_str()) {
            let line = format!("[{:>5.1}s] {summary}\n", elapsed.as_secs_f64());
            self.last = Some(summary);
            emit(&line)
        } else {
            Ok(())
        }
    }

    /// Clears the progress line (on a terminal) before the result prints.
    pub(crate) fn finish(&mut self) -> Result<(), Failure> {
        if self.terminal && self.drawn {
            self.drawn = false;
            emit_control("\r\x1b[2K")
        } else {
            Ok(())
        }
    }
}

/// Items by state, operations in flight and the conditions, on one line.
pub(crate) fn summary(status: &v1::TenantStatus) -> String {
    format!(
        "items: {} | in flight: {} | Ready={} Reconciling={} Stalled={}",
        counts(status),
        status.operations_in_flight,
        condition_value(&status.conditions, "Ready"),
        condition_value(&status.conditions, "Reconciling"),
        condition_value(&status.conditions, "Stalled"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_counts_items_and_operations() {
        let status = v1::TenantStatus {
            items_by_state: [("CREATING".to_owned(), 2), ("CREATED".to_owned(), 1)]
                .into_iter()
                .collect(),
            operations_in_flight: 2,
            ..v1::TenantStatus::default()
        };
        assert_eq!(
            summary(&status),
            "items: CREATED 1, CREATING 2 | in flight: 2 | Ready=- Reconciling=- Stalled=-"
        );
    }
}
