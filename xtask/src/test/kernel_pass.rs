//! One kernel's pass of the suite in one VM, booted again (up to three
//! boots) with what no boot finished when the guest kernel panics.

use std::time::{Duration, Instant};

use crate::kernels::Kernel;
use crate::process::{header, shell_quote};
use crate::vm::{Fs, VmOpts};

use super::budget::pass_limit_secs;
use super::opts::Opts;
use super::passes::{nextest_selection, pass_filter};
use super::results::{
    failed_tests, finished_counts, pass, tests_per_binary_names, unfinished, without_finished,
    Counts, Pass,
};

/// Boots a VM pass gets in all when its guest kernel panics (see
/// `KernelJob::run`).
const MAX_BOOTS: usize = 3;

/// What every kernel's VM pass shares.
pub(super) struct KernelJob<'a> {
    pub(super) opts: &'a Opts,
    /// The guest's nextest command up to the selection.
    pub(super) base: &'a [String],
    pub(super) env: &'a [(String, String)],
    pub(super) root: &'a std::path::Path,
    /// Another VM runs at the same time: lines are prefixed with the kernel.
    pub(super) side_by_side: bool,
}

impl KernelJob<'_> {
    /// Boots `kernel` and runs its selection: a pass, failed when the VM did
    /// not boot, was killed or its guest panicked in each of
    /// [`MAX_BOOTS`] boots.
    pub(super) fn run(&self, kernel: Kernel) -> Pass {
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
