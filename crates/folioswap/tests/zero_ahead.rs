//! Zeros ahead of first touches (`fault.rs` `zero_ahead`) under fire: a run of first touches
//! installs the folios after it zeroed before they are asked for, so those installs race
//! the writes, discards and faults of the threads that own them.
//!
//! Two threads share a region of 4 KiB folios and one of 16 KiB folios, each several times
//! memory_high. The regions are cut into stripes of 8 folios, and stripe `s` belongs to
//! thread `s % 2`, which alone writes it (whole, with a new version), discards it
//! (MADV_DONTNEED: Untouched again, it must read back as zeros) and checks it. Each pass,
//! both threads walk their stripes in address order at the same time, so each one's run of
//! first touches zeroes ahead into the other's stripes while that thread is writing or
//! discarding them. Every stripe is checked on every pass and all of them at the end.

use folioswap::{Config, Engine, FolioSize, Region, RegionOptions};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

const THREADS: usize = 2;
const STRIPE: usize = 8;
const PASSES: u32 = 6;

struct Striped {
    region: Region,
    folio: FolioSize,
    /// Per stripe: 0 for zeros (never written, or discarded), else its version.
    versions: Vec<AtomicU32>,
}

impl Striped {
    fn stripe_words(&self) -> usize {
        STRIPE * self.folio.bytes() / 8
    }
    fn word(&self, stripe: usize, k: usize) -> *mut u64 {
        (self.region.as_ptr() as usize + stripe * STRIPE * self.folio.bytes() + k * 8) as *mut u64
    }
}

fn value(stripe: usize, k: usize, version: u32) -> u64 {
    if version == 0 {
        return 0;
    }
    // Half the words repeat, so the folios compress like ordinary data.
    let k = if k.is_multiple_of(2) { 0 } else { k };
    ((stripe as u64) << 40) ^ ((k as u64) << 8) ^ version as u64
}

fn write(t: &Striped, stripe: usize) {
    let v = t.versions[stripe].load(Ordering::Relaxed) + 1;
    for k in 0..t.stripe_words() {
        // SAFETY: the stripe lies inside the live region and only its owner touches it.
        unsafe { t.word(stripe, k).write_volatile(value(stripe, k, v)) };
    }
    t.versions[stripe].store(v, Ordering::Relaxed);
}

fn discard(t: &Striped, stripe: usize) {
    let len = STRIPE * t.folio.bytes();
    // SAFETY: the stripe is inside the live region; DONTNEED on it only drops its pages.
    let r = unsafe { libc::madvise(t.word(stripe, 0) as *mut libc::c_void, len, libc::MADV_DONTNEED) };
    assert_eq!(r, 0, "madvise(DONTNEED): {}", std::io::Error::last_os_error());
    // Written versions go on from the last one, so that a stale copy never matches.
    t.versions[stripe].store(0, Ordering::Relaxed);
}

fn check(t: &Striped, stripe: usize, last: u32) -> Result<(), String> {
    let v = t.versions[stripe].load(Ordering::Relaxed);
    for k in 0..t.stripe_words() {
        // SAFETY: inside the live region, read by the stripe's owner only.
        let got = unsafe { t.word(stripe, k).read_volatile() };
        let want = value(stripe, k, v);
        if got != want {
            return Err(format!("{} stripe {stripe} word {k}: {got:#x}, want {want:#x} (version {v}, last written {last})", t.folio));
        }
    }
    Ok(())
}

#[test]
fn zeros_ahead_of_first_touches_race_their_owners_writes_and_discards() {
    race_owners(Config::default());
}

/// Copy mode zeroes ahead by the same UFFDIO_COPY, and evicts by write-protect and zap.
#[test]
fn copy_mode_zeros_ahead_race_their_owners_writes_and_discards() {
    race_owners(Config::default().uffd_move(false));
}

