//! Removing a volume's directory tree without ever leaving it.
//!
//! Workloads own what is inside a volume, so the tree is hostile: symlinks to
//! anywhere, directories swapped for links mid-delete, mounts, FIFOs, hard
//! links, trees ten thousand levels deep. The walk therefore:
//!
//! - works only through directory descriptors (`openat`/`unlinkat` relative
//!   to an fd), opens every directory with `O_NOFOLLOW | O_DIRECTORY`, and
//!   checks that what it opened is what it listed (device and inode), so a
//!   symlink is only ever unlinked, never followed;
//! - never descends into another mount (mount ID from `statx`) or device;
//! - holds at most [`MAX_OPEN`] descriptors however deep the tree is: deeper
//!   ancestors are closed and reopened through `..`, and the reopened
//!   directory must have the device and inode recorded on the way down, or
//!   the walk stops with an error rather than unlink in an unknown place;
//! - reads each directory in batches of one `getdents64` buffer and acts on
//!   a batch (unlinks its files, descends into its subdirectories) before
//!   reading the next, so a directory of millions of entries costs no more
//!   memory than a small one, and the work done so far is kept if Nomad's
//!   deadline ends the delete: the next delete starts from what is left;
//! - clears the immutable and append-only flags (`chattr +i`/`+a`, which a
//!   workload with `CAP_LINUX_IMMUTABLE` can set) of an entry, or of the
//!   directory holding it, when the kernel refuses to unlink it, and only
//!   of regular files and directories it opened itself without following
//!   a link and checked to be on the volume's mount.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use prjquota_core::entry_open::{open_entry, Opened};
use prjquota_core::sys;

/// Descriptors kept open at once during a walk.
const MAX_OPEN: usize = 64;
/// Listing passes over one directory before giving up on a writer that keeps
/// filling it.
const MAX_PASSES: usize = 8;
/// One `getdents64` read: a few hundred entries of typical names.
const BATCH_BYTES: usize = 16 * 1024;
/// The flags that make the kernel refuse an unlink even to root.
const LOCK_FLAGS: u32 = sys::FS_XFLAG_IMMUTABLE | sys::FS_XFLAG_APPEND;

/// What a removal did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Removed {
    pub files: u64,
    pub dirs: u64,
}

struct Frame {
    fd: Option<OwnedFd>,
    dev: u64,
    ino: u64,
    /// Name of this directory in its parent.
    name: CString,
    /// The unhandled rest of the last batch read, last entry first.
    batch: Vec<sys::DirEntry>,
    /// The descriptor's position reached the end of the directory.
    listed: bool,
    passes: usize,
}

impl Frame {
    fn new(fd: OwnedFd, dev: u64, ino: u64, name: CString) -> Frame {
        Frame {
            fd: Some(fd),
            dev,
            ino,
            name,
            batch: Vec::new(),
            listed: false,
            passes: 1,
        }
    }
}

fn is_dir(mode: u32) -> bool {
    mode & libc::S_IFMT == libc::S_IFDIR
}

fn gone(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
}

/// Opens `name` below `parent` as a directory, refusing links, and checks it
/// is on `dev`/`mnt` (and, when given, is exactly inode `ino`).
fn open_dir_checked(
    parent: BorrowedFd<'_>,
    name: &CStr,
    dev: u64,
    mnt: u64,
    ino: Option<u64>,
) -> io::Result<(OwnedFd, u64)> {
    let fd = sys::openat(
        parent,
        name,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
        0,
    )?;
    let st = sys::fstat(fd.as_fd())?;
    if st.st_dev != dev || sys::mount_id(fd.as_fd())? != mnt {
        return Err(io::Error::other(format!(
            "{} is another filesystem or mount; refusing to delete into it",
            name.to_string_lossy()
        )));
    }
    if ino.is_some_and(|i| i != st.st_ino) {
        return Err(io::Error::other(format!(
            "{} changed while it was being deleted; stopping",
            name.to_string_lossy()
        )));
    }
    Ok((fd, st.st_ino))
}

