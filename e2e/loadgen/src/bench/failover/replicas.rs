//! The epp replicas of a failover round, as processes on fixed loopback ports (a restarted
//! replica comes back on the same ports, as a pod behind a stable address would), the Envoy in
//! front of them, and what Envoy's admin `/clusters` says about each replica.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use harness::envoy::{ha_endpoints_yaml, Envoy, EnvoyConfig, Replica, Template};
use tokio::time::Instant;

use super::{FailoverOptions, Layout};
use crate::bench::procs::{free_ports, Proc};
use crate::bench::BenchError;

/// How long a started replica may take to report SERVING, and Envoy to see a change of health.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// Running epp processes; each slot is empty between an exit and a restart.
pub struct Replicas {
    procs: Vec<Option<Proc>>,
    /// Per replica: ext_proc, health and metrics ports.
    ports: Vec<[u16; 3]>,
    epp: PathBuf,
    /// Every flag but the ports.
    args: Vec<String>,
    dir: PathBuf,
    starts: usize,
}

impl Replicas {
    /// Starts `opts.replicas` epp processes finding their pods with the `discovery` flags
    /// ([`static_endpoints`], or Kubernetes discovery), each ready (gRPC health SERVING).
    pub async fn start(
        opts: &FailoverOptions,
        discovery: Vec<String>,
        dir: &Path,
    ) -> Result<Self, BenchError> {
        let mut args = discovery;
        args.extend([
            "--secure-serving=false".to_owned(),
            format!("--drain-timeout={}ms", opts.drain_timeout.as_millis()),
            "--zap-log-level".to_owned(),
            "info".to_owned(),
        ]);
        if let Some(config) = &opts.config {
            args.extend(["--config-file".to_owned(), config.display().to_string()]);
        }
        let ports = (0..opts.replicas)
            .map(|_| free_ports(3).map(|p| [p[0], p[1], p[2]]))
            .collect::<Result<Vec<_>, _>>()?;
        let mut replicas = Self {
            procs: (0..opts.replicas).map(|_| None).collect(),
            ports,
            epp: opts.epp.clone(),
            args,
            dir: dir.to_path_buf(),
            starts: 0,
        };
        for i in 0..opts.replicas {
            replicas.restart(i).await?;
        }
        Ok(replicas)
    }

    pub fn len(&self) -> usize {
        self.ports.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ports.is_empty()
    }

    /// Replica `i` as Envoy's ext_proc cluster lists it.
    pub fn replica(&self, i: usize) -> Replica {
        Replica {
            grpc: SocketAddr::from(([127, 0, 0, 1], self.ports[i][0])),
            health_port: self.ports[i][1],
        }
    }

    /// Starts replica `i` (again) on its ports and waits until it reports SERVING.
    pub async fn restart(&mut self, i: usize) -> Result<(), BenchError> {
        self.starts += 1;
        let [grpc, health, metrics] = self.ports[i];
        let mut args = vec![
            format!("--grpc-port={grpc}"),
            format!("--grpc-health-port={health}"),
            format!("--metrics-port={metrics}"),
        ];
        args.extend(self.args.iter().cloned());
        let name = format!("epp-{}-start-{}", i + 1, self.starts);
        let mut proc_ = Proc::spawn_env(
            &name,
            &self.epp,
            &args,
            &[("MIMALLOC_PURGE_DELAY".to_owned(), "0".to_owned())],
            &self.dir,
        )?;
        let addr = SocketAddr::from(([127, 0, 0, 1], health));
        let ready = tokio::time::timeout(READY_WITHIN, harness::epp::wait_ready(addr)).await;
        if !matches!(ready, Ok(Ok(()))) {
            proc_.check_alive()?;
            return Err(BenchError::NotReady {
                what: format!("{name} (gRPC health on {addr})"),
                log: super::super::procs::log_tail(&proc_.log),
            });
        }
        self.procs[i] = Some(proc_);
        Ok(())
    }

