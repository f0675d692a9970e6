//! The trace of a run: one line per step, with the notable things the step
//! caused (operations the agents received, answers, crashes), so that a
//! failure can be read back without a debugger.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Lines of a run, each stamped with its step and simulated time. Clones
/// share the lines, so a watchdog can print the trace of a run that hangs.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    lines: Arc<Mutex<Vec<String>>>,
    /// The step being recorded (`None` before the first and in the final phase).
    step: Option<usize>,
    phase: &'static str,
}

impl Trace {
    /// A new, empty trace.
    pub fn new() -> Self {
        Self {
            lines: Arc::default(),
            step: None,
            phase: "setup",
        }
    }

    /// Starts step `index` at simulated time `at_ms`: `what` says what it does.
    pub fn step(&mut self, index: usize, at_ms: u64, what: &str) {
        self.step = Some(index);
        self.phase = "chaos";
        self.lines()
            .push(format!("#{index:<4} t={} {what}", format_ms(at_ms)));
    }

    /// Starts a named phase (e.g. "liveness round 3").
    pub fn phase(&mut self, phase: &'static str, at_ms: u64, what: &str) {
        self.step = None;
        self.phase = phase;
        self.lines()
            .push(format!("{phase} t={} {what}", format_ms(at_ms)));
    }

    /// Notes something the current step caused.
    pub fn note(&mut self, what: impl AsRef<str>) {
        self.lines().push(format!("        {}", what.as_ref()));
    }

    fn lines(&self) -> MutexGuard<'_, Vec<String>> {
        self.lines.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many lines there are.
    pub fn len(&self) -> usize {
        self.lines().len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The index of the step being recorded, if in the chaos phase.
    pub fn current_step(&self) -> Option<usize> {
        self.step
    }

    /// The phase being recorded.
    pub fn current_phase(&self) -> &'static str {
        self.phase
    }

    /// The whole trace as text, or its last `limit` lines when longer.
    pub fn render(&self, limit: usize) -> String {
        let mut text = String::new();
        let lines = self.lines();
        let skipped = lines.len().saturating_sub(limit);
        if skipped > 0 {
            let _ = writeln!(text, "        ... {skipped} earlier line(s) left out ...");
        }
        for line in &lines[skipped..] {
            let _ = writeln!(text, "{line}");
        }
        text
    }
}

/// Simulated milliseconds as `12.345s`.
pub fn format_ms(ms: u64) -> String {
    format!("{}.{:03}s", ms / 1_000, ms % 1_000)
}
