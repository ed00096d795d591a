//! `--web.config.file`: TLS and basic auth, read from exporter-toolkit's web
//! configuration file (the YAML node_exporter and Prometheus itself read), so
//! one file and one habit serve every exporter on a node.
//!
//! The file is read at start-up (a bad one stops the exporter) and again on
//! SIGHUP: a good reload applies to connections accepted after it, a bad one
//! keeps the configuration in force, logs why and sets
//! `prjquota_exporter_web_config_last_reload_successful` to 0. Unlike
//! exporter-toolkit, which re-reads the file on every request and
//! connection, nothing is read from disk per request: a scrape never waits
//! for a filesystem, and a half-written certificate during rotation cannot
//! fail handshakes.
//!
//! `http_server_config.headers` adds exporter-toolkit's security headers to
//! every answer (the same five names, the same allowed values); `http2`
//! is accepted either way, as only HTTP/1.1 is served. `cipher_suites` and
//! `curve_preferences` ([`crypto`]) and `client_allowed_sans`
//! ([`client_sans`]) are kept exactly or the file is refused. `rate_limit`,
//! which this exporter does not implement, is refused by name rather than
//! ignored: a file that asks for a limit must not be served without it.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use prjquota_core::trusted_file;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use serde::Deserialize;
use tokio::sync::Semaphore;

use hyper::header::{HeaderName, HeaderValue};

use crate::exposition::Family;

mod client_sans;
mod crypto;

/// A web config that cannot be used: the file, the field (dotted path, empty
/// for the file as a whole) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub file: PathBuf,
    pub field: String,
    pub message: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "web config {}: ", self.file.display())?;
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

// The file as written. `deny_unknown_fields` everywhere, as exporter-toolkit
// unmarshals strictly: a misspelt `client_auth_typ` must not silently mean
// "no client certificates".
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    tls_server_config: Option<TlsSpec>,
    http_server_config: Option<HttpSpec>,
    basic_auth_users: Option<HashMap<String, String>>,
    rate_limit: Option<serde_norway::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsSpec {
    cert: Option<String>,
    key: Option<String>,
    client_ca: Option<String>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    client_auth_type: Option<String>,
    client_ca_file: Option<PathBuf>,
    min_version: Option<String>,
    max_version: Option<String>,
    prefer_server_cipher_suites: Option<bool>,
    cipher_suites: Option<Vec<String>>,
    curve_preferences: Option<Vec<String>>,
    client_allowed_sans: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpSpec {
    // Only HTTP/1.1 is served, so `http2: false` is already true and
    // `http2: true` (the toolkit's default) asks for nothing a scraper needs.
    #[allow(dead_code)]
    http2: Option<bool>,
    headers: Option<HashMap<String, String>>,
}

/// The headers `http_server_config.headers` may set, and the values each
/// takes (`None`: any), as exporter-toolkit allows them: names exactly as
/// written here, enumerated values exactly.
const ALLOWED_HEADERS: [(&str, Option<&[&str]>); 5] = [
    ("Strict-Transport-Security", None),
    ("X-Content-Type-Options", Some(&["nosniff"])),
    ("X-Frame-Options", Some(&["deny", "sameorigin"])),
    ("X-XSS-Protection", None),
    ("Content-Security-Policy", None),
];

/// `http_server_config.headers`, checked as exporter-toolkit checks them,
/// sorted by name.
fn extra_headers(
    map: &HashMap<String, String>,
) -> Result<Vec<(HeaderName, HeaderValue)>, FieldError> {
    let mut out = Vec::new();
    for (name, value) in map {
        let field = format!("http_server_config.headers.{name}");
        let Some((_, allowed)) = ALLOWED_HEADERS.iter().find(|(n, _)| n == name) else {
            return Err((
                field,
                format!(
                    "this header cannot be configured; exporter-toolkit's format allows {}",
                    ALLOWED_HEADERS.map(|(n, _)| n).join(", ")
                ),
            ));
        };
        if let Some(values) = allowed {
            if !values.contains(&value.as_str()) {
                return Err((field, format!("{value:?} is not one of {values:?}")));
            }
        }
        let header_value = HeaderValue::from_str(value).map_err(|_| {
            (
                field.clone(),
                format!("{value:?} is not a valid HTTP header value (control characters?)"),
            )
        })?;
        let header_name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| (field, "not a valid HTTP header name".to_string()))?;
        out.push((header_name, header_value));
    }
    out.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    Ok(out)
}

/// A loaded, checked web config.
pub struct WebConfig {
    /// `None`: plain HTTP.
    tls: Option<Arc<rustls::ServerConfig>>,
    /// User name to bcrypt hash; empty: no basic auth.
    users: HashMap<String, String>,
    /// What an unknown user's password is checked against: a hash of a
    /// random secret at the highest cost of `users`, so that an unknown
    /// name costs as long as a known one and timing tells no names.
    dummy: String,
    /// `http_server_config.headers`, set on every answer.
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl fmt::Debug for WebConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut users: Vec<_> = self.users.keys().collect();
        users.sort();
        f.debug_struct("WebConfig")
            .field("tls", &self.tls.is_some())
            .field("users", &users)
            .finish()
    }
}

