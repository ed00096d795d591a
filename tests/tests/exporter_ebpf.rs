//! The real `prjquota-exporter` binary's eBPF write telemetry on Debian's
//! kernel, against volumes the real plugin made, on XFS and on ext4: bytes
//! and write calls are counted exactly for the volume written to and for no
//! other, quota refusals appear under the errno the filesystem returns
//! (ENOSPC on XFS, EDQUOT on ext4), volumes created after start-up are
//! counted from their first write and deleted ones vanish, and writes made
//! the moment the exporter says it is ready are counted: no warm-up.
//!
//! Run in the VM:
//!
//! ```sh
//! cargo xtask test --vm-only --filter 'binary(exporter_ebpf)'   # add --kernel 5.10|6.12|7 for another kernel
//! ```

use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use prjquota_ebpf::ErrnoBucket;
use prjquota_vmtests::dm::DmDisk;
use prjquota_vmtests::fixture::{fill, writable, FsCase, MIB, WRITER, XFS};
use prjquota_vmtests::nomad::Spec;
use prjquota_vmtests::on_every_fs;
use prjquota_vmtests::prom::{Exporter, Exposition, UNGUARDED};

on_every_fs!(
    counts_exact_writes_and_quota_refusals_per_volume,
    writes_right_after_the_exporter_is_ready_count_exactly,
    the_self_test_passes_and_fails_a_hook_that_miscounts,
    direct_writes_in_flight_while_another_exporter_attaches_are_reported,
    a_buffered_write_held_while_another_exporter_attaches_is_reported,
);

const NODE_POOL: &str = "default";
const ATTACHED: &str = "prjquota_exporter_ebpf_program_attached";
const BYTES: &str = "nomad_host_volume_written_bytes_total";
const OPS: &str = "nomad_host_volume_write_operations_total";
const ERRORS: &str = "nomad_host_volume_write_errors_total";
const MISSED: &str = "prjquota_exporter_ebpf_program_missed_runs_total";
const UNFINISHED: &str = "prjquota_exporter_ebpf_unfinished_direct_writes";
const UNFINISHED_BUFFERED: &str = "prjquota_exporter_ebpf_unfinished_buffered_writes";
const LOST_BUFFERED: &str = "prjquota_exporter_ebpf_lost_buffered_writes_total";

/// What the exporter says of one volume.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counted {
    bytes: u64,
    ops: u64,
    /// In [`ErrnoBucket::ALL`] order.
    errors: [u64; 5],
}

impl Counted {
    fn since(&self, before: &Counted) -> Counted {
        let mut errors = [0; 5];
        for (i, e) in errors.iter_mut().enumerate() {
            *e = self.errors[i] - before.errors[i];
        }
        Counted {
            bytes: self.bytes - before.bytes,
            ops: self.ops - before.ops,
            errors,
        }
    }

    fn error(&self, b: ErrnoBucket) -> u64 {
        self.errors[ErrnoBucket::ALL.iter().position(|x| *x == b).unwrap()]
    }
}

fn labels(spec: &Spec) -> [(&str, &str); 3] {
    [
        ("namespace", spec.namespace.as_str()),
        ("node_pool", NODE_POOL),
        ("volume_id", spec.id.as_str()),
    ]
}

/// The volume's counters; panics unless its bytes and operations series
/// are there. An errno's series exists only once a write failed with it,
/// and never at 0 (a zero series carries nothing the written-bytes series
/// does not say).
fn published(e: &Exposition, spec: &Spec) -> Counted {
    let l = labels(spec);
    let mut errors = [0; 5];
    for (i, b) in ErrnoBucket::ALL.iter().enumerate() {
        let mut with = l.to_vec();
        with.push(("errno", b.label()));
        if let Some(n) = e.get(ERRORS, &with) {
            assert!(n > 0.0, "a zero {ERRORS} series for {}: {with:?}", spec.id);
            errors[i] = n as u64;
        }
    }
    assert!(
        e.find(ERRORS, &l).count() <= 5,
        "at most one series per errno bucket for {}",
        spec.id
    );
    Counted {
        bytes: e.value(BYTES, &l) as u64,
        ops: e.value(OPS, &l) as u64,
        errors,
    }
}

