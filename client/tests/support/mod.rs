//! What several of the SDK's integration tests share.

use reconciled_client::prelude::*;

/// A configurator that applies everything at once.
pub struct Instant;

impl Configurator for Instant {
    async fn create(&self, _ctx: &OperationContext, _item: &Item) -> Outcome {
        Outcome::done()
    }
    async fn modify(&self, _ctx: &OperationContext, _previous: &Item, _item: &Item) -> Outcome {
        Outcome::done()
    }
    async fn delete(&self, _ctx: &OperationContext, _item: &Item) -> Outcome {
        Outcome::done()
    }
}
