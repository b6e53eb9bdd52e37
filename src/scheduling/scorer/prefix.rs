//! `prefix-cache-scorer`: prefer endpoints believed to hold the longest prefix of the prompt.
//!
//! The match lengths come from the approximate prefix index (`crate::prefix`), looked up by the
//! director before scheduling. Upstream scores `matched / total` blocks, which makes a fully
//! matched two-block prompt score as high as a 2,000-block one and hotspots short prompts
//! (upstream #2561). `matchLengthWeight` (w, default 0 = upstream) blends in the absolute match:
//! `score = (1 − w) · matched/total + w · min(1, matched_tokens / matchLengthTokens)`.
//! llm-d-router v0.10 has the same blend under other names: `matchLengthScaleTokens` (default
//! 8192), with the absolute term squared; epp reads it as llm-d does when that name is used.
//!
//! `prefixMatchInfoProducerName` (llm-d) names the producer whose matches are scored: an
//! `approx-prefix-cache-producer` (epp's routing history, the default) or a
//! `precise-prefix-cache-producer` (the pods' KV events), in which case the scheduler is built
//! with the precise scorer in this one's place (`crate::scheduling::profile`).
//!
//! On a multi-cluster hub, `multicluster-prefix-cache-scorer` and
//! `multicluster-approx-prefix-cache-producer` (llm-d v0.10, alpha) are this scorer and the
//! approximate producer: the candidates are clusters, so the index records which cluster
//! served a prefix, and upstream's types delegate to the pod ones without change.

use crate::plugin::Invalid;
use crate::request::tokenize::Vocabulary;
use crate::scheduling::{Candidate, SchedulingRequest};

/// Parameters shared by `prefix-cache-scorer` and `approx-prefix-cache-producer`.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct PrefixParams {
    /// Tokens per block; vLLM's default is 16.
    pub(crate) block_size_tokens: usize,
    /// Take block size and per-endpoint capacity from the pods' `cache_config_info`.
    pub(crate) auto_tune: bool,
    pub(crate) max_prefix_blocks_to_match: usize,
    /// When > 0, overrides `maxPrefixBlocksToMatch` as `tokens / blockSizeTokens`.
    pub(crate) max_prefix_tokens_to_match: usize,
    pub(crate) lru_capacity_per_server: usize,
    /// Upstream's legacy character block size; accepted only beside `blockSizeTokens`.
    pub(crate) block_size: Option<usize>,
    /// epp: weight of the absolute match length in the score (0..=1).
    pub(crate) match_length_weight: f64,
    /// epp: matched tokens that count as a full absolute match.
    pub(crate) match_length_tokens: usize,
    /// epp: tiktoken vocabulary used to tokenize prompts.
    pub(crate) tokenizer: Vocabulary,
    /// llm-d: the producer of the match information scored (by instance name).
    pub(crate) prefix_match_info_producer_name: Option<String>,
    /// llm-d: tokens that count as a full absolute match, the term squared.
    pub(crate) match_length_scale_tokens: Option<usize>,
}

/// How a matched prefix scores: `(1 − weight) · ratio + weight · length`, where `length` is
/// `min(1, matched_tokens / tokens)`, squared with llm-d's `matchLengthScaleTokens`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct MatchBlend {
    pub(crate) weight: f64,
    pub(crate) tokens: usize,
    pub(crate) squared: bool,
}

impl Default for MatchBlend {
    fn default() -> Self {
        Self {
            weight: 0.0,
            tokens: 1024,
            squared: false,
        }
    }
}

impl MatchBlend {
    /// The score of `matched` of `total` blocks of `block_size` tokens.
    pub(crate) fn score(&self, matched: usize, total: usize, block_size: usize) -> f64 {
        if total == 0 {
            return 0.0;
        }
        let ratio = matched as f64 / total as f64;
        if self.weight == 0.0 {
            return ratio;
        }
        let mut length = ((matched * block_size) as f64 / self.tokens.max(1) as f64).min(1.0);
        if self.squared {
            length *= length;
        }
        (1.0 - self.weight) * ratio + self.weight * length
    }
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
            prefix_match_info_producer_name: None,
            match_length_scale_tokens: None,
        }
    }
}

impl PrefixParams {
    /// Checks the values; `explicit_tokens` is whether the configuration set
    /// `blockSizeTokens` (the legacy character `blockSize` is accepted only beside it).
    pub(crate) fn validate(self, explicit_tokens: bool) -> Result<Self, Invalid> {
        if self.block_size.is_some() && !explicit_tokens {
            return Err(Invalid::new(
                "blockSize",
                "blockSize (characters) is no longer supported; set blockSizeTokens",
            ));
        }
        if self.match_length_scale_tokens == Some(0) {
            return Err(Invalid::new(
                "matchLengthScaleTokens",
                "matchLengthScaleTokens must be > 0",
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

    /// The score blend: llm-d's `matchLengthScaleTokens` (squared) when set, else epp's
    /// `matchLengthTokens` (linear).
    pub(crate) fn blend(&self) -> MatchBlend {
        MatchBlend {
            weight: self.match_length_weight,
            tokens: self
                .match_length_scale_tokens
                .unwrap_or(self.match_length_tokens),
            squared: self.match_length_scale_tokens.is_some(),
        }
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
    pub(crate) params: PrefixParams,
}

impl PrefixScorer {
    pub(crate) fn new(params: PrefixParams) -> Self {
        Self { params }
    }

    pub(crate) fn score(&self, req: &SchedulingRequest<'_>, pool: &[&Candidate], out: &mut [f64]) {
        let blend = self.params.blend();
        for (o, c) in out.iter_mut().zip(pool) {
            *o = blend.score(c.prefix_blocks, req.prefix_total_blocks, req.block_size);
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
        // llm-d's name squares the absolute term: 32 of 64 tokens = 0.25.
        let llmd = from_yaml(
            &serde_norway::from_str("{matchLengthWeight: 1, matchLengthScaleTokens: 64}").unwrap(),
        )
        .unwrap();
        assert_eq!(score(llmd.clone(), 2, &[2]), vec![0.25]);
        assert_eq!(score(llmd, 100, &[50]), vec![1.0]);
        let half = from_yaml(
            &serde_norway::from_str("{matchLengthWeight: 0.5, matchLengthScaleTokens: 64}")
                .unwrap(),
        )
        .unwrap();
        assert_eq!(score(half, 4, &[2]), vec![0.5 * 0.5 + 0.5 * 0.25]);
    }

    /// The parameters as the configuration decoder reads them.
    fn from_yaml(v: &serde_norway::Value) -> Result<PrefixParams, String> {
        let p: PrefixParams = crate::config::plugin::params(v).map_err(|e| e.to_string())?;
        p.validate(v.get("blockSizeTokens").is_some())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn parameters_are_strict_and_checked() {
        let ok: serde_norway::Value =
            serde_norway::from_str("{blockSizeTokens: 64, maxPrefixTokensToMatch: 4096}").unwrap();
        let p = from_yaml(&ok).unwrap();
        assert_eq!(p.max_blocks(64), 64);
        for bad in [
            "{blockSize: 64}",
            "{blockSizeTokens: 0}",
            "{matchLengthWeight: 2}",
            "{lruCapacity: 5}",
            "{tokenizer: gpt2}",
            "{matchLengthScaleTokens: 0}",
        ] {
            let v: serde_norway::Value = serde_norway::from_str(bad).unwrap();
            assert!(from_yaml(&v).is_err(), "{bad}");
        }
    }
}
