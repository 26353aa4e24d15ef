//! Reclaim: the LRU of resident folios, the background reclaimers (kswapd) and direct
//! reclaim in the fault path, with memory.high semantics (see `memcg.rs`).
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
//! Evicting a folio (`shrink_folio`): lock it, MOVE it out of the region into a staging
//! hole (atomic: from that instant an access faults and waits on the lock), mark it
//! SwapCache+WRITEBACK and unlock, compress it into the pool without any lock, then lock
//! again and publish the result, unless a fault wanted the folio back meanwhile (then the
//! work is dropped and the fault moves the folio straight back). A folio the pool cannot
//! take is moved back into place: no data is ever dropped for lack of room.
//!
//! Folios under 2 MiB are evicted in batches (`shrink_one`): the LRU head plus the LRU
//! entries right behind it that continue it in the address space go out in one
//! UFFDIO_MOVE into one 2 MiB staging slot, then each member is compressed and published
//! on its own. One MOVE of a run costs one TLB shootdown where a MOVE per folio costs one
//! each: 256 4 KiB moves took 232 IPIs and 3.2 ms, one 1 MiB move 1 IPI and 41 µs. The
//! slot is released when its last member leaves it (`Staging::end_batch_member`), which
//! is why small folios are installed back by UFFDIO_COPY, leaving the slot's pages put.

use crate::engine::Shared;
use crate::folio::{Kind, HUGE, PENDING, SPLIT, WANTED, WRITEBACK};
use crate::memcg::{Component, MemCg};
use crate::region::FolioTable;
use crate::size::{FolioSize, HUGE_SIZE, PAGE_SIZE};
use crate::folio::State;
use crate::page_io::{Placed, SwapOutError, WriteBatch};
use crate::staging::{Slot, Staged};
use crate::zswap::CodecScratch;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

pub(crate) struct LruEntry {
    table: Arc<FolioTable>,
    page: usize,
    order: u8,
    gen: u16,
}

#[derive(Default)]
struct Lists {
    inactive: VecDeque<LruEntry>,
    active: VecDeque<LruEntry>,
}

#[derive(Default)]
pub(crate) struct Lru {
    lists: Mutex<Lists>,
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
    fn push_entry(&self, entry: LruEntry) {
        self.lists.lock().unwrap().inactive.push_back(entry);
    }
    /// The coldest candidate: the inactive head, after demoting active folios while the
    /// inactive list is under a third of all.
    fn pop(&self) -> Option<LruEntry> {
        let mut lists = self.lists.lock().unwrap();
        while lists.inactive.len() * 2 < lists.active.len() {
            let demoted = lists.active.pop_front().expect("nonempty");
            lists.inactive.push_back(demoted);
        }
        lists.inactive.pop_front().or_else(|| lists.active.pop_front())
    }
    /// Pop the next candidate only if it satisfies `pred` (extending an eviction batch).
    fn pop_next_if(&self, pred: impl Fn(&LruEntry) -> bool) -> Option<LruEntry> {
        let mut lists = self.lists.lock().unwrap();
        if lists.inactive.front().is_some_and(&pred) {
            lists.inactive.pop_front()
        } else {
            None
        }
    }
    fn len(&self) -> usize {
        let lists = self.lists.lock().unwrap();
        lists.inactive.len() + lists.active.len()
    }
}

/// Coordination between faults and reclaimers.
#[derive(Default)]
pub(crate) struct ReclaimCtl {
    sleep: Mutex<u64>,
    wake: Condvar,
    sleeping: AtomicUsize,
    progress: Mutex<u64>,
    progress_cv: Condvar,
    /// Folios being compressed now.
    inflight: AtomicU64,
    /// Uncompressed bytes of the folios in the pool.
    pub pool_folio_bytes: AtomicU64,
    /// The pool refused a store; stop trying until it has room again.
    pool_full: AtomicBool,
    /// Pages evicted so far (wrapping): the clock refault distances are measured on.
    pub evict_clock: AtomicU32,
    /// Evictions under way (`shrink_one` calls past their start).
    active: AtomicUsize,
}

/// One eviction under way; see `ReclaimCtl::quiesce`.
pub(crate) struct ActiveEviction<'a>(&'a AtomicUsize);

