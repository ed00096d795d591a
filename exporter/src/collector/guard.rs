//! The guard collector: attempts to move files out of a volume's project,
//! counted (and with `--guard=enforce` refused) in the kernel by
//! `prjquota_ebpf::guard`.
//!
//! A project quota only holds while the volume's files stay in its project;
//! a file's owner, or root in a container without CAP_SYS_ADMIN, can give a
//! file another project ID (or clear PROJINHERIT on a directory) and stop
//! paying for it. `--guard` says what the exporter does about it:
//!
//! - `detect` (default): count attempts per volume by outcome,
//!   `nomad_host_volume_projid_change_attempts_total{result="allowed|denied"}`,
//!   and log each one (process name, pid, uid, cgroup ID);
//! - `enforce`: also refuse them with EPERM through a BPF LSM program. When
//!   the BPF LSM is not active (or the program cannot attach) the guard
//!   falls back to detect, logs why once, and reports
//!   `prjquota_exporter_guard_enforcing 0` with
//!   `prjquota_exporter_guard_fallback{reason}`;
//! - `off`: load nothing.
//!
//! `prjquota_exporter_guard_mode{mode}` has one series per mode, 1 for the
//! mode in force (`off` when loading failed). Who may change a project ID
//! without being counted: callers with CAP_SYS_ADMIN in the initial user
//! namespace (the plugin, administrators); their changes are logged at info
//! and counted in `prjquota_exporter_guard_privileged_changes_total`.
//!
//! Each scrape syncs the guard's map of volume roots with the inventory,
//! like the ebpf collector: each root is `lstat`ed (on the blocking pool,
//! one call per volumes directory at a time, with the statfs timeout), each
//! volume ID keeps one index from first sight, and the map is rewritten only
//! when something changed (root identity, index or project ID).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::anyhow;
use prjquota_ebpf::guard::{Guard, GuardCounters, GuardEvent, GuardMode, Outcome};
use prjquota_ebpf::LoadOptions;
use tokio::sync::watch;

use super::{kernel_maps, BoxFuture, Collector, Scrape};
use crate::metrics::{Extra, Family};

/// How long a scrape waits for the start-up load at most.
const LOAD_WAIT: Duration = Duration::from_secs(2);
/// Events logged one by one per scrape; the rest are summed up in one line.
const MAX_LOGGED_EVENTS: usize = 50;

const ALLOWED: Extra = &[("result", "allowed")];
const DENIED: Extra = &[("result", "denied")];

/// Where the guard stands.
enum Status {
    Loading,
    /// Nothing loaded: `--guard=off` (`error` None) or loading failed.
    Off {
        reason: &'static str,
        error: Option<String>,
    },
    Loaded {
        guard: Arc<Mutex<Guard>>,
        mode: GuardMode,
        /// Enforcement asked for and not in force: (label, words).
        fallback: Option<(&'static str, String)>,
    },
}

/// The guard's slots: `(st_dev, st_ino, index, project ID)` per root.
type Roots = kernel_maps::Roots<(u64, u64, u32, u32)>;

fn new_roots() -> Roots {
    Roots::new(|s, (dev, ino)| (dev, ino, s.index, s.project_id))
}

pub struct GuardCollector {
    status: watch::Receiver<Arc<Status>>,
    timeout: Duration,
    roots: Arc<Mutex<Roots>>,
}

impl GuardCollector {
    /// Starts loading the guard on the blocking pool (nothing for
    /// [`GuardMode::Off`]).
    pub fn start(mode: GuardMode, timeout: Duration, opts: LoadOptions) -> GuardCollector {
        let initial = if mode == GuardMode::Off {
            crate::info!("quota-escape guard disabled (--guard=off)");
            Status::Off {
                reason: "disabled",
                error: None,
            }
        } else {
            Status::Loading
        };
        let (tx, rx) = watch::channel(Arc::new(initial));
        if mode != GuardMode::Off {
            kernel_maps::spawn_load(move || {
                let _ = tx.send(Arc::new(load(mode, &opts)));
            });
        }
        GuardCollector {
            status: rx,
            timeout,
            roots: Arc::new(Mutex::new(new_roots())),
        }
    }

