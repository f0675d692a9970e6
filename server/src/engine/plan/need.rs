//! What one item needs on its own, before looking at its neighbours.

use serde_json::Value;

use super::{PlanEnvironment, TypeRules};
use crate::graph::{CurrentGraph, CurrentItem, IntendedItem, Item, ItemSummary, Properties};

/// The operation an item needs by comparing its intended and current values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Need {
    /// Converged (or external, or absent from both graphs).
    Nothing,
    /// Intended, does not exist.
    Create,
    /// Exists, differs, can change in place. `ask`: the type wants to be
    /// asked whether the change needs a recreate first.
    Modify { ask: bool },
    /// Exists, differs in a way that needs Delete + Create.
    Recreate,
    /// Exists, no longer intended.
    Delete,
}

/// Computes what an item needs from its two values alone. The intended
/// item comes with its summary in the intended graph, which answers what
/// would otherwise be read from the item (whether it is external, whether
/// any dependency can recreate it): a converged item whose applied value
/// is the intended one is then decided without reading the value at all.
pub(super) fn own_need(
    intended: Option<(&IntendedItem, ItemSummary)>,
    current: Option<&CurrentItem>,
    current_graph: &CurrentGraph,
    environment: &impl PlanEnvironment,
) -> Need {
    let plain_dependencies = intended.is_some_and(|(_, summary)| summary.plain_dependencies);
    // External items are never operated on: an intended external item, or
    // a reported one nobody intends. A reported item that the intent now
    // manages is taken over (its `external` flag differs: a Modify).
    let intended_external = intended.is_some_and(|(_, summary)| summary.external);
    let intended = intended.map(|(entry, _)| entry);
    let unintended_report = intended.is_none()
        && current
            .and_then(|entry| entry.applied.as_ref())
            .is_some_and(|applied| applied.external);
    if intended_external || unintended_report {
        return Need::Nothing;
    }
    match (intended, current) {
        (None, None) => Need::Nothing,
        (None, Some(current)) => {
            // An operation whose outcome is not known yet (in flight, or
            // UNKNOWN) may have created the item: it must be deleted too,
            // once that outcome is known.
            if current.may_exist() || current.is_busy() {
                Need::Delete
            } else {
                Need::Nothing
            }
        }
        (Some(_), None) => Need::Create,
        (Some(intended), Some(current)) => {
            if !current.may_exist() || current.existence_uncertain {
                return Need::Create;
            }
            if current.applied.is_none() {
                return Need::Modify { ask: false };
            }
            // A `recreate_when_modified` dependency modified since the item
            // was created recreates it, whether or not its intent changed too.
            if !plain_dependencies && dependency_was_modified(intended, current, current_graph) {
                return Need::Recreate;
            }
            // The item may hold a value a lost operation applied
            // (`maybe_applied`): converged only if every value it may hold
            // is the intended one. Otherwise the change from any of them
            // decides (a recreate path changed from one recreates it).
            current
                .values()
                .filter(|value| !value.same_content(&intended.item))
                .map(|value| change_need(value, intended, current, environment))
                .max_by_key(|need| *need == Need::Recreate)
                .unwrap_or(Need::Nothing)
        }
    }
}

/// Modify or Recreate, for an item whose content changed.
fn change_need(
    applied: &Item,
    intended: &IntendedItem,
    current: &CurrentItem,
    environment: &impl PlanEnvironment,
) -> Need {
    let Some(rules) = environment.type_rules(intended.item.item_type()) else {
        return Need::Modify { ask: false };
    };
    if change_hits_recreate_paths(rules, applied, &intended.item) {
        return Need::Recreate;
    }
    if rules.ask_needs_recreate {
        return match current.rare.needs_recreate_answer {
            Some((generation, true)) if generation == intended.generation => Need::Recreate,
            Some((generation, false)) if generation == intended.generation => {
                Need::Modify { ask: false }
            }
            _ => Need::Modify { ask: true },
        };
    }
    Need::Modify { ask: false }
}

/// Whether a property under one of the type's `recreate_on_change` paths
/// differs between the applied and the intended value.
fn change_hits_recreate_paths(rules: &TypeRules, applied: &Item, intended: &Item) -> bool {
    rules.recreate_on_change.iter().any(|path| {
        if path == "*" {
            return true;
        }
        pointer_lookup(&applied.properties, path) != pointer_lookup(&intended.properties, path)
    })
}

/// A `recreate_when_modified` dependency was modified since the item was
/// created: the item's recorded counter differs from the dependency's.
fn dependency_was_modified(
    intended: &IntendedItem,
    current: &CurrentItem,
    current_graph: &CurrentGraph,
) -> bool {
    intended
        .item
        .dependencies
        .iter()
        .filter(|dependency| dependency.recreate_when_modified())
        .any(|dependency| {
            let Some(required) = current_graph.get(&dependency.requires) else {
                return false;
            };
            // Only a dependency the existing item was created (or last
            // modified) under has a mark; one the new intent adds does not
            // recreate it.
            current
                .rare
                .dependency_marks
                .get(&dependency.requires)
                .is_some_and(|&recorded| recorded != required.modifications)
        })
}

/// Looks up a JSON Pointer (RFC 6901) inside an item's properties.
/// The empty pointer and `/` address the whole object's first level poorly,
/// so only pointers that name at least one key are meaningful here.
pub fn pointer_lookup<'a>(properties: &'a Properties, pointer: &str) -> Option<&'a Value> {
    let rest = pointer.strip_prefix('/')?;
    let (first, remainder) = match rest.find('/') {
        Some(split) => (&rest[..split], &rest[split..]),
        None => (rest, ""),
    };
    let key = first.replace("~1", "/").replace("~0", "~");
    let value = properties.get(&key)?;
    if remainder.is_empty() {
        Some(value)
    } else {
        value.pointer(remainder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pointers_reach_nested_values_and_escaped_keys() {
        let properties = json!({"vlan": {"id": 7}, "a/b": 1, "t~x": 2});
        let properties: Properties = serde_json::from_value(properties).expect("an object");
        assert_eq!(pointer_lookup(&properties, "/vlan/id"), Some(&json!(7)));
        assert_eq!(
            pointer_lookup(&properties, "/vlan"),
            Some(&json!({"id": 7}))
        );
        assert_eq!(pointer_lookup(&properties, "/a~1b"), Some(&json!(1)));
        assert_eq!(pointer_lookup(&properties, "/t~0x"), Some(&json!(2)));
        assert_eq!(pointer_lookup(&properties, "/missing"), None);
        assert_eq!(pointer_lookup(&properties, "vlan"), None);
    }
}
