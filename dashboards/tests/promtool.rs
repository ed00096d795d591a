//! The rules through Prometheus' own tool: `promtool check rules` and
//! `promtool test rules` (the unit tests in alerts_test.yaml), plus what
//! promtool does not check: every alert carries the annotations an operator
//! needs, links a runbook section that exists, and has tests that fire it
//! and tests where it must stay quiet.

use std::collections::{BTreeMap, BTreeSet};

use prjquota_dashboards::{
    cases, dir, promtool, read, render, repo_root, rule_list, rules, scratch, RULES, RULES_TEST,
};

#[test]
fn promtool_check_rules_accepts_the_rules() {
    let out = promtool(&["check", "rules", RULES]);
    assert!(out.contains("SUCCESS"), "{out}");
    // And the rules of a config that changes every knob.
    let custom = prjquota_dashboards::custom_config();
    let d = scratch("check-custom");
    let file = d.join(RULES);
    std::fs::write(&file, render::rules(&custom).unwrap()).unwrap();
    let out = promtool(&["check", "rules", &file.to_string_lossy()]);
    std::fs::remove_dir_all(&d).unwrap();
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn promtool_test_rules_passes() {
    let out = promtool(&["test", "rules", RULES_TEST]);
    assert!(out.contains("SUCCESS"), "{out}");
}

/// The `## Heading` anchors of docs/runbooks.md, as GitHub makes them.
fn runbook_anchors() -> BTreeSet<String> {
    let p = repo_root().join("docs/runbooks.md");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
    text.lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|h| {
            h.trim()
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect()
        })
        .collect()
}

#[test]
fn every_alert_is_documented_and_links_its_runbook() {
    for (case, c, _, rules) in cases() {
        eprintln!("{case}");
        documented(&rules, &c.runbook_url);
    }
}

fn documented(rules: &serde_norway::Value, runbook: &str) {
    let anchors = runbook_anchors();
    let mut alerts = 0;
    for r in rule_list(rules) {
        let Some(name) = r["alert"].as_str() else {
            let record = r["record"]
                .as_str()
                .expect("a rule is an alert or a record");
            // level:metric:operations, the level being what a series
            // stands for: a volume, an allocation, or an exporter target.
            assert!(
                ["nomad_host_volume:", "nomad_alloc:", "prjquota_exporter:"]
                    .iter()
                    .any(|level| record.starts_with(level)),
                "recording rule {record}: name it level:metric:operation under nomad_host_volume:, nomad_alloc: or prjquota_exporter:"
            );
            continue;
        };
        alerts += 1;
        let severity = r["labels"]["severity"].as_str().unwrap_or("");
        assert!(
            ["critical", "warning", "info"].contains(&severity),
            "{name}: severity {severity:?} (want critical, warning or info)"
        );
        let a = &r["annotations"];
        for key in ["summary", "description", "runbook_url"] {
            assert!(
                a[key].as_str().is_some_and(|s| !s.trim().is_empty()),
                "{name}: no {key} annotation"
            );
        }
        let summary = a["summary"].as_str().unwrap();
        assert!(
            summary.ends_with('.') && !summary.contains("{{"),
            "{name}: a summary is one constant sentence (as kubernetes-mixin's): {summary:?}"
        );
        let url = a["runbook_url"].as_str().unwrap();
        let anchor = url
            .strip_prefix(runbook)
            .and_then(|rest| rest.strip_prefix('#'))
            .unwrap_or_else(|| panic!("{name}: runbook_url {url:?} is not {runbook}#<anchor>"));
        assert_eq!(
            anchor,
            name.to_lowercase(),
            "{name}: runbook_url anchor is the alert name in lower case"
        );
        assert!(
            anchors.contains(anchor),
            "{name}: docs/runbooks.md has no `## {name}` section (anchors: {anchors:?})"
        );
        let description = a["description"].as_str().unwrap();
        let expr = r["expr"].as_str().unwrap_or("");
        if expr.contains("volume_id") {
            // Per-volume alerts say which volume: namespace, ID and name.
            for label in ["namespace", "volume_id", "volume_name"] {
                assert!(
                    description.contains(&format!("$labels.{label}")),
                    "{name}: the description does not name the {label}"
                );
            }
            assert!(
                expr.contains("group_left (volume_name)"),
                "{name}: join volume_name from nomad_host_volume_info so the alert can name the volume"
            );
        }
    }
    assert!(alerts >= 7, "only {alerts} alerts in {RULES}");
}

