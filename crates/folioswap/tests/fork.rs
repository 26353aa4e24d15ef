//! fork() with managed memory (`fork.rs`): a child inherits exactly the parent's memory,
//! swapped-out folios included, and the parent keeps swapping afterwards although its
//! pages are shared copy on write with the child. And several processes' engines sharing
//! one limit (`shared_limit`).

use folioswap::{Config, Engine, FaultMode, InstallMode, Region, RegionOptions};

mod common;
use common::{check, fill, in_child, wait_child};

const MIB: usize = 1 << 20;

fn engine(config: Config) -> Engine {
    Engine::new(config).unwrap_or_else(|e| panic!("cannot start the engine: {e}"))
}

fn fork_sees_everything(folio: &str) {
    fork_sees_everything_in(folio, FaultMode::Thread);
}

fn fork_sees_everything_in(folio: &str, mode: FaultMode) {
    fork_sees_everything_with(folio, mode, InstallMode::Move);
}

fn fork_sees_everything_with(folio: &str, mode: FaultMode, install: InstallMode) {
    fork_sees_everything_under(folio, Config::default().fault_mode(mode).uffd_move(install == InstallMode::Move), install);
}

fn fork_sees_everything_under(folio: &str, config: Config, install: InstallMode) {
    let e = engine(config.memory_high("32M").unwrap());
    assert_eq!(e.install_mode(), install);
    let options = RegionOptions::default().folio_size(folio).unwrap().keep_on_fork(true);
    let mut a = e.map(48 * MIB, options.clone()).unwrap();
    let mut b = e.map(48 * MIB, options).unwrap();
    fill(&mut a, 1);
    fill(&mut b, 2);
    let before = e.stats();
    assert!(before.vm.zswpout > 0, "{folio}: nothing was swapped out before the fork");

    let guard = e.prepare_fork();
    // SAFETY: the child only reads memory, verifies and _exits (see in_child).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        guard.child();
        let (a, b) = (std::mem::ManuallyDrop::new(a), std::mem::ManuallyDrop::new(b));
        in_child(move || {
            check(&a, 1);
            check(&b, 2);
        });
    }
    guard.parent();
    let forked = e.stats();
    assert!(forked.vm.fork_swapin > 0, "{folio}: prepare_fork brought nothing back");

    // The parent swaps again while the child still holds the shared pages: its own
    // writes and reads must not reach the child, and eviction must break the sharing.
    fill(&mut a, 3);
    check(&b, 2);
    assert_eq!(wait_child(pid), 0, "{folio}: the child did not see the parent's memory");
    check(&a, 3);
    let after = e.stats();
    if install == InstallMode::Move {
        // Copy mode reads shared pages as they are, and zaps only the parent's mapping.
        assert!(after.vm.cow_unshare > 0, "{folio}: no eviction had to unshare a page after the fork");
    }
    assert!(after.vm.zswpout > forked.vm.zswpout, "{folio}: nothing was swapped after the fork");
}

#[test]
fn forked_child_sees_swapped_memory_4k() {
    fork_sees_everything("4K");
}

#[test]
fn forked_child_sees_swapped_memory_64k() {
    fork_sees_everything("64K");
}

#[test]
fn forked_child_sees_swapped_memory_2m() {
    fork_sees_everything("2M");
}

/// In signal mode the kernel cannot take a fault on the engine's behalf (it would get
/// EFAULT, as MADV_POPULATE_READ did), so prepare_fork serves the swapped folios' faults
/// itself.
#[test]
fn forked_child_sees_swapped_memory_signal_mode() {
    fork_sees_everything_in("64K", FaultMode::Signal);
}

/// With written bits (`written_aging`) the regions are registered write-protect: the
/// child's copies are not registered at all, so their marks must not trap its reads, and the
/// parent's protected pages, shared copy on write, must take its writes as its own.
#[test]
fn forked_child_sees_swapped_memory_with_written_aging() {
    fork_sees_everything_under("64K", Config::default().written_aging(true), InstallMode::Move);
}

#[test]
fn copy_mode_forked_child_sees_swapped_memory_2m() {
    fork_sees_everything_with("2M", FaultMode::Thread, InstallMode::Copy);
}

#[test]
fn copy_mode_forked_child_sees_swapped_memory_signal_mode() {
    fork_sees_everything_with("64K", FaultMode::Signal, InstallMode::Copy);
}

