use super::plan::{self, Action, Export, Key, Outcome};
use super::types::{ImportController, ImportStatus, InferencePoolImport};
use super::{is_controller_name, ClusterFlag};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};

const ME: &str = "epp/pool-import";

fn key() -> Key {
    Key {
        namespace: "llm".into(),
        name: "pool".into(),
    }
}

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(secs).unwrap()
}

fn clusters(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

fn annotated(value: &str) -> BTreeMap<String, String> {
    [(plan::EXPORT_ANNOTATION.to_owned(), value.to_owned())].into()
}

fn import(labels: bool, controllers: Vec<ImportController>) -> InferencePoolImport {
    let (k, v) = plan::MANAGED_BY;
    let mut i = InferencePoolImport::new(ObjectMeta {
        name: Some("pool".into()),
        labels: labels.then(|| [(k.to_owned(), v.to_owned())].into()),
        ..ObjectMeta::default()
    });
    i.status = Some(ImportStatus { controllers });
    i
}

#[test]
fn only_cluster_set_exports() {
    assert_eq!(plan::export_of(None), Export::None);
    assert_eq!(
        plan::export_of(Some(&annotated("ClusterSet"))),
        Export::ClusterSet
    );
    assert_eq!(
        plan::export_of(Some(&annotated("clusterset"))),
        Export::Unsupported("clusterset".into())
    );
}

#[test]
fn exports_gather_every_exporting_cluster_of_a_name() {
    let other = Key {
        namespace: "llm".into(),
        name: "other".into(),
    };
    let got = plan::exports([
        ("b", key(), Export::ClusterSet),
        ("a", key(), Export::ClusterSet),
        ("a", other.clone(), Export::None),
        ("c", other, Export::Unsupported("x".into())),
    ]);
    assert_eq!(got, [(key(), clusters(&["a", "b"]))].into());
}

#[test]
fn entry_lists_clusters_and_keeps_its_transition_time() {
    let first = plan::import_entry(ME, &clusters(&["a", "b"]), None, at(100));
    assert_eq!(first.name, ME);
    let names: Vec<_> = first
        .exporting_clusters
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(names, ["a", "b"]);
    let accepted = &first.conditions[0];
    assert_eq!(
        (accepted.type_.as_str(), accepted.status.as_str()),
        ("Accepted", "True")
    );
    let again = plan::import_entry(ME, &clusters(&["a", "b"]), Some(&first), at(200));
    assert_eq!(
        again, first,
        "nothing changed: the same entry, the same time"
    );
}

#[test]
fn actions_create_update_and_leave_alone() {
    let wanted = plan::import_entry(ME, &clusters(&["a"]), None, at(1));
    assert_eq!(
        plan::import_action(ME, Some(wanted.clone()), None),
        Some(Action::Create(wanted.clone()))
    );
    let current = import(true, vec![wanted.clone()]);
    assert_eq!(
        plan::import_action(ME, Some(wanted.clone()), Some(&current)),
        None
    );
    let more = plan::import_entry(ME, &clusters(&["a", "b"]), Some(&wanted), at(2));
    assert_eq!(
        plan::import_action(ME, Some(more.clone()), Some(&current)),
        Some(Action::Apply(more))
    );
    assert_eq!(plan::import_action(ME, None, None), None);
}

#[test]
fn a_withdrawn_export_deletes_only_what_we_alone_hold() {
    let ours = plan::import_entry(ME, &clusters(&["a"]), None, at(1));
    let gateway = ImportController {
        name: "example.net/gateway".into(),
        exporting_clusters: Vec::new(),
        parents: vec![json!({"parentRef": {"name": "gw"}})],
        conditions: Vec::new(),
    };
    let alone = import(true, vec![ours.clone()]);
    assert_eq!(
        plan::import_action(ME, None, Some(&alone)),
        Some(Action::Delete)
    );
    let shared = import(true, vec![ours.clone(), gateway.clone()]);
    assert_eq!(
        plan::import_action(ME, None, Some(&shared)),
        Some(Action::Withdraw)
    );
    let foreign = import(false, vec![ours]);
    assert_eq!(
        plan::import_action(ME, None, Some(&foreign)),
        Some(Action::Withdraw)
    );
    let theirs = import(false, vec![gateway]);
    assert_eq!(plan::import_action(ME, None, Some(&theirs)), None);
    let empty_ours = import(true, Vec::new());
    assert_eq!(
        plan::import_action(ME, None, Some(&empty_ours)),
        Some(Action::Delete)
    );
}

#[test]
fn pool_status_sets_replaces_and_clears_our_entry_only() {
    let gateway =
        json!({"parentRef": {"kind": "Gateway", "name": "gw"}, "controllerName": "example.net/gw"});
    let set = plan::pool_parents(
        ME,
        &key(),
        std::slice::from_ref(&gateway),
        &Export::ClusterSet,
        &Outcome::Exported,
        Some(3),
        at(10),
    )
    .expect("a new entry");
    assert_eq!(set.len(), 2);
    assert_eq!(set[0], gateway);
    assert_eq!(set[1]["parentRef"]["kind"], "InferencePoolImport");
    assert_eq!(set[1]["parentRef"]["namespace"], "llm");
    assert_eq!(set[1]["controllerName"], ME);
    assert_eq!(set[1]["conditions"][0]["type"], "Exported");
    assert_eq!(set[1]["conditions"][0]["status"], "True");
    assert_eq!(set[1]["conditions"][0]["observedGeneration"], 3);
    // Round-tripped through the API server's JSON: no change, no write.
    let same = plan::pool_parents(
        ME,
        &key(),
        &set,
        &Export::ClusterSet,
        &Outcome::Exported,
        Some(3),
        at(20),
    );
    assert_eq!(same, None);
    let failed = Outcome::Failed(vec!["b: namespace llm not found".into()]);
    let down = plan::pool_parents(
        ME,
        &key(),
        &set,
        &Export::ClusterSet,
        &failed,
        Some(3),
        at(30),
    )
    .expect("changed");
    assert_eq!(down[1]["conditions"][0]["status"], "False");
    assert_eq!(down[1]["conditions"][0]["reason"], "ImportFailed");
    let cleared = plan::pool_parents(
        ME,
        &key(),
        &down,
        &Export::None,
        &Outcome::Exported,
        Some(4),
        at(40),
    )
    .expect("cleared");
    assert_eq!(cleared, vec![gateway.clone()]);
    assert_eq!(
        plan::pool_parents(
            ME,
            &key(),
            &cleared,
            &Export::None,
            &Outcome::Exported,
            Some(4),
            at(50)
        ),
        None
    );
    let odd = plan::pool_parents(
        ME,
        &key(),
        &[],
        &Export::Unsupported("all".into()),
        &Outcome::Exported,
        None,
        at(60),
    )
    .expect("said");
    assert_eq!(odd[0]["conditions"][0]["reason"], "UnsupportedValue");
}

#[test]
fn a_long_message_is_cut_to_the_crds_limit() {
    let why: Vec<String> = (0..2000)
        .map(|i| format!("cluster-{i}: namespace llm not found é"))
        .collect();
    let parents = plan::pool_parents(
        ME,
        &key(),
        &[],
        &Export::ClusterSet,
        &Outcome::Failed(why),
        None,
        at(1),
    )
    .unwrap();
    let message = parents[0]["conditions"][0]["message"].as_str().unwrap();
    assert!(message.len() <= plan::MESSAGE_MAX, "{}", message.len());
    assert!(message.ends_with("..."));
}

#[test]
fn cluster_flags_and_controller_names() {
    let c: ClusterFlag = "east=/etc/kube/east".parse().unwrap();
    assert_eq!(
        (c.name.as_str(), c.kubeconfig.to_str().unwrap()),
        ("east", "/etc/kube/east")
    );
    assert!("east".parse::<ClusterFlag>().is_err());
    assert!("=/x".parse::<ClusterFlag>().is_err());
    assert!(is_controller_name("epp/pool-import"));
    assert!(is_controller_name("example.net/import-controller"));
    assert!(!is_controller_name("example.net"));
    assert!(!is_controller_name("Example.net/x"));
    assert!(!is_controller_name("example.net/"));
}

mod endpoint_files {
    use super::super::endpoints;
    use super::key;
    use crate::discovery::k8s::pods::PoolTarget;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    fn pod(name: &str, app: &str, ip: &str, ready: bool) -> Pod {
        let ready = if ready { "True" } else { "False" };
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "llm", "labels": {"app": app}},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": ready}]}
        }))
        .unwrap()
    }

    #[test]
    fn one_entry_per_serving_pod_and_port_labelled_with_its_cluster() {
        let target = PoolTarget {
            selector: [("app".to_owned(), "vllm".to_owned())].into(),
            ports: vec![8000, 8001],
        };
        let pods = [
            pod("b", "vllm", "10.0.0.2", true),
            pod("a", "vllm", "10.0.0.1", true),
            pod("down", "vllm", "10.0.0.3", false),
            pod("other", "web", "10.0.0.4", true),
        ];
        let entries = endpoints::entries("east", &target, &pods);
        let text = endpoints::render(entries).unwrap();
        let doc: serde_json::Value = serde_norway::from_str(&text).unwrap();
        let names: Vec<&str> = doc["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["east.a.8000", "east.a.8001", "east.b.8000", "east.b.8001"]
        );
        let first = &doc["endpoints"][0];
        assert_eq!(first["address"], "10.0.0.1");
        assert_eq!(first["port"], "8000");
        assert_eq!(first["namespace"], "llm");
        assert_eq!(first["labels"][endpoints::CLUSTER_LABEL], "east");
        assert_eq!(first["labels"]["app"], "vllm");
    }

    #[test]
    fn files_are_rewritten_only_on_change_and_stale_ones_found() {
        let dir = std::env::temp_dir().join(format!("epp-export-{}", std::process::id()));
        let path = endpoints::path(&dir, &key()).unwrap();
        assert!(path.ends_with("llm/pool.yaml"));
        assert!(endpoints::write_if_changed(&path, "endpoints: []\n").unwrap());
        assert!(!endpoints::write_if_changed(&path, "endpoints: []\n").unwrap());
        assert!(endpoints::stale(&dir, &[key()].into()).unwrap().is_empty());
        assert_eq!(endpoints::stale(&dir, &Default::default()).unwrap(), [path]);
        let dotted = super::Key {
            namespace: "..".into(),
            name: "x".into(),
        };
        assert_eq!(endpoints::path(&dir, &dotted), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
