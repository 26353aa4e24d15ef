//! Swap readahead under fire: readahead must never serve stale data, however the folios it
//! reads ahead are written, discarded or unmapped meanwhile.
//!
//! Three threads share two regions (4 KiB and 64 KiB folios) several times memory_high.
//! Folio `f` belongs to thread `f % THREADS`, which alone writes it (whole, with a new
//! version), discards it (MADV_DONTNEED: it must read back as zeros) and verifies it
//! against its shadow. Every thread also sweeps sequentially through runs of folios that
//! include the other threads' ones, so the engine reads ahead folios their owners are
//! writing or discarding at that moment; and now and then a thread unmaps a run of folios
//! while the others' readahead may be reading it. Every owned folio is verified on every
//! sweep, and all of them at the end. A hit on a 4 KiB folio also maps the copies after
//! it (`swap_ra_mapped`), so those installs race the owners' writes and discards too.

use folioswap::{Config, Engine, FolioSize, Region, RegionOptions};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock};

const THREADS: usize = 3;
const GONE: u32 = u32::MAX;

struct Tracked {
    region: Region,
    folio: FolioSize,
    versions: Vec<AtomicU32>,
    /// Shared by accesses, exclusive around munmap (which no access may race).
    lock: RwLock<()>,
}

impl Tracked {
    fn folios(&self) -> usize {
        self.versions.len()
    }
    fn words(&self, f: usize) -> *mut u64 {
        (self.region.as_ptr() as usize + f * self.folio.bytes()) as *mut u64
    }
}

fn value(r: usize, f: usize, k: usize, version: u32) -> u64 {
    if version == 0 {
        return 0;
    }
    // Half the words repeat, so folios compress like ordinary data.
    let k = if k.is_multiple_of(2) { 0 } else { k };
    ((r as u64) << 60) ^ ((f as u64) << 32) ^ ((k as u64) << 16) ^ version as u64
}

fn write(t: &Tracked, r: usize, f: usize) {
    let v = t.versions[f].load(Ordering::Relaxed) + 1;
    let n = t.folio.bytes() / 8;
    for k in 0..n {
        // SAFETY: folio `f` lies inside the live region and only its owner writes it.
        unsafe { t.words(f).add(k).write_volatile(value(r, f, k, v)) };
    }
    t.versions[f].store(v, Ordering::Relaxed);
}

fn verify(t: &Tracked, r: usize, f: usize) -> Result<(), String> {
    let v = t.versions[f].load(Ordering::Relaxed);
    if v == GONE {
        return Ok(());
    }
    let n = t.folio.bytes() / 8;
    for k in 0..n {
        // SAFETY: inside the live region (not unmapped: the version is not GONE).
        let got = unsafe { t.words(f).add(k).read_volatile() };
        let want = value(r, f, k, v);
        if got != want {
            return Err(format!("region {r} ({}) folio {f} word {k}: {got:#x}, want {want:#x} (version {v})", t.folio));
        }
    }
    Ok(())
}

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

