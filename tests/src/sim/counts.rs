//! Operation counts, compared with a fault-free run of the same seed.
//!
//! A delete/create loop, or any churn the server causes by itself, does
//! not always break a safety invariant: every single operation may be
//! allowed. It shows up as inflated counts. So a passing run is replayed
//! without its faults (the same submits, external reports and time
//! steps; every answer DONE; no crash, disconnect, late or duplicated
//! message, and no agent down for good), and each item's operations are
//! compared: what the faults add must stay within what they can explain.
//!
//! Operations are counted by op id, so a retry, a WAIT re-ask or a
//! resumed operation is the same operation; a NEEDS_RECREATE question is
//! not counted (the Delete and Create it may lead to are).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use reconciled::engine::exec::port::OperationOrder;
use reconciled::graph::ItemRef;
use reconciled::graph::OperationKind;

use super::invariants::Violation;
use super::steps::{Answer, Step};

/// Operations an item can take beyond the fault-free run's with no fault
/// to explain them (timing alone changes plans: a submit that meets an
/// operation in flight supersedes it). Measured over seeds 3000–3399: at
/// most 2.
pub const SLACK: u32 = 4;
/// Operations one disturbance may explain (a lost or failed outcome can
/// cost a recreate: a Delete and a Create, and a Modify after). Measured
/// over seeds 3000–3399: an item's excess never passed 2 per disturbance
/// plus 2.
pub const PER_DISTURBANCE: u32 = 3;

/// One item's operations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ItemOps {
    /// Creates.
    pub creates: u32,
    /// Modifies (questions excluded).
    pub modifies: u32,
    /// Deletes.
    pub deletes: u32,
}

impl ItemOps {
    /// All three.
    pub fn total(&self) -> u32 {
        self.creates + self.modifies + self.deletes
    }
}

impl fmt::Display for ItemOps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} create(s), {} modify(ies), {} delete(s)",
            self.creates, self.modifies, self.deletes
        )
    }
}

/// The operations of a run, per item, and what disturbed each item.
#[derive(Clone, Debug, Default)]
pub struct OpCounts {
    seen: BTreeSet<String>,
    /// Operations per item.
    pub items: BTreeMap<ItemRef, ItemOps>,
    /// Faults that touched each item: answers other than a plain DONE to
    /// its operations, operations that timed out, and crashes, store deaths
    /// and ended or taken-over sessions while it had an operation in
    /// flight.
    pub disturbed: BTreeMap<ItemRef, u32>,
    /// Each operation's item and the time its latest attempt is due.
    deadlines: BTreeMap<String, (ItemRef, u64)>,
}

impl OpCounts {
    /// An agent received `order` at `now_ms`.
    pub fn on_order(&mut self, order: &OperationOrder, now_ms: u64) {
        let item = order.item.item_ref();
        self.deadlines.insert(
            order.op_id.clone(),
            (item.clone(), now_ms.saturating_add(order.timeout_ms)),
        );
        if !self.seen.insert(order.op_id.clone()) {
            return;
        }
        if order.question {
            return;
        }
        let ops = self.items.entry(item).or_default();
        match order.kind {
            OperationKind::Create => ops.creates += 1,
            OperationKind::Modify => ops.modifies += 1,
            OperationKind::Delete => ops.deletes += 1,
            OperationKind::Read => {}
        }
    }

    /// An agent answered an operation on `item` with `answer`.
    pub fn on_answer(&mut self, item: ItemRef, answer: Answer) {
        let plain = matches!(
            answer,
            Answer::Done {
                needs_recreate: false,
                ..
            } | Answer::InProgress
        );
        if !plain {
            *self.disturbed.entry(item).or_default() += 1;
        }
    }

    /// The server cancelled `op_id` at `now_ms`: past its deadline, the
    /// operation timed out (its agent did not answer in time), a fault the
    /// fault-free run need not meet; before it, it was superseded.
    pub fn on_cancel(&mut self, op_id: &str, now_ms: u64) {
        if let Some((item, due_ms)) = self.deadlines.get(op_id)
            && now_ms >= *due_ms
        {
            *self.disturbed.entry(item.clone()).or_default() += 1;
        }
    }

    /// A fault met `items` with operations in flight.
    pub fn on_fault<'a>(&mut self, items: impl IntoIterator<Item = &'a ItemRef>) {
        for item in items {
            *self.disturbed.entry(item.clone()).or_default() += 1;
        }
    }
}

/// Whether the fault-free run keeps `step` (as it is, or as a DONE).
fn keeps_in_fault_free_run(step: &Step) -> bool {
    matches!(
        step,
        Step::Submit(_) | Step::Report(_) | Step::Answer { .. } | Step::Advance { .. }
    )
}

