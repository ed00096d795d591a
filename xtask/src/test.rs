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

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::kernels::{Kernel, VmPass};
use crate::paths::cargo;
use crate::process::{header, run, shell_quote};
use crate::selection;
use crate::vm::{Fs, VmOpts};

const VM_PACKAGE: &str = "prjquota-vmtests";

pub struct Opts {
    pub host: bool,
    pub vm: bool,
    pub filter: Option<String>,
    pub vm_threads: u32,
    pub extra: Vec<String>,
    /// The kernels the VM passes boot, in order.
    pub kernels: Vec<Kernel>,
    /// Run the full suite on every kernel, not the compatibility selection.
    pub full: bool,
    /// What the guest tests get beyond the fixed variables (stress settings).
    pub guest_env: Vec<(String, String)>,
    /// The VM limit per pass, when the pass's default does not fit.
    pub vm_timeout: Option<Duration>,
    /// Virtual CPUs per VM, when the default (two; one for a compatibility
    /// pass beside another VM) does not fit.
    pub vm_cpus: Option<u32>,
    /// How many VMs run at once (`DEFAULT_VM_LANES` when not given).
    pub vm_lanes: Option<u32>,
    /// The package tests install the release .deb of `cargo xtask dist`
    /// (minutes of release build cold), not the test .deb.
    pub release_deb: bool,
}

/// What a pass on `kernel` runs without a `--filter`: (filter, is the full
/// suite). `full`: `--full`, or the kernel's own pass is the full suite.
fn pass_selection(kernel: Kernel, full: bool) -> (&'static str, bool) {
    match (kernel.row().pass, full) {
        (VmPass::Only(f), _) => (f, false),
        (VmPass::Full, _) | (VmPass::Compat(_), true) => (selection::FULL, true),
        (VmPass::Compat(f), false) => (f, false),
    }
}

/// Volumes the exporter churn test creates in `cargo xtask test` (CI);
/// `cargo xtask stress` runs the 10,000-volume soak. 400 still turn its 64
/// live volumes over six times; its RSS bound (16 MiB) then catches state
/// leaked at 40 KiB per volume rather than 16. 1,000 took 323 to 397 s of
/// the full pass, its longest test by three times.
pub const CHURN_VOLUMES: &str = "400";

/// Volumes of the plugin's restore storm in `cargo xtask test` (CI): 100
/// processes at once already contend for every lock; `cargo xtask stress`
/// runs 1,000. A storm of 200 took five minutes per filesystem of the full
/// pass under emulation and starved the tests beside it.
pub const STORM_VOLUMES: &str = "100";

/// Directories of the big allocation the walk's budget test makes in
/// `cargo xtask test` (CI); `cargo xtask stress` makes a million.
pub const ALLOC_DIRS: &str = "20000";

/// CI gives a run 90 minutes on 2 cores, and a cold run should stay under
/// 45. The full pass on 6.1 gets 35 minutes and each compatibility pass
/// 20, room to spare over what they take beside another VM on one core
/// each ([`VM_LANES`]). A guest of one CPU (`--vm-cpus 1`) gets 20 or 45
/// minutes. Each systemd boot gets 20 (xtask/src/systemd.rs). A pass that
/// hits its limit fails the run.
///
/// These limits catch one hung pass; together they are more than CI has.
/// The run's deadline (xtask/src/deadline.rs) cuts every VM's limit to what
/// is left of its 80 minutes, so a run slower than planned still ends with
/// the name of the pass it was in. Every single limit fits the run after
/// the build and the host pass.
const CI_BUDGET_SECS: u64 = 90 * 60;
const BUILD_AND_HOST_SECS: u64 = 15 * 60;
const FULL_PASS_LIMIT_SECS: u64 = 35 * 60;
const COMPAT_PASS_LIMIT_SECS: u64 = 20 * 60;
const FULL_PASS_ONE_CPU_LIMIT_SECS: u64 = 45 * 60;
const COMPAT_PASS_ONE_CPU_LIMIT_SECS: u64 = 20 * 60;
/// A cold `cargo xtask deps`, which CI runs before the test.
const DEPS_COLD_SECS: u64 = 10 * 60;
const _: () = assert!(crate::deadline::RUN_SECS + DEPS_COLD_SECS <= CI_BUDGET_SECS);
const _: () = assert!(
    BUILD_AND_HOST_SECS
        + max(
            max(FULL_PASS_LIMIT_SECS, FULL_PASS_ONE_CPU_LIMIT_SECS),
            max(
                COMPAT_PASS_ONE_CPU_LIMIT_SECS,
                crate::systemd::BOOT_LIMIT_SECS
            )
        )
        <= crate::deadline::RUN_SECS
);

const fn max(a: u64, b: u64) -> u64 {
    if a > b {
        a
    } else {
        b
    }
}

