//! Swap-out and swap-in through the swap file, and zswap writeback: the engine's
//! mm/page_io.c (`swap_writepage`, `swap_read_folio`) and the writeback half of
//! mm/zswap.c (`zswap_writeback_entry`, `shrink_worker`).
//!
//! Where an evicted folio goes (`swap_out`), as zswap decides for the kernel:
//! 1. into the pool, compressed whole, when the pool accepts it (`zswpout`);
//! 2. onto the swap file, raw, when the pool is full and has not yet shrunk under
//!    `accept_threshold_percent` of its cap (then nothing is compressed at all), when the
//!    store finds it full (`zswap_pool_limit_hit`), or when the folio compresses less than
//!    `min_compression_ratio` (`zswap_reject_compress_poor`) (`pswpout`).
//!
//! A folio is written whole into one aligned run of slots (`thp_swpout` for 2 MiB); when
//! the allocator has no such run it is written as 4 KiB pieces and the folio is split
//! (`swpout_fallback`, `thp_swpout_fallback`), as the kernel does. Every write carries a
//! crc32c of the data, kept in the folio's handle word beside the slot and checked on
//! swap-in: a mismatch or a read error fails the fault (SIGBUS, with the address and the
//! reason on stderr) and leaves the data where it is, never silently wrong. A write error
//! marks the slots bad and the folio stays where it was (memory or pool).
//!
//! Writeback: the pool keeps a FIFO of the entries it stored (its LRU: entries leave it
//! only by being loaded, so insertion order is age). When a store finds the pool full,
//! the reclaimers write its oldest entries back to the file (decompress, write, free the
//! entry: `zswpwb`) until it is under the accept threshold; with `charge_pool` they also
//! keep the pool under half of memory_high, so that resident memory is not squeezed out
//! by compressed memory.

use crate::engine::Shared;
use crate::folio::{Kind, State, PENDING, SPLIT};
use crate::region::FolioTable;
use crate::size::{FolioSize, PAGE_SIZE};
use crate::swapfile::io::folio_checksum;
use crate::zswap::{CodecScratch, PoolHandle, StoreError, Stored};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// Where eviction put one folio (or, once split, one 4 KiB page).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placed {
    /// All zeros: nothing stored.
    Zero,
    /// In the pool.
    Pool { handle: PoolHandle, compressed_len: usize },
    /// On the swap file, in the run of slots starting at `slot`.
    File(SwapHandle),
}

impl From<Stored> for Placed {
    fn from(s: Stored) -> Placed {
        match s {
            Stored::Zero => Placed::Zero,
            Stored::Entry { handle, compressed_len } => Placed::Pool { handle, compressed_len },
        }
    }
}

/// File writes queued for one submission: (first slot, data).
pub(crate) type WriteBatch<'a> = Vec<(u64, &'a [u8])>;

/// Why a folio could not leave memory.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SwapOutError {
    /// The pool is full and there is no swap file.
    PoolFull,
    /// The pool is full (or refused the folio) and the swap file has no room.
    NoSpace,
    /// The swap file failed the write; its slots are marked bad.
    WriteFailed,
}

/// A Swapped folio's handle word: the first slot in the low 32 bits (the file holds at
/// most 2^32 slots, 16 TiB), the crc32c of the data in the high 32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SwapHandle {
    pub slot: u64,
    pub checksum: u32,
}

impl SwapHandle {
    pub fn to_raw(self) -> u64 {
        debug_assert!(self.slot < 1 << 32);
        ((self.checksum as u64) << 32) | self.slot
    }
    pub fn from_raw(raw: u64) -> SwapHandle {
        SwapHandle { slot: raw & 0xFFFF_FFFF, checksum: (raw >> 32) as u32 }
    }
}

/// One pool entry in the writeback FIFO; current if the folio is still Pool with the
/// generation it was stored with.
struct PoolLruEntry {
    table: Arc<FolioTable>,
    page: usize,
    order: u8,
    gen: u16,
}

/// The pool's age order, oldest first (zswap's LRU).
#[derive(Default)]
pub(crate) struct PoolLru {
    entries: Mutex<VecDeque<PoolLruEntry>>,
}

