//! The Grafana dashboard (config/dashboards/epp.json) queries only metrics epp exports: every
//! metric name in its PromQL is checked against a live `/metrics` scrape of an in-process epp.
#![allow(clippy::unwrap_used)] // integration tests: a failed unwrap is a failed test

use bytes::Bytes;
use harness::client;
use harness::envoy::repo_root;
use harness::stack::{Stack, StackOptions};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// PromQL words that are not metric names.
const KEYWORDS: &[&str] = &[
    "sum",
    "avg",
    "min",
    "max",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "group",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
];

/// Keywords followed by a list of label names.
const GROUPING: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The metric names a PromQL expression selects: identifiers outside label matchers, ranges,
/// strings and grouping clauses that are not function calls or keywords.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut cleaned = String::with_capacity(expr.len());
    let (mut depth, mut in_string) = (0u32, false);
    for c in expr.chars() {
        let keep = match c {
            _ if in_string => {
                in_string = c != '"';
                false
            }
            '"' => {
                in_string = true;
                false
            }
            '{' | '[' => {
                depth += 1;
                false
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                false
            }
            _ => depth == 0,
        };
        cleaned.push(if keep { c } else { ' ' });
    }
    let mut names = BTreeSet::new();
    let mut rest = cleaned.as_str();
    let mut skip_group = false;
    loop {
        rest = rest.trim_start();
        let Some(c) = rest.chars().next() else { break };
        if c == '(' {
            rest = &rest[1..];
            if std::mem::take(&mut skip_group) {
                rest = rest.split_once(')').map_or("", |(_, r)| r);
            }
            continue;
        }
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '.'))
            .unwrap_or(rest.len());
        if end == 0 {
            rest = &rest[c.len_utf8()..];
            skip_group = false;
            continue;
        }
        let word = &rest[..end];
        rest = &rest[end..];
        let is_call = rest.trim_start().starts_with('(');
        if word.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
            continue;
        }
        if KEYWORDS.contains(&word) {
            skip_group = GROUPING.contains(&word);
            continue;
        }
        if !is_call {
            names.insert(word.to_owned());
        }
    }
    names
}

/// Every sample name a scrape can contain, from its `# TYPE` lines (families without samples
/// yet included) and its sample lines.
fn exported_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total", "_created"],
                "histogram" => &["_bucket", "_sum", "_count", "_created"],
                "summary" => &["", "_sum", "_count"],
                "info" => &["_info"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_owned());
        }
    }
    names
}

/// Every PromQL expression in the dashboard: panel targets and query variables.
fn dashboard_queries(dash: &serde_json::Value) -> Vec<String> {
    let mut exprs = Vec::new();
    for panel in dash["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(t["expr"].as_str().unwrap().to_owned());
        }
    }
    for var in dash["templating"]["list"].as_array().unwrap() {
        if let Some(q) = var["definition"].as_str() {
            exprs.push(
                q.trim_start_matches("label_values(")
                    .split(',')
                    .next()
                    .unwrap()
                    .to_owned(),
            );
        }
    }
    exprs
}

#[test]
fn the_name_extractor_reads_promql() {
    let e = r#"histogram_quantile(0.99, sum by (le, model_name) (rate(a_bucket{job=~"x|y", le!="1"}[5m]))) / on (pod) group_left(node) b_total offset 5m"#;
    assert_eq!(
        metric_names(e),
        ["a_bucket", "b_total"]
            .into_iter()
            .map(String::from)
            .collect()
    );
    assert_eq!(
        metric_names("sum(rate(x_total{a=\"}\"}[$__rate_interval])) / 2"),
        ["x_total".to_owned()].into()
    );
    let text = "# TYPE foo counter\nfoo_total 1\n# TYPE bar histogram\n# TYPE baz gauge\nbaz{a=\"b\"} 2\n# EOF\n";
    let names = exported_names(text);
    assert!(
        names.contains("foo_total")
            && names.contains("bar_bucket")
            && names.contains("baz")
            && !names.contains("bar")
    );
}

/// Exercises every family the dashboard charts (prometheus-client prints a labelled family
/// only once it has a child): routed requests with usage, a rejected one, a config reload and
/// the pool gauges' refresh.
async fn exercise(stack: &Stack, config: &std::path::Path) {
    let gateway = stack.envoy.listener_addr();
    for i in 0..3 {
        let body = format!(
            r#"{{"model":"test-model","prompt":"dashboard request {i} with a shared prefix for the index","max_tokens":3}}"#
        );
        let r = client::post_json(gateway, "/v1/completions", Bytes::from(body))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let bad = client::post_json(gateway, "/v1/completions", Bytes::from_static(b"{not json"))
        .await
        .unwrap();
    assert_eq!(bad.status, 400, "{}", bad.text());
    let text = std::fs::read_to_string(config).unwrap();
    std::fs::write(config, format!("{text}# reloaded\n")).unwrap();
}

async fn scrape_until(stack: &Stack, wanted: &BTreeSet<String>) -> BTreeSet<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let exported = exported_names(&stack.epp.metrics_text().await.unwrap());
        if wanted.is_subset(&exported) || Instant::now() > deadline {
            return exported;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_metric_is_exported_by_epp() {
    let path = repo_root().join("config/dashboards/epp.json");
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(
        dash["title"].is_string() && dash["uid"].is_string(),
        "a Grafana dashboard has a title and uid"
    );
    let queries = dashboard_queries(&dash);
    assert!(
        queries.len() >= 15,
        "the dashboard has its panels: {}",
        queries.len()
    );
    let mut wanted = BTreeSet::new();
    for q in &queries {
        let names = metric_names(q);
        assert!(!names.is_empty(), "no metric in query {q}");
        wanted.extend(names);
    }
    assert!(
        wanted.len() >= 20,
        "the dashboard covers epp's metrics: {wanted:?}"
    );

    let dir = std::env::temp_dir().join(format!("epp-dashboard-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("config.yaml");
    std::fs::write(&config, epp::config::DEFAULT_CONFIG).unwrap();
    let args = [
        "--config-file",
        config.to_str().unwrap(),
        "--refresh-prometheus-metrics-interval",
        "50ms",
        "--refresh-metrics-interval",
        "20ms",
    ];
    let opts = StackOptions {
        pods: 2,
        epp_args: args.iter().map(|a| (*a).to_owned()).collect(),
        ..StackOptions::default()
    };
    let stack = Stack::start(opts)
        .await
        .unwrap_or_else(|e| panic!("starting the stack: {e:#}"));
    exercise(&stack, &config).await;
    let exported = scrape_until(&stack, &wanted).await;
    stack.stop().await;
    let _ = std::fs::remove_dir_all(&dir);

    let missing: Vec<&String> = wanted.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics epp does not export: {missing:?}\nexported: {exported:?}"
    );
}
