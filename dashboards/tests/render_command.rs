//! `prjquota-dashboards render` as an operator runs it from the package:
//! the built binary, a copy of the shipped config (what the package
//! installs as /usr/share/prjquota/dashboards/config.toml) edited, and the
//! output compared with the shipped files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn dashboards(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("prjquota-render-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn render(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_prjquota-dashboards"))
        .args(args)
        .output()
        .expect("run prjquota-dashboards")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn an_edited_copy_of_the_shipped_config_changes_what_is_rendered() {
    let dir = scratch("edited");
    let shipped = std::fs::read_to_string(dashboards("config.toml")).unwrap();
    // Two edits an operator makes: the space alert's critical threshold
    // (the first `critical_available`, under [space]) and the uid.
    let edited = shipped
        .replacen("critical_available = 0.03", "critical_available = 0.07", 1)
        .replace("uid = \"prjquota-volumes\"", "uid = \"ops-host-volumes\"");
    assert_ne!(edited, shipped, "dashboards/config.toml changed its layout");
    let config = dir.join("my-prjquota.toml");
    std::fs::write(&config, edited).unwrap();

    // As shipped: the same files byte for byte (one renderer).
    let same = dir.join("same");
    let o = render(&[
        "render",
        "--config",
        dashboards("config.toml").to_str().unwrap(),
        "--out",
        same.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    for name in ["alerts.yaml", "prjquota.json"] {
        assert!(
            std::fs::read(same.join(name)).unwrap() == std::fs::read(dashboards(name)).unwrap(),
            "the shipped config rendered another {name} than dashboards/{name}"
        );
    }

    let out = dir.join("out");
    let o = render(&[
        "render",
        &format!("--config={}", config.display()),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("alerts.yaml"),
        "{}",
        text(&o)
    );
    let rules = std::fs::read_to_string(out.join("alerts.yaml")).unwrap();
    let shipped_rules = std::fs::read_to_string(dashboards("alerts.yaml")).unwrap();
    assert_eq!(
        rules.matches(") < 0.07").count(),
        1,
        "the space alert's critical rule takes 0.07:\n{rules}"
    );
    assert_eq!(
        rules.matches(") < 0.03").count() + 1,
        shipped_rules.matches(") < 0.03").count(),
        "only the space alert's threshold moves (the inode one keeps 0.03)"
    );
    let d: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("prjquota.json")).unwrap()).unwrap();
    assert_eq!(d["uid"], "ops-host-volumes");
    let shipped_d: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dashboards("prjquota.json")).unwrap())
            .unwrap();
    assert_eq!(d["panels"], shipped_d["panels"], "the panels do not move");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn render_refuses_with_the_fix() {
    let o = render(&["render"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("required arguments were not provided")
            && text(&o).contains("--out <DIR>"),
        "{}",
        text(&o)
    );

    let dir = scratch("bad");
    let config = dir.join("bad.toml");
    std::fs::write(&config, "[space]\ncritical_available = 2\n").unwrap();
    let o = render(&[
        "render",
        "--config",
        config.to_str().unwrap(),
        "--out",
        dir.join("out").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("bad.toml") && text(&o).contains("critical_available"),
        "the error names the file and the field: {}",
        text(&o)
    );
    assert!(
        !dir.join("out").exists(),
        "nothing is written from a bad config"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
