#![allow(clippy::disallowed_methods)] // the tests' own HTTPS server

use super::*;
use crate::config::{ClusterSource, MetricSpec};
use crate::replicas::tls::Credentials;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SPOKE: &str = "# TYPE llm_d_epp_average_kv_cache_utilization gauge
llm_d_epp_average_kv_cache_utilization{name=\"pool-a\"} 0.25
llm_d_epp_average_kv_cache_utilization{name=\"pool-b\"} 0.75
# TYPE llm_d_epp_average_queue_size gauge
llm_d_epp_average_queue_size{name=\"pool-a\"} 3
";

#[test]
fn the_first_sample_of_each_series_is_read() {
    let m = extract(SPOKE, &ClusterExtractor::default(), Instant::now()).unwrap();
    assert_eq!(
        m.pool,
        Some(PoolMetrics {
            kv_usage: Some(0.25),
            queue: Some(3.0),
            rtt_ms: None,
        })
    );
    let by_label = ClusterExtractor {
        kv_usage: MetricSpec::parse("llm_d_epp_average_kv_cache_utilization{name=pool-b}").unwrap(),
        queue: MetricSpec::parse("llm_d_epp_average_queue_size{name=pool-b}").unwrap(),
    };
    let m = extract(SPOKE, &by_label, Instant::now()).unwrap();
    assert_eq!(
        m.pool,
        Some(PoolMetrics {
            kv_usage: Some(0.75),
            queue: None,
            rtt_ms: None,
        }),
        "one series is enough; the other stays unknown"
    );
}

#[test]
fn the_round_trip_is_the_smallest_of_the_last_samples() {
    let mut w = RttWindow::default();
    assert_eq!(w.min_ms(), None);
    // The first sample carries the connection's set-up.
    w.push(Duration::from_millis(120));
    w.push(Duration::from_millis(41));
    w.push(Duration::from_millis(45));
    assert_eq!(w.min_ms(), Some(41.0));
    // A longer path shows once the short samples have left the window.
    for _ in 0..RTT_SAMPLES {
        w.push(Duration::from_millis(280));
    }
    assert_eq!(w.min_ms(), Some(280.0));
}

#[test]
fn a_page_without_either_series_is_a_failed_scrape() {
    let page = "vllm:num_requests_waiting 3\n";
    let e = extract(page, &ClusterExtractor::default(), Instant::now()).unwrap_err();
    assert!(matches!(e, ScrapeError::NoPoolSeries { .. }), "{e}");
}

/// A loopback HTTPS server answering every request with [`SPOKE`] (a spoke EPP's page), with
/// `creds`' certificate; it counts the answers.
async fn https_spoke(creds: &Credentials) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let chain = vec![CertificateDer::from_pem_slice(creds.cert.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(creds.key.as_bytes()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let answered = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&answered);
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let (acceptor, count) = (acceptor.clone(), Arc::clone(&count));
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(sock).await else {
                    return;
                };
                let mut buf = [0u8; 4096];
                while let Ok(n) = tls.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{SPOKE}",
                        SPOKE.len()
                    );
                    if tls.write_all(resp.as_bytes()).await.is_err() {
                        return;
                    }
                    count.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    (addr, answered)
}

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

fn hub(ca: Option<&std::path::Path>, skip: bool) -> Arc<ClusterScrape> {
    let source = ClusterSource {
        scheme: Scheme::Https,
        path: "/metrics".into(),
        insecure_skip_verify: skip,
        ca_cert: ca.map(|p| p.to_owned()),
        client_identity: None,
        interval: None,
    };
    let settings = ClusterMetrics {
        source,
        extractor: ClusterExtractor::default(),
    };
    Arc::new(ClusterScrape::new(settings).unwrap())
}

fn cluster_at(metrics_host: &str) -> Endpoint {
    Endpoint {
        metrics_host: Some(metrics_host.to_owned()),
        ..Endpoint::from_id("10.9.0.1:443".parse().unwrap())
    }
}

#[tokio::test]
async fn a_spoke_is_scraped_over_https_with_its_certificate_verified() {
    let creds = Credentials::generate(&["localhost", "127.0.0.1"]).unwrap();
    let dir = std::env::temp_dir().join(format!("epp-cluster-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, &creds.ca).unwrap();
    let (addr, answered) = https_spoke(&creds).await;
    let timeout = Duration::from_secs(5);
    for host in [addr.to_string(), format!("localhost:{}", addr.port())] {
        let mut t = Target::new(&cluster_at(&host), &hub(Some(&ca), false));
        let m = t
            .scrape(timeout)
            .await
            .unwrap_or_else(|e| panic!("{host}: {e}"));
        assert_eq!(m.pool.and_then(|p| p.queue), Some(3.0), "{host}");
        let rtt = m.pool.and_then(|p| p.rtt_ms).expect("the scrape is timed");
        assert!(rtt > 0.0 && rtt < timeout.as_secs_f64() * 1e3, "{rtt}");
        t.scrape(timeout).await.unwrap();
    }
    assert_eq!(answered.load(Ordering::SeqCst), 4, "the connection is kept");
    // Another CA's certificate is refused; insecureSkipVerify takes any.
    let other = Credentials::generate(&["127.0.0.1"]).unwrap();
    let other_ca = dir.join("other.pem");
    std::fs::write(&other_ca, &other.ca).unwrap();
    let mut refused = Target::new(&cluster_at(&addr.to_string()), &hub(Some(&other_ca), false));
    let e = refused.scrape(timeout).await.unwrap_err();
    assert!(e.to_string().contains("connecting to"), "{e}");
    let mut skip = Target::new(&cluster_at(&addr.to_string()), &hub(None, true));
    assert!(skip.scrape(timeout).await.is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_ca_file_that_is_no_pem_fails_start_up() {
    let dir = std::env::temp_dir().join(format!("epp-cluster-ca-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, "not a certificate").unwrap();
    let settings = |ca: &std::path::Path| ClusterMetrics {
        source: ClusterSource {
            scheme: Scheme::Https,
            path: "/metrics".into(),
            insecure_skip_verify: false,
            ca_cert: Some(ca.to_owned()),
            client_identity: None,
            interval: None,
        },
        extractor: ClusterExtractor::default(),
    };
    let e = ClusterScrape::new(settings(&ca)).unwrap_err();
    assert!(e.to_string().contains("no valid CA certs"), "{e}");
    let e = ClusterScrape::new(settings(&dir.join("missing.pem"))).unwrap_err();
    assert!(e.to_string().contains("missing.pem"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
