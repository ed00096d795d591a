//! What collectors produce and how it becomes the text exposition: text
//! format 0.0.4, or OpenMetrics 1.0 (what it writes differently is in
//! `crate::openmetrics`, which also picks the format from `Accept`).
//!
//! Collectors build fresh [`Family`] values on every scrape, so a deleted
//! volume's series are gone at the next scrape. A family keeps its per-volume
//! samples compact (an index into the scrape's [`Inventory`] instead of three
//! label strings each): at 10,000 volumes a scrape has ~160,000 series.
//! [`Encoder`] writes the text exposition format directly: each volume's
//! label string is escaped once per scrape and copied into every family's
//! sample line, a batch of samples at a time so the HTTP layer can stream.
//!
//! Not the `prometheus` crate's `TextEncoder`: it needs every sample as a
//! `proto::Metric` with owned label strings, and building those dominated
//! the scrape at 10,000 volumes (`encoder_speed` below measures both on
//! the same families, about ten times apart). The output is the same text
//! (`+Inf`/`-Inf` aside, which the crate writes as Rust's `inf`);
//! `same_text_as_the_prometheus_crate` compares both encoders line by line.
//! No gzip here: compressing a whole scrape costs many times the encoding,
//! which is why `crate::deflate` compresses only the runs that changed.

use crate::deflate::{Deflater, Piece};
use crate::inventory::Inventory;
pub use crate::openmetrics::Format;

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
    /// Empty, or for each sample of a counter the time (seconds since the
    /// epoch) since which its count is known to have counted from zero:
    /// OpenMetrics' `_created`. Beside the samples rather than in them, so
    /// the families without it (most of a scrape) carry nothing for it.
    pub created: Vec<f64>,
}

/// Samples written per [`Family::encode_batch`] piece.
const BATCH: usize = 1024;

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

    pub fn labelled(&mut self, labels: Vec<(&'static str, String)>, value: f64) {
        self.samples.push(Sample {
            labels: Labels::Owned(labels.into_boxed_slice()),
            value,
        });
    }

    /// Appends the text exposition of this family to `out`. A family without
    /// samples writes nothing (the format has no empty families).
    pub fn encode(&self, enc: &Encoder, out: &mut Vec<u8>) {
        for b in 0..self.batches() {
            self.encode_batch(enc, b, out);
        }
    }

    /// How many pieces [`Family::encode_batch`] writes this family in.
    pub fn batches(&self) -> usize {
        self.samples.len().div_ceil(BATCH)
    }

    /// Appends piece `batch` of the exposition: the header and the first
    /// samples for batch 0, only samples after that. Lets a large family be
    /// streamed without writing all of it at once.
    pub fn encode_batch(&self, enc: &Encoder, batch: usize, out: &mut Vec<u8>) {
        let Some(chunk) = self.samples.chunks(BATCH).nth(batch) else {
            return;
        };
        if batch == 0 {
            enc.header(self, out);
        }
        let first = batch * BATCH;
        for i in first..first + chunk.len() {
            enc.sample_of(self, i, out);
        }
    }
}

