//! Storage faults (issue 36): a disk that errors, stalls, fills or goes
//! read-only, and a filesystem mounted without `prjquota`. Each test puts a
//! filesystem of its own on device-mapper ([`DmDisk`]), makes a volume with
//! data, starts the exporter on it and on an unaffected directory of the
//! shared filesystem, injects the fault, and checks what the plugin answers,
//! what the exporter shows, and that the volume's data and limit survive the
//! recovery.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use prjquota_vmtests::dm::DmDisk;
use prjquota_vmtests::fixture::{fill, Fixture, FsCase, EXT4, MIB, XFS};
use prjquota_vmtests::nomad::{Outcome, Spec};
use prjquota_vmtests::on_every_fs;
use prjquota_vmtests::prom::{Exporter, Exposition};
use prjquota_vmtests::witness;

/// Nomad kills a plugin after this long.
const NOMAD_DEADLINE: Duration = Duration::from_secs(60);
/// The longest a scrape may take under any fault.
const SCRAPE_BOUND: Duration = Duration::from_secs(10);
/// mkfs.xfs refuses filesystems below 300 MiB; the image is sparse.
const DISK: u64 = 512 * MIB;
const VOLUME: i64 = 64 * MIB as i64;

struct Setup {
    disk: DmDisk,
    fx: Fixture,
    spec: Spec,
    path: PathBuf,
    bytes: i64,
    data: Vec<u8>,
    /// A volumes directory on the shared filesystem, which no fault touches.
    other: Fixture,
    exporter: Exporter,
}

/// A megabyte no two runs share, so a stale file cannot pass for it.
fn pattern() -> Vec<u8> {
    let seed: String = prjquota_vmtests::nomad::uuid()
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(12)
        .collect();
    let mut x = u64::from_str_radix(&seed, 16).unwrap() | 1;
    (0..MIB)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn setup(case: &FsCase, tag: &str) -> Setup {
    let disk = DmDisk::new(case, tag, DISK);
    let fx = disk.fixture(tag);
    // Admission as on a production node: promise no more than the disk.
    fx.set_overcommit_ratio(1.0);
    let spec = Spec::new(tag, VOLUME);
    let (path, bytes) = fx.create(&spec);
    let data = pattern();
    std::fs::write(path.join("data"), &data).unwrap();
    prjquota_vmtests::sh("sync");
    let other = XFS.fixture(&format!("{tag}-other"));
    other.create(&Spec::new("bystander", VOLUME));
    let exporter = Exporter::start(&[&fx.node.volumes_dir, &other.node.volumes_dir]);
    let s = Setup {
        disk,
        fx,
        spec,
        path,
        bytes,
        data,
        other,
        exporter,
    };
    s.wait_for(
        &s.fx.node.volumes_dir,
        Some(1.0),
        Some(1.0),
        "before the fault",
    );
    s
}

impl Setup {
    /// One scrape, which must answer within [`SCRAPE_BOUND`].
    fn scrape(&self) -> Exposition {
        let (text, took) = self.exporter.scrape_text();
        assert!(
            took < SCRAPE_BOUND,
            "a scrape took {took:?} under the fault\n{}",
            self.exporter.log()
        );
        Exposition::parse(&text)
    }

    /// (healthy, quota_enforced) of `dir` in one scrape.
    fn state(&self, dir: &Path) -> (Option<f64>, Option<f64>) {
        let e = self.scrape();
        let l = dir.display().to_string();
        let labels = [("volumes_dir", l.as_str())];
        (
            e.get("nomad_host_volumes_filesystem_healthy", &labels),
            e.get("nomad_host_volumes_quota_enforced", &labels),
        )
    }

    /// Scrapes until `dir` shows `healthy` and `enforced` (`None`: any),
    /// at most 15 s; the other directory must stay healthy throughout.
    fn wait_for(&self, dir: &Path, healthy: Option<f64>, enforced: Option<f64>, when: &str) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let (h, q) = self.state(dir);
            let other = self.state(&self.other.node.volumes_dir);
            assert_eq!(
                other,
                (Some(1.0), Some(1.0)),
                "the unaffected directory {when}"
            );
            if healthy.is_none_or(|w| h == Some(w)) && enforced.is_none_or(|w| q == Some(w)) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{when}: healthy {h:?}, quota_enforced {q:?}, wanted {healthy:?}, {enforced:?}\n{}",
                self.exporter.log()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// A plugin run that must answer within Nomad's deadline.
    fn timely(&self, what: &str, o: Outcome) -> Outcome {
        assert!(
            !o.killed && o.elapsed < NOMAD_DEADLINE,
            "{what} took {:?} (killed: {})",
            o.elapsed,
            o.killed
        );
        o
    }

    fn restore(&self) -> Outcome {
        self.timely("restore", self.fx.node.create(&self.spec))
    }

    /// The volume is restored with its data and limit: the kernel's limit
    /// (the quota witness) is what Nomad was told.
    fn assert_intact(&self, when: &str) {
        let (path, bytes) = self.restore().created();
        assert_eq!((path.as_path(), bytes), (self.path.as_path(), self.bytes));
        let data = std::fs::read(self.path.join("data"))
            .unwrap_or_else(|e| panic!("{when}: read the volume's data: {e}"));
        assert!(data == self.data, "{when}: the volume's data changed");
        let pid = self.fx.project_id(&self.spec.id);
        assert_eq!(
            self.fx.quota(pid).limits.bytes_hard,
            self.bytes as u64,
            "{when}: the kernel's limit"
        );
        self.assert_witness(&[(&self.spec, self.bytes)], when);
    }

    /// The filesystem's own quota tool (xfs_quota, repquota) reports a
    /// limit for exactly these volumes' projects, of exactly their sizes:
    /// no limit lost, none left behind by a failed call.
    fn assert_witness(&self, volumes: &[(&Spec, i64)], when: &str) {
        let case = if self.disk.fs == "xfs" { &XFS } else { &EXT4 };
        let mut limited = witness::hard_limits(case, self.disk.path());
        limited.retain(|_, hard| *hard > 0);
        let records: std::collections::BTreeMap<u32, u64> = volumes
            .iter()
            .map(|(spec, bytes)| (self.fx.project_id(&spec.id), *bytes as u64))
            .collect();
        assert_eq!(limited, records, "{when}: the quota witness");
    }

    /// (threads, VmRSS in KiB) of the exporter.
    fn exporter_resources(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.exporter.pid()))
            .expect("read the exporter's /proc/PID/status");
        let threads = status
            .lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("Threads: in /proc/PID/status");
        (threads, self.exporter.memory_kib().1)
    }
}

