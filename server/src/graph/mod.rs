//! The item model and everything about graphs that needs no I/O: identities,
//! equality, validation, dependency indexes and `must_satisfy` predicates.

mod graphs;
mod id_list;
mod identity;
mod ids;
mod item;
pub mod predicate;
mod properties;
mod rare_texts;
mod sharing;
mod state;
pub mod validate;

pub use graphs::{
    CurrentGraph, CurrentSlotHint, IntendedGraph, IntendedItem, ItemSummary, Predicates,
    subgraph_contains,
};
pub use ids::ItemId;
pub use item::{Dependency, Item, ItemRef};
pub use predicate::{Predicate, PredicateError};
pub use properties::{MAX_PROPERTY_DEPTH, Properties};
pub use sharing::IdentitySharing;
pub use state::{
    CurrentItem, InFlight, ItemState, OperationError, OperationKind, RareFields, RetryOf, code,
    properties_after_modify,
};
