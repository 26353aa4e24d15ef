//! The events read from the userfaultfd and not yet applied to every folio they cover:
//! what `gate.rs` records when it reads REMOVE/UNMAP/REMAP, and what `events.rs`
//! consults when it applies them. State only.
//!
//! An event stays pending until the walker has applied it over its whole range, which
//! may take a while (it waits for folios under writeback), but it is applied to each page
//! *once*: [`EventQueue::take_actions`] records the pages it hands an event's action for,
//! and neither it nor [`EventQueue::actions`] hands that action again, unless the taker
//! gives it back because it could not apply it ([`EventQueue::give_back`]). Applied twice, a
//! REMOVE would zero data the program wrote after the first time, once the folio had
//! been swapped back in, written and swapped out again before the walker was done.
//!
//! Every mutex here is a leaf: nothing else is taken while one is held.

use crate::size::FolioSize;
use crate::table::FolioTable;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventKind {
    /// Pages read as zeros from now on.
    Remove,
    /// Pages left the address space.
    Unmap,
    /// A mapping boundary now cuts the folio: split it, keep every page.
    Split,
}

/// One event over a table's pages `[page, page + pages)`.
pub(crate) struct PendingEvent {
    pub table: Arc<FolioTable>,
    pub page: usize,
    pub pages: usize,
    pub kind: EventKind,
    /// One bit per page of the range: the event was applied there (module comment).
    /// Changed only under `EventQueue::pending`'s lock.
    applied: Vec<AtomicU64>,
    /// Not to be walked again before this (a folio's data could not be loaded to split
    /// it: `defer`); the walk's own lock, a leaf.
    not_before: Mutex<Option<Instant>>,
    /// Times a folio of this event could not be loaded for its split.
    load_failures: AtomicU32,
}

impl PendingEvent {
    pub fn new(table: Arc<FolioTable>, page: usize, pages: usize, kind: EventKind) -> PendingEvent {
        PendingEvent {
            table,
            page,
            pages,
            kind,
            applied: (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            not_before: Mutex::new(None),
            load_failures: AtomicU32::new(0),
        }
    }

    /// Walk this event again no sooner than `after` from now.
    pub fn defer(&self, after: Duration) {
        *self.not_before.lock().unwrap() = Some(Instant::now() + after);
    }

    /// Whether the walk may take this event now.
    pub fn due(&self) -> bool {
        self.not_before.lock().unwrap().is_none_or(|at| Instant::now() >= at)
    }

    /// A folio of this event could not be loaded for its split: how many times so far.
    pub fn note_load_failure(&self) -> u32 {
        self.load_failures.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn load_failures(&self) -> u32 {
        self.load_failures.load(Ordering::Relaxed)
    }

    fn is_applied(&self, page: usize) -> bool {
        let i = page - self.page;
        self.applied[i / 64].load(Ordering::Relaxed) & (1 << (i % 64)) != 0
    }

    fn set_applied(&self, page: usize) {
        let i = page - self.page;
        self.applied[i / 64].fetch_or(1 << (i % 64), Ordering::Relaxed);
    }

    fn clear_applied(&self, page: usize) {
        let i = page - self.page;
        self.applied[i / 64].fetch_and(!(1 << (i % 64)), Ordering::Relaxed);
    }
}

/// What the pending events make of one page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    Keep,
    Zero,
    Gone,
}

/// What the pending events make of a folio: one action per page, and whether a mapping
/// boundary forces a split even where every page keeps the same action.
pub(crate) struct FolioActions {
    pub pages: Vec<Action>,
    pub force_split: bool,
    /// The (event, page) pairs `take_actions` recorded as applied, for `give_back`.
    taken: Vec<(Arc<PendingEvent>, usize)>,
}

#[derive(Default)]
pub(crate) struct EventQueue {
    /// Marked and not yet retired: consulted by whoever applies a folio.
    pending: Mutex<Vec<Arc<PendingEvent>>>,
    /// Waiting for a thread to walk their range; every folio they cover was flagged first.
    to_walk: Mutex<VecDeque<Arc<PendingEvent>>>,
}

impl EventQueue {
    /// Record an event: pending from now on, so that whoever applies a folio in its range
    /// applies it too. Not walked until [`EventQueue::queue_walk`].
    pub fn push(&self, event: PendingEvent) -> Arc<PendingEvent> {
        let event = Arc::new(event);
        self.pending.lock().unwrap().push(event.clone());
        event
    }

    /// Queue a pushed event for a walk over its range, once every folio it covers is
    /// flagged PENDING: a walker passes a folio without the flag, so one that started
    /// earlier would find nothing to do, retire the event, and leave the flags set after it
    /// naming an event nobody applies any more (a discard lost: the stress test read old
    /// data where the program had discarded).
    pub fn queue_walk(&self, event: Arc<PendingEvent>) {
        self.to_walk.lock().unwrap().push_back(event);
    }

    /// The next event whose range nobody has walked yet.
    pub fn next_to_walk(&self) -> Option<Arc<PendingEvent>> {
        self.to_walk.lock().unwrap().pop_front()
    }

    /// Whether some thread is walking an event now: one is recorded and none is queued
    /// (tests wait for a walk on another thread to finish).
    #[cfg(test)]
    pub fn being_walked(&self) -> bool {
        let recorded = !self.pending.lock().unwrap().is_empty();
        recorded && self.to_walk.lock().unwrap().is_empty()
    }

    /// The event was applied to every folio of its range: forget it.
    pub fn retire(&self, event: &Arc<PendingEvent>) {
        self.pending.lock().unwrap().retain(|e| !Arc::ptr_eq(e, event));
    }