#[test]
fn regions_without_keep_on_fork_are_not_inherited() {
    let e = engine(Config::default().memory_high("16M").unwrap());
    let mut r = e.map(4 * MIB, RegionOptions::default()).unwrap();
    fill(&mut r, 1);
    let addr = r.as_ptr() as usize;
    // SAFETY: the child only probes its address space and _exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        in_child(move || {
            let mut vec = [0u8; 1];
            // SAFETY: mincore on a page address; fails with ENOMEM if nothing is mapped.
            let rc = unsafe { libc::mincore(addr as *mut libc::c_void, 4096, vec.as_mut_ptr()) };
            assert_eq!(rc, -1, "a DONTFORK region is mapped in the child");
        });
    }
    assert_eq!(wait_child(pid), 0);
    check(&r, 1);
}

/// An engine sharing the limit in `path`. The shared file sums what the processes charge;
/// a charged pool is added per process on top (not shared), so these engines keep the pool
/// uncharged (no swap file) and their charges are exactly what the file sums.
fn shared_engine(path: &std::path::Path) -> Engine {
    engine(Config::default().memory_high("32M").unwrap().shared_limit(path).no_swap_file())
}

fn fill_both(a: &mut Region, b: &mut Region, rounds: u64) {
    for round in 0..rounds {
        fill(a, 10 + round);
        fill(b, 20 + round);
    }
}

#[test]
fn engines_sharing_a_limit_keep_their_sum_under_it() {
    let dir = std::env::temp_dir().join(format!("folioswap-shared-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("limit");
    let (e1, e2) = (shared_engine(&path), shared_engine(&path));
    let options = RegionOptions::default().folio_size("64K").unwrap();
    let (mut a, mut b) = (e1.map(24 * MIB, options.clone()).unwrap(), e2.map(24 * MIB, options).unwrap());
    // 48 MiB in all under a 32 MiB limit: each engine alone would fit, together they
    // must swap.
    fill_both(&mut a, &mut b, 2);
    check(&a, 11);
    check(&b, 21);
    // Reclaim may still be bringing the charge down to the low watermark: hold both
    // engines still, so that the charges compared are not moving.
    let (q1, q2) = (e1.quiesce(), e2.quiesce());
    let (s1, s2) = (e1.stats(), e2.stats());
    let shared = s1.memory.shared_charged_bytes.expect("the limit is shared");
    assert!(shared <= 32 << 20, "shared charge {shared} over the limit");
    assert_eq!(shared, s1.memory.charged_bytes + s2.memory.charged_bytes, "the shared charge is the sum");
    assert!(s1.vm.zswpout + s2.vm.zswpout > 0, "48M under a shared 32M limit did not swap");
    e1.leave_shared_limit();
    assert_eq!(e2.stats().memory.shared_charged_bytes, Some(s2.memory.charged_bytes));
    drop((q1, q2));
    drop((a, b, e1, e2));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_dead_process_share_is_taken_back() {
    let dir = std::env::temp_dir().join(format!("folioswap-reap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("limit");
    // SAFETY: the child starts its own engine, charges memory and _exits without
    // giving the charge back, as a crashed process would.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let path = path.clone();
        in_child(move || {
            let e = shared_engine(&path);
            let mut r = std::mem::ManuallyDrop::new(e.map(8 * MIB, RegionOptions::default()).unwrap());
            fill(&mut r, 1);
            std::mem::forget(e);
        });
    }
    assert_eq!(wait_child(pid), 0);
    let e = shared_engine(&path);
    let mut r = e.map(40 * MIB, RegionOptions::default().folio_size("64K").unwrap()).unwrap();
    // The child's 8 MiB count until a reclaimer finds the shared usage over its high
    // watermark and takes back the dead process's share; filling 40 MiB gets there.
    // Before, only a fault that found nothing of its own to reclaim did: in 1 run of 30
    // none did, and the share stood (8 MiB over a limit of 32 with 25 MiB of its own).
    fill(&mut r, 2);
    check(&r, 2);
    let waited = std::time::Instant::now();
    loop {
        let m = e.stats().memory;
        if m.shared_charged_bytes == Some(m.charged_bytes) {
            break;
        }
        // A bound for a hung reclaimer only: the reap comes with the fill's evictions.
        assert!(waited.elapsed() < std::time::Duration::from_secs(60), "the dead process's share was never taken back: {m:?}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // Under quiesce, as in the other tests that compare a charge with the limit: work in
    // flight (an eviction, a staging slot charged again as it is put back) can hold
    // charges that a snapshot reads over it. Unquiesced, this one read 256K over about
    // once in 60 runs (CI failed on it); quiesced, 0 in 150.
    let stats = {
        let _still = e.quiesce();
        e.stats()
    };
    let shared = stats.memory.shared_charged_bytes.unwrap();
    assert!(
        shared <= 32 << 20,
        "shared charge {shared} over the limit (own {}, overruns {}, memory {:?})",
        stats.memory.charged_bytes,
        stats.vm.memory_high_overrun,
        stats.memory
    );
    drop((r, e));
    std::fs::remove_dir_all(&dir).unwrap();
}
