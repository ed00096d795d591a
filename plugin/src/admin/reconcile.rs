//! `prjquota reconcile [--nomad] [--fix]`: do the records, the
//! directories and the kernel's quota state agree, and (`--nomad`) does
//! Nomad know every volume?
//!
//! Every disagreement is reported. `--fix` repairs only what loses nothing:
//! limits and project tags are re-applied, limits of an unused orphan
//! project are cleared, a missing volume root is recreated, stale temp and
//! lock files are removed. Directories are never deleted: an orphaned
//! directory is reported for the operator to look at. Running it twice
//! reports clean the second time.
//!
//! With `--nomad`, the volumes Nomad does not know (`nomad volume delete
//! -force`, a node that left the cluster) are reported too, and `--fix`
//! deletes them as Nomad's own delete would: through the plugin's delete
//! path, so only `<volumes dir>/<volume ID>`, its record and its quota go.
//! Nomad is asked through the node's prjquota-exporter, which holds the
//! Nomad client and its token (`prjquota_core::announce::nomad_volumes`):
//! the plugin Nomad runs for every volume stays free of an HTTP and TLS
//! stack. Only a volume Nomad's list lacks, whose own endpoint answers 404
//! and that no namespace or node has is called unknown, and only one
//! written more than [`NOMAD_GRACE`] ago is deleted.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::AsFd;

use anyhow::{Context, Result};
use serde::Serialize;

use super::Flags;
use crate::contract::{DeleteRequest, VolumeId};
use crate::fs::VolumesFs;
use crate::ops::{self, load_config, Undo};
use crate::quota_control::Control;
use crate::registry::{self, Durable, Entry, Record, Registry, State, DIR_NAME};
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

    if flags.nomad {
        out.extend(compare_with_nomad(&reg, flags)?);
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

/// How long after its record was last written a volume Nomad does not
/// know is taken for one Nomad forgot: Nomad's server records a new
/// volume only once the plugin's create returned (the client's call may
/// take a minute, and the server waits up to two for its turn), so a
/// younger one may be a create Nomad has not recorded yet.
pub const NOMAD_GRACE: std::time::Duration = std::time::Duration::from_secs(600);

/// How long the exporter may take to ask Nomad.
const NOMAD_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// The volumes Nomad does not know, or why Nomad could not be asked.
fn compare_with_nomad(reg: &Registry, flags: &Flags) -> Result<Vec<Finding>> {
    use prjquota_core::announce::{nomad_volumes, Verdict};
    let dir = flags.volumes_dir();
    let not_asked = |why: String| {
        vec![finding(
            "nomad-not-asked",
            "Nomad",
            format!("cannot compare with Nomad's list: {why}"),
        )]
    };
    let answer = match nomad_volumes(&dir, NOMAD_WAIT) {
        Ok(Some(a)) => a,
        Ok(None) => {
            return Ok(not_asked(
                "no prjquota-exporter listens for this volumes directory; start it with \
                 --nomad.addr and a token that may read host volumes (docs/nomad.md)"
                    .into(),
            ))
        }
        Err(e) => return Ok(not_asked(e.to_string())),
    };
    let now = registry::now_unix();
    let mut out = Vec::new();
    for v in answer.volumes {
        if v.verdict == Verdict::Listed {
            continue;
        }
        let Ok(id) = VolumeId::parse(&v.volume_id) else {
            continue;
        };
        // Gone meanwhile, or not Ready (reported above): not Nomad's to say.
        let Some(rec) = reg.load(&id)?.filter(|r| r.state == State::Ready) else {
            continue;
        };
        let subject = format!("volume {id} ({}/{})", rec.namespace, rec.volume_name);
        if v.verdict == Verdict::Elsewhere {
            out.push(finding(
                "elsewhere-in-nomad",
                subject,
                format!(
                    "{} (asked {}): look at it with `nomad volume status -type host {id}` before \
                     anything else",
                    v.detail, answer.nomad_addr
                ),
            ));
            continue;
        }
        let age = now.saturating_sub(rec.created_unix.max(rec.updated_unix));
        let mut f = finding(
            "unknown-to-nomad",
            subject,
            format!(
                "Nomad ({}) does not know it: {}; its directory {}, record and project {} are \
                 still here",
                answer.nomad_addr,
                v.detail,
                rec.path.display(),
                rec.project_id
            ),
        );
        if age < NOMAD_GRACE.as_secs() {
            f.detail.push_str(&format!(
                "; its record was written {age}s ago, which may be a create Nomad has not \
                 recorded yet: run reconcile again in {} minutes",
                NOMAD_GRACE.as_secs() / 60
            ));
            out.push(f);
            continue;
        }
        out.push(repairable(
            f,
            "delete it as `nomad volume delete` would: its directory (with its data), record and project quota",
            flags.fix,
            || {
                ops::delete(&DeleteRequest {
                    volumes_dir: dir.clone(),
                    plugin_dir: flags.plugin_dir.clone(),
                    node_pool: rec.node_pool.clone(),
                    created_path: Some(rec.path.clone()),
                    namespace: rec.namespace.clone(),
                    volume_name: rec.volume_name.clone(),
                    volume_id: rec.volume_id.clone(),
                    node_id: rec.node_id.clone(),
                    parameters: rec.parameters.clone(),
                })
            },
        ));
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
