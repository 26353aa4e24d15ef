//! The swap file tier under failure: write errors (EIO, ENOSPC) keep the folio and mark
//! the slots bad, a read error or a checksum mismatch fails the fault with SIGBUS and a
//! message naming the address and the reason, and a full swap file refuses the fault
//! clearly. Every test that swaps verifies every word it wrote.
//!
//! Tests that must watch a process die run a child: this test binary again, with
//! `--ignored --exact <child>` and FOLIOSWAP_TEST_CHILD set.

use folioswap::swapfile::io::{FaultInjector, SwapFile, SwapIo};
use folioswap::{Config, Engine, FolioSize, RegionOptions};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

mod common;
use common::{check, check_text, fill, fill_incompressible, fill_page, fill_text, run_child_expecting_sigbus};

const MIB: usize = 1 << 20;

fn swap_file(size: u64) -> SwapFile {
    SwapFile::create(std::path::Path::new("/var/tmp"), size).unwrap_or_else(|e| panic!("cannot create a swap file in /var/tmp: {e}"))
}

/// A small pool so that evicted folios go to the file.
fn config() -> Config {
    Config::default().memory_high("16M").unwrap().max_pool("1M").unwrap()
}

fn engine_with(io: Box<dyn SwapIo>, config: Config) -> Engine {
    Engine::with_swap_io(config, io).unwrap_or_else(|e| panic!("cannot start the engine: {e}"))
}

#[test]
fn whole_folios_go_to_the_file_and_come_back() {
    for folio in ["2M", "64K", "4K"] {
        let e = engine_with(Box::new(swap_file(256 << 20)), config());
        let mut a = e.map(64 * MIB, RegionOptions::default().folio_size(folio).unwrap()).unwrap();
        fill(&mut a, 1);
        fill(&mut a, 2);
        check(&a, 2);
        let s = e.stats();
        let size: FolioSize = folio.parse().unwrap();
        assert!(s.vm.pswpout > 0 && s.vm.pswpin > 0, "{folio}: {:?}", s.vm);
        assert!(s.size(size).swpout > 0 && s.size(size).swpin > 0, "{folio}: {:?}", s.size(size));
        if size.is_huge() {
            assert!(s.vm.thp_swpout > 0, "{:?}", s.vm);
            assert_eq!(s.vm.thp_swpout_fallback, 0, "a nearly empty file has whole clusters");
        }
        let swap = s.swap.expect("the engine has a swap file");
        assert!(swap.io.bytes_written > 0 && swap.io.bytes_read > 0, "{swap:?}");
        drop(a);
        let swap = e.stats().swap.unwrap();
        assert_eq!(swap.slots_used, swap.slots_cached, "{folio}: slots leaked: {swap:?}");
    }
}

#[test]
fn write_errors_keep_the_folio_and_mark_slots_bad() {
    for errno in [libc::EIO, libc::ENOSPC] {
        let io = Arc::new(FaultInjector::new(swap_file(256 << 20)));
        io.fail_writes(3, errno);
        let e = engine_with(Box::new(io.clone()), config());
        let mut a = e.map(64 * MIB, RegionOptions::default().folio_size("64K").unwrap()).unwrap();
        fill(&mut a, 7);
        check(&a, 7);
        let s = e.stats();
        assert_eq!(io.injected(), 3);
        // A failed batched write fails (and marks bad) every folio it carried.
        assert!(s.vm.swap_write_error >= 3, "{:?}", s.vm);
        let swap = s.swap.unwrap();
        assert!(swap.slots_bad >= 3 * 16, "three 64K writes failed: {swap:?}");
        assert!(s.vm.pswpout > 0, "the file still works after errors: {:?}", s.vm);
    }
}

