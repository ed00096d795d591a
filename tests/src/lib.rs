//! Helpers for the real-kernel tests in `tests/tests/`.
//!
//! These tests need a kernel that enforces project quotas, which the host does
//! not have: `cargo xtask test` boots Debian's kernel under QEMU, mounts the
//! test filesystems in the guest and exports their paths (see
//! `tests/vm/guest-init.sh`). Outside the VM every helper panics with a message
//! that says so, rather than letting a test pass against the wrong kernel.

pub mod attack;
pub mod child;
pub mod dm;
pub mod fixture;
pub mod http;
pub mod nomad;
pub mod nomad_alloc;
pub mod nomad_api;
pub mod nomad_telemetry;
pub mod operator;
pub mod pinned;
pub mod pins;
pub mod prom;
pub mod readme;
pub mod records;
pub mod runbook;
pub mod temp;
pub mod watchdog;
pub mod witness;
pub mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// An environment variable set by the VM runner, or a panic explaining how to
/// get it.
/// Debian's own Python, which every user may run (not a per-user install
/// that may come first on root's PATH).
pub const PYTHON: &str = "/usr/bin/python3";

pub fn vm_env(name: &str) -> String {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => v,
        _ => panic!(
            "{name} is not set: real-kernel tests run inside the VM: use `cargo xtask test` \
             (or `cargo xtask test --vm-only`)"
        ),
    }
}

fn vm_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(vm_env(name));
    assert!(dir.is_dir(), "{name}={} is not a directory", dir.display());
    dir
}

/// True inside the VM that `cargo xtask vm` / `cargo xtask test` boots.
pub fn in_vm() -> bool {
    std::env::var_os("PRJQUOTA_IN_VM").is_some_and(|v| v == "1")
}

/// Root of a fresh XFS mounted with `prjquota` (enforcing).
pub fn xfs_mount() -> PathBuf {
    vm_dir("PRJQUOTA_TEST_XFS")
}

/// Root of a fresh ext4 (`-O quota,project`) mounted with `prjquota`.
pub fn ext4_mount() -> PathBuf {
    vm_dir("PRJQUOTA_TEST_EXT4")
}

/// Root of an XFS mounted WITHOUT project quotas, for the negative tests.
pub fn xfs_noquota_mount() -> PathBuf {
    vm_dir("PRJQUOTA_TEST_XFS_NOQUOTA")
}

/// Path of a workspace binary (`prjquota`, `prjquota-exporter`) built by the
/// runner before the VM boots.
/// The `quota-escape guard` line of `prjquota check --json` for
/// `volumes_dir`, as JSON (`ok`, `warning`, `detail`, `fix`).
pub fn check_guard_line(volumes_dir: &Path) -> serde_json::Value {
    let out = std::process::Command::new(bin("prjquota"))
        .args(["check", "--json", "--volumes-dir"])
        .arg(volumes_dir)
        .output()
        .expect("run prjquota check");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "prjquota check --json: {e}: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    v["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["check"] == "quota-escape guard")
        .cloned()
        .unwrap_or_else(|| panic!("no quota-escape guard line in prjquota check: {v:#}"))
}

pub fn bin(name: &str) -> PathBuf {
    let path = vm_dir("PRJQUOTA_BIN_DIR").join(name);
    assert!(
        path.is_file(),
        "{} does not exist: `cargo xtask test` builds the workspace binaries first",
        path.display()
    );
    path
}

/// A static release binary `cargo xtask test` built as `cargo xtask dist`
/// does (`prjquota`), or like it (`mkdir-plugin`, the timing baseline),
/// when a pass selects the tests that need them.
pub fn static_bin(name: &str) -> PathBuf {
    let path = vm_dir("PRJQUOTA_STATIC_BIN_DIR").join(name);
    assert!(
        path.is_file(),
        "{} does not exist: `cargo xtask test` builds it when a pass selects \
         binary(static_plugin), binary(package) or binary(timing)",
        path.display()
    );
    path
}

/// A new, empty directory under `mount`, unique to this process and call, so
/// that tests running in parallel on one filesystem do not collide.
pub fn scratch_dir(mount: &Path, tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = mount.join(format!("{tag}-{}-{n}", std::process::id()));
    std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    dir
}

/// The `prjquota-exporter` binary built with the `fault-injection` feature:
/// its buffered-write hooks miscount, and `PRJQUOTA_FAULT_GUARD_LSM` makes
/// the guard's LSM programs fail to load.
pub fn fault_exporter() -> PathBuf {
    fault_build("PRJQUOTA_FAULT_EXPORTER")
}

