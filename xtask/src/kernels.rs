//! The kernel matrix: Debian's generic kernels of four releases, which the
//! VM boots with `--kernel`. 6.1 is bookworm's, installed by the
//! `linux-image-amd64` package into /boot. The others are fetched by
//! [`fetch`] from Debian's archive through [`crate::debian::PrivateApt`]:
//! the version is whatever `linux-image-amd64/<suite>` depends on today, the
//! image lands in `target/kernels/<name>/vmlinuz` and the modules in
//! `/lib/modules/<version>` (where vng and the guest's modprobe look), with
//! `depmod -a <version>`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::debian::PrivateApt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    V5_10,
    V6_1,
    V6_12,
    V7,
}

impl Kernel {
    pub const ALL: [Kernel; 4] = [Kernel::V6_1, Kernel::V5_10, Kernel::V6_12, Kernel::V7];
    pub const DEFAULT: Kernel = Kernel::V6_1;

    pub fn parse(s: &str) -> Result<Kernel> {
        Ok(match s {
            "5.10" => Kernel::V5_10,
            "6.1" => Kernel::V6_1,
            "6.12" => Kernel::V6_12,
            "7" => Kernel::V7,
            _ => bail!("--kernel must be 5.10, 6.1, 6.12, 7 or all (got `{s}`)"),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Kernel::V5_10 => "5.10",
            Kernel::V6_1 => "6.1",
            Kernel::V6_12 => "6.12",
            Kernel::V7 => "7",
        }
    }

    /// The Debian suite whose `linux-image-amd64` is this kernel.
    pub fn suite(self) -> &'static str {
        match self {
            Kernel::V5_10 => "bullseye",
            Kernel::V6_1 => "bookworm",
            Kernel::V6_12 => "trixie",
            Kernel::V7 => "sid",
        }
    }

    /// Whether a release string (`uname -r`) belongs to this kernel line.
    fn matches(self, release: &str) -> bool {
        let prefix = match self {
            Kernel::V5_10 => "5.10.",
            Kernel::V6_1 => "6.1.",
            Kernel::V6_12 => "6.12.",
            Kernel::V7 => "7.",
        };
        release.starts_with(prefix)
    }

    fn dir(self) -> PathBuf {
        crate::paths::target_dir().join("kernels").join(self.name())
    }
}

/// The image of `k` to boot, when present with its modules.
pub fn image(k: Kernel) -> Result<PathBuf> {
    if k == Kernel::V6_1 {
        return boot_image(k);
    }
    let dir = k.dir();
    let release = std::fs::read_to_string(dir.join("release")).unwrap_or_default();
    let release = release.trim();
    let vmlinuz = dir.join("vmlinuz");
    if release.is_empty() || !vmlinuz.is_file() || !modules_ready(release) {
        bail!(
            "kernel {} (Debian {}) is not fetched: run `cargo xtask deps` (want {} and \
             /lib/modules/<release>/modules.dep)",
            k.name(),
            k.suite(),
            vmlinuz.display()
        );
    }
    Ok(vmlinuz)
}

fn modules_ready(release: &str) -> bool {
    Path::new("/lib/modules")
        .join(release)
        .join("modules.dep")
        .is_file()
}

/// The newest `/boot/vmlinuz-<release>` of `k`'s line (generic `-amd64`, not
/// `-cloud-`, which does not boot under vng) whose modules are installed.
fn boot_image(k: Kernel) -> Result<PathBuf> {
    let mut best: Option<(String, PathBuf)> = None;
    for entry in std::fs::read_dir("/boot").into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(release) = name.strip_prefix("vmlinuz-") else {
            continue;
        };
        if !release.ends_with("-amd64") || release.contains("-cloud-") || !k.matches(release) {
            continue;
        }
        if !Path::new("/lib/modules").join(release).is_dir() {
            continue;
        }
        if best
            .as_ref()
            .is_none_or(|(b, _)| version_cmp(release, b).is_gt())
        {
            best = Some((release.to_string(), entry.path()));
        }
    }
    match best {
        Some((_, path)) => Ok(path),
        None => bail!(
            "no Debian {} kernel to boot: want /boot/vmlinuz-{}*-amd64 (not -cloud-) with \
             /lib/modules/<release>: run `cargo xtask deps` (installs linux-image-amd64)",
            k.name(),
            k.name()
        ),
    }
}

