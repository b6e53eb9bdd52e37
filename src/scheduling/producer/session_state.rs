//! `session-state-producer` (llm-d, alpha): what each agent session has done so far, keyed by
//! the agent identity: turns taken, requests in flight, time spent waiting for responses, when
//! it was first and last seen, and the endpoint its last turn went to.
//!
//! A session is named by the first of `sessionHeaders` with a value (by default the agent
//! session headers `agent-identity` reads: Claude Code, OpenCode, Codex). A turn is counted
//! when it is placed (`pre_request`); its time is added when its response completes
//! (`response_complete`). A session idle for `idleTimeout` is forgotten, and at most
//! `maxSessions` are kept (the least recently seen goes first), so a client inventing session
//! ids cannot grow epp's memory. `/debug/snapshot` shows the sessions under `plugins`.

use crate::endpoint::EndpointId;
use crate::plugin::Invalid;
use crate::request::headers::AGENT_SESSION_HEADERS;
use crate::scheduling::lifecycle::{Completed, Headers, Lifecycle, Owned, Placed};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Bytes of a session id kept: longer ids are cut (at a character boundary).
const MAX_ID_BYTES: usize = 256;

/// Sessions shown by `/debug/snapshot`, most recently seen first.
const SHOWN: usize = 20;

#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub(crate) struct SessionStateProducer {
    /// Headers naming the session, in order; the first with a value wins.
    pub(crate) session_headers: Vec<String>,
    /// A session idle this long is forgotten (a Go duration).
    pub(crate) idle_timeout: String,
    /// Sessions kept at most.
    pub(crate) max_sessions: usize,
    #[serde(skip)]
    idle: Duration,
    #[serde(skip)]
    sessions: Owned<Sessions>,
}

impl Default for SessionStateProducer {
    fn default() -> Self {
        Self {
            session_headers: AGENT_SESSION_HEADERS.iter().map(|h| (*h).into()).collect(),
            idle_timeout: "30m".into(),
            max_sessions: 10_000,
            idle: Duration::from_secs(30 * 60),
            sessions: Owned::default(),
        }
    }
}

/// One session's record.
#[derive(Clone, Debug)]
struct Session {
    turns: u64,
    in_flight: u32,
    /// Time its completed turns spent from routing to the end of the response.
    busy: Duration,
    first_seen: Instant,
    last_seen: Instant,
    endpoint: EndpointId,
}

#[derive(Debug, Default)]
struct Sessions {
    map: HashMap<String, Session>,
    last_sweep: Option<Instant>,
}

impl SessionStateProducer {
    pub(crate) fn validate(mut self) -> Result<Self, Invalid> {
        self.session_headers = self
            .session_headers
            .iter()
            .map(|h| h.trim().to_ascii_lowercase())
            .filter(|h| !h.is_empty())
            .collect();
        if self.session_headers.is_empty() {
            return Err(Invalid::new(
                "sessionHeaders",
                "at least one header is needed",
            ));
        }
        self.idle = crate::duration::parse(&self.idle_timeout)
            .map_err(|e| Invalid::new("idleTimeout", e.to_string()))?;
        if self.idle.is_zero() {
            return Err(Invalid::new("idleTimeout", "must be > 0"));
        }
        if self.max_sessions == 0 {
            return Err(Invalid::new("maxSessions", "must be > 0"));
        }
        Ok(self)
    }

    /// The request's session id, cut to [`MAX_ID_BYTES`].
    fn session<'h>(&self, headers: &'h Headers) -> Option<&'h str> {
        let id = headers.first_of(self.session_headers.iter().map(String::as_str))?;
        let mut end = id.len().min(MAX_ID_BYTES);
        while !id.is_char_boundary(end) {
            end -= 1;
        }
        Some(&id[..end])
    }
}

impl Sessions {
    /// Forgets sessions idle past `idle` (at most every quarter of it), then the least
    /// recently seen beyond `max`.
    fn sweep(&mut self, now: Instant, idle: Duration, max: usize) {
        let due = self
            .last_sweep
            .is_none_or(|t| now.saturating_duration_since(t) >= idle / 4);
        if due {
            self.last_sweep = Some(now);
            self.map
                .retain(|_, s| now.saturating_duration_since(s.last_seen) < idle);
        }
        while self.map.len() > max {
            let oldest = self.map.iter().min_by_key(|(_, s)| s.last_seen);
            let Some(key) = oldest.map(|(k, _)| k.clone()) else {
                break;
            };
            self.map.remove(&key);
        }
    }
}

impl Lifecycle for SessionStateProducer {
    fn headers(&self) -> Vec<&str> {
        self.session_headers.iter().map(String::as_str).collect()
    }

    /// A turn of the session is placed.
    fn pre_request(&self, placed: &Placed<'_>) {
        let Some(id) = self.session(placed.request.headers) else {
            return;
        };
        let now = placed.now;
        let mut sessions = self.sessions.lock();
        let s = sessions
            .map
            .entry(id.to_owned())
            .or_insert_with(|| Session {
                turns: 0,
                in_flight: 0,
                busy: Duration::ZERO,
                first_seen: now,
                last_seen: now,
                endpoint: placed.primary,
            });
        s.turns += 1;
        s.in_flight += 1;
        s.last_seen = now;
        s.endpoint = placed.primary;
        sessions.sweep(now, self.idle, self.max_sessions);
    }

    /// The turn's response ended: its time counts, and it is no longer in flight.
    fn response_complete(&self, done: &Completed<'_>) {
        let Some(id) = self.session(done.headers) else {
            return;
        };
        if let Some(s) = self.sessions.lock().map.get_mut(id) {
            s.in_flight = s.in_flight.saturating_sub(1);
            s.busy += done.now.saturating_duration_since(done.started);
            s.last_seen = done.now;
        }
    }

