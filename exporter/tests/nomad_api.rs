//! The exporter's Nomad client against Nomad's API as documented: the
//! stand-in agent of `prjquota_vmtests::nomad_api` answers with documents
//! shaped as Nomad v2.0.5's `api` types (tests/fixtures/nomad-api-v2.0.5),
//! one contract test per endpoint; then Nomad refusing, failing, slow,
//! silent or gone; TLS as Nomad's agents serve it; no request on a
//! scrape's path; and the documented placement constraint evaluated as
//! Nomad's scheduler evaluates it.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::ca::Ca;
use common::*;
use prjquota_exporter::nomad::api::{
    Allocation, Endpoint, HostVolume, HostVolumeStub, NodeMetaResponse,
};
use prjquota_exporter::nomad::client::Failure;
use prjquota_exporter::nomad::disk_sizes::Sizes;
use prjquota_exporter::nomad::placement::META_KEY;
use prjquota_exporter::nomad::settings::{Flags, Settings};
use prjquota_exporter::nomad::{Client, Nomad, Setup, Status};
use prjquota_exporter::{Config, Exporter};
use prjquota_vmtests::nomad_api::{
    check_order, documented_constraints, feasible, fixture, is_dotted_identifier, Agent,
    Constraint, Mode,
};

fn settings(addr: &str, timeout: Duration) -> Settings {
    Settings::resolve(
        &Flags {
            addr: Some(addr.to_string()),
            timeout,
            ..Flags::default()
        },
        |_| None,
    )
    .unwrap()
}

fn client(agent: &Agent) -> Client {
    Client::new(
        settings(&agent.url(), Duration::from_secs(5)),
        Arc::new(Status::new()),
    )
    .unwrap()
}

/// A Nomad client that publishes the unprovisioned bytes of `volumes` and
/// reads the sizes `limits` wants.
fn nomad(
    agent: &Agent,
    volumes: &std::path::Path,
    plugin: &std::path::Path,
    token: Option<&str>,
) -> Arc<Nomad> {
    let mut s = settings(&agent.url(), Duration::from_secs(5));
    if let Some(t) = token {
        s = Settings::resolve(
            &Flags {
                addr: Some(agent.url()),
                timeout: Duration::from_secs(5),
                ..Flags::default()
            },
            |k| (k == "NOMAD_TOKEN").then(|| t.to_string()),
        )
        .unwrap();
    }
    Nomad::new(Setup {
        settings: s,
        interval: Duration::from_secs(10),
        publish_unprovisioned: Some(256 << 20),
        volumes_dir: volumes.to_path_buf(),
        plugin_dir: Some(plugin.to_path_buf()),
        mount_timeout: Duration::from_secs(5),
        disk_limits: None,
    })
    .unwrap()
}

// --- One contract test per endpoint -----------------------------------

/// `POST /v1/client/metadata`: the figure goes under a key Nomad takes (a
/// dotted HCL identifier in the `unique.` namespace) as a string of
/// digits, with the token in `X-Nomad-Token`; the answer
/// (`NodeMetaResponse`) is read back. Not again until it is due.
#[tokio::test]
async fn the_metadata_endpoint_gets_the_figure_as_nomad_validates_it() {
    let parsed: NodeMetaResponse = serde_json::from_value(fixture("node_meta_response")).unwrap();
    assert_eq!(parsed.meta.get("rack").map(String::as_str), Some("r1"));
    assert!(is_dotted_identifier(META_KEY) && META_KEY.starts_with("unique."));

    let agent = Agent::start("node-1");
    agent.state().token = Some("0b1e3c4d-aaaa-bbbb-cccc-123456789abc".into());
    let dir = fresh_dir(&std::env::temp_dir(), "nomad-meta");
    let volumes = dir.join("volumes");
    let plugin = dir.join("plugin");
    std::fs::create_dir_all(&volumes).unwrap();
    std::fs::create_dir_all(&plugin).unwrap();
    let n = nomad(
        &agent,
        &volumes,
        &plugin,
        Some("0b1e3c4d-aaaa-bbbb-cccc-123456789abc"),
    );
    let mut sizes = Sizes::default();
    n.round(&mut sizes).await.unwrap();
    let posts = agent.requests_to("/v1/client/metadata");
    assert_eq!(posts.len(), 1, "{posts:#?}");
    let p = &posts[0];
    assert_eq!(p.method, "POST");
    assert_eq!(
        p.header("X-Nomad-Token"),
        Some("0b1e3c4d-aaaa-bbbb-cccc-123456789abc")
    );
    assert_eq!(p.header("Content-Type"), Some("application/json"));
    let body: serde_json::Value = serde_json::from_str(&p.body).unwrap();
    assert_eq!(body["NodeID"], "", "the agent's own node");
    // The host's temp dir has no project quota: nothing can be admitted.
    assert_eq!(body["Meta"][META_KEY], "0", "{body}");
    assert_eq!(agent.meta(META_KEY).as_deref(), Some("0"));
    n.round(&mut sizes).await.unwrap();
    assert_eq!(
        agent.requests_to("/v1/client/metadata").len(),
        1,
        "published again though nothing moved"
    );
    let text = families_text(&n);
    assert!(
        text.contains(&format!(
            "prjquota_exporter_nomad_published_unprovisioned_bytes{{volumes_dir=\"{}\"}} 0\n",
            volumes.display()
        )),
        "{text}"
    );
    assert!(text.contains("prjquota_exporter_nomad_up 1\n"), "{text}");
    assert!(
        text.contains(
            "prjquota_exporter_nomad_requests_total{endpoint=\"client_metadata\",code=\"200\"} 1\n"
        ),
        "{text}"
    );
}

