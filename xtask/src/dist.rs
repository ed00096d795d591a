//! `cargo xtask dist`: what an operator installs, all in `target/dist/`:
//! - `prjquota-<version>-x86_64-linux.tar.gz`: statically linked `prjquota`
//!   and `prjquota-exporter`, `deploy/`, the dashboard, the rules, the
//!   runbooks, README and LICENSE;
//! - `prjquota_<version>-1_amd64.deb`, built by Debian's own `dpkg-deb`;
//! - `SHA256SUMS` over both.
//!
//! Static because Nomad clients run any distribution: the dynamic build needs
//! the build machine's glibc (GLIBC_2.34) and libgcc_s. The route is glibc
//! with `crt-static` (musl's target is not reachable from this machine's
//! mirrors; see README).
//!
//! Reproducible: the same commit gives the same SHA256SUMS. Timestamps come
//! from the commit (SOURCE_DATE_EPOCH), paths are remapped out of the
//! binaries, archive entries are sorted with fixed owners and modes, gzip
//! writes no timestamp.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::{cargo, header, run};

pub const TRIPLE: &str = "x86_64-unknown-linux-gnu";
pub const BINS: [&str; 2] = ["prjquota", "prjquota-exporter"];

/// What `build` made, all under `target/dist/` but the binaries.
pub struct Dist {
    /// `prjquota_<version>-1_amd64.deb`.
    pub deb: PathBuf,
    /// Where the static release binaries are (`target/<triple>/release`).
    pub bin_dir: PathBuf,
}

pub fn main(args: &[String]) -> Result<u8> {
    if let Some(a) = args.first() {
        bail!("dist takes no arguments (got `{a}`)");
    }
    build()?;
    Ok(0)
}

/// Builds the static binaries, the tarball, the .deb and SHA256SUMS (what
/// `cargo xtask dist` does; `cargo xtask test` calls it for the package
/// and static-plugin tests).
pub fn build() -> Result<Dist> {
    if std::env::consts::ARCH != "x86_64" {
        bail!("dist builds x86_64 packages; run it on an x86_64 machine");
    }
    let root = crate::repo_root();
    let target = crate::target_dir();
    let epoch = source_date_epoch(&root)?;
    let version = env!("CARGO_PKG_VERSION");
    let out = target.join("dist");
    std::fs::create_dir_all(&out)?;

    let bin_dir = build_static(&root, &epoch, &BINS)?;
    for bin in BINS {
        assert_static(&bin_dir.join(bin))?;
    }

    header("tarball");
    let name = format!("prjquota-{version}-x86_64-linux");
    let stage = fresh_dir(&out.join(&name))?;
    for bin in BINS {
        install_file(&bin_dir.join(bin), &stage.join("bin").join(bin), 0o755)?;
    }
    for item in [
        "deploy",
        "dashboards/prjquota.json",
        "dashboards/alerts.yaml",
        "dashboards/README.md",
        "docs/runbooks.md",
        "README.md",
        "LICENSE",
    ] {
        copy_tree(&root.join(item), &stage.join(item))?;
    }
    let tarball = format!("{name}.tar.gz");
    tar_gz(&out, &name, &out.join(&tarball), &epoch)?;

    header("deb");
    let deb = deb_name();
    build_deb(
        &root,
        &bin_dir.join("prjquota"),
        &bin_dir.join("prjquota-exporter"),
        &out.join(&deb),
        &epoch,
        "xz",
    )?;

    header("SHA256SUMS");
    let sums = Command::new("sha256sum")
        .current_dir(&out)
        .args([&tarball, &deb])
        .output()
        .context("run sha256sum (coreutils)")?;
    if !sums.status.success() {
        bail!(
            "sha256sum failed: {}",
            String::from_utf8_lossy(&sums.stderr)
        );
    }
    std::fs::write(out.join("SHA256SUMS"), &sums.stdout)?;
    print!("{}", String::from_utf8_lossy(&sums.stdout));
    println!("in {}", out.display());
    Ok(Dist {
        deb: out.join(&deb),
        bin_dir,
    })
}

/// `prjquota_<version>-1_amd64.deb`.
pub fn deb_name() -> String {
    format!("prjquota_{}-1_amd64.deb", env!("CARGO_PKG_VERSION"))
}

