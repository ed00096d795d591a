//! Admission and project-ID choice for a create or grow, at a cost that
//! does not grow with the number of volumes.
//!
//! The rule itself is [`capacity::Admit::admit`]: the volumes together
//! are never promised more than `overcommit_ratio × (filesystem size − bytes
//! used outside volumes)`. Its inputs are kept or bounded so that the usual
//! create reads O(1) of them:
//!
//! - the size promised and the next free project ID come from the
//!   [`Ledger`], through a [`Book`] held under the allocation lock;
//! - the bytes used outside volumes are at most all the bytes in use, so a
//!   request that fits with every used byte counted as outside fits the
//!   rule, and is admitted on one statfs. Only a request that does not fit
//!   that bound pays the exact measure: one quota pass over the volumes'
//!   project IDs, as every create did before, which also checks the
//!   ledger's sum against the records.

use std::collections::BTreeSet;

use anyhow::{anyhow, bail, Result};

use crate::capacity::{self, Admit, Holdings};
use crate::contract::VolumeId;
use crate::diag::log;
use crate::fs::VolumesFs;
use crate::ledger::Ledger;
use crate::quota_control::Control;
use crate::registry::{self, Lock, Registry};
use prjquota_core::config::Config;
use prjquota_core::project_ids;
use prjquota_core::sys;

/// The registry's promises and reservations as one operation sees and
/// changes them, under the allocation lock.
///
/// An operation that changes a promise or a reservation calls
/// [`Book::begin`] before its first change and [`Book::commit`] after its
/// last; one that fails in between returns without committing, and the
/// next operation rebuilds the ledger from the records.
#[derive(Debug)]
pub(crate) struct Book<'r> {
    reg: &'r Registry,
    ledger: Ledger,
}

