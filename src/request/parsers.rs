//! Which parser reads a request, chosen by its path as llm-d-router v0.10's `ParserRegistry`
//! does (`pkg/epp/handlers/parsers.go`), and which API within that parser.
//!
//! Each parser claims path suffixes; the longest claimed suffix that ends the path wins,
//! whatever the registration order. A parser that claims nothing (`passthrough-parser`) is the
//! fallback for every other path, and registration stops at it: parsers listed after it are
//! ignored, as upstream logs and skips them. A repeated kind counts once. A path no parser
//! claims, with no fallback, is refused (400), as upstream.
//!
//! Suffix matching is upstream's `MatchPathSuffix`: the query is dropped, one trailing `/` is
//! trimmed and the claim must end the path (a plain suffix, no segment boundary: a path ending
//! in `xgenerate` is claimed by `generate`).
//!
//! What must stay true: [`ParserSet::default`] is upstream's default list (`openai-parser`,
//! `anthropic-parser`, `vllmhttp-parser`, `passthrough-parser`, `loader/defaults.go`
//! `ensureParsers`), and an explicit list gains no fallback.

use super::{ApiKind, RequestError};
use crate::plugin::PluginKind;

/// A parser type of `requestHandler.parsers[]`, by upstream's plugin type name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParserKind {
    /// `openai-parser`: completions, chat, responses, conversations, embeddings.
    OpenAi,
    /// `anthropic-parser`: Anthropic Messages (`/v1/messages`, `/v1/messages/count_tokens`).
    Anthropic,
    /// `vllmhttp-parser`: vLLM's token-in `/inference/v1/generate`.
    VllmHttp,
    /// `sglanghttp-parser`: SGLang's native `/generate` (pre-tokenized `input_ids`).
    SglangHttp,
    /// `passthrough-parser`: routes without reading the body; claims no path (the fallback).
    Passthrough,
    /// `vertexai-parser`: Vertex AI's gRPC prediction service (an OpenAI body in an
    /// `HttpBody`, [`super::vertex`]).
    VertexAi,
    /// `vllmgrpc-parser`: vLLM's gRPC engine API ([`super::vllm_grpc`]).
    VllmGrpc,
}

impl ParserKind {
    #[cfg(test)]
    pub(crate) const ALL: [Self; 7] = [
        Self::OpenAi,
        Self::Anthropic,
        Self::VllmHttp,
        Self::SglangHttp,
        Self::Passthrough,
        Self::VertexAi,
        Self::VllmGrpc,
    ];

    /// The parser a plugin kind is, `None` for a kind that is not a parser epp implements.
    pub(crate) fn of(kind: PluginKind) -> Option<Self> {
        match kind {
            PluginKind::OpenaiParser => Some(Self::OpenAi),
            PluginKind::AnthropicParser => Some(Self::Anthropic),
            PluginKind::VllmhttpParser => Some(Self::VllmHttp),
            PluginKind::SglanghttpParser => Some(Self::SglangHttp),
            PluginKind::PassthroughParser => Some(Self::Passthrough),
            PluginKind::VertexaiParser => Some(Self::VertexAi),
            PluginKind::VllmgrpcParser => Some(Self::VllmGrpc),
            _ => None,
        }
    }

