//! Applying REMOVE, UNMAP and REMAP to the folios they cover: keeping the engine's
//! copies true to what the program did to its address space.
//!
//! `gate.rs` reads an event and marks it: PENDING on every folio it covers, the event in
//! `Mm::events`. Whoever next locks a marked folio (a fault, an eviction, a publish, or
//! the fault thread walking the event's range) applies what is pending on it here:
//! 1. `apply_pending_locked` asks the event queue what becomes of each page (keep, zero,
//!    gone, or a forced split where a mapping boundary now cuts the folio);
//! 2. the same fate for every page: `drop_folio` releases its copy and leaves it
//!    Untouched (reads as zeros again) or Gone;
//! 3. otherwise `split_folio` makes it 4 KiB pages, each taking its own fate, first
//!    bringing a swapped-out folio's data back so the kept pages keep it
//!    (`move_split_pages` moves them to wherever they are mapped now).
//!
//! The walker retires an event once every folio of its range is applied.

use crate::charge::{reserve, Oom};
use crate::event_queue::{Action, FolioActions};
use crate::folio::{Kind, HUGE, PENDING, SPLIT, WANTED, WRITEBACK};
use crate::gate::pump_events;
use crate::install::{always_retry, transfer, HaltReason, Transfer};
use crate::memcg::Component;
use crate::mm::Mm;
use crate::readahead::forget_readahead;
use crate::release::drop_storage;
use crate::size::{FolioSize, PAGE_SIZE};
use crate::staging::{Staged, Taken};
use crate::table::FolioTable;
use crate::tier::LoadError;
use crate::uffd::InstallMode;
use std::fmt;
use std::sync::Arc;

/// Why a pending event could not be applied to a folio now.
#[derive(Debug)]
pub(crate) enum ApplyError {
    /// The folio is under writeback: unlock, wait for WRITEBACK to clear, retry.
    WaitWriteback,
    /// Splitting a swapped-out folio needs its data back, and there is no memory for it.
    Charge(Oom),
    /// No staging slot to bring the data back into.
    Staging(std::io::Error),
    /// Its data cannot be brought back.
    Load(LoadError),
}

impl fmt::Display for ApplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApplyError::WaitWriteback => write!(f, "the folio is under writeback"),
            ApplyError::Charge(oom) => write!(f, "{oom}"),
            ApplyError::Staging(err) => write!(f, "staging for a split: {err}"),
            ApplyError::Load(err) => write!(f, "splitting a swapped-out folio: {err}"),
        }
    }
}

/// Walk the ranges of marked events, applying them, then retire them.
pub(crate) fn apply_queued_events(mm: &Mm) {
    loop {
        let Some(event) = mm.events.next_to_walk() else { return };
        let table = &event.table;
        let folio_pages = table.folio.pages();
        let mut head = table.head_of(event.page);
        while head < event.page + event.pages {
            apply_folio(mm, table, head, event.page, event.pages);
            head += folio_pages;
        }
        mm.events.retire(&event);
    }
}

