//! Static discovery: endpoints from `--static-endpoints` and `--static-endpoints-file`, or from
//! the file of llm-d-router's `file-discovery` plugin ([`file`]), or a hub's clusters from the
//! file of its `multicluster-file-discovery` ([`multicluster`]).
//!
//! epp's file is a YAML list of endpoints (`address`, `port`, optional `name`, `engineType`,
//! `labels`, `weight`, `rank`: the data-parallel rank of a pod's port, as its position in an
//! InferencePool's `targetPorts` would be), re-read when it changes. An invalid file keeps the last good set and is
//! logged. Kubernetes discovery writes into the same datastore.

pub mod file;
pub mod k8s;
pub(crate) mod multicluster;

use crate::datastore::Datastore;
use crate::endpoint::{Endpoint, EndpointId, EngineType};
use crate::watch::FileWatch;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("invalid endpoint {value:?} in --static-endpoints: expected ip:port")]
    Flag { value: String },
    #[error("endpoints file: {0}")]
    File(#[from] serde_norway::Error),
    #[error("endpoints file entry {index}: weight must be >= 1")]
    Weight { index: usize },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FileEntry {
    address: IpAddr,
    port: u16,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    engine_type: EngineType,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default = "one")]
    weight: u32,
    #[serde(default)]
    rank: u16,
}

fn one() -> u32 {
    1
}

/// Parses `ip:port,ip:port`.
pub(crate) fn parse_flag(value: &str) -> Result<Vec<Endpoint>, DiscoveryError> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<EndpointId>()
                .map(Endpoint::from_id)
                .map_err(|_| DiscoveryError::Flag {
                    value: s.to_owned(),
                })
        })
        .collect()
}

/// Parses the endpoints file.
pub fn parse_file(text: &str) -> Result<Vec<Endpoint>, DiscoveryError> {
    let entries: Vec<FileEntry> = serde_norway::from_str(text)?;
    entries
        .into_iter()
        .enumerate()
        .map(|(index, e)| {
            if e.weight == 0 {
                return Err(DiscoveryError::Weight { index });
            }
            let id = EndpointId(SocketAddr::new(e.address, e.port));
            Ok(Endpoint {
                id,
                name: e.name.unwrap_or_else(|| id.to_string()),
                engine: e.engine_type,
                labels: e.labels,
                weight: e.weight,
                rank: e.rank,
                metrics_host: None,
            })
        })
        .collect()
}

/// Why an endpoints file gave no endpoints (the last good set stays).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    #[error(transparent)]
    Epp(#[from] DiscoveryError),
    #[error(transparent)]
    LlmD(#[from] file::FileError),
    #[error("reading the clusters file stopped: {0}")]
    Stopped(#[from] tokio::task::JoinError),
}

/// The format of an endpoints file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FileFormat {
    /// `--static-endpoints-file`: epp's list ([`parse_file`]).
    Epp,
    /// llm-d-router's `file-discovery` ([`file::parse`]).
    LlmD,
    /// llm-d-router's `multicluster-file-discovery` ([`multicluster::parse`]): host names are
    /// resolved, so reading it may block on the resolver.
    Clusters,
}

/// An endpoints file, its format, and whether it is followed after start-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EndpointsFile {
    pub(crate) path: PathBuf,
    pub(crate) format: FileFormat,
    pub(crate) watch: bool,
}

impl FileFormat {
    /// The endpoints of `text`; an llm-d file's skipped entries are logged (every time the
    /// file is read, so an edit that breaks one entry shows).
    pub(crate) fn parse(self, text: &str) -> Result<Vec<Endpoint>, ReadError> {
        match self {
            Self::Epp => Ok(parse_file(text)?),
            Self::LlmD | Self::Clusters => {
                let parsed = match self {
                    Self::Clusters => multicluster::parse(text, &multicluster::system_resolver),
                    _ => file::parse(text),
                }?;
                for why in &parsed.skipped {
                    tracing::warn!(entry = %why, "endpoints file entry skipped");
                }
                Ok(parsed.endpoints)
            }
        }
    }
}

