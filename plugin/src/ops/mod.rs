//! `create` and `delete`, as Nomad runs them.
//!
//! Each operation is a short sequence of idempotent steps, ordered so that a
//! crash (`kill -9`) at any point leaves state that the next call for the
//! same volume finishes or cleans up:
//!
//! - create: admitted and a new ID chosen from the registry's ledger
//!   ([`crate::admission`]), the ID made known to the pinned guard, and
//!   claimed on the kernel (its hard limit set, under a lock every volumes
//!   directory of the filesystem shares) → reservation →
//!   record (`creating`, with the reserved project ID) → ledger → hard limit on the ID
//!   → directory (root's, mode 0700) → into the pinned guard → project tag →
//!   mode/owner → record `ready`. The limit comes before the tag, so there
//!   is never a moment when a tagged volume is unlimited; the guard and the
//!   tag come before the owner, so nothing the owner does to the root
//!   escapes the project, and no file lands in the root before it is tagged.
//! - delete: record `deleting` → directory tree removed → root out of the
//!   guard → limits cleared → record removed → project out of the guard →
//!   ledger.
//!   The record goes last, so a half-deleted volume is always known.
//!
//! The same `create` serves a first create, Nomad's restore at agent start
//! and a spec update: it compares the request with the record, does nothing
//! when they agree, grows or (when usage fits) shrinks the limit in place,
//! and never touches the volume's content. A volume the operator grew in
//! use ([`grow`], which Nomad cannot do for a claimed volume) keeps its
//! grown limits under every spec below them.

mod converge;
mod create_new;
mod delete;
mod desired;
mod grow;
mod pins;
mod reservations;
mod update;
mod volume_dir;

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};

pub(crate) use converge::{converge, limits_for, limits_match, Undo};
pub use delete::delete;
pub use desired::Created;
use desired::Desired;
pub use grow::{grow, Grew, GrowRequest, Size, VolumeRef};
pub(crate) use pins::open_guard;
pub(crate) use volume_dir::open_volume_dir;

use crate::capacity;
use crate::contract::{CreateRequest, VolumeId};
use crate::diag::log;
use crate::fs::VolumesFs;
use crate::param_check;
use crate::registry::{self, Record, Registry, State};
use prjquota_core::config::{self, Config};
use prjquota_core::record::{record_file_name, Grown};
use prjquota_core::units;
use prjquota_core::volume_params::VolumeParams;

/// The node configuration: `prjquota.toml` in Nomad's plugin dir, or beside
/// the executable when Nomad did not say where that is.
pub fn load_config(plugin_dir: Option<&Path>) -> Result<Config> {
    let dir = match plugin_dir {
        Some(d) => d.to_path_buf(),
        None => std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .unwrap_or_else(|| PathBuf::from(".")),
    };
    config::load(&dir).map_err(|e| anyhow!("{e}"))
}

