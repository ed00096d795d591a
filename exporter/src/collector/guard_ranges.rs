//! The project-ID ranges prjquota gives out (the volumes' and the
//! allocations', from the plugin's `prjquota.toml`), handed to the guard:
//! outside every root, an unprivileged caller may not give a file an ID in
//! them, so no one can squat the IDs a create will look for. Read again
//! when the file changes, as the plugin reads it at every operation.

use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::SystemTime;

use prjquota_core::config;
use prjquota_ebpf::guard::Guard;

/// What the file said last, and when it was changed then.
#[derive(Debug, Default)]
struct Seen {
    changed: Option<Option<SystemTime>>,
    error: Option<String>,
}

#[derive(Debug)]
pub struct GuardRanges {
    plugin_dir: Option<PathBuf>,
    seen: Mutex<Seen>,
}

impl GuardRanges {
    /// The ranges of `plugin_dir`'s prjquota.toml (the defaults without
    /// one, or when no plugin directory is known).
    pub fn new(plugin_dir: Option<PathBuf>) -> GuardRanges {
        GuardRanges {
            plugin_dir,
            seen: Mutex::new(Seen::default()),
        }
    }

    /// Puts the ranges into `guard` when the file changed since the last
    /// call (the first call always). A file that cannot be read keeps the
    /// ranges in force, said once.
    pub fn apply(&self, guard: &mut Guard) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let changed = self.plugin_dir.as_ref().and_then(|d| {
            std::fs::metadata(d.join(config::FILE_NAME))
                .and_then(|m| m.modified())
                .ok()
        });
        if seen.changed == Some(changed) {
            return;
        }
        let ranges = match self.read() {
            Ok(r) => r,
            Err(why) => {
                if seen.error.as_ref() != Some(&why) {
                    crate::warn!(
                        "quota-escape guard: cannot read the project-ID ranges to keep for prjquota; the ranges in force stay",
                        err = why
                    );
                    seen.error = Some(why);
                }
                return;
            }
        };
        match guard.set_ranges(&ranges) {
            Ok(()) => {
                seen.changed = Some(changed);
                seen.error = None;
            }
            Err(e) => crate::warn!(
                "quota-escape guard: cannot put the project-ID ranges into its map; retried at the next round",
                err = e
            ),
        }
    }

    fn read(&self) -> Result<Vec<RangeInclusive<u32>>, String> {
        let cfg = match &self.plugin_dir {
            Some(d) => config::load(d).map_err(|e| format!("{e:#}"))?,
            None => config::Config::default(),
        };
        Ok(ranges_of(&cfg))
    }
}

/// The volumes' range, then the allocations' when the file gives one.
pub fn ranges_of(cfg: &config::Config) -> Vec<RangeInclusive<u32>> {
    let mut out = vec![cfg.project_id_min..=cfg.project_id_max];
    out.extend(cfg.alloc_project_ids.clone());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_volumes_and_the_allocations_ranges_are_kept() {
        let d = config::Config::default();
        assert_eq!(
            ranges_of(&d),
            vec![1_000_000_000..=1_999_999_999, 2_000_000_000..=2_999_999_999]
        );
        let own = config::Config {
            alloc_project_ids: None,
            ..config::Config::default()
        };
        assert_eq!(ranges_of(&own).len(), 1);
    }
}
