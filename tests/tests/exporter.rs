//! The real `prjquota-exporter` binary against volumes the real plugin made,
//! on a kernel that enforces project quotas: every number it publishes is
//! compared with what the test wrote and with what the kernel says, its
//! exposition is checked by `promtool` and scraped by a real Prometheus.
//! Its cost at scale is measured in `scrape_cost.rs`.
//!
//! Each test starts its own exporter (on 127.0.0.1, port chosen by the
//! kernel and read back from the exporter's start-up log line) against its
//! own Nomad node, and stops it when the test ends, passed or not.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use prjquota_vmtests::fixture::{fill, statvfs, Fixture, MIB};
use prjquota_vmtests::nomad::{uuid, Spec};
use prjquota_vmtests::prom::{self, Exporter, Exposition, Prometheus, UNGUARDED};
use prjquota_vmtests::records::{add_volume, ready_record};
use prjquota_vmtests::{ext4_mount, scratch_dir, xfs_mount, xfs_noquota_mount};

const BLOCK: u64 = 4096;

// ---------------------------------------------------------------------------
// Volumes with known content

/// What a test puts into one volume.
struct Plan {
    name: &'static str,
    namespace: &'static str,
    limit: u64,
    max_inodes: Option<u64>,
    /// Written with `fill` (zeros, fsynced) as `data.bin`.
    bulk: u64,
    /// Sizes of further files, written and fsynced one by one.
    small: &'static [u64],
    /// A subdirectory holding one more file of this size.
    subdir_file: Option<u64>,
}

/// A volume the plugin made and the test filled.
struct Made {
    spec: Spec,
    path: PathBuf,
    limit: u64,
    project_id: u32,
    max_inodes: Option<u64>,
    /// Σ over files of the size rounded up to the block: what the data
    /// itself occupies (no file here is sparse or shares blocks).
    data_bytes: u64,
    /// Directories, the root included.
    dirs: u64,
    /// Files and directories, the root included.
    inodes: u64,
}

impl Made {
    fn labels<'a>(&'a self, node_pool: &'a str) -> [(&'a str, &'a str); 3] {
        [
            ("namespace", self.spec.namespace.as_str()),
            ("node_pool", node_pool),
            ("volume_id", self.spec.id.as_str()),
        ]
    }
}

fn round_up(n: u64) -> u64 {
    n.div_ceil(BLOCK) * BLOCK
}

fn write_file(path: &Path, len: u64) {
    let mut f = std::fs::File::create(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f.write_all(&vec![b'x'; len as usize]).unwrap();
    f.sync_all().unwrap();
}

fn make(f: &Fixture, plans: &[Plan]) -> Vec<Made> {
    plans
        .iter()
        .map(|p| {
            let mut spec = Spec::new(p.name, p.limit as i64);
            spec.namespace = p.namespace.into();
            if let Some(n) = p.max_inodes {
                spec = spec.param("max_inodes", &n.to_string());
            }
            let (path, bytes) = f.create(&spec);
            assert_eq!(bytes as u64, p.limit);
            let mut data_bytes = 0;
            let mut inodes = 1;
            let mut dirs = 1;
            if p.bulk > 0 {
                let r = fill(&path.join("data.bin"), p.bulk, None);
                assert_eq!((r.written, r.errno), (p.bulk, None), "fill {}", p.name);
                data_bytes += round_up(p.bulk);
                inodes += 1;
            }
            for (i, &len) in p.small.iter().enumerate() {
                write_file(&path.join(format!("small-{i}")), len);
                data_bytes += round_up(len);
                inodes += 1;
            }
            if let Some(len) = p.subdir_file {
                std::fs::create_dir(path.join("sub")).unwrap();
                write_file(&path.join("sub/file"), len);
                data_bytes += round_up(len);
                inodes += 2;
                dirs += 1;
            }
            let project_id = f.project_id(&spec.id);
            Made {
                spec,
                path,
                limit: p.limit,
                project_id,
                max_inodes: p.max_inodes,
                data_bytes,
                dirs,
                inodes,
            }
        })
        .collect()
}

/// Three volumes of different sizes, namespaces and contents (1, 3, 5 MiB
/// plus small files), the last with an inode limit.
const THREE: &[Plan] = &[
    Plan {
        name: "small",
        namespace: "default",
        limit: 16 * MIB,
        max_inodes: None,
        bulk: MIB,
        small: &[100, 5000],
        subdir_file: None,
    },
    Plan {
        name: "medium",
        namespace: "team-b",
        limit: 48 * MIB,
        max_inodes: None,
        bulk: 3 * MIB,
        small: &[1, 4096, 4097],
        subdir_file: Some(10_000),
    },
    Plan {
        name: "limited",
        namespace: "batch",
        limit: 24 * MIB,
        max_inodes: Some(50),
        bulk: 5 * MIB,
        // Empty files: inodes without blocks.
        small: &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        subdir_file: None,
    },
];

/// Bytes a directory holding a handful of entries takes beyond its inode:
/// none on XFS (a short-form directory lives inside the inode), one block on
/// ext4 (no inline_data in `mkfs.ext4 -O quota,project`).
fn dir_block(fstype: &str) -> u64 {
    match fstype {
        "xfs" => 0,
        "ext4" => BLOCK,
        other => panic!("unknown fstype {other}"),
    }
}

fn fstype_of(mount: &Path) -> &'static str {
    if mount == xfs_mount() {
        "xfs"
    } else {
        "ext4"
    }
}

