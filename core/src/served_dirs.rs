//! Which volumes directories the plugin on this host has served, so that
//! an exporter can tell whether it watches the one Nomad's plugin writes
//! to. An exporter given another `--volumes-dir` than Nomad's
//! `host_volumes_dir` exports nothing, and nothing else looks wrong.
//!
//! Every `create` (a new volume, a restore, an update) leaves a marker of
//! its volumes directory in `/run/prjquota/volumes-dirs`, one small file
//! per directory: the directory as resolved (`announce::canonical`, the
//! form both sides name it by) and the Nomad node's ID. `/run` is a tmpfs,
//! so the markers go at a reboot, and Nomad's restore at the agent's start
//! writes them again. The file's name is a hash of the path as Nomad gave
//! it, so a create whose marker exists pays one `stat` for it.
//!
//! The exporter reads them all at each scrape. Only root may write there
//! ([`run_dir::check_root_only`]), and a file that is not root's regular
//! file is refused, so a marker names a directory the plugin really served.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::run_dir;

/// Where the markers live, below [`run_dir::RUN_DIR`].
pub const DIR: &str = "/run/prjquota/volumes-dirs";

/// A marker is a line of JSON; a larger file is not one.
pub const MAX_MARKER_BYTES: u64 = 8192;

/// A volumes directory the plugin served, as its marker says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Served {
    /// The directory, resolved when the plugin wrote the marker.
    pub volumes_dir: PathBuf,
    /// The Nomad node it served (`DHV_NODE_ID`).
    pub node_id: String,
}

/// The marker's file name for `volumes_dir` as Nomad spells it: the 64-bit
/// FNV-1a hash of the path without a trailing slash, in hex. Two spellings
/// of one directory (a symlink, a trailing slash) make two markers naming
/// the same resolved directory, which the reader counts once.
pub fn marker_name(volumes_dir: &Path) -> String {
    let path: PathBuf = volumes_dir.components().collect();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.as_os_str().as_encoded_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Records that the plugin served `volumes_dir` for node `node_id`, unless
/// a marker of it is there already (one `stat`). `dir` is [`DIR`] but in
/// tests. A failure is for the caller to log: the operation it belongs to
/// is done either way.
pub fn note(dir: &Path, volumes_dir: &Path, node_id: &str) -> io::Result<()> {
    let name = marker_name(volumes_dir);
    let marker = dir.join(&name);
    if std::fs::symlink_metadata(&marker).is_ok() {
        return Ok(());
    }
    if dir == Path::new(DIR) {
        // Made root's and 0700, or refused when someone else made it.
        run_dir::open()?;
    }
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    check_dir(dir)?;
    let served = Served {
        volumes_dir: crate::announce::canonical(volumes_dir),
        node_id: node_id.to_string(),
    };
    let mut text = serde_json::to_vec(&served).map_err(io::Error::other)?;
    text.push(b'\n');
    // Whole or not at all: a reader never sees half a marker.
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    std::fs::write(&tmp, &text)?;
    std::fs::rename(&tmp, &marker).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// The markers' directory must be root's and writable by root only.
fn check_dir(dir: &Path) -> io::Result<()> {
    let f = std::fs::File::open(dir)?;
    run_dir::check_root_only(std::os::fd::AsFd::as_fd(&f), &dir.display())
}

/// Every volumes directory a marker in `dir` names, each once, in path
/// order; none when `dir` does not exist (no plugin ran since boot). An
/// error names the file or the directory that is not what the plugin
/// writes.
pub fn read_all(dir: &Path) -> io::Result<Vec<Served>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    check_dir(dir)?;
    let mut out: Vec<Served> = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        // A marker being written (`.<name>.<pid>`).
        if name.as_encoded_bytes().starts_with(b".") {
            continue;
        }
        let path = entry.path();
        let bad = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
        let m = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if !m.file_type().is_file() || m.uid() != 0 || m.len() > MAX_MARKER_BYTES {
            return Err(bad(format!(
                "{} is not a marker of the plugin (a regular file of root's, at most {MAX_MARKER_BYTES} bytes): remove it",
                path.display()
            )));
        }
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let served: Served = serde_json::from_slice(&text).map_err(|e| {
            bad(format!(
                "{} is not a marker of the plugin ({e}): remove it",
                path.display()
            ))
        })?;
        if !out.iter().any(|s| s.volumes_dir == served.volumes_dir) {
            out.push(served);
        }
    }
    out.sort_by(|a, b| a.volumes_dir.cmp(&b.volumes_dir));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("prjquota-served-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn is_root() -> bool {
        std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
    }

    #[test]
    fn names_ignore_a_trailing_slash_and_differ_by_path() {
        assert_eq!(
            marker_name(Path::new("/opt/nomad/data/host_volumes/")),
            marker_name(Path::new("/opt/nomad/data/host_volumes"))
        );
        assert_ne!(marker_name(Path::new("/a")), marker_name(Path::new("/b")));
        assert_eq!(marker_name(Path::new("/a")).len(), 16);
    }

    #[test]
    fn a_noted_directory_is_read_back_once_however_it_is_spelled() {
        let base = scratch("note");
        if !is_root() {
            // The markers are root's: anyone else's directory is refused.
            let e = note(&base.join("markers"), &base, "node-1").unwrap_err();
            assert!(e.to_string().contains("must be root's"), "{e}");
            return;
        }
        let markers = base.join("markers");
        let volumes = base.join("volumes");
        std::fs::create_dir(&volumes).unwrap();
        std::os::unix::fs::symlink(&volumes, base.join("link")).unwrap();
        assert_eq!(read_all(&markers).unwrap(), Vec::new(), "no dir: none");
        note(&markers, &volumes, "node-1").unwrap();
        note(&markers, &base.join("link"), "node-1").unwrap();
        let mut again = volumes.clone().into_os_string();
        again.push("/");
        note(&markers, Path::new(&again), "node-1").unwrap();
        let got = read_all(&markers).unwrap();
        assert_eq!(
            got,
            vec![Served {
                volumes_dir: std::fs::canonicalize(&volumes).unwrap(),
                node_id: "node-1".into()
            }]
        );
        // Two spellings, two markers, one directory.
        assert_eq!(std::fs::read_dir(&markers).unwrap().count(), 2);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn what_the_plugin_does_not_write_is_refused_by_name() {
        let base = scratch("refuse");
        let markers = base.join("markers");
        if !is_root() {
            assert!(note(&markers, &base, "node-1").is_err());
            return;
        }
        note(&markers, &base, "node-1").unwrap();
        std::fs::write(markers.join("junk"), b"not json").unwrap();
        let e = read_all(&markers).unwrap_err();
        assert!(e.to_string().contains("junk"), "{e}");
        std::fs::remove_file(markers.join("junk")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", markers.join("link")).unwrap();
        assert!(read_all(&markers).is_err());
        std::fs::remove_file(markers.join("link")).unwrap();
        // A directory others may write is no evidence.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&markers, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(read_all(&markers).is_err());
        assert!(note(&markers, Path::new("/elsewhere"), "node-1").is_err());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
