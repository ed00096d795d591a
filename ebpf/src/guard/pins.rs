//! Where the quota-escape guard lives in bpffs, so that it outlives the
//! exporter that loaded it (restart, crash, upgrade).
//!
//! The layout and every name in it are the contract with the plugin,
//! which writes new volumes' roots into the pinned maps itself:
//! `prjquota_core::guard_contract` (and `docs/security.md`).
//!
//! One exporter owns a volumes directory's guard while it runs (its
//! [`OwnerLock`]): another exporter on the same directory leaves those pins
//! alone, and the owner checks on every sync that the symlink still points
//! at its own pins ([`current`]).
//!
//! A start makes a new `@guard-<unique>` directory with fresh maps, fills
//! them, attaches and pins the programs there, and only then points every
//! symlink of its volumes directories at it (a symlink under a temporary
//! name renamed over the old one: atomic), fills the maps once more (the
//! roots the plugin wrote into the old maps meanwhile), and removes the
//! directory the symlinks pointed at before: old and new programs overlap
//! for a moment, enforcement never has a gap, and the plugin never writes
//! into maps no program reads. A start that dies before its swap leaves a
//! directory no symlink points at, its programs attached beside the guard
//! in force; the next start removes it once it is older than a start takes.
//!
//! Only root may have made anything on the way: the pin root and every
//! directory above it on its bpffs must be root's and writable by root
//! only ([`ensure_root`]), and the bpffs this module mounts is 0700.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prjquota_core::guard_contract::{
    self, linked_program, owner_lock_of, BPF_FS_MAGIC, DIR_PREFIX, LINK_PREFIX, MAP_COUNTERS,
    MAP_DEVS, MAP_EVENTS, MAP_PROJECTS, MAP_ROOTS, MAP_STATS, TMP_PREFIX,
};

use super::maps;

/// The contract's names this module's callers use.
pub use prjquota_core::guard_contract::{link_of, PIN_ROOT};

/// The maps' pin names in a pin directory, by the guard object's map name.
pub const MAP_PINS: [(&str, &str); 6] = [
    (maps::MAP_ROOTS, MAP_ROOTS),
    (maps::MAP_ROOT_DEVS, MAP_DEVS),
    (maps::MAP_PROJECTS, MAP_PROJECTS),
    (maps::MAP_COUNTERS, MAP_COUNTERS),
    (maps::MAP_STATS, MAP_STATS),
    (maps::MAP_EVENTS, MAP_EVENTS),
];

/// A pin directory no symlink points at is a crashed start's only after
/// this long (a start running at the same time has not swapped yet).
const ORPHAN_AFTER: Duration = Duration::from_secs(120);

fn ctx(path: &Path, what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// Makes `root` (mode 0700, on bpffs), mounting bpffs for root only at
/// `/sys/fs/bpf` when nothing is mounted there; refuses a root another user
/// owns, and one under a directory others may write (they could have made
/// or replaced it first), naming the directory and the fix. Makes nothing
/// when it refuses, and changes no directory above the root.
pub fn ensure_root(root: &Path) -> io::Result<()> {
    let parent = root.parent().unwrap_or(Path::new("/"));
    if parent == Path::new("/sys/fs/bpf") && fs_type(parent)? != BPF_FS_MAGIC {
        // Pins the plugin cannot see guard nothing it creates: mounted in a
        // mount namespace of this process's own, a bpffs is its alone.
        if !mount_reaches_the_host(parent) {
            return Err(io::Error::other(format!(
                "no bpf filesystem is mounted at {} for the node, and one this exporter                  mounted would be seen by its own mount namespace alone (a sandbox or a                  container: the plugin Nomad runs would not find the guard's pins): mount                  one on the host (mount -t bpf -o mode=0700 bpf /sys/fs/bpf; systemd does                  at boot), then restart the exporter",
                parent.display()
            )));
        }
        crate::raw::mount_bpffs(parent).map_err(|e| {
            ctx(
                parent,
                "no bpf filesystem is mounted at, and cannot mount one on,",
                e,
            )
        })?;
    }
    // A missing root is made only on bpffs: a mistyped --guard.pin-root
    // leaves nothing behind on another filesystem.
    let on = if root.exists() { root } else { parent };
    if fs_type(on)? != BPF_FS_MAGIC {
        return Err(io::Error::other(format!(
            "{} is not on a bpf filesystem: mount one (mount -t bpf -o mode=0700 bpf \
             /sys/fs/bpf) or give --guard.pin-root on one",
            root.display()
        )));
    }
    // The directories above first: a root made under one of them by
    // someone else may be root's own by the time it is looked at.
    refuse_untrusted(root, parent)?;
    match fs::DirBuilder::new().mode(0o700).create(root) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(ctx(root, "cannot create the guard's pin directory", e)),
    }
    let m = fs::symlink_metadata(root).map_err(|e| ctx(root, "cannot stat", e))?;
    if !m.is_dir() || m.uid() != 0 {
        return Err(io::Error::other(format!(
            "{} must be a directory owned by root (uid {}), or another user chose what the \
             guard trusts: remove it (rm -r {}) and restart",
            root.display(),
            m.uid(),
            root.display()
        )));
    }
    if m.mode() & 0o077 != 0 {
        fs::set_permissions(root, fs::Permissions::from_mode(0o700))
            .map_err(|e| ctx(root, "cannot chmod 0700", e))?;
    }
    if fs_type(root)? != BPF_FS_MAGIC {
        return Err(io::Error::other(format!(
            "{} is not on a bpf filesystem: mount one (mount -t bpf -o mode=0700 bpf \
             /sys/fs/bpf) or give --guard.pin-root on one",
            root.display()
        )));
    }
    Ok(())
}

