//! Cases for the request parsers: OpenAI, Anthropic, vLLM HTTP, Vertex AI and vLLM gRPC bodies,
//! and passthrough.

use super::*;

pub(super) fn parsers() -> Vec<Case> {
    let bad = |body: &str| req(body.to_owned());
    let chat = Req {
        path: "/v1/chat/completions",
        ..req(
            serde_json::json!({"model": harness_model(), "max_tokens": 1,
                "messages": [{"role": "user", "content": "hi"}]})
            .to_string(),
        )
    };
    vec![case(
        "openai-parser",
        PARSER_OPENAI,
        waiting(&[4, 1, 2]),
        vec![
            req(completion("hello")),
            chat,
            bad("{not json"),
            bad(r#"{"prompt":"no model"}"#),
            req(completion("")),
        ],
    )]
}

/// The parsers of other APIs, and the one that parses nothing.
pub(super) fn other_parsers() -> Vec<Case> {
    let bad = |body: &str| req(body.to_owned());
    vec![
        case(
            "anthropic-parser",
            PARSER_ANTHROPIC,
            waiting(&[4, 1, 2]),
            vec![
                Req {
                    path: "/v1/messages",
                    ..req(
                        serde_json::json!({"model": harness_model(), "max_tokens": 1,
                        "messages": [{"role": "user", "content": "hi"}]})
                        .to_string(),
                    )
                },
                Req {
                    path: "/v1/messages",
                    ..bad(r#"{"max_tokens":1,"messages":[]}"#)
                },
            ],
        ),
        case(
            "vllmhttp-parser",
            PARSER_VLLMHTTP,
            waiting(&[4, 1, 2]),
            vec![Req {
                path: "/inference/v1/generate",
                ..req(
                    serde_json::json!({"model": harness_model(), "token_ids": [1, 2, 3],
                    "sampling_params": {"max_tokens": 1}})
                    .to_string(),
                )
            }],
        ),
        case(
            "vertexai-parser",
            PARSER_VERTEXAI,
            waiting(&[4, 1, 2]),
            vec![
                Req {
                    path: "/google.cloud.aiplatform.v1beta1.PredictionService/ChatCompletions",
                    ..req(
                        serde_json::json!({"model": harness_model(), "max_tokens": 1,
                        "messages": [{"role": "user", "content": "hi"}]})
                        .to_string(),
                    )
                },
                Req {
                    path: "/google.cloud.aiplatform.v1beta1.PredictionService/RawPredict",
                    ..req(serde_json::json!({"model": harness_model(), "input": "hi"}).to_string())
                },
                Req {
                    path: "/google.cloud.aiplatform.v1beta1.PredictionService/ChatCompletions",
                    ..bad(r#"{"messages":[{"role":"user","content":"hi"}]}"#)
                },
                Req {
                    path: "/v1/completions",
                    ..req(completion("no parser claims this path"))
                },
            ],
        ),
        case(
            "vllmgrpc-parser",
            PARSER_VLLMGRPC,
            waiting(&[4, 1, 2]),
            vec![
                Req {
                    path: "/vllm.grpc.engine.VllmEngine/Generate",
                    ..req("hello from a gRPC client".to_owned())
                },
                Req {
                    path: "/vllm.grpc.engine.VllmEngine/Generate",
                    ..bad("")
                },
                Req {
                    path: "/v1/completions",
                    ..req(completion("no parser claims this path"))
                },
            ],
        ),
        case(
            "passthrough-parser",
            PARSER_PASSTHROUGH,
            waiting(&[4, 1, 2]),
            vec![req(completion("hello")), bad("{not json")],
        ),
    ]
}
