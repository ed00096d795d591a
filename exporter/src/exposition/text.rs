//! Text format 0.0.4's own lines and the escaping and numbers both
//! formats share.

use super::family::{Family, Kind};

/// `# HELP` (unless empty) and `# TYPE` lines of `f`.
pub(super) fn header(f: &Family, out: &mut Vec<u8>) {
    if !f.help.is_empty() {
        out.extend_from_slice(b"# HELP ");
        out.extend_from_slice(f.name.as_bytes());
        out.push(b' ');
        escape(out, f.help, false);
        out.push(b'\n');
    }
    out.extend_from_slice(b"# TYPE ");
    out.extend_from_slice(f.name.as_bytes());
    out.extend_from_slice(match f.kind {
        Kind::Gauge | Kind::Info => b" gauge\n",
        Kind::Counter => b" counter\n",
    });
}

/// `name="escaped value"`.
pub(super) fn label(out: &mut Vec<u8>, name: &str, value: &str) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"=\"");
    escape(out, value, true);
    out.push(b'"');
}

/// Appends `s` escaped as the text format wants: backslash and line feed
/// always, double quote in label values (`quote`).
pub fn escape(out: &mut Vec<u8>, s: &str, quote: bool) {
    let special = |b: u8| b == b'\\' || b == b'\n' || (quote && b == b'"');
    let bytes = s.as_bytes();
    let mut from = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if special(b) {
            out.extend_from_slice(&bytes[from..i]);
            out.extend_from_slice(match b {
                b'\n' => b"\\n",
                b'"' => b"\\\"",
                _ => b"\\\\",
            });
            from = i + 1;
        }
    }
    out.extend_from_slice(&bytes[from..]);
}

/// A sample value as Prometheus parses it: integers (the usual case: bytes,
/// counts) without a fraction or exponent, the rest in Rust's shortest
/// round-trip form, and `NaN`, `+Inf`, `-Inf`.
pub fn value(out: &mut Vec<u8>, v: f64) {
    /// Below this every integer is exact in an f64, so its digits are also
    /// its shortest round-trip form (what `Display` would write).
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    if v.is_nan() {
        out.extend_from_slice(b"NaN");
    } else if v.is_infinite() {
        out.extend_from_slice(if v > 0.0 { b"+Inf" } else { b"-Inf" });
    } else if v.fract() == 0.0 && v.abs() < EXACT && !(v == 0.0 && v.is_sign_negative()) {
        if v < 0.0 {
            out.push(b'-');
        }
        decimal(out, v.abs() as u64);
    } else {
        use std::io::Write;
        write!(out, "{v}").expect("writing to a Vec cannot fail");
    }
}

pub(super) fn decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}
