//! The `reconciled.v1.Reconciler` service: intents, graphs, status and
//! external reports of one tenant.

use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::Arc;

use reconciled_proto::v1;
use reconciled_proto::v1::reconciler_server::Reconciler;
use tonic::{Request, Response, Status};
use tracing::instrument;

use std::time::Duration;

use crate::engine::plan::WaitReason;
use crate::graph::ItemState;
use crate::graph::validate::validate_items;
use crate::graph::{ItemRef, subgraph_contains};
use crate::status::ApiError;
use crate::tenant::oplog::LogEntry;
use crate::tenant::submit::normalize_subgraph;
use crate::tenant::{TenantHandle, TenantSnapshot, ValidatedSubmit};
use crate::wire::{
    duration_to_ms, intended_item_to_proto, item_from_proto_at, item_ref_to_proto, item_status,
    operation_error_to_status, operation_kind_to_proto, plan_to_proto_with_items,
    timestamp_from_ms,
};

use super::context::{ApiContext, invalid};
use super::externals::validate_external_reports;
use super::paging::PageToken;
use super::views::tenant_status;

/// How long `Reconcile{wait}` waits when the request names no timeout,
/// and the longest it waits.
const DEFAULT_RECONCILE_TIMEOUT: Duration = Duration::from_secs(60);
const MAX_RECONCILE_TIMEOUT: Duration = Duration::from_secs(600);
/// Operations shown in a plan or an operation log.
const SHOWN_OPERATIONS: usize = 1_000;
/// Items per GetGraph page when the request names no size, and the most.
const DEFAULT_PAGE_SIZE: usize = 500;
const MAX_PAGE_SIZE: usize = 5_000;

/// The Reconciler service.
#[derive(Clone)]
pub struct ReconcilerService {
    context: ApiContext,
}

impl ReconcilerService {
    /// A service over the shared API context.
    pub fn new(context: ApiContext) -> Self {
        Self { context }
    }
}

use super::watch::WatchStream;

#[tonic::async_trait]
impl Reconciler for ReconcilerService {
    #[instrument(skip_all, fields(tenant = %request.get_ref().tenant))]
    async fn submit_intent(
        &self,
        request: Request<v1::SubmitIntentRequest>,
    ) -> Result<Response<v1::SubmitIntentResponse>, Status> {
        let caller = self.context.caller(request.metadata())?;
        let request = request.into_inner();
        let handle = self.context.tenant(caller, &request.tenant)?;
        check_tenant_request_items(&handle, request.items.len())?;
        let validated = self.validate_submit(request)?;
        let outcome = handle.submit(validated).await.map_err(ApiError::from)?;
        let snapshot = handle.snapshots.latest();
        let plan = plan_to_proto_with_items(
            &outcome.plan,
            SHOWN_OPERATIONS,
            &snapshot.intended,
            &snapshot.current,
        );
        Ok(Response::new(v1::SubmitIntentResponse {
            generation: outcome.generation,
            changed: outcome.changed,
            plan: Some(plan),
            revision: outcome.revision,
        }))
    }

