//! The invariants a run checks, written from DESIGN (sections 2-6), not
//! from the code:
//!
//! - **Dependencies** (§3 rules 1-9), checked when an agent receives an
//!   operation, against the world the agents know: a Create or Modify
//!   only when every dependency of the value it applies exists, its
//!   predicate holds on that dependency's value, and no Modify or Delete
//!   of that dependency is running; a Modify only when every dependent's
//!   predicate holds on the new value and no operation of a dependent
//!   runs (rules 6, 8); a Delete only when nothing existing depends on the
//!   item and no running Create/Modify needs it (rules 2, 7, 8). External
//!   items are never operated on, and an item auto-deleted by one that
//!   vanished gets no Delete (rule 9). A Create/Modify applies the
//!   intended value of the generation it names (§4).
//! - **Operations** (§4): an op id names one operation on one item toward
//!   one target generation; its attempt grows by one, and only after a
//!   FAILED outcome or a timeout (or a poison redelivery); a retry or a
//!   re-ask after WAIT keeps the op id; orders carry the epoch granted to
//!   the session; after a restart, a journaled operation resumes with its
//!   op id and attempt (§6); no attempt goes past the type's
//!   `max_attempts`, and an operation is given up only for a terminal
//!   code or after them; a retry waits at least what its policy says and
//!   is scheduled no later than the policy's longest wait (or the WAIT's
//!   `retry_after`); a Modify carries the applied value and changes
//!   something; an order carries its type's timeout.
//! - **Status** (§2, §5), on every published snapshot: counts by state
//!   equal a recount of the graphs; Ready holds exactly when every intended
//!   item is created at its intended value, nothing is left to delete,
//!   every existing item's dependencies hold, and nothing but a drift READ
//!   is in flight; Reconciling never holds with Stalled or Ready, and holds
//!   while the tenant is not quiescent; a tenant not Reconciling has
//!   nothing to dispatch by a plan made afresh; Stalled needs an item
//!   failed for good or waiting for a configurator; an intended item's
//!   generation is the one that last changed its content. (What a Watch
//!   sees is checked in [`super::watcher`].)
//! - **Durability** (§6): after a crash, the acknowledged intent and
//!   generation are there, and every current item, the observed
//!   generation and the conditions are as the last snapshot showed them
//!   (but for operations in flight, now lost, and retry times brought
//!   nearer).
//! - **Liveness** (§5): once faults stop and agents answer, the tenant goes
//!   quiet converged (see [`check_converged`]), and a from-scratch plan
//!   finds nothing the incremental passes missed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use reconciled::engine::conditions::ConditionKind;
use reconciled::engine::exec::port::{AgentOutcome, ExternalChange, OperationOrder};
use reconciled::engine::exec::{RetryPolicy, TypeSpec};
use reconciled::engine::plan::{
    Plan, PlanEnvironment, TypeRules, WaitReason, plan_everything, runs_first,
};
use reconciled::engine::transition::ABSENT_DEPENDENCY_MARK;
use reconciled::graph::{
    CurrentGraph, CurrentItem, IntendedGraph, Item, ItemRef, ItemState, OperationKind, Predicate,
    Properties,
};
use reconciled::tenant::TenantSnapshot;
use reconciled::tenant::state::state_name;

use super::intents::{IntentModel, Scenario};
use super::world::{Agents, World};

/// Redeliveries that do not count as attempts (DESIGN §4, poison operations).
const MAX_REDELIVERIES: u32 = 5;

/// The longest `retry_after` a simulated agent sends with a WAIT.
pub const MAX_WAIT_RETRY_AFTER_MS: u64 = 5_000;

/// A broken invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Its name, stable across runs (shrinking keeps a failure only while
    /// the same invariant breaks).
    pub invariant: &'static str,
    /// What was seen.
    pub detail: String,
}

impl Violation {
    /// A violation of `invariant`.
    pub fn new(invariant: &'static str, detail: impl Into<String>) -> Self {
        Self {
            invariant,
            detail: detail.into(),
        }
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{}] {}", self.invariant, self.detail)
    }
}

fn fail<T>(invariant: &'static str, detail: impl Into<String>) -> Result<T, Violation> {
    Err(Violation::new(invariant, detail))
}

/// Whether `predicate` holds on `properties` (an evaluation error is false).
fn holds(predicate: &str, properties: &Properties) -> bool {
    predicate.is_empty()
        || Predicate::compile(predicate)
            .and_then(|compiled| compiled.evaluate(properties))
            .unwrap_or(false)
}

fn properties_text(properties: &Properties) -> String {
    properties.to_value().to_string()
}

/// Checks an operation an agent just received against the world: the
/// dependency rules of DESIGN §3 and the content rule of §4.
pub fn check_order(
    order: &OperationOrder,
    world: &World,
    agents: &Agents,
    model: &IntentModel,
    unknown: &BTreeSet<ItemRef>,
    now_ms: u64,
    batch_ms: u64,
) -> Result<(), Violation> {
    let item = order.item.item_ref();
    // UNKNOWN items (whose lost operation no agent holds again yet) block
    // operations on their dependents (DESIGN §4).
    // A READ changes nothing, so nothing it could act on is at stake.
    let held_again = |key: &ItemRef| agents.pending().any(|p| p.order.item.item_ref() == *key);
    let observes = order.kind == OperationKind::Read && !order.question;
    for blocker in unknown.iter().filter(|_| !observes) {
        if *blocker == item || held_again(blocker) {
            continue;
        }
        let depends = order.item.dependency_on(blocker).is_some()
            || world
                .items
                .get(&item)
                .is_some_and(|w| w.value.dependency_on(blocker).is_some());
        if depends {
            return fail(
                if order.kind == OperationKind::Delete {
                    "an item whose outcome is unknown blocks the deletes of its dependents"
                } else {
                    "an item whose outcome is unknown blocks its dependents"
                },
                format!(
                    "{} {item} (op {}) was sent while its dependency {blocker} is UNKNOWN",
                    order.kind.as_str(),
                    order.op_id
                ),
            );
        }
    }
    if order.item.external || world.items.get(&item).is_some_and(|w| w.value.external) {
        return fail(
            "external items are never operated on",
            format!("{} {item} was sent to an agent", order.kind.as_str()),
        );
    }
    if order.question || order.kind == OperationKind::Read {
        return Ok(());
    }
    // Operations the agents may still apply (running, or cancelled while
    // running: their result is authoritative).
    let running: Vec<&OperationOrder> = agents
        .pending()
        .filter(|p| p.effectful() && p.may_apply(now_ms))
        .map(|p| &p.order)
        .filter(|other| other.op_id != order.op_id)
        .collect();
    // Those delivered before this batch: within one batch, which of two
    // operations started first is not known.
    let running_before: Vec<&OperationOrder> = agents
        .pending()
        .filter(|p| p.effectful() && p.may_apply(now_ms) && p.sent_since_ms < batch_ms)
        .map(|p| &p.order)
        .filter(|other| other.op_id != order.op_id)
        .collect();
    match order.kind {
        OperationKind::Create | OperationKind::Modify => {
            let value = &order.item;
            if let Some(intended) = model.value_at(order.generation, &item)
                && !intended.same_content(value)
            {
                return fail(
                    "operations apply the intended value of their generation",
                    format!(
                        "{} {item} toward generation {} applies {} but that generation intended {}",
                        order.kind.as_str(),
                        order.generation,
                        super::intents::describe_item(value),
                        super::intents::describe_item(intended)
                    ),
                );
            }
            for dependency in &value.dependencies {
                let required = &dependency.requires;
                let Some(existing) = world.items.get(required) else {
                    return fail(
                        "a create or modify runs only when its dependencies exist",
                        format!(
                            "{} {item} (op {}) was sent while its dependency {required} does not exist",
                            order.kind.as_str(),
                            order.op_id
                        ),
                    );
                };
                if !holds(dependency.must_satisfy(), &existing.value.properties) {
                    return fail(
                        "a create or modify runs only when its predicates hold",
                        format!(
                            "{} {item} (op {}) was sent while `{}` is false on {required} = {}",
                            order.kind.as_str(),
                            order.op_id,
                            dependency.must_satisfy(),
                            properties_text(&existing.value.properties)
                        ),
                    );
                }
                if let Some(other) = running.iter().find(|other| {
                    other.item.item_ref() == *required
                        && matches!(other.kind, OperationKind::Modify | OperationKind::Delete)
                }) {
                    return fail(
                        "a create or modify waits for a modify or delete of its dependency",
                        format!(
                            "{} {item} (op {}) was sent while a {} of its dependency {required} runs (op {})",
                            order.kind.as_str(),
                            order.op_id,
                            other.kind.as_str(),
                            other.op_id
                        ),
                    );
                }
            }
            if order.kind == OperationKind::Modify {
                for dependent in world.dependents_of(&item) {
                    let Some(dependency) = dependent.value.dependency_on(&item) else {
                        continue;
                    };
                    if !holds(dependency.must_satisfy(), &value.properties) {
                        return fail(
                            "a modify that breaks a dependent's predicate deletes the dependent first",
                            format!(
                                "modify {item} (op {}) to {} was sent while {} exists and requires `{}`",
                                order.op_id,
                                properties_text(&value.properties),
                                dependent.value.item_ref(),
                                dependency.must_satisfy()
                            ),
                        );
                    }
                }
                // (The value a running operation applies, or deletes, is
                // what relies on this item; a dependent being retargeted
                // away from it does not.)
                // (A Delete of an item that is already gone, e.g. with an
                // external item it was auto-deleted by, holds nothing up.)
                if let Some(other) = running_before.iter().find(|other| {
                    let other_item = other.item.item_ref();
                    other_item != item
                        && other.item.dependency_on(&item).is_some()
                        && (other.kind != OperationKind::Delete
                            || world.items.contains_key(&other_item))
                }) {
                    return fail(
                        "a modify waits for operations of its dependents",
                        format!(
                            "modify {item} (op {}) was sent while {} {} (op {}) runs",
                            order.op_id,
                            other.kind.as_str(),
                            other.item.item_ref(),
                            other.op_id
                        ),
                    );
                }
            }
        }
        OperationKind::Delete => {
            if let Some(dependent) = world.dependents_of(&item).next() {
                return fail(
                    "a delete runs only when nothing depends on the item",
                    format!(
                        "delete {item} (op {}) was sent while {} exists and depends on it",
                        order.op_id,
                        super::intents::describe_item(&dependent.value)
                    ),
                );
            }
            if let Some(other) = running.iter().find(|other| {
                other.kind != OperationKind::Delete
                    && other.item.item_ref() != item
                    && other.item.dependency_on(&item).is_some()
            }) {
                return fail(
                    "a delete waits for running operations that need the item",
                    format!(
                        "delete {item} (op {}) was sent while {} {} (op {}) needs it",
                        order.op_id,
                        other.kind.as_str(),
                        other.item.item_ref(),
                        other.op_id
                    ),
                );
            }
        }
        OperationKind::Read => {}
    }
    Ok(())
}

/// Rule 8: a Create waits for the Deletes of its type (two items
/// contending for one resource never race). Checked on the Creates the
/// server decides to run, not on those it resumes (see
/// [`Ledger::resumes`]): a lost Create resumes as it was sent.
pub fn check_create_waits_for_deletes_of_its_type(
    order: &OperationOrder,
    agents: &Agents,
    now_ms: u64,
) -> Result<(), Violation> {
    if order.kind != OperationKind::Create || order.question {
        return Ok(());
    }
    let item = order.item.item_ref();
    let running_delete = agents
        .pending()
        .filter(|p| p.effectful() && p.may_apply(now_ms))
        .map(|p| &p.order)
        .find(|other| {
            other.kind == OperationKind::Delete
                && other.item.item_type() == order.item.item_type()
                && other.item.item_ref() != item
        });
    match running_delete {
        Some(other) => fail(
            "a create waits for the deletes of its type",
            format!(
                "create {item} (op {}) was sent while delete {} (op {}) runs",
                order.op_id,
                other.item.item_ref(),
                other.op_id
            ),
        ),
        None => Ok(()),
    }
}

