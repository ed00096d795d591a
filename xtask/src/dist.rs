//! `cargo xtask dist`: what an operator installs, all in `target/dist/`:
//! - `prjquota-<version>-x86_64-linux.tar.gz`: statically linked `prjquota`,
//!   `prjquota-exporter` and `prjquota-dashboards`, their man pages and completions under
//!   `share/` (as under `/usr/local`), `deploy/`, the dashboard, the rules,
//!   the runbooks, README, LICENSE and THIRD-PARTY-LICENSES;
//! - `prjquota_<version>-1_amd64.deb`, built by Debian's own `dpkg-deb`;
//! - `prjquota-<version>-1.x86_64.rpm`, built by `rpmbuild` (Debian's `rpm`)
//!   from the same files and the same scripts (deploy/package), in the RPM
//!   family's paths (`Family`);
//! - `prjquota-<version>-x86_64-linux-debug.tar.gz`: the binaries' symbols,
//!   which the packages and the tarball ship stripped, by build ID;
//! - `SHA256SUMS` over the four, and `SHA256SUMS.asc`, its signature;
//! - `apt/` and `yum/`: the package repositories, signed
//!   (`repo.rs`: the release's key from PRJQUOTA_SIGNING_KEY, else a
//!   throwaway one), and `prjquota-release-key.asc`, the public key;
//!
//! then checks the .deb with lintian and the .rpm with rpmlint (`lint.rs`).
//!
//! Why Debian's tools and not cargo-deb/cargo-generate-rpm: each is a
//! `cargo install` of its own in `cargo xtask deps`; cargo-deb alone took
//! 413 s cold on a loaded 2-core machine (CI's cold budget is 45 minutes,
//! most of it the suite), where `apt-get install rpm help2man` takes
//! seconds. And neither
//! writes what this package needs: the maintainer scripts (the plugin into
//! Nomad's directory, the restart on upgrade), the generator and the
//! conffile are ours whatever builds the archive. dpkg-deb and rpmbuild are
//! the reference implementations of their formats, and this file stays
//! byte-reproducible with them.
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

use crate::paths::cargo;
use crate::process::{header, run};

pub const TRIPLE: &str = "x86_64-unknown-linux-gnu";
pub const BINS: [&str; 3] = ["prjquota", "prjquota-exporter", "prjquota-dashboards"];

/// The executables a package is made of, wherever they were built.
pub struct Bins {
    /// `prjquota`, the plugin Nomad runs and the operator commands.
    pub plugin: PathBuf,
    pub exporter: PathBuf,
    /// `prjquota-dashboards`, which renders an operator's rules and
    /// dashboard (apart from the plugin: Nomad runs that on every volume
    /// operation, and the renderer's YAML library has no business there).
    pub dashboards: PathBuf,
}

impl Bins {
    /// The executables of [`BINS`] in `dir`, by their names.
    pub fn in_dir(dir: &Path) -> Bins {
        Bins {
            plugin: dir.join("prjquota"),
            exporter: dir.join("prjquota-exporter"),
            dashboards: dir.join("prjquota-dashboards"),
        }
    }
}

/// What `build` made, all under `target/dist/` but the binaries.
pub struct Dist {
    /// `prjquota_<version>-1_amd64.deb`.
    pub deb: PathBuf,
    /// `prjquota-<version>-1.x86_64.rpm`.
    pub rpm: PathBuf,
    /// Where the static release binaries are (`target/<triple>/release`).
    pub bin_dir: PathBuf,
}

pub fn main(args: crate::cli::DistArgs) -> Result<u8> {
    match args.binaries.as_deref() {
        None => {
            build()?;
        }
        Some([dir, out]) => {
            // A test package of other binaries (the debug build, say), for
            // working on the packaging without a release build.
            let root = crate::paths::repo_root();
            let epoch = source_date_epoch(&root)?;
            std::fs::create_dir_all(out)?;
            let bins = Bins::in_dir(dir);
            build_deb(&root, &bins, &out.join(deb_name()), &epoch, "none")?;
            build_rpm(&root, &bins, &out.join(rpm_name()), &epoch)?;
            println!("in {}", out.display());
        }
        Some(other) => bail!("--binaries takes DIR and OUT (got {other:?})"),
    }
    Ok(0)
}

