//! epp: an Endpoint Picker for the Kubernetes Gateway API Inference Extension.
//!
//! A gateway (Envoy and the gateways built on it) calls epp over Envoy's ext_proc protocol for
//! every inference request. One request, end to end:
//!
//! 1. [`extproc`] receives the request headers and body chunks on one gRPC stream and drives a
//!    per-stream state machine (one state enum; Envoy's body modes as a `BodyMode`).
//! 2. [`request`] parses the OpenAI-style body (model, stream flag, prompt) once, without
//!    re-serialising it; the parsed request is what the rest of the stream reads.
//! 3. [`director`] (`route`, then `finish` when the exchange ends) takes a [`datastore`]
//!    snapshot of the endpoints and their scraped metrics, looks the prompt up in the
//!    configuration's prefix index ([`prefix`]: tokenize, hash into blocks, match), builds
//!    candidates, and asks [`scheduling`] (pure: filters → weighted scorers → picker) for a
//!    decision; then it records the decision in the prefix index and the in-flight counters.
//! 4. [`extproc`] answers with the destination in the `x-gateway-destination-endpoint` header and
//!    the `envoy.lb` dynamic metadata, streams the body back, and passes the response through,
//!    releasing the in-flight count when the response ends.
//!
//! Background tasks, owned by [`app`], feed the datastore: [`discovery`] (static endpoints),
//! [`scrape`] (one poller per endpoint: metric scrapes and health probes), [`kvevents`] (one
//! KV-cache event subscriber per endpoint, feeding the precise prefix index), [`replicas`]
//! (with `--speculative-peers`, the exchange of speculative entries with the other epp
//! replicas) and [`reload`] (the config file watcher).
//! `app` also owns what the director reads and records into (the live configuration, both
//! prefix indexes, the metrics), hands each adapter the parts it uses, and runs the prefix
//! indexes' garbage collection.

pub mod admin;
pub mod admission;
pub mod app;
pub mod clock;
pub mod config;
pub mod datastore;
pub mod director;
pub mod discovery;
pub mod duration;
pub mod endpoint;
pub mod extproc;
#[cfg(any(test, feature = "test-util"))]
pub mod fixtures;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod handshake;
pub mod health;
pub mod kvevents;
pub mod metrics;
pub mod plugin;
pub mod prefix;
pub mod reload;
pub mod replicas;
pub mod request;
pub mod scheduling;
pub mod scrape;
pub mod telemetry;
pub mod watch;
