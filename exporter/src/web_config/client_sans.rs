//! `client_allowed_sans`: a client certificate must carry one of the listed
//! names among its DNS, IP, email or URI subject alternative names, compared
//! exactly as exporter-toolkit compares them (IPs in their usual text form:
//! `10.0.0.1`, `2001:db8::1`).
//!
//! The check is a [`ClientCertVerifier`] wrapped around the one
//! `client_auth_type` chose, not a look at the peer's certificates after the
//! handshake: a refused client then never completes a handshake, and no path
//! that serves a TLS connection, present or future, can forget to look.
//! Resumed sessions are not verified again; each config (so each reload) has
//! its own session cache, so a session never outlives the list it was
//! checked against.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};
use x509_parser::extensions::GeneralName;

#[derive(Debug)]
pub(super) struct AllowedSans {
    inner: Arc<dyn ClientCertVerifier>,
    allowed: Vec<String>,
}

impl AllowedSans {
    /// `inner` must make client certificates mandatory: with an optional
    /// one there would be nothing to match (the caller refuses that).
    pub(super) fn new(inner: Arc<dyn ClientCertVerifier>, allowed: Vec<String>) -> AllowedSans {
        AllowedSans { inner, allowed }
    }
}

/// Why a client certificate was refused; shown in the exporter's debug log
/// of failed handshakes.
#[derive(Debug)]
struct Refused(String);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

fn refused(message: String) -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(Arc::new(
        Refused(message),
    ))))
}

/// The certificate's DNS, email, URI and IP subject alternative names, as
/// text.
pub(super) fn sans(der: &[u8]) -> Result<Vec<String>, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| format!("cannot read the client certificate: {e}"))?;
    let Some(ext) = cert
        .subject_alternative_name()
        .map_err(|e| format!("cannot read the client certificate's SANs: {e}"))?
    else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for name in &ext.value.general_names {
        match name {
            GeneralName::DNSName(s) | GeneralName::RFC822Name(s) | GeneralName::URI(s) => {
                out.push(s.to_string())
            }
            GeneralName::IPAddress(bytes) => out.push(ip_text(bytes)?),
            _ => {}
        }
    }
    Ok(out)
}

/// An IP SAN as Go's `net.IP.String()` writes it, an IPv4-mapped IPv6
/// address as IPv4 included, so that a list written for exporter-toolkit
/// matches the same certificates here.
fn ip_text(bytes: &[u8]) -> Result<String, String> {
    let ip = match bytes.len() {
        4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(bytes).expect("4 bytes"))),
        16 => {
            let v6 = Ipv6Addr::from(<[u8; 16]>::try_from(bytes).expect("16 bytes"));
            v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
        }
        n => return Err(format!("the client certificate has an IP SAN of {n} bytes")),
    };
    Ok(ip.to_string())
}

impl ClientCertVerifier for AllowedSans {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let found = sans(end_entity).map_err(refused)?;
        if found.iter().any(|s| self.allowed.contains(s)) {
            return Ok(verified);
        }
        Err(refused(format!(
            "the client certificate's SANs {found:?} include none of client_allowed_sans {:?}",
            self.allowed
        )))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }

    fn requires_raw_public_keys(&self) -> bool {
        self.inner.requires_raw_public_keys()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, KeyPair, SanType};

    fn cert(sans: Vec<SanType>) -> CertificateDer<'static> {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.subject_alt_names = sans;
        p.self_signed(&KeyPair::generate().unwrap())
            .unwrap()
            .der()
            .clone()
    }

    #[test]
    fn every_kind_of_san_is_read_as_go_writes_it() {
        let c = cert(vec![
            SanType::DnsName("prometheus.example".try_into().unwrap()),
            SanType::Rfc822Name("sre@example.org".try_into().unwrap()),
            SanType::URI("spiffe://example.org/prometheus".try_into().unwrap()),
            SanType::IpAddress("10.0.0.7".parse().unwrap()),
            SanType::IpAddress("2001:db8::1".parse().unwrap()),
            SanType::IpAddress("::ffff:192.0.2.1".parse().unwrap()),
        ]);
        assert_eq!(
            sans(&c).unwrap(),
            [
                "prometheus.example",
                "sre@example.org",
                "spiffe://example.org/prometheus",
                "10.0.0.7",
                "2001:db8::1",
                "192.0.2.1",
            ]
        );
        assert!(sans(&cert(Vec::new())).unwrap().is_empty());
        assert!(sans(b"not DER").is_err());
    }

    #[test]
    fn only_a_listed_san_is_let_through() {
        let v = AllowedSans::new(
            // Trusts every certificate: what is tested is the SAN check alone.
            Arc::new(crate::web_config::AnyClientCert {
                mandatory: true,
                provider: Arc::new(crate::web_config::provider()),
            }),
            vec!["10.0.0.7".into(), "spiffe://example.org/prometheus".into()],
        );
        let check = |sans: Vec<SanType>| {
            v.verify_client_cert(&cert(sans), &[], UnixTime::now())
                .map(drop)
        };
        assert!(check(vec![SanType::IpAddress("10.0.0.7".parse().unwrap())]).is_ok());
        assert!(check(vec![
            SanType::DnsName("other.example".try_into().unwrap()),
            SanType::URI("spiffe://example.org/prometheus".try_into().unwrap()),
        ])
        .is_ok());
        let e = check(vec![SanType::DnsName(
            "10.0.0.7.example".try_into().unwrap(),
        )])
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("10.0.0.7.example") && e.contains("client_allowed_sans"),
            "{e}"
        );
        // Case and prefixes count, as in exporter-toolkit.
        assert!(check(vec![SanType::URI(
            "SPIFFE://example.org/prometheus".try_into().unwrap()
        )])
        .is_err());
        assert!(check(Vec::new()).is_err());
    }
}
