//! `cargo xtask vm`: boots Debian's own kernel under QEMU with virtme-ng (vng).
//!
//! The guest sees the host's root filesystem read-only (9p), with a writable
//! tmpfs-backed overlay on /tmp. `tests/vm/guest-init.sh` runs first in the
//! guest: it creates and mounts the quota filesystems and exports their paths
//! (PRJQUOTA_TEST_XFS, PRJQUOTA_TEST_EXT4, PRJQUOTA_TEST_XFS_NOQUOTA,
//! PRJQUOTA_IN_VM=1), then runs the command in the host's working directory.
//! KVM does not work on the project's machines: always TCG (`--disable-kvm`).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::kernels::Kernel;
use crate::process::shell_quote;

pub use crate::cli::Fs;

impl Fs {
    fn as_str(self) -> &'static str {
        match self {
            Fs::Xfs => "xfs",
            Fs::Ext4 => "ext4",
            Fs::All => "all",
        }
    }
}

/// Kernel arguments every guest boots with (these and the systemd boots,
/// `crate::systemd`) for the emulator's sake, not the kernel's.
///
/// `norandmaps`: user-space mappings at the same addresses in every
/// process. QEMU 7.2 (Debian 12's) finds a translated block again only at
/// the virtual address it was translated at, so with randomised mappings
/// every exec translates anew all the code it runs, its C library's and a
/// static-pie binary's alike: a cost no hardware has, and most of a short
/// process's time under emulation. With it, a block translated for one
/// process serves every later one: the plugin's, crash and guard tests ran
/// in half the time. Nothing tested depends on where user space is mapped;
/// the kernel's own layout (KASLR) is untouched.
pub const EMULATOR_APPEND: &str = "norandmaps";

pub struct VmOpts {
    pub fs: Fs,
    pub kernel: Kernel,
    /// The VM is killed after this long ($PRJQUOTA_VM_TIMEOUT overrides).
    pub timeout: Duration,
    pub memory: String,
    pub cpus: u32,
    /// Extra environment for the guest command.
    pub env: Vec<(String, String)>,
    /// Host files attached as virtio-scsi disks (`/dev/sda`, … in the guest).
    pub disks: Vec<PathBuf>,
    /// Host directories the guest may write to (the rest is read-only).
    pub rwdirs: Vec<PathBuf>,
    /// Starts every line of the VM's output as it is streamed (not as kept):
    /// set when VMs run side by side.
    pub prefix: String,
}

impl Default for VmOpts {
    fn default() -> Self {
        VmOpts {
            fs: Fs::Xfs,
            kernel: Kernel::DEFAULT,
            timeout: Duration::from_secs(DEFAULT_TIMEOUT_SECS),
            memory: "2G".into(),
            cpus: 2,
            env: Vec::new(),
            disks: Vec::new(),
            rwdirs: Vec::new(),
            prefix: String::new(),
        }
    }
}

/// How a VM run ended, when the VM booted and the guest setup worked.
pub struct VmRun {
    /// Exit status of the guest command.
    pub status: i32,
    /// Everything the guest printed (stdout and stderr, interleaved).
    pub lines: Vec<String>,
}

pub fn main(args: crate::cli::VmArgs) -> Result<u8> {
    let opts = VmOpts {
        fs: args.fs,
        kernel: args.kernel.unwrap_or(Kernel::DEFAULT),
        memory: args.memory,
        cpus: args.cpus,
        disks: args.disk,
        rwdirs: args.rwdir,
        ..VmOpts::default()
    };
    let mut cmd = args.cmd;
    // One argument is a bash command line; several are joined like ssh does.
    let cmd = if cmd.len() == 1 {
        cmd.remove(0)
    } else {
        cmd.join(" ")
    };
    let cwd = std::env::current_dir()?;
    let run = run(&opts, &cmd, &cwd)?;
    Ok(u8::try_from(run.status).unwrap_or(1))
}

fn vng() -> Result<PathBuf> {
    crate::deps::find_vng().context("`vng` (virtme-ng) not found: run `cargo xtask deps`")
}

