//! Puts one allocation's tree into a project: a walk made when the
//! allocation's first task starts (and again when something got out).
//!
//! Each directory gets the project ID and `PROJINHERIT` as it is entered,
//! before it is read, so that whatever is created in it from then on is
//! charged to the project by the kernel itself; what it held before is then
//! read and tagged one entry at a time. The walk never leaves the
//! allocation directory's mount: Nomad's bind mounts (`<task>/alloc`) and
//! tmpfs mounts (`secrets`, `private`) are skipped however their device
//! numbers look.
//!
//! Nothing is opened before it is known: each entry is opened with
//! `O_PATH` and only a directory, a regular file or a FIFO is opened again
//! from that descriptor ([`prjquota_core::entry_open`]); a device node a
//! task swapped in after the listing is never opened.
//!
//! A walk is resumable ([`Walk::step`]): it runs for a budget of entries
//! and time, then stops with a file handle of the directory it was reading
//! and, for each level above, only that directory's inode and where its
//! listing goes on (16 bytes a level, whatever the directories hold), so
//! that one allocation of a million directories neither fills the
//! exporter's memory nor holds up the others' walks. Going up, a directory
//! is reopened through `..` and must be the one it came from; a walk that
//! lost its place that way (a directory renamed meanwhile) is made again.
//!
//! Left as they are, and counted:
//! - files with more than one link, unless the walk met every link inside
//!   the allocation: a chroot's hard links to host files share their inode
//!   with the host, whose project they must keep. The others are kept by
//!   handle, and a drop of their link count calls for another walk
//!   ([`Linked`]);
//! - symlinks, sockets and device nodes: `FS_IOC_FSSETXATTR` needs an open
//!   descriptor, and opening a device can act on it.
//!
//! A file that cannot be opened for now (another process holds a write
//! lease on it) is kept by handle and tried again at every step until it
//! is tagged: the walk is complete only when none is left.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use prjquota_core::entry_open::{open_entry, Opened};
use prjquota_core::sys::{self, FileHandle};

/// What a walk did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Walked {
    /// Directories put into the project (the allocation's own included).
    pub dirs: u64,
    /// Files put into the project.
    pub files: u64,
    /// Entries already in the project.
    pub already: u64,
    /// Files left out because they have links outside the allocation.
    pub linked: u64,
    /// Mount points left out.
    pub mounts: u64,
    /// Symlinks, sockets and device nodes left out.
    pub special: u64,
    /// Directories not read: the walk's memory budget for levels was spent.
    pub deep: u64,
    /// Entries that vanished between listing and opening.
    pub gone: u64,
    /// Entries that could not be tagged (an immutable file, an I/O error,
    /// a write lease): tried again until they are.
    pub failed: u64,
}

impl std::ops::AddAssign for Walked {
    fn add_assign(&mut self, w: Walked) {
        self.dirs += w.dirs;
        self.files += w.files;
        self.already += w.already;
        self.linked += w.linked;
        self.mounts += w.mounts;
        self.special += w.special;
        self.deep += w.deep;
        self.gone += w.gone;
        self.failed += w.failed;
    }
}

/// How much one [`Walk::step`] may do before it stops for the others.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub entries: u64,
    pub time: Duration,
}

impl Budget {
    /// A step of a scan: a few thousand entries or 20 ms, whichever ends
    /// first, so that a scan over many walking allocations stays short.
    pub const STEP: Budget = Budget {
        entries: 4096,
        time: Duration::from_millis(20),
    };
    /// No limit: one step walks the whole tree (tests, and trees known
    /// small).
    pub const WHOLE: Budget = Budget {
        entries: u64::MAX,
        time: Duration::MAX,
    };
}

/// The levels a walk may keep (16 bytes each): the deepest tree it reads
/// whole. Below it a directory is entered (it gets the project and
/// `PROJINHERIT`) but not read.
pub const MAX_LEVELS: usize = 1 << 22;
/// Multiply-linked files a walk keeps count of (a handle each, 50 bytes).
const MAX_LINKED: usize = 1 << 16;
/// Files a walk keeps trying again (a handle each).
const MAX_RETRY: usize = 1 << 16;
/// One `getdents64` read.
const BATCH_BYTES: usize = 16 * 1024;

/// Where a [`Walk::step`] left off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The budget ran out: call again.
    Paused,
    /// Every directory was read. `complete`: nothing is left to try again
    /// (a walk that lost its place, or files that could not be tagged yet,
    /// leave it incomplete: the caller walks again, or calls
    /// [`Walk::retry`]).
    Done { complete: bool },
}

/// A multiply-linked file the walk met: its handle, its link count, and
/// how many of its links the walk saw.
#[derive(Debug, Clone)]
pub struct Linked {
    pub handle: FileHandle,
    pub nlink: u64,
    seen: u64,
}

#[derive(Debug)]
struct Level {
    ino: u64,
    /// Where its listing goes on (a `d_off`; 0 the first entry).
    resume: i64,
}

