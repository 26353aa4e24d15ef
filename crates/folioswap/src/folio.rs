//! The folio state machine: one 16-byte entry per 4 KiB page of managed memory.
//!
//! A region's memory is a grid of naturally aligned folios of one size (4 KiB << order).
//! The entry of a folio's first page (its *head*) holds the folio's state; the entries of
//! its other pages are unused until the folio is *split*, after which every page is an
//! independent order-0 folio with its own state, as the kernel's split does. A split is
//! never undone.
//!
//! ```text
//!                 first touch              evict (MOVE out to staging)
//!   Untouched ─────────────────▶ Resident ───────────────────────────▶ SwapCache
//!       ▲  ▲                      ▲  ▲  ▲                               │ WRITEBACK set while
//!       │  │        fault: MOVE in │  │  └─────────────── fault (WANTED) │ compressing
//!       │  │   ┌───────────────────┘  │                                  ▼
//!       │  │   │ SwapCache ◀──────────┼────────────── store fails ─── (compressed)
//!       │  │   │                      │ fault: decompress, MOVE in      │ stored
//!       │  │   │                      ├─────────────────────────────── Pool
//!       │  │   │                      └─────────────── fault ───────── ZeroSwapped (all-zero
//!       │  └── REMOVE (DONTNEED) of any state                           folio, no data kept)
//!       └───── (UNMAP of any state goes to Gone instead)
//!
//!   With a swap file (`tier.rs`):
//!   SwapCache ── pool refuses / full / compresses poorly: written to the file ──▶ Swapped
//!   Pool ─────── writeback of the pool's coldest entries (zswpwb) ─────────────▶ Swapped
//!   Swapped ──── fault: read into staging, checksum verified, MOVE/COPY in ────▶ Resident
//!
//!   Readahead (`readahead.rs`):
//!   Pool/Swapped ── neighbour of a swap-in: decompressed/read into a copy ──▶ same kind + CACHED
//!   + CACHED ────── fault (readahead hit): COPY the copy in, free the entry ─▶ Resident
//!   + CACHED ────── copy dropped unused (cache full, DONTNEED, unmap) ──────▶ same kind
//! ```
//!
//! A large folio that finds no contiguous run of slots is written as 4 KiB pieces and
//! split (`swpout_fallback`), so a Swapped entry always covers one aligned run of slots.
//!
//! The word also carries flags:
//! - `LOCKED`/`WAITERS`: a sleeping lock (futex on this word). Whoever changes the state
//!   holds it; it is held across an eviction's MOVE out and a fault's install, never
//!   across compression (that is what `WRITEBACK` is for).
//! - `WRITEBACK`: a SwapCache folio whose staging copy a compressor is reading. A fault
//!   that finds it sets `WANTED` and sleeps until the compressor gives the folio back
//!   (it then discards its work: the folio is hot again).
//! - `PENDING`: a REMOVE/UNMAP/REMAP event covering this folio was read and not yet
//!   applied. It is set without the lock, under the event gate (see `gate.rs`), and
//!   every path that would install or evict the folio applies the event first.
//! - `SPLIT` (head only): the folio is split into order-0 pages.
//! - `HUGE`: the folio's pages are a PMD-mapped THP (2 MiB folios only).
//! - `CACHED` (Pool and Swapped only): readahead brought a decompressed copy into the
//!   swap cache (`readahead.rs`) while the pool entry or swap slot stays: the kernel's
//!   clean swap-cache folio. A fault installs the copy (a readahead hit) and frees the
//!   entry; whoever discards the folio drops the copy first.
//! - a 16-bit generation, bumped on every install, so that the LRU can tell a stale
//!   entry from the folio's current residency.
//!
//! A second word records the eviction clock when the folio was last evicted, so that a
//! refault can tell how far back it left (the kernel's workingset shadow entry).
//!
//! The handle word says where the data is: a staging slot for SwapCache, a pool handle
//! for Pool, a swap slot and checksum for Swapped; it is read and written only under the
//! lock. A Resident folio's data is where it is mapped: its handle word holds the eviction
//! clock when it came in instead (`installed_at`, the eviction cluster's youth test).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Where a folio's data lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum Kind {
    /// Never touched (or discarded): the next touch installs zeros.
    Untouched = 0,
    /// Mapped in the region.
    Resident = 1,
    /// Unmapped, held whole in a staging slot (being compressed, or handed back).
    SwapCache = 2,
    /// Compressed in the pool.
    Pool = 3,
    /// Swapped out while all zero: nothing stored, comes back as zeros.
    ZeroSwapped = 4,
    /// Unmapped by the application: never touched again.
    Gone = 5,
    /// On the swap file: the handle holds the first slot and the data's checksum.
    Swapped = 6,
}

