//! The exposition: what collectors produce ([`family`]) and how it becomes
//! the body of a scrape, in text format 0.0.4 or OpenMetrics 1.0. The
//! family model is shared; [`text`] and [`openmetrics`] hold what each
//! format writes its own way (the latter also picks the format from
//! `Accept`), [`encoder`] writes samples in either, and [`renderer`] makes a
//! scrape's body, reusing what did not change since the last.
//!
//! [`Encoder`] writes the text exposition format directly: each volume's
//! label string is escaped once per scrape and copied into every family's
//! sample line.
//!
//! Not the `prometheus` crate's `TextEncoder`: it needs every sample as a
//! `proto::Metric` with owned label strings, and building those dominated
//! the scrape at 10,000 volumes (`encoder_speed` in the tests measures both on
//! the same families, about ten times apart). The output is the same text
//! (`+Inf`/`-Inf` aside, which the crate writes as Rust's `inf`);
//! `same_text_as_the_prometheus_crate` compares both encoders line by line.
//! No gzip here: compressing a whole scrape costs many times the encoding,
//! which is why `crate::deflate` compresses only the runs that changed.

mod encoder;
mod family;
mod openmetrics;
mod renderer;
#[cfg(test)]
mod tests;
mod text;

pub use encoder::{Created, Encoder};
pub use family::{recycle, Extra, Family, Kind, Labels, Sample, SharedLabel, VOLUME_LABELS};
pub use openmetrics::{negotiate, Format};
pub use renderer::{encode_all, encode_all_as, Rendered, Renderer, Wire};
pub use text::{escape, value};
