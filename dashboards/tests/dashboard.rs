//! Lint of the Grafana dashboard, and of every metric name that the
//! dashboard and the rules read against what the exporter really exports.
//!
//! The exporter's metric catalogue comes from the exporter library itself:
//! an [`Exporter`] with every collector scrapes an empty volumes directory
//! (collectors always emit their families, with or without samples), plus
//! the quota-warning collector in its socket-less test mode (its per-volume
//! counter family only exists while subscribed). So a renamed metric in
//! exporter/src fails this test, not an operator's dashboard.

use std::collections::{BTreeMap, BTreeSet};

use prjquota_dashboards::config::Config as Mixin;
use prjquota_dashboards::{
    cases, dashboard, dashboard_exprs, label_values, metric_uses, panel_exprs, panels,
    parse_matchers, query_result, recorded, rule_exprs, selectors, variable_query, variables,
    variables_in, Expr, Matcher, Selector,
};
use prjquota_exporter::collector::quota_events::QuotaEvents;
use prjquota_exporter::collector::{Collector, Scrape};
use prjquota_exporter::exposition::Kind;
use prjquota_exporter::inventory::Inventory;
use prjquota_exporter::{Config, Exporter};
use serde_json::Value;

/// Series Prometheus itself makes: a target's `up`, and `ALERTS`, the
/// rules' alerts pending or firing.
const PROMETHEUS_MADE: &[&str] = &["up", "ALERTS"];

/// Gauges Nomad's agents publish (`telemetry { publish_allocation_metrics
/// = true }`, client/allocrunner/taskrunner's emitStats) that the
/// allocation rules join. Only the rules may read them: a panel reads the
/// records, which carry the exporter's job and instance.
const NOMAD_MADE: &[&str] = &["nomad_client_allocs_cpu_total_ticks"];

/// Every metric family the exporter can export, with its type.
fn exporter_catalogue() -> BTreeMap<String, Kind> {
    let empty =
        std::env::temp_dir().join(format!("prjquota-dashboards-lint-{}", std::process::id()));
    std::fs::create_dir_all(&empty).expect("temp dir");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut families = rt.block_on(async {
        let config = Config {
            volumes_dirs: vec![empty.clone()],
            // Not subscribed: the collector below stands in for it.
            quota_events: false,
            ..Config::default()
        };
        let scraped = Exporter::new(&config).scrape().await;
        let mut families = scraped.families;
        let events = QuotaEvents::detached();
        let scrape = Scrape::new(Inventory::default());
        events
            .collect(&scrape, &mut families)
            .await
            .expect("a detached quota_events collector succeeds");
        // The live scrape lacks the eBPF families where eBPF cannot attach
        // (this host): take them from the collector's own catalogue.
        families.extend(prjquota_exporter::collector::ebpf::catalogue());
        families.extend(prjquota_exporter::collector::guard::catalogue());
        // Only with --nomad.alloc-dir.
        families.extend(prjquota_exporter::collector::allocs::catalogue());
        // Only with a Nomad client (--nomad.*).
        families.extend(prjquota_exporter::collector::nomad::catalogue());
        // Added by the HTTP layer to every scrape.
        families.extend(prjquota_exporter::process::families());
        families.extend(prjquota_exporter::http::catalogue());
        // Added by the HTTP layer when --web.config.file is given.
        families.extend(prjquota_exporter::web_config::catalogue());
        families
    });
    let _ = std::fs::remove_dir_all(&empty);
    families.sort_by_key(|f| f.name);
    let mut out = BTreeMap::new();
    for f in families {
        out.insert(f.name.to_string(), f.kind);
    }
    assert!(
        out.contains_key("nomad_host_volume_info")
            && out.contains_key("nomad_host_volume_used_bytes")
            && out.contains_key("nomad_host_volume_quota_limit_hits_total"),
        "the exporter catalogue looks incomplete: {:?}",
        out.keys()
    );
    out
}

