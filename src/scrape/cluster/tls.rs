//! The TLS client configuration of a hub's scrape, as upstream's `tlsClientConfig`: the peer's
//! certificate verified against `caCertPath` (else the system's roots, as Go's default pool),
//! a client certificate when `clientCertPath` and `clientKeyPath` name one, and no
//! verification at all only with `insecureSkipVerify`.

use crate::config::ClusterSource;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// Upstream's `ErrNoValidCACerts`.
    #[error("no valid CA certs in {0}")]
    NoCerts(PathBuf),
    #[error("the system's trust roots: none could be loaded")]
    NoSystemRoots,
    #[error("a certificate rustls refuses: {0}")]
    Certificate(#[source] rustls::Error),
    /// Upstream's `ErrLoadClientCert`.
    #[error("loading client cert: {0}")]
    ClientCert(#[source] rustls::Error),
}

/// The client configuration `source` asks for.
pub(crate) fn client_config(source: &ClusterSource) -> Result<ClientConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Certificate)?;
    let builder = match (&source.ca_cert, source.insecure_skip_verify) {
        (_, true) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(provider))),
        (Some(ca), false) => builder.with_root_certificates(roots_from(ca)?),
        (None, false) => builder.with_root_certificates(system_roots()?),
    };
    match &source.client_identity {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let chain = certificates(cert)?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|source| TlsError::Read {
                path: key.clone(),
                source,
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(TlsError::ClientCert)
        }
    }
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let read = |source| TlsError::Read {
        path: path.to_owned(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(read)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read)?;
    match certs.is_empty() {
        true => Err(TlsError::NoCerts(path.to_owned())),
        false => Ok(certs),
    }
}

fn roots_from(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in certificates(path)? {
        roots.add(c).map_err(TlsError::Certificate)?;
    }
    Ok(roots)
}

/// The platform's roots; those it cannot parse are skipped, as Go's pool skips them.
fn system_roots() -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    let (added, _) =
        roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    match added {
        0 => Err(TlsError::NoSystemRoots),
        _ => Ok(roots),
    }
}

/// `insecureSkipVerify`: any certificate is accepted (the handshake's signatures are still
/// checked, so the session is with the key holder of the certificate shown).
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
