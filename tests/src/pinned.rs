//! The exporter's pinned quota-escape guard, as the tests look at it: where
//! a volumes directory's pins are, and the roots map read and written
//! directly (what the plugin does at create and delete).

use std::path::{Path, PathBuf};

use aya::maps::{HashMap as BpfHashMap, Map, MapData};
use prjquota_ebpf::guard::pins;
use prjquota_ebpf::guard::{GuardRootKey, GuardRootValue};

/// The pin root the tests' exporters use (the default).
pub fn root() -> &'static Path {
    Path::new(pins::PIN_ROOT)
}

/// The pin directory the symlink of `volumes_dir` points at, if any.
pub fn dir_of(volumes_dir: &Path) -> Option<PathBuf> {
    std::fs::read_link(pins::link_of(root(), volumes_dir)).ok()
}

/// The pin directories under the pin root (`@guard-*`).
pub fn dirs() -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(root()) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("@guard-"))
        })
        .collect();
    v.sort();
    v
}

/// The pin directories an exporter of pid `pid` made (`@guard-<pid>-*`).
pub fn dirs_of(pid: u32) -> Vec<PathBuf> {
    let prefix = format!("@guard-{pid}-");
    dirs()
        .into_iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        })
        .collect()
}

/// Removes the pin directories of the exporters `pids` but `keep` (what a
/// start that completes removes, and the crashed starts' directories a
/// later start would remove once they are 120 s old).
pub fn remove_dirs_of(pids: &[u32], keep: Option<&Path>) {
    for d in pids.iter().flat_map(|p| dirs_of(*p)) {
        if Some(d.as_path()) != keep {
            if let Err(e) = pins::remove_dir(&d) {
                eprintln!("cannot remove the pin directory {}: {e}", d.display());
            }
        }
    }
}

fn roots_map(volumes_dir: &Path) -> BpfHashMap<MapData, GuardRootKey, GuardRootValue> {
    let path = pins::link_of(root(), volumes_dir).join("roots");
    let data = MapData::from_pin(&path)
        .unwrap_or_else(|e| panic!("open the pinned roots map {}: {e}", path.display()));
    BpfHashMap::try_from(Map::HashMap(data)).expect("a hash map of guard roots")
}

/// The roots map of `volumes_dir`'s pinned guard: key and project ID.
pub fn roots(volumes_dir: &Path) -> Vec<(GuardRootKey, u32)> {
    let m = roots_map(volumes_dir);
    let mut v: Vec<(GuardRootKey, u32)> = m
        .iter()
        .map(|r| r.map(|(k, v)| (k, v.projid)).expect("read the roots map"))
        .collect();
    v.sort();
    v
}

/// Puts a root into `volumes_dir`'s pinned guard.
pub fn insert_root(volumes_dir: &Path, key: GuardRootKey, projid: u32) {
    let mut m = roots_map(volumes_dir);
    m.insert(key, GuardRootValue { projid, _pad: 0 }, 0)
        .expect("write the pinned roots map");
}

/// The guard's key of a directory or file: `(st_dev, st_ino, generation)`
/// in the kernel's encoding.
pub fn key_of(path: &Path) -> GuardRootKey {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let (st_dev, ino, gen) = prjquota_ebpf::guard::root_identity_of(std::os::fd::AsFd::as_fd(&f))
        .unwrap_or_else(|e| panic!("identity of {}: {e}", path.display()));
    GuardRootKey {
        dev: prjquota_ebpf::kernel_dev(st_dev).expect("an encodable device"),
        ino,
        gen,
        _pad: 0,
    }
}

/// Removes the pins of `volumes_dirs` (`--guard=off` does the same).
pub fn remove(volumes_dirs: &[PathBuf]) {
    if let Err(e) = pins::remove_for(root(), volumes_dirs) {
        eprintln!("cannot remove the guard's pins of {volumes_dirs:?}: {e}");
    }
}
