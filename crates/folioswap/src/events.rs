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
//! 3. otherwise `split_folio` makes it 4 KiB pages, each taking its own fate. A
//!    swapped-out folio is split where its data lies (`split_in_storage`); only one whose
//!    stored copy cannot be split is brought back, so that the kept pages keep their data
//!    (`move_split_pages` moves them to wherever they are mapped now).
//!
//! The walker retires an event once every folio of its range is applied.

use crate::charge::{reserve, Oom};
use crate::event_queue::{Action, FolioActions, PendingEvent};
use crate::folio::{Kind, CACHED, HUGE, PENDING, SPLIT, WANTED, WRITEBACK};
use crate::gate::pump_events;
use crate::install::{always_retry, transfer, HaltReason, Transfer};
use crate::memcg::Component;
use crate::mm::Mm;
use crate::readahead::forget_readahead;
use crate::release::drop_storage;
use crate::size::{FolioSize, PAGE_SIZE};
use crate::staging::{Staged, Taken};
use crate::table::FolioTable;
use crate::tier::{LoadError, Placed};
use crate::uffd::InstallMode;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

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

/// Walk the ranges of marked events, applying them, then retire them. An event that could
/// not be applied to some folio for now is not retired but walked again: at the next call
/// (which comes with the next message or kick) where the split lacked memory or staging,
/// and after `load_retry` where the folio's data could not be loaded (a read may fail once
/// and not again: a remote tier that timed out). Until then the folio keeps the event
/// pending, for whoever locks it next.
pub(crate) fn apply_queued_events(mm: &Mm) {
    loop {
        let Some(event) = mm.events.next_to_walk() else { return };
        if !event.due() {
            mm.events.queue_walk(event);
            return;
        }
        let table = &event.table;
        let folio_pages = table.folio.pages();
        let mut head = table.head_of(event.page);
        let mut walked = Walked::Applied;
        while head < event.page + event.pages {
            walked = walked.max(apply_folio(mm, table, head, event.page, event.pages, &event));
            head += folio_pages;
        }
        match walked {
            Walked::Applied => mm.events.retire(&event),
            Walked::Later => {
                mm.events.queue_walk(event);
                return;
            }
            Walked::LoadFailed => {
                event.defer(load_retry(event.load_failures()));
                mm.events.queue_walk(event);
                return;
            }
        }
    }
}

/// How long the walk leaves an event whose folio could not be loaded for its split, after
/// `failures` tries: 100 ms, doubling up to 10 s, so that a lasting failure (a remote tier
/// down, where each try waits for its timeout, 5 s by default) holds up the fault thread
/// that walks less and less often.
fn load_retry(failures: u32) -> Duration {
    const FIRST: Duration = Duration::from_millis(100);
    const MOST: Duration = Duration::from_secs(10);
    FIRST.saturating_mul(1 << failures.saturating_sub(1).min(16)).min(MOST)
}

/// What walking one folio came to, the worst of a range counting for the range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Walked {
    Applied,
    /// No memory or staging for the split now.
    Later,
    /// The folio's data could not be loaded for the split.
    LoadFailed,
}