impl Drop for ActiveEviction<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl ReclaimCtl {
    pub fn wake_one(&self) {
        if self.sleeping.load(Ordering::Relaxed) > 0 {
            *self.sleep.lock().unwrap() += 1;
            self.wake.notify_one();
        }
    }
    pub fn wake_all(&self) {
        *self.sleep.lock().unwrap() += 1;
        self.wake.notify_all();
    }
    fn sleep(&self, timeout: Duration) {
        let guard = self.sleep.lock().unwrap();
        self.sleeping.fetch_add(1, Ordering::Relaxed);
        let _ = self.wake.wait_timeout(guard, timeout).unwrap();
        self.sleeping.fetch_sub(1, Ordering::Relaxed);
    }
    pub fn notify_progress(&self) {
        *self.progress.lock().unwrap() += 1;
        self.progress_cv.notify_all();
    }
    /// Start an eviction, unless the limit is suspended (around fork).
    fn begin_eviction(&self, memcg: &MemCg) -> Option<ActiveEviction<'_>> {
        // Counted before the check, so that `quiesce` (suspend, then wait for zero)
        // never misses one that saw the limit still in force.
        self.active.fetch_add(1, Ordering::SeqCst);
        let guard = ActiveEviction(&self.active);
        (!memcg.is_suspended()).then_some(guard)
    }

    /// Wait for the evictions under way to finish. Called with the limit suspended, so
    /// that no new one starts.
    pub fn quiesce(&self) {
        while self.active.load(Ordering::SeqCst) > 0 || self.inflight.load(Ordering::Acquire) > 0 {
            if !self.wait_for_progress() {
                std::thread::yield_now();
            }
        }
    }

    pub fn pool_is_full(&self) -> bool {
        self.pool_full.load(Ordering::Relaxed)
    }
    /// A store found the pool full: stop offering it folios until it has room again, and
    /// wake a reclaimer to write its oldest entries back (with a swap file).
    pub fn set_pool_full(&self) {
        if !self.pool_full.swap(true, Ordering::Relaxed) {
            self.wake_one();
        }
    }
    pub fn clear_pool_full(&self) {
        self.pool_full.store(false, Ordering::Relaxed);
    }
    /// Wait for a compression in flight to finish. False if none is in flight.
    pub fn wait_for_progress(&self) -> bool {
        let guard = self.progress.lock().unwrap();
        if self.inflight.load(Ordering::Acquire) == 0 {
            return false;
        }
        let seen = *guard;
        let _ = self.progress_cv.wait_timeout_while(guard, Duration::from_millis(50), |p| *p == seen).unwrap();
        true
    }
}

/// What one reclaim attempt achieved.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reclaimed {
    /// A folio left memory.
    Freed,
    /// Every candidate was busy (locked, or wanted back by a fault).
    Busy,
    /// Nothing resident to evict.
    Nothing,
    /// The pool is full and there is nowhere else to put folios (no swap file, or a full
    /// or failing one).
    PoolFull,
}

/// Whether a locked LRU candidate is still the resident folio it was queued as.
fn evictable(v: &LruEntry, s: State) -> bool {
    s.kind() == Kind::Resident && s.gen() == v.gen && (v.order == 0 || !s.has(SPLIT))
}

thread_local! {
    static DIRECT_SCRATCH: RefCell<CodecScratch> = RefCell::new(CodecScratch::new());
}

/// EBUSY/EAGAIN answers in a row at one page before an eviction gives the folio up for now.
const MOVE_BUSY_RETRIES: u32 = 64;

