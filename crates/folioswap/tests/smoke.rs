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
