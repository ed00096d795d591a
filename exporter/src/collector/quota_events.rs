//! The quota_events collector: counts the kernel's quota warnings per volume.
//!
//! XFS reports an exhausted project quota to the writer as ENOSPC, the same
//! errno as a full disk; the kernel's quota netlink warnings (family
//! `VFS_DQUOT`) name the project and the limit, so they are how a full
//! volume is told from a full filesystem. A background thread reads the
//! socket and counts warnings per (device, project ID, resource, limit); at
//! scrape time the counts are attributed to volumes through the inventory
//! (device of the volumes directory, project ID of the record).
//!
//! Without the netlink interface (kernel built without
//! CONFIG_QUOTA_NETLINK_INTERFACE, no permission) the collector reports
//! `prjquota_exporter_quota_events_subscribed 0` and fails, logged once;
//! nothing else is affected.

use foldhash::{HashMap, HashMapExt};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::anyhow;

use super::{BoxFuture, Collector, Scrape};
use crate::exposition::{Extra, Family};
use crate::genetlink::{Hit, QuotaSocket, Warning, PRJQUOTA};

/// Label sets of `nomad_host_volume_quota_limit_hits_total`, indexed by
/// [`slot`].
const HITS: [Extra; 4] = [
    &[("resource", "bytes"), ("limit", "hard")],
    &[("resource", "bytes"), ("limit", "soft")],
    &[("resource", "inodes"), ("limit", "hard")],
    &[("resource", "inodes"), ("limit", "soft")],
];

fn slot(hit: Hit) -> usize {
    match hit {
        Hit::BytesHard => 0,
        Hit::BytesSoft => 1,
        Hit::InodesHard => 2,
        Hit::InodesSoft => 3,
    }
}

/// Counts of a (device, project) that no volume has claimed for this long
/// are dropped (the volume was deleted, or the project is not prjquota's).
const UNMATCHED_TTL: Duration = Duration::from_secs(600);
/// Bound on distinct (device, project) pairs held.
const MAX_KEYS: usize = 65_536;

#[derive(Debug, Default)]
struct Counts {
    /// The volume these counts were attributed to: a project ID reused by a
    /// new volume starts from zero.
    volume_id: Option<String>,
    hits: [u64; 4],
    unmatched_since: Option<Instant>,
}

#[derive(Debug, Default)]
pub struct State {
    subscribed: AtomicBool,
    failure: Mutex<Option<String>>,
    counts: Mutex<HashMap<(u64, u32), Counts>>,
    received: AtomicU64,
    unmatched: AtomicU64,
    dropped: AtomicU64,
}

impl State {
    /// Counts one warning from the kernel.
    pub fn record(&self, w: &Warning) {
        if w.qtype != PRJQUOTA {
            return;
        }
        let Some(hit) = w.hit() else { return };
        let Ok(project) = u32::try_from(w.id) else {
            return;
        };
        self.received.fetch_add(1, Ordering::Relaxed);
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let key = (w.dev(), project);
        if counts.len() >= MAX_KEYS && !counts.contains_key(&key) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        counts.entry(key).or_default().hits[slot(hit)] += 1;
    }
}

pub struct QuotaEvents {
    state: Arc<State>,
}

impl QuotaEvents {
    /// Subscribes now (so the first scrape knows whether it worked) and
    /// reads the socket on a thread of its own.
    pub fn start() -> QuotaEvents {
        let state = Arc::new(State::default());
        match QuotaSocket::subscribe() {
            Ok(sock) => {
                crate::info!(
                    "listening for kernel quota warnings",
                    family = sock.family,
                    group = sock.group
                );
                state.subscribed.store(true, Ordering::Relaxed);
                let st = state.clone();
                let spawned = std::thread::Builder::new()
                    .name("quota-netlink".into())
                    .stack_size(256 * 1024)
                    .spawn(move || listen(sock, st));
                if let Err(e) = spawned {
                    Self::fail(
                        &state,
                        format!("cannot start the netlink reader thread: {e}"),
                    );
                }
            }
            Err(e) => {
                let why = match e.raw_os_error() {
                    Some(libc::ENOENT) => format!(
                        "the kernel has no quota netlink interface (generic netlink family VFS_DQUOT is not registered: CONFIG_QUOTA_NETLINK_INTERFACE is off): {e}"
                    ),
                    _ => format!("cannot subscribe to kernel quota warnings (VFS_DQUOT/events): {e}"),
                };
                Self::fail(&state, why);
            }
        }
        QuotaEvents { state }
    }

