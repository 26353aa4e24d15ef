//! The LRU of resident folios and the eviction clock (the kernel's lruvec and workingset
//! shadow clock). State only: `evict.rs` takes victims from it, `fault.rs` puts folios
//! back on it.
//!
//! Coldness is fault order plus refault distance. Without accessed bits (this kernel has
//! no idle page tracking, and async write-protect would split THP mappings on the first
//! write) what user space sees cheaply is when a folio faulted in and, for one that was
//! evicted before, how many pages were evicted since: its refault distance. With
//! `written_aging`, folios under 2 MiB also have written bits (`written.rs`), which
//! `evict.rs` reads at the inactive head: an entry found written goes back to the tail
//! marked `referenced`, and to the active list when found written again. Folios join
//! the tail of the inactive list when installed; one that refaults within the working-set
//! distance (fewer pages evicted since it left than memory_high holds) joins the active
//! list instead, as the kernel's workingset.c does. Eviction takes the inactive head; the
//! active head is demoted while the inactive list holds under a third of the pages, checked
//! before each eviction and before a folio joins the inactive list (so that the demoted,
//! older folios go ahead of it).
//! `LruPolicy::Fifo` keeps a single list, for comparison (BENCHMARKS.md).
//!
//! An entry is a hint: (table, page, order, generation). Whoever pops it locks the folio
//! and checks with [`LruEntry::is_current`] that it is still the residency it was queued
//! for; stale entries are dropped.

use crate::folio::{Kind, State, SPLIT};
use crate::size::FolioSize;
use crate::table::FolioTable;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

pub(crate) struct LruEntry {
    pub table: Arc<FolioTable>,
    pub page: usize,
    pub order: u8,
    pub gen: u16,
    /// Found written once at the inactive head and sent round again (the kernel's
    /// PG_referenced): found written a second time, it is activated.
    pub referenced: bool,
}

impl LruEntry {
    pub fn folio(&self) -> FolioSize {
        FolioSize::from_order(self.order as u32).expect("valid order")
    }

    fn pages(&self) -> usize {
        1 << self.order
    }

    /// Whether the locked folio, now in state `s`, is still the resident folio this entry
    /// was queued for.
    pub fn is_current(&self, s: State) -> bool {
        s.kind() == Kind::Resident && s.gen() == self.gen && (self.order == 0 || !s.has(SPLIT))
    }
}

/// The two lists and the pages each holds: the balance between them is in pages, as the
/// kernel's `inactive_is_low` weighs its lists, since one 1 MiB folio's entry holds as
/// much as 256 entries of 4 KiB pages (counted in entries, a few large folios on the
/// inactive list let the 4 KiB pages that refaulted onto the active list stay there, hot
/// or not). Stale entries count until they are popped.
#[derive(Default)]
struct Lists {
    inactive: VecDeque<LruEntry>,
    active: VecDeque<LruEntry>,
    inactive_pages: usize,
    active_pages: usize,
}

impl Lists {
    /// Demote the active head while the inactive list holds under a third of all pages.
    fn balance(&mut self) {
        while self.inactive_pages * 2 < self.active_pages {
            let demoted = self.active.pop_front().expect("active pages are on the active list");
            self.active_pages -= demoted.pages();
            self.push_inactive(demoted);
        }
    }

    fn push_inactive(&mut self, entry: LruEntry) {
        self.inactive_pages += entry.pages();
        self.inactive.push_back(entry);
    }

    fn push_active(&mut self, entry: LruEntry) {
        self.active_pages += entry.pages();
        self.active.push_back(entry);
    }

    fn take_inactive(&mut self, at: usize) -> Option<LruEntry> {
        let entry = self.inactive.remove(at)?;
        self.inactive_pages -= entry.pages();
        Some(entry)
    }

    fn pop_coldest(&mut self) -> Option<LruEntry> {
        if let Some(entry) = self.take_inactive(0) {
            return Some(entry);
        }
        let entry = self.active.pop_front()?;
        self.active_pages -= entry.pages();
        Some(entry)
    }
}

