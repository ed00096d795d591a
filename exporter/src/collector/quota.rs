//! The quota collector: each volume's project usage and limits, read with
//! one `Q_GETNEXTQUOTA` pass per filesystem over the recorded project-ID
//! range (not one quotactl per volume).
//!
//! A project missing from the pass has zero usage: XFS drops dquots with no
//! usage and no limits. The reading is [`Scrape::quota`]'s, shared with the
//! statfs collector's inode numbers and the filesystem collector's sum of
//! usage; of its own series only the inode limit is left (see
//! [`families`]). A filesystem without project quota (this development
//! host, a tmpfs) fails the collector and nothing else.

use std::io;
use std::ops::RangeInclusive;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use prjquota_core::quota::ProjectQuota;

use super::{BoxFuture, Collector, Scrape};
use crate::blocking::InFlight;
use crate::exposition::Family;
use crate::inventory::Inventory;

pub type ListFn =
    Arc<dyn Fn(&Path, RangeInclusive<u32>) -> io::Result<Vec<ProjectQuota>> + Send + Sync>;

/// Every project dquot in `range` on the filesystem holding `dir`.
pub fn list(dir: &Path, range: RangeInclusive<u32>) -> io::Result<Vec<ProjectQuota>> {
    let f = std::fs::File::open(dir)?;
    prjquota_core::quota::list(f.as_fd(), range)
}

/// Reads every volume's quota, one pass per filesystem. Shared by the
/// collectors of a scrape through [`Scrape::quota`], which runs it once on
/// first request: the quota collector publishes it, statfs takes its inode
/// counts, whichever asks first.
pub struct QuotaReader {
    timeout: Duration,
    inflight: InFlight,
    list: ListFn,
}

/// One scrape's reading: per inventory volume (same index) the project's
/// usage and limits, `None` where they could not be read, and why.
#[derive(Debug, Default)]
pub struct QuotaReading {
    pub per_volume: Vec<Option<ProjectQuota>>,
    pub errors: Vec<String>,
}

impl std::fmt::Debug for QuotaReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuotaReader")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl QuotaReader {
    pub fn new(timeout: Duration) -> QuotaReader {
        QuotaReader::with_list(timeout, Arc::new(list))
    }

    pub fn with_list(timeout: Duration, list: ListFn) -> QuotaReader {
        QuotaReader {
            timeout,
            inflight: InFlight::new("quotactl"),
            list,
        }
    }

    pub async fn read(&self, inv: &Inventory) -> QuotaReading {
        let mut per_volume: Vec<Option<ProjectQuota>> = vec![None; inv.volumes.len()];
        let mut errors = Vec::new();
        // One pass per filesystem: directories on one device share it.
        let mut done_devs = Vec::new();
        for (d, dir) in inv.dirs.iter().enumerate() {
            let Some(dev) = dir.dev else { continue };
            if done_devs.contains(&dev) {
                continue;
            }
            done_devs.push(dev);
            let same_fs: Vec<usize> = inv
                .dirs
                .iter()
                .enumerate()
                .filter(|(_, o)| o.dev == Some(dev))
                .map(|(i, _)| i)
                .collect();
            let idx: Vec<usize> = (0..inv.volumes.len())
                .filter(|&i| same_fs.contains(&inv.volumes[i].dir))
                .collect();
            let (Some(lo), Some(hi)) = (
                idx.iter().map(|&i| inv.volumes[i].project_id).min(),
                idx.iter().map(|&i| inv.volumes[i].project_id).max(),
            ) else {
                continue;
            };
            let (list, path) = (self.list.clone(), inv.dirs[d].path.clone());
            let key = path.display().to_string();
            match self
                .inflight
                .run(&key, self.timeout, move || list(&path, lo..=hi))
                .await
            {
                Ok(Ok(found)) => {
                    let at = Positions::of(&found, lo..=hi, idx.len());
                    for &i in &idx {
                        let id = inv.volumes[i].project_id;
                        per_volume[i] = Some(match at.find(&found, id) {
                            Some(k) => found[k],
                            None => ProjectQuota {
                                id,
                                ..ProjectQuota::default()
                            },
                        });
                    }
                }
                Ok(Err(e)) => errors.push(explain(&dir.path, &e)),
                Err(blocked) => errors.push(format!("quotactl in {key}: {blocked}")),
            }
        }
        QuotaReading { per_volume, errors }
    }
}

