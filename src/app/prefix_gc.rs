//! Prefix-index garbage collection: the entries of endpoints that left the pool are forgotten,
//! so a departed pod neither attracts prompts nor holds memory.
//!
//! It runs when the endpoint set changes (the datastore's change signal) and every `every` as
//! well: a removed endpoint's KV-event subscriber may apply one last batch after the change,
//! and the periodic pass forgets that too.

use crate::datastore::Datastore;
use crate::endpoint::EndpointId;
use crate::prefix::source::Indexes;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Prunes `indexes` to the endpoints of `datastore` until `shutdown`.
pub(super) async fn run(
    datastore: Arc<Datastore>,
    indexes: Arc<Indexes>,
    every: Duration,
    shutdown: CancellationToken,
) {
    let mut changes = datastore.subscribe();
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = changes.changed() => if changed.is_err() { return },
            _ = tick.tick() => {}
        }
        prune(&datastore, &indexes);
    }
}

fn prune(datastore: &Datastore, indexes: &Indexes) {
    let live: HashSet<EndpointId> = datastore.snapshot().iter().map(|s| s.id()).collect();
    indexes.retain(&live);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::Endpoint;

    fn ep(n: u16) -> EndpointId {
        format!("127.0.0.1:{n}").parse().unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_departed_endpoint_is_forgotten_when_the_pool_changes() {
        let datastore = Arc::new(Datastore::new());
        datastore.set_endpoints(vec![Endpoint::from_id(ep(1)), Endpoint::from_id(ep(2))]);
        let indexes = Arc::new(Indexes::default());
        indexes.approximate.record(ep(1), &[1, 2], 10);
        indexes.approximate.record(ep(2), &[1, 2], 10);
        let shutdown = CancellationToken::new();
        // An hour between periodic passes: only the change signal can prune in this test.
        let tracker = tokio_util::task::TaskTracker::new();
        tracker.spawn(run(
            Arc::clone(&datastore),
            Arc::clone(&indexes),
            Duration::from_secs(3600),
            shutdown.clone(),
        ));
        datastore.set_endpoints(vec![Endpoint::from_id(ep(2))]);
        for _ in 0..100 {
            if indexes.approximate.size() == 2 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(
            indexes.approximate.longest_prefix(&[1, 2]),
            vec![(ep(2), 2)]
        );
        shutdown.cancel();
        tracker.close();
        tracker.wait().await;
    }
}