/// How far past the head an eviction batch looks for the folios that continue it: the
/// kernel isolates `SWAP_CLUSTER_MAX` (32) folios off the LRU for one reclaim pass, and any
/// of them may go first. Two threads that stream through memory interleave their folios
/// on the LRU (A0 B0 A1 B1 …), so looking only at the head ended every run after one
/// folio and paid one MOVE and one TLB shootdown per 4 KiB.
const BATCH_LOOKAHEAD: usize = 32;

#[derive(Default)]
pub(crate) struct Lru {
    /// A leaf lock: nothing else is taken while it is held.
    lists: Mutex<Lists>,
    /// Pages evicted so far (wrapping): the clock refault distances are measured on.
    evict_clock: AtomicU32,
}

impl Lru {
    pub fn push(&self, table: Arc<FolioTable>, page: usize, folio: FolioSize, gen: u16, active: bool) {
        let entry = LruEntry { table, page, order: folio.order() as u8, gen, referenced: false };
        let mut lists = self.lists.lock().unwrap();
        if active {
            lists.push_active(entry);
        } else {
            // Demote first: the active folios demoted now are older than this one, and
            // must be evicted before it (demoting only at eviction time put them behind
            // it, so a folio that had just faulted in was the first one evicted).
            lists.balance();
            lists.push_inactive(entry);
        }
    }

    /// Queue a resident folio at the head of the inactive list, to be evicted next (the
    /// zero scan's find, `zero_scan.rs`). The entry it already has stays where it is and
    /// goes stale once the folio leaves (`LruEntry::is_current`).
    pub fn push_first(&self, table: Arc<FolioTable>, page: usize, folio: FolioSize, gen: u16) {
        let entry = LruEntry { table, page, order: folio.order() as u8, gen, referenced: false };
        let mut lists = self.lists.lock().unwrap();
        lists.inactive_pages += entry.pages();
        lists.inactive.push_front(entry);
    }

    /// Put a candidate that was found in use on the active list.
    pub fn activate(&self, entry: LruEntry) {
        self.lists.lock().unwrap().push_active(entry);
    }

    /// Put a candidate back at the tail (it was busy).
    pub fn requeue(&self, entry: LruEntry) {
        self.lists.lock().unwrap().push_inactive(entry);
    }

    /// The coldest candidate: the inactive head, after demoting active folios while the
    /// inactive list holds under a third of all pages.
    pub fn pop(&self) -> Option<LruEntry> {
        let mut lists = self.lists.lock().unwrap();
        lists.balance();
        lists.pop_coldest()
    }

    /// Pop the coldest of the next `BATCH_LOOKAHEAD` candidates that satisfies `pred`
    /// (extending an eviction batch), if any does.
    pub fn pop_near_front_if(&self, pred: impl Fn(&LruEntry) -> bool) -> Option<LruEntry> {
        let mut lists = self.lists.lock().unwrap();
        let at = lists.inactive.iter().take(BATCH_LOOKAHEAD).position(pred)?;
        lists.take_inactive(at)
    }

    pub fn len(&self) -> usize {
        let lists = self.lists.lock().unwrap();
        lists.inactive.len() + lists.active.len()
    }

    /// Advance the eviction clock by `pages`; returns the clock before.
    pub fn tick(&self, pages: u32) -> u32 {
        self.evict_clock.fetch_add(pages, Ordering::Relaxed)
    }

    /// The clock now: what a folio installed now records (`PageEntry::installed_at`).
    pub fn now(&self) -> u32 {
        self.evict_clock.load(Ordering::Relaxed)
    }

