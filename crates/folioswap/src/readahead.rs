//! Swap readahead (seed 002; the kernel's `swap_vma_readahead`/`swap_cluster_readahead`
//! in mm/swap_state.c).
//!
//! On a swap-in fault the engine also brings the folio's neighbours into the swap cache,
//! unmapped, so that the faults that follow find them decompressed (or already read from
//! the file): a *readahead hit*, served by one UFFDIO_COPY with no decompression or I/O.
//!
//! **Which neighbours.** With `vma_ra_enabled` (the default) they are the folio's
//! *virtual* neighbours in its region, in a window placed in the direction the region's
//! faults travel and clamped to the region and to the 2 MiB around the fault. Otherwise
//! they are its neighbours in *slot order*: here the order of eviction, which is the order
//! the kernel's swap slots reflect ("the order of page reclaiming", seed 002) and, with a
//! swap file, the order slots are allocated in. An [`EvictLog`] ring maps eviction clock
//! values back to folio addresses for that.
//!
//! **How many.** A window that adapts to hits, as `__swapin_nr_pages` does: the hits since
//! the last miss plus 2, rounded up to a power of two and capped at 2^`page_cluster`
//! folios; with no hits it stays 1 (no readahead) unless the fault is next to the previous
//! one; and it never shrinks by more than half per miss. VMA readahead keeps this state per
//! region, packed in one word (previous fault, window, hits) updated without a lock as the
//! kernel's `vma->swap_readahead_info` is; slot-order readahead keeps one global state.
//! The window is recomputed on misses only; a hit keeps it and *tops it up* (reads ahead
//! whatever in the window is not cached yet), so a sequential stream stays ahead of its
//! faults instead of stalling once per window as the kernel's does.
//!
//! **Stride** (`ra_stride`, beyond the seed: Leap's majority vote). Each region keeps its
//! last faults; when most of the recent deltas agree on one stride of two folios or more,
//! the window is laid along it instead of around the fault.
//!
//! **The readahead copy.** A folio read ahead keeps its pool entry or swap slot and gains
//! the `CACHED` flag: a decompressed copy sits in a staging slot of its size, recorded in
//! the [`RaCache`]. This is the kernel's clean swap-cache folio: a hit installs the copy
//! and only then frees the backing entry; a copy never used is simply dropped (no
//! recompression, no write), counted in `swap_ra_waste`. The copy never goes stale: a
//! CACHED folio is not mapped, so any write to it first faults, and that fault takes the
//! copy; every path that discards a CACHED folio (DONTNEED, munmap, region drop, split)
//! drops the copy under the folio lock first.
//!
//! **No wasted allocation** (seed 003): a candidate is locked with `try_lock` and skipped
//! unless it is swapped out (Pool or Swapped) and not already cached; nothing is taken for
//! resident, cached, busy or never-touched folios. The cache is bounded (at most half the
//! staging slots of each size and 1/16 of memory_high) and charged to memory_high as swap
//! cache; when full, its oldest copies are dropped.
//!
//! **Off the fault path** (`ra_async`, default on): the fault installs its own folio and
//! wakes its thread first; the neighbours are decompressed or read by a helper thread.

use crate::engine::{Shared, ADDRESS_MAP};
use crate::folio::{Kind, State, CACHED, PENDING, SPLIT};
use crate::memcg::Component;
use crate::page_io::SwapHandle;
use crate::swapfile::io::folio_checksum;
use crate::region::FolioTable;
use crate::size::{FolioSize, HUGE_SIZE};
use crate::staging::{Slot, Staging};
use crate::stats::{Counter, RegionReadahead};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// The readahead window for a miss, from the hits since the last one: the kernel's
/// `__swapin_nr_pages`, in folios. `adjacent`: the fault is next to the previous one.
pub(crate) fn swapin_nr_folios(adjacent: bool, hits: u32, max: u32, prev_win: u32) -> u32 {
    let mut win = hits + 2;
    if win == 2 {
        // No hits to judge by: read ahead only for a fault next to the previous one.
        if !adjacent {
            win = 1;
        }
    } else {
        win = win.next_power_of_two().max(4);
    }
    win = win.min(max);
    // Don't shrink readahead too fast.
    win.max(prev_win / 2).max(1)
}

