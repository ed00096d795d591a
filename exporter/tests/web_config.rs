//! `--web.config.file`: the real binary with TLS and basic auth, its
//! certificates made here with rcgen, scraped with curl (the TLS client an
//! operator reaches for, and a second implementation to test rustls against).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::ca::Ca;
use common::*;
use prjquota_core::record::State;
use prjquota_vmtests::prom::{command_of, run_to_refusal, Exporter};

const A: &str = "aaaaaaaa-3333-4000-8000-000000000001";

/// What curl saw: the status (0 when there was no HTTP answer), the
/// WWW-Authenticate header, the body, curl's error text.
#[derive(Debug)]
struct Seen {
    status: u16,
    www_authenticate: String,
    body: String,
    /// curl's error text: read in assertion messages (Debug) only.
    #[allow(dead_code)]
    err: String,
}

#[derive(Default, Clone)]
struct Client {
    ca: Option<PathBuf>,
    cert: Option<(PathBuf, PathBuf)>,
    user: Option<String>,
}

impl Client {
    fn get(&self, url: &str) -> Seen {
        let mut cmd = Command::new("curl");
        cmd.args([
            "-sS",
            "--max-time",
            "30",
            "-w",
            "\n%{http_code} %header{www-authenticate}",
        ]);
        if let Some(ca) = &self.ca {
            cmd.arg("--cacert").arg(ca);
        }
        if let Some((c, k)) = &self.cert {
            cmd.arg("--cert").arg(c).arg("--key").arg(k);
        }
        if let Some(u) = &self.user {
            cmd.args(["-u", u]);
        }
        let out = cmd.arg(url).output().expect("run curl");
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, tail) = stdout.rsplit_once('\n').unwrap_or(("", &stdout));
        let (code, www) = tail.split_once(' ').unwrap_or((tail, ""));
        Seen {
            status: code.trim().parse().unwrap_or(0),
            www_authenticate: www.trim().to_string(),
            body: body.to_string(),
            err: String::from_utf8_lossy(&out.stderr).to_string(),
        }
    }
}

fn https(r: &Exporter, path: &str) -> String {
    format!("https://localhost:{}{path}", r.addr.port())
}

fn http(r: &Exporter, path: &str) -> String {
    format!("http://127.0.0.1:{}{path}", r.addr.port())
}

