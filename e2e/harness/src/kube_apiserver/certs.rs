//! The key material a real API server needs, generated fresh per server: a CA, the serving
//! certificate (127.0.0.1, localhost, the in-cluster names), an admin client certificate in
//! `system:masters` (RBAC's superuser group) and the ServiceAccount token signing key.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// Paths of the files [`write`] created.
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub ca: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
    pub sa_private: PathBuf,
    pub sa_public: PathBuf,
}

fn named(common_name: &str, org: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    if let Some(org) = org {
        dn.push(DnType::OrganizationName, org);
    }
    dn
}

/// Writes every PEM file into `dir`.
pub fn write(dir: &Path) -> Result<CertFiles, super::KubeError> {
    let files = CertFiles {
        ca: dir.join("ca.crt"),
        serving_cert: dir.join("serving.crt"),
        serving_key: dir.join("serving.key"),
        admin_cert: dir.join("admin.crt"),
        admin_key: dir.join("admin.key"),
        sa_private: dir.join("sa.key"),
        sa_public: dir.join("sa.pub"),
    };
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.distinguished_name = named("epp-test-ca", None);
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
    let put = |path: &Path, text: String| {
        std::fs::write(path, text).map_err(|e| super::KubeError::io(path, e))
    };
    put(&files.ca, ca.pem())?;

    let names = [
        "127.0.0.1",
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
    ];
    let mut serving = CertificateParams::new(names.map(str::to_owned).to_vec())?;
    serving.distinguished_name = named("kube-apiserver", None);
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate()?;
    put(&files.serving_cert, serving.signed_by(&key, &ca)?.pem())?;
    put(&files.serving_key, key.serialize_pem())?;

    let mut admin = CertificateParams::new(Vec::<String>::new())?;
    admin.distinguished_name = named("epp-test-admin", Some("system:masters"));
    admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate()?;
    put(&files.admin_cert, admin.signed_by(&key, &ca)?.pem())?;
    put(&files.admin_key, key.serialize_pem())?;

    let sa = KeyPair::generate()?;
    put(&files.sa_private, sa.serialize_pem())?;
    put(&files.sa_public, sa.public_key_pem())?;
    Ok(files)
}
