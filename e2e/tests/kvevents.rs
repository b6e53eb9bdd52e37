//! Precise prefix routing from KV-cache events: epp's decoder against an independent msgpack
//! encoder (Python), gap repair through the replay socket, unrepairable gaps, eviction and pod
//! restarts with the simulator's real event streams, and two epp replicas that agree without
//! talking to each other.

use crate::kvevents_support;

use epp::kvevents::decode::{decode_batch, KvEvent};
use epp::metrics::{
    EndpointLabels, KvEventKind, KvEventLabels, KvGapLabels, KvGapOutcome, Outcome, OutcomeLabels,
    PeerLabels, PeerOutcome,
};
use kvevents_support::*;
use serde_json::{json, Value};

fn meaning(e: &KvEvent) -> Value {
    match e {
        KvEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            lora_name,
            medium,
        } => json!({
            "kind": "stored", "hashes": block_hashes, "parent": parent_block_hash, "tokens": token_ids,
            "block_size": block_size, "lora_name": lora_name, "medium": medium,
        }),
        KvEvent::BlockRemoved {
            block_hashes,
            medium,
        } => json!({"kind": "removed", "hashes": block_hashes, "medium": medium}),
        KvEvent::AllBlocksCleared => json!({"kind": "cleared"}),
        KvEvent::Unknown => json!({"kind": "unknown"}),
    }
}

#[tokio::test]
async fn decoder_agrees_with_python_msgpack_on_every_shape() {
    let out = python_output("encode_events.py").await;
    let mut cases = 0;
    for line in out.lines() {
        let case: Value = serde_json::from_str(line).expect("script output is JSON");
        let hex = case["hex"].as_str().expect("hex");
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
            .collect();
        let batch = decode_batch(&bytes).unwrap_or_else(|e| panic!("{}: {e}", case["name"]));
        let got: Vec<Value> = batch.events.iter().map(meaning).collect();
        assert_eq!(Value::Array(got), case["expect"], "{}", case["name"]);
        cases += 1;
    }
    assert_eq!(cases, 10);
}

#[tokio::test]
async fn a_gap_is_repaired_through_the_replay_socket() {
    let pod = FakePod::start(true).await;
    let replica = Replica::start(&[pod.endpoint()]).await;
    let (a, c, b) = (
        block(0, None, 1),
        block(1, Some(1), 2),
        block(2, Some(2), 3),
    );
    pod.publish_until_seen(&replica, 0, a).await;
    pod.buffer(1, c);
    pod.send(2, b).await;
    let keys = keys_of(&chain_tokens(3));
    wait_for(
        || replica.matched(pod.id(), &keys) == 3,
        "blocks 0..3 after replaying seq 1",
    )
    .await;
    let kv = &replica.metrics.kv;
    assert_eq!(
        kv.gaps
            .get_or_create(&KvGapLabels {
                outcome: KvGapOutcome::replayed
            })
            .get(),
        1
    );
    assert_eq!(
        kv.gaps
            .get_or_create(&KvGapLabels {
                outcome: KvGapOutcome::dropped
            })
            .get(),
        0
    );
    assert!(
        kv.batches
            .get_or_create(&OutcomeLabels {
                outcome: Outcome::success
            })
            .get()
            >= 3
    );
    assert!(
        kv.events
            .get_or_create(&KvEventLabels {
                kind: KvEventKind::stored
            })
            .get()
            >= 3
    );
    assert_eq!(
        kv.connected
            .get_or_create(&EndpointLabels {
                endpoint: pod.id().to_string()
            })
            .get(),
        1
    );
    replica.stop().await;
}

#[tokio::test]
async fn an_unrepairable_gap_drops_and_rebuilds_the_endpoint() {
    let pod = FakePod::start(false).await;
    let replica = Replica::start(&[pod.endpoint()]).await;
    pod.publish_until_seen(&replica, 0, block(0, None, 1)).await;
    let other = other_block(9);
    pod.send(2, other.clone()).await;
    wait_for(
        || replica.matched(pod.id(), &keys_of(&other_tokens())) == 1,
        "the block after the gap",
    )
    .await;
    assert_eq!(
        replica.matched(pod.id(), &keys_of(&chain_tokens(1))),
        0,
        "entries from before the gap are dropped"
    );
    assert_eq!(
        replica
            .metrics
            .kv
            .gaps
            .get_or_create(&KvGapLabels {
                outcome: KvGapOutcome::dropped
            })
            .get(),
        1
    );
    replica.stop().await;
}

