//! One copy of each identity for the items of a request.
//!
//! Every dependency names its target by type and name. Decoded from the
//! wire or the store, each of those is an identity of its own, although
//! on a deep graph a dozen dependencies name the same item and every item
//! has the same few types. [`IdentitySharing`] hands out one copy per
//! identity: the intended graph's own when it already mentions the
//! identity, otherwise the first one seen in the request.

use std::collections::HashSet;
use std::sync::Arc;

use rustc_hash::FxHashSet;

use super::graphs::IntendedGraph;
use super::item::{Item, ItemRef};

/// Shares identities between the items of one request and the graph they
/// go into.
#[derive(Debug)]
pub struct IdentitySharing<'g> {
    graph: &'g IntendedGraph,
    identities: FxHashSet<ItemRef>,
    types: HashSet<Arc<str>>,
}

impl<'g> IdentitySharing<'g> {
    /// Sharing with the identities of `graph`.
    pub fn new(graph: &'g IntendedGraph) -> Self {
        Self {
            graph,
            identities: FxHashSet::default(),
            types: HashSet::new(),
        }
    }

    /// Makes `item` and every dependency of it name their identities by
    /// the shared copies.
    pub fn share_identities(&mut self, item: &mut Item) {
        item.identity = self.shared(&item.identity);
        for dependency in &mut item.dependencies {
            dependency.requires = self.shared(&dependency.requires);
        }
    }

    /// The shared copy of `identity`.
    pub fn shared(&mut self, identity: &ItemRef) -> ItemRef {
        if let Some(shared) = self.graph.shared_identity(identity) {
            return shared.clone();
        }
        if let Some(shared) = self.identities.get(identity) {
            return shared.clone();
        }
        let shared = match self.types.get(identity.item_type()) {
            Some(item_type) => identity.sharing_type(item_type),
            None => {
                self.types.insert(identity.item_type().clone());
                identity.clone()
            }
        };
        self.identities.insert(shared.clone());
        shared
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Dependency, IntendedItem};

    fn requiring(name: &str, targets: &[&str]) -> Item {
        let mut item = Item::new("t", name, Default::default());
        item.dependencies = targets
            .iter()
            .map(|target| Dependency::on(ItemRef::new("t", target)))
            .collect();
        item
    }

    #[test]
    fn items_and_dependencies_naming_one_identity_share_its_text_with_each_other_and_the_graph() {
        let mut graph = IntendedGraph::default();
        let known = IntendedItem::compile(requiring("a", &["b"]), 1).expect("compiles");
        graph.insert(known);
        let in_graph = graph
            .shared_identity(&ItemRef::new("t", "b"))
            .expect("b is mentioned")
            .clone();

        let mut sharing = IdentitySharing::new(&graph);
        let mut first = requiring("x", &["b", "c"]);
        let mut second = requiring("y", &["c", "b"]);
        sharing.share_identities(&mut first);
        sharing.share_identities(&mut second);

        let part = |item: &Item, index: usize| item.dependencies[index].requires.clone();
        assert!(part(&first, 0).ptr_eq(&in_graph));
        assert!(part(&second, 1).ptr_eq(&in_graph));
        assert!(part(&first, 1).ptr_eq(&part(&second, 0)));
        let mut c = requiring("c", &[]);
        sharing.share_identities(&mut c);
        assert!(c.identity.ptr_eq(&part(&first, 1)));
        // Identities new to the graph share the type text of the others.
        assert!(Arc::ptr_eq(c.item_type(), first.item_type()));
        // Sharing changes no identity.
        assert_eq!(part(&first, 1), ItemRef::new("t", "c"));
        assert_eq!(part(&second, 1), ItemRef::new("t", "b"));
    }
}