/// Checks, without making or changing anything, that an existing pin
/// root is one only root could have set up: a directory (not a symlink)
/// of root's, writable by root only, on bpffs, under directories only
/// root may write. What `--guard=off` removes is found there: in a root
/// someone else could write, a symlink of theirs would name what to
/// delete.
pub fn check_root(root: &Path) -> io::Result<()> {
    let m = fs::symlink_metadata(root).map_err(|e| ctx(root, "cannot stat", e))?;
    if !m.is_dir() || m.uid() != 0 || m.mode() & 0o022 != 0 {
        return Err(io::Error::other(format!(
            "{} is not a directory of root's writable by root only (uid {}, mode {:o}), so              nothing in it is trusted or removed: remove it (rm -r {}) if it is not the guard's",
            root.display(),
            m.uid(),
            m.mode() & 0o7777,
            root.display()
        )));
    }
    if fs_type(root)? != BPF_FS_MAGIC {
        return Err(io::Error::other(format!(
            "{} is not on a bpf filesystem, so it holds no pins of the guard's",
            root.display()
        )));
    }
    refuse_untrusted(root, root.parent().unwrap_or(Path::new("/")))
}

/// Whether a mount made at `dir` would be seen outside this process's
/// mount namespace, where the plugin runs: the mount holding `dir` passes
/// new mounts on to its peers (systemd makes every mount of the host
/// shared). Not whether this is PID 1's namespace: in a container with a
/// PID namespace of its own, PID 1 is the container's.
fn mount_reaches_the_host(dir: &Path) -> bool {
    prjquota_core::mountinfo::read_own()
        .is_ok_and(|m| prjquota_core::mountinfo::propagates(&m, dir))
}

/// [`guard_contract::untrusted_dirs`] of `dir`, as the error
/// that keeps the guard's pins out of `root`.
fn refuse_untrusted(root: &Path, dir: &Path) -> io::Result<()> {
    match guard_contract::untrusted_dirs(dir) {
        Ok(None) => Ok(()),
        Ok(Some(why)) => Err(io::Error::other(format!(
            "refusing to pin the guard in {}: {why}",
            root.display()
        ))),
        Err(e) => Err(ctx(dir, "cannot check who may write", e)),
    }
}

fn fs_type(path: &Path) -> io::Result<i64> {
    guard_contract::fs_type(path).map_err(|e| ctx(path, "cannot statfs", e))
}

/// Makes a new, empty pin directory under `root`.
pub fn new_dir(root: &Path) -> io::Result<PathBuf> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = root.join(format!("{DIR_PREFIX}{}-{nanos}", std::process::id()));
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| ctx(&dir, "cannot create", e))?;
    Ok(dir)
}

/// What [`swap_links`] changed: each symlink and what it pointed at before.
#[derive(Debug, Default)]
pub struct Swapped {
    links: Vec<(PathBuf, Option<PathBuf>)>,
}

