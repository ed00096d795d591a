//! What gzip costs and saves at 1,000 and 10,000 volumes (README,
//! "Compression"). Run optimised for figures worth quoting:
//! `cargo nextest run --release -p prjquota-exporter --test gzip_cost --no-capture`.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use prjquota_core::record::State;
use prjquota_exporter::Exporter;

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
    let mut scrape = Duration::MAX;
    let mut body = String::new();
    for _ in 0..5 {
        let t = Instant::now();
        let r = tokio::task::spawn_blocking(move || get(addr, "/metrics"))
            .await
            .unwrap();
        scrape = scrape.min(t.elapsed());
        assert_eq!(r.status, 200);
        body = r.body;
    }
    assert!(body
        .lines()
        .any(|l| l == format!("prjquota_exporter_volumes {n}")));
    let mut zip = Duration::MAX;
    let mut z = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        z = prjquota_exporter::http::gzip(body.as_bytes());
        zip = zip.min(t.elapsed());
    }
    eprintln!(
        "{n} volumes: body {} B, gzip {} B ({:.1}x smaller, {} B saved); \
         plain scrape over HTTP {:?}, gzip of the body {:?} ({:.0}% of the scrape)",
        body.len(),
        z.len(),
        body.len() as f64 / z.len() as f64,
        body.len() - z.len(),
        scrape,
        zip,
        100.0 * zip.as_secs_f64() / scrape.as_secs_f64()
    );
    assert!(z.len() * 5 < body.len());
    stop.send(()).unwrap();
    let _ = done.await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_cost_at_1000_and_10000_volumes() {
    measure(1000).await;
    measure(10_000).await;
}
