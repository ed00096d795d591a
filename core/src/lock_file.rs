//! Lock files: an exclusive `flock` on a regular file of root's, held for
//! as long as the [`LockFile`] lives (or the process, however it ends).
//! The one helper behind the plugin's registry locks (a volume's, the
//! allocation lock, beside the volumes) and the host-wide locks in
//! `/run/prjquota` (`run_dir`) that the plugin and the exporter share.
//!
//! A lock file is opened without following a symlink and refused unless it
//! is a regular file of root's: one someone else made would guard nothing.
//! Once the lock is granted the name is looked up again: a holder that
//! unlinked the file (a delete forgets its volume's lock) may have let a
//! new file take the name, which this lock would not exclude, so the take
//! starts over.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::sys;

/// An exclusive `flock` held until dropped.
#[derive(Debug)]
pub struct LockFile {
    _fd: OwnedFd,
}

/// How long [`LockFile::take`] waits for a lock another process holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Not at all: the lock is free, or `None`.
    No,
    /// At most this long, then an error of kind `TimedOut` that says so.
    AtMost(Duration),
    /// As long as the holder holds it.
    Forever,
}

impl LockFile {
    /// Takes the exclusive lock on `dir/name`, creating the file (0600).
    /// `Ok(None)` only with [`Wait::No`], when another holds it.
    pub fn take(dir: BorrowedFd<'_>, name: &str, wait: Wait) -> io::Result<Option<LockFile>> {
        let n = CString::new(name).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a lock file's name holds a NUL: {name:?}"),
            )
        })?;
        let deadline = match wait {
            Wait::AtMost(d) => Some(Instant::now() + d),
            _ => None,
        };
        loop {
            let fd = open(dir, &n, name)?;
            let held = sys::fstat(fd.as_fd())?;
            match wait {
                Wait::Forever => sys::flock(fd.as_fd(), true)?,
                Wait::No => {
                    if !sys::try_flock(fd.as_fd(), true)? {
                        return Ok(None);
                    }
                }
                Wait::AtMost(d) => {
                    let mut pause = Duration::from_millis(1);
                    while !sys::try_flock(fd.as_fd(), true)? {
                        if deadline.is_some_and(|t| Instant::now() >= t) {
                            return Err(io::Error::new(
                                io::ErrorKind::TimedOut,
                                format!(
                                    "waited {}s for the lock {name}: another prjquota run holds \
                                     it (a create or delete of the same volume, or one that is \
                                     stuck on the filesystem); try again once it has finished",
                                    d.as_secs()
                                ),
                            ));
                        }
                        std::thread::sleep(pause);
                        pause = (pause * 2).min(Duration::from_millis(20));
                    }
                }
            }
            match sys::fstatat_nofollow(dir, &n) {
                Ok(now) if now.st_ino == held.st_ino && now.st_dev == held.st_dev => {
                    return Ok(Some(LockFile { _fd: fd }))
                }
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// [`LockFile::take`] waiting at most `wait`.
    pub fn take_within(dir: BorrowedFd<'_>, name: &str, wait: Duration) -> io::Result<LockFile> {
        Self::take(dir, name, Wait::AtMost(wait))
            .map(|l| l.expect("a waiting take gives the lock or an error"))
    }
}

/// Opens (creating) the lock file, refusing one that is not a regular file
/// of root's.
fn open(dir: BorrowedFd<'_>, n: &CString, name: &str) -> io::Result<OwnedFd> {
    let fd = match sys::openat(
        dir,
        n,
        libc::O_RDWR | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_NONBLOCK,
        0o600,
    ) {
        // A read-only filesystem (ext4 after errors=remount-ro, a
        // remount,ro) refuses O_RDWR even on an existing file, though a
        // restore of an unchanged volume writes nothing. flock needs no
        // write access, so an existing lock file is opened read-only and
        // excludes other runs as well; a missing one cannot be made, and
        // the filesystem's error stands. Whatever the holder then tries to
        // write fails with EROFS and names it.
        Err(e) if e.raw_os_error() == Some(libc::EROFS) => sys::openat(
            dir,
            n,
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
            0,
        )
        .map_err(|_| e)?,
        r => r?,
    };
    let st = sys::fstat(fd.as_fd())?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_uid != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the lock file {name} is not a regular file of root's (mode {:o}, uid {}): \
                 something other than prjquota made it; remove it",
                st.st_mode, st.st_uid
            ),
        ));
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> (std::path::PathBuf, OwnedFd) {
        let dir =
            std::env::temp_dir().join(format!("prjquota-lockfile-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let fd = std::fs::File::open(&dir).unwrap().into();
        (dir, fd)
    }

    #[test]
    fn a_held_lock_is_not_taken_twice_and_is_free_once_dropped() {
        let (dir, fd) = scratch("held");
        let held = LockFile::take(fd.as_fd(), "a.lock", Wait::No).unwrap();
        assert!(held.is_some());
        // flock locks belong to the open file description: a second open
        // conflicts even in this process, as another process would.
        assert!(LockFile::take(fd.as_fd(), "a.lock", Wait::No)
            .unwrap()
            .is_none());
        let start = Instant::now();
        let err =
            LockFile::take_within(fd.as_fd(), "a.lock", Duration::from_millis(200)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(
            err.to_string().contains("another prjquota run holds it"),
            "{err}"
        );
        assert!(start.elapsed() < Duration::from_secs(5));
        drop(held);
        assert!(LockFile::take(fd.as_fd(), "a.lock", Wait::No)
            .unwrap()
            .is_some());
        LockFile::take(fd.as_fd(), "a.lock", Wait::Forever).unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_lock_file_that_is_not_a_regular_file_is_refused() {
        let (dir, fd) = scratch("link");
        std::os::unix::fs::symlink("/etc/passwd", dir.join("l.lock")).unwrap();
        std::fs::create_dir(dir.join("d.lock")).unwrap();
        for name in ["l.lock", "d.lock"] {
            let err = LockFile::take(fd.as_fd(), name, Wait::No).unwrap_err();
            assert!(
                err.raw_os_error() == Some(libc::ELOOP)
                    || err.raw_os_error() == Some(libc::EISDIR)
                    || err.to_string().contains("not a regular file"),
                "{name}: {err}"
            );
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
