//! The routers compared, each started as its own process(es) in front of the same pods:
//! Envoy alone (round robin, least request), Envoy + epp (a config file per variant), Envoy +
//! the do-nothing ext_proc server, vllm-router and sglang-router (from PyPI, in
//! `.venv-bench`). Every router is ready once a tiny completion through it answers 200.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::procs::{free_ports, log_tail, wait_http_ok, Proc};
use super::BenchError;
use harness::envoy::{Envoy, EnvoyConfig, Template};

/// One router configuration of the comparison.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Router {
    /// Envoy STATIC cluster, ROUND_ROBIN (what a Kubernetes Service gives).
    EnvoyRoundRobin,
    /// Envoy STATIC cluster, LEAST_REQUEST (power of two choices).
    EnvoyLeastRequest,
    /// Envoy + epp (FULL_DUPLEX_STREAMED ext_proc, ORIGINAL_DST) with this config file;
    /// `replicas` epp processes (active-active) in Envoy's ext_proc cluster.
    Epp {
        name: String,
        config: PathBuf,
        replicas: usize,
    },
    /// Envoy + epp subscribed to the pods' KV-cache events (the pods publish them), for a
    /// config with `precise-prefix-cache-scorer`; `replicas` as for [`Router::Epp`], each
    /// replica subscribed to every pod; `shared`: the replicas send each other their
    /// speculative entries (`--speculative-peers`).
    EppPrecise {
        name: String,
        config: PathBuf,
        replicas: usize,
        shared: bool,
    },
    /// Envoy + the do-nothing ext_proc server (round robin), the overhead floor.
    EnvoyNoopExtProc,
    /// vllm-router with this `--policy`.
    VllmRouter { policy: String },
    /// sglang-router with this `--policy`.
    SglangRouter { policy: String },
    /// GIE's EPP v1.5.0 (Kubernetes discovery, against the fake API server) behind the same
    /// Envoy as epp; `config`: its `--config-file`, `None` for its built-in default.
    GieEpp {
        name: String,
        config: Option<PathBuf>,
    },
    /// llm-d-router's EPP v0.10.0 (file discovery) behind the same Envoy as epp, with this
    /// config template (`${ENDPOINTS_FILE}` is filled in).
    LlmdEpp { name: String, config: PathBuf },
    /// llm-d-router's EPP v0.10.0 in llm-d's precise prefix-cache configuration
    /// (`hack/bench/llmd-precise.yaml`): as [`Router::LlmdEpp`], plus `${RENDER_URL}` (pod 0's
    /// vLLM render endpoints, for its `token-producer`) and `${KV_EVENTS_ENDPOINT}` (the SUB
    /// socket it binds, llm-d's global socket mode) filled in; the pods publish their KV events
    /// to that socket ([`Router::binds_kv_events`]).
    LlmdEppPrecise { name: String, config: PathBuf },
    /// epp with llm-d's precise configuration file (`hack/bench/epp-llmd-precise.yaml`: the same
    /// plugins without file discovery), the placeholders filled in as for
    /// [`Router::LlmdEppPrecise`]; epp binds the SUB socket the file's `kvEventsConfig` names
    /// (no flag, as the file would be deployed).
    EppLlmdPrecise { name: String, config: PathBuf },
}

impl Router {
    /// The label used in tables and plots.
    pub fn label(&self) -> String {
        match self {
            Router::EnvoyRoundRobin => "envoy-round-robin".into(),
            Router::EnvoyLeastRequest => "envoy-least-request".into(),
            Router::EppPrecise {
                name,
                replicas,
                shared: true,
                ..
            } => format!("epp-{name}-x{replicas}-shared"),
            Router::Epp { name, replicas, .. } | Router::EppPrecise { name, replicas, .. }
                if *replicas > 1 =>
            {
                format!("epp-{name}-x{replicas}")
            }
            Router::Epp { name, .. }
            | Router::EppPrecise { name, .. }
            | Router::EppLlmdPrecise { name, .. } => format!("epp-{name}"),
            Router::EnvoyNoopExtProc => "envoy-noop-extproc".into(),
            Router::VllmRouter { policy } => format!("vllm-router-{policy}"),
            Router::SglangRouter { policy } => format!("sglang-router-{policy}"),
            Router::GieEpp { name, .. } => format!("gie-epp-{name}"),
            Router::LlmdEpp { name, .. } | Router::LlmdEppPrecise { name, .. } => {
                format!("llm-d-epp-{name}")
            }
        }
    }

