//! The systemd pass of `cargo xtask test`: the package as an operator runs
//! it, in a VM booted with systemd as init.
//!
//! vng's own guest (the host's root, vng's init) has no systemd to start a
//! unit, and `vng --systemd` on the host's root finds the host's container
//! marker and ignores `systemd.run=`. So the guest's root is a Debian root
//! of its own, made by mmdebstrap once and cached under
//! `target/systemd-root/`, copied for each boot (the guest writes into it:
//! dpkg, journald), with the booted kernel's modules linked in. systemd
//! runs `/prjquota-test/run.sh` as a boot-time service
//! (`systemd.run=`), which runs tests of the `systemd` test binary of
//! prjquota-vmtests (tests/tests/systemd.rs), built on the host for the same
//! Debian release, writes their output to a file in the root and powers off.
//!
//! The same copy boots once per entry of its pass ([`passes`]): the first
//! boot installs the package and leaves a node with volumes; the next are
//! that node's reboots, into the same kernel and then into newer ones
//! (empty bpffs, the unit and a stub `nomad.service` started by systemd in
//! their boot order: from the second boot on, the test's unit pulls in
//! multi-user.target, which a `systemd.run=` boot leaves out).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::kernels::{Kernel, Systemd as Role};
use crate::process::{run, shell_quote};

/// The release of the root: the build machine's, so the test binary built
/// here finds the same C library in the guest.
const SUITE: &str = "bookworm";

/// What the root holds beyond minbase: systemd as init, what dpkg's scripts
/// and the tests call (mkfs.xfs, losetup, mount), the kernel modules' tools.
/// `rpm` installs the .rpm as an RPM-family node does: no RPM-family root
/// can be fetched here (the machine reaches Debian's archive only).
///
/// `curl` and `gpg` run the quickstart's fetch of the repository's files
/// and its key's check (from `file:` URLs: the guest reaches no network);
/// apt and gpgv, which check the repository, are in minbase.
const PACKAGES: &str =
    "systemd,systemd-sysv,udev,kmod,xfsprogs,util-linux,procps,mount,rpm,curl,gpg";

/// Whether the systemd passes boot `k` (its row's role, `kernels.rs`).
pub fn boots_kernel(k: Kernel) -> bool {
    k.row().systemd != Role::None
}

/// A boot's limit. The first boot on 6.1 (the root's copy, the boot, the
/// package test, the reboot's set-up, the power-off) took 340 to 470 s on
/// a loaded 2-core machine (the package test about 250 s, the upgrade's
/// creates and looping owners beside dpkg about 60 s, the boot about a
/// minute); a reboot about two minutes. With the guard enforcing by
/// default, the package test took 445 s beside another VM, and dpkg's
/// upgrade 104 s. On one emulator thread, on a machine loaded with another
/// VM and builds, the first boot took 730 s. The limit leaves room for
/// that, and still ends a hung boot well within the run's deadline.
pub const BOOT_LIMIT_SECS: u64 = 20 * 60;

/// One boot of a pass: the kernel it boots and the tests of
/// tests/tests/systemd.rs it runs, in order (a test that fails ends its
/// boot, and a failed boot the pass: each leaves the state the next starts
/// from). The guest's `PRJQUOTA_SYSTEMD_BOOT` is the boot's number, from 1.
pub type Planned = (Kernel, &'static [&'static str]);

/// The package's whole story on a node, then the node's set-up for a
/// reboot (after the purge).
const PACKAGE_STORY: &[&str] = &[
    "the_package_installs_runs_moves_upgrades_and_purges_under_systemd",
    "a_node_with_volumes_is_set_up_for_a_reboot",
];
/// A node set up with the package's defaults, for a reboot.
const SET_UP: &[&str] = &["a_node_with_volumes_is_set_up_for_a_reboot"];
/// The node rebooted, its volume's owner attacking at the first moment.
const REBOOT: &[&str] = &["the_guard_holds_from_the_first_moment_of_a_boot"];
/// The .rpm's story, on a kernel without the BPF LSM: what that kernel
/// changes of the .deb's story, and what rpm and its macros change. A
/// reboot there would prove only that the guard is off, which this
/// already asserts.
const WITHOUT_ENFORCEMENT: &[&str] =
    &["the_rpm_installs_runs_upgrades_and_erases_on_a_kernel_without_the_bpf_lsm"];

