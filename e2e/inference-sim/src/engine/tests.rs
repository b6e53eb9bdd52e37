//! Scheduler-step tests of the pure engine, driven by a manual clock.

use std::time::Duration;

use rand::SeedableRng;
use tokio::sync::mpsc;

use super::*;
use crate::config::TimingProfile;

fn cfg() -> EngineConfig {
    EngineConfig {
        max_num_seqs: 4,
        max_num_batched_tokens: 512,
        num_gpu_blocks: 1001,
        block_size: 16,
        timing: TimingProfile {
            step_overhead: Duration::from_millis(5),
            prefill_per_token: Duration::from_micros(100),
            decode_per_seq: Duration::from_micros(100),
            attention_per_context_token: Duration::ZERO,
        },
        ..EngineConfig::default()
    }
}

struct Harness {
    engine: Engine,
    now: Instant,
    steps: usize,
}

impl Harness {
    fn new(cfg: EngineConfig) -> Self {
        let engine = Engine::new(cfg, SmallRng::seed_from_u64(1), vec![11, 12, 13]);
        Self {
            engine,
            now: Instant::now(),
            steps: 0,
        }
    }

    fn submit(
        &mut self,
        prompt: Vec<u32>,
        max_output: usize,
    ) -> mpsc::UnboundedReceiver<SeqOutput> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.engine.add(NewRequest {
            prompt,
            max_output,
            reason_at_limit: FinishReason::Length,
            params_max_tokens: Some(max_output),
            lora: None,
            cache_salt: None,
            arrival: self.now,
            output: tx,
            kv: KvTransfer::None,
        });
        rx
    }

    fn step(&mut self) -> Option<StepPlan> {
        let plan = self.engine.schedule(self.now)?;
        self.now += plan.duration;
        self.engine.complete(self.now);
        self.steps += 1;
        Some(plan)
    }

    fn run_to_idle(&mut self) {
        while self.step().is_some() {
            assert!(self.steps < 100_000, "engine does not converge");
        }
    }

    /// Simulated time until the first token of a lone request.
    fn ttft_alone(&mut self, prompt: Vec<u32>) -> Duration {
        let start = self.now;
        let mut rx = self.submit(prompt, 1);
        self.run_to_idle();
        let mut usage = None;
        while let Ok(out) = rx.try_recv() {
            if let SeqOutput::Last(_, u) = out {
                usage = Some(u);
            }
        }
        assert_eq!(usage.map(|u| u.reason), Some(FinishReason::Length));
        self.now - start
    }
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| seed * 100_000 + i).collect()
}

#[test]
fn ttft_grows_with_uncached_prompt_tokens_and_drops_for_a_cached_prefix() {
    let mut h = Harness::new(cfg());
    let short = h.ttft_alone(prompt(1, 64));
    let long = h.ttft_alone(prompt(2, 480));
    assert!(
        long > short + Duration::from_millis(30),
        "{short:?} {long:?}"
    );

    // Same 480-token prefix + 16 new tokens: 480 tokens come from the cache.
    let mut again = prompt(2, 480);
    again.extend(prompt(3, 16));
    let cached = h.ttft_alone(again);
    assert!(cached < short, "cached {cached:?} vs short {short:?}");
    let report = h.engine.take_report();
    assert_eq!(report.prefix_hits, 480);
}

#[test]
fn requests_beyond_max_num_seqs_wait_and_start_later() {
    let mut h = Harness::new(cfg());
    let rxs: Vec<_> = (0..6).map(|i| h.submit(prompt(i, 32), 8)).collect();
    h.step();
    let g = h.engine.gauges();
    assert_eq!((g.running, g.waiting), (4, 2));
    h.run_to_idle();
    let report = h.engine.take_report();
    let ttfts: Vec<f64> = report.first_tokens.iter().map(|(t, _)| *t).collect();
    assert_eq!(ttfts.len(), 6);
    assert!(ttfts[4] > ttfts[0] * 3.0, "{ttfts:?}");
    let queued = report.finished.iter().filter(|f| f.queue > 0.0).count();
    assert_eq!(queued, 2);
    drop(rxs);
}

