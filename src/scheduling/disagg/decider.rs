//! The deciders: whether a disaggregated stage runs for one request.
//!
//! Upstream's three (`pkg/epp/framework/plugins/scheduling/profilehandler/disagg/*_decider.go`)
//! and epp's `cost-based-pd-decider` ([`super::cost`]). A decider sees the request, the decode
//! pick (absent in `prefill-first` order) and the candidates the stage's profile would choose
//! from; it never picks, the stage's profile does.

use super::cost::CostBasedPdDecider;
use crate::plugin::Invalid;
use crate::scheduling::{Candidate, SchedulingRequest};

/// `prefix-based-pd-decider`: disaggregate when the prompt's suffix the decode pod does not
/// hold is at least `nonCachedTokens` long (0 disables the decider), and the prompt at least
/// `promptTokens` long (0: no minimum).
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct PrefixBasedPdDecider {
    pub(crate) non_cached_tokens: i64,
    pub(crate) prompt_tokens: i64,
}

impl PrefixBasedPdDecider {
    /// Upstream's checks and messages.
    pub(crate) fn validate(self) -> Result<Self, Invalid> {
        if self.non_cached_tokens < 0 {
            return Err(Invalid::new(
                "nonCachedTokens",
                "nonCachedTokens parameter of prefix disaggregation decider cannot be negative",
            ));
        }
        if self.prompt_tokens < 0 {
            return Err(Invalid::new(
                "promptTokens",
                "promptTokens parameter of prefix disaggregation decider cannot be negative",
            ));
        }
        if self.non_cached_tokens == 0 {
            tracing::info!("Prefix-based PD disabled (NonCachedTokens=0)");
        }
        Ok(self)
    }

    /// Upstream's `disaggregate`: the uncached suffix is the prompt less the whole blocks the
    /// decode pod holds.
    pub(crate) fn disaggregate(
        &self,
        req: &SchedulingRequest<'_>,
        decode: Option<&Candidate>,
    ) -> bool {
        if self.non_cached_tokens == 0 {
            return false;
        }
        let Some(decode) = decode else {
            return false;
        };
        let prompt = req.prompt_tokens as i64;
        if self.prompt_tokens > 0 && prompt < self.prompt_tokens {
            return false;
        }
        if prompt < self.non_cached_tokens {
            return false;
        }
        let cached = (decode.prefix_blocks * req.block_size) as i64;
        prompt - cached >= self.non_cached_tokens
    }
}

/// Every decider epp knows.
#[derive(Clone, Debug)]
pub enum Decider {
    PrefixBased(PrefixBasedPdDecider),
    /// `always-disagg-pd-decider`: every request (testing and benchmarking, upstream says).
    AlwaysPd,
    /// `always-disagg-multimodal-decider`: requests with image, audio or video content.
    AlwaysMultimodal,
    /// epp's `cost-based-pd-decider`.
    CostBased(Box<CostBasedPdDecider>),
}

impl Decider {
    /// Whether the stage runs. `pool` is the stage profile's candidates after its filters.
    pub(crate) fn disaggregate(
        &self,
        req: &SchedulingRequest<'_>,
        decode: Option<&Candidate>,
        pool: &[&Candidate],
    ) -> bool {
        match self {
            Self::PrefixBased(d) => d.disaggregate(req, decode),
            Self::AlwaysPd => true,
            Self::AlwaysMultimodal => req.multimodal,
            Self::CostBased(d) => decode.is_some_and(|c| d.disaggregate(req, c, pool)),
        }
    }

    /// Whether the decision reads the prompt's length (the director then waits for the body).
    pub(crate) fn reads_prompt_length(&self) -> bool {
        matches!(self, Self::PrefixBased(_) | Self::CostBased(_))
    }
}

