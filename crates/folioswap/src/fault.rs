//! The fault path: the engine's `do_swap_page`, top to bottom.
//!
//! 1. A fault on managed memory arrives either as a userfaultfd message read by a fault
//!    thread (`fault_thread`, thread mode) or as a SIGBUS in the faulting thread itself
//!    (`on_sigbus`, signal mode).
//! 2. `handle_fault` finds the folio's table through the address map (the engine that
//!    owns it, if another one) and retries `resolve` until it settles.
//! 3. `resolve` locks the folio (its head, or the page once split), applies any event
//!    pending on it (`events.rs`), and takes one arm per state:
//!    - Untouched / ZeroSwapped → `fault_zero`: charge, install zeros (unless the
//!      kernel's zap of discarded pages is still to come);
//!    - Resident → `fill_hole`: another thread's fault mapped it already (or an event
//!      zapped a page, which reads as zeros);
//!    - SwapCache under WRITEBACK → ask the compressor for it back (WANTED) and wait;
//!    - SwapCache → `fault_swapcache`: move (2 MiB) or copy it back from staging;
//!    - Pool / Swapped with a readahead copy → `fault_ra_hit`: copy the copy in;
//!    - Pool / Swapped → `fault_swapin`: charge, decompress or read into a staging
//!      folio, install it, free the stored data;
//!    - Gone → not ours.
//! 4. The arm marks it resident (`now_resident`: generation, LRU, counters), the lock is
//!    released and the faulting thread woken (`install::wake_folio`).
//! 5. After a swap-in, readahead may bring the neighbours in (`readahead.rs`); after a
//!    first touch that continues a run of them, `zero_ahead` installs the next folios
//!    zeroed.
//!
//! Whoever serves a fault never touches managed memory itself, so it never faults while
//! holding a lock. Concurrent faults on one folio serialise on its lock: the first
//! resolves it, the others find it Resident and only wake their thread (a 4 KiB zero
//! COPY that fails with EEXIST proves the page is there). Every install holds the event
//! gate shared and checks PENDING first (`install.rs`), so no install races with a
//! REMOVE/UNMAP/REMAP the kernel is carrying out.

use crate::addrmap::ADDRESS_MAP;
use crate::charge::{reserve, try_charge, Oom};
use crate::config::{LruPolicy, SwapinPolicy};
use crate::event_queue::Action;
use crate::events::{apply_pending_locked, publish_split_in_storage, ApplyError};
use crate::folio::{Kind, State, CACHED, HUGE, PENDING, SPLIT, WANTED, WRITEBACK};
use crate::gate::{pump_events, read_messages};
use crate::install::{install_copy, install_slot, install_zero, wake_folio, zero_page, InstallError, Installed};
use crate::memcg::Component;
use crate::mm::Mm;
use crate::pool_share::LoadedFrom;
use crate::ra_cache::RaRequest;
use crate::ra_window::swapin_whole;
use crate::readahead::{install_readahead, plan_file_siblings, readahead_after_fault, start_readahead, swapin_from_file, SWAPIN_READ_MAX};
use crate::release::{release_after_install, release_staged};
use crate::size::{FolioSize, PAGE_SIZE};
use crate::stages::{self, Stage};
use crate::staging::{Staged, Taken};
use crate::table::FolioTable;
use crate::tier::{LoadError, Tiers};
use crate::uffd::InstallMode;
use std::fmt;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Once};
use std::time::Instant;

pub(crate) enum FaultOutcome {
    Served,
    /// The address is not (or no longer) managed memory.
    NotOurs(Unserved),
    /// The fault cannot be served.
    Failed(FaultError),
}

/// Why a fault cannot be served: the process gets SIGBUS with this message.
#[derive(Debug)]
pub(crate) enum FaultError {
    /// memory_high cannot be kept.
    Charge(Oom),
    /// No staging slot for the folio.
    Staging(std::io::Error),
    /// The folio's stored data cannot be brought back; it stays where it was.
    SwapIn { folio: FolioSize, page: usize, err: LoadError },
    /// The kernel refused to map the folio.
    Install(InstallError),
    /// A pending event could not be applied (`events.rs`).
    Event(ApplyError),
}

impl fmt::Display for FaultError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FaultError::Charge(oom) => write!(f, "{oom}"),
            FaultError::Staging(err) => write!(f, "no staging slot for the folio: {err}"),
            FaultError::SwapIn { folio, page, err } => {
                write!(f, "the {folio} folio at page {page} of its region cannot be swapped in: {err}")
            }
            FaultError::Install(err) => write!(f, "{err}"),
            FaultError::Event(err) => write!(f, "{err}"),
        }
    }
}

/// Why a fault at an address was found not to be this engine's to serve. Normally the
/// program unmapped the address while its fault was on the way: woken, its thread faults
/// again on whatever is mapped there now. The same address found so again and again is
/// an engine that lost track of a page (`Mm::unserved`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unserved {
    /// No region holds the address.
    NoRegion,
    /// The page's UNMAP event was applied: it is Gone.
    Gone,
    /// None of the region's mapped pieces holds the page.
    NoPiece,
    /// The kernel would not install at the address (ENOENT, EINVAL, EFAULT): its range is
    /// no longer registered.
    InstallRefused,
}