    /// Whether the pods must each have their own IP (one port for all): GIE's EPP takes its
    /// target port from the InferencePool.
    pub fn needs_host_per_pod(&self) -> bool {
        matches!(self, Router::GieEpp { .. })
    }

    /// Whether the pods must publish KV-cache events for this router.
    pub fn needs_kv_events(&self) -> bool {
        matches!(self, Router::EppPrecise { .. })
    }

    /// Whether this router binds a SUB socket the pods' KV-event PUB sockets connect to (llm-d's
    /// global socket mode; the pods need `SimOptions::kv_events_sub`).
    pub fn binds_kv_events(&self) -> bool {
        matches!(
            self,
            Router::LlmdEppPrecise { .. } | Router::EppLlmdPrecise { .. }
        )
    }
}

/// Where the programs are.
#[derive(Clone, Debug)]
pub struct Bins {
    pub epp: PathBuf,
    pub noop_extproc: PathBuf,
    pub inference_sim: PathBuf,
    pub loadgen: PathBuf,
    /// The Python venv holding vllm-router and sglang-router.
    pub venv: PathBuf,
    /// The upstream peers from `hack/install-peers.sh`.
    pub gie_epp: PathBuf,
    pub llmd_epp: PathBuf,
    pub llmd_sim: PathBuf,
}

impl Bins {
    /// The binaries next to the running one (same profile), and `<repo>/.venv-bench`; `EPP_BIN`
    /// names another epp binary (`hack/bench.sh --cost` measures the shipped `dist` build).
    pub fn beside_current_exe() -> Result<Self, BenchError> {
        let exe = std::env::current_exe().map_err(BenchError::io("locating the bench binary"))?;
        let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
        let epp = std::env::var_os("EPP_BIN")
            .filter(|p| !p.is_empty())
            .map_or_else(|| dir.join("epp"), PathBuf::from);
        Ok(Self {
            epp,
            noop_extproc: dir.join("noop-extproc"),
            inference_sim: dir.join("inference-sim"),
            loadgen: dir.join("loadgen"),
            venv: harness::envoy::repo_root().join(".venv-bench"),
            gie_epp: super::upstream::peer_bin("gie-epp"),
            llmd_epp: super::upstream::peer_bin("llm-d-epp"),
            llmd_sim: super::upstream::peer_bin("llm-d-inference-sim"),
        })
    }
}

/// A started router: where to send requests and the processes to measure.
pub struct Running {
    pub target: SocketAddr,
    /// Processes other than Envoy (epp, the noop server, a Python router).
    pub procs: Vec<Proc>,
    pub envoy: Option<Envoy>,
    /// The EPP's Prometheus endpoint (first replica), for its own decision-latency histogram.
    pub metrics: Option<SocketAddr>,
    /// The fake API server an EPP with Kubernetes discovery watches (kept running).
    pub api: Option<harness::fake_apiserver::FakeApiServer>,
    /// The ext_proc servers behind Envoy (empty for routers without one), so a second gateway
    /// (the compat bench's subset-hint Envoy) can front the same EPP.
    pub extproc: Vec<SocketAddr>,
}

impl Running {
    /// `(name, pid)` of every process of this router.
    pub fn pids(&self) -> Vec<(String, u32)> {
        let mut v: Vec<(String, u32)> = self
            .procs
            .iter()
            .map(|p| (p.name.clone(), p.pid()))
            .collect();
        if let Some(e) = &self.envoy {
            v.push(("envoy".into(), e.pid()));
        }
        v
    }
}

/// [`start`] against a simulator cluster's pods (their KV-event ports and SUB port included).
pub async fn start_on(
    router: &Router,
    cluster: &super::cluster::SimCluster,
    bins: &Bins,
    dir: &Path,
    model: &str,
) -> Result<Running, BenchError> {
    start(
        router,
        &cluster.pods,
        &cluster.kv_ports,
        cluster.kv_sub,
        bins,
        dir,
        model,
    )
    .await
}

