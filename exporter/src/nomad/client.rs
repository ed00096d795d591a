//! Requests to Nomad's HTTP API: one HTTP/1.1 connection per request
//! (hyper's client connection over TCP, rustls or a Unix socket), the
//! whole exchange under one deadline, the answer's body bounded. The
//! exporter asks Nomad a few things a minute at most; a pool would keep a
//! connection to the agent open for nothing.
//!
//! Every request is counted by endpoint and outcome, and the last one
//! decides whether Nomad is up ([`super::status::Status`]), so a refusal
//! or an agent that went away shows in metrics and in one log line.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};

use super::api::Endpoint;
use super::settings::{Address, Settings};
use super::status::Status;

/// The largest answer read: a host-volume list of ten thousand volumes is
/// a few MiB.
const MAX_BODY: usize = 32 << 20;

/// What a request came to when Nomad did not answer as asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// No connection (refused, no route, no such socket).
    Unreachable(String),
    /// No answer within the timeout.
    Timeout(Duration),
    /// The TLS handshake failed (certificate, name, CA).
    Tls(String),
    /// An answer that is not HTTP, or cut short.
    Protocol(String),
    /// Nomad refused the token (401, 403).
    Refused { status: u16, body: String },
    /// Any other status than those the caller takes.
    Status { status: u16, body: String },
    /// A body that is not the JSON Nomad's API types make.
    Decode(String),
}

impl Failure {
    /// The `code` label: the HTTP status, or what stopped the exchange.
    pub fn code(&self) -> String {
        match self {
            Failure::Unreachable(_) => "unreachable".into(),
            Failure::Timeout(_) => "timeout".into(),
            Failure::Tls(_) => "tls".into(),
            Failure::Protocol(_) => "protocol".into(),
            Failure::Refused { status, .. } | Failure::Status { status, .. } => status.to_string(),
            Failure::Decode(_) => "decode".into(),
        }
    }

    /// The kind, for logging a change of state once.
    pub fn kind(&self) -> &'static str {
        match self {
            Failure::Unreachable(_) | Failure::Timeout(_) | Failure::Tls(_) => "unreachable",
            Failure::Refused { .. } => "refused",
            Failure::Protocol(_) | Failure::Status { .. } | Failure::Decode(_) => "error",
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Unreachable(e) => write!(f, "cannot connect: {e}"),
            Failure::Timeout(d) => write!(
                f,
                "no answer within {:.1}s (--nomad.timeout)",
                d.as_secs_f64()
            ),
            Failure::Tls(e) => write!(f, "TLS: {e}"),
            Failure::Protocol(e) => write!(f, "not an HTTP answer: {e}"),
            Failure::Refused { status, body } => write!(f, "refused ({status} {})", body.trim()),
            Failure::Status { status, body } => write!(f, "answered {status} {}", body.trim()),
            Failure::Decode(e) => write!(f, "an answer that is not Nomad's: {e}"),
        }
    }
}

/// An answer with one of the statuses the caller takes.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Bytes,
    /// `X-Nomad-NextToken`: a paginated list's next page.
    pub next_token: Option<String>,
}

impl Answer {
    /// The body as `T`.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, Failure> {
        serde_json::from_slice(&self.body).map_err(|e| Failure::Decode(e.to_string()))
    }
}