    #[instrument(skip_all, fields(tenant = %request.get_ref().tenant))]
    async fn reconcile(
        &self,
        request: Request<v1::ReconcileRequest>,
    ) -> Result<Response<v1::ReconcileResponse>, Status> {
        let caller = self.context.caller(request.metadata())?;
        let request = request.into_inner();
        let handle = self.context.tenant(caller, &request.tenant)?;
        let subgraph = normalize_subgraph(&request.subgraph)
            .map_err(|problem| invalid("subgraph", problem))?;
        let timeout = match &request.timeout {
            Some(timeout) => Duration::from_millis(
                duration_to_ms(timeout, "timeout")
                    .map_err(|v| ApiError::invalid_argument(vec![v]))?,
            ),
            None => DEFAULT_RECONCILE_TIMEOUT,
        }
        .min(MAX_RECONCILE_TIMEOUT);
        let max_no_progress = match request.max_no_progress_iterations {
            0 => 3,
            n => n,
        };
        let log = handle.snapshots.log();
        let first_entry = log.next_sequence();
        let mut updates = handle.snapshots.subscribe();
        handle
            .reconcile(request.refresh)
            .await
            .map_err(ApiError::from)?;
        let mut iterations = 1u32;
        let mut outcome = scope_outcome(&handle.snapshots.latest(), &subgraph);
        if request.wait {
            let deadline = tokio::time::Instant::now() + timeout;
            let mut no_progress = 0;
            while outcome == ScopeOutcome::Working
                || (outcome == ScopeOutcome::Idle && no_progress < max_no_progress)
            {
                if outcome == ScopeOutcome::Idle {
                    // Nothing in flight and not done: run another pass and see
                    // whether it changes anything.
                    let before = handle.snapshots.latest().record.revision;
                    handle.reconcile(false).await.map_err(ApiError::from)?;
                    iterations += 1;
                    if handle.snapshots.latest().record.revision == before {
                        no_progress += 1;
                    } else {
                        no_progress = 0;
                    }
                    outcome = scope_outcome(&handle.snapshots.latest(), &subgraph);
                    continue;
                }
                tokio::select! {
                    changed = updates.changed() => {
                        if changed.is_err() {
                            break;
                        }
                    }
                    () = tokio::time::sleep_until(deadline) => break,
                }
                outcome = scope_outcome(&handle.snapshots.latest(), &subgraph);
            }
        }
        let snapshot = handle.snapshots.latest();
        let entries: Vec<_> = log
            .since(first_entry)
            .into_iter()
            .filter(|entry| in_scope(&snapshot, &entry.item, &subgraph))
            .collect();
        let operations_total = u32::try_from(entries.len()).unwrap_or(u32::MAX);
        let truncated = entries.len() > SHOWN_OPERATIONS;
        Ok(Response::new(v1::ReconcileResponse {
            iterations,
            converged: outcome == ScopeOutcome::Converged,
            require_rerun: outcome != ScopeOutcome::Converged && outcome != ScopeOutcome::Stalled,
            operation_log: entries
                .iter()
                .take(SHOWN_OPERATIONS)
                .map(log_entry_to_proto)
                .collect(),
            operations_total,
            truncated,
            status: Some(tenant_status(&snapshot)),
        }))
    }

    type WatchStream = WatchStream;

    #[instrument(skip_all, fields(tenant = %request.get_ref().tenant, start_revision = request.get_ref().start_revision))]
    async fn watch(
        &self,
        request: Request<v1::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let caller = self.context.caller(request.metadata())?;
        let revoked = self.context.revocation(caller, request.metadata())?;
        let request = request.into_inner();
        let handle = self.context.tenant(caller, &request.tenant)?;
        let stream = super::watch::watch_tenant(&handle, &request, self.context.watch)?;
        Ok(Response::new(super::watch::until_revoked(stream, revoked)))
    }

    #[instrument(skip_all, fields(tenant = %request.get_ref().tenant))]
    async fn get_graph(
        &self,
        request: Request<v1::GetGraphRequest>,
    ) -> Result<Response<v1::GetGraphResponse>, Status> {
        let caller = self.context.caller(request.metadata())?;
        let request = request.into_inner();
        let handle = self.context.tenant(caller, &request.tenant)?;
        let subgraph = normalize_subgraph(&request.subgraph)
            .map_err(|problem| invalid("subgraph", problem))?;
        let (snapshot, after) = if request.page_token.is_empty() {
            (handle.snapshots.latest(), None)
        } else {
            let token = PageToken::decode(&request.page_token).ok_or_else(|| {
                invalid(
                    "page_token",
                    "not a page token from GetGraph; omit it to start over",
                )
            })?;
            let snapshot = handle
                .snapshots
                .at_revision(token.revision)
                .ok_or(ApiError::PageTokenExpired)?;
            (snapshot, Some(token.after))
        };
        let view = v1::GraphView::try_from(request.view).unwrap_or(v1::GraphView::Both);
        let page_size = match request.page_size {
            0 => DEFAULT_PAGE_SIZE,
            size => (size as usize).min(MAX_PAGE_SIZE),
        };
        Ok(Response::new(graph_page(
            &snapshot, view, &subgraph, after, page_size,
        )))
    }

    #[instrument(skip_all, fields(tenant = %request.get_ref().tenant))]
    async fn get_status(
        &self,
        request: Request<v1::GetStatusRequest>,
    ) -> Result<Response<v1::GetStatusResponse>, Status> {
        let caller = self.context.caller(request.metadata())?;
        let handle = self.context.tenant(caller, &request.get_ref().tenant)?;
        let snapshot = handle.snapshots.latest();
        Ok(Response::new(v1::GetStatusResponse {
            status: Some(tenant_status(&snapshot)),
        }))
    }

