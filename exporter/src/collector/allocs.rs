//! The allocations collector (`--nomad.alloc-dir`): each Nomad
//! allocation's disk usage from its project quota (see [`crate::allocs`]).
//!
//! A thread of its own keeps the allocations' projects current every
//! `--nomad.alloc-scan-interval`, scrapes or not: a task that starts
//! between two scrapes is tagged within one interval of its start. A scrape
//! reads what that thread found and makes one quota pass over the IDs it
//! holds, with the stuck-mount rule; it never lists or walks a tree.
//!
//! Until accounting can run (no such directory yet, no project quota on
//! its filesystem, a chroot source on its mount, another exporter owning
//! it), the collector fails with the reason at every scrape and the
//! thread tries again every interval: an operator's fix needs no restart.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use prjquota_core::guard_contract::{kernel_dev, PinnedGuard, RootKey};
use prjquota_core::{config, quota, run_dir, sys};

use super::{BoxFuture, Collector, Scrape};
use crate::allocs::disk_limits::DiskLimits;
use crate::allocs::tag_walk::Walked;
use crate::allocs::{Accounting, Census, GuardLink, GuardOwner, GuardedAlloc, GuardedRoots};
use crate::blocking::InFlight;
use crate::exposition::Family;

/// What the flags say.
#[derive(Debug, Clone)]
pub struct AllocsSetup {
    /// Nomad's `<data_dir>/alloc`.
    pub alloc_dir: PathBuf,
    /// Where prjquota.toml (the allocations' ID range) is.
    pub plugin_dir: Option<PathBuf>,
    pub scan_interval: Duration,
    /// The client's `chroot_env` sources ([`CHROOT_SOURCES`] by default).
    pub chroot_sources: Vec<PathBuf>,
    /// Each allocation's `ephemeral_disk.size` as its limit, or the lifting
    /// of limits an earlier start set (`crate::allocs::disk_limits`).
    pub disk_limits: Arc<DiskLimits>,
}

/// Where Nomad's exec and java drivers take a chroot's files from when the
/// client sets no `chroot_env` (client/allocdir's default chroot): hard
/// links from these into a tagged allocation would fail, and Nomad would
/// copy them.
pub const CHROOT_SOURCES: [&str; 8] = [
    "/bin",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/run/resolvconf",
    "/sbin",
    "/usr",
];

/// Between two scans while a walk is under way.
const WALK_PAUSE: Duration = Duration::from_millis(5);

/// What the scan thread publishes for scrapes.
#[derive(Debug, Default)]
struct Shared {
    /// Why accounting does not run, when it does not.
    down: Option<String>,
    /// The alloc directory, for the scrapes' quota pass.
    dir: Option<Arc<OwnedFd>>,
    census: Census,
    walked: Walked,
    walks: u64,
    /// Allocations a scan could not tag (retried at the next).
    failures: u64,
}

pub struct Allocs {
    shared: Arc<Mutex<Shared>>,
    /// The accounted allocations, as handed to the guard: the scrapes'
    /// quota pass reads the same list.
    guarded: Arc<GuardedRoots>,
    path: PathBuf,
    timeout: Duration,
    inflight: InFlight,
}

/// Where this exporter's guard is pinned (`--guard.pin-root` and a volumes
/// directory it guards): an allocation is written into those maps at its
/// claim, as the plugin writes a new volume's root, rather than at the
/// sync's next round.
#[derive(Debug, Clone)]
pub struct GuardPins {
    pub pin_root: PathBuf,
    pub volumes_dir: PathBuf,
}

impl Allocs {
    /// Starts the scan thread, which hands each claimed allocation to the
    /// guard through `guarded` and, when the guard is on, `pins`.
    pub fn start(
        setup: AllocsSetup,
        timeout: Duration,
        guarded: Arc<GuardedRoots>,
        pins: Option<GuardPins>,
    ) -> Allocs {
        let shared = Arc::new(Mutex::new(Shared {
            down: Some("the first scan has not finished".into()),
            ..Shared::default()
        }));
        let weak = Arc::downgrade(&shared);
        let path = setup.alloc_dir.clone();
        let spawned = std::thread::Builder::new()
            .name("alloc-scan".into())
            .spawn({
                let guarded = guarded.clone();
                move || scan_loop(weak, setup, guarded, pins)
            });
        if let Err(e) = spawned {
            lock(&shared).down = Some(format!("cannot start the allocation scan thread: {e}"));
        }
        Allocs {
            shared,
            guarded,
            path,
            timeout,
            inflight: InFlight::new("quotactl"),
        }
    }
}

