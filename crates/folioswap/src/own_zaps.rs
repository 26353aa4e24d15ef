//! The engine's own `MADV_DONTNEED`s in flight, so that the REMOVE events they raise on
//! the region userfaultfd are not taken for the program's. State only.
//!
//! Copy-mode eviction (`evict.rs` `copy_out`) zaps a folio's pages with `MADV_DONTNEED`
//! after copying them out. The kernel reports that as REMOVE, one event per VMA the range
//! crosses (a program's `mprotect` can split a folio's VMA without telling us), each read
//! before the next is sent, exactly like a REMOVE of the program's own. The message
//! carries no sender. So while an eviction's zap of `[start, end)` is in flight:
//! 1. `begin` records the range;
//! 2. `gate::mark_event` hands every REMOVE that lies wholly inside it to [`OwnZaps::claim`],
//!    which keeps it as a *piece* instead of marking it against the folio (a REMOVE that
//!    only overlaps the range is the program's, and is marked as usual);
//! 3. once the zap returns, the evictor takes the gate once (the kernel lets a zap go on
//!    as soon as its event is *read*, and the reader hands it here before it lets go of
//!    the gate), then `finish` returns the pieces, and [`programs_pieces`] tells ours from the program's:
//!    ours are one per VMA, so they are disjoint, each as large as its VMA's part of the
//!    range, and they come in address order; a program's REMOVE received meanwhile lies
//!    inside one VMA too, so it is either inside one of ours or a duplicate of one. Those
//!    ranges the program asked to read as zeros, and the evictor zeros them in the
//!    copy it took before the zap (that copy predates the program's request).
//!
//! While any zap is in flight, someone must read the userfaultfd, or the zapping thread
//! waits forever; `gate::read_for_own_zaps` (a thread in copy mode) does, whatever the
//! fault threads are blocked on.
//!
//! The mutex is a leaf: nothing else is taken while it is held.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

struct Zap {
    id: u64,
    start: usize,
    end: usize,
    pieces: Vec<(usize, usize)>,
}

#[derive(Default)]
pub(crate) struct OwnZaps {
    inflight: Mutex<(u64, Vec<Zap>)>,
    busy: Condvar,
}

impl OwnZaps {
    /// A zap of `[start, end)` is about to be issued: returns its ticket.
    pub fn begin(&self, start: usize, end: usize) -> u64 {
        let mut guard = self.inflight.lock().unwrap();
        guard.0 += 1;
        let id = guard.0;
        guard.1.push(Zap { id, start, end, pieces: Vec::new() });
        self.busy.notify_all();
        id
    }

    /// A REMOVE of `[start, end)` was read: keep it as a piece of the zap in flight that
    /// contains it, if any (then it is not marked as the program's).
    pub fn claim(&self, start: usize, end: usize) -> bool {
        let mut guard = self.inflight.lock().unwrap();
        match guard.1.iter_mut().find(|z| z.start <= start && end <= z.end) {
            Some(zap) => {
                zap.pieces.push((start, end));
                true
            }
            None => false,
        }
    }

    /// The zap returned: forget it, and hand back the REMOVE pieces read while it ran.
    pub fn finish(&self, id: u64) -> Vec<(usize, usize)> {
        let mut guard = self.inflight.lock().unwrap();
        let at = guard.1.iter().position(|z| z.id == id).expect("a zap in flight");
        guard.1.swap_remove(at).pieces
    }

    /// Block until a zap is in flight (or `timeout` passes); whether one is.
    pub fn wait_busy(&self, timeout: Duration) -> bool {
        let guard = self.inflight.lock().unwrap();
        let (guard, _) = self.busy.wait_timeout_while(guard, timeout, |g| g.1.is_empty()).unwrap();
        !guard.1.is_empty()
    }
}

/// Which of the `pieces` claimed during a zap of `[start, end)` were the program's own
/// REMOVEs (see the module comment): in address order, largest first at equal starts,
/// a piece that begins before the end of the last one kept is inside it (or equals it),
/// so it is the program's, with one exception. When the program splits the VMA while
/// the zap waits for its event to be read (a `munmap` or `mprotect` inside the range),
/// the kernel repeats the REMOVE for the part past the new boundary (mm/madvise.c:
/// "userfaultfd_remove() will generate an UFFD_EVENT_REMOVE repetition on the
/// end-vma->vm_end range"): a piece that ends where the kept one ends, starts *inside* it
/// (the boundary is new: one that existed before the zap would have cut the kept piece
/// there) and where a VMA starts now (`is_vma_start`, asked only then) is that
/// repetition, and ours, once per boundary. A piece equal to a kept one is always the
/// program's, even at a VMA start: the kernel cuts its REMOVEs at the boundaries that
/// exist, so the program's discard of the part past a boundary made earlier (a hole it
/// unmapped) is a duplicate of our piece there, not a repetition.
pub(crate) fn programs_pieces(
    start: usize,
    mut pieces: Vec<(usize, usize)>,
    mut is_vma_start: impl FnMut(usize) -> bool,
) -> Vec<(usize, usize)> {
    pieces.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    let (mut kept_start, mut ours_end) = (start, start);
    let mut repeated = Vec::new();
    let mut theirs = Vec::new();
    for (s, e) in pieces {
        if s >= ours_end {
            (kept_start, ours_end) = (s, e);
        } else if e == ours_end && s > kept_start && !repeated.contains(&s) && is_vma_start(s) {
            repeated.push(s);
        } else {
            theirs.push((s, e.min(ours_end)));
        }
    }
    theirs
}

