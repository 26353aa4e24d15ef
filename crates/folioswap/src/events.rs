//! REMOVE, UNMAP and REMAP: keeping the engine's copies true to what the program did to
//! its address space.
//!
//! The kernel reports `madvise(MADV_DONTNEED/FREE/REMOVE)` before zapping the pages, and
//! zaps them as soon as the message is *read*; `munmap` and `mremap` are reported after
//! the fact. Between the read and the engine updating its folio table, a fault must not
//! be served from the old copy, and no install may land after the zap. Hence the gate:
//! - the userfaultfd is read only with the gate held exclusively, and an event read is
//!   *marked* before the gate is released: the address map is updated (UNMAP, REMAP) and
//!   every folio in the range gets the PENDING flag (lock-free: a flag, not a lock, so
//!   marking never waits on a folio);
//! - every install and eviction holds the gate shared and checks PENDING first, so none
//!   is in flight while an event is read, and none starts on a marked folio;
//! - whoever next locks a marked folio *applies* the pending events to it: drops its copy
//!   (REMOVE: it reads as zeros again; UNMAP: Gone), or, when the event covers part of a
//!   large folio, splits it into 4 KiB pages first, bringing a swapped-out folio back in
//!   so the surviving pages keep their data. A thread also walks each event's range to
//!   apply it promptly, then retires it.

use crate::engine::{Shared, ADDRESS_MAP};
use crate::folio::{Kind, HUGE, PENDING, SPLIT, WANTED, WRITEBACK};
use crate::memcg::Component;
use crate::region::FolioTable;
use crate::size::{FolioSize, PAGE_SIZE};
use crate::staging::Staged;
use crate::uffd::Msg;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventKind {
    /// Pages read as zeros from now on.
    Remove,
    /// Pages left the address space.
    Unmap,
    /// A mapping boundary now cuts the folio: split it, keep every page.
    Split,
}

pub(crate) struct PendingEvent {
    table: Arc<FolioTable>,
    page: usize,
    pages: usize,
    kind: EventKind,
}

#[derive(Default)]
pub(crate) struct EventQueue {
    /// Marked and not yet retired: consulted by whoever applies a folio.
    pending: Mutex<Vec<Arc<PendingEvent>>>,
    /// Waiting for a thread to walk their range.
    to_walk: Mutex<VecDeque<Arc<PendingEvent>>>,
}

pub(crate) enum ApplyError {
    /// The folio is under writeback: unlock, wait for WRITEBACK to clear, retry.
    WaitWriteback,
    Failed(String),
}

/// What becomes of one page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Keep,
    Zero,
    Gone,
}

impl Shared {
    /// Record an event just read. Called with the gate held exclusively.
    pub(crate) fn mark_event(&self, msg: Msg) {
        match msg {
            Msg::Remove { start, end } => {
                self.counters.vm.uffd_remove.inc();
                for a in ADDRESS_MAP.overlapping(self.id, start, end) {
                    self.mark(&a.table, a.page, a.pages, EventKind::Remove);
                }
            }
            Msg::Unmap { start, end } => {
                self.counters.vm.uffd_unmap.inc();
                for a in ADDRESS_MAP.remove_range(self.id, start, end) {
                    self.mark(&a.table, a.page, a.pages, EventKind::Unmap);
                }
            }
            Msg::Remap { from, to, len } => {
                self.counters.vm.uffd_remap.inc();
                for a in ADDRESS_MAP.move_range(self.id, from, to, len) {
                    let folio_pages = a.table.folio.pages();
                    for cut in [a.page, a.page + a.pages] {
                        if cut % folio_pages != 0 && cut < a.table.pages {
                            let head = a.table.head_of(cut);
                            self.mark(&a.table, head, folio_pages, EventKind::Split);
                        }
                    }
                }
            }
            Msg::PageFault { .. } | Msg::Other(_) => {}
        }
        self.kick();
    }

    fn mark(&self, table: &Arc<FolioTable>, page: usize, pages: usize, kind: EventKind) {
        if pages == 0 {
            return;
        }
        let event = Arc::new(PendingEvent { table: table.clone(), page, pages, kind });
        self.events.pending.lock().unwrap().push(event.clone());
        self.events.to_walk.lock().unwrap().push_back(event);
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
    }

