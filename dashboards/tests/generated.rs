//! The shipped `alerts.yaml` and `prjquota.json` are what
//! `cargo xtask dashboards` renders from `templates/` and `config.toml`,
//! byte for byte; and a config of one's own gives rules that still behave:
//! alerts_test.yaml holds under another selector, cluster label and
//! runbook, and other thresholds move where alerts fire. (The lints of
//! dashboard.rs and promtool.rs run on a custom render too.)

use prjquota_dashboards::config::Config;
use prjquota_dashboards::{
    custom_config, dir, promtool, read, render, scratch, shipped_config, DASHBOARD, RULES,
    RULES_TEST,
};

/// Where two texts first differ, for the failure message.
fn first_difference(want: &str, got: &str) -> String {
    let (w, g): (Vec<&str>, Vec<&str>) = (want.lines().collect(), got.lines().collect());
    for i in 0..w.len().max(g.len()) {
        if w.get(i) != g.get(i) {
            return format!(
                "line {}:\n  rendered:  {:?}\n  committed: {:?}",
                i + 1,
                w.get(i).unwrap_or(&"<end>"),
                g.get(i).unwrap_or(&"<end>")
            );
        }
    }
    "the files differ only in their final newline".into()
}

#[test]
fn the_shipped_files_are_the_render_of_the_shipped_config() {
    let c = shipped_config();
    for (name, rendered) in [
        (RULES, render::rules(&c).unwrap()),
        (DASHBOARD, render::dashboard(&c).unwrap()),
    ] {
        let committed = read(name);
        assert!(
            rendered == committed,
            "dashboards/{name} is not what dashboards/templates/{name} and dashboards/config.toml \
             give: edit the template or the config, not the output, then run `{}` and commit \
             the result. First difference at {}",
            render::COMMAND,
            first_difference(&rendered, &committed)
        );
    }
}

#[test]
fn the_shipped_config_is_the_default_config() {
    assert_eq!(
        shipped_config(),
        Config::default(),
        "dashboards/config.toml and Config::default() (dashboards/src/config.rs) must give the same \
         values: a config of one's own falls back to the latter"
    );
}

/// alerts_test.yaml against the rules of the shipped thresholds with the
/// custom config's selector (which keeps the tests' exporter jobs), cluster
/// label and runbook: every expectation holds, the runbook URLs aside.
#[test]
fn the_alert_tests_hold_under_a_job_selector_and_another_cluster_label() {
    let custom = custom_config();
    let c = Config {
        selector: custom.selector.clone(),
        cluster_label: custom.cluster_label.clone(),
        runbook_url: custom.runbook_url.clone(),
        nomad: custom.nomad.clone(),
        ..Config::default()
    };
    assert!(!c.selector.is_empty() && c.cluster_label != "cluster");
    assert!(!c.nomad.selector.is_empty());
    let rules = render::rules(&c).unwrap();
    assert!(rules.contains(&format!(
        "on ({}, namespace, node_pool, volume_id)",
        c.cluster_label
    )));
    let d = scratch("alert-tests-custom");
    std::fs::write(d.join(RULES), rules).unwrap();
    let tests = read(RULES_TEST).replace(&Config::default().runbook_url, &c.runbook_url);
    assert!(tests.contains(&c.runbook_url));
    // The selector names the exporters' job, so PrjquotaExporterDown takes
    // its other form (every target of the job is an exporter), which
    // `a_named_jobs_targets_are_exporters_however_long_down` tests.
    assert!(render::names_the_job(&c));
    let tests = without_tests_of(&tests, "PrjquotaExporterDown", "prjquota_exporter:seen");
    std::fs::write(d.join(RULES_TEST), tests).unwrap();
    let out = promtool(&["test", "rules", &d.join(RULES_TEST).to_string_lossy()]);
    std::fs::remove_dir_all(&d).unwrap();
    assert!(out.contains("SUCCESS"), "{out}");
}

