//! Each way the alerting went blind, staged for real: the real plugin and
//! the real exporter, then the series the alert reads, and the alert itself
//! firing in a real Prometheus that evaluates the rules (rendered with a
//! selector that names the exporters' scrape job, every `for:` cut to 1s).
//!
//! - a collector failing: the node's `prjquota.toml` broken by a typo (the
//!   plugin refuses every create with it, and the exporter's filesystem
//!   collector fails);
//! - a volumes directory the exporter does not watch: the plugin makes
//!   volumes in one, the exporter was given another;
//! - an unreadable record, which blocks creates;
//! - a create left half done: the plugin aborts after its `creating`
//!   record, as a kill at Nomad's deadline leaves it (the fault-injection
//!   build);
//! - an exporter that never started: a target of the job where nothing
//!   listens.
//!
//! ```sh
//! cargo xtask test --vm-only --filter 'binary(alerts)'
//! ```
//!
//! The VM emulates its CPU: waits are generous and reported, never
//! asserted.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use prjquota_vmtests::fixture::{Fixture, MIB};
use prjquota_vmtests::nomad::{run_plugin_with, Spec, TEST_DEADLINE};
use prjquota_vmtests::prom::{self, Exporter, Exposition, Prometheus};
use prjquota_vmtests::{fault_bin, xfs_mount};

/// The exporters' scrape job, which the rules' selector names.
const JOB: &str = "prjquota";

/// How long to wait for the alerts (reported, never asserted).
const ALERT_TIMEOUT: Duration = Duration::from_secs(600);

/// The rules as a config naming the exporters' job renders them.
fn rules_naming_the_job() -> prom::ShortRules {
    let c = prjquota_dashboards::config::Config {
        selector: format!("job=\"{JOB}\""),
        ..prjquota_dashboards::config::Config::default()
    };
    assert!(prjquota_dashboards::render::names_the_job(&c));
    prom::rules_with_short_for(&prjquota_dashboards::render::rules(&c).expect("render"))
}

