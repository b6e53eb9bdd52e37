//! The request headers that steer epp, by llm-d-router v0.10's names
//! (`pkg/epp/metadata/consts.go`) with the GIE names as deprecated aliases.
//!
//! Alias rule (upstream `GetLowerCaseHeaderValue`): the current name is looked up first and wins
//! whenever it is present, even with an empty value; the alias is read only when it is absent.
//!
//! Also read here, because they change how a request is routed before its body:
//! `Prefer: if-available` (RFC 7240, upstream `routing.IsConditionalDecode`: route only to an
//! endpoint that already caches the prompt, else 412) and WebSocket upgrades (`Upgrade:
//! websocket`, or a `/v1/realtime` path), which have no body to wait for (llm-d-router #1532).

/// The agent session headers (upstream's order: Claude Code, OpenCode, Codex, Codex's legacy
/// spelling): `agent-identity` reads them after its configured ones, and
/// `session-state-producer` keys its sessions on them by default.
pub(crate) const AGENT_SESSION_HEADERS: [&str; 4] = [
    "x-claude-code-session-id",
    "x-session-affinity",
    "session-id",
    "session_id",
];

/// A header with its current name and its deprecated alias.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Aliased {
    pub(crate) name: &'static str,
    pub(crate) alias: &'static str,
}

impl Aliased {
    /// The value under the current name, else under the alias.
    pub(crate) fn read<'v>(self, lookup: impl Fn(&str) -> Option<&'v str>) -> Option<&'v str> {
        lookup(self.name).or_else(|| lookup(self.alias))
    }
}

/// The InferenceObjective naming the request's priority.
pub(crate) const OBJECTIVE: Aliased = Aliased {
    name: "x-llm-d-inference-objective",
    alias: "x-gateway-inference-objective",
};
/// The flow-control fairness key.
pub(crate) const FAIRNESS_ID: Aliased = Aliased {
    name: "x-llm-d-inference-fairness-id",
    alias: "x-gateway-inference-fairness-id",
};
/// The model the request is forwarded as.
pub(crate) const MODEL_NAME_REWRITE: Aliased = Aliased {
    name: "x-llm-d-model-name-rewrite",
    alias: "x-gateway-model-name-rewrite",
};
/// Time-to-first-token objective, milliseconds.
pub(crate) const SLO_TTFT_MS: Aliased = Aliased {
    name: "x-llm-d-slo-ttft-ms",
    alias: "x-slo-ttft-ms",
};
/// Time-per-output-token objective, milliseconds.
pub(crate) const SLO_TPOT_MS: Aliased = Aliased {
    name: "x-llm-d-slo-tpot-ms",
    alias: "x-slo-tpot-ms",
};

/// What the steering headers of one request say.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Steering {
    pub(crate) objective: Option<String>,
    pub(crate) fairness_id: Option<String>,
    pub(crate) model_rewrite: Option<String>,
    /// Parsed as a float (upstream `parseFloatHeader`); an unparsable value is ignored.
    pub(crate) slo_ttft_ms: Option<f64>,
    pub(crate) slo_tpot_ms: Option<f64>,
    /// `Prefer: if-available`: answer 412 unless the chosen endpoint caches the prompt.
    pub(crate) if_available: bool,
    /// A WebSocket upgrade: routed at header time, the body (frames) streams through.
    pub(crate) websocket: bool,
}

impl Steering {
    /// Reads the headers of a request on `path`; `lookup` takes a lower-case header name.
    pub(crate) fn read<'v>(lookup: impl Fn(&str) -> Option<&'v str>, path: &str) -> Self {
        let owned = |h: Aliased| h.read(&lookup).map(str::to_owned);
        let float = |h: Aliased| h.read(&lookup).and_then(|v| v.trim().parse().ok());
        Self {
            objective: owned(OBJECTIVE),
            fairness_id: owned(FAIRNESS_ID),
            model_rewrite: owned(MODEL_NAME_REWRITE),
            slo_ttft_ms: float(SLO_TTFT_MS),
            slo_tpot_ms: float(SLO_TPOT_MS),
            if_available: prefers_if_available(lookup("prefer")),
            websocket: is_websocket(lookup("upgrade"), path),
        }
    }
}

