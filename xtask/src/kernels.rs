//! The kernel matrix: one row per kernel ([`KERNELS`]), which everything
//! else reads. `--kernel` takes a row's name; `cargo xtask deps` fetches
//! each row's image ([`Fetch`]); `cargo xtask test` boots each row's pass
//! ([`VmPass`]) and its systemd role ([`Systemd`]) in boot order; the docs'
//! matrix (docs/kernels.md) is rendered from the rows (`crate::docs`).
//! Adding a kernel is adding a row (CONTRIBUTING.md, "Add a kernel").
//!
//! A row that is [`Fetch::Installed`] is the build machine's own
//! `linux-image-amd64` in /boot. The others are fetched by [`fetch`] from
//! Debian's archive through [`crate::debian::PrivateApt`]: the version is
//! whatever `linux-image-amd64/<suite>` depends on today, the image lands
//! in `target/kernels/<name>/vmlinuz` and the modules in
//! `/lib/modules/<version>` (where vng and the guest's modprobe look),
//! with `depmod -a <version>`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::debian::PrivateApt;
use crate::selection;

/// One kernel of the matrix.
#[derive(Debug, PartialEq, Eq)]
pub struct Row {
    /// What `--kernel` takes, and the directory under `target/kernels/`.
    pub name: &'static str,
    /// The Debian suite whose `linux-image-amd64` it is.
    pub suite: &'static str,
    /// How `uname -r` of this line begins (`6.1.`).
    pub release_prefix: &'static str,
    pub fetch: Fetch,
    /// What its VM pass runs without `--filter`.
    pub pass: VmPass,
    pub systemd: Systemd,
    /// When its pass boots among the passes of one kind (a full suite
    /// always first, then the systemd passes): lower first. The longest
    /// boot goes first, so that what is left for a lane another frees is
    /// short.
    pub boot_order: u8,
}

/// How `cargo xtask deps` gets a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fetch {
    /// The build machine's own `linux-image-amd64`, which apt installs
    /// into /boot (the machine's release).
    Installed,
    /// `linux-image-amd64/<suite>` from Debian's archive, by name.
    Archive,
}

/// What a kernel's VM pass runs without `--filter`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmPass {
    /// The full suite (`selection::FULL`).
    Full,
    /// The compatibility pass: this selection of the suite, or the full
    /// suite with `--full`.
    Compat(&'static str),
    /// Only this selection, even with `--full`: a kernel the full suite
    /// cannot run on (5.10 has no BPF LSM to enforce with).
    Only(&'static str),
}

/// What a kernel does in the systemd passes (`crate::systemd::passes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Systemd {
    /// The .deb's whole story, then the node's reboots into it and into
    /// every [`Systemd::RebootInto`] kernel of the run.
    DebStory,
    /// A kernel a node set up by the .deb's story reboots into; alone in
    /// a run, it sets up its own node.
    RebootInto,
    /// The .rpm's story on a kernel without the BPF LSM.
    RpmStory,
    /// No systemd pass.
    None,
}

/// The matrix, in the order `--kernel all` lists it. The first row is the
/// default kernel.
pub const KERNELS: [Row; 4] = [
    Row {
        name: "6.1",
        suite: "bookworm",
        release_prefix: "6.1.",
        fetch: Fetch::Installed,
        pass: VmPass::Full,
        systemd: Systemd::DebStory,
        boot_order: 0,
    },
    Row {
        name: "5.10",
        suite: "bullseye",
        release_prefix: "5.10.",
        fetch: Fetch::Archive,
        pass: VmPass::Only(selection::OLD_KERNEL),
        systemd: Systemd::RpmStory,
        // Without the BPF LSM its pass leaves out the guard's tests.
        boot_order: 2,
    },
    Row {
        name: "6.12",
        suite: "trixie",
        release_prefix: "6.12.",
        fetch: Fetch::Archive,
        pass: VmPass::Compat(selection::COMPAT_6_12),
        systemd: Systemd::RebootInto,
        boot_order: 1,
    },
    Row {
        name: "7",
        suite: "sid",
        release_prefix: "7.",
        fetch: Fetch::Archive,
        pass: VmPass::Compat(selection::COMPAT_7),
        systemd: Systemd::RebootInto,
        boot_order: 1,
    },
];

/// A kernel of the matrix: a row of [`KERNELS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernel(&'static Row);

impl Kernel {
    pub const DEFAULT: Kernel = Kernel(&KERNELS[0]);

    /// Every kernel of the matrix, in its order.
    pub fn all() -> Vec<Kernel> {
        KERNELS.iter().map(Kernel).collect()
    }

    /// The kernel `--kernel` names.
    pub fn parse(s: &str) -> Result<Kernel> {
        match KERNELS.iter().find(|r| r.name == s) {
            Some(r) => Ok(Kernel(r)),
            None => bail!("--kernel must be {} or all (got `{s}`)", names_or()),
        }
    }

    pub fn name(self) -> &'static str {
        self.0.name
    }

    /// The Debian suite whose `linux-image-amd64` is this kernel.
    pub fn suite(self) -> &'static str {
        self.0.suite
    }

    pub fn row(self) -> &'static Row {
        self.0
    }

    /// Whether a release string (`uname -r`) belongs to this kernel line.
    fn matches(self, release: &str) -> bool {
        release.starts_with(self.0.release_prefix)
    }

    fn dir(self) -> PathBuf {
        crate::paths::target_dir().join("kernels").join(self.name())
    }
}

