//! A stand-in for a Nomad agent's HTTP API, for the exporter's Nomad client
//! (Nomad itself cannot run here: it is not open source since 1.7 and no
//! registry serves it). It answers the endpoints the exporter calls with
//! the documents of `tests/fixtures/nomad-api-v2.0.5/` (every field of
//! Nomad's `api` types at v2.0.5, see its README), the fields it varies
//! filled in, and with Nomad's own status codes and texts where it refuses
//! (`command/agent`: 403 "Permission denied", 404 "alloc not found",
//! "volume not found", "resource not found"; 400 for a metadata key that is
//! not a dotted HCL identifier, as `NodeMetaApplyRequest.Validate` says).
//! A test makes it refuse, fail, answer slowly, never answer or hang up
//! ([`Mode`]) and reads every request it got.
//!
//! [`feasible`] evaluates a constraint as Nomad's scheduler does
//! (`scheduler/feasible/feasible.go`: `resolveTarget`, `checkConstraint`,
//! `checkOrder`), for the tests of the documented placement constraint.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{json, Value};

const ALLOCATION: &str = include_str!("../fixtures/nomad-api-v2.0.5/allocation.json");
const NODE_META: &str = include_str!("../fixtures/nomad-api-v2.0.5/node_meta_response.json");
const HOST_VOLUME: &str = include_str!("../fixtures/nomad-api-v2.0.5/host_volume.json");
const HOST_VOLUME_STUB: &str = include_str!("../fixtures/nomad-api-v2.0.5/host_volume_stub.json");

/// The fixture `name` as Nomad sends it.
pub fn fixture(name: &str) -> Value {
    let text = match name {
        "allocation" => ALLOCATION,
        "node_meta_response" => NODE_META,
        "host_volume" => HOST_VOLUME,
        "host_volume_stub" => HOST_VOLUME_STUB,
        other => panic!("no Nomad fixture {other:?}"),
    };
    serde_json::from_str(text).expect("a fixture is JSON")
}

/// How the agent answers.
#[derive(Clone, Debug, PartialEq)]
pub enum Mode {
    /// As Nomad does.
    Normal,
    /// Every request with this status and body (403 "Permission denied",
    /// 500 "rpc error: No cluster leader", …).
    Status(u16, String),
    /// As Nomad does, after this pause.
    Slow(Duration),
    /// Reads the request and never answers, the connection held open.
    Hang,
    /// Reads the request and closes the connection without a word.
    HangUp,
}

/// One request as the agent got it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    /// Path and query, as sent.
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }

    /// The query parameter `key`, percent-decoding `%2A` (`*`) only.
    pub fn query(&self, key: &str) -> Option<String> {
        self.target.split_once('?').and_then(|(_, q)| {
            q.split('&')
                .filter_map(|kv| kv.split_once('='))
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.replace("%2A", "*").replace("%2a", "*"))
        })
    }
}

/// A host volume Nomad knows.
#[derive(Clone, Debug)]
pub struct KnownVolume {
    pub id: String,
    pub namespace: String,
    pub node_id: String,
}

/// What the agent holds and has seen.
#[derive(Debug)]
pub struct State {
    pub mode: Mode,
    /// The token a request must carry in `X-Nomad-Token` (ACLs on); `None`:
    /// ACLs off, every request allowed.
    pub token: Option<String>,
    /// The node's dynamic metadata as the agent applied it.
    pub meta: BTreeMap<String, String>,
    /// Allocation ID to (namespace, `ephemeral_disk.size` in MiB).
    pub allocations: BTreeMap<String, (String, i64)>,
    pub volumes: Vec<KnownVolume>,
    /// Host volume lists come in pages of this many (Nomad's `per_page`,
    /// its `X-Nomad-NextToken` naming the next page's first entry).
    pub page_size: Option<usize>,
    pub requests: Vec<Seen>,
}