/// An error that names the cause, in Nomad's `{"error"}` form.
fn refused(o: &Outcome, names: &[&str]) -> String {
    let e = o.error();
    assert!(
        names.iter().any(|n| e.contains(n)),
        "the error names none of {names:?}: {e}"
    );
    e
}

/// Every I/O fails: XFS shuts down, ext4 remounts read-only. Every call
/// answers in time with a clean error, a delete never reports success, the
/// exporter says the filesystem is unhealthy and keeps answering; after the
/// disk heals and the filesystem is mounted again (log replay), the volume
/// is restored with its data, and the exporter reports it again without a
/// restart.
fn disk_errors(case: &FsCase) {
    let s = setup(case, "error");
    s.disk.fail();
    let o = s.timely("create", s.fx.node.create(&Spec::new("new", VOLUME)));
    refused(&o, &["Input/output error", "Read-only file system", "shut"]);
    let o = s.timely("delete", s.fx.node.delete(&s.spec));
    refused(&o, &["Input/output error", "Read-only file system", "shut"]);
    // A restore may fail (the filesystem cannot be read), but in time and
    // cleanly: one JSON value either way.
    let o = s.restore();
    let _ = o.json();
    s.wait_for(
        &s.fx.node.volumes_dir,
        Some(0.0),
        None,
        "on the failed disk",
    );
    s.exporter
        .wait_for_line("filesystem unhealthy", Duration::from_secs(5));

    s.disk.heal_and_remount();
    s.assert_intact("after the disk healed");
    s.wait_for(
        &s.fx.node.volumes_dir,
        Some(1.0),
        Some(1.0),
        "after recovery",
    );
    s.exporter
        .wait_for_line("filesystem healthy again", Duration::from_secs(5));
    assert_eq!(
        s.exporter.log().matches("filesystem unhealthy").count(),
        1,
        "one log line per change, not per scrape\n{}",
        s.exporter.log()
    );
    // The volume can be deleted once the disk is back.
    s.fx.node.delete(&s.spec).ok();
}

