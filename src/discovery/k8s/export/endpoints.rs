//! Endpoint mode for epp (`--endpoints-dir`): for every exported pool, the ready endpoints of
//! every exporting cluster in llm-d's `file-discovery` format, one file per import,
//! `<dir>/<namespace>/<name>.yaml`. An epp of an importing cluster whose configuration's
//! `file-discovery` plugin reads that file (`watchFile: true`) schedules over the pods of all
//! exporting clusters, which endpoint mode requires to be reachable from the importing gateway.
//!
//! A file is replaced by rename only when its content changes; the files of pools no longer
//! exported are removed. Only `*.yaml` files two levels below the directory are touched.

use super::plan::Key;
use crate::discovery::k8s::pods::{is_serving, PoolTarget};
use k8s_openapi::api::core::v1::Pod;
use kube::api::DynamicObject;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

/// The label naming the cluster an endpoint is in.
pub const CLUSTER_LABEL: &str = "inference.networking.x-k8s.io/cluster";

/// The pool's selector and target ports, from its (v1) spec; None when it has neither.
pub(crate) fn target_of(pool: &DynamicObject) -> Option<PoolTarget> {
    let spec = &pool.data["spec"];
    let selector: BTreeMap<String, String> =
        serde_json::from_value(spec["selector"]["matchLabels"].clone()).ok()?;
    let ports: Vec<u16> = spec["targetPorts"]
        .as_array()?
        .iter()
        .filter_map(|p| p["number"].as_u64().and_then(|n| u16::try_from(n).ok()))
        .collect();
    (!selector.is_empty() && !ports.is_empty()).then_some(PoolTarget { selector, ports })
}

/// The file entries of `cluster`'s serving pods under `target`: one per pod and port, named
/// `<cluster>.<pod>.<port>`, with the pod's labels and the cluster's.
pub(crate) fn entries(cluster: &str, target: &PoolTarget, pods: &[Pod]) -> Vec<Value> {
    let mut out = Vec::new();
    for pod in pods.iter().filter(|p| target.selects(p) && is_serving(p)) {
        let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref()) else {
            continue;
        };
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let mut labels = pod.metadata.labels.clone().unwrap_or_default();
        labels.insert(CLUSTER_LABEL.to_owned(), cluster.to_owned());
        for port in &target.ports {
            out.push(json!({
                "name": format!("{cluster}.{name}.{port}"),
                "namespace": pod.metadata.namespace,
                "address": ip,
                "port": port.to_string(),
                "labels": labels,
            }));
        }
    }
    out
}

/// The file's text for `entries` (sorted by name, so a re-list writes the same bytes).
pub(crate) fn render(mut entries: Vec<Value>) -> Result<String, serde_norway::Error> {
    entries.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    serde_norway::to_string(&json!({ "endpoints": entries }))
}

/// `<dir>/<namespace>/<name>.yaml`; None for a name that is no plain path component (the API
/// server allows none, but the file system is not the place to find out).
pub(crate) fn path(dir: &Path, key: &Key) -> Option<PathBuf> {
    let plain = |s: &str| !s.is_empty() && s != "." && s != ".." && !s.contains(['/', '\\']);
    (plain(&key.namespace) && plain(&key.name))
        .then(|| dir.join(&key.namespace).join(format!("{}.yaml", key.name)))
}

/// Writes `text` at `path` (a sibling renamed over it) unless it already holds it; whether it
/// wrote.
pub(crate) fn write_if_changed(path: &Path, text: &str) -> io::Result<bool> {
    if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(false);
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = path.with_extension("yaml.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(true)
}

/// The `*.yaml` files under `dir` (two levels) that no key in `keep` names.
pub(crate) fn stale(dir: &Path, keep: &BTreeSet<Key>) -> io::Result<Vec<PathBuf>> {
    let wanted: BTreeSet<PathBuf> = keep.iter().filter_map(|k| path(dir, k)).collect();
    let mut out = Vec::new();
    let namespaces = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for ns in namespaces {
        let ns = ns?.path();
        if !ns.is_dir() {
            continue;
        }
        for file in std::fs::read_dir(&ns)? {
            let file = file?.path();
            let yaml = file.extension().is_some_and(|e| e == "yaml");
            if yaml && !wanted.contains(&file) {
                out.push(file);
            }
        }
    }
    Ok(out)
}
