//! What the executor needs to know about item types: retry policies,
//! operation timeouts, in-flight limits. Pure; the owner applies them.

use serde::{Deserialize, Serialize};

use crate::engine::plan::TypeRules;
use crate::engine::schema::TypeSchema;

/// Default operation timeout when a type declares none.
pub const DEFAULT_OPERATION_TIMEOUT_MS: u64 = 60_000;
/// Default operations in flight per type when a type declares none.
pub const DEFAULT_MAX_IN_FLIGHT: u32 = 64;

/// How long to wait before retrying a failed operation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum RetryPolicy {
    /// Always the same wait.
    Static {
        /// The wait.
        wait_ms: u64,
    },
    /// A uniformly random wait in `[min_ms, max_ms]` (inclusive).
    Random {
        /// Shortest wait.
        min_ms: u64,
        /// Longest wait.
        max_ms: u64,
    },
    /// `initial * multiplier^(failures - 1)`, capped at `max_ms`: the first
    /// retry waits `initial_ms`.
    Exponential {
        /// The first wait.
        initial_ms: u64,
        /// Growth per failure (at least 1).
        multiplier: f64,
        /// The cap.
        max_ms: u64,
    },
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::Exponential {
            initial_ms: 1_000,
            multiplier: 2.0,
            max_ms: 300_000,
        }
    }
}

impl RetryPolicy {
    /// The wait after the `failures`-th consecutive failure (1 = first).
    /// `random` draws a value in an inclusive range (injected: the policy
    /// itself has no randomness).
    pub fn delay_ms(&self, failures: u32, random: impl FnOnce(u64, u64) -> u64) -> u64 {
        match self {
            Self::Static { wait_ms } => *wait_ms,
            Self::Random { min_ms, max_ms } => {
                let (low, high) = if min_ms <= max_ms {
                    (*min_ms, *max_ms)
                } else {
                    (*max_ms, *min_ms)
                };
                random(low, high).clamp(low, high)
            }
            Self::Exponential {
                initial_ms,
                multiplier,
                max_ms,
            } => {
                let exponent = i32::try_from(failures.saturating_sub(1)).unwrap_or(i32::MAX);
                let grown = (*initial_ms as f64) * multiplier.max(1.0).powi(exponent);
                if grown.is_finite() && grown < *max_ms as f64 {
                    grown as u64
                } else {
                    *max_ms
                }
            }
        }
    }

    /// The longest wait the policy can produce (clamps persisted deadlines
    /// after a restart).
    pub fn max_delay_ms(&self) -> u64 {
        match self {
            Self::Static { wait_ms } => *wait_ms,
            Self::Random { min_ms, max_ms } => (*min_ms).max(*max_ms),
            Self::Exponential { max_ms, .. } => *max_ms,
        }
    }
}

/// An item type as an agent registered it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TypeSpec {
    /// The item type.
    pub item_type: String,
    /// What needs a recreate.
    pub recreate_on_change: Vec<String>,
    /// Ask the agent whether a change needs a recreate.
    pub ask_needs_recreate: bool,
    /// Waits between attempts.
    pub retry: RetryPolicy,
    /// Failed attempts after which an item is terminal (0 = unlimited).
    pub max_attempts: u32,
    /// How long an operation may run.
    pub operation_timeout_ms: u64,
    /// Whether the agent answers READ.
    pub supports_read: bool,
    /// Operations of this type in flight at once.
    pub max_in_flight: u32,
    /// The JSON Schema items' properties must satisfy (`None`: any).
    /// Records stored before schemas existed have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<TypeSchema>,
}

impl TypeSpec {
    /// A spec with defaults for everything but the type.
    pub fn new(item_type: impl Into<String>) -> Self {
        Self {
            item_type: item_type.into(),
            recreate_on_change: Vec::new(),
            ask_needs_recreate: false,
            retry: RetryPolicy::default(),
            max_attempts: 0,
            operation_timeout_ms: DEFAULT_OPERATION_TIMEOUT_MS,
            supports_read: false,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            schema: None,
        }
    }

    /// The planner's view of the spec.
    pub fn rules(&self) -> TypeRules {
        TypeRules {
            recreate_on_change: self.recreate_on_change.clone(),
            ask_needs_recreate: self.ask_needs_recreate,
        }
    }

    /// When a failed operation may run again: `None` when the failure is
    /// terminal (a terminal code, or `max_attempts` reached).
    pub fn retry_at(
        &self,
        now_ms: u64,
        failures: u32,
        terminal_code: bool,
        random: impl FnOnce(u64, u64) -> u64,
    ) -> Option<u64> {
        if terminal_code || (self.max_attempts > 0 && failures >= self.max_attempts) {
            return None;
        }
        Some(now_ms.saturating_add(self.retry.delay_ms(failures, random)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_backoff_grows_from_initial_and_is_capped() {
        let policy = RetryPolicy::Exponential {
            initial_ms: 100,
            multiplier: 2.0,
            max_ms: 1_000,
        };
        let waits: Vec<u64> = (1..=6).map(|n| policy.delay_ms(n, |a, _| a)).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1_000, 1_000]);
    }

    #[test]
    fn random_backoff_stays_within_inclusive_bounds() {
        let policy = RetryPolicy::Random {
            min_ms: 5,
            max_ms: 9,
        };
        assert_eq!(policy.delay_ms(1, |_, high| high + 100), 9);
        assert_eq!(policy.delay_ms(1, |low, _| low), 5);
    }

    #[test]
    fn max_attempts_and_terminal_codes_stop_retries() {
        let mut spec = TypeSpec::new("t");
        spec.retry = RetryPolicy::Static { wait_ms: 10 };
        spec.max_attempts = 3;
        assert_eq!(spec.retry_at(1_000, 1, false, |a, _| a), Some(1_010));
        assert_eq!(spec.retry_at(1_000, 3, false, |a, _| a), None);
        assert_eq!(spec.retry_at(1_000, 1, true, |a, _| a), None);
    }
}
