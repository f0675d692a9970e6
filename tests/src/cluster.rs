//! Replicas of the real `reconciled` binary on one real etcd (DESIGN
//! section 11), for tests: started with a short lease TTL under a key
//! prefix of their own, each a [`ServerProcess`] that can be killed,
//! paused and restarted; and the questions the tests ask of them (who
//! serves a tenant, as each replica says).

use std::net::SocketAddr;
use std::time::Duration;

use reconciled::cluster::placement;
use reconciled_proto::v1;
use tonic::transport::Channel;

use crate::agents::DEADLINE;
use crate::api;
use crate::etcd::EtcdCluster;
use crate::server::{PORT_TAKEN, START_ATTEMPTS, free_loopback_addr};
use crate::{ServerOptions, ServerProcess, random_token};

/// The lease TTL the test replicas hold their tenants under (etcd's
/// minimum): a replica that dies is replaced after about this long.
pub const TEST_LEASE_SECS: u64 = 2;

/// How often a wait polls the replicas.
const POLL: Duration = Duration::from_millis(25);

/// A random etcd key prefix, so that tests sharing an etcd never meet.
pub fn random_prefix() -> String {
    format!("/reconciled-test-{:016x}/", rand::random::<u64>())
}

/// Replicas on one etcd, sharing a prefix and an admin token.
#[derive(Debug)]
pub struct Replicas {
    /// The deployment's etcd key prefix.
    pub prefix: String,
    etcd_endpoints: String,
    admin: String,
    lease_secs: u64,
    extra: Vec<String>,
    /// The replicas, in the order they were started.
    pub servers: Vec<ServerProcess>,
}

impl Replicas {
    /// Starts `count` replicas on `etcd` (all at once) with a lease TTL of
    /// [`TEST_LEASE_SECS`], and waits until every one is ready (joined,
    /// serving its tenants).
    pub async fn start(etcd: &EtcdCluster, count: usize) -> Self {
        Self::start_with(etcd, count, TEST_LEASE_SECS, &[]).await
    }

    /// [`start`](Self::start) with this lease TTL and extra command-line
    /// arguments for every replica.
    pub async fn start_with(
        etcd: &EtcdCluster,
        count: usize,
        lease_secs: u64,
        extra: &[&str],
    ) -> Self {
        let mut replicas = Self {
            prefix: random_prefix(),
            etcd_endpoints: etcd.endpoints_arg(),
            admin: random_token("rcda_test_"),
            lease_secs,
            extra: extra.iter().map(|arg| (*arg).to_owned()).collect(),
            servers: Vec::new(),
        };
        let starting: Vec<_> = (0..count)
            .map(|_| ServerProcess::start(replicas.options()))
            .collect();
        for server in futures::future::join_all(starting).await {
            replicas
                .servers
                .push(server.expect("a replica starts and becomes ready"));
        }
        replicas
    }

    /// The options every replica starts with.
    pub fn options(&self) -> ServerOptions {
        let mut options = ServerOptions::default()
            .admin_token(self.admin.clone())
            .arg("--store")
            .arg("etcd")
            .arg("--etcd-endpoints")
            .arg(self.etcd_endpoints.clone())
            .arg("--etcd-prefix")
            .arg(self.prefix.clone())
            .arg("--cluster-lease-secs")
            .arg(self.lease_secs.to_string());
        for arg in &self.extra {
            options = options.arg(arg.clone());
        }
        options
    }

    /// Starts one more replica; returns its index.
    pub async fn add(&mut self) -> usize {
        self.add_with(&[]).await
    }

    /// Starts one more replica with extra arguments; returns its index.
    pub async fn add_with(&mut self, extra: &[&str]) -> usize {
        let mut options = self.options();
        for arg in extra {
            options = options.arg(*arg);
        }
        let server = ServerProcess::start(options)
            .await
            .expect("a replica starts and becomes ready");
        self.servers.push(server);
        self.servers.len() - 1
    }

    /// Starts one more replica, with extra arguments, on an address that
    /// placement gives at least one of the tenants `tenant_ids` (so that a
    /// test of hand-offs always has one to see); returns its index.
    ///
    /// # Panics
    /// If no replica starts within [`START_ATTEMPTS`] addresses.
    pub async fn add_winning_one_of(&mut self, tenant_ids: &[u64], extra: &[&str]) -> usize {
        let mut last_error = None;
        for _ in 0..START_ATTEMPTS {
            let addr = self.address_winning_one_of(tenant_ids);
            let mut options = self.options().listen(addr);
            for arg in extra {
                options = options.arg(*arg);
            }
            match ServerProcess::start(options).await {
                Ok(server) => {
                    self.servers.push(server);
                    return self.servers.len() - 1;
                }
                // Another process took the port after it was picked.
                Err(error) if format!("{error:#}").contains(PORT_TAKEN) => {
                    last_error = Some(error);
                }
                Err(error) => panic!("a replica starts and becomes ready: {error:#}"),
            }
        }
        panic!("no replica started within {START_ATTEMPTS} addresses: {last_error:?}")
    }

