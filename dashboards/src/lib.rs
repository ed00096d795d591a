//! Helpers that lint the operator-facing artefacts of `dashboards/`:
//! the Grafana dashboard (`prjquota.json`) and the Prometheus rules
//! (`alerts.yaml`, tested by `alerts_test.yaml`).
//!
//! The checks themselves are the integration tests in `tests/`; this module
//! only knows how to find every PromQL expression in those files and which
//! metric names an expression reads. It is a small scanner, not a PromQL
//! parser: it understands exactly what the metric-name check needs (strings,
//! label matchers, ranges, function calls, grouping clauses) and refuses what
//! it cannot see through (a `{__name__=…}` selector), so a name can never
//! slip past the check unseen.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::Value;

pub mod config;
pub mod grafana;
pub mod render;

/// `dashboards/`, where the artefacts live.
pub fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The workspace root.
pub fn repo_root() -> PathBuf {
    dir()
        .parent()
        .expect("dashboards/ has a parent")
        .to_path_buf()
}

pub const DASHBOARD: &str = "prjquota.json";
pub const RULES: &str = "alerts.yaml";
pub const RULES_TEST: &str = "alerts_test.yaml";

/// Reads a file of `dashboards/`, panicking with its path.
pub fn read(name: &str) -> String {
    let p = dir().join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

pub fn dashboard() -> Value {
    serde_json::from_str(&read(DASHBOARD))
        .unwrap_or_else(|e| panic!("dashboards/{DASHBOARD} is not valid JSON: {e}"))
}

pub fn rules() -> serde_norway::Value {
    serde_norway::from_str(&read(RULES))
        .unwrap_or_else(|e| panic!("dashboards/{RULES} is not valid YAML: {e}"))
}

/// The shipped config, `dashboards/config.toml`.
pub fn shipped_config() -> config::Config {
    config::Config::load(&dir().join(config::FILE)).unwrap_or_else(|e| panic!("{e}"))
}

/// `dashboards/tests/custom.toml`: a config that changes every kind of knob
/// (a job selector, another cluster label, other thresholds and durations,
/// a runbook of one's own, another dashboard identity), which the lints
/// run on next to the shipped files.
pub fn custom_config() -> config::Config {
    config::Config::load(&dir().join("tests/custom.toml")).unwrap_or_else(|e| panic!("{e}"))
}

/// The rules and dashboard rendered from `c`, parsed.
pub fn rendered(c: &config::Config) -> (Value, serde_norway::Value) {
    let d = render::dashboard(c).unwrap_or_else(|e| panic!("render the dashboard: {e}"));
    let r = render::rules(c).unwrap_or_else(|e| panic!("render the rules: {e}"));
    (
        serde_json::from_str(&d).expect("rendered dashboard is JSON"),
        serde_norway::from_str(&r).expect("rendered rules are YAML"),
    )
}

/// The shipped files, then the render of [`custom_config`]: each named,
/// with its config, dashboard and rules, for lints that must hold for any
/// config.
pub fn cases() -> Vec<(&'static str, config::Config, Value, serde_norway::Value)> {
    let custom = custom_config();
    let (d, r) = rendered(&custom);
    vec![
        ("shipped files", shipped_config(), dashboard(), rules()),
        ("render of tests/custom.toml", custom, d, r),
    ]
}

/// A fresh directory under the system's temp dir for one test.
pub fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("prjquota-dashboards-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("create {}: {e}", d.display()));
    d
}

pub const PROMTOOL: &str = "/usr/bin/promtool";

/// Runs promtool in dashboards/; panics with its output unless it succeeds.
pub fn promtool(args: &[&str]) -> String {
    assert!(
        std::path::Path::new(PROMTOOL).is_file(),
        "{PROMTOOL} is missing: run `cargo xtask deps` (it installs Debian's `prometheus` package, which ships promtool)"
    );
    let out = std::process::Command::new(PROMTOOL)
        .args(args)
        .current_dir(dir())
        .output()
        .unwrap_or_else(|e| panic!("run {PROMTOOL}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool {} failed ({}):\n{text}",
        args.join(" "),
        out.status
    );
    text
}

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

/// PromQL keywords that look like identifiers.
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "atan2",
    "inf",
    "nan",
];

/// Keywords followed by a parenthesised list of label names.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// Aggregation operators: `sum by (l) (x)` opens its call after the
/// grouping clause.
const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
];

