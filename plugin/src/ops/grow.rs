//! `prjquota grow`: the operator raises a volume's limits while
//! allocations use it, which Nomad itself refuses ("cannot update a volume
//! in use").
//!
//! A grow is admitted like a create's grow (under the volume's lock and
//! the allocation lock, against the ledger: never more promised than the
//! disk holds), and the record is the truth of it: the grown limits go into
//! `provisioned_bytes` and `params.max_inodes`, and `grown` keeps what
//! Nomad believes. So Nomad's restore, which replays the older spec at
//! every agent start, keeps the grown limits (`ops::settled`), and
//! `reconcile --fix`, which applies the record, never undoes them.
//!
//! The steps, each safe to repeat: admitted → ledger dropped → record
//! (grown) → `grow:recorded` → kernel limits → `grow:limited` → ledger.
//! The record goes first, as a create's does: a grow killed before the
//! kernel's limits are raised leaves a record that the next restore, grow
//! or `reconcile --fix` applies. A grow that fails (not killed) puts the
//! record back.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};

use super::converge::{limits_for, limits_match};
use super::load_config;
use crate::admission::{self, Book};
use crate::capacity;
use crate::contract::VolumeId;
use crate::fault;
use crate::fs::VolumesFs;
use crate::quota_control::Control;
use crate::registry::{self, Durable, Entry, Record, Registry, State};
use prjquota_core::record::Grown;
use prjquota_core::units::{self, MAX_BYTES};
use prjquota_core::volume_params::VolumeParams;

/// Which volume: its ID, or its name in a namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeRef {
    Id(VolumeId),
    Name { name: String, namespace: String },
}

impl VolumeRef {
    /// An ID when `text` is one, else a name in `namespace`.
    pub fn parse(text: &str, namespace: &str) -> VolumeRef {
        match VolumeId::parse(text) {
            Ok(id) => VolumeRef::Id(id),
            Err(_) => VolumeRef::Name {
                name: text.to_string(),
                namespace: namespace.to_string(),
            },
        }
    }
}

/// The new size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// This size.
    To(u64),
    /// The size in force plus this.
    By(u64),
}

/// What the operator asked for.
#[derive(Debug, Clone)]
pub struct GrowRequest {
    pub volumes_dir: PathBuf,
    pub plugin_dir: Option<PathBuf>,
    pub volume: VolumeRef,
    pub size: Option<Size>,
    pub max_inodes: Option<u64>,
}

/// What a grow did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grew {
    pub volume_id: VolumeId,
    pub volume_name: String,
    pub namespace: String,
    pub from_bytes: u64,
    pub to_bytes: u64,
    pub from_max_inodes: Option<u64>,
    pub to_max_inodes: Option<u64>,
    /// What Nomad still believes.
    pub nomad_bytes: u64,
    pub nomad_max_inodes: Option<u64>,
    /// False when the record already said so (a repeated `--to`); the
    /// kernel's limits were then checked and, if a grow had stopped
    /// part-way, raised.
    pub changed: bool,
}

/// The limits a grow of `rec` leads to, or why it is refused: a grow
/// never lowers a limit, and never sets an inode limit on a volume that
/// has none (that would be a shrink).
pub(crate) fn plan(
    rec: &Record,
    size: Option<Size>,
    max_inodes: Option<u64>,
    block: u64,
) -> Result<(u64, VolumeParams)> {
    let id = &rec.volume_id;
    let now = rec.provisioned_bytes;
    let wanted = match size {
        None => now,
        Some(Size::To(n)) => n,
        Some(Size::By(n)) => now
            .checked_add(n)
            .filter(|t| *t <= MAX_BYTES)
            .ok_or_else(|| {
                anyhow!(
                    "volume {id}: {} plus {} is more than Nomad can record",
                    units::human(now),
                    units::human(n)
                )
            })?,
    };
    let bytes = capacity::round_up(wanted, block).map_err(|e| anyhow!("{e}"))?;
    if bytes < now {
        bail!(
            "volume {id} is {} ({now} bytes) already, more than the {} ({bytes} bytes) asked: \
             `prjquota grow` never shrinks a volume: give a size above its current one",
            units::human(now),
            units::human(bytes)
        );
    }
    let mut params = rec.params.clone();
    if let Some(n) = max_inodes {
        match rec.params.max_inodes {
            None => bail!(
                "volume {id} has no inode limit, so there is none to raise: --inodes would set \
                 one (a shrink); leave --inodes out"
            ),
            Some(old) if n < old => bail!(
                "volume {id} may hold {old} inodes already, more than the {n} asked: \
                 `prjquota grow` never lowers a limit; give --inodes above {old}"
            ),
            Some(_) => params.max_inodes = Some(n),
        }
    }
    Ok((bytes, params))
}

