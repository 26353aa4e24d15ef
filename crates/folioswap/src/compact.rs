//! Pool compaction (zsmalloc's `zs_compact`): gather each size class's live objects at the
//! start of their chunk and give back the pages freed above them.
//!
//! Why: a chunk of the pool gives a page back only once no live object overlaps it
//! (`zpool.rs`), and swap-ins free objects at random. Charged to memory_high, the free
//! slots on pages the pool holds crowd resident memory out of the limit, and with the pool
//! over its share writeback sends live entries to the swap file to make up for them.
//! Measured (BENCHMARKS.md, "Pool compaction"): the CPython dict at 41M ended its build
//! with 400-800 KiB of such slots, 100-200 KiB after a pass; 4 KiB random usemem at 512M
//! ended with a pool 1.72-1.74 times the compressed bytes it held, against 1.91-1.92
//! without. Neither ran faster for it beyond this host's noise.
//!
//! A pass, when the pool's free bytes on held pages have grown by an eighth of its
//! footprint (at least 256 KiB) since the last pass left them (`ZPool::begin_compaction`):
//!
//! 1. copy the pool's queue of entries a slice at a time (`PoolLru::slice`), so that
//!    stores are not held up while the pass locks folios;
//! 2. per entry: `try_lock` the folio (one in use by a fault, an eviction or writeback is
//!    passed over: the next pass sees it), and where it is still that Pool entry, move its
//!    object down into the lowest free slot of its chunk if it lies above the chunk's live
//!    count (`ZPool::relocate`), and publish the new handle before unlocking. The handle
//!    word is read and written only under the folio lock (`folio.rs`), so no load can see
//!    the old one;
//! 3. give back every page that no longer holds a live object (`ZPool::trim`), and note
//!    what is left as the next pass's baseline.
//!
//! The background reclaimers run it (`reclaim.rs`), before they write back or evict.

use crate::folio::PENDING;
use crate::mm::Mm;
use crate::zswap::{CompactionPass, PoolHandle};
use std::sync::atomic::Ordering;

/// Entries a pass copies from the pool's queue at a time: a pool of 1.5 GiB holds some
/// 390 000 entries, whose copy at once took 9 MiB of the process's own memory.
const SLICE: usize = 4096;

/// Compact the pool if it is due a pass and no other reclaimer is running one. Returns
/// the bytes given back.
pub(crate) fn compact_pool_if_due(mm: &Mm) -> u64 {
    match mm.tiers.zswap.pool.begin_compaction() {
        Some(pass) => compact_pool(mm, pass),
        None => 0,
    }
}

