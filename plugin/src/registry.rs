//! The volume registry: which project ID belongs to which Nomad volume.
//!
//! Project IDs are per filesystem, so the registry lives on the volumes
//! filesystem itself, beside the volumes:
//!
//! ```text
//! <volumes dir>/.prjquota/
//!     alloc.lock            held while a project ID is chosen and recorded
//!     volumes/<id>.json     one record per volume (the exporter's inventory)
//!     locks/<id>.lock       held for the whole of one create or delete
//!     ids/<project ID>      the volume ID a project ID is reserved for
//!     ledger                the sum of the records' promises and the next
//!                           free project ID (see `crate::ledger`)
//! ```
//!
//! The `ids/` reservations let a create see every project ID in use with one
//! directory listing instead of parsing every record. A reservation is made
//! before its record and released after it, so the set of reservations always
//! covers the set of recorded IDs; a crash can only leave a reservation
//! behind (`prjquota reconcile` clears it), never an ID in use unreserved.
//! Reservations are seen only by this directory's creates; other volumes
//! directories on the filesystem see a new ID through its kernel limit,
//! set before the reservation (`ops::allocate_and_claim`, [`lock_filesystem`]).
//!
//! Records are replaced atomically (write a temp file, sync its content,
//! rename, fsync the directory), so a reader — another plugin process or the
//! exporter — sees either the old or the new record, never a torn one, and
//! needs no lock.
//!
//! Where the filesystem's journal commits metadata in order, the
//! intermediate writes of one operation (a reservation, a `creating` or
//! `deleting` record) skip the directory fsync ([`Durable::ByNextSync`]),
//! and a record's content is written to the device without a commit of its
//! own ([`Registry::store`]): the operation's last directory fsync commits
//! them all, and anything that depends on one of them comes later in the
//! journal, so no commit can make it durable without them. On a busy
//! filesystem each fsync waits for a journal commit: a create made five,
//! then three, now one. The power-cut tests (`tests/tests/crash.rs`) cut
//! the power at every step.

use std::ffi::CString;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Context, Result};

// The record format and its one reader are core's, shared with the
// exporter; this module owns the directory around them (locks, IDs, writes).
use prjquota_core::record::{is_temp_file, record_file_name, record_stem, temp_file_name, VOLUMES};
pub use prjquota_core::record::{
    parse_record_bytes, read_record, records_dir, Record, State, DIR_NAME, MAX_RECORD_BYTES,
    RECORD_VERSION,
};

use crate::contract::VolumeId;
use crate::fs::VolumesFs;
use crate::ledger::Ledger;
use prjquota_core::lock_file::LockFile;
use prjquota_core::sys;

const LOCKS: &str = "locks";
const IDS: &str = "ids";
const ALLOC_LOCK: &str = "alloc.lock";
const LEDGER: &str = "ledger";
const LEDGER_TMP: &str = "ledger.tmp";

pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn c(name: &str) -> CString {
    CString::new(name).expect("registry names never contain NUL")
}

/// Opens (creating if asked) a directory below `parent`, never following a
/// symlink: a `.prjquota` that is a link is an attack or a mistake, not a
/// registry.
fn open_subdir(parent: BorrowedFd<'_>, name: &str, create: bool) -> io::Result<OwnedFd> {
    let n = c(name);
    let open = || {
        sys::openat(
            parent,
            &n,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )
    };
    // Opened first: the directories exist for every call but the first.
    match open() {
        Err(e) if create && e.kind() == io::ErrorKind::NotFound => {}
        done => return done,
    }
    match sys::mkdirat(parent, &n, 0o700) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    open()
}

/// An exclusive `flock` held until dropped (`prjquota_core::lock_file`).
pub type Lock = LockFile;

/// How long a call waits for a lock another run holds: well inside
/// Nomad's 60 s, so that the operator reads why instead of a killed plugin.
pub const LOCK_WAIT: Duration = Duration::from_secs(45);

/// Takes an exclusive lock on `dir/name`, creating the file, waiting at
/// most [`LOCK_WAIT`].
fn lock_file(dir: BorrowedFd<'_>, name: &str) -> io::Result<Lock> {
    LockFile::take_within(dir, name, LOCK_WAIT)
}

