//! Pods → endpoints, pure: which pods of a pool serve, and on which ports.
//!
//! As upstream (`pkg/epp/util/pod`, `pkg/epp/datastore`): a pod is an endpoint when its labels
//! match the selector, it is Ready and it has no deletion timestamp and an IP. Each target port
//! is a separate endpoint named `<pod>-rank-<index>` (data-parallel ranks); the pod annotation
//! `llm-d.ai/active-ports` (llm-d-router v0.10), else the legacy
//! `inference.networking.k8s.io/active-ports`, limits which of the target ports are active.

use crate::endpoint::{Endpoint, EndpointId, EngineType};
use k8s_openapi::api::core::v1::Pod;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

pub(crate) const ACTIVE_PORTS_ANNOTATION: &str = "llm-d.ai/active-ports";
/// GIE's key for the same annotation, read when llm-d's is absent (as llm-d-router v0.10 does).
pub(crate) const LEGACY_ACTIVE_PORTS_ANNOTATION: &str = "inference.networking.k8s.io/active-ports";
pub(crate) const ENGINE_TYPE_LABEL: &str = "inference.networking.k8s.io/engine-type";
/// Relative capacity for weighted pickers: an annotation, else a label; a positive integer.
pub(crate) const WEIGHT_KEY: &str = "inference.networking.k8s.io/weight";

/// Which pods and ports make up the pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PoolTarget {
    pub(crate) selector: BTreeMap<String, String>,
    pub(crate) ports: Vec<u16>,
}

impl PoolTarget {
    pub(crate) fn selects(&self, pod: &Pod) -> bool {
        let labels = pod.metadata.labels.as_ref();
        self.selector
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
    }
}

/// Ready, not terminating, and addressed.
pub(crate) fn is_serving(pod: &Pod) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let status = pod.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    ready && pod_ip(pod).is_some()
}

fn pod_ip(pod: &Pod) -> Option<IpAddr> {
    pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()
}

/// The endpoints of `pods` under `target`, sorted by address.
pub(crate) fn endpoints<'a>(
    target: &PoolTarget,
    pods: impl IntoIterator<Item = &'a Pod>,
) -> Vec<Endpoint> {
    let mut out: Vec<Endpoint> = pods
        .into_iter()
        .filter(|p| target.selects(p) && is_serving(p))
        .flat_map(|p| pod_endpoints(target, p))
        .collect();
    out.sort_by_key(|e| e.id);
    out
}

fn pod_endpoints(target: &PoolTarget, pod: &Pod) -> Vec<Endpoint> {
    let Some(ip) = pod_ip(pod) else {
        return Vec::new();
    };
    let name = pod.metadata.name.clone().unwrap_or_default();
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let engine = labels
        .get(ENGINE_TYPE_LABEL)
        .and_then(|v| EngineType::from_label(v))
        .unwrap_or_default();
    let weight = pod_weight(pod, &labels);
    let active: Option<Vec<u16>> = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| {
            a.get(ACTIVE_PORTS_ANNOTATION)
                .or_else(|| a.get(LEGACY_ACTIVE_PORTS_ANNOTATION))
        })
        .map(|v| v.split(',').filter_map(|p| p.trim().parse().ok()).collect());
    target
        .ports
        .iter()
        .enumerate()
        .filter(|(_, port)| active.as_ref().is_none_or(|a| a.contains(port)))
        .map(|(rank, port)| Endpoint {
            id: EndpointId(SocketAddr::new(ip, *port)),
            name: format!("{name}-rank-{rank}"),
            engine,
            labels: labels.clone(),
            weight,
            // A pool has at most 8 target ports (CRD validation).
            rank: u16::try_from(rank).unwrap_or(u16::MAX),
            metrics_host: None,
        })
        .collect()
}

