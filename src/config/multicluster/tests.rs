use super::*;
use crate::config::{parse, Config, LoadOptions};

const HUB: &str = "apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- {name: clusters, type: multicluster-file-discovery, parameters: {path: /etc/epp/clusters.yaml, watchFile: true}}
- {name: spokes, type: multicluster-metrics-data-source, parameters: SOURCE}
- {name: pool, type: multicluster-metrics-extractor, parameters: EXTRACTOR}
- {type: multicluster-queue-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: multicluster-queue-scorer}, {pluginRef: max-score-picker}]
dataLayer:
  discovery: {pluginRef: clusters}
  sources: [{pluginRef: spokes, extractors: [{pluginRef: pool}]}]
";

/// The hub configuration with these parameters, decoded; every problem in one text.
fn hub(source: &str, extractor: &str) -> Result<Config, crate::config::ConfigError> {
    let text = HUB
        .replace("SOURCE", source)
        .replace("EXTRACTOR", extractor);
    let doc = parse(&text).expect("the hub configuration parses");
    let load = LoadOptions {
        allow_experimental: true,
    };
    Config::decode(&doc, load)
}

#[test]
fn a_hub_configuration_decodes_with_upstreams_defaults() {
    let c = hub("{}", "{}").unwrap();
    let clusters = c.metrics_settings.clusters.expect("a hub scrapes clusters");
    assert_eq!(
        clusters.source,
        ClusterSource {
            scheme: Scheme::Https,
            path: "/metrics".into(),
            insecure_skip_verify: false,
            ca_cert: None,
            client_identity: None,
            interval: None,
        },
        "https with the peer verified by default"
    );
    assert_eq!(clusters.extractor, ClusterExtractor::default());
    assert_eq!(clusters.extractor.kv_usage.name, DEFAULT_KV_METRIC);
    let f = c.file_discovery.expect("the clusters file");
    assert!(f.clusters && f.watch_file);
}

#[test]
fn the_sources_tls_and_the_extractors_series_are_read() {
    let c = hub(
        "{caCertPath: /ca.pem, clientCertPath: /c.pem, clientKeyPath: /k.pem, path: /m, interval: 2s, port: 9090}",
        "{kvCacheUtilizationMetric: 'kv{pool=\"a\", ns=b}', queueSizeMetric: q_total}",
    )
    .unwrap();
    let m = c.metrics_settings.clusters.unwrap();
    assert_eq!(
        m.source.ca_cert.as_deref(),
        Some(std::path::Path::new("/ca.pem"))
    );
    assert_eq!(
        m.source.client_identity,
        Some(("/c.pem".into(), "/k.pem".into()))
    );
    assert_eq!(m.source.interval, Some(Duration::from_secs(2)));
    assert_eq!(m.source.path, "/m");
    assert_eq!(
        m.extractor.kv_usage.labels,
        [("pool".into(), "a".into()), ("ns".into(), "b".into())]
    );
    assert_eq!(m.extractor.queue.name, "q_total");
    let skip = hub("{insecureSkipVerify: true, caCertPath: /ca.pem}", "{}").unwrap();
    let source = skip.metrics_settings.clusters.unwrap().source;
    assert!(source.insecure_skip_verify && source.ca_cert.is_none());
}

#[test]
fn every_bad_parameter_is_named() {
    let e = hub(
        "{scheme: ftp, interval: soon, clientCertPath: /c.pem}",
        "{queueSizeMetric: 'a b'}",
    )
    .unwrap_err()
    .to_string();
    for says in [
        "unsupported scheme: ftp",
        "invalid interval \"soon\"",
        "clientCertPath and clientKeyPath",
        "queue size metric: not a valid metric specification: \"a b\"",
    ] {
        assert!(e.contains(says), "{says:?} not in {e}");
    }
    let typo = hub("{cacertPath: /ca.pem}", "{}").unwrap_err().to_string();
    assert!(typo.contains("cacertPath"), "{typo}");
}

#[test]
fn metric_specs_parse_as_upstreams() {
    let spec = MetricSpec::parse("m{a=\"1\",b=2}").unwrap();
    assert_eq!(spec.name, "m");
    assert!(spec.matches("m", |k| match k {
        "a" => Some("1"),
        "b" => Some("2"),
        _ => None,
    }));
    assert!(!spec.matches("m", |k| (k == "a").then_some("1")));
    assert!(!spec.matches("n", |_| Some("1")));
    for bad in ["", "1m", "m{", "m{a}", "m{1a=b}", "a b", "m{a=\"x}"] {
        assert_eq!(MetricSpec::parse(bad), None, "{bad:?}");
    }
    assert_eq!(MetricSpec::parse(" ns:m ").unwrap().name, "ns:m");
}