/// Removes `name` below `parent` and everything under it. A non-directory
/// (a symlink included) is simply unlinked. An absent `name` is success.
pub fn remove_tree(parent: BorrowedFd<'_>, name: &CStr) -> io::Result<Removed> {
    let mut done = Removed::default();
    let st = match sys::fstatat_nofollow(parent, name) {
        Ok(st) => st,
        Err(e) if gone(&e) => return Ok(done),
        Err(e) => return Err(e),
    };
    if !is_dir(st.st_mode) {
        match sys::unlinkat(parent, name, false) {
            Ok(()) => done.files += 1,
            Err(e) if gone(&e) => {}
            Err(e) => return Err(e),
        }
        return Ok(done);
    }
    let pst = sys::fstat(parent)?;
    let dev = pst.st_dev;
    let mnt = sys::mount_id(parent)?;
    let (fd, ino) = open_dir_checked(parent, name, dev, mnt, Some(st.st_ino))?;
    let mut stack = vec![Frame::new(fd, dev, ino, name.to_owned())];
    let mut first_open = 1;
    let mut buf = vec![0u8; BATCH_BYTES];

    loop {
        let top = stack.last_mut().expect("stack is never empty here");
        let fd = top.fd.as_ref().expect("the top frame is open");
        if let Some(entry) = top.batch.pop() {
            let dir = match entry.d_type {
                libc::DT_DIR => true,
                libc::DT_UNKNOWN => match sys::fstatat_nofollow(fd.as_fd(), &entry.name) {
                    Ok(st) => is_dir(st.st_mode),
                    Err(e) if gone(&e) => continue,
                    Err(e) => return Err(e),
                },
                _ => false,
            };
            if !dir {
                unlink_entry(fd.as_fd(), &entry.name, dev, mnt, &mut done)?;
                continue;
            }
            match open_dir_checked(fd.as_fd(), &entry.name, dev, mnt, None) {
                Ok((cfd, cino)) => {
                    stack.push(Frame::new(cfd, dev, cino, entry.name));
                    // Bound the open descriptors: close the oldest one still
                    // open above the root frame. Frames from `first_open` up
                    // are open; those below it (but the root) are closed.
                    if stack.len() - first_open > MAX_OPEN {
                        stack[first_open].fd = None;
                        first_open += 1;
                    }
                }
                Err(e) if gone(&e) => {}
                // Replaced by a non-directory (a symlink, say) since it was
                // listed: unlink the entry itself, never what it points to.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
                    unlink_entry(fd.as_fd(), &entry.name, dev, mnt, &mut done)?;
                }
                Err(e) => return Err(e),
            }
            continue;
        }
        if !top.listed {
            let mut batch = sys::read_dir_batch(fd.as_fd(), &mut buf)?;
            if batch.is_empty() {
                top.listed = true;
            } else {
                batch.reverse();
                top.batch = batch;
            }
            continue;
        }

        // The whole directory was listed and handled: remove it from its
        // parent, unless a writer added entries meanwhile.
        let frame = stack.pop().expect("non-empty");
        let depth = stack.len();
        let Some(parent_frame) = stack.last_mut() else {
            // The root of the walk: its parent is the caller's descriptor,
            // which is not the volume's to unlock.
            match remove_dir(parent, None, &frame, &mut done) {
                Ok(true) => return Ok(done),
                Ok(false) => {
                    stack.push(relist(frame)?);
                    continue;
                }
                Err(e) => return Err(e),
            }
        };
        if parent_frame.fd.is_none() {
            // Reopened below: every frame from here up is open again. The
            // new descriptor starts at the first entry; what was already
            // removed is no longer listed.
            first_open = first_open.min(depth.saturating_sub(1)).max(1);
            let child_fd = frame.fd.as_ref().expect("popped frames are open");
            let (pfd, _) = open_dir_checked(
                child_fd.as_fd(),
                c"..",
                parent_frame.dev,
                mnt,
                Some(parent_frame.ino),
            )?;
            parent_frame.fd = Some(pfd);
        }
        let pfd = parent_frame.fd.as_ref().expect("reopened above");
        if !remove_dir(pfd.as_fd(), Some(pfd.as_fd()), &frame, &mut done)? {
            stack.push(relist(frame)?);
        }
    }
}