/// `mount -o remount,ro`: a restore of the unchanged volume succeeds (it
/// writes nothing); a create, a grow and a delete fail naming the cause.
fn read_only(case: &FsCase) {
    let s = setup(case, "ro");
    s.disk.remount_ro(true);
    // ext4 suspends its quotas while read-only: the state is absent then,
    // never a 0 that would page about quotas nobody turned off.
    s.wait_for(&s.fx.node.volumes_dir, Some(0.0), None, "read-only");
    assert_ne!(s.state(&s.fx.node.volumes_dir).1, Some(0.0));
    if case.name == "xfs" {
        // XFS keeps enforcing and accounting while read-only: the quota
        // collector still reads it (the kernel refuses Q_GETNEXTQUOTA there,
        // not Q_XGETNEXTQUOTA).
        let e = s.scrape();
        assert_eq!(
            e.get(
                "prjquota_exporter_scrape_collector_success",
                &[("collector", "quota")]
            ),
            Some(1.0),
            "the quota collector on a read-only XFS\n{}",
            s.exporter.log()
        );
    }
    let (path, bytes) = s.restore().created();
    assert_eq!((path.as_path(), bytes), (s.path.as_path(), s.bytes));
    let o = s.timely("create", s.fx.node.create(&Spec::new("new", VOLUME)));
    refused(&o, &["Read-only file system"]);
    let mut grown = s.spec.clone();
    grown.max = 2 * VOLUME;
    grown.min = 2 * VOLUME;
    let o = s.timely("grow", s.fx.node.create(&grown));
    refused(&o, &["Read-only file system"]);
    let o = s.timely("delete", s.fx.node.delete(&s.spec));
    refused(&o, &["Read-only file system"]);
    s.disk.remount_ro(false);
    s.wait_for(
        &s.fx.node.volumes_dir,
        Some(1.0),
        Some(1.0),
        "read-write again",
    );
    s.assert_intact("after read-only");
}

/// Mounted again without `prjquota`: every create and restore is refused
/// naming the mount option, and the exporter says quotas are not enforced.
fn quotas_off(case: &FsCase) {
    let s = setup(case, "noquota");
    s.disk.umount();
    s.disk.mount_with(false);
    s.wait_for(
        &s.fx.node.volumes_dir,
        Some(1.0),
        Some(0.0),
        "without prjquota",
    );
    s.exporter
        .wait_for_line("project quotas not enforced", Duration::from_secs(5));
    let o = s.timely("create", s.fx.node.create(&Spec::new("new", VOLUME)));
    refused(&o, &["prjquota"]);
    refused(&s.restore(), &["prjquota"]);
    s.disk.umount();
    s.disk.mount_with(true);
    s.wait_for(
        &s.fx.node.volumes_dir,
        Some(1.0),
        Some(1.0),
        "with prjquota again",
    );
    s.assert_intact("after quotas came back");
}

/// The filesystem fills outside any volume: a new create is refused by
/// admission naming the space, a restore succeeds, and no quota hit is
/// counted for the volume.
fn full_outside_volumes(case: &FsCase) {
    let s = setup(case, "full");
    let filler = s.disk.path().join("filler");
    let f = fill(&filler, DISK, None);
    assert_eq!(f.errno, Some(libc::ENOSPC), "the filler filled the disk");
    let o = s.timely("create", s.fx.node.create(&Spec::new("new", VOLUME)));
    refused(&o, &["not enough space", "No space left"]);
    s.assert_intact("on a full disk");
    let e = s.scrape();
    let id = s.spec.id.clone();
    let hits: f64 = e
        .find(
            "nomad_host_volume_quota_limit_hits_total",
            &[("volume_id", &id)],
        )
        .map(|x| x.value)
        .sum();
    assert_eq!(hits, 0.0, "a full disk counted as the volume's quota hit");
    std::fs::remove_file(&filler).unwrap();
}

