//! Kubernetes discovery: watchers that keep the datastore in step with the cluster.
//!
//! Two tasks, each the single writer of one datastore source:
//! - [`run_endpoints`] watches the InferencePool (`--pool-name`, v1 or v1alpha2 by
//!   `--pool-group`) and the pods of its namespace, and republishes the endpoint set on every
//!   change (standalone mode takes the selector and ports from `--endpoint-selector` and
//!   `--endpoint-target-ports` and watches only pods);
//! - [`run_objectives`] watches InferenceObjectives, InferenceModels and InferenceModelRewrites
//!   of the namespace and republishes the objective policies; it follows the pool's labels,
//!   which `run_endpoints` publishes ([`PoolLabels`]), for objectives' `poolSelector`.
//!
//! kube's `watcher` lists, then watches from the list's resourceVersion, resumes after a broken
//! connection, and re-lists after `410 Gone`; its `Init … InitDone` sequence is applied
//! atomically here, so a re-list never publishes a half-empty pool. Errors (API server down,
//! CRD not installed) are logged and retried with backoff; the last good state stays published.
//! CRD objects pass through a [`gate::Gate`] first, which drops those breaking the CRDs' CEL rules.
//! Both tasks feed [`sync`], which tells readiness whether discovery has synced and the API
//! server still answers.

pub mod crd;
pub mod export;
pub(crate) mod gate;
pub(crate) mod leader;
pub(crate) mod objectives;
pub(crate) mod pods;
pub(crate) mod report;
pub(crate) mod sync;

use crate::datastore::Datastore;
use crate::metrics::{CrdKind, KubeResource, Metrics};
use crd::validate::Validate;
use crd::{
    model::InferenceModel, objective::InferenceObjective, pool, pool_v1alpha2,
    rewrite::InferenceModelRewrite,
};
use futures::stream::{BoxStream, StreamExt};
use gate::Gate;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource};
use pods::PoolTarget;
use report::Reporter;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;
pub(crate) use sync::SyncInputs;
use tokio::sync::watch as channel;
use tokio_util::sync::CancellationToken;

pub(crate) const GROUP_V1: &str = "inference.networking.k8s.io";
pub(crate) const GROUP_V1ALPHA2: &str = "inference.networking.x-k8s.io";

#[derive(Debug, thiserror::Error)]
pub(crate) enum K8sError {
    #[error("--pool-group {0:?} is not supported (use {GROUP_V1} or {GROUP_V1ALPHA2})")]
    PoolGroup(String),
    #[error("invalid --endpoint-selector {0:?}: expected key=value[,key=value]")]
    Selector(String),
    #[error("Kubernetes client configuration: {0}")]
    Config(String),
    #[error("Kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

/// Where the pool's membership comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PoolSource {
    /// An InferencePool object, by name and API group.
    Pool { name: String, group: String },
    /// Standalone mode: a fixed selector and ports.
    Selector(PoolTarget),
}

impl PoolSource {
    /// Checks the group (the pool's API version follows from it).
    pub(crate) fn pool(name: String, group: String) -> Result<Self, K8sError> {
        if group != GROUP_V1 && group != GROUP_V1ALPHA2 {
            return Err(K8sError::PoolGroup(group));
        }
        Ok(Self::Pool { name, group })
    }

    /// Parses `k=v,k2=v2` and takes the ports as given.
    pub(crate) fn selector(selector: &str, ports: Vec<u16>) -> Result<Self, K8sError> {
        let pairs = selector
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|kv| {
                kv.split_once('=')
                    .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            });
        let selector: Option<BTreeMap<String, String>> = pairs.collect();
        match selector {
            Some(s) if !s.is_empty() => Ok(Self::Selector(PoolTarget { selector: s, ports })),
            _ => Err(K8sError::Selector(selector_text(selector))),
        }
    }
}

fn selector_text(s: Option<BTreeMap<String, String>>) -> String {
    s.map(|m| format!("{m:?}")).unwrap_or_default()
}