/// Builds the static binaries, the tarball, the .deb and SHA256SUMS (what
/// `cargo xtask dist` does; `cargo xtask test` calls it for the package
/// and static-plugin tests).
pub fn build() -> Result<Dist> {
    if std::env::consts::ARCH != "x86_64" {
        bail!("dist builds x86_64 packages; run it on an x86_64 machine");
    }
    let root = crate::paths::repo_root();
    let target = crate::paths::target_dir();
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
        strip(&stage.join("bin").join(bin))?;
    }
    for item in [
        "deploy",
        "dashboards/prjquota.json",
        "dashboards/alerts.yaml",
        "dashboards/config.toml",
        "dashboards/README.md",
        "LICENSE",
    ] {
        copy_tree(&root.join(item), &stage.join(item))?;
    }
    for page in shipped_docs(&root)? {
        copy_tree(&root.join(&page), &stage.join(&page))?;
    }
    write(
        &stage.join(SBOM),
        &crate::sbom::for_workspace(&root, TRIPLE, &BINS, &epoch)?,
    )?;
    write(
        &stage.join(crate::notice::FILE),
        &crate::notice::render_for_workspace(&root, TRIPLE, &BINS)?,
    )?;
    let bins = Bins::in_dir(&bin_dir);
    stage_share(&bins, &stage, &epoch)?;
    let tarball = format!("{name}.tar.gz");
    tar_gz(&out, &name, &out.join(&tarball), &epoch)?;
    check_tarball(&out.join(&tarball), &name)?;

    header("deb");
    let deb = deb_name();
    build_deb(&root, &bins, &out.join(&deb), &epoch, "xz")?;

    header("rpm");
    let rpm = rpm_name();
    build_rpm(&root, &bins, &out.join(&rpm), &epoch)?;

    header("debug symbols");
    let debug = debug_archive(&bin_dir, &out, &epoch)?;

    header("SHA256SUMS");
    let sums = Command::new("sha256sum")
        .current_dir(&out)
        .args([&tarball, &deb, &rpm, &debug])
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

    header("repositories: apt and yum, signed");
    // The key's home is outside target/dist, which is what gets published.
    let key = crate::repo::SigningKey::for_build(&target.join("dist-gnupg"))?;
    println!("{}", crate::repo::describe(&key));
    let base = crate::repo::BASE_URL;
    crate::repo::apt(
        &out.join("apt"),
        &[&out.join(&deb)],
        &key,
        &format!("{base}/apt"),
    )?;
    crate::repo::verify_apt(&out.join("apt"))?;
    crate::repo::yum(
        &out.join("yum"),
        &[&out.join(&rpm)],
        &key,
        &format!("{base}/yum"),
    )?;
    key.detach_sign(&out.join("SHA256SUMS"), &out.join("SHA256SUMS.asc"), true)?;
    key.export(&out.join("prjquota-release-key.asc"), true)?;
    println!(
        "apt: {}, yum: {}; SHA256SUMS.asc and the public key prjquota-release-key.asc",
        out.join("apt").display(),
        out.join("yum").display()
    );

    header("lint: lintian and rpmlint");
    crate::lint::run(
        &root,
        &out.join(&deb),
        &out.join(&rpm),
        crate::lint::Build::Release,
    )?;
    println!("in {}", out.display());
    Ok(Dist {
        deb: out.join(&deb),
        rpm: out.join(&rpm),
        bin_dir,
    })
}

/// `prjquota-<version>-x86_64-linux-debug.tar.gz`: what stripping took
/// out of the shipped binaries (their symbol tables; the release profile
/// keeps no DWARF), as `objcopy --only-keep-debug` files under
/// `usr/lib/debug/.build-id/`, where gdb, perf and eu-stack look them up
/// by the build ID the stripped binaries keep. Unpacked into /, a
/// backtrace of a shipped binary has its function names. Returns its name.
fn debug_archive(bin_dir: &Path, out: &Path, epoch: &str) -> Result<String> {
    let name = format!("prjquota-{}-x86_64-linux-debug", env!("CARGO_PKG_VERSION"));
    let stage = fresh_dir(&out.join(&name))?;
    for bin in BINS {
        let path = bin_dir.join(bin);
        let o = Command::new("readelf")
            .args(["-n"])
            .arg(&path)
            .output()
            .context("run readelf (binutils)")?;
        let notes = String::from_utf8_lossy(&o.stdout);
        let id = build_id(&notes).with_context(|| {
            format!(
                "{} has no build ID (readelf -n): the linker must be run with --build-id",
                path.display()
            )
        })?;
        let debug = stage.join(debug_path(&id));
        std::fs::create_dir_all(debug.parent().unwrap())?;
        run(Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(&path)
            .arg(&debug))?;
        println!(
            "{bin}: build ID {id}, symbols in {name}.tar.gz:/{}",
            debug_path(&id)
        );
    }
    // Its paths start at usr/: `tar -xzf ... -C /` puts them in place.
    let tarball = format!("{name}.tar.gz");
    tar_gz(&stage, "usr", &out.join(&tarball), epoch)?;
    Ok(tarball)
}