/// The `inference.networking.k8s.io/weight` annotation, else label; 1 when absent or invalid.
fn pod_weight(pod: &Pod, labels: &std::collections::BTreeMap<String, String>) -> u32 {
    let annotation = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(WEIGHT_KEY));
    match annotation
        .or_else(|| labels.get(WEIGHT_KEY))
        .map(|v| v.trim().parse::<u32>())
    {
        Some(Ok(w)) => w,
        Some(Err(_)) => {
            tracing::warn!(
                pod = pod.metadata.name.as_deref().unwrap_or(""),
                "invalid {WEIGHT_KEY} (not a non-negative integer); using 1"
            );
            1
        }
        None => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, ip: &str, ready: bool, extra: serde_json::Value) -> Pod {
        let mut v = json!({
            "metadata": {"name": name, "labels": {"app": "vllm", ENGINE_TYPE_LABEL: "sglang"}},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        });
        if let Some(m) = extra.as_object() {
            for (k, val) in m {
                v["metadata"][k] = val.clone();
            }
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn ready_matching_pods_become_one_endpoint_per_active_port() {
        let target = PoolTarget {
            selector: [("app".to_owned(), "vllm".to_owned())].into(),
            ports: vec![8000, 8001],
        };
        let pods = [
            pod("a", "10.0.0.1", true, json!({})),
            pod("b", "10.0.0.2", false, json!({})),
            pod(
                "c",
                "10.0.0.3",
                true,
                json!({"deletionTimestamp": "2025-01-01T00:00:00Z"}),
            ),
            pod(
                "d",
                "10.0.0.4",
                true,
                json!({"annotations": {ACTIVE_PORTS_ANNOTATION: "8001"}}),
            ),
            pod("e", "10.0.0.5", true, json!({"labels": {"app": "other"}})),
        ];
        let eps = endpoints(&target, &pods);
        let ids: Vec<String> = eps
            .iter()
            .map(|e| format!("{} {} {}", e.id, e.name, e.rank))
            .collect();
        assert_eq!(
            ids,
            [
                "10.0.0.1:8000 a-rank-0 0",
                "10.0.0.1:8001 a-rank-1 1",
                "10.0.0.4:8001 d-rank-1 1"
            ],
            "the rank is the port's position in targetPorts, also when active-ports leaves out earlier ones"
        );
        assert_eq!(eps[0].engine, EngineType::Sglang);
    }

    #[test]
    fn llm_ds_active_ports_annotation_wins_over_gies_legacy_one() {
        let target = PoolTarget {
            selector: [("app".to_owned(), "vllm".to_owned())].into(),
            ports: vec![8000, 8001, 8002],
        };
        let both = json!({"annotations": {ACTIVE_PORTS_ANNOTATION: "8002", LEGACY_ACTIVE_PORTS_ANNOTATION: "8000"}});
        let legacy = json!({"annotations": {LEGACY_ACTIVE_PORTS_ANNOTATION: "8001, 9999"}});
        let none_valid = json!({"annotations": {ACTIVE_PORTS_ANNOTATION: "9999"}});
        let pods = [
            pod("a", "10.0.0.1", true, both),
            pod("b", "10.0.0.2", true, legacy),
            pod("c", "10.0.0.3", true, none_valid),
        ];
        let names: Vec<String> = endpoints(&target, &pods)
            .iter()
            .map(|e| format!("{} {}", e.name, e.rank))
            .collect();
        assert_eq!(names, ["a-rank-2 2", "b-rank-1 1"]);
    }

    #[test]
    fn weight_comes_from_the_annotation_then_the_label() {
        let target = PoolTarget {
            selector: [("app".to_owned(), "vllm".to_owned())].into(),
            ports: vec![8000],
        };
        let pods = [
            pod(
                "a",
                "10.0.0.1",
                true,
                json!({"annotations": {WEIGHT_KEY: "5"}, "labels": {"app": "vllm", WEIGHT_KEY: "2"}}),
            ),
            pod(
                "b",
                "10.0.0.2",
                true,
                json!({"labels": {"app": "vllm", WEIGHT_KEY: "2"}}),
            ),
            pod(
                "c",
                "10.0.0.3",
                true,
                json!({"annotations": {WEIGHT_KEY: "heavy"}}),
            ),
            pod("d", "10.0.0.4", true, json!({})),
        ];
        let weights: Vec<u32> = endpoints(&target, &pods).iter().map(|e| e.weight).collect();
        assert_eq!(weights, [5, 2, 1, 1]);
    }
}