    /// Pages evicted since the clock read `then` (the refault distance).
    pub fn distance_since(&self, then: u32) -> u64 {
        self.evict_clock.load(Ordering::Relaxed).wrapping_sub(then) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folio_that_just_faulted_in_goes_behind_the_demoted_ones() {
        let table = Arc::new(FolioTable::new(FolioSize::K4, 16, 0x1000_0000).unwrap());
        let lru = Lru::default();
        for page in 0..6 {
            lru.push(table.clone(), page, FolioSize::K4, 0, true);
        }
        // The inactive list is empty: the new folio must not be the first evicted.
        lru.push(table.clone(), 10, FolioSize::K4, 0, false);
        let order: Vec<usize> = std::iter::from_fn(|| lru.pop()).map(|e| e.page).collect();
        assert_eq!(order.len(), 7);
        assert_eq!(order[0], 0, "the oldest active folio goes first: {order:?}");
        assert!(order.iter().position(|&p| p == 10).unwrap() >= 2, "{order:?}");
    }

    #[test]
    fn the_lists_are_balanced_in_pages_not_entries() {
        let small = Arc::new(FolioTable::new(FolioSize::K4, 256, 0x1000_0000).unwrap());
        let m1 = FolioSize::ALL[8];
        let large = Arc::new(FolioTable::new(m1, 1024, 0x4000_0000).unwrap());
        let newcomer = Arc::new(FolioTable::new(FolioSize::K4, 16, 0x8000_0000).unwrap());
        let lru = Lru::default();
        // Two 1 MiB folios inactive (512 pages), 200 refaulted 4 KiB pages active, then a
        // page faulted in for the first time.
        for head in [0, 256] {
            lru.push(large.clone(), head, m1, 0, false);
        }
        for page in 0..200 {
            lru.push(small.clone(), page, FolioSize::K4, 0, true);
        }
        lru.push(newcomer.clone(), 0, FolioSize::K4, 0, false);
        // 513 inactive pages against 200 active: nothing was demoted ahead of the newcomer
        // (counted in entries, 3 against 200, 66 active pages would have been).
        let order: Vec<Arc<FolioTable>> = std::iter::from_fn(|| lru.pop()).map(|e| e.table).take(4).collect();
        assert!(Arc::ptr_eq(&order[0], &large) && Arc::ptr_eq(&order[1], &large));
        assert!(Arc::ptr_eq(&order[2], &newcomer), "the newcomer went behind active pages demoted for a list short in entries only");
        // Then the active pages, demoted oldest first.
        assert!(Arc::ptr_eq(&order[3], &small));
    }

    #[test]
    fn a_batch_finds_its_stream_among_another_streams_folios() {
        let a = Arc::new(FolioTable::new(FolioSize::K4, 64, 0x1000_0000).unwrap());
        let b = Arc::new(FolioTable::new(FolioSize::K4, 64, 0x2000_0000).unwrap());
        let lru = Lru::default();
        // Two streams interleaved on the LRU, as two threads writing in order leave them.
        for page in 0..64 {
            lru.push(a.clone(), page, FolioSize::K4, 0, false);
            lru.push(b.clone(), page, FolioSize::K4, 0, false);
        }
        let first = lru.pop().unwrap();
        assert!(Arc::ptr_eq(&first.table, &a) && first.page == 0);
        let mut run = vec![first.page];
        while let Some(next) = lru.pop_near_front_if(|c| Arc::ptr_eq(&c.table, &a) && c.page == run.last().unwrap() + 1) {
            run.push(next.page);
        }
        // A(k) sits behind B(0..k): found while k is within the lookahead.
        assert_eq!(run, (0..BATCH_LOOKAHEAD).collect::<Vec<_>>());
        // What the run passed over is still there, coldest first.
        let rest: Vec<(bool, usize)> = std::iter::from_fn(|| lru.pop()).map(|e| (Arc::ptr_eq(&e.table, &a), e.page)).collect();
        assert_eq!(rest.len(), 128 - BATCH_LOOKAHEAD);
        assert_eq!(&rest[..3], &[(false, 0), (false, 1), (false, 2)]);
        assert!(lru.pop_near_front_if(|_| true).is_none());
    }
}
