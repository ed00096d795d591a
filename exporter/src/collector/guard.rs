//! The guard collector: attempts to move files out of a volume's project,
//! counted and, wherever the BPF LSM is active, refused in the kernel by
//! `prjquota_ebpf::guard`.
//!
//! A project quota only holds while the volume's files stay in its project;
//! a file's owner, or root in a container without CAP_SYS_ADMIN, can give a
//! file another project ID (or clear PROJINHERIT on a directory) and stop
//! paying for it. `--guard` says what the exporter does about it:
//!
//! - `auto` (default): `enforce` where the BPF LSM is active, else
//!   `detect` ([`GuardMode::resolve`]). A project-ID change by an
//!   unprivileged caller inside a volume is never legitimate, so refusing
//!   is the default wherever the kernel can; where it cannot, or the LSM
//!   program does not attach, the guard detects, logs why at warn (error
//!   when the LSM is active: the node could enforce and does not) and
//!   publishes it, and the exporter runs;
//! - `detect`: count attempts per volume by outcome,
//!   `nomad_host_volume_projid_change_attempts_total{result="allowed|denied"}`,
//!   and log each one (process name, pid, uid, cgroup ID);
//! - `enforce`: also refuse them with EPERM through a BPF LSM program. When
//!   the BPF LSM is not active (or the program cannot attach), the load
//!   reports it ([`Collector::ready`]) and the exporter refuses to start:
//!   an operator who asked for enforcement is not served detection under
//!   the same name;
//! - `off`: load nothing.
//!
//! `prjquota_exporter_guard_mode{mode}` has one series per mode, 1 for the
//! mode in force (`off` when loading failed); in detect,
//! `prjquota_exporter_guard_not_enforcing_reason{reason}` says why. Who may change a project ID
//! without being counted: callers with CAP_SYS_ADMIN in the initial user
//! namespace (the plugin, administrators); their changes are logged at info
//! and counted in `prjquota_exporter_guard_privileged_changes_total`.
//!
//! The guard outlives the exporter: it is pinned in bpffs
//! (`--guard.pin-root`, `prjquota_ebpf::guard::pins`), so the kernel keeps
//! enforcing through a restart, a crash or an upgrade, and a new exporter
//! replaces it without a gap, but never while its owner runs
//! (`crate::guard::owner`). `--guard=off` removes the pins of its volumes
//! directories whose owner is gone. A guard that cannot be pinned runs attached to this process
//! only: `prjquota_exporter_guard_pinned 0`, logged; with `--guard=enforce`
//! the exporter refuses to start instead (the pins of the exporter before
//! it, if any, keep enforcing).
//!
//! Volumes enter the maps from the plugin (create) and from the sync timer
//! (`crate::guard::sync`, `--guard.sync-interval`), never from scrapes: a scrape
//! only reads the counters and the events.

use foldhash::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::background::{self, Background};
use super::{BoxFuture, Collector, Scrape};
use crate::allocs::{GuardOwner, GuardedAlloc, GuardedRoots};
use crate::exposition::{Extra, Family};
use crate::guard::owner::{self, Keeper};
use crate::guard::ranges::GuardRanges;
use crate::guard::sync::Syncer;
use anyhow::anyhow;
use prjquota_ebpf::guard::{
    bpf_lsm_active, pins, Guard, GuardCounters, GuardEvent, GuardMode, Outcome, Outcomes,
};
use prjquota_ebpf::{kernel_dev, LoadOptions};

/// How long a scrape waits for the start-up load at most.
const LOAD_WAIT: Duration = Duration::from_secs(2);

/// How often a starting guard says it still waits for the allocations'
/// first scan (a read of each allocation directory's project; walks go on
/// after it, in steps).
const ALLOCS_FIRST_SCAN_WAIT: Duration = Duration::from_secs(10);
/// Events logged one by one per scrape; the rest are summed up in one line.
const MAX_LOGGED_EVENTS: usize = 50;

const ALLOWED: Extra = &[("result", "allowed")];
const DENIED: Extra = &[("result", "denied")];

/// Where the guard stands: off is `--guard=off` (`error` None) or a load
/// that failed.
/// An off guard's detail: the volumes directories another exporter's
/// guard covers, and why (`crate::guard::owner`).
type Status = background::Status<Loaded, owner::Skipped>;

