//! Choosing a free project ID: the one rule the plugin (volumes) and the
//! exporter (allocation directories) follow, each in its own range of
//! [`crate::config::Config`], so neither can hand out the other's IDs.
//!
//! An ID is free when its owner's own bookkeeping does not hold it and the
//! kernel has nothing for it: no usage, no inodes, no limits
//! ([`ProjectQuota::is_unused`]). The kernel's half matters most for reuse:
//! an ID whose files outlived their directory (held open, or renamed out)
//! still has usage, and stays out of use until it is gone.

use std::collections::BTreeSet;
use std::ops::RangeInclusive;

use crate::quota::ProjectQuota;

/// The first ID from `start` to the end of `range` that `held` does not
/// claim and `get` (the kernel's reading of one ID) reports unused. Usually
/// one read: candidates are skipped only when something holds them.
pub fn first_free_from<E>(
    range: &RangeInclusive<u32>,
    start: u32,
    held: impl Fn(u32) -> bool,
    mut get: impl FnMut(u32) -> Result<ProjectQuota, E>,
) -> Result<Option<u32>, E> {
    let mut candidate = start.max(*range.start());
    while range.contains(&candidate) {
        if !held(candidate) && get(candidate)?.is_unused() {
            return Ok(Some(candidate));
        }
        match candidate.checked_add(1) {
            Some(c) => candidate = c,
            None => break,
        }
    }
    Ok(None)
}

/// Candidates a bounded search reads one by one from its start.
pub const STEPS: u32 = 64;
/// Candidates it then reads at random across the rest of the range.
pub const PROBES: u32 = 64;

/// A free ID at or above `start` in `range`, in at most [`STEPS`] +
/// [`PROBES`] reads of the kernel whatever was squatted there: the first
/// free one of the [`STEPS`] from `start`, else one of [`PROBES`] random
/// candidates above those. `None` when none of them was free: the range
/// is nearly full, and only a pass over it can tell (the caller's).
///
/// The IDs a local user tagged its files with before the guard refused
/// them (one quota read each, under the filesystem-wide allocation lock)
/// cost a create no more than [`STEPS`] + [`PROBES`] reads: a dense run of
/// them is stepped over at random, not one by one. `seed` varies the
/// random candidates (the time and the process will do).
pub fn bounded_free_from<E>(
    range: &RangeInclusive<u32>,
    start: u32,
    held: impl Fn(u32) -> bool,
    mut get: impl FnMut(u32) -> Result<ProjectQuota, E>,
    seed: u64,
) -> Result<Option<u32>, E> {
    let start = start.max(*range.start());
    if !range.contains(&start) {
        return Ok(None);
    }
    let steps_end = start.saturating_add(STEPS - 1).min(*range.end());
    if let Some(id) = first_free_from(&(start..=steps_end), start, &held, &mut get)? {
        return Ok(Some(id));
    }
    let Some(rest) = steps_end.checked_add(1).filter(|r| *r <= *range.end()) else {
        return Ok(None);
    };
    let width = u64::from(*range.end() - rest) + 1;
    let mut state = seed;
    for _ in 0..PROBES {
        let candidate = rest + (splitmix64(&mut state) % width) as u32;
        if !held(candidate) && get(candidate)?.is_unused() {
            return Ok(Some(candidate));
        }
    }
    Ok(None)
}

/// A seed for [`bounded_free_from`]: the clock and the process.
pub fn seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ (u64::from(std::process::id()) << 32)
}

