//! Sizes as people write and read them: IEC figures for messages, and the
//! size strings of the node configuration. Shared because the plugin's
//! errors and the node configuration (which the exporter reads too) both
//! speak in these units.

use crate::quoted::shown;

const IEC_UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

/// The largest size Nomad can record: it keeps sizes as int64.
pub const MAX_BYTES: u64 = i64::MAX as u64;

/// IEC multiples, for sizes written in code rather than parsed.
pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// IEC size for messages: "512 B", "64 MiB", "1.5 GiB". Fractions are cut to
/// two decimals rounding down, so a usage figure is never overstated; pair it
/// with the exact byte count wherever precision matters.
pub fn human(bytes: u64) -> String {
    iec(bytes, false)
}

/// Like [`human`] but rounding up, for "request at least …" advice that must
/// be enough when copied into a volume spec.
pub fn human_ceil(bytes: u64) -> String {
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

/// Duration units as Prometheus writes them, largest first, in milliseconds.
const DURATION_UNITS: [(&str, u64); 7] = [
    ("y", 365 * 24 * 3600 * 1000),
    ("w", 7 * 24 * 3600 * 1000),
    ("d", 24 * 3600 * 1000),
    ("h", 3600 * 1000),
    ("m", 60 * 1000),
    ("s", 1000),
    ("ms", 1),
];

/// The longest duration Prometheus takes: Go's `time.Duration`, int64
/// nanoseconds (about 292 years).
const MAX_DURATION_NANOS: u128 = i64::MAX as u128;

/// Parses a duration as Prometheus does (`model.ParseDuration`, what
/// `scrape_interval` and `--storage.tsdb.retention.time` take): whole
/// numbers each followed by a unit, `y` (365 days), `w`, `d`, `h`, `m`,
/// `s`, `ms`, from the largest to the smallest and each at most once, as in
/// `1h30m`, `500ms` or `1w2d`; or `0` alone. So a value copied from a
/// Prometheus configuration means the same here, and one that Prometheus
/// would refuse is refused. The error is a sentence about the value.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    const FORM: &str = "whole numbers each with a unit, from the largest to the smallest: y, \
                        w, d, h, m, s, ms, e.g. 30s, 1m30s, 2h or 1d";
    match s {
        "0" => return Ok(std::time::Duration::ZERO),
        "" => return Err(format!("an empty value is not a duration; write {FORM}")),
        _ => {}
    }
    let not_a_duration = |why: &str| format!("{} is not a duration: {why}; write {FORM}", shown(s));
    let mut rest = s;
    let mut millis: u128 = 0;
    // Index in DURATION_UNITS of the last unit read: the next must be smaller.
    let mut last: Option<usize> = None;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(not_a_duration(if rest.starts_with('.') {
                "fractions are not taken (write 1h30m, not 1.5h)"
            } else {
                "every unit needs a number before it"
            }));
        }
        let (number, after) = rest.split_at(digits);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        if unit.is_empty() {
            return Err(format!(
                "{} is not a duration: {number} needs a unit, e.g. {number}s",
                shown(s)
            ));
        }
        if unit.starts_with('.') {
            return Err(not_a_duration(
                "fractions are not taken (write 1h30m, not 1.5h)",
            ));
        }
        let Some(index) = DURATION_UNITS.iter().position(|(u, _)| *u == unit) else {
            return Err(format!(
                "{} has an unknown unit {}: units are y, w, d, h, m, s and ms (lower case)",
                shown(s),
                shown(unit)
            ));
        };
        if last.is_some_and(|l| index <= l) {
            return Err(not_a_duration(&format!(
                "{unit} comes after {}, but units go from the largest to the smallest, each \
                 at most once",
                DURATION_UNITS[last.expect("checked")].0
            )));
        }
        last = Some(index);
        let too_long = || {
            format!(
                "{} is longer than Prometheus takes (about 292 years, 2^63 nanoseconds)",
                shown(s)
            )
        };
        let n: u128 = number.parse().map_err(|_| too_long())?;
        millis = n
            .checked_mul(u128::from(DURATION_UNITS[index].1))
            .and_then(|add| add.checked_add(millis))
            .filter(|ms| ms.saturating_mul(1_000_000) <= MAX_DURATION_NANOS)
            .ok_or_else(too_long)?;
        rest = after;
    }
    Ok(std::time::Duration::from_millis(
        u64::try_from(millis).expect("below 2^63 ns"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn durations_read_as_prometheus_reads_them() {
        use std::time::Duration;
        let secs = Duration::from_secs;
        let day = 24 * 3600;
        for (text, want) in [
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("500ms", Duration::from_millis(500)),
            ("1500ms", Duration::from_millis(1500)),
            ("5s", secs(5)),
            ("90s", secs(90)),
            ("1m30s", secs(90)),
            ("2h", secs(7200)),
            ("1h30m", secs(5400)),
            ("1d", secs(day)),
            ("1w", secs(7 * day)),
            ("1y", secs(365 * day)),
            (
                "1y2w3d4h5m6s7ms",
                Duration::from_millis(((((365 + 17) * 24 + 4) * 60 + 5) * 60 + 6) * 1000 + 7),
            ),
            ("292y", secs(292 * 365 * day)),
        ] {
            assert_eq!(parse_duration(text), Ok(want), "{text:?}");
        }
    }

    #[test]
    fn durations_prometheus_refuses_are_refused_saying_why() {
        for (text, says) in [
            ("", "an empty value"),
            ("1m1h", "h comes after m"),
            ("1s1s", "s comes after s"),
            ("1ms1s", "s comes after ms"),
            ("1.5h", "fractions are not taken"),
            (".5s", "fractions are not taken"),
            ("5", "5 needs a unit, e.g. 5s"),
            ("00", "needs a unit"),
            ("1h30", "30 needs a unit"),
            ("5x", "unknown unit \"x\""),
            ("5S", "unknown unit \"S\""),
            ("5 s", "unknown unit \" s\""),
            ("-5s", "needs a number"),
            (" 5s", "needs a number"),
            ("h", "needs a number"),
            ("293y", "longer than Prometheus takes"),
            ("106752d", "longer than Prometheus takes"),
            ("99999999999999999999999999999999999999999s", "longer than"),
            ("99999999999999999999999999999999999999y", "longer than"),
        ] {
            let err = parse_duration(text).unwrap_err();
            assert!(err.contains(says), "{text:?}: {err}");
        }
        // Just under and over 2^63 ns.
        assert!(parse_duration("9223372036854ms").is_ok());
        assert!(parse_duration("9223372036855ms").is_err());
    }
}
