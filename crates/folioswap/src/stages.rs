//! Where a swap-in fault's time and an eviction's time go, stage by stage (issue 14's
//! breakdown): one fault or eviction in [`SAMPLE`] per thread is timed with a clock read
//! at the end of each stage, and the stage's time is summed. Sampling keeps the cost off
//! the other faults (two clock reads and two relaxed adds per stage of a sampled one).
//!
//! The clock lives in a thread-local cell, so the paths only mark where a stage ends
//! (`lap`); a path that is not the one timed (a first touch, a swap-cache hit) never laps
//! and is not counted. A `const`-initialised `Cell` needs no allocation or destructor,
//! so the SIGBUS handler of signal mode may use it too.

use serde::Serialize;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// One timed operation in this many, per thread.
pub(crate) const SAMPLE: u32 = 16;

/// The stages, in the order a path runs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// A swap-in fault (`fault.rs`): from its start (the message read, or the SIGBUS) to
    /// the folio locked and found swapped out: address lookup, lock wait, pending events.
    SwapinLookup,
    /// `charge::reserve`, direct reclaim included.
    SwapinCharge,
    /// A staging folio to decompress or read into.
    SwapinStaging,
    /// Decompression, or the swap file read.
    SwapinLoad,
    /// UFFDIO_COPY or UFFDIO_MOVE into the region.
    SwapinInstall,
    /// Freeing the stored copy, marking it resident (LRU, counters).
    SwapinFinish,
    /// Unlock, up to the faulting thread's wake-up (the wake-up itself is left out: a
    /// fault thread that dropped to SCHED_IDLE is preempted in it, `local_wake.rs`).
    SwapinWake,
    /// Readahead after the fault (queueing it, when asynchronous).
    SwapinReadahead,
    /// An eviction (`evict.rs`): picking the victim and batching its neighbours.
    EvictPick,
    /// Moving (or copying) the run out and into the swap cache.
    EvictMoveOut,
    /// Compressing or writing one member.
    EvictStore,
    /// Publishing it (or putting it back) and releasing its staging.
    EvictPublish,
}

const STAGES: usize = 12;

impl Stage {
    const ALL: [Stage; STAGES] = [
        Stage::SwapinLookup,
        Stage::SwapinCharge,
        Stage::SwapinStaging,
        Stage::SwapinLoad,
        Stage::SwapinInstall,
        Stage::SwapinFinish,
        Stage::SwapinWake,
        Stage::SwapinReadahead,
        Stage::EvictPick,
        Stage::EvictMoveOut,
        Stage::EvictStore,
        Stage::EvictPublish,
    ];

    fn name(self) -> &'static str {
        match self {
            Stage::SwapinLookup => "lookup",
            Stage::SwapinCharge => "charge",
            Stage::SwapinStaging => "staging",
            Stage::SwapinLoad => "load",
            Stage::SwapinInstall => "install",
            Stage::SwapinFinish => "finish",
            Stage::SwapinWake => "wake",
            Stage::SwapinReadahead => "readahead",
            Stage::EvictPick => "pick",
            Stage::EvictMoveOut => "move_out",
            Stage::EvictStore => "store",
            Stage::EvictPublish => "publish",
        }
    }

    fn is_swapin(self) -> bool {
        (self as usize) < Stage::EvictPick as usize
    }
}

/// Per-stage sums over the sampled operations.
#[derive(Default)]
pub(crate) struct StageTimes {
    ns: [AtomicU64; STAGES],
    laps: [AtomicU64; STAGES],
}

/// One stage's share in a snapshot.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct StageMean {
    pub stage: &'static str,
    /// Sampled operations that went through the stage.
    pub samples: u64,
    pub mean_us: f64,
}

/// The breakdown in `Engine::stats()` (`stages`): the swap-in fault's stages and the
/// eviction's, in the order they run, each the mean over sampled operations.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct StageStat {
    pub swapin: Vec<StageMean>,
    pub evict: Vec<StageMean>,
}

impl StageTimes {
    pub fn snapshot(&self) -> StageStat {
        let mut out = StageStat::default();
        for stage in Stage::ALL {
            let i = stage as usize;
            let (ns, laps) = (self.ns[i].load(Ordering::Relaxed), self.laps[i].load(Ordering::Relaxed));
            if laps == 0 {
                continue;
            }
            let mean = StageMean { stage: stage.name(), samples: laps, mean_us: ns as f64 / laps as f64 / 1000.0 };
            if stage.is_swapin() {
                out.swapin.push(mean);
            } else {
                out.evict.push(mean);
            }
        }
        out
    }
}

thread_local! {
    static CLOCK: Cell<Option<Instant>> = const { Cell::new(None) };
    static OPS: Cell<u32> = const { Cell::new(0) };
}

/// The clock of an operation this one interrupted (a fault's, when the fault reclaims).
pub(crate) struct Outer(Option<Instant>);

/// An operation starts on this thread: time it if it is the sampled one. Hand the result
/// to [`end`], which gives an interrupted operation its clock back.
pub(crate) fn begin() -> Outer {
    let n = OPS.with(|c| {
        let n = c.get().wrapping_add(1);
        c.set(n);
        n
    });
    Outer(CLOCK.with(|c| c.replace(if n.is_multiple_of(SAMPLE) { Some(Instant::now()) } else { None })))
}

/// The stage that just ended, if this operation is timed.
pub(crate) fn lap(times: &StageTimes, stage: Stage) {
    lap_until(times, stage, None);
}

/// The stage that ended at `at` (now, if None), if this operation is timed; the next
/// stage is timed from now, leaving out what came between (a fault thread preempted by
/// the thread it woke: `local_wake.rs`).
pub(crate) fn lap_until(times: &StageTimes, stage: Stage, at: Option<Instant>) {
    CLOCK.with(|c| {
        if let Some(then) = c.get() {
            let now = Instant::now();
            let end = at.unwrap_or(now).max(then);
            times.ns[stage as usize].fetch_add(end.duration_since(then).as_nanos() as u64, Ordering::Relaxed);
            times.laps[stage as usize].fetch_add(1, Ordering::Relaxed);
            c.set(Some(now));
        }
    });
}

/// The operation is over: the interrupted one, if any, goes on timing.
pub(crate) fn end(outer: Outer) {
    CLOCK.with(|c| c.set(outer.0));
}
