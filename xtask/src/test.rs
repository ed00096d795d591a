//! `cargo xtask test`: the one test command.
//!
//! 1. `cargo fmt --all --check`
//! 2. `cargo clippy --workspace --all-targets -- -D warnings`
//! 3. host pass: `cargo nextest run --workspace --exclude prjquota-vmtests`
//! 4. VM pass: builds the workspace binaries (PRJQUOTA_BIN_DIR), `prjquota`
//!    with `--features fault-injection` (PRJQUOTA_FAULT_BIN) and the
//!    `prjquota-vmtests` test binaries on the host, boots ONE VM with every test filesystem and runs
//!    those binaries there with nextest, reusing the host build
//!    (`--binaries-metadata`/`--cargo-metadata`: no archive, nothing to
//!    extract, the guest reads target/ over the shared read-only root).
//!
//! Ends with each pass's nextest summary line and `N passed, M failed`.

use std::io::IsTerminal;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::vm::{Fs, VmOpts};
use crate::{cargo, header, run, shell_quote, take_value};

const VM_PACKAGE: &str = "prjquota-vmtests";

struct Opts {
    host: bool,
    vm: bool,
    filter: Option<String>,
    vm_threads: u32,
    extra: Vec<String>,
}

/// Counts from one nextest `Summary` line.
#[derive(Debug, Default, PartialEq, Eq)]
struct Counts {
    run: u64,
    passed: u64,
    failed: u64,
}

struct Pass {
    name: &'static str,
    summary: Option<String>,
    counts: Counts,
    ok: bool,
}

