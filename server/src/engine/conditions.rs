//! Tenant conditions (Ready / Reconciling / Stalled), recomputed after every
//! pass and result (DESIGN section 5). Pure: the caller passes the clock.

use serde::{Deserialize, Serialize};

use super::plan::{WaitReason, retry_by};
use super::waiting::WaitingSummary;

/// The three condition types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ConditionKind {
    /// Every intended item is created and equal, and the tenant is quiescent.
    Ready,
    /// Work is in flight or can be dispatched.
    Reconciling,
    /// Quiescent, but stuck: a terminal failure, or no configurator for too long.
    Stalled,
}

impl ConditionKind {
    /// The name users see.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ready => "Ready",
            Self::Reconciling => "Reconciling",
            Self::Stalled => "Stalled",
        }
    }
}

/// The Stalled reason of a tenant whose items waited for a configurator
/// longer than `configurator_grace`.
pub const NO_CONFIGURATOR: &str = "NoConfigurator";

/// One condition of a tenant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Condition {
    /// Which condition.
    pub kind: ConditionKind,
    /// Whether it holds.
    pub status: bool,
    /// A CamelCase reason code (DESIGN section 5), e.g. `WaitingForDependencies`.
    pub reason: String,
    /// A sentence for humans.
    pub message: String,
    /// The intent generation this condition describes.
    pub observed_generation: u64,
    /// When `status` last changed (unix milliseconds).
    pub last_transition_ms: u64,
}

/// What the conditions are computed from.
#[derive(Debug)]
pub struct Progress<'a> {
    /// The tenant's intent generation.
    pub generation: u64,
    /// Operations in flight.
    pub in_flight: usize,
    /// Operations that could be dispatched now.
    pub ready_operations: usize,
    /// Counts of the waiting items.
    pub waiting: &'a WaitingSummary,
    /// Since when some item waits for a configurator (unix ms).
    pub no_configurator_since_ms: Option<u64>,
    /// The item types some item waits for a configurator of (those
    /// waiting with reason NoConfigurator, and UNKNOWN ones whose type no
    /// agent holds), sorted.
    pub without_configurator: Vec<String>,
    /// How long items may wait for a configurator before the tenant stalls.
    pub configurator_grace_ms: u64,
    /// Now (unix ms).
    pub now_ms: u64,
}

impl Progress<'_> {
    /// Nothing in flight, nothing dispatchable, no backoff pending.
    pub fn is_quiescent(&self) -> bool {
        self.in_flight == 0
            && self.ready_operations == 0
            && !self.waiting.by_reason.contains_key(&WaitReason::Backoff)
    }
}

/// Computes the conditions, keeping transition times of unchanged ones.
/// Returns them with the observed generation (the generation when
/// quiescent, otherwise `previous_observed`).
pub fn compute_conditions(
    previous: &[Condition],
    previous_observed: u64,
    progress: &Progress<'_>,
) -> (Vec<Condition>, u64) {
    let quiescent = progress.is_quiescent();
    let observed = if quiescent {
        progress.generation
    } else {
        previous_observed
    };
    let (stalled, stalled_reason, stalled_message) = stall(progress, quiescent);
    let ready = quiescent && progress.waiting.total == 0;
    let (ready_reason, ready_message) = if ready {
        (
            "Converged".to_string(),
            "every intended item is created and up to date".to_string(),
        )
    } else if !quiescent {
        (
            "Reconciling".to_string(),
            "operations are in flight, ready to run or waiting to be retried".to_string(),
        )
    } else {
        waiting_summary(progress.waiting)
    };
    let retrying = progress
        .waiting
        .by_reason
        .get(&WaitReason::Backoff)
        .copied()
        .unwrap_or(0);
    let reconciling_message = format!(
        "{} operation(s) in flight, {} ready to run, {retrying} waiting to be retried",
        progress.in_flight, progress.ready_operations
    );
    let drafts = [
        (ConditionKind::Ready, ready, ready_reason, ready_message),
        (
            ConditionKind::Reconciling,
            !quiescent,
            if quiescent {
                "Quiescent".to_string()
            } else {
                "Progressing".to_string()
            },
            if quiescent {
                "nothing in flight, ready to run or waiting to be retried".to_string()
            } else {
                reconciling_message
            },
        ),
        (
            ConditionKind::Stalled,
            stalled,
            stalled_reason,
            stalled_message,
        ),
    ];
    let conditions = drafts
        .into_iter()
        .map(|(kind, status, reason, message)| {
            let last_transition_ms = previous
                .iter()
                .find(|c| c.kind == kind && c.status == status)
                .map_or(progress.now_ms, |c| c.last_transition_ms);
            Condition {
                kind,
                status,
                reason,
                message,
                observed_generation: observed,
                last_transition_ms,
            }
        })
        .collect();
    (conditions, observed)
}

