//! The filesystem collector: per volumes directory, the filesystem's size,
//! free and available space (statfs of the directory itself, not of a
//! volume, whose statfs answers with its project's limit), what its volumes
//! are promised and have used, and the `overcommit_ratio` the plugin admits
//! creates with: together, the inputs of the plugin's admission rule.
//!
//! The ratio comes from the plugin's own `prjquota.toml` in `--plugin-dir`,
//! read with the plugin's parser whenever the file changed (one `lstat` per
//! scrape otherwise), so the series is what the next create is decided with. When that directory does not exist the ratio
//! is unknown and its series is absent (never a made-up 1); when the file is
//! malformed the collector fails naming it, as every create then does.
//!
//! Per directory it also tells whether the filesystem can take the plugin's
//! writes (`filesystem_healthy`: 0 when it is shut down, read-only, or its
//! probe does not answer within the timeout) and whether project quotas are
//! enforced there (`quota_enforced`). The probe opens the directory by path
//! at every scrape and closes it before returning: no descriptor outlives a
//! scrape, so a filesystem unmounted and mounted again (log replay, a remount
//! without `prjquota`) is the one reported at the next scrape. A change of
//! either state is logged once, not at every scrape.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::anyhow;

use super::dir_stat::{FsStat, Unanswered};
use super::{BoxFuture, Collector, Scrape};
use crate::blocking::InFlight;
use crate::exposition::Family;

pub struct Filesystem {
    timeout: Duration,
    /// The probes' calls (the statfs is [`Scrape::dir_stats`]'s).
    inflight: InFlight,
    plugin_dir: Option<PathBuf>,
    /// The ratio as last read, and the file it was read from.
    ratio: Arc<Mutex<Option<KeptRatio>>>,
    probe: ProbeFn,
    /// Each directory's last [`Health`], to log a change once.
    last_health: Mutex<HashMap<PathBuf, Health>>,
}

/// What a volumes directory's filesystem is fit for, as one probe saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Health {
    /// Why the filesystem cannot take the plugin's writes; `None` when it can.
    pub unhealthy: Option<String>,
    /// Whether project quotas are enforced; `None` when the state could not
    /// be read (the filesystem is then unhealthy, and says why).
    pub enforced: Option<bool>,
}

pub type ProbeFn = Arc<dyn Fn(&Path) -> Health + Send + Sync>;

/// The errnos of a filesystem that shut itself down: XFS answers EIO after
/// a metadata I/O error and EUCLEAN (EFSCORRUPTED) on corruption; ext4's
/// `errors=panic`-less shutdown answers EIO too.
fn shut_down(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EIO | libc::EUCLEAN))
}

/// Probes the filesystem holding `dir`: open it, `fstatvfs` (read-only is
/// `ST_RDONLY`), read one directory entry (XFS and ext4 refuse a readdir
/// with EIO once shut down, even while statfs still answers from memory),
/// ext4's error count, and the project-quota state (`Q_XGETQSTAT`, as the
/// plugin does).
/// ext4's count of errors since its last e2fsck
/// (`/sys/fs/ext4/<device>/errors_count`); `None` on other filesystems.
fn ext4_errors(f: &std::fs::File) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let dev = f.metadata().ok()?.dev();
    let node = std::fs::read_link(format!(
        "/sys/dev/block/{}:{}",
        libc::major(dev),
        libc::minor(dev)
    ))
    .ok()?;
    let name = node.file_name()?.to_str()?;
    let text = std::fs::read_to_string(format!("/sys/fs/ext4/{name}/errors_count")).ok()?;
    text.trim().parse().ok()
}

