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
}