/// `GET /v1/allocation/<id>`: the size is `AllocatedResources.Shared.DiskMB`
/// in MiB (`Resources.DiskMB` on allocations older than 0.9), and an
/// allocation without one has no size to enforce.
#[tokio::test]
async fn the_allocation_endpoint_gives_the_reserved_disk_in_mib() {
    let a: Allocation = serde_json::from_value(fixture("allocation")).unwrap();
    assert_eq!(a.reserved_disk_bytes(), Ok(300 << 20));
    let mut old = fixture("allocation");
    old["AllocatedResources"] = serde_json::Value::Null;
    old["Resources"]["DiskMB"] = 150.into();
    let old: Allocation = serde_json::from_value(old).unwrap();
    assert_eq!(old.reserved_disk_bytes(), Ok(150 << 20));
    for broken in [
        {
            let mut v = fixture("allocation");
            v["AllocatedResources"] = serde_json::Value::Null;
            v["Resources"] = serde_json::Value::Null;
            v
        },
        {
            let mut v = fixture("allocation");
            v["AllocatedResources"]["Shared"]["DiskMB"] = 0.into();
            v
        },
    ] {
        let a: Allocation = serde_json::from_value(broken).unwrap();
        assert!(a.reserved_disk_bytes().is_err());
    }
    // A document without the field read is an error, not a zero.
    let mut missing = fixture("allocation");
    missing["AllocatedResources"]["Shared"]
        .as_object_mut()
        .unwrap()
        .remove("DiskMB");
    assert!(serde_json::from_value::<Allocation>(missing).is_err());

    let agent = Agent::start("node-1");
    let id = "8f3e9d2c-4b1a-4c6e-9a7d-2e5b6c1f0a93";
    agent.add_allocation(id, "prod", 2048);
    let c = client(&agent);
    let got = c
        .get(
            Endpoint::Allocation,
            &format!("/v1/allocation/{id}"),
            &[200, 404],
        )
        .await
        .unwrap();
    let a: Allocation = got.json().unwrap();
    assert_eq!((a.id.as_str(), a.namespace.as_str()), (id, "prod"));
    assert_eq!(a.reserved_disk_bytes(), Ok(2 << 30));
    let gone = c
        .get(
            Endpoint::Allocation,
            "/v1/allocation/0a3e9d2c-4b1a-4c6e-9a7d-2e5b6c1f0a93",
            &[200, 404],
        )
        .await
        .unwrap();
    assert_eq!(
        (gone.status, &gone.body[..]),
        (404, &b"alloc not found"[..])
    );
}

/// `GET /v1/volumes?type=host`: a list of `HostVolumeStub`s, paged by
/// `X-Nomad-NextToken`.
#[tokio::test]
async fn the_volumes_endpoint_lists_stubs_page_by_page() {
    let stub: HostVolumeStub = serde_json::from_value(fixture("host_volume_stub")).unwrap();
    assert_eq!(stub.id, "c0ffee00-1234-4abc-8def-0123456789ab");
    let agent = Agent::start("node-1");
    agent.state().page_size = Some(1);
    agent.add_volume("c0ffee00-0000-4abc-8def-000000000001", "default", "node-1");
    agent.add_volume("c0ffee00-0000-4abc-8def-000000000002", "prod", "node-1");
    let c = client(&agent);
    let first = c
        .get(
            Endpoint::Volumes,
            "/v1/volumes?type=host&namespace=*&node_id=node-1",
            &[200],
        )
        .await
        .unwrap();
    let page: Vec<HostVolumeStub> = first.json().unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(
        first.next_token.as_deref(),
        Some("c0ffee00-0000-4abc-8def-000000000002")
    );
}

