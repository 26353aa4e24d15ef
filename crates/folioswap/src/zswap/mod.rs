//! The compressed pool, as zswap: folios compressed into size-classed pool memory,
//! stored entirely or not at all.
//!
//! A large folio is stored either compressed whole (one stream: the best ratio) or as
//! independently compressed 4 KiB pieces in one object (`pieces.rs`), which a partial
//! swap-in can split into one entry per page without decompressing anything
//! (`zswap_split`). Either way a store publishes one handle, all or nothing.
//!
//! `zswap_store` compresses a folio that eviction moved into staging and stores it under
//! one handle; `zswap_load` decompresses it back into a staging folio for the fault path
//! to move in. All-zero folios store nothing (the caller records them as ZeroSwapped), and
//! folios that do not compress below their own size are stored raw, so a store fails only
//! when the pool is full. An object exactly one folio long is raw; anything shorter starts
//! with the codec's tag byte, so a load never depends on the current configuration. The counters that these moves change live in `stats.rs`, bumped
//! by the callers next to the state transition they belong to.

mod compress;
mod pieces;
mod zpool;

pub use compress::{Codec, CodecScratch};
pub use zpool::{CompactionPass, PoolError, PoolHandle, ZPool};

use crate::config::Compressor;
use crate::size::PAGE_SIZE;

/// Why a folio was not stored.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum StoreError {
    /// The pool is at its cap.
    Full,
    /// The folio did not compress as much as the caller asked (zswap's
    /// `reject_compress_poor`): it belongs on the swap file.
    CompressPoor,
}

/// Why a stored folio could not be split into pages.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SplitError {
    /// The pool has no room for the pages' entries (until the folio's own is freed).
    Full,
    /// The object's piece table is inconsistent.
    Corrupt(String),
}

/// The result of trying to store one folio.
pub(crate) enum Stored {
    Zero,
    Entry { handle: PoolHandle, compressed_len: usize },
}

/// The pool together with the codec that fills it.
pub(crate) struct Zswap {
    pub pool: ZPool,
    pub codec: Codec,
}

/// Whether every byte of `data` is zero.
pub(crate) fn is_zero(data: &[u8]) -> bool {
    // Word-wise scan; most folios fail on the first word, all-zero ones are rare but cheap.
    let (prefix, words, suffix) = {
        // SAFETY: any byte sequence is a valid u64 sequence; align_to only reinterprets.
        unsafe { data.align_to::<u64>() }
    };
    prefix.iter().all(|&b| b == 0) && words.iter().all(|&w| w == 0) && suffix.iter().all(|&b| b == 0)
}

impl Zswap {
    pub fn new(compressor: Compressor, recomp: Compressor, cap: u64) -> Zswap {
        Zswap { pool: ZPool::new(cap), codec: Codec::new(compressor, recomp) }
    }

    /// Compress `folio` and store it under one handle: as one stream, or, with `pieced`
    /// (a folio larger than a page), as 4 KiB pieces. With `min_ratio` (there is a swap
    /// file to send it to instead), a folio that does not shrink by that ratio is refused;
    /// without, it is stored raw.
    pub fn zswap_store(
        &self,
        folio: &[u8],
        scratch: &mut CodecScratch,
        min_ratio: Option<f64>,
        pieced: bool,
    ) -> Result<Stored, StoreError> {
        if is_zero(folio) {
            return Ok(Stored::Zero);
        }
        let encoded: Option<&[u8]> = if pieced && folio.len() > PAGE_SIZE {
            let len = pieces::compress_pieces(&self.codec, folio, scratch);
            Some(&scratch.assembly[..len])
        } else {
            self.codec.compress(folio, scratch).map(|len| &scratch.out[..len])
        };
        let compressed = encoded.filter(|object| object.len() < folio.len());
        if let Some(min) = min_ratio {
            if !matches!(compressed, Some(object) if folio.len() as f64 >= min * object.len() as f64) {
                return Err(StoreError::CompressPoor);
            }
        }
        // Incompressible: store it as it is.
        let object = compressed.unwrap_or(folio);
        match self.pool.store(object) {
            Ok(handle) => Ok(Stored::Entry { handle, compressed_len: object.len() }),
            Err(PoolError::Full { .. }) | Err(PoolError::OutOfMemory { .. }) | Err(PoolError::TooLarge { .. }) => Err(StoreError::Full),
        }
    }

    /// Decompress the object behind `handle` into `dst` (exactly one folio).
    ///
    /// # Safety
    /// `handle` is live and nobody frees it during the call (the caller holds the folio lock).
    pub unsafe fn zswap_load(&self, handle: PoolHandle, dst: &mut [u8]) -> Result<(), String> {
        // SAFETY: forwarded contract: the handle is live for the duration of the call.
        let object = unsafe { self.pool.get(handle) };
        if object.len() == dst.len() {
            dst.copy_from_slice(object);
            return Ok(());
        }
        if object.first() == Some(&pieces::TAG_PIECES) {
            return pieces::decompress_pieces(&self.codec, object, dst);
        }
        self.codec.decompress(object, dst)
    }

    /// Turn the `folio_bytes` folio stored behind `handle` into one stored entry per
    /// page, by copying (a pieced object's pieces, or a raw object's pages); `handle`
    /// itself stays for the caller to free. `Ok(None)`: the object is one compressed
    /// stream and cannot be split without decompressing it.
    ///
    /// # Safety
    /// `handle` is live and nobody frees it during the call (the caller holds the folio lock).
    pub unsafe fn zswap_split(&self, handle: PoolHandle, folio_bytes: usize) -> Result<Option<Vec<Stored>>, SplitError> {
        // SAFETY: forwarded contract: the handle is live for the duration of the call.
        let object = unsafe { self.pool.get(handle) };
        let pages = folio_bytes / PAGE_SIZE;
        let mut stored = Vec::with_capacity(pages);
        let mut store_page = |piece: &[u8]| -> Result<(), SplitError> {
            if piece.is_empty() || (piece.len() == PAGE_SIZE && is_zero(piece)) {
                stored.push(Stored::Zero);
                return Ok(());
            }
            match self.pool.store(piece) {
                Ok(handle) => {
                    stored.push(Stored::Entry { handle, compressed_len: piece.len() });
                    Ok(())
                }
                Err(_) => Err(SplitError::Full),
            }
        };
        let result = if object.len() == folio_bytes {
            object.chunks_exact(PAGE_SIZE).try_for_each(&mut store_page)
        } else if object.first() == Some(&pieces::TAG_PIECES) {
            match pieces::pieces(object, pages) {
                Ok(mut each) => each.try_for_each(&mut store_page),
                Err(why) => Err(SplitError::Corrupt(why)),
            }
        } else {
            return Ok(None);
        };
        match result {
            Ok(()) => Ok(Some(stored)),
            Err(err) => {
                for s in stored {
                    if let Stored::Entry { handle, .. } = s {
                        self.pool.free(handle);
                    }
                }
                Err(err)
            }
        }
    }

    pub fn free(&self, handle: PoolHandle) {
        self.pool.free(handle)
    }
}
