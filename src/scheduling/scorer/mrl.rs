//! `mrl-scorer-hub` (llm-d-router v0.11, alpha): each candidate's expected remaining work,
//! the sum over the requests in flight on it of their mean residual life, from the digests
//! its `sojourn-time-observer-hub` learned ([`crate::scheduling::producer`]); the least
//! residual work scores 1.
//!
//! A request still waiting for its first chunk, dispatched `a` seconds ago, owes
//! MRL_ttft(a) + E[decode]; one decoding for `a` seconds owes MRL_decode(a). Scores are
//! (max − r) / (max − min) over the warm candidates' residuals. A cold candidate (digests
//! not yet warm) is seeded at the least residual; with probability `explorationRate` it is
//! probed (scored 1), otherwise it scores 0 when the warm residuals differ. With every
//! candidate cold, or all residuals equal, everyone scores 1.

use crate::plugin::Invalid;
use crate::scheduling::producer::{Sojourn, SojournObserver};
use crate::scheduling::{Candidate, SchedulingRequest};
use rand::Rng;
use std::time::Instant;

#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct MrlScorer {
    /// Probability that a cold endpoint is probed, in [0, 1].
    pub(crate) exploration_rate: f64,
    /// The `sojourn-time-observer-hub` instance read (empty: the configured one).
    pub(crate) sojourn_time_observer_producer_name: String,
    /// The observer, bound when the scheduler is assembled.
    #[serde(skip)]
    pub(crate) observer: Option<SojournObserver>,
}

impl Default for MrlScorer {
    fn default() -> Self {
        Self {
            exploration_rate: 0.1,
            sojourn_time_observer_producer_name: String::new(),
            observer: None,
        }
    }
}

/// The expected remaining work of the requests in flight on one endpoint, seconds.
pub(crate) fn residual(s: Sojourn<'_>, now: Instant) -> f64 {
    let mean_decode = s.decode.mean();
    s.inflight()
        .map(|r| match r.first_chunk {
            None => {
                let age = now.saturating_duration_since(r.dispatched).as_secs_f64();
                s.ttft.mrl(age) + mean_decode
            }
            Some(f) => s.decode.mrl(now.saturating_duration_since(f).as_secs_f64()),
        })
        .sum()
}

impl MrlScorer {
    pub(crate) fn validate(self) -> Result<Self, Invalid> {
        if !(0.0..=1.0).contains(&self.exploration_rate) {
            let got = self.exploration_rate;
            return Err(Invalid::new(
                "explorationRate",
                format!("explorationRate must be in [0, 1], got {got}"),
            ));
        }
        Ok(self)
    }

    /// The producer instance named (`None`: whichever is configured).
    pub(crate) fn producer_name(&self) -> Option<&str> {
        Some(self.sojourn_time_observer_producer_name.as_str()).filter(|n| !n.is_empty())
    }

    pub(crate) fn score(
        &self,
        req: &SchedulingRequest<'_>,
        pool: &[&Candidate],
        out: &mut [f64],
        rng: &mut impl Rng,
    ) {
        let residuals: Vec<Option<f64>> = pool
            .iter()
            .map(|c| {
                let o = self.observer.as_ref()?;
                o.read(c.id, |s| s.warm.then(|| residual(s, req.now)))
                    .flatten()
            })
            .collect();
        self.normalise(&residuals, out, || rng.random::<f64>());
    }

    /// Min-max normalised scores over the warm residuals (`None`: cold), cold endpoints
    /// seeded at the least, then the exploration coin (`coin` draws in [0, 1)).
    fn normalise(&self, residuals: &[Option<f64>], out: &mut [f64], mut coin: impl FnMut() -> f64) {
        let Some(least) = residuals.iter().flatten().copied().reduce(f64::min) else {
            out.fill(1.0);
            return;
        };
        super::min_max_inverse(residuals.iter().map(|r| r.unwrap_or(least)), out);
        let spread = residuals.iter().flatten().any(|r| *r > least);
        for (o, r) in out.iter_mut().zip(residuals) {
            if self.exploration_rate > 0.0 && r.is_none() {
                if coin() < self.exploration_rate {
                    *o = 1.0;
                } else if spread {
                    *o = 0.0;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
