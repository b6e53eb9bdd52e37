//! Wiring: options, start-up validation, and ownership of every task and server.
//!
//! [`run`] receives its listeners and a shutdown token (tests bind `127.0.0.1:0`), builds the
//! datastore, director and servers, spawns every background task on one [`TaskTracker`], and
//! on shutdown cancels them all and waits for them.

mod options;
mod prefix_gc;
mod tls;

use crate::datastore::Datastore;
use crate::director::{
    Configured, Director, DirectorOptions, FlowSetup, PlacementSink, Runtime, Shared,
};
use crate::discovery::k8s::leader;
use crate::extproc::{stream::Limits, stream::Services, ExtProc};
use crate::health::Health;
use crate::metrics::{InfoLabels, Metrics};
use crate::replicas;
use crate::{admin, config, discovery, kvevents, reload, scrape};
use anyhow::Context;
pub use options::Options;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The KV-event sockets: the flags when any is given, else what the precise index's
/// `kvEventsConfig` says, read as llm-d-router reads it (`zmqEndpoint`: bind there; otherwise,
/// by default, connect to every pod's `podDiscoveryConfig.socketPort`, 5557, and its
/// `replaySocketPort`). Read at start-up; a reload does not move the sockets.
fn kv_events_options(
    opts: &Options,
    configured: Option<crate::scheduling::scorer::KvEventSockets>,
) -> kvevents::KvEventsOptions {
    let flags = kvevents::KvEventsOptions {
        port: opts.kv_events_port,
        replay_port: opts.kv_events_replay_port,
        bind: opts.kv_events_bind.clone(),
    };
    if flags.port.is_some() || flags.bind.is_some() {
        return flags;
    }
    match configured {
        Some(sockets) => {
            tracing::info!(bind = ?sockets.bind, port = ?sockets.port, replay_port = ?sockets.replay_port, "KV events: sockets from the precise index's kvEventsConfig");
            kvevents::KvEventsOptions {
                port: sockets.port,
                replay_port: sockets.replay_port.or(flags.replay_port),
                bind: sockets.bind,
            }
        }
        None => flags,
    }
}

/// How often watched files (config, endpoints) are polled for changes.
const FILE_POLL: Duration = Duration::from_secs(1);

/// The sockets epp serves on, bound by the caller.
pub struct Listeners {
    pub grpc: TcpListener,
    pub health: TcpListener,
    pub metrics: TcpListener,
    /// The other replicas' speculative entries (`--speculative-peer-port`, gRPC over mutual
    /// TLS); `None`: this replica receives none (it may still send, `--speculative-peers`).
    pub peers: Option<TcpListener>,
}

impl Listeners {
    /// Binds the ports named in `opts` on all interfaces, as upstream does.
    pub async fn bind(opts: &Options) -> anyhow::Result<Self> {
        let bind = |port: u16| async move {
            TcpListener::bind(("0.0.0.0", port))
                .await
                .with_context(|| format!("binding port {port}"))
        };
        let peers = match opts.speculative_peer_port {
            None => None,
            Some(port) => Some(bind(port).await.context("--speculative-peer-port")?),
        };
        Ok(Self {
            grpc: bind(opts.grpc_port).await?,
            health: bind(opts.grpc_health_port).await?,
            metrics: bind(opts.metrics_port).await?,
            peers,
        })
    }
}

/// Runs epp until `shutdown` is cancelled or a server fails.
pub async fn run(
    opts: Options,
    listeners: Listeners,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    run_with_drain(opts, listeners, CancellationToken::new(), shutdown).await
}

/// [`run`], with a graceful stop: when `drain` is cancelled, readiness turns NOT_SERVING at
/// once while ext_proc keeps serving for `--drain-timeout` (upstream's drain, so the gateway
/// and the Service stop sending before the streams close); then `shutdown` is cancelled.
pub async fn run_with_drain(
    opts: Options,
    listeners: Listeners,
    drain: CancellationToken,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    App::build(opts, listeners)?.serve(drain, shutdown).await
}

/// epp wired: everything a start-up can refuse is built and checked here (flags, the
/// configuration, endpoint sources, certificates, peer credentials, telemetry), so `serve`
/// only starts what was built. No part is attached after construction.
pub(crate) struct App {
    opts: Options,
    listeners: Listeners,
    telemetry: crate::telemetry::Telemetry,
    registry: Registry,
    shared: Shared,
    dopts: DirectorOptions,
    endpoints: EndpointSources,
    peers: Option<replicas::Sharing>,
    certs: Option<Arc<tls::Reloading>>,
}

