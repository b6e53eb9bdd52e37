//! Fault injection: what a router must survive, switchable per pod at run time.
//!
//! Why: a router that looks good only on healthy pods is not tested. Faults are
//! per pod, held in a `watch` channel so the HTTP layer reads the current set on
//! every request and a hung request resumes when `hang` is switched off.
//!
//! | fault | effect |
//! |---|---|
//! | `X-Return-Error: <status>` header | that request fails at once with `<status>` |
//! | `failure_rate` | that fraction of requests fails with `failure_status` (seeded RNG) |
//! | `added_latency_ms` | every inference request waits this long (simulated time) first |
//! | `hang` | inference requests are accepted and never answered while set |
//! | `stall_metrics` | `/metrics` keeps serving the text it had when the stall began |
//! | `unhealthy` | `/health` answers 503 |
//! | `gpu_memory_exhausted` | DCGM series report the GPU memory full (`/health` still 200) |
//!
//! Start-up delay and killing/restarting a pod live in `pod` and `cluster`.

use std::time::Duration;

use http::StatusCode;
use rand::Rng;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::sync::watch;

/// Request header that makes that request fail at once with its value as the status
/// (llm-d-inference-sim's name).
pub const RETURN_ERROR_HEADER: &str = "x-return-error";

/// Fault settings of one pod (also the JSON body of the admin endpoint).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Fraction of inference requests that fail, 0..=1.
    pub failure_rate: f64,
    /// Status of injected failures.
    pub failure_status: u16,
    /// Latency added before an inference request enters the engine.
    pub added_latency_ms: u64,
    /// Accept inference requests and never answer them.
    pub hang: bool,
    /// Freeze `/metrics` at its current text.
    pub stall_metrics: bool,
    /// Fail `/health`.
    pub unhealthy: bool,
    /// Report the framebuffer exhausted in the DCGM series (needs `--dcgm-metrics`).
    pub gpu_memory_exhausted: bool,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            failure_rate: 0.0,
            failure_status: 500,
            added_latency_ms: 0,
            hang: false,
            stall_metrics: false,
            unhealthy: false,
            gpu_memory_exhausted: false,
        }
    }
}

/// Why a fault request or header is invalid.
#[derive(Debug, Error)]
pub enum FaultError {
    #[error("X-Return-Error must be a status code 400..=599, got {0:?}")]
    BadReturnError(String),
}

impl Faults {
    pub(crate) fn problems(&self, out: &mut Vec<String>) {
        if !(0.0..=1.0).contains(&self.failure_rate) {
            out.push(format!(
                "failure-rate must be in 0..=1, got {}",
                self.failure_rate
            ));
        }
        if !(400..=599).contains(&self.failure_status) {
            out.push(format!(
                "failure-status must be 400..=599, got {}",
                self.failure_status
            ));
        }
    }

    pub fn added_latency(&self) -> Duration {
        Duration::from_millis(self.added_latency_ms)
    }

    /// The injected failure for one request, if any: the header wins, then the rate.
    pub fn injected_failure(
        &self,
        return_error: Option<&str>,
        rng: &mut impl Rng,
    ) -> Result<Option<StatusCode>, FaultError> {
        if let Some(raw) = return_error {
            let status = raw
                .trim()
                .parse::<u16>()
                .ok()
                .filter(|s| (400..=599).contains(s))
                .and_then(|s| StatusCode::from_u16(s).ok())
                .ok_or_else(|| FaultError::BadReturnError(raw.to_owned()))?;
            return Ok(Some(status));
        }
        if self.failure_rate > 0.0 && rng.random_bool(self.failure_rate) {
            return Ok(StatusCode::from_u16(self.failure_status).ok());
        }
        Ok(None)
    }
}

/// The shared, switchable fault set of one pod.
#[derive(Clone, Debug)]
pub struct FaultSwitch {
    tx: watch::Sender<Faults>,
}

impl FaultSwitch {
    pub fn new(initial: Faults) -> Self {
        Self {
            tx: watch::Sender::new(initial),
        }
    }

    pub fn current(&self) -> Faults {
        self.tx.borrow().clone()
    }

    /// Replaces the whole fault set.
    pub fn set(&self, faults: Faults) {
        self.tx.send_replace(faults);
    }

    /// Changes part of the fault set.
    pub fn update(&self, change: impl FnOnce(&mut Faults)) {
        self.tx.send_modify(change);
    }

    /// Resolves once `hang` is off (immediately if it is).
    pub async fn wait_unhung(&self) {
        let mut rx = self.tx.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|f| !f.hang).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    #[test]
    fn header_forces_the_given_status() {
        let mut rng = SmallRng::seed_from_u64(1);
        let got = Faults::default()
            .injected_failure(Some("503"), &mut rng)
            .unwrap();
        assert_eq!(got, Some(StatusCode::SERVICE_UNAVAILABLE));
        assert!(Faults::default()
            .injected_failure(Some("200"), &mut rng)
            .is_err());
    }

    #[test]
    fn failure_rate_is_honoured_with_a_seeded_rng() {
        let mut rng = SmallRng::seed_from_u64(7);
        let faults = Faults {
            failure_rate: 0.25,
            ..Faults::default()
        };
        let failed = (0..4000)
            .filter(|_| faults.injected_failure(None, &mut rng).unwrap().is_some())
            .count();
        assert!((800..1200).contains(&failed), "{failed}");
    }

    #[tokio::test]
    async fn a_hung_waiter_resumes_when_hang_is_cleared() {
        let switch = FaultSwitch::new(Faults {
            hang: true,
            ..Faults::default()
        });
        let waiter = switch.clone();
        let mut task = tokio::task::JoinSet::new();
        task.spawn(async move { waiter.wait_unhung().await });
        tokio::task::yield_now().await;
        assert!(task.try_join_next().is_none());
        switch.update(|f| f.hang = false);
        assert!(task.join_next().await.is_some());
    }
}