/// A guard loaded.
struct Loaded {
    guard: Arc<Mutex<Guard>>,
    mode: GuardMode,
    /// Enforcement asked for (`enforce`, or `auto`) and not in force:
    /// (label, words).
    fallback: Option<(&'static str, String)>,
    /// Why the guard detects only ([`detect_reason`]); `None` when
    /// enforcing.
    detect_reason: Option<&'static str>,
    /// The pin directory, or why the guard is not pinned.
    pinned: Result<PathBuf, String>,
    /// Pin directories of earlier starts removed at this start.
    removed: usize,
    syncer: Arc<Syncer>,
    keeper: Arc<Keeper>,
    /// The owner locks of the volumes directories guarded here.
    _locks: Vec<pins::OwnerLock>,
}

/// A guard runs as asked when it runs in the mode asked for and is pinned.
impl background::Loaded for Loaded {
    fn shortfall(&self) -> Option<String> {
        match (&self.fallback, &self.pinned) {
            (Some((_, why)), _) => Some(why.clone()),
            (None, Err(why)) => Some(format!(
                "the guard could not be pinned, so it would stop with this process: {why}"
            )),
            (None, Ok(_)) => None,
        }
    }
}

/// Who loads, for the error when it stopped without a result.
const LOADER: &str = "the guard loader";

/// Where and how the guard is kept (`--guard.*` flags).
#[derive(Clone, Debug)]
pub struct GuardSetup {
    pub mode: GuardMode,
    pub volumes_dirs: Vec<PathBuf>,
    /// `--guard.pin-root`.
    pub pin_root: PathBuf,
    /// `--guard.sync-interval`.
    pub sync_interval: Duration,
    /// `--guard.verify-interval`.
    pub verify_interval: Duration,
    /// `--guard.replace-stronger`.
    pub replace_stronger: bool,
    /// The accounted allocations' directories (`--nomad.alloc-dir`), roots
    /// besides the volumes'.
    pub allocs: Option<Arc<GuardedRoots>>,
    /// Where prjquota.toml is (`--plugin-dir`): the project-ID ranges the
    /// guard keeps for prjquota.
    pub plugin_dir: Option<PathBuf>,
}

pub struct GuardCollector {
    status: Background<Loaded, owner::Skipped>,
}

impl GuardCollector {
    /// Starts loading the guard on the blocking pool, then its sync timer;
    /// for [`GuardMode::Off`], removes the pins of the volumes directories.
    pub fn start(setup: GuardSetup, timeout: Duration, opts: LoadOptions) -> GuardCollector {
        let wait = timeout.min(LOAD_WAIT);
        if setup.mode == GuardMode::Off {
            if let Some(allocs) = &setup.allocs {
                allocs.set_owner(GuardOwner::None);
            }
        }
        let status = if setup.mode == GuardMode::Off {
            // Readiness waits for the unpin: once ready, an earlier
            // exporter's guard no longer refuses anything.
            Background::load(wait, LOADER, move || unpin(&setup), |_: &Loaded| {})
        } else {
            let interval = setup.sync_interval;
            Background::load(
                wait,
                LOADER,
                move || load(&setup, &opts),
                move |l: &Loaded| {
                    spawn_sync(
                        l.guard.clone(),
                        l.syncer.clone(),
                        l.keeper.clone(),
                        interval,
                    )
                },
            )
        };
        GuardCollector { status }
    }

    async fn collect_guard(
        &self,
        scrape: &Scrape,
        guard: &Arc<Mutex<Guard>>,
        allocs: Option<&GuardedRoots>,
        out: &mut Vec<Family>,
    ) -> anyhow::Result<()> {
        let allocs = allocs.map(|a| a.current().0);
        // On this task, as the write telemetry's reads (`super::ebpf`).
        let (counters, events) = {
            let mut g = guard.lock().unwrap_or_else(|e| e.into_inner());
            let events = g.drain_events();
            (g.read(), events)
        };
        log_events(scrape, allocs.as_deref().map(Vec::as_slice), &events);
        match counters {
            Ok(c) => {
                out.extend(counter_families(scrape, &c));
                if let Some(a) = &allocs {
                    out.push(alloc_attempts_family(a, &c));
                }
                Ok(())
            }
            Err(e) => Err(anyhow!("reading the guard's counters: {e}")),
        }
    }
}

/// `--guard=off`: the pins of these volumes directories go, and with them
/// the guard an earlier exporter left enforcing; off, with the error when
/// that guard could not be removed.
fn unpin(setup: &GuardSetup) -> Status {
    // A guard whose exporter runs is that exporter's to remove: stop it
    // first. The locks are held until the pins are gone.
    let (dirs, _locks) = if setup.pin_root.exists() {
        let c = owner::claim(&setup.pin_root, &setup.volumes_dirs, GuardMode::Off, true);
        (c.dirs, c.locks)
    } else {
        (setup.volumes_dirs.clone(), Vec::new())
    };
    let error = match pins::remove_for(&setup.pin_root, &dirs) {
        Ok(removed) if removed.is_empty() => {
            crate::info!("quota-escape guard disabled (--guard=off); no pinned guard to remove");
            None
        }
        Ok(removed) => {
            crate::warn!(
                "quota-escape guard disabled (--guard=off): removed the guard an earlier exporter pinned; project-ID changes are no longer refused or counted",
                pin_dirs = removed
                    .iter()
                    .map(|(d, _)| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(","),
                pins = removed.iter().map(|(_, n)| n).sum::<usize>()
            );
            None
        }
        Err(e) => {
            crate::error!(
                "quota-escape guard disabled (--guard=off), but the pinned guard of an earlier exporter could not be removed and still enforces; remove it with `rm -r` of the pin root",
                pin_root = setup.pin_root.display(),
                err = e
            );
            Some(format!(
                "the guard an earlier exporter pinned under {} still enforces: {e}",
                setup.pin_root.display()
            ))
        }
    };
    Status::Off {
        reason: "disabled",
        error,
        detail: Vec::new(),
    }
}

/// The sync timer: a round every `interval`, one at a time, on the blocking
/// pool (a stuck filesystem delays the next round, never piles them up).
fn spawn_sync(
    guard: Arc<Mutex<Guard>>,
    syncer: Arc<Syncer>,
    keeper: Arc<Keeper>,
    interval: Duration,
) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await; // the start-up fill was the first round
        let mut last_errors: Vec<String> = Vec::new();
        let allocs = syncer.allocs().cloned();
        loop {
            // A walked allocation is put in the guard at once, not at the
            // next tick.
            match &allocs {
                Some(a) => {
                    tokio::select! {
                        _ = tick.tick() => {}
                        _ = a.changed() => {}
                    }
                }
                None => {
                    tick.tick().await;
                }
            }
            let (g, s, k) = (guard.clone(), syncer.clone(), keeper.clone());
            let Ok(round) = tokio::task::spawn_blocking(move || {
                // The pins first: a round's roots go into the maps the
                // plugin sees only once the symlinks point at them again.
                let restored = k.check(&g);
                s.timed_round(&g, restored)
            })
            .await
            else {
                continue;
            };
            if round.added + round.changed + round.removed > 0 {
                crate::info!(
                    "quota-escape guard: volume roots synced with the registry",
                    added = round.added,
                    changed = round.changed,
                    removed = round.removed
                );
            }
            if round.errors != last_errors {
                if round.errors.is_empty() {
                    crate::info!("quota-escape guard: sync recovered");
                } else {
                    crate::warn!(
                        "quota-escape guard: sync incomplete (nothing was removed from the guard this round)",
                        err = round.errors.join("; ")
                    );
                }
                last_errors = round.errors;
            }
        }
    });
}

