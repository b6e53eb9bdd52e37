//! The benchmark harness behind `hack/bench.sh`: the same seeded workload through every router
//! users would otherwise pick, on the same simulated cluster, and the overhead of epp in
//! Envoy's path.
//!
//! - [`cluster`] starts the simulated pods (one `inference-sim` process, fresh per router);
//! - [`routers`] starts each router as its own process(es): Envoy round robin / least request,
//!   Envoy + epp, Envoy + the do-nothing ext_proc server, vllm-router, sglang-router;
//! - [`compare`] runs `loadgen` through each router and collects its summary and the routers'
//!   CPU per request;
//! - [`overhead`] measures Envoy alone, Envoy + noop ext_proc and Envoy + epp on cheap inference-sim
//!   backends (small chat request and a 220 KB prompt);
//! - [`crosscheck`] runs inference-perf and `loadgen` on the same workload and router;
//! - [`regions`] is a multi-region test bed (regions behind delaying proxies, a hub in front)
//!   and its scenarios, for `region-bench`;
//! - [`plan`] holds the quick, full and smoke plans; [`report`] writes the tables, the target
//!   ratios and the plots.
//!
//! Every process is stopped by its own PID when its handle is dropped.

pub mod cluster;
pub mod compare;
pub mod compat;
pub mod cost;
pub mod crosscheck;
pub mod failover;
pub mod overhead;
pub mod plan;
pub mod procs;
pub mod regions;
pub mod report;
pub mod routers;
pub mod trace_replay;
pub mod ttft;
pub mod upstream;

use std::time::Duration;

/// Why a benchmark step failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{name} exited:\n{log}")]
    Exited { name: String, log: String },
    #[error("{what} not ready:\n{log}")]
    NotReady { what: String, log: String },
    #[error(transparent)]
    Envoy(#[from] harness::envoy::EnvoyError),
    #[error("{0}")]
    Setup(String),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
}

impl BenchError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| Self::Io { what, source }
    }
}