    /// The path suffixes this parser claims (upstream's `Claims().Paths`).
    fn claims(self) -> &'static [&'static str] {
        match self {
            Self::OpenAi => &[
                "chat/completions",
                "completions",
                "embeddings",
                "responses",
                "conversations",
                "chat/completions/render",
                "completions/render",
                "images/generations",
            ],
            Self::Anthropic => &["messages", "messages/count_tokens"],
            Self::VllmHttp => &["inference/v1/generate"],
            Self::SglangHttp => &["generate"],
            Self::VertexAi => &[
                "PredictionService/ChatCompletions",
                "PredictionService/StreamRawPredict",
                "PredictionService/RawPredict",
            ],
            Self::VllmGrpc => &[
                "vllm.grpc.engine.VllmEngine/Generate",
                "vllm.grpc.engine.VllmEngine/Embed",
            ],
            Self::Passthrough => &[],
        }
    }

    /// What this parser does with a request on `path` (already known to be claimed by it).
    fn handling(self, path: &str) -> Result<Handling, RequestError> {
        let unsupported = || RequestError::UnsupportedPath {
            path: path.to_owned(),
        };
        match self {
            Self::OpenAi => Ok(Handling::Parse(ApiKind::from_path(path))),
            // count_tokens gains nothing from parsing: forwarded unchanged, as upstream.
            Self::Anthropic if path.ends_with("/messages/count_tokens") => {
                Ok(Handling::Passthrough)
            }
            Self::Anthropic if path.ends_with("/messages") => {
                Ok(Handling::Parse(ApiKind::Messages))
            }
            Self::VllmHttp if path.ends_with("inference/v1/generate") => {
                Ok(Handling::Parse(ApiKind::VllmGenerate))
            }
            Self::SglangHttp if matches!(path, "/generate" | "generate") => {
                Ok(Handling::Parse(ApiKind::SglangGenerate))
            }
            Self::Passthrough => Ok(Handling::Passthrough),
            Self::VertexAi if path.ends_with("PredictionService/ChatCompletions") => {
                Ok(Handling::Parse(ApiKind::VertexChatCompletions))
            }
            Self::VertexAi => Ok(Handling::Parse(ApiKind::VertexRawPredict)),
            Self::VllmGrpc if path.ends_with("VllmEngine/Embed") => {
                Ok(Handling::Parse(ApiKind::VllmGrpcEmbed))
            }
            Self::VllmGrpc => Ok(Handling::Parse(ApiKind::VllmGrpcGenerate)),
            Self::Anthropic | Self::VllmHttp | Self::SglangHttp => Err(unsupported()),
        }
    }
}

/// How a request is read once its parser is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Handling {
    /// Parse the body as this API (model, prompt, stream).
    Parse(ApiKind),
    /// Route without reading the body: no model, no prompt; the body streams through.
    Passthrough,
}

/// The active parsers, in registration order (upstream `requestHandler.parsers[]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ParserSet {
    /// Parsers that claim paths, first occurrence of each kind.
    claiming: Vec<ParserKind>,
    /// The parser that claims no path, when one is registered (registration stops there).
    fallback: Option<ParserKind>,
}

impl Default for ParserSet {
    /// Upstream's default when `requestHandler.parsers` is empty.
    fn default() -> Self {
        Self::new([
            ParserKind::OpenAi,
            ParserKind::Anthropic,
            ParserKind::VllmHttp,
            ParserKind::Passthrough,
        ])
    }
}

impl ParserSet {
    /// Registers `kinds` in order: a repeated kind counts once, and nothing after the fallback
    /// (`passthrough-parser`) is registered.
    pub(crate) fn new(kinds: impl IntoIterator<Item = ParserKind>) -> Self {
        let mut claiming: Vec<ParserKind> = Vec::new();
        for kind in kinds {
            if kind.claims().is_empty() {
                return Self {
                    claiming,
                    fallback: Some(kind),
                };
            }
            if !claiming.contains(&kind) {
                claiming.push(kind);
            }
        }
        Self {
            claiming,
            fallback: None,
        }
    }

    /// The set of these parsers, in order; an empty list is the default (as upstream's
    /// `ensureParsers`).
    pub(crate) fn from_kinds(kinds: Vec<ParserKind>) -> Self {
        if kinds.is_empty() {
            Self::default()
        } else {
            Self::new(kinds)
        }
    }

    /// The registered parsers, in order (the fallback last).
    #[cfg(test)]
    pub(crate) fn kinds(&self) -> impl Iterator<Item = ParserKind> + '_ {
        self.claiming.iter().copied().chain(self.fallback)
    }

    /// Whether `kind` is registered.
    #[cfg(test)]
    pub(crate) fn contains(&self, kind: ParserKind) -> bool {
        self.kinds().any(|k| k == kind)
    }

    /// The parser for a request on `path` (query ignored): the longest claimed suffix, else the
    /// fallback.
    pub(crate) fn resolve(&self, path: &str) -> Result<ParserKind, RequestError> {
        let trimmed = trim_path(path);
        let mut best: Option<(usize, ParserKind)> = None;
        for &kind in &self.claiming {
            for claim in kind.claims() {
                if trimmed.ends_with(claim) && best.is_none_or(|(len, _)| claim.len() > len) {
                    best = Some((claim.len(), kind));
                }
            }
        }
        best.map(|(_, k)| k)
            .or(self.fallback)
            .ok_or_else(|| RequestError::NoParser {
                path: path.split('?').next().unwrap_or(path).to_owned(),
            })
    }

    /// How a request on `path` is read: its parser, then the API within it.
    pub(crate) fn handling(&self, path: &str) -> Result<Handling, RequestError> {
        self.resolve(path)?.handling(trim_path(path))
    }
}

