//! Keeps the pinned guard's maps equal to the registries, on a timer of its
//! own (`--guard.sync-interval`), not on scrapes; and puts back the project
//! ID and PROJINHERIT of any volume root that lost them.
//!
//! The plugin writes a new volume's root into the maps itself before the
//! create returns, and takes it out at delete (`docs/security.md`). This
//! sync is what fills fresh maps at start-up and repairs what went past the
//! plugin (a plugin that ran while no guard was pinned, an older plugin,
//! a root re-tagged by hand). To never undo the plugin, one round:
//!
//! 1. snapshots the keys in the maps,
//! 2. then lists the registries (a record is stored before the plugin
//!    writes the maps),
//! 3. adds or updates every root of a `creating`, `ready` or `deleting`
//!    record that exists (a delete removes the tree before the root leaves
//!    the guard), and deletes only snapshot keys that no record has: an
//!    entry the plugin added after step 1 stays.
//!
//! A registry that cannot be read, or a root that cannot be opened for
//! another reason than being gone, deletes nothing in that round.
//!
//! A record this exporter cannot read (a newer plugin's record version, a
//! corrupt or unreadable file) does not take its volume out of the guard:
//! its root (`<volumes dir>/<volume ID>`, the ID from the file name) is
//! guarded with the project ID the root itself carries, never re-tagged.
//! The registry collector reports the record.
//!
//! With `--nomad.alloc-dir`, the accounted allocations' directories are
//! wanted roots too, as the scan thread last handed them over
//! ([`GuardedRoots`]); a round before its first scan removes nothing.
//!
//! Cheap when nothing changed. A round opens every root (one open, fstat
//! and two ioctls each) only when something may have moved one since the
//! last such round ([`Signals`]): a records directory changed, the
//! allocations handed over changed, pins were put back, the guard judged or
//! lost a change (its counters moved), the last full round was incomplete,
//! or `--guard.verify-interval` has passed. Otherwise the round is one stat
//! per records directory and one read of the guard's counters, whatever the
//! number of volumes: opening 10,000 roots every 2 s kept most of a CPU busy
//! on an idle node. The interval is the backstop for what the guard cannot
//! see: a root replaced by root, or its project set by a path no hook
//! watches.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use prjquota_core::record::{self, records_dir, State};
use prjquota_core::sys::{self, FS_XFLAG_PROJINHERIT};
use prjquota_core::volume_id::VolumeId;
use prjquota_ebpf::guard::{root_identity_of, Guard, Snapshot};
use prjquota_ebpf::{RootsUpdate, TelemetryError};

use crate::allocs::{GuardedAlloc, GuardedRoots};

/// One record as the guard needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub volume_id: String,
    pub root: PathBuf,
    /// The record's project ID; `None` for a record this exporter cannot
    /// read: the root's own project ID is taken.
    pub projid: Option<u32>,
    /// `ready` (else `creating`, which the plugin is still tagging,
    /// `deleting`, or unreadable): only a ready root is re-tagged.
    pub ready: bool,
}

/// `(dev, ino, size, mtime, ctime)` of a records directory.
type DirKey = (u64, u64, u64, (i64, i64), (i64, i64));

fn dir_key(meta: &fs::Metadata) -> DirKey {
    (
        meta.dev(),
        meta.ino(),
        meta.size(),
        (meta.mtime(), meta.mtime_nsec()),
        (meta.ctime(), meta.ctime_nsec()),
    )
}

/// Whether a directory's key can be trusted from `at` on: a change within
/// the same clock tick as its last one could keep it, so only once its
/// mtime is a second older than `at`.
fn settled(meta: &fs::Metadata, at: SystemTime) -> bool {
    meta.modified()
        .ok()
        .and_then(|m| at.duration_since(m).ok())
        .is_some_and(|d| d >= Duration::from_secs(1))
}

/// A records directory as a round found it before its work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Registry {
    Missing,
    Settled(DirKey),
    /// Changed within the last second, or unreadable: the round is full.
    Moving,
}

/// What a round compares with the last full round's to tell whether any
/// root may have changed since; [`Signals::quiet`] only when all are equal
/// and none is in motion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signals {
    registries: Vec<Registry>,
    /// The allocations' roots as last handed over, and whether they
    /// settled (held: compared by address first, then by value).
    allocs: Option<(Arc<Vec<GuardedAlloc>>, bool)>,
    /// [`Guard::activity`]; `None` when it could not be read.
    activity: Option<u64>,
}