const KIND_MASK: u32 = 0x7;
pub(crate) const LOCKED: u32 = 1 << 4;
pub(crate) const WAITERS: u32 = 1 << 5;
pub(crate) const SPLIT: u32 = 1 << 6;
pub(crate) const PENDING: u32 = 1 << 7;
pub(crate) const WRITEBACK: u32 = 1 << 8;
pub(crate) const WANTED: u32 = 1 << 9;
pub(crate) const HUGE: u32 = 1 << 10;
/// A Pool or Swapped folio with a decompressed copy in the readahead cache (`readahead.rs`).
pub(crate) const CACHED: u32 = 1 << 11;
const GEN_SHIFT: u32 = 16;

/// Flags that others may set while the lock is held by someone else; every locked
/// update preserves them.
const CONCURRENT_FLAGS: u32 = WAITERS | PENDING | WANTED;

/// A snapshot of a state word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct State(pub u32);

/// "Pool|SPLIT|PENDING gen 7": the kind, the flags set, the generation.
impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.kind())?;
        for (flag, name) in [
            (LOCKED, "LOCKED"),
            (WAITERS, "WAITERS"),
            (SPLIT, "SPLIT"),
            (PENDING, "PENDING"),
            (WRITEBACK, "WRITEBACK"),
            (WANTED, "WANTED"),
            (HUGE, "HUGE"),
            (CACHED, "CACHED"),
        ] {
            if self.has(flag) {
                write!(f, "|{name}")?;
            }
        }
        write!(f, " gen {}", self.gen())
    }
}

impl State {
    pub fn kind(self) -> Kind {
        match self.0 & KIND_MASK {
            0 => Kind::Untouched,
            1 => Kind::Resident,
            2 => Kind::SwapCache,
            3 => Kind::Pool,
            4 => Kind::ZeroSwapped,
            6 => Kind::Swapped,
            _ => Kind::Gone,
        }
    }
    pub fn has(self, flag: u32) -> bool {
        self.0 & flag != 0
    }
    pub fn gen(self) -> u16 {
        (self.0 >> GEN_SHIFT) as u16
    }
    pub fn with_kind(self, kind: Kind) -> State {
        State((self.0 & !KIND_MASK) | kind as u32)
    }
    pub fn with(self, flag: u32, on: bool) -> State {
        State(if on { self.0 | flag } else { self.0 & !flag })
    }
    pub fn next_gen(self) -> State {
        let gen = self.gen().wrapping_add(1) as u32;
        State((self.0 & ((1 << GEN_SHIFT) - 1)) | (gen << GEN_SHIFT))
    }
}

/// One page's entry in a folio table. All-zero bytes are a valid Untouched entry, so a
/// table can live in fresh anonymous memory.
#[repr(C)]
pub(crate) struct PageEntry {
    state: AtomicU32,
    evicted_at: AtomicU32,
    handle: AtomicU64,
}

fn futex(word: &AtomicU32, op: i32, val: u32) {
    // SAFETY: `word` is a live, aligned u32 for the duration of the call; FUTEX_WAIT only
    // compares and sleeps, FUTEX_WAKE only wakes; neither writes memory.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), op | libc::FUTEX_PRIVATE_FLAG, val, std::ptr::null::<libc::timespec>());
    }
}

