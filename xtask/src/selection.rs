//! What each VM pass runs of the real-kernel suite (prjquota-vmtests)
//! without `--filter`: nextest filtersets, named by the kernel rows that
//! run them (`crate::kernels::KERNELS`), and the list of the suite's test
//! binaries with the selections each is in ([`BINARIES`]), which a host
//! test holds to tests/tests/ and to the filters: a new test binary must
//! say where it runs.

/// Tests that start, restart or kill the exporter (attaching and
/// detaching the guard's LSM programs, a dozen times) while an owner loops
/// on the hooked ioctl: the kernel's patching of a hooked function raced
/// by the other vCPU, which hung guests with an emulator thread per vCPU
/// (see `crate::vm::run`). The full suite on 6.1 runs them on both
/// filesystems; the compatibility passes add one filesystem's cases each,
/// the XFS cases on 6.12 and the ext4 cases on 7.x.
macro_rules! attach_races {
    () => {
        "((binary(guard) & (test(the_guard_holds_through_exporter_restarts_and_crashes) | \
           test(a_record_the_exporter_cannot_read_keeps_its_volume_guarded) | \
           test(a_second_exporter_leaves_the_owners_guard_alone))) | \
          (binary(guard_pins) & test(a_start_killed_at_any_step)) | \
          (binary(allocs) & test(an_allocation_stays_guarded_through_exporter_restarts)))"
    };
}

/// The compatibility pass: what runs on 6.12 and 7.x besides the full
/// suite on 6.1, chosen for what the kernel decides and for what one
/// emulator thread can run in CI's budget. The guard's enforcement
/// through each kernel's hooks (7.x judges in `inode_file_setattr`, 6.12
/// has `file_ioctl_compat`), on both filesystems: an owner's escapes, the
/// defaults, a file outside the volumes, an overlay, the generation, the
/// detect counts, what the exporter counts and logs; the programs
/// attaching, the exporter's write counts and quota refusals and its
/// self-test; the plugin's enforcement; ext4 on a failing disk; the
/// volume numbers the exporter derives, against each kernel's statfs of a
/// root (whose free space the kernels report differently). Each adds
/// one filesystem's cases of the attach races (`attach_races!`). Everything
/// else runs on 6.1 only: the plugin's and the exporter's own logic, crash
/// recovery, the write paths at every depth, the stress, admin, load,
/// hostile, timing, package and dashboard tests.
macro_rules! compat {
    () => {
        "binary(vm_smoke) | \
     (binary(ebpf) & test(all_programs_attach_and_say_so)) | \
     (binary(exporter_ebpf) & (test(counts_exact_writes_and_quota_refusals_per_volume) | \
       test(=xfs::the_self_test_passes_and_fails_a_hook_that_miscounts))) | \
     (binary(plugin) & test(create_enforces)) | \
     (binary(guard) & (test(enforce_refuses_escapes) | test(the_default_refuses) | \
       test(a_file_outside_the_volumes) | test(a_change_through_an_overlay) | \
       test(enforce_keeps_every_root_generation) | test(enforce_keeps_a_root_generation_on_ext4) | \
       test(detect_counts_escapes) | test(detect_counts_a_root_generation_change) | \
       test(guard_loads_in_both_modes) | \
       test(the_exporter_counts_refuses) | test(squatted_outside))) | \
     (binary(faults) & test(=ext4::disk_errors)) | \
     (binary(exporter) & test(every_metric_matches)) | \
     (binary(capacity) & test(nearly_full_filesystem)) | \
     (binary(allocs) & (test(a_started_allocation) | test(sticky_disk) | test(during_the_walk) | \
       test(guarded_like_a_volume) | test(from_its_claim) | test(walked_back)))"
    };
}

/// A buffered write held inside the hooked function through another
/// exporter's attach: whether the kernel skips its fexit differs between
/// kernels. 6.12 runs it where ext4's generic_perform_write hook does, 7.x
/// where XFS's iomap hook does; 5.10 (the context build) and 6.1, both.
macro_rules! held_write {
    ($fs:literal) => {
        concat!(
            "(binary(exporter_ebpf) & test(=",
            $fs,
            "::a_buffered_write_held_while_another_exporter_attaches_is_reported))"
        )
    };
}