/// Polls /healthz (open without credentials) until 200.
fn wait_ready(c: &Client, url: &str) {
    let started = Instant::now();
    loop {
        let s = c.get(url);
        if s.status == 200 {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not ready after 60s: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn volumes_dir(tag: &str) -> TempDir {
    let dir = fresh_dir(&std::env::temp_dir(), tag);
    add_volume(&dir, record(A, "default", 4545, State::Ready));
    dir
}

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_prjquota-exporter"))
}

/// The exporter's command line with `web_config`, no eBPF and no guard.
fn command(dir: &Path, web_config: &Path) -> Command {
    let cfg = web_config.to_str().expect("a UTF-8 path");
    command_of(
        exe(),
        &[dir],
        &["--ebpf=off", "--guard=off", "--web.config.file", cfg],
        false,
    )
}

/// Started and ready (its `ready:` log line: /healthz may need TLS).
fn start(dir: &Path, web_config: &Path) -> Exporter {
    Exporter::start_command_logged(command(dir, web_config))
}

fn write_config(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("web.yml");
    // Replaced by rename, as a config manager would: a reload never reads
    // half a file.
    let tmp = dir.join(".web.yml.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &p).unwrap();
    p
}

/// A TLS-only exporter on `dir`, ready: its config is a server
/// certificate from a new CA, then `more` (further YAML, e.g. `  min_version:
/// TLS13\n` or a `basic_auth_users` section). Returns the CA, the exporter
/// and a client that trusts the CA.
fn tls_exporter(dir: &Path, more: &str) -> (Ca, Exporter, Client) {
    let ca = Ca::new(dir, "server");
    let (cert, key) = ca.leaf(dir, "server", true);
    let cfg = write_config(
        dir,
        &format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n{more}",
            cert.display(),
            key.display()
        ),
    );
    let r = start(dir, &cfg);
    let c = Client {
        ca: Some(ca.cert.clone()),
        ..Client::default()
    };
    wait_ready(&c, &https(&r, "/healthz"));
    (ca, r, c)
}

/// curl's HTTP status for /healthz over TLS with `extra` options (`000`
/// when no HTTP answer came), and its whole output.
fn healthz_with(ca: &Ca, r: &Exporter, extra: &[&str]) -> (String, std::process::Output) {
    let out = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}"])
        .args(extra)
        .arg("--cacert")
        .arg(&ca.cert)
        .arg(https(r, "/healthz"))
        .output()
        .expect("run curl");
    (String::from_utf8_lossy(&out.stdout).into_owned(), out)
}

/// The certificates of the client-certificate tests, under `dir`: the
/// server's (`server.pem`, `server.key`) from the server CA, a client CA
/// (`client-ca.pem`) with the certificate it issued to Prometheus, and a
/// stranger's from a CA the server does not know. Returns the server CA and
/// the (certificate, key) of Prometheus and of the stranger.
fn client_cert_pki(dir: &Path) -> (Ca, (PathBuf, PathBuf), (PathBuf, PathBuf)) {
    let server_ca = Ca::new(dir, "server");
    let client_ca = Ca::new(dir, "client");
    let other_ca = Ca::new(dir, "other");
    server_ca.leaf(dir, "server", true);
    let good = client_ca.leaf(dir, "prometheus", false);
    let stranger = other_ca.leaf(dir, "stranger", false);
    (server_ca, good, stranger)
}

fn has_volume(body: &str) -> bool {
    body.contains(&format!(
        "nomad_host_volume_info{{namespace=\"default\",node_pool=\"default\",volume_id=\"{A}\""
    ))
}

#[test]
fn tls_serves_https_and_no_plain_http() {
    let dir = volumes_dir("tls");
    let (ca, r, c) = tls_exporter(&dir, "");
    let s = c.get(&https(&r, "/metrics"));
    assert_eq!(s.status, 200, "{s:?}");
    assert!(has_volume(&s.body), "{}", s.body);
    assert!(
        s.body
            .contains("prjquota_exporter_web_config_last_reload_successful 1"),
        "{}",
        s.body
    );

    // Plain HTTP on the same port gets no HTTP answer at all.
    let plain = Client::default().get(&http(&r, "/metrics"));
    assert_eq!(plain.status, 0, "plain HTTP answered: {plain:?}");
    // Nor does a client that does not trust the certificate.
    let untrusted = Client::default().get(&https(&r, "/metrics"));
    assert_eq!(untrusted.status, 0, "{untrusted:?}");
    // TLS 1.2 and 1.3 both work by default.
    for v in ["--tls-max 1.2", "--tlsv1.3"] {
        let (code, out) = healthz_with(&ca, &r, &v.split(' ').collect::<Vec<_>>());
        assert_eq!(code, "200", "{v}: {out:?}");
    }
    r.stop();
}

#[test]
fn min_version_tls13_refuses_tls12() {
    let dir = volumes_dir("tls13");
    let (ca, r, _) = tls_exporter(&dir, "  min_version: TLS13\n");
    let (code, out) = healthz_with(&ca, &r, &["--tls-max", "1.2"]);
    assert_eq!(code, "000", "{out:?}");
    r.stop();
}

#[test]
fn mtls_refuses_clients_without_a_certificate_from_the_client_ca() {
    let dir = volumes_dir("mtls");
    let (server_ca, good, stranger) = client_cert_pki(&dir);
    // Relative paths are relative to the file, as in exporter-toolkit.
    let cfg = write_config(
        &dir,
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  \
         client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: client-ca.pem\n",
    );
    let r = start(&dir, &cfg);
    let with_cert = Client {
        ca: Some(server_ca.cert.clone()),
        cert: Some(good),
        ..Client::default()
    };
    wait_ready(&with_cert, &https(&r, "/healthz"));
    let s = with_cert.get(&https(&r, "/metrics"));
    assert_eq!(s.status, 200, "{s:?}");
    assert!(has_volume(&s.body));

    let without = Client {
        ca: Some(server_ca.cert.clone()),
        ..Client::default()
    };
    let s = without.get(&https(&r, "/metrics"));
    assert_eq!(s.status, 0, "served without a client certificate: {s:?}");
    let s = Client {
        cert: Some(stranger),
        ..without.clone()
    }
    .get(&https(&r, "/metrics"));
    assert_eq!(s.status, 0, "served a certificate of another CA: {s:?}");
    let log = r.stop();
    assert!(log.contains("tls=true"), "{log}");
}

/// A fleet's node_exporter TLS settings, all three at once: only a client
/// certificate carrying an allowed SAN is served (another from the same CA
/// is refused), and only the named TLS 1.2 and 1.3 suites and the named
/// curve are agreed on. curl (OpenSSL) is the client, so the names are
/// checked against a second TLS implementation.
#[test]
fn client_allowed_sans_cipher_suites_and_curves_are_kept() {
    let dir = volumes_dir("fleet");
    let server_ca = Ca::new(&dir, "server");
    let client_ca = Ca::new(&dir, "client");
    server_ca.leaf(&dir, "server", true);
    let allowed = client_ca.leaf_with_sans(
        &dir,
        "prometheus",
        &["prometheus.example", "10.0.0.7"],
        false,
    );
    let other = client_ca.leaf_with_sans(&dir, "grafana", &["grafana.example"], false);
    let cfg = write_config(
        &dir,
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  \
         client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: client-ca.pem\n  \
         client_allowed_sans: [10.0.0.7, spiffe://example.org/prometheus]\n  \
         cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, TLS_AES_256_GCM_SHA384]\n  \
         curve_preferences: [CurveP384]\n",
    );
    let r = start(&dir, &cfg);
    let served = Client {
        ca: Some(server_ca.cert.clone()),
        cert: Some(allowed.clone()),
        ..Client::default()
    };
    wait_ready(&served, &https(&r, "/healthz"));
    let s = served.get(&https(&r, "/metrics"));
    assert_eq!(s.status, 200, "{s:?}");
    assert!(has_volume(&s.body));

    let s = Client {
        cert: Some(other.clone()),
        ..served.clone()
    }
    .get(&https(&r, "/metrics"));
    assert_eq!(
        s.status, 0,
        "served a certificate without an allowed SAN: {s:?}"
    );
    assert!(!has_volume(&s.body));
    let s = Client {
        cert: None,
        ..served.clone()
    }
    .get(&https(&r, "/metrics"));
    assert_eq!(s.status, 0, "served without a client certificate: {s:?}");

    let (cert, key) = (allowed.0.to_str().unwrap(), allowed.1.to_str().unwrap());
    for (options, want) in [
        (
            "--tls-max 1.2 --ciphers ECDHE-ECDSA-AES256-GCM-SHA384",
            "200",
        ),
        (
            "--tls-max 1.2 --ciphers ECDHE-ECDSA-AES128-GCM-SHA256",
            "000",
        ),
        ("--tlsv1.3 --tls13-ciphers TLS_AES_256_GCM_SHA384", "200"),
        ("--tlsv1.3 --tls13-ciphers TLS_AES_128_GCM_SHA256", "000"),
        ("--curves P-384", "200"),
        ("--curves X25519:P-256", "000"),
    ] {
        let mut args = vec!["--cert", cert, "--key", key];
        args.extend(options.split(' '));
        let (code, out) = healthz_with(&server_ca, &r, &args);
        assert_eq!(code, want, "{options}: {out:?}");
    }
    r.stop();
}

#[test]
fn basic_auth_answers_401_with_a_challenge_and_200_to_a_user() {
    let dir = volumes_dir("basic");
    let hash = bcrypt::hash("s3cret", 10).unwrap();
    // /healthz needs no credentials (health checkers carry none): the
    // anonymous client sees it ready.
    let (_, r, anon) = tls_exporter(
        &dir,
        &format!("basic_auth_users:\n  prometheus: '{hash}'\n"),
    );
    for (who, user) in [
        ("no credentials", None),
        ("a wrong password", Some("prometheus:wrong")),
        ("an unknown user", Some("mallory:s3cret")),
    ] {
        for path in ["/metrics", "/"] {
            let s = Client {
                user: user.map(str::to_string),
                ..anon.clone()
            }
            .get(&https(&r, path));
            assert_eq!(s.status, 401, "{who} on {path}: {s:?}");
            assert_eq!(s.www_authenticate, "Basic", "{who}: {s:?}");
            assert!(!has_volume(&s.body));
        }
    }
    let user = Client {
        user: Some("prometheus:s3cret".into()),
        ..anon.clone()
    };
    let s = user.get(&https(&r, "/metrics"));
    assert_eq!(s.status, 200, "{s:?}");
    assert!(has_volume(&s.body));
    assert_eq!(user.get(&https(&r, "/")).status, 200);
    let log = r.stop();
    assert!(log.contains("basic_auth=true"), "{log}");
}

/// bcrypt at cost 13 takes half a second or more here: four wrong
/// passwords in flight hold the bcrypt slot (one at a time) for seconds, and
/// a user whose password verified before must be served before even the
/// first of them is refused. Had bcrypt run on the async workers, both would
/// be busy verifying when the user arrives, and the user would wait for one.
/// Asserted as an order of events, not as a duration: the host is loaded.
#[test]
fn wrong_passwords_cost_bcrypt_without_holding_up_a_user() {
    let dir = volumes_dir("bcrypt");
    let started = Instant::now();
    let hash = bcrypt::hash("s3cret", 13).unwrap();
    let one_bcrypt = started.elapsed();
    let cfg = write_config(
        &dir,
        &format!("basic_auth_users:\n  prometheus: '{hash}'\n"),
    );
    let r = start(&dir, &cfg);
    let url = http(&r, "/metrics");
    wait_ready(&Client::default(), &http(&r, "/healthz"));
    let user = Client {
        user: Some("prometheus:s3cret".into()),
        ..Client::default()
    };
    // The first request verifies (one bcrypt), the next ones hit the cache.
    let t = Instant::now();
    assert_eq!(user.get(&url).status, 200);
    let first = t.elapsed();
    let t = Instant::now();
    assert_eq!(user.get(&url).status, 200);
    let cached = t.elapsed();

    let sent = Instant::now();
    let wrong: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || {
                let s = Client {
                    user: Some("prometheus:wrong".into()),
                    ..Client::default()
                }
                .get(&url);
                (s.status, Instant::now())
            })
        })
        .collect();
    // Let the four reach the server and queue for bcrypt.
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let s = user.get(&url);
    let user_done = Instant::now();
    let during = user_done - t;
    assert_eq!(s.status, 200, "{s:?}");
    assert!(has_volume(&s.body));
    let wrong: Vec<_> = wrong.into_iter().map(|h| h.join().unwrap()).collect();
    let first_refused = wrong.iter().map(|w| w.1).min().unwrap();
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1e3);
    eprintln!(
        "bcrypt cost 13: {} to hash in the test; a user's first scrape {}, cached {}, \
         during 4 wrong passwords {}; the wrong ones refused after {:?}",
        ms(one_bcrypt),
        ms(first),
        ms(cached),
        ms(during),
        wrong.iter().map(|w| ms(w.1 - sent)).collect::<Vec<_>>()
    );
    for (status, _) in &wrong {
        assert_eq!(*status, 401);
    }
    assert!(
        user_done < first_refused,
        "the user's scrape ended {} after the wrong passwords were sent, the first of them was \
         refused after {}: it waited for a bcrypt",
        ms(user_done - sent),
        ms(first_refused - sent)
    );
    r.stop();
}