/// Every `nomad_host_volume_*` sample carries namespace, node_pool and
/// volume_id; the IDs are exactly `ids`; each family has one series per
/// volume and label set; every family has TYPE and HELP.
fn assert_per_volume_labels(e: &Exposition, ids: &BTreeSet<&str>) {
    let mut seen_ids = BTreeSet::new();
    let mut series = BTreeSet::new();
    for s in e
        .samples
        .iter()
        .filter(|s| s.name.starts_with("nomad_host_volume_"))
    {
        for l in ["namespace", "node_pool", "volume_id"] {
            assert!(
                s.label(l).is_some_and(|v| !v.is_empty()),
                "{} lacks {l}: {s:?}",
                s.name
            );
        }
        let id = s.label("volume_id").unwrap();
        assert!(ids.contains(id), "a series of an unknown volume: {s:?}");
        seen_ids.insert(id.to_string());
        assert!(
            series.insert((s.name.clone(), s.labels.clone())),
            "duplicate series {s:?}"
        );
        assert!(e.types.contains_key(&s.name), "no TYPE for {}", s.name);
        assert!(e.helps.contains_key(&s.name), "no HELP for {}", s.name);
    }
    let want: BTreeSet<String> = ids.iter().map(|s| s.to_string()).collect();
    assert_eq!(seen_ids, want);
}

// ---------------------------------------------------------------------------
// 1, 2: every metric of every volume, on XFS and on ext4