/// How many times in a row (no pause over 100 ms) one address may be found not ours
/// before the engine gives up on it: a program's unmap in flight lets a fault come back a
/// few hundred times at most (until the `munmap` takes `mmap_lock`); past this the engine
/// itself lost the page, and waking the thread again would spin it forever.
const UNSERVED_STREAK_LIMIT: u32 = 1 << 16;

/// What one attempt at resolving a fault came to.
enum Step {
    Done(FolioSize),
    /// A first touch of the folio at `head` (zeros installed): the moment for zero-ahead.
    Zeroed {
        folio: FolioSize,
        head: usize,
    },
    /// A swap-in from the pool or the file (`hit`: from a readahead copy): the folio at
    /// `head` of the table, the moment for readahead. `planned`: a swap-in from the file
    /// read its window with it (`swapin_from_file`), and these are what it left to read.
    SwappedIn {
        folio: FolioSize,
        head: usize,
        hit: bool,
        planned: Option<Option<RaRequest>>,
    },
    Retry,
    NotOurs(Unserved),
    Fail(FaultError),
}

/// A fault thread (thread mode: one per CPU) or the event thread (signal mode). Reads the
/// region userfaultfd, serves faults, applies events.
pub(crate) fn fault_thread(mm: Arc<Mm>) {
    // Which slot of the poll token is this thread's (`pollers.rs`).
    let slot = mm.pollers.claim_slot();
    crate::local_wake::LocalWake::join(slot);
    let mut fds = [
        libc::pollfd { fd: mm.uffd.raw_fd(), events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: mm.kick_fd.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: mm.pollers.wake_fd(slot), events: libc::POLLIN, revents: 0 },
    ];
    while !mm.stop.load(Ordering::Acquire) {
        crate::events::apply_queued_events(&mm);
        loop {
            let next = mm.deferred_faults.lock().unwrap().pop_front();
            let Some((addr, tid)) = next else { break };
            serve_message(&mm, addr, tid);
        }
        // Without the token, poll(2) skips the userfaultfd (a negative descriptor).
        fds[0].fd = if mm.pollers.polls(slot) { mm.uffd.raw_fd() } else { -1 };
        // Without it, watch for the token's holder left at idle priority (`local_wake.rs`).
        let timeout = if fds[0].fd < 0 { mm.local_wake.watch_timeout() } else { -1 };
        // SAFETY: `fds` is a valid array of three pollfds that outlives the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if n == 0 {
            mm.local_wake.rescue(|| mm.uffd.has_message(), &mm.counters);
        }
        if n <= 0 {
            continue;
        }
        // Stop is sticky: leave the kick unread so every other thread sees it too.
        if mm.stop.load(Ordering::Acquire) {
            break;
        }
        for fd in fds[1..].iter().filter(|fd| fd.revents != 0) {
            crate::eventfd::drain(fd.fd);
        }
        if fds[0].revents != 0 {
            let mut last = None;
            while let Some((addr, tid)) = read_messages(&mm) {
                // Another thread's fault queued behind the one just served.
                if last.is_some_and(|last| last != tid) && mm.pollers.note_concurrent() {
                    mm.counters.vm.fault_poll_moves.inc();
                }
                // Read while the thread is blocked in this fault: where it faulted.
                let faulted_on = crate::thread_cpu::cpu_of(tid);
                serve_message(&mm, addr, tid);
                if mm.pollers.note_served(tid, faulted_on) {
                    mm.counters.vm.fault_poll_moves.inc();
                }
                last = Some(tid);
                // Read again only if a message is waiting: a read takes the gate's write
                // lock, which waits for every eviction's move in flight and holds up every
                // install behind it, and one read in seven found nothing at 4K random
                // (BENCHMARKS.md, "A read of the userfaultfd only when a message waits").
                if !mm.uffd.has_message() {
                    break;
                }
            }
        }
    }
}

fn serve_message(mm: &Arc<Mm>, addr: usize, tid: u32) {
    match handle_fault(mm, addr) {
        FaultOutcome::Served => {}
        FaultOutcome::NotOurs(why) => {
            let page_addr = addr & !(PAGE_SIZE - 1);
            if mm.unserved.count(page_addr) < UNSERVED_STREAK_LIMIT {
                mm.uffd.wake(page_addr, PAGE_SIZE);
                return;
            }
            let state = ADDRESS_MAP.lookup(addr).map_or_else(
                || "in no region".to_string(),
                |(entry, page)| {
                    let table = &entry.table;
                    let head = table.entry(table.head_of(page)).load();
                    format!("page {page} of a {} region, its folio's head {head:?}, the page {:?}", table.folio, table.entry(page).load())
                },
            );
            let reason = format!(
                "was found not ours ({why:?}) {UNSERVED_STREAK_LIMIT} times in a row ({state}): a page the engine lost (BUG), and waking the thread again would spin it forever"
            );
            fail_thread(mm, addr, tid, &reason);
        }
        FaultOutcome::Failed(err) => fail_thread(mm, addr, tid, &format!("failed: {err}")),
    }
}

/// The fault at `addr` cannot be served: say why and send its thread SIGBUS.
fn fail_thread(mm: &Mm, addr: usize, tid: u32, reason: &str) {
    mm.counters.vm.oom_kill.inc();
    eprintln!("folioswap: fault at {addr:#x} in thread {tid} {reason}; sending SIGBUS");
    // SAFETY: tgkill only sends a signal to a thread of this process.
    unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid as libc::c_int, libc::SIGBUS) };
}