/// The agent, answering until dropped.
pub struct Agent {
    pub addr: SocketAddr,
    pub node_id: String,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Agent {
    /// An agent of node `node_id` on a free port of 127.0.0.1.
    pub fn start(node_id: &str) -> Agent {
        crate::prom::ensure_loopback();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the Nomad agent's port");
        let addr = listener.local_addr().expect("its address");
        let stop = Arc::new(AtomicBool::new(false));
        let state = Arc::new(Mutex::new(State {
            mode: Mode::Normal,
            token: None,
            meta: BTreeMap::new(),
            allocations: BTreeMap::new(),
            volumes: Vec::new(),
            page_size: None,
            requests: Vec::new(),
        }));
        let (stopping, shared, node) = (stop.clone(), state.clone(), node_id.to_string());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(c) = conn else { continue };
                let (shared, node, stopping) = (shared.clone(), node.clone(), stopping.clone());
                std::thread::spawn(move || serve(c, &shared, &node, &stopping));
            }
        });
        Agent {
            addr,
            node_id: node_id.to_string(),
            state,
            stop,
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:<port>`, for `--nomad.addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_mode(&self, mode: Mode) {
        self.state().mode = mode;
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.state().requests.clone()
    }

    /// The requests to paths starting with `prefix`.
    pub fn requests_to(&self, prefix: &str) -> Vec<Seen> {
        self.requests()
            .into_iter()
            .filter(|r| r.path().starts_with(prefix))
            .collect()
    }

    /// The node's dynamic metadata key `key`, as last applied.
    pub fn meta(&self, key: &str) -> Option<String> {
        self.state().meta.get(key).cloned()
    }

    pub fn add_allocation(&self, id: &str, namespace: &str, disk_mb: i64) {
        self.state()
            .allocations
            .insert(id.to_string(), (namespace.to_string(), disk_mb));
    }

    pub fn add_volume(&self, id: &str, namespace: &str, node_id: &str) {
        self.state().volumes.push(KnownVolume {
            id: id.to_string(),
            namespace: namespace.to_string(),
            node_id: node_id.to_string(),
        });
    }

    pub fn forget_volume(&self, id: &str) {
        self.state().volumes.retain(|v| v.id != id);
    }

    /// Waits until a request to `prefix` satisfies `pred`, or panics after
    /// `within` with what came.
    pub fn wait_for(&self, within: Duration, what: &str, pred: impl Fn(&[Seen]) -> bool) {
        let deadline = std::time::Instant::now() + within;
        loop {
            if pred(&self.requests()) {
                return;
            }
            if std::time::Instant::now() > deadline {
                panic!(
                    "{what}: not within {within:?}; requests:\n{:#?}",
                    self.requests()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads one request: its head and a `Content-Length` body.
fn read_request(c: &TcpStream) -> Option<Seen> {
    let mut r = BufReader::new(c.try_clone().ok()?);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next()?.to_string(), parts.next()?.to_string());
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        match r.read_line(&mut h) {
            Ok(0) | Err(_) => return None,
            Ok(_) if h == "\r\n" || h == "\n" => break,
            Ok(_) => {
                if let Some((n, v)) = h.trim_end().split_once(':') {
                    headers.push((n.trim().to_string(), v.trim().to_string()));
                }
            }
        }
    }
    let len: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    Some(Seen {
        method,
        target,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

fn serve(mut c: TcpStream, shared: &Mutex<State>, node_id: &str, stopping: &AtomicBool) {
    let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
    let Some(req) = read_request(&c) else { return };
    let mode = {
        let mut s = shared.lock().unwrap_or_else(|e| e.into_inner());
        s.requests.push(req.clone());
        s.mode.clone()
    };
    let (status, body, next_token) = match mode {
        Mode::HangUp => return,
        Mode::Hang => {
            while !stopping.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
            }
            return;
        }
        Mode::Status(code, text) => (code, text, None),
        Mode::Slow(pause) => {
            std::thread::sleep(pause);
            answer(&req, shared, node_id)
        }
        Mode::Normal => answer(&req, shared, node_id),
    };
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        500 => "Internal Server Error",
        _ => "Status",
    };
    let json = body.starts_with('{') || body.starts_with('[');
    let next = next_token
        .map(|t| format!("X-Nomad-NextToken: {t}\r\n"))
        .unwrap_or_default();
    let _ = write!(
        c,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {}\r\nX-Nomad-Index: 45\r\n{next}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        if json { "application/json" } else { "text/plain; charset=utf-8" },
        body.len()
    );
}

/// Nomad's answer to `req`: status, body, and the next page's token.
fn answer(req: &Seen, shared: &Mutex<State>, node_id: &str) -> (u16, String, Option<String>) {
    let (status, body) = match list_page(req, shared) {
        Some(page) => return page,
        None => answer_one(req, shared, node_id),
    };
    (status, body, None)
}

/// A page of `/v1/volumes?type=host`, when that is what `req` asks.
fn list_page(req: &Seen, shared: &Mutex<State>) -> Option<(u16, String, Option<String>)> {
    if req.method != "GET" || req.path() != "/v1/volumes" {
        return None;
    }
    let s = shared.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(t) = &s.token {
        if req.header("X-Nomad-Token") != Some(t.as_str()) {
            return Some((403, "Permission denied".into(), None));
        }
    }
    if req.query("type").as_deref() != Some("host") {
        return Some((200, "[]".into(), None));
    }
    let ns = req.query("namespace").unwrap_or_else(|| "default".into());
    let node = req.query("node_id");
    let prefix = req.query("prefix").unwrap_or_default();
    let all: Vec<&KnownVolume> = s
        .volumes
        .iter()
        .filter(|v| ns == "*" || v.namespace == ns)
        .filter(|v| node.as_ref().is_none_or(|n| &v.node_id == n))
        .filter(|v| v.id.starts_with(&prefix))
        .collect();
    let from = match req.query("next_token") {
        Some(t) => all.iter().position(|v| v.id == t).unwrap_or(all.len()),
        None => 0,
    };
    let to = match s.page_size {
        Some(n) => (from + n).min(all.len()),
        None => all.len(),
    };
    let list: Vec<Value> = all[from..to]
        .iter()
        .map(|v| {
            let mut stub = fixture("host_volume_stub");
            stub["ID"] = json!(v.id);
            stub["Namespace"] = json!(v.namespace);
            stub["NodeID"] = json!(v.node_id);
            stub
        })
        .collect();
    let next = all.get(to).map(|v| v.id.clone());
    Some((200, Value::Array(list).to_string(), next))
}

fn answer_one(req: &Seen, shared: &Mutex<State>, node_id: &str) -> (u16, String) {
    let mut s = shared.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(t) = &s.token {
        if req.header("X-Nomad-Token") != Some(t.as_str()) {
            return (403, "Permission denied".into());
        }
    }
    let path = req.path().to_string();
    match (req.method.as_str(), path.as_str()) {
        ("GET", "/v1/client/metadata") => (200, meta_response(&s.meta)),
        ("POST" | "PUT", "/v1/client/metadata") => {
            let Ok(v) = serde_json::from_str::<Value>(&req.body) else {
                return (400, "failed to decode request body".into());
            };
            let Some(meta) = v.get("Meta").and_then(Value::as_object) else {
                return (400, "missing required Meta object".into());
            };
            if meta.is_empty() {
                return (400, "missing required Meta object".into());
            }
            for k in meta.keys() {
                if !is_dotted_identifier(k) {
                    return (
                        400,
                        format!(
                            "{k:?} is invalid; metadata keys must be valid dotted hcl identifiers"
                        ),
                    );
                }
            }
            for (k, v) in meta {
                match v {
                    Value::Null => {
                        s.meta.remove(k);
                    }
                    Value::String(v) => {
                        s.meta.insert(k.clone(), v.clone());
                    }
                    _ => return (400, "failed to decode request body".into()),
                }
            }
            (200, meta_response(&s.meta))
        }
        ("GET", p) if p.starts_with("/v1/allocation/") => {
            let id = &p["/v1/allocation/".len()..];
            match s.allocations.get(id) {
                None => (404, "alloc not found".into()),
                Some((ns, mb)) => {
                    let mut a = fixture("allocation");
                    a["ID"] = json!(id);
                    a["Namespace"] = json!(ns);
                    a["NodeID"] = json!(node_id);
                    a["AllocatedResources"]["Shared"]["DiskMB"] = json!(mb);
                    a["Resources"]["DiskMB"] = json!(mb);
                    (200, a.to_string())
                }
            }
        }
        ("GET", p) if p.starts_with("/v1/volume/host/") => {
            let id = &p["/v1/volume/host/".len()..];
            let ns = req.query("namespace").unwrap_or_else(|| "default".into());
            match s.volumes.iter().find(|v| v.id == id && v.namespace == ns) {
                None => (404, "volume not found".into()),
                Some(v) => {
                    let mut hv = fixture("host_volume");
                    hv["ID"] = json!(v.id);
                    hv["Namespace"] = json!(v.namespace);
                    hv["NodeID"] = json!(v.node_id);
                    (200, hv.to_string())
                }
            }
        }
        _ => (404, "resource not found".into()),
    }
}

fn meta_response(dynamic: &BTreeMap<String, String>) -> String {
    let mut r = fixture("node_meta_response");
    for (k, v) in dynamic {
        r["Meta"][k] = json!(v);
        r["Dynamic"][k] = json!(v);
    }
    r.to_string()
}

/// HCL's identifier, as `hclsyntax.ValidIdentifier` takes it (ASCII here:
/// a letter or `_` first, then letters, digits, `_` or `-`), each part of a
/// dotted key.
pub fn is_dotted_identifier(key: &str) -> bool {
    !key.is_empty()
        && key.split('.').all(|part| {
            let mut b = part.bytes();
            b.next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
                && b.all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
        })
}

/// A volume spec's `constraint` block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Constraint {
    pub attribute: String,
    pub operator: String,
    pub value: String,
}

/// What a target names on a node whose metadata is `meta`, and whether it
/// names anything: a literal, or `${meta.<key>}` (`resolveTarget`: a
/// missing key is `("", false)`; the other interpolations are not
/// modelled, and say so).
pub fn resolve(target: &str, meta: &BTreeMap<String, String>) -> (String, bool) {
    if !target.starts_with("${") {
        return (target.to_string(), true);
    }
    match target
        .strip_prefix("${meta.")
        .and_then(|t| t.strip_suffix('}'))
    {
        Some(key) => match meta.get(key) {
            Some(v) => (v.clone(), true),
            None => (String::new(), false),
        },
        None => panic!("{target}: only ${{meta.*}} targets are modelled here"),
    }
}

/// Whether a node with metadata `meta` passes `c`, as Nomad's
/// `checkConstraint` decides for the operators modelled here.
pub fn feasible(c: &Constraint, meta: &BTreeMap<String, String>) -> bool {
    let (l, l_found) = resolve(&c.attribute, meta);
    let (r, r_found) = resolve(&c.value, meta);
    match c.operator.as_str() {
        "" | "=" | "==" | "is" => l_found && r_found && l == r,
        "!=" | "not" => l != r,
        "<" | "<=" | ">" | ">=" => l_found && r_found && check_order(&c.operator, &l, &r),
        "is_set" => l_found,
        "is_not_set" => !l_found,
        other => panic!("operator {other:?} is not modelled here"),
    }
}

/// `checkOrder`: as integers if both sides parse as base-10 int64, else as
/// floats if both parse, else lexically (byte order).
pub fn check_order(op: &str, l: &str, r: &str) -> bool {
    fn cmp<T: PartialOrd>(op: &str, l: T, r: T) -> bool {
        match op {
            "<" => l < r,
            "<=" => l <= r,
            ">" => l > r,
            ">=" => l >= r,
            _ => false,
        }
    }
    if let (Ok(l), Ok(r)) = (l.parse::<i64>(), r.parse::<i64>()) {
        return cmp(op, l, r);
    }
    if let (Ok(l), Ok(r)) = (l.parse::<f64>(), r.parse::<f64>()) {
        return cmp(op, l, r);
    }
    cmp(op, l, r)
}

/// The `constraint { … }` blocks of the first ```hcl block in `markdown`
/// that follows the line `marker`: what a page documents, read as written.
pub fn documented_constraints(markdown: &str, marker: &str) -> Vec<Constraint> {
    let after = markdown
        .split_once(marker)
        .unwrap_or_else(|| panic!("no {marker:?} in the page"))
        .1;
    let block = after
        .split_once("```hcl\n")
        .and_then(|(_, b)| b.split_once("```"))
        .unwrap_or_else(|| panic!("no ```hcl block after {marker:?}"))
        .0;
    let mut out = Vec::new();
    let mut current: Option<BTreeMap<String, String>> = None;
    for line in block.lines().map(str::trim) {
        if line.starts_with("constraint") && line.ends_with('{') {
            current = Some(BTreeMap::new());
        } else if line == "}" {
            if let Some(c) = current.take() {
                let get = |k: &str| c.get(k).cloned().unwrap_or_default();
                out.push(Constraint {
                    attribute: get("attribute"),
                    operator: get("operator"),
                    value: get("value"),
                });
            }
        } else if let Some(c) = current.as_mut() {
            if let Some((k, v)) = line.split_once('=') {
                let v = v.trim().trim_matches('"').to_string();
                c.insert(k.trim().to_string(), v);
            }
        }
    }
    assert!(!out.is_empty(), "no constraint block after {marker:?}");
    out
}
