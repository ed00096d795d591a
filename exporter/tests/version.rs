//! Two builds of one version can be told apart: `--version` names the git
//! revision, and `prjquota_exporter_build_info` carries the same.

use std::process::Command;

#[test]
fn version_names_the_revision_build_info_carries() {
    let out = Command::new(env!("CARGO_BIN_EXE_prjquota-exporter"))
        .arg("--version")
        .output()
        .expect("run prjquota-exporter --version");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let want = format!(
        "prjquota-exporter {} (revision {})\n",
        env!("CARGO_PKG_VERSION"),
        prjquota_exporter::collector::BUILD_REVISION
    );
    assert_eq!(text, want);
    let rev = prjquota_exporter::collector::BUILD_REVISION;
    let hash = rev.strip_suffix("-dirty").unwrap_or(rev);
    // This repository is a git checkout: the revision is known.
    assert!(
        hash.len() == 12 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
        "revision {rev:?} is not a short commit hash"
    );
}
