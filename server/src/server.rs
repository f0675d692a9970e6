//! Assembles and runs the server: store, tenants, services, health and
//! reflection, until SIGTERM.

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use reconciled_proto::v1::configurators_server::ConfiguratorsServer;
use reconciled_proto::v1::reconciler_server::ReconcilerServer;
use reconciled_proto::v1::tenants_server::TenantsServer;
use tokio_stream::StreamExt as _;
use tokio_util::sync::CancellationToken;
use tonic_health::ServingStatus;
use tracing::{info, warn};

use crate::api::context::WatchSettings;
use crate::api::{ApiContext, ConfiguratorsService, ReconcilerService, TenantsService};
use crate::auth::{AdminToken, AuthLayer, TokenDirectory};
use crate::bootstrap::{
    bind, health_and_reflection, incoming, serve_until, server_builder, shutdown_signal,
};
use crate::cluster::{Cluster, ClusterSettings, ForwardLayer};
use crate::config::{Config, MigrateMode, Reflection, RepairMode, StoreKind, StoreLocation};
use crate::graph::validate::ValidationLimits;
use crate::limits::{AgentCounts, ConnectionSlots, DecodeLimitLayer, GlobalLimits, LimitsLayer};
use crate::store::{
    ChunkedValues, EtcdStore, MigrationReport, SledOptions, SledStore, Store, WriteBatch,
    copy_store, open_and_migrate, open_and_migrate_etcd, takes_backup,
};
use crate::telemetry::RpcSpanLayer;
use crate::tenant::{OwnerSettings, TenantDirectory};
use crate::watch::fleet::FleetLog;
use crate::watch::hub::CloseReason;
use crate::watch::{FollowSettings, Retention};

/// With replicas on etcd, the health service name that reports whether
/// the process is alive (`SERVING` from start to exit), apart from whether
/// it is ready (`""` and the services, `NOT_SERVING` until it has joined).
pub const LIVENESS: &str = "liveness";

/// Service names reported SERVING by the health service.
const SERVICES: [&str; 3] = [
    "reconciled.v1.Reconciler",
    "reconciled.v1.Configurators",
    "reconciled.v1.Tenants",
];

fn sled_options(config: &Config) -> SledOptions {
    SledOptions {
        cache_capacity_bytes: config.cache_capacity_bytes,
        max_commit_items: config.max_commit_items,
        fsync: config.fsync,
    }
}

/// The store the server runs on and, on etcd, the etcd store itself (for
/// the cluster's primitives).
struct OpenedStore {
    store: Arc<dyn Store>,
    etcd: Option<Arc<EtcdStore>>,
}

/// Creates the data directory `dir` and its parents if they are missing.
/// When that fails, says which part of the path stands in the way: a file
/// where a directory should be made every later step (the admin token
/// file, the store) fail with "Not a directory" about a file inside it.
fn prepare_data_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).map_err(|error| {
        let file = dir.ancestors().find(|part| part.exists() && !part.is_dir());
        match file {
            Some(file) => anyhow::anyhow!(
                "cannot create the data directory {}: {} is a file, not a directory; \
                 pick another --data-dir",
                dir.display(),
                file.display()
            ),
            None => anyhow::anyhow!(
                "cannot create the data directory {}: {error}; check that this user may \
                 create it, or pick another --data-dir",
                dir.display()
            ),
        }
    })
}

/// Opens the store (applying pending migrations after a backup) and
/// reports what ran.
fn open_store(config: &Config) -> anyhow::Result<OpenedStore> {
    // Records over one stored value (a 64 KiB item's current record while
    // an operation runs holds two values) are kept as chunks.
    match config.store {
        // `serve` made the data directory already, before the admin token.
        StoreKind::Sled => {
            let (store, report) = open_and_migrate(&config.data_dir, sled_options(config), false)?;
            log_migrations(&report);
            Ok(OpenedStore {
                store: Arc::new(ChunkedValues::new(store)?),
                etcd: None,
            })
        }
        StoreKind::Etcd => {
            let options = config.etcd.options(None);
            info!(endpoints = %options.endpoints.join(","), prefix = %options.prefix, "Opening the etcd store.");
            let (store, report) = open_and_migrate_etcd(options, &config.data_dir, false)?;
            log_migrations(&report);
            let store = Arc::new(store);
            Ok(OpenedStore {
                store: Arc::new(ChunkedValues::new(store.clone())?),
                etcd: Some(store),
            })
        }
    }
}

