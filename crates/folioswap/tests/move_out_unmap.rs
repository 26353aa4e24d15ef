//! An eviction never moves out memory that is no longer the region's.
//!
//! The kernel reports a `munmap` only after the pages are gone, and until the engine
//! reads that UNMAP event its address map still holds the range. Another thread may map
//! something new in the hole meanwhile (a `malloc` of the program, or of the engine
//! itself). An eviction that MOVEs the run out in that window must fail, not take the
//! new mapping's pages: UFFDIO_MOVE checks only that its *destination* belongs to the
//! userfaultfd it is issued on, so the move must be issued on the region's userfaultfd,
//! which refuses (EAGAIN) while the UNMAP is unread.
//!
//! The window is opened on purpose: the test hook (`folioswap::testing`) runs on the
//! evicting thread right before the MOVE, with the gate held so that the UNMAP cannot be
//! read. It has a helper thread unmap the run, maps a sentinel at the same address and
//! returns. Its own test binary, since the hook is process-wide.

use folioswap::{Config, Engine, FaultMode, FolioSize, InstallMode, RegionOptions};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod common;
use common::{check_outside_hole, fill, map_sentinel, sentinel_intact};

const MIB: usize = 1 << 20;

static REGION_START: AtomicUsize = AtomicUsize::new(0);
static REGION_END: AtomicUsize = AtomicUsize::new(0);
/// The sentinel mapping the hook made: address and length (0 until it fired).
static SENTINEL_AT: AtomicUsize = AtomicUsize::new(0);
static SENTINEL_LEN: AtomicUsize = AtomicUsize::new(0);
/// The thread whose `munmap` waits for its UNMAP event to be read.
static UNMAPPER: Mutex<Option<JoinHandle<()>>> = Mutex::new(None);

/// The first eviction of a run inside the region: have a thread unmap the run, map a
/// sentinel in the hole, as a program's threads racing the eviction would.
fn unmap_and_map_anew(addr: usize, len: usize) {
    let (start, end) = (REGION_START.load(Ordering::Acquire), REGION_END.load(Ordering::Acquire));
    if addr < start || addr + len > end || SENTINEL_AT.compare_exchange(0, addr, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return;
    }
    // The munmap returns only once the engine has read its UNMAP event, which it cannot
    // while this eviction holds the gate: another thread does it.
    let unmapper = std::thread::spawn(move || {
        // SAFETY: the run lies inside the test's region; the test never touches it again
        // except through the sentinel mapped below.
        assert_eq!(unsafe { libc::munmap(addr as *mut libc::c_void, len) }, 0);
    });
    *UNMAPPER.lock().unwrap() = Some(unmapper);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match map_sentinel(addr, len) {
            Ok(()) => break,
            // The unmap is not done yet.
            Err(err) if err.raw_os_error() == Some(libc::EEXIST) => {
                assert!(Instant::now() < deadline, "the helper thread's munmap did not unmap the run");
                std::thread::yield_now();
            }
            Err(err) => panic!("mapping the sentinel: {err}"),
        }
    }
    SENTINEL_LEN.store(len, Ordering::Release);
}

#[test]
fn a_run_unmapped_and_mapped_anew_before_its_move_keeps_the_new_mapping() {
    assert!(folioswap::testing::set_before_move_out(unmap_and_map_anew));
    let config = Config::default().memory_high("8M").unwrap().fault_mode(FaultMode::Thread).no_swap_file();
    let engine = Engine::new(config).unwrap_or_else(|e| panic!("cannot start the engine: {e}"));
    assert_eq!(engine.install_mode(), InstallMode::Move, "this test needs UFFDIO_MOVE (Linux 6.8+)");
    let mut region = engine.map(32 * MIB, RegionOptions::default().folio(FolioSize::K4)).unwrap();
    let start = region.as_ptr() as usize;
    REGION_START.store(start, Ordering::Release);
    REGION_END.store(start + region.len(), Ordering::Release);
    // Four times memory_high: the fill cannot finish without evicting from the region.
    fill(&mut region, 9);
    let at = SENTINEL_AT.load(Ordering::Acquire);
    assert_ne!(at, 0, "no eviction moved a run of the region out: {:?}", engine.stats().vm);
    let len = SENTINEL_LEN.load(Ordering::Acquire);
    assert!(len > 0);
    UNMAPPER.lock().unwrap().take().expect("the unmapping thread").join().unwrap();
    assert!(sentinel_intact(at, len), "an eviction moved out the sentinel mapped at {at:#x} after the region's run was unmapped");
    // Every word outside the hole is the region's, swapped out or not.
    check_outside_hole(&region, at, len, 9);
    drop(region);
    assert!(sentinel_intact(at, len), "dropping the region changed the sentinel");
    // SAFETY: the sentinel mapping made by the hook; nothing refers to it any more.
    assert_eq!(unsafe { libc::munmap(at as *mut libc::c_void, len) }, 0);
}
