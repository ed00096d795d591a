//! `prjquota check`: is this node ready for its first volume?
//!
//! Each line is one thing a `create` needs, ✓ or ✗, and every ✗ carries the
//! exact fix. The exit status is 0 only when a create would work. A `!`
//! line is a warning: a create works, but something the node should do it
//! does not (the quota-escape guard does not enforce), with the fix.

use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use serde::Serialize;

use super::Flags;
use crate::fs::VolumesFs;
use crate::ops::load_config;
use crate::quota_control::{Control, NotPermitted};
use crate::registry::{self, Entry, Registry};
use prjquota_core::config::Config;
use prjquota_core::fs_type::FsType;
use prjquota_core::guard_contract;
use prjquota_core::sys;
use prjquota_core::units::human;

/// One line of the report.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Item {
    pub check: &'static str,
    pub ok: bool,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// Passed, with a fix worth applying.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub warning: bool,
}

fn pass(check: &'static str, detail: impl Into<String>) -> Item {
    Item {
        check,
        ok: true,
        detail: detail.into(),
        fix: None,
        warning: false,
    }
}

fn warn(check: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Item {
    Item {
        check,
        ok: true,
        detail: detail.into(),
        fix: Some(fix.into()),
        warning: true,
    }
}

fn fail(check: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Item {
    Item {
        check,
        ok: false,
        detail: detail.into(),
        fix: Some(fix.into()),
        warning: false,
    }
}

/// The nearest existing ancestor of `path` (itself if it exists).
fn existing_ancestor(path: &Path) -> PathBuf {
    let mut p = Some(path);
    while let Some(a) = p {
        if std::fs::symlink_metadata(a).is_ok() {
            return a.to_path_buf();
        }
        p = a.parent();
    }
    PathBuf::from("/")
}

/// Runs every check; later checks that depend on a failed one are skipped
/// (a skipped check is not reported as passed).
pub fn run(flags: &Flags) -> Vec<Item> {
    let mut items = Vec::new();
    let dir = flags.volumes_dir();
    let plugin_dir = flags.plugin_dir.clone().or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
    });

    // Node config: without a valid one, create fails before anything else.
    let cfg = match load_config(plugin_dir.as_deref()) {
        Ok(c) => {
            let src = c
                .source
                .as_ref()
                .map_or("built-in defaults (no prjquota.toml)".to_string(), |p| {
                    p.display().to_string()
                });
            items.push(pass(
                "node config",
                format!(
                    "{src}: project IDs {}..={}",
                    c.project_id_min, c.project_id_max
                ),
            ));
            Some(c)
        }
        Err(e) => {
            items.push(fail(
                "node config",
                format!("{e:#}"),
                "correct the file at the line named",
            ));
            None
        }
    };

    items.push(plugin_executable(plugin_dir.as_deref()));

    // The volumes dir, or where it would be created.
    let exists = std::fs::symlink_metadata(&dir).is_ok();
    let probe = if exists {
        dir.clone()
    } else {
        existing_ancestor(&dir)
    };
    let vfs = match VolumesFs::open(&probe, false) {
        Ok(v) => {
            items.push(pass(
                "volumes directory",
                if exists {
                    format!("{} exists", dir.display())
                } else {
                    format!(
                        "{} does not exist yet; the first create makes it (checking {} instead)",
                        dir.display(),
                        probe.display()
                    )
                },
            ));
            v
        }
        Err(e) => {
            items.push(fail(
                "volumes directory",
                format!("{e:#}"),
                "set host_volumes_dir (and --volumes-dir) to a real directory",
            ));
            return items;
        }
    };

    let fs_ok = matches!(vfs.fstype, FsType::Xfs | FsType::Ext4);
    items.push(if fs_ok {
        pass("filesystem", vfs.describe())
    } else {
        fail(
            "filesystem",
            vfs.describe(),
            "put host_volumes_dir on XFS (mounted -o prjquota) or ext4 (features project,quota; mounted -o prjquota)",
        )
    });

    let kernel = match vfs.fstype {
        FsType::Xfs if !Path::new("/proc/fs/xfs/xqm").exists() => {
            Some("this kernel has no XFS quota support (CONFIG_XFS_QUOTA is off)")
        }
        _ if !Path::new("/proc/sys/fs/quota").exists() => {
            Some("this kernel has no quota support (CONFIG_QUOTA is off)")
        }
        _ => None,
    };
    items.push(match kernel {
        None => pass(
            "kernel",
            format!(
                "quota support present ({})",
                std::fs::read_to_string("/proc/sys/kernel/osrelease")
                    .unwrap_or_default()
                    .trim()
            ),
        ),
        Some(why) => fail(
            "kernel",
            why,
            "boot a kernel built with CONFIG_QUOTA, CONFIG_QFMT_V2 and CONFIG_XFS_QUOTA, such as Debian's linux-image-amd64",
        ),
    });

    let opts = vfs.mount().map(|m| m.options.clone()).unwrap_or_default();
    let required = vfs.require_enforced_quota();
    let enforced = required.is_ok();
    items.push(match required {
        Ok(()) => pass(
            "project quota",
            format!("accounted and enforced (mount options {opts})"),
        ),
        Err(e) => {
            // The plugin's messages read "<what is wrong>: <the fix>".
            let msg = format!("{e:#}");
            match msg.split_once(": ") {
                Some((what, fix)) => fail("project quota", what, fix),
                None => fail("project quota", msg.clone(), "see the message"),
            }
        }
    });
    if !fs_ok || !enforced {
        return items;
    }

    let Some(cfg) = cfg else { return items };
    let range = cfg.project_id_min..=cfg.project_id_max;
    let kernel_ids = match Control::of(&vfs).list(range.clone()) {
        Ok(l) => {
            items.push(pass("privileges", "quotactl reads and writes are allowed"));
            l
        }
        Err(e) if e.is::<NotPermitted>() => {
            items.push(fail(
                "privileges",
                "the kernel refused a project quota read (EPERM)",
                "run as root: quota changes need CAP_SYS_ADMIN, and Nomad runs plugins as the agent's user",
            ));
            return items;
        }
        Err(e) => {
            items.push(fail("privileges", format!("{e:#}"), "see the kernel log"));
            return items;
        }
    };

    let (records, corrupt) = if exists {
        match registry::read_all(&dir) {
            Ok(entries) => {
                let mut recs = Vec::new();
                let mut bad = Vec::new();
                for e in entries {
                    match e {
                        Entry::Record(r) => recs.push(*r),
                        Entry::Corrupt { file, .. } => bad.push(file),
                    }
                }
                (recs, bad)
            }
            Err(e) => {
                items.push(fail(
                    "registry",
                    format!(
                        "cannot read {}: {e}",
                        dir.join(registry::DIR_NAME).display()
                    ),
                    "check the directory's permissions",
                ));
                return items;
            }
        }
    } else {
        (Vec::new(), Vec::new())
    };
    items.push(if corrupt.is_empty() {
        pass("registry", format!("{} volume records", records.len()))
    } else {
        fail(
            "registry",
            format!(
                "{} readable records; unreadable: {}",
                records.len(),
                corrupt.join(", ")
            ),
            "run `prjquota reconcile` to see what each unreadable record is",
        )
    });

    let mut taken: BTreeSet<u32> = records.iter().map(|r| r.project_id).collect();
    taken.extend(kernel_ids.iter().filter(|q| !q.is_unused()).map(|q| q.id));
    let in_range = taken.range(range.clone()).count() as u64;
    let size = u64::from(cfg.project_id_max - cfg.project_id_min) + 1;
    let free = size - in_range;
    items.push(if free > 0 {
        pass(
            "project IDs",
            format!("{free} free of {size} ({in_range} in use)"),
        )
    } else {
        fail(
            "project IDs",
            format!(
                "all {size} IDs in {}..={} are in use",
                cfg.project_id_min, cfg.project_id_max
            ),
            "widen project_id_min/project_id_max in prjquota.toml",
        )
    });

    items.push(capacity(&vfs, &records, &cfg));
    items.push(write_access(&vfs, exists));
    if exists {
        items.push(registry_lock(&vfs));
    }
    items.push(guard(&cfg.guard_pin_root, &dir, bpf_lsm_active()));
    items
}

