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
//! (`SO_PEERCRED`), and the plugin also that the listener holds
//! `CAP_SYS_ADMIN` in the initial user namespace, as the exporter does: a
//! squatter can neither be told nor answer. The connect does not block and
//! the whole exchange has one deadline, so a listener that never accepts or
//! never answers costs a create at most [`WAIT`]. No exporter (nobody
//! listening) is not an error: there is nothing to tell.
//!
//! The same socket answers `prjquota reconcile --nomad`: `nomad-volumes
//! <volumes dir>\n` asks the exporter, which holds the Nomad client and
//! its token, which of the directory's volumes Nomad knows, answered with
//! one JSON line ([`NomadVolumes`]) or `error <why>`. The plugin Nomad
//! runs for every volume stays free of an HTTP and TLS stack.
//!
//! What this buys is write telemetry from the first byte. The guard does not
//! depend on it: the plugin puts a new root into the pinned guard itself
//! ([`crate::guard_contract`]).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

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
    request_line(SYNC, volumes_dir)
}

/// `sync <volumes dir>`: register the directory's roots (a create).
const SYNC: &str = "sync";
/// `nomad-volumes <volumes dir>`: which of the directory's volumes Nomad
/// knows (`prjquota reconcile --nomad`), answered with one JSON line
/// ([`NomadVolumes`]).
const NOMAD_VOLUMES: &str = "nomad-volumes";

fn request_line(verb: &str, volumes_dir: &Path) -> Option<String> {
    let dir = volumes_dir.to_str()?;
    (!dir.contains('\n') && dir.len() + verb.len() + 2 < MAX_LINE)
        .then(|| format!("{verb} {dir}\n"))
}

/// What a client asks the exporter.
#[derive(Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// Register the roots of this volumes directory.
    Sync(&'a Path),
    /// Say which volumes of this volumes directory Nomad knows.
    NomadVolumes(&'a Path),
}

impl Request<'_> {
    /// The volumes directory asked about.
    pub fn volumes_dir(&self) -> &Path {
        match self {
            Request::Sync(d) | Request::NomadVolumes(d) => d,
        }
    }
}

/// Parses a request line.
pub fn parse_request(line: &str) -> Result<Request<'_>, String> {
    let line = line.strip_suffix('\n').unwrap_or(line);
    let (verb, dir) = line.split_once(' ').ok_or_else(|| {
        format!(
            "unknown request {line:?}: want `sync <volumes dir>` or `nomad-volumes <volumes dir>`"
        )
    })?;
    if !dir.starts_with('/') {
        return Err(format!("{dir:?} is not an absolute path"));
    }
    match verb {
        SYNC => Ok(Request::Sync(Path::new(dir))),
        NOMAD_VOLUMES => Ok(Request::NomadVolumes(Path::new(dir))),
        _ => Err(format!(
            "unknown request {line:?}: want `sync <volumes dir>` or `nomad-volumes <volumes dir>`"
        )),
    }
}

/// Asks the exporter of `volumes_dir` to register its roots, waiting at
/// most `wait` for the answer.
pub fn announce(volumes_dir: &Path, wait: Duration) -> io::Result<Announced> {
    let name = socket_name(volumes_dir).ok_or_else(|| {
        io::Error::other("the volumes directory's path is too long for a socket name")
    })?;
    announce_to(&name, volumes_dir, wait)
}

/// [`announce`] to the abstract socket `name`. Never waits longer than
/// `wait` in all: a listener that never accepts (its backlog full), never
/// answers, or is not the exporter is given up on, with the reason.
pub fn announce_to(name: &[u8], volumes_dir: &Path, wait: Duration) -> io::Result<Announced> {
    let line = request(volumes_dir)
        .ok_or_else(|| io::Error::other("the volumes directory is not a one-line UTF-8 path"))?;
    match exchange(name, &line, wait, MAX_LINE)? {
        None => Ok(Announced::NoExporter),
        Some(reply) => match reply.as_str() {
            "ok" => Ok(Announced::Registered),
            other => Err(io::Error::other(format!(
                "prjquota-exporter answered {:?}",
                other.strip_prefix("error ").unwrap_or(other)
            ))),
        },
    }
}

