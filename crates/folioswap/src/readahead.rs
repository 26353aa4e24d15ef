//! Swap readahead (seed 002; the kernel's `swap_vma_readahead`/`swap_cluster_readahead`
//! in mm/swap_state.c): after a swap-in fault, bring the folio's neighbours into the swap
//! cache, unmapped, so that the faults that follow find them decompressed (or already
//! read from the file): a *readahead hit*, served by one UFFDIO_COPY with no
//! decompression or I/O.
//!
//! The path, in the order it runs:
//! 1. `readahead_after_fault` (the fault has installed its folio and woken its thread):
//!    pick the window (`ra_window.rs`) and the candidates in it (`plan_readahead`), then
//!    hand them to the helper thread (`ra_async`, the default) or read them here. A miss
//!    whose folio is on the swap file plans earlier, before its own read:
//!    `swapin_from_file` reads the window's neighbours on the file in the same call as
//!    the fault's folio and leaves only those in the pool for after the wake. A page of a
//!    split folio has no window: its second miss in a row in a 64 KiB block plans the
//!    block's pages on the file instead (`plan_file_siblings`);
//! 2. `read_ahead`: lock and stage each candidate without waiting (`prepare_readahead`:
//!    `try_lock`, charge, a free staging slot, or skip it), decompress the pool's, read
//!    the file's in slot order with one `preadv` per contiguous run, publish each as
//!    CACHED and unlock;
//! 3. a later fault finds CACHED and calls `install_readahead`: copy the copy in, free
//!    the pool entry or swap slot (the hit);
//! 4. a copy never used is dropped (`drop_copy_locked`: cache full, memory short, the
//!    folio discarded or split), counted in `swap_ra_waste`.
//!
//! **Which neighbours.** With `vma_ra_enabled` (the default) they are the folio's
//! *virtual* neighbours in its region, in a window placed in the direction the region's
//! faults travel and clamped to the region and to the 2 MiB around the fault. Otherwise
//! they are its neighbours in *slot order*: here the order of eviction, which is the order
//! the kernel's swap slots reflect ("the order of page reclaiming", seed 002) and, with a
//! swap file, the order slots are allocated in; an `EvictLog` (`ra_cache.rs`) maps
//! eviction clock values back to folio addresses for that.
//!
//! **How many.** A window that adapts to hits (`ra_window.rs`), recomputed on misses
//! only; a hit keeps it and *tops it up* (reads ahead whatever in the window is not
//! cached yet), so a sequential stream stays ahead of its faults instead of stalling once
//! per window as the kernel's does. With `ra_stride` (Leap's majority vote) a window is
//! laid along the stride most recent faults agree on.
//!
//! **The copy never goes stale**: a CACHED folio is not mapped, so any write to it first
//! faults, and that fault takes the copy; every path that discards a CACHED folio
//! (DONTNEED, munmap, region drop, split) drops the copy under the folio lock first.
//!
//! **No wasted allocation** (seed 003): nothing is taken for resident, cached, busy or
//! never-touched folios. The cache is bounded (at most half the staging slots of each
//! size and 1/16 of memory_high) and charged to memory_high as swap cache.

use crate::addrmap::ADDRESS_MAP;
use crate::charge::try_charge;
use crate::folio::{Kind, State, CACHED, PENDING, SPLIT};
use crate::install::{install_copy, InstallError};
use crate::memcg::Component;
use crate::mm::Mm;
use crate::ra_cache::RaRequest;
use crate::ra_window::{per_block, vma_window};
use crate::size::{FolioSize, PAGE_SIZE};
use crate::staging::{Slot, Taken};
use crate::table::FolioTable;
use crate::tier::{LoadError, SwapHandle, Tiers};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A folio being read ahead: locked, with a charged staging slot for its copy.
struct Prepared {
    table: Arc<FolioTable>,
    head: usize,
    s: State,
    handle: u64,
    slot: Slot,
    huge: bool,
    loaded: bool,
}

/// The readahead helper thread (`ra_async`): reads ahead what faults asked for.
pub(crate) fn ra_worker(mm: Arc<Mm>) {
    while let Some(request) = mm.ra.next_request(&mm.stop) {
        read_ahead(&mm, &request);
    }
}

/// Whether a folio in state `s` is worth reading ahead: swapped out, not cached yet, not
/// about to change, not split.
fn wants_readahead(s: State, folio: FolioSize) -> bool {
    let split = folio.order() > 0 && s.has(SPLIT);
    matches!(s.kind(), Kind::Pool | Kind::Swapped) && !s.has(CACHED) && !s.has(PENDING) && !split
}