/// How this replica takes part in the cluster (with `--store etcd`).
fn cluster_settings(config: &Config) -> anyhow::Result<ClusterSettings> {
    let advertise = match &config.advertise_addr {
        Some(advertise) => advertise.clone(),
        None if config.listen.ip().is_unspecified() => anyhow::bail!(
            "with --store etcd, other replicas and agents must reach this one: --listen {} \
             is a wildcard address, so set --advertise-addr HOST:PORT",
            config.listen
        ),
        None => config.listen.to_string(),
    };
    Ok(ClusterSettings {
        replica_id: config
            .replica_id
            .clone()
            .unwrap_or_else(|| advertise.clone()),
        advertise,
        lease_ttl: config.cluster_lease,
        ring_events: config.watch_ring_events,
        fleet_retention: Retention {
            max_revisions: config.watch_history_revisions,
            max_age_ms: u64::try_from(config.watch_history_age.as_millis()).unwrap_or(u64::MAX),
        },
        peer_tls: peer_tls(config)?,
    })
}

/// How replicas dial each other when they speak TLS: trusting the CA of
/// `--tls-client-ca` and presenting their own certificate (mutual TLS),
/// or else trusting their own certificate (one certificate shared by the
/// replicas, naming every advertise address).
fn peer_tls(config: &Config) -> anyhow::Result<Option<tonic::transport::ClientTlsConfig>> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) else {
        return Ok(None);
    };
    let read = |path: &std::path::Path| {
        std::fs::read(path)
            .map_err(|error| anyhow::anyhow!("cannot read {}: {error}", path.display()))
    };
    let tls = match &config.tls_client_ca {
        Some(ca) => ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read(ca)?))
            .identity(Identity::from_pem(read(cert)?, read(key)?)),
        None => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(cert)?)),
    };
    Ok(Some(tls))
}

fn log_migrations(report: &MigrationReport) {
    for migration in &report.applied {
        info!(
            version = migration.version,
            name = migration.name,
            "Migration applied."
        );
    }
    if let Some(backup) = &report.backup {
        info!(path = %backup.display(), "Store backed up before migrating.");
    }
}

