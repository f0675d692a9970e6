//! One scenario per planning rule of DESIGN section 3, written as tables:
//! the current graph (created by converging it first), the new intent,
//! scripted configurator outcomes, and the expected operations and states.

use serde_json::json;

use super::{Plan, TypeRules, WaitReason, WaitingItem};
use crate::engine::testkit::{World, external, item, on, parse_ref};
use crate::graph::{Item, ItemState, OperationKind, code};

use OperationKind::{Create, Delete, Modify};

/// A planning scenario.
struct Case {
    /// Items intended and created before the scenario starts.
    current: Vec<Item>,
    /// The intent submitted next.
    intended: Vec<Item>,
    /// Scripted failures: (operation, item, gRPC code).
    failures: Vec<(OperationKind, &'static str, i32)>,
    /// The operations agents run, in order.
    expect: Vec<&'static str>,
}

impl Case {
    fn run(self) -> World {
        let mut world = World::converged(self.current);
        for (kind, identity, code) in self.failures {
            world.fail(kind, identity, code);
        }
        world.intend(self.intended);
        world.run_to_quiescence(20);
        assert_eq!(world.labels(), self.expect, "operations run");
        world
    }
}

fn a() -> Item {
    item("t/a", json!({}))
}
fn b_on_a() -> Item {
    item("t/b", json!({})).depends_on(on("t/a"))
}
fn c_on_b() -> Item {
    item("t/c", json!({})).depends_on(on("t/b"))
}

/// Makes the created item `identity` UNKNOWN (its last outcome lost).
fn make_unknown(world: &mut World, identity: &str) {
    let key = parse_ref(identity);
    let mut unknown = (**world.current.get(&key).expect("the item exists")).clone();
    unknown.state = ItemState::Unknown;
    unknown.unknown_was_created = true;
    world.current.insert(key, unknown);
}

fn state_of(world: &World, identity: &str) -> Option<ItemState> {
    world.current.get(&parse_ref(identity)).map(|c| c.state)
}

// Rule 1 ----------------------------------------------------------------------

#[test]
fn items_are_created_dependencies_first() {
    Case {
        current: vec![],
        intended: vec![c_on_b(), b_on_a(), a()],
        failures: vec![],
        expect: vec!["create t/a", "create t/b", "create t/c"],
    }
    .run();
}

#[test]
fn a_dependent_waits_while_its_dependency_is_missing_and_goes_ahead_when_it_appears() {
    let mut world = World::new();
    world.intend(vec![b_on_a()]);
    world.run_to_quiescence(5);
    assert!(world.labels().is_empty());
    let plan = world.plan();
    assert_eq!(plan.waiting.len(), 1);
    assert_eq!(plan.waiting[0].reason, WaitReason::Dependency);
    assert_eq!(plan.waiting[0].blocked_by[0].item, parse_ref("t/a"));
    assert_eq!(plan.waiting[0].blocked_by[0].why, "missing");

    world.intend(vec![b_on_a(), a()]);
    world.run_to_quiescence(5);
    assert_eq!(world.labels(), ["create t/a", "create t/b"]);
}

#[test]
fn independent_creates_are_ready_together_in_identity_order() {
    let mut world = World::new();
    world.intend(vec![
        item("t/z", json!({})),
        item("t/m", json!({})),
        a(),
        b_on_a(),
    ]);
    let plan = world.plan();
    let ready: Vec<String> = plan
        .ready()
        .map(|i| plan.operations[i].item.to_string())
        .collect();
    assert_eq!(ready, ["t/a", "t/m", "t/z"]);
    let b = plan
        .operations
        .iter()
        .position(|o| o.item == parse_ref("t/b"))
        .expect("b planned");
    let a_index = plan
        .operations
        .iter()
        .position(|o| o.item == parse_ref("t/a"))
        .expect("a planned");
    assert_eq!(plan.operations[b].after, [a_index]);
}

// Rule 2 and 7 ----------------------------------------------------------------

#[test]
fn removed_items_are_deleted_dependents_first() {
    Case {
        current: vec![a(), b_on_a(), c_on_b()],
        intended: vec![],
        failures: vec![],
        expect: vec!["delete t/c", "delete t/b", "delete t/a"],
    }
    .run();
}

#[test]
fn removing_an_item_deletes_its_dependents_first_and_they_stay_pending() {
    let world = Case {
        current: vec![a(), b_on_a(), c_on_b()],
        intended: vec![b_on_a(), c_on_b()],
        failures: vec![],
        expect: vec!["delete t/c", "delete t/b", "delete t/a"],
    }
    .run();
    assert_eq!(state_of(&world, "t/b"), None);
    let plan = world.plan();
    let waiting: Vec<String> = plan.waiting.iter().map(|w| w.item.to_string()).collect();
    assert_eq!(waiting, ["t/b", "t/c"]);
    assert!(
        plan.waiting
            .iter()
            .all(|w| w.reason == WaitReason::Dependency)
    );
}

#[test]
fn a_pass_seeded_with_the_top_of_a_chain_still_sees_the_removal_at_its_bottom() {
    // c on b on a, all created; a leaves the intent. The first pass deletes
    // c; the pass on that result is seeded with c and its waiter b only,
    // and must still see that b goes with a (rule 7), not create c again.
    let mut world = World::converged(vec![a(), b_on_a(), c_on_b()]);
    world.intend(vec![b_on_a(), c_on_b()]);
    let first = world.plan();
    world.absorb(&first);
    let unconverged = first.unconverged.clone();
    let c = parse_ref("t/c");
    world.dispatch(&c, Delete, 0);
    world.finish(&c, Delete);
    let plan = world.plan_seeded(&["t/c", "t/b"], &unconverged);
    let operations = operation_labels(&plan);
    assert_eq!(operations, ["delete t/b", "delete t/a"]);
    let ready: Vec<usize> = plan.ready().collect();
    assert_eq!(ready, [0], "b goes first, a after it");
    let waiting: Vec<String> = plan.waiting.iter().map(|w| w.item.to_string()).collect();
    assert_eq!(
        waiting,
        ["t/b", "t/c"],
        "b and c wait for a to be created again"
    );
}

#[test]
fn a_pass_seeded_elsewhere_keeps_a_modify_waiting_for_a_dependents_pending_delete() {
    // u/d relies on t/a; its intent moves it to w/x, which can never be
    // created (no configurator for w), so u/d is deleted instead (rule 5),
    // and that Delete waits too (none for u). t/a's Modify waits for it
    // (rule 8). A later pass seeded only with a new item on t/a must keep
    // it so, although u/d only needs a plain Modify by itself.
    let mut world = World::converged(vec![
        item("t/a", json!({"v": 1})),
        item("u/d", json!({})).depends_on(on("t/a")),
    ]);
    world.environment.disconnected = ["u".to_owned(), "w".to_owned()].into();
    world.intend(vec![
        item("t/a", json!({"v": 2})),
        item("u/d", json!({})).depends_on(on("w/x")),
        item("w/x", json!({})),
    ]);
    let first = world.plan();
    world.absorb(&first);
    let modify_waits = |plan: &super::Plan| {
        plan.waiting.iter().any(|waiting| {
            waiting.item == parse_ref("t/a")
                && waiting.operation == Modify
                && waiting
                    .blocked_by
                    .iter()
                    .any(|b| b.item == parse_ref("u/d"))
        })
    };
    assert!(modify_waits(&first), "{:?}", first.waiting);
    let mut unconverged = first.unconverged.clone();
    let mut intent: Vec<Item> = world
        .intended
        .iter()
        .map(|(_, entry)| (*entry.item).clone())
        .collect();
    intent.push(item("t/top", json!({})).depends_on(on("t/a")));
    world.intend(intent);
    unconverged.insert(parse_ref("t/top"));
    let plan = world.plan_seeded(&["t/top"], &unconverged);
    assert!(
        plan.ready()
            .all(|index| plan.operations[index].item != parse_ref("t/a"))
    );
    assert!(modify_waits(&plan), "{:?}", plan.waiting);
}

#[test]
fn removing_the_bottom_of_a_four_level_chain_deletes_every_level_and_the_rest_waits() {
    let d_on_c = || item("t/d", json!({})).depends_on(on("t/c"));
    let world = Case {
        current: vec![a(), b_on_a(), c_on_b(), d_on_c()],
        intended: vec![b_on_a(), c_on_b(), d_on_c()],
        failures: vec![],
        expect: vec!["delete t/d", "delete t/c", "delete t/b", "delete t/a"],
    }
    .run();
    for identity in ["t/b", "t/c", "t/d"] {
        assert_eq!(state_of(&world, identity), None, "{identity} waits pending");
    }
}

#[test]
fn retargeting_a_dependency_modifies_the_dependent_before_deleting_the_old_one() {
    // b on a; c exists. b now depends on c instead, and a leaves: modify b
    // (it never goes down), then delete a.
    let b_on_c = || item("t/b", json!({})).depends_on(on("t/c"));
    let world = Case {
        current: vec![a(), item("t/c", json!({})), b_on_a()],
        intended: vec![item("t/c", json!({})), b_on_c()],
        failures: vec![],
        expect: vec!["modify t/b", "delete t/a"],
    }
    .run();
    assert_eq!(state_of(&world, "t/b"), Some(ItemState::Created));
    assert_eq!(state_of(&world, "t/a"), None);
}

/// `t/app` relying on `target`.
fn app_on(target: &str) -> Item {
    item("t/app", json!({})).depends_on(on(target))
}

#[test]
fn a_retargeting_plan_holds_the_modify_alone_and_the_old_dependency_waits_for_it() {
    // The dispatch rounds of `Case` re-plan before every operation, which
    // would hide a plan that also deletes the retargeted item: look at the
    // plan itself.
    let mut world = World::converged(vec![
        app_on("t/old"),
        item("t/old", json!({})),
        item("t/new", json!({})),
        item("t/top", json!({})).depends_on(on("t/app")),
    ]);
    world.intend(vec![
        app_on("t/new"),
        item("t/new", json!({})),
        item("t/top", json!({})).depends_on(on("t/app")),
    ]);
    let plan = world.plan();
    let operations = operation_labels(&plan);
    assert_eq!(
        operations,
        ["modify t/app"],
        "app's dependent top is untouched"
    );
    let waiting: Vec<(String, String)> = plan
        .waiting
        .iter()
        .map(|w| (w.item.to_string(), w.blocked_by[0].item.to_string()))
        .collect();
    assert_eq!(waiting, [("t/old".to_string(), "t/app".to_string())]);
}

#[test]
fn a_periodic_read_of_the_new_dependency_does_not_make_a_retargeting_plan_delete_the_dependent() {
    // Found by the simulator (seed 25651): app moves from old to new
    // while a periodic drift READ of new runs. The READ changes nothing
    // until it reports, so app waits for it and is then modified, as
    // without it; app was deleted (and would have been created again) for
    // the READ's sake.
    let mut world = World::converged(vec![
        app_on("t/old"),
        item("t/old", json!({})),
        item("t/new", json!({})),
    ]);
    world.dispatch(&parse_ref("t/new"), OperationKind::Read, 1);
    world.intend(vec![app_on("t/new"), item("t/new", json!({}))]);
    let plan = world.plan();
    let operations = operation_labels(&plan);
    assert!(operations.is_empty(), "nothing runs yet: {operations:?}");
    let app = plan
        .waiting
        .iter()
        .find(|waiting| waiting.item == parse_ref("t/app"))
        .expect("app waits");
    assert_eq!(
        app.operation, Modify,
        "app waits to be modified, not deleted"
    );
}

#[test]
fn a_retargeted_dependent_whose_new_dependency_is_being_modified_is_deleted_instead() {
    // b moves from a to c while c is modified and a is recreated around
    // c's Modify: b's new dependency is not satisfied now, so b is not
    // modified first (that would wait on c, which waits on a's delete,
    // which would wait on b): b is deleted and created again (rule 7 asks
    // for satisfied dependencies).
    let mut world = World::converged(vec![
        item("t/c", json!({"v": 0})),
        item("t/a", json!({})).depends_on(on("t/c").with_recreate_when_modified(true)),
        b_on_a(),
    ]);
    world.intend(vec![
        item("t/c", json!({"v": 1})),
        item("t/a", json!({})).depends_on(on("t/c").with_recreate_when_modified(true)),
        item("t/b", json!({})).depends_on(on("t/c")),
    ]);
    world.run_to_quiescence(20);
    assert!(world.is_converged(), "{:?}", world.labels());
    assert_eq!(
        world.labels(),
        [
            "delete t/b",
            "delete t/a",
            "modify t/c",
            "create t/a",
            "create t/b"
        ]
    );
}

#[test]
fn a_retargeted_dependent_whose_new_dependency_is_missing_is_deleted_instead() {
    // b moves from a to c, but c does not exist: rule 5 deletes b first.
    let b_on_c = || item("t/b", json!({})).depends_on(on("t/c"));
    let world = Case {
        current: vec![a(), b_on_a()],
        intended: vec![b_on_c()],
        failures: vec![],
        expect: vec!["delete t/b", "delete t/a"],
    }
    .run();
    assert_eq!(state_of(&world, "t/b"), None);
}

// Rule 3 ----------------------------------------------------------------------

#[test]
fn a_changed_item_is_modified_in_place_and_dependents_are_untouched() {
    Case {
        current: vec![item("t/a", json!({"mtu": 1500})), b_on_a()],
        intended: vec![item("t/a", json!({"mtu": 9000})), b_on_a()],
        failures: vec![],
        expect: vec!["modify t/a"],
    }
    .run();
}

#[test]
fn relabelling_or_moving_an_item_runs_no_operation() {
    let mut moved = a();
    moved.subgraph = "elsewhere".into();
    moved.set_label("new");
    Case {
        current: vec![a()],
        intended: vec![moved],
        failures: vec![],
        expect: vec![],
    }
    .run();
}

// Rule 4: recreates -------------------------------------------------------------

fn with_rules(world: &mut World, item_type: &str, rules: TypeRules) {
    world.environment.rules.insert(item_type.into(), rules);
}

#[test]
fn a_change_under_a_recreate_path_recreates_the_item_and_its_dependents() {
    let mut world = World::converged(vec![
        item("vlan/v", json!({"vlan": {"id": 1}})),
        item("t/b", json!({})).depends_on(on("vlan/v")),
        item("t/c", json!({})).depends_on(on("t/b")),
    ]);
    with_rules(
        &mut world,
        "vlan",
        TypeRules {
            recreate_on_change: vec!["/vlan".into()],
            ask_needs_recreate: false,
        },
    );
    world.intend(vec![
        item("vlan/v", json!({"vlan": {"id": 2}})),
        item("t/b", json!({})).depends_on(on("vlan/v")),
        item("t/c", json!({})).depends_on(on("t/b")),
    ]);
    world.run_to_quiescence(10);
    assert_eq!(
        world.labels(),
        [
            "delete t/c",
            "delete t/b",
            "delete vlan/v",
            "create vlan/v",
            "create t/b",
            "create t/c"
        ]
    );
    assert!(world.is_converged());
}

#[test]
fn a_change_outside_the_recreate_paths_is_a_modify() {
    let mut world = World::converged(vec![item(
        "vlan/v",
        json!({"vlan": {"id": 1}, "name": "x"}),
    )]);
    with_rules(
        &mut world,
        "vlan",
        TypeRules {
            recreate_on_change: vec!["/vlan/id".into()],
            ask_needs_recreate: false,
        },
    );
    world.intend(vec![item(
        "vlan/v",
        json!({"vlan": {"id": 1}, "name": "y"}),
    )]);
    world.run_to_quiescence(10);
    assert_eq!(world.labels(), ["modify vlan/v"]);
}

#[test]
fn a_type_with_a_star_recreate_path_is_never_modified_in_place() {
    let mut world = World::converged(vec![item("disk/d", json!({"size": 1}))]);
    with_rules(
        &mut world,
        "disk",
        TypeRules {
            recreate_on_change: vec!["*".into()],
            ask_needs_recreate: false,
        },
    );
    world.intend(vec![item("disk/d", json!({"size": 2}))]);
    world.run_to_quiescence(10);
    assert_eq!(world.labels(), ["delete disk/d", "create disk/d"]);
}

#[test]
fn a_type_that_asks_gets_a_modify_flagged_as_a_question_and_a_yes_recreates() {
    let mut world = World::converged(vec![item("x/a", json!({"v": 1}))]);
    with_rules(
        &mut world,
        "x",
        TypeRules {
            recreate_on_change: vec![],
            ask_needs_recreate: true,
        },
    );
    world.intend(vec![item("x/a", json!({"v": 2}))]);
    let plan = world.plan();
    assert_eq!(plan.operations.len(), 1);
    assert!(plan.operations[0].ask_needs_recreate);

    // The agent answers "yes": the answer is recorded for this generation.
    let key = parse_ref("x/a");
    let mut answered = (**world.current.get(&key).expect("a exists")).clone();
    answered
        .rare
        .update(|rare| rare.needs_recreate_answer = Some((world.generation, true)));
    world.current.insert(key, answered);
    world.run_to_quiescence(10);
    assert_eq!(world.labels(), ["delete x/a", "create x/a"]);
}

#[test]
fn recreate_when_modified_dependents_are_deleted_before_the_modify_and_created_after() {
    let dependent =
        || item("t/b", json!({})).depends_on(on("t/a").with_recreate_when_modified(true));
    Case {
        current: vec![item("t/a", json!({"v": 1})), dependent()],
        intended: vec![item("t/a", json!({"v": 2})), dependent()],
        failures: vec![],
        expect: vec!["delete t/b", "modify t/a", "create t/b"],
    }
    .run();
}

#[test]
fn an_external_item_reported_modified_recreates_dependents_that_ask_for_it() {
    let mut world = World::new();
    world.report_external("ext/e", json!({"v": 1}));
    let external = external("ext/e");
    let dependent =
        item("t/b", json!({})).depends_on(on("ext/e").with_recreate_when_modified(true));
    world.intend(vec![external.clone(), dependent.clone()]);
    world.run_to_quiescence(5);
    assert_eq!(world.labels(), ["create t/b"]);

    // A report marks the external item modified: its counter moves.
    world.mark_modified("ext/e");
    world.run_to_quiescence(5);
    assert_eq!(world.labels(), ["create t/b", "delete t/b", "create t/b"]);
}

// Rule 5 ----------------------------------------------------------------------

#[test]
fn a_modified_item_whose_new_dependency_is_missing_is_deleted_and_waits() {
    let world = Case {
        current: vec![a(), item("t/b", json!({"v": 1}))],
        intended: vec![
            a(),
            item("t/b", json!({"v": 2})).depends_on(on("t/missing")),
        ],
        failures: vec![],
        expect: vec!["delete t/b"],
    }
    .run();
    let plan = world.plan();
    assert_eq!(plan.waiting.len(), 1);
    assert_eq!(plan.waiting[0].item, parse_ref("t/b"));
    assert_eq!(plan.waiting[0].operation, Create);
}

#[test]
fn a_pass_seeded_with_a_removal_deletes_the_dependents_of_what_the_removal_dooms() {
    // b and c exist without dependencies; the intent modifies b onto a and
    // c onto b, so c's Modify waits for b's. Then a leaves the intent: b's
    // Modify is hopeless and b is deleted (rule 5), and so is c's, whose
    // new dependency b goes. A pass seeded with a alone finds b doomed
    // only after it passed c over as "waiting for b's Modify as before";
    // it must still plan c's Delete, as a full plan does (simulator seed
    // 70801: c's Modify went on waiting for a Modify no longer planned,
    // and the tenant went quiet with c's Delete never run).
    let mut world = World::converged(vec![
        a(),
        item("t/b", json!({"v": 1})),
        item("t/c", json!({"v": 1})),
    ]);
    world.intend(vec![
        a(),
        item("t/b", json!({"v": 2})).depends_on(on("t/a")),
        item("t/c", json!({"v": 2})).depends_on(on("t/b")),
    ]);
    let first = world.plan();
    world.absorb(&first);
    assert_eq!(operation_labels(&first), ["modify t/b", "modify t/c"]);
    let mut unconverged = first.unconverged.clone();
    world.intend(vec![
        item("t/b", json!({"v": 2})).depends_on(on("t/a")),
        item("t/c", json!({"v": 2})).depends_on(on("t/b")),
    ]);
    unconverged.insert(parse_ref("t/a"));
    let full = world.plan();
    let seeded = world.plan_seeded_after(&first, &["t/a"], &unconverged);
    assert!(
        operation_labels(&full).contains(&"delete t/c".to_owned()),
        "{:?}",
        operation_labels(&full)
    );
    assert_eq!(operation_labels(&seeded), operation_labels(&full));
}

#[test]
fn a_modified_item_whose_new_dependency_is_created_in_the_same_plan_waits_for_it() {
    Case {
        current: vec![item("t/b", json!({"v": 1}))],
        intended: vec![a(), item("t/b", json!({"v": 2})).depends_on(on("t/a"))],
        failures: vec![],
        expect: vec!["create t/a", "modify t/b"],
    }
    .run();
}

// Rule 6 ----------------------------------------------------------------------

#[test]
fn a_dependent_whose_predicate_fails_for_the_new_value_is_deleted_first_and_recreated_after() {
    let dependent = || item("t/b", json!({})).depends_on(on("t/a").with_must_satisfy("self.up"));
    let world = Case {
        current: vec![item("t/a", json!({"up": true})), dependent()],
        intended: vec![item("t/a", json!({"up": false})), dependent()],
        failures: vec![],
        expect: vec!["delete t/b", "modify t/a"],
    }
    .run();
    let plan = world.plan();
    assert_eq!(plan.waiting[0].item, parse_ref("t/b"));
    assert!(
        plan.waiting[0].blocked_by[0]
            .why
            .starts_with("predicate false")
    );

    let mut world = world;
    world.intend(vec![item("t/a", json!({"up": true})), dependent()]);
    world.run_to_quiescence(5);
    assert_eq!(
        world.labels(),
        ["delete t/b", "modify t/a", "modify t/a", "create t/b"]
    );
}

#[test]
fn a_predicate_changing_together_with_its_dependency_deletes_the_dependent_first() {
    // a holds val 42 and b requires that; both move to 53 at once. b's
    // applied predicate fails for a's new value (rule 6) and its new one
    // fails for a's old value (rule 5): delete b, modify a, create b.
    let dependent = |val: &str| {
        item("t/b", json!({}))
            .depends_on(on("t/a").with_must_satisfy(format!("self.val == \"{val}\"")))
    };
    let world = Case {
        current: vec![item("t/a", json!({"val": "42"})), dependent("42")],
        intended: vec![item("t/a", json!({"val": "53"})), dependent("53")],
        failures: vec![],
        expect: vec!["delete t/b", "modify t/a", "create t/b"],
    }
    .run();
    assert!(world.is_converged());
}

// Rule 8: blocking --------------------------------------------------------------

#[test]
fn a_failed_delete_of_a_dependent_blocks_the_delete_of_its_dependency() {
    let mut world = Case {
        current: vec![a(), b_on_a()],
        intended: vec![],
        failures: vec![(Delete, "t/b", code::UNAVAILABLE)],
        expect: vec!["delete t/b"],
    }
    .run();
    let plan = world.plan();
    let a_wait = plan
        .waiting
        .iter()
        .find(|w| w.item == parse_ref("t/a"))
        .expect("a waits");
    assert_eq!(a_wait.reason, WaitReason::Blocked);
    let b_wait = plan
        .waiting
        .iter()
        .find(|w| w.item == parse_ref("t/b"))
        .expect("b waits");
    assert_eq!(b_wait.reason, WaitReason::Backoff);

    // The block ends when the blocking operation succeeds.
    world.environment.now_ms += 1_000;
    world.run_to_quiescence(5);
    assert_eq!(world.labels(), ["delete t/b", "delete t/b", "delete t/a"]);
}

#[test]
fn a_failed_create_blocks_its_dependents_until_a_retry_succeeds() {
    let mut world = Case {
        current: vec![],
        intended: vec![a(), b_on_a()],
        failures: vec![(Create, "t/a", code::UNAVAILABLE)],
        expect: vec!["create t/a"],
    }
    .run();
    assert_eq!(state_of(&world, "t/a"), Some(ItemState::Failed));
    let plan = world.plan();
    let b_wait = plan
        .waiting
        .iter()
        .find(|w| w.item == parse_ref("t/b"))
        .expect("b waits");
    assert_eq!(b_wait.reason, WaitReason::Dependency);
    assert_eq!(b_wait.blocked_by[0].why, "not created (backoff)");
    world.environment.now_ms += 1_000;
    world.run_to_quiescence(5);
    assert_eq!(world.labels(), ["create t/a", "create t/a", "create t/b"]);
}

#[test]
fn a_terminal_failure_stops_retries_until_the_intent_changes() {
    let mut world = Case {
        current: vec![],
        intended: vec![item("t/a", json!({"v": 1}))],
        failures: vec![(Create, "t/a", code::INVALID_ARGUMENT)],
        expect: vec!["create t/a"],
    }
    .run();
    world.environment.now_ms += 3_600_000;
    world.run_to_quiescence(5);
    assert_eq!(world.labels(), ["create t/a"]);
    assert_eq!(world.plan().waiting[0].reason, WaitReason::TerminalFailure);

    world.intend(vec![item("t/a", json!({"v": 2}))]);
    world.run_to_quiescence(5);
    assert_eq!(world.labels(), ["create t/a", "create t/a"]);
}

#[test]
fn a_dependency_modified_after_a_terminal_modify_does_not_recreate_the_refused_value() {
    // Found by the simulator (seed 46010): b's Modify toward v2 failed for
    // good, then its recreate_when_modified dependency was reported
    // modified. A recreate would delete b and send the refused value again;
    // b stays failed until its intent changes, and then it is recreated.
    let mut world = World::new();
    world.report_external("ext/e", json!({"v": 1}));
    let external = external("ext/e");
    let b = |v: u64| {
        item("t/b", json!({ "v": v })).depends_on(on("ext/e").with_recreate_when_modified(true))
    };
    world.intend(vec![external.clone(), b(1)]);
    world.run_to_quiescence(5);
    world.fail(Modify, "t/b", code::INVALID_ARGUMENT);
    world.intend(vec![external.clone(), b(2)]);
    world.run_to_quiescence(5);
    assert_eq!(world.labels(), ["create t/b", "modify t/b"]);

    world.mark_modified("ext/e");
    world.environment.now_ms += 3_600_000;
    world.run_to_quiescence(5);
    assert_eq!(world.labels(), ["create t/b", "modify t/b"], "no recreate");
    let plan = world.plan();
    assert_eq!(plan.waiting.len(), 1);
    assert_eq!(plan.waiting[0].item, parse_ref("t/b"));
    assert_eq!(plan.waiting[0].reason, WaitReason::TerminalFailure);

    world.intend(vec![external, b(3)]);
    world.run_to_quiescence(5);
    assert_eq!(
        world.labels(),
        ["create t/b", "modify t/b", "delete t/b", "create t/b"]
    );
}

#[test]
fn an_item_failed_for_good_that_a_recreate_below_it_deletes_still_shows_its_failure() {
    // Found by the simulator (seed 46010): the recreate of vlan/v deletes
    // t/b first, whose own Modify had failed for good. Its Delete waits for
    // t's agent; t/b stays failed meanwhile, and says so, which keeps a
    // quiet tenant Stalled.
    let b = |v: u64| item("t/b", json!({ "v": v })).depends_on(on("vlan/v"));
    let mut world = World::converged(vec![item("vlan/v", json!({"vlan": {"id": 1}})), b(1)]);
    with_rules(
        &mut world,
        "vlan",
        TypeRules {
            recreate_on_change: vec!["/vlan".into()],
            ask_needs_recreate: false,
        },
    );
    world.fail(Modify, "t/b", code::INVALID_ARGUMENT);
    world.intend(vec![item("vlan/v", json!({"vlan": {"id": 1}})), b(2)]);
    world.run_to_quiescence(5);
    assert_eq!(world.labels(), ["modify t/b"]);

    world.environment.disconnected.insert("t".into());
    world.intend(vec![item("vlan/v", json!({"vlan": {"id": 2}})), b(2)]);
    world.run_to_quiescence(5);
    assert_eq!(world.labels(), ["modify t/b"], "t/b's Delete waits");
    let plan = world.plan();
    let b_waits = plan
        .waiting
        .iter()
        .find(|w| w.item == parse_ref("t/b"))
        .expect("t/b waits");
    assert_eq!(
        (b_waits.operation, b_waits.reason),
        (Delete, WaitReason::NoConfigurator)
    );
    assert!(
        b_waits
            .blocked_by
            .iter()
            .any(|b| b.why.starts_with("failed terminally")),
        "{b_waits:?}"
    );
}

/// Scripts `kind` on `identity` to fail with a retryable code and no
/// retry left (the executor gives no retry time once `max_attempts` is
/// used up).
fn fails_with_no_retry_left(world: &mut World, kind: OperationKind, identity: &str) {
    let error = crate::graph::OperationError {
        code: code::UNAVAILABLE,
        message: "still down".into(),
    };
    world.script(
        kind,
        identity,
        crate::engine::transition::Completion::Failed {
            error,
            retry_at_ms: None,
        },
    );
}

#[test]
fn a_retryable_failure_past_max_attempts_stops_retries_like_a_terminal_one() {
    // The executor gives no retry time once max_attempts is used up.
    let mut world = World::new();
    world.intend(vec![item("t/a", json!({})), b_on_a()]);
    fails_with_no_retry_left(&mut world, Create, "t/a");
    world.run_to_quiescence(5);
    world.environment.now_ms += 3_600_000;
    world.run_to_quiescence(5);
    assert_eq!(world.labels(), ["create t/a"], "no retry after giving up");
    let plan = world.plan();
    let reasons: Vec<(String, WaitReason)> = plan
        .waiting
        .iter()
        .map(|w| (w.item.to_string(), w.reason))
        .collect();
    assert_eq!(
        reasons,
        [
            ("t/a".to_string(), WaitReason::TerminalFailure),
            ("t/b".to_string(), WaitReason::Dependency)
        ]
    );
    // The code was retryable: the item says its retries ran out, and why
    // the last one failed.
    let why = &plan.waiting[0].blocked_by[0].why;
    assert!(
        why.starts_with("failed terminally: gave up after 1 attempt (the type's max_attempts)")
            && why.contains("still down"),
        "{why}"
    );
}

#[test]
fn a_delete_given_up_on_then_settled_is_not_retried_until_the_intent_changes() {
    // t/a left the intent; its Delete failed past max_attempts. A pass
    // then found the Delete unneeded and settled it (the item shows what
    // it holds). Needed again at the same generation, the Delete is the
    // same operation, given up on: it waits for an intent change (seed
    // 65764: it went out again at once, past max_attempts, over and over).
    let mut world = World::converged(vec![a()]);
    world.intend(vec![]);
    fails_with_no_retry_left(&mut world, Delete, "t/a");
    world.run_to_quiescence(5);
    assert_eq!(world.labels(), ["delete t/a"]);
    let settle = Plan {
        settle: vec![parse_ref("t/a")],
        ..Plan::default()
    };
    crate::engine::transition::apply_bookkeeping(&mut world.current, &settle);
    assert_eq!(state_of(&world, "t/a"), Some(ItemState::Created));
    let plan = world.plan();
    assert_eq!(plan.ready().count(), 0, "no retry: {plan:?}");
    let waits = plan
        .waiting
        .iter()
        .find(|w| w.item == parse_ref("t/a"))
        .expect("t/a waits");
    assert_eq!(
        (waits.operation, waits.reason),
        (Delete, WaitReason::TerminalFailure)
    );
}

#[test]
fn a_modify_waits_for_the_planned_delete_of_a_dependent_that_leaves_the_intent() {
    // b on a; b leaves, a changes: b is not being deleted while a changes.
    let mut world = World::converged(vec![a(), b_on_a()]);
    world.intend(vec![item("t/a", json!({"v": 2}))]);
    let plan = world.plan();
    let ready: Vec<String> = plan
        .ready()
        .map(|index| {
            let operation = &plan.operations[index];
            format!("{} {}", operation.kind.as_str(), operation.item)
        })
        .collect();
    assert_eq!(ready, ["delete t/b"], "modify t/a waits for it");
    world.run_to_quiescence(5);
    assert_eq!(world.labels(), ["delete t/b", "modify t/a"]);
}

#[test]
fn a_create_waits_for_a_failed_modify_of_its_dependency() {
    let mut world = Case {
        current: vec![item("t/a", json!({"v": 1}))],
        intended: vec![item("t/a", json!({"v": 2})), b_on_a()],
        failures: vec![(Modify, "t/a", code::UNAVAILABLE)],
        expect: vec!["modify t/a"],
    }
    .run();
    let plan = world.plan();
    let b_wait = plan
        .waiting
        .iter()
        .find(|w| w.item == parse_ref("t/b"))
        .expect("b waits");
    assert_eq!(b_wait.blocked_by[0].why, "being modified (backoff)");
    world.environment.now_ms += 1_000;
    world.run_to_quiescence(5);
    assert_eq!(world.labels(), ["modify t/a", "modify t/a", "create t/b"]);
}

#[test]
fn a_create_and_a_modify_of_its_dependency_in_one_plan_run_modify_first() {
    Case {
        current: vec![item("t/a", json!({"v": 1}))],
        intended: vec![item("t/a", json!({"v": 2})), b_on_a()],
        failures: vec![],
        expect: vec!["modify t/a", "create t/b"],
    }
    .run();
}

#[test]
fn a_modify_waits_for_operations_in_flight_on_its_dependents() {
    let mut world = World::converged(vec![
        item("t/a", json!({"v": 1})),
        item("t/b", json!({"v": 1})).depends_on(on("t/a")),
    ]);
    world.intend(vec![
        item("t/a", json!({"v": 2})),
        item("t/b", json!({"v": 2})).depends_on(on("t/a")),
    ]);
    // Modify b first and keep it in flight.
    world.strict_order = false;
    let b = parse_ref("t/b");
    world.dispatch(&b, Modify, world.generation);
    let plan = world.plan();
    assert!(
        plan.operations.iter().all(|o| o.item != parse_ref("t/a")),
        "{plan:?}"
    );
    let a_wait = plan
        .waiting
        .iter()
        .find(|w| w.item == parse_ref("t/a"))
        .expect("a waits");
    assert_eq!(a_wait.reason, WaitReason::Blocked);
    assert_eq!(a_wait.blocked_by[0].item, b);
    world.finish(&b, Modify);
    world.run_to_quiescence(5);
    assert_eq!(world.labels(), ["modify t/b", "modify t/a"]);
}

#[test]
fn creates_wait_for_the_plans_deletes_of_the_same_type() {
    let world = Case {
        current: vec![item("port/old", json!({"port": 80}))],
        intended: vec![item("port/new", json!({"port": 80}))],
        failures: vec![],
        expect: vec!["delete port/old", "create port/new"],
    }
    .run();
    assert!(world.is_converged());

    let mut world = World::converged(vec![item("port/old", json!({"port": 80}))]);
    world.intend(vec![item("port/new", json!({"port": 80}))]);
    let plan = world.plan();
    let create = plan
        .operations
        .iter()
        .position(|o| o.kind == Create)
        .expect("create planned");
    let delete = plan
        .operations
        .iter()
        .position(|o| o.kind == Delete)
        .expect("delete planned");
    assert_eq!(plan.predecessors(create).collect::<Vec<_>>(), [delete]);
    // While the delete is in flight, the create still waits.
    let old = parse_ref("port/old");
    world.dispatch(&old, Delete, 0);
    let plan = world.plan();
    assert!(plan.operations.is_empty(), "{plan:?}");
    assert_eq!(
        plan.waiting
            .iter()
            .find(|w| w.item == parse_ref("port/new"))
            .map(|w| w.reason),
        Some(WaitReason::Blocked)
    );
}

#[test]
fn nothing_is_created_against_an_item_planned_for_deletion() {
    let mut world = World::converged(vec![a()]);
    world.intend(vec![item("u/b", json!({})).depends_on(on("t/a"))]);
    world.environment.disconnected.insert("t".into());
    let plan = world.plan();
    assert!(plan.operations.is_empty());
    let b_wait = plan
        .waiting
        .iter()
        .find(|w| w.item == parse_ref("u/b"))
        .expect("b waits");
    assert_eq!(b_wait.reason, WaitReason::Dependency);
    assert_eq!(b_wait.blocked_by[0].why, "planned for deletion");
}

#[test]
fn an_intent_change_supersedes_an_in_flight_operation_with_a_cancel() {
    let mut world = World::new();
    world.intend(vec![item("t/a", json!({"v": 1}))]);
    let a_ref = parse_ref("t/a");
    world.dispatch(&a_ref, Create, world.generation);
    world.intend(vec![item("t/a", json!({"v": 2}))]);
    let plan = world.plan();
    assert_eq!(plan.cancel, std::slice::from_ref(&a_ref));
    assert!(plan.operations.is_empty());
    // The late result is authoritative; the item is then modified.
    world.finish(&a_ref, Create);
    world.run_to_quiescence(5);
    assert_eq!(world.labels(), ["create t/a", "modify t/a"]);
}

#[test]
fn items_without_a_configurator_wait_and_go_ahead_when_one_connects() {
    let mut world = World::new();
    world.environment.disconnected.insert("t".into());
    world.intend(vec![a()]);
    world.run_to_quiescence(5);
    assert_eq!(world.plan().waiting[0].reason, WaitReason::NoConfigurator);
    world.environment.disconnected.clear();
    world.run_to_quiescence(5);
    assert_eq!(world.labels(), ["create t/a"]);
}

#[test]
fn an_unknown_outcome_blocks_the_item_and_its_dependents_but_never_deletes_them() {
    let mut world = World::converged(vec![a(), b_on_a()]);
    make_unknown(&mut world, "t/a");
    world.intend(vec![
        item("t/a", json!({"v": 2})),
        item("t/b", json!({"v": 2})).depends_on(on("t/a")),
    ]);
    let plan = world.plan();
    assert!(plan.operations.is_empty(), "{plan:?}");
    let reasons: Vec<_> = plan
        .waiting
        .iter()
        .map(|w| (w.item.to_string(), w.reason))
        .collect();
    assert_eq!(
        reasons,
        [
            ("t/a".to_string(), WaitReason::UnknownOutcome),
            ("t/b".to_string(), WaitReason::Dependency)
        ]
    );
}

/// The waiting entry of `identity` in `plan`.
fn waiting_entry<'p>(plan: &'p Plan, identity: &str) -> &'p WaitingItem {
    let item = parse_ref(identity);
    plan.waiting
        .iter()
        .find(|waiting| waiting.item == item)
        .unwrap_or_else(|| panic!("{identity} waits: {plan:?}"))
}

