//! The HTTP server: `/metrics`, a landing page, `/healthz`.
//!
//! Only asks the [`Exporter`] to scrape and encodes what it returns; knows
//! nothing of volumes. Defences against clients that would pin the exporter:
//! a header read timeout (also closes idle keep-alive connections), a cap on
//! header size and count, a cap on open connections and on those of one
//! client address, one scrape at a time with a deadline for the wait (503),
//! and a deadline for sending a scrape to a slow reader. The body is
//! rendered under the scrape permit and sent after it is released, so a
//! client that does not read holds only its own connection; scrapers that
//! arrive during a scrape share its rendered body.
//!
//! With `--web.config.file` ([`crate::web_config`]) a connection is TLS from
//! its first byte when the file configures TLS (no plain HTTP on that
//! listener), and every path but `/healthz` asks for basic auth when the file
//! lists users. `/healthz` tells only "ready" or "starting", and health
//! checkers (Nomad's service check, load balancers) rarely carry
//! credentials, so it stays open, as exporter-toolkit's
//! `auth_excluded_paths` lets an operator do; it is still TLS-only.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::header::{
    HeaderValue, ACCEPT, ACCEPT_ENCODING, ALLOW, AUTHORIZATION, CONTENT_ENCODING, CONTENT_TYPE,
    VARY, WWW_AUTHENTICATE,
};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::collector::{Exporter, BUILD_VERSION};
use crate::exposition::Family;
use crate::exposition::{Created, Format, Rendered, Renderer, Wire};
use crate::web_config::{Verdict, Web};

/// Time a client has to send a request's headers (and an idle keep-alive
/// connection may stay open).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Read buffer, which bounds the size of a request head.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
pub const MAX_HEADERS: usize = 64;
pub const MAX_CONNECTIONS: usize = 64;
/// Open connections one client address may hold, so that one host's
/// non-reading clients cannot take every slot from the Prometheus servers.
pub const MAX_CONNECTIONS_PER_IP: usize = 8;
/// Time a request waits for the scrape in progress before it is answered
/// 503: half of Prometheus' default 10 s scrape timeout, so the scraper
/// sees a clear failure rather than its own timeout.
pub const SCRAPE_WAIT: Duration = Duration::from_secs(5);
/// Time to send one scrape's body to a client; a connection past it is
/// closed.
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
<li><a href=\"METRICS\">Metrics</a></li>
<li><a href=\"healthz\">Health</a></li>
</ul>
</body>
</html>
";

/// One of a thing for each [`Format`].
struct PerFormat<T> {
    text: T,
    openmetrics: T,
}

impl<T> PerFormat<T> {
    fn get(&self, f: Format) -> &T {
        match f {
            Format::Text => &self.text,
            Format::OpenMetrics => &self.openmetrics,
        }
    }
}

struct App {
    options: Options,
    exporter: Arc<Exporter>,
    /// One scrape at a time; held while scraping and rendering, never while
    /// sending.
    scrape: Semaphore,
    /// When the last rendered scrape of each format began, and its body.
    last: PerFormat<Mutex<Option<(Instant, Pieces)>>>,
    /// Renders scrapes, reusing the unchanged text of the previous one; used
    /// under the scrape permit only. One per format: each keeps its own
    /// text, so a node scraped in one format holds one copy, and one
    /// scraped in both (two Prometheus servers) renders each from its own.
    renderer: PerFormat<Mutex<Renderer>>,
    started: Instant,
    requests: Requests,
}