impl Swapped {
    /// The pin directories the symlinks pointed at before.
    pub fn previous(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = self.links.iter().filter_map(|(_, o)| o.clone()).collect();
        v.sort();
        v.dedup();
        v
    }

    /// Points every symlink back where it pointed before (a start that
    /// failed after the swap: the guard before it goes on).
    pub fn undo(self, root: &Path) {
        for (link, old) in self.links {
            let _ = match old {
                Some(old) => point(root, &link, &old),
                None => fs::remove_file(&link),
            };
        }
    }
}

/// Points `link` at `target`: a symlink under a temporary name, renamed
/// over `link` (atomic: the plugin sees the old or the new, never none).
fn point(root: &Path, link: &Path, target: &Path) -> io::Result<()> {
    let mut tmp: OsString = root.join(TMP_PREFIX).into_os_string();
    tmp.push(link.file_name().unwrap_or_default());
    tmp.push(format!("-{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)
        .map_err(|e| ctx(&tmp, "cannot create the symlink", e))?;
    fs::rename(&tmp, link).map_err(|e| ctx(link, "cannot rename the symlink over", e))
}

/// Points the symlink of every volumes directory at `dir`; returns what
/// they pointed at before. On an error, those already swapped are put
/// back.
pub fn swap_links(root: &Path, volumes_dirs: &[PathBuf], dir: &Path) -> io::Result<Swapped> {
    let mut swapped = Swapped::default();
    for d in volumes_dirs {
        let link = link_of(root, d);
        if swapped.links.iter().any(|(l, _)| *l == link) {
            continue; // the same directory given twice
        }
        let old = fs::read_link(&link).ok().filter(|o| o != dir);
        if let Err(e) = point(root, &link, dir) {
            swapped.undo(root);
            return Err(e);
        }
        swapped.links.push((link, old));
    }
    Ok(swapped)
}

/// The pin directories the symlinks under `root` point at.
fn pointed_at(root: &Path) -> io::Result<BTreeSet<PathBuf>> {
    let mut out = BTreeSet::new();
    for e in fs::read_dir(root).map_err(|e| ctx(root, "cannot list", e))? {
        let e = e?;
        if e.file_type()?.is_symlink() {
            if let Ok(t) = fs::read_link(e.path()) {
                out.insert(t);
            }
        }
    }
    Ok(out)
}

/// Unlinks a pin directory's pins, the links first (the programs stop),
/// then the maps, then the directory. Returns how many pins went.
pub fn remove_dir(dir: &Path) -> io::Result<usize> {
    remove_dir_programs(dir).map(|(n, _)| n)
}

/// [`remove_dir`], and the kernel IDs of the programs its link pins held.
/// Never follows a symlink: `dir` itself must be a directory on the
/// filesystem of the pin root above it (bpffs: the callers checked the
/// root), and only the pins in it (regular files) are unlinked, through its
/// descriptor; anything else there keeps the directory, and is an error.
fn remove_dir_programs(dir: &Path) -> io::Result<(usize, Vec<u32>)> {
    use prjquota_core::sys;
    let m = fs::symlink_metadata(dir).map_err(|e| ctx(dir, "cannot stat", e))?;
    if !m.is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a pin directory (a symlink or a file): left alone",
            dir.display()
        )));
    }
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| ctx(dir, "cannot name", io::Error::other(e)))?;
    let fd = sys::open(&c, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0)
        .map_err(|e| ctx(dir, "cannot open", e))?;
    let root = dir.parent().unwrap_or(Path::new("/"));
    let root_dev = fs::symlink_metadata(root)
        .map_err(|e| ctx(root, "cannot stat", e))?
        .dev();
    if sys::fstat(fd.as_fd())
        .map_err(|e| ctx(dir, "cannot stat", e))?
        .st_dev
        != root_dev
    {
        return Err(io::Error::other(format!(
            "{} is not on the pin root's filesystem: not a pin directory, left alone",
            dir.display()
        )));
    }
    let mut names: Vec<std::ffi::CString> = sys::read_dir(fd.as_fd())
        .map_err(|e| ctx(dir, "cannot list", e))?
        .into_iter()
        .map(|e| e.name)
        .collect();
    // Links before maps.
    names.sort_by_key(|n| !n.as_bytes().starts_with(LINK_PREFIX.as_bytes()));
    let mut n = 0;
    let mut programs = Vec::new();
    for name in &names {
        let p = dir.join(std::ffi::OsStr::from_bytes(name.as_bytes()));
        let st = sys::fstatat_nofollow(fd.as_fd(), name).map_err(|e| ctx(&p, "cannot stat", e))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(io::Error::other(format!(
                "{} is not a pin (a pin is a file of bpffs): the directory is left",
                p.display()
            )));
        }
        if is_link_pin(&p) {
            programs.extend(program_of_link(&p));
        }
        sys::unlinkat(fd.as_fd(), name, false).map_err(|e| ctx(&p, "cannot unpin", e))?;
        n += 1;
    }
    fs::remove_dir(dir).map_err(|e| ctx(dir, "cannot remove", e))?;
    Ok((n, programs))
}

