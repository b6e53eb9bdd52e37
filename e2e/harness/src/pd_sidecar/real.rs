//! llm-d's own decode sidecar (`pd-sidecar` from `github.com/llm-d/llm-d-router`), run as a
//! child process in front of a decode pod when `EPP_PD_SIDECAR` names its binary.
//!
//! # How it is started
//! With the flags llm-d's P/D deployment gives it (`deploy/components/vllm-decode` and
//! `deploy/environments/dev/p-d/patch-decode.yaml`, v0.10.0): `--port`, `--kv-connector=nixlv2`
//! (the guide's default connector), `--secure-proxy=false`, `--data-parallel-size` (1 unless the
//! test runs data-parallel ranks: then rank `r` is served on the sidecar's port + `r` and decoded
//! on the model server's port + `r`, so both ranges are drawn consecutive), plus
//! `--model-server-port` (the sidecar reaches the model server on `localhost`, as in a pod),
//! the retry flags of [`SidecarConfig`] and `--zap-log-level=4`, the verbosity at which the
//! sidecar logs which protocol each request took. `POD_IP` is set as the pod's downward API
//! sets it.
//!
//! # What it did
//! The sidecar has no counters of its own (its `--metrics-port` serves only MoRI-IO DNS
//! counters), so [`RealSidecar::counts`] reads its JSON log: one `running NIXL protocol V2`
//! line per request with `x-prefiller-host-port`, `no prefiller or encoder, using decoder only`
//! per request without, `retrying prefill request` per retry and `prefill request failed` per
//! prefill that finally failed. zap writes each line before the sidecar answers, so a count read
//! after a response includes that response's request. Each rank's server logs under the name
//! `proxy server on port <its port>`, so [`RealSidecar::rank_counts`] tells the ranks apart.
//!
//! The process is killed by its PID when the handle is dropped or shut down.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{SidecarConfig, SidecarCounts};
use crate::{client, ports};

/// The environment variable naming the real sidecar's binary.
pub const SIDECAR_ENV: &str = "EPP_PD_SIDECAR";
/// How long the sidecar may take to answer `GET /health` after it is spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// Start attempts when the chosen port was taken before the sidecar bound it.
const START_ATTEMPTS: u32 = 3;
const POLL_INTERVAL: Duration = Duration::from_millis(25);

/// Log messages the counts are read from (`pkg/sidecar/proxy`, v0.10.0).
const MSG_DISAGG: &str = r#""msg":"running NIXL protocol V2""#;
const MSG_DECODE_ONLY: &str = r#""msg":"no prefiller or encoder, using decoder only""#;
const MSG_RETRY: &str = r#""msg":"retrying prefill request""#;
const MSG_FAILED: &str = r#""msg":"prefill request failed""#;

#[derive(Debug, thiserror::Error)]
pub enum RealSidecarError {
    #[error("{SIDECAR_ENV}={0}: no such file (build llm-d-router's cmd/pd-sidecar, or unset it to use the stand-in)")]
    Missing(PathBuf),
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("pd-sidecar did not become ready: {reason}\n--- its log ---\n{log}")]
    NotReady { reason: String, log: String },
}

/// The real sidecar's binary named by `EPP_PD_SIDECAR`, if set (an empty value is unset).
pub fn binary_from_env() -> Result<Option<PathBuf>, RealSidecarError> {
    match std::env::var_os(SIDECAR_ENV).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => {
            let path = PathBuf::from(v);
            if path.is_file() {
                Ok(Some(path))
            } else {
                Err(RealSidecarError::Missing(path))
            }
        }
    }
}

/// A running `pd-sidecar` process.
#[derive(Debug)]
pub struct RealSidecar {
    child: Child,
    /// Rank 0's address; rank `r` listens on its port + `r`.
    addr: SocketAddr,
    ranks: u16,
    log: PathBuf,
}

