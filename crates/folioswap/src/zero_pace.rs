//! The zero scan's place and pace (`zero_scan.rs` is the scan): where the next run
//! starts, and how many pages it may read. State and arithmetic only, so that `Mm` can hold
//! it below the paths.
//!
//! The scanner may read `SCAN_RATIO` pages per page evicted since it last ran (at most
//! `MAX_RUN` at a time), halved for each full pass over the regions that found under
//! 1/`FRUITFUL` of what it read zero (down to 1/2^`MAX_BACKOFF` of that), back to the full
//! ratio after a pass that found more: on memory that is never zero it costs a few passes,
//! then a sliver.

use std::sync::{Mutex, MutexGuard};

/// Pages the scanner may read per page evicted, before backoff.
const SCAN_RATIO: u64 = 64;
/// Halvings of the ratio after passes that found (next to) nothing: at most 2^12.
const MAX_BACKOFF: u32 = 12;
/// A pass that finds at least 1/64 of what it read zero puts the ratio back up.
const FRUITFUL: u64 = 64;
/// Fewest pages worth one run of the scanner (it waits for more credit below this).
const MIN_RUN: u64 = 64;
/// Most pages one run reads (a 2 MiB folio counts whole).
const MAX_RUN: u64 = 512;

/// The scanner's state, taken only with `try_lock` (`Mm::zero_scan`): a second reclaimer
/// skips the scan rather than waiting for it.
#[derive(Default)]
pub(crate) struct ZeroScan {
    state: Mutex<ScanState>,
}

#[derive(Default)]
pub(crate) struct ScanState {
    /// The address the next run starts at (0: a new pass).
    pub cursor: usize,
    /// The eviction clock (`Lru::now`) when the scanner last ran.
    clock: u32,
    backoff: u32,
    /// Pages read in this pass, and of those found zero.
    read: u64,
    found: u64,
    /// Reused copy buffer.
    pub buf: Vec<u8>,
}

impl ZeroScan {
    /// The state, unless another thread is scanning.
    pub fn try_take(&self) -> Option<MutexGuard<'_, ScanState>> {
        self.state.try_lock().ok()
    }
}

impl ScanState {
    /// How many pages a run may read now, the eviction clock reading `now`; `None` below
    /// `MIN_RUN` (the credit keeps growing). A run that is let go spends all the credit.
    pub fn budget(&mut self, now: u32) -> Option<u64> {
        let credit = ((now.wrapping_sub(self.clock) as u64) * SCAN_RATIO) >> self.backoff;
        if credit < MIN_RUN {
            return None;
        }
        self.clock = now;
        Some(credit.min(MAX_RUN))
    }

    /// Count what a run read in this pass.
    pub fn count(&mut self, read: u64, found: u64) {
        self.read += read;
        self.found += found;
    }

    /// The pass is over: judge it, and start the next at the lowest address.
    pub fn end_pass(&mut self) {
        self.backoff = if self.found * FRUITFUL >= self.read.max(1) { 0 } else { (self.backoff + 1).min(MAX_BACKOFF) };
        (self.read, self.found) = (0, 0);
        self.cursor = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fruitless_passes_slow_the_scan_and_a_fruitful_one_restores_it() {
        let mut st = ScanState::default();
        assert_eq!(st.budget(0), None);
        assert_eq!(st.budget(1), Some(64), "one page evicted allows 64 read");
        assert_eq!(st.budget(101), Some(MAX_RUN), "capped");
        st.count(1000, 0);
        st.end_pass();
        assert_eq!(st.budget(102), None, "32 pages of credit after one fruitless pass");
        assert_eq!(st.budget(103), Some(64), "two pages evicted since: 64 read");
        for _ in 0..20 {
            st.count(1000, 15);
            st.end_pass();
        }
        assert_eq!(st.budget(103 + 4095), None, "at most 2^12 slower");
        assert_eq!(st.budget(103 + 4096), Some(64));
        st.count(1000, 16);
        st.end_pass();
        assert_eq!(st.budget(103 + 4097), Some(64), "a pass finding 1/64 zero restores the ratio");
    }
}