/// Serve a fault at `addr`. Returns once the folio is mapped (or the fault failed).
pub(crate) fn handle_fault(mm: &Arc<Mm>, addr: usize) -> FaultOutcome {
    let outer = stages::begin();
    let outcome = handle_fault_timed(mm, addr);
    stages::end(outer);
    outcome
}

fn handle_fault_timed(mm: &Arc<Mm>, addr: usize) -> FaultOutcome {
    let start = Instant::now();
    crate::local_wake::take_woken_at();
    // A fault ends as its thread is woken (`local_wake.rs`): what follows is readahead.
    let served_ns = || crate::local_wake::take_woken_at().unwrap_or_else(Instant::now).saturating_duration_since(start).as_nanos() as u64;
    loop {
        let Some((entry, page)) = ADDRESS_MAP.lookup(addr) else {
            return FaultOutcome::NotOurs(Unserved::NoRegion);
        };
        if entry.engine.id != mm.id {
            return handle_fault(&entry.engine, addr);
        }
        match resolve(mm, &entry.table, page) {
            Step::Done(folio) => {
                let ns = served_ns();
                mm.counters.fault_latency[folio.index()].record(ns);
                return FaultOutcome::Served;
            }
            Step::Zeroed { folio, head } => {
                let ns = served_ns();
                mm.counters.fault_latency[folio.index()].record(ns);
                if folio == entry.table.folio && !folio.is_huge() {
                    zero_ahead(mm, &entry.table, head, folio);
                }
                return FaultOutcome::Served;
            }
            Step::SwappedIn { folio, head, hit, planned } => {
                let ns = served_ns();
                mm.counters.fault_latency[folio.index()].record(ns);
                mm.counters.swapin_latency[hit as usize].record(ns);
                // A split folio's pages are not read ahead by the window, which is in folios;
                // a second miss in a 64 KiB block reads the block's pages on the swap file.
                if folio == entry.table.folio {
                    // The window moves on from the last copy mapped, as if it had faulted.
                    let last = if hit { map_ahead(mm, &entry.table, head, folio) } else { head };
                    match planned {
                        Some(rest) => rest.into_iter().for_each(|request| start_readahead(mm, request)),
                        None => readahead_after_fault(mm, &entry.table, last, folio, hit),
                    }
                } else if !hit {
                    if let Some(request) = plan_file_siblings(mm, &entry.table, head) {
                        start_readahead(mm, request);
                    }
                }
                if !hit {
                    stages::lap(&mm.counters.stages, Stage::SwapinReadahead);
                }
                return FaultOutcome::Served;
            }
            Step::Retry => continue,
            Step::NotOurs(why) => return FaultOutcome::NotOurs(why),
            Step::Fail(err) => return FaultOutcome::Failed(err),
        }
    }
}

/// One attempt: lock the folio holding `page` and act on its state.
fn resolve(mm: &Mm, table: &Arc<FolioTable>, page: usize) -> Step {
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
        match apply_pending_locked(mm, table, target, folio) {
            Ok(()) => {}
            Err(ApplyError::WaitWriteback) => {
                e.unlock();
                e.wait_clear(WRITEBACK);
                return Step::Retry;
            }
            Err(err) => {
                e.unlock();
                return Step::Fail(FaultError::Event(err));
            }
        }
        s = e.load();
        if !split && s.has(SPLIT) {
            e.unlock();
            return Step::Retry;
        }
    }
    let step = match s.kind() {
        Kind::Resident => {
            let step = fill_hole(mm, table, page);
            e.unlock();
            return step;
        }
        Kind::Untouched | Kind::ZeroSwapped => fault_zero(mm, table, target, folio, s),
        Kind::SwapCache if s.has(WRITEBACK) => {
            // A compressor is reading it: ask for it back and wait (it gives up).
            e.set_flag(WANTED);
            e.unlock();
            e.wait_clear(WRITEBACK);
            return Step::Retry;
        }
        Kind::SwapCache => fault_swapcache(mm, table, target, folio, s),
        Kind::Pool | Kind::Swapped if s.has(CACHED) => fault_ra_hit(mm, table, target, folio, s),
        Kind::Pool | Kind::Swapped if !split && swapin_in_part(mm, table, page, folio, s) => {
            if split_on_swapin(mm, table, target, folio, s) {
                // Now order-0 pages: the retry swaps in the one that faulted.
                e.unlock();
                return Step::Retry;
            }
            fault_swapin(mm, table, target, folio, s)
        }
        Kind::Pool | Kind::Swapped => fault_swapin(mm, table, target, folio, s),
        Kind::Gone => Step::NotOurs(Unserved::Gone),
    };
    e.unlock();
    if let Step::Done(folio) | Step::Zeroed { folio, .. } | Step::SwappedIn { folio, .. } = step {
        wake_folio(mm, table, target, folio);
    }
    if let Step::SwappedIn { hit: false, .. } = step {
        stages::lap_until(&mm.counters.stages, Stage::SwapinWake, crate::local_wake::woken_at());
    }
    step
}