#[test]
fn an_unknown_outcome_blocks_a_dependent_whose_modify_drops_the_dependency() {
    // Found by the simulator (seed 1009): b's new intent no longer needs a,
    // but b depends on a until that Modify is done, and a is UNKNOWN.
    let mut world = World::converged(vec![a(), b_on_a()]);
    make_unknown(&mut world, "t/a");
    world.intend(vec![a(), item("t/b", json!({"v": 2}))]);
    let plan = world.plan();
    assert!(plan.operations.is_empty(), "{plan:?}");
    let b = waiting_entry(&plan, "t/b");
    assert_eq!((b.operation, b.reason), (Modify, WaitReason::Blocked));
    assert_eq!(b.blocked_by[0].item, parse_ref("t/a"));
}

#[test]
fn an_unknown_outcome_blocks_the_create_of_a_dependent_that_may_still_exist() {
    // Found by the simulator (seed 95441): b's existence is uncertain, so it
    // is created again, under an intent that no longer needs a. But b may
    // still exist holding its applied value, which relies on a, and a is
    // UNKNOWN: b is a's dependent until that Create is done.
    let mut world = World::converged(vec![a(), b_on_a()]);
    make_unknown(&mut world, "t/a");
    let key = parse_ref("t/b");
    let mut uncertain = (**world.current.get(&key).expect("b exists")).clone();
    uncertain.existence_uncertain = true;
    world.current.insert(key.clone(), uncertain);
    world.intend(vec![a(), item("t/b", json!({"v": 2}))]);
    let plan = world.plan();
    assert!(plan.operations.is_empty(), "{plan:?}");
    let b = waiting_entry(&plan, "t/b");
    assert_eq!((b.operation, b.reason), (Create, WaitReason::Blocked));
    assert_eq!(b.blocked_by[0].item, parse_ref("t/a"));
}

