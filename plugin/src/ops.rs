//! `create` and `delete`, as Nomad runs them.
//!
//! Each operation is a short sequence of idempotent steps, ordered so that a
//! crash (`kill -9`) at any point leaves state that the next call for the
//! same volume finishes or cleans up:
//!
//! - create: a new ID is chosen, made known to the pinned guard, and
//!   claimed on the kernel (its hard limit set, under a lock every volumes
//!   directory of the filesystem shares) → reservation →
//!   record (`creating`, with the reserved project ID) → hard limit on the ID
//!   → directory (root's, mode 0700) → into the pinned guard → project tag →
//!   mode/owner → record `ready`. The limit comes before the tag, so there
//!   is never a moment when a tagged volume is unlimited; the guard and the
//!   tag come before the owner, so nothing the owner does to the root
//!   escapes the project, and no file lands in the root before it is tagged.
//! - delete: record `deleting` → directory tree removed → root out of the
//!   guard → limits cleared → record removed → project out of the guard.
//!   The record goes last, so a half-deleted volume is always known.
//!
//! The same `create` serves a first create, Nomad's restore at agent start
//! and a spec update: it compares the request with the record, does nothing
//! when they agree, grows or (when usage fits) shrinks the limit in place,
//! and never touches the volume's content.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use prjquota_core::guard_pins::{kernel_dev, PinnedGuard, RootKey};
use prjquota_core::units;

use crate::capacity;
use crate::contract::{CreateRequest, DeleteRequest, VolumeId};
use crate::fault;
use crate::fs::VolumesFs;
use crate::param_check;
use crate::registry::{self, Durable, Record, Registry, State};
use crate::remove;
use prjquota_core::config::{self, Config};
use prjquota_core::fs_type::FsType;
use prjquota_core::quota::{self, Limits, Support};
use prjquota_core::record::record_file_name;
use prjquota_core::sys;
use prjquota_core::volume_params::VolumeParams;

/// What `create` returns to Nomad.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    pub path: PathBuf,
    pub bytes: u64,
}

/// A diagnostic line on stderr, which Nomad logs. stdout is reserved for the
/// one JSON value Nomad parses.
pub fn log(volume: &VolumeId, msg: impl std::fmt::Display) {
    eprintln!("prjquota: volume={volume} {msg}");
}

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

fn cname(id: &VolumeId) -> CString {
    CString::new(id.as_str()).expect("a validated UUID has no NUL")
}

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

/// Opens a volume's root directory without following a link, and checks it
/// lives on the volumes filesystem itself (not a mount placed there).
pub(crate) fn open_volume_dir(vfs: &VolumesFs, id: &VolumeId) -> io::Result<OwnedFd> {
    let fd = sys::openat(
        vfs.fd(),
        &cname(id),
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    )?;
    let st = sys::fstat(fd.as_fd())?;
    if st.st_dev != vfs.dev || sys::mount_id(fd.as_fd())? != sys::mount_id(vfs.fd())? {
        return Err(io::Error::other(
            "the volume directory is a mount point, not a directory of the volumes filesystem",
        ));
    }
    Ok(fd)
}

fn is_empty_dir(fd: &OwnedFd) -> io::Result<bool> {
    Ok(sys::read_dir(fd.as_fd())?.is_empty())
}

/// Applies mode and owner to the volume root (never to its content).
fn apply_root_attrs(fd: &OwnedFd, p: &VolumeParams) -> io::Result<()> {
    let st = sys::fstat(fd.as_fd())?;
    if (p.uid.is_some() && p.uid != Some(st.st_uid))
        || (p.gid.is_some() && p.gid != Some(st.st_gid))
    {
        sys::fchown(
            fd.as_fd(),
            p.uid.unwrap_or(u32::MAX),
            p.gid.unwrap_or(u32::MAX),
        )?;
    }
    // After chown: the kernel clears setuid/setgid bits on chown.
    let st = sys::fstat(fd.as_fd())?;
    if st.st_mode & 0o7777 != p.mode {
        sys::fchmod(fd.as_fd(), p.mode)?;
    }
    Ok(())
}