/// Builds the .deb at `deb` from these two binaries with dpkg-deb
/// (`compression`: dpkg-deb's -Z), staged next to it in `deb-root/`.
pub fn build_deb(
    root: &Path,
    plugin: &Path,
    exporter: &Path,
    deb: &Path,
    epoch: &str,
    compression: &str,
) -> Result<()> {
    let dir = deb.parent().context("the .deb's directory")?;
    let deb_root = fresh_dir(&dir.join("deb-root"))?;
    stage_deb(root, plugin, exporter, &deb_root, env!("CARGO_PKG_VERSION"))?;
    normalise(&deb_root, epoch)?;
    run(Command::new("dpkg-deb")
        .env("SOURCE_DATE_EPOCH", epoch)
        .args(["--root-owner-group", &format!("-Z{compression}"), "--build"])
        .arg(&deb_root)
        .arg(deb))
}

/// The commit's time: two builds of one commit stamp the same times.
pub fn source_date_epoch(root: &Path) -> Result<String> {
    if let Ok(e) = std::env::var("SOURCE_DATE_EPOCH") {
        return Ok(e);
    }
    let o = Command::new("git")
        .current_dir(root)
        .args(["log", "-1", "--format=%ct"])
        .output()
        .context("run git for the commit time (or set SOURCE_DATE_EPOCH)")?;
    let e = String::from_utf8_lossy(&o.stdout).trim().to_string();
    if !o.status.success() || e.is_empty() {
        bail!("no commit time from `git log -1`; set SOURCE_DATE_EPOCH to build outside a git checkout");
    }
    Ok(e)
}

/// Release build for an explicit target triple: RUSTFLAGS then reach only
/// the binaries, not build scripts or proc macros, and the output lands in
/// `target/<triple>/release`, apart from the dynamic `target/release`.
///
/// One cargo invocation per binary: built together, cargo unifies the
/// features of their shared dependencies, so the plugin would differ with
/// the set of packages built beside it (it did: 2,511,520 bytes with the
/// exporter, 2,514,600 alone). Alone, the plugin `cargo xtask test` builds
/// for its static-plugin tests is byte for byte the one dist ships.
pub fn build_static(root: &Path, epoch: &str, bins: &[&str]) -> Result<PathBuf> {
    let home = std::env::var("CARGO_HOME")
        .ok()
        .or_else(|| std::env::var("HOME").ok().map(|h| format!("{h}/.cargo")))
        .unwrap_or_default();
    let rustflags = format!(
        "-C target-feature=+crt-static --remap-path-prefix={}=/build/prjquota --remap-path-prefix={home}=/cargo",
        root.display()
    );
    header(&format!(
        "build: RUSTFLAGS='{rustflags}' cargo build --release --target {TRIPLE}"
    ));
    for b in bins {
        run(cargo()
            .env("RUSTFLAGS", &rustflags)
            .env("SOURCE_DATE_EPOCH", epoch)
            .args(["build", "--release", "--locked", "--target", TRIPLE])
            .args(["-p", b]))?;
    }
    Ok(crate::target_dir().join(TRIPLE).join("release"))
}

/// `ldd` is what an operator runs to check; it must find no libc to load.
pub fn assert_static(bin: &Path) -> Result<()> {
    let o = Command::new("ldd").arg(bin).output().context("run ldd")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    if text.contains("not a dynamic executable") || text.contains("statically linked") {
        println!("{}: {}", bin.display(), text.trim());
        return Ok(());
    }
    bail!(
        "{} is dynamically linked (ldd: {}); a C dependency is not linking statically",
        bin.display(),
        text.trim()
    )
}