fn stall(progress: &Progress<'_>, quiescent: bool) -> (bool, String, String) {
    if !quiescent {
        return (
            false,
            "Progressing".into(),
            "the tenant is reconciling".into(),
        );
    }
    if progress.waiting.terminal > 0 {
        return (
            true,
            "TerminalFailure".into(),
            terminal_failure_message(progress.waiting),
        );
    }
    let waited_too_long = progress.no_configurator_since_ms.is_some_and(|since| {
        progress.now_ms.saturating_sub(since) >= progress.configurator_grace_ms
    });
    if waited_too_long {
        let types = &progress.without_configurator;
        return (
            true,
            NO_CONFIGURATOR.into(),
            format!(
                "no configurator connected for type(s) {}; start an agent that registers them",
                types.join(", ")
            ),
        );
    }
    (false, "NotStalled".into(), "nothing is stuck".into())
}

/// How many failed items a Stalled message names, at most.
const NAMED_FAILURES: usize = 3;

/// The Stalled message of a terminal failure: the items that failed
/// terminally themselves, by name (the root causes, which their intent
/// must change), rather than a count of the items that show one. Items
/// deeper in a chain wait on a dependency that waits on the failure, and
/// show it only as "not created (dependency)": a count of those that
/// show it was short of what waits on it.
fn terminal_failure_message(waiting: &WaitingSummary) -> String {
    let failed = &waiting.failed_terminally;
    let mut names: Vec<String> = failed
        .keys()
        .take(NAMED_FAILURES)
        .map(ToString::to_string)
        .collect();
    if failed.len() > NAMED_FAILURES {
        names.push(format!("{} more", failed.len() - NAMED_FAILURES));
    }
    if names.is_empty() {
        return format!("an item failed terminally; {}", retry_by("its"));
    }
    format!(
        "{} failed terminally, and what depends on {} waits; {}",
        names.join(", "),
        if failed.len() == 1 { "it" } else { "them" },
        retry_by(if failed.len() == 1 { "its" } else { "their" }),
    )
}

