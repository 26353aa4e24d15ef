//! The swap cache's readahead half: the decompressed copies that readahead brought in
//! (the kernel's clean swap-cache folios), the eviction log that slot-order readahead
//! walks, and the helper thread's queue. State only; the path is `readahead.rs`.
//!
//! Every mutex here is a leaf: nothing else is taken while one is held. Copies are added
//! and removed only by whoever holds the folio's lock; the cache's mutex guards the map.

use crate::ra_window::RaState;
use crate::size::FolioSize;
use crate::staging::{Slot, Staging};
use crate::table::FolioTable;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Eviction clock → the address of the folio evicted at that clock value: the reverse map
/// that slot-order readahead walks. A ring; entries are hints, checked under the folio lock.
pub(crate) struct EvictLog {
    ring: Box<[AtomicU64]>,
}

const EVICT_LOG_ENTRIES: usize = 1 << 20;

impl EvictLog {
    pub fn new() -> EvictLog {
        EvictLog { ring: (0..EVICT_LOG_ENTRIES).map(|_| AtomicU64::new(0)).collect() }
    }
    pub fn record(&self, clock: u32, addr: usize) {
        self.ring[clock as usize % EVICT_LOG_ENTRIES].store(addr as u64, Ordering::Relaxed);
    }
    pub fn get(&self, clock: u32) -> Option<usize> {
        let a = self.ring[clock as usize % EVICT_LOG_ENTRIES].load(Ordering::Relaxed);
        (a != 0).then_some(a as usize)
    }
}

/// A readahead copy: a staging slot of the folio's size holding its data.
pub(crate) struct RaCopy {
    pub table: Arc<FolioTable>,
    pub slot: Slot,
    pub huge: bool,
    pub bytes: u64,
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
    pub fn has_room(&self, folio: FolioSize) -> bool {
        let inner = self.inner.lock().unwrap();
        inner.bytes + folio.bytes() as u64 <= self.max_bytes && inner.per_order[folio.index()] < Staging::slots_of(folio) / 2
    }
    pub fn insert(&self, table: &Arc<FolioTable>, head: usize, slot: Slot, huge: bool, folio: FolioSize) {
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
    pub fn slot_of(&self, table: &Arc<FolioTable>, head: usize) -> Option<Slot> {
        self.inner.lock().unwrap().copies.get(&key(table, head)).map(|c| c.slot)
    }
    pub fn take(&self, table: &Arc<FolioTable>, head: usize, seq: Option<u64>) -> Option<RaCopy> {
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
    pub fn oldest(&self) -> Option<(Arc<FolioTable>, usize, u64)> {
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

/// Neighbours to bring in, found by a fault and read by the helper (or the fault itself).
pub(crate) struct RaRequest {
    pub folios: Vec<(Arc<FolioTable>, usize)>,
    pub folio: FolioSize,
    pub stride: bool,
}

/// The engine's readahead: the copies, the slot-order state, the helper's queue.
pub(crate) struct Readahead {
    pub cache: RaCache,
    /// Slot-order readahead's window, global as the kernel's `swapin_readahead_hits`.
    pub global: RaState,
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

    /// Queue a request for the helper, dropping the oldest beyond `QUEUE_MAX`.
    pub fn enqueue(&self, request: RaRequest) {
        let mut q = self.queue.lock().unwrap();
        if q.len() >= QUEUE_MAX {
            q.pop_front();
        }
        q.push_back(request);
        self.queued.notify_one();
    }

    /// The helper's next request; None once `stop` is set.
    pub fn next_request(&self, stop: &std::sync::atomic::AtomicBool) -> Option<RaRequest> {
        let mut q = self.queue.lock().unwrap();
        loop {
            if let Some(r) = q.pop_front() {
                return Some(r);
            }
            if stop.load(Ordering::Acquire) {
                return None;
            }
            q = self.queued.wait_timeout(q, Duration::from_millis(200)).unwrap().0;
        }
    }
}
