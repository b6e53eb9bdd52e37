//! Ownership of in-process servers started by tests: each server runs as tasks on a
//! [`TaskTracker`] owned by its [`ServerHandle`], and stops when the handle's cancellation token
//! fires (on [`ServerHandle::shutdown`] or on drop).

use std::future::Future;
use std::net::SocketAddr;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Owns the tasks of one running server; dropping it asks them to stop.
#[derive(Debug)]
pub struct ServerHandle {
    addr: SocketAddr,
    cancel: CancellationToken,
    tracker: TaskTracker,
}

impl ServerHandle {
    /// Runs `serve` on a new tracker. `serve` receives the tracker (to spawn per-connection
    /// tasks that shutdown waits for) and the token that signals shutdown.
    pub fn spawn<F, Fut>(addr: SocketAddr, serve: F) -> Self
    where
        F: FnOnce(TaskTracker, CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let cancel = CancellationToken::new();
        let tracker = TaskTracker::new();
        tracker.spawn(serve(tracker.clone(), cancel.clone()));
        Self {
            addr,
            cancel,
            tracker,
        }
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A token that is cancelled when the server is asked to stop.
    pub fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Stops the server and waits until all its tasks have ended.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
        self.tracker.close();
    }
}