/// A Resident folio faulted: either another thread's fault already mapped it (the
/// common case), or the kernel zapped a page after an event was applied, which
/// DONTNEED semantics say reads as zeros.
fn fill_hole(mm: &Mm, table: &Arc<FolioTable>, page: usize) -> Step {
    let _gate = mm.gate.read().unwrap();
    let Some(addr) = table.addr_of(page) else {
        return Step::NotOurs(Unserved::NoPiece);
    };
    match mm.uffd.copy(addr, zero_page(), PAGE_SIZE, true) {
        Ok(()) => {}
        Err(e) if e.is(libc::EEXIST) => {
            mm.counters.vm.fault_raced.inc();
            if mm.install == InstallMode::Copy {
                // A write that met a copy-out's write protection: the eviction gave the
                // folio up (or kept pages it could not zap), so lift it; this wakes too.
                let _ = mm.uffd.writeprotect(addr, PAGE_SIZE, false);
            }
            mm.uffd.wake(addr, PAGE_SIZE);
        }
        Err(e) if e.is(libc::EAGAIN) => {
            drop(_gate);
            pump_events(mm);
            return Step::Retry;
        }
        Err(_) => return Step::NotOurs(Unserved::InstallRefused),
    }
    Step::Done(FolioSize::K4)
}

/// First touch (or the return of an all-zero folio): install the folio zeroed.
///
/// A folio whose pages are partly or wholly mapped already is left Untouched
/// and uncharged (`fault_before_zap`): an applied REMOVE released it, and the kernel's zap
/// of the old pages has not run yet (a fault read before the event, served after it). Their
/// data is what the program discarded; marked Resident, an eviction before the zap would
/// store it and bring it back after. The zap makes the folio a hole again, and the next
/// fault fills it; the pages the copy did fill hold zeros, as the zap leaves them (where a
/// zap in progress had passed them already, they stay mapped and unclaimed, outside the
/// limit, until the program discards or unmaps them).
fn fault_zero(mm: &Mm, table: &Arc<FolioTable>, target: usize, folio: FolioSize, s: State) -> Step {
    let bytes = folio.bytes() as u64;
    let _charge = match reserve(mm, bytes) {
        Ok(charge) => charge,
        Err(oom) => return Step::Fail(FaultError::Charge(oom)),
    };
    let result = if folio.is_huge() {
        match mm.staging.take_zeroed_huge() {
            Ok(Taken { slot, from_reserve, huge }) => {
                if from_reserve {
                    mm.memcg.uncharge(Component::StagingFree, bytes);
                }
                // A move cannot step over mapped pages: copy around them (rare; checked
                // first, since a move that meets one has moved part of the slot away).
                let mapped = table.folio_addr(target, folio.pages()).is_some_and(|addr| mm.staging.any_present(addr, folio.bytes()));
                if mapped {
                    let r = install_zero(mm, table, target, folio, mm.staging.addr(slot));
                    mm.staging.put_filled(slot, huge, &mm.memcg);
                    match r {
                        Ok(0) => Ok(false),
                        Ok(_mapped_already) => return zero_before_zap(mm, folio),
                        Err(err) => Err(FaultError::Install(err)),
                    }
                } else {
                    let r = install_slot(mm, table, target, folio, slot);
                    match r {
                        Ok(Installed::Moved) => mm.staging.put_hole(slot),
                        _ => mm.staging.put_filled(slot, huge, &mm.memcg),
                    }
                    r.map(|how| how.thp(huge)).map_err(FaultError::Install)
                }
            }
            Err(err) => Err(FaultError::Staging(err)),
        }
    } else {
        match install_zero(mm, table, target, folio, zero_page() as usize) {
            Ok(0) => Ok(false),
            Ok(_mapped_already) => return zero_before_zap(mm, folio),
            Err(err) => Err(FaultError::Install(err)),
        }
    };
    match result {
        Ok(huge) => {
            now_resident(mm, table, target, folio, s, huge, s.kind() == Kind::ZeroSwapped);
            let sc = mm.counters.size(folio);
            if s.kind() == Kind::ZeroSwapped {
                mm.counters.vm.zswpin.add(folio.pages() as u64);
                sc.zswpin.inc();
            } else {
                sc.anon_fault_alloc.inc();
                if folio.is_huge() {
                    if huge {
                        mm.counters.vm.thp_fault_alloc.inc();
                    } else {
                        mm.counters.vm.thp_fault_fallback.inc();
                        sc.anon_fault_fallback.inc();
                    }
                }
            }
            if s.kind() == Kind::Untouched {
                Step::Zeroed { folio, head: target }
            } else {
                Step::Done(folio)
            }
        }
        Err(err) => {
            mm.memcg.uncharge(Component::Resident, bytes);
            failed(err)
        }
    }
}

/// `fault_zero` found pages of the folio mapped already: leave it Untouched, give its
/// charge back, and wake the faulting thread (its page is mapped now, with zeros or with
/// the data the zap is about to discard).
fn zero_before_zap(mm: &Mm, folio: FolioSize) -> Step {
    mm.memcg.uncharge(Component::Resident, folio.bytes() as u64);
    mm.counters.vm.fault_before_zap.inc();
    Step::Done(folio)
}