fn lock(m: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Accounting and the lock that makes this exporter its only owner.
struct Owned {
    accounting: Accounting,
    _lock: prjquota_core::lock_file::LockFile,
}

fn scan_loop(
    weak: Weak<Mutex<Shared>>,
    setup: AllocsSetup,
    guarded: Arc<GuardedRoots>,
    pins: Option<GuardPins>,
) {
    let mut owned: Option<Owned> = None;
    let mut logged_down: Option<String> = None;
    let mut logged_failures: HashMap<String, String> = HashMap::new();
    loop {
        // The collector is gone (an exporter made in a test): stop.
        let Some(shared) = weak.upgrade() else { return };
        // With the guard on, only its owner accounts allocations: wait
        // for its start to say whose it is (it waits for this thread's
        // first scan before it takes over, so this comes first), and step
        // back when it is another exporter's.
        let owner = if pins.is_some() {
            guarded.wait_owner(setup.scan_interval.max(Duration::from_millis(100)))
        } else {
            GuardOwner::None
        };
        let refusal = match &owner {
            GuardOwner::Pending => Some(None),
            GuardOwner::Elsewhere(why) => Some(Some(why.clone())),
            GuardOwner::Mine | GuardOwner::None => None,
        };
        if let Some(why) = refusal {
            if let Some(why) = why {
                if logged_down.as_ref() != Some(&why) {
                    crate::error!(
                        "cannot account Nomad allocations; retrying every scan interval",
                        alloc_dir = setup.alloc_dir.display(),
                        error = why,
                    );
                    logged_down = Some(why.clone());
                }
                // Given up: the owner's guard is not waiting for this one.
                owned = None;
                lock(&shared).down = Some(why);
                guarded.settle();
            } else {
                lock(&shared).down = Some("waiting for the quota-escape guard's start".into());
            }
            drop(shared);
            std::thread::sleep(setup.scan_interval);
            continue;
        }
        if owned.is_none() {
            match take(&setup) {
                Ok(o) => {
                    crate::info!(
                        "accounting Nomad allocations' disk usage",
                        alloc_dir = setup.alloc_dir.display(),
                        accounted = o.accounting.census().accounted,
                        project_ids = format!(
                            "{}..={}",
                            o.accounting.range().start(),
                            o.accounting.range().end()
                        ),
                    );
                    logged_down = None;
                    owned = Some(o);
                }
                Err(e) => {
                    let why = format!("{e:#}");
                    if logged_down.as_ref() != Some(&why) {
                        crate::error!(
                            "cannot account Nomad allocations; retrying every scan interval",
                            alloc_dir = setup.alloc_dir.display(),
                            error = why,
                        );
                        logged_down = Some(why.clone());
                    }
                    lock(&shared).down = Some(why);
                    guarded.settle();
                }
            }
        }
        if let Some(o) = owned.as_mut() {
            let result = o.accounting.scan(&mut ScanGuard {
                guarded: &guarded,
                // Into the pinned maps only when they are this exporter's.
                pins: pins.as_ref().filter(|_| owner == GuardOwner::Mine),
                opened: None,
            });
            // The claims go to the guard (and settle a starting one) before
            // any walk runs.
            let (accounted, claimed) = o.accounting.guarded();
            guarded.publish(accounted, claimed);
            let result = result.map(|mut failed| {
                failed.extend(o.accounting.step_walks());
                failed.extend(setup.disk_limits.apply(&o.accounting));
                failed
            });
            let mut s = lock(&shared);
            match result {
                Ok(failed) => {
                    s.down = None;
                    for (id, e) in &failed {
                        let why = format!("{e:#}");
                        if logged_failures.get(id) != Some(&why) {
                            crate::warn!(
                                "cannot account an allocation; retrying at the next scan",
                                alloc_id = id,
                                error = why,
                            );
                            logged_failures.insert(id.clone(), why);
                        }
                    }
                    s.failures += failed.len() as u64;
                    logged_failures.retain(|id, _| failed.iter().any(|(f, _)| f == id));
                }
                Err(e) => s.down = Some(format!("{e:#}")),
            }
            s.dir = Some(o.accounting.dir());
            // Under the lock, so that a scrape's census and list agree.
            let (accounted, claimed) = o.accounting.guarded();
            guarded.publish(accounted, claimed);
            s.census = o.accounting.census();
            s.walked = o.accounting.walked;
            s.walks = o.accounting.walks;
        }
        drop(shared);
        // A walk under way goes on at once: each scan steps every walk by
        // a budget, so a long one neither stalls nor starves the others.
        let busy = owned.as_ref().is_some_and(|o| o.accounting.busy());
        std::thread::sleep(if busy {
            WALK_PAUSE.min(setup.scan_interval)
        } else {
            setup.scan_interval
        });
    }
}

/// The guard as one scan sees it: the sync's list, and the maps pinned at
/// `pins` (opened once per scan), which the scan writes each claim into,
/// as the plugin writes a new volume's root, and reads the counts from.
struct ScanGuard<'a> {
    guarded: &'a GuardedRoots,
    pins: Option<&'a GuardPins>,
    opened: Option<Option<PinnedGuard>>,
}

