//! The `reconciled.v1.Reconciler` service: intents, graphs, status and
//! external reports of one tenant.

use std::collections::HashSet;
use std::ops::Bound;
use std::sync::Arc;

use reconciled_proto::v1;
use reconciled_proto::v1::reconciler_server::Reconciler;
use tonic::{Request, Response, Status};
use tracing::instrument;

use std::time::Duration;

use crate::engine::intent::normalize_subgraph;
use crate::engine::plan::WaitReason;
use crate::graph::ItemState;
use crate::graph::validate::{ValidationLimits, validate_items};
use crate::graph::{ItemRef, subgraph_contains};
use crate::status::ApiError;
use crate::tenant::oplog::LogEntry;
use crate::tenant::{TenantHandle, TenantSnapshot, ValidatedSubmit, fairly};
use crate::wire::{
    PLAN_LIMIT, duration_to_ms, intended_item_to_proto, item_from_proto, item_ref_to_proto,
    item_status, operation_error_to_status, operation_kind_to_proto,
    plan_to_proto_counting_tenant_waiting, plan_to_proto_with_items, timestamp_from_ms,
    type_spec_to_proto,
};

use super::context::{ApiContext, LARGE_REQUEST_ITEMS, invalid};
use super::externals::validate_external_reports;
use super::paging::{PageToken, decode_text, encode_text, listing_fingerprint};

