//! Where the PromQL expressions are in the dashboard (panel targets,
//! variables, annotations) and in the rules, and Grafana's variables in
//! them.

use std::collections::BTreeSet;

use serde_json::Value;

/// Every panel, rows and the panels inside collapsed rows included, in order.
pub fn panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for p in list.as_array().into_iter().flatten() {
            out.push(p);
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// A PromQL expression and where it was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expr {
    /// E.g. `panel 7 "Space used" target B`, `alert NomadHostVolumeFillingUp`.
    pub place: String,
    pub expr: String,
}

/// Every panel target's expression (not the variables' or annotations').
pub fn panel_exprs(dashboard: &Value) -> Vec<Expr> {
    let mut out = Vec::new();
    for p in panels(dashboard) {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push(Expr {
                place: format!(
                    "panel {} {:?} target {}",
                    p["id"],
                    p["title"].as_str().unwrap_or(""),
                    t["refId"].as_str().unwrap_or("?")
                ),
                expr: t["expr"].as_str().unwrap_or("").to_string(),
            });
        }
    }
    out
}

/// Whether a panel's target draws one series (or table row) per volume,
/// task group, allocation or firing alert, which the Top N variable must
/// bound: its legend names one, or it is a table whose rows are volumes,
/// allocations or alerts.
pub fn draws_per_item(target: &Value, panel_type: &str) -> bool {
    let legend = target["legendFormat"].as_str().unwrap_or("");
    let expr = target["expr"].as_str().unwrap_or("");
    ["volume_name", "volume_id", "alloc_id", "task_group"]
        .iter()
        .any(|l| legend.contains(&format!("{{{{{l}}}}}")))
        || (panel_type == "table"
            && (expr.contains("group_left (volume_name)")
                || expr.contains("alloc_id")
                || expr.contains("ALERTS{")))
}

/// The template variables (`templating.list`).
pub fn variables(dashboard: &Value) -> Vec<&Value> {
    dashboard["templating"]["list"]
        .as_array()
        .map(|l| l.iter().collect())
        .unwrap_or_default()
}

/// A query variable's query: a string, or `{"query": …}` as Grafana 10's
/// Prometheus variable editor saves it.
pub fn variable_query(var: &Value) -> Option<&str> {
    var["query"]
        .as_str()
        .or_else(|| var["query"]["query"].as_str())
}

/// `label_values(SELECTOR, LABEL)` split into the selector (a PromQL
/// expression) and the label; `label_values(LABEL)` gives an empty selector.
pub fn label_values(query: &str) -> Option<(String, String)> {
    let inner = query
        .trim()
        .strip_prefix("label_values(")?
        .strip_suffix(')')?;
    match inner.rfind(',') {
        Some(i) => Some((
            inner[..i].trim().to_string(),
            inner[i + 1..].trim().to_string(),
        )),
        None => Some((String::new(), inner.trim().to_string())),
    }
}

/// `query_result(EXPR)`'s expression: a variable whose options come from
/// whole series (the volume picker, which takes two labels of each).
pub fn query_result(query: &str) -> Option<String> {
    let inner = query
        .trim()
        .strip_prefix("query_result(")?
        .strip_suffix(')')?;
    Some(inner.trim().to_string())
}

/// Every expression of the dashboard: panel targets, the selectors of
/// `label_values` variables and the expressions of `query_result` ones,
/// and annotation queries.
pub fn dashboard_exprs(dashboard: &Value) -> Vec<Expr> {
    let mut out = panel_exprs(dashboard);
    for v in variables(dashboard) {
        if v["type"] != "query" {
            continue;
        }
        let q = variable_query(v).unwrap_or("");
        let selector = label_values(q)
            .map(|(selector, _)| selector)
            .or_else(|| query_result(q))
            .unwrap_or_else(|| {
                panic!(
                    "variable {}: only label_values(…) and query_result(…) queries are \
                     linted, got {q:?}",
                    v["name"]
                )
            });
        out.push(Expr {
            place: format!("variable {}", v["name"]),
            expr: selector,
        });
    }
    for a in dashboard["annotations"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(e) = a["expr"].as_str() {
            out.push(Expr {
                place: format!("annotation {}", a["name"]),
                expr: e.to_string(),
            });
        }
    }
    out
}

/// The rules of `alerts.yaml`: (group, rule) pairs in order.
pub fn rule_list(rules: &serde_norway::Value) -> Vec<&serde_norway::Value> {
    let mut out = Vec::new();
    for g in rules["groups"].as_sequence().into_iter().flatten() {
        for r in g["rules"].as_sequence().into_iter().flatten() {
            out.push(r);
        }
    }
    out
}

