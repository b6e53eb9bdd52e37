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
//! The seed (the scorer's parameters: `peakPrefillThroughput` and friends) fixes the shape of
//! each half of the model, and each pod learns two factors: `step`, its slowness relative to the
//! seed on the per-step terms (`base + per_running · R + per_waiting · Q`), and `token`, on the
//! prefill term (`per_token · W`): the least-squares `(step, token)` of
//! `TTFT ≈ step · seed_step(features) + token · seed_tokens(features)` over exponentially
//! time-decayed observations (`τ` = [`DECAY`], at most [`MAX_WEIGHT`] of them), pulled toward the
//! one-factor fit (the same factor for both halves, itself shrunk toward 1 by one
//! pseudo-observation) by a ridge of [`RIDGE`]: where the two halves cannot be told apart (every
//! request the same size, no queue) the pod is priced by one factor, as before.
//!
//! Why two: one factor is right only when the seed's shape is. llm-d's default seed (15,928
//! tokens/s, a 30 ms step) is 8× too fast per token for the bench's pods but about right per
//! step, so one factor fitted to a pod's recent mix: a pod that had served a long prompt learned
//! 6–7, one that had served only short ones 3.3, and identical pods looked twice as fast as each
//! other; the "fast" ones drew up to 31% of the requests of the long/short mix (BENCHMARKS.md,
//! #20, "settling the default"). A four-coefficient regression was tried first and dropped: the
//! features of the step half move together (a long queue comes with many running sequences), so
//! a wrong seed let the fit trade one coefficient for another. Two halves are identifiable from
//! ordinary traffic (prompt sizes and the tokens ahead vary), and a pod that slowed down (gray
//! failure, a noisy neighbour) or a slower GPU is priced at its own speed within a few dozen
//! responses; a recovered pod is priced back as its new samples arrive.
//!
//! The factor is the pod's *speed*, so it is learned only from requests dispatched with no
//! request waiting there. Behind a queue the TTFT also holds what the linear terms cannot see
//! (vLLM admits a waiting request when KV frees, i.e. when decodes finish); learned from those,
//! the factor measured momentary congestion, differing between pods by several times over
//! capacity, and sessions left their homes for pods that only looked faster (BENCHMARKS.md, #20).
//! The queue is priced by the queue terms instead.
//!
//! Cost: two multiply-adds per observed response, under the endpoint's own mutex; decisions read
//! the published coefficients without locking.

use std::time::{Duration, Instant};

/// Time constant of the decay of old observations.
pub(crate) const DECAY: Duration = Duration::from_secs(30);

/// At most this many observations weigh in (older ones are discounted to make room), so a pod
/// whose speed changed is repriced within about this many responses however busy it was.
const MAX_WEIGHT: f64 = 16.0;

/// Strength of the prior (factor 1), in observations.
const PRIOR_WEIGHT: f64 = 1.0;

/// A request dispatched behind this many waiting requests does not teach the pod's speed.
const QUEUED: f64 = 1.0;

/// The learned factors stay within these bounds of the seed.
const FACTOR_RANGE: (f64, f64) = (1.0 / 64.0, 64.0);

/// Weight of the pull of the two factors toward the one-factor fit, as a fraction of each
/// half's own evidence (`Σ w·seed_step²`, `Σ w·seed_tokens²`).
const RIDGE: f64 = 0.1;

/// Seconds: what each part of a request's wait costs on one endpoint.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Coefficients {
    /// Fixed part: one engine step, the network, the response path.
    pub(crate) base: f64,
    /// Per prompt token to prefill (ahead of the request, and its own).
    pub(crate) per_token: f64,
    /// Per sequence the pod is decoding.
    pub(crate) per_running: f64,
    /// Per request waiting in the pod's queue.
    pub(crate) per_waiting: f64,
}

impl Coefficients {
    /// The predicted TTFT (seconds) for `f`.
    #[cfg(test)]
    pub(crate) fn predict(&self, f: &Features) -> f64 {
        self.base
            + self.per_token * (f.ahead_tokens + f.own_tokens)
            + self.per_running * f.running
            + self.per_waiting * f.waiting
    }

    /// The seed scaled by `factor`.
    #[cfg(test)]
    fn scaled(&self, factor: f64) -> Self {
        self.scaled2(factor, factor)
    }

    /// The seed with its per-step terms scaled by `step` and its per-token term by `token`.
    fn scaled2(&self, step: f64, token: f64) -> Self {
        Self {
            base: self.base * step,
            per_token: self.per_token * token,
            per_running: self.per_running * step,
            per_waiting: self.per_waiting * step,
        }
    }

    /// The per-step half of the prediction: `(base + per_running·R + per_waiting·Q, per_token·W)`.
    fn halves(&self, f: &Features) -> (f64, f64) {
        (
            self.base + self.per_running * f.running + self.per_waiting * f.waiting,
            self.per_token * (f.ahead_tokens + f.own_tokens),
        )
    }
}

