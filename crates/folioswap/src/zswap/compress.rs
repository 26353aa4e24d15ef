//! Compressors for the pool: lz4 (block format), zstd at a level, or none, and a second
//! one for what the first leaves large (zram's recompression, `recomp_algorithm`).
//!
//! lz4 compresses with liblz4 and decompresses with whichever of liblz4 and lz4_flex is
//! faster on the object: both speak the same block format. lz4_flex copies an overlapping
//! match (a run of zeros) a byte at a time, so a sparse page that compresses 50:1 took it
//! 3.4 µs against liblz4's 0.14 µs, and liblz4 was 17-26% faster over the heap pages of a
//! CPython dict and of GNU sort; on dense objects of short matches, such as usemem's
//! words (2:1), lz4_flex decompresses about 50% faster (2 MiB folios: 1.6 against
//! 2.4 ms). An object under [`DENSE_LZ4`] of its size goes to liblz4, a larger one to
//! lz4_flex (BENCHMARKS.md, "Two lz4 decoders").
//!
//! lz4 has no entropy coder: text drawn from a small alphabet, or numbers printed as
//! text, comes out of it as large as it went in, while zstd's Huffman stage still takes a
//! third off (random lines of 36 letters: zstd:1 stores 4 KiB in about 2.7 KiB). Where a
//! secondary codec is set, a page (or a folio stream) that the primary codec leaves above
//! [`RECOMP_ABOVE`] of its size is compressed again with it and the smaller result is
//! kept, as zram recompresses its "huge" pages with a second algorithm. By default
//! (`Recomp::Auto`) that is only where the pool is the last tier: with a swap file such a
//! page goes there, as zswap sends what it rejects, and readahead brings it back: GNU
//! sort at 0.55-0.7 of its footprint ran faster so than with a charged pool holding its
//! text in two thirds (slower at 0.5, `config.rs` `Recomp`). Data that compresses under lz4
//! never pays for the second try; data that compresses under neither pays for both
//! (`BENCHMARKS.md`).
//!
//! Every encoded object starts with a tag byte naming its codec, so a load never depends
//! on the current configuration, and either codec's objects decode alike. Compression
//! contexts are per thread (`CodecScratch`, owned by reclaim threads and direct
//! reclaimers); zstd decompression contexts come from a small shared pool so that the
//! fault path allocates nothing in steady state.
//! The same `Codec` is exported for `folioswap bench codec`.

use crate::config::Compressor;
use std::sync::Mutex;

const TAG_LZ4: u8 = 1;
const TAG_ZSTD: u8 = 2;
const TAG_NONE: u8 = 3;

/// A result above this share of its input (numerator, denominator) is tried again with the
/// secondary codec: zsmalloc's huge class starts about here, and below it a second pass
/// would win too little to pay for itself.
pub const RECOMP_ABOVE: (usize, usize) = (3, 4);

/// A thread's compression workspace: the output buffer and, for zstd, its context.
pub struct CodecScratch {
    /// The last encoded object (`Codec::compress` returns its length).
    pub out: Vec<u8>,
    /// Where a pieced object is put together, and left for the caller (`pieces.rs`).
    pub(crate) assembly: Vec<u8>,
    /// The secondary codec's output, swapped into `out` when it is the smaller.
    second: Vec<u8>,
    /// zstd contexts by level: the primary's and the secondary's.
    zstd: ZstdCache,
    /// Encodings the secondary codec made smaller since the caller last took this count
    /// (pieces count one each).
    pub recompressed: u64,
}

impl CodecScratch {
    pub fn new() -> CodecScratch {
        CodecScratch { out: Vec::new(), assembly: Vec::new(), second: Vec::new(), zstd: Vec::new(), recompressed: 0 }
    }

    /// `len` bytes at a page boundary (for O_DIRECT), inside the larger of this scratch's
    /// two buffers. A thread never writes the pool back while it compresses, so one
    /// folio-sized buffer serves both: a writeback buffer of its own kept 2 MiB more per
    /// thread outside memory_high (BENCHMARKS.md, "What each compressing thread keeps
    /// outside the limit"). Its contents are whatever was there.
    pub(crate) fn page_aligned(&mut self, len: usize) -> &mut [u8] {
        let page = crate::size::PAGE_SIZE;
        let buf = if self.assembly.capacity() >= self.out.capacity() { &mut self.assembly } else { &mut self.out };
        if buf.len() < len + page {
            buf.reserve_exact(len + page - buf.len());
            buf.resize(len + page, 0);
        }
        let skip = buf.as_ptr().align_offset(page);
        &mut buf[skip..skip + len]
    }
}