/// A background reclaimer: sleeps under the high watermark, evicts down to the low one.
/// With a swap file it is also zswap's shrink worker: it writes the pool's oldest entries
/// back while the pool is over its accept threshold.
pub(crate) fn kswapd(shared: Arc<Shared>) {
    let mut scratch = CodecScratch::new();
    while !shared.stop.load(Ordering::Acquire) {
        while !shared.stop.load(Ordering::Acquire) && shared.needs_writeback() {
            if !shared.writeback_one() {
                break;
            }
        }
        if !shared.memcg.above_high(shared.zswap.pool.footprint_bytes()) {
            // Other processes sharing the limit charge it without waking this one.
            let nap = if shared.memcg.shared().is_some() { 10 } else { 200 };
            shared.reclaim.sleep(Duration::from_millis(nap));
            continue;
        }
        while !shared.stop.load(Ordering::Acquire) && shared.memcg.above_low(shared.zswap.pool.footprint_bytes()) {
            match shared.shrink_one(&mut scratch, false) {
                Reclaimed::Freed => {}
                Reclaimed::Busy => std::thread::yield_now(),
                Reclaimed::Nothing | Reclaimed::PoolFull => {
                    if shared.writeback_one() {
                        continue;
                    }
                    shared.reclaim.sleep(Duration::from_millis(10));
                    break;
                }
            }
        }
    }
}

impl Shared {
    /// Direct reclaim from the fault path: evict one folio in the faulting context.
    /// Returns whether it is worth trying to charge again.
    pub(crate) fn reclaim_direct(&self) -> bool {
        let result = DIRECT_SCRATCH.with(|s| match s.try_borrow_mut() {
            Ok(mut scratch) => self.shrink_one(&mut scratch, true),
            Err(_) => Reclaimed::Busy,
        });
        match result {
            Reclaimed::Freed => true,
            Reclaimed::Busy => {
                std::thread::sleep(Duration::from_micros(200));
                true
            }
            // With charge_pool the pool itself may be what is over the limit.
            Reclaimed::Nothing | Reclaimed::PoolFull => self.writeback_one(),
        }
    }

    /// Take the coldest evictable folio off the LRU, locked.
    fn pick_victim(&self) -> Result<(LruEntry, crate::folio::State), Reclaimed> {
        let mut budget = self.lru.len();
        let mut busy = false;
        while budget > 0 {
            budget -= 1;
            let Some(v) = self.lru.pop() else { break };
            if v.table.dead.load(Ordering::Relaxed) {
                continue;
            }
            let e = v.table.entry(v.page);
            let Some(s) = e.try_lock() else {
                self.lru.push_entry(v);
                busy = true;
                continue;
            };
            let current = evictable(&v, s);
            if current && !s.has(PENDING) {
                return Ok((v, s));
            }
            e.unlock();
            if current {
                // An event is about to change it; look again later.
                self.lru.push_entry(v);
                busy = true;
            }
        }
        Err(if busy { Reclaimed::Busy } else { Reclaimed::Nothing })
    }