pub fn probe(dir: &Path) -> Health {
    use std::os::fd::AsFd;
    let why = |what: &str, e: &std::io::Error| {
        if shut_down(e) {
            format!("shut down ({what}: {e})")
        } else {
            format!("{what}: {e}")
        }
    };
    let f = match std::fs::File::open(dir) {
        Ok(f) => f,
        Err(e) => {
            return Health {
                unhealthy: Some(why("open", &e)),
                enforced: None,
            }
        }
    };
    let mut unhealthy = match nix::sys::statvfs::fstatvfs(&f) {
        Ok(s) if s.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY) => {
            Some("read-only".to_string())
        }
        Ok(_) => None,
        Err(e) => Some(why("statfs", &std::io::Error::from_raw_os_error(e as i32))),
    };
    if unhealthy.is_none() {
        let entry = std::fs::read_dir(dir).and_then(|mut d| d.next().transpose());
        if let Err(e) = entry {
            unhealthy = Some(why("readdir", &e));
        }
    }
    // ext4 no longer sets ST_RDONLY after an error with errors=remount-ro
    // (kernels with "ext4: don't set SB_RDONLY after filesystem errors",
    // backported to 6.1): it refuses every change with EROFS while statfs,
    // readdir and fsync answer as before. What it does keep is the count
    // of errors in its superblock, which e2fsck clears.
    if unhealthy.is_none() && ext4_errors(&f).is_some_and(|n| n > 0) {
        unhealthy = Some(
            "ext4 recorded errors (errors_count > 0): it refuses changes after one; unmount it and run e2fsck".into(),
        );
    }
    let read_only = unhealthy
        .as_deref()
        .is_some_and(|u| u.starts_with("read-only"));
    let enforced = match prjquota_core::quota::support(f.as_fd()) {
        Ok(prjquota_core::quota::Support::Enforced) => Some(true),
        // ext4 suspends its quotas while read-only and resumes them with
        // the mount read-write: "off" then says nothing about the mount
        // option, and the read-only state is reported already.
        Ok(_) if read_only => None,
        Ok(_) => Some(false),
        Err(e) => {
            unhealthy.get_or_insert_with(|| why("quota state", &e));
            None
        }
    };
    Health {
        unhealthy,
        enforced,
    }
}

/// What the plugin's admission would still accept in a volumes directory
/// (`prjquota_core::holdings`): nothing when the filesystem cannot take a
/// volume (unhealthy, or project quotas not enforced: every create is
/// refused there), `None` when an input is unknown (a volume's usage, the
/// ratio), never a guess. The filesystem collector publishes it, and the
/// Nomad client puts it in the node's metadata.
pub fn unprovisioned(
    stat: &FsStat,
    health: &Health,
    volumes_used: Option<u64>,
    promised: u64,
    ratio: Option<f64>,
) -> Option<u64> {
    if health.unhealthy.is_some() || health.enforced != Some(true) {
        return Some(0);
    }
    let h = prjquota_core::holdings::Holdings::from_statfs(
        stat.frsize,
        stat.blocks,
        stat.bfree,
        volumes_used?,
        promised,
        ratio?,
    );
    Some(h.unprovisioned())
}

/// What a file is taken to be unchanged by: the same inode and ctime (which
/// every write moves, and every `chmod` or `chown` that can make the file
/// untrusted). `None` stands for "no file".
type FileKey = (u64, u64, i64, i64);

/// A read of the ratio ([`ratio`]'s answer, its error as text) and the
/// identity of the file it came from.
type KeptRatio = (Option<FileKey>, Result<Option<f64>, String>);

impl Filesystem {
    pub fn new(timeout: Duration, plugin_dir: Option<PathBuf>) -> Filesystem {
        Filesystem::with_probe(timeout, plugin_dir, Arc::new(probe))
    }

    /// With another probe (tests simulate failing filesystems).
    pub fn with_probe(
        timeout: Duration,
        plugin_dir: Option<PathBuf>,
        probe: ProbeFn,
    ) -> Filesystem {
        Filesystem {
            timeout,
            inflight: InFlight::new("volumes directory probe"),
            plugin_dir,
            ratio: Arc::default(),
            probe,
            last_health: Mutex::default(),
        }
    }

