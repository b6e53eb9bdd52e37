//! `inflight-load-producer` (llm-d) parameters. The producer itself is built in: the director
//! counts each endpoint's in-flight requests (an `InflightGuard` held until the response ends)
//! and in-flight tokens (the request's uncached prompt tokens, a `PrefillGuard` held until the
//! first response byte), which is what upstream's producer counts with
//! `addEstimatedOutputTokens: false`. Its parameters are still decoded strictly and checked
//! with upstream's messages, so a configuration epp cannot honour is refused, not ignored.

use crate::plugin::Invalid;

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub(crate) struct InflightLoadParams {
    /// Count an estimate of the output tokens too, until the response ends (refused: epp
    /// releases a request's tokens at its first token).
    pub(crate) add_estimated_output_tokens: bool,
    /// Output tokens per input token for that estimate (default 1.5, ≥ 0).
    pub(crate) output_ratio: Option<f64>,
    /// Cap of that estimate (≥ 0; absent: no cap).
    pub(crate) max_estimated_output_tokens: Option<i64>,
    /// Names the prefix producer; epp has one, so any name is accepted.
    pub(crate) prefix_match_info_producer_name: String,
    /// Share counters between replicas (upstream default true); epp's counters are per
    /// replica, which is what each replica routes on either way.
    pub(crate) sync_cross_replica_state: Option<bool>,
}

impl InflightLoadParams {
    pub(crate) fn validate(self) -> Result<Self, Invalid> {
        if let Some(r) = self.output_ratio.filter(|r| *r < 0.0) {
            return Err(Invalid::new(
                "outputRatio",
                format!("outputRatio must be non-negative, got {r}"),
            ));
        }
        if let Some(m) = self.max_estimated_output_tokens.filter(|m| *m < 0) {
            return Err(Invalid::new(
                "maxEstimatedOutputTokens",
                format!("maxEstimatedOutputTokens must be non-negative, got {m}"),
            ));
        }
        if self.add_estimated_output_tokens {
            return Err(Invalid::new("addEstimatedOutputTokens", "addEstimatedOutputTokens: true is not supported by epp (it counts a request's uncached prompt tokens until its first token)"));
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::plugin::params;

    fn check(yaml: &str) -> Result<InflightLoadParams, String> {
        let v: serde_norway::Value = serde_norway::from_str(yaml).unwrap();
        params::<InflightLoadParams>(&v)
            .map_err(|e| e.to_string())?
            .validate()
            .map_err(|e| e.to_string())
    }

    #[test]
    fn parameters_are_strict_and_checked() {
        assert!(check("~").is_ok());
        assert!(check("{outputRatio: 2, maxEstimatedOutputTokens: 10, syncCrossReplicaState: false, prefixMatchInfoProducerName: p}").is_ok());
        let bad = [
            (
                "outputRatio: -1.5",
                "outputRatio must be non-negative, got -1.5",
            ),
            (
                "maxEstimatedOutputTokens: -3",
                "maxEstimatedOutputTokens must be non-negative, got -3",
            ),
            ("addEstimatedOutputTokens: true", "not supported by epp"),
            ("outputRatios: 1", "unknown field `outputRatios`"),
        ];
        for (yaml, want) in bad {
            let err = check(yaml).unwrap_err();
            assert!(err.contains(want), "{yaml}: {err}");
        }
    }
}
