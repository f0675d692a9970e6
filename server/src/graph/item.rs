//! The item model: identities, items, dependencies and their equality.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use super::identity::ItemRef;
pub use super::properties::Properties;
use super::rare_texts::RareTexts;

/// A "must exist" edge from a dependent item to the item it requires.
///
/// 16 bytes: a deep graph holds millions of dependencies, and their texts
/// (a predicate, a description) and flags are nearly always unset, so they
/// live in one optional box.
#[derive(Clone, Debug, PartialEq)]
pub struct Dependency {
    /// The required item.
    pub requires: ItemRef,
    /// The predicate (first), the description (second) and the flags.
    rare: RareTexts<DependencyFlags>,
}

/// The flags of a dependency, both nearly always false.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct DependencyFlags {
    recreate_when_modified: bool,
    auto_deleted_by_external: bool,
}

impl Dependency {
    /// A plain dependency on `requires` with no predicate or flags.
    pub fn on(requires: ItemRef) -> Self {
        Self {
            requires,
            rare: RareTexts::default(),
        }
    }

    /// Optional CEL expression over the required item, bound as `self`.
    /// Empty means the dependency holds as soon as the item is created.
    pub fn must_satisfy(&self) -> &str {
        self.rare.first()
    }

    /// Free text for humans; not part of equality.
    pub fn description(&self) -> &str {
        self.rare.second()
    }

    /// Recreate the dependent whenever the required item is modified.
    pub fn recreate_when_modified(&self) -> bool {
        self.rare.flags().recreate_when_modified
    }

    /// When the required (external) item disappears, the dependent is gone
    /// too: drop it from current state without a Delete call.
    pub fn auto_deleted_by_external(&self) -> bool {
        self.rare.flags().auto_deleted_by_external
    }

    /// Whether the dependency asks nothing of the required item but that it
    /// exists: no predicate, no recreate on modification, not gone with an
    /// external item (what nearly every dependency is; read without
    /// following a pointer when it has no rare texts).
    pub fn asks_only_existence(&self) -> bool {
        self.must_satisfy().is_empty()
            && !self.recreate_when_modified()
            && !self.auto_deleted_by_external()
    }

    /// Sets the predicate (empty: none).
    pub fn set_must_satisfy(&mut self, must_satisfy: impl Into<Box<str>>) {
        self.rare.set_first(must_satisfy);
    }

    /// Sets the description (empty: none).
    pub fn set_description(&mut self, description: impl Into<Box<str>>) {
        self.rare.set_second(description);
    }

    /// Sets [`Self::recreate_when_modified`].
    pub fn set_recreate_when_modified(&mut self, recreate: bool) {
        let flags = self.rare.flags();
        self.rare.set_flags(DependencyFlags {
            recreate_when_modified: recreate,
            ..flags
        });
    }

    /// Sets [`Self::auto_deleted_by_external`].
    pub fn set_auto_deleted_by_external(&mut self, auto_deleted: bool) {
        let flags = self.rare.flags();
        self.rare.set_flags(DependencyFlags {
            auto_deleted_by_external: auto_deleted,
            ..flags
        });
    }

    /// This dependency with the predicate `must_satisfy` (builder style).
    pub fn with_must_satisfy(mut self, must_satisfy: impl Into<Box<str>>) -> Self {
        self.set_must_satisfy(must_satisfy);
        self
    }

    /// This dependency with the description `description` (builder style).
    pub fn with_description(mut self, description: impl Into<Box<str>>) -> Self {
        self.set_description(description);
        self
    }

    /// This dependency with `recreate_when_modified` set (builder style).
    pub fn with_recreate_when_modified(mut self, recreate: bool) -> Self {
        self.set_recreate_when_modified(recreate);
        self
    }

    /// This dependency with `auto_deleted_by_external` set (builder style).
    pub fn with_auto_deleted_by_external(mut self, auto_deleted: bool) -> Self {
        self.set_auto_deleted_by_external(auto_deleted);
        self
    }

    /// Equality for planning purposes: the description does not count.
    fn same_content(&self, other: &Self) -> bool {
        self.requires == other.requires
            && self.must_satisfy() == other.must_satisfy()
            && self.rare.flags() == other.rare.flags()
    }
}

/// The fields of a dependency as stored and shown in JSON.
#[derive(Serialize, Deserialize)]
struct DependencyFields<R, T> {
    requires: R,
    must_satisfy: T,
    description: T,
    recreate_when_modified: bool,
    auto_deleted_by_external: bool,
}

