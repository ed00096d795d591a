//! statfs of every volumes directory, once per scrape: the filesystem's
//! size and free space, which the filesystem collector publishes and the
//! statfs collector derives each volume's numbers from.
//!
//! The volumes directory is never in a project, so its statfs is the
//! filesystem's own. A directory whose statfs has not returned within the
//! timeout is stuck ([`crate::blocking`]) and not asked again until the
//! blocked call returns.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::blocking::InFlight;
use crate::inventory::Inventory;

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

/// Why a volumes directory has no statfs this scrape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unanswered {
    /// statfs failed with this errno.
    Failed(i32),
    /// statfs did not return in time, or an earlier call is still blocked.
    Stuck(String),
}

impl std::fmt::Display for Unanswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unanswered::Failed(errno) => io::Error::from_raw_os_error(*errno).fmt(f),
            Unanswered::Stuck(why) => f.write_str(why),
        }
    }
}

/// One directory's statfs; `None` for a directory that does not exist
/// (the inventory knows no device for it), which is not asked.
pub type DirStat = Option<Result<FsStat, Unanswered>>;

/// Issues the stats; lives as long as the exporter, so a directory whose
/// statfs hangs is not asked again until that call returns.
pub struct DirStatReader {
    timeout: Duration,
    inflight: InFlight,
    stat: StatFn,
}

impl std::fmt::Debug for DirStatReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirStatReader")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl DirStatReader {
    pub fn new(timeout: Duration) -> DirStatReader {
        DirStatReader::with_stat(timeout, Arc::new(statvfs))
    }

    /// With another statfs (tests simulate filesystems this way).
    pub fn with_stat(timeout: Duration, stat: StatFn) -> DirStatReader {
        DirStatReader {
            timeout,
            inflight: InFlight::new("statfs of a volumes directory"),
            stat,
        }
    }

    /// The statfs of every directory of `inv` (same index).
    pub async fn read(&self, inv: &Inventory) -> Vec<DirStat> {
        let mut out = Vec::with_capacity(inv.dirs.len());
        for dir in &inv.dirs {
            if dir.dev.is_none() {
                out.push(None);
                continue;
            }
            let (stat, path) = (self.stat.clone(), dir.path.clone());
            let key = path.display().to_string();
            out.push(Some(
                match self
                    .inflight
                    .run(&key, self.timeout, move || stat(&path))
                    .await
                {
                    Ok(Ok(st)) => Ok(st),
                    Ok(Err(e)) => Err(Unanswered::Failed(e.raw_os_error().unwrap_or(0))),
                    Err(blocked) => Err(Unanswered::Stuck(blocked.to_string())),
                },
            ));
        }
        out
    }
}
