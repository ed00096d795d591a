//! `cargo xtask stress [--secs N] [--seed S] [--kernel K]`: the long runs.
//! The concurrency stress test (tests/tests/stress.rs) for N seconds per
//! filesystem instead of the few rounds `cargo xtask test` runs, and the
//! exporter's churn test at its full 10,000 volumes (CI runs 1,000) and the
//! plugin's restore storm at 1,000 volumes (CI runs 100); same VM, same
//! checks.

use std::time::Duration;

use anyhow::Result;

use crate::kernels::Kernel;

/// Volumes of the soak run of the exporter's churn test.
const SOAK_CHURN_VOLUMES: &str = "10000";
/// Volumes of the soak run of the plugin's restore storm (Nomad replays
/// every volume of a node at once at agent start).
const SOAK_STORM_VOLUMES: &str = "1000";
/// Directories of the big allocation of the walk's budget test.
const SOAK_ALLOC_DIRS: &str = "1000000";

pub fn main(args: crate::cli::StressArgs) -> Result<u8> {
    let secs = args.secs;
    let seed = args.seed.map(|s| s.to_string());
    let kernel = args.kernel.unwrap_or(Kernel::DEFAULT);
    let mut guest_env = vec![
        ("PRJQUOTA_STRESS_SECS".to_string(), secs.to_string()),
        // The stalled-disk test holds its disk as long, scraping.
        ("PRJQUOTA_STALL_SECS".to_string(), secs.to_string()),
        (
            "PRJQUOTA_CHURN_VOLUMES".to_string(),
            SOAK_CHURN_VOLUMES.to_string(),
        ),
        (
            "PRJQUOTA_STORM_VOLUMES".to_string(),
            SOAK_STORM_VOLUMES.to_string(),
        ),
        (
            "PRJQUOTA_ALLOC_DIRS".to_string(),
            SOAK_ALLOC_DIRS.to_string(),
        ),
    ];
    if let Some(seed) = seed {
        guest_env.push(("PRJQUOTA_STRESS_SEED".to_string(), seed));
    }
    crate::test::run_opts(&crate::test::Opts {
        host: false,
        vm: true,
        filter: Some(
            "binary(stress) | test(a_churn_of_thousands) | test(restore_storm) \
             | (binary(faults) & test(stall)) | test(a_huge_allocation)"
                .into(),
        ),
        vm_threads: 2,
        // The rounds survived and the seed are the point of a long run:
        // show them for passing tests too.
        // Profile `stress` (.config/nextest.toml) stops no test for taking
        // long: the VM limit below bounds the run.
        extra: vec![
            "--profile".into(),
            "stress".into(),
            "--success-output".into(),
            "final".into(),
        ],
        kernels: vec![kernel],
        full: false,
        guest_env,
        // Two filesystems of `secs` each, the churn soak (15 minutes on 6.1),
        // two storms of 1,000 (about 10 minutes each under emulation), the
        // boot and the builds' margin.
        vm_timeout: Some(Duration::from_secs(2 * secs + 65 * 60)),
        vm_cpus: None,
        vm_lanes: None,
        release_deb: false,
    })
}
