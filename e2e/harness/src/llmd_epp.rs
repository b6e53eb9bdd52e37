//! llm-d-router v0.10's own EPP (`cmd/epp`) as a child process, for side-by-side tests of a
//! configuration: the same EndpointPickerConfig that epp runs, plus llm-d's `file-discovery`
//! plugin and metrics data layer so that it needs no Kubernetes (llm-d's `docs/discovery.md`,
//! as `e2e/loadgen`'s benchmark runs it). Its endpoints file carries each endpoint's labels
//! (`llm-d.ai/role`), as pod labels do in a cluster.
//!
//! The Go module proxy refuses `github.com/llm-d/llm-d-router`, so `hack/install-peers.sh
//! llm-d-epp` builds the binary from the v0.10.0 source archive and `EPP_LLMD_EPP` names it
//! (`hack/test.sh` does both). The process is killed by its PID when the handle is dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_norway::Value;

use crate::{client, ports};

/// The environment variable naming llm-d-router's EPP binary.
pub const LLMD_EPP_ENV: &str = "EPP_LLMD_EPP";
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// One endpoint of the file-discovery endpoints file.
pub struct FileEndpoint<'a> {
    pub name: &'a str,
    pub addr: SocketAddr,
    pub labels: &'a [(&'a str, &'a str)],
}

