//! A prefill/decode stack on loopback: inference-sim pods with the simulated NIXL connector,
//! a decode sidecar in front of each decode pod (llm-d's `pd-sidecar` when `EPP_PD_SIDECAR`
//! names its binary, else the stand-in; [`crate::pd_sidecar`]), epp (in-process) reading an
//! endpoints file that labels each endpoint with `llm-d.ai/role`, and Envoy. As in llm-d,
//! epp's decode endpoints are the sidecars' addresses.
//!
//! # Data parallelism
//! With [`PdOptions::data_parallel`] `N > 1` every pod has `N` ranks, as llm-d's dev
//! deployments run vLLM (or llm-d-inference-sim) with `--data-parallel-size=N`
//! (`deploy/components/vllm-{decode,prefill}`, v0.10.0): rank `r` is its own engine with its own
//! API server on the pod's port + `r`, here one inference-sim pod per rank on consecutive ports
//! (`sim-decode-<i>-rank-<r>`). The decode pod's sidecar runs with `--data-parallel-size=N` and
//! serves rank `r` on its port + `r`. epp gets one endpoint per rank, named and ranked as its
//! Kubernetes discovery names an InferencePool's targetPorts (`<pod>-rank-<r>`, `rank: r`).

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
    /// Data-parallel ranks per pod (1: none; see the module docs).
    pub data_parallel: u16,
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
    /// Decode ranks are cluster pods `0..decode` (pod `i`'s rank `r` is `i·N + r`), prefill
    /// ranks follow in the same order.
    pub decode: usize,
    /// epp's endpoints, cluster order: address, name, role.
    endpoints: Vec<StackEndpoint>,
    dir: PathBuf,
}

/// One endpoint epp knows: a rank of a pod (the decode ones at their sidecar's port).
#[derive(Clone, Debug)]
struct StackEndpoint {
    addr: SocketAddr,
    name: String,
    rank: u16,
    role: &'static str,
}

