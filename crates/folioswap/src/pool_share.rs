//! How much of memory_high a charged pool may hold before writeback moves its oldest
//! entries to the swap file (`Tiers::needs_writeback`). State and arithmetic only: the
//! swap-in path reports each load from the pool or the file ([`PoolShare::note_swapin`]),
//! and every `WINDOW` of them the share moves one step.
//!
//! Charged, the pool and resident memory divide one limit. Each byte the pool gives up
//! is a resident byte more: the faults just past the resident edge become hits, while
//! the pool's oldest entries go to the file and their faults cost a disk read instead of
//! a decompression. The kernel balances its anon and file LRUs by what their refaults
//! cost (mm/vmscan.c, `lru_note_cost`); here the same reckoning is made with refault
//! distances `d` (pages evicted between a folio leaving and its fault,
//! `Lru::distance_since`). Writeback takes the oldest entries first, so the pool holds
//! what was evicted since the last entry written back: its reach `E` is that entry's
//! distance. With `X` one step of the limit in pages, `c` the pool's ratio (folio bytes
//! per byte of footprint) and `S` the pages it holds, X more footprint would hold `X*c`
//! more pages and reach `D = X*c*E/S` farther (the pool's pages are spread over `E`
//! evictions: the others came back). A window counts
//!
//!   near       d < X                       would have stayed resident with X more
//!   pool_edge  from the pool, d >= E - D    would come from the file with X less pool
//!   file_edge  from the file, d <  E + D    would come from the pool with X more pool
//!
//! and, a file fault costing about `FILE_COST` pool faults more, moves the share down
//! when `near > FILE_COST * pool_edge` and the pool fills the share to within a step,
//! and up when `FILE_COST * file_edge > near`. What
//! growing costs, the hits just inside the resident edge, cannot be seen (they are
//! hits): `near` stands for them, as if the distances were as dense on both sides of the
//! edge.
//!
//! Measured before it (BENCHMARKS.md, "A pool share that follows the refaults"): with
//! the share fixed at one half, GNU sort of random text (which compresses 1.5:1) at 0.6
//! of its footprint ran 12.1 s, at 5% 4.2 s; CPython's dict at 0.5 was best near 15%,
//! and at 0.4 near 25% (12% took 21.4 s, 25% 12.2 s, 50% 14.9 s). No fixed share serves
//! them all. Against the half, with this: sort 17-22% faster at 0.5 and 3-3.7x at 0.6;
//! the dict, whose pool at one half held all it evicted, from 3% faster to 12% slower at
//! 0.5, faster at 0.6 and 4-23% slower at 0.4 (part of it now on the file). Shrinking
//! only a pool that fills its share then cut the dict's file reads eightfold (1M keys at
//! 0.6: 47.1 s to 31.3 s; 300k keys at 0.6: 9.6 s to 7.1 s), sort unchanged within noise.
//!
//! The counters are updated without a lock and reset by whichever fault closes the
//! window: a count lost in that race only makes one window a fault shorter.

use crate::folio::Kind;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The share's unit: 1/64 of memory_high.
pub(crate) const STEPS: u32 = 64;
/// The least and most the pool may hold, in steps: 1/32 (a pool this small still takes
/// what compresses well and is reloaded soon) and 1/2 (the former fixed share).
const MIN_SHARE: u32 = 2;
const MAX_SHARE: u32 = 32;
/// Where every engine starts: 1/8, about the best fixed share for the programs above.
const START_SHARE: u32 = 8;
/// Swap-ins per decision.
pub(crate) const WINDOW: u32 = 512;
/// How far apart the marginal counts the estimate `X` looks: 1/32 of the limit (two
/// steps, so that a window sees enough faults at either edge to count).
const ESTIMATE_STEPS: u64 = 2;
/// A fault from the swap file costs this many pool faults more: a 4 KiB O_DIRECT read at
/// queue depth 1 takes 52-68 µs here, a pool fault 12-17 µs in all (MEASUREMENTS.md).
const FILE_COST: u32 = 4;
/// A move needs the winning side ahead by this much, so that noise does not rock it.
const EVIDENCE: u32 = WINDOW / 64;

/// Where a swap-in's data came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LoadedFrom {
    Pool,
    File,
}

impl LoadedFrom {
    /// The tier of a folio stored as `kind` (Pool or Swapped).
    pub fn of(kind: Kind) -> LoadedFrom {
        if kind == Kind::Pool {
            LoadedFrom::Pool
        } else {
            LoadedFrom::File
        }
    }
}