/// Explains a failure to tag a directory with a project ID.
fn tag_error(e: io::Error, vfs: &VolumesFs, id: u32) -> anyhow::Error {
    match (e.raw_os_error(), vfs.fstype) {
        (Some(libc::EINVAL), FsType::Xfs) if id > 65535 => anyhow!(
            "XFS refused project ID {id} on {}: the filesystem lacks projid32bit (an old v4 XFS); set project_id_max = 65535 and a matching project_id_min in prjquota.toml, or recreate the filesystem with mkfs.xfs defaults",
            vfs.describe()
        ),
        (Some(libc::EOPNOTSUPP), FsType::Ext4) => anyhow!(
            "ext4 refused project ID {id} on {}: the filesystem lacks the project feature or has 128-byte inodes; run `tune2fs -O project,quota` on it while unmounted (inodes must be 256 bytes: mkfs.ext4 -I 256)",
            vfs.describe()
        ),
        _ => anyhow::Error::new(e).context(format!("cannot set project ID {id} on the volume directory")),
    }
}

fn quota_error(e: io::Error, what: &str, id: u32, vfs: &VolumesFs) -> anyhow::Error {
    if e.raw_os_error() == Some(libc::EPERM) {
        anyhow!(
            "the kernel refused to {what} project {id} on {}: quota changes need CAP_SYS_ADMIN; run the Nomad client agent as root",
            vfs.describe()
        )
    } else {
        anyhow::Error::new(e).context(format!("cannot {what} project {id} on {}", vfs.describe()))
    }
}

/// Chooses a project ID that no volume has reserved and the kernel reports
/// no usage, inodes or limits for. Called under the allocation lock; costs one
/// listing of the reservations and one pass over the kernel's quotas,
/// however many volumes exist.
fn allocate_project_id(
    vfs: &VolumesFs,
    reservations: &[(u32, VolumeId)],
    cfg: &Config,
) -> Result<u32> {
    let range = cfg.project_id_min..=cfg.project_id_max;
    let mut taken: std::collections::BTreeSet<u32> = reservations.iter().map(|(p, _)| *p).collect();
    let kernel = quota::list(vfs.fd(), range.clone())
        .map_err(|e| quota_error(e, "list", cfg.project_id_min, vfs))?;
    taken.extend(kernel.iter().filter(|q| !q.is_unused()).map(|q| q.id));
    let mut candidate = cfg.project_id_min;
    for id in taken.range(range.clone()) {
        if *id != candidate {
            break;
        }
        candidate = match candidate.checked_add(1) {
            Some(c) => c,
            None => break,
        };
    }
    if !range.contains(&candidate) || taken.contains(&candidate) {
        bail!(
            "no free project ID left in {}..={} on {} ({} in use): widen project_id_min/project_id_max in {}, or delete volumes",
            cfg.project_id_min,
            cfg.project_id_max,
            vfs.describe(),
            taken.range(range).count(),
            cfg.source
                .as_ref()
                .map_or_else(|| "prjquota.toml".to_string(), |p| p.display().to_string())
        );
    }
    Ok(candidate)
}

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
    reservations: &[(u32, VolumeId)],
    cfg: &Config,
    id: &VolumeId,
    limits: &Limits,
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
    let pid = allocate_project_id(vfs, reservations, cfg)?;
    // Into the guard before the claim: the ID is predictable (the lowest
    // free one), and until the guard knows it, a file outside the volumes
    // may be given it by its owner and charge the new volume.
    if let (Some(g), Some(dev)) = (open_guard(vfs)?, kernel_dev(vfs.dev)) {
        g.register_project(dev, pid, true)?;
    }
    fault::point("create:project-guarded");
    quota::set_limits(vfs.fd(), pid, limits)
        .map_err(|e| quota_error(e, "set the limits of", pid, vfs))?;
    Ok(pid)
}