/// Fetches kernel `k` (not 6.1, which apt installs) unless it is present.
/// Returns what it did, for the deps report.
pub fn fetch(k: Kernel, apt: &mut PrivateApt) -> Result<String> {
    if let Ok(img) = image(k) {
        return Ok(format!(
            "present     kernel {} ({})",
            k.name(),
            img.display()
        ));
    }
    let meta = format!("linux-image-amd64/{}", k.suite());
    let image_pkg = apt
        .depends(&meta)?
        .into_iter()
        .find(|d| d.starts_with("linux-image-"))
        .with_context(|| format!("{meta} depends on no linux-image-* package"))?;
    let release = image_pkg["linux-image-".len()..].to_string();
    if !k.matches(&release) {
        bail!(
            "{meta} now depends on {image_pkg}, which is not a {} kernel: update the matrix in \
             xtask/src/kernels.rs",
            k.name()
        );
    }
    // sid splits a kernel into linux-binary-, linux-modules- and linux-base-
    // packages of the same release; older suites ship one package.
    let mut pkgs = vec![image_pkg.clone()];
    pkgs.extend(
        apt.depends(&format!("{image_pkg}/{}", k.suite()))?
            .into_iter()
            .filter(|d| d.ends_with(&format!("-{release}")) && *d != image_pkg),
    );
    let specs: Vec<String> = pkgs.iter().map(|p| format!("{p}/{}", k.suite())).collect();
    let dir = k.dir();
    let root = dir.join("root");
    let _ = std::fs::remove_dir_all(&dir);
    apt.fetch_into(&specs, &root)?;

    let modules = ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|m| root.join(m).join(&release))
        .find(|p| p.is_dir())
        .with_context(|| format!("{} holds no modules/{release}", pkgs.join(" ")))?;
    let vmlinuz = [
        root.join("boot").join(format!("vmlinuz-{release}")),
        modules.join("vmlinuz"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .with_context(|| format!("{} holds no vmlinuz for {release}", pkgs.join(" ")))?;
    std::fs::rename(&vmlinuz, dir.join("vmlinuz"))?;
    let dest = Path::new("/lib/modules").join(&release);
    // Modules of this exact release already in place came from the same
    // package: keep them (a VM running right now may be reading them).
    if !modules_ready(&release) {
        let _ = std::fs::remove_dir_all(&dest);
        crate::process::quiet(
            std::process::Command::new("cp")
                .arg("-a")
                .arg(&modules)
                .arg(&dest),
        )?;
        crate::process::quiet(std::process::Command::new("depmod").args(["-a", &release]))?;
    }
    std::fs::remove_dir_all(&root)?;
    // Written last: its presence means the rest is complete.
    std::fs::write(dir.join("release"), format!("{release}\n"))?;
    Ok(format!(
        "installed   kernel {} ({release}: {} and {})",
        k.name(),
        dir.join("vmlinuz").display(),
        dest.display()
    ))
}

/// The kernel image to boot for `k`: $PRJQUOTA_VM_KERNEL when set, else
/// the matrix's (see [`crate::kernels`]).
pub fn to_boot(k: Kernel) -> Result<PathBuf> {
    if let Some(img) = std::env::var_os("PRJQUOTA_VM_KERNEL").filter(|k| !k.is_empty()) {
        let img = PathBuf::from(img);
        if !img.is_file() {
            bail!("PRJQUOTA_VM_KERNEL={}: no such kernel image", img.display());
        }
        return Ok(img);
    }
    image(k)
}

/// `sort -V`-like comparison: digit runs compare as numbers.
pub fn version_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn chunks(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    let (ca, cb) = (chunks(a), chunks(b));
    for (x, y) in ca.iter().zip(&cb) {
        let ord = match (x, y) {
            ((true, x), (true, y)) => x
                .trim_start_matches('0')
                .len()
                .cmp(&y.trim_start_matches('0').len())
                .then_with(|| x.trim_start_matches('0').cmp(y.trim_start_matches('0'))),
            ((_, x), (_, y)) => x.cmp(y),
        };
        if ord.is_ne() {
            return ord;
        }
    }
    ca.len().cmp(&cb.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        use std::cmp::Ordering::*;
        assert_eq!(version_cmp("6.1.0-56-amd64", "6.1.0-9-amd64"), Greater);
        assert_eq!(version_cmp("6.10.0-1-amd64", "6.9.0-1-amd64"), Greater);
        assert_eq!(version_cmp("6.1.0-56-amd64", "6.1.0-56-amd64"), Equal);
        assert_eq!(version_cmp("5.10.0-30-amd64", "6.1.0-1-amd64"), Less);
    }

    #[test]
    fn names_round_trip_and_lines_match() {
        for k in Kernel::ALL {
            assert_eq!(Kernel::parse(k.name()).unwrap(), k);
        }
        assert!(Kernel::parse("4.19").is_err());
        assert!(Kernel::V6_1.matches("6.1.0-56-amd64"));
        assert!(!Kernel::V6_1.matches("6.12.57+deb13-amd64"));
        assert!(Kernel::V7.matches("7.2.13+deb14-amd64"));
        assert!(Kernel::V5_10.matches("5.10.0-35-amd64"));
    }
}
