//! The fault path: the engine's `do_swap_page`.
//!
//! A fault on managed memory arrives either as a userfaultfd message read by a fault
//! thread (thread mode) or as a SIGBUS in the faulting thread itself (signal mode). Both
//! end in [`Shared::handle_fault`], which finds the folio, locks it, and resolves it whole
//! by its state: zeros for a first touch, a MOVE back from staging for a swap-cache hit,
//! decompression into a staging folio and a MOVE in for a pool entry. Whoever serves a
//! fault never touches managed memory itself, so it never faults while holding a lock.
//!
//! Concurrent faults on one folio serialise on its lock: the first resolves it, the
//! others find it Resident and only wake their thread (a 4 KiB zero COPY that fails with
//! EEXIST proves the page is there). Every install holds the event gate shared and checks
//! the folio's PENDING flag first, so no install can race with a REMOVE/UNMAP/REMAP the
//! kernel is carrying out (see `events.rs`).

use crate::engine::{Shared, ADDRESS_MAP};
use crate::folio::{Kind, State, CACHED, HUGE, PENDING, SPLIT, WANTED, WRITEBACK};
use crate::memcg::Component;
use crate::region::FolioTable;
use crate::size::{FolioSize, PAGE_SIZE};
use crate::staging::{Slot, Staged};
use crate::uffd::Msg;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// Zeros to copy from for first touches of folios up to 1 MiB (2 MiB ones are moved in
/// from a kernel-zeroed THP instead).
static ZERO: [u8; 1 << 20] = [0; 1 << 20];

pub(crate) enum FaultOutcome {
    Served,
    /// The address is not (or no longer) managed memory.
    NotOurs,
    /// The fault cannot be served; the message says why.
    Failed(String),
}

/// What one attempt at resolving a fault came to.
pub(crate) enum Step {
    Done(FolioSize),
    /// A swap-in from the pool or the file (`hit`: from a readahead copy): the folio at
    /// `head` of the table, the moment for readahead.
    SwappedIn { folio: FolioSize, head: usize, hit: bool },
    Retry,
    NotOurs,
    Fail(String),
}

/// How an install placed the folio.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Installed {
    /// The slot's pages were moved into the region: the slot is a hole now.
    Moved,
    /// The slot's contents were copied: the slot still holds its pages, for reuse.
    Copied,
}

/// Why an install did not happen.
pub(crate) enum InstallError {
    /// An event is pending on the folio: apply it, then retry.
    Pending,
    /// The folio's address range is gone (or split across mappings).
    Unmapped,
    /// The kernel refused for another reason.
    Failed(String),
}

impl Shared {
    /// Serve a fault at `addr`. Returns once the folio is mapped (or the fault failed).
    pub fn handle_fault(self: &Arc<Self>, addr: usize) -> FaultOutcome {
        let start = Instant::now();
        loop {
            let Some((entry, page)) = ADDRESS_MAP.lookup(addr) else {
                return FaultOutcome::NotOurs;
            };
            if entry.engine.id != self.id {
                return entry.engine.handle_fault(addr);
            }
            match self.resolve(&entry.table, page) {
                Step::Done(folio) => {
                    let ns = start.elapsed().as_nanos() as u64;
                    self.counters.fault_latency[folio.index()].record(ns);
                    return FaultOutcome::Served;
                }
                Step::SwappedIn { folio, head, hit } => {
                    let ns = start.elapsed().as_nanos() as u64;
                    self.counters.fault_latency[folio.index()].record(ns);
                    self.counters.swapin_latency[hit as usize].record(ns);
                    // A split folio's pages are not read ahead: the window is in folios.
                    if folio == entry.table.folio {
                        self.readahead_after_fault(&entry.table, head, folio, hit);
                    }
                    return FaultOutcome::Served;
                }
                Step::Retry => continue,
                Step::NotOurs => return FaultOutcome::NotOurs,
                Step::Fail(msg) => return FaultOutcome::Failed(msg),
            }
        }
    }

