//! The request lifecycle a plugin opts into: upstream's extension points after the pick
//! (`PreRequest`, `ResponseBody`, `ResponseComplete`), the window a batching producer holds a
//! request in before it, and the request headers a plugin reads.
//!
//! The director runs one request through these points in order and knows no plugin by name:
//!
//! ```text
//! headers captured (Lifecycle::headers) → admission → gather (a window, if any) → prefix
//!   lookup → filter/score/pick → pre_request (Placed) → first_token (FirstToken) → …
//!   → response_metadata (Usage) → response_complete (Completed)
//! ```
//!
//! A plugin with state owns it ([`Owned`]): the no-hit LRU's order, the session bindings, a
//! producer's per-session records. Filters, scorers and pickers stay pure while picking (they
//! may read their state); what a decision changes is written in `pre_request`, once per request.
//! The state belongs to one configuration: a reload builds fresh plugins, as upstream's EPP
//! does when a configuration change restarts it.

use super::gather::{GatherError, Gathering, Seat};
use super::{Candidate, Decision, SchedulingRequest};
use crate::endpoint::EndpointId;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// What a plugin can do at each point of a request's life. Every method has a default that
/// does nothing, so a plugin implements only the points it uses.
pub trait Lifecycle: Send + Sync + fmt::Debug {
    /// The request headers this plugin reads (lower case). The adapter captures their values
    /// into [`Headers`] when the request's headers arrive.
    fn headers(&self) -> Vec<&str> {
        Vec::new()
    }

    /// Whether this plugin narrows the candidates before any profile runs ([`Self::screen`]);
    /// the director then copies the endpoints' labels and gathers the pool's population.
    fn screens(&self) -> bool {
        false
    }

    /// Narrows the request's candidates once, before admission plugins, the prefix lookup and
    /// every scheduling profile (upstream's `Screener`). Only called when [`Self::screens`].
    fn screen(&self, _screening: &Screening<'_>, _candidates: &mut Vec<Candidate>) {}

    /// Whether this plugin holds requests to place them jointly ([`Self::gather`]): the
    /// adapter then waits for the whole body and for the plugin's window before the decision.
    fn gathers(&self) -> bool {
        false
    }

    /// Joins the request to this plugin's window (upstream's batching `Produce`): its seat,
    /// ready when the window closes; `Ok(None)` when the request takes no part (no prompt).
    /// Only called when [`Self::gathers`].
    fn gather(&self, _g: &Gathering<'_>) -> Result<Option<Seat>, GatherError> {
        Ok(None)
    }

    /// Bytes of prompt text this plugin reads (parsing keeps at least this much).
    fn prompt_bytes(&self) -> usize {
        0
    }

    /// The decision is taken and the request is about to be sent (upstream's `PreRequest`).
    fn pre_request(&self, _placed: &Placed<'_>) {}

    /// Headers the response to the client carries for this decision (a session token), as
    /// (name, value) pairs added to `out`.
    fn response_headers(&self, _placed: &Placed<'_>, _out: &mut Vec<(String, String)>) {}

    /// The first response body chunk arrived (upstream's `ResponseBody` with
    /// `StartOfStream`): the request's time to first token is known.
    fn first_token(&self, _first: &FirstToken) {}

    /// The response's last body chunk is about to go back to the gateway (upstream's
    /// `ResponseBody` at `EndOfStream`): dynamic metadata for the gateway, computed from the
    /// response's usage, added to `out`.
    fn response_metadata(&self, _usage: &Usage, _out: &mut Metadata) {}

    /// The exchange ended (upstream's `ResponseComplete`; also called for an abandoned one).
    fn response_complete(&self, _done: &Completed<'_>) {}

    /// The learned state a scorer reads from this producer, shared (`None`: it publishes
    /// none).
    fn observer(&self) -> Option<super::producer::Observer> {
        None
    }

    /// What the plugin holds now, for `/debug/snapshot` (`None`: nothing worth showing).
    fn snapshot(&self) -> Option<serde_json::Value> {
        None
    }

    /// Gives the plugin its instance's name (the `plugin_name` label of what it counts).
    fn name_instance(&self, _name: &str) {}

    /// Which configured instance this is: the clones of one plugin (referenced by several
    /// profiles) answer the same, so each point runs once per instance.
    fn instance(&self) -> usize;
}

/// A decision, as the plugins that record it see it.
pub struct Placed<'a> {
    /// The request's number, unique in this process: its later points carry it too.
    pub(crate) id: u64,
    pub(crate) request: &'a SchedulingRequest<'a>,
    /// Every candidate of the request, before any filter.
    pub(crate) candidates: &'a [Candidate],
    #[allow(
        dead_code,
        reason = "part of the post-decision contract (upstream's PreRequest receives the result); no plugin of epp reads it yet"
    )]
    pub(crate) decision: &'a Decision,
    /// The destination (the decode pod with P/D).
    pub(crate) primary: EndpointId,
    /// The prefill pod of a request prefilled remotely.
    pub(crate) prefill: Option<EndpointId>,
    pub now: Instant,
}

/// What a screening plugin reads besides the candidates.
pub struct Screening<'a> {
    /// The captured request headers.
    pub(crate) headers: &'a Headers,
    /// The labels of every ready pod of the pool (one entry per pod, whatever its ranks), the
    /// candidates or not: upstream's screener counts the pods it watches.
    pub(crate) population: &'a [&'a BTreeMap<String, String>],
    /// A uniform draw in [0, 1) for a weighted choice.
    pub(crate) draw: f64,
}

