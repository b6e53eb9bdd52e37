//! Joint placement: a plugin that holds each request for a short window and places the
//! window's requests together (upstream's batching data producers, `burst-prefix-cache-producer`)
//! takes part through [`super::lifecycle::Lifecycle::gather`].
//!
//! The scheduler stays pure and synchronous: gathering is a join, not a wait. The director
//! joins a request to each gathering plugin's window ([`Gathering`] → a [`Seat`] with the time
//! it is ready), the adapter awaits that time (the window is bounded by the plugin's
//! parameters), and the director then reads each seat's [`Placement`] and hands it to the
//! scheduler on [`super::SchedulingRequest::gathered`], where the scorer bound to that plugin
//! instance reads it. A request abandoned while it waits drops its seat: the window still
//! places it (as upstream counts a cancelled request in its batch), and nothing waits for it.

use super::lifecycle::EndpointNames;
use super::Candidate;
use crate::endpoint::EndpointId;
use crate::request::Prompt;
use std::fmt;
use std::time::Instant;

/// What a gathering plugin reads of a request when it joins a window.
pub struct Gathering<'a> {
    /// The model the request names: it seeds the prompt's block chain.
    pub(crate) model: &'a str,
    pub(crate) cache_salt: Option<&'a str>,
    pub(crate) prompt: &'a Prompt,
    /// The request's candidates (the replicas a window places over).
    pub(crate) candidates: &'a [Candidate],
    /// Endpoint names, for deterministic ties (upstream orders replicas by name).
    pub(crate) names: &'a dyn EndpointNames,
    pub(crate) now: Instant,
}

/// Where a window placed one request: a full prefix match on `endpoint` and none elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The plugin instance that placed it ([`super::lifecycle::Lifecycle::instance`]).
    pub(crate) instance: usize,
    pub(crate) endpoint: EndpointId,
    /// The prompt's blocks, all matched on `endpoint`.
    pub(crate) blocks: usize,
    pub(crate) block_size: usize,
}

/// A request's place in a window, resolved once the window closes.
pub trait Ticket: Send + Sync + fmt::Debug {
    /// Where the window placed the request (`None`: no affinity). Closes the window if it is
    /// still open: call it at or after [`Seat::until`].
    fn placement(&self) -> Option<Placement>;
}

/// A request's seat in one plugin's window.
#[derive(Debug)]
pub struct Seat {
    /// When the window closes: the request waits until then.
    pub until: Instant,
    pub(crate) ticket: Box<dyn Ticket>,
}

impl Seat {
    /// Where the window placed the request.
    pub(crate) fn placement(&self) -> Option<Placement> {
        self.ticket.placement()
    }
}

/// Why a plugin could not seat a request (it then goes on without the plugin's affinity, as
/// upstream's director goes on when a data producer fails).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GatherError {
    /// The window holds as many requests as the plugin allows (upstream's words).
    #[error("{plugin} batch full: maxBatchSize {max} reached")]
    WindowFull { plugin: &'static str, max: usize },
}