fn metrics_match_what_was_written(mount: &Path) {
    let fstype = fstype_of(mount);
    let mut f = Fixture::new(mount, &format!("exp-metrics-{fstype}"));
    f.node.node_pool = "pool-a".into();
    let made = make(&f, THREE);
    let exp = Exporter::start_with(&[&f.node.volumes_dir], &UNGUARDED);
    let e = exp.scrape();

    let ids: BTreeSet<&str> = made.iter().map(|m| m.spec.id.as_str()).collect();
    assert_per_volume_labels(&e, &ids);
    assert_eq!(e.value("prjquota_exporter_volumes", &[]), 3.0);
    for (c, ok) in e.collector_successes() {
        assert_eq!(ok, 1.0, "collector {c} failed:\n{}", exp.log());
    }
    for c in ["registry", "quota", "statfs", "quota_events"] {
        assert!(e.collector_successes().contains_key(c), "no collector {c}");
    }
    assert_eq!(
        e.value("prjquota_exporter_quota_events_subscribed", &[]),
        1.0
    );
    assert_eq!(
        e.types["nomad_host_volume_quota_limit_hits_total"], "counter",
        "hits are a counter"
    );
    assert_eq!(e.find("nomad_host_volume_stats_error", &[]).count(), 0);

    for m in &made {
        let l = m.labels("pool-a");
        let v = |name: &str| e.value(name, &l);
        let q = f.quota(m.project_id);
        let (root_size, root_available, fs_files, _) = statvfs(&m.path);

        // What the registry recorded.
        assert_eq!(v("nomad_host_volume_provisioned_bytes"), m.limit as f64);
        assert_eq!(v("nomad_host_volume_requested_max_bytes"), m.limit as f64);
        assert_eq!(v("nomad_host_volume_requested_min_bytes"), 0.0);
        let info: Vec<_> = e.find("nomad_host_volume_info", &l).collect();
        assert_eq!(info.len(), 1);
        let info = info[0];
        assert_eq!(info.value, 1.0);
        assert_eq!(info.label("volume_name"), Some(m.spec.name.as_str()));
        assert_eq!(info.label("node_id"), Some(f.node.node_id.as_str()));
        assert_eq!(info.label("plugin_id"), Some("prjquota"));
        assert_eq!(info.label("fstype"), Some(fstype));
        assert_eq!(
            info.label("project_id"),
            Some(m.project_id.to_string().as_str())
        );

        // Limits: the capacity is the quota's hard limit (so no quota_*
        // series repeats it), as the kernel's statfs of the root says; the
        // inode limit is quotactl's and has a series only where there is
        // one.
        assert_eq!(v("nomad_host_volume_capacity_bytes"), m.limit as f64);
        assert_eq!(root_size, m.limit, "statfs of the root {}", m.spec.name);
        assert_eq!(q.limits.bytes_hard, m.limit, "{}", m.spec.name);
        assert_eq!(
            e.get("nomad_host_volume_quota_hard_limit_inodes", &l),
            m.max_inodes.map(|n| n as f64),
            "{}",
            m.spec.name
        );

        // Usage. The data occupies exactly `data_bytes` (every file is
        // written whole and fsynced, so delayed allocation is resolved, and
        // closed, so XFS has trimmed speculative preallocation); directories
        // add `dir_block` each. One block of slack above that, for metadata
        // a filesystem may charge to the project (an extent block), and
        // nothing below: used bytes can never be less than the data.
        let used = v("nomad_host_volume_used_bytes");
        let floor = m.data_bytes + m.dirs * dir_block(fstype);
        eprintln!(
            "{fstype} {}: used_bytes {used} data {} dirs {} (the quota says {})",
            m.spec.name, m.data_bytes, m.dirs, q.used_bytes
        );
        assert!(
            used >= floor as f64 && used <= (floor + BLOCK) as f64,
            "{fstype} {}: used_bytes {used} outside [{floor}, {}]",
            m.spec.name,
            floor + BLOCK
        );
        // Nothing is written meanwhile: the usage is the kernel's quota,
        // exactly (the reason the exporter has no quota_used_bytes of its
        // own). The filesystem has room to spare, so what is available is
        // the limit less the usage, and every kernel's statfs of the root
        // agrees (a nearly full one is `capacity`'s test).
        assert_eq!(used, q.used_bytes as f64, "{}", m.spec.name);
        assert_eq!(
            v("nomad_host_volume_available_bytes"),
            m.limit as f64 - used,
            "{}",
            m.spec.name
        );
        assert_eq!(
            root_available as f64,
            m.limit as f64 - used,
            "statfs of the root {}",
            m.spec.name
        );

        // Inodes: the project's own count (quotactl's), exact.
        assert_eq!(q.used_inodes, m.inodes, "{}", m.spec.name);
        assert_eq!(v("nomad_host_volume_inodes_used"), m.inodes as f64);
        match m.max_inodes {
            Some(max) => {
                assert_eq!(v("nomad_host_volume_inodes"), max as f64);
                assert_eq!(v("nomad_host_volume_inodes_free"), (max - m.inodes) as f64);
            }
            None => {
                // The filesystem's inodes (statfs), which XFS sizes
                // dynamically: compare orders, not values.
                let total = v("nomad_host_volume_inodes");
                assert!(total > m.inodes as f64, "{total}");
                assert!(v("nomad_host_volume_inodes_free") <= total);
                assert!(fs_files > 0);
            }
        }

        assert_eq!(
            e.value(
                "nomad_host_volume_quota_limit_hits_total",
                &[l[0], l[1], l[2], ("resource", "bytes"), ("limit", "hard")]
            ),
            0.0
        );
    }
}

#[test]
fn xfs_every_metric_matches_what_was_written_and_what_the_kernel_says() {
    metrics_match_what_was_written(&xfs_mount());
}

#[test]
fn ext4_every_metric_matches_what_was_written_and_what_the_kernel_says() {
    metrics_match_what_was_written(&ext4_mount());
}

// ---------------------------------------------------------------------------
// 3: quota limit hits, from the kernel's netlink warnings

fn hits(e: &Exposition, m: &Made) -> f64 {
    e.value(
        "nomad_host_volume_quota_limit_hits_total",
        &[
            ("volume_id", m.spec.id.as_str()),
            ("resource", "bytes"),
            ("limit", "hard"),
        ],
    )
}