#[test]
fn long_prompts_are_prefilled_in_chunks_of_the_token_budget() {
    let mut h = Harness::new(EngineConfig {
        max_num_batched_tokens: 64,
        ..cfg()
    });
    let _rx = h.submit(prompt(1, 200), 2);
    let plans: Vec<StepPlan> = std::iter::from_fn(|| h.step()).collect();
    let prefill: Vec<usize> = plans.iter().map(|p| p.prefill_tokens).collect();
    assert_eq!(prefill, vec![64, 64, 64, 8, 0]);
    assert_eq!(plans.last().map(|p| p.decode_seqs), Some(1));
}

#[test]
fn step_time_rises_with_the_decode_batch() {
    let mut h = Harness::new(cfg());
    let _a = h.submit(prompt(1, 16), 4);
    h.step();
    let one = h.step().map(|p| p.duration);
    let _rest: Vec<_> = (2..5).map(|i| h.submit(prompt(i, 16), 4)).collect();
    h.step();
    let four = h.step().map(|p| (p.duration, p.decode_seqs));
    assert_eq!(four.map(|f| f.1), Some(4));
    assert!(four.map(|f| f.0) > one);
}

#[test]
fn running_out_of_blocks_preempts_the_last_request_which_still_finishes() {
    // 12 usable blocks of 16 tokens; two requests that grow to 8 blocks each.
    let mut h = Harness::new(EngineConfig {
        num_gpu_blocks: 13,
        ..cfg()
    });
    let mut a = h.submit(prompt(1, 64), 64);
    let mut b = h.submit(prompt(2, 64), 64);
    h.run_to_idle();
    let report = h.engine.take_report();
    assert!(report.preemptions > 0);
    for rx in [&mut a, &mut b] {
        let mut tokens = 0;
        while let Ok(out) = rx.try_recv() {
            tokens += usize::from(matches!(out, SeqOutput::Token(_) | SeqOutput::Last(..)));
        }
        assert_eq!(tokens, 64);
    }
    assert_eq!(h.engine.gauges().kv_usage, 0.0);
}

#[test]
fn kv_usage_counts_blocks_of_running_requests_only() {
    let mut h = Harness::new(EngineConfig {
        num_gpu_blocks: 101,
        ..cfg()
    });
    let _rx = h.submit(prompt(1, 160), 10);
    h.step();
    // 160 prompt tokens = 10 blocks; one more block for the first output token
    // is allocated at the next step.
    assert!((h.engine.gauges().kv_usage - 0.10).abs() < 1e-9);
    h.run_to_idle();
    assert_eq!(h.engine.gauges().kv_usage, 0.0);
}

#[test]
fn a_dropped_client_aborts_its_request() {
    let mut h = Harness::new(cfg());
    let rx = h.submit(prompt(1, 32), 1000);
    h.step();
    drop(rx);
    h.run_to_idle();
    let report = h.engine.take_report();
    assert_eq!(report.finished.len(), 1);
    assert_eq!(report.finished[0].usage.reason, FinishReason::Abort);
}

#[test]
fn lora_requests_beyond_max_loras_wait_for_a_slot() {
    let mut h = Harness::new(EngineConfig {
        max_loras: 1,
        ..cfg()
    });
    let mut rxs = Vec::new();
    for (i, name) in ["a", "b"].iter().enumerate() {
        let (tx, rx) = mpsc::unbounded_channel();
        h.engine.add(NewRequest {
            prompt: prompt(i as u32, 16),
            max_output: 4,
            reason_at_limit: FinishReason::Length,
            params_max_tokens: None,
            lora: Some(LoraRef {
                id: i as u64 + 1,
                name: (*name).into(),
            }),
            cache_salt: None,
            arrival: h.now,
            output: tx,
            kv: KvTransfer::None,
        });
        rxs.push(rx);
    }
    h.step();
    let g = h.engine.gauges();
    assert_eq!(
        (g.running_loras, g.waiting_loras),
        (vec!["a".to_string()], vec!["b".to_string()])
    );
    h.run_to_idle();
    assert_eq!(h.engine.take_report().finished.len(), 2);
}