impl App {
    /// Decodes and checks the flags and the configuration, and builds what epp is made of.
    pub(crate) fn build(mut opts: Options, mut listeners: Listeners) -> anyhow::Result<Self> {
        opts.validate()?;
        let configured = initial_config(&opts)?;
        opts.config_discovery = configured.startup.file_discovery.clone();
        opts.check_discovery()?;
        if let Some(f) = &opts.config_discovery {
            tracing::info!(
                path = %f.path.display(),
                watch = f.watch_file,
                "file-discovery: endpoints from the file; no Kubernetes discovery, InferencePool or InferenceObjective watches"
            );
        }
        let telemetry = match opts.tracing {
            true => crate::telemetry::Telemetry::from_env()?,
            false => crate::telemetry::Telemetry::off(),
        };
        let mut registry = Registry::default();
        let metrics = Arc::new(Metrics::register(&mut registry));
        let info = InfoLabels {
            commit: option_env!("EPP_COMMIT").unwrap_or("unknown").into(),
            build_ref: env!("CARGO_PKG_VERSION").into(),
        };
        metrics.info.get_or_create(&info).set(1);
        let datastore = Arc::new(Datastore::new());
        let endpoints = initial_endpoints(&opts, &datastore)?;
        // What the director reads and records into is owned here and handed to each adapter.
        let flow = flow_setup(&opts);
        let shared = Shared::build(datastore, configured, metrics, flow);
        let dopts = DirectorOptions {
            staleness: opts.metrics_staleness_threshold,
            subset_filter: !opts.disable_endpoint_subset_filter,
        };
        let peers = peer_sharing(&opts, listeners.peers.take())?;
        let certs = certificates(&opts)?;
        Ok(Self {
            opts,
            listeners,
            telemetry,
            registry,
            shared,
            dopts,
            endpoints,
            peers,
            certs,
        })
    }

    /// Starts every task and server and runs until `shutdown` is cancelled (or `drain` and its
    /// timeout have passed) or a server fails; then stops them all.
    pub(crate) async fn serve(
        mut self,
        drain: CancellationToken,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        let tracker = TaskTracker::new();
        self.shared.placements = self.peers.take().and_then(|sharing| {
            let to_index = replicas::Shared {
                datastore: Arc::clone(&self.shared.datastore),
                index: Arc::clone(&self.shared.indexes.precise),
                metrics: Arc::clone(&self.shared.metrics),
            };
            replicas::share(sharing, to_index, &tracker, &shutdown)
                .map(|outbox| Arc::new(outbox) as Arc<dyn PlacementSink>)
        });
        let director = Arc::new(Director::new(self.shared.clone(), self.dopts.clone()));
        let (health, health_service) = Health::new().await;
        let endpoints = std::mem::take(&mut self.endpoints);
        spawn_background(&self.opts, &self.shared, &tracker, &shutdown, endpoints)?;
        let (opts, shared) = (&self.opts, &self.shared);
        let kube = spawn_kubernetes(
            opts,
            &shared.datastore,
            &shared.metrics,
            &tracker,
            &shutdown,
        );
        let (client, readiness) = kube
            .await?
            .map_or((None, Vec::new()), |k| (Some(k.client), k.readiness));
        let admin_state = self.admin_state(client);
        tracker.spawn(admin::serve(
            self.listeners.metrics,
            Arc::new(admin_state),
            tracker.clone(),
            shutdown.clone(),
        ));
        let flow = Arc::clone(self.shared.config.flow_control());
        tracker.spawn(flow.run(shutdown.clone()));
        let failed = CancellationToken::new();
        let servers = Servers {
            ext_proc: self.listeners.grpc,
            health: self.listeners.health,
            certs: self.certs,
            health_service,
        };
        let wired = (&self.shared, director);
        servers.spawn(&self.opts, wired, &tracker, &failed, &shutdown)?;
        tracker.spawn(
            health
                .clone()
                .follow(readiness, drain.clone(), shutdown.clone()),
        );
        let stop = drain_then_stop(
            health.clone(),
            drain,
            self.opts.drain_timeout,
            shutdown.clone(),
        );
        tracker.spawn(stop);
        tracing::info!(
            endpoints = self.shared.datastore.snapshot().len(),
            tls = self.opts.secure_serving,
            metrics_auth = self.opts.metrics_auth(),
            "epp ready"
        );
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = failed.cancelled() => {}
        }
        health.set_ready(false).await;
        shutdown.cancel();
        tracker.close();
        tracker.wait().await;
        self.telemetry.shutdown().await;
        if failed.is_cancelled() {
            anyhow::bail!("a server failed; see the log");
        }
        Ok(())
    }

    /// What the metrics port serves from (`/metrics`, `/debug/snapshot`), with token
    /// authentication when Kubernetes is used and the flags ask for it.
    fn admin_state(&mut self, client: Option<kube::Client>) -> admin::AdminState {
        let (opts, shared) = (&self.opts, &self.shared);
        let auth = client
            .filter(|_| opts.metrics_auth())
            .map(|c| admin::auth::MetricsAuth::new(c, Arc::clone(&shared.metrics)));
        admin::AdminState {
            registry: std::mem::take(&mut self.registry),
            datastore: Arc::clone(&shared.datastore),
            config: Arc::clone(&shared.config),
            indexes: Arc::clone(&shared.indexes),
            pool_name: opts.pool_label(),
            config_origin: config_origin(opts),
            staleness: opts.metrics_staleness_threshold,
            auth,
        }
    }
}