/// Where a window of `win` folios goes around the fault at folio `fault`, given the
/// previous fault `prev` (the kernel's `swap_ra_clamp_pfn` placement): ahead of a fault
/// that follows its predecessor, behind one that precedes it, centred otherwise; then
/// clamped to the region's `nr` folios and to the 2 MiB block around the fault
/// (`per_block` folios). Returns the half-open range of folio indices, fault included.
pub(crate) fn vma_window(fault: usize, prev: Option<usize>, win: usize, nr: usize, per_block: usize) -> (usize, usize) {
    let (lo, hi) = match prev {
        Some(p) if p + 1 == fault => (fault, fault + win),
        Some(p) if fault + 1 == p => ((fault + 1).saturating_sub(win), fault + 1),
        _ => {
            let left = (win - 1) / 2;
            (fault.saturating_sub(left), fault.saturating_sub(left) + win)
        }
    };
    let block = fault - fault % per_block.max(1);
    let lo = lo.max(block);
    let hi = hi.min(block + per_block.max(1)).min(nr);
    (lo, hi.max(lo))
}

/// Folios of `folio` size in the 2 MiB around a fault.
pub(crate) fn per_block(folio: FolioSize) -> usize {
    (HUGE_SIZE / folio.bytes()).max(1)
}

const HISTORY: usize = 8;

/// The stride most of `faults`' consecutive deltas agree on (Boyer-Moore majority vote),
/// if more than half do and it is at least 2 folios either way (1 is the plain window's).
pub(crate) fn majority_stride(faults: &[usize]) -> Option<i64> {
    if faults.len() < 4 {
        return None;
    }
    let deltas: Vec<i64> = faults.windows(2).map(|w| w[1] as i64 - w[0] as i64).collect();
    let (mut candidate, mut votes) = (0i64, 0usize);
    for &d in &deltas {
        if votes == 0 {
            candidate = d;
            votes = 1;
        } else if d == candidate {
            votes += 1;
        } else {
            votes -= 1;
        }
    }
    let count = deltas.iter().filter(|&&d| d == candidate).count();
    (count * 2 > deltas.len() && candidate.abs() >= 2).then_some(candidate)
}

/// Readahead state packed in one word, as the kernel packs `swap_readahead_info`:
/// previous fault folio + 1 (0: none) in the high 40 bits, window in 12, hits in 12.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RaInfo {
    pub prev: Option<usize>,
    pub win: u32,
    pub hits: u32,
}

impl RaInfo {
    fn pack(self) -> u64 {
        let prev = self.prev.map_or(0, |p| p as u64 + 1) & ((1 << 40) - 1);
        (prev << 24) | ((self.win.min(0xFFF) as u64) << 12) | self.hits.min(0xFFF) as u64
    }
    fn unpack(word: u64) -> RaInfo {
        let prev = word >> 24;
        RaInfo { prev: (prev != 0).then(|| prev as usize - 1), win: ((word >> 12) & 0xFFF) as u32, hits: (word & 0xFFF) as u32 }
    }
}

/// A readahead window's state: per region (VMA readahead) or global (slot order).
#[derive(Default)]
pub(crate) struct RaState {
    info: AtomicU64,
}