/// Sends `line` to the exporter listening as `name` and returns its
/// answer line (without the newline), at most `max` bytes; `None` when no
/// exporter listens. One deadline for it all.
fn exchange(name: &[u8], line: &str, wait: Duration, max: usize) -> io::Result<Option<String>> {
    let deadline = Instant::now() + wait;
    let sock = loop {
        match sys::connect_abstract_nonblocking(name) {
            Ok(s) => break s,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                ) =>
            {
                return Ok(None)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "the process listening as prjquota-exporter accepted no connection within {}s",
                            wait.as_secs()
                        ),
                    ));
                }
                std::thread::sleep(CONNECT_RETRY);
            }
            Err(e) => return Err(e),
        }
    };
    check_peer(sock.as_fd())?;
    let stream = UnixStream::from(sock);
    stream.set_nonblocking(false)?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    stream.set_write_timeout(Some(left))?;
    stream.set_read_timeout(Some(left))?;
    (&stream).write_all(line.as_bytes())?;
    let mut reply = String::new();
    BufReader::new(stream.take(max as u64)).read_line(&mut reply)?;
    if !reply.ends_with('\n') {
        return Err(io::Error::other(format!(
            "prjquota-exporter's answer was cut short after {} bytes",
            reply.len()
        )));
    }
    reply.pop();
    Ok(Some(reply))
}

/// One volume as Nomad's list and its own endpoint found it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NomadVolume {
    pub volume_id: String,
    pub namespace: String,
    pub verdict: Verdict,
    /// What Nomad answered, for the operator.
    pub detail: String,
}

/// What Nomad says of a volume this node holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Nomad lists it on this node.
    Listed,
    /// Nomad knows it, on another node.
    Elsewhere,
    /// Nomad's list does not have it, its own endpoint answers 404 and
    /// no namespace or node has its ID: Nomad does not know it.
    Unknown,
}

/// The exporter's answer to `nomad-volumes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NomadVolumes {
    /// The Nomad agent asked.
    pub nomad_addr: String,
    /// The Ready volumes of the directory, as the exporter read them.
    pub volumes: Vec<NomadVolume>,
}

/// The longest `nomad-volumes` answer: ten thousand volumes are about
/// 2 MiB of JSON.
pub const MAX_NOMAD_ANSWER: usize = 64 << 20;

/// Asks the exporter of `volumes_dir` which of its volumes Nomad knows,
/// waiting at most `wait`; `Ok(None)` when no exporter listens, `Err` with
/// the exporter's reason when it cannot tell (no Nomad client configured,
/// Nomad unreachable or refusing).
pub fn nomad_volumes(volumes_dir: &Path, wait: Duration) -> io::Result<Option<NomadVolumes>> {
    let name = socket_name(volumes_dir).ok_or_else(|| {
        io::Error::other("the volumes directory's path is too long for a socket name")
    })?;
    let line = request_line(NOMAD_VOLUMES, volumes_dir)
        .ok_or_else(|| io::Error::other("the volumes directory is not a one-line UTF-8 path"))?;
    let Some(reply) = exchange(&name, &line, wait, MAX_NOMAD_ANSWER)? else {
        return Ok(None);
    };
    if let Some(why) = reply.strip_prefix("error ") {
        return Err(io::Error::other(why.to_string()));
    }
    serde_json::from_str(&reply).map(Some).map_err(|e| {
        io::Error::other(format!(
            "prjquota-exporter's answer is not what was asked: {e}"
        ))
    })
}

/// How often a connect to a listener whose backlog is full is tried again.
const CONNECT_RETRY: Duration = Duration::from_millis(20);

/// `CAP_SYS_ADMIN` (include/uapi/linux/capability.h).
const CAP_SYS_ADMIN: u32 = 21;

