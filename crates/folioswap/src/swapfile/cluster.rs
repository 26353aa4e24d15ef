//! The swap slot allocator: clusters, per-order cluster lists, per-thread slot caches (seeds
//! 000 and 003; the kernel's `mm/swapfile.c` and `mm/swap_slots.c`).
//!
//! The swap file is a row of 4 KiB slots named by their index (a `u64`; the byte offset is
//! `slot * SLOT_SIZE`). A folio of order k (2^k pages, k = 0..=9) goes into one naturally aligned
//! run of 2^k slots, so that it is written and read back with one I/O and freed as one unit;
//! `alloc` returns the run's first slot. A 2 MiB folio takes a whole cluster (seed 000).
//!
//! Clusters. The file is cut into 2 MiB clusters of 512 slots (a trailing partial cluster is not
//! used). Each cluster has its own mutex over a `ClusterState`: a 512-bit *busy* map (allocated
//! or bad), a 512-bit *bad* map, the counts of both, the order the cluster serves and the list it
//! is on. Aligned runs never cross a cluster boundary, so allocating or freeing any run takes
//! exactly one cluster lock and nothing device-wide is locked on the hot path: seed 003 split
//! `swap_info_struct->lock` this way because it had become the most contended lock of swap-out.
//!
//! Lists. As in the kernel, every cluster is on exactly one of:
//! - `Free`: nothing allocated and nothing bad. Any order may take it; order 9 only takes these.
//! - `NonFull(k)`: partly used, serving order k: a cluster gets its order from the first
//!   allocation that takes it off the free list and keeps it until it is entirely free again.
//!   Keeping one order per partly used cluster is what keeps aligned runs available: 4 KiB
//!   allocations scattered over every cluster would soon leave no 64 KiB or 2 MiB hole at all.
//! - `Frag(k)`: order k with free slots but no free aligned run of 2^k left. A search moves a
//!   cluster here when it finds no run in it, and any free moves it back to `NonFull(k)`, so a
//!   `Frag(k)` cluster never has a run of its order and order-k searches can skip the list.
//! - no list (`Full`): no free slot.
//!
//! Each list is a FIFO threaded through per-cluster links (the kernel's `list_head`): push at the
//! tail, pick from the head, remove from anywhere, all O(1). FIFO order matters: the partly used
//! cluster picked next is the one that has collected frees the longest, not the one that just got
//! its first free slot back. Lists change only when a cluster changes state (free → partly used →
//! full → partly used → free), not per slot, but with the file about half full and frees landing
//! everywhere that is still often (a free into a full cluster relists it, the next allocation
//! fills it again). So each list is split into `LIST_SHARDS` sub-lists by cluster number, each
//! with its own small mutex on its own cache line: threads relisting different clusters rarely
//! meet, where the kernel serialises all of it on `si->lock`. A search walks the sub-lists
//! starting with its shard's own, which also spreads threads over different clusters.
//!
//! Search (the kernel's `cluster_alloc_swap_entry`), for order k: the calling thread's current
//! cluster for k; else the `NonFull(k)` clusters, preferring those no other thread is filling;
//! else a free cluster; and for order 0 only, any free slot in a cluster of another order
//! (`Frag` lists first, then `NonFull`), which is how a fragmented file still serves 4 KiB pages.
//! So `None` means, at the moment each cluster was examined: for k > 0, no free cluster and no
//! order-k cluster with a free aligned run (clusters of other orders are not split up for it);
//! for k = 0, no free slot at all outside the slot caches. The caller then splits the folio; the
//! map counts each `None` per order (`fallbacks`).
//!
//! Current clusters. Like the kernel's per-CPU `percpu_cluster`, each of `NR_SHARDS` shards
//! remembers per order the slot to try next; a thread uses the shard picked by a thread-local
//! number (threads beyond `NR_SHARDS` share shards, which is harmless). The hint is only a hint:
//! it is checked under the cluster lock against the cluster's list, and dropped as soon as the
//! cluster is full (its lock need not be taken to find that out). When a shard takes a new
//! cluster it records itself in the cluster's advisory `owner` word, and a thread picking from a
//! `NonFull` list passes owned clusters by (if it can), so that threads fill different clusters
//! and do not bounce one lock and one cache line between CPUs (seed 003's cluster distribution).
//! For the same reason each cluster is aligned to its own cache line.
//!
//! Memory. A cluster costs its cache lines (192 bytes) only from the first use of its chunk of
//! `CLUSTERS_PER_CHUNK` (`Clusters`): the swap file made on demand may grow to the disk's free
//! space, tens of GiB here, and a table for all of it written at start cost every process
//! 4.5 MiB of resident memory outside memory_high before it swapped a page (BENCHMARKS.md,
//! "What the swap map cost at start"). The free lists still thread every cluster, through
//! `links` (8 bytes each): a cluster never used is Free and empty, as a new chunk's are.
//!
//! Lock order: a cluster lock, then at most one sub-list lock at a time; never two cluster locks.
//! A cluster is on a list exactly when its state says so, changed only under both its lock and
//! the sub-list's. Picking from a list (`pick_and_lock`, the kernel's `isolate_lock_cluster`)
//! goes the other way round, so it only `try_lock`s clusters while it holds a sub-list lock; the
//! cluster it gets is taken off the list (*isolated*) and put back, on the list its new state
//! calls for, before its lock is released. When every candidate is busy it locks one the
//! ordinary way and then checks that it is still on the list. A panic (misuse, below) happens
//! before anything is changed, so a poisoned lock still guards a consistent state and is taken
//! over.
//!
//! Slot caches (`swap_slots.c`). A `SlotCache` belongs to one thread and serves order-0 slots from
//! a private array refilled 64 at a time (`alloc_batch`: one cluster lock per cluster touched).
//! Frees collect in a second array that goes back to the map sorted, one lock per cluster, when
//! it holds 64 (`free_batch`), on `drain`, or when the cache is dropped. A slot freed into a cache
//! stays allocated in the map until then, so nobody else can be handed it. Counting consequence:
//! the map counts every slot held in a cache (either array) as used, so `free_slots` understates
//! the truly free space by at most two batches per live cache, and `alloc(0)` on the map (or
//! another cache) can return `None` while caches still hold slots; `drain` makes every count
//! exact again. A cache whose refill finds the map empty first returns its own pending frees.
//! Larger orders bypass the caches, as in the kernel. A cache hands its slots out in ascending
//! order and refuses (panics on) the free of a slot it holds but has not handed out; a slot freed
//! twice into it is caught when the batch reaches the map (at once in debug builds).
//!
//! Counting. Used slots are counted per shard (wrapping adds and subtracts, summed on read), so
//! counting makes no cache line shared by all threads hot; the figures are exact when no
//! operation runs concurrently. Bad slots and fallbacks are rare and counted globally.
//!
//! Misuse. Freeing or marking bad a slot that is not allocated (a double free, a slot never
//! handed out, a bad slot), a misaligned run or one past the end panics with the slot's number:
//! it is a bug in the engine, and carrying on would hand one slot to two folios. A run may be
//! freed in pieces (a large folio split after swap-out frees its pages one by one).
//!
//! `GlobalLockMap` is seed 003's "before", for benchmarks: the same clusters, lists and search
//! order behind one mutex, with one current cluster per order for everybody and no slot caches.
//! `SlotAllocator` is the interface both offer.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, TryLockError};

/// Bytes per slot (one base page).
pub const SLOT_SIZE: u64 = 4096;
/// Slots per cluster.
pub const SLOTS_PER_CLUSTER: u64 = 512;
/// Bytes per cluster: one PMD-sized (2 MiB) folio.
pub const CLUSTER_SIZE: u64 = SLOT_SIZE * SLOTS_PER_CLUSTER;
/// The largest order: a run of one whole cluster.
pub const MAX_ORDER: u32 = 9;
/// Orders 0..=MAX_ORDER.
pub const NR_ORDERS: usize = MAX_ORDER as usize + 1;
/// Slots a `SlotCache` takes from the map, and returns to it, at once (the kernel's SWAP_BATCH).
pub const DEFAULT_CACHE_BATCH: usize = 64;

const SPC: u32 = SLOTS_PER_CLUSTER as u32;
const WORDS: usize = SPC as usize / 64;
/// Shards of current-cluster hints and used-slot counters (the kernel's per-CPU data).
const NR_SHARDS: usize = 64;
const NO_HINT: u64 = u64::MAX;
/// How far down a list `pick` looks for a cluster no other thread is filling.
const PICK_SCAN: usize = 8;
/// Sub-lists per `SwapMap` list (a cluster goes on sub-list `cluster % LIST_SHARDS`).
const LIST_SHARDS: usize = 8;

const _: () = assert!(SPC == 1 << MAX_ORDER && SPC.is_multiple_of(64));

/// Bit i set when i is a multiple of 2^order (order < 6): where aligned runs may start in a word.
const fn aligned_starts(order: u32) -> u64 {
    let mut mask = 0u64;
    let mut i = 0;
    while i < 64 {
        mask |= 1 << i;
        i += 1 << order;
    }
    mask
}