/// After a swap-in fault at `head` (served, unlocked, its thread woken): pick the
/// neighbours to read ahead and read them, here or on the helper. `hit`: the fault
/// found its folio read ahead.
pub(crate) fn readahead_after_fault(mm: &Mm, table: &Arc<FolioTable>, head: usize, folio: FolioSize, hit: bool) {
    if let Some(request) = plan_readahead(mm, table, head, folio, hit) {
        start_readahead(mm, request);
    }
}

/// Read a planned request ahead: on the helper thread (`ra_async`) or here.
pub(crate) fn start_readahead(mm: &Mm, request: RaRequest) {
    if mm.config.ra_async {
        mm.ra.enqueue(request);
    } else {
        read_ahead(mm, &request);
    }
}

/// Sibling reads stop in a region once more than one copy in `WASTE_PER_HIT` read ahead
/// there went unused, after a trial of `SIBLING_TRIAL` hits' worth.
const WASTE_PER_HIT: u64 = 16;
const SIBLING_TRIAL: u64 = 64;

/// A page of a split folio missed (`page`, unlocked): on the second miss in a row in its
/// 64 KiB block, the block's other pages on the swap file, to be read ahead together (the
/// window does not read pages of split folios: it counts in folios). A file read costs
/// the disk's latency whatever its length up to 64 KiB: CPython's teardown faulted 273
/// pages of about 20 split 64 KiB folios from the file, one 4 KiB read each, about 13 a
/// folio (BENCHMARKS.md, "The swap file at teardown"). Pages in the pool are left: a
/// fault decompresses one in microseconds.
pub(crate) fn plan_file_siblings(mm: &Mm, table: &Arc<FolioTable>, page: usize) -> Option<RaRequest> {
    // Virtual neighbours, so only in the mode that reads by them (`vma_ra_enabled`).
    if mm.config.page_cluster == 0 || !mm.config.vma_ra_enabled || mm.tiers.file.is_none() {
        return None;
    }
    // Not where copies go unused: each costs a read, and memory that evicts another page.
    let ra = &table.ra;
    if ra.swap_ra_waste.get() * WASTE_PER_HIT > ra.swap_ra_hit.get() + SIBLING_TRIAL {
        return None;
    }
    // A 2 MiB folio's pages on the file are as many reads as its runs of slots: the block
    // stays 64 KiB, so that the faulting thread's next fault never queues behind more.
    let block = table.folio.pages().min(SWAPIN_READ_MAX / PAGE_SIZE);
    let first = page & !(block - 1);
    // Only on a second miss: read on every miss, sort's merges (one page of a folio, then
    // elsewhere) left a third of the copies unused and ran 15% slower at 0.6 of its footprint.
    if ra.last_piece_block.swap(first as u64 + 1, Ordering::Relaxed) != first as u64 + 1 {
        return None;
    }
    let folios: Vec<_> = (first..first + block)
        .filter(|&p| p != page)
        .filter(|&p| {
            let s = table.entry(p).load();
            s.kind() == Kind::Swapped && wants_readahead(s, FolioSize::K4)
        })
        .map(|p| (table.clone(), p))
        .collect();
    (!folios.is_empty()).then_some(RaRequest { folios, folio: FolioSize::K4, stride: false })
}

