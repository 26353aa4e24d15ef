//! The zero scan: while reclaim runs, resident folios that hold nothing but zeros are
//! found and put first in line for eviction.
//!
//! Programs keep zeroed memory they never use again: the tail of a hash table's entry
//! array cleared when the table grew, a buffer sized for the worst case, memory calloc'd
//! ahead. The kernel finds such pages cold by their accessed bits; user space sees none
//! here, and the LRU holds them wherever they were first written, behind pages the program
//! still uses. A zero folio is also the cheapest to evict (stored as a marker: no
//! compression, no pool space) and to bring back (a zero fill). The kernel's THP shrinker
//! acts on the same fact for the zero-filled pages of underused huge pages
//! (`thp_underused_split_page`, 6.12).
//!
//! So a scanner walks the engine's regions in address order, a chunk at a time from
//! kswapd, reads each resident folio and queues every all-zero one at the head of the
//! inactive list (`Lru::push_first`: an extra entry; the one it had goes stale once the
//! folio leaves). Folios that came in within the last memory_high/16 of evictions are
//! passed over, as by the eviction cluster: zeros installed ahead of a program's first
//! touches in sequence (`zero_ahead`) are about to be written, and evicting them cost each
//! a fault of its own. CPython's dict of 300 000 keys under 41M keeps 1.4 MiB of such zeros
//! in its table; found, they leave first and the dict's faults fall by 40-55%, though its
//! time not measurably: the scan is off by default (`FOLIOSWAP_ZERO_SCAN`; BENCHMARKS.md,
//! "Zeros leave first").
//!
//! **Pacing** (`zero_pace.rs`): 64 pages read per page evicted since the scanner last ran,
//! halved for each full pass that found next to no zeros, back up after one that found
//! some.
//!
//! **Reading a program's folio.** The folio is locked (no eviction moves it meanwhile) and
//! the event gate held shared (no REMOVE's zap lands before its event is read, and the
//! kernel waits for that read); its pages are checked present, and the copy goes through
//! the kernel (first the first bytes of each page, `sys::read_own_samples`, where data
//! mostly shows; then the whole folio, `sys::read_own_memory`), so that a page unmapped
//! meanwhile (a `munmap`,
//! whose UNMAP event follows the unmapping) ends the copy short instead of faulting: the
//! reads of copy mode's eviction (`evict.rs` `copy_out`) are made the same way. The
//! scanner's own state is taken with `try_lock` before anything else, so a second
//! reclaimer skips the scan rather than waiting for it.

use crate::addrmap::ADDRESS_MAP;
use crate::folio::{Kind, PENDING, SPLIT};
use crate::mm::Mm;
use crate::size::{FolioSize, PAGE_SIZE};
use crate::table::FolioTable;
use crate::zero_pace::ScanState;
use crate::zswap::is_zero;
use std::sync::Arc;

/// Most folio pages one run walks past (resident or not).
const MAX_WALK: usize = 8192;
/// Bytes read at the start of each page before a whole folio is.
const SAMPLE: usize = 64;

/// Run the scanner for as long as the evictions since its last run allow; returns the
/// pages it found zero and queued first.
pub(crate) fn scan_for_zeros(mm: &Mm) -> u64 {
    let Some(mut st) = mm.zero_scan.try_take() else { return 0 };
    let Some(budget) = st.budget(mm.lru.now()) else { return 0 };
    run(mm, &mut st, budget)
}

