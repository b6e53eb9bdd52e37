//! The InferencePool export controller (GIE proposal 1374, "Multi-Cluster InferencePools",
//! hub/spoke topology), run by the `epp-pool-import` binary.
//!
//! Given the member clusters of a ClusterSet (a kubeconfig each), it exports every
//! InferencePool (`inference.networking.k8s.io/v1`) annotated
//! `inference.networking.x-k8s.io/export: "ClusterSet"`: every member gets an
//! `InferencePoolImport` of the pool's namespace and name whose `status.controllers[]` entry
//! (this controller's name) lists the exporting clusters and says `Accepted`; the pool gets a
//! `status.parents[]` entry (parentRef kind `InferencePoolImport`, this controller's name) with
//! the `Exported` condition, True once every member holds the import. When the export goes
//! (annotation removed, pool deleted), each import loses this controller's entry and, when this
//! controller created it and no other controller has an entry, is deleted; the pool's entry is
//! removed.
//!
//! Level-triggered: every pass lists the pools and imports of every member and writes only
//! the differences ([`plan`]), so a restart converges. Passes run on any watch event of pools
//! or imports (debounced), every resync interval, and, after a pass that failed, with backoff
//! (1 s doubling up to the interval). A member whose pools cannot be listed stops the pass
//! before any write, so an unreachable exporter never withdraws its imports. Import status is
//! written by server-side apply on the status subresource (a list-map keyed by controller name,
//! so other controllers' entries, e.g. the importing gateway's `parents`, are untouched); pool
//! status by a replace carrying the listed `resourceVersion` (its `parents` list is atomic).

pub mod endpoints;
pub mod plan;
pub mod types;

use super::crd::pool::InferencePool;
use futures::stream::{BoxStream, StreamExt};
use futures::FutureExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, ObjectMeta, Patch, PatchParams,
    PostParams, TypeMeta,
};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use plan::{Action, Export, Key, Outcome};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use types::{ImportController, InferencePoolImport};

/// The field manager of every write.
const MANAGER: &str = "epp-pool-import";
/// Watch events closer than this run one pass.
const DEBOUNCE: Duration = Duration::from_millis(200);
/// First retry after a failed pass; doubles up to the resync interval.
const FIRST_RETRY: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("expected NAME=KUBECONFIG, got {0:?}")]
    ClusterFlag(String),
    #[error("--cluster: the name {0:?} is given twice")]
    DuplicateCluster(String),
    #[error("no --cluster given: name every member of the ClusterSet")]
    NoCluster,
    #[error("--controller-name {0:?}: expected DOMAIN/PATH, e.g. example.net/pool-import")]
    ControllerName(String),
    #[error("cluster {name}: {source}")]
    Client {
        name: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Why one pass did not finish; it is retried with backoff.
#[derive(Debug, thiserror::Error)]
enum PassError {
    #[error("listing InferencePools in cluster {cluster}: {source}")]
    ListPools {
        cluster: String,
        #[source]
        source: kube::Error,
    },
    #[error("{0} write(s) failed (logged above)")]
    Writes(usize),
}

/// One `--cluster NAME=KUBECONFIG`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterFlag {
    pub name: String,
    pub kubeconfig: PathBuf,
}

impl std::str::FromStr for ClusterFlag {
    type Err = ExportError;

    fn from_str(s: &str) -> Result<Self, ExportError> {
        match s.split_once('=') {
            Some((name, path)) if !name.trim().is_empty() && !path.trim().is_empty() => Ok(Self {
                name: name.trim().to_owned(),
                kubeconfig: PathBuf::from(path.trim()),
            }),
            _ => Err(ExportError::ClusterFlag(s.to_owned())),
        }
    }
}

