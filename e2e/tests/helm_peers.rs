//! The chart's replica sharing (active-active): the Secret it generates holds a CA and a
//! certificate that epp accepts, for the headless Service the replicas dial, good for both ends
//! of a mutual-TLS handshake; a Secret of one's own replaces it.
#![allow(clippy::unwrap_used)]

use epp::replicas::{Credentials, PeerTls};
use rustls::pki_types::ServerName;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// Renders the chart as release `llama` in namespace `llm` (Helm's own code, as tests/helm.rs).
fn render(values: &Value) -> Vec<Value> {
    let venv = Command::new(root().join("hack/helm/venv.sh"))
        .output()
        .unwrap();
    assert!(
        venv.status.success(),
        "{}",
        String::from_utf8_lossy(&venv.stderr)
    );
    let python = String::from_utf8(venv.stdout).unwrap().trim().to_owned();
    let out = Command::new(python)
        .arg(root().join("hack/helm/render.py"))
        .arg(root().join("charts/inferencepool"))
        .args(["llama", "llm", &values.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["lint"]["errors"], json!([]));
    result["manifests"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|text| {
            text.as_str()
                .unwrap()
                .split("\n---\n")
                .map(|d| serde_norway::from_str::<Value>(&format!("{d}\n")).unwrap())
                .filter(|v| !v.is_null())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn active_active(peers: Value) -> Value {
    json!({
        "inferencePool": {"modelServers": {"matchLabels": {"app": "vllm"}}},
        "inferenceExtension": {"replicas": 3, "haMode": "active-active",
            "kvEvents": {"port": 5557}, "speculativePeers": peers}
    })
}

fn secret(objects: &[Value]) -> Option<&Value> {
    objects.iter().find(|o| o["kind"] == "Secret")
}

fn deployment(objects: &[Value]) -> &Value {
    objects.iter().find(|o| o["kind"] == "Deployment").unwrap()
}

/// A Secret's value, decoded by k8s-openapi's `ByteString` (base64).
fn decoded(secret: &Value, key: &str) -> String {
    let s: k8s_openapi::api::core::v1::Secret = serde_json::from_value(secret.clone()).unwrap();
    String::from_utf8(s.data.unwrap()[key].0.clone()).unwrap()
}

/// Client and server handshake in memory; `Err` is the first side's TLS error.
fn handshake(tls: &PeerTls, name: &str) -> Result<(), rustls::Error> {
    let name = ServerName::try_from(name.to_owned()).unwrap();
    let mut client = rustls::ClientConnection::new(Arc::clone(&tls.client), name)?;
    let mut server = rustls::ServerConnection::new(Arc::clone(&tls.server))?;
    for _ in 0..10 {
        let mut buf = Vec::new();
        client.write_tls(&mut buf).unwrap();
        server.read_tls(&mut &buf[..]).unwrap();
        server.process_new_packets()?;
        buf.clear();
        server.write_tls(&mut buf).unwrap();
        client.read_tls(&mut &buf[..]).unwrap();
        client.process_new_packets()?;
        if !client.is_handshaking() && !server.is_handshaking() {
            assert!(
                server.peer_certificates().is_some(),
                "the client presented no certificate"
            );
            return Ok(());
        }
    }
    panic!("the handshake did not finish");
}

#[test]
fn the_chart_generates_credentials_that_authenticate_both_replicas_for_the_peers_service() {
    let objects = render(&active_active(json!({"port": 9004})));
    let s = secret(&objects).expect("the generated Secret");
    assert_eq!(s["metadata"]["name"], "llama-epp-peers-tls");
    assert_eq!(s["type"], "kubernetes.io/tls");
    let creds = Credentials {
        ca: decoded(s, "ca.crt"),
        cert: decoded(s, "tls.crt"),
        key: decoded(s, "tls.key"),
    };
    let tls = PeerTls::new(&creds).unwrap();
    handshake(&tls, "llama-epp-peers.llm.svc").unwrap();
    assert!(
        handshake(&tls, "other.llm.svc").is_err(),
        "a name the certificate does not carry was accepted"
    );
    let other =
        PeerTls::new(&Credentials::generate(&["llama-epp-peers.llm.svc"]).unwrap()).unwrap();
    let impostor = PeerTls {
        client: other.client,
        server: tls.server,
    };
    assert!(
        handshake(&impostor, "llama-epp-peers.llm.svc").is_err(),
        "a client of another CA was accepted"
    );
    let pod = &deployment(&objects)["spec"]["template"]["spec"];
    let args = pod["containers"][0]["args"].as_array().unwrap();
    assert!(args.contains(&json!("--speculative-peer-cert-dir=/peer-tls")));
    assert!(pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .contains(&json!({"name": "peer-tls", "mountPath": "/peer-tls", "readOnly": true})));
    assert!(pod["volumes"]
        .as_array()
        .unwrap()
        .contains(&json!({"name": "peer-tls", "secret": {"secretName": "llama-epp-peers-tls"}})));
}

#[test]
fn a_secret_of_ones_own_replaces_the_generated_one_and_no_sharing_needs_none() {
    let objects = render(&active_active(
        json!({"port": 9004, "secretName": "my-peers"}),
    ));
    assert!(
        secret(&objects).is_none(),
        "generated a Secret beside the user's"
    );
    let volumes = &deployment(&objects)["spec"]["template"]["spec"]["volumes"];
    assert!(volumes
        .as_array()
        .unwrap()
        .contains(&json!({"name": "peer-tls", "secret": {"secretName": "my-peers"}})));
    let off = render(&active_active(json!({"port": 0})));
    assert!(secret(&off).is_none());
    let args = deployment(&off)["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(!args.contains("speculative-peer"), "{args}");
}
