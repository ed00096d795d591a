//! Capacity arithmetic: which size a request means, rounding to filesystem
//! blocks, and whether a volume's usage fits a new limit. Sizes for people
//! (`human`, `parse_size`) live in `prjquota_core::units`.
//!
//! Every size here ends up in Nomad as an int64, so results never exceed
//! `i64::MAX` even though they are carried as `u64`.

use prjquota_core::units::{human, MAX_BYTES};

use crate::input_error::InputError;

/// The hard limit a create request asks for: `capacity_max` when set, else
/// `capacity_min`, else the node's `default_capacity`.
///
/// Max wins because it is the size the author allowed the volume to reach;
/// a volume is never pre-allocated, so there is no cost in granting it.
pub fn requested_limit(min: u64, max: u64, default: Option<u64>) -> Result<u64, InputError> {
    [max, min, default.unwrap_or(0)]
        .into_iter()
        .find(|&n| n > 0)
        .ok_or(InputError::NoCapacity)
}

/// The block-aligned hard limit for a request: `capacity_max` rounded *down*
/// to the block when a max is set, so the size returned to Nomad never
/// exceeds it (Nomad's server refuses every later update of a volume whose
/// `capacity_max` is below the stored size: `HostVolume.ValidateUpdate`),
/// else `capacity_min` or the node's default rounded up. Refused only when no
/// whole number of blocks lies within `[min, max]`.
pub fn fit_to_blocks(
    min: u64,
    max: u64,
    default: Option<u64>,
    block: u64,
) -> Result<u64, InputError> {
    let requested = requested_limit(min, max, default)?;
    if max == 0 {
        return round_up(requested, block);
    }
    if block < 512 || !block.is_power_of_two() {
        return Err(InputError::InvalidBlockSize { block });
    }
    let down = requested - requested % block;
    // A zero limit means "unlimited" to the kernel, so it never fits.
    if down == 0 || down < min {
        return Err(InputError::NoBlockFits { min, max, block });
    }
    Ok(down)
}

/// Rounds `bytes` up to a whole number of filesystem blocks, because the
/// kernel accounts and limits project usage in blocks. Used for a minimum
/// or a default, where rounding up cannot break a `capacity_max`.
pub fn round_up(bytes: u64, block: u64) -> Result<u64, InputError> {
    if block < 512 || !block.is_power_of_two() {
        return Err(InputError::InvalidBlockSize { block });
    }
    bytes
        .checked_next_multiple_of(block)
        .filter(|&n| n <= MAX_BYTES)
        .ok_or(InputError::CapacityTooLarge {
            requested: bytes,
            block,
        })
}

/// Refuses to lower a volume's limits below what it already holds: the
/// kernel would accept the new limit, and the workload would then fail every
/// write on a volume it believes has room. Equal usage and limit fit.
pub fn check_fits(
    volume_id: &str,
    new_limit: u64,
    used_bytes: u64,
    new_inodes: Option<u64>,
    used_inodes: u64,
) -> Result<(), InputError> {
    if used_bytes > new_limit {
        return Err(InputError::ShrinkBelowUsage {
            volume_id: volume_id.to_owned(),
            requested: new_limit,
            used: used_bytes,
        });
    }
    match new_inodes {
        Some(limit) if used_inodes > limit => Err(InputError::InodesBelowUsage {
            volume_id: volume_id.to_owned(),
            requested: limit,
            used: used_inodes,
        }),
        _ => Ok(()),
    }
}

/// What a filesystem can still be promised: the admission rule's inputs,
/// measured under the allocation lock. The arithmetic is the exporter's
/// too (it publishes what is left), so it lives in `prjquota_core`.
pub use prjquota_core::holdings::Holdings;

/// Admission of a create or grow by [`Holdings`].
pub trait Admit {
    /// Admits a volume of `requested` bytes, or says why not and what to do.
    fn admit(&self, volume_id: &str, requested: u64) -> Result<(), AdmissionError>;
}

impl Admit for Holdings {
    fn admit(&self, volume_id: &str, requested: u64) -> Result<(), AdmissionError> {
        if self.admits(requested) {
            return Ok(());
        }
        Err(AdmissionError {
            volume_id: volume_id.to_owned(),
            requested,
            holdings: *self,
            limit: self.promisable(),
        })
    }
}

