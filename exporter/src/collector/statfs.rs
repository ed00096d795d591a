//! The statfs collector: capacity, free space and inodes of every volume,
//! with kubelet's volume-stats semantics, from numbers the scrape already
//! has: the project's quota (one pass per filesystem, [`Scrape::quota`])
//! and one statfs per volumes directory ([`Scrape::dir_stats`]). Nothing
//! is asked per volume.
//!
//! What statfs of a volume root would say, the kernels differ on. XFS and
//! ext4 both report the smaller of the project's block limit and the
//! filesystem's size as `f_blocks`. ext4 then reports the limit less the
//! project's usage as free, however little the filesystem has left; XFS
//! did the same until "xfs: don't over-report free space or inodes in
//! statvfs" (backported to stable kernels), and since takes the smaller of
//! that and the filesystem's free space, which makes `f_blocks - f_bfree`
//! more than the project uses when the filesystem is nearly full. The
//! derivation ([`derive`]) is the same on every kernel: the usage is the
//! project's, and what is available is what a writer can really still put
//! in the volume, the smaller of the two.
//!
//! The inode numbers need care: with no inode limit, statfs reports the
//! whole filesystem's inodes, which would charge every volume with every
//! other volume's files. So `inodes_used` is the project's own inode count,
//! and `inodes`/`inodes_free` come from the project's inode hard limit when
//! one is set, from the filesystem's otherwise.
//!
//! Where quotas cannot be read (quota not enabled, no privilege), each
//! volume root is statfs'ed as before: one pass per volumes directory at a
//! time, on two threads from [`SPLIT_FROM`] volumes. If no statfs on a
//! directory completes within `--collector.mount-timeout`, the directory is
//! stuck: the volumes not yet answered report
//! `nomad_host_volume_stats_error{reason="timeout"}`, and the directory is
//! not queried again until the blocked call returns (node_exporter's
//! stuckMounts). A stuck volumes directory's own statfs does the same for
//! all its volumes.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::anyhow;
use prjquota_core::quota::ProjectQuota;

use super::dir_stat::{statvfs, FsStat, StatFn, Unanswered};
use super::{BoxFuture, Collector, Scrape};
use crate::blocking::InFlight;
use crate::exposition::{Extra, Family};
use crate::inventory::Volume;

/// One root's statfs: its numbers or errno, `None` while unanswered.
type Answer = Option<Result<FsStat, i32>>;

/// Bounded reasons of `nomad_host_volume_stats_error`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    Timeout,
    NotFound,
    Permission,
    Other,
}

impl Reason {
    pub fn from_errno(errno: i32) -> Reason {
        match errno {
            libc::ENOENT | libc::ENOTDIR => Reason::NotFound,
            libc::EACCES | libc::EPERM => Reason::Permission,
            _ => Reason::Other,
        }
    }

    fn labels(self) -> Extra {
        match self {
            Reason::Timeout => &[("reason", "timeout")],
            Reason::NotFound => &[("reason", "not_found")],
            Reason::Permission => &[("reason", "permission")],
            Reason::Other => &[("reason", "other")],
        }
    }
}

/// One volume's published numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Numbers {
    pub capacity: u64,
    pub available: u64,
    pub used: u64,
    pub inodes: u64,
    pub inodes_free: u64,
    pub inodes_used: u64,
}

/// What a scrape publishes for one volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Numbers(Numbers),
    Error(Reason),
}

/// A volume's numbers from its project's quota and the statfs of the
/// filesystem holding it (`fs`):
/// - capacity: the project's block limit (the soft limit when one is set,
///   as the kernels' statfs takes it; the plugin sets only hard limits),
///   or the filesystem's size when that is smaller or there is no limit;
/// - used: the bytes charged to the project;
/// - available: capacity less used, and never more than the filesystem
///   has available.
pub fn derive(fs: &FsStat, q: &ProjectQuota) -> Numbers {
    let fs_size = fs.blocks.saturating_mul(fs.frsize);
    let fs_available = fs.bavail.saturating_mul(fs.frsize);
    let limit = match q.limits.bytes_soft {
        0 => q.limits.bytes_hard,
        soft => soft,
    };
    let capacity = match limit {
        0 => fs_size,
        l => l.min(fs_size),
    };
    let (inodes, inodes_free, inodes_used) = inodes(fs, Some(q));
    Numbers {
        capacity,
        available: capacity.saturating_sub(q.used_bytes).min(fs_available),
        used: q.used_bytes,
        inodes,
        inodes_free,
        inodes_used,
    }
}