/// The systemd passes of a run on `kernels`, each the boots of one copy of
/// the root, by each kernel's role. The .deb's kernel (6.1) runs the
/// package's story and reboots the node, then reboots it into each
/// [`Role::RebootInto`] kernel of the run (6.12, 7), as a node whose
/// kernel is upgraded: the story (install, upgrade, purge) is dpkg's and
/// systemd's and does not change with the kernel, the guard's first moment
/// does. Without a .deb kernel in the run, such a kernel sets up its own
/// node. The .rpm's kernel (5.10) runs the .rpm's story, which is what its
/// kernel changes of the .deb's too.
pub fn passes(kernels: &[Kernel]) -> Vec<Vec<Planned>> {
    let role = |k: &Kernel| k.row().systemd;
    let with_deb = kernels.iter().any(|k| role(k) == Role::DebStory);
    let mut out = Vec::new();
    for &k in kernels {
        match role(&k) {
            Role::RpmStory => out.push(vec![(k, WITHOUT_ENFORCEMENT)]),
            Role::DebStory => {
                let mut boots = vec![(k, PACKAGE_STORY), (k, REBOOT)];
                boots.extend(
                    kernels
                        .iter()
                        .filter(|k| role(k) == Role::RebootInto)
                        .map(|&n| (n, REBOOT)),
                );
                out.push(boots);
            }
            Role::RebootInto if !with_deb => out.push(vec![(k, SET_UP), (k, REBOOT)]),
            Role::RebootInto | Role::None => {}
        }
    }
    out
}

/// The kernels a pass boots, in order, each once.
pub fn kernels_of(pass: &[Planned]) -> Vec<&'static str> {
    let mut ks: Vec<&str> = pass.iter().map(|(k, _)| k.name()).collect();
    ks.dedup();
    ks
}

/// What a pass does, for its header.
pub fn story_of(pass: &[Planned]) -> String {
    let kernels = || kernels_of(pass).join(", then ");
    match pass.first() {
        Some((_, t)) if *t == WITHOUT_ENFORCEMENT => {
            "the .rpm installed, run, scraped by Prometheus, restarted asking for enforcement \
             it cannot give, upgraded under load, erased"
                .into()
        }
        Some((_, t)) if *t == PACKAGE_STORY => format!(
            "the .deb installed, run, scraped by Prometheus, moved, upgraded (an owner \
             attacking the guard meanwhile) and purged, then a node with volumes rebooted \
             into {}",
            kernels()
        ),
        _ => format!(
            "a node with volumes set up with the .deb's defaults and rebooted into {}, its \
             volume's owner attacking the guard at the first moment",
            kernels()
        ),
    }
}

/// The cached Debian root, made when missing or made for another package
/// list. The systemd passes run in lanes of one process, each wanting the
/// root: the first makes it while the others wait, since two makers would
/// remove each other's half-made copy.
pub fn debian_root() -> Result<PathBuf> {
    static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_maker = MAKING.lock().unwrap_or_else(|e| e.into_inner());
    let base = crate::paths::target_dir().join("systemd-root");
    let dir = base.join(SUITE);
    let key = format!("mmdebstrap --variant=minbase --include={PACKAGES} {SUITE}\n");
    let stamp = base.join(format!("{SUITE}.made-by"));
    if dir.is_dir() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(&key) {
        return Ok(dir);
    }
    crate::process::header(&format!("systemd pass: the Debian root ({})", key.trim()));
    let t = Instant::now();
    let _ = std::fs::remove_file(&stamp);
    let tmp = base.join(format!("{SUITE}.new"));
    for d in [&dir, &tmp] {
        if d.exists() {
            std::fs::remove_dir_all(d).with_context(|| format!("remove {}", d.display()))?;
        }
    }
    std::fs::create_dir_all(&base)?;
    run(
        crate::debian::limited(crate::debian::DOWNLOAD_SECS, "mmdebstrap")
            .args(["--variant=minbase", &format!("--include={PACKAGES}"), SUITE])
            .arg(&tmp),
    )?;
    std::fs::rename(&tmp, &dir)?;
    std::fs::write(&stamp, key)?;
    println!(
        "xtask: the Debian root took {:.0}s",
        t.elapsed().as_secs_f64()
    );
    Ok(dir)
}

