//! Behaviour the issue pins down, one test each: THPs after first touch and after
//! swap-in, split-mode swap, the error paths, mremap of swapped memory, and the kernel
//! touching managed memory on the program's behalf; the first three also on the path of
//! kernels without UFFDIO_MOVE (`copy_mode_*`).
//!
//! Tests that must watch a process die run a child: this test binary again, with
//! `--ignored --exact <child>` and FOLIOSWAP_TEST_CHILD set.

use folioswap::{Config, Engine, Error, FaultMode, FolioSize, InstallMode, Region, RegionOptions};

mod common;
use common::{check, fill, fill_incompressible, run_child_expecting_sigbus};

const MIB: usize = 1 << 20;

/// These tests pin down the engine with the compressed pool alone: no swap file, not
/// even the one made on demand (`tests/limits.rs` covers that default).
fn engine(config: Config) -> Engine {
    Engine::new(config.no_swap_file()).unwrap_or_else(|e| panic!("cannot start the engine: {e}"))
}

/// Touch `other` fully so that everything in the engine but `other`'s tail is evicted.
fn push_out(other: &mut Region) {
    fill(other, 99);
}

#[test]
fn huge_folios_are_thps_after_first_touch_and_after_swap_in() {
    huge_folios_are_thps(InstallMode::Move);
}

/// Without UFFDIO_MOVE a 2 MiB folio is copied in as 4 KiB pages and collapsed.
#[test]
fn copy_mode_collapses_huge_folios_into_thps() {
    huge_folios_are_thps(InstallMode::Copy);
}

fn huge_folios_are_thps(install: InstallMode) {
    let e = engine(Config::default().memory_high("32M").unwrap().uffd_move(install == InstallMode::Move));
    assert_eq!(e.install_mode(), install);
    let mut a = e.map(16 * MIB, RegionOptions::default().folio_size("2M").unwrap()).unwrap();
    assert_eq!(a.as_ptr() as usize % (2 * MIB), 0, "2M regions are 2 MiB aligned");
    fill(&mut a, 1);
    assert_eq!(a.anon_huge_bytes().unwrap(), 16 * MIB as u64, "first touch installs PMD-mapped THPs");

    let mut b = e.map(64 * MIB, RegionOptions::default().folio_size("2M").unwrap()).unwrap();
    push_out(&mut b);
    // Held still from here, so that what is counted does not move: reclaim (with the pool
    // charged, the pool's growth can push usage over the limit) would evict a's folios
    // again meanwhile.
    let quiet = e.quiesce();
    let before = e.stats();
    // a's folios still resident are THPs; the rest were swapped out (which ones is the
    // LRU's choice).
    let out_folios = (16 * MIB as u64 - a.anon_huge_bytes().unwrap()) / (2 * MIB as u64);
    assert!(out_folios > 0, "a's folios were swapped out: {:?}", before.size(FolioSize::M2));
    check(&a, 1);
    assert_eq!(a.anon_huge_bytes().unwrap(), 16 * MIB as u64, "swap-in brings back PMD-mapped THPs: {:?}", e.stats());
    let s = e.stats();
    drop(quiet);
    let m2 = |st: &folioswap::Stats| st.size(FolioSize::M2).zswpin + st.size(FolioSize::M2).swpin + st.vm.swapcache_hit;
    // A folio whose compression had not finished comes back from the swap cache instead.
    assert!(m2(&s) - m2(&before) >= out_folios, "{out_folios} folios out: {:?} {:?}", s.size(FolioSize::M2), s.vm);
    assert_eq!(s.vm.thp_swpout_fallback, 0);
    assert!(s.vm.thp_fault_alloc >= 8 + 32);
    match install {
        InstallMode::Move => assert_eq!(s.vm.thp_collapse_alloc, 0),
        // First touch of a and b, then a's folios that were swapped out and came back.
        InstallMode::Copy => assert!(s.vm.thp_collapse_alloc >= 8 + 32 + out_folios, "{out_folios} folios out: {:?}", s.vm),
    }
}

