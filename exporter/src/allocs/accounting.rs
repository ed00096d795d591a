//! Which allocation has which project, kept current by [`Accounting::scan`]
//! (see the module above for when and how an allocation is tagged).

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::ops::RangeInclusive;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use prjquota_core::entry_open::open_subdir;
use prjquota_core::{project_ids, quota, run_dir, sys};
use prjquota_ebpf::guard::root_identity_of;

use super::tag_walk::{Budget, Linked, Step, Walk, Walked};
use super::GuardedAlloc;

/// What a scan asks of the quota-escape guard.
pub trait GuardLink {
    /// Puts an allocation into the guard before its project is claimed (or
    /// walked again); `fresh` for a new claim, whose project's counts
    /// start over. Its failure stops that allocation's claim.
    fn join(&mut self, alloc: &GuardedAlloc, fresh: bool) -> Result<()>;

    /// How many changes the guard let through in the allocation's project
    /// since its claim (in either mode it counts them); `None` when no
    /// guard counts.
    fn let_through(&mut self, alloc: &GuardedAlloc) -> Result<Option<u64>>;
}

/// An accounted allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocProject {
    pub project_id: u32,
    /// The allocation directory's inode and its generation: the guard's
    /// root.
    pub ino: u64,
    pub gen: u32,
}

/// How many allocation directories are in each state.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Census {
    /// In their project.
    pub accounted: u64,
    /// No task started yet: left alone.
    pub waiting: u64,
    /// In their project, their walk not finished: under way, or failed and
    /// retried at the next scan.
    pub walking: u64,
    /// Already in a project outside the allocations' range (someone else's
    /// tagging): left alone, not reported.
    pub foreign: u64,
    /// Files the walks could not tag yet (a write lease, an I/O error),
    /// tried again at every scan.
    pub retries: u64,
}

/// One allocation directory's state, as a scan last saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Accounted(AllocProject),
    /// Claimed (the directory holds the ID), not yet walked to the end.
    Claimed(AllocProject),
    Waiting,
    Foreign(u32),
}

/// The allocations of one Nomad alloc directory and their projects.
#[derive(Debug)]
pub struct Accounting {
    path: PathBuf,
    dir: Arc<OwnedFd>,
    /// The alloc directory's device, as the kernel's quota and the guard
    /// name it.
    pub dev: u64,
    /// Its mount: allocation directories are read on it, never through a
    /// mount point.
    mount: u64,
    range: RangeInclusive<u32>,
    allocs: BTreeMap<String, Seen>,
    /// Where the next ID is looked for: past the last one given, so a
    /// collected allocation's ID comes back only once the range wraps.
    cursor: u32,
    /// The alloc directory's change time at the last full listing, and
    /// when that listing was made.
    listed: Option<(i64, i64, SystemTime)>,
    /// What every walk so far did, summed.
    pub walked: Walked,
    /// Walks made (an allocation's first, one a crash interrupted, or one
    /// an escape the guard let through called for).
    pub walks: u64,
    /// Per accounted allocation, the guard's count of changes it let
    /// through when its last walk started: a higher count calls for
    /// another walk.
    let_through: BTreeMap<String, u64>,
    /// The walks under way (a first walk, or one made again), each stepped
    /// once per scan in turn, so that none holds up the others.
    walking: BTreeMap<String, Walk>,
    /// Per allocation, the files its last walk left out for links outside
    /// it: a drop of a link count calls for another walk.
    linked: BTreeMap<String, Vec<Linked>>,
}

/// Multiply-linked files watched per allocation (two system calls each per
/// scan).
const MAX_WATCHED_LINKED: usize = 1024;

/// How long a listing is trusted while the alloc directory's change time
/// stays the same: two changes within one tick of the filesystem's clock
/// share a change time, so a listing made close to its last change is made
/// again.
const CTIME_TRUST: Duration = Duration::from_secs(2);