impl Signals {
    /// Whether a round with these signals may skip the roots, after a full
    /// round that began at `last.at` with `last.signals` and found every
    /// root.
    fn quiet(&self, last: &LastFull, now: std::time::Instant, verify_every: Duration) -> bool {
        last.complete
            && *self == last.signals
            && !self.registries.contains(&Registry::Moving)
            && self.activity.is_some()
            && now.saturating_duration_since(last.at) < verify_every
    }
}

/// The last round that opened every root.
#[derive(Debug)]
struct LastFull {
    at: std::time::Instant,
    signals: Signals,
    /// It read every registry and root, and wrote the maps.
    complete: bool,
}

/// A registry directory as last read.
#[derive(Debug, Default)]
struct DirCache {
    key: Option<DirKey>,
    scanned: Option<SystemTime>,
    entries: Vec<Entry>,
}

/// Counts since start, for `/metrics`.
#[derive(Debug, Default)]
pub struct SyncStats {
    pub rounds: AtomicU64,
    pub failed_rounds: AtomicU64,
    pub added: AtomicU64,
    pub removed: AtomicU64,
    pub drift: AtomicU64,
    pub drift_failed: AtomicU64,
    /// Roots the last round wanted in the maps.
    pub roots: AtomicU64,
    /// Roots opened to be checked, over all rounds.
    pub root_checks: AtomicU64,
}

/// What one round did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Round {
    pub added: usize,
    pub changed: usize,
    pub removed: usize,
    pub retagged: usize,
    pub errors: Vec<String>,
    /// Roots opened (none in a quiet round).
    pub checked: usize,
}

/// The sync's state: the registries it reads and their caches, and the
/// accounted allocations (`--nomad.alloc-dir`), whose directories are
/// roots too.
#[derive(Debug)]
pub struct Syncer {
    dirs: Vec<PathBuf>,
    caches: Mutex<Vec<DirCache>>,
    allocs: Option<Arc<GuardedRoots>>,
    pub stats: SyncStats,
    /// `--guard.verify-interval`: the longest a timed round goes without
    /// opening every root.
    verify_every: Duration,
    last_full: Mutex<Option<LastFull>>,
    /// The project-ID ranges put into the guard at every round.
    ranges: Option<super::ranges::GuardRanges>,
}

impl Syncer {
    /// A syncer whose timed rounds open every root each time, until
    /// [`Syncer::verifying_every`] says otherwise.
    pub fn new(dirs: &[PathBuf], allocs: Option<Arc<GuardedRoots>>) -> Syncer {
        Syncer {
            dirs: dirs.to_vec(),
            caches: Mutex::new(dirs.iter().map(|_| DirCache::default()).collect()),
            allocs,
            stats: SyncStats::default(),
            verify_every: Duration::ZERO,
            last_full: Mutex::new(None),
            ranges: None,
        }
    }

    /// Each round also puts `ranges` into the guard (when its file changed).
    pub fn keeping_ranges(mut self, ranges: super::ranges::GuardRanges) -> Syncer {
        self.ranges = Some(ranges);
        self
    }

    /// Timed rounds open the roots only when a [`Signals`] moved, and at
    /// least every `every`.
    pub fn verifying_every(mut self, every: Duration) -> Syncer {
        self.verify_every = every;
        self
    }

    pub fn allocs(&self) -> Option<&Arc<GuardedRoots>> {
        self.allocs.as_ref()
    }

    /// One round (blocking: run it on the blocking pool). `retag`: put back
    /// a ready root's project ID and PROJINHERIT when they drifted. The
    /// guard is locked only to snapshot and to write, not while roots are
    /// opened (a stuck filesystem must not stall the scrapes' reads).
    pub fn round(&self, guard: &Mutex<Guard>, retag: bool) -> Round {
        self.round_with(
            || lock(guard).snapshot(),
            |s, w| lock(guard).apply(s, w),
            retag,
        )
    }

    /// The sync timer's round: a full [`Syncer::round`] with re-tagging
    /// when anything may have changed a root since the last one (see the
    /// module; `pins_restored`: this round's pin check put some back),
    /// else a quiet round that opens nothing.
    pub fn timed_round(&self, guard: &Mutex<Guard>, pins_restored: bool) -> Round {
        if let Some(r) = &self.ranges {
            if let Some((changed, ranges)) = r.due(Duration::ZERO) {
                let result = lock(guard).set_ranges(&ranges);
                r.applied(changed, result);
            }
        }
        let signals = self.signals(|| lock(guard).activity().ok());
        self.timed(signals, pins_restored, || self.round(guard, true))
    }

