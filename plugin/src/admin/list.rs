//! `prjquota list`: the volumes on this node, fullest first, filtered by
//! namespace, node pool, name or fill. Its `--json` is an interface
//! scripts rely on: [`JSON_VERSION`] and `docs/list.schema.json` say what
//! it holds, and change together.

use std::collections::HashMap;

use anyhow::{Context, Result};
use serde::Serialize;

use super::Flags;
use crate::fs::VolumesFs;
use crate::quota_control::Control;
use crate::registry::{self, Entry, State};
use prjquota_core::quota;
use prjquota_core::units::human;

/// The version of `list --json`'s document (its `version` field). Raised
/// whenever a field changes meaning or goes away; a new field keeps it.
pub const JSON_VERSION: u32 = 1;

/// One volume as listed (each field is described in docs/operations.md and
/// docs/list.schema.json).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Row {
    pub volume_id: String,
    pub name: String,
    pub namespace: String,
    pub node_pool: String,
    pub state: State,
    pub project_id: u32,
    pub size_bytes: u64,
    /// The capacity Nomad was told: below `size_bytes` for a volume grown
    /// with `prjquota grow` until its spec catches up.
    pub nomad_bytes: u64,
    pub used_bytes: u64,
    pub used_percent: f64,
    pub used_inodes: u64,
    pub max_inodes: Option<u64>,
    pub path: String,
}

/// Which volumes to list; `None` lets every volume through.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filter {
    pub namespace: Option<String>,
    pub node_pool: Option<String>,
    /// Exact, or a glob with `*` and `?`.
    pub name: Option<String>,
    pub min_used_percent: Option<f64>,
}

impl Filter {
    /// Whether a record's labels pass (before its usage is read).
    fn labels_pass(&self, r: &registry::Record) -> bool {
        self.namespace.as_ref().is_none_or(|n| *n == r.namespace)
            && self.node_pool.as_ref().is_none_or(|p| *p == r.node_pool)
            && self
                .name
                .as_ref()
                .is_none_or(|g| glob_match(g, &r.volume_name))
    }

    fn fill_passes(&self, row: &Row) -> bool {
        self.min_used_percent
            .is_none_or(|min| row.used_percent >= min)
    }
}

/// Whether `name` matches `pattern`, where `*` stands for any run of
/// characters and `?` for one; without either it is an exact match.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // The classic two-pointer match, backtracking to the last `*`.
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|c| *c == '*')
}

/// Reads the registry and one quota pass over the recorded project IDs of
/// the volumes `filter` lets through.
pub fn rows(flags: &Flags, filter: &Filter) -> Result<Vec<Row>> {
    let dir = flags.volumes_dir();
    let entries = registry::read_all(&dir)
        .with_context(|| format!("cannot read the registry under {}", dir.display()))?;
    let records: Vec<_> = entries
        .into_iter()
        .filter_map(|e| match e {
            Entry::Record(r) => filter.labels_pass(&r).then_some(*r),
            Entry::Corrupt { file, error } => {
                eprintln!("prjquota: skipping unreadable record {file}: {error}");
                None
            }
        })
        .collect();
    if records.is_empty() {
        return Ok(Vec::new());
    }
    let vfs = VolumesFs::open(&dir, false)?;
    let lo = records.iter().map(|r| r.project_id).min().unwrap_or(1);
    let hi = records.iter().map(|r| r.project_id).max().unwrap_or(1);
    let usage: HashMap<u32, quota::ProjectQuota> = Control::of(&vfs)
        .list(lo..=hi)?
        .into_iter()
        .map(|q| (q.id, q))
        .collect();
    let mut rows: Vec<Row> = records
        .into_iter()
        .map(|r| {
            let q = usage.get(&r.project_id).copied().unwrap_or_default();
            let pct = if r.provisioned_bytes == 0 {
                0.0
            } else {
                q.used_bytes as f64 * 100.0 / r.provisioned_bytes as f64
            };
            Row {
                volume_id: r.volume_id.to_string(),
                name: r.volume_name,
                namespace: r.namespace,
                node_pool: r.node_pool,
                state: r.state,
                project_id: r.project_id,
                size_bytes: r.provisioned_bytes,
                nomad_bytes: r
                    .grown
                    .as_ref()
                    .map_or(r.provisioned_bytes, |g| g.nomad_bytes),
                used_bytes: q.used_bytes,
                used_percent: (pct * 10.0).round() / 10.0,
                used_inodes: q.used_inodes,
                max_inodes: r.params.max_inodes,
                path: r.path.display().to_string(),
            }
        })
        .filter(|row| filter.fill_passes(row))
        .collect();
    sort(&mut rows);
    Ok(rows)
}

/// Fullest first; ties by volume ID so the order is stable.
pub fn sort(rows: &mut [Row]) {
    rows.sort_by(|a, b| {
        b.used_percent
            .total_cmp(&a.used_percent)
            .then_with(|| a.volume_id.cmp(&b.volume_id))
    });
}

/// `list --json`'s document: versioned, so that a script can tell.
#[derive(Serialize)]
struct Document<'a> {
    version: u32,
    volumes: &'a [Row],
}