impl WebConfig {
    /// Reads and checks `file`, with the certificates and keys it names
    /// (relative paths are relative to the file's directory, as in
    /// exporter-toolkit).
    pub fn load(file: &Path) -> Result<WebConfig, Error> {
        let err = |field: &str, message: String| Error {
            file: file.to_path_buf(),
            field: field.to_string(),
            message,
        };
        let text = read_trusted(file).map_err(|m| err("", m))?;
        // An empty file is a valid, empty config, as in exporter-toolkit.
        let spec: FileSpec = if text.trim().is_empty() {
            FileSpec::default()
        } else {
            serde_norway::from_str(&text).map_err(|e| yaml_error(file, &e))?
        };
        if spec.rate_limit.is_some() {
            return Err(err("rate_limit", unsupported()));
        }
        let headers = match spec
            .http_server_config
            .as_ref()
            .and_then(|h| h.headers.as_ref())
        {
            Some(map) => extra_headers(map).map_err(|(field, m)| err(&field, m))?,
            None => Vec::new(),
        };
        let dir = file.parent().unwrap_or(Path::new("."));
        let tls = match spec.tls_server_config {
            Some(t) => tls_config(&t, dir).map_err(|(field, m)| err(&field, m))?,
            None => None,
        };
        let mut users = HashMap::new();
        for (user, hash) in spec.basic_auth_users.unwrap_or_default() {
            if let Err(e) = hash.parse::<bcrypt::HashParts>() {
                return Err(err(
                    &format!("basic_auth_users.{user}"),
                    format!(
                        "not a bcrypt hash ({e}); make one with `htpasswd -nBC 10 \"\" | tr -d ':\\n'`"
                    ),
                ));
            }
            users.insert(user, hash);
        }
        let dummy = dummy_hash(&users);
        Ok(WebConfig {
            tls,
            users,
            dummy,
            headers,
        })
    }

    pub fn tls(&self) -> Option<&Arc<rustls::ServerConfig>> {
        self.tls.as_ref()
    }

    pub fn basic_auth(&self) -> bool {
        !self.users.is_empty()
    }

    /// The headers every answer carries (`http_server_config.headers`).
    pub fn headers(&self) -> &[(HeaderName, HeaderValue)] {
        &self.headers
    }
}

fn unsupported() -> String {
    "exporter-toolkit's format has it, but prjquota-exporter does not implement it; remove it \
     (a setting that is not applied is refused rather than ignored)"
        .into()
}

/// serde's error names the field; the location says where in the file.
fn yaml_error(file: &Path, e: &serde_norway::Error) -> Error {
    let text = e.to_string();
    // serde_norway prefixes the dotted path of the value at fault ("a.b: …");
    // split it off so every error reads file, field, message.
    let (field, message) = match text.split_once(": ") {
        Some((path, rest))
            if !path.contains(' ') && path.chars().all(|c| c != '`' && c != '\'') =>
        {
            (path.to_string(), rest.to_string())
        }
        _ => (String::new(), text),
    };
    Error {
        file: file.to_path_buf(),
        field,
        message,
    }
}

fn provider() -> CryptoProvider {
    rustls::crypto::ring::default_provider()
}

type FieldError = (String, String);

fn field_err(field: &str, message: impl Into<String>) -> FieldError {
    (format!("tls_server_config.{field}"), message.into())
}

/// Reads an inline PEM value or a file (relative to `dir`); the field named
/// is the one that was set.
fn pem_source(
    inline: &Option<String>,
    inline_name: &str,
    path: &Option<PathBuf>,
    path_name: &str,
    dir: &Path,
) -> Result<Option<(Vec<u8>, String)>, FieldError> {
    match (inline, path) {
        (Some(_), Some(_)) => Err(field_err(
            path_name,
            format!("give either {inline_name} (inline PEM) or {path_name}, not both"),
        )),
        (Some(text), None) => Ok(Some((text.clone().into_bytes(), inline_name.to_string()))),
        (None, Some(p)) if p.as_os_str().is_empty() => Err(field_err(path_name, "is empty")),
        (None, Some(p)) => {
            let full = dir.join(p);
            let bytes = trusted_file::read(&full, MAX_FILE_BYTES, STAKES)
                .map_err(|e| field_err(path_name, refused(&full, e)))?
                .ok_or_else(|| {
                    field_err(
                        path_name,
                        format!("cannot read {}: it does not exist", full.display()),
                    )
                })?;
            Ok(Some((bytes, path_name.to_string())))
        }
        (None, None) => Ok(None),
    }
}

/// What whoever can write the web config or a file it names decides.
const STAKES: &str = "decides who may scrape the exporter and which certificate it shows";

