//! The admission rule's arithmetic, written once: what a volumes
//! filesystem may be promised in all, and what it can still promise. The
//! plugin admits a create or grow by it (`plugin/src/capacity.rs`); the
//! exporter publishes what is left, as a metric and as Nomad node metadata
//! that a volume spec's `constraint` can compare against, so the two can
//! never disagree on the rule.

/// What a filesystem can be promised: the admission rule's inputs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Holdings {
    /// Size of the filesystem (statfs blocks × fragment size).
    pub fs_bytes: u64,
    /// Bytes in use on it that no volume of this volumes directory holds:
    /// statfs's used bytes minus the volumes' quota usage.
    pub used_outside: u64,
    /// Sum of the hard limits of the volumes counted (for an admission,
    /// every recorded volume but the one asking).
    pub promised: u64,
    /// `overcommit_ratio` in force.
    pub ratio: f64,
}

impl Holdings {
    /// The rule's inputs from a statfs of the volumes directory (`f_frsize`,
    /// `f_blocks`, `f_bfree`: the volumes directory is in no project, so its
    /// statfs is the filesystem's) and the bytes the volumes' projects use.
    pub fn from_statfs(
        frsize: u64,
        blocks: u64,
        bfree: u64,
        volumes_used: u64,
        promised: u64,
        ratio: f64,
    ) -> Holdings {
        let used = blocks.saturating_sub(bfree).saturating_mul(frsize);
        Holdings {
            fs_bytes: blocks.saturating_mul(frsize),
            used_outside: used.saturating_sub(volumes_used),
            promised,
            ratio,
        }
    }

    /// The most the volumes together may be promised:
    /// `ratio × (fs_bytes − used_outside)`, rounded down.
    pub fn promisable(&self) -> u64 {
        let room = self.fs_bytes.saturating_sub(self.used_outside) as f64;
        let p = (room * self.ratio).floor();
        if p >= u64::MAX as f64 {
            u64::MAX
        } else {
            p as u64
        }
    }

    /// The largest create or grow (in bytes more than the volume holds)
    /// the rule still admits: what is promisable and not yet promised, 0
    /// when the volumes were promised more than that already.
    pub fn unprovisioned(&self) -> u64 {
        self.promisable().saturating_sub(self.promised)
    }

    /// Whether `requested` more bytes may be promised.
    pub fn admits(&self, requested: u64) -> bool {
        self.promised
            .checked_add(requested)
            .is_some_and(|total| total <= self.promisable())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn holdings(fs: u64, outside: u64, promised: u64, ratio: f64) -> Holdings {
        Holdings {
            fs_bytes: fs,
            used_outside: outside,
            promised,
            ratio,
        }
    }

    /// What is unprovisioned is exactly the largest request admitted: one
    /// byte more is refused.
    #[test]
    fn unprovisioned_is_the_largest_request_admitted() {
        for h in [
            holdings(100 * GIB, 10 * GIB, 80 * GIB, 1.0),
            holdings(100 * GIB, 0, 150 * GIB, 2.0),
            holdings(100, 0, 0, 0.5),
            holdings(7 * GIB + 12345, 3 * GIB + 1, GIB, 1.25),
        ] {
            let left = h.unprovisioned();
            assert!(h.admits(left), "{h:?} refuses {left}");
            assert!(!h.admits(left + 1), "{h:?} admits {}", left + 1);
        }
        assert_eq!(
            holdings(100 * GIB, 10 * GIB, 80 * GIB, 1.0).unprovisioned(),
            10 * GIB
        );
    }

    #[test]
    fn statfs_figures_are_counted_in_bytes_and_volumes_use_is_not_outside() {
        let h = Holdings::from_statfs(4096, 1000, 600, 4096 * 100, 4096 * 50, 1.0);
        assert_eq!(h.fs_bytes, 4096 * 1000);
        assert_eq!(h.used_outside, 4096 * 300);
        assert_eq!(h.unprovisioned(), 4096 * (700 - 50));
        // Volumes counted as using more than the filesystem does (a statfs
        // and a quota read apart in time): nothing outside, never negative.
        assert_eq!(
            Holdings::from_statfs(4096, 1000, 990, 1 << 30, 0, 1.0).used_outside,
            0
        );
    }

    #[test]
    fn overpromised_and_extreme_holdings_saturate() {
        // Promised more than the room (files outside grew): nothing left.
        let h = holdings(100, 50, 80, 1.0);
        assert_eq!(h.unprovisioned(), 0);
        assert!(!h.admits(1));
        assert!(!h.admits(0));
        // More used outside than the filesystem's size (statfs races).
        assert_eq!(holdings(100, 200, 0, 1.0).promisable(), 0);
        assert_eq!(holdings(u64::MAX, 0, 0, 4.0).promisable(), u64::MAX);
        // A sum that overflows is refused, not wrapped into a small number.
        assert!(!holdings(u64::MAX, 0, u64::MAX, 4.0).admits(2));
    }
}