/// `create`: a new volume, a restore, or an update. Returns what Nomad must
/// be told.
pub fn create(req: &CreateRequest, plugin_id: &str) -> Result<Created> {
    let id = &req.volume_id;
    let cfg = load_config(req.plugin_dir.as_deref())?;
    // What today's config makes of the request. A recorded volume uses it
    // only for the parts of its spec that changed (see `settled`), so a
    // replay is not refused for what the config no longer allows.
    let params = param_check::parse(&req.parameters, &param_check::Policy::from(&cfg))
        .map_err(|e| anyhow!("{e}"));
    let sized = capacity::requested_limit(req.capacity_min, req.capacity_max, cfg.default_capacity)
        .map_err(|e| anyhow!("{e}"));
    // Refuse a request the config rejects before touching the filesystem,
    // unless it may be the replay of a recorded volume (decided under its
    // lock below).
    if params.is_err() || sized.is_err() {
        let record = registry::records_dir(&req.volumes_dir).join(record_file_name(id));
        if std::fs::symlink_metadata(record).is_err() {
            params.as_ref().map_err(|e| anyhow!("{e}"))?;
            sized.as_ref().map_err(|e| anyhow!("{e}"))?;
        }
    }
    let vfs = VolumesFs::open(&req.volumes_dir, true)?;
    vfs.require_enforced_quota()?;
    note_served(&vfs, req);
    let fit = sized.and_then(|_| {
        capacity::fit_to_blocks(
            req.capacity_min,
            req.capacity_max,
            cfg.default_capacity,
            vfs.block_size,
        )
        .map_err(|e| anyhow!("{e}"))
    });
    let reg = Registry::open(vfs.fd(), &vfs.path, true)?
        .expect("open with create always yields a registry");
    let lock = reg.lock_volume(id)?;

    let created = match reg.load(id)? {
        Some(rec) if rec.state == State::Deleting => bail!(
            "volume {id} was being deleted when a previous delete stopped, and part of its data may be gone: run `nomad volume delete` for it again"
        ),
        Some(rec) => {
            let s = settled(&rec, req, params, fit)?;
            if let Some(g) = s.grown.as_ref().filter(|_| rec.grown.is_some()) {
                if !spec_unchanged(&rec, req) {
                    log(
                        id,
                        format_args!(
                            "the spec asks for {} ({} inodes), below the {} ({} inodes) the \
                             operator grew the volume to with `prjquota grow`: the grown \
                             limits stay, and Nomad is told {}",
                            units::human(g.nomad_bytes),
                            inodes_text(g.nomad_max_inodes),
                            units::human(s.bytes),
                            inodes_text(s.params.max_inodes),
                            units::human(g.nomad_bytes),
                        ),
                    );
                }
            }
            return update::update(
                &vfs,
                &reg,
                &cfg,
                rec,
                &Desired::new(req, plugin_id, s.params, s.bytes).with_grown(s.grown),
            );
        }
        None => create_new::create_new(&vfs, &reg, &cfg, &Desired::new(req, plugin_id, params?, fit?))?,
    };
    // Only a new volume: a restore or resize keeps its root, which a running
    // exporter already watches. Not under the volume's lock: the exporter
    // reads the registry.
    drop(lock);
    announce(&vfs, id);
    Ok(created)
}

/// What a recorded volume keeps under a create of `req`.
#[derive(Debug, PartialEq)]
struct Settled {
    /// The parameters in force.
    params: VolumeParams,
    /// The hard limit in force.
    bytes: u64,
    /// What Nomad believes, while the operator's grow holds the limits
    /// above the spec.
    grown: Option<Grown>,
}

/// Whether `req` asks for the size the record's spec asked for.
fn spec_unchanged(rec: &Record, req: &CreateRequest) -> bool {
    rec.capacity_min_bytes == req.capacity_min && rec.capacity_max_bytes == req.capacity_max
}

/// "no limit" or the count.
fn inodes_text(n: Option<u64>) -> String {
    n.map_or_else(|| "no".to_string(), |n| n.to_string())
}

/// The parameters and size a recorded volume keeps under `req`. Defaults
/// belong to a volume from its creation: the record holds what was applied
/// (the resolved mode, owner and inode limit in `params`, the size in
/// `provisioned_bytes`), and a part of the spec that did not change keeps
/// it, whatever the node config says now. So Nomad's replay of the last
/// create at agent start never chmods a volume because `default_mode`
/// changed, never shrinks one because `default_capacity` did (Nomad ignores
/// the returned size on restore), and is never refused because a parameter
/// left `allowed_parameters`. A changed part is an explicit update: today's
/// config resolves it (`params`, `fit`), and refuses it if it must.
///
/// A volume the operator grew (`prjquota grow`, `rec.grown`) keeps its
/// grown limits under any spec below them: Nomad cannot update a claimed
/// volume, so its spec lags, and its restore at every agent start replays
/// the older one. Nomad is told what the spec asks for (within its
/// `[capacity_min, capacity_max]`, see the contract); once a spec asks for
/// at least the grown limits, the volume is Nomad's again.
fn settled(
    rec: &Record,
    req: &CreateRequest,
    params: Result<VolumeParams>,
    fit: Result<u64>,
) -> Result<Settled> {
    // What the spec asks for, as the record knows it when unchanged.
    let spec_params = if rec.parameters == req.parameters {
        match &rec.grown {
            Some(g) => VolumeParams {
                max_inodes: g.nomad_max_inodes,
                ..rec.params.clone()
            },
            None => rec.params.clone(),
        }
    } else {
        params?
    };
    // Also keeps a size an earlier version rounded capacity_max up to a
    // block (which a fit today would round down, or refuse).
    let spec_bytes = if spec_unchanged(rec, req) && rec.provisioned_bytes > 0 {
        rec.grown
            .as_ref()
            .map_or(rec.provisioned_bytes, |g| g.nomad_bytes)
    } else {
        fit?
    };
    let Some(g) = &rec.grown else {
        return Ok(Settled {
            params: spec_params,
            bytes: spec_bytes,
            grown: None,
        });
    };
    let bytes = spec_bytes.max(rec.provisioned_bytes);
    // `None` is no limit: the highest.
    let max_inodes = match (spec_params.max_inodes, rec.params.max_inodes) {
        (Some(a), Some(b)) => Some(a.max(b)),
        _ => None,
    };
    let grown = (bytes != spec_bytes || max_inodes != spec_params.max_inodes).then_some(Grown {
        nomad_bytes: spec_bytes,
        nomad_max_inodes: spec_params.max_inodes,
        grown_unix: g.grown_unix,
    });
    Ok(Settled {
        params: VolumeParams {
            max_inodes,
            ..spec_params
        },
        bytes,
        grown,
    })
}

