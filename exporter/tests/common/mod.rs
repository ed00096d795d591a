//! Helpers shared by the exporter's host tests: volumes directories written
//! with the plugin's own registry code, a minimal HTTP/1.1 client, and the
//! exporter binary as a child process ([`child`]).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use prjquota::contract::VolumeId;
use prjquota::params::VolumeParams;
use prjquota::registry::{Record, Registry, State, RECORD_VERSION};

pub mod child;

/// An exporter's settings for host tests of `dir`: no eBPF, no guard, no
/// netlink subscription (none of them works on the host).
pub fn host_config(dir: &Path) -> prjquota_exporter::Config {
    prjquota_exporter::Config {
        volumes_dirs: vec![dir.to_path_buf()],
        statfs_timeout: std::time::Duration::from_secs(5),
        quota_events: false,
        ebpf: prjquota_exporter::collector::EbpfMode::Off,
        guard: prjquota_exporter::collector::GuardMode::Off,
        ..prjquota_exporter::Config::default()
    }
}

/// A fresh directory under `base` (e.g. the temp dir, or /dev/shm for tmpfs).
pub fn fresh_dir(base: &Path, tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let d = base.join(format!(
        "prjq-exporter-it-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn record(id: &str, namespace: &str, project_id: u32, state: State) -> Record {
    Record {
        version: RECORD_VERSION,
        state,
        volume_id: VolumeId::parse(id).unwrap(),
        volume_name: format!("vol-{project_id}"),
        namespace: namespace.into(),
        node_pool: "default".into(),
        node_id: "node-1".into(),
        plugin_id: "prjquota".into(),
        path: PathBuf::new(),
        fstype: "xfs".into(),
        project_id,
        capacity_min_bytes: 0,
        capacity_max_bytes: 1 << 30,
        provisioned_bytes: 1 << 30,
        params: VolumeParams {
            mode: 0o755,
            uid: None,
            gid: None,
            max_inodes: None,
        },
        parameters: BTreeMap::new(),
        created_unix: 1_700_000_000,
        updated_unix: 1_700_000_000,
    }
}

/// Stores `rec` with the plugin's registry writer and creates its root.
pub fn add_volume(volumes_dir: &Path, mut rec: Record) {
    rec.path = volumes_dir.join(rec.volume_id.as_str());
    std::fs::create_dir_all(&rec.path).unwrap();
    let dir = std::fs::File::open(volumes_dir).unwrap();
    let reg = Registry::open(dir.as_fd(), volumes_dir, true)
        .unwrap()
        .unwrap();
    reg.store(&rec).unwrap();
}

pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sends `request` (a whole request head) and reads the reply until the
/// server closes the connection; decodes a chunked body.
pub fn raw(addr: SocketAddr, request: &str) -> Reply {
    let (status, headers, body) = raw_bytes(addr, request);
    Reply {
        status,
        headers,
        body: String::from_utf8(body).unwrap(),
    }
}

/// [`raw`] for a body that need not be text (gzip).
pub fn raw_bytes(addr: SocketAddr, request: &str) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a reply head");
    let head = std::str::from_utf8(&buf[..split]).unwrap();
    let body = &buf[split + 4..];
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case("transfer-encoding") && v == "chunked");
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_vec()
    };
    (status, headers, body)
}

pub fn get(addr: SocketAddr, path: &str) -> Reply {
    raw(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"),
    )
}

fn dechunk(mut s: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = s
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a chunk size line");
        let size = std::str::from_utf8(&s[..eol]).unwrap();
        let n = usize::from_str_radix(size.trim(), 16).expect("a hex chunk size");
        if n == 0 {
            return out;
        }
        let rest = &s[eol + 2..];
        out.extend_from_slice(&rest[..n]);
        s = &rest[n + 2..];
    }
}

/// The value of the one sample whose line starts with `prefix`.
pub fn value(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}
