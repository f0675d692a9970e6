//! `kv-agent ROOT`: runs the kv agent until Ctrl-C or SIGTERM. The server,
//! tenant and token come from the variables reconctl reads
//! (`RECONCILED_ADDR`, `RECONCILED_TENANT`, `RECONCILED_TOKEN` or
//! `RECONCILED_TOKEN_FILE`; see `Agent::builder_from_env`).

use kv_agent::{KvFiles, kv_type};
use reconciled_client::prelude::*;

#[reconciled_client::tokio::main(crate = "reconciled_client::tokio")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // INFO and above, whatever features the workspace turns on for
    // tracing-subscriber (its `env-filter` would otherwise hide INFO
    // until RUST_LOG is set).
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .init();
    let root = std::env::args().nth(1).ok_or("usage: kv-agent ROOT")?;
    let agent = Agent::builder_from_env()?
        .item_type(kv_type(), KvFiles { root: root.into() })
        .build()?;
    agent.run(shutdown_signal()).await?;
    Ok(())
}