#[test]
fn charge_pool_writes_back_to_stay_under_memory_high() {
    let config = Config::default().memory_high("16M").unwrap().charge_pool(true);
    let e = engine_with(Box::new(swap_file(256 << 20)), config);
    let mut a = e.map(64 * MIB, RegionOptions::default().folio_size("64K").unwrap()).unwrap();
    fill(&mut a, 5);
    fill(&mut a, 6);
    check(&a, 6);
    let s = e.stats();
    // 48M of data that lz4 halves cannot sit in a pool charged to a 16M limit.
    assert!(s.vm.zswpwb > 0, "{:?}", s.vm);
    // The last faults' evictions may still be storing (an eviction holds the folio in the
    // swap cache until its compressed copy is in the pool): what must hold is that the
    // reclaimers bring the whole cost back under the limit once the faults stop. Waiting
    // longer only on a slower machine; a cost that stays over fails.
    let settle = std::time::Instant::now();
    let mut m = e.stats().memory;
    while m.charged_bytes > 16 << 20 && settle.elapsed() < std::time::Duration::from_secs(20) {
        std::thread::sleep(std::time::Duration::from_millis(10));
        m = e.stats().memory;
    }
    assert!(m.charged_bytes <= 16 << 20, "still over memory_high 20 s after the last fault: {m:?}");
}

/// Sequential passes over more than the limit and the pool together come back from the
/// file, every folio written back before its fault could find it in the pool: once the
/// swap-ins show that, folios go to the file directly (`zswap_bypass`) instead of being
/// compressed and decompressed on the way. Two threads, each on its own region, every word
/// checked after every pass; with `pool_bypass` off nothing is bypassed.
#[test]
fn a_pool_that_only_passes_folios_through_is_bypassed() {
    for bypass in [true, false] {
        // Readahead off: every swap-in is a fault that reads (readahead hits would count
        // toward the bypass too), and each pass closes many windows.
        let config = Config::default().memory_high("8M").unwrap().charge_pool(true).page_cluster(0).unwrap().pool_bypass(bypass);
        let e = engine_with(Box::new(swap_file(256 << 20)), config);
        let options = || RegionOptions::default().folio_size("4K").unwrap();
        let mut regions = [e.map(24 * MIB, options()).unwrap(), e.map(24 * MIB, options()).unwrap()];
        std::thread::scope(|scope| {
            for (i, a) in regions.iter_mut().enumerate() {
                scope.spawn(move || {
                    for pass in 0..3 {
                        let seed = 10 + 4 * pass + i as u64;
                        fill(a, seed);
                        check(a, seed);
                    }
                });
            }
        });
        let vm = e.stats().vm;
        assert!(vm.zswpwb > 0 && vm.pswpin > 0, "bypass {bypass}: the pool never turned over: {vm:?}");
        if bypass {
            assert!(vm.zswap_bypass > 0, "the pool passed every folio through and was never bypassed: {vm:?}");
        } else {
            assert_eq!(vm.zswap_bypass, 0, "pool_bypass off: {vm:?}");
        }
    }
}

/// Text that lz4 leaves as large as it was goes to the swap file, as zswap sends what it
/// rejects, unless a secondary codec (`recomp_algorithm`) shrinks it: then it stays in the
/// pool. `auto`, the default, is no second codec where there is a swap file and zstd:1
/// where the pool is the last tier. Every way, every byte comes back.
#[test]
fn text_lz4_cannot_shrink_goes_to_the_file_unless_a_secondary_codec_is_set() {
    for folio in ["2M", "4K"] {
        for recomp in ["none", "zstd:1", "auto"] {
            let config = Config::default().memory_high("16M").unwrap().recomp_algorithm(recomp).unwrap();
            let e = engine_with(Box::new(swap_file(256 << 20)), config);
            let mut a = e.map(24 * MIB, RegionOptions::default().folio_size(folio).unwrap()).unwrap();
            fill_text(&mut a, 3);
            check_text(&a, 3);
            check_text(&a, 3);
            let vm = e.stats().vm;
            if recomp == "zstd:1" {
                assert!(vm.zswap_recompressed > 0, "{folio}: {vm:?}");
                assert_eq!(vm.zswap_reject_compress_poor, 0, "{folio}: zstd shrinks every page of text: {vm:?}");
                // (Whether they are loaded from the pool or written back first depends on
                // when the writeback pass runs: not asserted.)
                assert!(vm.zswpout > 0, "{folio}: {vm:?}");
            } else {
                assert_eq!(vm.zswap_recompressed, 0, "{folio} {recomp}: {vm:?}");
                assert!(vm.zswap_reject_compress_poor > 0 && vm.pswpout > 0, "{folio} {recomp}: lz4 alone sends text to the file: {vm:?}");
            }
        }
    }
}

