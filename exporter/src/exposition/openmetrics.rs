//! OpenMetrics 1.0: which format a scraper asked for, and what the
//! OpenMetrics text writes differently from text 0.0.4.
//!
//! The encoder ([`super::encoder`]) writes both formats; the differences
//! are here:
//!
//! - a counter's family is named without `_total` in `# HELP` and
//!   `# TYPE`, its samples keep it, and each sample is followed by its
//!   `_created` line (the time its count started from zero, seconds since
//!   the epoch) when the exporter knows one;
//! - an info metric (`Kind::Info`) is `# TYPE <name without _info> info`;
//! - HELP escapes `"` too (OpenMetrics' escaped-string);
//! - the exposition ends with `# EOF`.
//!
//! Label values, names and sample values are written as in text 0.0.4: its
//! escaping is OpenMetrics' and its numbers (`NaN`, `+Inf`, integers,
//! Rust's shortest round-trip floats) are OpenMetrics numbers.
//!
//! Negotiation follows client_golang's `expfmt.NegotiateIncludingOpenMetrics`
//! (what promhttp does with `EnableOpenMetrics`): the `Accept` header's
//! media ranges in order of q-value (ties: the more specific first, then
//! as given), the first that names a format this exporter writes wins, and
//! text 0.0.4 when none does. Unlike client_golang, a range with `q=0` is
//! refused, as RFC 9110 says.

use super::family::{Family, Kind};
use super::text::escape;

/// A body's format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Format {
    /// Prometheus text format 0.0.4.
    #[default]
    Text,
    /// OpenMetrics text 1.0.0.
    OpenMetrics,
}

impl Format {
    /// The `Content-Type` of a body in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// The last line of an OpenMetrics exposition.
pub const EOF: &[u8] = b"# EOF\n";

/// The format to answer a request whose `Accept` headers are `accept`.
pub fn negotiate<'a>(accept: impl IntoIterator<Item = &'a [u8]>) -> Format {
    let mut ranges: Vec<Range> = accept
        .into_iter()
        .filter_map(|v| std::str::from_utf8(v).ok())
        .flat_map(|v| v.split(','))
        .filter_map(Range::parse)
        .filter(|r| r.q > 0.0)
        .collect();
    // Stable: equal q and specificity keep the order given.
    ranges.sort_by(|a, b| b.q.total_cmp(&a.q).then(b.specificity.cmp(&a.specificity)));
    ranges
        .iter()
        .find_map(Range::format)
        .unwrap_or(Format::Text)
}

/// One media range of an `Accept` header.
struct Range<'a> {
    media: &'a str,
    version: Option<&'a str>,
    q: f32,
    /// `*/*` < `type/*` < `type/subtype`, then the number of parameters
    /// (goautoneg's order).
    specificity: (u8, usize),
}

impl<'a> Range<'a> {
    fn parse(item: &'a str) -> Option<Range<'a>> {
        let mut parts = item.split(';');
        let media = parts.next()?.trim();
        let (ty, sub) = media.split_once('/')?;
        let mut version = None;
        let mut q = 1.0;
        let mut params = 0;
        for p in parts {
            let Some((k, v)) = p.split_once('=') else {
                continue;
            };
            let (k, v) = (k.trim(), v.trim().trim_matches('"'));
            if k.eq_ignore_ascii_case("q") {
                // A q-value that does not parse refuses the range.
                q = v.parse::<f32>().ok().filter(|q| (0.0..=1.0).contains(q))?;
            } else {
                params += 1;
                if k.eq_ignore_ascii_case("version") {
                    version = Some(v);
                }
            }
        }
        let rank = match (ty.trim(), sub.trim()) {
            ("*", _) => 0,
            (_, "*") => 1,
            _ => 2,
        };
        Some(Range {
            media,
            version,
            q,
            specificity: (rank, params),
        })
    }

    /// The format this range asks for, if this exporter writes it.
    fn format(&self) -> Option<Format> {
        let is = |m: &str| self.media.eq_ignore_ascii_case(m);
        if is("application/openmetrics-text")
            && matches!(self.version, None | Some("1.0.0" | "0.0.1"))
        {
            Some(Format::OpenMetrics)
        } else if is("text/plain") && matches!(self.version, None | Some("0.0.4")) {
            Some(Format::Text)
        } else {
            None
        }
    }
}

/// The name OpenMetrics gives `f`'s family: a counter's without `_total`,
/// an info metric's without `_info`.
pub fn family_name(f: &Family) -> &'static str {
    match f.kind {
        Kind::Counter => f.name.strip_suffix("_total").unwrap_or(f.name),
        Kind::Info => f.name.strip_suffix("_info").unwrap_or(f.name),
        Kind::Gauge => f.name,
    }
}