/// Writes families in the text exposition format (0.0.4) for one scrape's
/// inventory.
///
/// It escapes every volume's `namespace="…",node_pool="…",volume_id="…"`
/// once, when the first per-volume sample is written, and every per-volume
/// sample of every family reuses that string. Not before: a scrape whose
/// per-volume runs are all cached writes only the exporter's own samples,
/// and escaping 1,000 volumes for them was 3 % of the exporter's CPU time
/// at every scrape (perf, 1,000 volumes, 6.1 guest). Escaping follows the
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

    /// `# HELP` (unless empty) and `# TYPE` lines.
    pub fn header(&self, f: &Family, out: &mut Vec<u8>) {
        match self.format {
            Format::Text => header(f, out),
            Format::OpenMetrics => crate::openmetrics::header(f, out),
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
            crate::openmetrics::created(f.name, labels, created, out);
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
                out.extend_from_slice(b"\"}");
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

/// `# HELP` (unless empty) and `# TYPE` lines of `f`.
fn header(f: &Family, out: &mut Vec<u8>) {
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
pub(crate) fn label(out: &mut Vec<u8>, name: &str, value: &str) {
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

fn decimal(out: &mut Vec<u8>, mut n: u64) {
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

/// Renders scrape after scrape, reusing the text of the previous one where
/// its inputs did not change: the HTTP layer keeps one and renders every
/// scrape through it.
///
/// Per family (by name) it keeps the previous scrape's text in runs of
/// [`RUN`] sample lines (the first with the family's header), each with
/// what its lines were made from: the volume (the registry's `Arc`, which it
/// reuses for an unchanged record, so the same pointer means the same
/// labels), the extra labels (`&'static`, compared by address) and the
/// value's bits. A run whose samples all match is reused whole, without a
/// copy (the body is a list of shared pieces); a run that changed is written
/// afresh. Samples with owned labels (the exporter's self metrics, a
/// handful) are always written afresh. The previous inventory is held until
/// the next render, so no volume it names can be freed and its address
/// reused.
///
/// With [`Renderer::compressed`] the runs are kept compressed
/// ([`crate::deflate`]): a gzip scrape then compresses only what changed,
/// and the text held between scrapes is a tenth of its size. The cache is
/// the body's own text, held once: runs rather than whole families, so a
/// changed value rewrites some tens of kilobytes rather than a family's
/// megabyte, and each run is allocated at its exact length. What it keeps
/// beside the text is 16 bytes per sample.
#[derive(Default)]
pub struct Renderer {
    previous: Option<std::sync::Arc<Inventory>>,
    families: std::collections::HashMap<&'static str, Vec<Run>>,
    /// The extra label sets met so far, by address and length, numbered
    /// from 1 so a key holds 4 bytes rather than a fat pointer's 16.
    extras: std::collections::HashMap<(usize, usize), u32>,
    /// `Some` to keep the text compressed.
    deflater: Option<Deflater>,
    format: Format,
    /// [`Encoder::with_format`]'s `created`.
    created: Created,
}

/// One scrape's exposition: pieces to send one after the other, and what
/// goes on the wire for them, made once however many scrapers share it.
#[derive(Debug, Default)]
pub struct Rendered {
    pub pieces: Vec<Piece>,
    /// The pieces are compressed ([`crate::deflate`]), not text.
    pub compressed: bool,
    gzip: std::sync::OnceLock<Wire>,
    /// The inflated text while some scraper is sending it: freed after the
    /// last one, so that text is not held between scrapes.
    text: std::sync::Mutex<Option<std::sync::Weak<[bytes::Bytes]>>>,
}

/// A body as sent: its parts one after the other.
pub type Wire = std::sync::Arc<[bytes::Bytes]>;

impl Rendered {
    pub fn new(pieces: Vec<Piece>, compressed: bool) -> Rendered {
        Rendered {
            pieces,
            compressed,
            ..Rendered::default()
        }
    }

    /// The text's length.
    pub fn text_len(&self) -> u64 {
        self.pieces.iter().map(|p| u64::from(p.text_len)).sum()
    }

    /// One gzip member of the compressed pieces as they are: no work but
    /// the trailer's CRC-32, combined from theirs. `None` for text.
    pub fn gzip(&self) -> Option<Wire> {
        if !self.compressed {
            return None;
        }
        Some(
            self.gzip
                .get_or_init(|| {
                    let mut parts = Vec::with_capacity(self.pieces.len() + 2);
                    parts.push(bytes::Bytes::from_static(&crate::deflate::GZIP_HEADER));
                    parts.extend(self.pieces.iter().map(|p| p.bytes.clone()));
                    let trailer = crate::deflate::gzip_trailer(&self.pieces);
                    parts.push(bytes::Bytes::copy_from_slice(&trailer));
                    parts.into()
                })
                .clone(),
        )
    }

    /// The text: the pieces as they are, or inflated once for the scrapers
    /// without gzip that share this body while any of them is sending it.
    /// Inflating takes CPU time: call it where blocking is fine. An error
    /// means a piece is not what [`Deflater`] made, a bug.
    pub fn text(&self) -> Result<Wire, String> {
        if !self.compressed {
            return Ok(self.pieces.iter().map(|p| p.bytes.clone()).collect());
        }
        let mut held = self.text.lock().expect("never poisoned");
        if let Some(text) = held.as_ref().and_then(std::sync::Weak::upgrade) {
            return Ok(text);
        }
        let mut inflater = crate::deflate::Inflater::default();
        let text: Wire = self
            .pieces
            .iter()
            .map(|p| inflater.text(p))
            .collect::<Result<_, _>>()?;
        *held = Some(std::sync::Arc::downgrade(&text));
        Ok(text)
    }
}

/// Sample lines per cached run: some 30 KB of text (the info family's
/// lines are longer), small enough for a changed value to be cheap to
/// rewrite and for malloc to serve from its heap, large enough that a body
/// is a few hundred pieces at 10,000 volumes.
const RUN: usize = 256;

/// Distinct extra label sets past which the cache starts over: they are
/// `&'static` and few (errno, reason, limit kinds), so reaching it means
/// something builds them per scrape, and the table must not grow forever.
const MAX_EXTRAS: usize = 1024;

/// Up to [`RUN`] consecutive sample lines of one family as last rendered.
struct Run {
    keys: Box<[SampleKey]>,
    /// The bits of each line's `_created` where the text has them (an
    /// OpenMetrics counter with its own creation times), else empty: the
    /// text format's runs keep nothing for it.
    created: Box<[u64]>,
    piece: Piece,
}

/// What a sample line is made of: the volume by its index in the inventory
/// the line was rendered for, the extra labels by their number in
/// [`Renderer::extras`] (0 none, `u32::MAX` the info labels), the value's
/// bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SampleKey {
    volume: u32,
    extra: u32,
    value: u64,
}

impl SampleKey {
    /// `None` for a sample that is not cached (no volume labels).
    fn of(
        inventory: &Inventory,
        extras: &mut std::collections::HashMap<(usize, usize), u32>,
        s: &Sample,
    ) -> Option<SampleKey> {
        let (index, extra) = match &s.labels {
            Labels::Volume { index, extra: [] } => (*index, 0),
            Labels::Volume { index, extra } => {
                let next = extras.len() as u32 + 1;
                let id = *extras
                    .entry((extra.as_ptr() as usize, extra.len()))
                    .or_insert(next);
                (*index, id)
            }
            Labels::VolumeInfo { index } => (*index, u32::MAX),
            Labels::None | Labels::Owned(_) => return None,
        };
        inventory.volumes.get(index as usize)?;
        Some(SampleKey {
            volume: index,
            extra,
            value: s.value.to_bits(),
        })
    }
}

impl Renderer {
    /// A renderer that keeps the text as it is: for a server that never
    /// compresses (`--web.disable-compression`).
    pub fn new() -> Renderer {
        Renderer::default()
    }

    /// A renderer that keeps the text compressed.
    pub fn compressed() -> Renderer {
        Renderer {
            deflater: Some(Deflater::default()),
            ..Renderer::default()
        }
    }

    /// This renderer writing `format` (text 0.0.4 unless told), with
    /// [`Encoder::with_format`]'s `created`.
    pub fn with_format(self, format: Format, created: Created) -> Renderer {
        Renderer {
            format,
            created,
            ..self
        }
    }

    /// The exposition of `families` (all of one scrape of `inventory`).
    pub fn render<'f>(
        &mut self,
        inventory: &std::sync::Arc<Inventory>,
        families: impl IntoIterator<Item = &'f Family>,
    ) -> Rendered {
        use std::sync::Arc;
        if self.extras.len() > MAX_EXTRAS {
            self.families.clear();
            self.extras.clear();
        }
        let Renderer {
            previous,
            families: cache,
            extras,
            deflater,
            format,
            created: created_lines,
        } = self;
        let format = *format;
        let compressed = deflater.is_some();
        // A run is kept from scrape to scrape: compressed once, sent many
        // times. Text written afresh at every scrape is stored as it is.
        let mut keep = |text: &[u8]| match deflater {
            Some(d) => d.piece(text),
            None => Piece::plain(bytes::Bytes::copy_from_slice(text)),
        };
        let fresh = |text: &[u8]| {
            if compressed {
                crate::deflate::stored(text)
            } else {
                Piece::plain(bytes::Bytes::copy_from_slice(text))
            }
        };
        // Kept to the end of this render: the cached keys name its volumes.
        let prev = previous.take().unwrap_or_default();
        let same = |old: &SampleKey, new: &SampleKey| {
            old.value == new.value
                && old.extra == new.extra
                && match (
                    prev.volumes.get(old.volume as usize),
                    inventory.volumes.get(new.volume as usize),
                ) {
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    _ => false,
                }
        };
        // Escapes every volume's labels only when a per-volume line is
        // written afresh: not at all in a scrape where nothing changed.
        let enc = Encoder::with_format(inventory, format, *created_lines);
        let mut pieces = Vec::new();
        // Headers and samples of families not cached, up to the next run.
        let mut loose: Vec<u8> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut keys: Vec<SampleKey> = Vec::with_capacity(RUN);
        // A changed run is written here, then kept at its exact length.
        let mut text: Vec<u8> = Vec::new();
        for f in families {
            if f.samples.is_empty() {
                continue;
            }
            // Not cacheable (self metrics), or a name met twice in a scrape.
            let cacheable = f.samples.iter().all(|s| match &s.labels {
                Labels::Volume { index, .. } | Labels::VolumeInfo { index } => {
                    (*index as usize) < inventory.volumes.len()
                }
                Labels::None | Labels::Owned(_) => false,
            });
            if !(cacheable && seen.insert(f.name)) {
                enc.header(f, &mut loose);
                for i in 0..f.samples.len() {
                    enc.sample_of(f, i, &mut loose);
                }
                continue;
            }
            let own_created = format == Format::OpenMetrics
                && *created_lines != Created::Off
                && f.kind == Kind::Counter
                && f.created.len() == f.samples.len();
            if !loose.is_empty() {
                pieces.push(fresh(&loose));
                loose.clear();
            }
            let runs = cache.entry(f.name).or_default();
            runs.truncate(f.samples.len().div_ceil(RUN));
            for (r, chunk) in f.samples.chunks(RUN).enumerate() {
                keys.clear();
                keys.extend(chunk.iter().map(|s| {
                    SampleKey::of(inventory, extras, s).expect("checked cacheable above")
                }));
                let created = &f.created[if own_created {
                    r * RUN..r * RUN + chunk.len()
                } else {
                    0..0
                }];
                match runs.get_mut(r) {
                    Some(old)
                        if old.keys.len() == keys.len()
                            && old.keys.iter().zip(&keys).all(|(a, b)| same(a, b))
                            && old.created.len() == created.len()
                            && old
                                .created
                                .iter()
                                .zip(created)
                                .all(|(a, b)| *a == b.to_bits()) =>
                    {
                        // The same lines, but the volumes' indices may have
                        // moved in the new inventory.
                        old.keys.copy_from_slice(&keys);
                    }
                    old => {
                        text.clear();
                        // The header goes with the first run: it depends on
                        // the family's name alone, the cache's key.
                        if r == 0 {
                            enc.header(f, &mut text);
                        }
                        for i in r * RUN..r * RUN + chunk.len() {
                            enc.sample_of(f, i, &mut text);
                        }
                        let run = Run {
                            keys: keys.as_slice().into(),
                            created: created.iter().map(|c| c.to_bits()).collect(),
                            piece: keep(&text),
                        };
                        match old {
                            Some(o) => *o = run,
                            None => runs.push(run),
                        }
                    }
                }
                pieces.push(runs[r].piece.clone());
            }
        }
        if format == Format::OpenMetrics {
            loose.extend_from_slice(crate::openmetrics::EOF);
        }
        if !loose.is_empty() {
            pieces.push(fresh(&loose));
        }
        // Families gone from this scrape free their text.
        cache.retain(|name, _| seen.contains(name));
        *previous = Some(inventory.clone());
        Rendered::new(pieces, compressed)
    }
}

/// Encodes whole families into one string (tests and small outputs; the HTTP
/// layer streams batch by batch instead).
pub fn encode_all(families: &[Family], inventory: &Inventory) -> String {
    encode_all_as(Format::Text, Created::Off, families, inventory)
}

/// [`encode_all`] in `format` (OpenMetrics ends with `# EOF`).
pub fn encode_all_as(
    format: Format,
    created: Created,
    families: &[Family],
    inventory: &Inventory,
) -> String {
    let enc = Encoder::with_format(inventory, format, created);
    let mut out = Vec::new();
    for f in families {
        f.encode(&enc, &mut out);
    }
    if format == Format::OpenMetrics {
        out.extend_from_slice(crate::openmetrics::EOF);
    }
    String::from_utf8(out).expect("the encoder writes UTF-8")
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
        let text = encode_all(&[f], &inv);
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
        let text = encode_all(&[f], &inv);
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
        assert_eq!(encode_all(&[f], &inv), "");
    }

    #[test]
    fn values_are_written_as_prometheus_parses_them() {
        let text = |v: f64| {
            let mut out = Vec::new();
            value(&mut out, v);
            String::from_utf8(out).unwrap()
        };
        assert_eq!(text(0.0), "0");
        assert_eq!(text(-0.0), "-0");
        assert_eq!(text(5.0), "5");
        assert_eq!(text(-3.0), "-3");
        assert_eq!(text(1_073_741_824.0), "1073741824");
        assert_eq!(text(9_007_199_254_740_991.0), "9007199254740991");
        assert_eq!(text(0.25), "0.25");
        assert_eq!(text(f64::NAN), "NaN");
        assert_eq!(text(f64::INFINITY), "+Inf");
        assert_eq!(text(f64::NEG_INFINITY), "-Inf");
        for v in [
            1e300,
            2f64.powi(60),
            0.001_234,
            1.5e-9,
            18_446_744_073_709_551_615.0,
        ] {
            assert_eq!(text(v).parse::<f64>().unwrap(), v, "{v}");
        }
    }

    #[test]
    fn escaping_follows_the_exposition_format() {
        let esc = |s: &str, quote: bool| {
            let mut out = Vec::new();
            escape(&mut out, s, quote);
            String::from_utf8(out).unwrap()
        };
        assert_eq!(esc("plain", true), "plain");
        assert_eq!(esc("a\\b\"c\nd", true), "a\\\\b\\\"c\\nd");
        assert_eq!(esc("a\\b\"c\nd", false), "a\\\\b\"c\\nd");
        assert_eq!(esc("ünïcödé\n", true), "ünïcödé\\n");
    }

    /// Families like a real scrape's: per-volume gauges and counters, extra
    /// labels, the info family, unlabelled and owned-label self metrics.
    fn scrape_like(inv: &Inventory) -> Vec<Family> {
        let n = inv.volumes.len();
        let mut fams = Vec::new();
        let mut info = Family::gauge("nomad_host_volume_info", "Info.");
        for i in 0..n {
            info.info(i);
        }
        fams.push(info);
        for k in 0..13 {
            let name: &'static str = Box::leak(format!("nomad_host_volume_g{k}_bytes").into());
            let mut f = Family::gauge(name, "A per-volume gauge \\ with\nHELP to escape.");
            for i in 0..n {
                f.volume(i, (i as f64) * 4096.0 * (k + 1) as f64);
            }
            fams.push(f);
        }
        let mut errors = Family::counter("nomad_host_volume_write_errors_total", "Errors.");
        let mut hits = Family::counter("nomad_host_volume_quota_limit_hits_total", "Hits.");
        // One set per errno, as the collectors' `&'static` sets are.
        let errnos: Vec<Extra> = ["ENOSPC", "EDQUOT", "EIO", "EROFS", "other"]
            .into_iter()
            .map(|e| -> Extra { Box::leak(Box::new([("errno", e)])) })
            .collect();
        for i in 0..n {
            for &extra in &errnos {
                errors.volume_with(i, extra, (i % 3) as f64);
            }
            hits.volume_with(i, &[("resource", "bytes"), ("limit", "hard")], 0.0);
        }
        fams.push(errors);
        fams.push(hits);
        let mut durations =
            Family::gauge("prjquota_exporter_scrape_collector_duration_seconds", "D.");
        for (c, v) in [("registry", 0.012_345), ("statfs", 1.5), ("quota", 1e-7)] {
            durations.labelled(vec![("collector", c.to_string())], v);
        }
        fams.push(durations);
        let mut plain = Family::gauge("prjquota_exporter_volumes", "");
        plain.plain(n as f64);
        fams.push(plain);
        fams
    }

    fn inventory(n: u32) -> Inventory {
        let mut vols: Vec<_> = (0..n)
            .map(|i| volume(&format!("ns-{}", i % 7), "default", 1000 + i))
            .collect();
        if let Some(v) = vols.first_mut() {
            v.namespace = "we\"ird\\ns\nx".into();
            v.volume_name = "name \"quoted\"".into();
        }
        Inventory::for_tests(vols)
    }

    /// The `prometheus` crate's `TextEncoder`, fed `proto::Metric`s as this
    /// module did before it wrote the format itself: the reference output.
    mod reference {
        use super::super::*;
        use prometheus::proto::{self, MetricType};
        use prometheus::{Encoder as _, TextEncoder};

        fn metric(f: &Family, inventory: &Inventory, s: &Sample) -> proto::Metric {
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
            match f.kind {
                Kind::Gauge | Kind::Info => {
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

        /// The old batched encoding: one `MetricFamily` per batch, the
        /// repeated `# TYPE` line of later batches cut.
        pub fn encode_all(families: &[Family], inventory: &Inventory) -> String {
            let mut out = Vec::new();
            for f in families {
                for (b, chunk) in f.samples.chunks(BATCH).enumerate() {
                    let mut mf = proto::MetricFamily::default();
                    mf.set_name(f.name.to_string());
                    mf.set_field_type(match f.kind {
                        Kind::Gauge | Kind::Info => MetricType::GAUGE,
                        Kind::Counter => MetricType::COUNTER,
                    });
                    if b == 0 {
                        mf.set_help(f.help.to_string());
                    }
                    let metrics = mf.mut_metric();
                    metrics.reserve_exact(chunk.len());
                    for s in chunk {
                        metrics.push(metric(f, inventory, s));
                    }
                    let start = out.len();
                    TextEncoder::new()
                        .encode(std::slice::from_ref(&mf), &mut out)
                        .unwrap();
                    if b > 0 {
                        let nl = out[start..].iter().position(|&c| c == b'\n').unwrap() + 1;
                        out.drain(start..start + nl);
                    }
                }
            }
            String::from_utf8(out).unwrap()
        }
    }

    #[test]
    fn same_text_as_the_prometheus_crate() {
        let inv = inventory(2100); // three batches per family
        let fams = scrape_like(&inv);
        let ours = encode_all(&fams, &inv);
        let theirs = reference::encode_all(&fams, &inv);
        assert_eq!(ours.len(), theirs.len());
        for (n, (a, b)) in ours.lines().zip(theirs.lines()).enumerate() {
            assert_eq!(a, b, "line {}", n + 1);
        }
        assert_eq!(ours, theirs);
    }

    /// The text of a render, inflated if it was kept compressed.
    fn joined(r: &Rendered) -> String {
        String::from_utf8(r.text().unwrap().concat()).unwrap()
    }

    /// Whether two renders' pieces are the same memory, piece by piece.
    fn shared(a: &Rendered, b: &Rendered) -> Vec<bool> {
        a.pieces
            .iter()
            .zip(&b.pieces)
            .map(|(x, y)| (x.bytes.as_ptr(), x.bytes.len()) == (y.bytes.as_ptr(), y.bytes.len()))
            .collect()
    }

    /// Both ways of keeping the text.
    fn renderers() -> [Renderer; 2] {
        [Renderer::new(), Renderer::compressed()]
    }

    #[test]
    fn the_renderer_writes_what_encode_all_writes_scrape_after_scrape() {
        use std::sync::Arc;
        for mut r in renderers() {
            let first = Arc::new(inventory(2100));
            let fams = scrape_like(&first);
            assert_eq!(joined(&r.render(&first, &fams)), encode_all(&fams, &first));

            // The same volumes (the registry's Arcs), one value changed, one
            // volume gone, one new, a changed record (a new Arc) for another.
            let mut vols = first.volumes.clone();
            vols.remove(5);
            let mut changed = (*vols[7]).clone();
            changed.namespace = "moved".into();
            vols[7] = Arc::new(changed);
            vols.push(Arc::new(crate::inventory::tests::volume("new", "p", 9999)));
            let second = Arc::new(Inventory {
                dirs: first.dirs.clone(),
                volumes: vols,
            });
            let mut fams = scrape_like(&second);
            fams[3].samples[11].value = 123.0;
            let text = joined(&r.render(&second, &fams));
            assert_eq!(text, encode_all(&fams, &second));
            assert!(text.contains("namespace=\"moved\""));
            // And once more unchanged.
            assert_eq!(
                joined(&r.render(&second, &fams)),
                encode_all(&fams, &second)
            );
        }
    }

    #[test]
    fn compressed_runs_hold_a_fraction_of_the_text() {
        use std::sync::Arc;
        let inv = Arc::new(inventory(2100));
        let fams = scrape_like(&inv);
        let r = Renderer::compressed().render(&inv, &fams);
        let kept: usize = r.pieces.iter().map(|p| p.bytes.len()).sum();
        let text = r.text_len() as usize;
        assert_eq!(text, encode_all(&fams, &inv).len());
        assert!(kept * 5 < text, "{text} bytes of text kept in {kept}");
    }

    #[test]
    fn an_unchanged_family_is_reused_without_a_copy() {
        use std::sync::Arc;
        for mut r in renderers() {
            let inv = Arc::new(inventory(50));
            let fams = scrape_like(&inv);
            let a = r.render(&inv, &fams);
            let mut changed = fams.clone();
            changed[2].samples[0].value = -1.0;
            let b = r.render(&inv, &changed);
            assert_eq!(a.pieces.len(), b.pieces.len());
            // Every per-volume family but the changed one is the same memory;
            // self metrics are written afresh.
            let mut extras = std::collections::HashMap::new();
            let per_volume = fams
                .iter()
                .filter(|f| SampleKey::of(&inv, &mut extras, &f.samples[0]).is_some())
                .count();
            let same = shared(&a, &b).into_iter().filter(|&s| s).count();
            assert_eq!(same, per_volume - 1, "{} pieces", a.pieces.len());
            assert_eq!(joined(&b), encode_all(&changed, &inv));
        }
    }

    #[test]
    fn a_changed_value_rewrites_only_its_run() {
        use std::sync::Arc;
        for mut r in renderers() {
            let inv = Arc::new(inventory(2100)); // nine runs per family
            let fams = scrape_like(&inv);
            let a = r.render(&inv, &fams);
            let mut changed = fams.clone();
            changed[2].samples[1000].value = -1.0;
            let b = r.render(&inv, &changed);
            assert_eq!(joined(&b), encode_all(&changed, &inv));
            assert_eq!(a.pieces.len(), b.pieces.len());
            // Of the runs, only the changed one is new; the loose pieces
            // (self metrics) are written afresh every time.
            let text = |p: &Piece| joined(&Rendered::new(vec![p.clone()], b.compressed));
            let fresh: Vec<String> = shared(&a, &b)
                .into_iter()
                .zip(&b.pieces)
                .filter(|(same, _)| !same)
                .map(|(_, p)| text(p))
                .filter(|t| t.contains("volume_id="))
                .collect();
            assert_eq!(fresh.len(), 1);
            let run = &fresh[0];
            assert_eq!(run.lines().count(), RUN);
            assert!(run.contains("} -1\n"));
        }
    }

    #[test]
    fn a_run_stays_cached_when_its_volumes_move_in_the_inventory() {
        use std::sync::Arc;
        for mut r in renderers() {
            let first = Arc::new(inventory(30));
            let sparse = |inv: &Inventory| {
                let mut f = Family::counter("nomad_host_volume_sparse_total", "S.");
                for (i, v) in inv.volumes.iter().enumerate() {
                    if v.project_id % 10 == 5 {
                        f.volume(i, 7.0);
                    }
                }
                vec![f]
            };
            let a = r.render(&first, &sparse(&first));
            // Volume 0 gone: the others' indices drop by one, their lines not.
            let second = Arc::new(Inventory {
                dirs: first.dirs.clone(),
                volumes: first.volumes[1..].to_vec(),
            });
            let fams = sparse(&second);
            let b = r.render(&second, &fams);
            let c = r.render(&second, &fams);
            assert_eq!(joined(&c), encode_all(&fams, &second));
            assert_eq!(shared(&a, &b), [true]);
            assert_eq!(shared(&b, &c), [true]);
        }
    }

    #[test]
    fn extra_labels_made_per_scrape_reset_the_cache_and_stay_right() {
        use std::sync::Arc;
        let inv = Arc::new(inventory(MAX_EXTRAS as u32 + 10));
        let leaky = || {
            let mut f = Family::counter("nomad_host_volume_leaky_total", "L.");
            for i in 0..inv.volumes.len() {
                let extra: Extra = Box::leak(Box::new([("errno", "EIO")]));
                f.volume_with(i, extra, 1.0);
            }
            vec![f]
        };
        for mut r in renderers() {
            for _ in 0..3 {
                let fams = leaky();
                assert_eq!(joined(&r.render(&inv, &fams)), encode_all(&fams, &inv));
                assert!(r.extras.len() <= 2 * (MAX_EXTRAS + 10));
            }
        }
    }

    /// OpenMetrics through the renderer: what `encode_all_as` writes, scrape
    /// after scrape, with a changed `_created` rewriting its run; the text
    /// renderer writes the same text as before for the same families.
    #[test]
    fn openmetrics_runs_follow_their_created_times() {
        use std::sync::Arc;
        let inv = Arc::new(inventory(700));
        let mut fams = scrape_like(&inv);
        fams[0].kind = Kind::Info;
        // The write errors with their own creation times; the quota hits
        // get the default.
        let errors = fams
            .iter()
            .position(|f| f.name == "nomad_host_volume_write_errors_total")
            .unwrap();
        let n = fams[errors].samples.len();
        fams[errors].created = (0..n).map(|i| 1.7e9 + i as f64 / 8.0).collect();
        let om = |fams: &[Family]| {
            encode_all_as(
                Format::OpenMetrics,
                Created::On { since: Some(1.6e9) },
                fams,
                &inv,
            )
        };
        for base in renderers() {
            let mut r = base.with_format(Format::OpenMetrics, Created::On { since: Some(1.6e9) });
            let first = joined(&r.render(&inv, &fams));
            assert_eq!(first, om(&fams));
            assert!(first.ends_with("\n# EOF\n"));
            assert!(first.contains("# TYPE nomad_host_volume info\n"));
            assert!(first.contains("# TYPE nomad_host_volume_write_errors counter\n"));
            assert!(first.contains("# HELP nomad_host_volume_g0_bytes A per-volume gauge \\\\ with\\nHELP to escape.\n"));
            assert_eq!(
                first
                    .matches("nomad_host_volume_write_errors_created{")
                    .count(),
                n
            );
            assert!(first.contains("nomad_host_volume_quota_limit_hits_created{"));
            assert!(first.contains("} 1600000000\n"));
            // A real OpenMetrics parser reads it, escapes and all.
            let parsed = prjquota_vmtests::prom::openmetrics_parse(&first)
                .unwrap_or_else(|e| panic!("not OpenMetrics: {e}"));
            let ns = &parsed
                .iter()
                .find(|f| f.name == "nomad_host_volume")
                .unwrap()
                .samples[0]
                .1;
            assert_eq!(ns["namespace"], "we\"ird\\ns\nx");
            let mut changed = fams.clone();
            changed[errors].created[n - 1] = 1.8e9;
            let a = r.render(&inv, &changed);
            assert_eq!(joined(&a), om(&changed));
            assert!(joined(&a).contains("} 1800000000\n"));
            let b = r.render(&inv, &changed);
            assert_eq!(
                shared(&a, &b).iter().filter(|s| !**s).count(),
                1,
                "only the self metrics are new"
            );
        }
        // The text format ignores created times and the info type.
        let mut text = Renderer::new();
        assert_eq!(joined(&text.render(&inv, &fams)), encode_all(&fams, &inv));
        let mut plain = fams.clone();
        plain[0].kind = Kind::Gauge;
        plain[errors].created.clear();
        assert_eq!(encode_all(&fams, &inv), encode_all(&plain, &inv));
    }

    /// Time to encode a 10,000-volume scrape with the `prometheus` crate's
    /// `TextEncoder` (as this module did before) and with [`Encoder`].
    /// `cargo test -p prjquota-exporter --release --lib encoder_speed -- --ignored --nocapture`
    #[test]
    #[ignore = "a measurement, not a test: run it on purpose"]
    fn encoder_speed() {
        use std::time::Instant;
        let inv = inventory(10_000);
        let fams = scrape_like(&inv);
        let samples: usize = fams.iter().map(|f| f.samples.len()).sum();
        let time = |f: &dyn Fn() -> usize| {
            let mut best = f64::MAX;
            let mut bytes = 0;
            for _ in 0..5 {
                let t = Instant::now();
                bytes = f();
                best = best.min(t.elapsed().as_secs_f64());
            }
            (best, bytes)
        };
        let (old, old_bytes) = time(&|| reference::encode_all(&fams, &inv).len());
        let (new, new_bytes) = time(&|| encode_all(&fams, &inv).len());
        assert_eq!(old_bytes, new_bytes);
        eprintln!(
            "MEASURE encode_10k_volumes samples={samples} bytes={new_bytes} \
             prometheus_crate_seconds={old:.4} direct_seconds={new:.4} ratio={:.1}",
            old / new
        );
    }
}
