//! The `token-producer` parameters and the render protocol's two answer shapes.

use super::*;

fn params(yaml: &str) -> Result<Option<RenderParams>, String> {
    let p: TokenProducerParams = serde_norway::from_str(yaml).map_err(|e| e.to_string())?;
    p.render().map_err(|e| e.to_string())
}

#[test]
fn the_backend_follows_upstreams_selection_and_every_bad_value_is_named() {
    assert_eq!(params("{}").unwrap(), None, "estimate: epp's own tokenizer");
    assert_eq!(params("{estimate: {image: {mode: static}}}").unwrap(), None);
    let p = params("{modelName: Qwen/Qwen3-8B}").unwrap().unwrap();
    assert_eq!(p.url, "http://localhost:8000");
    assert_eq!(p.timeout, Duration::from_secs(5));
    let p = params("{modelName: m, vllm: {url: 'http://render:8000/', timeout: 250ms}}")
        .unwrap()
        .unwrap();
    assert_eq!(
        (p.url.as_str(), p.timeout),
        ("http://render:8000", Duration::from_millis(250))
    );
    for (bad, names) in [
        ("{vllm: {url: 'http://x'}}", "modelName"),
        ("{modelName: m, vllm: {url: 'https://x'}}", "vllm.url"),
        ("{modelName: m, vllm: {url: 'not a url'}}", "vllm.url"),
        ("{modelName: m, vllm: {timeout: soon}}", "vllm.timeout"),
        ("{modelName: m, vllm: {timeout: 0s}}", "vllm.timeout"),
        ("{modelName: m, vllm: {mmTimeout: x}}", "vllm.mmTimeout"),
        (
            "{udsTokenizerConfig: {socketFile: /tmp/t.sock}}",
            "udsTokenizerConfig",
        ),
        ("{modelName: m, vllm: {port: 1}}", "port"),
    ] {
        let e = params(bad).unwrap_err();
        assert!(e.contains(names), "{bad}: {e}");
    }
}

#[test]
fn answers_are_read_in_each_apis_shape() {
    let ids = token_ids(
        ApiKind::Completions,
        br#"[{"token_ids":[1,2]},{"token_ids":[3]}]"#,
    )
    .unwrap();
    assert_eq!(ids, vec![1, 2], "the request's (first) prompt");
    let ids = token_ids(
        ApiKind::ChatCompletions,
        br#"{"token_ids":[7],"features":null}"#,
    )
    .unwrap();
    assert_eq!(ids, vec![7]);
    for (api, bad) in [
        (ApiKind::Completions, &b"[]"[..]),
        (ApiKind::Completions, br#"{"token_ids":[1]}"#),
        (ApiKind::ChatCompletions, br#"[{"token_ids":[1]}]"#),
        (ApiKind::ChatCompletions, br#"{"token_ids":[-1]}"#),
    ] {
        assert_eq!(token_ids(api, bad).unwrap_err().kind(), "answer");
    }
    let p = RenderParams {
        url: "http://r:8000".into(),
        model_name: "base".into(),
        timeout: Duration::from_secs(1),
    };
    assert_eq!(
        p.url_for(ApiKind::ChatCompletions),
        "http://r:8000/v1/chat/completions/render"
    );
    assert_eq!(
        p.url_for(ApiKind::Completions),
        "http://r:8000/v1/completions/render"
    );
    let sent: serde_json::Value = serde_json::from_slice(
        &p.payload(br#"{"model":"lora","prompt":"x","n":2}"#)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        sent,
        serde_json::json!({"model": "base", "prompt": "x", "n": 2})
    );
    assert!(matches!(p.payload(b"[]"), Err(RenderError::NotObject)));
}
