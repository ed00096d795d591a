//! The one root-sync both programs use: replaces the `(dev, ino) -> value`
//! roots map and its per-device gate map with a desired set.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use aya::maps::{HashMap as BpfHashMap, MapData};
use aya::Ebpf;

use crate::error::TelemetryError;
use crate::error::{map_err, remove_ok};
use crate::raw::{RootKey, MAX_DEVS};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Volume roots are found by walking at most this many parent directories up
/// from a written file; files deeper below their root count as
/// [`Unattributed::walk_limit`], never for the wrong volume.
pub const MAX_DEPTH: u32 = crate::raw::MAX_DEPTH;

/// What [`WriteTelemetry::set_roots`] changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RootsUpdate {
    pub added: usize,
    /// Roots whose volume index changed.
    pub changed: usize,
    pub removed: usize,
    /// Volume indexes whose counters were dropped (no root left).
    pub pruned_counters: usize,
    /// Entries whose `st_dev` has no kernel `dev_t` equivalent (never from a
    /// real `stat`); skipped.
    pub rejected: Vec<(u64, u64, u32)>,
}

pub use prjquota_core::guard_contract::kernel_dev;

/// `(st_dev, st_ino)` of a directory, as [`WriteTelemetry::set_roots`]
/// takes them.
pub fn root_of(path: &Path) -> std::io::Result<(u64, u64)> {
    let m = std::fs::metadata(path)?;
    Ok((m.dev(), m.ino()))
}

/// The volume indexes of `wanted` that are not in `current` and below
/// `slots`: those entering the roots, whose counters a program clears before
/// their roots go in, so that a reused index starts from zero.
pub(crate) fn entering(
    current: &BTreeSet<u32>,
    wanted: impl IntoIterator<Item = u32>,
    slots: u32,
) -> BTreeSet<u32> {
    wanted
        .into_iter()
        .filter(|i| !current.contains(i) && *i < slots)
        .collect()
}

/// The two maps of a program's root set.
pub(crate) struct RootMaps {
    /// `RootKey -> V`: the volume roots.
    pub roots: &'static str,
    /// `dev -> number of roots on it`: gates the walk up the dentries.
    pub devs: &'static str,
}

/// Makes the kernel's roots exactly `roots` (`(st_dev, st_ino, value)` each,
/// `index_of` giving a value's volume index). Returns what changed and the
/// volume indexes now in use, for the caller to prune its counters.
///
/// Write order (the same for every program): roots first, then removals of
/// stale roots, then devices, stale devices last. A device gates the walk,
/// so a device becomes visible only once every root on it is in place: a
/// program never walks a device with half its roots, where a file under a
/// nested root not yet written would be attributed to (or, for the guard,
/// checked against the project ID of) its outer root. Each root's value is
/// one map update, so a root is never visible with a stale index or project
/// ID; a removed root disappears before its device does.
pub(crate) fn sync_roots<V>(
    ebpf: &mut Ebpf,
    maps: &RootMaps,
    max_roots: u32,
    roots: impl IntoIterator<Item = (u64, u64, V)>,
    index_of: impl Fn(&V) -> u32,
) -> Result<(RootsUpdate, BTreeSet<u32>), TelemetryError>
where
    V: aya::Pod + PartialEq,
{
    let mut update = RootsUpdate::default();
    let mut desired: HashMap<RootKey, V> = HashMap::new();
    for (st_dev, st_ino, value) in roots {
        match kernel_dev(st_dev) {
            Some(dev) => {
                desired.insert(RootKey { dev, ino: st_ino }, value);
            }
            None => update.rejected.push((st_dev, st_ino, index_of(&value))),
        }
    }
    if desired.len() > max_roots as usize {
        return Err(TelemetryError::TooManyRoots {
            given: desired.len(),
            max: max_roots,
        });
    }
    let mut devs: BTreeMap<u64, u32> = BTreeMap::new();
    for key in desired.keys() {
        *devs.entry(key.dev).or_default() += 1;
    }
    if devs.len() > MAX_DEVS as usize {
        return Err(TelemetryError::TooManyDevices {
            given: devs.len(),
            max: MAX_DEVS,
        });
    }
    {
        let map = ebpf
            .map_mut(maps.roots)
            .ok_or(TelemetryError::MissingMap { map: maps.roots })?;
        let mut root_map: BpfHashMap<&mut MapData, RootKey, V> =
            map_err(maps.roots, BpfHashMap::try_from(map))?;
        let current: HashMap<RootKey, V> =
            map_err(maps.roots, root_map.iter().collect::<Result<_, _>>())?;
        for (key, value) in &desired {
            match current.get(key) {
                Some(v) if v == value => continue,
                Some(_) => update.changed += 1,
                None => update.added += 1,
            }
            map_err(maps.roots, root_map.insert(key, value, 0))?;
        }
        for key in current.keys().filter(|k| !desired.contains_key(k)) {
            map_err(maps.roots, remove_ok(root_map.remove(key)))?;
            update.removed += 1;
        }
    }
    {
        let map = ebpf
            .map_mut(maps.devs)
            .ok_or(TelemetryError::MissingMap { map: maps.devs })?;
        let mut dev_map: BpfHashMap<&mut MapData, u64, u32> =
            map_err(maps.devs, BpfHashMap::try_from(map))?;
        for (dev, n) in &devs {
            map_err(maps.devs, dev_map.insert(dev, n, 0))?;
        }
        let stale: Vec<u64> = map_err(maps.devs, dev_map.keys().collect())?;
        for dev in stale.iter().filter(|d| !devs.contains_key(d)) {
            map_err(maps.devs, remove_ok(dev_map.remove(dev)))?;
        }
    }
    let indexes = desired.values().map(&index_of).collect();
    Ok((update, indexes))
}
