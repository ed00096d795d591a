//! What collectors produce and how it becomes the text exposition.
//!
//! Collectors build fresh [`Family`] values on every scrape, so a deleted
//! volume's series are gone at the next scrape. A family keeps its per-volume
//! samples compact (an index into the scrape's [`Inventory`] instead of three
//! label strings each): at 10,000 volumes a scrape has ~160,000 series, and
//! materialising them all as `proto::MetricFamily` at once would cost more
//! memory than the whole exporter is allowed. [`Family::encode`] turns a
//! family into `proto::MetricFamily` a batch at a time and lets the
//! `prometheus` crate's `TextEncoder` do the formatting and label escaping.

use prometheus::proto::{self, MetricType};
use prometheus::{Encoder, TextEncoder};

use crate::inventory::Inventory;

pub use prometheus::TEXT_FORMAT;

/// The label names every per-volume series carries, in this order.
pub const VOLUME_LABELS: [&str; 3] = ["namespace", "node_pool", "volume_id"];

/// Extra bounded labels of a per-volume series (`resource`, `limit`,
/// `reason`, …): static pairs, so no allocation per sample.
pub type Extra = &'static [(&'static str, &'static str)];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Labels {
    /// No labels.
    None,
    /// `namespace`, `node_pool`, `volume_id` of inventory volume `index`,
    /// then `extra`.
    Volume { index: u32, extra: Extra },
    /// The per-volume labels plus everything `nomad_host_volume_info` carries.
    VolumeInfo { index: u32 },
    /// Arbitrary labels of an exporter self metric (collector names, paths
    /// the operator configured): never values from volume authors.
    Owned(Box<[(&'static str, String)]>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub labels: Labels,
    pub value: f64,
}

/// One metric family of one scrape.
#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
    pub samples: Vec<Sample>,
}

/// Metrics per `proto::MetricFamily` built at once while encoding.
const BATCH: usize = 1024;

impl Family {
    pub fn gauge(name: &'static str, help: &'static str) -> Family {
        Family {
            name,
            help,
            kind: Kind::Gauge,
            samples: Vec::new(),
        }
    }

    pub fn counter(name: &'static str, help: &'static str) -> Family {
        Family {
            name,
            help,
            kind: Kind::Counter,
            samples: Vec::new(),
        }
    }

    pub fn with_capacity(mut self, n: usize) -> Family {
        self.samples.reserve_exact(n);
        self
    }

    /// A sample of volume `index` of the scrape's inventory.
    pub fn volume(&mut self, index: usize, value: f64) {
        self.volume_with(index, &[], value);
    }

    pub fn volume_with(&mut self, index: usize, extra: Extra, value: f64) {
        self.samples.push(Sample {
            labels: Labels::Volume {
                index: index as u32,
                extra,
            },
            value,
        });
    }

    pub fn info(&mut self, index: usize) {
        self.samples.push(Sample {
            labels: Labels::VolumeInfo {
                index: index as u32,
            },
            value: 1.0,
        });
    }

    pub fn plain(&mut self, value: f64) {
        self.samples.push(Sample {
            labels: Labels::None,
            value,
        });
    }

    pub fn labelled(&mut self, labels: Vec<(&'static str, String)>, value: f64) {
        self.samples.push(Sample {
            labels: Labels::Owned(labels.into_boxed_slice()),
            value,
        });
    }

    /// Appends the text exposition of this family to `out`. A family without
    /// samples writes nothing (the format has no empty families).
    pub fn encode(&self, inventory: &Inventory, out: &mut Vec<u8>) -> prometheus::Result<()> {
        for b in 0..self.batches() {
            self.encode_batch(inventory, b, out)?;
        }
        Ok(())
    }

    /// How many pieces [`Family::encode_batch`] writes this family in.
    pub fn batches(&self) -> usize {
        self.samples.len().div_ceil(BATCH)
    }

    /// Appends piece `batch` of the exposition: the header and the first
    /// samples for batch 0, only samples after that. Lets a large family be
    /// streamed without building all of it at once.
    pub fn encode_batch(
        &self,
        inventory: &Inventory,
        batch: usize,
        out: &mut Vec<u8>,
    ) -> prometheus::Result<()> {
        let Some(chunk) = self.samples.chunks(BATCH).nth(batch) else {
            return Ok(());
        };
        let mut mf = proto::MetricFamily::default();
        mf.set_name(self.name.to_string());
        mf.set_field_type(match self.kind {
            Kind::Gauge => MetricType::GAUGE,
            Kind::Counter => MetricType::COUNTER,
        });
        if batch == 0 {
            mf.set_help(self.help.to_string());
        }
        let metrics = mf.mut_metric();
        metrics.reserve_exact(chunk.len());
        for s in chunk {
            metrics.push(self.metric(inventory, s));
        }
        let start = out.len();
        TextEncoder::new().encode(std::slice::from_ref(&mf), out)?;
        if batch > 0 {
            // A later batch repeats only the `# TYPE` line (help is empty):
            // drop it so the family has one header.
            let nl = out[start..]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(0, |p| p + 1);
            out.drain(start..start + nl);
        }
        Ok(())
    }

    fn metric(&self, inventory: &Inventory, s: &Sample) -> proto::Metric {
        let mut m = proto::Metric::default();
        let mut labels = Vec::new();
        let mut push = |name: &str, value: &str| {
            let mut lp = proto::LabelPair::default();
            lp.set_name(name.to_string());
            lp.set_value(value.to_string());
            labels.push(lp);
        };
        match &s.labels {
            Labels::None => {}
            Labels::Volume { index, extra } => {
                let v = &inventory.volumes[*index as usize];
                push("namespace", &v.namespace);
                push("node_pool", &v.node_pool);
                push("volume_id", &v.volume_id);
                for (k, val) in extra.iter() {
                    push(k, val);
                }
            }
            Labels::VolumeInfo { index } => {
                let v = &inventory.volumes[*index as usize];
                push("namespace", &v.namespace);
                push("node_pool", &v.node_pool);
                push("volume_id", &v.volume_id);
                push("volume_name", &v.volume_name);
                push("node_id", &v.node_id);
                push("plugin_id", &v.plugin_id);
                push("fstype", &v.fstype);
                push("project_id", &v.project_id.to_string());
            }
            Labels::Owned(pairs) => {
                for (k, val) in pairs.iter() {
                    push(k, val);
                }
            }
        }
        m.set_label(labels);
        match self.kind {
            Kind::Gauge => {
                let mut g = proto::Gauge::default();
                g.set_value(s.value);
                m.set_gauge(g);
            }
            Kind::Counter => {
                let mut c = proto::Counter::default();
                c.set_value(s.value);
                m.set_counter(c);
            }
        }
        m
    }
}

/// Encodes whole families into one string (tests and small outputs; the HTTP
/// layer streams family by family instead).
pub fn encode_all(families: &[Family], inventory: &Inventory) -> prometheus::Result<String> {
    let mut out = Vec::new();
    for f in families {
        f.encode(inventory, &mut out)?;
    }
    Ok(String::from_utf8(out).expect("the text encoder writes UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::tests::volume;

    #[test]
    fn per_volume_series_carry_exactly_the_three_labels_escaped() {
        let inv = Inventory::for_tests(vec![volume("ns\"1", "pool\\a", 7)]);
        let mut f = Family::gauge("nomad_host_volume_x_bytes", "An \\ example.\nSecond line.");
        f.volume(0, 5.0);
        f.volume_with(0, &[("reason", "timeout")], 1.0);
        let text = encode_all(&[f], &inv).unwrap();
        let id = &inv.volumes[0].volume_id;
        assert_eq!(
            text,
            format!(
                "# HELP nomad_host_volume_x_bytes An \\\\ example.\\nSecond line.\n\
                 # TYPE nomad_host_volume_x_bytes gauge\n\
                 nomad_host_volume_x_bytes{{namespace=\"ns\\\"1\",node_pool=\"pool\\\\a\",volume_id=\"{id}\"}} 5\n\
                 nomad_host_volume_x_bytes{{namespace=\"ns\\\"1\",node_pool=\"pool\\\\a\",volume_id=\"{id}\",reason=\"timeout\"}} 1\n"
            )
        );
    }

    #[test]
    fn large_families_keep_one_header() {
        let vols = (0..2500)
            .map(|i| volume("default", "default", 100 + i))
            .collect();
        let inv = Inventory::for_tests(vols);
        let mut f = Family::counter("nomad_host_volume_y_total", "Y.");
        for i in 0..inv.volumes.len() {
            f.volume(i, i as f64);
        }
        let text = encode_all(&[f], &inv).unwrap();
        assert_eq!(text.matches("# HELP").count(), 1);
        assert_eq!(
            text.matches("# TYPE nomad_host_volume_y_total counter")
                .count(),
            1
        );
        assert_eq!(text.lines().count(), 2 + 2500);
        assert!(text.ends_with(" 2499\n"));
    }

    #[test]
    fn empty_families_write_nothing() {
        let inv = Inventory::for_tests(vec![]);
        let f = Family::gauge("a", "b");
        assert_eq!(encode_all(&[f], &inv).unwrap(), "");
    }
}
