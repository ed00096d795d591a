//! `/run/prjquota`: where locks that every prjquota process on the host
//! must see live (not on a volumes filesystem, which two bind mounts may
//! show as two directories).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::lock_file::{LockFile, Wait};
use crate::sys;

pub const RUN_DIR: &str = "/run/prjquota";

/// Opens [`RUN_DIR`], creating it (0700) when missing. Refuses one that
/// someone other than root could have made or can write: a lock it holds
/// would guard nothing.
pub fn open() -> io::Result<OwnedFd> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(RUN_DIR) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let dir = sys::open(
        c"/run/prjquota",
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    )?;
    check_root_only(dir.as_fd(), &RUN_DIR)?;
    Ok(dir)
}

/// Refuses a directory of locks that someone other than root could have
/// made or can write.
pub fn check_root_only(dir: BorrowedFd<'_>, what: &dyn std::fmt::Display) -> io::Result<()> {
    let st = sys::fstat(dir)?;
    if st.st_uid != 0 || st.st_mode & 0o022 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{what} must be root's and writable by root only (uid {}, mode {:o}): fix its owner and mode, or remove it",
                st.st_uid,
                st.st_mode & 0o7777
            ),
        ));
    }
    Ok(())
}

/// Takes the exclusive lock `name` in [`RUN_DIR`] without waiting, for as
/// long as the returned lock lives; `None` when another process holds it.
pub fn try_lock(name: &str) -> io::Result<Option<LockFile>> {
    LockFile::take(open()?.as_fd(), name, Wait::No)
}

/// Takes the exclusive lock `name` in [`RUN_DIR`], waiting for it, for as
/// long as the returned lock lives.
pub fn lock(name: &str) -> io::Result<LockFile> {
    LockFile::take(open()?.as_fd(), name, Wait::Forever)
        .map(|l| l.expect("a waiting take gives the lock or an error"))
}

/// [`lock`], waiting at most `wait`.
pub fn lock_within(name: &str, wait: std::time::Duration) -> io::Result<LockFile> {
    LockFile::take_within(open()?.as_fd(), name, wait)
}
