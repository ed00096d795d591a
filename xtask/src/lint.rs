//! The distributions' own checks of the packages: Debian's `lintian` on the
//! .deb and `rpmlint` on the .rpm, each failing on an error or a warning.
//!
//! Every finding that stays is overridden in the package or the repository
//! with its reason, one by one: the .deb ships
//! `/usr/share/lintian/overrides/prjquota` (deploy/package/lintian-overrides,
//! which lintian reads from the package), and rpmlint reads the filters of
//! deploy/package/rpmlint.toml, given with `-c`. No tag is suppressed
//! wholesale here; the two findings the test packages of `cargo xtask test`
//! cause by design are tolerated on the one file they concern
//! ([`Build::Test`]).

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

/// rpmlint's configuration: the filters of the findings that stay, each
/// with its reason.
pub const RPMLINT_CONFIG: &str = "deploy/package/rpmlint.toml";

/// The lintian overrides the .deb ships, each with its reason.
pub const LINTIAN_OVERRIDES: &str = "deploy/package/lintian-overrides";

/// What the binaries in the packages are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    /// `cargo xtask dist`'s: both static release binaries.
    Release,
    /// `cargo xtask test`'s: the static release plugin and the run's debug
    /// exporter and dashboards renderer, linked dynamically against glibc.
    /// Of those two alone, which the released, static ones cannot be,
    /// lintian then says `undeclared-elf-prerequisites` (the package
    /// declares no libc6) and `mismatched-override` of the override for
    /// the static-pie build; those findings, on those files, are tolerated
    /// for these packages only (`cargo xtask dist` lints its own with none).
    Test,
}

/// The binaries a test package holds as debug builds ([`Build::Test`]).
const DEBUG_IN_TESTS: [&str; 2] = ["usr/bin/prjquota-exporter", "usr/bin/prjquota-dashboards"];

/// Whether a finding of lintian's is one that a `build` causes by design.
pub fn tolerated(build: Build, finding: &str) -> bool {
    build == Build::Test
        && DEBUG_IN_TESTS.iter().any(|bin| {
            finding.ends_with(&format!(" [{bin}]"))
                && finding.contains(": undeclared-elf-prerequisites ")
                || finding.contains(&format!(
                    ": mismatched-override shared-library-lacks-prerequisites [{bin}] "
                ))
        })
}

/// Runs both; fails naming every finding.
pub fn run(root: &Path, deb: &Path, rpm: &Path, build: Build) -> Result<()> {
    let mut failures = Vec::new();
    let mut lintian = Command::new("lintian");
    lintian
        .args(["--tag-display-limit", "0", "--info"])
        .arg(deb);
    match linted(&mut lintian, "lintian") {
        Ok((_, found)) => {
            let (ok, bad): (Vec<String>, Vec<String>) =
                found.into_iter().partition(|f| tolerated(build, f));
            for f in &ok {
                println!("lintian: tolerated in a test package (its debug exporter): {f}");
            }
            if !bad.is_empty() {
                failures.push(format!("lintian:\n{}", bad.join("\n")));
            }
        }
        Err(e) => failures.push(format!("{e:#}")),
    }
    let mut rpmlint = Command::new("rpmlint");
    rpmlint
        .arg("--strict")
        .arg("-c")
        .arg(root.join(RPMLINT_CONFIG))
        .arg(rpm);
    match linted(&mut rpmlint, "rpmlint") {
        Ok((true, found)) if found.is_empty() => {}
        Ok((_, found)) => failures.push(format!("rpmlint:\n{}", found.join("\n"))),
        Err(e) => failures.push(format!("{e:#}")),
    }
    if !failures.is_empty() {
        bail!(
            "the packages have findings: fix each, or override it with its reason in {} \
             (lintian) or {RPMLINT_CONFIG} (rpmlint):\n{}",
            LINTIAN_OVERRIDES,
            failures.join("\n")
        );
    }
    Ok(())
}