/// A client of one Nomad agent.
pub struct Client {
    settings: Settings,
    tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
    pub status: Arc<Status>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("addr", &self.settings.addr)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client of `settings`, its TLS files read and checked now.
    pub fn new(settings: Settings, status: Arc<Status>) -> Result<Client, String> {
        let tls = match &settings.addr {
            Address::Tcp { tls: true, .. } => Some(tls_config(&settings)?),
            _ => None,
        };
        Ok(Client {
            settings,
            tls,
            status,
        })
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// `GET path` (with its query, already encoded).
    pub async fn get(
        &self,
        endpoint: Endpoint,
        path: &str,
        accept: &[u16],
    ) -> Result<Answer, Failure> {
        self.request(endpoint, Method::GET, path, None, accept)
            .await
    }

    /// `POST path` with a JSON body.
    pub async fn post(
        &self,
        endpoint: Endpoint,
        path: &str,
        body: Vec<u8>,
        accept: &[u16],
    ) -> Result<Answer, Failure> {
        self.request(endpoint, Method::POST, path, Some(body), accept)
            .await
    }

    /// One request, counted and noted in [`Status`]; `accept` lists the
    /// statuses that are answers (200, and 404 where "no such thing" is
    /// one).
    async fn request(
        &self,
        endpoint: Endpoint,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        accept: &[u16],
    ) -> Result<Answer, Failure> {
        let timeout = self.settings.timeout;
        let result = match tokio::time::timeout(timeout, self.exchange(method, path, body)).await {
            Ok(Ok((status, body, next_token))) => {
                if accept.contains(&status) {
                    Ok(Answer {
                        status,
                        body,
                        next_token,
                    })
                } else {
                    let text = String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
                    if status == 401 || status == 403 {
                        Err(Failure::Refused { status, body: text })
                    } else {
                        Err(Failure::Status { status, body: text })
                    }
                }
            }
            Ok(Err(f)) => Err(f),
            Err(_) => Err(Failure::Timeout(timeout)),
        };
        let code = match &result {
            Ok(a) => a.status.to_string(),
            Err(f) => f.code(),
        };
        self.status.counted(endpoint, &code);
        match &result {
            Ok(_) => self.status.answered(&self.settings.addr),
            Err(f) => self.status.failed(&self.settings.addr, endpoint, f),
        }
        result
    }

    /// The path with Nomad's query parameters for region and namespace
    /// appended (as its Go client adds them), unless `path` sets them.
    fn target(&self, path: &str) -> String {
        let mut out = path.to_string();
        let mut add = |key: &str, value: &Option<String>| {
            if let Some(v) = value {
                if !out.contains(&format!("{key}=")) {
                    out.push(if out.contains('?') { '&' } else { '?' });
                    out.push_str(&format!("{key}={v}"));
                }
            }
        };
        add("region", &self.settings.region);
        add("namespace", &self.settings.namespace);
        out
    }

    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Bytes, Option<String>), Failure> {
        let addr = &self.settings.addr;
        let host = match addr {
            Address::Tcp { host, port, .. } => format!("{host}:{port}"),
            Address::Unix(_) => "localhost".to_string(),
        };
        let mut req = Request::builder()
            .method(method)
            .uri(self.target(path))
            .header(hyper::header::HOST, host)
            .header(
                hyper::header::USER_AGENT,
                concat!("prjquota-exporter/", env!("CARGO_PKG_VERSION")),
            )
            .header(hyper::header::CONNECTION, "close");
        if let Some(t) = &self.settings.token {
            req = req.header("X-Nomad-Token", t.as_str());
        }
        if body.is_some() {
            req = req.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| Failure::Protocol(e.to_string()))?;
        match addr {
            Address::Unix(path) => {
                let s = tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(|e| Failure::Unreachable(format!("{}: {e}", path.display())))?;
                send(s, req).await
            }
            Address::Tcp { host, port, .. } => {
                let bare = host.trim_start_matches('[').trim_end_matches(']');
                let s = tokio::net::TcpStream::connect((bare, *port))
                    .await
                    .map_err(|e| Failure::Unreachable(format!("{addr}: {e}")))?;
                let _ = s.set_nodelay(true);
                match &self.tls {
                    None => send(s, req).await,
                    Some((config, name)) => {
                        let s = tokio_rustls::TlsConnector::from(config.clone())
                            .connect(name.clone(), s)
                            .await
                            .map_err(|e| Failure::Tls(format!("{addr}: {e}")))?;
                        send(s, req).await
                    }
                }
            }
        }
    }
}

async fn send<IO>(
    io: IO,
    req: Request<Full<Bytes>>,
) -> Result<(u16, Bytes, Option<String>), Failure>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| Failure::Protocol(e.to_string()))?;
    // The connection is driven beside the request and dropped with it
    // (the request's deadline drops both).
    let driver = async move {
        let _ = conn.await;
    };
    let exchange = async move {
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| Failure::Protocol(e.to_string()))?;
        let status: StatusCode = resp.status();
        let next_token = resp
            .headers()
            .get("X-Nomad-NextToken")
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map(str::to_string);
        let body = Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| Failure::Protocol(format!("reading the body: {e}")))?
            .to_bytes();
        Ok((status.as_u16(), body, next_token))
    };
    tokio::pin!(driver);
    tokio::pin!(exchange);
    tokio::select! {
        r = &mut exchange => r,
        // The connection ended first: the exchange finishes with what it
        // got, or fails saying so.
        () = &mut driver => exchange.await,
    }
}

