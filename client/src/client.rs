//! A typed client for the `Reconciler` and `Tenants` services.
//!
//! [`Client`] wraps the generated gRPC clients: it adds the bearer token to
//! every call, raises the message size limit to [`MAX_MESSAGE_BYTES`], and
//! follows paging for [`Client::get_graph`], [`Client::get_item_types`] and
//! [`Client::list_tenants`] (the `_page` methods read one page).
//! Requests and responses are the proto types of [`crate::proto`]; errors are
//! the server's `tonic::Status` as it sent it, details included (decode them
//! with [`crate::tonic_types::StatusExt`], re-exported so its version
//! matches). A call or stream whose connection is lost (the server stopped,
//! or stopped answering the keepalive) ends with `UNAVAILABLE`, "the
//! connection to the server was lost (...)": retry the call, resume the
//! stream.

use std::time::Duration;

use reconciled_proto::v1;
use reconciled_proto::v1::reconciler_client::ReconcilerClient;
use reconciled_proto::v1::tenants_client::TenantsClient;
use tonic::Status;
use tonic::codec::Streaming;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::auth::{BearerToken, InvalidToken};
use crate::endpoint::{Undialable, dialable};
use crate::resuming::{FleetWatch, Opening, ResumingWatch, TenantWatch, WatchKind};
use crate::tls::ClientTls;
use crate::transport::Transport;

/// The largest message the client sends or accepts: 64 MiB. (The server
/// limits requests further, by default to 16 MiB.)
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// How long [`Client::connect`] waits for the TCP connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How often [`Client::connect`]'s connection pings the server (HTTP/2
/// keepalive), and how long a ping may go unanswered before the connection
/// counts as dead: a server that stops answering (a frozen process, a host
/// behind a partition) then ends open Watch streams and pending calls with
/// an error within about 20 s, instead of leaving them waiting forever
/// (an idle watch sends nothing, so TCP alone never notices).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// See [`KEEPALIVE_INTERVAL`].
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// How often [`Client::get_graph`] starts a listing over after its
/// revision was no longer kept (`ABORTED`).
const GET_GRAPH_RESTARTS: u32 = 8;

/// Why a [`Client`] could not be created. Non-exhaustive: a `match` on it
/// needs a catch-all arm, so a new reason does not break your build.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The endpoint is not a valid URI.
    #[error("{endpoint:?} is not a valid server address; use a URI such as http://127.0.0.1:50051")]
    InvalidEndpoint {
        /// The address as given.
        endpoint: String,
        /// What the URI parser said.
        #[source]
        source: tonic::transport::Error,
    },
    /// The endpoint has no `http://` or `https://` scheme (e.g.
    /// `127.0.0.1:50051`, as grpcurl takes it): it parses as a URI, but no
    /// connection to it can ever be made.
    #[error("{endpoint:?} has no scheme; use http://{endpoint} (or https://{endpoint} with TLS)")]
    EndpointWithoutScheme {
        /// The address as given.
        endpoint: String,
    },
    /// The endpoint parses as a URI but cannot be dialled: a port that is
    /// not a number from 1 to 65535 (`http://127.0.0.1:notaport`, which the
    /// connector would take for port 80), a scheme other than `http` or
    /// `https`, or no host.
    #[error("{endpoint:?} cannot be dialled: {problem}; use a URI such as http://127.0.0.1:50051")]
    UnusableEndpoint {
        /// The address as given.
        endpoint: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The server could not be reached.
    #[error(
        "could not connect to reconciled at {endpoint}; check that the server runs and \
         listens there (reconciled --listen)"
    )]
    Connect {
        /// The address dialled.
        endpoint: String,
        /// The transport error.
        #[source]
        source: tonic::transport::Error,
    },
    /// The token cannot be sent in a header.
    #[error(transparent)]
    InvalidToken(#[from] InvalidToken),
    /// The TLS settings cannot be used (e.g. a malformed certificate).
    #[error(
        "invalid TLS settings for {endpoint}: {source}; check the CA and client certificate PEM files"
    )]
    Tls {
        /// The address dialled.
        endpoint: String,
        /// What tonic said.
        #[source]
        source: tonic::transport::Error,
    },
}

type Authenticated = InterceptedService<Transport, BearerToken>;