/// ext_proc's certificate: none without `--secure-serving`, the files of `--cert-path`, or a
/// self-signed one. epp handshakes TLS itself (`tls`): a reloaded certificate can be swapped
/// in, and the minimum version is its own.
fn certificates(opts: &Options) -> anyhow::Result<Option<Arc<tls::Reloading>>> {
    Ok(match (&opts.cert_path, opts.secure_serving) {
        (_, false) => None,
        (Some(dir), true) => Some(tls::Reloading::load(dir)?),
        (None, true) => Some(tls::Reloading::self_signed()?),
    })
}

/// The gRPC servers: ext_proc (with the health service unless `--health-checking=false`) and
/// the health port.
struct Servers<H> {
    ext_proc: TcpListener,
    health: TcpListener,
    certs: Option<Arc<tls::Reloading>>,
    health_service: tonic_health::pb::health_server::HealthServer<H>,
}

/// A server's future, as the task that watches it for failure takes it.
type ServerFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<(), tonic::transport::Error>> + Send>,
>;

impl<H: tonic_health::pb::health_server::Health> Servers<H> {
    /// Spawns both servers; a server that fails cancels `failed`.
    fn spawn(
        self,
        opts: &Options,
        (shared, director): (&Shared, Arc<Director>),
        tracker: &TaskTracker,
        failed: &CancellationToken,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<()> {
        let guard = |name: &'static str, fut: ServerFuture| {
            let failed = failed.clone();
            async move {
                if let Err(e) = fut.await {
                    tracing::error!(server = name, error = %e, "server failed");
                    failed.cancel();
                }
            }
        };
        let services = Services::new(shared, director);
        let grpc = ExtProc::new(services, limits(opts))
            .with_endpoint_scores(opts.emit_endpoint_scores)
            .with_flow_control_forced(opts.flow_control);
        let mut server = grpc.into_server();
        if let Some(n) = opts.grpc_max_recv_msg_size {
            server = server.max_decoding_message_size(n);
        }
        if let Some(n) = opts.grpc_max_send_msg_size {
            server = server.max_encoding_message_size(n);
        }
        let mut ext = tonic::transport::Server::builder();
        let router = match opts.health_checking {
            true => ext
                .add_service(server)
                .add_service(self.health_service.clone()),
            false => ext.add_service(server),
        };
        let stop = shutdown.clone().cancelled_owned();
        let ext_proc: ServerFuture = match self.certs {
            Some(certs) => {
                let tls13_only = opts.tls_min_version == Some(options::TlsVersion::Tls13);
                let config = certs.server_config(tls13_only)?;
                if let (Some(dir), true) = (&opts.cert_path, opts.enable_cert_reload) {
                    tracker.spawn(certs.follow(dir.clone(), FILE_POLL, shutdown.clone()));
                }
                let incoming = tls::incoming(self.ext_proc, config, tracker, shutdown.clone());
                Box::pin(router.serve_with_incoming_shutdown(incoming, stop))
            }
            None => Box::pin(router.serve_with_incoming_shutdown(nodelay(self.ext_proc), stop)),
        };
        tracker.spawn(guard("ext_proc", ext_proc));
        let health = tonic::transport::Server::builder()
            .add_service(self.health_service)
            .serve_with_incoming_shutdown(
                TcpListenerStream::new(self.health),
                shutdown.clone().cancelled_owned(),
            );
        tracker.spawn(guard("health", Box::pin(health)));
        Ok(())
    }
}