/// What the pod faced when a request was dispatched to it (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Features {
    pub(crate) ahead_tokens: f64,
    pub(crate) own_tokens: f64,
    pub(crate) running: f64,
    pub(crate) waiting: f64,
}

/// The published state of one endpoint's model, read by every decision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Learned {
    pub(crate) coefficients: Coefficients,
    /// The pod's prefill slowness relative to the seed (2 = each token takes twice as long).
    pub(crate) factor: f64,
    /// The pod's per-step slowness relative to the seed.
    pub(crate) step_factor: f64,
    /// Decayed number of observations behind them.
    pub(crate) samples: f64,
    /// Mean uncached prompt tokens per request (the size of a queued request epp did not send).
    pub(crate) mean_tokens: f64,
}

/// The fit's state (one per endpoint, behind its mutex): decayed sums of `y·ŷ` and `ŷ²`, `ŷ`
/// being the seed's prediction and `y` the measured TTFT, and the same of the prediction's two
/// halves (`s` per step, `t` per token).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TtftModel {
    yp: f64,
    pp: f64,
    ys: f64,
    yt: f64,
    ss: f64,
    st: f64,
    tt: f64,
    /// The seed's mean prediction, where the prior's pseudo-observation sits.
    p_mean: f64,
    weight: f64,
    mean_tokens: f64,
    stamp: Option<Instant>,
}

impl TtftModel {
    /// Adds one observation (`ttft` seconds for a request dispatched with `f`) and returns the
    /// refitted model; `prior` is the seed it scales.
    pub(crate) fn observe(
        &mut self,
        f: &Features,
        ttft: f64,
        prior: &Coefficients,
        now: Instant,
    ) -> Learned {
        if f.waiting >= QUEUED {
            // A queue the model cannot see through (a KV-bound pod admits as decodes finish)
            // would be learned as slowness: its speed is measured on requests that did not queue.
            let w = 1.0 / (self.weight + 1.0);
            self.mean_tokens = self.mean_tokens * (1.0 - w) + f.own_tokens.max(0.0) * w;
            return self.learned(prior);
        }
        let decay = self.stamp.map_or(1.0, |s| {
            (-now.saturating_duration_since(s).as_secs_f64() / DECAY.as_secs_f64()).exp()
        });
        self.stamp = Some(now);
        let decay = decay * (MAX_WEIGHT / (self.weight * decay + 1.0).max(MAX_WEIGHT));
        for v in [
            &mut self.yp,
            &mut self.pp,
            &mut self.ys,
            &mut self.yt,
            &mut self.ss,
            &mut self.st,
            &mut self.tt,
            &mut self.weight,
        ] {
            *v *= decay;
        }
        let (s, t) = prior.halves(f);
        let predicted = s + t;
        if ttft.is_finite() && ttft >= 0.0 && predicted.is_finite() && predicted > 0.0 {
            self.yp += ttft * predicted;
            self.pp += predicted * predicted;
            self.ys += ttft * s;
            self.yt += ttft * t;
            self.ss += s * s;
            self.st += s * t;
            self.tt += t * t;
            let w = 1.0 / (self.weight + 1.0);
            self.p_mean = self.p_mean * (1.0 - w) + predicted * w;
            self.mean_tokens = self.mean_tokens * (1.0 - w) + f.own_tokens.max(0.0) * w;
            self.weight += 1.0;
        }
        self.learned(prior)
    }

    /// The fit for the observations so far.
    pub(crate) fn learned(&self, prior: &Coefficients) -> Learned {
        let one = self.one_factor();
        let (step, token) = self.two_factors(one);
        Learned {
            coefficients: prior.scaled2(step, token),
            factor: token,
            step_factor: step,
            samples: self.weight,
            mean_tokens: self.mean_tokens,
        }
    }

    /// One factor for the whole prediction, shrunk toward 1 by the prior.
    fn one_factor(&self) -> f64 {
        let anchor = PRIOR_WEIGHT * self.p_mean * self.p_mean;
        let factor = if self.pp + anchor > 0.0 {
            (self.yp + anchor) / (self.pp + anchor)
        } else {
            1.0
        };
        bounded(factor)
    }

    /// `(step, token)`: the ridge least squares of `y ≈ step·s + token·t`, pulled toward `one`.
    fn two_factors(&self, one: f64) -> (f64, f64) {
        let (ls, lt) = (RIDGE * self.ss, RIDGE * self.tt);
        let (a11, a12, a22) = (self.ss + ls, self.st, self.tt + lt);
        let (b1, b2) = (self.ys + ls * one, self.yt + lt * one);
        let det = a11 * a22 - a12 * a12;
        if !(det.is_finite() && det > 1e-12 * (a11 * a22).max(f64::MIN_POSITIVE)) {
            return (one, one);
        }
        let step = (b1 * a22 - a12 * b2) / det;
        let token = (a11 * b2 - a12 * b1) / det;
        (bounded(step), bounded(token))
    }
}

