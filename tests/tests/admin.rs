//! The operator commands against a real kernel: `check`, `list`,
//! `reconcile`.

use std::os::fd::AsFd;
use std::path::Path;
use std::process::Command;

use prjquota_vmtests::fixture::{fill, Fixture, MIB};
use prjquota_vmtests::nomad::{uuid, Spec};
use prjquota_vmtests::{bin, ext4_mount, scratch_dir, xfs_mount, xfs_noquota_mount};
use serde_json::Value;

/// Runs `prjquota <args>` and returns (exit code, stdout).
fn prjquota(args: &[&str]) -> (i32, String) {
    let out = Command::new(bin("prjquota"))
        .args(args)
        .output()
        .expect("run prjquota");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).expect("utf-8"),
    )
}

fn node_args(f: &Fixture) -> Vec<String> {
    vec![
        "--volumes-dir".into(),
        f.node.volumes_dir.display().to_string(),
        "--plugin-dir".into(),
        f.node.plugin_dir.display().to_string(),
    ]
}

fn run_json(cmd: &str, f: &Fixture, extra: &[&str]) -> (i32, Value) {
    let mut args = vec![cmd.to_string()];
    args.extend(node_args(f));
    args.push("--json".into());
    args.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, out) = prjquota(&refs);
    (
        code,
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}")),
    )
}

/// The `check` lines that failed, by name.
fn failed_checks(v: &Value) -> Vec<String> {
    v["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| c["ok"] == false)
        .map(|c| c["check"].as_str().unwrap().to_string())
        .collect()
}

fn check_passes_on(mount: &Path) {
    let f = Fixture::new(mount, "check-ok");
    // Before the first volume (the volumes dir does not exist yet) and after.
    for round in 0..2 {
        let (code, v) = run_json("check", &f, &[]);
        assert_eq!(
            failed_checks(&v),
            Vec::<String>::new(),
            "round {round}: {v:#}"
        );
        assert_eq!(code, 0);
        assert_eq!(v["ok"], true);
        let capacity = v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["check"] == "capacity")
            .unwrap_or_else(|| panic!("a capacity check: {v:#}"));
        let detail = capacity["detail"].as_str().unwrap();
        let promised = if round == 0 {
            "promised 0 B"
        } else {
            "promised 4 MiB"
        };
        assert!(
            detail.contains("filesystem holds")
                && detail.contains(promised)
                && detail.contains("overcommit_ratio = 1000000"),
            "{detail}"
        );
        f.create(&Spec::new("c", 4 * MIB as i64));
    }
}

#[test]
fn check_passes_on_a_prepared_xfs() {
    check_passes_on(&xfs_mount());
}

#[test]
fn check_passes_on_a_prepared_ext4() {
    check_passes_on(&ext4_mount());
}

/// Root without CAP_SYS_ADMIN (a container's default root) may read a
/// filesystem's quota state but not a project's quota: `check` names the
/// capability, as a refusal the plugin recognises (EPERM), not an
/// unexplained quotactl failure.
#[test]
fn check_names_cap_sys_admin_when_the_kernel_refuses_the_quota_reads() {
    let f = Fixture::new(&xfs_mount(), "check-eperm");
    f.create(&Spec::new("c", 4 * MIB as i64));
    let out = Command::new("capsh")
        .args(["--drop=cap_sys_admin", "--", "-c", "exec \"$@\"", "capsh"])
        .arg(bin("prjquota"))
        .arg("check")
        .args(node_args(&f))
        .arg("--json")
        .output()
        .expect("run prjquota under capsh (libcap2-bin)");
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(failed_checks(&v), ["privileges"], "{v:#}");
    assert_eq!(out.status.code(), Some(1), "{v:#}");
    let item = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "privileges")
        .unwrap();
    assert!(
        item["detail"].as_str().unwrap().contains("(EPERM)")
            && item["fix"].as_str().unwrap().contains("CAP_SYS_ADMIN"),
        "{item:#}"
    );
}