/// Whether the BPF LSM runs (`None`: the list cannot be read), as the
/// exporter reads it.
fn bpf_lsm_active() -> Option<bool> {
    guard_contract::bpf_lsm_active()
        .ok()
        .map(|(active, _)| active)
}

/// The quota-escape guard of `volumes_dir`, from its pins under
/// `pin_root`: pinned or not, enforcing or detecting, and whether the BPF
/// LSM runs. Anything short of enforcing is a warning with the fix.
fn guard(pin_root: &Path, volumes_dir: &Path, lsm: Option<bool>) -> Item {
    const CHECK: &str = "quota-escape guard";
    let lsm_words = match lsm {
        Some(true) => "the BPF LSM is active",
        Some(false) => "the BPF LSM is not active",
        None => "whether the BPF LSM is active is unknown",
    };
    let lsm_fix = format!(
        "add `bpf` to the kernel's `lsm=` boot parameter (keep the others listed in {}) and reboot",
        guard_contract::LSM_LIST
    );
    let pin = guard_contract::link_of(pin_root, volumes_dir);
    let links = match std::fs::read_dir(&pin) {
        Ok(entries) => entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| guard_contract::linked_program(n).is_some())
            .collect::<Vec<_>>(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return warn(
                CHECK,
                format!(
                    "no guard is pinned for {} ({lsm_words}): project-ID changes inside its volumes are neither refused nor counted",
                    volumes_dir.display()
                ),
                format!(
                    "run prjquota-exporter with --volumes-dir {} and without --guard off (systemctl enable --now prjquota-exporter)",
                    volumes_dir.display()
                ),
            );
        }
        Err(e) => {
            return warn(
                CHECK,
                format!("cannot read the guard's pins at {}: {e}", pin.display()),
                "run prjquota check as root",
            );
        }
    };
    // One of the guard's LSM programs pinned means it refuses; only
    // detecting programs' links means it counts.
    let enforcing = links
        .iter()
        .filter_map(|l| guard_contract::linked_program(l))
        .any(guard_contract::is_lsm_program);
    if enforcing {
        return pass(
            CHECK,
            format!(
                "enforcing: pinned at {} ({}); {lsm_words}",
                pin.display(),
                links.join(", ")
            ),
        );
    }
    match lsm {
        Some(true) => warn(
            CHECK,
            format!(
                "detecting only, though {lsm_words}: this node could refuse quota escapes and does not (pinned at {}: {})",
                pin.display(),
                links.join(", ")
            ),
            "drop --guard detect from EXPORTER_ARGS in /etc/default/prjquota and restart prjquota-exporter; if its log says the LSM program did not attach, see the runbook of PrjquotaExporterGuardNotEnforcing",
        ),
        _ => warn(
            CHECK,
            format!(
                "detecting only: {lsm_words}, so this kernel cannot refuse quota escapes (pinned at {}: {})",
                pin.display(),
                links.join(", ")
            ),
            lsm_fix,
        ),
    }
}

