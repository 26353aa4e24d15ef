//! The engine as an ordinary user (`kernel_access.rs`, `uffd.rs`): each test forks a child
//! that drops to user nobody, where the plain userfaultfd and /dev/userfaultfd are
//! refused (vm.unprivileged_userfaultfd=0, a root-only device) and the engine falls back
//! to a user-mode-only userfaultfd. Memory swaps as for root; a system call on swapped-out
//! memory fails with EFAULT until `prefault_for_kernel` makes its buffer resident; fork
//! still hands the child every byte. Needs root (to drop to nobody); changes no setting.

use folioswap::{kernel_buffer_probe, prefault_for_kernel, Config, Engine, KernelBuffer, Region, RegionOptions, UffdMode};
use std::sync::{Mutex, MutexGuard};

mod common;
use common::{as_nobody, check, fill, unprivileged_full_userfaultfd};

const MIB: usize = 1 << 20;

/// One test at a time: each forks, and a fork must not copy another test's engine threads
/// mid-work (their locks would stay held in the child).
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The mode an ordinary user gets here.
fn expected_mode() -> UffdMode {
    if unprivileged_full_userfaultfd() {
        UffdMode::Full
    } else {
        UffdMode::UserModeOnly
    }
}

fn engine(limit: &str) -> Engine {
    let engine =
        Engine::new(Config::default().memory_high(limit).unwrap()).unwrap_or_else(|e| panic!("cannot start the engine as nobody: {e}"));
    assert_eq!(engine.uffd_mode(), expected_mode());
    assert_eq!(engine.serves_kernel_faults(), expected_mode() == UffdMode::Full);
    assert_eq!(engine.stats().uffd, expected_mode());
    engine
}

/// 64 MiB under a 16 MiB limit, every word written and verified in three rounds, for each
/// folio size: it swaps out and in as for root.
#[test]
fn library_swaps_as_nobody() {
    let _serial = serial();
    as_nobody(|| {
        let e = engine("16M");
        for folio in ["4K", "64K", "2M"] {
            let before = e.stats();
            let mut r = e.map(64 * MIB, RegionOptions::default().folio_size(folio).unwrap()).unwrap();
            for round in 1..=3 {
                fill(&mut r, round);
                check(&r, round);
            }
            // Evictions in flight hold their folio's charge and its compressed copy at
            // once: a snapshot taken while one runs can read over the limit. Held still,
            // none is.
            let after = {
                let _still = e.quiesce();
                e.stats()
            };
            // Into the pool, or, once the passes show that the pool only passes folios
            // through to the swap file made on demand, straight to the file (`pool_bypass`):
            // the engine is shared by the three sizes, so a later one may find it on.
            let swapped_out = |s: &folioswap::Stats| s.vm.zswpout + s.vm.pswpout;
            assert!(swapped_out(&after) > swapped_out(&before), "{folio}: nothing was swapped out: {:?}", after.vm);
            // The charged pool writes its oldest entries back to the swap file made on
            // demand, so a folio may come back from either tier.
            let swapped_in = |s: &folioswap::Stats| s.vm.zswpin + s.vm.pswpin;
            assert!(swapped_in(&after) > swapped_in(&before), "{folio}: nothing was swapped in: {:?}", after.vm);
            assert!(after.memory.charged_bytes <= 16 * MIB as u64, "{folio}: over the limit: {:?}", after.memory);
        }
    });
}

/// The start of the first `len` bytes of `r` (at a 64 KiB boundary) with no page present: a pass over the region under a far smaller limit leaves most of
/// it swapped out, but which part is the LRU's choice, as /proc/self/pagemap says (bit 63; an ordinary user reads it
/// too, without frame numbers). Reading it faults nothing in.
fn swapped_out(r: &Region, len: usize) -> *mut u8 {
    use std::os::unix::fs::FileExt;
    let pagemap = std::fs::File::open("/proc/self/pagemap").expect("opening /proc/self/pagemap");
    let pages = len / 4096;
    let mut entries = vec![0u8; 8 * pages];
    for offset in (0..r.len() - len).step_by(64 * 1024) {
        let addr = r.as_ptr() as usize + offset;
        pagemap.read_exact_at(&mut entries, (addr / 4096 * 8) as u64).expect("reading /proc/self/pagemap");
        let present = entries.chunks_exact(8).any(|e| u64::from_le_bytes(e.try_into().unwrap()) >> 63 == 1);
        if !present {
            // SAFETY: `offset + len` lies inside the region.
            return unsafe { r.as_ptr().add(offset) };
        }
    }
    panic!("no {len} bytes of the region are swapped out after a pass over four times the limit");
}