/// One metric read by an expression, and the function it is the first
/// argument of (`rate`, `deriv`, …), if any.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Use {
    pub metric: String,
    pub function: Option<String>,
}

/// The metric names an expression reads, each with the function it is
/// passed to directly (so `rate(x[5m])` gives `x` in `rate`).
pub fn metric_uses(expr: &str) -> Result<BTreeSet<Use>, String> {
    Ok(scan(expr)?.into_iter().map(|s| s.used).collect())
}

/// A label matcher: `(label, operator, value)`, the value without quotes.
pub type Matcher = (String, String, String);

/// One selector of an expression: the metric and its label matchers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selector {
    pub used: Use,
    /// `(label, operator, value)` of each matcher, in order; the value
    /// without its quotes.
    pub matchers: Vec<Matcher>,
    /// Byte offset just past the metric name in the expression.
    pub name_end: usize,
    /// Byte offset of its `{`, if it has matchers.
    pub brace: Option<usize>,
}

impl Selector {
    /// The matchers on `label`.
    pub fn on(&self, label: &str) -> Vec<(&str, &str)> {
        self.matchers
            .iter()
            .filter(|(l, _, _)| l == label)
            .map(|(_, op, v)| (op.as_str(), v.as_str()))
            .collect()
    }
}

/// Every selector an expression reads, in order (a metric read twice is
/// there twice).
pub fn selectors(expr: &str) -> Result<Vec<Selector>, String> {
    scan(expr)
}

/// A selector's matchers as a config gives them (`job="prjquota"`,
/// `job=~"a|b", env!="dev"`): checked to be label matchers and nothing
/// else, so that inserting them into a selector keeps the expression valid.
pub fn parse_matchers(text: &str) -> Result<Vec<Matcher>, String> {
    if text.contains("__name__") {
        return Err(format!(
            "{text:?}: a __name__ matcher would change which metric is read"
        ));
    }
    let found = matchers(text)?;
    for (label, op, _) in &found {
        if !matches!(op.as_str(), "=" | "!=" | "=~" | "!~") {
            return Err(format!(
                "{text:?}: {label}{op}: the operator is one of = != =~ !~"
            ));
        }
        if label.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(format!("{text:?}: {label} is not a label name"));
        }
    }
    Ok(found)
}

/// The prefix of Nomad's own series, which the allocation rules read: they
/// come from Nomad's agents, another scrape job than the exporter's, so a
/// render gives them the config's `[nomad] selector` instead of its
/// `selector`.
pub const NOMAD_PREFIX: &str = "nomad_client_";

/// `expr` with label matchers (as text, `job="x"`) added to every selector
/// it reads: `ours` to the exporter's series and the rules' records of
/// them, `nomad` to Nomad's own ([`NOMAD_PREFIX`]). `m` becomes
/// `m{job="x"}`, `m{a="b"}` becomes `m{job="x", a="b"}`. The rest of the
/// text, layout included, is kept.
pub fn with_matchers(expr: &str, ours: &str, nomad: &str) -> Result<String, String> {
    let (ours, nomad) = (ours.trim(), nomad.trim());
    if ours.is_empty() && nomad.is_empty() {
        return Ok(expr.to_string());
    }
    let mut out = expr.to_string();
    let sels = scan(expr)?;
    // From the end, so the earlier offsets stay valid.
    for s in sels.iter().rev() {
        let matchers = if s.used.metric.starts_with(NOMAD_PREFIX) {
            nomad
        } else {
            ours
        };
        if matchers.is_empty() {
            continue;
        }
        match s.brace {
            Some(at) if s.matchers.is_empty() => out.insert_str(at + 1, matchers),
            Some(at) => out.insert_str(at + 1, &format!("{matchers}, ")),
            None => out.insert_str(s.name_end, &format!("{{{matchers}}}")),
        }
    }
    Ok(out)
}