#[test]
fn check_fails_without_prjquota_naming_the_mount_option() {
    let f = Fixture::new(&xfs_noquota_mount(), "check-nq");
    let (code, v) = run_json("check", &f, &[]);
    assert_eq!(code, 1);
    assert_eq!(failed_checks(&v), ["project quota"]);
    let line = &v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "project quota")
        .unwrap();
    assert!(
        line["fix"].as_str().unwrap().contains("-o prjquota"),
        "{line}"
    );
    // The human form marks it with ✗ and says what to do.
    let mut args = vec!["check".to_string()];
    args.extend(node_args(&f));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (_, text) = prjquota(&refs);
    assert!(
        text.contains("✗ project quota") && text.contains("fix:"),
        "{text}"
    );
}

#[test]
fn check_fails_on_tmpfs_naming_the_filesystem() {
    let dir = scratch_dir(&xfs_mount(), "tmpfs");
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(&dir)
        .status()
        .unwrap();
    assert!(st.success());
    let f = Fixture::new(&dir, "check-tmpfs");
    let (code, v) = run_json("check", &f, &[]);
    let _ = Command::new("umount").arg(&dir).status();
    assert_eq!(code, 1);
    assert!(
        failed_checks(&v).contains(&"filesystem".to_string()),
        "{v:#}"
    );
}

#[test]
fn list_shows_volumes_with_their_usage_fullest_first() {
    let f = Fixture::new(&xfs_mount(), "list");
    let a = Spec::new("alpha", 16 * MIB as i64);
    let b = Spec::new("beta", 16 * MIB as i64);
    let (pa, _) = f.create(&a);
    let (pb, _) = f.create(&b);
    assert_eq!(fill(&pa.join("x"), 2 * MIB, None).errno, None);
    assert_eq!(fill(&pb.join("x"), 8 * MIB, None).errno, None);
    let (code, v) = run_json("list", &f, &[]);
    assert_eq!(code, 0);
    assert_follows_the_list_schema(&v);
    let rows = v["volumes"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["name"], "beta", "fullest first");
    assert_eq!(rows[0]["size_bytes"], 16 * MIB);
    let used = rows[0]["used_bytes"].as_u64().unwrap();
    assert!((8 * MIB..8 * MIB + 64 * 1024).contains(&used), "{used}");
    assert_eq!(rows[0]["used_percent"], 50.0);
    assert_eq!(rows[1]["volume_id"], a.id.as_str());
    assert_eq!(rows[1]["project_id"], f.project_id(&a.id));

    let mut args = vec![
        "list".to_string(),
        "--volumes-dir".into(),
        f.node.volumes_dir.display().to_string(),
    ];
    args.push("--bytes".into());
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (_, text) = prjquota(&refs);
    assert!(text.contains("16777216") && text.contains("beta"), "{text}");
    assert!(
        text.contains("total: 2 volumes promised 33554432, using "),
        "{text}"
    );
}

/// `docs/list.schema.json`, which `list --json` is documented to follow.
const LIST_SCHEMA: &str = include_str!("../../docs/list.schema.json");