    /// Sends `signal` to replica `i`.
    pub fn signal(&self, i: usize, signal: &str) -> Result<(), BenchError> {
        self.running(i)?.signal(signal)
    }

    /// Waits until replica `i` has exited (bounded), and empties its slot.
    pub async fn wait_exit(&mut self, i: usize, within: Duration) -> Result<(), BenchError> {
        let proc_ = self.procs[i]
            .as_mut()
            .ok_or_else(|| BenchError::Setup(format!("replica {} is not running", i + 1)))?;
        match proc_.wait_exit(within).await {
            Some(_) => {
                self.procs[i] = None;
                Ok(())
            }
            None => Err(BenchError::Setup(format!(
                "replica {} ({}) did not exit within {within:?} of its signal",
                i + 1,
                proc_.name
            ))),
        }
    }

    fn running(&self, i: usize) -> Result<&Proc, BenchError> {
        self.procs[i]
            .as_ref()
            .ok_or_else(|| BenchError::Setup(format!("replica {} is not running", i + 1)))
    }

    /// Starts an Envoy in `layout` in front of the replicas (the first is the primary of the
    /// hot-standby layout, the others its standbys).
    pub async fn envoy(&self, layout: Layout) -> Result<Envoy, BenchError> {
        let all: Vec<Replica> = (0..self.len()).map(|i| self.replica(i)).collect();
        let config = EnvoyConfig::new(Template::File(layout.template()))
            .epp_replicas(all.iter().map(|r| r.grpc))
            .concurrency(2);
        let config = match layout {
            Layout::ActiveActive => config.var("EPP_HA_ENDPOINTS", ha_endpoints_yaml(&all)),
            Layout::HotStandby => config
                .var("EPP_PRIMARY_ENDPOINTS", ha_endpoints_yaml(&all[..1]))
                .var("EPP_STANDBY_ENDPOINTS", ha_endpoints_yaml(&all[1..])),
        };
        Ok(config.start().await?)
    }
}

/// epp's flags for a static list of `pods`.
pub fn static_endpoints(pods: &[SocketAddr]) -> Vec<String> {
    let endpoints: Vec<String> = pods.iter().map(ToString::to_string).collect();
    vec!["--static-endpoints".to_owned(), endpoints.join(",")]
}

/// A per-host value of Envoy's admin `/clusters` for `replica` in the `ext_proc` cluster
/// (`rq_active`, `health_flags`, ...).
pub async fn host_stat(envoy: &Envoy, replica: Replica, stat: &str) -> Option<String> {
    let text = envoy.admin_get("/clusters").await.ok()?;
    let prefix = format!("ext_proc::{}::{stat}::", replica.grpc);
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map(str::to_owned)
}

/// Waits (bounded) until Envoy's active health check sees `replica` as `healthy` (or not).
pub async fn wait_health(envoy: &Envoy, replica: Replica, healthy: bool) -> Result<(), BenchError> {
    wait_health_within(envoy, replica, healthy, READY_WITHIN).await
}

/// [`wait_health`] bounded by `within`.
pub async fn wait_health_within(
    envoy: &Envoy,
    replica: Replica,
    healthy: bool,
    within: Duration,
) -> Result<(), BenchError> {
    let deadline = Instant::now() + within;
    let mut last = None;
    while Instant::now() < deadline {
        last = host_stat(envoy, replica, "health_flags").await;
        if (last.as_deref() == Some("healthy")) == healthy {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(BenchError::NotReady {
        what: format!(
            "Envoy's health check of epp {} (want healthy = {healthy})",
            replica.grpc
        ),
        log: format!("last health_flags: {last:?}"),
    })
}

/// A counter of Envoy's `ext_proc` cluster (`lb_healthy_panic`: streams routed while too few
/// replicas were healthy, to all of them).
pub async fn cluster_counter(envoy: &Envoy, name: &str) -> Option<u64> {
    let text = envoy
        .admin_get(&format!("/stats?filter={name}"))
        .await
        .ok()?;
    let prefix = format!("cluster.ext_proc.{name}: ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}