/// How long `Reconcile{wait}` waits when the request names no timeout,
/// and the longest it waits.
const DEFAULT_RECONCILE_TIMEOUT: Duration = Duration::from_secs(60);
const MAX_RECONCILE_TIMEOUT: Duration = Duration::from_secs(600);
/// Operations shown in an operation log.
const SHOWN_OPERATIONS: usize = 1_000;
/// Items per GetGraph page when the request names no size, and the most.
const DEFAULT_PAGE_SIZE: usize = 500;
const MAX_PAGE_SIZE: usize = 5_000;
/// Bytes of a SubmitIntent reply outside its plan (generation, revision,
/// flags and the plan's own tag and length), with room to spare.
const SUBMIT_REPLY_FIELDS: usize = 64;
/// Bytes kept free in a GetGraph page for its `next_page_token` (a
/// revision and an item identity of at most 2 × 253 bytes, hex-encoded).
const PAGE_TOKEN_ROOM: usize = 2_048;

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
        let large = request.items.len() > LARGE_REQUEST_ITEMS;
        let limits = &self.context.limits;
        let validated = fairly(&self.context.workers, handle.id, large, || {
            validate_submit(request, limits)
        })
        .await?;
        let dry_run = validated.dry_run;
        let outcome = handle
            .submit(validated)
            .await
            .map_err(|error| self.context.owner_failed(&handle.name, error))?;
        let snapshot = handle.snapshots.latest();
        // A dry run's plan is of the intent it did not store: only it
        // knows what would wait. Otherwise every item that waits is counted.
        let mut plan = if dry_run {
            plan_to_proto_with_items(
                &outcome.plan,
                PLAN_LIMIT,
                &snapshot.intended,
                &snapshot.current,
            )
        } else {
            plan_to_proto_counting_tenant_waiting(
                &outcome.plan,
                PLAN_LIMIT,
                &snapshot.intended,
                &snapshot.current,
                snapshot.waiting.len(),
            )
        };
        // The intent is committed: the reply must say so whatever the
        // plan's size, so the plan is cut to fit rather than the call
        // failing with OUT_OF_RANGE.
        let plan_truncated = fit_plan(
            &mut plan,
            self.context.reply_bytes.saturating_sub(SUBMIT_REPLY_FIELDS),
        );
        Ok(Response::new(v1::SubmitIntentResponse {
            generation: outcome.generation,
            changed: outcome.changed,
            plan: Some(plan),
            revision: outcome.revision,
            plan_truncated,
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
            .map_err(|error| self.context.owner_failed(&handle.name, error))?;
        let mut iterations = 1u32;
        let mut outcome = scope_outcome(&handle.snapshots.latest(), &subgraph);
        if request.wait {
            let deadline = tokio::time::Instant::now() + timeout;
            (outcome, iterations) = wait_for_scope(
                &self.context,
                &handle,
                &subgraph,
                &mut updates,
                outcome,
                max_no_progress,
                deadline,
            )
            .await?;
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
            status: Some(self.context.status_of(&snapshot)),
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
        let view = match v1::GraphView::try_from(request.view) {
            Ok(v1::GraphView::Unspecified) => v1::GraphView::Both,
            Ok(view) => view,
            Err(_) => {
                return Err(invalid(
                    "view",
                    format!(
                        "{} is not a graph view; use GRAPH_VIEW_INTENDED, GRAPH_VIEW_CURRENT or \
                         GRAPH_VIEW_BOTH (or leave it unset)",
                        request.view
                    ),
                )
                .into());
            }
        };
        let listing = listing_fingerprint(&[
            &handle.id.to_be_bytes(),
            &(view as i32).to_be_bytes(),
            subgraph.as_bytes(),
        ]);
        let first_page = request.page_token.is_empty();
        let (snapshot, after) = if first_page {
            (handle.snapshots.latest(), None)
        } else {
            let token = PageToken::decode(&request.page_token)
                .filter(|token| token.listing == listing)
                .ok_or_else(|| {
                    invalid(
                        "page_token",
                        "not a page token of this GetGraph listing (tenant, view and subgraph \
                         must stay those of the first page); omit it to start over",
                    )
                })?;
            let snapshot = handle
                .snapshots
                .at_revision(token.revision)
                .ok_or(ApiError::PageTokenExpired)?;
            (snapshot, Some(token.after))
        };
        let page_size = match request.page_size {
            0 => DEFAULT_PAGE_SIZE,
            size => (size as usize).min(MAX_PAGE_SIZE),
        };
        let budget = PageBudget {
            items: page_size,
            bytes: self.context.reply_bytes,
        };
        let large = page_size > LARGE_REQUEST_ITEMS;
        let page = fairly(&self.context.workers, handle.id, large, || {
            graph_page(&snapshot, view, &subgraph, after, budget, listing)
        })
        .await;
        if first_page && !page.next_page_token.is_empty() {
            // The next pages read this revision, however many commits
            // follow (later pages keep it by reading it).
            handle.snapshots.pin(&snapshot);
        }
        Ok(Response::new(page))
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
            status: Some(self.context.status_of(&snapshot)),
        }))
    }

    #[instrument(skip_all, fields(tenant = %request.get_ref().tenant))]
    async fn get_item_types(
        &self,
        request: Request<v1::GetItemTypesRequest>,
    ) -> Result<Response<v1::GetItemTypesResponse>, Status> {
        let caller = self.context.caller(request.metadata())?;
        let handle = self.context.tenant(caller, &request.get_ref().tenant)?;
        let snapshot = handle.snapshots.latest();
        let wanted = &request.get_ref().item_types;
        // A set, so the filter costs the request's length plus the
        // types, not their product; and no longer than any request's list.
        if wanted.len() > self.context.limits.max_request_items {
            return Err(invalid(
                "item_types",
                format!(
                    "{} item types asked for, over the limit of {}; ask for fewer, or none for all",
                    wanted.len(),
                    self.context.limits.max_request_items
                ),
            )
            .into());
        }
        let after = match request.get_ref().page_token.as_str() {
            "" => None,
            token => Some(decode_text(token).ok_or_else(|| {
                invalid(
                    "page_token",
                    "not a page token of GetItemTypes: pass the next_page_token of the previous reply, or none",
                )
            })?),
        };
        let wanted: std::collections::HashSet<&str> = wanted.iter().map(String::as_str).collect();
        let mut specs: Vec<_> = snapshot
            .item_types
            .specs()
            .filter(|spec| wanted.is_empty() || wanted.contains(spec.item_type.as_str()))
            .filter(|spec| {
                after
                    .as_deref()
                    .is_none_or(|after| spec.item_type.as_str() > after)
            })
            .collect();
        specs.sort_by(|a, b| a.item_type.cmp(&b.item_type));
        use prost::Message as _;
        let mut response = v1::GetItemTypesResponse {
            revision: snapshot.record.revision,
            ..Default::default()
        };
        // Filled to the reply's byte budget, keeping room for the token.
        let mut size = response.encoded_len() + PAGE_TOKEN_ROOM;
        for spec in &specs {
            let registered = v1::RegisteredItemType {
                spec: Some(type_spec_to_proto(spec)),
                epoch: snapshot.item_types.epoch(&spec.item_type),
                connected: snapshot
                    .connected_item_types
                    .binary_search(&spec.item_type)
                    .is_ok(),
            };
            let grown = size + field_len(1, registered.encoded_len());
            if grown > self.context.reply_bytes && !response.item_types.is_empty() {
                break;
            }
            size = grown;
            response.item_types.push(registered);
        }
        if response.item_types.len() < specs.len()
            && let Some(last) = specs.get(response.item_types.len().saturating_sub(1))
        {
            response.next_page_token = encode_text(&last.item_type);
        }
        Ok(Response::new(response))
    }

    #[instrument(skip_all, fields(tenant = %request.get_ref().tenant))]
    async fn report_external(
        &self,
        request: Request<v1::ReportExternalRequest>,
    ) -> Result<Response<v1::ReportExternalResponse>, Status> {
        let caller = self.context.caller(request.metadata())?;
        let request = request.into_inner();
        let handle = self.context.tenant(caller, &request.tenant)?;
        let large = request.reports.len() > LARGE_REQUEST_ITEMS;
        let (limits, default_max_items) = (&self.context.limits, self.context.default_max_items);
        let changes = fairly(&self.context.workers, handle.id, large, || {
            validate_external_reports(
                request.reports,
                "reports",
                &handle,
                limits,
                default_max_items,
            )
        })
        .await?;
        let revision = handle
            .report_external(changes)
            .await
            .map_err(|error| self.context.owner_failed(&handle.name, error))?;
        Ok(Response::new(v1::ReportExternalResponse { revision }))
    }
}