/// Fills one volume past its limit as `uid` and waits (bounded) for the
/// exporter to count the hit on that volume and no other.
fn quota_hits_are_counted_for_the_full_volume_only(mount: &Path, uid: Option<u32>) {
    let fstype = fstype_of(mount);
    let f = Fixture::new(mount, &format!("exp-hits-{fstype}"));
    let mut specs = Vec::new();
    for (name, ns) in [
        ("full", "default"),
        ("quiet-1", "default"),
        ("quiet-2", "other"),
    ] {
        let mut s = Spec::new(name, 8 * MIB as i64);
        s.namespace = ns.into();
        if let Some(u) = uid {
            s = s.param("uid", &u.to_string()).param("gid", &u.to_string());
        }
        specs.push(s);
    }
    let made: Vec<Made> = specs
        .into_iter()
        .map(|spec| {
            let (path, bytes) = f.create(&spec);
            let project_id = f.project_id(&spec.id);
            Made {
                spec,
                path,
                limit: bytes as u64,
                project_id,
                max_inodes: None,
                data_bytes: 0,
                dirs: 1,
                inodes: 1,
            }
        })
        .collect();
    let exp = Exporter::start_with(&[&f.node.volumes_dir], &UNGUARDED);
    let before = exp.scrape();
    assert_eq!(
        before.value("prjquota_exporter_quota_events_subscribed", &[]),
        1.0,
        "{}",
        exp.log()
    );
    for m in &made {
        assert_eq!(hits(&before, m), 0.0);
    }

    let r = fill(&made[0].path.join("blob"), 32 * MIB, uid);
    let refused = [libc::ENOSPC, libc::EDQUOT];
    assert!(
        r.errno.is_some_and(|e| refused.contains(&e)),
        "{fstype}: the kernel did not refuse the write: {r:?}"
    );
    assert!(r.written <= made[0].limit, "{r:?}");

    // The warning reaches the exporter asynchronously: poll a bounded number
    // of scrapes.
    let start = Instant::now();
    let mut e = exp.scrape();
    for _ in 0..20 {
        if hits(&e, &made[0]) >= 1.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
        e = exp.scrape();
    }
    eprintln!(
        "MEASURE quota_hit_visible_seconds{{fs={fstype:?}}} {:.2}",
        start.elapsed().as_secs_f64()
    );
    let n = hits(&e, &made[0]);
    assert!(
        n >= 1.0,
        "{fstype}: no hard byte hit counted for the full volume:\n{}\n{}",
        e.text,
        exp.log()
    );
    eprintln!("{fstype}: {n} hard byte hit(s) counted");
    for m in &made[1..] {
        assert_eq!(hits(&e, m), 0.0, "{fstype}: a hit on {}", m.spec.name);
    }
    assert!(e.value("prjquota_exporter_quota_events_total", &[]) >= 1.0);
    // The full volume is reported full.
    let l = made[0].labels("default");
    let used = e.value("nomad_host_volume_used_bytes", &l);
    assert!(
        used <= made[0].limit as f64 && used >= (made[0].limit - MIB) as f64,
        "{used}"
    );
    assert!(e.value("nomad_host_volume_available_bytes", &l) < MIB as f64);
}

#[test]
fn xfs_quota_hits_are_counted_for_the_full_volume_only() {
    // XFS enforces project quotas on root too.
    quota_hits_are_counted_for_the_full_volume_only(&xfs_mount(), None);
}

#[test]
fn ext4_quota_hits_are_counted_for_the_full_volume_only() {
    // ext4 lets CAP_SYS_RESOURCE (root) past quotas: write as nobody.
    quota_hits_are_counted_for_the_full_volume_only(&ext4_mount(), Some(65534));
}

// ---------------------------------------------------------------------------
// 4: a deleted volume's series vanish