#[test]
fn an_item_whose_create_outcome_is_unknown_waits_to_be_deleted_when_it_leaves_the_intent() {
    // Found by the simulator (seeds 1130, 1196, 1278, 2202): the lost Create
    // may have created the item, so leaving the intent needs a Delete once
    // the outcome is known; the item used to need nothing, and the tenant
    // was Ready meanwhile.
    let mut world = World::new();
    world.intend(vec![a()]);
    world.dispatch(&parse_ref("t/a"), Create, 1);
    let mut lost = (**world.current.get(&parse_ref("t/a")).expect("creating")).clone();
    lost.state = ItemState::Unknown;
    world.current.insert(parse_ref("t/a"), lost);
    world.intend(vec![]);
    let plan = world.plan();
    assert!(plan.operations.is_empty(), "{plan:?}");
    let waiting: Vec<_> = plan
        .waiting
        .iter()
        .map(|w| (w.item.to_string(), w.operation, w.reason))
        .collect();
    assert_eq!(
        waiting,
        [("t/a".to_string(), Delete, WaitReason::UnknownOutcome)]
    );
}

#[test]
fn an_unknown_outcome_blocks_the_delete_of_a_dependent() {
    // Found by the simulator (seed 1009): DESIGN 4 blocks every operation
    // on a dependent of an UNKNOWN item, Deletes included.
    let mut world = World::converged(vec![a(), b_on_a()]);
    make_unknown(&mut world, "t/a");
    world.intend(vec![a()]);
    let plan = world.plan();
    assert!(plan.operations.is_empty(), "{plan:?}");
    let b = plan
        .waiting
        .iter()
        .find(|w| w.item == parse_ref("t/b"))
        .expect("b waits");
    assert_eq!((b.operation, b.reason), (Delete, WaitReason::Blocked));
}