/// Removes a listed directory from its parent: `Ok(false)` when entries
/// arrived since it was listed. `unlockable` is the parent when its flags
/// may be cleared (a directory of the volume's tree).
fn remove_dir(
    parent: BorrowedFd<'_>,
    unlockable: Option<BorrowedFd<'_>>,
    frame: &Frame,
    done: &mut Removed,
) -> io::Result<bool> {
    let fd = frame.fd.as_ref().expect("popped frames are open");
    let mut unlocked = false;
    loop {
        match sys::unlinkat(parent, &frame.name, true) {
            Ok(()) => {
                done.dirs += 1;
                return Ok(true);
            }
            Err(e) if gone(&e) => return Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => return Ok(false),
            Err(e) if e.raw_os_error() == Some(libc::EPERM) && !unlocked => {
                unlocked = true;
                let shown = frame.name.to_string_lossy();
                let mut cleared = unlock(fd.as_fd(), &shown)?;
                if let Some(p) = unlockable {
                    cleared |= unlock(p, &format_args!("the directory holding {shown}"))?;
                }
                if !cleared {
                    return Err(refused(&frame.name, e));
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => return Err(refused(&frame.name, e)),
            Err(e) => return Err(e),
        }
    }
}

/// Starts another listing pass over a directory that gained entries.
fn relist(mut frame: Frame) -> io::Result<Frame> {
    frame.passes += 1;
    if frame.passes > MAX_PASSES {
        return Err(io::Error::other(format!(
            "{} keeps gaining entries while it is deleted; stop the writers and retry",
            frame.name.to_string_lossy()
        )));
    }
    sys::rewind_dir(frame.fd.as_ref().expect("popped frames are open").as_fd())?;
    frame.listed = false;
    Ok(frame)
}

/// Clears the immutable and append-only flags of an open file or directory;
/// `Ok(true)` when one was set. Every other attribute (the project ID and
/// PROJINHERIT included) is written back as it was.
fn unlock(fd: BorrowedFd<'_>, what: &dyn std::fmt::Display) -> io::Result<bool> {
    let mut a = sys::get_fsxattr(fd)?;
    if a.xflags & LOCK_FLAGS == 0 {
        return Ok(false);
    }
    a.xflags &= !LOCK_FLAGS;
    sys::set_fsxattr(fd, &a).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "{what} is immutable or append-only (chattr +i/+a) and the kernel refused to \
                 clear that ({e}): clearing needs CAP_LINUX_IMMUTABLE; run `chattr -R -i -a` \
                 on the volume as root, then delete it again"
            ),
        )
    })?;
    Ok(true)
}

/// Clears the flags of entry `name` of `dir` when it is on the volume's
/// device and mount. The entry is first opened with `O_PATH` and its type
/// read from that descriptor (`prjquota_core::entry_open`): only a regular
/// file or a FIFO is opened again, read-only and without blocking (a FIFO's
/// read end opens at once, and acts on nothing), through that descriptor,
/// so a device node swapped in after the listing is never opened (opening
/// a device can act on it). A device node or a socket is reached only by
/// `file_setattr(2)` (6.17+), by name.
fn unlock_entry(dir: BorrowedFd<'_>, name: &CStr, dev: u64, mnt: u64) -> io::Result<bool> {
    let opened = match open_entry(dir, name, mnt) {
        Ok(o) => o,
        Err(e) if gone(&e) => return Ok(false),
        // On another mount: not the volume's to unlock.
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => return Ok(false),
        Err(e) => return Err(e),
    };
    let st = *opened.stat();
    if st.st_dev != dev {
        return Ok(false);
    }
    match opened {
        Opened::File(fd, _) => match unlock(fd.as_fd(), &name.to_string_lossy()) {
            // Before 5.13 a FIFO's ioctls never reach the filesystem.
            Err(e)
                if st.st_mode & libc::S_IFMT == libc::S_IFIFO
                    && e.raw_os_error() == Some(libc::ENOTTY) =>
            {
                unlock_by_name(dir, name, st.st_dev, dev)
            }
            other => other,
        },
        // A directory is entered and unlocked as one; a file another
        // process holds a lease on cannot be opened now.
        Opened::Dir(..) | Opened::Unopened(..) => Ok(false),
        Opened::Other(..) => unlock_by_name(dir, name, st.st_dev, dev),
    }
}

/// Clears the flags of `name` with `file_setattr(2)`, without following a
/// link; `Ok(false)` where the kernel lacks it (before 6.17) or the file
/// cannot carry flags.
fn unlock_by_name(dir: BorrowedFd<'_>, name: &CStr, st_dev: u64, dev: u64) -> io::Result<bool> {
    if st_dev != dev {
        return Ok(false);
    }
    let mut a = match sys::file_getattr_at(dir, name) {
        Ok(a) => a,
        // EOPNOTSUPP: the filesystem keeps no attributes for this kind of
        // file (ext4's special files), so it carries no flag to clear.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EOPNOTSUPP)) || gone(&e) => {
            return Ok(false)
        }
        Err(e) => return Err(e),
    };
    if a.xflags & u64::from(LOCK_FLAGS) == 0 {
        return Ok(false);
    }
    a.xflags &= !u64::from(LOCK_FLAGS);
    sys::file_setattr_at(dir, name, &a)?;
    Ok(true)
}

