//! The Prometheus configs under deploy/ against the series' schema: a
//! target label the service discovery writes must be named as the
//! exporter's series and the dashboards name the same thing, or a join on
//! it finds nothing (a Nomad SD config once wrote `nomad_node_id` beside
//! the series' `node_id`).

use std::collections::BTreeSet;

use prjquota_dashboards::repo_root;
use serde_norway::Value;

/// Every label name docs/metrics.md gives: the per-volume labels its
/// opening states ("Every per-volume series carries exactly `a`, `b` and
/// `c`") and those its table gives a metric (`name{label, label}`).
fn schema_labels() -> BTreeSet<String> {
    let page =
        std::fs::read_to_string(repo_root().join("docs/metrics.md")).expect("read docs/metrics.md");
    let mut labels = BTreeSet::new();
    let opening = page
        .split("Every per-volume series carries exactly")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .expect("docs/metrics.md: no \"Every per-volume series carries exactly\" sentence");
    labels.extend(opening.split('`').skip(1).step_by(2).map(String::from));
    for row in page.lines().filter(|l| l.starts_with("| `")) {
        let cell = row.split('|').nth(1).unwrap_or_default();
        for code in cell.split('`').skip(1).step_by(2) {
            let Some((_, rest)) = code.split_once('{') else {
                continue;
            };
            let inner = rest.split('}').next().unwrap_or_default();
            for l in inner.split(',') {
                let name = l.split('=').next().unwrap_or_default().trim();
                if !name.is_empty() {
                    labels.insert(name.to_string());
                }
            }
        }
    }
    assert!(
        labels.contains("volume_id") && labels.contains("namespace") && labels.contains("node_id"),
        "docs/metrics.md: no labels found in its metric table: {labels:?}"
    );
    labels
}

/// `(source_labels, target_label)` of each relabelling that writes a
/// label a series keeps (not a `__` one).
fn target_labels(job: &Value) -> Vec<(Vec<String>, String)> {
    let Some(list) = job["relabel_configs"].as_sequence() else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|r| {
            let target = r["target_label"].as_str()?;
            if target.starts_with("__") {
                return None;
            }
            let sources = r["source_labels"]
                .as_sequence()
                .map(|s| {
                    s.iter()
                        .filter_map(|x| x.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            Some((sources, target.to_string()))
        })
        .collect()
}

/// Every label a scrape job's relabelling writes must be one the series
/// have (docs/metrics.md), or a join on it finds nothing.
fn check_job_labels(place: &str, job: &Value, schema: &BTreeSet<String>) {
    for (sources, target) in target_labels(job) {
        assert!(
            schema.contains(&target) || ["job", "instance"].contains(&target.as_str()),
            "{place}: relabelling {sources:?} writes the label {target:?}, which no series \
             of docs/metrics.md has: name it as the schema does (e.g. node_id) or add it there"
        );
    }
}

#[test]
fn the_shipped_scrape_configs_write_only_the_schemas_label_names() {
    let schema = schema_labels();
    let place = "deploy/prometheus/prometheus.yml";
    let text = std::fs::read_to_string(repo_root().join(place)).expect("read prometheus.yml");
    let v: Value = serde_norway::from_str(&text).expect("prometheus.yml is YAML");
    let jobs = v["scrape_configs"].as_sequence().expect("scrape_configs");
    assert!(
        jobs.iter().any(|j| j["job_name"] == "prjquota-exporter"),
        "{place}: no prjquota-exporter job"
    );
    for job in jobs {
        check_job_labels(place, job, &schema);
    }
}

#[test]
fn the_schema_parser_reads_labels() {
    let s = schema_labels();
    for l in ["namespace", "node_pool", "volume_name", "volumes_dir"] {
        assert!(s.contains(l), "{l} missing from {s:?}");
    }
}
