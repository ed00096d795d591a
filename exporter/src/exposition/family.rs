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

    /// Room for `n` samples, in a buffer of a family already sent where
    /// one is large enough (see [`recycle`]).
    pub fn with_capacity(mut self, n: usize) -> Family {
        if n >= SPARE_MIN {
            self.samples = SPARE.take(n);
        }
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

/// Sample buffers of the families last sent, for the next scrape's. A
/// family of every volume is some 320 KB at 10,000 volumes; allocated
/// afresh, its pages are new to the process, and each costs a page fault at
/// its first sample, at every scrape. Kept, they are the same pages.
static SPARE: Spare = Spare(std::sync::Mutex::new(Vec::new()));

/// Buffers for fewer samples than this are neither kept nor looked for:
/// malloc serves them from pages it holds already.
const SPARE_MIN: usize = 1024;

struct Spare(std::sync::Mutex<Vec<Vec<Sample>>>);

impl Spare {
    /// The smallest kept buffer with room for `n` samples, or a new one.
    fn take(&self, n: usize) -> Vec<Sample> {
        let mut spare = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let best = spare
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= n)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        best.map(|i| spare.swap_remove(i)).unwrap_or_default()
    }

    /// Keeps the large sample buffers of `families`, emptied, in place of
    /// those kept before and not taken: what is kept is at most what one
    /// scrape used.
    fn keep(&self, families: Vec<Family>) {
        let kept: Vec<Vec<Sample>> = families
            .into_iter()
            .filter(|f| f.samples.capacity() >= SPARE_MIN)
            .map(|f| {
                let mut samples = f.samples;
                samples.clear();
                samples
            })
            .collect();
        let old = std::mem::replace(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()), kept);
        // Freed outside the lock.
        drop(old);
    }
}

/// Keeps the sample buffers of a scrape's `families`, once sent, for the
/// next scrape's [`Family::with_capacity`].
pub fn recycle(families: Vec<Family>) {
    SPARE.keep(families);
}

#[cfg(test)]
mod spare_tests {
    use super::*;

    fn family(n: usize) -> Family {
        let mut f = Family::gauge("g", "h");
        f.samples = Vec::with_capacity(n);
        for i in 0..n {
            f.volume(i, 1.0);
        }
        f
    }

    #[test]
    fn a_sent_familys_buffer_serves_the_next_scrape_empty() {
        let spare = Spare(std::sync::Mutex::new(Vec::new()));
        let (big, bigger, small) = (family(2000), family(5000), family(SPARE_MIN - 1));
        let (p_big, p_bigger) = (big.samples.as_ptr(), bigger.samples.as_ptr());
        spare.keep(vec![bigger, small, big]);
        assert_eq!(
            spare.0.lock().unwrap().len(),
            2,
            "the small one is not kept"
        );
        // The smallest that fits.
        let b = spare.take(1500);
        assert_eq!((b.as_ptr(), b.len()), (p_big, 0));
        let b = spare.take(3000);
        assert_eq!(b.as_ptr(), p_bigger);
        // None left that fits: a new one.
        assert_eq!(spare.take(1500).capacity(), 0);
        // What a later scrape keeps replaces what was not taken.
        spare.keep(vec![family(3000)]);
        spare.keep(vec![family(1200)]);
        assert_eq!(spare.take(2000).capacity(), 0);
        assert!(spare.take(1100).capacity() >= 1200);
    }
}
