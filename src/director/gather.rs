//! The gathering step before a decision ([`crate::scheduling::gather`]): a parsed request
//! joins the windows of the plugins that place requests jointly, and the adapter waits until
//! its seats are ready before it routes with them ([`super::Incoming::seats`]).
//!
//! The windows place over the request's candidates as the pool has them when it joins (the
//! subset hint applied; admission and screening run at routing, after the wait), and chain a
//! prompt's blocks from the model the body names (a model rewrite is drawn at routing).

use super::exchange::{Body, Incoming};
use super::route::Names;
use super::Director;
use crate::scheduling::gather::{Gathering, Seat};

impl Director {
    /// Whether the configuration holds requests to place them jointly: the adapter then waits
    /// for the whole body, then for the seats [`Self::gather`] gives.
    pub(crate) fn gathers(&self) -> bool {
        self.config.load().scheduler.gathers()
    }

    /// Joins a parsed request to every gathering plugin's window: its seats (none without a
    /// parsed body, a gathering plugin or a candidate). The request then waits until the
    /// latest seat's `until` and is routed with them.
    pub(crate) fn gather(&self, inc: &Incoming<'_>) -> Vec<Seat> {
        let Body::Parsed { request, .. } = inc.body else {
            return Vec::new();
        };
        let runtime = self.config.load();
        if !runtime.scheduler.gathers() {
            return Vec::new();
        }
        let now = self.clock.now();
        let snapshot = self.datastore.snapshot();
        let Ok(states) = self.candidate_states(&snapshot, inc.subset, now) else {
            return Vec::new();
        };
        let candidates = self.candidates(&states, false, now);
        let gathering = Gathering {
            model: &request.model,
            cache_salt: request.cache_salt.as_deref(),
            prompt: &request.prompt,
            candidates: &candidates,
            names: &Names(&states),
            now,
        };
        runtime.scheduler.gather(&gathering)
    }
}