#[test]
fn a_deleted_volumes_series_vanish_at_the_next_scrape() {
    let f = Fixture::new(&xfs_mount(), "exp-delete");
    let made = make(&f, THREE);
    let exp = Exporter::start_with(&[&f.node.volumes_dir], &UNGUARDED);
    let e = exp.scrape();
    let all: BTreeSet<&str> = made.iter().map(|m| m.spec.id.as_str()).collect();
    assert_per_volume_labels(&e, &all);

    let gone = &made[1];
    f.node.delete(&gone.spec).ok();
    assert!(!gone.path.exists());
    let e = exp.scrape();
    let left: BTreeSet<&str> = all
        .iter()
        .copied()
        .filter(|id| *id != gone.spec.id)
        .collect();
    assert_per_volume_labels(&e, &left);
    assert!(
        !e.text.contains(&gone.spec.id),
        "the deleted volume is still exported:\n{}",
        e.text
    );
    assert_eq!(e.value("prjquota_exporter_volumes", &[]), 2.0);
    for m in [&made[0], &made[2]] {
        let l = m.labels("default");
        assert_eq!(
            e.value("nomad_host_volume_capacity_bytes", &l),
            m.limit as f64
        );
        assert!(e.value("nomad_host_volume_used_bytes", &l) >= m.data_bytes as f64);
    }
    for (c, ok) in e.collector_successes() {
        assert_eq!(ok, 1.0, "collector {c} failed:\n{}", exp.log());
    }
}

// ---------------------------------------------------------------------------
// 4b: a volume's opt-out of the alerts on its fullness

/// A volume created with `excluded_from_alerts = "true"` is exported with
/// the label the alerts skip it by (kubernetes-mixin's), one created
/// without it has none; an update of the spec sets and clears it, which
/// the next scrape shows, and leaves the volume's data and limit alone.
fn a_volume_excluded_from_alerts_is_exported_with_the_label(mount: &Path) {
    let fstype = fstype_of(mount);
    let f = Fixture::new(mount, &format!("exp-excluded-{fstype}"));
    let archive = Spec::new("archive", 8 * MIB as i64).param("excluded_from_alerts", "true");
    let live = Spec::new("live", 8 * MIB as i64);
    let (archive_path, _) = f.create(&archive);
    f.create(&live);
    assert_eq!(fill(&archive_path.join("kept"), MIB, None).errno, None);
    let exp = Exporter::start_with(&[&f.node.volumes_dir], &["--guard=off", "--ebpf=off"]);
    let excluded = |e: &Exposition, id: &str| {
        let at = [("volume_id", id)];
        let info: Vec<_> = e.find("nomad_host_volume_info", &at).collect();
        assert_eq!(info.len(), 1, "{id}: {info:?}");
        info[0].label("excluded_from_alerts").map(str::to_string)
    };
    let e = exp.scrape();
    assert_eq!(excluded(&e, &archive.id).as_deref(), Some("true"));
    assert_eq!(
        excluded(&e, &live.id),
        None,
        "no label without the parameter"
    );
    let record = f.record(&archive.id).expect("a record");
    assert_eq!(record["params"]["excluded_from_alerts"], true, "{record}");

    // Updates: the live volume opts out, the archive opts back in.
    let live_out = live.clone().param("excluded_from_alerts", "true");
    let archive_in = archive.clone().param("excluded_from_alerts", "false");
    f.create(&live_out);
    f.create(&archive_in);
    let e = exp.scrape();
    assert_eq!(excluded(&e, &live.id).as_deref(), Some("true"));
    assert_eq!(excluded(&e, &archive.id), None);
    assert!(
        archive_path.join("kept").is_file(),
        "an update keeps the data"
    );
    assert_eq!(
        f.quota(f.project_id(&archive.id)).limits.bytes_hard,
        8 * MIB,
        "and the limit"
    );
    // A value that is not a boolean is refused and changes nothing.
    let typo = live.clone().param("excluded_from_alerts", "yes");
    let msg = f.node.create(&typo).error();
    assert!(msg.contains("excluded_from_alerts"), "{msg}");
    assert_eq!(excluded(&exp.scrape(), &live.id).as_deref(), Some("true"));
}

#[test]
fn xfs_a_volume_excluded_from_alerts_is_exported_with_the_label() {
    a_volume_excluded_from_alerts_is_exported_with_the_label(&xfs_mount());
}

#[test]
fn ext4_a_volume_excluded_from_alerts_is_exported_with_the_label() {
    a_volume_excluded_from_alerts_is_exported_with_the_label(&ext4_mount());
}

// ---------------------------------------------------------------------------
// 5: no quota, no directory: degraded, never failed

/// Stores a Ready record for volume `id` with the plugin's own registry
/// writer, as the plugin does at the end of a create, and makes its root.
fn store_record(
    volumes_dir: &Path,
    id: &str,
    name: &str,
    namespace: &str,
    node_id: &str,
    project_id: u32,
) {
    let mut rec = ready_record(id, namespace, project_id);
    rec.volume_name = name.into();
    rec.node_id = node_id.into();
    rec.capacity_max_bytes = 16 * MIB;
    rec.provisioned_bytes = 16 * MIB;
    rec.params.mode = 0o700;
    add_volume(volumes_dir, rec);
}

