//! The project-ID ranges prjquota gives out (the volumes' and the
//! allocations', from the plugin's `prjquota.toml`), handed to the guard:
//! outside every root, an unprivileged caller may not give a file an ID in
//! them, so no one can squat the IDs a create will look for. Read again
//! when the file changes (looked at once a minute), as the plugin reads it
//! at every operation.
//!
//! The file is read off the sync's thread, one read at a time, and the
//! guard is locked only to write what was read: a plugin directory on
//! storage that stopped answering costs a change of the ranges, never a
//! sync round or a scrape.

use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use prjquota_core::config;

/// The file's change time (`None`: no file) and the ranges it gave.
type Reading = (Option<SystemTime>, Result<Vec<RangeInclusive<u32>>, String>);

#[derive(Debug, Default)]
struct State {
    /// The change time of the file whose ranges are in the guard.
    applied: Option<Option<SystemTime>>,
    /// A read under way.
    pending: Option<Receiver<Reading>>,
    /// When the last read started: the sync's rounds look at the file
    /// once a minute at most (a change of the ranges is rare; the plugin
    /// directory's disk is no one's to keep busy).
    started: Option<std::time::Instant>,
    error: Option<String>,
}

/// The shortest time between two looks at the file from the sync's rounds.
const LOOK_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug)]
pub struct GuardRanges {
    plugin_dir: Option<PathBuf>,
    state: Mutex<State>,
}

impl GuardRanges {
    /// The ranges of `plugin_dir`'s prjquota.toml (the defaults without
    /// one, or when no plugin directory is known).
    pub fn new(plugin_dir: Option<PathBuf>) -> GuardRanges {
        GuardRanges {
            plugin_dir,
            state: Mutex::new(State::default()),
        }
    }

    /// Ranges to put into the guard, when the file changed since they were
    /// put there (with its change time, for [`GuardRanges::applied`]),
    /// waiting at most `wait` for a read (the start's fill waits a little,
    /// so that the ranges are in the maps at the swap; the sync's rounds do
    /// not wait). A read that has not answered goes on, and a later call
    /// takes its result.
    pub fn due(&self, wait: Duration) -> Option<(Option<SystemTime>, Vec<RangeInclusive<u32>>)> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // A start's fill (it waits) always looks; a round once a minute.
        let due = !wait.is_zero() || state.started.is_none_or(|t| t.elapsed() >= LOOK_EVERY);
        if state.pending.is_none() && due {
            state.pending = Some(self.read(state.applied));
            state.started = Some(std::time::Instant::now());
        }
        let rx = state.pending.as_ref()?;
        let got = if wait.is_zero() {
            rx.try_recv().map_err(|e| e == TryRecvError::Disconnected)
        } else {
            rx.recv_timeout(wait)
                .map_err(|e| e == mpsc::RecvTimeoutError::Disconnected)
        };
        let (changed, ranges) = match got {
            Ok(r) => r,
            Err(gone) => {
                if gone {
                    state.pending = None;
                }
                return None;
            }
        };
        state.pending = None;
        match ranges {
            Ok(ranges) if state.applied != Some(changed) => Some((changed, ranges)),
            Ok(_) => None,
            Err(why) => {
                if state.error.as_ref() != Some(&why) {
                    crate::warn!(
                        "quota-escape guard: cannot read the project-ID ranges to keep for prjquota; the ranges in force stay",
                        err = why
                    );
                    state.error = Some(why);
                }
                None
            }
        }
    }

    /// Says how putting [`GuardRanges::due`]'s ranges into the guard went.
    pub fn applied(
        &self,
        changed: Option<SystemTime>,
        result: Result<(), prjquota_ebpf::TelemetryError>,
    ) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok(()) => {
                state.applied = Some(changed);
                state.error = None;
            }
            Err(e) => crate::warn!(
                "quota-escape guard: cannot put the project-ID ranges into its map; retried at the next round",
                err = e
            ),
        }
    }

    /// Starts a read of the file (its change time, and its ranges when
    /// that moved from `applied`) on a thread of its own.
    fn read(&self, applied: Option<Option<SystemTime>>) -> Receiver<Reading> {
        let (tx, rx) = mpsc::channel();
        let dir = self.plugin_dir.clone();
        let _ = std::thread::Builder::new()
            .name("guard-ranges".into())
            .spawn(move || {
                let changed = dir.as_ref().and_then(|d| {
                    std::fs::metadata(d.join(config::FILE_NAME))
                        .and_then(|m| m.modified())
                        .ok()
                });
                let ranges = if applied == Some(changed) {
                    Ok(Vec::new())
                } else {
                    match &dir {
                        Some(d) => config::load(d)
                            .map(|c| ranges_of(&c))
                            .map_err(|e| format!("{e:#}")),
                        None => Ok(ranges_of(&config::Config::default())),
                    }
                };
                let _ = tx.send((changed, ranges));
            });
        rx
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