    /// One attempt: lock the folio holding `page` and act on its state.
    fn resolve(&self, table: &Arc<FolioTable>, page: usize) -> Step {
        let head = table.head_of(page);
        let split = table.folio.order() == 0 || table.entry(head).load().has(SPLIT);
        let (target, folio) = if split { (page, FolioSize::K4) } else { (head, table.folio) };
        let e = table.entry(target);
        let mut s = e.lock();
        if !split && s.has(SPLIT) {
            e.unlock();
            return Step::Retry;
        }
        if s.has(PENDING) {
            match self.apply_pending_locked(table, target, folio) {
                Ok(()) => {}
                Err(crate::events::ApplyError::WaitWriteback) => {
                    e.unlock();
                    e.wait_clear(WRITEBACK);
                    return Step::Retry;
                }
                Err(crate::events::ApplyError::Failed(msg)) => {
                    e.unlock();
                    return Step::Fail(msg);
                }
            }
            s = e.load();
            if !split && s.has(SPLIT) {
                e.unlock();
                return Step::Retry;
            }
        }
        let step = match s.kind() {
            Kind::Resident => return self.fill_hole_unlock(table, page, target),
            Kind::Untouched | Kind::ZeroSwapped => self.fault_zero(table, target, folio, s),
            Kind::SwapCache if s.has(WRITEBACK) => {
                // A compressor is reading it: ask for it back and wait (it gives up).
                e.set_flag(WANTED);
                e.unlock();
                e.wait_clear(WRITEBACK);
                return Step::Retry;
            }
            Kind::SwapCache => self.fault_swapcache(table, target, folio, s),
            Kind::Pool | Kind::Swapped if s.has(CACHED) => self.fault_ra_hit(table, target, folio, s),
            Kind::Pool | Kind::Swapped => self.fault_swapin(table, target, folio, s),
            Kind::Gone => Step::NotOurs,
        };
        e.unlock();
        if let Step::Done(folio) | Step::SwappedIn { folio, .. } = step {
            self.wake_folio(table, target, folio);
        }
        step
    }

    fn fill_hole_unlock(&self, table: &Arc<FolioTable>, page: usize, target: usize) -> Step {
        let step = self.fill_hole(table, page);
        table.entry(target).unlock();
        step
    }

    /// Mark a folio resident after an install: new generation, LRU tail, counters. A
    /// folio coming back from eviction (`refault`) within the working-set distance goes
    /// on the active list.
    fn now_resident(&self, table: &Arc<FolioTable>, target: usize, folio: FolioSize, s: State, huge: bool, refault: bool) {
        let next = s.with_kind(Kind::Resident).with(HUGE, huge).with(WRITEBACK, false).next_gen();
        let e = table.entry(target);
        let mut active = false;
        if refault {
            let vm = &self.counters.vm;
            vm.workingset_refault_anon.add(folio.pages() as u64);
            if self.config.lru == crate::config::LruPolicy::Workingset {
                let distance = self.reclaim.evict_clock.load(Ordering::Relaxed).wrapping_sub(e.evicted_at()) as u64;
                let workingset = self.memcg.limit.unwrap_or(u64::MAX) / PAGE_SIZE as u64;
                active = distance <= workingset;
                if active {
                    vm.workingset_activate_anon.add(folio.pages() as u64);
                }
            }
        }
        e.set_handle(0);
        e.set_locked(next);
        self.lru.push(table.clone(), target, folio, next.gen(), active);
        self.counters.vm.pgfault.inc();
    }

    /// Wake the threads waiting on a folio, once its state and counters are published
    /// (installs do not wake, so that whoever resumes sees the fault accounted). Signal
    /// mode has nobody waiting.
    pub(crate) fn wake_folio(&self, table: &FolioTable, target: usize, folio: FolioSize) {
        if self.config.fault_mode == crate::config::FaultMode::Thread {
            let _gate = self.gate.read().unwrap();
            if let Some(addr) = table.folio_addr(target, folio.pages()) {
                self.uffd.wake(addr, folio.bytes());
            }
        }
    }

