//! A region's folio table: one [`PageEntry`] per 4 KiB page of the region, and where the
//! region's pages are mapped now.
//!
//! The table outlives address-space changes: `munmap` of part of a region takes pages out
//! of the address map (they become Gone), and `mremap` moves pages to another address
//! while they keep their entries, so a table's pages may end up in several *pieces*.
//! Pieces change only under the event gate held exclusively (`gate.rs`); everything that
//! turns a page into an address for an ioctl holds the gate shared.

use crate::config::SwapinPolicy;
use crate::folio::{PageEntry, State, PENDING, SPLIT};
use crate::ra_window::RegionRa;
use crate::size::{FolioSize, PAGE_SIZE};
use crate::sys::map_aligned;
use crate::written::WrittenMap;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::RwLock;

/// A run of a table's pages mapped at one address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    pub page: usize,
    pub pages: usize,
    pub addr: usize,
}

/// The entries of one region's pages, and where those pages are mapped now.
pub(crate) struct FolioTable {
    pub folio: FolioSize,
    pub pages: usize,
    entries: *mut PageEntry,
    pub pieces: RwLock<Vec<Piece>>,
    /// Set when the region is dropped: LRU entries of a dead table are skipped.
    pub dead: AtomicBool,
    /// Folios of this table that an eviction moved out and has not yet published (or
    /// dropped): dropping the region waits for them, so that it returns everything.
    pub evicting: AtomicUsize,
    /// Copy-mode evictions past the gate that have still to zap their run
    /// (`evict.rs` `copy_out`): dropping the region waits for them before it unmaps, so
    /// that no zap lands on whatever is mapped at these addresses next.
    pub zapping: AtomicUsize,
    /// The region's readahead window and counters (`ra_window.rs`).
    pub ra: RegionRa,
    /// A forked child inherits the region (`fork.rs`).
    pub keep_on_fork: bool,
    /// How much of a large folio a swap-in brings back (`fault.rs`).
    pub swapin: SwapinPolicy,
    /// Registered write-protect on an async-WP userfaultfd: its pages' written bits,
    /// harvested by eviction (`written.rs`).
    pub written: Option<WrittenMap>,
}

// SAFETY: `entries` points to a mapping owned by the table for its whole life; every
// access goes through the atomic fields of PageEntry.
unsafe impl Send for FolioTable {}
// SAFETY: as above; shared access is only through atomics.
unsafe impl Sync for FolioTable {}

impl FolioTable {
    pub fn new(folio: FolioSize, pages: usize, addr: usize) -> Result<FolioTable, i32> {
        let bytes = (pages * std::mem::size_of::<PageEntry>()).next_multiple_of(PAGE_SIZE);
        let entries = map_aligned(bytes, PAGE_SIZE)?;
        // SAFETY: the range is the mapping just created; advice only changes paging policy.
        unsafe {
            crate::sys::madvise(entries as *mut libc::c_void, bytes, libc::MADV_NOHUGEPAGE);
            crate::sys::madvise(entries as *mut libc::c_void, bytes, libc::MADV_DONTFORK);
        }
        Ok(FolioTable {
            folio,
            pages,
            entries: entries as *mut PageEntry,
            pieces: RwLock::new(vec![Piece { page: 0, pages, addr }]),
            dead: AtomicBool::new(false),
            evicting: AtomicUsize::new(0),
            zapping: AtomicUsize::new(0),
            ra: Default::default(),
            keep_on_fork: false,
            swapin: SwapinPolicy::Always,
            written: None,
        })
    }

    pub fn entry(&self, page: usize) -> &PageEntry {
        assert!(page < self.pages, "page {page} outside a table of {}", self.pages);
        // SAFETY: in bounds; fresh anonymous memory is all-zero, a valid PageEntry, and
        // the mapping lives until the table is dropped.
        unsafe { &*self.entries.add(page) }
    }

    /// The first page of the folio holding `page`.
    pub fn head_of(&self, page: usize) -> usize {
        page & !(self.folio.pages() - 1)
    }

    /// Where `page` is mapped now. Callers hold the gate so pieces cannot change.
    pub fn addr_of(&self, page: usize) -> Option<usize> {
        let pieces = self.pieces.read().unwrap();
        pieces.iter().find(|p| page >= p.page && page < p.page + p.pages).map(|p| p.addr + (page - p.page) * PAGE_SIZE)
    }

    /// The mapped sub-runs of pages `[page, page + pages)`: (first page, count, address).
    pub fn mapped_runs(&self, page: usize, pages: usize) -> Vec<Piece> {
        let pieces = self.pieces.read().unwrap();
        let mut runs: Vec<Piece> = pieces
            .iter()
            .filter_map(|p| {
                let lo = page.max(p.page);
                let hi = (page + pages).min(p.page + p.pages);
                (lo < hi).then(|| Piece { page: lo, pages: hi - lo, addr: p.addr + (lo - p.page) * PAGE_SIZE })
            })
            .collect();
        runs.sort_by_key(|r| r.page);
        runs
    }

    /// Whether the folio's pages are mapped in one contiguous run (then it can move whole):
    /// the address of `[head, head + pages)` when one piece holds all of it.
    pub fn folio_addr(&self, head: usize, pages: usize) -> Option<usize> {
        let pieces = self.pieces.read().unwrap();
        pieces.iter().find(|p| head >= p.page && head + pages <= p.page + p.pages).map(|p| p.addr + (head - p.page) * PAGE_SIZE)
    }

    /// Make the large folio at `head` `pages` order-0 folios, one per page. The caller
    /// holds the folio's lock (its head entry) and the event gate shared, so that no event
    /// is marked against the folio meanwhile. Each page's entry is locked in turn (the
    /// head's already is) and takes the state and eviction clock that `page(i, its state,
    /// the folio's clock)` gives; an event pending on the folio stays pending on every
    /// page; the head is then marked SPLIT and stays locked.
    pub fn split_into_pages(&self, head: usize, pages: usize, mut page: impl FnMut(usize, State, u32) -> (State, u32)) {
        let e = self.entry(head);
        let pending = e.load().has(PENDING);
        let clock = e.evicted_at();
        for i in 0..pages {
            let pe = self.entry(head + i);
            let ps = if i == 0 { pe.load() } else { pe.lock() };
            let (next, evicted_at) = page(i, ps, clock);
            pe.set_evicted_at(evicted_at);
            pe.set_locked(next);
            if pending {
                pe.set_flag(PENDING);
            }
            if i != 0 {
                pe.unlock();
            }
        }
        e.set_locked(e.load().with(SPLIT, true));
    }
}

impl Drop for FolioTable {
    fn drop(&mut self) {
        let bytes = (self.pages * std::mem::size_of::<PageEntry>()).next_multiple_of(PAGE_SIZE);
        // SAFETY: the entries mapping is owned by this table and nothing refers to it now.
        unsafe { crate::sys::munmap(self.entries as *mut libc::c_void, bytes) };
    }
}