/// Where the pool is the last tier, `auto` recompresses what lz4 cannot shrink, so that
/// the text outside the limit is kept in two thirds; every byte comes back.
#[test]
fn text_is_recompressed_by_default_without_a_swap_file() {
    let config = Config::default().memory_high("16M").unwrap().no_swap_file();
    let e = Engine::new(config).unwrap_or_else(|e| panic!("cannot start the engine: {e}"));
    let mut a = e.map(24 * MIB, RegionOptions::default().folio_size("4K").unwrap()).unwrap();
    fill_text(&mut a, 5);
    check_text(&a, 5);
    let vm = e.stats().vm;
    assert!(vm.zswap_recompressed > 0 && vm.zswpout > 0, "{vm:?}");
    assert_eq!(vm.pswpout, 0, "no swap file: {vm:?}");
}

#[test]
fn large_folios_fall_back_to_pages_on_a_fragmented_file() {
    // A 32M file: 4K pages swapped out fill most of its clusters; when they come back,
    // they free scattered slots but no whole cluster, so the 2M folios they push out must
    // go as 4 KiB pieces.
    let e = engine_with(Box::new(swap_file(32 << 20)), config().slot_cache(0).unwrap());
    let mut small = e.map(20 * MIB, RegionOptions::default().folio_size("4K").unwrap()).unwrap();
    fill(&mut small, 3);
    let mut big = e.map(24 * MIB, RegionOptions::default().folio_size("2M").unwrap()).unwrap();
    fill(&mut big, 4);
    check(&small, 3);
    check(&big, 4);
    check(&small, 3);
    let s = e.stats();
    assert!(s.vm.thp_swpout_fallback > 0, "2M folios found no free cluster: {:?} {:?}", s.vm, s.swap);
    assert!(s.size(FolioSize::M2).swpout_fallback > 0, "{:?}", s.size(FolioSize::M2));
    assert_eq!(s.vm.swap_write_error, 0);
}

#[test]
fn read_error_sends_sigbus_with_the_address() {
    let stderr = run_child_expecting_sigbus("child_read_error");
    assert!(stderr.contains("fault at 0x"), "{stderr}");
    assert!(stderr.contains("reading it from swap slot"), "{stderr}");
    assert!(stderr.contains("Input/output error"), "{stderr}");
}

#[test]
#[ignore = "run by read_error_sends_sigbus_with_the_address in a child process"]
fn child_read_error() {
    assert!(std::env::var("FOLIOSWAP_TEST_CHILD").is_ok(), "run through read_error_sends_sigbus_with_the_address");
    let io = Arc::new(FaultInjector::new(swap_file(256 << 20)));
    let e = engine_with(Box::new(io.clone()), config());
    let mut a = e.map(64 * MIB, RegionOptions::default().folio_size("2M").unwrap()).unwrap();
    fill(&mut a, 1);
    assert!(e.stats().vm.pswpout > 0);
    io.fail_reads(u64::MAX, libc::EIO);
    check(&a, 1);
    unreachable!("the start of the region is on the swap file and every read fails");
}

/// Flips one bit of every folio it reads once armed.
struct Corrupting {
    inner: SwapFile,
    armed: AtomicBool,
}
impl SwapIo for Corrupting {
    fn write_at(&self, slot: u64, data: &[u8]) -> io::Result<()> {
        self.inner.write_at(slot, data)
    }
    fn read_at(&self, slot: u64, dst: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(slot, dst)?;
        if self.armed.load(Ordering::Relaxed) {
            dst[dst.len() / 3] ^= 0x10;
        }
        Ok(())
    }
    fn slots(&self) -> u64 {
        self.inner.slots()
    }
    fn stats(&self) -> folioswap::SwapIoStats {
        self.inner.stats()
    }
}

#[test]
fn checksum_mismatch_sends_sigbus() {
    let stderr = run_child_expecting_sigbus("child_checksum_mismatch");
    assert!(stderr.contains("fails the checksum"), "{stderr}");
}

