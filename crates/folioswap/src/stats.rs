//! Counters under the kernel's names, per folio size where the kernel keeps them per size
//! (`/sys/kernel/mm/transparent_hugepage/hugepages-<size>kB/stats/*`), and fault-service
//! latency histograms.
//!
//! Counters are relaxed atomics bumped next to the state transition they describe; a
//! snapshot ([`Stats`]) is a consistent-enough copy for reporting, serialisable to JSON.
//! Page counters (`pswpin`, `zswpout`, …) count 4 KiB pages as /proc/vmstat does; per-size
//! counters count folios of that size, as the mTHP stats do.

use crate::size::FolioSize;
use crate::stages::{StageStat, StageTimes};
pub use crate::swapfile::io::SwapIoStats;
use crate::uffd::{InstallMode, UffdMode};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    #[inline]
    pub fn inc(&self) {
        self.add(1)
    }
    /// Undo an `add` made ahead of an action that then failed (counted first so that
    /// no reader sees the action's effect before its count).
    #[inline]
    pub fn take_back(&self, n: u64) {
        self.0.fetch_sub(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Log-linear histogram of nanoseconds: 16 buckets per power of two (≤ 6.25% error),
/// lock-free to record.
pub(crate) struct Histogram {
    buckets: Box<[AtomicU64]>,
    sum_ns: AtomicU64,
    max_ns: AtomicU64,
}

const SUB_BITS: u32 = 4;
const SUB: u64 = 1 << SUB_BITS;
const BUCKETS: usize = ((64 - SUB_BITS as usize) + 1) * SUB as usize;

fn bucket_of(ns: u64) -> usize {
    if ns < SUB {
        return ns as usize;
    }
    let exp = 63 - ns.leading_zeros();
    let mantissa = (ns >> (exp - SUB_BITS)) & (SUB - 1);
    ((exp - SUB_BITS + 1) as u64 * SUB + mantissa) as usize
}

/// The midpoint of a bucket's range, in ns.
fn bucket_value(bucket: usize) -> u64 {
    let b = bucket as u64;
    if b < SUB {
        return b;
    }
    let exp = (b / SUB) as u32 + SUB_BITS - 1;
    let mantissa = b % SUB;
    let low = (1u64 << exp) | (mantissa << (exp - SUB_BITS));
    low + (1u64 << (exp - SUB_BITS)) / 2
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram { buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(), sum_ns: AtomicU64::new(0), max_ns: AtomicU64::new(0) }
    }
}

impl Histogram {
    pub fn record(&self, ns: u64) {
        self.buckets[bucket_of(ns)].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
        self.max_ns.fetch_max(ns, Ordering::Relaxed);
    }

    pub fn merge_into(&self, counts: &mut [u64], sum: &mut u64, max: &mut u64) {
        for (c, b) in counts.iter_mut().zip(self.buckets.iter()) {
            *c += b.load(Ordering::Relaxed);
        }
        *sum += self.sum_ns.load(Ordering::Relaxed);
        *max = (*max).max(self.max_ns.load(Ordering::Relaxed));
    }

    pub fn summary(&self) -> Option<Latency> {
        let mut counts = vec![0u64; BUCKETS];
        let (mut sum, mut max) = (0, 0);
        self.merge_into(&mut counts, &mut sum, &mut max);
        Latency::from_counts(&counts, sum, max)
    }
}

/// Percentiles of one histogram, in microseconds.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Latency {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    #[serde(rename = "p99.9_us")]
    pub p999_us: f64,
    pub max_us: f64,
}

impl Latency {
    pub(crate) fn from_counts(counts: &[u64], sum_ns: u64, max_ns: u64) -> Option<Latency> {
        let count: u64 = counts.iter().sum();
        if count == 0 {
            return None;
        }
        let pct = |p: f64| {
            let rank = ((p * count as f64).ceil() as u64).clamp(1, count);
            let mut seen = 0;
            for (i, &c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    return (bucket_value(i).min(max_ns)) as f64 / 1000.0;
                }
            }
            max_ns as f64 / 1000.0
        };
        Some(Latency {
            count,
            mean_us: sum_ns as f64 / count as f64 / 1000.0,
            p50_us: pct(0.50),
            p90_us: pct(0.90),
            p99_us: pct(0.99),
            p999_us: pct(0.999),
            max_us: max_ns as f64 / 1000.0,
        })
    }
}

