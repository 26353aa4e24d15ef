//! How faults and reclaimers wait for each other: kswapd's wait queue, the progress
//! signal that evictions raise as folios leave memory, and the count of evictions under
//! way that fork waits out. State only; the paths are `reclaim.rs` and `evict.rs`.
//!
//! Both mutexes here are leaves: nothing else is taken while one is held.

use crate::memcg::MemCg;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

#[derive(Default)]
pub(crate) struct ReclaimCtl {
    sleep: Mutex<u64>,
    wake: Condvar,
    sleeping: AtomicUsize,
    progress: Mutex<u64>,
    progress_cv: Condvar,
    /// Folios moved out and not yet published (being compressed or written now).
    inflight: AtomicU64,
    /// Evictions under way (`evict::shrink_one` calls past their start).
    active: AtomicUsize,
}

/// One eviction under way; see [`ReclaimCtl::quiesce`].
pub(crate) struct ActiveEviction<'a>(&'a AtomicUsize);

impl Drop for ActiveEviction<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What [`ReclaimCtl::wait_for_progress`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Waited (at most 50 ms) for a folio in flight to be published.
    Waited,
    /// Nothing was in flight: waiting could not help.
    NothingInFlight,
}

impl ReclaimCtl {
    /// Wake one sleeping reclaimer, if any sleeps.
    pub fn wake_one(&self) {
        if self.sleeping.load(Ordering::Relaxed) > 0 {
            *self.sleep.lock().unwrap() += 1;
            self.wake.notify_one();
        }
    }

    pub fn wake_all(&self) {
        *self.sleep.lock().unwrap() += 1;
        self.wake.notify_all();
    }

    /// A reclaimer sleeps until woken or `timeout` passes.
    pub fn sleep(&self, timeout: Duration) {
        let guard = self.sleep.lock().unwrap();
        self.sleeping.fetch_add(1, Ordering::Relaxed);
        let _ = self.wake.wait_timeout(guard, timeout).unwrap();
        self.sleeping.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn notify_progress(&self) {
        *self.progress.lock().unwrap() += 1;
        self.progress_cv.notify_all();
    }

    /// Start an eviction, unless the limit is suspended (around fork).
    pub fn begin_eviction(&self, memcg: &MemCg) -> Option<ActiveEviction<'_>> {
        // Counted before the check, so that `quiesce` (suspend, then wait for zero)
        // never misses one that saw the limit still in force.
        self.active.fetch_add(1, Ordering::SeqCst);
        let guard = ActiveEviction(&self.active);
        (!memcg.is_suspended()).then_some(guard)
    }

    /// `n` folios left memory and are being stored.
    pub fn begin_store(&self, n: usize) {
        self.inflight.fetch_add(n as u64, Ordering::AcqRel);
    }

    /// One of them is published (or given back): wake whoever waits for progress.
    pub fn end_store(&self) {
        self.inflight.fetch_sub(1, Ordering::AcqRel);
        self.notify_progress();
    }

    /// Wait for the evictions under way to finish. Called with the limit suspended, so
    /// that no new one starts.
    pub fn quiesce(&self) {
        while self.active.load(Ordering::SeqCst) > 0 || self.inflight.load(Ordering::Acquire) > 0 {
            if self.wait_for_progress() == Wait::NothingInFlight {
                std::thread::yield_now();
            }
        }
    }

    /// Wait for a folio in flight to be published.
    pub fn wait_for_progress(&self) -> Wait {
        let guard = self.progress.lock().unwrap();
        if self.inflight.load(Ordering::Acquire) == 0 {
            return Wait::NothingInFlight;
        }
        let seen = *guard;
        let _ = self.progress_cv.wait_timeout_while(guard, Duration::from_millis(50), |p| *p == seen).unwrap();
        Wait::Waited
    }
}