    /// Not subscribed, for `reason`.
    pub fn disabled(reason: &str) -> QuotaEvents {
        let state = Arc::new(State::default());
        *state.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason.to_string());
        QuotaEvents { state }
    }

    /// Counting, without a socket (tests feed [`State::record`]).
    pub fn detached() -> QuotaEvents {
        let state = Arc::new(State::default());
        state.subscribed.store(true, Ordering::Relaxed);
        QuotaEvents { state }
    }

    pub fn state(&self) -> Arc<State> {
        self.state.clone()
    }

    fn fail(state: &State, why: String) {
        crate::warn!("quota limit hits will not be reported", err = why);
        state.subscribed.store(false, Ordering::Relaxed);
        *state.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
    }
}

fn listen(sock: QuotaSocket, state: Arc<State>) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut failures = 0u32;
    loop {
        match sock.recv(&mut buf) {
            Ok(n) => {
                failures = 0;
                for w in crate::genetlink::parse_warnings(&buf[..n], sock.family) {
                    crate::debug!(
                        "quota warning",
                        qtype = w.qtype,
                        project_id = w.id,
                        warning = w.warning,
                        dev = format!("{}:{}", w.dev_major, w.dev_minor),
                        uid = w.caused_by
                    );
                    state.record(&w);
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                // The kernel dropped warnings: we fell behind a burst.
                let before = state.dropped.fetch_add(1, Ordering::Relaxed);
                if before == 0 {
                    crate::warn!("quota warnings were lost: the netlink socket buffer overflowed (counted in prjquota_exporter_quota_events_dropped_total)");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                failures += 1;
                if failures == 1 {
                    crate::warn!("reading quota warnings failed", err = e);
                }
                if failures >= 100 {
                    QuotaEvents::fail(&state, format!("reading quota warnings keeps failing: {e}"));
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

impl Collector for QuotaEvents {
    fn name(&self) -> &'static str {
        "quota_events"
    }

    fn collect<'a>(
        &'a self,
        scrape: &'a Scrape,
        out: &'a mut Vec<Family>,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let st = &self.state;
            let subscribed = st.subscribed.load(Ordering::Relaxed);
            let mut fams = Vec::new();
            if subscribed {
                fams.push(self.hits(scrape, Instant::now()));
            }
            let mut sub = Family::gauge(
                "prjquota_exporter_quota_events_subscribed",
                "Whether the exporter receives the kernel's quota netlink warnings (VFS_DQUOT); 0 means nomad_host_volume_quota_limit_hits_total is not reported.",
            );
            sub.plain(if subscribed { 1.0 } else { 0.0 });
            fams.push(sub);
            for (name, help, v) in [
                (
                    "prjquota_exporter_quota_events_total",
                    "Project quota limit warnings received from the kernel.",
                    &st.received,
                ),
                (
                    "prjquota_exporter_quota_events_unmatched_total",
                    "Project quota limit warnings that matched no volume (a deleted volume, or a project prjquota does not manage); counted when dropped, 10 minutes after arrival.",
                    &st.unmatched,
                ),
                (
                    "prjquota_exporter_quota_events_dropped_total",
                    "Times quota warnings were lost: the netlink socket overflowed, or too many distinct projects were pending.",
                    &st.dropped,
                ),
            ] {
                let mut f = Family::counter(name, help);
                f.plain(v.load(Ordering::Relaxed) as f64);
                fams.push(f);
            }
            out.extend(fams);
            if subscribed {
                Ok(())
            } else {
                let why = st.failure.lock().unwrap_or_else(|e| e.into_inner()).clone();
                Err(anyhow!(why.unwrap_or_else(|| "not subscribed".into())))
            }
        })
    }
}

impl QuotaEvents {
    /// Attributes the counts to the inventory's volumes and renders them.
    fn hits(&self, scrape: &Scrape, now: Instant) -> Family {
        let inv = &scrape.inventory;
        let mut per_volume: Vec<[u64; 4]> = vec![[0; 4]; inv.volumes.len()];
        {
            let mut counts = self.state.counts.lock().unwrap_or_else(|e| e.into_inner());
            // Only projects the kernel warned about: none on a quiet node,
            // where no scrape should pay a map of every volume.
            let mut by_key: HashMap<(u64, u32), usize> = HashMap::new();
            if !counts.is_empty() {
                by_key.reserve(inv.volumes.len());
                for (i, v) in inv.volumes.iter().enumerate() {
                    if let Some(dev) = inv.dirs.get(v.dir).and_then(|d| d.dev) {
                        by_key.insert((dev, v.project_id), i);
                    }
                }
            }
            counts.retain(|key, c| match by_key.get(key) {
                Some(&i) => {
                    let id = &inv.volumes[i].volume_id;
                    if c.volume_id.as_ref().is_some_and(|old| old != id) {
                        // The project ID now belongs to another volume: the
                        // old counts were the deleted volume's.
                        c.hits = [0; 4];
                    }
                    c.volume_id = Some(id.clone());
                    c.unmatched_since = None;
                    per_volume[i] = c.hits;
                    true
                }
                None => {
                    let since = *c.unmatched_since.get_or_insert(now);
                    if now.duration_since(since) >= UNMATCHED_TTL {
                        // Never attributed: unmatched. Attributed before: the
                        // volume is gone, and its series with it.
                        if c.volume_id.is_none() {
                            let n: u64 = c.hits.iter().sum();
                            self.state.unmatched.fetch_add(n, Ordering::Relaxed);
                        }
                        false
                    } else {
                        true
                    }
                }
            });
        }
        let mut f = Family::counter(
            "nomad_host_volume_quota_limit_hits_total",
            "Quota limit warnings the kernel sent for the volume's project (quota netlink), by resource (bytes, inodes) and limit (hard: an allocation was refused; soft: the soft limit was crossed or its grace period expired). XFS reports a full project to writers as ENOSPC; this is how a full volume is told from a full disk. Counted since the exporter started.",
        )
        .with_capacity(inv.volumes.len());
        for (i, hits) in per_volume.iter().enumerate() {
            // Hard byte hits always appear (at 0) so rate() and increase()
            // work from the first hit; the others once they happen.
            for (s, &n) in hits.iter().enumerate() {
                if s == 0 || n > 0 {
                    f.volume_with(i, HITS[s], n as f64);
                }
            }
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::genetlink::{QUOTA_NL_BHARDBELOW, QUOTA_NL_BHARDWARN, QUOTA_NL_ISOFTWARN};
    use crate::inventory::tests::volume;
    use crate::inventory::Inventory;

    fn warning(project: u64, warning: u32) -> Warning {
        Warning {
            qtype: PRJQUOTA,
            id: project,
            warning,
            dev_major: 8,
            dev_minor: 16, // Inventory::for_tests's device
            caused_by: 1000,
        }
    }

    #[tokio::test]
    async fn warnings_become_per_volume_counters() {
        let ev = QuotaEvents::detached();
        let st = ev.state();
        st.record(&warning(2, QUOTA_NL_BHARDWARN));
        st.record(&warning(2, QUOTA_NL_BHARDWARN));
        st.record(&warning(2, QUOTA_NL_ISOFTWARN));
        st.record(&warning(2, QUOTA_NL_BHARDBELOW)); // ignored
        st.record(&Warning {
            qtype: 0,
            ..warning(2, QUOTA_NL_BHARDWARN)
        }); // user quota
        st.record(&warning(99, QUOTA_NL_BHARDWARN)); // no such volume
        let scrape = Scrape::new(Inventory::for_tests(vec![
            volume("default", "default", 1),
            volume("default", "default", 2),
        ]));
        let mut out = Vec::new();
        ev.collect(&scrape, &mut out).await.unwrap();
        let text = crate::exposition::encode_all(&out, &scrape.inventory);
        let (v1, v2) = (
            &scrape.inventory.volumes[0].volume_id,
            &scrape.inventory.volumes[1].volume_id,
        );
        for line in [
            "# TYPE nomad_host_volume_quota_limit_hits_total counter".to_string(),
            format!("nomad_host_volume_quota_limit_hits_total{{namespace=\"default\",node_pool=\"default\",volume_id=\"{v1}\",resource=\"bytes\",limit=\"hard\"}} 0"),
            format!("nomad_host_volume_quota_limit_hits_total{{namespace=\"default\",node_pool=\"default\",volume_id=\"{v2}\",resource=\"bytes\",limit=\"hard\"}} 2"),
            format!("nomad_host_volume_quota_limit_hits_total{{namespace=\"default\",node_pool=\"default\",volume_id=\"{v2}\",resource=\"inodes\",limit=\"soft\"}} 1"),
            "prjquota_exporter_quota_events_subscribed 1".to_string(),
            "prjquota_exporter_quota_events_total 4".to_string(),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        assert_eq!(
            text.matches("nomad_host_volume_quota_limit_hits_total{")
                .count(),
            3
        );
    }

    #[test]
    fn unmatched_counts_expire_and_reused_ids_start_from_zero() {
        let ev = QuotaEvents::detached();
        let st = ev.state();
        st.record(&warning(7, QUOTA_NL_BHARDWARN));
        let empty = Scrape::new(Inventory::for_tests(vec![]));
        let t0 = Instant::now();
        ev.hits(&empty, t0);
        assert_eq!(
            st.counts.lock().unwrap().len(),
            1,
            "kept during the grace period"
        );
        ev.hits(&empty, t0 + UNMATCHED_TTL);
        assert!(st.counts.lock().unwrap().is_empty());
        assert_eq!(st.unmatched.load(Ordering::Relaxed), 1);

        st.record(&warning(7, QUOTA_NL_BHARDWARN));
        let a = Scrape::new(Inventory::for_tests(vec![volume("a", "p", 7)]));
        ev.hits(&a, t0);
        let mut other = volume("a", "p", 7);
        other.volume_id = "ffffffff-0000-4000-8000-000000000007".into();
        let b = Scrape::new(Inventory::for_tests(vec![other]));
        let f = ev.hits(&b, t0);
        assert_eq!(
            f.samples[0].value, 0.0,
            "project 7 now belongs to another volume"
        );
    }

    #[tokio::test]
    async fn not_subscribed_is_a_metric_and_a_failure() {
        let ev = QuotaEvents::disabled("no netlink here");
        let scrape = Scrape::new(Inventory::for_tests(vec![volume("a", "b", 1)]));
        let mut out = Vec::new();
        let err = ev.collect(&scrape, &mut out).await.unwrap_err();
        assert_eq!(err.to_string(), "no netlink here");
        let text = crate::exposition::encode_all(&out, &scrape.inventory);
        assert!(text.contains("prjquota_exporter_quota_events_subscribed 0\n"));
        assert!(!text.contains("# TYPE nomad_host_volume_quota_limit_hits_total"));
    }
}