/// The inputs of the admission rule for a create or grow of `except`: the
/// filesystem's size and use now, and every other recorded volume's limit.
/// Called under the allocation lock, so no other promise lands meanwhile.
pub(crate) fn holdings(
    vfs: &VolumesFs,
    reg: &Registry,
    cfg: &Config,
    except: &VolumeId,
) -> Result<capacity::Holdings> {
    let (promised, ids) = promised_by_records(reg, Some(except))?;
    measure_holdings(vfs, promised, ids, cfg.overcommit_ratio)
}

/// The filesystem's size and the bytes used outside the volumes with
/// project IDs `ids`, now; with `promised` and `ratio`, the admission rule's
/// inputs. `prjquota check` and `list` report the same figures.
pub fn measure_holdings(
    vfs: &VolumesFs,
    promised: u64,
    ids: std::collections::BTreeSet<u32>,
    ratio: f64,
) -> Result<capacity::Holdings> {
    let usage = volumes_usage(vfs, ids)?;
    let sfs =
        sys::fstatfs(vfs.fd()).with_context(|| format!("cannot statfs {}", vfs.path.display()))?;
    let frsize = sfs.f_frsize as u64;
    let fs_bytes = (sfs.f_blocks as u64).saturating_mul(frsize);
    let used = (sfs.f_blocks as u64)
        .saturating_sub(sfs.f_bfree as u64)
        .saturating_mul(frsize);
    Ok(capacity::Holdings {
        fs_bytes,
        used_outside: used.saturating_sub(usage),
        promised,
        ratio,
    })
}

/// The sum of the recorded volumes' sizes (but `except`'s), and the range
/// project IDs. A record that cannot be read is an error: its
/// promise cannot be counted, and leaving it out could overcommit.
pub(crate) fn promised_by_records(
    reg: &Registry,
    except: Option<&VolumeId>,
) -> Result<(u64, std::collections::BTreeSet<u32>)> {
    let mut promised = 0u64;
    let mut ids = std::collections::BTreeSet::new();
    for entry in reg.load_all()? {
        match entry {
            registry::Entry::Record(rec) => {
                ids.insert(rec.project_id);
                if Some(&rec.volume_id) != except {
                    promised = promised.saturating_add(rec.provisioned_bytes);
                }
            }
            registry::Entry::Corrupt { file, error } => bail!(
                "cannot count the size promised to the volume of {}/{file} ({error}), so no \
                 volume can be admitted: run `prjquota reconcile` to see what it is, then \
                 repair or remove that record",
                reg.path().display()
            ),
        }
    }
    Ok((promised, ids))
}

/// Bytes the kernel counts to the volumes' projects, in one quota pass over
/// the range their IDs span (IDs in between that no record names are other
/// tools' projects: their files are outside volumes).
pub(crate) fn volumes_usage(vfs: &VolumesFs, ids: std::collections::BTreeSet<u32>) -> Result<u64> {
    let (Some(&lo), Some(&hi)) = (ids.first(), ids.last()) else {
        return Ok(0);
    };
    Ok(quota::list(vfs.fd(), lo..=hi)
        .map_err(|e| quota_error(e, "list the usage of", lo, vfs))?
        .iter()
        .filter(|q| ids.contains(&q.id))
        .map(|q| q.used_bytes)
        .fold(0u64, u64::saturating_add))
}

/// What this call changed, so a failed create can put things back.
#[derive(Default)]
pub(crate) struct Undo {
    record: bool,
    limits: bool,
    dir: bool,
    /// The root this call put into the guard.
    guarded: Option<RootKey>,
}

