//! Pool writeback (mm/zswap.c `zswap_writeback_entry`, `shrink_worker`): when a store
//! finds the pool full, the reclaimers write its oldest entries back to the swap file
//! until it is under the accept threshold; with `charge_pool` they also keep the pool
//! under its share of memory_high, which follows what its refaults cost
//! (`pool_share.rs`), so that resident memory is not squeezed out by compressed memory
//! (`Tiers::needs_writeback`). Each entry written back marks the pool's reach there
//! (`PoolShare::note_writeback`).
//!
//! The background reclaimers write back a batch at a time (`writeback_batch`, its steps
//! numbered there): the oldest entries, sorted by address so that a stream's pages get
//! consecutive slots and readahead reads them back with one `preadv` per run, written
//! with one submission. The kernel's zswap writes back one page at a time; with 4 KiB
//! folios that was one 4 KiB O_DIRECT write, and later one 4 KiB read, per page
//! (BENCHMARKS.md, "Pool writeback in batches"). Direct reclaim writes back one entry
//! (`writeback_one`), in the faulting context.

use crate::events::apply_pending_after_store;
use crate::evict::publish;
use crate::folio::{Kind, State, CACHED, PENDING};
use crate::mm::Mm;
use crate::size::{FolioSize, HUGE_SIZE};
use crate::tier::{Placed, PoolLruEntry, SwapOutError, WriteBatch};
use crate::zswap::CodecScratch;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The most entries one writeback pass takes (their data, at most 2 MiB, is decompressed
/// into one buffer). Enough that a stream's pages, sorted by address, land in runs of
/// slots that readahead reads back with one `preadv` each; few enough that faults waiting
/// on them wait for one write of at most 2 MiB.
pub(crate) const WRITEBACK_BATCH: usize = 64;

/// An entry taken for writeback: locked, still Pool.
struct Taken {
    v: PoolLruEntry,
    s: State,
    folio: FolioSize,
    handle: u64,
    /// Where its data sits in the writeback buffer.
    at: std::ops::Range<usize>,
}

/// Write up to `max` of the pool's oldest entries back to the swap file, in one
/// submission. Returns how many left the pool.
///
/// 1. take: pop entries oldest first, `try_lock` each and keep it if it is still that
///    Pool entry (a locked one is being loaded or changed: skip it; one with a readahead
///    copy goes to the back), until `max` entries or 2 MiB of data;
/// 2. sort them by region and address, so that a stream's pages get consecutive slots;
/// 3. decompress each into the thread's codec scratch (at a page boundary, for
///    O_DIRECT), give it slots (4 KiB folios that follow each other in a region share one
///    aligned run, `write_run_to_file`, as the slot cache would scatter them over free
///    slots anywhere in the file) and queue its write; issue the queue with one `pwritev`
///    per contiguous run (`write_batch`);
/// 4. per entry: free the pool entry and publish the new place (counted `zswpwb`), or,
///    where its load or write failed, keep it in the pool (back at the LRU head); unlock;
/// 5. once the batch no longer counts in flight, apply any event marked on an entry while
///    it was written back (`apply_pending_after_store` says why not before).
pub(crate) fn writeback_batch(mm: &Mm, scratch: &mut CodecScratch, max: usize) -> usize {
    let Some(dev) = &mm.tiers.file else { return 0 };
    if !dev.has_free_slots() {
        return 0;
    }
    let Some(_active) = mm.reclaim.begin_work(&mm.memcg) else { return 0 };
    let mut taken = take_oldest(mm, max);
    if taken.is_empty() {
        return 0;
    }
    // Off the pool's LRU and locked, these entries are memory that is leaving: a fault
    // that finds memory_high full waits for them (`charge::reserve`) rather than fail
    // because no writeback of its own found anything to take (at an 8M limit with the
    // pool charged, the pool's last entries were all in other threads' writebacks).
    let count = taken.len();
    mm.reclaim.begin_store(count);
    #[cfg(test)]
    tests::BEFORE_WRITE.with(|hook| hook.get().map(|hook| hook(mm)));
    taken.sort_by_key(|t| (Arc::as_ptr(&t.v.table) as usize, t.v.page));
    let mut offset = 0;
    for t in &mut taken {
        t.at = offset..offset + t.folio.bytes();
        offset += t.folio.bytes();
    }
    let results = write_taken(mm, &taken, scratch.page_aligned(offset));
    let lru = &mm.tiers.pool_lru;
    let mut written = 0;
    let mut kept = Vec::new();
    // Published with an event marked meanwhile: applied once the batch is out of flight.
    let mut marked = Vec::new();
    for (t, result) in taken.into_iter().zip(results) {
        let Taken { v, s, folio, handle, .. } = t;
        let e = v.table.entry(v.page);
        match result {
            Ok(placed) => {
                mm.tiers.free(Kind::Pool, handle, folio);
                mm.counters.vm.zswpwb.add(folio.pages() as u64);
                mm.tiers.pool_share.note_writeback(e.evicted_at());
                if let Some(bypass) = &mm.tiers.bypass {
                    bypass.note_writeback(folio.pages() as u64);
                }
                publish(mm, &v.table, v.page, folio, s, &placed);
                if e.load().has(PENDING) {
                    marked.push((v.table.clone(), v.page, folio));
                }
                e.unlock();
                written += 1;
            }
            Err(_) => {
                e.unlock();
                kept.push(v);
            }
        }
    }
    for v in kept.into_iter().rev() {
        lru.push_front(v);
    }
    mm.reclaim.end_stores(count);
    for (table, page, folio) in marked {
        apply_pending_after_store(mm, &table, page, folio);
    }
    written
}

/// Write the pool's oldest entry back (direct reclaim: one entry, in the faulting
/// context). Returns whether it left the pool.
pub(crate) fn writeback_one(mm: &Mm, scratch: &mut CodecScratch) -> bool {
    writeback_batch(mm, scratch, 1) > 0
}

/// Step 1 of `writeback_batch`.
fn take_oldest(mm: &Mm, max: usize) -> Vec<Taken> {
    let lru = &mm.tiers.pool_lru;
    let mut taken = Vec::new();
    let mut bytes = 0;
    let mut budget = lru.len();
    while budget > 0 && taken.len() < max {
        budget -= 1;
        let Some(v) = lru.pop() else { break };
        if v.table.dead.load(Ordering::Relaxed) {
            continue;
        }
        let folio = FolioSize::from_order(v.order as u32).expect("valid order");
        if bytes + folio.bytes() > HUGE_SIZE {
            lru.push_front(v);
            break;
        }
        let e = v.table.entry(v.page);
        // A locked entry may be leaving the pool (a load), or staying in it (an eviction
        // looking at its neighbours, readahead taking a copy, an event that keeps it):
        // look at it again later, when `current` tells. Dropped here, an entry that stays
        // would never be written back, and a charged pool would keep it within the limit
        // for good.
        let Some(s) = e.try_lock() else {
            lru.push_back(v);
            continue;
        };
        if !v.is_current(s) {
            e.unlock();
            continue;
        }
        if s.has(PENDING) {
            e.unlock();
            lru.push_back(v);
            continue;
        }
        if s.has(CACHED) {
            // A readahead copy is about to be used (or dropped): writing the entry back
            // now is likely waste. Look at it again later.
            e.unlock();
            lru.push_back(v);
            continue;
        }
        let handle = e.handle();
        bytes += folio.bytes();
        taken.push(Taken { v, s, folio, handle, at: 0..0 });
    }
    taken
}

/// Step 3 of `writeback_batch`: one result per entry, `Err` where it stays in the pool.
/// The entries' places in `buf` follow each other in their order.
fn write_taken(mm: &Mm, taken: &[Taken], buf: &mut [u8]) -> Vec<Result<Vec<Placed>, SwapOutError>> {
    let loaded: Vec<bool> = taken
        .iter()
        .map(|t| match mm.tiers.load(Kind::Pool, t.handle, &mut buf[t.at.clone()], &mm.counters) {
            Ok(()) => true,
            Err(err) => {
                eprintln!("folioswap: writing a pool entry back failed: {err}");
                false
            }
        })
        .collect();
    let buf: &[u8] = buf;
    // Whether entry `j` is a loaded 4 KiB folio at the page after entry `j - 1`'s.
    let follows = |j: usize| {
        let (a, b) = (&taken[j - 1], &taken[j]);
        loaded[j] && b.folio.order() == 0 && Arc::ptr_eq(&a.v.table, &b.v.table) && b.v.page == a.v.page + 1
    };
    let mut batch = WriteBatch::new();
    let mut spans = Vec::with_capacity(taken.len());
    let mut results = Vec::with_capacity(taken.len());
    let mut file_full = false;
    let mut i = 0;
    while i < taken.len() {
        // 4 KiB folios that follow each other in one region share a run of slots.
        let mut len = 1;
        while loaded[i] && taken[i].folio.order() == 0 && i + len < taken.len() && follows(i + len) {
            len += 1;
        }
        if len > 1 && !file_full {
            let start = batch.len();
            let run = &buf[taken[i].at.start..taken[i + len - 1].at.end];
            if let Some(placed) = mm.tiers.write_run_to_file(run, &mut batch) {
                for (k, p) in placed.into_iter().enumerate() {
                    results.push(Ok(vec![p]));
                    spans.push(start + k..start + k + 1);
                }
                i += len;
                continue;
            }
        }
        let t = &taken[i];
        let start = batch.len();
        // Write errors are reported where they happen; no space just ends the pass. An
        // entry that did not load (reported above) or found the file full stays in the pool.
        let result = if loaded[i] && !file_full {
            let result = mm.tiers.write_to_file(&buf[t.at.clone()], t.folio, Some(&mut batch), &mm.counters);
            file_full = matches!(result, Err(SwapOutError::NoSpace));
            result
        } else {
            Err(SwapOutError::NoSpace)
        };
        results.push(result);
        spans.push(start..batch.len());
        i += 1;
    }
    mm.tiers.write_batch(&batch, &spans, &mut results, &mm.counters);
    results
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::evict::{shrink_one, Reclaimer};
    use crate::folio::SPLIT;
    use crate::gate::tests::filled_region;
    use crate::gate::tests::remove;
    use crate::memcg::Component;
    use crate::mm::Reclaimed;
    use crate::size::PAGE_SIZE;
    use crate::swapfile::io::SwapFile;
    use crate::table::FolioTable;
    use crate::{Config, Engine, Region};
    use std::cell::Cell;
    use std::time::Duration;

    /// A test's hook into a reclaimer: run at one point of its path, on its thread.
    pub(crate) type Hook = std::thread::LocalKey<Cell<Option<fn(&Mm)>>>;

    thread_local! {
        /// Run by `writeback_batch` once its entries are taken (locked, counted in
        /// flight), before it writes them.
        pub(super) static BEFORE_WRITE: Cell<Option<fn(&Mm)>> = const { Cell::new(None) };
        /// Where `remove_a_page_with_memory_full` discards a page.
        static DISCARD_AT: Cell<usize> = const { Cell::new(0) };
        /// Whether it has run on this thread: a pass that writes in more than one
        /// submission (a background writeback took some entries first) reaches the hook
        /// again, and a second charge of the whole limit would outlast the test's one
        /// uncharge.
        static FIRED: Cell<bool> = const { Cell::new(false) };
    }

    /// Charge a whole memory_high more, so that no charge can succeed, and discard the
    /// page at `DISCARD_AT` as the gate does when the program discards it.
    pub(crate) fn remove_a_page_with_memory_full(mm: &Mm) {
        if FIRED.with(|fired| fired.replace(true)) {
            return;
        }
        mm.memcg.charge(Component::Resident, mm.memcg.limit.expect("a memory_high"));
        remove(mm, DISCARD_AT.with(Cell::get), PAGE_SIZE);
    }

    /// Run `work` on a thread of its own with `hook` set and the page at `discard_at` to
    /// discard there; if it has not returned in two minutes, it waits for memory that the
    /// hook's charge holds: give that back so that the test fails instead of hanging.
    pub(crate) fn run_with_hook<T: Send + 'static>(mm: &Arc<Mm>, hook: &'static Hook, discard_at: usize, work: fn(&Mm) -> T) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        let worker = mm.clone();
        let thread = std::thread::spawn(move || {
            DISCARD_AT.with(|at| at.set(discard_at));
            hook.with(|h| h.set(Some(remove_a_page_with_memory_full)));
            let _ = tx.send(work(&worker));
        });
        let got = rx.recv_timeout(Duration::from_secs(120));
        if got.is_err() {
            mm.memcg.uncharge(Component::Resident, mm.memcg.limit.unwrap());
            thread.join().unwrap();
            panic!("the reclaimer was still waiting for memory after two minutes, its batch in flight");
        }
        thread.join().unwrap();
        got.unwrap()
    }

    /// A pool entry that a pass finds locked (an eviction looking at its neighbours,
    /// readahead taking a copy) stays on the pool's LRU and is written back by a later
    /// pass. Before, the pass dropped it from the LRU, and no pass ever wrote it back.
    #[test]
    fn an_entry_found_locked_is_written_back_later() {
        let file =
            SwapFile::create_sparse(std::path::Path::new("/var/tmp"), 16 << 20).unwrap_or_else(|e| panic!("a swap file in /var/tmp: {e}"));
        let engine = Engine::with_swap_io(Config::default(), Box::new(file)).unwrap_or_else(|e| panic!("cannot start the engine: {e}"));
        let (region, table, head) = filled_region(&engine, 1 << 20, "64K");
        let mm = engine.mm();
        let mut scratch = CodecScratch::new();
        assert_eq!(shrink_one(mm, &mut scratch, Reclaimer::Kswapd), Reclaimed::Freed);
        let e = table.entry(head);
        assert_eq!(e.load().kind(), Kind::Pool, "the first folio is in the pool");
        e.lock();
        assert_eq!(writeback_batch(mm, &mut scratch, 64), 0, "a locked entry was written back");
        e.unlock();
        assert_eq!(writeback_batch(mm, &mut scratch, 64), 1, "the entry was not written back once unlocked");
        assert_eq!(e.load().kind(), Kind::Swapped);
        assert!(region.as_slice().iter().all(|&b| b == 7), "the data came back wrong");
    }

    /// A pool of 64K folios with a swap file behind it and a memory_high of 16M, every
    /// folio of a 1 MiB region in the pool; with `page_2_mapped`, page 2 of the first folio
    /// is mapped again (with 9s), as a copy in that an event stopped leaves it. Then one
    /// writeback pass, during which page 1 is discarded with memory_high charged full.
    fn written_back_with_an_event(page_2_mapped: bool) -> (Engine, Region, Arc<FolioTable>, usize) {
        let file =
            SwapFile::create_sparse(std::path::Path::new("/var/tmp"), 16 << 20).unwrap_or_else(|e| panic!("a swap file in /var/tmp: {e}"));
        let config = Config::default().memory_high("16M").unwrap();
        let engine = Engine::with_swap_io(config, Box::new(file)).unwrap_or_else(|e| panic!("cannot start the engine: {e}"));
        let (region, table, head) = filled_region(&engine, 1 << 20, "64K");
        let mm = engine.mm();
        let mut scratch = CodecScratch::new();
        while shrink_one(mm, &mut scratch, Reclaimer::Kswapd) == Reclaimed::Freed {}
        assert_eq!(table.entry(head).load().kind(), Kind::Pool, "the first folio is in the pool");
        let start = region.as_ptr() as usize;
        if page_2_mapped {
            let written = [9u8; PAGE_SIZE];
            mm.uffd.copy(start + 2 * PAGE_SIZE, written.as_ptr(), PAGE_SIZE, true).unwrap_or_else(|e| panic!("copying page 2 in: {e}"));
        }
        let written =
            run_with_hook(mm, &BEFORE_WRITE, start + PAGE_SIZE, |mm| writeback_batch(mm, &mut CodecScratch::new(), WRITEBACK_BATCH));
        assert!(written > 0, "nothing was written back");
        (engine, region, table, head)
    }

    /// The folio's state once whoever holds its lock lets go (the engine's walk may be
    /// applying the event).
    fn settled(table: &FolioTable, head: usize) -> State {
        let h = table.entry(head);
        let s = h.lock();
        h.unlock();
        s
    }

    /// Apply what is still pending on the folio at `head`, memory being back. A
    /// background writeback may hold the folio meanwhile (WRITEBACK): wait for it, as a
    /// fault does. The lock is let go before any panic, or the region's drop during the
    /// unwinding would wait for it forever and hide the message.
    fn apply_what_is_pending(mm: &Mm, table: &Arc<FolioTable>, head: usize) {
        let h = table.entry(head);
        loop {
            if !h.lock().has(PENDING) {
                h.unlock();
                return;
            }
            match crate::events::apply_pending_locked(mm, table, head, table.folio) {
                Ok(()) => {
                    h.unlock();
                    return;
                }
                Err(crate::events::ApplyError::WaitWriteback) => {
                    h.unlock();
                    h.wait_clear(crate::folio::WRITEBACK);
                }
                Err(e) => {
                    h.unlock();
                    panic!("applying the event: {e}");
                }
            }
        }
    }

    /// With memory_high still charged full, the folio at `head` is `kind`, unsplit, its
    /// event pending; once the charge is given back, the event splits it and page 1 is
    /// discarded.
    pub(crate) fn applied_once_memory_is_back(mm: &Mm, table: &Arc<FolioTable>, head: usize, kind: Kind) {
        let s = settled(table, head);
        assert!(s.kind() == kind && s.has(PENDING) && !s.has(SPLIT), "the folio was not left {kind:?} with its event: {s}");
        mm.memcg.uncharge(Component::Resident, mm.memcg.limit.unwrap());
        apply_what_is_pending(mm, table, head);
        let (s, page) = (table.entry(head).load(), table.entry(head + 1).load());
        assert!(s.has(SPLIT) && page.kind() == Kind::Untouched, "the event was not applied: folio {s}, page {page}");
    }

    /// Every page of the region: page 1 discarded, page 2 `page_2`, the rest kept.
    pub(crate) fn check_data(region: &Region, page_2: u8) {
        for (i, page) in region.as_slice().chunks(PAGE_SIZE).enumerate() {
            let want = match i {
                1 => 0,
                2 => page_2,
                _ => 7,
            };
            assert!(page.iter().all(|&b| b == want), "page {i} came back wrong (wanted {want} in every byte)");
        }
    }

    /// An event marked on a pool entry while it is written back, with memory_high full
    /// and nothing else to free, is applied at once and without memory: the folio is
    /// split on the swap file, the discarded page's slot freed and the kept pages left
    /// there. Before, the writeback applied it at its publish by bringing the folio back
    /// in, and `reserve` waited for the writeback's own batch in flight, 50 ms at a time,
    /// for as long as memory stayed full.
    #[test]
    fn an_event_during_writeback_is_applied_with_memory_full() {
        let (engine, region, table, head) = written_back_with_an_event(false);
        let mm = engine.mm();
        let s = settled(&table, head);
        let page = table.entry(head + 1).load();
        assert!(s.has(SPLIT) && !s.has(PENDING), "the event was not applied: folio {s}");
        assert_eq!(s.kind(), Kind::Swapped, "a kept page was brought back: {s}");
        assert_eq!(page.kind(), Kind::Untouched, "the discarded page: {page}");
        assert!((2..16).all(|i| table.entry(head + i).load().kind() == Kind::Swapped), "kept pages left the swap file");
        mm.memcg.uncharge(Component::Resident, mm.memcg.limit.unwrap());
        check_data(&region, 7);
    }

    /// The same where the split must bring the folio back (a page of it is mapped): with
    /// memory full, the pass returns and the folio keeps the event, which is applied once
    /// memory is back. Before, the pass applied it with its batch in flight and waited on
    /// that batch for as long as memory stayed full.
    #[test]
    fn an_event_during_writeback_waits_for_memory_not_for_its_batch() {
        let (engine, region, table, head) = written_back_with_an_event(true);
        applied_once_memory_is_back(engine.mm(), &table, head, Kind::Swapped);
        check_data(&region, 9);
    }
}