// Rule 9: external items ---------------------------------------------------------

#[test]
fn dependents_of_an_external_item_are_created_when_it_appears() {
    let mut world = World::new();
    world.intend(vec![
        external("ext/e"),
        item("t/b", json!({})).depends_on(on("ext/e")),
    ]);
    world.run_to_quiescence(5);
    assert!(world.labels().is_empty());
    assert_eq!(
        world.plan().waiting[0].blocked_by[0].why,
        "missing (external item not reported)"
    );
    world.report_external("ext/e", json!({}));
    world.run_to_quiescence(5);
    assert_eq!(world.labels(), ["create t/b"]);
}

#[test]
fn when_an_external_item_disappears_auto_deleted_dependents_are_dropped_and_others_deleted() {
    let mut world = World::new();
    world.report_external("ext/e", json!({}));
    let intent = vec![
        external("ext/e"),
        item("t/auto", json!({})).depends_on(on("ext/e").with_auto_deleted_by_external(true)),
        item("t/plain", json!({})).depends_on(on("ext/e")),
        item("t/child", json!({})).depends_on(on("t/auto")),
    ];
    world.intend(intent);
    world.run_to_quiescence(5);
    assert_eq!(
        world.labels(),
        ["create t/auto", "create t/plain", "create t/child"]
    );

    world.remove_external("ext/e");
    world.run_to_quiescence(5);
    assert_eq!(
        world.labels()[3..],
        ["delete t/child", "delete t/plain"],
        "t/auto is dropped without a delete call"
    );
    assert_eq!(state_of(&world, "t/auto"), None);
    assert_eq!(state_of(&world, "t/plain"), None);

    world.report_external("ext/e", json!({}));
    world.run_to_quiescence(5);
    assert_eq!(
        world.labels()[5..],
        ["create t/auto", "create t/plain", "create t/child"]
    );
}

#[test]
fn external_items_are_never_operated_on() {
    let mut world = World::new();
    world.intend(vec![external("ext/e")]);
    world.run_to_quiescence(5);
    world.report_external("ext/e", json!({"a": 1}));
    world.intend(vec![]);
    world.run_to_quiescence(5);
    assert!(world.labels().is_empty());
}

// Rule 10 ----------------------------------------------------------------------

#[test]
fn recreates_cascade_to_dependents_listed_in_other_subgraphs() {
    let mut dependent = b_on_a();
    dependent.subgraph = "other/team".into();
    let mut world = World::converged(vec![item("t/a", json!({"id": 1})), dependent.clone()]);
    with_rules(
        &mut world,
        "t",
        TypeRules {
            recreate_on_change: vec!["/id".into()],
            ask_needs_recreate: false,
        },
    );
    world.intend(vec![item("t/a", json!({"id": 2})), dependent]);
    world.run_to_quiescence(5);
    assert_eq!(
        world.labels(),
        ["delete t/b", "delete t/a", "create t/a", "create t/b"]
    );
}

// Rule 11 and 12 ---------------------------------------------------------------

#[test]
fn planning_is_deterministic() {
    let build = || {
        let mut world = World::converged(vec![a(), b_on_a(), item("t/x", json!({}))]);
        world.intend(vec![
            item("t/a", json!({"v": 1})),
            item("t/y", json!({})),
            c_on_b(),
            b_on_a(),
        ]);
        world
    };
    assert_eq!(build().plan(), build().plan());
}

#[test]
fn equal_graphs_give_an_empty_plan() {
    let world = World::converged(vec![a(), b_on_a(), c_on_b()]);
    let plan =
        crate::engine::plan::plan_everything(&world.intended, &world.current, &world.environment);
    assert!(plan.is_empty(), "{plan:?}");
}