/// How an exchange ended, as the plugins see it.
pub struct Completed<'a> {
    /// The request's number ([`Placed::id`]).
    pub(crate) id: u64,
    /// The captured request headers.
    pub(crate) headers: &'a Headers,
    /// The endpoint that served it.
    #[allow(
        dead_code,
        reason = "part of the response-complete contract (upstream's ResponseComplete receives the endpoint); no plugin of epp reads it yet"
    )]
    pub(crate) served: EndpointId,
    /// When the request was routed, and now.
    pub(crate) started: Instant,
    pub(crate) now: Instant,
    /// A response arrived with a 2xx status (false for errors and abandoned exchanges).
    pub(crate) ok: bool,
    /// The response was streamed (its first chunk is its first token, not the whole answer).
    pub(crate) stream: bool,
}

/// A response's token counts as the model server reported them, 0 where it did not
/// (upstream's `Usage`, whose three counts are always present).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    /// `prompt_tokens_details.cached_tokens`, when reported.
    pub cached_tokens: Option<u64>,
}

/// Dynamic metadata for the gateway: namespace → key → number.
pub type Metadata = BTreeMap<String, BTreeMap<String, f64>>;

/// A response's first body chunk, as the plugins see it.
#[derive(Clone, Copy, Debug)]
pub struct FirstToken {
    /// The request's number ([`Placed::id`]).
    pub(crate) id: u64,
    /// The endpoint serving it.
    pub(crate) served: EndpointId,
    /// The response is streamed: with a single-chunk answer the first chunk is also the last.
    pub(crate) stream: bool,
    pub(crate) now: Instant,
}

/// State a plugin instance keeps across requests, shared by the clones of the scheduler one
/// configuration builds. Not part of the configuration: two instances compare equal whatever
/// they hold.
pub(crate) struct Owned<T>(Arc<Mutex<T>>);

impl<T> Owned<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(Arc::new(Mutex::new(value)))
    }

    /// The instance the state belongs to (shared by its clones): [`Lifecycle::instance`].
    pub(crate) fn instance(&self) -> usize {
        Arc::as_ptr(&self.0) as *const () as usize
    }

    /// The state, locked (a panic while it was held does not make it unusable).
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: Default> Default for Owned<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T> Clone for Owned<T> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<T> PartialEq for Owned<T> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl<T> fmt::Debug for Owned<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Owned(..)")
    }
}