/// Runs the server until SIGTERM or SIGINT.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    // Unusable TLS files stop the start before the data directory is
    // created or the store migrated.
    let tls = crate::tls::server_tls(&config)?;
    // The admin token file is read from the data directory first: a path
    // that cannot be a directory is reported as such, not as a token file
    // that cannot be read.
    if config.store == StoreKind::Sled || config.admin_token.is_none() {
        prepare_data_dir(&config.data_dir)?;
    }
    let admin = Arc::new(AdminToken::load_or_generate(&config)?);
    let OpenedStore { store, etcd } = open_store(&config)?;
    let metrics = Arc::new(crate::metrics::Metrics::default());
    let retention = Retention {
        max_revisions: config.watch_history_revisions,
        max_age_ms: u64::try_from(config.watch_history_age.as_millis()).unwrap_or(u64::MAX),
    };
    let fleet = FleetLog::load(store.clone(), retention, config.watch_ring_events)?;
    let workers = crate::tenant::FairWorkers::new(crate::tenant::FairWorkers::default_seats());
    let settings = OwnerSettings {
        workers: workers.clone(),
        configurator_grace: config.configurator_grace,
        resync_interval: config.resync_interval,
        cancel_timeout: config.cancel_timeout,
        default_max_items: config.max_items_per_tenant,
        metrics: metrics.clone(),
        event_retention: retention,
        event_history_bytes: config.watch_history_bytes,
        watch_ring_events: config.watch_ring_events,
        // Replicas on etcd derive the fleet stream from etcd's revisions.
        fleet: etcd.is_none().then(|| fleet.clone()),
        ..OwnerSettings::default()
    };
    let (directory, cluster) = match etcd {
        None => (TenantDirectory::load(store.clone(), settings)?, None),
        Some(etcd) => {
            let directory = TenantDirectory::empty(store.clone(), settings);
            directory.resume_purges()?;
            let cluster = Cluster::start(
                cluster_settings(&config)?,
                etcd.clone(),
                store.clone(),
                directory.clone(),
            )
            .await?;
            metrics.append_section(crate::cluster::metrics::section(
                cluster.metrics().clone(),
                etcd,
            ));
            (directory, Some(cluster))
        }
    };
    let agents = AgentCounts::new(config.max_agents_per_tenant);
    let shutdown = CancellationToken::new();
    // The metrics share the dashboard's HTTP server when both listen on one
    // address; otherwise they get a listener of their own.
    let metrics_on_dashboard =
        config.metrics_listen.is_some() && config.metrics_listen == config.ui_listen;
    let metrics_page = metrics_on_dashboard.then(|| crate::ui::MetricsPage {
        metrics: metrics.clone(),
        gauges: gauge_source(directory.clone(), agents.clone(), store.clone()),
    });
    let metrics_endpoint = match config.metrics_listen.filter(|_| !metrics_on_dashboard) {
        // Bound before the server announces itself: a port that is taken
        // stops the start, as for --listen and --ui-listen, instead of
        // leaving a server that nobody can scrape.
        Some(listen) => {
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .map_err(|error| {
                    anyhow::anyhow!(
                        "cannot serve the metrics on {listen}: {error}; choose another address \
                         with --metrics-listen or RECONCILED_METRICS_LISTEN, or leave it unset"
                    )
                })?;
            let gauges = gauge_source(directory.clone(), agents.clone(), store.clone());
            let (metrics, stop) = (metrics.clone(), shutdown.clone());
            info!(addr = %listen, "Metrics endpoint listening.");
            Some(tokio::spawn(async move {
                if let Err(error) = crate::metrics::serve(listener, metrics, gauges, stop).await {
                    tracing::error!(%error, addr = %listen, "The metrics endpoint stopped; check --metrics-listen.");
                }
            }))
        }
        None => None,
    };
    info!(tenants = directory.len(), "Tenants loaded.");

    let tokens: Arc<dyn TokenDirectory + Send + Sync> = match &cluster {
        Some(cluster) => cluster.tokens(),
        None => directory.clone(),
    };
    let authentication = AuthLayer::new(admin.clone(), tokens.clone(), config.reflection);
    let context = ApiContext {
        workers,
        directory: directory.clone(),
        tokens,
        cluster: cluster.clone(),
        admin,
        limits: ValidationLimits {
            max_request_items: config.max_request_items,
            max_item_bytes: config.max_item_bytes,
            ..ValidationLimits::default()
        },
        default_max_items: config.max_items_per_tenant,
        heartbeat_interval: config.heartbeat_interval,
        lease: config.lease,
        fleet: fleet.clone(),
        watch: WatchSettings {
            follow: FollowSettings {
                bookmark_interval: config.watch_bookmark_interval,
                message_bytes: (config.max_message_bytes / 4).clamp(64 * 1024, 4 * 1024 * 1024),
                retry_after: std::time::Duration::from_secs(1),
            },
            max_watchers_per_tenant: config.max_watchers_per_tenant,
        },
        shutdown: shutdown.clone(),
        agents,
        reply_bytes: config
            .max_message_bytes
            .saturating_sub(crate::api::context::REPLY_HEADROOM)
            .max(config.max_message_bytes / 2),
    };
    let limit = config.max_message_bytes;
    let reconciler = ReconcilerServer::new(ReconcilerService::new(context.clone()))
        .max_decoding_message_size(limit)
        .max_encoding_message_size(limit);
    let tenants = TenantsServer::new(TenantsService::new(context.clone()))
        .max_decoding_message_size(limit)
        .max_encoding_message_size(limit);
    let configurators = ConfiguratorsServer::new(ConfiguratorsService::new(context))
        .max_decoding_message_size(limit)
        .max_encoding_message_size(limit);

    let (reporter, health, reflection_v1, reflection_v1alpha) = health_and_reflection()?;
    // `off`: not served at all, so reflection calls answer UNIMPLEMENTED.
    let served = config.reflection != Reflection::Off;
    let reflection_v1 = served.then_some(reflection_v1);
    let reflection_v1alpha = served.then_some(reflection_v1alpha);
    match &cluster {
        None => {
            for service in SERVICES {
                reporter
                    .set_service_status(service, ServingStatus::Serving)
                    .await;
            }
        }
        // Not ready until the replica has joined and serves its tenants.
        Some(cluster) => report_readiness(cluster, &reporter, shutdown.clone()).await,
    }
    let listener = bind(config.listen).await?;
    let addr = listener.local_addr()?;
    let global = GlobalLimits {
        max_connections: config.max_connections,
        max_concurrent_requests: config.max_concurrent_requests,
        max_reconcile_calls_per_tenant: config.max_reconcile_calls_per_tenant,
        max_requests_per_second: config.max_requests_per_second,
        request_timeout: config.request_timeout,
    };
    let slots = ConnectionSlots::new(global.max_connections);
    let limits = LimitsLayer::new(&global);
    let decode_limits =
        DecodeLimitLayer::new(config.max_tenant_message_bytes, config.max_message_bytes)
            .with_tenant_bytes_per_second(config.max_tenant_bytes_per_second);
    // The dashboard port shares the services, the token check, the limits
    // and the connection slots of the gRPC port.
    let dashboard = match config.ui_listen {
        Some(ui_listen) => Some(
            crate::ui::spawn(
                crate::ui::DashboardServices {
                    reconciler: reconciler.clone(),
                    tenants: tenants.clone(),
                    health: health.clone(),
                },
                crate::ui::DashboardSettings {
                    listen: ui_listen,
                    tls: tls.clone(),
                    authentication: authentication.clone(),
                    decode_limits: decode_limits.clone(),
                    limits: limits.clone(),
                    slots: slots.clone(),
                    grace: config.shutdown_grace,
                    metrics: metrics_page,
                    forward: ForwardLayer::new(cluster.clone(), shutdown.clone()),
                },
                shutdown.clone(),
            )
            .await?,
        ),
        None => None,
    };
    let connections = incoming(listener).map(move |accepted| accepted.map(|io| slots.wrap(io)));
    let mut builder = server_builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
        info!(
            mutual = config.tls_client_ca.is_some(),
            "TLS enabled; clients must connect with https."
        );
    }
    let router = builder
        .layer(RpcSpanLayer)
        // Before the limits: an anonymous call takes no connection slot,
        // no rate token and no unary slot (issue 12, item 9).
        .layer(authentication)
        // Then what a non-admin message may cost to decode (item 5).
        .layer(decode_limits)
        .layer(limits)
        // Innermost: a call is authenticated and counted before it is
        // forwarded to the replica that serves its tenant.
        .layer(ForwardLayer::new(cluster.clone(), shutdown.clone()))
        .add_service(health)
        .add_optional_service(reflection_v1)
        .add_optional_service(reflection_v1alpha)
        .add_service(reconciler)
        .add_service(tenants)
        .add_service(configurators);

    // Installed before the announcement: whoever starts the server on the
    // strength of it may stop it at once, and must get a clean shutdown.
    let signal = shutdown_signal();
    info!(%addr, data_dir = %config.data_dir.display(), "Listening.");
    println!("reconciled listening on {addr}");
    if let Some(dashboard) = &dashboard {
        println!("reconciled dashboard on {}", dashboard.url);
    }
    let stopping = shutdown.clone();
    let watched = directory.clone();
    let cluster_fleet = cluster.as_ref().map(|cluster| cluster.fleet().clone());
    let signalled_at = Arc::new(OnceLock::new());
    let signal_time = signalled_at.clone();
    let signalled = async move {
        signal.await;
        let _ = signal_time.set(Instant::now());
        // Open watch streams end at once (UNAVAILABLE: resume elsewhere or
        // after the restart), so that they do not hold up the drain.
        watched.close_watches();
        fleet.hub.close(CloseReason::ShuttingDown);
        if let Some(cluster_fleet) = cluster_fleet {
            cluster_fleet.hub.close(CloseReason::ShuttingDown);
        }
        reporter
            .set_service_status("", ServingStatus::NotServing)
            .await;
        for service in SERVICES {
            reporter
                .set_service_status(service, ServingStatus::NotServing)
                .await;
        }
        // Server streams end now, so that only unary calls are left to drain.
        stopping.cancel();
    };
    serve_until(router, connections, signalled, config.shutdown_grace).await?;
    if let Some(dashboard) = dashboard {
        // `stopping` was cancelled when the signal came: the dashboard
        // drains within the same grace period.
        let _ = dashboard.task.await;
    }
    if let Some(endpoint) = metrics_endpoint {
        // `stopping` was cancelled when the signal came: the endpoint ends.
        let _ = endpoint.await;
    }
    let spent = signalled_at.get().map_or(Duration::ZERO, Instant::elapsed);
    let budget = config.shutdown_grace.saturating_sub(spent);
    // Owners finish the command they are on (at most a commit): give them
    // a moment even when the drain used up the grace period.
    let owners_budget = budget.max(Duration::from_secs(1));
    if let Some(cluster) = &cluster {
        // Stops serving, then releases every claim at once (the lease is
        // revoked), so the other replicas take over without waiting.
        if tokio::time::timeout(owners_budget, cluster.shutdown())
            .await
            .is_err()
        {
            warn!("Leaving the cluster did not finish within the shutdown grace period.");
        }
    }
    if tokio::time::timeout(owners_budget, directory.shutdown())
        .await
        .is_err()
    {
        warn!("Tenant owners did not stop within the shutdown grace period.");
    }
    flush_store(&*store, budget).await;
    Ok(())
}