/// One walk of one allocation's tree into project `id`.
#[derive(Debug)]
pub struct Walk {
    id: u32,
    /// The allocation's mount: the walk never leaves it.
    mount: u64,
    levels: Vec<Level>,
    /// The directory being read, by handle, between steps.
    suspended: Option<FileHandle>,
    /// What this walk did so far.
    pub walked: Walked,
    linked: HashMap<u64, Linked>,
    retry: Vec<FileHandle>,
    /// Its place was lost: the tree must be walked again.
    lost: bool,
    done: bool,
}

impl Walk {
    /// A walk of everything beneath `top` (whose own attributes are left
    /// alone) into project `id`.
    pub fn new(top: BorrowedFd<'_>, id: u32) -> io::Result<Walk> {
        let (st, mount) = sys::stat_and_mount(top)?;
        Ok(Walk {
            id,
            mount,
            levels: vec![Level {
                ino: st.st_ino,
                resume: 0,
            }],
            suspended: None,
            walked: Walked::default(),
            linked: HashMap::new(),
            retry: Vec::new(),
            lost: false,
            done: false,
        })
    }

    /// Walks on from where the last step stopped, for at most `budget`.
    /// `top` is the allocation directory, the same every step.
    pub fn step(&mut self, top: BorrowedFd<'_>, budget: Budget) -> io::Result<Step> {
        if self.done {
            return Ok(self.finished());
        }
        let until = Instant::now().checked_add(budget.time);
        let mut left = budget.entries;
        let mut buf = vec![0u8; BATCH_BYTES];
        let Some(mut dir) = self.resume(top)? else {
            self.lost = true;
            self.done = true;
            return Ok(self.finished());
        };
        loop {
            if left == 0 || until.is_some_and(|u| Instant::now() >= u) {
                self.suspended = Some(sys::handle_of(dir.as_fd())?);
                return Ok(Step::Paused);
            }
            let level = self.levels.last_mut().expect("a walk has a level");
            sys::seek_dir(dir.as_fd(), level.resume)?;
            let batch = sys::read_dir_batch(dir.as_fd(), &mut buf).inspect_err(|_| {
                self.walked.failed += 1;
            })?;
            if batch.is_empty() {
                if self.levels.len() == 1 {
                    self.done = true;
                    self.settle_linked();
                    return Ok(self.finished());
                }
                let child = self.levels.pop().expect("more than one level");
                let _ = child;
                match self.up(dir.as_fd()) {
                    Some(parent) => dir = parent,
                    None => {
                        self.lost = true;
                        self.done = true;
                        return Ok(self.finished());
                    }
                }
                continue;
            }
            let mut descended = None;
            for entry in batch {
                left = left.saturating_sub(1);
                self.levels.last_mut().expect("a level").resume = entry.d_off;
                if let Some(sub) = self.entry(dir.as_fd(), &entry) {
                    descended = Some(sub);
                    break;
                }
                if left == 0 {
                    break;
                }
            }
            if let Some((fd, ino)) = descended {
                if self.levels.len() >= MAX_LEVELS {
                    self.walked.deep += 1;
                } else {
                    self.levels.push(Level { ino, resume: 0 });
                    dir = fd;
                }
            }
        }
    }

    /// Tries again each file that could not be tagged yet.
    pub fn retry(&mut self, top: BorrowedFd<'_>) -> io::Result<Step> {
        let mut still = Vec::new();
        for h in std::mem::take(&mut self.retry) {
            match sys::open_by_handle(top, &h, libc::O_RDONLY | libc::O_NOCTTY | libc::O_NONBLOCK) {
                Ok(fd) => match set_project(fd.as_fd(), self.id, false) {
                    Ok(true) => self.walked.files += 1,
                    Ok(false) => self.walked.already += 1,
                    Err(_) => still.push(h),
                },
                Err(e) if matches!(e.raw_os_error(), Some(libc::ESTALE | libc::ENOENT)) => {
                    self.walked.gone += 1
                }
                Err(_) => still.push(h),
            }
        }
        self.retry = still;
        Ok(self.finished())
    }

    /// Files the walk left out for their links outside the allocation,
    /// to watch for a drop of their link count.
    pub fn take_linked(&mut self) -> Vec<Linked> {
        self.linked.drain().map(|(_, l)| l).collect()
    }

    /// Files waiting to be tried again.
    pub fn retries(&self) -> usize {
        self.retry.len()
    }

    /// Every directory was read (files may wait to be tried again).
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The walk lost its place: it must be made again.
    pub fn lost(&self) -> bool {
        self.lost
    }

    /// What the walk did since the last call.
    pub fn take_walked(&mut self) -> Walked {
        std::mem::take(&mut self.walked)
    }

    fn finished(&self) -> Step {
        Step::Done {
            complete: !self.lost && self.retry.is_empty(),
        }
    }

    /// The directory the last step was reading: the allocation itself at
    /// the start, else reopened by its handle; `None` when it is gone or
    /// another (the walk lost its place).
    fn resume(&mut self, top: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        let fd = match self.suspended.take() {
            Some(h) => match sys::open_by_handle(top, &h, flags) {
                Ok(fd) => fd,
                Err(e) if matches!(e.raw_os_error(), Some(libc::ESTALE | libc::ENOENT)) => {
                    return Ok(None)
                }
                Err(e) => return Err(e),
            },
            None => sys::openat(top, c".", flags, 0)?,
        };
        let want = self.levels.last().expect("a level").ino;
        Ok((sys::fstat(fd.as_fd())?.st_ino == want).then_some(fd))
    }