/// The device stalls (`dmsetup suspend`): scrapes keep answering within
/// 10 s; after the resume the directory's stats come back without a
/// restart, and the volume restores.
fn stall(case: &FsCase) {
    let s = setup(case, "stall");
    s.disk.suspend();
    // A writer that the stall holds, so the filesystem has I/O queued.
    let held = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "dd if=/dev/zero of={} bs=1M count=4 oflag=direct 2>/dev/null",
            s.path.join("stalled").display()
        ))
        .spawn()
        .unwrap();
    let (threads_before, rss_before) = s.exporter_resources();
    let until = Instant::now() + stall_duration();
    let (mut scrapes, mut threads_max, mut rss_max) = (0, threads_before, rss_before);
    while Instant::now() < until {
        s.scrape();
        scrapes += 1;
        let (t, r) = s.exporter_resources();
        threads_max = threads_max.max(t);
        rss_max = rss_max.max(r);
        std::thread::sleep(STALL_SCRAPE_EVERY);
    }
    eprintln!(
        "MEASURE faults_{}_stalled scrapes {scrapes} threads {threads_before} max {threads_max} \
         rss_kib {rss_before} max {rss_max}",
        case.name
    );
    // A stuck directory holds one blocked call of each kind at a time (the
    // stuck-mount rule: statfs twice, quotactl, the registry, the roots'
    // stat, the guard's sync round); scrapes must not add a thread each.
    assert!(
        threads_max <= threads_before + STUCK_CALL_KINDS,
        "the exporter went from {threads_before} to {threads_max} threads over {scrapes} \
         scrapes of a stalled disk\n{}",
        s.exporter.log()
    );
    assert!(
        rss_max <= rss_before + 16 * 1024,
        "the exporter's memory went from {rss_before} KiB to {rss_max} KiB over {scrapes} \
         scrapes of a stalled disk"
    );
    s.disk.resume();
    let mut held = held;
    held.wait().unwrap();
    s.wait_for(
        &s.fx.node.volumes_dir,
        Some(1.0),
        Some(1.0),
        "after the resume",
    );
    let l = s.fx.node.volumes_dir.display().to_string();
    assert!(
        s.scrape()
            .get(
                "nomad_host_volumes_filesystem_size_bytes",
                &[("volumes_dir", l.as_str())]
            )
            .is_some(),
        "the directory's stats came back"
    );
    s.assert_intact("after the stall");
}

/// The disk holding the plugin directory stalls: the exporter reads the
/// overcommit ratio from its prjquota.toml on every scrape. Scrapes keep
/// answering within the bound, with the volumes' series and without the
/// ratio (the filesystem collector failing, and saying why), and the ratio
/// comes back after the resume, without a restart.
fn a_stalled_plugin_dir_costs_the_ratio_and_nothing_else(case: &FsCase) {
    let disk = DmDisk::new(case, "plugindir", DISK);
    let fx = XFS.fixture("plugindir-volumes");
    fx.set_overcommit_ratio(1.0);
    fx.create(&Spec::new("plugindir", VOLUME));
    let plugin_dir = disk.path().join("plugins");
    std::fs::create_dir(&plugin_dir).unwrap();
    std::fs::copy(
        fx.node.plugin_dir.join("prjquota.toml"),
        plugin_dir.join("prjquota.toml"),
    )
    .unwrap();
    prjquota_vmtests::sh("sync");
    let exporter = Exporter::start_with(
        &[&fx.node.volumes_dir],
        &[
            "--plugin-dir",
            &plugin_dir.display().to_string(),
            "--ebpf=off",
        ],
    );
    let dir = fx.node.volumes_dir.display().to_string();
    let at = [("volumes_dir", dir.as_str())];
    let ratio = |e: &Exposition| e.get("nomad_host_volumes_overcommit_ratio", &at);
    let filesystem_ok = |e: &Exposition| {
        e.get(
            "prjquota_exporter_scrape_collector_success",
            &[("collector", "filesystem")],
        )
    };
    let e = exporter.scrape();
    assert_eq!((ratio(&e), filesystem_ok(&e)), (Some(1.0), Some(1.0)));
    // Mounted again, the filesystem has nothing of the plugin directory in
    // memory: its next lookup reads the disk, which then stalls.
    disk.umount();
    disk.mount_with(true);
    disk.suspend();
    // Dropped before the exporter, whose stop would otherwise wait on the
    // stalled disk if a scrape below fails.
    let stalled = Resumed(&disk);
    for scrape in 1..=3 {
        // Read with the bound as its time-out: a runtime blocked on the
        // disk answers nothing at all.
        let text = prjquota_vmtests::http::http_get(exporter.addr, "/metrics", SCRAPE_BOUND)
            .unwrap_or_else(|e| {
                panic!(
                    "scrape {scrape}: no answer within {SCRAPE_BOUND:?} with the plugin \
                     directory's disk stalled: {e}\n{}",
                    exporter.log()
                )
            })
            .body;
        let e = Exposition::parse(&text);
        assert_eq!(
            (ratio(&e), filesystem_ok(&e)),
            (None, Some(0.0)),
            "scrape {scrape}: the ratio of a stalled plugin directory\n{text}"
        );
        assert!(
            e.get("nomad_host_volumes_filesystem_size_bytes", &at)
                .is_some(),
            "scrape {scrape}: the volumes directory's series went with the ratio\n{text}"
        );
    }
    assert!(
        exporter.log().contains("reading the plugin directory"),
        "{}",
        exporter.log()
    );
    drop(stalled);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let e = exporter.scrape();
        if (ratio(&e), filesystem_ok(&e)) == (Some(1.0), Some(1.0)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the ratio did not come back after the resume\n{}",
            exporter.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Resumes a suspended disk when dropped.
struct Resumed<'a>(&'a DmDisk);

impl Drop for Resumed<'_> {
    fn drop(&mut self) {
        self.0.resume();
    }
}