const ALIGNED_STARTS: [u64; 6] =
    [aligned_starts(0), aligned_starts(1), aligned_starts(2), aligned_starts(3), aligned_starts(4), aligned_starts(5)];

/// Bit i set when slots i .. i + 2^order of the word are all free and i is aligned (order < 6).
/// After step s a bit says "2^(s+1) free slots start here"; shifting brings in zeros from the
/// top, so runs that would leave the word are never reported.
fn free_run_starts(busy: u64, order: u32) -> u64 {
    let mut free = !busy;
    for step in 0..order {
        free &= free >> (1u32 << step);
    }
    free & ALIGNED_STARTS[order as usize]
}

/// The (word, mask) pairs covering the run of 2^order slots at `offset` (aligned).
fn run_masks(offset: u32, order: u32) -> impl Iterator<Item = (usize, u64)> {
    let len = 1u32 << order;
    let first_word = (offset / 64) as usize;
    let (words, mask) = if len >= 64 { ((len / 64) as usize, u64::MAX) } else { (1, ((1u64 << len) - 1) << (offset % 64)) };
    (first_word..first_word + words).map(move |word| (word, mask))
}

fn check_order(order: u32) {
    assert!(order <= MAX_ORDER, "swap slot allocator: order {order} is above {MAX_ORDER}");
}

/// Which list a cluster is on; `Full` means none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ClusterList {
    Free,
    NonFull(u8),
    Frag(u8),
    Full,
}

impl ClusterList {
    const COUNT: usize = 1 + 2 * NR_ORDERS;

    fn index(self) -> Option<usize> {
        match self {
            ClusterList::Free => Some(0),
            ClusterList::NonFull(order) => Some(1 + order as usize),
            ClusterList::Frag(order) => Some(1 + NR_ORDERS + order as usize),
            ClusterList::Full => None,
        }
    }
}

/// One cluster's slots, guarded by its lock (or, in `GlobalLockMap`, by the global one).
#[derive(Clone, Debug)]
struct ClusterState {
    /// Allocated or bad.
    busy: [u64; WORDS],
    bad: [u64; WORDS],
    used: u16,
    bad_count: u16,
    /// The order this cluster serves; meaningless while it is on the free list.
    order: u8,
    list: ClusterList,
    /// Taken off `list` by `pick_and_lock` while its lock is held; put back by `move_cluster`.
    isolated: bool,
}

impl ClusterState {
    const EMPTY: ClusterState =
        ClusterState { busy: [0; WORDS], bad: [0; WORDS], used: 0, bad_count: 0, order: 0, list: ClusterList::Free, isolated: false };

    fn free_count(&self) -> u32 {
        SPC - u32::from(self.used) - u32::from(self.bad_count)
    }

    fn is_all_free(&self) -> bool {
        self.used == 0 && self.bad_count == 0
    }

    /// Offset of the first free aligned run of 2^order slots at or after `from`, wrapping around
    /// the cluster once.
    fn find_run(&self, order: u32, from: u32) -> Option<u32> {
        let len = 1u32 << order;
        let from = (from % SPC) & !(len - 1);
        if len >= 64 {
            let words = (len / 64) as usize;
            return (0..SPC / len).map(|i| (from + i * len) % SPC).find(|&start| {
                let word = (start / 64) as usize;
                self.busy[word..word + words].iter().all(|&w| w == 0)
            });
        }
        let first_word = (from / 64) as usize;
        let bit = from % 64;
        // WORDS + 1 steps: the first word is visited again at the end for the part before `from`.
        for step in 0..=WORDS {
            let word = (first_word + step) % WORDS;
            let mut starts = free_run_starts(self.busy[word], order);
            if step == 0 {
                starts &= u64::MAX << bit;
            } else if step == WORDS {
                starts &= (1u64 << bit) - 1;
            }
            if starts != 0 {
                return Some(word as u32 * 64 + starts.trailing_zeros());
            }
        }
        None
    }

    /// Marks a free run allocated (the caller found it with `find_run`).
    fn take_run(&mut self, offset: u32, order: u32) {
        for (word, mask) in run_masks(offset, order) {
            debug_assert_eq!(self.busy[word] & mask, 0);
            self.busy[word] |= mask;
        }
        self.used += 1 << order;
    }

    /// Allocates up to `max` single slots, in slot order starting at `from` and wrapping, pushing
    /// their numbers (`base` + offset) to `out`; returns how many.
    fn take_free_slots(&mut self, from: u32, max: usize, base: u64, out: &mut Vec<u64>) -> usize {
        let first_word = (from / 64) as usize;
        let bit = from % 64;
        let mut taken = 0;
        for step in 0..=WORDS {
            let word = (first_word + step) % WORDS;
            let mut free = !self.busy[word];
            if step == 0 {
                free &= u64::MAX << bit;
            } else if step == WORDS {
                free &= (1u64 << bit) - 1;
            }
            while free != 0 && taken < max {
                let b = free.trailing_zeros();
                free &= free - 1;
                self.busy[word] |= 1 << b;
                out.push(base + u64::from(word as u32 * 64 + b));
                taken += 1;
            }
        }
        self.used += taken as u16;
        taken
    }

    /// Panics, changing nothing, unless every slot of the run is allocated (and not bad).
    /// `base` is the cluster's first slot, for the message.
    fn check_allocated(&self, offset: u32, order: u32, base: u64, action: &str) {
        for (word, mask) in run_masks(offset, order) {
            let unallocated = mask & !self.busy[word];
            let bad = mask & self.bad[word];
            if unallocated | bad != 0 {
                let bit = (unallocated | bad).trailing_zeros();
                let slot = base + u64::from(word as u32 * 64 + bit);
                let why = if bad >> bit & 1 == 1 { "it was marked bad" } else { "it is not allocated (freed twice, or never handed out)" };
                panic!(
                    "swap slot allocator: {action} of the {}-slot run at slot {}: slot {slot} is wrong: {why}",
                    1u32 << order,
                    base + u64::from(offset),
                );
            }
        }
    }

    fn release_run(&mut self, offset: u32, order: u32) {
        for (word, mask) in run_masks(offset, order) {
            self.busy[word] &= !mask;
        }
        self.used -= 1 << order;
    }

    /// Allocated → bad: still busy, never handed out again, no longer counted as used.
    fn mark_run_bad(&mut self, offset: u32, order: u32) {
        for (word, mask) in run_masks(offset, order) {
            self.bad[word] |= mask;
        }
        self.used -= 1 << order;
        self.bad_count += 1 << order;
    }

    /// The list the cluster belongs on after an allocation of `order` (taken from `self.list`).
    fn list_after_alloc(&self, order: u32) -> ClusterList {
        if self.free_count() == 0 {
            ClusterList::Full
        } else if self.list == ClusterList::Free {
            ClusterList::NonFull(order as u8)
        } else {
            self.list
        }
    }

    /// The list the cluster belongs on after a free: free space appeared, so a `Frag` or full
    /// cluster may have a run of its order again.
    fn list_after_free(&self) -> ClusterList {
        if self.is_all_free() {
            ClusterList::Free
        } else {
            ClusterList::NonFull(self.order)
        }
    }
}

/// Checks a run's alignment and bounds; returns (cluster, offset in cluster).
fn locate(first: u64, order: u32, total_slots: u64, action: &str) -> (usize, u32) {
    check_order(order);
    let len = 1u64 << order;
    assert!(
        first.is_multiple_of(len) && first + len <= total_slots,
        "swap slot allocator: {action} of the {len}-slot run at slot {first}: {}",
        if !first.is_multiple_of(len) { "not aligned to its size" } else { "past the end of the map" },
    );
    ((first / SLOTS_PER_CLUSTER) as usize, (first % SLOTS_PER_CLUSTER) as u32)
}

fn cluster_count(total_slots: u64) -> usize {
    let clusters = total_slots / SLOTS_PER_CLUSTER;
    assert!(clusters <= u64::from(u32::MAX), "swap slot allocator: {total_slots} slots is too many");
    clusters as usize
}

fn shard_index() -> usize {
    static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);
    thread_local!(static THREAD: usize = NEXT_THREAD.fetch_add(1, Relaxed));
    THREAD.with(|id| *id) % NR_SHARDS
}

/// What a slot allocator offers a caller that does not care which one it has (the benchmark).
pub trait SlotAllocator: Send + Sync {
    /// The first slot of a free aligned run of 2^order slots, now allocated; `None` when no such
    /// run is available (see the module comment for exactly when).
    fn alloc(&self, order: u32) -> Option<u64>;
    /// Returns an allocated run (or part of one, as an aligned sub-run).
    fn free(&self, first: u64, order: u32);
    /// An allocated run whose write failed: never handed out again.
    fn mark_bad(&self, first: u64, order: u32);
    fn total_slots(&self) -> u64;
    fn used_slots(&self) -> u64;
    fn bad_slots(&self) -> u64;
    fn free_slots(&self) -> u64 {
        self.total_slots().saturating_sub(self.used_slots() + self.bad_slots())
    }
    /// Allocations of this order that returned `None`.
    fn fallbacks(&self, order: u32) -> u64;
}