/// The filesystem's size, what the volumes are promised and the ratio in
/// force: the figures a create's admission is decided on.
fn capacity(vfs: &VolumesFs, records: &[registry::Record], cfg: &Config) -> Item {
    let promised = records
        .iter()
        .map(|r| r.provisioned_bytes)
        .fold(0u64, u64::saturating_add);
    let ids = records.iter().map(|r| r.project_id).collect();
    let h = match crate::admission::measure_holdings(vfs, promised, ids, cfg.overcommit_ratio) {
        Ok(h) => h,
        Err(e) => {
            return fail(
                "capacity",
                format!("{e:#}"),
                "see the message; creates fail the same way",
            )
        }
    };
    let limit = h.promisable();
    let detail = format!(
        "filesystem holds {} ({} used outside volumes); volumes are promised {} of at most {} \
         (overcommit_ratio = {}); {} can still be promised",
        human(h.fs_bytes),
        human(h.used_outside),
        human(h.promised),
        human(limit),
        h.ratio,
        human(limit.saturating_sub(h.promised)),
    );
    if h.promised <= limit {
        pass("capacity", detail)
    } else {
        fail(
            "capacity",
            detail,
            "the volumes were promised more than the filesystem now holds (files outside \
             volumes grew, or overcommit_ratio was lowered): new creates and grows are refused \
             until volumes are deleted, disk is added or overcommit_ratio is raised",
        )
    }
}

