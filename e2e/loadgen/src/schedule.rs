//! When requests are sent: open loop (Poisson or constant arrivals over one or more rate stages)
//! or closed loop (a fixed number of requests in flight). Arrival times are computed up front
//! from the seed, so two runs offer exactly the same load.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// One open-loop stage: `rate` requests per second for `duration`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Stage {
    pub rate: f64,
    #[serde(serialize_with = "secs")]
    pub duration: Duration,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// How load is offered.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Load {
    /// Arrivals at the stages' rates, exponential gaps when `poisson`, else evenly spaced.
    Open { stages: Vec<Stage>, poisson: bool },
    /// `concurrency` requests always in flight.
    Closed { concurrency: usize },
}

/// One planned arrival of an open-loop run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Arrival {
    /// Offset from the start of the run.
    pub at: Duration,
    pub stage: usize,
}

impl Load {
    /// Parses `rate:secs,rate:secs,...` (e.g. `5:30,10:30`).
    pub fn parse_stages(text: &str) -> Option<Vec<Stage>> {
        text.split(',')
            .map(|s| {
                let (rate, secs) = s.split_once(':')?;
                let rate: f64 = rate.trim().parse().ok()?;
                let secs: f64 = secs.trim().parse().ok()?;
                (rate > 0.0 && secs > 0.0).then(|| Stage {
                    rate,
                    duration: Duration::from_secs_f64(secs),
                })
            })
            .collect()
    }

    /// Total planned duration of an open-loop run (`None` for closed loop).
    pub fn planned(&self) -> Option<Duration> {
        match self {
            Load::Open { stages, .. } => Some(stages.iter().map(|s| s.duration).sum()),
            Load::Closed { .. } => None,
        }
    }
}

/// The arrival times of an open-loop run, at most `max_requests` of them.
pub fn arrivals(stages: &[Stage], poisson: bool, max_requests: usize, seed: u64) -> Vec<Arrival> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed_a771);
    let mut out = Vec::new();
    let mut stage_start = 0.0;
    for (i, stage) in stages.iter().enumerate() {
        let end = stage_start + stage.duration.as_secs_f64();
        let mut t = stage_start;
        loop {
            let gap = if poisson {
                -rng.random_range(f64::EPSILON..1.0f64).ln() / stage.rate
            } else {
                1.0 / stage.rate
            };
            t += gap;
            if t >= end || out.len() >= max_requests {
                break;
            }
            out.push(Arrival {
                at: Duration::from_secs_f64(t),
                stage: i,
            });
        }
        stage_start = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_parse_from_rate_colon_seconds() {
        let s = Load::parse_stages("2:10, 4.5:1").expect("stages");
        assert_eq!(
            s,
            vec![
                Stage {
                    rate: 2.0,
                    duration: Duration::from_secs(10)
                },
                Stage {
                    rate: 4.5,
                    duration: Duration::from_secs(1)
                }
            ]
        );
        assert_eq!(Load::parse_stages("2"), None);
        assert_eq!(Load::parse_stages("0:3"), None);
    }

    #[test]
    fn constant_arrivals_are_evenly_spaced_per_stage() {
        let stages = Load::parse_stages("2:2,4:1").expect("stages");
        let a = arrivals(&stages, false, 100, 0);
        let times: Vec<f64> = a.iter().map(|x| x.at.as_secs_f64()).collect();
        assert_eq!(times.len(), 3 + 3);
        assert!((times[0] - 0.5).abs() < 1e-9 && (times[3] - 2.25).abs() < 1e-9);
        assert_eq!(a[3].stage, 1);
    }

    #[test]
    fn poisson_arrivals_match_the_rate_and_the_seed() {
        let stages = Load::parse_stages("50:20").expect("stages");
        let a = arrivals(&stages, true, 10_000, 5);
        assert!((900..1100).contains(&a.len()), "{} arrivals", a.len());
        assert_eq!(a, arrivals(&stages, true, 10_000, 5));
        assert_eq!(arrivals(&stages, true, 7, 5).len(), 7);
    }

    #[test]
    fn poisson_arrivals_are_unbiased_over_many_seeds() {
        let stages = Load::parse_stages("8.5:30").expect("stages");
        let counts: Vec<usize> = (0..200)
            .map(|seed| arrivals(&stages, true, 10_000, seed).len())
            .collect();
        let mean = counts.iter().sum::<usize>() as f64 / counts.len() as f64;
        assert!(
            (mean - 255.0).abs() < 4.0,
            "mean {mean} arrivals, expected 255; seed 1 gives {}",
            counts[1]
        );
    }
}