#[test]
fn stored_events_carry_the_vllm_hashes_of_the_prompt() {
    let mut h = Harness::new(EngineConfig {
        hash_seed: "vllm-none-hash".into(),
        ..cfg()
    });
    let _rx = h.submit((1..=40).collect(), 1);
    h.step();
    let events = h.engine.take_events();
    let KvEvent::BlockStored {
        block_hashes,
        parent_block_hash,
        ..
    } = &events[0]
    else {
        panic!("{events:?}");
    };
    assert_eq!(block_hashes, &vec![8866452693264111234, 807986237951177663]);
    assert_eq!(parent_block_hash, &None);
}

fn nixl(c: &mut EngineConfig) {
    c.kv_transfer = Some(crate::config::KvTransferConfig {
        role: crate::config::KvRole::Both,
        bytes_per_token: 1e6,
        bandwidth_gbps: 1.0,
        engine_id: "e".into(),
        host: "127.0.0.1".into(),
        port: 5600,
    });
}

#[test]
fn a_remote_prefill_pulls_the_kv_instead_of_computing_it() {
    let mut c = cfg();
    nixl(&mut c);
    let mut h = Harness::new(c);
    let (tx, mut rx) = mpsc::unbounded_channel();
    h.engine.add(NewRequest {
        prompt: prompt(5, 480),
        max_output: 2,
        reason_at_limit: FinishReason::Length,
        params_max_tokens: Some(2),
        lora: None,
        cache_salt: None,
        arrival: h.now,
        output: tx,
        kv: KvTransfer::RemotePrefill { blocks: 30 },
    });
    let start = h.now;
    assert!(h.step().is_none(), "nothing runs while the KV is in flight");
    // 479 tokens (the last is computed here) × 1 MB at 1 GB/s.
    let ready = h.engine.next_ready().unwrap();
    let waited = (ready - start).as_secs_f64();
    assert!((waited - 0.479).abs() < 1e-6, "{waited}");
    h.now = ready;
    let plan = h.step().unwrap();
    assert_eq!(
        plan.prefill_tokens, 1,
        "only the last prompt token is computed"
    );
    h.run_to_idle();
    let report = h.engine.take_report();
    assert_eq!(report.kv_transfers, vec![(0.479, 479e6)]);
    assert_eq!(report.first_tokens[0].1, 1, "prompt tokens computed here");
    let mut usage = None;
    while let Ok(out) = rx.try_recv() {
        if let SeqOutput::Last(_, u) = out {
            usage = Some(u);
        }
    }
    assert_eq!(usage.unwrap().cached_tokens, 479);
}

#[test]
fn a_prefill_for_a_remote_decode_reports_its_blocks_and_a_local_hit_is_not_pulled() {
    let mut c = cfg();
    nixl(&mut c);
    let mut h = Harness::new(c);
    let (tx, mut rx) = mpsc::unbounded_channel();
    h.engine.add(NewRequest {
        prompt: prompt(6, 480),
        max_output: 1,
        reason_at_limit: FinishReason::Length,
        params_max_tokens: Some(1),
        lora: None,
        cache_salt: None,
        arrival: h.now,
        output: tx,
        kv: KvTransfer::RemoteDecode,
    });
    h.run_to_idle();
    let Ok(SeqOutput::Last(_, usage)) = rx.try_recv() else {
        panic!("no final token")
    };
    assert_eq!(usage.block_ids.len(), 30);
    // The same prompt decoded here after a remote prefill: 464 tokens are local hits (29
    // full blocks, the lookup stops before the last token), 15 are pulled.
    let (tx, _rx) = mpsc::unbounded_channel();
    h.engine.add(NewRequest {
        prompt: prompt(6, 480),
        max_output: 1,
        reason_at_limit: FinishReason::Length,
        params_max_tokens: Some(1),
        lora: None,
        cache_salt: None,
        arrival: h.now,
        output: tx,
        kv: KvTransfer::RemotePrefill { blocks: 30 },
    });
    assert!(h.step().is_none());
    h.now = h.engine.next_ready().unwrap();
    h.run_to_idle();
    let report = h.engine.take_report();
    assert_eq!(report.kv_transfers, vec![(0.015, 15e6)]);
}
