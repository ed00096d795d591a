//! The third-party licence notice the packages ship
//! (`/usr/share/doc/prjquota/THIRD-PARTY-LICENSES`), generated from
//! `cargo metadata`, never written by hand: every crate the static binaries
//! link, its version and licence expression from Cargo.lock's registry
//! manifests, and the licence files the crate itself ships, identical
//! texts printed once.
//!
//! Linked means reached from `prjquota` or `prjquota-exporter` through
//! normal dependencies on x86_64 Linux: build dependencies, dev
//! dependencies and proc macros (which run in the compiler) and their own
//! dependencies are left out, as are the workspace's own crates (the
//! package's LICENSE). cargo-about does the same and more, but is not
//! installed here and is a long `cargo install` on CI's two cores; this
//! needs serde_json, which xtask already has.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// The notice's file name, in the packages' doc directory.
pub const FILE: &str = "THIRD-PARTY-LICENSES";

/// One linked crate.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Crate {
    pub name: String,
    pub version: String,
    /// The SPDX expression of its manifest (`license`), or the
    /// `license-file` it names.
    pub license: String,
    pub dir: PathBuf,
}

/// The notice for the crates `cargo metadata` says the workspace packages
/// `bins` link when built for `triple`.
pub fn render_for_workspace(root: &Path, triple: &str, bins: &[&str]) -> Result<String> {
    let meta = workspace_metadata(root, triple)?;
    let crates = linked(&meta, bins)?;
    let texts = crates
        .iter()
        .map(|c| Ok((c.clone(), licence_files(&c.dir)?)))
        .collect::<Result<Vec<_>>>()?;
    Ok(render(&texts))
}

/// `cargo metadata` of the workspace at `root`, resolved for `triple`.
pub fn workspace_metadata(root: &Path, triple: &str) -> Result<Value> {
    let o = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--filter-platform",
            triple,
        ])
        .output()
        .context("run cargo metadata")?;
    if !o.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    serde_json::from_slice(&o.stdout).context("cargo metadata's JSON")
}

/// The crates reached from the workspace packages `roots` by normal
/// dependencies, not through a proc macro, sorted, the workspace's own
/// crates left out.
pub fn linked(meta: &Value, roots: &[&str]) -> Result<Vec<Crate>> {
    let packages: BTreeMap<&str, &Value> = meta["packages"]
        .as_array()
        .context("cargo metadata: no packages")?
        .iter()
        .filter_map(|p| Some((p["id"].as_str()?, p)))
        .collect();
    let nodes: BTreeMap<&str, &Value> = meta["resolve"]["nodes"]
        .as_array()
        .context("cargo metadata: no resolve graph")?
        .iter()
        .filter_map(|n| Some((n["id"].as_str()?, n)))
        .collect();
    let members: BTreeSet<&str> = meta["workspace_members"]
        .as_array()
        .context("cargo metadata: no workspace_members")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let is_proc_macro = |id: &str| {
        packages.get(id).is_some_and(|p| {
            p["targets"].as_array().is_some_and(|ts| {
                ts.iter().any(|t| {
                    t["kind"]
                        .as_array()
                        .is_some_and(|k| k.iter().any(|k| k == "proc-macro"))
                })
            })
        })
    };
    let mut todo: Vec<&str> = Vec::new();
    for r in roots {
        let id = members
            .iter()
            .find(|id| packages.get(**id).is_some_and(|p| p["name"] == *r))
            .with_context(|| format!("{r} is not a workspace member"))?;
        todo.push(id);
    }
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    while let Some(id) = todo.pop() {
        if !seen.insert(id) {
            continue;
        }
        let Some(node) = nodes.get(id) else { continue };
        for dep in node["deps"].as_array().into_iter().flatten() {
            let normal = dep["dep_kinds"]
                .as_array()
                .is_some_and(|ks| ks.iter().any(|k| k["kind"].is_null()));
            let Some(pkg) = dep["pkg"].as_str() else {
                continue;
            };
            if normal && !is_proc_macro(pkg) {
                todo.push(pkg);
            }
        }
    }
    let mut out = Vec::new();
    for id in seen {
        if members.contains(id) {
            continue;
        }
        let p = packages[id];
        let license = match (p["license"].as_str(), p["license_file"].as_str()) {
            (Some(l), _) => l.to_string(),
            (None, Some(f)) => format!("see {f}"),
            (None, None) => bail!(
                "{} {} declares no licence: check it before shipping it",
                p["name"],
                p["version"]
            ),
        };
        let manifest = p["manifest_path"].as_str().context("manifest_path")?;
        out.push(Crate {
            name: p["name"].as_str().unwrap_or_default().to_string(),
            version: p["version"].as_str().unwrap_or_default().to_string(),
            license,
            dir: Path::new(manifest)
                .parent()
                .context("manifest's directory")?
                .to_path_buf(),
        });
    }
    out.sort();
    Ok(out)
}

/// Is `name` a licence or notice file a crate ships at its top?
pub fn is_licence_file(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    [
        "LICENSE",
        "LICENCE",
        "COPYING",
        "NOTICE",
        "UNLICENSE",
        "COPYRIGHT",
    ]
    .iter()
    .any(|p| upper.starts_with(p))
}

/// The licence files at the top of a crate's directory, by name.
fn licence_files(dir: &Path) -> Result<Vec<(String, String)>> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if e.file_type()?.is_file() && is_licence_file(&name) {
            let text = std::fs::read(e.path())?;
            files.push((name, String::from_utf8_lossy(&text).into_owned()));
        }
    }
    files.sort();
    Ok(files)
}