/// Every program the exporter reports, with its value.
fn programs(e: &Exposition) -> Vec<(String, f64)> {
    e.find(ATTACHED, &[])
        .map(|s| (s.label("program").unwrap_or_default().to_string(), s.value))
        .collect()
}

/// Scrapes until every program is attached and every volume in `specs`
/// has its counters (the roots are registered), and returns that scrape.
fn until_counting(exp: &Exporter, specs: &[&Spec]) -> Exposition {
    let start = Instant::now();
    loop {
        let e = exp.scrape();
        let attached = programs(&e);
        let all_attached = !attached.is_empty() && attached.iter().all(|(_, v)| *v == 1.0);
        let all_counted = specs.iter().all(|s| e.get(BYTES, &labels(s)).is_some());
        if all_attached && all_counted {
            eprintln!(
                "MEASURE ebpf_counting_after_seconds {:.2}",
                start.elapsed().as_secs_f64()
            );
            return e;
        }
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "write telemetry not counting after 180s: programs {attached:?}\n{}\n{}",
            e.text,
            exp.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Writes `sizes` with one write(2) each into a new file; returns the total.
fn write_calls(path: &Path, sizes: &[usize]) -> u64 {
    let mut f = std::fs::File::create(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    for &n in sizes {
        let buf = vec![b'w'; n];
        assert_eq!(f.write(&buf).unwrap(), n, "a short write(2)");
    }
    sizes.iter().map(|&n| n as u64).sum()
}

fn counts_exact_writes_and_quota_refusals_per_volume(fs: &FsCase) {
    let f = fs.fixture("exporter-ebpf");
    // A is writable by WRITER: ext4 lets root past a project quota.
    let spec_a = writable(Spec::new("ebpf-a", (8 * MIB) as i64));
    let spec_b = Spec::new("ebpf-b", (8 * MIB) as i64);
    let (path_a, _) = f.create(&spec_a);
    let (path_b, _) = f.create(&spec_b);

    let exp = Exporter::start_with(&[&f.node.volumes_dir], &UNGUARDED);
    let before = until_counting(&exp, &[&spec_a, &spec_b]);
    for (program, v) in programs(&before) {
        assert_eq!(v, 1.0, "{program} not attached:\n{}", exp.log());
    }
    assert!(
        before
            .find("prjquota_exporter_ebpf_detached_reason", &[])
            .next()
            .is_none(),
        "{}",
        before.text
    );
    for reason in ["other_filesystems", "outside_roots", "walk_limit"] {
        before.value(
            "prjquota_exporter_ebpf_unattributed_writes_total",
            &[("reason", reason)],
        );
    }
    let (a0, b0) = (published(&before, &spec_a), published(&before, &spec_b));

    // Exactly N bytes in M write(2) calls, into a file two directories down.
    let nested = path_a.join("sub/deeper");
    std::fs::create_dir_all(&nested).unwrap();
    let sizes = [1, 4096, 65_536, 100_000, 3, 12_345, 7_777];
    let n = write_calls(&nested.join("data"), &sizes);
    let m = sizes.len() as u64;
    let e = exp.scrape();
    let (da, db) = (
        published(&e, &spec_a).since(&a0),
        published(&e, &spec_b).since(&b0),
    );
    eprintln!("{}: wrote {n} bytes in {m} calls; A moved {da:?}", fs.name);
    assert_eq!(
        da,
        Counted {
            bytes: n,
            ops: m,
            errors: [0; 5]
        },
        "volume A"
    );
    assert_eq!(db, Counted::default(), "volume B was not written to");

    // Past the limit: XFS refuses root too (ENOSPC); ext4 only a writer
    // without CAP_SYS_RESOURCE (EDQUOT).
    let uid = (fs.name != XFS.name).then_some(WRITER);
    let a1 = published(&e, &spec_a);
    let b1 = published(&e, &spec_b);
    let filled = fill(&path_a.join("blob"), 16 * MIB, uid);
    assert_eq!(filled.errno, Some(fs.full_errno), "{filled:?}");
    let e = exp.scrape();
    let (da, db) = (
        published(&e, &spec_a).since(&a1),
        published(&e, &spec_b).since(&b1),
    );
    let bucket = ErrnoBucket::from_errno(fs.full_errno);
    eprintln!(
        "{}: fill as {uid:?} wrote {} then {}; A moved {da:?}",
        fs.name,
        filled.written,
        bucket.label()
    );
    assert_eq!(da.bytes, filled.written);
    assert!(da.ops >= filled.written.div_ceil(MIB), "{da:?}");
    assert_eq!(da.error(bucket), 1, "one refused write(2): {da:?}");
    assert_eq!(
        da.errors.iter().sum::<u64>(),
        1,
        "no other errno moved: {da:?}"
    );
    assert_eq!(db, Counted::default(), "volume B was not written to");

    // A volume created while the exporter runs is counted from its first
    // write: the plugin announces it and waits, no scrape in between.
    let spec_c = Spec::new("ebpf-c", (8 * MIB) as i64);
    let (path_c, _) = f.create(&spec_c);
    let n = write_calls(&path_c.join("new"), &[5000, 5000]);
    let e = exp.scrape();
    assert_eq!(
        published(&e, &spec_c),
        Counted {
            bytes: n,
            ops: 2,
            errors: [0; 5]
        },
        "volume C, written the moment its create returned\n{}",
        exp.log()
    );
    assert_eq!(
        e.value(
            "prjquota_exporter_announcements_total",
            &[("result", "registered")]
        ),
        1.0,
        "{}",
        exp.log()
    );

    // A deleted volume's series vanish; the others stay.
    f.node.delete(&spec_b).ok();
    assert!(!path_b.exists());
    let e = exp.scrape();
    assert!(
        !e.text.contains(&spec_b.id),
        "the deleted volume is still exported:\n{}",
        e.text
    );
    let live: BTreeSet<&str> = e
        .find(BYTES, &[])
        .filter_map(|s| s.label("volume_id"))
        .collect();
    assert_eq!(
        live,
        BTreeSet::from([spec_a.id.as_str(), spec_c.id.as_str()]),
        "{}",
        e.text
    );
    assert!(e.value(BYTES, &labels(&spec_a)) as u64 >= a1.bytes + filled.written);
    e.assert_collectors_succeeded(&exp.log());
}

/// `--ebpf=required` starts (every program attached), and `--ebpf=off`
/// reports the same programs, detached as `disabled`: the exporter's list
/// for when nothing is loaded matches the crate's.
#[test]
fn required_attaches_everything_and_off_lists_the_same_programs() {
    let f = XFS.fixture("exporter-ebpf-modes");
    let spec = Spec::new("ebpf-modes", (8 * MIB) as i64);
    f.create(&spec);

    let required =
        Exporter::start_with(&[&f.node.volumes_dir], &["--ebpf=required", "--guard=off"]);
    let e = until_counting(&required, &[&spec]);
    let attached = programs(&e);
    assert!(
        attached.iter().all(|(_, v)| *v == 1.0),
        "{attached:?}\n{}",
        required.log()
    );
    drop(required);

    let off = Exporter::start_with(&[&f.node.volumes_dir], &["--ebpf=off", "--guard=off"]);
    let e = off.scrape();
    let names = |p: &[(String, f64)]| p.iter().map(|(n, _)| n.clone()).collect::<BTreeSet<_>>();
    let detached = programs(&e);
    assert_eq!(names(&detached), names(&attached));
    assert!(detached.iter().all(|(_, v)| *v == 0.0), "{detached:?}");
    assert_eq!(
        e.value(
            "prjquota_exporter_ebpf_detached_reason",
            &[("reason", "disabled")]
        ),
        1.0
    );
    assert!(e.get(BYTES, &labels(&spec)).is_none(), "{}", e.text);
    assert_eq!(e.value("prjquota_exporter_volumes", &[]), 1.0);
}

/// `size` bytes in 4 KiB requests by fio through `engine` (buffered ones
/// end with an fsync): an independent writer.
fn fio_write(p: &Path, engine: &str, direct: bool, size: u64) {
    prjquota_vmtests::fixture::fio(p, engine, direct, size, !direct);
}

/// The first second: the exporter has just said ready (`/healthz` 200,
/// which [`Exporter::start`] waits for and nothing more), and three
/// volumes take 5, 10 and 20 MiB at once, buffered with fsync, O_DIRECT
/// and io_uring O_DIRECT. The very next scrape counts every byte and every
/// 4 KiB request, for the right volume (see [`assert_exact_or_reported`]). Then the same into three volumes
/// created while it runs, each written the moment its create returned.
fn writes_right_after_the_exporter_is_ready_count_exactly(fs: &FsCase) {
    let f = fs.fixture("exporter-ebpf-first");
    let cases: [(&str, &str, bool, u64); 3] = [
        ("first-buffered", "psync", false, 5 * MIB),
        ("first-direct", "psync", true, 10 * MIB),
        ("first-uring", "io_uring", true, 20 * MIB),
    ];
    let specs: Vec<(Spec, std::path::PathBuf)> = cases
        .iter()
        .map(|(name, ..)| {
            let spec = Spec::new(name, (32 * MIB) as i64);
            let (path, _) = f.create(&spec);
            (spec, path)
        })
        .collect();

    let exp = Exporter::start_with(&[&f.node.volumes_dir], &UNGUARDED);
    for ((_, engine, direct, size), (_, path)) in cases.iter().zip(&specs) {
        fio_write(&path.join("data"), engine, *direct, *size);
    }
    let e = exp.scrape();
    assert_exact_or_reported(
        fs,
        &e,
        &cases,
        &specs,
        uncounted(&e),
        "right after start-up",
        &exp,
    );

    // The same three writers into volumes created while the exporter runs,
    // each the moment its create returned (the plugin announced it).
    let uncounted_before = uncounted(&e);
    let late: Vec<(Spec, std::path::PathBuf)> = cases
        .iter()
        .map(|(name, engine, direct, size)| {
            let spec = Spec::new(&format!("late-{name}"), (32 * MIB) as i64);
            let (path, _) = f.create(&spec);
            fio_write(&path.join("data"), engine, *direct, *size);
            (spec, path)
        })
        .collect();
    let e = exp.scrape();
    assert_exact_or_reported(
        fs,
        &e,
        &cases,
        &late,
        uncounted(&e).saturating_sub(uncounted_before),
        "right after the create returned",
        &exp,
    );
}

/// O_DIRECT writers busy inside the hooked function while another exporter
/// starts and stops beside this one. Each of the other's attaches and
/// detaches on iomap_dio_complete makes the kernel rebuild the function's
/// trampoline, and the calls then inside it never run their fexit
/// programs, this exporter's included: those writes are never counted,
/// and the kernel reports no skipped run. The exporter must say so: once
/// the writers are done, every write is either counted for its volume or
/// in `prjquota_exporter_ebpf_unfinished_direct_writes`, exactly.
///
/// The volume's disk delays every write (dm-delay), and each write is
/// O_SYNC and extends its file, so that it spends most of its time inside
/// iomap_dio_complete, waiting for the log write its sync needs: four of
/// them and twelve rebuilds leave no rebuild without one inside, on the
/// kernels [`stages_a_lost_completion`] names.
fn direct_writes_in_flight_while_another_exporter_attaches_are_reported(fs: &FsCase) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    let disk = DmDisk::new(fs, "dio-inflight", 400 * MIB);
    let f = disk.fixture("dio-inflight");
    let spec = Spec::new("dio-inflight", (64 * MIB) as i64);
    let (path, _) = f.create(&spec);
    let exp = Exporter::start_with(&[&f.node.volumes_dir], &UNGUARDED);
    let other = fs.fixture("dio-inflight-other");
    disk.delay_writes(150);

    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..4)
        .map(|i| {
            let (stop, written) = (stop.clone(), written.clone());
            let file = path.join(format!("sync-{i}"));
            std::thread::spawn(move || {
                use std::os::unix::fs::{FileExt, OpenOptionsExt};
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .custom_flags(libc::O_DIRECT | libc::O_SYNC)
                    .open(&file)
                    .unwrap_or_else(|e| panic!("open {}: {e}", file.display()));
                // O_DIRECT wants a block-aligned buffer.
                let mut raw = vec![0x5au8; 8192];
                let at = raw.as_ptr().align_offset(4096);
                let buf = &mut raw[at..at + 4096];
                let mut offset = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let n = f
                        .write_at(buf, offset)
                        .unwrap_or_else(|e| panic!("write {}: {e}", file.display()));
                    assert_eq!(n, 4096, "a whole block");
                    offset += 4096;
                    written.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(500));
        let o = Exporter::start_with(
            &[&other.node.volumes_dir],
            &["--ebpf=required", "--guard=off"],
        );
        drop(o);
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().expect("a writer panicked");
    }
    disk.undelay();

    let e = exp.scrape();
    let written = written.load(Ordering::Relaxed);
    let got = published(&e, &spec);
    let unfinished = e.value(UNFINISHED, &[]) as u64;
    let skipped = skipped_runs(&e);
    eprintln!(
        "MEASURE ebpf_direct_writes_lost_in_rebuilds {unfinished} of {written} (counted {}, skipped runs {skipped})",
        got.ops
    );
    assert!(
        got.bytes == got.ops * 4096 && got.errors == [0; 5],
        "{got:?}\n{}",
        exp.log()
    );
    // A skipped fexit run is also unfinished; a skipped fentry run is in
    // neither the counters nor the gauge, only among the skipped runs.
    assert!(
        got.ops + unfinished <= written && written <= got.ops + unfinished + skipped,
        "{written} O_DIRECT writes: {} counted and {unfinished} reported unfinished ({skipped} skipped runs)\n{}\n{}",
        got.ops,
        e.text,
        exp.log()
    );
    if stages_a_lost_completion() {
        assert!(
            unfinished > 0,
            "no write was lost to the other exporter's trampoline rebuilds ({written} written): the test did not stage the transition it is for"
        );
    }
}

/// Whether the tests of writes in flight through another program's attach
/// lose writes to the rebuilds for certain on this kernel, and so must see
/// some reported. Before 7.x an O_SYNC writer spends its sync inside
/// iomap_dio_complete, on XFS and ext4 alike, and the kernel skips the
/// fexit programs of calls in flight (Debian's 5.10 carries upstream's
/// skipping). Debian's 7.x runs them: a buffered write held inside through
/// both rebuilds is counted (the held-write test stages it for certain).
/// There the tests check that every write is counted or reported, and
/// cannot insist that one was lost.
fn stages_a_lost_completion() -> bool {
    prjquota_vmtests::kernel_version() < (7, 0)
}

/// Writes the exporter says went uncounted: runs of the write hooks the
/// kernel skipped, writes whose end the hooks never saw (once the writers
/// are done, none is still running), and those found lost.
fn uncounted(e: &Exposition) -> u64 {
    skipped_runs(e)
        + e.value(UNFINISHED, &[]) as u64
        + e.value(UNFINISHED_BUFFERED, &[]) as u64
        + e.value(LOST_BUFFERED, &[]) as u64
}

/// A buffered write held inside the hooked function while another exporter
/// starts and stops beside this one: its page must be read from the
/// volume's disk, which is stalled (dm suspended, the filesystem not
/// frozen), so the writer waits inside iomap_file_buffered_write (XFS) or
/// generic_perform_write (ext4) through both of the other's trampoline
/// rebuilds. Before 7.x the kernel then skips this exporter's fexit for
/// it: the write is never counted, and
/// `prjquota_exporter_ebpf_unfinished_buffered_writes` must say so (the
/// writer is inside for certain). Debian's 7.x runs the fexit of a call
/// held through the rebuilds: there the write is counted, and nothing is
/// left unfinished. The same thread's next write counts exactly, and finds
/// the held write's start still in its slot where the kernel skipped its
/// end: that write moves from the gauge to
/// `prjquota_exporter_ebpf_lost_buffered_writes_total`.
fn a_buffered_write_held_while_another_exporter_attaches_is_reported(fs: &FsCase) {
    use std::os::unix::fs::FileExt;

    let disk = DmDisk::new(fs, "buf-held", 400 * MIB);
    let f = disk.fixture("buf-held");
    let spec = Spec::new("buf-held", (64 * MIB) as i64);
    let (path, _) = f.create(&spec);
    let file = path.join("held");
    std::fs::write(&file, vec![0x5au8; 4096]).unwrap();
    prjquota_vmtests::sh("sync");
    let exp = Exporter::start_with(&[&f.node.volumes_dir], &UNGUARDED);
    let other = fs.fixture("buf-held-other");
    let e = until_counting(&exp, &[&spec]);
    let before = published(&e, &spec);
    let unfinished_before = e.value(UNFINISHED_BUFFERED, &[]) as u64;
    let lost_before = e.value(LOST_BUFFERED, &[]) as u64;

    // Open first, so that only the file's page leaves the cache, not its
    // inode or extents: the write then waits for that page alone.
    let handle = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    prjquota_vmtests::sh("echo 1 > /proc/sys/vm/drop_caches");
    disk.suspend();
    // One byte inside the block: the rest of it must be read first. The
    // same thread writes again once told: its next write is the one that
    // finds the held write's start.
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (again_tx, again_rx) = std::sync::mpsc::channel::<()>();
    let writer = std::thread::spawn(move || {
        held_tx.send(handle.write_at(b"y", 1)).unwrap();
        if again_rx.recv().is_ok() {
            handle.write_at(&[0x5a; 4096], 4096).unwrap();
        }
    });
    let inside = wait_inside_buffered_write(Duration::from_secs(30));
    if inside.is_ok() {
        let o = Exporter::start_with(
            &[&other.node.volumes_dir],
            &["--ebpf=required", "--guard=off"],
        );
        drop(o);
    }
    disk.resume();
    let wrote = held_rx.recv().expect("the writer panicked");
    if let Err(stacks) = inside {
        panic!("the writer never waited inside a buffered-write hook; its threads' kernel stacks:\n{stacks}");
    }
    assert_eq!(wrote.expect("the held write"), 1);

    let e = exp.scrape();
    let at_held = published(&e, &spec);
    let held = at_held.since(&before);
    let unfinished = e.value(UNFINISHED_BUFFERED, &[]) as u64 - unfinished_before;
    eprintln!(
        "MEASURE ebpf_buffered_writes_lost_in_rebuilds {unfinished} of 1 (counted {}, skipped runs {})",
        held.ops,
        skipped_runs(&e)
    );
    let want = if stages_a_lost_completion() {
        (0, 1)
    } else {
        (1, 0)
    };
    assert_eq!(
        (held.ops, unfinished),
        want,
        "the held write: (counted, reported unfinished) on {:?}\n{}\n{}",
        prjquota_vmtests::kernel_version(),
        e.text,
        exp.log()
    );

    assert_eq!(e.value(LOST_BUFFERED, &[]) as u64, lost_before);

    again_tx.send(()).unwrap();
    writer.join().expect("the writer panicked");
    let e = exp.scrape();
    let after = published(&e, &spec).since(&at_held);
    assert_eq!(
        (after.ops, after.bytes),
        (1, 4096),
        "the write after the held one\n{}",
        exp.log()
    );
    assert_eq!(
        (
            e.value(UNFINISHED_BUFFERED, &[]) as u64 - unfinished_before,
            e.value(LOST_BUFFERED, &[]) as u64 - lost_before
        ),
        (0, unfinished),
        "the held write (unfinished, lost) once its thread wrote again\n{}",
        e.text
    );
}

/// Waits until a thread of this process sleeps inside one of the
/// buffered-write hooks' functions (its kernel stack names it); else the
/// kernel stacks of this process's threads.
fn wait_inside_buffered_write(timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut stacks = String::new();
        for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let stack = std::fs::read_to_string(t.path().join("stack")).unwrap_or_default();
            if stack.contains("iomap_file_buffered_write")
                || stack.contains("generic_perform_write")
            {
                return Ok(());
            }
            stacks.push_str(&format!("{}:\n{stack}", t.path().display()));
        }
        if Instant::now() > deadline {
            return Err(stacks);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs of the write hooks the kernel skipped, as the exporter reports them.
fn skipped_runs(e: &Exposition) -> u64 {
    e.find(MISSED, &[]).map(|s| s.value as u64).sum()
}

/// Each volume's 4 KiB writes are counted exactly, for the right volume;
/// or short by no more than the exporter reported uncounted: runs the
/// kernel skipped (a preemptible kernel, see
/// `prjquota_exporter_ebpf_program_missed_runs_total`), and O_DIRECT
/// completions whose end the hook never saw (another test's exporter
/// attaching beside this one rebuilds the hook's trampoline, see
/// `prjquota_exporter_ebpf_unfinished_direct_writes`). Never short in
/// silence, never over, never an error.
fn assert_exact_or_reported(
    fs: &FsCase,
    e: &Exposition,
    cases: &[(&str, &str, bool, u64)],
    specs: &[(Spec, std::path::PathBuf)],
    reported: u64,
    when: &str,
    exp: &Exporter,
) {
    let mut short = 0;
    for ((name, engine, direct, size), (spec, _)) in cases.iter().zip(specs) {
        let got = published(e, spec);
        eprintln!(
            "{}: {name} ({engine}, direct {direct}), {when}: {got:?}",
            fs.name
        );
        let ops = size / 4096;
        assert!(
            got.ops <= ops && got.bytes == got.ops * 4096 && got.errors == [0; 5],
            "{name}: writes made {when}: {got:?}, want {size} bytes in {ops} writes\n{}",
            exp.log()
        );
        short += ops - got.ops;
    }
    eprintln!("MEASURE ebpf_uncounted_writes {short} (reported uncounted {reported}) {when}");
    assert!(
        short <= reported,
        "{short} writes made {when} went uncounted, but the exporter reported only {reported} (skipped runs and unfinished writes)\n{}\n{}",
        e.text,
        exp.log()
    );
}

/// The start-up self-test, per hook this filesystem exercises: 1 with the
/// real programs, already on a node with no volume yet (the exporter makes
/// the registry's directory for its probe, root's and 0700 as the plugin
/// makes it, and the plugin then works in it); with the fault-injection
/// build, whose buffered-write hooks read half the return value, the
/// buffered hook fails and says so, and the O_DIRECT hook still passes. A
/// kernel that changes a hooked function shows up the same way, never as
/// silent zeros.
fn the_self_test_passes_and_fails_a_hook_that_miscounts(fs: &FsCase) {
    const SELFTEST: &str = "prjquota_exporter_ebpf_selftest_success";
    let f = fs.fixture("exporter-ebpf-selftest");
    // A fresh node: Nomad made the volumes directory, no plugin ran yet.
    std::fs::create_dir_all(&f.node.volumes_dir).unwrap();
    let registry = f.node.volumes_dir.join(".prjquota");
    assert!(!registry.exists(), "{}", registry.display());
    let buffered = if fs.name == XFS.name {
        "iomap_file_buffered_write"
    } else {
        "generic_perform_write"
    };
    let tested = |e: &Exposition| -> Vec<(String, f64)> {
        let mut v: Vec<(String, f64)> = e
            .find(SELFTEST, &[])
            .map(|s| (s.label("program").unwrap_or_default().to_string(), s.value))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };

    let exp = Exporter::start_with(&[&f.node.volumes_dir], &UNGUARDED);
    let e = exp.scrape();
    let mut want = vec![
        (buffered.to_string(), 1.0),
        ("iomap_dio_complete".to_string(), 1.0),
    ];
    want.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        tested(&e),
        want,
        "the self-test on a node with no volume yet\n{}",
        exp.log()
    );
    // The log names the build the kernel's offer chose.
    let build = if prjquota_vmtests::kernel_version() >= (5, 17) {
        "build=helpers"
    } else {
        "build=context"
    };
    assert!(exp.log().contains(build), "{build} in {}", exp.log());
    drop(exp);
    prjquota_vmtests::assert_made_as_the_registry(&registry);
    // The plugin in the registry the exporter began: a delete of a volume
    // it never made finds nothing to do, a create completes the registry.
    let spec = Spec::new("selftest", (8 * MIB) as i64);
    f.node.delete(&spec).ok();
    f.create(&spec);
    assert!(f.record(&spec.id).is_some(), "no record for {}", spec.id);

    let faulty = prjquota_vmtests::fault_exporter();
    let exp = Exporter::start_binary(&faulty, &[&f.node.volumes_dir], &UNGUARDED);
    let e = exp.scrape();
    let mut want = vec![
        (buffered.to_string(), 0.0),
        ("iomap_dio_complete".to_string(), 1.0),
    ];
    want.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(tested(&e), want, "{}", exp.log());
    assert!(
        exp.log().contains("eBPF self-test FAILED") && exp.log().contains(buffered),
        "{}",
        exp.log()
    );
}
