//! The render client against a real HTTP server on loopback that answers as vLLM's render
//! endpoints do (and, for the failure cases, as a broken one would).

use super::testing::server;
use super::*;
use serde_json::Value;

/// A client bound to one render server.
struct Renderer(RenderClient, RenderParams);

impl Renderer {
    async fn render(&self, api: ApiKind, body: &[u8]) -> Result<Vec<u32>, RenderError> {
        self.0.render(&self.1, api, body).await
    }
}

fn renderer(url: &str, timeout: Duration) -> Renderer {
    let params = RenderParams {
        url: url.to_owned(),
        model_name: "base/model".into(),
        timeout,
    };
    Renderer(RenderClient::default(), params)
}

/// vLLM's shapes: ids derived from the prompt so a wrong body gives wrong ids.
fn vllm(path: &str, body: &Value) -> (u16, String) {
    let ids = |s: &str| s.bytes().map(u32::from).collect::<Vec<_>>();
    match path {
        "/v1/completions/render" => {
            let p = body["prompt"].as_str().unwrap_or_default();
            (200, serde_json::json!([{"token_ids": ids(p)}]).to_string())
        }
        "/v1/chat/completions/render" => {
            let m = body["messages"][0]["content"].as_str().unwrap_or_default();
            (
                200,
                serde_json::json!({"token_ids": ids(m), "features": null}).to_string(),
            )
        }
        _ => (404, "{}".into()),
    }
}

#[tokio::test]
async fn completions_and_chat_render_on_their_paths_with_the_configured_model() {
    let (url, seen) = server(vllm, Duration::ZERO).await;
    let r = renderer(&url, Duration::from_secs(5));
    let ids = r
        .render(
            ApiKind::Completions,
            br#"{"model":"lora-a","prompt":"ab","max_tokens":3}"#,
        )
        .await
        .unwrap();
    assert_eq!(ids, vec![97, 98]);
    let ids = r
        .render(
            ApiKind::ChatCompletions,
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        )
        .await
        .unwrap();
    assert_eq!(ids, vec![104, 105]);
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].0, "/v1/completions/render");
    assert_eq!(
        seen[0].1["model"], "base/model",
        "the base model is stamped in"
    );
    assert_eq!(seen[0].1["max_tokens"], 3, "the other fields are forwarded");
    assert_eq!(seen[1].0, "/v1/chat/completions/render");
}

#[tokio::test]
async fn failures_are_errors_of_their_kind_never_ids() {
    let broken = |_: &str, _: &Value| (500, "engine dead".to_owned());
    let (url, _) = server(broken, Duration::ZERO).await;
    let e = renderer(&url, Duration::from_secs(5))
        .render(ApiKind::Completions, br#"{"model":"m","prompt":"x"}"#)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, RenderError::Status { status: 500, snippet } if snippet == "engine dead"),
        "{e}"
    );
    assert_eq!(e.kind(), "status");

    let (url, _) = server(vllm, Duration::from_millis(400)).await;
    let e = renderer(&url, Duration::from_millis(50))
        .render(ApiKind::Completions, br#"{"model":"m","prompt":"x"}"#)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "timeout", "{e}");

    let empty = |_: &str, _: &Value| (200, "[]".to_owned());
    let (url, _) = server(empty, Duration::ZERO).await;
    let e = renderer(&url, Duration::from_secs(5))
        .render(ApiKind::Completions, br#"{"model":"m","prompt":"x"}"#)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "answer", "{e}");

    let (url, seen) = server(vllm, Duration::ZERO).await;
    let e = renderer(&url, Duration::from_secs(5))
        .render(ApiKind::Completions, b"[1,2]")
        .await
        .unwrap_err();
    assert!(matches!(e, RenderError::NotObject));
    assert!(
        seen.lock().unwrap().is_empty(),
        "nothing sent for a body that is no object"
    );

    // Nobody listening.
    let e = renderer("http://127.0.0.1:1", Duration::from_secs(2))
        .render(ApiKind::Completions, br#"{"model":"m","prompt":"x"}"#)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "call", "{e}");
}