    /// A Resident folio faulted: either another thread's fault already mapped it (the
    /// common case), or the kernel zapped a page after an event was applied, which
    /// DONTNEED semantics say reads as zeros.
    fn fill_hole(&self, table: &Arc<FolioTable>, page: usize) -> Step {
        let _gate = self.gate.read().unwrap();
        let Some(addr) = table.addr_of(page) else {
            return Step::NotOurs;
        };
        match self.uffd.copy(addr, ZERO.as_ptr(), PAGE_SIZE, true) {
            Ok(()) => {}
            Err(e) if e.is(libc::EEXIST) => {
                self.counters.vm.fault_raced.inc();
                self.uffd.wake(addr, PAGE_SIZE);
            }
            Err(e) if e.is(libc::EAGAIN) => {
                drop(_gate);
                self.pump_events();
                return Step::Retry;
            }
            Err(_) => return Step::NotOurs,
        }
        Step::Done(FolioSize::K4)
    }

    /// First touch (or the return of an all-zero folio): install the folio zeroed.
    fn fault_zero(&self, table: &Arc<FolioTable>, target: usize, folio: FolioSize, s: State) -> Step {
        let bytes = folio.bytes() as u64;
        if let Err(msg) = self.reserve(bytes) {
            return Step::Fail(msg);
        }
        let result = if folio.is_huge() {
            match self.staging.take_zeroed_huge() {
                Ok((slot, from_reserve, huge)) => {
                    if from_reserve {
                        self.memcg.uncharge(Component::StagingFree, bytes);
                    }
                    let r = self.install_slot(table, target, folio, slot);
                    match r {
                        Ok(Installed::Moved) => self.staging.put_hole(slot),
                        _ => self.staging.put_filled(slot, huge, &self.memcg),
                    }
                    r.map(|_| huge)
                }
                Err(e) => Err(InstallError::Failed(format!("staging a zeroed huge page: {e}"))),
            }
        } else {
            self.install_zero(table, target, folio).map(|()| false)
        };
        match result {
            Ok(huge) => {
                self.now_resident(table, target, folio, s, huge, s.kind() == Kind::ZeroSwapped);
                let sc = self.counters.size(folio);
                if s.kind() == Kind::ZeroSwapped {
                    self.counters.vm.zswpin.add(folio.pages() as u64);
                    sc.zswpin.inc();
                } else {
                    sc.anon_fault_alloc.inc();
                    if folio.is_huge() {
                        if huge {
                            self.counters.vm.thp_fault_alloc.inc();
                        } else {
                            self.counters.vm.thp_fault_fallback.inc();
                            sc.anon_fault_fallback.inc();
                        }
                    }
                }
                Step::Done(folio)
            }
            Err(err) => {
                self.memcg.uncharge(Component::Resident, bytes);
                self.install_failed(err)
            }
        }
    }

    /// A swap-cache hit: the folio is whole in staging. A 2 MiB folio moves back from its
    /// own slot; a batch member is copied back (no TLB shootdown) from its share of the
    /// batch slot.
    fn fault_swapcache(&self, table: &Arc<FolioTable>, target: usize, folio: FolioSize, s: State) -> Step {
        let at = Staged::from_raw(table.entry(target).handle());
        let bytes = folio.bytes() as u64;
        let huge = s.has(HUGE);
        let installed = if folio.is_huge() {
            self.install_move(table, target, folio, at.slot).map(|()| {
                self.memcg.transfer(Component::SwapCache, Component::Resident, bytes);
                self.staging.put_hole(at.slot);
            })
        } else {
            if let Err(msg) = self.reserve(bytes) {
                return Step::Fail(msg);
            }
            let r = self.install_copy(table, target, folio, self.staging.staged_addr(at));
            match r {
                Ok(()) => self.release_staged(at, folio, huge),
                Err(_) => self.memcg.uncharge(Component::Resident, bytes),
            }
            r
        };
        match installed {
            Ok(()) => {
                self.now_resident(table, target, folio, s, huge, true);
                self.counters.vm.swapcache_hit.inc();
                Step::Done(folio)
            }
            Err(err) => self.install_failed(err),
        }
    }

