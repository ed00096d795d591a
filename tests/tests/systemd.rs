//! The package as an operator runs it, on a node booted with systemd as
//! init: `dpkg -i`, `systemctl enable --now`, creates exactly as Nomad runs
//! them, the volumes directory moved by /etc/default/prjquota, an upgrade
//! while creates and writes run, `dpkg -r`, `dpkg -P`.
//!
//! Runs only in the systemd pass of `cargo xtask test` (xtask/src/systemd.rs):
//! a Debian root of its own booted with systemd as PID 1, this binary run
//! by `systemd.run=`. One test, in order: each step is the state the next
//! starts from, as on a node.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prjquota_vmtests::http::http_get;
use prjquota_vmtests::nomad::{Node, Spec};

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

/// Whether this kernel runs the eBPF programs (5.17+; 5.10 refuses them by
/// name, and reads quotas through the block device instead).
fn ebpf_kernel() -> bool {
    let r = sh_ok("uname -r");
    let mut it = r
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (it.next().unwrap(), it.next().unwrap());
    (major, minor) >= (5, 17)
}

/// What the exporter says about `volume_dir`'s volumes under the sandbox:
/// the self-test passed (on eBPF kernels), and the volume's usage, read by
/// quotactl, is there.
fn assert_exporter_sees(volume_id: &str, at_least: u64) {
    let m = metrics();
    if ebpf_kernel() {
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
    }
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

/// A create of the upgrade's load: the volume or the plugin's error, when
/// it started and ended.
type Timed = (Result<Made, String>, Instant, Instant);

#[test]
fn the_package_installs_runs_moves_upgrades_and_purges_under_systemd() {
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
    let t = Instant::now();
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

    // A first volume, created as Nomad creates it, then the service.
    let node = Node::new(nomads.clone(), VOLUMES.into(), PLUGIN_DIR.into());
    let first = Spec::new("first", 64 << 20).param("max_inodes", MAX_INODES);
    let (path, _) = node.create(&first).created();
    made.push(Made {
        data: write_data(&path, 1 << 20, 1),
        path,
    });
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
    assert_exporter_sees(&first.id, 1 << 20);
    lap(t, "default_dir_checked");

    // Move the volumes directory: /etc/default/prjquota, daemon-reload,
    // restart. A restart without the daemon-reload refuses, saying so.
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
        rw.contains(MOVED),
        "the sandbox did not follow to {MOVED}: {rw:?}"
    );
    assert_exporter_sees(&second.id, 2 << 20);
    lap(t, "moved_dir_checked");

    // Upgrade while creates and writes run as Nomad runs them: 20 creates
    // on two workers, paced so that they span dpkg's unpack, its swap of
    // the plugin and the exporter's restart.
    let newer = newer_deb();
    lap(t, "newer_package_built");
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
        let from = Instant::now();
        let out = sh(&format!("timeout 600 dpkg -i {}", newer.display()));
        (from, Instant::now(), out)
    });
    lap(t, "upgraded");
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
    for m in &made {
        assert_eq!(
            std::fs::read(m.path.join("data")).unwrap_or_default(),
            m.data,
            "{}'s data changed or is gone after the purge",
            m.path.display()
        );
    }
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
