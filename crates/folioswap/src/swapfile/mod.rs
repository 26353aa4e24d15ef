//! The swap file tier (seeds 000, 003, 004): where folios go when the compressed pool is
//! full, refuses them, or writes back its coldest entries.
//!
//! - `cluster`: the slot allocator. The file is cut into 2 MiB clusters of 512 slots of
//!   4 KiB, each cluster with its own lock, free / non-full / per-order cluster lists as
//!   the kernel keeps them, and per-thread slot caches filled and drained in batches.
//! - `io`: the file itself: creation (unlinked, mode 0600), O_DIRECT where the filesystem
//!   allows it, whole-folio reads and writes, checksums, and a fault-injecting
//!   wrapper for the tests.
//! - `sealed`: the file encrypted and authenticated page by page (`encrypt`).
//!
//! The same allocator also fronts the remote tier (`remote.rs`), whose backend takes the
//! file's place behind [`io::SwapIo`].

pub mod cluster;
pub mod io;
pub mod sealed;

use crate::stats::SwapStat;
use cluster::{SlotCache, SwapMap};
use io::SwapIo;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// A table of `n` zeroed counters that costs no memory until written: the zeroed
/// allocation comes from the kernel's zero pages.
pub(crate) fn zeroed_u32s(n: usize) -> Box<[AtomicU32]> {
    let zeros = vec![0u32; n].into_boxed_slice();
    // SAFETY: AtomicU32 has the size, alignment and bit validity of u32, so a boxed
    // slice of one is a boxed slice of the other, freed with the same layout.
    unsafe { std::mem::transmute::<Box<[u32]>, Box<[AtomicU32]>>(zeros) }
}

/// As [`zeroed_u32s`], of 64-bit counters.
pub(crate) fn zeroed_u64s(n: usize) -> Box<[AtomicU64]> {
    let zeros = vec![0u64; n].into_boxed_slice();
    // SAFETY: AtomicU64 has the size, alignment and bit validity of u64 (on every target
    // with 64-bit atomics, which `AtomicU64` itself requires).
    unsafe { std::mem::transmute::<Box<[u64]>, Box<[AtomicU64]>>(zeros) }
}

static NEXT_DEVICE_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's order-0 slot caches, one per swap device it has used (a process can
    /// run several engines). A cache holds its map alive; caches of devices that are gone
    /// are dropped (and their slots returned) the next time this thread allocates.
    static SLOT_CACHES: RefCell<Vec<(u64, CountedCache)>> = const { RefCell::new(Vec::new()) };
}

/// A thread's slot cache, with its share of the device's count of cached slots: a cache
/// that goes away (its thread exits, or its device is gone) returns its slots and takes
/// them off the count.
struct CountedCache {
    cache: SlotCache,
    cached: Arc<AtomicU64>,
}

impl CountedCache {
    fn held(&self) -> u64 {
        (self.cache.ready_slots() + self.cache.returned_slots()) as u64
    }
}

impl Drop for CountedCache {
    fn drop(&mut self) {
        self.cached.fetch_sub(self.held(), Ordering::Relaxed);
        // The SlotCache field drops next and returns the slots to its map.
    }
}

/// An engine's swap tier: the slot allocator over the file and the file's I/O.
pub(crate) struct SwapDevice {
    id: u64,
    pub map: Arc<SwapMap>,
    pub io: Box<dyn SwapIo>,
    /// Slots per thread cache (0: no caches).
    cache_batch: usize,
    /// Made by the engine on demand (no swap file was configured).
    on_demand: bool,
    /// The filesystem under a sparse file filled up: it takes no more folios.
    disk_full: AtomicBool,
    /// Free slots sitting in threads' caches (counted as used by the map).
    cached: Arc<AtomicU64>,
    /// The crc32c of each slot's 4 KiB as last written, so that a large folio on the file
    /// can be split into pages, each with its own checksum, without reading it
    /// (`tier.rs`). Untouched (zero, and costing no memory) until a slot is written.
    page_sums: Box<[AtomicU32]>,
}

impl SwapDevice {
    /// A device over `io`; `on_demand`: the engine made the file itself.
    pub fn new(io: Box<dyn SwapIo>, cache_batch: usize, on_demand: bool) -> SwapDevice {
        // A swapped folio's handle keeps its slot in 32 bits (`tier::SwapHandle`); a
        // larger backend is used up to 2^32 slots (16 TiB).
        let slots = io.slots().min(1 << 32);
        let map = Arc::new(SwapMap::new(slots));
        let page_sums = zeroed_u32s(slots as usize);
        SwapDevice {
            id: NEXT_DEVICE_ID.fetch_add(1, Ordering::Relaxed),
            map,
            io,
            cache_batch,
            on_demand,
            disk_full: AtomicBool::new(false),
            cached: Arc::new(AtomicU64::new(0)),
            page_sums,
        }
    }

    /// Remember the checksum of the page written to `slot`.
    pub fn set_page_sum(&self, slot: u64, sum: u32) {
        self.page_sums[slot as usize].store(sum, Ordering::Relaxed);
    }

    /// The checksum of the page last written to `slot`.
    pub fn page_sum(&self, slot: u64) -> u32 {
        self.page_sums[slot as usize].load(Ordering::Relaxed)
    }

    /// Whether the engine made the file itself (sparse, on demand).
    pub fn is_on_demand(&self) -> bool {
        self.on_demand
    }

