//! Agents connected per tenant, against the tenants' `max_agents`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::lock;

/// Agents connected per tenant, counted by distinct agent id (a reconnect
/// of a connected agent id is always admitted: it takes the old session
/// over).
#[derive(Debug)]
pub struct AgentCounts {
    default_limit: usize,
    live: Mutex<HashMap<u64, HashMap<String, usize>>>,
}

/// Why an agent was not admitted.
#[derive(Debug, thiserror::Error)]
#[error(
    "the tenant has {connected} agents connected, its limit (max_agents); stop one or \
     raise the tenant's limit"
)]
pub struct TooManyAgents {
    /// Agents connected now.
    pub connected: usize,
}

impl AgentCounts {
    /// Counts with `default_limit` for tenants whose own limit is 0.
    pub fn new(default_limit: usize) -> Arc<Self> {
        Arc::new(Self {
            default_limit,
            live: Mutex::default(),
        })
    }

    /// Admits agent `agent_id` of tenant `tenant_id` (whose own limit is
    /// `tenant_limit`, 0 for the default); the agent counts until the
    /// returned slot is dropped.
    pub fn admit(
        self: &Arc<Self>,
        tenant_id: u64,
        tenant_limit: u64,
        agent_id: &str,
    ) -> Result<AgentSlot, TooManyAgents> {
        let limit = match tenant_limit {
            0 => self.default_limit,
            limit => usize::try_from(limit).unwrap_or(usize::MAX),
        };
        let mut live = lock(&self.live);
        let agents = live.entry(tenant_id).or_default();
        if !agents.contains_key(agent_id) && agents.len() >= limit {
            return Err(TooManyAgents {
                connected: agents.len(),
            });
        }
        *agents.entry(agent_id.to_owned()).or_default() += 1;
        Ok(AgentSlot {
            counts: self.clone(),
            tenant_id,
            agent_id: agent_id.to_owned(),
        })
    }

    /// Agents connected now, all tenants together.
    pub fn connected(&self) -> usize {
        lock(&self.live).values().map(HashMap::len).sum()
    }

    fn release(&self, tenant_id: u64, agent_id: &str) {
        let mut live = lock(&self.live);
        let Some(agents) = live.get_mut(&tenant_id) else {
            return;
        };
        if let Some(sessions) = agents.get_mut(agent_id) {
            *sessions -= 1;
            if *sessions == 0 {
                agents.remove(agent_id);
            }
        }
        if agents.is_empty() {
            live.remove(&tenant_id);
        }
    }
}

/// One session's place in [`AgentCounts`]; released on drop.
#[derive(Debug)]
pub struct AgentSlot {
    counts: Arc<AgentCounts>,
    tenant_id: u64,
    agent_id: String,
}

impl Drop for AgentSlot {
    fn drop(&mut self) {
        self.counts.release(self.tenant_id, &self.agent_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_count_by_id_and_a_reconnect_is_admitted_at_the_limit() {
        let counts = AgentCounts::new(1);
        let first = counts.admit(7, 0, "a").expect("room");
        let again = counts.admit(7, 0, "a").expect("same agent reconnects");
        assert!(counts.admit(7, 0, "b").is_err());
        assert!(counts.admit(8, 0, "b").is_ok(), "other tenants unaffected");
        drop(first);
        assert!(counts.admit(7, 0, "b").is_err(), "a still has a session");
        drop(again);
        assert!(counts.admit(7, 0, "b").is_ok());
        assert!(
            counts.admit(7, 2, "c").is_ok(),
            "the tenant's own limit wins"
        );
    }
}