fn initial_config(opts: &Options) -> anyhow::Result<Configured> {
    let text = match (&opts.config_file, &opts.config_text) {
        (Some(path), None) => std::fs::read_to_string(path)
            .with_context(|| format!("reading --config-file {}", path.display()))?,
        (None, Some(text)) => text.clone(),
        _ => config::DEFAULT_CONFIG.to_owned(),
    };
    let load = config::LoadOptions {
        allow_experimental: opts.allow_experimental_plugins,
    };
    Ok(Runtime::configure(&text, None, load)?)
}

/// Replica sharing from the flags (validated): `None` when neither a peer port nor peers are
/// given; the credentials are read here, every problem with them named in one error.
fn peer_sharing(
    opts: &Options,
    listener: Option<TcpListener>,
) -> anyhow::Result<Option<replicas::Sharing>> {
    let Some(dir) = &opts.speculative_peer_cert_dir else {
        return Ok(None);
    };
    if listener.is_none() && opts.speculative_peers.is_empty() {
        return Ok(None);
    }
    let names = opts
        .speculative_peers
        .iter()
        .map(|p| replicas::PeerName::parse(p))
        .collect::<Result<_, _>>()?;
    Ok(Some(replicas::Sharing {
        listener,
        peers: names,
        tls: replicas::PeerTls::load(dir)?,
    }))
}

/// Where the configuration comes from, for `/debug/snapshot`.
fn config_origin(opts: &Options) -> String {
    match (&opts.config_file, &opts.config_text) {
        (Some(path), _) => format!("--config-file {}", path.display()),
        (None, Some(_)) => "--config-text".to_owned(),
        (None, None) => "default".to_owned(),
    }
}

type EndpointSources = (
    Vec<crate::endpoint::Endpoint>,
    Option<discovery::EndpointsFile>,
);

/// Reads the static endpoints once, failing start-up on a bad flag or file.
fn initial_endpoints(opts: &Options, datastore: &Datastore) -> anyhow::Result<EndpointSources> {
    use discovery::{EndpointsFile, FileFormat};
    let fixed = discovery::parse_flag(opts.static_endpoints.as_deref().unwrap_or(""))?;
    let mut all = fixed.clone();
    let file = match (&opts.static_endpoints_file, &opts.config_discovery) {
        (Some(path), _) => Some(EndpointsFile {
            path: path.clone(),
            format: FileFormat::Epp,
            watch: true,
        }),
        (None, Some(f)) => Some(EndpointsFile {
            path: f.path.clone(),
            format: match f.clusters {
                true => FileFormat::Clusters,
                false => FileFormat::LlmD,
            },
            watch: f.watch_file,
        }),
        (None, None) => None,
    };
    if let Some(f) = &file {
        let what = match f.format {
            FileFormat::Epp => "--static-endpoints-file",
            FileFormat::LlmD => "the file-discovery plugin's path",
            FileFormat::Clusters => "the multicluster-file-discovery plugin's path",
        };
        let text = std::fs::read_to_string(&f.path)
            .with_context(|| format!("reading {what} {}", f.path.display()))?;
        let eps = f
            .format
            .parse(&text)
            .map_err(|e| anyhow::anyhow!("{what} {}: {e}", f.path.display()))?;
        all.extend(eps);
    }
    datastore.set_endpoints(all);
    Ok((fixed, file))
}

/// Accepted ext_proc connections with Nagle's algorithm off: epp answers a streamed body chunk
/// by chunk, and each small write would otherwise wait for the gateway's delayed ACK (~40 ms).
fn nodelay(
    listener: TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    TcpListenerStream::new(listener).map(|conn| {
        conn.inspect(|s| {
            if let Err(e) = s.set_nodelay(true) {
                tracing::debug!(error = %e, "TCP_NODELAY not set on an ext_proc connection");
            }
        })
    })
}

