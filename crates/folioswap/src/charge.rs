//! Charging memory against memory_high (the kernel's `try_charge_memcg`): a fault
//! reserves the bytes of the folio it is about to install, readahead the copies it makes.
//!
//! [`reserve`] never fails while something can still give: it reclaims directly (through
//! `Mm::hooks`, so that charging does not depend on the reclaim paths), waits for
//! evictions in flight and for other faults' charges to become evictable folios, empties
//! the caches that hold charged memory, and with a limit
//! shared between processes waits for the others and then lets the charge past the limit
//! (`memory_high_overrun`), as memory.high throttles rather than kills. It fails only when
//! nothing can be evicted or stored and no reclaim is in flight: [`Oom`] says why.

use crate::memcg::Component;
use crate::mm::{DirectReclaim, Mm};
use crate::reclaim_ctl::Wait;
use crate::size::format_bytes;
use std::fmt;

/// Why memory_high cannot be kept: the message a refused fault carries.
#[derive(Debug)]
pub(crate) struct Oom {
    /// "memory_high=… (… charged: … resident, …)".
    pub usage: String,
    pub why: OomReason,
}

#[derive(Debug)]
pub(crate) enum OomReason {
    /// The swap file is full and the pool cannot take the rest.
    SwapFileFull { slots_used: u64, slots_total: u64, slots_bad: u64, disk_full: bool, pool: u64, max_pool: u64 },
    /// The pool is full and there is no swap file.
    PoolFull { pool: u64, max_pool: u64 },
    /// Every resident folio is held by a fault in progress.
    AllInUse,
    /// The tier behind the pool takes no writes now (the remote tier's cluster is down).
    TierDown(String),
}

impl fmt::Display for Oom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot keep {}: ", self.usage)?;
        match &self.why {
            OomReason::SwapFileFull { slots_used, slots_total, slots_bad, disk_full, pool, max_pool } => write!(
                f,
                "the swap file has no room ({slots_used} of {slots_total} slots used, {slots_bad} bad{}) and the \
                 compressed pool cannot take the rest ({} of max_pool {}); use a larger swap file, or raise \
                 max_pool or memory_high",
                if *disk_full { "; the filesystem under it is full" } else { "" },
                format_bytes(*pool),
                format_bytes(*max_pool)
            ),
            OomReason::PoolFull { pool, max_pool } => write!(
                f,
                "the compressed pool is full ({} of max_pool {}) and there is no swap file to write back to; \
                 configure one (FOLIOSWAP_SWAP_FILE), or raise max_pool or memory_high",
                format_bytes(*pool),
                format_bytes(*max_pool)
            ),
            OomReason::AllInUse => {
                write!(f, "every resident folio is in use by a fault in progress; raise memory_high or use a smaller folio size")
            }
            OomReason::TierDown(why) => write!(f, "nothing can leave memory: {why}"),
        }
    }
}

/// Charge `bytes` to `c` if that keeps usage within the limit; past the high watermark,
/// wake a reclaimer to make room, as after any charge. Never reclaims here.
pub(crate) fn try_charge(mm: &Mm, c: Component, bytes: u64) -> bool {
    let pool = mm.tiers.pool_bytes();
    if !mm.memcg.try_charge(c, bytes, pool) {
        return false;
    }
    if mm.memcg.above_high(pool) {
        mm.reclaim.wake_one();
    }
    true
}

/// A fault's charge from `reserve` until its folio is installed (on the LRU, evictable) or
/// the charge is given back: while any exists, another fault that finds memory_high full
/// waits for it instead of failing. Dropping it ends the wait; the charge itself stays
/// (Resident) or is uncharged by the caller.
#[must_use = "the reservation must live until the folio is installed"]
pub(crate) struct Reservation<'a> {
    mm: &'a Mm,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.mm.reclaim.end_fault_charge();
    }
}

fn reservation(mm: &Mm) -> Reservation<'_> {
    mm.reclaim.begin_fault_charge();
    Reservation { mm }
}