/// Publishes the flag endpoints, then follows the file (if any, and if followed) until
/// `shutdown`.
pub(crate) async fn run(
    datastore: Arc<Datastore>,
    fixed: Vec<Endpoint>,
    file: Option<EndpointsFile>,
    poll: Duration,
    shutdown: CancellationToken,
) {
    let Some(file) = file else {
        datastore.set_endpoints(fixed);
        return;
    };
    if !file.watch {
        return;
    }
    let format = file.format;
    let mut watch = FileWatch::new(file.path);
    let mut tick = tokio::time::interval(poll);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        match watch.changed() {
            Ok(None) => {}
            Ok(Some(text)) => match parse_off_thread(format, text).await {
                Ok(eps) => {
                    tracing::info!(count = eps.len(), path = %watch.path().display(), "endpoints file loaded");
                    datastore.set_endpoints(fixed.iter().cloned().chain(eps).collect());
                }
                Err(e) => {
                    tracing::error!(error = %e, "endpoints file invalid; keeping the last good endpoints")
                }
            },
            Err(e) => {
                tracing::error!(error = %e, path = %watch.path().display(), "endpoints file unreadable; keeping the last good endpoints")
            }
        }
    }
}

/// [`FileFormat::parse`] on a blocking thread: a clusters file's host names are resolved by
/// the system's resolver, which may wait on the network.
async fn parse_off_thread(format: FileFormat, text: String) -> Result<Vec<Endpoint>, ReadError> {
    match format {
        FileFormat::Clusters => tokio::task::spawn_blocking(move || format.parse(&text)).await?,
        _ => format.parse(&text),
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // the test's own discovery task
mod tests {
    use super::*;

    #[test]
    fn parses_flag_and_file() {
        let eps = parse_flag("127.0.0.1:8001, [::1]:8002,").unwrap();
        assert_eq!(eps.len(), 2);
        assert!(parse_flag("localhost:80")
            .unwrap_err()
            .to_string()
            .contains("localhost:80"));
        let file = "- {address: 10.0.0.1, port: 8000, engineType: sglang, weight: 3, labels: {gpu: h100}}\n- {address: 10.0.0.2, port: 8001, name: pod-b-rank-1, rank: 1}\n";
        let eps = parse_file(file).unwrap();
        assert_eq!(eps[0].engine, EngineType::Sglang);
        assert_eq!(eps[0].weight, 3);
        assert_eq!(eps[0].rank, 0, "rank defaults to 0");
        assert_eq!(eps[1].name, "pod-b-rank-1");
        assert_eq!(eps[1].rank, 1);
        assert!(parse_file("- {address: 10.0.0.1, port: 8000, colour: red}")
            .unwrap_err()
            .to_string()
            .contains("colour"));
        assert!(parse_file("- {address: 10.0.0.1, port: 8000, weight: 0}").is_err());
    }

    /// A followed clusters file is re-read when it changes, its host names resolved off the
    /// runtime's threads (`localhost` here, which every resolver answers).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_clusters_file_is_followed_and_its_host_names_resolved() {
        let dir = std::env::temp_dir().join(format!("epp-clusters-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("clusters.yaml");
        let one = "endpoints:\n- {name: a, address: 127.0.0.1, port: '9001'}\n";
        std::fs::write(&path, one).unwrap();
        let datastore = Arc::new(Datastore::new());
        let file = EndpointsFile {
            path: path.clone(),
            format: FileFormat::Clusters,
            watch: true,
        };
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run(
            Arc::clone(&datastore),
            Vec::new(),
            Some(file),
            Duration::from_millis(10),
            shutdown.clone(),
        ));
        let ids = || -> Vec<String> {
            let snap = datastore.snapshot();
            let mut v: Vec<String> = snap.iter().map(|s| s.id().to_string()).collect();
            v.sort();
            v
        };
        let wait_for = |want: Vec<&str>| {
            let want: Vec<String> = want.into_iter().map(str::to_owned).collect();
            async move {
                let deadline = std::time::Instant::now() + Duration::from_secs(5);
                while ids() != want {
                    assert!(std::time::Instant::now() < deadline, "{:?}", ids());
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        };
        wait_for(vec!["127.0.0.1:9001"]).await;
        let two = format!("{one}- {{name: b, address: localhost, port: '9002'}}\n");
        std::fs::write(&path, two).unwrap();
        wait_for(vec!["127.0.0.1:9001", "127.0.0.1:9002"]).await;
        let host = datastore.snapshot().iter().find_map(|s| {
            s.endpoint
                .metrics_host
                .clone()
                .filter(|h| h.starts_with("localhost"))
        });
        assert_eq!(
            host.as_deref(),
            Some("localhost:9002"),
            "the name kept for metrics"
        );
        shutdown.cancel();
        task.await.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
