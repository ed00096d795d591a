//! The guard's counters: attempts per project by outcome, and the
//! guard-wide statistics (`guard_stats`), summed over CPUs.

use std::collections::BTreeMap;

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuHashMap};

use super::maps::{MAP_COUNTERS, MAP_PROJECTS, MAP_STATS};
use super::Guard;
use crate::error::map_err;
use crate::error::TelemetryError;
use crate::loader::recursion_misses;
use crate::raw::{GuardProject, GuardRawCounters as RawCounters};
use crate::roots::kernel_dev;

pub(super) const GSTAT_EVENTS_LOST: u32 = 0;
pub(super) const GSTAT_PRIVILEGED: u32 = 1;
pub(super) const GSTAT_WALK_LIMIT_ALLOWED: u32 = 2;
pub(super) const GSTAT_WALK_LIMIT_DENIED: u32 = 3;
pub(super) const GSTAT_UNREADABLE: u32 = 4;
pub(super) const GSTAT_MAP_FULL: u32 = 5;
pub(super) const GSTAT_OUTSIDE_ALLOWED: u32 = 6;
pub(super) const GSTAT_OUTSIDE_DENIED: u32 = 7;
pub(super) const N_GSTATS: u32 = 8;

/// Attempts by outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcomes {
    /// The change went through: the file (or the directory's new files)
    /// left the volume's project.
    pub allowed: u64,
    /// The change failed: refused by the guard (enforce) or by the kernel
    /// (e.g. EPERM for a caller who does not own the file).
    pub denied: u64,
}

impl Outcomes {
    pub fn total(&self) -> u64 {
        self.allowed + self.denied
    }

    /// `self - earlier`, field by field (saturating).
    pub fn since(&self, earlier: &Outcomes) -> Outcomes {
        Outcomes {
            allowed: self.allowed.saturating_sub(earlier.allowed),
            denied: self.denied.saturating_sub(earlier.denied),
        }
    }
}

/// A snapshot of the guard's counters (cumulative since load).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GuardCounters {
    /// Per `(device in the kernel's encoding, project ID)`: every volume
    /// project in the guard (zeros until the first attempt), and any other
    /// with counts. Attempts inside a volume count against its project.
    pub projects: BTreeMap<(u64, u32), Outcomes>,
    /// Attempts outside every root to take a volume's or an allocation's
    /// project ID, or one in their ranges: counted apart, never against
    /// the volume they name (its owner did not make them).
    pub outside: Outcomes,
    /// Attempts past [`GUARD_MAX_DEPTH`](super::GUARD_MAX_DEPTH) on a volume filesystem (volume
    /// unknown).
    pub walk_limit: Outcomes,
    /// Project changes below a volume root by privileged callers (allowed,
    /// not attempts).
    pub privileged: u64,
    /// Refused because the LSM could not read the new attributes (also
    /// counted as denied attempts).
    pub unreadable: u64,
    /// Events dropped because the ring buffer was full (drain more often).
    pub events_lost: u64,
    /// Attempts on a volume the counters map had no room for (counted here,
    /// never lost).
    pub map_full: u64,
    /// Runs of the detecting fexit program the kernel skipped since it was
    /// loaded (`recursion_misses`, Linux 5.12+; `None` where the kernel does
    /// not report it): each an attribute change neither counted nor logged.
    /// A tracing program is not re-entered on a CPU where it already runs,
    /// and on a preemptible kernel (Debian's 7.x) a task preempted inside
    /// it makes another task's change on that CPU go unseen. Refusals do
    /// not depend on it: LSM programs are not skipped so.
    pub missed_runs: Option<u64>,
}

impl GuardCounters {
    /// The attempts against project `projid` on device `st_dev` (as `stat`
    /// gives it; zeros if unknown).
    pub fn project(&self, st_dev: u64, projid: u32) -> Outcomes {
        kernel_dev(st_dev)
            .and_then(|d| self.projects.get(&(d, projid)))
            .copied()
            .unwrap_or_default()
    }
}