/// A connection to a reconciled server with a bearer token (a tenant's token,
/// or the admin token for the `Tenants` calls). Cheap to clone; clones share
/// the connection. Every method takes `&self` and can be called concurrently.
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use reconciled_client::{Client, proto};
///
/// let client = Client::connect("http://127.0.0.1:50051", "rcd_...").await?;
/// let status = client
///     .get_status(proto::GetStatusRequest { tenant: "acme".into() })
///     .await?;
/// println!("{:?}", status.status);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Client {
    reconciler: ReconcilerClient<Authenticated>,
    tenants: TenantsClient<Authenticated>,
    /// The connection, for [`Client::with_token`].
    transport: Transport,
}

impl Client {
    /// Connects to `endpoint` (e.g. `http://127.0.0.1:50051`) and sends
    /// `token` with every call. The connection pings the server every 10 s
    /// and is given up after 10 s without an answer, so a Watch of a server
    /// that stopped answering ends with `UNAVAILABLE` ("the connection to
    /// the server was lost"; resume it from the last revision) rather than
    /// waiting forever.
    pub async fn connect(endpoint: impl Into<String>, token: &str) -> Result<Self, ClientError> {
        Self::connect_with(endpoint, token, None).await
    }

    /// Connects to `endpoint` (`https://...` when `tls` is given: the
    /// server's CA and, for mutual TLS, this client's certificate) and
    /// sends `token` with every call.
    pub async fn connect_with(
        endpoint: impl Into<String>,
        token: &str,
        tls: Option<&ClientTls>,
    ) -> Result<Self, ClientError> {
        let endpoint = endpoint.into();
        let bearer = BearerToken::new(token)?;
        let channel =
            dial(&endpoint, tls)?
                .connect()
                .await
                .map_err(|source| ClientError::Connect {
                    endpoint: endpoint.clone(),
                    source,
                })?;
        Ok(Self::with_bearer(channel, Some(&endpoint), bearer))
    }

    /// A client of `endpoint` that connects on its first call, not now:
    /// for a controller that may start while the server is down or
    /// restarting. Only the endpoint, the token and `tls` are checked
    /// here; a server that cannot be reached fails each call (and each
    /// resuming watch's attempt) with `UNAVAILABLE`, which
    /// [`retry_after`](crate::retry_after) and
    /// [`watch_resuming`](Self::watch_resuming) retry.
    pub fn connect_lazy(
        endpoint: impl Into<String>,
        token: &str,
        tls: Option<&ClientTls>,
    ) -> Result<Self, ClientError> {
        let endpoint = endpoint.into();
        let bearer = BearerToken::new(token)?;
        let channel = dial(&endpoint, tls)?.connect_lazy();
        Ok(Self::with_bearer(channel, Some(&endpoint), bearer))
    }

    /// A client over an existing channel (e.g. one configured with TLS or
    /// timeouts of your choice) that sends `token` with every call. The
    /// channel's settings are used as they are: set
    /// `Endpoint::http2_keep_alive_interval` and `keep_alive_timeout` on it,
    /// or a Watch of a server that stops answering waits forever. A lost
    /// connection ends calls and streams with `UNAVAILABLE`, as with
    /// [`Client::connect`].
    pub fn from_channel(channel: Channel, token: &str) -> Result<Self, ClientError> {
        Ok(Self::with_bearer(channel, None, BearerToken::new(token)?))
    }