/// `a="x", b=~"$y"` as `(label, operator, value)` triples.
fn matchers(body: &str) -> Result<Vec<Matcher>, String> {
    let b = body.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b',') {
            i += 1;
        }
        if i >= b.len() {
            return Ok(out);
        }
        let start = i;
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            i += 1;
        }
        let label = body[start..i].to_string();
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        let op_start = i;
        while i < b.len() && matches!(b[i], b'=' | b'!' | b'~') {
            i += 1;
        }
        let op = body[op_start..i].to_string();
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if label.is_empty() || op.is_empty() || !matches!(b.get(i), Some(b'"' | b'\'' | b'`')) {
            return Err(format!("cannot read the matchers {{{body}}}"));
        }
        let end = skip_string(b, i).ok_or_else(|| format!("unterminated string in {{{body}}}"))?;
        out.push((label, op, body[i + 1..end - 1].to_string()));
        i = end;
    }
}

fn scan(expr: &str) -> Result<Vec<Selector>, String> {
    let b = expr.as_bytes();
    let mut out = Vec::new();
    // The innermost open function call's name per parenthesis level, and
    // whether anything was read inside it yet (only a first argument that
    // is a bare selector counts as "passed to" it).
    let mut calls: Vec<Option<(String, bool)>> = Vec::new();
    // An aggregation whose `(` comes after its grouping clause.
    let mut pending: Option<String> = None;
    let mut i = 0;
    let skip_ws = |mut j: usize| {
        while j < b.len() && b[j].is_ascii_whitespace() {
            j += 1;
        }
        j
    };
    while i < b.len() {
        let c = b[i];
        match c {
            b'"' | b'\'' | b'`' => {
                i = skip_string(b, i).ok_or_else(|| format!("unterminated string in {expr:?}"))?;
            }
            b'#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'{' => {
                let end =
                    skip_until(b, i, b'}').ok_or_else(|| format!("unterminated {{ in {expr:?}"))?;
                let body = &expr[i..end];
                if body.contains("__name__") {
                    return Err(format!(
                        "a __name__ matcher hides the metric name from the lint: {expr:?}"
                    ));
                }
                i = end;
            }
            b'[' => {
                i = skip_until(b, i, b']').ok_or_else(|| format!("unterminated [ in {expr:?}"))?;
            }
            b'(' => {
                calls.push(pending.take().map(|name| (name, false)));
                i += 1;
            }
            b')' => {
                calls.pop();
                i += 1;
            }
            b'$' => {
                // A Grafana variable (in a matcher or range it is skipped
                // with them; elsewhere it is a value, not a metric).
                i += 1;
                if b.get(i) == Some(&b'{') {
                    i = skip_until(b, i, b'}').unwrap_or(b.len());
                } else {
                    while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                        i += 1;
                    }
                }
            }
            c if c.is_ascii_digit()
                || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit)) =>
            {
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.' || b[i] == b'_')
                {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == b'_' || c == b':' => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b':')
                {
                    i += 1;
                }
                let word = &expr[start..i];
                let next = skip_ws(i);
                let lower = word.to_ascii_lowercase();
                if LABEL_LISTS.contains(&lower.as_str()) {
                    if b.get(next) == Some(&b'(') {
                        i = skip_until(b, next, b')')
                            .ok_or_else(|| format!("unterminated label list in {expr:?}"))?;
                    }
                } else if KEYWORDS.contains(&lower.as_str()) {
                    // an operator or a number
                } else if AGGREGATIONS.contains(&lower.as_str()) && b.get(next) != Some(&b'(') {
                    pending = Some(word.to_string());
                } else if b.get(next) == Some(&b'(') {
                    // A function call or aggregation: remember its name
                    // for its first argument.
                    calls.push(Some((word.to_string(), false)));
                    i = next + 1;
                } else {
                    let function = match calls.last_mut() {
                        Some(Some((name, seen))) if !*seen => {
                            *seen = true;
                            Some(name.clone())
                        }
                        _ => None,
                    };
                    let mut found = Vec::new();
                    let name_end = i;
                    let brace = (b.get(next) == Some(&b'{')).then_some(next);
                    if b.get(next) == Some(&b'{') {
                        let end = skip_until(b, next, b'}')
                            .ok_or_else(|| format!("unterminated {{ in {expr:?}"))?;
                        let body = &expr[next + 1..end - 1];
                        if body.contains("__name__") {
                            return Err(format!(
                                "a __name__ matcher hides the metric name from the lint: {expr:?}"
                            ));
                        }
                        found = matchers(body)?;
                        i = end;
                    }
                    out.push(Selector {
                        used: Use {
                            metric: word.to_string(),
                            function,
                        },
                        matchers: found,
                        name_end,
                        brace,
                    });
                }
            }
            b',' => {
                if let Some(Some((_, seen))) = calls.last_mut() {
                    *seen = true;
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
    Ok(out)
}

/// The metric names an expression reads.
pub fn metric_names(expr: &str) -> Result<BTreeSet<String>, String> {
    Ok(metric_uses(expr)?.into_iter().map(|u| u.metric).collect())
}

/// Index just past the string starting at `i` (quote at `i`).
fn skip_string(b: &[u8], i: usize) -> Option<usize> {
    let q = b[i];
    let mut j = i + 1;
    while j < b.len() {
        if b[j] == b'\\' && q != b'`' {
            j += 2;
            continue;
        }
        if b[j] == q {
            return Some(j + 1);
        }
        j += 1;
    }
    None
}

/// Index just past the `close` that ends the bracket at `i`, skipping
/// strings and nested brackets of the same kind.
fn skip_until(b: &[u8], i: usize, close: u8) -> Option<usize> {
    let open = b[i];
    let mut depth = 0;
    let mut j = i;
    while j < b.len() {
        match b[j] {
            b'"' | b'\'' | b'`' => {
                j = skip_string(b, j)?;
                continue;
            }
            x if x == open => depth += 1,
            x if x == close => {
                depth -= 1;
                if depth == 0 {
                    return Some(j + 1);
                }
            }
            _ => {}
        }
        j += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_give_each_metric_its_matchers() {
        let s = selectors(
            r#"sum(rate(a_total{x="y,z", w=~"$v"}[5m])) / on (job) b and c{job!="n"} offset 1h"#,
        )
        .unwrap();
        let got: Vec<(String, Vec<Matcher>)> =
            s.into_iter().map(|s| (s.used.metric, s.matchers)).collect();
        let t = |l: &str, o: &str, v: &str| (l.to_string(), o.to_string(), v.to_string());
        assert_eq!(
            got,
            vec![
                (
                    "a_total".into(),
                    vec![t("x", "=", "y,z"), t("w", "=~", "$v")]
                ),
                ("b".into(), vec![]),
                ("c".into(), vec![t("job", "!=", "n")]),
            ]
        );
        assert!(selectors("a{b}").is_err());
    }

    fn names(e: &str) -> Vec<String> {
        metric_names(e).unwrap().into_iter().collect()
    }

    #[test]
    fn finds_metrics_not_functions_labels_or_keywords() {
        assert_eq!(
            names(
                r#"sum by (namespace, volume_id) (rate(a_total{x="y,z", w=~"$v"}[$__rate_interval]))
                   * on (namespace) group_left (volume_name) max by (namespace) (b_info{q="}"})
                   or vector(0) unless c offset 5m > bool 4*24*3600 and d:ratio[5m:1m]"#
            ),
            ["a_total", "b_info", "c", "d:ratio"]
        );
        assert_eq!(
            names("sum(x) by (namespace) / count without(a) (y)"),
            ["x", "y"]
        );
        assert_eq!(names("topk(20, m) and on(v) n"), ["m", "n"]);
        assert_eq!(names("absent(up{job=~\".*prjquota.*\"}) # up\n"), ["up"]);
        assert_eq!(names("1e3 * .5 + 0x1f - Inf"), Vec::<String>::new());
    }

    #[test]
    fn tells_which_function_a_metric_is_passed_to() {
        let uses = metric_uses("sum(rate(a[1m])) + deriv(b[6h]) + topk(3, c) + rate(sum(d)[5m:])")
            .unwrap();
        let got: Vec<(String, Option<String>)> =
            uses.into_iter().map(|u| (u.metric, u.function)).collect();
        assert_eq!(
            got,
            [
                ("a".to_string(), Some("rate".to_string())),
                ("b".to_string(), Some("deriv".to_string())),
                ("c".to_string(), None),
                ("d".to_string(), Some("sum".to_string())),
            ]
        );
    }

    #[test]
    fn refuses_what_it_cannot_see_through() {
        assert!(metric_names(r#"{__name__=~"nomad_.*"}"#).is_err());
        assert!(metric_names(r#"a{b="c"#).is_err());
    }

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