    /// Evict from the LRU head: one 2 MiB folio, or a batch of smaller ones that are next
    /// to each other both in LRU order and in the address space, moved out with one
    /// UFFDIO_MOVE (one TLB shootdown) into one 2 MiB staging slot: `shrink_folio_list`
    /// with batched flushes.
    pub(crate) fn shrink_one(&self, scratch: &mut CodecScratch, direct: bool) -> Reclaimed {
        let Some(_active) = self.reclaim.begin_eviction(&self.memcg) else {
            return Reclaimed::Nothing;
        };
        let (victim, s) = match self.pick_victim() {
            Ok(v) => v,
            Err(r) => return r,
        };
        let folio = FolioSize::from_order(victim.order as u32).expect("valid order");
        if !self.can_swap_out(folio.bytes() as u64 / 2) {
            victim.table.entry(victim.page).unlock();
            self.lru.push_entry(victim);
            return Reclaimed::PoolFull;
        }
        let mut run = vec![(victim, s)];
        if !folio.is_huge() {
            self.extend_batch(&mut run, folio);
        }
        let slot = match self.staging.take_hole(FolioSize::M2.order(), &self.memcg) {
            Ok(slot) => slot,
            Err(err) => {
                eprintln!("folioswap: no staging for eviction: {err}");
                self.unlock_run(run, true);
                return Reclaimed::Nothing;
            }
        };
        let (table, head) = (run[0].0.table.clone(), run[0].0.page);
        if let Err(again) = self.move_out(&table, head, folio, run.len(), slot) {
            self.staging.put_hole(slot);
            self.unlock_run(run, again);
            return Reclaimed::Busy;
        }
        if !folio.is_huge() {
            self.staging.begin_batch(slot, run.len() as u32);
        }
        let pages = folio.pages();
        let clock = self.reclaim.evict_clock.fetch_add((run.len() * pages) as u32, Ordering::Relaxed);
        self.reclaim.inflight.fetch_add(run.len() as u64, Ordering::AcqRel);
        table.evicting.fetch_add(run.len(), Ordering::AcqRel);
        let mut members = Vec::with_capacity(run.len());
        let first_addr = self.ra.log.as_ref().and_then(|_| table.folio_addr(head, run.len() * pages));
        for (i, (v, s)) in run.into_iter().enumerate() {
            let e = v.table.entry(v.page);
            let at = Staged { slot, page: (i * pages) as u32 };
            let evicted_at = clock.wrapping_add((i * pages) as u32);
            e.set_evicted_at(evicted_at);
            if let (Some(log), Some(addr)) = (&self.ra.log, first_addr) {
                log.record(evicted_at, addr + i * folio.bytes());
            }
            e.set_handle(at.to_raw());
            e.set_locked(s.with_kind(Kind::SwapCache).with(WRITEBACK, true));
            self.memcg.transfer(Component::Resident, Component::SwapCache, folio.bytes() as u64);
            e.unlock();
            members.push((v, at, folio.is_huge() && s.has(HUGE)));
        }
        // With a swap file, the members (or split pages) bound for it are written in one
        // submission before any is published; otherwise each member is published as soon as
        // it is stored, so that a fault wanting it back waits for its own compression only.
        let mut stored = match self.swap {
            Some(_) if members.len() > 1 || self.config.split_swap => self.store_batch(&members, folio, scratch),
            _ => Vec::new(),
        }
        .into_iter();
        // Progress if any member left memory; PoolFull only if the pool refused them all.
        let mut outcome = Reclaimed::Busy;
        for (v, at, huge) in &members {
            let result = stored.next().unwrap_or_else(|| self.compress_evicted(*at, folio, scratch, None));
            match self.finish_eviction(v, folio, *at, *huge, result, direct) {
                Reclaimed::Freed => outcome = Reclaimed::Freed,
                Reclaimed::PoolFull if outcome != Reclaimed::Freed => outcome = Reclaimed::PoolFull,
                _ => {}
            }
            self.reclaim.inflight.fetch_sub(1, Ordering::AcqRel);
            table.evicting.fetch_sub(1, Ordering::AcqRel);
            self.reclaim.notify_progress();
        }
        outcome
    }

    /// Add to `run` the LRU candidates that follow it in the address space.
    fn extend_batch(&self, run: &mut Vec<(LruEntry, State)>, folio: FolioSize) {
        let max = HUGE_SIZE / folio.bytes();
        while run.len() < max {
            let (table, next, order) = {
                let last = &run.last().expect("nonempty").0;
                (last.table.clone(), last.page + folio.pages(), last.order)
            };
            let Some(v) = self.lru.pop_next_if(|c| Arc::ptr_eq(&c.table, &table) && c.page == next && c.order == order)
            else {
                break;
            };
            let e = v.table.entry(v.page);
            match e.try_lock() {
                Some(s) if evictable(&v, s) && !s.has(PENDING) => run.push((v, s)),
                Some(_) => {
                    // A stale entry (the folio left or came back since): drop it.
                    e.unlock();
                    break;
                }
                None => {
                    self.lru.push_entry(v);
                    break;
                }
            }
        }
    }

    fn unlock_run(&self, run: Vec<(LruEntry, State)>, requeue: bool) {
        for (v, _) in run {
            v.table.entry(v.page).unlock();
            if requeue {
                self.lru.push_entry(v);
            }
        }
    }