/// A swap-cache hit: the folio is whole in staging. A 2 MiB folio moves back from its
/// own slot; a batch member is copied back (no TLB shootdown) from its share of the
/// batch slot.
fn fault_swapcache(mm: &Mm, table: &Arc<FolioTable>, target: usize, folio: FolioSize, s: State) -> Step {
    let at = Staged::from_raw(table.entry(target).handle());
    let bytes = folio.bytes() as u64;
    let huge = s.has(HUGE);
    let installed = if folio.is_huge() {
        install_slot(mm, table, target, folio, at.slot).map(|how| {
            mm.memcg.transfer(Component::SwapCache, Component::Resident, bytes);
            release_after_install(mm, at.slot, how, huge);
            how.thp(huge)
        })
    } else {
        let _charge = match reserve(mm, bytes) {
            Ok(charge) => charge,
            Err(oom) => return Step::Fail(FaultError::Charge(oom)),
        };
        let r = install_copy(mm, table, target, folio, mm.staging.staged_addr(at));
        match r {
            Ok(()) => release_staged(mm, at, folio, huge),
            Err(_) => mm.memcg.uncharge(Component::Resident, bytes),
        }
        r.map(|()| false)
    };
    match installed {
        Ok(thp) => {
            now_resident(mm, table, target, folio, s, thp, true);
            mm.counters.vm.swapcache_hit.inc();
            Step::Done(folio)
        }
        Err(err) => failed(FaultError::Install(err)),
    }
}

/// A pool entry or a folio on the swap file: decompress or read it into a staging folio,
/// install it, free the entry or the slots. A load that fails (corrupt entry, read
/// error, checksum mismatch) fails the fault and keeps the data where it was.
fn fault_swapin(mm: &Mm, table: &Arc<FolioTable>, target: usize, folio: FolioSize, s: State) -> Step {
    let times = &mm.counters.stages;
    stages::lap(times, Stage::SwapinLookup);
    let bytes = folio.bytes() as u64;
    let _charge = match reserve(mm, bytes) {
        Ok(charge) => charge,
        Err(oom) => return Step::Fail(FaultError::Charge(oom)),
    };
    stages::lap(times, Stage::SwapinCharge);
    let e = table.entry(target);
    let handle = e.handle();
    let Taken { slot, from_reserve, huge } = match mm.staging.take_filled(folio.order()) {
        Ok(taken) => taken,
        Err(err) => {
            mm.memcg.uncharge(Component::Resident, bytes);
            return Step::Fail(FaultError::Staging(err));
        }
    };
    if from_reserve {
        mm.memcg.uncharge(Component::StagingFree, bytes);
        mm.counters.vm.staging_reused.inc();
    } else {
        mm.counters.vm.staging_populated.inc();
    }
    stages::lap(times, Stage::SwapinStaging);
    // SAFETY: we own the slot until we put it back, and nothing else maps it.
    let dst = unsafe { mm.staging.slice_mut(slot) };
    // From the file, an unsplit folio reads its readahead window in the same I/O.
    let (loaded, planned) = if s.kind() == Kind::Swapped && folio == table.folio {
        let (loaded, rest) = swapin_from_file(mm, table, target, folio, handle, dst);
        (loaded, Some(rest))
    } else {
        (mm.tiers.load(s.kind(), handle, dst, &mm.counters), None)
    };
    if let Err(err) = loaded {
        mm.staging.put_filled(slot, huge, &mm.memcg);
        mm.memcg.uncharge(Component::Resident, bytes);
        return Step::Fail(FaultError::SwapIn { folio, page: target, err });
    }
    stages::lap(times, Stage::SwapinLoad);
    let installed = install_slot(mm, table, target, folio, slot);
    stages::lap(times, Stage::SwapinInstall);
    match installed {
        Ok(how) => {
            mm.tiers.free(s.kind(), handle, folio);
            release_after_install(mm, slot, how, huge);
            mm.tiers.note_swapin(LoadedFrom::of(s.kind()), mm.lru.distance_since(e.evicted_at()), &mm.lru, mm.memcg.limit);
            let huge = how.thp(huge) && folio.is_huge();
            now_resident(mm, table, target, folio, s, huge, true);
            mm.counters.vm.pgmajfault.inc();
            Tiers::count_load(s.kind(), folio, &mm.counters);
            if folio.is_huge() && !huge {
                mm.counters.size(folio).swpin_fallback.inc();
            }
            stages::lap(times, Stage::SwapinFinish);
            Step::SwappedIn { folio, head: target, hit: false, planned }
        }
        Err(err) => {
            mm.staging.put_filled(slot, huge, &mm.memcg);
            mm.memcg.uncharge(Component::Resident, bytes);
            failed(FaultError::Install(err))
        }
    }
}

/// Whether a swap-in fault at `page` of an unsplit large folio in state `s` brings back
/// only that page (the region's `swapin_enabled`; `ra_window::swapin_whole` judges
/// `adaptive`). Never while a buffer is being made resident for a system call
/// (`Mm::prefaulting`).
fn swapin_in_part(mm: &Mm, table: &FolioTable, page: usize, folio: FolioSize, s: State) -> bool {
    if mm.prefaulting.load(Ordering::Relaxed) > 0 {
        return false;
    }
    match table.swapin {
        SwapinPolicy::Always => false,
        SwapinPolicy::Never => true,
        SwapinPolicy::Adaptive => {
            let one_read = s.kind() == Kind::Swapped && folio.bytes() <= SWAPIN_READ_MAX;
            !swapin_whole(page % folio.pages(), folio.pages(), one_read)
        }
    }
}

