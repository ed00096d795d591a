//! The project quotas of one volumes filesystem, as every command of the
//! plugin touches them (create, update, delete, grow, and check, list and
//! reconcile): core's quota calls on the filesystem's descriptor, each
//! refusal said to the operator with the filesystem and the fix. Whether
//! the filesystem has project quota at all is `VolumesFs`'s to say
//! (`quota_support`, `require_enforced_quota`).

use std::io;
use std::ops::RangeInclusive;
use std::os::fd::BorrowedFd;

use anyhow::{anyhow, Result};
use prjquota_core::fs_type::FsType;
use prjquota_core::quota::{self, Limits, ProjectQuota};

use crate::fs::VolumesFs;

/// The kernel refused a quota call for want of CAP_SYS_ADMIN (EPERM): what
/// a caller that reports rather than fails looks for.
#[derive(Debug, thiserror::Error)]
#[error("the kernel refused to {what} on {fs}: quota changes need CAP_SYS_ADMIN; run the Nomad client agent as root")]
pub(crate) struct NotPermitted {
    what: String,
    fs: String,
}

/// A handle on the volumes filesystem's project quotas.
#[derive(Clone, Copy)]
pub(crate) struct Control<'a> {
    vfs: &'a VolumesFs,
}

impl<'a> Control<'a> {
    pub fn of(vfs: &'a VolumesFs) -> Control<'a> {
        Control { vfs }
    }

    /// A project's usage and limits (all zero for one the kernel does not
    /// know).
    pub fn get(&self, pid: u32) -> Result<ProjectQuota> {
        quota::get(self.vfs.fd(), pid)
            .map_err(|e| self.refused(e, format_args!("read the quota of project {pid}")))
    }

    pub fn set_limits(&self, pid: u32, limits: &Limits) -> Result<()> {
        quota::set_limits(self.vfs.fd(), pid, limits)
            .map_err(|e| self.refused(e, format_args!("set the limits of project {pid}")))
    }

    pub fn clear_limits(&self, pid: u32) -> Result<()> {
        quota::set_limits(self.vfs.fd(), pid, &Limits::NONE)
            .map_err(|e| self.refused(e, format_args!("clear the limits of project {pid}")))
    }

    /// Every project in `ids` the kernel has a quota for, in one pass.
    pub fn list(&self, ids: RangeInclusive<u32>) -> Result<Vec<ProjectQuota>> {
        let what = format!(
            "list the quotas of projects {}..={}",
            ids.start(),
            ids.end()
        );
        quota::list(self.vfs.fd(), ids).map_err(|e| self.refused(e, what))
    }

    /// The project of the directory `dir` and whether it passes it on
    /// (PROJINHERIT).
    pub fn project_of(&self, dir: BorrowedFd<'_>) -> Result<(u32, bool)> {
        quota::project_of(dir).map_err(|e| {
            anyhow::Error::new(e).context(format!(
                "cannot read the project of a directory on {}",
                self.vfs.describe()
            ))
        })
    }

    /// Puts the directory `dir` into project `pid`, with PROJINHERIT.
    pub fn tag(&self, dir: BorrowedFd<'_>, pid: u32) -> Result<()> {
        quota::tag(dir, pid).map_err(|e| self.tag_refused(e, pid))
    }

    fn refused(&self, e: io::Error, what: impl std::fmt::Display) -> anyhow::Error {
        if e.raw_os_error() == Some(libc::EPERM) {
            anyhow::Error::new(NotPermitted {
                what: what.to_string(),
                fs: self.vfs.describe(),
            })
        } else {
            anyhow::Error::new(e).context(format!("cannot {what} on {}", self.vfs.describe()))
        }
    }

    fn tag_refused(&self, e: io::Error, id: u32) -> anyhow::Error {
        let vfs = self.vfs;
        match (e.raw_os_error(), vfs.fstype) {
            (Some(libc::EINVAL), FsType::Xfs) if id > 65535 => anyhow!(
                "XFS refused project ID {id} on {}: the filesystem lacks projid32bit (an old v4 XFS); set project_id_max = 65535 and a matching project_id_min in prjquota.toml, or recreate the filesystem with mkfs.xfs defaults",
                vfs.describe()
            ),
            (Some(libc::EOPNOTSUPP), FsType::Ext4) => anyhow!(
                "ext4 refused project ID {id} on {}: the filesystem lacks the project feature or has 128-byte inodes; run `tune2fs -O project,quota` on it while unmounted (inodes must be 256 bytes: mkfs.ext4 -I 256)",
                vfs.describe()
            ),
            _ => anyhow::Error::new(e)
                .context(format!("cannot set project ID {id} on the volume directory")),
        }
    }
}