/// How many VMs boot at once unless `--vm-lanes` says: every guest runs
/// its vCPUs on one emulator thread (`crate::vm::run`), a host core, so a
/// 2-core machine runs two, each keeping two CPUs (one CPU is not enough
/// for the full pass: its timing ratios went over their bounds).
const VM_LANES: u32 = 2;

/// A pass's VM limit: what its selection and its CPUs allow (see above).
fn pass_limit_secs(compat: bool, cpus: u32) -> u64 {
    match (compat, cpus >= 2) {
        (true, true) => COMPAT_PASS_LIMIT_SECS,
        (false, true) => FULL_PASS_LIMIT_SECS,
        (true, false) => COMPAT_PASS_ONE_CPU_LIMIT_SECS,
        (false, false) => FULL_PASS_ONE_CPU_LIMIT_SECS,
    }
}

/// The committed minimum of tests per test binary (see the file).
const FLOORS: &str = include_str!("../test-floors.txt");

/// Counts from one nextest `Summary` line.
#[derive(Debug, Default, PartialEq, Eq)]
struct Counts {
    run: u64,
    passed: u64,
    failed: u64,
}

struct Pass {
    name: String,
    summary: Option<String>,
    counts: Counts,
    ok: bool,
    secs: f64,
    /// Why the pass failed beyond its test results: binaries below their
    /// floor, a VM that did not boot or was killed.
    problems: Vec<String>,
    /// The tests nextest reported failed, timed out or killed, by name.
    failures: Vec<String>,
}

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

fn nextest_selection(opts: &Opts, filter: Option<&str>) -> Vec<String> {
    // Every test runs even after a failure: a VM boot is too dear to waste.
    let mut args = vec!["--no-fail-fast".to_string()];
    // Without a filter of the user's, a pass that finds no test is a broken pass.
    let no_tests = if opts.filter.is_some() {
        "warn"
    } else {
        "fail"
    };
    args.push(format!("--no-tests={no_tests}"));
    if let Some(f) = filter {
        args.push("-E".into());
        args.push(f.to_string());
    }
    args.extend(opts.extra.iter().cloned());
    args
}

/// A pass's result from its output. `filtered`: the user chose the tests
/// (none may match); `floors`: hold each binary to its committed minimum.
fn pass(
    name: String,
    lines: &[String],
    exit_ok: bool,
    filtered: bool,
    floors: Option<bool>,
    secs: f64,
) -> Pass {
    let summary = lines
        .iter()
        .rev()
        .find(|l| l.trim_start().starts_with("Summary [") && l.contains(" run: "))
        .cloned();
    let counts = summary
        .as_deref()
        .and_then(parse_summary)
        .unwrap_or_default();
    let ran_some = counts.run > 0 || filtered;
    let problems = match floors {
        Some(vm) => below_floor(&parse_floors(FLOORS), &tests_per_binary(lines), vm),
        None => Vec::new(),
    };
    Pass {
        name,
        ok: exit_ok && summary.is_some() && counts.failed == 0 && ran_some && problems.is_empty(),
        summary,
        counts,
        secs,
        problems,
        failures: failed_tests(lines),
    }
}

/// The tests of nextest's status lines that failed, timed out or died of a
/// signal (`FAIL [ 1.2s] prjquota-vmtests::guard xfs::name`), each once,
/// whatever prefix a lane gave the line.
fn failed_tests(lines: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for l in lines {
        let words: Vec<&str> = l.split_whitespace().collect();
        let Some(i) = words
            .iter()
            .position(|w| *w == "FAIL" || *w == "TIMEOUT" || (w.starts_with("SIG") && w.len() > 3))
        else {
            continue;
        };
        let Some(close) = words[i + 1..].iter().position(|w| w.ends_with(']')) else {
            continue;
        };
        if !words.get(i + 1).is_some_and(|w| w.starts_with('[')) {
            continue;
        }
        let name = words[i + 2 + close..].join(" ");
        if name.starts_with(VM_PACKAGE) && !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// The test of a failed systemd boot that failed: the boot runs `tests`
/// one by one and stops at the first that fails, the one after those whose
/// libtest summary said ok.
fn failed_in_boot<'a>(tests: &[&'a str], lines: &[String]) -> Option<&'a str> {
    let ok = lines
        .iter()
        .filter(|l| l.starts_with("test result: ok."))
        .count();
    tests.get(ok).copied()
}

/// Boots a VM pass gets in all when its guest kernel panics (see
/// `KernelJob::run`).
const MAX_BOOTS: usize = 3;