pub fn fault_bin() -> PathBuf {
    fault_build("PRJQUOTA_FAULT_BIN")
}

/// The fault-injection build whose path `cargo xtask test` puts in `var`.
fn fault_build(var: &str) -> PathBuf {
    let path = PathBuf::from(vm_env(var));
    assert!(
        path.is_file(),
        "{} does not exist: `cargo xtask test` builds it with --features fault-injection",
        path.display()
    );
    path
}

/// The middle sample (the upper one of an even count).
pub fn median<T: Copy + PartialOrd>(mut v: Vec<T>) -> T {
    assert!(!v.is_empty(), "median of no samples");
    v.sort_by(|a, b| a.partial_cmp(b).expect("samples are ordered (no NaN)"));
    v[v.len() / 2]
}

/// The running kernel's (major, minor).
pub fn kernel_version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    let mut parts = release.trim().split(['.', '-']);
    let mut next = || {
        parts
            .next()
            .and_then(|p| p.parse().ok())
            .expect("a numeric release")
    };
    (next(), next())
}

/// Asserts that `dir` is a directory of root's with mode 0700, as the
/// plugin makes a volumes directory's registry (`.prjquota`).
pub fn assert_made_as_the_registry(dir: &std::path::Path) {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(dir)
        .unwrap_or_else(|e| panic!("the registry's directory {}: {e}", dir.display()));
    assert!(
        meta.is_dir() && meta.uid() == 0 && meta.mode() & 0o7777 == 0o700,
        "{} is uid {} mode {:o}, not root's 0700 as the plugin makes it",
        dir.display(),
        meta.uid(),
        meta.mode() & 0o7777
    );
}

/// Runs `cmd` with bash; panics with its output unless it succeeds.
pub fn sh(cmd: &str) {
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(cmd)
        .output()
        .expect("run bash");
    assert!(
        out.status.success(),
        "{cmd}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// This thread pinned to one CPU until the value is dropped; a process or
/// thread it starts meanwhile inherits the pin.
///
/// For CPU-time measures under the emulator: the VM's vCPUs share one
/// emulator thread, and the guest's clock runs while a vCPU waits for it,
/// so threads running at once on two vCPUs are each charged the other's
/// turns. On one vCPU, with the other idle, a CPU second is one the
/// emulator spent on the thread.
pub struct OneCpu {
    allowed: nix::sched::CpuSet,
}

impl OneCpu {
    pub fn pin() -> OneCpu {
        use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
        let this_thread = nix::unistd::Pid::from_raw(0);
        let allowed = sched_getaffinity(this_thread).expect("sched_getaffinity");
        let cpu = (0..CpuSet::count())
            .find(|&c| allowed.is_set(c).unwrap_or(false))
            .expect("no CPU in this thread's affinity mask");
        let mut one = CpuSet::new();
        one.set(cpu).expect("a CPU number below CpuSet::count");
        sched_setaffinity(this_thread, &one).unwrap_or_else(|e| panic!("pin to CPU {cpu}: {e}"));
        OneCpu { allowed }
    }
}

impl Drop for OneCpu {
    fn drop(&mut self) {
        let this_thread = nix::unistd::Pid::from_raw(0);
        if let Err(e) = nix::sched::sched_setaffinity(this_thread, &self.allowed) {
            eprintln!("cannot restore this thread's CPU affinity: {e}");
        }
    }
}

/// Runs `f` on each CPU this thread may run on, pinned to one CPU at a
/// time, then restores the thread's affinity. Returns how many CPUs ran it.
/// For the kernel's per-CPU state (an eBPF program's per-CPU cache): a write
/// from each CPU reaches each CPU's copy.
pub fn on_every_cpu(mut f: impl FnMut()) -> u64 {
    use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
    use nix::unistd::Pid;
    let this_thread = Pid::from_raw(0);
    let allowed = sched_getaffinity(this_thread).expect("sched_getaffinity");
    let mut ran = 0;
    for cpu in 0..CpuSet::count() {
        if !allowed.is_set(cpu).unwrap_or(false) {
            continue;
        }
        let mut one = CpuSet::new();
        one.set(cpu).expect("a CPU number below CpuSet::count");
        sched_setaffinity(this_thread, &one).unwrap_or_else(|e| panic!("pin to CPU {cpu}: {e}"));
        f();
        ran += 1;
    }
    sched_setaffinity(this_thread, &allowed).expect("restore the affinity");
    assert!(ran > 0, "no CPU in this thread's affinity mask");
    ran
}
