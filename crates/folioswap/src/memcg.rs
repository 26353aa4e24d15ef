//! Charging memory against `memory_high`, as a memory cgroup does.
//!
//! `charged` is the sum of the components below, updated together so that a reservation is
//! one compare-and-swap: resident folios, swap-cache folios (unmapped, uncompressed, in
//! staging) and populated staging kept for reuse. With `charge_pool` the pool's footprint
//! counts too; it is read beside `charged` rather than folded in, since the pool changes
//! it from many threads.
//!
//! Watermarks follow kswapd: background reclaim starts above the high watermark and stops
//! under the low one, a *gap* apart (and a gap under the limit); a fault that would take
//! usage over the limit reclaims directly. The gap is memory the program does not get, so
//! it is as small as reclaim allows: limit/128 (at least 256K), while the folios evicted
//! are small ones that leave in microseconds; up to limit/32 (at least 2M, at most 64M)
//! while they are 2 MiB folios, each of which frees its memory only once compressed (a
//! millisecond): then faults would otherwise stall in direct reclaim. The gap follows the
//! recent mean size `m` of the folios evicted (`note_eviction`), between the two: `4m(1 +
//! m/2M)`, 8 times a 2 MiB folio and about 4 times a small one, which leaves faster. On a
//! 34M limit the smaller gap cut a random-access program's faults by a quarter; a
//! sequential 2 MiB stream at 512M ran at 60% of its speed with it (BENCHMARKS.md, "A
//! watermark gap that follows the evictions"). At 41M, 4 instead of 8 times a 64 KiB
//! folio halved the dict program's faults, its working set just over the limit
//! (BENCHMARKS.md, "A gap of four small folios"). It follows the folio, not the run of
//! small folios evicted together, unless the run fills a whole 2 MiB batch (a stream's,
//! which needs the gap a 2 MiB folio does); and a batch of folios taken off the LRU is
//! never longer than the gap (`evict.rs` `extend_batch`; a 4 KiB victim's cluster is at
//! most 2^`evict_cluster` pages, 64K by default, under the smallest gap). At a 41M limit runs of 64 KiB folios up to 2 MiB had made the gap 2M,
//! kept usage up to 4M under the limit, and cost the dict program a third more faults
//! (BENCHMARKS.md, "The gap follows the folio, not the run").
//!
//! Several processes can share one limit, as the processes of one cgroup do
//! (`shared_limit`, set by `folioswap run`): the limit and watermarks then apply to the
//! sum of every process's charge, kept in a file all of them map (`SharedLimit`). Each
//! process still reclaims only its own folios; one with nothing left to reclaim waits for
//! the others and is finally let past the limit (`memory_high_overrun`), since memory.high
//! throttles rather than kills. Around fork the engine *suspends* the limit: charges
//! always succeed and nothing is reclaimed while every swapped folio is brought back.

use crate::size::HUGE_SIZE;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Component {
    Resident,
    SwapCache,
    StagingFree,
}

pub(crate) struct MemCg {
    pub limit: Option<u64>,
    /// The watermark gap's bounds: for small folios evicted, and for 2 MiB ones.
    min_gap: u64,
    max_gap: u64,
    /// The mean size in bytes of what recent evictions freed at a time (`note_eviction`;
    /// an exponential average, updated without a lock: a lost update only delays it).
    mean_folio: AtomicU64,
    pub charge_pool: bool,
    charged: AtomicU64,
    resident: AtomicU64,
    swapcache: AtomicU64,
    staging_free: AtomicU64,
    /// Holders of a suspension (fork, `Engine::quiesce`): while any, charges always
    /// succeed and reclaim stands still.
    suspended: AtomicU32,
    /// The charge of every process sharing the limit, if it is shared.
    shared: Option<SharedLimit>,
    /// The most this process's whole cost has been over the limit (`note_overrun`).
    overrun_peak: AtomicU64,
}

impl MemCg {
    pub fn new(limit: Option<u64>, charge_pool: bool) -> MemCg {
        let (min_gap, max_gap) = match limit {
            Some(limit) => {
                let max_gap = (limit / 32).clamp(2 << 20, 64 << 20).min(limit / 4);
                ((limit / 128).max(256 << 10).min(max_gap), max_gap)
            }
            None => (0, 0),
        };
        MemCg {
            limit,
            min_gap,
            max_gap,
            mean_folio: AtomicU64::new(0),
            charge_pool,
            charged: AtomicU64::new(0),
            resident: AtomicU64::new(0),
            swapcache: AtomicU64::new(0),
            staging_free: AtomicU64::new(0),
            suspended: AtomicU32::new(0),
            shared: None,
            overrun_peak: AtomicU64::new(0),
        }
    }

