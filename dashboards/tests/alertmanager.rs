//! The Alertmanager settings the packages ship
//! (`deploy/alertmanager/alertmanager.yml`) through Debian's own
//! Alertmanager: `amtool check-config` accepts them, and a real
//! Alertmanager running their `inhibit_rules` sends each problem once. The
//! test posts the alerts the rules fire for one full volume (and a few
//! neighbours) and reads what reaches a webhook receiver of its own: the
//! inhibiting alerts arrive, the inhibited ones never do.
//!
//! Only the receivers' URLs and the route's timers are changed for the run
//! (a webhook of the test's, and one second where the file waits minutes);
//! the inhibition rules and the routing are the file's, checked unchanged.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prjquota_dashboards::{repo_root, scratch};
use serde_json::{json, Value};

const ALERTMANAGER: &str = "/usr/bin/prometheus-alertmanager";
const AMTOOL: &str = "/usr/bin/amtool";
const SHIPPED: &str = "deploy/alertmanager/alertmanager.yml";

fn installed(binary: &str) {
    assert!(
        Path::new(binary).is_file(),
        "{binary} is missing: run `cargo xtask deps` (it installs Debian's prometheus-alertmanager)"
    );
}

fn shipped() -> serde_norway::Value {
    let p = repo_root().join(SHIPPED);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{SHIPPED} is not YAML: {e}"))
}

#[test]
fn amtool_accepts_the_shipped_config() {
    installed(AMTOOL);
    let out = Command::new(AMTOOL)
        .args(["check-config", &repo_root().join(SHIPPED).to_string_lossy()])
        .output()
        .expect("run amtool");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("SUCCESS"), "{text}");
    let rules = shipped()["inhibit_rules"].as_sequence().map_or(0, Vec::len);
    assert!(
        text.contains(&format!("{rules} inhibit rules")),
        "amtool read other inhibit rules than the file has ({rules}): {text}"
    );
}

// ---------------------------------------------------------------------------
// A webhook receiver: every notification's receiver and alerts' labels.

/// One alert as a notification carried it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Sent {
    receiver: String,
    alertname: String,
    /// The volume, or the instance for a node's alert.
    place: String,
}

struct Webhook {
    addr: SocketAddr,
    got: Arc<Mutex<Vec<Sent>>>,
}

impl Webhook {
    fn start() -> Webhook {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the webhook");
        let addr = listener.local_addr().unwrap();
        let got: Arc<Mutex<Vec<Sent>>> = Arc::default();
        let sink = got.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                if let Some(body) = read_request(&mut conn) {
                    let v: Value = serde_json::from_slice(&body).expect("a notification is JSON");
                    let receiver = v["receiver"].as_str().unwrap_or("").to_string();
                    let mut got = sink.lock().unwrap();
                    for a in v["alerts"].as_array().into_iter().flatten() {
                        let l = &a["labels"];
                        let place = l["volume_id"]
                            .as_str()
                            .or(l["instance"].as_str())
                            .unwrap_or("")
                            .to_string();
                        got.push(Sent {
                            receiver: receiver.clone(),
                            alertname: l["alertname"].as_str().unwrap_or("").to_string(),
                            place,
                        });
                    }
                }
                let _ = conn.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
            }
        });
        Webhook { addr, got }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}/{path}", self.addr)
    }

    fn sent(&self) -> BTreeSet<Sent> {
        self.got.lock().unwrap().iter().cloned().collect()
    }
}

/// The body of one HTTP request (headers up to the blank line, then
/// Content-Length bytes).
fn read_request(conn: &mut TcpStream) -> Option<Vec<u8>> {
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = conn.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let n = conn.read(&mut chunk).ok()?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some(buf[head_end..].to_vec())
}

/// A request to `addr`; its status code and body.
fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Ok((status, body))
}

// ---------------------------------------------------------------------------
// A real Alertmanager.

struct Alertmanager {
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
}

