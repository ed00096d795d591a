//! The real HTTP server on 127.0.0.1:0, scraped with a raw HTTP/1.1 client.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use prjquota_core::record::State;
use prjquota_exporter::Exporter;

const A: &str = "aaaaaaaa-0000-4000-8000-000000000001";
const B: &str = "bbbbbbbb-0000-4000-8000-000000000002";

struct Server {
    addr: std::net::SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    done: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn start(volumes_dir: &std::path::Path) -> Server {
    start_with(volumes_dir, prjquota_exporter::http::Options::default()).await
}

async fn start_with(
    volumes_dir: &std::path::Path,
    options: prjquota_exporter::http::Options,
) -> Server {
    let config = host_config(volumes_dir);
    let exporter = Arc::new(Exporter::new(&config));
    exporter.warm_up().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let done = tokio::spawn(prjquota_exporter::http::serve_with(
        listener,
        exporter,
        options,
        async {
            let _ = stopped.await;
        },
    ));
    Server { addr, stop, done }
}

/// `n` Ready volumes in `dir`, with project IDs from `first_project_id`.
fn ready_volumes(dir: &std::path::Path, n: u32, first_project_id: u32) {
    for i in 0..n {
        let id = format!("{i:08x}-0000-4000-8000-000000000000");
        add_volume(
            dir,
            record(&id, "default", first_project_id + i, State::Ready),
        );
    }
}

/// Runs a blocking client off the runtime the server is on.
async fn client<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_metrics_landing_page_health_and_errors() {
    let dir = fresh_dir(&std::env::temp_dir(), "http");
    add_volume(&dir, record(A, "default", 1001, State::Ready));
    add_volume(&dir, record(B, "web", 1002, State::Ready));
    std::fs::write(
        dir.join(".prjquota/volumes/cccccccc-0000-4000-8000-000000000003.json"),
        b"garbage",
    )
    .unwrap();
    let srv = start(&dir).await;
    let addr = srv.addr;

    let m = client(move || get(addr, "/metrics")).await;
    assert_eq!(m.status, 200);
    assert!(
        m.header("content-type")
            .unwrap()
            .starts_with("text/plain; version=0.0.4"),
        "{:?}",
        m.headers
    );
    let text = &m.body;
    for expected in [
        "# TYPE nomad_host_volume_info gauge",
        &format!("nomad_host_volume_provisioned_bytes{{namespace=\"web\",node_pool=\"default\",volume_id=\"{B}\"}} 1073741824"),
        "prjquota_exporter_volumes 2",
        "prjquota_exporter_scrape_collector_success{collector=\"registry\"} 1",
        "prjquota_exporter_scrape_collector_success{collector=\"statfs\"} 1",
        "prjquota_exporter_scrape_collector_success{collector=\"quota_events\"} 0",
        "prjquota_exporter_quota_events_subscribed 0",
    ] {
        assert!(text.lines().any(|l| l == expected), "missing {expected:?} in\n{text}");
    }
    let corrupt = format!(
        "prjquota_exporter_registry_corrupt_records{{volumes_dir=\"{}\"}}",
        dir.display()
    );
    assert_eq!(value(text, &corrupt), Some(1.0), "{text}");
    // statfs of a real directory: capacity and inodes for both volumes.
    assert_eq!(text.matches("nomad_host_volume_capacity_bytes{").count(), 2);
    assert!(value(text, &format!("nomad_host_volume_capacity_bytes{{namespace=\"default\",node_pool=\"default\",volume_id=\"{A}\"}}")).unwrap() > 0.0);
    // Every HELP/TYPE once.
    let mut types: Vec<_> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
    let n = types.len();
    types.sort();
    types.dedup();
    assert_eq!(types.len(), n, "a family appears twice");

    let landing = client(move || get(addr, "/")).await;
    assert_eq!(landing.status, 200);
    assert!(landing
        .header("content-type")
        .unwrap()
        .starts_with("text/html"));
    assert!(
        landing.body.contains("<a href=\"metrics\">"),
        "{}",
        landing.body
    );

    let h = client(move || get(addr, "/healthz")).await;
    assert_eq!((h.status, h.body.as_str()), (200, "ok"));

    let nf = client(move || get(addr, "/metricz")).await;
    assert_eq!(nf.status, 404);

    let post = client(move || {
        raw(
            addr,
            "POST /metrics HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
    })
    .await;
    assert_eq!(post.status, 405);
    assert_eq!(post.header("allow"), Some("GET, HEAD"));

    let head = client(move || {
        raw(
            addr,
            "HEAD /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        )
    })
    .await;
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());

    // A huge request head is refused, not buffered.
    let big = client(move || {
        let junk = "x".repeat(64 * 1024);
        raw(
            addr,
            &format!(
                "GET /metrics HTTP/1.1\r\nHost: t\r\nX-Junk: {junk}\r\nConnection: close\r\n\r\n"
            ),
        )
    })
    .await;
    assert_eq!(big.status, 431);

    // A deleted volume's series are gone at the next scrape.
    std::fs::remove_file(dir.join(format!(".prjquota/volumes/{A}.json"))).unwrap();
    let m = client(move || get(addr, "/metrics")).await;
    assert!(!m.body.contains(A), "{}", m.body);
    assert!(m.body.lines().any(|l| l == "prjquota_exporter_volumes 1"));

    srv.stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(15), srv.done)
        .await
        .expect("graceful shutdown finishes")
        .unwrap()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_sends_its_headers_is_dropped() {
    use std::io::Read;
    let dir = fresh_dir(&std::env::temp_dir(), "slow");
    let srv = start(&dir).await;
    let addr = srv.addr;
    let closed = client(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        std::io::Write::write_all(&mut s, b"GET /metrics HTTP/1.1\r\nHost: t\r\n").unwrap();
        let t = std::time::Instant::now();
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        t.elapsed()
    })
    .await;
    assert!(
        closed < Duration::from_secs(25),
        "closed after {closed:?}; the header read timeout is {:?}",
        prjquota_exporter::http::HEADER_READ_TIMEOUT
    );
    srv.stop.send(()).unwrap();
    let _ = srv.done.await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue #21: 64 clients with tiny receive buffers send `GET /metrics` and
/// never read a body larger than the socket buffers; a Prometheus on another
/// address still gets whole scrapes within its 10 s scrape timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_do_not_read_cannot_lock_out_a_scraper() {
    let dir = fresh_dir(&std::env::temp_dir(), "lockout");
    ready_volumes(&dir, 2000, 10_000);
    let srv = start(&dir).await;
    let addr = srv.addr;

    let first = client(move || get(addr, "/metrics")).await;
    assert_eq!(first.status, 200);
    assert!(
        first.body.len() > 1024 * 1024,
        "the body ({} bytes) must outsize the socket buffers",
        first.body.len()
    );

    eprintln!("body: {} bytes", first.body.len());
    // The non-readers come from 127.0.0.2, the scraper from 127.0.0.1.
    let mut held = Vec::new();
    for _ in 0..64 {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.set_recv_buffer_size(4096).unwrap();
        sock.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let s = sock.connect(addr).await.unwrap().into_std().unwrap();
        s.set_nonblocking(false).unwrap();
        // Pipelined requests keep the connection busy once a body fits in
        // the socket buffers, as a client that reopens would.
        let requests = "GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n".repeat(20);
        std::io::Write::write_all(&mut &s, requests.as_bytes()).unwrap();
        held.push(s);
    }
    // Let the server take them all in and start answering.
    tokio::time::sleep(Duration::from_millis(500)).await;

    for round in 0..3 {
        let t = std::time::Instant::now();
        let m = tokio::time::timeout(
            Duration::from_secs(10),
            client(move || get(addr, "/metrics")),
        )
        .await
        .unwrap_or_else(|_| panic!("scrape {round} took over 10 s behind non-reading clients"));
        assert_eq!(m.status, 200, "scrape {round}: {}", m.body);
        assert!(
            m.body
                .lines()
                .any(|l| l == "prjquota_exporter_volumes 2000"),
            "scrape {round} is not whole"
        );
        eprintln!("scrape {round} behind 64 non-readers: {:?}", t.elapsed());
    }
    drop(held);
    srv.stop.send(()).unwrap();
    let _ = srv.done.await;
    std::fs::remove_dir_all(&dir).unwrap();
}

fn gunzip(b: &[u8]) -> String {
    let mut out = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(b), &mut out)
        .expect("a whole gzip stream of UTF-8 text");
    out
}