/// Where the filesystem-wide allocation locks live. Not on the volumes
/// filesystem: two volumes directories on one filesystem may be reached
/// through different bind mounts, with no directory both can see, while
/// every plugin run on a host sees the same `/run`.
pub use prjquota_core::run_dir::RUN_DIR;

/// Serialises the choice and kernel claim of project IDs among every volumes
/// directory of the filesystem with device number `dev` on this host
/// (`/run/prjquota/fs-<dev>.lock`). Project IDs belong to the filesystem;
/// a registry's own allocation lock covers only its directory.
pub fn lock_filesystem(dev: u64) -> io::Result<Lock> {
    prjquota_core::run_dir::lock_within(&format!("fs-{dev:x}.lock"), LOCK_WAIT)
}

/// When a registry write must be on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durable {
    /// Before the call returns.
    Now,
    /// No later than the next fsync on this filesystem (any later write of
    /// the same operation, or its final [`Durable::Now`]), when the journal
    /// orders metadata ([`Registry::follow_journal_of`]); otherwise `Now`.
    /// For writes that only a later step of the same operation depends on.
    ByNextSync,
}

/// The registry of one volumes directory.
#[derive(Debug)]
pub struct Registry {
    path: PathBuf,
    root: OwnedFd,
    volumes: OwnedFd,
    locks: OwnedFd,
    ids: OwnedFd,
    /// The registry sits on a filesystem whose journal commits metadata in
    /// order: see [`Durable::ByNextSync`].
    journal_ordered: std::cell::Cell<bool>,
}

