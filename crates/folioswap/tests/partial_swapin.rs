//! Partial swap-in (`swapin_enabled`): a 2 MiB folio stored in pieces comes back one page
//! at a time, and from then on its pages live as independent 4 KiB folios that fault,
//! evict, fork and unmap on their own. Every page carries a version in a shadow, and
//! every word of every live page is checked.
//!
//! The folio is split while other threads fault its other pages, while reclaim evicts
//! its pages that came back, in the pool and on the swap file, in both install modes.
//! Under `adaptive` a 64 KiB folio on the swap file comes back whole wherever it faults.

use folioswap::{Config, Engine, InstallMode, Region, RegionOptions, Stats, SwapinPolicy};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier};

mod common;
use common::{in_child, mix64, wait_child};

const MIB: usize = 1 << 20;
const PAGE: usize = 4096;
const FOLIO_PAGES: usize = 512;
/// Discarded (reads as zeros) and unmapped pages, in the shadow.
const ZERO: u32 = 0;
const GONE: u32 = u32::MAX;

/// Where the evicted folios go.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Tier {
    Pool,
    /// The pool capped at 256 KiB: nearly everything goes through the file.
    File,
}

struct Shadowed {
    region: Region,
    versions: Vec<AtomicU32>,
}

fn word(page: usize, k: usize, version: u32) -> u64 {
    if version == ZERO {
        return 0;
    }
    // Compressible within a page (as usemem's data), different in every page and version.
    ((page as u64) << 20 | (k as u64 & 0xF)) ^ ((version as u64) << 44)
}

impl Shadowed {
    fn new(engine: &Engine, bytes: usize, keep_on_fork: bool) -> Shadowed {
        let options = RegionOptions::default().folio_size("2M").unwrap().keep_on_fork(keep_on_fork);
        let region = engine.map(bytes, options).unwrap();
        let versions = (0..bytes / PAGE).map(|_| AtomicU32::new(ZERO)).collect();
        Shadowed { region, versions }
    }
    fn pages(&self) -> usize {
        self.versions.len()
    }
    fn words(&self, page: usize) -> *mut u64 {
        (self.region.as_ptr() as usize + page * PAGE) as *mut u64
    }
    fn write(&self, page: usize, version: u32) {
        let w = self.words(page);
        for k in 0..PAGE / 8 {
            // SAFETY: the page lies inside the region and is mapped (not GONE); only the
            // thread that owns it writes it.
            unsafe { w.add(k).write_volatile(word(page, k, version)) };
        }
        self.versions[page].store(version, Ordering::Relaxed);
    }
    fn check(&self, page: usize) -> Result<(), String> {
        let version = self.versions[page].load(Ordering::Relaxed);
        if version == GONE {
            return Ok(());
        }
        let w = self.words(page);
        for k in 0..PAGE / 8 {
            // SAFETY: as in `write`; reads race only with the owner's writes, never made
            // while another thread checks the same page.
            let got = unsafe { w.add(k).read_volatile() };
            if got != word(page, k, version) {
                return Err(format!("page {page} word {k}: {got:#x}, expected {:#x} (version {version})", word(page, k, version)));
            }
        }
        Ok(())
    }
    fn check_all(&self) {
        for page in 0..self.pages() {
            self.check(page).unwrap_or_else(|e| panic!("final check: {e}"));
        }
    }
}

fn engine(tier: Tier, install: InstallMode, policy: SwapinPolicy) -> Engine {
    let config = Config::default().memory_high("16M").unwrap().uffd_move(install == InstallMode::Move).swapin_enabled(policy);
    let config = match tier {
        Tier::Pool => config.no_swap_file(),
        Tier::File => config.max_pool("256K").unwrap().swap_file("/var/tmp", "256M").unwrap(),
    };
    let e = Engine::new(config).unwrap_or_else(|e| panic!("cannot start the engine: {e}"));
    assert_eq!(e.install_mode(), install, "this kernel has UFFDIO_MOVE (6.8+), so both paths can be tested");
    e
}

