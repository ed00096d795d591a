//! Sizes Nomad can trust: the bytes a create returns stay within the
//! request's `[capacity_min, capacity_max]` (Nomad's server refuses every
//! later update of a volume whose `capacity_max` is below the stored size).
//! Every create in the suite is also checked by the shared driver
//! (`nomad::assert_nomad_accepts`); these cases aim at the edges.
//!
//! Admission: the volumes' hard limits together never exceed
//! `overcommit_ratio × (filesystem size − bytes used outside volumes)`.
//! Those cases run on a small filesystem of their own, where nothing else
//! moves the figures.

use std::os::fd::AsFd;
use std::path::Path;

use prjquota_vmtests::fixture::{fill, Fixture, FsCase, SmallFs, MIB};
use prjquota_vmtests::nomad::Spec;
use prjquota_vmtests::on_every_fs;
use prjquota_vmtests::prom::Exporter;
use prjquota_vmtests::records::{add_volume, assert_ledger_agrees, read_records, trusted_ledger};

on_every_fs!(
    decimal_capacity_max_rounds_down_and_a_replay_returns_the_same_bytes,
    a_range_without_a_whole_block_is_refused_and_leaves_nothing,
    two_volumes_of_40_percent_fit_a_third_is_refused_and_a_ratio_of_2_admits_it,
    ten_concurrent_creates_of_15_percent_admit_only_what_fits,
    the_exporter_publishes_the_filesystem_the_promises_and_the_ratio,
    a_volume_on_a_nearly_full_filesystem_reports_the_room_left_on_it,
    a_ledger_stale_or_torn_behind_the_plugin_is_not_trusted,
);

const SMALL_FS: u64 = 320 * MIB;

/// `percent` of the filesystem's size, on the 4 KiB block below.
fn share(mount: &Path, percent: u64) -> u64 {
    let (size, ..) = prjquota_vmtests::fixture::statvfs(mount);
    (size * percent / 100) & !4095
}

/// The room the admission rule sees now: size minus what is used outside
/// the fixture's volumes (statfs used minus the volumes' quota usage).
fn room(f: &Fixture, mount: &Path, ids: &[String]) -> u64 {
    let dir = std::fs::File::open(mount).unwrap();
    let st = prjquota_core::sys::fstatfs(dir.as_fd()).unwrap();
    let frsize = st.f_frsize as u64;
    let size = st.f_blocks as u64 * frsize;
    let used = (st.f_blocks as u64 - st.f_bfree as u64) * frsize;
    let inside: u64 = ids
        .iter()
        .map(|id| f.quota(f.project_id(id)).used_bytes)
        .sum();
    size - (used - inside)
}

/// A refusal for capacity: clean JSON naming the request and the fix, and
/// nothing left behind.
fn assert_refused_for_capacity(f: &Fixture, spec: &Spec) -> String {
    let msg = f.node.create(spec).error();
    for needle in [
        format!("({} bytes)", spec.max),
        "already promised".to_string(),
        "filesystem holds".to_string(),
        "delete volumes, add disk".to_string(),
        "overcommit_ratio".to_string(),
    ] {
        assert!(msg.contains(&needle), "{needle:?} in {msg}");
    }
    assert!(!f.node.volumes_dir.join(&spec.id).exists(), "{msg}");
    assert!(f.record(&spec.id).is_none(), "no record after {msg}");
    msg
}

fn two_volumes_of_40_percent_fit_a_third_is_refused_and_a_ratio_of_2_admits_it(fs: &FsCase) {
    let small = SmallFs::new(fs, "admit", SMALL_FS);
    let f = small.fixture("admit");
    f.set_overcommit_ratio(1.0);
    let forty = share(&small.mount, 40);
    let a = Spec::new("a", forty as i64);
    let b = Spec::new("b", forty as i64);
    let c = Spec::new("c", forty as i64);
    f.create(&a);
    f.create(&b);
    let msg = assert_refused_for_capacity(&f, &c);
    assert!(msg.contains("overcommit_ratio = 1"), "{msg}");

    // A grow past the total is refused and the limit stays.
    let pid = f.project_id(&a.id);
    let mut grown = a.clone();
    grown.min = (forty * 2) as i64;
    grown.max = (forty * 2) as i64;
    let msg = f.node.create(&grown).error();
    assert!(
        msg.contains(&format!("({} bytes)", forty * 2)) && msg.contains("overcommit_ratio"),
        "{msg}"
    );
    assert_eq!(f.quota(pid).limits.bytes_hard, forty);
    assert_eq!(f.record(&a.id).unwrap()["provisioned_bytes"], forty);

    // Restores are never refused for capacity, even when the ratio drops
    // below what the volumes already hold.
    f.set_overcommit_ratio(0.1);
    assert_eq!(f.create(&a).1, forty as i64);
    assert_eq!(f.create(&b).1, forty as i64);
    assert_eq!(f.quota(pid).limits.bytes_hard, forty);

    f.set_overcommit_ratio(2.0);
    f.create(&c);
    let pid_c = f.project_id(&c.id);
    assert_eq!(f.quota(pid_c).limits.bytes_hard, forty);
}

