//! Regions: managed mappings, their folio tables, and the address map that finds them.
//!
//! A [`Region`] is what `Engine::map` hands out: an anonymous mapping registered with the
//! engine's userfaultfd, whose every page has an entry in a [`FolioTable`]. The table
//! outlives address-space changes: `munmap` of part of a region takes pages out of the
//! address map (they become Gone), and `mremap` moves pages to another address while they
//! keep their entries, so a table's pages may end up in several *pieces*. The address map
//! is process-wide because a SIGBUS handler, which serves faults in signal mode, can only
//! find an engine from the faulting address.
//!
//! Pieces change only under the event gate held exclusively (see `events.rs`); everything
//! that turns a page into an address for an ioctl holds the gate shared.

use crate::folio::PageEntry;
use crate::size::{FolioSize, PAGE_SIZE};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, RwLock};

/// Per-region policy.
#[derive(Clone, Debug, Default)]
pub struct RegionOptions {
    pub(crate) folio_size: Option<FolioSize>,
    pub(crate) keep_on_fork: bool,
}

impl RegionOptions {
    /// The folio size the region swaps in: `"4K"` … `"2M"`.
    pub fn folio_size(mut self, size: &str) -> crate::Result<Self> {
        let folio = size.parse().map_err(|_| crate::Error::config("folio_size", size, FolioSize::ACCEPTED))?;
        self.folio_size = Some(folio);
        Ok(self)
    }

    /// Let a forked child inherit the region's memory (by default it does not, as with
    /// MADV_DONTFORK). The child then gets exactly what the region held at the fork only
    /// if the fork happens between [`Engine::prepare_fork`](crate::Engine::prepare_fork)
    /// and its guard's `parent`/`child`, which bring the swapped-out folios back first.
    pub fn keep_on_fork(mut self, on: bool) -> Self {
        self.keep_on_fork = on;
        self
    }

    pub fn folio(mut self, folio: FolioSize) -> Self {
        self.folio_size = Some(folio);
        self
    }
}

/// Reserve `len` bytes of address space aligned to `align` (a power of two). Returns the
/// address or the errno of the failed mmap.
pub(crate) fn map_aligned(len: usize, align: usize) -> Result<usize, i32> {
    let total = len.checked_add(align).ok_or(libc::ENOMEM)?;
    // SAFETY: an anonymous private mapping at a kernel-chosen address touches no existing memory.
    let p = unsafe {
        crate::sys::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::ENOMEM));
    }
    let start = p as usize;
    let aligned = (start + align - 1) & !(align - 1);
    // SAFETY: both trims lie inside the mapping just created and nothing refers to them.
    unsafe {
        if aligned > start {
            crate::sys::munmap(p, aligned - start);
        }
        let end = start + total;
        if end > aligned + len {
            crate::sys::munmap((aligned + len) as *mut libc::c_void, end - (aligned + len));
        }
    }
    Ok(aligned)
}

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
    /// The region's readahead window and counters (`readahead.rs`).
    pub ra: crate::readahead::RegionRa,
    /// A forked child inherits the region (`fork.rs`).
    pub keep_on_fork: bool,
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
            ra: Default::default(),
            keep_on_fork: false,
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
        pieces
            .iter()
            .find(|p| page >= p.page && page < p.page + p.pages)
            .map(|p| p.addr + (page - p.page) * PAGE_SIZE)
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

    /// Whether the folio's pages are mapped in one contiguous run (then it can move whole).
    pub fn folio_addr(&self, head: usize, pages: usize) -> Option<usize> {
        let runs = self.mapped_runs(head, pages);
        (runs.len() == 1 && runs[0].pages == pages).then(|| runs[0].addr)
    }
}

impl Drop for FolioTable {
    fn drop(&mut self) {
        let bytes = (self.pages * std::mem::size_of::<PageEntry>()).next_multiple_of(PAGE_SIZE);
        // SAFETY: the entries mapping is owned by this table and nothing refers to it now.
        unsafe { crate::sys::munmap(self.entries as *mut libc::c_void, bytes) };
    }
}

/// One mapped piece in the address map.
#[derive(Clone)]
pub(crate) struct MapEntry {
    pub end: usize,
    pub table: Arc<FolioTable>,
    pub page: usize,
    /// The engine that owns the table.
    pub engine: Arc<crate::engine::Shared>,
}

/// Address → table page, process-wide.
#[derive(Default)]
pub(crate) struct AddressMap {
    map: RwLock<BTreeMap<usize, MapEntry>>,
}

