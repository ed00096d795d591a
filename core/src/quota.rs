//! Project quotas as callers want them: limits in bytes and inodes, usage,
//! and the project ID of a directory. One code path serves XFS and ext4; the
//! few places where the two kernels differ are handled here and commented.
//!
//! Units: the XFS-style `Q_XSETQLIM` is used to set limits because it takes an
//! explicit field mask (nothing but limits is ever written, so ext4's usage
//! counters cannot be overwritten) and 512-byte granularity. Reads use the
//! generic `Q_GETQUOTA`/`Q_GETNEXTQUOTA`, which report space in bytes.

use std::io;
use std::os::fd::BorrowedFd;

use crate::sys;

/// Limits of one project. Zero means "no limit", as in the kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    pub bytes_hard: u64,
    pub bytes_soft: u64,
    pub inodes_hard: u64,
    pub inodes_soft: u64,
}

impl Limits {
    pub const NONE: Limits = Limits {
        bytes_hard: 0,
        bytes_soft: 0,
        inodes_hard: 0,
        inodes_soft: 0,
    };

    pub fn is_none(&self) -> bool {
        *self == Self::NONE
    }
}

/// Usage and limits of one project as the kernel reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProjectQuota {
    pub id: u32,
    pub used_bytes: u64,
    pub used_inodes: u64,
    pub limits: Limits,
}

impl ProjectQuota {
    /// True when the kernel holds nothing for this project: no usage and no
    /// limits. Only such an ID may be handed to a new volume.
    pub fn is_unused(&self) -> bool {
        self.used_bytes == 0 && self.used_inodes == 0 && self.limits.is_none()
    }
}

/// Whether project quotas are usable on a filesystem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    /// Accounted and enforced: limits hold.
    Enforced,
    /// Accounted only (XFS `pqnoenforce`): usage is tracked, limits are not.
    AccountingOnly,
    /// The filesystem is mounted without project quota.
    Off,
}

/// Reads the project-quota state of the filesystem holding `fd`.
pub fn support(fd: BorrowedFd<'_>) -> io::Result<Support> {
    match sys::quota_stat_flags(fd) {
        Ok(flags) => {
            let acct = flags & sys::FS_QUOTA_PDQ_ACCT != 0;
            let enfd = flags & sys::FS_QUOTA_PDQ_ENFD != 0;
            Ok(match (acct, enfd) {
                (true, true) => Support::Enforced,
                (true, false) => Support::AccountingOnly,
                _ => Support::Off,
            })
        }
        // ENOSYS: no quota on this mount at all; ESRCH/EINVAL: quota is on but
        // not for projects (e.g. ext4 with only usrquota).
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOSYS | libc::ESRCH | libc::EINVAL)
            ) =>
        {
            Ok(Support::Off)
        }
        Err(e) => Err(e),
    }
}

/// 512-byte basic blocks as bytes, rounded up to whole KiB.
fn kib_grain(basic_blocks: u64) -> u64 {
    basic_blocks
        .saturating_mul(512)
        .div_ceil(1024)
        .saturating_mul(1024)
}

/// 512-byte basic blocks, rounded up so a limit is never below what was asked.
fn to_basic_blocks(bytes: u64) -> u64 {
    bytes.div_ceil(512)
}

/// Sets all four limits of project `id` in one call.
///
/// Soft and hard are always sent together: XFS silently keeps the old limits
/// when a new hard limit is below the existing soft one. Project 0 is refused:
/// on XFS its limits become the default limits of every project.
pub fn set_limits(fd: BorrowedFd<'_>, id: u32, limits: &Limits) -> io::Result<()> {
    if id == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "refusing to set limits on project 0 (XFS makes them every project's default)",
        ));
    }
    let q = sys::FsDiskQuota {
        version: sys::FS_DQUOT_VERSION,
        flags: sys::FS_PROJ_QUOTA,
        fieldmask: sys::FS_DQ_BHARD | sys::FS_DQ_BSOFT | sys::FS_DQ_IHARD | sys::FS_DQ_ISOFT,
        id,
        blk_hardlimit: to_basic_blocks(limits.bytes_hard),
        blk_softlimit: to_basic_blocks(limits.bytes_soft),
        ino_hardlimit: limits.inodes_hard,
        ino_softlimit: limits.inodes_soft,
        ..Default::default()
    };
    sys::set_project_limits(fd, &q)
}

fn from_dqblk(q: &sys::IfNextDqblk) -> ProjectQuota {
    ProjectQuota {
        id: q.id,
        used_bytes: q.curspace,
        used_inodes: q.curinodes,
        limits: Limits {
            bytes_hard: q.bhardlimit.saturating_mul(1024),
            bytes_soft: q.bsoftlimit.saturating_mul(1024),
            inodes_hard: q.ihardlimit,
            inodes_soft: q.isoftlimit,
        },
    }
}