/// Every alerting rule says how long its condition must hold (`for:`, 0
/// for an event), and the comment right above that line says why that long,
/// starting `# for: <the duration in words>`: a rule without one fires on a
/// single evaluation, which for a gauge is one bad scrape.
#[test]
fn every_alert_waits_a_for_whose_comment_says_why() {
    for (case, c, _, rules) in cases() {
        let text = render::rules(&c).unwrap();
        for_lines_are_explained(case, &text);
        for r in rule_list(&rules) {
            if let Some(name) = r["alert"].as_str() {
                assert!(
                    r["for"].as_str().is_some(),
                    "{case}: {name} has no `for:`: add it to dashboards/config.toml's [for] \
                     and the template, with a comment saying why it is that long"
                );
            }
        }
    }
}

/// Each `- alert:` block of a rule file's text has one `for:` line, and the
/// comment just above it begins `# for: `.
fn for_lines_are_explained(case: &str, text: &str) {
    let lines: Vec<&str> = text.lines().collect();
    let mut alert: Option<(&str, usize)> = None;
    let mut fors = 0;
    let close = |alert: Option<(&str, usize)>, fors: usize| {
        if let Some((name, at)) = alert {
            assert_eq!(
                fors,
                1,
                "{case}: the rule {name} at line {} has {fors} `for:` lines",
                at + 1
            );
        }
    };
    for (i, l) in lines.iter().enumerate() {
        let body = l.trim_start();
        if let Some(name) = body.strip_prefix("- alert: ") {
            close(alert, fors);
            alert = Some((name.trim(), i));
            fors = 0;
        } else if body.starts_with("- record: ") {
            close(alert, fors);
            alert = None;
            fors = 0;
        } else if body.starts_with("for: ") && alert.is_some() {
            fors += 1;
            let name = alert.map_or("", |a| a.0);
            // The comment's first line is the one starting `# for:`,
            // directly above or above the rest of the comment.
            let comment: Vec<&str> = lines[..i]
                .iter()
                .rev()
                .take_while(|p| p.trim_start().starts_with('#'))
                .map(|p| p.trim_start())
                .collect();
            assert!(
                comment
                    .last()
                    .is_some_and(|first| first.starts_with("# for: ")),
                "{case}: the `for:` of {name} (line {}) has no comment right above it \
                 beginning `# for: <how long>` that says why it is that long",
                i + 1
            );
        }
    }
    close(alert, fors);
}

#[test]
fn a_for_without_its_comment_is_found() {
    let ok = "  - alert: A\n    expr: x\n    # for: 5m: why.\n    for: 5m\n";
    for_lines_are_explained("ok", ok);
    for bad in [
        "  - alert: A\n    expr: x\n    for: 5m\n",
        "  - alert: A\n    expr: x\n    # something else\n    for: 5m\n",
        "  - alert: A\n    expr: x\n    labels: {}\n",
    ] {
        let r = std::panic::catch_unwind(|| for_lines_are_explained("bad", bad));
        assert!(r.is_err(), "not refused: {bad:?}");
    }
}

#[test]
fn every_alert_has_tests_that_fire_it_and_tests_where_it_must_not() {
    let rules = rules();
    let names: BTreeSet<String> = rule_list(&rules)
        .into_iter()
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect();
    let tests: serde_norway::Value = serde_norway::from_str(&read(RULES_TEST)).expect("YAML");
    // alert name -> (evaluations expecting it to fire, evaluations expecting nothing)
    let mut seen: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for t in tests["tests"].as_sequence().expect("tests:") {
        for a in t["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = a["alertname"].as_str().expect("alertname").to_string();
            let firing = a["exp_alerts"].as_sequence().map_or(0, Vec::len);
            let e = seen.entry(name).or_default();
            if firing > 0 {
                e.0 += 1;
            } else {
                e.1 += 1;
            }
        }
    }
    for name in &names {
        let (fire, quiet) = seen.get(name).copied().unwrap_or_default();
        assert!(
            fire > 0,
            "{name}: no test in {RULES_TEST} expects it to fire"
        );
        assert!(
            quiet > 0,
            "{name}: no test in {RULES_TEST} expects it to stay quiet (a guard, a pending `for`)"
        );
    }
    let unknown: Vec<&String> = seen.keys().filter(|n| !names.contains(*n)).collect();
    assert!(
        unknown.is_empty(),
        "tests of alerts that do not exist: {unknown:?}"
    );
}