/// The kinds of filesystem call the exporter makes per volumes directory,
/// each of which a stalled disk may hold once.
const STUCK_CALL_KINDS: u64 = 6;

/// How often the stall test scrapes: faster than Prometheus does, so that
/// a thread or buffer left per scrape shows within the stall.
const STALL_SCRAPE_EVERY: Duration = Duration::from_millis(250);

/// How long the stall test holds the disk: 15 s, or
/// `PRJQUOTA_STALL_SECS` (the 5-minute measurement of the reliability
/// docs runs it through `cargo xtask vm`).
fn stall_duration() -> Duration {
    let secs = std::env::var("PRJQUOTA_STALL_SECS")
        .ok()
        .map(|v| v.parse().expect("PRJQUOTA_STALL_SECS: a number of seconds"))
        .unwrap_or(15);
    Duration::from_secs(secs)
}

/// Nomad kills a create the disk holds (SIGKILL at its deadline), and the
/// disk then fails the I/O it held. After the disk heals and the filesystem
/// is mounted again, the same create, retried, converges; the existing
/// volume keeps its data; the kernel's limits are exactly the records'.
fn create_killed_while_the_disk_fails(case: &FsCase) {
    let s = setup(case, "killed");
    let new = Spec::new("killed", VOLUME);
    s.disk.suspend();
    let mut child = s.fx.node.spawn_create(&new);
    // The create reaches the disk (a sync of its records) and waits there.
    let start = Instant::now();
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id()))
            .expect("read the create's /proc/PID/stat");
        let state = stat.rsplit(") ").next().and_then(|r| r.chars().next());
        if state == Some('D') {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the create finished on a suspended disk without waiting for it"
        );
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the create never waited on the suspended disk (state {state:?})"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "MEASURE faults_{}_create_held_after_seconds {:.3}",
        case.name,
        start.elapsed().as_secs_f64()
    );
    child.kill().unwrap();
    s.disk.fail();
    let status = child.wait().unwrap();
    assert!(!status.success(), "the killed create: {status:?}");

    s.disk.heal_and_remount();
    s.assert_intact("after the killed create and the disk's recovery");
    let (path, bytes) = s
        .timely("the create, retried", s.fx.node.create(&new))
        .created();
    assert_eq!(bytes, VOLUME);
    let data = path.join("data");
    assert_eq!(fill(&data, MIB, None).errno, None);
    s.assert_witness(
        &[(&s.spec, s.bytes), (&new, bytes)],
        "after the retried create",
    );
    s.wait_for(
        &s.fx.node.volumes_dir,
        Some(1.0),
        Some(1.0),
        "after recovery",
    );
    s.timely("delete", s.fx.node.delete(&new)).ok();
    s.assert_witness(&[(&s.spec, s.bytes)], "after the delete");
}

on_every_fs!(
    create_killed_while_the_disk_fails,
    disk_errors,
    read_only,
    quotas_off,
    full_outside_volumes,
    stall,
    a_stalled_plugin_dir_costs_the_ratio_and_nothing_else
);