/// The metrics docs/metrics.md's table lists, each with the types its row
/// gives. A cell names its first metric in full and the others of its row
/// as `…_rest`, short for the first one's family prefix
/// (`nomad_host_volume_`, `prjquota_exporter_`); the type cell is `gauge`,
/// `counter` or `gauge/counter` for a row of both.
fn documented_metrics() -> BTreeMap<String, Vec<String>> {
    const PREFIXES: &[&str] = &[
        "nomad_host_volumes_",
        "nomad_host_volume_",
        "nomad_alloc_",
        "prjquota_exporter_",
        "process_",
    ];
    let page = std::fs::read_to_string(prjquota_dashboards::repo_root().join("docs/metrics.md"))
        .expect("read docs/metrics.md");
    let table = page
        .lines()
        .skip_while(|l| !l.starts_with("| metric | type |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'));
    let mut names = BTreeMap::new();
    for row in table {
        // `\|` is a pipe inside a cell (label values such as `bytes\|inodes`).
        let row = row.replace("\\|", "/");
        let mut cells = row.split('|').skip(1);
        let cell = cells.next().unwrap_or_default();
        let types: Vec<String> = cells
            .next()
            .unwrap_or_default()
            .split('/')
            .map(|t| t.trim().to_string())
            .collect();
        let mut prefix = "";
        for code in cell.split('`').skip(1).step_by(2) {
            let name: String = code
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '…')
                .collect();
            let full = match name.strip_prefix('…') {
                Some(rest) => format!("{prefix}{}", rest.trim_start_matches('_')),
                None => {
                    prefix = PREFIXES
                        .iter()
                        .find(|p| name.starts_with(*p))
                        .copied()
                        .unwrap_or_else(|| {
                            panic!("docs/metrics.md: metric {name:?} has no known prefix")
                        });
                    name
                }
            };
            names.insert(full, types.clone());
        }
    }
    assert!(
        !names.is_empty(),
        "docs/metrics.md has no `| metric | type |` table"
    );
    names
}

#[test]
fn the_docs_list_exactly_the_exported_metrics() {
    let catalogue = exporter_catalogue();
    let documented = documented_metrics();
    let exported: BTreeSet<String> = catalogue.keys().cloned().collect();
    let listed: BTreeSet<String> = documented.keys().cloned().collect();
    let missing: Vec<_> = exported.difference(&listed).collect();
    let unknown: Vec<_> = listed.difference(&exported).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "docs/metrics.md's table is out of step with the exporter:\n  exported but not in the table: {missing:?}\n  in the table but not exported: {unknown:?}"
    );
    let wrong: Vec<String> = catalogue
        .iter()
        .filter_map(|(name, kind)| {
            let kind = match kind {
                Kind::Gauge | Kind::Info => "gauge",
                Kind::Counter => "counter",
            };
            let types = &documented[name];
            (!types.iter().any(|t| t == kind))
                .then(|| format!("{name} is a {kind}, the table says {}", types.join("/")))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "docs/metrics.md gives the wrong type:\n  {}",
        wrong.join("\n  ")
    );
}

#[test]
fn every_metric_the_dashboard_and_rules_read_is_exported() {
    let catalogue = exporter_catalogue();
    for (case, _, d, rules) in cases() {
        metrics_are_exported(case, &catalogue, &d, &rules);
    }
}

fn metrics_are_exported(
    case: &str,
    catalogue: &BTreeMap<String, Kind>,
    d: &Value,
    rules: &serde_norway::Value,
) {
    let recorded = recorded(rules);
    let mut exprs: Vec<Expr> = dashboard_exprs(d);
    exprs.extend(rule_exprs(rules));
    assert!(
        exprs.len() > 30,
        "{case}: only {} expressions found",
        exprs.len()
    );

    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    for e in &exprs {
        let uses = match metric_uses(&e.expr) {
            Ok(u) => u,
            Err(why) => {
                problems.push(format!("{}: {why}", e.place));
                continue;
            }
        };
        if uses.is_empty() && !e.expr.trim().is_empty() {
            problems.push(format!("{}: reads no metric: {:?}", e.place, e.expr));
        }
        for u in uses {
            used.insert(u.metric.clone());
            let kind = if let Some(k) = catalogue.get(&u.metric) {
                Some(*k)
            } else if recorded.contains(&u.metric) || PROMETHEUS_MADE.contains(&u.metric.as_str()) {
                Some(Kind::Gauge)
            } else if NOMAD_MADE.contains(&u.metric.as_str()) && e.place.starts_with("record ") {
                assert!(u.metric.starts_with(prjquota_dashboards::NOMAD_PREFIX));
                Some(Kind::Gauge)
            } else {
                problems.push(format!(
                    "{}: {} is neither exported by prjquota-exporter, nor recorded in alerts.yaml",
                    e.place, u.metric
                ));
                None
            };
            let counter_fn = matches!(
                u.function.as_deref(),
                Some("rate" | "irate" | "increase" | "resets")
            );
            let gauge_fn = matches!(
                u.function.as_deref(),
                Some("deriv" | "predict_linear" | "delta" | "idelta" | "changes")
            );
            match kind {
                Some(Kind::Gauge) if counter_fn => problems.push(format!(
                    "{}: {}() of the gauge {}",
                    e.place,
                    u.function.as_deref().unwrap_or(""),
                    u.metric
                )),
                Some(Kind::Counter) if !counter_fn && !appeared_within(&e.expr, &u.metric) => {
                    problems.push(format!(
                        "{}: the counter {} is read without rate()/increase()",
                        e.place, u.metric
                    ))
                }
                Some(Kind::Counter) if gauge_fn => problems.push(format!(
                    "{}: {}() of the counter {}",
                    e.place,
                    u.function.as_deref().unwrap_or(""),
                    u.metric
                )),
                _ => {}
            }
        }
    }
    assert!(problems.is_empty(), "{case}:\n{}", problems.join("\n"));

    let unused: Vec<&String> = recorded.iter().filter(|r| !used.contains(*r)).collect();
    assert!(
        unused.is_empty(),
        "{case}: recording rules nothing reads: {unused:?}"
    );
}

/// Whether `expr` reads `metric` in the pattern for counters whose series
/// appear at their first increment (`nomad_host_volume_write_errors_total`):
/// `c{…} unless c{…} offset $__range`, the series that appeared within the
/// range, whose whole value is what the range added and which increase()
/// cannot see (it needs a sample before the first increment). The counter is
/// read bare there by design.
/// `c{…} unless last_over_time(c{…}[1h] offset 5m)` is the same pattern
/// with a longer memory (a scrape gap does not make an old series new).
fn appeared_within(expr: &str, metric: &str) -> bool {
    let flat = expr.split_whitespace().collect::<Vec<_>>().join(" ");
    let after_selector = |rest: &str| -> String {
        match rest.strip_prefix('{') {
            Some(r) => r.split_once('}').map_or("", |(_, after)| after).to_string(),
            None => rest.to_string(),
        }
    };
    let plain = format!("unless {metric}");
    let over = format!("unless last_over_time({metric}");
    flat.match_indices(&plain).any(|(i, m)| {
        after_selector(&flat[i + m.len()..])
            .trim_start()
            .starts_with("offset ")
    }) || flat.match_indices(&over).any(|(i, m)| {
        let rest = after_selector(&flat[i + m.len()..]);
        rest.strip_prefix('[')
            .and_then(|r| r.split_once(']'))
            .is_some_and(|(_, after)| after.trim_start().starts_with("offset "))
    })
}

#[test]
fn the_appeared_within_pattern_is_recognised_only_as_written() {
    let c = "nomad_host_volume_write_errors_total";
    assert!(appeared_within(
        &format!("sum(({c}{{a=\"x\"}}\n  unless\n {c}{{a=\"x\"}} offset $__range) or increase({c}[$__range]))"),
        c
    ));
    assert!(appeared_within(&format!("{c} unless {c} offset 5m"), c));
    assert!(appeared_within(
        &format!("{c} > 0 unless last_over_time({c}{{a=\"x\"}}[1h] offset 5m)"),
        c
    ));
    assert!(
        !appeared_within(&format!("{c} unless last_over_time({c}[1h])"), c),
        "no offset"
    );
    assert!(!appeared_within(&format!("sum({c})"), c), "bare");
    assert!(!appeared_within(&format!("{c} unless {c}"), c), "no offset");
    assert!(!appeared_within(
        &format!("{c} unless {c}_other offset 5m"),
        c
    ));
}

fn panel_ds_uid(v: &Value) -> Option<&str> {
    v["datasource"]["uid"].as_str()
}

#[test]
fn the_dashboard_is_importable_and_every_panel_queries_prometheus() {
    for (case, c, d, _) in cases() {
        let dash = &c.dashboard;
        assert_eq!(d["uid"], dash.uid.as_str(), "{case}");
        assert_eq!(d["title"], dash.title.as_str(), "{case}");
        assert_eq!(d["tags"], serde_json::json!(dash.tags), "{case}");
        assert_eq!(d["refresh"], dash.refresh.as_str(), "{case}");
        assert_eq!(d["time"]["from"], dash.time_from.as_str(), "{case}");
        assert_eq!(d["timezone"], dash.timezone.as_str(), "{case}");
        assert_eq!(d["links"][0]["url"], c.runbook_url.as_str(), "{case}");
        importable(&d);
    }
}

fn importable(d: &Value) {
    let schema = d["schemaVersion"].as_u64().expect("schemaVersion");
    assert!(
        (36..=41).contains(&schema),
        "schemaVersion {schema}: keep the current schema (~39)"
    );
    assert!(d["uid"]
        .as_str()
        .is_some_and(|u| !u.is_empty() && u.len() <= 40));
    assert!(d["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(
        d["id"].is_null(),
        "an exported dashboard has \"id\": null, or import overwrites another"
    );

    // The data source is a template variable of type datasource.
    let vars = variables(d);
    let ds = vars
        .iter()
        .find(|v| v["type"] == "datasource")
        .expect("a `datasource` variable of type datasource");
    assert_eq!(ds["name"], "datasource");
    assert_eq!(ds["query"], "prometheus");
    assert!(
        d.get("__inputs").is_none(),
        "use the datasource variable, not __inputs (file provisioning does not substitute them)"
    );

    let mut ids = BTreeSet::new();
    let mut n = 0;
    for p in panels(d) {
        let title = p["title"].as_str().unwrap_or("");
        let id = p["id"]
            .as_u64()
            .unwrap_or_else(|| panic!("panel {title:?} has no id"));
        assert!(ids.insert(id), "two panels with id {id}");
        let pos = &p["gridPos"];
        let (x, w) = (pos["x"].as_u64().unwrap(), pos["w"].as_u64().unwrap());
        assert!(
            x + w <= 24 && pos["h"].as_u64().unwrap() > 0,
            "panel {title:?}: gridPos {pos}"
        );
        if p["type"] == "row" {
            continue;
        }
        n += 1;
        assert!(!title.is_empty(), "panel {id} has no title");
        assert!(
            p["description"].as_str().is_some_and(|s| s.len() > 20),
            "panel {title:?}: describe what it shows"
        );
        assert_eq!(
            panel_ds_uid(p),
            Some("${datasource}"),
            "panel {title:?}: datasource must be {{\"type\":\"prometheus\",\"uid\":\"${{datasource}}\"}}, got {}",
            p["datasource"]
        );
        assert_eq!(p["datasource"]["type"], "prometheus", "panel {title:?}");
        let targets = p["targets"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        assert!(!targets.is_empty(), "panel {title:?} has no target");
        let mut refs = BTreeSet::new();
        for t in targets {
            let r = t["refId"].as_str().unwrap_or("");
            assert!(refs.insert(r), "panel {title:?}: refId {r:?} twice");
            assert!(
                t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()),
                "panel {title:?} target {r}: no expr"
            );
            assert!(
                matches!(panel_ds_uid(t), None | Some("${datasource}")),
                "panel {title:?} target {r}: datasource {}",
                t["datasource"]
            );
        }
    }
    assert!(n >= 15, "only {n} panels");
}

#[test]
fn variables_are_chained_multi_valued_and_each_is_used() {
    for (case, c, d, _) in cases() {
        eprintln!("{case}");
        variables_are_chained(&d, &c);
    }
}

fn variables_are_chained(d: &Value, c: &Mixin) {
    let vars = variables(d);
    let by_name: BTreeMap<&str, &Value> = vars
        .iter()
        .map(|v| (v["name"].as_str().expect("variable name"), *v))
        .collect();
    // name -> (label, metric it reads, variables its query must be
    // filtered by)
    const SCOPE: &[&str] = &["cluster", "job", "instance"];
    const INFO: &str = "nomad_host_volume_info";
    const BUILD: &str = "prjquota_exporter_build_info";
    let want: [(&str, &str, &str, &[&str]); 6] = [
        ("cluster", c.cluster_label.as_str(), BUILD, &[]),
        ("job", "job", BUILD, &["cluster"]),
        ("instance", "instance", BUILD, &["cluster", "job"]),
        ("node_pool", "node_pool", INFO, SCOPE),
        (
            "namespace",
            "namespace",
            INFO,
            &["cluster", "job", "instance", "node_pool"],
        ),
        (
            "volume",
            "volume_id",
            INFO,
            &["cluster", "job", "instance", "node_pool", "namespace"],
        ),
    ];
    for (name, label, metric, filters) in want {
        let v = by_name
            .get(name)
            .unwrap_or_else(|| panic!("no `{name}` variable"));
        assert_eq!(v["type"], "query", "{name}");
        assert_eq!(v["datasource"]["uid"], "${datasource}", "{name}");
        assert_eq!(v["multi"], true, "{name}: multi-value");
        assert_eq!(v["includeAll"], true, "{name}: include All");
        let q = variable_query(v).unwrap_or_else(|| panic!("{name}: no query"));
        let selector = if name == "volume" {
            volume_picker(v, q)
        } else {
            let (selector, l) =
                label_values(q).unwrap_or_else(|| panic!("{name}: {q:?} is not label_values(…)"));
            assert_eq!(l, label, "{name}: {q}");
            selector
        };
        assert!(
            selector.starts_with(metric),
            "{name}: values come from {metric}: {q}"
        );
        let used: BTreeSet<String> = variables_in(&selector);
        let filters: BTreeSet<String> = filters.iter().map(|s| s.to_string()).collect();
        assert_eq!(used, filters, "{name}: chained on {filters:?}: {q}");
    }
    // All jobs is the list of jobs that export build_info (Grafana's
    // default All), not `.*`: the `up` panel must not show node_exporter.
    assert!(
        by_name["job"].get("allValue").is_none(),
        "job: no allValue, so All means the exporters' jobs"
    );
    // A series without a cluster label matches All clusters.
    assert_eq!(by_name["cluster"]["allValue"], ".*");

    // Every variable is used by at least one panel.
    let exprs = panel_exprs(d);
    for v in &vars {
        let name = v["name"].as_str().unwrap();
        let used = if v["type"] == "datasource" {
            panels(d).iter().any(|p| {
                p["datasource"]["uid"]
                    .as_str()
                    .is_some_and(|u| variables_in(u).contains(name))
            })
        } else {
            exprs.iter().any(|e| variables_in(&e.expr).contains(name))
        };
        assert!(used, "variable {name} is used by no panel");
    }
}

/// The volume picker lists volumes by name and filters by ID: Grafana's
/// Prometheus `label_values` gives one label, so the options are whole
/// series of `query_result(max by (volume_id, volume_name) (info))`, whose
/// `volume_id` a named group `value` and whose `volume_name` a named group
/// `text` take (Grafana 7.4+). Lookaheads, so the labels' order in the
/// series text does not matter; the name's optional, so a volume without
/// one is listed by its ID. Returns the info selector.
fn volume_picker(v: &Value, q: &str) -> String {
    let expr = query_result(q).unwrap_or_else(|| panic!("volume: {q:?} is not query_result(…)"));
    let selector = expr
        .strip_prefix("max by (volume_id, volume_name) (")
        .and_then(|e| e.strip_suffix(')'))
        .unwrap_or_else(|| {
            panic!("volume: one option per (volume_id, volume_name): max by them, got {q:?}")
        });
    let regex = v["regex"].as_str().expect("volume: a regex");
    let texts: Vec<String> = [
        r#"{volume_id="v1",volume_name="web"} 1 1700000000000"#,
        r#"{volume_name="db",volume_id="v2"} 1 1700000000000"#,
        r#"{volume_id="v3"} 1 1700000000000"#,
        r#"{volume_id="v1",volume_name="web"} 1 1700000000000"#,
    ]
    .map(String::from)
    .to_vec();
    let options = prjquota_dashboards::grafana::regex_options(regex, &texts)
        .unwrap_or_else(|e| panic!("volume: {e}"));
    assert_eq!(
        options,
        [("v1", "web"), ("v2", "db"), ("v3", "v3")]
            .map(|(v, t)| (v.to_string(), t.to_string()))
            .to_vec(),
        "volume: the value is the ID and the text the name (the ID when unnamed), \
         whatever the labels' order: {regex}"
    );
    assert_eq!(v["label"], "Volume");
    assert_eq!(v["allValue"], ".*", "volume: All matches every ID");
    selector.to_string()
}

/// The matchers `s` has on `label` beyond the config's selector, or a
/// problem if it lacks one of the selector's matchers.
fn beyond_selector<'a>(
    s: &'a Selector,
    selector: &[Matcher],
    label: &str,
) -> Result<Vec<(&'a str, &'a str)>, String> {
    if let Some(m) = selector.iter().find(|m| !s.matchers.contains(m)) {
        return Err(format!(
            "{} lacks the config's matcher {m:?}",
            s.used.metric
        ));
    }
    let mut own = s.on(label);
    for (_, op, v) in selector.iter().filter(|(l, _, _)| l == label) {
        if let Some(i) = own.iter().position(|o| *o == (op.as_str(), v.as_str())) {
            own.remove(i);
        }
    }
    Ok(own)
}

/// Every selector of every panel and annotation is scoped by the cluster,
/// job and instance variables and the config's selector, and by nothing
/// else on those labels: a hard-coded `job="…"` (or a selector that forgets
/// the variables) fails.
#[test]
fn every_panel_selector_honours_cluster_job_and_instance() {
    for (case, c, d, _) in cases() {
        let selector = parse_matchers(&c.selector).unwrap();
        let mut problems = Vec::new();
        let mut n = 0;
        let exprs = dashboard_exprs(&d)
            .into_iter()
            .filter(|e| !e.place.starts_with("variable "));
        for e in exprs {
            let sels = selectors(&e.expr).unwrap_or_else(|err| panic!("{}: {err}", e.place));
            for s in sels {
                n += 1;
                for (label, var) in [
                    (c.cluster_label.as_str(), "cluster"),
                    ("job", "job"),
                    ("instance", "instance"),
                ] {
                    let want = format!("${var}");
                    match beyond_selector(&s, &selector, label) {
                        Err(why) => problems.push(format!("{}: {why}", e.place)),
                        Ok(own) if own != [("=~", want.as_str())] => problems.push(format!(
                            "{}: {} has {label} matchers {own:?}, not exactly {label}=~\"{want}\"",
                            e.place, s.used.metric
                        )),
                        Ok(_) => {}
                    }
                }
            }
        }
        assert!(n >= 40, "{case}: only {n} selectors read");
        assert!(problems.is_empty(), "{case}:\n{}", problems.join("\n"));
    }
}

/// The rules name no scrape target beyond the config's selector (none as
/// shipped): no other matcher on job, instance or cluster (an exporter is
/// known by its own series), so they fire in whatever job scrapes it and in
/// no Prometheus that scrapes none; and every selector carries the config's.
#[test]
fn no_rule_hard_codes_a_job_instance_or_cluster() {
    for (case, c, _, rules) in cases() {
        let ours = parse_matchers(&c.selector).unwrap();
        let nomads = parse_matchers(&c.nomad.selector).unwrap();
        let mut problems = Vec::new();
        for e in rule_exprs(&rules) {
            let sels = selectors(&e.expr).unwrap_or_else(|err| panic!("{}: {err}", e.place));
            for s in sels {
                // Nomad's series come from Nomad's scrape job: its selector.
                let selector = if s.used.metric.starts_with(prjquota_dashboards::NOMAD_PREFIX) {
                    &nomads
                } else {
                    &ours
                };
                for label in ["job", "instance", c.cluster_label.as_str()] {
                    match beyond_selector(&s, selector, label) {
                        Err(why) => problems.push(format!("{}: {why}", e.place)),
                        Ok(own) if !own.is_empty() => problems.push(format!(
                            "{}: {}{{{label}…}}: {own:?}",
                            e.place, s.used.metric
                        )),
                        Ok(_) => {}
                    }
                }
            }
        }
        assert!(problems.is_empty(), "{case}:\n{}", problems.join("\n"));
    }
}

#[test]
fn panel_queries_follow_the_conventions() {
    for (case, _, d, _) in cases() {
        eprintln!("{case}");
        panel_conventions(&d);
    }
}

fn panel_conventions(d: &Value) {
    let known: BTreeSet<String> = variables(d)
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .chain(["__rate_interval", "__range", "__interval"].map(String::from))
        .collect();
    let mut problems = Vec::new();
    // Panels and annotations (the variables' selectors are checked above).
    let exprs = dashboard_exprs(d)
        .into_iter()
        .filter(|e| !e.place.starts_with("variable "));
    for e in exprs {
        for v in variables_in(&e.expr) {
            if !known.contains(&v) {
                problems.push(format!("{}: unknown variable ${v}", e.place));
            }
        }
        // rate() and co. over $__rate_interval (or the whole range).
        for f in ["rate(", "irate(", "increase("] {
            let mut rest = e.expr.as_str();
            while let Some(i) = rest.find(f) {
                let call = &rest[i..];
                let window = call
                    .find('[')
                    .and_then(|s| call[s..].find(']').map(|t| &call[s..s + t + 1]))
                    .unwrap_or("");
                if window != "[$__rate_interval]" && window != "[$__range]" {
                    problems.push(format!(
                        "{}: {f}…{window}: use [$__rate_interval] (or [$__range] in a stat)",
                        e.place
                    ));
                }
                rest = &call[f.len()..];
            }
        }
        // Per-volume panels honour the selection.
        if e.expr.contains("nomad_host_volume") && !e.expr.contains("$node_pool") {
            problems.push(format!("{}: ignores $node_pool", e.place));
        }
        // Names are joined through nomad_host_volume_info.
        if e.expr.contains("volume_name") && !e.expr.contains("group_left (volume_name)") {
            problems.push(format!("{}: volume_name without the info join", e.place));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_panels_the_issue_asks_for_are_there() {
    let d = dashboard();
    let all: Vec<String> = panel_exprs(&d).into_iter().map(|e| e.expr).collect();
    let has = |needle: &str| all.iter().any(|e| e.contains(needle));
    for needle in [
        "nomad_host_volume_used_bytes",
        "nomad_host_volume_capacity_bytes",
        "nomad_host_volume:used_ratio",
        "nomad_host_volume_inodes_used",
        "nomad_host_volume:inodes_used_ratio",
        "deriv(nomad_host_volume_available_bytes",
        "rate(nomad_host_volume_written_bytes_total{",
        "rate(nomad_host_volume_write_operations_total{",
        "nomad_host_volume_write_errors_total{",
        "nomad_host_volume_quota_limit_hits_total{",
        "nomad_host_volume_provisioned_bytes",
        "nomad_host_volumes_filesystem_size_bytes",
        "nomad_host_volumes_provisioned_bytes",
        "prjquota_exporter_scrape_collector_success",
        "prjquota_exporter_ebpf_program_attached",
        "nomad_alloc:disk_used_bytes",
        "nomad_alloc:disk_used_inodes",
        // The guard's state and attempts, and the alerts firing.
        "prjquota_exporter_guard_mode{",
        "prjquota_exporter_guard_pinned{",
        "prjquota_exporter_guard_pins_own{",
        "nomad_host_volume_projid_change_attempts_total{",
        "ALERTS{alertstate=\"firing\"",
    ] {
        assert!(has(needle), "no panel reads {needle}");
    }
    // Gauges of used space and inodes with the 80 % / 90 % thresholds.
    let gauges: Vec<&Value> = panels(&d)
        .into_iter()
        .filter(|p| p["type"] == "gauge")
        .collect();
    assert!(gauges.len() >= 2);
    for g in gauges {
        let steps: Vec<f64> = g["fieldConfig"]["defaults"]["thresholds"]["steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|s| s["value"].as_f64())
            .collect();
        assert_eq!(steps, [0.8, 0.9], "gauge {}", g["title"]);
        assert_eq!(g["fieldConfig"]["defaults"]["unit"], "percentunit");
    }
    // The table of the fullest volumes shows the columns operators look for.
    let table = panels(&d)
        .into_iter()
        .find(|p| p["type"] == "table" && p["title"] == "Fullest volumes")
        .expect("a `Fullest volumes` table");
    let renamed = &table["transformations"][1]["options"]["renameByName"];
    for col in ["Volume", "Namespace", "Node pool", "Size", "Used", "Used %"] {
        assert!(
            renamed.as_object().unwrap().values().any(|v| v == col),
            "Fullest volumes has no {col} column"
        );
    }
}

/// A dashboard for a node of 10,000 volumes: every panel target that draws
/// one series per volume (or task group, allocation, firing alert) draws
/// the Top N variable's number at most, `topk($top, …)`; where the panel
/// draws a range, the N are chosen once, at its end (`@ end()`), so that
/// each step does not pick N others (a range of topk at every step draws
/// up to N × steps series). tests/tests/dashboards.rs counts them at
/// 10,000 volumes.
#[test]
fn every_per_volume_panel_draws_at_most_the_top_n() {
    for (case, _, d, _) in cases() {
        let vars = variables(&d);
        let top = vars
            .iter()
            .find(|v| v["name"] == "top")
            .unwrap_or_else(|| panic!("{case}: no `top` variable (Top N)"));
        assert_eq!(top["type"], "custom", "{case}");
        assert_eq!(top["current"]["value"], "20", "{case}: 20 by default");
        let mut problems = Vec::new();
        let mut n = 0;
        for p in panels(&d) {
            let kind = p["type"].as_str().unwrap_or("");
            for t in p["targets"].as_array().into_iter().flatten() {
                if !prjquota_dashboards::draws_per_item(t, kind) {
                    continue;
                }
                n += 1;
                let expr = t["expr"].as_str().unwrap_or("");
                let place = format!("panel {:?} target {}", p["title"], t["refId"]);
                if !(expr.contains("topk($top,") || expr.contains("bottomk($top,")) {
                    problems.push(format!(
                        "{place}: draws one series per volume without topk($top, …)"
                    ));
                }
                let instant = t["instant"].as_bool() == Some(true);
                if !instant && !expr.contains("@ end()") {
                    problems.push(format!(
                        "{place}: a range query whose top N is not chosen once, at its end (@ end())"
                    ));
                }
            }
        }
        assert!(n >= 15, "{case}: only {n} per-volume targets found");
        assert!(problems.is_empty(), "{case}:\n{}", problems.join("\n"));
    }
}

/// From a node to its volumes: the per-node panels link to this dashboard
/// (whatever its uid: `${__dashboard.uid}`) with the node as the instance
/// and every volume of it, keeping the time range, data source, cluster,
/// job and Top N; the fullest volumes link to their own view.
#[test]
fn a_node_links_to_its_volumes() {
    for (case, _, d, _) in cases() {
        let links = |p: &Value| -> Vec<String> {
            let mut out = Vec::new();
            let fc = &p["fieldConfig"];
            for l in fc["defaults"]["links"].as_array().into_iter().flatten() {
                out.push(l["url"].as_str().unwrap_or("").to_string());
            }
            for o in fc["overrides"].as_array().into_iter().flatten() {
                for prop in o["properties"].as_array().into_iter().flatten() {
                    if prop["id"] == "links" {
                        for l in prop["value"].as_array().into_iter().flatten() {
                            out.push(l["url"].as_str().unwrap_or("").to_string());
                        }
                    }
                }
            }
            out
        };
        let keeps = [
            "/d/${__dashboard.uid}?",
            "${__url_time_range}",
            "${datasource:queryparam}",
            "${cluster:queryparam}",
            "${job:queryparam}",
            "${top:queryparam}",
        ];
        for (title, sets) in [
            ("Volumes per node", "var-instance=${__value.raw}"),
            (
                "Provisioned vs used per node",
                "var-instance=${__field.labels.instance}",
            ),
            (
                "Promised vs disk per node",
                "var-instance=${__field.labels.instance}",
            ),
            ("Fullest volumes", "var-volume=${__value.raw}"),
        ] {
            let p = panels(&d)
                .into_iter()
                .find(|p| p["title"] == title && p["type"] != "row")
                .unwrap_or_else(|| panic!("{case}: no panel {title:?}"));
            let urls = links(p);
            assert!(
                urls.iter()
                    .any(|u| u.contains(sets) && keeps.iter().all(|k| u.contains(k))),
                "{case}: {title:?} has no link setting {sets} and keeping {keeps:?}: {urls:?}"
            );
        }
    }
}