/// What the controller runs with.
#[derive(Clone, Debug)]
pub struct Options {
    /// The members of the ClusterSet: each exports its annotated pools and imports everyone's.
    pub clusters: Vec<ClusterFlag>,
    /// This controller's name in the status it writes (`DOMAIN/PATH`).
    pub controller_name: String,
    /// A full pass at least this often, events or not.
    pub resync: Duration,
    /// Endpoint mode for epp: where to write each import's endpoints file ([`endpoints`]).
    pub endpoints_dir: Option<PathBuf>,
}

impl Options {
    fn check(&self) -> Result<(), ExportError> {
        if self.clusters.is_empty() {
            return Err(ExportError::NoCluster);
        }
        let mut seen = BTreeSet::new();
        for c in &self.clusters {
            if !seen.insert(c.name.as_str()) {
                return Err(ExportError::DuplicateCluster(c.name.clone()));
            }
        }
        if !is_controller_name(&self.controller_name) {
            return Err(ExportError::ControllerName(self.controller_name.clone()));
        }
        Ok(())
    }
}

/// `DOMAIN/PATH` as the CRD's pattern has it: a lower-case DNS name, a slash, a non-empty path.
fn is_controller_name(name: &str) -> bool {
    let Some((domain, path)) = name.split_once('/') else {
        return false;
    };
    let label_ok = |l: &str| {
        !l.is_empty()
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    name.len() <= 253 && domain.split('.').all(label_ok) && !path.is_empty()
}

/// Connects to every member and runs the controller until `shutdown`. Fails only on a bad
/// option or an unreadable kubeconfig; an unreachable API server is retried.
pub async fn run(options: Options, shutdown: CancellationToken) -> Result<(), ExportError> {
    options.check()?;
    let mut members = Vec::new();
    for c in &options.clusters {
        let client = super::client(Some(&c.kubeconfig))
            .await
            .map_err(|e| ExportError::Client {
                name: c.name.clone(),
                source: Box::new(e),
            })?;
        members.push(Member {
            name: c.name.clone(),
            client,
        });
    }
    let controller = Controller {
        members,
        name: options.controller_name,
        endpoints_dir: options.endpoints_dir,
    };
    tracing::info!(
        controller = %controller.name,
        members = ?controller.members.iter().map(|m| &m.name).collect::<Vec<_>>(),
        "InferencePool export controller started"
    );
    controller.run(options.resync, shutdown).await;
    Ok(())
}

struct Member {
    name: String,
    client: Client,
}

struct Controller {
    members: Vec<Member>,
    name: String,
    endpoints_dir: Option<PathBuf>,
}

fn pool_resource() -> ApiResource {
    ApiResource::erase::<InferencePool>(&())
}

fn key_of(meta: &ObjectMeta) -> Key {
    Key {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
    }
}

impl Controller {
    async fn run(&self, resync: Duration, shutdown: CancellationToken) {
        let mut triggers = self.triggers();
        let mut retry = FIRST_RETRY;
        let mut next = Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep_until(next) => {}
                Some(()) = triggers.next() => settle(&mut triggers).await,
            }
            let outcome = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = self.pass(Timestamp::now()) => r,
            };
            match outcome {
                Ok(()) => {
                    retry = FIRST_RETRY;
                    next = Instant::now() + resync;
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?retry, "export pass incomplete");
                    next = Instant::now() + retry;
                    retry = (retry * 2).min(resync.max(FIRST_RETRY));
                }
            }
        }
    }

    /// One item per watch event of pools or imports in any member (errors logged).
    fn triggers(&self) -> BoxStream<'static, ()> {
        let mut streams: Vec<BoxStream<'static, ()>> = Vec::new();
        for m in &self.members {
            let pools = Api::<DynamicObject>::all_with(m.client.clone(), &pool_resource());
            streams.push(events(
                watcher::watcher(pools, watcher::Config::default()),
                &m.name,
                "inferencepools",
            ));
            let imports = Api::<InferencePoolImport>::all(m.client.clone());
            streams.push(events(
                watcher::watcher(imports, watcher::Config::default()),
                &m.name,
                "inferencepoolimports",
            ));
            if self.endpoints_dir.is_some() {
                let pods = Api::<Pod>::all(m.client.clone());
                streams.push(events(
                    watcher::watcher(pods, watcher::Config::default()),
                    &m.name,
                    "pods",
                ));
            }
        }
        futures::stream::select_all(streams).boxed()
    }

    /// Lists every member's pools, then brings every member's imports and every pool's export
    /// status in line with them.
    async fn pass(&self, now: Timestamp) -> Result<(), PassError> {
        let mut pools = Vec::new();
        for m in &self.members {
            let api = Api::<DynamicObject>::all_with(m.client.clone(), &pool_resource());
            let list =
                api.list(&ListParams::default())
                    .await
                    .map_err(|source| PassError::ListPools {
                        cluster: m.name.clone(),
                        source,
                    })?;
            pools.push(list.items);
        }
        let exported = plan::exports(self.members.iter().zip(&pools).flat_map(|(m, list)| {
            list.iter().map(|p| {
                let export = plan::export_of(p.metadata.annotations.as_ref());
                (m.name.as_str(), key_of(&p.metadata), export)
            })
        }));
        let mut failures: BTreeMap<Key, Vec<String>> = BTreeMap::new();
        let mut errors = 0;
        for m in &self.members {
            errors += self.sync_imports(m, &exported, now, &mut failures).await;
        }
        for (m, list) in self.members.iter().zip(&pools) {
            for pool in list {
                errors += usize::from(!self.sync_pool(m, pool, &failures, now).await);
            }
        }
        if let Some(dir) = &self.endpoints_dir {
            errors += self.sync_endpoints(dir, &pools, &exported).await;
        }
        if errors > 0 {
            return Err(PassError::Writes(errors));
        }
        Ok(())
    }

    /// Brings `m`'s imports in line with `exported`; the number of failed writes. An exported
    /// pool whose import `m` does not hold is recorded in `failures`.
    async fn sync_imports(
        &self,
        m: &Member,
        exported: &BTreeMap<Key, BTreeSet<String>>,
        now: Timestamp,
        failures: &mut BTreeMap<Key, Vec<String>>,
    ) -> usize {
        let api = Api::<InferencePoolImport>::all(m.client.clone());
        let existing: BTreeMap<Key, InferencePoolImport> = match api
            .list(&ListParams::default())
            .await
        {
            Ok(list) => list
                .items
                .into_iter()
                .map(|i| (key_of(&i.metadata), i))
                .collect(),
            Err(e) => {
                tracing::warn!(cluster = %m.name, error = %e, "listing InferencePoolImports failed");
                for key in exported.keys() {
                    failures
                        .entry(key.clone())
                        .or_default()
                        .push(format!("{}: {e}", m.name));
                }
                return 1;
            }
        };
        let keys: BTreeSet<&Key> = exported.keys().chain(existing.keys()).collect();
        let mut errors = 0;
        for key in keys {
            let current = existing.get(key);
            let ours = current.and_then(|i| i.controllers().iter().find(|c| c.name == self.name));
            let wanted = exported
                .get(key)
                .map(|clusters| plan::import_entry(&self.name, clusters, ours, now));
            let Some(action) = plan::import_action(&self.name, wanted, current) else {
                continue;
            };
            let what = action_name(&action);
            match self.act(m, key, action).await {
                Ok(()) => {
                    tracing::info!(cluster = %m.name, import = %key, action = what, "InferencePoolImport")
                }
                Err(e) => {
                    errors += 1;
                    tracing::warn!(cluster = %m.name, import = %key, action = what, error = %e, "InferencePoolImport write failed");
                    if exported.contains_key(key) {
                        failures
                            .entry(key.clone())
                            .or_default()
                            .push(format!("{}: {e}", m.name));
                    }
                }
            }
        }
        errors
    }

    async fn act(&self, m: &Member, key: &Key, action: Action) -> Result<(), kube::Error> {
        let api = Api::<InferencePoolImport>::namespaced(m.client.clone(), &key.namespace);
        match action {
            Action::Create(entry) => {
                let (label, value) = plan::MANAGED_BY;
                let meta = ObjectMeta {
                    name: Some(key.name.clone()),
                    namespace: Some(key.namespace.clone()),
                    labels: Some([(label.to_owned(), value.to_owned())].into()),
                    ..ObjectMeta::default()
                };
                let params = PostParams {
                    field_manager: Some(MANAGER.to_owned()),
                    ..PostParams::default()
                };
                match api.create(&params, &InferencePoolImport::new(meta)).await {
                    Ok(_) => {}
                    // Created since the list (a second controller, or a watch ahead of us).
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(e) => return Err(e),
                }
                write_entries(&api, key, vec![entry]).await
            }
            Action::Apply(entry) => write_entries(&api, key, vec![entry]).await,
            Action::Withdraw => write_entries(&api, key, Vec::new()).await,
            Action::Delete => match api.delete(&key.name, &DeleteParams::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                Err(e) => Err(e),
            },
        }
    }

    /// Sets or clears this controller's `Exported` entry in the pool's status; false when the
    /// write failed (logged).
    async fn sync_pool(
        &self,
        m: &Member,
        pool: &DynamicObject,
        failures: &BTreeMap<Key, Vec<String>>,
        now: Timestamp,
    ) -> bool {
        let key = key_of(&pool.metadata);
        let export = plan::export_of(pool.metadata.annotations.as_ref());
        let outcome = match failures.get(&key) {
            Some(why) => Outcome::Failed(why.clone()),
            None => Outcome::Exported,
        };
        let parents = pool.data["status"]["parents"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let generation = pool.metadata.generation;
        let Some(parents) = plan::pool_parents(
            &self.name, &key, &parents, &export, &outcome, generation, now,
        ) else {
            return true;
        };
        let mut pool = pool.clone();
        pool.data["status"]["parents"] = json!(parents);
        let resource = pool_resource();
        pool.types = Some(TypeMeta {
            api_version: resource.api_version.clone(),
            kind: resource.kind.clone(),
        });
        let api =
            Api::<DynamicObject>::namespaced_with(m.client.clone(), &key.namespace, &resource);
        let params = PostParams {
            field_manager: Some(MANAGER.to_owned()),
            ..PostParams::default()
        };
        match api.replace_status(&key.name, &params, &pool).await {
            Ok(_) => {
                let state = match (&export, &outcome) {
                    (Export::None, _) => "cleared",
                    (Export::ClusterSet, Outcome::Exported) => "Exported",
                    _ => "not Exported",
                };
                tracing::info!(cluster = %m.name, pool = %key, state, "InferencePool export status");
                true
            }
            Err(e) => {
                tracing::warn!(cluster = %m.name, pool = %key, error = %e, "InferencePool status write failed");
                false
            }
        }
    }
}