#[test]
fn split_swap_brings_huge_folios_back_as_small_pages() {
    let e = engine(Config::default().memory_high("32M").unwrap().split_swap(true));
    let mut a = e.map(16 * MIB, RegionOptions::default().folio_size("2M").unwrap()).unwrap();
    fill(&mut a, 2);
    let mut b = e.map(64 * MIB, RegionOptions::default().folio_size("2M").unwrap()).unwrap();
    push_out(&mut b);
    // Held still, so that reclaim does not evict a's folios again while they are counted.
    // a's folios still resident are THPs; the others were swapped out as 4 KiB pages
    // (which ones, and whether all of them, is the LRU's choice).
    let quiet = e.quiesce();
    let before = e.stats();
    let huge_before = a.anon_huge_bytes().unwrap();
    let out_folios = (16 * MIB as u64 - huge_before) / (2 * MIB as u64);
    assert!(out_folios > 0, "a's folios were swapped out: {:?}", before.size(FolioSize::M2));
    assert!(before.vm.thp_swpout_fallback >= out_folios, "{:?}", before.vm);
    assert!(before.size(FolioSize::M2).swpout_fallback >= out_folios);
    check(&a, 2);
    let s = e.stats();
    drop(quiet);
    let back = |st: &folioswap::Stats| st.size(FolioSize::K4).zswpin + st.size(FolioSize::K4).swpin + st.vm.swapcache_hit;
    assert!(
        back(&s) - back(&before) >= out_folios * 512,
        "swap-in is page by page, {out_folios} folios out: {:?} {:?}",
        s.size(FolioSize::K4),
        s.vm
    );
    assert_eq!(a.anon_huge_bytes().unwrap(), huge_before, "the kernel's old way loses the huge pages of the folios it swapped");
}

#[test]
fn every_folio_size_round_trips_through_the_pool() {
    // The pool is the subject: no bypass to the swap file, whatever the passes show.
    let e = engine(Config::default().memory_high("16M").unwrap().pool_bypass(false));
    let mut regions: Vec<Region> = FolioSize::ALL.iter().map(|&f| e.map(8 * MIB, RegionOptions::default().folio(f)).unwrap()).collect();
    for (i, r) in regions.iter_mut().enumerate() {
        fill(r, i as u64);
    }
    for (i, r) in regions.iter().enumerate() {
        check(r, i as u64);
    }
    // Under quiesce: an eviction in flight holds its folio's charge and its compressed
    // copy at once, so a snapshot taken meanwhile can read over the limit.
    let s = {
        let _still = e.quiesce();
        e.stats()
    };
    for f in FolioSize::ALL {
        let c = s.size(f);
        assert!(c.anon_fault_alloc > 0 && c.zswpout > 0 && c.zswpin > 0, "{f}: {c:?}");
    }
    assert!(s.memory.charged_bytes <= 16 * MIB as u64);
}

