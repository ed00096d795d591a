//! The dashboard and the alert rules of `dashboards/` against the real
//! thing: the plugin makes two volumes on an XFS with enforced project
//! quotas, the real `prjquota-exporter` reports them, a real Prometheus
//! scrapes it every second with (a copy of) `dashboards/alerts.yaml`
//! loaded, and one volume is filled past its limit. Then:
//!
//! - `NomadHostVolumeFillingUp` and `NomadHostVolumeQuotaLimitHit` fire for
//!   the full volume, with its namespace, node pool, ID and name, and no
//!   alert names the other volume;
//! - every panel's expression, with the dashboard variables set to the full
//!   volume's node pool, namespace and ID, returns data through Prometheus'
//!   HTTP API, only for that volume, with the volume's name joined where the
//!   panel joins it (the eBPF panels may be empty when the exporter's eBPF
//!   programs are not attached: see [`EBPF_METRICS`]);
//! - every variable's `label_values` selector finds the test's values;
//! - the allocation panels: the exporter accounts two allocations of the
//!   node's alloc dir, Prometheus also scrapes a Nomad agent's telemetry
//!   (a stand-in serving what Nomad publishes for the running one), and the
//!   recording rules join the running allocation to its Nomad job, task
//!   group and namespace while the stopped one keeps its usage unjoined;
//!   with `--nomad.enforce-ephemeral-disk` and a stand-in Nomad API
//!   answering their sizes, both are limited, the limits join as the usage
//!   does, and `NomadAllocEphemeralDiskOverSize` fires for the stopped one,
//!   which was over its size when limited, and for no other.
//!
//! The copy of the rules has every `for:` shortened to 1s, so the alerts
//! fire within seconds of the condition; everything else is as shipped.
//!
//! Runs in the VM (`cargo xtask test`), like every test of this package:
//!
//! ```sh
//! cargo xtask test --vm-only --filter 'binary(dashboards)'   # add --kernel 5.10|6.12|7 for another kernel
//! ```
//!
//! The VM emulates its CPU: waits are generous and reported (`MEASURE`),
//! never asserted.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use prjquota_vmtests::fixture::{fill, writable, Fixture, MIB, WRITER, XFS};
use prjquota_vmtests::nomad::Spec;
use prjquota_vmtests::nomad_alloc::{write_file, AllocNode};
use prjquota_vmtests::nomad_api;
use prjquota_vmtests::nomad_telemetry::{self, Agent};
use prjquota_vmtests::prom::{self, vector, Prometheus};
use prjquota_vmtests::xfs_mount;
use serde_json::Value;

/// Metrics only the exporter's eBPF programs produce. A panel reading one
/// of them may return nothing when no program is attached (the exporter
/// degrades, and `prjquota_exporter_ebpf_program_attached` says so; on a
/// build without the eBPF collector the metrics do not exist at all).
/// When a program is attached, these panels must return data like the rest.
const EBPF_METRICS: &[&str] = &[
    "nomad_host_volume_written_bytes_total",
    "nomad_host_volume_write_operations_total",
    "nomad_host_volume_write_errors_total",
    "prjquota_exporter_ebpf_program_attached",
];

/// The scrape job: no rule and no panel depends on its name, so it is one
/// without "prjquota" in it.
const JOB: &str = "nomad-volumes";
/// The `cluster` target label the test's scrape config sets, which the
/// dashboard's `cluster` variable finds.
const CLUSTER: &str = "vm-cluster";
/// The scrape job of the Nomad agent's telemetry.
const NOMAD_JOB: &str = "nomad";
/// The running allocation's Nomad job and task group.
const ALLOC_JOB: &str = "dash-shop";
const ALLOC_GROUP: &str = "frontend";

/// How long to wait for the alerts (reported, never asserted).
const ALERT_TIMEOUT: Duration = Duration::from_secs(900);
/// How long a panel that must show data may stay empty: a few scrapes.
const EMPTY_PANEL_RETRY: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------
// The artefacts under test

/// `dashboards/alerts.yaml` with every `for:` set to 1s.
fn rules_with_short_for() -> prom::ShortRules {
    let src = prjquota_dashboards::dir().join(prjquota_dashboards::RULES);
    let text =
        std::fs::read_to_string(&src).unwrap_or_else(|e| panic!("read {}: {e}", src.display()));
    prom::rules_with_short_for(&text)
}

/// (panel title, refId, expression, panel type) of every panel target.
fn panel_targets(d: &Value) -> Vec<(String, String, String, String)> {
    fn walk(list: &Value, out: &mut Vec<(String, String, String, String)>) {
        for p in list.as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                out.push((
                    p["title"].as_str().unwrap_or("").to_string(),
                    t["refId"].as_str().unwrap_or("").to_string(),
                    t["expr"].as_str().unwrap_or("").to_string(),
                    p["type"].as_str().unwrap_or("").to_string(),
                ));
            }
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&d["panels"], &mut out);
    out
}

