//! The guard's host tests: its constants against `guard_shared.h` and
//! `guard.c`, and what runs without programs (its maps, a refused load).

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuHashMap};

use super::counters::*;
use super::events::*;
use super::load::*;
use super::maps::*;
use super::*;
use crate::error::LoadError;
use crate::loader::kernel_btf;
use crate::loader::LoadOptions;
use crate::loader::Variant;
use crate::raw::{GuardRawCounters as RawCounters, GuardRawRoot as RawRoot};
use crate::tests::defines;

// Default map sizes (the same as the write telemetry's: [`LoadOptions`]).
#[cfg(test)]
const MAX_ROOTS: u32 = 16384;
#[cfg(test)]
const MAX_VOLUMES: u32 = 16384;
#[cfg(test)]
const MAX_DEVS: u32 = 64;
#[cfg(test)]
const EVENTS_BYTES: u32 = 262_144;

#[test]
fn header_matches_rust() {
    let h = defines(include_str!("../bpf/guard_shared.h"));
    let expect: [(&str, u64); 28] = [
        ("GUARD_MAX_DEPTH", GUARD_MAX_DEPTH as u64),
        ("GUARD_MAX_DEPTH_CONTEXT", GUARD_MAX_DEPTH_CONTEXT as u64),
        ("GUARD_MAX_ROOTS", MAX_ROOTS as u64),
        ("GUARD_MAX_VOLUMES", MAX_VOLUMES as u64),
        ("GUARD_MAX_DEVS", MAX_DEVS as u64),
        ("GUARD_EVENTS_BYTES", EVENTS_BYTES as u64),
        ("GSTAT_EVENTS_LOST", GSTAT_EVENTS_LOST as u64),
        ("GSTAT_PRIVILEGED", GSTAT_PRIVILEGED as u64),
        ("GSTAT_WALK_LIMIT_ALLOWED", GSTAT_WALK_LIMIT_ALLOWED as u64),
        ("GSTAT_WALK_LIMIT_DENIED", GSTAT_WALK_LIMIT_DENIED as u64),
        ("GSTAT_UNREADABLE", GSTAT_UNREADABLE as u64),
        ("GSTAT_MAP_FULL", GSTAT_MAP_FULL as u64),
        ("GSTAT_OUTSIDE_ALLOWED", GSTAT_OUTSIDE_ALLOWED as u64),
        ("GSTAT_OUTSIDE_DENIED", GSTAT_OUTSIDE_DENIED as u64),
        ("N_GSTATS", N_GSTATS as u64),
        ("GUARD_MAX_RANGES", super::maps::MAX_RANGES as u64),
        ("GUARD_ALLOWED", GUARD_ALLOWED as u64),
        ("GUARD_DENIED", 1),
        ("GUARD_SRC_FILEATTR", 0),
        ("GUARD_SRC_LSM", GUARD_SRC_LSM as u64),
        ("GUARD_WHAT_PROJID", GUARD_WHAT_PROJID as u64),
        ("GUARD_WHAT_NOINHERIT", GUARD_WHAT_NOINHERIT as u64),
        ("GUARD_WHAT_UNREADABLE", GUARD_WHAT_UNREADABLE as u64),
        ("GUARD_WHAT_GENERATION", GUARD_WHAT_GENERATION as u64),
        (
            "GUARD_WHAT_FOREIGN_PROJID",
            GUARD_WHAT_FOREIGN_PROJID as u64,
        ),
        ("GUARD_WHERE_OUTSIDE", GUARD_WHERE_OUTSIDE as u64),
        ("GUARD_WHERE_VOLUME", GUARD_WHERE_VOLUME as u64),
        ("GUARD_WHERE_WALK_LIMIT", GUARD_WHERE_WALK_LIMIT as u64),
    ];
    for (name, value) in expect {
        assert_eq!(h.get(name), Some(&value), "{name} in guard_shared.h");
    }
    assert_eq!(std::mem::size_of::<RawRoot>(), 8);
    assert_eq!(std::mem::size_of::<RawCounters>(), 16);
    // The structs the plugin writes too (docs: guard-interface), field
    // by field as the header declares them.
    let h = include_str!("../bpf/guard_shared.h");
    for (name, fields) in [
        (
            "guard_root_key",
            "__u64 dev;|__u64 ino;|__u32 gen;|__u32 _pad;",
        ),
        ("guard_root", "__u32 projid;|__u32 _pad;"),
        ("guard_project", "__u64 dev;|__u32 projid;|__u32 _pad;"),
    ] {
        let start = h
            .find(&format!("struct {name} {{"))
            .unwrap_or_else(|| panic!("struct {name} in guard_shared.h"));
        let body = &h[start..start + h[start..].find("};").unwrap()];
        let got: Vec<&str> = body
            .lines()
            .skip(1)
            .filter_map(|l| l.trim().split("/*").next())
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        assert_eq!(got.join("|"), fields, "struct {name}");
    }
    assert_eq!(std::mem::size_of::<GuardRootKey>(), 24);
    assert_eq!(std::mem::offset_of!(GuardRootKey, gen), 16);
    assert_eq!(std::mem::size_of::<GuardProject>(), 16);
    assert_eq!(std::mem::offset_of!(GuardProject, projid), 8);
    assert_eq!(
        pins::MAP_PINS.map(|(m, _)| m),
        [
            MAP_ROOTS,
            MAP_ROOT_DEVS,
            MAP_PROJECTS,
            MAP_COUNTERS,
            MAP_STATS,
            MAP_EVENTS
        ]
    );
    // Shared with the C programs and the rest of the crate.
    assert_eq!(MAX_ROOTS, crate::raw::MAX_ROOTS);
    assert_eq!(MAX_VOLUMES, crate::raw::MAX_VOLUMES);
    assert_eq!(MAX_DEVS, crate::raw::MAX_DEVS);
}