    /// Logs `dir`'s health when it differs from the last scrape's.
    fn note_health(&self, dir: &Path, h: &Health) {
        let mut last = self.last_health.lock().unwrap_or_else(|e| e.into_inner());
        let before = last.insert(dir.to_path_buf(), h.clone());
        let shown = dir.display();
        let (was_unhealthy, was_enforced) = match &before {
            Some(b) => (b.unhealthy.clone(), b.enforced),
            // A first probe logs only what is wrong.
            None => (None, Some(true)),
        };
        if h.unhealthy != was_unhealthy {
            match &h.unhealthy {
                Some(reason) => crate::warn!(
                    "volumes directory's filesystem unhealthy: volumes on it cannot be created, grown or deleted",
                    volumes_dir = shown,
                    reason = reason
                ),
                None => crate::info!(
                    "volumes directory's filesystem healthy again",
                    volumes_dir = shown
                ),
            }
        }
        if h.enforced.is_some() && h.enforced != was_enforced {
            if h.enforced == Some(false) {
                crate::warn!(
                    "project quotas not enforced on the volumes directory's filesystem: mount it with prjquota",
                    volumes_dir = shown
                );
            } else {
                crate::info!(
                    "project quotas enforced again on the volumes directory's filesystem",
                    volumes_dir = shown
                );
            }
        }
    }
}

/// The ratio in force in the plugin directory `dir` (1 without a
/// prjquota.toml), an error naming the file when it cannot be used.
fn ratio(dir: &Path) -> anyhow::Result<Option<f64>> {
    prjquota_core::config::load(dir)
        .map(|c| Some(c.overcommit_ratio))
        .map_err(|e| anyhow!("{e}"))
}

/// The identity of `dir`'s prjquota.toml: `Some(None)` when there is no
/// file, `None` when it cannot be trusted to tell a change: it cannot be
/// stat'ed (the read then says why), or it changed within the last second,
/// where a second write in the same clock tick would keep its ctime (the
/// registry's rule for its records; a race no test can stage at will).
fn file_key(dir: &Path) -> Option<Option<FileKey>> {
    use std::os::unix::fs::MetadataExt;
    let m = match std::fs::symlink_metadata(dir.join(prjquota_core::config::FILE_NAME)) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some(None),
        Err(_) => return None,
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs() as i64;
    if m.ctime() >= now - 1 {
        return None;
    }
    Some(Some((m.dev(), m.ino(), m.ctime(), m.ctime_nsec())))
}

/// [`ratio`], parsed again only when the file changed; `Ok(None)` when the
/// plugin directory does not exist.
fn cached_ratio(dir: &Path, cache: &Mutex<Option<KeptRatio>>) -> anyhow::Result<Option<f64>> {
    if !dir.is_dir() {
        return Ok(None);
    }
    let Some(key) = file_key(dir) else {
        return ratio(dir);
    };
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, r)) = cache.as_ref().filter(|(k, _)| *k == key) {
        return r.clone().map_err(|e| anyhow!(e));
    }
    let r = ratio(dir).map_err(|e| e.to_string());
    *cache = Some((key, r.clone()));
    r.map_err(|e| anyhow!(e))
}

impl Filesystem {
    /// The overcommit ratio from the plugin directory, read on the blocking
    /// pool: the directory is on the root filesystem, whose stall would
    /// otherwise stop the runtime's one thread, and every timer with it.
    async fn overcommit_ratio(&self) -> anyhow::Result<Option<f64>> {
        let Some(dir) = self.plugin_dir.clone() else {
            return Ok(None);
        };
        let cache = self.ratio.clone();
        let shown = dir.display().to_string();
        match self
            .inflight
            .run("plugin directory", self.timeout, move || {
                cached_ratio(&dir, &cache)
            })
            .await
        {
            Ok(r) => r,
            Err(blocked) => Err(anyhow!("reading the plugin directory {shown}: {blocked}")),
        }
    }
}