/// Leaves the marker that this volumes directory is Nomad's, for the
/// exporter to check it watches it (`prjquota_core::served_dirs`): one
/// `stat` when it is there already. The operation does not depend on it: a
/// failure is logged.
fn note_served(vfs: &VolumesFs, req: &CreateRequest) {
    use prjquota_core::served_dirs;
    let dir = std::path::Path::new(served_dirs::DIR);
    if let Err(e) = served_dirs::note(dir, &vfs.path, &req.node_id) {
        log(
            &req.volume_id,
            format_args!(
                "cannot record in {} that this node's volumes directory is {} ({e}): prjquota-exporter cannot tell whether it watches it",
                served_dirs::DIR,
                vfs.path.display()
            ),
        );
    }
}

/// Tells a running prjquota-exporter the volume exists, and waits until it
/// watches it: its first write is counted and its project ID guarded
/// before Nomad hears of it. The volume itself is made: a failure here is
/// logged, and the exporter registers the volume at its next scrape.
fn announce(vfs: &VolumesFs, id: &VolumeId) {
    if let Err(e) = prjquota_core::announce::announce(&vfs.path, prjquota_core::announce::WAIT) {
        log(id, format_args!("could not tell prjquota-exporter about the new volume ({e}): it is watched from the exporter's next scrape"));
    }
}

#[cfg(test)]
mod tests {
    use super::update::{plan_update, UpdatePlan};
    use super::*;

    const ID: &str = "6b0e8ab4-4ec7-4c42-9a1b-0b52c1d9a9a1";

    fn request(min: u64, max: u64, name: &str) -> CreateRequest {
        let (min, max) = (min.to_string(), max.to_string());
        crate::contract::parse_create([
            ("DHV_OPERATION", "create"),
            ("DHV_VOLUMES_DIR", "/srv/volumes"),
            ("DHV_PLUGIN_DIR", "/opt/nomad/plugins"),
            ("DHV_NODE_POOL", "default"),
            ("DHV_NAMESPACE", "default"),
            ("DHV_VOLUME_NAME", name),
            ("DHV_VOLUME_ID", ID),
            ("DHV_CAPACITY_MIN_BYTES", min.as_str()),
            ("DHV_CAPACITY_MAX_BYTES", max.as_str()),
            ("DHV_NODE_ID", "8d6b1c62-8a44-4a2b-9c1e-5a8d1e3f0b7c"),
            ("DHV_PARAMETERS", "null"),
        ])
        .expect("a valid request")
    }

    fn params(max_inodes: Option<u64>) -> VolumeParams {
        VolumeParams {
            mode: 0o750,
            uid: None,
            gid: None,
            max_inodes,
            excluded_from_alerts: false,
        }
    }

    /// The record a create of `req` made, now Ready.
    fn ready(want: &Desired) -> Record {
        let mut rec = want.record_at(PathBuf::from("/srv/volumes").join(ID), "xfs", 1234);
        rec.state = State::Ready;
        rec
    }

    #[test]
    fn an_unchanged_restore_does_nothing_unless_the_kernel_drifted() {
        let req = request(1 << 30, 1 << 30, "data");
        let want = Desired::new(&req, "prjquota", params(None), 1 << 30);
        let rec = ready(&want);
        assert_eq!(plan_update(&rec, &want, true), UpdatePlan::Nothing);
        // The kernel lost the limit or the directory's tag: converge, no resize.
        assert_eq!(
            plan_update(&rec, &want, false),
            UpdatePlan::Converge { resize_from: None }
        );
    }

