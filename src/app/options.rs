//! Command-line options, with upstream's flag names and defaults where they apply.

use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    #[error("--config-file and --config-text are mutually exclusive")]
    ConfigConflict,
    #[error("no endpoints: give --pool-name (InferencePool), --endpoint-selector with --endpoint-target-ports (standalone), --static-endpoints / --static-endpoints-file, or a configuration whose dataLayer.discovery names a file-discovery plugin")]
    NoDiscovery,
    #[error("--static-endpoints / --static-endpoints-file and the configuration's file-discovery plugin both give endpoints: use one")]
    TwoStaticSources,
    #[error("{0} and {1} are mutually exclusive")]
    Exclusive(&'static str, &'static str),
    #[error("--endpoint-selector needs 1 to 8 --endpoint-target-ports")]
    TargetPorts,
    #[error("--ha-enable-leader-election needs Kubernetes discovery (--pool-name or --endpoint-selector)")]
    ElectionWithoutKubernetes,
    #[error("{0} is not supported by this build")]
    Unsupported(&'static str),
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
    #[error(transparent)]
    MetricName(#[from] crate::scrape::parse::NameError),
    #[error("{0} requires {1}")]
    Requires(&'static str, &'static str),
    #[error("{0} {1}")]
    Invalid(&'static str, &'static str),
    #[error("replica sharing: {}", .0.join("; "))]
    Peers(Vec<String>),
    #[error("{0}: {1}")]
    Url(&'static str, String),
}

/// A duration flag: Go's grammar as upstream's flags (`50ms`, `1m30s`, `1.5s`, `300us`), and a
/// bare number of seconds, which epp's flags have always taken.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, crate::duration::DurationError> {
    crate::duration::parse_or_seconds(s)
}

#[derive(Debug, Clone, Parser)]
#[command(
    name = "epp",
    version,
    about = "Endpoint Picker for the Gateway API Inference Extension (ext_proc)"
)]
pub struct Options {
    /// ext_proc gRPC port.
    #[arg(long, default_value_t = 9002)]
    pub(crate) grpc_port: u16,
    /// gRPC health port.
    #[arg(long, default_value_t = 9003)]
    pub grpc_health_port: u16,
    /// Prometheus metrics port.
    #[arg(long, default_value_t = 9090)]
    pub(crate) metrics_port: u16,
    /// Serve ext_proc over TLS (self-signed unless --cert-path is given).
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub secure_serving: bool,
    /// Directory holding tls.crt and tls.key.
    #[arg(long)]
    pub(crate) cert_path: Option<PathBuf>,
    /// Reload --cert-path's certificate when its files change (new connections present it).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) enable_cert_reload: bool,
    /// Also serve gRPC health on the ext_proc port.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) health_checking: bool,
    /// InferencePool to serve (Kubernetes discovery); also the pool metric label.
    #[arg(long)]
    pub pool_name: Option<String>,
    /// Namespace of the pool and its pods; then `$NAMESPACE`, then `default`.
    #[arg(long, default_value = "")]
    pub pool_namespace: String,
    /// API group of the InferencePool: inference.networking.k8s.io (v1) or
    /// inference.networking.x-k8s.io (v1alpha2).
    #[arg(long, default_value = "inference.networking.k8s.io")]
    pub(crate) pool_group: String,
    /// Standalone mode: pods matching `key=value,...` are the pool (no InferencePool).
    #[arg(long)]
    pub endpoint_selector: Option<String>,
    /// Standalone mode: the pods' serving ports (1 to 8, comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub endpoint_target_ports: Vec<u16>,
    /// Kubeconfig file (otherwise in-cluster config or `$KUBECONFIG`).
    #[arg(long)]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// Active-passive HA: only the holder of a coordination.k8s.io Lease reports ready.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub ha_enable_leader_election: bool,
    /// Leader election lease duration (epp; controller-runtime's 15s).
    #[arg(long, default_value = "15s", value_parser = parse_duration, hide = true)]
    pub(crate) ha_lease_duration: Duration,
    /// Leader election renew deadline (epp; controller-runtime's 10s).
    #[arg(long, default_value = "10s", value_parser = parse_duration, hide = true)]
    pub(crate) ha_renew_deadline: Duration,
    /// Leader election retry period (epp; controller-runtime's 2s).
    #[arg(long, default_value = "2s", value_parser = parse_duration, hide = true)]
    pub(crate) ha_retry_period: Duration,
    /// Static endpoints, `ip:port,ip:port`.
    #[arg(long)]
    pub(crate) static_endpoints: Option<String>,
    /// YAML list of endpoints (address, port, name, engineType, labels, weight), re-read on change.
    #[arg(long)]
    pub(crate) static_endpoints_file: Option<PathBuf>,
    /// The configuration's `file-discovery` plugin, when `dataLayer.discovery` names one: set
    /// once the configuration is loaded ([`Options::check_discovery`]), not a flag.
    #[arg(skip)]
    pub(crate) config_discovery: Option<crate::config::FileDiscovery>,
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) disable_endpoint_subset_filter: bool,
    /// How often each endpoint's /metrics is scraped.
    #[arg(long, default_value = "50ms", value_parser = parse_duration)]
    pub refresh_metrics_interval: Duration,
    /// Per-scrape timeout.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub(crate) metrics_scrape_timeout: Duration,
    /// Ask each model server for only the series epp reads (`?name[]=...`, which vLLM and
    /// SGLang serve through prometheus_client): a ~1 KB page instead of ~50 KB, less CPU on
    /// both sides. A server that ignores or refuses the filter is scraped whole (logged once).
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) model_server_metrics_filter: bool,
    /// NVIDIA DCGM exporter to read GPU series from (per node, or a Prometheus `/federate`
    /// URL); series are matched to endpoints by their `pod` label. Without it, DCGM series in
    /// a pod's own /metrics (a sidecar exporter) are used.
    #[arg(long)]
    pub(crate) gpu_metrics_url: Option<String>,
    /// Active health: probe every endpoint's --health-check-path this often (off by default;
    /// upstream's GKE chart uses 2s). Failures feed the `outlier-detection` plugin.
    #[arg(long, value_parser = parse_duration)]
    pub(crate) health_check_interval: Option<Duration>,
    /// Timeout of one active health probe.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub(crate) health_check_timeout: Duration,
    /// Path of the active health probe on each endpoint's serving port.
    #[arg(long, default_value = "/health")]
    pub(crate) health_check_path: String,
    /// How often the pool gauges are refreshed.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub(crate) refresh_prometheus_metrics_interval: Duration,
    /// Metrics older than this make an endpoint a last resort.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub(crate) metrics_staleness_threshold: Duration,
    /// KV-cache events (precise prefix index): the ZMQ PUB port every endpoint publishes on
    /// (vLLM `--kv-events-config` `endpoint: tcp://*:<port>`); an endpoint's `kv-events-port`
    /// label overrides it. Without either, the endpoint is not subscribed.
    #[arg(long)]
    pub(crate) kv_events_port: Option<u16>,
    /// The endpoints' KV-event replay ROUTER port (vLLM `replay_endpoint`), used to repair
    /// sequence gaps; label `kv-events-replay-port` overrides it.
    #[arg(long)]
    pub(crate) kv_events_replay_port: Option<u16>,
    /// KV-event bind mode: bind one SUB socket here (e.g. `tcp://*:5557`, llm-d's
    /// `zmqEndpoint`) and let every pod's PUB connect to it (vLLM `--kv-events-config` with
    /// `endpoint: tcp://<epp>:5557`); the topic `kv@<ip>:<port>@<model>` names the pod. Replaces
    /// the per-endpoint connections of `--kv-events-port`.
    #[arg(long)]
    pub(crate) kv_events_bind: Option<String>,
    /// Active-active with the precise prefix scorer: the gRPC port (mutual TLS) on which this
    /// replica receives the other replicas' speculative entries ([`crate::replicas`]).
    /// Off when unset.
    #[arg(long)]
    pub speculative_peer_port: Option<u16>,
    /// The replicas this one sends its speculative entries to: `host:port`, comma-separated. A
    /// name resolving to several addresses (a headless Service) reaches each; names are resolved
    /// again every 5 s, and a replica refuses its own stream. The host is the name the peer's
    /// certificate must carry.
    #[arg(long, value_delimiter = ',')]
    pub speculative_peers: Vec<String>,
    /// Replica sharing's mutual TLS: a directory with `ca.crt` (the sharing CA), and `tls.crt` +
    /// `tls.key` (a certificate it signed, presented to peers both ways). Required with
    /// `--speculative-peer-port` or `--speculative-peers`.
    #[arg(long)]
    pub(crate) speculative_peer_cert_dir: Option<PathBuf>,
    /// EndpointPickerConfig file, reloaded on change.
    #[arg(long)]
    pub config_file: Option<PathBuf>,
    /// EndpointPickerConfig as text.
    #[arg(long)]
    pub(crate) config_text: Option<String>,
    /// Largest request body accepted (413 beyond).
    #[arg(long, default_value_t = 64 << 20)]
    pub(crate) max_request_body_bytes: usize,
    /// Time allowed from a stream's start to the end of its request body (408 beyond).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub(crate) request_body_timeout: Duration,
    /// Duplex mode: route as soon as the model and the prompt prefix the scorers read have
    /// arrived, and stream the rest of the body through (`false`: decide on the whole body).
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) early_decision: bool,
    /// Most ext_proc messages on the request side of one stream (413 beyond).
    #[arg(long, default_value_t = 100_000)]
    pub(crate) max_request_messages: usize,
    /// Largest request headers, names and values (431 beyond).
    #[arg(long, default_value_t = 64 << 10)]
    pub(crate) max_request_header_bytes: usize,
    /// Most elements in a chat `messages` array (400 beyond).
    #[arg(long, default_value_t = 100_000)]
    pub(crate) max_chat_messages: usize,
    /// Flow control (upstream's `flowControl` feature gate): requests wait in epp while the
    /// pool is saturated, by priority and fairness key.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) flow_control: bool,
    /// Flow control: most requests waiting (`maxRequests`; 0 = unlimited; 429 beyond).
    #[arg(long, default_value_t = 0)]
    pub(crate) flow_control_max_requests: usize,
    /// Flow control: most bytes waiting (`maxBytes`; 0 = unlimited; 429 beyond).
    #[arg(long, default_value_t = 10 << 30)]
    pub(crate) flow_control_max_bytes: u64,
    /// Flow control: most bytes waiting per priority band (`defaultPriorityBand.maxBytes`).
    #[arg(long, default_value_t = 1_000_000_000)]
    pub(crate) flow_control_band_max_bytes: u64,
    /// Flow control: how long a request may wait (`defaultRequestTTL`; 503 beyond).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub(crate) flow_control_default_request_ttl: Duration,
    /// Metrics endpoint authentication and authorization, as upstream: a bearer token checked
    /// with TokenReview, then SubjectAccessReview for `get` on the path. Default: on in
    /// Kubernetes mode (upstream's default), off without an API server to ask; `true` without
    /// Kubernetes discovery fails start-up.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) metrics_endpoint_auth: Option<bool>,
    /// How long the Kubernetes API server may stay unreachable before readiness turns
    /// NOT_SERVING (epp; routing continues from the last known state meanwhile).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub(crate) kube_api_unreachable_grace: Duration,
    /// Log format: `json` or `console`.
    #[arg(long, default_value = "console")]
    pub zap_encoder: String,
    /// Log level: error, warn, info, debug, trace (or upstream's -v verbosity).
    #[arg(long, default_value = "info")]
    pub(crate) zap_log_level: String,
    /// Verbosity as upstream's `-v`: 0–3 = `--zap-log-level`, 4 = debug, 5+ = trace.
    #[arg(short = 'v', long = "v", default_value_t = 0)]
    pub verbosity: u8,

    // ---- Upstream flags (GIE v1.5.0 and llm-d-router v0.10.0), accepted with their meaning.
    // `Option` where epp must know whether the flag was given (to say once that it is honoured
    // only in part). See `Options::partial_notes`.
    /// OpenTelemetry tracing (upstream default true). epp exports spans when an OTLP endpoint
    /// is configured (`OTEL_EXPORTER_OTLP_ENDPOINT`); `--tracing=false` turns tracing off.
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub tracing: bool,
    /// Deprecated upstream (GIE): scheme of the model servers' metrics endpoint.
    #[arg(long, default_value = "http")]
    pub(crate) model_server_metrics_scheme: String,
    /// Deprecated upstream (GIE): path of the model servers' metrics endpoint (overrides the
    /// engine's path).
    #[arg(long)]
    pub(crate) model_server_metrics_path: Option<String>,
    /// Deprecated upstream (GIE): port of the model servers' metrics endpoint (0 = the serving
    /// port).
    #[arg(long, default_value_t = 0)]
    pub(crate) model_server_metrics_port: u16,
    /// Deprecated upstream (GIE): skip TLS verification when scraping over https.
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) model_server_metrics_https_insecure_skip_verify: bool,
    /// Overrides the engine's queue-length series (`name` or `name{label=value}`).
    #[arg(long)]
    pub(crate) total_queued_requests_metric: Option<String>,
    /// Overrides the engine's running-requests series.
    #[arg(long)]
    pub(crate) total_running_requests_metric: Option<String>,
    /// Overrides the engine's KV-cache usage series.
    #[arg(long)]
    pub(crate) kv_cache_usage_percentage_metric: Option<String>,
    /// Overrides the engine's LoRA info series.
    #[arg(long)]
    pub(crate) lora_info_metric: Option<String>,
    /// Overrides the engine's cache-config info series.
    #[arg(long)]
    pub(crate) cache_info_metric: Option<String>,
    /// zap development mode (upstream default true, and a no-op there: its logger is fixed).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) zap_devel: Option<bool>,
    /// zap stack-trace level (accepted; a no-op upstream too).
    #[arg(long)]
    pub(crate) zap_stacktrace_level: Option<String>,
    /// zap time encoding: epoch, millis, nano, iso8601, rfc3339, rfc3339nano (accepted; epp
    /// logs RFC 3339 timestamps).
    #[arg(long)]
    pub(crate) zap_time_encoding: Option<String>,
    /// Go pprof handlers on the metrics port (upstream default true; epp has no Go runtime).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) enable_pprof: Option<bool>,
    /// Allow alpha (experimental) plugins in the configuration.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub allow_experimental_plugins: bool,
    /// After SIGTERM: report NOT_SERVING and keep serving ext_proc this long, then stop.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub drain_timeout: Duration,
    /// Put every candidate's score in the dynamic metadata
    /// (`envoy.lb` `x-gateway-destination-endpoint-scores`).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) emit_endpoint_scores: bool,
    /// ext_proc stream metrics (epp always counts streams; accepted).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) enable_grpc_stream_metrics: bool,
    /// Largest gRPC message epp accepts (`25MiB`, `10MB`, bytes).
    #[arg(long, value_parser = parse_size)]
    pub(crate) grpc_max_recv_msg_size: Option<usize>,
    /// Largest gRPC message epp sends.
    #[arg(long, value_parser = parse_size)]
    pub(crate) grpc_max_send_msg_size: Option<usize>,
    /// Lowest TLS version of the ext_proc server: VersionTLS10 … VersionTLS13.
    #[arg(long, value_parser = parse_tls_version)]
    pub(crate) tls_min_version: Option<TlsVersion>,
    /// TLS cipher suites of the ext_proc server (Go crypto/tls names).
    #[arg(long, value_delimiter = ',')]
    pub(crate) tls_cipher_suites: Vec<String>,
    /// TLS on the metrics port: a directory with tls.crt and tls.key.
    #[arg(long)]
    pub(crate) metrics_cert_dir: Option<PathBuf>,
    /// mTLS on the metrics port: the CA that client certificates must chain to.
    #[arg(long)]
    pub(crate) metrics_client_ca_file: Option<PathBuf>,
}

