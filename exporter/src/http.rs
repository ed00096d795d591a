//! The HTTP server: `/metrics`, a landing page, `/healthz`.
//!
//! Only asks the [`Exporter`] to scrape and encodes what it returns; knows
//! nothing of volumes. Defences against clients that would pin the exporter:
//! a header read timeout (also closes idle keep-alive connections), a cap on
//! header size and count, a cap on open connections, one scrape at a time
//! (so memory holds one scrape however many scrapers there are), and a
//! deadline for sending a scrape to a slow reader.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Semaphore};

use crate::collector::{Exporter, BUILD_VERSION};
use crate::metrics::{Encoder, TEXT_FORMAT};

/// Time a client has to send a request's headers (and an idle keep-alive
/// connection may stay open).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Read buffer, which bounds the size of a request head.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
pub const MAX_HEADERS: usize = 64;
pub const MAX_CONNECTIONS: usize = 64;
/// Time to send one scrape's body to a client.
pub const SEND_DEADLINE: Duration = Duration::from_secs(60);
/// Time open connections get to finish after a shutdown signal.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Bytes gathered before a chunk is handed to the connection.
const CHUNK: usize = 64 * 1024;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = BoxBody<Bytes, BoxError>;

const LANDING: &str = "<!DOCTYPE html>
<html lang=\"en\">
<head><meta charset=\"utf-8\"><title>prjquota exporter</title></head>
<body>
<h1>prjquota exporter</h1>
<p>Prometheus exporter for Nomad dynamic host volumes made by the prjquota plugin: size, usage, inodes and quota limit hits per volume. Version VERSION.</p>
<ul>
<li><a href=\"metrics\">Metrics</a></li>
<li><a href=\"healthz\">Health</a></li>
</ul>
</body>
</html>
";

struct App {
    exporter: Arc<Exporter>,
    /// One scrape at a time.
    scrape: Arc<Semaphore>,
}

fn full(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(empty_or(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn empty_or(body: impl Into<Bytes>) -> Body {
    Full::new(body.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A response body fed chunk by chunk from a channel. If the sender stops
/// before marking the body complete, the body ends in an error, so hyper
/// aborts the response and the scraper sees a failed scrape rather than a
/// truncated one that parses.
struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
    complete: Arc<AtomicBool>,
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(b)) => Poll::Ready(Some(Ok(Frame::data(b)))),
            Poll::Ready(None) if self.complete.load(Ordering::Acquire) => Poll::Ready(None),
            Poll::Ready(None) => Poll::Ready(Some(Err("the scrape was aborted".into()))),
            Poll::Pending => Poll::Pending,
        }
    }
}

fn metrics_content_type() -> HeaderValue {
    HeaderValue::from_str(&format!("{TEXT_FORMAT}; charset=utf-8"))
        .expect("the text format is a valid header value")
}

async fn metrics(app: &App, head_only: bool) -> Response<Body> {
    let mut resp = if head_only {
        Response::new(empty_or(Bytes::new()))
    } else {
        let permit = app
            .scrape
            .clone()
            .acquire_owned()
            .await
            .expect("the scrape semaphore is never closed");
        let scraped = app.exporter.scrape().await;
        let (tx, rx) = mpsc::channel::<Bytes>(2);
        let complete = Arc::new(AtomicBool::new(false));
        let done = complete.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let deadline = tokio::time::Instant::now() + SEND_DEADLINE;
            // False when the scraper went away or is too slow.
            let send = |chunk: Vec<u8>| {
                let tx = &tx;
                async move {
                    match tokio::time::timeout_at(deadline, tx.send(Bytes::from(chunk))).await {
                        Ok(Ok(())) => true,
                        Ok(Err(_)) => false, // the connection is gone
                        Err(_) => {
                            crate::warn!(
                                "a scraper took too long to read /metrics; response aborted"
                            );
                            false
                        }
                    }
                }
            };
            let enc = Encoder::new(&scraped.inventory);
            let mut buf = Vec::with_capacity(CHUNK * 2);
            for f in &scraped.families {
                for b in 0..f.batches() {
                    f.encode_batch(&enc, b, &mut buf);
                    if buf.len() >= CHUNK {
                        if !send(std::mem::take(&mut buf)).await {
                            return;
                        }
                        buf.reserve(CHUNK * 2);
                    }
                }
            }
            if !buf.is_empty() && !send(buf).await {
                return;
            }
            done.store(true, Ordering::Release);
        });
        Response::new(ChannelBody { rx, complete }.boxed())
    };
    resp.headers_mut()
        .insert(CONTENT_TYPE, metrics_content_type());
    resp
}

/// 503 for /metrics and /healthz until the exporter is warmed up: its
/// programs loaded and every volume registered. Served before that, a
/// scrape would show zeros that mean "not measured".
fn not_ready(app: &App, path: &str) -> Option<Response<Body>> {
    if app.exporter.is_ready() || !(path == "/metrics" || path == "/healthz") {
        return None;
    }
    Some(full(
        StatusCode::SERVICE_UNAVAILABLE,
        "text/plain; charset=utf-8",
        "starting: loading the eBPF programs and registering every volume with them\n",
    ))
}

async fn route(req: Request<Incoming>, app: Arc<App>) -> Result<Response<Body>, Infallible> {
    let head = req.method() == Method::HEAD;
    if req.method() != Method::GET && !head {
        let mut r = full(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "method not allowed\n",
        );
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return Ok(r);
    }
    if let Some(r) = not_ready(&app, req.uri().path()) {
        return Ok(r);
    }
    Ok(match req.uri().path() {
        "/metrics" => metrics(&app, head).await,
        "/" => full(
            StatusCode::OK,
            "text/html; charset=utf-8",
            LANDING.replace("VERSION", BUILD_VERSION),
        ),
        "/healthz" => full(StatusCode::OK, "text/plain; charset=utf-8", "ok"),
        _ => full(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found: try /metrics\n",
        ),
    })
}

/// Serves until `shutdown` completes, then gives open connections
/// [`SHUTDOWN_GRACE`] to finish.
pub async fn serve(
    listener: TcpListener,
    exporter: Arc<Exporter>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let app = Arc::new(App {
        exporter,
        scrape: Arc::new(Semaphore::new(1)),
    });
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES)
        .max_headers(MAX_HEADERS);
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = connections.clone().acquire_owned() => p.expect("never closed"),
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE and friends: back off rather than spin.
                    crate::warn!("accept failed", err = e);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let app = app.clone();
        let svc = service_fn(move |req| route(req, app.clone()));
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), svc));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                crate::debug!("connection ended with an error", peer = peer, err = e);
            }
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(SHUTDOWN_GRACE) => {
            crate::warn!("connections still open after the shutdown grace period; closing them");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unfinished_body_is_an_error_not_a_short_scrape() {
        let (tx, rx) = mpsc::channel(2);
        let complete = Arc::new(AtomicBool::new(false));
        tx.send(Bytes::from_static(b"a 1\n")).await.unwrap();
        drop(tx);
        let body = ChannelBody { rx, complete };
        assert!(body.collect().await.is_err());

        let (tx, rx) = mpsc::channel(2);
        let complete = Arc::new(AtomicBool::new(true));
        tx.send(Bytes::from_static(b"a 1\n")).await.unwrap();
        drop(tx);
        let body = ChannelBody { rx, complete }.collect().await.unwrap();
        assert_eq!(body.to_bytes(), Bytes::from_static(b"a 1\n"));
    }
}