/// Whether an OpenAI body carries multimodal content: a content block of type `image_url`,
/// `video_url`, `audio_url` or `input_audio` (what upstream's multimodal decider looks for).
/// Those names with their quotes can only be JSON keys or string values (quotes inside a JSON
/// string are escaped), so a byte search finds them without parsing the body again.
pub(crate) fn has_multimodal(body: &[u8]) -> bool {
    const NEEDLES: [&[u8]; 4] = [
        b"\"image_url\"",
        b"\"video_url\"",
        b"\"audio_url\"",
        b"\"input_audio\"",
    ];
    NEEDLES
        .iter()
        .any(|n| body.windows(n.len()).any(|w| w == *n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::cand;

    fn req(prompt: usize) -> SchedulingRequest<'static> {
        SchedulingRequest {
            prompt_tokens: prompt,
            block_size: 16,
            ..Default::default()
        }
    }

    #[test]
    fn prefix_decider_compares_the_uncached_suffix_with_the_threshold() {
        let d = PrefixBasedPdDecider {
            non_cached_tokens: 16,
            prompt_tokens: 0,
        };
        // (prompt tokens, blocks the decode pod holds, disaggregate)
        let table = [
            (15, 0, false),    // shorter than the threshold
            (16, 0, true),     // exactly the threshold
            (100, 5, true),    // 100 - 80 = 20 uncached
            (100, 6, false),   // 100 - 96 = 4 uncached
            (1000, 61, true),  // 1000 - 976 = 24
            (1000, 62, false), // 1000 - 992 = 8
        ];
        for (prompt, blocks, want) in table {
            let c = cand(1, 0.0, 0.0, blocks);
            assert_eq!(
                d.disaggregate(&req(prompt), Some(&c)),
                want,
                "{prompt}/{blocks}"
            );
        }
        assert!(!d.disaggregate(&req(1000), None), "no decode pick");
    }

    #[test]
    fn prefix_decider_gates_short_prompts_and_zero_disables_it() {
        let gated = PrefixBasedPdDecider {
            non_cached_tokens: 16,
            prompt_tokens: 512,
        };
        let c = cand(1, 0.0, 0.0, 0);
        assert!(!gated.disaggregate(&req(511), Some(&c)));
        assert!(gated.disaggregate(&req(512), Some(&c)));
        let off = PrefixBasedPdDecider::default();
        assert!(!off.disaggregate(&req(100_000), Some(&c)));
    }

    /// The decider the configuration decoder makes of a `type:` and its parameters (`None`:
    /// the type is not a decider); its problems as one message.
    fn build(t: &str, v: &serde_norway::Value) -> Result<Option<Decider>, String> {
        use crate::config::plugin::{NamedPlugin, Plugin};
        use crate::plugin::{Category, PluginKind};
        use crate::scheduling::Plugin as S;
        if PluginKind::from_name(t).is_none_or(|k| k.category() != Category::Decider) {
            return Ok(None);
        }
        let spec = crate::config::PluginSpec {
            name: None,
            plugin_type: t.to_owned(),
            parameters: Some(v.clone()),
        };
        match NamedPlugin::decode(&spec, Default::default()) {
            Ok(NamedPlugin {
                plugin: Plugin::Scheduling(S::Decider(d)),
                ..
            }) => Ok(Some(d)),
            Ok(_) => Ok(None),
            Err(problems) => Err(crate::config::ConfigError::from(problems).to_string()),
        }
    }

    #[test]
    fn prefix_decider_parameters_are_strict_and_checked() {
        let bad = [
            ("{nonCachedTokens: -1}", "nonCachedTokens parameter"),
            ("{promptTokens: -5}", "promptTokens parameter"),
            ("{nonCachedToken: 5}", "unknown field"),
        ];
        for (yaml, want) in bad {
            let v: serde_norway::Value = serde_norway::from_str(yaml).unwrap();
            let err = build("prefix-based-pd-decider", &v)
                .map(|_| ())
                .unwrap_err();
            assert!(err.to_string().contains(want), "{yaml}: {err}");
        }
        let v: serde_norway::Value = serde_norway::from_str("{whatever: 1}").unwrap();
        assert!(matches!(
            build("always-disagg-pd-decider", &v),
            Ok(Some(Decider::AlwaysPd))
        ));
        assert!(build("queue-scorer", &v).unwrap().is_none());
    }

    #[test]
    fn multimodal_content_is_found_in_the_body() {
        let image = br#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}"#;
        let audio = br#"{"messages":[{"content":[{"type": "input_audio","input_audio":{}}]}]}"#;
        let text = br#"{"messages":[{"role":"user","content":"say \"image_url\" please"}]}"#;
        assert!(has_multimodal(image));
        assert!(has_multimodal(audio));
        assert!(!has_multimodal(text), "an escaped quote is text");
        let d = Decider::AlwaysMultimodal;
        let mm = SchedulingRequest {
            multimodal: true,
            ..req(10)
        };
        assert!(d.disaggregate(&mm, None, &[]));
        assert!(!d.disaggregate(&req(10), None, &[]));
    }
}