/// Apply whatever is pending on the folio at `head` (on its pages in range, if split).
fn apply_folio(mm: &Mm, table: &Arc<FolioTable>, head: usize, page: usize, pages: usize) {
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
            match apply_pending_locked(mm, table, head, folio) {
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
                Err(err) => {
                    h.unlock();
                    eprintln!("folioswap: applying an event to the folio at page {head}: {err}");
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
                match apply_pending_locked(mm, table, p, FolioSize::K4) {
                    Err(ApplyError::WaitWriteback) => {
                        e.unlock();
                        e.wait_clear(WRITEBACK);
                    }
                    other => {
                        if let Err(err) = other {
                            eprintln!("folioswap: applying an event to page {p}: {err}");
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
pub(crate) fn apply_pending_locked(mm: &Mm, table: &Arc<FolioTable>, target: usize, folio: FolioSize) -> Result<(), ApplyError> {
    let e = table.entry(target);
    while e.load().has(PENDING) {
        let s = e.load();
        if s.kind() == Kind::SwapCache && s.has(WRITEBACK) && folio.pages() > 1 {
            // Splitting needs the data: get it back from the compressor first.
            e.set_flag(WANTED);
            return Err(ApplyError::WaitWriteback);
        }
        e.clear_locked(PENDING);
        let FolioActions { pages: actions, force_split } = mm.events.take_actions(table, target, folio);
        let uniform = actions.iter().all(|&a| a == actions[0]);
        if folio.pages() == 1 || (uniform && !force_split) {
            match actions[0] {
                Action::Keep => {}
                Action::Zero => drop_folio(mm, table, target, folio, Kind::Untouched),
                Action::Gone => drop_folio(mm, table, target, folio, Kind::Gone),
            }
        } else {
            split_folio(mm, table, target, folio, &actions)?;
        }
    }
    Ok(())
}

/// The whole folio is discarded: release its copy, leave it `kind`.
fn drop_folio(mm: &Mm, table: &Arc<FolioTable>, target: usize, folio: FolioSize, kind: Kind) {
    forget_readahead(mm, table, target);
    let e = table.entry(target);
    let s = e.load();
    drop_storage(mm, s.kind(), e.handle(), folio, s.has(WRITEBACK));
    e.set_handle(0);
    e.set_locked(s.with_kind(kind).with(WRITEBACK, false).with(HUGE, false));
    e.clear_locked(WANTED);
    mm.reclaim.notify_progress();
}

/// Split the (locked, unsplit) folio at `head` into 4 KiB pages, each taking its
/// action. A swapped-out folio is brought back first so kept pages keep their data.
fn split_folio(mm: &Mm, table: &Arc<FolioTable>, head: usize, folio: FolioSize, actions: &[Action]) -> Result<(), ApplyError> {
    forget_readahead(mm, table, head);
    let e = table.entry(head);
    let s = e.load();
    let bytes = folio.bytes() as u64;
    // The folio's data in staging, for Pool and SwapCache folios; the charge for it held
    // until its kept pages are on the LRU.
    let mut charge = None;
    let staged = match s.kind() {
        Kind::Pool | Kind::Swapped => {
            let handle = e.handle();
            charge = Some(reserve(mm, bytes).map_err(ApplyError::Charge)?);
            let Taken { slot, from_reserve, huge } = match mm.staging.take_filled(folio.order()) {
                Ok(taken) => taken,
                Err(err) => {
                    mm.memcg.uncharge(Component::Resident, bytes);
                    return Err(ApplyError::Staging(err));
                }
            };
            if from_reserve {
                mm.memcg.uncharge(Component::StagingFree, bytes);
            }
            // SAFETY: we own the slot until we put it back, and nothing else maps it.
            let dst = unsafe { mm.staging.slice_mut(slot) };
            if let Err(err) = mm.tiers.load(s.kind(), handle, dst, &mm.counters) {
                mm.staging.put_filled(slot, huge, &mm.memcg);
                mm.memcg.uncharge(Component::Resident, bytes);
                return Err(ApplyError::Load(err));
            }
            mm.tiers.free(s.kind(), handle, folio);
            // Charged as resident from here; pages not kept are uncharged below.
            Some((Staged { slot, page: 0 }, false))
        }
        Kind::SwapCache => {
            mm.memcg.transfer(Component::SwapCache, Component::Resident, bytes);
            // A folio below 2 MiB in the swap cache shares a batch slot.
            Some((Staged::from_raw(e.handle()), !folio.is_huge()))
        }
        _ => None,
    };
    let mut actions = actions.to_vec();
    let gate = match staged {
        Some((at, batch)) => move_split_pages(mm, table, head, folio, at, batch, &mut actions),
        None => mm.gate.read().unwrap(),
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
        mm.memcg.uncharge(Component::Resident, dropped as u64);
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
        if kind == Kind::Resident {
            pe.set_installed_at(mm.lru.now());
        }
        let next = pe.set_locked(next);
        if pending {
            pe.set_flag(PENDING);
        }
        if kind == Kind::Resident {
            mm.lru.push(table.clone(), page, FolioSize::K4, next.gen(), false);
        }
        if i != 0 {
            pe.unlock();
        }
    }
    e.set_locked(e.load().with(SPLIT, true));
    drop(gate);
    drop(charge);
    let sc = mm.counters.size(folio);
    sc.split.inc();
    if folio.is_huge() {
        mm.counters.vm.thp_split_page.inc();
    }
    Ok(())
}

/// Move the kept pages of a split folio from `slot` back to wherever they are mapped
/// now. Holds the gate shared throughout; when the kernel has an event queued (EAGAIN)
/// it reads the queue, folds any new event on this folio into `actions` (pages it
/// removes are dropped from the slot instead of being moved in after the kernel's
/// zap), and carries on with the pages not yet moved.
fn move_split_pages<'m>(
    mm: &'m Mm,
    table: &Arc<FolioTable>,
    head: usize,
    folio: FolioSize,
    at: Staged,
    batch: bool,
    actions: &mut [Action],
) -> std::sync::RwLockReadGuard<'m, ()> {
    let e = table.entry(head);
    let slot = at.slot;
    let base = mm.staging.staged_addr(at);
    let first = at.page as usize * PAGE_SIZE;
    let mut moved = vec![false; folio.pages()];
    'again: loop {
        let gate = mm.gate.read().unwrap();
        if e.load().has(PENDING) {
            e.clear_locked(PENDING);
            let now = mm.events.take_actions(table, head, folio);
            for (a, n) in actions.iter_mut().zip(now.pages) {
                if n != Action::Keep {
                    *a = n;
                }
            }
        }
        for (i, a) in actions.iter().enumerate() {
            if *a != Action::Keep && !moved[i] {
                let _ = mm.staging.discard_range(slot, first + i * PAGE_SIZE, PAGE_SIZE);
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
                let (src, len) = (base + i * PAGE_SIZE, (j - i) * PAGE_SIZE);
                let mut done = 0;
                let how = match mm.install {
                    InstallMode::Move => Transfer::MoveIn { wake: true },
                    InstallMode::Copy => Transfer::CopyIn { wake: true },
                };
                let halt = transfer(mm, how, dst, src, len, &mut done, &mut always_retry);
                let moved_now = done.min(len) / PAGE_SIZE;
                moved[i..i + moved_now].iter_mut().for_each(|m| *m = true);
                match halt {
                    Ok(()) => i = j,
                    Err(halt) => match halt.why {
                        HaltReason::EventQueued => {
                            // An event waits to be read: read it, then start over.
                            drop(gate);
                            pump_events(mm);
                            continue 'again;
                        }
                        why => {
                            eprintln!("folioswap: moving a split folio's pages back to {dst:#x}: {why:?}");
                            i = j;
                        }
                    },
                }
            }
        }
        let _ = mm.staging.discard_range(slot, first, folio.bytes());
        if batch {
            // Its pages moved out or were dropped: it leaves nothing in the batch slot.
            mm.staging.end_batch_member(slot, 0, &mm.memcg);
        } else {
            mm.staging.put_hole(slot);
        }
        return gate;
    }
}

/// After a locked folio's new state is published (a swap-out, a writeback): apply an
/// event marked meanwhile (a published split has made the head an order-0 page like the
/// others).
pub(crate) fn apply_pending_after_publish(mm: &Mm, table: &Arc<FolioTable>, head: usize, folio: FolioSize) {
    let s = table.entry(head).load();
    if s.has(PENDING) {
        let size = if s.has(SPLIT) { FolioSize::K4 } else { folio };
        match apply_pending_locked(mm, table, head, size) {
            Ok(()) | Err(ApplyError::WaitWriteback) => {}
            Err(err) => eprintln!("folioswap: applying an event after a swap-out: {err}"),
        }
    }
}