/// Where libfolioswap.so's processes answer `folioswap stat`: the abstract unix socket
/// `folioswap-stat/<run>/<pid>`, `run` being the pid of the `folioswap run` that started
/// the process (`FOLIOSWAP_RUN`), 0 outside one.
pub const STAT_SOCKET_PREFIX: &str = "folioswap-stat/";

/// Every fault's service time so far, all folio sizes together, as a histogram that can be
/// subtracted (one interval's faults) and merged (several processes'): what
/// `folioswap stat` needs, since percentiles themselves do neither.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LatencyHistogram {
    /// `(bucket, count)` of the non-empty buckets, in bucket order.
    pub buckets: Vec<(u32, u64)>,
    pub sum_ns: u64,
    pub max_ns: u64,
}

impl LatencyHistogram {
    fn from_counts(counts: &[u64], sum_ns: u64, max_ns: u64) -> LatencyHistogram {
        let buckets = counts.iter().enumerate().filter(|(_, &c)| c > 0).map(|(i, &c)| (i as u32, c)).collect();
        LatencyHistogram { buckets, sum_ns, max_ns }
    }

    fn counts(&self) -> Vec<u64> {
        let mut counts = vec![0u64; BUCKETS];
        for &(b, c) in &self.buckets {
            if let Some(slot) = counts.get_mut(b as usize) {
                *slot += c;
            }
        }
        counts
    }

    /// The faults recorded since `earlier` (a snapshot of the same engine). The maximum of
    /// the interval is not kept by the engine: it is bounded by the highest bucket that
    /// grew.
    pub fn since(&self, earlier: &LatencyHistogram) -> LatencyHistogram {
        let before = earlier.counts();
        let counts: Vec<u64> = self.counts().iter().zip(&before).map(|(now, then)| now.saturating_sub(*then)).collect();
        let top = counts.iter().rposition(|&c| c > 0);
        let max_ns = top.map_or(0, |b| bucket_value(b).min(self.max_ns));
        LatencyHistogram::from_counts(&counts, self.sum_ns.saturating_sub(earlier.sum_ns), max_ns)
    }

    /// Add another engine's faults to these.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        let mut counts = self.counts();
        for (c, o) in counts.iter_mut().zip(other.counts()) {
            *c += o;
        }
        *self = LatencyHistogram::from_counts(&counts, self.sum_ns + other.sum_ns, self.max_ns.max(other.max_ns));
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|&(_, c)| c).sum()
    }

    /// Percentiles of the faults recorded (`None`: none).
    pub fn summary(&self) -> Option<Latency> {
        Latency::from_counts(&self.counts(), self.sum_ns, self.max_ns)
    }
}

