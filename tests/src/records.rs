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
        },
        parameters: BTreeMap::new(),
        created_unix: 1_700_000_000,
        updated_unix: 1_700_000_000,
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