#[test]
#[ignore = "run by checksum_mismatch_sends_sigbus in a child process"]
fn child_checksum_mismatch() {
    assert!(std::env::var("FOLIOSWAP_TEST_CHILD").is_ok(), "run through checksum_mismatch_sends_sigbus");
    let io = Arc::new(Corrupting { inner: swap_file(256 << 20), armed: AtomicBool::new(false) });
    let e = engine_with(Box::new(io.clone()), config());
    let mut a = e.map(64 * MIB, RegionOptions::default().folio_size("64K").unwrap()).unwrap();
    fill(&mut a, 1);
    assert!(e.stats().vm.pswpout > 0);
    io.armed.store(true, Ordering::Relaxed);
    check(&a, 1);
    unreachable!("the start of the region is on the swap file and every read is corrupted");
}

#[test]
fn full_swap_file_refuses_the_fault_clearly() {
    let stderr = run_child_expecting_sigbus("child_fills_the_swap_file");
    assert!(stderr.contains("the swap file has no room"), "{stderr}");
    assert!(stderr.contains("use a larger swap file"), "{stderr}");
}

#[test]
#[ignore = "run by full_swap_file_refuses_the_fault_clearly in a child process"]
fn child_fills_the_swap_file() {
    assert!(std::env::var("FOLIOSWAP_TEST_CHILD").is_ok(), "run through full_swap_file_refuses_the_fault_clearly");
    let e = engine_with(Box::new(swap_file(8 << 20)), Config::default().memory_high("8M").unwrap().max_pool("1M").unwrap());
    let mut r = e.map(64 * MIB, RegionOptions::default().folio_size("64K").unwrap()).unwrap();
    fill_incompressible(&mut r);
    unreachable!("64M of incompressible data cannot fit 8M of memory, a 1M pool and an 8M file");
}

/// Records which page (by the first word `fill` wrote in it) each written slot holds,
/// and the slots each read call asked for.
struct Recorder {
    file: SwapFile,
    written: std::sync::Mutex<std::collections::HashMap<u64, u64>>,
    reads: std::sync::Mutex<Vec<Vec<u64>>>,
}
impl Recorder {
    fn new(file: SwapFile) -> Recorder {
        Recorder { file, written: Default::default(), reads: Default::default() }
    }
    fn record_read(&self, slots: Vec<u64>) {
        self.reads.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(slots);
    }
    /// The slot page `page` of the data `fill_page(_, page, seed)` wrote is in, if written.
    fn slot_of(&self, seed: u64, page: usize) -> Option<u64> {
        let first = common::word(page * 4096 / 8, seed);
        let written = self.written.lock().unwrap();
        written.iter().find(|&(_, &w)| w == first).map(|(&slot, _)| slot)
    }
    fn record(&self, slot: u64, data: &[u8]) {
        let mut written = self.written.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for (i, page) in data.chunks(4096).enumerate() {
            written.insert(slot + i as u64, u64::from_le_bytes(page[..8].try_into().unwrap()));
        }
    }
}
impl SwapIo for Recorder {
    fn write_at(&self, slot: u64, data: &[u8]) -> io::Result<()> {
        self.record(slot, data);
        self.file.write_at(slot, data)
    }
    fn write_batch(&self, ios: &[(u64, &[u8])]) -> io::Result<()> {
        ios.iter().for_each(|&(slot, data)| self.record(slot, data));
        self.file.write_batch(ios)
    }
    fn read_at(&self, slot: u64, dst: &mut [u8]) -> io::Result<()> {
        self.record_read(vec![slot]);
        self.file.read_at(slot, dst)
    }
    fn read_batch(&self, ios: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        self.record_read(ios.iter().map(|(slot, _)| *slot).collect());
        self.file.read_batch(ios)
    }
    fn slots(&self) -> u64 {
        self.file.slots()
    }
    fn is_direct(&self) -> bool {
        self.file.is_direct()
    }
    fn stats(&self) -> folioswap::SwapIoStats {
        self.file.stats()
    }
}