/// What the HTTP side answered (promhttp's `promhttp_metric_handler_*`):
/// 401s, 503s and 500s are counted, not only logged.
#[derive(Debug, Default)]
pub struct Requests {
    /// Answered requests by (handler, status code).
    answered: Mutex<std::collections::BTreeMap<(&'static str, u16), u64>>,
    /// Requests being answered now, this scrape included.
    in_flight: std::sync::atomic::AtomicI64,
}

impl Requests {
    fn families(&self) -> Vec<Family> {
        let mut total = Family::counter(
            "prjquota_exporter_http_requests_total",
            "Requests the exporter answered, by handler (metrics, healthz, landing, other) and HTTP status code; a request is counted once its answer is made, so a scrape sees the ones before it.",
        );
        for ((handler, code), n) in self.answered.lock().expect("never poisoned").iter() {
            total.labelled(
                vec![
                    ("code", code.to_string()),
                    ("handler", (*handler).to_string()),
                ],
                *n as f64,
            );
        }
        let mut in_flight = Family::gauge(
            "prjquota_exporter_http_requests_in_flight",
            "Requests the exporter is answering now, the scrape that reads this included.",
        );
        in_flight.plain(self.in_flight.load(Ordering::Relaxed) as f64);
        vec![total, in_flight]
    }

    fn answered(&self, handler: &'static str, code: StatusCode) {
        *self
            .answered
            .lock()
            .expect("never poisoned")
            .entry((handler, code.as_u16()))
            .or_default() += 1;
    }
}

/// The HTTP families with no requests yet (for the docs' catalogue).
pub fn catalogue() -> Vec<Family> {
    Requests::default().families()
}

/// Counts a request as in flight until dropped.
struct InFlight<'a>(&'a std::sync::atomic::AtomicI64);

impl<'a> InFlight<'a> {
    fn enter(n: &'a std::sync::atomic::AtomicI64) -> InFlight<'a> {
        n.fetch_add(1, Ordering::Relaxed);
        InFlight(n)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl App {
    /// Milliseconds since the server started; never 0, which means "no
    /// response in flight".
    fn clock_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64 + 1
    }
}

/// Per-connection state shared with the connection's watchdog.
struct Conn {
    /// 0, or the send deadline of the response in flight ([`App::clock_ms`]).
    in_flight: Arc<AtomicU64>,
}

/// Open connections per client address. Holding one releases its slot on
/// drop.
#[derive(Default)]
struct PerIp(Mutex<HashMap<IpAddr, usize>>);

struct IpSlot {
    table: Arc<PerIp>,
    ip: IpAddr,
}

impl PerIp {
    fn take(table: &Arc<PerIp>, ip: IpAddr) -> Option<IpSlot> {
        let mut m = table.0.lock().expect("never poisoned");
        let n = m.entry(ip).or_insert(0);
        if *n >= MAX_CONNECTIONS_PER_IP {
            return None;
        }
        *n += 1;
        Some(IpSlot {
            table: table.clone(),
            ip,
        })
    }
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut m = self.table.0.lock().expect("never poisoned");
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
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

/// A scrape's body: the pieces [`Renderer`] made (its cached runs
/// themselves, not copies), shared by the scrapers that asked for it.
type Pieces = Arc<Rendered>;

/// A rendered scrape sent in frames of at most [`CHUNK`] bytes. While it
/// exists, its connection has a response in flight: `in_flight` holds the
/// send deadline (milliseconds after the server started) and the
/// connection's watchdog closes a connection whose reader is past it.
/// Sending holds nothing shared: a client that does not read pins only its
/// own connection.
struct RenderedBody {
    parts: Wire,
    /// The part being sent, and what of it is left.
    next: usize,
    rest: Bytes,
    left: u64,
    in_flight: Arc<AtomicU64>,
    deadline_ms: u64,
}

impl RenderedBody {
    fn new(parts: Wire, in_flight: Arc<AtomicU64>, deadline_ms: u64) -> Self {
        in_flight.store(deadline_ms, Ordering::Release);
        let left = parts.iter().map(|p| p.len() as u64).sum();
        Self {
            parts,
            next: 0,
            rest: Bytes::new(),
            left,
            in_flight,
            deadline_ms,
        }
    }

    /// Clears this body's deadline, not a later response's on the same
    /// connection.
    fn done(&self) {
        let _ = self.in_flight.compare_exchange(
            self.deadline_ms,
            0,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }
}

impl Drop for RenderedBody {
    fn drop(&mut self) {
        self.done();
    }
}

impl hyper::body::Body for RenderedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        while self.rest.is_empty() {
            let Some(p) = self.parts.get(self.next).cloned() else {
                return Poll::Ready(None);
            };
            self.next += 1;
            self.rest = p;
        }
        let n = self.rest.len().min(CHUNK);
        let chunk = self.rest.split_to(n);
        self.left -= n as u64;
        if self.left == 0 {
            self.done();
        }
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.left)
    }
}

/// The scrape body for a request that arrived at `arrived`: the last
/// rendered one if its scrape began after `arrived` (as fresh as a scrape of
/// our own, so scrapers that arrive together share one body), else a new
/// one. `None` when the permit did not come within [`SCRAPE_WAIT`].
async fn render(app: &App, arrived: Instant, format: Format) -> Option<Pieces> {
    let permit = match tokio::time::timeout(SCRAPE_WAIT, app.scrape.acquire()).await {
        Ok(p) => p.expect("the scrape semaphore is never closed"),
        Err(_) => return None,
    };
    {
        let mut last = app.last.get(format).lock().expect("never poisoned");
        if let Some((began, body)) = &*last {
            if *began >= arrived {
                return Some(body.clone());
            }
        }
        // No use to anyone from now on: the semaphore is fair, so whoever
        // waits behind us arrived after us, after it began. Dropped before
        // rendering, the runs the renderer replaces are freed as it goes
        // rather than held beside their replacements to the end.
        *last = None;
    }
    let began = Instant::now();
    let scraped = app.exporter.scrape().await;
    let web = app
        .options
        .web
        .as_ref()
        .map(|w| w.families())
        .unwrap_or_default();
    let process = crate::process::families();
    let requests = app.requests.families();
    let families = scraped
        .families
        .iter()
        .chain(&process)
        .chain(&requests)
        .chain(&web);
    let body: Pieces = Arc::new(
        app.renderer
            .get(format)
            .lock()
            .expect("never poisoned")
            .render(&scraped.inventory, families),
    );
    crate::exposition::recycle(scraped.families);
    *app.last.get(format).lock().expect("never poisoned") = Some((began, body.clone()));
    drop(permit);
    Some(body)
}

/// Whether `Accept-Encoding` names gzip (or `*`) with a q-value above 0.
fn accepts_gzip(headers: &hyper::HeaderMap) -> bool {
    headers
        .get_all(ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or("").trim();
            if !(coding.eq_ignore_ascii_case("gzip") || coding == "*") {
                return false;
            }
            parts
                .filter_map(|p| p.trim().strip_prefix("q="))
                .all(|q| q.trim().parse::<f32>().is_ok_and(|q| q > 0.0))
        })
}