    /// Walk the ranges of marked events, applying them, then retire them.
    pub(crate) fn apply_queued_events(&self) {
        loop {
            let next = self.events.to_walk.lock().unwrap().pop_front();
            let Some(event) = next else { return };
            let table = &event.table;
            let folio_pages = table.folio.pages();
            let mut head = table.head_of(event.page);
            while head < event.page + event.pages {
                self.apply_folio(table, head, event.page, event.pages);
                head += folio_pages;
            }
            self.events.pending.lock().unwrap().retain(|e| !Arc::ptr_eq(e, &event));
        }
    }

    /// Apply whatever is pending on the folio at `head` (on its pages in range, if split).
    fn apply_folio(&self, table: &Arc<FolioTable>, head: usize, page: usize, pages: usize) {
        let folio = table.folio;
        loop {
            let h = table.entry(head);
            if folio.pages() > 1 && !h.load().has(SPLIT) {
                let s = h.lock();
                if s.has(SPLIT) {
                    h.unlock();
                    continue;
                }
                if !s.has(PENDING) {
                    h.unlock();
                    return;
                }
                match self.apply_pending_locked(table, head, folio) {
                    Ok(()) => {
                        let split_now = h.load().has(SPLIT);
                        h.unlock();
                        if split_now {
                            continue;
                        }
                        return;
                    }
                    Err(ApplyError::WaitWriteback) => {
                        h.unlock();
                        h.wait_clear(WRITEBACK);
                        continue;
                    }
                    Err(ApplyError::Failed(msg)) => {
                        h.unlock();
                        eprintln!("folioswap: applying an event to the folio at page {head}: {msg}");
                        return;
                    }
                }
            }
            for p in head.max(page)..(head + folio.pages()).min(page + pages) {
                let e = table.entry(p);
                loop {
                    let s = e.lock();
                    if !s.has(PENDING) {
                        e.unlock();
                        break;
                    }
                    match self.apply_pending_locked(table, p, FolioSize::K4) {
                        Err(ApplyError::WaitWriteback) => {
                            e.unlock();
                            e.wait_clear(WRITEBACK);
                        }
                        other => {
                            if let Err(ApplyError::Failed(msg)) = other {
                                eprintln!("folioswap: applying an event to page {p}: {msg}");
                            }
                            e.unlock();
                            break;
                        }
                    }
                }
            }
            return;
        }
    }

    /// Apply every pending event covering the folio at `target` (locked by the caller;
    /// `folio` is its size: the table's, or 4K for a split page). May split the folio.
    pub(crate) fn apply_pending_locked(&self, table: &Arc<FolioTable>, target: usize, folio: FolioSize) -> Result<(), ApplyError> {
        let e = table.entry(target);
        while e.load().has(PENDING) {
            let s = e.load();
            if s.kind() == Kind::SwapCache && s.has(WRITEBACK) && folio.pages() > 1 {
                // Splitting needs the data: get it back from the compressor first.
                e.set_flag(WANTED);
                return Err(ApplyError::WaitWriteback);
            }
            e.clear_locked(PENDING);
            let (actions, force_split) = self.pending_actions(table, target, folio);
            let uniform = actions.iter().all(|&a| a == actions[0]);
            if folio.pages() == 1 || (uniform && !force_split) {
                match actions[0] {
                    Action::Keep => {}
                    Action::Zero => self.drop_folio(table, target, folio, Kind::Untouched),
                    Action::Gone => self.drop_folio(table, target, folio, Kind::Gone),
                }
            } else {
                self.split_folio(table, target, folio, &actions)?;
            }
        }
        Ok(())
    }

