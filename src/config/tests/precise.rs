//! llm-d-router v0.10's split precise configuration (`token-producer` +
//! `precise-prefix-cache-producer` + `prefix-cache-scorer` naming it) loads unchanged.

use crate::director::Runtime;
use crate::scheduling::scorer::KvEventSockets;
use std::time::Duration;

const EXAMPLE: &str = include_str!("../../../config/examples/llm-d-precise.yaml");

/// llm-d's deploy sample: no kvEventsConfig, block size 64, the deprecated spelling.
const DEPLOY_SAMPLE: &str = "apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: token-producer
  parameters:
    modelName: hf-repo/model-name
    vllm:
      url: http://localhost:8000
- type: endpoint-notification-source
- type: metrics-data-source
- type: core-metrics-extractor
- type: single-profile-handler
- type: decode-filter
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig:
      blockSize: 64
    indexerConfig:
      kvBlockIndexConfig:
        enableMetrics: true
- type: prefix-cache-scorer
  parameters:
    prefixMatchInfoProducerName: precise-prefix-cache-producer
- type: queue-scorer
- type: max-score-picker
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors:
    - pluginRef: core-metrics-extractor
  - pluginRef: endpoint-notification-source
    extractors:
    - pluginRef: precise-prefix-cache-producer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: decode-filter
  - pluginRef: prefix-cache-scorer
    weight: 2.0
  - pluginRef: queue-scorer
    weight: 1.0
  - pluginRef: max-score-picker
";

#[test]
fn llmds_precise_configurations_build_the_precise_scorer_from_the_producer() {
    let r = Runtime::build(EXAMPLE, None).unwrap();
    let p = r.scheduler.precise_params().expect("the precise scorer");
    assert_eq!(p.block_size, 16, "tokenProcessorConfig.blockSizeTokens");
    assert!(p.speculative_indexing);
    assert!(
        p.saturation_queue_depth.is_infinite() && p.saturation_kv_usage.is_infinite(),
        "the generic scorer has no saturation cut-off"
    );
    assert!(!p.credit_home, "and credits nothing it does not hold");
    assert_eq!(
        p.kv_event_sockets(),
        KvEventSockets {
            bind: Some("tcp://*:5557".into()),
            port: None,
            replay_port: None
        }
    );
    let render = r.render.as_ref().expect("the vllm backend");
    assert_eq!(
        (
            render.url.as_str(),
            render.model_name.as_str(),
            render.timeout
        ),
        (
            "http://localhost:8000",
            "Qwen/Qwen3-8B",
            Duration::from_secs(5)
        )
    );
    assert!(
        r.scheduler.prefix_params().is_none(),
        "no approximate index"
    );

    let r = Runtime::build(DEPLOY_SAMPLE, None).unwrap();
    let p = r.scheduler.precise_params().unwrap();
    assert_eq!(p.block_size, 64, "tokenProcessorConfig.blockSize");
    assert_eq!(
        p.kv_event_sockets(),
        KvEventSockets {
            bind: None,
            port: Some(5557),
            replay_port: None
        },
        "llm-d's default: every pod's socket port"
    );
}

#[test]
fn kv_event_sockets_follow_llm_ds_discovery_settings() {
    let with = |kv: &str| {
        let text = EXAMPLE.replace(
            "    kvEventsConfig:\n      zmqEndpoint: tcp://*:5557\n      topicFilter: \"kv@\"\n",
            kv,
        );
        assert_ne!(text, EXAMPLE);
        let r = Runtime::build(&text, None).unwrap();
        r.scheduler.precise_params().unwrap().kv_event_sockets()
    };
    assert_eq!(
        with("    kvEventsConfig:\n      podDiscoveryConfig:\n        socketPort: 6000\n        replaySocketPort: 6001\n"),
        KvEventSockets { bind: None, port: Some(6000), replay_port: Some(6001) }
    );
    assert_eq!(
        with("    kvEventsConfig:\n      discoverPods: false\n"),
        KvEventSockets::default()
    );
}

#[test]
fn a_producer_name_that_is_no_prefix_producer_is_refused_by_name() {
    let bad = EXAMPLE.replace(
        "  parameters:\n    prefixMatchInfoProducerName: precise-prefix-cache-producer\n- type: kv-cache",
        "  parameters:\n    prefixMatchInfoProducerName: my-producer\n- type: kv-cache",
    );
    assert_ne!(bad, EXAMPLE);
    let e = Runtime::build(&bad, None)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("prefix-cache-scorer") && e.contains("my-producer"),
        "{e}"
    );
    // The approximate producer's type name is what llm-d creates for its consumers.
    let approx = bad.replace("my-producer", "approx-prefix-cache-producer");
    let r = Runtime::build(&approx, None).unwrap();
    assert!(r.scheduler.prefix_params().is_some());
    // The precise producer is still configured (the no-hit LRU names it): epp looks a request
    // up once, in the precise index, and every consumer reads those matches.
    assert!(r.scheduler.precise_params().is_some());
    // Without a prefix scorer nothing reads ids: the render endpoint is never called.
    let no_prefix = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: token-producer\n  parameters:\n    modelName: m\n- type: queue-scorer\n";
    assert!(Runtime::build(no_prefix, None).unwrap().render.is_none());
}

#[test]
fn a_precise_producer_that_only_the_affinity_filter_reads_still_feeds_it() {
    // llm-d's optimized baseline with the precise producer in place of the approximate one.
    let text = "apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig:
      blockSize: 32
- type: prefix-cache-affinity-filter
  parameters:
    prefixMatchInfoProducerName: precise-prefix-cache-producer
- type: token-load-scorer
- type: max-score-picker
";
    let r = Runtime::build(text, None).unwrap();
    let p = r
        .scheduler
        .precise_params()
        .expect("the precise index is read");
    assert_eq!(p.block_size, 32);
    assert!(
        r.scheduler.prefix_params().is_none(),
        "no approximate index beside it"
    );
}

/// llm-d-router v0.11 removed `precise-prefix-cache-scorer` (upstream refuses it): epp still
/// loads it and its deprecation notice shows the split form that replaces it, which loads too.
#[test]
fn the_removed_precise_scorer_loads_with_a_notice_showing_its_replacement() {
    let old = include_str!("../../../config/examples/precise-prefix.yaml");
    let doc = crate::config::parse(old).unwrap();
    let notes = doc.deprecations();
    let note = notes
        .iter()
        .find(|n| n.contains("precise-prefix-cache-scorer"))
        .unwrap_or_else(|| panic!("no notice: {notes:?}"));
    for replacement in [
        "removed in llm-d-router v0.11",
        "type: precise-prefix-cache-producer",
        "type: prefix-cache-scorer",
        "prefixMatchInfoProducerName: precise-prefix-cache-producer",
        "dataLayer source",
    ] {
        assert!(note.contains(replacement), "{replacement}: {note}");
    }
    assert!(Runtime::build(old, None)
        .unwrap()
        .scheduler
        .precise_params()
        .is_some());
    let new = crate::config::parse(DEPLOY_SAMPLE).unwrap();
    assert!(new.deprecations().is_empty(), "{:?}", new.deprecations());
    assert!(Runtime::build(DEPLOY_SAMPLE, None)
        .unwrap()
        .scheduler
        .precise_params()
        .is_some());
}