impl ScanGuard<'_> {
    fn pinned(&mut self) -> Result<Option<&PinnedGuard>> {
        let Some(pins) = self.pins else {
            return Ok(None);
        };
        if self.opened.is_none() {
            self.opened = Some(PinnedGuard::open_in(&pins.pin_root, &pins.volumes_dir)?);
        }
        Ok(self.opened.as_ref().and_then(Option::as_ref))
    }
}

fn kernel_dev_of(alloc: &GuardedAlloc) -> Result<u64> {
    kernel_dev(alloc.dev).with_context(|| format!("device {:#x} has no kernel encoding", alloc.dev))
}

impl GuardLink for ScanGuard<'_> {
    /// First where the sync looks, then in the maps: a round that read the
    /// maps before this write keeps it. A guard that is pinned but cannot
    /// be written stops the claim (retried at the next scan), as it stops
    /// a volume's create.
    fn join(&mut self, alloc: &GuardedAlloc, fresh: bool) -> Result<()> {
        self.guarded.join(alloc.clone());
        let Some(guard) = self.pinned()? else {
            if self.pins.is_some() {
                self.guarded.nudge();
            }
            return Ok(());
        };
        let root = RootKey {
            dev: kernel_dev_of(alloc)?,
            ino: alloc.ino,
            gen: alloc.gen,
        };
        guard.register(&root, alloc.project_id, fresh)?;
        Ok(())
    }

    fn let_through(&mut self, alloc: &GuardedAlloc) -> Result<Option<u64>> {
        let dev = kernel_dev_of(alloc)?;
        let Some(guard) = self.pinned()? else {
            return Ok(None);
        };
        Ok(Some(guard.allowed(dev, alloc.project_id)?))
    }
}

/// Everything that must hold before this exporter tags anything.
fn take(setup: &AllocsSetup) -> Result<Owned> {
    let cfg = match &setup.plugin_dir {
        Some(d) => config::load(d)?,
        None => config::Config::default(),
    };
    let range = cfg.alloc_project_ids().map_err(|e| anyhow!(e))?;
    let path = &setup.alloc_dir;
    let dir = open_dir(path)?;
    refuse_read_only(&dir, path)?;
    refuse_chroot_sources_on_mount(&dir, path, &setup.chroot_sources)?;
    let st = sys::fstat(dir.as_fd())?;
    // One owner per alloc directory: two exporters would give one
    // allocation two IDs. (IDs themselves are chosen under a lock per
    // filesystem: `Accounting`.)
    let name = format!("allocs-{:x}-{:x}.lock", st.st_dev, st.st_ino);
    let lock = run_dir::try_lock(&name)
        .with_context(|| format!("cannot take {}/{name}", run_dir::RUN_DIR))?
        .with_context(|| {
            format!(
                "another prjquota-exporter accounts the allocations of {} (it holds {}/{name}): \
                 one exporter per node does; stop the other or leave --nomad.alloc-dir off here",
                path.display(),
                run_dir::RUN_DIR
            )
        })?;
    let accounting = Accounting::open(path, Arc::new(dir), range)?;
    Ok(Owned {
        accounting,
        _lock: lock,
    })
}

fn open_dir(path: &Path) -> Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(path)
        .map(OwnedFd::from)
        .with_context(|| {
            format!(
                "cannot open Nomad's alloc directory {} (--nomad.alloc-dir names the agent's \
                 <data_dir>/alloc)",
                path.display()
            )
        })
}