macro_rules! counter_struct {
    ($(#[$meta:meta])* $name:ident, $snap:ident { $($(#[$fmeta:meta])* $field:ident),* $(,)? }) => {
        #[derive(Default)]
        pub(crate) struct $name { $(pub $field: Counter,)* }
        $(#[$meta])*
        #[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
        pub struct $snap { $($(#[$fmeta])* pub $field: u64,)* }
        impl $name {
            pub fn snapshot(&self) -> $snap { $snap { $($field: self.$field.get(),)* } }
        }
        impl $snap {
            pub fn is_zero(&self) -> bool { true $(&& self.$field == 0)* }
        }
    };
}

counter_struct!(
    /// Engine-wide counters, named as in /proc/vmstat (pages are 4 KiB).
    VmCounters, VmStat {
        /// Faults served (every folio installed, including first touches).
        pgfault,
        /// Faults that needed decompression or I/O.
        pgmajfault,
        /// Pages read from the swap file.
        pswpin,
        /// Pages written to the swap file.
        pswpout,
        /// Pages loaded from the compressed pool.
        zswpin,
        /// Pages stored into the compressed pool (all-zero folios included, as zswap counts them).
        zswpout,
        /// Pages written back from the pool to the swap file.
        zswpwb,
        /// Folios brought into the swap cache by readahead, those later used by a fault,
        /// and those dropped unused (evicted from the readahead cache, or discarded).
        swap_ra,
        swap_ra_hit,
        swap_ra_waste,
        /// Readahead folios chosen along a detected stride rather than the plain window.
        swap_ra_stride,
        /// Readahead folios mapped right after a hit before any fault asked for them
        /// (`map_ahead`); also counted in `swap_ra_hit`.
        swap_ra_mapped,
        /// 2 MiB folios swapped out whole to the swap file, and those split first.
        thp_swpout,
        thp_swpout_fallback,
        /// 2 MiB folios swapped in whole, and those swapped in only in part (split into
        /// 4 KiB pages, of which only the faulting one came back: `swapin_enabled`).
        thp_swpin,
        thp_swpin_fallback,
        /// 2 MiB first touches that got a huge page, and those that fell back to 4 KiB pages.
        thp_fault_alloc,
        thp_fault_fallback,
        /// Copy mode: 2 MiB folios copied in as 4 KiB pages and made one THP again with
        /// MADV_COLLAPSE, and collapses the kernel refused (the folio stays in 4 KiB pages).
        thp_collapse_alloc,
        thp_collapse_alloc_failed,
        /// Large folios split (partial DONTNEED/munmap/mremap, or split-mode swap-out).
        thp_split_page,
        /// Folios evicted by the background reclaimers and by direct reclaim in the fault path.
        pgsteal_kswapd,
        pgsteal_direct,
        /// Of those, 4 KiB pages evicted with a colder neighbour, in its MOVE
        /// (`evict_cluster`).
        pgsteal_cluster,
        /// Pages the zero scan read, and those it found all zero and queued first for
        /// eviction (`zero_scan.rs`).
        pgscan_zero,
        pgscan_zero_found,
        /// Written bits (`written_aging`): harvests of every region's bits, inactive
        /// folios found written and sent round the inactive list again (the kernel's
        /// PG_referenced), and those found written a second time and activated.
        written_harvest,
        pgrotated,
        pgactivate,
        /// Times direct reclaim ran, and times a fault waited for reclaim in flight.
        allocstall,
        /// Faults refused because neither memory_high nor the pool cap could be kept.
        oom_kill,
        /// Stores the pool refused because it was full (zswap's pool_limit_hit).
        zswap_pool_limit_hit,
        /// All-zero folios stored as markers (zswap's same_filled_pages, in folios).
        zswap_same_filled,
        /// Folios the pool stored raw because they did not compress.
        zswap_stored_raw,
        /// Folios (a pieced folio: pages) stored with the secondary codec, which made them
        /// smaller than the primary left them (`recomp_algorithm`; zram's recompression).
        zswap_recompressed,
        /// Pool objects moved down their chunk by compaction, and the pool's pages given
        /// back by its passes (zram's `pages_compacted`; `compact.rs`).
        zswap_compact_moved,
        zswap_pages_compacted,
        /// Folios sent to the swap file instead of the pool because they compressed less
        /// than `min_compression_ratio`.
        zswap_reject_compress_poor,
        /// Folios sent to the swap file instead of the pool because the pool was only
        /// passing folios through to it (`pool_bypass.rs`).
        zswap_bypass,
        /// Swap file writes that failed (their slots are marked bad, the folio stays put),
        /// reads that failed, and reads whose data failed its checksum (both fail the fault).
        swap_write_error,
        swap_read_error,
        swap_checksum_error,
        /// userfaultfd events handled.
        uffd_remove,
        uffd_unmap,
        uffd_remap,
        /// Evictions that first had to give this process its own copy of pages it shared
        /// with a forked child (copy on write), since MOVE takes only unshared pages.
        cow_unshare,
        /// Folios brought back in so that a forked child inherits them (`fork.rs`).
        fork_swapin,
        /// Faults charged past memory_high because the limit is shared with other
        /// processes and none of this process's memory could be reclaimed in time
        /// (memory.events `high`: a throttle, not an OOM).
        memory_high_overrun,
        /// Faults resolved by another thread first (concurrent faults on one folio).
        fault_raced,
        /// Faults on an Untouched folio whose pages were still mapped: an applied REMOVE
        /// released it before the kernel's zap ran (`fault.rs` `fault_zero`).
        fault_before_zap,
        /// Folios installed zeroed ahead of first touches that run in sequence
        /// (`fault.rs` `zero_ahead`).
        zero_ahead,
        /// Times the fault threads polling the userfaultfd changed (thread mode,
        /// `pollers.rs`): to the one on the CPU of a thread faulting alone, or back to all.
        fault_poll_moves,
        /// Wake-ups made by a fault thread at SCHED_IDLE, so that the woken thread stays
        /// on its CPU (`local_wake.rs`), and fault threads given their policy back by
        /// another while a fault waited for them.
        fault_wake_local,
        fault_wake_rescued,
        /// Faults that found their folio still uncompressed in the swap cache (its
        /// eviction not finished) and moved it straight back.
        swapcache_hit,
        /// Pages faulted back after eviction, and those that came back within the
        /// working-set distance and were activated (the kernel's workingset counters).
        workingset_refault_anon,
        workingset_activate_anon,
        /// Swap-ins that decompressed into staging kept from an eviction, and those that
        /// had to fault in (and zero) fresh memory.
        staging_reused,
        staging_populated,
        /// Buffers of system calls made resident before the call, because the engine does
        /// not serve the kernel's own faults (user-mode-only userfaultfd, or signal mode:
        /// `kernel_access.rs`), and retries of calls that failed with EFAULT anyway (a page
        /// evicted in between).
        syscall_prefault,
        syscall_retry,
    }
);

counter_struct!(
    /// Counters per folio size, as `hugepages-<size>kB/stats/*` (in folios of that size).
    SizeCounters, SizeStat {
        anon_fault_alloc,
        anon_fault_fallback,
        swpout,
        swpout_fallback,
        swpin,
        swpin_fallback,
        zswpout,
        zswpin,
        split,
    }
);

#[derive(Default)]
pub(crate) struct Counters {
    pub vm: VmCounters,
    pub size: [SizeCounters; 10],
    pub fault_latency: [Histogram; 10],
    /// Swap-in faults: [0] decompressed or read, [1] served from a readahead copy.
    pub swapin_latency: [Histogram; 2],
    /// Sampled stage times of swap-ins and evictions (`stages.rs`).
    pub stages: StageTimes,
}

impl Counters {
    pub fn size(&self, folio: FolioSize) -> &SizeCounters {
        &self.size[folio.index()]
    }
}

/// One region's readahead: what it brought in, what was used, and its window now.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct RegionReadahead {
    pub swap_ra: u64,
    pub swap_ra_hit: u64,
    pub swap_ra_waste: u64,
    /// The current window, in folios.
    pub window: u32,
    /// The stride detected between the region's recent faults, in folios (0: none).
    pub stride: i64,
}

/// Memory the engine holds, in bytes.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct MemoryStat {
    /// The limit (`None`: max).
    pub memory_high: Option<u64>,
    /// Bytes counted against memory_high now.
    pub charged_bytes: u64,
    /// Managed memory mapped in regions.
    pub resident_bytes: u64,
    /// Folios unmapped but held uncompressed in staging (being compressed, or handed back).
    pub swapcache_bytes: u64,
    /// Of the swap cache, the copies readahead brought in and no fault has used yet.
    pub readahead_bytes: u64,
    /// Populated staging kept for reuse by the fault path.
    pub staging_free_bytes: u64,
    /// Memory the compressed pool holds (zswap's pool_total_size).
    pub pool_total_bytes: u64,
    /// Compressed bytes of the entries stored.
    pub pool_compressed_bytes: u64,
    /// Of `pool_total_bytes`, free page-sized slots kept populated for reuse (the slack
    /// `shrink_slack` can give back at once).
    pub pool_slack_bytes: u64,
    /// Uncompressed bytes of the folios in the pool (zswap's stored_pages × 4 KiB).
    pub pool_stored_bytes: u64,
    pub pool_entries: u64,
    pub max_pool_bytes: u64,
    /// With the pool charged: how much of memory_high it may hold before writeback moves
    /// its oldest entries to the swap file, which its swap-ins move (`pool_share.rs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool_share_bytes: Option<u64>,
    /// Bytes of all live regions (virtual).
    pub managed_bytes: u64,
    pub regions: u64,
    /// With a shared limit (`shared_limit`): what every sharing process has charged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_charged_bytes: Option<u64>,
    /// How far this process's whole cost (what it charges plus the pool, charged or not)
    /// is over memory_high now: above zero where the pool is not charged (no swap file)
    /// or a shared limit was overrun, and for a moment while evictions are being stored
    /// (each holds its folio's charge and its compressed copy at once).
    pub limit_overrun_bytes: u64,
    /// The most it has been over, as seen after each swap-out.
    pub limit_overrun_peak_bytes: u64,
}

/// The swap file: its slots and its I/O.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SwapStat {
    pub slots_total: u64,
    pub slots_used: u64,
    pub slots_free: u64,
    /// Slots whose write failed: never used again.
    pub slots_bad: u64,
    /// Of the used slots, those sitting free in threads' slot caches (returned in batches).
    pub slots_cached: u64,
    /// Whether the file is read and written with O_DIRECT (else through the page cache).
    pub direct_io: bool,
    /// Where the file was made: its directory (it has no name) or the path it was
    /// created at and unlinked from.
    pub path: Option<String>,
    /// Its size: what it can hold.
    pub size_bytes: u64,
    /// Disk it occupies now (a sparse file grows as folios are written).
    pub disk_bytes: Option<u64>,
    /// Made by the engine because none was configured (`auto_swap_file`).
    pub on_demand: bool,
    /// The filesystem filled up under it: it takes no more folios.
    pub disk_full: bool,
    pub io: SwapIoStats,
}

/// The remote tier's state (`remote.rs`), for `Engine::stats()` and `folioswap stat`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RemoteStat {
    pub nodes: String,
    /// Masters of the cluster when the engine connected.
    pub masters: usize,
    /// Replicas a write waits for (WAIT): 1 where every master has one, else 0.
    pub wait_replicas: u32,
    /// The keys' common prefix (this engine's).
    pub key_prefix: String,
    /// Runs (keys) stored now, and their value bytes.
    pub keys: u64,
    pub bytes: u64,
    /// Pages written to and read from the cluster.
    pub remote_swpout: u64,
    pub remote_swpin: u64,
    /// Requests that failed for good (after the client's retries and the timeout).
    pub remote_errors: u64,
    /// Keys deleted (freed runs, and at exit).
    pub keys_deleted: u64,
    /// Writes stored without a replica: their master had none left (after a failover).
    pub remote_unreplicated: u64,
    pub timeout_ms: u64,
    pub lease_ms: u64,
    /// Why the tier takes no writes now (a write failed and the cluster is not ok yet).
    pub down: Option<String>,
    /// Latency of one fetch, by the size fetched ("4K", "64K", "2M", …).
    pub fetch_latency: Vec<(String, Latency)>,
    /// Latency of one write (a batch, WAIT included), by the size of its first run.
    pub store_latency: Vec<(String, Latency)>,
    pub write_latency: Option<Latency>,
}

/// A snapshot of everything `Engine::stats()` reports.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Stats {
    /// The engine's userfaultfd: `full`, or `user-mode-only` (no permission to handle the
    /// kernel's faults: system calls on swapped-out memory need `prefault_for_kernel`).
    pub uffd: UffdMode,
    /// How pages go into regions and out: `move` (UFFDIO_MOVE) or `copy` (UFFDIO_COPY,
    /// and write-protect, copy, MADV_DONTNEED out: kernels before 6.8, or `uffd_move` off).
    pub install: InstallMode,
    #[serde(flatten)]
    pub vm: VmStat,
    pub memory: MemoryStat,
    /// The swap file tier, if the engine has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap: Option<SwapStat>,
    /// Per folio size, keyed by the kernel's spelling (`2048kB`); sizes with no activity omitted.
    pub per_size: BTreeMap<String, SizeStat>,
    /// Fault-service latency per folio size, overall ("all"), and for swap-ins that missed
    /// the readahead cache ("swapin_miss") or hit it ("swapin_ra_hit").
    pub fault_latency: BTreeMap<String, Latency>,
    /// Where a swap-in fault's and an eviction's time goes, stage by stage, in the order
    /// the stages run: means over one operation in 16 (`stages.rs`).
    pub stages: StageStat,
}

