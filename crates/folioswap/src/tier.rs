//! The tiers behind one face: where an evicted folio's data goes and comes back from.
//! Today the compressed pool (`zswap/`) and, behind it, the swap file (`swapfile/`); a
//! new tier adds a [`Placed`] variant and its arms here, and nowhere else.
//!
//! The face: [`Tiers::accepts`] (is there room), [`Tiers::store`] (compress or write),
//! [`Tiers::load`] (decompress or read, checked), [`Tiers::free`] (release), and
//! [`Tiers::record`] (publish where the data went into the folio's entry, counted).
//!
//! Where a folio goes, as zswap decides for the kernel (mm/zswap.c, mm/page_io.c):
//! 1. into the pool, compressed whole, when the pool accepts it (`zswpout`);
//! 2. onto the swap file, raw, when the pool is full and has not yet shrunk under
//!    `accept_threshold_percent` of its cap (then nothing is compressed at all), when the
//!    store finds it full (`zswap_pool_limit_hit`), or when the folio compresses less than
//!    `min_compression_ratio` (`zswap_reject_compress_poor`) (`pswpout`);
//! 3. onto the swap file, raw, while the pool only passes folios through to it
//!    (`pool_bypass.rs`, `zswap_bypass`).
//!
//! A folio is written whole into one aligned run of slots (`thp_swpout` for 2 MiB); when
//! the allocator has no such run it is written as 4 KiB pieces and the folio is split
//! (`swpout_fallback`, `thp_swpout_fallback`), as the kernel does. Every write carries a
//! crc32c of the data, kept in the folio's handle word beside the slot and checked on
//! swap-in: a mismatch or a read error fails the fault (SIGBUS, with the address and the
//! reason on stderr) and leaves the data where it is, never silently wrong. A write error
//! marks the slots bad and the folio stays where it was (memory or pool).
//!
//! The pool keeps a FIFO of the entries it stored (its LRU: entries leave it only by
//! being loaded, so insertion order is age), which writeback (`writeback.rs`) walks.
//!
//! Locks: the pool LRU's mutex is a leaf; the pool and the swap device have their own
//! internal locks (documented there), never held across a call into this file.

use crate::config::Config;
use crate::folio::{Kind, State, LOCKED, SPLIT};
use crate::lru::Lru;
use crate::memcg::MemCg;
use crate::pool_bypass::PoolBypass;
use crate::pool_share::{Edges, LoadedFrom, PoolShare};
use crate::reclaim_ctl::ReclaimCtl;
use crate::size::{FolioSize, PAGE_SIZE};
use crate::stats::Counters;
use crate::swapfile::io::folio_checksum;
use crate::swapfile::SwapDevice;
use crate::table::FolioTable;
use crate::zswap::{CodecScratch, PoolHandle, SplitError, StoreError, Stored, Zswap};
use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

/// An evicted folio's data on its way to a tier; `pieced`: a large folio goes into the
/// pool as 4 KiB pieces (`zswap/pieces.rs`) rather than one stream.
pub(crate) struct Evicted<'a> {
    pub data: &'a [u8],
    pub folio: FolioSize,
    pub pieced: bool,
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

/// Why a swapped-out folio's data could not be brought back. The data stays where it was.
#[derive(Debug)]
pub(crate) enum LoadError {
    /// The pool entry does not decompress.
    Corrupt(String),
    /// The swap file's read failed.
    ReadFailed { slot: u64, err: std::io::Error },
    /// The data read does not match the checksum it was written with.
    Checksum { slot: u64, found: u32, written: u32 },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Corrupt(why) => write!(f, "its pool entry is corrupt: {why}"),
            LoadError::ReadFailed { slot, err } => write!(f, "reading it from swap slot {slot} failed: {err}"),
            LoadError::Checksum { slot, found, written } => {
                write!(f, "its data on swap slot {slot} fails the checksum (crc32c {found:#010x}, written as {written:#010x})")
            }
        }
    }
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

