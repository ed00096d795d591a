//! Puts one allocation's tree into a project: the walk made once, when the
//! allocation's first task starts.
//!
//! Each directory gets the project ID and `PROJINHERIT` as it is opened,
//! before it is read, so that whatever is created in it from then on is
//! charged to the project by the kernel itself; what it held before is then
//! read and tagged one entry at a time. The walk never leaves the
//! allocation directory's mount (`openat2` with `RESOLVE_NO_XDEV`): Nomad's
//! bind mounts (`<task>/alloc`) and tmpfs mounts (`secrets`, `private`) are
//! skipped however their device numbers look.
//!
//! Left as they are, and counted:
//! - files with more than one link: a chroot's hard links to host files
//!   (`/usr/bin/…`) share their inode with the host, whose project they
//!   must keep;
//! - symlinks, sockets and device nodes: `FS_IOC_FSSETXATTR` needs an open
//!   descriptor, and opening a device can act on it;
//! - what lies deeper than [`MAX_DEPTH`] directories (each level holds a
//!   descriptor); the deepest directory still inherits, so only what was
//!   there before the walk stays out.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use prjquota_core::sys;

/// Directory levels below the allocation directory the walk descends.
pub const MAX_DEPTH: usize = 64;

/// What a walk did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Walked {
    /// Directories put into the project (the allocation's own included).
    pub dirs: u64,
    /// Files put into the project.
    pub files: u64,
    /// Entries already in the project.
    pub already: u64,
    /// Files left out because they have more than one link.
    pub linked: u64,
    /// Mount points left out.
    pub mounts: u64,
    /// Symlinks, sockets and device nodes left out.
    pub special: u64,
    /// Directories not read because they lie deeper than [`MAX_DEPTH`].
    pub deep: u64,
    /// Entries that vanished between listing and opening.
    pub gone: u64,
    /// Entries that could not be tagged (an immutable file, an I/O error).
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

/// Puts everything beneath `top` on its mount into project `id`, leaving
/// `top`'s own attributes alone.
pub fn tag_below(top: BorrowedFd<'_>, id: u32) -> io::Result<Walked> {
    let mut walked = Walked::default();
    let mut buf = vec![0u8; 32 * 1024];
    let top = sys::openat(top, c".", DIR_FLAGS, 0)?;
    let subdirs = list_and_tag(top.as_fd(), id, &mut buf, &mut walked);
    // Depth first, one descriptor per level: each level keeps the names of
    // the subdirectories it has yet to enter.
    let mut stack = vec![Level { fd: top, subdirs }];
    loop {
        let depth = stack.len();
        let Some(level) = stack.last_mut() else { break };
        let Some((name, ino)) = level.subdirs.pop() else {
            stack.pop();
            continue;
        };
        let Some(fd) = enter(level.fd.as_fd(), &name, ino, id, &mut walked) else {
            continue;
        };
        if depth > MAX_DEPTH {
            walked.deep += 1;
            continue;
        }
        let subdirs = list_and_tag(fd.as_fd(), id, &mut buf, &mut walked);
        stack.push(Level { fd, subdirs });
    }
    Ok(walked)
}

/// Opens subdirectory `name` of `parent`, listed as inode `ino`, and puts
/// it into the project with `PROJINHERIT`: right before it is read, so that
/// a file made in it meanwhile is either listed or inherits, and one made
/// before stays out of the project only for the time its listing takes
/// (a rename into a directory that inherits another project fails).
fn enter(
    parent: BorrowedFd<'_>,
    name: &CStr,
    ino: u64,
    id: u32,
    walked: &mut Walked,
) -> Option<OwnedFd> {
    let fd = match sys::openat_no_xdev(parent, name, DIR_FLAGS) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            walked.mounts += 1;
            return None;
        }
        Err(e) => {
            count_error(&e, walked);
            return None;
        }
    };
    // Renamed away and replaced since it was listed: the replacement was
    // made in, or moved into, a directory that already inherits.
    match sys::fstat(fd.as_fd()) {
        Ok(st) if st.st_ino == ino => {}
        Ok(_) => {
            walked.gone += 1;
            return None;
        }
        Err(e) => {
            count_error(&e, walked);
            return None;
        }
    }
    match set_project(fd.as_fd(), id, true) {
        Ok(true) => walked.dirs += 1,
        Ok(false) => walked.already += 1,
        // Still read: what it holds may be taggable.
        Err(e) => count_error(&e, walked),
    }
    Some(fd)
}

