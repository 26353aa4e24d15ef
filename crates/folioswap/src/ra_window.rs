//! The readahead window: how many of a swap-in's neighbours to read ahead and which ones
//! (seed 002; the kernel's `__swapin_nr_pages` and `swap_ra_clamp_pfn`), and each
//! region's window state. Pure arithmetic and per-region atomics; the readahead path
//! that uses them is `readahead.rs`.

use crate::size::{FolioSize, HUGE_SIZE};
use crate::stats::{Counter, RegionReadahead};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The readahead window for a miss, from the hits since the last one: the kernel's
/// `__swapin_nr_pages`, in folios. `adjacent`: the fault is next to the previous one.
pub(crate) fn swapin_nr_folios(adjacent: bool, hits: u32, max: u32, prev_win: u32) -> u32 {
    let mut win = hits + 2;
    if win == 2 {
        // No hits to judge by: read ahead only for a fault next to the previous one.
        if !adjacent {
            win = 1;
        }
    } else {
        win = win.next_power_of_two().max(4);
    }
    win = win.min(max);
    // Don't shrink readahead too fast.
    win.max(prev_win / 2).max(1)
}

/// Where a window of `win` folios goes around the fault at folio `fault`, given the
/// previous fault `prev` (the kernel's `swap_ra_clamp_pfn` placement): ahead of a fault
/// that follows its predecessor, behind one that precedes it, centred otherwise; then
/// clamped to the region's `nr` folios and to the 2 MiB block around the fault
/// (`per_block` folios). Returns the half-open range of folio indices, fault included.
pub(crate) fn vma_window(fault: usize, prev: Option<usize>, win: usize, nr: usize, per_block: usize) -> (usize, usize) {
    let (lo, hi) = match prev {
        Some(p) if p + 1 == fault => (fault, fault + win),
        Some(p) if fault + 1 == p => ((fault + 1).saturating_sub(win), fault + 1),
        _ => {
            let left = (win - 1) / 2;
            (fault.saturating_sub(left), fault.saturating_sub(left) + win)
        }
    };
    let block = fault - fault % per_block.max(1);
    let lo = lo.max(block);
    let hi = hi.min(block + per_block.max(1)).min(nr);
    (lo, hi.max(lo))
}

/// Folios of `folio` size in the 2 MiB around a fault.
pub(crate) fn per_block(folio: FolioSize) -> usize {
    (HUGE_SIZE / folio.bytes()).max(1)
}

const HISTORY: usize = 8;

/// The stride most of `faults`' consecutive deltas agree on (Boyer-Moore majority vote),
/// if more than half do and it is at least 2 folios either way (1 is the plain window's).
pub(crate) fn majority_stride(faults: &[usize]) -> Option<i64> {
    if faults.len() < 4 {
        return None;
    }
    let deltas: Vec<i64> = faults.windows(2).map(|w| w[1] as i64 - w[0] as i64).collect();
    let (mut candidate, mut votes) = (0i64, 0usize);
    for &d in &deltas {
        if votes == 0 {
            candidate = d;
            votes = 1;
        } else if d == candidate {
            votes += 1;
        } else {
            votes -= 1;
        }
    }
    let count = deltas.iter().filter(|&&d| d == candidate).count();
    (count * 2 > deltas.len() && candidate.abs() >= 2).then_some(candidate)
}

/// Readahead state packed in one word, as the kernel packs `swap_readahead_info`:
/// previous fault folio + 1 (0: none) in the high 40 bits, window in 12, hits in 12.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RaInfo {
    pub prev: Option<usize>,
    pub win: u32,
    pub hits: u32,
}

impl RaInfo {
    fn pack(self) -> u64 {
        let prev = self.prev.map_or(0, |p| p as u64 + 1) & ((1 << 40) - 1);
        (prev << 24) | ((self.win.min(0xFFF) as u64) << 12) | self.hits.min(0xFFF) as u64
    }
    fn unpack(word: u64) -> RaInfo {
        let prev = word >> 24;
        RaInfo { prev: (prev != 0).then(|| prev as usize - 1), win: ((word >> 12) & 0xFFF) as u32, hits: (word & 0xFFF) as u32 }
    }
}