/// The rustls configuration of an `https://` address: the CA given (or the
/// system's bundle), the client certificate if any, and the server name
/// to verify (`--nomad.tls-server-name`, else the address's host).
fn tls_config(s: &Settings) -> Result<(Arc<rustls::ClientConfig>, ServerName<'static>), String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    let (ca_file, what) = match &s.tls.ca_cert {
        Some(f) => (f.clone(), "--nomad.ca-cert/NOMAD_CACERT"),
        None => (
            SYSTEM_BUNDLES
                .iter()
                .map(std::path::PathBuf::from)
                .find(|p| p.is_file())
                .ok_or_else(|| {
                    format!(
                        "{} is https but no CA is given and the system has no CA bundle ({}): give \
                         Nomad's CA with --nomad.ca-cert or NOMAD_CACERT",
                        s.addr,
                        SYSTEM_BUNDLES.join(", ")
                    )
                })?,
            "the system's CA bundle",
        ),
    };
    for cert in read_certs(&ca_file, what)? {
        roots
            .add(cert)
            .map_err(|e| format!("{what} {}: {e}", ca_file.display()))?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let config = match &s.tls.client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = read_certs(cert, "--nomad.client-cert/NOMAD_CLIENT_CERT")?;
            let key_pem = read_pem(key, "--nomad.client-key/NOMAD_CLIENT_KEY")?;
            let key_der = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
                format!(
                    "--nomad.client-key/NOMAD_CLIENT_KEY {}: not a PEM private key: {e}",
                    key.display()
                )
            })?;
            builder.with_client_auth_cert(chain, key_der).map_err(|e| {
                format!(
                    "the client certificate {} and key {} do not go together: {e}",
                    cert.display(),
                    key.display()
                )
            })?
        }
    };
    let name_text = s
        .tls
        .server_name
        .clone()
        .unwrap_or_else(|| s.addr.host().to_string());
    let name = ServerName::try_from(name_text.clone()).map_err(|e| {
        format!("{name_text:?} is not a name to verify Nomad's certificate for (--nomad.tls-server-name/NOMAD_TLS_SERVER_NAME): {e}")
    })?;
    Ok((Arc::new(config), name))
}

/// Where Debian and the RPM family keep the system's CA bundle.
const SYSTEM_BUNDLES: [&str; 2] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
];

fn read_pem(file: &std::path::Path, what: &str) -> Result<Vec<u8>, String> {
    let stakes = "decides whom prjquota-exporter takes for Nomad";
    match prjquota_core::trusted_file::read(file, 1 << 20, stakes) {
        Ok(Some(b)) => Ok(b),
        Ok(None) => Err(format!("{what} {}: it does not exist", file.display())),
        Err(prjquota_core::trusted_file::Refused::Read(e)) => {
            Err(format!("{what} {}: cannot read it: {e}", file.display()))
        }
        Err(prjquota_core::trusted_file::Refused::Unsafe(why)) => {
            Err(format!("{what} {}: refused: {why}", file.display()))
        }
    }
}

fn read_certs(file: &std::path::Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read_pem(file, what)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{what} {}: not PEM certificates: {e}", file.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{what} {}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            file.display()
        ));
    }
    Ok(certs)
}

/// A client of a stand-in agent, for the nomad modules' tests.
#[cfg(test)]
pub(crate) fn client_of(agent: &prjquota_vmtests::nomad_api::Agent) -> Client {
    use super::settings::{Flags, Settings};
    let settings = Settings::resolve(
        &Flags {
            addr: Some(agent.url()),
            timeout: Duration::from_secs(5),
            ..Flags::default()
        },
        |_| None,
    )
    .expect("a stand-in agent's settings");
    Client::new(settings, Arc::new(super::Status::new())).expect("a stand-in agent's client")
}
