//! Command-line options, with upstream's flag names and defaults where they apply.

use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    #[error("--config-file and --config-text are mutually exclusive")]
    ConfigConflict,
    #[error("no endpoints: give --pool-name (InferencePool), --endpoint-selector with --endpoint-target-ports (standalone), or --static-endpoints / --static-endpoints-file")]
    NoDiscovery,
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
}

/// Parses `50ms`, `2s`, `1m`, `1h`, or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        "us" | "µs" => n / 1e6,
        _ => {
            return Err(format!(
                "invalid duration unit in {s:?} (use ms, s, m or h)"
            ))
        }
    };
    Duration::try_from_secs_f64(secs).map_err(|e| e.to_string())
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
    pub grpc_port: u16,
    /// gRPC health port.
    #[arg(long, default_value_t = 9003)]
    pub grpc_health_port: u16,
    /// Prometheus metrics port.
    #[arg(long, default_value_t = 9090)]
    pub metrics_port: u16,
    /// Serve ext_proc over TLS (self-signed unless --cert-path is given).
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub secure_serving: bool,
    /// Directory holding tls.crt and tls.key.
    #[arg(long)]
    pub cert_path: Option<PathBuf>,
    /// Reload the certificate when it changes (not supported yet; must stay false).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub enable_cert_reload: bool,
    /// Also serve gRPC health on the ext_proc port.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub health_checking: bool,
    /// InferencePool to serve (Kubernetes discovery); also the pool metric label.
    #[arg(long)]
    pub pool_name: Option<String>,
    /// Namespace of the pool and its pods; then `$NAMESPACE`, then `default`.
    #[arg(long, default_value = "")]
    pub pool_namespace: String,
    /// API group of the InferencePool: inference.networking.k8s.io (v1) or
    /// inference.networking.x-k8s.io (v1alpha2).
    #[arg(long, default_value = "inference.networking.k8s.io")]
    pub pool_group: String,
    /// Standalone mode: pods matching `key=value,...` are the pool (no InferencePool).
    #[arg(long)]
    pub endpoint_selector: Option<String>,
    /// Standalone mode: the pods' serving ports (1 to 8, comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub endpoint_target_ports: Vec<u16>,
    /// Kubeconfig file (otherwise in-cluster config or `$KUBECONFIG`).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Active-passive HA: only the holder of a coordination.k8s.io Lease reports ready.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub ha_enable_leader_election: bool,
    /// Leader election lease duration (epp; controller-runtime's 15s).
    #[arg(long, default_value = "15s", value_parser = parse_duration, hide = true)]
    pub ha_lease_duration: Duration,
    /// Leader election renew deadline (epp; controller-runtime's 10s).
    #[arg(long, default_value = "10s", value_parser = parse_duration, hide = true)]
    pub ha_renew_deadline: Duration,
    /// Leader election retry period (epp; controller-runtime's 2s).
    #[arg(long, default_value = "2s", value_parser = parse_duration, hide = true)]
    pub ha_retry_period: Duration,
    /// Static endpoints, `ip:port,ip:port`.
    #[arg(long)]
    pub static_endpoints: Option<String>,
    /// YAML list of endpoints (address, port, name, engineType, labels, weight), re-read on change.
    #[arg(long)]
    pub static_endpoints_file: Option<PathBuf>,
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub disable_endpoint_subset_filter: bool,
    /// How often each endpoint's /metrics is scraped.
    #[arg(long, default_value = "50ms", value_parser = parse_duration)]
    pub refresh_metrics_interval: Duration,
    /// Per-scrape timeout.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub metrics_scrape_timeout: Duration,
    /// NVIDIA DCGM exporter to read GPU series from (per node, or a Prometheus `/federate`
    /// URL); series are matched to endpoints by their `pod` label. Without it, DCGM series in
    /// a pod's own /metrics (a sidecar exporter) are used.
    #[arg(long)]
    pub gpu_metrics_url: Option<String>,
    /// Active health: probe every endpoint's --health-check-path this often (off by default;
    /// upstream's GKE chart uses 2s). Failures feed the `outlier-detection` plugin.
    #[arg(long, value_parser = parse_duration)]
    pub health_check_interval: Option<Duration>,
    /// Timeout of one active health probe.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub health_check_timeout: Duration,
    /// Path of the active health probe on each endpoint's serving port.
    #[arg(long, default_value = "/health")]
    pub health_check_path: String,
    /// How often the pool gauges are refreshed.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub refresh_prometheus_metrics_interval: Duration,
    /// Metrics older than this make an endpoint a last resort.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub metrics_staleness_threshold: Duration,
    /// KV-cache events (precise prefix index): the ZMQ PUB port every endpoint publishes on
    /// (vLLM `--kv-events-config` `endpoint: tcp://*:<port>`); an endpoint's `kv-events-port`
    /// label overrides it. Without either, the endpoint is not subscribed.
    #[arg(long)]
    pub kv_events_port: Option<u16>,
    /// The endpoints' KV-event replay ROUTER port (vLLM `replay_endpoint`), used to repair
    /// sequence gaps; label `kv-events-replay-port` overrides it.
    #[arg(long)]
    pub kv_events_replay_port: Option<u16>,
    /// KV-event bind mode: bind one SUB socket here (e.g. `tcp://*:5557`, llm-d's
    /// `zmqEndpoint`) and let every pod's PUB connect to it (vLLM `--kv-events-config` with
    /// `endpoint: tcp://<epp>:5557`); the topic `kv@<ip>:<port>@<model>` names the pod. Replaces
    /// the per-endpoint connections of `--kv-events-port`.
    #[arg(long)]
    pub kv_events_bind: Option<String>,
    /// Active-active with the precise prefix scorer: the UDP port on which this replica receives
    /// the other replicas' speculative entries ([`crate::kvevents::peers`]). Off when unset.
    #[arg(long)]
    pub speculative_peer_port: Option<u16>,
    /// The replicas this one sends its speculative entries to: `host:port`, comma-separated. A
    /// name resolving to several addresses (a headless Service) reaches each; names are resolved
    /// again every 5 s, and this replica ignores its own datagrams.
    #[arg(long, value_delimiter = ',')]
    pub speculative_peers: Vec<String>,
    /// EndpointPickerConfig file, reloaded on change.
    #[arg(long)]
    pub config_file: Option<PathBuf>,
    /// EndpointPickerConfig as text.
    #[arg(long)]
    pub config_text: Option<String>,
    /// Largest request body accepted (413 beyond).
    #[arg(long, default_value_t = 64 << 20)]
    pub max_request_body_bytes: usize,
    /// Time allowed from a stream's start to the end of its request body (408 beyond).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub request_body_timeout: Duration,
    /// Duplex mode: route as soon as the model and the prompt prefix the scorers read have
    /// arrived, and stream the rest of the body through (`false`: decide on the whole body).
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub early_decision: bool,
    /// Most ext_proc messages on the request side of one stream (413 beyond).
    #[arg(long, default_value_t = 100_000)]
    pub max_request_messages: usize,
    /// Largest request headers, names and values (431 beyond).
    #[arg(long, default_value_t = 64 << 10)]
    pub max_request_header_bytes: usize,
    /// Most elements in a chat `messages` array (400 beyond).
    #[arg(long, default_value_t = 100_000)]
    pub max_chat_messages: usize,
    /// Flow control (upstream's `flowControl` feature gate): requests wait in epp while the
    /// pool is saturated, by priority and fairness key.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub flow_control: bool,
    /// Flow control: most requests waiting (`maxRequests`; 0 = unlimited; 429 beyond).
    #[arg(long, default_value_t = 0)]
    pub flow_control_max_requests: usize,
    /// Flow control: most bytes waiting (`maxBytes`; 0 = unlimited; 429 beyond).
    #[arg(long, default_value_t = 10 << 30)]
    pub flow_control_max_bytes: u64,
    /// Flow control: most bytes waiting per priority band (`defaultPriorityBand.maxBytes`).
    #[arg(long, default_value_t = 1_000_000_000)]
    pub flow_control_band_max_bytes: u64,
    /// Flow control: how long a request may wait (`defaultRequestTTL`; 503 beyond).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub flow_control_default_request_ttl: Duration,
    /// Metrics endpoint authentication (needs Kubernetes TokenReview; must stay false here).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub metrics_endpoint_auth: bool,
    /// Log format: `json` or `console`.
    #[arg(long, default_value = "console")]
    pub zap_encoder: String,
    /// Log level: error, warn, info, debug, trace (or upstream's -v verbosity).
    #[arg(long, default_value = "info")]
    pub zap_log_level: String,
    /// Verbosity as upstream's `-v`: 1 = debug, 2+ = trace.
    #[arg(short = 'v', long = "v", default_value_t = 0)]
    pub verbosity: u8,
}