/// A readahead window's state: per region (VMA readahead) or global (slot order).
#[derive(Default)]
pub(crate) struct RaState {
    info: AtomicU64,
}

impl RaState {
    pub fn load(&self) -> RaInfo {
        RaInfo::unpack(self.info.load(Ordering::Relaxed))
    }
    pub fn store(&self, info: RaInfo) {
        self.info.store(info.pack(), Ordering::Relaxed);
    }
    /// A readahead hit: one more hit towards the next window.
    pub fn hit(&self) {
        let _ = self.info.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
            let mut i = RaInfo::unpack(w);
            i.hits = (i.hits + 1).min(0xFFF);
            Some(i.pack())
        });
    }
    /// A miss at `fault`: the new window from the hits since the last miss (reset), the
    /// fault remembered. Returns the window and the previous fault.
    pub fn miss(&self, fault: usize, max: u32) -> (u32, Option<usize>) {
        let old = self.load();
        let adjacent = old.prev.is_some_and(|p| p + 1 == fault || fault + 1 == p);
        let win = swapin_nr_folios(adjacent, old.hits, max, old.win);
        self.store(RaInfo { prev: Some(fault), win, hits: 0 });
        (win, old.prev)
    }
    /// A hit at `fault`: keep the window, remember the fault.
    pub fn seen(&self, fault: usize) -> (u32, Option<usize>) {
        let old = self.load();
        self.store(RaInfo { prev: Some(fault), ..old });
        (old.win.max(1), old.prev)
    }
}

/// A region's first touches in sequence: the folio the next one is expected at, and a
/// window of folios to install zeroed ahead of it that doubles while they keep coming
/// there (`fault.rs` `zero_ahead`). A heuristic: two threads touching one region in
/// different places only reset each other's window, so it is read and written without a
/// lock.
#[derive(Default)]
pub(crate) struct TouchRun {
    /// (the folio expected + 1, 0 for none) << 16 | the window.
    word: AtomicU64,
}

impl TouchRun {
    /// A first touch at folio `index`: how many folios after it to zero ahead (at most
    /// `max`). 0 unless it is the folio expected, the one after the last first touch or
    /// after the last folio zeroed ahead; the window starts at 2.
    pub fn touched(&self, index: usize, max: usize) -> usize {
        let old = self.word.load(Ordering::Relaxed);
        let (expected, win) = ((old >> 16) as usize, (old & 0xFFFF) as usize);
        let win = if expected == index + 1 { (win * 2).max(2).min(max).min(0xFFFF) } else { 0 };
        self.expect(index + 1, win);
        win
    }

    /// The folios up to `last` are resident now: the next first touch in the run comes
    /// after it.
    pub fn ran_to(&self, last: usize) {
        let win = self.word.load(Ordering::Relaxed) & 0xFFFF;
        self.expect(last + 1, win as usize);
    }

    fn expect(&self, next: usize, win: usize) {
        self.word.store(((next as u64 + 1) << 16) | win as u64, Ordering::Relaxed);
    }
}

/// One region's readahead: its window, its recent faults (for stride detection), counters.
#[derive(Default)]
pub(crate) struct RegionRa {
    pub state: RaState,
    recent: Mutex<Vec<usize>>,
    pub swap_ra: Counter,
    pub swap_ra_hit: Counter,
    pub swap_ra_waste: Counter,
    /// The region's run of first touches (`fault.rs` `zero_ahead`).
    pub touches: TouchRun,
    /// The 64 KiB block of the last page of a split folio swapped in, plus one (0: none):
    /// a second miss in the same block reads the block's pages on the file
    /// (`readahead.rs` `plan_file_siblings`).
    pub last_piece_block: AtomicU64,
}

