//! What one endpoint's time to first token is made of, learned online: the per-endpoint half of
//! the `estimated-ttft-scorer` (the scheduler only reads the result).
//!
//! # Model
//! For a request dispatched to an endpoint, with
//! - `W` = prompt tokens ahead of it that the pod has not prefilled yet (what epp dispatched there
//!   and has not seen a first token of, plus the pod's other waiting requests at the mean size)
//!   plus this request's own uncached tokens (prompt minus the prefix the pod held, from the
//!   response's `usage` once it is known),
//! - `R` = sequences the pod is decoding (scraped, or epp's in-flight count if larger),
//! - `Q` = requests waiting in the pod's queue (scraped plus dispatched since the scrape),
//!
//! `TTFT ≈ base + per_token · W + per_running · R + per_waiting · Q`, in seconds.
//! `per_token` is the inverse of the pod's prefill throughput, `per_running` what each decoding
//! sequence adds to the steps the prefill rides in, `per_waiting` what a queued request costs
//! beyond its tokens (a queue in vLLM means the batch is full: requests wait for slots).
//!
//! # Estimation
//! A ridge regression on exponentially time-decayed sufficient statistics (`τ` = [`DECAY`]):
//! `θ = (λ·P + Σ wᵢ xᵢxᵢᵀ)⁻¹ (λ·P·θ₀ + Σ wᵢ xᵢ yᵢ)`, the prior `θ₀` being the scorer's seed
//! (`peakPrefillThroughput` and friends) and `P` one pseudo-observation at typical feature sizes.
//! With no data the seed stands; a handful of observations move it; old ones fade, so a pod that
//! slowed down (gray failure, a noisy neighbour) is priced at its new speed within seconds and a
//! pod that recovered is priced back as its new samples arrive. Every pod has its own θ, so
//! heterogeneous GPUs are priced apart without configuration.
//!
//! Cost: the 4×4 solve (Cholesky) runs once per observed response, under the endpoint's own
//! mutex; decisions read the published coefficients without locking.

use std::time::{Duration, Instant};

/// Time constant of the decay of old observations.
pub const DECAY: Duration = Duration::from_secs(60);

/// Feature scales: one pseudo-observation of the prior sits at these sizes, and the solve works
/// in these units so the system stays well conditioned.
const SCALE: [f64; 4] = [1.0, 1000.0, 10.0, 1.0];

/// Strength of the prior, in observations.
const PRIOR_WEIGHT: f64 = 1.0;

/// Seconds: what each part of a request's wait costs on one endpoint.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Coefficients {
    /// Fixed part: one engine step, the network, the response path.
    pub base: f64,
    /// Per prompt token to prefill (ahead of the request, and its own).
    pub per_token: f64,
    /// Per sequence the pod is decoding.
    pub per_running: f64,
    /// Per request waiting in the pod's queue.
    pub per_waiting: f64,
}

impl Coefficients {
    fn scaled(&self) -> [f64; 4] {
        [
            self.base * SCALE[0],
            self.per_token * SCALE[1],
            self.per_running * SCALE[2],
            self.per_waiting * SCALE[3],
        ]
    }

    fn unscaled(v: [f64; 4]) -> Self {
        Self {
            base: v[0] / SCALE[0],
            per_token: v[1] / SCALE[1],
            per_running: v[2] / SCALE[2],
            per_waiting: v[3] / SCALE[3],
        }
    }

    /// The predicted TTFT (seconds) for `f`.
    pub fn predict(&self, f: &Features) -> f64 {
        self.base
            + self.per_token * (f.ahead_tokens + f.own_tokens)
            + self.per_running * f.running
            + self.per_waiting * f.waiting
    }