/// `GET /v1/volume/host/<id>?namespace=<ns>`: a `HostVolume`, or 404.
#[tokio::test]
async fn the_volume_endpoint_answers_the_volume_or_404() {
    let hv: HostVolume = serde_json::from_value(fixture("host_volume")).unwrap();
    assert_eq!(hv.namespace, "default");
    let agent = Agent::start("node-1");
    let id = "c0ffee00-0000-4abc-8def-000000000001";
    agent.add_volume(id, "prod", "node-1");
    let c = client(&agent);
    let found = c
        .get(
            Endpoint::Volume,
            &format!("/v1/volume/host/{id}?namespace=prod"),
            &[200, 404],
        )
        .await
        .unwrap();
    let hv: HostVolume = found.json().unwrap();
    assert_eq!((hv.id.as_str(), hv.node_id.as_str()), (id, "node-1"));
    let other_ns = c
        .get(
            Endpoint::Volume,
            &format!("/v1/volume/host/{id}?namespace=default"),
            &[200, 404],
        )
        .await
        .unwrap();
    assert_eq!(other_ns.status, 404);
}

// --- Nomad refusing, failing, slow, silent, gone ----------------------

/// Each way Nomad can fail a request is a failure of its own kind, counted
/// by outcome, and `nomad_up` says so until an answer comes again; a slow
/// answer within the timeout is an answer. No request outlives the
/// timeout.
#[tokio::test]
async fn refusals_errors_silence_and_absence_are_each_told_apart() {
    let agent = Agent::start("node-1");
    let path = "/v1/allocation/8f3e9d2c-4b1a-4c6e-9a7d-2e5b6c1f0a93";
    let timeout = Duration::from_millis(500);
    let c = Client::new(settings(&agent.url(), timeout), Arc::new(Status::new())).unwrap();
    for (mode, code) in [
        (Mode::Status(403, "Permission denied".into()), "403"),
        (
            Mode::Status(500, "rpc error: No cluster leader".into()),
            "500",
        ),
        (Mode::Slow(Duration::from_millis(1500)), "timeout"),
        (Mode::Hang, "timeout"),
        (Mode::HangUp, "protocol"),
    ] {
        agent.set_mode(mode.clone());
        let start = Instant::now();
        let e = c
            .get(Endpoint::Allocation, path, &[200, 404])
            .await
            .unwrap_err();
        assert!(
            start.elapsed() < timeout + Duration::from_millis(400),
            "{mode:?} took {:?}",
            start.elapsed()
        );
        assert_eq!(e.code(), code, "{mode:?}: {e}");
        assert_eq!(c.status.up(), Some(false), "{mode:?}");
        if code == "403" {
            assert!(matches!(e, Failure::Refused { .. }), "{e:?}");
            assert!(e.to_string().contains("Permission denied"), "{e}");
        }
    }
    // Slow but within the timeout: answered.
    agent.set_mode(Mode::Slow(Duration::from_millis(100)));
    let a = c
        .get(Endpoint::Allocation, path, &[200, 404])
        .await
        .unwrap();
    assert_eq!(a.status, 404);
    assert_eq!(c.status.up(), Some(true));
    let text = encode(c.status.families());
    for code in ["403", "500", "timeout", "protocol", "404"] {
        assert!(
            text.contains(&format!(
                "prjquota_exporter_nomad_requests_total{{endpoint=\"allocation\",code=\"{code}\"}}"
            )),
            "{code}: {text}"
        );
    }
    // Nobody listening any more.
    let addr = agent.url();
    drop(agent);
    let gone = Client::new(settings(&addr, timeout), Arc::new(Status::new())).unwrap();
    let e = gone
        .get(Endpoint::Allocation, path, &[200])
        .await
        .unwrap_err();
    assert_eq!(e.code(), "unreachable", "{e}");
}