/// The planner finds an item's current dependents by pointer when the
/// current graph names them by the intended graph's own identities (as
/// loading and applying do), and by name otherwise: both ways plan alike,
/// on a graph five levels deep with a diamond, a predicate and
/// recreate-on-modify edges (a recreate takes its current dependents along).
#[test]
fn shared_or_copied_identities_plan_alike() {
    let items = || {
        vec![
            item("t/floor", json!({"v": 0})),
            item("t/base", json!({"v": 0}))
                .depends_on(on("t/floor").with_recreate_when_modified(true)),
            item("t/left", json!({})).depends_on(on("t/base")),
            item("t/middle", json!({})).depends_on(on("t/base")),
            item("t/right", json!({})).depends_on(on("t/base").with_must_satisfy("self.v >= 0")),
            item("t/top", json!({}))
                .depends_on(on("t/left"))
                .depends_on(on("t/right").with_recreate_when_modified(true)),
            item("t/roof", json!({})).depends_on(on("t/top")),
        ]
    };
    let copied = || {
        let mut world = World::new();
        world.intend(items());
        let intended: Vec<Item> = world
            .intended
            .iter()
            .map(|(_, entry)| (*entry.item).clone())
            .collect();
        for mut value in intended {
            // Every identity of the current graph a copy of its own.
            value.identity = value.identity.fresh_copy();
            for dependency in &mut value.dependencies {
                dependency.requires = dependency.requires.fresh_copy();
            }
            let key = value.identity.clone();
            let created = crate::graph::CurrentItem::created(std::sync::Arc::new(value), 1);
            world.current.insert(key, created);
        }
        world.dirty.clear();
        world
    };
    let changes = [
        ("t/floor", json!({"v": 1})),
        ("t/base", json!({"v": 1})),
        ("t/right", json!({"w": 1})),
    ];
    for (change, value) in changes {
        let plans: Vec<Plan> = [World::converged(items()), copied()]
            .into_iter()
            .map(|mut world| {
                let mut changed = items();
                for next in &mut changed {
                    if next.identity == parse_ref(change) {
                        next.properties = serde_json::from_value(value.clone()).expect("an object");
                    }
                }
                world.intend(changed);
                world.plan()
            })
            .collect();
        let summary = |plan: &Plan| {
            let operations: Vec<String> = plan
                .operations
                .iter()
                .map(|op| format!("{} {} after {:?}", op.kind.as_str(), op.item, op.after))
                .collect();
            let waiting: Vec<String> = plan.waiting.iter().map(|w| w.item.to_string()).collect();
            (operations, waiting, plan.examined)
        };
        assert_eq!(summary(&plans[0]), summary(&plans[1]), "changing {change}");
        assert!(
            !plans[0].operations.is_empty(),
            "changing {change} plans work"
        );
    }
}

#[test]
fn a_one_item_change_examines_only_its_neighbourhood() {
    let items: Vec<Item> = (0..2_000)
        .map(|i| {
            let base = item(&format!("t/{i:05}"), json!({"v": 0}));
            if i > 0 {
                base.depends_on(on(&format!("t/{:05}", i - 1)))
            } else {
                base
            }
        })
        .collect();
    let mut world = World::converged(items.clone());
    let mut changed = items;
    changed[1_000].properties.insert("v".into(), json!(1));
    world.intend(changed);
    let plan = world.plan();
    assert_eq!(plan.operations.len(), 1);
    assert!(plan.examined <= 3, "examined {} items", plan.examined);
}

#[test]
fn modifying_a_hub_in_place_examines_only_the_dependents_it_can_affect() {
    // A hub with 500 settled dependents that only need it to exist, one
    // whose predicate reads it and one recreated when it is modified.
    let hub = |mtu: u32| item("net/hub", json!({"mtu": mtu}));
    let plain: Vec<Item> = (0..500)
        .map(|i| item(&format!("port/p{i:03}"), json!({})).depends_on(on("net/hub")))
        .collect();
    let reads = || {
        item("route/reads", json!({}))
            .depends_on(on("net/hub").with_must_satisfy("self.mtu >= 1500"))
    };
    let recreated =
        || item("tunnel/t", json!({})).depends_on(on("net/hub").with_recreate_when_modified(true));
    let mut items = plain.clone();
    items.extend([hub(1500), reads(), recreated()]);
    let mut world = World::converged(items);
    let mut changed = plain;
    changed.extend([hub(9000), reads(), recreated()]);
    world.intend(changed);

    let seeds = std::collections::BTreeSet::from([parse_ref("net/hub")]);
    let plan = world.plan_seeded(&["net/hub"], &seeds);
    assert!(
        plan.examined <= 3,
        "{} items examined for a hub's Modify",
        plan.examined
    );
    world.run_to_quiescence(10);
    assert_eq!(
        world.labels(),
        ["delete tunnel/t", "modify net/hub", "create tunnel/t"],
        "the predicate still holds; the plain dependents need nothing"
    );
    // The pass on the completed Modify, seeded with the hub, likewise.
    let plan = world.plan_seeded(&["net/hub"], &seeds);
    assert!(plan.operations.is_empty(), "{plan:?}");
    assert!(
        plan.examined <= 3,
        "{} items examined after a hub's Modify completed",
        plan.examined
    );
}

#[test]
fn a_hub_leaving_the_intent_before_its_dependents_costs_each_batch_its_own_items() {
    // The hub leaves the intent; its 500 ports stay and go with it (rule
    // 2), then wait to be created again. The pass on a batch of their
    // completed Deletes looks at those ports alone: not at the hub (to a
    // port's Create it is planned for deletion, whatever is planned for
    // it) and, since none of their Creates can run, not at the Deletes of
    // their type still to come (rule 8).
    let port = |i: usize| item(&format!("port/p{i:03}"), json!({})).depends_on(on("net/hub"));
    let mut items: Vec<Item> = (0..500).map(port).collect();
    items.push(item("net/hub", json!({})));
    let mut world = World::converged(items);
    world.intend((0..500).map(port).collect());
    let unconverged = world.plan().unconverged;
    assert_eq!(unconverged.len(), 501, "every port goes with the hub");

    let batch = ["port/p000", "port/p001", "port/p002", "port/p003"];
    for name in batch {
        world.dispatch(&parse_ref(name), Delete, 0);
        world.finish(&parse_ref(name), Delete);
    }
    let plan = world.plan_seeded(&batch, &unconverged);
    assert_eq!(
        plan.operations.len(),
        0,
        "{} items examined, and operations planned again",
        plan.examined
    );
    for name in batch {
        let waiting = plan
            .waiting
            .iter()
            .find(|waiting| waiting.item == parse_ref(name))
            .expect("the port waits to be created again");
        assert_eq!(
            (waiting.operation, waiting.reason),
            (Create, WaitReason::Dependency)
        );
        assert_eq!(waiting.blocked_by[0].item, parse_ref("net/hub"));
        assert_eq!(waiting.blocked_by[0].why, "planned for deletion");
    }
    assert!(
        plan.examined <= batch.len(),
        "{} items examined for a batch of {} Deletes",
        plan.examined,
        batch.len()
    );
}

#[test]
fn a_dependent_dropped_while_its_modify_runs_holds_the_delete_of_its_dependency() {
    // Found by the simulator (seed 2232): a's Modify runs when the external
    // item it goes with vanishes; a is dropped once that Modify reports.
    // Until then, b (which a's values need) may not be deleted.
    let external = external("e/x");
    let a_on = |v: i64| {
        item("t/a", json!({ "v": v }))
            .depends_on(on("e/x").with_auto_deleted_by_external(true))
            .depends_on(on("t/b"))
    };
    let mut world = World::new();
    world.report_external("e/x", json!({}));
    world.intend(vec![external.clone(), item("t/b", json!({})), a_on(1)]);
    world.run_to_quiescence(5);
    world.intend(vec![external, item("t/b", json!({})), a_on(2)]);
    world.dispatch(&parse_ref("t/a"), Modify, 3);
    world.remove_external("e/x");
    world.intend(vec![a_on(2)]);
    let plan = world.plan();
    assert!(plan.operations.is_empty(), "{plan:?}");
    let b = plan
        .waiting
        .iter()
        .find(|w| w.item == parse_ref("t/b"))
        .expect("b's delete waits");
    assert_eq!((b.operation, b.reason), (Delete, WaitReason::Blocked));
    assert_eq!(b.blocked_by[0].item, parse_ref("t/a"));
}

#[test]
fn a_modify_waits_for_a_dependency_that_may_exist_rather_than_deleting_its_item() {
    // Found by the simulator (seed 125101, agents that restart): a's
    // Create was lost with its session and failed when delivered again, so
    // a may exist (the lost delivery may have made it). b's Modify waits
    // for a's next Create; b used to be deleted as if a could never be
    // there (rule 5), though an item of unknown existence never causes a
    // dependent's deletion (DESIGN 4, UNKNOWN).
    let mut world = World::converged(vec![a(), b_on_a()]);
    let mut uncertain = (**world.current.get(&parse_ref("t/a")).expect("a")).clone();
    uncertain.existence_uncertain = true;
    world.current.insert(parse_ref("t/a"), uncertain);
    world.dirty.insert(parse_ref("t/a"));
    world.fail(Create, "t/a", code::UNAVAILABLE);
    world.intend(vec![
        a(),
        item("t/b", json!({"v": 2})).depends_on(on("t/a")),
    ]);
    world.run_to_quiescence(5);
    assert_eq!(world.labels(), ["create t/a"], "b is not deleted");
    let plan = world.plan();
    let b = waiting_entry(&plan, "t/b");
    assert_eq!((b.operation, b.reason), (Modify, WaitReason::Dependency));
    assert_eq!(b.blocked_by[0].why, "not created (backoff)");
    world.environment.now_ms += 1_000;
    world.run_to_quiescence(5);
    assert_eq!(
        world.labels(),
        ["create t/a", "create t/a", "modify t/b"],
        "the retried Create lets b's Modify run"
    );
}

#[test]
fn an_item_whose_existence_is_uncertain_is_created_again_before_anything_is_built_on_it() {
    // Found by the simulator (seeds 48, 1198): a lost Create whose
    // dependency did not hold was recorded as created; its Delete waited,
    // the dependency came back, and a dependent was created on an item
    // that had never existed.
    let mut world = World::converged(vec![a()]);
    let mut uncertain = (**world.current.get(&parse_ref("t/a")).expect("a")).clone();
    uncertain.existence_uncertain = true;
    world.current.insert(parse_ref("t/a"), uncertain);
    world.dirty.insert(parse_ref("t/a"));
    world.intend(vec![a(), b_on_a()]);
    let plan = world.plan();
    assert_eq!(
        planned_labels(&plan),
        ["create t/a", "create t/b"],
        "{plan:?}"
    );
    assert!(runs_after(&plan, "t/b", "t/a"), "b waits for a's Create");
    // Not intended any more: it may exist, so it is deleted.
    world.intend(vec![]);
    assert_eq!(planned_labels(&world.plan()), ["delete t/a"]);
}

/// The operations of a plan as "kind item" labels, in plan order.
/// Whether the first planned operation of `item` runs after an operation
/// of `earlier` (one of its predecessors in the plan).
fn runs_after(plan: &super::Plan, item: &str, earlier: &str) -> bool {
    let (item, earlier) = (parse_ref(item), parse_ref(earlier));
    let index = plan
        .operations
        .iter()
        .position(|operation| operation.item == item)
        .unwrap_or_else(|| panic!("{item} has an operation: {plan:?}"));
    plan.predecessors(index)
        .any(|predecessor| plan.operations[predecessor].item == earlier)
}

fn planned_labels(plan: &super::Plan) -> Vec<String> {
    plan.operations
        .iter()
        .map(|operation| format!("{} {}", operation.kind.as_str(), operation.item))
        .collect()
}

#[test]
fn a_dependency_modified_while_a_create_runs_recreates_the_dependent() {
    // Found by the simulator (seeds 1104, 4156, 5440, 5579): the agent
    // created b, then a was reported modified, then b's DONE arrived
    // (re-sent after a lost outcome). b recorded a's counter at completion
    // and was never recreated; the counter at dispatch errs on the safe side.
    let mut world = World::converged(vec![a()]);
    let b = item("t/b", json!({})).depends_on(on("t/a").with_recreate_when_modified(true));
    world.intend(vec![a(), b]);
    world.dispatch(&parse_ref("t/b"), Create, 2);
    world.mark_modified("t/a");
    world.finish(&parse_ref("t/b"), Create);
    let recorded = world
        .current
        .get(&parse_ref("t/b"))
        .and_then(|b| b.rare.dependency_marks.get(&parse_ref("t/a")).copied());
    assert_eq!(recorded, Some(0), "the counter when the Create was sent");
    assert_eq!(planned_labels(&world.plan()), ["delete t/b", "create t/b"]);
}