impl PoolLru {
    pub fn push(&self, table: &Arc<FolioTable>, page: usize, folio: FolioSize, gen: u16, live_entries: u64) {
        let mut entries = self.entries.lock().unwrap();
        entries.push_back(PoolLruEntry { table: table.clone(), page, order: folio.order() as u8, gen });
        // Entries that were loaded stay queued until writeback passes them; keep the
        // queue within a small multiple of what the pool holds.
        if entries.len() as u64 > 2 * live_entries + 1024 {
            entries.retain(|e| {
                let s = e.table.entry(e.page).load();
                !e.table.dead.load(Ordering::Relaxed) && s.kind() == Kind::Pool && s.gen() == e.gen
            });
        }
    }
    fn pop(&self) -> Option<PoolLruEntry> {
        self.entries.lock().unwrap().pop_front()
    }
    fn push_front(&self, e: PoolLruEntry) {
        self.entries.lock().unwrap().push_front(e);
    }
    fn len(&self) -> usize {
        self.entries.lock().unwrap().len()
    }
}

thread_local! {
    /// A 2 MiB page-aligned buffer per thread for writeback (decompressed data headed for
    /// an O_DIRECT write).
    static WRITEBACK_BUF: std::cell::RefCell<Option<AlignedBuf>> = const { std::cell::RefCell::new(None) };
}

/// Page-aligned anonymous memory, for O_DIRECT.
struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> std::io::Result<AlignedBuf> {
        // SAFETY: an anonymous private mapping with no address hint; checked for failure.
        let ptr = unsafe {
            crate::sys::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(AlignedBuf { ptr: ptr.cast(), len })
    }
    fn as_mut_slice(&mut self, len: usize) -> &mut [u8] {
        assert!(len <= self.len);
        // SAFETY: the mapping is `self.len` bytes, owned by this buffer, and `&mut self`
        // makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`, which nothing references now.
        unsafe { crate::sys::munmap(self.ptr.cast(), self.len) };
    }
}