    /// A write found the filesystem full (ENOSPC on a sparse file): hand out no more
    /// slots. Returns whether this call is the one that found it.
    pub fn set_disk_full(&self) -> bool {
        !self.disk_full.swap(true, Ordering::Relaxed)
    }

    /// Run `f` on this thread's slot cache for this device.
    fn with_cache<R>(&self, f: impl FnOnce(&mut SlotCache) -> R) -> R {
        SLOT_CACHES.with(|caches| {
            let mut caches = caches.borrow_mut();
            let i = match caches.iter().position(|(id, _)| *id == self.id) {
                Some(i) => i,
                None => {
                    // Caches whose device is gone (theirs is the last reference to the
                    // map) are dropped, returning their slots to their own maps.
                    caches.retain(|(_, c)| Arc::strong_count(c.cache.map()) > 1);
                    let cache = SlotCache::with_batch(self.map.clone(), self.cache_batch);
                    caches.push((self.id, CountedCache { cache, cached: self.cached.clone() }));
                    caches.len() - 1
                }
            };
            let counted = &mut caches[i].1;
            let before = counted.held();
            let r = f(&mut counted.cache);
            let after = counted.held();
            // Relaxed add then sub can dip below zero transiently across threads; wrapping
            // arithmetic keeps the sum right.
            self.cached.fetch_add(after.wrapping_sub(before), Ordering::Relaxed);
            r
        })
    }

    /// An aligned run of `1 << order` free slots; order-0 slots come from the thread's cache.
    pub fn alloc(&self, order: u32) -> Option<u64> {
        if self.disk_full.load(Ordering::Relaxed) || self.io.down().is_some() {
            return None;
        }
        if order == 0 && self.cache_batch > 0 {
            return self.with_cache(|cache| cache.alloc());
        }
        self.map.alloc(order)
    }

    /// A run of `count` consecutive slots (1 to 512), for that many 4 KiB folios written
    /// together: an aligned run of the next power of two, whose tail is given back at once
    /// (never written, so there is nothing to discard). A writeback run of 24 pages then
    /// takes one place on the file, and readahead reads it back with one I/O, where runs
    /// of 16 and 8 would go wherever their orders' clusters are.
    pub fn alloc_run(&self, count: usize) -> Option<u64> {
        assert!((1..=cluster::SLOTS_PER_CLUSTER as usize).contains(&count), "a run of {count} slots");
        let order = count.next_power_of_two().trailing_zeros();
        let first = self.alloc(order)?;
        let size = 1u64 << order;
        let mut pos = count as u64;
        while pos < size {
            // The largest aligned part that starts at `pos` and stays in the run.
            let mut part = pos.trailing_zeros();
            while pos + (1 << part) > size {
                part -= 1;
            }
            self.map.free(first + pos, part);
            pos += 1 << part;
        }
        Some(first)
    }

    /// Return a run; order-0 slots go to the thread's cache, which gives them back in batches.
    pub fn free(&self, slot: u64, order: u32) {
        self.io.discard(slot, 1 << order);
        if order == 0 && self.cache_batch > 0 {
            return self.with_cache(|cache| cache.free(slot));
        }
        self.map.free(slot, order)
    }

    /// A run whose write failed: never handed out again.
    pub fn mark_bad(&self, slot: u64, order: u32) {
        self.map.mark_bad(slot, order)
    }

    pub fn has_free_slots(&self) -> bool {
        !self.disk_full.load(Ordering::Relaxed) && self.io.down().is_none() && self.map.free_slots() > 0
    }

    pub fn stat(&self) -> SwapStat {
        SwapStat {
            slots_total: self.map.total_slots(),
            slots_used: self.map.used_slots(),
            slots_free: self.map.free_slots(),
            slots_bad: self.map.bad_slots(),
            slots_cached: self.cached.load(Ordering::Relaxed),
            direct_io: self.io.is_direct(),
            path: self.io.location().map(|p| p.display().to_string()),
            size_bytes: self.map.total_slots() * cluster::SLOT_SIZE,
            disk_bytes: self.io.disk_bytes(),
            on_demand: self.on_demand,
            disk_full: self.disk_full.load(Ordering::Relaxed),
            io: self.io.stats(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device() -> SwapDevice {
        let dir = std::env::temp_dir();
        let file = io::SwapFile::create_sparse(&dir, 4 * cluster::CLUSTER_SIZE).expect("a sparse swap file in the temp directory");
        SwapDevice::new(Box::new(file), 0, false)
    }

    #[test]
    fn a_run_takes_exactly_its_slots_and_gives_the_tail_back() {
        let dev = device();
        for count in [1usize, 2, 3, 5, 24, 31, 33, 100, 511, 512] {
            let first = dev.alloc_run(count).expect("room for the run");
            let aligned = count.next_power_of_two() as u64;
            assert_eq!(first % aligned, 0, "{count}: an aligned run");
            assert_eq!(dev.map.used_slots(), count as u64, "{count}: only the run's slots are used");
            // The tail is free: freeing its first slot again is refused (the map panics,
            // changing nothing). The count above covers the rest of it.
            if aligned > count as u64 {
                let tail = first + count as u64;
                let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dev.map.free(tail, 0))).is_err();
                assert!(refused, "{count}: tail slot {tail} was left allocated");
            }
            // Each slot of the run is freed on its own, as each 4 KiB folio's is.
            for slot in first..first + count as u64 {
                dev.free(slot, 0);
            }
            assert_eq!(dev.map.used_slots(), 0, "{count}");
        }
    }
}