/// One compaction pass (steps in the module's documentation). Returns the bytes given back.
pub(crate) fn compact_pool(mm: &Mm, _pass: CompactionPass<'_>) -> u64 {
    let pool = &mm.tiers.zswap.pool;
    let (mut moved, mut freed) = (0, 0);
    let mut from = 0;
    loop {
        let slice = mm.tiers.pool_lru.slice(from, SLICE);
        if slice.is_empty() {
            break;
        }
        from += slice.len();
        for v in slice {
            if v.table.dead.load(Ordering::Relaxed) {
                continue;
            }
            let e = v.table.entry(v.page);
            let Some(s) = e.try_lock() else { continue };
            if v.is_current(s) && !s.has(PENDING) {
                // SAFETY: the folio is locked and still this Pool entry, so its handle is
                // live, and every path that loads or frees it holds this lock first.
                if let Some((new, released)) = unsafe { pool.relocate(PoolHandle::from_raw(e.handle())) } {
                    e.set_handle(new.to_raw());
                    moved += 1;
                    freed += released;
                }
            }
            e.unlock();
        }
    }
    freed += pool.trim();
    mm.counters.vm.zswap_compact_moved.add(moved);
    mm.counters.vm.zswap_pages_compacted.add(freed / crate::size::PAGE_SIZE as u64);
    freed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::engine::Engine;
    use crate::evict::{shrink_one, Reclaimer};
    use crate::mm::Reclaimed;
    use crate::region::RegionOptions;
    use crate::size::PAGE_SIZE;
    use crate::zswap::CodecScratch;
    use std::sync::atomic::AtomicBool;

    const PAGES: usize = 2048;
    const WORDS: usize = PAGE_SIZE / 8;

    fn mix(mut x: u64) -> u64 {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^ (x >> 31)
    }

    /// Word `j` of page `page` at `version`: a stretch of noise whose length follows the
    /// page (so the pages compress into objects of many size classes), then a constant.
    fn word(page: usize, version: u64, j: usize) -> u64 {
        if j < page % 480 {
            mix((page as u64) << 32 ^ version << 16 ^ j as u64)
        } else {
            (page as u64) << 20 | version
        }
    }

    /// Two threads read and rewrite pages of a region, each its own half, every word
    /// checked, while a third evicts their pages to the pool and runs compaction passes
    /// that move the objects the faults are loading. Every page is checked at the end.
    #[test]
    fn objects_moved_while_faults_load_them_keep_every_word() {
        let engine = Engine::new(Config::default().no_swap_file()).unwrap_or_else(|e| panic!("cannot start the engine: {e}"));
        let mut region = engine.map(PAGES * PAGE_SIZE, RegionOptions::default().folio_size("4K").unwrap()).unwrap();
        let words = region.as_ptr() as usize;
        for (i, w) in region.as_mut_slice().chunks_mut(8).enumerate() {
            w.copy_from_slice(&word(i / WORDS, 0, i % WORDS).to_le_bytes());
        }
        let mm = engine.mm();
        let mut scratch = CodecScratch::new();
        while shrink_one(mm, &mut scratch, Reclaimer::Kswapd) == Reclaimed::Freed {}
        let done = AtomicBool::new(false);
        let (mut passes, mut moved) = (0, 0);
        let versions: Vec<Vec<u64>> = std::thread::scope(|s| {
            let program: Vec<_> = (0..2usize)
                .map(|half| {
                    s.spawn(move || {
                        // SAFETY: the region outlives the scope; each thread touches only
                        // the pages of its own half.
                        let page_words = |p: usize| unsafe { std::slice::from_raw_parts_mut((words as *mut u64).add(p * WORDS), WORDS) };
                        let mut version = vec![0u64; PAGES];
                        let mut x = half as u64;
                        for step in 0..20_000u64 {
                            x = mix(x ^ step);
                            let p = (x as usize % (PAGES / 2)) * 2 + half;
                            let got = page_words(p);
                            for (j, &w) in got.iter().enumerate() {
                                assert_eq!(w, word(p, version[p], j), "page {p} word {j} at version {}", version[p]);
                            }
                            if x.is_multiple_of(4) {
                                version[p] += 1;
                                for (j, w) in got.iter_mut().enumerate() {
                                    *w = word(p, version[p], j);
                                }
                            }
                        }
                        version
                    })
                })
                .collect();
            let reclaimer = s.spawn(|| {
                let mut scratch = CodecScratch::new();
                while !done.load(Ordering::Relaxed) {
                    for _ in 0..64 {
                        shrink_one(mm, &mut scratch, Reclaimer::Kswapd);
                    }
                    if let Some(pass) = mm.tiers.zswap.pool.start_compaction() {
                        let before = mm.counters.vm.zswap_compact_moved.get();
                        compact_pool(mm, pass);
                        moved += mm.counters.vm.zswap_compact_moved.get() - before;
                        passes += 1;
                    }
                }
            });
            let versions = program.into_iter().map(|t| t.join().unwrap()).collect();
            done.store(true, Ordering::Relaxed);
            reclaimer.join().unwrap();
            versions
        });
        assert!(passes > 0 && moved > 0, "{passes} passes moved {moved} objects: the test did not test compaction");
        let all = region.as_slice();
        for (i, w) in all.chunks(8).enumerate() {
            let p = i / WORDS;
            let v = versions[p % 2][p];
            assert_eq!(u64::from_le_bytes(w.try_into().unwrap()), word(p, v, i % WORDS), "page {p} word {} at version {v}", i % WORDS);
        }
    }
}
