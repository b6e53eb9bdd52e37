//! A fake Kubernetes API server, kept for what a real one cannot be made to do. Everything a
//! real server can show (CRD schemas and CEL rules, RBAC, pods through `pods/status`, watches
//! across a restart and a compaction, Leases under optimistic concurrency) is tested against a
//! real kube-apiserver + etcd ([`crate::kube_apiserver`], e2e/tests/kube_*.rs). This fake stays
//! for e2e/tests/k8s.rs:
//! - objects a real server never admits (breaking the CRDs' CEL rules: stored before a rule
//!   existed, or written around validation), which epp's own gate must ignore and count;
//! - history that changes while the server is unreachable and is then compacted, so the resumed
//!   watch is answered `410 Gone` at a moment the test chooses;
//! - fast, dependency-free runs (no Go build) for the unit-level tests of the discovery code.
//!
//! What it speaks: namespaced collections under `/api/v1` and `/apis/{group}/{version}`, list
//! with a `resourceVersion`, watch streams (ADDED / MODIFIED / DELETED / BOOKMARK,
//! `timeoutSeconds`, label selectors), `410 Gone` for compacted versions (as an ERROR watch
//! event, the way the real server reports it), get / create / replace / merge-patch / delete with
//! optimistic concurrency on `metadata.resourceVersion`, and the `status` subresource.
//!
//! It stores JSON, not types, so pods, Leases and CRDs all work without registration; it does
//! not validate schemas, default fields, or run admission. The [`Store`] outlives a server, so a
//! test can stop the server (every open watch breaks) and start another on the same port, after
//! [`Store::compact`] if it wants the clients to see `410 Gone`.

mod http;
pub mod store;

use crate::server::ServerHandle;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
pub use store::{Key, Store, StoreError};
use tokio::net::TcpListener;

/// A running fake API server.
pub struct FakeApiServer {
    handle: ServerHandle,
    store: Arc<Store>,
}

/// How often open watches get a BOOKMARK when they asked for bookmarks.
pub const BOOKMARK_EVERY: Duration = Duration::from_millis(500);

impl FakeApiServer {
    /// Serves `store` on `listener`.
    pub fn start(listener: TcpListener, store: Arc<Store>) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let served = Arc::clone(&store);
        let handle = ServerHandle::spawn(addr, move |tracker, cancel| {
            http::serve(listener, served, tracker, cancel)
        });
        Ok(Self { handle, store })
    }

    /// Serves a new, empty store on an ephemeral loopback port.
    pub async fn bind() -> std::io::Result<Self> {
        Self::start(TcpListener::bind("127.0.0.1:0").await?, Arc::default())
    }

    pub fn addr(&self) -> SocketAddr {
        self.handle.addr()
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Stops the server, breaking every connection and watch.
    pub async fn stop(self) -> (SocketAddr, Arc<Store>) {
        let addr = self.addr();
        self.handle.shutdown().await;
        (addr, self.store)
    }

    /// Stops the server and starts a new one on the same port with the same objects.
    pub async fn restart(self) -> std::io::Result<Self> {
        let (addr, store) = self.stop().await;
        Self::start(TcpListener::bind(addr).await?, store)
    }

    /// A kubeconfig file pointing at this server (plain HTTP, no credentials).
    pub fn write_kubeconfig(&self, path: &Path, namespace: &str) -> std::io::Result<()> {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: 'http://{}'}}\nusers:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context: {{cluster: fake, user: fake, namespace: {namespace}}}\ncurrent-context: fake\n",
            self.addr()
        );
        std::fs::write(path, text)
    }

    /// A client for this server.
    pub fn client(&self, namespace: &str) -> anyhow::Result<kube::Client> {
        let mut config = kube::Config::new(format!("http://{}", self.addr()).parse()?);
        config.default_namespace = namespace.to_owned();
        Ok(kube::Client::try_from(config)?)
    }
}