async fn metrics(
    app: &App,
    conn: &Conn,
    head_only: bool,
    mut gzipped: bool,
    format: Format,
) -> Response<Body> {
    let mut resp = if head_only {
        Response::new(empty_or(Bytes::new()))
    } else {
        let Some(body) = render(app, Instant::now(), format).await else {
            crate::warn!(
                "another scrape held the exporter too long; answered 503",
                waited_s = SCRAPE_WAIT.as_secs()
            );
            return full(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain; charset=utf-8",
                "another scrape is in progress; try again\n",
            );
        };
        // Made once per body, however many scrapers share it; gzip only
        // where the text is kept compressed (`--web.disable-compression`
        // keeps it as text).
        let parts = match body.gzip().filter(|_| gzipped) {
            Some(parts) => Ok(parts),
            None if body.compressed => {
                gzipped = false;
                tokio::task::spawn_blocking(move || body.text())
                    .await
                    .expect("inflating does not panic")
            }
            None => {
                gzipped = false;
                body.text()
            }
        };
        let parts = match parts {
            Ok(parts) => parts,
            Err(e) => {
                crate::warn!("a scrape could not be sent; answered 500", error = e);
                return full(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain; charset=utf-8",
                    "the scrape could not be sent (a bug: see the exporter's log)\n",
                );
            }
        };
        let deadline = app.clock_ms() + SEND_DEADLINE.as_millis() as u64;
        Response::new(RenderedBody::new(parts, conn.in_flight.clone(), deadline).boxed())
    };
    let h = resp.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static(format.content_type()),
    );
    h.insert(VARY, HeaderValue::from_static("Accept, Accept-Encoding"));
    if gzipped {
        h.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    resp
}