#[test]
fn a_bad_web_config_stops_start_up_naming_the_file_and_the_field() {
    let dir = volumes_dir("bad");
    let cases = [
        (
            "tls_server_config:\n  cert_file: missing.pem\n  key_file: missing.key\n",
            "tls_server_config.cert_file",
        ),
        (
            "tls_server_config:\n  client_auth_typ: RequireAndVerifyClientCert\n",
            "client_auth_typ",
        ),
        (
            "basic_auth_users:\n  prometheus: hunter2\n",
            "basic_auth_users.prometheus",
        ),
        (
            "tls_server_config:\n  min_version: TLS10\n",
            "tls_server_config.min_version",
        ),
        (
            "http_server_config:\n  headers:\n    Server: nginx\n",
            "http_server_config.headers.Server",
        ),
    ];
    for (text, field) in cases {
        let cfg = write_config(&dir, text);
        let (status, log) = run_to_refusal(command(&dir, &cfg), &format!("web config {text:?}"));
        assert!(!status.success(), "started with {text:?}:\n{log}");
        assert!(log.contains(&cfg.display().to_string()), "{log}");
        assert!(log.contains(field), "no {field} in:\n{log}");
        assert!(!log.contains("starting prjquota-exporter"), "{log}");
    }
    // An unreadable file too.
    let missing = dir.join("nowhere.yml");
    let (status, log) = run_to_refusal(command(&dir, &missing), "a missing web config");
    assert!(!status.success(), "{log}");
    assert!(log.contains("nowhere.yml"), "{log}");
}