fn race_owners(config: Config) {
    let engine = Engine::new(config.memory_high("8M").unwrap()).unwrap_or_else(|e| panic!("cannot start the engine: {e}"));
    let regions: Arc<Vec<Striped>> = Arc::new(
        [(FolioSize::K4, 24 << 20), ("16K".parse::<FolioSize>().unwrap(), 16 << 20)]
            .into_iter()
            .map(|(folio, len)| {
                let region = engine.map(len, RegionOptions::default().folio(folio)).unwrap();
                let stripes = len / folio.bytes() / STRIPE;
                Striped { region, folio, versions: (0..stripes).map(|_| AtomicU32::new(0)).collect() }
            })
            .collect(),
    );
    let threads: Vec<_> = (0..THREADS)
        .map(|tid| {
            let regions = regions.clone();
            std::thread::spawn(move || -> Result<(), String> {
                // The version each stripe had before it was last discarded, for the message.
                let mut last: Vec<Vec<u32>> = regions.iter().map(|t| vec![0; t.versions.len()]).collect();
                for pass in 0..PASSES {
                    for (r, t) in regions.iter().enumerate() {
                        for stripe in (tid..t.versions.len()).step_by(THREADS) {
                            check(t, stripe, last[r][stripe])?;
                            // One stripe in three (a different third each pass) is discarded
                            // after its write: the next pass's first touches meet it Untouched.
                            write(t, stripe);
                            if (stripe / THREADS + pass as usize).is_multiple_of(3) {
                                last[r][stripe] = t.versions[stripe].load(Ordering::Relaxed);
                                discard(t, stripe);
                            }
                        }
                    }
                }
                for (r, t) in regions.iter().enumerate() {
                    for stripe in (tid..t.versions.len()).step_by(THREADS) {
                        check(t, stripe, last[r][stripe])?;
                    }
                }
                Ok(())
            })
        })
        .collect();
    let failures: Vec<String> = threads.into_iter().filter_map(|t| t.join().unwrap().err()).collect();
    let stats = engine.stats();
    assert!(failures.is_empty(), "{failures:?}\n{:?}", stats.vm);
    assert!(stats.vm.pswpout + stats.vm.zswpout > 0, "nothing was swapped out: the test does not test: {:?}", stats.vm);
    assert!(stats.vm.zero_ahead > 0, "no folio was zeroed ahead: the test does not test: {:?}", stats.vm);
}

/// Where the first touches run in sequence, most folios are zeroed ahead and the faults fall
/// to a fraction of the folios; where they jump about, none is: zeros ahead never take memory
/// for folios a program does not touch in order.
#[test]
fn only_first_touches_in_sequence_are_zeroed_ahead() {
    const PAGES: usize = 4096;
    let engine = Engine::new(Config::default().memory_high("64M").unwrap()).unwrap_or_else(|e| panic!("cannot start the engine: {e}"));
    let in_order = engine.map(PAGES * 4096, RegionOptions::default().folio(FolioSize::K4)).unwrap();
    let before = engine.stats();
    for page in 0..PAGES {
        // SAFETY: inside the live region, owned by this thread.
        unsafe { (in_order.as_ptr().add(page * 4096) as *mut u64).write_volatile(page as u64 + 1) };
    }
    let after = engine.stats();
    let allocs = |s: &folioswap::Stats| s.per_size.get("4kB").map_or(0, |k| k.anon_fault_alloc);
    assert_eq!(allocs(&after) - allocs(&before), PAGES as u64, "every page is counted allocated, once");
    let (before, after) = (before.vm, after.vm);
    let (faults, ahead) = (after.pgfault - before.pgfault, after.zero_ahead - before.zero_ahead);
    assert_eq!(faults + ahead, PAGES as u64, "every page is faulted or zeroed ahead, once: {after:?}");
    assert!(faults < PAGES as u64 / 16, "{faults} faults for {PAGES} pages touched in order: {after:?}");

    let scattered = engine.map(PAGES * 4096, RegionOptions::default().folio(FolioSize::K4)).unwrap();
    let before = engine.stats().vm;
    // A stride of 7 pages, wrapping around: no first touch follows the one before it.
    for i in 0..PAGES {
        let page = i * 7 % PAGES;
        // SAFETY: inside the live region, owned by this thread.
        unsafe { (scattered.as_ptr().add(page * 4096) as *mut u64).write_volatile(page as u64 + 1) };
    }
    let after = engine.stats().vm;
    assert_eq!(after.zero_ahead, before.zero_ahead, "first touches out of order were zeroed ahead: {after:?}");
    assert_eq!(after.pgfault - before.pgfault, PAGES as u64);
    for (region, stride) in [(&in_order, 1), (&scattered, 7)] {
        for i in 0..PAGES {
            let page = i * stride % PAGES;
            // SAFETY: inside the live region.
            let got = unsafe { (region.as_ptr().add(page * 4096) as *const u64).read_volatile() };
            assert_eq!(got, page as u64 + 1, "page {page}");
            for k in 1..512 {
                // SAFETY: as above.
                let zero = unsafe { (region.as_ptr().add(page * 4096 + k * 8) as *const u64).read_volatile() };
                assert_eq!(zero, 0, "page {page} word {k}");
            }
        }
    }
}
