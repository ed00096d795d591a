//! The package as an operator runs it, on a node booted with systemd as
//! init: `apt-get install` from the signed apt repository `cargo xtask
//! dist` makes (its key given to apt with `signed-by`), `systemctl enable --now`, creates exactly as Nomad runs
//! them, the volumes directory moved by /etc/default/prjquota, a repository
//! signed by another key refused, an `apt-get upgrade` from the newer
//! repository while creates and writes run and a volume owner attacks the guard,
//! `dpkg -r`, `dpkg -P`; then a node with volumes and a `nomad.service`
//! that attacks the guard the moment it starts, rebooted, and rebooted
//! again into each newer kernel. On a kernel without the BPF LSM, the
//! .rpm's story: `rpm -U`, run, an upgrade under load, `rpm -e`.
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
use prjquota_vmtests::child::threads;
use prjquota_vmtests::http::http_get;
use prjquota_vmtests::nomad::{Node, Spec};
use prjquota_vmtests::prom::{self, Prometheus};
use prjquota_vmtests::readme;

const VOLUMES: &str = "/opt/nomad/data/host_volumes";
const PLUGIN_DIR: &str = "/opt/nomad/data/host_volume_plugins";
const MOVED: &str = "/srv/nomad-volumes";
const UNIT: &str = "prjquota-exporter.service";
const EXPORTER: &str = "/usr/bin/prjquota-exporter";
const PACKAGED_PLUGIN: &str = "/usr/lib/prjquota/prjquota";
/// The .deb's settings; the .rpm's are [`RPM_SETTINGS`].
const SETTINGS: &str = "/etc/default/prjquota";
const RPM_SETTINGS: &str = "/etc/sysconfig/prjquota";
/// RHEL's and Fedora's policy for a unit a package installs (their
/// 99-default-disable.preset): disabled until the operator enables it.
/// Debian's systemd ships no preset, which enables every unit.
const RPM_FAMILY_PRESET: (&str, &str) = (
    "/etc/systemd/system-preset/99-default-disable.preset",
    "disable *\n",
);
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
/// The node's Nomad data_dir filesystem (allocation usage on, as
/// docs/allocations.md turns it on: NOMAD_ALLOC_DIR in the settings), an
/// image of its own beside the volumes', mounted by a mount unit.
const BOOT_DATA: &str = "/srv/nomaddata";
const BOOT_DATA_MOUNT: &str = "srv-nomaddata.mount";
const BOOT_DATA_IMAGE: &str = "/var/lib/prjquota-boot-nomaddata.img";
const BOOT_ALLOC_DIR: &str = "/srv/nomaddata/alloc";
/// The allocation each reboot leaves for the next (its ID and the bytes
/// charged to it), which the next exporter reads back without a walk.
const BOOT_ALLOC_STATE: &str = "/var/lib/prjquota-boot-alloc";
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
    let get = || {
        http_get(
            "127.0.0.1:14646".parse().unwrap(),
            "/metrics",
            Duration::from_secs(60),
        )
    };
    let r = get().unwrap_or_else(|e| {
        // Where the exporter is stuck, then whether it answers at all.
        let threads = threads(main_pid());
        let t = Instant::now();
        let again = get().map(|r| r.status);
        panic!(
            "GET /metrics: {e}\nthe exporter's threads then:\n{threads}\n\
             a second GET: {again:?} after {:.1}s\njournal:\n{}",
            t.elapsed().as_secs_f64(),
            journal()
        )
    });
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

/// The package manager a node installs prjquota with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Manager {
    Dpkg,
    /// Debian's rpm: `--nodeps`, since its database knows none of the
    /// root's files (/bin/sh), and `--force-debian`, without which Debian's
    /// rpm refuses to install.
    Rpm,
}

impl Manager {
    fn settings(self) -> &'static str {
        match self {
            Manager::Dpkg => SETTINGS,
            Manager::Rpm => RPM_SETTINGS,
        }
    }

    /// The command that installs `package`, or upgrades to it: for dpkg, a
    /// newer apt repository the node's sources are pointed at (as the
    /// release updates the one they name), then `apt-get upgrade`.
    fn install(self, package: &Path) -> String {
        match self {
            Manager::Dpkg => format!(
                "{} && apt-get update && apt-get upgrade -y",
                point_apt_at(package)
            ),
            Manager::Rpm => format!("rpm -U --nodeps --force-debian {}", package.display()),
        }
    }

    /// The package the test installs first.
    fn package(self) -> PathBuf {
        PathBuf::from(prjquota_vmtests::vm_env(match self {
            Manager::Dpkg => "PRJQUOTA_DEB",
            Manager::Rpm => "PRJQUOTA_RPM",
        }))
    }
}