/// Starts `router` in front of `pods` and waits until a completion through it succeeds.
/// `kv_ports` are the pods' KV-event (PUB, replay) ports, needed by [`Router::EppPrecise`];
/// `kv_sub` the port the pods publish their KV events to, needed by the routers that bind it
/// ([`Router::binds_kv_events`]).
pub async fn start(
    router: &Router,
    pods: &[SocketAddr],
    kv_ports: &[(u16, u16)],
    kv_sub: Option<u16>,
    bins: &Bins,
    dir: &Path,
    model: &str,
) -> Result<Running, BenchError> {
    let running = match router {
        Router::EnvoyRoundRobin => envoy_only(Template::RoundRobin, pods).await?,
        Router::EnvoyLeastRequest => envoy_only(Template::LeastRequest, pods).await?,
        Router::Epp {
            config, replicas, ..
        } => {
            if let Some(rendered) = llmd_file_discovery(config, pods, dir)? {
                epp(bins, &[], dir, &rendered, *replicas, false).await?
            } else {
                epp(
                    bins,
                    &["--static-endpoints".into(), endpoints(pods)],
                    dir,
                    config,
                    *replicas,
                    false,
                )
                .await?
            }
        }
        Router::EppPrecise {
            config,
            replicas,
            shared,
            ..
        } => {
            if kv_ports.len() != pods.len() {
                return Err(BenchError::Setup(format!(
                    "{} needs pods that publish KV events",
                    router.label()
                )));
            }
            let file = endpoints_file(pods, kv_ports, dir)?;
            epp(
                bins,
                &["--static-endpoints-file".into(), file],
                dir,
                config,
                *replicas,
                *shared,
            )
            .await?
        }
        Router::EnvoyNoopExtProc => noop(bins, pods, dir).await?,
        Router::VllmRouter { policy } => {
            python_router(bins, "vllm-router", &[], policy, pods, dir)?
        }
        Router::SglangRouter { policy } => python_router(
            bins,
            "sglang-router",
            &["launch", "--log-level", "warn"],
            policy,
            pods,
            dir,
        )?,
        Router::GieEpp { config, .. } => {
            super::upstream::gie(bins, pods, dir, config.as_deref()).await?
        }
        Router::LlmdEpp { config, .. } => {
            super::upstream::llmd(bins, pods, dir, config, &[]).await?
        }
        Router::LlmdEppPrecise { config, .. } => {
            let vars = super::upstream::precise_vars(pods, sub_port(router, kv_sub)?);
            super::upstream::llmd(bins, pods, dir, config, &vars).await?
        }
        Router::EppLlmdPrecise { config, .. } => {
            let sub = sub_port(router, kv_sub)?;
            let rendered = dir.join("epp-config.yaml");
            super::upstream::render_config(
                config,
                &super::upstream::precise_vars(pods, sub),
                &rendered,
            )?;
            let flags = ["--static-endpoints".into(), endpoints(pods)];
            epp(bins, &flags, dir, &rendered, 1, false).await?
        }
    };
    wait_routable(running.target, model, Duration::from_secs(60))
        .await
        .map_err(|e| match &running.procs.first() {
            Some(p) => BenchError::NotReady {
                what: format!("{} ({e})", router.label()),
                log: log_tail(&p.log),
            },
            None => e,
        })?;
    Ok(running)
}

fn sub_port(router: &Router, kv_sub: Option<u16>) -> Result<u16, BenchError> {
    kv_sub.ok_or_else(|| {
        BenchError::Setup(format!(
            "{} needs pods that publish KV events to its SUB socket (SimOptions::kv_events_sub)",
            router.label()
        ))
    })
}

async fn envoy_only(template: Template, pods: &[SocketAddr]) -> Result<Running, BenchError> {
    let envoy = EnvoyConfig::new(template)
        .pool(pods.iter().copied())
        .concurrency(2)
        .start()
        .await?;
    Ok(Running {
        target: envoy.listener_addr(),
        procs: Vec::new(),
        envoy: Some(envoy),
        metrics: None,
        api: None,
        extproc: Vec::new(),
    })
}

