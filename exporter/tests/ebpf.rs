//! `--ebpf` on this host: the real binary, started the way an operator
//! would. The development host refuses fentry/fexit programs (EPERM even
//! to root), so write telemetry cannot attach here: the exporter must say
//! so (attached 0, the crate's reason) and serve everything else; with
//! `--ebpf=required` it must refuse to start; with `--ebpf=off` it says
//! disabled. The VM tests (tests/tests/exporter_ebpf.rs) cover attached.

mod common;

use std::path::Path;
use std::time::Duration;

use common::child::{self, Running};
use common::*;
use prjquota::registry::State;
use prjquota_ebpf::WriteTelemetry;

const A: &str = "aaaaaaaa-2222-4000-8000-000000000001";
const PROGRAMS: [&str; 3] = prjquota_exporter::collector::ebpf::PROGRAMS;

/// What loading write telemetry does on this host: `None` if it attaches,
/// else the crate's reason label.
fn host_reason() -> Option<&'static str> {
    match WriteTelemetry::load() {
        Ok(_) => None,
        Err(e) => Some(e.reason()),
    }
}

fn start(dir: &Path, extra: &[&str]) -> Running {
    let r = child::start(dir, extra);
    wait_ready(r.addr);
    r
}

/// Polls /healthz until the exporter says it is ready (200): before that
/// /metrics answers 503 by design.
fn wait_ready(addr: std::net::SocketAddr) {
    let started = std::time::Instant::now();
    loop {
        let r = get(addr, "/healthz");
        if r.status == 200 {
            return;
        }
        assert_eq!(r.status, 503, "/healthz while starting: {}", r.body);
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not ready after 60s: {}",
            r.body
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn volumes_dir(tag: &str) -> std::path::PathBuf {
    let dir = fresh_dir(&std::env::temp_dir(), tag);
    add_volume(&dir, record(A, "default", 4343, State::Ready));
    dir
}

fn has(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

#[test]
fn default_flags_degrade_to_detached_and_serve_the_rest() {
    let Some(reason) = host_reason() else {
        eprintln!("skipping: write telemetry attaches on this host (the VM tests cover it)");
        return;
    };
    eprintln!("write telemetry on this host: detached, reason {reason}");
    let dir = volumes_dir("ebpf-auto");
    let exp = start(&dir, &[]);
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
    if host_reason().is_none() {
        eprintln!("skipping: write telemetry attaches on this host");
        return;
    }
    let dir = volumes_dir("ebpf-required");
    let (mut child, lines) = child::spawn(&dir, &["--ebpf=required"]);
    let mut status = None;
    for _ in 0..600 {
        if let Some(st) = child.try_wait().unwrap() {
            status = Some(st);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("--ebpf=required did not exit within 60s");
    };
    std::thread::sleep(Duration::from_millis(100));
    let log = lines.try_iter().collect::<Vec<_>>().join("\n");
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
    let exp = start(&dir, &["--ebpf=off"]);
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
