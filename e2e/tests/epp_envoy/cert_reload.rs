//! `--enable-cert-reload` (GIE's flag) through a real Envoy that talks TLS to epp: epp serves
//! `--cert-path`'s certificate; after the files are replaced, new handshakes get the new one
//! (read off a handshake made here) while Envoy keeps routing; a broken replacement keeps the
//! last good certificate. And `--tls-min-version=VersionTLS13` refuses a TLS 1.2 client.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::envoy::{EnvoyConfig, Template};
use harness::sim_pod::{test_pod_config, SimPod};
use harness::stack::{Epp, Stack};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use super::support::{args, completion, post, served_by};

/// Writes a fresh self-signed pair into `dir`; returns the certificate (DER).
fn new_pair(dir: &Path) -> Vec<u8> {
    let ck = rcgen::generate_simple_self_signed(vec!["epp".to_owned()]).unwrap();
    std::fs::write(dir.join("tls.key"), ck.signing_key.serialize_pem()).unwrap();
    std::fs::write(dir.join("tls.crt"), ck.cert.pem()).unwrap();
    ck.cert.der().to_vec()
}

/// Accepts any server certificate: the test reads which one epp presents.
#[derive(Debug)]
struct AnyCert(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The certificate epp's ext_proc port presents to a new TLS client.
fn presented(addr: SocketAddr) -> Vec<u8> {
    handshake(addr, rustls::DEFAULT_VERSIONS).unwrap()
}

/// A TLS handshake with epp's ext_proc port offering `versions`: the certificate presented, or
/// the handshake's error.
fn handshake(
    addr: SocketAddr,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Result<Vec<u8>, std::io::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(versions)
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let name = ServerName::try_from("epp").unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut sock = std::net::TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    while conn.is_handshaking() {
        conn.complete_io(&mut sock)?;
    }
    Ok(conn.peer_certificates().unwrap()[0].as_ref().to_vec())
}

/// `--tls-min-version=VersionTLS13` (no `--cert-path`: the self-signed certificate) refuses a
/// client that offers TLS 1.2 only and serves one that offers 1.3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_min_version_13_refuses_a_tls_12_client() {
    let epp = Epp::start(&args(&[
        "--static-endpoints",
        "127.0.0.1:9",
        "--tls-min-version",
        "VersionTLS13",
    ]))
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    let grpc = epp.grpc;
    let (old, new) = tokio::task::spawn_blocking(move || {
        (
            handshake(grpc, &[&rustls::version::TLS12]),
            handshake(grpc, &[&rustls::version::TLS13]),
        )
    })
    .await
    .unwrap();
    assert!(old.is_err(), "a TLS 1.2 client was served");
    assert!(new.is_ok(), "{new:?}");
    epp.stop().await;
}

/// Waits (bounded) until new handshakes present `want`.
async fn wait_presented(addr: SocketAddr, want: &[u8], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = tokio::task::spawn_blocking(move || presented(addr))
            .await
            .unwrap();
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not presented within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_certificate_is_presented_to_new_connections_and_a_broken_one_is_not() {
    let dir = std::env::temp_dir().join(format!("epp-e2e-cert-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let first = new_pair(&dir);
    let mut cfg = test_pod_config("pod");
    cfg.pod_name = "pod-0".into();
    let pod = SimPod::bind(cfg).await.unwrap();
    let epp = Epp::start(&args(&[
        "--static-endpoints",
        &pod.endpoint(),
        "--cert-path",
        dir.to_str().unwrap(),
        "--enable-cert-reload",
    ]))
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    let envoy = EnvoyConfig::new(Template::Duplex)
        .epp(epp.grpc)
        .epp_tls(true)
        .pool([pod.addr()])
        .start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let stack = Stack {
        pods: vec![pod],
        epp,
        envoy,
    };
    let grpc = stack.epp.grpc;
    let response = post(&stack, "/v1/completions", completion("before"), &[]).await;
    assert_eq!(served_by(&stack, &response), 0);
    wait_presented(grpc, &first, "the first certificate").await;

    let second = new_pair(&dir);
    assert_ne!(first, second);
    wait_presented(grpc, &second, "the replaced certificate").await;
    let response = post(&stack, "/v1/completions", completion("after"), &[]).await;
    assert_eq!(served_by(&stack, &response), 0, "Envoy still routes");

    std::fs::write(dir.join("tls.crt"), "-----BEGIN CERTIFICATE-----\nbroken\n").unwrap();
    tokio::time::sleep(Duration::from_millis(2_500)).await; // past two polls (1 s)
    let got = tokio::task::spawn_blocking(move || presented(grpc))
        .await
        .unwrap();
    assert_eq!(got, second, "a broken file keeps the last good certificate");
    let response = post(&stack, "/v1/completions", completion("still"), &[]).await;
    assert_eq!(served_by(&stack, &response), 0);
    stack.stop().await;
    std::fs::remove_dir_all(&dir).unwrap();
}