    /// [`Syncer::timed_round`] with its full round given.
    fn timed(&self, signals: Signals, pins_restored: bool, full: impl FnOnce() -> Round) -> Round {
        let now = std::time::Instant::now();
        let quiet = !pins_restored
            && lock_last(&self.last_full)
                .as_ref()
                .is_some_and(|last| signals.quiet(last, now, self.verify_every));
        if quiet {
            let round = Round::default();
            self.count(&round);
            return round;
        }
        let round = full();
        *lock_last(&self.last_full) = Some(LastFull {
            at: now,
            signals,
            complete: round.errors.is_empty(),
        });
        round
    }

    /// The signals as they stand, read before a round's snapshot: a change
    /// after this read shows in the next round's.
    fn signals(&self, activity: impl FnOnce() -> Option<u64>) -> Signals {
        let at = SystemTime::now();
        let registries = self
            .dirs
            .iter()
            .map(|dir| match fs::metadata(records_dir(dir)) {
                Ok(m) if settled(&m, at) => Registry::Settled(dir_key(&m)),
                Ok(_) => Registry::Moving,
                Err(e) if e.kind() == io::ErrorKind::NotFound => Registry::Missing,
                Err(_) => Registry::Moving,
            })
            .collect();
        let allocs = self.allocs.as_ref().map(|a| a.current());
        Signals {
            registries,
            allocs,
            activity: activity(),
        }
    }

    /// [`Syncer::round`] on a guard not shared yet (the start-up fill).
    pub fn round_on(&self, guard: &mut Guard, retag: bool) -> Round {
        if let Some(r) = &self.ranges {
            // A start's fill: the ranges in the maps at the swap, unless
            // the plugin directory does not answer.
            if let Some((changed, ranges)) = r.due(Duration::from_secs(2)) {
                let result = guard.set_ranges(&ranges);
                r.applied(changed, result);
            }
        }
        let snapshot = guard.snapshot();
        self.round_with(move || snapshot, |s, w| guard.apply(s, w), retag)
    }

    fn round_with(
        &self,
        snapshot: impl FnOnce() -> Result<Snapshot, TelemetryError>,
        apply: impl FnOnce(&Snapshot, &[(u64, u64, u32, u32)]) -> Result<RootsUpdate, TelemetryError>,
        retag: bool,
    ) -> Round {
        let mut round = Round::default();
        let snapshot = match snapshot() {
            Ok(s) => s,
            Err(e) => {
                round
                    .errors
                    .push(format!("cannot read the guard's maps: {e}"));
                self.count(&round);
                return round;
            }
        };
        let mut complete = true;
        let mut entries = Vec::new();
        {
            let mut caches = self.caches.lock().unwrap_or_else(|e| e.into_inner());
            for (dir, cache) in self.dirs.iter().zip(caches.iter_mut()) {
                match list(dir, cache) {
                    Ok(e) => entries.extend(e.iter().cloned()),
                    Err(e) => {
                        complete = false;
                        round.errors.push(format!(
                            "cannot read the registry of {}: {e}",
                            dir.display()
                        ));
                    }
                }
            }
        }
        let mut wanted = Vec::with_capacity(entries.len());
        round.checked = entries.len();
        for e in &entries {
            match check_root(e, retag) {
                Ok((_, 0, _)) => {
                    // An unreadable record's root that carries no project:
                    // nothing a project quota could hold to guard.
                }
                Ok((id, projid, retagged)) => {
                    wanted.push((id.0, id.1, id.2, projid));
                    if let Some((projid, inherit)) = retagged {
                        round.retagged += 1;
                        crate::warn!(
                            "a volume root had lost its project: re-tagged (someone with CAP_SYS_ADMIN changed it, or an older plugin made it)",
                            volume_id = e.volume_id,
                            root = e.root.display(),
                            projid_was = projid,
                            projinherit_was = inherit,
                            projid = projid
                        );
                    }
                }
                Err(RootError::Gone) => {}
                Err(RootError::Other(msg)) => {
                    complete = false;
                    round.errors.push(msg);
                }
            }
        }
        // The allocations' roots as the scan thread last handed them over,
        // never re-tagged here (the scan thread owns their tagging). Until
        // its first scan, nothing is removed: the maps may hold roots an
        // earlier exporter put there.
        let mut alloc_roots = 0;
        if let Some(allocs) = &self.allocs {
            let (roots, settled) = allocs.current();
            complete &= settled;
            for a in roots.iter() {
                wanted.push((a.dev, a.ino, a.gen, a.project_id));
            }
            alloc_roots = roots.len();
        }
        let snapshot = if complete {
            snapshot
        } else {
            Snapshot::default()
        };
        match apply(&snapshot, &wanted) {
            Ok(u) => {
                if let Some(allocs) = &self.allocs {
                    allocs.set_in_guard(alloc_roots);
                }
                round.added = u.added;
                round.changed = u.changed;
                round.removed = u.removed;
                for (dev, ino, projid) in u.rejected {
                    round.errors.push(format!(
                        "a volume root (device {dev:#x}, inode {ino}, project {projid}) has a device number the kernel cannot encode: not guarded"
                    ));
                }
            }
            Err(e) => round
                .errors
                .push(format!("cannot update the guard's maps: {e}")),
        }
        self.stats
            .roots
            .store(wanted.len() as u64, Ordering::Relaxed);
        self.count(&round);
        round
    }