impl Registry {
    /// Opens the registry below `volumes_dir` (an open descriptor of it),
    /// creating it when `create` is set. Without `create`, a missing registry
    /// is `Ok(None)`: no volume was ever made here.
    pub fn open(
        volumes_dir: BorrowedFd<'_>,
        volumes_path: &Path,
        create: bool,
    ) -> Result<Option<Registry>> {
        let path = volumes_path.join(DIR_NAME);
        let ctx = || format!("cannot open the prjquota registry {}", path.display());
        let root = match open_subdir(volumes_dir, DIR_NAME, create) {
            Ok(fd) => fd,
            Err(e) if !create && e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(anyhow!(
                    "{} is a symlink; the registry must be a real directory: move the link away and run `prjquota reconcile`",
                    path.display()
                ))
            }
            Err(e) => return Err(e).with_context(ctx),
        };
        // The exporter makes the registry's directory alone on a node with
        // no volume yet (its start-up self-test writes its probe there):
        // without the records' directory no volume was ever made here.
        let volumes = match open_subdir(root.as_fd(), VOLUMES, create) {
            Err(e) if !create && e.kind() == io::ErrorKind::NotFound => return Ok(None),
            r => r.with_context(ctx)?,
        };
        // Past the records' directory the registry is in use, so its other
        // directories are made whatever `create` says: a create makes them
        // one by one after the records' directory, and a delete racing the
        // node's first create, or a registry older than `ids/`, would
        // otherwise fail on a directory that is merely not made yet.
        let locks = open_subdir(root.as_fd(), LOCKS, true).with_context(ctx)?;
        prjquota_core::run_dir::check_root_only(root.as_fd(), &path.display())?;
        prjquota_core::run_dir::check_root_only(locks.as_fd(), &path.join(LOCKS).display())?;
        let ids = open_subdir(root.as_fd(), IDS, true).with_context(ctx)?;
        Ok(Some(Registry {
            path,
            root,
            volumes,
            locks,
            ids,
            journal_ordered: std::cell::Cell::new(false),
        }))
    }

    /// Lets [`Durable::ByNextSync`] writes skip their fsync where the
    /// volumes filesystem's journal commits metadata in order
    /// ([`VolumesFs::journal_orders_metadata`]), and the registry is on that
    /// filesystem (a mount placed on it would have its own journal, and one
    /// fsync would not order the two). Called by operations that write.
    pub fn follow_journal_of(&self, vfs: &VolumesFs) {
        let same_fs = sys::fstat(self.volumes.as_fd()).is_ok_and(|st| st.st_dev == vfs.dev);
        self.journal_ordered
            .set(same_fs && vfs.journal_orders_metadata());
    }

    fn sync_dir(&self, dir: BorrowedFd<'_>, when: Durable) -> io::Result<()> {
        if when == Durable::ByNextSync && self.journal_ordered.get() {
            return Ok(());
        }
        sys::fsync(dir)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serialises all create and delete work on one volume, across processes.
    pub fn lock_volume(&self, id: &VolumeId) -> Result<Lock> {
        lock_file(self.locks.as_fd(), &format!("{id}.lock"))
            .with_context(|| format!("cannot lock volume {id} in {}", self.path.display()))
    }

    /// Serialises project-ID allocation across processes.
    pub fn lock_allocation(&self) -> Result<Lock> {
        lock_file(self.root.as_fd(), ALLOC_LOCK)
            .with_context(|| format!("cannot take the allocation lock in {}", self.path.display()))
    }

    /// Removes a volume's lock file. Only called while holding that lock, at
    /// the end of a delete; `lock_file` copes with the race this opens.
    pub fn forget_lock(&self, id: &VolumeId) -> Result<()> {
        match sys::unlinkat(self.locks.as_fd(), &c(&format!("{id}.lock")), false) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("cannot remove the lock file of volume {id}"))
            }
            _ => Ok(()),
        }
    }

    /// The record of one volume, if there is one.
    pub fn load(&self, id: &VolumeId) -> Result<Option<Record>> {
        let name = record_file_name(id);
        let fd = match sys::openat(
            self.volumes.as_fd(),
            &c(&name),
            libc::O_RDONLY | libc::O_NOFOLLOW,
            0,
        ) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("cannot read {}/{VOLUMES}/{name}", self.path.display())
                })
            }
        };
        let rec = read_record(std::fs::File::from(fd), id.as_str()).with_context(|| {
            format!(
                "the record {}/{VOLUMES}/{name} is unreadable; run `prjquota reconcile` to inspect it",
                self.path.display()
            )
        })?;
        Ok(Some(rec))
    }

    /// Replaces a volume's record atomically, durably `when` asked. The temp
    /// file's content is on the device before the rename, so that no crash
    /// can leave the new name on an empty file.
    ///
    /// Where the journal orders metadata, the content is written and waited
    /// for ([`sys::write_data_and_wait`]) without a journal commit of its
    /// own: the file's size and blocks were logged when that write
    /// completed, before the rename, so any commit that makes the rename
    /// durable makes them durable too, and the commit's cache flush takes
    /// the data already written with it. A create then waits for one
    /// journal commit (its `ready` record's directory sync), not three.
    /// Elsewhere the temp file is fsynced.
    pub fn store(&self, rec: &Record, when: Durable) -> Result<()> {
        let name = record_file_name(&rec.volume_id);
        let tmp = temp_file_name(&rec.volume_id);
        let ctx = || format!("cannot write {}/{VOLUMES}/{name}", self.path.display());
        let mut body = serde_json::to_vec_pretty(rec).with_context(ctx)?;
        body.push(b'\n');
        let fd = sys::openat(
            self.volumes.as_fd(),
            &c(&tmp),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NOFOLLOW,
            0o600,
        )
        .with_context(ctx)?;
        let mut f = std::fs::File::from(fd);
        f.write_all(&body).with_context(ctx)?;
        if self.journal_ordered.get() {
            sys::write_data_and_wait(f.as_fd()).with_context(ctx)?;
        } else {
            f.sync_all().with_context(ctx)?;
        }
        drop(f);
        sys::renameat(self.volumes.as_fd(), &c(&tmp), &c(&name)).with_context(ctx)?;
        self.sync_dir(self.volumes.as_fd(), when)
            .with_context(ctx)?;
        Ok(())
    }

    /// Removes a volume's record (and any temp file of it), durably.
    pub fn remove(&self, id: &VolumeId) -> Result<()> {
        let name = record_file_name(id);
        for n in [temp_file_name(id), name.clone()] {
            match sys::unlinkat(self.volumes.as_fd(), &c(&n), false) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("cannot remove {}/{VOLUMES}/{n}", self.path.display())
                    })
                }
            }
        }
        sys::fsync(self.volumes.as_fd())
            .with_context(|| format!("cannot sync {}/{VOLUMES}", self.path.display()))
    }

    /// Reserves project ID `pid` for volume `id`: an empty file
    /// `ids/<pid>.<volume ID>`. Call under the allocation lock, after
    /// checking [`Registry::reservations`]. Reserving again is a no-op.
    pub fn reserve_id(&self, pid: u32, id: &VolumeId, when: Durable) -> Result<()> {
        let ctx = || {
            format!(
                "cannot reserve project ID {pid} in {}/{IDS}",
                self.path.display()
            )
        };
        let fd = sys::openat(
            self.ids.as_fd(),
            &c(&format!("{pid}.{id}")),
            libc::O_WRONLY | libc::O_CREAT | libc::O_NOFOLLOW,
            0o600,
        )
        .with_context(ctx)?;
        drop(fd);
        self.sync_dir(self.ids.as_fd(), when).with_context(ctx)
    }

    /// Whether `pid` is reserved for `id` (one `fstatat`).
    pub fn is_reserved(&self, pid: u32, id: &VolumeId) -> bool {
        sys::fstatat_nofollow(self.ids.as_fd(), &c(&format!("{pid}.{id}"))).is_ok()
    }

    /// Releases a reservation (after the volume's record is gone).
    pub fn release_id(&self, pid: u32, id: &VolumeId) -> Result<()> {
        match sys::unlinkat(self.ids.as_fd(), &c(&format!("{pid}.{id}")), false) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e).with_context(|| {
                format!("cannot release project ID {pid} in {}", self.path.display())
            }),
            _ => Ok(()),
        }
    }

    /// Every reservation: (project ID, volume ID), from one directory listing.
    pub fn reservations(&self) -> Result<Vec<(u32, VolumeId)>> {
        Ok(sys::read_dir(self.ids.as_fd())
            .with_context(|| format!("cannot list {}/{IDS}", self.path.display()))?
            .into_iter()
            .filter_map(|e| {
                let name = e.name.into_string().ok()?;
                let (pid, id) = name.split_once('.')?;
                Some((pid.parse().ok()?, VolumeId::parse(id).ok()?))
            })
            .collect())
    }

    /// Whether this registry keeps a ledger: only where the journal orders
    /// metadata (see [`crate::ledger`]), known once
    /// [`Registry::follow_journal_of`] was called.
    pub fn keeps_ledger(&self) -> bool {
        self.journal_ordered.get()
    }

    /// The ledger, when there is one written whole. Call under the
    /// allocation lock.
    pub fn read_ledger(&self) -> Option<Ledger> {
        if !self.keeps_ledger() {
            // One left from when this filesystem ordered its metadata (or
            // read before [`Registry::follow_journal_of`]) would not be
            // kept up to date from here on.
            let _ = self.drop_ledger();
            return None;
        }
        let fd = sys::openat(
            self.root.as_fd(),
            &c(LEDGER),
            libc::O_RDONLY | libc::O_NOFOLLOW,
            0,
        )
        .ok()?;
        let mut text = Vec::with_capacity(256);
        use std::io::Read;
        std::fs::File::from(fd)
            .take(4096)
            .read_to_end(&mut text)
            .ok()?;
        Ledger::decode(&text)
            .filter(|l| Some((l.ids_changed, l.records_changed)) == self.last_changes())
    }

    /// When the reservations' and the records' directories last changed
    /// (see [`Ledger::ids_changed`]).
    fn last_changes(&self) -> Option<(u64, u64)> {
        let changed = |fd: &OwnedFd| {
            let st = sys::fstat(fd.as_fd()).ok()?;
            Some((st.st_mtime as u64).saturating_mul(1_000_000_000) + st.st_mtime_nsec as u64)
        };
        Some((changed(&self.ids)?, changed(&self.volumes)?))
    }

    /// [`Registry::store`] for a write that changes no promise and no
    /// reservation (a record's state, its labels), under the allocation
    /// lock: a ledger that was right before it is stamped again after it,
    /// so that the next create still trusts it.
    pub fn store_keeping_ledger(&self, rec: &Record, when: Durable) -> Result<()> {
        let before = self.read_ledger();
        self.store(rec, when)?;
        match before {
            Some(l) => self.write_ledger(&l),
            None => Ok(()),
        }
    }

    /// Removes the ledger: the first step of any change to a promise or a
    /// reservation, under the allocation lock.
    pub fn drop_ledger(&self) -> Result<()> {
        match sys::unlinkat(self.root.as_fd(), &c(LEDGER), false) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("cannot remove {}/{LEDGER}", self.path.display()))
            }
            _ => Ok(()),
        }
    }

    /// Writes the ledger whole under its name, with no fsync: the
    /// operation's own durable writes came before it in the journal, and a
    /// copy whose content was lost fails its checksum.
    pub fn write_ledger(&self, ledger: &Ledger) -> Result<()> {
        if !self.keeps_ledger() {
            return Ok(());
        }
        let ctx = || format!("cannot write {}/{LEDGER}", self.path.display());
        let (ids_changed, records_changed) = self
            .last_changes()
            .ok_or_else(|| anyhow!("cannot stat {}/{IDS} or {VOLUMES}", self.path.display()))
            .with_context(ctx)?;
        let ledger = Ledger {
            ids_changed,
            records_changed,
            ..*ledger
        };
        let fd = sys::openat(
            self.root.as_fd(),
            &c(LEDGER_TMP),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NOFOLLOW,
            0o600,
        )
        .with_context(ctx)?;
        std::fs::File::from(fd)
            .write_all(ledger.encode().as_bytes())
            .with_context(ctx)?;
        sys::renameat(self.root.as_fd(), &c(LEDGER_TMP), &c(LEDGER)).with_context(ctx)
    }

    /// Leftover temp files of interrupted record writes (`.<id>.json.tmp`).
    pub fn temp_files(&self) -> Result<Vec<String>> {
        Ok(sys::read_dir(self.volumes.as_fd())
            .with_context(|| format!("cannot list {}/{VOLUMES}", self.path.display()))?
            .into_iter()
            .filter_map(|e| e.name.into_string().ok())
            .filter(|n| is_temp_file(n))
            .collect())
    }

    /// Removes one temp file found by [`Registry::temp_files`].
    pub fn remove_temp_file(&self, name: &str) -> Result<()> {
        match sys::unlinkat(self.volumes.as_fd(), &c(name), false) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e)
                .with_context(|| format!("cannot remove {}/{VOLUMES}/{name}", self.path.display())),
            _ => Ok(()),
        }
    }

    /// Volume IDs that have a lock file.
    pub fn locked_ids(&self) -> Result<Vec<VolumeId>> {
        Ok(sys::read_dir(self.locks.as_fd())
            .with_context(|| format!("cannot list {}/{LOCKS}", self.path.display()))?
            .into_iter()
            .filter_map(|e| e.name.into_string().ok())
            .filter_map(|n| {
                n.strip_suffix(".lock")
                    .and_then(|id| VolumeId::parse(id).ok())
            })
            .collect())
    }

    /// Every record, in volume-ID order. Entries that are not records are
    /// ignored; a record that cannot be parsed is returned as an error entry
    /// so callers can report it without losing the others.
    pub fn load_all(&self) -> Result<Vec<Entry>> {
        load_all_from(self.volumes.as_fd())
            .with_context(|| format!("cannot list {}/{VOLUMES}", self.path.display()))
    }
}