pub fn main(args: &[String]) -> Result<u8> {
    let mut opts = Opts {
        host: true,
        vm: true,
        filter: None,
        vm_threads: 2,
        extra: Vec::new(),
    };
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--host-only" => opts.vm = false,
            "--vm-only" => opts.host = false,
            "--" => {
                opts.extra = args[i + 1..].to_vec();
                break;
            }
            _ => {
                if let Some(v) = take_value(args, &mut i, "--filter")? {
                    opts.filter = Some(v);
                } else if let Some(v) = take_value(args, &mut i, "--vm-threads")? {
                    opts.vm_threads = v.parse().context("--vm-threads")?;
                } else {
                    bail!("test: unknown argument `{}`", args[i]);
                }
            }
        }
        i += 1;
    }
    if !opts.host && !opts.vm {
        bail!("--host-only and --vm-only exclude each other");
    }

    let started = Instant::now();
    let mut passes = Vec::new();
    let outcome = run_steps(&opts, &mut passes);

    header("Summary");
    for pass in &passes {
        println!("xtask: {} pass:", pass.name);
        match &pass.summary {
            Some(line) => println!("{line}"),
            None => println!("    (no nextest summary line)"),
        }
    }
    let passed: u64 = passes.iter().map(|p| p.counts.passed).sum();
    let failed: u64 = passes.iter().map(|p| p.counts.failed).sum();
    let all_ok = outcome.is_ok() && passes.iter().all(|p| p.ok);
    if let Err(e) = &outcome {
        println!("xtask test: FAILED: {e:#}");
    }
    for pass in passes.iter().filter(|p| !p.ok) {
        println!("xtask test: FAILED: {} pass", pass.name);
    }
    println!(
        "xtask test: {} in {:.0}s",
        if all_ok { "ok" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    println!("{passed} passed, {failed} failed");
    Ok(if all_ok { 0 } else { 1 })
}

/// Runs the steps in order, pushing each test pass's result. Stops at a
/// failing fmt/clippy/build step; a failing host pass still lets the VM pass run.
fn run_steps(opts: &Opts, passes: &mut Vec<Pass>) -> Result<()> {
    if opts.host {
        step("cargo fmt --all --check", || {
            run(cargo().args(["fmt", "--all", "--check"]))
        })?;
        step(
            "cargo clippy --workspace --all-targets -- -D warnings",
            || {
                run(cargo().args([
                    "clippy",
                    "--workspace",
                    "--all-targets",
                    "--",
                    "-D",
                    "warnings",
                ]))
            },
        )?;
        header("host tests: cargo nextest run --workspace --exclude prjquota-vmtests");
        let t = Instant::now();
        let mut cmd = cargo();
        cmd.args(["nextest", "run", "--workspace", "--exclude", VM_PACKAGE]);
        cmd.args(nextest_selection(opts));
        println!("$ {}", crate::display(&cmd));
        let tee = crate::run_tee(&mut cmd, None)?;
        passes.push(pass("host", &tee.lines, tee.status.success(), opts));
        println!("xtask: host tests took {:.0}s", t.elapsed().as_secs_f64());
    }
    if opts.vm {
        vm_pass(opts, passes)?;
    }
    Ok(())
}

fn step(title: &str, f: impl FnOnce() -> Result<()>) -> Result<()> {
    header(title);
    let t = Instant::now();
    f()?;
    println!("xtask: ok in {:.0}s", t.elapsed().as_secs_f64());
    Ok(())
}

/// Nextest arguments that select tests: the filter, `--no-tests`, the extras.
/// `target/xtask/run-<pid>`: this run's copies of the binaries, removed when
/// the run ends; those of runs that died are removed by the next one.
struct RunDir(std::path::PathBuf);

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
fn copy_executables(from: &std::path::Path, to: &std::path::Path) -> Result<()> {
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

fn nextest_selection(opts: &Opts) -> Vec<String> {
    // Every test runs even after a failure: a VM boot is too dear to waste.
    let mut args = vec!["--no-fail-fast".to_string()];
    // Without a filter, a pass that finds no test is a broken pass.
    let no_tests = if opts.filter.is_some() {
        "warn"
    } else {
        "fail"
    };
    args.push(format!("--no-tests={no_tests}"));
    if let Some(f) = &opts.filter {
        args.push("-E".into());
        args.push(f.clone());
    }
    args.extend(opts.extra.iter().cloned());
    args
}

fn pass(name: &'static str, lines: &[String], exit_ok: bool, opts: &Opts) -> Pass {
    let summary = lines
        .iter()
        .rev()
        .find(|l| l.trim_start().starts_with("Summary [") && l.contains(" run: "))
        .cloned();
    let counts = summary
        .as_deref()
        .and_then(parse_summary)
        .unwrap_or_default();
    let ran_some = counts.run > 0 || opts.filter.is_some();
    Pass {
        name,
        ok: exit_ok && summary.is_some() && counts.failed == 0 && ran_some,
        summary,
        counts,
    }
}

/// Parses nextest's closing line, e.g.
/// `Summary [   1.234s] 5 tests run: 4 passed (1 slow), 1 failed, 2 skipped`
/// (or `3/5 tests run: ...` when cancelled).
fn parse_summary(line: &str) -> Option<Counts> {
    let after = line.split_once("] ")?.1;
    let (run_part, results) = after.split_once(" run: ")?;
    let run_count = run_part.split_whitespace().next()?;
    let run: u64 = run_count.split('/').next()?.parse().ok()?;
    let mut counts = Counts {
        run,
        ..Counts::default()
    };
    for item in results.split(", ") {
        let (n, what) = item.trim().split_once(' ')?;
        let n: u64 = n.parse().ok()?;
        let what = what.split(" (").next()?.trim();
        match what {
            "passed" => counts.passed += n,
            "skipped" | "leaky" | "flaky" | "slow" => {}
            // failed, timed out, exec fail, ...
            _ => counts.failed += n,
        }
    }
    Some(counts)
}

fn vm_pass(opts: &Opts, passes: &mut Vec<Pass>) -> Result<()> {
    let root = crate::repo_root();
    let target = crate::target_dir();
    let meta_dir = target.join("xtask");
    std::fs::create_dir_all(&meta_dir)?;

    // The guest runs copies of the binaries private to this run: every build
    // (another `cargo xtask test`, the feature flip below) replaces the files
    // in target/debug, and a guest executing one over 9p while that happens
    // dies of SIGSEGV (seen: a stress run killed by a build next to it).
    let run_dir = RunDir::new(&meta_dir)?;
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

    let nextest = crate::which("cargo-nextest")
        .or_else(|| {
            let home = std::env::var_os("CARGO_HOME")
                .map(std::path::PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cargo"))
                })?;
            Some(home.join("bin/cargo-nextest")).filter(|p| crate::is_executable(p))
        })
        .context("cargo-nextest not found: run `cargo xtask deps`")?;

    let color = if std::io::stdout().is_terminal() {
        "always"
    } else {
        "never"
    };
    let mut guest: Vec<String> = vec![
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
    ];
    guest.extend(nextest_selection(opts));
    let guest_cmd = guest
        .iter()
        .map(|a| shell_quote(a))
        .collect::<Vec<_>>()
        .join(" ");

    header("VM tests: prjquota-vmtests in one VM boot (--fs all)");
    let t = Instant::now();
    let vm_opts = VmOpts {
        fs: Fs::All,
        env: vec![
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
        ]
        .into_iter()
        // `cargo xtask stress` sets the first two; a developer may set any.
        .chain(
            [
                "PRJQUOTA_STRESS_SECS",
                "PRJQUOTA_STRESS_SEED",
                "PRJQUOTA_CHURN_VOLUMES",
            ]
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v))),
        )
        .collect(),
        ..VmOpts::default()
    };
    let result = crate::vm::run(&vm_opts, &guest_cmd, &root);
    println!("xtask: VM pass took {:.0}s", t.elapsed().as_secs_f64());
    let run = result?;
    passes.push(pass("vm", &run.lines, run.status == 0, opts));
    Ok(())
}

/// Runs `cmd` (stderr to ours) and writes its stdout to `path`.
fn write_stdout(cmd: &mut Command, path: &std::path::Path) -> Result<()> {
    println!("$ {} > {}", crate::display(cmd), path.display());
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", crate::display(cmd)))?;
    if !out.status.success() {
        bail!("`{}` failed ({})", crate::display(cmd), out.status);
    }
    std::fs::write(path, &out.stdout)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries() {
        let c = |run, passed, failed| Counts {
            run,
            passed,
            failed,
        };
        assert_eq!(
            parse_summary("     Summary [   0.012s] 3 tests run: 3 passed, 0 skipped"),
            Some(c(3, 3, 0))
        );
        assert_eq!(
            parse_summary("Summary [   1.2s] 1 test run: 0 passed, 1 failed, 0 skipped"),
            Some(c(1, 0, 1))
        );
        assert_eq!(
            parse_summary("Summary [ 9.0s] 3/5 tests run: 1 passed (1 slow), 1 failed, 1 timed out, 2 skipped"),
            Some(c(3, 1, 2))
        );
        assert_eq!(parse_summary("Summary [ 0.0s] nonsense"), None);
    }
}