/// Whether a `Prefer` value holds the bare `if-available` token: a comma-separated list, each
/// preference with optional `;` parameters, matched case-insensitively (upstream
/// `IsConditionalDecode`).
pub(crate) fn prefers_if_available(prefer: Option<&str>) -> bool {
    prefer.is_some_and(|v| {
        v.split(',').any(|pref| {
            let token = pref.split(';').next().unwrap_or("");
            token.trim().eq_ignore_ascii_case("if-available")
        })
    })
}

/// Whether the request upgrades to a WebSocket: an `Upgrade` header naming `websocket` (a
/// comma-separated protocol list), or OpenAI's Realtime path.
pub(crate) fn is_websocket(upgrade: Option<&str>, path: &str) -> bool {
    let path = path.split('?').next().unwrap_or(path).trim_end_matches('/');
    upgrade.is_some_and(|u| {
        u.split(',')
            .any(|p| p.trim().eq_ignore_ascii_case("websocket"))
    }) || path.ends_with("/v1/realtime")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steering(headers: &[(&str, &str)], path: &str) -> Steering {
        Steering::read(
            |k| headers.iter().find(|(n, _)| *n == k).map(|(_, v)| *v),
            path,
        )
    }

    #[test]
    fn current_names_win_over_aliases_even_when_empty() {
        type Headers<'a> = &'a [(&'a str, &'a str)];
        let cases: &[(Headers<'_>, Option<&str>)] = &[
            (&[], None),
            (&[("x-gateway-inference-objective", "old")], Some("old")),
            (&[("x-llm-d-inference-objective", "new")], Some("new")),
            (
                &[
                    ("x-gateway-inference-objective", "old"),
                    ("x-llm-d-inference-objective", "new"),
                ],
                Some("new"),
            ),
            (
                &[
                    ("x-llm-d-inference-objective", ""),
                    ("x-gateway-inference-objective", "old"),
                ],
                Some(""),
            ),
        ];
        for (headers, want) in cases {
            assert_eq!(
                steering(headers, "/v1/completions").objective.as_deref(),
                *want,
                "{headers:?}"
            );
        }
    }

    #[test]
    fn reads_every_steering_header_under_either_name() {
        let s = steering(
            &[
                ("x-gateway-inference-fairness-id", "tenant"),
                ("x-llm-d-model-name-rewrite", "m2"),
                ("x-gateway-model-name-rewrite", "m-old"),
                ("x-slo-ttft-ms", "250"),
                ("x-llm-d-slo-tpot-ms", " 12.5 "),
                ("prefer", "respond-async, If-Available ;x=1"),
            ],
            "/v1/chat/completions",
        );
        assert_eq!(s.fairness_id.as_deref(), Some("tenant"));
        assert_eq!(s.model_rewrite.as_deref(), Some("m2"));
        assert_eq!((s.slo_ttft_ms, s.slo_tpot_ms), (Some(250.0), Some(12.5)));
        assert!(s.if_available);
        assert!(!s.websocket);
        let bad = steering(&[("x-llm-d-slo-ttft-ms", "soon")], "/");
        assert_eq!(bad.slo_ttft_ms, None);
    }

    #[test]
    fn prefer_needs_the_bare_token() {
        for (value, want) in [
            ("if-available", true),
            ("wait=5, if-available", true),
            ("if-available;strict", true),
            ("if-availablex", false),
            ("return=minimal", false),
            ("", false),
        ] {
            assert_eq!(prefers_if_available(Some(value)), want, "{value}");
        }
        assert!(!prefers_if_available(None));
    }

    #[test]
    fn websocket_by_upgrade_header_or_realtime_path() {
        assert!(is_websocket(Some("WebSocket"), "/ws"));
        assert!(is_websocket(Some("h2c, websocket"), "/ws"));
        assert!(is_websocket(None, "/v1/realtime?model=m"));
        assert!(!is_websocket(Some("h2c"), "/v1/chat/completions"));
        assert!(!is_websocket(None, "/v1/realtime/calls"));
    }
}