    /// What the pending events make of each page of the folio at `target`, and whether a
    /// mapping boundary forces a split.
    fn pending_actions(&self, table: &Arc<FolioTable>, target: usize, folio: FolioSize) -> (Vec<Action>, bool) {
        let mut actions = vec![Action::Keep; folio.pages()];
        let mut force_split = false;
        for ev in self.events.pending.lock().unwrap().iter() {
            if !Arc::ptr_eq(&ev.table, table) {
                continue;
            }
            let lo = ev.page.max(target);
            let hi = (ev.page + ev.pages).min(target + folio.pages());
            if lo >= hi {
                continue;
            }
            for a in &mut actions[lo - target..hi - target] {
                match ev.kind {
                    EventKind::Remove if *a == Action::Keep => *a = Action::Zero,
                    EventKind::Unmap => *a = Action::Gone,
                    EventKind::Split => force_split = true,
                    EventKind::Remove => {}
                }
            }
        }
        (actions, force_split)
    }

    /// The whole folio is discarded: release its copy, leave it `kind`.
    fn drop_folio(&self, table: &Arc<FolioTable>, target: usize, folio: FolioSize, kind: Kind) {
        self.forget_readahead(table, target);
        let e = table.entry(target);
        let s = e.load();
        self.drop_storage(s.kind(), e.handle(), folio, s.has(WRITEBACK));
        e.set_handle(0);
        e.set_locked(s.with_kind(kind).with(WRITEBACK, false).with(HUGE, false));
        e.clear_locked(WANTED);
        self.reclaim.notify_progress();
    }

    /// Split the (locked, unsplit) folio at `head` into 4 KiB pages, each taking its
    /// action. A swapped-out folio is brought back first so kept pages keep their data.
    fn split_folio(&self, table: &Arc<FolioTable>, head: usize, folio: FolioSize, actions: &[Action]) -> Result<(), ApplyError> {
        self.forget_readahead(table, head);
        let e = table.entry(head);
        let s = e.load();
        let bytes = folio.bytes() as u64;
        // The folio's data in staging, for Pool and SwapCache folios.
        let staged = match s.kind() {
            Kind::Pool | Kind::Swapped => {
                let handle = e.handle();
                self.reserve(bytes).map_err(ApplyError::Failed)?;
                let (slot, from_reserve, huge) = self
                    .staging
                    .take_filled(folio.order())
                    .map_err(|err| ApplyError::Failed(format!("staging for a split: {err}")))?;
                if from_reserve {
                    self.memcg.uncharge(Component::StagingFree, bytes);
                }
                // SAFETY: we own the slot until we put it back, and nothing else maps it.
                let dst = unsafe { self.staging.slice_mut(slot) };
                if let Err(msg) = self.load_swapped(s.kind(), handle, dst) {
                    self.staging.put_filled(slot, huge, &self.memcg);
                    self.memcg.uncharge(Component::Resident, bytes);
                    return Err(ApplyError::Failed(format!("splitting a swapped-out folio: {msg}")));
                }
                self.free_swapped(s.kind(), handle, folio);
                // Charged as resident from here; pages not kept are uncharged below.
                Some((Staged { slot, page: 0 }, false))
            }
            Kind::SwapCache => {
                self.memcg.transfer(Component::SwapCache, Component::Resident, bytes);
                // A folio below 2 MiB in the swap cache shares a batch slot.
                Some((Staged::from_raw(e.handle()), !folio.is_huge()))
            }
            _ => None,
        };
        let mut actions = actions.to_vec();
        let gate = match staged {
            Some((at, batch)) => self.move_split_pages(table, head, folio, at, batch, &mut actions),
            None => self.gate.read().unwrap(),
        };
        let was = s.kind();
        let page_kind = |a: Action| match (a, was) {
            (Action::Gone, _) => Kind::Gone,
            (Action::Zero, _) => Kind::Untouched,
            (Action::Keep, Kind::Pool | Kind::Swapped | Kind::SwapCache | Kind::Resident) => Kind::Resident,
            (Action::Keep, other) => other,
        };
        if matches!(was, Kind::Resident | Kind::Pool | Kind::Swapped | Kind::SwapCache) {
            let keep = actions.iter().filter(|&&a| a == Action::Keep).count();
            let dropped = (folio.pages() - keep) * PAGE_SIZE;
            self.memcg.uncharge(Component::Resident, dropped as u64);
        }
        let pending = e.load().has(PENDING);
        debug_assert!(!pending || staged.is_none(), "events were folded in while moving pages");
        for (i, &a) in actions.iter().enumerate() {
            let page = head + i;
            let kind = page_kind(a);
            let pe = table.entry(page);
            let ps = if i == 0 { pe.load() } else { pe.lock() };
            let next = ps.with_kind(kind).with(HUGE, false).with(WRITEBACK, false).next_gen();
            pe.set_handle(0);
            let next = pe.set_locked(next);
            if pending {
                pe.set_flag(PENDING);
            }
            if kind == Kind::Resident {
                self.lru.push(table.clone(), page, FolioSize::K4, next.gen(), false);
            }
            if i != 0 {
                pe.unlock();
            }
        }
        e.set_locked(e.load().with(SPLIT, true));
        drop(gate);
        let sc = self.counters.size(folio);
        sc.split.inc();
        if folio.is_huge() {
            self.counters.vm.thp_split_page.inc();
        }
        Ok(())
    }

