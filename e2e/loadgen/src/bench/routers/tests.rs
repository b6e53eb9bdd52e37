//! Tests of `bench::routers`.

use super::*;

#[test]
fn the_precise_router_gets_each_pods_event_ports_as_labels() {
    let dir = std::env::temp_dir().join(format!("epp-bench-routers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pods = [
        SocketAddr::from(([127, 0, 0, 1], 9000)),
        SocketAddr::from(([127, 0, 0, 1], 9001)),
    ];
    let file = endpoints_file(&pods, &[(9100, 9200), (9101, 9201)], &dir).unwrap();
    let parsed = epp::discovery::parse_file(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(parsed.len(), 2);
    assert_eq!(parsed[1].id.0, pods[1]);
    assert_eq!(
        parsed[1]
            .labels
            .get(epp::kvevents::PORT_LABEL)
            .map(String::as_str),
        Some("9101")
    );
    assert_eq!(
        parsed[1]
            .labels
            .get(epp::kvevents::REPLAY_PORT_LABEL)
            .map(String::as_str),
        Some("9201")
    );
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(Router::EppPrecise {
        name: "p".into(),
        config: PathBuf::new(),
        replicas: 1,
        shared: false
    }
    .needs_kv_events());
    assert!(!Router::Epp {
        name: "p".into(),
        config: PathBuf::new(),
        replicas: 3
    }
    .needs_kv_events());
    assert_eq!(
        Router::Epp {
            name: "p".into(),
            config: PathBuf::new(),
            replicas: 3
        }
        .label(),
        "epp-p-x3"
    );
}

/// An llm-d configuration with `${ENDPOINTS_FILE}` is rendered for epp as llm-d-router gets it
/// (llm-d's endpoints file of the pods, its path filled in); any other one is left alone.
#[test]
fn an_llmd_file_discovery_configuration_gets_llmds_endpoints_file() {
    let dir = std::env::temp_dir().join(format!("epp-bench-llmd-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pods: Vec<SocketAddr> = vec!["127.0.0.2:8000".parse().unwrap()];
    let llmd = dir.join("llmd.yaml");
    std::fs::write(
        &llmd,
        "plugins:\n- {type: file-discovery, parameters: {path: ${ENDPOINTS_FILE}}}\n",
    )
    .unwrap();
    let rendered = llmd_file_discovery(&llmd, &pods, &dir).unwrap().unwrap();
    let text = std::fs::read_to_string(&rendered).unwrap();
    let endpoints = dir.join("epp-llmd-endpoints.yaml");
    assert!(text.contains(&endpoints.display().to_string()), "{text}");
    let file = std::fs::read_to_string(&endpoints).unwrap();
    let parsed = epp::discovery::file::parse(&file).unwrap();
    assert_eq!(parsed.endpoints.len(), 1);
    assert_eq!(parsed.endpoints[0].id.to_string(), "127.0.0.2:8000");
    let plain = dir.join("epp.yaml");
    std::fs::write(&plain, "plugins: []\n").unwrap();
    assert!(llmd_file_discovery(&plain, &pods, &dir).unwrap().is_none());
    std::fs::remove_dir_all(&dir).unwrap();
}
