//! The create of a volume that has no record: admission, a project ID
//! claimed on the kernel, the record, the root; and the rollback of a
//! create that failed.

use std::io;
use std::os::fd::AsFd;

use anyhow::{bail, Context, Result};
use prjquota_core::guard_contract::{kernel_dev, PinnedGuard};

use super::converge::{converge, limits_for, Undo};
use super::desired::{Created, Desired};
use super::pins::open_guard;
use super::reservations::release_other_reservations;
use super::volume_dir::{cname, is_empty_dir, open_volume_dir};
use crate::admission::{self, Book};
use crate::contract::VolumeId;
use crate::diag::log;
use crate::fault;
use crate::fs::VolumesFs;
use crate::quota_control::Control;
use crate::registry::{self, Durable, Registry, State};
use prjquota_core::config::Config;
use prjquota_core::quota::Limits;
use prjquota_core::sys;

/// Chooses a project ID for a new volume and claims it on the kernel by
/// setting its limits, before any record of it exists.
///
/// Project IDs belong to the filesystem, but a registry belongs to one
/// volumes directory, and another directory on the same filesystem (a
/// second Nomad agent, or a node whose `host_volumes_dir` moved) sees none
/// of its reservations. What every directory does see is the kernel: the
/// allocator skips IDs the kernel has usage or limits for. So the ID is
/// chosen and its limits set under a lock shared by every volumes directory
/// of the filesystem on this host (see [`registry::lock_filesystem`]), and
/// from then on no other directory can choose it, whether or not this
/// create gets further. The claim comes before the reservation, so a crash
/// between the two can leave a limit on an unused ID (the ID stays out of
/// use; `prjquota reconcile --fix` clears it) but never a reserved ID that
/// another directory may take.
fn allocate_and_claim(
    vfs: &VolumesFs,
    book: &Book,
    cfg: &Config,
    id: &VolumeId,
    limits: &Limits,
    guard: Option<&PinnedGuard>,
) -> Result<u32> {
    let _fs = match registry::lock_filesystem(vfs.dev) {
        Ok(lock) => Some(lock),
        // Without it, only a race of two directories' creates within the
        // same instant can pick one ID; the claim still covers creates that
        // stopped, or run one after the other.
        Err(e) => {
            log(
                id,
                format_args!(
                    "cannot take the filesystem-wide allocation lock in {} ({e}): project IDs are claimed without it",
                    registry::RUN_DIR
                ),
            );
            None
        }
    };
    let pid = admission::choose_project_id(vfs, book, cfg)?;
    // Into the guard before the claim: the ID is predictable (the next
    // free one), and until the guard knows it, a file outside the volumes
    // may be given it by its owner and charge the new volume.
    if let (Some(g), Some(dev)) = (guard, kernel_dev(vfs.dev)) {
        g.register_project(dev, pid, true)?;
    }
    fault::point("create:project-guarded");
    Control::of(vfs).set_limits(pid, limits)?;
    Ok(pid)
}