impl RaState {
    pub fn load(&self) -> RaInfo {
        RaInfo::unpack(self.info.load(Ordering::Relaxed))
    }
    pub fn store(&self, info: RaInfo) {
        self.info.store(info.pack(), Ordering::Relaxed);
    }
    /// A readahead hit: one more hit towards the next window.
    pub fn hit(&self) {
        let _ = self.info.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
            let mut i = RaInfo::unpack(w);
            i.hits = (i.hits + 1).min(0xFFF);
            Some(i.pack())
        });
    }
    /// A miss at `fault`: the new window from the hits since the last miss (reset), the
    /// fault remembered. Returns the window and the previous fault.
    pub fn miss(&self, fault: usize, max: u32) -> (u32, Option<usize>) {
        let old = self.load();
        let adjacent = old.prev.is_some_and(|p| p + 1 == fault || fault + 1 == p);
        let win = swapin_nr_folios(adjacent, old.hits, max, old.win);
        self.store(RaInfo { prev: Some(fault), win, hits: 0 });
        (win, old.prev)
    }
    /// A hit at `fault`: keep the window, remember the fault.
    pub fn seen(&self, fault: usize) -> (u32, Option<usize>) {
        let old = self.load();
        self.store(RaInfo { prev: Some(fault), ..old });
        (old.win.max(1), old.prev)
    }
}

/// One region's readahead: its window, its recent faults (for stride detection), counters.
#[derive(Default)]
pub(crate) struct RegionRa {
    pub state: RaState,
    recent: Mutex<Vec<usize>>,
    pub swap_ra: Counter,
    pub swap_ra_hit: Counter,
    pub swap_ra_waste: Counter,
}

impl RegionRa {
    /// Record a swap-in fault at folio `fault`; returns the stride the recent faults
    /// agree on, if any.
    pub fn record_fault(&self, fault: usize) -> Option<i64> {
        let mut recent = self.recent.lock().unwrap();
        if recent.len() == HISTORY {
            recent.remove(0);
        }
        recent.push(fault);
        majority_stride(&recent)
    }
    pub fn stride(&self) -> Option<i64> {
        majority_stride(&self.recent.lock().unwrap())
    }
    pub fn snapshot(&self) -> RegionReadahead {
        RegionReadahead {
            swap_ra: self.swap_ra.get(),
            swap_ra_hit: self.swap_ra_hit.get(),
            swap_ra_waste: self.swap_ra_waste.get(),
            window: self.state.load().win,
            stride: self.stride().unwrap_or(0),
        }
    }
}

/// Eviction clock → the address of the folio evicted at that clock value: the reverse map
/// that slot-order readahead walks. A ring; entries are hints, checked under the folio lock.
pub(crate) struct EvictLog {
    ring: Box<[AtomicU64]>,
}

const EVICT_LOG_ENTRIES: usize = 1 << 20;

impl EvictLog {
    fn new() -> EvictLog {
        EvictLog { ring: (0..EVICT_LOG_ENTRIES).map(|_| AtomicU64::new(0)).collect() }
    }
    pub fn record(&self, clock: u32, addr: usize) {
        self.ring[clock as usize % EVICT_LOG_ENTRIES].store(addr as u64, Ordering::Relaxed);
    }
    fn get(&self, clock: u32) -> Option<usize> {
        let a = self.ring[clock as usize % EVICT_LOG_ENTRIES].load(Ordering::Relaxed);
        (a != 0).then_some(a as usize)
    }
}

/// A readahead copy: a staging slot of the folio's size holding its data.
struct RaCopy {
    table: Arc<FolioTable>,
    slot: Slot,
    huge: bool,
    bytes: u64,
    seq: u64,
}

type Key = (usize, usize);

fn key(table: &Arc<FolioTable>, head: usize) -> Key {
    (Arc::as_ptr(table) as usize, head)
}

#[derive(Default)]
struct CacheInner {
    copies: HashMap<Key, RaCopy>,
    /// Insertion order, oldest first; entries whose copy was used or dropped are stale
    /// (their seq no longer matches) and skipped.
    order: VecDeque<(Key, u64)>,
    bytes: u64,
    per_order: [u32; 10],
    next_seq: u64,
}

/// The readahead copies, by folio. Entries are added and removed only by whoever holds the
/// folio's lock; the mutex only guards the map itself.
pub(crate) struct RaCache {
    inner: Mutex<CacheInner>,
    max_bytes: u64,
}

