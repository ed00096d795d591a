//! Volume records written with the plugin's own registry code, for tests
//! that need a volumes directory without running the plugin (the exporter's
//! host tests, and real-kernel tests that make thousands of volumes).

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use prjquota::registry::{Durable, Registry};
use prjquota_core::record::{Record, State, RECORD_VERSION};
use prjquota_core::volume_id::VolumeId;
use prjquota_core::volume_params::VolumeParams;

/// A record of volume `id` (a UUID) of 1 GiB with project ID `project_id`,
/// named `vol-<project_id>`, on node `node-1` of pool `default`, mode 0755.
/// Its path is set by [`add_volume`]; callers change any other field.
pub fn record(id: &str, namespace: &str, project_id: u32, state: State) -> Record {
    Record {
        version: RECORD_VERSION,
        state,
        volume_id: VolumeId::parse(id).unwrap_or_else(|e| panic!("volume ID {id:?}: {e}")),
        volume_name: format!("vol-{project_id}"),
        namespace: namespace.into(),
        node_pool: "default".into(),
        node_id: "node-1".into(),
        plugin_id: "prjquota".into(),
        path: PathBuf::new(),
        fstype: "xfs".into(),
        project_id,
        capacity_min_bytes: 0,
        capacity_max_bytes: 1 << 30,
        provisioned_bytes: 1 << 30,
        params: VolumeParams {
            mode: 0o755,
            uid: None,
            gid: None,
            max_inodes: None,
            excluded_from_alerts: false,
        },
        parameters: BTreeMap::new(),
        created_unix: 1_700_000_000,
        updated_unix: 1_700_000_000,
        grown: None,
    }
}

/// A [`State::Ready`] record: see [`record`].
pub fn ready_record(id: &str, namespace: &str, project_id: u32) -> Record {
    record(id, namespace, project_id, State::Ready)
}

/// Stores `rec` in `volumes_dir`'s registry with the plugin's writer (the
/// registry is made if missing) and creates the volume's root; returns the
/// root. Sets no quota: a test that needs one sets it itself.
pub fn add_volume(volumes_dir: &Path, mut rec: Record) -> PathBuf {
    rec.path = volumes_dir.join(rec.volume_id.as_str());
    std::fs::create_dir_all(&rec.path)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", rec.path.display()));
    let dir = std::fs::File::open(volumes_dir)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", volumes_dir.display()));
    let reg = Registry::open(dir.as_fd(), volumes_dir, true)
        .unwrap_or_else(|e| panic!("registry of {}: {e}", volumes_dir.display()))
        .expect("a registry, made when missing");
    reg.store(&rec, Durable::Now)
        .unwrap_or_else(|e| panic!("store {}: {e}", rec.volume_id.as_str()));
    rec.path
}

/// The project ID reserved for volume `id` in `volumes_dir`'s registry
/// (`.prjquota/ids/<project ID>.<volume ID>`), as a create that stopped
/// before its record left it.
pub fn reserved_project(volumes_dir: &Path, id: &str) -> Option<u32> {
    let ids = volumes_dir.join(".prjquota/ids");
    std::fs::read_dir(&ids)
        .unwrap_or_else(|e| panic!("list {}: {e}", ids.display()))
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .find_map(|n| n.strip_suffix(&format!(".{id}"))?.parse().ok())
}

/// A Ready volume of `bytes` with project `project_id`, made the quick way
/// (directory, kernel limit, tag, record, no plugin run): for tests that
/// need thousands of volumes on a node. `edit` changes its record before it
/// is stored. Nothing is synced: `sync` once after the crowd if it must
/// last. Returns its root.
pub fn add_quick_volume(
    volumes_dir: &Path,
    project_id: u32,
    bytes: u64,
    edit: impl FnOnce(&mut Record),
) -> PathBuf {
    use prjquota_core::quota::{self, Limits};
    let id = crate::nomad::uuid();
    let path = volumes_dir.join(&id);
    std::fs::create_dir_all(&path)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
    let vdir = std::fs::File::open(volumes_dir).unwrap();
    let limits = Limits {
        bytes_hard: bytes,
        ..Limits::NONE
    };
    quota::set_limits(vdir.as_fd(), project_id, &limits)
        .unwrap_or_else(|e| panic!("set the limits of project {project_id}: {e}"));
    let root = std::fs::File::open(&path).unwrap();
    quota::tag(root.as_fd(), project_id)
        .unwrap_or_else(|e| panic!("tag {} with {project_id}: {e}", path.display()));
    let mut rec = ready_record(&id, "default", project_id);
    rec.capacity_max_bytes = bytes;
    rec.provisioned_bytes = bytes;
    rec.path = path.clone();
    edit(&mut rec);
    // Written as the plugin's registry writes it (temp file, rename) but
    // without its fsyncs, which would make a crowd of 100,000 take an hour:
    // nothing here must survive a crash.
    let records = prjquota_core::record::records_dir(volumes_dir);
    std::fs::create_dir_all(&records)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", records.display()));
    let name = prjquota_core::record::record_file_name(&rec.volume_id);
    let tmp = records.join(format!(".{name}.quick"));
    std::fs::write(
        &tmp,
        serde_json::to_vec_pretty(&rec).expect("a record serialises"),
    )
    .unwrap_or_else(|e| panic!("cannot write {}: {e}", tmp.display()));
    std::fs::rename(&tmp, records.join(&name)).expect("publish the record");
    path
}

