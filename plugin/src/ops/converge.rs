//! Bringing the kernel and a volume's root to the wanted state, step by
//! step, for a create, an update and `reconcile --fix`.

use std::io;
use std::os::fd::AsFd;

use anyhow::{bail, Context, Result};
use prjquota_core::guard_contract::{PinnedGuard, RootKey};

use super::volume_dir::{apply_root_attrs, cname, open_volume_dir};
use crate::contract::VolumeId;
use crate::fault;
use crate::fs::VolumesFs;
use crate::quota_control::Control;
use prjquota_core::quota::Limits;
use prjquota_core::sys;
use prjquota_core::volume_params::VolumeParams;

/// The limits a volume should have.
pub(crate) fn limits_for(bytes: u64, params: &VolumeParams) -> Limits {
    Limits {
        bytes_hard: bytes,
        bytes_soft: 0,
        inodes_hard: params.max_inodes.unwrap_or(0),
        inodes_soft: 0,
    }
}

/// The kernel's answer to "are these the limits in force?". The kernel
/// reports byte limits in whole KiB (rounded up), so compare at that grain.
pub(crate) fn limits_match(have: &Limits, want: &Limits) -> bool {
    have.bytes_hard == want.bytes_hard.div_ceil(1024) * 1024
        && have.bytes_soft == want.bytes_soft.div_ceil(1024) * 1024
        && have.inodes_hard == want.inodes_hard
        && have.inodes_soft == want.inodes_soft
}

/// What this call changed, so a failed create can put things back.
#[derive(Default)]
pub(crate) struct Undo {
    pub(crate) record: bool,
    pub(crate) limits: bool,
    pub(crate) dir: bool,
    /// The root this call put into the guard.
    pub(crate) guarded: Option<RootKey>,
}

/// Brings the kernel and the directory to the wanted state, step by step;
/// each step is skipped when already done.
#[allow(clippy::too_many_arguments)]
pub(crate) fn converge(
    vfs: &VolumesFs,
    id: &VolumeId,
    project_id: u32,
    params: &VolumeParams,
    bytes: u64,
    guard: Option<&PinnedGuard>,
    fresh: bool,
    undo: &mut Undo,
) -> Result<()> {
    let want = limits_for(bytes, params);
    let have = Control::of(vfs).get(project_id)?;
    if !limits_match(&have.limits, &want) {
        Control::of(vfs).set_limits(project_id, &want)?;
        undo.limits |= have.limits.is_none();
    }
    fault::point("create:limited");

    match sys::mkdirat(vfs.fd(), &cname(id), 0o700) {
        Ok(()) => undo.dir = true,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(e)
                .with_context(|| format!("cannot create {}", vfs.path.join(id.as_str()).display()))
        }
    }
    fault::point("create:mkdir");
    let fd = open_volume_dir(vfs, id)
        .with_context(|| format!("cannot open {}", vfs.path.join(id.as_str()).display()))?;
    // Guarded and tagged while the root is still root's and 0700: from the
    // moment its owner can reach it, the kernel refuses to let it out of
    // the project, and everything made in it is charged to the project.
    if let Some(g) = guard {
        let key = RootKey::of(fd.as_fd()).with_context(|| {
            format!(
                "cannot read the inode of {}",
                vfs.path.join(id.as_str()).display()
            )
        })?;
        g.register(&key, project_id, fresh)?;
        undo.guarded = Some(key);
    }
    fault::point("create:guarded");
    if fresh && undo.dir {
        // A root made by this call, not tagged yet: nothing of the volume
        // is charged to the project. Anything is a file outside the
        // volumes given the ID before the guard knew it (or by a
        // privileged process): the volume would start with it.
        let q = Control::of(vfs).get(project_id)?;
        if q.used_bytes != 0 || q.used_inodes != 0 {
            bail!(
                "project ID {project_id} already charges {} bytes and {} inodes to files outside \
                 the volume (given that ID before the quota-escape guard knew it, or by a \
                 privileged process), so the new volume would start with them: the create is \
                 refused and the ID stays out of use; create the volume again (it gets another \
                 ID), and find the files with `xfs_quota -x -c 'report -p'` or `repquota -P`",
                q.used_bytes,
                q.used_inodes
            );
        }
    }
    Control::of(vfs).tag(fd.as_fd(), project_id)?;
    fault::point("create:tagged");
    apply_root_attrs(&fd, params).with_context(|| {
        format!(
            "cannot set mode {:o} / owner {:?}:{:?} on {}",
            params.mode,
            params.uid,
            params.gid,
            vfs.path.join(id.as_str()).display()
        )
    })?;
    fault::point("create:attrs");
    Ok(())
}