#[test]
#[allow(clippy::unnecessary_cast)] // c_ulong is u64 on the 64-bit targets only
fn uapi_values_in_guard_c_match_libc() {
    let c = defines(include_str!("../bpf/guard.c"));
    assert_eq!(c["FS_IOC_FSSETXATTR"], 0x401c_5820);
    assert_eq!(c["FS_IOC_SETFLAGS"], libc::FS_IOC_SETFLAGS as u64);
    assert_eq!(c["FS_IOC32_SETFLAGS"], libc::FS_IOC32_SETFLAGS as u64);
    assert_eq!(c["FS_XFLAG_PROJINHERIT"], 0x200);
    assert_eq!(c["FS_PROJINHERIT_FL"], 0x2000_0000);
    assert_eq!(c["CAP_SYS_ADMIN"], 21, "linux/capability.h");
    assert_eq!(c["EPERM"], libc::EPERM as u64);
    assert_eq!(c["EFAULT"], libc::EFAULT as u64);
    assert_eq!(
        (c["S_IFMT"], c["S_IFDIR"]),
        (libc::S_IFMT as u64, libc::S_IFDIR as u64)
    );
}

#[test]
fn guard_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Guard>();
    check::<NotEnforcing>();
}

/// On the development host fexit and LSM programs are refused (EPERM by
/// sandbox policy, although BTF exists): `load` fails, not panics, and
/// says which program and why. Where they are allowed, it attaches.
#[test]
fn load_outcome_names_the_reason() {
    for mode in [GuardMode::Detect, GuardMode::Enforce] {
        match Guard::load(mode) {
            Ok(g) => {
                eprintln!("{mode}: loaded: {g:?}");
                if mode == GuardMode::Enforce && !g.enforcing() {
                    let why = g.not_enforcing().expect("a reason");
                    assert!(!why.to_string().is_empty());
                }
            }
            Err(e) => {
                let text = e.to_string();
                eprintln!("{mode}: load refused ({}): {text}", e.reason());
                assert_ne!(e.reason(), "other", "{text}");
                if !std::path::Path::new(crate::loader::KERNEL_BTF).exists() {
                    assert_eq!(e.reason(), "no_btf");
                    continue;
                }
                if let LoadError::NoProgram { failures, .. } = &e {
                    assert_eq!(failures.len(), 1, "{text}");
                    let (_, detect) = choose(&kernel_btf().unwrap().1);
                    assert!(text.contains(detect.hook), "{text}");
                }
                if e.reason() == "permission" {
                    assert!(text.contains("EPERM") || text.contains("EACCES"), "{text}");
                    assert!(text.contains("permission denied"), "{text}");
                }
            }
        }
    }
}