/// `filter` less the tests `finished`: what a boot resuming a pass runs.
fn without_finished(
    filter: &str,
    finished: &std::collections::BTreeSet<(String, String)>,
) -> String {
    if finished.is_empty() {
        return filter.to_string();
    }
    let done = finished
        .iter()
        .map(|(bin, test)| format!("(binary_id(={bin}) & test(={test}))"))
        .collect::<Vec<_>>()
        .join(" | ");
    format!("({filter}) - ({done})")
}

/// The tests of a panicked boot's status lines that finished, as a
/// summary would count them: passed, or failed in any way.
fn finished_counts(lines: &[String]) -> Counts {
    // The last word on each test: a retried test's last try decides.
    let mut last = std::collections::BTreeMap::new();
    for (status, bin, test) in lines.iter().filter_map(|l| status_line(l)) {
        let failed = matches!(status, "FAIL" | "TIMEOUT" | "ABORT") || status.starts_with("SIG");
        if status == "PASS" || failed {
            last.insert((bin, test), failed);
        }
    }
    let failed = last.values().filter(|f| **f).count() as u64;
    Counts {
        run: last.len() as u64,
        passed: last.len() as u64 - failed,
        failed,
    }
}

/// `binary-id minimum` lines of the floors file (`#` starts a comment).
fn parse_floors(text: &str) -> Vec<(String, usize)> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .filter_map(|l| {
            let (bin, n) = l.split_once(char::is_whitespace)?;
            Some((bin.to_string(), n.trim().parse().ok()?))
        })
        .collect()
}

/// How many distinct tests of each binary finished, from nextest's status
/// lines (`PASS [   0.005s] (1/9) prjquota-vmtests::plugin xfs::a_test`).
fn tests_per_binary(lines: &[String]) -> std::collections::BTreeMap<String, usize> {
    let mut per = std::collections::BTreeMap::new();
    for (bin, _) in tests_per_binary_names(lines) {
        *per.entry(bin).or_insert(0) += 1;
    }
    per
}

/// A nextest status line's status, binary and test
/// (`PASS [   0.005s] (1/9) prjquota-vmtests::plugin xfs::a_test`; a retry's
/// `TRY 2 PASS [...]` gives `PASS`).
fn status_line(line: &str) -> Option<(&str, &str, &str)> {
    let l = line.trim_start();
    let l = l
        .strip_prefix("TRY ")
        .and_then(|r| r.split_once(' '))
        .map_or(l, |(_, r)| r);
    let (status, rest) = l.split_once(" [")?;
    if status.is_empty() || !status.chars().all(|c| c.is_ascii_uppercase() || c == '-') {
        return None;
    }
    let (_, rest) = rest.split_once("] ")?;
    let rest = match rest.strip_prefix('(') {
        Some(r) => r.split_once(") ").map_or("", |(_, r)| r),
        None => rest,
    };
    let mut words = rest.split_whitespace();
    Some((status, words.next()?, words.next()?))
}

/// Each `(binary, test)` that finished, from nextest's status lines.
fn tests_per_binary_names(lines: &[String]) -> std::collections::BTreeSet<(String, String)> {
    lines
        .iter()
        .filter_map(|l| status_line(l))
        .filter(|(status, _, _)| {
            !matches!(
                *status,
                "SLOW" | "START" | "RETRY" | "SETUP" | "CANCEL" | "TERMINATING"
            )
        })
        .map(|(_, bin, test)| (bin.to_string(), test.to_string()))
        .collect()
}

/// The tests nextest called slow (`SLOW [> 60.000s] bin test`) that never
/// finished: what a VM killed at its limit was running.
fn unfinished(lines: &[String]) -> Vec<String> {
    let finished = tests_per_binary_names(lines);
    let mut slow: Vec<(String, String)> = Vec::new();
    for (status, bin, test) in lines.iter().filter_map(|l| status_line(l)) {
        let key = (bin.to_string(), test.to_string());
        if status == "SLOW" && !finished.contains(&key) && !slow.contains(&key) {
            slow.push(key);
        }
    }
    slow.into_iter().map(|(b, t)| format!("{b} {t}")).collect()
}

