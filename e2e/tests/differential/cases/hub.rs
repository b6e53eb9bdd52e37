//! Cases on a multi-cluster hub (the pods stand for clusters' gateways) and the topology
//! plugins in a P/D prefill stage.

use super::*;

/// P/D pods on two hosts: decode 0 (queue 3, host n2), decode 1 (n1), prefill 2 (n2) and
/// prefill 3 (queue 2, n1). The decode pick is pod 1; by queue alone the prefill would be pod 2,
/// by topology it is pod 3, on pod 1's host. `key` is the host label.
fn hosts(key: &'static str) -> Vec<PodState> {
    let at = [
        ("decode", "n2", 3),
        ("decode", "n1", 0),
        ("prefill", "n2", 0),
        ("prefill", "n1", 2),
    ];
    at.iter()
        .map(|&(role, host, w)| PodState {
            waiting: Some(w),
            labels: vec![(ROLE, role), (key, host)],
            ..PodState::default()
        })
        .collect()
}

/// Topology affinity (llm-d v0.10, alpha) in a P/D prefill stage.
pub(super) fn topology() -> Vec<Case> {
    let host = "kubernetes.io/hostname";
    let long = || vec![req(completion(&prompt(12, 400)))];
    vec![
        case(
            "topology-affinity-filter",
            TOPOLOGY_FILTER,
            hosts(host),
            long(),
        ),
        case(
            "topology-affinity-scorer",
            TOPOLOGY_SCORER,
            hosts(host),
            long(),
        ),
        case(
            "topology-extractor",
            TOPOLOGY_EXTRACTOR,
            hosts("node"),
            long(),
        ),
    ]
}

/// The clusters of a hub case: idle pods (their own gauges are not what a hub reads).
fn clusters(pools: &[(f64, f64)], address: &'static str, metrics_address: &'static str) -> Hub {
    Hub {
        pools: pools
            .iter()
            .map(|&(kv, queue)| Pool { kv, queue })
            .collect(),
        address,
        metrics_address,
    }
}

/// A hub case over three clusters whose spokes report `pools` (KV utilization, queue).
fn hub(kind: &'static str, config: &'static str, pools: Hub, requests: Vec<Req>) -> Case {
    Case {
        hub: Some(pools),
        ..case(kind, config, waiting(&[0, 0, 0]), requests)
    }
}

/// Why `multicluster-file-discovery` differs when a cluster's address is a host name.
const HUB_HOST_NAME: &str = "llm-d answers the cluster's address as the file writes it \
    (`localhost:<port>`), which Envoy's ORIGINAL_DST cluster cannot route (no IP: 503); epp \
    resolves the name when it reads the file and answers the IP";

/// The multi-cluster hub (llm-d v0.10, alpha): clusters are endpoints, each spoke EPP's
/// pool gauges are scraped over https with its certificate verified.
pub(super) fn hubs() -> Vec<Case> {
    let three = || times(3, req(completion("hello")));
    let local = |pools: &[(f64, f64)]| clusters(pools, "127.0.0.1", "127.0.0.1");
    let queues = local(&[(0.1, 6.0), (0.9, 1.0), (0.1, 3.0)]);
    vec![
        hub(
            "multicluster-queue-scorer",
            HUB_QUEUE,
            queues.clone(),
            vec![three()],
        ),
        hub(
            "multicluster-kv-cache-utilization-scorer",
            HUB_KV,
            local(&[(0.8, 0.0), (0.3, 9.0), (0.5, 0.0)]),
            vec![three()],
        ),
        hub(
            "multicluster-metrics-extractor",
            HUB_EXTRACTOR,
            local(&[(0.1, 6.0), (0.9, 1.0), (0.1, 3.0)]),
            vec![three()],
        ),
        hub(
            "multicluster-metrics-data-source",
            HUB_QUEUE,
            clusters(
                &[(0.1, 6.0), (0.9, 1.0), (0.1, 3.0)],
                "127.0.0.1",
                "localhost",
            ),
            vec![three()],
        ),
        Case {
            expect: Expect::Differ(HUB_HOST_NAME),
            ..hub(
                "multicluster-file-discovery",
                HUB_QUEUE,
                clusters(
                    &[(0.1, 6.0), (0.9, 1.0), (0.1, 3.0)],
                    "localhost",
                    "127.0.0.1",
                ),
                vec![three()],
            )
        },
        hub(
            "multicluster-prefix-cache-scorer",
            HUB_PREFIX,
            local(&[(0.0, 2.0), (0.0, 0.0), (0.0, 4.0)]),
            prefix_turns(),
        ),
        hub(
            "multicluster-approx-prefix-cache-producer",
            HUB_PRODUCER,
            local(&[(0.0, 2.0), (0.0, 0.0), (0.0, 4.0)]),
            prefix_turns(),
        ),
        hub(
            "multicluster-session-affinity-filter",
            HUB_SESSION,
            local(&[(0.0, 3.0), (0.0, 0.0), (0.0, 3.0)]),
            session_turns(),
        ),
    ]
}