/// The notice: a table of the crates, then each distinct licence text
/// once, with the crates (and their file names) that ship it.
pub fn render(crates: &[(Crate, Vec<(String, String)>)]) -> String {
    let mut out = String::from(
        "Third-party software linked into prjquota and prjquota-exporter\n\
         ================================================================\n\n\
         The static binaries of this package contain these Rust crates, listed by\n\
         `cargo xtask dist` from Cargo.lock (the crates the binaries link on x86_64\n\
         Linux; not the build tools nor proc macros), with the licence each declares\n\
         and, below, the licence files each crate ships. They also contain the GNU C\n\
         Library (LGPL-2.1-or-later, with exceptions), linked statically from\n\
         Debian's libc6-dev; its licence is /usr/share/common-licenses/LGPL-2.1 on\n\
         Debian and its source is Debian's glibc source package.\n\n",
    );
    let width = crates
        .iter()
        .map(|(c, _)| c.name.len() + 1 + c.version.len())
        .max()
        .unwrap_or(0);
    for (c, _) in crates {
        let id = format!("{} {}", c.name, c.version);
        out += &format!("{id:width$}  {}\n", c.license);
    }
    // Identical texts once, with who ships them.
    let mut by_text: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut without = Vec::new();
    for (c, files) in crates {
        if files.is_empty() {
            without.push(format!("{} {} ({})", c.name, c.version, c.license));
        }
        for (name, text) in files {
            by_text
                .entry(text.trim())
                .or_default()
                .push(format!("{} {} ({name})", c.name, c.version));
        }
    }
    let mut blocks: Vec<(Vec<String>, &str)> =
        by_text.into_iter().map(|(t, who)| (who, t)).collect();
    blocks.sort();
    for (who, text) in blocks {
        out += &format!("\n{}\n", "-".repeat(72));
        out += &format!("Shipped by: {}\n\n{text}\n", who.join(", "));
    }
    if !without.is_empty() {
        out += &format!("\n{}\n", "-".repeat(72));
        out += &format!(
            "No licence file in the crate (the SPDX licence above applies; its text is in\n\
             /usr/share/common-licenses on Debian or at https://spdx.org/licenses/):\n{}\n",
            without.join("\n")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pkg(name: &str, license: &str, proc_macro: bool) -> Value {
        json!({
            "id": format!("{name}-id"), "name": name, "version": "1.0.0",
            "license": license, "license_file": null,
            "manifest_path": format!("/reg/{name}/Cargo.toml"),
            "targets": [{"kind": [if proc_macro { "proc-macro" } else { "lib" }]}],
        })
    }

    fn edge(to: &str, kind: Option<&str>) -> Value {
        json!({"pkg": format!("{to}-id"), "dep_kinds": [{"kind": kind, "target": null}]})
    }

    /// A workspace `app` using `a` (which uses `b`), a build dependency
    /// `cc`, a dev dependency `t` and a proc macro `derive` using `syn`.
    fn meta() -> Value {
        json!({
            "workspace_members": ["app-id", "own-id"],
            "packages": [
                pkg("app", "MPL-2.0", false), pkg("own", "MPL-2.0", false),
                pkg("a", "MIT OR Apache-2.0", false), pkg("b", "MIT", false),
                pkg("cc", "MIT", false), pkg("t", "MIT", false),
                pkg("derive", "MIT", true), pkg("syn", "MIT", false),
            ],
            "resolve": {"nodes": [
                {"id": "app-id", "deps": [edge("a", None), edge("own", None),
                    edge("cc", Some("build")), edge("t", Some("dev")), edge("derive", None)]},
                {"id": "own-id", "deps": []},
                {"id": "a-id", "deps": [edge("b", None)]},
                {"id": "b-id", "deps": []}, {"id": "cc-id", "deps": []},
                {"id": "t-id", "deps": []},
                {"id": "derive-id", "deps": [edge("syn", None)]},
                {"id": "syn-id", "deps": []},
            ]},
        })
    }

    #[test]
    fn lists_what_is_linked_and_nothing_else() {
        let names: Vec<String> = linked(&meta(), &["app"])
            .unwrap()
            .into_iter()
            .map(|c| format!("{} {}", c.name, c.license))
            .collect();
        assert_eq!(names, ["a MIT OR Apache-2.0", "b MIT"]);
        assert!(linked(&meta(), &["nope"]).is_err());
    }

    #[test]
    fn a_crate_without_a_licence_is_refused() {
        let mut m = meta();
        m["packages"][3]["license"] = Value::Null;
        let e = linked(&m, &["app"]).unwrap_err();
        assert!(format!("{e}").contains("declares no licence"), "{e}");
    }

    #[test]
    fn identical_texts_are_printed_once() {
        let c = |n: &str| Crate {
            name: n.into(),
            version: "1.0.0".into(),
            license: "MIT".into(),
            dir: PathBuf::new(),
        };
        let mit = ("LICENSE-MIT".to_string(), "MIT text\n".to_string());
        let text = render(&[
            (c("a"), vec![mit.clone()]),
            (c("b"), vec![mit]),
            (c("z"), vec![]),
        ]);
        assert_eq!(text.matches("MIT text").count(), 1, "{text}");
        assert!(text.contains("Shipped by: a 1.0.0 (LICENSE-MIT), b 1.0.0 (LICENSE-MIT)"));
        assert!(text.contains("z 1.0.0 (MIT)"));
        assert!(text.contains("a 1.0.0  MIT\n"), "{text}");
    }

    #[test]
    fn licence_files_are_recognised_by_name() {
        for n in [
            "LICENSE",
            "LICENSE-MIT",
            "license-apache",
            "COPYING",
            "NOTICE",
            "UNLICENSE",
        ] {
            assert!(is_licence_file(n), "{n}");
        }
        for n in ["README.md", "Cargo.toml", "src"] {
            assert!(!is_licence_file(n), "{n}");
        }
    }
}