    /// A free loopback address that placement, among the running replicas
    /// and it, gives at least one of `tenant_ids`.
    fn address_winning_one_of(&self, tenant_ids: &[u64]) -> SocketAddr {
        let running: Vec<String> = self
            .servers
            .iter()
            .map(|server| server.addr().to_string())
            .collect();
        loop {
            let candidate = free_loopback_addr().expect("a free loopback port");
            let name = candidate.to_string();
            let wins = tenant_ids.iter().any(|&id| {
                placement::owner_of(
                    id,
                    running.iter().map(String::as_str).chain([name.as_str()]),
                ) == Some(name.as_str())
            });
            if wins {
                return candidate;
            }
        }
    }

    /// The admin token of the deployment.
    pub fn admin_token(&self) -> &str {
        &self.admin
    }

    /// A channel to replica `index`.
    pub async fn channel(&self, index: usize) -> Channel {
        self.servers[index]
            .channel()
            .await
            .expect("connects to the replica")
    }

    /// The gRPC endpoints of every replica (`http://HOST:PORT`).
    pub fn endpoints(&self) -> Vec<String> {
        self.servers.iter().map(ServerProcess::endpoint).collect()
    }

    /// The index of the replica whose address is `address` (`HOST:PORT`).
    pub fn index_of(&self, address: &str) -> Option<usize> {
        self.servers
            .iter()
            .position(|server| server.addr().to_string() == address)
    }

    /// Creates tenant `name` through replica `via`; returns its token.
    pub async fn create_tenant(&self, via: usize, name: &str) -> String {
        api::create_tenant(&self.channel(via).await, &self.admin, name).await
    }

    /// The tenant as replica `via` answers `GetTenant` (forwarded to its
    /// owner when another replica serves it).
    pub async fn tenant(&self, via: usize, name: &str) -> Result<v1::Tenant, tonic::Status> {
        api::tenants(&self.channel(via).await, &self.admin)
            .get_tenant(v1::GetTenantRequest { name: name.into() })
            .await
            .map(tonic::Response::into_inner)
    }

    /// Waits (up to the test [`DEADLINE`]) until tenant `name` shows its
    /// first conditions through replica `via`: its owner's first pass has
    /// committed, writing the tenant record again. A test that tears the
    /// record in etcd does so after it, or that commit writes it whole.
    pub async fn first_pass_committed(&self, via: usize, name: &str) {
        let _settled = crate::agents::poll(
            &format!("tenant {name}'s first conditions"),
            || self.tenant(via, name),
            |answer| {
                answer.as_ref().is_ok_and(|tenant| {
                    tenant
                        .status
                        .as_ref()
                        .is_some_and(|status| !status.conditions.is_empty())
                })
            },
        )
        .await;
    }

    /// The address of the replica serving tenant `name`, as replica `via`
    /// reports it; while the tenant is between owners (a hand-off answers
    /// UNAVAILABLE with NOT_OWNER), until it has one again.
    pub async fn owner(&self, via: usize, name: &str) -> String {
        self.wait_for_owner(via, name, |_| true).await
    }

    /// Waits (up to the test [`DEADLINE`]) until replica `via` reports an
    /// owner of tenant `name` that `accept` takes; returns its address.
    ///
    /// # Panics
    /// At the deadline.
    pub async fn wait_for_owner(
        &self,
        via: usize,
        name: &str,
        mut accept: impl FnMut(&str) -> bool,
    ) -> String {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let last = match self.tenant(via, name).await {
                Ok(tenant) => {
                    let owner = tenant.status.map(|status| status.owner).unwrap_or_default();
                    if !owner.is_empty() && accept(&owner) {
                        return owner;
                    }
                    format!("owner {owner:?}")
                }
                Err(status) => format!("{status}"),
            };
            assert!(
                tokio::time::Instant::now() < deadline,
                "replica {via} did not report an accepted owner of {name:?} within {DEADLINE:?}; last: {last}"
            );
            tokio::time::sleep(POLL).await;
        }
    }
}