/// A partial swap-in: split the locked Pool or Swapped folio at `head` into order-0
/// folios, each page's piece copied into a pool entry of its own (nothing is
/// decompressed), so that
/// the faulting page, and later each other one, comes back alone. The pages stay order-0
/// folios from then on: a split is not undone (`folio.rs`). Done under the gate, as `evict::publish_split`,
/// so that no event is marked against the unsplit folio meanwhile. A folio on the swap
/// file splits by its checksums alone: each page keeps its slot. Returns false, the
/// folio untouched, where it cannot be split: stored in the pool as one stream
/// (`swapin_enabled` was `always` when it went out), or no room in the pool.
fn split_on_swapin(mm: &Mm, table: &Arc<FolioTable>, head: usize, folio: FolioSize, s: State) -> bool {
    let e = table.entry(head);
    let placed = match s.kind() {
        Kind::Pool => mm.tiers.split_pool_entry(e.handle(), folio, &mm.counters),
        _ => mm.tiers.split_file_entry(e.handle(), folio),
    };
    let Some(placed) = placed else {
        return false;
    };
    let _gate = mm.gate.read().unwrap();
    publish_split_in_storage(mm, table, head, folio, &placed, |_| Action::Keep);
    mm.counters.size(folio).swpin_fallback.inc();
    if folio.is_huge() {
        mm.counters.vm.thp_swpin_fallback.inc();
    }
    true
}

/// A readahead hit: the folio's data is already decompressed (or read) in the readahead
/// cache; copy it in and free the pool entry or swap slot (`readahead.rs`).
fn fault_ra_hit(mm: &Mm, table: &Arc<FolioTable>, target: usize, folio: FolioSize, s: State) -> Step {
    match install_readahead(mm, table, target, folio, s, false) {
        Some(Ok(())) => {
            let distance = mm.lru.distance_since(table.entry(target).evicted_at());
            mm.tiers.note_readahead_hit(LoadedFrom::of(s.kind()), distance, &mm.lru, mm.memcg.limit);
            now_resident(mm, table, target, folio, s.with(CACHED, false), false, true);
            Step::SwappedIn { folio, head: target, hit: true, planned: None }
        }
        Some(Err(err)) => failed(FaultError::Install(err)),
        None => {
            // No copy behind the flag: serve it as an ordinary swap-in.
            let s = table.entry(target).set_locked(s.with(CACHED, false));
            fault_swapin(mm, table, target, folio, s)
        }
    }
}

/// After a readahead hit, map the copies that follow it in the stream too, so that the
/// stream's next accesses find them mapped instead of each taking a fault: the kernel's
/// minor fault on a swap cache page costs about a microsecond, ours a round trip through
/// the userfaultfd. Only copies whose lock is free (never waiting), forward from the hit
/// or, where the folio before it is cached, back; each counts as a fault for the window's
/// placement (the kernel's swap cache hits update its readahead state too). Returns the
/// head of the last folio mapped (`head` if none), where the window moves on from.
///
/// At most half the window, so that the copies left cached are the stream's lead while
/// the next reads go out: a quarter fewer misses and reads than mapping the whole window,
/// throughput within noise (BENCHMARKS.md, "Eviction batches that look past the LRU head",
/// set 2).
/// Only 4 KiB folios: a larger folio's fault is already shared by its pages, and mapping
/// 64 KiB ahead made the stream wait on the copy instead (BENCHMARKS.md, "Mapping
/// readahead copies ahead").
fn map_ahead(mm: &Mm, table: &Arc<FolioTable>, head: usize, folio: FolioSize) -> usize {
    if folio != FolioSize::K4 {
        return head;
    }
    let pages = folio.pages();
    let window = table.ra.state.load().win as usize;
    let is_copy = |i: usize| table.entry(i).load().has(CACHED);
    let backward = head >= pages && is_copy(head - pages) && !(head + pages < table.pages && is_copy(head + pages));
    let mut last = head;
    for k in 1..=(window / 2).max(1) {
        let next = if backward {
            match head.checked_sub(k * pages) {
                Some(n) => n,
                None => break,
            }
        } else {
            head + k * pages
        };
        if next + pages > table.pages || !map_copy(mm, table, next, folio) {
            break;
        }
        table.ra.state.seen(next / pages);
        last = next;
    }
    last
}

/// After a first touch of the folio at `head` (installed, its thread woken): if the
/// region's first touches run in sequence (`TouchRun`), install the folios after it zeroed
/// now, before the program asks for them: a run of `memset`s or of appends then faults
/// once per window instead of once per folio. The kernel's own first touch costs it about
/// a microsecond in the faulting thread; here each costs a round trip through a fault
/// thread (BENCHMARKS.md, "Zeros ahead of first touches in sequence").
///
/// The window doubles from 2 folios up to `1 << page_cluster` pages (so `page_cluster`
/// 0 turns this off with readahead, and at the default 7 folios above 512 KiB are never
/// zeroed ahead; 2 MiB folios never are, their first touch moving a whole THP in). It
/// stops at the first folio that is not Untouched, that is locked or has an event
/// pending, that cannot be charged without reclaim (`try_charge`: zeros ahead never make
/// room for themselves), or that the copy found mapped already (left Untouched and
/// uncharged, as `fault_zero` leaves it). The folios it installs go on the LRU like any
/// first touch; they count in `zero_ahead` and their size's `anon_fault_alloc`, not as
/// faults.
fn zero_ahead(mm: &Mm, table: &Arc<FolioTable>, head: usize, folio: FolioSize) {
    let pages = folio.pages();
    let index = head / pages;
    let max = if mm.config.page_cluster == 0 { 0 } else { (1usize << mm.config.page_cluster) / pages };
    let win = table.ra.touches.touched(index, max);
    let mut last = index;
    for next in index + 1..=index + win {
        if (next + 1) * pages > table.pages || !zero_one_ahead(mm, table, next * pages, folio) {
            break;
        }
        last = next;
    }
    if last != index {
        table.ra.touches.ran_to(last);
    }
}