/// Why a guard in force as `in_force` does not enforce, as the label of
/// `prjquota_exporter_guard_not_enforcing_reason`: enforcement's failure
/// (`fallback`, e.g. `verifier`), or detect asked for by hand on a node
/// whose BPF LSM is active (`detect_requested`: it could enforce), or
/// inactive (`lsm_inactive`), or unknown (`lsm_unknown`, `lsm_active`
/// None). The alerts tell "could enforce and does not" from "cannot" by
/// it.
fn detect_reason(
    in_force: GuardMode,
    fallback: Option<&'static str>,
    lsm_active: Option<bool>,
) -> Option<&'static str> {
    if in_force != GuardMode::Detect {
        return None;
    }
    Some(match (fallback, lsm_active) {
        (Some(r), _) => r,
        (None, Some(true)) => "detect_requested",
        (None, Some(false)) => "lsm_inactive",
        (None, None) => "lsm_unknown",
    })
}

/// Whether a [`detect_reason`] label says the node cannot enforce (rather
/// than could and does not).
fn cannot_enforce(reason: &str) -> bool {
    matches!(reason, "lsm_inactive" | "lsm_unknown")
}

/// Whose guard the allocations join (they are written beside the first
/// volumes directory's): this exporter's when it owns that directory's,
/// nobody's when a stronger guard is left pinned there, another
/// exporter's when it holds that directory's owner lock.
fn allocs_owner(volumes_dirs: &[PathBuf], claimed: &owner::Claimed) -> GuardOwner {
    let Some(first) = volumes_dirs.first() else {
        return GuardOwner::None;
    };
    if claimed.dirs.contains(first) {
        return GuardOwner::Mine;
    }
    match claimed.skipped.iter().find(|(d, _)| d == first) {
        Some((_, reason)) if *reason == owner::OWNED_ELSEWHERE => GuardOwner::Elsewhere(
            format!(
                "another prjquota-exporter owns the quota-escape guard of {}, and allocations are accounted by the guard's owner; stop this one's --nomad.alloc-dir, or the other exporter",
                first.display()
            ),
        ),
        _ => GuardOwner::None,
    }
}

