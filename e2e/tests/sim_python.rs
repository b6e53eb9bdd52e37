//! inference-sim checked by independent decoders: the Prometheus exposition by
//! `prometheus_client`'s parser, KV events by pyzmq + msgpack. The venv is
//! created once under target/ by `tests/sim_py/venv.sh`.

use crate::sim_support;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use inference_sim::{EventEncoding, KvEventsConfig, SocketMode};
use serde_json::{json, Value};
use sim_support::{metrics, pod_config, post, start, MODEL};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

fn py_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sim_py")
}

async fn python() -> String {
    let target = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target");
    let out = Command::new("bash")
        .arg(py_dir().join("venv.sh"))
        .arg(target)
        .stderr(Stdio::inherit())
        .output()
        .await
        .expect("venv.sh runs");
    assert!(out.status.success(), "venv.sh failed");
    String::from_utf8(out.stdout)
        .expect("test setup")
        .trim()
        .to_owned()
}

#[tokio::test]
async fn metrics_exposition_parses_with_prometheus_client() {
    let cluster = start(vec![pod_config("p0")]).await;
    let addr = cluster.addrs()[0];
    for model in [MODEL, "food-review-1"] {
        post(
            addr,
            "/v1/completions",
            json!({"model": model, "prompt": "hello there", "max_tokens": 3}),
        )
        .await;
    }
    let text = metrics(addr).await;
    let mut child = Command::new(python().await)
        .arg(py_dir().join("check_metrics.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .await
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(
        out.status.success(),
        "prometheus_client rejected the exposition:\n{text}"
    );
    let families: Value = serde_json::from_slice(&out.stdout).unwrap();
    let family = |name: &str| {
        families
            .get(name)
            .unwrap_or_else(|| panic!("no family {name}"))
    };
    // prometheus_client strips `_total` from counter family names.
    assert_eq!(family("vllm:prompt_tokens")["type"], "counter");
    assert_eq!(family("vllm:num_requests_running")["type"], "gauge");
    assert_eq!(
        family("vllm:time_to_first_token_seconds")["type"],
        "histogram"
    );
    assert_eq!(family("vllm:prompt_tokens_created")["type"], "gauge");
    let success = &family("vllm:request_success")["samples"];
    let length = success
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s[1]["finished_reason"] == "length")
        .unwrap();
    assert_eq!(
        length[1],
        json!({"engine": "0", "finished_reason": "length", "model_name": MODEL})
    );
    assert_eq!(length[2], 2.0);
    let kv = &family("vllm:kv_cache_usage_perc")["samples"][0];
    assert_eq!(kv[1], json!({"engine": "0", "model_name": MODEL}));
    let cache = &family("vllm:cache_config_info")["samples"][0][1];
    assert_eq!(
        (&cache["block_size"], &cache["num_gpu_blocks"]),
        (&json!("16"), &json!("2001"))
    );
    let lora = family("vllm:lora_requests_info")["samples"]
        .as_array()
        .unwrap();
    let running: Vec<&Value> = lora
        .iter()
        .map(|s| &s[1]["running_lora_adapters"])
        .collect();
    assert!(running.contains(&&json!("food-review-1")), "{lora:?}");
    assert!(
        lora.iter().all(|s| s[2].as_f64().unwrap() > 1.7e9),
        "timestamps"
    );
    cluster.shutdown().await;
}

async fn kv_events_round_trip(encoding: EventEncoding) -> Value {
    let mut cfg = pod_config("kv-pod");
    cfg.engine.hash_seed = "vllm-none-hash".into();
    cfg.engine.num_gpu_blocks = 5; // 4 usable blocks: the second prompt evicts the first
    cfg.kv_events = Some(KvEventsConfig {
        endpoint: "tcp://127.0.0.1:0".into(),
        mode: SocketMode::Bind,
        replay_endpoint: Some("tcp://127.0.0.1:0".into()),
        topic: "kv@127.0.0.1:8000@sim-model".into(),
        encoding,
        buffer_steps: 100,
        dp_rank: 0,
    });
    let cluster = start(vec![cfg]).await;
    let addr = cluster.addrs()[0];
    let control = cluster
        .control(0)
        .await
        .expect("test setup")
        .expect("test setup");
    let ends = control.kv_endpoints().clone();
    let mut child = Command::new(python().await)
        .arg(py_dir().join("check_kv_events.py"))
        .arg(ends.publish.expect("test setup"))
        .arg(ends.replay.expect("test setup"))
        .arg("20")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the KV-event decoder");
    let mut stdout = BufReader::new(child.stdout.take().expect("test setup"));
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(60), stdout.read_line(&mut line))
        .await
        .expect("test setup")
        .expect("test setup");
    assert_eq!(line.trim(), "ready");
    let first: Vec<u32> = (1..=40).collect();
    post(
        addr,
        "/v1/completions",
        json!({"model": MODEL, "prompt": first, "max_tokens": 1}),
    )
    .await;
    let second: Vec<u32> = (100..140).collect();
    post(
        addr,
        "/v1/completions",
        json!({"model": MODEL, "prompt": second, "max_tokens": 1}),
    )
    .await;
    assert_eq!(
        post(addr, "/reset_prefix_cache", json!({})).await.status,
        http::StatusCode::OK
    );
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(60), stdout.read_to_string(&mut out))
        .await
        .expect("test setup")
        .expect("test setup");
    let status = child.wait().await.expect("test setup");
    assert!(status.success());
    cluster.shutdown().await;
    serde_json::from_str(&out).expect("test setup")
}