/// Largest web config, certificate or key read.
const MAX_FILE_BYTES: u64 = 1 << 20;

fn refused(path: &Path, e: trusted_file::Refused) -> String {
    match e {
        trusted_file::Refused::Read(e) => format!("cannot read {}: {e}", path.display()),
        trusted_file::Refused::Unsafe(why) => format!("refusing {}: {why}", path.display()),
    }
}

/// The web config's text, taken only as [`trusted_file::read`] allows.
fn read_trusted(file: &Path) -> Result<String, String> {
    let bytes = trusted_file::read(file, MAX_FILE_BYTES, STAKES)
        .map_err(|e| {
            format!(
                "{}; fix it or the path given to --web.config.file",
                refused(file, e)
            )
        })?
        .ok_or_else(|| {
            "cannot read it: it does not exist; fix the path given to --web.config.file".to_string()
        })?;
    String::from_utf8(bytes).map_err(|_| "it is not UTF-8 text".to_string())
}

fn certificates(pem: &[u8], field: &str) -> Result<Vec<CertificateDer<'static>>, FieldError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| field_err(field, format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(field_err(
            field,
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
        ));
    }
    Ok(certs)
}

fn tls_version(
    v: &Option<String>,
    field: &str,
) -> Result<Option<&'static rustls::SupportedProtocolVersion>, FieldError> {
    match v.as_deref() {
        None => Ok(None),
        Some("TLS12") => Ok(Some(&rustls::version::TLS12)),
        Some("TLS13") => Ok(Some(&rustls::version::TLS13)),
        Some(old @ ("TLS10" | "TLS11")) => Err(field_err(
            field,
            format!(
                "{old} is not offered: prjquota-exporter speaks TLS 1.2 and 1.3 only; use TLS12"
            ),
        )),
        Some(other) => Err(field_err(
            field,
            format!("unknown TLS version {other:?}; use TLS12 or TLS13"),
        )),
    }
}

/// The protocol versions from `min` to `max`, newest first.
fn versions(
    min: &'static rustls::SupportedProtocolVersion,
    max: &'static rustls::SupportedProtocolVersion,
) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, FieldError> {
    match (min.version, max.version) {
        (a, b) if a == b => Ok(vec![min]),
        (rustls::ProtocolVersion::TLSv1_2, rustls::ProtocolVersion::TLSv1_3) => {
            Ok(vec![&rustls::version::TLS13, &rustls::version::TLS12])
        }
        _ => Err(field_err(
            "max_version",
            "is below min_version; raise it or lower min_version",
        )),
    }
}

/// `verifier` with `client_allowed_sans` checked after it.
fn allowed_sans(
    verifier: Arc<dyn ClientCertVerifier>,
    allowed: &[String],
    auth: &str,
) -> Result<Arc<dyn ClientCertVerifier>, FieldError> {
    // As exporter-toolkit: a client that may withhold its certificate
    // leaves nothing to match, so the list would be a promise not kept.
    if !matches!(
        auth,
        "RequireAndVerifyClientCert" | "RequireAnyClientCert" | "RequireClientCert"
    ) {
        return Err(field_err(
            "client_allowed_sans",
            format!(
                "needs every client to show a certificate, but client_auth_type is {auth}; set \
                 client_auth_type: RequireAndVerifyClientCert (with client_ca_file), or remove \
                 client_allowed_sans"
            ),
        ));
    }
    if allowed.is_empty() {
        return Err(field_err(
            "client_allowed_sans",
            "is empty, so no client would be served; list the DNS, IP, email or URI SANs of \
             the clients to serve, or remove it",
        ));
    }
    if let Some(i) = allowed.iter().position(|s| s.trim().is_empty()) {
        return Err(field_err(
            &format!("client_allowed_sans[{i}]"),
            "is empty, and no certificate has an empty SAN; remove it",
        ));
    }
    Ok(Arc::new(client_sans::AllowedSans::new(
        verifier,
        allowed.to_vec(),
    )))
}

