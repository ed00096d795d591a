//! On a kernel too old for the guard (Debian 11's 5.10: bpf_loop arrived in
//! 5.17), the plugin, the exporter's quota metrics and the write telemetry
//! (its context-read build) work, and the guard is refused loudly: a metric
//! with the reason, a log line naming the version it needs, and a refusal
//! to start when it was required. Only the 5.10 pass runs this binary (see xtask/src/test.rs);
//! it fails on a kernel new enough for the programs.
//!
//! ```sh
//! cargo xtask test --vm-only --kernel 5.10 --filter 'binary(old_kernel)'
//! ```

use prjquota_vmtests::fixture::XFS;
use prjquota_vmtests::kernel_version;
use prjquota_vmtests::nomad::Spec;
use prjquota_vmtests::prom::{command, run_to_refusal, Exporter};

fn assert_old_kernel() {
    let v = kernel_version();
    assert!(
        v < (5, 17),
        "this binary checks the refusals of a kernel older than 5.17; {v:?} runs the programs (run it with --kernel 5.10)"
    );
}

#[test]
fn defaults_serve_the_quota_metrics_and_write_telemetry_and_say_why_the_guard_is_off() {
    assert_old_kernel();
    let f = XFS.fixture("old-kernel-defaults");
    let spec = Spec::new("v", 8 << 20);
    f.create(&spec);
    let exp = Exporter::start(&[&f.node.volumes_dir]);
    let m = exp.scrape();
    // The write telemetry runs: no reason to be detached.
    assert!(
        !m.text.contains("prjquota_exporter_ebpf_detached_reason{"),
        "{}\n{}",
        m.text,
        exp.log()
    );
    assert_eq!(
        m.get(
            "prjquota_exporter_guard_off_reason",
            &[("reason", "kernel_too_old")]
        ),
        Some(1.0),
        "{}",
        m.text
    );
    assert_eq!(
        m.get("prjquota_exporter_guard_mode", &[("mode", "off")]),
        Some(1.0)
    );
    // Degraded, not failed: every collector succeeds and the volume's
    // quota (its hard limit, as statfs of the project directory reports
    // it) is there.
    m.assert_collectors_succeeded(&exp.log());
    assert_eq!(
        m.get(
            "nomad_host_volume_capacity_bytes",
            &[("volume_id", &spec.id)]
        ),
        Some((8 << 20) as f64),
        "{}",
        m.text
    );
    let log = exp.log();
    assert!(
        !log.contains("eBPF write telemetry is off"),
        "the write telemetry runs on 5.10:\n{log}"
    );
    for needle in ["quota-escape guard is off", "needs 5.17 or later"] {
        assert!(log.contains(needle), "the log says {needle:?}:\n{log}");
    }
}

#[test]
fn an_enforcing_guard_refuses_to_start_naming_the_kernel() {
    assert_old_kernel();
    let f = XFS.fixture("old-kernel-refusals");
    let flag = "--guard=enforce";
    let (status, err) = run_to_refusal(
        command(&[&f.node.volumes_dir], &[flag], false),
        &format!("{flag} on Linux 5.10"),
    );
    assert!(
        !status.success(),
        "{flag} started on a kernel too old: {err}"
    );
    assert!(
        err.contains(flag) && err.contains("kernel too old"),
        "the refusal names {flag} and the kernel: {err}"
    );
}