impl Serialize for Dependency {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        DependencyFields {
            requires: &self.requires,
            must_satisfy: self.must_satisfy(),
            description: self.description(),
            recreate_when_modified: self.recreate_when_modified(),
            auto_deleted_by_external: self.auto_deleted_by_external(),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Dependency {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let fields = DependencyFields::<ItemRef, String>::deserialize(deserializer)?;
        Ok(Self::on(fields.requires)
            .with_must_satisfy(fields.must_satisfy)
            .with_description(fields.description)
            .with_recreate_when_modified(fields.recreate_when_modified)
            .with_auto_deleted_by_external(fields.auto_deleted_by_external))
    }
}

/// A configuration item, as intended by a user or as last applied.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Item {
    /// The item's type and name. Shared: the graphs key the item by a
    /// clone of it, and dependencies on the item point at the graph's.
    pub identity: ItemRef,
    /// The item's configuration (a JSON object).
    pub properties: Properties,
    /// Items that must exist (and satisfy predicates) before this one.
    pub dependencies: Vec<Dependency>,
    /// Present only to express an expectation; never operated on.
    pub external: bool,
    /// `/`-separated path of the subgraph that lists the item; empty = root.
    pub subgraph: Box<str>,
    /// The label (first) and the description (second), rarely set.
    texts: RareTexts,
}

/// The fields of an item as stored and shown in JSON.
#[derive(Serialize, Deserialize)]
struct ItemFields<T, P, D, S> {
    item_type: T,
    name: T,
    properties: P,
    dependencies: D,
    external: bool,
    subgraph: S,
    label: S,
    description: S,
}

impl Serialize for Item {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        ItemFields {
            item_type: &**self.item_type(),
            name: &**self.name(),
            properties: &self.properties,
            dependencies: &self.dependencies,
            external: self.external,
            subgraph: &*self.subgraph,
            label: self.label(),
            description: self.description(),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Item {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let fields =
            ItemFields::<Arc<str>, Properties, Vec<Dependency>, String>::deserialize(deserializer)?;
        let mut item = Self {
            identity: ItemRef::from_parts(fields.item_type, fields.name),
            properties: fields.properties,
            dependencies: fields.dependencies,
            external: fields.external,
            subgraph: fields.subgraph.into(),
            texts: RareTexts::default(),
        };
        item.set_label(fields.label);
        item.set_description(fields.description);
        Ok(item)
    }
}

impl Item {
    /// A non-external item with the given identity and properties.
    pub fn new(item_type: impl AsRef<str>, name: impl AsRef<str>, properties: Properties) -> Self {
        Self {
            properties,
            ..Self::identified(ItemRef::new(item_type, name))
        }
    }

    /// An empty, non-external item with identity `identity`.
    pub fn identified(identity: ItemRef) -> Self {
        Self {
            identity,
            ..Self::default()
        }
    }

    /// Short human label; not part of equality.
    pub fn label(&self) -> &str {
        self.texts.first()
    }

    /// Free text; not part of equality.
    pub fn description(&self) -> &str {
        self.texts.second()
    }

    /// This item with the label `label` (builder style).
    pub fn with_label(mut self, label: impl Into<Box<str>>) -> Self {
        self.set_label(label);
        self
    }

    /// This item with the description `description` (builder style).
    pub fn with_description(mut self, description: impl Into<Box<str>>) -> Self {
        self.set_description(description);
        self
    }

    /// Sets the label (empty: none).
    pub fn set_label(&mut self, label: impl Into<Box<str>>) {
        self.texts.set_first(label);
    }

    /// Sets the description (empty: none).
    pub fn set_description(&mut self, description: impl Into<Box<str>>) {
        self.texts.set_second(description);
    }

    /// The item type; together with the name the item's identity.
    pub fn item_type(&self) -> &Arc<str> {
        self.identity.item_type()
    }

    /// The item name.
    pub fn name(&self) -> &Arc<str> {
        self.identity.name()
    }

    /// The item's identity (a clone of the shared one).
    pub fn item_ref(&self) -> ItemRef {
        self.identity.clone()
    }

    /// Adds a dependency (builder style, for tests and tools).
    pub fn depends_on(mut self, dependency: Dependency) -> Self {
        self.dependencies.push(dependency);
        self
    }

