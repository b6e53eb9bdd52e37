//! Time as an input: the decision path reads the time from a [`Clock`] it is given, so the
//! same director, scheduler and plugins run on the system clock in epp and on a virtual clock
//! in a simulation (no sleeping; a run is deterministic for its inputs).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Where the decision path reads the time.
pub trait Clock: Send + Sync + fmt::Debug {
    fn now(&self) -> Instant;
}

/// The system's monotonic clock.
#[derive(Debug, Default)]
pub(crate) struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told: a fixed origin plus the virtual time elapsed.
#[derive(Debug)]
pub struct VirtualClock {
    origin: Instant,
    elapsed_nanos: AtomicU64,
}

impl Default for VirtualClock {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            elapsed_nanos: AtomicU64::new(0),
        }
    }
}

impl VirtualClock {
    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.elapsed_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Virtual time since the clock was made.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.elapsed_nanos.load(Ordering::Relaxed))
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Instant {
        self.origin + self.elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_virtual_clock_moves_only_when_advanced() {
        let c = VirtualClock::default();
        let t0 = c.now();
        assert_eq!(c.now(), t0);
        c.advance(Duration::from_secs(90));
        assert_eq!(c.now() - t0, Duration::from_secs(90));
    }
}
