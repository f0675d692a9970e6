//! A tenant's graph in Graphviz DOT: one node per item, an edge from each
//! dependent to the item it requires, subgraphs as nested clusters.
//!
//! Fill colours: created green, pending grey, failed red, in transition
//! (creating, modifying, deleting) yellow, unknown purple, external items
//! blue ellipses. Items in the current graph but no longer intended (about
//! to be deleted) have a dashed border, and so do their edges.

use std::collections::{BTreeMap, BTreeSet};

use super::names;
use crate::proto as v1;

/// One node of the drawing.
#[derive(Debug, Clone, PartialEq)]
struct Node {
    id: String,
    state: Option<v1::ItemState>,
    external: bool,
    intended: bool,
    subgraph: String,
}

/// The colour of a node by its state.
fn fill(node: &Node) -> &'static str {
    if node.external {
        return "lightblue";
    }
    match node.state {
        Some(v1::ItemState::Created) => "palegreen",
        Some(v1::ItemState::Failed) => "salmon",
        Some(v1::ItemState::Creating | v1::ItemState::Modifying | v1::ItemState::Deleting) => {
            "gold"
        }
        Some(v1::ItemState::Unknown) => "plum",
        Some(v1::ItemState::Pending | v1::ItemState::Unspecified) | None => "lightgrey",
    }
}

/// A DOT double-quoted string.
fn quote(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for character in text.chars() {
        match character {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            '\n' => quoted.push_str("\\n"),
            other => quoted.push(other),
        }
    }
    quoted.push('"');
    quoted
}

fn reference_id(reference: Option<&v1::ItemRef>) -> String {
    names::item_ref(reference)
}

