//! Host unit tests: pure logic, the C/Rust layout contract, the load error
//! on a host that refuses fentry/fexit, and the maps (which the host does
//! allow) driven from userspace. Counting itself is tested in the VM
//! (tests/tests/ebpf.rs).

use std::collections::HashMap;

use aya::maps::HashMap as BpfHashMap;

use super::*;
use crate::raw::RootKey;

#[test]
fn errno_buckets() {
    assert_eq!(ErrnoBucket::from_errno(libc::ENOSPC), ErrnoBucket::Enospc);
    assert_eq!(ErrnoBucket::from_errno(libc::EDQUOT), ErrnoBucket::Edquot);
    assert_eq!(ErrnoBucket::from_errno(libc::EIO), ErrnoBucket::Eio);
    assert_eq!(ErrnoBucket::from_errno(libc::EROFS), ErrnoBucket::Erofs);
    for other in [libc::EPERM, libc::EFBIG, libc::EINTR, libc::EAGAIN, 0, 4095] {
        assert_eq!(
            ErrnoBucket::from_errno(other),
            ErrnoBucket::Other,
            "{other}"
        );
    }
    let labels: Vec<&str> = ErrnoBucket::ALL.iter().map(|b| b.label()).collect();
    assert_eq!(labels, ["ENOSPC", "EDQUOT", "EIO", "EROFS", "other"]);
    // ALL is in index order: errors[i] is ALL[i].
    for (i, b) in ErrnoBucket::ALL.iter().enumerate() {
        assert_eq!(b.index(), i);
    }
}

#[test]
fn errno_values_in_kernel_h_match_libc() {
    let h = defines(include_str!("bpf/kernel.h"));
    assert_eq!(h["EIO"], libc::EIO as u64);
    assert_eq!(h["EAGAIN"], libc::EAGAIN as u64);
    assert_eq!(h["ENOSPC"], libc::ENOSPC as u64);
    assert_eq!(h["EROFS"], libc::EROFS as u64);
    assert_eq!(h["EDQUOT"], libc::EDQUOT as u64);
    assert_eq!(h["IOCB_NOWAIT"], libc::RWF_NOWAIT as u64);
    assert_eq!(h["XFS_SUPER_MAGIC"], 0x5846_5342);
}

#[test]
fn kernel_dev_encoding() {
    // Userspace st_dev (glibc makedev) vs the kernel's MKDEV.
    let cases: [(u32, u32, u64, u64); 6] = [
        (0, 0, 0, 0),
        (7, 0, 0x700, 0x70_0000),       // loop0
        (8, 17, 0x811, 0x80_0011),      // sdb1
        (0, 45, 0x2d, 0x2d),            // anonymous (tmpfs, overlay)
        (259, 1, 0x10301, 0x1030_0001), // nvme0n1p1: major > 255
        (7, 300, 0x10_072c, 0x70_012c), // loop300: minor > 255
    ];
    for (major, minor, st_dev, kdev) in cases {
        assert_eq!(libc::makedev(major, minor), st_dev, "{major}:{minor}");
        assert_eq!(kernel_dev(st_dev), Some(kdev), "{major}:{minor}");
    }
    // Beyond the kernel's 12-bit major / 20-bit minor: no kernel dev_t.
    assert_eq!(kernel_dev(libc::makedev(4096, 0)), None);
    assert_eq!(kernel_dev(libc::makedev(0, 1 << 20)), None);
}

#[test]
fn mode_parses() {
    assert_eq!("off".parse::<Mode>(), Ok(Mode::Off));
    assert_eq!("Auto".parse::<Mode>(), Ok(Mode::Auto));
    assert_eq!("required".parse::<Mode>(), Ok(Mode::Required));
    assert!("on"
        .parse::<Mode>()
        .unwrap_err()
        .contains("off, auto or required"));
    for m in [Mode::Off, Mode::Auto, Mode::Required] {
        assert_eq!(m.to_string().parse::<Mode>(), Ok(m));
    }
    assert_eq!(Mode::default(), Mode::Auto);
    assert!(WriteTelemetry::start(Mode::Off, &LoadOptions::default())
        .unwrap()
        .is_none());
}

