//! `prefix-cache-scorer`: prefer endpoints believed to hold the longest prefix of the prompt.
//!
//! The match lengths come from the approximate prefix index (`crate::prefix`), looked up by the
//! director before scheduling. Upstream scores `matched / total` blocks, which makes a fully
//! matched two-block prompt score as high as a 2,000-block one and hotspots short prompts
//! (upstream #2561). `matchLengthWeight` (w, default 0 = upstream) blends in the absolute match:
//! `score = (1 − w) · matched/total + w · min(1, matched_tokens / matchLengthTokens)`.

use crate::plugin::Invalid;
use crate::request::tokenize::Vocabulary;
use crate::scheduling::{Candidate, SchedulingRequest};

/// Parameters shared by `prefix-cache-scorer` and `approx-prefix-cache-producer`.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct PrefixParams {
    /// Tokens per block; vLLM's default is 16.
    pub block_size_tokens: usize,
    /// Take block size and per-endpoint capacity from the pods' `cache_config_info`.
    pub auto_tune: bool,
    pub max_prefix_blocks_to_match: usize,
    /// When > 0, overrides `maxPrefixBlocksToMatch` as `tokens / blockSizeTokens`.
    pub max_prefix_tokens_to_match: usize,
    pub lru_capacity_per_server: usize,
    /// Upstream's legacy character block size; accepted only beside `blockSizeTokens`.
    pub block_size: Option<usize>,
    /// epp: weight of the absolute match length in the score (0..=1).
    pub match_length_weight: f64,
    /// epp: matched tokens that count as a full absolute match.
    pub match_length_tokens: usize,
    /// epp: tiktoken vocabulary used to tokenize prompts.
    pub tokenizer: Vocabulary,
}

impl Default for PrefixParams {
    fn default() -> Self {
        Self {
            block_size_tokens: 16,
            auto_tune: true,
            max_prefix_blocks_to_match: 256,
            max_prefix_tokens_to_match: 0,
            lru_capacity_per_server: 31_250,
            block_size: None,
            match_length_weight: 0.0,
            match_length_tokens: 1024,
            tokenizer: Vocabulary::default(),
        }
    }
}

impl PrefixParams {
    /// Checks the values; `explicit_tokens` is whether the configuration set
    /// `blockSizeTokens` (the legacy character `blockSize` is accepted only beside it).
    pub fn validate(self, explicit_tokens: bool) -> Result<Self, Invalid> {
        if self.block_size.is_some() && !explicit_tokens {
            return Err(Invalid::new(
                "blockSize",
                "blockSize (characters) is no longer supported; set blockSizeTokens",
            ));
        }
        if self.block_size_tokens == 0 || self.match_length_tokens == 0 {
            return Err(Invalid::new(
                "blockSizeTokens, matchLengthTokens",
                "blockSizeTokens and matchLengthTokens must be > 0",
            ));
        }
        if !(0.0..=1.0).contains(&self.match_length_weight) {
            return Err(Invalid::new(
                "matchLengthWeight",
                "matchLengthWeight must be within 0..=1",
            ));
        }
        Ok(self)
    }

    /// The most blocks a request is hashed into, for a given block size.
    pub fn max_blocks(&self, block_size: usize) -> usize {
        if self.max_prefix_tokens_to_match > 0 {
            self.max_prefix_tokens_to_match / block_size.max(1)
        } else {
            self.max_prefix_blocks_to_match
        }
    }
}

#[derive(Clone, Debug)]
pub struct PrefixScorer {
    pub params: PrefixParams,
}

impl PrefixScorer {
    pub fn new(params: PrefixParams) -> Self {
        Self { params }
    }

    pub fn score(&self, req: &SchedulingRequest<'_>, pool: &[&Candidate], out: &mut [f64]) {
        let w = self.params.match_length_weight;
        let norm = self.params.match_length_tokens as f64;
        for (o, c) in out.iter_mut().zip(pool) {
            if req.prefix_total_blocks == 0 {
                *o = 0.0;
                continue;
            }
            let ratio = c.prefix_blocks as f64 / req.prefix_total_blocks as f64;
            let absolute = ((c.prefix_blocks * req.block_size) as f64 / norm).min(1.0);
            *o = (1.0 - w) * ratio + w * absolute;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::cand;

    fn score(params: PrefixParams, total: usize, matched: &[usize]) -> Vec<f64> {
        let cands: Vec<Candidate> = matched
            .iter()
            .enumerate()
            .map(|(i, m)| cand(i as u16, 0.0, 0.0, *m))
            .collect();
        let req = SchedulingRequest {
            prefix_total_blocks: total,
            block_size: 16,
            ..Default::default()
        };
        let mut out = vec![0.0; cands.len()];
        PrefixScorer::new(params).score(&req, &cands.iter().collect::<Vec<_>>(), &mut out);
        out
    }

    #[test]
    fn ratio_by_default_and_absolute_length_when_weighted() {
        assert_eq!(
            score(PrefixParams::default(), 4, &[4, 1, 0]),
            vec![1.0, 0.25, 0.0]
        );
        assert_eq!(score(PrefixParams::default(), 0, &[0]), vec![0.0]);
        let weighted = PrefixParams {
            match_length_weight: 1.0,
            match_length_tokens: 64,
            ..Default::default()
        };
        assert_eq!(
            score(weighted.clone(), 2, &[2]),
            vec![0.5],
            "2 blocks of 16 = half of 64 tokens"
        );
        assert_eq!(score(weighted, 100, &[50]), vec![1.0]);
    }

    /// The parameters as the configuration decoder reads them.
    fn from_yaml(v: &serde_yaml::Value) -> Result<PrefixParams, String> {
        let p: PrefixParams = crate::config::plugin::params(v).map_err(|e| e.to_string())?;
        p.validate(v.get("blockSizeTokens").is_some())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn parameters_are_strict_and_checked() {
        let ok: serde_yaml::Value =
            serde_yaml::from_str("{blockSizeTokens: 64, maxPrefixTokensToMatch: 4096}").unwrap();
        let p = from_yaml(&ok).unwrap();
        assert_eq!(p.max_blocks(64), 64);
        for bad in [
            "{blockSize: 64}",
            "{blockSizeTokens: 0}",
            "{matchLengthWeight: 2}",
            "{lruCapacity: 5}",
            "{tokenizer: gpt2}",
        ] {
            let v: serde_yaml::Value = serde_yaml::from_str(bad).unwrap();
            assert!(from_yaml(&v).is_err(), "{bad}");
        }
    }
}
