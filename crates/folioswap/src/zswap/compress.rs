//! Compressors for the pool: lz4 (block format), zstd at a level, or none.
//!
//! lz4 compresses with liblz4 and decompresses with lz4_flex: both speak the same block
//! format (they produce identical bytes), and on usemem-like data liblz4 compresses about
//! 10% faster while lz4_flex decompresses about 50% faster (2 MiB folios, this machine:
//! 2.45 vs 2.75 ms to compress, 1.8 vs 2.7 ms to decompress; `folioswap bench codec`
//! and BENCHMARKS.md have the current figures).
//!
//! Every encoded object starts with a tag byte naming its codec, so a load never depends
//! on the current configuration. Compression contexts are per thread (`CodecScratch`,
//! owned by reclaim threads and direct reclaimers); zstd decompression contexts come from
//! a small shared pool so that the fault path allocates nothing in steady state.
//! The same `Codec` is exported for `folioswap bench codec`.

use crate::config::Compressor;
use std::sync::Mutex;

const TAG_LZ4: u8 = 1;
const TAG_ZSTD: u8 = 2;
const TAG_NONE: u8 = 3;

/// A thread's compression workspace: the output buffer and, for zstd, its context.
pub struct CodecScratch {
    /// The last encoded object (`Codec::compress` returns its length).
    pub out: Vec<u8>,
    /// Where a pieced object is put together (`pieces.rs`).
    pub(crate) assembly: Vec<u8>,
    zstd: Option<zstd::bulk::Compressor<'static>>,
    zstd_level: i32,
}

impl CodecScratch {
    pub fn new() -> CodecScratch {
        CodecScratch { out: Vec::new(), assembly: Vec::new(), zstd: None, zstd_level: 0 }
    }
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
    decompressors: Mutex<Vec<zstd::bulk::Decompressor<'static>>>,
}

impl Codec {
    pub fn new(compressor: Compressor) -> Codec {
        Codec { compressor, decompressors: Mutex::new(Vec::new()) }
    }

    /// Encode `input` into `scratch.out` (tag byte first). Returns the encoded length, or
    /// `None` when the codec failed, in which case the caller stores the folio raw.
    pub fn compress(&self, input: &[u8], scratch: &mut CodecScratch) -> Option<usize> {
        let out = &mut scratch.out;
        match self.compressor {
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
                if scratch.zstd.is_none() || scratch.zstd_level != level {
                    scratch.zstd = Some(zstd::bulk::Compressor::new(level).ok()?);
                    scratch.zstd_level = level;
                }
                let cctx = scratch.zstd.as_mut()?;
                out.resize(1 + zstd::zstd_safe::compress_bound(input.len()), 0);
                out[0] = TAG_ZSTD;
                let n = cctx.compress_to_buffer(input, &mut out[1..]).ok()?;
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

    /// Decode `object` into `dst`, which must come out exactly full.
    pub fn decompress(&self, object: &[u8], dst: &mut [u8]) -> Result<(), String> {
        let (&tag, payload) = object.split_first().ok_or("empty pool object")?;
        let written = match tag {
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
            let codec = Codec::new(compressor);
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
        let codec = Codec::new(Compressor::Lz4);
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

    proptest! {
        #[test]
        fn round_trip_arbitrary(data in prop::collection::vec(any::<u8>(), 1..20000), zstd in any::<bool>()) {
            let codec = Codec::new(if zstd { Compressor::Zstd { level: 1 } } else { Compressor::Lz4 });
            let mut scratch = CodecScratch::new();
            let n = codec.compress(&data, &mut scratch).unwrap();
            let mut back = vec![0u8; data.len()];
            codec.decompress(&scratch.out[..n], &mut back).unwrap();
            prop_assert_eq!(back, data);
        }
    }
}
