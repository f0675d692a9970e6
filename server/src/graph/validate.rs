//! Validation of submitted items (DESIGN section 2, "Validation on submit")
//! and the dependency-cycle finder.
//!
//! [`validate_items`] checks a request on its own: identities, names,
//! dependencies, predicates and sizes. Whether the intended graph has a
//! cycle depends on the rest of the tenant's intent as well, so the caller
//! runs [`find_cycle`] over the merged graph.

use std::collections::hash_map::Entry;
use std::fmt::{self, Display};
use std::io;

use rustc_hash::{FxHashMap, FxHashSet};

use super::item::{Item, ItemRef};
use super::predicate::Predicate;

/// The most violations one rejection reports, the closing note included.
pub const MAX_VIOLATIONS: usize = 100;

/// Limits that validation enforces (DESIGN section 9).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationLimits {
    /// Most items in one request.
    pub max_request_items: usize,
    /// Largest item, measured as the length of its JSON encoding.
    pub max_item_bytes: usize,
    /// Longest type or name, in bytes.
    pub max_name_bytes: usize,
}

impl Default for ValidationLimits {
    /// 10,000 items per request, 64 KiB per item, 253 bytes per name.
    fn default() -> Self {
        Self {
            max_request_items: 10_000,
            max_item_bytes: 64 * 1024,
            max_name_bytes: 253,
        }
    }
}

/// One problem with a request: the field path (as in
/// `google.rpc.BadRequest.FieldViolation`, e.g.
/// `items[3].dependencies[0].requires`) and what is wrong and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldViolation {
    /// Path of the offending field, with proto field names.
    pub field: String,
    /// What is wrong and how to fix it.
    pub description: String,
}

impl FieldViolation {
    /// A violation of `field`.
    pub fn new(field: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            description: description.into(),
        }
    }
}

/// The compiled predicates of one item, one entry per dependency (None = no predicate).
pub type ItemPredicates = Vec<Option<Predicate>>;

/// Checks a submitted list of items and compiles their predicates.
///
/// On success, returns the compiled predicates, index-aligned with `items`
/// and with each item's dependencies. On failure, returns every violation
/// found, in item order, capped at [`MAX_VIOLATIONS`] entries, the last one
/// then saying how many were left out. A request with more than
/// `max_request_items` items is refused with that single violation, without
/// looking at the items.
pub fn validate_items(
    items: &[Item],
    limits: &ValidationLimits,
) -> Result<Vec<ItemPredicates>, Vec<FieldViolation>> {
    if items.len() > limits.max_request_items {
        return Err(vec![FieldViolation::new(
            "items",
            format!(
                "the request has {} items, over the limit of {}; split the intent \
                 into subgraphs and submit them in separate requests",
                items.len(),
                limits.max_request_items
            ),
        )]);
    }
    let mut violations = Violations::default();
    let mut first_index_of: FxHashMap<(&str, &str), usize> = FxHashMap::default();
    let mut predicates = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let path = ItemPath(index);
        check_item_identity(item, &path, limits, &mut violations);
        match first_index_of.entry((item.item_type(), item.name())) {
            Entry::Vacant(vacant) => {
                vacant.insert(index);
            }
            Entry::Occupied(first) => violations.push(
                format!("{path}.name"),
                format!(
                    "the identity {}/{} is already used by items[{}]; each type/name \
                     pair may appear once: remove or rename one of the two",
                    item.item_type(),
                    item.name(),
                    first.get()
                ),
            ),
        }
        predicates.push(check_dependencies(item, &path, limits, &mut violations));
        check_item_size(item, &path, limits, &mut violations);
    }
    violations.into_result(predicates)
}