/// `--tls-min-version`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum TlsVersion {
    Tls10,
    Tls11,
    Tls12,
    Tls13,
}

/// A value a flag's parser refuses (clap prints it after the flag's name).
#[derive(Debug, thiserror::Error)]
pub(crate) enum FlagValueError {
    #[error("unknown TLS version {0:?}; supported values: VersionTLS10, VersionTLS11, VersionTLS12, VersionTLS13")]
    TlsVersion(String),
    #[error("invalid size {0:?}")]
    Size(String),
    #[error("invalid size unit in {0:?} (use Ki, Mi, Gi, K, M, G)")]
    SizeUnit(String),
    #[error("size {0:?} is too large")]
    SizeTooLarge(String),
}

fn parse_tls_version(s: &str) -> Result<TlsVersion, FlagValueError> {
    match s {
        "VersionTLS10" => Ok(TlsVersion::Tls10),
        "VersionTLS11" => Ok(TlsVersion::Tls11),
        "VersionTLS12" => Ok(TlsVersion::Tls12),
        "VersionTLS13" => Ok(TlsVersion::Tls13),
        _ => Err(FlagValueError::TlsVersion(s.to_owned())),
    }
}

/// Parses a Kubernetes quantity of bytes as upstream's gRPC size flags do: `25MiB`, `10MB`,
/// `1Gi`, `1048576` (a trailing `B`/`b` is dropped).
pub(crate) fn parse_size(s: &str) -> Result<usize, FlagValueError> {
    let t = s.trim();
    let t = t.strip_suffix(['B', 'b']).unwrap_or(t);
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| FlagValueError::Size(s.to_owned()))?;
    let mult: u64 = match unit {
        "" => 1,
        "k" | "K" => 1000,
        "M" => 1000 * 1000,
        "G" => 1000 * 1000 * 1000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => return Err(FlagValueError::SizeUnit(s.to_owned())),
    };
    n.checked_mul(mult)
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| FlagValueError::SizeTooLarge(s.to_owned()))
}