/// Keeps the health service in step with the replica's readiness:
/// `NOT_SERVING` until it has joined the cluster and serves its tenants
/// (and whenever it has lost its lease), `SERVING` otherwise, until
/// `stopping` is cancelled.
async fn report_readiness(
    cluster: &Arc<Cluster>,
    reporter: &tonic_health::server::HealthReporter,
    stopping: CancellationToken,
) {
    async fn set(reporter: &tonic_health::server::HealthReporter, serving: bool) {
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        reporter.set_service_status("", status).await;
        for service in SERVICES {
            reporter.set_service_status(service, status).await;
        }
    }
    // Alive while the process serves gRPC at all, joined or not: what a
    // liveness probe should ask (a replica waiting to join is not dead).
    reporter
        .set_service_status(LIVENESS, ServingStatus::Serving)
        .await;
    let mut ready = cluster.readiness();
    let serving = *ready.borrow_and_update();
    set(reporter, serving).await;
    let reporter = reporter.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = stopping.cancelled() => return,
                changed = ready.changed() => if changed.is_err() { return },
            }
            let serving = *ready.borrow_and_update();
            if !stopping.is_cancelled() {
                set(&reporter, serving).await;
            }
        }
    });
}

/// The metrics gauges, read from their owners at each scrape.
fn gauge_source(
    directory: Arc<TenantDirectory>,
    agents: Arc<AgentCounts>,
    store: Arc<dyn Store>,
) -> crate::metrics::GaugeSource {
    Arc::new(move || crate::metrics::Gauges {
        agents_connected: agents.connected() as u64,
        store_bytes: store.size_on_disk().unwrap_or(0),
        ..directory.gauges()
    })
}