/// A Ready volume where the plugin refuses to make one (no project quota):
/// a directory and a record.
fn record_volume(volumes_dir: &Path, name: &str, project_id: u32) -> String {
    let id = uuid();
    store_record(volumes_dir, &id, name, "default", &uuid(), project_id);
    id
}

#[test]
fn without_quota_or_without_a_directory_the_scrape_still_answers() {
    let noquota = scratch_dir(&xfs_noquota_mount(), "exp-noquota").join("volumes");
    std::fs::create_dir(&noquota).unwrap();
    let nq: Vec<String> = (0..2)
        .map(|i| record_volume(&noquota, &format!("nq-{i}"), 4_000_000 + i))
        .collect();
    let missing = scratch_dir(&xfs_noquota_mount(), "exp-missing").join("never-created");

    // A volumes dir on an XFS without project quota: the quota collector
    // fails, everything else is served.
    {
        let exp = Exporter::start_with(&[&noquota], &UNGUARDED);
        let e = exp.scrape();
        let ok = e.collector_successes();
        assert_eq!(ok["quota"], 0.0, "{}", e.text);
        assert_eq!(ok["registry"], 1.0);
        assert_eq!(ok["statfs"], 1.0);
        assert_eq!(e.value("prjquota_exporter_volumes", &[]), 2.0);
        assert_eq!(e.find("prjquota_exporter_build_info", &[]).count(), 1);
        for id in &nq {
            let l = [("volume_id", id.as_str())];
            assert_eq!(e.find("nomad_host_volume_info", &l).count(), 1);
            assert_eq!(
                e.value("nomad_host_volume_provisioned_bytes", &l),
                (16 * MIB) as f64
            );
            // statfs of a plain directory: the filesystem's numbers.
            assert_eq!(
                e.value("nomad_host_volume_capacity_bytes", &l),
                statvfs(&noquota).0 as f64
            );
            // No quota read: no quotactl series.
            assert_eq!(e.get("nomad_host_volume_quota_hard_limit_inodes", &l), None);
        }
        assert!(
            exp.log().contains("collector=quota"),
            "the failure is logged:\n{}",
            exp.log()
        );
    }

    // A volumes dir that does not exist: an empty inventory, no failure.
    {
        let exp = Exporter::start_with(&[&missing], &UNGUARDED);
        let e = exp.scrape();
        for (c, ok) in e.collector_successes() {
            assert_eq!(ok, 1.0, "collector {c}:\n{}", e.text);
        }
        assert_eq!(e.value("prjquota_exporter_volumes", &[]), 0.0);
        assert_eq!(
            e.samples
                .iter()
                .filter(|s| s.name.starts_with("nomad_host_volume_"))
                .count(),
            0,
            "{}",
            e.text
        );
        assert_eq!(e.find("prjquota_exporter_build_info", &[]).count(), 1);
        assert!(e
            .find("prjquota_exporter_scrape_collector_duration_seconds", &[])
            .any(|s| s.label("collector") == Some("registry")));
    }

    // All three at once: the XFS with quota keeps its quota metrics.
    {
        let f = Fixture::new(&xfs_mount(), "exp-mixed");
        let good = make(&f, &THREE[..1]);
        let exp = Exporter::start_with(&[&f.node.volumes_dir, &noquota, &missing], &UNGUARDED);
        let e = exp.scrape();
        assert_eq!(e.collector_successes()["quota"], 0.0);
        assert_eq!(e.value("prjquota_exporter_volumes", &[]), 3.0);
        let l = good[0].labels("default");
        // The project's own inode count: its quota was read.
        assert_eq!(
            e.value("nomad_host_volume_inodes_used", &l),
            good[0].inodes as f64
        );
        assert!(e.value("nomad_host_volume_used_bytes", &l) >= good[0].data_bytes as f64);
        assert_eq!(
            e.value("nomad_host_volume_capacity_bytes", &l),
            good[0].limit as f64
        );
        for id in &nq {
            let l = [("volume_id", id.as_str())];
            assert!(e.get("nomad_host_volume_capacity_bytes", &l).is_some());
        }
    }
}

// ---------------------------------------------------------------------------
// 6: a real Prometheus scrapes it

