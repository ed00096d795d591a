//! `--web.config.file` against real Prometheus servers: Debian's Prometheus 2
//! and sid's Prometheus 3 (`PRJQUOTA_PROMETHEUS3`, set by `cargo xtask test`
//! when `cargo xtask deps` fetched it) scrape the exporter over TLS with basic
//! auth, as an operator configures them (`scheme: https`, `tls_config`,
//! `basic_auth`), and their API shows the volume's series. Two Go TLS and
//! HTTP client stacks against rustls and the exporter's basic auth.

use std::path::{Path, PathBuf};

use prjquota_vmtests::fixture::{Fixture, MIB};
use prjquota_vmtests::nomad::Spec;
use prjquota_vmtests::prom::{self, Exporter, Prometheus};
use prjquota_vmtests::xfs_mount;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A CA, and a server certificate for 127.0.0.1 it signed, in `dir`:
/// (CA cert, server cert, server key).
fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "prjquota VM test CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let mut leaf = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    leaf.distinguished_name
        .push(DnType::CommonName, "prjquota-exporter");
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    let cert = leaf.signed_by(&key, &ca).unwrap();
    let paths = (
        dir.join("ca.pem"),
        dir.join("exporter.pem"),
        dir.join("exporter.key"),
    );
    std::fs::write(&paths.0, ca.pem()).unwrap();
    std::fs::write(&paths.1, cert.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    (paths.0, paths.1, paths.2)
}

#[test]
fn prometheus_2_and_3_scrape_over_tls_with_basic_auth() {
    let f = Fixture::new(&xfs_mount(), "exp-tls");
    let spec = Spec::new("tls-vol", 8 * MIB as i64);
    f.create(&spec);

    let dir = f.node.plugin_dir.join("web");
    std::fs::create_dir_all(&dir).unwrap();
    let (ca, cert, key) = certificates(&dir);
    // Cost 4: the VM's CPU is emulated, and the cost is not what this tests.
    let hash = bcrypt::hash("scrape-secret", 4).unwrap();
    let web = dir.join("web.yml");
    std::fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\nbasic_auth_users:\n  prometheus: '{hash}'\n",
            cert.display(),
            key.display()
        ),
    )
    .unwrap();
    let password = dir.join("password");
    std::fs::write(&password, "scrape-secret").unwrap();
    let exp = Exporter::start_tls(
        &[&f.node.volumes_dir],
        &["--web.config.file", web.to_str().unwrap()],
    );

    let mut servers = vec![("prometheus 2".to_string(), PathBuf::from(prom::PROMETHEUS))];
    match prom::prometheus3() {
        Some(p) => servers.push(("prometheus 3".into(), p)),
        None => eprintln!(
            "PRJQUOTA_PROMETHEUS3 is not set (`cargo xtask deps` fetches Prometheus 3): \
             only Prometheus 2 is tested"
        ),
    }
    for (name, binary) in servers {
        let yaml = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
             scrape_configs:\n  - job_name: prjquota\n    scheme: https\n    \
             tls_config:\n      ca_file: {}\n    basic_auth:\n      username: prometheus\n      \
             password_file: {}\n    static_configs:\n      - targets: [\"{}\"]\n",
            ca.display(),
            password.display(),
            exp.addr
        );
        let p = Prometheus::start_config(&binary, &yaml, &[]);
        let r = p.query_until("nomad_host_volume_provisioned_bytes", |r| {
            !prom::vector(r).is_empty()
        });
        let got = prom::vector(&r);
        assert_eq!(got.len(), 1, "{name}: {r}");
        assert_eq!(got[0].0["volume_id"], spec.id, "{name}");
        assert_eq!(got[0].1, (8 * MIB) as f64, "{name}");
        let up = prom::vector(&p.query("up{job=\"prjquota\"}"));
        assert_eq!(up.len(), 1, "{name}: {up:?}");
        assert_eq!(up[0].1, 1.0, "{name}");
        let reload = prom::vector(&p.query("prjquota_exporter_web_config_last_reload_successful"));
        assert_eq!(reload.len(), 1, "{name}: {reload:?}");
        assert_eq!(reload[0].1, 1.0, "{name}");
        eprintln!("{name} scraped the exporter over TLS with basic auth");
    }
    let log = exp.log();
    assert!(
        log.contains("tls=true") && log.contains("basic_auth=true"),
        "{log}"
    );
}
