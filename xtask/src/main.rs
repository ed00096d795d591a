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

mod bench;
mod cli;
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
mod repo;
mod sbom;
mod selection;
mod stress;
mod systemd;
mod test;
mod vm;

use std::process::ExitCode;

use cli::Command;

fn main() -> ExitCode {
    let result = match cli::parse(std::env::args()).command {
        Command::Deps => deps::main(),
        Command::Vm(a) => vm::main(a),
        Command::Test(a) => test::main(a),
        Command::Demo => demo::main(),
        Command::Stress(a) => stress::main(a),
        Command::Bench(a) => bench::main(a),
        Command::Dist(a) => dist::main(a),
        Command::Dashboards(a) => dashboards::main(a),
        Command::Docs => docs::main(),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
