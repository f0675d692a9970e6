//! The kv agent end to end: the real server, a tenant, the agent, an intent.

use kv_agent::{KvFiles, kv_type};
use reconciled_client::prelude::*;
use reconciled_client::testkit::TestServer;

#[reconciled_client::tokio::test(crate = "reconciled_client::tokio")]
async fn a_key_becomes_a_file_and_goes_away_with_its_item() -> Result<(), Box<dyn std::error::Error>>
{
    let root = std::env::temp_dir().join(format!("kv-agent-test-{}", std::process::id()));
    std::fs::create_dir_all(&root)?;
    let server = TestServer::start().await?;
    let tenant = server.tenant("acme").await?;
    let files = KvFiles { root: root.clone() };
    let agent = tenant
        .start_agent(tenant.agent("kv-1").item_type(kv_type(), files))
        .await?;

    let motd = Item::new("kv", "motd")
        .with_property("key", "motd")
        .with_property("value", "hi");
    tenant.converge([motd]).await?;
    assert_eq!(std::fs::read_to_string(root.join("motd"))?, "hi");

    tenant.converge([]).await?;
    assert!(!root.join("motd").exists());
    agent.stop().await?;
    Ok(std::fs::remove_dir_all(root)?)
}
