//! llm-d v1.0's `llm-d.ai/v1`: the shapes llm-d's guides write load, v1's removed fields are
//! refused naming where they moved, its durations are Go durations; and the YAML reader keeps
//! YAML 1.2's scalars (`on`, `yes`, `off` are strings).

use super::*;

fn example() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/examples/llm-d-v1.yaml");
    std::fs::read_to_string(path).unwrap()
}

fn decode(text: &str) -> Result<Config, ConfigError> {
    Config::decode(&parse_document(text)?, LoadOptions::default())
}

#[test]
fn an_llm_d_v1_document_loads_with_every_v1_section() {
    let text = example();
    let doc = parse(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(doc.api_version, API_VERSION_V1);
    assert!(doc.deprecations().is_empty(), "{:?}", doc.deprecations());
    assert_eq!(doc.saturation_detector_ref(), Some("utilization-detector"));
    assert_eq!(
        doc.scheduling_profiles[0].inject_saturation_filter,
        Some(false)
    );
    let c = decode(&text).unwrap_or_else(|e| panic!("{e}"));
    assert!(c.propagate_priority);
    let files = c
        .file_discovery
        .expect("discovery.endpoints names file-discovery");
    assert_eq!(files.path, std::path::Path::new("/etc/epp/endpoints.yaml"));
    assert!(!c.flow.enabled, "flowControl=false");
    assert_eq!(c.flow.ttl, Some(std::time::Duration::from_secs(90)));
    assert_eq!(c.flow.max_requests, Some(1000));
    assert_eq!(
        c.thresholds.queue_depth, 8.0,
        "flowControl.saturationDetector's plugin"
    );
    // Off by default: the body is forwarded unchanged.
    let off = text.replace("  propagatePriority: true\n", "");
    assert!(!decode(&off).unwrap().propagate_priority);
}

#[test]
fn v1alpha1_fields_in_a_v1_document_are_refused_naming_where_they_moved() {
    let text = example();
    let cases = [
        (
            "saturationDetector: {pluginRef: utilization-detector}\n",
            "saturationDetector is not a field of llm-d.ai/v1 (removed in llm-d v1.0): it moved to flowControl.saturationDetector.pluginRef",
        ),
        (
            "parser: {pluginRef: openai-parser}\n",
            "parser is not a field of llm-d.ai/v1 (removed in llm-d v1.0): it moved to requestHandler.parsers",
        ),
    ];
    for (line, message) in cases {
        let err = parse(&format!("{text}{line}")).unwrap_err().to_string();
        assert!(err.contains(message), "{err}");
        // The same field in a v1alpha1 document is the deprecated form, still loaded.
        let old = text.replace("llm-d.ai/v1\n", "llm-d.ai/v1alpha1\n");
        parse(&format!("{old}{line}")).unwrap_or_else(|e| panic!("{line}: {e}"));
    }
    let data_layer = [
        (
            "    endpoints:\n      pluginRef: endpoints\n",
            "    pluginRef: endpoints\n",
            "dataLayer.discovery.pluginRef is not a field of llm-d.ai/v1 (removed in llm-d v1.0): it moved to dataLayer.discovery.endpoints.pluginRef",
        ),
        (
            "  crossReplica:\n    syncInterval: 200ms\n",
            "  crossReplicaSyncInterval: 200ms\n  crossReplica:\n",
            "dataLayer.crossReplicaSyncInterval is not a field of llm-d.ai/v1 (removed in llm-d v1.0): it moved to dataLayer.crossReplica.syncInterval",
        ),
    ];
    for (from, to, message) in data_layer {
        let bad = text.replace(from, to);
        assert_ne!(bad, text, "{from:?} is in the example");
        let err = parse(&bad).unwrap_err().to_string();
        assert!(err.contains(message), "{err}");
    }
}

#[test]
fn v1_durations_and_references_are_checked() {
    let text = example();
    let bad = text
        .replace("syncInterval: 200ms", "syncInterval: 200")
        .replace("publishTimeout: 1s", "publishTimeout: soon")
        .replace("noEndpointRequestTTL: 10s", "noEndpointRequestTTL: 3d")
        .replace("    defaultRequestTTL: 2m", "    defaultRequestTTL: -2m");
    let err = decode(&bad).unwrap_err().to_string();
    for path in [
        "dataLayer.crossReplica.syncInterval: invalid duration \"200\"",
        "dataLayer.crossReplica.publishTimeout: invalid duration \"soon\"",
        "flowControl.noEndpointRequestTTL: invalid duration \"3d\"",
        "flowControl.priorityBands[0].defaultRequestTTL: invalid duration \"-2m\"",
    ] {
        assert!(err.contains(path), "{path}\n{err}");
    }
    let bad = text.replace(
        "  crossReplica:\n",
        "  crossReplica:\n    syncerPluginRef: redis-syncer\n",
    );
    let err = parse(&bad).unwrap_err().to_string();
    assert!(
        err.contains(
            "dataLayer.crossReplica.syncerPluginRef references undefined plugin \"redis-syncer\""
        ),
        "{err}"
    );
    let bad = text.replace("      pluginRef: endpoints\n", "      pluginRef: files\n");
    let err = parse(&bad).unwrap_err().to_string();
    assert!(
        err.contains("dataLayer.discovery.endpoints references undefined plugin \"files\""),
        "{err}"
    );
}

#[test]
fn an_unknown_api_version_names_the_three_accepted() {
    let err = parse(&example().replace("llm-d.ai/v1\n", "llm-d.ai/v2\n"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("apiVersion \"llm-d.ai/v2\" is not \"llm-d.ai/v1\", \"llm-d.ai/v1alpha1\" or \"inference.networking.x-k8s.io/v1alpha1\""),
        "{err}"
    );
}

/// The YAML reader (serde_norway) follows YAML 1.2's core schema: `on`, `off`, `yes`, `no`, `y`
/// stay strings (YAML 1.1 made them booleans), durations stay text, numbers are numbers.
#[test]
fn yaml_scalars_are_read_as_yaml_1_2() {
    let v: serde_norway::Value = serde_norway::from_str(
        "a: on\nb: off\nc: yes\nd: no\ne: y\nf: 1m30s\ng: 10\nh: 1.5\ni: true\nj: 0x10\nk: 1e3\nl: '010'\nm: ~\n",
    )
    .unwrap();
    for key in ["a", "b", "c", "d", "e"] {
        assert!(v[key].is_string(), "{key}: {:?}", v[key]);
    }
    assert_eq!(v["f"].as_str(), Some("1m30s"));
    assert_eq!(v["g"].as_u64(), Some(10));
    assert_eq!(v["h"].as_f64(), Some(1.5));
    assert_eq!(v["i"].as_bool(), Some(true));
    assert_eq!(v["j"].as_u64(), Some(16));
    assert_eq!(v["k"].as_f64(), Some(1000.0));
    assert_eq!(v["l"].as_str(), Some("010"));
    assert!(v["m"].is_null());
    // A Go duration in the document is read by the one duration grammar.
    let doc = parse(
        "apiVersion: llm-d.ai/v1\nkind: EndpointPickerConfig\nfeatureGates: [flowControl]\nplugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins: [{pluginRef: queue-scorer}]\nflowControl: {defaultRequestTTL: 1m30s}\n",
    )
    .unwrap();
    let c = Config::decode(&doc, LoadOptions::default()).unwrap();
    assert_eq!(c.flow.ttl, Some(std::time::Duration::from_secs(90)));
}
