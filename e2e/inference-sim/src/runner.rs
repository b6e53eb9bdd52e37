//! The async driver of one pod's engine: admits requests, runs steps on
//! tokio time, publishes metrics and KV events once per step.
//!
//! Why a single task per pod: the engine is a sequential machine, as vLLM's
//! engine core is; one owner means no locks on the scheduler state. The only
//! shared state is the metrics, locked once per step.
//!
//! Timing: step `k` ends at a *deadline* `start + Σ step durations` (divided by
//! speed × time scale), not at "now + duration", so tokio's 1 ms timer
//! granularity does not stretch short steps: a late wake-up is absorbed by the
//! next steps. If the process falls more than [`MAX_LAG`] behind (CPU
//! saturated), the deadline is reset: an overloaded simulator runs slow, it
//! does not burst.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::config::PodConfig;
use super::engine::{Engine, NewRequest, SeqOutput};
use super::kv_events::KvPublisher;
use super::metrics::PodMetrics;

/// How far behind its deadlines the engine may fall before it stops catching up.
const MAX_LAG: Duration = Duration::from_millis(50);

/// Maps tokio instants to UNIX timestamps (event `ts`, `_created`, LoRA info).
#[derive(Clone, Copy, Debug)]
pub struct SimClock {
    origin: Instant,
    origin_unix: f64,
}

impl SimClock {
    /// A clock whose `origin` is now and reads `origin_unix` then.
    pub fn new(origin_unix: f64) -> Self {
        Self {
            origin: Instant::now(),
            origin_unix,
        }
    }

    /// A clock anchored at the system's wall time.
    pub fn system() -> Self {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        Self::new(unix)
    }

    pub fn unix(&self, at: Instant) -> f64 {
        self.origin_unix + at.saturating_duration_since(self.origin).as_secs_f64()
    }
}

/// Messages from the HTTP side to the engine task.
#[derive(Debug)]
pub enum Command {
    Submit(Box<NewRequest>),
    /// `POST /reset_prefix_cache`; answers whether the cache was reset.
    ResetPrefixCache(oneshot::Sender<bool>),
}

/// The engine task's state.
pub struct Runner {
    pub engine: Engine,
    pub commands: mpsc::UnboundedReceiver<Command>,
    pub metrics: Arc<Mutex<PodMetrics>>,
    pub publisher: Option<KvPublisher>,
    pub clock: SimClock,
    pub cfg: Arc<PodConfig>,
}