/// A promtool test file without the expectations about `alert` and the
/// record `record` (which that form of the rules lacks).
fn without_tests_of(text: &str, alert: &str, record: &str) -> String {
    let mut v: serde_norway::Value = serde_norway::from_str(text).expect("the tests are YAML");
    let mut dropped = 0;
    for t in v["tests"].as_sequence_mut().expect("tests:") {
        for (key, field, name) in [
            ("alert_rule_test", "alertname", alert),
            ("promql_expr_test", "expr", record),
        ] {
            if let Some(list) = t.get_mut(key).and_then(|a| a.as_sequence_mut()) {
                let before = list.len();
                list.retain(|a| !a[field].as_str().is_some_and(|f| f.contains(name)));
                dropped += before - list.len();
            }
        }
    }
    assert!(dropped > 0, "no test of {alert} or {record} to leave out");
    serde_norway::to_string(&v).expect("YAML")
}

/// With a selector that names the exporters' scrape job, as a mixin's
/// `kubeletSelector`, every target of the job is an exporter:
/// PrjquotaExporterDown fires for one that never answered (node-4), for one
/// down two days and more (node-1: the shipped form remembers it too), and,
/// with the job's name, when the job has no target at all; never for
/// another job's target (node_exporter on node-3) nor a healthy one.
#[test]
fn a_named_jobs_targets_are_exporters_however_long_down() {
    let c = Config {
        selector: "job=\"prjquota\"".into(),
        ..Config::default()
    };
    let d = scratch("job-selector");
    let rules = d.join(RULES);
    std::fs::write(&rules, render::rules(&c).unwrap()).unwrap();
    let rb = format!("{}#prjquotaexporterdown", c.runbook_url);
    let down = |instance: &str| {
        format!(
            "          - exp_labels:\n              severity: 'warning'\n              job: 'prjquota'\n              instance: '{instance}'\n            exp_annotations:\n              summary: 'prjquota-exporter is down.'\n              description: 'Prometheus has not been able to scrape prjquota-exporter on {instance} (job prjquota) for 15 minutes or more: host volume usage on those nodes is unknown and the volume alerts cannot fire.'\n              runbook_url: '{rb}'\n"
        )
    };
    let series = |s: &str, v: &str| format!("      - series: '{s}'\n        values: '{v}'\n");
    let mut t = format!(
        "rule_files:\n  - {}\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n",
        rules.display()
    );
    t += &series(
        "up{job=\"prjquota\",instance=\"node-1:14646\"}",
        "1x5 0x3000",
    );
    t += &series(
        "prjquota_exporter_build_info{job=\"prjquota\",instance=\"node-1:14646\",version=\"0.1.0\",revision=\"abc\"}",
        "1x5 stale",
    );
    t += &series("up{job=\"prjquota\",instance=\"node-2:14646\"}", "1x3005");
    t += &series(
        "prjquota_exporter_build_info{job=\"prjquota\",instance=\"node-2:14646\",version=\"0.1.0\",revision=\"abc\"}",
        "1x3005",
    );
    t += &series("up{job=\"node\",instance=\"node-3:9100\"}", "0x3005");
    t += &series("up{job=\"prjquota\",instance=\"node-4:14646\"}", "0x3005");
    t += "    alert_rule_test:\n";
    t +=
        "      - eval_time: 14m\n        alertname: PrjquotaExporterDown\n        exp_alerts: []\n";
    t += "      - eval_time: 15m\n        alertname: PrjquotaExporterDown\n        exp_alerts:\n";
    t += &down("node-4:14646");
    t += "      - eval_time: 2d\n        alertname: PrjquotaExporterDown\n        exp_alerts:\n";
    t += &down("node-1:14646");
    t += &down("node-4:14646");
    // No target of the job at all: service discovery lost them.
    t += "  - interval: 1m\n    input_series:\n";
    t += &series("up{job=\"node\",instance=\"node-3:9100\"}", "1x40");
    t += &format!(
        "    alert_rule_test:\n      - eval_time: 14m\n        alertname: PrjquotaExporterDown\n        exp_alerts: []\n\
         \x20     - eval_time: 15m\n        alertname: PrjquotaExporterDown\n        exp_alerts:\n\
         \x20         - exp_labels:\n              severity: 'warning'\n              job: 'prjquota'\n\
         \x20           exp_annotations:\n              summary: 'prjquota-exporter is down.'\n\
         \x20             description: 'Prometheus has no target of the prjquota-exporter scrape job prjquota that the rules'' selector names (service discovery lost them, or the job was renamed or removed): host volume usage on those nodes is unknown and the volume alerts cannot fire.'\n\
         \x20             runbook_url: '{rb}'\n"
    );
    run_test("job-selector-test", &t);
    std::fs::remove_dir_all(&d).unwrap();
}

