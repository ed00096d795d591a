//! [`Encoder`]: one sample line, or one family's header, written straight
//! into bytes, in text 0.0.4 or OpenMetrics.

use super::family::{Family, Kind, Labels, Sample, SharedLabel};
use super::openmetrics::{self, Format};
use super::text::{self, decimal, label, value};
use crate::inventory::Inventory;

/// Writes families in the text exposition format (0.0.4) for one scrape's
/// inventory.
///
/// It escapes every volume's `namespace="…",node_pool="…",volume_id="…"`
/// once, when the first per-volume sample is written, and every per-volume
/// sample of every family reuses that string. Not before: a scrape whose
/// per-volume runs are all cached writes only the exporter's own samples,
/// and escaping 1,000 volumes for them was 3 % of the exporter's CPU time
/// at every scrape. Escaping follows the
/// format: in label values backslash, double quote and line feed; in HELP
/// backslash and line feed. Values are written as Prometheus parses them
/// (`NaN`, `+Inf`, `-Inf`, integers without a fraction).
pub struct Encoder<'a> {
    inventory: &'a Inventory,
    volume_labels: std::cell::OnceCell<VolumeLabels>,
    format: Format,
    /// Which `_created` lines counters get (OpenMetrics only).
    created: Created,
}

/// The `_created` lines of an OpenMetrics exposition
/// (`--web.openmetrics.created-samples`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Created {
    /// None: a Prometheus that does not ingest created timestamps stores
    /// each `_created` as a series of its own, one more per counter series.
    #[default]
    Off,
    /// Each counter sample's own creation time, else `since` (none when
    /// `None`).
    On { since: Option<f64> },
}

impl Created {
    /// The `_created` of a counter sample whose own creation time is `own`.
    fn of(self, own: Option<f64>) -> Option<f64> {
        match self {
            Created::Off => None,
            Created::On { since } => own.or(since),
        }
    }
}

/// The escaped label strings of all volumes, one after the other, and where
/// volume `i`'s ends.
struct VolumeLabels {
    labels: String,
    ends: Vec<usize>,
}

impl VolumeLabels {
    fn of(inventory: &Inventory) -> VolumeLabels {
        let mut labels = Vec::with_capacity(inventory.volumes.len() * 96);
        let mut ends = Vec::with_capacity(inventory.volumes.len());
        for v in &inventory.volumes {
            for (i, (name, value)) in [
                ("namespace", &v.namespace),
                ("node_pool", &v.node_pool),
                ("volume_id", &v.volume_id),
            ]
            .into_iter()
            .enumerate()
            {
                if i > 0 {
                    labels.push(b',');
                }
                label(&mut labels, name, value);
            }
            ends.push(labels.len());
        }
        let labels = String::from_utf8(labels).expect("escaping keeps UTF-8");
        VolumeLabels { labels, ends }
    }
}

impl<'a> Encoder<'a> {
    pub fn new(inventory: &'a Inventory) -> Encoder<'a> {
        Encoder::with_format(inventory, Format::Text, Created::Off)
    }

    /// An encoder for `format`, whose counters get the `_created` lines of
    /// `created` in OpenMetrics.
    pub fn with_format(inventory: &'a Inventory, format: Format, created: Created) -> Encoder<'a> {
        Encoder {
            inventory,
            volume_labels: std::cell::OnceCell::new(),
            format,
            created,
        }
    }

    /// The escaped label string of volume `index` (no braces).
    fn volume(&self, index: u32) -> &str {
        let VolumeLabels { labels, ends } = self
            .volume_labels
            .get_or_init(|| VolumeLabels::of(self.inventory));
        let i = index as usize;
        let start = if i == 0 { 0 } else { ends[i - 1] };
        &labels[start..ends[i]]
    }

    /// Appends the exposition of `f` to `out`: its header and every
    /// sample. A family without samples writes nothing (the format has no
    /// empty families).
    pub fn family(&self, f: &Family, out: &mut Vec<u8>) {
        if f.samples.is_empty() {
            return;
        }
        self.header(f, out);
        for i in 0..f.samples.len() {
            self.sample_of(f, i, out);
        }
    }

    /// `# HELP` (unless empty) and `# TYPE` lines.
    pub fn header(&self, f: &Family, out: &mut Vec<u8>) {
        match self.format {
            Format::Text => text::header(f, out),
            Format::OpenMetrics => openmetrics::header(f, out),
        }
    }

    /// The `_created` of sample `i` of `f` this encoder writes, if any.
    fn created(&self, f: &Family, i: usize) -> Option<f64> {
        if self.format != Format::OpenMetrics || f.kind != Kind::Counter {
            return None;
        }
        self.created.of(f.created.get(i).copied())
    }

    /// Sample `i` of `f`: its line and, in OpenMetrics, a counter's
    /// `_created` line.
    pub fn sample_of(&self, f: &Family, i: usize, out: &mut Vec<u8>) {
        let labels = self.sample(f.name, &f.samples[i], out);
        if let Some(created) = self.created(f, i) {
            openmetrics::created(f.name, labels, created, out);
        }
    }

    /// One sample line of metric `name`; returns where its label set
    /// (braces included) is in `out`.
    pub fn sample(&self, name: &str, s: &Sample, out: &mut Vec<u8>) -> std::ops::Range<usize> {
        out.extend_from_slice(name.as_bytes());
        let start = out.len();
        match &s.labels {
            Labels::None => {}
            Labels::Volume { index, extra } => {
                out.push(b'{');
                out.extend_from_slice(self.volume(*index).as_bytes());
                for (k, v) in extra.iter() {
                    out.push(b',');
                    label(out, k, v);
                }
                out.push(b'}');
            }
            Labels::VolumeInfo { index } => {
                let v = &self.inventory.volumes[*index as usize];
                out.push(b'{');
                out.extend_from_slice(self.volume(*index).as_bytes());
                for (k, val) in [
                    ("volume_name", v.volume_name.as_str()),
                    ("node_id", &v.node_id),
                    ("plugin_id", &v.plugin_id),
                    ("fstype", &v.fstype),
                ] {
                    out.push(b',');
                    label(out, k, val);
                }
                out.extend_from_slice(b",project_id=\"");
                decimal(out, u64::from(v.project_id));
                out.push(b'"');
                // Only where set: the label of kubernetes-mixin's opt-out,
                // which the alerts match on `="true"`.
                if v.excluded_from_alerts {
                    out.extend_from_slice(b",excluded_from_alerts=\"true\"");
                }
                out.push(b'}');
            }
            Labels::Shared(shared) => {
                let SharedLabel { name, value, extra } = &**shared;
                out.push(b'{');
                label(out, name, value);
                for (k, v) in extra.iter() {
                    out.push(b',');
                    label(out, k, v);
                }
                out.push(b'}');
            }
            Labels::Owned(pairs) => {
                if !pairs.is_empty() {
                    for (i, (k, v)) in pairs.iter().enumerate() {
                        out.push(if i == 0 { b'{' } else { b',' });
                        label(out, k, v);
                    }
                    out.push(b'}');
                }
            }
        }
        let labels = start..out.len();
        out.push(b' ');
        value(out, s.value);
        out.push(b'\n');
        labels
    }
}