/// Nomad away changes nothing the client published: the figure and the
/// sizes stay, and the next round waits for Nomad, not for a change.
#[tokio::test]
async fn nomad_away_leaves_what_was_published() {
    let agent = Agent::start("node-1");
    let dir = fresh_dir(&std::env::temp_dir(), "nomad-away");
    let (volumes, plugin) = (dir.join("v"), dir.join("p"));
    std::fs::create_dir_all(&volumes).unwrap();
    std::fs::create_dir_all(&plugin).unwrap();
    let n = nomad(&agent, &volumes, &plugin, None);
    let mut sizes = Sizes::default();
    n.round(&mut sizes).await.unwrap();
    agent.set_mode(Mode::Status(500, "rpc error: No cluster leader".into()));
    // Due again (a volume's size is now promised): the publish fails.
    add_volume(
        &volumes,
        record(
            "aaaaaaaa-1111-4000-8000-000000000009",
            "default",
            4242,
            prjquota_core::record::State::Ready,
        ),
    );
    assert!(n.round(&mut sizes).await.is_err());
    assert_eq!(
        agent.meta(META_KEY).as_deref(),
        Some("0"),
        "the agent's figure changed"
    );
    let text = families_text(&n);
    assert!(text.contains("prjquota_exporter_nomad_up 0\n"), "{text}");
    assert!(
        text.contains("prjquota_exporter_nomad_published_unprovisioned_bytes{"),
        "{text}"
    );
}

// --- TLS, as Nomad's agents serve it ----------------------------------

/// A TLS front for `agent` with `cert`/`key`, asking for a client
/// certificate signed by `client_ca` when given.
async fn tls_front(
    agent: &Agent,
    cert: &std::path::Path,
    key: &std::path::Path,
    client_ca: Option<&std::path::Path>,
) -> std::net::SocketAddr {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let config = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca).unwrap() {
                roots.add(c.unwrap()).unwrap();
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
    }
    .with_single_cert(chain, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let backend = agent.addr;
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(s).await else {
                    return;
                };
                let Ok(mut plain) = tokio::net::TcpStream::connect(backend).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    addr
}

fn tls_client(
    addr: std::net::SocketAddr,
    ca: &std::path::Path,
    client: Option<(&std::path::Path, &std::path::Path)>,
    server_name: Option<&str>,
) -> Result<Client, String> {
    let vars: BTreeMap<&str, String> = [
        ("NOMAD_ADDR", format!("https://{addr}")),
        ("NOMAD_CACERT", ca.display().to_string()),
    ]
    .into_iter()
    .chain(client.map(|(c, _)| ("NOMAD_CLIENT_CERT", c.display().to_string())))
    .chain(client.map(|(_, k)| ("NOMAD_CLIENT_KEY", k.display().to_string())))
    .chain(server_name.map(|n| ("NOMAD_TLS_SERVER_NAME", n.to_string())))
    .collect();
    let s = Settings::resolve(
        &Flags {
            timeout: Duration::from_secs(5),
            ..Flags::default()
        },
        |k| vars.get(k).cloned(),
    )?;
    Client::new(s, Arc::new(Status::new()))
}

/// Nomad's `tls { http = true, verify_https_client = true }`: the agent's
/// certificate checked against `NOMAD_CACERT` for the name
/// `NOMAD_TLS_SERVER_NAME` gives (Nomad's certificates name
/// `client.<region>.nomad`), and the client's own certificate shown.
#[tokio::test]
async fn tls_is_verified_as_the_nomad_cli_verifies_it() {
    let agent = Agent::start("node-1");
    let dir = fresh_dir(&std::env::temp_dir(), "nomad-tls");
    let ca = Ca::new(&dir, "nomad");
    let (cert, key) = ca.leaf_with_sans(
        &dir,
        "client.global.nomad",
        &["client.global.nomad", "localhost"],
        true,
    );
    let clients = Ca::new(&dir, "clients");
    let (ccert, ckey) = clients.leaf(&dir, "prjquota-exporter", false);
    let stranger = Ca::new(&dir, "stranger");
    let path = "/v1/allocation/8f3e9d2c-4b1a-4c6e-9a7d-2e5b6c1f0a93";

    let front = tls_front(&agent, &cert, &key, Some(&clients.cert)).await;
    let ok = tls_client(
        front,
        &ca.cert,
        Some((&ccert, &ckey)),
        Some("client.global.nomad"),
    )
    .unwrap();
    assert_eq!(
        ok.get(Endpoint::Allocation, path, &[200, 404])
            .await
            .unwrap()
            .status,
        404
    );
    // The certificate names no IP address: by address alone it fails.
    let by_ip = tls_client(front, &ca.cert, Some((&ccert, &ckey)), None).unwrap();
    let e = by_ip
        .get(Endpoint::Allocation, path, &[200, 404])
        .await
        .unwrap_err();
    assert_eq!(e.code(), "tls", "{e}");
    // Another CA: refused.
    let wrong_ca = tls_client(
        front,
        &stranger.cert,
        Some((&ccert, &ckey)),
        Some("client.global.nomad"),
    )
    .unwrap();
    let e = wrong_ca
        .get(Endpoint::Allocation, path, &[200, 404])
        .await
        .unwrap_err();
    assert_eq!(e.code(), "tls", "{e}");
    // No client certificate where the agent wants one: no answer.
    let anonymous = tls_client(front, &ca.cert, None, Some("client.global.nomad")).unwrap();
    assert!(anonymous
        .get(Endpoint::Allocation, path, &[200, 404])
        .await
        .is_err());
    // A client key that is not the certificate's is refused at start-up.
    let (_, other_key) = clients.leaf(&dir, "other", false);
    let e = tls_client(front, &ca.cert, Some((&ccert, &other_key)), None)
        .err()
        .unwrap();
    assert!(e.contains("do not go together"), "{e}");
    let e = tls_client(front, &dir.join("missing.pem"), None, None)
        .err()
        .unwrap();
    assert!(
        e.contains("NOMAD_CACERT") && e.contains("does not exist"),
        "{e}"
    );
}