/// Read up to `budget` pages of resident folios from the cursor on.
fn run(mm: &Mm, st: &mut ScanState, budget: u64) -> u64 {
    let (mut read, mut found, mut walked) = (0u64, 0u64, 0usize);
    let mut wrapped = false;
    while read < budget && walked < MAX_WALK {
        let Some((start, piece)) = ADDRESS_MAP.next_piece(mm.id, st.cursor) else {
            // Past the last region: the pass is over.
            st.end_pass();
            if wrapped {
                break;
            }
            wrapped = true;
            continue;
        };
        let table = &piece.table;
        let from = st.cursor.max(start);
        let page = piece.page + (from - start) / PAGE_SIZE;
        let last = piece.page + (piece.end - start) / PAGE_SIZE;
        let head = table.head_of(page);
        let split = table.folio.order() == 0 || table.entry(head).load().has(SPLIT);
        let (target, folio) = if split { (page, FolioSize::K4) } else { (head, table.folio) };
        let next = target + folio.pages();
        walked += folio.pages();
        // A folio that begins before this piece or runs past it (the region was moved in
        // parts) is left alone.
        if target >= piece.page && next <= last && !table.dead.load(std::sync::atomic::Ordering::Relaxed) {
            let pages = folio.pages() as u64;
            let (r, f) = match check_folio(mm, table, target, folio, &mut st.buf) {
                Checked::Skipped => (0, 0),
                Checked::Data => (pages, 0),
                Checked::Zero => (pages, pages),
            };
            (read, found) = (read + r, found + f);
            st.count(r, f);
        }
        st.cursor = start + (next.min(last) - piece.page) * PAGE_SIZE;
    }
    let vm = &mm.counters.vm;
    vm.pgscan_zero.add(read);
    vm.pgscan_zero_found.add(found);
    found
}

enum Checked {
    /// Not resident, busy, or not readable now.
    Skipped,
    Data,
    /// All zero: queued at the head of the inactive list.
    Zero,
}

/// Lock the folio at `target`; if it is resident, read it and queue it first if it is all
/// zero.
fn check_folio(mm: &Mm, table: &Arc<FolioTable>, target: usize, folio: FolioSize, buf: &mut Vec<u8>) -> Checked {
    let e = table.entry(target);
    if e.load().kind() != Kind::Resident {
        return Checked::Skipped;
    }
    // A folio that came in lately is left alone, as by the eviction cluster (`evict.rs`
    // `cluster_neighbours`): zeros installed ahead of a program's first touches in sequence
    // (`fault.rs` `zero_ahead`) are about to be written.
    let young = mm.memcg.limit.unwrap_or(u64::MAX) / PAGE_SIZE as u64 / 16;
    if mm.lru.distance_since(e.installed_at()) < young {
        return Checked::Skipped;
    }
    let Some(s) = e.try_lock() else { return Checked::Skipped };
    let current = s.kind() == Kind::Resident && !s.has(PENDING) && (folio.order() == 0 || !s.has(SPLIT));
    let checked = if current {
        match read_folio(mm, table, target, folio, buf) {
            Some(true) => {
                mm.lru.push_first(table.clone(), target, folio, s.gen());
                Checked::Zero
            }
            Some(false) => Checked::Data,
            None => Checked::Skipped,
        }
    } else {
        Checked::Skipped
    };
    e.unlock();
    checked
}

/// Whether the locked resident folio at `target` is all zero; `None` where it cannot be
/// read now (moved, unmapped, a page not present).
fn read_folio(mm: &Mm, table: &FolioTable, target: usize, folio: FolioSize, buf: &mut Vec<u8>) -> Option<bool> {
    let _gate = mm.gate.read().unwrap();
    let addr = table.folio_addr(target, folio.pages())?;
    let len = folio.bytes();
    if !mm.staging.all_present(addr, len) {
        return None;
    }
    // The first bytes of each page first: most pages that hold data show it there, and a
    // 2 MiB folio is then rejected for 512 small reads instead of a 2 MiB copy.
    let sampled = folio.pages() * SAMPLE;
    buf.resize(len.max(sampled), 0);
    // SAFETY: `buf` holds at least `sampled` bytes this thread owns, no reference into it alive.
    let got = unsafe { crate::sys::read_own_samples(buf.as_mut_ptr() as usize, addr, len, PAGE_SIZE, SAMPLE) };
    if got != sampled {
        return None;
    }
    if !is_zero(&buf[..sampled]) {
        return Some(false);
    }
    // SAFETY: as above, `len` bytes.
    let copied = unsafe { crate::sys::read_own_memory(buf.as_mut_ptr() as usize, addr, len) };
    (copied == len).then(|| is_zero(&buf[..len]))
}

#[cfg(test)]
mod tests {
    use crate::zswap::is_zero;

    #[test]
    fn a_single_set_byte_anywhere_makes_a_folio_data() {
        let mut page = vec![0u8; 4096 + 3];
        assert!(is_zero(&page[1..]));
        for at in [1, 8, 4095, 4096 + 2] {
            page[at] = 1;
            assert!(!is_zero(&page[1..]), "a byte at {at}");
            page[at] = 0;
        }
    }
}
