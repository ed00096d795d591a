//! The Prometheus configs under deploy/ against the series' schema: a
//! target label the service discovery writes must be named as the
//! exporter's series and the dashboards name the same thing, or a join on
//! it finds nothing (the Nomad SD config once wrote `nomad_node_id` beside
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

fn check_nomad_sd_job(place: &str, job: &Value, schema: &BTreeSet<String>) {
    let written = target_labels(job);
    for (sources, target) in &written {
        assert!(
            schema.contains(target) || ["job", "instance"].contains(&target.as_str()),
            "{place}: relabelling {sources:?} writes the label {target:?}, which no series \
             of docs/metrics.md has: name it as the schema does (e.g. node_id) or add it there"
        );
    }
    let node = written
        .iter()
        .find(|(s, _)| s.iter().any(|x| x == "__meta_nomad_node_id"))
        .unwrap_or_else(|| panic!("{place}: no relabelling of __meta_nomad_node_id"));
    assert_eq!(
        node.1, "node_id",
        "{place}: the Nomad node's ID must be node_id, as on the exporter's series"
    );
    // A target label the exporter also exposes is renamed exported_<name>
    // on the series that have it unless the exposed labels win.
    assert_eq!(
        job["honor_labels"].as_bool(),
        Some(true),
        "{place}: sets node_id, which the exporter's info and per-directory series expose too: \
         add `honor_labels: true` or those become exported_node_id"
    );
}

#[test]
fn the_nomad_sd_config_writes_the_schemas_label_names() {
    let schema = schema_labels();
    let path = repo_root().join("deploy/prometheus/nomad-sd.yml");
    let text = std::fs::read_to_string(&path).expect("read deploy/prometheus/nomad-sd.yml");
    let v: Value = serde_norway::from_str(&text).expect("nomad-sd.yml is YAML");
    let jobs = v["scrape_configs"].as_sequence().expect("scrape_configs");
    let job = jobs
        .iter()
        .find(|j| j.get("nomad_sd_configs").is_some())
        .expect("a job with nomad_sd_configs");
    check_nomad_sd_job("deploy/prometheus/nomad-sd.yml", job, &schema);
}

#[test]
fn the_nomad_sd_snippet_in_the_docs_agrees_with_the_schema() {
    let schema = schema_labels();
    let page = std::fs::read_to_string(repo_root().join("docs/dashboards.md"))
        .expect("read docs/dashboards.md");
    let blocks: Vec<&str> = page
        .split("```yaml\n")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .filter(|b| b.contains("nomad_sd_configs"))
        .collect();
    assert!(
        !blocks.is_empty(),
        "docs/dashboards.md shows no nomad_sd_configs"
    );
    for b in blocks {
        let v: Value = serde_norway::from_str(b).expect("the docs' block is YAML");
        for job in v["scrape_configs"].as_sequence().expect("scrape_configs") {
            check_nomad_sd_job("docs/dashboards.md", job, &schema);
        }
    }
}

#[test]
fn the_schema_parser_reads_labels() {
    let s = schema_labels();
    for l in ["namespace", "node_pool", "volume_name", "volumes_dir"] {
        assert!(s.contains(l), "{l} missing from {s:?}");
    }
}