/// The floors this pass's binaries missed: the real-kernel test binaries
/// for a VM pass (`vm`), every other binary for the host pass. A binary
/// missing from the output ran 0 tests.
fn below_floor(
    floors: &[(String, usize)],
    ran: &std::collections::BTreeMap<String, usize>,
    vm: bool,
) -> Vec<String> {
    let is_vm = |bin: &str| bin.split("::").next() == Some(VM_PACKAGE);
    floors
        .iter()
        .filter(|(bin, _)| is_vm(bin) == vm)
        .filter_map(|(bin, min)| {
            let n = ran.get(bin).copied().unwrap_or(0);
            (n < *min).then(|| {
                format!(
                    "{bin} ran {n} tests, fewer than its floor of {min} (xtask/test-floors.txt)"
                )
            })
        })
        .collect()
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
    let root = crate::paths::repo_root();
    let target = crate::paths::target_dir();
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
            made = Some(dist_for_tests(opts, &root, &run_dir.0, &bin_dir)?);
            Ok(())
        })?;
        made
    } else {
        None
    };
    let plugin_tests = rust_binary_path(&binaries_json, &format!("{VM_PACKAGE}::plugin"))?;

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
    let base: Vec<String> = vec![
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
    if let Some(d) = &dist {
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
        Some(d) if !systemd_kernels.is_empty() => Some(SystemdJob {
            test_bin: rust_binary_path(&binaries_json, &format!("{VM_PACKAGE}::systemd"))?,
            deb: d.deb.clone(),
            rpm: d.rpm.clone(),
            newer_rpm: newer_rpm(d)?,
            attr_act: bin_dir.join("attr-act"),
            passes: crate::systemd::passes(&systemd_kernels),
        }),
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

/// What the systemd passes need from the build.
struct SystemdJob {
    test_bin: PathBuf,
    deb: PathBuf,
    rpm: PathBuf,
    /// The .rpm again as release 2, its binaries told apart
    /// ([`newer_rpm`]): what an upgrade installs.
    newer_rpm: PathBuf,
    attr_act: PathBuf,
    /// The boots of each pass (`crate::systemd::passes`).
    passes: Vec<Vec<crate::systemd::Planned>>,
}

/// One VM's work: a kernel's pass of prjquota-vmtests, or a systemd pass
/// (by the kernel it boots first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Boot {
    Suite(Kernel),
    Systemd(Kernel),
}

/// The boots, each with its place in the report (the systemd passes after
/// every suite), in the order the lanes take them, and how many VMs run at
/// once: `lanes` when given, else [`VM_LANES`]. Longest first, so that the
/// boot left for a lane another frees is a short one: the full suite, the
/// systemd passes (6.1's boots the node four times), then the other
/// passes by their rows' `boot_order`.
fn vm_boots(
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

/// The kernels of `opts` the systemd pass boots: 6.1 and 5.10 when asked
/// for, unless a --filter leaves out `binary(systemd)`.
fn systemd_kernels(opts: &Opts) -> Result<Vec<Kernel>> {
    if let Some(f) = &opts.filter {
        if !lists_any(&format!("({f}) & binary(systemd)"))? {
            return Ok(Vec::new());
        }
    }
    Ok(opts
        .kernels
        .iter()
        .copied()
        .filter(|k| crate::systemd::boots_kernel(*k))
        .collect())
}

/// Whether the VM tests' filter `expr` selects any test.
fn lists_any(expr: &str) -> Result<bool> {
    let mut cmd = cargo();
    cmd.args(["nextest", "list", "-p", VM_PACKAGE])
        .args(["--message-format", "oneline", "-E"])
        .arg(expr);
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", crate::process::display(&cmd)))?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({})",
            crate::process::display(&cmd),
            out.status
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.starts_with(VM_PACKAGE)))
}