/// The window's view of the pool, fixed when it opens, in pages of the eviction clock:
/// `x`, one estimate step of the limit; `reach`, the pool's reach `E`; `beyond`, how much
/// farther `X` more footprint would reach (`D`); and `filled`, the pool's footprint in
/// steps of the share, rounded up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Edges {
    pub x: u64,
    pub reach: u64,
    pub beyond: u64,
    pub filled: u32,
}

impl Edges {
    /// The edges of a pool holding `folio_bytes` of data in `footprint_bytes`, everything
    /// evicted in the last `reach` pages of the clock that has not come back, under `limit`.
    pub fn new(limit: u64, folio_bytes: u64, footprint_bytes: u64, reach: u64) -> Edges {
        let page = crate::size::PAGE_SIZE as u64;
        let x = limit / STEPS as u64 * ESTIMATE_STEPS / page;
        // X*c: at least X (an empty pool, or one holding less than its footprint).
        let x_held = (x * folio_bytes.max(footprint_bytes)).checked_div(footprint_bytes).unwrap_or(x);
        let held = folio_bytes / page;
        // D = X*c*E/S, at least X*c: the pages held cannot be denser than the clock.
        let beyond = (x_held * reach).checked_div(held).unwrap_or(x_held).max(x_held);
        let step = (limit / STEPS as u64).max(1);
        let filled = footprint_bytes.div_ceil(step).min(STEPS as u64) as u32;
        Edges { x, reach, beyond, filled }
    }
}

pub(crate) struct PoolShare {
    /// The pool's share of memory_high now, in steps (`STEPS`).
    share: AtomicU32,
    /// The current window's `Edges` (x is 0 until the first window opens).
    x: AtomicU64,
    reach: AtomicU64,
    beyond: AtomicU64,
    /// The eviction clock of the entry written back last (`note_writeback`).
    frontier: AtomicU32,
    swapins: AtomicU32,
    near: AtomicU32,
    pool_edge: AtomicU32,
    file_edge: AtomicU32,
}

impl Default for PoolShare {
    fn default() -> PoolShare {
        PoolShare {
            share: AtomicU32::new(START_SHARE),
            x: AtomicU64::new(0),
            reach: AtomicU64::new(0),
            beyond: AtomicU64::new(0),
            frontier: AtomicU32::new(0),
            swapins: AtomicU32::new(0),
            near: AtomicU32::new(0),
            pool_edge: AtomicU32::new(0),
            file_edge: AtomicU32::new(0),
        }
    }
}

impl PoolShare {
    /// The most of `limit` the pool may hold now.
    pub fn cap(&self, limit: u64) -> u64 {
        limit / STEPS as u64 * self.share.load(Ordering::Relaxed) as u64
    }

