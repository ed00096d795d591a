//! Capacity arithmetic: which size a request means, rounding to filesystem
//! blocks, human-readable sizes for messages, and size strings in the node
//! configuration.
//!
//! Every size here ends up in Nomad as an int64, so results never exceed
//! `i64::MAX` even though they are carried as `u64`.

use crate::contract::{shown, InputError};

const IEC_UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
const MAX_BYTES: u64 = i64::MAX as u64;

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

/// IEC size for messages: "512 B", "64 MiB", "1.5 GiB". Fractions are cut to
/// two decimals rounding down, so a usage figure is never overstated; pair it
/// with the exact byte count wherever precision matters.
pub fn human(bytes: u64) -> String {
    iec(bytes, false)
}

/// Like [`human`] but rounding up, for "request at least …" advice that must
/// be enough when copied into a volume spec.
pub(crate) fn human_ceil(bytes: u64) -> String {
    iec(bytes, true)
}

fn iec(bytes: u64, round_up: bool) -> String {
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut exp = (63 - bytes.leading_zeros()) as usize / 10;
    let unit = 1u64 << (10 * exp);
    let mut whole = bytes / unit;
    let rem = u128::from(bytes % unit);
    let scaled = rem * 100;
    let mut hundredths = (scaled / u128::from(unit)) as u64;
    if round_up && scaled % u128::from(unit) != 0 {
        hundredths += 1;
    }
    // After a carry the figure is an upper bound and reads as one.
    let carried = hundredths == 100;
    if carried {
        whole += 1;
        hundredths = 0;
        if whole == 1024 && exp + 1 < IEC_UNITS.len() {
            whole = 1;
            exp += 1;
        }
    }
    let unit_name = IEC_UNITS[exp];
    match hundredths {
        0 if rem == 0 || carried => format!("{whole} {unit_name}"),
        // Inexact but below a hundredth: keep a decimal so it does not read as exact.
        0 => format!("{whole}.0 {unit_name}"),
        h if h % 10 == 0 => format!("{whole}.{} {unit_name}", h / 10),
        h => format!("{whole}.{h:02} {unit_name}"),
    }
}

