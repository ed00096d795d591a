//! The exposition's text kept compressed between scrapes, in pieces that
//! join into one gzip stream.
//!
//! Each piece is its text compressed on its own as raw DEFLATE and ended by
//! a sync flush: byte-aligned, never the final block, referring to nothing
//! before it. Such pieces concatenate, in any choice and order, into one
//! DEFLATE stream once an empty final block closes it (RFC 1951, 3.2.3);
//! pigz compresses in parallel the same way. So a gzip scrape sends the
//! cached pieces as they are between a fixed header and a trailer whose
//! CRC-32 is combined from the pieces' own (RFC 1952), one ordinary gzip
//! member that every client decodes; a plain scrape inflates them one by
//! one on the way out.
//!
//! Why: Prometheus asks for gzip on every scrape, so compressing the whole
//! text per scrape was most of a scrape's CPU time beyond the collectors,
//! and the text held between scrapes was most of the exporter's memory
//! (some 20 MB at 10,000 volumes, a tenth of that compressed).

use bytes::Bytes;
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};

/// A gzip header without a name, time or flags (RFC 1952, 2.3): method 8
/// (deflate), OS 255 (unknown).
pub const GZIP_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];

/// A final fixed-Huffman block holding only its end-of-block code: what
/// closes a stream of sync-flushed pieces.
const FINAL_EMPTY_BLOCK: [u8; 2] = [0x03, 0x00];

/// Text as the renderer keeps it: as it is, or compressed (see the module).
#[derive(Clone, Debug)]
pub struct Piece {
    /// The text, or its raw DEFLATE compression ended by a sync flush.
    pub bytes: Bytes,
    /// The text's length.
    pub text_len: u32,
    /// The text's CRC-32 (0 for a piece kept as it is: not needed).
    pub crc: u32,
}

impl Piece {
    /// `text` as DEFLATE `bytes` (compressed or stored), with the length
    /// and CRC-32 the gzip trailer is combined from.
    fn deflated(bytes: Bytes, text: &[u8]) -> Piece {
        Piece {
            bytes,
            text_len: u32::try_from(text.len()).expect("a piece is a run of lines, never 4 GiB"),
            crc: crc32fast::hash(text),
        }
    }

    pub fn plain(text: Bytes) -> Piece {
        Piece {
            text_len: text.len() as u32,
            bytes: text,
            crc: 0,
        }
    }
}

/// Compresses pieces with one reused compressor (its tables are some
/// hundreds of kilobytes: allocated once, not per piece).
pub struct Deflater {
    compress: Compress,
    out: Vec<u8>,
}

impl Default for Deflater {
    fn default() -> Self {
        Deflater {
            compress: Compress::new(Compression::fast(), false),
            out: Vec::new(),
        }
    }
}

impl Deflater {
    pub fn piece(&mut self, text: &[u8]) -> Piece {
        self.compress.reset();
        self.out.clear();
        self.out.reserve(text.len() / 4 + 64);
        loop {
            let done = self.compress.total_in() as usize;
            self.compress
                .compress_vec(&text[done..], &mut self.out, FlushCompress::Sync)
                .expect("deflate into memory cannot fail");
            // The flush is complete once all input is in and the output
            // did not run out of room.
            if self.compress.total_in() as usize == text.len()
                && self.out.len() < self.out.capacity()
            {
                break;
            }
            self.out.reserve(self.out.capacity().max(1024));
        }
        Piece::deflated(Bytes::copy_from_slice(&self.out), text)
    }
}

/// Longest stored DEFLATE block: its LEN field has 16 bits (RFC 1951,
/// 3.2.4).
const STORED_MAX: usize = u16::MAX as usize;

/// `text` as stored (uncompressed) DEFLATE blocks: a piece that joins the
/// others as [`Deflater::piece`]'s do, made without a compressor. For text
/// written afresh at every scrape and a few kilobytes long (the exporter's
/// own metrics): a compressor's reset clears some 200 KB of tables first,
/// more work than compressing those kilobytes saves on the wire.
pub fn stored(text: &[u8]) -> Piece {
    let mut out = Vec::with_capacity(text.len() + 5 * text.len().div_ceil(STORED_MAX));
    for chunk in text.chunks(STORED_MAX) {
        let len = chunk.len() as u16;
        // BFINAL 0, BTYPE 00, the rest of the byte padding: every piece
        // starts and ends on a byte boundary.
        out.push(0);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(chunk);
    }
    Piece::deflated(out.into(), text)
}

/// The gzip trailer for `pieces` sent in order between [`GZIP_HEADER`]
/// and it: the final block, the CRC-32 and the length modulo 2³².
pub fn gzip_trailer(pieces: &[Piece]) -> [u8; 10] {
    let mut crc = crc32fast::Hasher::new();
    let mut len: u64 = 0;
    for p in pieces {
        crc.combine(&crc32fast::Hasher::new_with_initial_len(
            p.crc,
            u64::from(p.text_len),
        ));
        len += u64::from(p.text_len);
    }
    let mut t = [0u8; 10];
    t[..2].copy_from_slice(&FINAL_EMPTY_BLOCK);
    t[2..6].copy_from_slice(&crc.finalize().to_le_bytes());
    t[6..].copy_from_slice(&(len as u32).to_le_bytes());
    t
}