/// One file of the registry as read: a record, or why it is unusable.
#[derive(Debug)]
pub enum Entry {
    Record(Box<Record>),
    Corrupt { file: String, error: String },
}

fn load_all_from(dir: BorrowedFd<'_>) -> io::Result<Vec<Entry>> {
    let mut names: Vec<String> = sys::read_dir(dir)?
        .into_iter()
        .filter_map(|e| e.name.into_string().ok())
        .filter(|n| record_stem(std::ffi::OsStr::new(n)).is_some())
        .collect();
    names.sort();
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let id = record_stem(std::ffi::OsStr::new(&name)).expect("filtered above");
        let fd = match sys::openat(dir, &c(&name), libc::O_RDONLY | libc::O_NOFOLLOW, 0) {
            Ok(fd) => fd,
            // Deleted between listing and opening: the volume is gone.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => {
                out.push(Entry::Corrupt {
                    file: name,
                    error: e.to_string(),
                });
                continue;
            }
        };
        match read_record(std::fs::File::from(fd), id) {
            Ok(r) => out.push(Entry::Record(Box::new(r))),
            Err(e) => out.push(Entry::Corrupt {
                file: name,
                error: format!("{e:#}"),
            }),
        }
    }
    Ok(out)
}

/// Reads every record below a volumes directory without creating or locking
/// anything: the exporter's and `prjquota list`'s view. A volumes directory
/// without a registry holds no volumes.
pub fn read_all(volumes_dir: &Path) -> io::Result<Vec<Entry>> {
    let dir = records_dir(volumes_dir);
    let f = match std::fs::File::open(&dir) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let fd = OwnedFd::from(f);
    load_all_from(fd.as_fd())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn scratch(tag: &str) -> (PathBuf, OwnedFd) {
        let dir = std::env::temp_dir().join(format!("prjquota-lock-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let fd = std::fs::File::open(&dir).unwrap().into();
        (dir, fd)
    }

    #[test]
    fn a_lock_held_elsewhere_is_waited_for_only_so_long() {
        let (dir, fd) = scratch("wait");
        let held = LockFile::take_within(fd.as_fd(), "v.lock", Duration::from_secs(1)).unwrap();
        // flock locks belong to the open file description: a second open
        // conflicts even in this process, as another run would.
        let start = Instant::now();
        let err =
            LockFile::take_within(fd.as_fd(), "v.lock", Duration::from_millis(300)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(
            err.to_string().contains("another prjquota run holds it"),
            "{err}"
        );
        assert!(start.elapsed() < Duration::from_secs(5));
        drop(held);
        LockFile::take_within(fd.as_fd(), "v.lock", Duration::from_millis(300)).unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_lock_file_that_is_not_a_regular_file_is_refused() {
        let (dir, fd) = scratch("fifo");
        nix::unistd::mkfifo(
            &dir.join("v.lock"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        let err =
            LockFile::take_within(fd.as_fd(), "v.lock", Duration::from_millis(300)).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_lock_directory_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let (dir, fd) = scratch("mode");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = prjquota_core::run_dir::check_root_only(fd.as_fd(), &dir.display()).unwrap_err();
        assert!(err.to_string().contains("writable by root only"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// What the exporter's self-test leaves on a node with no volume yet:
    /// the registry's directory holding its probe's and nothing else. A
    /// delete, `check` or `reconcile` there finds no registry; a create
    /// completes it.
    #[test]
    fn a_registry_with_no_records_directory_is_no_registry() {
        let (dir, fd) = scratch("selftest-only");
        std::fs::create_dir_all(dir.join(DIR_NAME).join("selftest")).unwrap();
        let reg = Registry::open(fd.as_fd(), &dir, false).unwrap();
        assert!(reg.is_none(), "{reg:?}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A delete that runs while the node's first create is still making the
    /// registry (the records' directory made, the locks' not yet), or on a
    /// registry from before project-ID reservations, opens it and finds its
    /// volume's record, or none, instead of failing on a missing directory.
    #[test]
    fn a_registry_with_only_its_records_directory_opens_without_create() {
        let (dir, fd) = scratch("half-made");
        std::fs::create_dir_all(dir.join(DIR_NAME).join(VOLUMES)).unwrap();
        let reg = Registry::open(fd.as_fd(), &dir, false)
            .unwrap()
            .expect("a registry with a records directory");
        let id = VolumeId::parse("b47c806e-68ed-4ec3-824e-77651285c31f").unwrap();
        assert!(reg.load(&id).unwrap().is_none());
        drop(reg.lock_volume(&id).unwrap());
        assert!(dir.join(DIR_NAME).join(IDS).is_dir());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