#[test]
fn counters_arithmetic() {
    let mut a = VolumeCounters::default();
    a.add(&RawCounters {
        bytes: 10,
        ops: 2,
        errors: [1, 0, 0, 0, 3],
    });
    a.add(&RawCounters {
        bytes: 5,
        ops: 1,
        errors: [1, 1, 0, 0, 0],
    });
    assert_eq!(a.written_bytes, 15);
    assert_eq!(a.write_ops, 3);
    assert_eq!(a.errors(ErrnoBucket::Enospc), 2);
    assert_eq!(a.errors(ErrnoBucket::Other), 3);
    assert_eq!(a.errors_total(), 6);
    let d = a.since(&VolumeCounters {
        written_bytes: 5,
        write_ops: 1,
        errors: [1, 0, 0, 0, 0],
    });
    assert_eq!((d.written_bytes, d.write_ops, d.errors_total()), (10, 2, 5));
    assert_eq!(a.errors_by_bucket().count(), 5);
}

/// `#define NAME VALUE` lines of a C header.
pub(crate) fn defines(header: &str) -> HashMap<String, u64> {
    header
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            if w.next()? != "#define" {
                return None;
            }
            let name = w.next()?.to_string();
            let value = w.next()?;
            let v = if let Some(hex) = value.strip_prefix("0x") {
                u64::from_str_radix(hex, 16).ok()?
            } else {
                value.parse().ok()?
            };
            Some((name, v))
        })
        .collect()
}

#[test]
fn header_matches_rust() {
    let h = defines(include_str!("bpf/shared.h"));
    let expect: [(&str, u64); 19] = [
        ("BUCKET_ENOSPC", raw::BUCKET_ENOSPC as u64),
        ("BUCKET_EDQUOT", raw::BUCKET_EDQUOT as u64),
        ("BUCKET_EIO", raw::BUCKET_EIO as u64),
        ("BUCKET_EROFS", raw::BUCKET_EROFS as u64),
        ("BUCKET_OTHER", raw::BUCKET_OTHER as u64),
        ("N_BUCKETS", raw::N_BUCKETS as u64),
        ("UNATTR_OTHER_FS", raw::UNATTR_OTHER_FS as u64),
        ("UNATTR_OUTSIDE", raw::UNATTR_OUTSIDE as u64),
        ("UNATTR_WALK_LIMIT", raw::UNATTR_WALK_LIMIT as u64),
        ("UNATTR_MAP_FULL", raw::UNATTR_MAP_FULL as u64),
        ("N_UNATTR", raw::N_UNATTR as u64),
        ("GEN_RENAMES", raw::GEN_RENAMES as u64),
        ("GEN_ROOTS", raw::GEN_ROOTS as u64),
        ("GEN_CACHE_ON", raw::GEN_CACHE_ON as u64),
        ("N_GEN", raw::N_GEN as u64),
        ("MAX_DEPTH", raw::MAX_DEPTH as u64),
        ("MAX_ROOTS", raw::MAX_ROOTS as u64),
        ("MAX_VOLUMES", raw::MAX_VOLUMES as u64),
        ("MAX_DEVS", raw::MAX_DEVS as u64),
    ];
    for (name, value) in expect {
        assert_eq!(h.get(name), Some(&value), "{name} in shared.h");
    }
    assert_eq!(std::mem::size_of::<RootKey>(), 16);
    assert_eq!(std::mem::size_of::<RawCounters>(), 8 * (2 + raw::N_BUCKETS));
}

#[test]
fn object_is_embedded_and_aligned() {
    let obj = raw::object();
    assert_eq!(&obj[..4], b"\x7fELF");
    assert_eq!(obj.as_ptr() as usize % 8, 0);
}

#[test]
fn telemetry_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<WriteTelemetry>();
    check::<LoadError>();
}

/// On a machine that refuses fentry/fexit (the development host: EPERM by
/// sandbox policy although BTF exists) `load` must fail, not panic, and say
/// why for every program. Where tracing is allowed it must attach all.
#[test]
fn load_outcome_names_the_reason() {
    match WriteTelemetry::load() {
        Ok(t) => {
            eprintln!("fentry/fexit allowed here: {:?}", t.programs());
            assert!(
                t.programs().iter().all(|(_, attached)| *attached),
                "{:?}",
                t.failures()
            );
        }
        Err(e) => {
            let text = e.to_string();
            eprintln!("load refused ({}): {text}", e.reason());
            assert_ne!(e.reason(), "other", "{text}");
            if std::path::Path::new(KERNEL_BTF).exists() {
                assert!(!matches!(e, LoadError::NoBtf { .. }));
            } else {
                assert_eq!(e.reason(), "no_btf");
                return;
            }
            if let LoadError::NoProgram { failures, .. } = &e {
                assert_eq!(failures.len(), HOOKS.len(), "{text}");
                for hook in HOOKS {
                    assert!(
                        text.contains(hook.name),
                        "{} missing from: {text}",
                        hook.name
                    );
                }
            }
            if e.reason() == "permission" {
                assert!(text.contains("EPERM") || text.contains("EACCES"), "{text}");
                assert!(text.contains("permission denied"), "{text}");
            }
        }
    }
}