    /// What the pending events not yet applied there make of each page of the folio at
    /// `target` of `table` (a look only: nothing is recorded).
    pub fn actions(&self, table: &Arc<FolioTable>, target: usize, folio: FolioSize) -> FolioActions {
        self.fold(table, target, folio, false)
    }

    /// The same, for the caller (holding the folio's lock) to apply now: each event's
    /// pages in the folio count as applied from here on, unless given back.
    pub fn take_actions(&self, table: &Arc<FolioTable>, target: usize, folio: FolioSize) -> FolioActions {
        self.fold(table, target, folio, true)
    }

    /// The caller could not apply what it took (no memory to split the folio) and left the
    /// folio as it was: its pages count as not applied again, for whoever locks it next.
    pub fn give_back(&self, actions: FolioActions) {
        let _pending = self.pending.lock().unwrap();
        for (ev, page) in actions.taken {
            ev.clear_applied(page);
        }
    }

    fn fold(&self, table: &Arc<FolioTable>, target: usize, folio: FolioSize, take: bool) -> FolioActions {
        let mut actions = FolioActions { pages: vec![Action::Keep; folio.pages()], force_split: false, taken: Vec::new() };
        for ev in self.pending.lock().unwrap().iter() {
            if !Arc::ptr_eq(&ev.table, table) {
                continue;
            }
            let lo = ev.page.max(target);
            let hi = (ev.page + ev.pages).min(target + folio.pages());
            for p in (lo..hi).filter(|&p| !ev.is_applied(p)) {
                let a = &mut actions.pages[p - target];
                match ev.kind {
                    EventKind::Remove if *a == Action::Keep => *a = Action::Zero,
                    EventKind::Unmap => *a = Action::Gone,
                    EventKind::Split => actions.force_split = true,
                    EventKind::Remove => {}
                }
                if take {
                    ev.set_applied(p);
                    actions.taken.push((ev.clone(), p));
                }
            }
        }
        actions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Arc<FolioTable> {
        Arc::new(FolioTable::new(FolioSize::K64, 64, 0x1000_0000).unwrap())
    }

    #[test]
    fn an_event_is_applied_to_a_page_once() {
        let (q, t) = (EventQueue::default(), table());
        // A REMOVE over pages 14..18: the end of the first 64K folio, the start of the second.
        q.push(PendingEvent::new(t.clone(), 14, 4, EventKind::Remove));
        let look = q.actions(&t, 0, FolioSize::K64).pages;
        assert_eq!(&look[13..16], &[Action::Keep, Action::Zero, Action::Zero]);
        assert_eq!(q.take_actions(&t, 0, FolioSize::K64).pages[14..16], [Action::Zero, Action::Zero]);
        // Not retired yet (the second folio is still to do), but done for the first one:
        // a folio swapped back in, written and marked again by a later event must not be
        // zeroed a second time.
        assert!(q.take_actions(&t, 0, FolioSize::K64).pages.iter().all(|&a| a == Action::Keep));
        assert!(q.actions(&t, 0, FolioSize::K64).pages.iter().all(|&a| a == Action::Keep));
        q.push(PendingEvent::new(t.clone(), 3, 1, EventKind::Remove));
        let later = q.take_actions(&t, 0, FolioSize::K64).pages;
        let zeroed: Vec<usize> = (0..16).filter(|&i| later[i] == Action::Zero).collect();
        assert_eq!(zeroed, vec![3]);
        // The second folio still gets the first event, once.
        assert_eq!(q.take_actions(&t, 16, FolioSize::K64).pages[..2], [Action::Zero, Action::Zero]);
        assert!(q.take_actions(&t, 16, FolioSize::K64).pages.iter().all(|&a| a == Action::Keep));
    }

    /// What a taker could not apply (no memory to split the folio) is handed again to the
    /// next one; an action given back was never lost in between.
    #[test]
    fn actions_given_back_are_taken_again() {
        let (q, t) = (EventQueue::default(), table());
        q.push(PendingEvent::new(t.clone(), 14, 4, EventKind::Remove));
        let first = q.take_actions(&t, 0, FolioSize::K64);
        assert_eq!(first.pages[14..16], [Action::Zero, Action::Zero]);
        q.give_back(first);
        assert_eq!(q.actions(&t, 0, FolioSize::K64).pages[14..16], [Action::Zero, Action::Zero]);
        let again = q.take_actions(&t, 0, FolioSize::K64);
        assert_eq!(again.pages[14..16], [Action::Zero, Action::Zero]);
        assert!(q.take_actions(&t, 0, FolioSize::K64).pages.iter().all(|&a| a == Action::Keep));
        // The other folio's pages were never taken by the first folio's taker.
        assert_eq!(q.take_actions(&t, 16, FolioSize::K64).pages[..2], [Action::Zero, Action::Zero]);
    }

    #[test]
    fn a_split_page_takes_what_its_folio_did_not() {
        let (q, t) = (EventQueue::default(), table());
        q.push(PendingEvent::new(t.clone(), 0, 16, EventKind::Split));
        q.push(PendingEvent::new(t.clone(), 5, 2, EventKind::Unmap));
        let folio = q.take_actions(&t, 0, FolioSize::K64);
        assert!(folio.force_split);
        assert_eq!(folio.pages[4..8], [Action::Keep, Action::Gone, Action::Gone, Action::Keep]);
        // Each page of the split folio, applied on its own later, has nothing left to do,
        // until a new event comes.
        for p in 0..16 {
            let page = q.take_actions(&t, p, FolioSize::K4);
            assert!(!page.force_split && page.pages == [Action::Keep], "page {p}");
        }
        q.push(PendingEvent::new(t.clone(), 6, 1, EventKind::Remove));
        assert_eq!(q.take_actions(&t, 6, FolioSize::K4).pages, [Action::Zero]);
    }
}