/// Checks a type, name or similar identifier: 1 to `max_name_bytes` bytes
/// of printable UTF-8 (no control characters, no line or paragraph
/// separators).
///
/// The message has no subject, so callers prefix what they checked, e.g.
/// `format!("the tenant name {message}")`.
pub fn validate_name(value: &str, limits: &ValidationLimits) -> Result<(), String> {
    if value.is_empty() {
        return Err(format!(
            "is empty; give it 1 to {} bytes of printable UTF-8",
            limits.max_name_bytes
        ));
    }
    if value.len() > limits.max_name_bytes {
        return Err(format!(
            "is {} bytes long, over the limit of {} bytes; shorten it",
            value.len(),
            limits.max_name_bytes
        ));
    }
    match value.char_indices().find(|(_, c)| !is_printable(*c)) {
        Some((offset, c)) => Err(format!(
            "contains the non-printable character U+{:04X} at byte {offset}; \
             use printable characters only",
            u32::from(c)
        )),
        None => Ok(()),
    }
}

/// Control characters and the Unicode line and paragraph separators are not
/// printable.
fn is_printable(c: char) -> bool {
    !c.is_control() && c != '\u{2028}' && c != '\u{2029}'
}

/// Finds a dependency cycle reachable from `roots` by following "requires"
/// edges, without recursion (chains may be a million items long).
///
/// `dependencies_of` returns the items an item requires, or `None` for an
/// unknown item (a dangling dependency, which ends the path). Roots and
/// edges are visited in the order given, so the answer is deterministic.
/// The cycle is spelled out in dependency order with its first item
/// repeated at the end, e.g. `[a, b, c, a]` for a -> b -> c -> a, or
/// `[a, a]` for an item that requires itself.
pub fn find_cycle<F>(
    roots: impl IntoIterator<Item = ItemRef>,
    mut dependencies_of: F,
) -> Option<Vec<ItemRef>>
where
    F: FnMut(&ItemRef) -> Option<Vec<ItemRef>>,
{
    let mut search = CycleSearch::default();
    roots
        .into_iter()
        .find_map(|root| search.search_from(root, &mut dependencies_of))
}

/// The state of [`find_cycle`]'s depth-first search.
#[derive(Default)]
struct CycleSearch {
    /// Items whose every path has been explored without finding a cycle.
    finished: FxHashSet<ItemRef>,
    /// Items on the current path, with their position in `path`.
    on_path: FxHashMap<ItemRef, usize>,
    /// The current path: each item with its dependencies and the index of
    /// the next one to follow.
    path: Vec<(ItemRef, Vec<ItemRef>, usize)>,
}

impl CycleSearch {
    fn search_from<F>(&mut self, root: ItemRef, dependencies_of: &mut F) -> Option<Vec<ItemRef>>
    where
        F: FnMut(&ItemRef) -> Option<Vec<ItemRef>>,
    {
        self.enter(root, dependencies_of);
        while let Some((_, dependencies, next)) = self.path.last_mut() {
            let Some(dependency) = dependencies.get(*next).cloned() else {
                self.leave();
                continue;
            };
            *next += 1;
            if let Some(&start) = self.on_path.get(&dependency) {
                return Some(self.cycle_from(start));
            }
            self.enter(dependency, dependencies_of);
        }
        None
    }

    /// Pushes `item` on the path, unless it is finished or unknown.
    fn enter<F>(&mut self, item: ItemRef, dependencies_of: &mut F)
    where
        F: FnMut(&ItemRef) -> Option<Vec<ItemRef>>,
    {
        if self.finished.contains(&item) {
            return;
        }
        match dependencies_of(&item) {
            Some(dependencies) => {
                self.on_path.insert(item.clone(), self.path.len());
                self.path.push((item, dependencies, 0));
            }
            None => {
                self.finished.insert(item);
            }
        }
    }

    /// Pops the last item of the path: all its paths are explored.
    fn leave(&mut self) {
        if let Some((item, _, _)) = self.path.pop() {
            self.on_path.remove(&item);
            self.finished.insert(item);
        }
    }

    /// The items of the path from position `start`, then that item again.
    fn cycle_from(&self, start: usize) -> Vec<ItemRef> {
        let mut cycle: Vec<ItemRef> = self.path[start..]
            .iter()
            .map(|(item, _, _)| item.clone())
            .collect();
        cycle.push(self.path[start].0.clone());
        cycle
    }
}

/// Violations collected so far: at most [`MAX_VIOLATIONS`] - 1 kept, the
/// rest only counted.
#[derive(Default)]
struct Violations {
    kept: Vec<FieldViolation>,
    total: usize,
}