/// The rustls server config the spec describes; `None` when it sets no TLS
/// field at all (exporter-toolkit's "TLS config is not present").
fn tls_config(t: &TlsSpec, dir: &Path) -> Result<Option<Arc<rustls::ServerConfig>>, FieldError> {
    let min = tls_version(&t.min_version, "min_version")?.unwrap_or(&rustls::version::TLS12);
    let max = tls_version(&t.max_version, "max_version")?.unwrap_or(&rustls::version::TLS13);
    let enabled = t.cert.is_some()
        || t.cert_file.is_some()
        || t.key.is_some()
        || t.key_file.is_some()
        || t.client_ca.is_some()
        || t.client_ca_file.is_some()
        || t.client_auth_type.is_some();
    if !enabled {
        return Ok(None);
    }
    let Some((cert_pem, cert_field)) = pem_source(&t.cert, "cert", &t.cert_file, "cert_file", dir)?
    else {
        return Err(field_err(
            "cert_file",
            "TLS is configured but no certificate is: set cert_file (or cert)",
        ));
    };
    let Some((key_pem, key_field)) = pem_source(&t.key, "key", &t.key_file, "key_file", dir)?
    else {
        return Err(field_err(
            "key_file",
            "TLS is configured but no private key is: set key_file (or key)",
        ));
    };
    let chain = certificates(&cert_pem, &cert_field)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        field_err(
            &key_field,
            format!("no PEM private key (PKCS#8, PKCS#1 or SEC1) in it: {e}"),
        )
    })?;

    let client_ca = pem_source(
        &t.client_ca,
        "client_ca",
        &t.client_ca_file,
        "client_ca_file",
        dir,
    )?;
    let versions = versions(min, max)?;
    let provider = Arc::new(crypto::narrow(
        provider(),
        t.cipher_suites.as_deref(),
        t.curve_preferences.as_deref(),
        &versions,
    )?);
    let auth = t.client_auth_type.as_deref().unwrap_or("NoClientCert");
    let roots = |required_by: &str| -> Result<Arc<RootCertStore>, FieldError> {
        let Some((pem, field)) = &client_ca else {
            return Err(field_err(
                "client_ca_file",
                format!("client_auth_type {required_by} verifies client certificates: set client_ca_file to the CA that signs them"),
            ));
        };
        let mut store = RootCertStore::empty();
        for c in certificates(pem, field)? {
            store
                .add(c)
                .map_err(|e| field_err(field, format!("not a usable CA certificate: {e}")))?;
        }
        Ok(Arc::new(store))
    };
    let verifier: Arc<dyn ClientCertVerifier> = match auth {
        "NoClientCert" => {
            if client_ca.is_some() {
                return Err(field_err(
                    "client_auth_type",
                    "client_ca_file is set but client_auth_type is NoClientCert: set \
                     RequireAndVerifyClientCert to check client certificates, or remove \
                     client_ca_file",
                ));
            }
            Arc::new(rustls::server::NoClientAuth)
        }
        "RequestClientCert" => Arc::new(AnyClientCert {
            mandatory: false,
            provider: provider.clone(),
        }),
        // "RequireClientCert" is the old spelling exporter-toolkit still takes.
        "RequireAnyClientCert" | "RequireClientCert" => Arc::new(AnyClientCert {
            mandatory: true,
            provider: provider.clone(),
        }),
        "VerifyClientCertIfGiven" => {
            WebPkiClientVerifier::builder_with_provider(roots(auth)?, provider.clone())
                .allow_unauthenticated()
                .build()
                .map_err(|e| field_err("client_ca_file", e.to_string()))?
        }
        "RequireAndVerifyClientCert" => {
            WebPkiClientVerifier::builder_with_provider(roots(auth)?, provider.clone())
                .build()
                .map_err(|e| field_err("client_ca_file", e.to_string()))?
        }
        other => {
            return Err(field_err(
                "client_auth_type",
                format!(
                    "unknown value {other:?}; use NoClientCert, RequestClientCert, \
                     RequireAnyClientCert, VerifyClientCertIfGiven or RequireAndVerifyClientCert"
                ),
            ))
        }
    };

    let verifier = match &t.client_allowed_sans {
        None => verifier,
        Some(allowed) => allowed_sans(verifier, allowed, auth)?,
    };
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)
        .map_err(|e| field_err("min_version", e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| {
            field_err(
                &key_field,
                format!("does not go with {cert_field}, or is not a usable key: {e}"),
            )
        })?;
    config.ignore_client_order = t.prefer_server_cipher_suites.unwrap_or(true);
    // HTTP/1.1 only: say so in ALPN rather than leave a client that offers
    // h2 to guess.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some(Arc::new(config)))
}

/// RequestClientCert and RequireAnyClientCert: ask for (or require) a
/// certificate and check that the client holds its key, but trust any
/// issuer, as Go's crypto/tls does for these modes. exporter-toolkit calls
/// them insecure; they are here so a node_exporter file means the same.
#[derive(Debug)]
struct AnyClientCert {
    mandatory: bool,
    provider: Arc<CryptoProvider>,
}