/// A create or grow the filesystem cannot keep its promise for.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionError {
    pub volume_id: String,
    pub requested: u64,
    pub holdings: Holdings,
    pub limit: u64,
}

impl std::fmt::Display for AdmissionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let h = &self.holdings;
        write!(
            f,
            "not enough space to promise volume {} {} ({} bytes): the other volumes on this \
             filesystem are already promised {} and the filesystem holds {} of which {} is used \
             outside volumes, so with overcommit_ratio = {} at most {} can be promised ({} left); \
             delete volumes, add disk, ask for less, or raise overcommit_ratio in prjquota.toml",
            self.volume_id,
            human(self.requested),
            self.requested,
            human(h.promised),
            human(h.fs_bytes),
            human(h.used_outside),
            h.ratio,
            human(self.limit),
            human(self.limit.saturating_sub(h.promised)),
        )
    }
}

impl std::error::Error for AdmissionError {}

#[cfg(test)]
mod tests {
    use super::*;
    use prjquota_core::units::GIB;

    #[test]
    fn requested_limit_prefers_max_then_min_then_default() {
        assert_eq!(requested_limit(5, 10, Some(99)).unwrap(), 10);
        assert_eq!(requested_limit(5, 0, Some(99)).unwrap(), 5);
        assert_eq!(requested_limit(0, 0, Some(99)).unwrap(), 99);
        assert_eq!(requested_limit(0, 7, None).unwrap(), 7);
    }

    #[test]
    fn requested_limit_without_any_size_explains_all_three_fixes() {
        for default in [None, Some(0)] {
            let err = requested_limit(0, 0, default).unwrap_err();
            assert!(matches!(err, InputError::NoCapacity));
            let msg = err.to_string();
            for needle in ["capacity_max", "capacity_min", "default_capacity"] {
                assert!(msg.contains(needle), "{msg}");
            }
        }
    }

    #[test]
    fn fit_to_blocks_stays_within_min_and_max() {
        // Decimal units, as HCL users write them: 10GB is not a 4 KiB multiple.
        let ten_gb = 10_000_000_000;
        let got = fit_to_blocks(0, ten_gb, None, 4096).unwrap();
        assert_eq!(got, 9_999_998_976);
        assert!(got <= ten_gb && got % 4096 == 0);
        assert_eq!(
            fit_to_blocks(ten_gb - 4096, ten_gb, None, 4096).unwrap(),
            9_999_998_976
        );
        // Exact multiples are kept; min alone or the default rounds up.
        assert_eq!(fit_to_blocks(0, 8192, None, 4096).unwrap(), 8192);
        assert_eq!(fit_to_blocks(5000, 0, None, 4096).unwrap(), 8192);
        assert_eq!(fit_to_blocks(0, 0, Some(5000), 4096).unwrap(), 8192);
    }

    #[test]
    fn fit_to_blocks_refuses_when_no_block_fits() {
        for (min, max) in [(5000, 6000), (0, 1000), (4097, 8191)] {
            let err = fit_to_blocks(min, max, None, 4096).unwrap_err();
            assert!(
                matches!(err, InputError::NoBlockFits { min: a, max: b, block: 4096 } if a == min && b == max),
                "{min}..{max}: {err}"
            );
            let msg = err.to_string();
            assert!(
                msg.contains("capacity_max") && msg.contains("4096"),
                "{msg}"
            );
        }
    }

    #[test]
    fn round_up_to_blocks() {
        assert_eq!(round_up(0, 4096).unwrap(), 0);
        assert_eq!(round_up(1, 4096).unwrap(), 4096);
        assert_eq!(round_up(4096, 4096).unwrap(), 4096);
        assert_eq!(round_up(4097, 4096).unwrap(), 8192);
        assert_eq!(round_up(1000, 512).unwrap(), 1024);
        assert_eq!(round_up(10 * GIB + 1, 65536).unwrap(), 10 * GIB + 65536);
        // i64::MAX rounded down to a block is still representable.
        let top = (i64::MAX as u64) & !4095;
        assert_eq!(round_up(top, 4096).unwrap(), top);
    }

    #[test]
    fn round_up_refuses_results_nomad_cannot_store() {
        for bytes in [
            i64::MAX as u64,
            (i64::MAX as u64) - 1,
            u64::MAX,
            u64::MAX - 4095,
        ] {
            let err = round_up(bytes, 4096).unwrap_err();
            assert!(
                matches!(err, InputError::CapacityTooLarge { requested, block: 4096 } if requested == bytes),
                "{bytes}: {err:?}"
            );
        }
    }