const NIL: u32 = u32::MAX;

/// A cluster's neighbours on the list it is on; read and written only under that list's lock
/// (atomics only so that the links can live outside the lists' mutexes).
struct Link {
    prev: AtomicU32,
    next: AtomicU32,
}

fn new_links(clusters: usize) -> Box<[Link]> {
    (0..clusters).map(|_| Link { prev: AtomicU32::new(NIL), next: AtomicU32::new(NIL) }).collect()
}

/// A FIFO of clusters threaded through their `Link`s.
#[derive(Clone, Copy)]
struct ClusterQueue {
    head: u32,
    tail: u32,
}

impl ClusterQueue {
    const EMPTY: ClusterQueue = ClusterQueue { head: NIL, tail: NIL };

    /// `clusters` in order (an initial free list).
    fn of(links: &[Link], clusters: impl Iterator<Item = u32>) -> Self {
        let mut queue = Self::EMPTY;
        for cluster in clusters {
            queue.push_back(links, cluster);
        }
        queue
    }

    fn push_back(&mut self, links: &[Link], cluster: u32) {
        links[cluster as usize].prev.store(self.tail, Relaxed);
        links[cluster as usize].next.store(NIL, Relaxed);
        match self.tail {
            NIL => self.head = cluster,
            tail => links[tail as usize].next.store(cluster, Relaxed),
        }
        self.tail = cluster;
    }

    fn remove(&mut self, links: &[Link], cluster: u32) {
        let prev = links[cluster as usize].prev.load(Relaxed);
        let next = links[cluster as usize].next.load(Relaxed);
        match prev {
            NIL => self.head = next,
            prev => links[prev as usize].next.store(next, Relaxed),
        }
        match next {
            NIL => self.tail = prev,
            next => links[next as usize].prev.store(prev, Relaxed),
        }
    }

    fn front(&self) -> Option<usize> {
        (self.head != NIL).then_some(self.head as usize)
    }

    /// The clusters from the head on.
    fn iter<'a>(&self, links: &'a [Link]) -> impl Iterator<Item = usize> + 'a {
        std::iter::successors(self.front(), move |&c| {
            let next = links[c].next.load(Relaxed);
            (next != NIL).then_some(next as usize)
        })
    }
}

/// One of a `SwapMap` list's sub-lists, on its own cache line.
#[repr(align(64))]
struct SubList {
    queue: Mutex<ClusterQueue>,
    /// Clusters on `queue`, written under its lock; read without it to skip empty sub-lists.
    len: AtomicU32,
}

#[repr(align(64))]
struct Cluster {
    state: Mutex<ClusterState>,
    /// Shard number + 1 of the thread filling this cluster as its current one, 0 for none.
    /// Advisory: read without the lock by `pick`, cleared when the cluster leaves `NonFull`.
    owner: AtomicU32,
}

impl Cluster {
    fn new() -> Cluster {
        Cluster { state: Mutex::new(ClusterState::EMPTY), owner: AtomicU32::new(0) }
    }
}

/// Clusters per chunk of the table: 2 GiB of the file, 192 KiB of table.
const CLUSTERS_PER_CHUNK: usize = 1024;

/// Every cluster of a map, allocated a chunk at a time at the chunk's first use (module
/// comment, "Memory"); a cluster reads as `Cluster::new()` until its chunk is there, so the
/// table behaves as if all of it had been made at start.
struct Clusters {
    chunks: Box<[OnceLock<Box<[Cluster]>>]>,
    len: usize,
}

impl Clusters {
    fn new(len: usize) -> Clusters {
        Clusters { chunks: (0..len.div_ceil(CLUSTERS_PER_CHUNK)).map(|_| OnceLock::new()).collect(), len }
    }

    fn len(&self) -> usize {
        self.len
    }

    /// Chunks allocated so far (tests).
    #[cfg(test)]
    fn chunks_allocated(&self) -> usize {
        self.chunks.iter().filter(|chunk| chunk.get().is_some()).count()
    }
}

impl std::ops::Index<usize> for Clusters {
    type Output = Cluster;

    fn index(&self, cluster: usize) -> &Cluster {
        assert!(cluster < self.len, "cluster {cluster} of {}", self.len);
        let (chunk, at) = (cluster / CLUSTERS_PER_CHUNK, cluster % CLUSTERS_PER_CHUNK);
        let first = chunk * CLUSTERS_PER_CHUNK;
        &self.chunks[chunk].get_or_init(|| (first..self.len.min(first + CLUSTERS_PER_CHUNK)).map(|_| Cluster::new()).collect())[at]
    }
}

/// One shard of per-"CPU" state, on its own cache lines.
#[repr(align(128))]
struct Shard {
    /// Per order: the slot to try next in the shard's current cluster, or `NO_HINT`.
    next: [AtomicU64; NR_ORDERS],
    /// Slots allocated minus slots freed or marked bad through this shard (wrapping).
    used: AtomicU64,
}

/// The scalable slot allocator: a lock per cluster, per-order lists, per-thread current clusters.
pub struct SwapMap {
    clusters: Clusters,
    /// `LIST_SHARDS` sub-lists per list, from `ClusterList::index(list) * LIST_SHARDS`.
    lists: Box<[SubList]>,
    links: Box<[Link]>,
    shards: Box<[Shard]>,
    total_slots: u64,
    bad_slots: AtomicU64,
    fallbacks: [AtomicU64; NR_ORDERS],
    /// Cluster lock acquisitions, so tests can check batching.
    #[cfg(test)]
    cluster_locks: AtomicU64,
}

impl SwapMap {
    /// A map of `total_slots / 512` whole clusters, all free.
    pub fn new(total_slots: u64) -> Self {
        let clusters = cluster_count(total_slots);
        let links = new_links(clusters);
        let lists = (0..ClusterList::COUNT * LIST_SHARDS)
            .map(|sub| {
                // The free list: every cluster, on the sub-list of its number.
                let members = (0..clusters as u32).filter(|&c| sub < LIST_SHARDS && c as usize % LIST_SHARDS == sub);
                let queue = ClusterQueue::of(&links, members.clone());
                SubList { queue: Mutex::new(queue), len: AtomicU32::new(members.count() as u32) }
            })
            .collect();
        SwapMap {
            clusters: Clusters::new(clusters),
            lists,
            links,
            shards: (0..NR_SHARDS)
                .map(|_| Shard { next: std::array::from_fn(|_| AtomicU64::new(NO_HINT)), used: AtomicU64::new(0) })
                .collect(),
            total_slots: clusters as u64 * SLOTS_PER_CLUSTER,
            bad_slots: AtomicU64::new(0),
            fallbacks: std::array::from_fn(|_| AtomicU64::new(0)),
            #[cfg(test)]
            cluster_locks: AtomicU64::new(0),
        }
    }

    /// Slots in whole clusters (what `new` was given, rounded down to a multiple of 512).
    pub fn total_slots(&self) -> u64 {
        self.total_slots
    }

    pub fn cluster_count(&self) -> usize {
        self.clusters.len()
    }

    /// Allocated slots, including those sitting in slot caches (exact when quiescent).
    pub fn used_slots(&self) -> u64 {
        let sum = self.shards.iter().fold(0u64, |sum, shard| sum.wrapping_add(shard.used.load(Relaxed)));
        // A sum read while others allocate and free can be momentarily out of range.
        (sum as i64).clamp(0, self.total_slots as i64) as u64
    }

    /// Slots that failed a write and are never handed out again.
    pub fn bad_slots(&self) -> u64 {
        self.bad_slots.load(Relaxed)
    }

    /// `total - used - bad`: slots in slot caches count as used.
    pub fn free_slots(&self) -> u64 {
        self.total_slots.saturating_sub(self.used_slots() + self.bad_slots())
    }

    /// Allocations of `order` that returned `None` (for order 0 including slot-cache refills
    /// that found nothing).
    pub fn fallbacks(&self, order: u32) -> u64 {
        check_order(order);
        self.fallbacks[order as usize].load(Relaxed)
    }

    /// Allocates an aligned run of 2^order slots (order 0..=9) and returns its first slot.
    /// `None`: see the module comment; it is counted in `fallbacks(order)`.
    pub fn alloc(&self, order: u32) -> Option<u64> {
        check_order(order);
        let shard = shard_index();
        let Some((cluster, mut state, offset)) = self.find_cluster(shard, order) else {
            self.fallbacks[order as usize].fetch_add(1, Relaxed);
            return None;
        };
        state.take_run(offset, order);
        self.after_alloc(shard, cluster, &mut state, order, offset + (1 << order));
        drop(state);
        self.shards[shard].used.fetch_add(1 << order, Relaxed);
        Some(cluster as u64 * SLOTS_PER_CLUSTER + u64::from(offset))
    }