/// SplitMix64: a small, well-mixed sequence; no more is needed to spread
/// candidates over a range.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The lowest ID of `range` that `taken` does not hold and no dquot of
/// `kernel` (one pass over the range) says is in use.
pub fn lowest_free(
    range: &RangeInclusive<u32>,
    mut taken: BTreeSet<u32>,
    kernel: &[ProjectQuota],
) -> Option<u32> {
    taken.extend(kernel.iter().filter(|q| !q.is_unused()).map(|q| q.id));
    let mut candidate = *range.start();
    for id in taken.range(range.clone()) {
        if *id != candidate {
            break;
        }
        candidate = candidate.checked_add(1)?;
    }
    (range.contains(&candidate) && !taken.contains(&candidate)).then_some(candidate)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Limits;
    use std::io;

    fn used(id: u32) -> ProjectQuota {
        ProjectQuota {
            id,
            used_inodes: 1,
            ..Default::default()
        }
    }

    #[test]
    fn the_first_free_skips_what_is_held_and_what_the_kernel_uses() {
        let kernel = |id: u32| -> io::Result<ProjectQuota> {
            Ok(match id {
                12 => used(12),
                13 => ProjectQuota {
                    id,
                    limits: Limits {
                        bytes_hard: 1,
                        ..Limits::NONE
                    },
                    ..Default::default()
                },
                _ => ProjectQuota {
                    id,
                    ..Default::default()
                },
            })
        };
        let range = 10..=20;
        assert_eq!(
            first_free_from(&range, 0, |_| false, kernel).unwrap(),
            Some(10)
        );
        assert_eq!(
            first_free_from(&range, 11, |id| id == 11, kernel).unwrap(),
            Some(14)
        );
        assert_eq!(
            first_free_from(&range, 21, |_| false, kernel).unwrap(),
            None
        );
        assert_eq!(first_free_from(&range, 14, |_| true, kernel).unwrap(), None);
        let eio = first_free_from(
            &range,
            10,
            |_| false,
            |_| Err(io::Error::from_raw_os_error(libc::EIO)),
        );
        assert_eq!(eio.unwrap_err().raw_os_error(), Some(libc::EIO));
    }

    #[test]
    fn the_lowest_free_counts_held_and_kernel_ids_and_stays_in_range() {
        let range = 5..=9;
        let kernel = [
            used(5),
            used(7),
            ProjectQuota {
                id: 6,
                ..Default::default()
            },
        ];
        assert_eq!(lowest_free(&range, BTreeSet::new(), &kernel), Some(6));
        assert_eq!(lowest_free(&range, [6].into(), &kernel), Some(8));
        assert_eq!(lowest_free(&range, [6, 8, 9].into(), &kernel), None);
        assert_eq!(
            lowest_free(&(u32::MAX..=u32::MAX), [u32::MAX].into(), &[]),
            None
        );
    }

    #[test]
    fn a_dense_squat_costs_a_bounded_number_of_reads() {
        // Every ID from 100 to 1,000,099 squatted; the range goes to 10^9.
        let squatted = |id: u32| (100..1_000_100).contains(&id);
        let mut reads = 0;
        let got = bounded_free_from(
            &(1..=1_000_000_000),
            100,
            |_| false,
            |id| -> io::Result<ProjectQuota> {
                reads += 1;
                Ok(if squatted(id) {
                    used(id)
                } else {
                    ProjectQuota {
                        id,
                        ..Default::default()
                    }
                })
            },
            7,
        )
        .unwrap()
        .expect("a free ID");
        assert!(!squatted(got) && got > 163, "{got}");
        assert!(reads <= STEPS + PROBES, "{reads} reads");
        // Free at once: one read, the start.
        let mut reads = 0;
        let got = bounded_free_from(
            &(1..=1_000),
            5,
            |_| false,
            |id| -> io::Result<ProjectQuota> {
                reads += 1;
                Ok(ProjectQuota {
                    id,
                    ..Default::default()
                })
            },
            7,
        )
        .unwrap();
        assert_eq!((got, reads), (Some(5), 1));
        // A full range: None, for the caller's pass.
        let got = bounded_free_from(
            &(1..=1_000),
            1,
            |_| false,
            |id| -> io::Result<_> { Ok(used(id)) },
            7,
        )
        .unwrap();
        assert_eq!(got, None);
        // Held candidates are never chosen.
        let got = bounded_free_from(
            &(1..=200),
            1,
            |id| id < 199,
            |id| -> io::Result<_> {
                Ok(ProjectQuota {
                    id,
                    ..Default::default()
                })
            },
            3,
        )
        .unwrap();
        assert!(matches!(got, Some(199) | Some(200) | None), "{got:?}");
    }
}