impl Violations {
    fn push(&mut self, field: String, description: String) {
        self.total += 1;
        if self.kept.len() < MAX_VIOLATIONS {
            self.kept.push(FieldViolation { field, description });
        }
    }

    fn into_result<T>(mut self, value: T) -> Result<T, Vec<FieldViolation>> {
        if self.total == 0 {
            return Ok(value);
        }
        if self.total > MAX_VIOLATIONS {
            self.kept.truncate(MAX_VIOLATIONS - 1);
            let left_out = self.total - self.kept.len();
            self.kept.push(FieldViolation::new(
                "items",
                format!(
                    "{left_out} more violations are not shown; fix the ones above \
                     and submit again to see the rest"
                ),
            ));
        }
        Err(self.kept)
    }
}

/// The path of a request's item `items[index]`, written out only for a
/// violation (a valid request allocates no paths).
struct ItemPath(usize);

impl Display for ItemPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "items[{}]", self.0)
    }
}

/// The path of an item's dependency, `{item}.dependencies[{index}]`,
/// written out only for a violation.
struct DependencyPath<'a> {
    item: &'a dyn Display,
    index: usize,
}

impl Display for DependencyPath<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.dependencies[{}]", self.item, self.index)
    }
}

/// The item's own type and name.
fn check_item_identity(
    item: &Item,
    path: &dyn Display,
    limits: &ValidationLimits,
    violations: &mut Violations,
) {
    check_name(
        item.item_type(),
        "type",
        &format_args!("{path}.type"),
        limits,
        violations,
    );
    check_name(
        item.name(),
        "name",
        &format_args!("{path}.name"),
        limits,
        violations,
    );
}

fn check_name(
    value: &str,
    what: &str,
    field: &dyn Display,
    limits: &ValidationLimits,
    violations: &mut Violations,
) {
    if let Err(message) = validate_name(value, limits) {
        violations.push(field.to_string(), format!("the {what} {message}"));
    }
}

/// The external flag, each dependency, and its predicate. Returns the
/// compiled predicates (those that compiled).
fn check_dependencies(
    item: &Item,
    path: &dyn Display,
    limits: &ValidationLimits,
    violations: &mut Violations,
) -> ItemPredicates {
    if item.external && !item.dependencies.is_empty() {
        violations.push(
            format!("{path}.dependencies"),
            "an external item cannot have dependencies (it is never operated on); \
             remove them, or make the item non-external"
                .to_owned(),
        );
    }
    let mut first_index_of: FxHashMap<&ItemRef, usize> = FxHashMap::default();
    let mut predicates = Vec::with_capacity(item.dependencies.len());
    for (index, dependency) in item.dependencies.iter().enumerate() {
        let path = DependencyPath { item: path, index };
        let requires = &dependency.requires;
        check_name(
            requires.item_type(),
            "required type",
            &format_args!("{path}.requires.type"),
            limits,
            violations,
        );
        check_name(
            requires.name(),
            "required name",
            &format_args!("{path}.requires.name"),
            limits,
            violations,
        );
        if let Some(&first) = first_index_of.get(requires) {
            violations.push(
                format!("{path}.requires"),
                format!(
                    "dependencies[{first}] already requires {requires}; an item may depend \
                     on another only once: merge the two (join predicates with &&)"
                ),
            );
        } else {
            first_index_of.insert(requires, index);
        }
        predicates.push(compile_predicate(
            dependency.must_satisfy(),
            &path,
            violations,
        ));
    }
    predicates
}

fn compile_predicate(
    source: &str,
    path: &dyn Display,
    violations: &mut Violations,
) -> Option<Predicate> {
    if source.is_empty() {
        return None;
    }
    match Predicate::compile(source) {
        Ok(predicate) => Some(predicate),
        Err(error) => {
            violations.push(format!("{path}.must_satisfy"), error.to_string());
            None
        }
    }
}