impl ClientCertVerifier for AnyClientCert {
    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Successful verifications remembered, so Prometheus' scrape every 15 s
/// costs one bcrypt per process (and per password change), not one per
/// scrape. More than this many distinct good credentials is not a scraper
/// setup; the set is then cleared, never grown.
const AUTH_CACHE_ENTRIES: usize = 256;

/// The web config in force, its reloads, and basic auth's state.
pub struct Web {
    file: PathBuf,
    current: RwLock<Arc<WebConfig>>,
    /// SHA-256 of (user, hash, password) of credentials that verified, as
    /// exporter-toolkit's cache is keyed on all three: a changed hash or
    /// password never hits. A digest, not the password, is what stays in
    /// memory.
    verified: Mutex<HashSet<[u8; 32]>>,
    /// One bcrypt at a time, as in exporter-toolkit: a burst of wrong
    /// passwords takes one core of the blocking pool, never all of it.
    bcrypt: Arc<Semaphore>,
    /// Credentials waiting for `bcrypt` or in it.
    bcrypt_waiting: Arc<std::sync::atomic::AtomicUsize>,
    reload: Mutex<ReloadState>,
}

/// A place among those waiting for bcrypt, given back on drop.
struct Waiting(Arc<std::sync::atomic::AtomicUsize>);

impl Waiting {
    fn enter(count: &Arc<std::sync::atomic::AtomicUsize>) -> Option<Waiting> {
        use std::sync::atomic::Ordering;
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_BCRYPT_WAITING).then_some(n + 1)
            })
            .ok()
            .map(|_| Waiting(count.clone()))
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

#[derive(Debug, Clone, Copy)]
struct ReloadState {
    successful: bool,
    success_unix: f64,
}

impl fmt::Debug for Web {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Web")
            .field("file", &self.file)
            .field("current", &self.config())
            .finish()
    }
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn reload_families(state: ReloadState) -> Vec<Family> {
    let mut ok = Family::gauge(
        "prjquota_exporter_web_config_last_reload_successful",
        "Whether the last load of --web.config.file (at start-up or on SIGHUP) succeeded; \
         0 means the exporter still serves with the configuration loaded before.",
    );
    ok.plain(if state.successful { 1.0 } else { 0.0 });
    let mut ts = Family::gauge(
        "prjquota_exporter_web_config_last_reload_success_timestamp_seconds",
        "When --web.config.file was last loaded successfully, in seconds since the Unix epoch.",
    );
    ts.plain(state.success_unix);
    vec![ok, ts]
}

/// The families the HTTP layer adds to every scrape when a web config is
/// given, for the dashboards' lint (their values are placeholders).
pub fn catalogue() -> Vec<Family> {
    reload_families(ReloadState {
        successful: true,
        success_unix: 0.0,
    })
}

/// Whether basic auth let a request through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    Denied,
    /// More credentials are waiting for bcrypt than [`MAX_BCRYPT_WAITING`]:
    /// answered at once (503) rather than queued without bound.
    Busy,
}

/// Credentials waiting for (or in) bcrypt at most. One verification takes
/// tens of milliseconds at cost 10; a scraper with a known-good credential
/// is answered from the cache and never waits here.
pub const MAX_BCRYPT_WAITING: usize = 16;

impl Web {
    /// Loads `file` (a start-up error if it is bad).
    pub fn load(file: &Path) -> Result<Web, Error> {
        let config = WebConfig::load(file)?;
        Ok(Web {
            file: file.to_path_buf(),
            current: RwLock::new(Arc::new(config)),
            verified: Mutex::default(),
            bcrypt: Arc::new(Semaphore::new(1)),
            bcrypt_waiting: Arc::default(),
            reload: Mutex::new(ReloadState {
                successful: true,
                success_unix: now_unix(),
            }),
        })
    }

    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The config in force: what new connections and requests use.
    pub fn config(&self) -> Arc<WebConfig> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Re-reads the file (SIGHUP). On success it applies to connections
    /// accepted from now on; on failure the config in force stays and the
    /// error is returned (and counted in the reload metrics). Turning TLS on
    /// or off is refused: a listener that served TLS must never start
    /// answering in plain text because of an edit, so that takes a restart;
    /// so does turning basic auth off, which a file truncated after its TLS
    /// section would do silently.
    pub fn reload(&self) -> Result<(), Error> {
        let result = WebConfig::load(&self.file).and_then(|new| {
            let was_tls = self.config().tls.is_some();
            if was_tls != new.tls.is_some() {
                return Err(Error {
                    file: self.file.clone(),
                    field: "tls_server_config".into(),
                    message: format!(
                        "the reload would turn TLS {}; that takes a restart of the exporter",
                        if was_tls { "off" } else { "on" }
                    ),
                });
            }
            if self.config().basic_auth() && !new.basic_auth() {
                return Err(Error {
                    file: self.file.clone(),
                    field: "basic_auth_users".into(),
                    message: "the reload would turn basic auth off (a file cut short reads this way too); that takes a restart of the exporter".into(),
                });
            }
            Ok(new)
        });
        let mut state = self.reload.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok(new) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(new);
                state.successful = true;
                state.success_unix = now_unix();
                Ok(())
            }
            Err(e) => {
                state.successful = false;
                Err(e)
            }
        }
    }

    /// The reload self-metrics.
    pub fn families(&self) -> Vec<Family> {
        reload_families(*self.reload.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Checks a request's `Authorization` header against basic_auth_users
    /// (always allowed when there are none). A credential not seen before
    /// costs one bcrypt, on the blocking pool; one that verified before
    /// costs a SHA-256.
    pub async fn authorize(&self, authorization: Option<&[u8]>) -> Verdict {
        let config = self.config();
        if config.users.is_empty() {
            return Verdict::Allowed;
        }
        let Some((user, password)) = authorization.and_then(parse_basic) else {
            return Verdict::Denied;
        };
        let known = config.users.get(&user).cloned();
        let key = known.as_ref().map(|hash| cache_key(&user, hash, &password));
        if let Some(key) = &key {
            if self
                .verified
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(key)
            {
                return Verdict::Allowed;
            }
        }
        let Some(_waiting) = Waiting::enter(&self.bcrypt_waiting) else {
            return Verdict::Busy;
        };
        let permit = self
            .bcrypt
            .clone()
            .acquire_owned()
            .await
            .expect("the bcrypt semaphore is never closed");
        // The permit moves into the blocking call: a client that hangs up
        // mid-verification does not free the slot before bcrypt is done.
        let ok = tokio::task::spawn_blocking(move || {
            // An unknown user still costs a bcrypt, so that timing does not
            // tell which user names exist.
            let hash: &str = match &known {
                Some(h) => h,
                None => &config.dummy,
            };
            let ok = bcrypt::non_truncating_verify(password.as_bytes(), hash).unwrap_or(false);
            drop(permit);
            ok && known.is_some()
        })
        .await
        .unwrap_or(false);
        let (true, Some(key)) = (ok, key) else {
            return Verdict::Denied;
        };
        let mut verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
        if verified.len() >= AUTH_CACHE_ENTRIES {
            verified.clear();
        }
        verified.insert(key);
        Verdict::Allowed
    }
}

/// A bcrypt hash of no password anyone knows, at the highest cost among
/// `users`' hashes; empty when there are no users.
fn dummy_hash(users: &HashMap<String, String>) -> String {
    let Some(cost) = users
        .values()
        .filter_map(|h| h.parse::<bcrypt::HashParts>().ok())
        .map(|p| p.get_cost())
        .max()
    else {
        return String::new();
    };
    let mut secret = [0u8; 16];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret);
    bcrypt::hash(secret, cost).unwrap_or_default()
}