#[test]
fn a_swapin_from_the_file_reads_its_window_in_the_same_read() {
    // The pool off: every evicted 4K page goes to the file. Of two adjacent faults, the
    // second opens a readahead window of two folios (the kernel's __swapin_nr_pages):
    // its own and the next, read with one call, as the kernel plugs the window's reads
    // with the fault's; the next page is then a readahead hit that reads nothing.
    let recorder = Arc::new(Recorder::new(swap_file(256 << 20)));
    let config = Config::default().memory_high("16M").unwrap().max_pool("0").unwrap();
    let e = engine_with(Box::new(recorder.clone()), config);
    let options = || RegionOptions::default().folio_size("4K").unwrap();
    let mut a = e.map(48 * MIB, options()).unwrap();
    fill(&mut a, 1);
    let mut b = e.map(16 * MIB, options()).unwrap();
    fill(&mut b, 2);
    check(&b, 2);
    // Room under memory_high, so that the readahead copy can be charged.
    drop(b);
    let (first, second, third) = (100, 101, 102);
    let slots: Vec<u64> = [first, second, third]
        .iter()
        .map(|&page| recorder.slot_of(1, page).unwrap_or_else(|| panic!("page {page} of a must be on the file")))
        .collect();
    let touch = |page: usize| {
        let w = u64::from_le_bytes(a.as_slice()[page * 4096..][..8].try_into().unwrap());
        assert_eq!(w, common::word(page * 4096 / 8, 1), "page {page}");
    };
    let reads_before = recorder.reads.lock().unwrap().len();
    let hits_before = e.stats().vm.swap_ra_hit;
    touch(first);
    touch(second);
    let reads: Vec<Vec<u64>> = recorder.reads.lock().unwrap()[reads_before..].to_vec();
    assert_eq!(reads.len(), 2, "two faults, {slots:?} on the file: {reads:?}");
    assert!(
        reads[1].contains(&slots[1]) && reads[1].contains(&slots[2]),
        "the second fault reads its own slot and the next page's in one call: {slots:?}, {reads:?}"
    );
    touch(third);
    // The hit may top the window up (a read of the page after it, on the helper), but
    // nothing reads the third page's slot again.
    let later: Vec<Vec<u64>> = recorder.reads.lock().unwrap()[reads_before + 2..].to_vec();
    assert!(!later.iter().any(|r| r.contains(&slots[2])), "the third page was read ahead: {slots:?}, {later:?}");
    assert_eq!(e.stats().vm.swap_ra_hit, hits_before + 1);
    check(&a, 1);
}

#[test]
fn pool_writeback_gives_a_regions_pages_consecutive_slots() {
    // Two 4K regions written page by page in turn: their folios enter the LRU, and then
    // the pool, interleaved (a0 b0 a1 b1 ...). Written back one entry at a time, a's
    // pages took every other slot; written back in sorted batches, each region's pages
    // that follow each other in memory follow each other on disk, so that readahead can
    // read them back with one I/O.
    let recorder = Arc::new(Recorder::new(swap_file(256 << 20)));
    let config = Config::default().memory_high("16M").unwrap().charge_pool(true);
    let e = engine_with(Box::new(recorder.clone()), config);
    let options = || RegionOptions::default().folio_size("4K").unwrap();
    let (mut a, mut b) = (e.map(48 * MIB, options()).unwrap(), e.map(48 * MIB, options()).unwrap());
    for round in [1u64, 2] {
        let (sa, sb) = (round << 1, (round << 1) | 1);
        for page in 0..a.len() / 4096 {
            fill_page(&mut a, page, sa);
            fill_page(&mut b, page, sb);
        }
        if round == 1 {
            check(&a, sa);
            check(&b, sb);
        }
    }
    check(&a, 4);
    check(&b, 5);
    let s = e.stats();
    assert!(s.vm.zswpwb > 1000, "the charged pool must write back: {:?}", s.vm);
    // For every slot holding a page of `a`, whether the next slot holds a's next page
    // (of the same round's data).
    let written = recorder.written.lock().unwrap();
    // The inverse of `common::word` for a page's first word: (seed, page).
    let page_of = |w: u64| (w >> 40, (w & ((1 << 40) - 1)) / (4096 / 8));
    let (mut a_pages, mut followed) = (0, 0);
    for (&slot, &w) in written.iter() {
        let (seed, page) = page_of(w);
        if seed != 2 && seed != 4 {
            continue;
        }
        a_pages += 1;
        if written.get(&(slot + 1)).is_some_and(|&n| page_of(n) == (seed, page + 1)) {
            followed += 1;
        }
    }
    eprintln!("{followed} of {a_pages} slots of a's pages are followed by a's next page; zswpwb {}", s.vm.zswpwb);
    assert!(a_pages > 1000, "a's pages must reach the file: {a_pages}");
    assert!(followed * 2 > a_pages, "{followed} of {a_pages} written pages of a are followed by a's next page on disk");
}