/// Install the Untouched folio at `head` zeroed, as if a fault had asked for it; false if
/// it is not there to take or cannot be charged.
fn zero_one_ahead(mm: &Mm, table: &Arc<FolioTable>, head: usize, folio: FolioSize) -> bool {
    let e = table.entry(head);
    let Some(s) = e.try_lock() else { return false };
    let bytes = folio.bytes() as u64;
    let takeable = s.kind() == Kind::Untouched && !s.has(PENDING) && !s.has(SPLIT);
    let installed = takeable && try_charge(mm, Component::Resident, bytes) && {
        // Counted before the copy maps the folio: its owner may touch it, finish and read
        // the stats before this thread gets past the copy, and a count must never lag an
        // access the program has made (the kernel counts a fault before it returns).
        // Per size, every folio a first touch allocated, as the kernel's count.
        let (ahead, alloc) = (&mm.counters.vm.zero_ahead, &mm.counters.size(folio).anon_fault_alloc);
        ahead.inc();
        alloc.inc();
        match install_zero(mm, table, head, folio, zero_page() as usize) {
            Ok(0) => true,
            Ok(_) | Err(_) => {
                ahead.take_back(1);
                alloc.take_back(1);
                mm.memcg.uncharge(Component::Resident, bytes);
                false
            }
        }
    };
    if installed {
        mark_resident(mm, table, head, folio, s, false, false);
    }
    e.unlock();
    installed
}

/// Map one readahead copy as if a fault had taken it; false if it is not there to take.
fn map_copy(mm: &Mm, table: &Arc<FolioTable>, head: usize, folio: FolioSize) -> bool {
    let e = table.entry(head);
    let Some(s) = e.try_lock() else { return false };
    let takeable = matches!(s.kind(), Kind::Pool | Kind::Swapped) && s.has(CACHED) && !s.has(PENDING) && !s.has(SPLIT);
    let mapped = takeable && matches!(install_readahead(mm, table, head, folio, s, true), Some(Ok(())));
    if mapped {
        mark_resident(mm, table, head, folio, s.with(CACHED, false), false, true);
    }
    e.unlock();
    mapped
}

/// An arm's failure as the next step: an install that met an event retries; one whose
/// range is gone is not ours any more; anything else fails the fault.
fn failed(err: FaultError) -> Step {
    match err {
        FaultError::Install(InstallError::Pending) => Step::Retry,
        FaultError::Install(InstallError::Unmapped) => Step::NotOurs(Unserved::InstallRefused),
        err => Step::Fail(err),
    }
}

/// Mark a folio resident after an install: new generation, LRU tail, counters. A folio
/// coming back from eviction (`refault`) within the working-set distance goes on the
/// active list.
fn now_resident(mm: &Mm, table: &Arc<FolioTable>, target: usize, folio: FolioSize, s: State, huge: bool, refault: bool) {
    mark_resident(mm, table, target, folio, s, huge, refault);
    mm.counters.vm.pgfault.inc();
}

/// `now_resident` without the fault: for a folio mapped before any fault asked for it.
fn mark_resident(mm: &Mm, table: &Arc<FolioTable>, target: usize, folio: FolioSize, s: State, huge: bool, refault: bool) {
    let next = s.with_kind(Kind::Resident).with(HUGE, huge).with(WRITEBACK, false).next_gen();
    let e = table.entry(target);
    let mut active = false;
    if refault {
        let vm = &mm.counters.vm;
        vm.workingset_refault_anon.add(folio.pages() as u64);
        if mm.config.lru == LruPolicy::Workingset {
            let workingset = mm.memcg.limit.unwrap_or(u64::MAX) / PAGE_SIZE as u64;
            active = mm.lru.distance_since(e.evicted_at()) <= workingset;
            if active {
                vm.workingset_activate_anon.add(folio.pages() as u64);
            }
        }
    }
    // A buffer made resident for a system call (`prefault_for_kernel`) must stay so until
    // the call has copied it: on the inactive list a folio just brought back can be the
    // next one evicted (a few 2 MiB folios under a small limit), and the call then fails
    // with EFAULT again at every retry. The kernel's GUP marks the pages it faults in
    // accessed for the same reason.
    if mm.config.lru == LruPolicy::Workingset && mm.prefaulting.load(Ordering::Relaxed) > 0 {
        active = true;
    }
    e.set_installed_at(mm.lru.now());
    e.set_locked(next);
    mm.lru.push(table.clone(), target, folio, next.gen(), active);
}

// ---- signal mode -------------------------------------------------------------------

/// The SIGBUS action that was there before the engine's, or that the program set since
/// (`replace_chained_sigbus`): where SIGBUS signals that are not managed faults go. A
/// leaked box, never freed, so that a handler running on another thread may still read
/// the one it loaded; null until the engine's handler is installed.
static CHAINED_SIGBUS: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());
static SIGBUS_INSTALL: Once = Once::new();