fn load(setup: &GuardSetup, opts: &LoadOptions) -> Status {
    let requested = setup.mode;
    let lsm = bpf_lsm_active();
    let lsm_active = lsm.as_ref().ok().map(|(active, _)| *active);
    let (mode, auto_why) = requested.resolve(lsm);
    let claimed = owner::claim(
        &setup.pin_root,
        &setup.volumes_dirs,
        mode,
        setup.replace_stronger,
    );
    if let Some(allocs) = &setup.allocs {
        allocs.set_owner(allocs_owner(&setup.volumes_dirs, &claimed));
    }
    if claimed.dirs.is_empty() {
        if let Some((_, reason)) = claimed.skipped.first() {
            return Status::Off {
                reason,
                error: None,
                detail: claimed.skipped,
            };
        }
    }
    let volumes_dirs = claimed.dirs;
    let syncer = Arc::new(
        Syncer::new(&volumes_dirs, setup.allocs.clone())
            .verifying_every(setup.verify_interval)
            .keeping_ranges(GuardRanges::new(setup.plugin_dir.clone())),
    );
    let mut fill = |g: &mut Guard| {
        // The maps take over from an earlier exporter's at the swap: with
        // the allocations in them, or their owners could move files out
        // between the swap and the next round. However long the first scan
        // takes, the swap waits for it: until then the guard pinned before
        // this start goes on enforcing, with the allocations in it.
        if let Some(allocs) = &setup.allocs {
            let started = std::time::Instant::now();
            while !allocs.wait_settled(ALLOCS_FIRST_SCAN_WAIT) {
                crate::warn!(
                    "quota-escape guard: waiting for the allocations' first scan before taking over from the guard pinned before; that guard enforces meanwhile",
                    waited = format!("{:?}", started.elapsed())
                );
            }
        }
        let round = syncer.round_on(g, true);
        crate::info!(
            "quota-escape guard: volume roots from the registry",
            roots = syncer.stats.roots.load(Ordering::Relaxed),
            retagged = round.retagged
        );
        if !round.errors.is_empty() {
            crate::warn!(
                "quota-escape guard: some volume roots could not be put in the guard at start-up; the sync timer retries",
                err = round.errors.join("; ")
            );
        }
    };
    match Guard::load_pinned(mode, opts, &setup.pin_root, &volumes_dirs, &mut fill) {
        Ok((g, pinned)) => {
            let keeper = Arc::new(Keeper::new(
                &setup.pin_root,
                pinned
                    .as_ref()
                    .ok()
                    .map(|p| (p.dir.clone(), p.links.clone())),
                &volumes_dirs,
                claimed.skipped,
            ));
            let (pinned, removed) = match pinned {
                Ok(p) => {
                    crate::info!(
                        "quota-escape guard pinned: it keeps enforcing while no exporter runs",
                        pin_dir = p.dir.display(),
                        links = p.links.join(",")
                    );
                    if !p.removed.is_empty() {
                        crate::info!(
                            "quota-escape guard: the pins of an earlier start were removed after this one attached",
                            pin_dirs = p
                                .removed
                                .iter()
                                .map(|(d, _)| d.display().to_string())
                                .collect::<Vec<_>>()
                                .join(","),
                            pins = p.removed.iter().map(|(_, n)| n).sum::<usize>()
                        );
                    }
                    (Ok(p.dir), p.removed.len())
                }
                Err(e) => {
                    crate::error!(
                        "quota-escape guard could not be pinned: it stops with this process, and nothing guards the volumes while no exporter runs",
                        pin_root = setup.pin_root.display(),
                        err = e
                    );
                    (Err(e), 0)
                }
            };
            let fallback = g
                .not_enforcing()
                .or(auto_why.as_ref())
                .map(|why| (why.reason(), why.to_string()));
            let reason = detect_reason(g.mode(), fallback.as_ref().map(|f| f.0), lsm_active);
            if let (false, Some(why)) = g.version_detect() {
                crate::warn!(
                    "quota-escape guard: an owner's change of a volume root's generation (FS_IOC_SETVERSION, ext4 without metadata_csum) is not counted here; the sync still re-keys the root within one interval",
                    err = why
                );
            }
            match (&fallback, reason) {
                (Some((reason, why)), _) if requested == GuardMode::Enforce => crate::warn!(
                    "quota-escape guard: enforcement unavailable; with --guard=enforce the exporter does not start",
                    build = g.variant().as_str(),
                    detect = g.detect_hook(),
                    reason = reason,
                    err = why
                ),
                (Some((reason, why)), _) if cannot_enforce(reason) => crate::warn!(
                    "quota-escape guard detects only: this kernel cannot refuse quota escapes (--guard=auto); project-ID changes are counted and logged, not refused",
                    build = g.variant().as_str(),
                    detect = g.detect_hook(),
                    reason = reason,
                    err = why
                ),
                (Some((reason, why)), _) => crate::error!(
                    "quota-escape guard detects only: the BPF LSM is active but the guard's LSM program did not attach, so this node could refuse quota escapes and does not; report the kernel and this error, or run with --guard=enforce to refuse to start instead",
                    build = g.variant().as_str(),
                    detect = g.detect_hook(),
                    reason = reason,
                    err = why
                ),
                (None, Some("detect_requested")) => crate::warn!(
                    "quota-escape guard detects only (--guard=detect) although the BPF LSM is active: this node could refuse quota escapes; drop --guard=detect (the default, auto, enforces here)",
                    build = g.variant().as_str(),
                    detect = g.detect_hook()
                ),
                _ => crate::info!(
                    "quota-escape guard attached",
                    mode = g.mode(),
                    requested = requested,
                    build = g.variant().as_str(),
                    detect = g.detect_hook(),
                    lsm = g.lsm_programs().join(",")
                ),
            }
            Status::Loaded(Loaded {
                mode: g.mode(),
                guard: Arc::new(Mutex::new(g)),
                fallback,
                detect_reason: reason,
                pinned,
                removed,
                syncer,
                keeper,
                _locks: claimed.locks,
            })
        }
        Err(e) => {
            if let Some(allocs) = &setup.allocs {
                allocs.set_owner(GuardOwner::None);
            }
            crate::warn!(
                "quota-escape guard is off: project-ID changes under volume roots are neither counted nor refused",
                requested = requested,
                reason = e.reason(),
                err = e
            );
            Status::Off {
                reason: e.reason(),
                error: Some(e.to_string()),
                detail: Vec::new(),
            }
        }
    }
}