/// The maps without programs (the host allows maps): roots keyed with
/// their generation, projects, devices, counters per project; a sync
/// from a snapshot leaves alone what was added after it.
#[test]
fn roots_projects_and_counters_through_real_maps() {
    let mut g = maps_only_guard();
    let loop0 = libc::makedev(7, 0);
    let nvme = libc::makedev(259, 3);
    let (k0, kn) = (7u64 << 20, (259u64 << 20) | 3);
    let u = g
        .set_roots(&[
            (loop0, 128, 11, 1001),
            (loop0, 129, 12, 1002),
            (nvme, 128, 13, 7),
        ])
        .unwrap();
    assert_eq!((u.added, u.changed, u.removed), (3, 0, 0));
    let key = |dev, ino, gen| GuardRootKey {
        dev,
        ino,
        gen,
        _pad: 0,
    };
    let root = |projid| RawRoot { projid, _pad: 0 };
    assert_eq!(
        kernel_roots(&g),
        [
            (key(k0, 128, 11), root(1001)),
            (key(k0, 129, 12), root(1002)),
            (key(kn, 128, 13), root(7)),
        ]
    );
    // The same inode number with another generation is another root.
    let u = g
        .set_roots(&[
            (loop0, 128, 99, 1001),
            (loop0, 129, 12, 1002),
            (nvme, 128, 13, 7),
        ])
        .unwrap();
    assert_eq!((u.added, u.changed, u.removed), (1, 0, 1));

    let ncpu = aya::util::nr_cpus().unwrap();
    {
        let mut m: PerCpuHashMap<&mut MapData, GuardProject, RawCounters> =
            PerCpuHashMap::try_from(g.ebpf.map_mut(MAP_COUNTERS).unwrap()).unwrap();
        let per_cpu: Vec<RawCounters> = (0..ncpu)
            .map(|cpu| RawCounters {
                allowed: 1,
                denied: cpu as u64,
            })
            .collect();
        let p = GuardProject {
            dev: k0,
            projid: 1002,
            _pad: 0,
        };
        m.insert(p, aya::maps::PerCpuValues::try_from(per_cpu).unwrap(), 0)
            .unwrap();
    }
    let n = ncpu as u64;
    let c = g.read().unwrap();
    assert_eq!(
        c.projects.keys().copied().collect::<Vec<_>>(),
        [(k0, 1001), (k0, 1002), (kn, 7)]
    );
    assert_eq!(
        c.project(loop0, 1002),
        Outcomes {
            allowed: n,
            denied: n * (n - 1) / 2
        }
    );
    assert_eq!(c.project(loop0, 1001), Outcomes::default());

    // A sync from a snapshot: 1002's root goes (and its project and
    // counters); a root the plugin adds after the snapshot stays.
    let snap = g.snapshot().unwrap();
    {
        let mut m: BpfHashMap<&mut MapData, GuardRootKey, RawRoot> =
            BpfHashMap::try_from(g.ebpf.map_mut(MAP_ROOTS).unwrap()).unwrap();
        m.insert(key(k0, 500, 1), root(1500), 0).unwrap();
    }
    let u = g
        .apply(&snap, &[(loop0, 128, 99, 1001), (nvme, 128, 13, 8)])
        .unwrap();
    assert_eq!(
        (u.added, u.changed, u.removed, u.pruned_counters),
        (0, 1, 1, 1)
    );
    assert_eq!(
        kernel_roots(&g),
        [
            (key(k0, 128, 99), root(1001)),
            (key(k0, 500, 1), root(1500)),
            (key(kn, 128, 13), root(8)),
        ]
    );
    assert_eq!(
        g.read()
            .unwrap()
            .projects
            .keys()
            .copied()
            .collect::<Vec<_>>(),
        [(k0, 1001), (kn, 8)]
    );
    assert!(g.drain_events().is_empty());

    let u = g.set_roots(&[]).unwrap();
    assert_eq!(u.removed, 3);
    assert!(kernel_roots(&g).is_empty());
    let devs: BpfHashMap<&MapData, u64, u32> =
        BpfHashMap::try_from(g.ebpf.map(MAP_ROOT_DEVS).unwrap()).unwrap();
    assert_eq!(devs.keys().count(), 0);
}

