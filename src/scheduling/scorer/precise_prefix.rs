//! `precise-prefix-cache-scorer` (llm-d's name): prefer endpoints whose KV cache **actually**
//! holds the longest consecutive prefix of the prompt, as announced by the pods' KV-cache events
//! (`crate::kvevents` → `crate::prefix::precise`), rather than as epp guesses from its own
//! routing.
//!
//! Score: `matched / total` blocks, as llm-d normalises it, **except** on a saturated
//! candidate (queue ≥ `saturationQueueDepth` or KV usage ≥ `saturationKvUsage`, upstream's
//! saturation thresholds by default), which scores 0: a cached prefix saves prefill time, but
//! never as much as a long queue costs, so affinity must not pile requests onto a pod that is
//! already saturated. Below saturation the weights decide: in the recommended profile
//! (README, "Precise prefix") the queue and KV-cache scorers weigh as much together as this one,
//! so a full prefix match beats an idle pod only while the cached pod's queue is shorter than the
//! others' by less than the match is worth.
//!
//! The director computes the request's block keys from the same tokens the pod hashed
//! (completions: the prompt as-is; chat: `crate::request::chat`'s template) and looks them up;
//! the block size is the one the pods announce in their events (`blockSize` until the first).

use crate::plugin::Invalid;
use crate::request::hf::LocalTokenizer;
use crate::request::tokenize::{TokenizerSource, Vocabulary};
use crate::scheduling::{Candidate, SchedulingRequest};
use std::time::Duration;

/// Parameters of `precise-prefix-cache-scorer`.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct PrecisePrefixParams {
    /// Tokens per block until the pods announce theirs (vLLM's default 16).
    pub(crate) block_size: usize,
    pub(crate) max_prefix_blocks_to_match: usize,
    /// Count the blocks of a routed request as held until its BlockStored arrives.
    pub(crate) speculative_indexing: bool,
    /// How long a speculative entry lives (llm-d: `speculativeTTL`, "2s").
    #[serde(
        rename = "speculativeTTL",
        deserialize_with = "crate::duration::deserialize"
    )]
    pub(crate) speculative_ttl: Duration,
    /// A candidate with this many waiting requests or more gets no prefix credit.
    pub(crate) saturation_queue_depth: f64,
    /// A candidate with this KV-cache usage or more gets no prefix credit.
    pub(crate) saturation_kv_usage: f64,
    /// The tiktoken vocabulary of the model (the pods' tokenizer), unless `local` names a file.
    pub(crate) tokenizer: Vocabulary,
    /// The model's Hugging Face `tokenizer.json`, from llm-d's
    /// `indexerConfig.tokenizersPoolConfig.local` (takes precedence over `tokenizer`).
    #[serde(skip)]
    pub(crate) local_tokenizer: Option<LocalTokenizer>,
    /// llm-d's nested configuration blocks, accepted so its files load; `blockSize` in
    /// `tokenProcessorConfig` is honoured, the rest (hash seed, ZMQ, index backends) does not
    /// apply: keys do not depend on the pods' seed, and the event sockets are flags.
    pub(crate) token_processor_config: Option<serde_norway::Value>,
    pub(crate) kv_events_config: Option<serde_norway::Value>,
    pub(crate) indexer_config: Option<serde_norway::Value>,
    /// How a match scores (llm-d's `prefix-cache-scorer` blend when it scores a
    /// `precise-prefix-cache-producer`'s matches; the ratio otherwise).
    #[serde(skip)]
    pub(crate) blend: super::prefix::MatchBlend,
    /// Credit the part of a prompt no pod holds to its rendezvous home (epp's scorer, for
    /// active-active agreement); off in llm-d's split form, which scores only what is held.
    #[serde(skip)]
    pub(crate) credit_home: bool,
}

impl Default for PrecisePrefixParams {
    fn default() -> Self {
        Self {
            block_size: 16,
            max_prefix_blocks_to_match: 256,
            speculative_indexing: true,
            speculative_ttl: Duration::from_secs(2),
            saturation_queue_depth: 5.0,
            saturation_kv_usage: 0.8,
            tokenizer: Vocabulary::default(),
            local_tokenizer: None,
            token_processor_config: None,
            kv_events_config: None,
            indexer_config: None,
            blend: super::prefix::MatchBlend::default(),
            credit_home: true,
        }
    }
}

