//! What a refusal of the kernel's quota interface means, said to the
//! operator with its fix.

use std::io;

use anyhow::anyhow;
use prjquota_core::fs_type::FsType;

use crate::fs::VolumesFs;

/// Explains a failure to tag a directory with a project ID.
pub(crate) fn tag_error(e: io::Error, vfs: &VolumesFs, id: u32) -> anyhow::Error {
    match (e.raw_os_error(), vfs.fstype) {
        (Some(libc::EINVAL), FsType::Xfs) if id > 65535 => anyhow!(
            "XFS refused project ID {id} on {}: the filesystem lacks projid32bit (an old v4 XFS); set project_id_max = 65535 and a matching project_id_min in prjquota.toml, or recreate the filesystem with mkfs.xfs defaults",
            vfs.describe()
        ),
        (Some(libc::EOPNOTSUPP), FsType::Ext4) => anyhow!(
            "ext4 refused project ID {id} on {}: the filesystem lacks the project feature or has 128-byte inodes; run `tune2fs -O project,quota` on it while unmounted (inodes must be 256 bytes: mkfs.ext4 -I 256)",
            vfs.describe()
        ),
        _ => anyhow::Error::new(e).context(format!("cannot set project ID {id} on the volume directory")),
    }
}

pub(crate) fn quota_error(e: io::Error, what: &str, id: u32, vfs: &VolumesFs) -> anyhow::Error {
    if e.raw_os_error() == Some(libc::EPERM) {
        anyhow!(
            "the kernel refused to {what} project {id} on {}: quota changes need CAP_SYS_ADMIN; run the Nomad client agent as root",
            vfs.describe()
        )
    } else {
        anyhow::Error::new(e).context(format!("cannot {what} project {id} on {}", vfs.describe()))
    }
}