/// A volume's numbers from the statfs of its root, where its quota could
/// not be read.
pub fn from_root(st: &FsStat) -> Numbers {
    let (capacity, available, used) = bytes(st);
    let (inodes, inodes_free, inodes_used) = inodes(st, None);
    Numbers {
        capacity,
        available,
        used,
        inodes,
        inodes_free,
        inodes_used,
    }
}

/// kubelet's numbers from a statfs: (capacity, available, used) bytes.
pub fn bytes(st: &FsStat) -> (u64, u64, u64) {
    let f = st.frsize;
    (
        st.blocks.saturating_mul(f),
        st.bavail.saturating_mul(f),
        st.blocks.saturating_sub(st.bfree).saturating_mul(f),
    )
}

/// (inodes, inodes_free, inodes_used) by the design's rule.
pub fn inodes(st: &FsStat, quota: Option<&ProjectQuota>) -> (u64, u64, u64) {
    match quota {
        Some(q) if q.limits.inodes_hard > 0 => {
            let limit = q.limits.inodes_hard;
            (limit, limit.saturating_sub(q.used_inodes), q.used_inodes)
        }
        Some(q) => (st.files, st.ffree, q.used_inodes),
        None => (st.files, st.ffree, st.files.saturating_sub(st.ffree)),
    }
}

pub struct Statfs {
    timeout: Duration,
    inflight: InFlight,
    stat: StatFn,
}

impl Statfs {
    pub fn new(timeout: Duration) -> Statfs {
        Statfs::with_stat(timeout, Arc::new(statvfs))
    }

    /// With another statfs (tests simulate stuck filesystems this way).
    pub fn with_stat(timeout: Duration, stat: StatFn) -> Statfs {
        Statfs {
            timeout,
            inflight: InFlight::new("statfs"),
            stat,
        }
    }

    /// statfs of the roots of `volumes`, on one blocking thread or, from
    /// [`SPLIT_FROM`] volumes, two (each every other volume). Entries left
    /// `None` got no answer in time.
    ///
    /// The threads record their progress in atomics and wake this task only
    /// when the last is done: a wake-up per statfs (a watch channel, as
    /// before) cost more than the statfs itself at 1,000 volumes. The task
    /// sleeps until `timeout` after the latest answer, so "stuck" still means
    /// no statfs finished within the timeout; the directory stays claimed
    /// until both threads returned.
    async fn stat_all(
        &self,
        key: &str,
        volumes: Vec<Arc<Volume>>,
    ) -> (Vec<Option<Result<FsStat, i32>>>, Option<String>) {
        let n = volumes.len();
        let ticket = match self.inflight.begin(key) {
            Ok(t) => t,
            Err(blocked) => return (vec![None; n], Some(format!("statfs in {key}: {blocked}"))),
        };
        let stuck = ticket.stuck_flag();
        let ticket = Arc::new(ticket);
        let threads = if n >= SPLIT_FROM { 2 } else { 1 };
        // One list per thread (every `threads`-th volume from its first):
        // the threads never wait for each other's lock.
        let results: Arc<Vec<Mutex<Vec<Answer>>>> = Arc::new(
            (0..threads)
                .map(|t| Mutex::new(vec![None; (n + threads - 1 - t) / threads]))
                .collect(),
        );
        let volumes = Arc::new(volumes);
        let progress = Arc::new(Progress::default());
        let running = Arc::new(AtomicUsize::new(threads));
        let began = std::time::Instant::now();
        let (finished, mut done) = tokio::sync::oneshot::channel::<()>();
        let finished = Arc::new(Mutex::new(Some(finished)));
        for t in 0..threads {
            let (stat, shared, abort, answered) = (
                self.stat.clone(),
                results.clone(),
                stuck.clone(),
                progress.clone(),
            );
            let (ticket, volumes, running, finished) = (
                ticket.clone(),
                volumes.clone(),
                running.clone(),
                finished.clone(),
            );
            tokio::task::spawn_blocking(move || {
                let _ticket = ticket;
                for (j, v) in volumes.iter().skip(t).step_by(threads).enumerate() {
                    if abort.load(Ordering::Relaxed) {
                        break;
                    }
                    let r = stat(&v.root).map_err(|e| e.raw_os_error().unwrap_or(0));
                    shared[t].lock().unwrap_or_else(|e| e.into_inner())[j] = Some(r);
                    answered.note(began);
                }
                if running.fetch_sub(1, Ordering::AcqRel) == 1 {
                    if let Some(f) = finished.lock().unwrap_or_else(|e| e.into_inner()).take() {
                        let _ = f.send(());
                    }
                }
            });
        }
        drop(ticket);
        let mut error = None;
        loop {
            let (count, last) = progress.get();
            let deadline = tokio::time::Instant::from_std(began + last + self.timeout);
            match tokio::time::timeout_at(deadline, &mut done).await {
                Ok(_) => break,                                  // all answered, or the threads ended
                Err(_) if progress.get().0 != count => continue, // answers meanwhile
                Err(_) => {
                    stuck.store(true, Ordering::Relaxed);
                    error = Some(format!(
                        "statfs in {key} got no answer within {:.1}s; not querying it again until the blocked call returns",
                        self.timeout.as_secs_f64()
                    ));
                    break;
                }
            }
        }
        let lists: Vec<Vec<Answer>> = results
            .iter()
            .map(|l| l.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .collect();
        let got = (0..n).map(|i| lists[i % threads][i / threads]).collect();
        (got, error)
    }
}

/// Volumes from which one directory's statfs pass runs on two threads:
/// below it the second thread's hand-off costs about what it saves.
pub const SPLIT_FROM: usize = 64;

/// How far a statfs thread got: answers so far, and when the latest came
/// (nanoseconds after the pass began).
#[derive(Debug, Default)]
struct Progress {
    answers: AtomicUsize,
    last_ns: AtomicU64,
}

impl Progress {
    fn note(&self, began: std::time::Instant) {
        self.last_ns
            .store(began.elapsed().as_nanos() as u64, Ordering::Release);
        self.answers.fetch_add(1, Ordering::AcqRel);
    }