    /// A pool entry or a folio on the swap file: decompress or read it into a staging
    /// folio, install it, free the entry or the slots. A load that fails (corrupt entry,
    /// read error, checksum mismatch) fails the fault and keeps the data where it was.
    fn fault_swapin(&self, table: &Arc<FolioTable>, target: usize, folio: FolioSize, s: State) -> Step {
        let bytes = folio.bytes() as u64;
        if let Err(msg) = self.reserve(bytes) {
            return Step::Fail(msg);
        }
        let e = table.entry(target);
        let handle = e.handle();
        let (slot, from_reserve, huge) = match self.staging.take_filled(folio.order()) {
            Ok(t) => t,
            Err(err) => {
                self.memcg.uncharge(Component::Resident, bytes);
                return Step::Fail(format!("staging a folio for swap-in: {err}"));
            }
        };
        if from_reserve {
            self.memcg.uncharge(Component::StagingFree, bytes);
            self.counters.vm.staging_reused.inc();
        } else {
            self.counters.vm.staging_populated.inc();
        }
        // SAFETY: we own the slot until we put it back, and nothing else maps it.
        let dst = unsafe { self.staging.slice_mut(slot) };
        if let Err(msg) = self.load_swapped(s.kind(), handle, dst) {
            self.staging.put_filled(slot, huge, &self.memcg);
            self.memcg.uncharge(Component::Resident, bytes);
            return Step::Fail(format!("the {folio} folio at page {target} of its region cannot be swapped in: {msg}"));
        }
        match self.install_slot(table, target, folio, slot) {
            Ok(how) => {
                self.free_swapped(s.kind(), handle, folio);
                self.release_after_install(slot, how, huge);
                let huge = huge && folio.is_huge();
                self.now_resident(table, target, folio, s, huge, true);
                self.counters.vm.pgmajfault.inc();
                self.count_swapin_io(s.kind(), folio);
                if folio.is_huge() && !huge {
                    self.counters.size(folio).swpin_fallback.inc();
                }
                Step::SwappedIn { folio, head: target, hit: false }
            }
            Err(err) => {
                self.staging.put_filled(slot, huge, &self.memcg);
                self.memcg.uncharge(Component::Resident, bytes);
                self.install_failed(err)
            }
        }
    }

    /// A readahead hit: the folio's data is already decompressed (or read) in the
    /// readahead cache; copy it in and free the pool entry or swap slot (`readahead.rs`).
    fn fault_ra_hit(&self, table: &Arc<FolioTable>, target: usize, folio: FolioSize, s: State) -> Step {
        match self.install_readahead(table, target, folio, s) {
            Some(Ok(())) => {
                self.now_resident(table, target, folio, s.with(CACHED, false), false, true);
                Step::SwappedIn { folio, head: target, hit: true }
            }
            Some(Err(err)) => self.install_failed(err),
            None => {
                // No copy behind the flag: serve it as an ordinary swap-in.
                let s = table.entry(target).set_locked(s.with(CACHED, false));
                self.fault_swapin(table, target, folio, s)
            }
        }
    }

    fn install_failed(&self, err: InstallError) -> Step {
        match err {
            InstallError::Pending => Step::Retry,
            InstallError::Unmapped => Step::NotOurs,
            InstallError::Failed(msg) => Step::Fail(msg),
        }
    }

    /// Give a slot back after its folio was installed from it.
    pub(crate) fn release_after_install(&self, slot: Slot, how: Installed, huge: bool) {
        match how {
            Installed::Moved => self.staging.put_hole(slot),
            Installed::Copied => self.staging.put_filled(slot, huge, &self.memcg),
        }
    }

    /// Put the folio in `slot` in its place in the region. 2 MiB folios move in (and
    /// arrive as THPs); smaller ones are copied: a MOVE clears the source PTEs and so
    /// flushes the TLB of every CPU the process runs on, an inter-processor interrupt that
    /// is a VM exit here, while COPY leaves the slot mapped and filled for the next
    /// decompression, at about 1 µs per 4 KiB.
    pub(crate) fn install_slot(&self, table: &FolioTable, head: usize, folio: FolioSize, slot: Slot) -> Result<Installed, InstallError> {
        if !folio.is_huge() {
            return self.install_copy(table, head, folio, self.staging.addr(slot)).map(|()| Installed::Copied);
        }
        self.install_move(table, head, folio, slot).map(|()| Installed::Moved)
    }