/// The per-stream limits from the flags.
fn limits(opts: &Options) -> Limits {
    Limits {
        max_body_bytes: opts.max_request_body_bytes,
        body_timeout: opts.request_body_timeout,
        early_decision: opts.early_decision,
        max_request_messages: opts.max_request_messages,
        max_header_bytes: opts.max_request_header_bytes,
        max_chat_messages: opts.max_chat_messages,
    }
}

/// The flow-control queue's setup from the flags: the command line's limits (which a
/// configuration's `flowControl` section overrides), the pool's name, the staleness threshold.
fn flow_setup(opts: &Options) -> FlowSetup {
    FlowSetup {
        base: crate::director::flowcontrol::FlowConfig {
            max_requests: opts.flow_control_max_requests,
            max_bytes: opts.flow_control_max_bytes,
            band_max_bytes: opts.flow_control_band_max_bytes,
            ttl: opts.flow_control_default_request_ttl,
            ..Default::default()
        },
        pool: opts.pool_label(),
        staleness: opts.metrics_staleness_threshold,
    }
}

/// The endpoint pollers' options: the flags, and the data-layer plugins' parameters where
/// the (deprecated) flags leave them unset.
/// A hub's TLS files (`multicluster-metrics-data-source`) are read here: one that is missing
/// or not PEM fails start-up.
fn scrape_options(
    opts: &Options,
    settings: &config::MetricsSettings,
) -> anyhow::Result<scrape::ScrapeOptions> {
    let clusters = match &settings.clusters {
        None => None,
        Some(c) => Some(Arc::new(
            scrape::cluster::ClusterScrape::new(c.clone())
                .context("multicluster-metrics-data-source")?,
        )),
    };
    Ok(scrape::ScrapeOptions {
        interval: opts.refresh_metrics_interval,
        timeout: opts.metrics_scrape_timeout,
        filter: opts.model_server_metrics_filter,
        gpu_metrics_url: opts.gpu_metrics_url.clone(),
        // The deprecated flags win over the data-layer plugins' parameters.
        path: opts
            .model_server_metrics_path
            .clone()
            .or(settings.path.clone()),
        port: match opts.model_server_metrics_port {
            0 => settings.port.unwrap_or(0),
            port => port,
        },
        default_engine: settings.default_engine,
        custom: settings.custom.clone(),
        engine_label_key: settings.engine_label_key.clone(),
        // Checked by `Options::validate`.
        names: opts.metric_names().unwrap_or_default(),
        probe: opts
            .health_check_interval
            .filter(|i| !i.is_zero())
            .map(|interval| scrape::probe::ProbeOptions {
                interval,
                timeout: opts.health_check_timeout,
                path: opts.health_check_path.clone(),
            }),
        clusters,
    })
}

fn spawn_background(
    opts: &Options,
    shared: &Shared,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
    endpoints: EndpointSources,
) -> anyhow::Result<()> {
    let (fixed, file) = endpoints;
    let (datastore, metrics) = (&shared.datastore, &shared.metrics);
    if file.as_ref().is_some_and(|f| f.watch) {
        tracker.spawn(discovery::run(
            Arc::clone(datastore),
            fixed,
            file,
            FILE_POLL,
            shutdown.clone(),
        ));
    }
    let startup = shared.config.startup();
    let sopts = scrape_options(opts, &startup.metrics_settings)?;
    scrape::spawn(
        Arc::clone(datastore),
        Arc::clone(metrics),
        sopts,
        tracker.clone(),
        shutdown.clone(),
    )
    .context("starting the endpoint pollers' thread")?;
    let kv = kv_events_options(opts, startup.kv_event_sockets.clone());
    let sink = kvevents::Sink::new(Arc::clone(&shared.indexes.precise), Arc::clone(metrics));
    tracker.spawn(kvevents::run(
        Arc::clone(datastore),
        sink,
        kv,
        tracker.clone(),
        shutdown.clone(),
    ));
    let every = opts.refresh_prometheus_metrics_interval;
    let gauges = admin::PoolGauges {
        metrics: Arc::clone(metrics),
        datastore: Arc::clone(datastore),
        indexes: Arc::clone(&shared.indexes),
        pool: opts.pool_label(),
        staleness: opts.metrics_staleness_threshold,
    };
    tracker.spawn(gauges.run(every, shutdown.clone()));
    tracker.spawn(prefix_gc::run(
        Arc::clone(datastore),
        Arc::clone(&shared.indexes),
        every,
        shutdown.clone(),
    ));
    if let Some(path) = &opts.config_file {
        tracker.spawn(reload::run(
            Arc::clone(&shared.config),
            Arc::clone(metrics),
            path.clone(),
            FILE_POLL,
            shutdown.clone(),
        ));
    }
    Ok(())
}

