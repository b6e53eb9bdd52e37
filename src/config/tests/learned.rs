//! llm-d-router v0.11's traffic-learned hub scorers: the observers and the scorers that read
//! them load as v0.11 writes them, and a scorer without its observer is refused by name.

use super::*;

/// The shape of llm-d-router v0.11's observer READMEs: both pairs, the observers listed as
/// data-layer sources (which drive their recompute upstream).
const V011: &str = "apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: latency-observer-producer-hub
  name: ttft-observer
  parameters:
    intervalDuration: 1s
    minRequests: 10
    bucketDuration: 1m
    bucketHistorySize: 1000
- type: latency-observation-scorer-hub
  name: ttft
  parameters:
    explorationRate: 0.1
    minInflightGap: 2.0
    ttftPercentilesProducerName: ttft-observer
- type: sojourn-time-observer-hub
  name: sojourn-observer
  parameters:
    compression: 200
    minSamples: 60
    intervalDuration: 5s
- type: mrl-scorer-hub
  name: mrl
  parameters:
    sojournTimeObserverProducerName: sojourn-observer
- type: max-score-picker
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: ttft
  - pluginRef: mrl
  - pluginRef: max-score-picker
dataLayer:
  sources:
  - pluginRef: ttft-observer
  - pluginRef: sojourn-observer
";

const ALLOW: LoadOptions = LoadOptions {
    allow_experimental: true,
};

#[test]
fn a_v0_11_configuration_of_the_learned_scorers_loads_and_binds_them() {
    let sched = build(V011, ALLOW).unwrap_or_else(|p| panic!("{}", ConfigError::from(p)));
    let state = sched.plugin_state();
    let types: Vec<&str> = state.iter().filter_map(|s| s["type"].as_str()).collect();
    assert!(
        types.contains(&"latency-observer-producer-hub")
            && types.contains(&"sojourn-time-observer-hub"),
        "both observers take part in the lifecycle: {types:?}"
    );
    // Alpha upstream: refused without the flag, as there.
    let err = ConfigError::from(build(V011, LoadOptions::default()).unwrap_err()).to_string();
    assert!(err.contains("--allow-experimental-plugins"), "{err}");
    // Unnamed references find the configured observer.
    let unnamed = V011
        .replace("    ttftPercentilesProducerName: ttft-observer\n", "")
        .replace(
            "  parameters:\n    sojournTimeObserverProducerName: sojourn-observer\n",
            "",
        );
    build(&unnamed, ALLOW).unwrap_or_else(|p| panic!("{}", ConfigError::from(p)));
}

#[test]
fn a_scorer_without_its_observer_is_refused_naming_both() {
    let missing = V011.replace(
        "name: sojourn-observer\n  parameters:\n    compression",
        "name: other\n  parameters:\n    compression",
    );
    let missing = missing.replace(
        "  - pluginRef: sojourn-observer\n",
        "  - pluginRef: other\n",
    );
    let err = ConfigError::from(build(&missing, ALLOW).unwrap_err()).to_string();
    assert!(
        err.contains("plugin \"mrl\" reads what a sojourn-time-observer-hub learns, and no sojourn-time-observer-hub named \"sojourn-observer\" is configured"),
        "{err}"
    );
    let none = "plugins:\n- type: latency-observation-scorer-hub\n- type: max-score-picker\n";
    let err = ConfigError::from(build(none, ALLOW).unwrap_err()).to_string();
    assert!(
        err.contains("none is configured: declare a latency-observer-producer-hub plugin"),
        "{err}"
    );
}

#[test]
fn a_bad_observer_parameter_is_named() {
    let bad = V011.replace("minRequests: 10", "minRequests: 0");
    let err = ConfigError::from(build(&bad, ALLOW).unwrap_err()).to_string();
    assert!(
        err.contains("ttft-observer") && err.contains("minRequests must be > 0"),
        "{err}"
    );
}
