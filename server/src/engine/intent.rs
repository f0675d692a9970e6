//! SubmitIntent as a pure computation: from the current intended graph and
//! a validated request to the set of changes to store (or a rejection).
//!
//! Ownership rules (DESIGN section 8): a request owns the subgraph `S` it
//! names and every path under it (`""` = the whole graph) and replaces the
//! items listed there. An item with an empty `subgraph` is listed in `S`.
//! Items whose subgraph lies outside `S`, and items already listed outside
//! `S`, are rejected.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::graph::validate::{FieldViolation, ItemPredicates, find_cycle};
use crate::graph::{
    IdentitySharing, IntendedGraph, IntendedItem, Item, ItemRef, subgraph_contains,
};

/// Why a submit is refused; nothing was stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IntentError {
    /// The request is invalid.
    #[error("the request is invalid: {} problem(s), first: {}", violations.len(), violations.first().map(|v| format!("{}: {}", v.field, v.description)).unwrap_or_default())]
    Invalid {
        /// Each problem with its field path.
        violations: Vec<FieldViolation>,
    },
    /// The intent would contain a dependency cycle.
    #[error("the intent has a dependency cycle: {}", cycle.iter().map(ToString::to_string).collect::<Vec<_>>().join(" -> "))]
    DependencyCycle {
        /// The cycle, first item repeated at the end.
        cycle: Vec<ItemRef>,
        /// Field path of the request item that closes the cycle.
        field: String,
    },
    /// An item of the request is already listed in a subgraph the request
    /// does not own.
    #[error(
        "item {item} at {field} is listed in subgraph {subgraph:?}; submit it there, or remove it there first"
    )]
    ItemInOtherSubgraph {
        /// Field path in the request.
        field: String,
        /// The item.
        item: ItemRef,
        /// Where it is listed now.
        subgraph: String,
    },
    /// `expected_generation` did not match.
    #[error(
        "tenant generation is {actual} but expected_generation was {expected}; fetch the graph and resubmit"
    )]
    GenerationMismatch {
        /// What the caller expected.
        expected: u64,
        /// The tenant's generation.
        actual: u64,
    },
    /// A per-tenant limit would be exceeded.
    #[error("{subject}: {description}")]
    Quota {
        /// The limit's name.
        subject: String,
        /// What exceeded it and what to do.
        description: String,
    },
}

/// A SubmitIntent whose items passed validation.
#[derive(Clone, Debug)]
pub struct ValidatedSubmit {
    /// The subgraph the request owns (`""` = whole graph), without
    /// leading or trailing `/`.
    pub subgraph: String,
    /// The items, with their compiled predicates.
    pub items: Vec<(Item, ItemPredicates)>,
    /// Reject unless the tenant's generation is this one.
    pub expected_generation: Option<u64>,
    /// Validate and plan only; store nothing.
    pub dry_run: bool,
}

/// What a submit changes in the intended graph.
#[derive(Clone, Debug, Default)]
pub struct IntentChange {
    /// The tenant generation after the change.
    pub generation: u64,
    /// Entries to store: new items, changed items, relabelled or moved items.
    pub upserts: Vec<IntendedItem>,
    /// Items leaving the intent.
    pub removals: Vec<ItemRef>,
    /// Items whose equality-relevant content changed (added, changed or
    /// removed): they drive the generation and the next plan.
    pub content_changed: BTreeSet<ItemRef>,
}

impl IntentChange {
    /// Whether anything at all is stored.
    pub fn is_empty(&self) -> bool {
        self.upserts.is_empty() && self.removals.is_empty()
    }
}

/// Normalises a subgraph path: no leading or trailing `/`, no empty
/// segments. Returns a description of the problem if it is malformed.
pub fn normalize_subgraph(path: &str) -> Result<String, String> {
    let trimmed = path.trim_matches('/');
    if trimmed.split('/').any(str::is_empty) && !trimmed.is_empty() {
        return Err(format!(
            "subgraph path {path:?} has an empty segment; use names separated by single '/'"
        ));
    }
    if trimmed.chars().any(char::is_control) {
        return Err(format!(
            "subgraph path {path:?} contains control characters"
        ));
    }
    Ok(trimmed.to_string())
}

