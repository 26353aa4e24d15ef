//! The address map: every managed mapping of this process, whichever engine owns it,
//! from address to (table, page). Process-wide because a SIGBUS handler, which serves
//! faults in signal mode, can only find an engine from the faulting address.
//!
//! Written only under the owning engine's event gate held exclusively (`gate.rs`:
//! UNMAP and REMAP move pieces; `region.rs`: map and drop), and held alone across fork.

use crate::mm::Mm;
use crate::size::PAGE_SIZE;
use crate::table::{FolioTable, Piece};
use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock, RwLock};

/// Every managed mapping of this process, whichever engine owns it.
pub(crate) static ADDRESS_MAP: LazyLock<AddressMap> = LazyLock::new(AddressMap::default);

/// One mapped piece in the address map.
#[derive(Clone)]
pub(crate) struct MapEntry {
    pub end: usize,
    pub table: Arc<FolioTable>,
    pub page: usize,
    /// The engine that owns the table.
    pub engine: Arc<Mm>,
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
    pub engine: Arc<Mm>,
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

    /// The piece of engine `id` that holds `addr`, or else the first one above it, with
    /// its start: how the zero scan walks an engine's regions in address order.
    pub fn next_piece(&self, id: u64, addr: usize) -> Option<(usize, MapEntry)> {
        let map = self.map.read().unwrap();
        if let Some((&start, entry)) = map.range(..=addr).next_back() {
            if addr < entry.end && entry.engine.id == id {
                return Some((start, entry.clone()));
            }
        }
        let above = (std::ops::Bound::Excluded(addr), std::ops::Bound::Unbounded);
        map.range(above).find(|(_, entry)| entry.engine.id == id).map(|(&start, entry)| (start, entry.clone()))
    }

    /// Whether a piece whose engine passes `want` overlaps `[start, end)`. Never blocks
    /// and allocates nothing (a signal handler may ask): `None` when the map is being
    /// written or a writer waits for it.
    pub fn try_any_in(&self, start: usize, end: usize, want: impl Fn(&Mm) -> bool) -> Option<bool> {
        let map = self.map.try_read().ok()?;
        let first = map.range(..=start).next_back().map(|(&s, _)| s).unwrap_or(start);
        Some(map.range(first..end).any(|(&s, e)| s < end && e.end > start && want(&e.engine)))
    }

    /// The pieces overlapping `[start, end)` whose engine passes `want`, clipped to it, in
    /// address order, with their engine.
    pub fn ranges_in(&self, start: usize, end: usize, want: impl Fn(&Mm) -> bool) -> Vec<(usize, usize, Arc<Mm>)> {
        let map = self.map.read().unwrap();
        let first = map.range(..=start).next_back().map(|(&s, _)| s).unwrap_or(start);
        map.range(first..end)
            .filter(|(&s, e)| s < end && e.end > start && want(&e.engine))
            .map(|(&s, e)| (s.max(start), e.end.min(end), e.engine.clone()))
            .collect()
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
        let keys: Vec<usize> = map.range(..end).filter(|(_, e)| e.end > start && e.engine.id == engine).map(|(&s, _)| s).collect();
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
