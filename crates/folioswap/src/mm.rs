//! The engine's context: everything its threads (and, in signal mode, the faulting
//! threads themselves) work on, as the kernel's `mm_struct` is for a process. Fields only:
//! the behaviour lives in one file per path, as free functions taking `&Mm`:
//!
//! | path | file |
//! |---|---|
//! | a fault: thread or SIGBUS → resolve → one arm per folio state | `fault.rs` |
//! | kswapd and direct reclaim | `reclaim.rs` |
//! | one eviction: pick → batch → move out → store → publish, or put back | `evict.rs` |
//! | pool writeback to the swap file | `writeback.rs` |
//! | readahead after a swap-in | `readahead.rs` |
//! | finding all-zero resident folios, to evict them first | `zero_scan.rs` |
//! | applying an event to a folio: drop or split | `events.rs` |
//!
//! and what they share: `install.rs` (every MOVE/COPY and its retry), `gate.rs` (reading
//! the userfaultfd under the event gate), `charge.rs` (charging memory_high),
//! `release.rs` (letting go of a folio's storage), `tier.rs` (the pool and the swap file).
//!
//! # Lock order
//!
//! Take locks only downwards in this table. A lock marked *leaf* is never held while
//! another lock of this table is taken.
//!
//! | # | lock | protects | rule |
//! |---|---|---|---|
//! | 0 | `zero_scan` state (`zero_pace.rs`) | the zero scan's cursor and pace | taken only with `try_lock`, before anything else |
//! | 1 | folio lock (`PageEntry` LOCKED bit, `folio.rs`) | the folio's state, handle and storage | one taken blocking at a time; more only with `try_lock` (eviction batches, readahead, victim picking), or the tail pages of a folio whose head is held, ascending (split) |
//! | 2 | `gate` (read) | the address of every page: no event is read while an ioctl maps a page | held across each MOVE/COPY into or out of a region; dropped before `gate::pump_events` |
//! | 2 | `gate` (write) | reading the userfaultfd and marking events; changing the address map | never waits for a folio lock (marking sets PENDING without it) |
//! | 3 | `ADDRESS_MAP` (`addrmap.rs`) | the process's managed address ranges | under the gate when written; held alone across fork |
//! | 4 | `FolioTable::pieces` | where a table's pages are mapped | written under the gate (exclusive) and the address map |
//! | 5 | staging free lists (per size) | free staging slots | may wait on its condvar for a slot while folio locks are held |
//! | leaf | `events.pending`, `events.to_walk` | events marked and not yet applied | |
//! | leaf | `lru` lists, `tiers.pool_lru` | eviction and writeback order | |
//! | leaf | `ra` cache and queue | readahead copies, requests | |
//! | leaf | staging batches, `deferred_faults`, `unserved`, `reclaim` wait queues | | |
//! | leaf | `own_zaps` (`own_zaps.rs`) | the engine's own MADV_DONTNEEDs in flight (copy mode) | taken under the gate (write) when an event is read |
//!
//! The pool (`zswap/zpool.rs`) and the swap file's slot allocator (`swapfile/cluster.rs`)
//! have their own locks, documented there, taken only inside their calls. `memcg` is
//! lock-free (atomics), as are the counters.

use crate::config::Config;
use crate::event_queue::EventQueue;
use crate::local_wake::LocalWake;
use crate::lru::Lru;
use crate::memcg::MemCg;
use crate::own_zaps::OwnZaps;
use crate::pollers::Pollers;
use crate::ra_cache::Readahead;
use crate::reclaim_ctl::ReclaimCtl;
use crate::staging::Staging;
use crate::stats::Counters;
use crate::tier::Tiers;
use crate::uffd::{InstallMode, Uffd};
use crate::written::Harvest;
use crate::zero_pace::ZeroScan;
use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

