//! `session-affinity-scorer` (llm-d, alpha), and the parameters it shares with
//! `session-affinity-filter`: a request of a known session scores 1 on its endpoint and 0
//! elsewhere; without one every candidate scores 0 and the other scorers decide.
//!
//! Two strategies name the session's endpoint:
//! - `encoded_endpoint_header` (default): the request carries `x-session-token`, the standard
//!   base64 of the endpoint's name (the pod name, with `-rank-N` for data-parallel ranks; the
//!   address for static endpoints). epp returns it in the `x-session-token` response header
//!   of every routed request and the client echoes it (the codec: [`token`]). The director
//!   resolves the name against the snapshot (`SchedulingRequest::session_endpoint`).
//! - `session_id`: the request carries a session id (the first non-empty of the configured
//!   headers, `x-session-id` by default); the instance keeps a binding session → endpoint
//!   ([`SessionBindings`], its own state), made by the first placement, refreshed by each
//!   placement there, moved only when the bound endpoint was not a candidate (its
//!   `pre_request`), and forgotten after `evictionTtlSeconds` idle. No response header.
//!
//! With its usual weight the affinity yields to a stronger load signal. With P/D an instance
//! whose `profileName` is the prefill profile pins the prefill pod instead, in a header of its
//! own or by a binding of its own ([`Pin`], `crate::scheduling::disagg::session`).

mod token;

use crate::endpoint::EndpointId;
use crate::plugin::{Invalid, PluginKind};
use crate::scheduling::lifecycle::{Headers, Lifecycle, Owned, Placed};
use crate::scheduling::{Candidate, SchedulingRequest};
use std::collections::HashMap;
use std::time::{Duration, Instant};
pub use token::{decode_token, encode_token};

/// Header carrying the token in both directions.
pub(crate) const SESSION_HEADER: &str = "x-session-token";

const ENCODED: &str = "encoded_endpoint_header";
const SESSION_ID: &str = "session_id";

/// The parameters of both session-affinity plugins (upstream's shared util).
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub(crate) struct SessionAffinityParams {
    pub(crate) strategy: String,
    pub(crate) encoded_endpoint_header_config: EncodedEndpointHeaderConfig,
    pub(crate) session_id_config: SessionIdConfig,
    /// The profile whose pick this instance pins (`profileName`): empty is the primary
    /// (decode) profile; with a disaggregating handler, its prefill profile's name pins the
    /// prefill pod (llm-d's P/D session-affinity pattern), resolved into [`Self::pins`] when
    /// the scheduler is built.
    pub(crate) profile_name: String,
    /// Which pick this instance reads and writes, from `profile_name` (set by the builder).
    #[serde(skip)]
    pub(crate) pins: Pin,
    /// The `session_id` strategy's bindings.
    #[serde(skip)]
    bindings: Owned<SessionBindings>,
}

