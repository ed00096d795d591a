//! The VM passes: the builds the guests run (this run's copies), then one
//! boot per kernel and per systemd pass, two at a time, longest first.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::kernels::Kernel;
use crate::paths::cargo;
use crate::process::{run, step};
use crate::selection;

use super::budget::VM_LANES;
use super::kernel_pass::KernelJob;
use super::opts::{Opts, ALLOC_DIRS, CHURN_VOLUMES, STORM_VOLUMES, VM_PACKAGE};
use super::packages::{dist_for_tests, newer_rpm, test_repos, TestDist, DIST_BINARIES};
use super::passes::{lists_any, pass_filter, selects_any, systemd_kernels};
use super::results::Pass;
use super::systemd_pass::{systemd_pass, SystemdJob};

/// `target/xtask/run-<pid>`: this run's copies of the binaries, removed when
/// the run ends; those of runs that died are removed by the next one.
pub(super) struct RunDir(std::path::PathBuf);

impl RunDir {
    fn new(meta_dir: &std::path::Path) -> Result<RunDir> {
        for e in std::fs::read_dir(meta_dir)?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(pid) = name.strip_prefix("run-") else {
                continue;
            };
            if !std::path::Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        let dir = meta_dir.join(format!("run-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        Ok(RunDir(dir))
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Copies the executables directly in `from` (cargo's uplifted binaries)
/// into `to`.
pub(super) fn copy_executables(from: &std::path::Path, to: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)?.flatten() {
        let meta = e.metadata()?;
        if meta.is_file() && meta.permissions().mode() & 0o100 != 0 {
            std::fs::copy(e.path(), to.join(e.file_name()))
                .with_context(|| format!("cannot copy {} for the VM", e.path().display()))?;
        }
    }
    Ok(())
}

/// What the guests run, built on the host: this run's copies of the
/// binaries, the fault-injection builds, and nextest's listing of the
/// real-kernel test binaries.
pub(super) struct GuestBuild {
    /// The workspace's executables (PRJQUOTA_BIN_DIR).
    pub(super) bin_dir: PathBuf,
    pub(super) fault_bin: PathBuf,
    pub(super) fault_exporter: PathBuf,
    pub(super) binaries_json: PathBuf,
    pub(super) cargo_json: PathBuf,
}

/// Builds what the guests run into `run_dir`, and the listing of the
/// suite's binaries into `meta_dir`; refuses a test binary no selection
/// places.
fn build_for_guests(run_dir: &RunDir, meta_dir: &Path) -> Result<GuestBuild> {
    let target = crate::paths::target_dir();
    // The crash tests run `prjquota` built with `fault-injection`. Cargo keeps
    // both builds' artifacts, so flipping the feature recompiles nothing the
    // second time; the normal build, last, puts the plain binary back in place.
    let fault_bin = run_dir.0.join("fault-injection").join("prjquota");
    let built = target.join("debug");
    let bin_dir = run_dir.0.join("bin");
    step("build: prjquota --features fault-injection", || {
        run(cargo()
            .args(["build", "-p", "prjquota", "--bin", "prjquota"])
            .args(["--features", "fault-injection"]))?;
        std::fs::create_dir_all(fault_bin.parent().unwrap())?;
        std::fs::copy(built.join("prjquota"), &fault_bin).with_context(|| {
            format!(
                "cannot copy the fault-injection build to {}",
                fault_bin.display()
            )
        })?;
        Ok(())
    })?;
    // The exporter whose write-telemetry programs read a wrong return value:
    // its start-up self-test must fail (tests/tests/exporter_ebpf.rs).
    let fault_exporter = run_dir.0.join("fault-injection").join("prjquota-exporter");
    step(
        "build: prjquota-exporter --features fault-injection",
        || {
            run(cargo()
                .args([
                    "build",
                    "-p",
                    "prjquota-exporter",
                    "--bin",
                    "prjquota-exporter",
                ])
                .args(["--features", "fault-injection"]))?;
            std::fs::copy(built.join("prjquota-exporter"), &fault_exporter).with_context(|| {
                format!(
                    "cannot copy the fault-injection exporter to {}",
                    fault_exporter.display()
                )
            })?;
            Ok(())
        },
    )?;
    step("build: cargo build --workspace --bins", || {
        run(cargo().args(["build", "--workspace", "--bins"]))?;
        if std::fs::read(built.join("prjquota"))? == std::fs::read(&fault_bin)? {
            bail!("target/debug/prjquota is still the fault-injection build");
        }
        if std::fs::read(built.join("prjquota-exporter"))? == std::fs::read(&fault_exporter)? {
            bail!("target/debug/prjquota-exporter is still the fault-injection build");
        }
        copy_executables(&built, &bin_dir)
    })?;

    let binaries_json = meta_dir.join("vmtests-binaries.json");
    let cargo_json = meta_dir.join("vmtests-cargo-metadata.json");
    step(
        "build the real-kernel tests: cargo nextest list -p prjquota-vmtests",
        || {
            let mut cmd = cargo();
            cmd.args(["nextest", "list", "-p", VM_PACKAGE]).args([
                "--list-type",
                "binaries-only",
                "--message-format",
                "json",
            ]);
            write_stdout(&mut cmd, &binaries_json)?;
            let mut cmd = cargo();
            cmd.args([
                "metadata",
                "--format-version",
                "1",
                "--all-features",
                "--no-deps",
            ]);
            write_stdout(&mut cmd, &cargo_json)
        },
    )?;
    // A test binary no selection places would run on the default kernel
    // only, or nowhere, unseen: stop before any boot.
    let listed: serde_json::Value = serde_json::from_slice(&std::fs::read(&binaries_json)?)
        .with_context(|| format!("{} is not JSON", binaries_json.display()))?;
    if let Some(bins) = listed["rust-binaries"].as_object() {
        selection::check_listed(
            bins.iter()
                .filter(|(_, b)| b["kind"] == "test")
                .map(|(id, _)| id.as_str()),
        )?;
    }

    Ok(GuestBuild {
        bin_dir,
        fault_bin,
        fault_exporter,
        binaries_json,
        cargo_json,
    })
}

/// The guest's nextest command up to the selection: the host's build,
/// reused through its metadata.
fn guest_nextest(opts: &Opts, built: &GuestBuild) -> Result<Vec<String>> {
    let (root, target) = (crate::paths::repo_root(), crate::paths::target_dir());
    let GuestBuild {
        binaries_json,
        cargo_json,
        ..
    } = built;
    let nextest = crate::process::which("cargo-nextest")
        .or_else(|| {
            let home = std::env::var_os("CARGO_HOME")
                .map(std::path::PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cargo"))
                })?;
            Some(home.join("bin/cargo-nextest")).filter(|p| crate::process::is_executable(p))
        })
        .context("cargo-nextest not found: run `cargo xtask deps`")?;

    let color = if std::io::stdout().is_terminal() {
        "always"
    } else {
        "never"
    };
    Ok(vec![
        nextest.to_string_lossy().into_owned(),
        "nextest".into(),
        "run".into(),
        "--binaries-metadata".into(),
        binaries_json.to_string_lossy().into_owned(),
        "--cargo-metadata".into(),
        cargo_json.to_string_lossy().into_owned(),
        "--workspace-remap".into(),
        root.to_string_lossy().into_owned(),
        "--target-dir-remap".into(),
        target.to_string_lossy().into_owned(),
        "--test-threads".into(),
        opts.vm_threads.to_string(),
        // The guest console is a tty to nextest: no progress bar on it.
        "--show-progress=none".into(),
        format!("--color={color}"),
    ])
}

/// The guest tests' environment: this run's binaries and packages, the
/// CI sizes, and the caller's `guest_env` last.
fn guest_env(
    opts: &Opts,
    built: &GuestBuild,
    dist: Option<&TestDist>,
    plugin_tests: &Path,
) -> Vec<(String, String)> {
    let GuestBuild {
        bin_dir,
        fault_bin,
        fault_exporter,
        ..
    } = built;
    // Only what xtask means reaches the guest: a variable left in the
    // caller's shell (PRJQUOTA_STRESS_SECS=0 ran zero stress rounds and
    // passed) must not change what the tests do.
    let mut env: Vec<(String, String)> = vec![
        (
            "PRJQUOTA_BIN_DIR".into(),
            bin_dir.to_string_lossy().into_owned(),
        ),
        (
            "PRJQUOTA_FAULT_BIN".into(),
            fault_bin.to_string_lossy().into_owned(),
        ),
        (
            "PRJQUOTA_FAULT_EXPORTER".into(),
            fault_exporter.to_string_lossy().into_owned(),
        ),
        ("PRJQUOTA_CHURN_VOLUMES".into(), CHURN_VOLUMES.into()),
        ("PRJQUOTA_STORM_VOLUMES".into(), STORM_VOLUMES.into()),
        ("PRJQUOTA_ALLOC_DIRS".into(), ALLOC_DIRS.into()),
    ];
    if let Some(d) = dist {
        env.push(("PRJQUOTA_DEB".into(), d.deb.to_string_lossy().into_owned()));
        env.push(("PRJQUOTA_RPM".into(), d.rpm.to_string_lossy().into_owned()));
        env.push((
            "PRJQUOTA_DEB_BINS".into(),
            d.deb_bins.to_string_lossy().into_owned(),
        ));
        env.push((
            "PRJQUOTA_STATIC_BIN_DIR".into(),
            d.static_dir.to_string_lossy().into_owned(),
        ));
        env.push((
            "PRJQUOTA_PLUGIN_TESTS".into(),
            plugin_tests.to_string_lossy().into_owned(),
        ));
    }
    if crate::process::is_executable(&crate::deps::prometheus3_binary()) {
        env.push((
            "PRJQUOTA_PROMETHEUS3".into(),
            crate::deps::prometheus3_binary()
                .to_string_lossy()
                .into_owned(),
        ));
    }
    for (k, v) in &opts.guest_env {
        env.retain(|(e, _)| e != k);
        env.push((k.clone(), v.clone()));
    }

    env
}

pub(super) fn vm_pass(opts: &Opts, passes: &mut Vec<Pass>) -> Result<()> {
    let root = crate::paths::repo_root();
    let target = crate::paths::target_dir();
    let meta_dir = target.join("xtask");
    std::fs::create_dir_all(&meta_dir)?;

    // The guest runs copies of the binaries private to this run: every build
    // (another `cargo xtask test`, the feature flip below) replaces the files
    // in target/debug, and a guest executing one over 9p while that happens
    // dies of SIGSEGV (seen: a stress run killed by a build next to it).
    let run_dir = RunDir::new(&meta_dir)?;
    let built = build_for_guests(&run_dir, &meta_dir)?;
    let GuestBuild {
        bin_dir,
        binaries_json,
        ..
    } = &built;

    // The package and static-plugin tests need a .deb and the static
    // release plugin; built only when a pass selects one of them.
    let systemd_kernels = systemd_kernels(opts)?;
    let dist = if !systemd_kernels.is_empty() || selects_any(opts, DIST_BINARIES)? {
        let mut made = None;
        let title = if opts.release_deb {
            "build: cargo xtask dist (--release-deb: the .deb and the static binaries, as released)"
        } else {
            "build: the static release plugin (as `cargo xtask dist` builds it) and a TEST .deb \
             (dist's layout, with that plugin and this run's debug exporter)"
        };
        step(title, || {
            made = Some(dist_for_tests(opts, &root, &run_dir.0, bin_dir)?);
            Ok(())
        })?;
        made
    } else {
        None
    };
    let plugin_tests = rust_binary_path(binaries_json, &format!("{VM_PACKAGE}::plugin"))?;

    let base = guest_nextest(opts, &built)?;

    let env = guest_env(opts, &built, dist.as_ref(), &plugin_tests);

    // A --filter of the systemd pass's test alone boots no vng guest.
    let only_systemd = match &opts.filter {
        Some(f) => !lists_any(&format!("({f}) - binary(systemd)"))?,
        None => false,
    };
    let kernels = if only_systemd {
        &[][..]
    } else {
        &opts.kernels[..]
    };
    let systemd = match &dist {
        Some(d) if !systemd_kernels.is_empty() => {
            let newer_rpm = newer_rpm(d)?;
            let repos = test_repos(d, &newer_rpm)?;
            Some(SystemdJob {
                test_bin: rust_binary_path(binaries_json, &format!("{VM_PACKAGE}::systemd"))?,
                deb: d.deb.clone(),
                rpm: d.rpm.clone(),
                newer_rpm,
                repos,
                attr_act: bin_dir.join("attr-act"),
                passes: crate::systemd::passes(&systemd_kernels),
            })
        }
        None if !systemd_kernels.is_empty() => {
            bail!("the systemd pass needs the .deb (built above)")
        }
        _ => None,
    };
    let results = std::sync::Mutex::new(Vec::new());
    let systemd_leads: Vec<Kernel> = systemd
        .iter()
        .flat_map(|sd| sd.passes.iter().map(|p| p[0].0))
        .collect();
    let full = |k| pass_filter(opts, k).1;
    let (boots, lanes) = vm_boots(kernels, &systemd_leads, full, opts.vm_lanes);
    // One VM boot per kernel (or one systemd pass); `lanes` of them at
    // once, each taken by the first lane that is free, in the order
    // given (the full pass first: it is the longest).
    let lanes = lanes.clamp(1, boots.len().max(1) as u32);
    let queue = std::sync::Mutex::new(boots.into_iter());
    let job = KernelJob {
        opts,
        base: &base,
        env: &env,
        root: &root,
        side_by_side: lanes > 1,
    };
    std::thread::scope(|s| {
        for _ in 0..lanes {
            s.spawn(|| loop {
                let Some((i, what)) = queue.lock().unwrap().next() else {
                    break;
                };
                let pass = match (what, &systemd) {
                    (Boot::Suite(kernel), _) => job.run(kernel),
                    (Boot::Systemd(kernel), Some(sd)) => {
                        let pass = sd
                            .passes
                            .iter()
                            .find(|p| p[0].0 == kernel)
                            .expect("a systemd pass leads with each of its kernels");
                        systemd_pass(pass, sd)
                    }
                    (Boot::Systemd(_), None) => unreachable!("systemd boots need the .deb"),
                };
                results.lock().unwrap().push((i, pass));
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|(i, _)| *i);
    passes.extend(results.into_iter().map(|(_, p)| p));
    Ok(())
}

/// One VM's work: a kernel's pass of prjquota-vmtests, or a systemd pass
/// (by the kernel it boots first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Boot {
    Suite(Kernel),
    Systemd(Kernel),
}

/// The boots, each with its place in the report (the systemd passes after
/// every suite), in the order the lanes take them, and how many VMs run at
/// once: `lanes` when given, else [`VM_LANES`]. Longest first, so that the
/// boot left for a lane another frees is a short one: the full suite, the
/// systemd passes (6.1's boots the node four times), then the other
/// passes by their rows' `boot_order`.
pub(super) fn vm_boots(
    kernels: &[Kernel],
    systemd: &[Kernel],
    full: impl Fn(Kernel) -> bool,
    lanes: Option<u32>,
) -> (Vec<(usize, Boot)>, u32) {
    let mut all: Vec<_> = kernels
        .iter()
        .map(|k| Boot::Suite(*k))
        .chain(systemd.iter().map(|k| Boot::Systemd(*k)))
        .enumerate()
        .collect();
    all.sort_by_key(|(_, b)| match b {
        Boot::Suite(k) if full(*k) => (0, 0),
        Boot::Systemd(_) => (1, 0),
        Boot::Suite(k) => (2, k.row().boot_order),
    });
    (all, lanes.unwrap_or(VM_LANES))
}

/// A test binary's path from `cargo nextest list --list-type binaries-only
/// --message-format json` output.
pub(super) fn rust_binary_path(
    binaries_json: &std::path::Path,
    id: &str,
) -> Result<std::path::PathBuf> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(binaries_json)?)
        .with_context(|| format!("{} is not JSON", binaries_json.display()))?;
    v["rust-binaries"][id]["binary-path"]
        .as_str()
        .map(std::path::PathBuf::from)
        .with_context(|| format!("{} lists no test binary {id}", binaries_json.display()))
}

/// Runs `cmd` (stderr to ours) and writes its stdout to `path`.
pub(super) fn write_stdout(cmd: &mut Command, path: &std::path::Path) -> Result<()> {
    println!("$ {} > {}", crate::process::display(cmd), path.display());
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", crate::process::display(cmd)))?;
    if !out.status.success() {
        bail!("`{}` failed ({})", crate::process::display(cmd), out.status);
    }
    std::fs::write(path, &out.stdout)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Kernel;

    fn k(name: &str) -> Kernel {
        Kernel::parse(name).unwrap()
    }

    #[test]
    fn the_full_pass_boots_first_and_two_vms_run_at_once() {
        let full = |k| k == Kernel::DEFAULT;
        let four = ["6.1", "5.10", "6.12", "7"].map(k);
        let (boots, lanes) = vm_boots(&four, &[k("6.1"), k("7")], full, None);
        assert_eq!(lanes, VM_LANES);
        assert_eq!(
            boots.iter().map(|(_, b)| *b).collect::<Vec<_>>(),
            vec![
                Boot::Suite(k("6.1")),
                Boot::Systemd(k("6.1")),
                Boot::Systemd(k("7")),
                Boot::Suite(k("6.12")),
                Boot::Suite(k("7")),
                Boot::Suite(k("5.10")),
            ]
        );
        // Each keeps its place in the report (suites, then systemd passes).
        assert_eq!(
            boots.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            vec![0, 4, 5, 2, 3, 1]
        );
        // --vm-lanes N: N at a time.
        assert_eq!(vm_boots(&four, &[], full, Some(1)).1, 1);
    }
}