fn events(batches: &Value) -> Vec<Value> {
    batches
        .as_array()
        .expect("test setup")
        .iter()
        .flat_map(|b| b["batch"]["events"].as_array().expect("test setup").clone())
        .collect()
}

async fn check_kv_events(encoding: EventEncoding) {
    let got = kv_events_round_trip(encoding).await;
    let live = &got["live"];
    let all = events(live);
    let stored: Vec<&Value> = all.iter().filter(|e| e["type"] == "BlockStored").collect();
    // tokens 1..=40 with seed "vllm-none-hash": the reference vectors' first two blocks.
    assert_eq!(
        stored[0]["block_hashes"],
        json!([8866452693264111234u64, 807986237951177663u64])
    );
    assert_eq!(stored[0]["parent_block_hash"], Value::Null);
    assert_eq!(
        stored[0]["token_ids"],
        json!((1..=32).collect::<Vec<u32>>())
    );
    assert_eq!(stored[0]["block_size"], 16);
    assert_eq!(stored[0]["medium"], "GPU");
    let removed: Vec<&Value> = all.iter().filter(|e| e["type"] == "BlockRemoved").collect();
    assert!(
        !removed.is_empty(),
        "reusing cached blocks must emit BlockRemoved: {all:?}"
    );
    assert_eq!(all.last().expect("test setup")["type"], "AllBlocksCleared");
    let live = live.as_array().expect("test setup");
    assert!(live
        .iter()
        .all(|m| m["topic"] == "kv@127.0.0.1:8000@sim-model"));
    assert!(live.iter().all(|m| m["batch"]["dp_rank"] == 0));
    let seqs: Vec<u64> = live
        .iter()
        .map(|m| m["seq"].as_u64().expect("test setup"))
        .collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    let replay = got["replay"].as_array().expect("test setup");
    assert_eq!(replay[0]["seq"], 0);
    assert_eq!(replay.len() as u64, seqs.last().expect("test setup") + 1);
    assert_eq!(got["end_marker"], true);
    for m in live {
        let same = replay
            .iter()
            .find(|r| r["seq"] == m["seq"])
            .expect("live batch is replayable");
        assert_eq!(same["batch"], m["batch"]);
    }
}

#[tokio::test]
async fn kv_events_decode_with_pyzmq_and_msgpack_in_array_form() {
    check_kv_events(EventEncoding::Array).await;
}

#[tokio::test]
async fn kv_events_decode_with_pyzmq_and_msgpack_in_map_form() {
    check_kv_events(EventEncoding::Map).await;
}