    fn get(&self) -> (usize, Duration) {
        let count = self.answers.load(Ordering::Acquire);
        (
            count,
            Duration::from_nanos(self.last_ns.load(Ordering::Acquire)),
        )
    }
}

impl Collector for Statfs {
    fn name(&self) -> &'static str {
        "statfs"
    }

    fn collect<'a>(
        &'a self,
        scrape: &'a Scrape,
        out: &'a mut Vec<Family>,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let inv = &scrape.inventory;
            let (quota, dirs, roots) =
                tokio::join!(scrape.quota(), scrape.dir_stats(), scrape.root_ids());
            let mut outcomes = vec![Outcome::Error(Reason::NotFound); inv.volumes.len()];
            let mut errors = Vec::new();
            for (d, dir) in inv.dirs.iter().enumerate() {
                let key = dir.path.display().to_string();
                let mut unread = Vec::new();
                for i in inv.volumes_of(d) {
                    outcomes[i] = match &dirs[d] {
                        None => Outcome::Error(Reason::NotFound),
                        Some(Err(Unanswered::Stuck(_))) => Outcome::Error(Reason::Timeout),
                        Some(Err(Unanswered::Failed(errno))) => {
                            Outcome::Error(Reason::from_errno(*errno))
                        }
                        // A root replaced or removed behind the plugin's
                        // back (seen within the roots' reuse period).
                        Some(Ok(_)) if matches!(roots.ids.get(i), Some(Some(Err(())))) => {
                            Outcome::Error(Reason::NotFound)
                        }
                        Some(Ok(fs)) => match quota.per_volume.get(i).copied().flatten() {
                            Some(q) => Outcome::Numbers(derive(fs, &q)),
                            None => {
                                unread.push(i);
                                continue;
                            }
                        },
                    };
                }
                if let Some(Err(e)) = &dirs[d] {
                    errors.push(format!("statfs of {key}: {e}"));
                }
                if unread.is_empty() {
                    continue;
                }
                let vols = unread.iter().map(|&i| inv.volumes[i].clone()).collect();
                let (got, error) = self.stat_all(&key, vols).await;
                for (&i, r) in unread.iter().zip(got) {
                    outcomes[i] = match r {
                        Some(Ok(st)) => Outcome::Numbers(from_root(&st)),
                        Some(Err(errno)) => Outcome::Error(Reason::from_errno(errno)),
                        None => Outcome::Error(Reason::Timeout),
                    };
                }
                errors.extend(error);
            }
            out.extend(families(&outcomes));
            if errors.is_empty() {
                Ok(())
            } else {
                Err(anyhow!(errors.join("; ")))
            }
        })
    }
}