    #[test]
    fn round_up_refuses_odd_block_sizes() {
        for block in [0, 1, 256, 1000, 4097, 3 * 4096] {
            assert!(
                matches!(round_up(10, block), Err(InputError::InvalidBlockSize { block: b }) if b == block),
                "{block}"
            );
        }
    }

    #[test]
    fn check_fits_allows_growth_and_equal_usage() {
        check_fits("v", 10 * GIB, 10 * GIB, Some(100), 100).unwrap();
        check_fits("v", 10 * GIB, 0, None, u64::MAX).unwrap();
    }

    #[test]
    fn check_fits_refuses_shrinking_below_bytes_used() {
        let id = "8f3e9d2c-4b1a-4c6e-9a7d-2e5b6c1f0a93";
        let err = check_fits(id, GIB, GIB + GIB / 2 + 1, None, 0).unwrap_err();
        assert!(
            matches!(err, InputError::ShrinkBelowUsage { requested, used, .. }
            if requested == GIB && used == GIB + GIB / 2 + 1)
        );
        let msg = err.to_string();
        for needle in [
            id,
            "1 GiB",
            "1073741824 bytes",
            "1610612737 bytes",
            "delete data",
            "at least capacity_max = \"1.51 GiB\"",
        ] {
            assert!(msg.contains(needle), "missing {needle:?} in {msg}");
        }
    }

    #[test]
    fn check_fits_refuses_inode_limit_below_files_used() {
        let err = check_fits("v", GIB, 0, Some(10), 11).unwrap_err();
        assert!(matches!(
            err,
            InputError::InodesBelowUsage {
                requested: 10,
                used: 11,
                ..
            }
        ));
        let msg = err.to_string();
        assert!(
            msg.contains("max_inodes") && msg.contains("\"11\""),
            "{msg}"
        );
        // Bytes are checked first: one error at a time, the bigger problem first.
        assert!(matches!(
            check_fits("v", 1, 2, Some(1), 2),
            Err(InputError::ShrinkBelowUsage { .. })
        ));
    }

    fn holdings(fs: u64, outside: u64, promised: u64, ratio: f64) -> Holdings {
        Holdings {
            fs_bytes: fs,
            used_outside: outside,
            promised,
            ratio,
        }
    }

    #[test]
    fn admission_counts_promises_against_the_room_left_by_outside_files() {
        let h = holdings(100 * GIB, 10 * GIB, 80 * GIB, 1.0);
        assert_eq!(h.promisable(), 90 * GIB);
        h.admit("v", 10 * GIB).unwrap();
        let e = h.admit("v", 10 * GIB + 1).unwrap_err();
        assert_eq!(e.limit, 90 * GIB);
        let msg = e.to_string();
        for needle in [
            "volume v",
            "10 GiB",
            "10737418241 bytes",
            "promised 80 GiB",
            "holds 100 GiB",
            "10 GiB is used outside volumes",
            "overcommit_ratio = 1",
            "at most 90 GiB",
            "delete volumes, add disk",
            "raise overcommit_ratio",
        ] {
            assert!(msg.contains(needle), "{needle:?} in {msg}");
        }
    }

    #[test]
    fn ratio_scales_and_extremes_saturate() {
        assert_eq!(holdings(100, 0, 0, 2.0).promisable(), 200);
        assert_eq!(holdings(100, 0, 0, 0.5).promisable(), 50);
        holdings(100, 0, 150, 2.0).admit("v", 50).unwrap();
        holdings(100, 0, 150, 2.0).admit("v", 51).unwrap_err();
        // More used outside than the filesystem's size (statfs races): no room.
        assert_eq!(holdings(100, 200, 0, 1.0).promisable(), 0);
        holdings(100, 200, 0, 1.0).admit("v", 1).unwrap_err();
        assert_eq!(holdings(u64::MAX, 0, 0, 4.0).promisable(), u64::MAX);
        // A sum that overflows is refused, not wrapped into a small number.
        holdings(u64::MAX, 0, u64::MAX, 4.0)
            .admit("v", 2)
            .unwrap_err();
    }
}
