//! The alerts table of docs/dashboards.md against the rule file: every
//! alert, with every severity it fires at, and nothing else. (The metrics
//! table of docs/metrics.md is checked against the exporter in
//! `dashboard.rs`; the docs' figures and prose by `xtask/src/docs.rs`.)

use std::collections::BTreeSet;

use prjquota_dashboards::{repo_root, rule_list, rules, RULES};

/// `(alert, severity)` of every alerting rule.
fn rule_alerts() -> BTreeSet<(String, String)> {
    let rules = rules();
    let set: BTreeSet<(String, String)> = rule_list(&rules)
        .into_iter()
        .filter_map(|r| {
            let name = r["alert"].as_str()?;
            let severity = r["labels"]["severity"]
                .as_str()
                .unwrap_or_else(|| panic!("{name} has no severity label"));
            Some((name.to_string(), severity.to_string()))
        })
        .collect();
    assert!(!set.is_empty(), "no alerting rule in {RULES}");
    set
}

/// `(alert, severity)` of every row of the `| alert | severity |` table; a
/// severity cell of `critical / warning` stands for both.
fn documented_alerts(page: &str) -> BTreeSet<(String, String)> {
    let mut set = BTreeSet::new();
    let rows = page
        .lines()
        .skip_while(|l| !l.starts_with("| alert | severity |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'));
    for row in rows {
        let row = row.replace("\\|", "/");
        let mut cells = row.split('|').skip(1).map(str::trim);
        let name = cells
            .next()
            .unwrap_or_default()
            .trim_matches('`')
            .to_string();
        for severity in cells.next().unwrap_or_default().split('/') {
            set.insert((name.clone(), severity.trim().to_string()));
        }
    }
    set
}

#[test]
fn the_docs_list_exactly_the_alerts_of_the_rules() {
    let page = std::fs::read_to_string(repo_root().join("docs/dashboards.md"))
        .expect("read docs/dashboards.md");
    let documented = documented_alerts(&page);
    assert!(
        !documented.is_empty(),
        "docs/dashboards.md has no `| alert | severity |` table"
    );
    let rules = rule_alerts();
    let missing: Vec<_> = rules.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&rules).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "docs/dashboards.md's alerts table is out of step with dashboards/{RULES}:\n  \
         in the rules but not in the table: {missing:?}\n  \
         in the table but not in the rules: {unknown:?}"
    );
}

#[test]
fn a_row_of_two_severities_stands_for_both() {
    let page = "| alert | severity | fires when |\n| --- | --- | --- |\n\
                | `A` | critical / warning | x |\n| `B` | info | y |\n\ntext\n";
    let got = documented_alerts(page);
    let want: BTreeSet<(String, String)> = [("A", "critical"), ("A", "warning"), ("B", "info")]
        .iter()
        .map(|(a, s)| (a.to_string(), s.to_string()))
        .collect();
    assert_eq!(got, want);
}
