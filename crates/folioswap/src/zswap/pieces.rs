//! A large folio stored as independently compressed 4 KiB pieces, in one pool object, so
//! that one page can be read without decompressing the rest (the kernel's zswap stores
//! every page of a large folio as its own entry for the same reason).
//!
//! ```text
//!   [TAG_PIECES] [end of piece 0: u32 LE] … [end of piece n-1: u32 LE] [piece 0] … [piece n-1]
//! ```
//! Ends are offsets from the start of the first piece. Each piece is itself a complete
//! single-page object: empty for an all-zero page, exactly 4096 bytes for a page stored
//! raw, otherwise the codec's tag byte and payload. A piece can therefore become a pool
//! object of its own by a plain copy (`split` in `mod.rs`): this is how a partial swap-in
//! turns one stored folio into order-0 entries without compressing anything again.
//!
//! Invariants: `n = folio bytes / 4096`; `end[i-1] <= end[i]`; `header + end[n-1] ==
//! object length`; a pieced object is always shorter than its folio (else it is stored
//! raw), so its length never reads as "raw".

use super::compress::{Codec, CodecScratch};
use crate::size::PAGE_SIZE;

pub(crate) const TAG_PIECES: u8 = 4;

fn header_len(pages: usize) -> usize {
    1 + 4 * pages
}

fn is_zero_page(page: &[u8]) -> bool {
    page.chunks_exact(8).all(|w| w == [0u8; 8])
}

/// Encode `folio` as pieces into `scratch.assembly` (`scratch.out` holds one piece at a
/// time, so a thread's scratch keeps one folio-sized buffer, not two). Returns the
/// object's length.
pub(crate) fn compress_pieces(codec: &Codec, folio: &[u8], scratch: &mut CodecScratch) -> usize {
    let pages = folio.len() / PAGE_SIZE;
    let mut object = std::mem::take(&mut scratch.assembly);
    object.clear();
    object.resize(header_len(pages), 0);
    object[0] = TAG_PIECES;
    let mut end = 0u32;
    for (i, page) in folio.chunks_exact(PAGE_SIZE).enumerate() {
        if !is_zero_page(page) {
            match codec.compress(page, scratch).filter(|&len| len < PAGE_SIZE) {
                Some(len) => object.extend_from_slice(&scratch.out[..len]),
                None => object.extend_from_slice(page),
            }
            end = (object.len() - header_len(pages)) as u32;
        }
        object[1 + 4 * i..5 + 4 * i].copy_from_slice(&end.to_le_bytes());
    }
    let len = object.len();
    scratch.assembly = object;
    len
}

/// The pieces of a pieced object of `pages` pages, in order.
pub(crate) fn pieces(object: &[u8], pages: usize) -> Result<impl Iterator<Item = &[u8]> + '_, String> {
    let header = header_len(pages);
    if object.first() != Some(&TAG_PIECES) || object.len() < header {
        return Err(format!("not a pieced object of {pages} pages"));
    }
    let body = &object[header..];
    let end = |i: usize| u32::from_le_bytes(object[1 + 4 * i..5 + 4 * i].try_into().unwrap()) as usize;
    let mut start = 0;
    for i in 0..pages {
        let e = end(i);
        if e < start || e > body.len() {
            return Err(format!("piece {i} ends at {e}, outside {start}..={}", body.len()));
        }
        start = e;
    }
    if start != body.len() {
        return Err(format!("pieces end at {start} of {} bytes", body.len()));
    }
    Ok((0..pages).map(move |i| {
        let from = if i == 0 { 0 } else { end(i - 1) };
        &body[from..end(i)]
    }))
}

/// Decode one piece into `dst` (one page).
pub(crate) fn decompress_piece(codec: &Codec, piece: &[u8], dst: &mut [u8]) -> Result<(), String> {
    match piece.len() {
        0 => {
            dst.fill(0);
            Ok(())
        }
        PAGE_SIZE => {
            dst.copy_from_slice(piece);
            Ok(())
        }
        _ => codec.decompress(piece, dst),
    }
}

