//! epp's whole-system scenario tests (`tests/`) and criterion benches (`benches/`).
//!
//! The pieces they run live in their own crates under `e2e/`: [`harness`] (Envoy, in-process
//! epp, fake and real API servers, ports), [`inference_sim`] (the simulated vLLM pods) and
//! [`loadgen`] (the load generator and the benchmark orchestrator). This library gives the tests
//! one import root for all three, under the module names they use (`epp_e2e::envoy`,
//! `epp_e2e::sim`, ...).

pub use ::loadgen;
pub use harness::{
    client, envoy, fake_apiserver, fixtures, kube_apiserver, llmd_epp, noop_extproc, pd_sidecar,
    ports, prometheus, server, sim_pod, stack,
};
pub use inference_sim as sim;
pub use loadgen::bench;
