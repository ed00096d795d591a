//! What the package, static-plugin and timing tests install and run: the
//! static release plugin and a test .deb and .rpm made by dist's own
//! code, and the lint of such packages in the host pass.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::paths::cargo;
use crate::process::run;

use super::opts::Opts;

/// The real-kernel test binaries that test what `cargo xtask dist` makes
/// (the .deb, the static release plugin; the timing ratios compare that
/// plugin with a static release mkdir plugin).
pub(super) const DIST_BINARIES: &[&str] = &["package", "static_plugin", "timing"];

/// What the package and static-plugin tests read: this run's copies (a
/// build beside the run would otherwise replace them under the guest).
pub(super) struct TestDist {
    /// The .deb to install.
    pub(super) deb: PathBuf,
    /// The .rpm of the same binaries, to inspect.
    pub(super) rpm: PathBuf,
    /// The binaries the .deb was built from ([`crate::dist::BINS`]).
    pub(super) deb_bins: PathBuf,
    /// The static release binaries (`prjquota`; with --release-deb also
    /// `prjquota-exporter`).
    pub(super) static_dir: PathBuf,
}

/// By default the static release `prjquota` exactly as `cargo xtask dist`
/// builds it (about a minute cold), and a test .deb staged by dist's own
/// code from it and this run's debug exporter, uncompressed. The release
/// exporter is most of a cold `cargo xtask dist` (over 6 minutes on a
/// loaded 2-core machine), which CI's budget has no room for; its static
/// linking is checked by `cargo xtask dist` itself. `--release-deb` tests
/// the release .deb instead.
pub(super) fn dist_for_tests(
    opts: &Opts,
    root: &Path,
    run_dir: &Path,
    bin_dir: &Path,
) -> Result<TestDist> {
    let static_dir = run_dir.join("static");
    std::fs::create_dir_all(&static_dir)?;
    let copy = |from: &Path, to: &Path| {
        std::fs::copy(from, to)
            .with_context(|| format!("cannot copy {} for the VM", from.display()))
            .map(drop)
    };
    static_mkdir_plugin(root, &static_dir.join("mkdir-plugin"))?;
    if opts.release_deb {
        let d = crate::dist::build()?;
        for b in crate::dist::BINS {
            copy(&d.bin_dir.join(b), &static_dir.join(b))?;
        }
        let deb = run_dir.join(crate::dist::deb_name());
        copy(&d.deb, &deb)?;
        let rpm = run_dir.join(crate::dist::rpm_name());
        copy(&d.rpm, &rpm)?;
        // The packages hold the binaries stripped as dist strips them.
        let deb_bins = run_dir.join("release-deb-bins");
        std::fs::create_dir_all(&deb_bins)?;
        for b in crate::dist::BINS {
            copy(&d.bin_dir.join(b), &deb_bins.join(b))?;
            crate::dist::strip(&deb_bins.join(b))?;
        }
        return Ok(TestDist {
            deb,
            rpm,
            deb_bins,
            static_dir,
        });
    }
    let epoch = crate::dist::source_date_epoch(root)?;
    let release = crate::dist::build_static(root, &epoch, &["prjquota"])?;
    crate::dist::assert_static(&release.join("prjquota"))?;
    copy(&release.join("prjquota"), &static_dir.join("prjquota"))?;
    let deb_bins = run_dir.join("test-deb-bins");
    std::fs::create_dir_all(&deb_bins)?;
    copy(&release.join("prjquota"), &deb_bins.join("prjquota"))?;
    for debug in ["prjquota-exporter", "prjquota-dashboards"] {
        copy(&bin_dir.join(debug), &deb_bins.join(debug))?;
    }
    // Stripped as dist strips what it packages (it strips them again, to
    // the same bytes): the package test compares what dpkg installed with
    // these, and the systemd pass unpacks, repacks and installs the
    // package several times under emulation (the debug exporter's debug
    // information is 119 MB of its 120).
    for b in crate::dist::BINS {
        crate::dist::strip(&deb_bins.join(b))?;
    }
    let bins = crate::dist::Bins::in_dir(&deb_bins);
    let deb = run_dir.join("test-deb").join(crate::dist::deb_name());
    std::fs::create_dir_all(deb.parent().unwrap())?;
    crate::dist::build_deb(root, &bins, &deb, &epoch, "none")?;
    let rpm = deb.with_file_name(crate::dist::rpm_name());
    crate::dist::build_rpm(root, &bins, &rpm, &epoch)?;
    Ok(TestDist {
        deb,
        rpm,
        deb_bins,
        static_dir,
    })
}

/// Where the systemd pass's guest finds the files `boots` copies in.
pub(super) const IN_GUEST: &str = "/prjquota-test";

/// The repositories the systemd pass installs and upgrades from, as
/// `cargo xtask dist` makes them (`crate::repo`), signed with a throwaway
/// key and pointing at their directories in the guest: the test .deb's
/// and .rpm's, a newer one of each (revision 2, its binaries told apart),
/// and the newer apt repository signed by another key, which apt must
/// refuse.
pub(super) struct TestRepos {
    pub(super) apt: PathBuf,
    pub(super) apt_newer: PathBuf,
    pub(super) apt_forged: PathBuf,
    pub(super) yum: PathBuf,
}