/// Logs each event (privileged changes at info, attempts at warn), at most
/// [`MAX_LOGGED_EVENTS`] per scrape.
fn log_events(scrape: &Scrape, allocs: Option<&[GuardedAlloc]>, events: &[GuardEvent]) {
    if events.is_empty() {
        return;
    }
    let volume_of = scrape.inventory.by_kernel_project();
    let alloc_of = allocs_by_project(allocs.unwrap_or_default());
    for e in events.iter().take(MAX_LOGGED_EVENTS) {
        let key = kernel_dev(e.st_dev).map(|d| (d, e.volume_projid));
        let vol = key
            .and_then(|k| volume_of.get(&k))
            .map(|&i| &scrape.inventory.volumes[i]);
        let (namespace, volume_id) =
            vol.map_or(("-", "-"), |v| (v.namespace.as_str(), v.volume_id.as_str()));
        let alloc_id = key.and_then(|k| alloc_of.get(&k).copied()).unwrap_or("-");
        let errno = match e.errno {
            None => "-".to_string(),
            Some(libc::EPERM) => "EPERM".to_string(),
            Some(libc::EINVAL) => "EINVAL".to_string(),
            Some(libc::EOPNOTSUPP) => "EOPNOTSUPP".to_string(),
            Some(n) => format!("errno {n}"),
        };
        let msg = match (e.privileged, e.result) {
            (true, _) => "project ID changed under a volume root by a privileged process",
            (false, Outcome::Allowed) => {
                "quota escape: a process moved files out of a volume's project quota"
            }
            (false, Outcome::Denied) => "quota escape attempt refused",
        };
        let log = |level| {
            crate::log::emit(
                level,
                msg,
                &[
                    ("namespace", &namespace),
                    ("volume_id", &volume_id),
                    ("alloc_id", &alloc_id),
                    ("what", &e.describe()),
                    ("result", &e.result.label()),
                    ("by", &format!("{:?}", e.source).to_lowercase()),
                    ("comm", &e.comm),
                    ("pid", &e.pid),
                    ("uid", &e.uid),
                    ("cgroup_id", &e.cgroup_id),
                    ("inode", &e.ino),
                    ("err", &errno),
                ],
            )
        };
        if e.privileged {
            if crate::log::enabled(crate::log::Level::Info) {
                log(crate::log::Level::Info);
            }
        } else if crate::log::enabled(crate::log::Level::Warn) {
            log(crate::log::Level::Warn);
        }
    }
    if events.len() > MAX_LOGGED_EVENTS {
        crate::warn!(
            "more quota-escape guard events than logged",
            logged = MAX_LOGGED_EVENTS,
            total = events.len()
        );
    }
}

/// Each accounted allocation by `(device in kernel encoding, project ID)`.
fn allocs_by_project(allocs: &[GuardedAlloc]) -> HashMap<(u64, u32), &str> {
    allocs
        .iter()
        .filter_map(|a| Some(((kernel_dev(a.dev)?, a.project_id), &*a.alloc_id)))
        .collect()
}

/// `nomad_alloc_projid_change_attempts_total{alloc_id, result}`: the
/// volumes' attempts family, for allocations (`--nomad.alloc-dir`).
fn alloc_attempts_family(allocs: &[GuardedAlloc], c: &GuardCounters) -> Family {
    let mut f = Family::counter(
        "nomad_alloc_projid_change_attempts_total",
        "Attempts to move files out of an allocation's project quota (--nomad.alloc-dir), or to give a file outside it that project ID, by processes without CAP_SYS_ADMIN in the initial user namespace, by result: allowed (the change went through) or denied (refused by the guard). Counted in the kernel since the exporter started; an allocation appears once its directory is in the guard.",
    );
    // In alloc_id order, as the scan thread hands them over.
    for a in allocs {
        let Some(o) = kernel_dev(a.dev).and_then(|d| c.projects.get(&(d, a.project_id))) else {
            continue;
        };
        for (result, n) in [(ALLOWED, o.allowed), (DENIED, o.denied)] {
            f.labelled_shared("alloc_id", &a.alloc_id, result, n as f64);
        }
    }
    f
}

fn attempts_family(capacity: usize) -> Family {
    Family::counter(
        "nomad_host_volume_projid_change_attempts_total",
        "Attempts to move files out of the volume's project quota (set another project ID, or clear PROJINHERIT on a directory), or to give a file outside every volume this volume's project ID, by processes without CAP_SYS_ADMIN in the initial user namespace, by result: allowed (the change went through) or denied (refused by the guard with --guard=enforce, or by the kernel). Counted in the kernel since the exporter started.",
    )
    .with_capacity(capacity)
}