fn metric(body: &str, name: &str) -> f64 {
    value(body, &format!("{name} ")).unwrap_or_else(|| panic!("no {name} in:\n{body}"))
}

#[test]
fn sighup_keeps_the_old_config_on_a_bad_file_and_rotates_a_good_one() {
    let dir = volumes_dir("sighup");
    let ca1 = Ca::new(&dir, "first");
    let ca2 = Ca::new(&dir, "second");
    let (cert1, key1) = ca1.leaf(&dir, "server1", true);
    let (cert2, key2) = ca2.leaf(&dir, "server2", true);
    let hash = bcrypt::hash("s3cret", 4).unwrap();
    let good = |cert: &Path, key: &Path| {
        format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\nbasic_auth_users:\n  prometheus: '{hash}'\n",
            cert.display(),
            key.display()
        )
    };
    let cfg = write_config(&dir, &good(&cert1, &key1));
    let r = start(&dir, &cfg);
    let old = Client {
        ca: Some(ca1.cert.clone()),
        user: Some("prometheus:s3cret".into()),
        ..Client::default()
    };
    let new = Client {
        ca: Some(ca2.cert.clone()),
        ..old.clone()
    };
    wait_ready(&old, &https(&r, "/healthz"));
    let s = old.get(&https(&r, "/metrics"));
    assert_eq!(
        metric(
            &s.body,
            "prjquota_exporter_web_config_last_reload_successful"
        ),
        1.0
    );
    let loaded_at = metric(
        &s.body,
        "prjquota_exporter_web_config_last_reload_success_timestamp_seconds",
    );

    // A bad file: the old config stays, the metric and one log line say so.
    write_config(
        &dir,
        &format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n  cipher_suite: [oops]\n",
            cert2.display(),
            key2.display()
        ),
    );
    r.signal(nix::sys::signal::Signal::SIGHUP);
    let line = r.wait_for_line("web config reload failed", Duration::from_secs(30));
    assert!(line.contains(&cfg.display().to_string()), "{line}");
    assert!(line.contains("field=tls_server_config"), "{line}");
    assert!(line.contains("cipher_suite"), "{line}");
    let s = old.get(&https(&r, "/metrics"));
    assert_eq!(s.status, 200, "the old config no longer serves: {s:?}");
    assert_eq!(
        metric(
            &s.body,
            "prjquota_exporter_web_config_last_reload_successful"
        ),
        0.0
    );
    assert_eq!(
        metric(
            &s.body,
            "prjquota_exporter_web_config_last_reload_success_timestamp_seconds"
        ),
        loaded_at
    );
    assert_eq!(new.get(&https(&r, "/metrics")).status, 0);

    // A rotated certificate: new connections get it.
    std::thread::sleep(Duration::from_millis(20));
    write_config(&dir, &good(&cert2, &key2));
    r.signal(nix::sys::signal::Signal::SIGHUP);
    r.wait_for_line("web config reloaded", Duration::from_secs(30));
    let s = new.get(&https(&r, "/metrics"));
    assert_eq!(
        s.status, 200,
        "the rotated certificate is not served: {s:?}"
    );
    assert!(has_volume(&s.body));
    assert_eq!(
        metric(
            &s.body,
            "prjquota_exporter_web_config_last_reload_successful"
        ),
        1.0
    );
    assert!(
        metric(
            &s.body,
            "prjquota_exporter_web_config_last_reload_success_timestamp_seconds"
        ) > loaded_at
    );
    let s = old.get(&https(&r, "/metrics"));
    assert_eq!(s.status, 0, "the old certificate is still served: {s:?}");

    // Turning TLS off by a reload is refused: this listener stays TLS.
    write_config(
        &dir,
        &format!("basic_auth_users:\n  prometheus: '{hash}'\n"),
    );
    r.signal(nix::sys::signal::Signal::SIGHUP);
    let line = r.wait_for_line("turn TLS off", Duration::from_secs(30));
    assert!(line.contains("field=tls_server_config"), "{line}");
    assert_eq!(Client::default().get(&http(&r, "/metrics")).status, 0);
    assert_eq!(new.get(&https(&r, "/metrics")).status, 200);
    r.stop();
}

