//! The statfs collector: capacity, free space and inodes of every volume
//! root, with kubelet's volume-stats semantics.
//!
//! On XFS (and ext4) a directory in an enforced project quota answers statfs
//! with its project's limit and usage, so `f_blocks` is the volume's size,
//! not the disk's. The inode numbers need care: with no inode limit, statfs
//! reports the whole filesystem's inodes, which would charge every volume with
//! every other volume's files. So `inodes_used` is the project's own inode
//! count from quotactl (when the quota collector could read it), and
//! `inodes`/`inodes_free` come from the project's inode hard limit when one is
//! set, from statfs otherwise.
//!
//! statfs runs on the blocking pool, never on the async runtime: one pass
//! per volumes directory at a time, on two threads from [`SPLIT_FROM`]
//! volumes (node_exporter's filesystem collector stats on several workers
//! too). If no statfs on a directory completes
//! within `--collector.mount-timeout`, the directory is stuck: the volumes not yet
//! answered report `nomad_host_volume_stats_error{reason="timeout"}`, and the
//! directory is not queried again until the blocked call returns
//! (node_exporter's stuckMounts).

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::anyhow;
use prjquota_core::quota::ProjectQuota;

use super::{BoxFuture, Collector, Scrape};
use crate::blocking::InFlight;
use crate::exposition::{Extra, Family};
use crate::inventory::Volume;

/// The statfs numbers the metrics need.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsStat {
    /// `f_frsize`: the unit of the block counts.
    pub frsize: u64,
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
}

pub type StatFn = Arc<dyn Fn(&Path) -> io::Result<FsStat> + Send + Sync>;

/// One root's statfs: its numbers or errno, `None` while unanswered.
type Answer = Option<Result<FsStat, i32>>;

/// `statvfs(2)` of `path`.
pub fn statvfs(path: &Path) -> io::Result<FsStat> {
    let s = nix::sys::statvfs::statvfs(path).map_err(|e| io::Error::from_raw_os_error(e as i32))?;
    Ok(FsStat {
        frsize: s.fragment_size() as u64,
        blocks: s.blocks() as u64,
        bfree: s.blocks_free() as u64,
        bavail: s.blocks_available() as u64,
        files: s.files() as u64,
        ffree: s.files_free() as u64,
    })
}

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

/// kubelet's numbers for one volume: (capacity, available, used) bytes.
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
            let n = inv.volumes.len();
            let mut results: Vec<Option<Result<FsStat, i32>>> = vec![None; n];
            let mut errors = Vec::new();
            for (d, dir) in inv.dirs.iter().enumerate() {
                let idx: Vec<usize> = inv.volumes_of(d).collect();
                if idx.is_empty() {
                    continue;
                }
                let vols = idx.iter().map(|&i| inv.volumes[i].clone()).collect();
                let (got, error) = self.stat_all(&dir.path.display().to_string(), vols).await;
                for (&i, r) in idx.iter().zip(got) {
                    results[i] = r;
                }
                errors.extend(error);
            }
            let quota = scrape.quota().await;
            out.extend(families(&results, Some(&quota.per_volume)));
            if errors.is_empty() {
                Ok(())
            } else {
                Err(anyhow!(errors.join("; ")))
            }
        })
    }
}

/// The statfs families from per-volume results (`None` = timed out) and the
/// quota collector's per-volume quotas, if it ran.
pub fn families(
    results: &[Option<Result<FsStat, i32>>],
    quotas: Option<&[Option<ProjectQuota>]>,
) -> Vec<Family> {
    let n = results.len();
    let g = |name, help| Family::gauge(name, help).with_capacity(n);
    let mut capacity = g(
        "nomad_host_volume_capacity_bytes",
        "Capacity in bytes of the volume: statfs f_blocks*f_frsize of the volume root, which on a project-quota directory is the project's limit.",
    );
    let mut available = g(
        "nomad_host_volume_available_bytes",
        "Number of available bytes in the volume: statfs f_bavail*f_frsize of the volume root.",
    );
    let mut used = g(
        "nomad_host_volume_used_bytes",
        "Number of used bytes in the volume: statfs (f_blocks-f_bfree)*f_frsize of the volume root, which on a project-quota directory is the bytes charged to the project's quota.",
    );
    let mut inodes_total = g(
        "nomad_host_volume_inodes",
        "Maximum number of inodes in the volume: the project's inode hard limit when one is set, else statfs f_files (the filesystem's inodes).",
    );
    let mut inodes_free = g(
        "nomad_host_volume_inodes_free",
        "Number of free inodes in the volume: inode hard limit minus the project's inodes when a limit is set, else statfs f_ffree (the filesystem's free inodes).",
    );
    let mut inodes_used = g(
        "nomad_host_volume_inodes_used",
        "Number of used inodes in the volume: the project's inode count from quotactl; statfs f_files-f_ffree (filesystem-wide) only when quotas cannot be read.",
    );
    let mut errors = Family::gauge(
        "nomad_host_volume_stats_error",
        "1 when statfs of the volume root failed at this scrape, by reason: timeout (its filesystem did not answer within --collector.mount-timeout and is not queried again until the blocked call returns), not_found, permission, other. No series when statfs succeeded.",
    );
    for (i, r) in results.iter().enumerate() {
        match r {
            Some(Ok(st)) => {
                let (c, a, u) = bytes(st);
                capacity.volume(i, c as f64);
                available.volume(i, a as f64);
                used.volume(i, u as f64);
                let q = quotas.and_then(|q| q.get(i)).and_then(Option::as_ref);
                let (t, f, u) = inodes(st, q);
                inodes_total.volume(i, t as f64);
                inodes_free.volume(i, f as f64);
                inodes_used.volume(i, u as f64);
            }
            Some(Err(errno)) => errors.volume_with(i, Reason::from_errno(*errno).labels(), 1.0),
            None => errors.volume_with(i, Reason::Timeout.labels(), 1.0),
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
    use crate::inventory::tests::volume;
    use crate::inventory::Inventory;
    use prjquota_core::quota::Limits;
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
        let results = vec![
            Some(Ok(ST)),
            Some(Err(libc::ENOENT)),
            Some(Err(libc::EACCES)),
            Some(Err(libc::EIO)),
            None,
        ];
        let vols = (0..5).map(|i| volume("default", "default", i)).collect();
        let inv = Inventory::for_tests(vols);
        let text = crate::exposition::encode_all(&families(&results, None), &inv);
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

    #[tokio::test]
    async fn a_stuck_filesystem_times_out_once_and_is_not_queried_until_it_returns() {
        let vols: Vec<_> = (1..=3).map(|i| volume("default", "default", i)).collect();
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
        let scrape = Scrape::new(Inventory::for_tests(vols));
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