/// Where each project of a pass is in its list (in ID order), for a
/// lookup per volume: a table by ID where the IDs are dense (the plugin
/// hands out the lowest free ones), a binary search where they are not.
enum Positions {
    Table { lo: u32, at: Vec<u32> },
    Search,
}

impl Positions {
    /// The pass `found` over `range`, for `volumes` lookups: a table of at
    /// most four entries per volume, past which a search costs less than
    /// filling it.
    fn of(found: &[ProjectQuota], range: RangeInclusive<u32>, volumes: usize) -> Positions {
        let (lo, hi) = (*range.start(), *range.end());
        let span = (hi - lo) as usize + 1;
        if span > 4 * volumes + 1024 {
            return Positions::Search;
        }
        let mut at = vec![u32::MAX; span];
        for (k, q) in found.iter().enumerate() {
            if let Some(slot) = q.id.checked_sub(lo).and_then(|o| at.get_mut(o as usize)) {
                *slot = k as u32;
            }
        }
        Positions::Table { lo, at }
    }

    /// `id`'s index in `found`.
    fn find(&self, found: &[ProjectQuota], id: u32) -> Option<usize> {
        match self {
            Positions::Table { lo, at } => id
                .checked_sub(*lo)
                .and_then(|o| at.get(o as usize))
                .filter(|&&k| k != u32::MAX)
                .map(|&k| k as usize),
            // `found` is in ID order.
            Positions::Search => found.binary_search_by_key(&id, |q| q.id).ok(),
        }
    }
}

fn explain(dir: &Path, e: &io::Error) -> String {
    let hint = match e.raw_os_error() {
        Some(libc::ENOSYS | libc::ESRCH | libc::EINVAL | libc::ENOTTY | libc::EOPNOTSUPP) => {
            " (project quota is not enabled on this filesystem: is it XFS or ext4 mounted with prjquota?)"
        }
        Some(libc::EPERM | libc::EACCES) => " (reading quotas of other projects needs CAP_SYS_ADMIN: run the exporter as root)",
        _ => "",
    };
    format!("cannot read project quotas in {}: {e}{hint}", dir.display())
}

/// The quota collector: publishes the scrape's [`QuotaReading`].
pub struct Quota;

impl Collector for Quota {
    fn name(&self) -> &'static str {
        "quota"
    }

    fn collect<'a>(
        &'a self,
        scrape: &'a Scrape,
        out: &'a mut Vec<Family>,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let reading = scrape.quota().await;
            out.extend(families(&reading.per_volume));
            if reading.errors.is_empty() {
                Ok(())
            } else {
                Err(anyhow!(reading.errors.join("; ")))
            }
        })
    }
}