/// The neighbours of a swap-in at `head` worth reading ahead, and the region's window
/// moved on (a miss recomputes it, a hit keeps it): None if there are none, or if a hit
/// finds less than half of its window left to read.
fn plan_readahead(mm: &Mm, table: &Arc<FolioTable>, head: usize, folio: FolioSize, hit: bool) -> Option<RaRequest> {
    let cluster = mm.config.page_cluster;
    if cluster == 0 || folio.is_huge() {
        return None;
    }
    let max = 1u32 << cluster;
    let pages = folio.pages();
    let index = head / pages;
    let mut stride_used = false;
    let window: u32;
    let candidates: Vec<(Arc<FolioTable>, usize)> = if mm.config.vma_ra_enabled {
        let ra = &table.ra;
        let stride = if mm.config.ra_stride { ra.record_fault(index) } else { None };
        let (win, prev) = if hit { ra.state.seen(index) } else { ra.state.miss(index, max) };
        window = win;
        let nr = table.pages / pages;
        if let Some(d) = stride {
            stride_used = true;
            (1..=win.max(2) as i64)
                .map(|k| index as i64 + d * k)
                .take_while(|&i| i >= 0 && (i as usize) < nr)
                .map(|i| (table.clone(), i as usize * pages))
                .collect()
        } else {
            if win <= 1 {
                return None;
            }
            let (lo, hi) = vma_window(index, prev, win as usize, nr, per_block(folio));
            (lo..hi).filter(|&i| i != index).map(|i| (table.clone(), i * pages)).collect()
        }
    } else {
        let Some(log) = &mm.ra.log else { return None };
        // Slot order: positions on the eviction clock, in folios of this size.
        let clock = table.entry(head).evicted_at();
        let pos = (clock as usize / pages) as u32 as usize;
        let (win, _) = if hit { mm.ra.global.seen(pos) } else { mm.ra.global.miss(pos, max) };
        window = win;
        if win <= 1 {
            return None;
        }
        let span = win as usize * pages;
        let start = (clock as usize) & !(span - 1);
        (start..start + span)
            .filter(|&c| c as u32 != clock)
            .filter_map(|c| log.get(c as u32))
            .filter_map(|addr| ADDRESS_MAP.lookup(addr))
            .filter(|(entry, page)| entry.engine.id == mm.id && entry.table.folio == folio && *page % pages == 0)
            .map(|(entry, page)| (entry.table, page))
            .collect()
    };
    let folios: Vec<_> = candidates.into_iter().filter(|(t, h)| wants_readahead(t.entry(*h).load(), folio)).collect();
    // A hit tops the window up only once half of it is consumed, so that the reads go
    // out in runs rather than one folio per fault.
    if folios.is_empty() || (hit && folios.len() * 2 < window as usize) {
        return None;
    }
    Some(RaRequest { folios, folio, stride: stride_used })
}

/// Read a request's folios ahead: lock and stage each (skipping busy or unsuitable
/// ones, never waiting), decompress the pool's, read the file's in slot order with one
/// `preadv` per contiguous run, then publish each as CACHED and unlock it.
fn read_ahead(mm: &Mm, r: &RaRequest) {
    let Some(_active) = mm.reclaim.begin_work(&mm.memcg) else { return };
    let mut staged: Vec<Prepared> = r.folios.iter().filter_map(|(t, h)| prepare_readahead(mm, t, *h, r.folio)).collect();
    if staged.is_empty() {
        return;
    }
    load_from_pool(mm, &mut staged);
    // A failed read is for the faults that want these folios to meet and report.
    let _ = read_from_file(mm, &mut staged, None);
    publish_copies(mm, staged, r.folio, r.stride);
}

/// The most a fault's own read carries, its folio included: on this disk a read's time
/// grows with its length past about 64 KiB (../shared/design/MEASUREMENTS.md: 4 KiB
/// 52–68 µs, 64 KiB at 0.45 GB/s), and a faulting thread should not wait for more.
pub(crate) const SWAPIN_READ_MAX: usize = 64 << 10;

/// A swap-in fault of `folio` at `head` (locked by the caller) whose data is on the swap
/// file, into `dst`: read its window's nearest neighbours on the file in the same I/O
/// (up to `SWAPIN_READ_MAX` in all), as the kernel's `swap_vma_readahead` plugs the
/// window's reads with the fault's own and the block layer merges them. A stream that
/// outruns the helper (or starts) would otherwise pay one read for its own 4 KiB and
/// another for the window, the second often too late for the next fault. The rest of the
/// window (farther neighbours, those in the pool) is returned, to be read ahead once the
/// faulting thread is woken (the plan is made: the caller does not plan again). The
/// fault's own data is checked as `Tiers::load` checks it; if the combined read fails,
/// its folio is read alone, so that a neighbour's bad slot never fails this fault.
pub(crate) fn swapin_from_file(
    mm: &Mm,
    table: &Arc<FolioTable>,
    head: usize,
    folio: FolioSize,
    handle: u64,
    dst: &mut [u8],
) -> (Result<(), LoadError>, Option<RaRequest>) {
    let load_alone = |dst: &mut [u8]| mm.tiers.load(Kind::Swapped, handle, dst, &mm.counters);
    let Some(plan) = plan_readahead(mm, table, head, folio, false) else { return (load_alone(dst), None) };
    let Some(_active) = mm.reclaim.begin_work(&mm.memcg) else { return (load_alone(dst), None) };
    let (mut on_file, mut rest): (Vec<_>, Vec<_>) = plan.folios.into_iter().partition(|(t, h)| t.entry(*h).load().kind() == Kind::Swapped);
    on_file.sort_by_key(|(_, h)| h.abs_diff(head));
    let carried = (SWAPIN_READ_MAX / folio.bytes()).saturating_sub(1).min(on_file.len());
    rest.extend(on_file.drain(carried..));
    let rest = (!rest.is_empty()).then_some(RaRequest { folios: rest, folio, stride: plan.stride });
    let mut staged: Vec<Prepared> = on_file.iter().filter_map(|(t, h)| prepare_readahead(mm, t, *h, folio)).collect();
    // A neighbour that went to the pool meanwhile (never expected: the file does not
    // give folios back) is decompressed as the helper would.
    load_from_pool(mm, &mut staged);
    let own = SwapHandle::from_raw(handle);
    let loaded = match read_from_file(mm, &mut staged, Some((own.slot, &mut *dst))) {
        Ok(()) => mm.tiers.check(own, dst, &mm.counters),
        Err(_) => load_alone(dst),
    };
    publish_copies(mm, staged, folio, plan.stride);
    (loaded, rest)
}