/// `# HELP` (unless empty) and `# TYPE` lines of `f` in OpenMetrics.
pub fn header(f: &Family, out: &mut Vec<u8>) {
    let name = family_name(f).as_bytes();
    if !f.help.is_empty() {
        out.extend_from_slice(b"# HELP ");
        out.extend_from_slice(name);
        out.push(b' ');
        escape(out, f.help, true);
        out.push(b'\n');
    }
    out.extend_from_slice(b"# TYPE ");
    out.extend_from_slice(name);
    out.extend_from_slice(match f.kind {
        Kind::Gauge => b" gauge\n",
        Kind::Counter => b" counter\n",
        Kind::Info => b" info\n",
    });
}

/// The `_created` line of counter `name` (`…_total`) for the sample just
/// written to `out`, whose label set is at `labels` in `out`.
pub fn created(name: &str, labels: std::ops::Range<usize>, created: f64, out: &mut Vec<u8>) {
    out.extend_from_slice(name.strip_suffix("_total").unwrap_or(name).as_bytes());
    out.extend_from_slice(b"_created");
    out.extend_from_within(labels);
    out.push(b' ');
    super::text::value(out, created);
    out.push(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn neg(headers: &[&str]) -> Format {
        negotiate(headers.iter().map(|h| h.as_bytes()))
    }

    #[test]
    fn accept_headers_pick_the_format_promhttp_would() {
        use Format::{OpenMetrics as Om, Text};
        let cases: &[(&[&str], Format)] = &[
            (&[], Text),
            (&[""], Text),
            (&["*/*"], Text),
            (&["text/plain"], Text),
            (&["text/plain; version=0.0.4"], Text),
            (&["application/openmetrics-text"], Om),
            (&["application/openmetrics-text; version=1.0.0"], Om),
            (&["application/openmetrics-text;version=0.0.1"], Om),
            (&["APPLICATION/OpenMetrics-Text; Version=\"1.0.0\""], Om),
            // Versions this exporter does not write.
            (&["application/openmetrics-text; version=2.0.0"], Text),
            (&["application/openmetrics-text; version=2.0.0, text/plain;q=0.1"], Text),
            (&["text/plain;version=1.0.0;escaping=allow-utf-8"], Text),
            // Prometheus 2's default scrape_protocols.
            (&["application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"], Om),
            // Prometheus 3's.
            (&["application/openmetrics-text;version=1.0.0;escaping=allow-utf-8,application/openmetrics-text;version=0.0.1;q=0.8,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.6,text/plain;version=0.0.4;q=0.4,*/*;q=0.1"], Om),
            // Prometheus with scrape_protocols: [PrometheusText0.0.4, OpenMetricsText1.0.0].
            (&["text/plain;version=0.0.4,application/openmetrics-text;version=1.0.0;q=0.9,*/*;q=0.8"], Text),
            // q-values rank, whatever the order.
            (&["text/plain;q=0.5, application/openmetrics-text;q=0.9"], Om),
            (&["application/openmetrics-text;q=0.4, text/plain;version=0.0.4;q=0.5"], Text),
            // Equal q: the order given.
            (&["application/openmetrics-text, text/plain"], Om),
            (&["text/plain, application/openmetrics-text"], Text),
            // q=0 refuses; a broken q-value refuses its range.
            (&["application/openmetrics-text;q=0, text/plain;q=0.1"], Text),
            (&["application/openmetrics-text;q=0"], Text),
            (&["application/openmetrics-text;q=abc, */*"], Text),
            (&["application/openmetrics-text;q=1.5"], Text),
            // Several Accept headers are one list.
            (&["text/plain;q=0.2", "application/openmetrics-text;q=0.3"], Om),
            // Junk.
            (&["garbage, ;;;, /, application/openmetrics-text"], Om),
        ];
        for (headers, want) in cases {
            assert_eq!(neg(headers), *want, "{headers:?}");
        }
    }
}