    /// MOVE `count` consecutive folios out of their region into `slot`, under the gate.
    /// Err(true): try again later; Err(false): the range is gone from the address space.
    fn move_out(&self, table: &FolioTable, head: usize, folio: FolioSize, count: usize, slot: Slot) -> Result<(), bool> {
        let _gate = self.gate.read().unwrap();
        if (0..count).any(|i| table.entry(head + i * folio.pages()).load().has(PENDING)) {
            return Err(true);
        }
        let Some(addr) = table.folio_addr(head, count * folio.pages()) else {
            return Err(true);
        };
        let dst = self.staging.addr(slot);
        let len = count * folio.bytes();
        let mut done = 0;
        // Where the last EBUSY was met, and how often in a row there.
        let (mut busy_at, mut busy_times) = (usize::MAX, 0u32);
        while done < len {
            match self.staging.uffd().move_pages(dst + done, addr + done, len - done, false) {
                Ok(()) => return Ok(()),
                Err(err) if err.is(libc::EBUSY) || err.is(libc::EAGAIN) => {
                    done += err.done;
                    busy_times = if busy_at == done { busy_times + 1 } else { 0 };
                    busy_at = done;
                    // MOVE takes only pages this process owns alone; after a fork they are
                    // shared with the child until one of the two writes them. Pinned pages
                    // (O_DIRECT in flight) or a large folio the kernel cannot split now
                    // stay busy: then try other folios first.
                    let unshareable = err.is(libc::EBUSY) && busy_times == 0 && !self.break_cow(addr + done, len - done);
                    if unshareable || busy_times >= MOVE_BUSY_RETRIES {
                        self.move_back(addr, dst, done);
                        return Err(true);
                    }
                    std::thread::yield_now();
                }
                Err(err) if err.is(libc::EEXIST) && self.staging.moved_anyway(dst + done + err.done, addr + done + err.done) => {
                    done += err.done + PAGE_SIZE;
                }
                Err(err) => {
                    done += err.done;
                    // Put back what moved, so the folios stay whole where they were.
                    self.move_back(addr, dst, done);
                    // ENOENT/EINVAL: the program unmapped (part of) the range and the
                    // kernel's UNMAP event is not read yet; the event will drop the folio.
                    if err.is(libc::ENOENT) || err.is(libc::EINVAL) {
                        return Err(true);
                    }
                    eprintln!("folioswap: evicting {len} bytes at {addr:#x} failed: {err}");
                    return Err(false);
                }
            }
        }
        Ok(())
    }

    /// Undo the first `done` bytes of a `move_out`.
    fn move_back(&self, addr: usize, dst: usize, done: usize) {
        if done > 0 {
            let _ = self.uffd.move_pages(addr, dst, done, true);
        }
    }

    /// Give this process its own copy of the pages in `[addr, addr + len)` (the kernel's
    /// copy on write, as if the program wrote them), so that MOVE may take them. Only
    /// when every page is present: a missing one would fault to this engine while the
    /// caller holds the folio's lock.
    fn break_cow(&self, addr: usize, len: usize) -> bool {
        if !self.staging.all_present(addr, len) {
            return false;
        }
        self.counters.vm.cow_unshare.inc();
        // SAFETY: the range lies in a live region (the caller holds the gate and the
        // folios' locks) and is fully present; POPULATE_WRITE changes no contents.
        unsafe { crate::sys::madvise(addr as *mut libc::c_void, len, crate::sys::MADV_POPULATE_WRITE) == 0 }
    }

    /// The swap cache lets go of a folio's staged copy (stored, discarded, or copied back):
    /// a 2 MiB folio's slot is kept filled for reuse or emptied; a batch member's share of
    /// its batch slot stays charged until the batch's last member lets go.
    pub(crate) fn release_staged(&self, at: Staged, folio: FolioSize, huge: bool) {
        let bytes = folio.bytes() as u64;
        if folio.is_huge() {
            self.memcg.uncharge(Component::SwapCache, bytes);
            self.staging.put_filled(at.slot, huge, &self.memcg);
        } else {
            self.memcg.transfer(Component::SwapCache, Component::StagingFree, bytes);
            self.staging.end_batch_member(at.slot, bytes, &self.memcg);
        }
    }

    /// Store the members of an eviction batch, queueing their file writes and issuing
    /// them in one submission.
    fn store_batch(&self, members: &[(LruEntry, Staged, bool)], folio: FolioSize, scratch: &mut CodecScratch) -> Vec<Result<Vec<Placed>, SwapOutError>> {
        let mut batch = WriteBatch::new();
        let mut spans = Vec::with_capacity(members.len());
        let mut results = Vec::with_capacity(members.len());
        for (_, at, _) in members {
            let start = batch.len();
            results.push(self.compress_evicted(*at, folio, scratch, Some(&mut batch)));
            spans.push(start..batch.len());
        }
        self.write_batch(&batch, &spans, &mut results);
        results
    }