/// 6.12's compatibility pass.
pub const COMPAT_6_12: &str = concat!(
    compat!(),
    " | ",
    held_write!("ext4"),
    " | (",
    attach_races!(),
    " & test(/^xfs::/))"
);
/// 7.x's compatibility pass.
pub const COMPAT_7: &str = concat!(
    compat!(),
    " | ",
    held_write!("xfs"),
    " | (",
    attach_races!(),
    " & test(/^ext4::/))"
);

/// Linux 5.10 runs the context builds of the write telemetry (the write
/// paths on XFS, the exporter's counts and a held buffered write on both
/// filesystems) and of the
/// guard's detect programs, the quotas read through the block device, the
/// plugin's enforcement, and instead of the guard's enforce tests (no BPF
/// LSM in Debian 11's `lsm=`) the checks that it refuses enforcement by
/// name (`old_kernel`).
pub const OLD_KERNEL: &str = "binary(vm_smoke) | binary(old_kernel) | \
     (binary(ebpf) & (test(all_programs_attach_and_say_so) | \
       test(=xfs::every_write_path_counts_exact_bytes_and_calls_at_every_depth))) | \
     (binary(exporter_ebpf) & (test(counts_exact_writes_and_quota_refusals_per_volume) | \
       test(a_buffered_write_held_while_another_exporter_attaches_is_reported))) | \
     (binary(guard) & test(detect_counts)) | (binary(plugin) & test(create_enforces)) | \
     (binary(exporter) & test(every_metric_matches)) | (binary(capacity) & test(nearly_full_filesystem)) | \
     (binary(allocs) & (test(a_started_allocation) | test(sticky_disk) | test(during_the_walk) | \
       test(walked_back)))";

/// The full suite on 6.1 (and on any kernel but 5.10 with `--full`): every
/// binary but `old_kernel`, which checks refusals that only a kernel older
/// than 5.17 makes.
pub const FULL: &str = "all() - binary(old_kernel)";

/// The selections by the names the docs give them.
const NAMED: [(&str, &str); 4] = [
    ("FULL", FULL),
    ("COMPAT_6_12", COMPAT_6_12),
    ("COMPAT_7", COMPAT_7),
    ("OLD_KERNEL", OLD_KERNEL),
];

/// The name of selection `filter` (`selection::COMPAT_7`), for the docs.
pub fn name_of(filter: &str) -> String {
    NAMED
        .iter()
        .find(|(_, f)| *f == filter)
        .map_or_else(|| "a filter".into(), |(n, _)| format!("selection::{n}"))
}

/// Where a test binary of the suite runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runs {
    /// The full suite only (the default kernel's pass).
    Full,
    /// The full suite, and tests of it in the compatibility passes.
    FullAndCompat,
    /// The full suite, and tests of it in the compatibility passes and in
    /// the old kernel's pass.
    Everywhere,
    /// Only in the old kernel's pass: it checks what only a kernel older
    /// than 5.17 does.
    OldOnly,
    /// Only in the systemd passes (`crate::systemd`), never in a suite's.
    SystemdOnly,
}

/// Every test binary of the suite (tests/tests/NAME.rs) and where it runs.
/// A new binary goes here, or the host pass fails: nothing inherits
/// another kernel's selection unseen.
pub const BINARIES: &[(&str, Runs)] = &[
    ("admin", Runs::Full),
    ("alerts", Runs::Full),
    ("allocs", Runs::Everywhere),
    ("capacity", Runs::Everywhere),
    ("crash", Runs::Full),
    ("dashboards", Runs::Full),
    ("ebpf", Runs::Everywhere),
    ("exporter", Runs::Everywhere),
    ("exporter_ebpf", Runs::Everywhere),
    ("exporter_load", Runs::Full),
    ("exporter_no_ebpf", Runs::Full),
    ("exporter_tls", Runs::Full),
    ("faults", Runs::FullAndCompat),
    ("grow", Runs::Full),
    ("guard", Runs::Everywhere),
    ("guard_pins", Runs::FullAndCompat),
    ("hostile", Runs::Full),
    ("old_kernel", Runs::OldOnly),
    ("package", Runs::Full),
    ("plugin", Runs::Everywhere),
    ("runbooks", Runs::Full),
    ("scrape_cost", Runs::Full),
    ("static_plugin", Runs::Full),
    ("stress", Runs::Full),
    ("systemd", Runs::SystemdOnly),
    ("timing", Runs::Full),
    ("vm_smoke", Runs::Everywhere),
];

