//! The Kubernetes side of the `apiserver-gone` fault: a real kube-apiserver and etcd
//! (`harness::kube_apiserver`, binaries from `EPP_KUBE_BIN`), the CRDs of `config/crd/`, an
//! InferencePool `pool` on the pods' port, and one Ready Pod per pod whose `status.podIP` is
//! the pod's loopback address. The replicas discover them through the API server (admin
//! kubeconfig) instead of reading `--static-endpoints`. The fault: kube-apiserver SIGKILLed
//! (etcd stays up), held down, started again on the same port.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use harness::envoy::Envoy;
use harness::kube_apiserver::{objects, KubeApiServer, KubeError};
use tokio::time::Instant;

use super::replicas::{self, Replicas};
use crate::bench::BenchError;

/// How long the replicas may take, after the API server is back, to report SERVING again
/// (their watches resume with backoff) and Envoy to see it.
pub const BACK_WITHIN: Duration = Duration::from_secs(60);

fn kube_err(what: &str) -> impl FnOnce(KubeError) -> BenchError + '_ {
    move |e| BenchError::Setup(format!("real API server ({what}): {e}"))
}

/// A real API server with the round's InferencePool and pods.
pub struct KubePool {
    /// Shared with the blocking task that kills the API server.
    server: Arc<KubeApiServer>,
    namespace: String,
    kubeconfig: PathBuf,
}

impl KubePool {
    /// Starts the API server and creates the pool and its pods. The pods must share one port on
    /// distinct loopback addresses (`SimOptions::host_per_pod`): a pool has one target port.
    pub async fn start(pods: &[SocketAddr], dir: &Path) -> Result<Self, BenchError> {
        let port = shared_port(pods)?;
        let server = KubeApiServer::start().await.map_err(kube_err("start"))?;
        objects::install_crds(&server)
            .await
            .map_err(kube_err("CRDs"))?;
        let ns = server
            .namespace("failover")
            .await
            .map_err(kube_err("namespace"))?;
        let pool = objects::inference_pool(&[port]);
        harness::kube_apiserver::apply::apply(&ns.client, &ns.name, &pool)
            .await
            .map_err(kube_err("InferencePool"))?;
        for (i, pod) in pods.iter().enumerate() {
            objects::ready_pod(&ns, &format!("pod-{i}"), &pod.ip().to_string())
                .await
                .map_err(kube_err("pods"))?;
        }
        let kubeconfig = dir.join("kubeconfig");
        server
            .admin_kubeconfig(&kubeconfig, &ns.name)
            .map_err(kube_err("kubeconfig"))?;
        Ok(Self {
            server: Arc::new(server),
            namespace: ns.name,
            kubeconfig,
        })
    }

    /// epp's discovery flags for this pool (in place of `--static-endpoints`). Metrics auth is
    /// off: nothing scrapes the replicas, and it would ask the API server on each scrape.
    pub fn epp_args(&self) -> Vec<String> {
        vec![
            "--kubeconfig".to_owned(),
            self.kubeconfig.display().to_string(),
            "--pool-name".to_owned(),
            "pool".to_owned(),
            "--pool-namespace".to_owned(),
            self.namespace.clone(),
            "--metrics-endpoint-auth=false".to_owned(),
        ]
    }

    /// The fault: SIGKILL of kube-apiserver, `down` without it (watching Envoy take the first
    /// replica out of rotation), then kube-apiserver started again and every replica waited
    /// for until Envoy sees it healthy. Returns when (after the SIGKILL) Envoy's health check
    /// saw the first replica NOT_SERVING, if it did while the server was down.
    pub async fn gone(
        &self,
        replicas: &Replicas,
        envoy: &Envoy,
        down: Duration,
    ) -> Result<Option<Duration>, BenchError> {
        let killed = Instant::now();
        // The stop waits for the supervisor: off the runtime, so the load is not held up.
        let server = Arc::clone(&self.server);
        tokio::task::spawn_blocking(move || server.stop_apiserver(true))
            .await
            .map_err(|e| BenchError::Setup(format!("stopping kube-apiserver: {e}")))?;
        let out_of_rotation = replicas::wait_health_within(envoy, replicas.replica(0), false, down)
            .await
            .ok()
            .map(|()| killed.elapsed());
        tokio::time::sleep_until(killed + down).await;
        self.server
            .start_apiserver()
            .await
            .map_err(kube_err("restart"))?;
        for i in 0..replicas.len() {
            replicas::wait_health_within(envoy, replicas.replica(i), true, BACK_WITHIN).await?;
        }
        Ok(out_of_rotation)
    }
}

/// The one port every pod listens on; an error unless they share it at distinct addresses.
fn shared_port(pods: &[SocketAddr]) -> Result<u16, BenchError> {
    let port = pods
        .first()
        .map(SocketAddr::port)
        .ok_or_else(|| BenchError::Setup("apiserver-gone needs pods".into()))?;
    let mut ips: Vec<_> = pods.iter().map(SocketAddr::ip).collect();
    ips.sort();
    ips.dedup();
    if pods.iter().any(|p| p.port() != port) || ips.len() != pods.len() {
        return Err(BenchError::Setup(format!(
            "apiserver-gone needs pods on one port at distinct addresses (an InferencePool has \
             one target port; inference-sim --host-per-pod), got {pods:?}"
        )));
    }
    Ok(port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pods_must_share_a_port_at_distinct_addresses() {
        let a: SocketAddr = "127.0.0.1:8000".parse().unwrap();
        let b: SocketAddr = "127.0.0.2:8000".parse().unwrap();
        let c: SocketAddr = "127.0.0.1:8001".parse().unwrap();
        assert_eq!(shared_port(&[a, b]).ok(), Some(8000));
        assert!(shared_port(&[a, c]).is_err());
        assert!(shared_port(&[a, a]).is_err());
        assert!(shared_port(&[]).is_err());
    }
}