/// Builds a client from `--kubeconfig` or, without it, the in-cluster / `$KUBECONFIG` config,
/// and logs which server it talks to with which credentials. A configuration that cannot be
/// read fails start-up with an error naming the credential source; an unreachable server does
/// not (the watchers retry with backoff), but is logged at once, naming the server.
pub(crate) async fn client(kubeconfig: Option<&std::path::Path>) -> Result<Client, K8sError> {
    let source = credential_source(kubeconfig);
    let config_err = |e: &dyn std::fmt::Display| K8sError::Config(format!("{source}: {e}"));
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| config_err(&e))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| config_err(&e))?
        }
        None => kube::Config::infer().await.map_err(|e| config_err(&e))?,
    };
    let server = config.cluster_url.to_string();
    tracing::info!(server = %server, credentials = %source, "Kubernetes API server");
    let client = Client::try_from(config)?;
    let probe = tokio::time::timeout(STARTUP_PROBE, client.apiserver_version()).await;
    match probe {
        Ok(Ok(v)) => {
            tracing::info!(server = %server, version = %v.git_version, "Kubernetes API server reachable")
        }
        Ok(Err(e)) => {
            tracing::warn!(server = %server, credentials = %source, error = %e, "Kubernetes API server not usable at start-up; discovery retries with backoff")
        }
        Err(_) => {
            tracing::warn!(server = %server, credentials = %source, "Kubernetes API server did not answer within {STARTUP_PROBE:?} at start-up; discovery retries with backoff")
        }
    }
    Ok(client)
}

/// How long start-up waits for the API server's `/version` before going on without it.
const STARTUP_PROBE: std::time::Duration = std::time::Duration::from_secs(3);

/// Where the credentials come from, for log lines and errors.
fn credential_source(kubeconfig: Option<&std::path::Path>) -> String {
    if let Some(path) = kubeconfig {
        return format!("kubeconfig {}", path.display());
    }
    if let Some(path) = std::env::var_os("KUBECONFIG") {
        return format!("$KUBECONFIG {}", std::path::Path::new(&path).display());
    }
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        return "in-cluster ServiceAccount token".to_owned();
    }
    "~/.kube/config (no --kubeconfig, no $KUBECONFIG, not in a cluster)".to_owned()
}

/// A collection as last seen, by object name. A re-list is buffered and swapped in whole.
struct Mirror<V> {
    items: BTreeMap<String, V>,
    relist: Option<BTreeMap<String, V>>,
    /// Whether a first list has completed.
    listed: bool,
}

impl<V> Default for Mirror<V> {
    fn default() -> Self {
        Self {
            items: BTreeMap::new(),
            relist: None,
            listed: false,
        }
    }
}

impl<V> Mirror<V> {
    /// Applies one event; true when the visible items changed.
    fn apply(&mut self, event: Event<(String, V)>) -> bool {
        match event {
            Event::Init => {
                self.relist = Some(BTreeMap::new());
                false
            }
            Event::InitApply((k, v)) => {
                self.relist.get_or_insert_with(BTreeMap::new).insert(k, v);
                false
            }
            Event::InitDone => {
                self.items = self.relist.take().unwrap_or_default();
                self.listed = true;
                true
            }
            Event::Apply((k, v)) => {
                self.items.insert(k, v);
                true
            }
            Event::Delete((k, _)) => self.items.remove(&k).is_some(),
        }
    }
}

type Named<V> = BoxStream<'static, Result<Event<(String, V)>, watcher::Error>>;

/// A watch of `api`, each object mapped to `(name, f(object))`.
fn watch<K, V>(api: Api<K>, config: watcher::Config, f: fn(K) -> V) -> Named<V>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    V: Send + 'static,
{
    watcher::watcher(api, config)
        .default_backoff()
        .map(move |r| r.map(|e| map_event(e, f)))
        .boxed()
}

/// Like [`watch`], with CRD objects passed through `gate` first.
fn watch_checked<K, V>(
    api: Api<K>,
    config: watcher::Config,
    f: fn(K) -> V,
    mut gate: Gate<K>,
) -> Named<V>
where
    K: Validate + Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    V: Send + 'static,
{
    let admit = move |r: Result<Event<K>, watcher::Error>| {
        futures::future::ready(match r {
            Ok(e) => gate.admit(e).map(|e| Ok(map_event(e, f))),
            Err(e) => Some(Err(e)),
        })
    };
    watcher::watcher(api, config)
        .default_backoff()
        .filter_map(admit)
        .boxed()
}