/// The plugin file Nomad will run: a root-owned executable that nobody
/// else can replace.
fn plugin_executable(plugin_dir: Option<&Path>) -> Item {
    let Some(dir) = plugin_dir else {
        return fail(
            "plugin executable",
            "cannot tell where the plugin is installed",
            "pass --plugin-dir (Nomad's host_volume_plugin_dir)",
        );
    };
    let path = dir.join("prjquota");
    match std::fs::metadata(&path) {
        Ok(m) if !m.is_file() => fail(
            "plugin executable",
            format!("{} is not a regular file", path.display()),
            "install the prjquota binary there",
        ),
        Ok(m) if m.permissions().mode() & 0o111 == 0 => fail(
            "plugin executable",
            format!("{} is not executable", path.display()),
            format!("chmod 0755 {}", path.display()),
        ),
        Ok(m) if m.permissions().mode() & 0o022 != 0 || m.uid() != 0 => fail(
            "plugin executable",
            format!(
                "{} (mode {:o}, owner uid {}) can be replaced by someone other than root, and Nomad runs it as root",
                path.display(),
                m.permissions().mode() & 0o7777,
                m.uid()
            ),
            format!("chown root:root {0} && chmod 0755 {0}", path.display()),
        ),
        Ok(_) => pass("plugin executable", format!("{} (root, not writable by others)", path.display())),
        Err(e) => fail(
            "plugin executable",
            format!("{}: {e}", path.display()),
            format!("prjquota install --plugin-dir {}", dir.display()),
        ),
    }
}

/// Makes and removes a probe directory where volumes go.
fn write_access(vfs: &VolumesFs, exists: bool) -> Item {
    let name =
        std::ffi::CString::new(format!(".prjquota-check-{}", std::process::id())).expect("no NUL");
    match sys::mkdirat(vfs.fd(), &name, 0o700).and_then(|()| sys::unlinkat(vfs.fd(), &name, true)) {
        Ok(()) => pass(
            "write access",
            format!(
                "can create directories in {}{}",
                vfs.path.display(),
                if exists {
                    ""
                } else {
                    " (where the volumes dir will be made)"
                }
            ),
        ),
        Err(e) => fail(
            "write access",
            format!("cannot create a directory in {}: {e}", vfs.path.display()),
            "run as root, and check that the filesystem is mounted read-write",
        ),
    }
}

/// The registry's allocation lock can be taken: no process holds it stuck.
fn registry_lock(vfs: &VolumesFs) -> Item {
    let reg = match Registry::open(vfs.fd(), &vfs.path, false) {
        Ok(Some(r)) => r,
        Ok(None) => {
            return pass(
                "registry lock",
                "no registry yet; the first create makes it",
            )
        }
        Err(e) => {
            return fail(
                "registry lock",
                format!("{e:#}"),
                "run `prjquota reconcile`",
            )
        }
    };
    let (tx, rx) = mpsc::channel();
    // The lock call blocks; a thread lets the check give up after a while.
    let path = reg.path().to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(reg.lock_allocation().map(drop));
    });
    match rx.recv_timeout(Duration::from_secs(3)) {
        Ok(Ok(())) => pass(
            "registry lock",
            format!("{}/alloc.lock is free", path.display()),
        ),
        Ok(Err(e)) => fail(
            "registry lock",
            format!("{e:#}"),
            "check permissions of the .prjquota directory",
        ),
        Err(_) => fail(
            "registry lock",
            format!("{}/alloc.lock has been held for over 3 s", path.display()),
            format!(
                "a prjquota process is stuck: find it with `fuser -v {}/alloc.lock`",
                path.display()
            ),
        ),
    }
}

