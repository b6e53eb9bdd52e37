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