/// Every folio size's fault latencies merged into one histogram.
pub(crate) fn fault_latency_histogram(counters: &Counters) -> LatencyHistogram {
    let mut all = vec![0u64; BUCKETS];
    let (mut sum, mut max) = (0, 0);
    for h in &counters.fault_latency {
        h.merge_into(&mut all, &mut sum, &mut max);
    }
    LatencyHistogram::from_counts(&all, sum, max)
}

impl Stats {
    pub(crate) fn collect(uffd: UffdMode, install: InstallMode, counters: &Counters, memory: MemoryStat, swap: Option<SwapStat>) -> Stats {
        let mut per_size = BTreeMap::new();
        let mut fault_latency = BTreeMap::new();
        let mut all = vec![0u64; BUCKETS];
        let (mut sum, mut max) = (0, 0);
        for folio in FolioSize::ALL {
            let snap = counters.size(folio).snapshot();
            if !snap.is_zero() {
                per_size.insert(folio.kernel_label().to_string(), snap);
            }
            let h = &counters.fault_latency[folio.index()];
            if let Some(lat) = h.summary() {
                fault_latency.insert(folio.kernel_label().to_string(), lat);
            }
            h.merge_into(&mut all, &mut sum, &mut max);
        }
        if let Some(lat) = Latency::from_counts(&all, sum, max) {
            fault_latency.insert("all".to_string(), lat);
        }
        for (name, h) in ["swapin_miss", "swapin_ra_hit"].iter().zip(&counters.swapin_latency) {
            if let Some(lat) = h.summary() {
                fault_latency.insert(name.to_string(), lat);
            }
        }
        Stats { uffd, install, vm: counters.vm.snapshot(), memory, swap, per_size, fault_latency, stages: counters.stages.snapshot() }
    }