impl RegionRa {
    /// Record a swap-in fault at folio `fault`; returns the stride the recent faults
    /// agree on, if any.
    pub fn record_fault(&self, fault: usize) -> Option<i64> {
        let mut recent = self.recent.lock().unwrap();
        if recent.len() == HISTORY {
            recent.remove(0);
        }
        recent.push(fault);
        majority_stride(&recent)
    }
    pub fn stride(&self) -> Option<i64> {
        majority_stride(&self.recent.lock().unwrap())
    }
    pub fn snapshot(&self) -> RegionReadahead {
        RegionReadahead {
            swap_ra: self.swap_ra.get(),
            swap_ra_hit: self.swap_ra_hit.get(),
            swap_ra_waste: self.swap_ra_waste.get(),
            window: self.state.load().win,
            stride: self.stride().unwrap_or(0),
        }
    }
}

/// Whether a fault at page `offset` of a large folio of `pages` pages should bring the
/// whole folio back (`adaptive`): a sequential stream enters each folio at its first page
/// (or its last, going down); a random fault lands there one time in `pages / 2`, and
/// takes only its page. (A history of the region's recent swap-ins was tried as a second
/// signal, "next to a recent one": in a region of a few dozen folios, such as an
/// interpreter's heap, nearly every random fault is next to one of the last eight, and
/// CPython's dict benchmark swapped in whole folios 2 700 times as often as in part.)
///
/// `one_read`: the folio is on the swap file and no larger than a fault's read may be
/// (`readahead::SWAPIN_READ_MAX`, 64 KiB). Then it comes back whole wherever the fault
/// is: on this disk a 64 KiB read takes about as long as two and a half 4 KiB reads, and
/// split, its pages would each pay a read of their own when they fault (BENCHMARKS.md,
/// "A folio on the swap file comes back whole").
pub(crate) fn swapin_whole(offset: usize, pages: usize, one_read: bool) -> bool {
    one_read || offset == 0 || offset + 1 == pages
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_first_touches_doubles_its_window_and_a_jump_resets_it() {
        let run = TouchRun::default();
        assert_eq!(run.touched(10, 128), 0, "nothing expected yet");
        assert_eq!(run.touched(11, 128), 2);
        run.ran_to(13);
        assert_eq!(run.touched(14, 128), 4, "the touch after the folios zeroed ahead");
        run.ran_to(18);
        assert_eq!(run.touched(19, 8), 8, "capped");
        run.ran_to(27);
        assert_eq!(run.touched(28, 8), 8);
        assert_eq!(run.touched(500, 8), 0, "a jump");
        assert_eq!(run.touched(501, 8), 2, "starts again");
        assert_eq!(run.touched(501, 8), 0, "the same folio again is no run");
        assert_eq!(run.touched(1, 0), 0, "max 0 turns it off");
        assert_eq!(run.touched(2, 0), 0);
    }

    #[test]
    fn window_grows_with_hits_up_to_the_cap() {
        // First adjacent miss with no hits: 2; then hits push it to powers of two, capped.
        assert_eq!(swapin_nr_folios(true, 0, 8, 0), 2);
        assert_eq!(swapin_nr_folios(true, 1, 8, 2), 4);
        assert_eq!(swapin_nr_folios(true, 3, 8, 4), 8);
        assert_eq!(swapin_nr_folios(true, 7, 8, 8), 8);
        assert_eq!(swapin_nr_folios(true, 100, 8, 8), 8);
        assert_eq!(swapin_nr_folios(true, 100, 32, 8), 32);
    }

    #[test]
    fn window_shrinks_by_at_most_half_per_miss_without_hits() {
        let mut win = 8;
        let mut seen = vec![];
        for _ in 0..5 {
            win = swapin_nr_folios(false, 0, 8, win);
            seen.push(win);
        }
        assert_eq!(seen, [4, 2, 1, 1, 1]);
    }

    #[test]
    fn adaptive_swapin_takes_streams_whole_and_random_faults_in_part() {
        assert!(swapin_whole(0, 512, false));
        assert!(swapin_whole(511, 512, false));
        assert!(!swapin_whole(200, 512, false));
        assert!(!swapin_whole(1, 512, false));
        assert!(swapin_whole(0, 16, false) && swapin_whole(15, 16, false) && !swapin_whole(7, 16, false));
    }

    #[test]
    fn adaptive_swapin_takes_a_folio_read_in_one_read_whole() {
        assert!(swapin_whole(7, 16, true));
        assert!(swapin_whole(1, 2, true));
    }

    #[test]
    fn no_readahead_for_a_random_first_miss() {
        assert_eq!(swapin_nr_folios(false, 0, 8, 0), 1);
    }

    #[test]
    fn state_adapts_to_a_sequential_stream_then_a_random_one() {
        let s = RaState::default();
        let max = 8;
        // Sequential: miss at 0, 1 (adjacent: 2), then hits grow it to the cap.
        assert_eq!(s.miss(0, max).0, 1);
        assert_eq!(s.miss(1, max).0, 2);
        s.hit();
        assert_eq!(s.miss(3, max).0, 4);
        for _ in 0..3 {
            s.hit();
        }
        assert_eq!(s.miss(7, max).0, 8);
        // Random misses with no hits: halves down to 1.
        let wins: Vec<u32> = [100, 7, 300, 50].iter().map(|&f| s.miss(f, max).0).collect();
        assert_eq!(wins, [4, 2, 1, 1]);
        // A hit keeps the window.
        assert_eq!(s.seen(51), (1, Some(50)));
    }

    #[test]
    fn window_goes_ahead_of_forward_faults_behind_backward_ones_around_others() {
        let block = 512;
        assert_eq!(vma_window(10, Some(9), 8, 10_000, block), (10, 18));
        assert_eq!(vma_window(10, Some(11), 8, 10_000, block), (3, 11));
        assert_eq!(vma_window(10, Some(500), 8, 10_000, block), (7, 15));
        assert_eq!(vma_window(10, None, 1, 10_000, block), (10, 11));
    }

    #[test]
    fn window_respects_the_region_and_the_2m_block() {
        let block = 512; // 4 KiB folios
                         // Region end.
        assert_eq!(vma_window(98, Some(97), 8, 100, block), (98, 100));
        // Region start, backwards.
        assert_eq!(vma_window(2, Some(3), 8, 100, block), (0, 3));
        // 2 MiB block end and start.
        assert_eq!(vma_window(510, Some(509), 8, 10_000, block), (510, 512));
        assert_eq!(vma_window(513, Some(514), 8, 10_000, block), (512, 514));
        // 1 MiB folios: two per block; a 2 MiB folio is alone in its block.
        assert_eq!(vma_window(4, Some(3), 8, 100, per_block(FolioSize::from_order(8).unwrap())), (4, 6));
        assert_eq!(vma_window(4, Some(3), 8, 100, per_block(FolioSize::M2)), (4, 5));
    }

    #[test]
    fn stride_needs_a_majority_of_two_or_more() {
        assert_eq!(majority_stride(&[0, 4, 8, 12, 16]), Some(4));
        assert_eq!(majority_stride(&[40, 37, 34, 31, 28, 1000]), Some(-3));
        // Sequential is the plain window's business.
        assert_eq!(majority_stride(&[0, 1, 2, 3, 4]), None);
        // Random: no majority.
        assert_eq!(majority_stride(&[5, 90, 13, 400, 2, 77]), None);
        // Too short to judge.
        assert_eq!(majority_stride(&[0, 4, 8]), None);
    }

    #[test]
    fn info_packs_and_unpacks() {
        for info in [
            RaInfo { prev: None, win: 0, hits: 0 },
            RaInfo { prev: Some(0), win: 8, hits: 7 },
            RaInfo { prev: Some((1 << 39) - 2), win: 512, hits: 4095 },
        ] {
            assert_eq!(RaInfo::unpack(info.pack()), info);
        }
    }
}