/// What quotactl adds to statfs: the inode limit, for the volumes that have
/// one. The rest of a project's quota is on the statfs families already: on
/// a project-quota directory statfs reports the project's block limit and
/// usage (`nomad_host_volume_capacity_bytes`, `…_used_bytes`, equal to the
/// quota's on XFS and ext4; the VM tests compare them), and
/// `nomad_host_volume_inodes_used` is the project's inode count from this
/// reading. The plugin sets no soft limits. So one series per volume with an
/// inode limit, none for a volume without one.
pub fn families(per_volume: &[Option<ProjectQuota>]) -> Vec<Family> {
    let mut inodes_hard = Family::gauge(
        "nomad_host_volume_quota_hard_limit_inodes",
        "Hard inode limit of the volume's project quota (quotactl; the max_inodes volume parameter). No series for a volume without an inode limit.",
    );
    for (i, q) in per_volume.iter().enumerate() {
        let Some(q) = q else { continue };
        if q.limits.inodes_hard > 0 {
            inodes_hard.volume(i, q.limits.inodes_hard as f64);
        }
    }
    vec![inodes_hard]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::tests::volume;
    use prjquota_core::quota::Limits;
    use std::sync::Mutex;

    #[tokio::test]
    async fn one_pass_over_the_id_range_and_absent_projects_are_zero() {
        let vols = vec![
            volume("default", "default", 1005),
            volume("default", "default", 1001),
            volume("default", "default", 1009),
        ];
        let ranges = Arc::new(Mutex::new(Vec::new()));
        let seen = ranges.clone();
        let list: ListFn = Arc::new(move |_, range| {
            seen.lock().unwrap().push(range);
            Ok(vec![
                ProjectQuota {
                    id: 1001,
                    used_bytes: 4096,
                    used_inodes: 3,
                    limits: Limits {
                        bytes_hard: 1 << 30,
                        inodes_hard: 100,
                        ..Limits::NONE
                    },
                },
                ProjectQuota {
                    id: 1009,
                    used_bytes: 8192,
                    used_inodes: 1,
                    limits: Limits::NONE,
                },
            ])
        });
        let scrape = Scrape::with_quota_reader(
            Inventory::for_tests(vols),
            QuotaReader::with_list(Duration::from_secs(5), list),
        );
        let mut out = Vec::new();
        Quota.collect(&scrape, &mut out).await.unwrap();
        // Asked again (statfs does): no second pass.
        scrape.quota().await;
        assert_eq!(*ranges.lock().unwrap(), vec![1001..=1009]);
        let q = &scrape.quota().await.per_volume;
        assert_eq!(q[0].unwrap().used_bytes, 0, "1005 has no dquot: zero usage");
        assert_eq!(q[1].unwrap().limits.inodes_hard, 100);
        // Only the project with an inode limit has the limit's series.
        let text = crate::exposition::encode_all(&out, &scrape.inventory);
        let id = &scrape.inventory.volumes[1].volume_id;
        assert_eq!(
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .collect::<Vec<_>>(),
            vec![format!(
                "nomad_host_volume_quota_hard_limit_inodes{{namespace=\"default\",node_pool=\"default\",volume_id=\"{id}\"}} 100"
            )],
            "{text}"
        );
    }

    #[test]
    fn a_project_is_found_by_table_and_by_search_alike() {
        let q = |id| ProjectQuota {
            id,
            ..ProjectQuota::default()
        };
        // Dense IDs (a table), then IDs far apart (a search).
        for (found, range) in [
            (vec![q(10), q(11), q(14)], 10..=20),
            (vec![q(10), q(5_000_000), q(u32::MAX)], 10..=u32::MAX),
        ] {
            let at = Positions::of(&found, range.clone(), 3);
            assert_eq!(
                matches!(at, Positions::Table { .. }),
                *range.end() == 20,
                "{range:?}"
            );
            for (k, p) in found.iter().enumerate() {
                assert_eq!(at.find(&found, p.id), Some(k));
            }
            for absent in [0, 9, 12, 21, 4_999_999] {
                assert_eq!(at.find(&found, absent), None, "{absent}");
            }
        }
    }

    #[tokio::test]
    async fn no_quota_support_fails_the_collector_with_a_hint() {
        let list: ListFn = Arc::new(|_, _| Err(io::Error::from_raw_os_error(libc::ESRCH)));
        let scrape = Scrape::with_quota_reader(
            Inventory::for_tests(vec![volume("a", "b", 1)]),
            QuotaReader::with_list(Duration::from_secs(5), list),
        );
        let mut out = Vec::new();
        let err = Quota
            .collect(&scrape, &mut out)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("prjquota"), "{err}");
        assert_eq!(scrape.quota().await.per_volume, vec![None]);
        assert!(crate::exposition::encode_all(&out, &scrape.inventory).is_empty());
    }
}