/// Apply whatever is pending on the folio at `head` (on its pages in range, if split).
/// Short of `Applied`, the folio keeps the event pending. A load failure is reported once
/// per event (retried, a lasting failure would fill stderr).
fn apply_folio(mm: &Mm, table: &Arc<FolioTable>, head: usize, page: usize, pages: usize, event: &PendingEvent) -> Walked {
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
                return Walked::Applied;
            }
            match apply_pending_locked(mm, table, head, folio) {
                Ok(()) => {
                    let split_now = h.load().has(SPLIT);
                    h.unlock();
                    if split_now {
                        continue;
                    }
                    return Walked::Applied;
                }
                Err(ApplyError::WaitWriteback) => {
                    h.unlock();
                    h.wait_clear(WRITEBACK);
                    continue;
                }
                Err(ApplyError::Charge(_) | ApplyError::Staging(_)) => {
                    h.unlock();
                    return Walked::Later;
                }
                Err(err @ ApplyError::Load(_)) => {
                    h.unlock();
                    if event.note_load_failure() == 1 {
                        eprintln!("folioswap: applying an event to the folio at page {head}: {err} (the walk tries again after {:?}, then less and less often; a fault on the folio meanwhile tries the load itself)", load_retry(1));
                    }
                    return Walked::LoadFailed;
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
                        // A page alone is never split: nothing here loads, charges or fails.
                        debug_assert!(other.is_ok(), "applying an event to page {p}: {other:?}");
                        e.unlock();
                        break;
                    }
                }
            }
        }
        return Walked::Applied;
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
        let taken = mm.events.take_actions(table, target, folio);
        let FolioActions { pages: actions, force_split, .. } = &taken;
        let uniform = actions.iter().all(|&a| a == actions[0]);
        if folio.pages() == 1 || (uniform && !force_split) {
            match actions[0] {
                Action::Keep => {}
                Action::Zero => drop_folio(mm, table, target, folio, Kind::Untouched),
                Action::Gone => drop_folio(mm, table, target, folio, Kind::Gone),
            }
        } else {
            if let Err(err) = split_folio(mm, table, target, folio, actions) {
                // The folio is as it was: the events stay to apply, by whoever locks it next.
                mm.events.give_back(taken);
                e.set_flag(PENDING);
                return Err(err);
            }
            // Its pages are folios of their own now, each with what was marked on the folio
            // since (the head page's too): applied page by page, not as a folio of this size
            // again, which would split the split folio once more.
            return Ok(());
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
/// action. A swapped-out folio is split where it is stored (`split_in_storage`), or, where
/// that cannot be done, brought back first so kept pages keep their data.
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
            if split_in_storage(mm, table, head, folio, s.kind(), handle, actions) {
                return Ok(());
            }
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
        None => {
            #[cfg(test)]
            tests::BEFORE_SPLIT_GATE.with(|hook| hook.get().map(|hook| hook(mm)));
            mm.gate.read().unwrap()
        }
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

/// Split a Pool or Swapped folio where its data lies, as a partial swap-in does
/// (`Tiers::split_pool_entry`, `split_file_entry`): each kept page keeps its own stored
/// copy, every other page's copy is freed. Nothing is brought back, so nothing is read or
/// charged, and a split does not wait for memory (`reserve`) where a full memory_high has
/// none. False, the folio untouched, where its copy cannot be split (stored as one stream,
/// no room in the pool for the pieces, page checksums that do not add up) or a page of it
/// may be mapped already (a copy in that an event stopped part way put it there: the page
/// must become Resident, as it is; also where the page tables could not be read): then it
/// is brought back.
fn split_in_storage(mm: &Mm, table: &Arc<FolioTable>, head: usize, folio: FolioSize, kind: Kind, handle: u64, actions: &[Action]) -> bool {
    #[cfg(test)]
    tests::BEFORE_SPLIT_GATE.with(|hook| hook.get().map(|hook| hook(mm)));
    // Held from the look at the page tables on, so that the addresses looked at stay the
    // folio's.
    let _gate = mm.gate.read().unwrap();
    let unmapped = |run: &crate::table::Piece| mm.staging.none_present(run.addr, run.pages * PAGE_SIZE);
    if !table.mapped_runs(head, folio.pages()).iter().all(unmapped) {
        return false;
    }
    let placed = match kind {
        Kind::Pool => mm.tiers.split_pool_entry(handle, folio, &mm.counters),
        _ => mm.tiers.split_file_entry(handle, folio),
    };
    let Some(placed) = placed else {
        return false;
    };
    publish_split_in_storage(mm, table, head, folio, &placed, |i| actions[i]);
    true
}

/// Publish a folio split where it is stored (`placed`: one entry per page, from
/// `Tiers::split_pool_entry` or `split_file_entry`), page `i` taking `fate(i)`: kept, its
/// entry recorded; else its entry freed. The caller holds the folio lock and the gate
/// shared. Shared by events and partial swap-ins (`fault.rs` `split_on_swapin`).
pub(crate) fn publish_split_in_storage(
    mm: &Mm,
    table: &Arc<FolioTable>,
    head: usize,
    folio: FolioSize,
    placed: &[Placed],
    fate: impl Fn(usize) -> Action,
) {
    table.split_into_pages(head, placed.len(), |i, ps, clock| {
        // A new generation: the folio's own pool-LRU entry (at the head) goes stale.
        let next = ps.with(HUGE, false).with(WRITEBACK, false).with(CACHED, false).next_gen();
        let kind = match fate(i) {
            Action::Keep => mm.tiers.record_page(table, head + i, next.gen(), placed[i]),
            discarded => {
                mm.tiers.free_placed(&placed[i..=i], FolioSize::K4);
                table.entry(head + i).set_handle(0);
                if discarded == Action::Zero {
                    Kind::Untouched
                } else {
                    Kind::Gone
                }
            }
        };
        (next.with_kind(kind), clock)
    });
    let sc = mm.counters.size(folio);
    sc.split.inc();
    if folio.is_huge() {
        mm.counters.vm.thp_split_page.inc();
    }
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
                    Ok(_) => i = j,
                    Err(halt) => match halt.why {
                        HaltReason::EventQueued => {
                            // An event waits to be read: read it, then start over.
                            drop(gate);
                            pump_events(mm);
                            continue 'again;
                        }
                        HaltReason::Failed(err) if err.errno == libc::EEXIST => {
                            // The page is mapped already: a copy in that an event stopped part
                            // way put it there, and the program may have written it since. It
                            // stays as it is; the rest of the run goes on.
                            let at = i + moved_now;
                            moved[at] = true;
                            i = at + 1;
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

/// After a reclaimer's stores stopped counting in flight (`writeback_batch`, `evict`):
/// apply an event marked on the folio at `head` while it was being stored. Not at its
/// publish, under the folio lock: a split that must bring the folio back charges memory
/// (`split_folio`), and `charge::reserve` waits while stores are in flight, so with memory
/// full it would wait on the reclaimer's own batch, 50 ms at a time, for as long as
/// nothing else freed any. The walk applies every marked folio too, waiting for its lock;
/// this spares the fault thread that work. What cannot be applied now (no memory for the
/// split, a failed read) stays marked for the walk, which tries again and reports.
pub(crate) fn apply_pending_after_store(mm: &Mm, table: &Arc<FolioTable>, head: usize, folio: FolioSize) {
    let e = table.entry(head);
    if !e.load().has(PENDING) {
        return;
    }
    let s = e.lock();
    if s.has(PENDING) {
        // A split published since has made the head an order-0 page like the others.
        let size = if s.has(SPLIT) { FolioSize::K4 } else { folio };
        let _ = apply_pending_locked(mm, table, head, size);
    }
    e.unlock();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evict::{shrink_one, Reclaimer};
    use crate::gate::tests::{filled_region, remove_page, resident_region};
    use crate::mm::Reclaimed;
    use crate::zswap::CodecScratch;
    use std::cell::Cell;

    thread_local! {
        /// Run by `split_folio` of a folio with nothing staged (or split where it is
        /// stored), after its actions were taken and before it takes the gate, where
        /// another event may be marked.
        pub(super) static BEFORE_SPLIT_GATE: Cell<Option<fn(&Mm)>> = const { Cell::new(None) };
    }

    #[test]
    fn a_failed_load_is_retried_less_and_less_often() {
        let delays: Vec<u64> = (1..=9).map(|n| load_retry(n).as_millis() as u64).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000]);
        assert_eq!(load_retry(u32::MAX), Duration::from_secs(10));
    }

    /// Discard page `page` of the `resident_region` and apply the event to the folio at
    /// `head` on this thread: it holds the folio's lock while the event is marked, so the
    /// engine's walk waits for it.
    fn discard_and_apply(mm: &Mm, table: &Arc<FolioTable>, head: usize, page: usize) {
        let h = table.entry(head);
        h.lock();
        remove_page(mm, page);
        let applied = apply_pending_locked(mm, table, head, FolioSize::K64);
        h.unlock();
        applied.unwrap_or_else(|e| panic!("applying the event: {e}"));
    }

    /// An event marked while a folio is being split, after its actions were taken, is
    /// applied to the page it covers alone. Before, the folio was applied again at its own
    /// size and split a second time, which made a page the first split had discarded
    /// Resident again (and would have dropped the handle of any page stored meanwhile).
    #[test]
    fn an_event_marked_during_a_split_is_applied_to_its_page_alone() {
        let (engine, region, table, head) = resident_region();
        let mm = engine.mm();
        // Held from before the first event, so that this thread applies it (the engine's
        // walk waits), with the second event marked in the middle of the split.
        let h = table.entry(head);
        h.lock();
        remove_page(mm, 1);
        BEFORE_SPLIT_GATE.with(|hook| hook.set(Some(|mm| remove_page(mm, 3))));
        let applied = apply_pending_locked(mm, &table, head, FolioSize::K64);
        BEFORE_SPLIT_GATE.with(|hook| hook.set(None));
        h.unlock();
        applied.unwrap_or_else(|e| panic!("applying the events: {e}"));
        let third = table.entry(head + 3);
        if third.lock().has(PENDING) {
            apply_pending_locked(mm, &table, head + 3, FolioSize::K4).unwrap_or_else(|e| panic!("applying the second event: {e}"));
        }
        third.unlock();
        let kinds: Vec<Kind> = (0..16).map(|p| table.entry(head + p).load().kind()).collect();
        let expected: Vec<Kind> = (0..16).map(|p| if p == 1 || p == 3 { Kind::Untouched } else { Kind::Resident }).collect();
        assert!(h.load().has(SPLIT));
        assert_eq!(kinds, expected);
        // Every kept page of the region; pages 1 and 3 still hold theirs, as no kernel zap
        // followed these events.
        for (p, page) in region.as_slice().chunks(PAGE_SIZE).enumerate().filter(|&(p, _)| p != 1 && p != 3) {
            assert!(page.iter().all(|&b| b == 7), "kept page {p} lost its data");
        }
    }

    /// The `resident_region` with its first folio evicted into the pool.
    fn pooled_region() -> (crate::Engine, crate::Region, Arc<FolioTable>, usize) {
        let (engine, region, table, head) = resident_region();
        let mut scratch = CodecScratch::new();
        assert_eq!(shrink_one(engine.mm(), &mut scratch, Reclaimer::Kswapd), Reclaimed::Freed);
        assert_eq!(table.entry(head).load().kind(), Kind::Pool, "the first folio is evicted first");
        (engine, region, table, head)
    }

    /// A discard of part of a folio in the pool splits it there: the kept pages stay in
    /// the pool, an entry each, nothing is decompressed or charged, and each page comes
    /// back with its data when touched. Before, the whole folio was decompressed and its
    /// kept pages moved back in, which needed memory that a full memory_high may not have.
    #[test]
    fn a_partial_discard_splits_a_pooled_folio_where_it_lies() {
        let (engine, region, table, head) = pooled_region();
        let mm = engine.mm();
        let charged = mm.memcg.get(Component::Resident);
        discard_and_apply(mm, &table, head, 1);
        assert!(table.entry(head).load().has(SPLIT));
        let kinds: Vec<Kind> = (0..16).map(|p| table.entry(head + p).load().kind()).collect();
        let expected: Vec<Kind> = (0..16).map(|p| if p == 1 { Kind::Untouched } else { Kind::Pool }).collect();
        assert_eq!(kinds, expected);
        assert_eq!(mm.memcg.get(Component::Resident), charged, "the split charged memory");
        assert_eq!(mm.counters.vm.zswpin.get(), 0, "the split brought pages in");
        for (p, page) in region.as_slice().chunks(PAGE_SIZE).enumerate() {
            let fill = if p == 1 { 0 } else { 7 };
            assert!(page.iter().all(|&b| b == fill), "page {p} reads {} where {fill} was expected", page[0]);
        }
    }

    /// A fault read before a REMOVE and served after it, while the kernel's zap of the
    /// discarded page has not run yet, finds the page still mapped with its old data. It
    /// must leave the page Untouched and uncharged. Before, the zero copy stepped over the
    /// page and marked it Resident: an eviction before the zap then stored the discarded
    /// data, and the page read it back after the zap instead of zeros.
    #[test]
    fn a_fault_before_the_zap_leaves_a_discarded_page_untouched() {
        let (engine, region, table, head) = resident_region();
        let mm = engine.mm();
        discard_and_apply(mm, &table, head, 1);
        assert_eq!(table.entry(head + 1).load().kind(), Kind::Untouched);
        let charged = mm.memcg.get(Component::Resident);
        let page1 = region.as_ptr() as usize + PAGE_SIZE;
        assert!(matches!(crate::fault::handle_fault(mm, page1), crate::fault::FaultOutcome::Served));
        let page = table.entry(head + 1).load();
        assert_eq!(page.kind(), Kind::Untouched, "a page the program discarded was taken in with its old data: {page:?}");
        assert_eq!(mm.memcg.get(Component::Resident), charged, "the page was charged");
        assert_eq!(mm.counters.vm.fault_before_zap.get(), 1);
        // Every other page of the region keeps its data; page 1 too, until a zap.
        for (p, page) in region.as_slice().chunks(PAGE_SIZE).enumerate() {
            assert!(page.iter().all(|&b| b == 7), "page {p} lost its data");
        }
    }

    /// The same for a 2 MiB folio discarded whole: its zero install is copied around the
    /// mapped pages. Before, the move into the mapped range failed the fault.
    #[test]
    fn a_fault_before_the_zap_of_a_2m_folio_is_served_and_left_untouched() {
        let engine = crate::Engine::new(crate::Config::default().no_swap_file()).unwrap_or_else(|e| panic!("cannot start the engine: {e}"));
        let (region, table, head) = filled_region(&engine, 2 << 20, "2M");
        let mm = engine.mm();
        let start = region.as_ptr() as usize;
        crate::gate::tests::remove(mm, start, 2 << 20);
        let h = table.entry(head);
        if h.lock().has(PENDING) {
            apply_pending_locked(mm, &table, head, FolioSize::M2).unwrap_or_else(|e| panic!("applying the event: {e}"));
        }
        h.unlock();
        assert_eq!(h.load().kind(), Kind::Untouched);
        let charged = mm.memcg.get(Component::Resident);
        match crate::fault::handle_fault(mm, start + 5 * PAGE_SIZE) {
            crate::fault::FaultOutcome::Served => {}
            crate::fault::FaultOutcome::Failed(err) => panic!("the fault failed: {err}"),
            crate::fault::FaultOutcome::NotOurs(why) => panic!("the fault was not served: {why:?}"),
        }
        assert_eq!(h.load().kind(), Kind::Untouched, "a folio the program discarded was taken in with its old data");
        assert_eq!(mm.memcg.get(Component::Resident), charged, "the folio was charged");
        assert_eq!(mm.counters.vm.fault_before_zap.get(), 1);
        assert!(region.as_slice().iter().all(|&b| b == 7), "a page lost its data before the zap");
    }

    /// A read that fails once while the walk splits a swapped-out folio for a partial
    /// discard leaves the event to apply: the walk comes back to it, and a fault meanwhile
    /// applies it itself. Before, the walk retired the event, the folio kept its flag with
    /// no event behind it, and the discarded page read its old data (a remote tier that
    /// times out once fails a read this way).
    #[test]
    fn a_read_that_fails_once_in_the_walk_keeps_the_discard() {
        use crate::swapfile::io::{FaultInjector, SwapFile};
        let file =
            SwapFile::create_sparse(std::path::Path::new("/var/tmp"), 64 << 20).unwrap_or_else(|e| panic!("a swap file in /var/tmp: {e}"));
        let io = Arc::new(FaultInjector::new(file));
        // No pool: every folio goes to the file.
        let config = crate::Config::default().max_pool("0").unwrap();
        let engine = crate::Engine::with_swap_io(config, Box::new(io.clone())).unwrap_or_else(|e| panic!("cannot start the engine: {e}"));
        let (region, table, head) = filled_region(&engine, 1 << 20, "64K");
        let mm = engine.mm();
        let start = region.as_ptr() as usize;
        let mut scratch = CodecScratch::new();
        assert_eq!(shrink_one(mm, &mut scratch, Reclaimer::Kswapd), Reclaimed::Freed);
        assert_eq!(table.entry(head).load().kind(), Kind::Swapped, "the first folio is on the file");
        // Page 2 mapped already, as a copy in that an event stopped leaves it: the split
        // must then read the folio (otherwise it splits it on the file, reading nothing).
        let written = [9u8; PAGE_SIZE];
        mm.uffd.copy(start + 2 * PAGE_SIZE, written.as_ptr(), PAGE_SIZE, true).unwrap_or_else(|e| panic!("copying page 2 in: {e}"));
        io.fail_reads(1, libc::EIO);
        crate::gate::tests::remove(mm, start + PAGE_SIZE, PAGE_SIZE);
        // The walk (here, or on a fault thread the marking woke) meets the failed read; wait
        // until whichever thread walked is done with the event.
        apply_queued_events(mm);
        let wait_for = |what: &str, done: &dyn Fn() -> bool| {
            for _ in 0..10_000 {
                if done() {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            panic!("{what}: not within 10 s");
        };
        wait_for("the split's read failing", &|| io.injected() == 1);
        wait_for("the walk ending", &|| !mm.events.being_walked());
        for (p, page) in region.as_slice().chunks(PAGE_SIZE).enumerate() {
            let fill = match p {
                1 => 0,
                2 => 9,
                _ => 7,
            };
            assert!(page.iter().all(|&b| b == fill), "page {p} reads {} where {fill} was expected", page[0]);
        }
    }

    /// With the `trace` feature a page's history names the eviction, the event read over
    /// it and the split that applied it, each with the line that made it.
    #[cfg(feature = "trace")]
    #[test]
    fn a_pages_trace_shows_its_eviction_the_event_and_the_split() {
        let (engine, region, table, head) = resident_region();
        let mm = engine.mm();
        let mut scratch = CodecScratch::new();
        assert_eq!(shrink_one(mm, &mut scratch, Reclaimer::Kswapd), Reclaimed::Freed);
        discard_and_apply(mm, &table, head, 1);
        let history = crate::Engine::trace_history(region.as_ptr() as usize + PAGE_SIZE).join("\n");
        for wanted in ["head: Resident", "-> Pool", "REMOVE", "|PENDING", "page: ", "events.rs:"] {
            assert!(history.contains(wanted), "no {wanted:?} in the history:\n{history}");
        }
        // The swapped folio's data: page 1 discarded, every other page of the region kept.
        for (p, page) in region.as_slice().chunks(PAGE_SIZE).enumerate() {
            let fill = if p == 1 { 0 } else { 7 };
            assert!(page.iter().all(|&b| b == fill), "page {p} reads {} where {fill} was expected", page[0]);
        }
    }

    /// Splitting a swapped-out folio whose page is mapped already (a copy in that an event
    /// stopped part way put it there, and the program wrote it since) keeps that page as
    /// it is and moves the rest of the folio back. Before, the rest of the run after it
    /// was left out, marked Resident but unmapped: it read back as zeros.
    #[test]
    fn a_split_keeps_a_page_mapped_already_and_moves_the_rest() {
        let (engine, region, table, head) = pooled_region();
        let mm = engine.mm();
        // Page 2 comes back on its own, with new data, as a stopped copy in leaves it.
        let written = [9u8; PAGE_SIZE];
        let page2 = region.as_ptr() as usize + 2 * PAGE_SIZE;
        mm.uffd.copy(page2, written.as_ptr(), PAGE_SIZE, true).unwrap_or_else(|e| panic!("copying page 2 in: {e}"));
        discard_and_apply(mm, &table, head, 1);
        // Every page of the region, the folios evicted with the first one included.
        let fill = |p: usize| match p {
            1 => 0,
            2 => 9,
            _ => 7,
        };
        for (p, page) in region.as_slice().chunks(PAGE_SIZE).enumerate() {
            assert!(page.iter().all(|&b| b == fill(p)), "page {p} reads {} where {} was expected", page[0], fill(p));
        }
    }
}
