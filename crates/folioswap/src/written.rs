//! Written bits: the accessed bits user space can read. A region under 2 MiB folios is
//! registered write-protect on an async-WP userfaultfd (Linux 6.7+): the kernel resolves
//! the first write to a protected page itself (about 0.9 µs), and `PAGEMAP_SCAN` reports
//! which pages were written since they were last protected and protects them again. State
//! only: eviction harvests the bits into each table's map every `Harvest::interval`
//! evictions and reads them at the inactive head (`evict.rs`, `pick_victim`).
//!
//! Why a harvest and not a scan per candidate: protecting a written page needs a TLB
//! shootdown, an IPI to every CPU that runs the program. One scan per candidate paid one
//! per rotation, a fifth of the CPU on 4 KiB random usemem (BENCHMARKS.md, "Written
//! bits"); a harvest pays one per 2 MiB of address space for all the pages in it.
//!
//! A bit is a hint, set and cleared with relaxed atomics and never under a folio's lock:
//! a page written after the last harvest looks unwritten until the next one, and a bit
//! that outlives its page (the page left and came back) gives it one rotation too many.
//! Protecting never writes a page's contents, and THPs are never registered (the first
//! write to a protected THP splits its mapping).

use crate::uffd::PageMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// One region's written bits, one per page.
pub(crate) struct WrittenMap {
    words: Box<[AtomicU64]>,
}

impl WrittenMap {
    pub fn new(pages: usize) -> WrittenMap {
        WrittenMap { words: (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect() }
    }

    /// Set the bits of pages `[page, page + pages)` (clipped to the region).
    pub fn mark(&self, page: usize, pages: usize) {
        for p in page..(page + pages).min(self.words.len() * 64) {
            self.words[p / 64].fetch_or(1 << (p % 64), Ordering::Relaxed);
        }
    }

    /// Whether any page of `[page, page + pages)` is marked; clears them.
    pub fn take(&self, page: usize, pages: usize) -> bool {
        let mut any = false;
        for p in page..(page + pages).min(self.words.len() * 64) {
            let bit = 1 << (p % 64);
            any |= self.words[p / 64].fetch_and(!bit, Ordering::Relaxed) & bit != 0;
        }
        any
    }

    /// Whether page `page` is marked, leaving it so.
    #[cfg(test)]
    pub fn is_marked(&self, page: usize) -> bool {
        self.words.get(page / 64).is_some_and(|w| w.load(Ordering::Relaxed) & (1 << (page % 64)) != 0)
    }
}

/// The engine's side: where bits are read, and when they were last harvested.
pub(crate) struct Harvest {
    pub pagemap: PageMap,
    /// The eviction clock (`Lru::now`) at the last harvest.
    last: AtomicU32,
    /// Pages evicted between harvests: memory_high/32, at least 64. A harvest protects
    /// every page written since the last, and each pays a write-protect fault at its next
    /// write; at memory_high/4 the bits were too old to choose by (BENCHMARKS.md, "Written
    /// bits").
    interval: u32,
}

impl Harvest {
    pub fn new(pagemap: PageMap, memory_high: Option<u64>) -> Harvest {
        let interval = memory_high.map(|m| (m / 4096 / 32).clamp(64, u32::MAX as u64 / 4) as u32).unwrap_or(1 << 16);
        Harvest { pagemap, last: AtomicU32::new(0), interval }
    }

    /// Whether this caller is to harvest now, at clock `now`: `interval` pages were
    /// evicted since the last harvest, and no other reclaimer claimed this one first (the
    /// others go on without waiting).
    pub fn claim(&self, now: u32) -> bool {
        let last = self.last.load(Ordering::Relaxed);
        now.wrapping_sub(last) >= self.interval && self.last.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marked_range_is_taken_once() {
        let map = WrittenMap::new(130);
        map.mark(62, 4);
        assert!(map.is_marked(62) && map.is_marked(65) && !map.is_marked(66));
        assert!(!map.take(0, 62));
        assert!(map.take(64, 16));
        assert!(!map.is_marked(64) && map.is_marked(63));
        assert!(map.take(60, 4));
        assert!(!map.take(0, 130));
        // Past the end is clipped, not a panic.
        map.mark(128, 8);
        assert!(map.take(128, 8));
    }
}