    /// Never negative, never NaN: a sample set that would fit a negative cost (collinear features)
    /// does not make an endpoint look free; the prefill rate keeps at least 2% of the seed's, and
    /// a queued request costs at least one base latency (in vLLM a queue means a full batch).
    fn clamped(self, prior: &Self) -> Self {
        let ok = |v: f64, min: f64| if v.is_finite() { v.max(min) } else { min };
        let base = ok(self.base, 0.0);
        Self {
            base,
            per_token: ok(self.per_token, prior.per_token * 0.02),
            per_running: ok(self.per_running, 0.0),
            per_waiting: ok(self.per_waiting, base),
        }
    }
}

/// What the pod faced when a request was dispatched to it (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Features {
    pub ahead_tokens: f64,
    pub own_tokens: f64,
    pub running: f64,
    pub waiting: f64,
}

impl Features {
    fn scaled(&self) -> [f64; 4] {
        [
            1.0,
            (self.ahead_tokens + self.own_tokens).max(0.0) / SCALE[1],
            self.running.max(0.0) / SCALE[2],
            self.waiting.max(0.0) / SCALE[3],
        ]
    }
}

/// The published state of one endpoint's model, read by every decision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Learned {
    pub coefficients: Coefficients,
    /// Decayed number of observations behind them.
    pub samples: f64,
    /// Mean uncached prompt tokens per request (the size of a queued request epp did not send).
    pub mean_tokens: f64,
}

/// The regression's state (one per endpoint, behind its mutex).
#[derive(Clone, Copy, Debug, Default)]
pub struct TtftModel {
    xx: [[f64; 4]; 4],
    xy: [f64; 4],
    weight: f64,
    mean_tokens: f64,
    stamp: Option<Instant>,
}

impl TtftModel {
    /// Adds one observation (`ttft` seconds for a request dispatched with `f`) and returns the
    /// refitted model; `prior` is the seed the fit shrinks toward.
    pub fn observe(&mut self, f: &Features, ttft: f64, prior: &Coefficients, now: Instant) -> Learned {
        let decay = self.stamp.map_or(1.0, |s| {
            (-now.saturating_duration_since(s).as_secs_f64() / DECAY.as_secs_f64()).exp()
        });
        self.stamp = Some(now);
        for row in &mut self.xx {
            row.iter_mut().for_each(|v| *v *= decay);
        }
        self.xy.iter_mut().for_each(|v| *v *= decay);
        self.weight *= decay;
        if ttft.is_finite() && ttft >= 0.0 {
            let x = f.scaled();
            for (i, row) in self.xx.iter_mut().enumerate() {
                for (j, v) in row.iter_mut().enumerate() {
                    *v += x[i] * x[j];
                }
                self.xy[i] += x[i] * ttft;
            }
            let w = 1.0 / (self.weight + 1.0);
            self.mean_tokens = self.mean_tokens * (1.0 - w) + f.own_tokens.max(0.0) * w;
            self.weight += 1.0;
        }
        self.learned(prior)
    }

    /// The ridge solution for the statistics so far.
    pub fn learned(&self, prior: &Coefficients) -> Learned {
        let p = prior.scaled();
        let mut a = self.xx;
        let mut b = self.xy;
        for i in 0..4 {
            a[i][i] += PRIOR_WEIGHT;
            b[i] += PRIOR_WEIGHT * p[i];
        }
        let coefficients = solve(a, b)
            .map_or(*prior, Coefficients::unscaled)
            .clamped(prior);
        Learned {
            coefficients,
            samples: self.weight,
            mean_tokens: self.mean_tokens,
        }
    }
}

