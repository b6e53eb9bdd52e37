//! epp through a real Envoy 1.40: Envoy's ext_proc filter calls epp (in process), and Envoy
//! forwards to inference-sim pods that record what they receive. Each test starts its own stack on ephemeral ports and
//! asserts on what the pods received, on Envoy's access log and on epp's metrics, not only on
//! status codes.
//!
//! Needs Envoy (`hack/install-envoy.sh`); the tests fail, not skip, without it.
//! Run: `cargo nextest run -p epp-e2e --test e2e epp_envoy::`.

#![allow(clippy::unwrap_used)]

mod affinity;
mod body;
mod cert_reload;
mod early;
mod errors;
mod file_discovery;
mod flow;
mod interface;
mod learned;
mod limits;
mod policies;
mod routing;
mod scheduling;
mod security;
mod support;
mod ttft;
mod v1_config;
mod websocket;
