//! fork(): what a child process inherits.
//!
//! A child gets a copy of the parent's address space but none of its threads, and (the
//! engine does not ask for UFFD_FEATURE_EVENT_FORK) none of its userfaultfd registrations:
//! its copies of the regions are plain anonymous memory. So the child sees exactly the
//! pages *mapped* at the fork, and a swapped-out folio would read as zeros there.
//! `Engine::prepare_fork` therefore, for the regions a child inherits
//! (`RegionOptions::keep_on_fork`; the others are MADV_DONTFORK):
//! 1. suspends the limit: charges succeed, reclaim, writeback and readahead stand still,
//!    and the work in flight finishes (`ReclaimCtl::quiesce`), so that nothing leaves
//!    memory from here on;
//! 2. brings every swapped folio (pool, swap file, swap cache) back in, by serving the
//!    fault a read would take (`fault::handle_fault`, called directly: no fault is taken,
//!    so this works with a user-mode-only userfaultfd and in signal mode too, where the
//!    kernel's MADV_POPULATE_READ fails with EFAULT); untouched and all-zero folios stay
//!    unmapped, which reads as zeros in both processes;
//! 3. holds the process-wide address map, so that no thread is inside it while the
//!    process is copied.
//!
//! After the fork the parent resumes ([`ForkGuard::parent`]). Its pages are now shared
//! copy on write with the child, and UFFDIO_MOVE refuses shared pages (EBUSY), so an
//! eviction first gives the parent its own copy (`break_cow` in evict.rs, counted as
//! `cow_unshare`). The child ([`ForkGuard::child`]) abandons the parent's engine without
//! running any of it, since its locks may be held by threads that do not exist in the
//! child: it closes the engine's descriptors (so the swap file's space goes when the
//! parent lets go of it) and forgets the rest. The inherited memory stays with the child
//! as ordinary memory outside any limit; a new engine serves what the child maps next.
//!
//! The cost: for the fork, the parent's managed memory is all resident at once, above
//! memory_high. Programs that fork and exec should prefer posix_spawn/vfork, which copy
//! nothing and need none of this.

use crate::addrmap::{MapEntry, ADDRESS_MAP};
use crate::engine::Engine;
use crate::fault::{handle_fault, FaultOutcome};
use crate::folio::{Kind, SPLIT};
use crate::mm::Mm;
use crate::size::PAGE_SIZE;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLockWriteGuard};

/// Held from [`Engine::prepare_fork`] until the fork has happened; then call
/// [`parent`](ForkGuard::parent) in the parent, [`child`](ForkGuard::child) in the child.
#[must_use = "call parent() or child() after the fork"]
pub struct ForkGuard {
    engine: Engine,
    map: RwLockWriteGuard<'static, BTreeMap<usize, MapEntry>>,
}

impl Engine {
    /// Make the process ready to fork: every swapped-out folio of the regions that a
    /// child inherits comes back in, and nothing is evicted until the guard is released.
    /// Fork while holding the guard (pthread_atfork's prepare handler is the place).
    pub fn prepare_fork(&self) -> ForkGuard {
        let mm = self.mm();
        mm.memcg.suspend();
        mm.reclaim.quiesce();
        swap_in_for_fork(mm);
        ForkGuard { engine: self.clone(), map: ADDRESS_MAP.lock_for_fork() }
    }
}

impl ForkGuard {
    /// In the parent, after the fork: the limit applies again.
    pub fn parent(self) {
        let ForkGuard { engine, map } = self;
        drop(map);
        let mm = engine.mm();
        mm.memcg.resume();
        mm.reclaim.wake_all();
    }

    /// In the child, after the fork: let go of the parent's engine without running it.
    /// Its regions stay mapped as ordinary memory; dropping a `Region` or `Engine` handle
    /// of the parent in the child is a leak, not a release (they must be forgotten:
    /// `std::mem::forget`).
    pub fn child(self) {
        let ForkGuard { engine, mut map } = self;
        let id = engine.mm().id;
        map.retain(|_, entry| entry.engine.id != id);
        drop(map);
        for fd in raw_fds(engine.mm()) {
            // SAFETY: each descriptor belongs to the abandoned engine, which no code in
            // this process uses again.
            unsafe { libc::close(fd) };
        }
        std::mem::forget(engine);
    }
}

/// The descriptors the engine holds.
fn raw_fds(mm: &Mm) -> Vec<i32> {
    use std::os::fd::AsRawFd;
    let mut fds = vec![mm.uffd.raw_fd(), mm.kick_fd.as_raw_fd()];
    fds.extend(mm.staging.raw_fds());
    fds.extend(mm.pollers.raw_fds());
    fds.extend(mm.tiers.file.as_ref().and_then(|dev| dev.io.raw_fd()));
    fds
}

/// Fault back every folio of an inherited region that is not in memory.
fn swap_in_for_fork(mm: &Arc<Mm>) {
    let mut brought = 0;
    for piece in ADDRESS_MAP.overlapping(mm.id, 0, usize::MAX) {
        let table = &piece.table;
        if !table.keep_on_fork || table.dead.load(Ordering::Acquire) {
            continue;
        }
        let folio_pages = table.folio.pages();
        let end = piece.page + piece.pages;
        let mut page = piece.page;
        while page < end {
            let head = table.head_of(page);
            let split = folio_pages == 1 || table.entry(head).load().has(SPLIT);
            let mut next = if split { page + 1 } else { (head + folio_pages).min(end) };
            let kind = table.entry(if split { page } else { head }).load().kind();
            if matches!(kind, Kind::Pool | Kind::Swapped | Kind::SwapCache) {
                let addr = piece.addr + (page - piece.page) * PAGE_SIZE;
                if bring_back(mm, addr) {
                    brought += 1;
                }
                // A partial swap-in (`swapin_enabled`) split the folio and brought back
                // only this page: its other pages come back one by one.
                if !split && table.entry(head).load().has(SPLIT) {
                    next = page + 1;
                }
            }
            page = next;
        }
    }
    mm.counters.vm.fork_swapin.add(brought);
}

/// Serve here the fault a read at `addr` would take, without taking it: the folio comes
/// back as it would for the program. (The kernel's MADV_POPULATE_READ would need the
/// engine to serve a fault the kernel takes, which a user-mode-only userfaultfd or
/// signal mode never delivers: it fails with EFAULT there, and the child would see
/// zeros.) A fault that cannot be served is then taken for real, so that it fails as the
/// program's own access would, with SIGBUS and the reason. `false`: the range was
/// unmapped meanwhile.
fn bring_back(mm: &Arc<Mm>, addr: usize) -> bool {
    match handle_fault(mm, addr) {
        FaultOutcome::Served => true,
        FaultOutcome::NotOurs(_) => false,
        FaultOutcome::Failed(_) => {
            // SAFETY: `addr` is in a mapped region (the fault was ours); the read faults it
            // and the engine fails that fault the usual way.
            unsafe { std::ptr::read_volatile(addr as *const u8) };
            true
        }
    }
}