    /// Share the limit with the other processes that attach to the file at `path`.
    pub fn with_shared(mut self, path: &Path) -> std::io::Result<MemCg> {
        self.shared = Some(SharedLimit::attach(path)?);
        Ok(self)
    }

    /// The shared limit this process takes part in, until it detaches.
    pub fn shared(&self) -> Option<&SharedLimit> {
        self.shared.as_ref().filter(|s| !s.detached.load(Ordering::Acquire))
    }

    /// The charge the limit applies to: this process's, or every sharing process's.
    fn total(&self) -> &AtomicU64 {
        match self.shared() {
            Some(shared) => shared.total(),
            None => &self.charged,
        }
    }

    /// Suspend the limit until the matching `resume` (suspensions nest).
    pub fn suspend(&self) {
        self.suspended.fetch_add(1, Ordering::SeqCst);
    }

    pub fn resume(&self) {
        let before = self.suspended.fetch_sub(1, Ordering::SeqCst);
        debug_assert!(before > 0, "resume without suspend");
    }

    pub fn is_suspended(&self) -> bool {
        self.suspended.load(Ordering::SeqCst) > 0
    }

    fn counter(&self, c: Component) -> &AtomicU64 {
        match c {
            Component::Resident => &self.resident,
            Component::SwapCache => &self.swapcache,
            Component::StagingFree => &self.staging_free,
        }
    }

    /// This process's usage (its charges, plus its pool with `charge_pool`).
    pub fn usage(&self, pool_footprint: u64) -> u64 {
        self.charged.load(Ordering::Relaxed) + if self.charge_pool { pool_footprint } else { 0 }
    }

    /// Usage compared against the limit and watermarks: with a shared limit, every
    /// sharing process's charges plus this process's pool.
    pub fn limited_usage(&self, pool_footprint: u64) -> u64 {
        self.total().load(Ordering::Relaxed) + if self.charge_pool { pool_footprint } else { 0 }
    }

