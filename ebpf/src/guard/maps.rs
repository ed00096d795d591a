//! The roots, devices and projects maps: which directories are volume
//! roots, of which project, on which devices; synced from the registry.

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use aya::maps::{HashMap as BpfHashMap, Map, MapData, PerCpuHashMap};

use super::Guard;
use crate::error::TelemetryError;
use crate::error::{map_err, named_map, named_map_mut, remove_ok};
use crate::raw::{
    GuardProject, GuardRawCounters as RawCounters, GuardRawRoot as RawRoot, GuardRootKey,
};
use crate::roots::{kernel_dev, RootsUpdate};

pub(super) const MAP_ROOTS: &str = "guard_roots";
pub(super) const MAP_ROOT_DEVS: &str = "guard_root_devs";
pub(super) const MAP_PROJECTS: &str = "guard_projects";
pub(super) const MAP_COUNTERS: &str = "guard_counters";
pub(super) const MAP_STATS: &str = "guard_stats";
pub(super) const MAP_EVENTS: &str = "guard_events";
pub(super) const MAP_RANGES: &str = "guard_ranges";
/// Entries of `guard_ranges` (`GUARD_MAX_RANGES`).
pub const MAX_RANGES: usize = 4;

/// The identity the guard keys a root by: `(st_dev, st_ino, generation)`
/// of the directory at `path` (not following a symlink).
pub fn root_identity(path: &Path) -> io::Result<(u64, u64, u32)> {
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    root_identity_of(dir.as_fd())
}

/// [`root_identity`] of an open directory.
pub fn root_identity_of(fd: BorrowedFd<'_>) -> io::Result<(u64, u64, u32)> {
    let st = prjquota_core::sys::fstat(fd)?;
    Ok((
        st.st_dev,
        st.st_ino,
        prjquota_core::sys::inode_generation(fd)?,
    ))
}

/// The keys in the guard's maps at one moment ([`Guard::snapshot`]): a
/// sync deletes only what was there before it read the registry, never an
/// entry the plugin added since.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    roots: HashSet<GuardRootKey>,
    projects: HashSet<GuardProject>,
}

impl Snapshot {
    /// A snapshot holding these roots (`(kernel dev, ino, generation)`) and
    /// projects (`(kernel dev, project ID)`): what a sync's tests start
    /// from.
    pub fn from_keys(roots: &[(u64, u64, u32)], projects: &[(u64, u32)]) -> Snapshot {
        Snapshot {
            roots: roots
                .iter()
                .map(|&(dev, ino, gen)| GuardRootKey {
                    dev,
                    ino,
                    gen,
                    _pad: 0,
                })
                .collect(),
            projects: projects
                .iter()
                .map(|&(dev, projid)| GuardProject {
                    dev,
                    projid,
                    _pad: 0,
                })
                .collect(),
        }
    }

