//! `cargo xtask deps`: installs what the build and the tests need on a fresh
//! Debian 12 machine (as root). Idempotent: when everything is present it runs
//! no installer at all.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::kernels::{Fetch, Kernel};
use crate::process::is_executable;

/// Debian packages, and why.
const APT_PACKAGES: &[(&str, &str)] = &[
    ("qemu-system-x86", "the VM (vng runs qemu-system-x86_64)"),
    (
        "linux-image-amd64",
        "the kernel booted in the VM, with XFS/ext4 quota support",
    ),
    ("busybox-static", "vng's initramfs"),
    ("kmod", "modprobe/depmod, for vng and in the guest"),
    ("xfsprogs", "mkfs.xfs, xfs_quota, xfs_io"),
    ("e2fsprogs", "mkfs.ext4"),
    ("clang", "compiles the eBPF programs"),
    ("llvm", "llvm-strip/llvm-objdump for the eBPF programs"),
    (
        "libbpf-dev",
        "bpf_helpers.h and friends for the eBPF programs",
    ),
    ("bpftool", "vmlinux.h and inspecting loaded programs"),
    ("prometheus", "promtool, to check the alert rules"),
    (
        "prometheus-alertmanager",
        "amtool, which checks deploy/alertmanager/alertmanager.yml, and the Alertmanager its inhibition is tested on (dashboards/tests/alertmanager.rs)",
    ),
    (
        "python3-prometheus-client",
        "an OpenMetrics parser that checks the exporter's OpenMetrics body (tests/src/prom.rs)",
    ),
    (
        "python3-jsonschema",
        "validates `prjquota list --json` against docs/list.schema.json (tests/tests/admin.rs)",
    ),
    ("fio", "write load in tests and benchmarks"),
    (
        "nodejs",
        "runs the dashboard variables' regexes in JavaScript, as Grafana does (dashboards/src/grafana.rs)",
    ),
    (
        "strace",
        "counts the plugin's fsyncs in tests/tests/plugin.rs",
    ),
    (
        "systemd",
        "systemd-analyze verify and systemctl --root, run on the .deb's unit in the VM (tests/tests/package.rs); systemd-socket-activate (exporter/tests/systemd_socket.rs)",
    ),
    (
        "quota",
        "repquota, the independent witness of ext4 project quotas in the stress test",
    ),
    (
        "libcap2-bin",
        "capsh, to run the exporter and the guard tests' actors without eBPF or admin capabilities",
    ),
    (
        "curl",
        "the TLS client of the web config tests (a second TLS stack to test rustls against)",
    ),
    (
        "python3-venv",
        "the virtual environment virtme-ng is installed into (target/venv)",
    ),
    (
        "rpm",
        "rpmbuild, which makes the .rpm of `cargo xtask dist`, and rpm -qp, which checks it",
    ),
    (
        "lintian",
        "Debian's checks of the .deb, run by `cargo xtask test` (xtask/src/lint.rs)",
    ),
    (
        "rpmlint",
        "the RPM family's checks of the .rpm, run by `cargo xtask test` (xtask/src/lint.rs)",
    ),
    (
        "apt-utils",
        "apt-ftparchive, which indexes the apt repository of `cargo xtask dist` (xtask/src/repo.rs)",
    ),
    (
        "createrepo-c",
        "createrepo_c, the yum/dnf repository's metadata of `cargo xtask dist` (xtask/src/repo.rs)",
    ),
    (
        "gpg",
        "signs the repositories and SHA256SUMS of `cargo xtask dist` (xtask/src/repo.rs)",
    ),
    (
        "help2man",
        "the packages' man pages, from the binaries' --help (xtask/src/dist.rs)",
    ),
    (
        "mmdebstrap",
        "the Debian root the systemd pass boots with systemd as init (xtask/src/systemd.rs)",
    ),
    ("libseccomp-dev", "building virtiofsd (see VIRTIOFSD)"),
    ("libcap-ng-dev", "building virtiofsd (see VIRTIOFSD)"),
];

/// The virtme-ng release this project was measured with.
const VIRTME_NG: &str = "virtme-ng==1.42";