/// The start addresses of this process's mappings now, from /proc/self/maps (empty if
/// it cannot be read: every piece in doubt is then taken for the program's).
pub(crate) fn vma_starts() -> Vec<usize> {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return Vec::new();
    };
    maps.lines().filter_map(|l| usize::from_str_radix(l.split('-').next()?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_vma_and_nothing_else() {
        assert!(programs_pieces(0, vec![(0, 100)], |_| false).is_empty());
    }

    #[test]
    fn a_folio_split_into_vmas_by_mprotect() {
        assert!(programs_pieces(0, vec![(0, 30), (30, 70), (70, 100)], |_| true).is_empty());
    }

    #[test]
    fn the_program_zapping_part_of_it_meanwhile() {
        assert_eq!(programs_pieces(0, vec![(10, 20), (0, 100)], |_| true), vec![(10, 20)]);
        assert_eq!(programs_pieces(0, vec![(0, 100), (0, 20)], |_| true), vec![(0, 20)]);
        assert_eq!(programs_pieces(0, vec![(0, 50), (60, 70), (50, 100)], |_| true), vec![(60, 70)]);
    }

    #[test]
    fn the_program_zapping_exactly_the_same_range() {
        assert_eq!(programs_pieces(0, vec![(0, 100), (0, 100)], |_| false), vec![(0, 100)]);
        assert_eq!(programs_pieces(0, vec![(0, 50), (0, 50), (50, 100)], |_| false), vec![(0, 50)]);
    }

    #[test]
    fn the_kernels_repetition_after_a_vma_split_is_ours() {
        // The program unmapped [40, 60) while the zap of [0, 100) waited: the kernel
        // repeats the REMOVE for [60, 100), past the new VMA boundary at 60.
        assert!(programs_pieces(0, vec![(0, 100), (60, 100)], |a| a == 60).is_empty());
        // The same range where no VMA starts is the program's.
        assert_eq!(programs_pieces(0, vec![(0, 100), (60, 100)], |_| false), vec![(60, 100)]);
        // A piece not reaching our end is the program's even at a boundary.
        assert_eq!(programs_pieces(0, vec![(0, 100), (60, 90)], |a| a == 60), vec![(60, 90)]);
    }

    #[test]
    fn a_duplicate_of_our_piece_past_an_old_boundary_is_the_programs() {
        // A hole the program unmapped earlier at [40, 60): our zap of [0, 100) comes as
        // [0, 40) and [60, 100). The program's discard of [60, 100) meanwhile duplicates
        // our second piece: it must read as zeros (the clean-clone run at 6bb3f22 found
        // old data there in copy mode).
        assert_eq!(programs_pieces(0, vec![(0, 40), (60, 100), (60, 100)], |a| a == 60), vec![(60, 100)]);
    }

    #[test]
    fn a_repetition_and_the_programs_discard_of_the_same_range() {
        // The program split the VMA at 60 while our zap of [0, 100) waited, then discarded
        // [60, 100) itself: one of the two is the kernel's repetition, the other its own.
        assert_eq!(programs_pieces(0, vec![(0, 100), (60, 100), (60, 100)], |a| a == 60), vec![(60, 100)]);
    }

    #[test]
    fn vma_starts_find_a_new_mapping_and_its_split() {
        const P: usize = 4096;
        // Six inaccessible pages, then pages 1..5 readable: a VMA of its own starting at
        // page 1 whatever the neighbours are (they are this mapping's own PROT_NONE ends).
        // SAFETY: a fresh private anonymous mapping, unmapped below; nothing else uses it.
        let addr = unsafe { libc::mmap(std::ptr::null_mut(), 6 * P, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
        assert_ne!(addr, libc::MAP_FAILED);
        let base = addr as usize;
        let protect = |from: usize, to: usize, prot: i32| {
            // SAFETY: changes the protection of pages of the mapping made above only.
            assert_eq!(unsafe { libc::mprotect((base + from * P) as *mut libc::c_void, (to - from) * P, prot) }, 0);
        };
        protect(1, 5, libc::PROT_READ);
        assert!(vma_starts().contains(&(base + P)));
        assert!(!vma_starts().contains(&(base + 3 * P)));
        protect(3, 5, libc::PROT_NONE);
        assert!(vma_starts().contains(&(base + 3 * P)), "the split made by mprotect is a VMA start");
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(addr, 6 * P) };
    }

    #[test]
    fn claims_only_what_lies_inside() {
        let zaps = OwnZaps::default();
        let id = zaps.begin(4096, 8192);
        assert!(!zaps.claim(0, 8192), "overlapping is the program's");
        assert!(zaps.claim(4096, 8192));
        assert!(zaps.wait_busy(Duration::ZERO));
        assert_eq!(zaps.finish(id), vec![(4096, 8192)]);
        assert!(!zaps.wait_busy(Duration::ZERO));
        assert!(!zaps.claim(4096, 8192), "nothing in flight");
    }
}
