//! The volume's root directory: opened without following a link or crossing
//! a mount, and given its mode and owner.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};

use crate::contract::VolumeId;
use crate::fs::VolumesFs;
use prjquota_core::sys;
use prjquota_core::volume_params::VolumeParams;

pub(crate) fn cname(id: &VolumeId) -> CString {
    CString::new(id.as_str()).expect("a validated UUID has no NUL")
}

/// Opens a volume's root directory without following a link or leaving
/// the volumes directory's mount, in one `openat2` (`RESOLVE_NO_XDEV`): a
/// mount placed on the root (a bind mount, a tmpfs) is refused, whatever
/// its device number says.
pub(crate) fn open_volume_dir(vfs: &VolumesFs, id: &VolumeId) -> io::Result<OwnedFd> {
    sys::openat_no_xdev(vfs.fd(), &cname(id), libc::O_RDONLY | libc::O_DIRECTORY).map_err(|e| {
        if e.raw_os_error() == Some(libc::EXDEV) {
            io::Error::other(
                "the volume directory is a mount point, not a directory of the volumes filesystem: \
                 unmount it, and prjquota will use or delete the directory beneath",
            )
        } else {
            e
        }
    })
}

pub(crate) fn is_empty_dir(fd: &OwnedFd) -> io::Result<bool> {
    Ok(sys::read_dir(fd.as_fd())?.is_empty())
}

/// Applies mode and owner to the volume root (never to its content).
pub(crate) fn apply_root_attrs(fd: &OwnedFd, p: &VolumeParams) -> io::Result<()> {
    let mut st = sys::fstat(fd.as_fd())?;
    if (p.uid.is_some() && p.uid != Some(st.st_uid))
        || (p.gid.is_some() && p.gid != Some(st.st_gid))
    {
        sys::fchown(
            fd.as_fd(),
            p.uid.unwrap_or(u32::MAX),
            p.gid.unwrap_or(u32::MAX),
        )?;
        // The kernel may clear setuid/setgid bits on chown.
        st = sys::fstat(fd.as_fd())?;
    }
    if st.st_mode & 0o7777 != p.mode {
        sys::fchmod(fd.as_fd(), p.mode)?;
    }
    Ok(())
}