/// A Prometheus that scrapes only node_exporter (some targets down, one
/// vanished, disks filling) fires no alert of the file: a unit test made
/// here with one expectation per alert, run by promtool over two hours.
/// With the rules of a config whose selector names the exporters' scrape
/// job, it fires exactly one: PrjquotaExporterDown, for that job having no
/// target.
#[test]
fn a_prometheus_without_prjquota_targets_fires_nothing() {
    let shipped = prjquota_dashboards::shipped_config();
    assert!(!render::names_the_job(&shipped));
    fires_nothing_without_targets(&rules(), &dir().join(RULES), None);
    let custom = prjquota_dashboards::custom_config();
    assert!(render::names_the_job(&custom));
    let d = scratch("no-targets-custom");
    let file = d.join(RULES);
    std::fs::write(&file, render::rules(&custom).unwrap()).unwrap();
    let (_, custom_rules) = prjquota_dashboards::rendered(&custom);
    // The custom selector names two jobs by a regex: absent() has no job
    // to name.
    let no_target = format!(
        "          - exp_labels:\n              severity: 'warning'\n\
         \x20           exp_annotations:\n              summary: 'prjquota-exporter is down.'\n\
         \x20             description: 'Prometheus has no target of the prjquota-exporter scrape job that the rules'' selector names (service discovery lost them, or the job was renamed or removed): host volume usage on those nodes is unknown and the volume alerts cannot fire.'\n\
         \x20             runbook_url: '{}#prjquotaexporterdown'\n",
        custom.runbook_url
    );
    fires_nothing_without_targets(
        &custom_rules,
        &file,
        Some(("PrjquotaExporterDown", &no_target)),
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// `fires`: the one alert expected, and its `exp_alerts` entries.
fn fires_nothing_without_targets(
    rules: &serde_norway::Value,
    file: &std::path::Path,
    fires: Option<(&str, &str)>,
) {
    let alerts: BTreeSet<&str> = rule_list(rules)
        .into_iter()
        .filter_map(|r| r["alert"].as_str())
        .collect();
    assert!(alerts.len() >= 10, "{alerts:?}");
    let series = [
        ("up{job=\"node\",instance=\"node-1:9100\"}", "1x150"),
        ("up{job=\"node\",instance=\"node-2:9100\"}", "0x150"),
        ("up{job=\"node\",instance=\"node-3:9100\"}", "1x10 stale"),
        (
            "node_filesystem_avail_bytes{job=\"node\",instance=\"node-1:9100\",mountpoint=\"/\"}",
            "1000000-1000x150",
        ),
        (
            "node_filesystem_size_bytes{job=\"node\",instance=\"node-1:9100\",mountpoint=\"/\"}",
            "10000000x150",
        ),
        (
            "node_exporter_build_info{job=\"node\",instance=\"node-1:9100\",version=\"1.8.2\"}",
            "1x150",
        ),
    ];
    let mut test = format!(
        "rule_files:\n  - {}\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n",
        file.display()
    );
    for (s, v) in series {
        test += &format!("      - series: '{s}'\n        values: '{v}'\n");
    }
    test += "    alert_rule_test:\n";
    for eval in ["20m", "2h"] {
        for a in &alerts {
            match fires {
                Some((alert, expected)) if alert == *a => {
                    test += &format!(
                        "      - eval_time: {eval}\n        alertname: {a}\n        exp_alerts:\n{expected}"
                    )
                }
                _ => {
                    test += &format!(
                        "      - eval_time: {eval}\n        alertname: {a}\n        exp_alerts: []\n"
                    )
                }
            }
        }
    }
    let d = scratch("no-targets");
    let test_file = d.join("test.yaml");
    std::fs::write(&test_file, &test).unwrap();
    let out = promtool(&["test", "rules", &test_file.to_string_lossy()]);
    std::fs::remove_dir_all(&d).unwrap();
    assert!(out.contains("SUCCESS"), "{file:?}: {out}");
}