/// Writes `per_cpu(cpu)` into every CPU's share of slot `index` of the
/// counters array, as the programs would count.
fn set_counters(t: &mut WriteTelemetry, index: u32, per_cpu: impl Fn(usize) -> RawCounters) {
    let ncpu = aya::util::nr_cpus().unwrap();
    let mut m: PerCpuArray<&mut MapData, RawCounters> =
        PerCpuArray::try_from(t.ebpf.map_mut(MAP_COUNTERS).unwrap()).unwrap();
    let values: Vec<RawCounters> = (0..ncpu).map(per_cpu).collect();
    m.set(index, aya::maps::PerCpuValues::try_from(values).unwrap(), 0)
        .unwrap();
}

/// The write-telemetry object's maps on this kernel, without programs (the
/// host allows maps, not fentry/fexit). The host pass runs as root on a
/// kernel with BTF, as CI's does: where the maps cannot be made the test
/// fails, naming why, rather than passing untested.
fn open_maps(opts: &LoadOptions) -> WriteTelemetry {
    let (_, btf) = kernel_btf().unwrap_or_else(|e| {
        panic!("this test reads real BPF maps and needs the kernel's BTF: {e}")
    });
    WriteTelemetry::open(opts.variant.unwrap_or(Variant::Helpers), &btf, opts).unwrap_or_else(|e| {
        panic!("this test needs BPF maps: run it as root (or with CAP_BPF): {e}")
    })
}