/// Solves `a·x = b` for a symmetric positive definite `a` (Cholesky); `None` if it is not.
fn solve(a: [[f64; 4]; 4], b: [f64; 4]) -> Option<[f64; 4]> {
    let mut l = [[0.0f64; 4]; 4];
    for i in 0..4 {
        for j in 0..=i {
            let sum: f64 = (0..j).map(|k| l[i][k] * l[j][k]).sum();
            if i == j {
                let d = a[i][i] - sum;
                if d <= 0.0 || !d.is_finite() {
                    return None;
                }
                l[i][j] = d.sqrt();
            } else {
                l[i][j] = (a[i][j] - sum) / l[j][j];
            }
        }
    }
    let mut y = [0.0; 4];
    for i in 0..4 {
        y[i] = (b[i] - (0..i).map(|k| l[i][k] * y[k]).sum::<f64>()) / l[i][i];
    }
    let mut x = [0.0; 4];
    for i in (0..4).rev() {
        x[i] = (y[i] - (i + 1..4).map(|k| l[k][i] * x[k]).sum::<f64>()) / l[i][i];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: Coefficients = Coefficients {
        base: 0.03,
        per_token: 1.0 / 15_928.0,
        per_running: 0.001,
        per_waiting: 0.1,
    };

    fn truth(per_token: f64) -> Coefficients {
        Coefficients {
            base: 0.024,
            per_token,
            per_running: 0.0016,
            per_waiting: 0.05,
        }
    }

    /// Varied dispatches, as a busy pod sees them.
    fn features(i: usize) -> Features {
        Features {
            ahead_tokens: ((i * 7919) % 4000) as f64,
            own_tokens: ((i * 104_729) % 2500) as f64 + 20.0,
            running: ((i * 31) % 24) as f64,
            waiting: ((i * 17) % 5) as f64,
        }
    }

    #[test]
    fn without_observations_the_seed_stands() {
        let l = TtftModel::default().learned(&SEED);
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.max(1.0);
        assert!(close(l.coefficients.per_token, SEED.per_token), "{l:?}");
        assert!(close(l.coefficients.base, SEED.base), "{l:?}");
        assert_eq!(l.samples, 0.0);
    }

    #[test]
    fn learns_a_pod_eight_times_slower_than_the_seed_within_a_few_dozen_samples() {
        let t0 = Instant::now();
        let real = truth(8.0 / 15_928.0);
        let mut m = TtftModel::default();
        let mut learned = m.learned(&SEED);
        for i in 0..40 {
            let f = features(i);
            learned = m.observe(&f, real.predict(&f), &SEED, t0);
        }
        let f = Features {
            ahead_tokens: 3000.0,
            own_tokens: 1000.0,
            running: 8.0,
            waiting: 1.0,
        };
        let (got, want) = (learned.coefficients.predict(&f), real.predict(&f));
        assert!((got - want).abs() / want < 0.1, "{got} vs {want}: {learned:?}");
    }

    #[test]
    fn a_pod_that_slows_down_is_priced_at_its_new_speed_soon() {
        let t0 = Instant::now();
        let (fast, slow) = (truth(1.0 / 4000.0), truth(4.0 / 4000.0));
        let mut m = TtftModel::default();
        for i in 0..200 {
            let f = features(i);
            m.observe(&f, fast.predict(&f), &SEED, t0 + Duration::from_millis(i as u64 * 50));
        }
        let later = t0 + Duration::from_secs(10);
        let mut learned = m.learned(&SEED);
        for i in 0..15 {
            let f = features(1000 + i);
            let at = later + Duration::from_millis(i as u64 * 500);
            learned = m.observe(&f, slow.predict(&f), &SEED, at);
        }
        let rate = learned.coefficients.per_token;
        assert!(rate > 2.5 / 4000.0, "still priced near the old speed: {rate}");
    }

    #[test]
    fn degenerate_samples_never_give_a_negative_or_nan_cost() {
        let t0 = Instant::now();
        let mut m = TtftModel::default();
        let f = Features {
            own_tokens: 100.0,
            ..Features::default()
        };
        for _ in 0..50 {
            m.observe(&f, 0.0, &SEED, t0);
        }
        m.observe(&f, f64::NAN, &SEED, t0);
        let c = m.learned(&SEED).coefficients;
        for v in [c.base, c.per_token, c.per_running, c.per_waiting] {
            assert!(v.is_finite() && v >= 0.0, "{c:?}");
        }
        assert!(c.per_token > 0.0);
    }
}