const DIR_FLAGS: i32 = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;

struct Level {
    fd: OwnedFd,
    subdirs: Vec<(CString, u64)>,
}

/// Lists `dir` to its end, tagging each entry; returns its subdirectories
/// (name and inode) for the walk to enter.
fn list_and_tag(
    dir: BorrowedFd<'_>,
    id: u32,
    buf: &mut [u8],
    walked: &mut Walked,
) -> Vec<(CString, u64)> {
    let mut subdirs = Vec::new();
    loop {
        let batch = match sys::read_dir_batch(dir, buf) {
            Ok(b) if b.is_empty() => return subdirs,
            Ok(b) => b,
            Err(_) => {
                walked.failed += 1;
                return subdirs;
            }
        };
        for entry in batch {
            if let Some(ino) = entry_step(dir, &entry.name, entry.d_type, id, walked) {
                subdirs.push((entry.name, ino));
            }
        }
    }
}

/// Tags one entry of `dir`; returns the inode of a subdirectory to enter.
fn entry_step(
    dir: BorrowedFd<'_>,
    name: &CStr,
    d_type: u8,
    id: u32,
    walked: &mut Walked,
) -> Option<u64> {
    let d_type = if d_type == libc::DT_UNKNOWN {
        match sys::fstatat_nofollow(dir, name) {
            Ok(st) => mode_to_dtype(st.st_mode),
            Err(e) => {
                count_error(&e, walked);
                return None;
            }
        }
    } else {
        d_type
    };
    let flags = match d_type {
        // Entered (and tagged) by the walk when its turn comes.
        libc::DT_DIR => match sys::fstatat_nofollow(dir, name) {
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => return Some(st.st_ino),
            Ok(_) => libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NOCTTY | libc::O_NONBLOCK,
            Err(e) => {
                count_error(&e, walked);
                return None;
            }
        },
        // Non-blocking: a FIFO opens at once without a writer.
        libc::DT_REG | libc::DT_FIFO => {
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NOCTTY | libc::O_NONBLOCK
        }
        _ => {
            walked.special += 1;
            return None;
        }
    };
    let fd = match sys::openat_no_xdev(dir, name, flags) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            walked.mounts += 1;
            return None;
        }
        // Replaced by a symlink since the listing.
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            walked.special += 1;
            return None;
        }
        Err(e) => {
            count_error(&e, walked);
            return None;
        }
    };
    let st = match sys::fstat(fd.as_fd()) {
        Ok(st) => st,
        Err(e) => {
            count_error(&e, walked);
            return None;
        }
    };
    let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
    // The type may have changed since the listing (a rename over it): the
    // descriptor is what counts.
    if !is_dir
        && st.st_mode & libc::S_IFMT != libc::S_IFREG
        && st.st_mode & libc::S_IFMT != libc::S_IFIFO
    {
        walked.special += 1;
        return None;
    }
    if !is_dir && st.st_nlink > 1 {
        walked.linked += 1;
        return None;
    }
    match set_project(fd.as_fd(), id, is_dir) {
        Ok(true) if is_dir => walked.dirs += 1,
        Ok(true) => walked.files += 1,
        Ok(false) => walked.already += 1,
        Err(e) => {
            count_error(&e, walked);
            // A directory that cannot be tagged is still read: what it
            // holds may be taggable.
            if !is_dir {
                return None;
            }
        }
    }
    is_dir.then_some(st.st_ino)
}

fn count_error(e: &io::Error, walked: &mut Walked) {
    if e.raw_os_error() == Some(libc::ENOENT) {
        walked.gone += 1;
    } else {
        walked.failed += 1;
    }
}

/// Gives an open inode project `id` (and `PROJINHERIT` when `inherit`),
/// keeping its other attributes. `Ok(false)`: it already had them.
fn set_project(fd: BorrowedFd<'_>, id: u32, inherit: bool) -> io::Result<bool> {
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

fn mode_to_dtype(mode: u32) -> u8 {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => libc::DT_DIR,
        libc::S_IFREG => libc::DT_REG,
        libc::S_IFIFO => libc::DT_FIFO,
        libc::S_IFLNK => libc::DT_LNK,
        libc::S_IFSOCK => libc::DT_SOCK,
        libc::S_IFCHR => libc::DT_CHR,
        libc::S_IFBLK => libc::DT_BLK,
        _ => libc::DT_UNKNOWN,
    }
}