impl Guard {
    /// All counters, summed over CPUs.
    pub fn read(&self) -> Result<GuardCounters, TelemetryError> {
        let mut out = GuardCounters::default();
        let projects: BpfHashMap<&MapData, GuardProject, u32> =
            map_err(MAP_PROJECTS, BpfHashMap::try_from(self.map(MAP_PROJECTS)?))?;
        let keys: Vec<GuardProject> =
            self.keys::<GuardProject, u32, _>(MAP_PROJECTS, || projects.keys().collect())?;
        for p in keys {
            out.projects.insert((p.dev, p.projid), Outcomes::default());
        }
        let (counted, sums) = self.counted()?;
        for (p, o) in counted {
            *out.projects.entry(p).or_default() = o;
        }
        out.events_lost = sums[GSTAT_EVENTS_LOST as usize];
        out.privileged = sums[GSTAT_PRIVILEGED as usize];
        out.walk_limit = Outcomes {
            allowed: sums[GSTAT_WALK_LIMIT_ALLOWED as usize],
            denied: sums[GSTAT_WALK_LIMIT_DENIED as usize],
        };
        out.unreadable = sums[GSTAT_UNREADABLE as usize];
        out.map_full = sums[GSTAT_MAP_FULL as usize];
        out.outside = Outcomes {
            allowed: sums[GSTAT_OUTSIDE_ALLOWED as usize],
            denied: sums[GSTAT_OUTSIDE_DENIED as usize],
        };
        out.missed_runs = self.detect_missed_runs();
        Ok(out)
    }

    /// One number that moves whenever the guard judges a change, allowed
    /// or refused, privileged or not, or loses one (events dropped, runs
    /// the kernel skipped): the sum of every count it keeps. The sync timer
    /// compares it to tell an interval in which no root can have been
    /// changed through the guard from one in which some may have. It reads
    /// only the projects that had an attempt, not every volume's.
    pub fn activity(&self) -> Result<u64, TelemetryError> {
        let (counted, sums) = self.counted()?;
        let attempts = counted
            .values()
            .fold(0u64, |a, o| a.wrapping_add(o.total()));
        let stats = sums.iter().fold(0u64, |a, v| a.wrapping_add(*v));
        Ok(attempts
            .wrapping_add(stats)
            .wrapping_add(self.detect_missed_runs().unwrap_or(0)))
    }

    /// The attempts of every project that had one, and the guard-wide
    /// statistics, each summed over CPUs.
    #[allow(clippy::type_complexity)]
    fn counted(
        &self,
    ) -> Result<(BTreeMap<(u64, u32), Outcomes>, [u64; N_GSTATS as usize]), TelemetryError> {
        let mut counted: BTreeMap<(u64, u32), Outcomes> = BTreeMap::new();
        let counters: PerCpuHashMap<&MapData, GuardProject, RawCounters> = map_err(
            MAP_COUNTERS,
            PerCpuHashMap::try_from(self.map(MAP_COUNTERS)?),
        )?;
        for item in counters.iter() {
            let (p, per_cpu) = map_err(MAP_COUNTERS, item)?;
            let sum = counted.entry((p.dev, p.projid)).or_default();
            for c in per_cpu.iter() {
                sum.allowed = sum.allowed.wrapping_add(c.allowed);
                sum.denied = sum.denied.wrapping_add(c.denied);
            }
        }
        let stats: PerCpuArray<&MapData, u64> =
            map_err(MAP_STATS, PerCpuArray::try_from(self.map(MAP_STATS)?))?;
        let mut sums = [0u64; N_GSTATS as usize];
        for (i, s) in sums.iter_mut().enumerate() {
            let per_cpu = map_err(MAP_STATS, stats.get(&(i as u32), 0))?;
            *s = per_cpu.iter().fold(0u64, |a, v| a.wrapping_add(*v));
        }
        Ok((counted, sums))
    }

    /// [`GuardCounters::missed_runs`] of the detecting programs (summed).
    fn detect_missed_runs(&self) -> Option<u64> {
        use std::os::fd::AsFd;
        let mut sum = 0;
        for part in self.detect.parts {
            let Some(prog) = self.ebpf.program(part.prog) else {
                continue;
            };
            let Ok(fd) = prog.fd() else {
                continue;
            };
            let (info, filled) = crate::raw::prog_info(fd.as_fd()).ok()?;
            sum += recursion_misses(&info, filled)?;
        }
        Some(sum)
    }
}