/// What Kubernetes mode hands back: the client (for `/metrics` auth) and the signals readiness
/// follows (discovery synced and its API server reachable; leadership, with leader election).
struct Kube {
    client: kube::Client,
    readiness: Vec<tokio::sync::watch::Receiver<bool>>,
}

/// Starts Kubernetes discovery (and leader election) when the options ask for it.
async fn spawn_kubernetes(
    opts: &Options,
    datastore: &Arc<Datastore>,
    metrics: &Arc<Metrics>,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<Kube>> {
    use discovery::k8s::{self, PoolSource};
    if !opts.uses_kubernetes() {
        return Ok(None);
    }
    let source = match (&opts.pool_name, &opts.endpoint_selector) {
        (Some(name), _) => PoolSource::pool(name.clone(), opts.pool_group.clone())?,
        (None, Some(sel)) => PoolSource::selector(sel, opts.endpoint_target_ports.clone())?,
        (None, None) => return Ok(None),
    };
    let client = k8s::client(opts.kubeconfig.as_deref()).await?;
    let namespace = opts.namespace();
    tracing::info!(namespace = %namespace, source = ?source, "Kubernetes discovery");
    let (sync, sync_tracker, synced) =
        k8s::sync::tracker(client.clone(), opts.kube_api_unreachable_grace);
    tracker.spawn(sync_tracker.run(shutdown.clone()));
    let watching = k8s::Watching {
        client: client.clone(),
        namespace: namespace.clone(),
        datastore: Arc::clone(datastore),
        metrics: Arc::clone(metrics),
        sync,
        pool_labels: k8s::PoolLabels::default(),
    };
    tracker.spawn(k8s::run_endpoints(
        watching.clone(),
        source,
        shutdown.clone(),
    ));
    tracker.spawn(k8s::run_objectives(
        watching,
        opts.pool_name.clone(),
        shutdown.clone(),
    ));
    let mut kube = Kube {
        client: client.clone(),
        readiness: vec![synced],
    };
    if !opts.ha_enable_leader_election {
        return Ok(Some(kube));
    }
    let pool = opts
        .pool_name
        .clone()
        .unwrap_or_else(|| "standalone".to_owned());
    let identity = format!(
        "{}_{:016x}",
        std::env::var("HOSTNAME").unwrap_or_else(|_| "epp".to_owned()),
        rand::random::<u64>()
    );
    let timing = leader::Timing {
        lease_duration: opts.ha_lease_duration,
        renew_deadline: opts.ha_renew_deadline,
        retry_period: opts.ha_retry_period,
    };
    let election = leader::Election {
        lease_name: leader::Election::lease_name(&namespace, &pool),
        namespace,
        identity,
        timing,
    };
    let (tx, rx) = tokio::sync::watch::channel(false);
    tracker.spawn(election.run(client, tx, Arc::clone(metrics), shutdown.clone()));
    kube.readiness.push(rx);
    Ok(Some(kube))
}

/// The graceful stop: NOT_SERVING at once, ext_proc served for `timeout`, then everything stops.
async fn drain_then_stop(
    health: Health,
    drain: CancellationToken,
    timeout: Duration,
    shutdown: CancellationToken,
) {
    tokio::select! {
        _ = drain.cancelled() => {}
        _ = shutdown.cancelled() => return,
    }
    health.set_ready(false).await;
    tracing::info!(drain_timeout = ?timeout, "draining: readiness NOT_SERVING, ext_proc still serving");
    tokio::select! {
        _ = tokio::time::sleep(timeout) => {}
        _ = shutdown.cancelled() => {}
    }
    shutdown.cancel();
}