/// The graph as DOT.
pub(crate) fn render(tenant: &str, graph: &v1::GetGraphResponse) -> String {
    let mut nodes: BTreeMap<String, Node> = BTreeMap::new();
    let mut edges: BTreeSet<(String, String, String, bool)> = BTreeSet::new();
    for intended in &graph.intended {
        let Some(item) = &intended.item else { continue };
        let id = format!("{}/{}", item.r#type, item.name);
        for dependency in &item.dependencies {
            edges.insert((
                id.clone(),
                reference_id(dependency.requires.as_ref()),
                dependency.must_satisfy.clone(),
                false,
            ));
        }
        nodes.insert(
            id.clone(),
            Node {
                id,
                state: None,
                external: item.external,
                intended: true,
                subgraph: item.subgraph.clone(),
            },
        );
    }
    for current in &graph.current {
        let id = reference_id(current.r#ref.as_ref());
        let state = v1::ItemState::try_from(current.state).ok();
        match nodes.get_mut(&id) {
            Some(node) => node.state = state,
            None => {
                let applied = current.applied.clone().unwrap_or_default();
                for dependency in &applied.dependencies {
                    edges.insert((
                        id.clone(),
                        reference_id(dependency.requires.as_ref()),
                        dependency.must_satisfy.clone(),
                        true,
                    ));
                }
                nodes.insert(
                    id.clone(),
                    Node {
                        id,
                        state,
                        external: current.external,
                        intended: false,
                        subgraph: applied.subgraph,
                    },
                );
            }
        }
    }
    // With only the current graph requested, nothing says what is intended:
    // draw every item solid.
    let only_current = graph.intended.is_empty();

    let mut by_subgraph: BTreeMap<String, Vec<&Node>> = BTreeMap::new();
    let mut paths: BTreeSet<String> = BTreeSet::new();
    for node in nodes.values() {
        by_subgraph
            .entry(node.subgraph.clone())
            .or_default()
            .push(node);
        let mut path = node.subgraph.as_str();
        while !path.is_empty() {
            paths.insert(path.to_owned());
            path = path.rsplit_once('/').map_or("", |(parent, _)| parent);
        }
    }

    let mut text = format!(
        "digraph {} {{\n  rankdir=LR;\n  node [shape=box, style=\"rounded,filled\", \
         fontname=\"Helvetica\"];\n  edge [fontname=\"Helvetica\", fontsize=10];\n",
        quote(tenant)
    );
    let mut cluster_ids = BTreeMap::new();
    for (index, path) in paths.iter().enumerate() {
        cluster_ids.insert(path.clone(), index);
    }
    write_cluster(
        "",
        1,
        &by_subgraph,
        &paths,
        &cluster_ids,
        only_current,
        &mut text,
    );
    for (from, to, predicate, leaving) in &edges {
        let mut attributes = Vec::new();
        if !predicate.is_empty() {
            attributes.push(format!("label={}", quote(predicate)));
        }
        if *leaving && !only_current {
            attributes.push("style=dashed".to_owned());
        }
        let attributes = if attributes.is_empty() {
            String::new()
        } else {
            format!(" [{}]", attributes.join(", "))
        };
        text.push_str(&format!(
            "  {} -> {}{attributes};\n",
            quote(from),
            quote(to)
        ));
    }
    text.push_str("}\n");
    text
}

fn write_cluster(
    path: &str,
    depth: usize,
    by_subgraph: &BTreeMap<String, Vec<&Node>>,
    paths: &BTreeSet<String>,
    cluster_ids: &BTreeMap<String, usize>,
    only_current: bool,
    text: &mut String,
) {
    let indent = "  ".repeat(depth);
    for node in by_subgraph.get(path).into_iter().flatten() {
        let state = node.state.map_or_else(
            || "NOT IN CURRENT".to_owned(),
            |state| names::item_state(state as i32),
        );
        let mut style = "rounded,filled".to_owned();
        if !node.intended && !only_current {
            style.push_str(",dashed");
        }
        let shape = if node.external { ", shape=ellipse" } else { "" };
        let label = if node.external {
            format!("{}\n{state}, external", node.id)
        } else {
            format!("{}\n{state}", node.id)
        };
        text.push_str(&format!(
            "{indent}{} [label={}, fillcolor={}, style={}{shape}];\n",
            quote(&node.id),
            quote(&label),
            fill(node),
            quote(&style),
        ));
    }
    let children = paths.iter().filter(|child| {
        let parent = child.rsplit_once('/').map_or("", |(parent, _)| parent);
        parent == path
    });
    for child in children {
        let id = cluster_ids.get(child).copied().unwrap_or_default();
        text.push_str(&format!(
            "{indent}subgraph cluster_{id} {{\n{indent}  label={};\n{indent}  style=rounded;\n",
            quote(child)
        ));
        write_cluster(
            child,
            depth + 1,
            by_subgraph,
            paths,
            cluster_ids,
            only_current,
            text,
        );
        text.push_str(&format!("{indent}}}\n"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intended(
        item_type: &str,
        name: &str,
        subgraph: &str,
        requires: &[&str],
    ) -> v1::IntendedItem {
        v1::IntendedItem {
            item: Some(v1::Item {
                r#type: item_type.into(),
                name: name.into(),
                subgraph: subgraph.into(),
                dependencies: requires
                    .iter()
                    .map(|reference| {
                        let (t, n) = reference.split_once('/').unwrap_or_default();
                        v1::Dependency {
                            requires: Some(v1::ItemRef {
                                r#type: t.into(),
                                name: n.into(),
                            }),
                            ..v1::Dependency::default()
                        }
                    })
                    .collect(),
                ..v1::Item::default()
            }),
            generation: 1,
        }
    }

    fn current(item_type: &str, name: &str, state: v1::ItemState) -> v1::ItemStatus {
        v1::ItemStatus {
            r#ref: Some(v1::ItemRef {
                r#type: item_type.into(),
                name: name.into(),
            }),
            state: state as i32,
            ..v1::ItemStatus::default()
        }
    }

    #[test]
    fn states_get_colours_and_subgraphs_nest_as_clusters() {
        let graph = v1::GetGraphResponse {
            intended: vec![
                intended("d", "root", "", &[]),
                intended("f", "a", "net", &["d/root"]),
                intended("f", "b", "net/vlan", &["f/a"]),
            ],
            current: vec![
                current("d", "root", v1::ItemState::Created),
                current("f", "a", v1::ItemState::Failed),
                current("f", "b", v1::ItemState::Pending),
                current("f", "old", v1::ItemState::Deleting),
            ],
            ..v1::GetGraphResponse::default()
        };
        let dot = render("acme", &graph);
        assert!(dot.starts_with("digraph \"acme\" {"), "{dot}");
        assert!(
            dot.contains("\"d/root\" [label=\"d/root\\nCREATED\", fillcolor=palegreen"),
            "{dot}"
        );
        assert!(dot.contains("fillcolor=salmon"), "{dot}");
        assert!(dot.contains("fillcolor=lightgrey"), "{dot}");
        assert!(
            dot.contains("\"f/old\" [label=\"f/old\\nDELETING\", fillcolor=gold, style=\"rounded,filled,dashed\"]"),
            "{dot}"
        );
        assert!(
            dot.contains("subgraph cluster_0 {\n    label=\"net\";"),
            "{dot}"
        );
        assert!(
            dot.contains("    subgraph cluster_1 {\n      label=\"net/vlan\";"),
            "{dot}"
        );
        assert!(dot.contains("\"f/b\" -> \"f/a\";"), "{dot}");
    }
}
