//! The event gate: reading the region userfaultfd, and recording the REMOVE, UNMAP and
//! REMAP events it brings before anything else can act on the pages they name.
//!
//! The kernel reports `madvise(MADV_DONTNEED/FREE/REMOVE)` before zapping the pages, and
//! zaps them as soon as the message is *read*; `munmap` and `mremap` are reported after
//! the fact. Between the read and the engine updating its folio table, a fault must not
//! be served from the old copy, and no install may land after the zap. Hence the gate
//! (`Mm::gate`, an RwLock):
//! 1. the userfaultfd is read only with the gate held exclusively ([`read_messages`]),
//!    and an event read is *marked* before the gate is released: the address map is
//!    updated (UNMAP, REMAP) and every folio in the range gets the PENDING flag
//!    (lock-free: a flag, not a lock, so marking never waits on a folio);
//! 2. every install and eviction holds the gate shared and checks PENDING first
//!    (`install.rs`), so none is in flight while an event is read, and none starts on a
//!    marked folio;
//! 3. whoever next locks a marked folio applies the pending events to it (`events.rs`).
//!
//! A MOVE or COPY the kernel refuses with EAGAIN has an event queued and unread: the
//! installer drops the gate and calls [`pump_events`], which reads the queue (marking
//! events, deferring faults to the fault threads) so the kernel can finish the event.

use crate::addrmap::ADDRESS_MAP;
use crate::event_queue::{EventKind, PendingEvent};
use crate::folio::{PENDING, SPLIT};
use crate::mm::Mm;
use crate::table::FolioTable;
use crate::uffd::Msg;
use std::os::fd::AsRawFd;
use std::sync::Arc;

/// Wake the fault/event threads (stop, deferred faults, events to apply).
pub(crate) fn kick(mm: &Mm) {
    crate::eventfd::signal(mm.kick_fd.as_raw_fd());
}

/// Read messages under the gate, marking events, until a fault comes (returned as its
/// address and thread) or the queue is empty.
pub(crate) fn read_messages(mm: &Mm) -> Option<(usize, u32)> {
    let _gate = mm.gate.write().unwrap();
    loop {
        match mm.uffd.read_msg() {
            Ok(Some(Msg::PageFault { addr, tid, .. })) => return Some((addr, tid)),
            Ok(Some(event)) => mark_event(mm, event),
            Ok(None) => return None,
            Err(e) => {
                eprintln!("folioswap: reading the userfaultfd failed: {e}");
                return None;
            }
        }
    }
}

/// An install found an event queued but unread: read the queue now (events are marked,
/// faults deferred to the fault threads) so the kernel can finish the event. The caller
/// must not hold the gate.
pub(crate) fn pump_events(mm: &Mm) {
    let mut deferred = Vec::new();
    while let Some(fault) = read_messages(mm) {
        deferred.push(fault);
    }
    if !deferred.is_empty() {
        mm.deferred_faults.lock().unwrap().extend(deferred);
    }
    kick(mm);
    std::thread::yield_now();
}

/// Copy mode: read the userfaultfd whenever one of the engine's own zaps is in flight
/// (`own_zaps.rs`), since the zapping thread waits until its REMOVE events are read and
/// every fault thread may be waiting for a folio that thread holds. Faults read here are
/// handed to the fault threads; this thread takes no folio lock.
pub(crate) fn read_for_own_zaps(mm: Arc<Mm>) {
    let mut fd = libc::pollfd { fd: mm.uffd.raw_fd(), events: libc::POLLIN, revents: 0 };
    while !mm.stop.load(std::sync::atomic::Ordering::Acquire) {
        if !mm.own_zaps.wait_busy(std::time::Duration::from_millis(100)) {
            continue;
        }
        // SAFETY: `fd` is one valid pollfd that outlives the call.
        if unsafe { libc::poll(&mut fd, 1, 10) } <= 0 {
            continue;
        }
        let mut deferred = Vec::new();
        while let Some(fault) = read_messages(&mm) {
            deferred.push(fault);
        }
        if !deferred.is_empty() {
            mm.deferred_faults.lock().unwrap().extend(deferred);
            kick(&mm);
        }
    }
}

/// Record an event just read. Called with the gate held exclusively.
#[cfg_attr(feature = "trace", track_caller)]
fn mark_event(mm: &Mm, msg: Msg) {
    #[cfg(feature = "trace")]
    {
        use crate::trace::{record, What};
        let at = std::panic::Location::caller();
        match msg {
            Msg::Remove { start, end } => record(What::Remove, start, end, 0, 0, at),
            Msg::Unmap { start, end } => record(What::Unmap, start, end, 0, 0, at),
            Msg::Remap { from, to, len } => record(What::Remap, from, from + len, 0, to as u64, at),
            Msg::PageFault { .. } | Msg::Other(_) => {}
        }
    }
    match msg {
        Msg::Remove { start, end } => {
            if mm.own_zaps.claim(start, end) {
                // Raised by the engine's own zap (copy-mode eviction): not the program's.
                return;
            }
            mm.counters.vm.uffd_remove.inc();
            for a in ADDRESS_MAP.overlapping(mm.id, start, end) {
                mark(mm, &a.table, a.page, a.pages, EventKind::Remove);
            }
        }
        Msg::Unmap { start, end } => {
            mm.counters.vm.uffd_unmap.inc();
            for a in ADDRESS_MAP.remove_range(mm.id, start, end) {
                mark(mm, &a.table, a.page, a.pages, EventKind::Unmap);
            }
        }
        Msg::Remap { from, to, len } => {
            mm.counters.vm.uffd_remap.inc();
            for a in ADDRESS_MAP.move_range(mm.id, from, to, len) {
                let folio_pages = a.table.folio.pages();
                for cut in [a.page, a.page + a.pages] {
                    if cut % folio_pages != 0 && cut < a.table.pages {
                        let head = a.table.head_of(cut);
                        mark(mm, &a.table, head, folio_pages, EventKind::Split);
                    }
                }
            }
        }
        Msg::PageFault { .. } | Msg::Other(_) => {}
    }
    kick(mm);
}