#[tokio::test]
async fn simulator_events_in_both_encodings_track_storage_eviction_and_restart() {
    let sims = SimPods::start(2, 40).await;
    let replica = Replica::start(&sims.endpoints()).await;
    let prompt = long_prompt("alpha", 150); // ~19 blocks of the 40

    for pod in 0..2 {
        sims.complete(pod, &prompt).await;
        let keys = replica.prompt_keys(&prompt);
        wait_for(
            || replica.matched(sims.id(pod), &keys) >= keys.len() - 1,
            "the prompt's blocks from the events",
        )
        .await;
    }
    // Evict on pod 0: other prompts fill its 40-block cache.
    for i in 0..4 {
        sims.complete(0, &long_prompt(&format!("filler {i}"), 150))
            .await;
    }
    let keys = replica.prompt_keys(&prompt);
    wait_for(
        || replica.matched(sims.id(0), &keys) < keys.len() / 2,
        "eviction of the first prompt",
    )
    .await;
    assert!(
        replica.matched(sims.id(1), &keys) >= keys.len() - 1,
        "pod 1 still holds it"
    );
    // A restarted pod starts empty.
    sims.cluster.restart(1).await.expect("restart");
    wait_for(
        || replica.matched(sims.id(1), &keys) == 0,
        "pod 1's entries dropped on restart",
    )
    .await;
    assert!(
        replica.metrics.kv.resets.get() >= 1,
        "the restart is counted"
    );
    wait_for(
        || replica.metrics.kv.index_entries.get() > 0,
        "the index-size gauge",
    )
    .await;
    // The subscriber reconnects by itself; batches published before it has re-subscribed are
    // recovered through the replay socket when the next one shows the gap.
    sims.complete(1, &prompt).await;
    for i in 0.. {
        if replica.matched(sims.id(1), &keys) >= keys.len() - 1 {
            break;
        }
        assert!(i < 100, "pod 1 rebuilt from new events");
        sims.complete(1, &long_prompt(&format!("nudge {i}"), 20))
            .await;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    replica.stop().await;
    sims.cluster.shutdown().await;
}

#[tokio::test]
async fn each_data_parallel_ranks_events_land_on_its_own_endpoint() {
    // One pod, two ranks: both endpoints carry the pod's event port; rank 1 publishes on + 1.
    let sims = SimPods::start_ranks(2, 400).await;
    let replica = Replica::start(&sims.rank_endpoints()).await;
    let (one, zero) = (long_prompt("rank one", 150), long_prompt("rank zero", 150));
    sims.complete(1, &one).await;
    let keys = replica.prompt_keys(&one);
    wait_for(
        || replica.matched(sims.id(1), &keys) >= keys.len() - 1,
        "rank 1's blocks under rank 1's endpoint",
    )
    .await;
    sims.complete(0, &zero).await;
    let zero_keys = replica.prompt_keys(&zero);
    wait_for(
        || replica.matched(sims.id(0), &zero_keys) >= zero_keys.len() - 1,
        "rank 0's blocks under rank 0's endpoint",
    )
    .await;
    assert_eq!(
        replica.matched(sims.id(0), &keys),
        0,
        "rank 0 never stored rank 1's prompt"
    );
    assert_eq!(
        replica.matched(sims.id(1), &zero_keys),
        0,
        "nor rank 1 rank 0's"
    );
    replica.stop().await;
    sims.cluster.shutdown().await;
}

#[tokio::test]
async fn two_replicas_route_a_shared_prefix_to_the_pod_that_holds_it() {
    let sims = SimPods::start(4, 2000).await;
    let a = Replica::start(&sims.endpoints()).await;
    let b = Replica::start(&sims.endpoints()).await;
    let system = long_prompt("You are a meticulous assistant", 400);
    let first = format!("{system} Question one?");
    let pod = a.route_chat(&first);
    sims.chat(pod, &first).await;
    let keys = b.chat_keys(&format!("{system} Question two?"));
    let pod_id = sims.id(pod);
    wait_for(
        || b.matched(pod_id, &keys) >= 20,
        "replica B learns pod's blocks from the events",
    )
    .await;
    for q in ["two", "three", "four"] {
        assert_eq!(
            b.route_chat(&format!("{system} Question {q}?")),
            pod,
            "replica B follows the cache replica A created"
        );
    }
    a.stop().await;
    b.stop().await;
    sims.cluster.shutdown().await;
}

#[tokio::test]
async fn speculative_entries_keep_a_burst_together_before_events_arrive() {
    let sims = SimPods::start(3, 2000).await;
    let r = Replica::start_without_events(&sims.endpoints()).await;
    let prompt = long_prompt("burst", 300);
    let first = r.route_completion(&prompt);
    // The queue grows by one per routed request (no scrapes here); at 5 the pod is saturated.
    for _ in 0..4 {
        assert_eq!(
            r.route_completion(&prompt),
            first,
            "speculative entries hold the burst together"
        );
    }
    assert_ne!(
        r.route_completion(&prompt),
        first,
        "a saturated pod gets no prefix credit"
    );
    r.stop().await;
    sims.cluster.shutdown().await;
}

/// Before any pod's first BlockStored, three replicas that share their speculative entries
/// (`--speculative-peers`) keep a prompt's requests on the pod the first one went to, whichever
/// replica routes them; without sharing the others know nothing of it.
#[tokio::test]
async fn replicas_sharing_speculative_entries_keep_a_new_prefix_together() {
    let sims = SimPods::start(4, 2000).await;
    let replicas = Replica::start_sharing(&sims.endpoints(), 3).await;
    let alone = Replica::start_without_events(&sims.endpoints()).await;
    let system = long_prompt("You answer in verse", 300);
    let pod = replicas[0].route_chat(&format!("{system} Question one?"));
    let keys = replicas[1].chat_keys(&format!("{system} Question two?"));
    let pod_id = sims.id(pod);
    for r in &replicas[1..] {
        wait_for(
            || r.matched(pod_id, &keys) >= 20,
            "the other replicas record the placement",
        )
        .await;
    }
    assert_eq!(
        alone.matched(pod_id, &keys),
        0,
        "a replica outside the group knows nothing of it"
    );
    // The routes below would also agree without sharing whenever the first request went to the
    // cold prompt's home (every replica computes the same one here); what only sharing gives is
    // the entries checked above, which make the pod a full match rather than a half-credited home.
    for (i, q) in ["two", "three", "four", "five"].iter().enumerate() {
        let r = &replicas[1 + i % 2];
        assert_eq!(
            r.route_chat(&format!("{system} Question {q}?")),
            pod,
            "replica {} follows replica 0's placement",
            1 + i % 2
        );
    }
    let applied = replicas[1]
        .metrics
        .peer_messages
        .get_or_create(&PeerLabels {
            outcome: PeerOutcome::applied,
        })
        .get();
    assert!(applied >= 1, "applied placements are counted");
    for r in replicas {
        r.stop().await;
    }
    alone.stop().await;
    sims.cluster.shutdown().await;
}

/// Bind mode: epp binds one SUB socket, the simulator pods' PUB sockets connect to it, and the
/// topic tells the pods apart; a restarted pod's sequence starts over and its entries go.
/// Batches published before a pod's PUB has connected are lost (ZMQ's slow joiner), so each
/// step nudges the pod until a later batch shows the gap and the replay socket fills it.
#[tokio::test]
async fn pods_connecting_to_a_bound_sub_socket_feed_the_index() {
    let bind = format!("tcp://127.0.0.1:{}", free_port());
    let sims = SimPods::start_connecting(2, 40, &bind).await;
    let replica = Replica::start_bound(&sims.bound_endpoints(), &bind).await;
    let prompt = long_prompt("bound", 150);
    let keys = replica.prompt_keys(&prompt);
    assert!(keys.len() >= 8);
    let until_held = |pod: usize, keys: Vec<u64>, prompt: String| {
        let (sims, replica) = (&sims, &replica);
        async move {
            sims.complete(pod, &prompt).await;
            for i in 0.. {
                if replica.matched(sims.id(pod), &keys) >= keys.len() - 1 {
                    return;
                }
                assert!(
                    i < 100,
                    "pod {pod}'s blocks never arrived through the bound socket"
                );
                sims.complete(pod, &long_prompt(&format!("nudge {i}"), 20))
                    .await;
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    };
    until_held(0, keys.clone(), prompt.clone()).await;
    assert_eq!(
        replica.matched(sims.id(1), &keys),
        0,
        "the topic keeps the pods apart"
    );
    until_held(1, keys.clone(), prompt.clone()).await;
    for pod in 0..2 {
        assert_eq!(
            replica
                .metrics
                .kv
                .connected
                .get_or_create(&EndpointLabels {
                    endpoint: sims.id(pod).to_string()
                })
                .get(),
            1
        );
    }
    sims.cluster.restart(1).await.expect("restart");
    let other = long_prompt("after restart", 80);
    until_held(1, replica.prompt_keys(&other), other).await;
    assert_eq!(
        replica.matched(sims.id(1), &keys),
        0,
        "the restart (sequence back to 0) dropped pod 1's old entries"
    );
    assert!(replica.metrics.kv.resets.get() >= 1);
    assert!(
        replica.matched(sims.id(0), &keys) >= keys.len() - 1,
        "pod 0 is untouched"
    );
    replica.stop().await;
    sims.cluster.shutdown().await;
}

/// Active-active before any event: three replicas that never heard of a prompt send it to the
/// same pod (its rendezvous-hash home), and different prompts spread over the pods.
#[tokio::test]
async fn replicas_agree_on_a_cold_prompts_pod_before_any_event() {
    let sims = SimPods::start(4, 2000).await;
    let replicas = [
        Replica::start_without_events(&sims.endpoints()).await,
        Replica::start_without_events(&sims.endpoints()).await,
        Replica::start_without_events(&sims.endpoints()).await,
    ];
    // The replicas see the same (idle) loads but break ties with their own random draws.
    let mut homes = std::collections::HashSet::new();
    for group in 0..16 {
        let prompt = long_prompt(&format!("tenant {group} system prompt"), 200);
        let picks: Vec<usize> = replicas
            .iter()
            .map(|r| r.route_completion(&prompt))
            .collect();
        assert!(
            picks.iter().all(|p| *p == picks[0]),
            "group {group}: replicas disagree {picks:?}"
        );
        homes.insert(picks[0]);
    }
    assert!(
        homes.len() >= 3,
        "16 cold prompts should spread over the 4 pods, got {homes:?}"
    );
    for r in replicas {
        r.stop().await;
    }
    sims.cluster.shutdown().await;
}

/// llm-d v0.10's split precise configuration (`config/examples/llm-d-precise.yaml`), through the
/// gateway: epp binds the SUB socket its `kvEventsConfig.zmqEndpoint` names (no flag), the
/// pods' PUB sockets connect to it, every prompt is tokenized by a pod's render endpoint
/// (`token-producer`, vllm backend), and a prompt's repeats follow the pod whose events hold it.
#[tokio::test]
async fn llm_ds_precise_configuration_runs_unchanged_through_the_gateway() {
    use harness::envoy::{EnvoyConfig, Template};
    let bind = format!("tcp://127.0.0.1:{}", free_port());
    let sims = SimPods::start_connecting(3, 400, &bind).await;
    let example = std::fs::read_to_string(
        harness::envoy::repo_root().join("config/examples/llm-d-precise.yaml"),
    )
    .expect("the example");
    let config = example
        .replace("Qwen/Qwen3-8B", MODEL)
        .replace("http://localhost:8000", &format!("http://{}", sims.addr(0)))
        .replace("tcp://*:5557", &bind);
    assert!(config.contains(&bind) && config.contains(&sims.addr(0).to_string()));
    let endpoints: Vec<String> = (0..3).map(|i| sims.addr(i).to_string()).collect();
    let epp = harness::stack::Epp::start(&[
        "--static-endpoints".into(),
        endpoints.join(","),
        "--secure-serving".into(),
        "false".into(),
        "--config-text".into(),
        config,
    ])
    .await
    .expect("epp starts with llm-d's file");
    let envoy = EnvoyConfig::new(Template::Duplex)
        .epp(epp.grpc)
        .pool((0..3).map(|i| sims.addr(i)))
        .start()
        .await
        .expect("envoy");
    let system = long_prompt("You follow the tenant policy", 300);
    let send = |n: usize| {
        let body =
            json!({"model": MODEL, "prompt": format!("{system} Question {n}?"), "max_tokens": 2});
        let addr = envoy.listener_addr();
        async move {
            let r = harness::client::post_json(addr, "/v1/completions", body.to_string())
                .await
                .expect("answered");
            assert_eq!(r.status, http::StatusCode::OK, "{}", r.text());
            r.header("x-inference-pod")
                .expect("served by a pod")
                .to_owned()
        }
    };
    let home = send(0).await;
    // The pod's BlockStored for the prompt reaches epp through the bound socket.
    for i in 0.. {
        let stored = epp
            .metric("epp_kv_events_total{kind=\"stored\"}")
            .await
            .unwrap_or(0.0);
        if stored > 0.0 {
            break;
        }
        assert!(
            i < 100,
            "no KV event reached the socket kvEventsConfig names"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    for n in 1..=4 {
        assert_eq!(
            send(n).await,
            home,
            "request {n} follows the pod holding the prefix"
        );
    }
    let rendered = epp
        .metric("epp_tokenizer_renders_total{outcome=\"success\"}")
        .await
        .unwrap_or(0.0);
    assert_eq!(
        rendered, 5.0,
        "every prompt tokenized by the render endpoint"
    );
    assert_eq!(
        epp.metric("epp_tokenizer_renders_total{outcome=\"failure\"}")
            .await
            .unwrap_or(0.0),
        0.0
    );
    drop(envoy);
    epp.stop().await;
    sims.cluster.shutdown().await;
}