#[test]
fn stats_use_the_kernel_names_and_serialise() {
    let e = engine(Config::default().memory_high("8M").unwrap());
    let mut r = e.map(16 * MIB, RegionOptions::default().folio_size("64K").unwrap()).unwrap();
    fill(&mut r, 3);
    check(&r, 3);
    let json = serde_json::to_value(e.stats()).unwrap();
    for key in
        ["pswpin", "pswpout", "zswpin", "zswpout", "zswpwb", "swap_ra", "swap_ra_hit", "thp_swpout", "thp_swpout_fallback", "pgmajfault"]
    {
        assert!(json.get(key).is_some(), "missing {key} in {json}");
    }
    let size = &json["per_size"]["64kB"];
    for key in ["anon_fault_alloc", "anon_fault_fallback", "swpout", "swpout_fallback", "swpin", "zswpout", "split"] {
        assert!(size.get(key).is_some(), "missing per-size {key} in {size}");
    }
    let lat = &json["fault_latency"]["64kB"];
    for key in ["p50_us", "p90_us", "p99_us", "p99.9_us"] {
        assert!(lat[key].as_f64().unwrap() > 0.0, "latency {key} in {lat}");
    }
    assert!(json["memory"]["resident_bytes"].as_u64().unwrap() > 0);
    assert!(json["memory"]["pool_total_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn a_region_larger_than_the_address_space_fails_clearly() {
    let e = engine(Config::default());
    let err = e.map(1 << 52, RegionOptions::default()).err().expect("4 PiB cannot be mapped");
    assert!(matches!(err, Error::Map { .. }), "{err:?}");
    assert!(err.to_string().contains("address space"), "{err}");
    let err = e.map(0, RegionOptions::default()).err().expect("empty regions are refused");
    assert!(err.to_string().contains("at least one byte"), "{err}");
    let err = RegionOptions::default().folio_size("3K").unwrap_err();
    assert!(err.to_string().contains("folio_size=\"3K\""), "{err}");
}

#[test]
fn kernel_accesses_are_served_in_thread_mode() {
    kernel_accesses_are_served(InstallMode::Move);
}

#[test]
fn copy_mode_kernel_accesses_are_served() {
    kernel_accesses_are_served(InstallMode::Copy);
}

fn kernel_accesses_are_served(install: InstallMode) {
    let e = engine(Config::default().memory_high("8M").unwrap().fault_mode(FaultMode::Thread).uffd_move(install == InstallMode::Move));
    assert_eq!(e.install_mode(), install);
    let mut dst = e.map(8 * MIB, RegionOptions::default().folio_size("64K").unwrap()).unwrap();
    fill(&mut dst, 4);
    let mut other = e.map(16 * MIB, RegionOptions::default().folio_size("64K").unwrap()).unwrap();
    push_out(&mut other);
    // read(2) into swapped-out managed memory: the kernel's copy_to_user faults.
    let mut fds = [0; 2];
    // SAFETY: pipe fills two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let (rd, wr) = (fds[0], fds[1]);
    let payload = vec![0xA5u8; 60_000];
    // SAFETY: writes from a live buffer to our pipe (it holds 64 KiB).
    assert_eq!(unsafe { libc::write(wr, payload.as_ptr().cast(), payload.len()) }, payload.len() as isize);
    let target = dst.as_ptr() as usize + 3 * MIB + 100;
    // SAFETY: reads into managed memory inside `dst`, which lives across the call.
    let n = unsafe { libc::read(rd, target as *mut libc::c_void, payload.len()) };
    assert_eq!(n, payload.len() as isize, "read(2) into managed memory: {}", std::io::Error::last_os_error());
    let got = &dst.as_slice()[3 * MIB + 100..3 * MIB + 100 + payload.len()];
    assert!(got.iter().all(|&b| b == 0xA5));
    // SAFETY: closing our own descriptors.
    unsafe { libc::close(rd) };
    // SAFETY: as above.
    unsafe { libc::close(wr) };
}

fn mremap(old: usize, len: usize, new: usize) -> usize {
    // SAFETY: moves a managed mapping we own to a fixed address we reserved.
    let p =
        unsafe { libc::mremap(old as *mut libc::c_void, len, len, libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED, new as *mut libc::c_void) };
    assert_ne!(p, libc::MAP_FAILED, "mremap: {}", std::io::Error::last_os_error());
    p as usize
}

fn reserve(len: usize, align: usize) -> usize {
    // SAFETY: reserves fresh address space; we place mremap targets in it.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len + align, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
    assert_ne!(p, libc::MAP_FAILED);
    (p as usize + align - 1) & !(align - 1)
}

fn word_at(addr: usize) -> u64 {
    // SAFETY: callers pass addresses of mapped managed memory.
    unsafe { (addr as *const u64).read_volatile() }
}

#[test]
fn mremap_moves_swapped_out_data_with_it() {
    mremap_moves_swapped_out_data(InstallMode::Move);
}

#[test]
fn copy_mode_mremap_moves_swapped_out_data_with_it() {
    mremap_moves_swapped_out_data(InstallMode::Copy);
}

fn mremap_moves_swapped_out_data(install: InstallMode) {
    let e = engine(Config::default().memory_high("16M").unwrap().uffd_move(install == InstallMode::Move));
    assert_eq!(e.install_mode(), install);
    for folio in ["64K", "2M"] {
        let mut r = e.map(16 * MIB, RegionOptions::default().folio_size(folio).unwrap()).unwrap();
        fill(&mut r, 5);
        let mut other = e.map(32 * MIB, RegionOptions::default().folio_size("64K").unwrap()).unwrap();
        push_out(&mut other);
        let base = r.as_ptr() as usize;
        // A folio-aligned middle part, then (for 64K) a part that cuts folios.
        let target = reserve(8 * MIB, 2 * MIB);
        let moved = mremap(base + 4 * MIB, 4 * MIB, target);
        for j in (0..4 * MIB / 8).step_by(509) {
            let index = (4 * MIB / 8 + j) as u64;
            assert_eq!(word_at(moved + j * 8), index ^ (5 << 40), "{folio}: moved word {j}");
        }
        let cut_to = target + 4 * MIB + 2 * MIB;
        let cut = mremap(base + 8 * MIB + 12288, 40960, cut_to);
        for j in 0..40960 / 8 {
            let index = ((8 * MIB + 12288) / 8 + j) as u64;
            assert_eq!(word_at(cut + j * 8), index ^ (5 << 40), "{folio}: cut word {j}");
        }
        // What stayed behind is intact too.
        for j in (0..4 * MIB / 8).step_by(331) {
            assert_eq!(word_at(base + j * 8), j as u64 ^ (5 << 40), "{folio}: stayed word {j}");
        }
        push_out(&mut other);
        assert_eq!(word_at(moved + 8), (4 * MIB / 8 + 1) as u64 ^ (5 << 40));
        let s = e.stats();
        assert!(s.vm.uffd_remap >= 2, "{:?}", s.vm);
    }
}

#[test]
fn pool_full_refuses_the_fault_clearly() {
    let stderr = run_child_expecting_sigbus("child_fills_a_tiny_pool");
    assert!(stderr.contains("the compressed pool is full"), "{stderr}");
    assert!(stderr.contains("raise max_pool or memory_high"), "{stderr}");
}

#[test]
#[ignore = "run by pool_full_refuses_the_fault_clearly in a child process"]
fn child_fills_a_tiny_pool() {
    assert!(std::env::var("FOLIOSWAP_TEST_CHILD").is_ok(), "run through pool_full_refuses_the_fault_clearly");
    for mode in [FaultMode::Signal, FaultMode::Thread] {
        let e = engine(Config::default().memory_high("8M").unwrap().max_pool("1M").unwrap().fault_mode(mode));
        let mut r = e.map(64 * MIB, RegionOptions::default().folio_size("64K").unwrap()).unwrap();
        fill_incompressible(&mut r);
    }
    unreachable!("64M of incompressible data cannot fit 8M of memory and a 1M pool");
}

/// Where even a user-mode-only userfaultfd is refused (an ordinary user gets one where the
/// others are root-only: `tests/nonroot.rs` runs the engine as nobody), the error says
/// what is missing and how to fix it.
#[test]
fn no_userfaultfd_permission_says_how_to_fix_it() {
    let e = Error::UserfaultfdUnavailable { errno: libc::EPERM }.to_string();
    assert!(e.contains("userfaultfd is not permitted"), "{e}");
    assert!(e.contains("/dev/userfaultfd") && e.contains("vm.unprivileged_userfaultfd"), "{e}");
}