/// The volume `r` names in the registry.
fn resolve(reg: &Registry, r: &VolumeRef) -> Result<VolumeId> {
    let (name, namespace) = match r {
        VolumeRef::Id(id) => return Ok(id.clone()),
        VolumeRef::Name { name, namespace } => (name, namespace),
    };
    let mut found: Vec<VolumeId> = Vec::new();
    let mut unreadable = Vec::new();
    for e in reg.load_all()? {
        match e {
            Entry::Record(rec) if rec.volume_name == *name && rec.namespace == *namespace => {
                found.push(rec.volume_id)
            }
            Entry::Record(_) => {}
            Entry::Corrupt { file, .. } => unreadable.push(file),
        }
    }
    match found.as_slice() {
        [id] => Ok(id.clone()),
        [] => {
            let also = if unreadable.is_empty() {
                String::new()
            } else {
                format!(
                    " ({} unreadable records not searched: `prjquota reconcile` names them)",
                    unreadable.len()
                )
            };
            bail!(
                "no volume named {name:?} in namespace {namespace:?} under {}{also}: `prjquota \
                 list` shows the volumes (give --namespace for another namespace, or the \
                 volume's ID)",
                reg.path().display()
            )
        }
        many => bail!(
            "{} volumes are named {name:?} in namespace {namespace:?}: give the ID of the one \
             to grow ({})",
            many.len(),
            many.iter()
                .map(|i| i.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Raises a volume's limits in place; see the module's description.
pub fn grow(req: &GrowRequest) -> Result<Grew> {
    let cfg = load_config(req.plugin_dir.as_deref())?;
    let vfs = VolumesFs::open(&req.volumes_dir, false)?;
    vfs.require_enforced_quota()?;
    let reg = Registry::open(vfs.fd(), &vfs.path, false)?.ok_or_else(|| {
        anyhow!(
            "{} holds no prjquota volumes (no registry): is it Nomad's host_volumes_dir? \
             give it with --volumes-dir",
            vfs.path.display()
        )
    })?;
    let id = resolve(&reg, &req.volume)?;
    let _lock = reg.lock_volume(&id)?;
    let rec = reg.load(&id)?.ok_or_else(|| {
        anyhow!(
            "no volume {id} under {}: `prjquota list` shows the volumes",
            vfs.path.display()
        )
    })?;
    match rec.state {
        State::Ready => {}
        State::Creating => bail!(
            "volume {id}: its create stopped part-way; Nomad's next create of it (a restore \
             at agent start, or `nomad volume create`) finishes it, then grow it"
        ),
        State::Deleting => bail!("volume {id} is being deleted: there is nothing to grow"),
    }
    let (bytes, params) = plan(&rec, req.size, req.max_inodes, vfs.block_size)?;
    let pid = rec.project_id;
    let limits = limits_for(bytes, &params);
    let changed = bytes != rec.provisioned_bytes || params != rec.params;
    let mut grown = rec.clone();
    if changed {
        grown.provisioned_bytes = bytes;
        grown.params = params;
        grown.updated_unix = registry::now_unix();
        grown.grown = Some(Grown {
            nomad_bytes: rec
                .grown
                .as_ref()
                .map_or(rec.provisioned_bytes, |g| g.nomad_bytes),
            nomad_max_inodes: rec
                .grown
                .as_ref()
                .map_or(rec.params.max_inodes, |g| g.nomad_max_inodes),
            grown_unix: grown.updated_unix,
        });
        reg.follow_journal_of(&vfs);
        // Held until the grown limit is recorded, so that concurrent grows
        // and creates each count the others' promises.
        let alloc = reg.lock_allocation()?;
        let held = rec.provisioned_bytes;
        let mut book = Book::open(&reg, &alloc)?;
        if bytes > held {
            admission::admit(&vfs, &mut book, &cfg, &id, bytes, held)?;
        }
        book.begin()?;
        reg.store(&grown, Durable::Now)?;
        fault::point("grow:recorded");
        if let Err(e) = Control::of(&vfs).set_limits(pid, &limits) {
            // Nothing raised: the record says so again. Should that fail
            // too, the record's larger limits are applied by the next
            // restore or `reconcile --fix`, which is what was asked.
            if let Err(back) = reg.store(&rec, Durable::Now) {
                return Err(e.context(format!(
                    "and the record could not be put back ({back:#}): the next restore or \
                     `prjquota reconcile --fix` applies the larger size"
                )));
            }
            return Err(e);
        }
        fault::point("grow:limited");
        book.recorded(pid, bytes, Some(held));
        book.commit_or_log(&id);
    } else {
        // Already recorded: finish a grow that stopped before the kernel.
        let have = Control::of(&vfs).get(pid)?;
        if !limits_match(&have.limits, &limits) {
            Control::of(&vfs)
                .set_limits(pid, &limits)
                .with_context(|| format!("volume {id}: cannot apply its recorded limits"))?;
        }
    }
    let nomad = grown.grown.as_ref();
    Ok(Grew {
        volume_id: id,
        volume_name: rec.volume_name.clone(),
        namespace: rec.namespace.clone(),
        from_bytes: rec.provisioned_bytes,
        to_bytes: grown.provisioned_bytes,
        from_max_inodes: rec.params.max_inodes,
        to_max_inodes: grown.params.max_inodes,
        nomad_bytes: nomad.map_or(grown.provisioned_bytes, |g| g.nomad_bytes),
        nomad_max_inodes: nomad.map_or(grown.params.max_inodes, |g| g.nomad_max_inodes),
        changed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(bytes: u64, max_inodes: Option<u64>) -> Record {
        let mut r: Record =
            serde_json::from_str(include_str!("../../../core/tests/fixtures/record-v1.json"))
                .unwrap();
        r.provisioned_bytes = bytes;
        r.params.max_inodes = max_inodes;
        r
    }

    #[test]
    fn a_grow_rounds_up_to_the_block_and_adds() {
        let r = rec(1 << 30, Some(100));
        let (b, p) = plan(&r, Some(Size::To((2 << 30) + 1)), None, 4096).unwrap();
        assert_eq!((b, p.max_inodes), ((2 << 30) + 4096, Some(100)));
        let (b, _) = plan(&r, Some(Size::By(1 << 30)), Some(500), 4096).unwrap();
        assert_eq!(b, 2 << 30);
        let (b, p) = plan(&r, None, Some(500), 4096).unwrap();
        assert_eq!((b, p.max_inodes), (1 << 30, Some(500)));
        // The same size again is no change (a repeated --to).
        let (b, p) = plan(&r, Some(Size::To(1 << 30)), Some(100), 4096).unwrap();
        assert_eq!((b, p), (r.provisioned_bytes, r.params.clone()));
    }

    #[test]
    fn a_grow_never_lowers_a_limit_nor_sets_one() {
        let r = rec(2 << 30, Some(100));
        let e = plan(&r, Some(Size::To(1 << 30)), None, 4096).unwrap_err();
        assert!(e.to_string().contains("never shrinks"), "{e}");
        let e = plan(&r, None, Some(99), 4096).unwrap_err();
        assert!(e.to_string().contains("give --inodes above 100"), "{e}");
        let e = plan(&rec(1 << 30, None), None, Some(5), 4096).unwrap_err();
        assert!(e.to_string().contains("has no inode limit"), "{e}");
        let e = plan(&r, Some(Size::By(MAX_BYTES)), None, 4096).unwrap_err();
        assert!(e.to_string().contains("more than Nomad can record"), "{e}");
    }

    #[test]
    fn a_volume_is_an_id_or_a_name() {
        const ID: &str = "0b6f3c1e-5d2a-4f8b-9c7d-1e2f3a4b5c6d";
        assert_eq!(
            VolumeRef::parse(ID, "prod"),
            VolumeRef::Id(VolumeId::parse(ID).unwrap())
        );
        assert_eq!(
            VolumeRef::parse("db", "prod"),
            VolumeRef::Name {
                name: "db".into(),
                namespace: "prod".into()
            }
        );
    }
}