fn counter_families(scrape: &Scrape, c: &GuardCounters) -> Vec<Family> {
    let inv = &scrape.inventory;
    let mut attempts = attempts_family(2 * inv.volumes.len());
    // Only volumes whose project is in the guard, each key once: the
    // volume the index keeps for it. Each project placed at its volume,
    // then read in the inventory's order: a lookup per project in the
    // index's table rather than one per volume in the counters' tree too.
    let index = inv.by_kernel_project();
    let mut at: Vec<Option<&Outcomes>> = vec![None; inv.volumes.len()];
    for (key, o) in &c.projects {
        if let Some(&i) = index.get(key) {
            at[i] = Some(o);
        }
    }
    for (i, o) in at.into_iter().enumerate() {
        if let Some(o) = o {
            attempts.volume_with(i, ALLOWED, o.allowed as f64);
            attempts.volume_with(i, DENIED, o.denied as f64);
        }
    }
    let mut unattributed = Family::counter(
        "prjquota_exporter_guard_unattributed_attempts_total",
        "Project-ID changes on a volume filesystem where the guard cannot tell the volume (too deep below the root, or through a file handle with no path: open_by_handle_at), treated as attempts, by result.",
    );
    unattributed.labelled(
        vec![("result", "allowed".into())],
        c.walk_limit.allowed as f64,
    );
    unattributed.labelled(
        vec![("result", "denied".into())],
        c.walk_limit.denied as f64,
    );
    let mut privileged = Family::counter(
        "prjquota_exporter_guard_privileged_changes_total",
        "Project-ID changes under volume roots by processes with CAP_SYS_ADMIN (the plugin, administrators): allowed and logged, not attempts.",
    );
    privileged.plain(c.privileged as f64);
    let mut lost = Family::counter(
        "prjquota_exporter_guard_events_lost_total",
        "Guard events (log lines) lost because the kernel's ring buffer was full; the counters are exact regardless.",
    );
    lost.plain(c.events_lost as f64);
    let mut full = Family::counter(
        "prjquota_exporter_guard_map_full_attempts_total",
        "Attempts on a volume the guard's counters map had no room for (beyond --ebpf.max-volumes): refused or counted all the same, but not per volume.",
    );
    full.plain(c.map_full as f64);
    let mut outside = Family::counter(
        "prjquota_exporter_guard_outside_attempts_total",
        "Attempts outside every volume and allocation root to give a file a volume's or an allocation's project ID, or one in the ranges prjquota.toml gives them (squatting an ID a create would look for), by result: counted here, never against the volume they name.",
    );
    outside.labelled(vec![("result", "allowed".into())], c.outside.allowed as f64);
    outside.labelled(vec![("result", "denied".into())], c.outside.denied as f64);
    let mut out = vec![attempts, unattributed, outside, privileged, lost, full];
    // Absent, never 0, where the kernel does not report it (before 5.12).
    if let Some(missed) = c.missed_runs {
        let mut f = Family::counter(
            "prjquota_exporter_guard_missed_runs_total",
            "Runs of the guard's detecting program the kernel skipped (recursion_misses): each an attribute change neither counted nor logged. A tracing program is not re-entered on a CPU where it already runs; on a preemptible kernel (PREEMPT_LAZY or PREEMPT, as Debian's 7.x) a task preempted inside it makes another task's change on that CPU go unseen. Refusals under enforce do not depend on it.",
        );
        f.plain(missed as f64);
        out.push(f);
    }
    out
}

/// `…_guard_off_reason{reason}`: why the guard is off.
fn off_reason_family(reason: &str) -> Family {
    let mut f = Family::gauge(
        "prjquota_exporter_guard_off_reason",
        "1, labelled with why, while the quota-escape guard is off: disabled (--guard=off), owned_elsewhere (another exporter that runs owns the guard of every volumes directory), stronger_pinned (a pinned guard that enforces was left in place: --guard.replace-stronger), or why its programs did not load (permission, no_btf, bpf_unavailable, function_not_found, verifier, kernel_too_old, attach, other; the exporter logs the details at start-up).",
    );
    f.labelled(vec![("reason", reason.to_string())], 1.0);
    f
}

/// `…_guard_not_enforcing_reason{reason}`: why a loaded guard detects only.
fn not_enforcing_family(reason: &str) -> Family {
    let mut f = Family::gauge(
        "prjquota_exporter_guard_not_enforcing_reason",
        "1, labelled with why, while the quota-escape guard runs in detect mode (counts and logs project-ID changes, refuses none): lsm_inactive (bpf is not in the kernel's lsm= list) or lsm_unknown (/sys/kernel/security/lsm unreadable): this node cannot enforce; detect_requested (--guard=detect on a node whose BPF LSM is active), or why the LSM program did not attach (permission, verifier, function_not_found, kernel_too_old, attach, other): it could and does not.",
    );
    f.labelled(vec![("reason", reason.to_string())], 1.0);
    f
}

fn mode_families(mode: GuardMode) -> Vec<Family> {
    let mut m = Family::gauge(
        "prjquota_exporter_guard_mode",
        "The quota-escape guard's mode in force (1) among off, detect and enforce (--guard=auto, the default, is enforce where the BPF LSM is active, else detect): off when disabled or when it could not load (with --guard=enforce the exporter refuses to start instead).",
    );
    for x in GuardMode::ALL {
        m.labelled(
            vec![("mode", x.label().to_string())],
            if x == mode { 1.0 } else { 0.0 },
        );
    }
    let mut e = Family::gauge(
        "prjquota_exporter_guard_enforcing",
        "Whether the quota-escape guard refuses project-ID changes under volume roots (BPF LSM attached).",
    );
    e.plain(if mode == GuardMode::Enforce { 1.0 } else { 0.0 });
    vec![m, e]
}

