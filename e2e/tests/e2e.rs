//! epp's whole-system tests, one test binary: each module below was a test binary of its own.
//! Every test binary links all of epp, the harness and their dependencies (~160 MB in the dev
//! profile), so one binary instead of twenty-seven keeps a clean build's target directory and
//! link time small (CI ran out of disk with twenty-nine in all). Run one file's tests with
//! `cargo test -p epp-e2e --test e2e kube_faults::` (the module path is a filter).
//!
//! Two files stay binaries of their own because they set the process environment, which the
//! other tests' in-process epp would read: `tests/tracing.rs` (the OTLP exporter's variables)
//! and `tests/upstream_charts.rs` (each rendering's environment).
//!
//! The `*_support` modules are shared by several files; tests that need a real kube-apiserver
//! share one per process (`KubeApiServer::shared`), except `kube_faults`, which kills its
//! server and so has one of its own.

mod bench_smoke;
mod chaos;
mod dashboard;
mod debug_endpoint;
mod differential;
mod epp_envoy;
mod epp_sim;
mod failover;
mod fuzz_smoke;
mod harness_envoy;
mod helm;
mod helm_peers;
mod helm_upstream_values;
mod hf_tokenizer;
mod k8s;
mod kube_chart;
mod kube_crds;
mod kube_faults;
mod kube_ops;
mod kube_pods;
mod kube_pool_import;
mod kube_scale;
mod kvevents;
mod kvevents_compare;
mod multicluster;
mod noop_extproc;
mod pd;
mod pd_dp;
mod regions;
mod sim_hook;
mod sim_http;
mod sim_python;

mod hub_support;
mod k8s_support;
mod kube_support;
mod kvevents_support;
mod pd_support;
mod sim_support;