    /// The identities this item requires, in declaration order.
    pub fn required_items(&self) -> impl Iterator<Item = &ItemRef> {
        self.dependencies.iter().map(|d| &d.requires)
    }

    /// The dependency on `target`, if any.
    pub fn dependency_on(&self, target: &ItemRef) -> Option<&Dependency> {
        self.dependencies.iter().find(|d| &d.requires == target)
    }

    /// The dependency on `target`, looked for first at `index` (where a
    /// value with the same dependencies in the same order has it), then
    /// everywhere.
    pub fn dependency_on_near(&self, target: &ItemRef, index: usize) -> Option<&Dependency> {
        match self.dependencies.get(index) {
            Some(dependency) if &dependency.requires == target => Some(dependency),
            _ => self.dependency_on(target),
        }
    }

    /// Whether applying `other` over `self` needs an operation: type, name,
    /// properties, external flag and the set of dependencies (order-insensitive,
    /// descriptions ignored). Subgraph, label and description do not count.
    pub fn same_content(&self, other: &Item) -> bool {
        // An applied value is most often the intended one itself (they
        // share an `Arc` once an operation applied it).
        if std::ptr::eq(self, other) {
            return true;
        }
        self.identity == other.identity
            && self.external == other.external
            && self.properties == other.properties
            && same_dependency_set(&self.dependencies, &other.dependencies)
    }