pub(crate) fn create_new(
    vfs: &VolumesFs,
    reg: &Registry,
    cfg: &Config,
    want: &Desired,
) -> Result<Created> {
    let (id, params, bytes) = (&want.req.volume_id, &want.params, want.bytes);
    let path = vfs.path.join(id.as_str());
    // A directory may already stand where the volume goes: adopt it when the
    // kernel state says it is ours (the registry was lost), use it when it is
    // empty, refuse otherwise. Its content is never touched.
    let mut adopt: Option<u32> = None;
    let mut dir_existed = false;
    match sys::fstatat_nofollow(vfs.fd(), &cname(id)) {
        Ok(st) if st.st_mode & libc::S_IFMT != libc::S_IFDIR => bail!(
            "{} exists and is not a directory (a symlink or a file): prjquota will neither use nor remove it; move it away and create the volume again",
            path.display()
        ),
        Ok(_) => {
            dir_existed = true;
            let fd = open_volume_dir(vfs, id)
                .with_context(|| format!("cannot open the existing {}", path.display()))?;
            let (projid, _) = Control::of(vfs)
                .project_of(fd.as_fd())
                .with_context(|| format!("cannot read the project ID of {}", path.display()))?;
            let claimed = reg
                .reservations()?
                .iter()
                .any(|(p, owner)| *p == projid && owner != id);
            if projid != 0 && (cfg.project_id_min..=cfg.project_id_max).contains(&projid) && !claimed {
                log(id, format_args!("adopting the existing directory {} with project ID {projid} (no record was found)", path.display()));
                adopt = Some(projid);
            } else if !is_empty_dir(&fd)? {
                bail!(
                    "{} already exists with content but prjquota has no record of it (project ID {projid}): it was not made by this plugin on this filesystem; move it away, or run `prjquota reconcile` to see what is on this node",
                    path.display()
                );
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot inspect {}", path.display())),
    }

    // Opened once, before anything is made: the ID and then the root go
    // into the same maps, and pins that cannot be used refuse the create
    // while there is nothing to roll back.
    let guard = open_guard(vfs, &cfg.guard_pin_root)?;
    reg.follow_journal_of(vfs);
    let mut claimed = false;
    let project_id = {
        let alloc = reg.lock_allocation()?;
        let mut book = Book::open(reg, &alloc)?;
        // A create killed after reserving, before recording, left its
        // reservation: take it back rather than leak the ID. Only then may
        // a reservation lack its record, and only then are they listed
        // (once: reservations are only made under the allocation lock).
        let reservations = if book.may_have_orphans() {
            reg.reservations()?
        } else {
            Vec::new()
        };
        let own = reservations
            .iter()
            .find(|(_, owner)| owner == id)
            .map(|(p, _)| *p);
        // An adopted directory is a volume that already held its promise
        // before the registry was lost: like a restore, never refused.
        if adopt.is_none() {
            admission::admit(vfs, &mut book, cfg, id, bytes, 0)?;
        }
        book.begin()?;
        let pid = match (adopt, own) {
            (Some(p), _) | (None, Some(p)) => p,
            (None, None) => {
                let p = allocate_and_claim(
                    vfs,
                    &book,
                    cfg,
                    id,
                    &limits_for(bytes, params),
                    guard.as_ref(),
                )?;
                claimed = true;
                p
            }
        };
        let unclaim = || {
            if claimed {
                let _ = Control::of(vfs).clear_limits(pid);
            }
        };
        // An adopted directory brings its own ID: a reservation an earlier,
        // crashed create made for this volume is another one, which nothing
        // would ever release.
        if let Err(e) = release_other_reservations(vfs, reg, &reservations, id, Some(pid)) {
            unclaim();
            return Err(e);
        }
        // Both made durable by the `ready` record's write at the end, or by
        // the `creating` record's own temp file fsync (the reservation).
        if let Err(e) = reg.reserve_id(pid, id, Durable::ByNextSync) {
            unclaim();
            return Err(e);
        }
        fault::point("create:reserved");
        if let Err(e) = reg.store(&want.record(vfs, pid), Durable::ByNextSync) {
            let _ = reg.release_id(pid, id);
            unclaim();
            return Err(e);
        }
        fault::point("create:stored");
        book.recorded(pid, bytes, None);
        book.commit_or_log(id);
        pid
    };
    fault::point("create:recorded");

    let mut undo = Undo {
        record: true,
        limits: claimed,
        ..Undo::default()
    };
    let result = converge(
        vfs,
        id,
        project_id,
        params,
        bytes,
        guard.as_ref(),
        true,
        &mut undo,
    )
    .and_then(|()| {
        let mut rec = want.record(vfs, project_id);
        rec.state = State::Ready;
        let _alloc = reg.lock_allocation()?;
        reg.store_keeping_ledger(&rec, Durable::Now)
    });
    match result {
        Ok(()) => Ok(Created { path, bytes }),
        Err(e) => {
            if dir_existed {
                undo.dir = false;
            }
            rollback(vfs, reg, guard.as_ref(), id, project_id, bytes, &undo);
            Err(e)
        }
    }
}

/// Undoes what a failed first create made. Best effort: each failure is
/// logged, and the record stays if the directory could not be removed, so
/// the next create or delete still knows the volume.
fn rollback(
    vfs: &VolumesFs,
    reg: &Registry,
    guard: Option<&PinnedGuard>,
    id: &VolumeId,
    project_id: u32,
    bytes: u64,
    undo: &Undo,
) {
    let mut keep_record = false;
    // The guard the create put the root into: only then is there a key.
    if let (Some(key), Some(g)) = (&undo.guarded, guard) {
        if let Err(e) = g
            .unregister_root(key)
            .and_then(|_| g.forget_project(key.dev, project_id))
        {
            log(id, format_args!("rollback: {e}"));
        }
    }
    if undo.dir {
        // Only an empty directory made by this call: never content.
        if let Err(e) = sys::unlinkat(vfs.fd(), &cname(id), true) {
            if e.kind() != io::ErrorKind::NotFound {
                log(
                    id,
                    format_args!("rollback: cannot remove the new directory: {e}"),
                );
                keep_record = true;
            }
        }
    }
    if undo.limits {
        if let Err(e) = Control::of(vfs).clear_limits(project_id) {
            log(
                id,
                format_args!("rollback: cannot clear the limits of project {project_id}: {e}"),
            );
        }
    }
    if undo.record && !keep_record {
        // Under the allocation lock, as every change to a promise: the
        // record stays if the lock cannot be had, for the next call.
        let alloc = match reg.lock_allocation() {
            Ok(l) => l,
            Err(e) => return log(id, format_args!("rollback: the record is kept: {e:#}")),
        };
        let book = Book::open_kept(reg, &alloc);
        if let Some(Err(e)) = book.as_ref().map(Book::begin) {
            return log(id, format_args!("rollback: the record is kept: {e:#}"));
        }
        match reg.remove(id) {
            Ok(()) => {
                if let Err(e) = reg.release_id(project_id, id) {
                    log(
                        id,
                        format_args!("rollback: cannot release project ID {project_id}: {e:#}"),
                    );
                } else if let Some(mut b) = book {
                    b.unrecorded(bytes);
                    b.commit_or_log(id);
                }
            }
            Err(e) => log(
                id,
                format_args!("rollback: cannot remove the record: {e:#}"),
            ),
        }
    }
}