impl PageEntry {
    pub fn load(&self) -> State {
        State(self.state.load(Ordering::Acquire))
    }

    /// Take the lock, sleeping while someone else holds it. Returns the state under lock.
    pub fn lock(&self) -> State {
        loop {
            let cur = self.state.load(Ordering::Relaxed);
            if cur & LOCKED == 0 {
                if self.state.compare_exchange_weak(cur, cur | LOCKED, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                    return State(cur | LOCKED);
                }
                continue;
            }
            if cur & WAITERS == 0 && self.state.compare_exchange_weak(cur, cur | WAITERS, Ordering::Relaxed, Ordering::Relaxed).is_err() {
                continue;
            }
            futex(&self.state, libc::FUTEX_WAIT, cur | WAITERS);
        }
    }

    /// Take the lock only if it is free.
    pub fn try_lock(&self) -> Option<State> {
        let cur = self.state.load(Ordering::Relaxed);
        if cur & LOCKED != 0 {
            return None;
        }
        self.state.compare_exchange(cur, cur | LOCKED, Ordering::Acquire, Ordering::Relaxed).ok().map(|_| State(cur | LOCKED))
    }

    /// Replace the state while holding the lock, keeping the lock and the flags others may
    /// set concurrently. Returns the new state.
    #[cfg_attr(feature = "trace", track_caller)]
    pub fn set_locked(&self, new: State) -> State {
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            debug_assert!(cur & LOCKED != 0, "set_locked without the lock");
            let next = (new.0 & !CONCURRENT_FLAGS) | (cur & CONCURRENT_FLAGS) | LOCKED;
            match self.state.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    self.traced(cur, next);
                    return State(next);
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// Clear `flags` (which may include concurrent ones like PENDING or WANTED) under lock.
    #[cfg_attr(feature = "trace", track_caller)]
    pub fn clear_locked(&self, flags: u32) -> State {
        let old = self.state.fetch_and(!flags, Ordering::AcqRel);
        self.traced(old, old & !flags);
        State(old & !flags)
    }

    /// Set a flag without the lock (PENDING by the event gate, WANTED by a waiting fault).
    #[cfg_attr(feature = "trace", track_caller)]
    pub fn set_flag(&self, flag: u32) -> State {
        let old = self.state.fetch_or(flag, Ordering::AcqRel);
        self.traced(old, old | flag);
        State(old | flag)
    }

    /// Record a change of the state word in the trace ring (`trace.rs`; nothing without
    /// the `trace` feature).
    #[cfg_attr(feature = "trace", track_caller)]
    #[inline(always)]
    fn traced(&self, _old: u32, _new: u32) {
        #[cfg(feature = "trace")]
        crate::trace::record(
            crate::trace::What::State,
            self as *const Self as usize,
            0,
            _old as u64,
            _new as u64,
            std::panic::Location::caller(),
        );
    }

    /// Release the lock and wake everyone sleeping on this word.
    pub fn unlock(&self) {
        let prev = self.state.fetch_and(!(LOCKED | WAITERS), Ordering::Release);
        debug_assert!(prev & LOCKED != 0, "unlock without the lock");
        if prev & WAITERS != 0 {
            futex(&self.state, libc::FUTEX_WAKE, i32::MAX as u32);
        }
    }

    /// Sleep until `flag` is clear (used for WRITEBACK). The caller must not hold the lock.
    pub fn wait_clear(&self, flag: u32) {
        loop {
            let cur = self.state.load(Ordering::Acquire);
            if cur & flag == 0 {
                return;
            }
            if cur & WAITERS == 0 && self.state.compare_exchange_weak(cur, cur | WAITERS, Ordering::Relaxed, Ordering::Relaxed).is_err() {
                continue;
            }
            futex(&self.state, libc::FUTEX_WAIT, cur | WAITERS);
        }
    }

    pub fn handle(&self) -> u64 {
        self.handle.load(Ordering::Acquire)
    }
    /// The eviction clock (in pages) when this folio was last evicted.
    pub fn evicted_at(&self) -> u32 {
        self.evicted_at.load(Ordering::Relaxed)
    }
    pub fn set_evicted_at(&self, clock: u32) {
        self.evicted_at.store(clock, Ordering::Relaxed)
    }
    #[cfg_attr(feature = "trace", track_caller)]
    pub fn set_handle(&self, h: u64) {
        #[cfg(feature = "trace")]
        crate::trace::record(crate::trace::What::Handle, self as *const Self as usize, 0, self.handle(), h, std::panic::Location::caller());
        self.handle.store(h, Ordering::Release)
    }
    /// A Resident folio: the eviction clock (in pages) when it was installed.
    pub fn installed_at(&self) -> u32 {
        self.handle.load(Ordering::Acquire) as u32
    }
    pub fn set_installed_at(&self, clock: u32) {
        self.handle.store(clock as u64, Ordering::Release)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;

    fn entry() -> PageEntry {
        PageEntry { state: AtomicU32::new(0), evicted_at: AtomicU32::new(0), handle: AtomicU64::new(0) }
    }

    #[test]
    fn zero_is_untouched_and_unlocked() {
        let e = entry();
        assert_eq!(e.load().kind(), Kind::Untouched);
        assert!(!e.load().has(LOCKED));
    }

    #[test]
    fn lock_excludes_and_counts() {
        let e = Arc::new(entry());
        let counter = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (e, counter) = (e.clone(), counter.clone());
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let s = e.lock();
                        // A non-atomic read-modify-write made safe only by the lock.
                        let v = e.handle();
                        e.set_handle(v + 1);
                        e.set_locked(s.next_gen());
                        e.unlock();
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(e.handle(), 80_000);
        assert_eq!(e.load().gen(), (80_000u32 % 65536) as u16);
        assert!(!e.load().has(LOCKED | WAITERS));
    }

    #[test]
    fn wait_clear_wakes_on_writeback_end() {
        let e = Arc::new(entry());
        let s = e.lock();
        e.set_locked(s.with_kind(Kind::SwapCache).with(WRITEBACK, true));
        e.unlock();
        let waiter = {
            let e = e.clone();
            std::thread::spawn(move || {
                e.set_flag(WANTED);
                e.wait_clear(WRITEBACK);
                e.load()
            })
        };
        while !e.load().has(WANTED) {
            std::thread::yield_now();
        }
        let s = e.lock();
        assert!(s.has(WANTED));
        e.set_locked(s.with(WRITEBACK, false));
        e.clear_locked(WANTED);
        e.unlock();
        let seen = waiter.join().unwrap();
        assert!(!seen.has(WRITEBACK));
        assert_eq!(seen.kind(), Kind::SwapCache);
    }

    proptest! {
        /// Any sequence of locked transitions keeps the concurrent flags others set, never
        /// leaks the lock bit, and round-trips kind and generation.
        #[test]
        fn transitions_preserve_concurrent_flags(ops in prop::collection::vec((0u32..7, any::<bool>(), any::<bool>(), any::<bool>()), 1..64)) {
            let e = entry();
            let mut model_gen: u16 = 0;
            for (kind, set_pending, split, bump) in ops {
                let s = e.lock();
                if set_pending { e.set_flag(PENDING); }
                let kind = State(kind).kind();
                let mut next = s.with_kind(kind).with(SPLIT, split);
                if bump { next = next.next_gen(); model_gen = model_gen.wrapping_add(1); }
                let after = e.set_locked(next);
                prop_assert_eq!(after.kind(), kind);
                prop_assert_eq!(after.has(SPLIT), split);
                prop_assert!(after.has(LOCKED));
                if set_pending { prop_assert!(after.has(PENDING)); }
                e.unlock();
                let unlocked = e.load();
                prop_assert!(!unlocked.has(LOCKED));
                prop_assert_eq!(unlocked.gen(), model_gen);
                if unlocked.has(PENDING) {
                    let _ = e.lock();
                    e.clear_locked(PENDING);
                    e.unlock();
                }
            }
        }
    }
}