/// The path as upstream matches it: no query, one trailing `/` trimmed.
fn trim_path(path: &str) -> &str {
    let path = path.split('?').next().unwrap_or(path).trim();
    path.strip_suffix('/').unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ParserKind::*;

    #[test]
    fn the_default_is_upstreams_list_with_passthrough_last() {
        let set = ParserSet::default();
        assert_eq!(
            set.kinds().collect::<Vec<_>>(),
            vec![OpenAi, Anthropic, VllmHttp, Passthrough]
        );
        assert_eq!(ParserSet::from_kinds(Vec::new()), set);
    }

    #[test]
    fn resolves_paths_to_parsers_and_apis_as_upstream() {
        let default = ParserSet::default();
        let all = ParserSet::new(ParserKind::ALL);
        let p = |a| Ok(Handling::Parse(a));
        let cases: &[(&ParserSet, &str, Result<Handling, ()>)] = &[
            (
                &default,
                "/v1/chat/completions",
                p(ApiKind::ChatCompletions),
            ),
            (
                &default,
                "/v1/chat/completions/",
                p(ApiKind::ChatCompletions),
            ),
            (&default, "/v1/completions?x=1", p(ApiKind::Completions)),
            (
                &default,
                "/v1/chat/completions/render",
                p(ApiKind::ChatCompletions),
            ),
            (&default, "/v1/responses", p(ApiKind::Responses)),
            (&default, "/v1/embeddings", p(ApiKind::Embeddings)),
            (&default, "/v1/conversations", p(ApiKind::Conversations)),
            (&default, "/v1/messages", p(ApiKind::Messages)),
            (&default, "/v1/messages?beta=true", p(ApiKind::Messages)),
            (
                &default,
                "/v1/messages/count_tokens",
                Ok(Handling::Passthrough),
            ),
            (&default, "/inference/v1/generate", p(ApiKind::VllmGenerate)),
            // Not claimed by the defaults: the passthrough fallback takes them.
            (&default, "/generate", Ok(Handling::Passthrough)),
            (&default, "/v1/models", Ok(Handling::Passthrough)),
            (&default, "/v1/realtime", Ok(Handling::Passthrough)),
            // The longest claim wins whatever the order: vLLM's over SGLang's `generate`.
            (&all, "/inference/v1/generate", p(ApiKind::VllmGenerate)),
            (&all, "/generate", p(ApiKind::SglangGenerate)),
            (&all, "/generate/", p(ApiKind::SglangGenerate)),
            // SGLang claims every `generate` suffix but reads only `/generate`.
            (&all, "/v2/generate", Err(())),
        ];
        for (set, path, want) in cases {
            let got = set.handling(path).map_err(|_| ());
            assert_eq!(&got, want, "{path}");
        }
    }

    #[test]
    fn an_explicit_list_has_no_fallback_and_stops_at_passthrough() {
        let openai = ParserSet::from_kinds(vec![OpenAi]);
        let err = openai.handling("/v1/messages?b=1").unwrap_err();
        assert_eq!(
            err.to_string(),
            "no parser registered matching path suffix for: /v1/messages"
        );
        let cut = ParserSet::from_kinds(vec![OpenAi, Passthrough, Anthropic]);
        assert_eq!(cut.kinds().collect::<Vec<_>>(), vec![OpenAi, Passthrough]);
        assert_eq!(
            cut.handling("/v1/messages").ok(),
            Some(Handling::Passthrough)
        );
        let dup = ParserSet::new([VllmHttp, OpenAi, VllmHttp]);
        assert_eq!(dup.kinds().collect::<Vec<_>>(), vec![VllmHttp, OpenAi]);
        assert!(!dup.contains(Passthrough));
    }

    #[test]
    fn every_parser_kind_epp_accepts_is_a_parser_it_runs() {
        use crate::plugin::{Category, Support};
        for &k in PluginKind::ALL {
            let runs =
                k.category() == Category::Parser && !matches!(k.support(), Support::Unsupported(_));
            assert_eq!(ParserKind::of(k).is_some(), runs, "{k}");
        }
        for kind in ParserKind::ALL {
            assert!(PluginKind::ALL
                .iter()
                .any(|&k| ParserKind::of(k) == Some(kind)));
        }
    }
}