fn map_event<K: Resource, V>(e: Event<K>, f: fn(K) -> V) -> Event<(String, V)> {
    let named = |k: K| (k.meta().name.clone().unwrap_or_default(), f(k));
    match e {
        Event::Apply(k) => Event::Apply(named(k)),
        Event::Delete(k) => Event::Delete(named(k)),
        Event::Init => Event::Init,
        Event::InitApply(k) => Event::InitApply(named(k)),
        Event::InitDone => Event::InitDone,
    }
}

/// The pool as the watchers use it: its endpoints' selector and ports, and its own labels.
type PoolSeen = (PoolTarget, Labels);

type Labels = BTreeMap<String, String>;

fn v1_target(p: pool::InferencePool) -> PoolSeen {
    let labels = p.metadata.labels.unwrap_or_default();
    let ports = p
        .spec
        .target_ports
        .iter()
        .filter_map(|p| u16::try_from(p.number).ok())
        .collect();
    let target = PoolTarget {
        selector: p.spec.selector.match_labels,
        ports,
    };
    (target, labels)
}

fn v1alpha2_target(p: pool_v1alpha2::InferencePool) -> PoolSeen {
    let target = PoolTarget {
        selector: p.spec.selector,
        ports: u16::try_from(p.spec.target_port_number)
            .into_iter()
            .collect(),
    };
    (target, p.metadata.labels.unwrap_or_default())
}

fn pool_stream(
    client: &Client,
    namespace: &str,
    source: &PoolSource,
    metrics: &Arc<Metrics>,
) -> Named<PoolSeen> {
    match source {
        PoolSource::Pool { name, group } => {
            let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
            if group == GROUP_V1 {
                watch_checked(
                    Api::<pool::InferencePool>::namespaced(client.clone(), namespace),
                    config,
                    v1_target,
                    Gate::new(CrdKind::InferencePool, Arc::clone(metrics)),
                )
            } else {
                watch_checked(
                    Api::<pool_v1alpha2::InferencePool>::namespaced(client.clone(), namespace),
                    config,
                    v1alpha2_target,
                    Gate::new(CrdKind::InferencePool, Arc::clone(metrics)),
                )
            }
        }
        PoolSource::Selector(_) => futures::stream::pending().boxed(),
    }
}

/// What both watch tasks share: where they watch, what they write and whom they tell.
#[derive(Clone)]
pub(crate) struct Watching {
    pub(crate) client: Client,
    pub(crate) namespace: String,
    pub(crate) datastore: Arc<Datastore>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) sync: SyncInputs,
    pub(crate) pool_labels: PoolLabels,
}

/// The InferencePool's labels as `run_endpoints` last saw them: `None` before the pool is
/// listed, after it is deleted, and in standalone mode. `run_objectives` follows them.
#[derive(Clone)]
pub(crate) struct PoolLabels(Arc<channel::Sender<Option<Labels>>>);

impl Default for PoolLabels {
    fn default() -> Self {
        Self(Arc::new(channel::Sender::new(None)))
    }
}

impl PoolLabels {
    /// Publishes `labels`; followers wake only when they differ from the last.
    fn publish(&self, labels: Option<&Labels>) {
        self.0.send_if_modified(|last| {
            let changed = last.as_ref() != labels;
            if changed {
                *last = labels.cloned();
            }
            changed
        });
    }

    fn follow(&self) -> channel::Receiver<Option<Labels>> {
        self.0.subscribe()
    }
}