fn is_link_pin(p: &Path) -> bool {
    p.file_name()
        .is_some_and(|n| n.as_bytes().starts_with(LINK_PREFIX.as_bytes()))
}

/// The kernel ID of the program a pinned link attaches (the descriptor is
/// closed again before the pin goes, or it would keep the link alive).
fn program_of_link(pin: &Path) -> Option<u32> {
    let link =
        aya::programs::links::FdLink::from(aya::programs::links::PinnedLink::from_pin(pin).ok()?);
    link.info().ok().map(|i| i.program_id())
}

/// How long `--guard=off` waits for the kernel to detach what it unpinned.
const DETACH_WAIT: Duration = Duration::from_secs(10);

/// Waits until none of `programs` is loaded any more. The kernel frees a
/// link whose last pin went from a workqueue, and detaches its program only
/// then: until this returns, the old guard may still refuse changes.
/// Returns the programs still loaded at the deadline.
fn wait_unloaded(programs: &[u32], deadline: Duration) -> Vec<u32> {
    let start = std::time::Instant::now();
    loop {
        let loaded: BTreeSet<u32> = aya::programs::loaded_programs()
            .filter_map(|p| p.ok().map(|p| p.id()))
            .collect();
        let left: Vec<u32> = programs
            .iter()
            .copied()
            .filter(|id| loaded.contains(id))
            .collect();
        if left.is_empty() || start.elapsed() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether `dir` is a pin directory directly under `root`.
fn is_pin_dir(root: &Path, dir: &Path) -> bool {
    dir.parent() == Some(root)
        && dir
            .file_name()
            .is_some_and(|n| n.as_bytes().starts_with(DIR_PREFIX.as_bytes()))
}

/// What [`remove_unused`] removed: `(directory, pins)`.
pub type Removed = Vec<(PathBuf, usize)>;

/// Removes the pin directories of `candidates` that no symlink under `root`
/// points at any more (another exporter's volumes directories may still
/// use one), and crashed starts' directories no symlink ever pointed at,
/// older than a start takes. `keep` is never removed.
pub fn remove_unused(root: &Path, candidates: &[PathBuf], keep: &Path) -> io::Result<Removed> {
    let used = pointed_at(root)?;
    let mut dirs: BTreeSet<PathBuf> = candidates
        .iter()
        .filter(|d| is_pin_dir(root, d))
        .cloned()
        .collect();
    let now = SystemTime::now();
    for e in fs::read_dir(root).map_err(|e| ctx(root, "cannot list", e))? {
        let e = e?;
        let p = e.path();
        if !is_pin_dir(root, &p) || !e.file_type()?.is_dir() {
            continue;
        }
        let old = e
            .metadata()?
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .is_some_and(|age| age >= ORPHAN_AFTER);
        if old {
            dirs.insert(p);
        }
    }
    let mut removed = Vec::new();
    for d in dirs {
        let is_dir = fs::symlink_metadata(&d).is_ok_and(|m| m.is_dir());
        if d == keep || used.contains(&d) || !is_dir {
            continue;
        }
        let n = remove_dir(&d)?;
        removed.push((d, n));
    }
    Ok(removed)
}

/// `--guard=off`: removes the symlinks of `volumes_dirs` and the pin
/// directories no other symlink points at, and returns once the kernel has
/// detached their programs: the guard has stopped.
pub fn remove_for(root: &Path, volumes_dirs: &[PathBuf]) -> io::Result<Removed> {
    match fs::symlink_metadata(root) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        _ => check_root(root)?,
    }
    remove_for_in_trusted(root, volumes_dirs)
}

/// [`remove_for`] once the root is known to be root's alone.
fn remove_for_in_trusted(root: &Path, volumes_dirs: &[PathBuf]) -> io::Result<Removed> {
    let mut targets = Vec::new();
    for d in volumes_dirs {
        let link = link_of(root, d);
        if let Ok(t) = fs::read_link(&link) {
            targets.push(t);
        }
        match fs::remove_file(&link) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(ctx(&link, "cannot remove", e)),
        }
    }
    let used = pointed_at(root)?;
    let mut removed = Vec::new();
    let mut programs = Vec::new();
    targets.sort();
    targets.dedup();
    for t in targets {
        let is_dir = fs::symlink_metadata(&t).is_ok_and(|m| m.is_dir());
        if is_pin_dir(root, &t) && !used.contains(&t) && is_dir {
            let (n, p) = remove_dir_programs(&t)?;
            programs.extend(p);
            removed.push((t, n));
        }
    }
    let left = wait_unloaded(&programs, DETACH_WAIT);
    if !left.is_empty() {
        return Err(io::Error::other(format!(
            "unpinned the guard, but the kernel still has its programs {left:?} loaded after {}s; \
             see `bpftool prog show` for what holds them",
            DETACH_WAIT.as_secs()
        )));
    }
    Ok(removed)
}

