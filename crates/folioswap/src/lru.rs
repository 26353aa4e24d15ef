//! The LRU of resident folios and the eviction clock (the kernel's lruvec and workingset
//! shadow clock). State only: `evict.rs` takes victims from it, `fault.rs` puts folios
//! back on it.
//!
//! Coldness is fault order plus refault distance. Without accessed bits (this kernel has
//! no idle page tracking, and async write-protect would split THP mappings on the first
//! write) what user space sees cheaply is when a folio faulted in and, for one that was
//! evicted before, how many pages were evicted since: its refault distance. Folios join
//! the tail of the inactive list when installed; one that refaults within the working-set
//! distance (fewer pages evicted since it left than memory_high holds) joins the active
//! list instead, as the kernel's workingset.c does. Eviction takes the inactive head and
//! demotes the active head while the inactive list is under a third of the whole.
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
}

impl LruEntry {
    pub fn folio(&self) -> FolioSize {
        FolioSize::from_order(self.order as u32).expect("valid order")
    }

    /// Whether the locked folio, now in state `s`, is still the resident folio this entry
    /// was queued for.
    pub fn is_current(&self, s: State) -> bool {
        s.kind() == Kind::Resident && s.gen() == self.gen && (self.order == 0 || !s.has(SPLIT))
    }
}

#[derive(Default)]
struct Lists {
    inactive: VecDeque<LruEntry>,
    active: VecDeque<LruEntry>,
}

#[derive(Default)]
pub(crate) struct Lru {
    /// A leaf lock: nothing else is taken while it is held.
    lists: Mutex<Lists>,
    /// Pages evicted so far (wrapping): the clock refault distances are measured on.
    evict_clock: AtomicU32,
}

impl Lru {
    pub fn push(&self, table: Arc<FolioTable>, page: usize, folio: FolioSize, gen: u16, active: bool) {
        let entry = LruEntry { table, page, order: folio.order() as u8, gen };
        let mut lists = self.lists.lock().unwrap();
        if active {
            lists.active.push_back(entry);
        } else {
            lists.inactive.push_back(entry);
        }
    }

    /// Put a candidate back at the tail (it was busy).
    pub fn requeue(&self, entry: LruEntry) {
        self.lists.lock().unwrap().inactive.push_back(entry);
    }

    /// The coldest candidate: the inactive head, after demoting active folios while the
    /// inactive list is under a third of all.
    pub fn pop(&self) -> Option<LruEntry> {
        let mut lists = self.lists.lock().unwrap();
        while lists.inactive.len() * 2 < lists.active.len() {
            let demoted = lists.active.pop_front().expect("nonempty");
            lists.inactive.push_back(demoted);
        }
        lists.inactive.pop_front().or_else(|| lists.active.pop_front())
    }

    /// Pop the next candidate only if it satisfies `pred` (extending an eviction batch).
    pub fn pop_next_if(&self, pred: impl Fn(&LruEntry) -> bool) -> Option<LruEntry> {
        let mut lists = self.lists.lock().unwrap();
        if lists.inactive.front().is_some_and(&pred) {
            lists.inactive.pop_front()
        } else {
            None
        }
    }

    pub fn len(&self) -> usize {
        let lists = self.lists.lock().unwrap();
        lists.inactive.len() + lists.active.len()
    }

    /// Advance the eviction clock by `pages`; returns the clock before.
    pub fn tick(&self, pages: u32) -> u32 {
        self.evict_clock.fetch_add(pages, Ordering::Relaxed)
    }

    /// Pages evicted since the clock read `then` (the refault distance).
    pub fn distance_since(&self, then: u32) -> u64 {
        self.evict_clock.load(Ordering::Relaxed).wrapping_sub(then) as u64
    }
}