/// The build ID in `readelf -n`'s output.
pub fn build_id(readelf_notes: &str) -> Option<String> {
    readelf_notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .map(|id| id.trim().to_ascii_lowercase())
        .filter(|id| id.len() > 2 && id.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Where debuggers look up the symbols of the binary with this build ID.
pub fn debug_path(build_id: &str) -> String {
    format!(
        "usr/lib/debug/.build-id/{}/{}.debug",
        &build_id[..2],
        &build_id[2..]
    )
}

/// `prjquota_<version>-1_amd64.deb`.
pub fn deb_name() -> String {
    deb_name_of(REVISION)
}

/// `prjquota_<version>-<revision>_amd64.deb`.
pub fn deb_name_of(revision: &str) -> String {
    format!(
        "prjquota_{}-{revision}_amd64.deb",
        env!("CARGO_PKG_VERSION")
    )
}

/// Builds the .deb at `deb` from these binaries with dpkg-deb
/// (`compression`: dpkg-deb's -Z), staged next to it in `deb-root/`.
pub fn build_deb(
    root: &Path,
    bins: &Bins,
    deb: &Path,
    epoch: &str,
    compression: &str,
) -> Result<()> {
    build_deb_release(root, bins, deb, epoch, compression, REVISION, b"")
}

/// [`build_deb`] with another Debian revision than the package's own, and
/// `trailer` appended to every binary once staged: the newer package an
/// upgrade test installs over it, its files told from the old by the
/// trailer (as [`build_rpm_release`]).
pub fn build_deb_release(
    root: &Path,
    bins: &Bins,
    deb: &Path,
    epoch: &str,
    compression: &str,
    revision: &str,
    trailer: &[u8],
) -> Result<()> {
    let dir = deb.parent().context("the .deb's directory")?;
    let deb_root = fresh_dir(&dir.join("deb-root"))?;
    stage_deb(root, bins, &deb_root, epoch, revision, trailer)?;
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

/// The `shipped` profile's build (Cargo.toml) for an explicit target triple:
/// RUSTFLAGS then reach only the binaries, not build scripts or proc
/// macros, and the output lands in `target/<triple>/shipped`, apart from the
/// dynamic `target/release`.
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
        "build: RUSTFLAGS='{rustflags}' cargo build --profile shipped --target {TRIPLE}"
    ));
    for b in bins {
        run(cargo()
            .env("RUSTFLAGS", &rustflags)
            .env("SOURCE_DATE_EPOCH", epoch)
            .args(["build", "--locked", "--target", TRIPLE])
            .args(["--profile", "shipped"])
            .args(["-p", b]))?;
    }
    Ok(crate::paths::target_dir().join(TRIPLE).join("shipped"))
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

/// Debian's package name and revision, the RPM's release.
const REVISION: &str = "1";

/// The maintainer scripts' shared functions, put at the top of each.
const SCRIPT_COMMON: &str = "deploy/package/common.sh";

/// What a package is for: the Debian or the RPM family, whose paths for
/// the settings, the licences, the changelog and zsh's completions differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Deb,
    Rpm,
}

impl Family {
    /// The node's settings, a conffile (`%config(noreplace)`).
    pub fn conffile(self) -> &'static str {
        match self {
            Family::Deb => "etc/default/prjquota",
            Family::Rpm => "etc/sysconfig/prjquota",
        }
    }

    fn zsh_dir(self) -> &'static str {
        match self {
            Family::Deb => crate::completions::ZSH_DEB,
            Family::Rpm => crate::completions::ZSH_RPM,
        }
    }

    /// Where LICENSE and the third-party notice go: Debian's doc directory
    /// (the copyright file refers to the notice), the RPM's %license one.
    pub fn licence_dir(self) -> &'static str {
        match self {
            Family::Deb => DOC_DIR,
            Family::Rpm => "usr/share/licenses/prjquota",
        }
    }
}

/// The package's documentation.
const DOC_DIR: &str = "usr/share/doc/prjquota";

/// The bill of materials, in the package's documentation and the
/// tarball's root (`sbom.rs`).
pub const SBOM: &str = "prjquota.cdx.json";

/// The README and every page of the repository it links (by relative
/// link, anchors dropped), as paths from the repository's root. LICENSE
/// is not among them: the packages ship it as the licence (Debian's
/// copyright, the RPM's %license).
pub fn shipped_docs(root: &Path) -> Result<Vec<String>> {
    let readme = std::fs::read_to_string(root.join("README.md")).context("read README.md")?;
    let mut pages = vec!["README.md".to_string()];
    for link in readme.split("](").skip(1) {
        let Some((target, _)) = link.split_once(')') else {
            continue;
        };
        let target = target.split('#').next().unwrap_or_default();
        if target.is_empty() || target.contains("://") || target == "LICENSE" {
            continue;
        }
        if !root.join(target).is_file() {
            bail!("README.md links {target}, which is not a file of the repository");
        }
        if !pages.iter().any(|p| p == target) {
            pages.push(target.to_string());
        }
    }
    Ok(pages)
}

/// The settings file for `family`: deploy/package/default, naming the
/// family's path in its comments.
pub fn settings_text(default: &str, family: Family) -> String {
    default.replace("/etc/default/prjquota", &format!("/{}", family.conffile()))
}

