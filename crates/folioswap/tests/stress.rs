//! The backbone of the suite, in the mimalloc spirit: hammer the engine from several
//! threads and verify every byte against a shadow.
//!
//! Ten regions, one of every folio size, total 5× memory_high, so swapping really
//! happens. Memory is cut into 64-byte cells; each cell has a version in the shadow and
//! its eight words are a function of (region, cell, word, version): compressible like
//! usemem's data, incompressible, or all zero depending on the version, so every pool
//! path is taken. Cell `c` is written and verified only by thread `c % THREADS`, so the
//! shadow is exact, while every thread also reads other threads' cells in the same folios
//! (concurrent faults on one folio). Threads share a moving hot window per region, and
//! with small probability discard (MADV_DONTNEED) or unmap random page ranges, which cut
//! large folios. At the end every live cell of every region is checked.
//!
//! With a swap file the pool is capped at 256 KiB and takes only folios that compress 8×,
//! so most evicted data goes through the file: written straight there, or written back
//! from the full pool.
//!
//! Now and then a thread sweeps its cells of a few folios in address order, so swap-ins
//! come in sequence and readahead (on by default) brings folios in ahead of the faults,
//! racing the other threads' writes, discards and unmaps.
//!
//! FOLIOSWAP_STRESS_OPS sets the operations per thread (default 12000).

use folioswap::{Config, Engine, FaultMode, FolioSize, InstallMode, Region, RegionOptions};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

const THREADS: usize = 4;
const CELL: usize = 64;
const GONE: u32 = u32::MAX;
const REGION_BYTES: usize = 16 << 20;