impl<'r> Book<'r> {
    /// The book, from the ledger or, when there is none to trust, from
    /// every record and reservation (once: the operation's commit writes
    /// it back). `_alloc` is the allocation lock, held for as long as the
    /// book is.
    pub fn open(reg: &'r Registry, _alloc: &Lock) -> Result<Book<'r>> {
        let ledger = match reg.read_ledger() {
            Some(l) => l,
            None => rebuild(reg)?,
        };
        Ok(Book { reg, ledger })
    }

    /// The book only when the ledger can be read: for the end of a delete
    /// or a rollback, which leave a missing ledger to the next create
    /// rather than read every record themselves.
    pub fn open_kept(reg: &'r Registry, _alloc: &Lock) -> Option<Book<'r>> {
        reg.read_ledger().map(|ledger| Book { reg, ledger })
    }

    /// The sum of every record's promise.
    pub fn promised(&self) -> u64 {
        self.ledger.promised
    }

    /// Whether a reservation may lack its record, so that a create must
    /// list the reservations to find one of its own.
    pub fn may_have_orphans(&self) -> bool {
        self.ledger.orphans
    }

    /// The lowest project ID no reservation of this registry holds or
    /// exceeds, when it is in `range`.
    pub fn next_unreserved(&self, range: &std::ops::RangeInclusive<u32>) -> Option<u32> {
        self.ledger.next_unreserved(range)
    }

    /// Removes the ledger before the first change: see [`crate::ledger`].
    pub fn begin(&self) -> Result<()> {
        self.reg.drop_ledger()
    }

    /// A record now promises `bytes` with project `pid` (new, or grown
    /// from `was` bytes).
    pub fn recorded(&mut self, pid: u32, bytes: u64, was: Option<u64>) {
        self.ledger.recorded(pid, bytes, was);
    }

    /// A record promising `bytes` is gone.
    pub fn unrecorded(&mut self, bytes: u64) {
        self.ledger.unrecorded(bytes);
    }

    /// Writes the book back as the ledger, after the operation's last change.
    pub fn commit(self) -> Result<()> {
        self.reg.write_ledger(&self.ledger)
    }

    /// [`Book::commit`] at the end of an operation whose changes are made
    /// and durable: a ledger that cannot be written is rebuilt from the
    /// records by the next create, so the failure is only logged.
    pub fn commit_or_log(self, id: &VolumeId) {
        if let Err(e) = self.commit() {
            log(
                id,
                format_args!("{e:#}: the next create rebuilds it from the records"),
            );
        }
    }

    /// Takes the records' exact sum after a full measure found the ledger's
    /// wrong (a ledger written by hand, or a bug: never trusted twice).
    fn correct(&mut self, id: &VolumeId, promised: u64) -> Result<()> {
        if self.ledger.promised != promised {
            log(
                id,
                format_args!(
                    "the registry's ledger counted {} bytes promised but the records say {}: the records' figure is used and the ledger rewritten",
                    self.ledger.promised, promised
                ),
            );
            self.ledger.promised = promised;
            // Until a commit writes the right figure, no create may read
            // the wrong one.
            self.reg.drop_ledger()?;
        }
        Ok(())
    }
}

/// The ledger the records and reservations make: one read of each.
fn rebuild(reg: &Registry) -> Result<Ledger> {
    let mut l = Ledger::default();
    let mut recorded = BTreeSet::new();
    for rec in records(reg)? {
        l.promised = l.promised.saturating_add(rec.provisioned_bytes);
        l.volumes += 1;
        l.above = l.above.max(u64::from(rec.project_id) + 1);
        recorded.insert((rec.project_id, rec.volume_id.clone()));
    }
    for (pid, vid) in reg.reservations()? {
        l.above = l.above.max(u64::from(pid) + 1);
        l.orphans |= !recorded.contains(&(pid, vid));
    }
    Ok(l)
}

/// Every record. One that cannot be read is an error: its promise cannot
/// be counted, and leaving it out could overcommit.
fn records(reg: &Registry) -> Result<Vec<registry::Record>> {
    reg.load_all()?
        .into_iter()
        .map(|entry| match entry {
            registry::Entry::Record(rec) => Ok(*rec),
            registry::Entry::Corrupt { file, error } => Err(anyhow!(
                "cannot count the size promised to the volume of {}/{file} ({error}), so no \
                 volume can be admitted: run `prjquota reconcile` to see what it is, then \
                 repair or remove that record",
                reg.path().display()
            )),
        })
        .collect()
}

/// Admits `requested` bytes for volume `id`, whose record (if any) promises
/// `held` bytes today, or says why not. Under the allocation lock.
pub(crate) fn admit(
    vfs: &VolumesFs,
    book: &mut Book,
    cfg: &Config,
    id: &VolumeId,
    requested: u64,
    held: u64,
) -> Result<()> {
    let (fs_bytes, used) = fs_size_and_use(vfs)?;
    let bound = Holdings {
        fs_bytes,
        used_outside: used,
        promised: book.promised().saturating_sub(held),
        ratio: cfg.overcommit_ratio,
    };
    if bound.admit(id.as_str(), requested).is_ok() {
        return Ok(());
    }
    let (promised, ids) = promised_by_records(book.reg)?;
    book.correct(id, promised)?;
    measure_holdings(
        vfs,
        promised.saturating_sub(held),
        ids,
        cfg.overcommit_ratio,
    )?
    .admit(id.as_str(), requested)
    .map_err(|e| anyhow!("{e}"))
}

fn fs_size_and_use(vfs: &VolumesFs) -> Result<(u64, u64)> {
    let sfs =
        sys::fstatfs(vfs.fd()).map_err(|e| anyhow!("cannot statfs {}: {e}", vfs.path.display()))?;
    let frsize = sfs.f_frsize as u64;
    let used = (sfs.f_blocks as u64)
        .saturating_sub(sfs.f_bfree as u64)
        .saturating_mul(frsize);
    Ok(((sfs.f_blocks as u64).saturating_mul(frsize), used))
}

/// The filesystem's size and the bytes used outside the volumes with
/// project IDs `ids`, now; with `promised` and `ratio`, the admission rule's
/// inputs. `prjquota check` and `list` report the same figures.
pub fn measure_holdings(
    vfs: &VolumesFs,
    promised: u64,
    ids: BTreeSet<u32>,
    ratio: f64,
) -> Result<Holdings> {
    let usage = volumes_usage(vfs, ids)?;
    let sfs =
        sys::fstatfs(vfs.fd()).map_err(|e| anyhow!("cannot statfs {}: {e}", vfs.path.display()))?;
    Ok(capacity::Holdings::from_statfs(
        sfs.f_frsize as u64,
        sfs.f_blocks as u64,
        sfs.f_bfree as u64,
        usage,
        promised,
        ratio,
    ))
}

/// The sum of every record's size, and their project IDs.
fn promised_by_records(reg: &Registry) -> Result<(u64, BTreeSet<u32>)> {
    let recs = records(reg)?;
    let promised = recs
        .iter()
        .map(|r| r.provisioned_bytes)
        .fold(0u64, u64::saturating_add);
    Ok((promised, recs.iter().map(|r| r.project_id).collect()))
}

/// Bytes the kernel counts to the volumes' projects, in one quota pass over
/// the range their IDs span (IDs in between that no record names are other
/// tools' projects: their files are outside volumes).
fn volumes_usage(vfs: &VolumesFs, ids: BTreeSet<u32>) -> Result<u64> {
    let (Some(&lo), Some(&hi)) = (ids.first(), ids.last()) else {
        return Ok(0);
    };
    Ok(Control::of(vfs)
        .list(lo..=hi)?
        .iter()
        .filter(|q| ids.contains(&q.id))
        .map(|q| q.used_bytes)
        .fold(0u64, u64::saturating_add))
}

/// Chooses a project ID that no volume has reserved and the kernel reports
/// no usage, inodes or limits for. Called under the allocation lock.
///
/// From the book's next unreserved ID, each candidate costs one quota read,
/// and a candidate is skipped only when the kernel knows it (another
/// volumes directory's claim, another tool's project, IDs squatted before
/// the guard refused them), so the usual choice is one read, and the most
/// [`project_ids::STEPS`] + [`project_ids::PROBES`]: past a few steps the
/// candidates are random above the reservations. Only when none of those
/// is free, or the IDs above every reservation ran out, is the lowest free
/// one found as before the ledger: one listing of the reservations and one
/// quota pass over the range.
pub(crate) fn choose_project_id(vfs: &VolumesFs, book: &Book, cfg: &Config) -> Result<u32> {
    let range = cfg.project_id_min..=cfg.project_id_max;
    if let Some(start) = book.next_unreserved(&range) {
        // Nothing at or above the book's next ID is reserved here.
        let control = Control::of(vfs);
        if let Some(pid) = project_ids::bounded_free_from(
            &range,
            start,
            |_| false,
            |p| control.get(p),
            project_ids::seed(),
        )? {
            return Ok(pid);
        }
    }
    lowest_free(vfs, &book.reg.reservations()?, cfg)
}

/// The lowest ID of the configured range that no reservation and no kernel
/// quota holds.
fn lowest_free(vfs: &VolumesFs, reservations: &[(u32, VolumeId)], cfg: &Config) -> Result<u32> {
    let range = cfg.project_id_min..=cfg.project_id_max;
    let taken: BTreeSet<u32> = reservations.iter().map(|(p, _)| *p).collect();
    let kernel = Control::of(vfs).list(range.clone())?;
    match project_ids::lowest_free(&range, taken, &kernel) {
        Some(pid) => Ok(pid),
        None => bail!(
            "no free project ID left in {}..={} on {} ({} in use): widen project_id_min/project_id_max in {}, or delete volumes",
            cfg.project_id_min,
            cfg.project_id_max,
            vfs.describe(),
            reservations
                .iter()
                .map(|(p, _)| *p)
                .chain(kernel.iter().filter(|q| !q.is_unused()).map(|q| q.id))
                .collect::<BTreeSet<u32>>()
                .len(),
            cfg.source
                .as_ref()
                .map_or_else(|| "prjquota.toml".to_string(), |p| p.display().to_string())
        ),
    }
}
