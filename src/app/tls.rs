//! ext_proc over TLS: epp handshakes each connection itself (rustls) and hands the stream to
//! tonic, with `--cert-path`'s certificate (`tls.crt`, `tls.key`) or a self-signed one made at
//! start-up, and `--tls-min-version` honoured (TLS 1.2 or 1.3; rustls has nothing older).
//!
//! With `--enable-cert-reload` (GIE's flag) the certificate files are read again when either
//! changes, and every handshake after that presents the new pair; connections already open keep
//! theirs. The files are polled once a second like every file epp follows ([`crate::watch`]),
//! which also sees a mounted Secret's symlink swap. A pair that does not load (half written, a
//! key that does not match the certificate) is logged and the last good one stays.
//!
//! The handshakes themselves are [`crate::handshake`]'s (concurrent, each bounded in time); a
//! failed one is logged at debug level and dropped.

use crate::watch::FileWatch;
use anyhow::Context;
use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The longest a client may take over its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The certificate new handshakes present, swapped whole on reload.
#[derive(Debug)]
pub(crate) struct Reloading {
    current: ArcSwap<CertifiedKey>,
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

impl Reloading {
    /// The certificate of `dir`, or why it does not load.
    pub(crate) fn load(dir: &Path) -> anyhow::Result<Arc<Self>> {
        Ok(Arc::new(Self {
            current: ArcSwap::from_pointee(certified(dir)?),
        }))
    }

    /// A fresh self-signed certificate (names `localhost` and `epp`), as upstream makes when no
    /// `--cert-path` is given.
    pub(crate) fn self_signed() -> anyhow::Result<Arc<Self>> {
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "epp".to_owned()])
            .context("generating a self-signed certificate")?;
        let key = PrivateKeyDer::try_from(ck.signing_key.serialize_der())
            .map_err(|e| anyhow::anyhow!("the self-signed key: {e}"))?;
        let key = CertifiedKey::from_der(
            vec![ck.cert.der().clone()],
            key,
            &rustls::crypto::ring::default_provider(),
        )
        .context("the self-signed certificate")?;
        Ok(Arc::new(Self {
            current: ArcSwap::from_pointee(key),
        }))
    }

    /// The TLS configuration serving it (HTTP/2 only, as gRPC needs); TLS 1.3 only when
    /// `tls13_only` (`--tls-min-version=VersionTLS13`), else 1.2 and 1.3.
    pub(crate) fn server_config(
        self: &Arc<Self>,
        tls13_only: bool,
    ) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider);
        let builder = if tls13_only {
            builder.with_protocol_versions(&[&rustls::version::TLS13])
        } else {
            builder.with_safe_default_protocol_versions()
        };
        let mut config = builder
            .context("TLS protocol versions")?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(self) as Arc<dyn ResolvesServerCert>);
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }

    /// Reads `dir` again every `poll` until `shutdown`, swapping in each pair that loads after
    /// a change.
    pub(crate) async fn follow(
        self: Arc<Self>,
        dir: PathBuf,
        poll: Duration,
        shutdown: CancellationToken,
    ) {
        let mut watches = [
            FileWatch::new(dir.join("tls.crt")),
            FileWatch::new(dir.join("tls.key")),
        ];
        // The first look at each file reports it as changed: that is the pair already loaded.
        for w in &mut watches {
            let _ = w.changed();
        }
        let mut tick = tokio::time::interval(poll);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let mut changed = false;
            for w in &mut watches {
                match w.changed() {
                    Ok(Some(_)) => changed = true,
                    Ok(None) => {}
                    // Mid-swap or removed: the next look decides.
                    Err(e) => {
                        tracing::debug!(error = %e, path = %w.path().display(), "certificate file unreadable")
                    }
                }
            }
            if !changed {
                continue;
            }
            match certified(&dir) {
                Ok(key) => {
                    self.current.store(Arc::new(key));
                    tracing::info!(dir = %dir.display(), "TLS certificate reloaded");
                }
                Err(e) => tracing::error!(
                    error = format!("{e:#}"),
                    "TLS certificate not reloaded; the previous one stays"
                ),
            }
        }
    }
}

/// `tls.crt` (the chain, leaf first) and `tls.key` of `dir` as one certified key; the key must
/// match the certificate.
fn certified(dir: &Path) -> anyhow::Result<CertifiedKey> {
    let (crt, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    let chain = CertificateDer::pem_file_iter(&crt)
        .with_context(|| format!("reading {}", crt.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing {}", crt.display()))?;
    anyhow::ensure!(!chain.is_empty(), "{} holds no certificate", crt.display());
    let key = PrivateKeyDer::from_pem_file(&key)
        .with_context(|| format!("reading the private key in {}", key.display()))?;
    CertifiedKey::from_der(chain, key, &rustls::crypto::ring::default_provider())
        .with_context(|| format!("{} and its key do not make a certificate", crt.display()))
}

/// The TLS connections of `listener`, handshaken with `config` ([`crate::handshake`]), for
/// tonic's `serve_with_incoming`; a failed handshake is logged at debug level.
pub(crate) fn incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    tracker: &TaskTracker,
    shutdown: CancellationToken,
) -> ReceiverStream<std::io::Result<TlsStream<TcpStream>>> {
    crate::handshake::incoming(
        listener,
        TlsAcceptor::from(config),
        HANDSHAKE_TIMEOUT,
        |peer, why| tracing::debug!(%peer, error = %why, "ext_proc TLS handshake refused"),
        tracker,
        shutdown,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path, name: &str) -> Vec<u8> {
        let ck = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
        std::fs::write(dir.join("tls.crt"), ck.cert.pem()).unwrap();
        std::fs::write(dir.join("tls.key"), ck.signing_key.serialize_pem()).unwrap();
        ck.cert.der().to_vec()
    }

    #[test]
    fn a_pair_loads_and_what_is_not_one_is_named() {
        let dir = std::env::temp_dir().join(format!("epp-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let der = write_pair(&dir, "epp");
        let r = Reloading::load(&dir).unwrap();
        assert_eq!(r.current.load().cert[0].as_ref(), der.as_slice());
        assert!(r.server_config(false).is_ok() && r.server_config(true).is_ok());
        assert!(Reloading::self_signed().is_ok());
        // Another pair's key: the key does not match the certificate.
        let other = rcgen::generate_simple_self_signed(vec!["x".to_owned()]).unwrap();
        std::fs::write(dir.join("tls.key"), other.signing_key.serialize_pem()).unwrap();
        let e = format!("{:#}", certified(&dir).unwrap_err());
        assert!(e.contains("do not make a certificate"), "{e}");
        std::fs::write(dir.join("tls.crt"), "not pem").unwrap();
        let e = format!("{:#}", certified(&dir).unwrap_err());
        assert!(e.contains("holds no certificate"), "{e}");
        std::fs::remove_file(dir.join("tls.key")).unwrap();
        write_pair(&dir, "epp");
        std::fs::remove_file(dir.join("tls.key")).unwrap();
        let e = format!("{:#}", certified(&dir).unwrap_err());
        assert!(e.contains("tls.key"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