/// Rules 1, 2 and 8, as the agents see them: a dependency is satisfied
/// only when it "is not planned for deletion, has no Modify planned, in
/// flight or failed" (DESIGN 2), and "a failed or still-running Delete of a
/// dependent blocks the operation on the item it depends on" (DESIGN 3).
/// So, for an operation the server decides to send (not one it resumes):
///
/// - a Create or Modify of a value relying on an existing item that left
///   the intent (a Delete is planned for it), or whose value in the world
///   is not its intended one (a Modify is planned, or failed), waits;
/// - a Modify waits while an existing item that left the intent still
///   relies on it (its Delete is planned, running or failed).
///
/// External items are only reported, never planned, so they are left
/// out. "Intended" is any intent the server may hold (the acknowledged one,
/// or one whose answer was lost), or held when it sent the operation (the
/// one before a submit of the same step).
pub fn check_dependencies_settled(
    order: &OperationOrder,
    world: &World,
    model: &IntentModel,
) -> Result<(), Violation> {
    if order.question || !matches!(order.kind, OperationKind::Create | OperationKind::Modify) {
        return Ok(());
    }
    let item = order.item.item_ref();
    let intents = || {
        std::iter::once(&model.items)
            .chain(model.uncertain.iter().map(|(_, items)| items))
            .chain(
                model
                    .before_this_step
                    .iter()
                    .filter(|(generation, _)| order.generation <= *generation)
                    .map(|(_, items)| items),
            )
    };
    for dependency in &order.item.dependencies {
        let required = &dependency.requires;
        let Some(existing) = world.items.get(required) else {
            continue;
        };
        if existing.value.external {
            continue;
        }
        let intended: Vec<&Item> = intents().filter_map(|items| items.get(required)).collect();
        if intended.iter().any(|value| value.external) {
            continue;
        }
        if intended.is_empty() {
            return fail(
                "a create or modify waits for the delete of a dependency that left the intent",
                format!(
                    "{} {item} (op {}) was sent while its dependency {} exists and is not intended",
                    order.kind.as_str(),
                    order.op_id,
                    super::intents::describe_item(&existing.value)
                ),
            );
        }
        if !intended
            .iter()
            .any(|value| value.same_content(&existing.value))
        {
            return fail(
                "a create or modify waits for a planned or failed modify of its dependency",
                format!(
                    "{} {item} (op {}) was sent while its dependency {required} holds {} but is intended as {}",
                    order.kind.as_str(),
                    order.op_id,
                    super::intents::describe_item(&existing.value),
                    super::intents::describe_item(intended[0])
                ),
            );
        }
    }
    if order.kind == OperationKind::Modify {
        let leaving = world.dependents_of(&item).find(|dependent| {
            let key = dependent.value.item_ref();
            !dependent.value.external && !intents().any(|items| items.contains_key(&key))
        });
        if let Some(dependent) = leaving {
            return fail(
                "a modify waits for the deletes of its dependents",
                format!(
                    "modify {item} (op {}) was sent while {}, which left the intent, still relies on it",
                    order.op_id,
                    super::intents::describe_item(&dependent.value)
                ),
            );
        }
    }
    Ok(())
}

/// Rule 4: a change to a property under one of the type's
/// `recreate_on_change` paths (`*`: any change) recreates the item; it is
/// never sent as a Modify.
pub fn check_modify_spares_recreate_paths(
    order: &OperationOrder,
    scenario: &Scenario,
) -> Result<(), Violation> {
    if order.kind != OperationKind::Modify || order.question {
        return Ok(());
    }
    let Some(previous) = &order.previous else {
        return Ok(());
    };
    let Some(spec) = scenario.spec(order.item.item_type()) else {
        return Ok(());
    };
    let (before, after) = (
        previous.properties.to_value(),
        order.item.properties.to_value(),
    );
    let hit = spec
        .recreate_on_change
        .iter()
        .find(|path| *path == "*" || before.pointer(path) != after.pointer(path));
    match hit {
        Some(path) => fail(
            "a change under a recreate path recreates the item",
            format!(
                "modify {} (op {}) from {} to {} changes `{path}`, which the type recreates on",
                order.item.item_ref(),
                order.op_id,
                properties_text(&previous.properties),
                properties_text(&order.item.properties)
            ),
        ),
        None => Ok(()),
    }
}