impl PrecisePrefixParams {
    /// Applies `tokenProcessorConfig.blockSize` and the local tokenizer of `indexerConfig`
    /// (read from disk here, once), then checks the values.
    pub(crate) fn validate(mut self) -> Result<Self, Invalid> {
        // llm-d's samples spell it both ways (`blockSize`, the perf guide's `blockSizeTokens`).
        if let Some(bs) = self
            .token_processor_config
            .as_ref()
            .and_then(|t| t.get("blockSize").or_else(|| t.get("blockSizeTokens")))
            .and_then(serde_norway::Value::as_u64)
        {
            self.block_size = bs as usize;
        }
        if let Some(indexer) = &self.indexer_config {
            self.local_tokenizer = LocalTokenizer::from_indexer_config(indexer)
                .map_err(|e| Invalid::new("indexerConfig", e.to_string()))?;
        }
        if self.tokenizer == Vocabulary::Characters && self.local_tokenizer.is_none() {
            return Err(Invalid::new(
                "tokenizer",
                "tokenizer \"characters\" cannot match the pods' KV-cache block keys: the precise index needs the model's vocabulary (a tiktoken name or indexerConfig.tokenizersPoolConfig.local)",
            ));
        }
        if self.block_size == 0 || self.max_prefix_blocks_to_match == 0 {
            return Err(Invalid::new(
                "blockSize, maxPrefixBlocksToMatch",
                "blockSize and maxPrefixBlocksToMatch must be > 0",
            ));
        }
        if self.saturation_queue_depth <= 0.0 || self.saturation_kv_usage <= 0.0 {
            return Err(Invalid::new(
                "saturationQueueDepth, saturationKvUsage",
                "saturationQueueDepth and saturationKvUsage must be > 0",
            ));
        }
        Ok(self)
    }
}

impl PrecisePrefixParams {
    /// The parameters of `prefix-cache-scorer` scoring a `precise-prefix-cache-producer`'s
    /// matches (llm-d v0.10's split configuration): the producer's index, the scorer's blend,
    /// and no saturation cut-off (llm-d's generic scorer has none; the load scorers beside it
    /// weigh load).
    pub(crate) fn scored_by(&self, scorer: &super::PrefixParams) -> Self {
        Self {
            saturation_queue_depth: f64::INFINITY,
            saturation_kv_usage: f64::INFINITY,
            blend: scorer.blend(),
            credit_home: false,
            ..self.clone()
        }
    }

    /// The KV-event sockets `kvEventsConfig` asks for, with llm-d-router v0.10's defaults
    /// (`pkg/kvevents/pool.go`): `zmqEndpoint` set: bind it (global socket); else
    /// `discoverPods` (default true): each pod's `podDiscoveryConfig.socketPort` (5557) and
    /// `replaySocketPort` (off unless > 0).
    pub(crate) fn kv_event_sockets(&self) -> KvEventSockets {
        let cfg = self.kv_events_config.as_ref();
        let get = |k: &str| cfg.and_then(|c| c.get(k));
        if let Some(bind) = get("zmqEndpoint")
            .and_then(serde_norway::Value::as_str)
            .filter(|s| !s.is_empty())
        {
            return KvEventSockets {
                bind: Some(bind.to_owned()),
                ..KvEventSockets::default()
            };
        }
        if get("discoverPods").and_then(serde_norway::Value::as_bool) == Some(false) {
            return KvEventSockets::default();
        }
        let discovery = get("podDiscoveryConfig");
        let port = |k: &str| {
            discovery
                .and_then(|d| d.get(k))
                .and_then(serde_norway::Value::as_u64)
                .and_then(|p| u16::try_from(p).ok())
                .filter(|p| *p > 0)
        };
        KvEventSockets {
            bind: None,
            port: Some(port("socketPort").unwrap_or(5557)),
            replay_port: port("replaySocketPort"),
        }
    }

    /// The tokenizer the pods use: the local `tokenizer.json` if configured, else tiktoken.
    pub fn tokenizer_source(&self) -> TokenizerSource {
        self.local_tokenizer.clone().map_or(
            TokenizerSource::Tiktoken(self.tokenizer),
            TokenizerSource::HuggingFace,
        )
    }
}

/// Where the KV events come from ([`PrecisePrefixParams::kv_event_sockets`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct KvEventSockets {
    pub(crate) bind: Option<String>,
    pub(crate) port: Option<u16>,
    pub replay_port: Option<u16>,
}

#[derive(Clone, Debug)]
pub struct PrecisePrefixScorer {
    pub(crate) params: PrecisePrefixParams,
}

impl PrecisePrefixScorer {
    pub(crate) fn new(params: PrecisePrefixParams) -> Self {
        Self { params }
    }