/// Computes the change a submit makes, or why it is rejected.
pub fn prepare_submit(
    intended: &IntendedGraph,
    generation: u64,
    max_items: usize,
    request: ValidatedSubmit,
) -> Result<IntentChange, IntentError> {
    if let Some(expected) = request.expected_generation
        && expected != generation
    {
        return Err(IntentError::GenerationMismatch {
            expected,
            actual: generation,
        });
    }
    let scope = request.subgraph.clone();
    // Decoded items name their identities by texts of their own: sharing
    // the graph's copies first makes every look-up and comparison below
    // compare pointers, not texts.
    let mut sharing = IdentitySharing::new(intended);
    let items = place_items(intended, &mut sharing, &scope, request.items)?;

    let listed: FxHashMap<ItemRef, usize> = items
        .iter()
        .enumerate()
        .map(|(index, (item, _))| (item.item_ref(), index))
        .collect();
    let removals: Vec<ItemRef> = intended
        .items_under(&scope)
        .filter(|key| !listed.contains_key(*key))
        .cloned()
        .collect();

    let next_generation = generation + 1;
    let mut change = IntentChange {
        generation,
        upserts: Vec::with_capacity(items.len()),
        removals,
        ..IntentChange::default()
    };
    // Gathered, then ordered at once: inserting each into the ordered set
    // would walk it from the top every time.
    let mut content_changed = change.removals.clone();
    let mut added = 0;
    // The intent before the change has no cycle, so a cycle after it runs
    // through an edge the change adds: the search starts from the items
    // whose dependencies are new (a new item, or other targets). A change
    // of values only, the usual one, searches nothing.
    let mut new_edges_from = Vec::new();
    for (item, predicates) in items {
        let key = item.item_ref();
        let existing = intended.get(&key);
        let same_content = existing.is_some_and(|entry| entry.item.same_content(&item));
        let same_everything = same_content && existing.is_some_and(|entry| *entry.item == item);
        if same_everything {
            continue;
        }
        if existing.is_none() {
            added += 1;
        }
        if existing.is_none_or(|entry| !entry.item.required_items().eq(item.required_items())) {
            new_edges_from.push(key.clone());
        }
        let item_generation = match existing {
            Some(entry) if same_content => entry.generation,
            _ => {
                content_changed.push(key);
                next_generation
            }
        };
        change.upserts.push(IntendedItem {
            item: Arc::new(item),
            generation: item_generation,
            predicates: predicates.into(),
        });
    }
    change.content_changed = content_changed.into_iter().collect();
    if !change.content_changed.is_empty() {
        change.generation = next_generation;
    }

    let new_total = intended.len() + added - change.removals.len();
    if new_total > max_items {
        return Err(IntentError::Quota {
            subject: "max_items".into(),
            description: format!(
                "the intent would hold {new_total} items, over the tenant's limit of {max_items}; remove items or raise the tenant's max_items"
            ),
        });
    }
    check_cycles(intended, &change, new_edges_from, &listed)?;
    Ok(change)
}

/// Puts every item in its subgraph (`S` when empty), makes it share the
/// graph's identities, and checks ownership.
fn place_items(
    intended: &IntendedGraph,
    sharing: &mut IdentitySharing<'_>,
    scope: &str,
    items: Vec<(Item, ItemPredicates)>,
) -> Result<Vec<(Item, ItemPredicates)>, IntentError> {
    let mut violations = Vec::new();
    let mut placed = Vec::with_capacity(items.len());
    for (index, (mut item, predicates)) in items.into_iter().enumerate() {
        sharing.share_identities(&mut item);
        match normalize_subgraph(&item.subgraph) {
            Ok(path) if path.is_empty() => item.subgraph = scope.into(),
            Ok(path) => item.subgraph = path.into(),
            Err(problem) => violations.push(FieldViolation::new(
                format!("items[{index}].subgraph"),
                problem,
            )),
        }
        if !subgraph_contains(scope, &item.subgraph) {
            violations.push(FieldViolation::new(
                format!("items[{index}].subgraph"),
                format!(
                    "subgraph {:?} lies outside the submitted subgraph {scope:?}; submit it with its own subgraph or leave it empty",
                    item.subgraph
                ),
            ));
        }
        if let Some(existing) = intended.get(&item.item_ref())
            && !subgraph_contains(scope, &existing.item.subgraph)
        {
            return Err(IntentError::ItemInOtherSubgraph {
                field: format!("items[{index}]"),
                item: item.item_ref(),
                subgraph: existing.item.subgraph.to_string(),
            });
        }
        placed.push((item, predicates));
    }
    if violations.is_empty() {
        Ok(placed)
    } else {
        Err(IntentError::Invalid { violations })
    }
}