/// The checksum a Swapped entry carries: the crc32c of a single page; for a larger run,
/// the crc32c of its pages' crc32c values, each of which `each` receives (page index,
/// sum) to be kept by the device, so that a split can check its pages one by one.
fn run_checksum(data: &[u8], mut each: impl FnMut(usize, u32)) -> u32 {
    if data.len() <= PAGE_SIZE {
        let sum = folio_checksum(data);
        each(0, sum);
        return sum;
    }
    let mut sums = [0u32; 512];
    let pages = data.len() / PAGE_SIZE;
    for (i, page) in data.chunks(PAGE_SIZE).enumerate() {
        sums[i] = folio_checksum(page);
        each(i, sums[i]);
    }
    combine_page_sums(&sums[..pages])
}

/// One page per slot, each placed on its own with its page's checksum (kept by the device too).
fn place_pages(dev: &SwapDevice, ios: &[(u64, &[u8])]) -> Vec<Placed> {
    ios.iter()
        .map(|&(slot, page)| Placed::File(SwapHandle { slot, checksum: run_checksum(page, |_, sum| dev.set_page_sum(slot, sum)) }))
        .collect()
}

fn combine_page_sums(sums: &[u32]) -> u32 {
    if let [one] = sums {
        return *one;
    }
    sums.iter().fold(0, |acc, s| crc32c::crc32c_append(acc, &s.to_le_bytes()))
}

/// One pool entry in the writeback FIFO; current if the folio is still Pool with the
/// generation it was stored with.
#[derive(Clone)]
pub(crate) struct PoolLruEntry {
    pub table: Arc<FolioTable>,
    pub page: usize,
    pub order: u8,
    pub gen: u16,
}

impl PoolLruEntry {
    /// Whether `s`, the state its folio has now, is still this entry's: Pool, of the
    /// generation it was stored with, and (a large folio) not split into pages since.
    pub fn is_current(&self, s: State) -> bool {
        s.kind() == Kind::Pool && s.gen() == self.gen && (self.order == 0 || !s.has(SPLIT))
    }
}

/// The pool's age order, oldest first (zswap's LRU).
#[derive(Default)]
pub(crate) struct PoolLru {
    entries: Mutex<VecDeque<PoolLruEntry>>,
}

impl PoolLru {
    fn push(&self, table: &Arc<FolioTable>, page: usize, folio: FolioSize, gen: u16, live_entries: u64) {
        let mut entries = self.entries.lock().unwrap();
        // Entries that were loaded stay queued until writeback passes them; keep the
        // queue within a small multiple of what the pool holds. An entry is pushed while
        // its folio is being published, locked and not yet Pool: this one, pushed after
        // the sweep, and others' (kept while locked). Sweeping them too left their pool
        // objects where no writeback could find them: at an 8M limit with the pool
        // charged, such orphans filled memory_high and a fault failed.
        if entries.len() as u64 >= 2 * live_entries + 1024 {
            entries.retain(|e| {
                let s = e.table.entry(e.page).load();
                !e.table.dead.load(Ordering::Relaxed) && (s.has(LOCKED) || (s.kind() == Kind::Pool && s.gen() == e.gen))
            });
        }
        entries.push_back(PoolLruEntry { table: table.clone(), page, order: folio.order() as u8, gen });
    }
    pub fn pop(&self) -> Option<PoolLruEntry> {
        self.entries.lock().unwrap().pop_front()
    }
    pub fn push_front(&self, e: PoolLruEntry) {
        self.entries.lock().unwrap().push_front(e);
    }
    pub fn push_back(&self, e: PoolLruEntry) {
        self.entries.lock().unwrap().push_back(e);
    }
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap().len()
    }
    /// Up to `max` queued entries from position `from`, oldest first (some of them
    /// stale), for a pass that must not hold the queue while it locks folios
    /// (`compact.rs`). Between two calls the queue moves (pops at the front, pushes at
    /// the back), so a pass in slices may see an entry twice or miss one.
    pub fn slice(&self, from: usize, max: usize) -> Vec<PoolLruEntry> {
        let entries = self.entries.lock().unwrap();
        entries.range(from.min(entries.len())..).take(max).cloned().collect()
    }
}

