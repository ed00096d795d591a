//! What a scrape costs and sends with and without gzip at 1,000 and 10,000
//! volumes (docs/performance.md, "Compression"). Run optimised for figures worth
//! quoting:
//! `cargo nextest run --release -p prjquota-exporter --test gzip_cost --no-capture`.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use prjquota_core::record::State;
use prjquota_exporter::Exporter;

/// Best of five scrapes: (time, bytes on the wire).
async fn best_of_5(addr: SocketAddr, accept: &'static str) -> (Duration, usize) {
    let mut best = Duration::MAX;
    let mut bytes = 0;
    for _ in 0..5 {
        let t = Instant::now();
        let r = tokio::task::spawn_blocking(move || {
            raw_bytes(
                addr,
                &format!("GET /metrics HTTP/1.1\r\nHost: t\r\n{accept}Connection: close\r\n\r\n"),
            )
        })
        .await
        .unwrap();
        best = best.min(t.elapsed());
        assert_eq!(r.status, 200);
        bytes = r.body.len();
    }
    (best, bytes)
}

async fn measure(n: u32) {
    let dir = fresh_dir(&std::env::temp_dir(), "gzipcost");
    for i in 0..n {
        let id = format!("{i:08x}-0000-4000-8000-000000000000");
        add_volume(&dir, record(&id, "default", 10_000 + i, State::Ready));
    }
    let config = host_config(&dir);
    let exporter = Arc::new(Exporter::new(&config));
    exporter.warm_up().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let done = tokio::spawn(prjquota_exporter::http::serve(listener, exporter, async {
        let _ = stopped.await;
    }));
    // A first read of 10,000 records can outlast the mount timeout on a
    // loaded host; the exporter then serves what it had and finishes the
    // read in the background. Measured here: scrapes of every volume.
    let want = format!("\nprjquota_exporter_volumes {n}\n");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let r = tokio::task::spawn_blocking(move || {
            raw_bytes(
                addr,
                "GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
            )
        })
        .await
        .unwrap();
        if String::from_utf8_lossy(&r.body).contains(&want) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the exporter never served {n} volumes"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (plain, body) = best_of_5(addr, "").await;
    let (zipped, z) = best_of_5(addr, "Accept-Encoding: gzip\r\n").await;
    eprintln!(
        "{n} volumes: body {body} B, gzip {z} B ({:.1}x smaller); \
         plain scrape {plain:?}, gzip scrape {zipped:?} ({:.2}x the plain one)",
        body as f64 / z as f64,
        zipped.as_secs_f64() / plain.as_secs_f64()
    );
    assert!(z * 5 < body);
    stop.send(()).unwrap();
    let _ = done.await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_cost_at_1000_and_10000_volumes() {
    measure(1000).await;
    measure(10_000).await;
}
