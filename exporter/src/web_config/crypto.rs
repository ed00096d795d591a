//! `cipher_suites` and `curve_preferences`: Go's crypto/tls names, which is
//! what exporter-toolkit reads, mapped by their IANA code points onto what
//! this build's rustls provider (ring) implements. A name Go knows but rustls
//! does not offer is refused rather than dropped: a fleet's file that asks
//! for CurveP521 must not be served with some other curve in silence.

use rustls::crypto::{CryptoProvider, SupportedKxGroup};
use rustls::{SupportedCipherSuite, SupportedProtocolVersion};

use super::{field_err, FieldError};

/// Go's cipher suite names (`tls.CipherSuites()` and
/// `tls.InsecureCipherSuites()`) with their IANA code points. The insecure
/// ones are here only so that their refusal says why.
const GO_CIPHER_SUITES: [(&str, u16); 25] = [
    ("TLS_AES_128_GCM_SHA256", 0x1301),
    ("TLS_AES_256_GCM_SHA384", 0x1302),
    ("TLS_CHACHA20_POLY1305_SHA256", 0x1303),
    ("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", 0xc02b),
    ("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", 0xc02c),
    ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", 0xc02f),
    ("TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", 0xc030),
    ("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256", 0xcca8),
    ("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256", 0xcca9),
    ("TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA", 0xc009),
    ("TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA", 0xc00a),
    ("TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA", 0xc013),
    ("TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA", 0xc014),
    ("TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256", 0xc023),
    ("TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256", 0xc027),
    ("TLS_RSA_WITH_AES_128_GCM_SHA256", 0x009c),
    ("TLS_RSA_WITH_AES_256_GCM_SHA384", 0x009d),
    ("TLS_RSA_WITH_AES_128_CBC_SHA", 0x002f),
    ("TLS_RSA_WITH_AES_256_CBC_SHA", 0x0035),
    ("TLS_RSA_WITH_AES_128_CBC_SHA256", 0x003c),
    ("TLS_RSA_WITH_3DES_EDE_CBC_SHA", 0x000a),
    ("TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA", 0xc012),
    ("TLS_RSA_WITH_RC4_128_SHA", 0x0005),
    ("TLS_ECDHE_ECDSA_WITH_RC4_128_SHA", 0xc007),
    ("TLS_ECDHE_RSA_WITH_RC4_128_SHA", 0xc011),
];

/// Go's curve names (`tls.CurveID`) with their IANA named-group code points.
/// exporter-toolkit takes the first four; X25519MLKEM768 is accepted when
/// the provider offers it (ring does not).
const GO_CURVES: [(&str, u16); 5] = [
    ("X25519", 0x001d),
    ("CurveP256", 0x0017),
    ("CurveP384", 0x0018),
    ("CurveP521", 0x0019),
    ("X25519MLKEM768", 0x11ec),
];

fn suite_id(s: &SupportedCipherSuite) -> u16 {
    u16::from(s.suite())
}

fn group_id(g: &&'static dyn SupportedKxGroup) -> u16 {
    u16::from(g.name())
}