/// `systemctl reload` sends SIGHUP whatever the flags: without a web config
/// it must not take the signal's default action (exit, which systemd counts
/// as clean and does not restart).
#[test]
fn sighup_without_a_web_config_is_logged_not_fatal() {
    let dir = volumes_dir("hup-plain");
    let r = Exporter::start_command(command_of(
        exe(),
        &[&dir],
        &["--ebpf=off", "--guard=off"],
        false,
    ));
    wait_ready(&Client::default(), &http(&r, "/healthz"));
    r.signal(nix::sys::signal::Signal::SIGHUP);
    r.wait_for_line("nothing to reload", Duration::from_secs(30));
    let s = Client::default().get(&http(&r, "/metrics"));
    assert_eq!(s.status, 200, "{s:?}");
    assert!(
        !s.body.contains("prjquota_exporter_web_config_"),
        "reload metrics without a web config"
    );
    r.stop();
}

/// RequireAnyClientCert, as in Go: a certificate is required, and the client
/// must hold its key, but any issuer will do. VerifyClientCertIfGiven: none
/// is fine, a stranger's is not.
#[test]
fn require_any_and_verify_if_given_client_certificates() {
    let dir = volumes_dir("anycert");
    let (server_ca, good, stranger) = client_cert_pki(&dir);
    let anon = Client {
        ca: Some(server_ca.cert.clone()),
        ..Client::default()
    };
    let with = |cert: &(PathBuf, PathBuf)| Client {
        cert: Some(cert.clone()),
        ..anon.clone()
    };
    for (mode, none, theirs, ours) in [
        ("RequireAnyClientCert", 0, 200, 200),
        ("VerifyClientCertIfGiven", 200, 0, 200),
    ] {
        let ca_line = if mode == "VerifyClientCertIfGiven" {
            "  client_ca_file: client-ca.pem\n"
        } else {
            ""
        };
        let cfg = write_config(
            &dir,
            &format!(
                "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  \
                 client_auth_type: {mode}\n{ca_line}"
            ),
        );
        let r = start(&dir, &cfg);
        wait_ready(&with(&good), &https(&r, "/healthz"));
        let url = https(&r, "/metrics");
        assert_eq!(anon.get(&url).status, none, "{mode}, no certificate");
        assert_eq!(
            with(&stranger).get(&url).status,
            theirs,
            "{mode}, another CA's"
        );
        assert_eq!(
            with(&good).get(&url).status,
            ours,
            "{mode}, the client CA's"
        );
        r.stop();
    }
}