#[test]
fn an_item_that_may_hold_an_untied_value_is_deleted_not_dropped_and_holds_its_dependencies() {
    // Found by the simulator (seed 3358): a's Modify toward a value that
    // also needs b and is not auto-deleted by e/x was lost and not sent
    // again. When e/x vanished, a was dropped and b deleted under it,
    // although the agent had applied that Modify.
    let external = external("e/x");
    let tied =
        item("t/a", json!({"v": 1})).depends_on(on("e/x").with_auto_deleted_by_external(true));
    let untied = item("t/a", json!({"v": 2}))
        .depends_on(on("e/x"))
        .depends_on(on("t/b"));
    let mut world = World::new();
    world.report_external("e/x", json!({}));
    world.intend(vec![external, item("t/b", json!({})), tied]);
    world.run_to_quiescence(5);
    let mut a = (**world.current.get(&parse_ref("t/a")).expect("a")).clone();
    a.rare
        .update(|rare| rare.maybe_applied = vec![std::sync::Arc::new(untied)]);
    world.current.insert(parse_ref("t/a"), a);
    world.remove_external("e/x");
    world.intend(vec![]);
    let plan = world.plan();
    assert!(plan.forget.is_empty(), "{plan:?}");
    assert_eq!(planned_labels(&plan), ["delete t/a", "delete t/b"]);
    assert!(runs_after(&plan, "t/b", "t/a"), "b's Delete waits for a's");
}

#[test]
fn an_item_that_may_hold_another_value_than_its_intended_one_is_modified_to_it() {
    // Found by the simulator (seed 5668, agents that restart): a's Modify
    // to v 2 applied, then its agent restarted and forgot the result; sent
    // again, the attempt failed for good, and the intent went back to v 1,
    // the applied value. The item was taken as converged while it held
    // v 2.
    let intended = item("t/a", json!({"v": 1}));
    let lost = item("t/a", json!({"v": 2}));
    let mut world = World::new();
    world.intend(vec![intended]);
    world.run_to_quiescence(5);
    let mut a = (**world.current.get(&parse_ref("t/a")).expect("a")).clone();
    a.rare
        .update(|rare| rare.maybe_applied = vec![std::sync::Arc::new(lost)]);
    world.current.insert(parse_ref("t/a"), a);
    // The failure that left it so is a change of its record: a seed.
    world.dirty.insert(parse_ref("t/a"));
    let plan = world.plan();
    assert_eq!(planned_labels(&plan), ["modify t/a"]);
    world.run_to_quiescence(5);
    assert!(world.is_converged(), "its DONE settles what the item holds");
}

/// Item `index` of a chain, as a reference string.
fn chain_name(index: usize) -> String {
    format!("t/n{index:04}")
}

/// A chain of EVE's benchmark shape, `size` items long: item i depends on
/// items i+1 to i+10; every item has `properties`.
fn eve_chain(size: usize, properties: &serde_json::Value) -> Vec<Item> {
    (0..size)
        .map(|index| {
            (index + 1..(index + 11).min(size)).fold(
                item(&chain_name(index), properties.clone()),
                |value, required| value.depends_on(on(&chain_name(required))),
            )
        })
        .collect()
}

/// Plans the pass on one completion, seeded with the chain items
/// `seeds`, with `unconverged` the items the last plans left unconverged
/// (the seeds themselves when `None`). Asserts the pass stayed local and
/// returns the items of the operations it found ready.
fn ready_after_one_completion(
    world: &World,
    seeds: std::ops::RangeInclusive<usize>,
    unconverged: Option<std::ops::Range<usize>>,
) -> Vec<String> {
    use std::collections::BTreeSet;

    use crate::graph::ItemRef;

    let seed_names: Vec<String> = seeds.clone().map(chain_name).collect();
    let seed_refs: Vec<&str> = seed_names.iter().map(String::as_str).collect();
    let unconverged: BTreeSet<ItemRef> = match unconverged {
        Some(range) => range.map(|index| parse_ref(&chain_name(index))).collect(),
        None => seed_refs.iter().map(|seed| parse_ref(seed)).collect(),
    };
    let plan = world.plan_seeded(&seed_refs, &unconverged);
    assert!(
        plan.examined <= 40,
        "{} items examined for one completion",
        plan.examined
    );
    (0..plan.operations.len())
        .filter(|&index| plan.predecessors(index).next().is_none())
        .map(|index| plan.operations[index].item.to_string())
        .filter(|item| !plan.waiting.iter().any(|w| w.item.to_string() == *item))
        .collect()
}

/// Issue 14: completing an operation costs its direct dependents, not the
/// chain above them. On EVE's benchmark shape (item i depends on items
/// i+1 to i+10), with the bottom half created, the pass after the Create
/// of item k looks at the items it may unblock: its own dependents are
/// planned, and the absent items above them, which still wait for those,
/// are not walked again (their waits are unchanged).
#[test]
fn a_completion_in_a_deep_chain_plans_its_neighbourhood_not_the_chain_above() {
    use crate::graph::CurrentItem;

    let (size, created_from) = (2_000, 1_000);
    let mut world = World::new();
    world.intend(eve_chain(size, &json!({})));
    for index in created_from..size {
        let key = parse_ref(&chain_name(index));
        let entry = world.intended.get(&key).expect("intended").clone();
        world.current.insert(
            key,
            CurrentItem::created(entry.item.clone(), entry.generation),
        );
    }
    // Item 1000 was just created: it and the items waiting for it are the seeds.
    let ready = ready_after_one_completion(&world, created_from - 10..=created_from, None);
    assert_eq!(
        ready,
        [chain_name(created_from - 1)],
        "the next item down is ready"
    );
}

/// Issue 14: the same for a chain being modified. Every item's intent
/// changed (a plain Modify, dependencies first, rule 8); the bottom half
/// is modified already. The pass after the Modify of item k plans its
/// neighbourhood: the items above, which still wait for their own
/// dependencies' Modifies, are not walked again. (Only the seeds count as
/// unconverged: the test environment answers "the Deletes of a type" with
/// every unconverged item of it.)
#[test]
fn a_modify_completion_in_a_deep_chain_plans_its_neighbourhood_not_the_chain_above() {
    use crate::graph::CurrentItem;

    let (size, modified_from) = (2_000, 1_000);
    let mut world = World::new();
    world.intend(eve_chain(size, &json!({ "version": 2 })));
    for (index, old_value) in eve_chain(size, &json!({ "version": 1 }))
        .into_iter()
        .enumerate()
    {
        let key = parse_ref(&chain_name(index));
        let entry = world.intended.get(&key).expect("intended").clone();
        let applied = if index >= modified_from {
            entry.item.clone()
        } else {
            std::sync::Arc::new(old_value)
        };
        world
            .current
            .insert(key, CurrentItem::created(applied, entry.generation));
    }
    let ready = ready_after_one_completion(&world, modified_from - 10..=modified_from, None);
    assert_eq!(
        ready,
        [chain_name(modified_from - 1)],
        "the next item down is ready to be modified"
    );
}

/// Issue 14: the same for a chain being deleted (dependents first, rule
/// 2): the top half is deleted already, and the pass after the Delete of
/// item k plans the items it frees, not the chain below them, although
/// every item below is unconverged (the planner walks upstream through
/// unconverged items to find deletions planned there).
#[test]
fn a_delete_completion_in_a_deep_chain_plans_its_neighbourhood_not_the_chain_below() {
    use crate::graph::CurrentItem;

    let (size, deleted_below) = (2_000, 1_000);
    let mut world = World::new();
    for (index, value) in eve_chain(size, &json!({}))
        .into_iter()
        .enumerate()
        .skip(deleted_below)
    {
        world.current.insert(
            parse_ref(&chain_name(index)),
            CurrentItem::created(std::sync::Arc::new(value), 1),
        );
    }
    // Item 999 was just deleted: it and the items it relied on are the seeds.
    let ready = ready_after_one_completion(
        &world,
        deleted_below - 1..=deleted_below + 9,
        Some(deleted_below..size),
    );
    assert_eq!(
        ready,
        [chain_name(deleted_below)],
        "the next item down is ready to be deleted"
    );
}

#[test]
fn a_modify_that_breaks_the_predicate_of_a_value_a_dependent_may_hold_deletes_it_first() {
    // Found by the simulator with agents that restart (seed 10673): b's
    // lost Modify toward a value that requires `self.up` on a may have
    // applied; a Modify of a into a value without it ran while b stayed.
    let plain = || item("t/b", json!({})).depends_on(on("t/a"));
    let mut world = World::new();
    world.intend(vec![item("t/a", json!({"up": true})), plain()]);
    world.run_to_quiescence(5);
    let mut b = (**world.current.get(&parse_ref("t/b")).expect("b")).clone();
    let guarded = item("t/b", json!({})).depends_on(on("t/a").with_must_satisfy("self.up"));
    b.rare
        .update(|rare| rare.maybe_applied = vec![std::sync::Arc::new(guarded)]);
    world.current.insert(parse_ref("t/b"), b);
    world.intend(vec![item("t/a", json!({"up": false})), plain()]);
    let plan = world.plan();
    assert_eq!(
        planned_labels(&plan),
        ["delete t/b", "modify t/a", "create t/b"],
        "{plan:?}"
    );
    assert!(
        runs_after(&plan, "t/a", "t/b"),
        "a's Modify waits for b's Delete"
    );
}

#[test]
fn a_dependent_whose_delete_failed_for_good_learns_that_its_cause_went() {
    // c on b on a, b requiring `a.up`. a's new intent breaks that
    // predicate: b must go first (rule 6), and c before b. c's Delete
    // fails for good. Then a's intent is taken back. A pass seeded with a
    // finds b settled again, and must walk on to c, which an earlier pass
    // left waiting on its failure: its Delete is needed no more (seed
    // 233954, where nothing planned it again and it showed the failure).
    let b_on_a = || item("t/b", json!({})).depends_on(on("t/a").with_must_satisfy("self.up"));
    let c_on_b = || item("t/c", json!({})).depends_on(on("t/b"));
    let up = || item("t/a", json!({"up": true}));
    let mut world = World::converged(vec![up(), b_on_a(), c_on_b()]);
    world.intend(vec![item("t/a", json!({"up": false})), b_on_a(), c_on_b()]);
    world.fail(Delete, "t/c", code::INVALID_ARGUMENT);
    let first = world.pass();
    assert_eq!(world.labels(), ["delete t/c"], "{:?}", first.operations);
    let failed = world.plan();
    world.absorb(&failed);
    let c_waits = |plan: &super::Plan| {
        plan.waiting
            .iter()
            .find(|waiting| waiting.item == parse_ref("t/c"))
            .map(|waiting| waiting.reason)
    };
    assert_eq!(c_waits(&failed), Some(WaitReason::TerminalFailure));
    let unconverged = failed.unconverged.clone();
    assert!(unconverged.contains(&parse_ref("t/b")));

    world.intend(vec![up(), b_on_a(), c_on_b()]);
    let plan = world.plan_seeded(&["t/a"], &unconverged);
    assert!(
        plan.revised.contains(&parse_ref("t/c")),
        "c's earlier verdict is revised: {:?}",
        plan.revised
    );
    assert_eq!(c_waits(&plan), None, "{:?}", plan.waiting);
    assert!(plan.operations.is_empty(), "{:?}", plan.operations);
}

#[test]
fn an_unknown_item_blocks_a_dependent_through_a_value_it_may_hold() {
    // Found by the simulator with agents that restart (seed 3400): b may
    // hold a value relying on a (a lost Create's, `maybe_applied`) while a
    // is UNKNOWN. b's new intent relies on nothing, and b was created
    // again while a lost operation of a might still change it.
    use crate::graph::{CurrentItem, ItemState};

    let mut world = World::new();
    world.intend(vec![item("t/a", json!({})), item("t/b", json!({"v": 1}))]);
    world.run_to_quiescence(5);
    let a = parse_ref("t/a");
    let unknown_a = CurrentItem {
        state: ItemState::Unknown,
        ..(**world.current.get(&a).expect("a")).clone()
    };
    world.current.insert(a.clone(), unknown_a);
    let relying = item("t/b", json!({"v": 2})).depends_on(on("t/a"));
    let b = CurrentItem {
        existence_uncertain: true,
        ..(**world.current.get(&parse_ref("t/b")).expect("b")).clone()
    }
    .may_also_hold(Some(std::sync::Arc::new(relying)));
    world.current.insert(parse_ref("t/b"), b);
    world.intend(vec![item("t/a", json!({})), item("t/b", json!({"v": 3}))]);
    let plan = world.plan();
    assert!(
        plan.ready()
            .all(|index| plan.operations[index].item != parse_ref("t/b")),
        "nothing of b runs while a is UNKNOWN: {:?}",
        plan.operations
    );
    let b_waits = plan
        .waiting
        .iter()
        .find(|waiting| waiting.item == parse_ref("t/b"))
        .expect("b waits");
    assert!(
        b_waits.blocked_by.iter().any(|blocker| blocker.item == a),
        "b names a: {b_waits:?}"
    );
}

