//! `prjquota reconcile [--fix]`: do the records, the directories and the
//! kernel's quota state agree?
//!
//! Every disagreement is reported. `--fix` repairs only what loses nothing:
//! limits and project tags are re-applied, limits of an unused orphan
//! project are cleared, a missing volume root is recreated, stale temp and
//! lock files are removed. Directories are never deleted: an orphaned
//! directory is reported for the operator to look at. Running it twice
//! reports clean the second time.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::AsFd;

use anyhow::{Context, Result};
use serde::Serialize;

use super::Flags;
use crate::contract::VolumeId;
use crate::fs::VolumesFs;
use crate::ops::{self, load_config, Undo};
use crate::quota_control::Control;
use crate::registry::{Durable, Entry, Record, Registry, State, DIR_NAME};
use prjquota_core::sys;

/// One disagreement, and what `--fix` did about it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Finding {
    pub kind: &'static str,
    pub subject: String,
    pub detail: String,
    /// `None`: report only. `Some(done)`: what was (or, without `--fix`,
    /// would be) repaired.
    pub fix: Option<String>,
    pub fixed: bool,
}

fn finding(kind: &'static str, subject: impl Into<String>, detail: impl Into<String>) -> Finding {
    Finding {
        kind,
        subject: subject.into(),
        detail: detail.into(),
        fix: None,
        fixed: false,
    }
}

/// Applies `repair` when fixing; records the outcome in the finding.
fn repairable(
    mut f: Finding,
    what: &str,
    fix: bool,
    repair: impl FnOnce() -> Result<()>,
) -> Finding {
    f.fix = Some(what.to_string());
    if fix {
        match repair() {
            Ok(()) => f.fixed = true,
            Err(e) => f.detail = format!("{}; the repair failed: {e:#}", f.detail),
        }
    }
    f
}

pub fn run(flags: &Flags) -> Result<Vec<Finding>> {
    let dir = flags.volumes_dir();
    if std::fs::symlink_metadata(&dir).is_err() {
        return Ok(Vec::new());
    }
    let cfg = load_config(flags.plugin_dir.as_deref())?;
    let vfs = VolumesFs::open(&dir, false)?;
    vfs.require_enforced_quota()?;
    let Some(reg) = Registry::open(vfs.fd(), &vfs.path, false)? else {
        return Ok(Vec::new());
    };
    let fix = flags.fix;
    let mut out = Vec::new();

    let mut records: BTreeMap<VolumeId, Record> = BTreeMap::new();
    for e in reg.load_all()? {
        match e {
            Entry::Record(r) => {
                records.insert(r.volume_id.clone(), *r);
            }
            Entry::Corrupt { file, error } => out.push(finding(
                "corrupt-record",
                file,
                format!("{error}; inspect or move it away by hand (it may name a live volume)"),
            )),
        }
    }

    for (id, rec) in &records {
        let _lock = reg.lock_volume(id)?;
        // Re-read under the lock: a concurrent delete may have finished.
        let Some(rec) = reg.load(id)?.filter(|r| r == rec) else {
            continue;
        };
        out.extend(check_volume(&vfs, &reg, &rec, fix, &cfg.guard_pin_root)?);
    }

    // Directories named like volumes that no record holds.
    for e in sys::read_dir(vfs.fd()).context("cannot list the volumes directory")? {
        let Ok(name) = e.name.into_string() else {
            continue;
        };
        if name == DIR_NAME {
            continue;
        }
        let Ok(id) = VolumeId::parse(&name) else {
            continue;
        };
        if records.contains_key(&id) {
            continue;
        }
        let projid = ops::open_volume_dir(&vfs, &id)
            .map_err(anyhow::Error::from)
            .and_then(|fd| Control::of(&vfs).project_of(fd.as_fd()))
            .map(|(p, _)| p.to_string())
            .unwrap_or_else(|_| "unknown".into());
        out.push(finding(
            "orphan-directory",
            vfs.path.join(&name).display().to_string(),
            format!("a volume directory (project ID {projid}) with no record: not made by prjquota here, or its record was lost; a create for volume {name} adopts it, otherwise move it away by hand (reconcile never deletes data)"),
        ));
    }

    // Projects in our range that the kernel charges or limits, with no record.
    {
        let _alloc = reg.lock_allocation()?;
        let claimed: BTreeSet<u32> = reg
            .load_all()?
            .into_iter()
            .filter_map(|e| match e {
                Entry::Record(r) => Some(r.project_id),
                Entry::Corrupt { .. } => None,
            })
            .collect();
        for q in Control::of(&vfs).list(cfg.project_id_min..=cfg.project_id_max)? {
            if q.is_unused() || claimed.contains(&q.id) {
                continue;
            }
            let f = finding(
                "orphan-project",
                format!("project {}", q.id),
                format!(
                    "no record, but {} bytes and {} inodes charged, hard limit {} bytes / {} inodes",
                    q.used_bytes, q.used_inodes, q.limits.bytes_hard, q.limits.inodes_hard
                ),
            );
            if q.used_bytes == 0 && q.used_inodes == 0 {
                out.push(repairable(f, "clear the project's limits", fix, || {
                    Control::of(&vfs).clear_limits(q.id)
                }));
            } else {
                let mut f = f;
                f.detail.push_str("; files outside any volume still carry this project ID (moved out of a deleted volume, or still open): the ID stays unused until they are gone");
                out.push(f);
            }
        }
    }

    // Project-ID reservations and records must cover each other.
    {
        let _alloc = reg.lock_allocation()?;
        // A repair changes reservations behind the ledger's back: the next
        // create rebuilds it from what the repair left.
        if fix {
            reg.drop_ledger()?;
        }
        let reservations = reg.reservations()?;
        for (pid, vid) in &reservations {
            if reg.load(vid)?.is_some_and(|r| r.project_id == *pid) {
                continue;
            }
            let f = finding(
                "stale-reservation",
                format!("project {pid}"),
                format!("reserved for volume {vid}, which has no record with that ID"),
            );
            out.push(repairable(f, "release the reservation", fix, || {
                reg.release_id(*pid, vid)
            }));
        }
        for rec in records.values() {
            if !reg.is_reserved(rec.project_id, &rec.volume_id)
                && reg.load(&rec.volume_id)?.is_some()
            {
                let f = finding(
                    "missing-reservation",
                    format!("volume {}", rec.volume_id),
                    format!("project {} is recorded but not reserved", rec.project_id),
                );
                out.push(repairable(f, "reserve the project ID", fix, || {
                    reg.reserve_id(rec.project_id, &rec.volume_id, Durable::Now)
                }));
            }
        }
    }

    for name in reg.temp_files()? {
        let f = finding(
            "stale-temp-file",
            name.clone(),
            "left by an interrupted record write",
        );
        out.push(repairable(f, "remove it", fix, || {
            reg.remove_temp_file(&name)
        }));
    }
    for id in reg.locked_ids()? {
        if records.contains_key(&id) || reg.load(&id)?.is_some() {
            continue;
        }
        let f = finding(
            "stale-lock-file",
            format!("{id}.lock"),
            "a lock file of a volume with no record",
        );
        out.push(repairable(f, "remove it", fix, || {
            let _l = reg.lock_volume(&id)?;
            if reg.load(&id)?.is_none() {
                reg.forget_lock(&id)?;
            }
            Ok(())
        }));
    }
    Ok(out)
}