/// Validates `doc` against the list schema with Debian's python3-jsonschema
/// (a validator of its own, not this project's reading of the schema).
fn assert_follows_the_list_schema(doc: &Value) {
    use std::io::Write;
    let mut child = Command::new(prjquota_vmtests::PYTHON)
        .args([
            "-c",
            "import json, sys, jsonschema\n\
             schema = json.loads(sys.argv[1])\n\
             jsonschema.Draft202012Validator.check_schema(schema)\n\
             jsonschema.Draft202012Validator(schema).validate(json.load(sys.stdin))",
            LIST_SCHEMA,
        ])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run python3 (jsonschema: cargo xtask deps installs python3-jsonschema)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(doc.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "list --json does not follow docs/list.schema.json: {}\n{doc:#}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The JSON has a key the schema forbids: the validator refuses it, so
/// the check above can fail.
#[test]
fn the_list_schema_refuses_what_it_does_not_describe() {
    let mut doc: Value = serde_json::from_str(r#"{"version": 1, "volumes": []}"#).unwrap();
    assert_follows_the_list_schema(&doc);
    doc["extra"] = Value::from(1);
    let r = std::panic::catch_unwind(|| assert_follows_the_list_schema(&doc));
    assert!(r.is_err(), "an unknown top-level key passed the schema");
}

#[test]
fn list_filters_by_namespace_pool_name_and_fill() {
    let f = Fixture::new(&xfs_mount(), "list-filter");
    let mut specs = Vec::new();
    for (name, ns, fill_mib) in [
        ("db-orders", "prod", 7),
        ("db-users", "prod", 1),
        ("cache", "prod", 7),
        ("db-orders", "staging", 0),
    ] {
        let mut s = Spec::new(name, 8 * MIB as i64);
        s.namespace = ns.into();
        let (p, _) = f.create(&s);
        if fill_mib > 0 {
            assert_eq!(fill(&p.join("x"), fill_mib * MIB, None).errno, None);
        }
        specs.push(s);
    }
    let names = |extra: &[&str]| -> Vec<(String, String)> {
        let (code, v) = run_json("list", &f, extra);
        assert_eq!(code, 0, "{extra:?}");
        assert_follows_the_list_schema(&v);
        assert_eq!(v["version"], 1);
        let mut n: Vec<(String, String)> = v["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["namespace"].as_str().unwrap().into(),
                    r["name"].as_str().unwrap().into(),
                )
            })
            .collect();
        n.sort();
        n
    };
    let pair = |ns: &str, n: &str| (ns.to_string(), n.to_string());
    assert_eq!(names(&[]).len(), 4);
    assert_eq!(
        names(&["--namespace", "prod", "--name", "db-*"]),
        [pair("prod", "db-orders"), pair("prod", "db-users")]
    );
    assert_eq!(
        names(&["--name", "db-orders"]),
        [pair("prod", "db-orders"), pair("staging", "db-orders")]
    );
    assert_eq!(
        names(&["--min-used", "80%"]),
        [pair("prod", "cache"), pair("prod", "db-orders")]
    );
    assert_eq!(names(&["--node-pool", "gpu"]), []);
    assert_eq!(
        names(&["--node-pool", "default", "--name", "c?che"]),
        [pair("prod", "cache")]
    );
    // Every command answers --help, and a typo gets a suggestion.
    // (`dashboards` is prjquota-dashboards' own executable now.)
    for cmd in ["check", "list", "grow", "reconcile", "install"] {
        let out = Command::new(bin("prjquota"))
            .args([cmd, "--help"])
            .output()
            .unwrap();
        assert!(out.status.success(), "prjquota {cmd} --help: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("Usage: prjquota"),
            "{cmd}"
        );
    }
    let out = Command::new(bin("prjquota"))
        .args(["list", "--min-usde", "5"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--min-used"),
        "{out:?}"
    );
}

#[test]
fn reconcile_finds_every_kind_of_orphan_and_fix_repairs_without_losing_data() {
    let f = Fixture::new(&xfs_mount(), "reconcile");
    let vols = f.node.volumes_dir.clone();
    let (code, v) = run_json("reconcile", &f, &[]);
    assert_eq!(
        (code, v["clean"].clone()),
        (0, Value::Bool(true)),
        "fresh node is clean: {v:#}"
    );

    // 1. A directory named like a volume, with data, that no record holds.
    f.create(&Spec::new("seed", 4 * MIB as i64));
    let orphan_dir = vols.join(uuid());
    std::fs::create_dir(&orphan_dir).unwrap();
    std::fs::write(orphan_dir.join("data"), b"keep").unwrap();
    // 2. A record whose directory is gone.
    let gone = Spec::new("gone", 4 * MIB as i64);
    let (gone_path, _) = f.create(&gone);
    std::fs::remove_dir_all(&gone_path).unwrap();
    // 3. A project in the node's range with limits but no record.
    let dirfd = std::fs::File::open(&vols).unwrap();
    let stray = f.id_max;
    let limits = prjquota_core::quota::Limits {
        bytes_hard: 8 * MIB,
        ..Default::default()
    };
    prjquota_core::quota::set_limits(dirfd.as_fd(), stray, &limits).unwrap();
    // 4. A volume whose root carries another project ID.
    let retag = Spec::new("retag", 4 * MIB as i64);
    let (retag_path, _) = f.create(&retag);
    std::fs::write(retag_path.join("data"), b"keep").unwrap();
    let rfd = std::fs::File::open(&retag_path).unwrap();
    prjquota_core::quota::tag(rfd.as_fd(), f.id_max - 1).unwrap();
    // 5. A volume whose limit was changed behind the plugin's back.
    let limit = Spec::new("limit", 4 * MIB as i64);
    f.create(&limit);
    let lim = prjquota_core::quota::Limits {
        bytes_hard: 64 * MIB,
        ..Default::default()
    };
    prjquota_core::quota::set_limits(dirfd.as_fd(), f.project_id(&limit.id), &lim).unwrap();
    // 6. Stale temp and lock files.
    let reg = vols.join(".prjquota");
    std::fs::write(reg.join(format!("volumes/.{}.json.tmp", uuid())), b"{").unwrap();
    std::fs::write(reg.join(format!("locks/{}.lock", uuid())), b"").unwrap();
    // 7. A project-ID reservation for a volume that has no record.
    std::fs::write(reg.join(format!("ids/{}.{}", f.id_max - 2, uuid())), b"").unwrap();

    // The kinds found, each once (re-tagging a root also makes the other
    // project charged for it, a second orphan-project until repaired).
    let kinds = |v: &Value| -> Vec<String> {
        let k: std::collections::BTreeSet<String> = v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["kind"].as_str().unwrap().to_string())
            .collect();
        k.into_iter().collect()
    };
    let (code, v) = run_json("reconcile", &f, &[]);
    assert_eq!(code, 1);
    assert_eq!(
        kinds(&v),
        [
            "missing-directory",
            "orphan-directory",
            "orphan-project",
            "stale-lock-file",
            "stale-reservation",
            "stale-temp-file",
            "wrong-limits",
            "wrong-project",
        ],
        "{v:#}"
    );
    // Without --fix nothing changed.
    assert!(!gone_path.exists());

    let (_, v) = run_json("reconcile", &f, &["--fix"]);
    for finding in v["findings"].as_array().unwrap() {
        let fixed = finding["fixed"] == true;
        let expect_fixed = finding["kind"] != "orphan-directory";
        assert_eq!(fixed, expect_fixed, "{finding}");
    }
    // No data lost, everything repaired.
    assert_eq!(std::fs::read(orphan_dir.join("data")).unwrap(), b"keep");
    assert_eq!(std::fs::read(retag_path.join("data")).unwrap(), b"keep");
    assert!(gone_path.is_dir());
    assert_eq!(
        Fixture::project_of(&gone_path),
        (f.project_id(&gone.id), true)
    );
    assert_eq!(
        Fixture::project_of(&retag_path),
        (f.project_id(&retag.id), true)
    );
    assert!(f.quota(stray).is_unused());
    assert_eq!(f.quota(f.project_id(&limit.id)).limits.bytes_hard, 4 * MIB);

    // A second run finds only what it must leave to a person.
    let (_, v) = run_json("reconcile", &f, &["--fix"]);
    assert_eq!(kinds(&v), ["orphan-directory"], "{v:#}");
    std::fs::remove_dir_all(&orphan_dir).unwrap();
    let (code, v) = run_json("reconcile", &f, &[]);
    assert_eq!((code, v["clean"].clone()), (0, Value::Bool(true)), "{v:#}");
}
