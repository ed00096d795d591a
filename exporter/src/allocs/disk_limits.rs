//! `ephemeral_disk.size` enforced (`--nomad.enforce-ephemeral-disk`, off
//! by default): each accounted allocation's project gets a hard limit of
//! the size Nomad reserved for it, so a task that fills its disk fails its
//! own writes (EDQUOT, or ENOSPC on XFS) rather than every other
//! allocation's and volume's on the filesystem.
//!
//! The size comes from Nomad (`AllocatedResources.Shared.DiskMB` of
//! `/v1/allocation/<id>`, read by `crate::nomad::disk_sizes` into
//! [`DiskLimits::set_reserved`]); the limit is applied here, by the scan
//! thread that accounts the allocations, once the allocation is walked
//! (its usage is then complete) and again when Nomad's size changes:
//!
//! - usage within the size: the hard limit is the size;
//! - usage already over the size when the limit is first set (a sticky
//!   or migrated disk that grew, an exporter started with the option on
//!   beside a running task): the limit is set above the usage by
//!   [`headroom`], never at the size, so the task is not failed on the
//!   spot; `nomad_alloc_disk_limit_bytes` is then above
//!   `nomad_alloc_disk_reserved_bytes`, which the alert
//!   `NomadAllocEphemeralDiskOverSize` reports. Once its usage is back
//!   within its size, the limit is its size;
//! - no size known yet (Nomad away, the allocation unknown to it): nothing
//!   is set, and nothing set before is lifted.
//!
//! No soft limit is set: past the filesystem's grace period (seven days by
//! default) the kernel enforces a soft limit as a hard one, which would
//! shrink an allocation's disk below its size without a word. The warning
//! before the limit is the alert on usage near it
//! (`NomadAllocEphemeralDiskFillingUp`).
//!
//! Off, the limits an earlier start set are lifted from the allocations
//! it finds. Either way, a project's limits go with its allocation: a
//! limited project the kernel counts nothing to would never be unused,
//! and its ID never given again ([`prjquota_core::project_ids`]).

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use prjquota_core::quota::{self, Limits};

use super::Accounting;

/// Whether limits are set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Allocations are not limited; limits an earlier start set are lifted.
    Off,
    Enforce,
}

/// The limit of an allocation over its size when first limited: its usage
/// and a tenth of its size, at least 64 MiB, rounded up to a MiB.
pub fn headroom(reserved: u64) -> u64 {
    (reserved / 10).max(64 << 20)
}

/// The hard limit for an allocation reserved `reserved` bytes that uses
/// `used` bytes under a hard limit of `current` (0: none), and whether it
/// is over its size. A limit above the size, once set, is kept while the
/// usage is over the size: it is never raised again (that would let the
/// task grow without end), and never lowered below the usage.
pub fn decide(reserved: u64, used: u64, current: u64) -> (u64, bool) {
    if used <= reserved {
        return (reserved, false);
    }
    if current >= used {
        return (current, true);
    }
    let over = used
        .saturating_add(headroom(reserved))
        .div_ceil(1 << 20)
        .saturating_mul(1 << 20);
    (over, true)
}

/// How often the limit of an allocation over its size is looked at again,
/// to bring it back to the size once its usage is.
const RECHECK: Duration = Duration::from_secs(30);

/// What the scan thread last applied to an allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Applied {
    project_id: u32,
    /// The size the limit was decided from (0 when off).
    reserved: u64,
    hard: u64,
    over: bool,
    at: Instant,
}

/// How many accounted allocations are in each state of enforcement.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Census {
    /// Limited at their size.
    pub limited: u64,
    /// Over their size when first limited: limited above their usage.
    pub over: u64,
    /// No size from Nomad yet: not limited.
    pub pending: u64,
    /// The kernel refused the limit (retried at the next scan).
    pub failed: u64,
}

/// Shared by the Nomad task (the sizes) and the scan thread (the limits).
#[derive(Debug)]
pub struct DiskLimits {
    mode: Mode,
    reserved: Mutex<BTreeMap<Arc<str>, u64>>,
    /// The allocations whose size is needed (claimed or walked), as the
    /// last scan found them.
    wanted: Mutex<Arc<Vec<Arc<str>>>>,
    /// Woken when an allocation without a size appears.
    wake: tokio::sync::Notify,
    /// The scan thread's own state: taken out while it makes its system
    /// calls, so that no reader ever waits for a stuck filesystem.
    applied: Mutex<State>,
    census: Mutex<Census>,
}

