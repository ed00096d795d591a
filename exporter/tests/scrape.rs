//! In-process scrapes of volumes directories on this host. The host kernel
//! has no XFS quota support and the volumes here live on tmpfs, so quota
//! collection must fail gracefully while everything else is served. Real
//! quota enforcement is tested in the VM (tests/ crate, `cargo xtask test`).

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use common::*;
use prjquota_core::record::State;
use prjquota_exporter::genetlink::{self, Warning};
use prjquota_exporter::{Config, Exporter};

const A: &str = "aaaaaaaa-1111-4000-8000-000000000001";

fn config(dir: &Path, quota_events: bool) -> Config {
    Config {
        quota_events,
        ..host_config(dir)
    }
}

#[tokio::test]
async fn tmpfs_volumes_dir_degrades_quota_and_keeps_the_rest() {
    let shm = Path::new("/dev/shm");
    // Every Linux host the tests run on (CI's, the VM) has one: a host
    // without it fails here rather than passing untested.
    assert!(shm.is_dir(), "this test needs a tmpfs at /dev/shm");
    let dir = fresh_dir(shm, "tmpfs");
    add_volume(&dir, record(A, "default", 4242, State::Ready));
    let exporter = Exporter::new(&config(&dir, false));
    let text = exporter.scrape().await.to_text();
    assert!(
        text.lines()
            .any(|l| l == "prjquota_exporter_scrape_collector_success{collector=\"quota\"} 0"),
        "{text}"
    );
    for ok in ["registry", "statfs"] {
        let line = format!("prjquota_exporter_scrape_collector_success{{collector=\"{ok}\"}} 1");
        assert!(text.lines().any(|l| l == line), "{text}");
    }
    let labels = format!("{{namespace=\"default\",node_pool=\"default\",volume_id=\"{A}\"}}");
    assert!(value(&text, &format!("nomad_host_volume_capacity_bytes{labels}")).unwrap() > 0.0);
    assert!(value(&text, &format!("nomad_host_volume_inodes_used{labels}")).is_some());
    assert!(
        !text.contains("nomad_host_volume_quota_hard_limit_inodes{"),
        "{text}"
    );
    assert!(
        value(
            &text,
            &format!("nomad_host_volume_provisioned_bytes{labels}")
        ) == Some(1073741824.0)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_missing_volume_root_is_a_not_found_stats_error() {
    let dir = fresh_dir(&std::env::temp_dir(), "noroot");
    add_volume(&dir, record(A, "default", 1, State::Ready));
    std::fs::remove_dir(dir.join(A)).unwrap();
    let text = Exporter::new(&config(&dir, false)).scrape().await.to_text();
    let line = format!(
        "nomad_host_volume_stats_error{{namespace=\"default\",node_pool=\"default\",volume_id=\"{A}\",reason=\"not_found\"}} 1"
    );
    assert!(text.lines().any(|l| l == line), "{text}");
    assert!(text
        .lines()
        .any(|l| l == "prjquota_exporter_scrape_collector_success{collector=\"statfs\"} 1"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The whole netlink path on the host kernel: subscribe to VFS_DQUOT/events,
/// inject a warning into the group as the kernel would send it (needs
/// CAP_NET_ADMIN), and see it counted for the right volume.
#[tokio::test]
async fn quota_warnings_from_netlink_are_counted_per_volume() {
    let dir = fresh_dir(&std::env::temp_dir(), "netlink");
    let project = 3_000_000 + std::process::id() % 1_000_000;
    add_volume(&dir, record(A, "default", project, State::Ready));
    let exporter = Exporter::new(&config(&dir, true));
    let text = exporter.scrape().await.to_text();
    // Debian's kernels have CONFIG_QUOTA_NETLINK_INTERFACE; a kernel
    // without it fails here rather than passing untested.
    assert!(
        !text
            .lines()
            .any(|l| l == "prjquota_exporter_quota_events_subscribed 0"),
        "this test needs the kernel's quota netlink interface \
         (CONFIG_QUOTA_NETLINK_INTERFACE):\n{text}"
    );
    let labels = format!("namespace=\"default\",node_pool=\"default\",volume_id=\"{A}\"");
    let hard = format!(
        "nomad_host_volume_quota_limit_hits_total{{{labels},resource=\"bytes\",limit=\"hard\"}}"
    );
    assert_eq!(value(&text, &hard), Some(0.0), "{text}");

    let family = genetlink::resolve(genetlink::QUOTA_FAMILY).unwrap();
    let group = family.group(genetlink::QUOTA_GROUP).unwrap();
    let dev = std::fs::metadata(&dir).unwrap().dev();
    let w = Warning {
        qtype: genetlink::PRJQUOTA,
        id: project.into(),
        warning: genetlink::QUOTA_NL_BHARDWARN,
        dev_major: libc::major(dev),
        dev_minor: libc::minor(dev),
        caused_by: 0,
    };
    let msg = genetlink::warning_message(family.id, &w);
    if let Err(e) = genetlink::send_to_group(group, &msg) {
        panic!(
            "cannot send to the quota group ({e}): this test injects a kernel warning and \
             needs CAP_NET_ADMIN; run it as root, as CI does"
        );
    }
    genetlink::send_to_group(group, &msg).unwrap();
    let mut seen = None;
    for _ in 0..200 {
        let text = exporter.scrape().await.to_text();
        seen = value(&text, &hard);
        if seen == Some(2.0) {
            assert!(text
                .lines()
                .any(|l| l
                    == "prjquota_exporter_scrape_collector_success{collector=\"quota_events\"} 1"));
            std::fs::remove_dir_all(&dir).unwrap();
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the injected warnings were not counted: last value {seen:?}");
}

/// `--no-collector.X` for every switchable collector: none of their
/// series, no success series for them, and `collector_enabled` 0; the
/// registry's series and the eBPF and guard collectors stay.
#[tokio::test]
async fn switched_off_collectors_publish_nothing() {
    use prjquota_exporter::collector::SWITCHABLE;
    let dir = fresh_dir(&std::env::temp_dir(), "switched-off");
    add_volume(&dir, record(A, "default", 4242, State::Ready));
    let on = Exporter::new(&config(&dir, false)).scrape().await.to_text();
    let off = Exporter::new(&Config {
        disabled_collectors: SWITCHABLE.to_vec(),
        ..config(&dir, true)
    })
    .scrape()
    .await
    .to_text();
    // What each collector publishes here (tmpfs: no quota, so nothing
    // of the quota collector's own even when on).
    let theirs = [
        "nomad_host_volume_capacity_bytes{",
        "nomad_host_volume_inodes_used{",
        "nomad_host_volumes_filesystem_size_bytes{",
        "nomad_host_volumes_provisioned_bytes{",
        "nomad_host_volume_quota_limit_hits_total",
        "prjquota_exporter_quota_events_subscribed",
    ];
    for name in theirs {
        assert!(
            on.contains(name),
            "{name} missing with every collector on:\n{on}"
        );
        assert!(
            !off.contains(name),
            "{name} published while switched off:\n{off}"
        );
    }
    for name in SWITCHABLE {
        let success = format!("prjquota_exporter_scrape_collector_success{{collector=\"{name}\"}}");
        assert!(on.contains(&success), "{on}");
        assert!(!off.contains(&success), "{off}");
        let enabled = format!("prjquota_exporter_collector_enabled{{collector=\"{name}\"}}");
        assert_eq!(value(&on, &enabled), Some(1.0), "{on}");
        assert_eq!(value(&off, &enabled), Some(0.0), "{off}");
    }
    for stays in ["registry", "ebpf", "guard"] {
        let success =
            format!("prjquota_exporter_scrape_collector_success{{collector=\"{stays}\"}}");
        assert!(off.contains(&success), "{off}");
    }
    let labels = format!("{{namespace=\"default\",node_pool=\"default\",volume_id=\"{A}\"}}");
    assert_eq!(
        value(
            &off,
            &format!("nomad_host_volume_provisioned_bytes{labels}")
        ),
        Some(1073741824.0)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
