//! The `concurrency-detector` (llm-d's `saturationdetector/concurrency`): saturation from the
//! requests and tokens epp itself has in flight on each endpoint, not from scraped metrics.
//!
//! With `N` endpoints: `requests` mode `Σ requests / (N · maxConcurrency)`; `tokens` mode
//! `Σ tokens / (N · maxTokenConcurrency)`; `hybrid` the mean over endpoints of the larger of
//! the two ratios; no endpoints is 1.0. In-flight requests end with their response; in-flight
//! tokens are a request's uncached prompt tokens until its first token (upstream's
//! `inflight-load-producer`). `headroom` only matters when upstream also runs the detector as a
//! filter, which epp does not; it is accepted and checked.

use crate::plugin::Invalid;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Requests,
    Tokens,
    Hybrid,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Concurrency {
    pub(crate) max_requests: f64,
    pub(crate) max_tokens: f64,
    pub(crate) mode: Mode,
    pub(crate) headroom: f64,
}

/// Upstream's defaults: 100 requests, a million tokens, `requests` mode, no headroom.
impl Default for Concurrency {
    fn default() -> Self {
        Self {
            max_requests: 100.0,
            max_tokens: 1_000_000.0,
            mode: Mode::Requests,
            headroom: 0.0,
        }
    }
}

/// The `concurrency-detector` plugin's parameters, as configured.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ConcurrencyParams {
    max_concurrency: Option<i64>,
    headroom: Option<f64>,
    concurrency_mode: Option<String>,
    max_token_concurrency: Option<i64>,
    /// Names the in-flight load producer; epp has one, so any name is accepted.
    #[serde(default)]
    in_flight_load_producer_name: String,
}

impl Concurrency {
    /// The detector these parameters configure, checked with upstream's messages: one error
    /// listing every problem, as upstream reports it.
    pub(crate) fn from_params(p: ConcurrencyParams) -> Result<Self, Invalid> {
        let d = Self::default();
        let max_requests = p.max_concurrency.unwrap_or(d.max_requests as i64);
        let max_tokens = p.max_token_concurrency.unwrap_or(d.max_tokens as i64);
        let headroom = p.headroom.unwrap_or(d.headroom);
        let _ = p.in_flight_load_producer_name;
        let mut errs: Vec<(&'static str, String)> = Vec::new();
        if max_requests <= 0 {
            errs.push((
                "maxConcurrency",
                format!("maxConcurrency must be strictly positive, got {max_requests}"),
            ));
        }
        if headroom < 0.0 {
            errs.push((
                "headroom",
                format!("headroom must be a non-negative value, got {headroom:.6}"),
            ));
        }
        if max_tokens <= 0 {
            errs.push((
                "maxTokenConcurrency",
                format!("maxTokenConcurrency must be strictly positive, got {max_tokens}"),
            ));
        }
        let mode = match p.concurrency_mode.as_deref().unwrap_or("requests") {
            "requests" => Mode::Requests,
            "tokens" => Mode::Tokens,
            "hybrid" => Mode::Hybrid,
            other => {
                errs.push((
                    "concurrencyMode",
                    format!("unsupported concurrencyMode: {other:?}"),
                ));
                Mode::Requests
            }
        };
        if let Some((parameter, _)) = errs.first() {
            let all: Vec<&str> = errs.iter().map(|(_, m)| m.as_str()).collect();
            return Err(Invalid::new(
                parameter,
                format!(
                    "invalid concurrency detector configuration: {}",
                    all.join("\n")
                ),
            ));
        }
        Ok(Self {
            max_requests: max_requests as f64,
            max_tokens: max_tokens as f64,
            mode,
            headroom,
        })
    }

    /// The pool's saturation over `(in-flight requests, in-flight tokens)` per endpoint.
    pub(crate) fn saturation(&self, loads: impl Iterator<Item = (f64, f64)>) -> f64 {
        let (mut n, mut requests, mut tokens, mut hybrid) = (0.0, 0.0, 0.0, 0.0);
        for (r, t) in loads {
            n += 1.0;
            requests += r;
            tokens += t;
            hybrid += f64::max(r / self.max_requests, t / self.max_tokens);
        }
        if n == 0.0 {
            return 1.0;
        }
        match self.mode {
            Mode::Requests => requests / (n * self.max_requests),
            Mode::Tokens => tokens / (n * self.max_tokens),
            Mode::Hybrid => hybrid / n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::plugin::{NamedPlugin, Plugin};
    use crate::config::{PluginSpec, Problem};

    /// The detector the configuration decoder makes of these parameters.
    fn from_spec(params: &str) -> Result<Concurrency, Vec<Problem>> {
        let text = format!("type: concurrency-detector\nparameters: {params}\n");
        let spec: PluginSpec = serde_norway::from_str(&text).unwrap();
        match NamedPlugin::decode(&spec, Default::default())?.plugin {
            Plugin::ConcurrencyDetector(c) => Ok(c),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn saturation_per_mode() {
        let c = from_spec("{maxConcurrency: 10, maxTokenConcurrency: 1000}").unwrap();
        let loads = [(5.0, 100.0), (15.0, 1500.0)];
        let table = [
            (Mode::Requests, 1.0),
            (Mode::Tokens, 0.8),
            (Mode::Hybrid, 1.0),
        ];
        for (mode, want) in table {
            let c = Concurrency { mode, ..c };
            assert!(
                (c.saturation(loads.into_iter()) - want).abs() < 1e-12,
                "{mode:?}"
            );
            assert_eq!(c.saturation(std::iter::empty()), 1.0);
        }
        let hybrid = Concurrency {
            mode: Mode::Hybrid,
            ..c
        };
        assert!((hybrid.saturation([(1.0, 900.0), (5.0, 0.0)].into_iter()) - 0.7).abs() < 1e-12);
    }

    #[test]
    fn parameters_default_and_check_as_upstream() {
        let d = from_spec("~").unwrap();
        assert_eq!(
            (d.max_requests, d.max_tokens, d.mode, d.headroom),
            (100.0, 1e6, Mode::Requests, 0.0)
        );
        let err = from_spec("{maxConcurrency: 0, concurrencyMode: burst}").unwrap_err();
        let text = err[0].to_string();
        assert!(text.contains("invalid concurrency detector configuration: maxConcurrency must be strictly positive, got 0"), "{text}");
        assert!(
            text.contains("unsupported concurrencyMode: \"burst\""),
            "{text}"
        );
        assert!(from_spec("{maxConcurency: 3}").is_err());
    }
}
