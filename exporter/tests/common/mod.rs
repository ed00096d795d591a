//! The exporter's host tests' settings, over the helpers every test shares
//! (`tests/src`: the HTTP client and the record builder).

#![allow(dead_code)]

pub mod ca;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// An exporter's settings for host tests of `dir`: no eBPF, no guard, no
/// netlink subscription (none of them works on the host).
pub fn host_config(dir: &Path) -> prjquota_exporter::Config {
    prjquota_exporter::Config {
        volumes_dirs: vec![dir.to_path_buf()],
        mount_timeout: std::time::Duration::from_secs(5),
        quota_events: false,
        ebpf: prjquota_exporter::collector::EbpfMode::Off,
        guard: prjquota_exporter::collector::GuardMode::Off,
        ..prjquota_exporter::Config::default()
    }
}

/// A fresh directory under `base` (e.g. the temp dir, or /dev/shm for
/// tmpfs), removed when the test ends.
pub fn fresh_dir(base: &Path, tag: &str) -> TempDir {
    TempDir::new(base, "prjq-exporter-it", tag)
}

pub use prjquota_vmtests::http::{RawReply, Reply};
pub use prjquota_vmtests::records::{add_volume, record};
pub use prjquota_vmtests::temp::TempDir;

/// How long a host test waits for a reply: the host is not emulated, but a
/// loaded CI machine is slow.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Sends `request` (a whole request head) with the shared client and reads
/// the reply until the server closes the connection; the body must be text.
pub fn raw(addr: SocketAddr, request: &str) -> Reply {
    raw_bytes(addr, request)
        .text()
        .unwrap_or_else(|e| panic!("{request:?} to {addr}: {e}"))
}

/// [`raw`] for a body that need not be text (gzip).
pub fn raw_bytes(addr: SocketAddr, request: &str) -> RawReply {
    prjquota_vmtests::http::request(addr, request, TIMEOUT)
        .unwrap_or_else(|e| panic!("{request:?} to {addr}: {e}"))
}

/// `GET path` with `Connection: close`.
pub fn get(addr: SocketAddr, path: &str) -> Reply {
    prjquota_vmtests::http::http_get(addr, path, TIMEOUT)
        .unwrap_or_else(|e| panic!("GET {path} from {addr}: {e}"))
}

/// The value of the one sample whose line starts with `prefix`.
pub fn value(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}