impl Accounting {
    /// Opens `path` and reads back every allocation's project, without
    /// tagging anything. Refuses a directory that is not on a filesystem
    /// with project quota, and a range the configuration left empty.
    /// `dir` is `path`, opened by the caller.
    pub fn open(path: &Path, dir: Arc<OwnedFd>, range: RangeInclusive<u32>) -> Result<Accounting> {
        match quota::support(dir.as_fd()) {
            Ok(quota::Support::Enforced | quota::Support::AccountingOnly) => {}
            Ok(quota::Support::Off) => bail!(
                "{} is on a filesystem without project quota: mount it with prjquota (XFS) or \
                 enable the project feature and prjquota (ext4), as for the volumes directory \
                 (docs/install.md)",
                path.display()
            ),
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot read the quota state of {}", path.display()))
            }
        }
        let (own, inherit) = quota::project_of(dir.as_fd())
            .with_context(|| format!("cannot read the project ID of {}", path.display()))?;
        if inherit && own != 0 {
            bail!(
                "{} itself is in project {own} with PROJINHERIT: every allocation would start in \
                 that project, and Nomad's own view of the directory would be a quota's; clear \
                 it (xfs_io -c 'chattr -P' -c 'chproj 0' {}) or leave allocations unaccounted",
                path.display(),
                path.display()
            );
        }
        let (st, mount) = sys::stat_and_mount(dir.as_fd())
            .with_context(|| format!("cannot stat {}", path.display()))?;
        let dev = st.st_dev;
        let mut a = Accounting {
            path: path.to_owned(),
            dir,
            dev,
            mount,
            cursor: *range.start(),
            range,
            allocs: BTreeMap::new(),
            listed: None,
            walked: Walked::default(),
            walks: 0,
            let_through: BTreeMap::new(),
            walking: BTreeMap::new(),
            linked: BTreeMap::new(),
        };
        a.relist()?;
        if let Some(last) = a.held_ids().max() {
            a.cursor = last.saturating_add(1);
        }
        Ok(a)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The alloc directory, shared with the scrapes' quota pass.
    pub fn dir(&self) -> Arc<OwnedFd> {
        self.dir.clone()
    }

    pub fn range(&self) -> &RangeInclusive<u32> {
        &self.range
    }