    /// Allocates up to `max` single slots, appending them to `out`, taking each cluster lock once
    /// for all the slots it gives (`get_swap_pages` for a slot cache). Returns how many; fewer
    /// than `max` only when the map has no more free slots. Does not count fallbacks.
    pub fn alloc_batch(&self, max: usize, out: &mut Vec<u64>) -> usize {
        let shard = shard_index();
        let mut got = 0;
        while got < max {
            let Some((cluster, mut state, offset)) = self.find_cluster(shard, 0) else {
                break;
            };
            let base = cluster as u64 * SLOTS_PER_CLUSTER;
            got += state.take_free_slots(offset, max - got, base, out);
            let next = out.last().map_or(0, |&last| (last - base) as u32 + 1);
            self.after_alloc(shard, cluster, &mut state, 0, next);
        }
        self.shards[shard].used.fetch_add(got as u64, Relaxed);
        got
    }

    /// Frees the run of 2^order slots at `first` (a whole allocated run or an aligned part of
    /// one). Panics, changing nothing, if any of its slots is not allocated.
    pub fn free(&self, first: u64, order: u32) {
        let (cluster, offset) = locate(first, order, self.total_slots, "free");
        let mut state = self.lock(cluster);
        state.check_allocated(offset, order, cluster as u64 * SLOTS_PER_CLUSTER, "free");
        state.release_run(offset, order);
        self.after_free(cluster, &mut state);
        drop(state);
        self.shards[shard_index()].used.fetch_sub(1 << order, Relaxed);
    }

    /// Frees single slots, sorting `slots` and taking each cluster lock once
    /// (`swapcache_free_entries`). Every slot is checked before its cluster changes: a slot that
    /// is not allocated, or appears twice, panics and leaves that cluster and the later ones as
    /// they were (earlier clusters are already freed).
    pub fn free_batch(&self, slots: &mut [u64]) {
        slots.sort_unstable();
        let shard = &self.shards[shard_index()];
        for group in slots.chunk_by(|a, b| a / SLOTS_PER_CLUSTER == b / SLOTS_PER_CLUSTER) {
            let cluster = locate(group[0], 0, self.total_slots, "batched free").0;
            let base = cluster as u64 * SLOTS_PER_CLUSTER;
            if let Some(pair) = group.windows(2).find(|pair| pair[0] == pair[1]) {
                panic!("swap slot allocator: batched free: slot {} is freed twice in one batch", pair[0]);
            }
            let mut state = self.lock(cluster);
            for &slot in group {
                state.check_allocated((slot - base) as u32, 0, base, "batched free");
            }
            for &slot in group {
                state.release_run((slot - base) as u32, 0);
            }
            self.after_free(cluster, &mut state);
            drop(state);
            shard.used.fetch_sub(group.len() as u64, Relaxed);
        }
    }

    /// Marks an allocated run (or an aligned part of one) bad: it stays taken forever and counts
    /// as bad instead of used. Panics, changing nothing, if any slot is not allocated.
    pub fn mark_bad(&self, first: u64, order: u32) {
        let (cluster, offset) = locate(first, order, self.total_slots, "mark_bad");
        let mut state = self.lock(cluster);
        state.check_allocated(offset, order, cluster as u64 * SLOTS_PER_CLUSTER, "mark_bad");
        // The free count does not change, so the cluster stays on its list.
        state.mark_run_bad(offset, order);
        drop(state);
        self.shards[shard_index()].used.fetch_sub(1 << order, Relaxed);
        self.bad_slots.fetch_add(1 << order, Relaxed);
    }

    fn lock(&self, cluster: usize) -> MutexGuard<'_, ClusterState> {
        #[cfg(test)]
        self.cluster_locks.fetch_add(1, Relaxed);
        self.clusters[cluster].state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn sub_list(&self, list: usize, cluster: usize) -> &SubList {
        &self.lists[list * LIST_SHARDS + cluster % LIST_SHARDS]
    }

    /// Takes a cluster off `list` and returns it locked (the kernel's `isolate_lock_cluster`),
    /// preferring one no other thread has taken as its current cluster, looking at the heads of
    /// the sub-lists from the shard's own on. The caller must put it back with `move_cluster`
    /// before unlocking it. `None` when `list` is empty.
    ///
    /// A sub-list's lock is held while its clusters are `try_lock`ed (the usual lock order is the
    /// other way round, so blocking there could deadlock). If every candidate is busy, one is
    /// locked the ordinary way: its lock first, then its sub-list's, checking it is still there.
    fn pick_and_lock(&self, list: ClusterList, shard: usize) -> Option<(usize, MutexGuard<'_, ClusterState>)> {
        let base = list.index().expect("Full is no list") * LIST_SHARDS;
        loop {
            let mut busy = None;
            for unowned_only in [true, false] {
                for i in 0..LIST_SHARDS {
                    let sub = &self.lists[base + (shard + i) % LIST_SHARDS];
                    if sub.len.load(Relaxed) == 0 {
                        continue;
                    }
                    let mut queue = sub.queue.lock().unwrap_or_else(PoisonError::into_inner);
                    let mut found = None;
                    for cluster in queue.iter(&self.links).take(PICK_SCAN) {
                        if unowned_only && self.clusters[cluster].owner.load(Relaxed) != 0 {
                            continue;
                        }
                        match self.clusters[cluster].state.try_lock() {
                            Ok(state) => found = Some((cluster, state)),
                            Err(TryLockError::Poisoned(poisoned)) => found = Some((cluster, poisoned.into_inner())),
                            Err(TryLockError::WouldBlock) => busy = busy.or(Some(cluster)),
                        }
                        if found.is_some() {
                            break;
                        }
                    }
                    if let Some((cluster, mut state)) = found {
                        #[cfg(test)]
                        self.cluster_locks.fetch_add(1, Relaxed);
                        queue.remove(&self.links, cluster as u32);
                        sub.len.store(sub.len.load(Relaxed) - 1, Relaxed);
                        state.isolated = true;
                        return Some((cluster, state));
                    }
                }
            }
            let cluster = busy?;
            let mut state = self.lock(cluster);
            if state.list == list && !state.isolated {
                let sub = self.sub_list(list.index().expect("Full is no list"), cluster);
                sub.queue.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.links, cluster as u32);
                sub.len.store(sub.len.load(Relaxed) - 1, Relaxed);
                state.isolated = true;
                return Some((cluster, state));
            }
            // It moved while we waited for it: look again.
        }
    }

    /// Moves a cluster (locked by the caller) from its list, or from isolation, to the tail of
    /// `to`.
    fn move_cluster(&self, cluster: usize, state: &mut ClusterState, to: ClusterList) {
        let from = state.list;
        if from == to && !state.isolated {
            return;
        }
        if state.isolated {
            state.isolated = false;
        } else if let Some(list) = from.index() {
            let sub = self.sub_list(list, cluster);
            let mut queue = sub.queue.lock().unwrap_or_else(PoisonError::into_inner);
            queue.remove(&self.links, cluster as u32);
            sub.len.store(sub.len.load(Relaxed) - 1, Relaxed);
        }
        if let Some(list) = to.index() {
            let sub = self.sub_list(list, cluster);
            let mut queue = sub.queue.lock().unwrap_or_else(PoisonError::into_inner);
            queue.push_back(&self.links, cluster as u32);
            sub.len.store(sub.len.load(Relaxed) + 1, Relaxed);
        }
        state.list = to;
        if !matches!(to, ClusterList::NonFull(_)) {
            self.clusters[cluster].owner.store(0, Relaxed);
        }
    }

    /// Makes `cluster` the shard's current cluster for `order`, giving up the previous one.
    fn adopt(&self, shard: usize, cluster: usize, order: u32) {
        let me = shard as u32 + 1;
        let previous = self.shards[shard].next[order as usize].load(Relaxed);
        if previous != NO_HINT && (previous / SLOTS_PER_CLUSTER) as usize != cluster {
            let previous = (previous / SLOTS_PER_CLUSTER) as usize;
            let _ = self.clusters[previous].owner.compare_exchange(me, 0, Relaxed, Relaxed);
        }
        self.clusters[cluster].owner.store(me, Relaxed);
    }

    /// The search of the module comment: a locked cluster and the offset of a free aligned run
    /// of 2^order slots in it.
    fn find_cluster(&self, shard: usize, order: u32) -> Option<(usize, MutexGuard<'_, ClusterState>, u32)> {
        let o = order as u8;
        if order < MAX_ORDER {
            let hint = self.shards[shard].next[order as usize].load(Relaxed);
            if hint != NO_HINT {
                let cluster = (hint / SLOTS_PER_CLUSTER) as usize;
                let mut state = self.lock(cluster);
                if state.list == ClusterList::NonFull(o) {
                    if let Some(offset) = state.find_run(order, (hint % SLOTS_PER_CLUSTER) as u32) {
                        return Some((cluster, state, offset));
                    }
                    self.move_cluster(cluster, &mut state, ClusterList::Frag(o));
                }
            }
            while let Some((cluster, mut state)) = self.pick_and_lock(ClusterList::NonFull(o), shard) {
                match state.find_run(order, 0) {
                    Some(offset) => {
                        self.adopt(shard, cluster, order);
                        return Some((cluster, state, offset));
                    }
                    None => self.move_cluster(cluster, &mut state, ClusterList::Frag(o)),
                }
            }
        }
        if let Some((cluster, state)) = self.pick_and_lock(ClusterList::Free, shard) {
            self.adopt(shard, cluster, order);
            return Some((cluster, state, 0));
        }
        if order == 0 {
            for other in 1..=MAX_ORDER as u8 {
                for list in [ClusterList::Frag(other), ClusterList::NonFull(other)] {
                    if let Some((cluster, state)) = self.pick_and_lock(list, shard) {
                        let offset = state.find_run(0, 0).expect("a cluster on a list has a free slot");
                        return Some((cluster, state, offset));
                    }
                }
            }
        }
        None
    }

    /// After slots of `order` were taken from `cluster`: move the hint past them (in a cluster of
    /// that order: order 0 stealing from another order's cluster leaves the hint alone) and
    /// relist the cluster.
    fn after_alloc(&self, shard: usize, cluster: usize, state: &mut ClusterState, order: u32, next_offset: u32) {
        if state.list == ClusterList::Free {
            state.order = order as u8;
        }
        let to = state.list_after_alloc(order);
        if u32::from(state.order) == order {
            // A full cluster has nothing more to give: no need to lock it to find that out.
            let next = match to {
                ClusterList::Full => NO_HINT,
                _ => cluster as u64 * SLOTS_PER_CLUSTER + u64::from(next_offset % SPC),
            };
            self.shards[shard].next[order as usize].store(next, Relaxed);
        }
        self.move_cluster(cluster, state, to);
    }

    fn after_free(&self, cluster: usize, state: &mut ClusterState) {
        let to = state.list_after_free();
        self.move_cluster(cluster, state, to);
    }

    fn note_fallback(&self, order: u32) {
        self.fallbacks[order as usize].fetch_add(1, Relaxed);
    }

    /// Test support (quiescent map only): every cluster is on exactly the list its state names,
    /// in the sub-list of its number, and its state fits the list.
    #[cfg(test)]
    fn check_lists(&self) {
        let mut found_on = vec![None; self.clusters.len()];
        for (index, sub) in self.lists.iter().enumerate() {
            let members: Vec<usize> = sub.queue.lock().unwrap().iter(&self.links).collect();
            assert_eq!(members.len(), sub.len.load(Relaxed) as usize, "sub-list {index} length");
            for cluster in members {
                assert_eq!(found_on[cluster], None, "cluster {cluster} is on two lists");
                assert_eq!(cluster % LIST_SHARDS, index % LIST_SHARDS, "cluster {cluster} on a wrong sub-list");
                found_on[cluster] = Some(index / LIST_SHARDS);
            }
        }
        for (cluster, found_on) in found_on.into_iter().enumerate() {
            let state = self.lock(cluster);
            assert!(!state.isolated, "cluster {cluster} left isolated");
            assert_eq!(found_on, state.list.index(), "cluster {cluster} is not on the list it names");
            match state.list {
                ClusterList::Free => assert!(state.is_all_free()),
                ClusterList::Full => assert_eq!(state.free_count(), 0),
                ClusterList::NonFull(order) | ClusterList::Frag(order) => {
                    assert_eq!(state.order, order);
                    assert!(state.free_count() > 0 && !state.is_all_free());
                }
            }
            if let ClusterList::Frag(order) = state.list {
                assert_eq!(state.find_run(u32::from(order), 0), None, "Frag cluster {cluster} has a run");
            }
        }
    }
}