/// Decompress the staged folios that are in the pool.
fn load_from_pool(mm: &Mm, staged: &mut [Prepared]) {
    for p in staged.iter_mut().filter(|p| p.s.kind() == Kind::Pool) {
        // SAFETY: we own the slot until it is put back, and nothing else maps it.
        let dst = unsafe { mm.staging.slice_mut(p.slot) };
        p.loaded = mm.tiers.load(Kind::Pool, p.handle, dst, &mm.counters).is_ok();
    }
}

/// Read the staged folios that are on the swap file, and `extra` (a slot and its
/// buffer: a fault's own folio) with them, in slot order with one `preadv` per
/// contiguous run; check each staged one. A failed read is counted once and returned.
fn read_from_file(mm: &Mm, staged: &mut [Prepared], extra: Option<(u64, &mut [u8])>) -> std::io::Result<()> {
    let mut file: Vec<&mut Prepared> = staged.iter_mut().filter(|p| p.s.kind() == Kind::Swapped).collect();
    if file.is_empty() && extra.is_none() {
        return Ok(());
    }
    let dev = mm.tiers.file.as_ref().expect("a Swapped folio implies a swap file");
    let mut ios: Vec<(u64, &mut [u8])> = file
        .iter()
        // SAFETY: each slot is ours alone until put back, and nothing else maps it.
        .map(|p| (SwapHandle::from_raw(p.handle).slot, unsafe { mm.staging.slice_mut(p.slot) }))
        .chain(extra)
        .collect();
    ios.sort_by_key(|(slot, _)| *slot);
    let read = dev.io.read_batch(&mut ios);
    drop(ios);
    if read.is_err() {
        mm.counters.vm.swap_read_error.inc();
        return read;
    }
    for p in file.iter_mut() {
        // SAFETY: as above.
        let data = unsafe { mm.staging.slice_mut(p.slot) };
        p.loaded = mm.tiers.check(SwapHandle::from_raw(p.handle), data, &mm.counters).is_ok();
    }
    Ok(())
}

/// Publish the staged folios that loaded as CACHED copies and unlock every one; give
/// back the slot and charge of those that did not.
fn publish_copies(mm: &Mm, staged: Vec<Prepared>, folio: FolioSize, stride: bool) {
    for p in staged {
        let e = p.table.entry(p.head);
        if !p.loaded {
            mm.staging.put_filled(p.slot, p.huge, &mm.memcg);
            mm.memcg.uncharge(Component::SwapCache, folio.bytes() as u64);
            e.unlock();
            continue;
        }
        // Counted before the copy can be used (or dropped): hits and waste never
        // outrun swap_ra, at any instant.
        Tiers::count_load(p.s.kind(), folio, &mm.counters);
        mm.counters.vm.swap_ra.inc();
        p.table.ra.swap_ra.inc();
        if stride {
            mm.counters.vm.swap_ra_stride.inc();
        }
        mm.ra.cache.insert(&p.table, p.head, p.slot, p.huge, folio);
        e.set_locked(p.s.with(CACHED, true));
        e.unlock();
    }
}

/// Lock one swapped-out folio and give it a charged staging slot for its copy; None
/// (and nothing held) if it is busy, unsuitable, or there is no room.
fn prepare_readahead(mm: &Mm, table: &Arc<FolioTable>, head: usize, folio: FolioSize) -> Option<Prepared> {
    if table.dead.load(Ordering::Relaxed) || !make_room(mm, folio) {
        return None;
    }
    let bytes = folio.bytes() as u64;
    let e = table.entry(head);
    let s = e.try_lock()?;
    if !wants_readahead(s, folio) {
        e.unlock();
        return None;
    }
    // Within memory_high, as any allocation, never reclaiming for it.
    if !try_charge(mm, Component::SwapCache, bytes) {
        e.unlock();
        return None;
    }
    let Ok(Some(Taken { slot, from_reserve, huge })) = mm.staging.try_take_filled(folio.order()) else {
        mm.memcg.uncharge(Component::SwapCache, bytes);
        e.unlock();
        return None;
    };
    if from_reserve {
        mm.memcg.uncharge(Component::StagingFree, bytes);
    }
    Some(Prepared { table: table.clone(), head, s, handle: e.handle(), slot, huge, loaded: false })
}