fn cache_key(user: &str, hash: &str, password: &str) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    // Lengths first, so ("ab", "c") and ("a", "bc") never share a key.
    for part in [user, hash, password] {
        ctx.update(&(part.len() as u64).to_le_bytes());
        ctx.update(part.as_bytes());
    }
    let mut key = [0u8; 32];
    key.copy_from_slice(ctx.finish().as_ref());
    key
}

/// `Basic base64(user:password)`: the user and password, or `None` for any
/// other scheme or a malformed value.
fn parse_basic(header: &[u8]) -> Option<(String, String)> {
    use base64::Engine;
    let header = std::str::from_utf8(header).ok()?.trim();
    let (scheme, token) = header.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(token.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, password) = decoded.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn temp_dir() -> prjquota_vmtests::temp::TempDir {
        prjquota_vmtests::temp::TempDir::new(&std::env::temp_dir(), "prjq-webcfg-unit", "t")
    }

    fn load_err(text: &str) -> Error {
        let d = temp_dir();
        let f = write(&d, "web.yml", text);
        WebConfig::load(&f).unwrap_err()
    }

    /// exporter-toolkit's rules: five names, exactly as written; two of
    /// them with enumerated values; no control characters.
    #[test]
    fn headers_are_checked_as_exporter_toolkit_checks_them() {
        let d = temp_dir();
        let c = WebConfig::load(&write(
            &d,
            "web.yml",
            "http_server_config:\n  http2: false\n  headers:\n    X-XSS-Protection: '0'\n    \
             Content-Security-Policy: default-src 'none'\n    X-Frame-Options: sameorigin\n",
        ))
        .unwrap();
        let got: Vec<(&str, &str)> = c
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(
            got,
            [
                ("content-security-policy", "default-src 'none'"),
                ("x-frame-options", "sameorigin"),
                ("x-xss-protection", "0"),
            ]
        );
        for (text, field) in [
            ("    Server: x\n", "http_server_config.headers.Server"),
            (
                "    x-frame-options: deny\n",
                "http_server_config.headers.x-frame-options",
            ),
            (
                "    X-Frame-Options: DENY\n",
                "http_server_config.headers.X-Frame-Options",
            ),
            (
                "    X-Content-Type-Options: sniff\n",
                "http_server_config.headers.X-Content-Type-Options",
            ),
            (
                "    Strict-Transport-Security: \"a\\r\\nSet-Cookie: x\"\n",
                "http_server_config.headers.Strict-Transport-Security",
            ),
        ] {
            let e = load_err(&format!("http_server_config:\n  headers:\n{text}"));
            assert_eq!(e.field, field, "{text}: {e}");
        }
        let e = load_err("http_server_config:\n  headers:\n    X-Frame-Options: [deny]\n");
        assert!(e.to_string().contains("headers"), "{e}");
        let c =
            WebConfig::load(&write(&d, "h2.yml", "http_server_config:\n  http2: true\n")).unwrap();
        assert!(c.headers().is_empty());
    }

    #[test]
    fn the_unknown_users_hash_costs_what_the_real_ones_cost() {
        let d = temp_dir();
        let (cheap, dear) = (bcrypt::hash("a", 4).unwrap(), bcrypt::hash("b", 6).unwrap());
        let c = WebConfig::load(&write(
            &d,
            "web.yml",
            &format!("basic_auth_users:\n  a: '{cheap}'\n  b: '{dear}'\n"),
        ))
        .unwrap();
        assert_eq!(c.dummy.parse::<bcrypt::HashParts>().unwrap().get_cost(), 6);
        let c = WebConfig::load(&write(&d, "none.yml", "")).unwrap();
        assert!(c.dummy.is_empty());
    }

    #[test]
    fn a_reload_that_turns_basic_auth_off_is_refused() {
        let d = temp_dir();
        let hash = bcrypt::hash("pw", 4).unwrap();
        let f = write(
            &d,
            "web.yml",
            &format!("basic_auth_users:\n  alice: '{hash}'\n"),
        );
        let web = Web::load(&f).unwrap();
        // Cut short before its users, as a half-written file would be.
        std::fs::write(&f, "tls_server_config: {}\n").unwrap();
        let e = web.reload().unwrap_err();
        assert!(e.message.contains("turn basic auth off"), "{e}");
        assert!(web.config().basic_auth(), "auth was switched off");
    }

    #[test]
    fn a_web_config_others_can_write_or_a_fifo_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let d = temp_dir();
        let f = write(&d, "web.yml", "");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = WebConfig::load(&f).unwrap_err();
        assert!(e.message.contains("writable by every user"), "{e}");
        let fifo = d.join("fifo.yml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // In a thread: a blocking open of a FIFO never returns.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(WebConfig::load(&fifo).map(drop)).unwrap());
        let e = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("loading a FIFO hung")
            .unwrap_err();
        assert!(e.message.contains("a FIFO"), "{e}");
    }

    #[test]
    fn the_bcrypt_queue_has_a_bound() {
        let count = Arc::default();
        let held: Vec<Waiting> = (0..MAX_BCRYPT_WAITING)
            .map(|_| Waiting::enter(&count).expect("a place"))
            .collect();
        assert!(
            Waiting::enter(&count).is_none(),
            "the queue grew past its bound"
        );
        drop(held);
        assert!(Waiting::enter(&count).is_some());
    }

    #[test]
    fn an_empty_file_is_plain_http_without_auth() {
        let d = temp_dir();
        let c = WebConfig::load(&write(&d, "web.yml", "")).unwrap();
        assert!(c.tls().is_none() && !c.basic_auth());
        let c = WebConfig::load(&write(&d, "web2.yml", "basic_auth_users: {}\n")).unwrap();
        assert!(!c.basic_auth());
    }

    #[test]
    fn errors_name_the_file_and_the_field() {
        let e = load_err("tls_server_config:\n  client_auth_typ: NoClientCert\n");
        assert_eq!(e.field, "tls_server_config", "{e}");
        assert!(e.message.contains("client_auth_typ"), "{e}");
        assert!(e.to_string().contains("web.yml"), "{e}");

        let e = load_err("basic_auth_users:\n  alice: plaintext\n");
        assert_eq!(e.field, "basic_auth_users.alice", "{e}");

        let e = load_err("tls_server_config:\n  cert_file: nope.crt\n  key_file: nope.key\n");
        assert_eq!(e.field, "tls_server_config.cert_file", "{e}");
        assert!(e.message.contains("nope.crt"), "{e}");

        let e = load_err("tls_server_config:\n  key_file: k\n");
        assert_eq!(e.field, "tls_server_config.cert_file", "{e}");

        let e = load_err("rate_limit:\n  interval: 1s\n  burst: 2\n");
        assert_eq!(e.field, "rate_limit", "{e}");

        let e = load_err("bogus: 1\n");
        assert!(e.message.contains("bogus"), "{e}");
    }

    /// A server certificate and key, and a client CA, in `d`.
    fn pki(d: &Path) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        write(d, "server.pem", &cert.pem());
        write(d, "server.key", &key.serialize_pem());
        write(d, "ca.pem", &cert.pem());
    }

    const TLS: &str = "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n";

    #[test]
    fn a_fleets_cipher_curve_and_san_settings_load() {
        let d = temp_dir();
        pki(&d);
        let c = WebConfig::load(&write(
            &d,
            "web.yml",
            &format!(
                "{TLS}  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n  \
                 cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_AES_128_GCM_SHA256]\n  \
                 curve_preferences: [X25519, CurveP256]\n  \
                 client_allowed_sans: [prometheus.example, 10.0.0.7]\n"
            ),
        ))
        .unwrap();
        let tls = c.tls().unwrap();
        let suites: Vec<u16> = tls
            .crypto_provider()
            .cipher_suites
            .iter()
            .map(|s| u16::from(s.suite()))
            .collect();
        assert_eq!(suites, [0x1301, 0xc02b]);
        assert_eq!(tls.crypto_provider().kx_groups.len(), 2);
    }

    #[test]
    fn tls_settings_that_cannot_be_kept_are_refused_by_name() {
        let d = temp_dir();
        pki(&d);
        for (more, field, says) in [
            (
                "  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: ca.pem\n  client_allowed_sans: [a]\n",
                "client_allowed_sans",
                "client_auth_type is VerifyClientCertIfGiven",
            ),
            (
                "  client_allowed_sans: [a]\n",
                "client_allowed_sans",
                "client_auth_type is NoClientCert",
            ),
            (
                "  client_auth_type: RequireAnyClientCert\n  client_allowed_sans: []\n",
                "client_allowed_sans",
                "no client would be served",
            ),
            (
                "  client_auth_type: RequireAnyClientCert\n  client_allowed_sans: [a, '']\n",
                "client_allowed_sans[1]",
                "is empty",
            ),
            (
                "  cipher_suites: [TLS_RSA_WITH_AES_128_CBC_SHA]\n",
                "cipher_suites",
                "TLS_RSA_WITH_AES_128_CBC_SHA is not offered",
            ),
            (
                "  curve_preferences: [CurveP521]\n",
                "curve_preferences",
                "CurveP521 is not offered",
            ),
            (
                "  curve_preferences: X25519\n",
                "",
                "curve_preferences",
            ),
        ] {
            let f = write(&d, "web.yml", &format!("{TLS}{more}"));
            let e = WebConfig::load(&f).unwrap_err();
            if field.is_empty() {
                assert!(e.to_string().contains(says), "{more}: {e}");
            } else {
                assert_eq!(e.field, format!("tls_server_config.{field}"), "{more}: {e}");
                assert!(e.message.contains(says), "{more}: {e}");
            }
        }
    }

    #[test]
    fn basic_credentials_parse() {
        assert_eq!(
            parse_basic(b"Basic YWxpY2U6czNjcjN0OmV4dHJh"),
            Some(("alice".into(), "s3cr3t:extra".into()))
        );
        assert_eq!(parse_basic(b"basic YTpi"), Some(("a".into(), "b".into())));
        assert_eq!(parse_basic(b"Bearer YTpi"), None);
        assert_eq!(parse_basic(b"Basic !!!"), None);
        assert_eq!(parse_basic(b"Basic YWxpY2U="), None);
    }

    #[test]
    fn cache_keys_separate_their_parts() {
        assert_ne!(cache_key("ab", "h", "c"), cache_key("a", "h", "bc"));
        assert_eq!(cache_key("a", "h", "b"), cache_key("a", "h", "b"));
        assert_ne!(cache_key("a", "h", "b"), cache_key("a", "h2", "b"));
    }

    /// htpasswd writes `$2y$`, the bcrypt crate `$2b$`: the same hash.
    #[tokio::test]
    async fn htpasswd_hashes_verify() {
        use base64::Engine;
        let d = temp_dir();
        // docs/configuration.md's example: "example-password" at cost 10.
        let f = write(
            &d,
            "web.yml",
            "basic_auth_users:\n  prometheus: $2y$10$ZDTeVqI894ibBK1qSXn5uOGyxDsxMs6T9ggyaDTRkcjyhFYqscsFq\n",
        );
        let web = Web::load(&f).unwrap();
        let good = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("prometheus:example-password")
        );
        assert_eq!(web.authorize(Some(good.as_bytes())).await, Verdict::Allowed);
    }

    #[tokio::test]
    async fn basic_auth_verifies_once_then_from_the_cache() {
        let d = temp_dir();
        let hash = bcrypt::hash("pw", 4).unwrap();
        let f = write(
            &d,
            "web.yml",
            &format!("basic_auth_users:\n  alice: '{hash}'\n"),
        );
        let web = Web::load(&f).unwrap();
        let header = |u: &str, p: &str| {
            use base64::Engine;
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )
        };
        assert_eq!(web.authorize(None).await, Verdict::Denied);
        let good = header("alice", "pw");
        assert_eq!(web.authorize(Some(good.as_bytes())).await, Verdict::Allowed);
        assert_eq!(web.verified.lock().unwrap().len(), 1);
        assert_eq!(web.authorize(Some(good.as_bytes())).await, Verdict::Allowed);
        let bad = header("alice", "wrong");
        assert_eq!(web.authorize(Some(bad.as_bytes())).await, Verdict::Denied);
        let nobody = header("mallory", "pw");
        assert_eq!(
            web.authorize(Some(nobody.as_bytes())).await,
            Verdict::Denied
        );
        assert_eq!(web.verified.lock().unwrap().len(), 1);
    }
}