fn ten_concurrent_creates_of_15_percent_admit_only_what_fits(fs: &FsCase) {
    let small = SmallFs::new(fs, "race", SMALL_FS);
    let f = small.fixture("race");
    f.set_overcommit_ratio(1.0);
    let each = share(&small.mount, 15);
    let specs: Vec<Spec> = (0..10)
        .map(|i| Spec::new(&format!("r{i}"), each as i64))
        .collect();
    let outs: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = specs
            .iter()
            .map(|sp| s.spawn(|| f.node.create(sp)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut admitted = Vec::new();
    for (sp, o) in specs.iter().zip(&outs) {
        if o.status.success() {
            assert_eq!(o.created().1, each as i64);
            admitted.push(sp.id.clone());
        } else {
            let msg = o.error();
            assert!(
                msg.contains("overcommit_ratio") && msg.contains("already promised"),
                "{msg}"
            );
            assert!(f.record(&sp.id).is_none(), "{msg}");
            assert!(!f.node.volumes_dir.join(&sp.id).exists(), "{msg}");
        }
    }
    let room = room(&f, &small.mount, &admitted);
    let n = admitted.len() as u64;
    assert!(n * each <= room, "{n} × {each} admitted into {room}");
    assert!(
        (n + 1) * each > room,
        "only {n} × {each} admitted though {room} had room for another"
    );
    assert!(n >= 5, "a fresh filesystem holds at least 5 × 15 %: {n}");
}

fn decimal_capacity_max_rounds_down_and_a_replay_returns_the_same_bytes(fs: &FsCase) {
    let f = fs.fixture("decimal");
    // "10MB" as an HCL user writes it: not a multiple of the 4 KiB block.
    let max: i64 = 10_000_000;
    let spec = Spec::new("decimal", max);
    let first = f.node.create(&spec);
    let (_, bytes) = first.created();
    assert_eq!(bytes, max - max % 4096, "rounded down to the 4 KiB block");
    let pid = f.project_id(&spec.id);
    assert_eq!(f.quota(pid).limits.bytes_hard, bytes as u64);
    // Nomad re-submits the same spec: same answer, still within max.
    let again = f.node.create(&spec);
    assert_eq!(again.stdout, first.stdout);
    // A grow to another decimal size lands on the block below it.
    let mut grown = spec.clone();
    grown.min = 15_000_000;
    grown.max = 20_000_000;
    let (_, bytes) = f.node.create(&grown).created();
    assert_eq!(bytes, 20_000_000 - 20_000_000 % 4096);
    assert_eq!(f.quota(pid).limits.bytes_hard, bytes as u64);
}

fn a_range_without_a_whole_block_is_refused_and_leaves_nothing(fs: &FsCase) {
    let f = fs.fixture("noblock");
    let mut spec = Spec::new("tiny", 6000);
    spec.min = 5000;
    let msg = f.node.create(&spec).error();
    assert!(
        msg.contains("capacity_min") && msg.contains("capacity_max") && msg.contains("4096"),
        "the refusal names the range and the block: {msg}"
    );
    assert!(!f.node.volumes_dir.join(&spec.id).exists());
    assert!(f.record(&spec.id).is_none(), "no record after a refusal");
    // An existing volume asked to move into such a range keeps its limit.
    let ok = Spec::new("kept", 16 * MIB as i64);
    let (path, _) = f.create(&ok);
    let pid = f.project_id(&ok.id);
    let mut narrow = ok.clone();
    narrow.min = 16 * MIB as i64 + 1;
    narrow.max = 16 * MIB as i64 + 4000;
    f.node.create(&narrow).error();
    assert!(path.is_dir());
    assert_eq!(f.quota(pid).limits.bytes_hard, 16 * MIB);
}

fn the_exporter_publishes_the_filesystem_the_promises_and_the_ratio(fs: &FsCase) {
    let small = SmallFs::new(fs, "series", SMALL_FS);
    let f = small.fixture("series");
    f.set_overcommit_ratio(1.5);
    let twenty = share(&small.mount, 20);
    let a = Spec::new("a", twenty as i64);
    let b = Spec::new("b", twenty as i64);
    let (pa, _) = f.create(&a);
    f.create(&b);
    assert_eq!(fill(&pa.join("data"), 8 * MIB, None).errno, None);
    let plugin_dir = f.node.plugin_dir.display().to_string();
    let exp = Exporter::start_with(
        &[&f.node.volumes_dir],
        &["--plugin-dir", &plugin_dir, "--ebpf=off"],
    );
    let m = exp.scrape();
    let dir = f.node.volumes_dir.display().to_string();
    let at = [("volumes_dir", dir.as_str())];
    let (size, avail, ..) = prjquota_vmtests::fixture::statvfs(&f.node.volumes_dir);
    assert_eq!(
        m.value("nomad_host_volumes_filesystem_size_bytes", &at),
        size as f64
    );
    // Nothing writes meanwhile: statfs agrees to the block.
    let got = m.value("nomad_host_volumes_filesystem_available_bytes", &at);
    assert!(
        (got - avail as f64).abs() <= 64.0 * 1024.0,
        "{got} vs {avail}"
    );
    assert_eq!(
        m.value("nomad_host_volumes_provisioned_bytes", &at),
        (2 * twenty) as f64,
        "the sum of the records' sizes"
    );
    let used: u64 = [&a, &b]
        .iter()
        .map(|s| f.quota(f.project_id(&s.id)).used_bytes)
        .sum();
    assert!(used >= 8 * MIB, "{used}");
    assert_eq!(m.value("nomad_host_volumes_used_bytes", &at), used as f64);
    assert_eq!(m.value("nomad_host_volumes_overcommit_ratio", &at), 1.5);
    // The join labels of Nomad's client telemetry, from the records.
    let node = [
        ("volumes_dir", dir.as_str()),
        ("node_id", f.node.node_id.as_str()),
        ("node_pool", "default"),
    ];
    assert_eq!(m.value("nomad_host_volumes_filesystem_healthy", &node), 1.0);

    // NomadHostVolumesOvercommitted's bound, ratio x (free + the volumes'
    // usage), from these series, is the admission rule's: the room the
    // plugin counts, measured here apart. Then files outside the volumes
    // take the room away: the alert's expression turns positive, by what
    // the plugin now refuses to promise.
    let ids = [a.id.clone(), b.id.clone()];
    let bound = |m: &prjquota_vmtests::prom::Exposition| {
        m.value("nomad_host_volumes_overcommit_ratio", &at)
            * (m.value("nomad_host_volumes_filesystem_free_bytes", &at)
                + m.value("nomad_host_volumes_used_bytes", &at))
    };
    let rule = 1.5 * room(&f, &small.mount, &ids) as f64;
    assert!(
        (bound(&m) - rule).abs() <= 1.5 * 64.0 * 1024.0,
        "the alert's bound {} vs the admission rule's {rule}",
        bound(&m)
    );
    let promised = (2 * twenty) as f64;
    assert!(promised < bound(&m), "not overcommitted yet");
    let outside = small.mount.join("outside.bin");
    let beyond = (bound(&m) - promised) / 1.5;
    assert_eq!(
        fill(&outside, beyond as u64 + 8 * MIB, None).errno,
        None,
        "a file outside the volumes"
    );
    let m = exp.scrape();
    let excess = promised - bound(&m);
    assert!(
        excess > 0.0,
        "promised {promised}, bound {}: the alert's expression is {excess}",
        bound(&m)
    );
    let more = Spec::new("more", MIB as i64);
    assert_refused_for_capacity(&f, &more);
    std::fs::remove_file(&outside).unwrap();

    // The node moves to another pool: Nomad's restore at the agent's start
    // rewrites the records, and the series follow the newest.
    let mut moved = f.node.clone();
    moved.node_pool = "gpu".into();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    moved.create(&a).ok();
    let m = exp.scrape();
    let node = [
        ("volumes_dir", dir.as_str()),
        ("node_id", f.node.node_id.as_str()),
        ("node_pool", "gpu"),
    ];
    assert_eq!(
        m.value("nomad_host_volumes_provisioned_bytes", &node),
        (2 * twenty) as f64
    );

    // A plugin dir that does not exist: the ratio is unknown, not 1.
    drop(exp);
    let exp = Exporter::start_with(
        &[&f.node.volumes_dir],
        &["--plugin-dir", "/nonexistent/plugins", "--ebpf=off"],
    );
    let m = exp.scrape();
    assert_eq!(m.get("nomad_host_volumes_overcommit_ratio", &at), None);
    assert_eq!(
        m.value("nomad_host_volumes_provisioned_bytes", &at),
        (2 * twenty) as f64
    );
}

/// A volume's available bytes are what a writer can still put in it: on a
/// filesystem promised more than it holds (a ratio of 2) and nearly full,
/// the filesystem's room, not the limit less the usage that ext4's statfs
/// of the root reports; its capacity is the limit, as every kernel's
/// statfs of the root says, and its usage the project's.
fn a_volume_on_a_nearly_full_filesystem_reports_the_room_left_on_it(fs: &FsCase) {
    let small = SmallFs::new(fs, "nearly-full", SMALL_FS);
    let f = small.fixture("nearly-full");
    f.set_overcommit_ratio(2.0);
    let sixty = share(&small.mount, 60);
    let a = Spec::new("a", sixty as i64);
    let b = Spec::new("b", sixty as i64);
    let (pa, _) = f.create(&a);
    let (pb, _) = f.create(&b);
    assert_eq!(fill(&pa.join("data"), 4 * MIB, None).errno, None);
    // b takes most of the disk: a's limit less its usage is now far more
    // than the filesystem has left.
    assert_eq!(
        fill(&pb.join("data"), share(&small.mount, 55), None).errno,
        None
    );
    let exp = Exporter::start_with(&[&f.node.volumes_dir], &["--ebpf=off"]);
    let m = exp.scrape();
    m.assert_collectors_succeeded("nearly full");
    let dir = f.node.volumes_dir.display().to_string();
    let fs_avail = m.value(
        "nomad_host_volumes_filesystem_available_bytes",
        &[("volumes_dir", dir.as_str())],
    );
    let l = [
        ("namespace", "default"),
        ("node_pool", "default"),
        ("volume_id", a.id.as_str()),
    ];
    let q = f.quota(f.project_id(&a.id));
    let (capacity, used, available) = (
        m.value("nomad_host_volume_capacity_bytes", &l),
        m.value("nomad_host_volume_used_bytes", &l),
        m.value("nomad_host_volume_available_bytes", &l),
    );
    let root = prjquota_vmtests::fixture::statvfs(&pa);
    eprintln!(
        "{}: capacity {capacity} used {used} available {available}; filesystem available {fs_avail}; statfs of the root: size {} available {}",
        fs.name, root.0, root.1
    );
    assert_eq!(capacity, sixty as f64);
    assert_eq!(
        capacity, root.0 as f64,
        "statfs of the root: the same capacity"
    );
    assert_eq!(used, q.used_bytes as f64);
    assert!(used >= (4 * MIB) as f64, "{used}");
    assert!(
        fs_avail < capacity - used,
        "the setup: the filesystem ({fs_avail}) must have less room than a's limit leaves ({})",
        capacity - used
    );
    assert_eq!(
        available, fs_avail,
        "the filesystem's room, from the same scrape's statfs"
    );
    // b's numbers are bounded the same way.
    let lb = [l[0], l[1], ("volume_id", b.id.as_str())];
    assert!(m.value("nomad_host_volume_available_bytes", &lb) <= fs_avail);
}

/// The ledger keeps the size promised so that a create need not read every
/// record; what changes the records or reservations behind it (an older
/// plugin's grow after a downgrade, a hand, a restore from backup) makes it
/// stale, and a stale or torn ledger is rebuilt from the records rather
/// than trusted. Trusted, each of these would admit past the disk.
fn a_ledger_stale_or_torn_behind_the_plugin_is_not_trusted(fs: &FsCase) {
    let small = SmallFs::new(fs, "ledger", SMALL_FS);
    let f = small.fixture("ledger");
    f.set_overcommit_ratio(1.0);
    let dir = &f.node.volumes_dir;
    let (five, forty, ninety) = (
        share(&small.mount, 5),
        share(&small.mount, 40),
        share(&small.mount, 90),
    );
    let a = Spec::new("a", forty as i64);
    f.create(&a);
    let ledger = trusted_ledger(dir).expect("a create leaves a ledger");
    assert_eq!((ledger.promised, ledger.volumes), (forty, 1));

    // A ledger whose content never reached the disk whole: rebuilt.
    let text = std::fs::read(dir.join(".prjquota/ledger")).expect("the ledger");
    std::fs::write(dir.join(".prjquota/ledger"), &text[..text.len() / 2]).unwrap();
    f.create(&Spec::new("five", five as i64));
    assert_ledger_agrees(dir, "after a torn ledger");
    assert_eq!(trusted_ledger(dir).map(|l| l.promised), Some(forty + five));

    // An older plugin grows `a` to 90 %: its record only, behind the
    // ledger, which still says 45 % and would admit 40 % more.
    let mut rec = read_records(dir)
        .into_iter()
        .find(|r| r.volume_id.as_str() == a.id)
        .expect("a's record");
    rec.provisioned_bytes = ninety;
    add_volume(dir, rec);
    let b = Spec::new("b", forty as i64);
    let msg = assert_refused_for_capacity(&f, &b);
    let promised = prjquota_core::units::human(ninety + five);
    assert!(msg.contains(&format!("promised {promised}")), "{msg}");
}