/// Waits, at most `budget`, until every commit queued before this call is
/// durable. Every tenant task has ended by now, so this is the last
/// commit; the store's writer then drains and joins when the store is
/// dropped at the end of `serve`.
async fn flush_store(store: &dyn Store, budget: Duration) {
    match tokio::time::timeout(budget, store.commit(WriteBatch::new())).await {
        Ok(Ok(())) => info!("Store flushed."),
        Ok(Err(error)) => warn!(%error, "Flushing the store at shutdown failed."),
        Err(_) => warn!("The store did not flush within the shutdown grace period."),
    }
}

/// `reconciled migrate`: shows (`--status`, `--dry-run`) or applies the
/// store's pending migrations; returns a report for humans.
pub fn migrate(config: &Config, mode: MigrateMode) -> anyhow::Result<String> {
    let dry_run = !matches!(mode, MigrateMode::Apply);
    let (store, report): (Box<dyn Store>, MigrationReport) = match config.store {
        StoreKind::Sled => {
            if dry_run {
                require_data_dir(config)?;
            }
            prepare_data_dir(&config.data_dir)?;
            let (store, report) =
                open_and_migrate(&config.data_dir, sled_options(config), dry_run)?;
            (Box::new(store), report)
        }
        StoreKind::Etcd => {
            let (store, report) =
                open_and_migrate_etcd(config.etcd.options(None), &config.data_dir, dry_run)?;
            (Box::new(store), report)
        }
    };
    let before = &report.before;
    let mut text = format!(
        "schema version: {} (this build knows up to {})\n",
        before.current_version, before.latest_version
    );
    for applied in &before.applied {
        text.push_str(&format!(
            "applied: {:04} {}\n",
            applied.version, applied.name
        ));
    }
    for pending in &before.pending {
        let verb = if dry_run { "would run" } else { "ran" };
        text.push_str(&format!(
            "{verb}: {:04} {}\n",
            pending.version, pending.name
        ));
    }
    if before.pending.is_empty() {
        text.push_str("nothing to do\n");
    }
    if let Some(backup) = &report.backup {
        text.push_str(&format!("backup: {}\n", backup.display()));
    }
    if mode == MigrateMode::DryRun && !before.pending.is_empty() {
        text.push_str(&backup_plan(&*store, &config.data_dir)?);
    }
    Ok(text)
}

