//! Copy mode's zap never lands on memory that is no longer the region's.
//!
//! A copy-mode eviction copies a run out under the event gate, then zaps it with
//! `MADV_DONTNEED` without the gate (its REMOVE events must be read meanwhile). A
//! program thread that unmaps the run in between, and maps something new at the same
//! address, must keep what it mapped: `MADV_DONTNEED` would zap any mapping there.
//! The window is opened on purpose: the test hook (`folioswap::testing`) runs on the
//! evicting thread between the copy and the zap, and plays that program thread. Its own
//! test binary, since the hook is process-wide.

use folioswap::{Config, Engine, FaultMode, FolioSize, InstallMode, RegionOptions};
use std::sync::atomic::{AtomicUsize, Ordering};

mod common;
use common::{check_outside_hole, fill, map_sentinel, sentinel_intact};

const MIB: usize = 1 << 20;

static REGION_START: AtomicUsize = AtomicUsize::new(0);
static REGION_END: AtomicUsize = AtomicUsize::new(0);
/// The sentinel mapping the hook made: address and length (0 until it fired).
static SENTINEL_AT: AtomicUsize = AtomicUsize::new(0);
static SENTINEL_LEN: AtomicUsize = AtomicUsize::new(0);

/// The first zap of a run inside the region: unmap the run and map a sentinel there,
/// as a program thread racing the eviction would.
fn unmap_and_map_anew(addr: usize, len: usize) {
    let (start, end) = (REGION_START.load(Ordering::Acquire), REGION_END.load(Ordering::Acquire));
    if addr < start || addr + len > end || SENTINEL_AT.compare_exchange(0, addr, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return;
    }
    // SAFETY: the run lies inside the test's region; the test never touches it again
    // except through the sentinel mapped below.
    assert_eq!(unsafe { libc::munmap(addr as *mut libc::c_void, len) }, 0);
    // Nothing else may take the hole first: MAP_FIXED_NOREPLACE.
    map_sentinel(addr, len).unwrap_or_else(|err| panic!("mapping the sentinel: {err}"));
    SENTINEL_LEN.store(len, Ordering::Release);
}

#[test]
fn a_run_unmapped_and_mapped_anew_before_its_zap_keeps_the_new_mapping() {
    assert!(folioswap::testing::set_before_copy_zap(unmap_and_map_anew));
    let config = Config::default().memory_high("8M").unwrap().fault_mode(FaultMode::Thread).uffd_move(false).no_swap_file();
    let engine = Engine::new(config).unwrap_or_else(|e| panic!("cannot start the engine: {e}"));
    assert_eq!(engine.install_mode(), InstallMode::Copy);
    let mut region = engine.map(32 * MIB, RegionOptions::default().folio(FolioSize::K4)).unwrap();
    let start = region.as_ptr() as usize;
    REGION_START.store(start, Ordering::Release);
    REGION_END.store(start + region.len(), Ordering::Release);
    // Four times memory_high: the fill cannot finish without evicting from the region.
    fill(&mut region, 7);
    let at = SENTINEL_AT.load(Ordering::Acquire);
    assert_ne!(at, 0, "no copy-mode eviction zapped a run of the region: {:?}", engine.stats().vm);
    let len = SENTINEL_LEN.load(Ordering::Acquire);
    assert!(len > 0);
    assert!(sentinel_intact(at, len), "the eviction zapped the sentinel mapped at {at:#x} after the region's run was unmapped");
    // Every word outside the hole is the region's, swapped out or not.
    check_outside_hole(&region, at, len, 7);
    // Dropping the region unmaps what is left of it, not the sentinel in its hole.
    drop(region);
    assert!(sentinel_intact(at, len), "dropping the region changed the sentinel");
    // SAFETY: the sentinel mapping made by the hook; nothing refers to it any more.
    assert_eq!(unsafe { libc::munmap(at as *mut libc::c_void, len) }, 0);
}