/// The binary `EPP_LLMD_EPP` names (an error naming the variable when it is unset or wrong).
pub fn binary_from_env() -> anyhow::Result<PathBuf> {
    let path = std::env::var_os(LLMD_EPP_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .with_context(|| format!("{LLMD_EPP_ENV} is not set: point it at llm-d-router v0.10's EPP binary (go build ./cmd/epp)"))?;
    anyhow::ensure!(
        path.is_file(),
        "{LLMD_EPP_ENV}={}: no such file",
        path.display()
    );
    Ok(path)
}

/// A running llm-d-router EPP.
#[derive(Debug)]
pub struct LlmdEpp {
    child: Child,
    /// The ext_proc gRPC address Envoy calls.
    pub grpc: SocketAddr,
    metrics: SocketAddr,
    log: PathBuf,
}

impl LlmdEpp {
    /// Starts `binary` with `config` (an EndpointPickerConfig) and `endpoints`, writing its
    /// files and log into `dir`; waits until its `/metrics` answers.
    pub async fn start(
        binary: &Path,
        config: &str,
        endpoints: &[FileEndpoint<'_>],
        dir: &Path,
    ) -> anyhow::Result<Self> {
        let config_path = write_config(config, endpoints, dir)?;
        Self::start_file(binary, &config_path, dir).await
    }

    /// Starts `binary` with the configuration file `config_path` as it is (one that names its
    /// own discovery, such as [`write_config`]'s), its log in `dir`; waits until its
    /// `/metrics` answers.
    pub async fn start_file(binary: &Path, config_path: &Path, dir: &Path) -> anyhow::Result<Self> {
        let [grpc, health, metrics] = [(); 3].map(|()| ports::free_port());
        let (grpc, health, metrics) = (grpc?, health?, metrics?);
        let log = dir.join("llm-d-epp.log");
        let out = std::fs::File::create(&log)?;
        let err = out.try_clone()?;
        let args = flags(grpc, health, metrics, config_path);
        let child = Command::new(binary)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut epp = Self {
            child,
            grpc: SocketAddr::from(([127, 0, 0, 1], grpc)),
            metrics: SocketAddr::from(([127, 0, 0, 1], metrics)),
            log,
        };
        epp.wait_ready().await?;
        Ok(epp)
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                anyhow::bail!("llm-d-epp exited ({status}):\n{}", self.log_text());
            }
            if self.metrics_text().await.is_ok() {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "llm-d-epp did not answer /metrics in {READY_TIMEOUT:?}:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Its Prometheus text.
    pub async fn metrics_text(&self) -> anyhow::Result<String> {
        let r = client::get(self.metrics, "/metrics").await?;
        anyhow::ensure!(r.status.is_success(), "/metrics answered {}", r.status);
        Ok(r.text())
    }

    /// Where it serves `/metrics` (plain http, no auth): a multi-cluster hub's spoke.
    pub fn metrics_addr(&self) -> SocketAddr {
        self.metrics
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for LlmdEpp {
    fn drop(&mut self) {
        if let Err(err) = self.child.kill() {
            tracing::debug!(%err, pid = self.child.id(), "llm-d-epp already gone");
        }
        let _ = self.child.wait();
    }
}

/// The flags llm-d's EPP runs with here: plaintext gRPC, no auth, no tracing, epp's scrape
/// interval, experimental plugins allowed (both ways the same configs load in epp).
fn flags(grpc: u16, health: u16, metrics: u16, config: &Path) -> Vec<String> {
    let mut v: Vec<String> = [
        "--secure-serving=false",
        "--metrics-endpoint-auth=false",
        "--tracing=false",
        "--enable-pprof=false",
        "--allow-experimental-plugins=true",
        "--zap-log-level=info",
        "--refresh-metrics-interval=50ms",
        "--pool-namespace=default",
        "--pool-name=pd",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    v.extend([
        format!("--grpc-port={grpc}"),
        format!("--grpc-health-port={health}"),
        format!("--metrics-port={metrics}"),
        format!("--config-file={}", config.display()),
    ]);
    v
}

/// Writes `endpoints` (`dir/llmd-endpoints.yaml`) and `config` with llm-d's file discovery of
/// them added (`dir/llmd-config.yaml`, returned): a file both llm-d's EPP and epp load as it is.
pub fn write_config(
    config: &str,
    endpoints: &[FileEndpoint<'_>],
    dir: &Path,
) -> anyhow::Result<PathBuf> {
    let endpoints_path = dir.join("llmd-endpoints.yaml");
    std::fs::write(&endpoints_path, endpoints_file(endpoints))?;
    let config_path = dir.join("llmd-config.yaml");
    std::fs::write(&config_path, with_file_discovery(config, &endpoints_path)?)?;
    Ok(config_path)
}

/// The `file-discovery` endpoints file.
fn endpoints_file(endpoints: &[FileEndpoint<'_>]) -> String {
    let mut s = String::from("endpoints:\n");
    for e in endpoints {
        s += &format!(
            "- name: {}\n  namespace: default\n  address: \"{}\"\n  port: \"{}\"\n",
            e.name,
            e.addr.ip(),
            e.addr.port()
        );
        if !e.labels.is_empty() {
            s += "  labels:\n";
            for (k, v) in e.labels {
                s += &format!("    {k}: {v}\n");
            }
        }
    }
    s
}

/// `config` with llm-d's file discovery and metrics data layer added (its plugins first); a
/// data-layer plugin the config has already (a `core-metrics-extractor` with `engineConfigs`,
/// named by its type) is kept instead of the default one.
fn with_file_discovery(config: &str, endpoints: &Path) -> anyhow::Result<String> {
    let mut doc: Value = serde_norway::from_str(config).context("parsing the config")?;
    let added: Value = serde_norway::from_str(&format!(
        "- {{name: endpoints, type: file-discovery, parameters: {{path: {:?}}}}}\n\
         - {{type: metrics-data-source}}\n- {{type: core-metrics-extractor}}\n",
        endpoints.display().to_string()
    ))?;
    let root = doc
        .as_mapping_mut()
        .context("the config is not a mapping")?;
    let plugins = root
        .get_mut("plugins")
        .and_then(Value::as_sequence_mut)
        .context("the config has no plugins list")?;
    let has = |t: &Value| plugins.iter().any(|p| p.get("type") == Some(t));
    let mut all: Vec<Value> = added.as_sequence().cloned().unwrap_or_default();
    all.retain(|p| p.get("type").is_none_or(|t| !has(t)));
    all.append(plugins);
    *plugins = all;
    let mut layer: Value = serde_norway::from_str(
        "sources: [{pluginRef: metrics-data-source, extractors: [{pluginRef: core-metrics-extractor}]}]\n\
         discovery: {pluginRef: endpoints}\n",
    )?;
    // Sources the config lists itself come after the metrics source.
    let own = root
        .get("dataLayer")
        .and_then(|l| l.get("sources"))
        .and_then(Value::as_sequence)
        .cloned()
        .unwrap_or_default();
    if let Some(sources) = layer.get_mut("sources").and_then(Value::as_sequence_mut) {
        sources.extend(own);
    }
    root.insert(Value::from("dataLayer"), layer);
    Ok(serde_norway::to_string(&doc)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_gets_file_discovery_and_the_metrics_layer() {
        let config = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n";
        let out = with_file_discovery(config, Path::new("/tmp/e.yaml")).unwrap();
        let v: Value = serde_norway::from_str(&out).unwrap();
        let types: Vec<&str> = v["plugins"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|p| p["type"].as_str().unwrap())
            .collect();
        assert_eq!(
            types,
            [
                "file-discovery",
                "metrics-data-source",
                "core-metrics-extractor",
                "queue-scorer"
            ]
        );
        assert_eq!(v["plugins"][0]["parameters"]["path"], "/tmp/e.yaml");
        // A source the config lists follows the metrics source.
        let with_source = format!(
            "{config}- {{name: m, type: models-data-source}}\ndataLayer: {{sources: [{{pluginRef: m}}]}}\n"
        );
        let out = with_file_discovery(&with_source, Path::new("/tmp/e.yaml")).unwrap();
        let v: Value = serde_norway::from_str(&out).unwrap();
        assert_eq!(
            v["dataLayer"]["sources"][0]["pluginRef"],
            "metrics-data-source"
        );
        assert_eq!(v["dataLayer"]["sources"][1]["pluginRef"], "m");
        assert_eq!(v["dataLayer"]["discovery"]["pluginRef"], "endpoints");
        // The config's own extractor (with engineConfigs) replaces the default one.
        let own = format!(
            "{config}- {{type: core-metrics-extractor, parameters: {{defaultEngine: sglang}}}}\n"
        );
        let out = with_file_discovery(&own, Path::new("/tmp/e.yaml")).unwrap();
        let v: Value = serde_norway::from_str(&out).unwrap();
        let extractors: Vec<&Value> = v["plugins"]
            .as_sequence()
            .unwrap()
            .iter()
            .filter(|p| p["type"] == "core-metrics-extractor")
            .collect();
        assert_eq!(extractors.len(), 1);
        assert_eq!(extractors[0]["parameters"]["defaultEngine"], "sglang");
        let file = endpoints_file(&[FileEndpoint {
            name: "d",
            addr: "127.0.0.1:9".parse().unwrap(),
            labels: &[("llm-d.ai/role", "decode")],
        }]);
        assert!(
            file.contains("port: \"9\"\n  labels:\n    llm-d.ai/role: decode\n"),
            "{file}"
        );
    }
}