/// Record the event, flag every folio it covers (every page, where the folio is split),
/// then queue it for the walk, in that order: a folio flagged before its event is recorded
/// could be applied without it, and an event walked before its folios are flagged could be
/// retired unapplied (`EventQueue::queue_walk`).
fn mark(mm: &Mm, table: &Arc<FolioTable>, page: usize, pages: usize, kind: EventKind) {
    if pages == 0 {
        return;
    }
    let event = mm.events.push(PendingEvent::new(table.clone(), page, pages, kind));
    #[cfg(test)]
    tests::BEFORE_FLAGS.with(|hook| hook.get().map(|hook| hook(mm)));
    let folio_pages = table.folio.pages();
    let mut head = table.head_of(page);
    while head < page + pages {
        let h = table.entry(head);
        if folio_pages == 1 || h.load().has(SPLIT) {
            for p in head.max(page)..(head + folio_pages).min(page + pages) {
                table.entry(p).set_flag(PENDING);
            }
        } else {
            h.set_flag(PENDING);
        }
        head += folio_pages;
    }
    mm.events.queue_walk(event);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::events::{apply_pending_locked, apply_queued_events};
    use crate::folio::Kind;
    use crate::size::{FolioSize, PAGE_SIZE};
    use crate::{Config, Engine, Region, RegionOptions};
    use std::cell::Cell;

    thread_local! {
        /// Run by `mark` between recording an event and flagging its folios, where a
        /// walker on another thread may run.
        pub(super) static BEFORE_FLAGS: Cell<Option<fn(&Mm)>> = const { Cell::new(None) };
        /// The region `remove_page` discards in: a hook is a plain `fn`.
        static REGION_START: Cell<usize> = const { Cell::new(0) };
    }

    /// An engine with no limit, and a 1 MiB region of 64 KiB folios, every byte 7, whose
    /// pages `remove_page` discards; its table and first folio's head.
    pub(crate) fn resident_region() -> (Engine, Region, Arc<FolioTable>, usize) {
        let engine = Engine::new(Config::default().no_swap_file()).unwrap_or_else(|e| panic!("cannot start the engine: {e}"));
        let (region, table, head) = filled_region(&engine, 1 << 20, "64K");
        REGION_START.with(|start| start.set(region.as_ptr() as usize));
        (engine, region, table, head)
    }

    /// A region of `bytes` in `folio` folios of `engine`, every byte 7: the region, its
    /// table and its first folio's head.
    pub(crate) fn filled_region(engine: &Engine, bytes: usize, folio: &str) -> (Region, Arc<FolioTable>, usize) {
        let mut region = engine.map(bytes, RegionOptions::default().folio_size(folio).unwrap()).unwrap();
        region.as_mut_slice().fill(7);
        let (entry, head) = ADDRESS_MAP.lookup(region.as_ptr() as usize).expect("the region is mapped");
        (region, entry.table, head)
    }

    /// A REMOVE of page `page` of the `resident_region`, read and marked as the gate does
    /// when the program discards it (the kernel's zap is not done: the page keeps its data).
    pub(crate) fn remove_page(mm: &Mm, page: usize) {
        remove(mm, REGION_START.with(|start| start.get()) + page * PAGE_SIZE, PAGE_SIZE);
    }

    /// A REMOVE of `[start, start + len)`, read and marked as the gate does (no zap).
    pub(crate) fn remove(mm: &Mm, start: usize, len: usize) {
        let _gate = mm.gate.write().unwrap();
        mark_event(mm, Msg::Remove { start, end: start + len });
    }

    /// A walk that runs while an event is being marked must not retire it before its
    /// folios are flagged. Before, it did: the folio kept the flag with no event behind
    /// it, and a discarded page kept its data (the stress test read old data back).
    #[test]
    fn an_event_is_not_walked_before_its_folios_are_flagged() {
        let (engine, region, table, head) = resident_region();
        let mm = engine.mm();
        // The folio's second page, with a walk in the middle of marking it.
        BEFORE_FLAGS.with(|hook| hook.set(Some(apply_queued_events)));
        remove_page(mm, 1);
        BEFORE_FLAGS.with(|hook| hook.set(None));
        // Whoever locks the folio next applies what is flagged on it (the engine's own
        // walk may be doing so now: the lock waits for it).
        let h = table.entry(head);
        if h.lock().has(PENDING) {
            apply_pending_locked(mm, &table, head, FolioSize::K64).unwrap_or_else(|e| panic!("applying the event: {e}"));
        }
        h.unlock();
        let (folio, page) = (h.load(), table.entry(head + 1).load());
        assert!(folio.has(SPLIT) && page.kind() == Kind::Untouched, "the event was not applied: folio {folio:?}, page {page:?}");
        assert!(!page.has(PENDING), "the page is still flagged: {page:?}");
        assert_eq!(h.load().kind(), Kind::Resident);
        // Every kept page of the region; page 1 still holds its data, as no kernel zap
        // followed the event.
        for (p, page) in region.as_slice().chunks(PAGE_SIZE).enumerate().filter(|&(p, _)| p != 1) {
            assert!(page.iter().all(|&b| b == 7), "kept page {p} lost its data");
        }
    }
}