    pub(crate) fn install_move(&self, table: &FolioTable, head: usize, folio: FolioSize, slot: Slot) -> Result<(), InstallError> {
        let src = self.staging.addr(slot);
        let len = folio.bytes();
        let mut done = 0;
        loop {
            let gate = self.gate.read().unwrap();
            if done == 0 && table.entry(head).load().has(PENDING) {
                return Err(InstallError::Pending);
            }
            let Some(addr) = table.folio_addr(head, folio.pages()) else {
                return Err(InstallError::Unmapped);
            };
            loop {
                match self.uffd.move_pages(addr + done, src + done, len - done, false) {
                    Ok(()) => return Ok(()),
                    Err(e) if e.is(libc::EEXIST) && self.staging.moved_anyway(addr + done + e.done, src + done + e.done) => {
                        done += e.done + PAGE_SIZE;
                        if done == len {
                            return Ok(());
                        }
                    }
                    Err(e) => {
                        done += e.done;
                        match e.errno {
                            // An event is queued and unread: only with nothing moved yet.
                            libc::EAGAIN if e.done == 0 && done == 0 => break,
                            libc::EAGAIN | libc::EBUSY => std::thread::yield_now(),
                            libc::ENOENT | libc::EINVAL | libc::EFAULT if done == 0 => return Err(InstallError::Unmapped),
                            _ => {
                                return Err(InstallError::Failed(format!(
                                    "UFFDIO_MOVE into {addr:#x} ({} bytes) failed: {e}",
                                    len
                                )))
                            }
                        }
                    }
                }
            }
            drop(gate);
            self.pump_events();
        }
    }

    /// Copy zeros into a folio's place (folios below 2 MiB): one UFFDIO_COPY.
    fn install_zero(&self, table: &FolioTable, head: usize, folio: FolioSize) -> Result<(), InstallError> {
        self.install_copy(table, head, folio, ZERO.as_ptr() as usize)
    }

    /// Copy `folio.bytes()` from `src` into the folio's place. Pages already present (left
    /// by a zap racing an earlier install, or copied before an EAGAIN) are stepped over.
    pub(crate) fn install_copy(&self, table: &FolioTable, head: usize, folio: FolioSize, src: usize) -> Result<(), InstallError> {
        let len = folio.bytes();
        let mut done = 0;
        loop {
            let gate = self.gate.read().unwrap();
            if table.entry(head).load().has(PENDING) {
                return Err(InstallError::Pending);
            }
            let Some(addr) = table.folio_addr(head, folio.pages()) else {
                return Err(InstallError::Unmapped);
            };
            loop {
                match self.uffd.copy(addr + done, (src + done) as *const u8, len - done, false) {
                    Ok(()) => return Ok(()),
                    Err(e) => {
                        done += e.done;
                        match e.errno {
                            libc::EEXIST => {
                                done += PAGE_SIZE;
                                if done >= len {
                                    return Ok(());
                                }
                            }
                            libc::EAGAIN => break,
                            libc::ENOENT | libc::EINVAL | libc::EFAULT if done == 0 => return Err(InstallError::Unmapped),
                            _ => return Err(InstallError::Failed(format!("UFFDIO_COPY into {addr:#x} failed: {e}"))),
                        }
                    }
                }
            }
            drop(gate);
            self.pump_events();
        }
    }
}

/// A fault thread (thread mode: one per CPU) or the event thread (signal mode). Reads the
/// region userfaultfd, serves faults, applies events.
pub(crate) fn fault_thread(shared: Arc<Shared>) {
    let mut fds = [
        libc::pollfd { fd: shared.uffd.raw_fd(), events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: std::os::fd::AsRawFd::as_raw_fd(&shared.kick_fd), events: libc::POLLIN, revents: 0 },
    ];
    while !shared.stop.load(Ordering::Acquire) {
        shared.apply_queued_events();
        loop {
            let next = shared.deferred_faults.lock().unwrap().pop_front();
            let Some((addr, tid)) = next else { break };
            serve_message(&shared, addr, tid);
        }
        // SAFETY: `fds` is a valid array of two pollfds that outlives the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n <= 0 {
            continue;
        }
        // Stop is sticky: leave the kick unread so every other thread sees it too.
        if shared.stop.load(Ordering::Acquire) {
            break;
        }
        if fds[1].revents != 0 {
            let mut count = 0u64;
            // SAFETY: reads the 8-byte eventfd counter into a live u64.
            unsafe { libc::read(fds[1].fd, (&mut count as *mut u64).cast(), 8) };
        }
        if fds[0].revents != 0 {
            while let Some((addr, tid)) = shared.read_messages() {
                serve_message(&shared, addr, tid);
            }
        }
    }
}