impl Shared {
    /// Store an evicted folio: in the pool, or on the swap file (see the module comment).
    /// With `batch`, file writes are queued there instead of issued (`swap_writepage`).
    pub(crate) fn swap_out<'a>(
        &self,
        data: &'a [u8],
        folio: FolioSize,
        scratch: &mut CodecScratch,
        batch: Option<&mut WriteBatch<'a>>,
    ) -> Result<Vec<Placed>, SwapOutError> {
        let vm = &self.counters.vm;
        if self.swap.is_some() && !self.pool_accepts(data.len() as u64 / 2) {
            return self.swap_writepage(data, folio, batch);
        }
        let min_ratio = self.swap.as_ref().map(|_| self.config.min_compression_ratio);
        match self.zswap.zswap_store(data, scratch, min_ratio) {
            Ok(stored) => Ok(vec![stored.into()]),
            Err(StoreError::CompressPoor) => {
                vm.zswap_reject_compress_poor.inc();
                self.swap_writepage(data, folio, batch)
            }
            Err(StoreError::Full) => {
                vm.zswap_pool_limit_hit.inc();
                self.reclaim.set_pool_full();
                match self.swap {
                    Some(_) => self.swap_writepage(data, folio, batch),
                    None => Err(SwapOutError::PoolFull),
                }
            }
        }
    }

    /// Whether the pool takes `bytes` more. Once it has been found full it takes nothing
    /// until it is back under the accept threshold (with a swap file to send folios to
    /// meanwhile) or has room again (without one).
    pub(crate) fn pool_accepts(&self, bytes: u64) -> bool {
        let pool = &self.zswap.pool;
        if pool.cap() == 0 && self.swap.is_some() {
            // max_pool=0 with a swap file: the pool is off, as zswap disabled.
            return false;
        }
        if !self.reclaim.pool_is_full() {
            return true;
        }
        let limit = match self.swap {
            Some(_) => pool.cap() / 100 * self.config.accept_threshold_percent as u64,
            None => pool.cap(),
        };
        if pool.footprint_bytes() + bytes <= limit {
            self.reclaim.clear_pool_full();
            return true;
        }
        false
    }

    /// Whether eviction can put a folio anywhere: the pool takes it, or the file has room.
    pub(crate) fn can_swap_out(&self, bytes: u64) -> bool {
        self.pool_accepts(bytes) || self.swap.as_ref().is_some_and(|dev| dev.has_free_slots())
    }

    /// Write a folio to the swap file: whole into one aligned run of slots, or, when the
    /// allocator has none, as 4 KiB pieces (the caller splits the folio). With `batch` the
    /// writes are only queued: the caller issues the batch (`write_batch`) before it
    /// publishes anything.
    pub(crate) fn swap_writepage<'a>(&self, data: &'a [u8], folio: FolioSize, batch: Option<&mut WriteBatch<'a>>) -> Result<Vec<Placed>, SwapOutError> {
        let Some(dev) = &self.swap else {
            return Err(SwapOutError::PoolFull);
        };
        let order = folio.order();
        if let Some(slot) = dev.alloc(order) {
            let handle = SwapHandle { slot, checksum: folio_checksum(data) };
            if let Some(batch) = batch {
                batch.push((slot, data));
                return Ok(vec![Placed::File(handle)]);
            }
            return match dev.io.write_at(slot, data) {
                Ok(()) => Ok(vec![Placed::File(handle)]),
                Err(err) => {
                    self.write_failed(slot, order, &err);
                    Err(SwapOutError::WriteFailed)
                }
            };
        }
        if order == 0 {
            return Err(SwapOutError::NoSpace);
        }
        let mut slots = Vec::with_capacity(folio.pages());
        for _ in 0..folio.pages() {
            match dev.alloc(0) {
                Some(slot) => slots.push(slot),
                None => {
                    slots.iter().for_each(|&s| dev.free(s, 0));
                    return Err(SwapOutError::NoSpace);
                }
            }
        }
        let ios: Vec<(u64, &[u8])> = slots.iter().copied().zip(data.chunks(PAGE_SIZE)).collect();
        let placed = ios.iter().map(|&(slot, page)| Placed::File(SwapHandle { slot, checksum: folio_checksum(page) })).collect();
        if let Some(batch) = batch {
            batch.extend(ios);
            return Ok(placed);
        }
        if let Err(err) = dev.io.write_batch(&ios) {
            // Which piece failed is unknown: mark them all bad rather than trust any.
            for &slot in &slots {
                self.write_failed(slot, 0, &err);
            }
            return Err(SwapOutError::WriteFailed);
        }
        Ok(placed)
    }

    /// Issue the file writes queued by the swap-outs of one eviction batch in one
    /// submission (their staging copies are contiguous, and so are their slots when the
    /// allocator hands out a run: `pwritev` merges them). `spans[i]` is the part of
    /// `batch` that `results[i]` queued; if the write fails, every result that queued
    /// anything fails, what it stored in the pool is freed and its slots are marked bad.
    pub(crate) fn write_batch(&self, batch: &WriteBatch<'_>, spans: &[std::ops::Range<usize>], results: &mut [Result<Vec<Placed>, SwapOutError>]) {
        if batch.is_empty() {
            return;
        }
        let dev = self.swap.as_ref().expect("queued writes imply a swap file");
        let Err(err) = dev.io.write_batch(batch) else { return };
        for (result, span) in results.iter_mut().zip(spans) {
            if span.is_empty() {
                continue;
            }
            if let Ok(placed) = result {
                for p in placed.iter() {
                    if let Placed::Pool { handle, .. } = *p {
                        self.zswap.free(handle);
                    }
                }
            }
            *result = Err(SwapOutError::WriteFailed);
        }
        for &(slot, data) in batch {
            self.write_failed(slot, (data.len() / PAGE_SIZE).trailing_zeros(), &err);
        }
    }

    fn write_failed(&self, slot: u64, order: u32, err: &std::io::Error) {
        self.counters.vm.swap_write_error.inc();
        if let Some(dev) = &self.swap {
            dev.mark_bad(slot, order);
        }
        eprintln!("folioswap: writing {} KiB to swap slot {slot} failed: {err}; the slots are marked bad and the folio stays in memory", 4 << order);
    }

    /// Bring a swapped-out folio's data into `dst` (exactly one folio), from the pool or the
    /// file. The caller holds the folio lock, so the handle stays live.
    pub(crate) fn load_swapped(&self, kind: Kind, handle: u64, dst: &mut [u8]) -> Result<(), String> {
        match kind {
            // SAFETY: the handle is live: the folio is Pool and the caller holds its lock.
            Kind::Pool => unsafe { self.zswap.zswap_load(PoolHandle::from_raw(handle), dst) }.map_err(|e| format!("its pool entry is corrupt: {e}")),
            Kind::Swapped => self.swap_read_folio(SwapHandle::from_raw(handle), dst),
            other => unreachable!("load_swapped of a {other:?} folio"),
        }
    }

    /// Read a folio from the swap file and check it against the checksum it was written with.
    fn swap_read_folio(&self, h: SwapHandle, dst: &mut [u8]) -> Result<(), String> {
        let dev = self.swap.as_ref().expect("a Swapped folio implies a swap file");
        let vm = &self.counters.vm;
        if let Err(err) = dev.io.read_at(h.slot, dst) {
            vm.swap_read_error.inc();
            return Err(format!("reading it from swap slot {} failed: {err}", h.slot));
        }
        let sum = folio_checksum(dst);
        if sum != h.checksum {
            vm.swap_checksum_error.inc();
            return Err(format!("its data on swap slot {} fails the checksum (crc32c {sum:#010x}, written as {:#010x})", h.slot, h.checksum));
        }
        Ok(())
    }

    /// Release a swapped-out folio's storage (loaded back, discarded or unmapped).
    pub(crate) fn free_swapped(&self, kind: Kind, handle: u64, folio: FolioSize) {
        match kind {
            Kind::Pool => {
                self.zswap.free(PoolHandle::from_raw(handle));
                self.reclaim.pool_folio_bytes.fetch_sub(folio.bytes() as u64, Ordering::Relaxed);
            }
            Kind::Swapped => {
                let dev = self.swap.as_ref().expect("a Swapped folio implies a swap file");
                dev.free(SwapHandle::from_raw(handle).slot, folio.order());
            }
            other => unreachable!("free_swapped of a {other:?} folio"),
        }
    }

    /// The counters of a folio brought in from `kind` (by a fault or by readahead).
    pub(crate) fn count_swapin_io(&self, kind: Kind, folio: FolioSize) {
        let vm = &self.counters.vm;
        let sc = self.counters.size(folio);
        if kind == Kind::Swapped {
            vm.pswpin.add(folio.pages() as u64);
            sc.swpin.inc();
        } else {
            vm.zswpin.add(folio.pages() as u64);
            sc.zswpin.inc();
        }
    }

    /// Publish where a locked folio's data went, as its new state: one entry for the
    /// folio, or one per 4 KiB page, after which the folio is split. `s` is the state the
    /// folio had when locked. Counts the store under its tier.
    pub(crate) fn publish_placed(&self, table: &Arc<FolioTable>, head: usize, folio: FolioSize, s: State, placed: &[Placed]) {
        if placed.len() > 1 {
            return self.publish_split(table, head, folio, placed);
        }
        let e = table.entry(head);
        let kind = self.record_placed(table, head, folio, s.gen(), placed[0]);
        e.set_locked(s.with_kind(kind).with(crate::folio::WRITEBACK, false).with(crate::folio::HUGE, false));
    }

    /// Set the handle of the locked entry at `page` for `placed`, count it, and return the
    /// kind it takes.
    pub(crate) fn record_placed(&self, table: &Arc<FolioTable>, page: usize, folio: FolioSize, gen: u16, placed: Placed) -> Kind {
        let vm = &self.counters.vm;
        let sc = self.counters.size(folio);
        let e = table.entry(page);
        let pages = folio.pages() as u64;
        match placed {
            Placed::Zero => {
                vm.zswap_same_filled.inc();
                vm.zswpout.add(pages);
                sc.zswpout.inc();
                e.set_handle(0);
                Kind::ZeroSwapped
            }
            Placed::Pool { handle, compressed_len } => {
                if compressed_len == folio.bytes() {
                    vm.zswap_stored_raw.inc();
                }
                vm.zswpout.add(pages);
                sc.zswpout.inc();
                self.reclaim.pool_folio_bytes.fetch_add(folio.bytes() as u64, Ordering::Relaxed);
                self.pool_lru.push(table, page, folio, gen, self.zswap.pool.live_objects());
                e.set_handle(handle.to_raw());
                Kind::Pool
            }
            Placed::File(h) => {
                vm.pswpout.add(pages);
                sc.swpout.inc();
                if folio.is_huge() {
                    vm.thp_swpout.inc();
                }
                e.set_handle(h.to_raw());
                Kind::Swapped
            }
        }
    }

    /// Whether the reclaimers should write pool entries back to the swap file now.
    pub(crate) fn needs_writeback(&self) -> bool {
        if self.swap.is_none() {
            return false;
        }
        let pool = &self.zswap.pool;
        let footprint = pool.footprint_bytes();
        let over_threshold = self.reclaim.pool_is_full() && footprint > pool.cap() / 100 * self.config.accept_threshold_percent as u64;
        let over_charge = self.memcg.charge_pool && self.memcg.limit.is_some_and(|high| footprint > high / 2);
        over_threshold || over_charge
    }

    /// Write the pool's oldest entry back to the swap file (zswap_writeback_entry).
    /// Returns whether an entry left the pool.
    pub(crate) fn writeback_one(&self) -> bool {
        let Some(dev) = &self.swap else { return false };
        if !dev.has_free_slots() {
            return false;
        }
        let mut budget = self.pool_lru.len();
        while budget > 0 {
            budget -= 1;
            let Some(v) = self.pool_lru.pop() else { return false };
            if v.table.dead.load(Ordering::Relaxed) {
                continue;
            }
            let e = v.table.entry(v.page);
            // A locked entry is being loaded (it leaves the pool anyway) or changed by an
            // event: skip it.
            let Some(s) = e.try_lock() else { continue };
            let current = s.kind() == Kind::Pool && s.gen() == v.gen && (v.order == 0 || !s.has(SPLIT));
            if !current || s.has(PENDING) {
                e.unlock();
                continue;
            }
            if s.has(crate::folio::CACHED) {
                // A readahead copy is about to be used (or dropped): writing the entry
                // back now is likely waste. Look at it again later.
                e.unlock();
                self.pool_lru.entries.lock().unwrap().push_back(v);
                continue;
            }
            let folio = FolioSize::from_order(v.order as u32).expect("valid order");
            let handle = e.handle();
            let written = WRITEBACK_BUF.with(|cell| {
                let mut cell = cell.borrow_mut();
                if cell.is_none() {
                    *cell = Some(AlignedBuf::new(crate::size::HUGE_SIZE).map_err(|e| format!("no memory for a writeback buffer: {e}"))?);
                }
                let buf = cell.as_mut().expect("just set").as_mut_slice(folio.bytes());
                self.load_swapped(Kind::Pool, handle, buf)?;
                // Write errors are reported where they happen; NoSpace just ends writeback.
                self.swap_writepage(buf, folio, None).map_err(|_| String::new())
            });
            let placed = match written {
                Ok(placed) => placed,
                Err(msg) => {
                    e.unlock();
                    if !msg.is_empty() {
                        eprintln!("folioswap: writing a pool entry back failed: {msg}");
                    }
                    self.pool_lru.push_front(v);
                    return false;
                }
            };
            self.free_swapped(Kind::Pool, handle, folio);
            self.counters.vm.zswpwb.add(folio.pages() as u64);
            self.publish_placed(&v.table, v.page, folio, s, &placed);
            self.apply_pending_after_publish(&v.table, v.page, folio);
            e.unlock();
            return true;
        }
        false
    }

    /// After a locked folio's new state is published: apply an event marked meanwhile
    /// (a published split has made the head an order-0 page like the others).
    pub(crate) fn apply_pending_after_publish(&self, table: &Arc<FolioTable>, head: usize, folio: FolioSize) {
        let s = table.entry(head).load();
        if s.has(PENDING) {
            let size = if s.has(SPLIT) { FolioSize::K4 } else { folio };
            if let Err(crate::events::ApplyError::Failed(msg)) = self.apply_pending_locked(table, head, size) {
                eprintln!("folioswap: applying an event after a swap-out: {msg}");
            }
        }
    }
}