/// Compares one recorded volume with its directory and the kernel.
fn check_volume(
    vfs: &VolumesFs,
    reg: &Registry,
    rec: &Record,
    fix: bool,
    pin_root: &std::path::Path,
) -> Result<Vec<Finding>> {
    let id = &rec.volume_id;
    let subject = format!("volume {id}");
    let mut out = Vec::new();
    match rec.state {
        State::Deleting => {
            out.push(finding("unfinished-delete", subject, "a delete stopped part-way; run `nomad volume delete` for it again (reconcile never deletes data)"));
            return Ok(out);
        }
        State::Creating => {
            out.push(finding("unfinished-create", subject.clone(), "a create stopped part-way; the next `nomad volume create` of it finishes it, or `nomad volume delete` removes it"));
            return Ok(out);
        }
        State::Ready => {}
    }
    let converge = || -> Result<()> {
        ops::converge(
            vfs,
            id,
            rec.project_id,
            &rec.params,
            rec.provisioned_bytes,
            ops::open_guard(vfs, pin_root)?.as_ref(),
            false,
            &mut Undo::default(),
        )
    };
    let fd = match ops::open_volume_dir(vfs, id) {
        Ok(fd) => fd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let f = finding(
                "missing-directory",
                subject,
                format!("{} is gone", rec.path.display()),
            );
            out.push(repairable(
                f,
                "recreate the empty volume root with its project and limits, as a restore would",
                fix,
                converge,
            ));
            return Ok(out);
        }
        Err(e) => {
            out.push(finding(
                "unusable-directory",
                subject,
                format!(
                    "{}: {e}; move whatever is there away by hand",
                    rec.path.display()
                ),
            ));
            return Ok(out);
        }
    };
    let (pid, inherit) = Control::of(vfs)
        .project_of(fd.as_fd())
        .with_context(|| format!("cannot read the project of {}", rec.path.display()))?;
    if pid != rec.project_id || !inherit {
        let f = finding(
            "wrong-project",
            subject.clone(),
            format!(
                "the root carries project {pid}{} but the record says {}; files made before the repair keep their project",
                if inherit { "" } else { " without PROJINHERIT" },
                rec.project_id
            ),
        );
        out.push(repairable(f, "re-tag the volume root", fix, converge));
    }
    let q = Control::of(vfs).get(rec.project_id)?;
    let want = ops::limits_for(rec.provisioned_bytes, &rec.params);
    if !ops::limits_match(&q.limits, &want) {
        let f = finding(
            "wrong-limits",
            subject,
            format!(
                "the kernel holds a hard limit of {} bytes / {} inodes, the record {} bytes / {} inodes",
                q.limits.bytes_hard, q.limits.inodes_hard, want.bytes_hard, want.inodes_hard
            ),
        );
        out.push(repairable(f, "re-apply the recorded limits", fix, converge));
    }
    let _ = reg;
    Ok(out)
}

/// Prints the findings; returns true when there were none left unrepaired.
pub fn print(findings: &[Finding], json: bool, fix: bool) -> bool {
    let clean = findings.iter().all(|f| f.fixed);
    if json {
        let v = serde_json::json!({ "clean": findings.is_empty(), "findings": findings });
        println!(
            "{}",
            serde_json::to_string_pretty(&v).expect("serialisable")
        );
        return clean;
    }
    if findings.is_empty() {
        println!("clean: records, directories and project quotas agree");
        return true;
    }
    for f in findings {
        let status = match (&f.fix, f.fixed, fix) {
            (_, true, _) => "fixed",
            (Some(_), false, false) => "fixable",
            (Some(_), false, true) => "FAILED",
            (None, _, _) => "report",
        };
        println!("[{status}] {} {}: {}", f.kind, f.subject, f.detail);
        if let (Some(what), false) = (&f.fix, f.fixed) {
            println!("    --fix would: {what}");
        }
    }
    clean
}
