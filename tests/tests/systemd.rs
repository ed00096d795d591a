//! The package as an operator runs it, on a node booted with systemd as
//! init: `dpkg -i`, `systemctl enable --now`, creates exactly as Nomad runs
//! them, the volumes directory moved by /etc/default/prjquota, an upgrade
//! while creates and writes run and a volume owner attacks the guard,
//! `dpkg -r`, `dpkg -P`; then a node with volumes and a `nomad.service`
//! that attacks the guard the moment it starts, rebooted, and rebooted
//! again into each newer kernel. On a kernel without the BPF LSM, what
//! that kernel changes of the story.
//!
//! Runs only in the systemd passes of `cargo xtask test`
//! (xtask/src/systemd.rs): a Debian root of its own booted with systemd as
//! PID 1, this binary run by `systemd.run=`, one test after the other in
//! the order of `systemd::passes`: each step is the state the next starts
//! from, as on a node, and the reboots boot the same root again.

use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prjquota_vmtests::attack::{act, open, Looper, Who, OWNER};
use prjquota_vmtests::http::http_get;
use prjquota_vmtests::nomad::{Node, Spec};
use prjquota_vmtests::prom::{self, Prometheus};

const VOLUMES: &str = "/opt/nomad/data/host_volumes";
const PLUGIN_DIR: &str = "/opt/nomad/data/host_volume_plugins";
const MOVED: &str = "/srv/nomad-volumes";
const UNIT: &str = "prjquota-exporter.service";
const EXPORTER: &str = "/usr/bin/prjquota-exporter";
const PACKAGED_PLUGIN: &str = "/usr/lib/prjquota/prjquota";
const SETTINGS: &str = "/etc/default/prjquota";
/// The inode limit the checked volumes get: only quotactl reports it.
const MAX_INODES: &str = "1000";
/// Creates (each with a write) that run while the upgrade does.
const UPGRADE_CREATES: usize = 20;
/// The guard's per-volume attempts counter.
const ATTEMPTS: &str = "nomad_host_volume_projid_change_attempts_total";
/// What the package ships for Prometheus, and where its config loads the
/// rules from.
const SHIPPED_PROMETHEUS_CONFIG: &str = "/usr/share/prjquota/prometheus/prometheus.yml";
const SHIPPED_RULES: &str = "/usr/share/prjquota/rules/prjquota-alerts.yaml";
const RULES_AT: &str = "/etc/prometheus/rules/prjquota-alerts.yaml";
/// The shipped config's example targets, which an operator replaces with
/// the node's address.
const SHIPPED_TARGETS: &str = r#"["client-1:14646", "client-2:14646"]"#;
/// Alerts that a 5.10 node has pending from its first scrape (its `for:`
/// is an hour): the guard cannot enforce there, by name (no BPF LSM).
const PENDING_ON_5_10: [&str; 1] = ["PrjquotaExporterGuardCannotEnforce"];
/// The node that reboots (a_node_with_volumes_is_set_up_for_a_reboot, then
/// the_guard_holds_from_the_first_moment_of_a_boot): its volumes
/// filesystem, an image kept in the root and mounted at boot by a mount
/// unit (vng binds /dev/null over the guest's /etc/fstab).
const BOOT_VOLUMES: &str = "/srv/bootvolumes";
const BOOT_MOUNT: &str = "srv-bootvolumes.mount";
const BOOT_IMAGE: &str = "/var/lib/prjquota-boot-volumes.img";
/// What the first boot leaves for the second: the volume's path, ID,
/// project ID and the bytes written.
const BOOT_STATE: &str = "/var/lib/prjquota-boot-state";
/// The stub Nomad agent's script and what it records.
const STUB: &str = "/usr/local/lib/stub-nomad";
const STUB_LOG: &str = "/var/lib/stub-nomad.log";
/// The three changes a volume owner tries, as `attr-act` arguments, and on
/// what: the data file's project ID, the root's, the root's PROJINHERIT.
const ESCAPES: [(&str, &str, &str); 3] = [
    ("file_chproj", "data", "chproj 0"),
    ("root_chproj", "", "chproj 0"),
    ("root_projinherit", "", "xflags-clear 200"),
];