fn endpoints(pods: &[SocketAddr]) -> String {
    pods.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// An llm-d configuration with its `file-discovery` plugin (`${ENDPOINTS_FILE}`), rendered
/// as llm-d-router gets it: llm-d's endpoints file of `pods` written and its path filled in.
/// `None` for any other configuration.
fn llmd_file_discovery(
    config: &Path,
    pods: &[SocketAddr],
    dir: &Path,
) -> Result<Option<PathBuf>, BenchError> {
    let text = std::fs::read_to_string(config)
        .map_err(BenchError::io(format!("reading {}", config.display())))?;
    if !text.contains("${ENDPOINTS_FILE}") {
        return Ok(None);
    }
    let file = dir.join("epp-llmd-endpoints.yaml");
    std::fs::write(&file, super::upstream::endpoints_file(pods))
        .map_err(BenchError::io(format!("writing {}", file.display())))?;
    let rendered = dir.join("epp-llmd-config.yaml");
    let vars = [("ENDPOINTS_FILE", file.display().to_string())];
    super::upstream::render_config(config, &vars, &rendered)?;
    Ok(Some(rendered))
}

/// A `--static-endpoints-file` naming each pod's KV-event ports in its labels.
fn endpoints_file(
    pods: &[SocketAddr],
    kv_ports: &[(u16, u16)],
    dir: &Path,
) -> Result<String, BenchError> {
    let yaml: String = pods
        .iter()
        .zip(kv_ports)
        .map(|(a, (p, r))| format!("- {{address: {}, port: {}, labels: {{kv-events-port: \"{p}\", kv-events-replay-port: \"{r}\"}}}}\n", a.ip(), a.port()))
        .collect();
    let path = dir.join("endpoints.yaml");
    std::fs::write(&path, yaml).map_err(BenchError::io(format!("writing {}", path.display())))?;
    Ok(path.display().to_string())
}

/// `replicas` epp processes with the same flags, each its own process with its own ports (as
/// separate pods would be), all in Envoy's ext_proc cluster; `shared`: each sends its
/// speculative entries to all (gRPC over mutual TLS, `--speculative-peer-port` /
/// `--speculative-peers`, with one generated CA and certificate in `dir/peer-certs`).
async fn epp(
    bins: &Bins,
    discovery: &[String],
    dir: &Path,
    config: &Path,
    replicas: usize,
    shared: bool,
) -> Result<Running, BenchError> {
    let mut procs = Vec::new();
    let mut grpc = Vec::new();
    let mut metrics = None;
    let ports: Vec<Vec<u16>> = (0..replicas.max(1))
        .map(|_| free_ports(4))
        .collect::<Result<_, _>>()?;
    let peers = ports
        .iter()
        .map(|p| format!("127.0.0.1:{}", p[3]))
        .collect::<Vec<_>>()
        .join(",");
    let cert_dir = dir.join("peer-certs");
    if shared {
        peer_credentials(&cert_dir)?;
    }
    for (i, p) in ports.iter().enumerate() {
        let mut args: Vec<String> = [
            "--grpc-port",
            &p[0].to_string(),
            "--grpc-health-port",
            &p[1].to_string(),
            "--metrics-port",
            &p[2].to_string(),
            "--secure-serving=false",
            "--config-file",
            &config.display().to_string(),
            "--zap-log-level",
            "error",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        args.extend_from_slice(discovery);
        if shared {
            args.extend([
                "--speculative-peer-port".to_owned(),
                p[3].to_string(),
                "--speculative-peers".to_owned(),
                peers.clone(),
                "--speculative-peer-cert-dir".to_owned(),
                cert_dir.display().to_string(),
            ]);
        }
        let name = if i == 0 {
            "epp".to_owned()
        } else {
            format!("epp-{}", i + 1)
        };
        let mut proc_ = Proc::spawn_env(&name, &bins.epp, &args, &image_env(), dir)?;
        wait_http_ok(
            &mut proc_,
            SocketAddr::from(([127, 0, 0, 1], p[2])),
            "/metrics",
            Duration::from_secs(20),
        )
        .await?;
        procs.push(proc_);
        grpc.push(SocketAddr::from(([127, 0, 0, 1], p[0])));
        metrics.get_or_insert(SocketAddr::from(([127, 0, 0, 1], p[2])));
    }
    let envoy = EnvoyConfig::new(Template::Duplex)
        .epp_replicas(grpc.iter().copied())
        .concurrency(2)
        .start()
        .await?;
    Ok(Running {
        target: envoy.listener_addr(),
        procs,
        envoy: Some(envoy),
        metrics,
        api: None,
        extproc: grpc,
    })
}

async fn noop(bins: &Bins, pods: &[SocketAddr], dir: &Path) -> Result<Running, BenchError> {
    let port = free_ports(1)?[0];
    let args = vec![
        "--port".to_owned(),
        port.to_string(),
        "--endpoints".to_owned(),
        endpoints(pods),
    ];
    let proc_ = Proc::spawn("noop-extproc", &bins.noop_extproc, &args, dir)?;
    let grpc = SocketAddr::from(([127, 0, 0, 1], port));
    let envoy = EnvoyConfig::new(Template::Duplex)
        .epp(grpc)
        .concurrency(2)
        .start()
        .await?;
    Ok(Running {
        target: envoy.listener_addr(),
        procs: vec![proc_],
        envoy: Some(envoy),
        metrics: None,
        api: None,
        extproc: vec![grpc],
    })
}

fn python_router(
    bins: &Bins,
    program: &str,
    pre: &[&str],
    policy: &str,
    pods: &[SocketAddr],
    dir: &Path,
) -> Result<Running, BenchError> {
    let exe = bins.venv.join("bin").join(program);
    if !exe.is_file() {
        return Err(BenchError::Setup(format!(
            "{} is not installed (hack/bench.sh installs it into .venv-bench)",
            exe.display()
        )));
    }
    let p = free_ports(2)?;
    let mut args: Vec<String> = pre.iter().map(|s| (*s).to_owned()).collect();
    args.extend(
        [
            "--host",
            "127.0.0.1",
            "--port",
            &p[0].to_string(),
            "--policy",
            policy,
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            &p[1].to_string(),
        ]
        .map(str::to_owned),
    );
    args.push("--worker-urls".into());
    args.extend(pods.iter().map(|a| format!("http://{a}")));
    let proc_ = Proc::spawn(program, &exe, &args, dir)?;
    Ok(Running {
        target: SocketAddr::from(([127, 0, 0, 1], p[0])),
        procs: vec![proc_],
        envoy: None,
        metrics: None,
        api: None,
        extproc: Vec::new(),
    })
}

/// Sends a one-token completion through `target` until one answers 200.
pub async fn wait_routable(
    target: SocketAddr,
    model: &str,
    timeout: Duration,
) -> Result<(), BenchError> {
    let body =
        serde_json::json!({"model": model, "prompt": "ready check", "max_tokens": 1}).to_string();
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    while Instant::now() < deadline {
        match harness::client::post_json(target, "/v1/completions", body.clone()).await {
            Ok(r) if r.status.is_success() => return Ok(()),
            Ok(r) => last = format!("status {}: {}", r.status, r.text()),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(BenchError::NotReady {
        what: format!("a completion through {target}"),
        log: last,
    })
}

/// The sharing CA and one certificate for 127.0.0.1, written as the chart's Secret mounts them.
fn peer_credentials(dir: &Path) -> Result<(), BenchError> {
    let creds = ::epp::replicas::Credentials::generate(&["127.0.0.1"])
        .map_err(|e| BenchError::Setup(format!("replica-sharing credentials: {e}")))?;
    std::fs::create_dir_all(dir)
        .and_then(|()| creds.write(dir))
        .map_err(BenchError::io(format!("writing {}", dir.display())))
}

/// The environment epp's image sets (the Dockerfile's `ENV`), so that the bench measures epp
/// as it ships: mimalloc returns freed pages at once.
fn image_env() -> Vec<(String, String)> {
    vec![("MIMALLOC_PURGE_DELAY".to_owned(), "0".to_owned())]
}

#[cfg(test)]
mod tests;
