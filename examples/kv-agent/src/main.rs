//! `kv-agent ENDPOINT TENANT ROOT` with the tenant's token in
//! `RECONCILED_TOKEN`: runs the kv agent until Ctrl-C or SIGTERM.

use kv_agent::{KvFiles, kv_type};
use reconciled_client::prelude::*;

#[reconciled_client::tokio::main(crate = "reconciled_client::tokio")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: kv-agent ENDPOINT TENANT ROOT (token in RECONCILED_TOKEN)";
    let (Some(endpoint), Some(tenant), Some(root)) = (args.next(), args.next(), args.next()) else {
        return Err(usage.into());
    };
    let token = std::env::var("RECONCILED_TOKEN").map_err(|_| usage)?;
    let agent = Agent::builder(endpoint, tenant, token)
        .item_type(kv_type(), KvFiles { root: root.into() })
        .build()?;
    agent.run(shutdown_signal()).await?;
    Ok(())
}