/// The maps without programs (the host allows maps, not fentry/fexit):
/// set_roots replaces content, read sums per-CPU values, stale indexes lose
/// their counters.
#[test]
fn roots_and_counters_through_real_maps() {
    let mut t = open_maps(&LoadOptions::default());
    let loop0 = libc::makedev(7, 0);
    let nvme = libc::makedev(259, 3);
    let u = t
        .set_roots(&[(loop0, 128, 1), (loop0, 129, 2), (nvme, 128, 3)])
        .unwrap();
    // Each index is new: its counters are zeroed before its root goes in.
    assert_eq!(
        (u.added, u.changed, u.removed, u.pruned_counters),
        (3, 0, 0, 3)
    );
    assert_eq!(
        kernel_map_roots(&t),
        [
            (
                RootKey {
                    dev: 7 << 20,
                    ino: 128
                },
                1
            ),
            (
                RootKey {
                    dev: 7 << 20,
                    ino: 129
                },
                2
            ),
            (
                RootKey {
                    dev: (259 << 20) | 3,
                    ino: 128
                },
                3
            ),
        ]
    );
    assert_eq!(kernel_map_devs(&t), [(7 << 20, 2), ((259 << 20) | 3, 1)]);

    // Fake per-CPU counters for indexes 1 and 2, as the programs would.
    let ncpu = aya::util::nr_cpus().unwrap();
    for index in [1u32, 2] {
        set_counters(&mut t, index, |cpu| RawCounters {
            bytes: 100 * index as u64 + cpu as u64,
            ops: 1,
            errors: [index as u64, 0, 0, 0, 1],
        });
    }
    let c = t.read().unwrap();
    let n = ncpu as u64;
    let cpu_sum = n * (n - 1) / 2;
    assert_eq!(c.volumes.keys().copied().collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(c.volume(1).written_bytes, 100 * n + cpu_sum);
    assert_eq!(c.volume(2).written_bytes, 200 * n + cpu_sum);
    assert_eq!(c.volume(2).write_ops, n);
    assert_eq!(c.volume(2).errors(ErrnoBucket::Enospc), 2 * n);
    assert_eq!(c.volume(2).errors(ErrnoBucket::Other), n);
    assert_eq!(c.volume(3), VolumeCounters::default());
    assert_eq!(c.unattributed, Unattributed::default());

    // Replace: index 2's root goes, root 129 now belongs to 1, nvme stays.
    // No index is new, so no counters are zeroed.
    let u = t
        .set_roots(&[(loop0, 128, 1), (loop0, 129, 1), (nvme, 128, 3)])
        .unwrap();
    assert_eq!(
        (u.added, u.changed, u.removed, u.pruned_counters),
        (0, 1, 0, 0)
    );
    let c = t.read().unwrap();
    assert_eq!(c.volumes.keys().copied().collect::<Vec<_>>(), [1, 3]);
    assert_eq!(
        c.volume(1).written_bytes,
        100 * n + cpu_sum,
        "index 1 kept its counters"
    );

    // Same content again: nothing to do.
    let u = t
        .set_roots(&[(nvme, 128, 3), (loop0, 129, 1), (loop0, 128, 1)])
        .unwrap();
    assert_eq!(u, RootsUpdate::default());

    // Index 2 back, for another root: it starts from zero.
    let u = t
        .set_roots(&[(loop0, 128, 1), (loop0, 129, 2), (nvme, 128, 3)])
        .unwrap();
    assert_eq!((u.changed, u.pruned_counters), (1, 1));
    assert_eq!(t.read().unwrap().volume(2), VolumeCounters::default());
    assert_eq!(t.read().unwrap().volume(1).written_bytes, 100 * n + cpu_sum);

    // The nvme device's only root goes: the device leaves root_devs.
    let u = t.set_roots(&[(loop0, 128, 1)]).unwrap();
    assert_eq!((u.removed, u.pruned_counters), (2, 0));
    assert_eq!(kernel_map_devs(&t), [(7 << 20, 1)]);

    // Empty: everything goes.
    let u = t.set_roots(&[]).unwrap();
    assert_eq!((u.removed, u.pruned_counters), (1, 0));
    assert!(kernel_map_roots(&t).is_empty());
    assert!(kernel_map_devs(&t).is_empty());
    assert!(t.read().unwrap().volumes.is_empty());

    // Limits are checked before touching the maps.
    let many: Vec<(u64, u64, u32)> = (0..raw::MAX_DEVS as u64 + 1)
        .map(|i| (libc::makedev(8, i as u32), 2, 0))
        .collect();
    assert!(matches!(
        t.set_roots(&many),
        Err(TelemetryError::TooManyDevices { .. })
    ));
}

fn kernel_map_roots(t: &WriteTelemetry) -> Vec<(RootKey, u32)> {
    let m: BpfHashMap<&MapData, RootKey, u32> =
        BpfHashMap::try_from(t.ebpf.map(MAP_ROOTS).unwrap()).unwrap();
    let mut v: Vec<(RootKey, u32)> = m.iter().map(Result::unwrap).collect();
    v.sort();
    v
}

fn kernel_map_devs(t: &WriteTelemetry) -> Vec<(u64, u32)> {
    let m: BpfHashMap<&MapData, u64, u32> =
        BpfHashMap::try_from(t.ebpf.map(MAP_ROOT_DEVS).unwrap()).unwrap();
    let mut v: Vec<(u64, u32)> = m.iter().map(Result::unwrap).collect();
    v.sort();
    v
}

#[test]
fn skipped_runs_are_unknown_where_the_kernel_did_not_fill_them() {
    use aya_obj::generated::bpf_prog_info;
    let mut info = super::raw::zeroed_prog_info();
    info.recursion_misses = 7;
    let whole = std::mem::size_of::<bpf_prog_info>();
    assert_eq!(super::recursion_misses(&info, whole), Some(7));
    // Linux 5.10 fills the struct up to run_cnt: unknown, not zero.
    let up_to_run_cnt = std::mem::offset_of!(bpf_prog_info, run_cnt) + 8;
    assert_eq!(super::recursion_misses(&info, up_to_run_cnt), None);
}

/// The volume counters are read a batch of slots at a time: indexes on
/// both sides of a batch's edge, and far apart, each get their own sums;
/// an index past the array's end reads as zeros.
#[test]
fn counters_read_in_batches_land_at_their_index() {
    let mut t = open_maps(&LoadOptions {
        max_volumes: 1000,
        ..LoadOptions::default()
    });
    let loop0 = libc::makedev(7, 0);
    let indexes = [0u32, 255, 256, 257, 600, 999, 1000];
    let roots: Vec<(u64, u64, u32)> = indexes
        .iter()
        .map(|&i| (loop0, 1000 + i as u64, i))
        .collect();
    t.set_roots(&roots).unwrap();
    let ncpu = aya::util::nr_cpus().unwrap();
    for &index in indexes.iter().filter(|&&i| i < 1000) {
        set_counters(&mut t, index, |cpu| RawCounters {
            bytes: 1000 * index as u64 + cpu as u64,
            ops: 1,
            ..RawCounters::default()
        });
    }
    let c = t.read().unwrap();
    let n = ncpu as u64;
    assert_eq!(c.volumes.keys().copied().collect::<Vec<_>>(), indexes);
    for &index in indexes.iter().filter(|&&i| i < 1000) {
        assert_eq!(
            c.volume(index).written_bytes,
            1000 * index as u64 * n + n * (n - 1) / 2,
            "index {index}"
        );
        assert_eq!(c.volume(index).write_ops, n, "index {index}");
    }
    assert_eq!(c.volume(1000), VolumeCounters::default(), "past the end");
}