fn assert_partial(s: &Stats, tier: Tier, what: &str) {
    assert!(s.vm.thp_swpin_fallback > 0, "{what}: no folio came back in part: {:?}", s.vm);
    assert!(s.vm.oom_kill == 0, "{what}: a fault failed: {:?}", s.vm);
    if tier == Tier::File {
        assert!(s.vm.pswpin > 0, "{what}: nothing came back from the swap file: {:?}", s.vm);
    }
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

/// Two threads fault different pages of the same swapped-out folio at the same moment,
/// folio after folio: one splits it, the other finds it split (or splitting) and takes
/// its own page. Between rounds each writes its pages, and the rest is evicted again.
fn two_threads_fault_pieces_of_one_folio(tier: Tier, install: InstallMode) {
    let e = engine(tier, install, SwapinPolicy::Never);
    let s = Arc::new(Shadowed::new(&e, 64 * MIB, false));
    for page in 0..s.pages() {
        s.write(page, 1);
    }
    let folios = s.pages() / FOLIO_PAGES;
    let barrier = Arc::new(Barrier::new(2));
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let (s, barrier) = (s.clone(), barrier.clone());
            std::thread::spawn(move || -> Result<(), String> {
                let mut rng = Rng(0x5EED + t as u64);
                for round in 0..3u32 {
                    for f in 0..folios {
                        // Each thread owns one half of every folio.
                        let page = f * FOLIO_PAGES + t * FOLIO_PAGES / 2 + rng.below(FOLIO_PAGES / 2);
                        barrier.wait();
                        s.check(page).map_err(|e| format!("round {round}: {e}"))?;
                        s.write(page, 2 + round);
                    }
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread panicked").unwrap_or_else(|e| panic!("{tier:?}/{install}: {e}"));
    }
    s.check_all();
    assert_partial(&e.stats(), tier, &format!("{tier:?}/{install}"));
}

#[test]
fn two_threads_fault_pieces_of_one_folio_pool() {
    two_threads_fault_pieces_of_one_folio(Tier::Pool, InstallMode::Move);
}

#[test]
fn two_threads_fault_pieces_of_one_folio_file() {
    two_threads_fault_pieces_of_one_folio(Tier::File, InstallMode::Move);
}

#[test]
fn copy_mode_two_threads_fault_pieces_of_one_folio() {
    two_threads_fault_pieces_of_one_folio(Tier::Pool, InstallMode::Copy);
}

/// Four threads write and check random pages (page `p` belongs to thread `p % 4`) of a
/// region four times memory_high, so folios split by one thread's fault have their pages
/// evicted again while the others fault theirs in; now and then a thread sweeps a whole
/// folio in order, which `adaptive` brings back whole (and copy mode collapses).
fn random_pages_under_eviction(tier: Tier, install: InstallMode, policy: SwapinPolicy) {
    const THREADS: usize = 4;
    let e = engine(tier, install, policy);
    let s = Arc::new(Shadowed::new(&e, 64 * MIB, false));
    for page in 0..s.pages() {
        s.write(page, 1);
    }
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || -> Result<(), String> {
                let mut rng = Rng(0xBEEF + t as u64);
                let mut version = 1;
                for op in 0..6000 {
                    let page = (rng.below(s.pages() / THREADS) * THREADS + t) % s.pages();
                    match rng.below(100) {
                        0..=44 => {
                            version += 1;
                            s.write(page, version);
                        }
                        45..=97 => s.check(page).map_err(|e| format!("op {op}: {e}"))?,
                        _ => {
                            let first = page - page % FOLIO_PAGES;
                            for p in (first..first + FOLIO_PAGES).filter(|p| p % THREADS == t) {
                                s.check(p).map_err(|e| format!("op {op} sweep: {e}"))?;
                            }
                        }
                    }
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread panicked").unwrap_or_else(|e| panic!("{tier:?}/{install}/{policy}: {e}"));
    }
    s.check_all();
    // Under quiesce: an eviction in flight holds its folio's charge and its compressed
    // copy at once, so a snapshot taken meanwhile can read over the limit.
    let stats = {
        let _still = e.quiesce();
        e.stats()
    };
    assert_partial(&stats, tier, &format!("{tier:?}/{install}/{policy}"));
    assert!(stats.memory.charged_bytes <= 16 << 20, "over memory_high: {:?}", stats.memory);
    drop(s);
    let after = e.stats();
    assert_eq!(after.memory.pool_entries, 0, "the region's pieces outlived it: {:?}", after.memory);
    if let Some(swap) = after.swap {
        assert_eq!(swap.slots_used, swap.slots_cached, "every slot is free or in a thread's cache: {swap:?}");
    }
}

#[test]
fn random_pages_under_eviction_adaptive_pool() {
    random_pages_under_eviction(Tier::Pool, InstallMode::Move, SwapinPolicy::Adaptive);
}

#[test]
fn random_pages_under_eviction_never_file() {
    random_pages_under_eviction(Tier::File, InstallMode::Move, SwapinPolicy::Never);
}

#[test]
fn copy_mode_random_pages_under_eviction_adaptive_file() {
    random_pages_under_eviction(Tier::File, InstallMode::Copy, SwapinPolicy::Adaptive);
}

/// Fault single pages of swapped-out folios back (splitting them), then fork: the child
/// sees every page, resident or not; the parent goes on writing.
#[test]
fn fork_of_partly_resident_folios() {
    let e = engine(Tier::Pool, InstallMode::Move, SwapinPolicy::Never);
    let s = Shadowed::new(&e, 48 * MIB, true);
    for page in 0..s.pages() {
        s.write(page, 1);
    }
    let mut rng = Rng(7);
    for f in 0..8 {
        let page = f * FOLIO_PAGES + rng.below(FOLIO_PAGES);
        s.check(page).unwrap();
    }
    assert_partial(&e.stats(), Tier::Pool, "before the fork");
    let guard = e.prepare_fork();
    // SAFETY: the child only reads memory, verifies and _exits (see in_child).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        guard.child();
        let s = std::mem::ManuallyDrop::new(s);
        in_child(move || s.check_all());
    }
    guard.parent();
    for page in (0..s.pages()).step_by(3) {
        s.write(page, 2);
    }
    assert_eq!(wait_child(pid), 0, "the child did not see the parent's memory");
    s.check_all();
}

/// DONTNEED and munmap of parts of folios that came back in part: discarded pages read
/// as zeros, the rest keeps its data, and nothing stored is left behind.
fn cut_partly_resident_folios(tier: Tier) {
    let e = engine(tier, InstallMode::Move, SwapinPolicy::Never);
    let s = Shadowed::new(&e, 64 * MIB, false);
    for page in 0..s.pages() {
        s.write(page, 1);
    }
    let mut rng = Rng(11);
    for f in 0..16 {
        // Bring a few pages of the folio back, then cut a range across it.
        for _ in 0..4 {
            s.check(f * FOLIO_PAGES + rng.below(FOLIO_PAGES)).unwrap();
        }
        let start = f * FOLIO_PAGES + rng.below(FOLIO_PAGES - 64);
        let len = 1 + rng.below(64);
        let addr = s.words(start) as *mut libc::c_void;
        if f % 2 == 0 {
            // SAFETY: the range lies inside the region; DONTNEED makes it read back as zeros.
            assert_eq!(unsafe { libc::madvise(addr, len * PAGE, libc::MADV_DONTNEED) }, 0);
            (start..start + len).for_each(|p| s.versions[p].store(ZERO, Ordering::Relaxed));
        } else {
            // SAFETY: the range lies inside the region and nothing touches it again (GONE).
            assert_eq!(unsafe { libc::munmap(addr, len * PAGE) }, 0);
            (start..start + len).for_each(|p| s.versions[p].store(GONE, Ordering::Relaxed));
        }
    }
    assert_partial(&e.stats(), tier, &format!("{tier:?}"));
    s.check_all();
    drop(s);
    let after = e.stats();
    assert_eq!(after.memory.pool_entries, 0, "{:?}", after.memory);
    assert_eq!(after.memory.resident_bytes + after.memory.swapcache_bytes, 0, "{:?}", after.memory);
    if let Some(swap) = after.swap {
        assert_eq!(swap.slots_used, swap.slots_cached, "every slot is free or in a thread's cache: {swap:?}");
    }
}

#[test]
fn cut_partly_resident_folios_pool() {
    cut_partly_resident_folios(Tier::Pool);
}

#[test]
fn cut_partly_resident_folios_file() {
    cut_partly_resident_folios(Tier::File);
}

/// Wait for the engine's threads to bring about `done`; a minute without it fails with `what`.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "not within a minute: {what}");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// A miss on a page of a split folio on the swap file reads that page alone; a second
/// miss in the same 64 KiB block reads the block's other pages on the file ahead, and
/// faults there take the copies. Every word checked.
#[test]
fn a_second_miss_in_a_block_reads_its_siblings_on_the_file() {
    let e = engine(Tier::File, InstallMode::Move, SwapinPolicy::Never);
    let s = Shadowed::new(&e, 64 * MIB, false);
    for page in 0..s.pages() {
        s.write(page, 1);
    }
    // Room for the copies, which are charged and never reclaim: the newest 32 MiB go.
    let newest = s.pages() / 2;
    // SAFETY: the range lies inside the region; DONTNEED makes it read back as zeros.
    assert_eq!(unsafe { libc::madvise(s.words(newest) as *mut libc::c_void, 32 * MIB, libc::MADV_DONTNEED) }, 0);
    (newest..s.pages()).for_each(|p| s.versions[p].store(ZERO, Ordering::Relaxed));
    wait_until("usage under half the limit after the discard", || e.stats().memory.charged_bytes < 8 * MIB as u64);
    // A block in the middle of a folio stored in pieces on the file (some folios are
    // still in the 256K pool, or come back whole): the first whose page comes back alone
    // from the file.
    let (block, first) = (0..newest / FOLIO_PAGES)
        .find_map(|f| {
            let page = f * FOLIO_PAGES + FOLIO_PAGES / 2;
            let before = e.stats();
            s.check(page).unwrap();
            let first = e.stats();
            let alone = first.vm.pswpin == before.vm.pswpin + 1 && first.vm.thp_swpin == before.vm.thp_swpin;
            if alone {
                assert_eq!(first.vm.swap_ra, before.vm.swap_ra, "a first miss read ahead: {:?}", first.vm);
            }
            alone.then_some((page, first))
        })
        .expect("no folio's page came back alone from the file");
    s.check(block + 1).unwrap();
    wait_until("the block's pages read ahead", || e.stats().vm.swap_ra > first.vm.swap_ra);
    let read = e.stats().vm.swap_ra - first.vm.swap_ra;
    for page in block + 2..block + 16 {
        s.check(page).unwrap();
    }
    let after = e.stats();
    assert!(after.vm.swap_ra_hit > first.vm.swap_ra_hit, "{read} pages read ahead, none taken: {:?}", after.vm);
    assert_partial(&after, Tier::File, "siblings");
    s.check_all();
}

/// `always` keeps today's whole-folio swap-in: no folio is split by a fault.
#[test]
fn always_brings_whole_folios_back() {
    let e = engine(Tier::Pool, InstallMode::Move, SwapinPolicy::Always);
    let s = Shadowed::new(&e, 48 * MIB, false);
    for page in 0..s.pages() {
        s.write(page, 1);
    }
    let mut rng = Rng(3);
    for _ in 0..64 {
        s.check(rng.below(s.pages())).unwrap();
    }
    s.check_all();
    let st = e.stats();
    assert_eq!(st.vm.thp_swpin_fallback, 0, "{:?}", st.vm);
    assert!(st.vm.thp_swpin > 0, "{:?}", st.vm);
}

/// `adaptive`: a 64 KiB folio on the swap file comes back whole wherever its fault lands
/// (one read carries all of it, and split, its pages would each pay a read of their
/// own), while one in the pool still comes back in part. Data that does not compress
/// goes to the file (`min_compression_ratio`); each fault lands in the middle of its
/// folio, where `adaptive` would otherwise take the page alone; every word is checked.
#[test]
fn adaptive_brings_a_64k_folio_on_the_file_back_whole() {
    const FOLIO: usize = 16;
    let noise = |page: usize, k: usize, version: u64| mix64((page as u64) << 32 ^ (k as u64) << 4 ^ version);
    let run = |file: bool| -> folioswap::SizeStat {
        let config = Config::default().memory_high("8M").unwrap().swapin_enabled(SwapinPolicy::Adaptive);
        let config =
            if file { config.swap_file("/var/tmp", "64M").unwrap().min_compression_ratio("2").unwrap() } else { config.no_swap_file() };
        let e = Engine::new(config).unwrap_or_else(|e| panic!("cannot start the engine: {e}"));
        let region = e.map(32 * MIB, RegionOptions::default().folio_size("64K").unwrap()).unwrap();
        let words = |page: usize| (region.as_ptr() as usize + page * PAGE) as *mut u64;
        let pages = region.len() / PAGE;
        let write = |page: usize, version: u64| {
            for k in 0..PAGE / 8 {
                // SAFETY: the page lies inside the region, which stays mapped until the end.
                unsafe { words(page).add(k).write_volatile(noise(page, k, version)) };
            }
        };
        let check = |page: usize, version: u64| {
            for k in 0..PAGE / 8 {
                // SAFETY: as in `write`.
                let got = unsafe { words(page).add(k).read_volatile() };
                assert_eq!(got, noise(page, k, version), "page {page} word {k} (file {file})");
            }
        };
        for page in 0..pages {
            write(page, 1);
        }
        let mut rng = Rng(0xF11E);
        let mut version = vec![1u64; pages];
        for _ in 0..pages / FOLIO {
            let page = rng.below(pages / FOLIO) * FOLIO + FOLIO / 2 - 1;
            check(page, version[page]);
            version[page] += 1;
            write(page, version[page]);
        }
        for (page, &v) in version.iter().enumerate() {
            check(page, v);
        }
        let s = e.stats();
        assert_eq!(s.vm.oom_kill, 0, "{:?}", s.vm);
        if file {
            assert_eq!(s.vm.zswpin, 0, "everything went to the file: {:?}", s.vm);
            assert!(s.vm.pswpin > 0, "{:?}", s.vm);
        }
        s.per_size.get("64kB").cloned().unwrap_or_default()
    };
    let on_file = run(true);
    assert!(on_file.swpin > 0, "folios came back from the file: {on_file:?}");
    assert_eq!((on_file.split, on_file.swpin_fallback), (0, 0), "none was split: {on_file:?}");
    let in_pool = run(false);
    assert!(in_pool.split > 0, "faults in the middle of pool folios still take their page alone: {in_pool:?}");
}