/// Reserve `bytes` of resident memory for a fault, reclaiming directly when that would
/// pass memory_high, and waiting while other faults hold charges they are about to turn
/// into evictable folios: a fault fails only when nothing else can give.
pub(crate) fn reserve(mm: &Mm, bytes: u64) -> Result<Reservation<'_>, Oom> {
    /// Milliseconds a fault waits for other processes sharing the limit to reclaim.
    const SHARED_WAIT: u32 = 200;
    let mut stalled = false;
    let mut waited = 0;
    let mut usage_at_try = u64::MAX;
    loop {
        if try_charge(mm, Component::Resident, bytes) {
            return Ok(reservation(mm));
        }
        usage_at_try = usage_at_try.min(mm.memcg.limited_usage(mm.tiers.pool_bytes()));
        if !stalled {
            mm.counters.vm.allocstall.inc();
            stalled = true;
        }
        mm.reclaim.wake_all();
        if (mm.hooks.direct_reclaim)(mm) == DirectReclaim::ChargeAgain {
            continue;
        }
        if mm.reclaim.wait_for_progress() == Wait::Waited {
            continue;
        }
        if (mm.hooks.shrink_caches)(mm) > 0 {
            continue;
        }
        // Each step above found nothing, but memory may have come back between the charge
        // that failed and now (an eviction that finished, a fault that installed): fail
        // only if the charge still fails with usage no lower than it was.
        if try_charge(mm, Component::Resident, bytes) {
            return Ok(reservation(mm));
        }
        let now = mm.memcg.limited_usage(mm.tiers.pool_bytes());
        if now < usage_at_try {
            usage_at_try = now;
            continue;
        }
        // Another thread may have refilled a cache since it was emptied above (a swap-in
        // or an eviction that put its staging slot back into the reserve): usage is then
        // no lower, but not stuck. Empty it again before giving up.
        if (mm.hooks.shrink_caches)(mm) > 0 {
            continue;
        }
        if let Some(shared) = mm.memcg.shared() {
            // Nothing of ours to reclaim: the other processes sharing the limit must
            // make room. Give them time, then go past the limit rather than fail.
            let pool_stuck = mm.tiers.pool_is_full() && mm.tiers.file.is_none();
            if !pool_stuck && shared.reap_dead() == 0 && waited < SHARED_WAIT {
                waited += 1;
                std::thread::sleep(std::time::Duration::from_millis(1));
                continue;
            }
            if !pool_stuck {
                mm.counters.vm.memory_high_overrun.inc();
                mm.memcg.charge(Component::Resident, bytes);
                return Ok(reservation(mm));
            }
        }
        return Err(oom(mm));
    }
}

/// Why memory_high cannot be kept, with the figures that show it.
fn oom(mm: &Mm) -> Oom {
    let pool = &mm.tiers.zswap.pool;
    let fp = pool.footprint_bytes();
    let usage = format!(
        "memory_high={} ({} charged: {} resident in {} folios on the LRU, {} in the swap cache, {} kept staging, {} pool{})",
        format_bytes(mm.memcg.limit.unwrap_or(0)),
        format_bytes(mm.memcg.usage(fp)),
        format_bytes(mm.memcg.get(Component::Resident)),
        mm.lru.len(),
        format_bytes(mm.memcg.get(Component::SwapCache)),
        format_bytes(mm.memcg.get(Component::StagingFree)),
        format_bytes(fp),
        if mm.memcg.charge_pool { " (charged)" } else { "" }
    );
    let why = if let Some(down) = mm.tiers.file.as_ref().and_then(|dev| dev.io.down()) {
        OomReason::TierDown(down)
    } else if let Some(dev) = mm.tiers.file.as_ref().filter(|dev| !dev.has_free_slots()) {
        let stat = dev.stat();
        OomReason::SwapFileFull {
            slots_used: stat.slots_used,
            slots_total: stat.slots_total,
            slots_bad: stat.slots_bad,
            disk_full: stat.disk_full,
            pool: fp,
            max_pool: pool.cap(),
        }
    } else if mm.tiers.pool_is_full() && mm.tiers.file.is_none() {
        OomReason::PoolFull { pool: fp, max_pool: pool.cap() }
    } else {
        OomReason::AllInUse
    };
    Oom { usage, why }
}