/// The virtio-fs daemon vng serves the guest's root with when it finds one
/// (on PATH: xtask puts target/venv/bin first), else 9p. 9p keeps no page
/// cache in the guest: every exec read the binary and its C library from
/// the host again, and the emulator translated their code again. Over
/// virtio-fs with caching, 5.10's crash tests took 66 s of test time
/// instead of 210 (one boot each, `--filter 'binary(crash)'`). Debian 12
/// has only QEMU's old C daemon, which vng refuses; trixie's Rust daemon
/// needs glibc 2.39. So it is built from crates.io into target/venv.
const VIRTIOFSD: &str = "1.14.0";

/// The cargo-nextest release xtask parses the output of.
const NEXTEST_VERSION: &str = "0.9.143";

/// The cargo-deny release the host pass checks licences and bans with
/// (deny.toml). Built from crates.io into target/venv/bin, as virtiofsd:
/// Debian has no package of it.
const CARGO_DENY: &str = "0.20.2";

/// Time limits (seconds) of the local install steps.
const CARGO_INSTALL_SECS: u64 = 1800;
const PIP_SECS: u64 = 600;

pub fn main() -> Result<u8> {
    let mut failed = Vec::new();

    // Debian packages.
    let missing = missing_apt_packages()?;
    for (pkg, why) in APT_PACKAGES {
        if !missing.contains(pkg) {
            println!("present     {pkg}");
        } else {
            println!("installing  {pkg} ({why})");
        }
    }
    if !missing.is_empty() {
        // Fatal: nothing after this works without these packages.
        apt_install(&missing).with_context(|| format!("apt-get install {}", missing.join(" ")))?;
        let still = missing_apt_packages()?;
        for pkg in &missing {
            if still.contains(pkg) {
                println!("failed      {pkg}: still not installed after apt-get install");
                failed.push(pkg.to_string());
            } else {
                println!("installed   {pkg}");
            }
        }
    }

    // virtme-ng (vng), in the project's own virtual environment: Debian's
    // python3 refuses pip installs into the system (PEP 668), and a pyenv or
    // a user's PATH must not decide what CI runs.
    match venv_vng().filter(|p| is_executable(p)) {
        Some(path) if vng_version_ok(&path) => println!("present     vng ({})", path.display()),
        _ => {
            println!(
                "installing  vng (python3 -m venv {}; pip install {VIRTME_NG})",
                venv_dir().display()
            );
            match pip_install() {
                Ok(()) => match venv_vng().filter(|p| is_executable(p)) {
                    Some(path) => println!("installed   vng ({})", path.display()),
                    None => {
                        println!("failed      vng: pip succeeded but no `vng` executable found");
                        failed.push("vng".into());
                    }
                },
                Err(e) => {
                    println!("failed      vng: {e:#}");
                    failed.push("vng".into());
                }
            }
        }
    }

    let virtiofsd = venv_dir().join("bin/virtiofsd");
    match version_of(&virtiofsd) {
        Some(v) if v.contains(VIRTIOFSD) => {
            println!(
                "present     virtiofsd {VIRTIOFSD} ({})",
                virtiofsd.display()
            )
        }
        _ => {
            println!(
                "installing  virtiofsd {VIRTIOFSD} (cargo install --locked --root {})",
                venv_dir().display()
            );
            let mut cmd = crate::debian::limited(CARGO_INSTALL_SECS, "cargo");
            cmd.current_dir(crate::paths::repo_root())
                .args([
                    "install",
                    "virtiofsd",
                    "--locked",
                    "--force",
                    "--version",
                    VIRTIOFSD,
                ])
                .arg("--root")
                .arg(venv_dir());
            match crate::process::quiet(&mut cmd) {
                Ok(()) => println!(
                    "installed   virtiofsd {VIRTIOFSD} ({})",
                    virtiofsd.display()
                ),
                Err(e) => {
                    println!("failed      virtiofsd: {e:#}");
                    failed.push("virtiofsd".into());
                }
            }
        }
    }

    let deny = cargo_deny();
    match version_of(&deny) {
        Some(v) if v.trim() == format!("cargo-deny {CARGO_DENY}") => {
            println!("present     cargo-deny {CARGO_DENY} ({})", deny.display())
        }
        _ => {
            println!(
                "installing  cargo-deny {CARGO_DENY} (cargo install --locked --root {})",
                venv_dir().display()
            );
            let mut cmd = crate::debian::limited(CARGO_INSTALL_SECS, "cargo");
            cmd.current_dir(crate::paths::repo_root())
                .args([
                    "install",
                    "cargo-deny",
                    "--locked",
                    "--force",
                    "--version",
                    CARGO_DENY,
                ])
                .arg("--root")
                .arg(venv_dir());
            match crate::process::quiet(&mut cmd) {
                Ok(()) => println!("installed   cargo-deny {CARGO_DENY} ({})", deny.display()),
                Err(e) => {
                    println!("failed      cargo-deny: {e:#}");
                    failed.push("cargo-deny".into());
                }
            }
        }
    }

    // cargo-nextest, pinned: xtask parses its output.
    match nextest_version() {
        Some(v) if v == NEXTEST_VERSION => println!("present     cargo-nextest {v}"),
        found => {
            println!(
                "installing  cargo-nextest {NEXTEST_VERSION} (found {}; cargo install --locked)",
                found.as_deref().unwrap_or("none")
            );
            let mut cmd = crate::debian::limited(CARGO_INSTALL_SECS, "cargo");
            cmd.current_dir(crate::paths::repo_root()).args([
                "install",
                "cargo-nextest",
                "--locked",
                "--force",
                "--version",
                NEXTEST_VERSION,
            ]);
            match crate::process::quiet(&mut cmd) {
                Ok(()) => println!("installed   cargo-nextest {NEXTEST_VERSION}"),
                Err(e) => {
                    println!("failed      cargo-nextest: {e:#}");
                    failed.push("cargo-nextest".into());
                }
            }
        }
    }

    // The kernel matrix and Prometheus 3, from Debian's archive by name
    // through a private apt state (the machine's sources stay as they are).
    let mut suites = crate::kernels::archive_suites();
    if !suites.contains(&PROMETHEUS3_SUITE) {
        suites.push(PROMETHEUS3_SUITE);
    }
    let mut apt = crate::debian::PrivateApt::new(suites);
    for k in Kernel::all() {
        let result = match k.row().fetch {
            Fetch::Installed => crate::kernels::image(k)
                .map(|i| format!("present     kernel {} ({})", k.name(), i.display())),
            Fetch::Archive => crate::kernels::fetch(k, &mut apt),
        };
        match result {
            Ok(line) => println!("{line}"),
            Err(e) => {
                println!("failed      kernel {}: {e:#}", k.name());
                failed.push(format!("kernel {}", k.name()));
            }
        }
    }
    match prometheus3(&mut apt) {
        Ok(line) => println!("{line}"),
        Err(e) => {
            println!("failed      prometheus 3: {e:#}");
            failed.push("prometheus 3".into());
        }
    }

    if failed.is_empty() {
        Ok(0)
    } else {
        eprintln!("xtask deps: failed: {}", failed.join(", "));
        Ok(1)
    }
}

