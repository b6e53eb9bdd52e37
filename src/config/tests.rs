//! The document: parsing, structural checks, deprecations, both API groups.

use super::*;

#[test]
fn shipped_examples_build() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/config/examples");
    let files = [
        "default.yaml",
        "upstream-default.yaml",
        "prefix-absolute.yaml",
        "conformance.yaml",
    ];
    for name in files {
        let text = std::fs::read_to_string(format!("{dir}/{name}")).unwrap();
        let doc = parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        crate::scheduling::build(&doc).unwrap_or_else(|e| panic!("{name}: {e:?}"));
    }
    let body = |text: &str| text.split_once("apiVersion").unwrap().1.to_owned();
    let file = |name: &str| std::fs::read_to_string(format!("{dir}/{name}")).unwrap();
    assert_eq!(body(&file("default.yaml")), body(DEFAULT_CONFIG));
    let bench = concat!(env!("CARGO_MANIFEST_DIR"), "/hack/bench/epp-default.yaml");
    let bench = std::fs::read_to_string(bench).unwrap();
    assert_eq!(
        body(&bench),
        body(DEFAULT_CONFIG),
        "hack/bench/epp-default.yaml"
    );
    assert_eq!(
        body(&file("upstream-default.yaml")),
        body(UPSTREAM_DEFAULT_CONFIG)
    );
}

#[test]
fn the_built_in_default_is_the_affinity_filter_before_estimated_ttft() {
    let c = parse(DEFAULT_CONFIG).unwrap();
    let types: Vec<&str> = c.plugins.iter().map(|p| p.plugin_type.as_str()).collect();
    assert_eq!(
        types,
        [
            "approx-prefix-cache-producer",
            "prefix-cache-affinity-filter",
            "estimated-ttft-scorer",
            "max-score-picker"
        ]
    );
    crate::scheduling::build(&c).unwrap();
}

#[test]
fn default_config_parses() {
    let c = parse(UPSTREAM_DEFAULT_CONFIG).unwrap();
    assert_eq!(c.plugins.len(), 3);
    assert_eq!(c.scheduling_profiles[0].plugins[2].weight, Some(3.0));
}

#[test]
fn unknown_fields_are_named() {
    let text = UPSTREAM_DEFAULT_CONFIG.replace(
        "kind: EndpointPickerConfig",
        "kind: EndpointPickerConfig\nschedulingProfile: []",
    );
    let err = parse(&text).unwrap_err().to_string();
    assert!(err.contains("unknown field `schedulingProfile`"), "{err}");
    let text = UPSTREAM_DEFAULT_CONFIG.replace(
        "- type: queue-scorer",
        "- type: queue-scorer\n  paramters: {}",
    );
    assert!(parse(&text)
        .unwrap_err()
        .to_string()
        .contains("`paramters`"));
}

#[test]
fn reports_every_structural_problem_at_once() {
    let text = "apiVersion: v1\nkind: Foo\nplugins:\n- type: a\n- type: a\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: b\n    weight: -1\n";
    let err = parse(text).unwrap_err();
    assert_eq!(err.problems.len(), 5, "{err}");
}

fn build(text: &str, load: LoadOptions) -> Result<crate::scheduling::Scheduler, Vec<Problem>> {
    let doc = parse(text).map_err(|e| e.problems)?;
    crate::scheduling::build_with(&doc, load)
}

#[test]
fn both_api_groups_load_and_the_old_one_is_noted() {
    let llmd = UPSTREAM_DEFAULT_CONFIG.replace(API_VERSION_GIE, API_VERSION);
    assert!(parse(&llmd).unwrap().deprecations().is_empty());
    let gie = parse(UPSTREAM_DEFAULT_CONFIG).unwrap();
    assert_eq!(gie.deprecations().len(), 1, "{:?}", gie.deprecations());
    let other = UPSTREAM_DEFAULT_CONFIG.replace(API_VERSION_GIE, "example.com/v1");
    let err = parse(&other).unwrap_err().to_string();
    assert!(
        err.contains("llm-d.ai/v1alpha1") && err.contains("example.com/v1"),
        "{err}"
    );
    let bare = "plugins:\n- type: queue-scorer\n";
    assert_eq!(parse(bare).unwrap().api_version, API_VERSION);
}