/// How the guard is kept: pinned, synced, drift repaired.
fn keeping_families(pinned: bool, removed: usize, syncer: &Syncer, keeper: &Keeper) -> Vec<Family> {
    let s = &syncer.stats;
    let mut p = Family::gauge(
        "prjquota_exporter_guard_pinned",
        "Whether this exporter's quota-escape guard is the one pinned in bpffs for its volumes directories (1), so that it keeps enforcing while no exporter runs; 0: it stops with this process, or its pins were changed and could not be put back (the log says why).",
    );
    p.plain(if pinned && keeper.all_own() { 1.0 } else { 0.0 });
    let mut r = Family::gauge(
        "prjquota_exporter_guard_previous_pins_removed",
        "Pin directories of earlier exporter starts this start removed once its own guard was attached.",
    );
    r.plain(removed as f64);
    let mut roots = Family::gauge(
        "prjquota_exporter_guard_roots",
        "Volume roots the last sync put in the quota-escape guard (creating and ready records whose root exists).",
    );
    roots.plain(s.roots.load(Ordering::Relaxed) as f64);
    let mut rounds = Family::counter(
        "prjquota_exporter_guard_syncs_total",
        "Rounds of the guard's sync timer (--guard.sync-interval), by result: ok, or error (a registry or a root could not be read, or the maps written: nothing was removed from the guard that round; the log says what).",
    );
    let failed = s.failed_rounds.load(Ordering::Relaxed);
    let total = s.rounds.load(Ordering::Relaxed);
    rounds.labelled(
        vec![("result", "ok".into())],
        total.saturating_sub(failed) as f64,
    );
    rounds.labelled(vec![("result", "error".into())], failed as f64);
    let mut drift = Family::counter(
        "prjquota_exporter_guard_drift_total",
        "Volume roots found without their project ID or PROJINHERIT (changed by a process with CAP_SYS_ADMIN, or made by an older plugin) and re-tagged by the sync timer.",
    );
    drift.plain(s.drift.load(Ordering::Relaxed) as f64);
    let mut checks = Family::counter(
        "prjquota_exporter_guard_sync_root_checks_total",
        "Volume roots the guard's sync opened to check their identity, project ID and PROJINHERIT. A round opens every root when a registry, the allocations, the pins or the guard's counters changed, and at least every --guard.verify-interval; else none.",
    );
    checks.plain(s.root_checks.load(Ordering::Relaxed) as f64);
    let mut out = vec![p, r, roots, rounds, drift, checks];
    if let Some(allocs) = syncer.allocs() {
        let mut a = Family::gauge(
            "prjquota_exporter_guard_alloc_roots",
            "Allocation directories (--nomad.alloc-dir) the last sync put in the quota-escape guard: each accounted allocation once its walk is complete.",
        );
        a.plain(allocs.in_guard() as f64);
        out.push(a);
    }
    out.extend(keeper.families());
    out
}

/// Every family this collector can export, as a loaded guard would (with no
/// volumes), so that a host where the guard cannot load can still check what
/// the dashboards read (dashboards/tests/dashboard.rs).
pub fn catalogue() -> Vec<Family> {
    let scrape = Scrape::new(crate::inventory::Inventory::default());
    let mut fams = mode_families(GuardMode::Enforce);
    let counters = GuardCounters {
        missed_runs: Some(0),
        ..GuardCounters::default()
    };
    fams.extend(counter_families(&scrape, &counters));
    fams.push(alloc_attempts_family(&[], &counters));
    let keeper = Keeper::new(Path::new("/"), None, &[PathBuf::from("/")], Vec::new());
    fams.extend(keeping_families(
        true,
        0,
        &Syncer::new(&[], Some(GuardedRoots::new())),
        &keeper,
    ));
    fams.push(off_reason_family("disabled"));
    fams.push(not_enforcing_family("detect_requested"));
    fams
}

