//! The exporter where eBPF cannot load (run without CAP_BPF, CAP_PERFMON and
//! CAP_SYS_ADMIN): `--ebpf=auto` degrades and says why, `--ebpf=required`
//! and `--guard=enforce` refuse to start and say why. On a host where eBPF
//! attaches these paths are otherwise never taken.

use std::time::{Duration, Instant};

use prjquota_vmtests::fixture::{Fixture, XFS};
use prjquota_vmtests::nomad::Spec;
use prjquota_vmtests::prom::{command, run_to_refusal, Exporter};

const ATTACHED: &str = "prjquota_exporter_ebpf_program_attached";
const REASON: &str = "prjquota_exporter_ebpf_detached_reason";

/// Runs an exporter without the eBPF capabilities to its exit, which must
/// come (it is refusing to start); returns the exit status and its stderr.
fn refused(f: &Fixture, args: &[&str]) -> (std::process::ExitStatus, String) {
    run_to_refusal(
        command(&[&f.node.volumes_dir], args, true),
        &format!("{args:?} and no eBPF capabilities"),
    )
}

#[test]
fn ebpf_auto_without_capabilities_serves_the_rest_and_says_why() {
    let f = XFS.fixture("no-ebpf-auto");
    let spec = Spec::new("v", 8 << 20);
    f.create(&spec);
    let exp = Exporter::start_without_bpf_caps(&[&f.node.volumes_dir], &["--ebpf=auto"]);
    // The start-up load runs in the background: wait for its verdict.
    let deadline = Instant::now() + Duration::from_secs(120);
    let m = loop {
        let m = exp.scrape();
        if m.get(REASON, &[("reason", "loading")]).is_none() || Instant::now() > deadline {
            break m;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let attached: Vec<_> = m.find(ATTACHED, &[]).collect();
    assert!(!attached.is_empty(), "no {ATTACHED} series:\n{}", exp.log());
    for s in attached {
        assert_eq!(
            s.value,
            0.0,
            "{s:?} attached without CAP_BPF:\n{}",
            exp.log()
        );
    }
    assert_eq!(
        m.get(REASON, &[("reason", "permission")]),
        Some(1.0),
        "the detached reason is permission:\n{}",
        exp.log()
    );
    assert_eq!(
        m.get("nomad_host_volume_info", &[("volume_id", &spec.id)]),
        Some(1.0),
        "the volume is still exported without eBPF:\n{}",
        exp.log()
    );
}

#[test]
fn ebpf_required_without_capabilities_refuses_to_start_and_names_the_reason() {
    let f = XFS.fixture("no-ebpf-required");
    let (status, err) = refused(&f, &["--ebpf=required"]);
    assert!(
        !status.success(),
        "--ebpf=required started without eBPF: {err}"
    );
    // The start-up load's first refusal is creating a map (EPERM), which
    // the exporter words as "not permitted".
    assert!(
        err.contains("--ebpf=required") && err.contains("not permitted"),
        "the refusal names the flag and the reason (not permitted): {err}"
    );
}

#[test]
fn guard_enforce_without_capabilities_refuses_to_start_and_names_the_guard() {
    let f = XFS.fixture("no-guard-enforce");
    let (status, err) = refused(&f, &["--guard=enforce"]);
    assert!(
        !status.success(),
        "--guard=enforce started without eBPF: {err}"
    );
    assert!(err.contains("guard"), "the refusal names the guard: {err}");
}