/// The guard pinned for this volumes directory, if an exporter pinned one.
/// Pins that exist but cannot be used are an error: a volume must not be
/// handed out unguarded while a guard is meant to be in force.
pub(crate) fn open_guard(vfs: &VolumesFs) -> Result<Option<PinnedGuard>> {
    PinnedGuard::open(&vfs.path).map_err(|e| anyhow!("{e}"))
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
            let (params, bytes) = settled(&rec, req, params, fit)?;
            return update(
                &vfs,
                &reg,
                &cfg,
                rec,
                &Desired::new(req, plugin_id, params, bytes),
            );
        }
        None => create_new(&vfs, &reg, &cfg, &Desired::new(req, plugin_id, params?, fit?))?,
    };
    // Only a new volume: a restore or resize keeps its root, which a running
    // exporter already watches. Not under the volume's lock: the exporter
    // reads the registry.
    drop(lock);
    announce(&vfs, id);
    Ok(created)
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
fn settled(
    rec: &Record,
    req: &CreateRequest,
    params: Result<VolumeParams>,
    fit: Result<u64>,
) -> Result<(VolumeParams, u64)> {
    let params = if rec.parameters == req.parameters {
        rec.params.clone()
    } else {
        params?
    };
    // Also keeps a size an earlier version rounded capacity_max up to a
    // block (which a fit today would round down, or refuse).
    let bytes = if rec.capacity_min_bytes == req.capacity_min
        && rec.capacity_max_bytes == req.capacity_max
        && rec.provisioned_bytes > 0
    {
        rec.provisioned_bytes
    } else {
        fit?
    };
    Ok((params, bytes))
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

/// What a create asks for, once checked: the request, the parameters it
/// resolves to and the size that fits. Both a new volume and an update are
/// made from it.
#[derive(Debug)]
struct Desired<'a> {
    req: &'a CreateRequest,
    plugin_id: &'a str,
    params: VolumeParams,
    bytes: u64,
}

impl<'a> Desired<'a> {
    fn new(
        req: &'a CreateRequest,
        plugin_id: &'a str,
        params: VolumeParams,
        bytes: u64,
    ) -> Desired<'a> {
        Desired {
            req,
            plugin_id,
            params,
            bytes,
        }
    }

    /// The record of a new volume with `project_id`, in state Creating.
    fn record(&self, vfs: &VolumesFs, project_id: u32) -> Record {
        self.record_at(
            vfs.path.join(self.req.volume_id.as_str()),
            vfs.fstype.name(),
            project_id,
        )
    }

    fn record_at(&self, path: PathBuf, fstype: &str, project_id: u32) -> Record {
        let now = registry::now_unix();
        let req = self.req;
        Record {
            version: registry::RECORD_VERSION,
            state: State::Creating,
            volume_id: req.volume_id.clone(),
            volume_name: req.volume_name.clone(),
            namespace: req.namespace.clone(),
            node_pool: req.node_pool.clone(),
            node_id: req.node_id.clone(),
            plugin_id: self.plugin_id.to_string(),
            path,
            fstype: fstype.to_string(),
            project_id,
            capacity_min_bytes: req.capacity_min,
            capacity_max_bytes: req.capacity_max,
            provisioned_bytes: self.bytes,
            params: self.params.clone(),
            parameters: req.parameters.clone(),
            created_unix: now,
            updated_unix: now,
        }
    }

    /// Whether `rec` already says everything this request says.
    fn recorded_in(&self, rec: &Record) -> bool {
        let req = self.req;
        rec.volume_name == req.volume_name
            && rec.namespace == req.namespace
            && rec.node_pool == req.node_pool
            && rec.node_id == req.node_id
            && rec.plugin_id == self.plugin_id
            && rec.capacity_min_bytes == req.capacity_min
            && rec.capacity_max_bytes == req.capacity_max
            && rec.provisioned_bytes == self.bytes
            && rec.params == self.params
            && rec.parameters == req.parameters
    }

    /// Writes this request into an existing volume's record, found at
    /// `path` on a filesystem of type `fstype`.
    fn apply_to(&self, rec: &mut Record, path: PathBuf, fstype: &str) {
        let req = self.req;
        rec.state = State::Ready;
        rec.volume_name = req.volume_name.clone();
        rec.namespace = req.namespace.clone();
        rec.node_pool = req.node_pool.clone();
        rec.node_id = req.node_id.clone();
        rec.plugin_id = self.plugin_id.to_string();
        rec.capacity_min_bytes = req.capacity_min;
        rec.capacity_max_bytes = req.capacity_max;
        rec.provisioned_bytes = self.bytes;
        rec.params = self.params.clone();
        rec.parameters = req.parameters.clone();
        rec.fstype = fstype.to_string();
        rec.path = path;
        rec.updated_unix = registry::now_unix();
    }

    /// Whether applying this request lowers a limit the volume's usage
    /// must then fit under (bytes, or inodes newly limited or lowered).
    fn shrinks(&self, rec: &Record) -> bool {
        self.bytes < rec.provisioned_bytes
            || match (self.params.max_inodes, rec.params.max_inodes) {
                (Some(new), Some(old)) => new < old,
                (Some(_), None) => true,
                _ => false,
            }
    }
}

