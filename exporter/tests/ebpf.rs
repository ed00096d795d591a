//! `--ebpf` on this host: the real binary, started the way an operator
//! would, where write telemetry cannot load. The development and CI hosts
//! refuse fentry/fexit programs (EPERM even to root); on a host that would
//! attach them, the exporter runs without the eBPF capabilities instead
//! (capsh), so the degraded path is what these tests always take, never a
//! skip. The exporter must say so (attached 0, the reason) and serve
//! everything else; with `--ebpf=required` it must refuse to start; with
//! `--ebpf=off` it says disabled. The VM tests (tests/tests/exporter_ebpf.rs)
//! cover attached.

mod common;

use std::path::Path;

use common::*;
use prjquota_core::record::State;
use prjquota_ebpf::WriteTelemetry;
use prjquota_vmtests::prom::{command_of, run_to_refusal, Exporter};

const A: &str = "aaaaaaaa-2222-4000-8000-000000000001";
const PROGRAMS: [&str; 4] = prjquota_ebpf::HOOK_NAMES;

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_prjquota-exporter"))
}

/// How the exporter is kept from loading write telemetry here, and the
/// reason it must then report: none needed where the host refuses (its own
/// reason), else no eBPF capabilities (`permission`).
fn without_ebpf() -> (bool, &'static str) {
    match WriteTelemetry::load() {
        Ok(_) => (true, "permission"),
        Err(e) => (false, e.reason()),
    }
}

fn start(dir: &Path, args: &[&str], drop_caps: bool) -> Exporter {
    Exporter::start_command(command_of(exe(), &[dir], args, drop_caps))
}

fn volumes_dir(tag: &str) -> TempDir {
    let dir = fresh_dir(&std::env::temp_dir(), tag);
    add_volume(&dir, record(A, "default", 4343, State::Ready));
    dir
}

fn has(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

#[test]
fn default_flags_degrade_to_detached_and_serve_the_rest() {
    let (drop_caps, reason) = without_ebpf();
    eprintln!(
        "write telemetry here: detached, reason {reason} (capabilities dropped: {drop_caps})"
    );
    let dir = volumes_dir("ebpf-auto");
    let exp = start(&dir, &[], drop_caps);
    // Twice: the reason is still reported, and logged only once.
    let mut text = String::new();
    for _ in 0..2 {
        let r = get(exp.addr, "/metrics");
        assert_eq!(r.status, 200);
        text = r.body;
    }
    for p in PROGRAMS {
        let line = format!("prjquota_exporter_ebpf_program_attached{{program=\"{p}\"}} 0");
        assert!(has(&text, &line), "missing {line:?} in\n{text}");
    }
    let line = format!("prjquota_exporter_ebpf_detached_reason{{reason=\"{reason}\"}} 1");
    assert!(has(&text, &line), "missing {line:?} in\n{text}");
    assert_eq!(
        text.matches("prjquota_exporter_ebpf_detached_reason{")
            .count(),
        1
    );
    assert!(!text.contains("nomad_host_volume_written_bytes_total{"));
    let labels = format!("{{namespace=\"default\",node_pool=\"default\",volume_id=\"{A}\"}}");
    for expected in [
        "prjquota_exporter_scrape_collector_success{collector=\"registry\"} 1".to_string(),
        "prjquota_exporter_scrape_collector_success{collector=\"statfs\"} 1".to_string(),
        "prjquota_exporter_scrape_collector_success{collector=\"ebpf\"} 1".to_string(),
        "prjquota_exporter_volumes 1".to_string(),
        format!("nomad_host_volume_provisioned_bytes{labels} 1073741824"),
    ] {
        assert!(has(&text, &expected), "missing {expected:?} in\n{text}");
    }
    assert!(value(&text, &format!("nomad_host_volume_capacity_bytes{labels}")).unwrap() > 0.0);
    let log = exp.stop();
    assert_eq!(
        log.matches("msg=\"eBPF write telemetry is off").count(),
        1,
        "{log}"
    );
    assert!(log.contains(&format!("reason={reason}")), "{log}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn required_fails_at_start_up_with_the_reason() {
    let (drop_caps, _) = without_ebpf();
    let dir = volumes_dir("ebpf-required");
    let (status, log) = run_to_refusal(
        command_of(exe(), &[&dir], &["--ebpf=required"], drop_caps),
        "--ebpf=required where eBPF cannot load",
    );
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("level=error msg=exiting")
            && log.contains("eBPF write telemetry is required (--ebpf=required) but did not load:"),
        "{log}"
    );
    assert!(!log.contains("msg=\"starting prjquota-exporter\""), "{log}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn off_loads_nothing_and_says_disabled() {
    let dir = volumes_dir("ebpf-off");
    let exp = start(&dir, &["--ebpf=off"], false);
    let text = get(exp.addr, "/metrics").body;
    for p in PROGRAMS {
        let line = format!("prjquota_exporter_ebpf_program_attached{{program=\"{p}\"}} 0");
        assert!(has(&text, &line), "missing {line:?} in\n{text}");
    }
    assert!(
        has(
            &text,
            "prjquota_exporter_ebpf_detached_reason{reason=\"disabled\"} 1"
        ),
        "{text}"
    );
    assert!(has(&text, "prjquota_exporter_volumes 1"), "{text}");
    let log = exp.stop();
    assert!(
        !log.contains("eBPF write telemetry is off"),
        "nothing was tried, nothing failed: {log}"
    );
    assert!(log.contains("ebpf=off"), "{log}");
    std::fs::remove_dir_all(&dir).unwrap();
}