#[test]
fn known_but_unsupported_plugins_name_themselves() {
    let text = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: predicted-latency-producer\n- type: no-such-scorer\n- type: queue-scorer\n";
    let problems = build(text, LoadOptions::default()).unwrap_err();
    assert_eq!(problems.len(), 2, "{problems:?}");
    let all = ConfigError::from(problems).to_string();
    assert!(
        all.contains("\"predicted-latency-producer\" is not supported by epp"),
        "{all}"
    );
    assert!(all.contains("unknown type \"no-such-scorer\""), "{all}");
}

#[test]
fn upstreams_data_parallel_config_loads() {
    // The shape of llm-d-router v0.10's `deploy/config/dp-epp-config.yaml`.
    let text = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: prefix-cache-scorer\n- type: decode-filter\n- type: max-score-picker\n- type: data-parallel-profile-handler\n  parameters:\n    primaryPort: 8000\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: decode-filter\n  - pluginRef: max-score-picker\n  - pluginRef: prefix-cache-scorer\n    weight: 2\n";
    assert!(build(text, LoadOptions::default()).is_ok());
}

#[test]
fn alpha_plugins_need_the_experimental_flag() {
    let text = "plugins:\n- type: session-affinity-scorer\n";
    let err = ConfigError::from(build(text, LoadOptions::default()).unwrap_err()).to_string();
    assert!(
        err.contains("plugin 'session-affinity-scorer' (type: 'session-affinity-scorer') has Alpha stability level, but command line flag --allow-experimental-plugins is not set"),
        "{err}"
    );
    let allow = LoadOptions {
        allow_experimental: true,
    };
    build(text, allow).unwrap();
}

#[test]
fn feature_gates_take_values_and_unknown_gates_are_errors() {
    let on = |list: &[&str]| {
        FeatureGates::parse(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    };
    assert!(on(&["flowControl"]).unwrap().flow_control);
    assert!(
        !on(&["flowControl", "flowControl=false"])
            .unwrap()
            .flow_control
    );
    assert!(
        !on(&["haPopulateNonLeaderDatastore=false"])
            .unwrap()
            .ha_populate_non_leader_datastore
    );
    assert!(on(&["dataLayer"]).is_ok(), "GIE v1.5's gates are accepted");
    assert_eq!(
        on(&["flowControl=maybe", "warpDrive"]).unwrap_err().len(),
        2
    );
}

#[test]
fn llm_d_structure_loads_and_its_references_are_checked() {
    let text = "apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl=true]
plugins:
- type: queue-scorer
- type: utilization-detector
  parameters: {queueDepthThreshold: 7}
- type: openai-parser
- type: metrics-data-source
  parameters: {scheme: http, path: /metrics, insecureSkipVerify: true}
- type: core-metrics-extractor
requestHandler:
  parsers: [{pluginRef: openai-parser}, {pluginRef: anthropic-parser}]
dataLayer:
  sources: [{pluginRef: metrics-data-source, extractors: [{pluginRef: core-metrics-extractor}]}]
flowControl:
  maxBytes: 10Gi
  defaultRequestTTL: 30s
  priorityBands: [{priority: 1, maxRequests: 500, orderingPolicyRef: fcfs-ordering-policy}]
  saturationDetector: {pluginRef: utilization-detector}
";
    let doc = parse(text).unwrap();
    assert_eq!(doc.saturation_detector_ref(), Some("utilization-detector"));
    assert_eq!(doc.parser_refs(), ["openai-parser", "anthropic-parser"]);
    build(text, LoadOptions::default()).unwrap();
    let bad = text
        .replace(
            "{pluginRef: core-metrics-extractor}]}]",
            "{pluginRef: nope}]}]",
        )
        .replace(
            "saturationDetector: {pluginRef: utilization-detector}",
            "saturationDetector: {pluginRef: missing}",
        )
        .replace("maxBytes: 10Gi", "maxBytes: 10Gi\n  maxBites: 1");
    let err = parse(&bad).unwrap_err().to_string();
    assert!(err.contains("maxBites"), "{err}");
    let bad = bad.replace("\n  maxBites: 1", "");
    let problems = parse(&bad).unwrap_err().problems;
    assert_eq!(problems.len(), 2, "{problems:?}");
    let err = ConfigError::from(problems).to_string();
    assert!(
        err.contains("dataLayer.sources[0].extractors[0] references undefined plugin \"nope\""),
        "{err}"
    );
    assert!(
        err.contains("saturationDetector references undefined plugin \"missing\""),
        "{err}"
    );
}
mod learned;
mod precise;
mod v1;