/// Rejects a change that would close a dependency cycle in the merged
/// intent, searching from `roots`: the items whose dependencies the change
/// adds (a new cycle runs through a new edge).
fn check_cycles(
    intended: &IntendedGraph,
    change: &IntentChange,
    mut roots: Vec<ItemRef>,
    listed: &FxHashMap<ItemRef, usize>,
) -> Result<(), IntentError> {
    if roots.is_empty() {
        return Ok(());
    }
    roots.sort();
    let upserted: BTreeMap<ItemRef, &IntendedItem> = change
        .upserts
        .iter()
        .map(|entry| (entry.item.item_ref(), entry))
        .collect();
    let removed: BTreeSet<&ItemRef> = change.removals.iter().collect();
    let dependencies_of = |key: &ItemRef| -> Option<Vec<ItemRef>> {
        if removed.contains(key) {
            return None;
        }
        let item = match upserted.get(key) {
            Some(entry) => &entry.item,
            None => &intended.get(key)?.item,
        };
        Some(item.required_items().cloned().collect())
    };
    match find_cycle(roots, dependencies_of) {
        None => Ok(()),
        Some(cycle) => {
            let index = cycle
                .iter()
                .find_map(|key| listed.get(key))
                .copied()
                .unwrap_or(0);
            Err(IntentError::DependencyCycle {
                cycle,
                field: format!("items[{index}].dependencies"),
            })
        }
    }
}