pub(super) fn test_repos(d: &TestDist, newer_rpm: &Path) -> Result<TestRepos> {
    let root = crate::paths::repo_root();
    let epoch = crate::dist::source_date_epoch(&root)?;
    let dir = d.deb.with_file_name("repos");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let newer_deb = dir.join("newer").join(crate::dist::deb_name_of("2"));
    std::fs::create_dir_all(newer_deb.parent().unwrap())?;
    crate::dist::build_deb_release(
        &root,
        &crate::dist::Bins::in_dir(&d.deb_bins),
        &newer_deb,
        &epoch,
        "none",
        "2",
        b"prjquota-upgrade-test",
    )?;
    let key = crate::repo::SigningKey::for_build(&dir.join("gnupg"))?;
    let other = crate::repo::SigningKey::for_build(&dir.join("gnupg-other"))?;
    let repos = TestRepos {
        apt: dir.join("apt"),
        apt_newer: dir.join("apt-newer"),
        apt_forged: dir.join("apt-forged"),
        yum: dir.join("yum"),
    };
    let url = |p: &Path| {
        format!(
            "file:{IN_GUEST}/{}",
            p.file_name().unwrap().to_string_lossy()
        )
    };
    crate::repo::apt(&repos.apt, &[&d.deb], &key, &url(&repos.apt))?;
    // The repository the release updates: the old package and the new.
    crate::repo::apt(
        &repos.apt_newer,
        &[&d.deb, &newer_deb],
        &key,
        &url(&repos.apt_newer),
    )?;
    crate::repo::apt(
        &repos.apt_forged,
        &[&d.deb, &newer_deb],
        &other,
        &url(&repos.apt_forged),
    )?;
    for r in [&repos.apt, &repos.apt_newer] {
        crate::repo::verify_apt(r)?;
    }
    crate::repo::yum(&repos.yum, &[&d.rpm, newer_rpm], &key, &url(&repos.yum))?;
    Ok(repos)
}

/// The test .rpm rebuilt as release 2, with a trailer on both binaries so
/// that an upgrade's new files are told from the old: the package an
/// upgrade test installs over it. On the host, as rpmbuild is not in the
/// systemd pass's root.
pub(super) fn newer_rpm(d: &TestDist) -> Result<PathBuf> {
    let root = crate::paths::repo_root();
    let epoch = crate::dist::source_date_epoch(&root)?;
    let dir = d.rpm.with_file_name("newer-rpm");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let rpm = dir.join(crate::dist::rpm_name_of("2"));
    crate::dist::build_rpm_release(
        &root,
        &crate::dist::Bins::in_dir(&d.deb_bins),
        &rpm,
        &epoch,
        "2",
        b"prjquota-upgrade-test",
    )?;
    Ok(rpm)
}

/// lintian and rpmlint on a .deb and an .rpm that `cargo xtask dist`'s
/// own code stages, strips and packs, from the static release plugin
/// (built exactly as dist builds it, and reused by the VM pass's package
/// tests) and the debug exporter (the release exporter is most of a cold
/// dist, which CI's budget has no room for). What dist ships differs only
/// in the exporter's build, and dist lints its own packages too.
pub(super) fn lint_test_packages() -> Result<()> {
    let root = crate::paths::repo_root();
    let target = crate::paths::target_dir();
    let epoch = crate::dist::source_date_epoch(&root)?;
    let release = crate::dist::build_static(&root, &epoch, &["prjquota"])?;
    // The host pass's nextest run has just built them (the exporter's and
    // the renderer's tests run the binaries): a `cargo build -p
    // prjquota-exporter` of its own resolves other features and rebuilds a
    // dozen crates.
    let debug = ["prjquota-exporter", "prjquota-dashboards"];
    if debug.iter().any(|b| !target.join("debug").join(b).exists()) {
        run(cargo().args(["build", "--workspace", "--bins"]))?;
    }
    let dir = target
        .join("xtask")
        .join(format!("lint-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let result = (|| {
        std::fs::copy(release.join("prjquota"), dir.join("prjquota"))?;
        for b in debug {
            std::fs::copy(target.join("debug").join(b), dir.join(b))?;
        }
        let bins = crate::dist::Bins::in_dir(&dir);
        let deb = dir.join(crate::dist::deb_name());
        crate::dist::build_deb(&root, &bins, &deb, &epoch, "xz")?;
        let rpm = dir.join(crate::dist::rpm_name());
        crate::dist::build_rpm(&root, &bins, &rpm, &epoch)?;
        crate::lint::run(&root, &deb, &rpm, crate::lint::Build::Test)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The timing tests' baseline, Nomad's plain-directory plugin
/// (`tests/src/bin/mkdir-plugin.rs`, std only), built like the static
/// release plugin it is compared with: optimised, `crt-static`. A single
/// rustc call of a few seconds, where a release build of its crate would
/// build the test crate's dependencies too.
pub fn static_mkdir_plugin(root: &Path, out: &Path) -> Result<()> {
    let src = root.join("tests/src/bin/mkdir-plugin.rs");
    let mut cmd = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()));
    cmd.args([
        "--edition",
        "2021",
        "-C",
        "opt-level=3",
        "-C",
        "panic=abort",
    ])
    .args([
        "-C",
        "target-feature=+crt-static",
        "--target",
        crate::dist::TRIPLE,
    ])
    .arg(&src)
    .arg("-o")
    .arg(out);
    crate::process::run(&mut cmd)?;
    crate::dist::assert_static(out)
}