/// The listener must be what the exporter is: root, in the initial user
/// namespace, with `CAP_SYS_ADMIN` in its effective set. An abstract name
/// has no permissions: anyone in the network namespace can bind it,
/// including root in a default container (uid 0 without `CAP_SYS_ADMIN`).
fn check_peer(sock: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    let (pid, uid) = sys::peer_cred(sock)?;
    let refuse = |why: String| {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("the process listening as prjquota-exporter (pid {pid}) {why}: ignored"),
        )
    };
    if uid != 0 {
        return Err(refuse(format!("runs as uid {uid}, not root")));
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| refuse(format!("cannot be inspected ({e})")))?;
    if !has_capability(&status, CAP_SYS_ADMIN) {
        return Err(refuse("lacks CAP_SYS_ADMIN".into()));
    }
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/user"));
    match (ns(&pid.to_string()), ns("self")) {
        (Ok(theirs), Ok(ours)) if theirs == ours => Ok(()),
        (Ok(_), Ok(_)) => Err(refuse("runs in another user namespace".into())),
        (Err(e), _) | (_, Err(e)) => Err(refuse(format!("cannot be inspected ({e})"))),
    }
}

/// Whether the `CapEff:` line of a `/proc/<pid>/status` text holds `cap`.
fn has_capability(status: &str, cap: u32) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|set| set >> cap & 1 == 1)
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
            Request::Sync(Path::new("/opt/nomad/data/host_volumes"))
        );
        let line = request_line(NOMAD_VOLUMES, Path::new("/v")).unwrap();
        assert_eq!(line, "nomad-volumes /v\n");
        assert_eq!(
            parse_request(&line).unwrap(),
            Request::NomadVolumes(Path::new("/v"))
        );
        assert!(request(Path::new("/a\nb")).is_none());
        assert!(parse_request("sync relative\n").is_err());
        assert!(parse_request("delete /x\n").is_err());
        assert!(parse_request("sync\n").is_err());
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
        use std::os::linux::net::SocketAddrExt;
        use std::os::unix::net::{SocketAddr, UnixListener};
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

    #[test]
    fn capabilities_are_read_from_the_status_text() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert!(has_capability(status, CAP_SYS_ADMIN));
        // Root in a default Docker container: no CAP_SYS_ADMIN (bit 21).
        let docker = "CapEff:\t00000000a80425fb\n";
        assert!(!has_capability(docker, CAP_SYS_ADMIN));
        assert!(!has_capability("CapEff:\tzz\n", CAP_SYS_ADMIN));
        assert!(!has_capability("", CAP_SYS_ADMIN));
    }

    /// A listener that never accepts, its backlog full, as a squatter
    /// leaves it: the announce gives up within its wait instead of
    /// blocking in connect until Nomad kills the create.
    #[test]
    fn a_listener_that_never_accepts_costs_at_most_the_wait() {
        use std::os::linux::net::SocketAddrExt;
        use std::os::unix::net::{SocketAddr, UnixListener};
        let dir = format!("/prjquota-test-squat-{}", std::process::id());
        let name = socket_name(Path::new(&dir)).unwrap();
        let _listener =
            UnixListener::bind_addr(&SocketAddr::from_abstract_name(&name).unwrap()).unwrap();
        let mut held = Vec::new();
        loop {
            match sys::connect_abstract_nonblocking(&name) {
                Ok(s) => held.push(s),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("filling the backlog: {e}"),
            }
            assert!(held.len() < 100_000, "the backlog never filled");
        }
        let start = Instant::now();
        let got = announce(Path::new(&dir), Duration::from_millis(500));
        let took = start.elapsed();
        let err = got.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(took < Duration::from_secs(3), "took {took:?}");
    }

    /// The effective uid: the owner of this process's /proc entry.
    fn nix_uid() -> u32 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self")
            .expect("stat /proc/self")
            .uid()
    }
}