    /// Move the kept pages of a split folio from `slot` back to wherever they are mapped
    /// now. Holds the gate shared throughout; when the kernel has an event queued (EAGAIN)
    /// it reads the queue, folds any new event on this folio into `actions` (pages it
    /// removes are dropped from the slot instead of being moved in after the kernel's
    /// zap), and carries on with the pages not yet moved.
    fn move_split_pages(
        &self,
        table: &Arc<FolioTable>,
        head: usize,
        folio: FolioSize,
        at: Staged,
        batch: bool,
        actions: &mut [Action],
    ) -> std::sync::RwLockReadGuard<'_, ()> {
        let e = table.entry(head);
        let slot = at.slot;
        let base = self.staging.staged_addr(at);
        let first = at.page as usize * PAGE_SIZE;
        let mut moved = vec![false; folio.pages()];
        'again: loop {
            let gate = self.gate.read().unwrap();
            if e.load().has(PENDING) {
                e.clear_locked(PENDING);
                let (now, _) = self.pending_actions(table, head, folio);
                for (a, n) in actions.iter_mut().zip(now) {
                    if n != Action::Keep {
                        *a = n;
                    }
                }
            }
            for (i, a) in actions.iter().enumerate() {
                if *a != Action::Keep && !moved[i] {
                    let _ = self.staging.discard_range(slot, first + i * PAGE_SIZE, PAGE_SIZE);
                }
            }
            for run in table.mapped_runs(head, folio.pages()) {
                let mut i = run.page - head;
                let end = i + run.pages;
                while i < end {
                    if moved[i] || actions[i] != Action::Keep {
                        i += 1;
                        continue;
                    }
                    let mut j = i;
                    while j < end && !moved[j] && actions[j] == Action::Keep {
                        j += 1;
                    }
                    let dst = run.addr + (i - (run.page - head)) * PAGE_SIZE;
                    match self.uffd.move_pages(dst, base + i * PAGE_SIZE, (j - i) * PAGE_SIZE, true) {
                        Ok(()) => {
                            moved[i..j].iter_mut().for_each(|m| *m = true);
                            i = j;
                        }
                        Err(err) => {
                            let mut done = err.done / PAGE_SIZE;
                            if err.is(libc::EEXIST) && self.staging.moved_anyway(dst + err.done, base + (i + done) * PAGE_SIZE) {
                                done += 1;
                            }
                            moved[i..i + done].iter_mut().for_each(|m| *m = true);
                            if err.is(libc::EBUSY) || (err.is(libc::EEXIST) && done > err.done / PAGE_SIZE) {
                                std::thread::yield_now();
                                i += done;
                            } else if err.is(libc::EAGAIN) {
                                // An event waits to be read: read it, then start over.
                                drop(gate);
                                self.pump_events();
                                continue 'again;
                            } else {
                                eprintln!("folioswap: moving a split folio's pages back to {dst:#x}: {err}");
                                i = j;
                            }
                        }
                    }
                }
            }
            let _ = self.staging.discard_range(slot, first, folio.bytes());
            if batch {
                // Its pages moved out or were dropped: it leaves nothing in the batch slot.
                self.staging.end_batch_member(slot, 0, &self.memcg);
            } else {
                self.staging.put_hole(slot);
            }
            return gate;
        }
    }
}