/// Usage and limits of project `id`. A project the kernel knows nothing
/// about reads as all zeros on both filesystems (XFS says ENOENT, ext4 zeros).
///
/// On a read-only mount the kernel refuses `Q_GETQUOTA` through
/// `quotactl_fd` with EROFS (it counts the command as a write); the
/// XFS-style `Q_XGETQUOTA`, which it does not, answers instead, in 512-byte
/// blocks.
pub fn get(fd: BorrowedFd<'_>, id: u32) -> io::Result<ProjectQuota> {
    let unknown = || ProjectQuota {
        id,
        ..Default::default()
    };
    match sys::get_project_dqblk(fd, id) {
        Ok(q) => Ok(from_dqblk(&q)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(unknown()),
        Err(e) if e.raw_os_error() == Some(libc::EROFS) => match sys::get_project_quota(fd, id) {
            Ok(q) => Ok(from_fs_disk_quota(&q, id)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(unknown()),
            Err(_) => Err(e),
        },
        Err(e) => Err(e),
    }
}

/// An XFS-style reading (512-byte blocks) as the generic interface gives
/// it: limits in whole KiB, as `Q_GETQUOTA` reports them.
fn from_fs_disk_quota(q: &sys::FsDiskQuota, id: u32) -> ProjectQuota {
    ProjectQuota {
        id,
        used_bytes: q.bcount.saturating_mul(512),
        used_inodes: q.icount,
        limits: Limits {
            bytes_hard: kib_grain(q.blk_hardlimit),
            bytes_soft: kib_grain(q.blk_softlimit),
            inodes_hard: q.ino_hardlimit,
            inodes_soft: q.ino_softlimit,
        },
    }
}

/// Every project with a dquot whose ID lies in `range`, in ID order, in one
/// pass (`Q_GETNEXTQUOTA`) instead of one call per volume. On a read-only
/// mount, where the kernel refuses that command with EROFS (it counts it as
/// a write), the XFS-style `Q_XGETNEXTQUOTA` makes the pass instead; if that
/// fails too, the EROFS is the error.
pub fn list(
    fd: BorrowedFd<'_>,
    range: std::ops::RangeInclusive<u32>,
) -> io::Result<Vec<ProjectQuota>> {
    match list_with(range.clone(), |id| {
        sys::get_next_project_dqblk(fd, id).map(|q| from_dqblk(&q))
    }) {
        // ext4 suspends its quotas while read-only (ESRCH): the read-only
        // mount is then the error that names the cause.
        Err(e) if e.raw_os_error() == Some(libc::EROFS) => list_with(range, |id| {
            sys::get_next_project_quota(fd, id).map(|q| from_fs_disk_quota(&q, q.id))
        })
        .map_err(|_| e),
        other => other,
    }
}

/// The pass of [`list`] over `next(id)`: the first dquot at or after `id`.
fn list_with(
    range: std::ops::RangeInclusive<u32>,
    next: impl Fn(u32) -> io::Result<ProjectQuota>,
) -> io::Result<Vec<ProjectQuota>> {
    let mut out = Vec::new();
    let mut id = *range.start();
    loop {
        match next(id) {
            Ok(q) => {
                if q.id > *range.end() {
                    break;
                }
                out.push(q);
                match q.id.checked_add(1) {
                    Some(n) => id = n,
                    None => break,
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Project ID and whether `PROJINHERIT` is set, for an open file or directory.
pub fn project_of(fd: BorrowedFd<'_>) -> io::Result<(u32, bool)> {
    let a = sys::get_fsxattr(fd)?;
    Ok((a.projid, a.xflags & sys::FS_XFLAG_PROJINHERIT != 0))
}

/// Puts an (empty or freshly made) directory into project `id` and makes new
/// entries inherit it. Other attribute bits are kept as they are.
pub fn tag(fd: BorrowedFd<'_>, id: u32) -> io::Result<()> {
    let mut a = sys::get_fsxattr(fd)?;
    if a.projid == id && a.xflags & sys::FS_XFLAG_PROJINHERIT != 0 {
        return Ok(());
    }
    a.projid = id;
    a.xflags |= sys::FS_XFLAG_PROJINHERIT;
    sys::set_fsxattr(fd, &a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_blocks_round_up() {
        assert_eq!(to_basic_blocks(0), 0);
        assert_eq!(to_basic_blocks(1), 1);
        assert_eq!(to_basic_blocks(512), 1);
        assert_eq!(to_basic_blocks(513), 2);
        assert_eq!(to_basic_blocks(u64::MAX), u64::MAX / 512 + 1);
    }

    #[test]
    fn unused_means_no_usage_and_no_limits() {
        let mut q = ProjectQuota::default();
        assert!(q.is_unused());
        q.limits.inodes_hard = 1;
        assert!(!q.is_unused());
        q.limits = Limits::NONE;
        q.used_inodes = 1;
        assert!(!q.is_unused());
    }

    #[test]
    fn a_list_pass_stops_past_the_range_and_at_the_last_dquot() {
        let held = [3u32, 5, 9, u32::MAX];
        let next = |id: u32| {
            held.iter()
                .find(|&&h| h >= id)
                .map(|&h| ProjectQuota {
                    id: h,
                    ..Default::default()
                })
                .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
        };
        let ids = |r: std::ops::RangeInclusive<u32>| -> Vec<u32> {
            list_with(r, next).unwrap().iter().map(|q| q.id).collect()
        };
        assert_eq!(ids(1..=8), [3, 5]);
        assert_eq!(ids(5..=9), [5, 9]);
        assert_eq!(ids(10..=20), Vec::<u32>::new());
        assert_eq!(ids(9..=u32::MAX), [9, u32::MAX]);
        let eio = list_with(1..=8, |_| Err(io::Error::from_raw_os_error(libc::EIO)));
        assert_eq!(eio.unwrap_err().raw_os_error(), Some(libc::EIO));
    }

    #[test]
    fn project_zero_is_refused_before_any_syscall() {
        use std::os::fd::AsFd;
        // Any descriptor will do: the guard returns before the syscall.
        let root = std::fs::File::open("/").unwrap();
        let err = set_limits(root.as_fd(), 0, &Limits::NONE).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
}
