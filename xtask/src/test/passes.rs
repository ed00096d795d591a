//! Which passes a run has and what each selects of the suite: the kernel
//! rows' selections (`crate::selection`), or the user's `--filter`.

use std::process::Stdio;

use anyhow::{bail, Context, Result};

use crate::kernels::{Kernel, VmPass};
use crate::paths::cargo;
use crate::selection;

use super::opts::{Opts, VM_PACKAGE};

/// What a pass on `kernel` runs without a `--filter`: (filter, is the full
/// suite). `full`: `--full`, or the kernel's own pass is the full suite.
pub(super) fn pass_selection(kernel: Kernel, full: bool) -> (&'static str, bool) {
    match (kernel.row().pass, full) {
        (VmPass::Only(f), _) => (f, false),
        (VmPass::Full, _) | (VmPass::Compat(_), true) => (selection::FULL, true),
        (VmPass::Compat(f), false) => (f, false),
    }
}

/// Nextest arguments that select tests: the filter, `--no-tests`, the extras.
pub(super) fn nextest_selection(opts: &Opts, filter: Option<&str>) -> Vec<String> {
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

/// The kernels of `opts` the systemd pass boots: 6.1 and 5.10 when asked
/// for, unless a --filter leaves out `binary(systemd)`.
pub(super) fn systemd_kernels(opts: &Opts) -> Result<Vec<Kernel>> {
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
pub(super) fn lists_any(expr: &str) -> Result<bool> {
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

/// The filter each VM pass of `opts` runs.
pub(super) fn pass_filters(opts: &Opts) -> Vec<&str> {
    opts.kernels
        .iter()
        .map(|&k| pass_filter(opts, k).0)
        .collect()
}

/// The filter the VM pass on `kernel` runs, and whether it is the full suite.
pub(super) fn pass_filter(opts: &Opts, kernel: Kernel) -> (&str, bool) {
    let (selected, full) = pass_selection(kernel, opts.full);
    (opts.filter.as_deref().unwrap_or(selected), full)
}

/// Whether any VM pass of `opts` selects a test of one of `binaries`
/// (asked of nextest, which knows the filter language).
pub(super) fn selects_any(opts: &Opts, binaries: &[&str]) -> Result<bool> {
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
    lists_any(&format!("({passes}) & ({ours})"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Kernel;

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
}