/// The steps of the fault-free run of `steps`: the same submits, external
/// reports and time steps, every answer a plain DONE, and nothing else.
pub fn fault_free(steps: &[Step]) -> Vec<Step> {
    steps
        .iter()
        .filter(|step| keeps_in_fault_free_run(step))
        .map(|step| match step {
            Step::Answer { pick, .. } => Step::Answer {
                pick: *pick,
                answer: Answer::Done {
                    needs_recreate: false,
                    observed: true,
                },
            },
            other => other.clone(),
        })
        .collect()
}

/// The most operations `item` may take in a run with faults: what the
/// fault-free run took, plus what the faults that touched it explain.
pub fn allowed(fault_free: ItemOps, disturbances: u32) -> u32 {
    fault_free.total() + PER_DISTURBANCE * disturbances + SLACK
}

/// Checks a run's counts against its fault-free run's.
pub fn compare(run: &OpCounts, fault_free_run: &OpCounts) -> Result<(), Violation> {
    for (item, ops) in &run.items {
        let baseline = fault_free_run.items.get(item).copied().unwrap_or_default();
        let disturbances = run.disturbed.get(item).copied().unwrap_or(0);
        let limit = allowed(baseline, disturbances);
        if ops.total() > limit {
            return Err(Violation::new(
                "operation counts stay near the fault-free run's",
                format!(
                    "{item} took {ops}, the fault-free run of the same steps {baseline}; \
                     {disturbances} fault(s) touched it, which explain at most {limit} \
                     (a delete/create loop?)"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(name: &str) -> ItemRef {
        ItemRef::new("t0", name)
    }

    fn counts(entries: &[(&str, ItemOps, u32)]) -> OpCounts {
        let mut counts = OpCounts::default();
        for (name, ops, disturbed) in entries {
            counts.items.insert(item(name), *ops);
            if *disturbed > 0 {
                counts.disturbed.insert(item(name), *disturbed);
            }
        }
        counts
    }

    fn ops(creates: u32, modifies: u32, deletes: u32) -> ItemOps {
        ItemOps {
            creates,
            modifies,
            deletes,
        }
    }

    #[test]
    fn a_delete_create_loop_without_faults_is_caught() {
        let baseline = counts(&[("a", ops(1, 1, 0), 0)]);
        let looping = counts(&[("a", ops(5, 1, 4), 0)]);
        let violation = compare(&looping, &baseline).expect_err("a loop is caught");
        assert_eq!(
            violation.invariant,
            "operation counts stay near the fault-free run's"
        );
        assert!(violation.detail.contains("t0/a took 5 create(s)"));
    }

    #[test]
    fn faults_explain_extra_operations_up_to_their_share() {
        let baseline = counts(&[("a", ops(1, 0, 0), 0)]);
        let recreated_twice = counts(&[("a", ops(3, 0, 2), 2)]);
        assert!(compare(&recreated_twice, &baseline).is_ok());
        let limit = allowed(ops(1, 0, 0), 2);
        let beyond = counts(&[("a", ops(limit, 1, 0), 2)]);
        assert!(compare(&beyond, &baseline).is_err());
    }

    #[test]
    fn an_item_the_fault_free_run_never_touched_gets_the_slack_only() {
        let baseline = OpCounts::default();
        assert!(compare(&counts(&[("a", ops(2, 0, 2), 0)]), &baseline).is_ok());
        assert!(compare(&counts(&[("a", ops(3, 0, 2), 0)]), &baseline).is_err());
    }

    #[test]
    fn the_fault_free_run_keeps_inputs_and_answers_done() {
        let steps = vec![
            Step::Advance { ms: 5 },
            Step::Crash {
                owner_seed: 1,
                luck: 2,
            },
            Step::Answer {
                pick: 3,
                answer: Answer::Failed { terminal: true },
            },
            Step::Disconnect { agent: 0, luck: 1 },
            Step::ClockStep { ms: -100 },
        ];
        let calm = fault_free(&steps);
        assert_eq!(calm.len(), 2);
        assert!(matches!(calm[0], Step::Advance { ms: 5 }));
        assert!(matches!(
            calm[1],
            Step::Answer {
                pick: 3,
                answer: Answer::Done {
                    needs_recreate: false,
                    ..
                }
            }
        ));
    }

    #[test]
    fn faulty_answers_and_faults_disturb_their_items() {
        let mut counts = OpCounts::default();
        counts.on_answer(item("a"), Answer::Wait { ms: 10 });
        counts.on_answer(item("a"), Answer::InProgress);
        counts.on_answer(
            item("a"),
            Answer::Done {
                needs_recreate: false,
                observed: false,
            },
        );
        assert_eq!(counts.disturbed.get(&item("a")), Some(&1));
        counts.on_fault([&item("b")]);
        assert_eq!(counts.disturbed.get(&item("b")), Some(&1));
    }
}
