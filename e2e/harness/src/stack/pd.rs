//! A prefill/decode stack on loopback: inference-sim pods with the simulated NIXL connector,
//! a decode sidecar in front of each decode pod (llm-d's `pd-sidecar` when `EPP_PD_SIDECAR`
//! names its binary, else the stand-in; [`crate::pd_sidecar`]), epp (in-process) reading an
//! endpoints file that labels each endpoint with `llm-d.ai/role`, and Envoy. As in llm-d,
//! epp's decode endpoints are the sidecars' addresses.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use tokio::net::TcpListener;

use super::Epp;
use crate::envoy::{Envoy, EnvoyConfig, Template};
use crate::llmd_epp::{FileEndpoint, LlmdEpp};
use crate::pd_sidecar::{real, DecodeSidecar, SidecarConfig};
use inference_sim::{Cluster, EngineConfig, KvRole, KvTransferConfig, PodConfig};

/// What to start.
#[derive(Clone, Debug)]
pub struct PdOptions {
    /// Prefill pods (`sim-prefill-<i>`, role `prefill`), not behind a sidecar.
    pub prefill: usize,
    /// Decode pods (`sim-decode-<i>`, role `decode`), each behind a sidecar.
    pub decode: usize,
    /// Aggregated serving instead: the decode pods without sidecars, role `prefill-decode`.
    pub aggregated: bool,
    /// Engine of every pod; the NIXL connector is added (`kv_both`).
    pub engine: EngineConfig,
    /// KV bytes per token and pull bandwidth (GB/s) of the simulated connector.
    pub kv_bytes_per_token: f64,
    pub kv_bandwidth_gbps: f64,
    /// The sidecars' retry and fallback settings (their decoder address is filled in).
    pub sidecar: SidecarConfig,
    /// EndpointPickerConfig text.
    pub epp_config: String,
    /// More epp flags.
    pub epp_args: Vec<String>,
    /// Every pod records the requests it receives (`PodControl::hook`).
    pub record_requests: bool,
    /// Run llm-d-router's own EPP from this binary instead of epp (side-by-side tests); the
    /// same configuration, with llm-d's file discovery added ([`crate::llmd_epp`]).
    pub llmd_epp: Option<PathBuf>,
}

/// The endpoint picker behind Envoy.
pub enum Picker {
    /// epp, in-process.
    Epp(Epp),
    /// llm-d-router's EPP, a child process.
    Llmd(LlmdEpp),
}

impl Picker {
    /// Its Prometheus text.
    pub async fn metrics_text(&self) -> anyhow::Result<String> {
        match self {
            Self::Epp(e) => Ok(e.metrics_text().await?),
            Self::Llmd(l) => l.metrics_text().await,
        }
    }

    fn grpc(&self) -> SocketAddr {
        match self {
            Self::Epp(e) => e.grpc,
            Self::Llmd(l) => l.grpc,
        }
    }

    async fn stop(self) {
        match self {
            Self::Epp(e) => e.stop().await,
            Self::Llmd(l) => drop(l),
        }
    }
}

/// A running P/D stack.
pub struct PdStack {
    pub cluster: Cluster,
    /// One per decode pod, in pod order (empty when aggregated).
    pub sidecars: Vec<DecodeSidecar>,
    pub epp: Picker,
    pub envoy: Envoy,
    /// Decode pods are cluster pods `0..decode`, prefill pods follow.
    pub decode: usize,
    dir: PathBuf,
}