/// Each line without its sample value: what stays the same from one scrape
/// to the next while /tmp's free space and the timings move.
fn stable(text: &str) -> Vec<&str> {
    text.lines()
        // The exporter's count of the answers it made gains a series (and,
        // with the first answer, the family) with the first answer of each
        // handler and code: one scrape to the next may differ there by
        // design.
        .filter(|l| !l.contains("prjquota_exporter_http_requests_total"))
        .map(|l| {
            if l.starts_with('#') {
                l
            } else {
                l.rsplit_once(' ').map_or(l, |(k, _)| k)
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_only_when_asked_and_decodes_to_the_plain_scrape() {
    let dir = fresh_dir(&std::env::temp_dir(), "gzip");
    ready_volumes(&dir, 200, 10_000);
    let srv = start(&dir).await;
    let addr = srv.addr;
    let ask = |enc: &'static str| {
        client(move || {
            raw_bytes(
                addr,
                &format!("GET /metrics HTTP/1.1\r\nHost: t\r\n{enc}Connection: close\r\n\r\n"),
            )
        })
    };
    let enc = |r: &RawReply| r.header("content-encoding").map(str::to_string);
    // What Prometheus sends.
    let r = ask("Accept-Encoding: gzip\r\n").await;
    assert_eq!((r.status, enc(&r).as_deref()), (200, Some("gzip")));
    let zipped = r.body;
    let r = ask("").await;
    assert_eq!(enc(&r), None, "no Accept-Encoding, no gzip");
    let plain = String::from_utf8(r.body).unwrap();
    let unzipped = gunzip(&zipped);
    assert!(
        zipped.len() * 5 < plain.len(),
        "{} -> {}",
        plain.len(),
        zipped.len()
    );
    assert_eq!(stable(&unzipped), stable(&plain));
    assert!(stable(&plain).len() > 1000);
    for refused in [
        "Accept-Encoding: gzip;q=0\r\n",
        "Accept-Encoding: br, deflate\r\n",
    ] {
        let r = ask(refused).await;
        assert_eq!(enc(&r), None, "{refused}");
        assert!(String::from_utf8(r.body)
            .unwrap()
            .contains("prjquota_exporter_volumes 200"));
    }
    let r = ask("Accept-Encoding: deflate, GZIP;q=0.5\r\n").await;
    assert_eq!(enc(&r).as_deref(), Some("gzip"));
    srv.stop.send(()).unwrap();
    let _ = srv.done.await;

    // --web.disable-compression and --web.telemetry-path.
    let srv = start_with(
        &dir,
        prjquota_exporter::http::Options {
            compression: false,
            telemetry_path: "/custom".into(),
            ..Default::default()
        },
    )
    .await;
    let addr = srv.addr;
    let r = client(move || {
        raw_bytes(
            addr,
            "GET /custom HTTP/1.1\r\nHost: t\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n",
        )
    })
    .await;
    assert_eq!((r.status, enc(&r)), (200, None));
    assert!(String::from_utf8(r.body)
        .unwrap()
        .contains("prjquota_exporter_volumes 200"));
    assert_eq!(client(move || get(addr, "/metrics")).await.status, 404);
    assert!(client(move || get(addr, "/"))
        .await
        .body
        .contains("<a href=\"custom\">"));
    srv.stop.send(()).unwrap();
    let _ = srv.done.await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Prometheus keeps its scrape connection open: scrapes in a row on one
/// connection each get a whole, fresh gzip body (and a plain one between).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrapes_on_a_kept_connection_are_each_whole() {
    let dir = fresh_dir(&std::env::temp_dir(), "keepalive");
    ready_volumes(&dir, 50, 20_000);
    let srv = start(&dir).await;
    let addr = srv.addr;
    let bodies = client(move || {
        let mut conn = prjquota_vmtests::http::KeepAlive::connect(addr, Duration::from_secs(30))
            .expect("connect");
        let head = prjquota_vmtests::http::get_head_keep_alive(addr, "/metrics");
        let gzip = prjquota_vmtests::http::asking_gzip(&head);
        [&gzip, &head, &gzip].map(|h| conn.request(h).unwrap_or_else(|e| panic!("{h:?}: {e}")))
    })
    .await;
    for (r, zipped) in bodies.iter().zip([true, false, true]) {
        assert_eq!(r.status, 200);
        let text = if zipped {
            assert_eq!(r.header("content-encoding"), Some("gzip"));
            gunzip(&r.body)
        } else {
            assert_eq!(r.header("content-encoding"), None);
            String::from_utf8(r.body.clone()).unwrap()
        };
        assert!(text.contains("prjquota_exporter_volumes 50"), "{text}");
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("nomad_host_volume_capacity_bytes{"))
                .count(),
            50
        );
    }
    srv.stop.send(()).unwrap();
    let _ = srv.done.await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_metrics_are_present_and_sane() {
    let dir = fresh_dir(&std::env::temp_dir(), "process");
    let srv = start(&dir).await;
    let addr = srv.addr;
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    // Spend CPU time in this process (the exporter's) so it shows.
    let t = std::time::Instant::now();
    let mut x = 0u64;
    while t.elapsed() < Duration::from_millis(300) {
        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
    }
    let m = client(move || get(addr, "/metrics")).await;
    let v = |name: &str| {
        value(&m.body, &format!("{name} ")).unwrap_or_else(|| panic!("no {name} in\n{}", m.body))
    };
    for family in [
        "process_cpu_seconds_total counter",
        "process_open_fds gauge",
    ] {
        assert!(m.body.contains(&format!("# TYPE {family}\n")), "{family}");
    }
    assert!(
        v("process_cpu_seconds_total") >= 0.01,
        "at least one clock tick"
    );
    let rss = v("process_resident_memory_bytes");
    assert!(rss > 1e6 && rss < 4e9, "rss {rss}");
    assert!(v("process_virtual_memory_bytes") >= rss);
    // This test process: its listener, the scrape's socket, stdio at least.
    let fds = v("process_open_fds");
    assert!(fds >= 4.0, "open fds {fds}");
    assert!(v("process_max_fds") >= fds);
    let start = v("process_start_time_seconds");
    assert!(
        start <= before + 1.0 && start > before - 3600.0,
        "start {start}, now {before}"
    );
    srv.stop.send(()).unwrap();
    let _ = srv.done.await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// 404s, 405s and scrapes are counted by handler and code, as promhttp
/// counts its handler's; the scrape reading them is in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_counted_by_handler_and_code() {
    let dir = fresh_dir(&std::env::temp_dir(), "http-counted");
    let srv = start(&dir).await;
    let addr = srv.addr;
    let text = client(move || {
        assert_eq!(get(addr, "/nope").status, 404);
        assert_eq!(get(addr, "/nope").status, 404);
        assert_eq!(get(addr, "/healthz").status, 200);
        assert_eq!(
            raw(addr, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").status,
            405
        );
        assert_eq!(get(addr, "/metrics").status, 200);
        get(addr, "/metrics").body
    })
    .await;
    for (labels, n) in [
        ("code=\"404\",handler=\"other\"", 2.0),
        ("code=\"200\",handler=\"healthz\"", 1.0),
        ("code=\"405\",handler=\"metrics\"", 1.0),
        ("code=\"200\",handler=\"metrics\"", 1.0),
    ] {
        assert_eq!(
            value(
                &text,
                &format!("prjquota_exporter_http_requests_total{{{labels}}}")
            ),
            Some(n),
            "{labels}\n{text}"
        );
    }
    assert_eq!(
        value(&text, "prjquota_exporter_http_requests_in_flight"),
        Some(1.0)
    );
    let _ = srv.stop.send(());
    srv.done.await.unwrap().unwrap();
}

/// Without `--web.openmetrics.created-samples`, OpenMetrics carries no
/// `_created` line: a Prometheus that does not ingest created timestamps
/// would store each as one more series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openmetrics_has_no_created_lines_unless_asked() {
    use prjquota_vmtests::prom::openmetrics_parse;
    let dir = fresh_dir(&std::env::temp_dir(), "no-created");
    ready_volumes(&dir, 3, 20_000);
    let srv = start(&dir).await;
    let addr = srv.addr;
    let head = "GET /metrics HTTP/1.1\r\nHost: t\r\nAccept: application/openmetrics-text; version=1.0.0\r\nConnection: close\r\n\r\n";
    let r = client(move || raw_bytes(addr, head)).await;
    assert_eq!(r.header("content-type"), Some(OPENMETRICS));
    let body = String::from_utf8(r.body).unwrap();
    assert!(!body.contains("_created"), "{body}");
    let fams = openmetrics_parse(&body).unwrap_or_else(|e| panic!("not OpenMetrics: {e}\n{body}"));
    let cpu = fams
        .iter()
        .find(|f| f.name == "process_cpu_seconds")
        .expect("process_cpu_seconds");
    assert_eq!(cpu.kind, "counter");
    assert_eq!(cpu.samples.len(), 1, "{:?}", cpu.samples);
    srv.stop.send(()).unwrap();
    let _ = srv.done.await;
    std::fs::remove_dir_all(&dir).unwrap();
}

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Content negotiation as promhttp does it, with and without gzip and with
/// the text kept as text (`--web.disable-compression`): every OpenMetrics
/// body read by a real OpenMetrics parser, every text body by promtool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openmetrics_or_text_by_accept_header_with_and_without_gzip() {
    use prjquota_vmtests::prom::{openmetrics_parse, promtool_check_metrics};
    let dir = fresh_dir(&std::env::temp_dir(), "negotiate");
    ready_volumes(&dir, 300, 20_000);
    let accepts: &[(&str, &str)] = &[
        ("", TEXT),
        ("*/*", TEXT),
        ("text/plain", TEXT),
        ("text/plain;version=0.0.4", TEXT),
        ("application/openmetrics-text", OPENMETRICS),
        ("application/openmetrics-text; version=1.0.0", OPENMETRICS),
        ("application/openmetrics-text;version=0.0.1", OPENMETRICS),
        ("application/openmetrics-text;version=3.0.0", TEXT),
        // Prometheus 2's and 3's defaults.
        ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1", OPENMETRICS),
        ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8,application/openmetrics-text;version=0.0.1;q=0.8,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.6,text/plain;version=0.0.4;q=0.4,*/*;q=0.1", OPENMETRICS),
        ("text/plain;q=0.3, application/openmetrics-text;q=0.7", OPENMETRICS),
        ("application/openmetrics-text;q=0.3, text/plain;q=0.7", TEXT),
        ("application/openmetrics-text;q=0, */*", TEXT),
    ];
    for compression in [true, false] {
        let srv = start_with(
            &dir,
            prjquota_exporter::http::Options {
                compression,
                created_samples: true,
                ..Default::default()
            },
        )
        .await;
        let addr = srv.addr;
        for &(accept, want) in accepts {
            for gzip in [false, true] {
                let head = format!(
                    "GET /metrics HTTP/1.1\r\nHost: t\r\n{}{}Connection: close\r\n\r\n",
                    if accept.is_empty() {
                        String::new()
                    } else {
                        format!("Accept: {accept}\r\n")
                    },
                    if gzip {
                        "Accept-Encoding: gzip\r\n"
                    } else {
                        ""
                    },
                );
                let what = format!("Accept {accept:?}, gzip {gzip}, compression {compression}");
                let r = client(move || raw_bytes(addr, &head)).await;
                assert_eq!(r.status, 200, "{what}");
                assert_eq!(r.header("content-type"), Some(want), "{what}");
                assert_eq!(r.header("vary"), Some("Accept, Accept-Encoding"), "{what}");
                let zipped = gzip && compression;
                assert_eq!(
                    r.header("content-encoding"),
                    zipped.then_some("gzip"),
                    "{what}"
                );
                let body = if zipped {
                    gunzip(&r.body)
                } else {
                    String::from_utf8(r.body).unwrap()
                };
                if want == OPENMETRICS {
                    assert!(body.ends_with("\n# EOF\n"), "{what}");
                    let fams = openmetrics_parse(&body)
                        .unwrap_or_else(|e| panic!("{what}: not OpenMetrics: {e}\n{body}"));
                    let fam = |n: &str| {
                        fams.iter()
                            .find(|f| f.name == n)
                            .unwrap_or_else(|| panic!("{what}: no family {n}"))
                    };
                    let info = fam("nomad_host_volume");
                    assert_eq!(info.kind, "info", "{what}");
                    assert_eq!(info.samples.len(), 300, "{what}");
                    assert_eq!(fam("prjquota_exporter_build").kind, "info");
                    let cpu = fam("process_cpu_seconds");
                    assert_eq!(cpu.kind, "counter");
                    let names: Vec<&str> = cpu.samples.iter().map(|s| s.0.as_str()).collect();
                    assert_eq!(
                        names,
                        ["process_cpu_seconds_total", "process_cpu_seconds_created"]
                    );
                    // The exporter's start, as process_start_time_seconds.
                    let start = fam("process_start_time_seconds").samples[0].2;
                    assert_eq!(cpu.samples[1].2, start, "{what}");
                    assert_eq!(fam("prjquota_exporter_volumes").kind, "gauge");
                } else {
                    assert!(!body.contains("# EOF"), "{what}");
                    assert!(!body.contains("_created"), "{what}");
                    assert!(body.contains("# TYPE nomad_host_volume_info gauge\n"));
                    let lint = promtool_check_metrics(&body);
                    assert_eq!(lint.code, Some(0), "{what}: {}", lint.output);
                }
            }
        }
        srv.stop.send(()).unwrap();
        let _ = srv.done.await;
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