/// The pool and the swap file, with the policy that chooses between them.
pub(crate) struct Tiers {
    pub zswap: Zswap,
    /// The pool's entries oldest first, for writeback to the swap file.
    pub pool_lru: PoolLru,
    /// The swap file tier behind the pool, if configured.
    pub file: Option<SwapDevice>,
    /// The pool refused a store; stop offering it folios until it has room again.
    pool_full: AtomicBool,
    /// Uncompressed bytes of the folios in the pool.
    pool_folio_bytes: AtomicU64,
    accept_threshold_percent: u64,
    min_compression_ratio: f64,
    /// With the pool charged to memory_high (and a file behind it): the most of the
    /// limit the pool may hold, three quarters of it (as the kernel's zswap refuses a
    /// store over the memcg's zswap.max). Past that, folios go to the file, so that the
    /// pool (whose footprint writeback cannot always shrink: freed objects leave partly
    /// used pages) never crowds resident memory out of the limit; writeback starts
    /// earlier, at `pool_share` (`needs_writeback`).
    charged_share: Option<u64>,
    /// The charged pool's share of the limit, which the swap-ins move (`pool_share.rs`).
    pub pool_share: PoolShare,
    /// Whether the pool only passes folios through to the file (`pool_bypass.rs`); `None`
    /// with `pool_bypass` off or no file.
    pub bypass: Option<PoolBypass>,
}

impl Tiers {
    pub fn new(zswap: Zswap, file: Option<SwapDevice>, config: &Config) -> Tiers {
        let has_file = file.is_some();
        let charged = config.charge_pool && has_file;
        Tiers {
            charged_share: config.memory_high.filter(|_| charged).map(|high| high / 4 * 3),
            zswap,
            pool_lru: PoolLru::default(),
            file,
            pool_full: AtomicBool::new(false),
            pool_folio_bytes: AtomicU64::new(0),
            accept_threshold_percent: config.accept_threshold_percent as u64,
            min_compression_ratio: config.min_compression_ratio,
            pool_share: PoolShare::default(),
            bypass: (config.pool_bypass && has_file).then(PoolBypass::default),
        }
    }

    /// The pool's footprint: what it charges with `charge_pool`.
    pub fn pool_bytes(&self) -> u64 {
        self.zswap.pool.footprint_bytes()
    }

    /// Uncompressed bytes of the folios in the pool.
    pub fn pool_folio_bytes(&self) -> u64 {
        self.pool_folio_bytes.load(Ordering::Relaxed)
    }

    pub fn pool_is_full(&self) -> bool {
        self.pool_full.load(Ordering::Relaxed)
    }