fn run(config: Config, label: &str) {
    let engine = Engine::new(config.memory_high("8M").unwrap()).unwrap_or_else(|e| panic!("cannot start the engine: {e}"));
    let regions: Arc<Vec<Tracked>> = Arc::new(
        [(FolioSize::K4, 24 << 20), (FolioSize::K64, 16 << 20)]
            .into_iter()
            .map(|(folio, len)| {
                let region = engine.map(len, RegionOptions::default().folio(folio)).unwrap();
                let n = len / folio.bytes();
                Tracked { region, folio, versions: (0..n).map(|_| AtomicU32::new(0)).collect(), lock: RwLock::new(()) }
            })
            .collect(),
    );
    // Fill everything once, so that most of it is swapped out before the fight starts.
    for (r, t) in regions.iter().enumerate() {
        for f in 0..t.folios() {
            write(t, r, f);
        }
    }
    let threads: Vec<_> = (0..THREADS)
        .map(|tid| {
            let regions = regions.clone();
            std::thread::spawn(move || -> Result<(), String> {
                let mut rng = Rng(0x5EED ^ ((tid as u64 + 1) * 0x9E37_79B9));
                for op in 0..1500 {
                    let r = rng.below(regions.len());
                    let t = &regions[r];
                    let n = t.folios();
                    let own = |f: usize| f - f % THREADS + tid;
                    match rng.below(100) {
                        // A sequential sweep over everyone's folios: the readahead trigger.
                        0..=39 => {
                            let _g = t.lock.read().unwrap();
                            let start = rng.below(n);
                            for f in start..(start + 48).min(n) {
                                if t.versions[f].load(Ordering::Relaxed) == GONE {
                                    continue;
                                }
                                if f % THREADS == tid {
                                    verify(t, r, f).map_err(|e| format!("op {op} sweep: {e}"))?;
                                } else {
                                    // SAFETY: inside the live region; another thread may be
                                    // writing it, so only the access (the fault) matters.
                                    let _ = unsafe { t.words(f).read_volatile() };
                                }
                            }
                        }
                        40..=79 => {
                            let _g = t.lock.read().unwrap();
                            let f = own(rng.below(n));
                            if f < n && t.versions[f].load(Ordering::Relaxed) != GONE {
                                write(t, r, f);
                            }
                        }
                        80..=97 => {
                            let _g = t.lock.read().unwrap();
                            let f = own(rng.below(n));
                            if f < n && t.versions[f].load(Ordering::Relaxed) != GONE {
                                let addr = t.words(f) as *mut libc::c_void;
                                // SAFETY: the owner discards its own folio inside the region.
                                assert_eq!(unsafe { libc::madvise(addr, t.folio.bytes(), libc::MADV_DONTNEED) }, 0);
                                t.versions[f].store(0, Ordering::Relaxed);
                            }
                        }
                        _ => {
                            // Unmap a run of folios (at most a tenth of the region in all).
                            let _g = t.lock.write().unwrap();
                            let f = rng.below(n.saturating_sub(8));
                            let gone = t.versions.iter().filter(|v| v.load(Ordering::Relaxed) == GONE).count();
                            if gone + 8 > n / 10 || (f..f + 8).any(|g| t.versions[g].load(Ordering::Relaxed) == GONE) {
                                continue;
                            }
                            // SAFETY: the run lies inside the region and nobody touches it
                            // again (exclusive lock now, GONE afterwards).
                            assert_eq!(unsafe { libc::munmap(t.words(f).cast(), 8 * t.folio.bytes()) }, 0);
                            for g in f..f + 8 {
                                t.versions[g].store(GONE, Ordering::Relaxed);
                            }
                        }
                    }
                }
                Ok(())
            })
        })
        .collect();
    let mut failures: Vec<String> = threads.into_iter().filter_map(|t| t.join().expect("thread panicked").err()).collect();
    for (r, t) in regions.iter().enumerate() {
        if let Some(e) = (0..t.folios()).find_map(|f| verify(t, r, f).err()) {
            failures.push(format!("final check: {e}"));
        }
    }
    // The helper may still be reading ahead: hold the engine still so that the totals
    // and the regions' counts are read at rest.
    let quiet = engine.quiesce();
    let stats = engine.stats();
    eprintln!(
        "{label}: swap_ra {} hit {} (mapped ahead {}) waste {} stride {}; zswpin {} pgmajfault {}; uffd_remove {} uffd_unmap {}",
        stats.vm.swap_ra,
        stats.vm.swap_ra_hit,
        stats.vm.swap_ra_mapped,
        stats.vm.swap_ra_waste,
        stats.vm.swap_ra_stride,
        stats.vm.zswpin,
        stats.vm.pgmajfault,
        stats.vm.uffd_remove,
        stats.vm.uffd_unmap
    );
    assert!(failures.is_empty(), "{label}: {} failures, first: {}", failures.len(), failures[0]);
    assert!(stats.vm.swap_ra > 0 && stats.vm.swap_ra_hit > 0, "{label}: readahead must happen and hit: {:?}", stats.vm);
    assert!(stats.vm.swap_ra_hit + stats.vm.swap_ra_waste <= stats.vm.swap_ra, "{label}: {:?}", stats.vm);
    assert!(stats.vm.swap_ra_mapped <= stats.vm.swap_ra_hit, "{label}: copies mapped ahead are hits: {:?}", stats.vm);
    if !engine.config().ra_async {
        // Read ahead on the faulting thread, a sweep's next folios are cached when its
        // next fault hits, so some must have been mapped ahead (4 KiB region).
        assert!(stats.vm.swap_ra_mapped > 0, "{label}: nothing was mapped ahead: {:?}", stats.vm);
    }
    let per_region: u64 = regions.iter().map(|t| t.region.readahead_stats().swap_ra).sum();
    assert_eq!(per_region, stats.vm.swap_ra, "{label}: the regions' counts add up to the total");
    drop(quiet);
    drop(regions);
    let after = engine.stats();
    assert_eq!(after.memory.resident_bytes + after.memory.swapcache_bytes + after.memory.readahead_bytes, 0, "{label}: {:?}", after.memory);
    assert_eq!(after.memory.pool_entries, 0, "{label}: {:?}", after.memory);
}

#[test]
fn vma_readahead_on_the_helper_never_serves_stale_data() {
    run(Config::default().no_swap_file().ra_async(true), "vma/async");
}

#[test]
fn vma_readahead_in_the_fault_path_never_serves_stale_data() {
    run(Config::default().no_swap_file().ra_async(false).ra_stride(true), "vma/sync/stride");
}

#[test]
fn slot_order_readahead_never_serves_stale_data() {
    run(Config::default().no_swap_file().vma_ra_enabled(false), "cluster/async");
}

#[test]
fn readahead_through_the_swap_file_never_serves_stale_data() {
    let config = Config::default().swap_file("/var/tmp", "256M").unwrap().max_pool("0").unwrap();
    run(config, "vma/async/swap file");
}