/// Grafana's substitution of `${x}` and `$x` (longest names first).
fn substitute(expr: &str, vars: &[(&str, String)]) -> String {
    let mut vars: Vec<&(&str, String)> = vars.iter().collect();
    vars.sort_by_key(|(n, _)| std::cmp::Reverse(n.len()));
    let mut s = expr.to_string();
    for (name, value) in vars {
        s = s.replace(&format!("${{{name}}}"), value);
        s = s.replace(&format!("${name}"), value);
    }
    assert!(!s.contains('$'), "a variable is left in {s}");
    s
}

fn reads_ebpf(expr: &str) -> bool {
    EBPF_METRICS.iter().any(|m| expr.contains(m))
}

/// Counters of events this test does not stage, whose panels show only
/// the volumes (or nodes) where they happened: no quota escape is
/// attempted here (tests/tests/guard.rs attempts them).
const NOT_STAGED: &[&str] = &[
    "nomad_host_volume_projid_change_attempts_total",
    "prjquota_exporter_guard_unattributed_attempts_total",
    "prjquota_exporter_guard_outside_attempts_total",
];

// ---------------------------------------------------------------------------

#[test]
fn a_volume_filling_past_its_limit_shows_on_every_panel_and_fires_its_alerts() {
    let started = Instant::now();
    let mut node = AllocNode::new(&XFS, "dashboards", 4);
    // Two allocations on the node, accounted by the exporter: one running,
    // which Nomad's agent publishes, and one stopped, whose directory Nomad
    // has not collected yet (no series of Nomad's).
    let mut running = node.root.build_alloc();
    write_file(
        &running.build_task("web").join("local/cache.bin"),
        MIB as usize,
    );
    let mut stopped = node.root.build_alloc();
    write_file(
        &stopped.build_task("batch").join("local/out.bin"),
        3 * MIB as usize,
    );
    // Nomad's API tells their ephemeral_disk.size: the running one's well
    // above what it holds, the stopped one's (1 MiB) below.
    let api = nomad_api::Agent::start("vm-node");
    api.add_allocation(&running.id, "team-dash", 300);
    api.add_allocation(&stopped.id, "team-dash", 1);
    let api_url = api.url();
    let agent = Agent::serve(nomad_telemetry::exposition(
        "vm-node",
        &[nomad_telemetry::Task {
            alloc_id: &running.id,
            job: ALLOC_JOB,
            namespace: "team-dash",
            task_group: ALLOC_GROUP,
            task: "web",
        }],
    ));
    let f = &mut node.fixture;
    f.node.node_pool = "pool-dash".into();
    let mut full = writable(Spec::new("dash-full", 16 * MIB as i64));
    full.namespace = "team-dash".into();
    let mut calm = writable(Spec::new("dash-calm", 64 * MIB as i64));
    calm.namespace = "team-dash".into();
    let (full_path, _) = f.create(&full);
    let (calm_path, _) = f.create(&calm);
    let r = fill(&calm_path.join("some.bin"), MIB, Some(WRITER));
    assert_eq!(r.errno, None, "{r:?}");

    // The node's plugin dir, as a real node's exporter is given it: the
    // "Promised vs disk" panel reads the overcommit_ratio in force there;
    // and its alloc dir, eBPF and the guard as they default.
    let args = node.exporter_args(
        "200ms",
        &[
            "--ebpf=auto",
            "--guard=auto",
            "--nomad.addr",
            &api_url,
            "--nomad.enforce-ephemeral-disk",
        ],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let exporter = prom::Exporter::start_with(&[&node.fixture.node.volumes_dir], &args);
    let short = rules_with_short_for();
    let rules = short.file.clone();
    // The scrape config of the test's Prometheus: the exporter labelled
    // with a cluster as relabelling or static labels would, and the Nomad
    // agent's telemetry as Nomad's guide scrapes it.
    let yaml = format!(
        "{}        labels:\n          cluster: {CLUSTER}\n{}",
        prom::config_yaml(&[(JOB, exporter.addr)], std::slice::from_ref(&rules)),
        agent.scrape_config(NOMAD_JOB, &[("cluster", CLUSTER)])
    );
    let prom = Prometheus::start_config(
        Path::new(prom::PROMETHEUS),
        &yaml,
        std::slice::from_ref(&rules),
    );
    let has_data = |r: &Value| r.as_array().is_some_and(|a| !a.is_empty());
    prom.query_until(
        &format!("nomad_host_volume:used_ratio{{volume_id=\"{}\"}}", full.id),
        has_data,
    );
    // Both allocations recorded: the running one joined to its Nomad job.
    prom.query_until(
        &format!(
            "nomad_alloc:disk_used_bytes{{alloc_id=\"{}\", nomad_job=\"{ALLOC_JOB}\"}}",
            running.id
        ),
        has_data,
    );
    prom.query_until(
        &format!("nomad_alloc:disk_used_bytes{{alloc_id=\"{}\"}}", stopped.id),
        has_data,
    );
    // Both limited: the running one at its size, joined to its Nomad job.
    prom.query_until(
        &format!(
            "nomad_alloc:disk_limit_bytes{{alloc_id=\"{}\", nomad_job=\"{ALLOC_JOB}\"}} == {}",
            running.id,
            300 * MIB
        ),
        has_data,
    );

    // Fill in steps, so the trend panels see space shrink over several
    // scrapes, then past the limit.
    for i in 0..3 {
        let r = fill(
            &full_path.join(format!("part-{i}.bin")),
            4 * MIB,
            Some(WRITER),
        );
        assert_eq!(r.errno, None, "{r:?}");
        // Let Prometheus scrape each step (a wait for a sample, not a time).
        let used = (i + 1) as f64 * 4.0 * MIB as f64;
        prom.query_until(
            &format!(
                "nomad_host_volume_used_bytes{{volume_id=\"{}\"}} >= {used}",
                full.id
            ),
            has_data,
        );
    }
    let r = fill(&full_path.join("last.bin"), 32 * MIB, Some(WRITER));
    assert_eq!(
        r.errno,
        Some(libc::ENOSPC),
        "XFS refuses the write at the limit: {r:?}"
    );

    // The alerts: both fire for the full volume, none names the other.
    let wait = Instant::now();
    let want = ["NomadHostVolumeFillingUp", "NomadHostVolumeQuotaLimitHit"];
    let alerts = loop {
        let alerts = prom.alerts();
        let firing: BTreeSet<&str> = alerts
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| a["state"] == "firing" && a["labels"]["volume_id"] == full.id.as_str())
            .filter_map(|a| a["labels"]["alertname"].as_str())
            .collect();
        if want.iter().all(|w| firing.contains(w)) {
            break alerts;
        }
        assert!(
            wait.elapsed() < ALERT_TIMEOUT,
            "{want:?} not firing for {} after {}s; alerts: {alerts:#}\nrules: {:#}\nexporter log:\n{}",
            full.id,
            ALERT_TIMEOUT.as_secs(),
            prom.rules(),
            exporter.log()
        );
        std::thread::sleep(Duration::from_secs(1));
    };
    eprintln!(
        "MEASURE dashboards_alerts_firing_seconds {:.1}",
        wait.elapsed().as_secs_f64()
    );
    for a in alerts.as_array().unwrap() {
        let l = &a["labels"];
        let name = l["alertname"].as_str().unwrap_or("");
        assert_ne!(
            l["volume_id"],
            calm.id.as_str(),
            "an alert for the volume that is not full: {a:#}"
        );
        if !want.contains(&name) || a["state"] != "firing" {
            continue;
        }
        assert_eq!(
            l["volume_id"],
            full.id.as_str(),
            "{name} for another volume: {a:#}"
        );
        assert_eq!(l["namespace"], "team-dash", "{a:#}");
        assert_eq!(l["node_pool"], "pool-dash", "{a:#}");
        assert_eq!(l["volume_name"], "dash-full", "{a:#}");
        assert_eq!(l["job"], JOB, "{a:#}");
        let ann = &a["annotations"];
        let description = ann["description"].as_str().unwrap_or("");
        assert!(
            description.contains("dash-full") && description.contains(&full.id),
            "{name}: {description}"
        );
        assert!(
            ann["runbook_url"]
                .as_str()
                .is_some_and(|u| u.ends_with(&format!("#{}", name.to_lowercase()))),
            "{a:#}"
        );
        if name == "NomadHostVolumeQuotaLimitHit" {
            assert_eq!(l["resource"], "bytes", "{a:#}");
            assert_eq!(l["limit"], "hard", "{a:#}");
        }
    }

    // The stopped allocation was over its size when limited: its alert
    // fires, and names no other allocation.
    let wait = Instant::now();
    let over = "NomadAllocEphemeralDiskOverSize";
    let alert = loop {
        let alerts = prom.alerts();
        let found = alerts.as_array().into_iter().flatten().find(|a| {
            a["state"] == "firing"
                && a["labels"]["alertname"] == over
                && a["labels"]["alloc_id"] == stopped.id.as_str()
        });
        if let Some(a) = found {
            break a.clone();
        }
        assert!(
            wait.elapsed() < ALERT_TIMEOUT,
            "{over} not firing for {} after {}s; alerts: {alerts:#}\nexporter log:\n{}",
            stopped.id,
            ALERT_TIMEOUT.as_secs(),
            exporter.log()
        );
        std::thread::sleep(Duration::from_secs(1));
    };
    eprintln!(
        "MEASURE dashboards_alloc_alert_firing_seconds {:.1}",
        wait.elapsed().as_secs_f64()
    );
    assert!(
        alert["annotations"]["runbook_url"]
            .as_str()
            .is_some_and(|u| u.ends_with(&format!("#{}", over.to_lowercase()))),
        "{alert:#}"
    );
    for a in prom.alerts().as_array().unwrap() {
        if a["labels"]["alertname"] == over {
            assert_eq!(a["labels"]["alloc_id"], stopped.id.as_str(), "{a:#}");
        }
    }

    // Every panel, with the variables set to the full volume.
    let ebpf_attached = has_data(&prom.query("prjquota_exporter_ebpf_program_attached == 1"));
    eprintln!("eBPF programs attached: {ebpf_attached}");
    let vars: Vec<(&str, String)> = vec![
        ("cluster", CLUSTER.into()),
        ("job", JOB.into()),
        ("instance", exporter.addr.to_string()),
        ("node_pool", "pool-dash".into()),
        ("namespace", "team-dash".into()),
        ("volume", full.id.clone()),
        ("top", "20".into()),
        ("__rate_interval", "1m".into()),
        ("__interval", "15s".into()),
        ("__range", "1h".into()),
    ];
    let d = prjquota_dashboards::dashboard();
    let targets = panel_targets(&d);
    assert!(targets.len() > 20, "only {} panel targets", targets.len());
    let mut empty = Vec::new();
    let mut allowed_empty = Vec::new();
    let mut label_sets: BTreeMap<String, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (title, ref_id, expr, kind) in &targets {
        let q = substitute(expr, &vars);
        // One scrape that failed (1 s timeout; a loaded host, a second VM)
        // marks every series stale until the next: an empty panel is asked
        // again over a few scrapes before it counts as empty.
        let may_be_empty =
            (reads_ebpf(expr) && !ebpf_attached) || NOT_STAGED.iter().any(|m| expr.contains(m));
        let result = if may_be_empty {
            prom.query(&q)
        } else {
            prom.query_within(&q, EMPTY_PANEL_RETRY, |r| !vector(r).is_empty())
                .unwrap_or_else(|last| last)
        };
        let series = vector(&result);
        let place = format!("panel {title:?} target {ref_id}");
        if series.is_empty() {
            if may_be_empty {
                allowed_empty.push(place);
            } else {
                empty.push(format!("{place}: {q}"));
            }
            continue;
        }
        for (labels, _) in &series {
            if let Some(id) = labels.get("volume_id") {
                assert_eq!(
                    id, &full.id,
                    "{place} ignores the volume selection: {q}\n{result:#}"
                );
            }
            if expr.contains("group_left (volume_name)") {
                assert_eq!(
                    labels.get("volume_name").map(String::as_str),
                    Some("dash-full"),
                    "{place} does not carry the volume's name: {q}\n{result:#}"
                );
            }
        }
        if kind == "table" {
            // Every label any row has: a row may lack one (an allocation
            // without Nomad's labels), where Grafana leaves the cell empty.
            let keys: BTreeSet<String> =
                series.iter().flat_map(|(l, _)| l.keys().cloned()).collect();
            label_sets
                .entry(title.clone())
                .or_default()
                .insert(keys.into_iter().collect());
        }
    }
    assert!(
        empty.is_empty(),
        "panels without data:\n{}\ntargets: {}",
        empty.join("\n"),
        prom.targets()
    );
    if !allowed_empty.is_empty() {
        eprintln!(
            "eBPF not attached: empty as allowed: {}",
            allowed_empty.join(", ")
        );
    }
    // The allocations' table: the running allocation under its Nomad job
    // and task group, the stopped one without them, each with what it
    // holds.
    let table = targets
        .iter()
        .find(|(title, ref_id, _, _)| title == "Allocations by disk used" && ref_id == "A")
        .expect("the allocations' table");
    let rows = vector(&prom.query(&substitute(&table.2, &vars)));
    let row = |id: &str| {
        rows.iter()
            .find(|(l, _)| l.get("alloc_id").map(String::as_str) == Some(id))
            .unwrap_or_else(|| panic!("no row for allocation {id}: {rows:?}"))
    };
    let (labels, used) = row(&running.id);
    assert_eq!(
        labels.get("nomad_job").map(String::as_str),
        Some(ALLOC_JOB),
        "{labels:?}"
    );
    assert_eq!(
        labels.get("task_group").map(String::as_str),
        Some(ALLOC_GROUP),
        "{labels:?}"
    );
    assert_eq!(
        labels.get("namespace").map(String::as_str),
        Some("team-dash"),
        "{labels:?}"
    );
    assert!(
        *used >= MIB as f64,
        "the running allocation holds {used} bytes"
    );
    let (labels, used) = row(&stopped.id);
    assert_eq!(labels.get("nomad_job"), None, "{labels:?}");
    assert!(
        *used >= MIB as f64,
        "the stopped allocation holds {used} bytes"
    );

    // A table merges its queries by their labels: they must be the same.
    for (title, sets) in &label_sets {
        assert_eq!(
            sets.len(),
            1,
            "table {title:?}: its queries' labels differ: {sets:?}"
        );
    }

    // The variables find the test's values: a `label_values` variable the
    // label's values of its selector, the volume picker the volumes (by
    // ID, named) of its `query_result` through its regex, as Grafana
    // makes its options.
    for v in prjquota_dashboards::variables(&d) {
        if v["type"] != "query" {
            continue;
        }
        let name = v["name"].as_str().unwrap();
        let query = prjquota_dashboards::variable_query(v).unwrap();
        let want = &vars.iter().find(|(n, _)| *n == name).unwrap().1;
        if let Some((selector, label)) = prjquota_dashboards::label_values(query) {
            let found: BTreeSet<String> = vector(&prom.query(&substitute(&selector, &vars)))
                .into_iter()
                .filter_map(|(l, _)| l.get(&label).cloned())
                .collect();
            assert!(
                found.contains(want),
                "variable {name}: {query} found {found:?}"
            );
            continue;
        }
        let expr = prjquota_dashboards::query_result(query).unwrap_or_else(|| {
            panic!("variable {name}: neither label_values nor query_result: {query}")
        });
        let result = prom.query(&substitute(&expr, &vars));
        let texts: Vec<String> = result
            .as_array()
            .into_iter()
            .flatten()
            .map(prjquota_dashboards::grafana::query_result_text)
            .collect();
        let regex = v["regex"].as_str().unwrap_or("");
        let options = prjquota_dashboards::grafana::regex_options(regex, &texts)
            .unwrap_or_else(|e| panic!("variable {name}: {e}"));
        for (id, volume_name) in [
            (want.as_str(), "dash-full"),
            (calm.id.as_str(), "dash-calm"),
        ] {
            assert!(
                options.contains(&(id.to_string(), volume_name.to_string())),
                "variable {name}: no option valued {id} named {volume_name}: {options:?}\n\
                 from {texts:?} by {regex}"
            );
        }
    }
    // Annotations evaluate (they may be empty by now).
    for a in d["annotations"]["list"].as_array().unwrap() {
        if let Some(e) = a["expr"].as_str() {
            prom.query(&substitute(e, &vars));
        }
    }
    eprintln!(
        "MEASURE dashboards_e2e_seconds {:.1}",
        started.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------------------
// OpenMetrics: the first write error of a fresh volume counts

/// `config_yaml` with `scrape_protocols` (Prometheus 2.49 and later) in its
/// global section.
fn with_protocols(yaml: &str, protocols: &str) -> String {
    yaml.replacen(
        "global:\n",
        &format!("global:\n  scrape_protocols: [{protocols}]\n"),
        1,
    )
}

/// A fresh volume's first failed write is one burst: its errno series
/// appears with the whole count at once. Prometheus 3 scraping OpenMetrics
/// with created-timestamp ingestion stores a 0 at the series' `_created`,
/// so `increase()` sees the burst and `NomadHostVolumeWriteErrors` fires;
/// the same Prometheus scraping text 0.0.4 (the control) sees a series that
/// never moves. Prometheus 2 negotiates OpenMetrics by default and must keep
/// scraping it (it stores `_created` as series of their own).
#[test]
fn the_first_write_error_of_a_fresh_volume_counts_in_prometheus_3_with_openmetrics() {
    let prom3 = prom::prometheus3().expect(
        "PRJQUOTA_PROMETHEUS3 is not set (`cargo xtask deps` fetches Prometheus 3 into target/prometheus3)",
    );
    let f = Fixture::new(&xfs_mount(), "om-first");
    let spec = writable(Spec::new("om-fresh", 8 * MIB as i64));
    let (path, _) = f.create(&spec);
    let exporter = prom::Exporter::start_with(
        &[&f.node.volumes_dir],
        &["--web.openmetrics.created-samples"],
    );
    let short = rules_with_short_for();
    let rules = short.file.clone();
    let base = prom::config_yaml(&[(JOB, exporter.addr)], std::slice::from_ref(&rules));
    let ct = Prometheus::start_config_with(
        &prom3,
        &with_protocols(&base, "OpenMetricsText1.0.0, PrometheusText0.0.4"),
        std::slice::from_ref(&rules),
        &["--enable-feature=created-timestamp-zero-ingestion"],
    );
    let text = Prometheus::start_config(
        &prom3,
        &with_protocols(&base, "PrometheusText0.0.4"),
        std::slice::from_ref(&rules),
    );
    let two = Prometheus::start_config(
        Path::new(prom::PROMETHEUS),
        &base,
        std::slice::from_ref(&rules),
    );
    let has_data = |r: &Value| r.as_array().is_some_and(|a| !a.is_empty());
    let id = &spec.id;
    let written = format!("nomad_host_volume_written_bytes_total{{volume_id=\"{id}\"}}");
    for p in [&ct, &text, &two] {
        p.query_until(&written, has_data);
    }
    let errors =
        format!("nomad_host_volume_write_errors_total{{volume_id=\"{id}\",errno=\"ENOSPC\"}}");
    for p in [&ct, &text, &two] {
        assert!(
            vector(&p.query(&errors)).is_empty(),
            "no failed write yet, no errno series"
        );
    }

    // One burst: the write that finds the quota full.
    let r = fill(&path.join("blob"), 32 * MIB, Some(WRITER));
    assert_eq!(r.errno, Some(libc::ENOSPC), "{r:?}");

    // Prometheus 3 with created timestamps: increase() sees it, the alert
    // fires, and no `_created` series is stored.
    let increase = format!("increase({errors}[1m]) > 0");
    let got = vector(&ct.query_until(&increase, has_data));
    assert_eq!(got.len(), 1, "{got:?}");
    let wait = Instant::now();
    loop {
        let alerts = ct.alerts();
        let firing = alerts.as_array().into_iter().flatten().any(|a| {
            a["labels"]["alertname"] == "NomadHostVolumeWriteErrors"
                && a["labels"]["volume_id"] == id.as_str()
                && a["state"] == "firing"
        });
        if firing {
            break;
        }
        assert!(
            wait.elapsed() < ALERT_TIMEOUT,
            "NomadHostVolumeWriteErrors never fired: {alerts}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!(
        "MEASURE first_error_alert_seconds {:.2}",
        wait.elapsed().as_secs_f64()
    );
    let created_series = vector(&ct.query("count({__name__=~\".+_created\"})"));
    assert!(created_series.is_empty(), "{created_series:?}");
    let outcome = |p: &Prometheus| {
        // The series, and a few scrapes after it appeared.
        let r = p.query_until(&format!("count_over_time({errors}[1m]) >= 5"), has_data);
        assert_eq!(vector(&r).len(), 1, "{r}");
        vector(&p.query(&increase))
    };
    // The control: text 0.0.4 gives Prometheus nothing before the burst.
    let control = outcome(&text);
    assert!(
        control.is_empty(),
        "without _created the first burst cannot count, yet: {control:?}"
    );
    // Prometheus 2 scrapes OpenMetrics: its `_created` samples are there
    // as series of their own, with the creation time (before the error).
    // Asked until its scrape brings them: the three servers scrape on
    // their own clocks, and one that missed a scrape on a loaded host has
    // not stored them yet when the others have.
    let created = vector(&two.query_until(
        &format!("nomad_host_volume_write_errors_created{{volume_id=\"{id}\",errno=\"ENOSPC\"}}"),
        has_data,
    ));
    assert_eq!(
        created.len(),
        1,
        "Prometheus 2 did not scrape OpenMetrics: {created:?}"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        created[0].1 < now && created[0].1 > now - 600.0,
        "{created:?}"
    );
    let up = vector(&two.query(&format!("up{{job=\"{JOB}\"}}")));
    assert_eq!(up.len(), 1);
    assert_eq!(up[0].1, 1.0, "{up:?}");
    eprintln!(
        "Prometheus 2 (no created-timestamp ingestion) sees the burst as: {:?}",
        outcome(&two)
    );
}

// ---------------------------------------------------------------------------
// A node of 10,000 volumes: what every panel draws

/// The volumes of the scale test.
const SCALE_VOLUMES: u32 = 10_000;
/// Volumes written to during it, more than the Top N: the write panels
/// must choose.
const WRITTEN: u32 = 40;
/// The panels asked again at N = 5.
const AT_5: [&str; 4] = [
    "Fullest volumes",
    "Space used (%)",
    "Quota limit hits",
    "Firing alerts",
];

/// How many series (or table rows) a panel target draws: a range query as
/// Grafana runs a time series panel's over the dashboard's range, the
/// instant query of a stat, gauge or table; and how long the query took.
fn series_drawn(
    prom: &Prometheus,
    target: &Value,
    expr: &str,
    (start, end, step): (f64, f64, f64),
) -> (usize, Duration) {
    let t = Instant::now();
    let result = if target["instant"].as_bool() == Some(true) {
        prom.api(&format!(
            "/api/v1/query?query={}&time={end:.3}",
            prjquota_vmtests::http::url_encode(expr)
        ))["result"]
            .clone()
    } else {
        prom.query_range(expr, start, end, step)
    };
    let sets: BTreeSet<String> = result
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| s["metric"].to_string())
        .collect();
    (sets.len(), t.elapsed())
}

/// Every panel of the dashboard against a node of 10,000 volumes, scraped
/// from the real exporter by a real Prometheus with the shipped rules: the
/// variables set as a first visit leaves them (every cluster, job, node,
/// pool, namespace and volume) and Top N at 20, then 5. A panel that draws
/// one series per volume (or allocation, or firing alert) draws N at most,
/// and those that must show the N fullest show exactly N; the count of
/// every panel target is printed (`MEASURE dashboard_series{…}`).
///
/// The volumes are made the quick way (directory, limit, tag and record,
/// no plugin run: what is measured is the dashboard, not the create); 40
/// of them, of 1 MiB, are written twice their size in two rounds, so that
/// they fill, their writes fail at the limit and their alerts fire. The guard is off: it draws per node, not per volume, and
/// loading it beside 10,000 roots is most of a start under emulation.
/// Runs alone in its VM boot (.config/nextest.toml).
#[test]
fn a_node_of_10000_volumes_draws_at_most_n_series_per_panel() {
    let started = Instant::now();
    let root = prjquota_vmtests::scratch_dir(&prjquota_vmtests::xfs_mount(), "dash-10k");
    let volumes_dir = root.join("volumes");
    // Outside every Fixture's project IDs (10,000,000 to 410,000,000) and
    // the scrape_cost crowd's (600,000,000 + pid % 1000 × 20,000).
    let base = 800_000_000 + (std::process::id() % 1000) * 20_000;
    let node_id = prjquota_vmtests::nomad::uuid();
    let made = Instant::now();
    let edit = |i: u32, rec: &mut prjquota_core::record::Record| {
        rec.volume_name = format!("vol-{i}");
        rec.namespace = format!("ns-{}", i % 10);
        rec.node_pool = format!("pool-{}", i % 3);
        rec.node_id = node_id.clone();
    };
    // The written ones are small, so that they fill and their writes fail
    // at the limit: every per-volume panel then has more candidates than N.
    let mut roots =
        prjquota_vmtests::records::add_quick_volumes(&volumes_dir, 0..WRITTEN, base, MIB, edit);
    roots.extend(prjquota_vmtests::records::add_quick_volumes(
        &volumes_dir,
        WRITTEN..SCALE_VOLUMES,
        base,
        64 * MIB,
        edit,
    ));
    assert_eq!(roots.len(), SCALE_VOLUMES as usize);
    eprintln!(
        "MEASURE dashboard_scale_create_seconds{{volumes=\"{SCALE_VOLUMES}\"}} {:.1}",
        made.elapsed().as_secs_f64()
    );
    let exporter = prom::Exporter::start_with(&[&volumes_dir], &["--guard=off", "--ebpf=auto"]);
    // Up to twice the limit, 64 KiB a write (XFS refuses a single write
    // larger than what is left whole), onto one file: the first round fills
    // each volume and is refused at its limit (ENOSPC, for root too), the
    // second round's first write is refused (a write, which eBPF counts,
    // not the create of a file).
    let write_round = |_round: u32| {
        use std::io::Write;
        for r in roots.iter().take(WRITTEN as usize) {
            let path = r.join("data");
            let chunk = vec![b'x'; 64 * 1024];
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
            let e = (0..32)
                .find_map(|_| f.write_all(&chunk).err())
                .unwrap_or_else(|| panic!("{}: twice the limit fit", path.display()));
            assert_eq!(
                e.raw_os_error(),
                Some(libc::ENOSPC),
                "{}: {e}",
                path.display()
            );
        }
    };
    // Every 30 s: a scrape of 10,000 volumes, and an evaluation of the
    // rules over them, take seconds under emulation (more beside another
    // VM); the rate panels need a few samples.
    let every = "30s";
    let rules = prjquota_dashboards::dir().join(prjquota_dashboards::RULES);
    let yaml = prom::config_yaml(&[(JOB, exporter.addr)], std::slice::from_ref(&rules))
        .replace("scrape_interval: 1s", &format!("scrape_interval: {every}"))
        .replace("scrape_timeout: 1s", &format!("scrape_timeout: {every}"))
        .replace(
            "evaluation_interval: 1s",
            &format!("evaluation_interval: {every}"),
        );
    let p = Prometheus::start_config(
        Path::new(prom::PROMETHEUS),
        &yaml,
        std::slice::from_ref(&rules),
    );
    let wait = |q: &str| {
        p.query_until_for(q, Duration::from_secs(900), |r| {
            r.as_array().is_some_and(|a| !a.is_empty())
        })
    };
    wait(&format!(
        "count(nomad_host_volume:used_ratio) == {SCALE_VOLUMES}"
    ));
    write_round(1);
    let written = roots[0].file_name().unwrap().to_string_lossy().to_string();
    let first = format!("nomad_host_volume_used_bytes{{volume_id=\"{written}\"}}");
    wait(&format!("{first} > 0"));
    write_round(2);
    // Enough samples after the second round for every rate, and the alerts
    // on the full volumes evaluated.
    wait(&format!("count_over_time({first}[5m]) >= 6"));
    wait("count(ALERTS{alertname=\"NomadHostVolumeQuotaLimitHit\", alertstate=\"firing\"}) >= 20");
    let ebpf = !vector(&p.query("prjquota_exporter_ebpf_program_attached == 1")).is_empty();
    eprintln!("eBPF programs attached: {ebpf}");
    // The panels are asked about the range up to the last scrape, from a
    // Prometheus that stopped scraping and evaluating (a reload without
    // them): the queries have the emulated CPU to themselves.
    let end = p.query("timestamp(up)")[0]["value"][1]
        .as_str()
        .and_then(|v| v.parse::<f64>().ok())
        .expect("the last scrape's time");
    p.reload(&prom::config_yaml(&[], &[]), 0);
    let range = (end - 300.0, end, 30.0);
    let d = prjquota_dashboards::dashboard();
    let mut problems = Vec::new();
    for top in [20usize, 5] {
        let vars: Vec<(&str, String)> = vec![
            ("cluster", ".*".into()),
            ("job", JOB.into()),
            ("instance", ".*".into()),
            ("node_pool", ".*".into()),
            ("namespace", ".*".into()),
            ("volume", ".*".into()),
            ("top", top.to_string()),
            ("__rate_interval", "2m".into()),
            ("__interval", "30s".into()),
            ("__range", "5m".into()),
        ];
        for panel in prjquota_dashboards::panels(&d) {
            let kind = panel["type"].as_str().unwrap_or("");
            let title = panel["title"].as_str().unwrap_or("");
            for t in panel["targets"].as_array().into_iter().flatten() {
                let per_volume = prjquota_dashboards::draws_per_item(t, kind);
                // At N = 5, a table, a time series of gauges and one of
                // counters, and the alerts: each query of 10,000 volumes
                // takes seconds under emulation.
                if top != 20 && !AT_5.contains(&title) {
                    continue;
                }
                let ref_id = t["refId"].as_str().unwrap_or("");
                let expr = substitute(t["expr"].as_str().unwrap_or(""), &vars);
                let (n, took) = series_drawn(&p, t, &expr, range);
                eprintln!(
                    "MEASURE dashboard_series{{volumes=\"{SCALE_VOLUMES}\",top=\"{top}\",panel={title:?},target=\"{ref_id}\",per_volume=\"{per_volume}\"}} {n}"
                );
                eprintln!(
                    "MEASURE dashboard_query_seconds{{volumes=\"{SCALE_VOLUMES}\",top=\"{top}\",panel={title:?},target=\"{ref_id}\"}} {:.2}",
                    took.as_secs_f64()
                );
                let place = format!("top {top}: panel {title:?} target {ref_id}");
                if per_volume && n > top {
                    problems.push(format!("{place} draws {n} series, more than {top}"));
                }
                // What 10,000 volumes always have N of: the fullest, by
                // space and by inodes (every volume has both); the written
                // ones outnumber N when eBPF counts them.
                // The fullest by space and by inodes (every volume has
                // both); the volumes with limit hits, and their alerts (40
                // fire NomadHostVolumeQuotaLimitHit); the written ones when
                // eBPF counts them.
                let full = [
                    "Fullest volumes",
                    "Space used vs capacity",
                    "Space used",
                    "Space used (%)",
                    "Inodes used vs limit",
                    "Inodes used",
                    "Quota limit hits",
                    "Firing alerts",
                ]
                .contains(&title)
                    || (ebpf
                        && [
                            "Write throughput",
                            "Write operations",
                            "Write errors by errno",
                        ]
                        .contains(&title));
                if full && n != top {
                    problems.push(format!("{place} draws {n} series, not {top}"));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    eprintln!(
        "MEASURE dashboard_scale_e2e_seconds{{volumes=\"{SCALE_VOLUMES}\"}} {:.1}",
        started.elapsed().as_secs_f64()
    );
}