    /// Whether the pool takes `bytes` more. Once it has been found full it takes nothing
    /// until it is back under the accept threshold (with a swap file to send folios to
    /// meanwhile) or has room again (without one).
    pub fn accepts(&self, bytes: u64) -> bool {
        let pool = &self.zswap.pool;
        if pool.cap() == 0 && self.file.is_some() {
            // max_pool=0 with a swap file: the pool is off, as zswap disabled.
            return false;
        }
        if let Some(share) = self.charged_share {
            if pool.footprint_bytes() + bytes > share {
                // Free pages the pool keeps populated for reuse count against the limit
                // too: give them back before refusing.
                pool.shrink_slack(0);
                if pool.footprint_bytes() + bytes > share {
                    return false;
                }
            }
        }
        if !self.pool_is_full() {
            return true;
        }
        let limit = match self.file {
            Some(_) => pool.cap() / 100 * self.accept_threshold_percent,
            None => pool.cap(),
        };
        if pool.footprint_bytes() + bytes <= limit {
            self.pool_full.store(false, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Whether a folio of about `bytes` compressed can go anywhere: the pool takes it,
    /// or the file has room.
    pub fn can_store(&self, bytes: u64) -> bool {
        self.accepts(bytes) || self.file.as_ref().is_some_and(|dev| dev.has_free_slots())
    }

    /// Whether the pool should be written back to the swap file now: it was found full
    /// and is over its accept threshold, or (with `charge_pool`) it holds more of
    /// memory_high than its share (`pool_share.rs`).
    pub fn needs_writeback(&self, memcg: &MemCg) -> bool {
        if self.file.is_none() {
            return false;
        }
        let pool = &self.zswap.pool;
        let footprint = pool.footprint_bytes();
        let over_threshold = self.pool_is_full() && footprint > pool.cap() / 100 * self.accept_threshold_percent;
        let over_charge = memcg.charge_pool
            && memcg.limit.is_some_and(|high| {
                // Free page-sized slots kept for reuse are charged like the rest: at most a
                // sliver of the limit (the pool's own floor, 8M, was a quarter of a 34M one).
                if pool.slack_bytes() > high / 32 {
                    pool.shrink_slack(high / 64);
                }
                let cap = self.pool_share.cap(high);
                if footprint > cap {
                    // Populated free pages first: writing entries back only adds to them.
                    pool.shrink_slack(0);
                }
                pool.footprint_bytes() > cap
            });
        over_threshold || over_charge
    }

    /// `limit`, where the pool is charged to it.
    fn charged_limit(&self, limit: Option<u64>) -> Option<u64> {
        limit.filter(|_| self.charged_share.is_some())
    }

    /// With the pool charged to `limit`: how much of it the pool may hold before writeback.
    pub fn charged_pool_share(&self, limit: Option<u64>) -> Option<u64> {
        self.charged_limit(limit).map(|limit| self.pool_share.cap(limit))
    }

    /// The pool's reach, in pages of the eviction clock: the refault distance of the entry
    /// written back last (the pool holds what was evicted after it).
    fn pool_reach(&self, lru: &Lru) -> u64 {
        lru.distance_since(self.pool_share.writeback_frontier())
    }

    /// Count a swap-in from the pool or the file, `distance` pages of evictions after
    /// the folio left, toward the pool's bypass and the charged pool's share
    /// (`pool_share.rs`); every window, move the share and measure the pool's edges anew.
    pub fn note_swapin(&self, from: LoadedFrom, distance: u64, lru: &Lru, limit: Option<u64>) {
        self.note_readahead_hit(from, distance, lru, limit);
        let Some(limit) = self.charged_limit(limit) else {
            return;
        };
        if self.pool_share.note_swapin(from, distance) {
            let reach = self.pool_reach(lru);
            let pool = &self.zswap.pool;
            self.pool_share.open_window(Edges::new(limit, self.pool_folio_bytes(), pool.footprint_bytes(), reach));
        }
    }

    /// Count a fault on a readahead copy (or, from `note_swapin`, any swap-in) toward the
    /// pool's bypass (`pool_bypass.rs`): under a stream most swap-ins are readahead hits,
    /// and the bypass would otherwise wait a long time for its window. The share counts
    /// only the faults that read (`note_swapin`).
    pub fn note_readahead_hit(&self, from: LoadedFrom, distance: u64, lru: &Lru, limit: Option<u64>) {
        if let Some(bypass) = &self.bypass {
            bypass.note_swapin(from, distance, || self.pool_reach(lru), limit.unwrap_or(0) / PAGE_SIZE as u64);
        }
    }

    /// Store an evicted folio: in the pool, or on the swap file (see the module comment).
    /// With `batch`, file writes are queued there instead of issued (the kernel's
    /// `swap_writepage` plugged).
    /// A pool found full wakes a reclaimer to write its oldest entries back.
    pub fn store<'a>(
        &self,
        evicted: Evicted<'a>,
        scratch: &mut CodecScratch,
        batch: Option<&mut WriteBatch<'a>>,
        counters: &Counters,
        reclaim: &ReclaimCtl,
    ) -> Result<Vec<Placed>, SwapOutError> {
        let Evicted { data, folio, pieced } = evicted;
        let vm = &counters.vm;
        let bypassed = self.bypass.as_ref().is_some_and(PoolBypass::active);
        if bypassed && self.file.as_ref().is_some_and(|dev| dev.has_free_slots()) {
            vm.zswap_bypass.inc();
            return self.write_to_file(data, folio, batch, counters);
        }
        if self.file.is_some() && !self.accepts(data.len() as u64 / 2) {
            return self.write_to_file(data, folio, batch, counters);
        }
        let min_ratio = self.file.as_ref().map(|_| self.min_compression_ratio);
        let stored = self.zswap.zswap_store(data, scratch, min_ratio, pieced);
        let recompressed = std::mem::take(&mut scratch.recompressed);
        match stored {
            Ok(stored) => {
                vm.zswap_recompressed.add(recompressed);
                Ok(vec![stored.into()])
            }
            Err(StoreError::CompressPoor) => {
                vm.zswap_reject_compress_poor.inc();
                self.write_to_file(data, folio, batch, counters)
            }
            Err(StoreError::Full) => {
                vm.zswap_pool_limit_hit.inc();
                if !self.pool_full.swap(true, Ordering::Relaxed) {
                    reclaim.wake_one();
                }
                match self.file {
                    Some(_) => self.write_to_file(data, folio, batch, counters),
                    None => Err(SwapOutError::PoolFull),
                }
            }
        }
    }

    /// Write a folio to the swap file: whole into one aligned run of slots, or, when the
    /// allocator has none, as 4 KiB pieces (the caller splits the folio). With `batch` the
    /// writes are only queued: the caller issues the batch (`write_batch`) before it
    /// publishes anything.
    pub fn write_to_file<'a>(
        &self,
        data: &'a [u8],
        folio: FolioSize,
        batch: Option<&mut WriteBatch<'a>>,
        counters: &Counters,
    ) -> Result<Vec<Placed>, SwapOutError> {
        let Some(dev) = &self.file else {
            return Err(SwapOutError::PoolFull);
        };
        let order = folio.order();
        if let Some(slot) = dev.alloc(order) {
            let handle = SwapHandle { slot, checksum: run_checksum(data, |i, sum| dev.set_page_sum(slot + i as u64, sum)) };
            if let Some(batch) = batch {
                batch.push((slot, data));
                return Ok(vec![Placed::File(handle)]);
            }
            return match dev.io.write_at(slot, data) {
                Ok(()) => Ok(vec![Placed::File(handle)]),
                Err(err) => {
                    self.write_failed(slot, order, &err, counters);
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
        let placed = place_pages(dev, &ios);
        if let Some(batch) = batch {
            batch.extend(ios);
            return Ok(placed);
        }
        if let Err(err) = dev.io.write_batch(&ios) {
            // Which piece failed is unknown: mark them all bad rather than trust any.
            for &slot in &slots {
                self.write_failed(slot, 0, &err, counters);
            }
            return Err(SwapOutError::WriteFailed);
        }
        Ok(placed)
    }

    /// Queue 4 KiB folios that follow each other in their region (a writeback batch's),
    /// `pages` back to back, for one run of consecutive slots (`SwapDevice::alloc_run`), so
    /// that readahead reads them back with one I/O; each slot is still freed on its own.
    /// `None` when the allocator has no such run: write them one by one.
    pub fn write_run_to_file<'a>(&self, pages: &'a [u8], batch: &mut WriteBatch<'a>) -> Option<Vec<Placed>> {
        let count = pages.len() / PAGE_SIZE;
        debug_assert!(pages.len().is_multiple_of(PAGE_SIZE));
        let dev = self.file.as_ref()?;
        let first = dev.alloc_run(count)?;
        let ios: WriteBatch<'a> = (first..).zip(pages.chunks(PAGE_SIZE)).collect();
        let placed = place_pages(dev, &ios);
        batch.extend(ios);
        Some(placed)
    }

    /// Issue the file writes queued by the stores of one eviction batch in one
    /// submission (their staging copies are contiguous, and so are their slots when the
    /// allocator hands out a run: `pwritev` merges them). `spans[i]` is the part of
    /// `batch` that `results[i]` queued; if the write fails, every result that queued
    /// anything fails, what it stored in the pool is freed and its slots are marked bad.
    pub fn write_batch(
        &self,
        batch: &WriteBatch<'_>,
        spans: &[std::ops::Range<usize>],
        results: &mut [Result<Vec<Placed>, SwapOutError>],
        counters: &Counters,
    ) {
        if batch.is_empty() {
            return;
        }
        let dev = self.file.as_ref().expect("queued writes imply a swap file");
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
            self.write_failed(slot, (data.len() / PAGE_SIZE).trailing_zeros(), &err, counters);
        }
    }

    fn write_failed(&self, slot: u64, order: u32, err: &std::io::Error, counters: &Counters) {
        counters.vm.swap_write_error.inc();
        let Some(dev) = &self.file else { return };
        if err.raw_os_error() == Some(libc::ENOSPC) && dev.is_on_demand() {
            // A sparse file (made on demand) whose filesystem filled up: no slot will take
            // a write now. (A configured file has its space reserved: ENOSPC there is a
            // fault of that write, handled as any other below.)
            dev.free(slot, order);
            if dev.set_disk_full() {
                let stat = dev.stat();
                eprintln!(
                    "folioswap: the swap file in {} ran out of disk space after {} written: the filesystem is full. \
                     It takes no more folios; what does not fit stays in memory or in the pool. Free disk space, or \
                     point FOLIOSWAP_SWAP_FILE at a larger disk (PATH:SIZE reserves the space up front)",
                    stat.path.as_deref().unwrap_or("?"),
                    crate::size::format_bytes(stat.disk_bytes.unwrap_or(0))
                );
            }
            return;
        }
        if dev.io.is_remote() {
            // Nothing is wrong with the slot (a name); the error names the tier and key.
            dev.free(slot, order);
            eprintln!("folioswap: {err}; the folio stays in memory");
            return;
        }
        dev.mark_bad(slot, order);
        eprintln!(
            "folioswap: writing {} KiB to swap slot {slot} failed: {err}; the slots are marked bad and the folio stays in memory",
            4 << order
        );
    }

    /// Bring a swapped-out folio's data into `dst` (exactly one folio), from the pool or
    /// the file, checked. The caller holds the folio lock, so the handle stays live.
    pub fn load(&self, kind: Kind, handle: u64, dst: &mut [u8], counters: &Counters) -> Result<(), LoadError> {
        match kind {
            // SAFETY: the handle is live: the folio is Pool and the caller holds its lock.
            Kind::Pool => unsafe { self.zswap.zswap_load(PoolHandle::from_raw(handle), dst) }.map_err(LoadError::Corrupt),
            Kind::Swapped => self.read_from_file(SwapHandle::from_raw(handle), dst, counters),
            other => unreachable!("load of a {other:?} folio"),
        }
    }

    /// Read a folio from the swap file and check it against the checksum it was written with.
    fn read_from_file(&self, h: SwapHandle, dst: &mut [u8], counters: &Counters) -> Result<(), LoadError> {
        let dev = self.file.as_ref().expect("a Swapped folio implies a swap file");
        if let Err(err) = dev.io.read_at(h.slot, dst) {
            counters.vm.swap_read_error.inc();
            return Err(LoadError::ReadFailed { slot: h.slot, err });
        }
        self.check(h, dst, counters)
    }

    /// Check data read from the file against its handle's checksum.
    pub fn check(&self, h: SwapHandle, data: &[u8], counters: &Counters) -> Result<(), LoadError> {
        let found = run_checksum(data, |_, _| {});
        if found != h.checksum {
            counters.vm.swap_checksum_error.inc();
            return Err(LoadError::Checksum { slot: h.slot, found, written: h.checksum });
        }
        Ok(())
    }

    /// Release a swapped-out folio's storage (loaded back, discarded or unmapped).
    pub fn free(&self, kind: Kind, handle: u64, folio: FolioSize) {
        match kind {
            Kind::Pool => {
                self.zswap.free(PoolHandle::from_raw(handle));
                self.pool_folio_bytes.fetch_sub(folio.bytes() as u64, Ordering::Relaxed);
            }
            Kind::Swapped => {
                let dev = self.file.as_ref().expect("a Swapped folio implies a swap file");
                dev.free(SwapHandle::from_raw(handle).slot, folio.order());
            }
            other => unreachable!("free of a {other:?} folio"),
        }
    }

    /// Release what a store placed but nobody published (several entries are 4 KiB pieces).
    pub fn free_placed(&self, placed: &[Placed], folio: FolioSize) {
        let size = if placed.len() > 1 { FolioSize::K4 } else { folio };
        for p in placed {
            match *p {
                Placed::Zero => {}
                Placed::Pool { handle, .. } => self.zswap.free(handle),
                Placed::File(h) => self.file.as_ref().expect("placed on a swap file").free(h.slot, size.order()),
            }
        }
    }

    /// Publish `placed` into the locked entry at `page`: set its handle, count the store
    /// under its tier, and return the kind the entry takes.
    pub fn record(&self, table: &Arc<FolioTable>, page: usize, folio: FolioSize, gen: u16, placed: Placed, counters: &Counters) -> Kind {
        let vm = &counters.vm;
        let sc = counters.size(folio);
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
                self.pool_folio_bytes.fetch_add(folio.bytes() as u64, Ordering::Relaxed);
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

    /// Split the stored `folio` behind a Pool entry into one entry per page (a partial
    /// swap-in: `fault.rs`), copying its pieces; frees the folio's own entry when done.
    /// `None`: it stays as it was (stored as one stream, or no room in the pool for the
    /// copies). The caller holds the folio lock and publishes each page with
    /// [`Tiers::record_page`].
    pub fn split_pool_entry(&self, handle: u64, folio: FolioSize, counters: &Counters) -> Option<Vec<Placed>> {
        let handle = PoolHandle::from_raw(handle);
        // SAFETY: the handle is live: the folio is Pool and the caller holds its lock.
        match unsafe { self.zswap.zswap_split(handle, folio.bytes()) } {
            Ok(Some(stored)) => {
                self.free(Kind::Pool, handle.to_raw(), folio);
                Some(stored.into_iter().map(Placed::from).collect())
            }
            Ok(None) => None,
            Err(SplitError::Full) => {
                counters.vm.zswap_pool_limit_hit.inc();
                None
            }
            Err(SplitError::Corrupt(_)) => None,
        }
    }

    /// Split a large folio on the swap file into one entry per page: its run of slots
    /// stays where it is and each page takes its slot and the checksum kept for it
    /// (`SwapDevice::page_sum`); nothing is read. `None` when the kept checksums do not
    /// add up to the folio's (then a whole swap-in reads and checks it as usual).
    pub fn split_file_entry(&self, handle: u64, folio: FolioSize) -> Option<Vec<Placed>> {
        let dev = self.file.as_ref().expect("a Swapped folio implies a swap file");
        let h = SwapHandle::from_raw(handle);
        let sums: Vec<u32> = (0..folio.pages() as u64).map(|i| dev.page_sum(h.slot + i)).collect();
        if combine_page_sums(&sums) != h.checksum {
            return None;
        }
        Some(sums.iter().enumerate().map(|(i, &checksum)| Placed::File(SwapHandle { slot: h.slot + i as u64, checksum })).collect())
    }

    /// Publish one page of a folio split by [`Tiers::split_pool_entry`] or
    /// [`Tiers::split_file_entry`] into its locked entry: like `record`, but the data
    /// stays where it was, so nothing is counted as swapped out again.
    pub fn record_page(&self, table: &Arc<FolioTable>, page: usize, gen: u16, placed: Placed) -> Kind {
        let e = table.entry(page);
        match placed {
            Placed::Zero => {
                e.set_handle(0);
                Kind::ZeroSwapped
            }
            Placed::Pool { handle, .. } => {
                self.pool_folio_bytes.fetch_add(PAGE_SIZE as u64, Ordering::Relaxed);
                self.pool_lru.push(table, page, FolioSize::K4, gen, self.zswap.pool.live_objects());
                e.set_handle(handle.to_raw());
                Kind::Pool
            }
            Placed::File(h) => {
                e.set_handle(h.to_raw());
                Kind::Swapped
            }
        }
    }

    /// Count a folio brought in from `kind` (by a fault or by readahead).
    pub fn count_load(kind: Kind, folio: FolioSize, counters: &Counters) {
        let sc = counters.size(folio);
        if kind == Kind::Swapped {
            counters.vm.pswpin.add(folio.pages() as u64);
            sc.swpin.inc();
        } else {
            counters.vm.zswpin.add(folio.pages() as u64);
            sc.zswpin.inc();
        }
        if folio.is_huge() {
            counters.vm.thp_swpin.inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Compressor;
    use crate::swapfile::cluster::CLUSTER_SIZE;
    use crate::swapfile::io::SwapFile;

    /// Free page-sized slots the pool keeps populated for reuse are charged to
    /// memory_high like the rest, so a charged pool keeps them to 1/32 of the limit,
    /// whatever the pool's own floor (8M) would keep.
    #[test]
    fn a_charged_pool_keeps_its_slack_to_a_sliver_of_the_limit() {
        let high = 32u64 << 20;
        let config = Config::default().memory_high("32M").unwrap();
        let file = SwapFile::create_sparse(&std::env::temp_dir(), 4 * CLUSTER_SIZE).expect("a sparse swap file in the temp directory");
        let tiers =
            Tiers::new(Zswap::new(Compressor::Lz4, Compressor::None, u64::MAX), Some(SwapDevice::new(Box::new(file), 0, false)), &config);
        let memcg = MemCg::new(Some(high), true);
        let pool = &tiers.zswap.pool;
        let handles: Vec<_> = (0..256u32).map(|i| pool.store(&[i as u8; 8192]).unwrap()).collect();
        handles.into_iter().for_each(|h| pool.free(h));
        assert!(pool.slack_bytes() > high / 32, "the test needs more slack than the bound: {}", pool.slack_bytes());
        assert!(!tiers.needs_writeback(&memcg), "an empty pool needs no writeback");
        assert!(pool.slack_bytes() <= high / 64, "slack {} left", pool.slack_bytes());
        assert_eq!(pool.footprint_bytes(), pool.slack_bytes());
    }

    /// A charged pool is written back once it holds more than its share of the limit;
    /// swap-ins from the file just past its reach move the share up, to half at most.
    /// Without a swap file the pool is not charged and has no share.
    #[test]
    fn a_charged_pool_is_written_back_past_its_share_which_the_swapins_move() {
        use crate::pool_share::WINDOW;
        let high = 32u64 << 20;
        let config = Config::default().memory_high("32M").unwrap();
        let zswap = || Zswap::new(Compressor::Lz4, Compressor::None, u64::MAX);
        assert_eq!(Tiers::new(zswap(), None, &config).charged_pool_share(Some(high)), None);
        let file = SwapFile::create_sparse(&std::env::temp_dir(), 4 * CLUSTER_SIZE).expect("a sparse swap file in the temp directory");
        let tiers = Tiers::new(zswap(), Some(SwapDevice::new(Box::new(file), 0, false)), &config);
        let memcg = MemCg::new(Some(high), true);
        assert_eq!(tiers.charged_pool_share(Some(high)), Some(high / 8), "the share starts at 1/8");
        // 6M of pages that do not compress: over 1/8 of the limit, under half.
        let mut x = 1u64;
        let mut noise = || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 56) as u8
        };
        let pool = &tiers.zswap.pool;
        let handles: Vec<_> = (0..1536).map(|_| pool.store(&(0..PAGE_SIZE).map(|_| noise()).collect::<Vec<u8>>()).unwrap()).collect();
        assert!(tiers.needs_writeback(&memcg), "6M of pool over a share of 4M");
        let edges = Edges::new(high, 6 << 20, pool.footprint_bytes(), 10_000);
        tiers.pool_share.open_window(edges);
        for _ in 0..32 * WINDOW {
            if tiers.pool_share.note_swapin(LoadedFrom::File, 10_100) {
                tiers.pool_share.open_window(edges);
            }
        }
        assert_eq!(tiers.charged_pool_share(Some(high)), Some(high / 2));
        assert!(!tiers.needs_writeback(&memcg), "6M of pool under a share of 16M");
        handles.into_iter().for_each(|h| pool.free(h));
    }
}