/// `v` within [`FACTOR_RANGE`] (1 when it is not a number).
fn bounded(v: f64) -> f64 {
    if v.is_finite() {
        v.clamp(FACTOR_RANGE.0, FACTOR_RANGE.1)
    } else {
        1.0
    }
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

    fn truth(slowness: f64) -> Coefficients {
        SEED.scaled(slowness)
    }

    /// Varied dispatches, as a busy pod sees them.
    fn features(i: usize) -> Features {
        Features {
            ahead_tokens: ((i * 7919) % 4000) as f64,
            own_tokens: ((i * 104_729) % 2500) as f64 + 20.0,
            running: ((i * 31) % 24) as f64,
            // One dispatch in five found a queue (those do not teach the speed).
            waiting: if i.is_multiple_of(5) {
                ((i * 17) % 5) as f64 + 1.0
            } else {
                0.0
            },
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
        let real = truth(8.0);
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
        assert!(
            (got - want).abs() / want < 0.1,
            "{got} vs {want}: {learned:?}"
        );
    }

    #[test]
    fn a_pod_that_slows_down_is_priced_at_its_new_speed_soon() {
        let t0 = Instant::now();
        let (fast, slow) = (truth(4.0), truth(16.0));
        let mut m = TtftModel::default();
        for i in 0..200 {
            let f = features(i);
            m.observe(
                &f,
                fast.predict(&f),
                &SEED,
                t0 + Duration::from_millis(i as u64 * 50),
            );
        }
        let later = t0 + Duration::from_secs(10);
        let mut learned = m.learned(&SEED);
        for i in 0..15 {
            let f = features(1000 + i);
            let at = later + Duration::from_millis(i as u64 * 500);
            learned = m.observe(&f, slow.predict(&f), &SEED, at);
        }
        let factor = learned.factor;
        assert!(factor > 10.0, "still priced near the old speed: {factor}");
    }

    #[test]
    fn a_slow_response_behind_a_queue_does_not_make_the_pod_look_slow() {
        let t0 = Instant::now();
        let real = truth(2.0);
        let mut m = TtftModel::default();
        for i in 0..30 {
            let f = Features {
                waiting: 0.0,
                ..features(i)
            };
            m.observe(&f, real.predict(&f), &SEED, t0);
        }
        let before = m.learned(&SEED).factor;
        for i in 0..30 {
            let f = Features {
                waiting: 4.0,
                ..features(i)
            };
            // Ten times what the terms predict: waiting for KV, not for tokens.
            m.observe(&f, real.predict(&f) * 10.0, &SEED, t0);
        }
        let after = m.learned(&SEED).factor;
        assert!((1.7..2.3).contains(&before), "{before}");
        assert_eq!(before, after);
    }

    #[test]
    fn noisy_samples_around_the_truth_give_its_factor() {
        let t0 = Instant::now();
        let real = truth(3.0);
        let mut m = TtftModel::default();
        let mut learned = m.learned(&SEED);
        for i in 0..60 {
            let f = features(i);
            let noise = if i % 2 == 0 { 1.3 } else { 0.7 };
            learned = m.observe(&f, real.predict(&f) * noise, &SEED, t0);
        }
        assert!((2.5..3.5).contains(&learned.factor), "{learned:?}");
    }

    #[test]
    fn identical_pods_serving_different_prompt_mixes_price_a_request_alike() {
        // The pods' truth has another shape than the seed: a 24 ms step (the seed says 30) and
        // 0.5 ms per prompt token (the seed: 8 times less).
        let real = Coefficients {
            base: 0.024,
            per_token: 0.0005,
            per_running: 0.0016,
            per_waiting: 0.0,
        };
        let t0 = Instant::now();
        let short = |i: usize| Features {
            ahead_tokens: ((i * 37) % 3) as f64 * 150.0,
            own_tokens: 100.0 + ((i * 53) % 100) as f64,
            running: ((i * 7) % 6) as f64,
            waiting: 0.0,
        };
        let (mut only_short, mut mixed) = (TtftModel::default(), TtftModel::default());
        for i in 0..40 {
            let s = short(i);
            only_short.observe(&s, real.predict(&s), &SEED, t0);
            // One request in eight on the other pod is a long prompt.
            let m = if i % 8 == 3 {
                Features {
                    own_tokens: 6000.0,
                    ..s
                }
            } else {
                s
            };
            mixed.observe(&m, real.predict(&m), &SEED, t0);
        }
        let probe = short(1000);
        let a = only_short.learned(&SEED).coefficients.predict(&probe);
        let b = mixed.learned(&SEED).coefficients.predict(&probe);
        let want = real.predict(&probe);
        // One factor priced the pod that saw long prompts twice as high for the same request.
        assert!((a / b - 1.0).abs() < 0.1, "{a} vs {b}");
        for got in [a, b] {
            assert!((got - want).abs() / want < 0.2, "{a} {b} vs {want}");
        }
        // The pod that saw long prompts prices them right too.
        let long = Features {
            own_tokens: 6000.0,
            ..probe
        };
        let got = mixed.learned(&SEED).coefficients.predict(&long);
        assert!((got / real.predict(&long) - 1.0).abs() < 0.1, "{got}");
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