/// The files both packages install, staged under `d`: the exporter and the
/// admin wrapper on PATH, the plugin as a regular file that the scripts put
/// into Nomad's plugin directory (Nomad 2.0.1+ refuses symlinked plugins),
/// both binaries stripped (`cargo xtask dist` keeps their symbols in the
/// debug archive), the unit (shipped, not enabled) and its generator, the
/// node's settings (a conffile), the dashboard, the rules, the Prometheus
/// and Alertmanager configurations, and the licences: the project's and the crates' linked
/// in (`notice.rs`).
fn stage_files(root: &Path, bins: &Bins, d: &Path, epoch: &str, family: Family) -> Result<()> {
    for (bin, to) in [
        (&bins.exporter, EXPORTER_PATH),
        (&bins.plugin, PLUGIN_PATH),
        (&bins.dashboards, DASHBOARDS_PATH),
    ] {
        install_file(bin, &d.join(to), 0o755)?;
        strip(&d.join(to))?;
    }
    install_file(
        &root.join("deploy/package/prjquota"),
        &d.join("usr/bin/prjquota"),
        0o755,
    )?;
    install_file(
        &root.join("deploy/package/generator"),
        &d.join("usr/lib/systemd/system-generators/prjquota-exporter-generator"),
        0o755,
    )?;
    for (from, to) in [
        (
            "deploy/systemd/prjquota-exporter.service",
            "usr/lib/systemd/system/prjquota-exporter.service",
        ),
        (
            "dashboards/prjquota.json",
            "usr/share/prjquota/dashboards/prjquota.json",
        ),
        (
            "dashboards/alerts.yaml",
            "usr/share/prjquota/rules/prjquota-alerts.yaml",
        ),
        // What `prjquota-dashboards render` reads without --config, and
        // what an operator copies and edits.
        (
            "dashboards/config.toml",
            "usr/share/prjquota/dashboards/config.toml",
        ),
        (
            "deploy/prometheus/prometheus.yml",
            "usr/share/prjquota/prometheus/prometheus.yml",
        ),
        // Its inhibit_rules, for the operator's Alertmanager.
        (
            "deploy/alertmanager/alertmanager.yml",
            "usr/share/prjquota/alertmanager/alertmanager.yml",
        ),
        ("deploy/prjquota.toml", "usr/share/prjquota/prjquota.toml"),
        // What the exporter's Nomad client needs of Nomad's ACLs.
        (
            "deploy/nomad/prjquota-exporter.policy.hcl",
            "usr/share/prjquota/nomad/prjquota-exporter.policy.hcl",
        ),
        // Not active: the operator copies it into nomad.service.d.
        (
            "deploy/systemd/nomad-requires-prjquota.conf",
            "usr/share/doc/prjquota/nomad-requires-prjquota.conf",
        ),
    ] {
        install_file(&root.join(from), &d.join(to), 0o644)?;
    }
    // The README and every page it links, where its links find them.
    for page in shipped_docs(root)? {
        install_file(&root.join(&page), &d.join(DOC_DIR).join(&page), 0o644)?;
    }
    write(
        &d.join(DOC_DIR).join(SBOM),
        &crate::sbom::for_workspace(root, TRIPLE, &BINS, epoch)?,
    )?;
    let default = std::fs::read_to_string(root.join("deploy/package/default"))?;
    write(&d.join(family.conffile()), &settings_text(&default, family))?;
    let licences = d.join(family.licence_dir());
    write(
        &licences.join(crate::notice::FILE),
        &crate::notice::render_for_workspace(root, TRIPLE, &BINS)?,
    )?;
    stage_man_pages(bins, d, epoch)?;
    crate::completions::stage(&bins.exporter, d, family.zsh_dir())?;
    match family {
        Family::Deb => {
            let years = copyright_years(root, epoch)?;
            write(&licences.join("copyright"), &debian_copyright(&years))?;
            install_file(
                &root.join(crate::lint::LINTIAN_OVERRIDES),
                &d.join("usr/share/lintian/overrides/prjquota"),
                0o644,
            )?;
            // Debian policy: the changelog, gzipped with no timestamp.
            let changelog = d.join(DOC_DIR).join("changelog.Debian");
            write(&changelog, &debian_changelog(epoch)?)?;
            run(Command::new("gzip").args(["-n", "-9"]).arg(&changelog))
        }
        Family::Rpm => install_file(&root.join("LICENSE"), &licences.join("LICENSE"), 0o644),
    }
}

/// Strips a staged binary as dh_strip does an executable: the symbol
/// table and what debuggers read go (the debug archive keeps them), the
/// build ID that finds them stays.
pub fn strip(bin: &Path) -> Result<()> {
    run(Command::new("strip")
        .args(["--remove-section=.comment", "--remove-section=.note"])
        .arg(bin))
}

/// The years of the project's history: its first commit's to the build's
/// (SOURCE_DATE_EPOCH's alone outside a git checkout).
fn copyright_years(root: &Path, epoch: &str) -> Result<String> {
    let year = |args: &[&str]| -> Option<String> {
        let o = Command::new(args[0])
            .args(&args[1..])
            .current_dir(root)
            .output()
            .ok()?;
        let y = String::from_utf8_lossy(&o.stdout)
            .lines()
            .next()?
            .trim()
            .to_string();
        (o.status.success() && y.len() == 4).then_some(y)
    };
    let last = year(&["date", "-u", "+%Y", "-d", &format!("@{epoch}")])
        .with_context(|| format!("the year of SOURCE_DATE_EPOCH {epoch}"))?;
    let first = year(&[
        "git",
        "log",
        "--reverse",
        "--format=%ad",
        "--date=format:%Y",
    ]);
    Ok(match first {
        Some(f) if f < last => format!("{f}-{last}"),
        _ => last,
    })
}