/// The pick a session-affinity instance pins.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Pin {
    /// The destination (the decode pod with P/D): token in `x-session-token`, or the
    /// `session_id` binding.
    #[default]
    Primary,
    /// The prefill pod of a disaggregated request: token in this instance's own header.
    Prefill,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct EncodedEndpointHeaderConfig {
    pub(crate) header: String,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub(crate) struct SessionIdConfig {
    pub(crate) sources: Vec<SessionIdSource>,
    pub(crate) eviction_ttl_seconds: f64,
    pub(crate) eviction_sweep_seconds: f64,
}

impl SessionIdConfig {
    /// Upstream's defaults (`x-session-id`, a 300 s TTL swept every 10 s) and checks.
    fn check(&mut self) -> Result<(), (&'static str, String)> {
        let fail = |m: String| Err(("sessionIdConfig", m));
        if self.sources.is_empty() {
            self.sources = vec![SessionIdSource {
                header: "x-session-id".into(),
                attribute: String::new(),
            }];
        }
        if self.eviction_ttl_seconds == 0.0 {
            self.eviction_ttl_seconds = 300.0;
        }
        if self.eviction_sweep_seconds == 0.0 {
            self.eviction_sweep_seconds = 10.0;
        }
        for (i, s) in self.sources.iter_mut().enumerate() {
            if s.header.is_empty() == s.attribute.is_empty() {
                return fail(format!(
                    "sources[{i}]: exactly one of header or attribute must be set"
                ));
            }
            if !s.attribute.is_empty() {
                return fail(format!("sources[{i}]: attribute sources are not supported by epp (no plugin sets request attributes); use a header"));
            }
            s.header = s.header.trim().to_lowercase();
        }
        let (ttl, sweep) = (self.eviction_ttl_seconds, self.eviction_sweep_seconds);
        if ttl.is_nan() || ttl <= 0.0 {
            return fail(format!("evictionTtlSeconds must be > 0, got {ttl}"));
        }
        if sweep.is_nan() || sweep <= 0.0 {
            return fail(format!("evictionSweepSeconds must be > 0, got {sweep}"));
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct SessionIdSource {
    pub(crate) header: String,
    pub(crate) attribute: String,
}

impl Default for SessionAffinityParams {
    fn default() -> Self {
        Self {
            strategy: ENCODED.into(),
            encoded_endpoint_header_config: EncodedEndpointHeaderConfig::default(),
            session_id_config: SessionIdConfig::default(),
            profile_name: String::new(),
            pins: Pin::Primary,
            bindings: Owned::default(),
        }
    }
}

impl SessionAffinityParams {
    /// Upstream's defaults and checks; `plugin` is `scorer` or `filter` for the messages.
    pub(crate) fn validate(mut self, kind: PluginKind, plugin: &str) -> Result<Self, Invalid> {
        let checked = match self.strategy.as_str() {
            ENCODED => self.check_encoded(),
            SESSION_ID => self.session_id_config.check(),
            other => Err((
                "strategy",
                format!("strategy must be {ENCODED:?} or {SESSION_ID:?}, got {other:?}"),
            )),
        };
        match checked {
            Ok(()) => Ok(self),
            Err((parameter, m)) => Err(Invalid::new(
                parameter,
                format!("invalid parameters of the '{kind}' {plugin} - {m}"),
            )),
        }
    }

    /// The `encoded_endpoint_header` strategy's header: `x-session-token` for the primary pick.
    fn check_encoded(&mut self) -> Result<(), (&'static str, String)> {
        let h = self
            .encoded_endpoint_header_config
            .header
            .trim()
            .to_lowercase();
        // Another header is for an instance pinning another profile's pick (checked when the
        // profiles are known: [`crate::scheduling::disagg::session`]).
        if !h.is_empty() && h != SESSION_HEADER && self.profile_name.is_empty() {
            return Err((
                "encodedEndpointHeaderConfig",
                format!("epp reads and writes the primary pick's session token in {SESSION_HEADER} only, got header {h:?}"),
            ));
        }
        self.encoded_endpoint_header_config.header = if h.is_empty() {
            SESSION_HEADER.into()
        } else {
            h
        };
        Ok(())
    }

    /// The session-id configuration, with the `session_id` strategy.
    pub(crate) fn session_id(&self) -> Option<&SessionIdConfig> {
        (self.strategy == SESSION_ID).then_some(&self.session_id_config)
    }

    /// The session's endpoint for this request, by the configured strategy and pinned pick:
    /// the binding of its session id, the primary's token (resolved by the director), or the
    /// endpoint this instance's own token header names.
    pub(crate) fn target(&self, req: &SchedulingRequest<'_>) -> Option<EndpointId> {
        if let Some(c) = self.session_id() {
            let session = self.session_of(req.headers)?;
            return self.bindings.lock().bound(session, c, req.now);
        }
        match self.pins {
            Pin::Primary => req.session_endpoint,
            Pin::Prefill => {
                let token = req.headers.get(self.token_header()?)?;
                req.names.named(&decode_token(token)?)
            }
        }
    }

    /// The request's session id: the first of the configured source headers with a value.
    fn session_of<'h>(&self, headers: &'h Headers) -> Option<&'h str> {
        let sources = self.session_id_config.sources.iter();
        headers.first_of(sources.map(|s| s.header.as_str()))
    }

    /// The pick this instance pins in a decision (`None`: a decode-only request for a prefill
    /// instance).
    fn pinned(&self, placed: &Placed<'_>) -> Option<EndpointId> {
        match self.pins {
            Pin::Primary => Some(placed.primary),
            Pin::Prefill => placed.prefill,
        }
    }

    /// The header carrying this instance's token (`encoded_endpoint_header` strategy).
    pub fn token_header(&self) -> Option<&str> {
        (self.strategy == ENCODED).then_some(self.encoded_endpoint_header_config.header.as_str())
    }
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(transparent)]
pub struct SessionAffinityScorer {
    pub(crate) params: SessionAffinityParams,
}

impl SessionAffinityScorer {
    pub(crate) fn validate(self) -> Result<Self, Invalid> {
        Ok(Self {
            params: self
                .params
                .validate(PluginKind::SessionAffinityScorer, "scorer")?,
        })
    }

    pub(crate) fn score(&self, req: &SchedulingRequest<'_>, pool: &[&Candidate], out: &mut [f64]) {
        let target = self.params.target(req);
        for (o, c) in out.iter_mut().zip(pool) {
            *o = if target == Some(c.id) { 1.0 } else { 0.0 };
        }
    }
}

/// Both session-affinity plugins record the same way (upstream's shared `PreRequest`): the
/// scorer and the filter hand these parameters, state included, to the lifecycle
/// (`Scorer::lifecycle`, `Filter::lifecycle`).
impl Lifecycle for SessionAffinityParams {
    fn headers(&self) -> Vec<&str> {
        match (self.session_id(), self.pins) {
            (Some(c), _) => c.sources.iter().map(|s| s.header.as_str()).collect(),
            // The primary's `x-session-token` is read by the adapter (the consistent-hash
            // picker keys on it too).
            (None, Pin::Primary) => Vec::new(),
            (None, Pin::Prefill) => self.token_header().into_iter().collect(),
        }
    }

    /// Binds the session to the pinned pick, refreshes the binding, or moves it when the
    /// bound endpoint was not a candidate.
    fn pre_request(&self, placed: &Placed<'_>) {
        let (Some(c), Some(picked)) = (self.session_id(), self.pinned(placed)) else {
            return;
        };
        let Some(session) = self.session_of(placed.request.headers) else {
            return;
        };
        let mut bindings = self.bindings.lock();
        let bound = bindings.bound(session, c, placed.now);
        let present = bound.is_some_and(|b| placed.candidates.iter().any(|c| c.id == b));
        bindings.record(session, picked, present, placed.now);
    }

    /// With the token strategy, the pinned pod's token for the client to send back.
    fn response_headers(&self, placed: &Placed<'_>, out: &mut Vec<(String, String)>) {
        let Some(header) = self.token_header() else {
            return;
        };
        let name = self
            .pinned(placed)
            .and_then(|id| placed.request.names.name_of(id));
        if let Some(name) = name {
            out.push((header.to_owned(), encode_token(&name)));
        }
    }

    fn instance(&self) -> usize {
        self.bindings.instance()
    }
}

/// The `session_id` strategy's bindings, kept by each instance: session id → endpoint and when
/// the session last placed a request. Expired bindings are swept every `sweep` (lazily, on the
/// next access after the interval), as upstream's background sweep does.
#[derive(Debug)]
pub(crate) struct SessionBindings {
    map: HashMap<String, (EndpointId, Instant)>,
    last_sweep: Instant,
}

impl Default for SessionBindings {
    fn default() -> Self {
        Self {
            map: HashMap::new(),
            last_sweep: Instant::now(),
        }
    }
}

impl SessionBindings {
    fn sweep(&mut self, c: &SessionIdConfig, now: Instant) {
        let sweep = Duration::from_secs_f64(c.eviction_sweep_seconds.max(1e-3));
        if now.saturating_duration_since(self.last_sweep) < sweep {
            return;
        }
        self.last_sweep = now;
        let ttl = Duration::from_secs_f64(c.eviction_ttl_seconds.max(1e-3));
        self.map
            .retain(|_, (_, seen)| now.saturating_duration_since(*seen) <= ttl);
    }

    /// The endpoint `session` is bound to.
    pub(crate) fn bound(
        &mut self,
        session: &str,
        c: &SessionIdConfig,
        now: Instant,
    ) -> Option<EndpointId> {
        self.sweep(c, now);
        self.map.get(session).map(|(id, _)| *id)
    }

    /// Records that `session`'s request went to `picked`; `bound_present` says whether the
    /// endpoint it was bound to was a candidate (only then does a binding stay put).
    pub(crate) fn record(
        &mut self,
        session: &str,
        picked: EndpointId,
        bound_present: bool,
        now: Instant,
    ) {
        match self.map.get_mut(session) {
            None => {
                self.map.insert(session.to_owned(), (picked, now));
            }
            Some((id, seen)) if *id == picked => *seen = now,
            Some(b) if !bound_present => *b = (picked, now),
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::testing::cand;

    #[test]
    fn only_the_session_endpoint_scores() {
        let cands = [cand(1, 0.0, 0.0, 0), cand(2, 0.0, 0.0, 0)];
        let pool: Vec<&Candidate> = cands.iter().collect();
        let mut out = [9.0; 2];
        let req = SchedulingRequest {
            session_endpoint: Some(cands[1].id),
            ..Default::default()
        };
        let s = SessionAffinityScorer::default().validate().unwrap();
        s.score(&req, &pool, &mut out);
        assert_eq!(out, [0.0, 1.0]);
        s.score(&SchedulingRequest::default(), &pool, &mut out);
        assert_eq!(out, [0.0, 0.0]);
        // session_id: the bound endpoint scores, the token is not read.
        let by_id = params_of("strategy: session_id");
        let headers = Headers::of(&[("x-session-id", "s1")]);
        let at = Instant::now();
        by_id
            .params
            .bindings
            .lock()
            .record("s1", cands[0].id, false, at);
        let req = SchedulingRequest {
            session_endpoint: Some(cands[1].id),
            headers: &headers,
            now: at,
            ..Default::default()
        };
        by_id.score(&req, &pool, &mut out);
        assert_eq!(out, [1.0, 0.0]);
    }

    fn params_of(yaml: &str) -> SessionAffinityScorer {
        try_params(yaml).unwrap()
    }

    fn try_params(yaml: &str) -> Result<SessionAffinityScorer, String> {
        let v: serde_norway::Value = serde_norway::from_str(yaml).unwrap();
        crate::config::plugin::params::<SessionAffinityScorer>(&v)
            .map_err(|e| e.to_string())?
            .validate()
            .map_err(|e| e.to_string())
    }

    #[test]
    fn parameters_default_and_check_as_upstream() {
        let d = params_of("~");
        assert_eq!(
            d.params.encoded_endpoint_header_config.header,
            SESSION_HEADER
        );
        let s = params_of("{strategy: session_id, sessionIdConfig: {sources: [{header: \" X-Conv \"}, {header: x-b}]}}");
        let c = s.params.session_id().unwrap();
        assert_eq!(
            (c.eviction_ttl_seconds, c.eviction_sweep_seconds),
            (300.0, 10.0)
        );
        assert_eq!(c.sources[0].header, "x-conv");
        assert_eq!(
            params_of("strategy: session_id")
                .params
                .session_id()
                .unwrap()
                .sources[0]
                .header,
            "x-session-id"
        );
        let bad = [
            (
                "strategy: sticky",
                "strategy must be \"encoded_endpoint_header\" or \"session_id\", got \"sticky\"",
            ),
            (
                "{strategy: session_id, sessionIdConfig: {sources: [{header: a, attribute: b}]}}",
                "sources[0]: exactly one of header or attribute must be set",
            ),
            (
                "{strategy: session_id, sessionIdConfig: {sources: [{attribute: b}]}}",
                "attribute sources are not supported",
            ),
            (
                "{strategy: session_id, sessionIdConfig: {evictionTtlSeconds: -1}}",
                "evictionTtlSeconds must be > 0, got -1",
            ),
            (
                "{encodedEndpointHeaderConfig: {header: x-other}}",
                "x-session-token only",
            ),
            (
                "{strategy: session_id, sessionIdConfig: {ttl: 3}}",
                "unknown field `ttl`",
            ),
        ];
        for (yaml, want) in bad {
            let err = try_params(yaml).unwrap_err();
            assert!(err.contains(want), "{yaml}: {err}");
        }
        assert!(
            try_params("{strategy: session_id, sessionIdConfig: {evictionTtlSeconds: -1}}")
                .unwrap_err()
                .starts_with("invalid parameters of the 'session-affinity-scorer' scorer - ")
        );
    }

    #[test]
    fn bindings_stick_move_only_when_the_bound_endpoint_is_gone_and_expire() {
        let c = params_of("{strategy: session_id, sessionIdConfig: {evictionTtlSeconds: 5, evictionSweepSeconds: 1}}")
            .params
            .session_id_config;
        let (a, b) = (cand(1, 0.0, 0.0, 0).id, cand(2, 0.0, 0.0, 0).id);
        let t0 = Instant::now();
        let mut m = SessionBindings::default();
        assert_eq!(m.bound("s", &c, t0), None);
        m.record("s", a, false, t0);
        assert_eq!(m.bound("s", &c, t0), Some(a));
        m.record("s", b, true, t0);
        assert_eq!(
            m.bound("s", &c, t0),
            Some(a),
            "load moved this request, not the session"
        );
        m.record("s", b, false, t0);
        assert_eq!(m.bound("s", &c, t0), Some(b), "the bound endpoint was gone");
        let later = t0 + Duration::from_secs(4);
        m.record("s", b, true, later);
        assert_eq!(
            m.bound("s", &c, later + Duration::from_secs(4)),
            Some(b),
            "refreshed"
        );
        assert_eq!(
            m.bound("s", &c, later + Duration::from_secs(7)),
            None,
            "idle past the TTL"
        );
    }
}