    fn count(&self, r: &Round) {
        let s = &self.stats;
        s.rounds.fetch_add(1, Ordering::Relaxed);
        if !r.errors.is_empty() {
            s.failed_rounds.fetch_add(1, Ordering::Relaxed);
        }
        s.added.fetch_add(r.added as u64, Ordering::Relaxed);
        s.removed.fetch_add(r.removed as u64, Ordering::Relaxed);
        s.drift.fetch_add(r.retagged as u64, Ordering::Relaxed);
        s.root_checks.fetch_add(r.checked as u64, Ordering::Relaxed);
    }
}

fn lock_last(m: &Mutex<Option<LastFull>>) -> std::sync::MutexGuard<'_, Option<LastFull>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn lock(g: &Mutex<Guard>) -> std::sync::MutexGuard<'_, Guard> {
    g.lock().unwrap_or_else(|e| e.into_inner())
}

enum RootError {
    /// Missing, not a directory, a symlink: nothing to guard.
    Gone,
    Other(String),
}

/// Opens a record's root: its identity, the project ID to guard it with,
/// and with `retag` for a ready volume, its project ID and PROJINHERIT put
/// back when they drifted (`Some((projid, inherit))` as they were).
#[allow(clippy::type_complexity)]
fn check_root(
    e: &Entry,
    retag: bool,
) -> Result<((u64, u64, u32), u32, Option<(u32, bool)>), RootError> {
    let dir = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(&e.root)
        .map_err(|err| match err.raw_os_error() {
            Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP) => RootError::Gone,
            _ => RootError::Other(format!(
                "cannot open the volume root {}: {err}",
                e.root.display()
            )),
        })?;
    let id = root_identity_of(dir.as_fd()).map_err(|err| {
        RootError::Other(format!(
            "cannot read the identity (FS_IOC_GETVERSION) of the volume root {}: {err}",
            e.root.display()
        ))
    })?;
    let read_project = || {
        sys::get_fsxattr(dir.as_fd()).map_err(|err| {
            RootError::Other(format!(
                "cannot read the project of the volume root {}: {err}",
                e.root.display()
            ))
        })
    };
    let Some(projid) = e.projid else {
        return Ok((id, read_project()?.projid, None));
    };
    if !(retag && e.ready) {
        return Ok((id, projid, None));
    }
    let mut attr = read_project()?;
    let inherit = attr.xflags & FS_XFLAG_PROJINHERIT != 0;
    if attr.projid == projid && inherit {
        return Ok((id, projid, None));
    }
    let was = (attr.projid, inherit);
    attr.projid = projid;
    attr.xflags |= FS_XFLAG_PROJINHERIT;
    sys::set_fsxattr(dir.as_fd(), &attr).map_err(|err| {
        RootError::Other(format!(
            "the volume root {} has project {} (PROJINHERIT {}), not {}, and cannot be re-tagged: {err}",
            e.root.display(),
            was.0,
            was.1,
            projid
        ))
    })?;
    Ok((id, projid, Some(was)))
}