/// Sets `--guard MODE` in the settings' EXPORTER_ARGS (an operator's edit:
/// the package's default has no --guard, which is auto), or with `None`
/// takes it out again.
fn set_guard(m: Manager, mode: Option<&str>) {
    let settings = m.settings();
    let text = std::fs::read_to_string(settings).unwrap();
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
    assert!(found, "no EXPORTER_ARGS=\"…\" line in {settings}:\n{text}");
    std::fs::write(settings, lines.join("\n") + "\n").unwrap();
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
/// package's rules and `config`, an operator's prometheus.yml (the
/// README's, or the one the package ships) whose targets are this node's
/// exporter. Neither has a `global:` section, so an operator's own comes
/// first; here it scrapes and evaluates every 2 s instead of every minute, so the
/// checks take seconds. The rules load and evaluate without error, the
/// service is up, `volume_id`'s provisioned bytes are queried back, and
/// the healthy node fires no alert (pending on 5.10 only those that say
/// what is off by name there).
fn prometheus_scrapes_the_service(volume_id: &str, provisioned: u64, config: &str) {
    let binary = prom::prometheus3().expect(
        "PRJQUOTA_PROMETHEUS3 is not set: the systemd pass installs Prometheus 3 from \
         target/prometheus3 (`cargo xtask deps` fetches it)",
    );
    assert!(
        config.contains(LOCAL_TARGETS) && config.contains(RULES_AT),
        "the config does not scrape {LOCAL_TARGETS} and load {RULES_AT}:\n{config}"
    );
    assert!(
        !config.lines().any(|l| l.starts_with("global:")),
        "the config has a global: section of its own, where an operator's comes:\n{config}"
    );
    // The operator's step: the rules where the config loads them from.
    std::fs::create_dir_all(Path::new(RULES_AT).parent().unwrap()).unwrap();
    std::fs::copy(SHIPPED_RULES, RULES_AT).unwrap();
    let yaml = format!(
        "global:\n  scrape_interval: 2s\n  scrape_timeout: 2s\n  evaluation_interval: 2s\n{config}"
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

/// The package's example Prometheus config, its targets this node.
fn shipped_prometheus_config() -> String {
    let shipped = std::fs::read_to_string(SHIPPED_PROMETHEUS_CONFIG).expect("the shipped config");
    assert!(
        shipped.contains(SHIPPED_TARGETS),
        "{SHIPPED_PROMETHEUS_CONFIG} no longer names the targets {SHIPPED_TARGETS} this test \
         replaces:\n{shipped}"
    );
    shipped.replace(SHIPPED_TARGETS, LOCAL_TARGETS)
}

fn deb() -> PathBuf {
    Manager::Dpkg.package()
}

/// The quickstart's sources file.
const APT_SOURCES: &str = "/etc/apt/sources.list.d/prjquota.sources";

/// The shell command that points the node's sources at the apt
/// repository `repo` (a directory of the guest), as a release that updates
/// the repository they name.
fn point_apt_at(repo: &Path) -> String {
    format!(
        "sed -i 's|^URIs: .*|URIs: file:{}|' {APT_SOURCES} && grep -q '^URIs: file:{}$' {APT_SOURCES}",
        repo.display(),
        repo.display()
    )
}

/// The repository a release makes next: the package of `cargo xtask dist`
/// and a newer one (revision 2, its binaries told apart by a trailer),
/// signed with the same key (`xtask/src/test/packages.rs`).
fn newer_apt_repo() -> PathBuf {
    PathBuf::from(prjquota_vmtests::vm_env("PRJQUOTA_APT_NEWER"))
}

/// The same packages signed by a key the node was never given: apt must
/// refuse the repository and install nothing of it.
fn a_repository_signed_by_another_key_is_refused() {
    let forged = PathBuf::from(prjquota_vmtests::vm_env("PRJQUOTA_APT_FORGED"));
    let before = sh_ok("dpkg-query -W -f '${Version}' prjquota");
    sh_ok(&point_apt_at(&forged));
    let (updated, out) = sh("apt-get update");
    assert!(
        !updated || out.contains("NO_PUBKEY") || out.contains("not signed"),
        "apt-get update took a repository signed by another key:\n{out}"
    );
    assert!(
        out.contains("NO_PUBKEY") || out.contains("couldn't be verified"),
        "apt-get update did not say the signature could not be verified:\n{out}"
    );
    let (_, upgraded) = sh("apt-get upgrade -y");
    assert_eq!(
        sh_ok("dpkg-query -W -f '${Version}' prjquota"),
        before,
        "apt upgraded from a repository signed by another key:\n{upgraded}"
    );
    eprintln!("a repository signed by another key, refused:\n{out}");
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

/// After the package's removal by `what` (its output `out`): the exporter
/// stopped, and the plugin left where Nomad runs it to delete the volumes
/// it made, which the removal says.
fn assert_stopped_leaving_the_plugin(what: &str, out: &str, nomads: &Path) {
    assert_ne!(is_active(), "active", "{what} left the exporter running");
    assert!(
        std::fs::symlink_metadata(nomads).is_ok(),
        "{what} took away the plugin Nomad needs to delete volumes"
    );
    assert!(
        out.contains("left"),
        "{what} does not say it left the plugin: {out}"
    );
}

/// No `.wants` link of the unit is left after `what`.
fn assert_not_enabled(what: &str) {
    let wants = sh("ls /etc/systemd/system/*.wants/ 2>/dev/null").1;
    assert!(
        !wants.contains(UNIT),
        "{what} left the unit enabled: {wants}"
    );
}

/// The end of a package's story: every volume of `made` holds its data and
/// each of `dirs` its registry after `what`; the quickstart's disk leaves
/// fstab.
fn assert_volumes_kept(made: &[Made], dirs: &[&str], what: &str) {
    assert_data_intact(made, what);
    for dir in dirs {
        assert!(
            Path::new(dir).join(".prjquota").is_dir(),
            "the registry in {dir} is gone after {what}"
        );
    }
    eprintln!("{} volumes and their data intact after {what}", made.len());
    forget_the_quickstart_disk();
}

/// A create of the upgrade's load: the volume or the plugin's error, when
/// it started and ended.
type Timed = (Result<Made, String>, Instant, Instant);

/// What a block of the README's quickstart is to this test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quickstart {
    /// mkfs, fstab, mount: run.
    Filesystem,
    /// The package's install with one manager: run on that one's node.
    Install(Manager),
    /// The exporter started, `prjquota check`: run.
    Start,
    /// Nomad's own commands: shown, not run (no Nomad agent here).
    Nomad,
    /// The rules in place, the config checked: run.
    Prometheus,
    /// Not a shell block (the volume's and the job's HCL, prometheus.yml).
    Other,
}

/// The quickstart's blocks, in the README's order.
const QUICKSTART: [Quickstart; 10] = [
    Quickstart::Filesystem,
    Quickstart::Install(Manager::Dpkg),
    Quickstart::Install(Manager::Rpm),
    Quickstart::Start,
    Quickstart::Nomad,
    Quickstart::Other,
    Quickstart::Nomad,
    Quickstart::Other,
    Quickstart::Other,
    Quickstart::Prometheus,
];

fn quickstart_step(b: &readme::Block) -> Quickstart {
    let commands = b.commands();
    let has = |p: &str| commands.iter().any(|c| c.starts_with(p));
    match b.lang.as_str() {
        "sh" if has("mkfs") => Quickstart::Filesystem,
        "sh" if has("apt-get install ") => Quickstart::Install(Manager::Dpkg),
        "sh" if has("dnf install ") => Quickstart::Install(Manager::Rpm),
        "sh" if has("systemctl enable --now prjquota-exporter") => Quickstart::Start,
        "sh" if commands.iter().all(|c| c.contains("nomad")) => Quickstart::Nomad,
        "sh" if has("promtool") => Quickstart::Prometheus,
        "sh" => panic!(
            "a shell block of the README's quickstart this test does not know:\n{}",
            b.text
        ),
        _ => Quickstart::Other,
    }
}

/// The README's targets, and this node's exporter in their place.
const LOCAL_TARGETS: &str = r#"["127.0.0.1:14646"]"#;

/// The quickstart's spare disk: a loop device over an image in the root.
fn spare_disk() -> String {
    sh_ok(
        "set -e; truncate -s 512M /var/tmp/quickstart-disk.img; \
         losetup --find --show /var/tmp/quickstart-disk.img",
    )
    .trim()
    .to_string()
}

/// Where the release publishes the repositories (xtask/src/repo.rs), as
/// the README names it.
const PUBLISHED: &str = "https://prjquota.github.io/prjquota/";

/// A quickstart command as this node runs it: the spare disk in place of
/// the README's `/dev/sdb`; the repositories of this build (`cargo xtask
/// dist`'s, in /prjquota-test) in place of the published ones, fetched
/// by the README's own `curl` from `file:` URLs (the guest reaches no
/// network); and, on the RPM-family node, Debian's rpm in dnf's place,
/// the repository's signature checked first with gpgv as dnf's
/// repo_gpgcheck does, then the package it lists installed (see
/// [`Manager::Rpm`]).
fn as_run_here(command: &str, disk: &str) -> String {
    let c = command
        .replace("/dev/sdb", disk)
        .replace(PUBLISHED, "file:///prjquota-test/");
    if c.starts_with("dnf install ") {
        let yum = prjquota_vmtests::vm_env("PRJQUOTA_YUM");
        const VERSION: &str = env!("CARGO_PKG_VERSION");
        return format!(
            "set -e; gpg --batch --yes --dearmor -o /tmp/prjquota-yum.gpg {yum}/RPM-GPG-KEY-prjquota; \
             gpgv --keyring /tmp/prjquota-yum.gpg {yum}/repodata/repomd.xml.asc {yum}/repodata/repomd.xml; \
             grep -q 'type=\"primary\"' {yum}/repodata/repomd.xml; \
             rpm -i --nodeps --force-debian {yum}/prjquota-{VERSION}-1.x86_64.rpm"
        );
    }
    c
}

/// Takes the quickstart's fstab line out again: the next boot of this
/// root has no such loop device, and a missing filesystem of fstab holds
/// a boot in emergency mode.
fn forget_the_quickstart_disk() {
    sh_ok(&format!(
        "sed -i '\\|^/dev/loop[0-9]* {VOLUMES} |d' /etc/fstab"
    ));
    let fstab = std::fs::read_to_string("/etc/fstab").unwrap_or_default();
    assert!(
        !fstab.contains(VOLUMES),
        "/etc/fstab still mounts {VOLUMES}:\n{fstab}"
    );
}

/// What the install left: the package's plugin in Nomad's plugin
/// directory, a regular file; the exporter not started, and on an
/// RPM-family node not enabled either (its presets).
fn assert_installed(m: Manager, nomads: &Path) {
    let meta = std::fs::symlink_metadata(nomads).expect("the plugin is in Nomad's plugin dir");
    assert!(
        meta.file_type().is_file(),
        "{} is not a regular file",
        nomads.display()
    );
    assert_eq!(
        std::fs::read(nomads).unwrap(),
        std::fs::read(PACKAGED_PLUGIN).unwrap(),
        "the plugin in Nomad's plugin dir is not the package's"
    );
    assert_eq!(is_active(), "inactive", "the install started the exporter");
    if m == Manager::Rpm {
        // %systemd_post applies the presets: the RPM family's leave it off.
        let (_, enabled) = sh(&format!("systemctl is-enabled {UNIT}"));
        assert_eq!(
            enabled.trim(),
            "disabled",
            "the .rpm's install did not follow the node's preset (disable *)"
        );
    }
}

/// The exporter started by the quickstart, on a node with no volume yet
/// (Nomad made its volumes directory): ready, sandboxed to its
/// directories, its self-test passed.
fn assert_started() {
    // Type=notify: `start` returned, so the exporter said READY=1.
    assert_eq!(is_active(), "active", "journal:\n{}", journal());
    let rw = sh_ok(&format!("systemctl show -p ReadWritePaths --value {UNIT}"));
    assert!(
        rw.contains(VOLUMES) && rw.contains("/sys/fs/bpf"),
        "the sandbox's writable paths are {rw:?}: the generator did not follow VOLUMES_DIR"
    );
    assert_the_sandbox_passes_systemds_review();
    assert_selftest_before_the_first_volume();
}

/// The package installed on a fresh client and its exporter enabled by
/// the README's quickstart, every command of it run but Nomad's own (a
/// loop device for its spare disk): the plugin in Nomad's plugin directory, the exporter
/// ready and guarding by default (detecting on a kernel without the BPF
/// LSM, saying why), a first volume seen by the exporter and by
/// Prometheus. Returns the plugin's path in Nomad's plugin directory, and
/// the volumes made with their data.
fn installed_and_running(t: Instant, m: Manager) -> (PathBuf, Vec<Made>) {
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
    let nomads = Path::new(PLUGIN_DIR).join("prjquota");
    let node = Node::new(nomads.clone(), VOLUMES.into(), PLUGIN_DIR.into());
    let first = Spec::new("first", 64 << 20).param("max_inodes", MAX_INODES);

    // The README's quickstart, block by block, each followed by what it
    // must have done.
    let blocks = readme::quickstart();
    let steps: Vec<Quickstart> = blocks.iter().map(quickstart_step).collect();
    assert_eq!(
        steps, QUICKSTART,
        "the README's quickstart is not the steps this test follows: its blocks were\n{blocks:#?}"
    );
    let disk = spare_disk();
    // vng binds /dev/null over the guest's /etc/fstab: away with it, so
    // that the README's line lands in the root's own.
    sh_ok("! mountpoint -q /etc/fstab || umount /etc/fstab");
    // The guest reaches no Debian mirror: the project's repository is the
    // node's only apt source, or `apt-get update` fails on the others.
    sh_ok(
        "! test -e /etc/apt/sources.list || mv /etc/apt/sources.list /etc/apt/sources.list.offline",
    );
    // The packages' checksums, as `cargo xtask dist` writes them.
    let packages = [Manager::Dpkg.package(), Manager::Rpm.package()];
    let dir = packages[0].parent().unwrap();
    sh_ok(&format!(
        "cd {} && sha256sum {} > SHA256SUMS",
        dir.display(),
        packages
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    ));
    let yaml = blocks
        .iter()
        .find(|b| b.lang == "yaml")
        .expect("the quickstart's prometheus.yml")
        .text
        .replace(SHIPPED_TARGETS, LOCAL_TARGETS);
    for (block, step) in blocks.iter().zip(&steps) {
        match step {
            Quickstart::Other => continue,
            Quickstart::Nomad => {
                eprintln!("quickstart: Nomad's own, not run here:\n{}", block.text);
                if block.text.contains("plugins.host_volume.prjquota") {
                    // What that reload makes Nomad read: the plugin in its
                    // directory, run as Nomad's fingerprint runs it.
                    let o = node.fingerprint();
                    o.ok();
                    assert_eq!(
                        o.json()["version"],
                        env!("CARGO_PKG_VERSION"),
                        "the fingerprint Nomad would read: {}",
                        o.stdout
                    );
                }
                continue;
            }
            Quickstart::Install(other) if *other != m => continue,
            Quickstart::Prometheus => {
                std::fs::create_dir_all("/etc/prometheus").unwrap();
                std::fs::write("/etc/prometheus/prometheus.yml", &yaml).unwrap();
            }
            _ => {}
        }
        if *step == Quickstart::Install(m) && m == Manager::Rpm {
            let (path, text) = RPM_FAMILY_PRESET;
            std::fs::create_dir_all(Path::new(path).parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        if *step == Quickstart::Start {
            assert!(
                !Path::new(VOLUMES).join(".prjquota").exists(),
                "a registry before the first create"
            );
        }
        for command in block.commands() {
            let command = as_run_here(command, &disk);
            let out = sh_ok(&format!("cd {} && {command}", dir.display()));
            eprintln!("quickstart: {command}\n{out}");
        }
        match step {
            Quickstart::Filesystem => {
                let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
                assert!(
                    mounts
                        .lines()
                        .any(|l| l.contains(&format!(" {VOLUMES} xfs ")) && l.contains("prjquota")),
                    "the quickstart did not mount {VOLUMES} with project quotas:\n{mounts}"
                );
                lap(t, "quickstart_filesystem");
            }
            Quickstart::Install(_) => {
                lap(t, "installed");
                assert_installed(m, &nomads);
            }
            Quickstart::Start => {
                lap(t, "ready");
                assert_started();
            }
            Quickstart::Prometheus => {
                // In place of `nomad volume create`: the create as Nomad
                // runs it, and what the exporter and Prometheus make of it.
                let (path, _) = node.create(&first).created();
                made.push(Made {
                    data: write_data(&path, 1 << 20, 1),
                    path,
                });
                assert_exporter_sees(&first.id, 1 << 20);
                lap(t, "default_dir_checked");
            }
            _ => {}
        }
    }

    // The .deb's node runs Prometheus on the README's prometheus.yml, the
    // .rpm's on the one the package ships.
    let config = match m {
        Manager::Dpkg => yaml,
        Manager::Rpm => shipped_prometheus_config(),
    };
    prometheus_scrapes_the_service(&first.id, 64 << 20, &config);
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
    let text = metrics();
    if guard_kernel() {
        assert_eq!(
            r,
            Err(libc::EPERM),
            "the package's default let an owner's escape through\njournal:\n{}",
            journal()
        );
        assert_eq!(
            value(
                &text,
                "prjquota_exporter_guard_mode",
                &[("mode", "enforce")]
            ),
            Some(1.0),
            "the package's default guard mode is not enforce:\n{text}"
        );
        assert_eq!(
            value(
                &text,
                ATTEMPTS,
                &[("volume_id", &owned.id), ("result", "denied")]
            ),
            Some(1.0),
            "the default (auto: enforce) did not count the refusal:\n{text}"
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
                &text,
                "prjquota_exporter_guard_not_enforcing_reason",
                &[("reason", "lsm_inactive")]
            ),
            Some(1.0),
            "the package's default does not say why it only detects:\n{text}"
        );
        assert_eq!(
            value(
                &text,
                ATTEMPTS,
                &[("volume_id", &owned.id), ("result", "allowed")]
            ),
            Some(1.0),
            "the default (auto: detect) did not count the escape:\n{text}"
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
fn the_guard_mode_holds_through_a_restart(t: Instant, m: Manager) {
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
        set_guard(m, Some("enforce"));
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
        set_guard(m, None);
        sh_ok(&format!(
            "systemctl reset-failed {UNIT}; systemctl restart {UNIT}"
        ));
    }
    lap(t, "guard_mode_checked");
}

/// The .rpm's story, on a kernel without the BPF LSM (Debian 11's 5.10):
/// installed as an RPM-family node installs it (its presets leave the unit
/// disabled), enabled and run, the exporter reading quotas through the
/// block device from inside its sandbox, the default guard detecting and
/// saying why it cannot refuse, `--guard enforce` refused by name;
/// upgraded by `rpm -U` under load, the exporter restarted on the new
/// binary; erased, the plugin left for Nomad's deletes, the operator's
/// settings saved as `.rpmsave`, every volume and its data kept. The
/// .deb's story, with the guard enforcing, runs on 6.1.
#[test]
fn the_rpm_installs_runs_upgrades_and_erases_on_a_kernel_without_the_bpf_lsm() {
    assert!(
        !guard_kernel(),
        "this test is the systemd pass of a kernel without the BPF LSM active (5.10); \
         the_package_installs_runs_moves_upgrades_and_purges_under_systemd covers the others"
    );
    let t = Instant::now();
    let m = Manager::Rpm;
    let (nomads, mut made) = installed_and_running(t, m);
    the_guard_mode_holds_through_a_restart(t, m);
    assert_eq!(is_active(), "active", "journal:\n{}", journal());
    assert_data_intact(&made, "the restarts");

    let node = Node::new(nomads.clone(), VOLUMES.into(), PLUGIN_DIR.into());
    let newer = PathBuf::from(prjquota_vmtests::vm_env("PRJQUOTA_NEWER_RPM"));
    made.extend(upgraded_under_load(t, m, &node, &nomads, &newer));
    let versions = sh_ok("rpm -q prjquota");
    assert!(
        versions.trim().ends_with("-2.x86_64") && versions.lines().count() == 1,
        "rpm -U left {versions:?} installed, not release 2 alone"
    );

    // Erase: %preun stops and disables the exporter, %postun leaves the
    // plugin Nomad deletes with and says so; the changed settings are
    // saved beside, as rpm saves a changed %config.
    let out = sh_ok("rpm -e prjquota");
    eprintln!("rpm -e:\n{out}");
    lap(t, "erased");
    assert_stopped_leaving_the_plugin("rpm -e", &out, &nomads);
    assert_not_enabled("rpm -e");
    assert!(!Path::new(EXPORTER).exists(), "rpm -e left {EXPORTER}");
    let saved = format!("{RPM_SETTINGS}.rpmsave");
    assert!(
        std::fs::read_to_string(&saved)
            .unwrap_or_default()
            .contains("# kept through upgrades"),
        "rpm -e did not save the operator's settings as {saved}"
    );
    assert_volumes_kept(&made, &[VOLUMES], "the erase");
}

#[test]
fn the_package_installs_runs_moves_upgrades_and_purges_under_systemd() {
    let t = Instant::now();
    let (nomads, mut made) = installed_and_running(t, Manager::Dpkg);

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

    the_guard_mode_holds_through_a_restart(t, Manager::Dpkg);

    a_repository_signed_by_another_key_is_refused();
    lap(t, "forged_repository_refused");
    let newer = newer_apt_repo();
    made.extend(upgraded_under_load(
        t,
        Manager::Dpkg,
        &moved_node,
        &nomads,
        &newer,
    ));
    assert!(
        std::fs::read_to_string(SETTINGS)
            .unwrap()
            .contains(&format!("VOLUMES_DIR={MOVED}")),
        "the upgrade did not keep /etc/default/prjquota's change"
    );

    // Remove: the exporter stops, Nomad's plugin stays.
    let out = sh_ok("dpkg -r prjquota");
    eprintln!("dpkg -r:\n{out}");
    lap(t, "removed");
    assert_stopped_leaving_the_plugin("dpkg -r", &out, &nomads);

    // Purge: configuration gone, every volume and its data there.
    sh_ok("dpkg -P prjquota");
    lap(t, "purged");
    assert!(
        std::fs::symlink_metadata(SETTINGS).is_err(),
        "{SETTINGS} is left after the purge"
    );
    assert_not_enabled("the purge");
    assert_volumes_kept(&made, &[VOLUMES, MOVED], "the purge");
}

/// An upgrade to `newer` while creates and writes run as Nomad runs them:
/// 20 creates on two workers, paced so that they span the unpack, the swap
/// of the plugin and the exporter's restart. Meanwhile the owner of a
/// volume loops on every escape (its file's and its root's project ID, the
/// root's PROJINHERIT), before, during and after the upgrade. Every create
/// succeeds, the new exporter runs, the new plugin is in Nomad's plugin
/// directory, the operator's settings are kept. Returns the volumes made.
fn upgraded_under_load(
    t: Instant,
    m: Manager,
    node: &Node,
    nomads: &Path,
    newer: &Path,
) -> Vec<Made> {
    // An operator's line in the settings, which the upgrade keeps.
    let settings = m.settings();
    sh_ok(&format!("echo '# kept through upgrades' >> {settings}"));
    let (_, attacked, attacked_projid, attacked_data) = owned_volume(node, "attacked", 4 << 20);
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
            let (next, results) = (&next, &results);
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
        // The whole command under the limit: for apt it is several.
        let install = m.install(newer).replace('\'', "'\\''");
        let out = sh(&format!("timeout 600 sh -c '{install}'"));
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
        let bytes = charged(&node.volumes_dir, attacked_projid);
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
    let mut made = vec![Made {
        path: attacked,
        data: attacked_data,
    }];
    assert!(dpkg_out.0, "the upgrade failed:\n{}", dpkg_out.1);
    eprintln!(
        "{m:?} upgrade took {:.1}s:\n{}",
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
    assert!(during > 0, "no create ran while {m:?} upgraded");
    eprintln!(
        "{} creates with writes, {during} of them while {m:?} upgraded, all succeeded",
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
    let plugin = std::fs::read(nomads).unwrap();
    assert!(
        plugin.ends_with(b"prjquota-upgrade-test")
            && plugin == std::fs::read(PACKAGED_PLUGIN).unwrap(),
        "the plugin in Nomad's plugin dir is not the upgraded one"
    );
    let kept = std::fs::read_to_string(settings).unwrap();
    assert!(
        kept.contains("# kept through upgrades"),
        "the upgrade did not keep the operator's change to {settings}:\n{kept}"
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
    made
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
    for (what, unit, image, at) in [
        ("volumes", BOOT_MOUNT, BOOT_IMAGE, BOOT_VOLUMES),
        (
            "Nomad data_dir",
            BOOT_DATA_MOUNT,
            BOOT_DATA_IMAGE,
            BOOT_DATA,
        ),
    ] {
        std::fs::write(
            format!("/etc/systemd/system/{unit}"),
            format!(
                "[Unit]\n\
                 Description=The node's {what} filesystem\n\
                 [Mount]\n\
                 What={image}\n\
                 Where={at}\n\
                 Type=xfs\n\
                 Options=loop,prjquota\n\
                 [Install]\n\
                 WantedBy=local-fs.target\n"
            ),
        )
        .unwrap();
        sh_ok(&format!(
            "set -e; truncate -s 512M {image}; mkfs.xfs -q -f {image}; \
             mkdir -p {at} {PLUGIN_DIR}; \
             systemctl daemon-reload; systemctl enable --now {unit}; \
             mountpoint {at}"
        ));
    }
    lap(t, "reboot_filesystem_mounted");
    sh_ok(&format!("dpkg -i {}", deb().display()));
    lap(t, "reboot_package_installed");
    // Allocation usage on, by the one setting docs/allocations.md gives:
    // Nomad has not run yet, so its alloc directory does not exist.
    sh_ok(&format!(
        "sed -i 's|^VOLUMES_DIR=.*|VOLUMES_DIR={BOOT_VOLUMES}|; \
         s|^NOMAD_ALLOC_DIR=.*|NOMAD_ALLOC_DIR={BOOT_ALLOC_DIR}|' {SETTINGS}"
    ));
    assert!(
        sh_ok(&format!("cat {SETTINGS}")).contains(&format!("NOMAD_ALLOC_DIR={BOOT_ALLOC_DIR}")),
        "the package's settings have no NOMAD_ALLOC_DIR line to set"
    );
    let _ = std::fs::remove_file(BOOT_ALLOC_STATE);
    // The exporter's log on the console too: a boot's journal is gone when
    // its test fails, and the console is what the pass's report keeps.
    std::fs::create_dir_all(format!("/etc/systemd/system/{UNIT}.d")).unwrap();
    std::fs::write(
        format!("/etc/systemd/system/{UNIT}.d/90-console.conf"),
        "[Service]\nStandardOutput=journal+console\nStandardError=journal+console\n",
    )
    .unwrap();
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
            "systemctl show -p NRestarts -p Result -p ExecMainStatus -p ExecMainCode {UNIT}; \
             systemctl status --no-pager {UNIT}; journalctl -b --no-pager -o short-monotonic \
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
    allocations_are_accounted_under_the_unit();
}

/// Allocation usage, turned on by NOMAD_ALLOC_DIR (the first boot's
/// settings), under the package's unit and sandbox: the allocation the
/// last boot left is read back, and one laid out now as Nomad lays it out
/// is walked once, with what was written before its task started and a
/// file written after the walk both charged to it and published.
fn allocations_are_accounted_under_the_unit() {
    use prjquota_vmtests::nomad_alloc::{write_file, AllocRoot};
    let alloc_bytes =
        |m: &str, id: &str| value(m, "nomad_alloc_disk_used_bytes", &[("alloc_id", id)]);
    let until = |what: &str, pred: &dyn Fn(&str) -> bool| -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let m = metrics();
            if pred(&m) {
                return m;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within 60 s under the unit\n{m}\njournal:\n{}\nsandbox:\n{}",
                journal(),
                sh(&format!(
                    "systemctl show -p ReadWritePaths -p RuntimeDirectory -p ExecStart {UNIT}"
                ))
                .1
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    };
    // The unit made Nomad's alloc directory as Nomad makes it, before Nomad.
    let meta = std::fs::metadata(BOOT_ALLOC_DIR).expect("the unit made the alloc directory");
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    assert_eq!(
        (meta.uid(), meta.permissions().mode() & 0o7777),
        (0, 0o711),
        "{BOOT_ALLOC_DIR}"
    );
    let previous = std::fs::read_to_string(BOOT_ALLOC_STATE).ok();
    if let Some(prev) = &previous {
        let (id, bytes) = prev.trim().split_once(' ').unwrap();
        let bytes: f64 = bytes.parse().unwrap();
        until("the last boot's allocation read back", &|m| {
            alloc_bytes(m, id).is_some_and(|b| b >= bytes)
        });
    }
    let root = AllocRoot {
        path: BOOT_ALLOC_DIR.into(),
    };
    let mut a = root.build_alloc();
    write_file(&a.path.join("alloc/data/before"), 5 << 20);
    let task = a.build_task("web");
    until("the started allocation accounted and published", &|m| {
        alloc_bytes(m, &a.id).is_some_and(|b| b >= (5 << 20) as f64)
    });
    write_file(&task.join("local/after-the-walk"), 3 << 20);
    let m = until("a file written after the walk counted", &|m| {
        alloc_bytes(m, &a.id).is_some_and(|b| b >= (8 << 20) as f64)
    });
    assert_eq!(
        value(
            &m,
            "prjquota_exporter_scrape_collector_success",
            &[("collector", "allocs")]
        ),
        Some(1.0),
        "{m}"
    );
    let allocs = std::fs::read_dir(BOOT_ALLOC_DIR).unwrap().count();
    assert_eq!(
        value(&m, "prjquota_exporter_allocs", &[("state", "accounted")]),
        Some(allocs as f64),
        "every allocation this node ran is accounted:\n{m}"
    );
    // One walk: the previous boot's allocation was read back, not walked.
    assert_eq!(
        value(&m, "prjquota_exporter_alloc_walks_total", &[]),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        value(&m, "prjquota_exporter_alloc_tag_failures_total", &[]),
        Some(0.0),
        "{m}"
    );
    let used = alloc_bytes(&m, &a.id).unwrap();
    eprintln!("MEASURE systemd_alloc_used_bytes {used}");
    // The next boot reads it back; its mounts come off now, as at a reboot.
    a.unmount();
    std::fs::write(BOOT_ALLOC_STATE, format!("{} {}\n", a.id, (8u64 << 20))).unwrap();
}
