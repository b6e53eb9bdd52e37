//! Many pods in one process, each with its own port, engine, cache, metrics
//! and faults, plus kill/restart of single pods.
//!
//! Why: routing is only interesting across a fleet, and a 2-core machine
//! cannot run 32 processes of anything. A killed pod closes its listener and
//! resets its connections (clients see a refused/reset connection, as with a
//! crashed pod); a restarted pod binds the same address again with an empty
//! KV cache, fresh metrics, its start-up delay, and its configured faults.
//!
//! Control from outside the process: [`serve_admin`] on a separate port
//! (`--admin-port`):
//!
//! | request | effect |
//! |---|---|
//! | `GET /admin/pods` | `[{"index", "name", "addr", "alive"}]` |
//! | `POST /admin/pods/{i}/kill` | stop pod `i` |
//! | `POST /admin/pods/{i}/restart` | (stop and) start pod `i` again |
//! | `GET /admin/pods/{i}/faults` | the pod's `Faults` as JSON |
//! | `POST /admin/pods/{i}/faults` | replace them (missing fields take defaults) |

use std::net::SocketAddr;
use std::sync::Arc;

use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::Mutex;

use super::config::PodConfig;
use super::faults::FaultSwitch;
use super::pod::{Pod, PodControl, PodError};

mod admin;

pub use admin::serve_admin;

#[derive(Debug, Error)]
pub enum ClusterError {
    #[error("no pod with index {0}")]
    NoSuchPod(usize),
    #[error("cannot bind {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("pod {index} failed to start")]
    Pod {
        index: usize,
        #[source]
        source: PodError,
    },
}

struct Slot {
    cfg: Arc<PodConfig>,
    addr: SocketAddr,
    faults: FaultSwitch,
    pod: Option<Pod>,
}

/// One pod's state as the admin endpoint reports it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PodStatus {
    pub index: usize,
    pub name: String,
    pub addr: SocketAddr,
    pub alive: bool,
}

/// A handle to the pods of this process (cheap to clone).
#[derive(Clone)]
pub struct Cluster {
    slots: Arc<Mutex<Vec<Slot>>>,
    addrs: Arc<Vec<SocketAddr>>,
}

impl Cluster {
    /// Binds `addrs[i]` (port 0 picks a free port) and starts pod `i` on it.
    pub async fn start(
        configs: Vec<PodConfig>,
        addrs: &[SocketAddr],
    ) -> Result<Self, ClusterError> {
        let mut listeners = Vec::with_capacity(configs.len());
        for &addr in addrs.iter().take(configs.len()) {
            listeners.push(
                TcpListener::bind(addr)
                    .await
                    .map_err(|source| ClusterError::Bind { addr, source })?,
            );
        }
        Self::start_on(configs, listeners).await
    }

    /// Starts pod `i` on `listeners[i]`.
    pub async fn start_on(
        configs: Vec<PodConfig>,
        listeners: Vec<TcpListener>,
    ) -> Result<Self, ClusterError> {
        let mut slots = Vec::with_capacity(configs.len());
        for (index, (cfg, listener)) in configs.into_iter().zip(listeners).enumerate() {
            let cfg = Arc::new(cfg);
            let faults = FaultSwitch::new(cfg.faults.clone());
            let pod = Pod::start(listener, cfg.clone(), faults.clone())
                .await
                .map_err(|source| ClusterError::Pod { index, source })?;
            slots.push(Slot {
                cfg,
                addr: pod.addr(),
                faults,
                pod: Some(pod),
            });
        }
        let addrs = Arc::new(slots.iter().map(|s| s.addr).collect());
        Ok(Self {
            slots: Arc::new(Mutex::new(slots)),
            addrs,
        })
    }

    /// The pods' serving addresses, by index.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Pod `i`'s faults (valid across restarts).
    pub async fn faults(&self, i: usize) -> Result<FaultSwitch, ClusterError> {
        let slots = self.slots.lock().await;
        slots
            .get(i)
            .map(|s| s.faults.clone())
            .ok_or(ClusterError::NoSuchPod(i))
    }

    /// Pod `i`'s control handle, while it is alive.
    pub async fn control(&self, i: usize) -> Result<Option<PodControl>, ClusterError> {
        let slots = self.slots.lock().await;
        let slot = slots.get(i).ok_or(ClusterError::NoSuchPod(i))?;
        Ok(slot.pod.as_ref().map(Pod::control))
    }

    pub async fn status(&self) -> Vec<PodStatus> {
        let slots = self.slots.lock().await;
        let status = |(index, s): (usize, &Slot)| PodStatus {
            index,
            name: s.cfg.pod_name.clone(),
            addr: s.addr,
            alive: s.pod.is_some(),
        };
        slots.iter().enumerate().map(status).collect()
    }

    /// Stops pod `i` (no-op if it is already down).
    pub async fn kill(&self, i: usize) -> Result<(), ClusterError> {
        let pod = {
            let mut slots = self.slots.lock().await;
            slots
                .get_mut(i)
                .ok_or(ClusterError::NoSuchPod(i))?
                .pod
                .take()
        };
        if let Some(pod) = pod {
            pod.stop().await;
        }
        Ok(())
    }

    /// Stops pod `i` if alive, then starts a fresh one on the same address.
    pub async fn restart(&self, i: usize) -> Result<(), ClusterError> {
        self.kill(i).await?;
        let mut slots = self.slots.lock().await;
        let slot = slots.get_mut(i).ok_or(ClusterError::NoSuchPod(i))?;
        let addr = slot.addr;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ClusterError::Bind { addr, source })?;
        slot.faults.set(slot.cfg.faults.clone());
        let pod = Pod::start(listener, slot.cfg.clone(), slot.faults.clone())
            .await
            .map_err(|source| ClusterError::Pod { index: i, source })?;
        slot.pod = Some(pod);
        Ok(())
    }

    /// Stops every pod.
    pub async fn shutdown(&self) {
        let pods: Vec<Pod> = {
            let mut slots = self.slots.lock().await;
            slots.iter_mut().filter_map(|s| s.pod.take()).collect()
        };
        for pod in pods {
            pod.stop().await;
        }
    }
}