/// The machine-readable copyright file (DEP-5): the project's licence,
/// and the notice of what the static binaries link.
fn debian_copyright(years: &str) -> String {
    format!(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
         Upstream-Name: prjquota\n\
         Upstream-Contact: {MAINTAINER}\n\
         Source: https://github.com/prjquota/prjquota\n\
         \n\
         Files: *\n\
         Copyright: {years} prjquota developers\n\
         License: MPL-2.0\n\
         Comment: /usr/bin/prjquota-exporter, /usr/bin/prjquota-dashboards and\n \
         /usr/lib/prjquota/prjquota are statically linked: they contain\n \
         third-party Rust crates and the GNU C\n \
         Library. /{DOC_DIR}/{notice} lists each crate with\n \
         its version and licence, and holds their licence texts.\n\
         \n\
         License: MPL-2.0\n \
         On Debian systems, the complete text of the Mozilla Public License\n \
         version 2.0 can be found in /usr/share/common-licenses/MPL-2.0.\n",
        notice = crate::notice::FILE,
    )
}

/// The tarball's `share/`, laid out as under `/usr/local`: man pages and
/// completions (zsh's in `site-functions`, on zsh's default fpath there).
fn stage_share(bins: &Bins, stage: &Path, epoch: &str) -> Result<()> {
    stage_man_pages(bins, stage, epoch)?;
    crate::completions::stage(&bins.exporter, stage, crate::completions::ZSH_RPM)?;
    std::fs::rename(stage.join("usr/share"), stage.join("share"))
        .context("move the tarball's usr/share to share")?;
    std::fs::remove_dir(stage.join("usr")).context("remove the tarball's empty usr")
}

/// Fails unless the tarball holds every command's man page and every
/// shell's completions.
fn check_tarball(tarball: &Path, name: &str) -> Result<()> {
    let o = Command::new("tar")
        .arg("-tzf")
        .arg(tarball)
        .output()
        .context("run tar -tzf")?;
    if !o.status.success() {
        bail!("tar -tzf {} failed", tarball.display());
    }
    let listed = String::from_utf8_lossy(&o.stdout);
    let mut want: Vec<String> = BINS
        .iter()
        .map(|bin| format!("{name}/share/man/man1/{bin}.1.gz"))
        .collect();
    for shell in crate::completions::SHELLS {
        for bin in BINS {
            let path = crate::completions::path(shell, bin, crate::completions::ZSH_RPM);
            let path = path.strip_prefix("usr/").unwrap_or(&path);
            want.push(format!("{name}/{path}"));
        }
    }
    let missing: Vec<&String> = want
        .iter()
        .filter(|w| !listed.lines().any(|l| l == w.as_str()))
        .collect();
    if !missing.is_empty() {
        bail!("{} lacks {missing:?}", tarball.display());
    }
    Ok(())
}

/// Man pages made by help2man from the binaries' own --help and
/// --version, which both print from their clap definitions (the plugin's
/// is `prjquota::cli`, also the completions'), so the pages cannot drift
/// from the binaries shipped beside them.
fn stage_man_pages(bins: &Bins, d: &Path, epoch: &str) -> Result<()> {
    for (bin, name) in [
        (
            &bins.plugin,
            "Nomad dynamic host volume plugin and admin commands (project quotas)",
        ),
        (
            &bins.exporter,
            "Prometheus exporter and quota guard for prjquota's Nomad host volumes",
        ),
        (
            &bins.dashboards,
            "render prjquota's Prometheus rules and Grafana dashboard from a config",
        ),
    ] {
        let file = bin
            .file_name()
            .context("a binary's name")?
            .to_string_lossy();
        let page = d.join(format!("usr/share/man/man1/{file}.1"));
        std::fs::create_dir_all(page.parent().unwrap())?;
        // help2man runs `./NAME`-style paths; the plugin's page must say
        // `prjquota`, whatever the staged file is called.
        let stage = page.parent().unwrap().join(format!(".{file}"));
        std::fs::create_dir_all(&stage)?;
        install_file(bin, &stage.join(&*file), 0o755)?;
        run(Command::new("help2man")
            .env("SOURCE_DATE_EPOCH", epoch)
            .args([
                "--no-info",
                "--no-discard-stderr",
                "--section",
                "1",
                "--name",
                name,
            ])
            .arg("--output")
            .arg(&page)
            .arg(stage.join(&*file)))?;
        std::fs::remove_dir_all(&stage)?;
        run(Command::new("gzip").args(["-n", "-9", "-f"]).arg(&page))?;
    }
    Ok(())
}

/// Where the package puts the plugin (the scripts copy it from there).
const PLUGIN_PATH: &str = "usr/lib/prjquota/prjquota";
const EXPORTER_PATH: &str = "usr/bin/prjquota-exporter";
const DASHBOARDS_PATH: &str = "usr/bin/prjquota-dashboards";

/// One entry for this version, dated by the commit (reproducible); the
/// project's own CHANGELOG.md, in the package's docs, says what changed.
fn debian_changelog(epoch: &str) -> Result<String> {
    let o = Command::new("date")
        .args(["-u", "-R", "-d", &format!("@{epoch}")])
        .output()
        .context("run date")?;
    if !o.status.success() {
        bail!("date -R -d @{epoch} failed");
    }
    let date = String::from_utf8_lossy(&o.stdout).trim().to_string();
    Ok(format!(
        "prjquota ({v}-{REVISION}) unstable; urgency=medium\n\n  \
         * prjquota {v}. What changed: CHANGELOG.md at\n    \
         https://github.com/prjquota/prjquota/blob/v{v}/CHANGELOG.md\n\n \
         -- {MAINTAINER}  {date}\n",
        v = env!("CARGO_PKG_VERSION")
    ))
}

