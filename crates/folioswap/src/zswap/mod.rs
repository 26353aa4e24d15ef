//! The compressed pool, as zswap: whole folios compressed into size-classed pool memory,
//! stored entirely or not at all.
//!
//! `zswap_store` compresses a folio that eviction moved into staging and stores it under
//! one handle; `zswap_load` decompresses it back into a staging folio for the fault path
//! to move in. All-zero folios store nothing (the caller records them as ZeroSwapped), and
//! folios that do not compress below their own size are stored raw, so a store fails only
//! when the pool is full. An object exactly one folio long is raw; anything shorter starts
//! with the codec's tag byte, so a load never depends on the current configuration. The counters that these moves change live in `stats.rs`, bumped
//! by the callers next to the state transition they belong to.

mod compress;
mod zpool;

pub use compress::{Codec, CodecScratch};
pub use zpool::{PoolError, PoolHandle, ZPool};

use crate::config::Compressor;

/// Why a folio was not stored.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum StoreError {
    /// The pool is at its cap.
    Full,
    /// The folio did not compress as much as the caller asked (zswap's
    /// `reject_compress_poor`): it belongs on the swap file.
    CompressPoor,
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

fn is_zero(data: &[u8]) -> bool {
    // Word-wise scan; most folios fail on the first word, all-zero ones are rare but cheap.
    let (prefix, words, suffix) = {
        // SAFETY: any byte sequence is a valid u64 sequence; align_to only reinterprets.
        unsafe { data.align_to::<u64>() }
    };
    prefix.iter().all(|&b| b == 0) && words.iter().all(|&w| w == 0) && suffix.iter().all(|&b| b == 0)
}

impl Zswap {
    pub fn new(compressor: Compressor, cap: u64) -> Zswap {
        Zswap { pool: ZPool::new(cap), codec: Codec::new(compressor) }
    }

    /// Compress `folio` and store it whole. With `min_ratio` (there is a swap file to send
    /// it to instead), a folio that does not shrink by that ratio is refused; without, it
    /// is stored raw.
    pub fn zswap_store(&self, folio: &[u8], scratch: &mut CodecScratch, min_ratio: Option<f64>) -> Result<Stored, StoreError> {
        if is_zero(folio) {
            return Ok(Stored::Zero);
        }
        let compressed = self.codec.compress(folio, scratch).filter(|&len| len < folio.len());
        if let Some(min) = min_ratio {
            if !matches!(compressed, Some(len) if folio.len() as f64 >= min * len as f64) {
                return Err(StoreError::CompressPoor);
            }
        }
        let object: &[u8] = match compressed {
            Some(len) => &scratch.out[..len],
            // Incompressible: store it as it is.
            None => folio,
        };
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
        self.codec.decompress(object, dst)
    }

    pub fn free(&self, handle: PoolHandle) {
        self.pool.free(handle)
    }
}
