//! The command line: upstream's flags and defaults, and the checks `validate` makes.

use super::*;

#[test]
fn upstream_flags_parse() {
    let o = Options::try_parse_from([
        "epp",
        "--secure-serving=false",
        "--grpc-port",
        "1",
        "--refresh-metrics-interval",
        "25ms",
        "--static-endpoints",
        "127.0.0.1:1",
        "-v",
        "4",
    ])
    .unwrap();
    assert!(!o.secure_serving);
    assert_eq!(o.refresh_metrics_interval, Duration::from_millis(25));
    assert_eq!(o.log_directive(), "debug");
    o.validate().unwrap();
    let o = Options::try_parse_from(["epp"]).unwrap();
    assert!(o.secure_serving);
    assert!(matches!(o.validate(), Err(OptionsError::NoDiscovery)));
    assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
    let o = Options::try_parse_from([
        "epp",
        "--pool-name",
        "p",
        "--pool-namespace",
        "ns",
        "--ha-enable-leader-election",
    ])
    .unwrap();
    o.validate().unwrap();
    assert_eq!((o.uses_kubernetes(), o.namespace().as_str()), (true, "ns"));
    let o = Options::try_parse_from([
        "epp",
        "--endpoint-selector",
        "app=vllm",
        "--endpoint-target-ports",
        "8000,8001",
    ])
    .unwrap();
    assert_eq!(o.endpoint_target_ports, [8000, 8001]);
    o.validate().unwrap();
    let o = Options::try_parse_from(["epp", "--endpoint-selector", "app=vllm"]).unwrap();
    assert!(matches!(o.validate(), Err(OptionsError::TargetPorts)));
    let o = Options::try_parse_from([
        "epp",
        "--static-endpoints",
        "127.0.0.1:1",
        "--ha-enable-leader-election",
    ])
    .unwrap();
    assert!(matches!(
        o.validate(),
        Err(OptionsError::ElectionWithoutKubernetes)
    ));
    assert!(parse_duration("5 parsecs").is_err());
}

/// A configuration may give the endpoints (llm-d's `file-discovery`): `validate` leaves the
/// check to `check_discovery`, once the configuration is loaded; then Kubernetes is not used
/// even with `--pool-name` (as upstream starts no controller manager), and the static flags
/// cannot be given as well.
#[test]
fn a_configurations_file_discovery_gives_the_endpoints() {
    let parse = |args: &[&str]| {
        Options::try_parse_from(std::iter::once("epp").chain(args.iter().copied())).unwrap()
    };
    let discovery = Some(crate::config::FileDiscovery {
        path: "/etc/epp/endpoints.yaml".into(),
        watch_file: true,
        clusters: false,
    });
    let mut o = parse(&["--config-file", "/c.yaml"]);
    o.validate().unwrap();
    assert!(matches!(
        o.check_discovery(),
        Err(OptionsError::NoDiscovery)
    ));
    o.config_discovery = discovery.clone();
    o.check_discovery().unwrap();
    assert!(!o.uses_kubernetes() && !o.metrics_auth());
    let mut o = parse(&["--config-file", "/c.yaml", "--pool-name", "p"]);
    o.validate().unwrap();
    assert!(o.uses_kubernetes());
    o.config_discovery = discovery.clone();
    o.check_discovery().unwrap();
    assert!(
        !o.uses_kubernetes(),
        "the pool name only labels metrics then"
    );
    let mut o = parse(&[
        "--config-file",
        "/c.yaml",
        "--static-endpoints",
        "127.0.0.1:1",
    ]);
    o.config_discovery = discovery.clone();
    assert!(matches!(
        o.check_discovery(),
        Err(OptionsError::TwoStaticSources)
    ));
    let mut o = parse(&[
        "--config-file",
        "/c.yaml",
        "--pool-name",
        "p",
        "--ha-enable-leader-election",
    ]);
    o.validate().unwrap();
    o.config_discovery = discovery;
    assert!(matches!(
        o.check_discovery(),
        Err(OptionsError::ElectionWithoutKubernetes)
    ));
}

#[test]
fn metrics_auth_is_on_by_default_in_kubernetes_mode_only() {
    let parse = |args: &[&str]| {
        Options::try_parse_from(std::iter::once("epp").chain(args.iter().copied())).unwrap()
    };
    assert!(
        parse(&["--pool-name", "p"]).metrics_auth(),
        "upstream's default"
    );
    assert!(!parse(&["--pool-name", "p", "--metrics-endpoint-auth=false"]).metrics_auth());
    let static_eps = parse(&["--static-endpoints", "127.0.0.1:1"]);
    assert!(!static_eps.metrics_auth(), "no API server to ask");
    static_eps.validate().unwrap();
    let forced = parse(&[
        "--static-endpoints",
        "127.0.0.1:1",
        "--metrics-endpoint-auth",
    ]);
    assert!(matches!(forced.validate(), Err(OptionsError::Requires(..))));
    assert_eq!(
        parse(&["--pool-name", "p"]).kube_api_unreachable_grace,
        Duration::from_secs(30)
    );
}