/// The packages of [`APT_PACKAGES`] that dpkg does not report installed.
fn missing_apt_packages() -> Result<Vec<&'static str>> {
    let out = Command::new("dpkg-query")
        .arg("-W")
        .arg("-f=${Package} ${Status}\n")
        .args(APT_PACKAGES.iter().map(|(p, _)| p))
        .output();
    let out = match out {
        Ok(out) => out,
        Err(e) => bail!("cannot run dpkg-query (is this Debian?): {e}"),
    };
    // dpkg-query exits 1 when some package is unknown: that is an answer too.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let installed: Vec<&str> = stdout
        .lines()
        .filter(|l| l.ends_with(" install ok installed"))
        .filter_map(|l| l.split(' ').next())
        .collect();
    Ok(APT_PACKAGES
        .iter()
        .map(|(p, _)| *p)
        .filter(|p| !installed.contains(p))
        .collect())
}

fn apt_install(pkgs: &[&str]) -> Result<()> {
    let mut update = crate::debian::limited(crate::debian::UPDATE_SECS, "apt-get");
    update.args(["update", "-q"]);
    // Fatal: an install from stale or missing lists fails later, less clearly.
    crate::process::quiet(&mut update).context(
        "apt-get update failed: check the machine's apt sources and that the mirror is reachable",
    )?;
    let mut install = crate::debian::limited(crate::debian::DOWNLOAD_SECS, "apt-get");
    install
        .env("DEBIAN_FRONTEND", "noninteractive")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(pkgs);
    crate::process::quiet(&mut install)
}