pub(crate) struct Mm {
    pub id: u64,
    pub config: Config,
    /// Registered MISSING on regions (and WP in copy mode); faults and events arrive here.
    pub uffd: Uffd,
    /// MOVE or COPY (`InstallMode`): fixed when the engine starts.
    pub install: InstallMode,
    /// Where eviction harvests written bits, when the userfaultfd is async write-protect
    /// and `written_aging` is on (`written.rs`).
    pub written: Option<Harvest>,
    /// Copy mode: this engine's own zaps in flight, whose REMOVE events are not the
    /// program's (`own_zaps.rs`).
    pub own_zaps: OwnZaps,
    /// Where folios sit while neither mapped nor stored (`staging.rs`).
    pub staging: Staging,
    /// The pool and the swap file.
    pub tiers: Tiers,
    pub memcg: MemCg,
    pub lru: Lru,
    /// Where the zero scan is and how fast it may go (`zero_pace.rs`).
    pub zero_scan: ZeroScan,
    pub reclaim: ReclaimCtl,
    pub counters: Counters,
    /// Swap readahead: the copies read ahead, the slot-order state, the helper's queue.
    pub ra: Readahead,
    /// The event gate (see the lock order above and `gate.rs`).
    pub gate: RwLock<()>,
    pub events: EventQueue,
    /// Faults read by a thread that could not serve them at once (thread mode).
    pub deferred_faults: Mutex<VecDeque<(usize, u32)>>,
    /// Addresses whose faults were found not ours, and how often in a row (`fault.rs`).
    pub unserved: Streaks,
    /// Buffers being made resident for a system call (`kernel_access.rs`): while any is,
    /// large folios swap in whole whatever `swapin_enabled` says, so that a buffer comes
    /// back in a few faults rather than page by page, each page evictable again before
    /// the last is in; and what they bring back joins the active list (`fault.rs`,
    /// `mark_resident`), so that it is still there when the call copies it.
    pub prefaulting: AtomicUsize,
    /// Wakes the fault/event threads: stop, deferred faults, events to apply.
    pub kick_fd: OwnedFd,
    /// Which fault threads poll the userfaultfd (`pollers.rs`).
    pub pollers: Pollers,
    /// Wake-ups at SCHED_IDLE that keep a faulting thread on its CPU (`local_wake.rs`).
    pub local_wake: LocalWake,
    pub stop: AtomicBool,
    pub managed_bytes: AtomicU64,
    pub regions: AtomicU64,
    pub hooks: ReclaimHooks,
}

/// How charging reaches reclaim without importing it: `charge::reserve` calls these when
/// a charge would pass memory_high. The engine fills them in from `reclaim.rs` at start.
pub(crate) struct ReclaimHooks {
    /// Evict one folio (or write one pool entry back) in the faulting context.
    pub direct_reclaim: fn(&Mm) -> DirectReclaim,
    /// Empty the caches that hold charged memory nobody needs now (the staging reserve,
    /// unused readahead copies); returns the bytes freed.
    pub shrink_caches: fn(&Mm) -> u64,
}

/// What direct reclaim tells the charge that called it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DirectReclaim {
    /// Something left memory, or may soon (a busy candidate): try the charge again.
    ChargeAgain,
    /// Nothing could be evicted or written back.
    NothingFreed,
}

/// What one reclaim attempt achieved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

/// Keys seen again and again, a few at once: each key's count of sightings in a row, a
/// row ending where a key went unseen for `Streaks::GAP`. The least recently seen key
/// gives its slot to a new one.
#[derive(Default)]
pub(crate) struct Streaks(Mutex<[Option<(usize, u32, Instant)>; 8]>);

impl Streaks {
    /// Sightings further apart than this start a new row.
    const GAP: Duration = Duration::from_millis(100);

    /// Count `key` once more; how many times in a row it has now been seen.
    pub fn count(&self, key: usize) -> u32 {
        let now = Instant::now();
        let mut slots = self.0.lock().unwrap();
        let at = match slots.iter().position(|s| matches!(s, Some((k, ..)) if *k == key)) {
            Some(at) => at,
            None => {
                let stalest = slots.iter().enumerate().min_by_key(|(_, s)| s.map(|(.., seen)| seen)).map(|(at, _)| at).unwrap_or(0);
                slots[stalest] = Some((key, 0, now));
                stalest
            }
        };
        let (_, count, seen) = slots[at].as_mut().expect("the slot was just found or filled");
        *count = if now.duration_since(*seen) > Self::GAP { 1 } else { count.saturating_add(1) };
        *seen = now;
        *count
    }
}

#[cfg(test)]
mod tests {
    use super::Streaks;

    #[test]
    fn streaks_count_each_key_in_a_row_and_give_the_stalest_slot_away() {
        let streaks = Streaks::default();
        for _ in 0..3 {
            for key in 0..8 {
                streaks.count(key);
            }
        }
        // Eight keys interleaved keep their own rows.
        assert_eq!(streaks.count(5), 4);
        // A ninth key takes the slot of the least recently seen (key 0), which starts over.
        assert_eq!(streaks.count(100), 1);
        assert_eq!(streaks.count(0), 1);
        assert_eq!(streaks.count(5), 5);
    }
}