impl Collector for Filesystem {
    fn name(&self) -> &'static str {
        "filesystem"
    }

    fn collect<'a>(
        &'a self,
        scrape: &'a Scrape,
        out: &'a mut Vec<Family>,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let inv = &scrape.inventory;
            let mut errors = Vec::new();
            let ratio = self.overcommit_ratio().await.unwrap_or_else(|e| {
                errors.push(e.to_string());
                None
            });
            let reading = scrape.quota().await;
            let stats = scrape.dir_stats().await;
            let g = |name, help| Family::gauge(name, help).with_capacity(inv.dirs.len());
            let mut size = g(
                "nomad_host_volumes_filesystem_size_bytes",
                "Size of the filesystem holding the volumes directory (statfs of the directory).",
            );
            let mut avail = g(
                "nomad_host_volumes_filesystem_available_bytes",
                "Bytes an unprivileged writer can still use on the filesystem holding the volumes directory (statfs f_bavail).",
            );
            let mut free = g(
                "nomad_host_volumes_filesystem_free_bytes",
                "Bytes free on the filesystem holding the volumes directory, those reserved for root included (statfs f_bfree): with the volumes' usage, the room the plugin's admission rule counts (size less what is used outside volumes).",
            );
            let mut provisioned = g(
                "nomad_host_volumes_provisioned_bytes",
                "Sum of the hard limits (provisioned bytes) of the directory's Ready volumes: what the filesystem was promised.",
            );
            let mut used = g(
                "nomad_host_volumes_used_bytes",
                "Sum of the bytes the directory's Ready volumes use (their project quotas); absent when a quota could not be read.",
            );
            let mut healthy = g(
                "nomad_host_volumes_filesystem_healthy",
                "1 when the filesystem holding the volumes directory takes writes; 0 when it is shut down, read-only or its probe timed out (the reason is logged).",
            );
            let mut enforced = g(
                "nomad_host_volumes_quota_enforced",
                "1 when project quotas are enforced on the filesystem holding the volumes directory, 0 when they are off or only accounted; absent when the state could not be read.",
            );
            let mut unprovisioned_f = g(
                "nomad_host_volumes_unprovisioned_bytes",
                "What the plugin would still admit: overcommit_ratio × (filesystem size − bytes used outside its volumes) − the volumes' provisioned bytes, 0 when the filesystem cannot take a volume (unhealthy, quotas not enforced); the largest capacity_max a create can ask for here. Absent when an input is unknown.",
            );
            let mut ratio_f = g(
                "nomad_host_volumes_overcommit_ratio",
                "overcommit_ratio in the plugin's prjquota.toml (--plugin-dir): volumes may be promised this times the filesystem's room; absent when unknown.",
            );
            for (d, dir) in inv.dirs.iter().enumerate() {
                // The join labels of Nomad's own client telemetry, once the
                // directory has a volume whose record names them.
                let node = inv.node_of(d);
                let label = || {
                    let mut l = vec![("volumes_dir", dir.path.display().to_string())];
                    if let Some((id, pool)) = node {
                        l.push(("node_id", id.to_string()));
                        l.push(("node_pool", pool.to_string()));
                    }
                    l
                };
                let key = dir.path.display().to_string();
                let answered = match &stats[d] {
                    Some(Ok(FsStat {
                        frsize,
                        blocks,
                        bfree,
                        bavail,
                        ..
                    })) => {
                        size.labelled(label(), blocks.saturating_mul(*frsize) as f64);
                        avail.labelled(label(), bavail.saturating_mul(*frsize) as f64);
                        free.labelled(label(), bfree.saturating_mul(*frsize) as f64);
                        true
                    }
                    Some(Err(e)) => {
                        errors.push(format!("statfs of {key}: {e}"));
                        !matches!(e, Unanswered::Stuck(_))
                    }
                    // A directory that does not exist: not asked, no series.
                    None => continue,
                };
                // A statfs that did not answer leaves the probe unasked: it
                // would block on the same filesystem.
                let (probe, path) = (self.probe.clone(), dir.path.clone());
                let health = match answered {
                    true => self
                        .inflight
                        .run(&format!("{key} (probe)"), self.timeout, move || {
                            probe(&path)
                        })
                        .await
                        // A stable reason (not the blocked call's age), so
                        // that it is logged once.
                        .unwrap_or_else(|_| Health {
                            unhealthy: Some(format!(
                                "probe did not answer within {:?} (stuck)",
                                self.timeout
                            )),
                            enforced: None,
                        }),
                    false => Health {
                        unhealthy: Some(format!(
                            "statfs did not answer within {:?} (stuck)",
                            self.timeout
                        )),
                        enforced: None,
                    },
                };
                self.note_health(&dir.path, &health);
                healthy.labelled(label(), u8::from(health.unhealthy.is_none()) as f64);
                if let Some(e) = health.enforced {
                    enforced.labelled(label(), u8::from(e) as f64);
                }
                let mine = || (0..inv.volumes.len()).filter(|&i| inv.volumes[i].dir == d);
                let promised = mine()
                    .map(|i| inv.volumes[i].provisioned_bytes)
                    .fold(0u64, u64::saturating_add);
                provisioned.labelled(label(), promised as f64);
                let usage: Option<u64> = mine()
                    .map(|i| reading.per_volume.get(i).copied().flatten())
                    .try_fold(0u64, |sum, q| q.map(|q| sum.saturating_add(q.used_bytes)));
                if let Some(u) = usage {
                    used.labelled(label(), u as f64);
                }
                if let Some(Ok(st)) = &stats[d] {
                    if let Some(left) = unprovisioned(st, &health, usage, promised, ratio) {
                        unprovisioned_f.labelled(label(), left as f64);
                    }
                }
                if let Some(r) = ratio {
                    ratio_f.labelled(label(), r);
                }
            }
            out.extend([
                size,
                avail,
                free,
                provisioned,
                used,
                unprovisioned_f,
                healthy,
                enforced,
                ratio_f,
            ]);
            if errors.is_empty() {
                Ok(())
            } else {
                Err(anyhow!(errors.join("; ")))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collector::dir_stat::StatFn;
    use crate::collector::quota::{ListFn, QuotaReader};
    use crate::inventory::tests::volume;
    use crate::inventory::Inventory;
    use prjquota_core::quota::ProjectQuota;

    fn scrape(quota_ok: bool) -> Scrape {
        let mut a = volume("default", "default", 1001);
        a.provisioned_bytes = 3 << 30;
        let mut b = volume("default", "default", 1002);
        b.provisioned_bytes = 1 << 30;
        let list: ListFn = Arc::new(move |_, _| {
            if quota_ok {
                Ok(vec![ProjectQuota {
                    id: 1001,
                    used_bytes: 4096,
                    ..ProjectQuota::default()
                }])
            } else {
                Err(std::io::Error::from_raw_os_error(libc::ESRCH))
            }
        });
        Scrape::with_quota_reader(
            Inventory::for_tests(vec![a, b]),
            QuotaReader::with_list(Duration::from_secs(5), list),
        )
        .with_dir_stat(Duration::from_secs(5), stat())
    }

    fn stat() -> StatFn {
        Arc::new(|_| {
            Ok(FsStat {
                frsize: 4096,
                blocks: 1000,
                bfree: 600,
                bavail: 500,
                files: 0,
                ffree: 0,
            })
        })
    }

    fn scratch(name: &str, toml: Option<&str>) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("prjq-exp-fs-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        if let Some(t) = toml {
            std::fs::write(dir.join("prjquota.toml"), t).unwrap();
        }
        dir
    }

    async fn text(c: &Filesystem, s: &Scrape) -> (String, anyhow::Result<()>) {
        let mut out = Vec::new();
        let r = c.collect(s, &mut out).await;
        (crate::exposition::encode_all(&out, &s.inventory), r)
    }

    /// The per-directory series carry the node's ID and pool, as Nomad's
    /// client telemetry does, from the directory's newest record (a node
    /// moved to another pool restores every volume with the new one); a
    /// directory without volumes has no record to name them.
    #[tokio::test]
    async fn the_node_labels_come_from_the_newest_record() {
        let c = Filesystem::new(Duration::from_secs(5), None);
        let mut old = volume("default", "old-pool", 1001);
        old.updated_unix = 100;
        let mut new = volume("default", "gpu", 1002);
        new.updated_unix = 200;
        new.node_id = "node-2".into();
        for vols in [vec![old.clone(), new.clone()], vec![new, old]] {
            let (t, r) = text(
                &c,
                &Scrape::new(Inventory::for_tests(vols))
                    .with_dir_stat(Duration::from_secs(5), stat()),
            )
            .await;
            r.unwrap();
            assert!(
                t.contains(
                    "nomad_host_volumes_filesystem_size_bytes{volumes_dir=\"/srv/volumes\",node_id=\"node-2\",node_pool=\"gpu\"} 4096000\n"
                ),
                "{t}"
            );
        }
        let (t, r) = text(
            &c,
            &Scrape::new(Inventory::for_tests(vec![]))
                .with_dir_stat(Duration::from_secs(5), stat()),
        )
        .await;
        r.unwrap();
        assert!(
            t.contains(
                "nomad_host_volumes_filesystem_size_bytes{volumes_dir=\"/srv/volumes\"} 4096000\n"
            ),
            "{t}"
        );
    }

    #[tokio::test]
    async fn one_series_each_per_volumes_dir_with_the_ratio_from_the_plugin_dir() {
        let dir = scratch("ok", Some("overcommit_ratio = 2.5\n"));
        let c = Filesystem::new(Duration::from_secs(5), Some(dir.clone()));
        let (t, r) = text(&c, &scrape(true)).await;
        r.unwrap();
        for line in [
            "nomad_host_volumes_filesystem_size_bytes{volumes_dir=\"/srv/volumes\",node_id=\"node-1\",node_pool=\"default\"} 4096000\n",
            "nomad_host_volumes_filesystem_available_bytes{volumes_dir=\"/srv/volumes\",node_id=\"node-1\",node_pool=\"default\"} 2048000\n",
            "nomad_host_volumes_filesystem_free_bytes{volumes_dir=\"/srv/volumes\",node_id=\"node-1\",node_pool=\"default\"} 2457600\n",
            "nomad_host_volumes_provisioned_bytes{volumes_dir=\"/srv/volumes\",node_id=\"node-1\",node_pool=\"default\"} 4294967296\n",
            "nomad_host_volumes_used_bytes{volumes_dir=\"/srv/volumes\",node_id=\"node-1\",node_pool=\"default\"} 4096\n",
            "nomad_host_volumes_overcommit_ratio{volumes_dir=\"/srv/volumes\",node_id=\"node-1\",node_pool=\"default\"} 2.5\n",
        ] {
            assert!(t.contains(line), "{line} in {t}");
        }
        // No file in an existing plugin dir: the plugin's default, 1.
        std::fs::remove_file(dir.join("prjquota.toml")).unwrap();
        let (t, _) = text(&c, &scrape(true)).await;
        assert!(
            t.contains("nomad_host_volumes_overcommit_ratio{volumes_dir=\"/srv/volumes\",node_id=\"node-1\",node_pool=\"default\"} 1\n"),
            "{t}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The parsed ratio is kept while the file is unchanged: a change of any
    /// kind is seen at the next scrape, right after it (the one-second rule)
    /// and later (the file's identity).
    #[tokio::test]
    async fn a_kept_ratio_follows_every_change_of_the_file() {
        let dir = scratch("kept", Some("overcommit_ratio = 2.5\n"));
        let file = dir.join("prjquota.toml");
        let c = Filesystem::new(Duration::from_secs(5), Some(dir.clone()));
        let settle = || std::thread::sleep(Duration::from_millis(2100));
        let ratio = || async {
            let (t, r) = text(&c, &scrape(true)).await;
            let line = t
                .lines()
                .find(|l| l.starts_with("nomad_host_volumes_overcommit_ratio{"))
                .map(|l| l.rsplit(' ').next().unwrap().to_string());
            (line, r.map_err(|e| e.to_string()))
        };
        let kept = || c.ratio.lock().unwrap().as_ref().map(|(k, _)| *k);
        settle();
        assert_eq!(ratio().await, (Some("2.5".into()), Ok(())));
        let first = kept().expect("an older file's ratio is kept");
        assert_eq!(ratio().await, (Some("2.5".into()), Ok(())));

        // Rewritten in place, same size: seen at once and after it settled.
        std::fs::write(&file, "overcommit_ratio = 3.5\n").unwrap();
        assert_eq!(ratio().await, (Some("3.5".into()), Ok(())));
        settle();
        assert_eq!(ratio().await, (Some("3.5".into()), Ok(())));
        assert_ne!(kept(), Some(first));

        // Made writable by others (content and mtime unchanged): untrusted,
        // so the collector fails, at once and after it settled.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
        for wait in [false, true] {
            if wait {
                settle();
            }
            let (line, r) = ratio().await;
            assert_eq!(line, None);
            assert!(r.unwrap_err().contains("prjquota.toml"));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn an_unknown_ratio_or_usage_is_absent_not_zero_or_one() {
        let c = Filesystem::new(Duration::from_secs(5), Some("/nonexistent/plugins".into()));
        let (t, r) = text(&c, &scrape(false)).await;
        r.unwrap();
        assert!(!t.contains("nomad_host_volumes_overcommit_ratio"), "{t}");
        assert!(!t.contains("nomad_host_volumes_used_bytes"), "{t}");
        assert!(t.contains("nomad_host_volumes_provisioned_bytes{"), "{t}");
        let c = Filesystem::new(Duration::from_secs(5), None);
        let (t, _) = text(&c, &scrape(true)).await;
        assert!(!t.contains("nomad_host_volumes_overcommit_ratio"), "{t}");
    }

    #[tokio::test]
    async fn a_malformed_ratio_fails_the_collector_naming_the_file() {
        let dir = scratch("bad", Some("overcommit_ratio = 0\n"));
        let c = Filesystem::new(Duration::from_secs(5), Some(dir.clone()));
        let (t, r) = text(&c, &scrape(true)).await;
        let e = r.unwrap_err().to_string();
        assert!(
            e.contains("prjquota.toml") && e.contains("overcommit_ratio"),
            "{e}"
        );
        assert!(!t.contains("nomad_host_volumes_overcommit_ratio"), "{t}");
        assert!(
            t.contains("nomad_host_volumes_filesystem_size_bytes{"),
            "{t}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// What admission would accept: the rule's arithmetic on the statfs,
    /// nothing on a filesystem that refuses every create, and no figure
    /// at all when an input is unknown.
    #[test]
    fn unprovisioned_is_the_admission_rule_or_nothing() {
        let st = FsStat {
            frsize: 4096,
            blocks: 1_000_000,
            bfree: 400_000,
            ..FsStat::default()
        };
        let good = Health {
            unhealthy: None,
            enforced: Some(true),
        };
        let b = |blocks: u64| blocks * 4096;
        // 600k blocks used, 100k of them by volumes: 500k left to promise,
        // 200k promised already.
        assert_eq!(
            unprovisioned(&st, &good, Some(b(100_000)), b(200_000), Some(1.0)),
            Some(b(300_000))
        );
        assert_eq!(
            unprovisioned(&st, &good, Some(b(100_000)), b(200_000), Some(2.0)),
            Some(b(800_000))
        );
        assert_eq!(
            unprovisioned(&st, &good, Some(b(100_000)), b(900_000), Some(1.0)),
            Some(0)
        );
        for bad in [
            Health {
                unhealthy: Some("read-only".into()),
                enforced: None,
            },
            Health {
                unhealthy: None,
                enforced: Some(false),
            },
        ] {
            assert_eq!(unprovisioned(&st, &bad, Some(0), 0, Some(1.0)), Some(0));
        }
        assert_eq!(unprovisioned(&st, &good, None, 0, Some(1.0)), None);
        assert_eq!(unprovisioned(&st, &good, Some(0), 0, None), None);
    }

    #[tokio::test]
    async fn health_and_enforcement_follow_the_probe_per_directory() {
        let state = Arc::new(Mutex::new(Health {
            unhealthy: None,
            enforced: Some(true),
        }));
        let seen = state.clone();
        let probe: ProbeFn = Arc::new(move |_| seen.lock().unwrap().clone());
        let c = Filesystem::with_probe(Duration::from_secs(5), None, probe);
        let line = |t: &str, name: &str| {
            t.lines()
                .find(|l| l.starts_with(&format!("{name}{{volumes_dir=\"/srv/volumes\",node_id=\"node-1\",node_pool=\"default\"}}")))
                .map(|l| l.rsplit(' ').next().unwrap().to_string())
        };
        let (t, r) = text(&c, &scrape(true)).await;
        r.unwrap();
        assert_eq!(
            line(&t, "nomad_host_volumes_filesystem_healthy").as_deref(),
            Some("1")
        );
        // Without a plugin directory the ratio is unknown: no figure.
        assert_eq!(line(&t, "nomad_host_volumes_unprovisioned_bytes"), None);
        assert_eq!(
            line(&t, "nomad_host_volumes_quota_enforced").as_deref(),
            Some("1")
        );
        *state.lock().unwrap() = Health {
            unhealthy: Some("read-only".into()),
            enforced: Some(false),
        };
        let (t, _) = text(&c, &scrape(true)).await;
        assert_eq!(
            line(&t, "nomad_host_volumes_filesystem_healthy").as_deref(),
            Some("0")
        );
        assert_eq!(
            line(&t, "nomad_host_volumes_quota_enforced").as_deref(),
            Some("0")
        );
        // A filesystem that refuses every create has nothing to offer.
        assert_eq!(
            line(&t, "nomad_host_volumes_unprovisioned_bytes").as_deref(),
            Some("0")
        );
        // A state that cannot be read is absent, not a made-up 0 or 1.
        state.lock().unwrap().enforced = None;
        let (t, _) = text(&c, &scrape(true)).await;
        assert_eq!(line(&t, "nomad_host_volumes_quota_enforced"), None);
        assert_eq!(
            line(&t, "nomad_host_volumes_filesystem_healthy").as_deref(),
            Some("0")
        );
    }

    /// A statfs that does not answer makes the directory unhealthy at once,
    /// without asking the probe, which would block on the same filesystem.
    #[tokio::test]
    async fn a_stuck_statfs_is_unhealthy_within_the_timeout() {
        let stuck: StatFn = Arc::new(|_| {
            std::thread::sleep(Duration::from_millis(600));
            Err(std::io::Error::from_raw_os_error(libc::EIO))
        });
        let probe: ProbeFn = Arc::new(|_| panic!("the probe is not asked while statfs is stuck"));
        let c = Filesystem::with_probe(Duration::from_millis(100), None, probe);
        let began = std::time::Instant::now();
        let s = scrape(true).with_dir_stat(Duration::from_millis(100), stuck);
        let (t, r) = text(&c, &s).await;
        assert!(began.elapsed() < Duration::from_millis(500));
        assert!(r
            .unwrap_err()
            .to_string()
            .contains("statfs of /srv/volumes"));
        assert!(
            t.contains("nomad_host_volumes_filesystem_healthy{volumes_dir=\"/srv/volumes\",node_id=\"node-1\",node_pool=\"default\"} 0\n"),
            "{t}"
        );
        let h = c
            .last_health
            .lock()
            .unwrap()
            .values()
            .next()
            .cloned()
            .unwrap();
        assert!(h.unhealthy.unwrap().contains("stuck"));
    }

    #[test]
    fn the_probe_of_a_writable_directory_says_healthy() {
        let dir = scratch("probe", None);
        let h = probe(&dir);
        assert_eq!(h.unhealthy, None, "{h:?}");
        let gone = probe(&dir.join("missing"));
        assert!(gone.unhealthy.unwrap().starts_with("open:"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