    /// A client on the same connection that sends `token` instead: a
    /// controller holding each tenant's token keeps one connection for all
    /// of them, and after `rotate_token` goes on with the new token on the
    /// connection it has (streams opened with the old one end with
    /// `UNAUTHENTICATED`; open them again through the new client).
    ///
    /// ```no_run
    /// # use reconciled_client::proto as v1;
    /// # async fn example(admin: reconciled_client::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let token = admin
    ///     .create_tenant(v1::CreateTenantRequest {
    ///         name: "acme".into(),
    ///         limits: None,
    ///     })
    ///     .await?
    ///     .token;
    /// let acme = admin.with_token(&token)?;
    /// acme.get_status(v1::GetStatusRequest {
    ///     tenant: "acme".into(),
    /// })
    /// .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_token(&self, token: &str) -> Result<Self, ClientError> {
        Ok(Self::on_transport(
            self.transport.clone(),
            BearerToken::new(token)?,
        ))
    }

    fn with_bearer(channel: Channel, endpoint: Option<&str>, bearer: BearerToken) -> Self {
        Self::on_transport(Transport::new(channel, endpoint), bearer)
    }

    fn on_transport(transport: Transport, bearer: BearerToken) -> Self {
        let reconciler = ReconcilerClient::with_interceptor(transport.clone(), bearer.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let tenants = TenantsClient::with_interceptor(transport.clone(), bearer)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Self {
            reconciler,
            tenants,
            transport,
        }
    }

    /// `Reconciler.SubmitIntent`: replaces the items of a subgraph.
    ///
    /// With `expected_generation`, a stale generation fails with
    /// `FAILED_PRECONDITION` and `ErrorInfo{reason: "GENERATION_MISMATCH",
    /// metadata: {expected, actual}}`: re-read and submit again.
    ///
    /// ```no_run
    /// # async fn example(client: reconciled_client::Client) -> Result<(), reconciled_client::tonic::Status> {
    /// use reconciled_client::proto;
    /// use reconciled_client::tonic_types::StatusExt as _;
    ///
    /// let request = proto::SubmitIntentRequest {
    ///     tenant: "acme".into(),
    ///     items: Vec::new(),
    ///     expected_generation: Some(4),
    ///     ..Default::default()
    /// };
    /// match client.submit_intent(request).await {
    ///     Ok(reply) => println!("generation {}", reply.generation),
    ///     Err(status) => match status.get_error_details().error_info() {
    ///         Some(info) if info.reason == "GENERATION_MISMATCH" => {
    ///             println!("the tenant is at generation {}", info.metadata["actual"]);
    ///         }
    ///         _ => return Err(status),
    ///     },
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn submit_intent(
        &self,
        request: v1::SubmitIntentRequest,
    ) -> Result<v1::SubmitIntentResponse, Status> {
        let mut client = self.reconciler.clone();
        Ok(client.submit_intent(request).await?.into_inner())
    }

    /// `Reconciler.Reconcile`: triggers a pass and, with `wait`, waits for
    /// the scope to settle. No client-side timeout applies; set
    /// `request.timeout` to bound the wait.
    pub async fn reconcile(
        &self,
        request: v1::ReconcileRequest,
    ) -> Result<v1::ReconcileResponse, Status> {
        let mut client = self.reconciler.clone();
        Ok(client.reconcile(request).await?.into_inner())
    }

    /// `Reconciler.GetGraph`, following `next_page_token` until the last
    /// page: the reply holds every page's items, the listing's revision and
    /// generation, and an empty `next_page_token`. `request.page_token`
    /// picks the page to start from (empty: the first).
    ///
    /// Every page comes from one revision, which the server keeps while
    /// the pages are read (at least one every 60 s, for the tenant's 16
    /// listings read most recently), however often the tenant commits. A
    /// page of a listing the server let go fails with `ABORTED`; a listing
    /// that started at the first page then starts over from the first
    /// page, up to 8 times (each start reads the latest revision), before
    /// the `ABORTED` is returned. A listing started from a `page_token`
    /// cannot start over: it returns the `ABORTED` at once.
    pub async fn get_graph(
        &self,
        request: v1::GetGraphRequest,
    ) -> Result<v1::GetGraphResponse, Status> {
        let from_the_start = request.page_token.is_empty();
        let mut restarts = 0;
        loop {
            match self.get_graph_pages(request.clone()).await {
                Err(status)
                    if status.code() == tonic::Code::Aborted
                        && from_the_start
                        && restarts < GET_GRAPH_RESTARTS =>
                {
                    restarts += 1;
                }
                outcome => return outcome,
            }
        }
    }

    /// Reads the pages of one listing, from `request.page_token` on.
    async fn get_graph_pages(
        &self,
        mut request: v1::GetGraphRequest,
    ) -> Result<v1::GetGraphResponse, Status> {
        let mut all = self.get_graph_page(request.clone()).await?;
        while !all.next_page_token.is_empty() {
            request.page_token = std::mem::take(&mut all.next_page_token);
            let page = self.get_graph_page(request.clone()).await?;
            all.intended.extend(page.intended);
            all.current.extend(page.current);
            all.next_page_token = page.next_page_token;
        }
        Ok(all)
    }

    /// `Reconciler.GetGraph`: one page.
    pub async fn get_graph_page(
        &self,
        request: v1::GetGraphRequest,
    ) -> Result<v1::GetGraphResponse, Status> {
        let mut client = self.reconciler.clone();
        Ok(client.get_graph(request).await?.into_inner())
    }

    /// `Reconciler.GetStatus`: the tenant's conditions, generations and
    /// counts.
    pub async fn get_status(
        &self,
        request: v1::GetStatusRequest,
    ) -> Result<v1::GetStatusResponse, Status> {
        let mut client = self.reconciler.clone();
        Ok(client.get_status(request).await?.into_inner())
    }

    /// `Reconciler.GetItemTypes`, following `next_page_token` until the
    /// last page: the reply holds every item type agents registered for the
    /// tenant (or those of `request.item_types`), with their specs and
    /// schemas, ordered by name, and an empty `next_page_token`; `revision`
    /// is the last page's. Large schemas make pages short (each reply is at
    /// most the server's `max_message_bytes`).
    pub async fn get_item_types(
        &self,
        request: v1::GetItemTypesRequest,
    ) -> Result<v1::GetItemTypesResponse, Status> {
        let mut request = request;
        let mut all = self.get_item_types_page(request.clone()).await?;
        while !all.next_page_token.is_empty() {
            request.page_token = std::mem::take(&mut all.next_page_token);
            let page = self.get_item_types_page(request.clone()).await?;
            all.item_types.extend(page.item_types);
            all.revision = page.revision;
            all.next_page_token = page.next_page_token;
        }
        Ok(all)
    }

    /// `Reconciler.GetItemTypes`: one page.
    pub async fn get_item_types_page(
        &self,
        request: v1::GetItemTypesRequest,
    ) -> Result<v1::GetItemTypesResponse, Status> {
        let mut client = self.reconciler.clone();
        Ok(client.get_item_types(request).await?.into_inner())
    }

    /// `Reconciler.ReportExternal`: reports the state of external items.
    pub async fn report_external(
        &self,
        request: v1::ReportExternalRequest,
    ) -> Result<v1::ReportExternalResponse, Status> {
        let mut client = self.reconciler.clone();
        Ok(client.report_external(request).await?.into_inner())
    }

    /// `Reconciler.Watch`: the tenant's event stream, as the server sends
    /// it. Read it with `stream.message().await`.
    ///
    /// The stream ends with `UNAVAILABLE` when the connection does (the
    /// server restarts, or stops answering: see [`Client::connect`]), when
    /// the watcher is too slow (`RESOURCE_EXHAUSTED`) or when its history
    /// is gone (`OUT_OF_RANGE`, `REVISION_COMPACTED`).
    /// [`watch_resuming`](Self::watch_resuming) follows the rules of
    /// `docs/watch.md` for each case; use this call for a stream that
    /// should end at the first break.
    pub async fn watch(
        &self,
        request: v1::WatchRequest,
    ) -> Result<Streaming<v1::WatchResponse>, Status> {
        let mut client = self.reconciler.clone();
        Ok(client.watch(request).await?.into_inner())
    }

    /// `Reconciler.Watch` that reconnects and resumes by itself: one
    /// stream in which nothing is lost or repeated across server restarts,
    /// hand-offs between replicas and slow-consumer cuts, and which says
    /// [`Resumed::StartedOver`] when it has to begin again from a fresh
    /// snapshot. Nothing is sent before the first `next()`.
    ///
    /// ```no_run
    /// # async fn example(client: reconciled_client::Client) -> Result<(), reconciled_client::tonic::Status> {
    /// use reconciled_client::proto::{self, watch_response::Message};
    /// use reconciled_client::Resumed;
    ///
    /// let mut watch = client.watch_resuming(proto::WatchRequest {
    ///     tenant: "acme".into(),
    ///     ..Default::default() // start_revision 0: a snapshot, Synced, events
    /// });
    /// loop {
    ///     match watch.next().await? {
    ///         Resumed::Message(Message::Snapshot(part)) => { /* items as of part.revision */ }
    ///         Resumed::Message(Message::Synced(_)) => { /* live events follow */ }
    ///         Resumed::Message(Message::Events(group)) => { /* group.events */ }
    ///         Resumed::Message(Message::Bookmark(_)) => {}
    ///         Resumed::StartedOver(_why) => { /* a new snapshot follows: build again from it */ }
    ///     }
    /// }
    /// # }
    /// ```
    ///
    /// # Errors
    /// `next()` ends with a status that retrying cannot change: the tenant
    /// was deleted, the token rotated, the request is invalid (see
    /// [`ResumingWatch`]).
    pub fn watch_resuming(&self, request: v1::WatchRequest) -> TenantWatch {
        self.resuming(request, |client, request| {
            Box::pin(async move { client.watch(request).await })
        })
    }

    /// `Tenants.CreateTenant` (admin): creates a tenant; the reply holds its
    /// token, shown only this once.
    pub async fn create_tenant(
        &self,
        request: v1::CreateTenantRequest,
    ) -> Result<v1::CreateTenantResponse, Status> {
        let mut client = self.tenants.clone();
        Ok(client.create_tenant(request).await?.into_inner())
    }

    /// `Tenants.GetTenant` (admin): a tenant with its limits and status.
    pub async fn get_tenant(&self, request: v1::GetTenantRequest) -> Result<v1::Tenant, Status> {
        let mut client = self.tenants.clone();
        Ok(client.get_tenant(request).await?.into_inner())
    }

    /// `Tenants.ListTenants` (admin), following `next_page_token` until the
    /// last page: the reply holds every tenant and an empty
    /// `next_page_token`.
    pub async fn list_tenants(
        &self,
        request: v1::ListTenantsRequest,
    ) -> Result<v1::ListTenantsResponse, Status> {
        let mut request = request;
        let mut all = self.list_tenants_page(request.clone()).await?;
        while !all.next_page_token.is_empty() {
            request.page_token = std::mem::take(&mut all.next_page_token);
            let page = self.list_tenants_page(request.clone()).await?;
            all.tenants.extend(page.tenants);
            all.next_page_token = page.next_page_token;
        }
        Ok(all)
    }

    /// `Tenants.ListTenants` (admin): one page.
    pub async fn list_tenants_page(
        &self,
        request: v1::ListTenantsRequest,
    ) -> Result<v1::ListTenantsResponse, Status> {
        let mut client = self.tenants.clone();
        Ok(client.list_tenants(request).await?.into_inner())
    }

    /// `Tenants.DeleteTenant` (admin): deletes a tenant and purges its data.
    pub async fn delete_tenant(
        &self,
        request: v1::DeleteTenantRequest,
    ) -> Result<v1::DeleteTenantResponse, Status> {
        let mut client = self.tenants.clone();
        Ok(client.delete_tenant(request).await?.into_inner())
    }

    /// `Tenants.RotateToken` (admin): replaces a tenant's token; the old one
    /// stops working at once.
    pub async fn rotate_token(
        &self,
        request: v1::RotateTokenRequest,
    ) -> Result<v1::RotateTokenResponse, Status> {
        let mut client = self.tenants.clone();
        Ok(client.rotate_token(request).await?.into_inner())
    }

    /// `Tenants.WatchFleet` (admin): tenant condition changes across the
    /// fleet.
    pub async fn watch_fleet(
        &self,
        request: v1::WatchFleetRequest,
    ) -> Result<Streaming<v1::WatchFleetResponse>, Status> {
        let mut client = self.tenants.clone();
        Ok(client.watch_fleet(request).await?.into_inner())
    }

    /// `Tenants.WatchFleet` (admin) that reconnects and resumes by itself,
    /// as [`watch_resuming`](Self::watch_resuming) does for a tenant. After
    /// [`Resumed::StartedOver`] the listing of every tenant comes again:
    /// a tenant missing from it was deleted meanwhile.
    pub fn watch_fleet_resuming(&self, request: v1::WatchFleetRequest) -> FleetWatch {
        self.resuming(request, |client, request| {
            Box::pin(async move { client.watch_fleet(request).await })
        })
    }

    /// A resuming watch of `request` whose streams `open` opens through a
    /// clone of this client.
    fn resuming<K: WatchKind>(
        &self,
        request: K::Request,
        open: fn(Client, K::Request) -> Opening<K>,
    ) -> ResumingWatch<K> {
        let client = self.clone();
        ResumingWatch::new(
            request,
            Box::new(move |request| open(client.clone(), request)),
        )
    }
}

/// The endpoint to dial `endpoint` with: checked (a scheme, a usable
/// address), with the connect timeout, the keep-alive pings and `tls`.
fn dial(endpoint: &str, tls: Option<&ClientTls>) -> Result<Endpoint, ClientError> {
    let owned = || endpoint.to_owned();
    let dial = dialable(endpoint)
        .map_err(|undialable| match undialable {
            Undialable::Invalid(source) => ClientError::InvalidEndpoint {
                endpoint: owned(),
                source,
            },
            Undialable::Unusable(problem) => ClientError::UnusableEndpoint {
                endpoint: owned(),
                problem,
            },
            Undialable::NoScheme => ClientError::EndpointWithoutScheme { endpoint: owned() },
        })?
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true);
    match tls {
        Some(tls) => tls.apply(dial).map_err(|source| ClientError::Tls {
            endpoint: owned(),
            source,
        }),
        None => Ok(dial),
    }
}