/// The not-Ready reason of a quiescent tenant: what its waits come down
/// to. Items deeper in a chain wait on their dependencies
/// (`WaitingForDependencies`) because something under them waits for
/// another reason, so the most common reason other than a dependency is
/// named when there is one (three items waiting on a router that has no
/// configurator are `WaitingForConfigurator`, not `WaitingForDependencies`
/// two to one). A dependency is the reason only when every waiting item
/// waits on one (a predicate not yet satisfied, an external item not
/// reported). The message counts both.
fn waiting_summary(waiting: &WaitingSummary) -> (String, String) {
    let counted = |reason: &WaitReason| waiting.by_reason.get(reason).copied().unwrap_or(0);
    let on_dependencies = counted(&WaitReason::Dependency);
    let root = waiting
        .by_reason
        .iter()
        .filter(|(reason, count)| **reason != WaitReason::Dependency && **count > 0)
        .map(|(reason, count)| (*reason, *count))
        .max_by_key(|(_, count)| *count);
    let (reason, count) = match root {
        Some(root) => root,
        None if on_dependencies > 0 => (WaitReason::Dependency, on_dependencies),
        None => return ("Converged".into(), String::new()),
    };
    let code = match reason {
        WaitReason::Dependency => "WaitingForDependencies",
        WaitReason::NoConfigurator => "WaitingForConfigurator",
        WaitReason::Backoff => "WaitingForRetry",
        WaitReason::Blocked => "Blocked",
        WaitReason::TerminalFailure => "TerminalFailure",
        WaitReason::UnknownOutcome => "UnknownOutcome",
    };
    let mut message = format!(
        "{} item(s) waiting, {count} with reason {code}",
        waiting.total
    );
    if reason != WaitReason::Dependency && on_dependencies > 0 {
        message.push_str(&format!(", {on_dependencies} on their dependencies"));
    }
    (code.into(), message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::plan::{BlockedBy, WaitingItem};
    use crate::engine::waiting::WaitingSet;
    use crate::graph::{ItemRef, OperationKind};

    fn waiting(reason: WaitReason) -> WaitingSummary {
        let item = ItemRef::new("t", "a");
        let mut set = WaitingSet::default();
        set.insert(WaitingItem {
            item: item.clone(),
            operation: OperationKind::Create,
            reason,
            blocked_by: vec![BlockedBy {
                item,
                why: "x".into(),
            }],
        });
        set.summary().clone()
    }

    fn progress(waiting: &WaitingSummary, in_flight: usize) -> Progress<'_> {
        Progress {
            generation: 4,
            in_flight,
            ready_operations: 0,
            waiting,
            no_configurator_since_ms: None,
            without_configurator: waiting.without_configurator.keys().cloned().collect(),
            configurator_grace_ms: 300_000,
            now_ms: 1_000,
        }
    }

    fn status(conditions: &[Condition], kind: ConditionKind) -> bool {
        conditions.iter().any(|c| c.kind == kind && c.status)
    }

    #[test]
    fn a_converged_quiescent_tenant_is_ready_at_its_generation() {
        let none = WaitingSummary::default();
        let (conditions, observed) = compute_conditions(&[], 0, &progress(&none, 0));
        assert!(status(&conditions, ConditionKind::Ready));
        assert!(!status(&conditions, ConditionKind::Reconciling));
        assert_eq!(observed, 4);
    }

    #[test]
    fn reconciling_and_stalled_never_hold_together() {
        let terminal = waiting(WaitReason::TerminalFailure);
        let (busy, observed) = compute_conditions(&[], 2, &progress(&terminal, 1));
        assert!(status(&busy, ConditionKind::Reconciling));
        assert!(!status(&busy, ConditionKind::Stalled));
        assert_eq!(observed, 2);
        let (idle, _) = compute_conditions(&busy, 2, &progress(&terminal, 0));
        assert!(status(&idle, ConditionKind::Stalled));
        assert!(!status(&idle, ConditionKind::Reconciling));
    }

    #[test]
    fn waiting_for_a_configurator_stalls_only_after_the_grace_period() {
        let no_configurator = waiting(WaitReason::NoConfigurator);
        let mut p = progress(&no_configurator, 0);
        p.no_configurator_since_ms = Some(900);
        let (early, _) = compute_conditions(&[], 0, &p);
        assert!(!status(&early, ConditionKind::Stalled));
        let ready = early
            .iter()
            .find(|c| c.kind == ConditionKind::Ready)
            .expect("ready condition");
        assert_eq!(ready.reason, "WaitingForConfigurator");
        p.now_ms = 900 + 300_000;
        let (late, _) = compute_conditions(&early, 0, &p);
        assert!(status(&late, ConditionKind::Stalled));
    }

    /// The reason and message of a quiet tenant's Ready condition with
    /// `total` items waiting for `by_reason`.
    fn ready_of(total: usize, by_reason: &[(WaitReason, usize)]) -> (String, String) {
        let summary = WaitingSummary {
            total,
            by_reason: by_reason.iter().copied().collect(),
            ..WaitingSummary::default()
        };
        let (conditions, _) = compute_conditions(&[], 0, &progress(&summary, 0));
        let ready = conditions
            .into_iter()
            .find(|c| c.kind == ConditionKind::Ready)
            .expect("ready condition");
        (ready.reason, ready.message)
    }

    #[test]
    fn a_quiet_tenant_is_not_ready_for_what_its_waits_come_down_to() {
        assert_eq!(
            ready_of(
                3,
                &[(WaitReason::Dependency, 2), (WaitReason::NoConfigurator, 1)]
            ),
            (
                "WaitingForConfigurator".to_owned(),
                "3 item(s) waiting, 1 with reason WaitingForConfigurator, 2 on their dependencies"
                    .to_owned()
            ),
            "two items waiting on one without a configurator wait for a configurator"
        );
        // A reason counted down to zero stays in the map.
        assert_eq!(
            ready_of(
                2,
                &[(WaitReason::Dependency, 2), (WaitReason::NoConfigurator, 0)]
            ),
            (
                "WaitingForDependencies".to_owned(),
                "2 item(s) waiting, 2 with reason WaitingForDependencies".to_owned()
            )
        );
    }

    #[test]
    fn transition_times_move_only_when_the_status_changes() {
        let none = WaitingSummary::default();
        let (first, _) = compute_conditions(&[], 0, &progress(&none, 0));
        let mut later = progress(&none, 0);
        later.now_ms = 5_000;
        let (second, _) = compute_conditions(&first, 4, &later);
        assert_eq!(first, second);
    }
}