/// 503 for the telemetry path and /healthz until the exporter is warmed up: its
/// programs loaded and every volume registered. Served before that, a
/// scrape would show zeros that mean "not measured".
fn not_ready(app: &App, path: &str) -> Option<Response<Body>> {
    if app.exporter.is_ready() || !(path == app.options.telemetry_path || path == "/healthz") {
        return None;
    }
    Some(full(
        StatusCode::SERVICE_UNAVAILABLE,
        "text/plain; charset=utf-8",
        "starting: loading the eBPF programs and registering every volume with them\n",
    ))
}

/// Which handler a path is, for `prjquota_exporter_http_requests_total`.
fn handler_of(app: &App, path: &str) -> &'static str {
    match path {
        p if p == app.options.telemetry_path => "metrics",
        "/healthz" => "healthz",
        "/" => "landing",
        _ => "other",
    }
}

/// [`answer`], counted.
async fn route(
    req: Request<Incoming>,
    app: Arc<App>,
    conn: Arc<Conn>,
) -> Result<Response<Body>, Infallible> {
    let handler = handler_of(&app, req.uri().path());
    let _in_flight = InFlight::enter(&app.requests.in_flight);
    let mut resp = answer(req, app.clone(), conn).await;
    if let Ok(r) = &mut resp {
        app.requests.answered(handler, r.status());
        // On every answer, refusals included, as exporter-toolkit does: a
        // policy such as Strict-Transport-Security holds for the endpoint.
        if let Some(web) = &app.options.web {
            for (name, value) in web.config().headers() {
                r.headers_mut().insert(name.clone(), value.clone());
            }
        }
    }
    resp
}

async fn answer(
    req: Request<Incoming>,
    app: Arc<App>,
    conn: Arc<Conn>,
) -> Result<Response<Body>, Infallible> {
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
    if let Some(web) = &app.options.web {
        let verdict = if req.uri().path() == "/healthz" {
            Verdict::Allowed
        } else {
            web.authorize(req.headers().get(AUTHORIZATION).map(|v| v.as_bytes()))
                .await
        };
        if verdict == Verdict::Busy {
            let mut r = full(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain; charset=utf-8",
                "busy: too many credentials are waiting to be checked; try again\n",
            );
            r.headers_mut()
                .insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("1"));
            return Ok(r);
        }
        if verdict == Verdict::Denied {
            let mut r = full(
                StatusCode::UNAUTHORIZED,
                "text/plain; charset=utf-8",
                "unauthorized: give the user and password of basic_auth_users in the web config\n",
            );
            r.headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Basic"));
            return Ok(r);
        }
    }
    if let Some(r) = not_ready(&app, req.uri().path()) {
        return Ok(r);
    }
    let gzip = app.options.compression && accepts_gzip(req.headers());
    Ok(match req.uri().path() {
        p if p == app.options.telemetry_path => {
            let format = crate::exposition::negotiate(
                req.headers().get_all(ACCEPT).iter().map(|v| v.as_bytes()),
            );
            metrics(&app, &conn, head, gzip, format).await
        }
        "/" => full(
            StatusCode::OK,
            "text/html; charset=utf-8",
            LANDING.replace("VERSION", BUILD_VERSION).replace(
                "METRICS",
                app.options.telemetry_path.trim_start_matches('/'),
            ),
        ),
        "/healthz" => full(StatusCode::OK, "text/plain; charset=utf-8", "ok"),
        _ => full(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found: try /metrics\n",
        ),
    })
}

/// Completes when the connection's response in flight is past its send
/// deadline.
async fn send_watchdog(app: &App, in_flight: &AtomicU64) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let deadline = in_flight.load(Ordering::Acquire);
        if deadline != 0 && app.clock_ms() > deadline {
            return;
        }
    }
}