struct Tracked {
    region: Region,
    folio: FolioSize,
    shadow: Vec<AtomicU32>,
    /// Held shared by accesses, exclusively by madvise/munmap so the shadow stays exact.
    lock: RwLock<()>,
    unmapped_pages: AtomicUsize,
    hot: AtomicUsize,
    /// Unmap by mapping an inaccessible placeholder over the range (`MAP_FIXED`) rather
    /// than `munmap`, so that the hole is never free: in copy mode an eviction's zap that
    /// races a `munmap` can zap whatever another thread maps in the hole at once
    /// (ARCHITECTURE.md, "Copy mode"; README, "Kernels without UFFDIO_MOVE"), and in this
    /// test that is the allocator's memory. For the engine it is the same UNMAP event.
    unmap_by_placeholder: bool,
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn word(region: usize, cell: usize, k: usize, version: u32) -> u64 {
    match version {
        0 => 0,
        v if v % 7 == 3 => 0,
        v if v % 5 == 1 => Rng(((region as u64) << 56) ^ ((cell as u64) << 8) ^ ((k as u64) << 3) ^ ((v as u64) << 32)).next(),
        v => ((cell * 8 + k) as u64) ^ ((v as u64) << 40) ^ ((region as u64) << 56),
    }
}

impl Tracked {
    /// The cell's words, accessed atomically: other threads read cells concurrently.
    fn cell(&self, cell: usize) -> &[AtomicU64; 8] {
        // SAFETY: the cell lies inside the region, 64-byte aligned, and the region outlives
        // the reference; callers only use it while the cell is mapped (shadow not GONE,
        // region lock held shared).
        unsafe { &*((self.region.as_ptr() as usize + cell * CELL) as *const [AtomicU64; 8]) }
    }
    fn cells(&self) -> usize {
        self.region.len() / CELL
    }
}

fn write_cell(t: &Tracked, r: usize, cell: usize) {
    let v = t.shadow[cell].load(Ordering::Relaxed);
    if v == GONE {
        return;
    }
    let next = if v >= GONE - 1 { 1 } else { v + 1 };
    for (k, w) in t.cell(cell).iter().enumerate() {
        w.store(word(r, cell, k, next), Ordering::Relaxed);
    }
    t.shadow[cell].store(next, Ordering::Relaxed);
}

fn check_cell(t: &Tracked, r: usize, cell: usize) -> Result<(), String> {
    let v = t.shadow[cell].load(Ordering::Relaxed);
    if v == GONE {
        return Ok(());
    }
    for (k, w) in t.cell(cell).iter().enumerate() {
        let found = w.load(Ordering::Relaxed);
        let expected = word(r, cell, k, v);
        if found != expected {
            #[allow(unused_mut)]
            let mut why = format!("region {r} ({}), cell {cell} word {k} version {v}: expected {expected:#x}, found {found:#x}", t.folio);
            // Built with `--features trace`: what the engine did to that page, oldest first.
            #[cfg(feature = "trace")]
            for line in folioswap::Engine::trace_history(w as *const _ as usize) {
                why.push_str("\n    ");
                why.push_str(&line);
            }
            return Err(why);
        }
    }
    Ok(())
}

fn touch_cell(t: &Tracked, cell: usize) -> u64 {
    if t.shadow[cell].load(Ordering::Relaxed) == GONE {
        return 0;
    }
    t.cell(cell)[0].load(Ordering::Relaxed)
}

/// Discard or unmap a random page range of a region, updating the shadow.
fn cut_range(t: &Tracked, rng: &mut Rng, unmap: bool) {
    let _g = t.lock.write().unwrap();
    let pages = t.region.len() / 4096;
    let span = 1 + rng.below((2 * t.folio.pages()).min(64));
    let start = rng.below(pages - span);
    let addr = t.region.as_ptr() as usize + start * 4096;
    if unmap {
        if t.unmapped_pages.load(Ordering::Relaxed) + span > pages / 10 {
            return;
        }
        if t.unmap_by_placeholder {
            // SAFETY: as below; the placeholder replaces the range atomically and is never
            // accessed (it stays inaccessible until the region is dropped).
            let placeholder = unsafe {
                libc::mmap(
                    addr as *mut libc::c_void,
                    span * 4096,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            assert_eq!(placeholder as usize, addr, "mapping a placeholder: {}", std::io::Error::last_os_error());
        } else {
            // SAFETY: the range lies inside the region; unmapping part of managed memory is
            // what this test exercises, and no thread touches it (exclusive lock, shadow GONE).
            assert_eq!(unsafe { libc::munmap(addr as *mut libc::c_void, span * 4096) }, 0);
        }
        t.unmapped_pages.fetch_add(span, Ordering::Relaxed);
    } else {
        // SAFETY: as above; DONTNEED of anonymous memory makes it read back as zeros.
        let rc = unsafe { libc::madvise(addr as *mut libc::c_void, span * 4096, libc::MADV_DONTNEED) };
        // ENOMEM: part of the range was unmapped earlier; the advice still applies to the rest.
        assert!(rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOMEM));
    }
    let first = start * 4096 / CELL;
    for c in first..first + span * 4096 / CELL {
        let s = &t.shadow[c];
        if s.load(Ordering::Relaxed) != GONE {
            s.store(if unmap { GONE } else { 0 }, Ordering::Relaxed);
        }
    }
}

fn stress(mode: FaultMode, compressor: &str, split: bool, swap_file: bool) {
    stress_with(mode, compressor, split, swap_file, InstallMode::Move);
}

/// `install`: `Copy` forces the path of kernels without UFFDIO_MOVE (`uffd_move` off).
fn stress_with(mode: FaultMode, compressor: &str, split: bool, swap_file: bool, install: InstallMode) {
    let ops: usize = std::env::var("FOLIOSWAP_STRESS_OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(12_000);
    let mut config = Config::default()
        .memory_high("32M")
        .unwrap()
        .max_pool(if swap_file { "256K" } else { "256M" })
        .unwrap()
        .compressor(compressor)
        .unwrap()
        .fault_mode(mode)
        .split_swap(split)
        .uffd_move(install == InstallMode::Move);
    if swap_file {
        // Folios that compress less than 8× (most with written cells) go straight to the
        // file; the sparse rest fills the 256K pool, which then writes back.
        config = config.swap_file("/var/tmp", "512M").unwrap().min_compression_ratio("8").unwrap();
    } else {
        // The pool alone, as before there was a swap file made on demand.
        config = config.no_swap_file();
    }
    let engine = Engine::new(config).unwrap_or_else(|e| panic!("cannot start the engine: {e}"));
    assert_eq!(engine.install_mode(), install, "this kernel has UFFDIO_MOVE (6.8+), so both paths can be tested");
    let regions: Arc<Vec<Tracked>> = Arc::new(
        FolioSize::ALL
            .iter()
            .map(|&folio| {
                let region = engine.map(REGION_BYTES, RegionOptions::default().folio(folio)).unwrap();
                let cells = region.len() / CELL;
                Tracked {
                    region,
                    folio,
                    shadow: (0..cells).map(|_| AtomicU32::new(0)).collect(),
                    lock: RwLock::new(()),
                    unmapped_pages: AtomicUsize::new(0),
                    hot: AtomicUsize::new(0),
                    unmap_by_placeholder: install == InstallMode::Copy,
                }
            })
            .collect(),
    );
    let total: usize = regions.iter().map(|t| t.region.len()).sum();
    assert!(total >= 4 * (32 << 20));
    let reads = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..THREADS)
        .map(|tid| {
            let regions = regions.clone();
            let reads = reads.clone();
            std::thread::spawn(move || -> Result<(), String> {
                let mut rng = Rng(0xC0FFEE ^ tid as u64);
                for op in 0..ops {
                    let r = rng.below(regions.len());
                    let t = &regions[r];
                    let cells = t.cells();
                    let folio_cells = t.folio.bytes() / CELL;
                    // Three in four accesses fall in a hot window of a few folios shared
                    // by all threads; the window moves now and then.
                    if rng.below(200) == 0 {
                        t.hot.store(rng.below(cells), Ordering::Relaxed);
                    }
                    let near = rng.below(4) != 0;
                    let base = if near { (t.hot.load(Ordering::Relaxed) + rng.below(4 * folio_cells)) % cells } else { rng.below(cells) };
                    let own = base - base % THREADS + tid;
                    let own = if own < cells { own } else { tid };
                    // Discards are 3%: the race 84a70be fixed (a walk retired an event
                    // before its folios were flagged) failed 1 of 78 runs of the swap-file
                    // cases at 1% and 3 of 24 at 3% (20 000 operations each, two at once).
                    match rng.below(1000) {
                        0..=1 => cut_range(t, &mut rng, true),
                        2..=31 => cut_range(t, &mut rng, false),
                        32..=600 => {
                            let _g = t.lock.read().unwrap();
                            write_cell(t, r, own);
                        }
                        601..=615 => {
                            // A sequential sweep over this thread's cells of a few folios:
                            // swap-ins in address order, which readahead follows.
                            let _g = t.lock.read().unwrap();
                            let span = (8 * folio_cells).min(cells);
                            let start = own - own % folio_cells;
                            for c in (start..(start + span).min(cells)).filter(|c| c % THREADS == tid) {
                                check_cell(t, r, c).map_err(|e| format!("op {op} sweep: {e}"))?;
                            }
                        }
                        616..=850 => {
                            let _g = t.lock.read().unwrap();
                            check_cell(t, r, own).map_err(|e| format!("op {op}: {e}"))?;
                        }
                        _ => {
                            let _g = t.lock.read().unwrap();
                            reads.fetch_add(touch_cell(t, base) & 1, Ordering::Relaxed);
                        }
                    }
                }
                Ok(())
            })
        })
        .collect();
    let mut failures = Vec::new();
    for t in threads {
        if let Err(e) = t.join().expect("stress thread panicked") {
            failures.push(e);
        }
    }
    let mut checked = 0;
    for (r, t) in regions.iter().enumerate() {
        for cell in 0..t.cells() {
            if let Err(e) = check_cell(t, r, cell) {
                failures.push(format!("final check: {e}"));
                break;
            }
            checked += 1;
        }
    }
    // Under quiesce: an eviction in flight holds its folio's charge and its compressed
    // copy at once, so a snapshot taken meanwhile can read over the limit.
    let stats = {
        let _still = engine.quiesce();
        engine.stats()
    };
    eprintln!(
        "{mode:?}/{compressor}/split={split}/swap_file={swap_file}/{install}: {checked} cells checked; zswpout {} zswpin {} pswpout {} pswpin {} zswpwb {} fallback {} uffd_remove {} uffd_unmap {} split {} fault_raced {} fault_before_zap {} same_filled {} raw {} swap_ra {} swap_ra_hit {} pgsteal_cluster {}",
        stats.vm.zswpout,
        stats.vm.zswpin,
        stats.vm.pswpout,
        stats.vm.pswpin,
        stats.vm.zswpwb,
        stats.per_size.values().map(|s| s.swpout_fallback).sum::<u64>(),
        stats.vm.uffd_remove,
        stats.vm.uffd_unmap,
        stats.vm.thp_split_page + stats.per_size.values().map(|s| s.split).sum::<u64>(),
        stats.vm.fault_raced,
        stats.vm.fault_before_zap,
        stats.vm.zswap_same_filled,
        stats.vm.zswap_stored_raw,
        stats.vm.swap_ra,
        stats.vm.swap_ra_hit,
        stats.vm.pgsteal_cluster,
    );
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    assert!(stats.vm.zswpout > 0 && stats.vm.zswpin > 0, "the test must swap: {:?}", stats.vm);
    assert!(stats.vm.uffd_remove > 0 && stats.vm.uffd_unmap > 0, "the test must discard and unmap");
    // Readahead is on by default (VMA, page_cluster 7, on the helper); the sweeps feed it.
    assert!(stats.vm.swap_ra > 0 && stats.vm.swap_ra_hit > 0, "readahead must run and hit: {:?}", stats.vm);
    // Eviction clustering is on by default (64 KiB blocks): 4 KiB pages left with their
    // neighbours, racing the faults, discards and unmaps on those neighbours.
    assert!(stats.vm.pgsteal_cluster > 0, "pages must leave with their neighbours: {:?}", stats.vm);
    if swap_file {
        assert!(stats.vm.pswpout > 0 && stats.vm.pswpin > 0, "the test must use the swap file: {:?}", stats.vm);
        assert!(stats.vm.zswpwb > 0, "the full pool must write back: {:?}", stats.vm);
    }
    assert!(stats.memory.charged_bytes <= 32 << 20, "over memory_high: {:?}", stats.memory);
    drop(regions);
    let after = engine.stats();
    assert_eq!(after.memory.resident_bytes + after.memory.swapcache_bytes, 0, "{:?}", after.memory);
    assert_eq!(after.memory.pool_entries, 0, "{:?}", after.memory);
    if let Some(swap) = after.swap {
        assert_eq!(swap.slots_used, swap.slots_cached, "every slot is free or in a thread's cache: {swap:?}");
        assert_eq!(swap.slots_bad, 0, "{swap:?}");
    }
}

#[test]
fn stress_thread_mode_lz4() {
    stress(FaultMode::Thread, "lz4", false, false);
}

#[test]
fn stress_signal_mode_zstd() {
    stress(FaultMode::Signal, "zstd", false, false);
}

#[test]
fn stress_thread_mode_split_swap_uncompressed() {
    stress(FaultMode::Thread, "none", true, false);
}

#[test]
fn stress_swap_file_thread_mode_lz4() {
    stress(FaultMode::Thread, "lz4", false, true);
}

#[test]
fn stress_swap_file_signal_mode_split_swap() {
    stress(FaultMode::Signal, "lz4", true, true);
}

// The same on the path of kernels 5.7 to 6.7 (no UFFDIO_MOVE): evictions write-protect,
// copy out and zap while other threads write, discard and unmap the same folios.

#[test]
fn stress_copy_mode_thread_lz4() {
    stress_with(FaultMode::Thread, "lz4", false, false, InstallMode::Copy);
}

#[test]
fn stress_copy_mode_signal_zstd() {
    stress_with(FaultMode::Signal, "zstd", false, false, InstallMode::Copy);
}

#[test]
fn stress_copy_mode_swap_file_thread_split_swap() {
    stress_with(FaultMode::Thread, "lz4", true, true, InstallMode::Copy);
}
