//! Packages fetched from Debian's archive by name, WITHOUT touching the
//! machine's apt sources: a private sources list and private lists and cache
//! directories under `target/apt/`, used through `apt-get -o …`. This is how
//! the kernels of other Debian releases and sid's Prometheus 3 reach a
//! bookworm machine: downloaded and unpacked with `dpkg-deb -x`, never
//! installed into dpkg's database.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Time limits (seconds) of the steps that talk to the network.
pub const UPDATE_SECS: u64 = 600;
pub const DOWNLOAD_SECS: u64 = 900;

/// `timeout` around `program`: every install step has a time limit, and a
/// hung mirror must not eat CI's budget.
pub fn limited(secs: u64, program: &str) -> Command {
    let mut cmd = Command::new("timeout");
    cmd.args(["--kill-after=10", &secs.to_string(), program]);
    cmd
}

/// The private apt state. `apt-get update` runs at most once per process,
/// and only when something has to be fetched.
pub struct PrivateApt {
    dir: PathBuf,
    updated: bool,
    /// The suites its sources list names.
    suites: Vec<&'static str>,
}

impl PrivateApt {
    /// Debian's archive for `suites`, in a state of its own under
    /// `target/apt`.
    pub fn new(suites: Vec<&'static str>) -> PrivateApt {
        PrivateApt {
            dir: crate::paths::target_dir().join("apt"),
            updated: false,
            suites,
        }
    }

    fn options(&self) -> Vec<String> {
        let d = self.dir.display();
        vec![
            "-o".into(),
            format!("Dir::Etc::sourcelist={d}/sources.list"),
            "-o".into(),
            "Dir::Etc::sourceparts=/dev/null".into(),
            "-o".into(),
            format!("Dir::State::Lists={d}/lists"),
            "-o".into(),
            format!("Dir::Cache={d}/cache"),
            "-q".into(),
        ]
    }

    /// `apt-get update` on the private sources; fatal when it fails (stale or
    /// missing lists would resolve the wrong version or none).
    fn update(&mut self) -> Result<()> {
        if self.updated {
            return Ok(());
        }
        std::fs::create_dir_all(self.dir.join("lists/partial"))?;
        std::fs::create_dir_all(self.dir.join("cache/archives/partial"))?;
        let suites = &self.suites;
        let sources: String = suites
            .iter()
            .map(|s| format!("deb http://deb.debian.org/debian {s} main\n"))
            .collect();
        std::fs::write(self.dir.join("sources.list"), sources)?;
        let mut cmd = limited(UPDATE_SECS, "apt-get");
        cmd.args(self.options()).arg("update");
        crate::process::quiet(&mut cmd).with_context(|| {
            format!(
                "apt-get update of the private sources ({}/sources.list: {}) failed: \
                 check that deb.debian.org is reachable",
                self.dir.display(),
                suites.join(", ")
            )
        })?;
        self.updated = true;
        Ok(())
    }

    /// The package names in the `Depends:` of `spec` (`name` or
    /// `name/suite`), alternatives included, versions dropped.
    pub fn depends(&mut self, spec: &str) -> Result<Vec<String>> {
        self.update()?;
        let out = Command::new("apt-cache")
            .args(self.options())
            .args(["show", spec])
            .output()
            .context("cannot run apt-cache")?;
        if !out.status.success() {
            bail!(
                "apt-cache show {spec}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(parse_depends(&String::from_utf8_lossy(&out.stdout)))
    }

    /// Downloads `specs` and unpacks every one into `dest`.
    pub fn fetch_into(&mut self, specs: &[String], dest: &Path) -> Result<()> {
        self.update()?;
        let debs = self.dir.join("debs");
        let _ = std::fs::remove_dir_all(&debs);
        std::fs::create_dir_all(&debs)?;
        let mut cmd = limited(DOWNLOAD_SECS, "apt-get");
        cmd.args(self.options())
            .arg("download")
            .args(specs)
            .current_dir(&debs);
        crate::process::quiet(&mut cmd)?;
        std::fs::create_dir_all(dest)?;
        for deb in std::fs::read_dir(&debs)?.flatten() {
            let mut x = Command::new("dpkg-deb");
            x.arg("-x").arg(deb.path()).arg(dest);
            crate::process::quiet(&mut x)?;
        }
        let _ = std::fs::remove_dir_all(&debs);
        Ok(())
    }
}

/// Package names of the first stanza's `Depends:` line.
fn parse_depends(show: &str) -> Vec<String> {
    let stanza = show.split("\n\n").next().unwrap_or("");
    stanza
        .lines()
        .find_map(|l| l.strip_prefix("Depends:"))
        .unwrap_or("")
        .split([',', '|'])
        .filter_map(|d| d.split_whitespace().next())
        .map(|n| n.split(':').next().unwrap_or(n).to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depends_names_only() {
        let show = "Package: linux-image-amd64\nVersion: 7.2.13-1\n\
                    Depends: linux-image-7.2.13+deb14-amd64 (= 7.2.13-1), kmod | busybox:any\n\
                    Description: x\n\nPackage: linux-image-amd64\nDepends: old\n";
        assert_eq!(
            parse_depends(show),
            ["linux-image-7.2.13+deb14-amd64", "kmod", "busybox"]
        );
        assert!(parse_depends("Package: x\n").is_empty());
    }
}
