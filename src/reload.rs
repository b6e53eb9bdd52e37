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
pub async fn run(
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
    match Runtime::build(text, Some(&current)) {
        Ok(runtime) => {
            config.store(runtime);
            tracing::info!("configuration reloaded");
            Outcome::success
        }
        Err(e) => {
            tracing::error!(error = %e, "new configuration rejected; keeping the last good configuration");
            Outcome::failure
        }
    }
}
