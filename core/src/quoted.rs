//! How an untrusted value is shown in a message. One definition, because the
//! plugin's refusals and the node configuration's errors (which the exporter
//! reports too) must quote values the same safe way.

/// Quotes `s` for an error message: escaped with `{:?}` so control and
/// invisible characters show, and cut to 64 characters so a 1 MB hostile
/// value cannot flood Nomad's output or the agent's log.
pub fn shown(s: &str) -> String {
    const MAX_CHARS: usize = 64;
    match s.char_indices().nth(MAX_CHARS) {
        None => format!("{s:?}"),
        Some((cut, _)) => format!("{:?}… ({} bytes in all)", &s[..cut], s.len()),
    }
}
