//! The create of a volume that has a record: a restore, the end of a
//! crashed create, or an updated spec.

use std::os::fd::AsFd;

use anyhow::{anyhow, Result};
use prjquota_core::units;

use super::converge::{converge, limits_for, limits_match, Undo};
use super::desired::{Created, Desired};
use super::pins::open_guard;
use super::volume_dir::open_volume_dir;
use crate::admission::{self, Book};
use crate::capacity;
use crate::diag::log;
use crate::fs::VolumesFs;
use crate::quota_control::Control;
use crate::registry::{Durable, Record, Registry, State};
use prjquota_core::config::Config;
use prjquota_core::sys;

/// What a create of a recorded volume must do.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum UpdatePlan {
    /// A restore with nothing changed: no write at all.
    Nothing,
    /// Bring the kernel and the record to the request; `resize_from` is the
    /// size in force when the limit changes on a Ready volume.
    Converge { resize_from: Option<u64> },
}

/// The decision of [`update`], given whether the kernel and the directory
/// already match the request (`kernel_ok`).
pub(crate) fn plan_update(rec: &Record, want: &Desired, kernel_ok: bool) -> UpdatePlan {
    if kernel_ok && want.recorded_in(rec) {
        return UpdatePlan::Nothing;
    }
    let resize_from = (rec.state == State::Ready && rec.provisioned_bytes != want.bytes)
        .then_some(rec.provisioned_bytes);
    UpdatePlan::Converge { resize_from }
}

/// A create for a volume that has a record: restore, finish a crashed
/// create, or apply an updated spec.
pub(crate) fn update(
    vfs: &VolumesFs,
    reg: &Registry,
    cfg: &Config,
    mut rec: Record,
    want: &Desired,
) -> Result<Created> {
    let (id, params, bytes) = (&want.req.volume_id, &want.params, want.bytes);
    let path = vfs.path.join(id.as_str());
    let pid = rec.project_id;

    // Refuse a shrink below what is stored before changing anything.
    if want.shrinks(&rec) {
        let used = Control::of(vfs).get(pid)?;
        capacity::check_fits(
            id.as_str(),
            bytes,
            used.used_bytes,
            params.max_inodes,
            used.used_inodes,
        )
        .map_err(|e| anyhow!("{e}"))?;
    }

    let kernel_ok = rec.state == State::Ready
        && reg.is_reserved(pid, id)
        && (vfs.quota_suspended_read_only()
            || Control::of(vfs)
                .get(pid)
                .map(|q| limits_match(&q.limits, &limits_for(bytes, params)))
                .unwrap_or(false))
        && match open_volume_dir(vfs, id) {
            Ok(fd) => {
                Control::of(vfs)
                    .project_of(fd.as_fd())
                    .is_ok_and(|(p, inherit)| p == pid && inherit)
                    && sys::fstat(fd.as_fd()).is_ok_and(|st| {
                        st.st_mode & 0o7777 == params.mode
                            && params.uid.is_none_or(|u| u == st.st_uid)
                            && params.gid.is_none_or(|g| g == st.st_gid)
                    })
            }
            Err(_) => false,
        };
    match plan_update(&rec, want, kernel_ok) {
        UpdatePlan::Nothing => {
            return Ok(Created {
                path,
                bytes: want.nomad_bytes,
            })
        }
        UpdatePlan::Converge {
            resize_from: Some(from),
        } => log(
            id,
            format_args!(
                "resizing from {} to {}",
                units::human(from),
                units::human(bytes)
            ),
        ),
        UpdatePlan::Converge { resize_from: None } => {}
    }
    let mut undo = Undo::default();
    reg.follow_journal_of(vfs);
    // Held until the grown limit is recorded, so that concurrent grows and
    // creates each count the others' promises.
    let alloc = reg.lock_allocation()?;
    let held = rec.provisioned_bytes;
    let mut book = if bytes != held {
        Some(Book::open(reg, &alloc)?)
    } else {
        None
    };
    if let Some(b) = &mut book {
        // Only a grow is checked: a restore or shrink already holds its
        // promise.
        if bytes > held {
            admission::admit(vfs, b, cfg, id, bytes, held)?;
        }
        b.begin()?;
    }
    // Volumes recorded before reservations existed, or after a repair: the
    // recorded ID, which the ledger already counts.
    reg.reserve_id(pid, id, Durable::ByNextSync)?;
    converge(
        vfs,
        id,
        pid,
        params,
        bytes,
        open_guard(vfs, &cfg.guard_pin_root)?.as_ref(),
        false,
        &mut undo,
    )?;
    want.apply_to(&mut rec, path.clone(), vfs.fstype.name());
    match book {
        Some(mut b) => {
            reg.store(&rec, Durable::Now)?;
            b.recorded(pid, bytes, Some(held));
            b.commit_or_log(id);
        }
        None => reg.store_keeping_ledger(&rec, Durable::Now)?,
    }
    Ok(Created {
        path,
        bytes: want.nomad_bytes,
    })
}
