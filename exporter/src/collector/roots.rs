//! The identity (`st_dev`, `st_ino`) of every volume root, stat'ed once per
//! scrape for every collector that keys kernel maps by it (`ebpf`, `guard`).
//!
//! Both used to `lstat` every root themselves: at 1,000 volumes that was two
//! passes of path walks per scrape where one gives the same answer.
//!
//! A root's identity changes only when its directory is replaced, which
//! only root can do (the plugin does it by deleting and creating a volume,
//! which changes the registry). So while the inventory holds the same
//! volumes (the registry reuses an unchanged record's `Arc`) and the last
//! pass had an answer for every root, that pass is reused for up to
//! [`REUSE_FOR`]: at 1,000 volumes under the VM's emulated CPU the pass
//! cost half as much as the statfs the scrape needs anyway. A root replaced
//! behind the plugin's back is seen within [`REUSE_FOR`].

use std::path::PathBuf;
use std::time::Duration;

use crate::blocking::InFlight;
use crate::inventory::Inventory;

/// One volume root's `lstat`: `Some(Ok)` its identity when it is a
/// directory, `Some(Err(()))` when it is gone or not a directory, `None`
/// when the answer says nothing about the root (EIO, ESTALE, no answer in
/// time), so a collector keeps what it last knew.
pub type RootId = Option<Result<(u64, u64), ()>>;

/// Every root of one scrape's inventory (same index), and why some got no
/// answer.
#[derive(Debug, Default)]
pub struct RootIds {
    pub ids: Vec<RootId>,
    pub errors: Vec<String>,
}

/// How long a pass over the roots answers for an unchanged inventory.
pub const REUSE_FOR: Duration = Duration::from_secs(60);

/// Issues the stats; lives as long as the exporter, so a volumes directory
/// whose stat hangs is not stat'ed again until that call returns.
#[derive(Debug)]
pub struct RootStat {
    timeout: Duration,
    inflight: InFlight,
    last: std::sync::Mutex<Option<Pass>>,
}

/// The last complete pass: its inventory (held, so the volumes' addresses
/// stay unique), answers and time.
#[derive(Debug)]
struct Pass {
    inventory: std::sync::Arc<Inventory>,
    ids: Vec<RootId>,
    at: std::time::Instant,
}

impl RootStat {
    pub fn new(timeout: Duration) -> RootStat {
        RootStat {
            timeout,
            inflight: InFlight::new("volume root stat"),
            last: std::sync::Mutex::default(),
        }
    }

    /// The roots of `inv`: the last pass's answers when it covered the same
    /// volumes less than [`REUSE_FOR`] ago and answered for every root, else
    /// a new pass ([`RootStat::stat_all`]).
    pub async fn stat_all_or_reuse(&self, inv: &std::sync::Arc<Inventory>) -> RootIds {
        {
            let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(Pass {
                inventory: old,
                ids,
                at,
            }) = last.as_ref()
            {
                if old.same_volumes(inv) && at.elapsed() < REUSE_FOR {
                    return RootIds {
                        ids: ids.clone(),
                        errors: Vec::new(),
                    };
                }
            }
        }
        let at = std::time::Instant::now();
        let got = self.stat_all(inv).await;
        let complete = got.errors.is_empty() && got.ids.iter().all(Option::is_some);
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = complete.then(|| Pass {
            inventory: inv.clone(),
            ids: got.ids.clone(),
            at,
        });
        got
    }

    /// `lstat` of every root, per volumes directory on one blocking thread.
    pub async fn stat_all(&self, inv: &Inventory) -> RootIds {
        let mut out = RootIds {
            ids: vec![None; inv.volumes.len()],
            errors: Vec::new(),
        };
        for (d, dir) in inv.dirs.iter().enumerate() {
            let idx: Vec<usize> = inv.volumes_of(d).collect();
            if idx.is_empty() {
                continue;
            }
            let paths: Vec<PathBuf> = idx.iter().map(|&i| inv.volumes[i].root.clone()).collect();
            let key = dir.path.display().to_string();
            match self
                .inflight
                .run(&key, self.timeout, move || {
                    paths.iter().map(|p| root_id(p)).collect::<Vec<_>>()
                })
                .await
            {
                Ok(ids) => {
                    for (&i, id) in idx.iter().zip(ids) {
                        out.ids[i] = id;
                    }
                }
                Err(blocked) => out
                    .errors
                    .push(format!("stat of the volume roots in {key}: {blocked}")),
            }
        }
        out
    }
}

/// `lstat` of a volume root, never through a symlink, so a root swapped for
/// a link does not register the link's target.
fn root_id(path: &std::path::Path) -> RootId {
    use std::os::unix::fs::MetadataExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Some(Ok((m.dev(), m.ino()))),
        Ok(_) => Some(Err(())),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => Some(Err(())),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[tokio::test]
    async fn a_directory_is_identified_a_symlink_or_gap_is_not() {
        let base = std::env::temp_dir().join(format!("prjq-roots-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("dir")).unwrap();
        std::os::unix::fs::symlink(base.join("dir"), base.join("link")).unwrap();
        let vols = ["dir", "link", "missing"]
            .iter()
            .zip(1..)
            .map(|(name, id)| {
                let mut v = crate::inventory::tests::volume("a", "p", id);
                v.root = base.join(name);
                v
            });
        let inv = Inventory::for_tests(vols.collect());
        let got = RootStat::new(Duration::from_secs(5)).stat_all(&inv).await;
        let m = std::fs::metadata(base.join("dir")).unwrap();
        assert_eq!(
            got.ids,
            vec![Some(Ok((m.dev(), m.ino()))), Some(Err(())), Some(Err(()))]
        );
        assert!(got.errors.is_empty());
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[tokio::test]
    async fn a_pass_is_reused_only_for_the_same_volumes() {
        use std::sync::Arc;
        let base = std::env::temp_dir().join(format!("prjq-roots-reuse-{}", std::process::id()));
        let vols = crate::inventory::tests::volumes_with_roots(&base, 2);
        let inv = |vols: &[Arc<crate::inventory::Volume>]| {
            let mut inv = Inventory::for_tests(Vec::new());
            inv.volumes = vols.to_vec();
            Arc::new(inv)
        };
        let rs = RootStat::new(Duration::from_secs(5));
        let first = rs.stat_all_or_reuse(&inv(&vols)).await;
        assert!(first.ids.iter().all(|i| matches!(i, Some(Ok(_)))));
        // Removed behind the registry's back: the same volumes reuse the
        // pass (for at most REUSE_FOR)...
        std::fs::remove_dir(&vols[1].root).unwrap();
        assert_eq!(rs.stat_all_or_reuse(&inv(&vols)).await.ids, first.ids);
        // ...a changed inventory (a new record: a new Arc) does not.
        let mut changed = vols.clone();
        changed[0] = Arc::new((*vols[0]).clone());
        let fresh = rs.stat_all_or_reuse(&inv(&changed)).await;
        assert_eq!(fresh.ids[0], first.ids[0]);
        assert_eq!(fresh.ids[1], Some(Err(())));
        std::fs::remove_dir_all(&base).unwrap();
    }
}
