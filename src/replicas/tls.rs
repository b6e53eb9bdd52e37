//! Mutual TLS between replicas: who may send a replica its speculative entries, and whom it
//! sends them to.
//!
//! Every replica holds the same three files (`--speculative-peer-cert-dir`, the layout of a
//! `kubernetes.io/tls` Secret with its `ca.crt`, as the chart and cert-manager write them): the
//! CA, and a certificate it signed with its key. The server asks every caller for a certificate
//! chaining to that CA and refuses the handshake otherwise; the caller checks the server's the
//! same way, for the host name it dialled. The CA is private to replica sharing (the chart
//! generates it), so holding a certificate it signed is what makes a peer.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The files of `--speculative-peer-cert-dir`.
pub(crate) const CA_FILE: &str = "ca.crt";
pub(crate) const CERT_FILE: &str = "tls.crt";
pub(crate) const KEY_FILE: &str = "tls.key";

/// Both sides of a replica's TLS: the server that receives, the client that sends.
#[derive(Clone)]
pub struct PeerTls {
    pub server: Arc<ServerConfig>,
    pub client: Arc<ClientConfig>,
}

/// A problem with the credentials.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: not PEM ({source})")]
    Pem {
        file: &'static str,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{file}: no certificate")]
    NoCertificate { file: &'static str },
    #[error("{CA_FILE}: not a CA certificate rustls accepts ({0})")]
    Ca(#[source] rustls::Error),
    #[error("{CERT_FILE} and {KEY_FILE}: {0}")]
    Identity(#[source] rustls::Error),
    #[error("{CA_FILE}: {0}")]
    Verifier(#[source] rustls::server::VerifierBuilderError),
    #[error("generating credentials: {0}")]
    Generate(#[from] rcgen::Error),
}

/// Every problem found with the credentials, reported together.
#[derive(Debug, thiserror::Error)]
#[error("replica-sharing credentials: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct CredentialErrors(pub Vec<CredentialError>);

/// PEM text of a CA certificate, a certificate it signed and that certificate's key.
#[derive(Clone, Debug)]
pub struct Credentials {
    pub ca: String,
    pub cert: String,
    pub key: String,
}

impl Credentials {
    /// A fresh CA and one certificate it signs for `names` (DNS names or IP addresses), good for
    /// both ends of a connection: what the chart's Secret holds, for tests and the benchmark.
    pub fn generate(names: &[&str]) -> Result<Self, CredentialError> {
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        ca.distinguished_name
            .push(DnType::CommonName, "epp replica-sharing CA");
        let ca_key = KeyPair::generate()?;
        let ca_cert = ca.self_signed(&ca_key)?;
        let mut leaf =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())?;
        leaf.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let leaf_key = KeyPair::generate()?;
        let cert = leaf.signed_by(&leaf_key, &Issuer::new(ca, ca_key))?;
        Ok(Self {
            ca: ca_cert.pem(),
            cert: cert.pem(),
            key: leaf_key.serialize_pem(),
        })
    }

    /// Writes the three files of `--speculative-peer-cert-dir` into `dir`.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::write(dir.join(CA_FILE), &self.ca)?;
        std::fs::write(dir.join(CERT_FILE), &self.cert)?;
        std::fs::write(dir.join(KEY_FILE), &self.key)
    }
}

impl PeerTls {
    /// Reads `dir`'s `ca.crt`, `tls.crt` and `tls.key`; every unreadable or unusable file is
    /// named in the one error.
    pub(crate) fn load(dir: &Path) -> Result<Self, CredentialErrors> {
        let mut errors = Vec::new();
        let mut read = |file: &str| match std::fs::read_to_string(dir.join(file)) {
            Ok(text) => text,
            Err(source) => {
                errors.push(CredentialError::Read {
                    path: dir.join(file),
                    source,
                });
                String::new()
            }
        };
        let creds = Credentials {
            ca: read(CA_FILE),
            cert: read(CERT_FILE),
            key: read(KEY_FILE),
        };
        if !errors.is_empty() {
            return Err(CredentialErrors(errors));
        }
        Self::new(&creds)
    }

    /// Both configurations from PEM text.
    pub fn new(creds: &Credentials) -> Result<Self, CredentialErrors> {
        let mut errors = Vec::new();
        let ca = certificates(CA_FILE, &creds.ca).map_err(|e| errors.push(e));
        let chain = certificates(CERT_FILE, &creds.cert).map_err(|e| errors.push(e));
        let key = PrivateKeyDer::from_pem_slice(creds.key.as_bytes()).map_err(|source| {
            errors.push(CredentialError::Pem {
                file: KEY_FILE,
                source,
            })
        });
        let (Ok(ca), Ok(chain), Ok(key)) = (ca, chain, key) else {
            return Err(CredentialErrors(errors));
        };
        configs(ca, chain, key).map_err(|e| CredentialErrors(vec![e]))
    }
}

fn certificates(
    file: &'static str,
    pem: &str,
) -> Result<Vec<CertificateDer<'static>>, CredentialError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| CredentialError::Pem { file, source })?;
    if certs.is_empty() {
        return Err(CredentialError::NoCertificate { file });
    }
    Ok(certs)
}

fn configs(
    ca: Vec<CertificateDer<'static>>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<PeerTls, CredentialError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for c in ca {
        roots.add(c).map_err(CredentialError::Ca)?;
    }
    let roots = Arc::new(roots);
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), Arc::clone(&provider))
            .build()
            .map_err(CredentialError::Verifier)?;
    let mut server = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(CredentialError::Identity)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(CredentialError::Identity)?;
    server.alpn_protocols = vec![b"h2".to_vec()];
    let mut client = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(CredentialError::Identity)?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(CredentialError::Identity)?;
    client.alpn_protocols = vec![b"h2".to_vec()];
    Ok(PeerTls {
        server: Arc::new(server),
        client: Arc::new(client),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_credentials_make_both_configurations() {
        let creds = Credentials::generate(&["127.0.0.1", "epp-peers.ns.svc"]).unwrap();
        let tls = PeerTls::new(&creds).unwrap();
        assert_eq!(tls.server.alpn_protocols, [b"h2".to_vec()]);
    }

    #[test]
    fn every_missing_file_is_named_in_one_error() {
        let dir = std::env::temp_dir().join(format!("epp-peer-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(CERT_FILE), "x").unwrap();
        let Err(e) = PeerTls::load(&dir) else {
            panic!("loaded without ca.crt and tls.key")
        };
        let text = e.to_string();
        assert!(text.contains(CA_FILE) && text.contains(KEY_FILE), "{text}");
        assert!(!text.contains(CERT_FILE), "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn files_that_are_not_pem_are_each_named() {
        let creds = Credentials {
            ca: "not pem".into(),
            cert: String::new(),
            key: "not pem either".into(),
        };
        let Err(CredentialErrors(errors)) = PeerTls::new(&creds) else {
            panic!("accepted")
        };
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(matches!(
            errors[0],
            CredentialError::NoCertificate { file: CA_FILE }
        ));
        assert!(matches!(
            errors[1],
            CredentialError::NoCertificate { file: CERT_FILE }
        ));
        assert!(matches!(
            errors[2],
            CredentialError::Pem { file: KEY_FILE, .. }
        ));
    }

    #[test]
    fn a_key_that_does_not_match_the_certificate_is_refused() {
        let a = Credentials::generate(&["127.0.0.1"]).unwrap();
        let b = Credentials::generate(&["127.0.0.1"]).unwrap();
        let mixed = Credentials { key: b.key, ..a };
        let Err(CredentialErrors(errors)) = PeerTls::new(&mixed) else {
            panic!("accepted a key of another certificate")
        };
        assert!(
            matches!(errors[..], [CredentialError::Identity(_)]),
            "{errors:?}"
        );
    }
}