/// The first pause between two idle passes of `Reconcile{wait}`; each
/// pause without progress doubles it, up to [`IDLE_PASS_MAX_BACKOFF`].
const IDLE_PASS_FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest pause between two idle passes of `Reconcile{wait}`.
const IDLE_PASS_MAX_BACKOFF: Duration = Duration::from_secs(60);

/// What the wait loop of `Reconcile{wait}` compares to tell progress: the
/// revision (something was committed) and the connected item types (an
/// agent registered, reconnected or went away).
fn progress_mark(snapshot: &TenantSnapshot) -> (u64, Vec<String>) {
    (
        snapshot.record.revision,
        snapshot.connected_item_types.clone(),
    )
}

/// Waits until the scope converges or stalls, `max_no_progress` idle
/// passes in a row change nothing, or `deadline` passes, whichever comes
/// first; returns the scope's outcome and the passes run (counting the
/// first one, already run by the caller).
///
/// Every branch honours the deadline. Idle passes (nothing in flight, not
/// converged) are spaced by an exponential backoff from 1 s, capped at
/// 60 s and never past the deadline, so "no progress for N passes" spans
/// seconds, long enough for an agent to reconnect. A commit or a change in
/// the connected item types (an agent registering) during the pause counts
/// as progress: the count of idle passes starts over.
async fn wait_for_scope(
    context: &ApiContext,
    handle: &TenantHandle,
    subgraph: &str,
    updates: &mut tokio::sync::watch::Receiver<Arc<TenantSnapshot>>,
    mut outcome: ScopeOutcome,
    max_no_progress: u32,
    deadline: tokio::time::Instant,
) -> Result<(ScopeOutcome, u32), Status> {
    let mut iterations = 1u32;
    let mut no_progress = 0u32;
    let mut backoff = IDLE_PASS_FIRST_BACKOFF;
    loop {
        if tokio::time::Instant::now() >= deadline {
            break;
        }
        match outcome {
            ScopeOutcome::Converged | ScopeOutcome::Stalled => break,
            ScopeOutcome::Working => {
                tokio::select! {
                    changed = updates.changed() => {
                        if changed.is_err() {
                            break;
                        }
                    }
                    () = tokio::time::sleep_until(deadline) => break,
                }
                backoff = IDLE_PASS_FIRST_BACKOFF;
                no_progress = 0;
            }
            ScopeOutcome::Idle => {
                if no_progress >= max_no_progress {
                    break;
                }
                // Nothing in flight and not done: wait (for the backoff, or
                // for progress), then run another pass and see whether it
                // changes anything.
                let mark = progress_mark(&handle.snapshots.latest());
                let wake = (tokio::time::Instant::now() + backoff).min(deadline);
                let mut progressed = false;
                loop {
                    tokio::select! {
                        changed = updates.changed() => {
                            if changed.is_err() {
                                break;
                            }
                            if progress_mark(&handle.snapshots.latest()) != mark {
                                progressed = true;
                                break;
                            }
                        }
                        () = tokio::time::sleep_until(wake) => break,
                    }
                }
                if tokio::time::Instant::now() >= deadline {
                    break;
                }
                let before = handle.snapshots.latest().record.revision;
                // An owner that stopped because the tenant moved answers
                // NOT_OWNER (the caller retries), as the first pass does.
                handle
                    .reconcile(false)
                    .await
                    .map_err(|error| context.owner_failed(&handle.name, error))?;
                iterations = iterations.saturating_add(1);
                if progressed || handle.snapshots.latest().record.revision != before {
                    no_progress = 0;
                    backoff = IDLE_PASS_FIRST_BACKOFF;
                } else {
                    no_progress += 1;
                    backoff = (backoff * 2).min(IDLE_PASS_MAX_BACKOFF);
                }
            }
        }
        outcome = scope_outcome(&handle.snapshots.latest(), subgraph);
    }
    Ok((outcome, iterations))
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

/// Converts and validates a SubmitIntent under `limits`; every problem is
/// reported at once with its field path. The decode → validate → convert
/// path of SubmitIntent, fuzzed in `api::fuzz`.
pub fn validate_submit(
    request: v1::SubmitIntentRequest,
    limits: &ValidationLimits,
) -> Result<ValidatedSubmit, ApiError> {
    let subgraph =
        normalize_subgraph(&request.subgraph).map_err(|problem| invalid("subgraph", problem))?;
    if request.items.len() > limits.max_request_items {
        return Err(invalid(
            "items",
            format!(
                "{} items are over the limit of {} per request; split the intent into subgraphs",
                request.items.len(),
                limits.max_request_items
            ),
        ));
    }
    let mut violations = Vec::new();
    let mut items = Vec::with_capacity(request.items.len());
    for (index, item) in request.items.into_iter().enumerate() {
        match item_from_proto(item, index) {
            Ok(item) => items.push(item),
            Err(mut problems) => violations.append(&mut problems),
        }
    }
    if !violations.is_empty() {
        return Err(ApiError::invalid_argument(violations));
    }
    let predicates = validate_items(&items, limits).map_err(ApiError::invalid_argument)?;
    Ok(ValidatedSubmit {
        subgraph,
        items: items.into_iter().zip(predicates).collect(),
        expected_generation: request.expected_generation,
        dry_run: request.dry_run,
    })
}

/// Cuts `plan` to at most `budget` encoded bytes by dropping listed
/// waiting items, then operations, from the end (the operations kept still
/// refer only to earlier ones). Sets `truncated` and returns true if it
/// cut anything; the counts keep covering the whole plan.
fn fit_plan(plan: &mut v1::Plan, budget: usize) -> bool {
    use prost::Message as _;
    let mut size = plan.encoded_len();
    if size <= budget {
        return false;
    }
    while size > budget {
        if let Some(waiting) = plan.waiting.pop() {
            size = size.saturating_sub(field_len(7, waiting.encoded_len()));
        } else if let Some(operation) = plan.operations.pop() {
            size = size.saturating_sub(field_len(1, operation.encoded_len()));
        } else {
            break;
        }
    }
    plan.truncated = true;
    true
}

/// Encoded bytes of a message field with `tag` whose body is `len` bytes.
fn field_len(tag: u32, len: usize) -> usize {
    prost::encoding::key_len(tag) + prost::encoding::encoded_len_varint(len as u64) + len
}

/// How far a Reconcile's scope got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ScopeOutcome {
    /// Every intended item in scope is created and up to date.
    Converged,
    /// Something in scope failed terminally or waits on a terminal failure
    /// (however deep), and nothing it waits on is under way.
    Stalled,
    /// Operations in flight or ready, or a retry to come, in scope or
    /// among what its items wait on: wait for results.
    Working,
    /// Nothing runs and it is not converged (waiting for a dependency that
    /// nothing creates yet, a predicate, a configurator).
    Idle,
}