/// "kind item" for each operation of `plan`, in plan order.
fn operation_labels(plan: &Plan) -> Vec<String> {
    plan.operations
        .iter()
        .map(|o| format!("{} {}", o.kind.as_str(), o.item))
        .collect()
}

#[test]
fn a_pass_seeded_elsewhere_sees_the_removal_of_an_item_a_value_a_dependent_may_hold_relies_on() {
    // b holds v 1 on c (its intent) and may hold v 2 on a and c, which a
    // lost Modify may have applied (`maybe_applied`). a leaves the intent:
    // b is retargeted off a (c is satisfied), so b is modified and a's
    // Delete waits for it (rule 7). b's Modify waits for room. Then c's
    // intent changes: c is no longer satisfied now, so b can no longer be
    // retargeted and goes with a (a full plan deletes it). The pass on
    // c's change, seeded with c alone, examines b (a current dependent of
    // c) but never a: the upstream walk follows only b's applied and
    // intended dependencies, not those of the values b may hold.
    let b = || item("t/b", json!({"v": 1})).depends_on(on("t/c"));
    let mut world = World::converged(vec![
        item("t/a", json!({})),
        item("t/c", json!({"v": 1})),
        b(),
    ]);
    let maybe = item("t/b", json!({"v": 2}))
        .depends_on(on("t/a"))
        .depends_on(on("t/c"));
    let mut entry = (**world.current.get(&parse_ref("t/b")).expect("b")).clone();
    entry
        .rare
        .update(|rare| rare.maybe_applied = vec![std::sync::Arc::new(maybe)]);
    world.current.insert(parse_ref("t/b"), entry);
    world.dirty.insert(parse_ref("t/b"));
    world.intend(vec![item("t/c", json!({"v": 1})), b()]);
    let first = world.plan();
    assert_eq!(operation_labels(&first), ["modify t/b"], "{first:?}");
    world.absorb(&first);
    let mut unconverged = first.unconverged.clone();
    assert!(unconverged.contains(&parse_ref("t/a")), "{unconverged:?}");

    world.intend(vec![item("t/c", json!({"v": 2})), b()]);
    unconverged.insert(parse_ref("t/c"));
    let full = world.plan_seeded(&["t/a", "t/b", "t/c"], &unconverged);
    assert!(
        operation_labels(&full).contains(&"delete t/b".to_owned()),
        "a full plan deletes b with a: {:?}",
        operation_labels(&full)
    );
    // Seeded with c (its intent change), or with b too (its Modify taken
    // from the room queue): neither pass looks at a.
    let differing: Vec<(&[&str], Vec<String>)> = [&["t/c"][..], &["t/b", "t/c"][..]]
        .into_iter()
        .map(|seeds| {
            (
                seeds,
                operation_labels(&world.plan_seeded(seeds, &unconverged)),
            )
        })
        .filter(|(_, labels)| *labels != operation_labels(&full))
        .collect();
    assert!(
        differing.is_empty(),
        "seeded passes plan otherwise than a full plan {:?}: {differing:?}",
        operation_labels(&full)
    );
}

// Rules in combination and at depth -----------------------------------------------

/// Asserts that `earlier` ran before `later` in the world's log (the first
/// time each label appears after `from`).
fn ran_before(world: &World, from: usize, earlier: &str, later: &str) {
    let labels = world.labels();
    let position = |label: &str| {
        labels[from..]
            .iter()
            .position(|l| l == label)
            .unwrap_or_else(|| panic!("{label} did not run: {:?}", &labels[from..]))
    };
    assert!(
        position(earlier) < position(later),
        "{earlier} ran after {later}: {:?}",
        &labels[from..]
    );
}

/// Each pair ran in that order, `operations` ran in all, and the world
/// converged.
fn ran_in_order_and_converged(world: &World, pairs: &[(&str, &str)], operations: usize) {
    for (earlier, later) in pairs {
        ran_before(world, 0, earlier, later);
    }
    assert_eq!(world.labels().len(), operations, "{:?}", world.labels());
    assert!(world.is_converged());
}

fn recreate_on(world: &mut World, item_type: &str, path: &str) {
    with_rules(
        world,
        item_type,
        TypeRules {
            recreate_on_change: vec![path.into()],
            ask_needs_recreate: false,
        },
    );
}

fn diamond(d_id: u64) -> Vec<Item> {
    vec![
        item("v/d", json!({"id": d_id})),
        item("t/b", json!({})).depends_on(on("v/d")),
        item("t/c", json!({})).depends_on(on("v/d")),
        item("t/a", json!({}))
            .depends_on(on("t/b"))
            .depends_on(on("t/c")),
        item("t/top", json!({})).depends_on(on("t/a")),
    ]
}

#[test]
fn a_recreate_at_the_bottom_of_a_diamond_cascades_through_every_level() {
    let mut world = World::converged(diamond(1));
    recreate_on(&mut world, "v", "/id");
    world.intend(diamond(2));
    world.run_to_quiescence(20);
    let labels = world.labels();
    assert_eq!(labels.len(), 10, "{labels:?}");
    for (earlier, later) in [
        ("delete t/top", "delete t/a"),
        ("delete t/a", "delete t/b"),
        ("delete t/a", "delete t/c"),
        ("delete t/b", "delete v/d"),
        ("delete t/c", "delete v/d"),
        ("delete v/d", "create v/d"),
        ("create v/d", "create t/b"),
        ("create v/d", "create t/c"),
        ("create t/b", "create t/a"),
        ("create t/c", "create t/a"),
        ("create t/a", "create t/top"),
    ] {
        ran_before(&world, 0, earlier, later);
    }
    assert!(world.is_converged());
}

#[test]
fn recreate_when_modified_cascades_through_a_chain_of_such_dependencies() {
    let chain = |v: u64| {
        vec![
            item("t/a", json!({"v": v})),
            item("t/b", json!({})).depends_on(on("t/a").with_recreate_when_modified(true)),
            item("t/c", json!({})).depends_on(on("t/b").with_recreate_when_modified(true)),
            item("t/d", json!({})).depends_on(on("t/c")),
        ]
    };
    let mut world = World::converged(chain(1));
    world.intend(chain(2));
    world.run_to_quiescence(20);
    assert_eq!(
        world.labels(),
        [
            "delete t/d",
            "delete t/c",
            "delete t/b",
            "modify t/a",
            "create t/b",
            "create t/c",
            "create t/d"
        ]
    );
    assert!(world.is_converged());
    world.run_to_quiescence(5);
    assert_eq!(world.labels().len(), 7, "nothing runs once converged");
}

#[test]
fn a_recreate_when_modified_dependent_above_a_modified_middle_is_recreated_once() {
    // a and b both change in place; c asks to be recreated when b is
    // modified: c goes before b's Modify, which waits for a's, and comes
    // back after it, once.
    let chain = |v: u64| {
        vec![
            item("t/a", json!({"v": v})),
            item("t/b", json!({"v": v})).depends_on(on("t/a")),
            item("t/c", json!({})).depends_on(on("t/b").with_recreate_when_modified(true)),
            item("t/d", json!({})).depends_on(on("t/c")),
        ]
    };
    let mut world = World::converged(chain(1));
    world.intend(chain(2));
    world.run_to_quiescence(20);
    ran_in_order_and_converged(
        &world,
        &[
            ("delete t/d", "delete t/c"),
            ("delete t/c", "modify t/b"),
            ("modify t/a", "modify t/b"),
            ("modify t/b", "create t/c"),
            ("create t/c", "create t/d"),
        ],
        6,
    );
}

#[test]
fn a_predicate_in_the_middle_of_a_chain_takes_the_levels_above_down_first() {
    let chain = |v: u64| {
        vec![
            item("t/a", json!({"v": v})),
            item("t/b", json!({})).depends_on(on("t/a").with_must_satisfy("self.v == 1")),
            item("t/c", json!({})).depends_on(on("t/b")),
            item("t/d", json!({})).depends_on(on("t/c")),
        ]
    };
    let mut world = World::converged(chain(1));
    world.intend(chain(2));
    world.run_to_quiescence(20);
    assert_eq!(
        world.labels(),
        ["delete t/d", "delete t/c", "delete t/b", "modify t/a"]
    );
    let plan = world.plan();
    let waiting: Vec<String> = plan.waiting.iter().map(|w| w.item.to_string()).collect();
    assert_eq!(waiting, ["t/b", "t/c", "t/d"]);

    world.intend(chain(1));
    world.run_to_quiescence(20);
    assert_eq!(
        world.labels()[4..],
        ["modify t/a", "create t/b", "create t/c", "create t/d"]
    );
    assert!(world.is_converged());
}

#[test]
fn a_predicate_on_one_side_of_a_diamond_spares_the_other_side() {
    let shape = |v: u64| {
        vec![
            item("t/d", json!({"v": v})),
            item("t/b", json!({})).depends_on(on("t/d").with_must_satisfy("self.v == 1")),
            item("t/c", json!({})).depends_on(on("t/d")),
            item("t/a", json!({}))
                .depends_on(on("t/b"))
                .depends_on(on("t/c")),
        ]
    };
    let mut world = World::converged(shape(1));
    world.intend(shape(2));
    world.run_to_quiescence(20);
    assert_eq!(world.labels(), ["delete t/a", "delete t/b", "modify t/d"]);
    assert_eq!(state_of(&world, "t/c"), Some(ItemState::Created));
}

#[test]
fn removing_the_bottom_while_the_top_changes_deletes_the_top_without_modifying_it() {
    let mut world = World::converged(vec![
        a(),
        b_on_a(),
        item("t/c", json!({"v": 1})).depends_on(on("t/b")),
    ]);
    world.intend(vec![
        b_on_a(),
        item("t/c", json!({"v": 2})).depends_on(on("t/b")),
    ]);
    world.run_to_quiescence(20);
    assert_eq!(world.labels(), ["delete t/c", "delete t/b", "delete t/a"]);
    let plan = world.plan();
    let waiting: Vec<String> = plan.waiting.iter().map(|w| w.item.to_string()).collect();
    assert_eq!(waiting, ["t/b", "t/c"]);
}

#[test]
fn the_top_of_a_chain_retargeted_off_a_level_that_goes_is_modified_not_deleted() {
    let mut world = World::converged(vec![a(), b_on_a(), c_on_b(), item("t/x", json!({}))]);
    world.intend(vec![
        b_on_a(),
        item("t/c", json!({})).depends_on(on("t/x")),
        item("t/x", json!({})),
    ]);
    world.run_to_quiescence(20);
    assert_eq!(world.labels(), ["modify t/c", "delete t/b", "delete t/a"]);
}

#[test]
fn a_dependency_replaced_by_an_item_of_another_type_is_retargeted_once_the_new_one_exists() {
    let mut world = World::converged(vec![
        item("t/x", json!({})),
        item("t/a", json!({})).depends_on(on("t/x")),
        item("t/top", json!({})).depends_on(on("t/a")),
    ]);
    world.intend(vec![
        item("u/x", json!({})),
        item("t/a", json!({})).depends_on(on("u/x")),
        item("t/top", json!({})).depends_on(on("t/a")),
    ]);
    // The first plan deletes a (its new dependency is not created yet),
    // so top goes first; once u/x exists, a later plan retargets a with a
    // Modify instead (rule 7, judged anew), and top comes back.
    world.run_to_quiescence(20);
    assert_eq!(
        world.labels(),
        [
            "delete t/top",
            "create u/x",
            "modify t/a",
            "delete t/x",
            "create t/top"
        ]
    );
    assert!(world.is_converged());
}