    /// Charge `n` bytes to `c` if that keeps usage within the limit.
    pub fn try_charge(&self, c: Component, n: u64, pool_footprint: u64) -> bool {
        if self.is_suspended() {
            self.charge(c, n);
            return true;
        }
        let pool = if self.charge_pool { pool_footprint } else { 0 };
        let limit = self.limit.unwrap_or(u64::MAX);
        let total = self.total();
        let mut cur = total.load(Ordering::Relaxed);
        loop {
            if cur.saturating_add(n).saturating_add(pool) > limit {
                return false;
            }
            match total.compare_exchange_weak(cur, cur + n, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    if let Some(shared) = self.shared() {
                        shared.mine().fetch_add(n, Ordering::Relaxed);
                        self.charged.fetch_add(n, Ordering::AcqRel);
                    }
                    self.counter(c).fetch_add(n, Ordering::Relaxed);
                    return true;
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// Charge unconditionally (memory that already exists, e.g. a folio put back).
    pub fn charge(&self, c: Component, n: u64) {
        if let Some(shared) = self.shared() {
            shared.total().fetch_add(n, Ordering::AcqRel);
            shared.mine().fetch_add(n, Ordering::Relaxed);
        }
        self.charged.fetch_add(n, Ordering::AcqRel);
        self.counter(c).fetch_add(n, Ordering::Relaxed);
    }

    pub fn uncharge(&self, c: Component, n: u64) {
        self.counter(c).fetch_sub(n, Ordering::Relaxed);
        self.charged.fetch_sub(n, Ordering::AcqRel);
        if let Some(shared) = self.shared() {
            shared.mine().fetch_sub(n, Ordering::Relaxed);
            shared.total().fetch_sub(n, Ordering::AcqRel);
        }
    }

    /// Move `n` charged bytes from one component to another (no change in usage).
    pub fn transfer(&self, from: Component, to: Component, n: u64) {
        self.counter(from).fetch_sub(n, Ordering::Relaxed);
        self.counter(to).fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self, c: Component) -> u64 {
        self.counter(c).load(Ordering::Relaxed)
    }

    /// How far this process's charges plus its pool (charged or not) are over the limit.
    pub fn overrun(&self, pool_footprint: u64) -> u64 {
        let cost = self.charged.load(Ordering::Relaxed) + pool_footprint;
        self.limit.map_or(0, |limit| cost.saturating_sub(limit))
    }

    /// Record the overrun now in the peak; returns it.
    pub fn note_overrun(&self, pool_footprint: u64) -> u64 {
        let now = self.overrun(pool_footprint);
        self.overrun_peak.fetch_max(now, Ordering::Relaxed);
        now
    }

    pub fn overrun_peak(&self) -> u64 {
        self.overrun_peak.load(Ordering::Relaxed)
    }

    /// A run of folios left memory, freeing `bytes` at a time (a folio's size, or a whole
    /// stream batch's): the watermark gap follows it.
    pub fn note_eviction(&self, bytes: u64) {
        let mean = self.mean_folio.load(Ordering::Relaxed);
        self.mean_folio.store(mean - mean / 8 + bytes / 8, Ordering::Relaxed);
    }

    /// How far apart the watermarks are, and the high one from the limit: `4m(1 + m/2M)`
    /// for a mean `m` of what evictions freed at a time, 8 times a 2 MiB folio's size,
    /// about 4 times a small folio's.
    pub fn watermark_gap(&self) -> u64 {
        let mean = self.mean_folio.load(Ordering::Relaxed);
        (4 * mean + 4 * mean * mean / HUGE_SIZE as u64).clamp(self.min_gap, self.max_gap)
    }

    /// Above the high watermark: background reclaim starts.
    pub fn above_high(&self, pool_footprint: u64) -> bool {
        self.above(1, pool_footprint)
    }

    /// Above the low watermark: background reclaim goes on.
    pub fn above_low(&self, pool_footprint: u64) -> bool {
        self.above(2, pool_footprint)
    }

    /// Usage above `gaps` watermark gaps under the limit.
    fn above(&self, gaps: u64, pool_footprint: u64) -> bool {
        let Some(limit) = self.limit else { return false };
        !self.is_suspended() && self.limited_usage(pool_footprint) > limit - gaps * self.watermark_gap()
    }
}

/// Processes that can share one limit.
const SHARED_SLOTS: usize = 1024;
const SHARED_MAGIC: u64 = u64::from_le_bytes(*b"fswpmcg1");

/// The file every process sharing a limit maps: the sum of their charges and each one's
/// share, so that the share of a process that died without uncharging can be taken back.
#[repr(C)]
struct SharedPage {
    magic: AtomicU64,
    total: AtomicU64,
    slots: [SharedSlot; SHARED_SLOTS],
}

#[repr(C)]
struct SharedSlot {
    /// The owner's pid; 0: free; u32::MAX: being reaped.
    pid: AtomicU32,
    charged: AtomicU64,
}

/// This process's attachment to a shared limit.
pub(crate) struct SharedLimit {
    page: *const SharedPage,
    slot: usize,
    /// Set by `detach`: the slot is no longer this process's.
    detached: AtomicBool,
}

// SAFETY: the page is a shared mapping that lives as long as this value and is only
// accessed through atomics.
unsafe impl Send for SharedLimit {}
// SAFETY: as above.
unsafe impl Sync for SharedLimit {}

impl SharedLimit {
    /// Map the accounting file at `path` (created zero-filled if missing) and claim a slot.
    pub fn attach(path: &Path) -> std::io::Result<SharedLimit> {
        use std::os::fd::AsRawFd;
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        let len = std::mem::size_of::<SharedPage>();
        if file.metadata()?.len() < len as u64 {
            file.set_len(len as u64)?;
        }
        // SAFETY: a shared mapping of a file this function holds open; the kernel picks
        // the address. The mapping outlives the descriptor, which closes on return.
        let p = unsafe {
            crate::sys::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, file.as_raw_fd(), 0)
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: advice on the mapping just made: a forked child attaches on its own.
        unsafe { crate::sys::madvise(p, len, libc::MADV_DONTFORK) };
        let page = p as *const SharedPage;
        // SAFETY: the mapping is `len` bytes of zeroes or of a SharedPage, all atomics.
        let shared = unsafe { &*page };
        let _ = shared.magic.compare_exchange(0, SHARED_MAGIC, Ordering::AcqRel, Ordering::Relaxed);
        if shared.magic.load(Ordering::Acquire) != SHARED_MAGIC {
            return Err(std::io::Error::other(format!("{} is not a folioswap shared-limit file", path.display())));
        }
        // SAFETY: getpid cannot fail.
        let pid = unsafe { libc::getpid() } as u32;
        let mut limit = SharedLimit { page, slot: 0, detached: AtomicBool::new(false) };
        for _ in 0..2 {
            for (i, slot) in shared.slots.iter().enumerate() {
                if slot.pid.compare_exchange(0, pid, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                    limit.slot = i;
                    return Ok(limit);
                }
            }
            limit.reap_dead();
        }
        Err(std::io::Error::other(format!("more than {SHARED_SLOTS} processes share the limit in {}", path.display())))
    }

    fn page(&self) -> &SharedPage {
        // SAFETY: mapped in `attach` and never unmapped while `self` lives.
        unsafe { &*self.page }
    }

    pub fn total(&self) -> &AtomicU64 {
        &self.page().total
    }

    fn mine(&self) -> &AtomicU64 {
        &self.page().slots[self.slot].charged
    }

    /// Take back the charges of processes that died without giving them back. Returns
    /// the bytes taken back.
    pub fn reap_dead(&self) -> u64 {
        let mut reaped = 0;
        for (i, slot) in self.page().slots.iter().enumerate() {
            let pid = slot.pid.load(Ordering::Acquire);
            if i == self.slot || pid == 0 || pid == u32::MAX {
                continue;
            }
            // SAFETY: signal 0 only checks that the process exists.
            let dead = unsafe { libc::kill(pid as i32, 0) } != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
            if dead && slot.pid.compare_exchange(pid, u32::MAX, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                let n = slot.charged.swap(0, Ordering::AcqRel);
                self.total().fetch_sub(n, Ordering::AcqRel);
                slot.pid.store(0, Ordering::Release);
                reaped += n;
            }
        }
        reaped
    }

    /// Give this process's charges back and its slot up (at exit).
    pub fn detach(&self) {
        if self.detached.swap(true, Ordering::AcqRel) {
            return;
        }
        let slot = &self.page().slots[self.slot];
        let n = slot.charged.swap(0, Ordering::AcqRel);
        self.total().fetch_sub(n, Ordering::AcqRel);
        slot.pid.store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_stay_within_limit() {
        let m = MemCg::new(Some(64 << 20), false);
        assert!(m.watermark_gap() > 0 && 2 * m.watermark_gap() < 64 << 20);
        let mut n = 0;
        while m.try_charge(Component::Resident, 2 << 20, 0) {
            n += 1;
        }
        assert_eq!(n, 32);
        m.transfer(Component::Resident, Component::SwapCache, 2 << 20);
        assert!(!m.try_charge(Component::Resident, 4096, 0));
        m.uncharge(Component::SwapCache, 2 << 20);
        assert!(m.try_charge(Component::Resident, 2 << 20, 0));
        assert_eq!(m.usage(0), 64 << 20);
    }

    /// The gap is small while the folios evicted are small, grows to limit/32 while they
    /// are 2 MiB ones, and comes back down once they are small again.
    #[test]
    fn watermark_gap_follows_the_evicted_folios() {
        let m = MemCg::new(Some(512 << 20), false);
        assert_eq!(m.watermark_gap(), 4 << 20);
        let usage = (512 << 20) - (6 << 20);
        assert!(m.try_charge(Component::Resident, usage, 0));
        // 6M under the limit: between the watermarks of a 4M gap, above both of a 16M one.
        assert!(!m.above_high(0) && m.above_low(0));
        (0..64).for_each(|_| m.note_eviction(2 << 20));
        assert!(m.watermark_gap() > 15 << 20 && m.watermark_gap() <= 16 << 20);
        assert!(m.above_high(0) && m.above_low(0));
        (0..64).for_each(|_| m.note_eviction(4096));
        assert_eq!(m.watermark_gap(), 4 << 20);
        // Small limits keep a gap of at least 256K, and never more than a quarter of it.
        assert_eq!(MemCg::new(Some(34 << 20), false).watermark_gap(), (34 << 20) / 128);
        assert_eq!(MemCg::new(Some(16 << 20), false).watermark_gap(), 256 << 10);
        let tiny = MemCg::new(Some(8 << 20), false);
        (0..64).for_each(|_| tiny.note_eviction(2 << 20));
        assert_eq!(tiny.watermark_gap(), 2 << 20);
        // Small folios leave fast: about four of them, where 2 MiB ones keep eight.
        let small = MemCg::new(Some(128 << 20), false);
        (0..256).for_each(|_| small.note_eviction(256 << 10));
        let gap = small.watermark_gap();
        assert!(gap > (1 << 20) && gap <= (1 << 20) + (128 << 10), "gap {gap} after 256K folios");
        assert!(!MemCg::new(None, false).above_high(u64::MAX));
    }

    #[test]
    fn pool_counts_only_when_charged() {
        let m = MemCg::new(Some(16 << 20), true);
        assert!(!m.try_charge(Component::Resident, 8 << 20, 10 << 20));
        let m = MemCg::new(Some(16 << 20), false);
        assert!(m.try_charge(Component::Resident, 8 << 20, 10 << 20));
    }
}