    /// Keys a sync may delete from.
    pub fn len(&self) -> usize {
        self.roots.len() + self.projects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Guard {
    /// The keys of the roots and projects maps now.
    pub fn snapshot(&self) -> Result<Snapshot, TelemetryError> {
        let roots: BpfHashMap<&MapData, GuardRootKey, RawRoot> =
            map_err(MAP_ROOTS, BpfHashMap::try_from(self.map(MAP_ROOTS)?))?;
        let projects: BpfHashMap<&MapData, GuardProject, u32> =
            map_err(MAP_PROJECTS, BpfHashMap::try_from(self.map(MAP_PROJECTS)?))?;
        Ok(Snapshot {
            roots: self.keys::<GuardRootKey, RawRoot, _>(MAP_ROOTS, || roots.keys().collect())?,
            projects: self
                .keys::<GuardProject, u32, _>(MAP_PROJECTS, || projects.keys().collect())?,
        })
    }

    /// The keys of hash map `name` (values `V`): in a few batched calls
    /// ([`crate::raw::hash_keys`]), or from `one_by_one` where the kernel
    /// has no batch lookup for the map.
    pub(super) fn keys<K, V, C>(
        &self,
        name: &'static str,
        one_by_one: impl FnOnce() -> Result<C, aya::maps::MapError>,
    ) -> Result<C, TelemetryError>
    where
        K: aya::Pod + Default,
        C: FromIterator<K>,
    {
        let fd = match self.map(name)? {
            Map::HashMap(data) => data.fd().as_fd(),
            _ => return map_err(name, one_by_one()),
        };
        match crate::raw::hash_keys::<K>(fd, std::mem::size_of::<V>()) {
            Ok(keys) => Ok(keys.into_iter().collect()),
            // EINVAL, ENOTSUPP (524), EOPNOTSUPP: no batch lookup here.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINVAL | 524 | libc::EOPNOTSUPP)
                ) =>
            {
                map_err(name, one_by_one())
            }
            Err(io_error) => Err(TelemetryError::Map {
                map: name,
                source: aya::maps::MapError::SyscallError(aya::sys::SyscallError {
                    call: "bpf_map_lookup_batch",
                    io_error,
                }),
            }),
        }
    }

    /// Replaces the volume roots: `(st_dev, st_ino, generation, project
    /// ID)` of each root directory ([`root_identity`]) and the registry.
    /// Adds, updates, deletes; a project no root has any more leaves the
    /// guard with its counters. Nested roots: a file belongs to its
    /// innermost root.
    pub fn set_roots(
        &mut self,
        roots: &[(u64, u64, u32, u32)],
    ) -> Result<RootsUpdate, TelemetryError> {
        let snapshot = self.snapshot()?;
        let update = self.apply(&snapshot, roots)?;
        // Devices without a root: none can be added behind this call's back
        // by the caller itself.
        let wanted: HashSet<u64> = roots.iter().filter_map(|r| kernel_dev(r.0)).collect();
        let mut devs: BpfHashMap<&mut MapData, u64, u32> = map_err(
            MAP_ROOT_DEVS,
            BpfHashMap::try_from(self.map_mut(MAP_ROOT_DEVS)?),
        )?;
        let stale: Vec<u64> = map_err(MAP_ROOT_DEVS, devs.keys().collect())?;
        for dev in stale.iter().filter(|d| !wanted.contains(d)) {
            map_err(MAP_ROOT_DEVS, remove_ok(devs.remove(dev)))?;
        }
        Ok(update)
    }

    /// Brings the maps to `roots` as [`Guard::set_roots`] would, but deletes
    /// only entries in `snapshot` (taken before the registry was read): a
    /// root or project the plugin added since stays. Devices are never
    /// removed here (one map lookup per change on a device without roots).
    ///
    /// Write order: roots, then projects, then devices (a device gates the
    /// walk: it becomes visible once its roots are in place), removals last.
    pub fn apply(
        &mut self,
        snapshot: &Snapshot,
        roots: &[(u64, u64, u32, u32)],
    ) -> Result<RootsUpdate, TelemetryError> {
        let mut update = RootsUpdate::default();
        let mut desired: HashMap<GuardRootKey, u32> = HashMap::new();
        for &(st_dev, ino, gen, projid) in roots {
            match kernel_dev(st_dev) {
                Some(dev) => {
                    desired.insert(
                        GuardRootKey {
                            dev,
                            ino,
                            gen,
                            _pad: 0,
                        },
                        projid,
                    );
                }
                None => update.rejected.push((st_dev, ino, projid)),
            }
        }
        if desired.len() > self.max_roots as usize {
            return Err(TelemetryError::TooManyRoots {
                given: desired.len(),
                max: self.max_roots,
            });
        }
        let projects: HashSet<GuardProject> = desired
            .iter()
            .map(|(k, &projid)| GuardProject {
                dev: k.dev,
                projid,
                _pad: 0,
            })
            .collect();
        let devs: HashSet<u64> = desired.keys().map(|k| k.dev).collect();
        if devs.len() > crate::raw::MAX_DEVS as usize {
            return Err(TelemetryError::TooManyDevices {
                given: devs.len(),
                max: crate::raw::MAX_DEVS,
            });
        }
        {
            let mut m: BpfHashMap<&mut MapData, GuardRootKey, RawRoot> =
                map_err(MAP_ROOTS, BpfHashMap::try_from(self.map_mut(MAP_ROOTS)?))?;
            for (key, &projid) in &desired {
                let value = RawRoot { projid, _pad: 0 };
                match m.get(key, 0) {
                    Ok(v) if v == value => continue,
                    Ok(_) => update.changed += 1,
                    Err(_) => update.added += 1,
                }
                map_err(MAP_ROOTS, m.insert(key, value, 0))?;
            }
        }
        {
            let mut m: BpfHashMap<&mut MapData, GuardProject, u32> = map_err(
                MAP_PROJECTS,
                BpfHashMap::try_from(self.map_mut(MAP_PROJECTS)?),
            )?;
            for p in projects.iter().filter(|p| !snapshot.projects.contains(p)) {
                map_err(MAP_PROJECTS, m.insert(p, 1, 0))?;
            }
        }
        {
            let mut m: BpfHashMap<&mut MapData, u64, u32> = map_err(
                MAP_ROOT_DEVS,
                BpfHashMap::try_from(self.map_mut(MAP_ROOT_DEVS)?),
            )?;
            for dev in &devs {
                map_err(MAP_ROOT_DEVS, m.insert(dev, 1, 0))?;
            }
        }
        {
            let mut m: BpfHashMap<&mut MapData, GuardRootKey, RawRoot> =
                map_err(MAP_ROOTS, BpfHashMap::try_from(self.map_mut(MAP_ROOTS)?))?;
            for key in snapshot.roots.iter().filter(|k| !desired.contains_key(k)) {
                map_err(MAP_ROOTS, remove_ok(m.remove(key)))?;
                update.removed += 1;
            }
        }
        let gone: Vec<GuardProject> = snapshot
            .projects
            .iter()
            .filter(|p| !projects.contains(p))
            .copied()
            .collect();
        if !gone.is_empty() {
            {
                let mut m: BpfHashMap<&mut MapData, GuardProject, u32> = map_err(
                    MAP_PROJECTS,
                    BpfHashMap::try_from(self.map_mut(MAP_PROJECTS)?),
                )?;
                for p in &gone {
                    map_err(MAP_PROJECTS, remove_ok(m.remove(p)))?;
                }
            }
            let mut c: PerCpuHashMap<&mut MapData, GuardProject, RawCounters> = map_err(
                MAP_COUNTERS,
                PerCpuHashMap::try_from(self.map_mut(MAP_COUNTERS)?),
            )?;
            for p in &gone {
                if c.remove(p).is_ok() {
                    update.pruned_counters += 1;
                }
            }
        }
        Ok(update)
    }

    /// The project-ID ranges prjquota gives out (the volumes', the
    /// allocations'): outside every root, an unprivileged caller may not
    /// take an ID in them. At most [`MAX_RANGES`]; the rest of the map is
    /// cleared.
    pub fn set_ranges(
        &mut self,
        ranges: &[std::ops::RangeInclusive<u32>],
    ) -> Result<(), TelemetryError> {
        let mut map: aya::maps::Array<&mut MapData, crate::raw::GuardRange> = map_err(
            MAP_RANGES,
            aya::maps::Array::try_from(self.map_mut(MAP_RANGES)?),
        )?;
        for i in 0..MAX_RANGES {
            let r = ranges
                .get(i)
                .map_or(crate::raw::GuardRange::default(), |r| {
                    crate::raw::GuardRange {
                        min: *r.start(),
                        max: *r.end(),
                    }
                });
            map_err(MAP_RANGES, map.set(i as u32, r, 0))?;
        }
        Ok(())
    }

    pub(super) fn map(&self, name: &'static str) -> Result<&Map, TelemetryError> {
        named_map(&self.ebpf, name)
    }

    pub(super) fn map_mut(&mut self, name: &'static str) -> Result<&mut Map, TelemetryError> {
        named_map_mut(&mut self.ebpf, name)
    }
}