impl RaCache {
    fn has_room(&self, folio: FolioSize) -> bool {
        let inner = self.inner.lock().unwrap();
        inner.bytes + folio.bytes() as u64 <= self.max_bytes
            && inner.per_order[folio.index()] < Staging::slots_of(folio) / 2
    }
    fn insert(&self, table: &Arc<FolioTable>, head: usize, slot: Slot, huge: bool, folio: FolioSize) {
        let mut inner = self.inner.lock().unwrap();
        let seq = inner.next_seq;
        inner.next_seq += 1;
        let k = key(table, head);
        inner.copies.insert(k, RaCopy { table: table.clone(), slot, huge, bytes: folio.bytes() as u64, seq });
        inner.order.push_back((k, seq));
        inner.bytes += folio.bytes() as u64;
        inner.per_order[folio.index()] += 1;
        if inner.order.len() > 4 * inner.copies.len() + 64 {
            let CacheInner { copies, order, .. } = &mut *inner;
            order.retain(|(k, seq)| copies.get(k).is_some_and(|c| c.seq == *seq));
        }
    }
    fn slot_of(&self, table: &Arc<FolioTable>, head: usize) -> Option<Slot> {
        self.inner.lock().unwrap().copies.get(&key(table, head)).map(|c| c.slot)
    }
    fn take(&self, table: &Arc<FolioTable>, head: usize, seq: Option<u64>) -> Option<RaCopy> {
        let mut inner = self.inner.lock().unwrap();
        let k = key(table, head);
        if seq.is_some_and(|seq| inner.copies.get(&k).map(|c| c.seq) != Some(seq)) {
            return None;
        }
        let copy = inner.copies.remove(&k)?;
        inner.bytes -= copy.bytes;
        let order = (copy.bytes / crate::size::PAGE_SIZE as u64).trailing_zeros() as usize;
        inner.per_order[order] -= 1;
        Some(copy)
    }
    /// The oldest live copy: its table, head and seq (left in the cache).
    fn oldest(&self) -> Option<(Arc<FolioTable>, usize, u64)> {
        let mut inner = self.inner.lock().unwrap();
        while let Some(&(k, seq)) = inner.order.front() {
            match inner.copies.get(&k) {
                Some(c) if c.seq == seq => return Some((c.table.clone(), k.1, seq)),
                _ => {
                    inner.order.pop_front();
                }
            }
        }
        None
    }
    pub fn bytes(&self) -> u64 {
        self.inner.lock().unwrap().bytes
    }
}

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

/// Neighbours to bring in, found by a fault and read by the helper (or the fault itself).
struct RaRequest {
    folios: Vec<(Arc<FolioTable>, usize)>,
    folio: FolioSize,
    stride: bool,
}

/// The engine's readahead: the copies, the slot-order state, the helper's queue.
pub(crate) struct Readahead {
    pub cache: RaCache,
    /// Slot-order readahead's window, global as the kernel's `swapin_readahead_hits`.
    global: RaState,
    /// Kept only for slot-order readahead.
    pub log: Option<EvictLog>,
    queue: Mutex<VecDeque<RaRequest>>,
    queued: Condvar,
}

/// Requests the helper may have waiting; older ones are dropped first (their faults
/// have moved on).
const QUEUE_MAX: usize = 64;

impl Readahead {
    pub fn new(config: &crate::Config) -> Readahead {
        let on = config.page_cluster > 0;
        let max_bytes = config.memory_high.map_or(64 << 20, |high| (high / 16).clamp(1 << 20, 64 << 20));
        Readahead {
            cache: RaCache { inner: Mutex::default(), max_bytes },
            global: RaState::default(),
            log: (on && !config.vma_ra_enabled).then(EvictLog::new),
            queue: Mutex::new(VecDeque::new()),
            queued: Condvar::new(),
        }
    }
    pub fn wake_all(&self) {
        let _q = self.queue.lock().unwrap();
        self.queued.notify_all();
    }
}