/// The exclusive `flock` an exporter holds on a volumes directory's lock
/// directory under the pin root for as long as it runs: the guard pinned
/// for that volumes directory is this exporter's, and no other exporter
/// swaps, removes or unpins it meanwhile. A directory because bpffs holds
/// no regular files; under the pin root because that is root-only already
/// and every exporter sharing pins shares it. Released when dropped, or
/// when the process ends however it ends.
#[derive(Debug)]
pub struct OwnerLock {
    _dir: fs::File,
}

/// What [`claim`] found.
#[derive(Debug)]
pub enum Claim {
    /// This process owns the volumes directory's guard now.
    Owned(OwnerLock),
    /// Another running exporter does; its pid as its pin directory's name
    /// says, if the symlink points at one.
    Held { pid: Option<u32> },
}

/// Takes the owner lock of volumes directory `d` under `root` (which must
/// exist: [`ensure_root`]) without waiting.
pub fn claim(root: &Path, d: &Path) -> io::Result<Claim> {
    let path = owner_lock_of(root, d);
    match fs::DirBuilder::new().mode(0o700).create(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(ctx(&path, "cannot create the guard's owner lock", e)),
    }
    let dir = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| ctx(&path, "cannot open the guard's owner lock", e))?;
    let m = dir.metadata().map_err(|e| ctx(&path, "cannot stat", e))?;
    if m.uid() != 0 || m.mode() & 0o022 != 0 {
        return Err(io::Error::other(format!(
            "the guard's owner lock {} must be a directory of root's that no one else may \
             write to: remove it and restart",
            path.display()
        )));
    }
    use std::os::fd::AsFd;
    if prjquota_core::sys::try_flock(dir.as_fd(), true)
        .map_err(|e| ctx(&path, "cannot flock", e))?
    {
        Ok(Claim::Owned(OwnerLock { _dir: dir }))
    } else {
        let pid = current(root, d).ok().flatten().and_then(|c| c.pid());
        Ok(Claim::Held { pid })
    }
}

/// What the symlink of a volumes directory points at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Current {
    /// The symlink's target.
    pub dir: PathBuf,
    /// Whether that directory is there.
    pub exists: bool,
    /// The programs whose link pins it holds (`link-<program>`).
    pub links: Vec<String>,
    /// The map pins it holds.
    pub maps: Vec<String>,
}

impl Current {
    /// Whether one of its link pins attaches a BPF LSM program: a guard
    /// that refuses changes, not one that only counts them.
    pub fn enforces(&self) -> bool {
        self.links.iter().any(|p| guard_contract::is_lsm_program(p))
    }

    /// The pid of the exporter that made the directory (`@guard-<pid>-…`).
    pub fn pid(&self) -> Option<u32> {
        let name = self.dir.file_name()?.to_str()?;
        name.strip_prefix(DIR_PREFIX)?
            .split('-')
            .next()?
            .parse()
            .ok()
    }

