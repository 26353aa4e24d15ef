//! The storage tier behind the compressed pool: where folios go when the pool is full,
//! refuses them, or writes back its coldest entries (zswap writeback, seed 004; the swap
//! file with its clusters and slot caches, seeds 003 and 000).
//!
//! This is the seam the swap-file tier plugs into. Today the engine has no tier: a folio
//! the pool cannot take stays in memory (see `reclaim.rs`), and a fault that would need
//! room then fails clearly. A tier stores whole folios under an opaque id, reads them
//! back whole, and frees them; it owns its own allocation and I/O.

use std::io;

/// Where a stored folio lives on a tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TierId(pub u64);

/// A place to keep folios that the compressed pool does not hold.
pub trait StorageTier: Send + Sync {
    /// Write one folio (4 KiB << order bytes); all or nothing.
    fn write_folio(&self, data: &[u8]) -> io::Result<TierId>;
    /// Read a folio back into `dst`, which is exactly its size.
    fn read_folio(&self, id: TierId, dst: &mut [u8]) -> io::Result<()>;
    /// Forget a folio (it was swapped in or discarded).
    fn free(&self, id: TierId);
    /// Bytes of folios stored now.
    fn stored_bytes(&self) -> u64;
}