/// The roots and projects maps listed in batches (a scrape and a sync
/// round list them: several calls past the first batch's 1,024 keys) hold
/// exactly the keys a listing key by key finds.
#[test]
fn batched_key_listings_are_the_key_by_key_ones() {
    let mut g = maps_only_guard();
    let roots: Vec<(u64, u64, u32, u32)> = (0..3000u64)
        .map(|i| {
            let dev = libc::makedev(7, (i % 3) as u32);
            (dev, 1000 + i, 1, 5000 + (i % 1500) as u32)
        })
        .collect();
    g.set_roots(&roots).unwrap();
    let batched: std::collections::HashSet<GuardRootKey> = g
        .keys::<GuardRootKey, RawRoot, _>(MAP_ROOTS, no_fallback)
        .unwrap();
    let one_by_one: std::collections::HashSet<GuardRootKey> =
        BpfHashMap::<&MapData, GuardRootKey, RawRoot>::try_from(g.ebpf.map(MAP_ROOTS).unwrap())
            .unwrap()
            .keys()
            .collect::<Result<_, _>>()
            .unwrap();
    assert_eq!(batched.len(), 3000);
    assert_eq!(batched, one_by_one);
    let batched: std::collections::HashSet<GuardProject> = g
        .keys::<GuardProject, u32, _>(MAP_PROJECTS, no_fallback)
        .unwrap();
    let one_by_one: std::collections::HashSet<GuardProject> =
        BpfHashMap::<&MapData, GuardProject, u32>::try_from(g.ebpf.map(MAP_PROJECTS).unwrap())
            .unwrap()
            .keys()
            .collect::<Result<_, _>>()
            .unwrap();
    assert_eq!(batched.len(), 1500, "every (device, project) pair once");
    assert_eq!(batched, one_by_one);
    assert_eq!(g.read().unwrap().projects.len(), 1500);
}

/// A guard with its maps and no programs attached (the host allows maps).
/// Never a silent pass: a host that cannot make them fails the test.
fn maps_only_guard() -> Guard {
    let (loader, btf) = kernel_btf().unwrap_or_else(|e| {
        panic!("this test reads real BPF maps and needs the kernel's BTF: {e}")
    });
    Guard::open(
        loader,
        &btf,
        &LoadOptions::default(),
        GuardMode::Detect,
        Variant::Helpers,
        DETECT_FILEATTR,
        None,
    )
    .unwrap_or_else(|e| panic!("this test needs BPF maps: run it as root (or with CAP_BPF): {e}"))
}

/// The one-by-one listing a batched one must not fall back to here.
fn no_fallback<C>() -> Result<C, aya::maps::MapError> {
    panic!("the kernel has batch lookups for hash maps since 5.6")
}

fn kernel_roots(g: &Guard) -> Vec<(GuardRootKey, RawRoot)> {
    let m: BpfHashMap<&MapData, GuardRootKey, RawRoot> =
        BpfHashMap::try_from(g.ebpf.map(MAP_ROOTS).unwrap()).unwrap();
    let mut v: Vec<(GuardRootKey, RawRoot)> = m.iter().map(Result::unwrap).collect();
    v.sort();
    v
}

/// The one list of the guard's BPF LSM programs (which a pinned guard's
/// link pins are judged by, in the exporter and in `prjquota check`) is
/// exactly guard.c's, section for section.
#[test]
fn the_lsm_programs_are_guard_c_s() {
    let c = include_str!("../bpf/guard.c");
    let mut in_c: Vec<(String, String)> = Vec::new();
    let mut lines = c.lines();
    while let Some(l) = lines.next() {
        let Some(section) = l
            .strip_prefix("SEC(\"")
            .and_then(|s| s.strip_suffix("\")"))
            .filter(|s| s.starts_with("lsm"))
        else {
            continue;
        };
        let next = lines.next().expect("a program after its SEC");
        let prog = next
            .split_once("BPF_PROG(")
            .and_then(|(_, r)| r.split(',').next())
            .unwrap_or_else(|| panic!("a BPF_PROG after SEC(\"{section}\"): {next}"));
        in_c.push((prog.to_string(), section.to_string()));
    }
    let mut listed: Vec<(String, String)> = prjquota_core::guard_contract::LSM_HOOKS
        .iter()
        .flat_map(|h| h.variants.iter())
        .map(|&(p, s)| (p.to_string(), s.to_string()))
        .collect();
    in_c.sort();
    listed.sort();
    assert_eq!(in_c, listed);
    for (prog, _) in &in_c {
        assert!(is_lsm_program(prog), "{prog}");
    }
    assert!(!is_lsm_program(DETECT_FILEATTR.parts[0].prog));
}