    /// Whether it is `dir` and holds every map pin and the link pins of
    /// `links`.
    pub fn is(&self, dir: &Path, links: &[&str]) -> bool {
        self.dir == dir
            && self.exists
            && links.iter().all(|l| self.links.iter().any(|h| h == l))
            && MAP_PINS
                .iter()
                .all(|(_, m)| self.maps.iter().any(|h| h == m))
    }
}

/// What the symlink of volumes directory `d` under `root` points at, and
/// what that directory holds; `None` when there is no symlink.
pub fn current(root: &Path, d: &Path) -> io::Result<Option<Current>> {
    let link = link_of(root, d);
    let dir = match fs::read_link(&link) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ctx(&link, "cannot read the symlink", e)),
    };
    Ok(Some(held(&dir)?))
}

/// What pin directory `dir` holds.
pub fn held(dir: &Path) -> io::Result<Current> {
    let mut c = Current {
        dir: dir.to_path_buf(),
        exists: false,
        links: Vec::new(),
        maps: Vec::new(),
    };
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(c),
        Err(e) => return Err(ctx(dir, "cannot list", e)),
    };
    c.exists = true;
    for e in rd {
        let name = e?.file_name().to_string_lossy().into_owned();
        match linked_program(&name) {
            Some(prog) => c.links.push(prog.to_string()),
            None => c.maps.push(name),
        }
    }
    c.links.sort();
    c.maps.sort();
    Ok(c)
}