/// What a create of a recorded volume must do.
#[derive(Debug, PartialEq, Eq)]
enum UpdatePlan {
    /// A restore with nothing changed: no write at all.
    Nothing,
    /// Bring the kernel and the record to the request; `resize_from` is the
    /// size in force when the limit changes on a Ready volume.
    Converge { resize_from: Option<u64> },
}

/// The decision of [`update`], given whether the kernel and the directory
/// already match the request (`kernel_ok`).
fn plan_update(rec: &Record, want: &Desired, kernel_ok: bool) -> UpdatePlan {
    if kernel_ok && want.recorded_in(rec) {
        return UpdatePlan::Nothing;
    }
    let resize_from = (rec.state == State::Ready && rec.provisioned_bytes != want.bytes)
        .then_some(rec.provisioned_bytes);
    UpdatePlan::Converge { resize_from }
}

fn create_new(vfs: &VolumesFs, reg: &Registry, cfg: &Config, want: &Desired) -> Result<Created> {
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
            let (projid, _) = quota::project_of(fd.as_fd())
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

    reg.follow_journal_of(vfs);
    let mut claimed = false;
    let project_id = {
        let _alloc = reg.lock_allocation()?;
        // Listed once: reservations are only made under the allocation lock,
        // and one released meanwhile only keeps its ID out of this choice.
        let reservations = reg.reservations()?;
        // A create killed after reserving, before recording, left its
        // reservation: take it back rather than leak the ID.
        let own = reservations
            .iter()
            .find(|(_, owner)| owner == id)
            .map(|(p, _)| *p);
        // An adopted directory is a volume that already held its promise
        // before the registry was lost: like a restore, never refused.
        if adopt.is_none() {
            holdings(vfs, reg, cfg, id)?
                .admit(id.as_str(), bytes)
                .map_err(|e| anyhow!("{e}"))?;
        }
        let pid = match (adopt, own) {
            (Some(p), _) | (None, Some(p)) => p,
            (None, None) => {
                let p =
                    allocate_and_claim(vfs, &reservations, cfg, id, &limits_for(bytes, params))?;
                claimed = true;
                p
            }
        };
        let unclaim = || {
            if claimed {
                let _ = quota::set_limits(vfs.fd(), pid, &Limits::NONE);
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
        pid
    };
    fault::point("create:recorded");

    let mut undo = Undo {
        record: true,
        limits: claimed,
        ..Undo::default()
    };
    let guard = open_guard(vfs);
    let result = guard
        .and_then(|g| {
            converge(
                vfs,
                id,
                project_id,
                params,
                bytes,
                g.as_ref(),
                true,
                &mut undo,
            )
        })
        .and_then(|()| {
            let mut rec = want.record(vfs, project_id);
            rec.state = State::Ready;
            reg.store(&rec, Durable::Now)
        });
    match result {
        Ok(()) => Ok(Created { path, bytes }),
        Err(e) => {
            if dir_existed {
                undo.dir = false;
            }
            rollback(vfs, reg, id, project_id, &undo);
            Err(e)
        }
    }
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
    let have = quota::get(vfs.fd(), project_id)
        .map_err(|e| quota_error(e, "read the quota of", project_id, vfs))?;
    if !limits_match(&have.limits, &want) {
        quota::set_limits(vfs.fd(), project_id, &want)
            .map_err(|e| quota_error(e, "set the limits of", project_id, vfs))?;
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
        let q = quota::get(vfs.fd(), project_id)
            .map_err(|e| quota_error(e, "read the usage of", project_id, vfs))?;
        if q.used_bytes != 0 || q.used_inodes != 0 {
            bail!(
                "project ID {project_id} already charges {} bytes and {} inodes to files outside                  the volume (given that ID before the quota-escape guard knew it, or by a                  privileged process), so the new volume would start with them: the create is                  refused and the ID stays out of use; create the volume again (it gets another                  ID), and find the files with `xfs_quota -x -c 'report -p'` or `repquota -P`",
                q.used_bytes,
                q.used_inodes
            );
        }
    }
    quota::tag(fd.as_fd(), project_id).map_err(|e| tag_error(e, vfs, project_id))?;
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

/// Undoes what a failed first create made. Best effort: each failure is
/// logged, and the record stays if the directory could not be removed, so
/// the next create or delete still knows the volume.
fn rollback(vfs: &VolumesFs, reg: &Registry, id: &VolumeId, project_id: u32, undo: &Undo) {
    let mut keep_record = false;
    if let Some(key) = &undo.guarded {
        match open_guard(vfs) {
            Ok(Some(g)) => {
                if let Err(e) = g
                    .unregister_root(key)
                    .and_then(|_| g.forget_project(key.dev, project_id))
                {
                    log(id, format_args!("rollback: {e}"));
                }
            }
            Ok(None) => {}
            Err(e) => log(id, format_args!("rollback: {e:#}")),
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
        if let Err(e) = quota::set_limits(vfs.fd(), project_id, &Limits::NONE) {
            log(
                id,
                format_args!("rollback: cannot clear the limits of project {project_id}: {e}"),
            );
        }
    }
    if undo.record && !keep_record {
        match reg.remove(id) {
            Ok(()) => {
                if let Err(e) = reg.release_id(project_id, id) {
                    log(
                        id,
                        format_args!("rollback: cannot release project ID {project_id}: {e:#}"),
                    );
                }
            }
            Err(e) => log(
                id,
                format_args!("rollback: cannot remove the record: {e:#}"),
            ),
        }
    }
}

/// A create for a volume that has a record: restore, finish a crashed
/// create, or apply an updated spec.
fn update(
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
        let used =
            quota::get(vfs.fd(), pid).map_err(|e| quota_error(e, "read the usage of", pid, vfs))?;
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
            || quota::get(vfs.fd(), pid)
                .map(|q| limits_match(&q.limits, &limits_for(bytes, params)))
                .unwrap_or(false))
        && match open_volume_dir(vfs, id) {
            Ok(fd) => {
                quota::project_of(fd.as_fd()).is_ok_and(|(p, inherit)| p == pid && inherit)
                    && sys::fstat(fd.as_fd()).is_ok_and(|st| {
                        st.st_mode & 0o7777 == params.mode
                            && params.uid.is_none_or(|u| u == st.st_uid)
                            && params.gid.is_none_or(|g| g == st.st_gid)
                    })
            }
            Err(_) => false,
        };
    match plan_update(&rec, want, kernel_ok) {
        UpdatePlan::Nothing => return Ok(Created { path, bytes }),
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
    // Held until the grown limit is recorded, so that concurrent grows and
    // creates each count the others' promises.
    let _alloc = reg.lock_allocation()?;
    // Only a grow is checked: a restore or shrink already holds its promise.
    if bytes > rec.provisioned_bytes {
        holdings(vfs, reg, cfg, id)?
            .admit(id.as_str(), bytes)
            .map_err(|e| anyhow!("{e}"))?;
    }
    // Volumes recorded before reservations existed, or after a repair.
    reg.follow_journal_of(vfs);
    reg.reserve_id(pid, id, Durable::ByNextSync)?;
    converge(
        vfs,
        id,
        pid,
        params,
        bytes,
        open_guard(vfs)?.as_ref(),
        false,
        &mut undo,
    )?;
    want.apply_to(&mut rec, path.clone(), vfs.fstype.name());
    reg.store(&rec, Durable::Now)?;
    Ok(Created { path, bytes })
}

/// The project's usage once the filesystem has finished freeing what was
/// just unlinked. XFS (5.15+) inactivates unlinked inodes in the background,
/// so a quota read right after a delete can still count them; statfs on XFS
/// flushes that work, and a few short waits cover what is still in flight.
fn settled_usage(vfs: &VolumesFs, pid: u32) -> Result<quota::ProjectQuota> {
    let read =
        || quota::get(vfs.fd(), pid).map_err(|e| quota_error(e, "read the usage of", pid, vfs));
    let mut q = read()?;
    for _ in 0..20 {
        if q.is_unused() {
            break;
        }
        let _ = sys::fstatfs(vfs.fd());
        std::thread::sleep(std::time::Duration::from_millis(25));
        q = read()?;
    }
    Ok(q)
}

/// Releases every project ID reserved for volume `id` but `keep`, clearing
/// the limits of each one the kernel charges nothing to (a claim made before
/// a crash); an ID that still has usage keeps its limits, so it stays out of
/// use. Called under the volume's lock, which every reservation for `id` is
/// made under.
fn release_other_reservations(
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
        match quota::get(vfs.fd(), pid) {
            Ok(q) if q.used_bytes == 0 && q.used_inodes == 0 && !q.limits.is_none() => {
                if let Err(e) = quota::set_limits(vfs.fd(), pid, &Limits::NONE) {
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
    let _lock = reg.lock_volume(id)?;
    let path = vfs.path.join(id.as_str());
    let Some(mut rec) = reg.load(id)? else {
        let _alloc = reg.lock_allocation()?;
        release_other_reservations(&vfs, &reg, &reg.reservations()?, id, None)?;
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
        reg.follow_journal_of(&vfs);
        reg.store(&rec, Durable::ByNextSync)?;
    }
    fault::point("delete:marked");

    // The root leaves the guard only once its tree is gone: until then the
    // owner's files are still the volume's, and a project change on one
    // (through a descriptor kept open) is refused to the end. The entry
    // cannot outlive its inode by matching another: a reused inode number
    // comes with a new generation. A delete that stops in between leaves
    // the entry to the exporter's sync.
    let guard = open_guard(&vfs)?;
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
    match quota::support(vfs.fd()) {
        Ok(Support::Enforced | Support::AccountingOnly) => {
            quota::set_limits(vfs.fd(), pid, &Limits::NONE)
                .map_err(|e| quota_error(e, "clear the limits of", pid, &vfs))?;
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

    reg.remove(id)?;
    fault::point("delete:unrecorded");
    reg.release_id(pid, id)?;
    if let (Some(g), Some(dev)) = (&guard, kernel_dev(vfs.dev)) {
        g.forget_project(dev, pid)?;
    }
    // Reservations a crashed create left beside the recorded ID.
    release_other_reservations(&vfs, &reg, &reg.reservations()?, id, None)?;
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

#[cfg(test)]
mod tests {
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
        let (p, bytes) = settled(
            &rec,
            &req,
            Err(anyhow!("uid is not allowed")),
            Err(anyhow!("no capacity")),
        )
        .unwrap();
        assert_eq!((p, bytes), (params(Some(9)), 16 << 20));

        // A changed part of the spec is resolved, or refused, today; the
        // unchanged part still keeps the record's.
        let resized = request(0, 32 << 20, "data");
        let (p, bytes) = settled(
            &rec,
            &resized,
            Err(anyhow!("uid is not allowed")),
            Ok(32 << 20),
        )
        .unwrap();
        assert_eq!((p, bytes), (params(Some(9)), 32 << 20));
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
}