/// `cargo xtask vm`'s limit; test passes set their own (see crate::test).
const DEFAULT_TIMEOUT_SECS: u64 = 1800;

fn timeout(default: Duration) -> Duration {
    std::env::var("PRJQUOTA_VM_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(default, Duration::from_secs)
}

/// The filesystem the guest keeps its test images on: a sparse host file,
/// formatted here and found in the guest by its label. The images used to
/// live in the guest's /tmp, which is memory: a full suite filled it (ENOSPC,
/// then EIO from the loop devices) and could run the guest out of memory.
/// On a disk, what the tests write costs host disk, freed when the VM ends.
struct ScratchDisk {
    path: PathBuf,
}

/// The label `tests/vm/guest-init.sh` mounts: keep the two in step.
const SCRATCH_LABEL: &str = "prjquota-scratch";
/// Room for every image guest-init makes (under 2 GiB) and what tests add.
const SCRATCH_BYTES: u64 = 8 << 30;

impl ScratchDisk {
    fn create(dir: &Path, unique: &str) -> Result<ScratchDisk> {
        let path = dir.join(format!("scratch-{unique}.img"));
        let _ = std::fs::remove_file(&path);
        std::fs::File::create(&path)
            .and_then(|f| f.set_len(SCRATCH_BYTES))
            .with_context(|| format!("cannot create the VM's scratch disk {}", path.display()))?;
        let disk = ScratchDisk { path };
        // Lazy init keeps mkfs to a fraction of a second and the file sparse.
        let out = Command::new(sbin("mkfs.ext4"))
            .args(["-q", "-F", "-L", SCRATCH_LABEL])
            .args(["-E", "lazy_itable_init=1,lazy_journal_init=1"])
            .arg(&disk.path)
            .output()
            .context("cannot run mkfs.ext4 for the VM's scratch disk (`cargo xtask deps` installs e2fsprogs)")?;
        if !out.status.success() {
            bail!(
                "mkfs.ext4 {} failed: {}",
                disk.path.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(disk)
    }
}

impl ScratchDisk {
    /// The disk as QEMU options of its own rather than vng's `--disk`, which
    /// leaves QEMU's default cache mode: every flush the guest sends (each
    /// fsync in a test) became an fdatasync of the image on the host, so a
    /// test's fsync cost whatever the host's disk takes, and CI's disk is
    /// not ours. The image is thrown away when the VM ends, so what a host
    /// crash would lose does not matter: `cache=unsafe` ignores flushes.
    fn qemu_opts(&self) -> Result<String> {
        let path = self.path.to_string_lossy();
        if path.contains(|c: char| c == ',' || c.is_whitespace()) {
            bail!(
                "the VM's scratch disk path {path} has a comma or a space, which QEMU's \
                 option syntax cannot carry: build in a directory without them"
            );
        }
        Ok(format!(
            "--qemu-opts=-device virtio-scsi-pci,id=pqscsi \
             -drive if=none,id=pqscratch,file={path},format=raw,cache=unsafe \
             -device scsi-hd,bus=pqscsi.0,drive=pqscratch,serial=pqscratch"
        ))
    }
}

/// A name no other VM of this or another xtask uses at the same time: the
/// process ID and a count, as VMs may run side by side in one process.
fn unique_name() -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}-{n}", std::process::id())
}

/// The xtask process that made `name`, if it is a VM's script or scratch
/// disk (`vm-PID-N.sh`, `scratch-PID-N.img`).
fn vm_file_owner(name: &str) -> Option<u32> {
    let rest = name
        .strip_prefix("vm-")
        .and_then(|r| r.strip_suffix(".sh"))
        .or_else(|| {
            name.strip_prefix("scratch-")
                .and_then(|r| r.strip_suffix(".img"))
        })?;
    let (pid, n) = rest.split_once('-')?;
    n.parse::<u32>().ok()?;
    pid.parse().ok()
}

/// Removes the scripts and scratch disks of VMs whose xtask is gone: a
/// killed run cannot remove its own, and a scratch disk holds every block
/// its tests wrote.
fn remove_stale_vm_files(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(vm_file_owner) else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// `name` from PATH, or from /usr/sbin and /sbin, which a non-login root
/// shell's PATH may lack.
fn sbin(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| name.into())
}

impl Drop for ScratchDisk {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Boots the VM, sets up the filesystems, runs `cmd` (a bash command line) in
/// `cwd` with `opts.env`, streaming the output live. An error when the VM did
/// not boot or the guest setup failed; otherwise the guest command's status.
/// The guest kernel panicked before the command finished (its console said
/// so): the error a caller may retry once, saying so, since under an
/// emulated CPU a panic can be the emulator's (see the `test` module).
#[derive(Debug)]
pub struct GuestPanic {
    pub message: String,
    /// What the boot printed until then: the tests it finished.
    pub lines: Vec<String>,
}

impl std::fmt::Display for GuestPanic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for GuestPanic {}

/// The VM reached its limit and was killed: what it printed until then, for
/// the caller to name what was still running.
#[derive(Debug)]
pub struct Killed {
    pub message: String,
    pub lines: Vec<String>,
}

impl std::fmt::Display for Killed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Killed {}

/// Whether the console shows the guest kernel panicking.
fn guest_panicked(lines: &[String]) -> bool {
    lines
        .iter()
        .any(|l| l.contains("Kernel panic - not syncing"))
}

pub fn run(opts: &VmOpts, cmd: &str, cwd: &Path) -> Result<VmRun> {
    let kernel = crate::kernels::to_boot(opts.kernel)?;
    let vng = vng()?;
    let init = crate::paths::repo_root().join("tests/vm/guest-init.sh");

    // The command reaches the guest through the kernel command line, which is
    // short (2 KiB): pass it a script on the shared (read-only) filesystem.
    let dir = crate::paths::target_dir().join("xtask");
    std::fs::create_dir_all(&dir)?;
    remove_stale_vm_files(&dir);
    let unique = unique_name();
    let script = dir.join(format!("vm-{unique}.sh"));
    let mut text = String::from("# written by cargo xtask vm; run in the guest\n");
    // The guest's PATH is vng's; give it the host's too (cargo, nextest, vng's pyenv).
    if let Some(path) = std::env::var_os("PATH") {
        text += &format!("export PATH={}\n", shell_quote(&path.to_string_lossy()));
    }
    for (k, v) in &opts.env {
        text += &format!("export {k}={}\n", shell_quote(v));
    }
    text += &format!(
        "exec bash {} {} {} {}\n",
        shell_quote(&init.to_string_lossy()),
        opts.fs.as_str(),
        shell_quote(&cwd.to_string_lossy()),
        shell_quote(cmd)
    );
    std::fs::write(&script, text)?;
    let scratch = ScratchDisk::create(&dir, &unique)?;

    let verbose = std::env::var_os("PRJQUOTA_VM_VERBOSE").is_some_and(|v| v == "1");
    let mut vng_cmd = Command::new(&vng);
    // vng runs its sibling `virtme-run` from PATH: put the venv's bin first
    // (`cargo xtask deps` installs it in target/venv, never on PATH).
    if let Some(dir) = vng.parent() {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let joined = std::env::join_paths(
            std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(&path)),
        )?;
        vng_cmd.env("PATH", joined);
    }
    vng_cmd
        .arg("-r")
        .arg(&kernel)
        .args(["--disable-kvm", "--memory", &opts.memory])
        .args(["--cpus", &opts.cpus.to_string()])
        // The kernel console always reaches the log, at warning level unless
        // PRJQUOTA_VM_VERBOSE=1: a panic, an OOM kill or a BUG is then there
        // to read when a VM dies (the last kernel appended loglevel wins).
        .arg("--verbose")
        .args(
            (!verbose)
                .then_some(["--append", "loglevel=4"])
                .into_iter()
                .flatten(),
        )
        // The emulated CPUs' TSCs are one host clock, but 5.10 finds them
        // unsynchronised at boot and falls back to the HPET, whose every
        // read the emulator serves as device I/O, which slows every test
        // that reads the clock.
        .args(["--append", "tsc=reliable"])
        .args(["--append", EMULATOR_APPEND])
        // All vCPUs on one emulator thread. With a host thread per vCPU
        // (QEMU 7.2's multi-threaded TCG) a vCPU could run its stale
        // translation of a function the kernel had just patched to attach
        // an eBPF program: `Oops: int3` at `generic_perform_write+0x5` on
        // 6.12 and 7.x, soft lockups at `bpf_lsm_file_ioctl+0x0` and
        // `iomap_dio_complete+0x0` on 6.1, where CI once lost three boots
        // of the full pass in a row. One thread keeps code changes coherent
        // between the vCPUs, and takes one host core whatever their number,
        // so two guests run side by side on two cores.
        .arg("--qemu-opts=-accel tcg,thread=single")
        // An oops leaves its task's locks held and the pass hanging until
        // its VM limit, with nothing named; as a panic it ends the boot at
        // once, with the kernel's last words, and the pass boots again for
        // the tests it had not finished (`crate::test`).
        .args(["--append", "oops=panic"])
        // A guest hung in a soft lockup (a vCPU spinning on the stale
        // breakpoint above, seen on 6.1's two-thread guest) never recovers:
        // as a panic it too ends the boot at once and gets the retry,
        // instead of holding its pass until the limit.
        .args(["--append", "softlockup_panic=1"])
        .args(
            opts.disks
                .iter()
                .flat_map(|d| [OsStr::new("--disk"), d.as_os_str()]),
        )
        .arg(scratch.qemu_opts()?)
        .args(
            opts.rwdirs
                .iter()
                .flat_map(|d| [OsStr::new("--rwdir"), d.as_os_str()]),
        )
        .arg("--")
        .arg(format!("bash {}", shell_quote(&script.to_string_lossy())))
        .current_dir(cwd)
        .stdin(Stdio::null());
    println!(
        "{}xtask vm: booting kernel {} {} (TCG, {} RAM, {} CPUs, fs {})",
        opts.prefix,
        opts.kernel.name(),
        kernel.display(),
        opts.memory,
        opts.cpus,
        opts.fs.as_str()
    );
    println!("{}$ {}", opts.prefix, crate::process::display(&vng_cmd));
    let started = Instant::now();
    let tee =
        crate::process::run_tee_prefixed(&mut vng_cmd, Some(timeout(opts.timeout)), &opts.prefix);
    let _ = std::fs::remove_file(&script);
    let tee = tee?;
    let elapsed = started.elapsed().as_secs_f64();

    let booted = tee
        .lines
        .iter()
        .any(|l| l.starts_with("prjquota-vm: guest up"));
    if let Some(root) = tee
        .lines
        .iter()
        .find_map(|l| l.strip_prefix("prjquota-vm: guest up"))
        .and_then(|l| l.rsplit_once(", root ").map(|(_, fs)| fs.trim()))
        .filter(|fs| *fs != "virtiofs")
    {
        eprintln!(
            "{}xtask vm: WARNING: the guest's root was {root}, not virtiofs: vng found no \
             virtiofsd, so every exec read its files from the host again and the VM ran about \
             three times slower (CI's time limits assume virtio-fs). `cargo xtask deps` builds \
             virtiofsd into target/venv/bin.",
            opts.prefix
        );
    }
    let setup_failed = tee
        .lines
        .iter()
        .find(|l| l.starts_with("prjquota-vm: SETUP FAILED"));
    let exited = tee.lines.iter().rev().find_map(|l| {
        l.strip_prefix("prjquota-vm: command exited with status ")
            .and_then(|s| s.trim().parse::<i32>().ok())
    });
    if tee.timed_out {
        let message = format!(
            "the VM was killed after {elapsed:.0}s (its limit; PRJQUOTA_VM_TIMEOUT=SECS \
             overrides); the kernel's last words:\n{}",
            last_kernel_lines(&tee.lines, 10)
        );
        return Err(anyhow::Error::new(Killed {
            message,
            lines: tee.lines,
        }));
    }
    if !booted {
        bail!(
            "the VM did not boot: vng {} after {elapsed:.0}s, and the guest init script never \
             ran (kernel {}; PRJQUOTA_VM_VERBOSE=1 shows the kernel console)",
            tee.status,
            kernel.display()
        );
    }
    if let Some(line) = setup_failed {
        bail!("guest setup failed, the command did not run: {line}");
    }
    let Some(status) = exited else {
        let message = format!(
            "the VM ended before the guest command finished (vng {}, {elapsed:.0}s): \
             kernel panic, OOM, or the guest was killed; the kernel's last words:\n{}",
            tee.status,
            last_kernel_lines(&tee.lines, 25)
        );
        if guest_panicked(&tee.lines) {
            return Err(anyhow::Error::new(GuestPanic {
                message,
                lines: tee.lines,
            }));
        }
        bail!(message);
    };
    println!(
        "{}xtask vm: guest command exited with status {status} ({elapsed:.0}s wall)",
        opts.prefix
    );
    Ok(VmRun {
        status,
        lines: tee.lines,
    })
}

/// The last `n` kernel console lines (`[   12.345678] …`) of a run.
fn last_kernel_lines(lines: &[String], n: usize) -> String {
    let kernel: Vec<&str> = lines
        .iter()
        .map(|l| l.trim_start())
        .filter(|l| {
            l.strip_prefix('[')
                .and_then(|r| r.split_once(']'))
                .is_some_and(|(t, _)| t.trim().parse::<f64>().is_ok())
        })
        .collect();
    if kernel.is_empty() {
        return "    (none printed)".into();
    }
    kernel[kernel.len().saturating_sub(n)..]
        .iter()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_vm_file_names_the_process_that_made_it() {
        use super::vm_file_owner;
        assert_eq!(vm_file_owner("vm-26842-0.sh"), Some(26842));
        assert_eq!(vm_file_owner("scratch-18573-1.img"), Some(18573));
        // Not ours, or not of this naming: never removed.
        assert_eq!(vm_file_owner("vmtests-binaries.json"), None);
        assert_eq!(vm_file_owner("run-26842"), None);
        assert_eq!(vm_file_owner("scratch-18573.img"), None);
        assert_eq!(vm_file_owner("vm-x-0.sh"), None);
    }

    use super::*;

    /// The guest script gets the names `--fs` takes.
    #[test]
    fn fs_names() {
        use clap::ValueEnum;
        for fs in [Fs::Xfs, Fs::Ext4, Fs::All] {
            assert_eq!(Fs::from_str(fs.as_str(), false), Ok(fs));
        }
        assert!(Fs::from_str("btrfs", false).is_err());
    }

    #[test]
    fn only_a_console_that_says_kernel_panic_is_a_guest_panic() {
        let lines = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(guest_panicked(&lines(&[
            "[  111.97] RIP: 0010:generic_perform_write+0x5/0x290",
            "[  111.98] Kernel panic - not syncing: Fatal exception in interrupt",
        ])));
        assert!(!guest_panicked(&lines(&[
            "[  203.5] Out of memory: Killed process 1 (bash)"
        ])));
    }

    #[test]
    fn the_kernels_last_words_are_the_console_lines_only() {
        let lines: Vec<String> = [
            "prjquota-vm: guest up",
            "[    1.000000] booting",
            "        PASS [   4.024s] prjquota-vmtests::ebpf x",
            "[  203.5] Out of memory: Killed process 1 (bash)",
            "[  203.6] Kernel panic - not syncing: Attempted to kill init!",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            last_kernel_lines(&lines, 2),
            "    [  203.5] Out of memory: Killed process 1 (bash)\n    \
             [  203.6] Kernel panic - not syncing: Attempted to kill init!"
        );
        assert_eq!(last_kernel_lines(&lines[..1], 2), "    (none printed)");
    }
}