impl SlotAllocator for SwapMap {
    fn alloc(&self, order: u32) -> Option<u64> {
        SwapMap::alloc(self, order)
    }
    fn free(&self, first: u64, order: u32) {
        SwapMap::free(self, first, order)
    }
    fn mark_bad(&self, first: u64, order: u32) {
        SwapMap::mark_bad(self, first, order)
    }
    fn total_slots(&self) -> u64 {
        SwapMap::total_slots(self)
    }
    fn used_slots(&self) -> u64 {
        SwapMap::used_slots(self)
    }
    fn bad_slots(&self) -> u64 {
        SwapMap::bad_slots(self)
    }
    fn fallbacks(&self, order: u32) -> u64 {
        SwapMap::fallbacks(self, order)
    }
}

/// A thread's cache of order-0 slots (the kernel's per-CPU `swap_slots_cache`). Not shared: each
/// thread makes its own. Dropping it returns everything it holds to the map.
pub struct SlotCache {
    map: Arc<SwapMap>,
    /// Allocated from the map, not yet handed out; handed out from the end, in slot order.
    ready: Vec<u64>,
    /// Freed by the owner, not yet returned to the map (still allocated there).
    returned: Vec<u64>,
    batch: usize,
}

impl SlotCache {
    /// A cache that takes and returns `DEFAULT_CACHE_BATCH` slots at a time.
    pub fn new(map: Arc<SwapMap>) -> Self {
        Self::with_batch(map, DEFAULT_CACHE_BATCH)
    }

    /// A cache that takes and returns `batch` (≥ 1) slots at a time.
    pub fn with_batch(map: Arc<SwapMap>, batch: usize) -> Self {
        assert!(batch >= 1, "swap slot cache: the batch must be at least 1");
        SlotCache { map, ready: Vec::with_capacity(batch), returned: Vec::with_capacity(batch), batch }
    }

    pub fn map(&self) -> &Arc<SwapMap> {
        &self.map
    }

    /// Slots taken from the map and not yet handed out.
    pub fn ready_slots(&self) -> usize {
        self.ready.len()
    }

    /// Slots freed into the cache and not yet returned to the map.
    pub fn returned_slots(&self) -> usize {
        self.returned.len()
    }

    /// One slot: from the cache, refilled with a batch from the map when empty. `None` (counted
    /// as an order-0 fallback) when the map has no free slot even after this cache returned its
    /// own pending frees; other caches may still hold some.
    pub fn alloc(&mut self) -> Option<u64> {
        if self.ready.is_empty() {
            self.refill();
        }
        let slot = self.ready.pop();
        if slot.is_none() {
            self.map.note_fallback(0);
        }
        slot
    }

    /// Frees one slot into the cache; the cache returns a full batch to the map at once.
    /// Panics if the slot is one the cache has not handed out yet; a slot freed twice panics
    /// when its batch reaches the map (at once in debug builds).
    pub fn free(&mut self, slot: u64) {
        // `ready` is sorted in descending order (see `refill`).
        assert!(
            self.ready.binary_search_by(|probe| slot.cmp(probe)).is_err(),
            "swap slot cache: free of slot {slot}, which was never handed out"
        );
        debug_assert!(!self.returned.contains(&slot), "swap slot cache: slot {slot} freed twice");
        self.returned.push(slot);
        if self.returned.len() >= self.batch {
            self.return_pending();
        }
    }

    /// A run of 2^order slots: order 0 through the cache, larger orders from the map directly.
    pub fn alloc_run(&mut self, order: u32) -> Option<u64> {
        if order == 0 {
            self.alloc()
        } else {
            self.map.alloc(order)
        }
    }

    /// Frees what `alloc_run(order)` returned.
    pub fn free_run(&mut self, first: u64, order: u32) {
        if order == 0 {
            self.free(first)
        } else {
            self.map.free(first, order)
        }
    }

    /// Returns every slot the cache holds (ready and freed) to the map.
    pub fn drain(&mut self) {
        self.return_pending();
        self.map.free_batch(&mut self.ready);
        self.ready.clear();
    }

    fn refill(&mut self) {
        if self.map.alloc_batch(self.batch, &mut self.ready) == 0 && !self.returned.is_empty() {
            self.return_pending();
            self.map.alloc_batch(self.batch, &mut self.ready);
        }
        // Hand them out in ascending order (neighbouring folios get neighbouring slots), popping
        // from the end; `free` relies on the order too.
        self.ready.sort_unstable_by(|a, b| b.cmp(a));
    }

    fn return_pending(&mut self) {
        self.map.free_batch(&mut self.returned);
        self.returned.clear();
    }
}

impl Drop for SlotCache {
    fn drop(&mut self) {
        // While unwinding (perhaps from a misuse panic in this very cache) the slots are leaked
        // rather than risk a second panic.
        if !std::thread::panicking() {
            self.drain();
        }
    }
}

/// Seed 003's "before", for benchmarks: `SwapMap`'s clusters, lists and search order under one
/// mutex, one current cluster per order shared by all threads, and no slot caches.
pub struct GlobalLockMap {
    state: Mutex<GlobalLockState>,
    total_slots: u64,
    fallbacks: [AtomicU64; NR_ORDERS],
}

struct GlobalLockState {
    clusters: Vec<ClusterState>,
    lists: Vec<ClusterQueue>,
    links: Box<[Link]>,
    /// Per order: the slot to try next, or `NO_HINT`.
    next: [u64; NR_ORDERS],
    used: u64,
    bad: u64,
}