/// Drop the oldest copies until one more of `folio`'s size fits. False if the cache
/// is full of copies someone holds (a fault is taking them).
fn make_room(mm: &Mm, folio: FolioSize) -> bool {
    let mut tries = 8;
    while !mm.ra.cache.has_room(folio) {
        let Some((table, head, seq)) = mm.ra.cache.oldest() else { return false };
        tries -= 1;
        if tries == 0 {
            return false;
        }
        let e = table.entry(head);
        if e.try_lock().is_none() {
            return false;
        }
        drop_copy_locked(mm, &table, head, Some(seq));
        e.unlock();
    }
    true
}

/// Drop the folio's (locked by the caller) readahead copy unused, if it has one (of
/// insertion `seq`, when given): release its slot and charge, clear CACHED, count the
/// waste. Returns the bytes freed.
fn drop_copy_locked(mm: &Mm, table: &Arc<FolioTable>, head: usize, seq: Option<u64>) -> u64 {
    let e = table.entry(head);
    let s = e.load();
    if !s.has(CACHED) {
        return 0;
    }
    let Some(copy) = mm.ra.cache.take(table, head, seq) else { return 0 };
    mm.staging.put_filled(copy.slot, copy.huge, &mm.memcg);
    mm.memcg.uncharge(Component::SwapCache, copy.bytes);
    e.set_locked(s.with(CACHED, false));
    mm.counters.vm.swap_ra_waste.inc();
    table.ra.swap_ra_waste.inc();
    copy.bytes
}

/// The folio (locked by the caller) is being discarded or split: drop its readahead
/// copy, unused. Its state word loses CACHED; callers writing a state from an older
/// snapshot clear it too.
pub(crate) fn forget_readahead(mm: &Mm, table: &Arc<FolioTable>, head: usize) {
    drop_copy_locked(mm, table, head, None);
    // A flag with no copy behind it (never expected) goes too.
    table.entry(head).clear_locked(CACHED);
}

/// Memory is short: drop every readahead copy nobody is using. Returns bytes freed.
pub(crate) fn drain_readahead(mm: &Mm) -> u64 {
    let mut freed = 0;
    while let Some((table, head, seq)) = mm.ra.cache.oldest() {
        let e = table.entry(head);
        if e.try_lock().is_none() {
            break;
        }
        freed += drop_copy_locked(mm, &table, head, Some(seq));
        e.unlock();
    }
    freed
}

/// A fault found its folio (locked by the caller) read ahead, or `map_ahead` maps it
/// before any fault (`ahead`): install the copy, then free the pool entry or swap slot.
/// `None` if the copy is missing (never expected).
pub(crate) fn install_readahead(
    mm: &Mm,
    table: &Arc<FolioTable>,
    head: usize,
    folio: FolioSize,
    s: State,
    ahead: bool,
) -> Option<Result<(), InstallError>> {
    let slot = mm.ra.cache.slot_of(table, head)?;
    // Counted before the copy maps the folio: a copy mapped ahead is one its owner may
    // touch, finish and read the stats before this thread gets past the copy, and a count
    // must never lag an access the program has made. Hits first and taken back last, so
    // that `swap_ra_mapped <= swap_ra_hit` at every instant.
    let vm = &mm.counters.vm;
    vm.swap_ra_hit.inc();
    table.ra.swap_ra_hit.inc();
    if ahead {
        vm.swap_ra_mapped.inc();
    }
    if let Err(err) = install_copy(mm, table, head, folio, mm.staging.addr(slot)) {
        if ahead {
            vm.swap_ra_mapped.take_back(1);
        }
        table.ra.swap_ra_hit.take_back(1);
        vm.swap_ra_hit.take_back(1);
        return Some(Err(err));
    }
    let copy = mm.ra.cache.take(table, head, None).expect("the copy is ours under the folio lock");
    mm.tiers.free(s.kind(), table.entry(head).handle(), folio);
    mm.memcg.transfer(Component::SwapCache, Component::Resident, copy.bytes);
    mm.staging.put_filled(copy.slot, copy.huge, &mm.memcg);
    if mm.config.vma_ra_enabled {
        table.ra.state.hit();
    } else {
        mm.ra.global.hit();
    }
    Some(Ok(()))
}