/// The readahead helper thread (`ra_async`): reads ahead what faults asked for.
pub(crate) fn ra_worker(shared: Arc<Shared>) {
    let ra = &shared.ra;
    while !shared.stop.load(Ordering::Acquire) {
        let request = {
            let mut q = ra.queue.lock().unwrap();
            loop {
                if let Some(r) = q.pop_front() {
                    break Some(r);
                }
                if shared.stop.load(Ordering::Acquire) {
                    break None;
                }
                q = ra.queued.wait_timeout(q, Duration::from_millis(200)).unwrap().0;
            }
        };
        if let Some(r) = request {
            shared.read_ahead(&r);
        }
    }
}

/// Whether a folio in state `s` is worth reading ahead: swapped out, not cached yet, not
/// about to change, not split.
fn wants_readahead(s: State, folio: FolioSize) -> bool {
    let split = folio.order() > 0 && s.has(SPLIT);
    matches!(s.kind(), Kind::Pool | Kind::Swapped) && !s.has(CACHED) && !s.has(PENDING) && !split
}

impl Shared {
    /// After a swap-in fault at `head` (served, unlocked, its thread woken): pick the
    /// neighbours to read ahead and read them, here or on the helper. `hit`: the fault
    /// found its folio read ahead.
    pub(crate) fn readahead_after_fault(&self, table: &Arc<FolioTable>, head: usize, folio: FolioSize, hit: bool) {
        let cluster = self.config.page_cluster;
        if cluster == 0 || folio.is_huge() {
            return;
        }
        let max = 1u32 << cluster;
        let pages = folio.pages();
        let index = head / pages;
        let mut stride_used = false;
        let window: u32;
        let candidates: Vec<(Arc<FolioTable>, usize)> = if self.config.vma_ra_enabled {
            let ra = &table.ra;
            let stride = if self.config.ra_stride { ra.record_fault(index) } else { None };
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
                    return;
                }
                let (lo, hi) = vma_window(index, prev, win as usize, nr, per_block(folio));
                (lo..hi).filter(|&i| i != index).map(|i| (table.clone(), i * pages)).collect()
            }
        } else {
            let Some(log) = &self.ra.log else { return };
            // Slot order: positions on the eviction clock, in folios of this size.
            let clock = table.entry(head).evicted_at();
            let pos = (clock as usize / pages) as u32 as usize;
            let (win, _) = if hit { self.ra.global.seen(pos) } else { self.ra.global.miss(pos, max) };
            window = win;
            if win <= 1 {
                return;
            }
            let span = win as usize * pages;
            let start = (clock as usize) & !(span - 1);
            (start..start + span)
                .filter(|&c| c as u32 != clock)
                .filter_map(|c| log.get(c as u32))
                .filter_map(|addr| ADDRESS_MAP.lookup(addr))
                .filter(|(entry, page)| entry.engine.id == self.id && entry.table.folio == folio && *page % pages == 0)
                .map(|(entry, page)| (entry.table, page))
                .collect()
        };
        let folios: Vec<_> = candidates.into_iter().filter(|(t, h)| wants_readahead(t.entry(*h).load(), folio)).collect();
        // A hit tops the window up only once half of it is consumed, so that the reads go
        // out in runs rather than one folio per fault.
        if folios.is_empty() || (hit && folios.len() * 2 < window as usize) {
            return;
        }
        let request = RaRequest { folios, folio, stride: stride_used };
        if self.config.ra_async {
            let mut q = self.ra.queue.lock().unwrap();
            if q.len() >= QUEUE_MAX {
                q.pop_front();
            }
            q.push_back(request);
            self.ra.queued.notify_one();
        } else {
            self.read_ahead(&request);
        }
    }

    /// Read a request's folios ahead: lock and stage each (skipping busy or unsuitable
    /// ones, never waiting), decompress the pool's, read the file's in slot order with one
    /// `preadv` per contiguous run, then publish each as CACHED and unlock it.
    fn read_ahead(&self, r: &RaRequest) {
        let folio = r.folio;
        let mut staged: Vec<Prepared> = r.folios.iter().filter_map(|(t, h)| self.prepare_readahead(t, *h, folio)).collect();
        if staged.is_empty() {
            return;
        }
        for p in staged.iter_mut().filter(|p| p.s.kind() == Kind::Pool) {
            // SAFETY: we own the slot until it is put back, and nothing else maps it.
            let dst = unsafe { self.staging.slice_mut(p.slot) };
            p.loaded = self.load_swapped(Kind::Pool, p.handle, dst).is_ok();
        }
        let mut file: Vec<&mut Prepared> = staged.iter_mut().filter(|p| p.s.kind() == Kind::Swapped).collect();
        if !file.is_empty() {
            file.sort_by_key(|p| SwapHandle::from_raw(p.handle).slot);
            let dev = self.swap.as_ref().expect("a Swapped folio implies a swap file");
            let mut ios: Vec<(u64, &mut [u8])> = file
                .iter()
                // SAFETY: as above: each slot is ours alone until put back.
                .map(|p| (SwapHandle::from_raw(p.handle).slot, unsafe { self.staging.slice_mut(p.slot) }))
                .collect();
            let read = dev.io.read_batch(&mut ios);
            drop(ios);
            match read {
                Ok(()) => {
                    for p in file.iter_mut() {
                        // SAFETY: as above.
                        let data = unsafe { self.staging.slice_mut(p.slot) };
                        p.loaded = folio_checksum(data) == SwapHandle::from_raw(p.handle).checksum;
                        if !p.loaded {
                            self.counters.vm.swap_checksum_error.inc();
                        }
                    }
                }
                // The faults that want these folios will meet the error and report it.
                Err(_) => self.counters.vm.swap_read_error.inc(),
            }
        }
        for p in staged {
            let e = p.table.entry(p.head);
            if !p.loaded {
                self.staging.put_filled(p.slot, p.huge, &self.memcg);
                self.memcg.uncharge(Component::SwapCache, folio.bytes() as u64);
                e.unlock();
                continue;
            }
            self.ra.cache.insert(&p.table, p.head, p.slot, p.huge, folio);
            e.set_locked(p.s.with(CACHED, true));
            e.unlock();
            self.count_swapin_io(p.s.kind(), folio);
            self.counters.vm.swap_ra.inc();
            p.table.ra.swap_ra.inc();
            if r.stride {
                self.counters.vm.swap_ra_stride.inc();
            }
        }
    }

    /// Lock one swapped-out folio and give it a charged staging slot for its copy; None
    /// (and nothing held) if it is busy, unsuitable, or there is no room.
    fn prepare_readahead(&self, table: &Arc<FolioTable>, head: usize, folio: FolioSize) -> Option<Prepared> {
        if table.dead.load(Ordering::Relaxed) || !self.make_room(folio) {
            return None;
        }
        let bytes = folio.bytes() as u64;
        let e = table.entry(head);
        let s = e.try_lock()?;
        if !wants_readahead(s, folio) {
            e.unlock();
            return None;
        }
        // Within memory_high, as any allocation; past the high watermark the reclaimers
        // are woken to make room, as after a fault's charge.
        let pool = self.zswap.pool.footprint_bytes();
        if !self.memcg.try_charge(Component::SwapCache, bytes, pool) {
            e.unlock();
            return None;
        }
        if self.memcg.above_high(pool) {
            self.reclaim.wake_one();
        }
        let Ok(Some((slot, from_reserve, huge))) = self.staging.try_take_filled(folio.order()) else {
            self.memcg.uncharge(Component::SwapCache, bytes);
            e.unlock();
            return None;
        };
        if from_reserve {
            self.memcg.uncharge(Component::StagingFree, bytes);
        }
        Some(Prepared { table: table.clone(), head, s, handle: e.handle(), slot, huge, loaded: false })
    }

    /// Drop the oldest copies until one more of `folio`'s size fits. False if the cache
    /// is full of copies someone holds (a fault is taking them).
    fn make_room(&self, folio: FolioSize) -> bool {
        let mut tries = 8;
        while !self.ra.cache.has_room(folio) {
            let Some((table, head, seq)) = self.ra.cache.oldest() else { return false };
            tries -= 1;
            if tries == 0 {
                return false;
            }
            let e = table.entry(head);
            if e.try_lock().is_none() {
                return false;
            }
            self.drop_copy_locked(&table, head, Some(seq));
            e.unlock();
        }
        true
    }

    /// Drop the folio's (locked by the caller) readahead copy unused, if it has one (of
    /// insertion `seq`, when given): release its slot and charge, clear CACHED, count the
    /// waste. Returns the bytes freed.
    fn drop_copy_locked(&self, table: &Arc<FolioTable>, head: usize, seq: Option<u64>) -> u64 {
        let e = table.entry(head);
        let s = e.load();
        if !s.has(CACHED) {
            return 0;
        }
        let Some(copy) = self.ra.cache.take(table, head, seq) else { return 0 };
        self.staging.put_filled(copy.slot, copy.huge, &self.memcg);
        self.memcg.uncharge(Component::SwapCache, copy.bytes);
        e.set_locked(s.with(CACHED, false));
        self.counters.vm.swap_ra_waste.inc();
        table.ra.swap_ra_waste.inc();
        copy.bytes
    }

    /// The folio (locked by the caller) is being discarded or split: drop its readahead
    /// copy, unused. Its state word loses CACHED; callers writing a state from an older
    /// snapshot clear it too.
    pub(crate) fn forget_readahead(&self, table: &Arc<FolioTable>, head: usize) {
        self.drop_copy_locked(table, head, None);
        // A flag with no copy behind it (never expected) goes too.
        table.entry(head).clear_locked(CACHED);
    }

    /// Memory is short: drop every readahead copy nobody is using. Returns bytes freed.
    pub(crate) fn drain_readahead(&self) -> u64 {
        let mut freed = 0;
        while let Some((table, head, seq)) = self.ra.cache.oldest() {
            let e = table.entry(head);
            if e.try_lock().is_none() {
                break;
            }
            freed += self.drop_copy_locked(&table, head, Some(seq));
            e.unlock();
        }
        freed
    }

    /// A fault found its folio (locked by the caller) read ahead: install the copy, then
    /// free the pool entry or swap slot. `None` if the copy is missing (never expected).
    pub(crate) fn install_readahead(&self, table: &Arc<FolioTable>, head: usize, folio: FolioSize, s: State) -> Option<Result<(), crate::fault::InstallError>> {
        let slot = self.ra.cache.slot_of(table, head)?;
        if let Err(err) = self.install_copy(table, head, folio, self.staging.addr(slot)) {
            return Some(Err(err));
        }
        let copy = self.ra.cache.take(table, head, None).expect("the copy is ours under the folio lock");
        self.free_swapped(s.kind(), table.entry(head).handle(), folio);
        self.memcg.transfer(Component::SwapCache, Component::Resident, copy.bytes);
        self.staging.put_filled(copy.slot, copy.huge, &self.memcg);
        self.counters.vm.swap_ra_hit.inc();
        table.ra.swap_ra_hit.inc();
        if self.config.vma_ra_enabled {
            table.ra.state.hit();
        } else {
            self.ra.global.hit();
        }
        Some(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_grows_with_hits_up_to_the_cap() {
        // First adjacent miss with no hits: 2; then hits push it to powers of two, capped.
        assert_eq!(swapin_nr_folios(true, 0, 8, 0), 2);
        assert_eq!(swapin_nr_folios(true, 1, 8, 2), 4);
        assert_eq!(swapin_nr_folios(true, 3, 8, 4), 8);
        assert_eq!(swapin_nr_folios(true, 7, 8, 8), 8);
        assert_eq!(swapin_nr_folios(true, 100, 8, 8), 8);
        assert_eq!(swapin_nr_folios(true, 100, 32, 8), 32);
    }

    #[test]
    fn window_shrinks_by_at_most_half_per_miss_without_hits() {
        let mut win = 8;
        let mut seen = vec![];
        for _ in 0..5 {
            win = swapin_nr_folios(false, 0, 8, win);
            seen.push(win);
        }
        assert_eq!(seen, [4, 2, 1, 1, 1]);
    }

    #[test]
    fn no_readahead_for_a_random_first_miss() {
        assert_eq!(swapin_nr_folios(false, 0, 8, 0), 1);
    }

    #[test]
    fn state_adapts_to_a_sequential_stream_then_a_random_one() {
        let s = RaState::default();
        let max = 8;
        // Sequential: miss at 0, 1 (adjacent: 2), then hits grow it to the cap.
        assert_eq!(s.miss(0, max).0, 1);
        assert_eq!(s.miss(1, max).0, 2);
        s.hit();
        assert_eq!(s.miss(3, max).0, 4);
        for _ in 0..3 {
            s.hit();
        }
        assert_eq!(s.miss(7, max).0, 8);
        // Random misses with no hits: halves down to 1.
        let wins: Vec<u32> = [100, 7, 300, 50].iter().map(|&f| s.miss(f, max).0).collect();
        assert_eq!(wins, [4, 2, 1, 1]);
        // A hit keeps the window.
        assert_eq!(s.seen(51), (1, Some(50)));
    }

    #[test]
    fn window_goes_ahead_of_forward_faults_behind_backward_ones_around_others() {
        let block = 512;
        assert_eq!(vma_window(10, Some(9), 8, 10_000, block), (10, 18));
        assert_eq!(vma_window(10, Some(11), 8, 10_000, block), (3, 11));
        assert_eq!(vma_window(10, Some(500), 8, 10_000, block), (7, 15));
        assert_eq!(vma_window(10, None, 1, 10_000, block), (10, 11));
    }

    #[test]
    fn window_respects_the_region_and_the_2m_block() {
        let block = 512; // 4 KiB folios
        // Region end.
        assert_eq!(vma_window(98, Some(97), 8, 100, block), (98, 100));
        // Region start, backwards.
        assert_eq!(vma_window(2, Some(3), 8, 100, block), (0, 3));
        // 2 MiB block end and start.
        assert_eq!(vma_window(510, Some(509), 8, 10_000, block), (510, 512));
        assert_eq!(vma_window(513, Some(514), 8, 10_000, block), (512, 514));
        // 1 MiB folios: two per block; a 2 MiB folio is alone in its block.
        assert_eq!(vma_window(4, Some(3), 8, 100, per_block(FolioSize::from_order(8).unwrap())), (4, 6));
        assert_eq!(vma_window(4, Some(3), 8, 100, per_block(FolioSize::M2)), (4, 5));
    }

    #[test]
    fn stride_needs_a_majority_of_two_or_more() {
        assert_eq!(majority_stride(&[0, 4, 8, 12, 16]), Some(4));
        assert_eq!(majority_stride(&[40, 37, 34, 31, 28, 1000]), Some(-3));
        // Sequential is the plain window's business.
        assert_eq!(majority_stride(&[0, 1, 2, 3, 4]), None);
        // Random: no majority.
        assert_eq!(majority_stride(&[5, 90, 13, 400, 2, 77]), None);
        // Too short to judge.
        assert_eq!(majority_stride(&[0, 4, 8]), None);
    }

    #[test]
    fn info_packs_and_unpacks() {
        for info in [
            RaInfo { prev: None, win: 0, hits: 0 },
            RaInfo { prev: Some(0), win: 8, hits: 7 },
            RaInfo { prev: Some((1 << 39) - 2), win: 512, hits: 4095 },
        ] {
            assert_eq!(RaInfo::unpack(info.pack()), info);
        }
    }
}