// --- Never on the scrape's path ---------------------------------------

/// A scrape reads what the client's task learned and asks Nomad nothing:
/// with Nomad hanging, scrapes are as quick as ever and the agent sees no
/// request.
#[tokio::test]
async fn a_scrape_makes_no_request_to_nomad() {
    let agent = Agent::start("node-1");
    agent.set_mode(Mode::Hang);
    let dir = fresh_dir(&std::env::temp_dir(), "nomad-scrape");
    let (volumes, plugin) = (dir.join("v"), dir.join("p"));
    std::fs::create_dir_all(&volumes).unwrap();
    std::fs::create_dir_all(&plugin).unwrap();
    let n = nomad(&agent, &volumes, &plugin, None);
    let exporter = Exporter::new(&Config {
        nomad: Some(n),
        ..host_config(&volumes)
    });
    for _ in 0..5 {
        let start = Instant::now();
        let text = exporter.scrape().await.to_text();
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "a scrape took {:?}",
            start.elapsed()
        );
        assert!(
            text.contains("prjquota_exporter_scrape_collector_success{collector=\"nomad\"} 1\n"),
            "{text}"
        );
    }
    assert!(agent.requests().is_empty(), "{:#?}", agent.requests());
}

// --- The placement constraint, as Nomad evaluates it -------------------

/// Nomad's own cases of `checkOrder` (scheduler/feasible/feasible_test.go,
/// `TestCheckOrder`), and the trap they imply: a value Nomad cannot parse
/// as a number is compared as text, so "10GiB" would pass nodes by their
/// first digit.
#[test]
fn check_order_follows_nomads_cases() {
    for (op, l, r, want) in [
        ("<", "bar", "foo", true),
        ("<=", "foo", "foo", true),
        (">", "bar", "foo", false),
        (">=", "bar", "bar", true),
        (">", "1", "foo", false),
        ("<", "10", "1", false),
        ("<", "1", "10", true),
        ("<", "10.5", "1.5", false),
        ("<", "1.5", "10.5", true),
    ] {
        assert_eq!(check_order(op, l, r), want, "{l} {op} {r}");
    }
    assert!(
        check_order(">=", "5368709120", "10GiB"),
        "lexical: '5' > '1'"
    );
    assert!(!check_order(">=", "5368709120", "10737418240"));
}

/// The constraint docs/nomad.md gives a volume spec excludes a node whose
/// published figure is below the volume's size, and a node that never
/// published one, and keeps the others.
#[test]
fn the_documented_constraint_places_a_volume_only_where_it_fits() {
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/nomad.md")).unwrap();
    let constraints = documented_constraints(&page, "<!-- the placement constraint -->");
    assert_eq!(constraints.len(), 1, "{constraints:?}");
    let c: &Constraint = &constraints[0];
    assert_eq!(c.attribute, format!("${{meta.{META_KEY}}}"));
    let size: u64 = c
        .value
        .parse()
        .expect("the documented value is a plain byte count");
    let node = |v: Option<u64>| -> BTreeMap<String, String> {
        v.map(|v| (META_KEY.to_string(), v.to_string()))
            .into_iter()
            .collect()
    };
    assert!(feasible(c, &node(Some(size))));
    assert!(feasible(c, &node(Some(size * 4))));
    assert!(!feasible(c, &node(Some(size - 1))));
    assert!(!feasible(c, &node(Some(0))));
    assert!(
        !feasible(c, &node(None)),
        "a node that never published passed"
    );
}

fn encode(families: Vec<prjquota_exporter::exposition::Family>) -> String {
    prjquota_exporter::exposition::encode_all(
        &families,
        &prjquota_exporter::inventory::Inventory::default(),
    )
}

fn families_text(n: &Nomad) -> String {
    encode(n.families())
}
