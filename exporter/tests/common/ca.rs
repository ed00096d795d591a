//! Certificates made in the test: a CA and what it signs (rcgen), for the
//! exporter's TLS server and its Nomad client.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A CA and the PEM files of what it signed, written under `dir`.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub cert: PathBuf,
}

impl Ca {
    pub fn new(dir: &Path, name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let cert = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&cert, issuer.pem()).unwrap();
        Ca { issuer, cert }
    }

    /// A leaf certificate and key: for the server (localhost, 127.0.0.1)
    /// or a client. Returns (cert, key) paths.
    pub fn leaf(&self, dir: &Path, name: &str, server: bool) -> (PathBuf, PathBuf) {
        let sans: &[&str] = if server {
            &["localhost", "127.0.0.1"]
        } else {
            &[]
        };
        self.leaf_with_sans(dir, name, sans, server)
    }

    /// As [`Ca::leaf`], with these subject alternative names (an IP
    /// address as text becomes an IP SAN, anything else a DNS name).
    pub fn leaf_with_sans(
        &self,
        dir: &Path,
        name: &str,
        sans: &[&str],
        server: bool,
    ) -> (PathBuf, PathBuf) {
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(sans).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (c, k) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }
}
