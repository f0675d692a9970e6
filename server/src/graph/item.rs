//! The item model: identities, items, dependencies and their equality.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use super::properties::Properties;

/// The identity of an item within a tenant: `type/name`.
///
/// Cloning is cheap (both parts are reference counted), so graphs and plans
/// pass identities around by value.
#[derive(Clone, Eq, Serialize, Deserialize)]
pub struct ItemRef {
    /// The item type, e.g. `interface`.
    pub item_type: Arc<str>,
    /// The item name, unique within its type.
    pub name: Arc<str>,
}

impl ItemRef {
    /// Builds an identity from a type and a name.
    pub fn new(item_type: impl AsRef<str>, name: impl AsRef<str>) -> Self {
        Self {
            item_type: Arc::from(item_type.as_ref()),
            name: Arc::from(name.as_ref()),
        }
    }
}

/// Two parts are equal when they share their allocation (identities cloned
/// from one another do) or their text.
fn same_part(left: &Arc<str>, right: &Arc<str>) -> bool {
    Arc::ptr_eq(left, right) || left == right
}

fn compare_parts(left: &Arc<str>, right: &Arc<str>) -> Ordering {
    if Arc::ptr_eq(left, right) {
        Ordering::Equal
    } else {
        left.cmp(right)
    }
}

impl PartialEq for ItemRef {
    fn eq(&self, other: &Self) -> bool {
        same_part(&self.item_type, &other.item_type) && same_part(&self.name, &other.name)
    }
}

/// Hashes the text of both parts, consistent with equality.
impl std::hash::Hash for ItemRef {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.item_type.hash(state);
        self.name.hash(state);
    }
}

impl Ord for ItemRef {
    fn cmp(&self, other: &Self) -> Ordering {
        compare_parts(&self.item_type, &other.item_type)
            .then_with(|| compare_parts(&self.name, &other.name))
    }
}

impl PartialOrd for ItemRef {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for ItemRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.item_type, self.name)
    }
}

impl fmt::Debug for ItemRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A "must exist" edge from a dependent item to the item it requires.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Dependency {
    /// The required item.
    pub requires: ItemRef,
    /// Optional CEL expression over the required item, bound as `self`.
    /// Empty means the dependency holds as soon as the item is created.
    /// (`Box<str>`, not `String`: a deep graph holds millions of
    /// dependencies, and this one is nearly always empty.)
    pub must_satisfy: Box<str>,
    /// Free text for humans; not part of equality.
    pub description: Box<str>,
    /// Recreate the dependent whenever the required item is modified.
    pub recreate_when_modified: bool,
    /// When the required (external) item disappears, the dependent is gone
    /// too: drop it from current state without a Delete call.
    pub auto_deleted_by_external: bool,
}

impl Dependency {
    /// A plain dependency on `requires` with no predicate or flags.
    pub fn on(requires: ItemRef) -> Self {
        Self {
            requires,
            must_satisfy: Box::default(),
            description: Box::default(),
            recreate_when_modified: false,
            auto_deleted_by_external: false,
        }
    }

    /// Equality for planning purposes: the description does not count.
    fn same_content(&self, other: &Self) -> bool {
        self.requires == other.requires
            && self.must_satisfy == other.must_satisfy
            && self.recreate_when_modified == other.recreate_when_modified
            && self.auto_deleted_by_external == other.auto_deleted_by_external
    }
}

/// A configuration item, as intended by a user or as last applied.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Item {
    /// The item type; together with `name` the item's identity. Shared
    /// text (`Arc<str>`): the item's [`ItemRef`] is a clone of it, not a
    /// copy.
    pub item_type: Arc<str>,
    /// The item name (shared text, as `item_type`).
    pub name: Arc<str>,
    /// The item's configuration (a JSON object).
    pub properties: Properties,
    /// Items that must exist (and satisfy predicates) before this one.
    pub dependencies: Vec<Dependency>,
    /// Present only to express an expectation; never operated on.
    pub external: bool,
    /// `/`-separated path of the subgraph that lists the item; empty = root.
    pub subgraph: String,
    /// Short human label; not part of equality.
    pub label: String,
    /// Free text; not part of equality.
    pub description: String,
}

impl Item {
    /// A non-external item with the given identity and properties.
    pub fn new(item_type: impl AsRef<str>, name: impl AsRef<str>, properties: Properties) -> Self {
        Self {
            item_type: Arc::from(item_type.as_ref()),
            name: Arc::from(name.as_ref()),
            properties,
            ..Self::default()
        }
    }

    /// The item's identity (sharing the item's text).
    pub fn item_ref(&self) -> ItemRef {
        ItemRef {
            item_type: self.item_type.clone(),
            name: self.name.clone(),
        }
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
        self.item_type == other.item_type
            && self.name == other.name
            && self.external == other.external
            && self.properties == other.properties
            && same_dependency_set(&self.dependencies, &other.dependencies)
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
            .depends_on(Dependency {
                description: "other words".into(),
                ..Dependency::on(a)
            });
        right.label = "new label".into();
        right.subgraph = "moved/elsewhere".into();
        right.description = "changed".into();
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
        predicate.dependencies[3].must_satisfy = "self.up".into();
        assert!(
            !abcd.same_content(&predicate),
            "aligned lists still compare each edge"
        );
        let mut moved = with(&["a", "b", "d", "c"]);
        moved.dependencies[2].recreate_when_modified = true;
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
        predicate.dependencies[0].must_satisfy = "self.up".into();
        assert!(!base.same_content(&predicate));

        let mut external = base.clone();
        external.external = true;
        assert!(!base.same_content(&external));

        let mut flag = base.clone();
        flag.dependencies[0].recreate_when_modified = true;
        assert!(!base.same_content(&flag));
    }

    #[test]
    fn identities_order_by_type_then_name() {
        let mut refs = [
            ItemRef::new("b", "a"),
            ItemRef::new("a", "z"),
            ItemRef::new("a", "b"),
        ];
        refs.sort();
        let shown: Vec<String> = refs.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["a/b", "a/z", "b/a"]);
    }
}