    #[test]
    fn an_unchanged_spec_keeps_what_its_creation_applied_whatever_the_config() {
        let req = request(0, 0, "data");
        let mut rec = ready(&Desired::new(&req, "prjquota", params(Some(9)), 16 << 20));
        rec.capacity_min_bytes = 0;
        rec.capacity_max_bytes = 0;
        // Today's config refuses the parameters and has no default size.
        let s = settled(
            &rec,
            &req,
            Err(anyhow!("uid is not allowed")),
            Err(anyhow!("no capacity")),
        )
        .unwrap();
        assert_eq!(
            (s.params, s.bytes, s.grown),
            (params(Some(9)), 16 << 20, None)
        );

        // A changed part of the spec is resolved, or refused, today; the
        // unchanged part still keeps the record's.
        let resized = request(0, 32 << 20, "data");
        let s = settled(
            &rec,
            &resized,
            Err(anyhow!("uid is not allowed")),
            Ok(32 << 20),
        )
        .unwrap();
        assert_eq!((s.params, s.bytes), (params(Some(9)), 32 << 20));
        let mut reparam = request(0, 0, "data");
        reparam.parameters.insert("uid".into(), "1".into());
        let e = settled(&rec, &reparam, Err(anyhow!("uid is not allowed")), Ok(1)).unwrap_err();
        assert_eq!(e.to_string(), "uid is not allowed");
    }

    #[test]
    fn a_changed_label_or_size_converges_and_a_resize_names_the_old_size() {
        let req = request(1 << 30, 1 << 30, "data");
        let rec = ready(&Desired::new(&req, "prjquota", params(None), 1 << 30));

        let renamed = request(1 << 30, 1 << 30, "renamed");
        let want = Desired::new(&renamed, "prjquota", params(None), 1 << 30);
        assert_eq!(
            plan_update(&rec, &want, true),
            UpdatePlan::Converge { resize_from: None }
        );

        let grown = request(2 << 30, 2 << 30, "data");
        let want = Desired::new(&grown, "prjquota", params(None), 2 << 30);
        assert_eq!(
            plan_update(&rec, &want, true),
            UpdatePlan::Converge {
                resize_from: Some(1 << 30)
            }
        );
        assert!(!want.shrinks(&rec));

        // A crashed create (still Creating) is finished, not "resized".
        let mut creating = rec.clone();
        creating.state = State::Creating;
        assert_eq!(
            plan_update(&creating, &want, false),
            UpdatePlan::Converge { resize_from: None }
        );
    }

    #[test]
    fn shrinking_is_a_lower_size_or_a_new_or_lower_inode_limit() {
        let req = request(1 << 30, 1 << 30, "data");
        let rec = ready(&Desired::new(&req, "prjquota", params(Some(1000)), 1 << 30));
        let smaller = Desired::new(&req, "prjquota", params(Some(1000)), 1 << 29);
        assert!(smaller.shrinks(&rec));
        let fewer = Desired::new(&req, "prjquota", params(Some(999)), 1 << 30);
        assert!(fewer.shrinks(&rec));
        let more = Desired::new(&req, "prjquota", params(Some(1001)), 1 << 30);
        assert!(!more.shrinks(&rec));
        let unlimited = Desired::new(&req, "prjquota", params(None), 1 << 30);
        assert!(!unlimited.shrinks(&rec));

        let rec = ready(&Desired::new(&req, "prjquota", params(None), 1 << 30));
        let limited = Desired::new(&req, "prjquota", params(Some(5)), 1 << 30);
        assert!(
            limited.shrinks(&rec),
            "a first inode limit may be below the usage"
        );
    }

    #[test]
    fn applying_a_request_makes_the_record_say_it() {
        let req = request(1 << 30, 1 << 30, "data");
        let mut rec = ready(&Desired::new(&req, "prjquota", params(None), 1 << 30));
        rec.state = State::Creating;
        let created = rec.created_unix;
        let grown = request(2 << 30, 3 << 30, "renamed");
        let want = Desired::new(&grown, "prjquota", params(Some(7)), 2 << 30);
        assert!(!want.recorded_in(&rec));
        want.apply_to(&mut rec, PathBuf::from("/srv/volumes").join(ID), "ext4");
        assert!(want.recorded_in(&rec));
        assert_eq!(rec.state, State::Ready);
        assert_eq!((rec.fstype.as_str(), rec.project_id), ("ext4", 1234));
        assert_eq!(
            rec.created_unix, created,
            "an update keeps the creation time"
        );
        assert_eq!(plan_update(&rec, &want, true), UpdatePlan::Nothing);
    }