/// The canonical form both sides name a volumes directory by.
fn canonical(p: &Path) -> String {
    std::fs::canonicalize(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .display()
        .to_string()
}

/// Whether `alerts` has one firing named `name` with all of `labels`.
fn fires(alerts: &[BTreeMap<String, String>], name: &str, labels: &[(&str, &str)]) -> bool {
    alerts.iter().any(|a| {
        a.get("alertname").map(String::as_str) == Some(name)
            && labels
                .iter()
                .all(|(k, v)| a.get(*k).map(String::as_str) == Some(*v))
    })
}

#[test]
fn every_blind_spot_staged_for_real_shows_in_its_series_and_fires() {
    let started = Instant::now();
    let mount = xfs_mount();

    // Node 1: the plugin makes volumes in its volumes directory, but the
    // exporter was given another, and the node's prjquota.toml breaks.
    let served = Fixture::new(&mount, "alerts-served");
    let vol = Spec::new("unwatched", 8 * MIB as i64);
    served.create(&vol);
    let elsewhere = served.root.join("not-nomads");
    std::fs::create_dir(&elsewhere).unwrap();
    served.set_config("this is not toml");
    let typo = served
        .node
        .create(&Spec::new("after-typo", MIB as i64))
        .error();
    assert!(typo.contains("prjquota.toml"), "{typo}");
    let plugin_dir = served.node.plugin_dir.display().to_string();
    let e1 = Exporter::start_with(
        &[&elsewhere],
        &["--plugin-dir", &plugin_dir, "--guard=off", "--ebpf=off"],
    );

    // Node 2: its exporter watches the right directory, where one record is
    // unreadable and one create stopped half way.
    let node2 = Fixture::with_plugin(&mount, "alerts-records", &fault_bin());
    let kept = Spec::new("kept", 8 * MIB as i64);
    let broken = Spec::new("broken", 8 * MIB as i64);
    node2.create(&kept);
    node2.create(&broken);
    let half = Spec::new("half", 8 * MIB as i64);
    let out = run_plugin_with(
        &node2.node.plugin,
        "create",
        &node2.node.create_vars(&half),
        TEST_DEADLINE,
        &[("PRJQUOTA_FAULT", "create:recorded".to_string())],
    );
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(libc::SIGABRT),
        "the create was to stop half way: {}",
        out.stderr
    );
    assert_eq!(
        node2.record(&half.id).expect("its record")["state"],
        "creating"
    );
    // A hand edit gone wrong: an editor writes a new file and renames it
    // over the record.
    let records = node2.node.volumes_dir.join(".prjquota/volumes");
    let tmp = records.join(".edit.tmp");
    std::fs::write(&tmp, b"{ \"version\": 1, \"state\": ").unwrap();
    std::fs::rename(&tmp, records.join(format!("{}.json", broken.id))).unwrap();
    let e2 = Exporter::start_with(&[&node2.node.volumes_dir], &["--guard=off", "--ebpf=off"]);

    // The series the alerts read, from each exporter.
    let m1 = e1.scrape();
    assert_eq!(
        m1.collector_successes().get("filesystem"),
        Some(&0.0),
        "the broken prjquota.toml fails the filesystem collector:\n{}",
        e1.log()
    );
    let served_dir = canonical(&served.node.volumes_dir);
    let watched = |m: &Exposition, dir: &str| {
        m.get(
            "prjquota_exporter_plugin_volumes_dir_watched",
            &[("volumes_dir", dir)],
        )
    };
    assert_eq!(
        watched(&m1, &served_dir),
        Some(0.0),
        "the plugin's volumes directory, not watched:\n{}",
        m1.text
    );
    assert_eq!(
        m1.find("nomad_host_volume_info", &[]).count(),
        0,
        "and nothing of it exported"
    );
    let m2 = e2.scrape();
    let dir2 = node2.node.volumes_dir.display().to_string();
    let at2 = [("volumes_dir", dir2.as_str())];
    assert_eq!(
        m2.value("prjquota_exporter_registry_corrupt_records", &at2),
        1.0
    );
    assert_eq!(
        m2.value(
            "prjquota_exporter_registry_pending_records",
            &[("volumes_dir", dir2.as_str()), ("state", "creating")]
        ),
        1.0
    );
    assert!(m2
        .get("nomad_host_volume_info", &[("volume_id", &broken.id)])
        .is_none());
    assert!(m2
        .get("nomad_host_volume_info", &[("volume_id", &kept.id)])
        .is_some());
    let served2 = canonical(&node2.node.volumes_dir);
    assert_eq!(watched(&m2, &served2), Some(1.0));
    assert_eq!(
        watched(&m1, &served2),
        Some(0.0),
        "node 1's exporter does not"
    );
    m2.assert_collectors_succeeded(&e2.log());
    // What the unreadable record blocks: a new volume (the promises cannot
    // be counted), and its own volume's restore.
    let refused = node2.node.create(&Spec::new("new", MIB as i64)).error();
    assert!(
        refused.contains("cannot count the size promised"),
        "{refused}"
    );
    let restore = node2.node.create(&broken).error();
    assert!(restore.contains("unreadable"), "{restore}");

    // The alerts, in a Prometheus scraping both exporters and a target of
    // the job where no exporter ever started.
    let never = format!("127.0.0.1:{}", prom::free_port());
    let short = rules_naming_the_job();
    let yaml = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - {rules:?}\n\
         scrape_configs:\n  - job_name: {JOB}\n    static_configs:\n      - targets: [{e1:?}, {e2:?}, {never:?}]\n",
        rules = short.file.display().to_string(),
        e1 = e1.addr.to_string(),
        e2 = e2.addr.to_string(),
    );
    let p = Prometheus::start_config(
        Path::new(prom::PROMETHEUS),
        &yaml,
        std::slice::from_ref(&short.file),
    );
    let (i1, i2) = (e1.addr.to_string(), e2.addr.to_string());
    let want: Vec<(&str, Vec<(&str, &str)>)> = vec![
        (
            "PrjquotaExporterCollectorFailed",
            vec![("instance", &i1), ("collector", "filesystem")],
        ),
        (
            "PrjquotaExporterVolumesDirUnwatched",
            vec![("instance", &i1), ("volumes_dir", &served_dir)],
        ),
        (
            "NomadHostVolumesRecordUnreadable",
            vec![("instance", &i2), ("volumes_dir", &dir2)],
        ),
        (
            "NomadHostVolumesOperationUnfinished",
            vec![
                ("instance", &i2),
                ("volumes_dir", &dir2),
                ("state", "creating"),
            ],
        ),
        ("PrjquotaExporterDown", vec![("instance", &never)]),
    ];
    let wait = Instant::now();
    let alerts = loop {
        let alerts = prom::firing(&p.alerts());
        let missing: Vec<&str> = want
            .iter()
            .filter(|(name, labels)| !fires(&alerts, name, labels))
            .map(|(name, _)| *name)
            .collect();
        if missing.is_empty() {
            break alerts;
        }
        assert!(
            wait.elapsed() < ALERT_TIMEOUT,
            "not firing after {}s: {missing:?}\nfiring: {alerts:#?}\nrules: {:#}",
            ALERT_TIMEOUT.as_secs(),
            p.rules()
        );
        std::thread::sleep(Duration::from_secs(1));
    };
    eprintln!(
        "MEASURE blind_spot_alerts_firing_seconds {:.1}",
        wait.elapsed().as_secs_f64()
    );
    // And only where they are due: the exporters that answer are not down,
    // node 2's exporter watches its directory, node 1 has no records.
    for (name, labels) in [
        ("PrjquotaExporterDown", vec![("instance", i1.as_str())]),
        ("PrjquotaExporterDown", vec![("instance", i2.as_str())]),
        (
            "PrjquotaExporterVolumesDirUnwatched",
            vec![("volumes_dir", served2.as_str())],
        ),
        (
            "NomadHostVolumesRecordUnreadable",
            vec![("instance", i1.as_str())],
        ),
        (
            "PrjquotaExporterCollectorFailed",
            vec![("instance", i2.as_str())],
        ),
    ] {
        assert!(
            !fires(&alerts, name, &labels),
            "{name} fires for {labels:?}: {alerts:#?}"
        );
    }
    eprintln!(
        "MEASURE blind_spots_e2e_seconds {:.1}",
        started.elapsed().as_secs_f64()
    );
}