    /// Every accounted allocation and its project.
    pub fn accounted(&self) -> impl Iterator<Item = (&str, AllocProject)> + '_ {
        self.allocs.iter().filter_map(|(id, s)| match s {
            Seen::Accounted(p) => Some((id.as_str(), *p)),
            _ => None,
        })
    }

    /// The IDs allocation directories hold, walked or not.
    fn held_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.allocs.values().filter_map(|s| match s {
            Seen::Accounted(p) | Seen::Claimed(p) => Some(p.project_id),
            _ => None,
        })
    }

    /// The allocations the guard keeps, as it keys its roots: the
    /// accounted ones, and the claimed ones whose walk is not finished.
    pub fn guarded(&self) -> (Vec<GuardedAlloc>, Vec<GuardedAlloc>) {
        let (mut accounted, mut claimed) = (Vec::new(), Vec::new());
        for (id, s) in &self.allocs {
            match s {
                Seen::Accounted(p) => accounted.push(self.guarded_alloc(id, *p)),
                Seen::Claimed(p) => claimed.push(self.guarded_alloc(id, *p)),
                _ => {}
            }
        }
        (accounted, claimed)
    }

    fn guarded_alloc(&self, id: &str, p: AllocProject) -> GuardedAlloc {
        GuardedAlloc {
            alloc_id: Arc::from(id),
            dev: self.dev,
            ino: p.ino,
            gen: p.gen,
            project_id: p.project_id,
        }
    }

    pub fn census(&self) -> Census {
        let mut c = Census::default();
        for s in self.allocs.values() {
            match s {
                Seen::Accounted(_) => c.accounted += 1,
                Seen::Claimed(_) => c.walking += 1,
                Seen::Waiting => c.waiting += 1,
                Seen::Foreign(_) => c.foreign += 1,
            }
        }
        c.retries = self.walking.values().map(|w| w.retries() as u64).sum();
        c
    }

    /// Whether a walk is under way: the caller scans again at once rather
    /// than after its interval.
    pub fn busy(&self) -> bool {
        self.walking.values().any(|w| !w.is_done())
    }

    /// Brings the map up to date: lists the alloc directory when it
    /// changed, claims each waiting allocation whose first task started
    /// (its walk starts; [`Accounting::step_walks`] makes it), and starts
    /// another walk of each accounted one in which the guard let a change
    /// through or a shared file's link count dropped. One
    /// allocation's failure is logged by the caller from the returned list
    /// and retried at the next scan; the others go on.
    pub fn scan(&mut self, guard: &mut dyn GuardLink) -> Result<Vec<(String, anyhow::Error)>> {
        let st = sys::fstat(self.dir.as_fd())
            .with_context(|| format!("cannot stat {}", self.path.display()))?;
        let fresh = match self.listed {
            Some((sec, nsec, at)) => {
                sec == st.st_ctime
                    && nsec == st.st_ctime_nsec
                    && at
                        .duration_since(ctime_of(&st))
                        .is_ok_and(|d| d > CTIME_TRUST)
            }
            None => false,
        };
        if !fresh {
            self.relist()?;
        }
        let mut failed = Vec::new();
        // A claimed allocation whose walk is under way is stepped below.
        let waiting: Vec<String> = self
            .allocs
            .iter()
            .filter(|(id, s)| {
                matches!(s, Seen::Waiting | Seen::Claimed(_)) && !self.walking.contains_key(*id)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in waiting {
            match self.start_if_running(&id, guard) {
                Ok(()) => {}
                Err(e) if is_gone(&e) => {
                    self.allocs.remove(&id);
                }
                Err(e) => failed.push((id, e)),
            }
        }
        let accounted: Vec<(String, AllocProject)> = self
            .accounted()
            .map(|(id, p)| (id.to_string(), p))
            .collect();
        for (id, p) in accounted {
            let again = self
                .walk_again_if_escaped(&id, p, guard)
                .and_then(|()| self.walk_again_if_unlinked(&id, p));
            match again {
                Ok(()) => {}
                Err(e) if is_gone(&e) => {
                    self.allocs.remove(&id);
                }
                Err(e) => failed.push((id, e)),
            }
        }
        let allocs = &self.allocs;
        self.let_through.retain(|id, _| allocs.contains_key(id));
        self.walking.retain(|id, _| allocs.contains_key(id));
        self.linked.retain(|id, _| allocs.contains_key(id));
        Ok(failed)
    }

    /// Steps every walk under way once (see [`Budget::STEP`]), in turn: a
    /// scan's claims are handed to the guard before any walk runs, and no
    /// walk holds up another. Failures as [`Accounting::scan`]'s.
    pub fn step_walks(&mut self) -> Vec<(String, anyhow::Error)> {
        let mut failed = Vec::new();
        let walking: Vec<String> = self.walking.keys().cloned().collect();
        for id in walking {
            match self.step_walk(&id) {
                Ok(()) => {}
                Err(e) if is_gone(&e) => {
                    self.walking.remove(&id);
                    self.allocs.remove(&id);
                }
                Err(e) => {
                    // Made again from the start at the next scan.
                    self.walking.remove(&id);
                    failed.push((id, e));
                }
            }
        }
        failed
    }

    /// One step of allocation `id`'s walk: a first walk done publishes its
    /// usage; a walk done with nothing left to try again marks the
    /// directory walked; a walk that lost its place starts over.
    fn step_walk(&mut self, id: &str) -> Result<()> {
        let Some(p) = self.project_of_seen(id) else {
            self.walking.remove(id);
            return Ok(());
        };
        let fd = self.open_alloc(id)?;
        let (_, ino, gen) = root_identity_of(fd.as_fd())?;
        if (ino, gen) != (p.ino, p.gen) {
            // Another directory under the name: the next listing reads it.
            self.walking.remove(id);
            return Ok(());
        }
        let walk = self.walking.get_mut(id).expect("stepped walks are kept");
        let step = if walk.is_done() {
            walk.retry(fd.as_fd())
        } else {
            walk.step(fd.as_fd(), Budget::STEP)
        };
        self.walked += walk.take_walked();
        let step = step.with_context(|| format!("cannot tag {}", self.path.join(id).display()))?;
        match step {
            Step::Paused => {}
            Step::Done { complete: false } if walk.lost() => {
                // A directory moved under the walk: made again.
                self.walks += 1;
                *walk = Walk::new(fd.as_fd(), p.project_id)?;
            }
            Step::Done { complete } => {
                let mut linked = walk.take_linked();
                if complete {
                    self.walking.remove(id);
                    sys::fsetxattr(fd.as_fd(), WALKED, p.project_id.to_string().as_bytes())
                        .with_context(|| {
                            format!("cannot mark {} walked", self.path.join(id).display())
                        })?;
                }
                if !linked.is_empty() {
                    linked.truncate(MAX_WATCHED_LINKED);
                    self.linked.insert(id.to_string(), linked);
                }
                self.allocs.insert(id.to_string(), Seen::Accounted(p));
            }
        }
        Ok(())
    }

    fn project_of_seen(&self, id: &str) -> Option<AllocProject> {
        match self.allocs.get(id)? {
            Seen::Accounted(p) | Seen::Claimed(p) => Some(*p),
            _ => None,
        }
    }

    /// A file the last walk left out for its links outside the allocation
    /// whose link count dropped may now be the allocation's alone: walk
    /// again (a removed file is forgotten).
    fn walk_again_if_unlinked(&mut self, id: &str, p: AllocProject) -> Result<()> {
        if self.walking.contains_key(id) {
            return Ok(());
        }
        let Some(watched) = self.linked.get_mut(id) else {
            return Ok(());
        };
        let mut dropped = false;
        watched.retain(|l| {
            let Ok(fd) = sys::open_by_handle(self.dir.as_fd(), &l.handle, libc::O_PATH) else {
                return false;
            };
            match sys::fstat(fd.as_fd()) {
                Ok(st) if st.st_nlink < l.nlink => {
                    dropped = true;
                    false
                }
                Ok(_) => true,
                Err(_) => false,
            }
        });
        if watched.is_empty() {
            self.linked.remove(id);
        }
        if dropped {
            crate::info!(
                "a file an allocation shared with another place is now its own: walking it again",
                alloc_id = id,
                project_id = p.project_id,
            );
            self.start_walk(id, p)?;
        }
        Ok(())
    }

    /// Starts a walk of allocation `id` (one under way is made again from
    /// the start).
    fn start_walk(&mut self, id: &str, p: AllocProject) -> Result<()> {
        let fd = self.open_alloc(id)?;
        self.walks += 1;
        self.linked.remove(id);
        self.walking
            .insert(id.to_string(), Walk::new(fd.as_fd(), p.project_id)?);
        Ok(())
    }

    /// A change the guard let through (`--guard=detect`, or one of the
    /// enforcing guard's known gaps: a call judged before the allocation
    /// joined and applied after its walk passed the file) may have moved
    /// files out of the project: the walk puts back what is still in the
    /// allocation. At most one walk per allocation per scan.
    fn walk_again_if_escaped(
        &mut self,
        id: &str,
        p: AllocProject,
        guard: &mut dyn GuardLink,
    ) -> Result<()> {
        let Some(now) = guard
            .let_through(&self.guarded_alloc(id, p))
            .with_context(|| {
                format!(
                    "cannot tell whether the guard let a change through in {}",
                    self.path.join(id).display()
                )
            })?
        else {
            return Ok(());
        };
        let known = self.let_through.get(id).copied().unwrap_or(0);
        if now == known {
            return Ok(());
        }
        // Counted before the walk reads anything: a change during it calls
        // for the next.
        self.let_through.insert(id.to_string(), now);
        if now < known {
            // The counts started over (a new guard's maps).
            return Ok(());
        }
        let fd = self.open_alloc(id)?;
        let (_, ino, gen) = root_identity_of(fd.as_fd())?;
        if (ino, gen) != (p.ino, p.gen) {
            // Another directory under the name: the next listing reads it.
            return Ok(());
        }
        crate::warn!(
            "the quota-escape guard let a change through in an allocation: walking it again to put its files back into its project",
            alloc_id = id,
            project_id = p.project_id,
            let_through = now - known,
        );
        drop(fd);
        self.start_walk(id, p)
    }

    /// Lists the alloc directory: new allocations are read back (their
    /// project, if any), vanished ones dropped.
    fn relist(&mut self) -> Result<()> {
        let st = sys::fstat(self.dir.as_fd())
            .with_context(|| format!("cannot stat {}", self.path.display()))?;
        let now = SystemTime::now();
        let names = sys::read_dir(self.dir.as_fd())
            .with_context(|| format!("cannot list {}", self.path.display()))?;
        let mut next = BTreeMap::new();
        for e in names {
            let Some(id) = e.name.to_str().ok().filter(|n| is_alloc_id(n)) else {
                continue;
            };
            if e.d_type != libc::DT_DIR && e.d_type != libc::DT_UNKNOWN {
                continue;
            }
            // A known allocation directory is read again only when it is a
            // new inode under the same name (Nomad rebuilds an allocation
            // whose migration failed).
            let known = self.allocs.get(id).copied().filter(|s| match s {
                Seen::Accounted(p) | Seen::Claimed(p) => p.ino == e.ino,
                _ => true,
            });
            let seen = match known {
                Some(s) => s,
                None => match self.read_back(id) {
                    Ok(Some(s)) => s,
                    Ok(None) => continue,
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                    Err(e) => {
                        return Err(e).with_context(|| {
                            format!(
                                "cannot read the project of {}",
                                self.path.join(id).display()
                            )
                        })
                    }
                },
            };
            next.insert(id.to_string(), seen);
        }
        self.allocs = next;
        self.listed = Some((st.st_ctime, st.st_ctime_nsec, now));
        Ok(())
    }

    /// An allocation directory's state from its own attributes: the ID
    /// without the walked mark is a walk a crash interrupted, which the
    /// scan makes again.
    fn read_back(&mut self, id: &str) -> io::Result<Option<Seen>> {
        let fd = match self.open_alloc(id) {
            Ok(fd) => fd,
            // Not a directory on this mount (a file, a symlink, a mount
            // point): not an allocation Nomad made. Any other failure is
            // the scan's, said, never an allocation silently left out.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOTDIR | libc::ELOOP | libc::EXDEV)
                ) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        let (pid, inherit) = quota::project_of(fd.as_fd())?;
        if pid == 0 {
            return Ok(Some(Seen::Waiting));
        }
        if !self.range.contains(&pid) {
            return Ok(Some(Seen::Foreign(pid)));
        }
        let (_, ino, gen) = root_identity_of(fd.as_fd())?;
        let p = AllocProject {
            project_id: pid,
            ino,
            gen,
        };
        if inherit && walked_mark_of(fd.as_fd(), pid)? {
            Ok(Some(Seen::Accounted(p)))
        } else {
            Ok(Some(Seen::Claimed(p)))
        }
    }

    fn open_alloc(&self, id: &str) -> io::Result<OwnedFd> {
        let name = CString::new(id).map_err(io::Error::other)?;
        prjquota_core::fault::pause_before_open(&name);
        open_subdir(self.dir.as_fd(), &name, self.mount)
    }

    /// Tags allocation `id` if one of its tasks has started, or finishes
    /// the walk of one claimed before.
    fn start_if_running(&mut self, id: &str, guard: &mut dyn GuardLink) -> Result<()> {
        let fd = self.open_alloc(id)?;
        let (current, _) = quota::project_of(fd.as_fd())?;
        let (_, ino, gen) = root_identity_of(fd.as_fd())?;
        let project = |project_id| AllocProject {
            project_id,
            ino,
            gen,
        };
        let p = if self.range.contains(&current) {
            // Claimed by an earlier scan or exporter, its walk not
            // finished: guarded again (a restart), then walked again.
            let p = project(current);
            guard
                .join(&self.guarded_alloc(id, p), false)
                .with_context(|| format!("cannot guard {}", self.path.join(id).display()))?;
            p
        } else if current != 0 {
            self.allocs.insert(id.to_string(), Seen::Foreign(current));
            return Ok(());
        } else if !a_task_started(fd.as_fd(), self.mount)? {
            return Ok(());
        } else {
            let pid = self.claim(fd.as_fd(), id, project, guard)?;
            // A new claim's counts started over.
            self.let_through.insert(id.to_string(), 0);
            project(pid)
        };
        self.allocs.insert(id.to_string(), Seen::Claimed(p));
        if !self.walking.contains_key(id) {
            drop(fd);
            self.start_walk(id, p)?;
        }
        Ok(())
    }

    /// Chooses an ID, puts the allocation into the guard with it, and
    /// gives it to the allocation directory with PROJINHERIT: from then on
    /// the kernel counts the directory's inode to it, which keeps every
    /// other chooser off it, and whatever is made in it inherits it.
    fn claim(
        &mut self,
        fd: BorrowedFd<'_>,
        id: &str,
        project: impl Fn(u32) -> AllocProject,
        guard: &mut dyn GuardLink,
    ) -> Result<u32> {
        // Under the filesystem's lock from choice to claim: another alloc
        // directory on this filesystem (a second agent) may share the range.
        let name = format!("alloc-ids-{:x}.lock", self.dev);
        let _ids = run_dir::lock(&name)
            .with_context(|| format!("cannot take {}/{name}", run_dir::RUN_DIR))?;
        let pid = self.choose_id()?;
        guard
            .join(&self.guarded_alloc(id, project(pid)), true)
            .with_context(|| format!("cannot guard {}", self.path.join(id).display()))?;
        let mut a = sys::get_fsxattr(fd)?;
        a.projid = pid;
        a.xflags |= sys::FS_XFLAG_PROJINHERIT;
        sys::set_fsxattr(fd, &a).with_context(|| {
            format!(
                "cannot give {} project ID {pid}",
                self.path.join(id).display()
            )
        })?;
        self.cursor = pid.saturating_add(1);
        Ok(pid)
    }

    /// The next ID of the range no accounted allocation holds and the
    /// kernel counts nothing to, from past the last one given, wrapping
    /// once; one pass over the range when stepping does not find one.
    fn choose_id(&mut self) -> Result<u32> {
        let held: std::collections::BTreeSet<u32> = self.held_ids().collect();
        let fd = self.dir.as_fd();
        let read = |p| quota::get(fd, p);
        // From the cursor, then (wrapped) from the range's start: a bounded
        // number of reads each whatever was squatted, before a pass.
        for start in [self.cursor, *self.range.start()] {
            if let Some(pid) = project_ids::bounded_free_from(
                &self.range,
                start,
                |p| held.contains(&p),
                read,
                project_ids::seed(),
            )
            .with_context(|| format!("cannot read the quota of {}", self.path.display()))?
            {
                return Ok(pid);
            }
        }
        let kernel = quota::list(fd, self.range.clone())
            .with_context(|| format!("cannot list the quotas of {}", self.path.display()))?;
        project_ids::lowest_free(&self.range, held, &kernel).with_context(|| {
            format!(
                "no free project ID left for allocations in {}..={} on {}: widen \
                 alloc_project_id_min/alloc_project_id_max in prjquota.toml",
                self.range.start(),
                self.range.end(),
                self.path.display()
            )
        })
    }
}

/// Set on an allocation directory once its walk is complete, holding its
/// project ID: a `trusted.` attribute, which only a process with
/// CAP_SYS_ADMIN can set or read, so a task cannot fake it. Missing, the
/// walk was stopped (a crash, a kill) and is made again.
const WALKED: &std::ffi::CStr = c"trusted.prjquota.walked";

fn walked_mark_of(fd: BorrowedFd<'_>, pid: u32) -> io::Result<bool> {
    Ok(sys::fgetxattr(fd, WALKED)?.is_some_and(|v| v == pid.to_string().as_bytes()))
}

/// Whether a task of the allocation has started: some `<task>/tmp`
/// directory exists (Nomad makes it when it builds the task's directory,
/// after any previous allocation's data has moved in).
fn a_task_started(alloc: BorrowedFd<'_>, mount: u64) -> io::Result<bool> {
    for e in sys::read_dir(alloc)? {
        if e.name.as_bytes() == b"alloc" {
            continue;
        }
        let Ok(task) = open_subdir(alloc, &e.name, mount) else {
            continue;
        };
        if let Ok(st) = sys::fstatat_nofollow(task.as_fd(), c"tmp") {
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// A Nomad allocation ID: a lowercase UUID, 8-4-4-4-12.
pub fn is_alloc_id(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        })
}

fn is_gone(e: &anyhow::Error) -> bool {
    e.downcast_ref::<io::Error>()
        .is_some_and(|e| e.raw_os_error() == Some(libc::ENOENT))
}

fn ctime_of(st: &libc::stat) -> SystemTime {
    SystemTime::UNIX_EPOCH
        + Duration::new(
            u64::try_from(st.st_ctime).unwrap_or(0),
            u32::try_from(st.st_ctime_nsec).unwrap_or(0),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_lowercase_uuids_are_allocations() {
        assert!(is_alloc_id("8f3e9d2c-4b1a-4c6e-9a7d-2e5b6c1f0a93"));
        for no in [
            "8F3E9D2C-4B1A-4C6E-9A7D-2E5B6C1F0A93",
            "8f3e9d2c-4b1a-4c6e-9a7d-2e5b6c1f0a9",
            "8f3e9d2c-4b1a-4c6e-9a7d-2e5b6c1f0a93x",
            "8f3e9d2c_4b1a-4c6e-9a7d-2e5b6c1f0a93",
            "alloc",
            "..",
        ] {
            assert!(!is_alloc_id(no), "{no}");
        }
    }
}
