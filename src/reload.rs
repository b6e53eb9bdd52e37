//! Config reload: `--config-file` is re-read when it changes. A valid file replaces the running
//! configuration (requests in flight finish with the old one); an invalid file keeps the last
//! good configuration, is logged with every problem, and counts in `epp_config_reloads`.

use crate::director::{LiveConfig, Runtime};
use crate::metrics::{Metrics, Outcome, OutcomeLabels};
use crate::watch::FileWatch;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Watches `path` until `shutdown`. The first read is skipped: start-up already loaded it.
pub(crate) async fn run(
    config: Arc<LiveConfig>,
    metrics: Arc<Metrics>,
    path: PathBuf,
    poll: Duration,
    shutdown: CancellationToken,
) {
    let mut watch = FileWatch::new(path);
    let _ = watch.changed();
    let mut tick = tokio::time::interval(poll);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let outcome = match watch.changed() {
            Ok(None) => continue,
            Ok(Some(text)) => apply(&config, &text),
            Err(e) => {
                tracing::error!(error = %e, path = %watch.path().display(), "config file unreadable; keeping the last good configuration");
                Outcome::failure
            }
        };
        metrics
            .config_reloads
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }
}

fn apply(config: &LiveConfig, text: &str) -> Outcome {
    let current = config.load_full();
    match Runtime::configure(text, Some(&current), current.load) {
        Ok(configured) => {
            let restart_needed = config.reload(configured);
            tracing::info!("configuration reloaded");
            if !restart_needed.is_empty() {
                tracing::warn!(settings = ?restart_needed, "the reloaded configuration changes start-up-only settings; they keep their start-up values until epp restarts");
            }
            Outcome::success
        }
        Err(e) => {
            tracing::error!(error = %e, "new configuration rejected; keeping the last good configuration");
            Outcome::failure
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::UPSTREAM_DEFAULT_CONFIG;

    /// Upstream's default with the metrics scraped from another port: a start-up-only setting
    /// (the pollers are started once).
    fn other_metrics_port() -> String {
        let source = "- type: metrics-data-source\n  parameters: {port: 9400}\n";
        UPSTREAM_DEFAULT_CONFIG.replacen("plugins:\n", &format!("plugins:\n{source}"), 1)
    }

    fn snapshot_restart_needed(graph: &crate::fixtures::Graph) -> serde_json::Value {
        let state = crate::admin::AdminState {
            registry: Default::default(),
            datastore: Arc::clone(&graph.datastore),
            config: Arc::clone(&graph.shared.config),
            indexes: Arc::clone(&graph.shared.indexes),
            pool_name: "pool".to_owned(),
            config_origin: "--config-file".to_owned(),
            staleness: Duration::from_secs(2),
            auth: None,
        };
        let snapshot = crate::admin::debug_snapshot(&state, std::time::Instant::now());
        snapshot["config"]["restart_needed"].clone()
    }

    #[test]
    fn a_reload_that_changes_a_start_up_only_setting_says_so_until_it_is_undone() {
        let graph = crate::fixtures::graph(UPSTREAM_DEFAULT_CONFIG).build();
        let config = &graph.shared.config;
        assert_eq!(snapshot_restart_needed(&graph), serde_json::json!([]));

        assert_eq!(apply(config, &other_metrics_port()), Outcome::success);
        assert_eq!(
            *config.restart_needed(),
            ["dataLayer metrics source (metrics-data-source, core-metrics-extractor)"]
        );
        assert_eq!(
            snapshot_restart_needed(&graph),
            serde_json::json!([
                "dataLayer metrics source (metrics-data-source, core-metrics-extractor)"
            ])
        );
        assert_eq!(
            config.startup().metrics_settings.port,
            None,
            "the pollers keep what they started with"
        );
        assert!(
            config.load().source.contains("port: 9400"),
            "the rest applies"
        );

        let weights = UPSTREAM_DEFAULT_CONFIG.replace("weight: 3", "weight: 4");
        assert_eq!(apply(config, &weights), Outcome::success);
        assert!(config.restart_needed().is_empty());
        assert_eq!(snapshot_restart_needed(&graph), serde_json::json!([]));
    }
}