/// Serves one accepted connection (plain or TLS) until it ends, or until its
/// reader is past the send deadline.
async fn serve_conn<S>(
    app: Arc<App>,
    http: &http1::Builder,
    watcher: hyper_util::server::graceful::Watcher,
    stream: S,
    peer: std::net::SocketAddr,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let state = Arc::new(Conn {
        in_flight: Arc::new(AtomicU64::new(0)),
    });
    let in_flight = state.in_flight.clone();
    let app2 = app.clone();
    let svc = service_fn(move |req| route(req, app.clone(), state.clone()));
    let conn = watcher.watch(http.serve_connection(TokioIo::new(stream), svc));
    tokio::select! {
        r = conn => if let Err(e) = r {
            crate::debug!("connection ended with an error", peer = peer, err = e);
        },
        () = send_watchdog(&app2, &in_flight) => {
            crate::warn!(
                "a scraper took too long to read /metrics; connection closed",
                peer = peer,
                deadline_s = SEND_DEADLINE.as_secs()
            );
        }
    }
}

/// How the server answers; [`Options::default`] is the flags' defaults.
#[derive(Clone, Debug)]
pub struct Options {
    /// gzip a scrape for a client that accepts it (`--web.disable-compression`
    /// turns it off).
    pub compression: bool,
    /// `_created` lines for counters in OpenMetrics
    /// (`--web.openmetrics.created-samples`).
    pub created_samples: bool,
    /// Where the metrics are served (`--web.telemetry-path`).
    pub telemetry_path: String,
    /// TLS and basic auth (`--web.config.file`); `None`: plain HTTP, open.
    pub web: Option<Arc<Web>>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            compression: true,
            created_samples: false,
            telemetry_path: "/metrics".into(),
            web: None,
        }
    }
}

/// [`serve_with`] the default [`Options`].
pub async fn serve(
    listener: TcpListener,
    exporter: Arc<Exporter>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    serve_with(listener, exporter, Options::default(), shutdown).await
}

/// [`serve_on`] one listener.
pub async fn serve_with(
    listener: TcpListener,
    exporter: Arc<Exporter>,
    options: Options,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    serve_on(vec![listener], exporter, options, shutdown).await
}