const MAINTAINER: &str = "prjquota developers <prjquota@users.noreply.github.com>";
const SUMMARY: &str = "Nomad host volumes sized by filesystem project quotas";
const DESCRIPTION: &str = "prjquota is a Nomad dynamic host volume plugin: each volume is a \
directory on XFS or ext4 whose size a kernel project quota enforces. This package installs \
the plugin into Nomad's host_volume_plugin_dir (PLUGIN_DIR in /etc/default/prjquota, \
/etc/sysconfig/prjquota in the .rpm) and \
keeps it up to date there, the prjquota admin command, prjquota-exporter (Prometheus metrics \
and the quota guard; systemd unit shipped but not enabled), the Grafana dashboard, the alert \
rules, a Prometheus configuration, Alertmanager inhibition rules and the Nomad ACL policy of \
the exporter under /usr/share/prjquota, and prjquota-dashboards, which renders the rules and \
the dashboard from an edited config.";

/// A maintainer script: /bin/sh, the shared functions, then `name`'s body.
fn script(root: &Path, name: &str) -> Result<String> {
    let common = std::fs::read_to_string(root.join(SCRIPT_COMMON))?;
    let body = std::fs::read_to_string(root.join("deploy/package").join(name))?;
    Ok(format!("#!/bin/sh\n{common}\n{body}"))
}

/// The .deb's tree: the files, then `DEBIAN/` (control, conffiles,
/// md5sums, the maintainer scripts).
fn stage_deb(
    root: &Path,
    bins: &Bins,
    d: &Path,
    epoch: &str,
    revision: &str,
    trailer: &[u8],
) -> Result<()> {
    stage_files(root, bins, d, epoch, Family::Deb)?;
    append_trailer(d, trailer)?;
    let size_kib = du_kib(d)?;
    let version = env!("CARGO_PKG_VERSION");
    let description = wrap_description(DESCRIPTION);
    write(
        &d.join("DEBIAN/control"),
        &format!(
            "Package: prjquota\n\
             Version: {version}-{revision}\n\
             Architecture: amd64\n\
             Maintainer: {MAINTAINER}\n\
             Installed-Size: {size_kib}\n\
             Section: admin\n\
             Priority: optional\n\
             Homepage: https://github.com/prjquota/prjquota\n\
             Description: {SUMMARY}\n{description}"
        ),
    )?;
    let conffile = Family::Deb.conffile();
    write(&d.join("DEBIAN/conffiles"), &format!("/{conffile}\n"))?;
    for name in ["postinst", "prerm", "postrm"] {
        let p = d.join("DEBIAN").join(name);
        write(&p, &script(root, name)?)?;
        set_mode(&p, 0o755)?;
    }
    // md5sums of every file but the conffiles (dpkg tracks those itself),
    // sorted, relative to /.
    let mut files = Vec::new();
    list_files(d, d, &mut files)?;
    files.retain(|f| !f.starts_with("DEBIAN/") && f != conffile);
    files.sort();
    let out = Command::new("md5sum")
        .current_dir(d)
        .args(&files)
        .output()
        .context("run md5sum (coreutils)")?;
    if !out.status.success() {
        bail!("md5sum failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    std::fs::write(d.join("DEBIAN/md5sums"), &out.stdout)?;
    Ok(())
}

/// control's extended description: lines of at most 79 columns, each
/// starting with a space.
fn wrap_description(text: &str) -> String {
    wrap(text, 79, " ")
}

/// `text`'s words in lines of at most `width` columns, `indent` included.
fn wrap(text: &str, width: usize, indent: &str) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && indent.len() + line.len() + 1 + word.len() > width {
            out += &format!("{indent}{line}\n");
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line += word;
    }
    if !line.is_empty() {
        out += &format!("{indent}{line}\n");
    }
    out
}

/// The spec's %files: the package's own directories, the settings as
/// `%config(noreplace)`, the licences as `%license`, the docs as `%doc`.
fn rpm_files(files: &[String]) -> String {
    let mut listed = String::new();
    for d in [
        "/usr/lib/prjquota",
        "/usr/share/prjquota",
        "/usr/share/doc/prjquota",
        "/usr/share/licenses/prjquota",
    ] {
        listed += &format!("%dir {d}\n");
    }
    for f in files {
        let attr = if f == Family::Rpm.conffile() {
            "%config(noreplace) "
        } else if f.starts_with(&format!("{}/", Family::Rpm.licence_dir())) {
            "%license "
        } else if f.starts_with(&format!("{DOC_DIR}/")) {
            "%doc "
        } else {
            ""
        };
        listed += &format!("{attr}/{f}\n");
    }
    listed
}

/// The spec's %changelog: one entry for this version, dated by the commit
/// (reproducible), pointing at CHANGELOG.md as the Debian one does.
fn rpm_changelog(epoch: &str, release: &str) -> Result<String> {
    let o = Command::new("date")
        .env("LC_ALL", "C")
        .args(["-u", "+%a %b %d %Y", "-d", &format!("@{epoch}")])
        .output()
        .context("run date")?;
    if !o.status.success() {
        bail!("date -d @{epoch} failed");
    }
    let date = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let v = env!("CARGO_PKG_VERSION");
    Ok(format!(
        "* {date} {MAINTAINER} - {v}-{release}\n\
         - prjquota {v}: see\n  https://github.com/prjquota/prjquota/blob/v{v}/CHANGELOG.md\n"
    ))
}

/// Files (not directories) under `d`, relative to `base`.
fn list_files(base: &Path, d: &Path, out: &mut Vec<String>) -> Result<()> {
    for e in std::fs::read_dir(d)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            list_files(base, &e.path(), out)?;
        } else {
            out.push(e.path().strip_prefix(base)?.to_string_lossy().into_owned());
        }
    }
    Ok(())
}