/// The suites `cargo xtask deps` fetches kernels from (the rows that
/// come from the archive), for the private apt sources (`crate::debian`).
pub fn archive_suites() -> Vec<&'static str> {
    KERNELS
        .iter()
        .filter(|r| r.fetch == Fetch::Archive)
        .map(|r| r.suite)
        .collect()
}

/// The kernels' names as a usage text lists them (`5.10, 6.1, 6.12 or 7`),
/// sorted by version.
pub fn names_or() -> String {
    let mut names: Vec<&str> = KERNELS.iter().map(|r| r.name).collect();
    names.sort_by(|a, b| version_cmp(a, b));
    match names.split_last() {
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// docs/kernels.md's matrix, one line per row (`crate::docs` splices it
/// in).
pub fn docs_table() -> String {
    let mut out = String::from(
        "| `--kernel` | Debian | `cargo xtask deps` fetches | its VM pass (`cargo xtask \
         test`) | its systemd pass |\n| --- | --- | --- | --- | --- |\n",
    );
    for r in &KERNELS {
        let fetch = match r.fetch {
            Fetch::Installed => "the machine's own `linux-image-amd64`, in /boot".to_string(),
            Fetch::Archive => format!("`linux-image-amd64/{}` from Debian's archive", r.suite),
        };
        let pass = match r.pass {
            VmPass::Full => "the full suite".to_string(),
            VmPass::Compat(f) => format!(
                "the compatibility pass, `{}` (`--full`: the full suite)",
                selection::name_of(f)
            ),
            VmPass::Only(f) => format!("`{}`, even with `--full`", selection::name_of(f)),
        };
        let systemd = match r.systemd {
            Systemd::DebStory => {
                "the .deb's story, then the node rebooted into this kernel and into each kernel \
                 of the run a node reboots into"
            }
            Systemd::RebootInto => "the node the .deb's story set up, rebooted into this kernel",
            Systemd::RpmStory => "the .rpm's story, without the BPF LSM",
            Systemd::None => "none",
        };
        let default = if r == Kernel::DEFAULT.row() {
            " (the default)"
        } else {
            ""
        };
        out += &format!(
            "| `{}`{default} | {} | {fetch} | {pass} | {systemd} |\n",
            r.name, r.suite
        );
    }
    out
}

/// The image of `k` to boot, when present with its modules.
pub fn image(k: Kernel) -> Result<PathBuf> {
    if k.row().fetch == Fetch::Installed {
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

/// Fetches kernel `k` (not an [`Fetch::Installed`] one, which apt
/// installs) unless it is present.
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
            "{meta} now depends on {image_pkg}, which is not a {} kernel: update its row in \
             xtask/src/kernels.rs (KERNELS)",
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

    fn k(name: &str) -> Kernel {
        Kernel::parse(name).unwrap()
    }

    #[test]
    fn names_round_trip_and_lines_match() {
        for k in Kernel::all() {
            assert_eq!(Kernel::parse(k.name()).unwrap(), k);
        }
        let e = Kernel::parse("4.19").unwrap_err().to_string();
        assert!(e.contains(&format!("{} or all", names_or())), "{e}");
        for r in &KERNELS {
            assert!(names_or().contains(r.name), "{}", r.name);
        }
        assert!(k("6.1").matches("6.1.0-56-amd64"));
        assert!(!k("6.1").matches("6.12.57+deb13-amd64"));
        assert!(k("7").matches("7.2.13+deb14-amd64"));
        assert!(k("5.10").matches("5.10.0-35-amd64"));
        assert_eq!(Kernel::DEFAULT, k("6.1"));
    }

    /// Each row stands on its own: a name, a suite and a release line of
    /// its own, one kernel the machine installs, the default running the
    /// full suite. The installed kernel is found in /boot by its line, so
    /// no other row's line may hold it; lines of archive rows may nest (a
    /// backported 7.3 beside sid's 7.x), as each is fetched by its suite.
    #[test]
    fn the_rows_are_distinct_and_complete() {
        for (i, a) in KERNELS.iter().enumerate() {
            assert!(a.release_prefix.ends_with('.'), "{}", a.name);
            assert!(a.release_prefix.starts_with(a.name), "{}", a.name);
            for b in &KERNELS[i + 1..] {
                assert_ne!(a.name, b.name);
                assert_ne!(a.suite, b.suite);
                assert_ne!(a.release_prefix, b.release_prefix);
            }
        }
        let installed: Vec<&Row> = KERNELS
            .iter()
            .filter(|r| r.fetch == Fetch::Installed)
            .collect();
        assert_eq!(installed.len(), 1);
        let line = installed[0].release_prefix;
        for r in KERNELS.iter().filter(|r| r.fetch != Fetch::Installed) {
            let other = r.release_prefix;
            assert!(
                !line.starts_with(other) && !other.starts_with(line),
                "{} shares the installed kernel's line",
                r.name
            );
        }
        assert_eq!(Kernel::DEFAULT.row().pass, VmPass::Full);
    }

    /// The private sources name the suites of the kernels fetched from
    /// the archive (a new row's too), never the machine's own.
    #[test]
    fn the_archive_suites_follow_the_rows() {
        let suites = archive_suites();
        for r in &KERNELS {
            assert_eq!(
                suites.contains(&r.suite),
                r.fetch == Fetch::Archive,
                "{}",
                r.suite
            );
        }
    }
}
