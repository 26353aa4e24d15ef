//! How faults and reclaimers wait for each other: kswapd's wait queue, the progress
//! signal that evictions raise as folios leave memory, and the count of background work
//! under way (evictions, writeback, readahead) that fork and `Engine::quiesce` wait out. State only; the paths are `reclaim.rs` and `evict.rs`.
//!
//! Both mutexes here are leaves: nothing else is taken while one is held.

use crate::memcg::MemCg;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

#[derive(Default)]
pub(crate) struct ReclaimCtl {
    sleep: Mutex<u64>,
    wake: Condvar,
    sleeping: AtomicUsize,
    /// A wake sent that no reclaimer has taken up yet. Every fault above the high
    /// watermark asks for a reclaimer, one every few microseconds, and the woken one
    /// takes longer than that to run: without this each would be a futex call.
    wake_pending: AtomicBool,
    progress: Mutex<u64>,
    progress_cv: Condvar,
    /// Folios moved out and not yet published (being compressed or written now), and pool
    /// entries taken for writeback and not yet published to the file or put back.
    inflight: AtomicU64,
    /// Faults holding a charge for a folio they have not yet installed: what a fault that
    /// finds memory_high full may wait for (`charge::reserve`).
    fault_charges: AtomicUsize,
    /// Threads in `wait_for_progress`: a fault that ends wakes them only if there are any.
    progress_waiters: AtomicUsize,
    /// Work under way that moves folios between memory and the tiers on its own accord:
    /// evictions, pool writeback, readahead (see `begin_work`).
    active: AtomicUsize,
}

/// One piece of background work under way; see [`ReclaimCtl::quiesce`].
pub(crate) struct Activity<'a>(&'a AtomicUsize);

impl Drop for Activity<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What [`ReclaimCtl::wait_for_progress`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Waited (at most 50 ms) for a folio in flight to be published, or for a fault
    /// holding a charge to install its folio.
    Waited,
    /// Nothing was in flight: waiting could not help.
    NothingInFlight,
}

impl ReclaimCtl {
    /// Wake one sleeping reclaimer, if any sleeps and none is being woken already.
    pub fn wake_one(&self) {
        if self.sleeping.load(Ordering::Relaxed) > 0
            && !self.wake_pending.load(Ordering::Relaxed)
            && !self.wake_pending.swap(true, Ordering::AcqRel)
        {
            *self.sleep.lock().unwrap() += 1;
            self.wake.notify_one();
        }
    }

    pub fn wake_all(&self) {
        *self.sleep.lock().unwrap() += 1;
        self.wake.notify_all();
    }

    /// A reclaimer sleeps until woken or `timeout` passes. Whichever way it wakes, it
    /// takes up the pending wake; one left pending while nobody slept (its sleeper timed
    /// out as it was sent) is cleared here, under the lock, before this one sleeps, so
    /// that no sleeper is left waiting behind a stale one. False where it timed out.
    pub fn sleep(&self, timeout: Duration) -> bool {
        let guard = self.sleep.lock().unwrap();
        self.wake_pending.store(false, Ordering::Release);
        self.sleeping.fetch_add(1, Ordering::Relaxed);
        let (guard, waited) = self.wake.wait_timeout(guard, timeout).unwrap();
        drop(guard);
        self.sleeping.fetch_sub(1, Ordering::Relaxed);
        self.wake_pending.store(false, Ordering::Release);
        !waited.timed_out()
    }

    pub fn notify_progress(&self) {
        *self.progress.lock().unwrap() += 1;
        self.progress_cv.notify_all();
    }

