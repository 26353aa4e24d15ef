use folioswap::{Config, Engine, FaultMode, InstallMode, RegionOptions};

fn run(mode: FaultMode, folio: &str, region: usize, limit: &str) {
    run_with(mode, folio, region, limit, InstallMode::Move);
}

fn run_with(mode: FaultMode, folio: &str, region: usize, limit: &str, install: InstallMode) {
    let engine =
        Engine::new(Config::default().memory_high(limit).unwrap().fault_mode(mode).uffd_move(install == InstallMode::Move)).unwrap();
    assert_eq!(engine.install_mode(), install);
    let mut r = engine.map(region, RegionOptions::default().folio_size(folio).unwrap()).unwrap();
    let words = region / 8;
    let p = r.as_mut_slice().as_mut_ptr() as *mut u64;
    for round in 0..3u64 {
        for j in 0..words {
            // SAFETY: `j` < words, inside the region, which outlives the loop.
            unsafe { *p.add(j) = (j as u64) ^ (round << 40) };
        }
    }
    let mut bad = 0;
    for j in 0..words {
        // SAFETY: as above.
        if unsafe { *p.add(j) } != (j as u64) ^ (2 << 40) {
            bad += 1;
        }
    }
    let s = engine.stats();
    eprintln!(
        "{mode:?} {folio}: bad={bad} zswpout={} zswpin={} resident={} pool={} huge={}",
        s.vm.zswpout,
        s.vm.zswpin,
        s.memory.resident_bytes,
        s.memory.pool_total_bytes,
        r.anon_huge_bytes().unwrap()
    );
    assert_eq!(bad, 0);
    assert!(s.vm.zswpout > 0);
}

#[test]
fn thread_64k() {
    run(FaultMode::Thread, "64K", 64 << 20, "16M");
}
#[test]
fn signal_64k() {
    run(FaultMode::Signal, "64K", 64 << 20, "16M");
}
#[test]
fn thread_2m() {
    run(FaultMode::Thread, "2M", 128 << 20, "32M");
}
#[test]
fn signal_2m() {
    run(FaultMode::Signal, "2M", 128 << 20, "32M");
}
#[test]
fn thread_4k() {
    run(FaultMode::Thread, "4K", 32 << 20, "8M");
}

// The path of kernels without UFFDIO_MOVE, forced on this one.
#[test]
fn copy_thread_4k() {
    run_with(FaultMode::Thread, "4K", 32 << 20, "8M", InstallMode::Copy);
}
#[test]
fn copy_signal_64k() {
    run_with(FaultMode::Signal, "64K", 64 << 20, "16M", InstallMode::Copy);
}
#[test]
fn copy_thread_2m() {
    run_with(FaultMode::Thread, "2M", 128 << 20, "32M", InstallMode::Copy);
}
#[test]
fn copy_signal_2m() {
    run_with(FaultMode::Signal, "2M", 128 << 20, "32M", InstallMode::Copy);
}

/// Signal mode serves a fault inside the interrupted code, which may be reading errno
/// across the access (GNU sort's strcoll check failed with "Resource temporarily
/// unavailable" until the handler kept errno): every swap-in leaves errno as it was, also
/// one whose install met an event queued by the program's own madvise (EAGAIN, then the
/// queue read until it answers EAGAIN again).
#[test]
fn signal_mode_keeps_the_interrupted_errno() {
    const SENTINEL: i32 = 12345;
    let engine = Engine::new(Config::default().memory_high("8M").unwrap().fault_mode(FaultMode::Signal)).unwrap();
    let mut r = engine.map(32 << 20, RegionOptions::default().folio_size("4K").unwrap()).unwrap();
    let mut churn = engine.map(1 << 20, RegionOptions::default().folio_size("4K").unwrap()).unwrap();
    let churn = churn.as_mut_slice();
    let words = r.len() / 8;
    let p = r.as_mut_slice().as_mut_ptr() as *mut u64;
    for j in 0..words {
        // SAFETY: `j` < words, inside the region, which outlives the loop.
        unsafe { *p.add(j) = j as u64 };
    }
    let swapins_of = |s: folioswap::Stats| s.vm.zswpin + s.vm.pswpin;
    let swapins_before = swapins_of(engine.stats());
    // SAFETY: errno is this thread's.
    let errno = unsafe { libc::__errno_location() };
    let (mut changed, mut bad) = (0, 0);
    // Passes over the region, each page read once: the race with the event thread is
    // met a few times per pass.
    for (k, j) in (0..8).flat_map(|_| (0..words).step_by(512)).enumerate() {
        // An event queued just before the fault: a page of the other region dropped.
        let page = &mut churn[(k % 256) * 4096..][..4096];
        page[0] = 1;
        // SAFETY: madvise(2) on a page of a live managed region; its contents may go.
        unsafe { libc::madvise(page.as_mut_ptr().cast(), 4096, libc::MADV_DONTNEED) };
        // Volatile, so that neither access to errno is folded across the load that faults.
        // SAFETY: errno is this thread's; `j` < words, inside the region.
        let word = unsafe {
            errno.write_volatile(SENTINEL);
            let word = p.add(j).read_volatile();
            if errno.read_volatile() != SENTINEL {
                changed += 1;
            }
            word
        };
        if word != j as u64 {
            bad += 1;
        }
    }
    let swapins = swapins_of(engine.stats()) - swapins_before;
    // Then every word the test wrote, not only the one per page read across a fault.
    for j in 0..words {
        // SAFETY: `j` < words, inside the region.
        if unsafe { *p.add(j) } != j as u64 {
            bad += 1;
        }
    }
    assert!(swapins > 0, "nothing was swapped in: the test saw no fault served by the handler");
    assert_eq!(bad, 0, "words read back wrong");
    assert_eq!(changed, 0, "errno changed across {changed} of the reads ({swapins} swap-ins served in the handler)");
}
