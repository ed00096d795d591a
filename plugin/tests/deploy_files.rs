//! The files under deploy/ are what operators install; each is checked by
//! the tool that will read it: HCL by a strict HCL parser, the node config by
//! the plugin's own parser, the systemd unit by `systemd-analyze verify`,
//! the Prometheus config by `promtool check config`.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn deploy(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(rel)
}

fn hcl(rel: &str) -> Value {
    let text = std::fs::read_to_string(deploy(rel)).unwrap();
    hcl::from_str(&text).unwrap_or_else(|e| panic!("{rel} is not valid HCL: {e}"))
}

#[test]
fn the_example_volume_spec_uses_the_plugin_and_its_parameters() {
    let v = hcl("nomad/volume.hcl");
    assert_eq!(v["type"], "host");
    assert_eq!(v["plugin_id"], "prjquota");
    let params = v["parameters"].as_object().unwrap();
    for (k, val) in params {
        assert!(
            prjquota_core::volume_params::KNOWN.contains(&k.as_str()),
            "unknown parameter {k}"
        );
        assert!(val.is_string(), "parameter {k} must be a quoted string");
    }
    let client = hcl("nomad/client.hcl");
    assert!(client["client"]["host_volume_plugin_dir"].is_string());
}

/// The exporter's ACL policy grants what its Nomad client calls
/// (docs/nomad.md#acl-policy) and nothing more: node metadata, allocations
/// and host volumes read, in every namespace.
#[test]
fn the_exporters_acl_policy_grants_exactly_what_it_uses() {
    let v = hcl("nomad/prjquota-exporter.policy.hcl");
    let top: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(top, ["namespace", "node"], "{v}");
    assert_eq!(v["node"], serde_json::json!({"policy": "write"}));
    let ns = v["namespace"].as_object().unwrap();
    assert_eq!(ns.keys().collect::<Vec<_>>(), ["*"]);
    assert_eq!(
        ns["*"],
        serde_json::json!({"capabilities": ["read-job", "host-volume-read"]})
    );
}

#[test]
fn the_example_node_config_parses() {
    let path = deploy("prjquota.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let cfg = prjquota_core::config::parse(&text, &path).unwrap();
    assert_eq!(cfg.default_capacity, Some(10 << 30));
    assert_eq!(cfg.default_mode, 0o750);
}

#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    // verify also checks that ExecStart= and ExecStartPre= exist: point
    // them at a binary that does, in a copy, and verify everything else as
    // written.
    let unit = std::fs::read_to_string(deploy("systemd/prjquota-exporter.service")).unwrap();
    assert!(unit.contains("ProtectSystem=strict") && unit.contains("NoNewPrivileges=yes"));
    let dir = std::env::temp_dir().join(format!("prjquota-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("prjquota-exporter.service");
    std::fs::write(
        &copy,
        // The man page is the package's: not on the build machine.
        unit.replace("/usr/bin/prjquota-exporter", "/bin/true")
            .replace(
                "/usr/lib/systemd/system-generators/prjquota-exporter-generator",
                "/bin/true",
            )
            .replace("man:prjquota-exporter(1) ", ""),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .expect("systemd-analyze (Debian's systemd package) is needed for this test");
    let stderr = String::from_utf8_lossy(&out.stderr);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(out.status.success(), "systemd-analyze verify: {stderr}");
    assert!(
        !stderr.contains("prjquota-exporter.service"),
        "warnings about the unit: {stderr}"
    );
}

#[test]
fn the_prometheus_config_passes_promtool() {
    let text = std::fs::read_to_string(deploy("prometheus/prometheus.yml")).unwrap();
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dashboards/alerts.yaml");
    let dir = std::env::temp_dir().join(format!("prjquota-prom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("prometheus.yml");
    std::fs::write(
        &copy,
        text.replace(
            "/etc/prometheus/rules/prjquota-alerts.yaml",
            rules.to_str().unwrap(),
        ),
    )
    .unwrap();
    let out = Command::new("promtool")
        .args(["check", "config"])
        .arg(&copy)
        .output()
        .expect("promtool (Debian's prometheus package) is needed: run `cargo xtask deps`");
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        out.status.success(),
        "promtool check config: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
