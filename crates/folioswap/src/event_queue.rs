//! The events read from the userfaultfd and not yet applied to every folio they cover:
//! what `gate.rs` records when it reads REMOVE/UNMAP/REMAP, and what `events.rs`
//! consults when it applies them. State only.
//!
//! Both mutexes are leaves: nothing else is taken while one is held.

use crate::size::FolioSize;
use crate::table::FolioTable;
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

/// One event over a table's pages `[page, page + pages)`.
pub(crate) struct PendingEvent {
    pub table: Arc<FolioTable>,
    pub page: usize,
    pub pages: usize,
    pub kind: EventKind,
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
}

#[derive(Default)]
pub(crate) struct EventQueue {
    /// Marked and not yet retired: consulted by whoever applies a folio.
    pending: Mutex<Vec<Arc<PendingEvent>>>,
    /// Waiting for a thread to walk their range.
    to_walk: Mutex<VecDeque<Arc<PendingEvent>>>,
}

impl EventQueue {
    /// Record an event: pending from now on, and queued for a walk over its range.
    pub fn push(&self, event: PendingEvent) {
        let event = Arc::new(event);
        self.pending.lock().unwrap().push(event.clone());
        self.to_walk.lock().unwrap().push_back(event);
    }

    /// The next event whose range nobody has walked yet.
    pub fn next_to_walk(&self) -> Option<Arc<PendingEvent>> {
        self.to_walk.lock().unwrap().pop_front()
    }

    /// The event was applied to every folio of its range: forget it.
    pub fn retire(&self, event: &Arc<PendingEvent>) {
        self.pending.lock().unwrap().retain(|e| !Arc::ptr_eq(e, event));
    }

    /// What the pending events make of each page of the folio at `target` of `table`.
    pub fn actions(&self, table: &Arc<FolioTable>, target: usize, folio: FolioSize) -> FolioActions {
        let mut actions = FolioActions { pages: vec![Action::Keep; folio.pages()], force_split: false };
        for ev in self.pending.lock().unwrap().iter() {
            if !Arc::ptr_eq(&ev.table, table) {
                continue;
            }
            let lo = ev.page.max(target);
            let hi = (ev.page + ev.pages).min(target + folio.pages());
            if lo >= hi {
                continue;
            }
            for a in &mut actions.pages[lo - target..hi - target] {
                match ev.kind {
                    EventKind::Remove if *a == Action::Keep => *a = Action::Zero,
                    EventKind::Unmap => *a = Action::Gone,
                    EventKind::Split => actions.force_split = true,
                    EventKind::Remove => {}
                }
            }
        }
        actions
    }
}