/// The `creating` and `ready` records of one volumes directory; re-read
/// only when the records directory changed.
fn list<'a>(volumes_dir: &Path, cache: &'a mut DirCache) -> io::Result<&'a [Entry]> {
    let registry = records_dir(volumes_dir);
    let started = SystemTime::now();
    let meta = match fs::metadata(&registry) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            *cache = DirCache::default();
            return Ok(&cache.entries);
        }
        Err(e) => return Err(e),
    };
    let key = dir_key(&meta);
    // Trusted only once the last scan began a second after the mtime.
    let settled = cache.scanned.is_some_and(|s| settled(&meta, s));
    if cache.key == Some(key) && settled {
        return Ok(&cache.entries);
    }
    let mut entries = BTreeMap::new();
    for entry in fs::read_dir(&registry)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(stem) = record::record_stem(&name) else {
            continue;
        };
        match read_entry(&entry.path(), stem) {
            Ok(Some(r)) => {
                // A `deleting` volume stays guarded while its root stands:
                // the plugin takes the root out once the tree is gone.
                if matches!(r.state, State::Creating | State::Ready | State::Deleting) {
                    entries.insert(
                        stem.to_string(),
                        Entry {
                            volume_id: stem.to_string(),
                            // Built from the validated ID, never the
                            // record's path: a tampered record must not
                            // point the re-tag (as root) at another
                            // directory.
                            root: volumes_dir.join(r.volume_id.as_str()),
                            projid: Some(r.project_id),
                            ready: r.state == State::Ready,
                        },
                    );
                }
            }
            Ok(None) => {}
            Err(why) => {
                // Only a name that is a volume ID names a root.
                let Ok(id) = VolumeId::parse(stem) else {
                    continue;
                };
                crate::warn!(
                    "cannot read a volume's record: its root stays guarded with the project it carries",
                    volume_id = stem,
                    record = entry.path().display(),
                    error = why
                );
                entries.insert(
                    stem.to_string(),
                    Entry {
                        volume_id: stem.to_string(),
                        root: volumes_dir.join(id.as_str()),
                        projid: None,
                        ready: false,
                    },
                );
            }
        }
    }
    cache.entries = entries.into_values().collect();
    cache.key = Some(key);
    cache.scanned = Some(started);
    Ok(&cache.entries)
}

