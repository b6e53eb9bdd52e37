//! Precise prefix routing from KV-cache events: epp's decoder against an independent msgpack
//! encoder (Python), gap repair through the replay socket, unrepairable gaps, eviction and pod
//! restarts with the simulator's real event streams, and two epp replicas that agree without
//! talking to each other.

mod kvevents_support;

use epp::kvevents::decode::{decode_batch, KvEvent};
use kvevents_support::*;
use serde_json::{json, Value};

fn meaning(e: &KvEvent) -> Value {
    match e {
        KvEvent::BlockStored { block_hashes, parent_block_hash, token_ids, block_size, lora_name, medium } => json!({
            "kind": "stored", "hashes": block_hashes, "parent": parent_block_hash, "tokens": token_ids,
            "block_size": block_size, "lora_name": lora_name, "medium": medium,
        }),
        KvEvent::BlockRemoved { block_hashes, medium } => json!({"kind": "removed", "hashes": block_hashes, "medium": medium}),
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
        let bytes: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex")).collect();
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
    let (a, c, b) = (block(0, None, 1), block(1, Some(1), 2), block(2, Some(2), 3));
    pod.publish_until_seen(&replica, 0, a).await;
    pod.buffer(1, c);
    pod.send(2, b).await;
    let keys = keys_of(&chain_tokens(3));
    wait_for(|| replica.matched(pod.id(), &keys) == 3, "blocks 0..3 after replaying seq 1").await;
    replica.stop().await;
}

#[tokio::test]
async fn an_unrepairable_gap_drops_and_rebuilds_the_endpoint() {
    let pod = FakePod::start(false).await;
    let replica = Replica::start(&[pod.endpoint()]).await;
    pod.publish_until_seen(&replica, 0, block(0, None, 1)).await;
    let other = other_block(9);
    pod.send(2, other.clone()).await;
    wait_for(|| replica.matched(pod.id(), &keys_of(&other_tokens())) == 1, "the block after the gap").await;
    assert_eq!(replica.matched(pod.id(), &keys_of(&chain_tokens(1))), 0, "entries from before the gap are dropped");
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
        wait_for(|| replica.matched(sims.id(pod), &keys) >= keys.len() - 1, "the prompt's blocks from the events").await;
    }
    // Evict on pod 0: other prompts fill its 40-block cache.
    for i in 0..4 {
        sims.complete(0, &long_prompt(&format!("filler {i}"), 150)).await;
    }
    let keys = replica.prompt_keys(&prompt);
    wait_for(|| replica.matched(sims.id(0), &keys) < keys.len() / 2, "eviction of the first prompt").await;
    assert!(replica.matched(sims.id(1), &keys) >= keys.len() - 1, "pod 1 still holds it");
    // A restarted pod starts empty.
    sims.cluster.restart(1).await.expect("restart");
    wait_for(|| replica.matched(sims.id(1), &keys) == 0, "pod 1's entries dropped on restart").await;
    // The subscriber reconnects by itself; batches published before it has re-subscribed are
    // recovered through the replay socket when the next one shows the gap.
    sims.complete(1, &prompt).await;
    for i in 0.. {
        if replica.matched(sims.id(1), &keys) >= keys.len() - 1 {
            break;
        }
        assert!(i < 100, "pod 1 rebuilt from new events");
        sims.complete(1, &long_prompt(&format!("nudge {i}"), 20)).await;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
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
    wait_for(|| b.matched(pod_id, &keys) >= 20, "replica B learns pod's blocks from the events").await;
    for q in ["two", "three", "four"] {
        assert_eq!(b.route_chat(&format!("{system} Question {q}?")), pod, "replica B follows the cache replica A created");
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
        assert_eq!(r.route_completion(&prompt), first, "speculative entries hold the burst together");
    }
    assert_ne!(r.route_completion(&prompt), first, "a saturated pod gets no prefix credit");
    r.stop().await;
    sims.cluster.shutdown().await;
}