    /// Whether both values have the same set of dependencies (as
    /// [`Self::same_content`] compares them: targets, predicates and flags,
    /// in any order).
    pub fn same_dependencies(&self, other: &Item) -> bool {
        std::ptr::eq(self, other) || same_dependency_set(&self.dependencies, &other.dependencies)
    }
}

/// Order-insensitive comparison of two dependency lists. Validation forbids
/// two dependencies on one item, so matching by target is exact. Lists in
/// the same order (the usual case: a value resubmitted) compare pairwise,
/// in linear time.
fn same_dependency_set(left: &[Dependency], right: &[Dependency]) -> bool {
    if left.len() != right.len() {
        return false;
    }
    let aligned = left
        .iter()
        .zip(right)
        .position(|(l, r)| l.requires != r.requires);
    let Some(first_difference) = aligned else {
        return left.iter().zip(right).all(|(l, r)| l.same_content(r));
    };
    left.iter().enumerate().all(|(index, l)| {
        let candidates = if index < first_difference {
            &right[index..=index]
        } else {
            &right[first_difference..]
        };
        candidates
            .iter()
            .any(|r| r.requires == l.requires && r.same_content(l))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn props(value: serde_json::Value) -> Properties {
        Properties::try_from(value).unwrap_or_default()
    }

    #[test]
    fn equality_ignores_dependency_order_labels_and_descriptions() {
        let a = ItemRef::new("t", "a");
        let b = ItemRef::new("t", "b");
        let left = Item::new("t", "x", props(json!({"mtu": 1500})))
            .depends_on(Dependency::on(a.clone()))
            .depends_on(Dependency::on(b.clone()));
        let mut right = Item::new("t", "x", props(json!({"mtu": 1500})))
            .depends_on(Dependency::on(b))
            .depends_on(Dependency::on(a).with_description("other words"));
        right.set_label("new label");
        right.subgraph = "moved/elsewhere".into();
        right.set_description("changed");
        assert!(left.same_content(&right));
    }

    #[test]
    fn dependency_sets_compare_whatever_part_of_them_is_in_the_same_order() {
        let with = |names: &[&str]| {
            names
                .iter()
                .fold(Item::new("t", "x", Properties::new()), |item, name| {
                    item.depends_on(Dependency::on(ItemRef::new("t", name)))
                })
        };
        let abcd = with(&["a", "b", "c", "d"]);
        assert!(abcd.same_content(&with(&["a", "b", "c", "d"])));
        assert!(abcd.same_content(&with(&["a", "b", "d", "c"])));
        assert!(abcd.same_content(&with(&["d", "c", "b", "a"])));
        assert!(!abcd.same_content(&with(&["a", "b", "c", "e"])));
        assert!(!abcd.same_content(&with(&["a", "b", "e", "c"])));
        assert!(!abcd.same_content(&with(&["a", "b", "c"])));
        let mut predicate = with(&["a", "b", "c", "d"]);
        predicate.dependencies[3].set_must_satisfy("self.up");
        assert!(
            !abcd.same_content(&predicate),
            "aligned lists still compare each edge"
        );
        let mut moved = with(&["a", "b", "d", "c"]);
        moved.dependencies[2].set_recreate_when_modified(true);
        assert!(!abcd.same_content(&moved), "so do reordered ones");
        assert!(abcd.same_content(&abcd), "a value is its own equal");
    }

    #[test]
    fn a_dependency_is_found_near_its_index_or_anywhere() {
        let item = Item::new("t", "x", Properties::new())
            .depends_on(Dependency::on(ItemRef::new("t", "a")))
            .depends_on(Dependency::on(ItemRef::new("t", "b")));
        let b = ItemRef::new("t", "b");
        assert!(item.dependency_on_near(&b, 1).is_some());
        assert!(item.dependency_on_near(&b, 0).is_some());
        assert!(item.dependency_on_near(&b, 7).is_some());
        assert!(
            item.dependency_on_near(&ItemRef::new("t", "c"), 1)
                .is_none()
        );
    }

    #[test]
    fn equality_sees_properties_predicates_and_flags() {
        let a = ItemRef::new("t", "a");
        let base =
            Item::new("t", "x", props(json!({"mtu": 1500}))).depends_on(Dependency::on(a.clone()));
        let mut changed = base.clone();
        changed.properties.insert("mtu".into(), json!(9000));
        assert!(!base.same_content(&changed));

        let mut predicate = base.clone();
        predicate.dependencies[0].set_must_satisfy("self.up");
        assert!(!base.same_content(&predicate));

        let mut external = base.clone();
        external.external = true;
        assert!(!base.same_content(&external));

        let mut flag = base.clone();
        flag.dependencies[0].set_recreate_when_modified(true);
        assert!(!base.same_content(&flag));
    }

    #[test]
    fn an_item_keeps_its_label_and_description_in_a_box_only_while_set() {
        let plain = Item::new("t", "x", Properties::new());
        let labelled = plain.clone().with_label("edge router");
        assert!(!plain.texts.is_boxed());
        assert_eq!(labelled.label(), "edge router");
        assert_eq!(labelled.description(), "");
        let described = labelled.clone().with_description("rack 4");
        assert_eq!(
            (described.label(), described.description()),
            ("edge router", "rack 4")
        );
        let mut cleared = described;
        cleared.set_label("");
        cleared.set_description("");
        assert!(
            !cleared.texts.is_boxed(),
            "no box once both texts are empty"
        );
        assert_eq!(cleared, plain);
        assert!(
            labelled.same_content(&plain),
            "texts are not part of equality"
        );
    }

    #[test]
    fn identities_and_dependencies_stay_small_and_keep_their_json_shape() {
        // A deep graph holds an identity per dependency: keep them compact.
        assert_eq!(std::mem::size_of::<ItemRef>(), 8);
        assert_eq!(std::mem::size_of::<Dependency>(), 16);
        assert_eq!(std::mem::size_of::<Item>(), 88);

        let plain = Dependency::on(ItemRef::new("t", "a"));
        let described = plain.clone().with_description("why");
        assert!(!plain.rare.is_boxed());
        assert_eq!(described.description(), "why");
        assert_eq!(described.must_satisfy(), "");
        let cleared = described.clone().with_description("");
        assert!(!cleared.rare.is_boxed(), "no box once both texts are empty");
        assert_eq!(cleared, plain);
        let flagged = plain.clone().with_recreate_when_modified(true);
        assert!(flagged.rare.is_boxed() && flagged.recreate_when_modified());
        assert!(!flagged.auto_deleted_by_external());
        assert_ne!(flagged, plain, "flags count in equality");
        assert_eq!(flagged.with_recreate_when_modified(false), plain);

        let item = Item::new("t", "x", props(json!({"v": 1}))).depends_on(
            described
                .with_must_satisfy("self.up")
                .with_recreate_when_modified(true),
        );
        let text = serde_json::to_value(&item).expect("serializes");
        assert_eq!(
            text,
            json!({
                "item_type": "t", "name": "x", "properties": {"v": 1},
                "dependencies": [{
                    "requires": {"item_type": "t", "name": "a"},
                    "must_satisfy": "self.up", "description": "why",
                    "recreate_when_modified": true, "auto_deleted_by_external": false,
                }],
                "external": false, "subgraph": "", "label": "", "description": "",
            })
        );
        let back: Item = serde_json::from_value(text).expect("deserializes");
        assert_eq!(back, item);
        assert_eq!(back.dependencies[0].description(), "why");
    }
}