#[test]
fn prometheus_scrapes_every_volume_with_its_labels_and_values() {
    let mut f = Fixture::new(&xfs_mount(), "exp-prom");
    f.node.node_pool = "pool-p".into();
    let made = make(&f, THREE);
    let exp = Exporter::start(&[&f.node.volumes_dir]);
    let prom = Prometheus::start(&[("prjquota", exp.addr)], &[]);
    let instance = exp.addr.to_string();

    let r = prom.query_until("nomad_host_volume_capacity_bytes", |r| {
        prom::vector(r).len() == made.len()
    });
    let got = prom::vector(&r);
    for m in &made {
        let (labels, value) = got
            .iter()
            .find(|(l, _)| l.get("volume_id") == Some(&m.spec.id))
            .unwrap_or_else(|| panic!("no series for {}: {r}", m.spec.name));
        assert_eq!(*value, m.limit as f64, "{}", m.spec.name);
        assert_eq!(labels["namespace"], m.spec.namespace);
        assert_eq!(labels["node_pool"], "pool-p");
        assert_eq!(labels["job"], "prjquota");
        assert_eq!(labels["instance"], instance);
        let expected: BTreeSet<&str> = [
            "__name__",
            "namespace",
            "node_pool",
            "volume_id",
            "job",
            "instance",
        ]
        .into();
        assert_eq!(
            labels.keys().map(String::as_str).collect::<BTreeSet<_>>(),
            expected,
            "per-volume series carry only the three volume labels"
        );
    }

    let up = prom::vector(&prom.query("up{job=\"prjquota\"}"));
    assert_eq!(up.len(), 1, "{up:?}");
    assert_eq!(up[0].1, 1.0);

    // The join the design promises: names come from the info metric.
    let joined = prom::vector(&prom.query(
        "nomad_host_volume_used_bytes * on(namespace, node_pool, volume_id) group_left(volume_name, fstype) nomad_host_volume_info",
    ));
    assert_eq!(joined.len(), made.len(), "{joined:?}");
    for m in &made {
        let (labels, value) = joined
            .iter()
            .find(|(l, _)| l.get("volume_id") == Some(&m.spec.id))
            .expect("joined series");
        assert_eq!(labels["volume_name"], m.spec.name);
        assert_eq!(labels["fstype"], "xfs");
        assert!(*value >= m.data_bytes as f64);
    }
}

// ---------------------------------------------------------------------------
// 7: promtool accepts the exposition

#[test]
fn promtool_check_metrics_accepts_the_exposition() {
    let f = Fixture::new(&xfs_mount(), "exp-lint");
    let made = make(&f, THREE);
    // A hit, so that the counter has a non-zero series too.
    let r = fill(&made[0].path.join("blob"), 32 * MIB, None);
    assert_eq!(r.errno, Some(libc::ENOSPC));
    let exp = Exporter::start(&[&f.node.volumes_dir]);
    let (text, _) = exp.scrape_text();
    let lint = prom::promtool_check_metrics(&text);
    eprintln!(
        "promtool check metrics: exit {:?}\n{}",
        lint.code, lint.output
    );
    assert_eq!(
        lint.code,
        Some(0),
        "promtool:\n{}\n---\n{text}",
        lint.output
    );
}

// ---------------------------------------------------------------------------
// 8: each collector switched off takes its series, and its work, away

/// The per-volume families of each collector `--no-collector.NAME` can
/// switch off, as docs/metrics.md's "Series per volume, by collector" lists
/// them; the registry's stay whatever is switched off.
const REGISTRY_FAMILIES: &[&str] = &[
    "nomad_host_volume_info",
    "nomad_host_volume_provisioned_bytes",
    "nomad_host_volume_requested_min_bytes",
    "nomad_host_volume_requested_max_bytes",
];
const SWITCHED_FAMILIES: &[(&str, &[&str])] = &[
    (
        "statfs",
        &[
            "nomad_host_volume_capacity_bytes",
            "nomad_host_volume_available_bytes",
            "nomad_host_volume_used_bytes",
            "nomad_host_volume_inodes",
            "nomad_host_volume_inodes_free",
            "nomad_host_volume_inodes_used",
        ],
    ),
    ("quota", &["nomad_host_volume_quota_hard_limit_inodes"]),
    (
        "quota_events",
        &["nomad_host_volume_quota_limit_hits_total"],
    ),
    ("filesystem", &[]),
];