/// The statfs families from each volume's [`Outcome`].
pub fn families(outcomes: &[Outcome]) -> Vec<Family> {
    let n = outcomes.len();
    let g = |name, help| Family::gauge(name, help).with_capacity(n);
    let mut capacity = g(
        "nomad_host_volume_capacity_bytes",
        "Capacity in bytes of the volume: its project's block limit (the size it was created or grown to), or the filesystem's size when that is smaller; what statfs of the volume root reports as f_blocks*f_frsize.",
    );
    let mut available = g(
        "nomad_host_volume_available_bytes",
        "Number of bytes that can still be written to the volume: its capacity less its used bytes, or the filesystem's available bytes when those are fewer.",
    );
    let mut used = g(
        "nomad_host_volume_used_bytes",
        "Number of used bytes in the volume: the bytes charged to its project quota (quotactl); statfs of the volume root only when quotas cannot be read.",
    );
    let mut inodes_total = g(
        "nomad_host_volume_inodes",
        "Maximum number of inodes in the volume: the project's inode hard limit when one is set, else the filesystem's inodes (statfs f_files).",
    );
    let mut inodes_free = g(
        "nomad_host_volume_inodes_free",
        "Number of free inodes in the volume: inode hard limit minus the project's inodes when a limit is set, else the filesystem's free inodes (statfs f_ffree).",
    );
    let mut inodes_used = g(
        "nomad_host_volume_inodes_used",
        "Number of used inodes in the volume: the project's inode count from quotactl; statfs f_files-f_ffree (filesystem-wide) only when quotas cannot be read.",
    );
    let mut errors = Family::gauge(
        "nomad_host_volume_stats_error",
        "1 when the volume's numbers could not be read at this scrape, by reason: timeout (its filesystem did not answer within --collector.mount-timeout and is not queried again until the blocked call returns), not_found (the volume root or its volumes directory is gone), permission, other. No series when they were read.",
    );
    for (i, o) in outcomes.iter().enumerate() {
        match o {
            Outcome::Numbers(v) => {
                capacity.volume(i, v.capacity as f64);
                available.volume(i, v.available as f64);
                used.volume(i, v.used as f64);
                inodes_total.volume(i, v.inodes as f64);
                inodes_free.volume(i, v.inodes_free as f64);
                inodes_used.volume(i, v.inodes_used as f64);
            }
            Outcome::Error(r) => errors.volume_with(i, r.labels(), 1.0),
        }
    }
    vec![
        capacity,
        available,
        used,
        inodes_total,
        inodes_free,
        inodes_used,
        errors,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collector::quota::{ListFn, QuotaReader};
    use crate::inventory::tests::{volume, volumes_with_roots};
    use crate::inventory::Inventory;
    use prjquota_core::quota::Limits;
    use std::io;
    use std::path::Path;
    use std::sync::atomic::AtomicUsize;

    const ST: FsStat = FsStat {
        frsize: 4096,
        blocks: 1000,
        bfree: 400,
        bavail: 300,
        files: 1_000_000,
        ffree: 900_000,
    };

    fn pq(used_inodes: u64, inodes_hard: u64) -> ProjectQuota {
        ProjectQuota {
            id: 1,
            used_bytes: 0,
            used_inodes,
            limits: Limits {
                inodes_hard,
                ..Limits::NONE
            },
        }
    }

    #[test]
    fn kubelet_byte_semantics() {
        assert_eq!(bytes(&ST), (4_096_000, 1_228_800, 2_457_600));
        let odd = FsStat { bfree: 2000, ..ST };
        assert_eq!(bytes(&odd).2, 0, "never negative");
    }

    #[test]
    fn inode_rule_limit_then_quota_then_statfs() {
        assert_eq!(inodes(&ST, Some(&pq(120, 5000))), (5000, 4880, 120));
        assert_eq!(inodes(&ST, Some(&pq(120, 0))), (1_000_000, 900_000, 120));
        assert_eq!(inodes(&ST, None), (1_000_000, 900_000, 100_000));
        assert_eq!(inodes(&ST, Some(&pq(7000, 5000))).1, 0);
    }

    #[test]
    fn errors_map_to_bounded_reasons() {
        let outcomes = [
            Outcome::Numbers(from_root(&ST)),
            Outcome::Error(Reason::from_errno(libc::ENOENT)),
            Outcome::Error(Reason::from_errno(libc::EACCES)),
            Outcome::Error(Reason::from_errno(libc::EIO)),
            Outcome::Error(Reason::Timeout),
        ];
        let vols = (0..5).map(|i| volume("default", "default", i)).collect();
        let inv = Inventory::for_tests(vols);
        let text = crate::exposition::encode_all(&families(&outcomes), &inv);
        for reason in ["not_found", "permission", "other", "timeout"] {
            assert_eq!(
                text.matches(&format!("reason=\"{reason}\"}} 1")).count(),
                1,
                "{text}"
            );
        }
        assert_eq!(text.matches("nomad_host_volume_capacity_bytes{").count(), 1);
        assert!(text.contains("# TYPE nomad_host_volume_inodes_used gauge"));
    }

    fn quota(used_bytes: u64, bytes_hard: u64, bytes_soft: u64) -> ProjectQuota {
        ProjectQuota {
            id: 1,
            used_bytes,
            used_inodes: 7,
            limits: Limits {
                bytes_hard,
                bytes_soft,
                ..Limits::NONE
            },
        }
    }

    /// The capacity is the limit the kernel enforces, within the
    /// filesystem; the usage is the project's; what is available is never
    /// more than the filesystem has, whatever the limit promises.
    #[test]
    fn derived_numbers_follow_the_limit_and_the_filesystems_room() {
        const MIB: u64 = 1 << 20;
        // ST: 4,096,000 bytes, 1,228,800 available.
        let n = derive(&ST, &quota(40_960, MIB, 0));
        assert_eq!(
            (n.capacity, n.used, n.available),
            (MIB, 40_960, MIB - 40_960)
        );
        assert_eq!(
            (n.inodes, n.inodes_free, n.inodes_used),
            (1_000_000, 900_000, 7)
        );
        let nearly_full = FsStat { bavail: 100, ..ST };
        assert_eq!(
            derive(&nearly_full, &quota(40_960, MIB, 0)).available,
            409_600
        );
        let beyond_the_disk = derive(&ST, &quota(40_960, 10 * MIB, 0));
        assert_eq!(beyond_the_disk.capacity, 4_096_000);
        assert_eq!(beyond_the_disk.available, 1_228_800);
        let no_limit = derive(&ST, &quota(40_960, 0, 0));
        assert_eq!((no_limit.capacity, no_limit.used), (4_096_000, 40_960));
        assert_eq!(
            derive(&ST, &quota(0, MIB, MIB / 2)).capacity,
            MIB / 2,
            "soft first, as statfs"
        );
        let over = derive(&ST, &quota(2 * MIB, MIB, 0));
        assert_eq!((over.used, over.available), (2 * MIB, 0), "never negative");
    }

    fn listing(quotas: Vec<ProjectQuota>) -> QuotaReader {
        let list: ListFn = Arc::new(move |_, _| Ok(quotas.clone()));
        QuotaReader::with_list(Duration::from_secs(5), list)
    }

    /// A scrape asks the filesystem once per volumes directory and never
    /// per volume while the quotas can be read.
    #[tokio::test]
    async fn one_statfs_per_directory_and_none_per_volume() {
        let base = std::env::temp_dir().join(format!("prjq-statfs-{}-derive", std::process::id()));
        let vols = volumes_with_roots(&base, 3);
        let quotas = (1..=3)
            .map(|id| ProjectQuota {
                id,
                used_bytes: 4096 * id as u64,
                used_inodes: id as u64,
                limits: Limits {
                    bytes_hard: 1 << 20,
                    ..Limits::NONE
                },
            })
            .collect();
        let dir_calls = Arc::new(AtomicUsize::new(0));
        let counted = dir_calls.clone();
        let dir_stat: StatFn = Arc::new(move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok(ST)
        });
        let never: StatFn = Arc::new(|p| panic!("statfs of the volume root {}", p.display()));
        let c = Statfs::with_stat(Duration::from_secs(5), never);
        let inv = Inventory::for_tests(vols.iter().map(|v| (**v).clone()).collect());
        let scrape = Scrape::with_quota_reader(inv, listing(quotas))
            .with_dir_stat(Duration::from_secs(5), dir_stat);
        let mut out = Vec::new();
        c.collect(&scrape, &mut out).await.unwrap();
        assert_eq!(dir_calls.load(Ordering::SeqCst), 1);
        let t = crate::exposition::encode_all(&out, &scrape.inventory);
        for v in &vols {
            let id = &v.volume_id;
            let l = format!("{{namespace=\"a\",node_pool=\"p\",volume_id=\"{id}\"}}");
            let used = 4096 * v.project_id as u64;
            for line in [
                format!("nomad_host_volume_capacity_bytes{l} 1048576\n"),
                format!("nomad_host_volume_used_bytes{l} {used}\n"),
                format!(
                    "nomad_host_volume_available_bytes{l} {}\n",
                    (1 << 20) - used
                ),
                format!("nomad_host_volume_inodes_used{l} {}\n", v.project_id),
            ] {
                assert!(t.contains(&line), "{line} in\n{t}");
            }
        }
        assert!(!t.contains("nomad_host_volume_stats_error{"), "{t}");

        // A root gone behind the plugin's back has no numbers.
        std::fs::remove_dir(&vols[0].root).unwrap();
        let inv = Inventory::for_tests(vols.iter().map(|v| (**v).clone()).collect());
        let scrape = Scrape::with_quota_reader(inv, listing(Vec::new()))
            .with_dir_stat(Duration::from_secs(5), Arc::new(|_| Ok(ST)));
        let mut out = Vec::new();
        c.collect(&scrape, &mut out).await.unwrap();
        let t = crate::exposition::encode_all(&out, &scrape.inventory);
        assert_eq!(t.matches("reason=\"not_found\"} 1").count(), 1, "{t}");
        assert_eq!(
            t.matches("nomad_host_volume_capacity_bytes{").count(),
            2,
            "{t}"
        );
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// A volumes directory whose statfs does not answer times out every
    /// volume in it, and fails the collector naming the directory.
    #[tokio::test]
    async fn a_stuck_volumes_directory_times_out_its_volumes() {
        let base =
            std::env::temp_dir().join(format!("prjq-statfs-{}-stuck-dir", std::process::id()));
        let vols = volumes_with_roots(&base, 2);
        let stuck: StatFn = Arc::new(|_| {
            std::thread::sleep(Duration::from_millis(600));
            Ok(ST)
        });
        let never: StatFn = Arc::new(|p| panic!("statfs of the volume root {}", p.display()));
        let c = Statfs::with_stat(Duration::from_secs(5), never);
        let inv = Inventory::for_tests(vols.iter().map(|v| (**v).clone()).collect());
        let scrape = Scrape::with_quota_reader(inv, listing(Vec::new()))
            .with_dir_stat(Duration::from_millis(100), stuck);
        let mut out = Vec::new();
        let e = c.collect(&scrape, &mut out).await.unwrap_err().to_string();
        assert!(e.contains("statfs of /srv/volumes"), "{e}");
        let t = crate::exposition::encode_all(&out, &scrape.inventory);
        assert_eq!(t.matches("reason=\"timeout\"} 1").count(), 2, "{t}");
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// Lets the stuck statfs return, waits until the directory is free, and
    /// leaves one more answer queued so the next call on that path returns
    /// at once.
    async fn release(c: &Statfs, release_tx: &std::sync::mpsc::Sender<()>) {
        release_tx.send(()).unwrap();
        for _ in 0..400 {
            if !c.inflight.is_stuck("/srv/volumes") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        release_tx.send(()).unwrap();
    }

    /// Where quotas cannot be read each root is statfs'ed, with the same
    /// stuck-mount rule.
    #[tokio::test]
    async fn a_stuck_filesystem_times_out_once_and_is_not_queried_until_it_returns() {
        let base = std::env::temp_dir().join(format!("prjq-statfs-{}-stuck", std::process::id()));
        let vols: Vec<Volume> = volumes_with_roots(&base, 3)
            .iter()
            .map(|v| (**v).clone())
            .collect();
        let stuck_path = vols[1].root.clone();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let release_rx = Mutex::new(release_rx);
        let calls = Arc::new(AtomicUsize::new(0));
        let calls2 = calls.clone();
        let stat: StatFn = Arc::new(move |p: &Path| {
            calls2.fetch_add(1, Ordering::SeqCst);
            if p == stuck_path {
                let _ = release_rx.lock().unwrap().recv();
            }
            Ok(ST)
        });
        let c = Statfs::with_stat(Duration::from_millis(100), stat);
        let unreadable: ListFn = Arc::new(|_, _| Err(io::Error::from_raw_os_error(libc::ESRCH)));
        let scrape = Scrape::with_quota_reader(
            Inventory::for_tests(vols),
            QuotaReader::with_list(Duration::from_secs(5), unreadable),
        )
        .with_dir_stat(Duration::from_secs(5), Arc::new(|_| Ok(ST)));
        let text = |fams: &[Family]| crate::exposition::encode_all(fams, &scrape.inventory);

        let mut out = Vec::new();
        assert!(c.collect(&scrape, &mut out).await.is_err());
        let t = text(&out);
        assert_eq!(t.matches("reason=\"timeout\"} 1").count(), 2, "{t}");
        assert_eq!(t.matches("nomad_host_volume_capacity_bytes{").count(), 1);
        assert_eq!(calls.load(Ordering::SeqCst), 2);

        // Still blocked: no new call, every volume of the directory times out.
        let mut out = Vec::new();
        assert!(c.collect(&scrape, &mut out).await.is_err());
        assert_eq!(text(&out).matches("reason=\"timeout\"} 1").count(), 3);
        assert_eq!(calls.load(Ordering::SeqCst), 2);

        release(&c, &release_tx).await;
        let mut out = Vec::new();
        c.collect(&scrape, &mut out).await.unwrap();
        let t = text(&out);
        assert!(!t.contains("nomad_host_volume_stats_error{"), "{t}");
        assert_eq!(t.matches("nomad_host_volume_capacity_bytes{").count(), 3);
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// From [`SPLIT_FROM`] volumes two threads share a directory's pass:
    /// every answer lands at its own volume, a volume stuck on one thread
    /// leaves the other's answers served, and the directory stays claimed
    /// until the stuck call returns.
    #[tokio::test]
    async fn a_split_pass_keeps_each_answer_with_its_volume() {
        let n = SPLIT_FROM + 36;
        let vols: Vec<_> = (0..n as u32)
            .map(|i| Arc::new(volume("default", "default", 1000 + i)))
            .collect();
        let index: std::collections::HashMap<_, _> = vols
            .iter()
            .enumerate()
            .map(|(i, v)| (v.root.clone(), i))
            .collect();
        let stuck = 10; // on the first thread, which takes the even ones
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let release_rx = Mutex::new(release_rx);
        let calls = Arc::new(AtomicUsize::new(0));
        let calls2 = calls.clone();
        let stat: StatFn = Arc::new(move |p: &Path| {
            calls2.fetch_add(1, Ordering::SeqCst);
            let i = index[p];
            if i == stuck {
                let _ = release_rx.lock().unwrap().recv();
            }
            Ok(FsStat {
                blocks: 10_000 + i as u64,
                ..ST
            })
        });
        let answer = |i: usize| {
            Some(Ok(FsStat {
                blocks: 10_000 + i as u64,
                ..ST
            }))
        };
        let c = Statfs::with_stat(Duration::from_millis(200), stat);

        let (got, error) = c.stat_all("/srv/volumes", vols.clone()).await;
        assert!(error.is_some());
        for (i, r) in got.iter().enumerate() {
            let answered = i % 2 == 1 || i < stuck;
            assert_eq!(*r, if answered { answer(i) } else { None }, "volume {i}");
        }
        let made = calls.load(Ordering::SeqCst);
        assert_eq!(made, n / 2 + stuck / 2 + 1);

        // The other thread is done, the stuck one is not: no new call.
        let (got, _) = c.stat_all("/srv/volumes", vols.clone()).await;
        assert!(got.iter().all(Option::is_none));
        assert_eq!(calls.load(Ordering::SeqCst), made);

        release(&c, &release_tx).await;
        let (got, error) = c.stat_all("/srv/volumes", vols).await;
        assert_eq!(error, None);
        for (i, r) in got.iter().enumerate() {
            assert_eq!(*r, answer(i), "volume {i}");
        }
    }
}
