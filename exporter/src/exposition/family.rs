//! What collectors produce: metric families of one scrape, their
//! per-volume samples kept compact (an index into the scrape's
//! [`Inventory`](crate::inventory::Inventory) instead of three label
//! strings each): at 10,000 volumes a scrape has ~160,000 series.
//! Collectors build fresh families on every scrape, so a deleted volume's
//! series are gone at the next scrape.

/// The label names every per-volume series carries, in this order.
pub const VOLUME_LABELS: [&str; 3] = ["namespace", "node_pool", "volume_id"];

/// Extra bounded labels of a per-volume series (`resource`, `limit`,
/// `reason`, …): static pairs, so no allocation per sample.
pub type Extra = &'static [(&'static str, &'static str)];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
    /// A family named `…_info` whose every sample is 1 and whose labels are
    /// the information: `info` in OpenMetrics, a gauge in text 0.0.4.
    Info,
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
    /// One label whose value the collector holds already (an allocation's
    /// ID, validated when found): shared, not copied, per sample; then
    /// `extra`. Boxed so that the variants every volume has keep a
    /// [`Sample`] at 32 bytes rather than 64: a scrape at 10,000 volumes
    /// builds some 150,000 of them.
    Shared(Box<SharedLabel>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct SharedLabel {
    pub name: &'static str,
    pub value: std::sync::Arc<str>,
    pub extra: Extra,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub labels: Labels,
    pub value: f64,
}

// Every byte here is paid 150,000 times a scrape at 10,000 volumes, in
// fresh pages: keep the per-volume variants small.
const _: () = assert!(std::mem::size_of::<Sample>() == 32);

/// One metric family of one scrape.
#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
    pub samples: Vec<Sample>,
    /// Empty, or for each sample of a counter the time (seconds since the
    /// epoch) since which its count is known to have counted from zero:
    /// OpenMetrics' `_created`. Beside the samples rather than in them, so
    /// the families without it (most of a scrape) carry nothing for it.
    pub created: Vec<f64>,
}

impl Family {
    fn of(kind: Kind, name: &'static str, help: &'static str) -> Family {
        Family {
            name,
            help,
            kind,
            samples: Vec::new(),
            created: Vec::new(),
        }
    }

    pub fn gauge(name: &'static str, help: &'static str) -> Family {
        Family::of(Kind::Gauge, name, help)
    }

    /// A counter: its name ends in `_total` (OpenMetrics names the family
    /// without it, and the samples with it).
    pub fn counter(name: &'static str, help: &'static str) -> Family {
        debug_assert!(name.ends_with("_total"), "counter {name} without _total");
        Family::of(Kind::Counter, name, help)
    }

    /// An info metric: named `…_info`, every sample 1.
    pub fn info_metric(name: &'static str, help: &'static str) -> Family {
        debug_assert!(name.ends_with("_info"), "info metric {name} without _info");
        Family::of(Kind::Info, name, help)
    }

    /// A counter sample of volume `index` whose count started from zero at
    /// `created` (seconds since the epoch). Every sample of a family that
    /// has one has one.
    pub fn volume_since(&mut self, index: usize, extra: Extra, value: f64, created: f64) {
        debug_assert_eq!(self.created.len(), self.samples.len());
        self.volume_with(index, extra, value);
        self.created.push(created);
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

    pub fn labelled_shared(
        &mut self,
        name: &'static str,
        value: &std::sync::Arc<str>,
        extra: Extra,
        v: f64,
    ) {
        self.samples.push(Sample {
            labels: Labels::Shared(Box::new(SharedLabel {
                name,
                value: value.clone(),
                extra,
            })),
            value: v,
        });
    }

    pub fn labelled(&mut self, labels: Vec<(&'static str, String)>, value: f64) {
        self.samples.push(Sample {
            labels: Labels::Owned(labels.into_boxed_slice()),
            value,
        });
    }
}