/// Runs `cmd` with sh; (success, stdout and stderr).
fn sh(cmd: &str) -> (bool, String) {
    let out = Command::new("sh")
        .args(["-c", cmd])
        .output()
        .unwrap_or_else(|e| panic!("sh -c {cmd:?}: {e}"));
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn sh_ok(cmd: &str) -> String {
    let (ok, out) = sh(cmd);
    assert!(ok, "`{cmd}` failed:\n{out}");
    out
}

fn lap(t: Instant, what: &str) {
    eprintln!(
        "MEASURE systemd_{what}_at_seconds {:.1}",
        t.elapsed().as_secs_f64()
    );
}

/// An XFS of `mib` MiB on a loop device, mounted at `at` with project
/// quotas enforced, as a client's volumes filesystem.
fn xfs(name: &str, at: &str, mib: u64) {
    let img = format!("/var/tmp/{name}.img");
    sh_ok(&format!(
        "set -e; truncate -s {mib}M {img}; mkfs.xfs -q -f {img}; mkdir -p {at}; \
         mount -o loop,prjquota {img} {at}"
    ));
}

fn main_pid() -> u32 {
    sh_ok(&format!("systemctl show -p MainPID --value {UNIT}"))
        .trim()
        .parse()
        .expect("MainPID is a number")
}

fn is_active() -> String {
    sh(&format!("systemctl is-active {UNIT}"))
        .1
        .trim()
        .to_string()
}

fn journal() -> String {
    sh(&format!("journalctl -u {UNIT} --no-pager -o cat")).1
}

/// The exporter's /metrics (it listens on :14646, the packaged setting).
fn metrics() -> String {
    let r = http_get(
        "127.0.0.1:14646".parse().unwrap(),
        "/metrics",
        Duration::from_secs(60),
    )
    .unwrap_or_else(|e| panic!("GET /metrics: {e}\njournal:\n{}", journal()));
    assert_eq!(r.status, 200, "/metrics: {}", r.body);
    r.body
}

/// Whether this kernel can enforce: the BPF LSM is in its active list
/// (Debian's 6.x and 7.x; not 5.10, whose `lsm=` leaves it out, and where
/// the default detects and says why, and `--guard=enforce` is refused by
/// name). The guard detects on every kernel here, as write telemetry and
/// its self-test run on every one.
fn guard_kernel() -> bool {
    sh_ok("cat /sys/kernel/security/lsm")
        .trim()
        .split(',')
        .any(|l| l == "bpf")
}

/// One series' value in the exporter's /metrics text: the first line that
/// starts with `name{` (or is `name value`) and holds every `labels` pair.
fn value(m: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    m.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            let (series, _) = l.rsplit_once(' ').unwrap_or((l, ""));
            (series == name || series.starts_with(&format!("{name}{{")))
                && labels
                    .iter()
                    .all(|(k, v)| series.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Sets `--guard MODE` in /etc/default/prjquota's EXPORTER_ARGS (an
/// operator's edit: the package's default has no --guard, which is auto),
/// or with `None` takes it out again.
fn set_guard(mode: Option<&str>) {
    let text = std::fs::read_to_string(SETTINGS).unwrap();
    let mut found = false;
    let lines: Vec<String> = text
        .lines()
        .map(|l| match l.strip_prefix("EXPORTER_ARGS=\"") {
            Some(rest) if rest.ends_with('"') => {
                found = true;
                let args = rest.trim_end_matches('"');
                let kept = args.split(" --guard ").next().unwrap_or_default();
                match mode {
                    Some(mode) => format!("EXPORTER_ARGS=\"{kept} --guard {mode}\""),
                    None => format!("EXPORTER_ARGS=\"{kept}\""),
                }
            }
            _ => l.to_string(),
        })
        .collect();
    assert!(found, "no EXPORTER_ARGS=\"…\" line in {SETTINGS}:\n{text}");
    std::fs::write(SETTINGS, lines.join("\n") + "\n").unwrap();
}

/// A volume of `node` owned by [`OWNER`], holding `data` (`bytes`, owned by
/// OWNER): its path and project ID.
fn owned_volume(node: &Node, name: &str, bytes: usize) -> (Spec, PathBuf, u32, Vec<u8>) {
    let owner = OWNER.to_string();
    let spec = Spec::new(name, 64 << 20)
        .param("uid", &owner)
        .param("gid", &owner);
    let (path, _) = node.create(&spec).created();
    let data = write_data(&path, bytes, 7);
    std::os::unix::fs::chown(path.join("data"), Some(OWNER), Some(OWNER)).unwrap();
    let (projid, inherit) = project_of(&path);
    assert!(projid != 0 && inherit, "{} is not tagged", path.display());
    (spec, path, projid, data)
}

/// Project ID and PROJINHERIT of `p`.
fn project_of(p: &Path) -> (u32, bool) {
    prjquota_core::quota::project_of(open(p).as_fd()).expect("FS_IOC_FSGETXATTR")
}

/// Bytes charged to project `id` on the filesystem of `dir`.
fn charged(dir: &Path, id: u32) -> u64 {
    prjquota_core::quota::get(open(dir).as_fd(), id)
        .expect("quotactl")
        .used_bytes
}

/// Puts a volume the owner escaped from (5.10: nothing refuses) back into
/// its project, as an administrator would.
fn retag(path: &Path, projid: u32) {
    for p in [path.join("data"), path.to_path_buf()] {
        let f = open(&p);
        let mut a = prjquota_core::sys::get_fsxattr(f.as_fd()).unwrap();
        a.projid = projid;
        if p == path {
            a.xflags |= prjquota_core::sys::FS_XFLAG_PROJINHERIT;
        }
        prjquota_core::sys::set_fsxattr(f.as_fd(), &a).unwrap();
    }
}

/// What the exporter says about `volume_dir`'s volumes under the sandbox:
/// the self-test passed, and the volume's usage, read by
/// quotactl, is there.
fn assert_exporter_sees(volume_id: &str, at_least: u64) {
    let m = metrics();
    let selftest: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("prjquota_exporter_ebpf_selftest_success{"))
        .collect();
    assert!(
        !selftest.is_empty() && selftest.iter().all(|l| l.ends_with(" 1")),
        "the start-up self-test did not pass under the unit's sandbox: {selftest:?}\n\
         journal:\n{}",
        journal()
    );
    // The quota collector read the project quotas: quotactl_fd on 5.14+,
    // quotactl(2) on the filesystem's block device before, which the
    // sandbox must leave visible (no PrivateDevices=). Its inode limit is
    // quotactl's alone (statfs gives the bytes).
    assert!(
        m.lines()
            .any(|l| l == "prjquota_exporter_scrape_collector_success{collector=\"quota\"} 1"),
        "the quota collector failed under the unit's sandbox:\n{}\njournal:\n{}",
        m.lines()
            .filter(|l| l.starts_with("prjquota_exporter_scrape_collector_success"))
            .collect::<Vec<_>>()
            .join("\n"),
        journal()
    );
    assert!(
        m.lines().any(
            |l| l.starts_with("nomad_host_volume_quota_hard_limit_inodes{")
                && l.contains(volume_id)
                && l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok())
                    == MAX_INODES.parse::<f64>().ok()
        ),
        "no quota inode limit {MAX_INODES} (quotactl) for volume {volume_id}:\n{m}"
    );
    let used = m
        .lines()
        .find(|l| l.starts_with("nomad_host_volume_used_bytes{") && l.contains(volume_id))
        .unwrap_or_else(|| {
            panic!(
                "no nomad_host_volume_used_bytes for volume {volume_id}:\n{m}\njournal:\n{}",
                journal()
            )
        });
    let bytes: f64 = used.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(
        bytes >= at_least as f64,
        "the exporter reads {bytes} bytes used for {volume_id}, {at_least} were written: {used}"
    );
}

/// Writes `bytes` of a pattern into `dir/data` and syncs it; returns the
/// pattern's content for later comparison.
fn write_data(dir: &Path, bytes: usize, seed: u8) -> Vec<u8> {
    let data: Vec<u8> = (0..bytes)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect();
    let mut f = std::fs::File::create(dir.join("data"))
        .unwrap_or_else(|e| panic!("write into volume {}: {e}", dir.display()));
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
    data
}

/// systemd's own review of the running unit's sandbox: a system-call
/// allow list, and `systemd-analyze security`'s exposure (0 to 10; 10 is
/// no sandbox at all) no higher than [`MAX_EXPOSURE`].
fn assert_the_sandbox_passes_systemds_review() {
    let filter = sh_ok(&format!(
        "systemctl show -p SystemCallFilter --value {UNIT}"
    ));
    assert!(
        filter.contains("bpf") && filter.contains("quotactl"),
        "the unit's system-call allow list lacks what the exporter calls: {filter:?}"
    );
    let review = sh_ok(&format!("systemd-analyze security --no-pager {UNIT}"));
    let exposure = review
        .lines()
        .find_map(|l| l.split("Overall exposure level for ").nth(1))
        .and_then(|r| r.split(": ").nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no overall exposure in systemd-analyze security:\n{review}"));
    eprintln!("MEASURE systemd_analyze_security_exposure {exposure}");
    assert!(
        exposure <= MAX_EXPOSURE,
        "systemd-analyze security rates the unit {exposure}, above {MAX_EXPOSURE}:\n{review}"
    );
}

/// The highest exposure the unit may have: what it has with every
/// setting the exporter can live with (root with six capabilities, a
/// system-call allow list that must hold bpf(2), quotactl(2) and mount(2),
/// the network), rounded up.
const MAX_EXPOSURE: f64 = 3.5;

/// The start-up self-test's result on a node with no volume yet: 1 per
/// hook the volumes filesystem exercises (XFS: the buffered and the
/// O_DIRECT hook), under the unit's sandbox; the exporter made the
/// registry's directory for its probe, root's and 0700 as the plugin
/// makes it. 5.10 runs the context-read build: the same.
fn assert_selftest_before_the_first_volume() {
    let m = metrics();
    let selftest: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("prjquota_exporter_ebpf_selftest_success{"))
        .collect();
    for hook in ["iomap_file_buffered_write", "iomap_dio_complete"] {
        assert_eq!(
            value(
                &m,
                "prjquota_exporter_ebpf_selftest_success",
                &[("program", hook)]
            ),
            Some(1.0),
            "the self-test of {hook} on a node with no volume yet: {selftest:?}\njournal:\n{}",
            journal()
        );
    }
    prjquota_vmtests::assert_made_as_the_registry(&Path::new(VOLUMES).join(".prjquota"));
}

/// The real Prometheus (3, as `cargo xtask deps` fetches it) with the
/// package's rules and its `deploy/prometheus` config, changed only where
/// an operator changes it: the targets, this node's exporter. The config
/// ships without a `global:` section, so an operator's own comes first;
/// here it scrapes and evaluates every 2 s instead of every minute, so the
/// checks take seconds. The rules load and evaluate without error, the
/// service is up, `volume_id`'s provisioned bytes are queried back, and
/// the healthy node fires no alert (pending on 5.10 only those that say
/// what is off by name there).
fn prometheus_scrapes_the_service(volume_id: &str, provisioned: u64) {
    let binary = prom::prometheus3().expect(
        "PRJQUOTA_PROMETHEUS3 is not set: the systemd pass installs Prometheus 3 from \
         target/prometheus3 (`cargo xtask deps` fetches it)",
    );
    let shipped = std::fs::read_to_string(SHIPPED_PROMETHEUS_CONFIG).expect("the shipped config");
    assert!(
        shipped.contains(SHIPPED_TARGETS) && shipped.contains(RULES_AT),
        "{SHIPPED_PROMETHEUS_CONFIG} no longer names the targets {SHIPPED_TARGETS} and the rules \
         {RULES_AT} this test adapts:\n{shipped}"
    );
    assert!(
        !shipped.lines().any(|l| l.starts_with("global:")),
        "{SHIPPED_PROMETHEUS_CONFIG} has a global: section of its own:\n{shipped}"
    );
    // The operator's step: the rules where the config loads them from.
    std::fs::create_dir_all(Path::new(RULES_AT).parent().unwrap()).unwrap();
    std::fs::copy(SHIPPED_RULES, RULES_AT).unwrap();
    let yaml = format!(
        "global:\n  scrape_interval: 2s\n  scrape_timeout: 2s\n  evaluation_interval: 2s\n{}",
        shipped.replace(SHIPPED_TARGETS, r#"["127.0.0.1:14646"]"#)
    );
    let p = Prometheus::start_config(&binary, &yaml, &[RULES_AT.into()]);
    let up = p.query_until(r#"up{job="prjquota-exporter"}"#, |r| {
        prom::vector(r).iter().any(|(_, v)| *v == 1.0)
    });
    let up = prom::vector(&up);
    assert!(
        up.len() == 1 && up[0].0["instance"] == "127.0.0.1:14646" && up[0].1 == 1.0,
        "{up:?}"
    );
    let q = format!(r#"nomad_host_volume_provisioned_bytes{{volume_id="{volume_id}"}}"#);
    let r = prom::vector(&p.query_until(&q, |r| !prom::vector(r).is_empty()));
    assert_eq!(r.len(), 1, "{q}: {r:?}");
    assert_eq!(r[0].1, provisioned as f64, "{q}: {r:?}");
    // Two evaluations of every group after the volume was seen: the
    // alerts have looked at the node's series.
    let groups = p.rules_evaluated(2);
    let text = std::fs::read_to_string(RULES_AT).unwrap();
    let shipped_rules = text
        .lines()
        .filter(|l| {
            l.trim_start().starts_with("- alert:") || l.trim_start().starts_with("- record:")
        })
        .count();
    let loaded: usize = groups
        .as_array()
        .into_iter()
        .flatten()
        .map(|g| g["rules"].as_array().map_or(0, |r| r.len()))
        .sum();
    assert_eq!(
        loaded, shipped_rules,
        "rules loaded of the shipped file: {groups}"
    );
    let alerts = p.alerts();
    let expected = |a: &serde_json::Value| {
        !guard_kernel()
            && a["state"] == "pending"
            && PENDING_ON_5_10
                .iter()
                .any(|n| a["labels"]["alertname"] == *n)
    };
    let unexpected: Vec<&serde_json::Value> = alerts
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| !expected(a))
        .collect();
    assert!(
        unexpected.is_empty(),
        "alerts of a healthy node: {unexpected:#?}\nmetrics:\n{}",
        metrics()
    );
    eprintln!(
        "Prometheus 3 loaded {loaded} shipped rules, scraped {UNIT} and fired nothing ({} pending)",
        alerts.as_array().map_or(0, |a| a.len())
    );
}

fn deb() -> PathBuf {
    PathBuf::from(prjquota_vmtests::vm_env("PRJQUOTA_DEB"))
}

/// A newer package of the same build: `dpkg-deb -R`, Version `<v>-2`, the
/// plugin and the exporter with bytes appended (an ELF runs with trailing
/// data) so the new files are told from the old, md5sums made again,
/// `dpkg-deb -b`.
fn newer_deb() -> PathBuf {
    let dir = "/var/tmp/prjquota-upgrade";
    let out = PathBuf::from("/var/tmp/prjquota-newer.deb");
    sh_ok(&format!(
        "set -e; rm -rf {dir}; dpkg-deb -R {deb} {dir}; \
         sed -i 's/^Version: \\(.*\\)-1$/Version: \\1-2/' {dir}/DEBIAN/control; \
         grep -q '^Version: .*-2$' {dir}/DEBIAN/control; \
         for f in usr/lib/prjquota/prjquota usr/bin/prjquota-exporter; do \
           printf 'prjquota-upgrade-test' >> {dir}/$f; done; \
         (cd {dir} && find usr -type f | sort | xargs md5sum > DEBIAN/md5sums); \
         dpkg-deb --root-owner-group -Znone -b {dir} {out}",
        deb = deb().display(),
        out = out.display()
    ));
    out
}

struct Made {
    path: PathBuf,
    data: Vec<u8>,
}

/// Every volume of `made` still holds its data, after `what`.
fn assert_data_intact(made: &[Made], what: &str) {
    for m in made {
        assert_eq!(
            std::fs::read(m.path.join("data")).unwrap_or_default(),
            m.data,
            "{}'s data changed or is gone after {what}",
            m.path.display()
        );
    }
}

/// A create of the upgrade's load: the volume or the plugin's error, when
/// it started and ended.
type Timed = (Result<Made, String>, Instant, Instant);

/// The package installed on a fresh client and its exporter enabled, as
/// the README tells: the plugin in Nomad's plugin directory, the exporter
/// ready and guarding by default (detecting on a kernel without the BPF
/// LSM, saying why), a first volume seen by the exporter and by
/// Prometheus. Returns the plugin's path in Nomad's plugin directory, and
/// the volumes made with their data.
fn installed_and_running(t: Instant) -> (PathBuf, Vec<Made>) {
    assert!(
        std::env::var_os("PRJQUOTA_SYSTEMD_ROOT").is_some_and(|v| v == "1"),
        "this test runs in the systemd pass of `cargo xtask test` (xtask/src/systemd.rs), \
         on a root booted with systemd as init"
    );
    assert_eq!(
        std::fs::read_to_string("/proc/1/comm").unwrap().trim(),
        "systemd",
        "PID 1 is not systemd"
    );
    let mut made: Vec<Made> = Vec::new();

    // A client: the volumes filesystem at Nomad's default, its plugin dir.
    xfs("volumes", VOLUMES, 512);
    std::fs::create_dir_all(PLUGIN_DIR).unwrap();

    // Install: the plugin lands in Nomad's plugin directory.
    let out = sh_ok(&format!("dpkg -i {}", deb().display()));
    eprintln!("dpkg -i:\n{out}");
    lap(t, "installed");
    let nomads = Path::new(PLUGIN_DIR).join("prjquota");
    let meta = std::fs::symlink_metadata(&nomads).expect("the plugin is in Nomad's plugin dir");
    assert!(
        meta.file_type().is_file(),
        "{} is not a regular file",
        nomads.display()
    );
    assert_eq!(
        std::fs::read(&nomads).unwrap(),
        std::fs::read(PACKAGED_PLUGIN).unwrap(),
        "the plugin in Nomad's plugin dir is not the package's"
    );
    assert_eq!(is_active(), "inactive", "the install started the exporter");

    // The service on a node with no volume yet (Nomad made its volumes
    // directory), then a first volume, created as Nomad creates it.
    assert!(
        !Path::new(VOLUMES).join(".prjquota").exists(),
        "a registry before the first create"
    );
    let out = sh_ok(&format!("systemctl enable --now {UNIT}"));
    eprintln!("systemctl enable --now: {out}");
    lap(t, "ready");
    // Type=notify: `start` returned, so the exporter said READY=1.
    assert_eq!(is_active(), "active", "journal:\n{}", journal());
    let rw = sh_ok(&format!("systemctl show -p ReadWritePaths --value {UNIT}"));
    assert!(
        rw.contains(VOLUMES) && rw.contains("/sys/fs/bpf"),
        "the sandbox's writable paths are {rw:?}: the generator did not follow VOLUMES_DIR"
    );
    assert_the_sandbox_passes_systemds_review();
    assert_selftest_before_the_first_volume();
    let node = Node::new(nomads.clone(), VOLUMES.into(), PLUGIN_DIR.into());
    let first = Spec::new("first", 64 << 20).param("max_inodes", MAX_INODES);
    let (path, _) = node.create(&first).created();
    made.push(Made {
        data: write_data(&path, 1 << 20, 1),
        path,
    });
    assert_exporter_sees(&first.id, 1 << 20);
    lap(t, "default_dir_checked");
    prometheus_scrapes_the_service(&first.id, 64 << 20);
    lap(t, "prometheus_checked");

    // What the package's settings give an operator: no --guard in
    // EXPORTER_ARGS, so the exporter's default, auto. Where the BPF LSM
    // runs, an owner's escape is refused and counted as denied; on 5.10 it
    // goes through, is counted as allowed, and the exporter says why it
    // cannot refuse it.
    let (owned, owned_path, owned_projid, _) = owned_volume(&node, "owned", 1 << 20);
    let (_, r) = act(
        Who::User(OWNER),
        Some(&open(&owned_path.join("data"))),
        &["chproj", "0"],
    );
    let m = metrics();
    if guard_kernel() {
        assert_eq!(
            r,
            Err(libc::EPERM),
            "the package's default let an owner's escape through\njournal:\n{}",
            journal()
        );
        assert_eq!(
            value(&m, "prjquota_exporter_guard_mode", &[("mode", "enforce")]),
            Some(1.0),
            "the package's default guard mode is not enforce:\n{m}"
        );
        assert_eq!(
            value(
                &m,
                ATTEMPTS,
                &[("volume_id", &owned.id), ("result", "denied")]
            ),
            Some(1.0),
            "the default (auto: enforce) did not count the refusal:\n{m}"
        );
        assert_eq!(project_of(&owned_path.join("data")).0, owned_projid);
    } else {
        assert_eq!(
            r,
            Ok(()),
            "an owner's escape was refused without the BPF LSM"
        );
        assert_eq!(
            value(
                &m,
                "prjquota_exporter_guard_not_enforcing_reason",
                &[("reason", "lsm_inactive")]
            ),
            Some(1.0),
            "the package's default does not say why it only detects:\n{m}"
        );
        assert_eq!(
            value(
                &m,
                ATTEMPTS,
                &[("volume_id", &owned.id), ("result", "allowed")]
            ),
            Some(1.0),
            "the default (auto: detect) did not count the escape:\n{m}"
        );
        let j = journal();
        assert!(
            j.contains("quota-escape guard detects only") && j.contains("add `bpf`"),
            "the journal does not say the guard detects only, and the fix:\n{j}"
        );
        retag(&owned_path, owned_projid);
    }
    (nomads, made)
}

/// The guard's mode through a restart: the defaults still enforce where
/// the BPF LSM runs; on a kernel without it, an operator who asks for
/// enforcement by hand is refused by name, and the defaults run again.
fn the_guard_mode_holds_through_a_restart(t: Instant) {
    // Where the BPF LSM runs, the defaults enforce through the restart. On
    // 5.10 an operator who asks for enforcement by hand is refused by
    // name: the exporter does not start, and says why; back to the
    // defaults, it runs (detecting).
    if guard_kernel() {
        assert_eq!(
            value(&metrics(), "prjquota_exporter_guard_enforcing", &[]),
            Some(1.0),
            "journal:\n{}",
            journal()
        );
    } else {
        set_guard(Some("enforce"));
        let (started, _) = sh(&format!("systemctl restart {UNIT}"));
        assert!(
            !started,
            "--guard enforce started on a kernel without the BPF LSM active"
        );
        let j = journal();
        assert!(
            j.contains("--guard=enforce") && j.contains("BPF LSM is not active"),
            "the refused start does not name --guard=enforce and the inactive BPF LSM:\n{j}"
        );
        set_guard(None);
        sh_ok(&format!(
            "systemctl reset-failed {UNIT}; systemctl restart {UNIT}"
        ));
    }
    lap(t, "guard_mode_checked");
}

/// On a kernel without the BPF LSM (Debian 11's 5.10), what the kernel
/// changes of the package's story: the exporter reads quotas through the
/// block device from inside its sandbox, the default guard detects and
/// says why it cannot refuse, and `--guard enforce` is refused by name.
/// The move, the upgrade and the purge are dpkg's and systemd's, the same
/// on every kernel: the full story runs on 6.1.
#[test]
fn the_package_runs_and_says_what_it_cannot_guard_on_a_kernel_without_the_bpf_lsm() {
    assert!(
        !guard_kernel(),
        "this test is the systemd pass of a kernel without the BPF LSM active (5.10); \
         the_package_installs_runs_moves_upgrades_and_purges_under_systemd covers the others"
    );
    let t = Instant::now();
    let (_, made) = installed_and_running(t);
    the_guard_mode_holds_through_a_restart(t);
    assert_eq!(is_active(), "active", "journal:\n{}", journal());
    assert_data_intact(&made, "the restarts");
}

#[test]
fn the_package_installs_runs_moves_upgrades_and_purges_under_systemd() {
    let t = Instant::now();
    let (nomads, mut made) = installed_and_running(t);

    // Move the volumes directory: /etc/default/prjquota, daemon-reload,
    // restart, and keep exporting the old one as an extra --volumes-dir of
    // EXPORTER_ARGS, as for a node's second filesystem. A restart without
    // the daemon-reload refuses, saying so; after it, the sandbox lets the
    // exporter write in both.
    xfs("moved", MOVED, 512);
    let moved_node = Node::new(nomads.clone(), MOVED.into(), PLUGIN_DIR.into());
    let second = Spec::new("second", 64 << 20).param("max_inodes", MAX_INODES);
    let (path, _) = moved_node.create(&second).created();
    made.push(Made {
        data: write_data(&path, 2 << 20, 2),
        path,
    });
    sh_ok(&format!(
        "sed -i 's|^VOLUMES_DIR=.*|VOLUMES_DIR={MOVED}|' {SETTINGS}"
    ));
    let (restarted, out) = sh(&format!("systemctl restart {UNIT}"));
    assert!(
        !restarted,
        "a restart with VOLUMES_DIR changed but no daemon-reload started: {out}"
    );
    sh_ok(&format!(
        "sed -i 's|^EXPORTER_ARGS=\"\\(.*\\)\"$|EXPORTER_ARGS=\"\\1 --volumes-dir {VOLUMES}\"|' {SETTINGS} \
         && grep -q -- '--volumes-dir {VOLUMES}\"$' {SETTINGS}"
    ));
    assert!(
        journal().contains("run systemctl daemon-reload"),
        "the refused start does not say to run daemon-reload:\n{}",
        journal()
    );
    sh_ok(&format!(
        "systemctl daemon-reload && systemctl restart {UNIT}"
    ));
    assert_eq!(is_active(), "active", "journal:\n{}", journal());
    let rw = sh_ok(&format!("systemctl show -p ReadWritePaths --value {UNIT}"));
    assert!(
        rw.contains(MOVED) && rw.contains(VOLUMES),
        "the sandbox did not follow to {MOVED} and the extra {VOLUMES}: {rw:?}"
    );
    assert_exporter_sees(&second.id, 2 << 20);
    let first_id = made[0]
        .path
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert_exporter_sees(&first_id, 1 << 20);
    lap(t, "moved_dir_checked");

    the_guard_mode_holds_through_a_restart(t);

    // Upgrade while creates and writes run as Nomad runs them: 20 creates
    // on two workers, paced so that they span dpkg's unpack, its swap of
    // the plugin and the exporter's restart. Meanwhile the owner of a
    // volume loops on every escape (its file's and its root's project ID,
    // the root's PROJINHERIT), before, during and after dpkg -i.
    let newer = newer_deb();
    lap(t, "newer_package_built");
    let (_, attacked, attacked_projid, attacked_data) =
        owned_volume(&moved_node, "attacked", 4 << 20);
    const PHASES: [&str; 3] = ["before", "during", "after"];
    let loopers: Vec<(&str, Looper)> = ESCAPES
        .iter()
        .map(|(name, file, action)| {
            let f = open(&attacked.join(file));
            // Every 5 ms, not 1: three owners at 1 ms load the emulated
            // CPUs enough to slow dpkg markedly; 5 ms still makes
            // thousands of attempts while it runs.
            let args: Vec<&str> = action.split(' ').chain(["5"]).collect();
            (*name, Looper::start_action(&f, &args, PHASES.len()))
        })
        .collect();
    for (_, l) in &loopers {
        l.wait_attempts(20);
    }
    let old_pid = main_pid();
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Timed>> = Mutex::new(Vec::new());
    let (dpkg_start, dpkg_end, dpkg_out) = std::thread::scope(|s| {
        for w in 0..2u8 {
            let (node, next, results) = (&moved_node, &next, &results);
            s.spawn(move || loop {
                let n = next.fetch_add(1, Ordering::SeqCst);
                if n >= UPGRADE_CREATES {
                    break;
                }
                let spec = Spec::new(&format!("upgrade-{n}"), 8 << 20);
                let from = Instant::now();
                let o = node.create(&spec);
                let r = if o.status.success() {
                    let (path, _) = o.created();
                    let data = write_data(&path, 256 << 10, w.wrapping_add(n as u8));
                    Ok(Made { path, data })
                } else {
                    Err(format!("{}: {}{}", spec.id, o.stdout, o.stderr))
                };
                eprintln!(
                    "upgrade create {n}: {} in {:.1}s",
                    if r.is_ok() { "ok" } else { "FAILED" },
                    from.elapsed().as_secs_f64()
                );
                results.lock().unwrap().push((r, from, Instant::now()));
                std::thread::sleep(Duration::from_millis(500));
            });
        }
        for (_, l) in &loopers {
            l.enter(1);
        }
        let from = Instant::now();
        let out = sh(&format!("timeout 600 dpkg -i {}", newer.display()));
        let to = Instant::now();
        for (_, l) in &loopers {
            l.enter(2);
        }
        (from, to, out)
    });
    lap(t, "upgraded");
    for (_, l) in &loopers {
        l.wait_attempts(20);
    }
    let tallies: Vec<(&str, Vec<(u64, u64)>)> =
        loopers.into_iter().map(|(n, l)| (n, l.stop())).collect();
    for (name, tally) in &tallies {
        for (phase, (refused, through)) in PHASES.iter().zip(tally) {
            eprintln!(
                "MEASURE systemd_upgrade_{name}_{phase}: attempts {} went_through {through}",
                refused + through
            );
        }
    }
    if guard_kernel() {
        for (name, tally) in &tallies {
            for (phase, (refused, through)) in PHASES.iter().zip(tally) {
                assert_eq!(
                    *through,
                    0,
                    "{name} {phase} the upgrade: the owner's changes went through \
                     ({refused} refused)\njournal:\n{}",
                    journal()
                );
                assert!(
                    *refused > 0,
                    "{name} {phase} the upgrade: no attempt was made"
                );
            }
        }
        assert_eq!(project_of(&attacked), (attacked_projid, true));
        assert_eq!(project_of(&attacked.join("data")).0, attacked_projid);
        let bytes = charged(Path::new(MOVED), attacked_projid);
        assert!(
            bytes >= attacked_data.len() as u64,
            "project {attacked_projid} is charged {bytes} bytes after the upgrade, its \
             volume holds {}",
            attacked_data.len()
        );
    } else {
        // Detect only on 5.10 (the default's fallback): the kernel
        // lets the owner change the IDs. Said here so that it cannot pass
        // unseen.
        for (name, tally) in &tallies {
            let refused: u64 = tally.iter().map(|t| t.0).sum();
            let through: u64 = tally.iter().map(|t| t.1).sum();
            assert!(
                refused == 0 && through > 0,
                "{name}: {refused} refused, {through} went through on a kernel without the guard"
            );
        }
        retag(&attacked, attacked_projid);
    }
    made.push(Made {
        path: attacked,
        data: attacked_data,
    });
    assert!(dpkg_out.0, "the upgrade failed:\n{}", dpkg_out.1);
    eprintln!(
        "dpkg -i (upgrade) took {:.1}s:\n{}",
        (dpkg_end - dpkg_start).as_secs_f64(),
        dpkg_out.1
    );
    let results = results.into_inner().unwrap();
    let failed: Vec<&String> = results
        .iter()
        .filter_map(|(r, _, _)| r.as_ref().err())
        .collect();
    assert!(
        failed.is_empty(),
        "creates failed during the upgrade: {failed:?}"
    );
    assert_eq!(results.len(), UPGRADE_CREATES, "creates that ran");
    let during = results
        .iter()
        .filter(|(_, from, to)| *from < dpkg_end && *to > dpkg_start)
        .count();
    assert!(during > 0, "no create ran while dpkg upgraded");
    eprintln!(
        "{} creates with writes, {during} of them while dpkg -i ran, all succeeded",
        results.len()
    );
    made.extend(results.into_iter().filter_map(|(r, _, _)| r.ok()));
    let new_pid = main_pid();
    assert_eq!(is_active(), "active", "journal:\n{}", journal());
    assert_ne!(
        new_pid, old_pid,
        "the upgrade left the old exporter running"
    );
    let running = std::fs::read(format!("/proc/{new_pid}/exe")).unwrap();
    let installed = std::fs::read(EXPORTER).unwrap();
    assert!(
        running == installed && installed.ends_with(b"prjquota-upgrade-test"),
        "the exporter running after the upgrade is not the new binary"
    );
    let plugin = std::fs::read(&nomads).unwrap();
    assert!(
        plugin.ends_with(b"prjquota-upgrade-test")
            && plugin == std::fs::read(PACKAGED_PLUGIN).unwrap(),
        "the plugin in Nomad's plugin dir is not the upgraded one"
    );
    assert!(
        std::fs::read_to_string(SETTINGS)
            .unwrap()
            .contains(&format!("VOLUMES_DIR={MOVED}")),
        "the upgrade did not keep /etc/default/prjquota's change"
    );
    let leftovers: Vec<_> = std::fs::read_dir(PLUGIN_DIR)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n != "prjquota")
        .collect();
    assert!(
        leftovers.is_empty(),
        "the upgrade left {leftovers:?} in the plugin dir"
    );

    // Remove: the exporter stops, Nomad's plugin stays.
    let out = sh_ok("dpkg -r prjquota");
    eprintln!("dpkg -r:\n{out}");
    lap(t, "removed");
    assert_ne!(is_active(), "active", "dpkg -r left the exporter running");
    assert!(
        std::fs::symlink_metadata(&nomads).is_ok(),
        "dpkg -r took away the plugin Nomad needs to delete volumes"
    );
    assert!(
        out.contains("left"),
        "dpkg -r does not say it left the plugin: {out}"
    );

    // Purge: configuration gone, every volume and its data there.
    sh_ok("dpkg -P prjquota");
    lap(t, "purged");
    assert!(
        std::fs::symlink_metadata(SETTINGS).is_err(),
        "{SETTINGS} is left after the purge"
    );
    let wants = sh("ls /etc/systemd/system/*.wants/ 2>/dev/null").1;
    assert!(
        !wants.contains(UNIT),
        "the purge left the .wants link: {wants}"
    );
    assert_data_intact(&made, "the purge");
    for dir in [VOLUMES, MOVED] {
        assert!(
            Path::new(dir).join(".prjquota").is_dir(),
            "the registry in {dir} is gone after the purge"
        );
    }
    eprintln!(
        "{} volumes and their data intact after the purge",
        made.len()
    );
}

