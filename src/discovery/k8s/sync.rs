//! Whether Kubernetes discovery can be trusted, for readiness: epp is ready once the pool and its
//! pods have been listed (upstream's `PoolHasSynced`), and stops being ready when the API server
//! has been unreachable for longer than a grace period, until it answers again.
//!
//! Two inputs feed one output ([`Synced`], a `watch` of `bool`):
//! - `run_endpoints` reports whether its first list is complete and the pool exists
//!   ([`SyncInputs::set_listed`]); a deleted pool makes epp unready again, as upstream;
//! - every failed watch step notifies [`SyncInputs::watch_failed`]. A watch that resumes after
//!   an outage emits nothing, so the errors alone cannot say when the server is back: on a
//!   failure the tracker probes `/version` (readable by every identity through
//!   `system:public-info-viewer`) every [`PROBE_EVERY`] until it answers. The server counts as
//!   unreachable only when no probe succeeded for `grace` since the first failure; a refusal
//!   (403) or a missing CRD is an answer, so it does not make epp unready by itself (an
//!   unlistable pool or pod collection does, through the first input).

use kube::Client;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How often an unreachable API server is probed.
pub(crate) const PROBE_EVERY: Duration = Duration::from_millis(500);

/// How long one probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Readiness as discovery sees it: true while the pool is listed and the API server answers.
pub(crate) type Synced = watch::Receiver<bool>;

/// The writers' side, shared by the watch tasks.
#[derive(Clone)]
pub(crate) struct SyncInputs {
    listed: Arc<watch::Sender<bool>>,
    failed: Arc<Notify>,
}

impl SyncInputs {
    /// Whether the pool and pods have been listed (and the pool exists).
    pub(crate) fn set_listed(&self, listed: bool) {
        self.listed
            .send_if_modified(|l| std::mem::replace(l, listed) != listed);
    }

    /// A watch step failed; the tracker checks whether the server still answers.
    pub(crate) fn watch_failed(&self) {
        self.failed.notify_one();
    }
}

/// The tracker: owns the output and decides reachability.
pub(crate) struct SyncTracker {
    client: Client,
    grace: Duration,
    listed: watch::Receiver<bool>,
    failed: Arc<Notify>,
    out: watch::Sender<bool>,
}

/// Creates the inputs, the tracker (to run) and its output.
pub(crate) fn tracker(client: Client, grace: Duration) -> (SyncInputs, SyncTracker, Synced) {
    let (listed_tx, listed) = watch::channel(false);
    let failed = Arc::new(Notify::new());
    let (out, synced) = watch::channel(false);
    let inputs = SyncInputs {
        listed: Arc::new(listed_tx),
        failed: Arc::clone(&failed),
    };
    let tracker = SyncTracker {
        client,
        grace,
        listed,
        failed,
        out,
    };
    (inputs, tracker, synced)
}

impl SyncTracker {
    /// Publishes readiness until `shutdown`.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let mut reachable = true;
        // Since when the server has not answered, and when to probe it next (while failing).
        let mut failing: Option<(Instant, Instant)> = None;
        loop {
            self.publish(reachable);
            let next_probe = failing.map(|(_, next)| next);
            tokio::select! {
                _ = shutdown.cancelled() => return,
                changed = self.listed.changed() => if changed.is_err() { return },
                _ = self.failed.notified() => {
                    failing.get_or_insert_with(|| (Instant::now(), Instant::now()));
                }
                _ = sleep_until(next_probe) => {
                    let since = failing.map_or_else(Instant::now, |(since, _)| since);
                    if self.answers().await {
                        if !reachable {
                            tracing::info!("Kubernetes API server reachable again: readiness follows discovery");
                        }
                        (reachable, failing) = (true, None);
                        continue;
                    }
                    if reachable && since.elapsed() >= self.grace {
                        tracing::warn!(grace = ?self.grace, "Kubernetes API server unreachable beyond the grace period: readiness NOT_SERVING (routing continues from the last known state)");
                        reachable = false;
                    }
                    failing = Some((since, Instant::now() + PROBE_EVERY));
                }
            }
        }
    }

    fn publish(&self, reachable: bool) {
        let ready = *self.listed.borrow() && reachable;
        self.out
            .send_if_modified(|r| std::mem::replace(r, ready) != ready);
    }

    /// Whether the API server answers `/version` now (any answer from the server counts).
    async fn answers(&self) -> bool {
        let probe = tokio::time::timeout(PROBE_TIMEOUT, self.client.apiserver_version()).await;
        matches!(probe, Ok(Ok(_)))
    }
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client of a server that is not there (nothing listens on the port).
    fn unreachable() -> Client {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let url = format!("http://127.0.0.1:{port}").parse().unwrap();
        Client::try_from(kube::Config::new(url)).unwrap()
    }

    async fn wait_for(synced: &mut Synced, want: bool) {
        tokio::time::timeout(Duration::from_secs(5), synced.wait_for(|r| *r == want))
            .await
            .expect("readiness did not change")
            .unwrap();
    }

    #[tokio::test]
    async fn ready_once_listed_and_unready_when_the_server_stays_unreachable_beyond_the_grace() {
        let (inputs, tracker, mut synced) = tracker(unreachable(), Duration::from_millis(300));
        let shutdown = CancellationToken::new();
        let tasks = tokio_util::task::TaskTracker::new();
        tasks.spawn(tracker.run(shutdown.clone()));
        assert!(!*synced.borrow(), "not ready before the first list");
        inputs.set_listed(true);
        wait_for(&mut synced, true).await;
        let failed = Instant::now();
        inputs.watch_failed();
        wait_for(&mut synced, false).await;
        assert!(
            failed.elapsed() >= Duration::from_millis(300),
            "not before the grace"
        );
        shutdown.cancel();
        tasks.close();
        tasks.wait().await;
    }
}