#[test]
fn bad_replica_sharing_flags_are_all_named_in_one_error() {
    let parse = |extra: &[&str]| {
        let base = ["epp", "--static-endpoints", "127.0.0.1:1"];
        Options::try_parse_from(base.iter().chain(extra)).unwrap()
    };
    let o = parse(&[
        "--speculative-peer-port",
        "9090",
        "--speculative-peers",
        "epp-peers:9004,nope,epp:0",
    ]);
    let Err(OptionsError::Peers(problems)) = o.validate() else {
        panic!("accepted {o:?}")
    };
    assert_eq!(problems.len(), 4, "{problems:?}");
    let text = OptionsError::Peers(problems).to_string();
    for part in [
        "need --speculative-peer-cert-dir",
        "9090 is also --metrics-port",
        "\"nope\" is not host:port",
        "\"epp:0\": the port",
    ] {
        assert!(text.contains(part), "{part} missing from {text}");
    }
    let o = parse(&["--speculative-peer-cert-dir", "/certs"]);
    assert!(matches!(o.validate(), Err(OptionsError::Peers(p)) if p.len() == 1));
    let o = parse(&[
        "--speculative-peer-port",
        "9004",
        "--speculative-peers",
        "epp-peers.ns.svc:9004",
        "--speculative-peer-cert-dir",
        "/certs",
    ]);
    o.validate().unwrap();
}

#[test]
fn the_pollers_urls_are_checked_at_start_up() {
    let parse = |extra: &[&str]| {
        let base = ["epp", "--static-endpoints", "127.0.0.1:1"];
        Options::try_parse_from(base.iter().chain(extra)).unwrap()
    };
    parse(&[]).validate().unwrap();
    parse(&[
        "--gpu-metrics-url",
        "http://dcgm.monitoring.svc:9400/federate?match[]=DCGM_FI_DEV_GPU_UTIL",
        "--model-server-metrics-path",
        "\"/metrics\"",
        "--health-check-path",
        "/v1/health",
    ])
    .validate()
    .unwrap();
    for (args, names) in [
        (
            ["--gpu-metrics-url", "https://dcgm:9400/metrics"],
            "--gpu-metrics-url",
        ),
        (
            ["--model-server-metrics-path", "metrics"],
            "does not start with /",
        ),
        (
            ["--model-server-metrics-path", "/met rics"],
            "--model-server-metrics-path",
        ),
        (["--health-check-path", "/he\nalth"], "--health-check-path"),
    ] {
        let err = parse(&args).validate().unwrap_err().to_string();
        assert!(err.contains(names), "{args:?}: {err}");
    }
}

/// Duration flags take Go's grammar, as upstream's flags (`1m30s` was refused before), and a
/// bare number of seconds; a bad one is refused naming the text and why.
#[test]
fn duration_flags_take_go_durations() {
    let parse = |flag: &str| {
        Options::try_parse_from(["epp", "--static-endpoints", "127.0.0.1:1", flag])
            .map(|o| o.refresh_metrics_interval)
    };
    for (flag, want) in [
        ("--refresh-metrics-interval=1m30s", Duration::from_secs(90)),
        (
            "--refresh-metrics-interval=500ms",
            Duration::from_millis(500),
        ),
        ("--refresh-metrics-interval=2h", Duration::from_secs(7200)),
        (
            "--refresh-metrics-interval=1.5s",
            Duration::from_millis(1500),
        ),
        (
            "--refresh-metrics-interval=300us",
            Duration::from_micros(300),
        ),
        ("--refresh-metrics-interval=2", Duration::from_secs(2)),
    ] {
        assert_eq!(parse(flag).unwrap(), want, "{flag}");
    }
    let err = parse("--refresh-metrics-interval=3d")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("invalid duration \"3d\"") && err.contains("unknown unit"),
        "{err}"
    );
    assert!(parse("--refresh-metrics-interval=-1s").is_err());
    let o = Options::try_parse_from(["epp", "--drain-timeout", "1m5s"]).unwrap();
    assert_eq!(o.drain_timeout, Duration::from_secs(65));
}