impl GlobalLockState {
    fn move_cluster(&mut self, cluster: usize, to: ClusterList) {
        let from = self.clusters[cluster].list;
        if from == to {
            return;
        }
        if let Some(index) = from.index() {
            self.lists[index].remove(&self.links, cluster as u32);
        }
        if let Some(index) = to.index() {
            self.lists[index].push_back(&self.links, cluster as u32);
        }
        self.clusters[cluster].list = to;
    }

    fn front(&self, list: ClusterList) -> Option<usize> {
        self.lists[list.index().expect("Full is no list")].front()
    }

    /// `SwapMap::find_cluster` without the locking.
    fn find_cluster(&mut self, order: u32) -> Option<(usize, u32)> {
        let o = order as u8;
        if order < MAX_ORDER {
            let hint = self.next[order as usize];
            if hint != NO_HINT {
                let cluster = (hint / SLOTS_PER_CLUSTER) as usize;
                if self.clusters[cluster].list == ClusterList::NonFull(o) {
                    if let Some(offset) = self.clusters[cluster].find_run(order, (hint % SLOTS_PER_CLUSTER) as u32) {
                        return Some((cluster, offset));
                    }
                    self.move_cluster(cluster, ClusterList::Frag(o));
                }
            }
            while let Some(cluster) = self.front(ClusterList::NonFull(o)) {
                match self.clusters[cluster].find_run(order, 0) {
                    Some(offset) => return Some((cluster, offset)),
                    None => self.move_cluster(cluster, ClusterList::Frag(o)),
                }
            }
        }
        if let Some(cluster) = self.front(ClusterList::Free) {
            return Some((cluster, 0));
        }
        if order == 0 {
            for other in 1..=MAX_ORDER as u8 {
                for list in [ClusterList::Frag(other), ClusterList::NonFull(other)] {
                    if let Some(cluster) = self.front(list) {
                        return Some((cluster, self.clusters[cluster].find_run(0, 0).expect("a cluster on a list has a free slot")));
                    }
                }
            }
        }
        None
    }
}

