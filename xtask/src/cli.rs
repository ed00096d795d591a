//! `cargo xtask`'s command line, defined once with clap: each command's
//! flags, `--help` and the errors. The kernels `--kernel` takes are the
//! rows of `crate::kernels`, listed in the help from them.

use std::path::PathBuf;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

use crate::kernels::Kernel;

const ENVIRONMENT: &str = "\
environment:
  PRJQUOTA_VM_KERNEL         kernel image to boot, overriding --kernel
  PRJQUOTA_VM_TIMEOUT        seconds before the VM is killed (default: 35 min for a full pass,
                             20 for a compatibility pass, 45 and 20 with one CPU; 30 for `vm`)
  PRJQUOTA_VM_VERBOSE=1      pass --verbose to vng (kernel console, for boot failures)
  PRJQUOTA_VNG               the vng executable (default: target/venv/bin/vng, from `deps`)
  The tests themselves get only what xtask sets (PRJQUOTA_PROMETHEUS3 is the Prometheus 3
  binary `deps` unpacks under target/prometheus3); nothing else leaks from the caller's shell.";

/// The developer workflow of prjquota.
#[derive(Debug, Parser)]
#[command(
    name = "xtask",
    bin_name = "cargo xtask",
    disable_help_subcommand = true,
    subcommand_required = true,
    arg_required_else_help = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Install system packages, the kernels, virtme-ng, cargo-nextest and cargo-deny (idempotent, root)
    Deps,
    /// Boot a kernel of the matrix in QEMU, mount the quota test filesystems, run CMD (bash -c)
    /// in the current directory; exits with CMD's status
    Vm(VmArgs),
    /// fmt, clippy, cargo deny, the host tests, then the real-kernel tests, one VM boot per kernel
    Test(TestArgs),
    /// deps, build, and tell the whole story in the VM (plugin, exporter, eBPF)
    Demo,
    /// The concurrency stress test for N seconds per filesystem and the exporter's
    /// 10,000-volume churn soak; a disk stalled under the exporter's scrapes
    Stress(StressArgs),
    /// Plugin comparisons, exporter scrape cost and eBPF overhead in one VM boot (release
    /// builds); writes bench/RESULTS.md and the docs' blocks generated from it
    Bench(BenchArgs),
    /// Static release binaries, the tarball, the .deb, the .rpm and SHA256SUMS in target/dist/
    Dist(DistArgs),
    /// Render alerts.yaml and prjquota.json from a config into DIR
    Dashboards(DashboardsArgs),
    /// Render every generated block of the docs: the bench's (from bench/RESULTS.md) and
    /// docs/kernels.md's matrix (from the kernel table, xtask/src/kernels.rs)
    Docs,
}

/// Which quota filesystems the guest mounts (the XFS without quotas always is).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Fs {
    Xfs,
    Ext4,
    All,
}

#[derive(Debug, Args)]
pub struct VmArgs {
    /// The kernel to boot
    #[arg(long, value_name = "K", value_parser = kernel)]
    pub kernel: Option<Kernel>,
    /// The quota filesystems to mount
    #[arg(long, value_enum, default_value = "xfs")]
    pub fs: Fs,
    #[arg(long, default_value = "2G")]
    pub memory: String,
    #[arg(long, default_value_t = 2)]
    pub cpus: u32,
    /// A file the guest sees as a block device (/dev/vda), as the bench's
    /// disk: for probes of what the bench measures
    #[arg(long, value_name = "FILE")]
    pub disk: Vec<PathBuf>,
    /// A host directory the guest may write (vng shares it over virtiofs;
    /// an executable run from it is read through the share again at each
    /// exec, so the bench copies its plugins out)
    #[arg(long, value_name = "DIR")]
    pub rwdir: Vec<PathBuf>,
    /// The command; several words are joined as ssh joins them
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub cmd: Vec<String>,
}

/// `--kernel`: a kernel of the matrix, or `all`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kernels(pub Vec<Kernel>);

#[derive(Debug, Args)]
pub struct TestArgs {
    /// fmt, clippy, cargo deny and the host tests only
    #[arg(long, conflicts_with = "vm_only")]
    pub host_only: bool,
    /// The VM passes only
    #[arg(long)]
    pub vm_only: bool,
    /// The kernels the VM passes boot: the full suite on the default one, each other's own
    /// pass (docs/kernels.md); `all` runs every kernel and the systemd passes
    #[arg(long, value_name = "K|all", value_parser = kernels)]
    pub kernel: Option<Kernels>,
    /// The full suite on every kernel that can run it
    #[arg(long)]
    pub full: bool,
    /// A nextest filterset (passed as -E), e.g. 'test(smoke)', replacing every pass's selection
    #[arg(long, value_name = "EXPR")]
    pub filter: Option<String>,
    /// nextest's --test-threads in the guest
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub vm_threads: u32,
    /// How many VMs boot at once (default two, each on one emulator thread, a core),
    /// the longest first
    #[arg(long, value_name = "N")]
    pub vm_lanes: Option<u32>,
    /// CPUs of each guest (default 2)
    #[arg(long, value_name = "N")]
    pub vm_cpus: Option<u32>,
    /// binary(package) installs the .deb of `cargo xtask dist` (minutes to build), not a test
    /// .deb of the static release plugin and the run's debug exporter
    #[arg(long)]
    pub release_deb: bool,
    /// More arguments for nextest, after --
    #[arg(last = true, value_name = "NEXTEST_ARGS")]
    pub extra: Vec<String>,
}

