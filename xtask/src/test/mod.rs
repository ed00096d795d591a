//! `cargo xtask test`: the one test command.
//!
//! 1. `cargo fmt --all --check`
//! 2. `cargo clippy --workspace --all-targets -- -D warnings`
//! 3. `cargo deny check licenses bans` (deny.toml)
//! 4. host pass: `cargo nextest run --workspace --exclude prjquota-vmtests`
//! 5. VM pass: builds the workspace binaries (PRJQUOTA_BIN_DIR), `prjquota`
//!    with `--features fault-injection` (PRJQUOTA_FAULT_BIN) and the
//!    `prjquota-vmtests` test binaries on the host, boots ONE VM with every test filesystem and runs
//!    those binaries there with nextest, reusing the host build
//!    (`--binaries-metadata`/`--cargo-metadata`: no archive, nothing to
//!    extract, the guest reads target/ over the shared read-only root).
//!    When a pass selects `binary(package)` or `binary(static_plugin)`, it
//!    also builds the static release plugin as `cargo xtask dist` does and a
//!    test .deb (see `dist_for_tests`).
//!
//! Ends with each pass's nextest summary line and `N passed, M failed`.

mod budget;
mod kernel_pass;
mod opts;
mod packages;
mod passes;
mod results;
mod systemd_pass;
mod vm_pass;

pub use opts::Opts;
pub use packages::static_mkdir_plugin;

use std::time::Instant;

use anyhow::{bail, Result};

use crate::kernels::Kernel;
use crate::paths::cargo;
use crate::process::{header, run, step};

use self::opts::VM_PACKAGE;
use self::packages::lint_test_packages;
use self::passes::nextest_selection;
use self::results::{pass, Pass};
use self::vm_pass::vm_pass;

pub fn main(args: crate::cli::TestArgs) -> Result<u8> {
    let opts = Opts {
        host: !args.vm_only,
        vm: !args.host_only,
        filter: args.filter,
        vm_threads: args.vm_threads,
        extra: args.extra,
        kernels: args.kernel.map_or_else(|| vec![Kernel::DEFAULT], |k| k.0),
        full: args.full,
        guest_env: Vec::new(),
        vm_timeout: None,
        vm_cpus: args.vm_cpus,
        vm_lanes: args.vm_lanes,
        release_deb: args.release_deb,
    };
    run_opts(&opts)
}

/// Runs the passes `opts` asks for and prints the summary; the exit code.
pub fn run_opts(opts: &Opts) -> Result<u8> {
    if !opts.host && !opts.vm {
        bail!("--host-only and --vm-only exclude each other");
    }

    let started = Instant::now();
    // A caller with its own VM limit (`cargo xtask stress`) keeps it whole.
    if opts.vm_timeout.is_none() {
        crate::deadline::start();
    }
    let mut passes = Vec::new();
    let outcome = run_steps(opts, &mut passes);

    header("Summary");
    for pass in &passes {
        println!(
            "xtask: {} pass ({:.0}s): {} run, {} passed, {} failed",
            pass.name, pass.secs, pass.counts.run, pass.counts.passed, pass.counts.failed
        );
        match &pass.summary {
            Some(line) => println!("{line}"),
            None => println!("    (no nextest summary line)"),
        }
        for p in &pass.problems {
            println!("    {p}");
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
        for t in &pass.failures {
            println!("xtask test:     failed: {t}");
        }
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
        step("cargo deny check licenses bans (deny.toml)", || {
            let deny = crate::deps::cargo_deny();
            if !crate::process::is_executable(&deny) {
                bail!(
                    "{} is missing: run `cargo xtask deps` (it builds cargo-deny)",
                    deny.display()
                );
            }
            run(std::process::Command::new(&deny)
                .current_dir(crate::paths::repo_root())
                .args(["deny", "--locked", "check", "licenses", "bans"]))
        })?;
        header("host tests: cargo nextest run --workspace --exclude prjquota-vmtests");
        let t = Instant::now();
        let mut cmd = cargo();
        cmd.args(["nextest", "run", "--workspace", "--exclude", VM_PACKAGE]);
        cmd.args(nextest_selection(opts, opts.filter.as_deref()));
        println!("$ {}", crate::process::display(&cmd));
        if crate::process::is_executable(&crate::deps::prometheus3_binary()) {
            cmd.env("PRJQUOTA_PROMETHEUS3", crate::deps::prometheus3_binary());
        }
        let tee = crate::process::run_tee(&mut cmd, None)?;
        let secs = t.elapsed().as_secs_f64();
        passes.push(pass(
            "host".into(),
            &tee.lines,
            tee.status.success(),
            opts.filter.is_some(),
            opts.filter.is_none().then_some(false),
            secs,
        ));
        println!("xtask: host tests took {secs:.0}s");
        if opts.filter.is_none() {
            step(
                "lint: lintian and rpmlint on packages staged by dist's code (the static \
                 release plugin, this run's debug exporter)",
                lint_test_packages,
            )?;
        }
    }
    if opts.vm {
        vm_pass(opts, passes)?;
    }
    Ok(())
}