impl PdStack {
    pub async fn start(opts: PdOptions) -> anyhow::Result<Self> {
        let ranks = opts.data_parallel.max(1);
        let pods = opts.decode + opts.prefill;
        let mut configs = Vec::with_capacity(pods * usize::from(ranks));
        let mut listeners = Vec::with_capacity(configs.capacity());
        for (i, name) in sim_names(&opts).into_iter().enumerate() {
            let mut engine = opts.engine.clone();
            engine.kv_transfer = Some(KvTransferConfig {
                role: KvRole::Both,
                bytes_per_token: opts.kv_bytes_per_token,
                bandwidth_gbps: opts.kv_bandwidth_gbps,
                engine_id: format!("engine-{name}"),
                host: "127.0.0.1".into(),
                port: 5600u16.wrapping_add(i as u16),
            });
            configs.push(PodConfig {
                engine,
                pod_name: name,
                seed: i as u64,
                prompt_tokens_details: true,
                record_requests: opts.record_requests,
                ..Default::default()
            });
        }
        for _ in 0..pods {
            let base = crate::ports::free_range(usize::from(ranks))?;
            for r in 0..ranks {
                listeners.push(TcpListener::bind(("127.0.0.1", base + r)).await?);
            }
        }
        let cluster = Cluster::start_on(configs, listeners).await?;
        let dir = std::env::temp_dir().join(format!(
            "epp-pd-{}-{}",
            std::process::id(),
            cluster.addrs()[0].port()
        ));
        std::fs::create_dir_all(&dir).context("creating the stack's directory")?;
        let binary = real::binary_from_env()?;
        let decode = opts.decode * usize::from(ranks);
        let mut sidecars = Vec::new();
        if !opts.aggregated {
            for &decoder in cluster.addrs()[..decode].iter().step_by(usize::from(ranks)) {
                let cfg = SidecarConfig {
                    decoder,
                    data_parallel_size: ranks,
                    ..opts.sidecar.clone()
                };
                sidecars.push(DecodeSidecar::start(binary.as_deref(), cfg, &dir).await?);
            }
        }
        let endpoints = stack_endpoints(&opts, cluster.addrs(), &sidecars);
        let file: String = endpoints.iter().map(StackEndpoint::file_entry).collect();
        let path = dir.join("endpoints.yaml");
        std::fs::write(&path, file).context("writing the endpoints file")?;
        let epp = match &opts.llmd_epp {
            Some(binary) => {
                // llm-d's file discovery needs a name: the rank's where it has one.
                let names: Vec<String> = (0..endpoints.len())
                    .map(
                        |i| match endpoints[i].name == endpoints[i].addr.to_string() {
                            true => format!("ep-{i}"),
                            false => endpoints[i].name.clone(),
                        },
                    )
                    .collect();
                let labels: Vec<[(&str, &str); 1]> = endpoints
                    .iter()
                    .map(|e| [("llm-d.ai/role", e.role)])
                    .collect();
                let files: Vec<FileEndpoint<'_>> = endpoints
                    .iter()
                    .zip(names.iter().zip(&labels))
                    .map(|(e, (name, labels))| FileEndpoint {
                        name,
                        addr: e.addr,
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
            .pool(endpoints.iter().map(|e| e.addr))
            .start()
            .await?;
        Ok(Self {
            cluster,
            sidecars,
            epp,
            envoy,
            decode,
            endpoints,
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

    /// The endpoints epp routes to, as `ip:port` (decode sidecars' ranks or pods, then prefill
    /// pods), in cluster order: endpoint `i` is served by cluster pod `i`.
    pub fn endpoints(&self) -> Vec<String> {
        self.endpoints.iter().map(|e| e.addr.to_string()).collect()
    }

    /// epp's names of [`Self::endpoints`] (its metric label `model_server_pod`): the address,
    /// or `<pod>-rank-<r>` with data-parallel ranks.
    pub fn endpoint_names(&self) -> Vec<String> {
        self.endpoints.iter().map(|e| e.name.clone()).collect()
    }

    /// Which decode sidecar runs: `pd-sidecar` (llm-d's), `stand-in`, or `none` (aggregated).
    pub fn sidecar_kind(&self) -> &'static str {
        self.sidecars.first().map_or("none", DecodeSidecar::kind)
    }

    /// The ranks of each pod (`PdOptions::data_parallel`, at least 1).
    pub fn ranks_per_pod(&self) -> u16 {
        let decode_pods = self.sidecars.len().max(1);
        u16::try_from(self.decode / decode_pods).unwrap_or(1).max(1)
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

/// The cluster pods' names: decode pods' ranks, then prefill pods' (see [`PdStack::decode`]).
fn sim_names(opts: &PdOptions) -> Vec<String> {
    let ranks = opts.data_parallel.max(1);
    let pods = (0..opts.decode)
        .map(|i| format!("sim-decode-{i}"))
        .chain((0..opts.prefill).map(|i| format!("sim-prefill-{i}")));
    pods.flat_map(|pod| {
        (0..ranks).map(move |r| match ranks {
            1 => pod.clone(),
            _ => format!("{pod}-rank-{r}"),
        })
    })
    .collect()
}

/// epp's endpoints for the cluster's pods (decode ones behind their sidecar's rank ports).
fn stack_endpoints(
    opts: &PdOptions,
    addrs: &[SocketAddr],
    sidecars: &[DecodeSidecar],
) -> Vec<StackEndpoint> {
    let ranks = usize::from(opts.data_parallel.max(1));
    let decode = opts.decode * ranks;
    let names = sim_names(opts);
    let sidecar_addrs: Vec<SocketAddr> = sidecars.iter().flat_map(DecodeSidecar::addrs).collect();
    addrs
        .iter()
        .zip(names)
        .enumerate()
        .map(|(i, (&addr, name))| {
            let (addr, role) = match (i < decode, opts.aggregated) {
                (true, true) => (addr, "prefill-decode"),
                (true, false) => (sidecar_addrs[i], "decode"),
                (false, _) => (addr, "prefill"),
            };
            StackEndpoint {
                addr,
                // Unranked pods keep the address as their name, as before ranks existed.
                name: if ranks == 1 { addr.to_string() } else { name },
                rank: (i % ranks) as u16,
                role,
            }
        })
        .collect()
}

impl StackEndpoint {
    /// Its entry in epp's static endpoints file.
    fn file_entry(&self) -> String {
        let name = match self.name == self.addr.to_string() {
            true => String::new(),
            false => format!("  name: {}\n  rank: {}\n", self.name, self.rank),
        };
        format!(
            "- address: {}\n  port: {}\n{name}  labels: {{llm-d.ai/role: {}}}\n",
            self.addr.ip(),
            self.addr.port(),
            self.role
        )
    }
}