/// The kernel release of a bootable image: `/boot/vmlinuz-<release>`, or
/// the `release` file beside the images `cargo xtask deps` fetched.
fn release_of(image: &Path) -> Result<String> {
    let name = image.file_name().unwrap_or_default().to_string_lossy();
    if let Some(r) = name.strip_prefix("vmlinuz-") {
        return Ok(r.to_string());
    }
    let file = image.with_file_name("release");
    Ok(std::fs::read_to_string(&file)
        .with_context(|| format!("read {}", file.display()))?
        .trim()
        .to_string())
}

/// What one boot gave: the test binary's output, the exit status of its
/// first failed test (0: all passed), and how long the boot took.
pub struct Boot {
    pub lines: Vec<String>,
    pub status: Option<i32>,
    pub secs: f64,
}

/// Boots each kernel of `pass` in turn with systemd as init on one copy of
/// the Debian root, and runs that boot's tests of `test_bin` there
/// with `env`; `files` (and directories) are copied into `/prjquota-test/`
/// of the guest first,
/// and each of `installs` (a host file, its absolute path in the guest)
/// put in place as a package would have.
/// The boots until the first that failed.
pub fn boots(
    pass: &[Planned],
    test_bin: &Path,
    files: &[&Path],
    installs: &[(&Path, &str)],
    env: &[(&str, String)],
) -> Result<Vec<Boot>> {
    let base = debian_root()?;
    let started = Instant::now();
    let kernel = pass.first().context("a systemd pass of no boot")?.0;
    let work = crate::paths::target_dir().join("xtask").join(format!(
        "systemd-{}-{}",
        kernel.name(),
        std::process::id()
    ));
    if work.exists() {
        std::fs::remove_dir_all(&work)?;
    }
    std::fs::create_dir_all(&work)?;
    let _cleanup = RemoveOnDrop(work.clone());
    let root = work.join("root");
    crate::process::quiet(
        Command::new("cp")
            .args(["-a", "--reflink=auto"])
            .arg(&base)
            .arg(&root),
    )?;
    // The modules of every booted kernel, linked (the guest only reads
    // them).
    let mut images = Vec::new();
    for (k, _) in pass {
        let image = crate::kernels::to_boot(*k)?;
        let release = release_of(&image)?;
        images.push(image);
        let into = root.join("usr/lib/modules");
        if into.join(&release).is_dir() {
            continue;
        }
        let modules = Path::new("/lib/modules").join(&release);
        if !modules.is_dir() {
            bail!(
                "{} is missing: run `cargo xtask deps` (it installs kernel {}'s modules)",
                modules.display(),
                k.name()
            );
        }
        std::fs::create_dir_all(&into)?;
        let linked = Command::new("cp")
            .arg("-al")
            .arg(&modules)
            .arg(&into)
            .status()?;
        if !linked.success() {
            crate::process::quiet(Command::new("cp").arg("-a").arg(&modules).arg(&into))?;
        }
    }

    // Linked where they can be (the same filesystem: Prometheus's 100 MB
    // would take seconds to copy, and the guest only runs it).
    for (from, to) in installs {
        let to = root.join(to.trim_start_matches('/'));
        if let Some(d) = to.parent() {
            std::fs::create_dir_all(d)?;
        }
        if std::fs::hard_link(from, &to).is_err() {
            std::fs::copy(from, &to)
                .with_context(|| format!("copy {} into the root", from.display()))?;
        }
    }
    let dir = root.join("prjquota-test");
    std::fs::create_dir_all(&dir)?;
    std::fs::copy(test_bin, dir.join("systemd-test"))?;
    for f in files {
        let to = dir.join(f.file_name().context("a file's name")?);
        if f.is_dir() {
            crate::process::quiet(Command::new("cp").arg("-a").arg(f).arg(&to))?;
        } else {
            std::fs::copy(f, &to).with_context(|| format!("copy {} into the root", f.display()))?;
        }
    }
    println!(
        "xtask: the root's copy for kernel {} took {:.0}s",
        kernel.name(),
        started.elapsed().as_secs_f64()
    );
    let mut done = Vec::new();
    for (n, ((k, tests), image)) in pass.iter().zip(&images).enumerate() {
        let b = boot_once(*k, image, &root, n + 1, tests, env)?;
        let failed = b.status != Some(0);
        done.push(b);
        if failed {
            break;
        }
    }
    Ok(done)
}