    /// Per-size counters of one folio size (zeros if it saw no activity).
    pub fn size(&self, folio: FolioSize) -> SizeStat {
        self.per_size.get(folio.kernel_label()).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn percentiles_of_a_known_distribution() {
        let h = Histogram::default();
        for i in 1..=1000u64 {
            h.record(i * 1000);
        }
        let l = h.summary().unwrap();
        assert_eq!(l.count, 1000);
        assert!((l.p50_us - 500.0).abs() / 500.0 < 0.07, "{l:?}");
        assert!((l.p90_us - 900.0).abs() / 900.0 < 0.07, "{l:?}");
        assert!((l.p99_us - 990.0).abs() / 990.0 < 0.07, "{l:?}");
        assert_eq!(l.max_us, 1000.0);
        assert!((l.mean_us - 500.5).abs() < 0.01);
    }

    fn histogram_of(values_us: impl IntoIterator<Item = u64>) -> LatencyHistogram {
        let h = Histogram::default();
        for v in values_us {
            h.record(v * 1000);
        }
        let mut counts = vec![0u64; BUCKETS];
        let (mut sum, mut max) = (0, 0);
        h.merge_into(&mut counts, &mut sum, &mut max);
        LatencyHistogram::from_counts(&counts, sum, max)
    }

    #[test]
    fn an_intervals_faults_are_the_difference_of_two_snapshots() {
        let before = histogram_of(1..=100);
        let after = histogram_of((1..=100).chain(std::iter::repeat_n(1000, 50)));
        let interval = after.since(&before);
        assert_eq!(interval.count(), 50);
        let l = interval.summary().unwrap();
        assert!((l.p50_us - 1000.0).abs() / 1000.0 < 0.07, "{l:?}");
        assert!((l.mean_us - 1000.0).abs() < 0.01, "{l:?}");
        assert!((l.max_us - 1000.0).abs() / 1000.0 < 0.07, "{l:?}");
        assert_eq!(after.since(&after).summary(), None);
    }

    #[test]
    fn merged_histograms_count_both_processes_faults() {
        let mut a = histogram_of(std::iter::repeat_n(10, 90));
        let b = histogram_of(std::iter::repeat_n(500, 10));
        a.merge(&b);
        let l = a.summary().unwrap();
        assert_eq!(l.count, 100);
        assert!((l.p50_us - 10.0).abs() / 10.0 < 0.07, "{l:?}");
        assert!((l.p99_us - 500.0).abs() / 500.0 < 0.07, "{l:?}");
        assert_eq!(l.max_us, 500.0);
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(serde_json::from_str::<LatencyHistogram>(&json).unwrap(), a);
    }

    proptest! {
        #[test]
        fn bucket_brackets_value(ns in 0u64..u64::MAX / 2) {
            let b = bucket_of(ns);
            prop_assert!(b < BUCKETS);
            let v = bucket_value(b);
            let err = (v as f64 - ns as f64).abs() / (ns.max(1) as f64);
            prop_assert!(err <= 0.0625 || ns < 16, "ns {} bucket {} value {}", ns, b, v);
        }
    }
}