/// Volumes `range` of a crowd, made the quick way ([`add_quick_volume`])
/// on two threads: volume `i` gets project `first_pid + i` and `bytes`,
/// and `edit(i, record)`. Returns their roots in the order of `range`.
pub fn add_quick_volumes(
    volumes_dir: &Path,
    range: std::ops::Range<u32>,
    first_pid: u32,
    bytes: u64,
    edit: impl Fn(u32, &mut Record) + Sync,
) -> Vec<PathBuf> {
    let edit = &edit;
    let mut made: Vec<(u32, PathBuf)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|w| {
                let range = range.clone();
                s.spawn(move || {
                    range
                        .filter(|i| i % 2 == w)
                        .map(|i| {
                            let root =
                                add_quick_volume(volumes_dir, first_pid + i, bytes, |r| edit(i, r));
                            (i, root)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a crowd's creator thread"))
            .collect()
    });
    made.sort();
    made.into_iter().map(|(_, p)| p).collect()
}

/// The registry's ledger (`.prjquota/ledger`) as the plugin would trust
/// it: written whole, and stamped with the reservations' last change.
pub fn trusted_ledger(volumes_dir: &Path) -> Option<prjquota::ledger::Ledger> {
    use std::os::unix::fs::MetadataExt;
    let reg = volumes_dir.join(".prjquota");
    let l = prjquota::ledger::Ledger::decode(&std::fs::read(reg.join("ledger")).ok()?)?;
    let changed = |dir: &str| {
        let m = std::fs::metadata(reg.join(dir)).ok()?;
        Some((m.mtime() as u64) * 1_000_000_000 + m.mtime_nsec() as u64)
    };
    (Some((l.ids_changed, l.records_changed)) == changed("ids").zip(changed("volumes")))
        .then_some(l)
}

/// Fails when a ledger the plugin would trust disagrees with the records
/// and reservations it stands for: a stale sum is the one way a create
/// could be admitted past what the disk holds.
pub fn assert_ledger_agrees(volumes_dir: &Path, when: &str) {
    let Some(l) = trusted_ledger(volumes_dir) else {
        return;
    };
    let records: Vec<Record> = crate::records::read_records(volumes_dir);
    let promised: u64 = records.iter().map(|r| r.provisioned_bytes).sum();
    assert_eq!(
        (l.promised, l.volumes),
        (promised, records.len() as u64),
        "{when}: the ledger counts {} bytes promised to {} volumes, the records {promised} to {}",
        l.promised,
        l.volumes,
        records.len()
    );
    let ids = volumes_dir.join(".prjquota/ids");
    let reserved: Vec<(u32, String)> = std::fs::read_dir(&ids)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter_map(|n| {
                    let (p, v) = n.split_once('.')?;
                    Some((p.parse().ok()?, v.to_string()))
                })
                .collect()
        })
        .unwrap_or_default();
    let highest = records
        .iter()
        .map(|r| r.project_id)
        .chain(reserved.iter().map(|(p, _)| *p))
        .max();
    assert!(
        highest.is_none_or(|h| u64::from(h) < l.above),
        "{when}: project {highest:?} is reserved or recorded at or above the ledger's next free ID {}",
        l.above
    );
    let orphaned = reserved.iter().any(|(p, v)| {
        !records
            .iter()
            .any(|r| r.project_id == *p && r.volume_id.as_str() == v)
    });
    assert!(
        l.orphans || !orphaned,
        "{when}: a reservation lacks its record but the ledger says none does ({reserved:?})"
    );
}

/// Every record of `volumes_dir`, each of which must parse.
pub fn read_records(volumes_dir: &Path) -> Vec<Record> {
    prjquota::registry::read_all(volumes_dir)
        .unwrap_or_else(|e| panic!("read the records of {}: {e}", volumes_dir.display()))
        .into_iter()
        .map(|e| match e {
            prjquota::registry::Entry::Record(r) => *r,
            prjquota::registry::Entry::Corrupt { file, error } => {
                panic!(
                    "the record {file} of {} is corrupt: {error}",
                    volumes_dir.display()
                )
            }
        })
        .collect()
}