/// The boot this test runs in: `PRJQUOTA_SYSTEMD_BOOT`, set by
/// xtask/src/systemd.rs.
fn assert_boot(n: u32) {
    let boot = prjquota_vmtests::vm_env("PRJQUOTA_SYSTEMD_BOOT");
    assert_eq!(
        boot,
        n.to_string(),
        "this test runs in boot {n} of its systemd pass (xtask/src/systemd.rs `passes`)"
    );
}

/// The first boot of a node that reboots: the volumes filesystem in fstab,
/// the package installed with its default settings (the guard enforces on
/// 6.1 and detects on 5.10, saying why), a volume owned
/// by a workload's user, and a stub `nomad.service` that, as that user,
/// tries every escape the moment systemd starts it at the next boot and
/// records what the kernel said. Runs after the package test's purge.
#[test]
fn a_node_with_volumes_is_set_up_for_a_reboot() {
    assert_boot(1);
    let t = Instant::now();
    std::fs::write(
        format!("/etc/systemd/system/{BOOT_MOUNT}"),
        format!(
            "[Unit]\n\
             Description=The node's volumes filesystem\n\
             [Mount]\n\
             What={BOOT_IMAGE}\n\
             Where={BOOT_VOLUMES}\n\
             Type=xfs\n\
             Options=loop,prjquota\n\
             [Install]\n\
             WantedBy=local-fs.target\n"
        ),
    )
    .unwrap();
    sh_ok(&format!(
        "set -e; truncate -s 512M {BOOT_IMAGE}; mkfs.xfs -q -f {BOOT_IMAGE}; \
         mkdir -p {BOOT_VOLUMES} {PLUGIN_DIR}; \
         systemctl daemon-reload; systemctl enable --now {BOOT_MOUNT}; \
         mountpoint {BOOT_VOLUMES}"
    ));
    lap(t, "reboot_filesystem_mounted");
    sh_ok(&format!("dpkg -i {}", deb().display()));
    lap(t, "reboot_package_installed");
    sh_ok(&format!(
        "sed -i 's|^VOLUMES_DIR=.*|VOLUMES_DIR={BOOT_VOLUMES}|' {SETTINGS}"
    ));
    // Enabled, not started: the reboot's exporter is the first to guard.
    sh_ok(&format!(
        "systemctl daemon-reload && systemctl enable {UNIT}"
    ));
    let node = Node::new(
        Path::new(PLUGIN_DIR).join("prjquota"),
        BOOT_VOLUMES.into(),
        PLUGIN_DIR.into(),
    );
    let (spec, path, projid, data) = owned_volume(&node, "rebooted", 2 << 20);
    lap(t, "reboot_volume_created");
    std::fs::write(
        BOOT_STATE,
        format!(
            "{}\n{}\n{projid}\n{}\n",
            path.display(),
            spec.id,
            data.len()
        ),
    )
    .unwrap();

    // The stub agent: a oneshot as the volume's owner, ordered by nothing
    // but what the units say (the exporter's Before=nomad.service).
    let mut script =
        String::from("#!/bin/sh\n# tests/tests/systemd.rs: a workload's first act at boot.\n");
    for (name, file, action) in ESCAPES {
        script += &format!(
            "/prjquota-test/attr-act {action} < '{}'; echo \"{name} $?\"\n",
            path.join(file).display()
        );
    }
    std::fs::write(STUB, script).unwrap();
    std::fs::write(
        "/etc/systemd/system/nomad.service",
        format!(
            "[Unit]\n\
             Description=A stub Nomad agent whose first act is a workload's escape\n\
             [Service]\n\
             Type=oneshot\n\
             RemainAfterExit=yes\n\
             User={OWNER}\n\
             Group={OWNER}\n\
             ExecStart={STUB}\n\
             StandardOutput=append:{STUB_LOG}\n\
             [Install]\n\
             WantedBy=multi-user.target\n"
        ),
    )
    .unwrap();
    // The workload's user, as a node has one (systemd resolves User=).
    sh_ok(&format!(
        "set -e; chmod 0755 {STUB}; : > {STUB_LOG}; \
         getent passwd {OWNER} || useradd --uid {OWNER} --user-group --no-create-home \
         --shell /usr/sbin/nologin workload; \
         systemctl daemon-reload; systemctl enable nomad.service"
    ));
    lap(t, "reboot_prepared");
}