/// Every rule's expression.
pub fn rule_exprs(rules: &serde_norway::Value) -> Vec<Expr> {
    rule_list(rules)
        .into_iter()
        .map(|r| {
            let name = r["alert"]
                .as_str()
                .map(|a| format!("alert {a}"))
                .or_else(|| r["record"].as_str().map(|n| format!("record {n}")))
                .unwrap_or_else(|| "a rule without alert or record".into());
            Expr {
                place: name,
                expr: r["expr"].as_str().unwrap_or("").to_string(),
            }
        })
        .collect()
}

/// The names the recording rules define.
pub fn recorded(rules: &serde_norway::Value) -> BTreeSet<String> {
    rule_list(rules)
        .into_iter()
        .filter_map(|r| r["record"].as_str().map(str::to_string))
        .collect()
}

/// Grafana's substitution, for tests: `${name}`, `$name` and `[[name]]`
/// replaced by `value` (longest names first, so `$__range_s` is not read as
/// `$__range` + `_s`).
pub fn substitute(expr: &str, vars: &[(&str, &str)]) -> String {
    let mut vars: Vec<&(&str, &str)> = vars.iter().collect();
    vars.sort_by_key(|(n, _)| std::cmp::Reverse(n.len()));
    let mut s = expr.to_string();
    for (name, value) in &vars {
        s = s.replace(&format!("${{{name}}}"), value);
        s = s.replace(&format!("[[{name}]]"), value);
    }
    // `$name` only where the name ends (not `$node_pool_x`).
    for (name, value) in &vars {
        let pat = format!("${name}");
        let mut out = String::with_capacity(s.len());
        let mut rest = s.as_str();
        while let Some(i) = rest.find(&pat) {
            let after = &rest[i + pat.len()..];
            let ends = !after
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            out.push_str(&rest[..i]);
            out.push_str(if ends { value } else { &pat });
            rest = after;
        }
        out.push_str(rest);
        s = out;
    }
    s
}

/// Grafana variables (`$x`, `${x}`, `[[x]]`) an expression still mentions.
pub fn variables_in(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'$' {
            let (start, end_brace) = if b.get(i + 1) == Some(&b'{') {
                (i + 2, true)
            } else {
                (i + 1, false)
            };
            let mut j = start;
            while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
                j += 1;
            }
            if j > start {
                out.insert(expr[start..j].to_string());
            }
            i = if end_brace { j + 1 } else { j };
        } else if b[i] == b'[' && b.get(i + 1) == Some(&b'[') {
            if let Some(end) = expr[i + 2..].find("]]") {
                out.insert(expr[i + 2..i + 2 + end].to_string());
                i += end + 4;
            } else {
                i += 2;
            }
        } else {
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substitutes_grafana_variables() {
        let vars = [
            ("node_pool", "pool-a"),
            ("__range", "1h"),
            ("__rate_interval", "1m"),
        ];
        assert_eq!(
            substitute(
                r#"rate(x{p=~"$node_pool",q="${node_pool}",r="[[node_pool]]",s="$node_pool_x"}[$__rate_interval]) + increase(y[$__range])"#,
                &vars
            ),
            r#"rate(x{p=~"pool-a",q="pool-a",r="pool-a",s="$node_pool_x"}[1m]) + increase(y[1h])"#
        );
        assert_eq!(
            variables_in(r#"x{a="$node_pool", b="${namespace}", c="[[volume]]"}[$__range]"#)
                .into_iter()
                .collect::<Vec<_>>(),
            ["__range", "namespace", "node_pool", "volume"]
        );
    }

    #[test]
    fn splits_label_values() {
        assert_eq!(
            label_values(r#"label_values(m{a=~"$b", c="d,e"}, volume_id)"#),
            Some((
                r#"m{a=~"$b", c="d,e"}"#.to_string(),
                "volume_id".to_string()
            ))
        );
        assert_eq!(
            label_values("label_values(node_pool)"),
            Some((String::new(), "node_pool".to_string()))
        );
        assert_eq!(label_values("query_result(x)"), None);
        assert_eq!(
            query_result("query_result(max by (a) (m{b=\"c\"}))").as_deref(),
            Some("max by (a) (m{b=\"c\"})")
        );
        assert_eq!(query_result("label_values(m, a)"), None);
    }
}