/// The error for an entry the kernel still refuses to unlink.
fn refused(name: &CStr, e: io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!(
            "cannot remove {}: {e}, and it has no immutable or append-only flag left to clear \
             (an LSM policy, or a flag on the volumes directory itself?)",
            name.to_string_lossy()
        ),
    )
}

fn unlink_entry(
    dir: BorrowedFd<'_>,
    name: &CStr,
    dev: u64,
    mnt: u64,
    done: &mut Removed,
) -> io::Result<()> {
    let mut unlocked = false;
    loop {
        match sys::unlinkat(dir, name, false) {
            Ok(()) => {
                done.files += 1;
                return Ok(());
            }
            Err(e) if gone(&e) => return Ok(()),
            // It became a directory again: leave it for the next pass.
            Err(e) if e.raw_os_error() == Some(libc::EISDIR) => return Ok(()),
            // The file, or the directory holding it, is immutable or
            // append-only.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) && !unlocked => {
                unlocked = true;
                let shown = name.to_string_lossy();
                let dir_cleared = unlock(dir, &format_args!("the directory holding {shown}"))?;
                if !(unlock_entry(dir, name, dev, mnt)? || dir_cleared) {
                    return Err(refused(name, e));
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => return Err(refused(name, e)),
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;
    use std::path::PathBuf;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("prjquota-rm-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn dirfd(p: &std::path::Path) -> OwnedFd {
        fs::File::open(p).unwrap().into()
    }

    #[test]
    fn removes_a_tree_and_spares_symlink_targets() {
        let base = scratch("links");
        let outside = base.join("outside");
        fs::create_dir_all(outside.join("keepdir")).unwrap();
        fs::write(outside.join("keep"), b"precious").unwrap();
        let vol = base.join("vol");
        fs::create_dir_all(vol.join("a/b/c")).unwrap();
        fs::write(vol.join("a/b/c/f"), b"x").unwrap();
        symlink(outside.join("keep"), vol.join("a/file-link")).unwrap();
        symlink(&outside, vol.join("a/b/dir-link")).unwrap();
        symlink("/", vol.join("root-link")).unwrap();
        let fd = dirfd(&base);
        let r = remove_tree(fd.as_fd(), c"vol").unwrap();
        assert!(!vol.exists());
        assert_eq!(fs::read(outside.join("keep")).unwrap(), b"precious");
        assert!(outside.join("keepdir").is_dir());
        assert_eq!(r.dirs, 4);
        assert_eq!(r.files, 4);
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_root_that_is_a_symlink_is_unlinked_not_followed() {
        let base = scratch("rootlink");
        fs::create_dir_all(base.join("target")).unwrap();
        fs::write(base.join("target/keep"), b"x").unwrap();
        symlink(base.join("target"), base.join("vol")).unwrap();
        let fd = dirfd(&base);
        remove_tree(fd.as_fd(), c"vol").unwrap();
        assert!(fs::symlink_metadata(base.join("vol")).is_err());
        assert!(base.join("target/keep").exists());
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn absent_is_success_and_fifos_are_removed() {
        let base = scratch("fifo");
        let fd = dirfd(&base);
        assert_eq!(
            remove_tree(fd.as_fd(), c"nope").unwrap(),
            Removed::default()
        );
        fs::create_dir(base.join("vol")).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(base.join("vol/fifo"))
            .status()
            .unwrap();
        assert!(made.success());
        remove_tree(fd.as_fd(), c"vol").unwrap();
        assert!(!base.join("vol").exists());
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn deep_trees_stay_within_the_descriptor_budget() {
        let base = scratch("deep");
        // 3 × MAX_OPEN levels forces closing and reopening through "..".
        let mut p = base.join("vol");
        for _ in 0..(3 * MAX_OPEN) {
            p.push("d");
        }
        fs::create_dir_all(&p).unwrap();
        fs::write(p.join("leaf"), b"x").unwrap();
        let fd = dirfd(&base);
        let r = remove_tree(fd.as_fd(), c"vol").unwrap();
        assert_eq!(r.dirs as usize, 3 * MAX_OPEN + 1);
        assert_eq!(r.files, 1);
        assert!(!base.join("vol").exists());
        fs::remove_dir_all(&base).unwrap();
    }
}
