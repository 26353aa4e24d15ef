//! Charging memory against `memory_high`, as a memory cgroup does.
//!
//! `charged` is the sum of the components below, updated together so that a reservation is
//! one compare-and-swap: resident folios, swap-cache folios (unmapped, uncompressed, in
//! staging) and populated staging kept for reuse. With `charge_pool` the pool's footprint
//! counts too; it is read beside `charged` rather than folded in, since the pool changes
//! it from many threads.
//!
//! Watermarks follow kswapd: background reclaim starts above `high_wmark` and stops under
//! `low_wmark`; a fault that would take usage over the limit reclaims directly.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Component {
    Resident,
    SwapCache,
    StagingFree,
}

pub(crate) struct MemCg {
    pub limit: Option<u64>,
    pub high_wmark: u64,
    pub low_wmark: u64,
    pub charge_pool: bool,
    charged: AtomicU64,
    resident: AtomicU64,
    swapcache: AtomicU64,
    staging_free: AtomicU64,
}

impl MemCg {
    pub fn new(limit: Option<u64>, charge_pool: bool) -> MemCg {
        let (high_wmark, low_wmark) = match limit {
            Some(limit) => {
                let gap = (limit / 32).clamp(2 << 20, 64 << 20).min(limit / 4);
                (limit - gap, limit - 2 * gap)
            }
            None => (u64::MAX, u64::MAX),
        };
        MemCg {
            limit,
            high_wmark,
            low_wmark,
            charge_pool,
            charged: AtomicU64::new(0),
            resident: AtomicU64::new(0),
            swapcache: AtomicU64::new(0),
            staging_free: AtomicU64::new(0),
        }
    }

    fn counter(&self, c: Component) -> &AtomicU64 {
        match c {
            Component::Resident => &self.resident,
            Component::SwapCache => &self.swapcache,
            Component::StagingFree => &self.staging_free,
        }
    }

    /// Usage compared against the limit and watermarks.
    pub fn usage(&self, pool_footprint: u64) -> u64 {
        self.charged.load(Ordering::Relaxed) + if self.charge_pool { pool_footprint } else { 0 }
    }

    /// Charge `n` bytes to `c` if that keeps usage within the limit.
    pub fn try_charge(&self, c: Component, n: u64, pool_footprint: u64) -> bool {
        let pool = if self.charge_pool { pool_footprint } else { 0 };
        let limit = self.limit.unwrap_or(u64::MAX);
        let mut cur = self.charged.load(Ordering::Relaxed);
        loop {
            if cur.saturating_add(n).saturating_add(pool) > limit {
                return false;
            }
            match self.charged.compare_exchange_weak(cur, cur + n, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    self.counter(c).fetch_add(n, Ordering::Relaxed);
                    return true;
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// Charge unconditionally (memory that already exists, e.g. a folio put back).
    pub fn charge(&self, c: Component, n: u64) {
        self.charged.fetch_add(n, Ordering::AcqRel);
        self.counter(c).fetch_add(n, Ordering::Relaxed);
    }

    pub fn uncharge(&self, c: Component, n: u64) {
        self.counter(c).fetch_sub(n, Ordering::Relaxed);
        self.charged.fetch_sub(n, Ordering::AcqRel);
    }

    /// Move `n` charged bytes from one component to another (no change in usage).
    pub fn transfer(&self, from: Component, to: Component, n: u64) {
        self.counter(from).fetch_sub(n, Ordering::Relaxed);
        self.counter(to).fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self, c: Component) -> u64 {
        self.counter(c).load(Ordering::Relaxed)
    }

    pub fn above_high(&self, pool_footprint: u64) -> bool {
        self.limit.is_some() && self.usage(pool_footprint) > self.high_wmark
    }

    pub fn above_low(&self, pool_footprint: u64) -> bool {
        self.limit.is_some() && self.usage(pool_footprint) > self.low_wmark
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_stay_within_limit() {
        let m = MemCg::new(Some(64 << 20), false);
        assert!(m.low_wmark < m.high_wmark && m.high_wmark < 64 << 20);
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

    #[test]
    fn pool_counts_only_when_charged() {
        let m = MemCg::new(Some(16 << 20), true);
        assert!(!m.try_charge(Component::Resident, 8 << 20, 10 << 20));
        let m = MemCg::new(Some(16 << 20), false);
        assert!(m.try_charge(Component::Resident, 8 << 20, 10 << 20));
    }
}