/// `prjquota-<version>-1.x86_64.rpm`.
pub fn rpm_name() -> String {
    rpm_name_of(REVISION)
}

/// `prjquota-<version>-<release>.x86_64.rpm`.
pub fn rpm_name_of(release: &str) -> String {
    format!(
        "prjquota-{}-{release}.x86_64.rpm",
        env!("CARGO_PKG_VERSION")
    )
}

/// Builds the .rpm at `rpm` with rpmbuild (Debian's `rpm` package) from
/// the same files as the .deb: the spec only copies the staged tree and
/// lists it. No strip, no debuginfo, no build-id links (the binaries are
/// the released ones), times clamped to the commit's.
pub fn build_rpm(root: &Path, bins: &Bins, rpm: &Path, epoch: &str) -> Result<()> {
    build_rpm_release(root, bins, rpm, epoch, REVISION, b"")
}

/// [`build_rpm`] with another release than the package's own, and
/// `trailer` appended to every binary once staged (stripping would drop
/// it; an ELF runs with trailing data): the newer package an upgrade test
/// installs over it, its files told from the old by the trailer.
pub fn build_rpm_release(
    root: &Path,
    bins: &Bins,
    rpm: &Path,
    epoch: &str,
    release: &str,
    trailer: &[u8],
) -> Result<()> {
    let dir = rpm.parent().context("the .rpm's directory")?;
    let top = fresh_dir(&dir.join("rpm-build"))?;
    let tree = top.join("tree");
    stage_files(root, bins, &tree, epoch, Family::Rpm)?;
    append_trailer(&tree, trailer)?;
    normalise(&tree, epoch)?;
    let mut files = Vec::new();
    list_files(&tree, &tree, &mut files)?;
    files.sort();
    let listed = rpm_files(&files);
    let scripts = ["rpm-post", "rpm-preun", "rpm-postun"]
        .iter()
        .zip(["%post", "%preun", "%postun"])
        .map(|(name, section)| {
            let common = std::fs::read_to_string(root.join(SCRIPT_COMMON))?;
            let body = std::fs::read_to_string(root.join("deploy/package").join(name))?;
            Ok(format!("{section}\n{common}\n{body}\n"))
        })
        .collect::<Result<Vec<_>>>()?
        .join("\n");
    let spec = format!(
        "Name: prjquota\n\
         Version: {version}\n\
         Release: {release}\n\
         Summary: {SUMMARY}\n\
         License: MPL-2.0\n\
         Group: System Environment/Daemons\n\
         URL: https://github.com/prjquota/prjquota\n\
         Packager: {MAINTAINER}\n\
         BuildArch: x86_64\n\
         %global debug_package %{{nil}}\n\
         %global __os_install_post %{{nil}}\n\
         %global _build_id_links none\n\
         \n%description\n{description}\
         \n%install\ncp -a {tree}/. %{{buildroot}}/\n\
         \n%files\n%defattr(-,root,root,-)\n{listed}\n{scripts}\
         \n%changelog\n{changelog}",
        version = env!("CARGO_PKG_VERSION"),
        tree = tree.display(),
        description = wrap(DESCRIPTION, 79, ""),
        changelog = rpm_changelog(epoch, release)?,
    );
    let spec_path = top.join("prjquota.spec");
    write(&spec_path, &spec)?;
    run(Command::new("rpmbuild")
        .env("SOURCE_DATE_EPOCH", epoch)
        .arg("-bb")
        .arg("--quiet")
        .args(["--define", &format!("_topdir {}", top.display())])
        .args([
            "--define",
            &format!("_rpmdir {}", top.join("out").display()),
        ])
        .args([
            "--define",
            "_build_name_fmt %%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm",
        ])
        .args(["--define", "use_source_date_epoch_as_buildtime 1"])
        .args(["--define", "clamp_mtime_to_source_date_epoch 1"])
        .args(["--define", "_buildhost reproducible"])
        .arg(&spec_path))?;
    let made = rpm_name_of(release);
    std::fs::rename(top.join("out").join(&made), rpm)
        .with_context(|| format!("rpmbuild made no {made}"))?;
    Ok(())
}

/// Appends `trailer` to every staged binary under `d` (an ELF runs with
/// trailing data): an upgrade test's newer package tells its files so.
fn append_trailer(d: &Path, trailer: &[u8]) -> Result<()> {
    if trailer.is_empty() {
        return Ok(());
    }
    for bin in [EXPORTER_PATH, PLUGIN_PATH, DASHBOARDS_PATH].map(|p| d.join(p)) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&bin)
            .with_context(|| format!("open {}", bin.display()))?;
        std::io::Write::write_all(&mut f, trailer)?;
    }
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
    if let Some(p) = to.parent() {
        std::fs::create_dir_all(p)?;
    }
    std::fs::copy(from, to).with_context(|| format!("copy {}", from.display()))?;
    set_mode(to, mode)
}