impl Options {
    pub fn validate(&self) -> Result<(), OptionsError> {
        if self.config_file.is_some() && self.config_text.is_some() {
            return Err(OptionsError::ConfigConflict);
        }
        let static_eps = self.static_endpoints.is_some() || self.static_endpoints_file.is_some();
        if !static_eps && self.pool_name.is_none() && self.endpoint_selector.is_none() {
            return Err(OptionsError::NoDiscovery);
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
        if self.enable_cert_reload {
            return Err(OptionsError::Unsupported("--enable-cert-reload"));
        }
        if self.metrics_endpoint_auth {
            return Err(OptionsError::Unsupported(
                "--metrics-endpoint-auth (needs Kubernetes)",
            ));
        }
        if self.refresh_metrics_interval.is_zero() {
            return Err(OptionsError::Zero("--refresh-metrics-interval"));
        }
        Ok(())
    }

    /// Whether endpoints come from Kubernetes: static endpoints win (the pool name then only
    /// labels metrics), else the pool or the standalone selector.
    pub fn uses_kubernetes(&self) -> bool {
        let static_eps = self.static_endpoints.is_some() || self.static_endpoints_file.is_some();
        !static_eps && (self.pool_name.is_some() || self.endpoint_selector.is_some())
    }

    /// `--pool-namespace`, then `$NAMESPACE`, then `default`.
    pub fn namespace(&self) -> String {
        if !self.pool_namespace.is_empty() {
            return self.pool_namespace.clone();
        }
        std::env::var("NAMESPACE")
            .ok()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".to_owned())
    }

    /// The pool name used in metric labels.
    pub fn pool_label(&self) -> String {
        self.pool_name
            .clone()
            .unwrap_or_else(|| "static".to_owned())
    }

    /// The tracing filter directive from `--zap-log-level` and `-v`.
    pub fn log_directive(&self) -> String {
        match self.verbosity {
            0 => self.zap_log_level.clone(),
            1 => "debug".to_owned(),
            _ => "trace".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_flags_parse() {
        let o = Options::try_parse_from([
            "epp",
            "--secure-serving=false",
            "--grpc-port",
            "1",
            "--refresh-metrics-interval",
            "25ms",
            "--static-endpoints",
            "127.0.0.1:1",
            "-v",
            "1",
        ])
        .unwrap();
        assert!(!o.secure_serving);
        assert_eq!(o.refresh_metrics_interval, Duration::from_millis(25));
        assert_eq!(o.log_directive(), "debug");
        o.validate().unwrap();
        let o = Options::try_parse_from(["epp"]).unwrap();
        assert!(o.secure_serving);
        assert!(matches!(o.validate(), Err(OptionsError::NoDiscovery)));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        let o = Options::try_parse_from([
            "epp",
            "--pool-name",
            "p",
            "--pool-namespace",
            "ns",
            "--ha-enable-leader-election",
        ])
        .unwrap();
        o.validate().unwrap();
        assert_eq!((o.uses_kubernetes(), o.namespace().as_str()), (true, "ns"));
        let o = Options::try_parse_from([
            "epp",
            "--endpoint-selector",
            "app=vllm",
            "--endpoint-target-ports",
            "8000,8001",
        ])
        .unwrap();
        assert_eq!(o.endpoint_target_ports, [8000, 8001]);
        o.validate().unwrap();
        let o = Options::try_parse_from(["epp", "--endpoint-selector", "app=vllm"]).unwrap();
        assert!(matches!(o.validate(), Err(OptionsError::TargetPorts)));
        let o = Options::try_parse_from([
            "epp",
            "--static-endpoints",
            "127.0.0.1:1",
            "--ha-enable-leader-election",
        ])
        .unwrap();
        assert!(matches!(
            o.validate(),
            Err(OptionsError::ElectionWithoutKubernetes)
        ));
        assert!(parse_duration("5 parsecs").is_err());
    }
}