impl Options {
    pub fn validate(&self) -> Result<(), OptionsError> {
        if self.config_file.is_some() && self.config_text.is_some() {
            return Err(OptionsError::ConfigConflict);
        }
        // A configuration may name its own discovery: checked once it is loaded.
        let config_given = self.config_file.is_some() || self.config_text.is_some();
        if !config_given {
            self.check_discovery()?;
        }
        if self.pool_name.is_some() && self.endpoint_selector.is_some() {
            return Err(OptionsError::Exclusive(
                "--pool-name",
                "--endpoint-selector",
            ));
        }
        if self.endpoint_selector.is_some() && !(1..=8).contains(&self.endpoint_target_ports.len())
        {
            return Err(OptionsError::TargetPorts);
        }
        if self.ha_enable_leader_election && !self.uses_kubernetes() {
            return Err(OptionsError::ElectionWithoutKubernetes);
        }
        if self.metrics_endpoint_auth == Some(true) && !self.uses_kubernetes() {
            return Err(OptionsError::Requires(
                "--metrics-endpoint-auth=true",
                "Kubernetes discovery (--pool-name or --endpoint-selector) to review tokens",
            ));
        }
        if self.metrics_client_ca_file.is_some() && self.metrics_cert_dir.is_none() {
            return Err(OptionsError::Requires(
                "--metrics-client-ca-file",
                "--metrics-cert-dir",
            ));
        }
        if self.metrics_cert_dir.is_some() {
            return Err(OptionsError::Unsupported(
                "--metrics-cert-dir (TLS on the metrics port)",
            ));
        }
        if !matches!(self.model_server_metrics_scheme.as_str(), "http" | "https") {
            return Err(OptionsError::Invalid(
                "--model-server-metrics-scheme",
                "must be http or https",
            ));
        }
        if self.model_server_metrics_scheme == "https" {
            return Err(OptionsError::Unsupported(
                "--model-server-metrics-scheme=https (epp scrapes over http)",
            ));
        }
        self.metric_names()?;
        self.check_urls()?;
        if self.refresh_metrics_interval.is_zero() {
            return Err(OptionsError::Zero("--refresh-metrics-interval"));
        }
        let peers = self.peer_problems();
        if !peers.is_empty() {
            return Err(OptionsError::Peers(peers));
        }
        Ok(())
    }