impl Controller {
    /// Writes the endpoints file of every exported pool and removes those of pools no longer
    /// exported; the number of failures (logged). A pool whose pods could not be listed in one
    /// of its clusters keeps its last file.
    async fn sync_endpoints(
        &self,
        dir: &std::path::Path,
        pools: &[Vec<DynamicObject>],
        exported: &BTreeMap<Key, BTreeSet<String>>,
    ) -> usize {
        let mut errors = 0;
        for (key, clusters) in exported {
            let Some(path) = endpoints::path(dir, key) else {
                tracing::warn!(pool = %key, "no endpoints file for a name that is not a path component");
                errors += 1;
                continue;
            };
            let Some(entries) = self.exported_endpoints(key, clusters, pools).await else {
                errors += 1;
                continue;
            };
            let written = endpoints::render(entries)
                .map_err(std::io::Error::other)
                .and_then(|text| endpoints::write_if_changed(&path, &text));
            match written {
                Ok(true) => {
                    tracing::info!(pool = %key, file = %path.display(), "endpoints file written")
                }
                Ok(false) => {}
                Err(e) => {
                    errors += 1;
                    tracing::warn!(pool = %key, file = %path.display(), error = %e, "endpoints file not written");
                }
            }
        }
        let keep: BTreeSet<Key> = exported.keys().cloned().collect();
        match endpoints::stale(dir, &keep) {
            Ok(files) => {
                for file in files {
                    match std::fs::remove_file(&file) {
                        Ok(()) => {
                            tracing::info!(file = %file.display(), "endpoints file removed: the pool is no longer exported")
                        }
                        Err(e) => {
                            errors += 1;
                            tracing::warn!(file = %file.display(), error = %e, "stale endpoints file not removed");
                        }
                    }
                }
            }
            Err(e) => {
                errors += 1;
                tracing::warn!(dir = %dir.display(), error = %e, "endpoints directory not readable");
            }
        }
        errors
    }

