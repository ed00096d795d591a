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
//!   the walk stops with an error rather than unlink in an unknown place.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::sys;

/// Descriptors kept open at once during a walk.
const MAX_OPEN: usize = 64;
/// Listing passes over one directory before giving up on a writer that keeps
/// filling it.
const MAX_PASSES: usize = 8;

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
    /// Subdirectories still to descend into.
    pending: Vec<CString>,
    passes: usize,
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
    let mut stack = vec![Frame {
        fd: Some(fd),
        dev,
        ino,
        name: name.to_owned(),
        pending: Vec::new(),
        passes: 0,
    }];
    scan(stack.last_mut().expect("just pushed"), &mut done)?;
    let mut first_open = 1;

    loop {
        let top = stack.last_mut().expect("stack is never empty here");
        if let Some(child) = top.pending.pop() {
            let fd = top.fd.as_ref().expect("the top frame is open");
            match open_dir_checked(fd.as_fd(), &child, dev, mnt, None) {
                Ok((cfd, cino)) => {
                    let mut frame = Frame {
                        fd: Some(cfd),
                        dev,
                        ino: cino,
                        name: child,
                        pending: Vec::new(),
                        passes: 0,
                    };
                    scan(&mut frame, &mut done)?;
                    stack.push(frame);
                    // Bound the open descriptors: close the oldest one still
                    // open above the root frame. Frames from `first_open` up
                    // are open; those below it (but the root) are closed.
                    if stack.len() - first_open > MAX_OPEN {
                        stack[first_open].fd = None;
                        first_open += 1;
                    }
                }
                Err(e) if gone(&e) => {}
                // Replaced by a non-directory (a symlink, say) since the scan:
                // unlink the entry itself, never what it points to.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
                    unlink_entry(fd.as_fd(), &child, &mut done)?;
                }
                Err(e) => return Err(e),
            }
            continue;
        }

        // Every subdirectory of the top frame is gone: remove the frame's
        // directory from its parent, unless a writer added entries meanwhile.
        let frame = stack.pop().expect("non-empty");
        let depth = stack.len();
        let Some(parent_frame) = stack.last_mut() else {
            // The root of the walk: its parent is the caller's descriptor.
            match sys::unlinkat(parent, &frame.name, true) {
                Ok(()) => {
                    done.dirs += 1;
                    return Ok(done);
                }
                Err(e) if gone(&e) => return Ok(done),
                Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => {
                    stack.push(rescan(frame, &mut done)?);
                    continue;
                }
                Err(e) => return Err(e),
            }
        };
        if parent_frame.fd.is_none() {
            // Reopened below: every frame from here up is open again.
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
        match sys::unlinkat(pfd.as_fd(), &frame.name, true) {
            Ok(()) => done.dirs += 1,
            Err(e) if gone(&e) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => {
                stack.push(rescan(frame, &mut done)?);
            }
            Err(e) => return Err(e),
        }
    }
}

fn unlink_entry(dir: BorrowedFd<'_>, name: &CStr, done: &mut Removed) -> io::Result<()> {
    match sys::unlinkat(dir, name, false) {
        Ok(()) => {
            done.files += 1;
            Ok(())
        }
        Err(e) if gone(&e) => Ok(()),
        // It became a directory again: leave it for the next pass.
        Err(e) if e.raw_os_error() == Some(libc::EISDIR) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Lists a frame's directory: unlinks every non-directory, queues the
/// subdirectories.
fn scan(frame: &mut Frame, done: &mut Removed) -> io::Result<()> {
    frame.passes += 1;
    if frame.passes > MAX_PASSES {
        return Err(io::Error::other(format!(
            "{} keeps gaining entries while it is deleted; stop the writers and retry",
            frame.name.to_string_lossy()
        )));
    }
    let fd = frame.fd.as_ref().expect("scanned frames are open");
    for entry in sys::read_dir(fd.as_fd())? {
        let dir = match entry.d_type {
            libc::DT_DIR => true,
            libc::DT_UNKNOWN => match sys::fstatat_nofollow(fd.as_fd(), &entry.name) {
                Ok(st) => is_dir(st.st_mode),
                Err(e) if gone(&e) => continue,
                Err(e) => return Err(e),
            },
            _ => false,
        };
        if dir {
            frame.pending.push(entry.name);
        } else {
            unlink_entry(fd.as_fd(), &entry.name, done)?;
        }
    }
    Ok(())
}

fn rescan(mut frame: Frame, done: &mut Removed) -> io::Result<Frame> {
    scan(&mut frame, done)?;
    Ok(frame)
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