/// Boot `n` (from 1) of `root`, running `tests` in order.
fn boot_once(
    kernel: Kernel,
    image: &Path,
    root: &Path,
    n: usize,
    tests: &[&str],
    env: &[(&str, String)],
) -> Result<Boot> {
    let started = Instant::now();
    let dir = root.join("prjquota-test");
    let mut script = String::from(
        "#!/bin/sh\n\
         # Run by systemd (systemd.run=) as a boot-time service; written by\n\
         # xtask/src/systemd.rs. Output to the console and to out.log.\n\
         export PATH=/usr/sbin:/usr/bin:/sbin:/bin RUST_BACKTRACE=1 PRJQUOTA_IN_VM=1 \
         PRJQUOTA_SYSTEMD_ROOT=1\n",
    );
    script += &format!("export PRJQUOTA_SYSTEMD_BOOT={n}\n");
    for (k, v) in env {
        script += &format!("export {k}={}\n", shell_quote(v));
    }
    script += &format!(
        "{{\n\
         echo \"prjquota-systemd: up, boot {n}, kernel $(uname -r), init $(cat /proc/1/comm)\"\n\
         rc=0\n\
         for t in {}; do\n\
         [ $rc -eq 0 ] || break\n\
         /prjquota-test/systemd-test --exact \"$t\" --test-threads 1 --nocapture\n\
         rc=$?\n\
         done\n\
         echo \"prjquota-systemd: exit $rc\"\n\
         }} 2>&1 | tee /prjquota-test/out.log >/dev/console\n\
         sync\n",
        tests.join(" ")
    );
    let run_sh = dir.join("run.sh");
    std::fs::write(&run_sh, script)?;
    crate::process::quiet(Command::new("chmod").arg("0755").arg(&run_sh))?;
    let _ = std::fs::remove_file(dir.join("out.log"));
    // systemd boots into the systemd.run= unit alone, not the default
    // target. A reboot's tests need the node's boot: there the unit pulls
    // in multi-user.target, which systemd brings up beside the tests in
    // the units' own order.
    if n > 1 {
        let dropin = root.join("etc/systemd/system/kernel-command-line.service.d");
        std::fs::create_dir_all(&dropin)?;
        std::fs::write(
            dropin.join("prjquota-reboot.conf"),
            "# xtask/src/systemd.rs: a reboot brings the node up as at boot.\n\
             [Unit]\nWants=multi-user.target\n",
        )?;
    }

    let vng =
        crate::deps::find_vng().context("`vng` (virtme-ng) not found: run `cargo xtask deps`")?;
    let mut cmd = Command::new(&vng);
    if let Some(bin) = vng.parent() {
        let path = std::env::var_os("PATH").unwrap_or_default();
        cmd.env(
            "PATH",
            std::env::join_paths(
                std::iter::once(bin.to_path_buf()).chain(std::env::split_paths(&path)),
            )?,
        );
    }
    cmd.arg("-r")
        .arg(image)
        .args(["--disable-kvm", "--memory", "2G", "--cpus", "2"])
        .arg("--root")
        .arg(root)
        .args(["--rw", "--systemd", "--verbose"])
        // vng exports a --root with POSIX ACLs by default, which 5.10's
        // virtio-fs refuses ("switch_root: can't change directory to
        // '/newroot'"); nothing here uses ACLs.
        .arg("--no-root-posix-acl")
        .args(["--append", "tsc=reliable"])
        .args(["--append", crate::vm::EMULATOR_APPEND])
        .args([
            "--append",
            "systemd.run=/prjquota-test/run.sh systemd.run_success_action=poweroff \
             systemd.run_failure_action=poweroff systemd.show_status=0 loglevel=4",
        ])
        // See xtask/src/vm.rs: one emulator thread keeps code patched by the
        // eBPF attach coherent between vCPUs. Every boot here takes it: a
        // boot is mostly one process at a time, and on one host core each
        // it shares the machine with another VM (xtask/src/test/budget.rs).
        .arg("--qemu-opts=-accel tcg,thread=single")
        .stdin(Stdio::null());
    println!("$ {}", crate::process::display(&cmd));
    let limit = crate::deadline::cut_for(
        &format!("systemd boot {n} on kernel {}", kernel.name()),
        Duration::from_secs(BOOT_LIMIT_SECS),
    );
    let tee = crate::process::run_tee_prefixed(&mut cmd, Some(limit), "")?;
    let secs = started.elapsed().as_secs_f64();
    if tee.timed_out {
        bail!(
            "the systemd VM on kernel {} (boot {n}) was killed after {secs:.0}s",
            kernel.name()
        );
    }
    let out = std::fs::read_to_string(dir.join("out.log")).unwrap_or_default();
    let lines: Vec<String> = out.lines().map(str::to_string).collect();
    let status = lines.iter().rev().find_map(|l| {
        l.strip_prefix("prjquota-systemd: exit ")
            .and_then(|s| s.trim().parse().ok())
    });
    if !lines.iter().any(|l| l.starts_with("prjquota-systemd: up")) {
        bail!(
            "systemd never ran the tests of boot {n} on kernel {} (vng {}, {secs:.0}s): no \
             /prjquota-test/out.log from the guest; the console's last lines:\n{}",
            kernel.name(),
            tee.status,
            tee.lines[tee.lines.len().saturating_sub(30)..].join("\n")
        );
    }
    println!(
        "xtask: systemd boot {n} on kernel {} took {secs:.0}s",
        kernel.name()
    );
    Ok(Boot {
        lines,
        status,
        secs,
    })
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernels_and_tests(pass: &[Planned]) -> Vec<(&str, &[&str])> {
        pass.iter().map(|(k, t)| (k.name(), *t)).collect()
    }

    fn k(name: &str) -> Kernel {
        Kernel::parse(name).unwrap()
    }

    #[test]
    fn the_node_set_up_on_6_1_reboots_into_each_newer_kernel() {
        let all = passes(&["6.1", "5.10", "6.12", "7"].map(k));
        assert_eq!(all.len(), 2, "{all:?}");
        let one = all.iter().find(|p| p[0].0 == k("6.1")).unwrap();
        assert_eq!(
            kernels_and_tests(one),
            [
                ("6.1", PACKAGE_STORY),
                ("6.1", REBOOT),
                ("6.12", REBOOT),
                ("7", REBOOT)
            ]
        );
        let old = all.iter().find(|p| p[0].0 == k("5.10")).unwrap();
        assert_eq!(kernels_and_tests(old), [("5.10", WITHOUT_ENFORCEMENT)]);
    }

    #[test]
    fn a_newer_kernel_alone_sets_up_its_own_node() {
        let p = passes(&[k("7")]);
        assert_eq!(kernels_and_tests(&p[0]), [("7", SET_UP), ("7", REBOOT)]);
        assert!(passes(&[]).is_empty());
    }
}