/// Install the process-wide SIGBUS handler that serves faults in the faulting thread.
/// Idempotent; other SIGBUS signals go to the handler that was there before.
pub(crate) fn install_sigbus_handler() {
    SIGBUS_INSTALL.call_once(|| {
        // SAFETY: sigaction with a zeroed, then filled, struct; the handler is an
        // `extern "C"` function with the SA_SIGINFO signature. All signals are blocked
        // while it runs so that no asynchronous handler re-enters managed memory mid-fault.
        let previous = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigfillset(&mut action.sa_mask);
            let mut previous: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGBUS, &action, &mut previous);
            previous
        };
        CHAINED_SIGBUS.store(Box::into_raw(Box::new(previous)), Ordering::Release);
    });
}

/// Let the fault threads read which CPU the calling thread faults on (its rseq area,
/// `thread_cpu.rs`), so that in thread mode the poll token follows the thread at its first
/// fault from another CPU rather than at the next sample of procfs. Call it from each
/// thread that touches managed memory, and [`forget_faulting_thread`] before the thread's
/// thread-local storage is freed (libfolioswap.so does both). False where it cannot: no
/// rseq area (glibc before 2.35, or registration turned off), or one inside managed
/// memory (a thread stack the program allocated), which a fault thread must never read.
pub fn register_faulting_thread() -> bool {
    let Some(addr) = crate::thread_cpu::current_cpu_id_addr() else { return false };
    if ADDRESS_MAP.lookup(addr).is_some() {
        return false;
    }
    // SAFETY: gettid(2) takes no arguments and cannot fail.
    let tid = unsafe { libc::gettid() } as u32;
    crate::thread_cpu::register(tid, addr);
    true
}

/// Thread `tid` is exiting: stop reading its rseq area (see [`register_faulting_thread`]).
pub fn forget_faulting_thread(tid: u32) {
    crate::thread_cpu::forget(tid);
}

/// In a forked child, from the thread that forked (the only one there), before any other
/// starts: forget every registered thread, the parent's being gone and this one having a
/// new id (register it again).
pub fn forget_faulting_threads() {
    crate::thread_cpu::forget_all_in_child();
}

/// For a program's `sigaction(SIGBUS, …)` once signal mode's handler is installed: make
/// `action` (if any) the handler that SIGBUS signals other than managed faults go to,
/// instead of replacing the engine's, and return the one it replaces, as `sigaction`
/// would have. `None`: no engine handler is installed; the call is the kernel's to make.
pub fn replace_chained_sigbus(action: Option<&libc::sigaction>) -> Option<libc::sigaction> {
    let current = CHAINED_SIGBUS.load(Ordering::Acquire);
    if current.is_null() {
        return None;
    }
    let Some(action) = action else {
        // SAFETY: a published box, never freed.
        return Some(unsafe { *current });
    };
    let old = CHAINED_SIGBUS.swap(Box::into_raw(Box::new(*action)), Ordering::AcqRel);
    // SAFETY: as above; the old box stays allocated for handlers still reading it.
    Some(unsafe { *old })
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // The handler runs inside whatever the thread was doing, which may be reading errno
    // across the access (callers of strcoll check it), and the engine's system calls may
    // fail on the way to a fault served (an install that meets a queued event: EAGAIN,
    // then the queue is read until it answers EAGAIN): errno goes back as it was.
    let errno = KeptErrno::now();
    if serve_sigbus(info) {
        return;
    }
    drop(errno);
    chain_sigbus(sig, info, context);
}

/// Serve a SIGBUS that is a fault on managed memory: true if it was one (served, or
/// failed with the default action restored so that the process dies of it).
fn serve_sigbus(info: *mut libc::siginfo_t) -> bool {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    // A SIGBUS sent by a process (kill, raise, sigqueue: si_code <= 0) carries no fault
    // address, only fields that share its place.
    if code <= 0 {
        return false;
    }
    let Some((entry, _)) = ADDRESS_MAP.lookup(addr) else { return false };
    match handle_fault(&entry.engine, addr) {
        FaultOutcome::Served => true,
        FaultOutcome::Failed(err) => {
            entry.engine.counters.vm.oom_kill.inc();
            let text = format!("folioswap: fault at {addr:#x} failed: {err}\n");
            // SAFETY: write(2) to stderr from a live buffer; then the default action is
            // restored so that returning re-faults and the process dies of SIGBUS.
            unsafe {
                libc::write(2, text.as_ptr().cast(), text.len());
                libc::signal(libc::SIGBUS, libc::SIG_DFL);
            }
            true
        }
        FaultOutcome::NotOurs(_) => false,
    }
}

/// The calling thread's errno when taken, put back when dropped.
struct KeptErrno(libc::c_int);

impl KeptErrno {
    fn now() -> KeptErrno {
        // SAFETY: errno is the calling thread's own.
        KeptErrno(unsafe { *libc::__errno_location() })
    }
}

impl Drop for KeptErrno {
    fn drop(&mut self) {
        // SAFETY: as in `now`; the thread that took it puts it back.
        unsafe { *libc::__errno_location() = self.0 };
    }
}

fn chain_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    let previous = CHAINED_SIGBUS.load(Ordering::Acquire);
    if previous.is_null() {
        return;
    }
    // SAFETY: a published box, never freed.
    let previous = unsafe { &*previous };
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
