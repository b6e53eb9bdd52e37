//! Which sidecar runs in front of a decode pod: llm-d's `pd-sidecar` ([`super::real`]) when
//! `EPP_PD_SIDECAR` names it, else the stand-in ([`super::Sidecar`]), on as many consecutive
//! loopback ports as the pod has data-parallel ranks.

use std::net::SocketAddr;

use tokio::net::TcpListener;

use super::{real, Sidecar, SidecarConfig, SidecarCounts};

/// Listeners on consecutive loopback ports, one per rank (the real sidecar's port layout).
async fn rank_listeners(cfg: &SidecarConfig) -> anyhow::Result<Vec<TcpListener>> {
    let base = crate::ports::free_range(usize::from(cfg.data_parallel_size))?;
    let mut out = Vec::new();
    for r in 0..cfg.data_parallel_size {
        out.push(TcpListener::bind(("127.0.0.1", base + r)).await?);
    }
    Ok(out)
}

/// The sidecar in front of one decode pod: llm-d's own when `EPP_PD_SIDECAR` names it
/// ([`real`]), else the stand-in.
pub enum DecodeSidecar {
    StandIn(Sidecar),
    Real(real::RealSidecar),
}

impl DecodeSidecar {
    /// Starts the real sidecar from `binary` (logging into `dir`), or the stand-in.
    pub async fn start(
        binary: Option<&std::path::Path>,
        cfg: SidecarConfig,
        dir: &std::path::Path,
    ) -> anyhow::Result<Self> {
        Ok(match binary {
            Some(b) => Self::Real(real::RealSidecar::start(b, &cfg, dir).await?),
            None => Self::StandIn(Sidecar::start_ranks(rank_listeners(&cfg).await?, cfg)?),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        match self {
            Self::StandIn(s) => s.addr(),
            Self::Real(r) => r.addr(),
        }
    }

    /// Every rank's address (`--data-parallel-size` of them), rank order.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        match self {
            Self::StandIn(s) => s.addrs(),
            Self::Real(r) => r.addrs(),
        }
    }

    /// What it did so far.
    pub fn counts(&self) -> SidecarCounts {
        match self {
            Self::StandIn(s) => s.counts(),
            Self::Real(r) => r.counts(),
        }
    }

    /// What rank `r` did so far (its own server's work).
    pub fn rank_counts(&self, r: u16) -> SidecarCounts {
        match self {
            Self::StandIn(s) => s.rank_counts(r),
            Self::Real(real) => real.rank_counts(r),
        }
    }

    /// `"pd-sidecar"` or `"stand-in"`, for reports.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::StandIn(_) => "stand-in",
            Self::Real(_) => "pd-sidecar",
        }
    }

    pub async fn shutdown(self) {
        match self {
            Self::StandIn(s) => s.shutdown().await,
            Self::Real(r) => drop(r),
        }
    }
}