    #[instrument(skip_all, fields(tenant = %request.get_ref().tenant))]
    async fn report_external(
        &self,
        request: Request<v1::ReportExternalRequest>,
    ) -> Result<Response<v1::ReportExternalResponse>, Status> {
        let caller = self.context.caller(request.metadata())?;
        let request = request.into_inner();
        let handle = self.context.tenant(caller, &request.tenant)?;
        let changes = validate_external_reports(
            request.reports,
            "reports",
            &handle,
            &self.context.limits,
            self.context.default_max_items,
        )?;
        let revision = handle
            .report_external(changes)
            .await
            .map_err(ApiError::from)?;
        Ok(Response::new(v1::ReportExternalResponse { revision }))
    }
}

/// Refuses a request with more items than the tenant's own
/// `max_request_items` (0: only the server's limit applies).
fn check_tenant_request_items(handle: &TenantHandle, items: usize) -> Result<(), ApiError> {
    let limit = handle.snapshots.latest().record.limits.max_request_items;
    if limit > 0 && items as u64 > limit {
        return Err(ApiError::QuotaExceeded {
            subject: "max_request_items".into(),
            description: format!(
                "{items} items are over the tenant's limit of {limit} per request; split the intent into subgraphs"
            ),
        });
    }
    Ok(())
}

impl ReconcilerService {
    /// Converts and validates a SubmitIntent; every problem is reported at
    /// once with its field path.
    fn validate_submit(
        &self,
        request: v1::SubmitIntentRequest,
    ) -> Result<ValidatedSubmit, ApiError> {
        let subgraph = normalize_subgraph(&request.subgraph)
            .map_err(|problem| invalid("subgraph", problem))?;
        if request.items.len() > self.context.limits.max_request_items {
            return Err(invalid(
                "items",
                format!(
                    "{} items are over the limit of {} per request; split the intent into subgraphs",
                    request.items.len(),
                    self.context.limits.max_request_items
                ),
            ));
        }
        let mut violations = Vec::new();
        let mut items = Vec::with_capacity(request.items.len());
        for (index, item) in request.items.into_iter().enumerate() {
            match item_from_proto_at(item, &format!("items[{index}]")) {
                Ok(item) => items.push(item),
                Err(mut problems) => violations.append(&mut problems),
            }
        }
        if !violations.is_empty() {
            return Err(ApiError::invalid_argument(violations));
        }
        let predicates =
            validate_items(&items, &self.context.limits).map_err(ApiError::invalid_argument)?;
        Ok(ValidatedSubmit {
            subgraph,
            items: items.into_iter().zip(predicates).collect(),
            expected_generation: request.expected_generation,
            dry_run: request.dry_run,
        })
    }
}

/// How far a Reconcile's scope got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ScopeOutcome {
    /// Every intended item in scope is created and up to date.
    Converged,
    /// Something in scope failed terminally or waits on a terminal failure.
    Stalled,
    /// Operations in flight or ready: wait for results.
    Working,
    /// Nothing runs and it is not converged (waiting for a dependency, a
    /// configurator or a retry).
    Idle,
}

/// Where the items of `scope` stand in `snapshot`.
fn scope_outcome(snapshot: &TenantSnapshot, scope: &str) -> ScopeOutcome {
    let mut outcome = ScopeOutcome::Converged;
    let busy = |item: &ItemRef| {
        snapshot
            .current
            .get(item)
            .is_some_and(|c| c.is_busy() && c.state != ItemState::Unknown)
    };
    for (item, entry) in snapshot.intended.iter() {
        if !subgraph_contains(scope, &entry.item.subgraph) || entry.item.external {
            continue;
        }
        if busy(item) {
            return ScopeOutcome::Working;
        }
        if let Some(waiting) = snapshot.waiting.get(item) {
            if waiting.reason == WaitReason::TerminalFailure
                || waiting
                    .blocked_by
                    .iter()
                    .any(|b| b.why.contains("failed terminally"))
            {
                outcome = ScopeOutcome::Stalled;
            } else if outcome == ScopeOutcome::Converged {
                outcome = ScopeOutcome::Idle;
            }
            continue;
        }
        let up_to_date = snapshot.current.get(item).is_some_and(|current| {
            current.state == ItemState::Created
                && current
                    .applied
                    .as_ref()
                    .is_some_and(|applied| applied.same_content(&entry.item))
        });
        if !up_to_date {
            // Planned but not dispatched yet: the owner is working on it.
            return ScopeOutcome::Working;
        }
    }
    if outcome == ScopeOutcome::Converged {
        let leftovers = snapshot.current.iter().any(|(item, current)| {
            scope.is_empty()
                && snapshot.intended.get(item).is_none()
                && !current.applied.as_ref().is_some_and(|a| a.external)
        });
        if leftovers {
            return ScopeOutcome::Working;
        }
    }
    outcome
}