    /// Store a staged folio (pool or swap file): whole, or (split mode) as independent
    /// 4 KiB pages. File writes go to `batch` when given (see `store_batch`).
    fn compress_evicted<'a>(
        &'a self,
        at: Staged,
        folio: FolioSize,
        scratch: &mut CodecScratch,
        mut batch: Option<&mut WriteBatch<'a>>,
    ) -> Result<Vec<Placed>, SwapOutError> {
        // SAFETY: the folio is SwapCache+WRITEBACK with this staged copy: nothing moves its
        // pages away or writes them until finish_eviction takes the lock again.
        let data: &[u8] = unsafe { self.staging.staged_slice(at, folio.bytes()) };
        if !(self.config.split_swap && folio.order() > 0) {
            return self.swap_out(data, folio, scratch, batch);
        }
        let mut placed = Vec::with_capacity(folio.pages());
        let queued = batch.as_ref().map_or(0, |b| b.len());
        for page in data.chunks(PAGE_SIZE) {
            match self.swap_out(page, FolioSize::K4, scratch, batch.as_deref_mut()) {
                Ok(p) => placed.extend(p),
                Err(err) => {
                    // Unqueue this folio's writes before its slots are freed.
                    if let Some(b) = batch.as_deref_mut() {
                        b.truncate(queued);
                    }
                    self.free_placed(&placed, FolioSize::K4);
                    return Err(err);
                }
            }
        }
        Ok(placed)
    }

    /// Release what a swap-out stored but did not publish (several entries are 4 KiB pieces).
    fn free_placed(&self, placed: &[Placed], folio: FolioSize) {
        let size = if placed.len() > 1 { FolioSize::K4 } else { folio };
        for p in placed {
            match *p {
                Placed::Zero => {}
                Placed::Pool { handle, .. } => self.zswap.free(handle),
                Placed::File(h) => self.swap.as_ref().expect("placed on a swap file").free(h.slot, size.order()),
            }
        }
    }

    /// Publish an eviction's result under the folio lock.
    fn finish_eviction(
        &self,
        victim: &LruEntry,
        folio: FolioSize,
        at: Staged,
        huge: bool,
        result: Result<Vec<Placed>, SwapOutError>,
        direct: bool,
    ) -> Reclaimed {
        let table = &victim.table;
        let head = victim.page;
        let e = table.entry(head);
        let s = e.lock();
        let ours = s.kind() == Kind::SwapCache && s.has(WRITEBACK) && e.handle() == at.to_raw();
        if !ours {
            // Discarded (REMOVE/UNMAP/drop) while we compressed: the staged copy and its
            // charge are ours to release.
            e.unlock();
            if let Ok(placed) = &result {
                self.free_placed(placed, folio);
            }
            self.release_staged(at, folio, huge);
            return Reclaimed::Freed;
        }
        if s.has(WANTED) {
            if let Ok(placed) = &result {
                self.free_placed(placed, folio);
            }
            e.set_locked(s.with(WRITEBACK, false));
            e.clear_locked(WANTED);
            e.unlock();
            return Reclaimed::Busy;
        }
        let placed = match result {
            Ok(placed) => placed,
            Err(_) => {
                // Nowhere to put it (the reason is counted where it was found).
                self.put_back(table, head, folio, at, huge);
                e.unlock();
                return Reclaimed::PoolFull;
            }
        };
        self.publish_placed(table, head, folio, s, &placed);
        let vm = &self.counters.vm;
        if direct {
            vm.pgsteal_direct.add(folio.pages() as u64);
        } else {
            vm.pgsteal_kswapd.add(folio.pages() as u64);
        }
        self.apply_pending_after_publish(table, head, folio);
        e.unlock();
        self.release_staged(at, folio, huge);
        Reclaimed::Freed
    }

    /// The folio went out as 4 KiB pages (split mode, or no contiguous run on the swap
    /// file): each page becomes an order-0 folio with its own entry. Done under the gate so
    /// that no event is marked against the unsplit folio meanwhile.
    pub(crate) fn publish_split(&self, table: &Arc<FolioTable>, head: usize, folio: FolioSize, placed: &[Placed]) {
        let _gate = self.gate.read().unwrap();
        let e = table.entry(head);
        let pending = e.load().has(PENDING);
        let clock = e.evicted_at();
        for (i, &p) in placed.iter().enumerate() {
            let pe = table.entry(head + i);
            let ps = if i == 0 { pe.load() } else { pe.lock() };
            let kind = self.record_placed(table, head + i, FolioSize::K4, ps.gen(), p);
            pe.set_evicted_at(clock.wrapping_add(i as u32));
            pe.set_locked(ps.with_kind(kind).with(WRITEBACK, false).with(HUGE, false));
            if pending {
                pe.set_flag(PENDING);
            }
            if i != 0 {
                pe.unlock();
            }
        }
        e.set_locked(e.load().with(SPLIT, true));
        let sc = self.counters.size(folio);
        sc.split.inc();
        sc.swpout_fallback.inc();
        if folio.is_huge() {
            self.counters.vm.thp_swpout_fallback.inc();
            self.counters.vm.thp_split_page.inc();
        }
    }

    /// The pool refused the folio: put it back into place, resident again (a 2 MiB folio
    /// by MOVE from its own slot, a batch member by COPY from its share of the batch slot).
    fn put_back(&self, table: &Arc<FolioTable>, head: usize, folio: FolioSize, at: Staged, huge: bool) {
        let e = table.entry(head);
        let s = e.load();
        let bytes = folio.bytes() as u64;
        let installed = if folio.is_huge() {
            self.install_slot(table, head, folio, at.slot).map(|how| {
                self.memcg.transfer(Component::SwapCache, Component::Resident, bytes);
                self.release_after_install(at.slot, how, huge);
            })
        } else {
            self.install_copy(table, head, folio, self.staging.staged_addr(at)).map(|()| {
                self.memcg.charge(Component::Resident, bytes);
                self.release_staged(at, folio, huge);
            })
        };
        match installed {
            Ok(()) => {
                let next = e.set_locked(s.with_kind(Kind::Resident).with(WRITEBACK, false).with(HUGE, huge).next_gen());
                self.lru.push(table.clone(), head, folio, next.gen(), false);
                // A fault may be waiting (it found WRITEBACK and asked for the folio).
                self.wake_folio(table, head, folio);
            }
            Err(_) => {
                // An event or unmap got there first: leave it in the swap cache, where the
                // event (or the next fault) finds it.
                e.set_locked(s.with(WRITEBACK, false));
                if e.load().has(PENDING) {
                    let _ = self.apply_pending_locked(table, head, folio);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Config, Engine, RegionOptions};
    use super::*;

    /// A folio the pool cannot take is put back where it was, whole: never dropped.
    #[test]
    fn pool_store_failure_keeps_the_folio() {
        let config = Config::default().memory_high("64M").unwrap().max_pool("128K").unwrap().reclaim_threads(1);
        let engine = Engine::new(config).unwrap_or_else(|e| panic!("cannot start the engine: {e}"));
        let mut region = engine.map(1 << 20, RegionOptions::default().folio_size("64K").unwrap()).unwrap();
        // Incompressible data, so every folio needs a raw 64K object: the pool holds two.
        let mut x = 0x1234_5678_9abc_def0u64;
        let words: Vec<u64> = (0..(1 << 20) / 8)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            })
            .collect();
        for (dst, src) in region.as_mut_slice().chunks_mut(8).zip(&words) {
            dst.copy_from_slice(&src.to_le_bytes());
        }
        let shared = engine.shared();
        let mut scratch = CodecScratch::new();
        let mut outcomes = Vec::new();
        for _ in 0..8 {
            outcomes.push(shared.shrink_one(&mut scratch, true));
        }
        assert!(outcomes.contains(&Reclaimed::Freed), "{outcomes:?}");
        assert!(outcomes.contains(&Reclaimed::PoolFull), "{outcomes:?}");
        let stats = engine.stats();
        assert!(stats.vm.zswap_pool_limit_hit >= 1, "{:?}", stats.vm);
        assert!(stats.memory.pool_total_bytes <= 128 << 10);
        for (i, (got, want)) in region.as_slice().chunks(8).zip(&words).enumerate() {
            assert_eq!(got, &want.to_le_bytes(), "word {i}");
        }
    }
}