/// Parses a size from the node configuration: a plain number of bytes
/// ("1073741824") or a number with a unit ("1GiB", "500MB", "64 MiB",
/// "1.5GiB").
///
/// Units are case-sensitive, so that `mb` or `Mb` (bits?) is an error, not a
/// guess: `B`, SI `kB` (or `KB`), `MB`, `GB`, `TB`, `PB` (powers of 1000) and
/// IEC `KiB`, `MiB`, `GiB`, `TiB`, `PiB` (powers of 1024). Bare `K`, `M`, `G`
/// are refused because tools disagree on whether they mean 1000 or 1024.
/// Fractions of a byte round up. Sizes above `i64::MAX` are refused because
/// Nomad records sizes as int64. The error is a sentence about the value.
pub fn parse_size(s: &str) -> Result<u64, String> {
    const UNITS: &str = "use B, kB, MB, GB, TB, PB, EB (powers of 1000) or KiB, MiB, GiB, TiB, \
                         PiB, EiB (powers of 1024)";
    let text = s.trim();
    if text.is_empty() {
        return Err(format!(
            "{} is not a size: write a number of bytes or a number with a unit such as \"10GiB\"",
            shown(s)
        ));
    }
    let number_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(number_end);
    let unit = unit.trim_start();
    let not_a_size = || {
        format!(
            "{} is not a size: write a number of bytes (digits only) or a number with a \
             unit, e.g. \"1.5GiB\"; {UNITS}",
            shown(s)
        )
    };
    if number.is_empty() {
        return Err(not_a_size());
    }
    let multiplier: u64 = match unit {
        "" | "B" => 1,
        "kB" | "KB" => 1000,
        "MB" => 1000u64.pow(2),
        "GB" => 1000u64.pow(3),
        "TB" => 1000u64.pow(4),
        "PB" => 1000u64.pow(5),
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "PiB" => 1 << 50,
        "EB" => 1000u64.pow(6),
        "EiB" => 1 << 60,
        _ => {
            return Err(format!(
                "{} has an unknown unit {}: units are case-sensitive; {UNITS}, e.g. \"10GiB\"",
                shown(s),
                shown(unit)
            ))
        }
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let malformed = whole.is_empty()
        || fraction.contains('.')
        || (fraction.is_empty() && number.ends_with('.'));
    if malformed {
        return Err(not_a_size());
    }
    if fraction.len() > 18 {
        return Err(format!(
            "{} has more decimal places than any size needs: use at most 18",
            shown(s)
        ));
    }
    let too_large = || {
        format!(
            "{} is larger than {MAX_BYTES} bytes (8 EiB), the largest size Nomad can record",
            shown(s)
        )
    };
    let whole: u128 = whole.parse::<u64>().map_err(|_| too_large())?.into();
    let mut total = whole * u128::from(multiplier);
    if !fraction.is_empty() {
        let denominator = 10u128.pow(fraction.len() as u32);
        let numerator = fraction.parse::<u128>().expect("digits only") * u128::from(multiplier);
        total += numerator.div_ceil(denominator);
    }
    u64::try_from(total)
        .ok()
        .filter(|&n| n <= MAX_BYTES)
        .ok_or_else(too_large)
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

/// What a filesystem can still be promised: the inputs of the admission
/// rule, measured under the allocation lock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Holdings {
    /// Size of the filesystem (statfs blocks × fragment size).
    pub fs_bytes: u64,
    /// Bytes in use on it that no volume of this volumes directory holds:
    /// statfs's used bytes minus the volumes' quota usage.
    pub used_outside: u64,
    /// Sum of the hard limits of every recorded volume but the one asking.
    pub promised: u64,
    /// `overcommit_ratio` in force.
    pub ratio: f64,
}

impl Holdings {
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

    /// Admits a volume of `requested` bytes, or says why not and what to do.
    pub fn admit(&self, volume_id: &str, requested: u64) -> Result<(), AdmissionError> {
        let limit = self.promisable();
        match self.promised.checked_add(requested) {
            Some(total) if total <= limit => Ok(()),
            _ => Err(AdmissionError {
                volume_id: volume_id.to_owned(),
                requested,
                holdings: *self,
                limit,
            }),
        }
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

    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;
    const GIB: u64 = 1024 * MIB;

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
    fn human_sizes() {
        assert_eq!(human(0), "0 B");
        assert_eq!(human(512), "512 B");
        assert_eq!(human(1023), "1023 B");
        assert_eq!(human(KIB), "1 KiB");
        assert_eq!(human(64 * MIB), "64 MiB");
        assert_eq!(human(GIB + GIB / 2), "1.5 GiB");
        assert_eq!(human(GIB + GIB / 4), "1.25 GiB");
        assert_eq!(human(20 * GIB), "20 GiB");
        assert_eq!(human(1 << 60), "1 EiB");
        assert_eq!(human(u64::MAX), "15.99 EiB");
        // Inexact values never read as exact, and never round up.
        assert_eq!(human(GIB + 1), "1.0 GiB");
        assert_eq!(human(GIB - 1), "1023.99 MiB");
    }

    #[test]
    fn human_ceil_never_understates() {
        assert_eq!(human_ceil(GIB - 1), "1 GiB");
        assert_eq!(human_ceil(GIB + 1), "1.01 GiB");
        assert_eq!(human_ceil(GIB + GIB / 2), "1.5 GiB");
        assert_eq!(human_ceil(1500), "1.47 KiB");
        for bytes in [1025, 1500, 999_999, GIB + 12345, 7 * GIB / 3] {
            let back = parse_size(&human_ceil(bytes)).unwrap();
            assert!(back >= bytes, "{bytes} -> {} -> {back}", human_ceil(bytes));
        }
    }

    #[test]
    fn parse_size_accepts_the_documented_forms() {
        let cases = [
            ("1073741824", GIB),
            ("0", 0),
            ("1GiB", GIB),
            ("1 GiB", GIB),
            ("64 MiB", 64 * MIB),
            ("500MB", 500_000_000),
            ("1.5GiB", GIB + GIB / 2),
            ("2kB", 2000),
            ("2KB", 2000),
            ("2KiB", 2048),
            ("3TB", 3_000_000_000_000),
            ("1TiB", 1 << 40),
            ("1PiB", 1 << 50),
            ("1PB", 1_000_000_000_000_000),
            ("10B", 10),
            ("  20GiB  ", 20 * GIB),
            ("1.1KiB", 1127), // 1126.4 rounds up
            ("0.5B", 1),
        ];
        for (text, want) in cases {
            assert_eq!(parse_size(text), Ok(want), "{text:?}");
        }
    }

    #[test]
    fn parse_size_refuses_malformed_and_ambiguous_sizes() {
        let cases = [
            ("", "not a size"),
            ("   ", "not a size"),
            ("GiB", "not a size"),
            ("-1GiB", "not a size"),
            ("+1GiB", "not a size"),
            (".5GiB", "not a size"),
            ("1.GiB", "not a size"),
            ("1.2.3GiB", "not a size"),
            ("1gib", "unknown unit"),
            ("1mb", "unknown unit"),
            ("1G", "unknown unit"),
            ("1 G i B", "unknown unit"),
            ("0x10", "unknown unit"),
            ("1e9", "unknown unit"),
            ("10GiB extra", "unknown unit"),
            ("1.0000000000000000001GiB", "decimal places"),
        ];
        for (text, needle) in cases {
            let err = parse_size(text).unwrap_err();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }

    #[test]
    fn parse_size_refuses_overflow() {
        assert_eq!(parse_size("9223372036854775807"), Ok(i64::MAX as u64));
        for text in [
            "9223372036854775808",
            "18446744073709551616",
            "99999999999999999999",
            "8192PiB",
            "16EiB",
            "9223372036854775807KiB",
            "18446744073709551615 GiB",
        ] {
            let err = parse_size(text).unwrap_err();
            assert!(err.contains("larger than"), "{text:?}: {err}");
        }
        assert_eq!(parse_size("1EiB"), Ok(1 << 60));
        assert_eq!(parse_size("9EB"), Ok(9_000_000_000_000_000_000));
    }

    #[test]
    fn parse_size_error_escapes_and_truncates_the_value() {
        let err = parse_size(&format!("1\n{}", "x".repeat(10_000))).unwrap_err();
        assert!(err.contains("\\n"), "{err}");
        assert!(!err.contains('\n'));
        assert!(err.len() < 500, "{}", err.len());
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