/// DESIGN 4: operations in flight stay within their type's
/// `max_in_flight` and the tenant's `max_operations_in_flight`. Checked on
/// the operations the server decides to send (not those it resumes),
/// against those the agents hold and the server still counts: delivered
/// on a session that is still live, not answered, within their timeout and
/// never cancelled (a cancelled one may have left the server's count, and
/// stays out of it when sent again).
pub fn check_room(
    order: &OperationOrder,
    agents: &Agents,
    ledger: &Ledger,
    scenario: &Scenario,
    now_ms: u64,
) -> Result<(), Violation> {
    let item_type = order.item.item_type();
    let running: Vec<&OperationOrder> = agents
        .agents
        .iter()
        .flat_map(|agent| {
            let live = agent.live.as_ref().map(|session| session.id);
            agent
                .pending
                .iter()
                .filter(move |p| live == Some(p.session))
        })
        .filter(|p| {
            p.may_apply(now_ms)
                && !p.cancelled
                && !p.cancel_mode
                && !ledger.cancel_sent(&p.order.op_id)
        })
        .map(|p| &p.order)
        .filter(|other| other.op_id != order.op_id)
        .collect();
    let of_type = running
        .iter()
        .filter(|other| other.item.item_type() == item_type)
        .count();
    let per_type = scenario
        .spec(item_type)
        .map_or(u32::MAX, |spec| spec.max_in_flight.max(1));
    let per_tenant = scenario.max_operations_in_flight;
    let describe = |ops: &mut dyn Iterator<Item = &&OperationOrder>| -> String {
        ops.map(|other| {
            format!(
                "{} {} (op {})",
                other.kind.as_str(),
                other.item.item_ref(),
                other.op_id
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
    };
    let (held, limit, whose, ops) = if of_type >= per_type as usize {
        (
            of_type,
            per_type as u64,
            format!("its type's max_in_flight {per_type}"),
            describe(
                &mut running
                    .iter()
                    .filter(|other| other.item.item_type() == item_type),
            ),
        )
    } else if per_tenant > 0 && running.len() as u64 >= per_tenant {
        (
            running.len(),
            per_tenant,
            format!("the tenant's max_operations_in_flight {per_tenant}"),
            describe(&mut running.iter()),
        )
    } else {
        return Ok(());
    };
    fail(
        "operations in flight stay within their limits",
        format!(
            "{} {} (op {}) was sent while {held} operations run, at {whose} (limit {limit}): {ops}",
            order.kind.as_str(),
            order.item.item_ref(),
            order.op_id,
        ),
    )
}

/// What the agents know of one op id.
#[derive(Clone, Debug)]
struct OpRecord {
    item: ItemRef,
    /// The value the order carried (the target of a Create or Modify).
    value: Arc<Item>,
    kind: OperationKind,
    generation: u64,
    question: bool,
    attempt: u32,
    deliveries: u32,
    failed: bool,
    delivered_at_ms: u64,
    timeout_ms: u64,
    /// After a retryable failure of this attempt the server accepted: the
    /// wall-clock time it did, the least wait before the next attempt,
    /// and how many times the wall clock had stepped back then.
    retry_wait: Option<(u64, u64, u32)>,
    /// After a WAIT of this attempt the server accepted: the wall-clock
    /// time before which it is not asked again, and how many times the
    /// wall clock had stepped back then.
    wait_until: Option<(u64, u32)>,
}

/// How the last operation of an item ended, as far as the agents said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    Open,
    Retryable,
    Waiting,
    Finished,
}

/// An operation whose outcome the server lost (journaled at a restart,
/// or dropped by an agent whose session ended), not resolved yet.
#[derive(Clone, Debug)]
pub struct LostOperation {
    /// Its op id.
    pub op_id: String,
    /// Its attempt.
    pub attempt: u32,
    /// What it does.
    pub kind: OperationKind,
    /// What it applies (a Create or Modify), if known.
    pub target: Option<Arc<Item>>,
    /// Since the loss, the target's dependencies broke in the world or
    /// left the intent, the target stopped being the intent, or (for a
    /// Delete) the item vanished
    /// with an external item it was auto-deleted by or, for the Delete of a
    /// recreate, the value it was to make way for is not intended any
    /// more: the server may then send the operation the intent needs
    /// instead (DESIGN §4, UNKNOWN).
    pub may_be_replaced: bool,
    /// For one journaled at a restart: the re-deliveries the server had
    /// counted (some may not have gone out: it commits before it sends).
    pub redeliveries: u32,
}

/// The op ids, attempts and epochs the agents have seen: checks DESIGN §4
/// and the journal rule of §6.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    ops: BTreeMap<String, OpRecord>,
    last_by_item: BTreeMap<ItemRef, (String, Ending)>,
    /// Lost operations by item.
    lost: BTreeMap<ItemRef, LostOperation>,
    /// Op ids that were running when their item vanished with an external
    /// item: lost later, they may be replaced too.
    vanished_ops: BTreeSet<String>,
    /// Items that vanished with an external item they were auto-deleted by,
    /// once the server acknowledged the report: DESIGN §3 rule 9 drops
    /// them from current state without a Delete. Until created again.
    items_gone_with_external: BTreeMap<ItemRef, ItemRef>,
    /// Items the last snapshot showed the server unsure of (a lost
    /// operation may have applied another value): it may delete one to be
    /// sure (DESIGN 4), so rule 9 does not speak for them.
    uncertain: BTreeSet<ItemRef>,
    /// The newest epoch granted per type.
    epochs: BTreeMap<String, u64>,
    /// Items the last snapshot showed waiting for a retry (a next attempt
    /// time and nothing in flight): their next operation, if it is the same
    /// one, continues the failed or WAITed op id.
    retry_pending: BTreeSet<ItemRef>,
    /// The retry time of each item the last snapshot showed one for.
    retry_times: BTreeMap<ItemRef, u64>,
    /// The latest the wall clock has shown: the server's clock was never
    /// ahead of it, though the clock may have stepped back since.
    wall_high_ms: u64,
    /// READs sent to resolve a lost operation, or a lost attempt of it,
    /// that no agent has received yet (journaled, and the store died or
    /// its session ended before it went out): they count as deliveries of
    /// that attempt once it is delivered.
    reads_before_delivery: BTreeMap<String, u32>,
    /// The last READ sent to resolve each lost operation, by the lost
    /// operation's op id: only its answer resolves that operation. An
    /// earlier READ's late answer (the server sent another READ after it
    /// timed out) does not, nor does a READ's answer sent again after a
    /// crash, for an operation lost since.
    resolving_read: HashMap<String, String>,
    /// Operations a cancel was sent for (each was justified then, or the
    /// run failed): sent again, after a reconnect say, it needs no new
    /// reason. An agent may hold one, re-sent to it, that the server no
    /// longer counts as running (its item UNKNOWN once the cancel went
    /// unanswered).
    cancels_sent: BTreeSet<String>,
    /// Operations whose item may have gone with an external item as the
    /// server knows it (a value delivered for it earlier, which the server
    /// may hold as applied, was auto-deleted by a vanished item): a cancel
    /// of one needs no other reason.
    dropped_with_external: BTreeSet<String>,
    /// The values of Creates and Modifies journaled when the server
    /// stopped, by item, delivered or not: the restarted server may hold
    /// each as applied (its outcome unknown) though no agent received it.
    journaled_values: BTreeMap<ItemRef, Vec<Arc<Item>>>,
    /// Items whose running operation a cancel superseded (its intent
    /// changed; not timed out), with that op id and the session an agent
    /// runs it on: DESIGN 4, the item gets no new operation until that one
    /// reports or its session ends. (A cancel of an operation no agent
    /// runs, lost with its session, holds nothing back.)
    awaiting_cancelled: BTreeMap<ItemRef, (String, u64)>,
    /// Items and generations for which an agent answered a NEEDS_RECREATE
    /// question with no (on a session that held the type then).
    modify_in_place: BTreeSet<(ItemRef, u64)>,
    /// How many times the wall clock stepped back: retry times are
    /// wall-clock times, so a step back may shorten a wait the server
    /// clamps after a restart.
    wall_steps_back: u32,
}

/// The shortest wait DESIGN 4 allows before the next attempt after the
/// `failures`-th consecutive failure: `static{wait}` waits `wait`,
/// `random{min, max}` at least `min`, and `exponential{initial,
/// multiplier, max}` `initial * multiplier^(failures - 1)` capped at `max`
/// (the first retry waits `initial`; docs/configurators.md).
pub fn least_retry_wait(policy: &RetryPolicy, failures: u32) -> u64 {
    match policy {
        RetryPolicy::Static { wait_ms } => *wait_ms,
        RetryPolicy::Random { min_ms, max_ms } => (*min_ms).min(*max_ms),
        RetryPolicy::Exponential {
            initial_ms,
            multiplier,
            max_ms,
        } => {
            let exponent = i32::try_from(failures.saturating_sub(1)).unwrap_or(i32::MAX);
            let grown = (*initial_ms as f64) * multiplier.max(1.0).powi(exponent);
            if grown < *max_ms as f64 {
                grown as u64
            } else {
                *max_ms
            }
        }
    }
}

impl Ledger {
    /// Rule 4: for a type that declares `ask_needs_recreate`, a Modify is
    /// sent only after an agent answered the question about that change
    /// (the item toward the Modify's generation) with no.
    pub fn check_modify_was_answered(
        &self,
        order: &OperationOrder,
        scenario: &Scenario,
    ) -> Result<(), Violation> {
        let asks = scenario
            .spec(order.item.item_type())
            .is_some_and(|spec| spec.ask_needs_recreate);
        let item = order.item.item_ref();
        if order.kind != OperationKind::Modify
            || order.question
            || !asks
            || self
                .modify_in_place
                .contains(&(item.clone(), order.generation))
        {
            return Ok(());
        }
        fail(
            "a type that asks modifies only after the agent answers no",
            format!(
                "modify {item} (op {}) toward generation {} was sent, but no agent answered \
                 its NEEDS_RECREATE question with no",
                order.op_id, order.generation
            ),
        )
    }

    /// DESIGN 4: an operation is cancelled only when it is superseded (its
    /// item's intended value changed: a Create or Modify whose target
    /// changed or left the intent, a Delete whose item is intended again;
    /// rule 9: one whose item went with an external item it was
    /// auto-deleted by) or it timed out. `running_on` is the session an
    /// agent runs `op_id` on, if one does: a superseded one there holds its
    /// item back ([`Self::check_no_operation_beside_a_cancelled_one`]).
    pub fn check_cancel(
        &mut self,
        op_id: &str,
        running_on: Option<u64>,
        now_ms: u64,
        model: &IntentModel,
    ) -> Result<(), Violation> {
        if !self.cancels_sent.insert(op_id.to_owned()) {
            return Ok(());
        }
        let Some(record) = self.ops.get(op_id) else {
            return Ok(());
        };
        let timed_out = now_ms >= record.delivered_at_ms.saturating_add(record.timeout_ms);
        let superseded = match record.kind {
            OperationKind::Create | OperationKind::Modify => {
                model.changed_since(record.generation, &record.item)
            }
            // Its item back in the intent.
            OperationKind::Delete => model.intends(&record.item),
            OperationKind::Read => false,
        };
        let vanished =
            self.vanished_ops.contains(op_id) || self.dropped_with_external.contains(op_id);
        if superseded
            && !timed_out
            && !vanished
            && let Some(session) = running_on
        {
            self.awaiting_cancelled
                .insert(record.item.clone(), (op_id.to_owned(), session));
        }
        if timed_out || superseded || vanished {
            return Ok(());
        }
        fail(
            "an operation is cancelled only when superseded or timed out",
            format!(
                "{} {} (op {op_id}) toward generation {} was cancelled {} ms after its delivery \
                 (timeout {} ms), its intent unchanged",
                record.kind.as_str(),
                record.item,
                record.generation,
                now_ms.saturating_sub(record.delivered_at_ms),
                record.timeout_ms
            ),
        )
    }

    /// DESIGN 4: an item whose running operation a cancel superseded gets
    /// no new operation (another op id, a READ included) until that one
    /// reports or the session the cancel went to ends.
    pub fn check_no_operation_beside_a_cancelled_one(
        &self,
        order: &OperationOrder,
    ) -> Result<(), Violation> {
        let item = order.item.item_ref();
        let Some((cancelled, session)) = self.awaiting_cancelled.get(&item) else {
            return Ok(());
        };
        if *cancelled == order.op_id {
            return Ok(());
        }
        fail(
            "a cancelled operation's item waits for its report",
            format!(
                "{} {item} (op {}) was sent while op {cancelled}, cancelled on session \
                 {session}, had not reported and its session was live",
                order.kind.as_str(),
                order.op_id
            ),
        )
    }

    /// Sessions ended: the operations cancelled on them no longer hold
    /// their items back.
    pub fn on_sessions_ended(&mut self, ended: &[u64]) {
        self.awaiting_cancelled
            .retain(|_, (_, session)| !ended.contains(session));
    }

    /// Whether a cancel was ever sent for `op_id`.
    pub fn cancel_sent(&self, op_id: &str) -> bool {
        self.cancels_sent.contains(op_id)
    }

    /// Whether `order` resumes an operation already under way: the same op
    /// id and attempt was delivered before, or was journaled when its
    /// outcome was lost. Resuming it is not a new decision to run it; a
    /// re-ask after a WAIT the server accepted is such a decision (the
    /// agent is not running it: "ask again later", DESIGN 4), so it obeys
    /// the rules of an operation the server decides to send.
    pub fn resumes(&self, order: &OperationOrder) -> bool {
        let delivered = self
            .ops
            .get(&order.op_id)
            .is_some_and(|record| record.attempt == order.attempt && record.wait_until.is_none());
        let lost = self
            .lost
            .get(&order.item.item_ref())
            .is_some_and(|lost| lost.op_id == order.op_id && lost.attempt == order.attempt);
        delivered || lost
    }

    /// An order arrived on a session granted `session_epoch` for its type,
    /// at simulated `now_ms`; `delivered_at_ms` is the earliest time it can
    /// have been sent.
    pub fn on_order(
        &mut self,
        order: &OperationOrder,
        session_epoch: Option<u64>,
        delivered_at_ms: u64,
        now_ms: u64,
        wall_ms: u64,
    ) -> Result<(), Violation> {
        self.check_no_delete_of_the_dropped(order)?;
        let item = order.item.item_ref();
        // Whether this is the item's journaled lost operation, asked before
        // what follows settles (and forgets) the lost record.
        let journaled = self
            .lost
            .get(&item)
            .is_some_and(|lost| lost.op_id == order.op_id);
        if session_epoch != Some(order.epoch) {
            return fail(
                "orders carry the epoch granted to their session",
                format!(
                    "{} {item} (op {}) carries epoch {} on a session granted {:?}",
                    order.kind.as_str(),
                    order.op_id,
                    order.epoch,
                    session_epoch
                ),
            );
        }
        if order.kind == OperationKind::Read
            && let Some(lost) = self.lost.get(&item)
        {
            self.resolving_read
                .insert(lost.op_id.clone(), order.op_id.clone());
            // A READ sent to resolve the lost operation counts as one more
            // delivery of it: the server gives it up as poison after as many
            // losses as if it had been sent again each time (DESIGN 4).
            // A lost attempt that no agent received yet (journaled, and
            // the store died or its session ended before it went out)
            // counts it for that attempt, once it is delivered.
            match self.ops.get_mut(&lost.op_id) {
                Some(record) if record.attempt >= lost.attempt => record.deliveries += 1,
                _ => {
                    *self
                        .reads_before_delivery
                        .entry(lost.op_id.clone())
                        .or_default() += 1;
                }
            }
        }
        if order.kind != OperationKind::Read
            && let Some(lost) = self.lost.remove(&item)
            && lost.op_id != order.op_id
        {
            // Given up as poison, the lost operation counts as failed: an
            // operation the intent now needs instead is new, while the same
            // operation keeps its op id (checked below as for any retry).
            let reads_before = self.reads_before_delivery.get(&lost.op_id).copied();
            let given_up = self.ops.get(&lost.op_id).is_some_and(|record| {
                let deliveries = if record.attempt >= lost.attempt {
                    record.deliveries
                } else {
                    reads_before.unwrap_or(0)
                };
                deliveries >= MAX_REDELIVERIES
                    && (record.kind, record.generation, record.question)
                        != (order.kind, order.generation, order.question)
            });
            if !lost.may_be_replaced && !given_up {
                return fail(
                    "lost operations resume with their op id",
                    format!(
                        "{item} had op {} attempt {} lost (journaled or dropped with its session), \
                             but the next order for it is {} op {} attempt {}",
                        lost.op_id,
                        lost.attempt,
                        order.kind.as_str(),
                        order.op_id,
                        order.attempt
                    ),
                );
            }
            // Replaced by what the intent needs now.
            if let Some((last, ending)) = self.last_by_item.get_mut(&item)
                && *last == lost.op_id
            {
                *ending = Ending::Finished;
            }
        }
        match self.ops.get_mut(&order.op_id) {
            Some(record) => {
                if (
                    &record.item,
                    record.kind,
                    record.generation,
                    record.question,
                ) != (&item, order.kind, order.generation, order.question)
                {
                    return fail(
                        "an op id names one operation on one item toward one generation",
                        format!(
                            "op {} was {} {} toward generation {} (question: {}), now {} {item} toward {} (question: {})",
                            order.op_id,
                            record.kind.as_str(),
                            record.item,
                            record.generation,
                            record.question,
                            order.kind.as_str(),
                            order.generation,
                            order.question
                        ),
                    );
                }
                if order.attempt < record.attempt {
                    return fail(
                        "attempts never go back",
                        format!(
                            "op {} on {item} was at attempt {}, now attempt {}",
                            order.op_id, record.attempt, order.attempt
                        ),
                    );
                }
                if order.attempt == record.attempt {
                    // DESIGN 4: after WAIT, "ask again later", as the agent
                    // said (`retry_after`).
                    if let Some((until, steps_back)) = record.wait_until
                        && steps_back == self.wall_steps_back
                        && wall_ms < until
                    {
                        return fail(
                            "a WAIT is asked again only after its retry_after",
                            format!(
                                "op {} on {item} attempt {} was asked again {} ms before the \
                                 time its WAIT gave",
                                order.op_id,
                                order.attempt,
                                until - wall_ms
                            ),
                        );
                    }
                    record.wait_until = None;
                    // Sent again as it was: the server did not count a
                    // failure of it (or it would send the next attempt).
                    record.retry_wait = None;
                    record.deliveries += 1;
                    record.delivered_at_ms = delivered_at_ms;
                } else {
                    let timed_out =
                        now_ms >= record.delivered_at_ms.saturating_add(record.timeout_ms);
                    let poison = record.deliveries >= MAX_REDELIVERIES;
                    if order.attempt > record.attempt + 1 || !(record.failed || timed_out || poison)
                    {
                        return fail(
                            "an attempt grows only after a failure or a timeout",
                            format!(
                                "op {} on {item} went from attempt {} to {} (failed reported: {}, \
                                 {} ms since its delivery, timeout {} ms, {} deliveries)",
                                order.op_id,
                                record.attempt,
                                order.attempt,
                                record.failed,
                                now_ms.saturating_sub(record.delivered_at_ms),
                                record.timeout_ms,
                                record.deliveries
                            ),
                        );
                    }
                    if let Some((failed_at, least_wait, steps_back)) = record.retry_wait
                        && steps_back == self.wall_steps_back
                        && wall_ms < failed_at.saturating_add(least_wait)
                    {
                        return fail(
                            "a retry waits as its type's retry policy says",
                            format!(
                                "op {} on {item} attempt {} went out {} ms after attempt {} failed; \
                                 the type's retry policy waits at least {least_wait} ms",
                                order.op_id,
                                order.attempt,
                                wall_ms.saturating_sub(failed_at),
                                record.attempt,
                            ),
                        );
                    }
                    record.retry_wait = None;
                    record.wait_until = None;
                    record.attempt = order.attempt;
                    record.deliveries =
                        1 + self.reads_before_delivery.remove(&order.op_id).unwrap_or(0);
                    record.failed = false;
                    record.delivered_at_ms = delivered_at_ms;
                    record.timeout_ms = order.timeout_ms;
                }
            }
            None => {
                if order.kind != OperationKind::Read
                    && self.retry_pending.contains(&item)
                    && let Some((last, ending)) = self.last_by_item.get(&item)
                    && *ending != Ending::Finished
                    && let Some(previous) = self.ops.get(last)
                    && (previous.kind, previous.generation, previous.question)
                        == (order.kind, order.generation, order.question)
                {
                    return fail(
                        "a retry keeps its op id",
                        format!(
                            "{} {item} toward generation {} got op {} while op {} for the same \
                             operation had not finished ({ending:?})",
                            order.kind.as_str(),
                            order.generation,
                            order.op_id,
                            last
                        ),
                    );
                }
                // An op id that is new to the agents starts at attempt 1
                // (DESIGN 4: "attempt starts at 1"; a success resets the
                // count), unless it was journaled before a restart and
                // retried or given up as poison before it went out (seed
                // 90564: READs resolving it, lost one after another, counted
                // as its deliveries until the poison rule counted a failure).
                if order.attempt != 1 && !journaled {
                    return fail(
                        "an operation starts at attempt 1",
                        format!(
                            "{} {item} got new op {} at attempt {}",
                            order.kind.as_str(),
                            order.op_id,
                            order.attempt
                        ),
                    );
                }
                self.ops.insert(
                    order.op_id.clone(),
                    OpRecord {
                        item: item.clone(),
                        value: order.item.clone(),
                        kind: order.kind,
                        generation: order.generation,
                        question: order.question,
                        attempt: order.attempt,
                        deliveries: 1 + self
                            .reads_before_delivery
                            .remove(&order.op_id)
                            .unwrap_or(0),
                        failed: false,
                        delivered_at_ms,
                        timeout_ms: order.timeout_ms,
                        retry_wait: None,
                        wait_until: None,
                    },
                );
            }
        }
        if order.kind != OperationKind::Read {
            self.last_by_item
                .insert(item, (order.op_id.clone(), Ending::Open));
        }
        Ok(())
    }

    /// An agent sent a result on a session that `session_epoch` tells the
    /// epoch of, by item type.
    pub fn on_result(
        &mut self,
        op_id: &str,
        attempt: u32,
        outcome: &AgentOutcome,
        session_epoch: impl Fn(&str) -> Option<u64>,
    ) -> bool {
        self.awaiting_cancelled
            .retain(|_, (cancelled, _)| cancelled != op_id);
        let Some(record) = self.ops.get_mut(op_id) else {
            return false;
        };
        if attempt != record.attempt {
            return false;
        }
        // A result from a session whose epoch for the type is over changes
        // nothing (DESIGN 4): the server sends the operation again to the
        // session that holds the type now, and a READ it sent to resolve
        // a lost operation has not resolved it.
        let item_type = record.item.item_type();
        if session_epoch(item_type) != self.epochs.get(&**item_type).copied() {
            return false;
        }
        if matches!(outcome, AgentOutcome::Failed(_)) {
            record.failed = true;
        }
        if record.question
            && matches!(
                outcome,
                AgentOutcome::Done {
                    needs_recreate: false,
                    ..
                }
            )
        {
            self.modify_in_place
                .insert((record.item.clone(), record.generation));
        }
        let item = record.item.clone();
        let resolves = record.kind == OperationKind::Read
            && match outcome {
                AgentOutcome::Done { .. } => true,
                AgentOutcome::Failed(error) => error.code == reconciled::graph::code::NOT_FOUND,
                _ => false,
            };
        if let Some(lost) = self.lost.get(&item)
            && ((resolves
                && self
                    .resolving_read
                    .get(&lost.op_id)
                    .is_some_and(|read| read == op_id))
                || (lost.op_id == op_id && lost.attempt == attempt))
        {
            // Answered; or a READ (only ever sent to an UNKNOWN item whose
            // lost operation runs nowhere) said what exists: either way
            // what the lost operation did is known (DESIGN 4).
            let lost_op = lost.op_id.clone();
            self.lost.remove(&item);
            if resolves
                && let Some((last, ending)) = self.last_by_item.get_mut(&item)
                && *last == lost_op
            {
                *ending = Ending::Finished;
            }
        }
        if let Some((last, ending)) = self.last_by_item.get_mut(&item)
            && last == op_id
        {
            *ending = match outcome {
                AgentOutcome::Done { .. } => Ending::Finished,
                AgentOutcome::Failed(error) if error.is_terminal() => Ending::Finished,
                AgentOutcome::Failed(_) => Ending::Retryable,
                AgentOutcome::Wait { .. } => Ending::Waiting,
                AgentOutcome::InProgress => *ending,
            };
        }
        true
    }

    /// The server accepted a retryable failure of `op_id`'s `attempt`
    /// (counted by [`Self::on_result`]) at simulated `now_ms`, wall-clock
    /// `wall_ms`: its next attempt waits at least `least_wait_ms`.
    pub fn on_failure_accepted(
        &mut self,
        op_id: &str,
        attempt: u32,
        now_ms: u64,
        wall_ms: u64,
        least_wait_ms: u64,
    ) {
        let steps_back = self.wall_steps_back;
        if let Some(record) = self.answered_in_time(op_id, attempt, now_ms)
            && record.retry_wait.is_none()
        {
            record.retry_wait = Some((wall_ms, least_wait_ms, steps_back));
        }
    }

    /// The server accepted a WAIT of `op_id`'s `attempt` (counted by
    /// [`Self::on_result`]) at simulated `now_ms`, wall-clock `wall_ms`:
    /// it is not asked again for `retry_after_ms`. Only the first WAIT
    /// since the operation was last sent counts: an agent that replays an
    /// old result does not move the time.
    pub fn on_wait_accepted(
        &mut self,
        op_id: &str,
        attempt: u32,
        now_ms: u64,
        wall_ms: u64,
        retry_after_ms: u64,
    ) {
        let steps_back = self.wall_steps_back;
        if let Some(record) = self.answered_in_time(op_id, attempt, now_ms)
            && record.wait_until.is_none()
        {
            record.wait_until = Some((wall_ms.saturating_add(retry_after_ms), steps_back));
        }
    }

    /// The record of `op_id` if `attempt` is its current one and was
    /// answered at simulated `now_ms` within its timeout: an attempt past
    /// it the server may have timed out already (and retried from then).
    fn answered_in_time(
        &mut self,
        op_id: &str,
        attempt: u32,
        now_ms: u64,
    ) -> Option<&mut OpRecord> {
        self.ops.get_mut(op_id).filter(|record| {
            record.attempt == attempt
                && now_ms < record.delivered_at_ms.saturating_add(record.timeout_ms)
        })
    }

    /// The item type of operation `op_id`, if an agent received it.
    pub fn item_type_of(&self, op_id: &str) -> Option<String> {
        self.ops
            .get(op_id)
            .map(|record| record.item.item_type().to_string())
    }

    /// The wall clock stepped by `ms` (negative: back).
    pub fn on_wall_clock_step(&mut self, ms: i64) {
        if ms < 0 {
            self.wall_steps_back += 1;
        }
    }

    /// A registration granted `epoch` for `item_type`: epochs grow with
    /// every takeover.
    pub fn on_grant(&mut self, item_type: &str, epoch: u64) -> Result<(), Violation> {
        let previous = self.epochs.insert(item_type.to_owned(), epoch);
        match previous {
            Some(previous) if previous >= epoch => fail(
                "epochs grow with every registration",
                format!("{item_type} was granted epoch {epoch} after epoch {previous}"),
            ),
            _ => Ok(()),
        }
    }

    /// The server restarted with these operations journaled.
    pub fn on_restart(&mut self, journaled: BTreeMap<ItemRef, LostOperation>) {
        // Every session ended with the server.
        self.awaiting_cancelled.clear();
        // A WAIT whose commit died with the store left its operation
        // journaled, to be sent again at once: only a WAIT seen by the
        // restarted server holds back its re-ask.
        for record in self.ops.values_mut() {
            record.wait_until = None;
        }
        // Operations lost earlier and not resolved stay lost: the restarted
        // server owes them as much as the one before.
        for (item, mut lost) in journaled {
            if let Some(target) = &lost.target {
                self.journaled_values
                    .entry(item.clone())
                    .or_default()
                    .push(target.clone());
            }
            // What was known of the same lost operation still holds (its
            // item vanished with an external item meanwhile, say).
            let known = self
                .lost
                .get(&item)
                .is_some_and(|earlier| earlier.op_id == lost.op_id && earlier.may_be_replaced);
            // Journaled but never delivered (the store died before the
            // order went out): no agent ran it, so nothing of it can be
            // lost; the server may plan what the intent needs instead.
            let undelivered = !self.ops.contains_key(&lost.op_id);
            if let Some((last, ending)) = self.last_by_item.get_mut(&item) {
                if undelivered {
                    // The server had moved on from the last operation the
                    // agents saw for the item: that one is not retried.
                    *ending = Ending::Finished;
                } else if *last == lost.op_id
                    && matches!(*ending, Ending::Waiting | Ending::Retryable)
                {
                    // An answer whose commit died with the store (a WAIT,
                    // a retryable failure; seed 10970) never reached the
                    // server: it holds the operation as running again.
                    *ending = Ending::Open;
                }
            }
            lost.may_be_replaced |= known || undelivered || self.vanished_ops.contains(&lost.op_id);
            // Each re-delivery the server counted may have gone out (it
            // commits an order before it sends it): the attempt counts as
            // delivered as often, for the poison rule.
            if let Some(record) = self.ops.get_mut(&lost.op_id)
                && record.attempt == lost.attempt
            {
                record.deliveries = record.deliveries.max(lost.redeliveries + 1);
            }
            // The restarted server forgot the READs it had sent: a late
            // answer of one (an agent resending it) resolves nothing.
            self.resolving_read.remove(&lost.op_id);
            self.lost.insert(item, lost);
        }
    }

    /// An agent dropped an operation when its session ended: the server
    /// lost its outcome.
    pub fn on_dropped(&mut self, order: &OperationOrder) {
        if order.kind == OperationKind::Read {
            // Observation: any later operation may take its place.
            return;
        }
        self.lose(&order.op_id, order.attempt, order.kind, &order.item);
    }

    /// The server lost the outcome of `op_id`'s `attempt`, a `kind` of
    /// operation on `value`'s item (its target, for a Create or Modify).
    fn lose(&mut self, op_id: &str, attempt: u32, kind: OperationKind, value: &Arc<Item>) {
        let target =
            matches!(kind, OperationKind::Create | OperationKind::Modify).then(|| value.clone());
        self.lost.insert(
            value.item_ref(),
            LostOperation {
                op_id: op_id.to_owned(),
                attempt,
                kind,
                target,
                may_be_replaced: self.vanished_ops.contains(op_id),
                redeliveries: 0,
            },
        );
    }

    /// An agent's process restarted and forgot its result of `op_id`'s
    /// `attempt`, which the server still had in flight: the server lost its
    /// outcome, as for a dropped operation, though it may have applied.
    pub fn on_forgotten(&mut self, op_id: &str, attempt: u32) {
        let Some(record) = self.ops.get(op_id) else {
            return;
        };
        if record.kind == OperationKind::Read || record.attempt != attempt {
            return;
        }
        let (kind, value) = (record.kind, record.value.clone());
        self.lose(op_id, attempt, kind, &value);
    }

    /// The server acknowledged the report that `external` is gone, with
    /// `gone`, its dependents auto-deleted by it.
    pub fn on_dropped_with_external(&mut self, external: &ItemRef, gone: &[ItemRef]) {
        for item in gone.iter().filter(|item| !self.uncertain.contains(*item)) {
            self.items_gone_with_external
                .insert(item.clone(), external.clone());
        }
    }

    /// The server acknowledged `changes`: an external item reported to
    /// exist (again) lets what rule 9 dropped with it be planned afresh, a
    /// Delete of an item whose outcome is uncertain included.
    pub fn on_reports_acknowledged(&mut self, changes: &[ExternalChange]) {
        for change in changes {
            if let ExternalChange::Put { item, .. } = change {
                let external = item.item_ref();
                self.items_gone_with_external
                    .retain(|_, gone_with| *gone_with != external);
            }
        }
    }

    /// After every step: the items `snapshot` shows the server unsure of
    /// (its `uncertain` field); rule 9 no longer speaks for them.
    pub fn note_uncertain(&mut self, snapshot: &TenantSnapshot) {
        self.uncertain = snapshot
            .current
            .iter()
            .filter(|(_, current)| current.uncertain())
            .map(|(key, _)| key.clone())
            .collect();
        for item in &self.uncertain {
            self.items_gone_with_external.remove(item);
        }
    }

    /// DESIGN §3 rule 9: an item auto-deleted by an external item that
    /// disappeared is dropped without a Delete call. A new Delete (a new
    /// op id) of such an item, of the value that relied on that external
    /// item, breaks it; one running before the report may go on.
    fn check_no_delete_of_the_dropped(&mut self, order: &OperationOrder) -> Result<(), Violation> {
        let item = order.item.item_ref();
        if order.kind == OperationKind::Create {
            self.items_gone_with_external.remove(&item);
            return Ok(());
        }
        if order.kind != OperationKind::Delete || self.ops.contains_key(&order.op_id) {
            return Ok(());
        }
        let Some(external) = self.items_gone_with_external.get(&item) else {
            return Ok(());
        };
        let relied = order
            .item
            .dependency_on(external)
            .is_some_and(|d| d.auto_deleted_by_external());
        if relied {
            return fail(
                "an item auto-deleted by a vanished external item gets no Delete",
                format!(
                    "Delete {item} (op {}) after {external} was reported gone",
                    order.op_id
                ),
            );
        }
        Ok(())
    }

    /// Items vanished with external item `external` they were auto-deleted
    /// by: whatever their lost operation did, they are gone, and the server
    /// may drop them and plan them afresh (rule 9). So may a lost Create
    /// whose target is auto-deleted by a vanished item (if it happened, its
    /// item went too), at any depth.
    pub fn on_vanished(&mut self, external: &ItemRef, gone: &[ItemRef]) {
        let mut vanished: Vec<ItemRef> = gone.to_vec();
        vanished.push(external.clone());
        loop {
            let tied: Vec<ItemRef> = self
                .lost
                .iter()
                .filter(|(item, lost)| {
                    !vanished.contains(item)
                        && lost.target.as_ref().is_some_and(|target| {
                            target.dependencies.iter().any(|d| {
                                d.auto_deleted_by_external() && vanished.contains(&d.requires)
                            })
                        })
                })
                .map(|(item, _)| item.clone())
                .collect();
            if tied.is_empty() {
                break;
            }
            vanished.extend(tied);
        }
        for (item, (op_id, ending)) in &self.last_by_item {
            let Some(record) = self.ops.get(op_id) else {
                continue;
            };
            // A Create or Modify that ties its item to a vanished external
            // item: if it applied, the item went with it.
            let tied_create = matches!(record.kind, OperationKind::Create | OperationKind::Modify)
                && !record.question
                && record
                    .value
                    .dependencies
                    .iter()
                    .any(|d| d.auto_deleted_by_external() && vanished.contains(&d.requires));
            if *ending == Ending::Open && (vanished.contains(item) || tied_create) {
                self.vanished_ops.insert(op_id.clone());
            }
            // A value delivered for the item earlier, or journaled for it
            // when the server stopped (seed 163039: never delivered), which
            // the server may hold as applied (its outcome unknown), tied it
            // to a vanished item: the server may drop the item, superseding
            // what runs.
            let tied = |value: &Item| {
                value
                    .dependencies
                    .iter()
                    .any(|d| d.auto_deleted_by_external() && vanished.contains(&d.requires))
            };
            let tied_before = || {
                self.ops.values().any(|earlier| {
                    earlier.item == *item
                        && matches!(earlier.kind, OperationKind::Create | OperationKind::Modify)
                        && !earlier.question
                        && tied(&earlier.value)
                }) || self
                    .journaled_values
                    .get(item)
                    .is_some_and(|values| values.iter().any(|value| tied(value)))
            };
            if *ending == Ending::Open && tied_before() {
                self.dropped_with_external.insert(op_id.clone());
            }
        }
        for item in &vanished {
            if let Some(lost) = self.lost.get_mut(item) {
                lost.may_be_replaced = true;
                if let Some((last, ending)) = self.last_by_item.get_mut(item)
                    && *last == lost.op_id
                {
                    *ending = Ending::Finished;
                }
            }
        }
    }

    /// After every step, at wall-clock `wall_ms`: the items the snapshot
    /// shows waiting for a retry; and each retry time set since the last
    /// step waits no longer than DESIGN 4 allows: the type's retry policy
    /// (`exponential` capped at `max`, `random` up to `max`, `static` its
    /// wait, clamped to that after a restart) or the `retry_after` of a
    /// WAIT, at most [`MAX_WAIT_RETRY_AFTER_MS`] here, from the latest
    /// wall-clock time so far (a retry set just before the clock stepped
    /// back counts from the time before; seed 22170).
    pub fn note_retries(
        &mut self,
        snapshot: &TenantSnapshot,
        wall_ms: u64,
        scenario: &Scenario,
    ) -> Result<(), Violation> {
        self.retry_pending = snapshot
            .current
            .iter()
            .filter(|(_, c)| c.in_flight.is_none() && c.rare.next_attempt_at_ms.is_some())
            .map(|(key, _)| key.clone())
            .collect();
        let retry_times: BTreeMap<ItemRef, u64> = snapshot
            .current
            .iter()
            .filter_map(|(key, c)| Some((key.clone(), c.rare.next_attempt_at_ms?)))
            .collect();
        self.wall_high_ms = self.wall_high_ms.max(wall_ms);
        for (key, at) in &retry_times {
            if self.retry_times.get(key) == Some(at) {
                continue;
            }
            let policy_wait = scenario
                .spec(key.item_type())
                .map_or(0, |spec| spec.retry.max_delay_ms());
            let longest = policy_wait.max(MAX_WAIT_RETRY_AFTER_MS);
            let latest = self.wall_high_ms;
            if *at > latest.saturating_add(longest) {
                return fail(
                    "a retry waits no longer than its policy or the agent's retry_after",
                    format!(
                        "{key} was given its next attempt at {at} ms, {} ms after the \
                         latest time so far ({latest} ms; now {wall_ms} ms): its type's \
                         policy waits at most {policy_wait} ms and a WAIT at most \
                         {MAX_WAIT_RETRY_AFTER_MS} ms",
                        at - latest
                    ),
                );
            }
        }
        self.retry_times = retry_times;
        Ok(())
    }

    /// After every step: notes lost operations the server may now replace
    /// (their target's dependencies broke in the world, or the target is
    /// no longer the intent).
    pub fn observe(&mut self, world: &World, model: &IntentModel) {
        let ops = &self.ops;
        for (item, lost) in &mut self.lost {
            let replaceable = match &lost.target {
                Some(target) => {
                    let intended = model
                        .items
                        .get(item)
                        .is_some_and(|intended| intended.same_content(target));
                    let broken = target.dependencies.iter().any(|dependency| {
                        !world
                            .items
                            .get(&dependency.requires)
                            .is_some_and(|w| holds(dependency.must_satisfy(), &w.value.properties))
                    });
                    // A dependency that left an intent the server may hold
                    // is planned for deletion: not satisfied (DESIGN 2).
                    let leaving = target.dependencies.iter().any(|dependency| {
                        let required = &dependency.requires;
                        let external = world.items.get(required).is_some_and(|w| w.value.external);
                        !external
                            && std::iter::once(&model.items)
                                .chain(model.uncertain.iter().map(|(_, items)| items))
                                .any(|items| !items.contains_key(required))
                    });
                    broken || leaving || !intended
                }
                None => {
                    // A Delete toward a generation is the first half of a
                    // recreate: once that generation's value is not the
                    // intent any more, the Delete the intent needs is
                    // another operation (toward the generation intended
                    // now, or 0 if the item left the intent).
                    let toward = ops.get(&lost.op_id).map_or(0, |record| record.generation);
                    let recreate_dropped = toward != 0
                        && model.items.get(item).is_none_or(|intended| {
                            model
                                .value_at(toward, item)
                                .is_none_or(|target| !intended.same_content(target))
                        });
                    lost.kind == OperationKind::Delete
                        && (!world.items.contains_key(item) || recreate_dropped)
                }
            };
            if replaceable {
                lost.may_be_replaced = true;
                if let Some((last, ending)) = self.last_by_item.get_mut(item)
                    && *last == lost.op_id
                {
                    *ending = Ending::Finished;
                }
            }
        }
    }
}

fn conditions_text(snapshot: &TenantSnapshot) -> String {
    snapshot
        .record
        .conditions
        .iter()
        .map(|c| {
            format!(
                "{}={} {}: {}",
                c.kind.as_str(),
                c.status,
                c.reason,
                c.message
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn condition(snapshot: &TenantSnapshot, kind: ConditionKind) -> Option<bool> {
    snapshot
        .record
        .conditions
        .iter()
        .find(|c| c.kind == kind)
        .map(|c| c.status)
}

/// What makes the tenant not quiescent (DESIGN 5: "nothing is in flight,
/// nothing can be dispatched, and no backoff is pending"), as far as a
/// snapshot shows it: an operation running at an agent other than a drift
/// READ (a READ resolving a lost operation is work), or a retry waiting
/// for its backoff. `None` when none of these.
fn work_in_progress(snapshot: &TenantSnapshot) -> Option<String> {
    for (key, current) in snapshot.current.iter() {
        let Some(operation) = current.in_flight.as_ref() else {
            continue;
        };
        let observation = operation.kind == OperationKind::Read && operation.resolves.is_none();
        if current.operation_runs() && !observation {
            return Some(format!(
                "{key} runs a {} ({})",
                operation.kind.as_str(),
                operation.op_id
            ));
        }
    }
    snapshot
        .waiting
        .iter()
        .find(|(_, waiting)| waiting.reason == WaitReason::Backoff)
        .map(|(key, _)| format!("{key} waits for its retry's backoff"))
}

/// Why the tenant is not converged, per DESIGN: an intended item not
/// created at its intended value, an item left to delete, an existing
/// item whose dependency does not hold, or an operation (other than a
/// drift READ) in flight. `None` when converged.
pub fn unconverged_reason(snapshot: &TenantSnapshot) -> Option<String> {
    for (key, current) in snapshot.current.iter() {
        if let Some(operation) = &current.in_flight
            && (current.state == ItemState::Unknown || operation.kind != OperationKind::Read)
        {
            return Some(format!(
                "{key} is {} ({} in flight)",
                state_name(current.state),
                operation.kind.as_str()
            ));
        }
    }
    for (key, entry) in snapshot.intended.iter() {
        if entry.item.external {
            continue;
        }
        // Every value it may hold (a lost operation may have left another
        // than its applied one) is the intended one.
        let converged = snapshot
            .current
            .get(key)
            .is_some_and(|c| c.state == ItemState::Created && c.holds_only(&entry.item));
        if let Some(current) = snapshot.current.get(key)
            && converged
            && current.existence_uncertain
        {
            // It may not exist (its last operation raced its external
            // item): a Create has yet to confirm it (DESIGN 4).
            return Some(format!("{key} may not exist until it is created again"));
        }
        if !converged {
            return Some(format!(
                "{key} is {} and not at its intended value",
                snapshot
                    .current
                    .get(key)
                    .map_or("PENDING", |c| state_name(c.state))
            ));
        }
    }
    for (key, current) in snapshot.current.iter() {
        let Some(applied) = &current.applied else {
            continue;
        };
        if applied.external {
            continue;
        }
        if snapshot.intended.get(key).is_none() {
            return Some(format!("{key} is left to delete"));
        }
        for dependency in &applied.dependencies {
            let Some(required) = snapshot.current.get(&dependency.requires) else {
                return Some(format!("{key} exists but {} does not", dependency.requires));
            };
            if !holds(dependency.must_satisfy(), &required.effective_properties()) {
                return Some(format!(
                    "{key} exists but `{}` is false on {}",
                    dependency.must_satisfy(),
                    dependency.requires
                ));
            }
            if dependency.recreate_when_modified()
                && current.rare.dependency_marks.get(&dependency.requires)
                    != Some(&required.modifications)
            {
                return Some(format!(
                    "{key} must be recreated: {} was modified since",
                    dependency.requires
                ));
            }
        }
    }
    None
}

/// Checks a published snapshot (DESIGN §2, §5).
pub fn check_snapshot(snapshot: &TenantSnapshot, model: &IntentModel) -> Result<(), Violation> {
    // Counts by state equal a recount: every current item in its state,
    // every intended item not current (an external item not reported
    // too) as PENDING, as its ItemStatus shows it.
    let mut recount: BTreeMap<&'static str, u64> = BTreeMap::new();
    for (_, current) in snapshot.current.iter() {
        *recount.entry(state_name(current.state)).or_default() += 1;
    }
    for (key, _) in snapshot.intended.iter() {
        if snapshot.current.get(key).is_none() {
            *recount.entry("PENDING").or_default() += 1;
        }
    }
    if recount != *snapshot.counts.by_state() {
        return fail(
            "counts by state equal a recount of the graphs",
            format!(
                "the snapshot counts {:?}, a recount gives {recount:?}",
                snapshot.counts.by_state()
            ),
        );
    }
    // The acknowledged intent is the intent.
    if snapshot.record.generation != model.generation {
        return fail(
            "the generation is the acknowledged one",
            format!(
                "the snapshot has generation {}, the last acknowledged submit {}",
                snapshot.record.generation, model.generation
            ),
        );
    }
    let intended: BTreeMap<&ItemRef, &Item> = snapshot
        .intended
        .iter()
        .map(|(key, entry)| (key, &*entry.item))
        .collect();
    let expected: BTreeMap<&ItemRef, &Item> = model.items.iter().collect();
    if intended != expected {
        return fail(
            "the intent is the acknowledged one",
            format!(
                "intended items differ from the acknowledged intent: snapshot has {:?}, expected {:?}",
                intended.keys().collect::<Vec<_>>(),
                expected.keys().collect::<Vec<_>>()
            ),
        );
    }
    if snapshot.record.observed_generation > snapshot.record.generation {
        return fail(
            "the observed generation never passes the generation",
            format!(
                "observed generation {} > generation {}",
                snapshot.record.observed_generation, snapshot.record.generation
            ),
        );
    }
    // Item states agree with their operations.
    for (key, current) in snapshot.current.iter() {
        let expected_kind = match current.state {
            ItemState::Creating => Some(OperationKind::Create),
            ItemState::Modifying => Some(OperationKind::Modify),
            ItemState::Deleting => Some(OperationKind::Delete),
            _ => None,
        };
        if let Some(kind) = expected_kind
            && current
                .in_flight
                .as_ref()
                .is_none_or(|operation| operation.kind != kind || operation.question)
        {
            return fail(
                "an item's state names its operation in flight",
                format!(
                    "{key} is {} without that operation in flight",
                    state_name(current.state)
                ),
            );
        }
    }
    let in_flight = snapshot
        .current
        .iter()
        .filter(|(_, c)| {
            // An UNKNOWN item's own operation is lost; a READ that resolves
            // it runs.
            c.in_flight.as_ref().is_some_and(|operation| {
                c.state != ItemState::Unknown || operation.resolves.is_some()
            })
        })
        .count();
    if in_flight != snapshot.in_flight {
        return fail(
            "operations in flight are counted",
            format!(
                "the snapshot says {} in flight, its items {in_flight}",
                snapshot.in_flight
            ),
        );
    }
    // An item kept behind another's operation ("its delete runs first")
    // is kept behind one that is still planned: the other item's entry
    // for that operation shows it waiting only for operations before it,
    // not for something else (a failure, a retry time, a configurator, a
    // dependency), or no result of it may come to wake the first (seed
    // 29711; seed 2140: the Create of a recreate dropped from the plan
    // while its Delete stayed).
    for (key, waiting) in snapshot.waiting.iter() {
        for blocker in &waiting.blocked_by {
            if !blocker.says_runs_first() || blocker.item == *key {
                continue;
            }
            // The blocker's waiting entry may be about another operation
            // of it (the Create of a recreate, whose Delete runs).
            let Some(held) = snapshot
                .waiting
                .get(&blocker.item)
                .filter(|held| blocker.why == runs_first(held.operation))
            else {
                continue;
            };
            let running = snapshot
                .current
                .get(&blocker.item)
                .and_then(|c| c.in_flight.as_ref())
                .is_some_and(|operation| operation.kind == held.operation);
            if running {
                continue;
            }
            if let Some(other) = held.blocked_by.iter().find(|b| !b.says_runs_first()) {
                return fail(
                    "an item kept behind an operation is kept behind one that will run",
                    format!(
                        "{key} waits because {} (of {}), which waits: {} {}",
                        blocker.why, blocker.item, other.item, other.why
                    ),
                );
            }
        }
    }
    // A dependency said to be "not created" or "being modified" still
    // needs an operation: an item that waits for one that exists, idle,
    // and needs nothing is woken by nothing (seed 162641, where it was
    // found only once the run went quiet).
    let mut needing_work = None;
    for (key, waiting) in snapshot.waiting.iter() {
        for blocker in &waiting.blocked_by {
            let on_its_way =
                blocker.why.starts_with("not created") || blocker.why.starts_with("being modified");
            let looks_settled = snapshot
                .current
                .get(&blocker.item)
                .is_some_and(|c| c.state == ItemState::Created && c.in_flight.is_none())
                && !snapshot.waiting.contains_key(&blocker.item);
            if !on_its_way || blocker.item == *key || !looks_settled {
                continue;
            }
            let needing =
                needing_work.get_or_insert_with(|| items_a_full_plan_gives_work(snapshot));
            if !needing.contains(&blocker.item) {
                let (item, why) = (&blocker.item, &blocker.why);
                return fail(
                    "a dependency said to be on its way needs an operation",
                    format!(
                        "{key} waits because {item} is {why:?}, but {item} exists, runs nothing and needs nothing"
                    ),
                );
            }
        }
    }
    // An operation said to run first is one its item still needs: a
    // Delete of an item that exists, a Create or Modify of an intended one
    // (a waiter left naming a Delete that ended, or a Create the intent no
    // longer asks for, is woken by nothing).
    for (key, waiting) in snapshot.waiting.iter() {
        for blocker in &waiting.blocked_by {
            if blocker.item == *key {
                continue;
            }
            let exists = snapshot.current.contains_key(&blocker.item);
            let intended = snapshot.intended.contains_key(&blocker.item);
            let needed = if blocker.why == runs_first(OperationKind::Delete) {
                exists
            } else if blocker.why == runs_first(OperationKind::Create) {
                intended
            } else if blocker.why == runs_first(OperationKind::Modify) {
                intended && exists
            } else {
                continue;
            };
            if !needed {
                return fail(
                    "an operation said to run first is one its item needs",
                    format!(
                        "{key} waits because {} (of {}), which {}",
                        blocker.why,
                        blocker.item,
                        match (exists, intended) {
                            (false, false) => "neither exists nor is intended",
                            (false, true) => "does not exist",
                            (true, false) => "is not intended",
                            (true, true) => "exists and is intended",
                        }
                    ),
                );
            }
        }
    }
    // Conditions.
    let ready = condition(snapshot, ConditionKind::Ready);
    let reconciling = condition(snapshot, ConditionKind::Reconciling);
    let stalled = condition(snapshot, ConditionKind::Stalled);
    if reconciling == Some(true) && stalled == Some(true) {
        return fail(
            "Reconciling and Stalled never hold together",
            "both are true",
        );
    }
    if reconciling == Some(true) && ready == Some(true) {
        return fail("Reconciling and Ready never hold together", "both are true");
    }
    // DESIGN 5: Stalled needs a cause: an item that failed terminally (an
    // item blocked by one names it), or one waiting for a configurator
    // (also an UNKNOWN one whose type no agent holds: only an agent can
    // settle it).
    let waits_for_a_configurator = snapshot.waiting.values().any(|waiting| {
        waiting.reason == WaitReason::NoConfigurator
            || (waiting.reason == WaitReason::UnknownOutcome
                && !snapshot
                    .connected_item_types
                    .iter()
                    .any(|item_type| **item_type == **waiting.item.item_type()))
    });
    if stalled == Some(true) && !any_failed_for_good(snapshot) && !waits_for_a_configurator {
        return fail(
            "a tenant is Stalled only for a terminal failure or a missing configurator",
            format!(
                "Stalled is true ({}) but no item failed for good or waits for a configurator",
                conditions_text(snapshot)
            ),
        );
    }
    if reconciling == Some(false)
        && snapshot.record.observed_generation != snapshot.record.generation
    {
        return fail(
            "a quiescent tenant has observed its generation",
            format!(
                "Reconciling is false, observed generation {} of generation {}",
                snapshot.record.observed_generation, snapshot.record.generation
            ),
        );
    }
    if reconciling == Some(false)
        && let Some(work) = work_in_progress(snapshot)
    {
        return fail(
            "a tenant is Reconciling while it is not quiescent",
            format!("Reconciling is false but {work}"),
        );
    }
    if let Some(ready) = ready {
        let reason = unconverged_reason(snapshot);
        match (ready, reason) {
            (true, Some(reason)) => {
                return fail(
                    "Ready holds only when converged",
                    format!("Ready is true but {reason}"),
                );
            }
            (false, None) => {
                return fail(
                    "a converged tenant is Ready",
                    format!(
                        "every intended item is created at its intended value and nothing runs, \
                         but Ready is false ({})",
                        conditions_text(snapshot)
                    ),
                );
            }
            _ => {}
        }
    }
    Ok(())
}

/// DESIGN 4 and 2 on what an `OperationRequest` holds: a Modify carries
/// the applied value as `previous`, and changes something (equal values
/// need no operation) unless the server is unsure what is applied; the
/// timeout is the type's; the attempt is within the type's `max_attempts`
/// (after them the server gives the operation up).
pub fn check_order_content(
    order: &OperationOrder,
    spec: Option<&TypeSpec>,
) -> Result<(), Violation> {
    let what = || {
        format!(
            "{} {} (op {} attempt {})",
            order.kind.as_str(),
            order.item.item_ref(),
            order.op_id,
            order.attempt
        )
    };
    if order.kind == OperationKind::Modify {
        let Some(previous) = &order.previous else {
            return fail("a Modify carries the applied value", what());
        };
        if !order.previous_uncertain && previous.same_content(&order.item) {
            return fail(
                "a Modify changes something",
                format!("{}: previous and new values are equal", what()),
            );
        }
    }
    if let Some(spec) = spec
        && spec.max_attempts > 0
        && order.attempt > spec.max_attempts
    {
        return fail(
            "an operation is tried at most its type's max_attempts times",
            format!("{} of a type allowing {}", what(), spec.max_attempts),
        );
    }
    if let Some(spec) = spec
        && order.timeout_ms != spec.operation_timeout_ms
    {
        return fail(
            "an operation carries its type's timeout",
            format!(
                "{} carries {} ms, the type's is {} ms",
                what(),
                order.timeout_ms,
                spec.operation_timeout_ms
            ),
        );
    }
    Ok(())
}

/// DESIGN 6: commits are atomic and durable, and a snapshot shows
/// committed state. After a crash at revision `before` was published and
/// nothing newer was stored, the restarted server has every current item
/// as `before` showed it, and the same observed generation and conditions
/// (in substance: wording is not stored).
/// Allowed: an item whose operation was in flight becomes lost (DESIGN 4),
/// and a retry time may come nearer (it waits at most its policy's longest
/// wait from the restart).
pub fn check_crash_kept(before: &TenantSnapshot, loaded: &TenantSnapshot) -> Result<(), Violation> {
    if loaded.record.revision != before.record.revision {
        // A commit the store applied although it answered with an error,
        // or one durable but not yet published: `before` is not the last
        // committed state.
        return Ok(());
    }
    let keys: BTreeSet<&ItemRef> = before.current.keys().chain(loaded.current.keys()).collect();
    for key in keys {
        let was = before.current.get(key);
        if was.is_some_and(|was| was.in_flight.is_some()) {
            continue;
        }
        let is = loaded.current.get(key).map(|is| {
            let mut is = (**is).clone();
            if let Some(was) = was
                && let (Some(now), Some(then)) =
                    (is.rare.next_attempt_at_ms, was.rare.next_attempt_at_ms)
                && now <= then
            {
                is.rare.update(|rare| rare.next_attempt_at_ms = Some(then));
            }
            // An item whose running operation the restart took as lost,
            // and which went with it, is another item if it comes back: a
            // dependent forgets its mark on it (DESIGN 3, rule 4).
            if let Some(was) = was {
                let gone_at_restart = |required: &ItemRef| {
                    loaded.current.get(required).is_none()
                        && before
                            .current
                            .get(required)
                            .is_some_and(|required| required.in_flight.is_some())
                };
                let forgotten: Vec<(ItemRef, u64)> = was
                    .rare
                    .dependency_marks
                    .iter()
                    .filter(|(required, mark)| {
                        is.rare.dependency_marks.get(*required) == Some(&ABSENT_DEPENDENCY_MARK)
                            && **mark != ABSENT_DEPENDENCY_MARK
                            && gone_at_restart(required)
                    })
                    .map(|(required, mark)| (required.clone(), *mark))
                    .collect();
                if !forgotten.is_empty() {
                    is.rare
                        .update(|rare| rare.dependency_marks.extend(forgotten));
                }
            }
            is
        });
        if is.as_ref() != was.map(|was| &**was) {
            return fail(
                "a crash keeps the committed state a snapshot showed",
                format!(
                    "{key} at revision {}: shown {was:?}, restarted with {is:?}",
                    before.record.revision
                ),
            );
        }
    }
    // A condition's wording alone changes without a commit (DESIGN 7:
    // ConditionsChanged is sent for changes in substance).
    let substance = |snapshot: &TenantSnapshot| {
        snapshot
            .record
            .conditions
            .iter()
            .map(|condition| {
                (
                    condition.kind,
                    condition.status,
                    condition.reason.clone(),
                    condition.observed_generation,
                    condition.last_transition_ms,
                )
            })
            .collect::<Vec<_>>()
    };
    if loaded.record.observed_generation != before.record.observed_generation
        || substance(loaded) != substance(before)
    {
        return fail(
            "a crash keeps the committed state a snapshot showed",
            format!(
                "at revision {}: shown observed generation {} and {:?}, restarted with {} and {:?}",
                before.record.revision,
                before.record.observed_generation,
                before.record.conditions,
                loaded.record.observed_generation,
                loaded.record.conditions
            ),
        );
    }
    Ok(())
}

/// Checks the state a restarted server loaded (before its first pass):
/// the acknowledged intent survived. Returns the journaled operations.
pub fn check_restart(
    loaded: &TenantSnapshot,
    model: &mut IntentModel,
) -> Result<BTreeMap<ItemRef, LostOperation>, Violation> {
    let generation = loaded.record.generation;
    let loaded_items: BTreeMap<ItemRef, Item> = loaded
        .intended
        .iter()
        .map(|(key, entry)| (key.clone(), (*entry.item).clone()))
        .collect();
    // A submit whose answer was lost with the store may or may not be there.
    if let Some((uncertain, items)) = model.uncertain.take()
        && uncertain == generation
        && items == loaded_items
    {
        model.acknowledge(generation, items);
    }
    if generation != model.generation {
        return fail(
            "acknowledged submits survive a crash",
            format!(
                "the last acknowledged generation is {}, the restarted server has {generation}",
                model.generation
            ),
        );
    }
    if loaded_items != model.items {
        let differences: Vec<String> = loaded_items
            .keys()
            .chain(model.items.keys())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter(|key| loaded_items.get(*key) != model.items.get(*key))
            .map(|key| {
                format!(
                    "{key}: restarted {:?}, acknowledged {:?}",
                    loaded_items.get(key),
                    model.items.get(key)
                )
            })
            .collect();
        return fail(
            "acknowledged submits survive a crash",
            format!(
                "the restarted server's intent is not the acknowledged one: {}",
                differences.join("; ")
            ),
        );
    }
    Ok(loaded
        .current
        .iter()
        .filter_map(|(key, current)| {
            let operation = current.in_flight.as_ref()?;
            // A READ resolving an UNKNOWN item stands for the operation it
            // resolves.
            let operation = operation.resolves.as_deref().unwrap_or(operation);
            // A READ is observation: any later operation may take its place.
            (operation.kind != OperationKind::Read).then(|| {
                (
                    key.clone(),
                    LostOperation {
                        op_id: operation.op_id.clone(),
                        attempt: operation.attempt,
                        kind: operation.kind,
                        target: operation.target.clone(),
                        may_be_replaced: false,
                        redeliveries: operation.redeliveries,
                    },
                )
            })
        })
        .collect())
}

/// Whether `key` failed for good: a terminal code, or no retry left, for
/// the intent it has now (a terminal failure holds until the item's intent
/// changes; 0 when it left the intent).
fn any_failed_for_good(snapshot: &TenantSnapshot) -> bool {
    snapshot
        .current
        .iter()
        .any(|(key, current)| failed_for_good(snapshot, key, current))
}

fn failed_for_good(snapshot: &TenantSnapshot, key: &ItemRef, current: &CurrentItem) -> bool {
    let generation = snapshot
        .intended
        .get(key)
        .map_or(0, |entry| entry.generation);
    let failed = current.state == ItemState::Failed
        && current.rare.failed_generation == generation
        && (current
            .rare
            .last_error
            .as_ref()
            .is_some_and(|error| error.is_terminal())
            || current.rare.next_attempt_at_ms.is_none());
    // Given up on, then settled while it was not needed (the item shows
    // what it holds), and needed again at the same intent: the same
    // operation, still given up on (seed 78336).
    let needed_again = current.gave_up
        && current.rare.failed_generation == generation
        && snapshot
            .waiting
            .get(key)
            .is_some_and(|waiting| waiting.reason == WaitReason::TerminalFailure);
    failed || needed_again
}

/// Items connected to an item that failed for good, through dependency
/// edges of the intent, the current graph or the world, either way.
fn connected_to_failures(
    snapshot: &TenantSnapshot,
    world: &World,
    model: &IntentModel,
    down_types: &BTreeSet<String>,
) -> BTreeSet<ItemRef> {
    let mut edges: BTreeMap<ItemRef, BTreeSet<ItemRef>> = BTreeMap::new();
    let mut link = |a: &ItemRef, b: &ItemRef| {
        edges.entry(a.clone()).or_default().insert(b.clone());
        edges.entry(b.clone()).or_default().insert(a.clone());
    };
    let values = model
        .items
        .values()
        .cloned()
        .map(Arc::new)
        .chain(
            snapshot
                .current
                .iter()
                .filter_map(|(_, c)| c.applied.clone()),
        )
        .chain(
            snapshot
                .current
                .iter()
                .filter_map(|(_, c)| c.in_flight.as_ref().and_then(|o| o.target.clone())),
        )
        // The values an item may hold instead of its applied one.
        .chain(
            snapshot
                .current
                .iter()
                .flat_map(|(_, c)| c.rare.maybe_applied.iter().cloned()),
        )
        .chain(world.items.values().map(|w| w.value.clone()));
    for value in values {
        let key = value.item_ref();
        for dependency in &value.dependencies {
            link(&key, &dependency.requires);
        }
    }
    // Items of a type whose agent stays down hold up what is connected to
    // them like failures do.
    let down = model
        .items
        .keys()
        .chain(snapshot.current.iter().map(|(key, _)| key))
        .chain(world.items.keys())
        .filter(|key| down_types.contains(&**key.item_type()))
        .cloned();
    let mut tainted: BTreeSet<ItemRef> = snapshot
        .current
        .iter()
        .filter(|(key, c)| failed_for_good(snapshot, key, c))
        .map(|(key, _)| key.clone())
        .chain(down)
        .collect();
    let mut frontier: Vec<ItemRef> = tainted.iter().cloned().collect();
    while let Some(key) = frontier.pop() {
        for next in edges.get(&key).into_iter().flatten() {
            if tainted.insert(next.clone()) {
                frontier.push(next.clone());
            }
        }
    }
    tainted
}

/// DESIGN 2: an intended item's `generation` is the generation that last
/// changed its equality-relevant content, by the acknowledged history of
/// the intent.
pub fn check_item_generations(
    snapshot: &TenantSnapshot,
    model: &IntentModel,
) -> Result<(), Violation> {
    if snapshot.record.generation != model.generation {
        return Ok(());
    }
    for (key, entry) in snapshot.intended.iter() {
        let Some(now) = model.items.get(key) else {
            continue;
        };
        let mut changed_at = model.generation;
        for (generation, items) in model.history.range(..model.generation).rev() {
            match items.get(key) {
                Some(then) if then.same_content(now) => changed_at = *generation,
                _ => break,
            }
        }
        if entry.generation != changed_at {
            return fail(
                "an intended item's generation is the one that last changed it",
                format!(
                    "{key} shows generation {}; its content last changed at {changed_at} (tenant generation {})",
                    entry.generation, model.generation
                ),
            );
        }
    }
    Ok(())
}

/// DESIGN 4: the server gives an operation up only for a terminal code or
/// after its type's `max_attempts`; every other failure is retried. An
/// item shown `FAILED` and given up on (`gave_up`, or no retry time) has a
/// terminal last error or has used its attempts. (An item settled since
/// keeps `gave_up` but no error: not checked.)
pub fn check_given_up_for_cause(snapshot: &TenantSnapshot) -> Result<(), Violation> {
    for (key, current) in snapshot.current.iter() {
        let shown_given_up = current.state == ItemState::Failed
            && current.in_flight.is_none()
            && (current.gave_up || current.rare.next_attempt_at_ms.is_none());
        if !shown_given_up {
            continue;
        }
        let terminal = current
            .rare
            .last_error
            .as_ref()
            .is_some_and(|error| error.is_terminal());
        let max_attempts = snapshot
            .item_types
            .spec(key.item_type())
            .map_or(0, |spec| spec.max_attempts);
        let used_up = max_attempts > 0 && current.attempts >= max_attempts;
        if !terminal && !used_up {
            return fail(
                "an operation is given up only for a terminal code or after max_attempts",
                format!(
                    "{key} is {} (gave_up {}) after {} attempt(s) of {max_attempts} allowed, last error {:?}",
                    state_name(current.state),
                    current.gave_up,
                    current.attempts,
                    current.rare.last_error
                ),
            );
        }
    }
    Ok(())
}

/// DESIGN 5: a tenant that is not `Reconciling` is quiescent: nothing can
/// be dispatched. A plan of its graphs made afresh, with the
/// configurators connected now and the wall clock now, has no operation
/// ready (the incremental passes missed no wake-up).
pub fn check_quiescent_has_no_work(
    snapshot: &TenantSnapshot,
    now_ms: u64,
) -> Result<(), Violation> {
    if condition(snapshot, ConditionKind::Reconciling) != Some(false) {
        return Ok(());
    }
    let connected: BTreeSet<&str> = snapshot
        .connected_item_types
        .iter()
        .map(String::as_str)
        .collect();
    let missing: BTreeSet<String> = snapshot
        .item_types
        .specs()
        .map(|spec| spec.item_type.clone())
        .filter(|item_type| !connected.contains(item_type.as_str()))
        .collect();
    let environment = Everything::new(snapshot.item_types.specs(), missing, now_ms);
    let ready = ready_operations(&full_plan(snapshot, &environment));
    if !ready.is_empty() {
        return fail(
            "a tenant that is not Reconciling has nothing to dispatch",
            format!(
                "Reconciling is false ({}), but a full plan has ready operations: {}",
                conditions_text(snapshot),
                ready.join(", ")
            ),
        );
    }
    Ok(())
}

/// The items a full plan of the snapshot's graphs gives an operation or
/// shows waiting (retry times taken as passed, every configurator there).
fn items_a_full_plan_gives_work(snapshot: &TenantSnapshot) -> BTreeSet<ItemRef> {
    let environment = Everything::new(snapshot.item_types.specs(), BTreeSet::new(), u64::MAX);
    let plan = full_plan(snapshot, &environment);
    plan.operations
        .iter()
        .map(|operation| operation.item.clone())
        .chain(plan.waiting.iter().map(|waiting| waiting.item.clone()))
        .collect()
}

/// The operations `plan` has ready, as "kind item".
fn ready_operations(plan: &Plan) -> Vec<String> {
    plan.ready()
        .map(|index| {
            let operation = &plan.operations[index];
            format!("{} {}", operation.kind.as_str(), operation.item)
        })
        .collect()
}

/// A plan of everything in the snapshot's graphs, made afresh.
fn full_plan(snapshot: &TenantSnapshot, environment: &Everything) -> Plan {
    let mut intended = IntendedGraph::default();
    for (_, entry) in snapshot.intended.iter() {
        intended.insert((**entry).clone());
    }
    let mut current = CurrentGraph::default();
    for (key, entry) in snapshot.current.iter() {
        current.insert(key.clone(), (**entry).clone());
    }
    plan_everything(&intended, &current, environment)
}

/// The planner's environment after the run: every configurator connected
/// but those of the agent that stays down.
struct Everything {
    rules: HashMap<String, TypeRules>,
    down_types: BTreeSet<String>,
    now_ms: u64,
}

impl Everything {
    /// The environment of `types` with the configurators of `down_types`
    /// missing, at `now_ms`.
    fn new<'a>(
        types: impl IntoIterator<Item = &'a TypeSpec>,
        down_types: BTreeSet<String>,
        now_ms: u64,
    ) -> Self {
        Self {
            rules: types
                .into_iter()
                .map(|spec| (spec.item_type.clone(), spec.rules()))
                .collect(),
            down_types,
            now_ms,
        }
    }
}

impl PlanEnvironment for Everything {
    fn type_rules(&self, item_type: &str) -> Option<&TypeRules> {
        self.rules.get(item_type)
    }
    fn has_configurator(&self, item_type: &str) -> bool {
        !self.down_types.contains(item_type)
    }
    fn now_ms(&self) -> u64 {
        self.now_ms
    }
}

/// Whether `key`'s operation in flight stays lost after the final phase:
/// its type's agent stays down, or the item is UNKNOWN and relies (by its
/// applied value or its lost operation's target) on an item whose
/// operation stays lost. An UNKNOWN dependency blocks the re-delivery of
/// a dependent's lost operation (DESIGN 4), and one whose agent never
/// comes back is never resolved.
pub fn stays_lost(snapshot: &TenantSnapshot, key: &ItemRef, down_types: &BTreeSet<String>) -> bool {
    let mut seen = BTreeSet::new();
    stays_lost_from(snapshot, key, down_types, &mut seen)
}

fn stays_lost_from(
    snapshot: &TenantSnapshot,
    key: &ItemRef,
    down_types: &BTreeSet<String>,
    seen: &mut BTreeSet<ItemRef>,
) -> bool {
    if !seen.insert(key.clone()) {
        return false;
    }
    let Some(current) = snapshot.current.get(key) else {
        return false;
    };
    if current.in_flight.is_none() {
        return false;
    }
    if down_types.contains(&**key.item_type()) {
        return true;
    }
    if current.state != ItemState::Unknown {
        return false;
    }
    let target = current.in_flight.as_ref().and_then(|o| o.target.as_deref());
    let relied_on: Vec<ItemRef> = current
        .applied
        .as_deref()
        .into_iter()
        .chain(target)
        .flat_map(|value| value.dependencies.iter().map(|d| d.requires.clone()))
        .collect();
    relied_on.iter().any(|required| {
        snapshot
            .current
            .get(required)
            .is_some_and(|r| r.state == ItemState::Unknown)
            && stays_lost_from(snapshot, required, down_types, seen)
    })
}

/// The items a snapshot shows UNKNOWN (an operation whose outcome is lost).
pub fn unknown_items(snapshot: &TenantSnapshot) -> BTreeSet<ItemRef> {
    snapshot
        .current
        .iter()
        .filter(|(_, c)| c.state == ItemState::Unknown)
        .map(|(key, _)| key.clone())
        .collect()
}

/// Whether a quiet tenant still has a retry pending (then it is not
/// quiet yet, only waiting for its backoff).
pub fn retry_pending(snapshot: &TenantSnapshot) -> bool {
    snapshot
        .waiting
        .iter()
        .any(|(_, waiting)| waiting.reason == WaitReason::Backoff)
}

/// A recreate `key` owes in the world (DESIGN 3 rule 4): a
/// `recreate_when_modified` dependency modified since `key` was created,
/// with the modification count it was created under and the count now.
fn owed_recreate<'a>(world: &'a World, key: &ItemRef) -> Option<(&'a ItemRef, u64, u64)> {
    world
        .items
        .get(key)?
        .marks
        .iter()
        .find_map(|(required, mark)| {
            let counter = world.items.get(required).map_or(0, |w| w.modifications);
            (*mark != counter).then_some((required, *mark, counter))
        })
}

/// Checks a tenant that went quiet after the final phase (faults stopped,
/// agents connected and answering DONE): it converged, as far as terminal
/// failures and unsatisfiable dependencies allow, its view is the world's,
/// its conditions say so, and a from-scratch plan has nothing ready.
pub fn check_converged(
    snapshot: &TenantSnapshot,
    world: &World,
    model: &IntentModel,
    scenario: &Scenario,
    now_ms: u64,
) -> Result<(), Violation> {
    let down_types = scenario.down_types();
    for (key, current) in snapshot.current.iter() {
        if current.in_flight.is_some() && !stays_lost(snapshot, key, &down_types) {
            return fail(
                "a quiet tenant has nothing in flight",
                format!(
                    "{key} is {} with an operation in flight: {:?}",
                    state_name(current.state),
                    current.in_flight.as_deref().map(|running| (
                        running.kind,
                        &running.op_id,
                        running.attempt,
                        running.question
                    ))
                ),
            );
        }
    }
    // A failure for good holds up what is connected to it (a dependent's
    // failed Delete blocks its dependencies, a failed Create or Modify
    // blocks its dependents, ...): the items connected to one, through
    // any edge of either graph or the world, are exempt from the checks
    // below. A run without such failures gets the strict checks.
    let tainted = connected_to_failures(snapshot, world, model, &down_types);
    let terminal = |key: &ItemRef| tainted.contains(key);
    // Which intended items must converge: not failed for good, and every
    // dependency satisfiable (it converges, or is an external item that
    // exists, and its predicate holds on its final value).
    let mut expected: BTreeMap<ItemRef, bool> = BTreeMap::new();
    let mut order: Vec<&ItemRef> = model.items.keys().collect();
    order.sort_by_key(|key| scenario.rank(key).unwrap_or(usize::MAX));
    for key in order {
        let item = &model.items[key];
        if item.external {
            continue;
        }
        let satisfiable = !terminal(key)
            && item.dependencies.iter().all(|dependency| {
                let required = &dependency.requires;
                let value = match model.items.get(required) {
                    Some(target) if !target.external => expected
                        .get(required)
                        .copied()
                        .unwrap_or(false)
                        .then_some(&target.properties),
                    _ => world
                        .items
                        .get(required)
                        .filter(|w| w.value.external)
                        .map(|w| &w.value.properties),
                };
                value.is_some_and(|properties| holds(dependency.must_satisfy(), properties))
            });
        expected.insert(key.clone(), satisfiable);
    }
    for (key, must) in &expected {
        if !must {
            continue;
        }
        let intended = &model.items[key];
        let current = snapshot.current.get(key);
        let converged = current.is_some_and(|c| {
            c.state == ItemState::Created
                && c.applied
                    .as_ref()
                    .is_some_and(|applied| applied.same_content(intended))
        });
        if !converged {
            return fail(
                "a quiet tenant converged",
                format!(
                    "{key} can be created (its dependencies hold) but is {} ({})",
                    current.map_or("PENDING", |c| state_name(c.state)),
                    snapshot
                        .waiting
                        .get(key)
                        .map(|w| format!(
                            "waiting {:?}: {}",
                            w.reason,
                            w.blocked_by
                                .iter()
                                .map(|b| format!("{} {}", b.item, b.why))
                                .collect::<Vec<_>>()
                                .join("; ")
                        ))
                        .unwrap_or_else(|| "not waiting".into())
                ),
            );
        }
        if !world
            .items
            .get(key)
            .is_some_and(|w| w.value.same_content(intended))
        {
            return fail(
                "a quiet tenant converged",
                format!(
                    "{key} is CREATED for the server but the world does not have its intended value"
                ),
            );
        }
        if let Some((required, mark, counter)) = owed_recreate(world, key) {
            return fail(
                "an item is recreated when a recreate_when_modified dependency is modified",
                format!(
                    "{key} was created when {required} had {mark} modification(s); it has {counter} now"
                ),
            );
        }
    }
    // What may stay: items that failed for good, intended items that
    // cannot converge, and whatever such items still depend on.
    let mut held: BTreeSet<ItemRef> = tainted.clone();
    for (key, current) in snapshot.current.iter() {
        if failed_for_good(snapshot, key, current) || expected.get(key) == Some(&false) {
            held.insert(key.clone());
        }
    }
    for key in world.items.keys() {
        if expected.get(key) == Some(&false) {
            held.insert(key.clone());
        }
    }
    loop {
        let mut more = Vec::new();
        for key in &held {
            // The server's values of it (applied, and one it may hold
            // instead), and the world's.
            let values = snapshot
                .current
                .get(key)
                .into_iter()
                .flat_map(|c| c.values().cloned())
                .chain(world.items.get(key).map(|w| w.value.clone()));
            for value in values {
                for dependency in &value.dependencies {
                    if !held.contains(&dependency.requires) {
                        more.push(dependency.requires.clone());
                    }
                }
            }
        }
        if more.is_empty() {
            break;
        }
        held.extend(more);
    }
    for (key, existing) in &world.items {
        if existing.value.external || held.contains(key) {
            continue;
        }
        if !model.items.contains_key(key) {
            return fail(
                "a quiet tenant converged",
                format!("{key} is no longer intended but still exists in the world"),
            );
        }
        for dependency in &existing.value.dependencies {
            let value = world.items.get(&dependency.requires);
            if !value.is_some_and(|v| holds(dependency.must_satisfy(), &v.value.properties)) {
                return fail(
                    "a quiet tenant converged",
                    format!(
                        "{key} exists but its dependency on {} does not hold",
                        dependency.requires
                    ),
                );
            }
        }
    }
    for (key, current) in snapshot.current.iter() {
        let external = current.applied.as_ref().is_some_and(|a| a.external);
        if external || held.contains(key) {
            continue;
        }
        if !model.items.contains_key(key) {
            return fail(
                "a quiet tenant converged",
                format!(
                    "{key} is no longer intended but the server still has it as {}",
                    state_name(current.state)
                ),
            );
        }
        if current.is_created() {
            let world_value = world.items.get(key).map(|w| &w.value);
            let same = match (&current.applied, world_value) {
                (Some(applied), Some(value)) => applied.same_content(value),
                _ => false,
            };
            if !same {
                return fail(
                    "the server's view is the world",
                    format!(
                        "the server has {key} as {} but the world has {}",
                        current
                            .applied
                            .as_ref()
                            .map_or("nothing".into(), |a| super::intents::describe_item(a)),
                        world_value.map_or("nothing".into(), |v| super::intents::describe_item(v))
                    ),
                );
            }
        }
    }
    // Conditions of a quiet tenant. With an agent down for good, its items
    // are exempt from the checks above, but Ready still says whether the
    // tenant as a whole converged: from the snapshot, every intended item
    // CREATED at its intended value, its dependencies holding (each one
    // CREATED, or an external item reported, its predicate true on what
    // it shows, as `unconverged_reason` asks of every snapshot: seed
    // 84709, where an external item vanished and its dependents, of the
    // type whose agent is down, wait for their Deletes), and owing no
    // recreate (rule 4: a `recreate_when_modified` dependency modified
    // since it was created; seed 11609, where the recreate waits for a
    // dependent's Delete on the agent that is down), nothing else left,
    // nothing in flight.
    let all_converged = if down_types.is_empty() {
        expected.values().all(|must| *must) && held.is_empty()
    } else {
        let intended_created = model.items.iter().all(|(key, intended)| {
            let created = snapshot.current.get(key).is_some_and(|c| {
                c.state == ItemState::Created
                    && c.applied
                        .as_ref()
                        .is_some_and(|applied| applied.same_content(intended))
            });
            let dependencies_hold = intended.dependencies.iter().all(|dependency| {
                snapshot
                    .current
                    .get(&dependency.requires)
                    .is_some_and(|required| {
                        required.state == ItemState::Created
                            && holds(dependency.must_satisfy(), &required.effective_properties())
                    })
            });
            intended.external
                || (created && dependencies_hold && owed_recreate(world, key).is_none())
        });
        let nothing_else = snapshot.current.iter().all(|(key, c)| {
            c.in_flight.is_none()
                && (model.items.contains_key(key)
                    || c.applied.as_ref().is_some_and(|applied| applied.external))
        });
        intended_created && nothing_else && !any_failed_for_good(snapshot)
    };
    let any_failed = snapshot
        .current
        .iter()
        .any(|(key, c)| failed_for_good(snapshot, key, c));
    let ready = condition(snapshot, ConditionKind::Ready);
    let reconciling = condition(snapshot, ConditionKind::Reconciling);
    let stalled = condition(snapshot, ConditionKind::Stalled);
    if reconciling == Some(true) {
        return fail("a quiet tenant is not Reconciling", "Reconciling is true");
    }
    if ready != Some(all_converged) {
        return fail(
            "a quiet tenant is Ready exactly when it converged",
            format!(
                "Ready is {ready:?} ({}); converged: {all_converged} (held: {held:?})",
                conditions_text(snapshot)
            ),
        );
    }
    if !all_converged && any_failed && stalled != Some(true) {
        let failed: Vec<String> = snapshot
            .current
            .iter()
            .filter(|(key, c)| failed_for_good(snapshot, key, c))
            .map(|(key, c)| {
                format!(
                    "{key} ({} failed: {:?}, attempts {}, next attempt {:?}, intended: {}, waiting: {:?})",
                    c.last_operation.map_or("?", |k| k.as_str()),
                    c.rare.last_error,
                    c.attempts,
                    c.rare.next_attempt_at_ms,
                    model.items.contains_key(key),
                    snapshot.waiting.get(key)
                )
            })
            .collect();
        return fail(
            "a quiet tenant with a terminal failure is Stalled",
            format!(
                "Stalled is {stalled:?} ({}) but {} failed for good",
                conditions_text(snapshot),
                failed.join(", ")
            ),
        );
    }
    if snapshot.record.observed_generation != snapshot.record.generation {
        return fail(
            "a quiet tenant observed its generation",
            format!(
                "observed generation {} of {}",
                snapshot.record.observed_generation, snapshot.record.generation
            ),
        );
    }
    // The incremental passes missed nothing a full plan would do.
    let environment = Everything::new(&scenario.types, down_types.clone(), now_ms);
    let plan = full_plan(snapshot, &environment);
    let ready = ready_operations(&plan);
    if !ready.is_empty() {
        return fail(
            "the incremental planner misses no work",
            format!(
                "the tenant is quiet, but a full plan has ready operations: {}",
                ready.join(", ")
            ),
        );
    }
    if !plan.forget.is_empty() || !plan.settle.is_empty() {
        return fail(
            "the incremental planner misses no work",
            format!(
                "the tenant is quiet, but a full plan forgets {:?} and settles {:?}",
                plan.forget, plan.settle
            ),
        );
    }
    // Every item a full plan finds waiting is shown waiting, and no other.
    let fresh: BTreeSet<&ItemRef> = plan.waiting.iter().map(|waiting| &waiting.item).collect();
    let shown: BTreeSet<&ItemRef> = snapshot.waiting.keys().collect();
    if fresh != shown {
        return fail(
            "a quiet tenant shows waiting the items a full plan finds waiting",
            format!(
                "shown but not planned: {:?}; planned but not shown: {:?}",
                shown
                    .difference(&fresh)
                    .map(|item| (item, snapshot.waiting.get(*item)))
                    .collect::<Vec<_>>(),
                fresh
                    .difference(&shown)
                    .map(|item| plan.waiting.iter().find(|w| &w.item == *item))
                    .collect::<Vec<_>>()
            ),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_retry_wait_follows_each_policy_from_design() {
        let exponential = RetryPolicy::Exponential {
            initial_ms: 100,
            multiplier: 2.0,
            max_ms: 1_000,
        };
        let waits: Vec<u64> = (1..=6)
            .map(|failures| least_retry_wait(&exponential, failures))
            .collect();
        assert_eq!(waits, [100, 200, 400, 800, 1_000, 1_000]);
        let random = RetryPolicy::Random {
            min_ms: 300,
            max_ms: 50,
        };
        assert_eq!(least_retry_wait(&random, 3), 50, "the smaller bound");
        let fixed = RetryPolicy::Static { wait_ms: 700 };
        assert_eq!(least_retry_wait(&fixed, 9), 700);
    }
}