/// Runs a linter, printing what it says: whether it exited 0, and its
/// errors and warnings. A linter that fails without a finding is an error.
fn linted(cmd: &mut Command, name: &str) -> Result<(bool, Vec<String>)> {
    println!("$ {}", crate::process::display(cmd));
    let o = cmd
        .output()
        .with_context(|| format!("run {name}: `cargo xtask deps` installs it"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    print!("{text}");
    let found = findings(&text);
    if !o.status.success() && found.is_empty() {
        bail!("{name} failed ({}) without a finding:\n{text}", o.status);
    }
    Ok((o.status.success(), found))
}

/// The error and warning lines of lintian's or rpmlint's output.
pub fn findings(output: &str) -> Vec<String> {
    output
        .lines()
        .filter(|l| {
            let l = l.trim_start();
            l.starts_with("E: ")
                || l.starts_with("W: ")
                || l.contains(": E: ")
                || l.contains(": W: ")
        })
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn findings_are_the_errors_and_warnings_of_either_tool() {
        let out = "E: prjquota: unstripped-binary-or-object [usr/bin/x]\n\
                   I: prjquota: some-info\n\
                   N: an explanation\n\
                   prjquota.x86_64: E: no-changelogname-tag\n\
                   prjquota.x86_64: W: dangerous-command-in-%post mv\n\
                   1 packages and 0 specfiles checked; 1 errors, 1 warnings\n";
        assert_eq!(
            findings(out),
            [
                "E: prjquota: unstripped-binary-or-object [usr/bin/x]",
                "prjquota.x86_64: E: no-changelogname-tag",
                "prjquota.x86_64: W: dangerous-command-in-%post mv",
            ]
        );
    }

    #[test]
    fn only_test_packages_tolerate_their_debug_exporters_findings() {
        let elf =
            "W: prjquota: undeclared-elf-prerequisites (libc.so.6) [usr/bin/prjquota-exporter]";
        let mismatched = "W: prjquota: mismatched-override shared-library-lacks-prerequisites \
                          [usr/bin/prjquota-exporter] [usr/share/lintian/overrides/prjquota:5]";
        let renderer = "W: prjquota: undeclared-elf-prerequisites (libc.so.6) \
                        [usr/bin/prjquota-dashboards]";
        for f in [elf, mismatched, renderer] {
            assert!(tolerated(Build::Test, f), "{f}");
            assert!(!tolerated(Build::Release, f), "{f}");
        }
        for f in [
            "W: prjquota: undeclared-elf-prerequisites (libc.so.6) [usr/lib/prjquota/prjquota]",
            "E: prjquota: unstripped-binary-or-object [usr/bin/prjquota-exporter]",
            "W: prjquota: mismatched-override embedded-library libyaml [usr/bin/prjquota-exporter] [x:1]",
            // The YAML library never in the plugin Nomad runs.
            "W: prjquota: embedded-library libyaml [usr/lib/prjquota/prjquota]",
        ] {
            assert!(!tolerated(Build::Test, f), "{f}");
        }
    }

    #[test]
    fn every_rpmlint_filter_has_its_reason() {
        let root = crate::paths::repo_root();
        let config = std::fs::read_to_string(root.join(RPMLINT_CONFIG)).unwrap();
        let mut reason = false;
        let mut filters = 0;
        for line in config.lines().map(str::trim) {
            if line.starts_with('#') && line.len() > 10 {
                reason = true;
            } else if line.starts_with('"') {
                assert!(reason, "{RPMLINT_CONFIG}: no reason above {line}");
                assert!(
                    !line.contains(".*\"") && line != "\".*\",",
                    "{line} filters everything"
                );
                filters += 1;
                reason = false;
            }
        }
        assert!(filters > 0);
    }

    #[test]
    fn every_lintian_override_has_its_reason() {
        let root = crate::paths::repo_root();
        let text = std::fs::read_to_string(root.join(LINTIAN_OVERRIDES)).unwrap();
        let mut reason = false;
        for line in text.lines() {
            if line.starts_with('#') {
                reason = true;
            } else if !line.trim().is_empty() {
                assert!(line.starts_with("prjquota: "), "{line}");
                assert!(reason, "no reason above {line}");
                assert!(line.split_whitespace().count() >= 2, "{line}");
                reason = false;
            }
        }
    }
}
