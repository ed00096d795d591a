//! Opening one entry of a tree a tenant writes (a volume, an allocation)
//! without acting on what it has not seen.
//!
//! Between a listing (`getdents`, whose `d_type` is a hint) or an
//! `fstatat` and an `open`, the entry's owner can swap the name for a
//! device node (`renameat2(RENAME_EXCHANGE)`; root in a container has
//! `CAP_MKNOD`), and opening a device runs its driver: opening a watchdog
//! arms it. So an entry is first opened with `O_PATH | O_NOFOLLOW`, which
//! reaches the inode (a symlink's own) and never a driver; its type and
//! mount are read from that descriptor, and only a directory, a regular
//! file or a FIFO on the tree's own mount is opened again, through the
//! descriptor itself (a directory as `.` below it, a file through its
//! `/proc/self/fd` link): whatever the name holds by then, the inode opened
//! is the one that was checked.
//!
//! A mount point (a bind mount, a tmpfs) is told by its mount ID, whatever
//! the device numbers say, and reported as `EXDEV`. No `openat2(2)`: the
//! package's unit has `RestrictSUIDSGID=yes`, under which systemd answers
//! every `openat2` with `ENOSYS` (its flags cannot be inspected by
//! seccomp).

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use crate::sys;

/// What an entry turned out to be.
#[derive(Debug)]
pub enum Opened {
    /// A directory, open for reading (`O_DIRECTORY`).
    Dir(OwnedFd, libc::stat),
    /// A regular file or a FIFO, open read-only, non-blocking (a FIFO opens
    /// without a writer), never as a controlling terminal.
    File(OwnedFd, libc::stat),
    /// A regular file or a FIFO that could not be opened again (another
    /// process holds a write lease on it: `EWOULDBLOCK`), with its `O_PATH`
    /// descriptor (for a file handle, to try again later) and why.
    Unopened(OwnedFd, libc::stat, io::Error),
    /// Anything else (a symlink, a socket, a device node): looked at, never
    /// opened. Its `O_PATH` descriptor is kept for what needs no open.
    Other(OwnedFd, libc::stat),
}

impl Opened {
    pub fn stat(&self) -> &libc::stat {
        match self {
            Opened::Dir(_, st)
            | Opened::File(_, st)
            | Opened::Unopened(_, st, _)
            | Opened::Other(_, st) => st,
        }
    }
}

/// Opens `name`, an entry of `dir`, as the module says; `mount` is the
/// mount ID the tree must stay on (`EXDEV` for an entry on another).
pub fn open_entry(dir: BorrowedFd<'_>, name: &CStr, mount: u64) -> io::Result<Opened> {
    crate::fault::pause_before_open(name);
    let path = sys::openat(dir, name, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
    let (st, mnt) = sys::stat_and_mount(path.as_fd())?;
    if mnt != mount {
        return Err(io::Error::from_raw_os_error(libc::EXDEV));
    }
    match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => {
            let fd = sys::openat(
                path.as_fd(),
                c".",
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                0,
            )?;
            Ok(Opened::Dir(fd, st))
        }
        libc::S_IFREG | libc::S_IFIFO => match reopen(path.as_fd()) {
            Ok(fd) => Ok(Opened::File(fd, st)),
            Err(e) => Ok(Opened::Unopened(path, st, e)),
        },
        _ => Ok(Opened::Other(path, st)),
    }
}

/// Opens subdirectory `name` of `dir` for reading, without following a
/// symlink; `EXDEV` when it is not on `mount` (a mount point). Opening a
/// directory acts on nothing (`O_DIRECTORY` fails before any driver runs),
/// so the mount is checked after.
pub fn open_subdir(dir: BorrowedFd<'_>, name: &CStr, mount: u64) -> io::Result<OwnedFd> {
    let fd = sys::openat(
        dir,
        name,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    )?;
    if sys::mount_id(fd.as_fd())? != mount {
        return Err(io::Error::from_raw_os_error(libc::EXDEV));
    }
    Ok(fd)
}

/// Opens again, read-only, the inode an `O_PATH` descriptor holds: through
/// its magic link, which names that inode whatever became of its path.
fn reopen(path: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let link =
        CString::new(format!("/proc/self/fd/{}", path.as_raw_fd())).expect("a number has no NUL");
    sys::open(&link, libc::O_RDONLY | libc::O_NOCTTY | libc::O_NONBLOCK, 0).map_err(|e| {
        if e.raw_os_error() == Some(libc::ENOENT) {
            // /proc is not mounted where this runs: the file cannot be
            // opened safely, which is not the same as gone.
            io::Error::new(
                io::ErrorKind::Unsupported,
                "cannot reopen a checked file: /proc is not mounted here",
            )
        } else {
            e
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    fn scratch(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("prjquota-entry-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn each_kind_is_opened_only_as_far_as_it_is_safe() {
        let d = scratch("kinds");
        fs::create_dir(d.join("dir")).unwrap();
        fs::write(d.join("file"), b"x").unwrap();
        symlink("/dev/zero", d.join("link")).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(d.join("fifo"))
            .status()
            .unwrap();
        assert!(made.success());
        let dir: OwnedFd = fs::File::open(&d).unwrap().into();
        let mnt = sys::mount_id(dir.as_fd()).unwrap();
        assert!(matches!(
            open_entry(dir.as_fd(), c"dir", mnt).unwrap(),
            Opened::Dir(..)
        ));
        assert!(matches!(
            open_entry(dir.as_fd(), c"file", mnt).unwrap(),
            Opened::File(..)
        ));
        // A FIFO without a writer: opened at once, not waited on.
        assert!(matches!(
            open_entry(dir.as_fd(), c"fifo", mnt).unwrap(),
            Opened::File(..)
        ));
        // The symlink itself, never its target (a device here).
        match open_entry(dir.as_fd(), c"link", mnt).unwrap() {
            Opened::Other(_, st) => assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFLNK),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            open_entry(dir.as_fd(), c"gone", mnt).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        // Another mount's ID: every entry is refused as on another mount.
        assert_eq!(
            open_entry(dir.as_fd(), c"file", mnt + 1)
                .unwrap_err()
                .raw_os_error(),
            Some(libc::EXDEV)
        );
        assert_eq!(
            open_subdir(dir.as_fd(), c"dir", mnt + 1)
                .unwrap_err()
                .raw_os_error(),
            Some(libc::EXDEV)
        );
        assert!(open_subdir(dir.as_fd(), c"dir", mnt).is_ok());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_device_node_is_never_opened() {
        // /dev/null is opened by nothing here: its O_PATH descriptor says
        // it is a character device, and that is where it stops.
        let dev: OwnedFd = fs::File::open("/dev").unwrap().into();
        let mnt = sys::mount_id(dev.as_fd()).unwrap();
        match open_entry(dev.as_fd(), c"null", mnt) {
            Ok(Opened::Other(_, st)) => {
                assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFCHR)
            }
            other => panic!("{other:?}"),
        }
    }
}