#[derive(Debug, Args)]
pub struct StressArgs {
    /// Seconds of the stress test per filesystem, and of the stalled disk
    #[arg(long, value_name = "N", default_value_t = 300)]
    pub secs: u64,
    /// The stress test's seed, to replay a run
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,
    #[arg(long, value_name = "K", value_parser = kernel)]
    pub kernel: Option<Kernel>,
}

#[derive(Debug, Args)]
#[group(multiple = false)]
pub struct BenchArgs {
    /// Fewer rounds: a check of the bench, not figures for the docs
    #[arg(long)]
    pub quick: bool,
    /// Only render the docs' blocks from the committed bench/RESULTS.md (no VM)
    #[arg(long)]
    pub render_only: bool,
    /// Only these sections (comma-separated)
    #[arg(long, value_name = "SECTIONS")]
    pub only: Option<String>,
}

#[derive(Debug, Args)]
pub struct DistArgs {
    /// Package DIR's prjquota, prjquota-exporter and prjquota-dashboards into OUT,
    /// unchecked, for tests (no release build)
    #[arg(long, num_args = 2, value_names = ["DIR", "OUT"])]
    pub binaries: Option<Vec<PathBuf>>,
}

#[derive(Debug, Args)]
pub struct DashboardsArgs {
    /// The config (default dashboards/config.toml; its fields in docs/dashboards.md)
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Where to write (default dashboards/, the shipped files)
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

fn kernel(s: &str) -> Result<Kernel, String> {
    Kernel::parse(s).map_err(|e| e.to_string())
}

fn kernels(s: &str) -> Result<Kernels, String> {
    if s == "all" {
        return Ok(Kernels(Kernel::all()));
    }
    kernel(s).map(|k| Kernels(vec![k]))
}

/// The command line with the kernel matrix in its help: the kernels and
/// their Debian suites, from the table.
pub fn command() -> clap::Command {
    let kernels = crate::kernels::KERNELS
        .iter()
        .map(|r| format!("{} ({})", r.name, r.suite))
        .collect::<Vec<_>>()
        .join(", ");
    Cli::command().after_help(format!(
        "kernels (K): {kernels}; the default {}. Debian's generic kernels; `deps` fetches \
         them all.\n\n{ENVIRONMENT}",
        Kernel::DEFAULT.name()
    ))
}

/// Parses `args` (the program's name first), or the process exits with
/// clap's answer (help and version exit 0, a mistake 2).
pub fn parse(args: impl IntoIterator<Item = String>) -> Cli {
    let matches = command().get_matches_from(args);
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn try_parse(args: &[&str]) -> Result<Cli, clap::Error> {
        let argv = std::iter::once("xtask").chain(args.iter().copied());
        command()
            .try_get_matches_from(argv)
            .and_then(|m| Cli::from_arg_matches(&m))
    }

    #[test]
    fn the_definition_is_consistent() {
        command().debug_assert();
    }

    #[test]
    fn test_takes_its_flags_and_nextests_after_dashes() {
        let Command::Test(t) = try_parse(&[
            "test",
            "--kernel",
            "all",
            "--filter=binary(plugin)",
            "--vm-lanes",
            "1",
            "--",
            "--no-capture",
        ])
        .unwrap()
        .command
        else {
            panic!("not test")
        };
        assert_eq!(t.kernel, Some(Kernels(Kernel::all())));
        assert_eq!(t.filter.as_deref(), Some("binary(plugin)"));
        assert_eq!(t.vm_lanes, Some(1));
        assert_eq!(t.extra, ["--no-capture"]);
        assert!(try_parse(&["test", "--host-only", "--vm-only"]).is_err());
    }

    #[test]
    fn a_kernel_outside_the_table_is_refused_naming_the_table() {
        let e = try_parse(&["test", "--kernel", "4.19"])
            .unwrap_err()
            .to_string();
        assert!(e.contains(&crate::kernels::names_or()), "{e}");
        let help = command().render_long_help().to_string();
        for r in &crate::kernels::KERNELS {
            assert!(
                help.contains(&format!("{} ({})", r.name, r.suite)),
                "{help}"
            );
        }
    }

    #[test]
    fn vm_takes_a_command_with_or_without_dashes() {
        for args in [
            &["vm", "--fs", "ext4", "--", "df", "-h"][..],
            &["vm", "--fs", "ext4", "df", "-h"],
        ] {
            let Command::Vm(v) = try_parse(args).unwrap().command else {
                panic!("not vm")
            };
            assert_eq!(v.fs, Fs::Ext4);
            assert_eq!(v.cmd, ["df", "-h"]);
        }
        assert!(try_parse(&["vm", "--fs", "ext4"]).is_err());
    }

    #[test]
    fn bench_takes_one_mode() {
        assert!(try_parse(&["bench", "--quick", "--render-only"]).is_err());
        let Command::Dist(d) = try_parse(&["dist", "--binaries", "a", "b"])
            .unwrap()
            .command
        else {
            panic!("not dist")
        };
        assert_eq!(d.binaries.unwrap().len(), 2);
    }
}
