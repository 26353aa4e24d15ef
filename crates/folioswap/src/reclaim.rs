//! Reclaim: who evicts, and when (memory.high semantics, see `memcg.rs`).
//!
//! - `kswapd`, the background reclaimers: asleep under the high watermark, evicting down
//!   to the low one, and running the zero scan between evictions (`zero_scan.rs`). With a swap file they are also zswap's shrink worker: they write the
//!   pool's oldest entries back, a batch at a time, while the pool is over its accept
//!   threshold.
//! - `direct_reclaim`, from a fault whose charge would pass memory_high
//!   (`charge::reserve`, through `Mm::hooks`): one eviction in the faulting context.
//! - Before either writes back or evicts, a background reclaimer compacts the pool where
//!   it has grown sparse (`compact.rs`): given back, its free pages are room for resident
//!   memory with no I/O and no fault.
//! - `shrink_caches`, when neither can free anything: empty the staging reserve, the
//!   unused readahead copies and the pool's free pages, which hold charged memory nobody
//!   needs now.
//!
//! An eviction itself is `evict.rs`; writeback is `writeback.rs`.

use crate::compact::compact_pool_if_due;
use crate::evict::{shrink_one, Reclaimer};
use crate::mm::{DirectReclaim, Mm, Reclaimed};
use crate::readahead::drain_readahead;
use crate::writeback::{writeback_batch, writeback_one, WRITEBACK_BATCH};
use crate::zero_scan::scan_for_zeros;
use crate::zswap::CodecScratch;
use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

thread_local! {
    static DIRECT_SCRATCH: RefCell<CodecScratch> = RefCell::new(CodecScratch::new());
}

/// A background reclaimer: sleeps under the high watermark, evicts down to the low one.
pub(crate) fn kswapd(mm: Arc<Mm>) {
    let mut scratch = CodecScratch::new();
    let stopping = || mm.stop.load(Ordering::Acquire);
    while !stopping() {
        compact_pool_if_due(&mm);
        while !stopping() && mm.tiers.needs_writeback(&mm.memcg) {
            if writeback_batch(&mm, &mut scratch, WRITEBACK_BATCH) == 0 {
                break;
            }
        }
        if !mm.memcg.above_high(mm.tiers.pool_bytes()) {
            // Other processes sharing the limit charge it without waking this one.
            let nap = if mm.memcg.shared().is_some() { 10 } else { 200 };
            mm.reclaim.sleep(Duration::from_millis(nap));
            continue;
        }
        // A process that shared the limit and died without giving its charge back: take
        // its share back before evicting anything of ours for it. (A fault that finds
        // nothing of its own to reclaim does too, `charge::reserve`; while there is
        // something, that alone left a dead share standing for good.)
        if let Some(shared) = mm.memcg.shared() {
            if shared.reap_dead() > 0 {
                continue;
            }
        }
        while !stopping() && mm.memcg.above_low(mm.tiers.pool_bytes()) {
            if compact_pool_if_due(&mm) > 0 {
                continue;
            }
            if mm.config.zero_scan {
                scan_for_zeros(&mm);
            }
            match shrink_one(&mm, &mut scratch, Reclaimer::Kswapd) {
                Reclaimed::Freed => {}
                Reclaimed::Busy => std::thread::yield_now(),
                Reclaimed::Nothing | Reclaimed::PoolFull => {
                    if writeback_batch(&mm, &mut scratch, WRITEBACK_BATCH) > 0 {
                        continue;
                    }
                    mm.reclaim.sleep(Duration::from_millis(10));
                    break;
                }
            }
        }
    }
}

/// Direct reclaim from the fault path: evict one folio in the faulting context (or,
/// when nothing can be evicted, write one pool entry back: with `charge_pool` the pool
/// itself may be what is over the limit).
pub(crate) fn direct_reclaim(mm: &Mm) -> DirectReclaim {
    let busy = || {
        std::thread::sleep(Duration::from_micros(200));
        DirectReclaim::ChargeAgain
    };
    DIRECT_SCRATCH.with(|s| {
        // Already borrowed: a reclaim re-entered on this thread (`Reclaimed::Busy` too).
        let Ok(mut scratch) = s.try_borrow_mut() else { return busy() };
        match shrink_one(mm, &mut scratch, Reclaimer::Direct) {
            Reclaimed::Freed => DirectReclaim::ChargeAgain,
            Reclaimed::Busy => busy(),
            Reclaimed::Nothing | Reclaimed::PoolFull if writeback_one(mm, &mut scratch) => DirectReclaim::ChargeAgain,
            Reclaimed::Nothing | Reclaimed::PoolFull => DirectReclaim::NothingFreed,
        }
    })
}

/// Memory is short and nothing can be evicted: empty the staging reserve (and the open
/// batch slot, if its members are done), or failing
/// that drop the unused readahead copies, or failing that give the pool's free but
/// populated pages back (its slack, which counts against memory_high when the pool is
/// charged). Returns the bytes freed.
pub(crate) fn shrink_caches(mm: &Mm) -> u64 {
    let freed = mm.staging.drain_reserve(&mm.memcg) + mm.staging.close_open_batch(&mm.memcg);
    if freed > 0 {
        return freed;
    }
    let freed = drain_readahead(mm);
    if freed > 0 {
        return freed;
    }
    let pool = &mm.tiers.zswap.pool;
    let before = pool.footprint_bytes();
    pool.shrink_slack(0);
    before.saturating_sub(pool.footprint_bytes())
}