    /// A volume grown by the operator to 3 GiB and 2,000 inodes, from a
    /// spec of 1 GiB and 1,000.
    fn grown_record() -> Record {
        let mut req = request(1 << 30, 1 << 30, "data");
        req.parameters.insert("max_inodes".into(), "1000".into());
        let mut rec = ready(&Desired::new(&req, "prjquota", params(Some(1000)), 1 << 30));
        rec.provisioned_bytes = 3 << 30;
        rec.params.max_inodes = Some(2000);
        rec.grown = Some(Grown {
            nomad_bytes: 1 << 30,
            nomad_max_inodes: Some(1000),
            grown_unix: 7,
        });
        rec
    }

    fn with_inodes(mut req: CreateRequest, n: &str) -> CreateRequest {
        req.parameters.insert("max_inodes".into(), n.into());
        req
    }

    #[test]
    fn a_restore_of_the_older_spec_keeps_what_the_operator_grew() {
        let rec = grown_record();
        let req = with_inodes(request(1 << 30, 1 << 30, "data"), "1000");
        let s = settled(&rec, &req, Err(anyhow!("unused")), Err(anyhow!("unused"))).unwrap();
        assert_eq!((s.bytes, s.params.max_inodes), (3 << 30, Some(2000)));
        assert_eq!(s.grown, rec.grown);
        let want = Desired::new(&req, "prjquota", s.params, s.bytes).with_grown(s.grown);
        // Nomad is told the spec's size, within its capacity range.
        assert_eq!(want.nomad_bytes, 1 << 30);
        assert!(want.recorded_in(&rec), "a restore writes nothing");
        assert_eq!(plan_update(&rec, &want, true), UpdatePlan::Nothing);
    }

    #[test]
    fn a_spec_below_the_grown_limits_keeps_them_and_one_above_takes_over() {
        let rec = grown_record();
        // A larger spec, still below the grown size: the grown size stays,
        // Nomad is told the spec's.
        let req = with_inodes(request(1 << 30, 2 << 30, "data"), "1000");
        let s = settled(&rec, &req, Ok(params(Some(1000))), Ok(2 << 30)).unwrap();
        assert_eq!((s.bytes, s.params.max_inodes), (3 << 30, Some(2000)));
        assert_eq!(s.grown.as_ref().unwrap().nomad_bytes, 2 << 30);

        // The spec catches up with the size but not the inodes: still grown.
        let req = with_inodes(request(1 << 30, 3 << 30, "data"), "1500");
        let s = settled(&rec, &req, Ok(params(Some(1500))), Ok(3 << 30)).unwrap();
        assert_eq!((s.bytes, s.params.max_inodes), (3 << 30, Some(2000)));
        assert_eq!(
            s.grown
                .as_ref()
                .map(|g| (g.nomad_bytes, g.nomad_max_inodes)),
            Some((3 << 30, Some(1500)))
        );

        // The spec asks for as much or more: the volume is Nomad's again.
        let req = with_inodes(request(1 << 30, 4 << 30, "data"), "2000");
        let s = settled(&rec, &req, Ok(params(Some(2000))), Ok(4 << 30)).unwrap();
        assert_eq!(
            (s.bytes, s.params.max_inodes, &s.grown),
            (4 << 30, Some(2000), &None)
        );
        let want = Desired::new(&req, "prjquota", s.params, s.bytes).with_grown(s.grown);
        assert_eq!(want.nomad_bytes, 4 << 30);
        assert_eq!(
            plan_update(&rec, &want, true),
            UpdatePlan::Converge {
                resize_from: Some(3 << 30)
            }
        );
        // An inode limit taken away by the spec is no limit: the highest.
        let req = request(1 << 30, 3 << 30, "data");
        let s = settled(&rec, &req, Ok(params(None)), Ok(3 << 30)).unwrap();
        assert_eq!(
            (s.bytes, s.params.max_inodes, s.grown),
            (3 << 30, None, None)
        );
    }
}
