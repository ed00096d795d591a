//! The artefacts of `dashboards/` and their inputs, as the tests read
//! them: the shipped dashboard and rules, the shipped and a custom config,
//! what a config renders to, and promtool.

use std::path::PathBuf;

use serde_json::Value;

use crate::{config, render};

/// `dashboards/`, where the artefacts live.
pub fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The workspace root.
pub fn repo_root() -> PathBuf {
    dir()
        .parent()
        .expect("dashboards/ has a parent")
        .to_path_buf()
}

pub use crate::render::{DASHBOARD, RULES};
pub const RULES_TEST: &str = "alerts_test.yaml";

/// Reads a file of `dashboards/`, panicking with its path.
pub fn read(name: &str) -> String {
    let p = dir().join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

pub fn dashboard() -> Value {
    serde_json::from_str(&read(DASHBOARD))
        .unwrap_or_else(|e| panic!("dashboards/{DASHBOARD} is not valid JSON: {e}"))
}

pub fn rules() -> serde_norway::Value {
    serde_norway::from_str(&read(RULES))
        .unwrap_or_else(|e| panic!("dashboards/{RULES} is not valid YAML: {e}"))
}

/// The shipped config, `dashboards/config.toml`.
pub fn shipped_config() -> config::Config {
    config::Config::load(&dir().join(config::FILE)).unwrap_or_else(|e| panic!("{e}"))
}

/// `dashboards/tests/custom.toml`: a config that changes every kind of knob
/// (a job selector, another cluster label, other thresholds and durations,
/// a runbook of one's own, another dashboard identity), which the lints
/// run on next to the shipped files.
pub fn custom_config() -> config::Config {
    config::Config::load(&dir().join("tests/custom.toml")).unwrap_or_else(|e| panic!("{e}"))
}

/// The rules and dashboard rendered from `c`, parsed.
pub fn rendered(c: &config::Config) -> (Value, serde_norway::Value) {
    let d = render::dashboard(c).unwrap_or_else(|e| panic!("render the dashboard: {e}"));
    let r = render::rules(c).unwrap_or_else(|e| panic!("render the rules: {e}"));
    (
        serde_json::from_str(&d).expect("rendered dashboard is JSON"),
        serde_norway::from_str(&r).expect("rendered rules are YAML"),
    )
}

/// The shipped files, then the render of [`custom_config`]: each named,
/// with its config, dashboard and rules, for lints that must hold for any
/// config.
pub fn cases() -> Vec<(&'static str, config::Config, Value, serde_norway::Value)> {
    let custom = custom_config();
    let (d, r) = rendered(&custom);
    vec![
        ("shipped files", shipped_config(), dashboard(), rules()),
        ("render of tests/custom.toml", custom, d, r),
    ]
}

/// A fresh directory under the system's temp dir for one test.
pub fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("prjquota-dashboards-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("create {}: {e}", d.display()));
    d
}

pub const PROMTOOL: &str = "/usr/bin/promtool";

/// Runs promtool in dashboards/; panics with its output unless it succeeds.
pub fn promtool(args: &[&str]) -> String {
    assert!(
        std::path::Path::new(PROMTOOL).is_file(),
        "{PROMTOOL} is missing: run `cargo xtask deps` (it installs Debian's `prometheus` package, which ships promtool)"
    );
    let out = std::process::Command::new(PROMTOOL)
        .args(args)
        .current_dir(dir())
        .output()
        .unwrap_or_else(|e| panic!("run {PROMTOOL}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool {} failed ({}):\n{text}",
        args.join(" "),
        out.status
    );
    text
}
