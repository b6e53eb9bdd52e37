//! Failover under load (issue 35, item 4): `replicas` epp processes behind a real Envoy whose
//! ext_proc cluster is health-checked (`config/envoy/ha-active-active.yaml`, or llm-d v1.0's
//! hot-standby layout `ha-hot-standby.yaml`), an open-loop load at a fixed rate through it, and
//! one fault in the middle of the load: every replica restarted in turn (SIGTERM, wait for the
//! drain to end, start again, wait until Envoy sees it healthy), one replica SIGTERMed, one
//! SIGKILLed, the Kubernetes API server SIGKILLed and held down past epp's
//! `--kube-api-unreachable-grace` (30 s by default), or nothing (the steady baseline). A
//! [`Round`] says how many requests failed, how many streams the killed replica held when it
//! died (Envoy's own count), and the prefix-cache hit rate of the requests sent during the
//! fault against the ones sent before it.
//!
//! The epp replicas are the epp binary (they must be signalled by PID), each on its own ports
//! with `--static-endpoints` naming the pods, or, for `apiserver-gone`, discovering them from a
//! real kube-apiserver ([`kube`]); the pods are whatever the caller started (the
//! `failover-bench` binary: inference-sim processes; the e2e test: in-process pods).

mod analysis;
mod kube;
mod replicas;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

pub use analysis::{needed, table, Round};
pub use replicas::Replicas;

use super::BenchError;
use crate::run::{self, RunConfig};
use crate::schedule::{Load, Stage};
use crate::workload::Workload;

/// What happens to the replicas while the load runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// Nothing: the baseline (its "during" window is the same length as a fault's).
    Steady,
    /// Every replica in turn: SIGTERM, drained and exited, started again, healthy in Envoy.
    RollingRestart,
    /// SIGTERM of the first replica (the primary in the hot-standby layout); not restarted.
    Sigterm,
    /// SIGKILL of the first replica; not restarted.
    Sigkill,
    /// The replicas discover their pods from a real kube-apiserver, which is SIGKILLed (etcd
    /// stays up), held down for [`FailoverOptions::apiserver_down`], and started again.
    ApiServerGone,
}

impl Fault {
    pub const ALL: [Fault; 5] = [
        Fault::Steady,
        Fault::RollingRestart,
        Fault::Sigterm,
        Fault::Sigkill,
        Fault::ApiServerGone,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::Steady => "steady",
            Fault::RollingRestart => "rolling-restart",
            Fault::Sigterm => "sigterm",
            Fault::Sigkill => "sigkill",
            Fault::ApiServerGone => "apiserver-gone",
        }
    }

    /// Parses a [`Fault::name`]; the error lists the names.
    pub fn parse(text: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|f| f.name() == text)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|f| f.name()).collect();
                format!(
                    "unknown fault {text:?}: expected one of {}",
                    names.join(", ")
                )
            })
    }
}

/// How Envoy spreads streams over the replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Every replica serves (`ha-active-active.yaml`).
    ActiveActive,
    /// The first replica at priority 0, the others at priority 1 (`ha-hot-standby.yaml`).
    HotStandby,
}

impl Layout {
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "active-active" => Ok(Layout::ActiveActive),
            "hot-standby" => Ok(Layout::HotStandby),
            _ => Err(format!(
                "unknown layout {text:?}: expected active-active or hot-standby"
            )),
        }
    }

    /// The Envoy bootstrap template of this layout.
    pub fn template(self) -> PathBuf {
        let file = match self {
            Layout::ActiveActive => "ha-active-active.yaml",
            Layout::HotStandby => "ha-hot-standby.yaml",
        };
        harness::envoy::repo_root()
            .join("config")
            .join("envoy")
            .join(file)
    }
}

/// One round's setting (the fault is chosen per round).
#[derive(Clone, Debug)]
pub struct FailoverOptions {
    /// The epp binary.
    pub epp: PathBuf,
    /// epp's `--config-file`; `None`: its built-in default.
    pub config: Option<PathBuf>,
    pub replicas: usize,
    pub layout: Layout,
    /// Requests per second (evenly spaced).
    pub rate: f64,
    /// How long the load runs.
    pub duration: Duration,
    /// When the fault starts, from the start of the load; the requests sent before it (after the
    /// first second) are the steady window.
    pub fault_at: Duration,
    /// How long after the fault's end requests still count as "during" it.
    pub settle: Duration,
    /// epp's `--drain-timeout`.
    pub drain_timeout: Duration,
    /// `apiserver-gone`: how long kube-apiserver stays down (longer than epp's
    /// `--kube-api-unreachable-grace`, 30 s, to see the replicas turn NOT_SERVING).
    pub apiserver_down: Duration,
    pub workload: Workload,
    pub model: String,
    pub seed: u64,
}

impl FailoverOptions {
    /// Checks what a round needs; the error names the option.
    pub fn validate(&self) -> Result<(), BenchError> {
        let bad = |what: String| Err(BenchError::Setup(what));
        if !self.epp.is_file() {
            return bad(format!(
                "the epp binary {} does not exist (cargo build --bin epp, or set EPP_BIN)",
                self.epp.display()
            ));
        }
        if self.replicas < 2 {
            return bad(format!(
                "replicas must be >= 2 to fail over, got {}",
                self.replicas
            ));
        }
        if !(self.rate > 0.0 && self.rate.is_finite()) {
            return bad(format!("rate must be > 0, got {}", self.rate));
        }
        if self.fault_at <= Duration::from_secs(1) || self.fault_at >= self.duration {
            return bad(format!(
                "fault-at ({:?}) must be after the first second and before the end of the load ({:?})",
                self.fault_at, self.duration
            ));
        }
        Ok(())
    }
}