/// The cargo-deny `cargo xtask deps` installs (the host pass runs it).
pub fn cargo_deny() -> PathBuf {
    venv_dir().join("bin/cargo-deny")
}

/// The project's Python virtual environment (virtme-ng lives there).
fn venv_dir() -> PathBuf {
    crate::paths::target_dir().join("venv")
}

fn venv_vng() -> Option<PathBuf> {
    Some(venv_dir().join("bin/vng"))
}

fn vng_version_ok(vng: &std::path::Path) -> bool {
    let want = VIRTME_NG.rsplit("==").next().unwrap_or_default();
    version_of(vng).is_some_and(|v| v.contains(want))
}

/// The `vng` executable: $PRJQUOTA_VNG, else the project's venv
/// (`cargo xtask deps` puts it there).
pub fn find_vng() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PRJQUOTA_VNG").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    venv_vng().filter(|p| is_executable(p))
}

/// Debian's own python3 (never a pyenv shim), a venv under target/, and
/// virtme-ng installed into it.
fn pip_install() -> Result<()> {
    let venv = venv_dir();
    if !venv.join("bin/python3").exists() {
        let mut cmd = crate::debian::limited(PIP_SECS, "/usr/bin/python3");
        cmd.args(["-m", "venv"]).arg(&venv);
        crate::process::quiet(&mut cmd)
            .context("python3 -m venv failed: is Debian's python3-venv installed?")?;
    }
    let python = venv.join("bin/python3");
    let mut cmd = crate::debian::limited(PIP_SECS, &python.to_string_lossy());
    cmd.args([
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        VIRTME_NG,
    ]);
    crate::process::quiet(&mut cmd)
}

/// What `binary --version` prints, if it runs.
fn version_of(binary: &std::path::Path) -> Option<String> {
    let out = Command::new(binary).arg("--version").output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn nextest_version() -> Option<String> {
    let out = crate::paths::cargo()
        .args(["nextest", "--version"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    // "cargo-nextest 0.9.143 (60fa45f63 2026-08-04)"
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(1)
        .map(str::to_string)
}

/// The suite whose Prometheus 3 `cargo xtask deps` unpacks.
const PROMETHEUS3_SUITE: &str = "sid";

/// Where `cargo xtask deps` unpacks sid's Prometheus 3.
pub fn prometheus3_dir() -> PathBuf {
    crate::paths::target_dir().join("prometheus3")
}

/// The Prometheus 3 binary, exported to tests as `PRJQUOTA_PROMETHEUS3`.
pub fn prometheus3_binary() -> PathBuf {
    prometheus3_dir().join("usr/bin/prometheus")
}

fn prometheus3(apt: &mut crate::debian::PrivateApt) -> Result<String> {
    let bin = prometheus3_binary();
    if !is_executable(&bin) {
        let dir = prometheus3_dir();
        let _ = std::fs::remove_dir_all(&dir);
        apt.fetch_into(
            &[
                format!("prometheus/{PROMETHEUS3_SUITE}"),
                format!("promtool/{PROMETHEUS3_SUITE}"),
            ],
            &dir,
        )?;
    }
    let out = Command::new(&bin)
        .arg("--version")
        .output()
        .with_context(|| format!("cannot run {}", bin.display()))?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let first = text.lines().next().unwrap_or_default().to_string();
    if !first.starts_with("prometheus, version 3.") {
        bail!("{} is not Prometheus 3: `{first}`", bin.display());
    }
    Ok(format!(
        "present     {first} ({}; PRJQUOTA_PROMETHEUS3)",
        bin.display()
    ))
}