/// Where the items of `scope` stand in `snapshot`.
fn scope_outcome(snapshot: &TenantSnapshot, scope: &str) -> ScopeOutcome {
    let mut outcome = ScopeOutcome::Converged;
    let mut blockers = BlockerWalk::new(snapshot);
    for (item, entry) in snapshot.intended.iter() {
        if !subgraph_contains(scope, &entry.item.subgraph) || entry.item.external {
            continue;
        }
        if busy(snapshot, item) {
            return ScopeOutcome::Working;
        }
        if snapshot.waiting.contains_key(item) {
            match blockers.waits_on(item) {
                WaitsOn::Work => return ScopeOutcome::Working,
                WaitsOn::Failure => outcome = ScopeOutcome::Stalled,
                WaitsOn::Nothing if outcome == ScopeOutcome::Converged => {
                    outcome = ScopeOutcome::Idle;
                }
                WaitsOn::Nothing => {}
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

/// What a waiting item's wait comes down to, found by following it
/// through the items it waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WaitsOn {
    /// Neither work nor a terminal failure: a dependency that is missing,
    /// a false predicate, an agent that is not there.
    Nothing,
    /// A terminal failure: only an intent change moves it.
    Failure,
    /// Work under way: an operation in flight or a retry to come.
    Work,
}

/// Follows waiting items through the items they wait for. A deep waiter
/// names only its own blocker ("not created (dependency)"); what it comes
/// down to (a terminal failure, an operation in flight, a retry after a
/// backoff) shows one or more levels down, perhaps outside the scope
/// awaited. Each item is looked at once per search, so a scope's items
/// share one walk: O(waiting items and their blockers), iterative,
/// whatever the depth.
struct BlockerWalk<'a> {
    snapshot: &'a TenantSnapshot,
    explored: HashSet<&'a ItemRef>,
}

impl<'a> BlockerWalk<'a> {
    fn new(snapshot: &'a TenantSnapshot) -> Self {
        Self {
            snapshot,
            explored: HashSet::new(),
        }
    }

    /// What `start` waits on, through the items not explored yet: work
    /// found anywhere wins (it will change what waits), then a failure.
    /// An item explored by an earlier call adds nothing: what it reached
    /// was answered then.
    fn waits_on(&mut self, start: &'a ItemRef) -> WaitsOn {
        let mut found = WaitsOn::Nothing;
        let mut stack = vec![start];
        while let Some(item) = stack.pop() {
            if !self.explored.insert(item) {
                continue;
            }
            if busy(self.snapshot, item) {
                return WaitsOn::Work;
            }
            let Some(waiting) = self.snapshot.waiting.get(item) else {
                continue;
            };
            if waiting.reason == WaitReason::Backoff {
                return WaitsOn::Work;
            }
            if waiting.waits_on_terminal_failure() {
                found = WaitsOn::Failure;
            }
            stack.extend(
                waiting
                    .blocked_by
                    .iter()
                    .map(|blocker| &blocker.item)
                    .filter(|blocker| *blocker != item),
            );
        }
        found
    }
}

/// Whether an operation of `item` runs (a lost one, UNKNOWN, does not).
fn busy(snapshot: &TenantSnapshot, item: &ItemRef) -> bool {
    snapshot
        .current
        .get(item)
        .is_some_and(|current| current.is_busy() && current.state != ItemState::Unknown)
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

/// Whether `item` is listed in subgraph `scope` for GetGraph: where its
/// intended value is listed, or, for an item that is only current, where
/// its applied value is listed (reconciler.proto, GetGraphRequest.subgraph).
fn listed_in(snapshot: &TenantSnapshot, item: &ItemRef, scope: &str) -> bool {
    if let Some(entry) = snapshot.intended.get(item) {
        return subgraph_contains(scope, &entry.item.subgraph);
    }
    match snapshot.current.get(item).and_then(|c| c.applied.as_ref()) {
        Some(applied) => subgraph_contains(scope, &applied.subgraph),
        None => scope.is_empty(),
    }
}

/// How much one GetGraph page may hold.
#[derive(Clone, Copy, Debug)]
struct PageBudget {
    /// The most item identities.
    items: usize,
    /// The most encoded bytes of the reply; a page always holds at least
    /// one identity, so a listing always moves on.
    bytes: usize,
}

/// One page of a graph listing: the identities after `after` among
/// intended and current items, filtered by subgraph, while they fit
/// `budget` (by count and by encoded size).
fn graph_page(
    snapshot: &Arc<TenantSnapshot>,
    view: v1::GraphView,
    subgraph: &str,
    after: Option<ItemRef>,
    budget: PageBudget,
    listing: u64,
) -> v1::GetGraphResponse {
    use prost::Message as _;
    let lower = match &after {
        Some(key) => Bound::Excluded(key.clone()),
        None => Bound::Unbounded,
    };
    let with_current = view != v1::GraphView::Intended;
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
    let mut response = v1::GetGraphResponse {
        revision: snapshot.record.revision,
        generation: snapshot.record.generation,
        ..v1::GetGraphResponse::default()
    };
    // The token is the only field added after the loop; keep room for it.
    let mut size = response.encoded_len() + PAGE_TOKEN_ROOM;
    let mut listed = 0usize;
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
        if !listed_in(snapshot, key, subgraph) {
            continue;
        }
        if listed == budget.items {
            more = true;
            break;
        }
        let intended = snapshot.intended.get(key);
        let intended_proto = match intended {
            Some(entry) if view != v1::GraphView::Current => Some(intended_item_to_proto(entry)),
            _ => None,
        };
        let current_proto = with_current.then(|| {
            item_status(
                key,
                snapshot.current.get(key).map(AsRef::as_ref),
                intended.map(AsRef::as_ref),
                snapshot.waiting.get(key).map(|w| &**w),
            )
        });
        let added = intended_proto
            .as_ref()
            .map_or(0, |item| field_len(1, item.encoded_len()))
            + current_proto
                .as_ref()
                .map_or(0, |status| field_len(2, status.encoded_len()));
        if listed > 0 && size + added > budget.bytes {
            more = true;
            break;
        }
        size += added;
        listed += 1;
        response.intended.extend(intended_proto);
        response.current.extend(current_proto);
        last = Some(key.clone());
    }
    if more && let Some(after) = last {
        response.next_page_token = PageToken {
            listing,
            revision: snapshot.record.revision,
            after,
        }
        .encode();
    }
    response
}

#[cfg(test)]
pub(crate) mod handler_tests {
    use super::super::context::WatchSettings;
    use super::*;
    use crate::auth::{AdminToken, AdminTokenSource, TokenDirectory};
    use crate::store::{InMemoryStore, Store};
    use crate::tenant::{OwnerSettings, TenantDirectory, TenantLimits};
    use crate::watch::FollowSettings;
    use crate::watch::fleet::FleetLog;
    use tonic::Code;
    use tonic::metadata::MetadataValue;

    /// A service over an in-memory store, as `server::serve` builds it.
    pub(crate) fn service() -> (ReconcilerService, ApiContext) {
        let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
        let workers = crate::tenant::FairWorkers::new(1);
        let settings = OwnerSettings {
            workers: workers.clone(),
            ..OwnerSettings::default()
        };
        let directory = TenantDirectory::load(store.clone(), settings).expect("loads");
        let fleet = FleetLog::load(store, Default::default(), 1_000).expect("fleet log");
        let tokens: Arc<dyn TokenDirectory + Send + Sync> = directory.clone();
        let context = ApiContext {
            directory,
            tokens,
            cluster: None,
            admin: Arc::new(AdminToken::from_secret("admin", AdminTokenSource::Config)),
            limits: ValidationLimits::default(),
            default_max_items: 1_000_000,
            heartbeat_interval: Duration::from_secs(5),
            lease: Duration::from_secs(15),
            shutdown: tokio_util::sync::CancellationToken::new(),
            agents: crate::limits::AgentCounts::new(1_000),
            fleet,
            watch: WatchSettings {
                follow: FollowSettings {
                    bookmark_interval: Duration::from_secs(5),
                    message_bytes: 64 * 1024,
                    retry_after: Duration::from_secs(1),
                },
                max_watchers_per_tenant: 100,
            },
            reply_bytes: 16 * 1024 * 1024,
            workers,
        };
        (ReconcilerService::new(context.clone()), context)
    }

    pub(crate) fn admin<T>(message: T) -> Request<T> {
        let mut request = Request::new(message);
        request.metadata_mut().insert(
            "authorization",
            MetadataValue::try_from("Bearer admin").expect("ascii"),
        );
        request
    }

    pub(crate) fn item(item_type: &str, name: &str) -> v1::Item {
        v1::Item {
            r#type: item_type.into(),
            name: name.into(),
            ..Default::default()
        }
    }

    async fn tenant_with(
        context: &ApiContext,
        service: &ReconcilerService,
        name: &str,
        items: &[&str],
    ) {
        context
            .directory
            .create(name, TenantLimits::default())
            .await
            .expect("created");
        service
            .submit_intent(admin(v1::SubmitIntentRequest {
                tenant: name.into(),
                items: items.iter().map(|n| item("t", n)).collect(),
                ..Default::default()
            }))
            .await
            .expect("submitted");
    }

    /// A page token names a listing of one tenant; used on another tenant
    /// it resumes that tenant's listing after a key it never returned, so
    /// the listing silently skips items.
    #[tokio::test]
    async fn get_graph_refuses_a_page_token_of_another_tenant() {
        let (service, context) = service();
        tenant_with(&context, &service, "alpha", &["x1", "x2", "x3"]).await;
        tenant_with(&context, &service, "beta", &["a1", "b1", "c1"]).await;
        let first = intended_page(&service, "alpha", "", 1, String::new())
            .await
            .expect("first page");
        assert!(!first.next_page_token.is_empty());
        let answer = intended_page(&service, "beta", "", 1, first.next_page_token).await;
        match answer {
            Err(status) => assert_eq!(status.code(), Code::InvalidArgument, "{status:?}"),
            Ok(page) => panic!(
                "alpha's token was accepted on beta, listing {:?} (beta holds a1, b1, c1)",
                page.intended
                    .iter()
                    .map(|i| i.item.as_ref().map(|i| i.name.clone()))
                    .collect::<Vec<_>>()
            ),
        }
    }

    /// A page of tenant `tenant`'s intended graph in `subgraph`, of at most
    /// `page_size` items, continuing `page_token`.
    async fn intended_page(
        service: &ReconcilerService,
        tenant: &str,
        subgraph: &str,
        page_size: u32,
        page_token: String,
    ) -> Result<v1::GetGraphResponse, Status> {
        service
            .get_graph(admin(v1::GetGraphRequest {
                tenant: tenant.into(),
                view: v1::GraphView::Intended.into(),
                subgraph: subgraph.into(),
                page_size,
                page_token,
            }))
            .await
            .map(Response::into_inner)
    }

    /// A page token of one query (subgraph) resumed with another query
    /// skips the other query's items silently.
    #[tokio::test]
    async fn get_graph_refuses_a_page_token_of_another_query() {
        let (service, context) = service();
        context
            .directory
            .create("alpha", TenantLimits::default())
            .await
            .expect("created");
        let mut items = Vec::new();
        for (name, subgraph) in [("c1", "s"), ("d1", "s"), ("b1", "r"), ("z1", "r")] {
            let mut item = item("t", name);
            item.subgraph = subgraph.into();
            items.push(item);
        }
        service
            .submit_intent(admin(v1::SubmitIntentRequest {
                tenant: "alpha".into(),
                items,
                ..Default::default()
            }))
            .await
            .expect("submitted");
        // Subgraph "s": t/c1 then t/d1; the token resumes after t/c1.
        let first = intended_page(&service, "alpha", "s", 1, String::new())
            .await
            .expect("first page");
        assert!(!first.next_page_token.is_empty());
        // Subgraph "r" holds t/b1 and t/z1: resumed after t/c1 it skips t/b1.
        let answer = intended_page(&service, "alpha", "r", 10, first.next_page_token).await;
        match answer {
            Err(status) => assert_eq!(status.code(), Code::InvalidArgument, "{status:?}"),
            Ok(page) => {
                let names: Vec<_> = page
                    .intended
                    .iter()
                    .filter_map(|i| i.item.as_ref().map(|i| i.name.clone()))
                    .collect();
                panic!(
                    "a token of subgraph \"s\" was accepted for subgraph \"r\": listed {names:?}"
                );
            }
        }
    }

    /// An unknown `view` is an invalid request, as Watch refuses unknown
    /// event kinds; it is not silently read as GRAPH_VIEW_BOTH.
    #[tokio::test]
    async fn get_graph_refuses_an_unknown_view() {
        let (service, context) = service();
        tenant_with(&context, &service, "alpha", &["x1"]).await;
        let answer = service
            .get_graph(admin(v1::GetGraphRequest {
                tenant: "alpha".into(),
                view: 42,
                ..Default::default()
            }))
            .await;
        let status = answer.expect_err("view 42 is not a GraphView");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    }

    /// reconciler.proto, GetGraphRequest.subgraph: "Only items listed in
    /// this subgraph and the paths under it (for current items: where their
    /// intended or applied value is listed)". A reported external item
    /// listed in subgraph "s" and not in the intent is a current item whose
    /// applied value is listed in "s".
    #[tokio::test]
    async fn get_graph_scopes_current_items_by_their_applied_subgraph() {
        let (service, context) = service();
        context
            .directory
            .create("alpha", crate::tenant::TenantLimits::default())
            .await
            .expect("created");
        let mut reported = item("ext", "uplink");
        reported.subgraph = "s".into();
        service
            .report_external(admin(v1::ReportExternalRequest {
                tenant: "alpha".into(),
                reports: vec![v1::ExternalReport {
                    change: Some(v1::external_report::Change::Put(reported)),
                    modified: false,
                }],
            }))
            .await
            .expect("reported");
        let whole = service
            .get_graph(admin(v1::GetGraphRequest {
                tenant: "alpha".into(),
                view: v1::GraphView::Current.into(),
                ..Default::default()
            }))
            .await
            .expect("whole graph")
            .into_inner();
        assert_eq!(whole.current.len(), 1, "the reported item is current");
        assert_eq!(
            whole.current[0]
                .applied
                .as_ref()
                .map(|a| a.subgraph.as_str()),
            Some("s"),
            "its applied value is listed in \"s\""
        );
        let scoped = service
            .get_graph(admin(v1::GetGraphRequest {
                tenant: "alpha".into(),
                view: v1::GraphView::Current.into(),
                subgraph: "s".into(),
                ..Default::default()
            }))
            .await
            .expect("subgraph s")
            .into_inner();
        assert_eq!(
            scoped.current.len(),
            1,
            "ext/uplink's applied value is listed in \"s\", yet GetGraph{{subgraph: \"s\"}} omits it"
        );
    }
}