/// The boots of one systemd pass (xtask/src/systemd.rs) as a pass: the
/// libtest summaries of tests/tests/systemd.rs in the guest, every test of
/// every boot of `planned` passed.
fn systemd_pass(planned: &[crate::systemd::Planned], job: &SystemdJob) -> Pass {
    let kernel = planned[0].0;
    header(&format!(
        "systemd pass on kernel {}: {}, on a Debian root booted with systemd as init",
        kernel.name(),
        crate::systemd::story_of(planned)
    ));
    let name = format!(
        "systemd {}",
        crate::systemd::kernels_of(planned).join(" > ")
    );
    let t = Instant::now();
    let in_guest = |p: &Path| {
        format!(
            "/prjquota-test/{}",
            p.file_name().unwrap_or_default().to_string_lossy()
        )
    };
    // The real Prometheus scrapes the packaged service with the shipped
    // rules and config: Prometheus 3 from `cargo xtask deps`, installed in
    // the root where its Debian package puts it.
    let prometheus = crate::deps::prometheus3_binary();
    let promtool = prometheus.with_file_name("promtool");
    let boots = if !crate::process::is_executable(&prometheus)
        || !crate::process::is_executable(&promtool)
    {
        Err(anyhow::anyhow!(
            "{} or {} is missing: run `cargo xtask deps` (the systemd pass runs Prometheus 3)",
            prometheus.display(),
            promtool.display()
        ))
    } else {
        crate::systemd::boots(
            planned,
            &job.test_bin,
            &[&job.deb, &job.rpm, &job.newer_rpm, &job.attr_act],
            &[
                (&prometheus, "/usr/bin/prometheus"),
                (&promtool, "/usr/bin/promtool"),
            ],
            &[
                ("PRJQUOTA_DEB", in_guest(&job.deb)),
                ("PRJQUOTA_RPM", in_guest(&job.rpm)),
                ("PRJQUOTA_NEWER_RPM", in_guest(&job.newer_rpm)),
                ("PRJQUOTA_BIN_DIR", "/prjquota-test".into()),
                ("PRJQUOTA_PROMETHEUS3", "/usr/bin/prometheus".into()),
            ],
        )
    };
    let secs = t.elapsed().as_secs_f64();
    println!(
        "xtask: systemd pass on kernel {} took {secs:.0}s",
        kernel.name()
    );
    let boots = match boots {
        Ok(b) => b,
        Err(e) => {
            return Pass {
                name,
                summary: None,
                counts: Counts::default(),
                ok: false,
                secs,
                problems: vec![format!("systemd VM: {e:#}")],
                failures: Vec::new(),
            }
        }
    };
    // libtest: "test result: ok. 1 passed; 0 failed; …", one per test run.
    let count = |line: &str, word: &str| {
        line.split(';')
            .find(|p| p.trim_end().ends_with(word))
            .and_then(|p| p.split_whitespace().rev().nth(1))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let (mut passed, mut failed) = (0, 0);
    let mut problems = Vec::new();
    let mut summaries = Vec::new();
    let mut failures = Vec::new();
    for (n, b) in boots.iter().enumerate() {
        for l in b.lines.iter().filter(|l| l.starts_with("test result: ")) {
            passed += count(l, "passed");
            failed += count(l, "failed");
        }
        if b.status != Some(0) {
            let tests = planned.get(n).map_or(&[][..], |(_, t)| *t);
            if let Some(t) = failed_in_boot(tests, &b.lines) {
                failures.push(format!("boot {}: {t}", n + 1));
            }
        }
        summaries.push(format!("boot {} {:.0}s", n + 1, b.secs));
        if b.status != Some(0) {
            problems.push(format!(
                "boot {}: a test of the guest's test binary exited with {:?}",
                n + 1,
                b.status
            ));
        }
    }
    let expected: usize = planned.iter().map(|(_, tests)| tests.len()).sum();
    if boots.len() < planned.len() {
        problems.push(format!(
            "{} of {} boots ran: each starts from the state the one before left",
            boots.len(),
            planned.len()
        ));
    }
    if passed != expected as u64 {
        problems.push(format!("{passed} of {expected} tests passed"));
    }
    Pass {
        name,
        ok: problems.is_empty() && failed == 0,
        summary: Some(format!(
            "{passed} passed; {failed} failed ({})",
            summaries.join(", ")
        )),
        counts: Counts {
            run: passed + failed,
            passed,
            failed,
        },
        secs,
        problems,
        failures,
    }
}

/// What every kernel's VM pass shares.
struct KernelJob<'a> {
    opts: &'a Opts,
    /// The guest's nextest command up to the selection.
    base: &'a [String],
    env: &'a [(String, String)],
    root: &'a std::path::Path,
    /// Another VM runs at the same time: lines are prefixed with the kernel.
    side_by_side: bool,
}