/// Renders the table (or JSON).
pub fn render(rows: &[Row], json: bool, bytes: bool) -> String {
    if json {
        let doc = Document {
            version: JSON_VERSION,
            volumes: rows,
        };
        return serde_json::to_string_pretty(&doc).expect("serialisable") + "\n";
    }
    let size = |b: u64| if bytes { b.to_string() } else { human(b) };
    let header = [
        "VOLUME ID",
        "NAME",
        "NAMESPACE",
        "NODE POOL",
        "PROJECT",
        "SIZE",
        "USED",
        "USE%",
        "INODES",
        "PATH",
    ];
    let mut table: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
    for r in rows {
        let state = match r.state {
            State::Ready if r.nomad_bytes != r.size_bytes => " (grown)".into(),
            State::Ready => String::new(),
            State::Creating => " (creating)".into(),
            State::Deleting => " (deleting)".into(),
        };
        table.push(vec![
            format!("{}{state}", r.volume_id),
            r.name.escape_debug().to_string(),
            r.namespace.clone(),
            r.node_pool.clone(),
            r.project_id.to_string(),
            size(r.size_bytes),
            size(r.used_bytes),
            format!("{:.1}%", r.used_percent),
            match r.max_inodes {
                Some(m) => format!("{}/{m}", r.used_inodes),
                None => r.used_inodes.to_string(),
            },
            r.path.clone(),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            table
                .iter()
                .map(|row| row[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in &table {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    if !rows.is_empty() {
        let sum = |f: fn(&Row) -> u64| rows.iter().map(f).fold(0u64, u64::saturating_add);
        out.push_str(&format!(
            "total: {} volumes promised {}, using {}\n",
            rows.len(),
            size(sum(|r| r.size_bytes)),
            size(sum(|r| r.used_bytes)),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, pct: f64) -> Row {
        Row {
            volume_id: id.into(),
            name: "n\u{1b}x".into(),
            namespace: "default".into(),
            node_pool: "default".into(),
            state: State::Ready,
            project_id: 7,
            size_bytes: 1 << 30,
            nomad_bytes: 1 << 30,
            used_bytes: 3 << 20,
            used_percent: pct,
            used_inodes: 4,
            max_inodes: Some(100),
            path: "/v".into(),
        }
    }

    #[test]
    fn fullest_first_then_by_id() {
        let mut rows = vec![row("b", 10.0), row("a", 50.0), row("c", 50.0)];
        sort(&mut rows);
        let ids: Vec<_> = rows.iter().map(|r| r.volume_id.as_str()).collect();
        assert_eq!(ids, ["a", "c", "b"]);
    }

    #[test]
    fn table_has_human_or_exact_sizes_and_escapes_names() {
        let t = render(&[row("a", 0.3)], false, false);
        assert!(t.starts_with("VOLUME ID"));
        assert!(
            t.contains("1 GiB") && t.contains("3 MiB") && t.contains("4/100"),
            "{t}"
        );
        assert!(
            t.contains("n\\u{1b}x"),
            "control characters are escaped: {t}"
        );
        let t = render(&[row("a", 0.3)], false, true);
        assert!(t.contains("1073741824") && t.contains("3145728"), "{t}");
        let j: serde_json::Value =
            serde_json::from_str(&render(&[row("a", 0.3)], true, false)).unwrap();
        assert_eq!(j["version"], JSON_VERSION);
        assert_eq!(j["volumes"][0]["size_bytes"], 1u64 << 30);
    }

    #[test]
    fn a_volumes_dir_without_registry_lists_nothing() {
        let flags = Flags {
            volumes_dir: Some(std::env::temp_dir().join("prjquota-list-none")),
            ..Flags::default()
        };
        assert!(rows(&flags, &Filter::default()).unwrap().is_empty());
    }

    #[test]
    fn globs_match_runs_and_single_characters() {
        for (p, n, want) in [
            ("db", "db", true),
            ("db", "db2", false),
            ("db-*", "db-orders", true),
            ("db-*", "db-", true),
            ("*-cache", "redis-cache", true),
            ("*a*b*", "xxaxxbxx", true),
            ("*a*b*", "xxbxxaxx", false),
            ("d?", "db", true),
            ("d?", "d", false),
            ("*", "", true),
            ("", "x", false),
            ("é*", "été", true),
        ] {
            assert_eq!(glob_match(p, n), want, "{p:?} against {n:?}");
        }
    }

    /// The schema file names exactly the fields a row and the document
    /// have, all of them required, and no others allowed: a field added
    /// to one and not the other fails here.
    #[test]
    fn the_schema_file_holds_exactly_the_fields() {
        let schema: serde_json::Value =
            serde_json::from_str(include_str!("../../../docs/list.schema.json")).unwrap();
        let keys = |v: &serde_json::Value| -> Vec<String> {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        let strings = |v: &serde_json::Value| -> Vec<String> {
            let mut k: Vec<String> = v
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap().to_string())
                .collect();
            k.sort();
            k
        };
        let doc: serde_json::Value =
            serde_json::from_str(&render(&[row("a", 1.0)], true, false)).unwrap();
        assert_eq!(keys(&schema["properties"]), keys(&doc));
        assert_eq!(strings(&schema["required"]), keys(&doc));
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(schema["properties"]["version"]["const"], JSON_VERSION);
        let volume = &schema["$defs"]["volume"];
        assert_eq!(keys(&volume["properties"]), keys(&doc["volumes"][0]));
        assert_eq!(strings(&volume["required"]), keys(&doc["volumes"][0]));
        assert_eq!(volume["additionalProperties"], false);
    }
}
