//! The item types a tenant knows: for each, the spec its configurator
//! declared (stored, so it outlives the session), the planner's rules
//! derived from it, and the epoch of the registration that declared it.
//! One map, so that the spec and the rules cannot disagree.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::spec::TypeSpec;
use crate::engine::plan::TypeRules;

/// A type spec as stored: the spec, the epoch of the registration that
/// declared it, and the agent whose live session held the type when it was
/// stored. No session outlives the process, so the agents a restart finds
/// holding types are announced disconnected (docs/watch.md).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredSpec {
    /// The spec.
    pub spec: TypeSpec,
    /// The epoch.
    pub epoch: u64,
    /// The agent holding the type through a live session; `None` once
    /// that session ended (and in records older than this field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
}

/// One registered item type.
#[derive(Clone, Debug)]
pub struct RegisteredType {
    /// What the configurator declared.
    pub spec: TypeSpec,
    /// The recreate rules the planner uses, derived from `spec`.
    pub rules: TypeRules,
    /// The epoch granted to the registration that declared it.
    pub epoch: u64,
}

/// The registered item types of a tenant, by type name. Cloning is O(1)
/// (snapshots carry a copy); a registration copies on write.
#[derive(Clone, Debug, Default)]
pub struct TypeRegistry {
    types: Arc<HashMap<String, RegisteredType>>,
}

impl TypeRegistry {
    /// Records `spec`, declared by a registration granted `epoch`.
    pub fn insert(&mut self, spec: TypeSpec, epoch: u64) {
        let rules = spec.rules();
        Arc::make_mut(&mut self.types).insert(
            spec.item_type.clone(),
            RegisteredType { spec, rules, epoch },
        );
    }

    /// The type's registration, if any.
    pub fn get(&self, item_type: &str) -> Option<&RegisteredType> {
        self.types.get(item_type)
    }

    /// Puts back what [`Self::get`] gave for `item_type` before a change
    /// (`None`: the type was not registered).
    pub fn restore(&mut self, item_type: &str, previous: Option<RegisteredType>) {
        let types = Arc::make_mut(&mut self.types);
        match previous {
            Some(registered) => {
                types.insert(item_type.to_owned(), registered);
            }
            None => {
                types.remove(item_type);
            }
        }
    }

    /// The type's spec, if registered.
    pub fn spec(&self, item_type: &str) -> Option<&TypeSpec> {
        self.types.get(item_type).map(|registered| &registered.spec)
    }

    /// The type's recreate rules, if registered.
    pub fn rules(&self, item_type: &str) -> Option<&TypeRules> {
        self.types
            .get(item_type)
            .map(|registered| &registered.rules)
    }

    /// The epoch of the type's last registration (0: never registered).
    pub fn epoch(&self, item_type: &str) -> u64 {
        self.types
            .get(item_type)
            .map_or(0, |registered| registered.epoch)
    }

    /// Every registered type's spec.
    pub fn specs(&self) -> impl Iterator<Item = &TypeSpec> {
        self.types.values().map(|registered| &registered.spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_follow_the_last_spec_registered() {
        let mut registry = TypeRegistry::default();
        assert_eq!(registry.epoch("t"), 0);
        assert!(registry.rules("t").is_none());
        registry.insert(TypeSpec::new("t"), 1);
        assert!(
            registry
                .rules("t")
                .is_some_and(|r| r.recreate_on_change.is_empty())
        );
        let mut again = TypeSpec::new("t");
        again.recreate_on_change = vec!["/vlan".into()];
        registry.insert(again, 2);
        assert_eq!(registry.epoch("t"), 2);
        assert_eq!(
            registry.rules("t").map(|r| r.recreate_on_change.clone()),
            Some(vec!["/vlan".to_owned()])
        );
        assert_eq!(registry.specs().count(), 1);
    }
}
