//! [`Renderer`]: a scrape's body, reusing the previous scrape's text where
//! its inputs did not change, and [`encode_all`] for whole families at once.

use super::encoder::{Created, Encoder};
use super::family::{Extra, Family, Kind, Labels, Sample};
use super::openmetrics::{self, Format};
use crate::deflate::{Deflater, Piece};
use crate::inventory::Inventory;

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
    families: foldhash::HashMap<&'static str, Vec<Run>>,
    /// The extra label sets met so far, numbered (see [`ExtraIds`]).
    pub(super) extras: ExtraIds,
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
pub(super) const RUN: usize = 256;

/// Distinct extra label sets past which the cache starts over: they are
/// `&'static` and few (errno, reason, limit kinds), so reaching it means
/// something builds them per scrape, and the table must not grow forever.
pub(super) const MAX_EXTRAS: usize = 1024;

/// The extra label sets met so far, by address and length, numbered from 1
/// so a key holds 4 bytes rather than a fat pointer's 16. Every sample with
/// extra labels asks, and a family's samples take turns among a few sets
/// (allowed, denied): the last two answers are tried before the table.
#[derive(Default)]
pub(super) struct ExtraIds {
    ids: foldhash::HashMap<(usize, usize), u32>,
    /// Most recent first; an id of 0 is an empty slot.
    recent: [((usize, usize), u32); 2],
}

impl ExtraIds {
    fn id(&mut self, extra: Extra) -> u32 {
        let key = (extra.as_ptr() as usize, extra.len());
        match self.recent {
            [(k, id), _] if id != 0 && k == key => return id,
            [_, (k, id)] if id != 0 && k == key => {
                self.recent.swap(0, 1);
                return id;
            }
            _ => {}
        }
        let next = self.ids.len() as u32 + 1;
        let id = *self.ids.entry(key).or_insert(next);
        self.recent = [(key, id), self.recent[0]];
        id
    }

    pub(super) fn len(&self) -> usize {
        self.ids.len()
    }

    fn clear(&mut self) {
        *self = ExtraIds::default();
    }
}

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
pub(super) struct SampleKey {
    volume: u32,
    extra: u32,
    value: u64,
}

impl SampleKey {
    /// `None` for a sample that is not cached (no volume labels).
    pub(super) fn of(
        inventory: &Inventory,
        extras: &mut ExtraIds,
        s: &Sample,
    ) -> Option<SampleKey> {
        let (index, extra) = match &s.labels {
            Labels::Volume { index, extra: [] } => (*index, 0),
            Labels::Volume { index, extra } => (*index, extras.id(extra)),
            Labels::VolumeInfo { index } => (*index, u32::MAX),
            Labels::None | Labels::Owned(_) | Labels::Shared(_) => return None,
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
        // The registry hands over the same inventory while no record
        // changed: its volumes are where they were, and an index says it.
        let same_inventory = Arc::ptr_eq(&prev, inventory);
        let same = |old: &SampleKey, new: &SampleKey| {
            old.value == new.value
                && old.extra == new.extra
                && if same_inventory {
                    old.volume == new.volume
                } else {
                    match (
                        prev.volumes.get(old.volume as usize),
                        inventory.volumes.get(new.volume as usize),
                    ) {
                        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                        _ => false,
                    }
                }
        };
        // Escapes every volume's labels only when a per-volume line is
        // written afresh: not at all in a scrape where nothing changed.
        let enc = Encoder::with_format(inventory, format, *created_lines);
        let mut pieces = Vec::new();
        // Headers and samples of families not cached, up to the next run.
        let mut loose: Vec<u8> = Vec::new();
        let mut seen = foldhash::HashSet::default();
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
                Labels::None | Labels::Owned(_) | Labels::Shared(_) => false,
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
            loose.extend_from_slice(openmetrics::EOF);
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
        enc.family(f, &mut out);
    }
    if format == Format::OpenMetrics {
        out.extend_from_slice(openmetrics::EOF);
    }
    String::from_utf8(out).expect("the encoder writes UTF-8")
}