/// The families with a sample for volume `id`.
fn families_of(e: &Exposition, id: &str) -> BTreeSet<String> {
    e.samples
        .iter()
        .filter(|s| s.label("volume_id") == Some(id))
        .map(|s| s.name.clone())
        .collect()
}

/// What docs/metrics.md says volume `m` has with the collectors of `off`
/// switched off (the quota collector's series only with an inode limit).
fn documented_families(m: &Made, off: &[&str]) -> BTreeSet<String> {
    let mut want: BTreeSet<String> = REGISTRY_FAMILIES.iter().map(|s| s.to_string()).collect();
    for (collector, families) in SWITCHED_FAMILIES {
        if off.contains(collector) || (*collector == "quota" && m.max_inodes.is_none()) {
            continue;
        }
        want.extend(families.iter().map(|s| s.to_string()));
    }
    want
}

/// On a filesystem that enforces quotas, each collector switched off
/// publishes none of its series (per volume exactly as docs/metrics.md
/// counts them), says so in `collector_enabled`, and does not do its work:
/// no generic netlink socket without quota_events, no
/// `nomad_host_volumes_*` without filesystem. The others keep theirs.
fn switched_off_collectors_leave_what_the_docs_count(mount: &Path) {
    let fstype = fstype_of(mount);
    let f = Fixture::new(mount, &format!("exp-switches-{fstype}"));
    let made = make(&f, THREE);
    // eBPF and the guard have their own switches and series: off here, so
    // that the count is the four collectors' and the registry's.
    let base = ["--ebpf=off", "--guard=off"];
    let all_on = Exporter::start_with(&[&f.node.volumes_dir], &base);
    let on = all_on.scrape();
    on.assert_collectors_succeeded(&all_on.log());
    for m in &made {
        assert_eq!(
            families_of(&on, &m.spec.id),
            documented_families(m, &[]),
            "{fstype}: {} with every collector on",
            m.spec.name
        );
    }
    assert!(on.find("nomad_host_volumes_provisioned_bytes", &[]).count() > 0);
    assert_eq!(
        all_on.generic_netlink_sockets(),
        1,
        "{fstype}: quota_events on holds one generic netlink socket\n{}",
        all_on.log()
    );
    drop(all_on);

    let singles = SWITCHED_FAMILIES.iter().map(|(c, _)| vec![*c]);
    let all: Vec<&str> = SWITCHED_FAMILIES.iter().map(|(c, _)| *c).collect();
    for off in singles.chain(std::iter::once(all)) {
        let mut args: Vec<String> = base.iter().map(|s| s.to_string()).collect();
        args.extend(off.iter().map(|c| format!("--no-collector.{c}")));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let exp = Exporter::start_with(&[&f.node.volumes_dir], &args);
        let e = exp.scrape();
        e.assert_collectors_succeeded(&exp.log());
        for m in &made {
            assert_eq!(
                families_of(&e, &m.spec.id),
                documented_families(m, &off),
                "{fstype}: {} with {off:?} off",
                m.spec.name
            );
        }
        for (collector, _) in SWITCHED_FAMILIES {
            let is_off = off.contains(collector);
            assert_eq!(
                e.value(
                    "prjquota_exporter_collector_enabled",
                    &[("collector", collector)]
                ),
                if is_off { 0.0 } else { 1.0 },
                "{fstype}: {collector} with {off:?} off"
            );
            assert_eq!(
                e.get(
                    "prjquota_exporter_scrape_collector_success",
                    &[("collector", collector)]
                )
                .is_none(),
                is_off,
                "{fstype}: {collector}'s success series with {off:?} off"
            );
        }
        assert_eq!(
            e.find("nomad_host_volumes_provisioned_bytes", &[]).count() == 0,
            off.contains(&"filesystem"),
            "{fstype}: per-directory series with {off:?} off"
        );
        assert_eq!(
            exp.generic_netlink_sockets(),
            usize::from(!off.contains(&"quota_events")),
            "{fstype}: generic netlink sockets with {off:?} off\n{}",
            exp.log()
        );
    }
}

#[test]
fn xfs_switched_off_collectors_leave_what_the_docs_count() {
    switched_off_collectors_leave_what_the_docs_count(&xfs_mount());
}

#[test]
fn ext4_switched_off_collectors_leave_what_the_docs_count() {
    switched_off_collectors_leave_what_the_docs_count(&ext4_mount());
}
