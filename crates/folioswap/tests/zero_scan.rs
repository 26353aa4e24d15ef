//! The zero scan (`zero_scan.rs`, `FOLIOSWAP_ZERO_SCAN`, off by default): while reclaim
//! runs, resident folios that hold only zeros are read and queued first for eviction. These
//! tests check that it finds them, that a folio it found zero and then saw written keeps
//! the write, that it reads nothing when off, and that every word holds.

mod common;

use common::{check, fill};
use folioswap::{Config, Engine, FolioSize, Region, RegionOptions};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const MIB: usize = 1 << 20;

/// Data the program uses (12M, written first) and zeros it wrote and left (8M, written
/// last, so the youngest on the LRU), under a 16M limit: the zeros must be found and leave,
/// the data be read back whole, pass after pass.
fn data_then_zeros(config: Config) -> folioswap::Stats {
    let engine = Engine::new(config.memory_high("16M").unwrap()).unwrap_or_else(|e| panic!("cannot start the engine: {e}"));
    let mut data = engine.map(12 * MIB, RegionOptions::default().folio(FolioSize::K4)).unwrap();
    let zeros = engine.map(8 * MIB, RegionOptions::default().folio(FolioSize::K4)).unwrap();
    fill(&mut data, 1);
    for page in 0..8 * MIB / 4096 {
        // SAFETY: inside the live region, owned by this thread: a write of zeros, as a
        // program's memset, which makes the page resident.
        unsafe { (zeros.as_ptr().add(page * 4096) as *mut u64).write_volatile(0) };
    }
    for pass in 0..4 {
        check(&data, 1);
        if pass == 1 {
            fill(&mut data, 2);
            check(&data, 2);
            fill(&mut data, 1);
        }
    }
    check(&data, 1);
    check_zeros(&zeros);
    engine.stats()
}

fn check_zeros(region: &Region) {
    for (j, w) in region.as_slice().chunks(8).enumerate() {
        assert_eq!(u64::from_le_bytes(w.try_into().unwrap()), 0, "word {j} of the zeroed region");
    }
}

#[test]
fn zeros_the_program_left_are_found_and_every_word_holds() {
    let stats = data_then_zeros(Config::default().zero_scan(true));
    let vm = &stats.vm;
    assert!(vm.pswpout + vm.zswpout > 0, "nothing was swapped out: the test does not test: {vm:?}");
    assert!(vm.pgscan_zero > 0, "the zero scan read nothing while reclaim ran: {vm:?}");
    assert!(vm.pgscan_zero_found > 0, "the zero scan found none of the 2048 zero pages: {vm:?}");
    assert!(vm.pgscan_zero_found <= vm.pgscan_zero, "{vm:?}");
}

#[test]
fn with_the_zero_scan_off_nothing_is_read() {
    let stats = data_then_zeros(Config::default().zero_scan(false));
    let vm = &stats.vm;
    assert!(vm.pswpout + vm.zswpout > 0, "nothing was swapped out: the test does not test: {vm:?}");
    assert_eq!((vm.pgscan_zero, vm.pgscan_zero_found), (0, 0), "{vm:?}");
}

/// One thread zeroes stripes of a region, checks them, writes them with a new version and
/// checks that, again and again, while another streams through a larger region to keep
/// reclaim (and so the zero scan) running: a stripe the scan read as zero and queued first
/// is written before its eviction, and the eviction must take what was written.
#[test]
fn folios_written_after_the_scan_found_them_zero_keep_every_write() {
    const STRIPE: usize = 16 * 4096;
    let engine = Engine::new(Config::default().zero_scan(true).memory_high("12M").unwrap())
        .unwrap_or_else(|e| panic!("cannot start the engine: {e}"));
    let stripes = Arc::new(engine.map(8 * MIB, RegionOptions::default().folio(FolioSize::K4)).unwrap());
    let mut stream = engine.map(16 * MIB, RegionOptions::default().folio(FolioSize::K4)).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let zeroer = {
        let (stripes, done) = (stripes.clone(), done.clone());
        std::thread::spawn(move || -> Result<(), String> {
            let base = stripes.as_ptr() as usize;
            let words = STRIPE / 8;
            let at = |s: usize, k: usize| (base + s * STRIPE + k * 8) as *mut u64;
            for version in 1..=6u64 {
                for s in 0..8 * MIB / STRIPE {
                    for k in 0..words {
                        // SAFETY: inside the live region; only this thread touches it.
                        unsafe { at(s, k).write_volatile(0) };
                    }
                    for k in 0..words {
                        // SAFETY: as above.
                        let got = unsafe { at(s, k).read_volatile() };
                        if got != 0 {
                            return Err(format!("version {version} stripe {s} word {k}: {got:#x} after zeroing"));
                        }
                    }
                    let value = |k: usize| (version << 48) ^ ((s as u64) << 20) ^ k as u64;
                    for k in 0..words {
                        // SAFETY: as above.
                        unsafe { at(s, k).write_volatile(value(k)) };
                    }
                    for k in 0..words {
                        // SAFETY: as above.
                        let got = unsafe { at(s, k).read_volatile() };
                        if got != value(k) {
                            return Err(format!("version {version} stripe {s} word {k}: {got:#x}, want {:#x}", value(k)));
                        }
                    }
                    // Zero it again and leave it zero until the next version: the scan
                    // finds it, the next write races the eviction it queued.
                    for k in 0..words {
                        // SAFETY: as above.
                        unsafe { at(s, k).write_volatile(0) };
                    }
                }
            }
            done.store(true, Ordering::Release);
            Ok(())
        })
    };
    let mut seed = 0;
    while !done.load(Ordering::Acquire) {
        seed += 1;
        fill(&mut stream, seed);
        check(&stream, seed);
    }
    zeroer.join().unwrap().unwrap_or_else(|e| panic!("{e}\n{:?}", engine.stats().vm));
    check_zeros(&stripes);
    let vm = engine.stats().vm;
    assert!(vm.pswpout + vm.zswpout > 0, "nothing was swapped out: the test does not test: {vm:?}");
    assert!(vm.pgscan_zero_found > 0, "the scan found no zero folio: the test does not test: {vm:?}");
}