/// Follows the pool and its pods until `shutdown`, publishing the endpoint set on every change
/// and whether it is synced (pods listed, the pool present) to readiness.
pub(crate) async fn run_endpoints(w: Watching, source: PoolSource, shutdown: CancellationToken) {
    let Watching {
        client,
        namespace,
        datastore,
        metrics,
        sync,
        pool_labels,
    } = w;
    let pod_config = match &source {
        PoolSource::Selector(t) => watcher::Config::default().labels(
            &t.selector
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(","),
        ),
        PoolSource::Pool { .. } => watcher::Config::default(),
    };
    let mut pods = watch(
        Api::<Pod>::namespaced(client.clone(), &namespace),
        pod_config,
        |p| p,
    );
    let mut pools = pool_stream(&client, &namespace, &source, &metrics);
    let (mut pod_mirror, mut pool_mirror) =
        (Mirror::<Pod>::default(), Mirror::<PoolSeen>::default());
    let mut report = Reporter::new(Arc::clone(&metrics), Some(sync.clone()));
    loop {
        let changed = tokio::select! {
            _ = shutdown.cancelled() => return,
            Some(event) = pods.next() => event.map(|e| pod_mirror.apply(e)).unwrap_or_else(|e| { report.watch_failed(KubeResource::pods, &e); false }),
            Some(event) = pools.next() => event.map(|e| pool_mirror.apply(e)).unwrap_or_else(|e| { report.watch_failed(KubeResource::inferencepools, &e); false }),
        };
        if !changed {
            continue;
        }
        let (target, labels) = match &source {
            PoolSource::Selector(t) => (Some(t), None),
            PoolSource::Pool { name, .. } => {
                let seen = pool_mirror.items.get(name);
                (seen.map(|(t, _)| t), seen.map(|(_, l)| l))
            }
        };
        pool_labels.publish(labels);
        let endpoints = target
            .map(|t| pods::endpoints(t, pod_mirror.items.values()))
            .unwrap_or_default();
        tracing::debug!(count = endpoints.len(), "endpoints from Kubernetes");
        datastore.set_endpoints(endpoints);
        sync.set_listed(pod_mirror.listed && target.is_some());
    }
}

/// Follows the objective CRDs of `namespace` until `shutdown`; `pool` (None in standalone mode)
/// restricts them to those targeting the pool (by name, or by its labels).
pub(crate) async fn run_objectives(w: Watching, pool: Option<String>, shutdown: CancellationToken) {
    let Watching {
        client,
        namespace,
        datastore,
        metrics,
        sync,
        pool_labels,
    } = w;
    let mut labels = pool_labels.follow();
    let mut ours = pool.map(|name| objectives::OurPool { name, labels: None });
    let cfg = watcher::Config::default;
    let mut objectives = watch_checked(
        Api::<InferenceObjective>::namespaced(client.clone(), &namespace),
        cfg(),
        |o| o,
        Gate::new(CrdKind::InferenceObjective, Arc::clone(&metrics)),
    );
    let mut models = watch_checked(
        Api::<InferenceModel>::namespaced(client.clone(), &namespace),
        cfg(),
        |m| m,
        Gate::new(CrdKind::InferenceModel, Arc::clone(&metrics)),
    );
    let mut rewrites = watch_checked(
        Api::<InferenceModelRewrite>::namespaced(client, &namespace),
        cfg(),
        |r| r,
        Gate::new(CrdKind::InferenceModelRewrite, Arc::clone(&metrics)),
    );
    let (mut om, mut mm, mut rm) = (Mirror::default(), Mirror::default(), Mirror::default());
    let mut report = Reporter::new(Arc::clone(&metrics), Some(sync));
    loop {
        let changed = tokio::select! {
            _ = shutdown.cancelled() => return,
            Some(e) = objectives.next() => e.map(|e| om.apply(e)).unwrap_or_else(|e| { report.watch_failed(KubeResource::inferenceobjectives, &e); false }),
            Some(e) = models.next() => e.map(|e| mm.apply(e)).unwrap_or_else(|e| { report.watch_failed(KubeResource::inferencemodels, &e); false }),
            Some(e) = rewrites.next() => e.map(|e| rm.apply(e)).unwrap_or_else(|e| { report.watch_failed(KubeResource::inferencemodelrewrites, &e); false }),
            Ok(()) = labels.changed() => ours.as_mut().is_some_and(|p| {
                p.labels = labels.borrow_and_update().clone();
                true
            }),
        };
        if changed {
            datastore.set_objectives(objectives::build(
                ours.as_ref(),
                om.items.values(),
                mm.items.values(),
                rm.items.values(),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_labels_wake_followers_only_when_they_change() {
        let labels = PoolLabels::default();
        let mut follower = labels.follow();
        let gold: Labels = [("tier".to_owned(), "gold".to_owned())].into();
        labels.publish(Some(&gold));
        assert!(follower.has_changed().unwrap());
        assert_eq!(*follower.borrow_and_update(), Some(gold.clone()));
        labels.publish(Some(&gold));
        assert!(!follower.has_changed().unwrap(), "the same labels again");
        labels.publish(None);
        assert!(follower.has_changed().unwrap(), "the pool is gone");
        assert_eq!(*follower.borrow_and_update(), None);
    }
}