fn pipe() -> (i32, i32) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    (fds[0], fds[1])
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// read(2) into and write(2) from swapped-out memory: EFAULT in user-mode-only mode (the
/// kernel cannot fault the page in, and nothing is lost: the pipe keeps its data), and
/// success once `prefault_for_kernel` made the buffer resident.
#[test]
fn syscalls_need_prefault_as_nobody() {
    let _serial = serial();
    as_nobody(|| {
        let e = engine("16M");
        let user_mode_only = e.uffd_mode() == UffdMode::UserModeOnly;
        let mut r = e.map(64 * MIB, RegionOptions::default().folio_size("64K").unwrap()).unwrap();
        fill(&mut r, 1);
        let len = 16 * 1024;
        let stack = [0u8; 64];
        assert_eq!(kernel_buffer_probe(stack.as_ptr(), stack.len()), KernelBuffer::Unaffected);
        let want = if user_mode_only { KernelBuffer::NeedsPrefault } else { KernelBuffer::Unaffected };
        let at = swapped_out(&r, len);
        assert_eq!(kernel_buffer_probe(at, len), want);

        // read(2) into it.
        let payload: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        let (rd, wr) = pipe();
        // SAFETY: writes `len` bytes of a live Vec into our pipe (its capacity is 64 KiB).
        assert_eq!(unsafe { libc::write(wr, payload.as_ptr().cast(), len) }, len as isize);
        if user_mode_only {
            // SAFETY: reads into the region (mapped, ours); the kernel refuses the copy.
            let n = unsafe { libc::read(rd, at.cast(), len) };
            assert_eq!((n, errno()), (-1, libc::EFAULT), "read(2) into swapped-out memory in user-mode-only mode");
        }
        // Reclaim may still be running down to its watermark and would evict pages between
        // the prefault and the call (the wrappers retry for that); held still, it cannot.
        let still = e.quiesce();
        assert_eq!(prefault_for_kernel(at, len, false), user_mode_only);
        // SAFETY: as above, now resident.
        let n = unsafe { libc::read(rd, at.cast(), len) };
        assert_eq!(n, len as isize, "read(2) after prefault_for_kernel: {}", std::io::Error::last_os_error());
        drop(still);
        // SAFETY: reading the bytes just read into the region.
        let got = unsafe { std::slice::from_raw_parts(at, len) };
        assert!(got == &payload[..], "read(2) put other bytes into the region");

        // write(2) from swapped-out memory, after another pass. Not necessarily where the
        // read went: made resident for a system call, that folio went on the active list,
        // which the pass may leave alone. Held still, reclaim moves nothing between the
        // search and the calls.
        fill(&mut r, 2);
        let still = e.quiesce();
        let at = swapped_out(&r, len);
        if user_mode_only {
            // SAFETY: writes from the region (mapped, ours); the kernel refuses the copy.
            let n = unsafe { libc::write(wr, at.cast(), len) };
            assert_eq!((n, errno()), (-1, libc::EFAULT), "write(2) from swapped-out memory in user-mode-only mode");
        }
        assert_eq!(prefault_for_kernel(at, len, false), user_mode_only);
        // SAFETY: as above, now resident.
        assert_eq!(unsafe { libc::write(wr, at.cast(), len) }, len as isize);
        drop(still);
        let mut back = vec![0u8; len];
        // SAFETY: reads `len` bytes into a live Vec.
        assert_eq!(unsafe { libc::read(rd, back.as_mut_ptr().cast(), len) }, len as isize);
        // SAFETY: the region's bytes, resident or not.
        let expected = unsafe { std::slice::from_raw_parts(at, len) };
        assert!(back == expected, "write(2) sent other bytes than the region holds");
        check(&r, 2);
        if user_mode_only {
            assert!(e.stats().vm.syscall_prefault >= 2, "{:?}", e.stats().vm);
        }
        // SAFETY: our pipe's descriptors.
        unsafe {
            libc::close(rd);
            libc::close(wr);
        }
    });
}

/// fork as nobody: the child sees every byte, swapped-out folios included (prepare_fork
/// serves their faults itself; MADV_POPULATE_READ would fail with EFAULT here), and the
/// parent keeps swapping, unsharing copy-on-write pages first.
#[test]
fn fork_as_nobody() {
    let _serial = serial();
    as_nobody(|| {
        let e = engine("32M");
        let options = RegionOptions::default().folio_size("64K").unwrap().keep_on_fork(true);
        let mut a = e.map(48 * MIB, options.clone()).unwrap();
        let mut b = e.map(48 * MIB, options).unwrap();
        fill(&mut a, 1);
        fill(&mut b, 2);
        assert!(e.stats().vm.zswpout > 0, "nothing was swapped out before the fork");
        let guard = e.prepare_fork();
        // SAFETY: the grandchild only reads memory, verifies and _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            guard.child();
            let (a, b) = (std::mem::ManuallyDrop::new(a), std::mem::ManuallyDrop::new(b));
            let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                check(&a, 1);
                check(&b, 2);
            }))
            .is_ok();
            // SAFETY: ends the grandchild at once.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        guard.parent();
        let forked = e.stats();
        assert!(forked.vm.fork_swapin > 0, "prepare_fork brought nothing back: {:?}", forked.vm);
        fill(&mut a, 3);
        check(&b, 2);
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the forked child did not see the parent's memory ({status:#x})"
        );
        check(&a, 3);
        let after = e.stats();
        assert!(after.vm.cow_unshare > 0, "no eviction had to unshare a page after the fork: {:?}", after.vm);
        assert!(after.vm.zswpout > forked.vm.zswpout, "nothing was swapped after the fork");
    });
}