#[test]
fn a_recreate_at_the_bottom_spares_a_top_retargeted_away_from_it() {
    let mut world = World::converged(vec![
        item("v/d", json!({"id": 1})),
        item("t/b", json!({})).depends_on(on("v/d")),
        item("t/a", json!({})).depends_on(on("t/b")),
        item("t/x", json!({})),
    ]);
    recreate_on(&mut world, "v", "/id");
    world.intend(vec![
        item("v/d", json!({"id": 2})),
        item("t/b", json!({})).depends_on(on("v/d")),
        item("t/a", json!({})).depends_on(on("t/x")),
        item("t/x", json!({})),
    ]);
    world.run_to_quiescence(20);
    assert_eq!(
        world.labels(),
        [
            "modify t/a",
            "delete t/b",
            "delete v/d",
            "create v/d",
            "create t/b"
        ]
    );
    assert!(world.is_converged());
}

#[test]
fn an_external_item_at_the_bottom_of_a_chain_takes_it_down_and_brings_it_back() {
    let mut world = World::new();
    world.report_external("ext/e", json!({}));
    let intent = vec![
        external("ext/e"),
        item("t/a", json!({})).depends_on(on("ext/e").with_auto_deleted_by_external(true)),
        b_on_a(),
        c_on_b(),
    ];
    world.intend(intent);
    world.run_to_quiescence(10);
    assert_eq!(world.labels(), ["create t/a", "create t/b", "create t/c"]);

    world.remove_external("ext/e");
    world.run_to_quiescence(10);
    assert_eq!(world.labels()[3..], ["delete t/c", "delete t/b"]);
    assert_eq!(state_of(&world, "t/a"), None);

    world.report_external("ext/e", json!({}));
    world.run_to_quiescence(10);
    assert_eq!(
        world.labels()[5..],
        ["create t/a", "create t/b", "create t/c"]
    );
    assert!(world.is_converged());
}

#[test]
fn an_external_item_modified_under_a_chain_recreates_the_asking_level_and_those_above() {
    let mut world = World::new();
    world.report_external("ext/e", json!({"v": 1}));
    world.intend(vec![
        external("ext/e"),
        item("t/a", json!({})).depends_on(on("ext/e").with_recreate_when_modified(true)),
        b_on_a(),
        c_on_b(),
    ]);
    world.run_to_quiescence(10);
    world.mark_modified("ext/e");
    world.run_to_quiescence(10);
    assert_eq!(
        world.labels()[3..],
        [
            "delete t/c",
            "delete t/b",
            "delete t/a",
            "create t/a",
            "create t/b",
            "create t/c"
        ]
    );
    assert!(world.is_converged());
}

#[test]
fn removing_a_whole_diamond_deletes_the_top_first_and_the_bottom_last() {
    let mut world = World::converged(diamond(1));
    world.intend(vec![]);
    world.run_to_quiescence(20);
    assert_eq!(
        world.labels(),
        [
            "delete t/top",
            "delete t/a",
            "delete t/b",
            "delete t/c",
            "delete v/d"
        ]
    );
}

#[test]
fn removing_one_side_of_a_diamond_takes_the_top_down_and_spares_the_other_side() {
    let mut world = World::converged(diamond(1));
    let mut intent = diamond(1);
    intent.retain(|i| i.item_ref() != parse_ref("t/b"));
    world.intend(intent);
    world.run_to_quiescence(20);
    assert_eq!(world.labels(), ["delete t/top", "delete t/a", "delete t/b"]);
    assert_eq!(state_of(&world, "t/c"), Some(ItemState::Created));
    assert_eq!(state_of(&world, "v/d"), Some(ItemState::Created));
}

#[test]
fn removing_the_bottom_while_the_top_is_being_modified_waits_for_that_modify_then_deletes_top_down()
{
    let chain = |v: u64| {
        vec![
            a(),
            b_on_a(),
            item("t/c", json!({"v": v})).depends_on(on("t/b")),
        ]
    };
    let mut world = World::converged(chain(1));
    world.intend(chain(2));
    let plan = world.plan();
    world.absorb(&plan);
    assert_eq!(planned_labels(&plan), ["modify t/c"]);
    let c = parse_ref("t/c");
    world.dispatch(&c, Modify, world.generation);
    // a leaves the intent while c's Modify runs.
    let mut without_a = chain(2);
    without_a.remove(0);
    world.intend(without_a);
    let plan = world.plan();
    world.absorb(&plan);
    assert!(plan.ready().next().is_none(), "{plan:?}");
    world.finish(&c, Modify);
    world.run_to_quiescence(20);
    assert_eq!(
        world.labels(),
        ["modify t/c", "delete t/c", "delete t/b", "delete t/a"]
    );
}

#[test]
fn a_recreate_in_the_middle_of_a_chain_whose_bottom_is_modified_runs_in_order() {
    let chain = |v: u64, id: u64| {
        vec![
            item("t/a", json!({"v": v})),
            item("v/b", json!({"id": id})).depends_on(on("t/a")),
            item("t/c", json!({})).depends_on(on("v/b")),
            item("t/d", json!({})).depends_on(on("t/c")),
        ]
    };
    let mut world = World::converged(chain(1, 1));
    recreate_on(&mut world, "v", "/id");
    world.intend(chain(2, 2));
    world.run_to_quiescence(20);
    ran_in_order_and_converged(
        &world,
        &[
            ("delete t/d", "delete t/c"),
            ("delete t/c", "delete v/b"),
            ("delete v/b", "modify t/a"),
            ("modify t/a", "create v/b"),
            ("create v/b", "create t/c"),
            ("create t/c", "create t/d"),
        ],
        7,
    );
}

#[test]
fn a_failed_delete_at_the_top_of_a_recreate_cascade_holds_every_level_below() {
    let mut world = World::converged(diamond(1));
    recreate_on(&mut world, "v", "/id");
    world.fail(Delete, "t/top", code::INVALID_ARGUMENT);
    world.intend(diamond(2));
    world.run_to_quiescence(20);
    assert_eq!(world.labels(), ["delete t/top"]);
    let plan = world.plan();
    for identity in ["t/a", "t/b", "t/c", "v/d"] {
        let waiting = waiting_entry(&plan, identity);
        assert_eq!(waiting.operation, Delete, "{identity}: {waiting:?}");
    }
    // A new intent that no longer recreates d lets the cascade go.
    world.intend(diamond(1));
    world.run_to_quiescence(20);
    assert_eq!(world.labels(), ["delete t/top"]);
    assert!(world.is_converged(), "{:?}", world.plan());
}

#[test]
fn an_item_whose_modify_turns_into_a_delete_takes_its_settled_dependents_first() {
    // Only x changed (the pass is seeded with it; d and e are converged):
    // its new dependency is missing, so rule 5 deletes it, and its
    // dependents, two levels of them, go first.
    let shape = |x: Item| {
        vec![
            x,
            item("t/d", json!({})).depends_on(on("t/x")),
            item("t/e", json!({})).depends_on(on("t/d")),
        ]
    };
    let mut world = World::converged(shape(item("t/x", json!({"v": 1}))));
    world.intend(shape(
        item("t/x", json!({"v": 2})).depends_on(on("t/missing")),
    ));
    world.run_to_quiescence(20);
    assert_eq!(world.labels(), ["delete t/e", "delete t/d", "delete t/x"]);
}

#[test]
fn an_item_whose_modify_turns_into_a_delete_for_a_false_predicate_takes_its_dependents_first() {
    let shape = |x: Item| {
        vec![
            item("t/y", json!({"up": false})),
            x,
            item("t/d", json!({})).depends_on(on("t/x")),
            item("t/e", json!({})).depends_on(on("t/d")),
        ]
    };
    let mut world = World::converged(shape(item("t/x", json!({"v": 1}))));
    world.intend(shape(
        item("t/x", json!({"v": 2})).depends_on(on("t/y").with_must_satisfy("self.up")),
    ));
    world.run_to_quiescence(20);
    assert_eq!(world.labels(), ["delete t/e", "delete t/d", "delete t/x"]);
}

#[test]
fn an_item_whose_modify_turns_into_a_delete_for_a_leaving_dependency_takes_its_dependents_first() {
    let shape = |x: Item, with_y: bool| {
        let mut items = vec![
            x,
            item("t/d", json!({})).depends_on(on("t/x")),
            item("t/e", json!({})).depends_on(on("t/d")),
        ];
        if with_y {
            items.push(item("t/y", json!({})));
        }
        items
    };
    let mut world = World::converged(shape(item("t/x", json!({"v": 1})), true));
    world.intend(shape(
        item("t/x", json!({"v": 2})).depends_on(on("t/y")),
        false,
    ));
    world.run_to_quiescence(20);
    // y goes whenever: nothing that exists relies on it.
    assert_eq!(
        world.labels(),
        ["delete t/e", "delete t/y", "delete t/d", "delete t/x"]
    );
}

/// Records that the agent observed `observed` on the created `identity`
/// (its last DONE or READ), as the properties a predicate sees over the
/// applied ones.
fn observe(world: &mut World, identity: &str, observed: serde_json::Value) {
    let key = parse_ref(identity);
    let mut entry = (**world.current.get(&key).expect("the item exists")).clone();
    entry.observed = Some(std::sync::Arc::new(
        crate::graph::Properties::try_from(observed).expect("an object"),
    ));
    world.current.insert(key, entry);
}

/// DESIGN's own predicate: `mtu` is intended, `state` only observed.
fn link_user() -> Item {
    item("t/d", json!({}))
        .depends_on(on("t/x").with_must_satisfy("self.mtu >= 1500 && self.state == \"up\""))
}

#[test]
fn modifying_a_dependency_keeps_a_dependent_whose_predicate_still_holds_on_an_observed_property() {
    // x is up (observed) with mtu 1500; d requires mtu >= 1500 and state
    // up (DESIGN 2's example). The intent raises x's mtu to 9000: the
    // predicate holds for x's new value (mtu 9000, and nothing changes
    // its observed state), so rule 6 does not apply: modify x, leave d.
    let mut world = World::converged(vec![item("t/x", json!({"mtu": 1500})), link_user()]);
    observe(&mut world, "t/x", json!({"mtu": 1500, "state": "up"}));
    world.script(
        Modify,
        "t/x",
        crate::engine::transition::Completion::Done {
            observed: crate::graph::Properties::try_from(json!({"mtu": 9000, "state": "up"})).ok(),
        },
    );
    world.intend(vec![item("t/x", json!({"mtu": 9000})), link_user()]);
    world.run_to_quiescence(10);
    assert_eq!(world.labels(), ["modify t/x"]);
    assert!(world.is_converged());
}

#[test]
fn a_dependent_changed_with_its_dependency_is_modified_when_its_predicate_on_an_observed_property_holds()
 {
    // As above, and d's own value changes too: its Modify waits for x's
    // (rule 8) and then runs; x's new value satisfies d's predicate, so
    // rule 5 does not delete d.
    let mut world = World::converged(vec![item("t/x", json!({"mtu": 1500})), link_user()]);
    observe(&mut world, "t/x", json!({"mtu": 1500, "state": "up"}));
    world.script(
        Modify,
        "t/x",
        crate::engine::transition::Completion::Done {
            observed: crate::graph::Properties::try_from(json!({"mtu": 9000, "state": "up"})).ok(),
        },
    );
    let mut changed_user = link_user();
    changed_user
        .properties
        .insert("v".into(), serde_json::Value::from(2));
    world.intend(vec![item("t/x", json!({"mtu": 9000})), changed_user]);
    world.run_to_quiescence(10);
    assert_eq!(world.labels(), ["modify t/x", "modify t/d"]);
    assert!(world.is_converged());
}