fn serve_message(shared: &Arc<Shared>, addr: usize, tid: u32) {
    match shared.handle_fault(addr) {
        FaultOutcome::Served => {}
        FaultOutcome::NotOurs => shared.uffd.wake(addr & !(PAGE_SIZE - 1), PAGE_SIZE),
        FaultOutcome::Failed(msg) => {
            shared.counters.vm.oom_kill.inc();
            eprintln!("folioswap: fault at {addr:#x} in thread {tid} failed: {msg}; sending SIGBUS");
            // SAFETY: tgkill only sends a signal to a thread of this process.
            unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid as libc::c_int, libc::SIGBUS) };
        }
    }
}

impl Shared {
    /// Read messages under the gate, marking events, until a fault comes (returned) or
    /// the queue is empty.
    pub(crate) fn read_messages(&self) -> Option<(usize, u32)> {
        let _gate = self.gate.write().unwrap();
        loop {
            match self.uffd.read_msg() {
                Ok(Some(Msg::PageFault { addr, tid, .. })) => return Some((addr, tid)),
                Ok(Some(event)) => self.mark_event(event),
                Ok(None) => return None,
                Err(e) => {
                    eprintln!("folioswap: reading the userfaultfd failed: {e}");
                    return None;
                }
            }
        }
    }

    /// An install found an event queued but unread: read the queue now (events are marked,
    /// faults deferred to the fault threads) so the kernel can finish the event.
    pub(crate) fn pump_events(&self) {
        let mut deferred = Vec::new();
        while let Some(fault) = self.read_messages() {
            deferred.push(fault);
        }
        if !deferred.is_empty() {
            self.deferred_faults.lock().unwrap().extend(deferred);
        }
        self.kick();
        std::thread::yield_now();
    }
}

// ---- signal mode -------------------------------------------------------------------

static PREVIOUS_SIGBUS: OnceLock<libc::sigaction> = OnceLock::new();

/// Install the process-wide SIGBUS handler that serves faults in the faulting thread.
/// Idempotent; other SIGBUS signals go to the handler that was there before.
pub(crate) fn install_sigbus_handler() {
    PREVIOUS_SIGBUS.get_or_init(|| {
        // SAFETY: sigaction with a zeroed, then filled, struct; the handler is an
        // `extern "C"` function with the SA_SIGINFO signature. All signals are blocked
        // while it runs so that no asynchronous handler re-enters managed memory mid-fault.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigfillset(&mut action.sa_mask);
            let mut previous: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGBUS, &action, &mut previous);
            previous
        }
    });
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    if let Some((entry, _)) = ADDRESS_MAP.lookup(addr) {
        match entry.engine.handle_fault(addr) {
            FaultOutcome::Served => return,
            FaultOutcome::Failed(msg) => {
                entry.engine.counters.vm.oom_kill.inc();
                let text = format!("folioswap: fault at {addr:#x} failed: {msg}\n");
                // SAFETY: write(2) to stderr from a live buffer; then the default action is
                // restored so that returning re-faults and the process dies of SIGBUS.
                unsafe {
                    libc::write(2, text.as_ptr().cast(), text.len());
                    libc::signal(libc::SIGBUS, libc::SIG_DFL);
                }
                return;
            }
            FaultOutcome::NotOurs => {}
        }
    }
    chain_sigbus(sig, info, context);
}

fn chain_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    let Some(previous) = PREVIOUS_SIGBUS.get() else { return };
    let handler = previous.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // SAFETY: restoring the default action; the faulting access repeats and the
        // kernel applies it.
        unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
        return;
    }
    // SAFETY: `handler` is the function another component installed for SIGBUS, called
    // with the signature its flags declare.
    unsafe {
        if previous.sa_flags & libc::SA_SIGINFO != 0 {
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = std::mem::transmute(handler);
            f(sig, info, context);
        } else {
            let f: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
            f(sig);
        }
    }
}
