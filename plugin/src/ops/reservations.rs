//! Project-ID reservations a crashed create left behind.

use anyhow::Result;

use crate::contract::VolumeId;
use crate::diag::log;
use crate::fs::VolumesFs;
use crate::quota_control::Control;
use crate::registry::Registry;

/// Releases every project ID reserved for volume `id` but `keep`, clearing
/// the limits of each one the kernel charges nothing to (a claim made before
/// a crash); an ID that still has usage keeps its limits, so it stays out of
/// use. Called under the volume's lock, which every reservation for `id` is
/// made under.
pub(crate) fn release_other_reservations(
    vfs: &VolumesFs,
    reg: &Registry,
    reservations: &[(u32, VolumeId)],
    id: &VolumeId,
    keep: Option<u32>,
) -> Result<()> {
    for &(pid, ref owner) in reservations {
        if owner != id || Some(pid) == keep {
            continue;
        }
        // Best effort: a limit left on an unused ID only keeps that ID out
        // of use, and `prjquota reconcile` reports it.
        match Control::of(vfs).get(pid) {
            Ok(q) if q.used_bytes == 0 && q.used_inodes == 0 && !q.limits.is_none() => {
                if let Err(e) = Control::of(vfs).clear_limits(pid) {
                    log(
                        id,
                        format_args!("cannot clear the limits of project {pid}: {e}"),
                    );
                }
            }
            Ok(_) => {}
            Err(e) => log(
                id,
                format_args!("cannot read the quota of project {pid}: {e}"),
            ),
        }
        reg.release_id(pid, id)?;
        log(
            id,
            format_args!("released project ID {pid}, reserved by a create that did not finish"),
        );
    }
    Ok(())
}
