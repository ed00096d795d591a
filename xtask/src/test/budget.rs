//! CI's budget and each VM pass's limit within it.

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
pub(super) const CI_BUDGET_SECS: u64 = 90 * 60;

pub(super) const BUILD_AND_HOST_SECS: u64 = 15 * 60;

pub(super) const FULL_PASS_LIMIT_SECS: u64 = 35 * 60;

pub(super) const COMPAT_PASS_LIMIT_SECS: u64 = 20 * 60;

pub(super) const FULL_PASS_ONE_CPU_LIMIT_SECS: u64 = 45 * 60;

pub(super) const COMPAT_PASS_ONE_CPU_LIMIT_SECS: u64 = 20 * 60;

/// A cold `cargo xtask deps`, which CI runs before the test.
pub(super) const DEPS_COLD_SECS: u64 = 10 * 60;

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
pub(super) const VM_LANES: u32 = 2;

/// A pass's VM limit: what its selection and its CPUs allow (see above).
pub(super) fn pass_limit_secs(compat: bool, cpus: u32) -> u64 {
    match (compat, cpus >= 2) {
        (true, true) => COMPAT_PASS_LIMIT_SECS,
        (false, true) => FULL_PASS_LIMIT_SECS,
        (true, false) => COMPAT_PASS_ONE_CPU_LIMIT_SECS,
        (false, false) => FULL_PASS_ONE_CPU_LIMIT_SECS,
    }
}
