//! `cargo xtask`: the developer workflow of prjquota.
//!
//! - `deps`  installs what builds and tests need on a fresh Debian 12 (root).
//! - `vm`    boots Debian's kernel under QEMU (vng) with quota filesystems mounted.
//! - `test`  fmt, clippy, host tests, then the real-kernel tests in one VM boot.
//! - `demo`  shows a project quota being enforced, in the VM.
//! - `stress` runs the concurrency stress test for minutes instead of rounds.
//! - `dist`  builds release binaries and an installable tarball.
//! - `bench` measures prjquota against its alternatives and floors, side by side.
//! - `dashboards` renders the rules and the dashboard from a config.

mod args;
mod bench;
mod completions;
mod dashboards;
mod deadline;
mod debian;
mod demo;
mod deps;
mod dist;
mod docs;
mod kernels;
mod lint;
mod notice;
mod paths;
mod process;
mod selection;
mod stress;
mod systemd;
mod test;
mod vm;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  deps                       install system packages, virtme-ng and cargo-nextest (idempotent, root)
  vm [--kernel K] [--fs xfs|ext4|all] [--memory 2G] [--cpus 2] -- CMD...
                             boot Debian's kernel in QEMU, mount the quota test filesystems,
                             run CMD (bash -c) in the current directory; exits with CMD's status
  test [--host-only | --vm-only] [--kernel K|all] [--full] [--filter EXPR] [--vm-threads N]
       [--vm-lanes N] [--vm-cpus N] [--release-deb] [-- NEXTEST_ARGS...]
                             fmt, clippy, host tests, then the real-kernel tests, one VM boot per
                             kernel: the full suite on 6.1, the compatibility pass on the others
                             (--full: the full suite everywhere); EXPR is a nextest filterset
                             (passed as -E), e.g. 'test(smoke)', and replaces either selection;
                             two VMs at a time (each on one emulator thread, a core), the
                             longest first; --vm-lanes N boots N at a time, --vm-cpus N gives
                             each guest N CPUs (default 2);
                             binary(package) installs a test .deb (the static release plugin, the
                             debug exporter), --release-deb the one of `dist` (minutes to build)
  demo                       deps, build, and tell the whole story in the VM (plugin, exporter, eBPF)
  stress [--secs N] [--seed S] [--kernel K]
                             the concurrency stress test for N seconds per filesystem (default 300)
                             and the exporter's 10,000-volume churn soak; a disk stalled under
                             the exporter's scrapes for N seconds per filesystem
  bench [--quick]            plugin comparisons, exporter scrape cost and eBPF overhead in one VM
                             boot (release builds); writes bench/RESULTS.md and the docs' blocks
                             generated from it (README.md's comparison, docs/performance.md)
  bench --render-only        only render those blocks from the committed bench/RESULTS.md (no VM)
  docs                       render every generated block of the docs: the bench's (as
                             bench --render-only) and docs/kernels.md's matrix, from the kernel
                             table (xtask/src/kernels.rs)
  dist                       static release binaries, the tarball, the .deb and SHA256SUMS in
                             target/dist/
  dashboards [--config FILE] [--out DIR]
                             render alerts.yaml and prjquota.json from a config (default
                             dashboards/config.toml, its fields in docs/dashboards.md) into DIR
                             (default dashboards/, the shipped files)

kernels (K): 5.10 (bullseye), 6.1 (bookworm, the default), 6.12 (trixie), 7 (sid): Debian's
  generic kernels; `deps` fetches all four.

environment:
  PRJQUOTA_VM_KERNEL         kernel image to boot, overriding --kernel
  PRJQUOTA_VM_TIMEOUT        seconds before the VM is killed (default: 35 min for a full pass,
                             20 for a compatibility pass, 45 and 20 with one CPU; 30 for `vm`)
  PRJQUOTA_VM_VERBOSE=1      pass --verbose to vng (kernel console, for boot failures)
  PRJQUOTA_VNG               the vng executable (default: target/venv/bin/vng, from `deps`)
  The tests themselves get only what xtask sets (PRJQUOTA_PROMETHEUS3 is the Prometheus 3
  binary `deps` unpacks under target/prometheus3); nothing else leaks from the caller's shell.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((command, rest)) = args.split_first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    // `cargo xtask test --help`: the usage, whatever the command (the
    // options of all of them are on one page).
    let mut before_dashes = rest.iter().take_while(|a| a.as_str() != "--");
    if before_dashes.any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let result = match command.as_str() {
        "deps" => deps::main(rest),
        "vm" => vm::main(rest),
        "test" => test::main(rest),
        "demo" => demo::main(rest),
        "stress" => stress::main(rest),
        "bench" => bench::main(rest),
        "dist" => dist::main(rest),
        "dashboards" => dashboards::main(rest),
        "docs" => docs::main(rest),
        "help" | "-h" | "--help" => {
            println!("{USAGE}");
            Ok(0)
        }
        other => {
            eprintln!("xtask: unknown command `{other}`\n\n{USAGE}");
            Ok(2)
        }
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
