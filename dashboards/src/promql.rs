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
}