impl RealSidecar {
    /// Starts `binary` in front of `cfg.decoder` (which must be on loopback), logging to
    /// `<dir>/pd-sidecar-<port>.log`, and waits until it answers `GET /health`.
    pub async fn start(
        binary: &Path,
        cfg: &SidecarConfig,
        dir: &Path,
    ) -> Result<Self, RealSidecarError> {
        let mut attempt = 1;
        loop {
            let ranks = usize::from(cfg.data_parallel_size.max(1));
            let port = ports::free_range(ranks).map_err(io("choosing the sidecar's ports"))?;
            let mut sidecar = Self::spawn(binary, cfg, dir, port)?;
            match sidecar.wait_ready().await {
                Ok(()) => return Ok(sidecar),
                Err(e) if attempt < START_ATTEMPTS && sidecar.log_text().contains("bind") => {
                    tracing::warn!(%e, "pd-sidecar could not bind its port; retrying");
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn spawn(
        binary: &Path,
        cfg: &SidecarConfig,
        dir: &Path,
        port: u16,
    ) -> Result<Self, RealSidecarError> {
        let log = dir.join(format!("pd-sidecar-{port}.log"));
        let file =
            std::fs::File::create(&log).map_err(io(format!("creating {}", log.display())))?;
        let err_file = file
            .try_clone()
            .map_err(io("duplicating the log file handle"))?;
        let child = Command::new(binary)
            .args(args(cfg, port))
            .env("POD_IP", "127.0.0.1")
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err_file)
            .spawn()
            .map_err(io(format!("starting {}", binary.display())))?;
        Ok(Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            ranks: cfg.data_parallel_size.max(1),
            log,
        })
    }

    /// Waits until every rank's port answers `GET /health`.
    async fn wait_ready(&mut self) -> Result<(), RealSidecarError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(self.not_ready(format!("it exited during start-up ({status})")));
            }
            let mut ready = true;
            for addr in self.addrs() {
                let health = client::get(addr, "/health").await;
                ready &= matches!(health, Ok(r) if r.status == http::StatusCode::OK);
            }
            if ready {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(self.not_ready(format!("no 200 from /health after {READY_TIMEOUT:?}")));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    fn not_ready(&self, reason: String) -> RealSidecarError {
        RealSidecarError::NotReady {
            reason,
            log: self.log_text(),
        }
    }

    /// The address epp routes to (the pod's serving port, the sidecar's).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every rank's address: the sidecar's port + rank.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        (0..self.ranks)
            .map(|r| SocketAddr::new(self.addr.ip(), self.addr.port() + r))
            .collect()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The sidecar's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// What the sidecar did so far, read from its log (see the module docs).
    pub fn counts(&self) -> SidecarCounts {
        counts_from_log(&self.log_text())
    }

    /// What rank `r`'s server did so far (its log lines only).
    pub fn rank_counts(&self, r: u16) -> SidecarCounts {
        let logger = format!(
            r#""logger":"proxy server on port {}""#,
            self.addr.port() + r
        );
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().filter(|l| l.contains(&logger)).collect();
        counts_from_log(&lines.join("\n"))
    }
}

impl Drop for RealSidecar {
    fn drop(&mut self) {
        // Signals this child's PID only, then reaps it.
        if let Err(err) = self.child.kill() {
            tracing::debug!(%err, pid = self.child.id(), "pd-sidecar already gone");
        }
        let _ = self.child.wait();
    }
}

/// The command line llm-d's P/D deployment gives the sidecar, for this test's ports.
fn args(cfg: &SidecarConfig, port: u16) -> Vec<String> {
    vec![
        format!("--port={port}"),
        format!("--model-server-port={}", cfg.decoder.port()),
        "--kv-connector=nixlv2".into(),
        "--secure-proxy=false".into(),
        format!("--data-parallel-size={}", cfg.data_parallel_size.max(1)),
        format!("--prefill-max-retries={}", cfg.prefill_max_retries),
        format!(
            "--prefill-retry-backoff={}ms",
            cfg.prefill_retry_backoff.as_millis().max(1)
        ),
        "--zap-log-level=4".into(),
    ]
}

fn counts_from_log(log: &str) -> SidecarCounts {
    let count = |msg: &str| log.lines().filter(|l| l.contains(msg)).count() as u64;
    let failures = count(MSG_FAILED);
    SidecarCounts {
        disaggregated: count(MSG_DISAGG).saturating_sub(failures),
        decode_only: count(MSG_DECODE_ONLY),
        prefill_retries: count(MSG_RETRY),
        prefill_failures: failures,
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RealSidecarError {
    let what = what.into();
    move |source| RealSidecarError::Io { what, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_read_from_the_sidecars_json_log() {
        let log = [
            r#"{"level":"info","ts":1.0,"msg":"Proxy starting"}"#,
            r#"{"level":"debug","ts":1.1,"logger":"proxy server on port 8000","msg":"running NIXL protocol V2","url":"10.0.0.1:8000"}"#,
            r#"{"level":"debug","ts":1.2,"msg":"no prefiller or encoder, using decoder only"}"#,
            r#"{"level":"debug","ts":1.3,"msg":"running NIXL protocol V2","url":"10.0.0.1:8000"}"#,
            r#"{"level":"info","ts":1.4,"msg":"retrying prefill request","attempt":1}"#,
            r#"{"level":"info","ts":1.5,"msg":"retrying prefill request","attempt":2}"#,
            r#"{"level":"error","ts":1.6,"msg":"prefill request failed","request_id":"x"}"#,
        ]
        .join("\n");
        assert_eq!(
            counts_from_log(&log),
            SidecarCounts {
                disaggregated: 1,
                decode_only: 1,
                prefill_retries: 2,
                prefill_failures: 1,
            }
        );
    }

    #[test]
    fn the_command_line_is_llm_ds_deployment_with_this_tests_ports() {
        let cfg = SidecarConfig {
            prefill_max_retries: 2,
            prefill_retry_backoff: Duration::from_millis(50),
            ..SidecarConfig::new("127.0.0.1:24100".parse().unwrap())
        };
        let a = args(&cfg, 24200);
        for want in [
            "--port=24200",
            "--model-server-port=24100",
            "--kv-connector=nixlv2",
            "--secure-proxy=false",
            "--prefill-max-retries=2",
            "--prefill-retry-backoff=50ms",
            "--data-parallel-size=1",
        ] {
            assert!(a.iter().any(|x| x == want), "{want} in {a:?}");
        }
    }
}