/// The next connection on any of `listeners`.
async fn accept_any(
    listeners: &[TcpListener],
) -> std::io::Result<(tokio::net::TcpStream, std::net::SocketAddr)> {
    std::future::poll_fn(|cx| {
        for l in listeners {
            if let std::task::Poll::Ready(r) = l.poll_accept(cx) {
                return std::task::Poll::Ready(r);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// Serves every listener (`--web.listen-address`, repeated) until
/// `shutdown` completes, then gives open connections [`SHUTDOWN_GRACE`] to
/// finish. The listeners share the connection limits.
pub async fn serve_on(
    listeners: Vec<TcpListener>,
    exporter: Arc<Exporter>,
    options: Options,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    // Kept compressed when most scrapes will want it so (Prometheus asks
    // for gzip): see crate::deflate.
    let renderer = |format| {
        let r = if options.compression {
            Renderer::compressed()
        } else {
            Renderer::new()
        };
        // A counter without a creation time of its own counts since the
        // exporter started: see docs/metrics.md.
        let created = if options.created_samples {
            Created::On {
                since: crate::process::start_time(),
            }
        } else {
            Created::Off
        };
        Mutex::new(r.with_format(format, created))
    };
    let renderer = PerFormat {
        text: renderer(Format::Text),
        openmetrics: renderer(Format::OpenMetrics),
    };
    let app = Arc::new(App {
        options,
        exporter,
        scrape: Semaphore::new(1),
        last: PerFormat {
            text: Mutex::new(None),
            openmetrics: Mutex::new(None),
        },
        renderer,
        started: Instant::now(),
        requests: Requests::default(),
    });
    let per_ip = Arc::new(PerIp::default());
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
            r = accept_any(&listeners) => match r {
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
        // A response goes out whole as soon as it is written: with Nagle's
        // algorithm its last, partial segment can wait for the client's
        // delayed ACK of the one before (up to 40 ms on Linux), which is
        // most of a small scrape. Go's net/http, and so node_exporter, sets
        // it too.
        let _ = stream.set_nodelay(true);
        let Some(ip_slot) = PerIp::take(&per_ip, peer.ip()) else {
            crate::debug!(
                "connection refused: its address holds the most connections allowed",
                peer = peer,
                max = MAX_CONNECTIONS_PER_IP
            );
            drop(stream);
            continue;
        };
        // The TLS config in force when the connection arrives: a reload
        // applies from the next connection on.
        let tls = app
            .options
            .web
            .as_ref()
            .and_then(|w| w.config().tls().cloned());
        let (app, http, watcher) = (app.clone(), http.clone(), graceful.watcher());
        tokio::spawn(async move {
            match tls {
                None => serve_conn(app, &http, watcher, stream, peer).await,
                Some(tls) => {
                    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
                    // The handshake gets the time the headers get: a client
                    // that connects and says nothing holds a slot no longer.
                    match tokio::time::timeout(HEADER_READ_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls_stream)) => {
                            serve_conn(app, &http, watcher, tls_stream, peer).await
                        }
                        Ok(Err(e)) => {
                            crate::debug!("TLS handshake failed", peer = peer, err = e);
                        }
                        Err(_) => crate::debug!("TLS handshake timed out", peer = peer),
                    }
                }
            }
            drop(ip_slot);
            drop(permit);
        });
    }
    drop(listeners);
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
    use crate::deflate::Piece;

    /// What a client receives for `parts`, and the length announced.
    async fn received(parts: Option<Wire>) -> (Vec<u8>, u64) {
        use hyper::body::Body as _;
        let b = RenderedBody::new(parts.expect("a body"), Arc::default(), 1);
        let announced = b.size_hint().exact().expect("an exact length");
        let got = b.collect().await.unwrap().to_bytes().to_vec();
        (got, announced)
    }

    #[tokio::test]
    async fn kept_pieces_go_out_as_one_gzip_member_or_as_text() {
        let texts: Vec<Vec<u8>> = (0..7)
            .map(|p| {
                (0..(p * 3000))
                    .flat_map(|i| format!("m{{volume_id=\"{p}-{i:08x}\"}} {i}\n").into_bytes())
                    .collect()
            })
            .collect();
        let whole = texts.concat();
        let mut d = crate::deflate::Deflater::default();
        let compressed = Rendered::new(texts.iter().map(|t| d.piece(t)).collect(), true);
        let (z, announced) = received(compressed.gzip()).await;
        assert_eq!(z.len() as u64, announced);
        let mut back = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&z[..]), &mut back).unwrap();
        assert_eq!(back, whole);
        assert!(z.len() * 4 < whole.len());
        // A client without gzip, served from the compressed pieces; the
        // text is inflated once for every such client.
        let text = compressed.text().unwrap();
        assert_eq!(
            received(Some(text.clone())).await,
            (whole.clone(), whole.len() as u64)
        );
        assert!(Arc::ptr_eq(&text, &compressed.text().unwrap()));
        // Text kept as text goes out as it is, and never as gzip.
        let plain = Rendered::new(
            texts
                .iter()
                .map(|t| Piece::plain(t.clone().into()))
                .collect(),
            false,
        );
        assert!(plain.gzip().is_none());
        assert_eq!(
            received(plain.text().ok()).await,
            (whole.clone(), whole.len() as u64)
        );
    }

    #[test]
    fn accept_encoding_is_parsed_with_q_values() {
        let h = |v: &'static str| {
            let mut m = hyper::HeaderMap::new();
            m.insert(ACCEPT_ENCODING, HeaderValue::from_static(v));
            accepts_gzip(&m)
        };
        assert!(h("gzip"));
        assert!(h("deflate, gzip;q=0.5"));
        assert!(h("*"));
        assert!(!h("gzip;q=0"));
        assert!(!h("identity"));
        assert!(!h("gzipx"));
        assert!(!accepts_gzip(&hyper::HeaderMap::new()));
    }
}
