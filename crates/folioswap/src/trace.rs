//! A ring of the last changes to folio state words and of the events read, for finding
//! races: built only with the `trace` feature (`cargo test --features trace`), and empty
//! otherwise. Each record says which thread made the change, at which line of the engine
//! (`#[track_caller]` on the state word's writers), and the word before and after.
//!
//! The stress test prints, for each word it reads wrong, what the ring holds for that page
//! (`Engine::trace_history`): its own entry, its folio's head, and the events covering it.
//! A lost discard that took days to reproduce read, from such a history, as "flag set, then
//! cleared with no action taken, then swapped in" (BENCHMARKS.md, "The event fixes cost
//! nothing"; ARCHITECTURE.md, "The event gate").
//!
//! Writers take a slot with one `fetch_add` and fill it with relaxed stores, then publish
//! its sequence number: no lock, so tracing barely changes the timing it is meant to see. A
//! reader skips a slot whose sequence number changed while it read (overwritten meanwhile).

use std::panic::Location;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// Records kept: the last 1 Mi changes (56 MiB; a second or so of the stress test, which
/// checks each word it writes soon after).
const RING: usize = 1 << 20;

/// What a record is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum What {
    /// A state word changed (`key` is the entry's address).
    State = 1,
    /// A handle word changed (`key` is the entry's address).
    Handle = 2,
    /// A REMOVE was read for `[key, end)`.
    Remove = 3,
    /// An UNMAP was read for `[key, end)`.
    Unmap = 4,
    /// A REMAP moved `[key, end)` to `new`.
    Remap = 5,
}

struct Slot {
    seq: AtomicU64,
    what: AtomicU8,
    tid: AtomicU32,
    key: AtomicUsize,
    end: AtomicUsize,
    old: AtomicU64,
    new: AtomicU64,
    at: AtomicPtr<Location<'static>>,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    seq: AtomicU64::new(0),
    what: AtomicU8::new(0),
    tid: AtomicU32::new(0),
    key: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    old: AtomicU64::new(0),
    new: AtomicU64::new(0),
    at: AtomicPtr::new(std::ptr::null_mut()),
};

static SLOTS: [Slot; RING] = [EMPTY; RING];
static NEXT: AtomicU64 = AtomicU64::new(0);

fn tid() -> u32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::gettid() as u32 }
}

/// Record one change.
pub(crate) fn record(what: What, key: usize, end: usize, old: u64, new: u64, at: &'static Location<'static>) {
    let seq = NEXT.fetch_add(1, Ordering::Relaxed) + 1;
    let slot = &SLOTS[(seq as usize) % RING];
    slot.seq.store(0, Ordering::Relaxed);
    slot.what.store(what as u8, Ordering::Relaxed);
    slot.tid.store(tid(), Ordering::Relaxed);
    slot.key.store(key, Ordering::Relaxed);
    slot.end.store(end, Ordering::Relaxed);
    slot.old.store(old, Ordering::Relaxed);
    slot.new.store(new, Ordering::Relaxed);
    slot.at.store(at as *const Location<'static> as *mut Location<'static>, Ordering::Relaxed);
    slot.seq.store(seq, Ordering::Release);
}

/// What the ring holds about the entries `entries` (named as given; their words written
/// as `describe` says) and the events whose range covers `addr`, oldest first, a line each.
pub(crate) fn lines(entries: &[(&str, usize)], addr: usize, describe: fn(u64) -> String) -> Vec<String> {
    let newest = NEXT.load(Ordering::Acquire);
    let oldest = newest.saturating_sub(RING as u64 - 1).max(1);
    let mut out = Vec::new();
    for seq in oldest..=newest {
        let slot = &SLOTS[(seq as usize) % RING];
        if slot.seq.load(Ordering::Acquire) != seq {
            continue;
        }
        let (what, tid, key, end) = (
            slot.what.load(Ordering::Relaxed),
            slot.tid.load(Ordering::Relaxed),
            slot.key.load(Ordering::Relaxed),
            slot.end.load(Ordering::Relaxed),
        );
        let (old, new) = (slot.old.load(Ordering::Relaxed), slot.new.load(Ordering::Relaxed));
        let at = slot.at.load(Ordering::Relaxed);
        if slot.seq.load(Ordering::Acquire) != seq {
            continue;
        }
        // SAFETY: `at` was stored from a `&'static Location` before `seq` was published, and
        // `seq` was read unchanged after it: the pointer is that location or null.
        let at = unsafe { at.as_ref() }.map_or_else(|| "?".to_string(), |l| format!("{}:{}", l.file(), l.line()));
        let line = match what {
            w if w == What::State as u8 || w == What::Handle as u8 => {
                let Some((name, _)) = entries.iter().find(|(_, e)| *e == key) else { continue };
                if w == What::State as u8 {
                    format!("#{seq} tid {tid} {name}: {} -> {} at {at}", describe(old), describe(new))
                } else {
                    format!("#{seq} tid {tid} {name}: handle {old:#x} -> {new:#x} at {at}")
                }
            }
            w if (key..end).contains(&addr) => {
                let kind = match w {
                    w if w == What::Remove as u8 => "REMOVE",
                    w if w == What::Unmap as u8 => "UNMAP",
                    _ => "REMAP",
                };
                format!("#{seq} tid {tid} {kind} [{key:#x}, {end:#x}) read at {at}")
            }
            _ => continue,
        };
        out.push(line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state change and an event are both found again, by entry and by address, and
    /// other entries' changes are not.
    #[test]
    fn a_record_takes_56_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 56);
    }

    #[test]
    fn the_ring_gives_back_a_pages_changes_and_the_events_covering_it() {
        let (entry, other, addr) = (0x1000usize, 0x2000usize, 0x7f00_0000_1000usize);
        let here = Location::caller();
        record(What::Remove, addr, addr + 4096, 0, 0, here);
        record(What::State, other, 0, 1, 3, here);
        record(What::State, entry, 0, 1, 3, here);
        let lines = lines(&[("page", entry)], addr, |word| format!("<{word}>"));
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("REMOVE"), "{lines:?}");
        assert!(lines[1].contains("page: <1> -> <3>"), "{lines:?}");
        assert!(lines[1].contains("trace.rs"), "the caller's line is named: {lines:?}");
    }
}
