use super::*;
use crate::request::parse;
use proptest::prelude::*;

/// Feeds `body` in `cuts`-delimited chunks and returns the first early request (and the bytes
/// fed when it was found), checking each candidate against the whole-body parse.
fn first_early(
    api: ApiKind,
    body: &[u8],
    cuts: &[usize],
    cap: usize,
) -> (Option<(LlmRequest, usize)>, Scanner) {
    let mut s = Scanner::new();
    let mut bounds: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
    bounds.push(body.len());
    bounds.sort_unstable();
    let mut at = 0;
    let mut found = None;
    for b in bounds {
        s.feed(&body[at..b]);
        at = b;
        if found.is_none() {
            found = s.early_request(api, &body[..at], cap).map(|r| (r, at));
        }
    }
    (found, s)
}

fn same_inputs(early: &LlmRequest, whole: &LlmRequest) {
    assert_eq!(early.model, whole.model);
    assert_eq!(early.model_span, whole.model_span);
    assert_eq!(early.prompt, whole.prompt);
    assert_eq!(early.cache_salt, whole.cache_salt);
}

#[test]
fn decides_on_the_model_and_the_first_cap_bytes_of_a_completion_prompt() {
    let prompt = "word ".repeat(200);
    let body = serde_json::json!({"model": "m", "prompt": prompt, "stream": true}).to_string();
    let whole = parse(ApiKind::Completions, body.as_bytes(), 64).unwrap();
    let (found, s) = first_early(
        ApiKind::Completions,
        body.as_bytes(),
        &(1..body.len()).collect::<Vec<_>>(),
        64,
    );
    let (early, at) = found.unwrap();
    same_inputs(&early, &whole);
    assert!(at < 100, "decided after {at} bytes");
    assert!(!early.stream, "stream comes after the prompt");
    assert_eq!(s.stream(), Some(true));
}

#[test]
fn the_model_alone_decides_without_a_prefix_scorer_and_a_late_model_is_awaited() {
    let body = br#"{"prompt":"abc","model":"late","x":1}"#;
    let cut = body.windows(6).position(|w| w == b"\"late\"").unwrap();
    let mut s = Scanner::new();
    s.feed(&body[..cut + 5]);
    assert!(s
        .early_request(ApiKind::Completions, &body[..cut + 5], 0)
        .is_none());
    s.feed(&body[cut + 5..cut + 6]);
    let r = s
        .early_request(ApiKind::Completions, &body[..cut + 6], 0)
        .unwrap();
    assert_eq!(
        (r.model.as_str(), &body[r.model_span]),
        ("late", &b"\"late\""[..])
    );
}

#[test]
fn chat_waits_for_tools_unless_the_messages_fill_the_cap() {
    let short = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]"#;
    let mut s = Scanner::new();
    s.feed(short);
    assert!(
        s.early_request(ApiKind::ChatCompletions, short, 4096)
            .is_none(),
        "tools may still come"
    );
    let long = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]"#,
        "x".repeat(5000)
    );
    let mut s = Scanner::new();
    s.feed(&long.as_bytes()[..4200]);
    let r = s
        .early_request(ApiKind::ChatCompletions, &long.as_bytes()[..4200], 4096)
        .unwrap();
    assert_eq!(
        r.prompt,
        Prompt::Text(long[long.find('[').unwrap()..][..4096].to_owned())
    );
    assert_eq!(s.messages_seen(), 1);
}

#[test]
fn gives_up_on_what_only_the_whole_body_can_judge() {
    for body in [
        &br#"[1,2]"#[..],
        br#"{"mod\u0065l":"m","prompt":"p"}"#,
        br#"{"model":"a","model":"b","prompt":"p"}"#,
        br#"{"model":7,"prompt":"p"}"#,
    ] {
        let (found, _) = first_early(ApiKind::Completions, body, &[], 0);
        assert!(found.is_none(), "{}", String::from_utf8_lossy(body));
    }
    let (found, _) = first_early(
        ApiKind::ChatCompletions,
        br#"{"model":"m","messages":[  ]}"#,
        &[],
        1,
    );
    assert!(found.is_none());
    // A missing or empty prompt is the whole-body parse's to refuse, as upstream's parser
    // does, with or without a prefix scorer.
    for body in [
        &br#"{"model":"m","prompt":""}"#[..],
        br#"{"model":"m","prompt":[ ]}"#,
        br#"{"model":"m","prompt":null}"#,
        br#"{"model":"m","x":1}"#,
    ] {
        for cap in [0, 1] {
            let (found, _) = first_early(ApiKind::Completions, body, &[], cap);
            assert!(found.is_none(), "{cap}: {}", String::from_utf8_lossy(body));
        }
    }
    let chat = br#"{"model":"m","messages":[]}"#;
    let (found, _) = first_early(ApiKind::ChatCompletions, chat, &[], 0);
    assert!(found.is_none());
}

#[test]
fn flags_nesting_deeper_than_128_levels_wherever_it_is() {
    // serde_json skips unknown fields without recursing, so the parser alone would pass these
    // on to the model server; the scan refuses them (the top-level object is level 1).
    for (levels, deep) in [(126, false), (127, false), (128, true), (5000, true)] {
        let body = format!(
            r#"{{"model":"m","prompt":"p","x":{}{}}}"#,
            "[".repeat(levels),
            "]".repeat(levels)
        );
        let (_, s) = first_early(ApiKind::Completions, body.as_bytes(), &[7, 300], 0);
        assert_eq!(s.too_deep(), deep, "{levels} levels");
    }
}