/// A scratch's zstd compression contexts, by level.
type ZstdCache = Vec<(i32, zstd::bulk::Compressor<'static>)>;

/// The context for `level`, made on first use.
fn zstd_context(cache: &mut ZstdCache, level: i32) -> Option<&mut zstd::bulk::Compressor<'static>> {
    let at = match cache.iter().position(|(l, _)| *l == level) {
        Some(at) => at,
        None => {
            cache.push((level, zstd::bulk::Compressor::new(level).ok()?));
            cache.len() - 1
        }
    };
    Some(&mut cache[at].1)
}

impl Default for CodecScratch {
    fn default() -> Self {
        Self::new()
    }
}

/// The pool's codec, public so that `folioswap bench codec` measures exactly what the
/// engine runs.
pub struct Codec {
    compressor: Compressor,
    /// The second try for what `compressor` leaves above [`RECOMP_ABOVE`]; `None` for none.
    recomp: Option<Compressor>,
    decompressors: Mutex<Vec<zstd::bulk::Decompressor<'static>>>,
}

impl Codec {
    /// `recomp`: the secondary codec (`Compressor::None`, or the primary itself, for none).
    pub fn new(compressor: Compressor, recomp: Compressor) -> Codec {
        let recomp = (recomp != Compressor::None && recomp != compressor && compressor != Compressor::None).then_some(recomp);
        Codec { compressor, recomp, decompressors: Mutex::new(Vec::new()) }
    }

    /// Encode `input` into `scratch.out` (tag byte first): with the primary codec, and
    /// again with the secondary when the first result is above [`RECOMP_ABOVE`] of the
    /// input, keeping the smaller. Returns the encoded length, or `None` when the codecs
    /// failed, in which case the caller stores the folio raw.
    pub fn compress(&self, input: &[u8], scratch: &mut CodecScratch) -> Option<usize> {
        let first = encode(self.compressor, input, &mut scratch.out, &mut scratch.zstd);
        let Some(recomp) = self.recomp else { return first };
        if first.is_some_and(|n| n * RECOMP_ABOVE.1 <= input.len() * RECOMP_ABOVE.0) {
            return first;
        }
        match encode(recomp, input, &mut scratch.second, &mut scratch.zstd) {
            Some(m) if first.is_none_or(|n| m < n) => {
                std::mem::swap(&mut scratch.out, &mut scratch.second);
                scratch.recompressed += 1;
                Some(m)
            }
            _ => first,
        }
    }

    /// Decode `object` into `dst`, which must come out exactly full.
    pub fn decompress(&self, object: &[u8], dst: &mut [u8]) -> Result<(), String> {
        let (&tag, payload) = object.split_first().ok_or("empty pool object")?;
        let written = match tag {
            TAG_LZ4 if payload.len() * DENSE_LZ4.1 < dst.len() * DENSE_LZ4.0 => lz4_decompress_sparse(payload, dst)?,
            TAG_LZ4 => lz4_flex::block::decompress_into(payload, dst).map_err(|e| format!("lz4: {e}"))?,
            TAG_ZSTD => {
                let mut dctx = match self.decompressors.lock().unwrap().pop() {
                    Some(d) => d,
                    None => zstd::bulk::Decompressor::new().map_err(|e| format!("zstd context: {e}"))?,
                };
                let result = dctx.decompress_to_buffer(payload, dst).map_err(|e| format!("zstd: {e}"));
                self.decompressors.lock().unwrap().push(dctx);
                result?
            }
            TAG_NONE => {
                if payload.len() != dst.len() {
                    return Err(format!("stored {} bytes for a {}-byte folio", payload.len(), dst.len()));
                }
                dst.copy_from_slice(payload);
                payload.len()
            }
            other => return Err(format!("unknown codec tag {other}")),
        };
        if written != dst.len() {
            return Err(format!("decompressed {written} bytes into a {}-byte folio", dst.len()));
        }
        Ok(())
    }
}

/// An lz4 object at least this share of its decompressed size is dense (short matches,
/// lz4_flex decodes it faster); a smaller one has long matches (liblz4 does).
const DENSE_LZ4: (usize, usize) = (2, 5);