/// Points the symlink of volumes directory `d` back at `dir` (atomic, as
/// a start's swap).
pub fn repoint(root: &Path, d: &Path, dir: &Path) -> io::Result<()> {
    point(root, &link_of(root, d), dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The directory logic on a plain filesystem (bpffs only matters for
    /// what is pinned in it): swaps, what is removed and what is kept.
    #[test]
    fn swaps_remove_only_what_no_symlink_uses() {
        let root = std::env::temp_dir().join(format!("pins-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir(&root).unwrap();
        let (a, b) = (PathBuf::from("/v/a"), PathBuf::from("/v/b"));
        let first = new_dir(&root).unwrap();
        fs::write(first.join("roots"), b"").unwrap();
        fs::write(first.join("link-x"), b"").unwrap();
        assert!(swap_links(&root, &[a.clone(), b.clone()], &first)
            .unwrap()
            .previous()
            .is_empty());
        assert_eq!(fs::read_link(link_of(&root, &a)).unwrap(), first);
        // A second exporter takes /v/a only: /v/b still uses the first dir.
        std::thread::sleep(Duration::from_millis(2));
        let second = new_dir(&root).unwrap();
        let prev = swap_links(&root, std::slice::from_ref(&a), &second)
            .unwrap()
            .previous();
        assert_eq!(prev, std::slice::from_ref(&first));
        assert!(remove_unused(&root, &prev, &second).unwrap().is_empty());
        assert!(first.exists());
        // Then /v/b too: the first dir goes, links and maps.
        // A start that fails after its swap points the symlink back.
        let failed = new_dir(&root).unwrap();
        swap_links(&root, std::slice::from_ref(&b), &failed)
            .unwrap()
            .undo(&root);
        assert_eq!(fs::read_link(link_of(&root, &b)).unwrap(), first);
        fs::remove_dir(&failed).unwrap();
        let prev = swap_links(&root, std::slice::from_ref(&b), &second)
            .unwrap()
            .previous();
        let removed = remove_unused(&root, &prev, &second).unwrap();
        assert_eq!(removed, [(first.clone(), 2)]);
        assert!(!first.exists() && second.exists());
        // --guard=off for /v/a leaves /v/b's; for both, nothing is left.
        assert!(remove_for_in_trusted(&root, std::slice::from_ref(&a))
            .unwrap()
            .is_empty());
        assert!(second.exists());
        let removed = remove_for_in_trusted(&root, &[a, b]).unwrap();
        assert_eq!(removed, [(second.clone(), 0)]);
        assert_eq!(fs::read_dir(&root).unwrap().count(), 0);
        fs::remove_dir(&root).unwrap();
    }

    /// One owner per volumes directory while its lock is held; what a
    /// symlink points at and whether that guard enforces.
    #[test]
    fn one_owner_holds_a_volumes_directory_and_sees_what_is_pinned() {
        let root = std::env::temp_dir().join(format!("pins-owner-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir(&root).unwrap();
        let (a, b) = (PathBuf::from("/v/a"), PathBuf::from("/v/b"));
        let Claim::Owned(lock) = claim(&root, &a).unwrap() else {
            panic!("a free lock is taken");
        };
        // flock is per open file: a second open is another exporter.
        let dir = new_dir(&root).unwrap();
        swap_links(&root, std::slice::from_ref(&a), &dir).unwrap();
        assert!(
            matches!(claim(&root, &a).unwrap(), Claim::Held { pid: Some(p) } if p == std::process::id())
        );
        assert!(matches!(claim(&root, &b).unwrap(), Claim::Owned(_)));
        drop(lock);
        assert!(matches!(claim(&root, &a).unwrap(), Claim::Owned(_)));

        assert_eq!(current(&root, &b).unwrap(), None);
        let c = current(&root, &a).unwrap().unwrap();
        assert!(c.exists && !c.enforces() && !c.is(&dir, &[]));
        for (_, m) in MAP_PINS {
            fs::write(dir.join(m), b"").unwrap();
        }
        fs::write(dir.join("link-guard_fileattr_set_exit"), b"").unwrap();
        let c = current(&root, &a).unwrap().unwrap();
        assert!(c.is(&dir, &["guard_fileattr_set_exit"]) && !c.enforces());
        assert!(!c.is(&dir, &["guard_file_ioctl"]));
        fs::write(dir.join("link-guard_file_ioctl_sleepable"), b"").unwrap();
        assert!(current(&root, &a).unwrap().unwrap().enforces());
        fs::remove_dir_all(&dir).unwrap();
        let c = current(&root, &a).unwrap().unwrap();
        assert!(!c.exists && !c.is(&dir, &[]));
        fs::remove_dir_all(&root).unwrap();
    }

    /// A start that died after attaching, before its swap, left a directory
    /// with links no symlink points at: a later start removes it, links
    /// first, once it is older than a start takes, and not before (a start
    /// running beside it has not swapped yet).
    #[test]
    fn a_dead_start_with_attached_links_is_removed_once_old() {
        let root = std::env::temp_dir().join(format!("pins-orphan-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir(&root).unwrap();
        let live = new_dir(&root).unwrap();
        swap_links(&root, &[PathBuf::from("/v/a")], &live).unwrap();
        let dead = new_dir(&root).unwrap();
        fs::write(dead.join("roots"), b"").unwrap();
        fs::write(dead.join("link-guard_lsm"), b"").unwrap();
        assert!(remove_unused(&root, &[], &live).unwrap().is_empty());
        assert!(
            dead.exists(),
            "a start still running beside it lost its pins"
        );
        let then = SystemTime::now() - ORPHAN_AFTER - Duration::from_secs(1);
        fs::File::open(&dead).unwrap().set_modified(then).unwrap();
        assert_eq!(remove_unused(&root, &[], &live).unwrap(), [(dead, 2)]);
        assert!(live.exists());
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_pin_directory_that_is_a_symlink_is_left_with_what_it_points_at() {
        let root = std::env::temp_dir().join(format!("pins-link-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir(&root).unwrap();
        let victim = root.with_file_name(format!("pins-victim-{}", std::process::id()));
        let _ = fs::remove_dir_all(&victim);
        fs::create_dir(&victim).unwrap();
        fs::write(victim.join("keep"), b"x").unwrap();
        let planted = root.join(format!("{DIR_PREFIX}1-1"));
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        let link = link_of(&root, Path::new("/v/a"));
        std::os::unix::fs::symlink(&planted, &link).unwrap();
        assert!(remove_dir(&planted).is_err());
        assert!(remove_for_in_trusted(&root, &[PathBuf::from("/v/a")])
            .unwrap()
            .is_empty());
        assert!(
            remove_unused(&root, std::slice::from_ref(&planted), &root.join("none"))
                .unwrap()
                .is_empty()
        );
        assert_eq!(fs::read(victim.join("keep")).unwrap(), b"x");
        fs::remove_dir_all(&root).unwrap();
        fs::remove_dir_all(&victim).unwrap();
    }
}
