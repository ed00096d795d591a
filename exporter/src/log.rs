//! A tiny structured logger: one line per event on stderr, logfmt
//! (`ts=2026-01-02T03:04:05.678Z level=info msg="…" key=value`, the format
//! node_exporter and the rest of the Prometheus ecosystem print) or, with
//! `--log.format json`, one JSON object with the same keys (node_exporter's
//! other format, for log pipelines that parse JSON).
//!
//! Values may come from volume authors (paths, file names, error text), so
//! every value is quoted and escaped when it needs to be: a newline or a quote
//! in a value can never start a forged log line.

use std::fmt::{self, Display, Write as _};
use std::io::Write as _;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Severity, most severe first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Level {
    Error = 0,
    Warn = 1,
    Info = 2,
    Debug = 3,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Info as u8);

/// How a line is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Logfmt = 0,
    Json = 1,
}

static FORMAT: AtomicU8 = AtomicU8::new(Format::Logfmt as u8);

pub fn set_format(format: Format) {
    FORMAT.store(format as u8, Ordering::Relaxed);
}

pub fn set_level(level: Level) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

pub fn enabled(level: Level) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// Writes one event. Use the macros ([`crate::info!`] …) rather than this.
pub fn emit(level: Level, msg: &str, fields: &[(&str, &dyn Display)]) {
    let line = if FORMAT.load(Ordering::Relaxed) == Format::Json as u8 {
        format_json(SystemTime::now(), level, msg, fields)
    } else {
        format_line(SystemTime::now(), level, msg, fields)
    };
    // One write of a whole line: concurrent events never interleave.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

pub fn format_line(
    now: SystemTime,
    level: Level,
    msg: &str,
    fields: &[(&str, &dyn Display)],
) -> String {
    let mut line = String::with_capacity(96);
    let _ = write!(line, "ts={} level={} msg=", Rfc3339(now), level.as_str());
    push_value(&mut line, msg);
    let mut buf = String::new();
    for (key, value) in fields {
        buf.clear();
        let _ = write!(buf, "{value}");
        line.push(' ');
        line.push_str(key);
        line.push('=');
        push_value(&mut line, &buf);
    }
    line.push('\n');
    line
}

/// One event as a JSON object on one line: `ts`, `level`, `msg`, then the
/// fields, every value a string (escaped by serde_json: no value can end
/// the line or the object).
pub fn format_json(
    now: SystemTime,
    level: Level,
    msg: &str,
    fields: &[(&str, &dyn Display)],
) -> String {
    let mut obj = serde_json::Map::with_capacity(3 + fields.len());
    obj.insert("ts".into(), Rfc3339(now).to_string().into());
    obj.insert("level".into(), level.as_str().into());
    obj.insert("msg".into(), msg.into());
    for (key, value) in fields {
        obj.insert((*key).to_string(), value.to_string().into());
    }
    let mut line = serde_json::Value::Object(obj).to_string();
    line.push('\n');
    line
}

/// Appends `v` bare when it is a plain token, else quoted with `\`, `"` and
/// control characters escaped.
fn push_value(out: &mut String, v: &str) {
    let plain = !v.is_empty()
        && v.chars()
            .all(|c| !c.is_control() && c != ' ' && c != '"' && c != '=' && c != '\\');
    if plain {
        out.push_str(v);
        return;
    }
    out.push('"');
    for c in v.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// UTC timestamp with milliseconds, e.g. `2026-01-02T03:04:05.678Z`.
struct Rfc3339(SystemTime);

impl Display for Rfc3339 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0.duration_since(UNIX_EPOCH).unwrap_or_default();
        let secs = d.as_secs();
        let (days, rem) = (secs / 86_400, secs % 86_400);
        let (y, m, day) = civil_from_days(days as i64);
        write!(
            f,
            "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
            rem / 3600,
            rem / 60 % 60,
            rem % 60,
            d.subsec_millis()
        )
    }
}

/// Days since 1970-01-01 to (year, month, day), Howard Hinnant's algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// `log!(Level::Info, "message", key = value, …)`: values are anything that
/// implements `Display`; nothing is formatted when the level is off.
#[macro_export]
macro_rules! log {
    ($level:expr, $msg:expr $(, $key:ident = $value:expr)* $(,)?) => {
        if $crate::log::enabled($level) {
            $crate::log::emit(
                $level,
                &$msg,
                &[$((stringify!($key), &$value as &dyn ::std::fmt::Display)),*],
            );
        }
    };
}

#[macro_export]
macro_rules! error {
    ($($t:tt)*) => { $crate::log!($crate::log::Level::Error, $($t)*) };
}

#[macro_export]
macro_rules! warn {
    ($($t:tt)*) => { $crate::log!($crate::log::Level::Warn, $($t)*) };
}

#[macro_export]
macro_rules! info {
    ($($t:tt)*) => { $crate::log!($crate::log::Level::Info, $($t)*) };
}

#[macro_export]
macro_rules! debug {
    ($($t:tt)*) => { $crate::log!($crate::log::Level::Debug, $($t)*) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_are_one_object_with_every_field_escaped() {
        let path = "/v/a\"b\nlevel=error";
        let line = format_json(
            UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_123),
            Level::Warn,
            "a \"message\"",
            &[("path", &path), ("n", &3)],
        );
        assert!(
            line.ends_with('\n') && line.matches('\n').count() == 1,
            "{line}"
        );
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["ts"], "2023-11-14T22:13:20.123Z");
        assert_eq!(v["level"], "warn");
        assert_eq!(v["msg"], "a \"message\"");
        assert_eq!(v["path"], path);
        assert_eq!(v["n"], "3");
    }

    use std::time::Duration;

    #[test]
    fn lines_are_logfmt_with_escaped_values() {
        let t = UNIX_EPOCH + Duration::from_millis(1_767_323_045_678);
        let path = "/srv/vols/a b\n\"x\"";
        let line = format_line(
            t,
            Level::Warn,
            "registry record is unreadable",
            &[("file", &path), ("count", &3), ("empty", &"")],
        );
        assert_eq!(
            line,
            "ts=2026-01-02T03:04:05.678Z level=warn msg=\"registry record is unreadable\" \
             file=\"/srv/vols/a b\\n\\\"x\\\"\" count=3 empty=\"\"\n"
        );
        assert_eq!(line.matches('\n').count(), 1);
    }

    #[test]
    fn dates_cross_leap_years_and_centuries() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(19_783), (2024, 3, 1));
    }

    #[test]
    fn levels_filter() {
        set_level(Level::Warn);
        assert!(enabled(Level::Error) && enabled(Level::Warn));
        assert!(!enabled(Level::Info) && !enabled(Level::Debug));
        set_level(Level::Info);
    }
}