impl Runner {
    /// Runs until `cancel` fires or every command sender is gone.
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut deadline = Instant::now();
        loop {
            if self.engine.is_idle() {
                let cmd = tokio::select! {
                    cmd = self.commands.recv() => cmd,
                    () = cancel.cancelled() => None,
                };
                let Some(cmd) = cmd else { return };
                self.handle(cmd);
                deadline = Instant::now();
            }
            while let Ok(cmd) = self.commands.try_recv() {
                self.handle(cmd);
            }
            let now = Instant::now();
            if now.saturating_duration_since(deadline) > MAX_LAG {
                deadline = now;
            }
            let Some(plan) = self.engine.schedule(deadline) else {
                self.flush(deadline);
                // Only remote KV pulls in flight: sleep until the first lands (or a request
                // comes), instead of spinning.
                if let Some(ready) = self.engine.next_ready() {
                    tokio::select! {
                        () = tokio::time::sleep_until(ready) => {}
                        cmd = self.commands.recv() => match cmd {
                            Some(cmd) => self.handle(cmd),
                            None => return,
                        },
                        () = cancel.cancelled() => return,
                    }
                    deadline = Instant::now();
                }
                continue;
            };
            self.publish_gauges(deadline);
            deadline += self.cfg.engine.wall(plan.duration);
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {}
                () = cancel.cancelled() => return,
            }
            self.engine.complete(deadline);
            self.flush(deadline);
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Submit(req) => {
                if self.engine.num_waiting() >= self.cfg.engine.max_waiting {
                    let _ = req.output.send(SeqOutput::Rejected);
                } else {
                    self.engine.add(*req);
                }
            }
            Command::ResetPrefixCache(reply) => {
                let done = self.engine.reset_prefix_cache();
                if !done {
                    tracing::warn!("failed to reset prefix cache: blocks are still in use");
                }
                let _ = reply.send(done);
                if let Some(p) = &self.publisher {
                    p.publish(self.clock.unix(Instant::now()), self.engine.take_events());
                }
            }
        }
    }

    fn publish_gauges(&mut self, now: Instant) {
        let gauges = self.engine.gauges();
        let mut m = self.metrics.lock().unwrap_or_else(|e| e.into_inner());
        m.set_gauges(gauges, self.cfg.enable_lora, self.clock.unix(now));
    }

    /// End of a step: metrics, then one KV-event batch.
    fn flush(&mut self, now: Instant) {
        let report = self.engine.take_report();
        {
            let mut m = self.metrics.lock().unwrap_or_else(|e| e.into_inner());
            m.record(&report);
            if self.engine.is_idle() {
                m.set_gauges(
                    self.engine.gauges(),
                    self.cfg.enable_lora,
                    self.clock.unix(now),
                );
            }
        }
        let events = self.engine.take_events();
        if let Some(p) = &self.publisher {
            p.publish(self.clock.unix(now), events);
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::SmallRng;
    use rand::SeedableRng;
    use tokio::task::JoinSet;

    use super::*;
    use crate::config::TimingProfile;
    use crate::engine::FinishReason;

    #[tokio::test(start_paused = true)]
    async fn steps_take_their_simulated_time_divided_by_the_time_scale() {
        let mut cfg = PodConfig::default();
        cfg.engine.timing = TimingProfile {
            step_overhead: Duration::from_millis(10),
            prefill_per_token: Duration::from_millis(1),
            decode_per_seq: Duration::ZERO,
            attention_per_context_token: Duration::ZERO,
        };
        cfg.engine.time_scale = 2.0;
        let cfg = Arc::new(cfg);
        let metrics = Arc::new(Mutex::new(PodMetrics::new(1024, 1e9)));
        let (commands_tx, commands) = mpsc::unbounded_channel();
        let engine = Engine::new(cfg.engine.clone(), SmallRng::seed_from_u64(0), vec![7]);
        let runner = Runner {
            engine,
            commands,
            metrics: metrics.clone(),
            publisher: None,
            clock: SimClock::new(1e9),
            cfg,
        };
        let cancel = CancellationToken::new();
        let mut tasks = JoinSet::new();
        tasks.spawn(runner.run(cancel.clone()));

        let (output, mut out) = mpsc::unbounded_channel();
        let start = Instant::now();
        let request = NewRequest {
            prompt: vec![1; 10],
            max_output: 2,
            reason_at_limit: FinishReason::Length,
            params_max_tokens: Some(2),
            lora: None,
            cache_salt: None,
            arrival: start,
            output,
            kv: crate::engine::KvTransfer::None,
        };
        commands_tx
            .send(Command::Submit(Box::new(request)))
            .unwrap();
        // Prefill step: (10 ms + 10 × 1 ms) / 2; decode step: 10 ms / 2.
        assert_eq!(out.recv().await, Some(SeqOutput::Token(7)));
        assert_eq!(start.elapsed(), Duration::from_millis(10));
        assert!(matches!(out.recv().await, Some(SeqOutput::Last(7, _))));
        assert_eq!(start.elapsed(), Duration::from_millis(15));
        // Metrics report simulated seconds (wall × time scale).
        let m = metrics.lock().unwrap().clone();
        assert!(
            (m.histograms.ttft.sum - 0.020).abs() < 1e-9,
            "{}",
            m.histograms.ttft.sum
        );
        assert!((m.histograms.inter_token_latency.sum - 0.010).abs() < 1e-9);
        cancel.cancel();
        while tasks.join_next().await.is_some() {}
    }
}