/// The item's JSON encoding must fit in `max_item_bytes`.
fn check_item_size(
    item: &Item,
    path: &dyn Display,
    limits: &ValidationLimits,
    violations: &mut Violations,
) {
    match encoded_size(item) {
        Ok(size) if size <= limits.max_item_bytes => {}
        Ok(size) => violations.push(
            path.to_string(),
            format!(
                "the item encodes to {size} bytes, over the limit of {} bytes; keep bulky \
                 data out of its properties, or split it into several items",
                limits.max_item_bytes
            ),
        ),
        Err(error) => violations.push(
            path.to_string(),
            format!("the item cannot be encoded ({error}); check its properties"),
        ),
    }
}

/// `serde_json::to_vec(item).len()`, counted without building the buffer.
fn encoded_size(item: &Item) -> serde_json::Result<usize> {
    let mut counter = ByteCounter(0);
    serde_json::to_writer(&mut counter, item)?;
    Ok(counter.0)
}

/// A writer that only counts bytes.
struct ByteCounter(usize);

impl io::Write for ByteCounter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::item::{Dependency, Properties};
    use serde_json::json;

    fn item(item_type: &str, name: &str) -> Item {
        Item::new(item_type, name, Properties::new())
    }

    fn on(item_type: &str, name: &str) -> Dependency {
        Dependency::on(ItemRef::new(item_type, name))
    }

    fn violations(items: &[Item]) -> Vec<FieldViolation> {
        validate_items(items, &ValidationLimits::default()).expect_err("should be rejected")
    }

    fn fields(items: &[Item]) -> Vec<String> {
        violations(items).into_iter().map(|v| v.field).collect()
    }

    fn refs(names: &[&str]) -> Vec<ItemRef> {
        names.iter().map(|name| ItemRef::new("t", name)).collect()
    }

    #[test]
    fn valid_items_yield_aligned_predicates() {
        let items = vec![
            item("interface", "eth0"),
            item("vlan", "eth0.100")
                .depends_on(on("interface", "eth0").with_must_satisfy("self.up"))
                .depends_on(on("bridge", "br0")),
        ];
        let predicates = validate_items(&items, &ValidationLimits::default()).expect("valid");
        assert_eq!(predicates.len(), 2);
        assert!(predicates[0].is_empty());
        assert_eq!(predicates[1].len(), 2);
        assert_eq!(
            predicates[1][0].as_ref().map(Predicate::source),
            Some("self.up")
        );
        assert!(predicates[1][1].is_none());
    }

    #[test]
    fn empty_request_is_valid() {
        assert_eq!(
            validate_items(&[], &ValidationLimits::default()),
            Ok(vec![])
        );
    }

    #[test]
    fn duplicate_identity_points_at_the_repeat() {
        let items = vec![
            item("t", "a"),
            item("t", "b"),
            item("u", "a"),
            item("t", "a"),
            item("t", "a"),
        ];
        let found = violations(&items);
        let shown: Vec<&str> = found.iter().map(|v| v.field.as_str()).collect();
        assert_eq!(shown, ["items[3].name", "items[4].name"]);
        assert!(
            found[1]
                .description
                .contains("t/a is already used by items[0]"),
            "{found:?}"
        );
    }

    #[test]
    fn external_item_with_dependencies() {
        let mut external = item("t", "x").depends_on(on("t", "y"));
        external.external = true;
        let mut plain_external = item("t", "z");
        plain_external.external = true;
        let found = violations(&[item("t", "y"), external, plain_external]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].field, "items[1].dependencies");
        assert!(found[0].description.contains("external"), "{found:?}");
    }

    #[test]
    fn two_dependencies_on_one_item() {
        let dependent = item("t", "x")
            .depends_on(on("t", "a"))
            .depends_on(on("t", "b"))
            .depends_on(on("t", "a").with_must_satisfy("self.up"));
        let found = violations(&[item("t", "a"), dependent]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].field, "items[1].dependencies[2].requires");
        assert!(
            found[0]
                .description
                .contains("dependencies[0] already requires t/a"),
            "{found:?}"
        );
    }

    #[test]
    fn item_types_and_names_are_checked() {
        let items = vec![
            item("", "ok"),
            item("ok", &"n".repeat(254)),
            item("ok", "line\nbreak"),
            item("ok", &"n".repeat(253)),
            item("ok", "ünïcødé and spaces / slashes"),
        ];
        let found = violations(&items);
        let shown: Vec<&str> = found.iter().map(|v| v.field.as_str()).collect();
        assert_eq!(shown, ["items[0].type", "items[1].name", "items[2].name"]);
        assert!(
            found[0].description.starts_with("the type is empty"),
            "{found:?}"
        );
        assert!(found[1].description.contains("254 bytes long"), "{found:?}");
        assert!(
            found[2].description.contains("U+000A at byte 4"),
            "{found:?}"
        );
    }

    #[test]
    fn required_types_and_names_are_checked() {
        let dependent = item("t", "x")
            .depends_on(on("", "a"))
            .depends_on(on("t", "tab\there"));
        assert_eq!(
            fields(&[dependent]),
            [
                "items[0].dependencies[0].requires.type",
                "items[0].dependencies[1].requires.name"
            ]
        );
    }

    #[test]
    fn predicate_that_does_not_parse() {
        let dependent = item("t", "x")
            .depends_on(on("t", "a").with_must_satisfy("self.up"))
            .depends_on(on("t", "b").with_must_satisfy("self.mtu >="));
        let found = violations(&[dependent]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].field, "items[0].dependencies[1].must_satisfy");
        assert!(
            found[0].description.contains("not a valid predicate"),
            "{found:?}"
        );
    }

    #[test]
    fn item_over_the_size_limit() {
        let limits = ValidationLimits::default();
        let mut fits = item("t", "a");
        let overhead = encoded_size(&fits).unwrap_or_default() + r#""b":"""#.len();
        let padding = "x".repeat(limits.max_item_bytes - overhead);
        fits.properties.insert("b".into(), json!(padding));
        assert_eq!(encoded_size(&fits).ok(), Some(limits.max_item_bytes));
        assert_eq!(
            encoded_size(&fits).ok(),
            serde_json::to_vec(&fits).map(|bytes| bytes.len()).ok()
        );
        let mut over = fits.clone();
        over.identity = ItemRef::new(over.item_type(), "b");
        over.properties
            .insert("b".into(), json!(format!("{padding}x")));
        let found = violations(&[fits, over]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].field, "items[1]");
        assert!(
            found[0]
                .description
                .contains("65537 bytes, over the limit of 65536 bytes"),
            "{found:?}"
        );
    }

    #[test]
    fn too_many_items() {
        let limits = ValidationLimits {
            max_request_items: 3,
            ..ValidationLimits::default()
        };
        let items: Vec<Item> = (0..4).map(|i| item("t", &i.to_string())).collect();
        let found = validate_items(&items, &limits).expect_err("over the limit");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].field, "items");
        assert!(
            found[0]
                .description
                .contains("4 items, over the limit of 3"),
            "{found:?}"
        );
        assert!(validate_items(&items[..3], &limits).is_ok());
    }

    #[test]
    fn all_violations_are_collected_in_item_order() {
        let mut external = item("t", "").depends_on(on("t", "a").with_must_satisfy("("));
        external.external = true;
        assert_eq!(
            fields(&[item("", "a"), external]),
            [
                "items[0].type",
                "items[1].name",
                "items[1].dependencies",
                "items[1].dependencies[0].must_satisfy",
            ]
        );
    }

    #[test]
    fn violations_are_capped_with_a_closing_note() {
        let items: Vec<Item> = (0..150).map(|i| item("", &i.to_string())).collect();
        let found = violations(&items);
        assert_eq!(found.len(), MAX_VIOLATIONS);
        assert_eq!(found[98].field, "items[98].type");
        let note = &found[99];
        assert_eq!(note.field, "items");
        assert!(
            note.description.starts_with("51 more violations"),
            "{note:?}"
        );

        let exactly: Vec<Item> = (0..100).map(|i| item("", &i.to_string())).collect();
        let found = violations(&exactly);
        assert_eq!(found.len(), 100);
        assert_eq!(found[99].field, "items[99].type");
    }

    #[test]
    fn names_are_checked_against_the_configured_limit() {
        let limits = ValidationLimits {
            max_name_bytes: 4,
            ..ValidationLimits::default()
        };
        assert_eq!(validate_name("abcd", &limits), Ok(()));
        assert!(validate_name("abcde", &limits).is_err());
        assert!(
            validate_name("é€", &limits).is_err(),
            "5 bytes, 2 characters"
        );
        assert!(validate_name("a\u{2028}", &limits).is_err());
        assert!(validate_name("\u{7f}", &limits).is_err());
    }

    fn graph(edges: &[(&str, &[&str])]) -> FxHashMap<ItemRef, Vec<ItemRef>> {
        edges
            .iter()
            .map(|(from, to)| (ItemRef::new("t", from), refs(to)))
            .collect()
    }

    fn cycle_in(edges: &[(&str, &[&str])], roots: &[&str]) -> Option<Vec<ItemRef>> {
        let graph = graph(edges);
        find_cycle(refs(roots), |item| graph.get(item).cloned())
    }

    #[test]
    fn self_loop() {
        assert_eq!(cycle_in(&[("a", &["a"])], &["a"]), Some(refs(&["a", "a"])));
    }

    #[test]
    fn cycle_is_spelled_in_dependency_order() {
        let edges: &[(&str, &[&str])] =
            &[("x", &["a"]), ("a", &["b"]), ("b", &["c"]), ("c", &["a"])];
        assert_eq!(cycle_in(edges, &["x"]), Some(refs(&["a", "b", "c", "a"])));
        assert_eq!(cycle_in(edges, &["b"]), Some(refs(&["b", "c", "a", "b"])));
    }

    #[test]
    fn diamond_without_cycle() {
        let edges: &[(&str, &[&str])] =
            &[("a", &["b", "c"]), ("b", &["d"]), ("c", &["d"]), ("d", &[])];
        assert_eq!(cycle_in(edges, &["a", "b", "c", "d"]), None);
    }

    #[test]
    fn cycle_through_a_diamond() {
        let edges: &[(&str, &[&str])] = &[
            ("a", &["b", "c"]),
            ("b", &["d"]),
            ("c", &["d"]),
            ("d", &["a"]),
        ];
        assert_eq!(cycle_in(edges, &["a"]), Some(refs(&["a", "b", "d", "a"])));
    }

    #[test]
    fn dangling_dependencies_end_the_path() {
        let edges: &[(&str, &[&str])] = &[("a", &["missing", "b"]), ("b", &["missing"])];
        assert_eq!(cycle_in(edges, &["a", "b"]), None);
        assert_eq!(cycle_in(&[], &["missing"]), None);
    }

    #[test]
    fn roots_are_searched_in_order() {
        let edges: &[(&str, &[&str])] = &[("a", &["a"]), ("b", &["b"]), ("c", &[])];
        assert_eq!(cycle_in(edges, &["c", "b", "a"]), Some(refs(&["b", "b"])));
    }

    #[test]
    fn long_chain_does_not_overflow_the_stack() {
        const LENGTH: usize = 100_000;
        let names: Vec<ItemRef> = (0..LENGTH)
            .map(|i| ItemRef::new("t", i.to_string()))
            .collect();
        let mut next: FxHashMap<ItemRef, Vec<ItemRef>> = names
            .windows(2)
            .map(|pair| (pair[0].clone(), vec![pair[1].clone()]))
            .collect();
        next.insert(names[LENGTH - 1].clone(), vec![]);
        let mut calls = 0;
        let found = find_cycle(names.iter().cloned(), |item| {
            calls += 1;
            next.get(item).cloned()
        });
        assert_eq!(found, None);
        assert_eq!(calls, LENGTH, "each item is expanded once");

        next.insert(names[LENGTH - 1].clone(), vec![names[0].clone()]);
        let cycle =
            find_cycle([names[0].clone()], |item| next.get(item).cloned()).expect("a cycle");
        assert_eq!(cycle.len(), LENGTH + 1);
        assert_eq!(cycle.first(), cycle.last());
    }
}
