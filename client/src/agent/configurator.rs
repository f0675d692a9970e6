//! The [`Configurator`] trait that agents implement, and its type-erased
//! form the agent stores.
//!
//! The trait uses Rust's native `async fn` in traits (no macro): methods
//! are declared as returning `impl Future + Send`, and implementations simply
//! write `async fn`. Because such a trait cannot be a `dyn` object, the agent
//! boxes each call through the private [`DynConfigurator`] instead; callers
//! hand over any `C: Configurator` (or an `Arc<C>`, which is a `Configurator`
//! too).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::context::OperationContext;
use super::item::Item;
use super::outcome::{Outcome, ReadOutcome};

/// Applies operations to the items of one or more types: the code an agent
/// brings. Every method must be idempotent (the server may deliver an
/// operation again after a lost result): creating what exists, or deleting
/// what is gone, is success.
///
/// ```
/// use reconciled_client::agent::{Configurator, Item, OperationContext, Outcome};
///
/// struct Noop;
///
/// impl Configurator for Noop {
///     async fn create(&self, _ctx: &OperationContext, _item: &Item) -> Outcome {
///         Outcome::done()
///     }
///     async fn modify(&self, _ctx: &OperationContext, _previous: &Item, _item: &Item) -> Outcome {
///         Outcome::done()
///     }
///     async fn delete(&self, _ctx: &OperationContext, _item: &Item) -> Outcome {
///         Outcome::done()
///     }
/// }
/// ```
///
/// Each operation runs in its own task; a configurator that panics fails the
/// operation with `INTERNAL` (retried).
pub trait Configurator: Send + Sync + 'static {
    /// Creates `item` (its intended value).
    fn create(&self, ctx: &OperationContext, item: &Item) -> impl Future<Output = Outcome> + Send;

    /// Changes the item in place from `previous` (its applied value) to
    /// `item` (its intended value). With
    /// [`OperationContext::previous_uncertain`], `previous` may not be what
    /// the item is now.
    fn modify(
        &self,
        ctx: &OperationContext,
        previous: &Item,
        item: &Item,
    ) -> impl Future<Output = Outcome> + Send;

    /// Deletes `item` (its current value).
    fn delete(&self, ctx: &OperationContext, item: &Item) -> impl Future<Output = Outcome> + Send;

    /// Whether changing `previous` into `item` needs a delete + create rather
    /// than a Modify. Asked only for types that declare
    /// [`TypeSpec::ask_needs_recreate`](super::TypeSpec::ask_needs_recreate);
    /// the default answers `false`.
    fn needs_recreate(&self, previous: &Item, item: &Item) -> bool {
        let _ = (previous, item);
        false
    }

    /// Reads the item's actual state. Asked only for types that declare
    /// [`TypeSpec::supports_read`](super::TypeSpec::supports_read); the
    /// default answers [`ReadOutcome::Unsupported`].
    fn read(
        &self,
        ctx: &OperationContext,
        item: &Item,
    ) -> impl Future<Output = ReadOutcome> + Send {
        let _ = (ctx, item);
        async { ReadOutcome::Unsupported }
    }
}

impl<C: Configurator> Configurator for Arc<C> {
    fn create(&self, ctx: &OperationContext, item: &Item) -> impl Future<Output = Outcome> + Send {
        C::create(self, ctx, item)
    }

    fn modify(
        &self,
        ctx: &OperationContext,
        previous: &Item,
        item: &Item,
    ) -> impl Future<Output = Outcome> + Send {
        C::modify(self, ctx, previous, item)
    }

    fn delete(&self, ctx: &OperationContext, item: &Item) -> impl Future<Output = Outcome> + Send {
        C::delete(self, ctx, item)
    }

    fn needs_recreate(&self, previous: &Item, item: &Item) -> bool {
        C::needs_recreate(self, previous, item)
    }

    fn read(
        &self,
        ctx: &OperationContext,
        item: &Item,
    ) -> impl Future<Output = ReadOutcome> + Send {
        C::read(self, ctx, item)
    }
}

/// A boxed future borrowing the configurator and the operation's data.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The object-safe form of [`Configurator`] the agent stores per type.
pub(crate) trait DynConfigurator: Send + Sync + 'static {
    fn create<'a>(&'a self, ctx: &'a OperationContext, item: &'a Item) -> BoxFuture<'a, Outcome>;
    fn modify<'a>(
        &'a self,
        ctx: &'a OperationContext,
        previous: &'a Item,
        item: &'a Item,
    ) -> BoxFuture<'a, Outcome>;
    fn delete<'a>(&'a self, ctx: &'a OperationContext, item: &'a Item) -> BoxFuture<'a, Outcome>;
    fn needs_recreate(&self, previous: &Item, item: &Item) -> bool;
    fn read<'a>(&'a self, ctx: &'a OperationContext, item: &'a Item) -> BoxFuture<'a, ReadOutcome>;
}

impl<C: Configurator> DynConfigurator for C {
    fn create<'a>(&'a self, ctx: &'a OperationContext, item: &'a Item) -> BoxFuture<'a, Outcome> {
        Box::pin(Configurator::create(self, ctx, item))
    }

    fn modify<'a>(
        &'a self,
        ctx: &'a OperationContext,
        previous: &'a Item,
        item: &'a Item,
    ) -> BoxFuture<'a, Outcome> {
        Box::pin(Configurator::modify(self, ctx, previous, item))
    }

    fn delete<'a>(&'a self, ctx: &'a OperationContext, item: &'a Item) -> BoxFuture<'a, Outcome> {
        Box::pin(Configurator::delete(self, ctx, item))
    }

    fn needs_recreate(&self, previous: &Item, item: &Item) -> bool {
        Configurator::needs_recreate(self, previous, item)
    }

    fn read<'a>(&'a self, ctx: &'a OperationContext, item: &'a Item) -> BoxFuture<'a, ReadOutcome> {
        Box::pin(Configurator::read(self, ctx, item))
    }
}