#[derive(Debug, Default)]
struct State {
    allocs: BTreeMap<String, Applied>,
    /// Projects without an allocation swept of their limits once.
    swept: bool,
    /// The allocations logged as over their size, so each is logged once.
    logged_over: BTreeSet<String>,
}

impl DiskLimits {
    pub fn new(mode: Mode) -> Arc<DiskLimits> {
        Arc::new(DiskLimits {
            mode,
            reserved: Mutex::default(),
            wanted: Mutex::default(),
            wake: tokio::sync::Notify::new(),
            applied: Mutex::default(),
            census: Mutex::default(),
        })
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    fn reserved_map(&self) -> std::sync::MutexGuard<'_, BTreeMap<Arc<str>, u64>> {
        self.reserved.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.applied.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Nomad reserved `bytes` for allocation `alloc_id`.
    pub fn set_reserved(&self, alloc_id: &Arc<str>, bytes: u64) {
        self.reserved_map().insert(alloc_id.clone(), bytes);
    }

    /// Forgets the sizes of allocations not in `keep` (collected ones).
    pub fn retain_reserved(&self, keep: &BTreeSet<&str>) {
        self.reserved_map().retain(|id, _| keep.contains(&**id));
    }

    /// The size Nomad reserved for `alloc_id`, when known.
    pub fn reserved_of(&self, alloc_id: &str) -> Option<u64> {
        self.reserved_map().get(alloc_id).copied()
    }

    /// Every known size, for the metrics.
    pub fn reserved(&self) -> Vec<(Arc<str>, u64)> {
        self.reserved_map()
            .iter()
            .map(|(id, b)| (id.clone(), *b))
            .collect()
    }

    pub fn census(&self) -> Census {
        *self.census.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The allocations whose size Nomad is to be asked for.
    pub fn wanted(&self) -> Arc<Vec<Arc<str>>> {
        self.wanted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Resolves when an allocation without a known size appeared.
    pub async fn new_allocation(&self) {
        self.wake.notified().await
    }

    /// Notes the allocations a scan holds (claimed ones too: their size is
    /// asked for during their walk, so that it is known when they are
    /// accounted), and wakes the Nomad task for one it has no size for.
    fn want(&self, accounting: &Accounting) {
        if self.mode == Mode::Off {
            return;
        }
        let (accounted, claimed) = accounting.guarded();
        let ids: Vec<Arc<str>> = accounted
            .iter()
            .chain(&claimed)
            .map(|a| a.alloc_id.clone())
            .collect();
        self.set_wanted(ids);
    }

    /// The allocations whose size is needed are `ids`.
    pub(crate) fn set_wanted(&self, ids: Vec<Arc<str>>) {
        let mut wanted = self.wanted.lock().unwrap_or_else(|e| e.into_inner());
        if **wanted == ids {
            return;
        }
        let reserved = self.reserved_map();
        let unknown = ids.iter().any(|id| !reserved.contains_key(id));
        drop(reserved);
        *wanted = Arc::new(ids);
        drop(wanted);
        if unknown {
            self.wake.notify_one();
        }
    }

    /// Brings every accounted allocation's limit in line (see the module
    /// above): one quota read and at most one write for an allocation
    /// that is new, whose size changed, or that is over its size and due
    /// for a look; nothing for the others. Failures are per allocation,
    /// retried at the next scan.
    pub fn apply(&self, accounting: &Accounting) -> Vec<(String, anyhow::Error)> {
        self.want(accounting);
        let dir = accounting.dir();
        let fd = dir.as_fd();
        let now = Instant::now();
        // Only the scan thread applies: the state is its own while taken.
        let mut st = std::mem::take(&mut *self.state());
        let mut failed = Vec::new();
        if !st.swept {
            match self.sweep(fd, accounting) {
                Ok(()) => st.swept = true,
                Err(e) => failed.push((accounting.path().display().to_string(), e)),
            }
        }
        let mut census = Census::default();
        // Of the allocations applied before, those still accounted: fewer
        // than applied means some were collected.
        let mut still = 0;
        for (id, p) in accounting.accounted() {
            let pid = p.project_id;
            let want = match self.mode {
                Mode::Off => Some(0),
                Mode::Enforce => self.reserved_of(id),
            };
            let known = st.allocs.get(id).copied();
            still += usize::from(known.is_some());
            let Some(reserved) = want else {
                census.pending += 1;
                continue;
            };
            if let Some(a) = known {
                let due = a.over && now.duration_since(a.at) >= RECHECK;
                if a.project_id == pid && a.reserved == reserved && !due {
                    count(&mut census, self.mode, &a);
                    continue;
                }
            }
            match self.limit_one(fd, id, pid, reserved, now) {
                Ok(a) => {
                    if a.over && !st.logged_over.contains(id) {
                        crate::warn!(
                            "an allocation was over its ephemeral_disk.size when it was limited: its limit is set above its usage, not at its size (alert NomadAllocEphemeralDiskOverSize)",
                            alloc_id = id,
                            project_id = pid,
                            reserved_bytes = reserved,
                            limit_bytes = a.hard,
                        );
                        st.logged_over.insert(id.to_string());
                    }
                    count(&mut census, self.mode, &a);
                    still += usize::from(known.is_none());
                    st.allocs.insert(id.to_string(), a);
                }
                Err(e) => {
                    census.failed += 1;
                    failed.push((id.to_string(), e));
                }
            }
        }
        if st.allocs.len() > still {
            failed.extend(self.forget_collected(fd, &mut st, accounting));
        }
        *self.census.lock().unwrap_or_else(|e| e.into_inner()) = census;
        *self.state() = st;
        failed
    }

    /// Lifts the limits of the applied allocations that are no longer
    /// accounted (collected): their projects' limits go with them.
    fn forget_collected(
        &self,
        fd: BorrowedFd<'_>,
        st: &mut State,
        accounting: &Accounting,
    ) -> Vec<(String, anyhow::Error)> {
        let accounted: BTreeSet<&str> = accounting.accounted().map(|(id, _)| id).collect();
        let gone: Vec<(String, Applied)> = st
            .allocs
            .iter()
            .filter(|(id, _)| !accounted.contains(id.as_str()))
            .map(|(id, a)| (id.clone(), *a))
            .collect();
        let mut failed = Vec::new();
        for (id, a) in gone {
            if a.hard != 0 {
                if let Err(e) = quota::set_limits(fd, a.project_id, &Limits::NONE) {
                    failed.push((
                        id.clone(),
                        anyhow::Error::new(e).context(format!(
                            "cannot lift the limit of project {} of the collected allocation",
                            a.project_id
                        )),
                    ));
                    continue;
                }
            }
            st.allocs.remove(&id);
            st.logged_over.remove(&id);
        }
        failed
    }

    /// Reads allocation `id`'s project and sets its limit.
    fn limit_one(
        &self,
        fd: BorrowedFd<'_>,
        id: &str,
        pid: u32,
        reserved: u64,
        now: Instant,
    ) -> Result<Applied> {
        let q = quota::get(fd, pid)
            .with_context(|| format!("cannot read the quota of allocation {id} (project {pid})"))?;
        let (hard, over) = match self.mode {
            Mode::Off => (0, false),
            Mode::Enforce => decide(reserved, q.used_bytes, q.limits.bytes_hard),
        };
        let limits = Limits {
            bytes_hard: hard,
            bytes_soft: 0,
            ..q.limits
        };
        if !same_bytes_limits(&q.limits, &limits) {
            quota::set_limits(fd, pid, &limits).with_context(|| {
                format!("cannot set the ephemeral disk limit of allocation {id} (project {pid}) to {hard} bytes")
            })?;
            if self.mode == Mode::Off {
                crate::info!(
                    "lifted an allocation's ephemeral disk limit: --nomad.enforce-ephemeral-disk is off",
                    alloc_id = id,
                    project_id = pid,
                    limit_bytes = q.limits.bytes_hard,
                );
            }
        }
        Ok(Applied {
            project_id: pid,
            reserved,
            hard,
            over,
            at: now,
        })
    }

    /// Lifts the limits of the allocation range's projects that no
    /// allocation directory holds and the kernel counts nothing to: an
    /// allocation collected while no exporter ran left them, and they
    /// would keep the ID from ever being given again.
    fn sweep(&self, fd: BorrowedFd<'_>, accounting: &Accounting) -> Result<()> {
        let (accounted, claimed) = accounting.guarded();
        let held: BTreeSet<u32> = accounted
            .iter()
            .chain(&claimed)
            .map(|a| a.project_id)
            .collect();
        let found = quota::list(fd, accounting.range().clone()).with_context(|| {
            format!(
                "cannot list the allocations' quotas in {}",
                accounting.path().display()
            )
        })?;
        for q in found {
            let limited = q.limits.bytes_hard != 0 || q.limits.bytes_soft != 0;
            if !limited || held.contains(&q.id) || q.used_bytes != 0 || q.used_inodes != 0 {
                continue;
            }
            quota::set_limits(
                fd,
                q.id,
                &Limits {
                    bytes_hard: 0,
                    bytes_soft: 0,
                    ..q.limits
                },
            )
            .with_context(|| {
                format!(
                    "cannot lift the limit of project {}, which no allocation holds",
                    q.id
                )
            })?;
            crate::info!(
                "lifted the ephemeral disk limit of a project no allocation holds",
                project_id = q.id,
                limit_bytes = q.limits.bytes_hard,
            );
        }
        Ok(())
    }
}

fn count(census: &mut Census, mode: Mode, a: &Applied) {
    match (mode, a.over) {
        (Mode::Off, _) => {}
        (Mode::Enforce, false) => census.limited += 1,
        (Mode::Enforce, true) => census.over += 1,
    }
}

/// Whether the kernel's byte limits are `want`'s: it reports them in
/// whole KiB (`Q_GETQUOTA`).
fn same_bytes_limits(have: &Limits, want: &Limits) -> bool {
    let kib = |b: u64| b.div_ceil(1024) * 1024;
    have.bytes_hard == kib(want.bytes_hard) && have.bytes_soft == kib(want.bytes_soft)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn within_its_size_an_allocation_is_limited_at_its_size() {
        assert_eq!(decide(300 * MIB, 0, 0), (300 * MIB, false));
        assert_eq!(decide(300 * MIB, 300 * MIB, 0), (300 * MIB, false));
        // A limit set above the size when it was over comes back down once
        // the usage is within the size again.
        assert_eq!(decide(300 * MIB, 200 * MIB, 500 * MIB), (300 * MIB, false));
    }

    #[test]
    fn over_its_size_it_gets_room_above_its_usage_once() {
        // First limited while over: usage plus headroom, a whole MiB.
        let (hard, over) = decide(300 * MIB, 400 * MIB + 1, 0);
        assert!(over);
        assert_eq!(hard, 465 * MIB, "400 MiB + 1 + 64 MiB, rounded up");
        // Ten percent of a large size.
        assert_eq!(decide(10_240 * MIB, 20_000 * MIB, 0).0, 21_024 * MIB);
        // Once set, kept while over, however close the usage comes: never
        // raised again, never lowered below the usage.
        assert_eq!(decide(300 * MIB, 465 * MIB, 465 * MIB), (465 * MIB, true));
        assert_eq!(decide(300 * MIB, 350 * MIB, 465 * MIB), (465 * MIB, true));
        // A limit below the usage (set at the size before the usage grew
        // past it: root on ext4 writes through project quotas) is raised
        // above the usage, never left to fail every write.
        let (hard, over) = decide(300 * MIB, 310 * MIB, 300 * MIB);
        assert!(over && hard > 310 * MIB, "{hard}");
    }

    #[test]
    fn limits_compare_at_the_kernels_grain() {
        let l = |h| Limits {
            bytes_hard: h,
            ..Limits::NONE
        };
        assert!(same_bytes_limits(&l(300 * MIB), &l(300 * MIB)));
        assert!(same_bytes_limits(&l(2048), &l(1025)));
        assert!(!same_bytes_limits(&l(0), &l(MIB)));
    }
}