/// A piece of the address space affected by an event: a table's pages `[page, page+pages)`.
pub(crate) struct Affected {
    pub table: Arc<FolioTable>,
    /// Where the pages were mapped when the event happened.
    pub addr: usize,
    pub page: usize,
    pub pages: usize,
    pub engine: Arc<crate::engine::Shared>,
}

impl AddressMap {
    /// Hold the map across fork(), so that no thread is inside it when the process is
    /// copied (a child would inherit the lock held).
    pub fn lock_for_fork(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<usize, MapEntry>> {
        self.map.write().unwrap()
    }

    pub fn insert(&self, start: usize, entry: MapEntry) {
        self.map.write().unwrap().insert(start, entry);
    }

    pub fn lookup(&self, addr: usize) -> Option<(MapEntry, usize)> {
        let map = self.map.read().unwrap();
        let (&start, entry) = map.range(..=addr).next_back()?;
        (addr < entry.end).then(|| (entry.clone(), entry.page + (addr - start) / PAGE_SIZE))
    }

    /// The pieces of engine `engine` overlapping `[start, end)`, clipped to it.
    pub fn overlapping(&self, engine: u64, start: usize, end: usize) -> Vec<Affected> {
        let map = self.map.read().unwrap();
        let first = map.range(..=start).next_back().map(|(&s, _)| s).unwrap_or(start);
        map.range(first..end)
            .filter(|(&s, e)| s < end && e.end > start && e.engine.id == engine)
            .map(|(&s, e)| {
                let lo = s.max(start);
                let hi = e.end.min(end);
                Affected {
                    table: e.table.clone(),
                    addr: lo,
                    page: e.page + (lo - s) / PAGE_SIZE,
                    pages: (hi - lo) / PAGE_SIZE,
                    engine: e.engine.clone(),
                }
            })
            .collect()
    }

    /// Take engine `engine`'s pieces in `[start, end)` out of the map and the tables.
    pub fn remove_range(&self, engine: u64, start: usize, end: usize) -> Vec<Affected> {
        let affected = self.overlapping(engine, start, end);
        let mut map = self.map.write().unwrap();
        let keys: Vec<usize> =
            map.range(..end).filter(|(_, e)| e.end > start && e.engine.id == engine).map(|(&s, _)| s).collect();
        for s in keys {
            let e = map.remove(&s).expect("present");
            if s < start {
                map.insert(s, MapEntry { end: start, ..e.clone() });
            }
            if e.end > end {
                map.insert(end, MapEntry { page: e.page + (end - s) / PAGE_SIZE, ..e.clone() });
            }
        }
        drop(map);
        for a in &affected {
            let mut pieces = a.table.pieces.write().unwrap();
            let mut next = Vec::with_capacity(pieces.len() + 1);
            for p in pieces.iter() {
                let (lo, hi) = (a.page, a.page + a.pages);
                if hi <= p.page || lo >= p.page + p.pages {
                    next.push(*p);
                    continue;
                }
                if lo > p.page {
                    next.push(Piece { page: p.page, pages: lo - p.page, addr: p.addr });
                }
                if hi < p.page + p.pages {
                    next.push(Piece { page: hi, pages: p.page + p.pages - hi, addr: p.addr + (hi - p.page) * PAGE_SIZE });
                }
            }
            *pieces = next;
        }
        affected
    }

    /// Engine `engine`'s pages in `[from, from + len)` now live at `to`: move the pieces.
    pub fn move_range(&self, engine: u64, from: usize, to: usize, len: usize) -> Vec<Affected> {
        let moved = self.remove_range(engine, from, from + len);
        // Whatever the destination held before was unmapped by mremap and reported as UNMAP.
        let mut map = self.map.write().unwrap();
        for a in &moved {
            let addr = to + (a.addr - from);
            map.insert(addr, MapEntry { end: addr + a.pages * PAGE_SIZE, table: a.table.clone(), page: a.page, engine: a.engine.clone() });
            let mut pieces = a.table.pieces.write().unwrap();
            pieces.push(Piece { page: a.page, pages: a.pages, addr });
            pieces.sort_by_key(|p| p.page);
        }
        moved
    }

    /// Every piece of `table`, removed from the map (the region is being dropped).
    pub fn remove_table(&self, table: &FolioTable) -> Vec<Piece> {
        let pieces = std::mem::take(&mut *table.pieces.write().unwrap());
        let mut map = self.map.write().unwrap();
        for p in &pieces {
            map.remove(&p.addr);
        }
        pieces
    }

}