    /// The entries of the pool `key` in every cluster exporting it; None when a cluster's pods
    /// could not be listed (logged).
    async fn exported_endpoints(
        &self,
        key: &Key,
        clusters: &BTreeSet<String>,
        pools: &[Vec<DynamicObject>],
    ) -> Option<Vec<serde_json::Value>> {
        let mut entries = Vec::new();
        for (m, list) in self.members.iter().zip(pools) {
            let pool = list.iter().find(|p| key_of(&p.metadata) == *key);
            let (Some(pool), true) = (pool, clusters.contains(&m.name)) else {
                continue;
            };
            let Some(target) = endpoints::target_of(pool) else {
                tracing::warn!(cluster = %m.name, pool = %key, "the pool has no matchLabels selector or target port; no endpoints from it");
                continue;
            };
            let selector: Vec<String> = target
                .selector
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            let params = ListParams::default().labels(&selector.join(","));
            match Api::<Pod>::namespaced(m.client.clone(), &key.namespace)
                .list(&params)
                .await
            {
                Ok(list) => entries.extend(endpoints::entries(&m.name, &target, &list.items)),
                Err(e) => {
                    tracing::warn!(cluster = %m.name, pool = %key, error = %e, "listing the pool's pods failed; its endpoints file is kept");
                    return None;
                }
            }
        }
        Some(entries)
    }
}