fn set_mode(p: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {mode:o} {}", p.display()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_id_is_read_from_readelf() {
        let notes = "Displaying notes found in: .note.gnu.build-id\n  \
                     Owner                Data size \tDescription\n  \
                     GNU                  0x00000014\tNT_GNU_BUILD_ID (unique build ID bitstring)\n    \
                     Build ID: 5fe46b4f4976bfe48d28834bfddac7fc43ffef57\n";
        let id = build_id(notes).unwrap();
        assert_eq!(id, "5fe46b4f4976bfe48d28834bfddac7fc43ffef57");
        assert_eq!(
            debug_path(&id),
            "usr/lib/debug/.build-id/5f/e46b4f4976bfe48d28834bfddac7fc43ffef57.debug"
        );
        assert_eq!(build_id("no notes\n"), None);
        assert_eq!(build_id("    Build ID: zz\n"), None);
    }

    /// Nomad runs the plugin on every volume operation: what only the
    /// dashboards' renderer needs (a YAML library, the templates) is
    /// linked into `prjquota-dashboards`, never into it.
    #[test]
    fn the_plugin_links_no_yaml_library() {
        let meta = crate::notice::workspace_metadata(&crate::paths::repo_root(), TRIPLE).unwrap();
        let names = |bin: &str| -> Vec<String> {
            crate::notice::linked(&meta, &[bin])
                .unwrap()
                .into_iter()
                .map(|c| c.name)
                .collect()
        };
        let (plugin, renderer) = (names("prjquota"), names("prjquota-dashboards"));
        for yaml in ["serde_norway", "unsafe-libyaml-norway"] {
            assert!(
                !plugin.contains(&yaml.to_string()),
                "the plugin links {yaml}"
            );
            assert!(
                renderer.contains(&yaml.to_string()),
                "renders without {yaml}?"
            );
        }
        let direct = |bin: &str| -> Vec<String> {
            let pkg = meta["packages"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == bin)
                .unwrap();
            pkg["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["name"].as_str().unwrap().to_string())
                .collect()
        };
        assert!(
            !direct("prjquota").contains(&"prjquota-dashboards".to_string()),
            "the plugin depends on the dashboards crate"
        );
    }

    /// Every page the README links reaches an operator with the package,
    /// at the path the README's link names.
    #[test]
    fn the_packages_ship_every_page_the_readme_links() {
        let pages = shipped_docs(&crate::paths::repo_root()).unwrap();
        for page in [
            "README.md",
            "CHANGELOG.md",
            "SECURITY.md",
            "docs/install.md",
            "docs/runbooks.md",
            "bench/RESULTS.md",
        ] {
            assert!(pages.iter().any(|p| p == page), "{page} in {pages:?}");
        }
        assert!(!pages.iter().any(|p| p == "LICENSE"));
        assert!(pages.len() >= 15, "{pages:?}");
    }

    #[test]
    fn each_family_has_its_paths() {
        assert_eq!(Family::Deb.conffile(), "etc/default/prjquota");
        assert_eq!(Family::Rpm.conffile(), "etc/sysconfig/prjquota");
        let text = "# /etc/default/prjquota: this node's settings\nVOLUMES_DIR=/v\n";
        assert_eq!(settings_text(text, Family::Deb), text);
        assert_eq!(
            settings_text(text, Family::Rpm),
            "# /etc/sysconfig/prjquota: this node's settings\nVOLUMES_DIR=/v\n"
        );
    }

    #[test]
    fn the_rpm_marks_settings_licences_and_docs() {
        let files: Vec<String> = [
            "etc/sysconfig/prjquota",
            "usr/bin/prjquota",
            "usr/share/doc/prjquota/README.md",
            "usr/share/licenses/prjquota/LICENSE",
            "usr/share/licenses/prjquota/THIRD-PARTY-LICENSES",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let listed = rpm_files(&files);
        for line in [
            "%config(noreplace) /etc/sysconfig/prjquota\n",
            "\n/usr/bin/prjquota\n",
            "%doc /usr/share/doc/prjquota/README.md\n",
            "%license /usr/share/licenses/prjquota/LICENSE\n",
            "%license /usr/share/licenses/prjquota/THIRD-PARTY-LICENSES\n",
            "%dir /usr/share/licenses/prjquota\n",
        ] {
            assert!(listed.contains(line), "{line:?} not in:\n{listed}");
        }
    }

    #[test]
    fn descriptions_wrap_within_79_columns() {
        for (indent, text) in [
            (" ", wrap_description(DESCRIPTION)),
            ("", wrap(DESCRIPTION, 79, "")),
        ] {
            assert!(text.lines().count() > 3);
            for line in text.lines() {
                assert!(line.len() <= 79 && line.starts_with(indent), "{line:?}");
            }
            assert_eq!(
                text.split_whitespace().collect::<Vec<_>>(),
                DESCRIPTION.split_whitespace().collect::<Vec<_>>()
            );
        }
    }
}
