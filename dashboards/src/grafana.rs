//! What Grafana makes of a query variable's results, for tests: the text
//! of each series of a `query_result(…)` variable, and the options its
//! `regex` turns them into.
//!
//! The regex runs in the browser, in JavaScript; its syntax and semantics
//! (lookaheads, named groups) are not those of Rust's `regex`. So it runs
//! here in Node.js, the same engine (V8) and the same `RegExp`, never in a
//! re-implementation that could agree with itself and not with Grafana.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{json, Value};

/// The text Grafana's Prometheus data source gives one series of an
/// instant vector for `query_result(…)`: `name{k="v",k2="v2"} value ms`,
/// the labels in the response's order (Prometheus sorts them), no name
/// for an aggregate, joined by `,` without a space.
pub fn query_result_text(series: &Value) -> String {
    let metric = series["metric"].as_object().cloned().unwrap_or_default();
    let name = metric.get("__name__").and_then(Value::as_str).unwrap_or("");
    let labels: Vec<String> = metric
        .iter()
        .filter(|(k, _)| *k != "__name__")
        .map(|(k, v)| format!("{k}=\"{}\"", v.as_str().unwrap_or("")))
        .collect();
    let at = series["value"][0].as_f64().unwrap_or(0.0);
    let value = series["value"][1].as_str().unwrap_or("");
    format!("{name}{{{}}} {value} {}", labels.join(","), at * 1000.0)
}

/// Grafana's options (value, text) of `texts` under a variable's `regex`
/// (`/…/flags`): a text the regex does not match is dropped; the named
/// groups `value` and `text` (Grafana 7.4+) give the option's value and
/// text, each standing in for the other when missing; without them the
/// first group gives both; without any group the text is the value.
/// Options with a value already listed are dropped, as Grafana does.
///
/// Needs `node` (Node.js) on PATH; an error says so.
pub fn regex_options(regex: &str, texts: &[String]) -> Result<Vec<(String, String)>, String> {
    // Grafana's stringToJsRegex: `/pattern/flags`, else the whole string.
    const SCRIPT: &str = r#"
const input = JSON.parse(require("fs").readFileSync(0, "utf8"));
const m = input.regex.match(/^\/(.*)\/([gimsuy]*)$/s);
const re = m ? new RegExp(m[1], m[2]) : new RegExp(input.regex);
const out = [];
const seen = new Set();
for (const t of input.texts) {
  const r = re.exec(t);
  if (!r) continue;
  let value = t, text = t;
  const g = r.groups || {};
  if (g.value !== undefined || g.text !== undefined) {
    value = g.value ?? g.text;
    text = g.text ?? g.value;
  } else if (r.length > 1) {
    value = r[1];
    text = r[1];
  }
  if (seen.has(value)) continue;
  seen.add(value);
  out.push([value, text]);
}
process.stdout.write(JSON.stringify(out));
"#;
    let mut child = Command::new("node")
        .args(["-e", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            format!(
                "run node: {e}: install Node.js (`cargo xtask deps` does): a variable's regex \
                 runs in JavaScript, as in Grafana"
            )
        })?;
    let input = json!({ "regex": regex, "texts": texts }).to_string();
    child
        .stdin
        .take()
        .expect("stdin piped")
        .write_all(input.as_bytes())
        .map_err(|e| format!("write to node: {e}"))?;
    let out = child
        .wait_with_output()
        .map_err(|e| format!("wait for node: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "node refused the regex {regex}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("node's answer: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_aggregate_has_no_name_and_its_labels_joined_by_commas() {
        let s = json!({"metric": {"a": "1", "b": "x y"}, "value": [1700000000.5, "2"]});
        assert_eq!(query_result_text(&s), r#"{a="1",b="x y"} 2 1700000000500"#);
        let s = json!({"metric": {"__name__": "up", "job": "j"}, "value": [1.0, "1"]});
        assert_eq!(query_result_text(&s), r#"up{job="j"} 1 1000"#);
    }

    #[test]
    fn named_groups_give_value_and_text_and_stand_in_for_each_other() {
        let texts = vec![
            r#"{id="a",name="A"} 1 0"#.to_string(),
            r#"{id="b"} 1 0"#.to_string(),
            r#"{id="a",name="again"} 1 0"#.to_string(),
            "unrelated".to_string(),
        ];
        let got = regex_options(
            r#"/^(?=.*\bid="(?<value>[^"]+)")(?=(?:.*\bname="(?<text>[^"]+)")?)/"#,
            &texts,
        )
        .unwrap();
        assert_eq!(
            got,
            vec![("a".into(), "A".into()), ("b".into(), "b".into())]
        );
        let got = regex_options("/id=\"([^\"]+)\"/", &texts).unwrap();
        assert_eq!(
            got,
            vec![("a".into(), "a".into()), ("b".into(), "b".into())]
        );
    }

    #[test]
    fn a_regex_javascript_refuses_is_an_error() {
        let e = regex_options("/(?<value>a/", &["a".into()]).unwrap_err();
        assert!(e.contains("node refused the regex"), "{e}");
    }
}