/// The node of [a_node_with_volumes_is_set_up_for_a_reboot], rebooted:
/// bpffs is empty, systemd mounts the volumes, starts the exporter and
/// then the stub agent, whose escapes at its very first moment were
/// refused (5.10: the guard detects, by name, and they went through) and
/// counted.
#[test]
fn the_guard_holds_from_the_first_moment_of_a_boot() {
    let boot: u32 = prjquota_vmtests::vm_env("PRJQUOTA_SYSTEMD_BOOT")
        .parse()
        .expect("PRJQUOTA_SYSTEMD_BOOT is a number");
    assert!(
        boot >= 2,
        "this test runs in a reboot of the node the first boot set up (xtask/src/systemd.rs)"
    );
    let state = std::fs::read_to_string(BOOT_STATE).expect("the first boot's state");
    let mut it = state.lines();
    let (path, id) = (PathBuf::from(it.next().unwrap()), it.next().unwrap());
    let projid: u32 = it.next().unwrap().parse().unwrap();
    let bytes: u64 = it.next().unwrap().parse().unwrap();

    // The stub ran (a oneshot: active once its script returned).
    let deadline = Instant::now() + Duration::from_secs(120);
    let log = loop {
        let log = std::fs::read_to_string(STUB_LOG).unwrap_or_default();
        if log.lines().count() >= ESCAPES.len() {
            break log;
        }
        assert!(
            Instant::now() < deadline,
            "the stub nomad.service recorded {log:?} in 120 s:\n{}",
            sh("systemctl status nomad.service; journalctl -b -u nomad.service --no-pager").1
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("stub nomad.service recorded:\n{log}");
    let mono = |unit: &str, prop: &str| -> u64 {
        sh_ok(&format!("systemctl show -p {prop} --value {unit}"))
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{unit} {prop}"))
    };
    let ready = mono(UNIT, "ActiveEnterTimestampMonotonic");
    let starting = mono(UNIT, "InactiveExitTimestampMonotonic");
    let nomad = mono("nomad.service", "ExecMainStartTimestampMonotonic");
    eprintln!(
        "MEASURE systemd_boot_exporter_start_seconds {:.1}",
        (ready as f64 - starting as f64) / 1e6
    );
    eprintln!(
        "MEASURE systemd_boot_exporter_ready_to_nomad_start_ms {:.1}",
        (nomad as f64 - ready as f64) / 1000.0
    );
    assert!(
        ready > 0 && ready <= nomad,
        "nomad.service started (at {nomad} µs) before the exporter was ready (at {ready} µs)\n{}",
        sh(&format!(
            "systemctl status --no-pager {UNIT}; journalctl -b --no-pager -o short-monotonic \
             | grep -v ' kernel: ' | tail -n 80"
        ))
        .1
    );
    let results: Vec<(&str, i32)> = log
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(n, rc)| (n, rc.trim().parse().unwrap_or(-1)))
        .collect();
    assert_eq!(
        results.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        ESCAPES.iter().map(|(n, _, _)| *n).collect::<Vec<_>>(),
        "{log}"
    );
    let through = results.iter().filter(|(_, rc)| *rc == 0).count();
    eprintln!(
        "MEASURE systemd_boot_escapes: attempts {} went_through {through}",
        results.len()
    );
    let m = metrics();
    if guard_kernel() {
        for (name, rc) in &results {
            assert_eq!(
                *rc,
                libc::EPERM,
                "{name} at boot: the kernel said {rc}, not EPERM\njournal:\n{}",
                journal()
            );
        }
        assert_eq!(
            value(&m, "prjquota_exporter_guard_enforcing", &[]),
            Some(1.0),
            "{m}"
        );
        assert_eq!(
            value(&m, ATTEMPTS, &[("volume_id", id), ("result", "denied")]),
            Some(ESCAPES.len() as f64),
            "the guard did not count the boot's escapes as denied:\n{m}"
        );
        assert_eq!(project_of(&path), (projid, true));
        assert_eq!(project_of(&path.join("data")).0, projid);
        let charged = charged(Path::new(BOOT_VOLUMES), projid);
        assert!(
            charged >= bytes,
            "project {projid} is charged {charged} bytes after the boot, {bytes} were written"
        );
    } else {
        // Detect only (no BPF LSM active): every escape went through and
        // was counted, the exporter being ready before nomad.service ran.
        assert_eq!(
            value(&m, "prjquota_exporter_guard_mode", &[("mode", "detect")]),
            Some(1.0),
            "{m}"
        );
        assert_eq!(
            value(
                &m,
                "prjquota_exporter_guard_not_enforcing_reason",
                &[("reason", "lsm_inactive")]
            ),
            Some(1.0),
            "{m}"
        );
        assert_eq!(
            value(&m, ATTEMPTS, &[("volume_id", id), ("result", "allowed")]),
            Some(ESCAPES.len() as f64),
            "the guard did not count the boot's escapes as allowed:\n{m}"
        );
        assert_eq!(
            through,
            ESCAPES.len(),
            "nothing enforces on 5.10, yet escapes were refused: {log}"
        );
    }
    // The node's next reboot (into another kernel: xtask/src/systemd.rs)
    // records its stub's attempts afresh.
    std::fs::write(STUB_LOG, "").unwrap();
}