/// Refuses an alloc directory this process cannot write: every claim and
/// walk would fail. Under a sandbox (the package's unit is
/// `ProtectSystem=strict`) the directory is writable only when it was
/// named to the sandbox and existed when the service started.
fn refuse_read_only(dir: &OwnedFd, path: &Path) -> Result<()> {
    let st = nix::sys::statvfs::fstatvfs(dir)
        .with_context(|| format!("cannot statvfs {}", path.display()))?;
    if st.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY) {
        bail!(
            "{} is read-only to this exporter, so no allocation can be put into its project: \
             under the package's unit, set NOMAD_ALLOC_DIR={} in /etc/default/prjquota \
             (/etc/sysconfig/prjquota) rather than --nomad.alloc-dir in EXPORTER_ARGS, then \
             systemctl daemon-reload && systemctl restart prjquota-exporter; elsewhere, mount \
             its filesystem read-write (docs/allocations.md)",
            path.display(),
            path.display()
        );
    }
    Ok(())
}

/// Refuses an alloc directory on the same mount as a chroot source: there
/// Nomad builds exec and java chroots with hard links, which a tagged
/// allocation turns into copies (charged to it, and slow).
fn refuse_chroot_sources_on_mount(dir: &OwnedFd, path: &Path, sources: &[PathBuf]) -> Result<()> {
    let mnt = sys::mount_id(dir.as_fd())
        .with_context(|| format!("cannot read the mount ID of {}", path.display()))?;
    for src in sources {
        let Ok(f) = std::fs::File::open(src) else {
            continue;
        };
        if sys::mount_id(f.as_fd()).is_ok_and(|m| m == mnt) {
            bail!(
                "{} is on the same mount as {}, a source of the chroots Nomad's exec and java \
                 drivers build with hard links: accounted allocations would turn each link into \
                 a copy. Put Nomad's data_dir on a filesystem of its own (docs/allocations.md)",
                path.display(),
                src.display()
            );
        }
    }
    Ok(())
}

impl Collector for Allocs {
    fn name(&self) -> &'static str {
        "allocs"
    }

    fn collect<'a>(
        &'a self,
        _scrape: &'a Scrape,
        out: &'a mut Vec<Family>,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let (down, dir, accounted, census, walked, walks, failures) = {
                let s = lock(&self.shared);
                (
                    s.down.clone(),
                    s.dir.clone(),
                    self.guarded.accounted(),
                    s.census,
                    s.walked,
                    s.walks,
                    s.failures,
                )
            };
            // Down, nothing is measured: no zeros that would say otherwise.
            if let Some(why) = down {
                bail!("{why}");
            }
            out.extend(self_families(census, walked, walks, failures));
            let Some(dir) = dir else { return Ok(()) };
            let ids = accounted.iter().map(|a| a.project_id);
            let (Some(lo), Some(hi)) = (ids.clone().min(), ids.max()) else {
                out.extend(usage_families(&accounted, &[]));
                return Ok(());
            };
            let key = self.path.display().to_string();
            let found = match self
                .inflight
                .run(&key, self.timeout, move || {
                    quota::list(dir.as_fd(), lo..=hi)
                })
                .await
            {
                Ok(Ok(found)) => found,
                Ok(Err(e)) => return Err(io_context(e, &self.path)),
                Err(blocked) => bail!("quotactl in {key}: {blocked}"),
            };
            out.extend(usage_families(&accounted, &found));
            Ok(())
        })
    }
}

/// Every family this collector can publish (the dashboards' lint).
pub fn catalogue() -> Vec<Family> {
    let mut all = usage_families(&[], &[]);
    all.extend(self_families(Census::default(), Walked::default(), 0, 0));
    all
}

fn io_context(e: io::Error, path: &Path) -> anyhow::Error {
    anyhow!(
        "cannot read the allocations' project quotas in {}: {e}",
        path.display()
    )
}