    /// A handle that waits for start-up loading to finish.
    pub fn ready(&self) -> GuardReady {
        GuardReady(self.status.clone())
    }

    /// Brings the guard's roots map up to this scrape's inventory; returns
    /// each volume's index (`None`: not registered) and the errors met.
    async fn sync_roots(
        &self,
        scrape: &Scrape,
        guard: &Arc<Mutex<Guard>>,
    ) -> (Vec<Option<u32>>, Vec<String>) {
        kernel_maps::sync_roots(
            &self.roots,
            scrape,
            guard,
            "quota-escape guard",
            Guard::set_roots,
        )
        .await
    }

    async fn collect_guard(
        &self,
        scrape: &Scrape,
        guard: &Arc<Mutex<Guard>>,
        out: &mut Vec<Family>,
    ) -> anyhow::Result<()> {
        let (index_of, mut errors) = self.sync_roots(scrape, guard).await;
        // On this task, as the write telemetry's reads (`super::ebpf`).
        let (counters, events) = {
            let mut g = guard.lock().unwrap_or_else(|e| e.into_inner());
            let events = g.drain_events();
            (g.read(), events)
        };
        log_events(scrape, &index_of, &events);
        match counters {
            Ok(c) => out.extend(counter_families(scrape, &index_of, &c)),
            Err(e) => errors.push(format!("reading the guard's counters: {e}")),
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(anyhow!(errors.join("; ")))
        }
    }
}

/// Waits for the guard's start-up load.
#[derive(Clone)]
pub struct GuardReady(watch::Receiver<Arc<Status>>);

impl GuardReady {
    /// `Ok` once the guard runs in the mode asked for (or is off as asked);
    /// `Err` with the reason when it could not load, or runs as detect
    /// although enforcement was asked for.
    pub async fn wait(mut self) -> Result<(), String> {
        let status = match self.0.wait_for(|s| !matches!(**s, Status::Loading)).await {
            Ok(s) => s.clone(),
            Err(_) => return Err("the guard loader stopped without a result".into()),
        };
        match &*status {
            Status::Off { error: Some(e), .. } => Err(e.clone()),
            Status::Loaded {
                fallback: Some((_, why)),
                ..
            } => Err(why.clone()),
            _ => Ok(()),
        }
    }
}

fn load(mode: GuardMode, opts: &LoadOptions) -> Status {
    match Guard::load_with(mode, opts) {
        Ok(g) => {
            let fallback = g.not_enforcing().map(|why| (why.reason(), why.to_string()));
            match &fallback {
                Some((reason, why)) => crate::warn!(
                    "quota-escape guard: enforcement unavailable, detecting only: project-ID changes under volume roots are counted, not refused",
                    reason = reason,
                    err = why
                ),
                None => crate::info!(
                    "quota-escape guard attached",
                    mode = g.mode(),
                    lsm = g.lsm_programs().join(",")
                ),
            }
            Status::Loaded {
                mode: g.mode(),
                guard: Arc::new(Mutex::new(g)),
                fallback,
            }
        }
        Err(e) => {
            crate::warn!(
                "quota-escape guard is off: project-ID changes under volume roots are neither counted nor refused",
                requested = mode,
                reason = e.reason(),
                err = e
            );
            Status::Off {
                reason: e.reason(),
                error: Some(e.to_string()),
            }
        }
    }
}

/// Logs each event (privileged changes at info, attempts at warn), at most
/// [`MAX_LOGGED_EVENTS`] per scrape.
fn log_events(scrape: &Scrape, index_of: &[Option<u32>], events: &[GuardEvent]) {
    if events.is_empty() {
        return;
    }
    let volume_of: HashMap<u32, usize> = index_of
        .iter()
        .enumerate()
        .filter_map(|(i, idx)| idx.map(|x| (x, i)))
        .collect();
    for e in events.iter().take(MAX_LOGGED_EVENTS) {
        let vol = e
            .index
            .and_then(|x| volume_of.get(&x))
            .map(|&i| &scrape.inventory.volumes[i]);
        let (namespace, volume_id) =
            vol.map_or(("-", "-"), |v| (v.namespace.as_str(), v.volume_id.as_str()));
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

fn attempts_family(capacity: usize) -> Family {
    Family::counter(
        "nomad_host_volume_projid_change_attempts_total",
        "Attempts to move files out of the volume's project quota (set another project ID, or clear PROJINHERIT on a directory) by processes without CAP_SYS_ADMIN in the initial user namespace, by result: allowed (the change went through: those files no longer count against the volume) or denied (refused by the guard with --guard=enforce, or by the kernel). Counted in the kernel since the exporter started.",
    )
    .with_capacity(capacity)
}

fn counter_families(scrape: &Scrape, index_of: &[Option<u32>], c: &GuardCounters) -> Vec<Family> {
    let inv = &scrape.inventory;
    let mut attempts = attempts_family(2 * inv.volumes.len());
    for (i, idx) in index_of.iter().enumerate() {
        // Only volumes whose root is registered (known identity).
        let Some(o) = idx.and_then(|x| c.volumes.get(&x)) else {
            continue;
        };
        attempts.volume_with(i, ALLOWED, o.allowed as f64);
        attempts.volume_with(i, DENIED, o.denied as f64);
    }
    let mut unattributed = Family::counter(
        "prjquota_exporter_guard_unattributed_attempts_total",
        "Project-ID changes on a volume filesystem too deep below its root for the guard to tell the volume (treated as attempts), by result.",
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
    vec![attempts, unattributed, privileged, lost, full]
}

/// `…_guard_off_reason{reason}`: why the guard is off.
fn off_reason_family(reason: &str) -> Family {
    let mut f = Family::gauge(
        "prjquota_exporter_guard_off_reason",
        "1, labelled with why, while the quota-escape guard is off: disabled (--guard=off), or why its programs did not load (permission, no_btf, bpf_unavailable, function_not_found, verifier, kernel_too_old, attach, other; the exporter logs the details at start-up).",
    );
    f.labelled(vec![("reason", reason.to_string())], 1.0);
    f
}

fn mode_families(mode: GuardMode, fallback: Option<&'static str>) -> Vec<Family> {
    let mut m = Family::gauge(
        "prjquota_exporter_guard_mode",
        "The quota-escape guard's mode in force (1) among off, detect and enforce: off when disabled or when it could not load, detect when enforcement was asked for without an active BPF LSM.",
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
    let mut out = vec![m, e];
    if let Some(reason) = fallback {
        let mut f = Family::gauge(
            "prjquota_exporter_guard_fallback",
            "Present while --guard=enforce runs as detect, with the reason (lsm_inactive: the BPF LSM is not in the kernel's lsm= list; lsm_unknown: securityfs unreadable; else why the LSM program failed).",
        );
        f.labelled(vec![("reason", reason.to_string())], 1.0);
        out.push(f);
    }
    out
}

/// Every family this collector can export, as a loaded guard would (with no
/// volumes), so that a host where the guard cannot load can still check what
/// the dashboards read (dashboards/tests/dashboard.rs).
pub fn catalogue() -> Vec<Family> {
    let scrape = Scrape::new(crate::inventory::Inventory::default());
    let mut fams = mode_families(GuardMode::Enforce, Some("lsm_inactive"));
    fams.extend(counter_families(&scrape, &[], &GuardCounters::default()));
    fams.push(off_reason_family("disabled"));
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
            let status = super::load_status(&self.status, self.timeout.min(LOAD_WAIT), |s| {
                matches!(s, Status::Loading)
            })
            .await;
            match &*status {
                Status::Loading => {
                    out.extend(mode_families(GuardMode::Off, None));
                    out.push(attempts_family(0));
                    Ok(())
                }
                Status::Off { reason, .. } => {
                    out.extend(mode_families(GuardMode::Off, None));
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
                Status::Loaded {
                    guard,
                    mode,
                    fallback,
                } => {
                    out.extend(mode_families(*mode, fallback.as_ref().map(|f| f.0)));
                    self.collect_guard(scrape, guard, out).await
                }
            }
        })
    }

    fn register<'a>(&'a self, scrape: &'a Scrape) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let status = self.status.borrow().clone();
            let Status::Loaded { guard, .. } = &*status else {
                // Loading or off: nothing to register (the warm-up does it).
                return Ok(());
            };
            let (_, errors) = self.sync_roots(scrape, guard).await;
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
    use crate::inventory::tests::volume;
    use crate::inventory::Inventory;

    #[test]
    fn roots_keep_their_index_and_follow_project_ids() {
        let mut r = new_roots();
        let inv = Inventory::for_tests(vec![volume("a", "p", 7), volume("a", "p", 8)]);
        let scrape = Scrape::new(inv);
        let roots = r.update(&scrape, &[Some(Ok((1, 100))), Some(Err(()))]);
        assert_eq!(roots, [(1, 100, 0, 7)]);
        // The second volume's root appears; the first keeps index 0.
        let roots = r.update(&scrape, &[None, Some(Ok((1, 101)))]);
        assert_eq!(roots, [(1, 100, 0, 7), (1, 101, 1, 8)]);
        // The first volume goes; a new one gets a new index.
        let scrape = Scrape::new(Inventory::for_tests(vec![
            volume("a", "p", 8),
            volume("a", "p", 9),
        ]));
        let roots = r.update(&scrape, &[Some(Ok((1, 101))), Some(Ok((1, 102)))]);
        assert_eq!(roots, [(1, 101, 1, 8), (1, 102, 2, 9)]);
    }

    #[test]
    fn counters_become_two_series_per_registered_volume() {
        let scrape = Scrape::new(Inventory::for_tests(vec![
            volume("team-a", "default", 1),
            volume("team-a", "default", 2),
        ]));
        let mut c = GuardCounters::default();
        c.volumes.insert(
            4,
            prjquota_ebpf::guard::Outcomes {
                allowed: 2,
                denied: 3,
            },
        );
        c.privileged = 1;
        let mut out = counter_families(&scrape, &[Some(4), None], &c);
        out.extend(mode_families(GuardMode::Detect, Some("lsm_inactive")));
        let text = crate::metrics::encode_all(&out, &scrape.inventory);
        let v1 = &scrape.inventory.volumes[0].volume_id;
        for line in [
            "# TYPE nomad_host_volume_projid_change_attempts_total counter".to_string(),
            format!("nomad_host_volume_projid_change_attempts_total{{namespace=\"team-a\",node_pool=\"default\",volume_id=\"{v1}\",result=\"allowed\"}} 2"),
            format!("nomad_host_volume_projid_change_attempts_total{{namespace=\"team-a\",node_pool=\"default\",volume_id=\"{v1}\",result=\"denied\"}} 3"),
            "prjquota_exporter_guard_privileged_changes_total 1".to_string(),
            "prjquota_exporter_guard_mode{mode=\"detect\"} 1".to_string(),
            "prjquota_exporter_guard_mode{mode=\"enforce\"} 0".to_string(),
            "prjquota_exporter_guard_enforcing 0".to_string(),
            "prjquota_exporter_guard_fallback{reason=\"lsm_inactive\"} 1".to_string(),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        assert_eq!(
            text.matches("nomad_host_volume_projid_change_attempts_total{")
                .count(),
            2,
            "the unregistered volume has no series: {text}"
        );
    }

    #[tokio::test]
    async fn off_is_a_metric_and_not_a_failure() {
        let c = GuardCollector::start(
            GuardMode::Off,
            Duration::from_secs(1),
            LoadOptions::default(),
        );
        let scrape = Scrape::new(Inventory::for_tests(vec![volume("a", "b", 1)]));
        let mut out = Vec::new();
        c.collect(&scrape, &mut out).await.unwrap();
        let text = crate::metrics::encode_all(&out, &scrape.inventory);
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
            GuardMode::Detect,
            Duration::from_secs(30),
            LoadOptions::default(),
        );
        // Parsing the kernel's BTF takes a while in a debug build.
        let mut rx = c.status.clone();
        let _ = rx.wait_for(|s| !matches!(**s, Status::Loading)).await;
        let scrape = Scrape::new(Inventory::for_tests(vec![]));
        let mut out = Vec::new();
        let r = c.collect(&scrape, &mut out).await;
        let text = crate::metrics::encode_all(&out, &scrape.inventory);
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