    /// Start an eviction, a writeback or a readahead, unless the limit is suspended
    /// (around fork, or while the engine is quiesced): then none starts.
    pub fn begin_work(&self, memcg: &MemCg) -> Option<Activity<'_>> {
        // Counted before the check, so that `quiesce` (suspend, then wait for zero)
        // never misses one that saw the limit still in force.
        self.active.fetch_add(1, Ordering::SeqCst);
        let guard = Activity(&self.active);
        (!memcg.is_suspended()).then_some(guard)
    }

    /// `n` folios left memory and are being stored.
    pub fn begin_store(&self, n: usize) {
        self.inflight.fetch_add(n as u64, Ordering::AcqRel);
    }

    /// One of them is published (or given back): wake whoever waits for progress.
    pub fn end_store(&self) {
        self.end_stores(1);
    }

    /// `n` of them are published or given back at once: wake whoever waits for progress,
    /// if anyone does (each store would otherwise be a futex call).
    pub fn end_stores(&self, n: usize) {
        // SeqCst with the waiter's two steps, as in `end_fault_charge`.
        self.inflight.fetch_sub(n as u64, Ordering::SeqCst);
        if self.progress_waiters.load(Ordering::SeqCst) > 0 {
            self.notify_progress();
        }
    }

    /// A fault took a charge for a folio it is about to install.
    pub fn begin_fault_charge(&self) {
        self.fault_charges.fetch_add(1, Ordering::SeqCst);
    }

    /// The fault has installed its folio (now on the LRU, evictable) or given its charge
    /// back: wake whoever waits for memory.
    pub fn end_fault_charge(&self) {
        // SeqCst with the waiter's two steps: either it sees this charge gone, or this
        // sees it waiting (the wait is bounded either way).
        self.fault_charges.fetch_sub(1, Ordering::SeqCst);
        if self.progress_waiters.load(Ordering::SeqCst) > 0 {
            self.notify_progress();
        }
    }

    /// Wait for the background work under way to finish. Called with the limit
    /// suspended, so that none starts.
    pub fn quiesce(&self) {
        while self.active.load(Ordering::SeqCst) > 0 || self.inflight.load(Ordering::Acquire) > 0 {
            if self.wait_for_progress() == Wait::NothingInFlight {
                std::thread::yield_now();
            }
        }
    }

    /// Wait for a folio in flight to be published, or another fault's charge to settle
    /// (the caller holds none: a fault waits here only before its own charge).
    pub fn wait_for_progress(&self) -> Wait {
        self.progress_waiters.fetch_add(1, Ordering::SeqCst);
        let guard = self.progress.lock().unwrap();
        let waited = if self.inflight.load(Ordering::SeqCst) == 0 && self.fault_charges.load(Ordering::SeqCst) == 0 {
            Wait::NothingInFlight
        } else {
            let seen = *guard;
            let _ = self.progress_cv.wait_timeout_while(guard, Duration::from_millis(50), |p| *p == seen).unwrap();
            Wait::Waited
        };
        self.progress_waiters.fetch_sub(1, Ordering::AcqRel);
        waited
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn wakes_sent(ctl: &ReclaimCtl) -> u64 {
        *ctl.sleep.lock().unwrap()
    }

    #[test]
    fn a_wake_not_yet_taken_up_is_not_sent_again() {
        let ctl = ReclaimCtl::default();
        // A sleeper (counted, as `sleep` counts it) that has not run since the first wake.
        ctl.sleeping.store(1, Ordering::Relaxed);
        ctl.wake_one();
        ctl.wake_one();
        assert_eq!(wakes_sent(&ctl), 1);
        // It ran, and went back to sleep: the next wake is sent.
        ctl.wake_pending.store(false, Ordering::Release);
        ctl.wake_one();
        assert_eq!(wakes_sent(&ctl), 2);
        ctl.sleeping.store(0, Ordering::Relaxed);
        ctl.wake_one();
        assert_eq!(wakes_sent(&ctl), 2, "nobody sleeps: nothing to send");
    }

    #[test]
    fn a_wake_left_pending_while_nobody_slept_does_not_keep_the_next_sleeper_asleep() {
        let ctl = Arc::new(ReclaimCtl::default());
        // Sent as its only sleeper timed out: pending, and nobody asleep to take it up.
        ctl.wake_pending.store(true, Ordering::Release);
        let sleeper = {
            let ctl = ctl.clone();
            // Long enough that only a lost wake lets it time out.
            std::thread::spawn(move || ctl.sleep(Duration::from_secs(120)))
        };
        while ctl.sleeping.load(Ordering::Relaxed) == 0 {
            std::thread::yield_now();
        }
        ctl.wake_one();
        assert!(sleeper.join().unwrap(), "the sleeper timed out: the wake was lost");
    }
}