    /// The poller's URLs: the DCGM exporter's, and the paths it asks every pod for (a path
    /// that makes no URL would otherwise fail every scrape or probe).
    fn check_urls(&self) -> Result<(), OptionsError> {
        use crate::scrape::client::Url;
        let bad =
            |flag| move |e: crate::scrape::client::BadUrl| OptionsError::Url(flag, e.to_string());
        if let Some(url) = &self.gpu_metrics_url {
            Url::parse(url).map_err(bad("--gpu-metrics-url"))?;
        }
        let paths = [
            (
                "--model-server-metrics-path",
                self.model_server_metrics_path.as_deref(),
            ),
            ("--health-check-path", Some(self.health_check_path.as_str())),
        ];
        for (flag, path) in paths {
            if let Some(path) = path.filter(|p| !p.is_empty()) {
                let path = crate::scrape::parse::unquote(path);
                if !path.starts_with('/') {
                    return Err(OptionsError::Url(
                        flag,
                        format!("{path:?} does not start with /"),
                    ));
                }
                Url::parse(&format!("http://localhost{path}")).map_err(bad(flag))?;
            }
        }
        Ok(())
    }

    /// Every problem with the replica-sharing flags, so one start-up error names them all.
    pub(crate) fn peer_problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let sharing = self.speculative_peer_port.is_some() || !self.speculative_peers.is_empty();
        match (sharing, &self.speculative_peer_cert_dir) {
            (true, None) => out.push("--speculative-peer-port and --speculative-peers need --speculative-peer-cert-dir (ca.crt, tls.crt, tls.key: replicas authenticate each other with mutual TLS)".to_owned()),
            (false, Some(_)) => out.push("--speculative-peer-cert-dir needs --speculative-peer-port or --speculative-peers".to_owned()),
            _ => {}
        }
        if let Some(port) = self.speculative_peer_port.filter(|p| *p != 0) {
            for (flag, other) in [
                ("--grpc-port", self.grpc_port),
                ("--grpc-health-port", self.grpc_health_port),
                ("--metrics-port", self.metrics_port),
            ] {
                if port == other {
                    out.push(format!("--speculative-peer-port {port} is also {flag}"));
                }
            }
        }
        for entry in &self.speculative_peers {
            if let Err(e) = crate::replicas::PeerName::parse(entry) {
                out.push(e.to_string());
            }
        }
        out
    }

    /// That endpoints come from somewhere, and from one static source at most: the flags or
    /// the configuration's `file-discovery` ([`Self::config_discovery`], set by then).
    pub(crate) fn check_discovery(&self) -> Result<(), OptionsError> {
        let flags = self.static_endpoints.is_some() || self.static_endpoints_file.is_some();
        let from_config = self.config_discovery.is_some();
        if flags && from_config {
            return Err(OptionsError::TwoStaticSources);
        }
        if !flags && !from_config && self.pool_name.is_none() && self.endpoint_selector.is_none() {
            return Err(OptionsError::NoDiscovery);
        }
        if self.ha_enable_leader_election && !self.uses_kubernetes() {
            return Err(OptionsError::ElectionWithoutKubernetes);
        }
        Ok(())
    }

    /// Whether endpoints come from Kubernetes: static endpoints (the flags, or the
    /// configuration's `file-discovery`, as upstream starts no controller manager then) win
    /// (the pool name then only labels metrics), else the pool or the standalone selector.
    pub fn uses_kubernetes(&self) -> bool {
        let static_eps = self.static_endpoints.is_some()
            || self.static_endpoints_file.is_some()
            || self.config_discovery.is_some();
        !static_eps && (self.pool_name.is_some() || self.endpoint_selector.is_some())
    }

    /// Whether the metrics port checks bearer tokens with the API server.
    pub(crate) fn metrics_auth(&self) -> bool {
        self.metrics_endpoint_auth.unwrap_or(true) && self.uses_kubernetes()
    }

    /// `--pool-namespace`, then `$NAMESPACE`, then `default`.
    pub(crate) fn namespace(&self) -> String {
        if !self.pool_namespace.is_empty() {
            return self.pool_namespace.clone();
        }
        std::env::var("NAMESPACE")
            .ok()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".to_owned())
    }

    /// The pool name used in metric labels.
    pub(crate) fn pool_label(&self) -> String {
        self.pool_name
            .clone()
            .unwrap_or_else(|| "static".to_owned())
    }

    /// What epp does differently from upstream for the flags given: one line each, logged once
    /// at start.
    pub fn partial_notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if self.enable_pprof == Some(true) {
            notes.push("--enable-pprof: epp has no Go pprof handlers; use /debug/snapshot and the epp_* metrics".to_owned());
        }
        if self.zap_devel.is_some() || self.zap_stacktrace_level.is_some() {
            notes.push("--zap-devel/--zap-stacktrace-level: accepted; epp's log format follows --zap-encoder and its level --zap-log-level/-v".to_owned());
        }
        if self.zap_time_encoding.is_some() {
            notes.push("--zap-time-encoding: accepted; epp logs RFC 3339 timestamps".to_owned());
        }
        if self.enable_grpc_stream_metrics {
            notes.push("--enable-grpc-stream-metrics: epp always counts ext_proc streams (epp_extproc_* metrics)".to_owned());
        }
        if self.enable_cert_reload && (self.cert_path.is_none() || !self.secure_serving) {
            notes.push("--enable-cert-reload: nothing to reload without --cert-path and secure serving (as upstream)".to_owned());
        }
        if !self.tls_cipher_suites.is_empty() {
            notes.push("--tls-cipher-suites: accepted; epp's TLS stack (rustls) offers only modern AEAD suites and ignores the Go names".to_owned());
        }
        match self.tls_min_version {
            Some(v) if v < TlsVersion::Tls12 => notes.push("--tls-min-version below TLS 1.2: epp's TLS stack (rustls) supports TLS 1.2 and 1.3 only, so its minimum is TLS 1.2".to_owned()),
            _ => {}
        }
        notes
    }

    /// The metric names of the per-engine flags.
    pub(crate) fn metric_names(
        &self,
    ) -> Result<crate::scrape::parse::NameOverrides, crate::scrape::parse::NameError> {
        crate::scrape::parse::NameOverrides::parse(crate::scrape::parse::NameFlags {
            waiting: self.total_queued_requests_metric.as_deref(),
            running: self.total_running_requests_metric.as_deref(),
            kv: self.kv_cache_usage_percentage_metric.as_deref(),
            lora: self.lora_info_metric.as_deref(),
            cache: self.cache_info_metric.as_deref(),
        })
    }

    /// The tracing filter directive from `--zap-log-level` and `-v`.
    ///
    /// Upstream's `-v N` is zap level −N, named `info` for −1..−3, `debug` at −4 and `trace`
    /// below: the charts' default `--v 1` is info-level logging, not debug.
    pub fn log_directive(&self) -> String {
        match self.verbosity {
            0..=3 => self.zap_log_level.clone(),
            4 => "debug".to_owned(),
            _ => "trace".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests;