    /// The parent of `dir`, which must be the level above: `None` when it
    /// is not (the directory moved).
    fn up(&mut self, dir: BorrowedFd<'_>) -> Option<OwnedFd> {
        let parent = sys::openat(
            dir,
            c"..",
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )
        .ok()?;
        let want = self.levels.last()?.ino;
        (sys::fstat(parent.as_fd()).ok()?.st_ino == want).then_some(parent)
    }

    /// Tags one entry of `dir`; returns a subdirectory to enter, already in
    /// the project.
    fn entry(&mut self, dir: BorrowedFd<'_>, entry: &sys::DirEntry) -> Option<(OwnedFd, u64)> {
        let opened = match open_entry(dir, &entry.name, self.mount) {
            Ok(o) => o,
            Err(e) => {
                match e.raw_os_error() {
                    Some(libc::EXDEV) => self.walked.mounts += 1,
                    Some(libc::ENOENT) => self.walked.gone += 1,
                    _ => self.walked.failed += 1,
                }
                return None;
            }
        };
        match opened {
            Opened::Dir(fd, st) => {
                // Renamed away and replaced since it was listed: the
                // replacement was made in, or moved into, a directory that
                // already inherits.
                if st.st_ino != entry.ino {
                    self.walked.gone += 1;
                    return None;
                }
                match set_project(fd.as_fd(), self.id, true) {
                    Ok(true) => self.walked.dirs += 1,
                    Ok(false) => self.walked.already += 1,
                    // Still read: what it holds may be taggable.
                    Err(_) => self.walked.failed += 1,
                }
                Some((fd, st.st_ino))
            }
            Opened::File(fd, st) => {
                self.file(fd, &st);
                None
            }
            Opened::Unopened(path, _, _) => {
                self.walked.failed += 1;
                self.keep_for_retry(path.as_fd());
                None
            }
            Opened::Other(..) => {
                self.walked.special += 1;
                None
            }
        }
    }

    fn file(&mut self, fd: OwnedFd, st: &libc::stat) {
        if st.st_nlink > 1 {
            let Some(l) = self.count_link(fd.as_fd(), st) else {
                self.walked.linked += 1;
                return;
            };
            if l.seen < l.nlink {
                return;
            }
            // Every link is inside the allocation: it is the task's own.
            self.linked.remove(&st.st_ino);
        }
        match set_project(fd.as_fd(), self.id, false) {
            Ok(true) => self.walked.files += 1,
            Ok(false) => self.walked.already += 1,
            Err(_) => {
                self.walked.failed += 1;
                self.keep_for_retry(fd.as_fd());
            }
        }
    }

    /// Counts a link of a multiply-linked file; `None` when there is no
    /// room left to keep it (then it is left out for good).
    fn count_link(&mut self, fd: BorrowedFd<'_>, st: &libc::stat) -> Option<&Linked> {
        if !self.linked.contains_key(&st.st_ino) {
            if self.linked.len() >= MAX_LINKED {
                return None;
            }
            let handle = sys::handle_of(fd).ok()?;
            self.linked.insert(
                st.st_ino,
                Linked {
                    handle,
                    nlink: st.st_nlink,
                    seen: 0,
                },
            );
        }
        let l = self.linked.get_mut(&st.st_ino)?;
        l.seen += 1;
        Some(l)
    }

    /// Multiply-linked files with links outside the allocation, once the
    /// whole tree was read: left out, counted.
    fn settle_linked(&mut self) {
        self.walked.linked += self.linked.len() as u64;
    }

    fn keep_for_retry(&mut self, fd: BorrowedFd<'_>) {
        if self.retry.len() < MAX_RETRY {
            if let Ok(h) = sys::handle_of(fd) {
                self.retry.push(h);
            }
        }
    }
}

/// Puts everything beneath `top` on its mount into project `id` in one
/// go, leaving `top`'s own attributes alone.
pub fn tag_below(top: BorrowedFd<'_>, id: u32) -> io::Result<Walked> {
    let mut w = Walk::new(top, id)?;
    w.step(top, Budget::WHOLE)?;
    Ok(w.walked)
}

/// Gives an open inode project `id` (and `PROJINHERIT` when `inherit`),
/// keeping its other attributes. `Ok(false)`: it already had them.
pub fn set_project(fd: BorrowedFd<'_>, id: u32, inherit: bool) -> io::Result<bool> {
    let mut a = sys::get_fsxattr(fd)?;
    let want_flag = if inherit {
        sys::FS_XFLAG_PROJINHERIT
    } else {
        0
    };
    if a.projid == id && a.xflags & want_flag == want_flag {
        return Ok(false);
    }
    a.projid = id;
    a.xflags |= want_flag;
    sys::set_fsxattr(fd, &a)?;
    Ok(true)
}