/// One record file: `Ok(None)` when it went away meanwhile, `Err` with the
/// reason when it is there and cannot be read as a record of this version.
fn read_entry(path: &Path, stem: &str) -> Result<Option<record::Record>, String> {
    let f = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    match f.metadata() {
        Ok(m) if m.is_file() => {}
        Ok(_) => return Err("not a regular file".into()),
        Err(e) => return Err(e.to_string()),
    }
    record::read_record(f, stem)
        .map(Some)
        .map_err(|e| format!("{e:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One round on no registry, from maps holding one root: whether the
    /// round may delete (it was handed the real snapshot) and the roots
    /// it wants.
    fn round_on_nothing(s: &Syncer) -> (bool, Vec<(u64, u64, u32, u32)>) {
        let real = Snapshot::from_keys(&[(0x803, 77, 1)], &[(0x803, 2_000_000_001)]);
        let mut seen = None;
        let _ = s.round_with(
            || Ok(real.clone()),
            |snap, wanted| {
                seen = Some((!snap.is_empty(), wanted.to_vec()));
                Ok(RootsUpdate::default())
            },
            false,
        );
        seen.expect("the round wrote the maps")
    }

    fn alloc() -> GuardedAlloc {
        GuardedAlloc {
            alloc_id: "a".into(),
            dev: 0x803,
            ino: 131,
            gen: 9,
            project_id: 2_000_000_000,
        }
    }

    #[test]
    fn nothing_is_removed_before_the_allocations_first_scan() {
        let roots = GuardedRoots::new();
        let s = Syncer::new(&[], Some(roots.clone()));
        assert_eq!(round_on_nothing(&s), (false, vec![]));
        roots.settle();
        assert_eq!(round_on_nothing(&s), (true, vec![]));
        // Without allocations, no registry means nothing is wanted.
        let s = Syncer::new(&[], None);
        assert_eq!(round_on_nothing(&s), (true, vec![]));
    }

    #[test]
    fn accounted_allocations_are_roots_once_handed_over() {
        let roots = GuardedRoots::new();
        let s = Syncer::new(&[], Some(roots.clone()));
        roots.publish(vec![alloc()], vec![]);
        assert_eq!(
            round_on_nothing(&s),
            (true, vec![(0x803, 131, 9, 2_000_000_000)])
        );
        assert_eq!(roots.in_guard(), 1);
        roots.publish(vec![], vec![]);
        assert_eq!(round_on_nothing(&s), (true, vec![]));
        assert_eq!(roots.in_guard(), 0);
    }

    /// Timed rounds over one registry in a temporary directory: how many
    /// of `n` were full, with `activity` read each time.
    fn full_rounds(s: &Syncer, n: usize, activity: u64, pins_restored: bool) -> usize {
        let mut full = 0;
        for _ in 0..n {
            let signals = s.signals(|| Some(activity));
            s.timed(signals, pins_restored, || {
                full += 1;
                Round::default()
            });
        }
        full
    }

    struct Scratch(PathBuf);

    impl Scratch {
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// A volumes directory whose records directory changed more than a
    /// second ago.
    fn settled_registry() -> Scratch {
        let dir = Scratch(crate::inventory::tests::temp_dir("guard-sync"));
        let records = records_dir(dir.path());
        fs::create_dir_all(&records).unwrap();
        let old = SystemTime::now() - Duration::from_secs(5);
        fs::File::open(&records).unwrap().set_modified(old).unwrap();
        dir
    }

    #[test]
    fn quiet_rounds_open_nothing_until_a_signal_moves() {
        let dir = settled_registry();
        let s = Syncer::new(&[dir.path().to_path_buf()], None)
            .verifying_every(Duration::from_secs(3600));
        assert_eq!(full_rounds(&s, 3, 7, false), 1, "the first round is full");
        // The guard judged a change: one full round, then quiet again.
        assert_eq!(full_rounds(&s, 3, 8, false), 1);
        // Pins put back: full however quiet the rest.
        assert_eq!(full_rounds(&s, 2, 8, true), 2);
        assert_eq!(full_rounds(&s, 2, 8, false), 0);
        // A record written: the records directory's key moves (and is
        // not trusted within its first second).
        let records = records_dir(dir.path());
        fs::write(records.join("x.tmp"), b"").unwrap();
        assert!(full_rounds(&s, 2, 8, false) >= 1);
        let old = SystemTime::now() - Duration::from_secs(5);
        fs::File::open(&records).unwrap().set_modified(old).unwrap();
        assert_eq!(full_rounds(&s, 1, 8, false), 1);
        assert_eq!(full_rounds(&s, 2, 8, false), 0);
    }

    #[test]
    fn an_incomplete_round_or_an_unread_counter_keeps_the_next_full() {
        let dir = settled_registry();
        let s = Syncer::new(&[dir.path().to_path_buf()], None)
            .verifying_every(Duration::from_secs(3600));
        let failing = || Round {
            errors: vec!["cannot open a root".into()],
            ..Round::default()
        };
        s.timed(s.signals(|| Some(1)), false, failing);
        s.timed(s.signals(|| Some(1)), false, failing);
        assert_eq!(full_rounds(&s, 1, 1, false), 1, "after an error");
        assert_eq!(full_rounds(&s, 1, 1, false), 0);
        let mut full = 0;
        for _ in 0..2 {
            s.timed(s.signals(|| None), false, || {
                full += 1;
                Round::default()
            });
        }
        assert_eq!(full, 2, "the guard's counters could not be read");
    }

    #[test]
    fn the_verify_interval_bounds_the_quiet() {
        let dir = settled_registry();
        let s = Syncer::new(&[dir.path().to_path_buf()], None)
            .verifying_every(Duration::from_millis(200));
        assert_eq!(full_rounds(&s, 2, 0, false), 1);
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(full_rounds(&s, 2, 0, false), 1);
        // The default of a bare syncer: every round full.
        let s = Syncer::new(&[dir.path().to_path_buf()], None);
        assert_eq!(full_rounds(&s, 3, 0, false), 3);
    }

    #[test]
    fn new_allocation_roots_make_a_full_round() {
        let dir = settled_registry();
        let roots = GuardedRoots::new();
        roots.settle();
        let s = Syncer::new(&[dir.path().to_path_buf()], Some(roots.clone()))
            .verifying_every(Duration::from_secs(3600));
        assert_eq!(full_rounds(&s, 2, 0, false), 1);
        roots.publish(vec![alloc()], vec![]);
        assert_eq!(full_rounds(&s, 2, 0, false), 1);
    }
}
