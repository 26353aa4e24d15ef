//! When the pool is only a way through to the swap file, stop storing in it. State and
//! arithmetic only: the fault path reports each swap-in's tier and refault distance,
//! readahead hits included ([`PoolBypass::note_swapin`]), writeback each entry it moves to
//! the file ([`PoolBypass::note_writeback`]), and `Tiers::store` asks [`PoolBypass::active`].
//!
//! A pool that is full (or at its charged share) takes each new folio by writing its
//! oldest entry back to the file: a compression and a decompression per folio. That pays
//! while the pool serves faults; under a stream that comes back only after more than the
//! pool can hold (a sequential pass over more than the limit), every entry is written
//! back before its fault, and the pool serves none: 4 KiB sequential usemem at 512M
//! compressed 1.46 M folios into the pool, decompressed 1.42 M of them to write them back,
//! and loaded none (BENCHMARKS.md, "A pool that only passes folios through"). zswap does
//! the same (its writeback is only ever of the oldest entries); this goes beyond it, as
//! the mTHP zswap series leaves writeback policy "workload dependent".
//!
//! The rule, per window of `WINDOW` swap-ins:
//! - **on** when the pool wrote back at least a page per swap-in of the window
//!   (it is full and turning over) and under 1/16 of the swap-ins came from it. `reach`
//!   then keeps how far back the pool held folios: the farther of its own reach (the
//!   refault distance of the entry written back last) and memory_high in pages.
//! - **off** when 1/16 or more of the window's swap-ins refaulted within that reach: the
//!   pool would have held them, so the access has come closer.
//!
//! While on, folios go to the file raw (`zswap_bypass`); the entries in the pool stay
//! (and serve their faults) until loaded or written back to honour the pool's share.
//!
//! The counters are updated without a lock and reset by whichever fault closes the
//! window: a count lost in that race only makes one window a fault shorter.

use crate::pool_share::LoadedFrom;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// Swap-ins per decision.
const WINDOW: u32 = 512;
/// The pool serves (or would serve) under `1/SHARE_OF_WINDOW` of the window: it is a way through.
const SHARE_OF_WINDOW: u32 = 16;

#[derive(Default)]
pub(crate) struct PoolBypass {
    active: AtomicBool,
    /// In pages of the eviction clock: how far back the pool reached when the bypass began.
    reach: AtomicU64,
    swapins: AtomicU32,
    /// Swap-ins from the pool (off), or refaulted within `reach` (on).
    served: AtomicU32,
    /// Pages written back from the pool in this window.
    written_back: AtomicU64,
}

impl PoolBypass {
    /// Whether evicted folios should go straight to the file.
    pub fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// `pages` of pool entries were written back to the file.
    pub fn note_writeback(&self, pages: u64) {
        self.written_back.fetch_add(pages, Ordering::Relaxed);
    }

    /// Count one swap-in from `from`, `distance` pages of evictions after it left. `reach`
    /// is the pool's reach now (the refault distance of the entry written back last) and
    /// `limit_pages` memory_high in pages; both are read only when the bypass turns on.
    pub fn note_swapin(&self, from: LoadedFrom, distance: u64, reach: impl Fn() -> u64, limit_pages: u64) {
        let active = self.active();
        let served = if active { distance < self.reach.load(Ordering::Relaxed) } else { from == LoadedFrom::Pool };
        if served {
            self.served.fetch_add(1, Ordering::Relaxed);
        }
        if self.swapins.fetch_add(1, Ordering::Relaxed) + 1 < WINDOW {
            return;
        }
        let served = self.served.swap(0, Ordering::Relaxed);
        let written_back = self.written_back.swap(0, Ordering::Relaxed);
        self.swapins.store(0, Ordering::Relaxed);
        let through = served * SHARE_OF_WINDOW < WINDOW;
        if active && !through {
            self.active.store(false, Ordering::Relaxed);
        } else if !active && through && written_back >= WINDOW as u64 {
            self.reach.store(reach().max(limit_pages), Ordering::Relaxed);
            self.active.store(true, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT_PAGES: u64 = 1 << 15;

    /// One window of swap-ins cycling through `faults`, with `written_back` pages written
    /// back during it.
    fn window(b: &PoolBypass, written_back: u64, faults: &[(LoadedFrom, u64)]) {
        b.note_writeback(written_back);
        for i in 0..WINDOW as usize {
            let (from, distance) = faults[i % faults.len()];
            b.note_swapin(from, distance, || 1000, LIMIT_PAGES);
        }
    }

    #[test]
    fn a_stream_that_the_pool_never_serves_bypasses_it() {
        let b = PoolBypass::default();
        window(&b, 4 * WINDOW as u64, &[(LoadedFrom::File, 4 * LIMIT_PAGES)]);
        assert!(b.active());
        // It stays on while the faults come from farther back than the pool reached.
        window(&b, 0, &[(LoadedFrom::File, 4 * LIMIT_PAGES)]);
        assert!(b.active());
    }

    #[test]
    fn a_pool_that_serves_faults_is_kept() {
        let b = PoolBypass::default();
        // One fault in eight from the pool: it pays for its turnover.
        let mut faults = vec![(LoadedFrom::File, 4 * LIMIT_PAGES); 7];
        faults.push((LoadedFrom::Pool, 10));
        window(&b, 4 * WINDOW as u64, &faults);
        assert!(!b.active());
    }

    #[test]
    fn a_pool_that_is_not_full_is_not_bypassed() {
        let b = PoolBypass::default();
        // No writeback: the pool holds what it takes, and nothing is compressed in vain.
        window(&b, WINDOW as u64 - 1, &[(LoadedFrom::File, 4 * LIMIT_PAGES)]);
        assert!(!b.active());
    }

    #[test]
    fn faults_from_within_the_reach_end_the_bypass() {
        let b = PoolBypass::default();
        window(&b, 4 * WINDOW as u64, &[(LoadedFrom::File, 4 * LIMIT_PAGES)]);
        assert!(b.active());
        // The reach is at least memory_high: one fault in eight from within it is enough.
        let mut faults = vec![(LoadedFrom::File, 4 * LIMIT_PAGES); 7];
        faults.push((LoadedFrom::File, LIMIT_PAGES - 1));
        window(&b, 0, &faults);
        assert!(!b.active());
    }
}
