//! `delete`, as Nomad runs it.

use std::io;
use std::os::fd::AsFd;

use anyhow::{Context, Result};
use prjquota_core::guard_contract::{kernel_dev, RootKey};

use super::pins::open_guard;
use super::reservations::release_other_reservations;
use super::volume_dir::{cname, open_volume_dir};
use crate::admission::Book;
use crate::contract::DeleteRequest;
use crate::diag::log;
use crate::fault;
use crate::fs::VolumesFs;
use crate::quota_control::Control;
use crate::registry::{self, Durable, Registry, State};
use crate::remove;
use prjquota_core::quota::{self, Support};
use prjquota_core::sys;

/// The project's usage once the filesystem has finished freeing what was
/// just unlinked. XFS (5.15+) inactivates unlinked inodes in the background,
/// so a quota read right after a delete can still count them; statfs on XFS
/// flushes that work, so the read after it is mostly settled, and short
/// waits, doubling up to 25 ms (half a second in all), cover what is still
/// in flight.
fn settled_usage(vfs: &VolumesFs, pid: u32) -> Result<quota::ProjectQuota> {
    let read = || Control::of(vfs).get(pid);
    let mut q = read()?;
    let mut pause = std::time::Duration::from_millis(1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
    while !q.is_unused() && std::time::Instant::now() < deadline {
        let _ = sys::fstatfs(vfs.fd());
        q = read()?;
        if q.is_unused() {
            break;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(std::time::Duration::from_millis(25));
    }
    Ok(q)
}

/// `delete`. Succeeds when the volume is already gone. Only
/// `<volumes dir>/<volume ID>` of a recorded volume is ever removed;
/// `DHV_CREATED_PATH` is compared and logged, never deleted.
pub fn delete(req: &DeleteRequest) -> Result<()> {
    let id = &req.volume_id;
    match std::fs::symlink_metadata(&req.volumes_dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            log(
                id,
                format_args!(
                    "{} does not exist: nothing to delete",
                    req.volumes_dir.display()
                ),
            );
            return Ok(());
        }
        _ => {}
    }
    let vfs = VolumesFs::open(&req.volumes_dir, false)?;
    let Some(reg) = Registry::open(vfs.fd(), &vfs.path, false)? else {
        log(
            id,
            "no prjquota registry in the volumes directory: nothing to delete",
        );
        return Ok(());
    };
    reg.follow_journal_of(&vfs);
    let _lock = reg.lock_volume(id)?;
    let path = vfs.path.join(id.as_str());
    let Some(mut rec) = reg.load(id)? else {
        let alloc = reg.lock_allocation()?;
        if Book::open_kept(&reg, &alloc).is_none_or(|b| b.may_have_orphans()) {
            release_other_reservations(&vfs, &reg, &reg.reservations()?, id, None)?;
        }
        if sys::fstatat_nofollow(vfs.fd(), &cname(id)).is_ok() {
            log(id, format_args!("{} exists but prjquota has no record of it: left in place (see `prjquota reconcile`)", path.display()));
        } else {
            log(id, "already deleted");
        }
        return Ok(());
    };
    if let Some(cp) = &req.created_path {
        if cp != &rec.path {
            log(id, format_args!("DHV_CREATED_PATH {} is not the recorded path {}: deleting only the recorded volume", cp.display(), rec.path.display()));
        }
    }

    if rec.state != State::Deleting {
        rec.state = State::Deleting;
        rec.updated_unix = registry::now_unix();
        // The mark goes to the journal before the first unlink of the tree;
        // the record's removal at the end syncs both.
        let _alloc = reg.lock_allocation()?;
        reg.store_keeping_ledger(&rec, Durable::ByNextSync)?;
    }
    fault::point("delete:marked");

    // The root leaves the guard only once its tree is gone: until then the
    // owner's files are still the volume's, and a project change on one
    // (through a descriptor kept open) is refused to the end. The entry
    // cannot outlive its inode by matching another: a reused inode number
    // comes with a new generation. A delete that stops in between leaves
    // the entry to the exporter's sync.
    let guard = open_guard(
        &vfs,
        &super::pins::pin_root_for_delete(req.plugin_dir.as_deref()),
    )?;
    let root_key = match &guard {
        Some(_) => match open_volume_dir(&vfs, id) {
            Ok(fd) => Some(
                RootKey::of(fd.as_fd())
                    .with_context(|| format!("cannot read the inode of {}", path.display()))?,
            ),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).with_context(|| format!("cannot open {}", path.display())),
        },
        None => None,
    };

    let removed = remove::remove_tree(vfs.fd(), &cname(id))
        .with_context(|| format!("cannot remove {}", path.display()))?;
    fault::point("delete:removed");
    if let (Some(g), Some(key)) = (&guard, &root_key) {
        g.unregister_root(key)?;
    }
    fault::point("delete:unguarded");

    let pid = rec.project_id;
    match vfs.quota_support() {
        Ok(Support::Enforced | Support::AccountingOnly) => {
            Control::of(&vfs).clear_limits(pid)?;
            let left = settled_usage(&vfs, pid)?;
            if !left.is_unused() {
                log(id, format_args!("project {pid} still charges {} bytes and {} inodes after the delete (files moved out of the volume, or still open): the ID stays out of use until they are gone", left.used_bytes, left.used_inodes));
            }
        }
        _ => log(
            id,
            format_args!(
                "project quota is off on {}: the limits of project {pid} could not be cleared",
                vfs.describe()
            ),
        ),
    }
    fault::point("delete:unlimited");

    {
        // Under the allocation lock: the promise leaves the ledger with the
        // record, and the ID leaves the guard before any create can take it.
        let alloc = reg.lock_allocation()?;
        let book = Book::open_kept(&reg, &alloc);
        if let Some(b) = &book {
            b.begin()?;
        }
        reg.remove(id)?;
        fault::point("delete:unrecorded");
        reg.release_id(pid, id)?;
        if let (Some(g), Some(dev)) = (&guard, kernel_dev(vfs.dev)) {
            g.forget_project(dev, pid)?;
        }
        // Reservations a crashed create left beside the recorded ID.
        if book.as_ref().is_none_or(|b| b.may_have_orphans()) {
            release_other_reservations(&vfs, &reg, &reg.reservations()?, id, None)?;
        }
        if let Some(mut b) = book {
            b.unrecorded(rec.provisioned_bytes);
            b.commit_or_log(id);
        }
    }
    reg.forget_lock(id)?;
    log(
        id,
        format_args!(
            "deleted {} ({} files, {} directories)",
            path.display(),
            removed.files,
            removed.dirs
        ),
    );
    Ok(())
}