const VOL: &str = "aaaaaaaa-0000-4000-8000-0000000000";

/// Labels of volume `n` of `job` on `instance`.
fn vol(n: u32, job: &str, instance: &str) -> String {
    format!(
        "namespace=\"team-a\",node_pool=\"default\",volume_id=\"{VOL}{n:02}\",instance=\"{instance}\",job=\"{job}\""
    )
}

/// A promtool unit test over `rules`: volume 1 (job prjquota-exporter) 4 %
/// free, volume 2 the same in job "other", volume 3 with 8 % of its inode
/// limit free; `expect` gives the alert tests.
fn threshold_test(rules: &std::path::Path, expect: &str) -> String {
    let mut series = Vec::new();
    for (n, job, inst) in [
        (1, "prjquota-exporter", "node-1:14646"),
        (2, "other", "node-9:14646"),
    ] {
        let l = vol(n, job, inst);
        series.push((
            format!("nomad_host_volume_info{{{l},volume_name=\"v{n}\"}}"),
            "1x30",
        ));
        series.push((
            format!("nomad_host_volume_capacity_bytes{{{l}}}"),
            "1000000000x30",
        ));
        series.push((
            format!("nomad_host_volume_available_bytes{{{l}}}"),
            "40000000x30",
        ));
        series.push((
            format!("nomad_host_volume_used_bytes{{{l}}}"),
            "960000000x30",
        ));
    }
    let l = vol(3, "prjquota-exporter", "node-1:14646");
    series.push((
        format!("nomad_host_volume_info{{{l},volume_name=\"v3\"}}"),
        "1x30",
    ));
    series.push((format!("nomad_host_volume_inodes{{{l}}}"), "1000x30"));
    series.push((format!("nomad_host_volume_inodes_free{{{l}}}"), "80x30"));
    series.push((format!("nomad_host_volume_inodes_used{{{l}}}"), "920x30"));
    series.push((
        format!("nomad_host_volume_quota_hard_limit_inodes{{{l}}}"),
        "1000x30",
    ));
    let mut t = format!(
        "rule_files:\n  - {}\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n",
        rules.display()
    );
    for (s, v) in series {
        t += &format!("      - series: '{s}'\n        values: '{v}'\n");
    }
    t += "    alert_rule_test:\n";
    t += expect;
    t
}

fn run_test(tag: &str, text: &str) {
    let d = scratch(tag);
    let f = d.join("test.yaml");
    std::fs::write(&f, text).unwrap();
    let out = promtool(&["test", "rules", &f.to_string_lossy()]);
    std::fs::remove_dir_all(&d).unwrap();
    assert!(out.contains("SUCCESS"), "{out}");
}

