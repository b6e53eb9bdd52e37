//! The stand-in's body rewrites and rank layout.

use super::*;

#[test]
fn rank_r_decodes_on_the_model_servers_port_plus_r() {
    let cfg = SidecarConfig::new("127.0.0.1:8200".parse().unwrap());
    assert_eq!(cfg.rank_decoder(3).unwrap().port(), 8203);
    let top = SidecarConfig::new("127.0.0.1:65535".parse().unwrap());
    assert!(top
        .rank_decoder(1)
        .unwrap_err()
        .to_string()
        .contains("past 65535"));
}

#[tokio::test]
async fn each_rank_needs_its_listener() {
    let cfg = SidecarConfig {
        data_parallel_size: 2,
        ..SidecarConfig::new("127.0.0.1:8200".parse().unwrap())
    };
    let one = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = Sidecar::start_ranks(vec![one], cfg).err().unwrap();
    assert!(
        err.to_string()
            .contains("--data-parallel-size 2 needs as many listeners, got 1"),
        "{err}"
    );
}

#[test]
fn the_prefill_leg_asks_for_one_token_without_streaming() {
    let original: Map<String, Value> = serde_json::from_str(
        r#"{"model":"m","prompt":"hi","max_tokens":50,"stream":true,"stream_options":{"include_usage":true}}"#,
    )
    .unwrap();
    let p: Value = serde_json::from_slice(&prefill_leg(&original)).unwrap();
    assert_eq!(p["stream"], json!(false));
    assert!(p.get("stream_options").is_none());
    for f in TOKEN_FIELDS {
        assert_eq!(p[f], json!(1), "{f}");
    }
    assert_eq!(p["kv_transfer_params"]["do_remote_decode"], json!(true));
    assert_eq!(p["kv_transfer_params"]["remote_block_ids"], Value::Null);
    assert_eq!(
        original["max_tokens"],
        json!(50),
        "the decode leg keeps the client's"
    );
}

#[test]
fn cached_tokens_are_rewritten_in_json_and_sse() {
    let body =
        Bytes::from(r#"{"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":8}}}"#);
    let out: Value = serde_json::from_slice(&rewrite_cached(&body, 3)).unwrap();
    assert_eq!(
        out["usage"]["prompt_tokens_details"]["cached_tokens"],
        json!(3)
    );
    let sse = Bytes::from(
        "data: {\"usage\":{\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\ndata: [DONE]\n\n",
    );
    let out = String::from_utf8(rewrite_cached(&sse, 0).to_vec()).unwrap();
    assert!(
        out.contains("\"cached_tokens\":0") && out.ends_with("data: [DONE]\n\n"),
        "{out}"
    );
    let untouched = Bytes::from("data: {\"choices\":[]}\n\n");
    assert_eq!(rewrite_cached(&untouched, 0), untouched);
}
