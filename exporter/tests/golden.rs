//! The whole scrape of a fixed node held to a committed file, as
//! node_exporter's `e2e-output.txt`: every family's HELP and TYPE and every
//! series, in order, that dashboards, rules and operators' queries read.
//! A renamed metric or label, a family that drops out of a scrape, a help
//! text changed by accident: each shows as a diff of
//! `exporter/tests/fixtures/scrape.txt`.
//!
//! The node: two ready volumes and one whose root is gone, on tmpfs (no
//! project quota on the host: the quota collectors fail as they do
//! there), no eBPF, no guard. What the host decides is masked: sample
//! values (sizes, timings) but those the records and settings decide
//! (`KEPT_VALUES`), and the label values that name the host or the build
//! (`MASKED_LABELS`). Names, labels, help, types and order are not.
//!
//! After a deliberate change, write the file anew and read its diff:
//!
//! ```sh
//! PRJQUOTA_GOLDEN=write cargo nextest run -p prjquota-exporter --test golden
//! ```

mod common;

use std::path::{Path, PathBuf};

use common::*;
use prjquota_core::record::State;
use prjquota_exporter::Exporter;

const FIXTURE: &str = "tests/fixtures/scrape.txt";

/// Families whose values the node's records and the settings decide:
/// kept, so that a wrong value shows too.
const KEPT_VALUES: &[&str] = &[
    "nomad_host_volume_info",
    "nomad_host_volume_provisioned_bytes",
    "nomad_host_volume_requested_min_bytes",
    "nomad_host_volume_requested_max_bytes",
    "nomad_host_volume_stats_error",
    "prjquota_exporter_registry_corrupt_records",
    "prjquota_exporter_registry_pending_records",
    "prjquota_exporter_ebpf_program_attached",
    "prjquota_exporter_guard_mode",
    "prjquota_exporter_guard_enforcing",
];

/// Labels whose values are the host's or the build's.
const MASKED_LABELS: &[&str] = &["revision", "version", "goversion", "device", "mountpoint"];

const A: &str = "aaaaaaaa-1111-4000-8000-000000000001";
const B: &str = "bbbbbbbb-2222-4000-8000-000000000002";
const GONE: &str = "cccccccc-3333-4000-8000-000000000003";

/// `line` with its value and host-specific label values masked; comments
/// (HELP, TYPE) as they are.
fn masked(line: &str) -> String {
    if line.starts_with('#') || line.is_empty() {
        return line.to_string();
    }
    let (series, value) = line.rsplit_once(' ').unwrap_or((line, ""));
    let family = series.split('{').next().unwrap_or(series);
    let mut out = String::with_capacity(series.len() + 8);
    let mut rest = series;
    while let Some(i) = rest.find("=\"") {
        let name_start = rest[..i].rfind(['{', ',']).map_or(0, |j| j + 1);
        let name = &rest[name_start..i];
        let value_start = i + 2;
        let mut end = value_start;
        let bytes = rest.as_bytes();
        while end < bytes.len() && bytes[end] != b'"' {
            end += if bytes[end] == b'\\' { 2 } else { 1 };
        }
        out.push_str(&rest[..value_start]);
        if MASKED_LABELS.contains(&name) {
            out.push_str("<masked>");
        } else {
            out.push_str(&rest[value_start..end]);
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    if KEPT_VALUES.contains(&family) {
        format!("{out} {value}")
    } else {
        out + " <value>"
    }
}

fn node(dir: &Path) {
    add_volume(dir, record(A, "default", 4242, State::Ready));
    add_volume(dir, record(B, "prod", 4243, State::Ready));
    add_volume(dir, record(GONE, "prod", 4244, State::Ready));
    std::fs::remove_dir(dir.join(GONE)).unwrap();
}

#[tokio::test]
async fn the_whole_scrape_is_the_committed_one() {
    // A path of its own, the same on every run: it is a label value.
    let dir = PathBuf::from("/dev/shm/prjquota-golden-scrape");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    node(&dir);
    let exporter = Exporter::new(&host_config(&dir));
    // The first scrape starts what loads in the background; the second is
    // the steady one an operator sees.
    let _ = exporter.scrape().await;
    let text = exporter.scrape().await.to_text();
    std::fs::remove_dir_all(&dir).unwrap();
    let got: String = text.lines().map(|l| masked(l) + "\n").collect();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURE);
    if std::env::var("PRJQUOTA_GOLDEN").as_deref() == Ok("write") {
        std::fs::write(&path, &got).unwrap();
        eprintln!("wrote {}", path.display());
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    if got != want {
        let diff: Vec<String> = diff_lines(&want, &got);
        panic!(
            "the scrape is not {FIXTURE} ({} lines differ; - committed, + now):\n{}\n\n\
             If the change is meant, write the file anew and commit it: \
             PRJQUOTA_GOLDEN=write cargo nextest run -p prjquota-exporter --test golden",
            diff.len(),
            diff.join("\n")
        );
    }
}

/// The lines only one side has, each marked with its side.
fn diff_lines(want: &str, got: &str) -> Vec<String> {
    let (w, g): (Vec<&str>, Vec<&str>) = (want.lines().collect(), got.lines().collect());
    let mut out: Vec<String> = w
        .iter()
        .filter(|l| !g.contains(l))
        .map(|l| format!("- {l}"))
        .collect();
    out.extend(
        g.iter()
            .filter(|l| !w.contains(l))
            .map(|l| format!("+ {l}")),
    );
    if out.is_empty() {
        out.push("(the same lines in another order)".into());
    }
    out
}

#[test]
fn masking_keeps_names_labels_and_order() {
    assert_eq!(
        masked(r#"a_b{x="1",revision="abc\"d",y="z"} 12.5"#),
        r#"a_b{x="1",revision="<masked>",y="z"} <value>"#
    );
    assert_eq!(masked("plain 3"), "plain <value>");
    assert_eq!(
        masked(r#"prjquota_exporter_guard_mode{mode="off"} 1"#),
        r#"prjquota_exporter_guard_mode{mode="off"} 1"#
    );
    assert_eq!(masked("# HELP a b c"), "# HELP a b c");
}