/// Fails naming each test binary of the suite (the names nextest lists,
/// `prjquota-vmtests::NAME`) that [`BINARIES`] does not place: a VM pass
/// of a binary no selection knows would run it on the default kernel only,
/// or nowhere, unseen.
pub fn check_listed<'a>(built: impl IntoIterator<Item = &'a str>) -> anyhow::Result<()> {
    let unplaced: Vec<&str> = built
        .into_iter()
        .filter_map(|id| id.strip_prefix("prjquota-vmtests::"))
        .filter(|name| !BINARIES.iter().any(|(b, _)| b == name))
        .collect();
    if !unplaced.is_empty() {
        anyhow::bail!(
            "the real-kernel test binaries {unplaced:?} say nowhere which passes run them: add \
             each to BINARIES in xtask/src/selection.rs (and to a kernel's selection there if \
             it runs beyond the full suite), and its floor to xtask/test-floors.txt"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{VmPass, KERNELS};

    /// The test binaries a filterset names (`binary(NAME)`), each once.
    fn binaries_named(filter: &str) -> std::collections::BTreeSet<&str> {
        filter
            .split("binary(")
            .skip(1)
            .filter_map(|rest| rest.split_once(')').map(|(name, _)| name))
            .collect()
    }

    #[test]
    fn every_test_binary_says_where_it_runs() {
        let dir = crate::paths::repo_root().join("tests/tests");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| {
                let name = e.unwrap().file_name().into_string().ok()?;
                name.strip_suffix(".rs").map(str::to_string)
            })
            .collect();
        files.sort();
        let listed: Vec<String> = BINARIES.iter().map(|(b, _)| b.to_string()).collect();
        assert_eq!(
            files, listed,
            "tests/tests/ and selection::BINARIES differ: say where a new test binary runs \
             (in alphabetical order)"
        );
    }

    #[test]
    fn a_binary_nobody_placed_stops_the_run() {
        assert!(check_listed(["prjquota-vmtests::plugin", "prjquota-vmtests::guard"]).is_ok());
        let e = check_listed(["prjquota-vmtests::plugin", "prjquota-vmtests::brand_new"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("brand_new") && e.contains("BINARIES"), "{e}");
    }

    /// Each kernel row's selection names exactly the binaries that say they
    /// run there.
    #[test]
    fn the_filters_name_the_binaries_that_say_so() {
        let expect = |pick: fn(Runs) -> bool| -> std::collections::BTreeSet<&str> {
            BINARIES
                .iter()
                .filter(|(_, r)| pick(*r))
                .map(|(b, _)| *b)
                .collect()
        };
        let compat = expect(|r| matches!(r, Runs::FullAndCompat | Runs::Everywhere));
        let old = expect(|r| matches!(r, Runs::Everywhere | Runs::OldOnly));
        for row in &KERNELS {
            let (filter, want) = match row.pass {
                VmPass::Full => (FULL, expect(|r| r == Runs::OldOnly)),
                VmPass::Compat(f) => (f, compat.clone()),
                VmPass::Only(f) => (f, old.clone()),
            };
            assert_eq!(binaries_named(filter), want, "kernel {}", row.name);
        }
    }

    #[test]
    fn the_full_suite_runs_every_attach_race_and_each_compat_pass_one_fs() {
        let races = attach_races!();
        assert!(!FULL.contains("attach"));
        for (f, fs) in [(COMPAT_6_12, "xfs"), (COMPAT_7, "ext4")] {
            assert!(f.contains(&format!("({races} & test(/^{fs}::/))")), "{f}");
        }
    }
}