impl Alertmanager {
    fn start(config: &str) -> Alertmanager {
        installed(ALERTMANAGER);
        let dir = scratch("alertmanager");
        let file = dir.join("alertmanager.yml");
        std::fs::write(&file, config).unwrap();
        // A port free a moment ago; Alertmanager cannot report one it picked.
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let log = std::fs::File::create(dir.join("log")).unwrap();
        let child = Command::new(ALERTMANAGER)
            .arg(format!("--config.file={}", file.display()))
            .arg(format!("--storage.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            // No gossip: one instance, no port of its own to collide.
            .arg("--cluster.listen-address=")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start alertmanager");
        let mut am = Alertmanager { child, addr, dir };
        let start = Instant::now();
        loop {
            if let Ok((200, _)) = http(addr, "GET", "/-/ready", "") {
                break;
            }
            if let Ok(Some(st)) = am.child.try_wait() {
                panic!("alertmanager exited with {st}:\n{}", am.log());
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "alertmanager not ready after 60 s:\n{}",
                am.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        am
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    fn post(&mut self, alerts: &Value) {
        let (status, body) = http(self.addr, "POST", "/api/v2/alerts", &alerts.to_string())
            .unwrap_or_else(|e| panic!("post the alerts: {e}\n{}", self.log()));
        assert_eq!(status, 200, "{body}\n{}", self.log());
    }
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The shipped file with every webhook pointed at `hook` (keeping each
/// receiver's path) and every route's timers at one second; the inhibit
/// rules and the routing tree's matchers as they are.
fn for_the_test(hook: &Webhook) -> String {
    let mut v = shipped();
    let rules_before = v["inhibit_rules"].clone();
    for r in v["receivers"].as_sequence_mut().expect("receivers") {
        let name = r["name"].as_str().expect("a receiver's name").to_string();
        for w in r["webhook_configs"]
            .as_sequence_mut()
            .expect("webhook receivers")
        {
            w["url"] = serde_norway::Value::from(hook.url(&name));
        }
    }
    fn fast(route: &mut serde_norway::Value) {
        for key in ["group_wait", "group_interval"] {
            if route.get(key).is_some() {
                route[key] = serde_norway::Value::from("1s");
            }
        }
        if let Some(routes) = route.get_mut("routes").and_then(|r| r.as_sequence_mut()) {
            routes.iter_mut().for_each(fast);
        }
    }
    fast(&mut v["route"]);
    assert_eq!(v["inhibit_rules"], rules_before);
    serde_norway::to_string(&v).unwrap()
}

const CLUSTER: &str = "prod";

/// An alert of a volume, labelled as the rules label it.
fn volume_alert(name: &str, severity: &str, volume: &str, extra: &[(&str, &str)]) -> Value {
    let mut labels = json!({
        "alertname": name,
        "severity": severity,
        "cluster": CLUSTER,
        "job": "prjquota-exporter",
        "instance": "node-1:14646",
        "namespace": "team-a",
        "node_pool": "default",
        "volume_id": volume,
        "volume_name": format!("name-of-{volume}"),
    });
    for (k, v) in extra {
        labels[*k] = json!(v);
    }
    json!({ "labels": labels, "annotations": { "summary": name } })
}

/// An alert of a node's exporter target.
fn node_alert(name: &str, severity: &str, instance: &str) -> Value {
    json!({
        "labels": {
            "alertname": name,
            "severity": severity,
            "cluster": CLUSTER,
            "job": "prjquota-exporter",
            "instance": instance,
            "volumes_dir": "/opt/nomad/data/host_volumes",
        },
        "annotations": { "summary": name }
    })
}

/// One full volume (`full`) fires the critical and the warning
/// `NomadHostVolumeFillingUp`, `NomadHostVolumeQuotaLimitHit` and
/// `NomadHostVolumeWriteErrors` (ENOSPC) together: only the critical
/// FillingUp is sent, to the pager. A volume refused one large write
/// (`bounced`, not nearly full) sends its quota hit, not its write errors.
/// Another volume's EIO write errors (`failing`) are sent: nothing
/// inhibits them on node-1. On node-2 a shut-down filesystem sends its
/// own alert and inhibits its volume's EIO errors and unreadable numbers.
#[test]
fn one_full_volume_pages_once() {
    let hook = Webhook::start();
    let mut am = Alertmanager::start(&for_the_test(&hook));
    let (full, bounced, failing, stuck) = (
        "aaaaaaaa-0000-4000-8000-000000000001",
        "aaaaaaaa-0000-4000-8000-000000000002",
        "aaaaaaaa-0000-4000-8000-000000000003",
        "aaaaaaaa-0000-4000-8000-000000000004",
    );
    let hard_bytes = [("resource", "bytes"), ("limit", "hard")];
    let node2 = |name: &str, severity: &str, extra: &[(&str, &str)]| {
        let mut a = volume_alert(name, severity, stuck, extra);
        a["labels"]["instance"] = json!("node-2:14646");
        a
    };
    let alerts = json!([
        volume_alert("NomadHostVolumeFillingUp", "critical", full, &[]),
        volume_alert("NomadHostVolumeFillingUp", "warning", full, &[]),
        volume_alert("NomadHostVolumeQuotaLimitHit", "warning", full, &hard_bytes),
        volume_alert(
            "NomadHostVolumeWriteErrors",
            "warning",
            full,
            &[("errno", "ENOSPC")]
        ),
        volume_alert(
            "NomadHostVolumeQuotaLimitHit",
            "warning",
            bounced,
            &hard_bytes
        ),
        volume_alert(
            "NomadHostVolumeWriteErrors",
            "warning",
            bounced,
            &[("errno", "ENOSPC")]
        ),
        volume_alert(
            "NomadHostVolumeWriteErrors",
            "warning",
            failing,
            &[("errno", "EIO")]
        ),
        node_alert(
            "NomadHostVolumesFilesystemUnhealthy",
            "critical",
            "node-2:14646"
        ),
        node2("NomadHostVolumeWriteErrors", "warning", &[("errno", "EIO")]),
        node2(
            "NomadHostVolumeStatsUnavailable",
            "warning",
            &[("reason", "timeout")]
        ),
    ]);
    am.post(&alerts);
    let sent = |receiver: &str, alertname: &str, place: &str| Sent {
        receiver: receiver.into(),
        alertname: alertname.into(),
        place: place.into(),
    };
    let want: BTreeSet<Sent> = [
        sent("pager", "NomadHostVolumeFillingUp", full),
        sent("tickets", "NomadHostVolumeQuotaLimitHit", bounced),
        sent("tickets", "NomadHostVolumeWriteErrors", failing),
        sent(
            "pager",
            "NomadHostVolumesFilesystemUnhealthy",
            "node-2:14646",
        ),
    ]
    .into();
    let start = Instant::now();
    while !hook.sent().is_superset(&want) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "not every expected notification within 60 s: got {:#?}\nalertmanager:\n{}",
            hook.sent(),
            am.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Every group waited its one second at the same time: what was not
    // inhibited has been sent by now. Three more flushes, to be sure.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        hook.sent(),
        want,
        "the inhibited alerts were sent (or the wrong receivers got them)"
    );
    eprintln!(
        "MEASURE alertmanager_first_notifications_seconds {:.1}",
        start.elapsed().as_secs_f64() - 3.0
    );
}