impl KernelJob<'_> {
    /// Boots `kernel` and runs its selection: a pass, failed when the VM did
    /// not boot, was killed or its guest panicked in each of
    /// [`MAX_BOOTS`] boots.
    fn run(&self, kernel: Kernel) -> Pass {
        let opts = self.opts;
        let (filter, full) = pass_filter(opts, kernel);
        let filter = Some(filter);
        let what = match (&opts.filter, full) {
            (Some(_), _) => "the --filter selection",
            (None, true) => "the full suite",
            (None, false) => "the compatibility pass",
        };
        // Two CPUs on one emulator thread cost the host no more than one,
        // and the full suite's timing ratios need two.
        let cpus = opts.vm_cpus.unwrap_or(2);
        // tests/tests/systemd.rs runs in the systemd pass only.
        let filter = filter
            .map(|f| format!("({f}) - binary(systemd)"))
            .unwrap_or_default();
        let guest_cmd_for = |filter: &str, resumed: bool| {
            let mut guest = self.base.to_vec();
            guest.extend(nextest_selection(opts, Some(filter)));
            if resumed {
                // The boots before may have finished every test: the floors
                // still hold the pass to its count.
                for a in guest.iter_mut().filter(|a| a.starts_with("--no-tests=")) {
                    *a = "--no-tests=warn".into();
                }
            }
            guest
                .iter()
                .map(|a| shell_quote(a))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let guest_cmd = guest_cmd_for(&filter, false);
        let prefix = if self.side_by_side {
            format!("[{}] ", kernel.name())
        } else {
            String::new()
        };

        header(&format!(
            "VM tests on kernel {}: {what} of prjquota-vmtests in one VM boot (--fs all, \
             {cpus} CPU{}{})",
            kernel.name(),
            if cpus == 1 { "" } else { "s" },
            if self.side_by_side {
                "; beside another VM, its lines start with its kernel"
            } else {
                ""
            }
        ));
        // A --filter selection may be as long as the full suite.
        let compat = opts.filter.is_none() && !full;
        // Taken again for each boot: what is left of the run's deadline.
        let limit = || {
            opts.vm_timeout.unwrap_or_else(|| {
                crate::deadline::cut_for(
                    &format!("the VM on kernel {}", kernel.name()),
                    Duration::from_secs(pass_limit_secs(compat, cpus)),
                )
            })
        };
        let mut vm_opts = VmOpts {
            fs: Fs::All,
            kernel,
            timeout: limit(),
            env: self.env.to_vec(),
            cpus,
            prefix: prefix.clone(),
            ..VmOpts::default()
        };
        let t = Instant::now();
        let mut result = crate::vm::run(&vm_opts, &guest_cmd, self.root);
        let mut name = format!("vm {} ({what})", kernel.name());
        // The guest kernel has panicked inside BPF trampoline patching (a
        // stale int3 executed after the patch finished: an `Oops: int3`, or
        // a soft lockup at the patched function's first byte) whenever a
        // vCPU ran a function another patched: on 6.12 and 7.2 before they
        // got one emulator thread, and still on 6.1's two (every eBPF attach
        // races the loop devices' kworkers writing). That is a fault of the
        // emulation as far as we can tell, so the pass boots again, up to
        // [`MAX_BOOTS`], each time with only the tests no boot before
        // finished: a panic costs the tests it interrupted, not the pass.
        // The summary's name says how many boots it took.
        let mut earlier: Vec<String> = Vec::new();
        let mut boots = 1;
        while boots < MAX_BOOTS {
            let Some(panic) = result
                .as_ref()
                .err()
                .and_then(|e| e.downcast_ref::<crate::vm::GuestPanic>())
            else {
                break;
            };
            earlier.extend(panic.lines.iter().cloned());
            let finished = tests_per_binary_names(&earlier);
            println!(
                "{prefix}xtask test: kernel {}: THE GUEST KERNEL PANICKED; booting the pass \
                 once more, without the {} tests its boots finished. The panic:\n{panic}",
                kernel.name(),
                finished.len()
            );
            boots += 1;
            name = format!(
                "vm {} ({what}; {boots} boots: resumed after guest kernel panics)",
                kernel.name()
            );
            let rest = without_finished(&filter, &finished);
            vm_opts.timeout = limit();
            result = crate::vm::run(&vm_opts, &guest_cmd_for(&rest, true), self.root);
        }
        let secs = t.elapsed().as_secs_f64();
        println!(
            "{prefix}xtask: VM pass on kernel {} took {secs:.0}s",
            kernel.name()
        );
        match result {
            Ok(run) => {
                let finished_before = finished_counts(&earlier);
                let mut lines = earlier;
                lines.extend(run.lines);
                let mut p = pass(
                    name,
                    &lines,
                    run.status == 0,
                    opts.filter.is_some(),
                    (opts.filter.is_none() && full).then_some(true),
                    secs,
                );
                p.counts.run += finished_before.run;
                p.counts.passed += finished_before.passed;
                p.counts.failed += finished_before.failed;
                p.ok &= finished_before.failed == 0;
                p
            }
            // A kernel that does not boot fails its pass; the other kernels
            // still get their boots.
            Err(e) => {
                println!("{prefix}xtask test: kernel {}: {e:#}", kernel.name());
                let mut problems = vec![format!("VM: {e:#}")];
                let mut failures = Vec::new();
                if let Some(killed) = e.downcast_ref::<crate::vm::Killed>() {
                    failures = failed_tests(&killed.lines);
                    problems.extend(
                        unfinished(&killed.lines)
                            .into_iter()
                            .map(|t| format!("still running when the VM was killed: {t}")),
                    );
                }
                Pass {
                    name,
                    summary: None,
                    counts: Counts::default(),
                    ok: false,
                    secs,
                    problems,
                    failures,
                }
            }
        }
    }
}

/// The real-kernel test binaries that test what `cargo xtask dist` makes
/// (the .deb, the static release plugin; the timing ratios compare that
/// plugin with a static release mkdir plugin).
const DIST_BINARIES: &[&str] = &["package", "static_plugin", "timing"];

/// The filter each VM pass of `opts` runs.
fn pass_filters(opts: &Opts) -> Vec<&str> {
    opts.kernels
        .iter()
        .map(|&k| pass_filter(opts, k).0)
        .collect()
}

/// The filter the VM pass on `kernel` runs, and whether it is the full suite.
fn pass_filter(opts: &Opts, kernel: Kernel) -> (&str, bool) {
    let (selected, full) = pass_selection(kernel, opts.full);
    (opts.filter.as_deref().unwrap_or(selected), full)
}