    /// Count one swap-in from `from` at refault `distance`. Returns true where it closed
    /// the window: the caller then calls [`PoolShare::open_window`] with fresh edges.
    pub fn note_swapin(&self, from: LoadedFrom, distance: u64) -> bool {
        let x = self.x.load(Ordering::Relaxed);
        let reach = self.reach.load(Ordering::Relaxed);
        let beyond = self.beyond.load(Ordering::Relaxed);
        if distance < x {
            self.near.fetch_add(1, Ordering::Relaxed);
        }
        match from {
            LoadedFrom::Pool if distance + beyond >= reach => self.pool_edge.fetch_add(1, Ordering::Relaxed),
            LoadedFrom::File if distance < reach + beyond => self.file_edge.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
        self.swapins.fetch_add(1, Ordering::Relaxed) + 1 == WINDOW
    }

    /// Close the window: move the share by what it counted, and start the next one with
    /// `edges` (measured now, so that `edges.filled` is the pool as the window closes).
    ///
    /// The counts weigh the pool's real margin, its oldest entries, and so speak for a
    /// smaller share only where the pool fills the one it has: a cap above the pool's
    /// footprint holds nothing back, and lowering it step by step while the pool sits
    /// under it (the counts there see only how rarely the oldest entries come back)
    /// used to carry the cap far below the pool in one run of windows, whose writeback
    /// then sent the pool's hot half to the file (CPython's dict at 0.6: 225k file reads,
    /// 22k with the share held at half).
    ///
    /// Until the pool first writes back, though, nothing ever tests its far end: it holds
    /// every entry it took, the earliest evictions included, and a pool that settles under
    /// its starting share keeps them, charged, for the whole run. Such a window that speaks
    /// for less brings the share down to the pool's own footprint (rounded up a step, so
    /// nothing is written back yet); the next one is then a full pool's and moves a step.
    /// CPython's dict at 41M with zstd:1 settled a 2.1M pool under a share of 5.2M, 1M short
    /// of the resident memory its lookups needed, and took 31 k faults against 7 k
    /// (BENCHMARKS.md, "A pool that never wrote back").
    pub fn open_window(&self, edges: Edges) {
        let near = self.near.swap(0, Ordering::Relaxed);
        let pool_edge = self.pool_edge.swap(0, Ordering::Relaxed);
        let file_edge = self.file_edge.swap(0, Ordering::Relaxed);
        let share = self.share.load(Ordering::Relaxed);
        let fills_share = edges.filled + 1 >= share;
        let shrink = near > FILE_COST * pool_edge + EVIDENCE;
        let next = if self.x.load(Ordering::Relaxed) == 0 {
            share // The first window had no edges to count against.
        } else if shrink && fills_share {
            share.saturating_sub(1).max(MIN_SHARE)
        } else if shrink && self.writeback_frontier() == 0 {
            edges.filled.max(MIN_SHARE)
        } else if FILE_COST * file_edge > near + EVIDENCE {
            (share + 1).min(MAX_SHARE)
        } else {
            share
        };
        self.share.store(next, Ordering::Relaxed);
        self.x.store(edges.x, Ordering::Relaxed);
        self.reach.store(edges.reach, Ordering::Relaxed);
        self.beyond.store(edges.beyond, Ordering::Relaxed);
        self.swapins.store(0, Ordering::Relaxed);
    }

    /// An entry evicted at clock `evicted_at` was written back to the file: the pool now
    /// holds what was evicted after it.
    pub fn note_writeback(&self, evicted_at: u32) {
        self.frontier.store(evicted_at, Ordering::Relaxed);
    }

    /// The eviction clock of the entry written back last (0 before any).
    pub fn writeback_frontier(&self) -> u32 {
        self.frontier.load(Ordering::Relaxed)
    }

    #[cfg(test)]
    pub fn steps(&self) -> u32 {
        self.share.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: u64 = 64 << 20;

    /// A window of swap-ins cycling through `faults`, then its decision.
    fn window(share: &PoolShare, edges: Edges, faults: &[(LoadedFrom, u64)]) {
        if share.x.load(Ordering::Relaxed) == 0 {
            share.open_window(edges);
        }
        for i in 0..WINDOW as usize {
            let (from, distance) = faults[i % faults.len()];
            let closed = share.note_swapin(from, distance);
            assert_eq!(closed, i + 1 == WINDOW as usize, "only the window's last swap-in closes it");
        }
        share.open_window(edges);
    }

    #[test]
    fn the_edges_measure_a_step_at_the_pools_ratio_and_spread() {
        // 1/32 of 64M is 2M: 512 pages. A pool holding 3 bytes per byte of footprint
        // holds 1536 pages more with it; holding 30M (7680 pages) spread over 15 360
        // evictions, those reach twice as far.
        let e = Edges::new(LIMIT, 30 << 20, 10 << 20, 15_360);
        assert_eq!(e, Edges { x: 512, reach: 15_360, beyond: 3072, filled: 10 });
        // An empty pool, or one holding less than its footprint, counts a ratio of 1;
        // one denser than the clock (a reach shorter than it holds) its pages alone.
        assert_eq!(Edges::new(LIMIT, 0, 0, 0).beyond, 512);
        assert_eq!(Edges::new(LIMIT, 1 << 20, 4 << 20, 1000).beyond, 512 * 1000 / 256);
        assert_eq!(Edges::new(LIMIT, 30 << 20, 10 << 20, 100).beyond, 1536);
    }

    #[test]
    fn refaults_just_past_resident_memory_shrink_the_pool_to_its_floor() {
        let share = PoolShare::default();
        assert_eq!(share.cap(LIMIT), LIMIT / 8, "an engine starts at 1/8");
        let edges = Edges::new(LIMIT, 30 << 20, 10 << 20, 15_360);
        // Pool faults at small distances, none near the pool's far end: thrashing that
        // more resident memory would end.
        for _ in 0..START_SHARE {
            window(&share, edges, &[(LoadedFrom::Pool, 10), (LoadedFrom::Pool, 300)]);
        }
        assert_eq!(share.steps(), MIN_SHARE);
        assert_eq!(share.cap(LIMIT), LIMIT / 32, "never under the floor");
    }

    #[test]
    fn a_pool_under_its_share_is_not_shrunk_toward_itself() {
        let share = PoolShare::default();
        share.note_writeback(1_000);
        // 3M of footprint under a share of 8M (1M steps): the windows that would shrink a
        // full pool hold the share while the pool stays three steps or more below it...
        let under = Edges::new(LIMIT, 9 << 20, 3 << 20, 15_360);
        assert_eq!(under.filled, 3);
        let thrash = [(LoadedFrom::Pool, 10), (LoadedFrom::Pool, 300)];
        for _ in 0..4 {
            window(&share, under, &thrash);
        }
        assert_eq!(share.steps(), START_SHARE);
        // ...and move it again once the pool grows to within a step of it.
        let full = Edges::new(LIMIT, 21 << 20, (7 << 20) - 1, 15_360);
        assert_eq!(full.filled, START_SHARE - 1);
        window(&share, full, &thrash);
        assert_eq!(share.steps(), START_SHARE - 1);
        // Growing needs no full pool: file faults just past its reach still count, even
        // beside faults near the resident edge.
        for _ in 0..3 {
            window(&share, under, &[(LoadedFrom::File, 16_000)]);
        }
        assert_eq!(share.steps(), START_SHARE + 2);
        window(&share, under, &[(LoadedFrom::File, 16_000), (LoadedFrom::File, 16_000), (LoadedFrom::Pool, 10)]);
        assert_eq!(share.steps(), START_SHARE + 3);
    }

    #[test]
    fn a_pool_that_never_wrote_back_has_its_share_brought_down_to_it() {
        let share = PoolShare::default();
        // 3M of footprint under a share of 8M (1M steps), nothing written back yet: the
        // first window that speaks for less brings the share down to the pool, no lower...
        let under = Edges::new(LIMIT, 9 << 20, 3 << 20, 15_360);
        let thrash = [(LoadedFrom::Pool, 10), (LoadedFrom::Pool, 300)];
        window(&share, under, &thrash);
        assert_eq!(share.steps(), 3);
        assert!(share.cap(LIMIT) >= 3 << 20, "nothing is written back by the move itself");
        // ...and the next one, a full pool's, a step below it.
        window(&share, under, &thrash);
        assert_eq!(share.steps(), 2);
        // A window that does not speak for less leaves a share above the pool alone.
        let share = PoolShare::default();
        window(&share, under, &[(LoadedFrom::Pool, 5_000), (LoadedFrom::File, 90_000)]);
        window(&share, under, &[(LoadedFrom::Pool, 5_000), (LoadedFrom::File, 90_000)]);
        assert_eq!(share.steps(), START_SHARE);
    }

    #[test]
    fn file_faults_just_past_the_pools_reach_grow_it_to_half() {
        let share = PoolShare::default();
        let edges = Edges::new(LIMIT, 30 << 20, 10 << 20, 15_360);
        // Every fault from the file, just beyond what the pool holds; none near.
        for _ in 0..MAX_SHARE {
            window(&share, edges, &[(LoadedFrom::File, 16_000)]);
        }
        assert_eq!(share.cap(LIMIT), LIMIT / 2, "never over half");
    }

    #[test]
    fn a_balanced_or_distant_window_keeps_the_share() {
        let share = PoolShare::default();
        let edges = Edges::new(LIMIT, 30 << 20, 10 << 20, 15_360);
        // Near faults and pool-edge faults weighed by what a disk read costs more: even.
        let mut mix = vec![(LoadedFrom::Pool, 100); FILE_COST as usize];
        mix.push((LoadedFrom::Pool, 14_000));
        window(&share, edges, &mix);
        window(&share, edges, &mix);
        assert_eq!(share.steps(), START_SHARE);
        // Faults in the middle of the pool and far out on the file say nothing.
        window(&share, edges, &[(LoadedFrom::Pool, 5_000), (LoadedFrom::File, 90_000)]);
        window(&share, edges, &[(LoadedFrom::Pool, 5_000), (LoadedFrom::File, 90_000)]);
        assert_eq!(share.steps(), START_SHARE);
    }
}