/// A SIGHUP while the exporter is still starting (here: making the unknown
/// users' dummy hash at cost 13, a second or so; on a node: loading eBPF)
/// neither kills it nor is lost: systemd would count that death as a clean
/// exit and never restart the exporter.
#[test]
fn a_sighup_during_start_up_does_not_kill_the_exporter() {
    use std::os::unix::process::ExitStatusExt;
    let dir = volumes_dir("early-hup");
    let hash = bcrypt::hash("s3cret", 13).unwrap();
    let cfg = write_config(
        &dir,
        &format!("basic_auth_users:\n  prometheus: '{hash}'\n"),
    );
    let log = dir.join("exporter.log");
    let mut child = command(&dir, &cfg)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start the exporter");
    std::thread::sleep(Duration::from_millis(100));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "the exporter died of an early SIGHUP: {status:?} (signal {:?})\n{}",
                status.signal(),
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("ready:") {
            break;
        }
        assert!(Instant::now() < deadline, "never ready:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The status line and headers of one answer (lower-cased names), from
/// curl's header dump.
fn answer_headers(url: &str, user: Option<&str>) -> (u16, Vec<String>) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "30", "-o", "/dev/null", "-D", "-"]);
    if let Some(u) = user {
        cmd.args(["-u", u]);
    }
    let out = cmd.arg(url).output().expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut lines = text.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .map(|l| match l.split_once(':') {
            Some((n, v)) => format!("{}: {}", n.to_ascii_lowercase(), v.trim()),
            None => l,
        })
        .collect();
    (status, headers)
}