/// Endpoint names as a request's snapshot knows them: a session token names a pod (its name,
/// the address for static endpoints), and a response token writes one.
pub trait EndpointNames: Sync + fmt::Debug {
    /// The endpoint called `name`, if it is in the snapshot.
    fn named(&self, name: &str) -> Option<EndpointId>;
    /// The name of endpoint `id`, if it is in the snapshot.
    fn name_of(&self, id: EndpointId) -> Option<String>;
}

/// Names that are addresses (`ip:port`), as static endpoints' are: the names tests use.
#[derive(Debug)]
pub(crate) struct Addresses;

impl EndpointNames for Addresses {
    fn named(&self, name: &str) -> Option<EndpointId> {
        name.parse().ok()
    }
    fn name_of(&self, id: EndpointId) -> Option<String> {
        Some(id.to_string())
    }
}

/// No headers captured.
pub static NO_HEADERS: Headers = Headers(Vec::new());

/// The request headers the configured plugins read, captured once when the headers arrive:
/// (name, first value), at most one entry per name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Headers(Vec<(Arc<str>, String)>);

impl Default for &Headers {
    fn default() -> Self {
        &NO_HEADERS
    }
}

impl Headers {
    /// The values of `names` that `find` knows.
    pub(crate) fn capture<'h>(names: &[Arc<str>], find: impl Fn(&str) -> Option<&'h str>) -> Self {
        Self(
            names
                .iter()
                .filter_map(|n| find(n).map(|v| (Arc::clone(n), v.to_owned())))
                .collect(),
        )
    }

    /// Headers from (name, value) pairs (tests and the simulator).
    #[cfg(test)]
    pub(crate) fn of(pairs: &[(&str, &str)]) -> Self {
        Self(
            pairs
                .iter()
                .map(|(n, v)| (Arc::from(n.to_ascii_lowercase()), (*v).to_owned()))
                .collect(),
        )
    }

    /// The value of header `name` (lower case), if captured.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| &**n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The first of `names` with a non-empty (trimmed) value.
    pub(crate) fn first_of<'n>(&self, names: impl IntoIterator<Item = &'n str>) -> Option<&str> {
        names
            .into_iter()
            .find_map(|n| self.get(n).map(str::trim).filter(|v| !v.is_empty()))
    }
}

/// Test support: `plugin`'s `pre_request` for request `id`, placed on `pod` alone at
/// `request.now`.
#[cfg(test)]
pub(crate) fn place_on(
    plugin: &dyn Lifecycle,
    id: u64,
    request: &SchedulingRequest<'_>,
    pod: &Candidate,
) {
    let decision = Decision {
        endpoints: vec![pod.id],
        scores: Vec::new(),
        disagg: None,
        headers: Vec::new(),
        port: None,
    };
    plugin.pre_request(&Placed {
        id,
        request,
        candidates: std::slice::from_ref(pod),
        decision: &decision,
        primary: pod.id,
        prefill: None,
        now: request.now,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_capture_only_the_names_asked_for_and_find_the_first_non_empty() {
        let names: Vec<Arc<str>> = vec!["x-a".into(), "x-b".into(), "x-c".into()];
        let sent = [("x-a", " "), ("x-b", "two"), ("x-z", "unread")];
        let find = |n: &str| sent.iter().find(|(k, _)| *k == n).map(|(_, v)| *v);
        let h = Headers::capture(&names, find);
        assert_eq!(h.get("x-b"), Some("two"));
        assert_eq!(h.get("x-z"), None, "not asked for");
        assert_eq!(h.first_of(["x-a", "x-b"]), Some("two"), "x-a is blank");
        assert_eq!(h.first_of(["x-c"]), None);
    }

    #[test]
    fn owned_state_is_shared_by_clones_and_not_configuration() {
        let a: Owned<Vec<u8>> = Owned::default();
        let b = a.clone();
        b.lock().push(1);
        assert_eq!(*a.lock(), vec![1]);
        assert!(a == Owned::default());
    }
}