/// Applies a prepared change to the intended graph.
pub fn apply_change(intended: &mut IntendedGraph, change: &IntentChange) {
    for key in &change.removals {
        intended.remove(key);
    }
    for entry in &change.upserts {
        intended.insert(entry.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Dependency;

    fn request(subgraph: &str, items: Vec<Item>) -> ValidatedSubmit {
        crate::engine::testkit::validated_submit(subgraph, items)
    }

    /// The names along a rejected cycle and the field it is reported at.
    fn cycle_of(error: IntentError) -> (Vec<String>, String) {
        match error {
            IntentError::DependencyCycle { cycle, field } => {
                (cycle.iter().map(|r| r.name().to_string()).collect(), field)
            }
            other => panic!("not a cycle: {other:?}"),
        }
    }

    fn item(name: &str, subgraph: &str) -> Item {
        let mut item = Item::new("t", name, Default::default());
        item.subgraph = subgraph.into();
        item
    }

    /// A tenant's intent as the submissions so far left it.
    #[derive(Default)]
    struct Intent {
        graph: IntendedGraph,
        generation: u64,
    }

    impl Intent {
        /// Prepares `req` against the intent (at most 1,000 items) and
        /// applies it.
        fn submit(&mut self, req: ValidatedSubmit) -> Result<IntentChange, IntentError> {
            let change = self.prepare(req)?;
            apply_change(&mut self.graph, &change);
            self.generation = change.generation;
            Ok(change)
        }

        /// Prepares `req` against the intent (at most 1,000 items), leaving
        /// it as it is.
        fn prepare(&self, req: ValidatedSubmit) -> Result<IntentChange, IntentError> {
            prepare_submit(&self.graph, self.generation, 1_000, req)
        }
    }

    #[test]
    fn identical_resubmission_changes_nothing() {
        let mut intent = Intent::default();
        let first = intent
            .submit(request("", vec![item("a", "")]))
            .expect("accepted");
        assert_eq!(first.generation, 1);
        let again = intent
            .submit(request("", vec![item("a", "")]))
            .expect("accepted");
        assert!(again.is_empty());
        assert_eq!(again.generation, 1);
    }

    #[test]
    fn relabelling_stores_the_item_without_a_new_generation() {
        let mut intent = Intent::default();
        intent
            .submit(request("", vec![item("a", "")]))
            .expect("accepted");
        let mut relabelled = item("a", "");
        relabelled.set_label("new");
        let change = intent
            .submit(request("", vec![relabelled]))
            .expect("accepted");
        assert_eq!(change.upserts.len(), 1);
        assert!(change.content_changed.is_empty());
        assert_eq!(change.generation, 1);
    }

    #[test]
    fn a_subgraph_submit_replaces_only_its_own_items() {
        let mut intent = Intent::default();
        intent
            .submit(request(
                "",
                vec![
                    item("root", ""),
                    item("x", "team/a"),
                    item("y", "team/a/deep"),
                ],
            ))
            .expect("accepted");
        let change = intent
            .submit(request("team/a", vec![item("z", "")]))
            .expect("accepted");
        let removed: Vec<String> = change
            .removals
            .iter()
            .map(|r| r.name().to_string())
            .collect();
        assert_eq!(removed, ["x", "y"]);
        assert_eq!(
            intent
                .graph
                .get(&ItemRef::new("t", "z"))
                .map(|e| e.item.subgraph.clone()),
            Some("team/a".into())
        );
        assert!(intent.graph.get(&ItemRef::new("t", "root")).is_some());
    }

    #[test]
    fn items_outside_the_submitted_subgraph_are_rejected() {
        let graph = IntendedGraph::default();
        let error = prepare_submit(
            &graph,
            0,
            1_000,
            request("team/a", vec![item("x", "team/b")]),
        )
        .expect_err("rejected");
        match error {
            IntentError::Invalid { violations } => {
                assert_eq!(violations[0].field, "items[0].subgraph")
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn items_listed_in_another_subgraph_are_rejected() {
        let mut intent = Intent::default();
        intent
            .submit(request("", vec![item("x", "team/b")]))
            .expect("accepted");
        let error = intent
            .prepare(request("team/a", vec![item("x", "")]))
            .expect_err("rejected");
        assert!(
            matches!(error, IntentError::ItemInOtherSubgraph { ref subgraph, .. } if subgraph == "team/b"),
            "{error:?}"
        );
    }

    #[test]
    fn a_cycle_across_subgraphs_is_rejected_and_spelled_out() {
        let mut intent = Intent::default();
        let a = item("a", "one").depends_on(Dependency::on(ItemRef::new("t", "b")));
        intent
            .submit(request("one", vec![a]))
            .expect("dangling dependency accepted");
        let b = item("b", "two").depends_on(Dependency::on(ItemRef::new("t", "a")));
        let error = intent.prepare(request("two", vec![b])).expect_err("cycle");
        let (names, field) = cycle_of(error);
        assert_eq!(names, ["b", "a", "b"]);
        assert_eq!(field, "items[0].dependencies");
    }

    #[test]
    fn a_stale_expected_generation_is_refused() {
        let graph = IntendedGraph::default();
        let mut req = request("", vec![item("a", "")]);
        req.expected_generation = Some(3);
        let error = prepare_submit(&graph, 0, 1_000, req).expect_err("mismatch");
        assert!(matches!(
            error,
            IntentError::GenerationMismatch {
                expected: 3,
                actual: 0
            }
        ));
    }

    #[test]
    fn the_item_limit_is_enforced() {
        let graph = IntendedGraph::default();
        let error = prepare_submit(
            &graph,
            0,
            1,
            request("", vec![item("a", ""), item("b", "")]),
        )
        .expect_err("quota");
        assert!(matches!(error, IntentError::Quota { .. }));
    }

    // Scopes, moves, generations and limits of a submission.

    #[test]
    fn moving_an_item_within_the_scope_keeps_its_generation_and_its_new_listing() {
        let mut intent = Intent::default();
        intent
            .submit(request("team", vec![item("x", "team/a")]))
            .expect("accepted");
        let moved = intent
            .submit(request("team", vec![item("x", "team/b")]))
            .expect("accepted");
        assert!(moved.content_changed.is_empty());
        assert_eq!(moved.generation, 1);
        assert_eq!(moved.upserts.len(), 1);
        assert_eq!(moved.upserts[0].generation, 1);
        // team/a no longer lists it: submitting team/a empty removes nothing.
        let change = intent.submit(request("team/a", vec![])).expect("accepted");
        assert!(change.removals.is_empty(), "{:?}", change.removals);
        // team/b does.
        let change = intent.prepare(request("team/b", vec![])).expect("accepted");
        assert_eq!(change.removals.len(), 1);
    }

    #[test]
    fn a_scoped_submit_leaves_sibling_paths_sharing_its_prefix_alone() {
        let mut intent = Intent::default();
        intent
            .submit(request(
                "",
                vec![
                    item("a", "team/a"),
                    item("b", "team/a b"),
                    item("c", "team/a-b"),
                    item("d", "team/ab/x"),
                    item("e", "team/a/x"),
                ],
            ))
            .expect("accepted");
        let change = intent.prepare(request("team/a", vec![])).expect("accepted");
        let removed: Vec<String> = change
            .removals
            .iter()
            .map(|r| r.name().to_string())
            .collect();
        assert_eq!(removed, ["a", "e"]);
    }

    #[test]
    fn reordered_dependencies_and_new_descriptions_keep_the_generation() {
        let mut intent = Intent::default();
        let first = item("x", "")
            .depends_on(Dependency::on(ItemRef::new("t", "a")))
            .depends_on(Dependency::on(ItemRef::new("t", "b")));
        intent.submit(request("", vec![first])).expect("accepted");
        let again = item("x", "")
            .depends_on(Dependency::on(ItemRef::new("t", "b")).with_description("why"))
            .depends_on(Dependency::on(ItemRef::new("t", "a")));
        let change = intent.submit(request("", vec![again])).expect("accepted");
        assert!(change.content_changed.is_empty());
        assert_eq!(change.generation, 1);
        assert!(change.upserts.iter().all(|e| e.generation == 1));
    }

    #[test]
    fn a_cycle_through_the_existing_intent_of_three_subgraphs_is_rejected() {
        let mut intent = Intent::default();
        let a = item("a", "one").depends_on(Dependency::on(ItemRef::new("t", "b")));
        intent.submit(request("one", vec![a])).expect("accepted");
        let b = item("b", "two").depends_on(Dependency::on(ItemRef::new("t", "c")));
        intent.submit(request("two", vec![b])).expect("accepted");
        let c = item("c", "three").depends_on(Dependency::on(ItemRef::new("t", "a")));
        let error = intent
            .prepare(request("three", vec![c]))
            .expect_err("cycle");
        assert!(
            matches!(error, IntentError::DependencyCycle { .. }),
            "{error:?}"
        );
    }

    #[test]
    fn a_cycle_closed_by_retargeting_an_existing_item_is_rejected_beside_value_changes() {
        // The search starts only from items whose dependencies are new: b
        // (retargeted onto a) must be one, a (a new value on the same
        // edge) need not.
        let mut intent = Intent::default();
        let a = |v: i64| {
            let mut a = item("a", "").depends_on(Dependency::on(ItemRef::new("t", "b")));
            a.properties = serde_json::json!({"v": v}).try_into().expect("an object");
            a
        };
        intent
            .submit(request("", vec![a(1), item("b", "")]))
            .expect("accepted");
        let b_on_a = item("b", "").depends_on(Dependency::on(ItemRef::new("t", "a")));
        let error = intent
            .prepare(request("", vec![a(2), b_on_a]))
            .expect_err("cycle");
        let (names, field) = cycle_of(error);
        assert_eq!(names, ["b", "a", "b"]);
        assert_eq!(field, "items[1].dependencies");
        // New values on the same edges close no cycle.
        let change = intent
            .prepare(request("", vec![a(3), item("b", "")]))
            .expect("accepted");
        assert_eq!(change.upserts.len(), 1);
    }

    #[test]
    fn a_mismatch_is_refused_even_when_the_request_changes_nothing() {
        let mut intent = Intent::default();
        intent
            .submit(request("", vec![item("a", "")]))
            .expect("accepted");
        let mut req = request("", vec![item("a", "")]);
        req.expected_generation = Some(0);
        let error = intent.prepare(req).expect_err("mismatch");
        assert!(matches!(
            error,
            IntentError::GenerationMismatch {
                expected: 0,
                actual: 1
            }
        ));
    }

    #[test]
    fn the_item_limit_counts_what_the_submit_leaves() {
        let mut graph = IntendedGraph::default();
        let change = prepare_submit(
            &graph,
            0,
            2,
            request("", vec![item("a", ""), item("b", "")]),
        )
        .expect("two fit");
        apply_change(&mut graph, &change);
        // Replace b with c: still two.
        prepare_submit(
            &graph,
            change.generation,
            2,
            request("", vec![item("a", ""), item("c", "")]),
        )
        .expect("still two");
    }
}
