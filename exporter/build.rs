//! Sets `PRJQUOTA_REVISION`, the git revision the exporter is built from, so
//! that two builds of one version can be told apart (`--version`,
//! `prjquota_exporter_build_info{revision}`). A build outside a git checkout
//! (a source tarball) says `unknown` unless the variable is given.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=PRJQUOTA_REVISION");
    let revision = std::env::var("PRJQUOTA_REVISION")
        .ok()
        .filter(|r| !r.is_empty())
        .or_else(git_revision)
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=PRJQUOTA_REVISION={revision}");
}

/// The short commit hash, with `-dirty` when tracked files differ from it.
fn git_revision() -> Option<String> {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let top = git(&["rev-parse", "--show-toplevel"])?;
    for watched in ["HEAD", "index"] {
        if let Some(p) = git(&["rev-parse", "--git-path", watched]) {
            let p = std::path::Path::new(&top).join(p);
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
    let hash = git(&["rev-parse", "--short=12", "HEAD"])?;
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some(if dirty { format!("{hash}-dirty") } else { hash })
}