/// What `migrate --dry-run` says of the backup a migration takes first:
/// where, how large the store is now and how much room the file system
/// has there, so an operator can plan the disk before a migration copies
/// the whole store.
fn backup_plan(store: &dyn Store, data_dir: &std::path::Path) -> anyhow::Result<String> {
    if !takes_backup(store)? {
        return Ok("would take no backup first: the store holds no record\n".to_owned());
    }
    // On etcd, its whole database: an upper bound of this store's part.
    let size = store.size_on_disk()?;
    let free = nix::sys::statvfs::statvfs(data_dir).map_or_else(
        |error| format!("free space unknown: {error}"),
        |stats| {
            let bytes = stats
                .blocks_available()
                .saturating_mul(stats.fragment_size());
            format!("{} free there", mebibytes(bytes))
        },
    );
    Ok(format!(
        "would back up the store first, into {}: about {} (the store's size on disk now); \
         {free}\n",
        data_dir.join("backups").display(),
        mebibytes(size)
    ))
}

/// `bytes` in MiB, for people.
fn mebibytes(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Refuses a data directory that does not exist: a command that only
/// looks at the store (`migrate --status`, `--dry-run`, `repair`) must not
/// create an empty one for a mistyped `--data-dir` and report on it.
fn require_data_dir(config: &Config) -> anyhow::Result<()> {
    if config.data_dir.is_dir() {
        return Ok(());
    }
    anyhow::bail!(
        "there is no data directory {}; check --data-dir (or RECONCILED_DATA_DIR, data_dir in \
         the config file). The server creates it when it first starts.",
        config.data_dir.display()
    )
}

/// `reconciled store copy --from STORE --to STORE`: copies every record
/// into the empty destination; returns a report for humans.
pub fn store_copy(
    config: &Config,
    from: &StoreLocation,
    to: &StoreLocation,
) -> anyhow::Result<String> {
    // Opening a sled store creates it: a mistyped source (a backup's path,
    // say) would be copied as an empty store, and a restore "succeed" with
    // nothing in it.
    if let StoreLocation::Sled(dir) = from
        && !crate::store::sled_dir(dir).is_dir()
    {
        anyhow::bail!(
            "there is no store at {} (no {}); check --from: a data directory or a backup under \
             <data-dir>/backups/",
            dir.display(),
            crate::store::sled_dir(dir).display()
        );
    }
    let source = open_location(config, from)?;
    let destination = open_location(config, to)?;
    let copied = copy_store(&*source, &*destination)?;
    // The destination's commits are durable once its store is dropped.
    drop(destination);
    Ok(format!(
        "copied {copied} records from {} to {}\n",
        describe(from),
        describe(to)
    ))
}

/// Opens a raw store (no migrations, no chunk wrapper) for `store copy`.
fn open_location(config: &Config, location: &StoreLocation) -> anyhow::Result<Box<dyn Store>> {
    Ok(match location {
        StoreLocation::Sled(dir) => Box::new(SledStore::open(dir, sled_options(config))?),
        StoreLocation::Etcd(endpoints) => {
            let endpoints = (!endpoints.is_empty()).then(|| endpoints.clone());
            Box::new(EtcdStore::open(config.etcd.options(endpoints))?)
        }
    })
}

fn describe(location: &StoreLocation) -> String {
    match location {
        StoreLocation::Sled(dir) => format!("sled:{}", dir.display()),
        StoreLocation::Etcd(endpoints) if endpoints.is_empty() => "etcd".to_owned(),
        StoreLocation::Etcd(endpoints) => format!("etcd:{}", endpoints.join(",")),
    }
}

/// `reconciled repair`: with the server stopped (the store's lock refuses a
/// second process), reports every tenant's unreadable records, or backs up
/// the store and repairs or removes one tenant (see `tenant::repair` for
/// what a repair does); returns a report for humans. A tenant that is not
/// there, or (with `--apply`) has nothing to repair, is reported before any
/// backup is taken.
pub fn repair(config: &Config, mode: &RepairMode) -> anyhow::Result<String> {
    use crate::tenant::repair;
    require_data_dir(config)?;
    let (store, report) = open_and_migrate(&config.data_dir, sled_options(config), true)?;
    if !report.before.is_up_to_date() {
        anyhow::bail!(
            "the store's schema is older than this build; run `reconciled migrate` first"
        );
    }
    let mut text = String::new();
    let name = match mode {
        RepairMode::Report => {
            let store = ChunkedValues::new(store)?;
            text.push_str(&repair::describe(&repair::diagnose_all(&store)?));
            return Ok(text);
        }
        RepairMode::Apply(name) | RepairMode::Remove(name) => name,
    };
    let store = ChunkedValues::new(store)?;
    // Diagnosed before the backup, which copies the whole store (in an
    // emergency, on a disk that may be short of room): a mistyped name, or
    // a tenant with nothing to repair, changes nothing and costs no copy.
    let diagnosis = repair::diagnose_tenant(&store, name)?;
    if matches!(mode, RepairMode::Apply(_)) && diagnosis.problems.is_empty() {
        text.push_str(&repair::describe(std::slice::from_ref(&diagnosis)));
        text.push_str(&format!(
            "tenant {name:?}: nothing to repair (no backup taken)\n"
        ));
        return Ok(text);
    }
    let backup = repair_backup_path(&config.data_dir);
    store.inner().backup_to(&backup)?;
    text.push_str(&format!("backup: {}\n", backup.display()));
    text.push_str(&repair::describe(std::slice::from_ref(&diagnosis)));
    if matches!(mode, RepairMode::Remove(_)) {
        repair::remove(&store, &diagnosis)?;
        text.push_str(&format!(
            "tenant {name:?} removed; its records are purged when the server starts\n"
        ));
        return Ok(text);
    }
    let outcome = repair::repair(&store, &diagnosis)?;
    text.push_str(&format!("tenant {name:?} repaired; it loads:\n"));
    for action in &outcome.actions {
        text.push_str(&format!("  {action}\n"));
    }
    if let Some(token) = &outcome.new_token {
        text.push_str(&format!(
            "new token for {name:?} (shown once; give it to the tenant's clients and agents): {token}\n"
        ));
    }
    Ok(text)
}

/// `<data-dir>/backups/pre-repair-<unix seconds>`, made unique.
fn repair_backup_path(data_dir: &std::path::Path) -> std::path::PathBuf {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    let base = data_dir.join("backups").join(format!("pre-repair-{now}"));
    let mut path = base.clone();
    let mut attempt = 1;
    while path.exists() {
        attempt += 1;
        path = base.with_extension(attempt.to_string());
    }
    path
}
