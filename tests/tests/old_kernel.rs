//! On a kernel older than 5.17 (Debian 11's 5.10: no `bpf_loop`, no
//! `vfs_fileattr_set`, no BPF LSM in its `lsm=`), the plugin, the exporter's
//! quota metrics, the write telemetry and the guard's detect mode run (the
//! context builds of their programs), the default guard (`auto`) detects
//! and says why, and `--guard=enforce` is refused loudly: a refusal to
//! start that names why and the fix. Only the 5.10 pass runs
//! this binary (see xtask/src/selection.rs); it fails on a kernel new enough for
//! the helpers builds.
//!
//! ```sh
//! cargo xtask test --vm-only --kernel 5.10 --filter 'binary(old_kernel)'
//! ```

use prjquota_vmtests::attack::{chproj_as, open, Who, OWNER};
use prjquota_vmtests::fixture::{fill, Fixture, MIB, XFS};
use prjquota_vmtests::kernel_version;
use prjquota_vmtests::nomad::Spec;
use prjquota_vmtests::prom::{command, run_to_refusal, Exporter};

const ATTEMPTS: &str = "nomad_host_volume_projid_change_attempts_total";

fn assert_old_kernel() {
    let v = kernel_version();
    assert!(
        v < (5, 17),
        "this binary checks a kernel older than 5.17; {v:?} runs the helpers builds (run it with --kernel 5.10)"
    );
}

/// The defaults (`--guard=auto`, detect here: no BPF LSM in 5.10's
/// `lsm=`): quota metrics, write telemetry, and a guard that is ready at
/// start, says why it only detects (metric, warning with the fix, `ready:`
/// line) and counts an owner's escape for its volume at the next scrape.
#[test]
fn defaults_serve_the_quota_metrics_write_telemetry_and_a_counting_guard() {
    assert_old_kernel();
    let f = XFS.fixture("old-kernel-defaults");
    let owner = OWNER.to_string();
    let spec = Spec::new("v", 8 << 20)
        .param("uid", &owner)
        .param("gid", &owner);
    let (path, _) = f.create(&spec);
    assert_ne!(f.project_id(&spec.id), 0);
    assert_eq!(fill(&path.join("data"), MIB, Some(OWNER)).errno, None);
    let exp = Exporter::start(&[&f.node.volumes_dir]);
    let m = exp.scrape();
    // The write telemetry runs: no reason to be detached.
    assert!(
        !m.text.contains("prjquota_exporter_ebpf_detached_reason{"),
        "{}\n{}",
        m.text,
        exp.log()
    );
    assert!(
        !m.text.contains("prjquota_exporter_guard_off_reason{"),
        "the guard runs on 5.10 in detect mode:\n{}\n{}",
        m.text,
        exp.log()
    );
    assert_eq!(
        m.get("prjquota_exporter_guard_mode", &[("mode", "detect")]),
        Some(1.0),
        "{}",
        m.text
    );
    assert_eq!(
        m.get(
            "prjquota_exporter_guard_not_enforcing_reason",
            &[("reason", "lsm_inactive")]
        ),
        Some(1.0),
        "{}",
        m.text
    );
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
    let labels = |result| [("volume_id", spec.id.as_str()), ("result", result)];
    assert_eq!(m.get(ATTEMPTS, &labels("allowed")), Some(0.0), "{}", m.text);

    // The owner moves its file out of the project: detect refuses nothing,
    // and counts it for the volume.
    let data = open(&path.join("data"));
    let (_, r) = chproj_as(Who::User(OWNER), &data, 0);
    assert_eq!(r, Ok(()), "detect mode refuses nothing");
    assert_eq!(Fixture::project_of(&path.join("data")).0, 0);
    let m = exp.scrape();
    assert_eq!(
        (
            m.get(ATTEMPTS, &labels("allowed")),
            m.get(ATTEMPTS, &labels("denied"))
        ),
        (Some(1.0), Some(0.0)),
        "{}\n{}",
        m.text,
        exp.log()
    );

    let log = exp.log();
    for needle in [
        "eBPF write telemetry is off",
        "quota-escape guard is off",
        "needs 5.17",
    ] {
        assert!(!log.contains(needle), "the log says {needle:?}:\n{log}");
    }
    let attach = log
        .lines()
        .find(|l| l.contains("quota-escape guard detects only"))
        .unwrap_or_else(|| panic!("no line says the guard detects only:\n{log}"));
    for needle in [
        "level=warn",
        "build=context",
        "detect=security_file_ioctl",
        "reason=lsm_inactive",
        "add `bpf` to the kernel's `lsm=`",
    ] {
        assert!(
            attach.contains(needle),
            "the line names the build, its hook, why and the fix ({needle:?}): {attach}"
        );
    }
    // prjquota check reads it from the pins: a warning with the fix.
    let line = prjquota_vmtests::check_guard_line(&f.node.volumes_dir);
    assert!(line["ok"] == true && line["warning"] == true, "{line:#}");
    assert!(
        line["detail"]
            .as_str()
            .unwrap()
            .contains("the BPF LSM is not active"),
        "{line:#}"
    );
    assert!(line["fix"].as_str().unwrap().contains("lsm="), "{line:#}");
    let ready = exp.wait_for_line("msg=\"ready:", std::time::Duration::from_secs(30));
    assert!(ready.contains("guard=\"detect (lsm_inactive)\""), "{ready}");
}

/// Enforcement needs the BPF LSM, which Debian 11 builds but does not list
/// in its default `lsm=`: `--guard=enforce` refuses to start, saying so and
/// how to turn it on.
#[test]
fn an_enforcing_guard_refuses_to_start_naming_the_inactive_bpf_lsm() {
    assert_old_kernel();
    let f = XFS.fixture("old-kernel-refusals");
    let flag = "--guard=enforce";
    let (status, err) = run_to_refusal(
        command(&[&f.node.volumes_dir], &[flag], false),
        &format!("{flag} on Linux 5.10"),
    );
    assert!(
        !status.success(),
        "{flag} started on a kernel without the BPF LSM active: {err}"
    );
    for needle in [flag, "BPF LSM is not active", "lsm="] {
        assert!(
            err.contains(needle),
            "the refusal names {needle:?} (the flag, why, the fix): {err}"
        );
    }
}