/// Whether any VM pass of `opts` selects a test of one of `binaries`
/// (asked of nextest, which knows the filter language).
fn selects_any(opts: &Opts, binaries: &[&str]) -> Result<bool> {
    let ours = binaries
        .iter()
        .map(|b| format!("binary({b})"))
        .collect::<Vec<_>>()
        .join(" | ");
    // One listing for every pass: each lists by running every test binary.
    let passes = pass_filters(opts)
        .iter()
        .map(|f| format!("({f})"))
        .collect::<Vec<_>>()
        .join(" | ");
    let mut cmd = cargo();
    cmd.args(["nextest", "list", "-p", VM_PACKAGE])
        .args(["--message-format", "oneline", "-E"])
        .arg(format!("({passes}) & ({ours})"));
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", crate::process::display(&cmd)))?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({})",
            crate::process::display(&cmd),
            out.status
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.starts_with(VM_PACKAGE)))
}

/// What the package and static-plugin tests read: this run's copies (a
/// build beside the run would otherwise replace them under the guest).
struct TestDist {
    /// The .deb to install.
    deb: PathBuf,
    /// The .rpm of the same binaries, to inspect.
    rpm: PathBuf,
    /// The binaries the .deb was built from ([`crate::dist::BINS`]).
    deb_bins: PathBuf,
    /// The static release binaries (`prjquota`; with --release-deb also
    /// `prjquota-exporter`).
    static_dir: PathBuf,
}

