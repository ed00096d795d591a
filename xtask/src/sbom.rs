//! The bill of materials each package ships
//! (`/usr/share/doc/prjquota/prjquota.cdx.json`, and the tarball's root):
//! CycloneDX 1.5 JSON of the three executables and every crate each one
//! links, with its version, licence and package URL.
//!
//! Made from the same reading of `cargo metadata` as THIRD-PARTY-LICENSES
//! (`notice::linked`: normal dependencies, not through a proc macro, for
//! the release target), so the two list exactly the crates in the
//! binaries. A generator such as cargo-cyclonedx would list every
//! workspace crate's whole graph (dev-dependencies, build scripts, the
//! test suite's crates), and would be one more tool for `cargo xtask
//! deps` to build from source in CI's budget.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use serde_json::{json, Value};

use crate::notice::{linked, Crate};

/// The SBOM of `bins` (workspace packages, each an executable of the same
/// name) at `version`, from `cargo metadata`'s `meta`; `epoch` dates it
/// (SOURCE_DATE_EPOCH: the same commit gives the same file).
pub fn render(meta: &Value, bins: &[&str], version: &str, epoch: &str) -> Result<String> {
    let purl = |c: &Crate| format!("pkg:cargo/{}@{}", c.name, c.version);
    let mut crates: BTreeMap<String, Crate> = BTreeMap::new();
    let mut dependencies = Vec::new();
    let mut executables = Vec::new();
    for bin in bins {
        let linked = linked(meta, &[bin])?;
        let bom_ref = format!("prjquota/{bin}@{version}");
        executables.push(json!({
            "type": "application",
            "bom-ref": bom_ref,
            "name": bin,
            "version": version,
            "licenses": [{"license": {"id": "MPL-2.0"}}],
        }));
        dependencies.push(json!({
            "ref": bom_ref,
            "dependsOn": linked.iter().map(purl).collect::<Vec<_>>(),
        }));
        for c in linked {
            crates.insert(purl(&c), c);
        }
    }
    let components: Vec<Value> = executables
        .into_iter()
        .chain(crates.values().map(|c| {
            json!({
                "type": "library",
                "bom-ref": purl(c),
                "name": c.name,
                "version": c.version,
                "purl": purl(c),
                "licenses": [{"expression": c.license}],
            })
        }))
        .collect();
    let timestamp = iso8601(epoch)?;
    let doc = json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": {
            "timestamp": timestamp,
            "tools": {"components": [{"type": "application", "name": "cargo xtask dist"}]},
            "component": {
                "type": "application",
                "bom-ref": format!("prjquota@{version}"),
                "name": "prjquota",
                "version": version,
                "licenses": [{"license": {"id": "MPL-2.0"}}],
            },
        },
        "components": components,
        "dependencies": dependencies,
    });
    Ok(serde_json::to_string_pretty(&doc)? + "\n")
}

/// SOURCE_DATE_EPOCH as CycloneDX's timestamp (UTC).
fn iso8601(epoch: &str) -> Result<String> {
    let o = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ", "-d", &format!("@{epoch}")])
        .output()?;
    anyhow::ensure!(o.status.success(), "date -d @{epoch} failed");
    Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// The SBOM of the workspace's shipped executables, for `dist`.
pub fn for_workspace(root: &Path, triple: &str, bins: &[&str], epoch: &str) -> Result<String> {
    let meta = crate::notice::workspace_metadata(root, triple)?;
    render(&meta, bins, env!("CARGO_PKG_VERSION"), epoch)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The workspace's own: every executable with what it links, each
    /// crate once with a package URL and a licence, the plugin without
    /// the renderer's YAML library.
    #[test]
    fn each_executable_lists_the_crates_it_links() {
        let bins = crate::dist::BINS;
        let text =
            for_workspace(&crate::paths::repo_root(), crate::dist::TRIPLE, &bins, "0").unwrap();
        let doc: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(doc["bomFormat"], "CycloneDX");
        assert_eq!(doc["metadata"]["timestamp"], "1970-01-01T00:00:00Z");
        let comps = doc["components"].as_array().unwrap();
        let purls: Vec<&str> = comps.iter().filter_map(|c| c["purl"].as_str()).collect();
        let mut once = purls.clone();
        once.sort();
        once.dedup();
        assert_eq!(once.len(), purls.len(), "a crate listed twice");
        for c in comps.iter().filter(|c| c["type"] == "library") {
            assert!(c["purl"].as_str().unwrap().starts_with("pkg:cargo/"), "{c}");
            assert!(c["licenses"][0]["expression"].is_string(), "{c}");
        }
        let deps = doc["dependencies"].as_array().unwrap();
        assert_eq!(deps.len(), bins.len());
        let of = |bin: &str| -> Vec<String> {
            deps.iter()
                .find(|d| {
                    d["ref"]
                        .as_str()
                        .unwrap()
                        .starts_with(&format!("prjquota/{bin}@"))
                })
                .unwrap()["dependsOn"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_str().unwrap().to_string())
                .collect()
        };
        for bin in bins {
            assert!(!of(bin).is_empty(), "{bin} links nothing?");
            for p in of(bin) {
                assert!(purls.contains(&p.as_str()), "{bin}: {p} is no component");
            }
        }
        let yaml = |list: &[String]| {
            list.iter()
                .any(|p| p.starts_with("pkg:cargo/serde_norway@"))
        };
        assert!(!yaml(&of("prjquota")) && yaml(&of("prjquota-dashboards")));
        // Reproducible: the same commit, the same file.
        assert_eq!(
            text,
            for_workspace(&crate::paths::repo_root(), crate::dist::TRIPLE, &bins, "0").unwrap()
        );
    }
}