/// `http_server_config.headers` is on every answer, refusals included (as
/// exporter-toolkit sets them before it checks credentials), and a SIGHUP
/// that changes them applies to the next answer; `http2: false` is
/// accepted (only HTTP/1.1 is served).
#[test]
fn configured_headers_are_on_every_answer_refusals_included() {
    let dir = volumes_dir("headers");
    let hash = bcrypt::hash("s3cret", 4).unwrap();
    let users = format!("basic_auth_users:\n  prometheus: '{hash}'\n");
    let cfg = write_config(
        &dir,
        &format!(
            "http_server_config:\n  http2: false\n  headers:\n    X-Frame-Options: deny\n    \
             Strict-Transport-Security: max-age=31536000; includeSubDomains\n    \
             X-Content-Type-Options: nosniff\n{users}"
        ),
    );
    let r = start(&dir, &cfg);
    let want = [
        "x-frame-options: deny",
        "strict-transport-security: max-age=31536000; includeSubDomains",
        "x-content-type-options: nosniff",
    ];
    for (user, path, status) in [
        (None, "/metrics", 401),
        (Some("prometheus:wrong"), "/", 401),
        (Some("prometheus:s3cret"), "/metrics", 200),
        (Some("prometheus:s3cret"), "/nowhere", 404),
        (None, "/healthz", 200),
    ] {
        let (got, headers) = answer_headers(&http(&r, path), user);
        assert_eq!(got, status, "{path} as {user:?}: {headers:?}");
        for h in want {
            assert!(
                headers.iter().any(|l| l == h),
                "{path} as {user:?} ({got}) lacks {h:?}: {headers:?}"
            );
        }
    }
    // A reload that drops two of them: the next answer has only the third.
    write_config(
        &dir,
        &format!("http_server_config:\n  headers:\n    X-Frame-Options: sameorigin\n{users}"),
    );
    r.signal(nix::sys::signal::Signal::SIGHUP);
    let started = Instant::now();
    loop {
        let (_, headers) = answer_headers(&http(&r, "/metrics"), None);
        if headers.iter().any(|l| l == "x-frame-options: sameorigin") {
            assert!(
                !headers
                    .iter()
                    .any(|l| l.starts_with("strict-transport-security")),
                "{headers:?}"
            );
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the reload never applied: {headers:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    r.stop();
}
