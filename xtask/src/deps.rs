//! `cargo xtask deps`: installs what the build and the tests need on a fresh
//! Debian 12 machine (as root). Idempotent: when everything is present it runs
//! no installer at all.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Result};

use crate::{is_executable, which};

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
    ("fio", "write load in tests and benchmarks"),
];

/// The virtme-ng release this project was measured with.
const VIRTME_NG: &str = "virtme-ng==1.42";

pub fn main(args: &[String]) -> Result<u8> {
    if let Some(a) = args.first() {
        bail!("deps takes no arguments (got `{a}`)");
    }
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
        if let Err(e) = apt_install(&missing) {
            println!("failed      apt-get install {}: {e:#}", missing.join(" "));
            failed.push("apt packages".to_string());
        } else {
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
    }

    // virtme-ng (vng).
    match find_vng() {
        Some(path) => println!("present     vng ({})", path.display()),
        None => {
            println!("installing  vng (python3 -m pip install {VIRTME_NG})");
            match pip_install() {
                Ok(()) => match find_vng() {
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

    // cargo-nextest.
    if nextest_present() {
        println!("present     cargo-nextest");
    } else {
        println!("installing  cargo-nextest (cargo install cargo-nextest --locked)");
        let mut cmd = crate::cargo();
        cmd.args(["install", "cargo-nextest", "--locked"]);
        match quiet(&mut cmd) {
            Ok(()) => println!("installed   cargo-nextest"),
            Err(e) => {
                println!("failed      cargo-nextest: {e:#}");
                failed.push("cargo-nextest".into());
            }
        }
    }

    // The kernel the VM boots: present only if the package really put one in /boot.
    match crate::vm::kernel() {
        Ok(k) => println!("present     VM kernel {}", k.display()),
        Err(e) => {
            println!("failed      VM kernel: {e:#}");
            failed.push("VM kernel".into());
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
    let mut update = Command::new("apt-get");
    update.args(["update", "-q"]);
    // A source that cannot be reached fails the update; the lists of the
    // others may still be enough: say so and try the install anyway.
    if let Err(e) = quiet(&mut update) {
        println!("warning     apt-get update: {e:#}");
    }
    let mut install = Command::new("apt-get");
    install
        .env("DEBIAN_FRONTEND", "noninteractive")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(pkgs);
    quiet(&mut install)
}

/// Runs `cmd` with its output captured; an error carrying its stderr (and the
/// tail of its stdout) if it fails.
fn quiet(cmd: &mut Command) -> Result<()> {
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run {}: {e}", crate::display(cmd)))?;
    if out.status.success() {
        return Ok(());
    }
    let tail = |b: &[u8]| {
        let s = String::from_utf8_lossy(b);
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    };
    bail!(
        "`{}` exited with {}\n--- stderr\n{}\n--- stdout (tail)\n{}",
        crate::display(cmd),
        out.status,
        tail(&out.stderr),
        tail(&out.stdout)
    )
}

/// The `vng` executable: $PRJQUOTA_VNG, PATH, then python3's scripts directory
/// (pyenv shims appear only after a rehash; pip's --user directory).
pub fn find_vng() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PRJQUOTA_VNG").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    if let Some(p) = which("vng") {
        return Some(p);
    }
    let scripts = Command::new("python3")
        .args([
            "-c",
            "import sysconfig, site; print(sysconfig.get_path('scripts')); print(site.getuserbase() + '/bin')",
        ])
        .output()
        .ok()?;
    String::from_utf8_lossy(&scripts.stdout)
        .lines()
        .map(|dir| PathBuf::from(dir).join("vng"))
        .find(|p| is_executable(p))
}

fn pip_install() -> Result<()> {
    let pip = |extra: &[&str]| {
        let mut cmd = Command::new("python3");
        cmd.args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
            .args(extra)
            .arg(VIRTME_NG);
        quiet(&mut cmd)
    };
    match pip(&[]) {
        // Debian's own python3 refuses pip installs into the system (PEP 668).
        Err(e) if format!("{e:#}").contains("externally-managed-environment") => {
            pip(&["--break-system-packages"])
        }
        other => other,
    }
}

fn nextest_present() -> bool {
    crate::cargo()
        .args(["nextest", "--version"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
