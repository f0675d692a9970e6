//! `ListTenants` with replicas on etcd: the fleet's tenants from the
//! cluster's catalog, in name order, each with its status as the replica
//! that serves it reports it (the counts of items and operations live
//! only there). A tenant served here is read from its snapshot; one
//! served elsewhere is asked of its owner (`GetTenant`, forwarded with the
//! caller's credentials, a page's tenants at once); one nobody serves
//! right now (moving) shows what the catalog knows: its conditions.

use std::collections::BTreeMap;

use reconciled_proto::v1;
use reconciled_proto::v1::tenants_client::TenantsClient;
use tonic::metadata::{MetadataMap, MetadataValue};

use crate::cluster::forward::FORWARDED_BY;
use crate::cluster::{Cluster, Route};
use crate::status::reason;
use crate::wire::{condition_to_proto, timestamp_from_ms};

use super::context::ApiContext;
use super::views::quarantined_to_proto;

/// Owners asked at once for the tenants of one page.
const PARALLEL_ASKS: usize = 64;

/// One page of the fleet's tenants after `after`, and the next page's
/// token (empty on the last page).
pub async fn list(
    context: &ApiContext,
    cluster: &Cluster,
    metadata: MetadataMap,
    after: Option<&str>,
    page_size: usize,
) -> (Vec<v1::Tenant>, String) {
    let mut names = cluster.catalog().names_after(after, page_size + 1);
    let more = names.len() > page_size;
    names.truncate(page_size);
    let mut found: BTreeMap<String, v1::Tenant> = BTreeMap::new();
    let mut asks = tokio::task::JoinSet::new();
    for name in &names {
        if let Some(handle) = context.directory.get(name) {
            found.insert(name.clone(), context.tenant_of(&handle.snapshots.latest()));
            continue;
        }
        if let Some(quarantined) = context.directory.quarantined(name) {
            found.insert(
                name.clone(),
                quarantined_to_proto(name.clone(), &quarantined),
            );
            continue;
        }
        let Route::Elsewhere(owner) = cluster.route(name) else {
            found.insert(name.clone(), from_catalog(cluster, name));
            continue;
        };
        let Ok(channel) = cluster.peers().channel(&owner) else {
            found.insert(name.clone(), from_catalog(cluster, name));
            continue;
        };
        let mut request = tonic::Request::new(v1::GetTenantRequest { name: name.clone() });
        if let Some(authorization) = metadata.get("authorization") {
            request
                .metadata_mut()
                .insert("authorization", authorization.clone());
        }
        if let Ok(replica) = MetadataValue::try_from(cluster.replica()) {
            request.metadata_mut().insert(FORWARDED_BY, replica);
        }
        let name = name.clone();
        asks.spawn(async move {
            let answer = TenantsClient::new(channel).get_tenant(request).await;
            (name, answer)
        });
        if asks.len() >= PARALLEL_ASKS
            && let Some(Ok((name, answer))) = asks.join_next().await
        {
            found.insert(name.clone(), answered(cluster, name, answer));
        }
    }
    while let Some(joined) = asks.join_next().await {
        if let Ok((name, answer)) = joined {
            found.insert(name.clone(), answered(cluster, name, answer));
        }
    }
    let next_page_token = match (more, names.last()) {
        (true, Some(last)) => super::paging::encode_text(last),
        _ => String::new(),
    };
    (found.into_values().collect(), next_page_token)
}

/// What an owner's `GetTenant` answer shows of tenant `name`.
fn answered(
    cluster: &Cluster,
    name: String,
    answer: Result<tonic::Response<v1::Tenant>, tonic::Status>,
) -> v1::Tenant {
    match answer {
        Ok(tenant) => tenant.into_inner(),
        Err(status) if quarantined(&status) => {
            // The owner's own words, as its entry holds them (what the
            // fleet stream shows), else its refusal's.
            let error = cluster
                .catalog()
                .entry(&name)
                .map(|entry| entry.quarantine_error)
                .filter(|error| !error.is_empty())
                .unwrap_or_else(|| status.message().to_owned());
            v1::Tenant {
                name,
                quarantine_error: error,
                ..v1::Tenant::default()
            }
        }
        Err(_) => from_catalog(cluster, &name),
    }
}

/// Whether `status` says the tenant is quarantined on its owner.
fn quarantined(status: &tonic::Status) -> bool {
    use tonic_types::StatusExt as _;
    status
        .get_details_error_info()
        .is_some_and(|info| info.reason == reason::TENANT_QUARANTINED)
}

/// Tenant `name` as the catalog knows it: its limits and conditions (the
/// counts only its owner knows are left out), and its quarantine if the
/// replica that claimed it wrote one.
fn from_catalog(cluster: &Cluster, name: &str) -> v1::Tenant {
    let entry = cluster.catalog().entry(name);
    v1::Tenant {
        name: name.to_owned(),
        created_at: entry
            .as_ref()
            .map(|entry| timestamp_from_ms(entry.created_at_ms)),
        limits: entry.as_ref().map(|entry| entry.limits.to_proto()),
        status: Some(v1::TenantStatus {
            tenant: name.to_owned(),
            conditions: entry
                .as_ref()
                .map(|entry| entry.conditions.iter().map(condition_to_proto).collect())
                .unwrap_or_default(),
            owner: cluster.owner_address(name).unwrap_or_default(),
            ..v1::TenantStatus::default()
        }),
        quarantine_error: entry
            .map(|entry| entry.quarantine_error)
            .unwrap_or_default(),
    }
}