/// The Go names of what `offered` holds, in Go's table order.
fn accepted<T>(table: &[(&'static str, u16)], offered: &[T], id: fn(&T) -> u16) -> String {
    table
        .iter()
        .filter(|(_, code)| offered.iter().any(|o| id(o) == *code))
        .map(|(name, _)| *name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `base` narrowed to the file's `cipher_suites` and `curve_preferences`,
/// for a server speaking `versions`. Either list absent keeps the provider's
/// own; an empty one is refused, as it would leave no handshake possible.
pub(super) fn narrow(
    base: CryptoProvider,
    cipher_suites: Option<&[String]>,
    curve_preferences: Option<&[String]>,
    versions: &[&'static SupportedProtocolVersion],
) -> Result<CryptoProvider, FieldError> {
    let mut provider = base;
    if let Some(names) = cipher_suites {
        provider.cipher_suites = suites(&provider.cipher_suites, names, versions)?;
    }
    if let Some(names) = curve_preferences {
        provider.kx_groups = groups(&provider.kx_groups, names)?;
    }
    Ok(provider)
}

fn suites(
    offered: &[SupportedCipherSuite],
    names: &[String],
    versions: &[&'static SupportedProtocolVersion],
) -> Result<Vec<SupportedCipherSuite>, FieldError> {
    let ok = || accepted(&GO_CIPHER_SUITES, offered, suite_id);
    if names.is_empty() {
        return Err(field_err(
            "cipher_suites",
            format!(
                "is empty, which leaves no suite to agree on; remove it for the defaults or \
                 name suites from: {}",
                ok()
            ),
        ));
    }
    let (mut tls13, mut tls12) = (Vec::new(), Vec::new());
    for name in names {
        let Some(&(_, code)) = GO_CIPHER_SUITES.iter().find(|(n, _)| n == name) else {
            return Err(field_err(
                "cipher_suites",
                format!(
                    "unknown cipher suite {name:?}; write Go's names, one of: {}",
                    ok()
                ),
            ));
        };
        let Some(suite) = offered.iter().find(|s| suite_id(s) == code) else {
            return Err(field_err(
                "cipher_suites",
                format!(
                    "{name} is not offered: rustls implements only AEAD suites with ECDHE key \
                     exchange (no CBC, RSA key exchange, 3DES or RC4); use one of: {}",
                    ok()
                ),
            ));
        };
        let list = if suite.tls13().is_some() {
            &mut tls13
        } else {
            &mut tls12
        };
        if !list.iter().any(|s| suite_id(s) == code) {
            list.push(*suite);
        }
    }
    // Go's crypto/tls never lets cipher_suites choose TLS 1.3 suites, so a
    // node_exporter file listing TLS 1.2 suites still speaks TLS 1.3 with
    // all of them; naming TLS 1.3 suites here is honoured rather than
    // ignored.
    if tls13.is_empty() {
        tls13 = offered
            .iter()
            .filter(|s| s.tls13().is_some())
            .copied()
            .collect();
    }
    if tls12.is_empty() && versions.contains(&&rustls::version::TLS12) {
        return Err(field_err(
            "cipher_suites",
            format!(
                "names no TLS 1.2 suite, so a TLS 1.2 client would have none to agree on; add \
                 one of {}, or set min_version: TLS13",
                accepted(&GO_CIPHER_SUITES[3..9], offered, suite_id)
            ),
        ));
    }
    tls13.extend(tls12);
    Ok(tls13)
}

fn groups(
    offered: &[&'static dyn SupportedKxGroup],
    names: &[String],
) -> Result<Vec<&'static dyn SupportedKxGroup>, FieldError> {
    let ok = || accepted(&GO_CURVES, offered, group_id);
    if names.is_empty() {
        return Err(field_err(
            "curve_preferences",
            format!(
                "is empty, which leaves no key exchange; remove it for the defaults or name \
                 curves from: {}",
                ok()
            ),
        ));
    }
    let mut out: Vec<&'static dyn SupportedKxGroup> = Vec::new();
    for name in names {
        let Some(&(_, code)) = GO_CURVES.iter().find(|(n, _)| n == name) else {
            return Err(field_err(
                "curve_preferences",
                format!("unknown curve {name:?}; write Go's names, one of: {}", ok()),
            ));
        };
        let Some(group) = offered.iter().find(|g| group_id(g) == code) else {
            return Err(field_err(
                "curve_preferences",
                format!(
                    "{name} is not offered by this build's TLS library (rustls with ring); use \
                     one of: {}",
                    ok()
                ),
            ));
        };
        if !out.iter().any(|g| group_id(g) == code) {
            out.push(*group);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> CryptoProvider {
        rustls::crypto::ring::default_provider()
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    const BOTH: [&SupportedProtocolVersion; 2] = [&rustls::version::TLS13, &rustls::version::TLS12];

    /// rustls names its suites by their IANA names too (TLS13_ for the
    /// TLS 1.3 ones): the table's code points are checked against them, so
    /// a typo in a hex figure cannot map a name onto another suite.
    #[test]
    fn every_offered_suite_has_its_go_name() {
        for s in ring().cipher_suites {
            let code = suite_id(&s);
            let (go, _) = GO_CIPHER_SUITES
                .iter()
                .find(|(_, c)| *c == code)
                .unwrap_or_else(|| panic!("{:?} has no Go name", s.suite()));
            assert_eq!(
                format!("{:?}", s.suite()).replacen("TLS13_", "TLS_", 1),
                *go
            );
        }
        for g in ring().kx_groups {
            assert!(
                GO_CURVES.iter().any(|(_, c)| *c == group_id(&g)),
                "{:?} has no Go name",
                g.name()
            );
        }
    }

    #[test]
    fn suites_keep_their_order_and_tls13_its_defaults_when_unnamed() {
        let p = narrow(
            ring(),
            Some(&strings(&[
                "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
                "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
                "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
            ])),
            None,
            &BOTH,
        )
        .unwrap();
        let ids: Vec<u16> = p.cipher_suites.iter().map(suite_id).collect();
        assert_eq!(ids, [0x1302, 0x1301, 0x1303, 0xc030, 0xc02b]);
        assert_eq!(p.kx_groups.len(), ring().kx_groups.len());

        let p = narrow(
            ring(),
            Some(&strings(&["TLS_CHACHA20_POLY1305_SHA256"])),
            None,
            &[&rustls::version::TLS13],
        )
        .unwrap();
        assert_eq!(
            p.cipher_suites.iter().map(suite_id).collect::<Vec<_>>(),
            [0x1303]
        );
    }

    #[test]
    fn curves_map_onto_the_providers_groups_in_order() {
        let p = narrow(
            ring(),
            None,
            Some(&strings(&["CurveP384", "X25519"])),
            &BOTH,
        )
        .unwrap();
        let ids: Vec<u16> = p.kx_groups.iter().map(group_id).collect();
        assert_eq!(ids, [0x0018, 0x001d]);
    }

    #[test]
    fn what_rustls_does_not_offer_is_refused_naming_the_value_and_the_choice() {
        for (suites, curves, field, says) in [
            (
                Some(vec!["TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA"]),
                None,
                "cipher_suites",
                "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA is not offered",
            ),
            (
                Some(vec!["TLS_AES_128_GCM"]),
                None,
                "cipher_suites",
                "unknown cipher suite \"TLS_AES_128_GCM\"",
            ),
            (Some(vec![]), None, "cipher_suites", "is empty"),
            (
                Some(vec!["TLS_AES_128_GCM_SHA256"]),
                None,
                "cipher_suites",
                "min_version: TLS13",
            ),
            (
                None,
                Some(vec!["CurveP521"]),
                "curve_preferences",
                "CurveP521 is not offered",
            ),
            (
                None,
                Some(vec!["X25519MLKEM768"]),
                "curve_preferences",
                "X25519MLKEM768 is not offered",
            ),
            (
                None,
                Some(vec!["P256"]),
                "curve_preferences",
                "unknown curve \"P256\"",
            ),
            (None, Some(vec![]), "curve_preferences", "is empty"),
        ] {
            let (s, c) = (suites.map(|v| strings(&v)), curves.map(|v| strings(&v)));
            let (f, m) = narrow(ring(), s.as_deref(), c.as_deref(), &BOTH)
                .map(drop)
                .unwrap_err();
            assert_eq!(f, format!("tls_server_config.{field}"));
            assert!(m.contains(says), "{m}");
            let choice = if field == "cipher_suites" {
                "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"
            } else {
                "CurveP256, CurveP384"
            };
            assert!(m.contains(choice), "{m}");
        }
    }
}