    pub(crate) fn score(&self, req: &SchedulingRequest<'_>, pool: &[&Candidate], out: &mut [f64]) {
        let p = &self.params;
        for (o, c) in out.iter_mut().zip(pool) {
            let saturated =
                c.waiting >= p.saturation_queue_depth || c.kv_usage >= p.saturation_kv_usage;
            *o = if saturated {
                0.0
            } else {
                p.blend
                    .score(c.prefix_blocks, req.prefix_total_blocks, req.block_size)
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parameters as the configuration decoder reads them.
    fn from_yaml(v: &serde_norway::Value) -> Result<PrecisePrefixParams, String> {
        let p: PrecisePrefixParams = config::plugin::params(v).map_err(|e| e.to_string())?;
        p.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn the_characters_approximation_is_refused_for_the_precise_index() {
        let v: serde_norway::Value = serde_norway::from_str("{tokenizer: characters}").unwrap();
        let e = from_yaml(&v).unwrap_err();
        assert!(
            e.contains("tokenizer") && e.contains("KV-cache block keys"),
            "{e}"
        );
    }
    use crate::config;
    use crate::scheduling::testing::cand;
    use rand::{rngs::SmallRng, SeedableRng};

    fn scores(total: usize, cands: &[Candidate]) -> Vec<f64> {
        let req = SchedulingRequest {
            prefix_total_blocks: total,
            block_size: 16,
            ..Default::default()
        };
        let mut out = vec![0.0; cands.len()];
        PrecisePrefixScorer::new(PrecisePrefixParams::default()).score(
            &req,
            &cands.iter().collect::<Vec<_>>(),
            &mut out,
        );
        out
    }

    #[test]
    fn scores_the_matched_fraction_and_nothing_on_saturated_pods() {
        assert_eq!(
            scores(
                4,
                &[
                    cand(1, 0.0, 0.0, 4),
                    cand(2, 0.0, 0.0, 1),
                    cand(3, 0.0, 0.0, 0)
                ]
            ),
            vec![1.0, 0.25, 0.0]
        );
        assert_eq!(
            scores(4, &[cand(1, 5.0, 0.0, 4), cand(2, 0.0, 0.9, 4)]),
            vec![0.0, 0.0]
        );
        assert_eq!(scores(0, &[cand(1, 0.0, 0.0, 0)]), vec![0.0]);
    }

    #[test]
    fn prefix_affinity_never_piles_onto_a_saturated_pod() {
        let text = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n- type: kv-cache-utilization-scorer\n- type: precise-prefix-cache-scorer\n- type: max-score-picker\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n    weight: 1\n  - pluginRef: kv-cache-utilization-scorer\n    weight: 1\n  - pluginRef: precise-prefix-cache-scorer\n    weight: 2\n  - pluginRef: max-score-picker\n";
        let sched = crate::scheduling::build(&config::parse_document(text).unwrap()).unwrap();
        let req = SchedulingRequest {
            target_model: "m",
            prefix_total_blocks: 10,
            block_size: 16,
            ..Default::default()
        };
        let mut rng = SmallRng::seed_from_u64(1);
        let pick = |c: &[Candidate], rng: &mut SmallRng| {
            sched.schedule(&req, c, rng).unwrap().endpoints[0].0.port()
        };
        // Cached and lightly loaded beats idle and cold.
        assert_eq!(
            pick(
                &[
                    cand(1, 2.0, 0.3, 10),
                    cand(2, 0.0, 0.0, 0),
                    cand(3, 4.0, 0.0, 0)
                ],
                &mut rng
            ),
            1
        );
        // Cached but saturated (queue 6) loses to a cold pod with a short queue.
        assert_eq!(
            pick(
                &[
                    cand(1, 6.0, 0.3, 10),
                    cand(2, 1.0, 0.1, 0),
                    cand(3, 4.0, 0.0, 0)
                ],
                &mut rng
            ),
            2
        );
        // Cached but KV-saturated likewise.
        assert_eq!(
            pick(&[cand(1, 2.0, 0.85, 10), cand(2, 1.0, 0.1, 0)], &mut rng),
            2
        );
    }

    #[test]
    fn the_shipped_example_builds() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/examples/precise-prefix.yaml"
        ))
        .unwrap();
        let sched = crate::scheduling::build(&config::parse(&text).unwrap()).unwrap();
        assert_eq!(
            sched.precise_params().unwrap().speculative_ttl,
            Duration::from_secs(2)
        );
    }

    #[test]
    fn parameters_are_strict_and_accept_llm_d_blocks() {
        let v: serde_norway::Value = serde_norway::from_str("{speculativeTTL: 500ms, tokenProcessorConfig: {blockSize: 64, hashSeed: '12345'}, indexerConfig: {}}").unwrap();
        let p = from_yaml(&v).unwrap();
        assert_eq!(
            (p.block_size, p.speculative_ttl),
            (64, Duration::from_millis(500))
        );
        let v: serde_norway::Value = serde_norway::from_str("{indexerConfig: {tokenizersPoolConfig: {modelName: m, local: {modelTokenizerMap: {m: /t.json}}}}}").unwrap();
        let local = from_yaml(&v).unwrap().local_tokenizer.unwrap();
        assert_eq!(
            local.resolve().unwrap(),
            std::path::PathBuf::from("/t.json")
        );
        for bad in [
            "{blockSize: 0}",
            "{speculativeTTL: soon}",
            "{bogus: 1}",
            "{saturationKvUsage: 0}",
            "{indexerConfig: {tokenizersPoolConfig: {local: {typo: 1}}}}",
        ] {
            let v: serde_norway::Value = serde_norway::from_str(bad).unwrap();
            assert!(from_yaml(&v).is_err(), "{bad}");
        }
    }
}