impl GlobalLockMap {
    /// A map of `total_slots / 512` whole clusters, all free.
    pub fn new(total_slots: u64) -> Self {
        let clusters = cluster_count(total_slots);
        let links = new_links(clusters);
        let mut lists = vec![ClusterQueue::EMPTY; ClusterList::COUNT];
        lists[0] = ClusterQueue::of(&links, 0..clusters as u32);
        GlobalLockMap {
            state: Mutex::new(GlobalLockState {
                clusters: vec![ClusterState::EMPTY; clusters],
                lists,
                links,
                next: [NO_HINT; NR_ORDERS],
                used: 0,
                bad: 0,
            }),
            total_slots: clusters as u64 * SLOTS_PER_CLUSTER,
            fallbacks: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, GlobalLockState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl SlotAllocator for GlobalLockMap {
    fn alloc(&self, order: u32) -> Option<u64> {
        check_order(order);
        let mut g = self.lock();
        let Some((cluster, offset)) = g.find_cluster(order) else {
            drop(g);
            self.fallbacks[order as usize].fetch_add(1, Relaxed);
            return None;
        };
        let state = &mut g.clusters[cluster];
        state.take_run(offset, order);
        if state.list == ClusterList::Free {
            state.order = order as u8;
        }
        let same_order = u32::from(state.order) == order;
        let to = state.list_after_alloc(order);
        if same_order {
            let next_offset = (offset + (1 << order)) % SPC;
            g.next[order as usize] = match to {
                ClusterList::Full => NO_HINT,
                _ => cluster as u64 * SLOTS_PER_CLUSTER + u64::from(next_offset),
            };
        }
        g.move_cluster(cluster, to);
        g.used += 1 << order;
        Some(cluster as u64 * SLOTS_PER_CLUSTER + u64::from(offset))
    }

    fn free(&self, first: u64, order: u32) {
        let (cluster, offset) = locate(first, order, self.total_slots, "free");
        let mut g = self.lock();
        let state = &mut g.clusters[cluster];
        state.check_allocated(offset, order, cluster as u64 * SLOTS_PER_CLUSTER, "free");
        state.release_run(offset, order);
        let to = state.list_after_free();
        g.move_cluster(cluster, to);
        g.used -= 1 << order;
    }

    fn mark_bad(&self, first: u64, order: u32) {
        let (cluster, offset) = locate(first, order, self.total_slots, "mark_bad");
        let mut g = self.lock();
        let state = &mut g.clusters[cluster];
        state.check_allocated(offset, order, cluster as u64 * SLOTS_PER_CLUSTER, "mark_bad");
        state.mark_run_bad(offset, order);
        g.used -= 1 << order;
        g.bad += 1 << order;
    }

    fn total_slots(&self) -> u64 {
        self.total_slots
    }

    fn used_slots(&self) -> u64 {
        self.lock().used
    }

    fn bad_slots(&self) -> u64 {
        self.lock().bad
    }

    fn fallbacks(&self, order: u32) -> u64 {
        check_order(order);
        self.fallbacks[order as usize].load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::sync::atomic::AtomicU8;
    use std::sync::Barrier;

    const CLUSTER: usize = SLOTS_PER_CLUSTER as usize;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Slot {
        Free,
        Used,
        Bad,
    }

    /// What an allocator must be doing, slot by slot, and the runs the test holds.
    struct Model {
        slots: Vec<Slot>,
        /// The order of each cluster that is not entirely free.
        order: Vec<Option<u32>>,
        held: Vec<(u64, u32)>,
    }

    impl Model {
        fn new(total_slots: u64) -> Self {
            let clusters = total_slots as usize / CLUSTER;
            Model { slots: vec![Slot::Free; clusters * CLUSTER], order: vec![None; clusters], held: Vec::new() }
        }

        fn cluster(&self, c: usize) -> &[Slot] {
            &self.slots[c * CLUSTER..(c + 1) * CLUSTER]
        }

        fn count(&self, kind: Slot) -> u64 {
            self.slots.iter().filter(|&&s| s == kind).count() as u64
        }

        fn has_run(&self, c: usize, order: u32) -> bool {
            self.cluster(c).chunks_exact(1 << order).any(|run| run.iter().all(|&s| s == Slot::Free))
        }

        fn free_cluster_exists(&self) -> bool {
            (0..self.order.len()).any(|c| self.order[c].is_none())
        }

        /// A cluster of `order` (partly used or with bad slots) with a free aligned run of it.
        fn own_order_run_exists(&self, order: u32) -> bool {
            (0..self.order.len()).any(|c| self.order[c] == Some(order) && self.has_run(c, order))
        }

        /// Checks a run the allocator handed out against the search order, then records it.
        fn record_alloc(&mut self, first: u64, order: u32) {
            let len = 1usize << order;
            let first = first as usize;
            assert_eq!(first % len, 0, "run at {first} of order {order} is not aligned");
            assert!(first + len <= self.slots.len(), "run at {first} is past the end");
            assert!(self.slots[first..first + len].iter().all(|&s| s == Slot::Free), "run at {first} (order {order}) overlaps taken slots");
            let c = first / CLUSTER;
            match self.order[c] {
                None => {
                    assert!(!self.own_order_run_exists(order), "order {order} took free cluster {c} while a cluster of its order had room");
                    self.order[c] = Some(order);
                }
                Some(o) if o == order => {}
                Some(o) => {
                    assert_eq!(order, 0, "an order-{order} run came from cluster {c} of order {o}");
                    assert!(
                        !self.free_cluster_exists() && !self.own_order_run_exists(0),
                        "order 0 stole from cluster {c} of order {o} while a free or order-0 cluster had room"
                    );
                }
            }
            self.slots[first..first + len].fill(Slot::Used);
            self.held.push((first as u64, order));
        }

        /// `None` is allowed only when nothing the search may use has room.
        fn check_none(&self, order: u32) {
            if order == 0 {
                assert_eq!(self.count(Slot::Free), 0, "order 0 failed with free slots left");
            } else {
                assert!(!self.free_cluster_exists(), "order {order} failed with a free cluster left");
                assert!(!self.own_order_run_exists(order), "order {order} failed with a run left in a cluster of its order");
            }
        }

        fn release(&mut self, first: u64, order: u32, to: Slot) {
            let first = first as usize;
            self.slots[first..first + (1 << order)].fill(to);
            let c = first / CLUSTER;
            if self.cluster(c).iter().all(|&s| s == Slot::Free) {
                self.order[c] = None;
            }
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Alloc {
            order: u32,
            count: usize,
        },
        Free(usize),
        /// The engine split a held folio: its halves are freed separately from now on.
        Split(usize),
        MarkBad(usize),
        /// Free every other held run.
        FreeHalf,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (prop::sample::select(vec![0u32, 0, 1, 2, 3, 4, 5, 6, 9]), 1usize..40)
                .prop_map(|(order, count)| Op::Alloc { order, count }),
            6 => any::<usize>().prop_map(Op::Free),
            2 => any::<usize>().prop_map(Op::Split),
            1 => Just(Op::FreeHalf),
            1 => any::<usize>().prop_map(Op::MarkBad),
        ]
    }

    fn check_counts(map: &dyn SlotAllocator, model: &Model) {
        assert_eq!(map.used_slots(), model.count(Slot::Used));
        assert_eq!(map.bad_slots(), model.count(Slot::Bad));
        assert_eq!(map.free_slots(), model.count(Slot::Free));
        assert_eq!(map.free_slots() + map.used_slots() + map.bad_slots(), map.total_slots());
    }

    /// Replays `ops` on `map` and its model. Checked after each step: no slot handed out twice,
    /// runs aligned and inside the map (hence inside one cluster), a free cluster taken only when
    /// no cluster of the order has an aligned free run, other orders' clusters used only by order
    /// 0 and only when no free cluster and no order-0 cluster has a free slot, `None` for order
    /// k > 0 only when there is no free cluster and no free aligned run in any order-k cluster,
    /// for order 0 only when no slot is free, and used/bad/free counts equal to the model's.
    /// At the end, everything held is freed: the map must be all free except bad slots, and
    /// order 9 must then succeed once for every cluster without bad slots and fail after.
    fn run_against_model(map: &dyn SlotAllocator, ops: &[Op], check_lists: &dyn Fn()) {
        let mut model = Model::new(map.total_slots());
        for op in ops {
            match *op {
                Op::Alloc { order, count } => {
                    for _ in 0..count {
                        match map.alloc(order) {
                            Some(first) => model.record_alloc(first, order),
                            None => {
                                model.check_none(order);
                                break;
                            }
                        }
                    }
                }
                Op::Free(i) if !model.held.is_empty() => {
                    let (first, order) = model.held.swap_remove(i % model.held.len());
                    map.free(first, order);
                    model.release(first, order, Slot::Free);
                }
                Op::Split(i) if !model.held.is_empty() => {
                    let i = i % model.held.len();
                    let (first, order) = model.held[i];
                    if order > 0 {
                        model.held[i] = (first, order - 1);
                        model.held.push((first + (1 << (order - 1)), order - 1));
                    }
                }
                Op::MarkBad(i) if !model.held.is_empty() => {
                    let (first, order) = model.held.swap_remove(i % model.held.len());
                    map.mark_bad(first, order);
                    model.release(first, order, Slot::Bad);
                }
                Op::FreeHalf => {
                    let held = std::mem::take(&mut model.held);
                    for (n, (first, order)) in held.into_iter().enumerate() {
                        if n % 2 == 0 {
                            map.free(first, order);
                            model.release(first, order, Slot::Free);
                        } else {
                            model.held.push((first, order));
                        }
                    }
                }
                _ => {}
            }
            check_counts(map, &model);
            check_lists();
        }
        for (first, order) in std::mem::take(&mut model.held) {
            map.free(first, order);
            model.release(first, order, Slot::Free);
        }
        check_counts(map, &model);
        assert_eq!(map.used_slots(), 0);
        let clean = (0..model.order.len()).filter(|&c| model.order[c].is_none()).count();
        for _ in 0..clean {
            let first = map.alloc(MAX_ORDER).expect("order 9 fails although a cluster is entirely free");
            model.record_alloc(first, MAX_ORDER);
        }
        assert_eq!(map.alloc(MAX_ORDER), None);
        assert_eq!(map.used_slots(), clean as u64 * SLOTS_PER_CLUSTER);
        check_lists();
    }

    fn map_slots() -> impl Strategy<Value = u64> {
        (4u64..=10, 0u64..SLOTS_PER_CLUSTER).prop_map(|(clusters, extra)| clusters * SLOTS_PER_CLUSTER + extra)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]
        #[test]
        fn swap_map_matches_model(total in map_slots(), ops in prop::collection::vec(op(), 1..200)) {
            let map = SwapMap::new(total);
            prop_assert_eq!(map.total_slots(), total / SLOTS_PER_CLUSTER * SLOTS_PER_CLUSTER);
            run_against_model(&map, &ops, &|| map.check_lists());
        }

        #[test]
        fn global_lock_map_matches_model(total in map_slots(), ops in prop::collection::vec(op(), 1..200)) {
            run_against_model(&GlobalLockMap::new(total), &ops, &|| ());
        }
    }

    #[test]
    fn the_table_is_made_a_chunk_at_a_time_as_clusters_are_used() {
        // Nine chunks, the last one partial.
        let clusters = 8 * CLUSTERS_PER_CHUNK + 5;
        let map = SwapMap::new(clusters as u64 * SLOTS_PER_CLUSTER);
        assert_eq!(map.clusters.chunks_allocated(), 0, "no chunk before a slot is taken");
        let page = map.alloc(0).unwrap();
        assert_eq!(map.clusters.chunks_allocated(), 1, "the first slot makes one chunk");
        // Every other cluster whole: all chunks exist and act as one table.
        let mut wholes: Vec<u64> = (1..clusters).map(|_| map.alloc(9).unwrap()).collect();
        assert_eq!(map.alloc(9), None);
        assert_eq!(map.clusters.chunks_allocated(), 9);
        wholes.push(page / SLOTS_PER_CLUSTER * SLOTS_PER_CLUSTER);
        wholes.sort_unstable();
        assert_eq!(wholes, (0..clusters as u64).map(|c| c * SLOTS_PER_CLUSTER).collect::<Vec<_>>());
        map.check_lists();
        map.free(page, 0);
        for &first in &wholes[..] {
            if first != page / SLOTS_PER_CLUSTER * SLOTS_PER_CLUSTER {
                map.free(first, 9);
            }
        }
        assert_eq!((map.used_slots(), map.free_slots()), (0, clusters as u64 * SLOTS_PER_CLUSTER));
        map.check_lists();
        assert_eq!(map.alloc(9).map(|first| first % SLOTS_PER_CLUSTER), Some(0), "freed clusters serve again");
    }

    #[test]
    fn order_9_takes_whole_free_clusters() {
        let map = SwapMap::new(4 * SLOTS_PER_CLUSTER + 100);
        let mut firsts: Vec<u64> = (0..4).map(|_| map.alloc(9).unwrap()).collect();
        firsts.sort_unstable();
        assert_eq!(firsts, [0, 512, 1024, 1536]);
        assert_eq!(map.alloc(9), None);
        assert_eq!(map.alloc(0), None);
        assert_eq!((map.fallbacks(9), map.fallbacks(0)), (1, 1));
        map.free(512, 9);
        assert_eq!(map.alloc(9), Some(512));
    }

    #[test]
    fn order_0_steals_from_other_orders_and_large_orders_fall_back() {
        let map = SwapMap::new(2 * SLOTS_PER_CLUSTER);
        let order4: Vec<u64> = (0..32).map(|_| map.alloc(4).unwrap()).collect();
        let order3: Vec<u64> = (0..64).map(|_| map.alloc(3).unwrap()).collect();
        let cluster_of = |slot: &u64| slot / SLOTS_PER_CLUSTER;
        let (c4, c3) = (cluster_of(&order4[0]), cluster_of(&order3[0]));
        assert_ne!(c4, c3, "each order fills a cluster of its own");
        assert!(order4.iter().all(|s| cluster_of(s) == c4) && order3.iter().all(|s| cluster_of(s) == c3));
        map.free(order4[5], 4);
        // No free cluster, no order-0 cluster: order 0 takes a slot of the order-4 hole...
        let stolen = map.alloc(0).unwrap();
        assert!((order4[5]..order4[5] + 16).contains(&stolen));
        // ...which leaves no aligned 16-slot run anywhere, and order 3 never uses order-4 clusters.
        assert_eq!(map.alloc(4), None);
        assert_eq!(map.alloc(3), None);
        assert_eq!((map.fallbacks(4), map.fallbacks(3)), (1, 1));
        assert_eq!(map.used_slots(), 1024 - 15);
    }

    #[test]
    fn an_emptied_cluster_serves_any_order_again() {
        let map = SwapMap::new(SLOTS_PER_CLUSTER);
        let runs: Vec<u64> = (0..8).map(|_| map.alloc(6).unwrap()).collect();
        assert_eq!(map.alloc(2), None);
        for &first in &runs {
            map.free(first, 6);
        }
        assert_eq!(map.alloc(2), Some(0));
        map.free(0, 2);
        assert_eq!(map.alloc(9), Some(0));
    }

    #[test]
    fn bad_slots_are_never_handed_out_again() {
        let map = SwapMap::new(SLOTS_PER_CLUSTER);
        let first = map.alloc(4).unwrap();
        map.mark_bad(first, 4);
        assert_eq!((map.used_slots(), map.bad_slots(), map.free_slots()), (0, 16, 496));
        let mut rest = Vec::new();
        while let Some(slot) = map.alloc(0) {
            rest.push(slot);
        }
        assert_eq!(rest.len(), 496);
        assert!(rest.iter().all(|&s| !(first..first + 16).contains(&s)));
    }

    #[test]
    fn misuse_panics_and_changes_nothing() {
        let map = SwapMap::new(2 * SLOTS_PER_CLUSTER);
        let first = map.alloc(3).unwrap();
        map.free(first, 3);
        let cases: [(&dyn Fn(), &str); 5] = [
            (&|| map.free(first, 3), "freed twice"),
            (&|| map.free(700, 0), "never handed out"),
            (&|| map.free(first + 1, 1), "not aligned"),
            (&|| map.free(1024, 0), "past the end"),
            (&|| map.mark_bad(first, 0), "not allocated"),
        ];
        for (call, expected) in cases {
            let err = catch_unwind(AssertUnwindSafe(call)).expect_err("misuse must panic");
            let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
            assert!(msg.contains(expected), "panic message {msg:?} lacks {expected:?}");
            assert_eq!(map.used_slots(), 0);
        }
        let bad = map.alloc(0).unwrap();
        map.mark_bad(bad, 0);
        let err = catch_unwind(AssertUnwindSafe(|| map.free(bad, 0))).expect_err("free of a bad slot must panic");
        assert!(err.downcast_ref::<String>().unwrap().contains("marked bad"));
        // The map still works after the panics (the poisoned cluster lock is taken over).
        assert!(map.alloc(9).is_some());
        assert_eq!((map.used_slots(), map.bad_slots()), (512, 1));
    }

    #[test]
    fn slot_cache_takes_and_returns_batches() {
        let map = Arc::new(SwapMap::new(4 * SLOTS_PER_CLUSTER));
        let mut cache = SlotCache::new(map.clone());
        let locks = || map.cluster_locks.load(Relaxed);
        let before = locks();
        let mut slots = vec![cache.alloc().unwrap()];
        assert_eq!((map.used_slots(), cache.ready_slots()), (64, 63));
        assert_eq!(locks() - before, 1, "a refill within one cluster takes its lock once");
        let before = locks();
        slots.extend((0..63).map(|_| cache.alloc().unwrap()));
        assert_eq!((locks() - before, map.used_slots()), (0, 64), "no lock while the cache has slots");
        slots.push(cache.alloc().unwrap());
        assert_eq!((map.used_slots(), locks() - before), (128, 1));
        let base = slots[0];
        assert_eq!(base % SLOTS_PER_CLUSTER, 0, "a fresh cluster is filled from its start");
        assert_eq!(slots, (base..base + 65).collect::<Vec<u64>>(), "handed out in slot order");

        let before = locks();
        for &slot in &slots[..63] {
            cache.free(slot);
        }
        assert_eq!((map.used_slots(), cache.returned_slots(), locks() - before), (128, 63, 0), "frees are lazy");
        cache.free(slots[63]);
        assert_eq!((map.used_slots(), cache.returned_slots(), locks() - before), (64, 0, 1), "a full batch goes back at once");
        cache.free(slots[64]);
        cache.drain();
        assert_eq!((map.used_slots(), cache.ready_slots(), cache.returned_slots()), (0, 0, 0));
        assert_eq!(map.free_slots(), map.total_slots());
        assert!((0..4).all(|_| map.alloc(9).is_some()), "nothing lost: every cluster is whole again");
    }

    #[test]
    fn a_slot_freed_into_a_cache_is_not_reused_until_returned() {
        let map = Arc::new(SwapMap::new(SLOTS_PER_CLUSTER));
        let mut cache = SlotCache::with_batch(map.clone(), 8);
        let slot = cache.alloc().unwrap();
        cache.free(slot);
        let mut others = Vec::new();
        while let Some(s) = map.alloc(0) {
            others.push(s);
        }
        assert_eq!(others.len(), 512 - 8, "the cache holds 7 ready slots and 1 pending free");
        assert!(!others.contains(&slot));
        cache.drain();
        let mut back = Vec::new();
        while let Some(s) = map.alloc(0) {
            back.push(s);
        }
        assert_eq!(back.len(), 8);
        assert!(back.contains(&slot));
    }

    #[test]
    fn a_cache_returns_its_own_pending_frees_before_failing() {
        let map = Arc::new(SwapMap::new(SLOTS_PER_CLUSTER));
        let mut cache = SlotCache::new(map.clone());
        let all: Vec<u64> = (0..512).map(|_| cache.alloc().unwrap()).collect();
        for &slot in &all[..10] {
            cache.free(slot);
        }
        assert_eq!(map.free_slots(), 0, "pending frees still count as used");
        let again: Vec<u64> = (0..10).map(|_| cache.alloc().unwrap()).collect();
        assert_eq!(again, all[..10]);
        assert_eq!(cache.alloc(), None);
        assert_eq!(map.fallbacks(0), 1);
    }

    #[test]
    fn dropping_a_cache_returns_everything() {
        let map = Arc::new(SwapMap::new(SLOTS_PER_CLUSTER));
        {
            let mut cache = SlotCache::new(map.clone());
            let a = cache.alloc().unwrap();
            cache.alloc().unwrap();
            cache.free(a);
            assert_eq!(map.used_slots(), 64);
        }
        assert_eq!(map.used_slots(), 1, "the slot still handed out stays allocated");
    }

    #[test]
    #[should_panic(expected = "never handed out")]
    fn freeing_a_slot_the_cache_has_not_handed_out_panics() {
        let map = Arc::new(SwapMap::new(SLOTS_PER_CLUSTER));
        let mut cache = SlotCache::new(map);
        let slot = cache.alloc().unwrap();
        cache.free(slot + 1);
    }

    #[test]
    #[should_panic(expected = "freed twice")]
    fn double_free_into_a_cache_panics() {
        let map = Arc::new(SwapMap::new(SLOTS_PER_CLUSTER));
        let mut cache = SlotCache::new(map);
        let slot = cache.alloc().unwrap();
        cache.free(slot);
        cache.free(slot);
    }

    /// xorshift64*: a deterministic sequence per thread.
    fn next_random(state: &mut u64) -> u64 {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Four threads, each with its own cache, allocate and free runs of several orders in a
    /// fixed per-thread sequence; every slot a thread holds is claimed in a shared ownership
    /// array with compare_exchange, so a slot handed to two threads at once fails the test,
    /// whatever the interleaving. At the end everything is back and counts add up.
    #[test]
    fn threads_never_share_a_slot() {
        const THREADS: usize = 4;
        const OPS: usize = 20_000;
        const ORDERS: [u32; 8] = [0, 0, 0, 0, 2, 4, 6, 9];
        let map = Arc::new(SwapMap::new(16 * SLOTS_PER_CLUSTER));
        let owner: Arc<Vec<AtomicU8>> = Arc::new((0..map.total_slots()).map(|_| AtomicU8::new(0)).collect());
        let start = Arc::new(Barrier::new(THREADS));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (map, owner, start) = (map.clone(), owner.clone(), start.clone());
                std::thread::spawn(move || {
                    let me = t as u8 + 1;
                    let claim = |first: u64, order: u32, from: u8, to: u8| {
                        for slot in first..first + (1 << order) {
                            let prev = owner[slot as usize].compare_exchange(from, to, Relaxed, Relaxed);
                            assert!(prev.is_ok(), "thread {t}: slot {slot} (order {order}) found owned by {:?}", prev);
                        }
                    };
                    let mut cache = SlotCache::new(map.clone());
                    let mut held: Vec<(u64, u32)> = Vec::new();
                    let mut rng = 0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1);
                    let mut failures = 0u64;
                    start.wait();
                    for _ in 0..OPS {
                        let r = next_random(&mut rng);
                        if held.len() < 24 && !r.is_multiple_of(3) {
                            let order = ORDERS[(r >> 8) as usize % ORDERS.len()];
                            match cache.alloc_run(order) {
                                Some(first) => {
                                    claim(first, order, 0, me);
                                    held.push((first, order));
                                }
                                None => failures += 1,
                            }
                        } else if !held.is_empty() {
                            let (first, order) = held.swap_remove((r >> 8) as usize % held.len());
                            claim(first, order, me, 0);
                            cache.free_run(first, order);
                        }
                    }
                    for (first, order) in held {
                        claim(first, order, me, 0);
                        cache.free_run(first, order);
                    }
                    failures
                })
            })
            .collect();
        let failures: u64 = handles.into_iter().map(|h| h.join().expect("worker panicked")).sum();
        assert_eq!(map.used_slots(), 0, "caches are dropped, so everything is back");
        assert_eq!(map.free_slots(), map.total_slots());
        assert!(owner.iter().all(|o| o.load(Relaxed) == 0));
        let fallbacks: u64 = (0..=MAX_ORDER).map(|o| map.fallbacks(o)).sum();
        assert_eq!(fallbacks, failures);
        map.check_lists();
        let mut whole: Vec<u64> = (0..16).map(|_| map.alloc(9).expect("every cluster is whole again")).collect();
        whole.sort_unstable();
        assert_eq!(whole, (0..16).map(|c| c * SLOTS_PER_CLUSTER).collect::<Vec<_>>());
    }
}