/// The custom config's thresholds (5 % space for 5m, 10 % inodes) fire for
/// a volume at 4 % and inodes at 8 %, which the shipped ones (3 %) leave
/// quiet; its selector keeps a job it does not select quiet.
#[test]
fn other_thresholds_and_a_selector_move_where_alerts_fire() {
    let c = custom_config();
    assert_eq!(
        (c.space.critical_available, c.inodes.critical_available),
        (0.05, 0.1)
    );
    let rules = render::rules(&c).unwrap();
    // The knobs that no input below exercises, as rendered.
    for want in [
        "predict_linear(nomad_host_volume_available_bytes{job=~\"prjquota-exporter|volumes\"}[12h], 2 * 24 * 3600)",
        "is expected to fill up within two days.",
        "for: 55m",
        "has failed to reload --web.config.file for one hour:",
        "for: 2h",
        "https://wiki.example.com/ops/prjquota-runbooks#nomadhostvolumefillingup",
    ] {
        assert!(rules.contains(want), "the custom rules lack {want:?}");
    }
    let d = scratch("thresholds");
    let custom_rules = d.join("custom.yaml");
    std::fs::write(&custom_rules, &rules).unwrap();

    let annotations = |n: u32, summary: &str, description: &str, anchor: &str| {
        format!(
            "            exp_annotations:\n              summary: '{summary}'\n              \
             description: 'The host volume v{n} ({VOL}{n:02}) in namespace team-a, node pool default, \
             on node-1:14646 {description}'\n              runbook_url: '{}#{anchor}'\n",
            c.runbook_url
        )
    };
    let labels = |alert: &str, n: u32| {
        format!(
            "          - exp_labels:\n              alertname: '{alert}'\n              severity: 'critical'\n              \
             namespace: 'team-a'\n              node_pool: 'default'\n              volume_id: '{VOL}{n:02}'\n              \
             volume_name: 'v{n}'\n              instance: 'node-1:14646'\n              job: 'prjquota-exporter'\n"
        )
    };
    let fires = format!(
        "      - eval_time: 3m\n        alertname: NomadHostVolumeFillingUp\n        exp_alerts: []\n\
         - eval_time: 10m\n        alertname: NomadHostVolumeFillingUp\n        exp_alerts:\n{}{}\
         - eval_time: 10m\n        alertname: NomadHostVolumeInodesFillingUp\n        exp_alerts:\n{}{}",
        labels("NomadHostVolumeFillingUp", 1),
        annotations(
            1,
            "Nomad host volume is filling up.",
            "is only 4% free.",
            "nomadhostvolumefillingup"
        ),
        labels("NomadHostVolumeInodesFillingUp", 3),
        annotations(
            3,
            "Nomad host volume is running out of inodes.",
            "only has 8% free inodes.",
            "nomadhostvolumeinodesfillingup"
        ),
    )
    .replace("\n- eval_time", "\n      - eval_time");
    run_test("thresholds-custom", &threshold_test(&custom_rules, &fires));

    let quiet = "      - eval_time: 10m\n        alertname: NomadHostVolumeFillingUp\n        exp_alerts: []\n\
                 \x20     - eval_time: 10m\n        alertname: NomadHostVolumeInodesFillingUp\n        exp_alerts: []\n";
    run_test(
        "thresholds-shipped",
        &threshold_test(&dir().join(RULES), quiet),
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// Nomad's labels where a scrape job honours them (`[nomad] job_label =
/// "job"`) and sets a `namespace` target label of its own, Nomad's kept as
/// `exported_namespace` (`namespace_label`): the record still names the
/// allocation's Nomad job and namespace, and keeps the exporter's `job`.
#[test]
fn the_allocation_join_reads_nomads_labels_where_the_config_says() {
    let c = Config {
        nomad: prjquota_dashboards::config::Nomad {
            selector: String::new(),
            job_label: "job".into(),
            namespace_label: "exported_namespace".into(),
        },
        ..Config::default()
    };
    let d = scratch("alloc-join-labels");
    let rules = d.join(RULES);
    std::fs::write(&rules, render::rules(&c).unwrap()).unwrap();
    let alloc = "bbbbbbbb-0000-4000-8000-0000000000c1";
    let t = format!(
        "rule_files:\n  - {rules}\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n\
         \x20     - series: 'nomad_alloc_disk_used_bytes{{alloc_id=\"{alloc}\",instance=\"node-1:14646\",job=\"prjquota-exporter\"}}'\n\
         \x20       values: '2000x10'\n\
         \x20     - series: 'nomad_client_allocs_cpu_total_ticks{{alloc_id=\"{alloc}\",exported_namespace=\"team-b\",host=\"node-1\",instance=\"node-1:4646\",job=\"batch-etl\",namespace=\"infra\",task=\"run\",task_group=\"workers\"}}'\n\
         \x20       values: '1+1x10'\n\
         \x20   promql_expr_test:\n\
         \x20     - expr: 'nomad_alloc:disk_used_bytes'\n\
         \x20       eval_time: 5m\n\
         \x20       exp_samples:\n\
         \x20         - labels: 'nomad_alloc:disk_used_bytes{{alloc_id=\"{alloc}\",instance=\"node-1:14646\",job=\"prjquota-exporter\",namespace=\"team-b\",nomad_job=\"batch-etl\",task_group=\"workers\"}}'\n\
         \x20           value: 2000\n",
        rules = rules.display()
    );
    run_test("alloc-join-labels-test", &t);
    std::fs::remove_dir_all(&d).unwrap();
}