/// One operation log entry as a proto message.
fn log_entry_to_proto(entry: &LogEntry) -> v1::OperationLogEntry {
    v1::OperationLogEntry {
        item: Some(item_ref_to_proto(&entry.item)),
        kind: operation_kind_to_proto(entry.kind).into(),
        start_time: Some(timestamp_from_ms(entry.started_ms)),
        end_time: entry.ended_ms.map(timestamp_from_ms),
        in_progress: entry.ended_ms.is_none(),
        error: entry.error.as_ref().map(operation_error_to_status),
        previous_error: entry.previous_error.as_ref().map(operation_error_to_status),
        op_id: entry.op_id.clone(),
        attempt: entry.attempt,
    }
}

/// Whether `item` is in subgraph `scope` (by its intended listing; items
/// that are not intended belong to the root only).
fn in_scope(snapshot: &TenantSnapshot, item: &ItemRef, scope: &str) -> bool {
    match snapshot.intended.get(item) {
        Some(entry) => subgraph_contains(scope, &entry.item.subgraph),
        None => scope.is_empty(),
    }
}

/// One page of a graph listing: the next `page_size` identities after
/// `after` among intended and current items, filtered by subgraph.
fn graph_page(
    snapshot: &Arc<TenantSnapshot>,
    view: v1::GraphView,
    subgraph: &str,
    after: Option<ItemRef>,
    page_size: usize,
) -> v1::GetGraphResponse {
    let lower = match &after {
        Some(key) => Bound::Excluded(key.clone()),
        None => Bound::Unbounded,
    };
    let with_current = view != v1::GraphView::Intended;
    let mut keys: BTreeSet<ItemRef> = BTreeSet::new();
    let mut intended_keys = snapshot
        .intended
        .range((lower.clone(), Bound::Unbounded))
        .map(|(k, _)| k);
    let mut current_keys = snapshot
        .current
        .range((lower, Bound::Unbounded))
        .map(|(k, _)| k);
    let mut next_intended = intended_keys.next();
    let mut next_current = if with_current {
        current_keys.next()
    } else {
        None
    };
    let mut last = None;
    let mut more = false;
    loop {
        let key = match (next_intended, next_current) {
            (None, None) => break,
            (Some(i), None) => {
                next_intended = intended_keys.next();
                i
            }
            (None, Some(c)) => {
                next_current = current_keys.next();
                c
            }
            (Some(i), Some(c)) => {
                if i <= c {
                    next_intended = intended_keys.next();
                    if i == c {
                        next_current = current_keys.next();
                    }
                    i
                } else {
                    next_current = current_keys.next();
                    c
                }
            }
        };
        if !in_scope(snapshot, key, subgraph) {
            continue;
        }
        if keys.len() == page_size {
            more = true;
            break;
        }
        keys.insert(key.clone());
        last = Some(key.clone());
    }
    let mut response = v1::GetGraphResponse {
        revision: snapshot.record.revision,
        generation: snapshot.record.generation,
        ..v1::GetGraphResponse::default()
    };
    for key in &keys {
        let intended = snapshot.intended.get(key);
        if view != v1::GraphView::Current
            && let Some(entry) = intended
        {
            response.intended.push(intended_item_to_proto(entry));
        }
        if with_current {
            response.current.push(item_status(
                key,
                snapshot.current.get(key).map(AsRef::as_ref),
                intended.map(AsRef::as_ref),
                snapshot.waiting.get(key),
            ));
        }
    }
    if more && let Some(after) = last {
        response.next_page_token = PageToken {
            revision: snapshot.record.revision,
            after,
        }
        .encode();
    }
    response
}