/// Server-side applies this controller's `status.controllers` entries (none: withdraws ours).
async fn write_entries(
    api: &Api<InferencePoolImport>,
    key: &Key,
    entries: Vec<ImportController>,
) -> Result<(), kube::Error> {
    let patch = json!({
        "apiVersion": format!("{}/{}", types::GROUP, types::VERSION),
        "kind": types::KIND,
        "metadata": {"name": key.name, "namespace": key.namespace},
        "status": {"controllers": entries},
    });
    let params = PatchParams::apply(MANAGER).force();
    api.patch_status(&key.name, &params, &Patch::Apply(&patch))
        .await
        .map(|_| ())
}

fn action_name(action: &Action) -> &'static str {
    match action {
        Action::Create(_) => "created",
        Action::Apply(_) => "status updated",
        Action::Withdraw => "entry withdrawn",
        Action::Delete => "deleted",
    }
}

/// A watch as a stream of wake-ups; its errors (retried by the watcher's backoff) are logged.
fn events<K, S>(stream: S, cluster: &str, resource: &'static str) -> BoxStream<'static, ()>
where
    K: Send + 'static,
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    let cluster = cluster.to_owned();
    stream
        .default_backoff()
        .map(move |r| {
            if let Err(e) = r {
                tracing::warn!(cluster = %cluster, resource, error = %e, "watch failed; retrying");
            }
        })
        .boxed()
}

/// Waits out a burst of events, so it runs one pass; drains at most a bounded number.
async fn settle(triggers: &mut BoxStream<'static, ()>) {
    tokio::time::sleep(DEBOUNCE).await;
    for _ in 0..4096 {
        if triggers.next().now_or_never().flatten().is_none() {
            return;
        }
    }
}

#[cfg(test)]
mod tests;
