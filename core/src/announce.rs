//! Telling a running prjquota-exporter about a volume the moment it exists.
//!
//! The exporter learns of volumes from the registry; on its own it would
//! see a new one at its next scrape, and writes made before that would
//! count nowhere and a quota escape would go unguarded. So the plugin, once
//! a create has recorded the volume and tagged its root, asks the exporter
//! to register the roots of that volumes directory now, and waits (briefly)
//! until it has: when Nomad hears the volume exists, it is watched.
//!
//! The protocol is one line each way over a Unix stream socket in the
//! abstract namespace (no file, so nothing to create under a read-only
//! `ProtectSystem`, and nothing left behind by a crash), named after the
//! volumes directory so that exporters of different directories never
//! meet: `sync <volumes dir>\n`, answered `ok\n` or `error <why>\n`. An
//! abstract name has no permissions, so each side checks the other is root
//! (`SO_PEERCRED`): a squatter can neither be told nor answer. No exporter
//! (nobody listening) is not an error: there is nothing to tell.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::sys;

/// The form of `volumes_dir` both sides name the socket after: resolved
/// when it exists, so that Nomad's `host_volumes_dir` and the exporter's
/// `--volumes-dir` meet however each spells the directory (a trailing
/// slash, a symlink).
pub fn canonical(volumes_dir: &Path) -> PathBuf {
    std::fs::canonicalize(volumes_dir).unwrap_or_else(|_| volumes_dir.components().collect())
}

/// The abstract socket name the exporter of `volumes_dir` listens on.
pub fn socket_name(volumes_dir: &Path) -> Option<Vec<u8>> {
    let mut name = b"prjquota-exporter:".to_vec();
    name.extend_from_slice(canonical(volumes_dir).as_os_str().as_encoded_bytes());
    // sun_path holds 108 bytes, one of them the leading NUL.
    (name.len() <= 107).then_some(name)
}

/// How long a create waits for the exporter: well inside Nomad's 60 s,
/// long enough for a busy exporter to walk a large registry.
pub const WAIT: Duration = Duration::from_secs(5);

/// Longest line either side sends.
pub const MAX_LINE: usize = 4096;

/// What announcing did.
#[derive(Debug, PartialEq, Eq)]
pub enum Announced {
    /// The exporter registered the directory's roots.
    Registered,
    /// No exporter listens here.
    NoExporter,
}

/// The request line for `volumes_dir`; `None` for a path that cannot be
/// sent on one line.
pub fn request(volumes_dir: &Path) -> Option<String> {
    let dir = volumes_dir.to_str()?;
    (!dir.contains('\n') && dir.len() + 6 < MAX_LINE).then(|| format!("sync {dir}\n"))
}

/// Parses a request line into the volumes directory it names.
pub fn parse_request(line: &str) -> Result<&Path, String> {
    let dir = line
        .strip_suffix('\n')
        .unwrap_or(line)
        .strip_prefix("sync ")
        .ok_or_else(|| format!("unknown request {line:?}: want `sync <volumes dir>`"))?;
    if !dir.starts_with('/') {
        return Err(format!("{dir:?} is not an absolute path"));
    }
    Ok(Path::new(dir))
}

/// Asks the exporter of `volumes_dir` to register its roots, waiting at
/// most `wait` for the answer.
pub fn announce(volumes_dir: &Path, wait: Duration) -> io::Result<Announced> {
    let name = socket_name(volumes_dir).ok_or_else(|| {
        io::Error::other("the volumes directory's path is too long for a socket name")
    })?;
    announce_to(&name, volumes_dir, wait)
}

/// [`announce`] to the abstract socket `name`.
pub fn announce_to(name: &[u8], volumes_dir: &Path, wait: Duration) -> io::Result<Announced> {
    let line = request(volumes_dir)
        .ok_or_else(|| io::Error::other("the volumes directory is not a one-line UTF-8 path"))?;
    let addr = SocketAddr::from_abstract_name(name)?;
    let mut stream = match UnixStream::connect_addr(&addr) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(Announced::NoExporter)
        }
        Err(e) => return Err(e),
    };
    let uid = sys::peer_uid(stream.as_fd())?;
    if uid != 0 {
        return Err(io::Error::other(format!(
            "the process listening as prjquota-exporter runs as uid {uid}, not root: ignored"
        )));
    }
    stream.set_write_timeout(Some(wait))?;
    stream.set_read_timeout(Some(wait))?;
    stream.write_all(line.as_bytes())?;
    let mut reply = String::new();
    BufReader::new(stream.take(MAX_LINE as u64)).read_line(&mut reply)?;
    match reply.strip_suffix('\n').unwrap_or(&reply) {
        "ok" => Ok(Announced::Registered),
        other => Err(io::Error::other(format!(
            "prjquota-exporter answered {:?}",
            other.strip_prefix("error ").unwrap_or(other)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_bad_ones_are_refused() {
        let line = request(Path::new("/opt/nomad/data/host_volumes")).unwrap();
        assert_eq!(line, "sync /opt/nomad/data/host_volumes\n");
        assert_eq!(
            parse_request(&line).unwrap(),
            Path::new("/opt/nomad/data/host_volumes")
        );
        assert!(request(Path::new("/a\nb")).is_none());
        assert!(parse_request("sync relative\n").is_err());
        assert!(parse_request("delete /x\n").is_err());
    }

    #[test]
    fn no_listener_is_no_exporter() {
        let dir = format!("/nonexistent/prjquota-nosock-{}", std::process::id());
        assert_eq!(
            announce(Path::new(&dir), Duration::from_secs(1)).unwrap(),
            Announced::NoExporter
        );
    }

    #[test]
    fn socket_names_follow_the_directory_and_fit() {
        assert_eq!(
            socket_name(Path::new("/nonexistent-v/")).unwrap(),
            b"prjquota-exporter:/nonexistent-v".to_vec()
        );
        assert_ne!(socket_name(Path::new("/a")), socket_name(Path::new("/b")));
        assert!(socket_name(Path::new(&format!("/{}", "x".repeat(100)))).is_none());
    }

    #[test]
    fn an_exporter_that_answers_ok_registered_the_volume() {
        use std::os::unix::net::UnixListener;
        let dir = format!("/prjquota-test-{}", std::process::id());
        let name = socket_name(Path::new(&dir)).unwrap();
        let listener =
            UnixListener::bind_addr(&SocketAddr::from_abstract_name(&name).unwrap()).unwrap();
        let server = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line).unwrap();
            (&s).write_all(b"ok\n").unwrap();
            line
        });
        // The test runs as root wherever it can bind (the peer check):
        // elsewhere the refusal is the answer.
        let got = announce(Path::new(&dir), Duration::from_secs(5));
        if nix_uid() == 0 {
            assert_eq!(got.unwrap(), Announced::Registered);
            assert_eq!(server.join().unwrap(), format!("sync {dir}\n"));
        } else {
            assert!(got.unwrap_err().to_string().contains("not root"));
        }
    }

    /// The effective uid: the owner of this process's /proc entry.
    fn nix_uid() -> u32 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self")
            .expect("stat /proc/self")
            .uid()
    }
}
