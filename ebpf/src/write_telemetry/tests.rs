//! Host unit tests of write telemetry: the embedded object, the load error
//! on a host that refuses fentry/fexit, and the maps (which the host does
//! allow) driven from userspace. Counting itself is tested in the VM
//! (tests/tests/ebpf.rs).

use aya::maps::HashMap as BpfHashMap;

use super::*;
use crate::loader::KERNEL_BTF;
use crate::raw::RootKey;
use crate::write_counters::{ErrnoBucket, Unattributed};

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

/// Both builds attach the same hook points, in the order `HOOK_NAMES`
/// publishes them.
#[test]
fn both_builds_name_the_published_hooks_in_order() {
    for variant in [Variant::Helpers, Variant::Context] {
        let names: Vec<&str> = variant.hooks().iter().map(|h| h.name).collect();
        assert_eq!(names, HOOK_NAMES, "{variant:?}");
    }
}