#[test]
fn counts_messages_across_chunks() {
    let body = br#"{"messages":[{"a":[1,2]},{"b":"x,y"},{}],"model":"m"}"#;
    let (_, s) = first_early(ApiKind::ChatCompletions, body, &[3, 17, 18, 30], 0);
    assert_eq!(s.messages_seen(), 3);
}

#[test]
fn partial_strings_back_off_cut_escapes_and_characters() {
    let full = serde_json::to_string("é\u{1F600}\"\\\n tail tail tail").unwrap();
    for cut in 1..full.len() {
        if let Some(text) = decode_partial(&full.as_bytes()[..cut], cut - 1) {
            let whole: String = serde_json::from_str(&full).unwrap();
            assert!(whole.starts_with(&text), "{cut}: {text:?}");
        }
    }
}

fn json_text() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            Just("a"),
            Just("é"),
            Just("\""),
            Just("\\"),
            Just("\n"),
            Just(" "),
            Just("😀"),
            Just("z")
        ],
        0..120,
    )
    .prop_map(|v| v.concat())
}

fn ws() -> impl Strategy<Value = &'static str> {
    prop_oneof![Just(""), Just(" "), Just("\n\t ")]
}

prop_compose! {
    fn completion_body()(model in json_text(), prompt in json_text().prop_filter("an empty prompt is refused", |p| !p.is_empty()), salt in proptest::option::of(json_text()),
                         stream in any::<bool>(), order in 0u8..4,
                         w in ws()) -> String {
        let mut fields = vec![
            format!("{w}\"model\"{w}:{w}{}", serde_json::to_string(&model).unwrap()),
            format!("\"prompt\":{w}{}", serde_json::to_string(&prompt).unwrap()),
            format!("\"stream\":{stream}{w}"),
            format!("\"max_tokens\":{w}[1, {{\"a\":\"]\"}}]"),
        ];
        fields.rotate_left(usize::from(order) % 4);
        if let Some(salt) = salt {
            // A salt before the prompt; one after it is the documented exception.
            let p = fields.iter().position(|f| f.starts_with("\"prompt\"")).unwrap_or(0);
            fields.insert(p, format!("\"cache_salt\":{}", serde_json::to_string(&salt).unwrap()));
        }
        format!("{w}{{{}}}{w}", fields.join(","))
    }
}

prop_compose! {
    fn chat_body()(model in json_text(), contents in proptest::collection::vec(json_text(), 1..4), tools in any::<bool>(),
                   model_first in any::<bool>()) -> String {
        let messages: Vec<_> = contents.iter().map(|c| serde_json::json!({"role": "user", "content": c})).collect();
        let messages = format!("\"messages\": {}", serde_json::to_string(&messages).unwrap());
        let model = format!("\"model\":{}", serde_json::to_string(&model).unwrap());
        let mut fields = if model_first { vec![model, messages] } else { vec![messages, model] };
        if tools {
            fields.push("\"tools\":[{\"type\":\"function\"}]".into());
        }
        format!("{{{}}}", fields.join(","))
    }
}

proptest! {
    #[test]
    fn any_chunking_gives_the_whole_body_inputs(body in completion_body(), cuts in proptest::collection::vec(any::<usize>(), 0..6), cap in prop_oneof![Just(0usize), 1usize..40]) {
        let whole = parse(ApiKind::Completions, body.as_bytes(), cap.max(1)).unwrap();
        let (found, s) = first_early(ApiKind::Completions, body.as_bytes(), &cuts, cap);
        let (early, _) = found.expect("a complete body always decides");
        if cap > 0 {
            same_inputs(&early, &whole);
        } else {
            prop_assert_eq!(&early.model, &whole.model);
            prop_assert_eq!(&early.model_span, &whole.model_span);
        }
        prop_assert_eq!(s.stream(), Some(whole.stream));
    }

    #[test]
    fn chat_chunking_gives_the_whole_body_inputs(body in chat_body(), cuts in proptest::collection::vec(any::<usize>(), 0..6), cap in 1usize..60) {
        let whole = parse(ApiKind::ChatCompletions, body.as_bytes(), cap).unwrap();
        let (found, s) = first_early(ApiKind::ChatCompletions, body.as_bytes(), &cuts, cap);
        if let Some((early, _)) = found {
            same_inputs(&early, &whole);
        }
        let count = serde_json::from_str::<serde_json::Value>(&body).unwrap()["messages"].as_array().unwrap().len();
        prop_assert_eq!(s.messages_seen(), count);
    }

    #[test]
    fn every_split_point_agrees(body in completion_body(), cap in 1usize..30) {
        let whole = parse(ApiKind::Completions, body.as_bytes(), cap).unwrap();
        for k in 0..=body.len() {
            let (found, _) = first_early(ApiKind::Completions, body.as_bytes(), &[k], cap);
            same_inputs(&found.unwrap().0, &whole);
        }
    }
}