/// By default the static release `prjquota` exactly as `cargo xtask dist`
/// builds it (about a minute cold), and a test .deb staged by dist's own
/// code from it and this run's debug exporter, uncompressed. The release
/// exporter is most of a cold `cargo xtask dist` (over 6 minutes on a
/// loaded 2-core machine), which CI's budget has no room for; its static
/// linking is checked by `cargo xtask dist` itself. `--release-deb` tests
/// the release .deb instead.
fn dist_for_tests(opts: &Opts, root: &Path, run_dir: &Path, bin_dir: &Path) -> Result<TestDist> {
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

/// The test .rpm rebuilt as release 2, with a trailer on both binaries so
/// that an upgrade's new files are told from the old: the package an
/// upgrade test installs over it. On the host, as rpmbuild is not in the
/// systemd pass's root.
fn newer_rpm(d: &TestDist) -> Result<PathBuf> {
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
fn lint_test_packages() -> Result<()> {
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

/// A test binary's path from `cargo nextest list --list-type binaries-only
/// --message-format json` output.
fn rust_binary_path(binaries_json: &std::path::Path, id: &str) -> Result<std::path::PathBuf> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(binaries_json)?)
        .with_context(|| format!("{} is not JSON", binaries_json.display()))?;
    v["rust-binaries"][id]["binary-path"]
        .as_str()
        .map(std::path::PathBuf::from)
        .with_context(|| format!("{} lists no test binary {id}", binaries_json.display()))
}

/// Runs `cmd` (stderr to ours) and writes its stdout to `path`.
fn write_stdout(cmd: &mut Command, path: &std::path::Path) -> Result<()> {
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

    #[test]
    fn a_failed_pass_names_its_failed_tests_once() {
        let lines: Vec<String> = [
            "        PASS [   1.0s] prjquota-vmtests::crash xfs::ok",
            "[6.12]         FAIL [  38.3s] prjquota-vmtests::guard xfs::broken",
            "     TIMEOUT [ 120.0s] prjquota-vmtests::guard ext4::slow",
            "     SIGSEGV [   0.1s] prjquota-vmtests::ebpf crashed",
            "        FAIL [  38.3s] prjquota-vmtests::guard xfs::broken",
            "thread 'x' panicked: FAIL [not a status line]",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            failed_tests(&lines),
            [
                "prjquota-vmtests::guard xfs::broken",
                "prjquota-vmtests::guard ext4::slow",
                "prjquota-vmtests::ebpf crashed"
            ]
        );
    }

    #[test]
    fn a_failed_systemd_boot_names_the_test_after_those_that_passed() {
        let lines: Vec<String> = [
            "test result: ok. 1 passed; 0 failed; 0 ignored",
            "thread 'b' panicked at tests/tests/systemd.rs:1:1:",
            "FAILED",
            "test result: FAILED. 0 passed; 1 failed; 0 ignored",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(failed_in_boot(&["a", "b", "c"], &lines), Some("b"));
        assert_eq!(failed_in_boot(&["a"], &lines[..1]), None);
    }

    fn k(name: &str) -> Kernel {
        Kernel::parse(name).unwrap()
    }

    #[test]
    fn each_kernel_runs_its_rows_pass_and_full_where_it_can() {
        assert_eq!(pass_selection(k("6.1"), false), (selection::FULL, true));
        assert_eq!(
            pass_selection(k("6.12"), false),
            (selection::COMPAT_6_12, false)
        );
        assert_eq!(pass_selection(k("7"), false), (selection::COMPAT_7, false));
        assert_eq!(pass_selection(k("7"), true), (selection::FULL, true));
        assert_eq!(
            pass_selection(k("5.10"), true),
            (selection::OLD_KERNEL, false)
        );
    }

    #[test]
    fn the_full_pass_boots_first_and_two_vms_run_at_once() {
        let full = |k| k == Kernel::DEFAULT;
        let (boots, lanes) = vm_boots(&Kernel::all(), &[k("6.1"), k("7")], full, None);
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
        assert_eq!(vm_boots(&Kernel::all(), &[], full, Some(1)).1, 1);
    }

    #[test]
    fn a_boot_after_a_panic_runs_only_what_no_boot_finished() {
        let lines: Vec<String> = [
            "        PASS [   4.7s] (1/9) prjquota-vmtests::guard xfs::a",
            "        FAIL [   2.1s] (2/9) prjquota-vmtests::plugin ext4::b",
            "        SLOW [> 60.0s] prjquota-vmtests::ebpf xfs::c",
            "[  528.6] Kernel panic - not syncing: softlockup: hung tasks",
        ]
        .iter()
        .map(|l| l.to_string())
        .collect();
        let finished = tests_per_binary_names(&lines);
        assert_eq!(
            without_finished("(all()) - binary(systemd)", &finished),
            "((all()) - binary(systemd)) - ((binary_id(=prjquota-vmtests::guard) & \
             test(=xfs::a)) | (binary_id(=prjquota-vmtests::plugin) & test(=ext4::b)))"
        );
        assert_eq!(
            without_finished("all()", &std::collections::BTreeSet::new()),
            "all()"
        );
        // The slow test was interrupted: it runs again, and counts once.
        assert_eq!(
            finished_counts(&lines),
            Counts {
                run: 2,
                passed: 1,
                failed: 1
            }
        );
    }

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

    #[test]
    fn tests_are_counted_per_binary_once() {
        let lines: Vec<String> = [
            "        PASS [   0.005s] (1/9) prjquota mountinfo::tests::a",
            "        SLOW [> 60.000s] (2/9) prjquota-vmtests::plugin xfs::b",
            "        FAIL [  61.000s] (2/9) prjquota-vmtests::plugin xfs::b",
            "  TRY 2 PASS [   1.000s] (3/9) prjquota-vmtests::plugin xfs::c",
            "        PASS [   0.100s] prjquota-vmtests::crash xfs::d",
            // nextest repeats failures at the end
            "        FAIL [  61.000s] (2/9) prjquota-vmtests::plugin xfs::b",
            "     Summary [   0.029s] 4 tests run: 3 passed, 1 failed",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let per = tests_per_binary(&lines);
        assert_eq!(per.get("prjquota"), Some(&1));
        assert_eq!(per.get("prjquota-vmtests::plugin"), Some(&2));
        assert_eq!(per.get("prjquota-vmtests::crash"), Some(&1));
        assert_eq!(per.len(), 3);
    }

    #[test]
    fn a_killed_pass_names_the_slow_tests_that_never_finished() {
        let lines: Vec<String> = [
            "        SLOW [> 60.000s] prjquota-vmtests::plugin xfs::b",
            "        PASS [  61.000s] prjquota-vmtests::plugin xfs::b",
            "        SLOW [> 60.000s] (3/9) prjquota-vmtests::guard ext4::hangs",
            "        SLOW [>120.000s] (3/9) prjquota-vmtests::guard ext4::hangs",
            "        SLOW [> 60.000s] prjquota-vmtests::crash xfs::d",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            unfinished(&lines),
            [
                "prjquota-vmtests::guard ext4::hangs",
                "prjquota-vmtests::crash xfs::d"
            ]
        );
    }

    #[test]
    fn a_binary_below_its_floor_fails_its_own_pass_only() {
        let floors = parse_floors(
            "# c\nprjquota  2 # host\nprjquota-vmtests::plugin 2\nprjquota-vmtests::crash 1\n",
        );
        assert_eq!(floors.len(), 3);
        let ran: std::collections::BTreeMap<String, usize> =
            [("prjquota-vmtests::plugin".to_string(), 1)].into();
        let short = below_floor(&floors, &ran, true);
        assert_eq!(short.len(), 2, "{short:?}");
        assert!(short[0].contains("plugin ran 1 tests"));
        assert!(short[1].contains("crash ran 0 tests"));
        assert_eq!(below_floor(&floors, &ran, false).len(), 1);
        // The committed file parses, one floor per line.
        assert!(parse_floors(FLOORS).len() >= 20);
    }
}