impl Collector for GuardCollector {
    fn name(&self) -> &'static str {
        "guard"
    }

    fn collect<'a>(
        &'a self,
        scrape: &'a Scrape,
        out: &'a mut Vec<Family>,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let status = self.status.status().await;
            match &*status {
                Status::Loading => {
                    out.extend(mode_families(GuardMode::Off));
                    out.push(attempts_family(0));
                    Ok(())
                }
                Status::Off { reason, detail, .. } => {
                    out.extend(owner::not_own_family(detail));
                    out.extend(mode_families(GuardMode::Off));
                    // No samples (nothing is counted), but the family is
                    // known: the dashboards' lint reads the catalogue.
                    out.push(attempts_family(0));
                    // A guard that could not load is the degraded mode
                    // --guard=detect asks for (--guard=enforce refuses to
                    // start instead): logged at start-up and said here, as
                    // a detached eBPF collector is, not a failed collector.
                    out.push(off_reason_family(reason));
                    Ok(())
                }
                Status::Loaded(Loaded {
                    guard,
                    mode,
                    detect_reason,
                    pinned,
                    removed,
                    syncer,
                    keeper,
                    ..
                }) => {
                    out.extend(mode_families(*mode));
                    if let Some(reason) = detect_reason {
                        out.push(not_enforcing_family(reason));
                    }
                    out.extend(keeping_families(pinned.is_ok(), *removed, syncer, keeper));
                    self.collect_guard(scrape, guard, syncer.allocs().map(|a| &**a), out)
                        .await
                }
            }
        })
    }

    fn ready(&self) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(self.status.ready())
    }

    fn summary(&self) -> Option<String> {
        Some(match &*self.status.now() {
            Status::Loading => "loading".to_string(),
            Status::Off { reason, .. } => format!("off ({reason})"),
            Status::Loaded(Loaded {
                mode,
                detect_reason: Some(reason),
                ..
            }) => format!("{mode} ({reason})"),
            Status::Loaded(Loaded { mode, .. }) => mode.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::tests::volume;
    use crate::inventory::Inventory;

    fn setup(mode: GuardMode) -> GuardSetup {
        GuardSetup {
            mode,
            volumes_dirs: vec![PathBuf::from("/nonexistent/volumes")],
            pin_root: PathBuf::from("/nonexistent/pins"),
            sync_interval: Duration::from_secs(2),
            verify_interval: Duration::from_secs(60),
            replace_stronger: false,
            allocs: None,
            plugin_dir: None,
        }
    }

    #[test]
    fn counters_become_two_series_per_registered_volume() {
        let mut inv = Inventory::for_tests(vec![
            volume("team-a", "default", 1),
            volume("team-a", "default", 2),
        ]);
        let st_dev = libc::makedev(7, 3);
        for d in &mut inv.dirs {
            d.dev = Some(st_dev);
        }
        let scrape = Scrape::new(inv);
        let mut c = GuardCounters::default();
        let dev = kernel_dev(st_dev).unwrap();
        c.projects.insert(
            (dev, 1),
            prjquota_ebpf::guard::Outcomes {
                allowed: 2,
                denied: 3,
            },
        );
        // Another device's project 2 is not the second volume's.
        c.projects
            .insert((dev + 1, 2), prjquota_ebpf::guard::Outcomes::default());
        c.privileged = 1;
        let mut out = counter_families(&scrape, &c);
        out.extend(mode_families(GuardMode::Detect));
        let text = crate::exposition::encode_all(&out, &scrape.inventory);
        let v1 = &scrape.inventory.volumes[0].volume_id;
        for line in [
            "# TYPE nomad_host_volume_projid_change_attempts_total counter".to_string(),
            format!("nomad_host_volume_projid_change_attempts_total{{namespace=\"team-a\",node_pool=\"default\",volume_id=\"{v1}\",result=\"allowed\"}} 2"),
            format!("nomad_host_volume_projid_change_attempts_total{{namespace=\"team-a\",node_pool=\"default\",volume_id=\"{v1}\",result=\"denied\"}} 3"),
            "prjquota_exporter_guard_privileged_changes_total 1".to_string(),
            "prjquota_exporter_guard_mode{mode=\"detect\"} 1".to_string(),
            "prjquota_exporter_guard_mode{mode=\"enforce\"} 0".to_string(),
            "prjquota_exporter_guard_enforcing 0".to_string(),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        assert_eq!(
            text.matches("nomad_host_volume_projid_change_attempts_total{")
                .count(),
            2,
            "the volume whose project is not in the guard has no series: {text}"
        );
    }

    #[test]
    fn detect_says_whether_the_node_could_enforce() {
        use GuardMode::*;
        assert_eq!(detect_reason(Enforce, None, Some(true)), None);
        assert_eq!(detect_reason(Off, None, Some(true)), None);
        // auto or enforce whose LSM program did not attach: could enforce.
        let r = detect_reason(Detect, Some("verifier"), Some(true)).unwrap();
        assert_eq!((r, cannot_enforce(r)), ("verifier", false));
        // detect by hand where the LSM runs: could enforce.
        let r = detect_reason(Detect, None, Some(true)).unwrap();
        assert_eq!((r, cannot_enforce(r)), ("detect_requested", false));
        // auto where it does not, or detect by hand there: cannot.
        for (fallback, lsm) in [
            (Some("lsm_inactive"), Some(false)),
            (None, Some(false)),
            (Some("lsm_unknown"), None),
            (None, None),
        ] {
            let r = detect_reason(Detect, fallback, lsm).unwrap();
            assert!(cannot_enforce(r), "{fallback:?} {lsm:?}: {r}");
        }
        let text = crate::exposition::encode_all(
            &[not_enforcing_family("lsm_inactive")],
            &Inventory::default(),
        );
        assert!(
            text.contains(
                "prjquota_exporter_guard_not_enforcing_reason{reason=\"lsm_inactive\"} 1\n"
            ),
            "{text}"
        );
    }

    #[tokio::test]
    async fn off_is_a_metric_and_not_a_failure() {
        let c = GuardCollector::start(
            setup(GuardMode::Off),
            Duration::from_secs(1),
            LoadOptions::default(),
        );
        let scrape = Scrape::new(Inventory::for_tests(vec![volume("a", "b", 1)]));
        let mut out = Vec::new();
        c.collect(&scrape, &mut out).await.unwrap();
        let text = crate::exposition::encode_all(&out, &scrape.inventory);
        assert!(
            text.contains("prjquota_exporter_guard_mode{mode=\"off\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("prjquota_exporter_guard_enforcing 0\n"),
            "{text}"
        );
        assert!(!text.contains("nomad_host_volume_projid_change_attempts_total"));
    }

    /// On the development host fexit is refused: the collector reports the
    /// guard off and fails (logged once), every other collector unaffected.
    #[tokio::test]
    async fn a_guard_that_cannot_load_is_off_and_failed() {
        let c = GuardCollector::start(
            setup(GuardMode::Detect),
            Duration::from_secs(30),
            LoadOptions::default(),
        );
        // Parsing the kernel's BTF takes a while in a debug build.
        let _ = c.ready().await;
        let scrape = Scrape::new(Inventory::for_tests(vec![]));
        let mut out = Vec::new();
        let r = c.collect(&scrape, &mut out).await;
        let text = crate::exposition::encode_all(&out, &scrape.inventory);
        match r {
            Err(e) => {
                assert!(e.to_string().contains("did not load"), "{e}");
                assert!(
                    text.contains("prjquota_exporter_guard_mode{mode=\"off\"} 1\n"),
                    "{text}"
                );
            }
            Ok(()) => eprintln!("the guard loads here:\n{text}"),
        }
    }
}