/// Prints the report; returns whether every check passed.
pub fn print(items: &[Item], json: bool) -> bool {
    let ok = items.iter().all(|i| i.ok);
    if json {
        let v = serde_json::json!({ "ok": ok, "checks": items });
        println!(
            "{}",
            serde_json::to_string_pretty(&v).expect("serialisable")
        );
    } else {
        for i in items {
            let mark = match (i.ok, i.warning) {
                (false, _) => "✗",
                (true, true) => "!",
                (true, false) => "✓",
            };
            println!("{mark} {}: {}", i.check, i.detail);
            if let Some(f) = &i.fix {
                println!("    fix: {f}");
            }
        }
        println!(
            "{}",
            if ok {
                "ready: a create would work on this node"
            } else {
                "not ready: fix the ✗ lines above"
            }
        );
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tmpfs_volumes_dir_fails_with_the_fix() {
        let flags = Flags {
            volumes_dir: Some(PathBuf::from("/dev/shm/prjquota-check-test/vols")),
            plugin_dir: Some(PathBuf::from("/nonexistent-plugin-dir")),
            ..Flags::default()
        };
        let items = run(&flags);
        let fs = items
            .iter()
            .find(|i| i.check == "filesystem")
            .expect("filesystem line");
        assert!(!fs.ok);
        assert!(fs.fix.as_deref().unwrap().contains("prjquota"));
        let plugin = items
            .iter()
            .find(|i| i.check == "plugin executable")
            .unwrap();
        assert!(!plugin.ok);
        assert!(!print(&items, true));
    }

    #[test]
    fn the_guard_line_tells_enforcing_from_detecting_from_unguarded() {
        let tmp = std::env::temp_dir().join(format!("prjquota-check-guard-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let vols = tmp.join("vols");
        std::fs::create_dir_all(&vols).unwrap();
        let pin_root = tmp.join("pins");
        let pin = guard_contract::link_of(&pin_root, &vols);

        let none = guard(&pin_root, &vols, Some(true));
        assert!(none.ok && none.warning, "{none:?}");
        assert!(none.detail.contains("no guard is pinned"), "{none:?}");

        std::fs::create_dir_all(&pin).unwrap();
        for f in ["roots", "link-guard_fileattr_set_exit"] {
            std::fs::write(pin.join(f), b"").unwrap();
        }
        let could = guard(&pin_root, &vols, Some(true));
        assert!(could.ok && could.warning, "{could:?}");
        assert!(could.detail.contains("could refuse"), "{could:?}");
        assert!(could.fix.as_deref().unwrap().contains("--guard detect"));
        let cannot = guard(&pin_root, &vols, Some(false));
        assert!(cannot.ok && cannot.warning, "{cannot:?}");
        assert!(
            cannot.fix.as_deref().unwrap().contains("lsm="),
            "{cannot:?}"
        );

        for lsm in [
            "link-guard_file_ioctl_sleepable",
            "link-guard_inode_file_setattr",
        ] {
            std::fs::write(pin.join(lsm), b"").unwrap();
            let on = guard(&pin_root, &vols, Some(true));
            assert!(on.ok && !on.warning && on.fix.is_none(), "{on:?}");
            assert!(on.detail.starts_with("enforcing"), "{on:?}");
            std::fs::remove_file(pin.join(lsm)).unwrap();
        }
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