/// Each accounted allocation's usage; `found` is the quota pass, in ID
/// order (an ID missing from it has no usage).
fn usage_families(accounted: &[GuardedAlloc], found: &[quota::ProjectQuota]) -> Vec<Family> {
    let mut bytes = Family::gauge(
        "nomad_alloc_disk_used_bytes",
        "Bytes the kernel charges to the allocation directory's project quota: its files on the alloc directory's filesystem, without its mounts (secrets, private, the shared alloc bind mount counted once) and without files linked from the host. Join on alloc_id with Nomad's nomad_client_allocs_* series.",
    )
    .with_capacity(accounted.len());
    let mut inodes = Family::gauge(
        "nomad_alloc_disk_used_inodes",
        "Inodes the kernel charges to the allocation directory's project quota.",
    )
    .with_capacity(accounted.len());
    let mut limit = Family::gauge(
        "nomad_alloc_disk_limit_bytes",
        "The hard limit of the allocation directory's project quota: its ephemeral_disk.size with --nomad.enforce-ephemeral-disk (above its usage when it was over that size when limited); absent when it has none.",
    );
    for a in accounted {
        let q = found
            .binary_search_by_key(&a.project_id, |q| q.id)
            .map(|k| found[k])
            .unwrap_or_default();
        bytes.labelled_shared("alloc_id", &a.alloc_id, &[], q.used_bytes as f64);
        inodes.labelled_shared("alloc_id", &a.alloc_id, &[], q.used_inodes as f64);
        if q.limits.bytes_hard != 0 {
            limit.labelled_shared("alloc_id", &a.alloc_id, &[], q.limits.bytes_hard as f64);
        }
    }
    vec![bytes, inodes, limit]
}

fn self_families(census: Census, walked: Walked, walks: u64, failures: u64) -> Vec<Family> {
    let mut allocs = Family::gauge(
        "prjquota_exporter_allocs",
        "Allocation directories by state: accounted (in a project of their own, walked), walking (in their project, the walk under way or failed and retried at the next scan: usage not published yet), waiting (no task started yet), foreign (already in a project outside alloc_project_id_min..max: left alone).",
    );
    for (state, n) in [
        ("accounted", census.accounted),
        ("walking", census.walking),
        ("waiting", census.waiting),
        ("foreign", census.foreign),
    ] {
        allocs.labelled(vec![("state", state.into())], n as f64);
    }
    let mut retries = Family::gauge(
        "prjquota_exporter_alloc_walk_retries",
        "Files the allocation walks could not tag yet (another process holds a write lease on them, or the kernel refused: the log says why), tried again at every scan; an allocation is marked walked only once none is left.",
    );
    retries.plain(census.retries as f64);
    let mut walks_f = Family::counter(
        "prjquota_exporter_alloc_walks_total",
        "Walks that put an allocation's tree into its project (once per allocation; again after a crash interrupted one).",
    );
    walks_f.plain(walks as f64);
    let mut entries = Family::counter(
        "prjquota_exporter_alloc_walk_entries_total",
        "Entries the allocation walks met, by outcome: tagged; already (in the project); linked, mount, special, deep (left out by design, see docs/allocations.md); gone (removed meanwhile); failed (could not be tagged: they stay charged to the project they had).",
    );
    for (outcome, n) in [
        ("tagged", walked.dirs + walked.files),
        ("already", walked.already),
        ("linked", walked.linked),
        ("mount", walked.mounts),
        ("special", walked.special),
        ("deep", walked.deep),
        ("gone", walked.gone),
        ("failed", walked.failed),
    ] {
        entries.labelled(vec![("outcome", outcome.into())], n as f64);
    }
    let mut fail = Family::counter(
        "prjquota_exporter_alloc_tag_failures_total",
        "Scans that could not put a started allocation into its project (retried at the next scan; the log says why).",
    );
    fail.plain(failures as f64);
    vec![allocs, retries, walks_f, entries, fail]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_read_from_the_pass_and_missing_ids_are_zero() {
        let alloc = |id: &str, project_id| GuardedAlloc {
            alloc_id: id.into(),
            dev: 0x803,
            ino: 131,
            gen: 1,
            project_id,
        };
        let accounted = vec![
            alloc("8f3e9d2c-4b1a-4c6e-9a7d-2e5b6c1f0a93", 2_000_000_001),
            alloc("0a3e9d2c-4b1a-4c6e-9a7d-2e5b6c1f0a93", 2_000_000_005),
        ];
        let found = [quota::ProjectQuota {
            id: 2_000_000_005,
            used_bytes: 8192,
            used_inodes: 3,
            ..Default::default()
        }];
        let fams = usage_families(&accounted, &found);
        let text =
            crate::exposition::encode_all(&fams, &crate::inventory::Inventory::for_tests(vec![]));
        assert!(
            text.contains("nomad_alloc_disk_used_bytes{alloc_id=\"0a3e9d2c-4b1a-4c6e-9a7d-2e5b6c1f0a93\"} 8192"),
            "{text}"
        );
        assert!(
            text.contains(
                "nomad_alloc_disk_used_inodes{alloc_id=\"8f3e9d2c-4b1a-4c6e-9a7d-2e5b6c1f0a93\"} 0"
            ),
            "{text}"
        );
    }
}
