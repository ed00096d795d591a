//! `cargo xtask dist`: release binaries and a tarball an operator installs
//! from: `bin/prjquota`, `bin/prjquota-exporter`, everything under `deploy/`,
//! the dashboard, the rules, the runbooks and the README.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::{cargo, header, run};

pub fn main(args: &[String]) -> Result<u8> {
    if let Some(a) = args.first() {
        bail!("dist takes no arguments (got `{a}`)");
    }
    let root = crate::repo_root();
    let target = crate::target_dir();
    header("build: cargo build --release -p prjquota -p prjquota-exporter");
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "prjquota",
        "-p",
        "prjquota-exporter",
    ]))?;

    let version = env!("CARGO_PKG_VERSION");
    let name = format!("prjquota-{version}-{}-linux", std::env::consts::ARCH);
    let stage = target.join("dist").join(&name);
    if stage.exists() {
        std::fs::remove_dir_all(&stage).context("clear the previous staging dir")?;
    }
    std::fs::create_dir_all(stage.join("bin"))?;
    for bin in ["prjquota", "prjquota-exporter"] {
        std::fs::copy(
            target.join("release").join(bin),
            stage.join("bin").join(bin),
        )
        .with_context(|| format!("copy {bin}"))?;
    }
    for item in [
        "deploy",
        "dashboards/prjquota.json",
        "dashboards/alerts.yaml",
        "dashboards/README.md",
        "docs/runbooks.md",
        "README.md",
    ] {
        copy_tree(&root.join(item), &stage.join(item))?;
    }
    header("tarball");
    let tarball = target.join("dist").join(format!("{name}.tar.gz"));
    run(Command::new("tar")
        .arg("-czf")
        .arg(&tarball)
        .arg("-C")
        .arg(target.join("dist"))
        .arg(&name))?;
    println!("{}", tarball.display());
    Ok(0)
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    if from.is_dir() {
        std::fs::create_dir_all(to)?;
        for e in std::fs::read_dir(from)? {
            let e = e?;
            copy_tree(&e.path(), &to.join(e.file_name()))?;
        }
    } else {
        if let Some(p) = to.parent() {
            std::fs::create_dir_all(p)?;
        }
        std::fs::copy(from, to).with_context(|| format!("copy {}", from.display()))?;
    }
    Ok(())
}