/// The package: the exporter on PATH with its unit (shipped, not enabled:
/// the operator sets the volumes directory first), the plugin as a regular
/// file to copy into Nomad's plugin directory (Nomad 2.0.1+ refuses
/// symlinked plugins), the dashboard and the rules.
fn stage_deb(root: &Path, plugin: &Path, exporter: &Path, d: &Path, version: &str) -> Result<()> {
    install_file(exporter, &d.join("usr/bin/prjquota-exporter"), 0o755)?;
    install_file(plugin, &d.join("usr/lib/prjquota/prjquota"), 0o755)?;
    let unit = std::fs::read_to_string(root.join("deploy/systemd/prjquota-exporter.service"))?;
    let unit = unit.replace(
        "/usr/local/bin/prjquota-exporter",
        "/usr/bin/prjquota-exporter",
    );
    write(
        &d.join("usr/lib/systemd/system/prjquota-exporter.service"),
        &unit,
    )?;
    for (from, to) in [
        (
            "dashboards/prjquota.json",
            "usr/share/prjquota/dashboards/prjquota.json",
        ),
        (
            "dashboards/alerts.yaml",
            "usr/share/prjquota/rules/prjquota-alerts.yaml",
        ),
        ("deploy/prjquota.toml", "usr/share/prjquota/prjquota.toml"),
        ("docs/runbooks.md", "usr/share/doc/prjquota/runbooks.md"),
        ("README.md", "usr/share/doc/prjquota/README.md"),
        ("LICENSE", "usr/share/doc/prjquota/copyright"),
    ] {
        install_file(&root.join(from), &d.join(to), 0o644)?;
    }
    let size_kib = du_kib(d)?;
    write(
        &d.join("DEBIAN/control"),
        &format!(
            "Package: prjquota\n\
             Version: {version}-1\n\
             Architecture: amd64\n\
             Maintainer: prjquota developers <prjquota@users.noreply.github.com>\n\
             Installed-Size: {size_kib}\n\
             Section: admin\n\
             Priority: optional\n\
             Homepage: https://github.com/prjquota/prjquota\n\
             Description: Nomad host volumes sized by filesystem project quotas\n \
             prjquota is a Nomad dynamic host volume plugin: each volume is a directory\n \
             on XFS or ext4 whose size a kernel project quota enforces. This package\n \
             installs prjquota-exporter (Prometheus metrics; systemd unit shipped but\n \
             not enabled), the plugin at /usr/lib/prjquota/prjquota to copy into\n \
             Nomad's host_volume_plugin_dir, the Grafana dashboard and the alert rules\n \
             under /usr/share/prjquota.\n"
        ),
    )?;
    Ok(())
}

fn du_kib(d: &Path) -> Result<u64> {
    let mut total = 0;
    for e in std::fs::read_dir(d)? {
        let e = e?;
        let m = e.metadata()?;
        total += if m.is_dir() {
            du_kib(&e.path())?
        } else {
            m.len().div_ceil(1024)
        };
    }
    Ok(total)
}

/// Fixed modes and mtimes, whatever the checkout's umask and times.
fn normalise(d: &Path, epoch: &str) -> Result<()> {
    run(Command::new("chmod")
        .args(["-R", "u+rwX,go+rX,go-w"])
        .arg(d))?;
    run(Command::new("find").arg(d).args([
        "-exec",
        "touch",
        "-h",
        "-d",
        &format!("@{epoch}"),
        "{}",
        "+",
    ]))
}

fn tar_gz(dir: &Path, name: &str, out: &Path, epoch: &str) -> Result<()> {
    normalise(&dir.join(name), epoch)?;
    let tar = format!(
        "tar --sort=name --format=gnu --owner=0 --group=0 --numeric-owner \
         --mtime=@{epoch} -C '{}' -cf - '{name}' | gzip -n -9 > '{}'",
        dir.display(),
        out.display()
    );
    run(Command::new("bash").args(["-o", "pipefail", "-c", &tar]))
}

fn fresh_dir(p: &Path) -> Result<PathBuf> {
    if p.exists() {
        std::fs::remove_dir_all(p)
            .with_context(|| format!("clear the previous {}", p.display()))?;
    }
    std::fs::create_dir_all(p)?;
    Ok(p.to_path_buf())
}

fn write(to: &Path, text: &str) -> Result<()> {
    if let Some(p) = to.parent() {
        std::fs::create_dir_all(p)?;
    }
    std::fs::write(to, text).with_context(|| format!("write {}", to.display()))
}

fn install_file(from: &Path, to: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(p) = to.parent() {
        std::fs::create_dir_all(p)?;
    }
    std::fs::copy(from, to).with_context(|| format!("copy {}", from.display()))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    if from.is_dir() {
        std::fs::create_dir_all(to)?;
        for e in std::fs::read_dir(from)? {
            let e = e?;
            copy_tree(&e.path(), &to.join(e.file_name()))?;
        }
    } else {
        install_file(from, to, 0o644)?;
    }
    Ok(())
}