    fn snapshot(&self) -> Option<serde_json::Value> {
        let sessions = self.sessions.lock();
        let now = Instant::now();
        let mut recent: Vec<(&String, &Session)> = sessions.map.iter().collect();
        recent.sort_by_key(|(_, s)| std::cmp::Reverse(s.last_seen));
        let shown: Vec<serde_json::Value> = recent
            .iter()
            .take(SHOWN)
            .map(|(id, s)| session_json(id, s, now))
            .collect();
        Some(serde_json::json!({
            "type": "session-state-producer",
            "sessions": sessions.map.len(),
            "recent": shown,
        }))
    }

    fn instance(&self) -> usize {
        self.sessions.instance()
    }
}

fn session_json(id: &str, s: &Session, now: Instant) -> serde_json::Value {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    serde_json::json!({
        "session": id,
        "turns": s.turns,
        "in_flight": s.in_flight,
        "busy_ms": ms(s.busy),
        "duration_ms": ms(s.last_seen.saturating_duration_since(s.first_seen)),
        "idle_ms": ms(now.saturating_duration_since(s.last_seen)),
        "endpoint": s.endpoint.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::plugin::params;
    use crate::scheduling::testing::cand;
    use crate::scheduling::{Candidate, SchedulingRequest};

    fn producer(yaml: &str) -> Result<SessionStateProducer, String> {
        let v: serde_norway::Value = serde_norway::from_str(yaml).map_err(|e| e.to_string())?;
        params::<SessionStateProducer>(&v)
            .map_err(|e| e.to_string())?
            .validate()
            .map_err(|e| e.to_string())
    }

    /// Places one turn of `session` on `pod` at `now`.
    fn place(p: &SessionStateProducer, session: &str, pod: &Candidate, now: Instant) {
        let headers = Headers::of(&[("x-claude-code-session-id", session)]);
        let req = SchedulingRequest {
            headers: &headers,
            now,
            ..Default::default()
        };
        crate::scheduling::lifecycle::place_on(p, 1, &req, pod);
    }

    fn complete(p: &SessionStateProducer, session: &str, started: Instant, now: Instant) {
        let headers = Headers::of(&[("x-claude-code-session-id", session)]);
        p.response_complete(&Completed {
            id: 1,
            headers: &headers,
            served: cand(1, 0.0, 0.0, 0).id,
            started,
            now,
            ok: true,
            stream: true,
        });
    }

    #[test]
    fn counts_turns_in_flight_and_busy_time_per_session() {
        let p = producer("~").unwrap();
        let (a, b) = (cand(1, 0.0, 0.0, 0), cand(2, 0.0, 0.0, 0));
        let t0 = Instant::now();
        place(&p, "s1", &a, t0);
        place(&p, "s1", &b, t0 + Duration::from_secs(1));
        complete(&p, "s1", t0, t0 + Duration::from_secs(2));
        place(&p, "s2", &a, t0 + Duration::from_secs(3));
        let sessions = p.sessions.lock();
        let s1 = &sessions.map["s1"];
        assert_eq!((s1.turns, s1.in_flight), (2, 1));
        assert_eq!(s1.busy, Duration::from_secs(2));
        assert_eq!(s1.endpoint, b.id, "its last turn's endpoint");
        assert_eq!(sessions.map["s2"].turns, 1);
        drop(sessions);
        let shown = p.snapshot().unwrap();
        assert_eq!(shown["sessions"], 2);
        assert_eq!(shown["recent"][0]["session"], "s2", "most recent first");
    }

    #[test]
    fn idle_sessions_are_forgotten_and_the_count_is_capped() {
        let p = producer("{maxSessions: 3, idleTimeout: 1m}").unwrap();
        let a = cand(1, 0.0, 0.0, 0);
        let t0 = Instant::now();
        for k in 0..10 {
            place(&p, &format!("s{k}"), &a, t0 + Duration::from_millis(k));
        }
        let kept: Vec<String> = p.sessions.lock().map.keys().cloned().collect();
        assert_eq!(kept.len(), 3);
        assert!(["s7", "s8", "s9"]
            .iter()
            .all(|k| kept.contains(&(*k).to_owned())));
        place(&p, "late", &a, t0 + Duration::from_secs(120));
        let kept: Vec<String> = p.sessions.lock().map.keys().cloned().collect();
        assert_eq!(
            kept,
            vec!["late".to_owned()],
            "the others were idle past 1m"
        );
    }

    #[test]
    fn requests_without_a_session_header_are_not_counted_and_long_ids_are_cut() {
        let p = producer("{sessionHeaders: [X-Conv]}").unwrap();
        let a = cand(1, 0.0, 0.0, 0);
        place(&p, "s1", &a, Instant::now());
        assert!(
            p.sessions.lock().map.is_empty(),
            "x-conv is the only source"
        );
        let p = producer("~").unwrap();
        place(&p, &"é".repeat(300), &a, Instant::now());
        let key = p.sessions.lock().map.keys().next().cloned().unwrap();
        assert_eq!(key.len(), MAX_ID_BYTES);
    }

    #[test]
    fn parameters_are_checked() {
        let bad = [
            ("{sessionHeaders: []}", "at least one header"),
            ("{idleTimeout: 5x}", "invalid duration"),
            ("{idleTimeout: 0s}", "must be > 0"),
            ("{maxSessions: 0}", "must be > 0"),
            ("{ttl: 3}", "unknown field `ttl`"),
        ];
        for (yaml, want) in bad {
            let err = producer(yaml).unwrap_err();
            assert!(err.contains(want), "{yaml}: {err}");
        }
    }
}