/// Decode a whole pieced object into `dst` (its folio).
pub(crate) fn decompress_pieces(codec: &Codec, object: &[u8], dst: &mut [u8]) -> Result<(), String> {
    let pages = dst.len() / PAGE_SIZE;
    for (i, (piece, page)) in pieces(object, pages)?.zip(dst.chunks_exact_mut(PAGE_SIZE)).enumerate() {
        decompress_piece(codec, piece, page).map_err(|e| format!("piece {i}: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Compressor;
    use proptest::prelude::*;

    fn folio(pages: usize, seed: u64) -> Vec<u8> {
        let mut v = vec![0u8; pages * PAGE_SIZE];
        for (i, page) in v.chunks_exact_mut(PAGE_SIZE).enumerate() {
            match (i as u64 + seed) % 3 {
                0 => {}
                1 => page.iter_mut().enumerate().for_each(|(j, b)| *b = (j / 16) as u8 ^ seed as u8),
                _ => fill_random(page, seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i as u64),
            }
        }
        v
    }

    /// Bytes no codec shrinks (xorshift from `seed`, which must not be 0).
    fn fill_random(buf: &mut [u8], mut x: u64) {
        for b in buf.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
    }

    #[test]
    fn zero_raw_and_compressed_pieces_round_trip() {
        for compressor in [Compressor::Lz4, Compressor::Zstd { level: 3 }] {
            let codec = Codec::new(compressor, Compressor::None);
            let mut scratch = CodecScratch::new();
            let data = folio(16, 1);
            let len = compress_pieces(&codec, &data, &mut scratch);
            let object = scratch.assembly[..len].to_vec();
            let lens: Vec<usize> = pieces(&object, 16).unwrap().map(|p| p.len()).collect();
            assert!(lens.contains(&0) && lens.contains(&PAGE_SIZE) && lens.iter().any(|&l| l > 0 && l < PAGE_SIZE), "{lens:?}");
            let mut back = vec![1u8; data.len()];
            decompress_pieces(&codec, &object, &mut back).unwrap();
            assert_eq!(back, data);
            for (i, piece) in pieces(&object, 16).unwrap().enumerate() {
                let mut page = vec![7u8; PAGE_SIZE];
                decompress_piece(&codec, piece, &mut page).unwrap();
                assert_eq!(page, data[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]);
            }
        }
    }

    #[test]
    fn corrupt_headers_are_errors() {
        let codec = Codec::new(Compressor::Lz4, Compressor::None);
        let mut scratch = CodecScratch::new();
        let data = folio(4, 2);
        let len = compress_pieces(&codec, &data, &mut scratch);
        let object = scratch.assembly[..len].to_vec();
        let mut back = vec![0u8; data.len()];
        assert!(decompress_pieces(&codec, &object[..len - 1], &mut back).is_err());
        assert!(pieces(&object, 5).is_err());
        let mut bad = object.clone();
        bad[1..5].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decompress_pieces(&codec, &bad, &mut back).is_err());
        bad[0] = 1;
        assert!(pieces(&bad, 4).is_err());
    }

    /// Each thread that compresses keeps its scratch, outside memory_high: the pieces of a
    /// folio that does not compress fill a folio-sized buffer, and the scratch must keep
    /// one such buffer, not two (they took turns, so every compressing thread held two).
    #[test]
    fn a_scratch_keeps_one_folio_sized_buffer() {
        let codec = Codec::new(Compressor::Lz4, Compressor::Zstd { level: 1 });
        let mut scratch = CodecScratch::new();
        let mut noise = vec![0u8; 512 * PAGE_SIZE];
        fill_random(&mut noise, 0x9E37_79B9_7F4A_7C15);
        for _ in 0..3 {
            let len = compress_pieces(&codec, &noise, &mut scratch);
            assert!(len > noise.len(), "random pages are kept raw, with the header: {len}");
        }
        assert!(scratch.assembly.capacity() >= noise.len());
        assert!(scratch.out.capacity() < 16 * PAGE_SIZE, "out grew to {} bytes", scratch.out.capacity());
    }

    /// Writeback decompresses into the same thread's scratch: at a page boundary (the
    /// write is O_DIRECT), and in the folio-sized buffer the scratch already has, so that
    /// a thread that compresses and writes back keeps one such buffer, not two.
    #[test]
    fn writeback_borrows_the_scratchs_folio_sized_buffer() {
        let codec = Codec::new(Compressor::Lz4, Compressor::None);
        let mut scratch = CodecScratch::new();
        let mut noise = vec![0u8; 512 * PAGE_SIZE];
        fill_random(&mut noise, 0x2545_F491_4F6C_DD1D);
        for round in 0..3 {
            let len = compress_pieces(&codec, &noise, &mut scratch);
            let mut back = vec![0u8; noise.len()];
            decompress_pieces(&codec, &scratch.assembly[..len], &mut back).unwrap();
            assert!(back == noise, "round {round}: a store after a writeback lost its data");
            let buf = scratch.page_aligned(noise.len());
            assert_eq!((buf.as_ptr() as usize % PAGE_SIZE, buf.len()), (0, noise.len()));
            buf.fill(0xEE);
            assert!(scratch.out.capacity() < 16 * PAGE_SIZE, "round {round}: out grew to {} bytes", scratch.out.capacity());
        }
        // A scratch that never compressed a folio still gets its buffer.
        let mut fresh = CodecScratch::new();
        assert_eq!(fresh.page_aligned(3 * PAGE_SIZE).as_ptr() as usize % PAGE_SIZE, 0);
    }

    proptest! {
        #[test]
        fn round_trip_arbitrary_folios(pages in 1usize..32, seed in any::<u64>()) {
            let codec = Codec::new(Compressor::Lz4, Compressor::None);
            let mut scratch = CodecScratch::new();
            let data = folio(pages, seed);
            let len = compress_pieces(&codec, &data, &mut scratch);
            let mut back = vec![0u8; data.len()];
            decompress_pieces(&codec, &scratch.assembly[..len], &mut back).unwrap();
            prop_assert_eq!(back, data);
        }
    }
}