impl PdStack {
    pub async fn start(opts: PdOptions) -> anyhow::Result<Self> {
        let pods = opts.decode + opts.prefill;
        let mut configs = Vec::with_capacity(pods);
        let mut listeners = Vec::with_capacity(pods);
        for i in 0..pods {
            let name = if i < opts.decode {
                format!("sim-decode-{i}")
            } else {
                format!("sim-prefill-{}", i - opts.decode)
            };
            let mut engine = opts.engine.clone();
            engine.kv_transfer = Some(KvTransferConfig {
                role: KvRole::Both,
                bytes_per_token: opts.kv_bytes_per_token,
                bandwidth_gbps: opts.kv_bandwidth_gbps,
                engine_id: format!("engine-{name}"),
                host: "127.0.0.1".into(),
                port: 5600 + i as u16,
            });
            configs.push(PodConfig {
                engine,
                pod_name: name,
                seed: i as u64,
                prompt_tokens_details: true,
                record_requests: opts.record_requests,
                ..Default::default()
            });
            listeners.push(TcpListener::bind("127.0.0.1:0").await?);
        }
        let cluster = Cluster::start_on(configs, listeners).await?;
        let dir = std::env::temp_dir().join(format!(
            "epp-pd-{}-{}",
            std::process::id(),
            cluster.addrs()[0].port()
        ));
        std::fs::create_dir_all(&dir).context("creating the stack's directory")?;
        let binary = real::binary_from_env()?;
        let mut sidecars = Vec::new();
        if !opts.aggregated {
            for &decoder in &cluster.addrs()[..opts.decode] {
                let cfg = SidecarConfig {
                    decoder,
                    ..opts.sidecar.clone()
                };
                sidecars.push(DecodeSidecar::start(binary.as_deref(), cfg, &dir).await?);
            }
        }
        let mut endpoints: Vec<(SocketAddr, &str)> = Vec::new();
        for (i, &addr) in cluster.addrs().iter().enumerate() {
            let entry = match (i < opts.decode, opts.aggregated) {
                (true, true) => (addr, "prefill-decode"),
                (true, false) => (sidecars[i].addr(), "decode"),
                (false, _) => (addr, "prefill"),
            };
            endpoints.push(entry);
        }
        let file: String = endpoints
            .iter()
            .map(|(a, role)| {
                format!(
                    "- address: {}\n  port: {}\n  labels: {{llm-d.ai/role: {role}}}\n",
                    a.ip(),
                    a.port()
                )
            })
            .collect();
        let path = dir.join("endpoints.yaml");
        std::fs::write(&path, file).context("writing the endpoints file")?;
        let epp = match &opts.llmd_epp {
            Some(binary) => {
                let names: Vec<String> = (0..endpoints.len()).map(|i| format!("ep-{i}")).collect();
                let labels: Vec<[(&str, &str); 1]> = endpoints
                    .iter()
                    .map(|(_, role)| [("llm-d.ai/role", *role)])
                    .collect();
                let files: Vec<FileEndpoint<'_>> = endpoints
                    .iter()
                    .zip(names.iter().zip(&labels))
                    .map(|((addr, _), (name, labels))| FileEndpoint {
                        name,
                        addr: *addr,
                        labels,
                    })
                    .collect();
                Picker::Llmd(LlmdEpp::start(binary, &opts.epp_config, &files, &dir).await?)
            }
            None => Picker::Epp(Self::start_epp(&opts, &path).await?),
        };
        let envoy = EnvoyConfig::new(Template::Duplex)
            .epp(epp.grpc())
            .epp_tls(false)
            .pool(endpoints.iter().map(|(a, _)| *a))
            .start()
            .await?;
        Ok(Self {
            cluster,
            sidecars,
            epp,
            envoy,
            decode: opts.decode,
            dir,
        })
    }

    async fn start_epp(opts: &PdOptions, path: &std::path::Path) -> anyhow::Result<Epp> {
        let mut args: Vec<String> = vec![
            "--static-endpoints-file".into(),
            path.to_string_lossy().into_owned(),
            "--config-text".into(),
            opts.epp_config.clone(),
            "--secure-serving".into(),
            "false".into(),
        ];
        args.extend(opts.epp_args.iter().cloned());
        Epp::start(&args).await
    }

    /// The endpoints epp routes to, as `ip:port` (decode sidecars or pods, then prefill pods).
    pub fn endpoints(&self) -> Vec<String> {
        let decode = self.cluster.addrs()[..self.decode].iter().enumerate();
        let decode = decode.map(|(i, a)| self.sidecars.get(i).map_or(*a, DecodeSidecar::addr));
        let prefill = self.cluster.addrs()[self.decode..].iter().copied();
        decode.chain(prefill).map(|a| a.to_string()).collect()
    }

    /// Which decode sidecar runs: `pd-sidecar` (llm-d's), `stand-in`, or `none` (aggregated).
    pub fn sidecar_kind(&self) -> &'static str {
        self.sidecars.first().map_or("none", DecodeSidecar::kind)
    }

    pub async fn stop(self) {
        drop(self.envoy);
        self.epp.stop().await;
        for s in self.sidecars {
            s.shutdown().await;
        }
        self.cluster.shutdown().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