/// What the fault did and when (offsets from the start of the load).
#[derive(Clone, Debug, Default)]
pub struct Injected {
    pub at: Duration,
    pub done: Duration,
    /// Streams Envoy had open on the killed replica just before SIGKILL.
    pub victim_in_flight: Option<u64>,
    /// Streams Envoy had sent the signalled replica before the signal (SIGTERM, SIGKILL).
    pub victim_streams: Option<u64>,
    /// How long after SIGTERM (`apiserver-gone`: after the API server's SIGKILL) Envoy's health
    /// check took the (first) replica out of rotation.
    pub out_of_rotation: Option<Duration>,
    /// Envoy's `lb_healthy_panic` of the ext_proc cluster at the end of the fault: streams
    /// routed to every replica because too few were healthy.
    pub panic_routed: Option<u64>,
}

/// Runs one round: starts the replicas and Envoy, runs the load with `fault` in it, stops
/// everything (the replicas and Envoy are dropped, killing what is left).
pub async fn round(
    opts: &FailoverOptions,
    fault: Fault,
    pods: &[SocketAddr],
    dir: &Path,
) -> Result<Round, BenchError> {
    opts.validate()?;
    let kube = match fault {
        Fault::ApiServerGone => Some(kube::KubePool::start(pods, dir).await?),
        _ => None,
    };
    let discovery = match &kube {
        Some(k) => k.epp_args(),
        None => replicas::static_endpoints(pods),
    };
    let mut replicas = Replicas::start(opts, discovery, dir).await?;
    let envoy = replicas.envoy(opts.layout).await?;
    let target = envoy.listener_addr();
    super::routers::wait_routable(target, &opts.model, Duration::from_secs(30)).await?;
    for i in 0..opts.replicas {
        replicas::wait_health(&envoy, replicas.replica(i), true).await?;
    }
    let planned = (opts.rate * opts.duration.as_secs_f64()).ceil() as usize;
    let cfg = RunConfig {
        target,
        workload: opts.workload.clone(),
        load: Load::Open {
            stages: vec![Stage {
                rate: opts.rate,
                duration: opts.duration,
            }],
            poisson: false,
        },
        max_requests: planned + 1,
        max_duration: opts.duration,
        drain: Duration::from_secs(30),
        seed: opts.seed,
        model: opts.model.clone(),
    };
    let start = Instant::now();
    let (records, injected) = tokio::join!(
        run::run(cfg),
        inject(&mut replicas, &envoy, kube.as_ref(), fault, start, opts)
    );
    let injected = injected?;
    write_records(&dir.join("requests.jsonl"), &records)?;
    Ok(analysis::Round::of(fault, opts, &records, &injected))
}

/// Waits until `fault_at`, then does `fault` and reports when it started and ended.
async fn inject(
    replicas: &mut Replicas,
    envoy: &harness::envoy::Envoy,
    kube: Option<&kube::KubePool>,
    fault: Fault,
    start: Instant,
    opts: &FailoverOptions,
) -> Result<Injected, BenchError> {
    tokio::time::sleep_until(start + opts.fault_at).await;
    let at = start.elapsed();
    // After its drain epp still finishes the streams it holds (the longest request), then exits.
    let exit_within = opts.drain_timeout + Duration::from_secs(40);
    let mut victim_in_flight = None;
    let mut out_of_rotation = None;
    let victim_streams = replicas::host_stat(envoy, replicas.replica(0), "rq_total")
        .await
        .and_then(|v| v.parse().ok());
    match fault {
        Fault::Steady => {}
        Fault::Sigterm => {
            replicas.signal(0, "TERM")?;
            replicas::wait_health(envoy, replicas.replica(0), false).await?;
            out_of_rotation = Some(start.elapsed() - at);
            replicas.wait_exit(0, exit_within).await?;
        }
        Fault::Sigkill => {
            victim_in_flight = replicas::host_stat(envoy, replicas.replica(0), "rq_active")
                .await
                .and_then(|v| v.parse().ok());
            replicas.signal(0, "KILL")?;
            replicas.wait_exit(0, exit_within).await?;
        }
        Fault::RollingRestart => {
            for i in 0..replicas.len() {
                replicas.signal(i, "TERM")?;
                replicas.wait_exit(i, exit_within).await?;
                replicas.restart(i).await?;
                replicas::wait_health(envoy, replicas.replica(i), true).await?;
            }
        }
        Fault::ApiServerGone => {
            let kube = kube.ok_or_else(|| BenchError::Setup("no API server".into()))?;
            out_of_rotation = kube.gone(replicas, envoy, opts.apiserver_down).await?;
        }
    }
    Ok(Injected {
        at,
        done: start.elapsed(),
        victim_in_flight,
        victim_streams,
        out_of_rotation,
        panic_routed: replicas::cluster_counter(envoy, "lb_healthy_panic").await,
    })
}

/// Every request of the round, one JSON object a line, for a closer look.
fn write_records(path: &Path, records: &[crate::run::RequestRecord]) -> Result<(), BenchError> {
    let mut text = String::new();
    for r in records {
        text.push_str(&serde_json::to_string(r).unwrap_or_default());
        text.push('\n');
    }
    std::fs::write(path, text).map_err(BenchError::io(format!("writing {}", path.display())))
}