/// Decode an lz4 block with liblz4, whose match copy is fast where matches are long.
fn lz4_decompress_sparse(payload: &[u8], dst: &mut [u8]) -> Result<usize, String> {
    let (Ok(src_len), Ok(dst_len)) = (i32::try_from(payload.len()), i32::try_from(dst.len())) else {
        return Err(format!("lz4: a {}-byte object for a {}-byte folio is too large", payload.len(), dst.len()));
    };
    // SAFETY: `payload` is readable for src_len bytes and `dst` writable for dst_len
    // bytes; LZ4_decompress_safe never reads or writes outside them, whatever the input,
    // and returns the bytes written or a negative count for a malformed block.
    let n = unsafe { lz4_sys::LZ4_decompress_safe(payload.as_ptr().cast(), dst.as_mut_ptr().cast(), src_len, dst_len) };
    usize::try_from(n).map_err(|_| format!("lz4: malformed block ({} bytes for a {}-byte folio)", payload.len(), dst.len()))
}

/// Encode `input` with `compressor` into `out` (tag byte first), taking a zstd context
/// from `zstd`. `None`: the codec failed.
fn encode(compressor: Compressor, input: &[u8], out: &mut Vec<u8>, zstd: &mut ZstdCache) -> Option<usize> {
    match compressor {
        Compressor::Lz4 => {
            let src_len = i32::try_from(input.len()).ok()?;
            // SAFETY: LZ4_compressBound is a pure function of its argument.
            let bound = unsafe { lz4_sys::LZ4_compressBound(src_len) };
            out.resize(1 + bound as usize, 0);
            out[0] = TAG_LZ4;
            // SAFETY: `input` is readable for src_len bytes and `out[1..]` writable for
            // `bound` bytes; liblz4 writes at most `bound` bytes and returns their count
            // (0 on failure).
            let n = unsafe { lz4_sys::LZ4_compress_default(input.as_ptr().cast(), out[1..].as_mut_ptr().cast(), src_len, bound) };
            (n > 0).then_some(1 + n as usize)
        }
        Compressor::Zstd { level } => {
            out.resize(1 + zstd::zstd_safe::compress_bound(input.len()), 0);
            out[0] = TAG_ZSTD;
            let n = zstd_context(zstd, level)?.compress_to_buffer(input, &mut out[1..]).ok()?;
            Some(1 + n)
        }
        Compressor::None => {
            out.clear();
            out.push(TAG_NONE);
            out.extend_from_slice(input);
            Some(out.len())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample(len: usize, seed: u64) -> Vec<u8> {
        (0..len / 8).flat_map(|j| ((j as u64) ^ (seed << 40)).to_le_bytes()).collect()
    }

    #[test]
    fn every_codec_round_trips_every_folio_size() {
        for compressor in [Compressor::Lz4, Compressor::Zstd { level: 3 }, Compressor::None] {
            let codec = Codec::new(compressor, Compressor::None);
            let mut scratch = CodecScratch::new();
            for order in 0..=9 {
                let input = sample(4096 << order, order as u64);
                let n = codec.compress(&input, &mut scratch).unwrap();
                if compressor != Compressor::None {
                    assert!(n < input.len() * 3 / 4, "{compressor} order {order}: {n} of {}", input.len());
                }
                let mut back = vec![0u8; input.len()];
                codec.decompress(&scratch.out[..n], &mut back).unwrap();
                assert_eq!(back, input);
            }
        }
    }

    #[test]
    fn corrupt_objects_are_errors() {
        let codec = Codec::new(Compressor::Lz4, Compressor::None);
        let mut scratch = CodecScratch::new();
        let input = sample(65536, 1);
        let n = codec.compress(&input, &mut scratch).unwrap();
        let mut back = vec![0u8; input.len()];
        assert!(codec.decompress(&scratch.out[..n / 2], &mut back).is_err());
        assert!(codec.decompress(&[], &mut back).is_err());
        assert!(codec.decompress(&[9, 1, 2], &mut back).is_err());
        let mut short = vec![0u8; 4096];
        assert!(codec.decompress(&scratch.out[..n], &mut short).is_err());
    }

    /// A sparse page (a few words in zeros, as random writes leave it) decodes through
    /// liblz4, a dense one through lz4_flex; both decoders agree on both, and a broken
    /// sparse object is an error, not a short folio.
    #[test]
    fn both_lz4_decoders_read_sparse_and_dense_objects() {
        let codec = Codec::new(Compressor::Lz4, Compressor::None);
        let mut scratch = CodecScratch::new();
        let mut sparse = vec![0u8; 4096];
        for (i, at) in [8usize, 1000, 2048, 4088].into_iter().enumerate() {
            sparse[at..at + 8].copy_from_slice(&0x9E37_79B9_7F4A_7C15u64.wrapping_mul(i as u64 + 1).to_le_bytes());
        }
        for (input, is_sparse) in [(sparse, true), (sample(4096, 5), false)] {
            let n = codec.compress(&input, &mut scratch).unwrap();
            let payload = &scratch.out[1..n];
            assert_eq!(payload.len() * DENSE_LZ4.1 < input.len() * DENSE_LZ4.0, is_sparse, "{} bytes", payload.len());
            let mut back = vec![0u8; input.len()];
            codec.decompress(&scratch.out[..n], &mut back).unwrap();
            assert_eq!(back, input);
            let mut by_liblz4 = vec![0u8; input.len()];
            assert_eq!(lz4_decompress_sparse(payload, &mut by_liblz4), Ok(input.len()));
            let mut by_flex = vec![0u8; input.len()];
            assert_eq!(lz4_flex::block::decompress_into(payload, &mut by_flex).unwrap(), input.len());
            assert!(by_liblz4 == input && by_flex == input);
            if is_sparse {
                assert!(codec.decompress(&scratch.out[..n / 2], &mut back).is_err());
                assert!(codec.decompress(&scratch.out[..n], &mut back[..2048]).is_err());
            }
        }
    }

    /// Random letters and digits: no 4-byte string repeats, so lz4 finds nothing.
    fn text(len: usize) -> Vec<u8> {
        let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789";
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                alphabet[(x % 36) as usize]
            })
            .collect()
    }

    #[test]
    fn the_secondary_codec_takes_what_the_primary_leaves_large() {
        let lz4_alone = Codec::new(Compressor::Lz4, Compressor::None);
        let with_zstd = Codec::new(Compressor::Lz4, Compressor::Zstd { level: 1 });
        let mut scratch = CodecScratch::new();
        let input = text(4096);
        let alone = lz4_alone.compress(&input, &mut scratch).unwrap();
        assert!(alone * RECOMP_ABOVE.1 > input.len() * RECOMP_ABOVE.0, "lz4 shrank text to {alone} bytes: the test needs text it cannot");
        assert_eq!(scratch.recompressed, 0);
        let n = with_zstd.compress(&input, &mut scratch).unwrap();
        assert!(n < input.len() * 3 / 4 && scratch.out[0] == TAG_ZSTD, "{n} bytes, tag {}", scratch.out[0]);
        assert_eq!(scratch.recompressed, 1);
        let mut back = vec![0u8; input.len()];
        lz4_alone.decompress(&scratch.out[..n], &mut back).unwrap();
        assert_eq!(back, input, "any codec decodes the secondary's objects by their tag");
        // What lz4 compresses well is never tried again.
        let words = sample(4096, 3);
        let n = with_zstd.compress(&words, &mut scratch).unwrap();
        assert_eq!((scratch.out[0], scratch.recompressed), (TAG_LZ4, 1), "{n} bytes");
        // Nor does a secondary run behind no compression, or one equal to the primary.
        for codec in [
            Codec::new(Compressor::None, Compressor::Zstd { level: 1 }),
            Codec::new(Compressor::Zstd { level: 1 }, Compressor::Zstd { level: 1 }),
        ] {
            codec.compress(&input, &mut scratch).unwrap();
            assert_eq!(scratch.recompressed, 1);
        }
    }

    proptest! {
        #[test]
        fn round_trip_arbitrary(data in prop::collection::vec(any::<u8>(), 1..20000), zstd in any::<bool>()) {
            let codec = Codec::new(if zstd { Compressor::Zstd { level: 1 } } else { Compressor::Lz4 }, Compressor::Zstd { level: 1 });
            let mut scratch = CodecScratch::new();
            let n = codec.compress(&data, &mut scratch).unwrap();
            let mut back = vec![0u8; data.len()];
            codec.decompress(&scratch.out[..n], &mut back).unwrap();
            prop_assert_eq!(back, data);
        }
    }
}