/// Inflates compressed pieces back to their text, one reused decompressor.
pub struct Inflater(Decompress);

impl Default for Inflater {
    fn default() -> Self {
        Inflater(Decompress::new(false))
    }
}

impl Inflater {
    /// The text of a compressed piece. An error means the piece is not what
    /// [`Deflater`] made: a bug, which the caller reports.
    pub fn text(&mut self, p: &Piece) -> Result<Bytes, String> {
        self.0.reset(false);
        // One byte over: room left after the text shows the decoder has
        // nothing more to give.
        let mut out = Vec::with_capacity(p.text_len as usize + 1);
        loop {
            let (done_in, done_out) = (self.0.total_in(), self.0.total_out());
            self.0
                .decompress_vec(
                    &p.bytes[done_in as usize..],
                    &mut out,
                    FlushDecompress::Sync,
                )
                .map_err(|e| format!("a cached piece does not inflate: {e}"))?;
            if self.0.total_in() as usize == p.bytes.len() && out.len() < out.capacity() {
                break;
            }
            if (self.0.total_in(), self.0.total_out()) == (done_in, done_out) {
                return Err(format!(
                    "a cached piece stopped inflating at {} of {} bytes",
                    done_in,
                    p.bytes.len()
                ));
            }
            if out.len() == out.capacity() {
                out.reserve(1024);
            }
        }
        if out.len() != p.text_len as usize {
            return Err(format!(
                "a cached piece inflated to {} bytes, not its {}",
                out.len(),
                p.text_len
            ));
        }
        Ok(out.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(i: usize, lines: usize) -> Vec<u8> {
        let mut t = Vec::new();
        for l in 0..lines {
            t.extend_from_slice(
                format!(
                    "nomad_host_volume_used_bytes{{volume_id=\"v{i}-{l}\"}} {}\n",
                    l * 4096
                )
                .as_bytes(),
            );
        }
        t
    }

    fn gunzip(b: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(b), &mut out)
            .expect("one valid gzip member");
        out
    }

    #[test]
    fn pieces_compressed_apart_join_into_one_gzip_member_in_any_choice() {
        let mut d = Deflater::default();
        let texts: Vec<Vec<u8>> = (0..5).map(|i| text(i, 50 * i)).collect();
        let mut pieces: Vec<Piece> = texts.iter().map(|t| d.piece(t)).collect();
        // Stored pieces of the same texts, numbered 5 to 9, mix with them.
        pieces.extend(texts.iter().map(|t| stored(t)));
        let texts: Vec<Vec<u8>> = texts.iter().chain(&texts).cloned().collect();
        for choice in [
            vec![0, 1, 2, 3, 4],
            vec![4, 2],
            vec![3, 3, 1],
            vec![0],
            vec![],
            vec![9, 4, 5, 0, 8],
            vec![7],
        ] {
            let chosen: Vec<Piece> = choice.iter().map(|&i| pieces[i].clone()).collect();
            let mut body = GZIP_HEADER.to_vec();
            for p in &chosen {
                body.extend_from_slice(&p.bytes);
            }
            body.extend_from_slice(&gzip_trailer(&chosen));
            // GzDecoder checks the CRC-32 and the length too.
            let want: Vec<u8> = choice.iter().flat_map(|&i| texts[i].clone()).collect();
            assert_eq!(gunzip(&body), want, "{choice:?}");
        }
        assert!(pieces[4].bytes.len() * 5 < texts[4].len());
    }

    #[test]
    fn each_piece_inflates_to_its_own_text() {
        let mut d = Deflater::default();
        let mut inf = Inflater::default();
        // Past the output reserve of a quarter, and incompressible.
        let noise: Vec<u8> = (0..200_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        // The noise is three stored blocks, the last one short.
        for t in [text(1, 300), Vec::new(), noise, text(2, 1)] {
            for p in [d.piece(&t), stored(&t)] {
                assert_eq!(p.text_len as usize, t.len());
                assert_eq!(p.crc, crc32fast::hash(&t));
                assert_eq!(&inf.text(&p).unwrap()[..], &t[..]);
            }
        }
    }

    #[test]
    fn a_piece_that_is_not_ours_is_an_error_not_a_short_text() {
        let mut d = Deflater::default();
        let mut p = d.piece(&text(3, 100));
        let mut inf = Inflater::default();
        p.text_len += 1;
        assert!(inf.text(&p).is_err());
        p.text_len -= 1;
        p.bytes = p.bytes.slice(..p.bytes.len() / 2);
        assert!(inf.text(&p).is_err());
    }
}
