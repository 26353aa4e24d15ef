//! `ZPool`: the memory allocator behind the compressed pool (folioswap's zsmalloc).
//!
//! zswap hands this module one compressed folio at a time (1 byte up to `MAX_OBJECT`; an
//! incompressible folio arrives raw, so multi-page objects are normal) and gets back a small
//! opaque handle. Objects are stored contiguously because the decompressor wants one slice.
//! The pool also has to say truthfully how much physical memory it holds, since `max_pool` and
//! the memory limit are enforced against that number, not against the compressed byte count.
//!
//! Layout. Objects are grouped into size classes so that a freed slot fits the next object of
//! the same class exactly and no general-purpose fragmentation builds up. Small objects (up to
//! `SUB_MAX` bytes with their header) use 64-byte classes and carry a 4-byte header with their
//! exact length; everything larger uses whole-page classes (1..=513 pages) whose lengths live out
//! of band in a per-chunk atomic array. Keeping page-class lengths out of the slot matters: a raw
//! 4 KiB folio must occupy one page, not two, and a raw 2 MiB folio exactly 512 pages. Memory
//! comes from private anonymous `mmap` chunks of about 2 MiB (one class per chunk, sized to a
//! whole number of slots), with `MADV_NOHUGEPAGE` so that releasing one 4 KiB slot really returns
//! 4 KiB instead of splitting or pinning a huge page, `MADV_DONTFORK` so that a fork of the host
//! process does not copy the pool, and `MAP_NORESERVE` because a chunk's untouched tail is never
//! meant to be backed.
//!
//! Accounting. The footprint is the number of bytes of pages the pool has touched and not given
//! back: slots handed out since their chunk was last released (for sub-page classes, the pages
//! those slots cover), live or free. Pages nobody touched cost nothing and are not counted. A sub-page chunk
//! reuses its lowest free slot first, so that its live objects gather at its start; when
//! its topmost slot is freed its bump comes down past the free slots below, and once the
//! whole pages above the last live slot add up to `SUB_RELEASE_STEP` they are given back
//! with `MADV_DONTNEED`. Below the top, each page counts the live slots that overlap it;
//! once the touched pages with none reach half of the chunk's touched pages (and
//! `SUB_RELEASE_STEP`), they are given back too, and a slot handed out on such a page
//! counts it again (long-lived objects high in a chunk otherwise pinned every page below
//! them). (Before, a sub-page chunk kept every page it had touched until all
//! its slots were free: under random churn, a pool charged to a 34M limit held 16.6M of
//! pages for 7M of live objects, and the limit was paid for it in resident memory.)
//! Compaction (`relocate`, `trim`; driven by `compact.rs`) moves a sub-page chunk's
//! objects that lie above its count of live objects into its lowest free slots, under
//! their owners' locks, and gives back every page left empty, however few.
//! Freed slots stay populated so that the next store of that class costs no page fault, but that
//! slack is bounded: once populated free page-class memory would exceed
//! `max(8 MiB, stored/16)`, a freed page-class slot is returned to the kernel with
//! `MADV_DONTNEED` at once. A sub-page chunk whose slots are all free is released as a whole. Growth is reserved with a
//! compare-and-swap against the cap before any page is touched, so the footprint never exceeds
//! the cap; when it would, the store first releases populated slack (which is free to release)
//! and fails with `Full` only if that is not enough. Reusing a populated free slot never grows
//! the footprint and is always allowed.
//!
//! Concurrency. Each class has its own mutex; nothing else is locked on the store/free path
//! (counters are atomics), and no code path ever holds two class locks, so there is no lock
//! order to get wrong. The copy into a slot happens after the lock is dropped, because the slot
//! is already exclusively ours. `get` takes no lock at all: handles are (class, chunk, slot)
//! indices, and chunk base addresses are published in an append-only two-level table of atomic
//! pointers whose entries are only freed when the pool is dropped. Handles are validated by
//! `free` (a forged or double-freed handle panics instead of corrupting the free lists), which is
//! why the slot header and the length array are atomics: a bogus `free` racing with a store
//! reads them without a data race. An empty chunk is kept as one spare per class (so a class
//! oscillating around a chunk boundary does not mmap/munmap each time); further empty chunks are
//! unmapped and their index reused.
//!
//! The design assumes 4 KiB pages (checked in `ZPool::new`): release granularity and class
//! rounding are both built on it.

use std::fmt;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

const PAGE: usize = 4096;
/// Chunk size target: large enough to amortise mmap calls, small enough not to matter per class.
const CHUNK_BYTES: usize = 2 << 20;
const SUB_STEP: usize = 64;
/// Largest sub-page class. 4096 itself is the first page class, which needs no header.
const SUB_MAX: usize = 4096 - SUB_STEP;
const NR_SUB: usize = SUB_MAX / SUB_STEP;
const MAX_PAGES: usize = ZPool::MAX_OBJECT.div_ceil(PAGE);
const NR_CLASSES: usize = NR_SUB + MAX_PAGES;

/// Sub-page slot header: a tag in the high half (catches double frees and forged handles),
/// the exact length in the low half.
const HDR: usize = 4;
const HDR_TAG_MASK: u32 = 0xFFFF_0000;
const HDR_LIVE: u32 = 0x5A17_0000;
const HDR_FREE: u32 = 0xF4EE_0000;

const SLOT_BITS: u32 = 15;
const CHUNK_BITS: u32 = 18;
const CLASS_BITS: u32 = 10;
const SEG_BITS: u32 = 9;
const SEG_LEN: usize = 1 << SEG_BITS;
const DIR_LEN: usize = 1 << (CHUNK_BITS - SEG_BITS);
const MAX_CHUNKS: usize = 1 << CHUNK_BITS;

const SLACK_FLOOR: u64 = 8 << 20;
/// A sub-page chunk gives back the pages above its topmost live slot once they add up to
/// this much (one MADV_DONTNEED, and so one TLB shootdown, per this many bytes at most).
const SUB_RELEASE_STEP: u64 = 64 << 10;
const SLACK_DIVISOR: u64 = 16;
/// `begin_compaction`: free bytes on held pages worth a pass, as a share of the footprint
/// and at least (a small pool is not compacted for a few pages).
const COMPACT_DUE_FRACTION: u64 = 8;
const COMPACT_DUE_MIN: u64 = 256 << 10;
/// Bounded retries when other threads keep taking the footprint we just freed up.
const STORE_ATTEMPTS: u32 = 8;

const _: () = assert!(NR_CLASSES < 1 << CLASS_BITS);
const _: () = assert!(CHUNK_BYTES / SUB_STEP <= 1 << SLOT_BITS);
const _: () = assert!(CHUNK_BYTES / SUB_STEP <= u16::MAX as usize + 1);
const _: () = assert!(CLASS_BITS + CHUNK_BITS + SLOT_BITS <= PoolHandle::BITS);
const _: () = assert!(SUB_MAX <= 0xFFFF);

/// Opaque, Copy, never 0, fits in 48 bits (callers pack it into a u64 with other bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PoolHandle(u64);

impl PoolHandle {
    /// Number of low bits a raw handle may occupy.
    pub const BITS: u32 = 48;

    /// The handle as an integer in `1..2^48`.
    pub fn to_raw(self) -> u64 {
        self.0
    }

    /// Inverse of `to_raw`. Only values that came from `to_raw` name an object; 0 and values
    /// wider than 48 bits are debug-asserted, and `free` validates whatever it is given.
    pub fn from_raw(raw: u64) -> Self {
        debug_assert!(raw != 0 && raw >> Self::BITS == 0, "not a pool handle: {raw:#x}");
        Self(raw)
    }

    fn new(class: usize, chunk: usize, slot: usize) -> Self {
        // class + 1 keeps the handle non-zero.
        Self(((class as u64 + 1) << (CHUNK_BITS + SLOT_BITS)) | ((chunk as u64) << SLOT_BITS) | slot as u64)
    }

    /// (class, chunk, slot); a zero or out-of-range class comes back >= NR_CLASSES.
    fn decode(self) -> (usize, usize, usize) {
        let class = ((self.0 >> (CHUNK_BITS + SLOT_BITS)) as usize).wrapping_sub(1);
        let chunk = ((self.0 >> SLOT_BITS) as usize) & (MAX_CHUNKS - 1);
        let slot = (self.0 as usize) & ((1 << SLOT_BITS) - 1);
        (class, chunk, slot)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolError {
    /// Storing would take the pool's footprint over its cap (after releasing what slack it could).
    Full { needed: u64, footprint: u64, cap: u64 },
    /// The object is larger than the largest size the pool stores.
    TooLarge { len: usize, max: usize },
    /// mmap of a new chunk failed (errno).
    OutOfMemory { errno: i32 },
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::Full { needed, footprint, cap } => {
                write!(f, "compressed pool full: need {needed} more bytes, footprint {footprint}, cap {cap}")
            }
            PoolError::TooLarge { len, max } => {
                write!(f, "object of {len} bytes exceeds the pool maximum of {max}")
            }
            PoolError::OutOfMemory { errno } => {
                write!(f, "mmap of a pool chunk failed: {}", std::io::Error::from_raw_os_error(*errno))
            }
        }
    }
}

impl std::error::Error for PoolError {}

/// What lock-free readers need to know about a chunk. Allocated once per (class, chunk index)
/// and freed only when the pool is dropped, so a `&ChunkInfo` never dangles while `&ZPool` lives.
struct ChunkInfo {
    /// Null while the chunk index is vacant (unmapped).
    base: AtomicPtr<u8>,
    /// Page classes only: exact object length per slot, 0 when the slot holds no live object.
    lens: Box<[AtomicU32]>,
}

type Seg = [AtomicPtr<ChunkInfo>; SEG_LEN];

/// Mutable per-chunk bookkeeping, guarded by the class mutex.
struct ChunkState {
    /// Null while vacant.
    base: *mut u8,
    info: NonNull<ChunkInfo>,
    /// Slots `[0, bump)` have been handed out since the chunk was (re)populated; the rest
    /// were never touched (page classes), or are free (sub-page classes, whose bump comes
    /// down as its topmost slots are freed).
    bump: u32,
    /// Sub-page classes: the pages of slots `[0, populated)` are touched and counted in the
    /// footprint; `bump <= populated`, and the pages between are given back once they
    /// reach `SUB_RELEASE_STEP`.
    populated: u32,
    /// Sub-page classes: one bit per free slot below `bump` (the lowest is reused first),
    /// their count, and the first word that may hold one.
    free_bits: Vec<u64>,
    free_count: u32,
    free_hint: u32,
    /// Sub-page classes: how many live (or handed-out) slots overlap each page, how many
    /// pages have any, and which pages below `populated`'s were given back while empty.
    page_live: Vec<u16>,
    live_pages: u32,
    released_pages: Vec<u64>,
    released_count: u32,
    /// Live objects.
    used: u32,
    /// Page classes: freed slots whose memory is still resident (reused first).
    free: Vec<u16>,
    /// Page classes: freed slots already given back with MADV_DONTNEED.
    released: Vec<u16>,
    /// Which of the class's lazy stacks currently hold this chunk's index (`IN_*` bits).
    stacks: u8,
}

// SAFETY: the raw pointers in ChunkState refer to the pool's own mmap'd chunk and to a
// heap-allocated ChunkInfo made of atomics; neither is tied to a thread, and ChunkState is only
// reached through the class mutex.
unsafe impl Send for ChunkState {}

/// The free slots of a sub-page chunk, as a bitmap under the class lock.
impl ChunkState {
    fn set_free(&mut self, slot: usize) {
        let w = slot / 64;
        if self.free_bits.len() <= w {
            self.free_bits.resize(w + 1, 0);
        }
        self.free_bits[w] |= 1 << (slot % 64);
        self.free_count += 1;
        self.free_hint = self.free_hint.min(w as u32);
    }

    fn is_free(&self, slot: usize) -> bool {
        self.free_bits.get(slot / 64).is_some_and(|w| w >> (slot % 64) & 1 != 0)
    }

    fn clear_free(&mut self, slot: usize) {
        self.free_bits[slot / 64] &= !(1 << (slot % 64));
        self.free_count -= 1;
    }

    fn lowest_free(&self) -> Option<usize> {
        let (w, bits) = self.free_bits.iter().enumerate().skip(self.free_hint as usize).find(|(_, &bits)| bits != 0)?;
        Some(w * 64 + bits.trailing_zeros() as usize)
    }

    /// Take the lowest free slot, so that live objects gather at the chunk's start and its
    /// top can be given back.
    fn take_lowest_free(&mut self) -> Option<usize> {
        let slot = self.lowest_free()?;
        self.free_hint = (slot / 64) as u32;
        self.clear_free(slot);
        Some(slot)
    }

    fn page_released(&self, page: usize) -> bool {
        self.released_pages.get(page / 64).is_some_and(|w| w >> (page % 64) & 1 != 0)
    }

    fn set_page_released(&mut self, page: usize, released: bool) {
        let w = page / 64;
        if self.released_pages.len() <= w {
            self.released_pages.resize(w + 1, 0);
        }
        let was = self.released_pages[w] >> (page % 64) & 1 != 0;
        if released && !was {
            self.released_pages[w] |= 1 << (page % 64);
            self.released_count += 1;
        } else if !released && was {
            self.released_pages[w] &= !(1 << (page % 64));
            self.released_count -= 1;
        }
    }

    /// A sub-page slot `[at, at + size)` is handed out (`+1`) or freed (`-1`).
    fn count_pages(&mut self, at: usize, size: usize, handed_out: bool) {
        let (first, last) = (at / PAGE, (at + size - 1) / PAGE);
        if self.page_live.len() <= last {
            self.page_live.resize(last + 1, 0);
        }
        for p in first..=last {
            if handed_out {
                self.page_live[p] += 1;
                self.live_pages += u32::from(self.page_live[p] == 1);
                self.set_page_released(p, false);
            } else {
                self.page_live[p] -= 1;
                self.live_pages -= u32::from(self.page_live[p] == 0);
            }
        }
    }

    /// Bring `bump` down past the free slots at the top (a sub-page chunk's last slot was
    /// just freed); `used > 0`, so it stops above zero.
    fn trim_top(&mut self) {
        while self.bump > 0 && self.is_free(self.bump as usize - 1) {
            self.clear_free(self.bump as usize - 1);
            self.bump -= 1;
        }
    }
}

const IN_FREE: u8 = 1;
const IN_REL: u8 = 2;
const IN_ROOM: u8 = 4;

/// Per-class state. The three stacks are lazy: an index is pushed when a chunk gains something
/// (a free slot, a released slot, bump room) unless its flag says it is already there, and
/// entries that no longer qualify are discarded when they reach the top. That keeps every
/// operation amortised O(1) without scanning chunks.
#[derive(Default)]
struct ClassState {
    chunks: Vec<ChunkState>,
    free_stack: Vec<u32>,
    rel_stack: Vec<u32>,
    room_stack: Vec<u32>,
    /// One empty, mapped, fully released chunk kept for reuse.
    spare: Option<u32>,
    /// Chunk indices whose mapping was given back; reused before growing `chunks`.
    vacant: Vec<u32>,
}

fn top_valid(stack: &mut Vec<u32>, chunks: &mut [ChunkState], flag: u8, valid: impl Fn(&ChunkState) -> bool) -> Option<usize> {
    while let Some(&i) = stack.last() {
        let ch = &mut chunks[i as usize];
        if valid(ch) {
            return Some(i as usize);
        }
        stack.pop();
        ch.stacks &= !flag;
    }
    None
}

fn push_once(stack: &mut Vec<u32>, ch: &mut ChunkState, i: usize, flag: u8) {
    if ch.stacks & flag == 0 {
        ch.stacks |= flag;
        stack.push(i as u32);
    }
}

struct Class {
    /// Slot size in bytes.
    size: usize,
    page_sized: bool,
    slots: usize,
    map_len: usize,
    /// Lock-free chunk table: `dir[chunk >> SEG_BITS][chunk & (SEG_LEN - 1)]`.
    dir: Box<[AtomicPtr<Seg>]>,
    state: Mutex<ClassState>,
}

impl Class {
    fn new(idx: usize) -> Self {
        let (size, page_sized) = if idx < NR_SUB { (SUB_STEP * (idx + 1), false) } else { ((idx - NR_SUB + 1) * PAGE, true) };
        let slots = (CHUNK_BYTES / size).max(1);
        Class {
            size,
            page_sized,
            slots,
            map_len: (slots * size).next_multiple_of(PAGE),
            dir: (0..DIR_LEN).map(|_| AtomicPtr::new(ptr::null_mut())).collect(),
            state: Mutex::new(ClassState::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ClassState> {
        // Poisoning is ignored: the only panics under the lock are handle-validation failures,
        // raised before any state is modified.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Footprint of slots `[0, n)` of a freshly populated chunk.
    fn covered(&self, n: usize) -> u64 {
        (n * self.size).next_multiple_of(PAGE) as u64
    }

    /// Sub-page classes: what handing out `slot` of `ch` adds to the footprint: its pages
    /// that were never touched or were given back while empty.
    fn slot_growth(&self, ch: &ChunkState, slot: usize) -> u64 {
        let touched = self.covered(ch.populated as usize) as usize / PAGE;
        let (first, last) = (slot * self.size / PAGE, (slot * self.size + self.size - 1) / PAGE);
        (first..=last).filter(|&p| p >= touched || ch.page_released(p)).count() as u64 * PAGE as u64
    }

    fn info(&self, chunk: usize) -> Option<&ChunkInfo> {
        let seg = self.dir.get(chunk >> SEG_BITS)?.load(Ordering::Acquire);
        if seg.is_null() {
            return None;
        }
        // SAFETY: segments are fully initialised before being published (Release/Acquire) and
        // are freed only in Class::drop, which cannot run while `&self` is borrowed.
        let info = unsafe { &*seg }[chunk & (SEG_LEN - 1)].load(Ordering::Acquire);
        // SAFETY: same publication and lifetime argument for ChunkInfo.
        (!info.is_null()).then(|| unsafe { &*info })
    }

    /// Called with the class lock held, which serialises segment creation.
    fn publish(&self, chunk: usize, info: *mut ChunkInfo) {
        let entry = &self.dir[chunk >> SEG_BITS];
        let mut seg = entry.load(Ordering::Acquire);
        if seg.is_null() {
            let fresh: Box<Seg> = Box::new(std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())));
            seg = Box::into_raw(fresh);
            entry.store(seg, Ordering::Release);
        }
        // SAFETY: `seg` is a live segment owned by this class (just created or published earlier).
        let seg = unsafe { &*seg };
        seg[chunk & (SEG_LEN - 1)].store(info, Ordering::Release);
    }
}

impl Drop for Class {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for ch in &st.chunks {
            if !ch.base.is_null() {
                // SAFETY: `base` is a mapping of `map_len` bytes created by map_chunk; the pool
                // is being dropped, so no handle can be used any more.
                unsafe { unmap(ch.base, self.map_len) };
            }
            // SAFETY: each ChunkInfo was created by Box::into_raw in ZPool::new_chunk and is
            // referenced by exactly one ChunkState; nothing reads it after this point.
            drop(unsafe { Box::from_raw(ch.info.as_ptr()) });
        }
        for entry in self.dir.iter() {
            let seg = entry.load(Ordering::Relaxed);
            if !seg.is_null() {
                // SAFETY: created by Box::into_raw in publish, freed once here.
                drop(unsafe { Box::from_raw(seg) });
            }
        }
    }
}

fn class_index(len: usize) -> usize {
    if len + HDR <= SUB_MAX {
        (len + HDR).div_ceil(SUB_STEP) - 1
    } else {
        NR_SUB + len.div_ceil(PAGE) - 1
    }
}

fn map_chunk(len: usize) -> Result<*mut u8, PoolError> {
    // SAFETY: a fresh anonymous private mapping with no address hint cannot alias anything.
    let p = unsafe {
        crate::sys::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::ENOMEM);
        return Err(PoolError::OutOfMemory { errno });
    }
    // Advice failures are ignored on purpose: without THP support NOHUGEPAGE is moot, and
    // DONTFORK only matters if the process forks.
    // SAFETY: advice on the mapping just created; it changes no contents.
    unsafe { crate::sys::madvise(p, len, libc::MADV_NOHUGEPAGE) };
    // SAFETY: as above.
    unsafe { crate::sys::madvise(p, len, libc::MADV_DONTFORK) };
    Ok(p.cast())
}

/// # Safety
/// `[addr, addr + len)` is page-aligned, inside a pool mapping, and holds no live object.
unsafe fn dontneed(addr: *mut u8, len: usize) {
    // SAFETY: per the function contract, zeroing these pages loses no data anyone can see.
    let rc = unsafe { crate::sys::madvise(addr.cast(), len, libc::MADV_DONTNEED) };
    debug_assert_eq!(rc, 0, "MADV_DONTNEED failed: {}", std::io::Error::last_os_error());
}

/// # Safety
/// `base` is a pool mapping of `len` bytes that nothing will access again.
unsafe fn unmap(base: *mut u8, len: usize) {
    // SAFETY: per the function contract.
    let rc = unsafe { crate::sys::munmap(base.cast(), len) };
    debug_assert_eq!(rc, 0, "munmap failed: {}", std::io::Error::last_os_error());
}

/// # Safety
/// `slot` is the 64-byte-aligned start of a sub-page slot inside a live mapping.
unsafe fn header<'a>(slot: *mut u8) -> &'a AtomicU32 {
    // SAFETY: aligned (slot offsets are multiples of 64 from a page-aligned base), in bounds, and
    // only ever accessed atomically by this module.
    unsafe { AtomicU32::from_ptr(slot.cast()) }
}

enum Pick {
    Free(usize),
    Released(usize),
    Room(usize),
    Spare(usize),
    New,
}

enum Taken {
    Slot { chunk: usize, slot: usize, base: *mut u8, info: NonNull<ChunkInfo> },
    Over { growth: u64 },
}

/// The compressed pool's allocator. See the module documentation.
pub struct ZPool {
    classes: Box<[OnceLock<Class>]>,
    cap: AtomicU64,
    footprint: AtomicU64,
    stored: AtomicU64,
    live: AtomicU64,
    /// Populated free bytes in page classes (the releasable slack).
    slack: AtomicU64,
    /// Bytes of the slots live objects occupy (the objects, their headers and the rest of
    /// their class's slot).
    slot_bytes: AtomicU64,
    /// `fragmented_bytes` as the last `trim` left them, or lower where frees and stores
    /// brought them lower since: the baseline of `begin_compaction`.
    compacted_to: AtomicU64,
    /// A compaction pass is running (`begin_compaction`): one at a time.
    compacting: AtomicBool,
}

/// A running compaction pass; dropping it lets the next one start.
pub struct CompactionPass<'a> {
    pool: &'a ZPool,
}

impl Drop for CompactionPass<'_> {
    fn drop(&mut self) {
        self.pool.compacting.store(false, Ordering::Release);
    }
}

impl fmt::Debug for ZPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZPool")
            .field("cap", &self.cap())
            .field("footprint", &self.footprint_bytes())
            .field("stored", &self.stored_bytes())
            .field("live", &self.live_objects())
            .field("slack", &self.slack_bytes())
            .finish()
    }
}

impl ZPool {
    /// Largest object the pool stores: a raw 2 MiB folio plus 64 bytes of headroom.
    pub const MAX_OBJECT: usize = (2 << 20) + 64;

    /// An empty pool whose footprint may not exceed `cap_bytes`. Maps nothing yet.
    ///
    /// # Panics
    /// If the system page size is not 4 KiB.
    pub fn new(cap_bytes: u64) -> Self {
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        assert_eq!(page, PAGE as libc::c_long, "ZPool requires 4 KiB pages");
        ZPool {
            classes: (0..NR_CLASSES).map(|_| OnceLock::new()).collect(),
            cap: AtomicU64::new(cap_bytes),
            footprint: AtomicU64::new(0),
            stored: AtomicU64::new(0),
            live: AtomicU64::new(0),
            slack: AtomicU64::new(0),
            slot_bytes: AtomicU64::new(0),
            compacted_to: AtomicU64::new(0),
            compacting: AtomicBool::new(false),
        }
    }

    /// Change the cap. Lowering it below the footprint releases slack to fit if it can; live
    /// objects are never evicted here, so the footprint may stay above a lowered cap until frees.
    #[cfg(test)]
    pub fn set_cap(&self, cap_bytes: u64) {
        self.cap.store(cap_bytes, Ordering::Relaxed);
        let over = self.footprint_bytes().saturating_sub(cap_bytes);
        if over > 0 {
            self.shrink_slack(self.slack_bytes().saturating_sub(over));
        }
    }

    /// The current cap on the footprint.
    pub fn cap(&self) -> u64 {
        self.cap.load(Ordering::Relaxed)
    }

    /// Copy `data` into a new object. Fails with Full rather than exceed the cap.
    ///
    /// # Errors
    /// `TooLarge` beyond `MAX_OBJECT`; `Full` when the footprint would exceed the cap even after
    /// releasing slack; `OutOfMemory` when a new chunk cannot be mapped. Nothing stored is
    /// touched by a failed store.
    pub fn store(&self, data: &[u8]) -> Result<PoolHandle, PoolError> {
        let len = data.len();
        if len > Self::MAX_OBJECT {
            return Err(PoolError::TooLarge { len, max: Self::MAX_OBJECT });
        }
        let ci = class_index(len);
        let class = self.classes[ci].get_or_init(|| Class::new(ci));
        let mut attempts = 0;
        let (chunk, slot, base, info) = loop {
            match self.take_slot(class)? {
                Taken::Slot { chunk, slot, base, info } => break (chunk, slot, base, info),
                Taken::Over { growth } => {
                    attempts += 1;
                    let cap = self.cap();
                    let footprint = self.footprint_bytes();
                    let excess = (footprint + growth).saturating_sub(cap);
                    let slack = self.slack_bytes();
                    if attempts >= STORE_ATTEMPTS || excess > slack {
                        return Err(PoolError::Full { needed: growth, footprint, cap });
                    }
                    if excess > 0 {
                        self.shrink_slack(slack - excess);
                    }
                }
            }
        };
        let dst = base.wrapping_add(slot * class.size);
        if class.page_sized {
            // SAFETY: take_slot gave this slot to us alone (counted in `used`, so its chunk stays
            // mapped); it is `class.size >= len` bytes inside the mapping, and `data` cannot
            // overlap it because it is not part of any live object.
            unsafe { ptr::copy_nonoverlapping(data.as_ptr(), dst, len) };
            // SAFETY: ChunkInfo outlives the pool's borrow (freed only on drop).
            let info = unsafe { info.as_ref() };
            // Publishing the length last makes the slot live; a racing bogus free() sees 0.
            info.lens[slot].store(len as u32, Ordering::Release);
        } else {
            // SAFETY: as above; the slot has room for the header plus `len` bytes because the
            // class was chosen from `len + HDR`.
            unsafe { ptr::copy_nonoverlapping(data.as_ptr(), dst.wrapping_add(HDR), len) };
            // SAFETY: `dst` is the 64-byte-aligned start of our slot in a mapped chunk.
            let hdr = unsafe { header(dst) };
            // Publishing the header last makes the slot live; a racing bogus free() sees FREE/0.
            hdr.store(HDR_LIVE | len as u32, Ordering::Release);
        }
        self.stored.fetch_add(len as u64, Ordering::Relaxed);
        self.slot_bytes.fetch_add(class.size as u64, Ordering::Relaxed);
        self.live.fetch_add(1, Ordering::Relaxed);
        Ok(PoolHandle::new(ci, chunk, slot))
    }

    /// The stored bytes, exactly as stored (same length).
    ///
    /// # Safety
    /// `h` is live (stored and not yet freed) and is not freed while the slice is used.
    pub unsafe fn get(&self, h: PoolHandle) -> &[u8] {
        let (ci, chunk, slot) = h.decode();
        let class = self.classes.get(ci).and_then(OnceLock::get).expect("invalid pool handle");
        let info = class.info(chunk).expect("invalid pool handle");
        let base = info.base.load(Ordering::Acquire);
        debug_assert!(!base.is_null() && slot < class.slots, "stale pool handle");
        let p = base.wrapping_add(slot * class.size);
        if class.page_sized {
            let len = info.lens[slot].load(Ordering::Acquire) as usize;
            debug_assert!(len != 0, "pool handle not live");
            // SAFETY: the caller guarantees the object is live and stays so while the slice is
            // used; a live slot keeps its chunk mapped and holds `len` initialised bytes.
            unsafe { std::slice::from_raw_parts(p, len) }
        } else {
            // SAFETY: same contract; the header sits at the live slot's start.
            let hdr = unsafe { header(p) }.load(Ordering::Acquire);
            debug_assert_eq!(hdr & HDR_TAG_MASK, HDR_LIVE, "pool handle not live");
            // SAFETY: same contract; `len` bytes follow the header inside the slot.
            unsafe { std::slice::from_raw_parts(p.wrapping_add(HDR), (hdr & !HDR_TAG_MASK) as usize) }
        }
    }

    /// Free an object.
    ///
    /// # Panics
    /// On a handle that is not live: freed twice, never issued, or forged. The check is cheap
    /// (one atomic the free path touches anyway) and keeps a caller bug from handing one slot to
    /// two objects later.
    pub fn free(&self, h: PoolHandle) {
        let (ci, chunk, slot) = h.decode();
        let class = self.classes.get(ci).and_then(OnceLock::get).expect("invalid pool handle");
        let mut guard = class.lock();
        let st = &mut *guard;
        let ch = st.chunks.get_mut(chunk).expect("invalid pool handle");
        assert!(!ch.base.is_null() && slot < ch.bump as usize, "pool handle freed twice or never stored");
        let p = ch.base.wrapping_add(slot * class.size);
        let len = if class.page_sized {
            // SAFETY: ChunkInfo lives as long as the pool.
            let info = unsafe { ch.info.as_ref() };
            let len = info.lens[slot].swap(0, Ordering::AcqRel);
            assert!(len != 0, "pool handle freed twice or never stored");
            len
        } else {
            // SAFETY: slot < bump, so the slot lies in the populated part of a mapped chunk.
            let hdr = unsafe { header(p) };
            let v = hdr.load(Ordering::Acquire);
            assert_eq!(v & HDR_TAG_MASK, HDR_LIVE, "pool handle freed twice or never stored");
            hdr.store(HDR_FREE, Ordering::Relaxed);
            v & !HDR_TAG_MASK
        };
        ch.used -= 1;
        let stored = self.stored.fetch_sub(len as u64, Ordering::Relaxed) - len as u64;
        self.slot_bytes.fetch_sub(class.size as u64, Ordering::Relaxed);
        self.live.fetch_sub(1, Ordering::Relaxed);
        let size = class.size as u64;

        if !class.page_sized {
            if ch.used == 0 {
                // Every slot is free: give back the whole populated prefix.
                let resident = class.covered(ch.populated as usize);
                self.footprint.fetch_sub(resident - ch.released_count as u64 * PAGE as u64, Ordering::Relaxed);
                self.retire(class, st, chunk, resident as usize);
                return;
            }
            self.free_sub_slot(class, st, chunk, slot);
            return;
        }

        let limit = SLACK_FLOOR.max(stored / SLACK_DIVISOR);
        if self.slack.load(Ordering::Relaxed) + size > limit {
            // SAFETY: the slot was just freed and is page-aligned and page-sized.
            unsafe { dontneed(p, class.size) };
            self.footprint.fetch_sub(size, Ordering::Relaxed);
            ch.released.push(slot as u16);
            push_once(&mut st.rel_stack, ch, chunk, IN_REL);
        } else {
            self.slack.fetch_add(size, Ordering::Relaxed);
            ch.free.push(slot as u16);
            push_once(&mut st.free_stack, ch, chunk, IN_FREE);
        }
        if ch.used == 0 && ch.free.is_empty() {
            self.retire(class, st, chunk, 0);
        }
    }

    /// Move a sub-page object that lies above its chunk's compact prefix (its slot at or
    /// above the chunk's count of live objects) into the chunk's lowest free slot, which then
    /// lies below it: zsmalloc's compaction, which moves objects out of sparse pages into
    /// others of their class. Once every such object of a chunk has moved, its live objects
    /// fill its first slots and `trim` gives back the pages above them. Returns the
    /// object's new handle and the bytes the move gave back (net of a page it took
    /// again); `None` where it stays: a page-class object (those are released
    /// page by page as they are freed), one already in the prefix, or one whose move would
    /// take the footprint past the cap (the free slot lies on a page given back).
    ///
    /// # Safety
    /// `h` is live, and nobody reads or frees it during the call (the caller holds its
    /// owner's lock). On `Some`, `h` is dead and the object lives on under the new handle.
    pub unsafe fn relocate(&self, h: PoolHandle) -> Option<(PoolHandle, u64)> {
        let (ci, chunk, slot) = h.decode();
        let class = self.classes.get(ci).and_then(OnceLock::get).expect("invalid pool handle");
        if class.page_sized {
            return None;
        }
        let mut guard = class.lock();
        let st = &mut *guard;
        let ch = st.chunks.get_mut(chunk).expect("invalid pool handle");
        assert!(!ch.base.is_null() && slot < ch.bump as usize, "pool handle not live");
        if (slot as u32) < ch.used {
            return None;
        }
        // Slots below `slot` hold at most `used - 1` live objects, so one of them is free.
        let to = ch.lowest_free().filter(|&to| to < slot)?;
        let growth = class.slot_growth(ch, to);
        if !self.reserve(growth) {
            return None;
        }
        let taken = ch.take_lowest_free();
        debug_assert_eq!(taken, Some(to));
        ch.count_pages(to * class.size, class.size, true);
        let (src, dst) = (ch.base.wrapping_add(slot * class.size), ch.base.wrapping_add(to * class.size));
        // SAFETY: `slot` is live (the caller's contract) and below `bump`, inside the mapping.
        let from = unsafe { header(src) };
        let v = from.load(Ordering::Acquire);
        assert_eq!(v & HDR_TAG_MASK, HDR_LIVE, "pool handle not live");
        let len = (v & !HDR_TAG_MASK) as usize;
        // SAFETY: two distinct slots of one class in one mapping do not overlap; `to` was
        // free and is now ours under the class lock, and both slots hold the header plus
        // `len` bytes, since the object was stored in this class.
        unsafe { ptr::copy_nonoverlapping(src.wrapping_add(HDR), dst.wrapping_add(HDR), len) };
        // SAFETY: `dst` is the 64-byte-aligned start of a slot in the mapped chunk.
        unsafe { header(dst) }.store(HDR_LIVE | len as u32, Ordering::Release);
        from.store(HDR_FREE, Ordering::Relaxed);
        let released = self.free_sub_slot(class, st, chunk, slot);
        Some((PoolHandle::new(ci, chunk, to), released.saturating_sub(growth)))
    }

    /// Give back every whole page of the sub-page chunks that holds no live object, above
    /// each chunk's topmost live slot and below it, however few (a free normally gives them
    /// back only in batches: `free_sub_slot`). Returns the bytes given back.
    pub fn trim(&self) -> u64 {
        let mut released = 0;
        for class in self.classes[..NR_SUB].iter().filter_map(OnceLock::get) {
            let mut guard = class.lock();
            for ch in guard.chunks.iter_mut().filter(|ch| !ch.base.is_null() && ch.used > 0) {
                released += self.release_above_top(class, ch, PAGE as u64);
                released += self.release_empty_pages(class, ch, true);
            }
        }
        self.compacted_to.store(self.fragmented_bytes(), Ordering::Relaxed);
        released
    }

    /// Start a compaction pass whether or not one is due, unless one is running. The pass
    /// ends when the guard drops.
    pub fn start_compaction(&self) -> Option<CompactionPass<'_>> {
        (!self.compacting.swap(true, Ordering::Acquire)).then_some(CompactionPass { pool: self })
    }

    /// Start a compaction pass (`compact.rs`) if none is running and the free bytes on held
    /// pages have grown by an eighth of the footprint (at least 256 KiB) since the last
    /// `trim` left them (or since they were last lower).
    pub fn begin_compaction(&self) -> Option<CompactionPass<'_>> {
        let fragmented = self.fragmented_bytes();
        let base = self.compacted_to.fetch_min(fragmented, Ordering::Relaxed).min(fragmented);
        if fragmented < base + COMPACT_DUE_MIN.max(self.footprint_bytes() / COMPACT_DUE_FRACTION) {
            return None;
        }
        self.start_compaction()
    }

    /// Bytes of the footprint in no live object's slot and not releasable slack: the free
    /// sub-page slots on pages the pool still holds, which compaction can gather and give
    /// back (the padding of a live object's slot is not among them).
    pub fn fragmented_bytes(&self) -> u64 {
        self.footprint_bytes().saturating_sub(self.slack_bytes() + self.slot_bytes.load(Ordering::Relaxed))
    }

    /// Physical bytes the pool holds now: every page it has touched and not released.
    pub fn footprint_bytes(&self) -> u64 {
        self.footprint.load(Ordering::Relaxed)
    }

    /// Sum of the lengths of live objects (what zswap calls compressed size).
    pub fn stored_bytes(&self) -> u64 {
        self.stored.load(Ordering::Relaxed)
    }

    /// Number of live objects.
    pub fn live_objects(&self) -> u64 {
        self.live.load(Ordering::Relaxed)
    }

    /// Populated free memory that `shrink_slack` could release now (page classes only; free
    /// sub-page slots share pages with live objects and are released with their whole chunk).
    pub fn slack_bytes(&self) -> u64 {
        self.slack.load(Ordering::Relaxed)
    }

    /// Release populated free memory back to the OS (MADV_DONTNEED) down to `keep` bytes of slack.
    /// Largest classes go first: fewest syscalls per byte released.
    pub fn shrink_slack(&self, keep: u64) {
        for class in self.classes[NR_SUB..].iter().rev().filter_map(OnceLock::get) {
            if self.slack_bytes() <= keep {
                return;
            }
            let mut guard = class.lock();
            let st = &mut *guard;
            loop {
                let slack = self.slack_bytes();
                if slack <= keep {
                    break;
                }
                let Some(i) = top_valid(&mut st.free_stack, &mut st.chunks, IN_FREE, |c| !c.free.is_empty()) else {
                    break;
                };
                let ch = &mut st.chunks[i];
                let want = (slack - keep).div_ceil(class.size as u64) as usize;
                let n = want.min(ch.free.len());
                let mut slots = ch.free.split_off(ch.free.len() - n);
                slots.sort_unstable();
                let mut k = 0;
                while k < n {
                    let start = slots[k] as usize;
                    let mut end = start + 1;
                    k += 1;
                    while k < n && slots[k] as usize == end {
                        end += 1;
                        k += 1;
                    }
                    // SAFETY: these slots are free (taken off the free list under the lock) and
                    // page-aligned, page-sized, inside the chunk's mapping.
                    unsafe { dontneed(ch.base.wrapping_add(start * class.size), (end - start) * class.size) };
                }
                let bytes = (n * class.size) as u64;
                self.footprint.fetch_sub(bytes, Ordering::Relaxed);
                self.slack.fetch_sub(bytes, Ordering::Relaxed);
                ch.released.extend_from_slice(&slots);
                push_once(&mut st.rel_stack, ch, i, IN_REL);
                if ch.used == 0 && ch.free.is_empty() {
                    self.retire(class, st, i, 0);
                }
            }
        }
    }

    /// Free sub-page `slot` of `chunk`, whose chunk keeps other live objects (its header
    /// already marked free, `used` already counted down): the top comes down past it, and
    /// pages left without a live object are given back as `release_above_top` and
    /// `release_empty_pages` decide.
    fn free_sub_slot(&self, class: &Class, st: &mut ClassState, chunk: usize, slot: usize) -> u64 {
        let ch = &mut st.chunks[chunk];
        ch.set_free(slot);
        ch.count_pages(slot * class.size, class.size, false);
        let mut released = 0;
        if slot + 1 == ch.bump as usize {
            ch.trim_top();
            push_once(&mut st.room_stack, ch, chunk, IN_ROOM);
            released += self.release_above_top(class, ch, SUB_RELEASE_STEP);
        }
        released += self.release_empty_pages(class, ch, false);
        if ch.free_count > 0 {
            push_once(&mut st.free_stack, ch, chunk, IN_FREE);
        }
        released
    }

    /// Give back a sub-page chunk's whole pages above its topmost live slot, once they add
    /// up to `min` bytes (and at least a page). Returns the bytes given back.
    fn release_above_top(&self, class: &Class, ch: &mut ChunkState, min: u64) -> u64 {
        let (top, touched) = (class.covered(ch.bump as usize), class.covered(ch.populated as usize));
        if touched <= top || touched - top < min {
            return 0;
        }
        // SAFETY: every slot from `bump` up is free, so the whole pages above the last live
        // slot's end hold no object; they lie inside the chunk's mapping.
        unsafe { dontneed(ch.base.wrapping_add(top as usize), (touched - top) as usize) };
        let pages = (top as usize / PAGE)..(touched as usize / PAGE);
        let already = pages.clone().filter(|&p| ch.page_released(p)).count() as u64;
        pages.for_each(|p| ch.set_page_released(p, false));
        let released = touched - top - already * PAGE as u64;
        self.footprint.fetch_sub(released, Ordering::Relaxed);
        ch.populated = ch.bump;
        released
    }

    /// A sub-page chunk whose touched pages without a live object reach half of its
    /// touched pages (and `SUB_RELEASE_STEP`) gives them all back: the lowest-slot-first
    /// reuse refills such holes first, so they are let go only once there are many.
    /// `all`: give back every such page now (`trim`). Returns the bytes given back.
    fn release_empty_pages(&self, class: &Class, ch: &mut ChunkState, all: bool) -> u64 {
        let pages = class.covered(ch.populated as usize) as usize / PAGE;
        let touched = pages - ch.released_count as usize;
        let empty = touched - ch.live_pages as usize;
        if empty == 0 || !all && (((empty * PAGE) as u64) < SUB_RELEASE_STEP || empty * 2 < touched) {
            return 0;
        }
        let mut p = 0;
        while p < pages {
            if ch.page_live.get(p).copied().unwrap_or(0) != 0 || ch.page_released(p) {
                p += 1;
                continue;
            }
            let start = p;
            while p < pages && ch.page_live.get(p).copied().unwrap_or(0) == 0 && !ch.page_released(p) {
                ch.set_page_released(p, true);
                p += 1;
            }
            // SAFETY: no live or handed-out slot overlaps these pages (their counts are zero
            // under the class lock), and they lie inside the chunk's mapping.
            unsafe { dontneed(ch.base.wrapping_add(start * PAGE), (p - start) * PAGE) };
        }
        self.footprint.fetch_sub((empty * PAGE) as u64, Ordering::Relaxed);
        (empty * PAGE) as u64
    }

    /// Reserve `growth` bytes of footprint against the cap, atomically with respect to every
    /// other reservation, so concurrent stores can never overshoot the cap together.
    fn reserve(&self, growth: u64) -> bool {
        if growth == 0 {
            return true;
        }
        let cap = self.cap();
        self.footprint.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |fp| (fp + growth <= cap).then_some(fp + growth)).is_ok()
    }

    /// Pick a slot under the class lock, cheapest first: populated free (no growth), released
    /// or never-used slots in chunks that hold objects, the spare chunk, a new chunk.
    fn take_slot(&self, class: &Class) -> Result<Taken, PoolError> {
        let mut guard = class.lock();
        let st = &mut *guard;
        let slots = class.slots as u32;
        let (pick, growth) =
            if let Some(i) = top_valid(&mut st.free_stack, &mut st.chunks, IN_FREE, |c| !c.free.is_empty() || c.free_count > 0) {
                (Pick::Free(i), 0)
            } else if let Some(i) = top_valid(&mut st.rel_stack, &mut st.chunks, IN_REL, |c| !c.released.is_empty()) {
                (Pick::Released(i), class.size as u64)
            } else if let Some(i) = top_valid(&mut st.room_stack, &mut st.chunks, IN_ROOM, |c| c.bump > 0 && c.bump < slots) {
                let (b, populated) = (st.chunks[i].bump as usize, st.chunks[i].populated as usize);
                // A sub-page chunk's bump may come back up over pages it still holds.
                (Pick::Room(i), if b < populated { 0 } else { class.covered(b + 1) - class.covered(b) })
            } else if let Some(i) = st.spare {
                (Pick::Spare(i as usize), class.covered(1))
            } else {
                (Pick::New, class.covered(1))
            };
        // A sub-page slot may also lie on pages given back while empty.
        let growth = match pick {
            Pick::Free(i) if !class.page_sized => {
                let ch = &st.chunks[i];
                class.slot_growth(ch, ch.lowest_free().expect("top_valid checked non-empty"))
            }
            Pick::Room(i) if !class.page_sized => class.slot_growth(&st.chunks[i], st.chunks[i].bump as usize),
            _ => growth,
        };
        if !self.reserve(growth) {
            return Ok(Taken::Over { growth });
        }
        let (i, slot) = match pick {
            Pick::Free(i) if class.page_sized => {
                let slot = st.chunks[i].free.pop().expect("top_valid checked non-empty");
                self.slack.fetch_sub(class.size as u64, Ordering::Relaxed);
                (i, slot as usize)
            }
            Pick::Free(i) => (i, st.chunks[i].take_lowest_free().expect("top_valid checked non-empty")),
            Pick::Released(i) => {
                let slot = st.chunks[i].released.pop().expect("top_valid checked non-empty");
                (i, slot as usize)
            }
            Pick::Room(i) => {
                let ch = &mut st.chunks[i];
                ch.bump += 1;
                if !class.page_sized {
                    ch.populated = ch.populated.max(ch.bump);
                }
                (i, ch.bump as usize - 1)
            }
            Pick::Spare(i) => {
                st.spare = None;
                (i, 0)
            }
            Pick::New => match self.new_chunk(class, st) {
                Ok(i) => (i, 0),
                Err(e) => {
                    self.footprint.fetch_sub(growth, Ordering::Relaxed);
                    return Err(e);
                }
            },
        };
        let ch = &mut st.chunks[i];
        if matches!(pick, Pick::Spare(_) | Pick::New) {
            ch.bump = 1;
            ch.populated = if class.page_sized { 0 } else { 1 };
            if slots > 1 {
                push_once(&mut st.room_stack, ch, i, IN_ROOM);
            }
        }
        if !class.page_sized {
            ch.count_pages(slot * class.size, class.size, true);
        }
        ch.used += 1;
        Ok(Taken::Slot { chunk: i, slot, base: ch.base, info: ch.info })
    }

    fn new_chunk(&self, class: &Class, st: &mut ClassState) -> Result<usize, PoolError> {
        if st.vacant.is_empty() && st.chunks.len() >= MAX_CHUNKS {
            return Err(PoolError::OutOfMemory { errno: libc::ENOMEM });
        }
        let base = map_chunk(class.map_len)?;
        if let Some(i) = st.vacant.pop() {
            let ch = &mut st.chunks[i as usize];
            ch.base = base;
            // SAFETY: ChunkInfo lives as long as the pool.
            unsafe { ch.info.as_ref() }.base.store(base, Ordering::Release);
            return Ok(i as usize);
        }
        let i = st.chunks.len();
        let lens_len = if class.page_sized { class.slots } else { 0 };
        let info =
            Box::into_raw(Box::new(ChunkInfo { base: AtomicPtr::new(base), lens: (0..lens_len).map(|_| AtomicU32::new(0)).collect() }));
        class.publish(i, info);
        st.chunks.push(ChunkState {
            base,
            info: NonNull::new(info).expect("Box::into_raw is non-null"),
            bump: 0,
            populated: 0,
            free_bits: Vec::new(),
            free_count: 0,
            free_hint: 0,
            page_live: Vec::new(),
            live_pages: 0,
            released_pages: Vec::new(),
            released_count: 0,
            used: 0,
            free: Vec::new(),
            released: Vec::new(),
            stacks: 0,
        });
        Ok(i)
    }

    /// A chunk has no live object and no populated free slot (beyond `resident` bytes from its
    /// base, which the caller has already taken out of the footprint). Keep it as the class's
    /// spare, or unmap it if there already is one.
    fn retire(&self, class: &Class, st: &mut ClassState, i: usize, resident: usize) {
        let ch = &mut st.chunks[i];
        debug_assert_eq!(ch.used, 0);
        ch.bump = 0;
        ch.populated = 0;
        ch.free_bits = Vec::new();
        (ch.free_count, ch.free_hint) = (0, 0);
        (ch.page_live, ch.released_pages) = (Vec::new(), Vec::new());
        (ch.live_pages, ch.released_count) = (0, 0);
        ch.free = Vec::new();
        ch.released = Vec::new();
        if st.spare.is_none() {
            if resident > 0 {
                // SAFETY: no slot of this chunk is live; `resident` is a page multiple from base.
                unsafe { dontneed(ch.base, resident) };
            }
            st.spare = Some(i as u32);
        } else {
            // SAFETY: no live object remains in the chunk, so no valid handle points into it; the
            // table entry is cleared below and the index is only reused for a new mapping.
            unsafe { unmap(ch.base, class.map_len) };
            ch.base = ptr::null_mut();
            // SAFETY: ChunkInfo lives as long as the pool.
            unsafe { ch.info.as_ref() }.base.store(ptr::null_mut(), Ordering::Release);
            st.vacant.push(i as u32);
        }
    }

    /// Test support: resident bytes of all mappings according to mincore(2).
    #[cfg(test)]
    fn resident_bytes(&self) -> u64 {
        let mut total = 0u64;
        for class in self.classes.iter().filter_map(OnceLock::get) {
            let st = class.lock();
            let mut vec = vec![0u8; class.map_len / PAGE];
            for ch in st.chunks.iter().filter(|c| !c.base.is_null()) {
                // SAFETY: base/map_len describe a live mapping; vec has one byte per page.
                let rc = unsafe { libc::mincore(ch.base.cast(), class.map_len, vec.as_mut_ptr()) };
                assert_eq!(rc, 0);
                total += vec.iter().filter(|&&b| b & 1 != 0).count() as u64 * PAGE as u64;
            }
        }
        total
    }

    /// Test support: recompute the counters from the per-chunk state (quiescent pool only).
    #[cfg(test)]
    fn check_accounting(&self) {
        let (mut footprint, mut slack, mut used, mut slot_bytes) = (0u64, 0u64, 0u64, 0u64);
        for class in self.classes.iter().filter_map(OnceLock::get) {
            let st = class.lock();
            for (i, ch) in st.chunks.iter().enumerate() {
                used += ch.used as u64;
                slot_bytes += ch.used as u64 * class.size as u64;
                if ch.base.is_null() {
                    assert_eq!((ch.bump, ch.used), (0, 0));
                    continue;
                }
                assert!(ch.bump as usize <= class.slots);
                if class.page_sized {
                    footprint += (ch.bump as u64 - ch.released.len() as u64) * class.size as u64;
                    slack += ch.free.len() as u64 * class.size as u64;
                    assert_eq!(ch.used as usize + ch.free.len() + ch.released.len(), ch.bump as usize);
                } else {
                    footprint += class.covered(ch.populated as usize) - ch.released_count as u64 * PAGE as u64;
                    assert!(ch.released.is_empty() && ch.free.is_empty());
                    let pages = class.covered(ch.populated as usize) as usize / PAGE;
                    let mut live = vec![0u16; pages.max(ch.page_live.len())];
                    for slot in (0..ch.bump as usize).filter(|&s| !ch.is_free(s)) {
                        (slot * class.size / PAGE..=(slot * class.size + class.size - 1) / PAGE).for_each(|p| live[p] += 1);
                    }
                    live.truncate(ch.page_live.len().max(pages));
                    let mut recorded = ch.page_live.clone();
                    recorded.resize(live.len(), 0);
                    assert_eq!(recorded, live, "per-page live counts");
                    assert_eq!(ch.live_pages as usize, live.iter().filter(|&&n| n > 0).count());
                    assert!((0..ch.released_pages.len() * 64).all(|p| !ch.page_released(p) || (p < pages && live[p] == 0)));
                    assert!(ch.bump <= ch.populated && ch.populated as usize <= class.slots);
                    let bits: u32 = ch.free_bits.iter().map(|w| w.count_ones()).sum();
                    assert_eq!(bits, ch.free_count);
                    assert!((ch.bump as usize..ch.free_bits.len() * 64).all(|s| !ch.is_free(s)), "a free bit at or above bump");
                    assert_eq!(ch.used + ch.free_count, ch.bump);
                }
                if st.spare == Some(i as u32) {
                    assert_eq!(ch.bump, 0);
                }
            }
        }
        assert_eq!(footprint, self.footprint_bytes(), "footprint");
        assert_eq!(slack, self.slack_bytes(), "slack");
        assert_eq!(used, self.live_objects(), "live");
        assert_eq!(slot_bytes, self.slot_bytes.load(Ordering::Relaxed), "slot bytes");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn splitmix(mut x: u64) -> u64 {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^ (x >> 31)
    }

    fn content(seed: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        for (j, w) in v.chunks_mut(8).enumerate() {
            let bytes = splitmix(seed ^ (j as u64).wrapping_mul(0x1000_0000_01B3)).to_le_bytes();
            w.copy_from_slice(&bytes[..w.len()]);
        }
        v
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn pool_is_send_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<ZPool>();
    }

    #[test]
    fn class_geometry() {
        assert_eq!(NR_CLASSES, 63 + 513);
        assert_eq!(class_index(0), 0);
        assert_eq!(class_index(60), 0);
        assert_eq!(class_index(61), 1);
        assert_eq!(class_index(SUB_MAX - HDR), NR_SUB - 1);
        assert_eq!(class_index(SUB_MAX - HDR + 1), NR_SUB);
        assert_eq!(class_index(4096), NR_SUB);
        assert_eq!(class_index(4097), NR_SUB + 1);
        assert_eq!(class_index(2 << 20), NR_SUB + 511);
        assert_eq!(class_index(ZPool::MAX_OBJECT), NR_CLASSES - 1);
        for ci in 0..NR_CLASSES {
            let c = Class::new(ci);
            assert!(c.slots >= 1 && c.slots <= 1 << SLOT_BITS);
            assert!(c.slots * c.size <= c.map_len && c.map_len <= CHUNK_BYTES.max(c.size));
        }
        let h = PoolHandle::new(NR_CLASSES - 1, MAX_CHUNKS - 1, (1 << SLOT_BITS) - 1);
        assert!(h.to_raw() >> PoolHandle::BITS == 0);
        assert_eq!(h.decode(), (NR_CLASSES - 1, MAX_CHUNKS - 1, (1 << SLOT_BITS) - 1));
        assert_ne!(PoolHandle::new(0, 0, 0).to_raw(), 0);
    }

    #[test]
    fn round_trip_sizes() {
        let pool = ZPool::new(u64::MAX);
        let sizes = [0, 1, 63, 64, 4028, 4029, 4095, 4096, 4097, 65536, 2 << 20, ZPool::MAX_OBJECT];
        let handles: Vec<_> = sizes
            .iter()
            .map(|&len| {
                let h = pool.store(&content(len as u64, len)).unwrap();
                assert_eq!(PoolHandle::from_raw(h.to_raw()), h);
                (h, len)
            })
            .collect();
        assert_eq!(pool.live_objects(), sizes.len() as u64);
        assert_eq!(pool.stored_bytes(), sizes.iter().sum::<usize>() as u64);
        for &(h, len) in &handles {
            // SAFETY: h is live.
            assert_eq!(unsafe { pool.get(h) }, &content(len as u64, len)[..]);
        }
        pool.check_accounting();
        assert!(pool.resident_bytes() <= pool.footprint_bytes());
        for (h, _) in handles {
            pool.free(h);
        }
        assert_eq!((pool.live_objects(), pool.stored_bytes()), (0, 0));
        pool.check_accounting();
    }

    #[test]
    fn raw_folios_cost_exactly_their_pages() {
        let pool = ZPool::new(u64::MAX);
        let a = pool.store(&[7u8; 4096]).unwrap();
        assert_eq!(pool.footprint_bytes(), 4096);
        let b = pool.store(&vec![9u8; 2 << 20]).unwrap();
        assert_eq!(pool.footprint_bytes(), 4096 + (2 << 20));
        assert_eq!(pool.resident_bytes(), pool.footprint_bytes());
        pool.free(a);
        pool.free(b);
    }

    #[test]
    fn too_large() {
        let pool = ZPool::new(u64::MAX);
        let data = vec![0u8; ZPool::MAX_OBJECT + 1];
        assert_eq!(pool.store(&data), Err(PoolError::TooLarge { len: ZPool::MAX_OBJECT + 1, max: ZPool::MAX_OBJECT }));
        assert_eq!((pool.footprint_bytes(), pool.live_objects()), (0, 0));
    }

    #[test]
    fn full_at_cap_leaves_stored_objects_alone() {
        let cap = 1 << 20;
        let pool = ZPool::new(cap);
        let mut live = Vec::new();
        let err = loop {
            let seed = live.len() as u64;
            match pool.store(&content(seed, 65536)) {
                Ok(h) => live.push((h, seed)),
                Err(e) => break e,
            }
            assert!(live.len() <= 16);
        };
        assert_eq!(live.len(), 16);
        assert_eq!(err, PoolError::Full { needed: 65536, footprint: cap, cap });
        // Small objects need a fresh page too, and fail the same way.
        assert!(matches!(pool.store(&[1u8; 10]), Err(PoolError::Full { .. })));
        assert_eq!(pool.footprint_bytes(), cap);
        for &(h, seed) in &live {
            // SAFETY: h is live.
            assert_eq!(unsafe { pool.get(h) }, &content(seed, 65536)[..]);
        }
        // A freed slot is populated, so reusing it is allowed even at the cap.
        let (h, _) = live.swap_remove(3);
        pool.free(h);
        let h = pool.store(&content(99, 65000)).unwrap();
        // SAFETY: h is live.
        assert_eq!(unsafe { pool.get(h) }, &content(99, 65000)[..]);
        assert_eq!(pool.footprint_bytes(), cap);
        pool.check_accounting();
        // Raising the cap lets it grow again.
        pool.set_cap(2 * cap);
        pool.store(&[1u8; 10]).unwrap();
    }

    #[test]
    fn full_releases_slack_of_other_classes_first() {
        let pool = ZPool::new(4 * MIB);
        let big: Vec<_> = (0..4).map(|i| pool.store(&content(i, MIB as usize - 100)).unwrap()).collect();
        assert_eq!(pool.footprint_bytes(), 4 * MIB);
        for h in big {
            pool.free(h);
        }
        // Within the 8 MiB slack floor: still populated, still counted.
        assert_eq!(pool.slack_bytes(), 4 * MIB);
        assert_eq!(pool.footprint_bytes(), 4 * MIB);
        // A different class needs fresh pages; the store releases slack instead of failing.
        let small: Vec<_> = (0..64).map(|i| pool.store(&content(i, 30000)).unwrap()).collect();
        assert!(pool.footprint_bytes() <= 4 * MIB);
        for (i, &h) in small.iter().enumerate() {
            // SAFETY: h is live.
            assert_eq!(unsafe { pool.get(h) }, &content(i as u64, 30000)[..]);
        }
        pool.check_accounting();
        assert!(pool.resident_bytes() <= pool.footprint_bytes());
    }

    #[test]
    fn footprint_drops_beyond_slack_and_after_shrink() {
        let pool = ZPool::new(u64::MAX);
        let n = 24u64;
        let hs: Vec<_> = (0..n).map(|i| pool.store(&content(i, MIB as usize)).unwrap()).collect();
        assert_eq!(pool.footprint_bytes(), n * MIB);
        assert_eq!(pool.resident_bytes(), n * MIB);
        for h in hs {
            pool.free(h);
        }
        // Slack is bounded by max(8 MiB, stored/16) = 8 MiB; the rest went back immediately.
        assert!(pool.slack_bytes() <= SLACK_FLOOR);
        assert_eq!(pool.footprint_bytes(), pool.slack_bytes());
        assert!(pool.footprint_bytes() < n * MIB);
        assert_eq!(pool.resident_bytes(), pool.footprint_bytes());
        pool.check_accounting();
        pool.shrink_slack(0);
        assert_eq!((pool.footprint_bytes(), pool.slack_bytes()), (0, 0));
        assert_eq!(pool.resident_bytes(), 0);
        pool.check_accounting();
    }

    #[test]
    fn sub_page_chunks_released_when_empty() {
        let pool = ZPool::new(u64::MAX);
        // 3 chunks' worth of 100-byte objects (class 128).
        let per_chunk = CHUNK_BYTES / 128;
        let hs: Vec<_> = (0..3 * per_chunk).map(|i| pool.store(&content(i as u64, 100)).unwrap()).collect();
        assert_eq!(pool.footprint_bytes(), 3 * CHUNK_BYTES as u64);
        // Free all but one object: two chunks empty out completely, one keeps a live object,
        // in its first slot, and gives back every page above it.
        for &h in &hs[1..] {
            pool.free(h);
        }
        assert_eq!(pool.footprint_bytes(), PAGE as u64);
        assert!(pool.resident_bytes() <= pool.footprint_bytes());
        pool.check_accounting();
        pool.free(hs[0]);
        assert_eq!(pool.footprint_bytes(), 0);
        assert_eq!(pool.resident_bytes(), 0);
        pool.check_accounting();
    }

    /// Sub-page objects stored and freed at random: 20 000 live, then a quarter of them,
    /// kept at that level while twice as many again come and go; every live object is
    /// checked, `at_low` sees the pool there (with the footprint at the peak), then half
    /// go, the rest are checked again, and all go.
    fn churn(pool: &ZPool, seed: u64, at_low: impl FnOnce(u64)) {
        let mut rng = seed;
        let mut next = move || {
            rng = splitmix(rng);
            rng
        };
        let mut live: Vec<(PoolHandle, u64, usize)> = Vec::new();
        let store = |live: &mut Vec<(PoolHandle, u64, usize)>, seed: u64| {
            let len = 200 + (seed % 3000) as usize;
            live.push((pool.store(&content(seed, len)).unwrap(), seed, len));
        };
        for _ in 0..20_000 {
            store(&mut live, next());
        }
        let peak = pool.footprint_bytes();
        while live.len() > 5_000 {
            let (h, _, _) = live.swap_remove((next() % live.len() as u64) as usize);
            pool.free(h);
        }
        for _ in 0..40_000 {
            let (h, _, _) = live.swap_remove((next() % live.len() as u64) as usize);
            pool.free(h);
            store(&mut live, next());
        }
        for &(h, seed, len) in &live {
            // SAFETY: every handle in `live` is stored and not freed.
            assert_eq!(unsafe { pool.get(h) }, &content(seed, len)[..]);
        }
        at_low(peak);
        let keep = live.len() / 2;
        for (h, _, _) in live.drain(keep..) {
            pool.free(h);
        }
        for &(h, seed, len) in &live {
            // SAFETY: as above.
            assert_eq!(unsafe { pool.get(h) }, &content(seed, len)[..]);
        }
        for (h, _, _) in live {
            pool.free(h);
        }
    }

    /// A chunk that kept every page it ever touched until all its slots were free would
    /// hold the churn's peak (about four times the live bytes); reusing the lowest free
    /// slot first and giving back the pages with no live object keeps the footprint near
    /// the live bytes.
    #[test]
    fn random_churn_gives_back_what_the_live_objects_left() {
        let pool = ZPool::new(u64::MAX);
        churn(&pool, 0x1234_5678, |peak| {
            pool.check_accounting();
            let (footprint, stored) = (pool.footprint_bytes(), pool.stored_bytes());
            assert!(footprint < stored * 3 / 2, "footprint {footprint} for {stored} live bytes (peak {peak})");
            assert!(pool.resident_bytes() <= footprint);
        });
        // The churn ends with everything freed.
        pool.check_accounting();
        assert_eq!((pool.footprint_bytes(), pool.resident_bytes()), (0, 0));
    }

    /// Half of 3 000 objects of every sub-page size freed at random leave their chunks'
    /// pages mostly held; moving each live object down (`relocate`) and trimming gives
    /// back all but about a page per class, and every object reads back as stored.
    #[test]
    fn relocated_objects_keep_their_bytes_and_free_their_pages() {
        let pool = ZPool::new(u64::MAX);
        let mut live: Vec<(PoolHandle, u64, usize)> = (0..3000u64)
            .map(|i| {
                let len = 60 + (splitmix(i) % (SUB_MAX - HDR - 60) as u64) as usize;
                (pool.store(&content(i, len)).unwrap(), i, len)
            })
            .collect();
        let page_object = pool.store(&content(9999, 3 * PAGE)).unwrap();
        live.retain(|&(h, i, _)| {
            let keep = splitmix(i ^ 0xABCD).is_multiple_of(2);
            if !keep {
                pool.free(h);
            }
            keep
        });
        pool.check_accounting();
        let before = pool.footprint_bytes();
        let classes = live.iter().map(|&(_, _, len)| class_index(len)).collect::<std::collections::BTreeSet<_>>().len() as u64;
        // SAFETY: `page_object` is live and used by nobody else.
        assert_eq!(unsafe { pool.relocate(page_object) }, None, "a page-class object moved");
        let mut moved = 0;
        for (h, _, _) in live.iter_mut() {
            // SAFETY: each handle is live and this thread alone uses it.
            if let Some((new, _)) = unsafe { pool.relocate(*h) } {
                *h = new;
                moved += 1;
            }
        }
        assert!(moved > 0, "nothing moved");
        for &(h, _, _) in &live {
            // SAFETY: as above; a second pass finds every object in its chunk's prefix.
            assert_eq!(unsafe { pool.relocate(h) }, None, "an object moved twice");
        }
        pool.trim();
        pool.check_accounting();
        let after = pool.footprint_bytes();
        let slots: u64 = live.iter().map(|&(_, _, len)| (len + HDR).next_multiple_of(SUB_STEP) as u64).sum();
        assert!(after < before, "trim gave nothing back: {before} -> {after}");
        assert!(
            after <= slots + 3 * PAGE as u64 + classes * PAGE as u64,
            "{after} bytes held for {slots} bytes of slots in {classes} classes"
        );
        for &(h, i, len) in &live {
            // SAFETY: live, used by this thread alone.
            assert!(unsafe { pool.get(h) } == content(i, len), "object {i} changed in its move");
        }
        for (h, _, _) in live {
            pool.free(h);
        }
        pool.free(page_object);
        pool.check_accounting();
        assert_eq!(pool.footprint_bytes(), pool.slack_bytes(), "only the page object's slot is kept, as slack");
    }

    /// The same churn from two threads at once on one pool, every object checked.
    #[test]
    fn threads_churn_small_objects_in_one_pool() {
        let pool = ZPool::new(u64::MAX);
        std::thread::scope(|s| {
            for seed in [11, 12] {
                let pool = &pool;
                s.spawn(move || churn(pool, seed, |_| {}));
            }
        });
        pool.check_accounting();
        assert_eq!((pool.stored_bytes(), pool.live_objects(), pool.footprint_bytes()), (0, 0, 0));
        assert_eq!(pool.resident_bytes(), 0);
    }

    #[test]
    fn reuse_does_not_grow_footprint() {
        let pool = ZPool::new(u64::MAX);
        for len in [100usize, 3000, 4096, 20000, 1 << 20] {
            let hs: Vec<_> = (0..8).map(|i| pool.store(&content(i, len)).unwrap()).collect();
            let fp = pool.footprint_bytes();
            for h in hs {
                pool.free(h);
            }
            // Keep one object alive so the sub-page chunk is not released as a whole.
            let keep = pool.store(&content(1000, len)).unwrap();
            for _ in 0..5 {
                let hs: Vec<_> = (0..7).map(|i| pool.store(&content(i, len)).unwrap()).collect();
                assert_eq!(pool.footprint_bytes(), fp, "len {len}");
                for h in hs {
                    pool.free(h);
                }
            }
            pool.free(keep);
            pool.check_accounting();
        }
    }

    #[test]
    fn empty_chunks_are_unmapped_and_their_index_reused() {
        let pool = ZPool::new(u64::MAX);
        let len = 3 * CHUNK_BYTES / 4; // one slot per chunk
        let round = |base: u64| -> Vec<PoolHandle> { (0..4).map(|i| pool.store(&content(base + i, len)).unwrap()).collect() };
        let first = round(0);
        let chunks: Vec<_> = first.iter().map(|h| h.decode().1).collect();
        for h in first {
            pool.free(h);
        }
        pool.shrink_slack(0);
        // One empty chunk stays mapped as the spare; the other three are unmapped.
        let class = pool.classes[class_index(len)].get().unwrap();
        {
            let st = class.lock();
            assert!(st.spare.is_some());
            assert_eq!(st.vacant.len(), 3);
        }
        assert_eq!((pool.footprint_bytes(), pool.resident_bytes()), (0, 0));
        pool.check_accounting();
        let second = round(10);
        let mut again: Vec<_> = second.iter().map(|h| h.decode().1).collect();
        again.sort_unstable();
        assert_eq!(again, chunks, "chunk indices are reused");
        for (i, &h) in second.iter().enumerate() {
            // SAFETY: h is live.
            assert_eq!(unsafe { pool.get(h) }, &content(10 + i as u64, len)[..]);
        }
        assert_eq!(pool.resident_bytes(), pool.footprint_bytes());
        pool.check_accounting();
        for h in second {
            pool.free(h);
        }
    }

    #[test]
    #[should_panic(expected = "freed twice")]
    fn double_free_panics_page_class() {
        let pool = ZPool::new(u64::MAX);
        let keep = pool.store(&[1u8; 8000]).unwrap();
        let h = pool.store(&[1u8; 8000]).unwrap();
        pool.free(h);
        let _ = keep;
        pool.free(h);
    }

    #[test]
    #[should_panic(expected = "freed twice")]
    fn double_free_panics_sub_page() {
        let pool = ZPool::new(u64::MAX);
        let _keep = pool.store(&[1u8; 100]).unwrap();
        let h = pool.store(&[1u8; 100]).unwrap();
        pool.free(h);
        pool.free(h);
    }

    #[test]
    fn forged_handles_panic() {
        let pool = ZPool::new(u64::MAX);
        let h = pool.store(&[1u8; 100]).unwrap();
        for raw in [1u64, h.to_raw() + 1, h.to_raw() + (1 << SLOT_BITS), (NR_CLASSES as u64 + 1) << 33] {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.free(PoolHandle(raw))));
            assert!(r.is_err(), "{raw:#x}");
        }
        // The pool still works after the rejected frees.
        // SAFETY: h is live.
        assert_eq!(unsafe { pool.get(h) }, &[1u8; 100][..]);
        pool.free(h);
        pool.check_accounting();
    }

    #[derive(Debug, Clone)]
    enum Op {
        Store { len: usize, seed: u64 },
        Free(usize),
        Shrink(u64),
    }

    fn len_strategy() -> impl Strategy<Value = usize> {
        prop_oneof![
            8 => 0usize..=200,
            6 => 201usize..=4200,
            3 => 4201usize..=70_000,
            1 => 70_001usize..=ZPool::MAX_OBJECT,
            1 => prop::sample::select(vec![4028usize, 4029, 4096, 8192, 2 << 20, ZPool::MAX_OBJECT]),
        ]
    }

    fn op_strategy() -> impl Strategy<Value = Op> {
        prop_oneof![
            10 => (len_strategy(), any::<u64>()).prop_map(|(len, seed)| Op::Store { len, seed }),
            7 => any::<usize>().prop_map(Op::Free),
            1 => prop_oneof![Just(0u64), 0u64..(16 << 20)].prop_map(Op::Shrink),
        ]
    }

    fn check_no_overlap(pool: &ZPool, model: &[(PoolHandle, usize, u64)]) {
        let mut ranges: Vec<(usize, usize)> = model
            .iter()
            .map(|&(h, len, _)| {
                // SAFETY: every handle in the model is live.
                let s = unsafe { pool.get(h) };
                assert_eq!(s.len(), len);
                (s.as_ptr() as usize, len)
            })
            .collect();
        ranges.sort_unstable();
        for w in ranges.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "live objects overlap: {w:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn random_ops_match_model(
            cap in prop::sample::select(vec![MIB, 4 * MIB, 16 * MIB]),
            ops in prop::collection::vec(op_strategy(), 1..160),
        ) {
            let pool = ZPool::new(cap);
            let mut model: Vec<(PoolHandle, usize, u64)> = Vec::new();
            for op in ops {
                match op {
                    Op::Store { len, seed } => {
                        let data = content(seed, len);
                        let before = (pool.stored_bytes(), pool.live_objects());
                        match pool.store(&data) {
                            Ok(h) => {
                                // SAFETY: h was just stored.
                                prop_assert_eq!(unsafe { pool.get(h) }, &data[..]);
                                model.push((h, len, seed));
                            }
                            Err(PoolError::Full { needed, footprint, cap: c }) => {
                                prop_assert_eq!(c, cap);
                                prop_assert!(needed > 0 && footprint + needed > cap);
                                prop_assert_eq!((pool.stored_bytes(), pool.live_objects()), before);
                            }
                            Err(e) => prop_assert!(false, "unexpected {e:?}"),
                        }
                    }
                    Op::Free(i) if !model.is_empty() => {
                        let (h, len, seed) = model.swap_remove(i % model.len());
                        // SAFETY: h is live until the free below.
                        prop_assert_eq!(unsafe { pool.get(h) }, &content(seed, len)[..]);
                        pool.free(h);
                    }
                    Op::Free(_) => {}
                    Op::Shrink(keep) => {
                        pool.shrink_slack(keep);
                        prop_assert!(pool.slack_bytes() <= keep);
                    }
                }
                let stored: usize = model.iter().map(|m| m.1).sum();
                prop_assert_eq!(pool.stored_bytes(), stored as u64);
                prop_assert_eq!(pool.live_objects(), model.len() as u64);
                prop_assert!(pool.footprint_bytes() <= cap);
                prop_assert!(pool.footprint_bytes() >= pool.stored_bytes());
                check_no_overlap(&pool, &model);
            }
            pool.check_accounting();
            prop_assert!(pool.resident_bytes() <= pool.footprint_bytes());
            for &(h, len, seed) in &model {
                // SAFETY: h is live.
                prop_assert_eq!(unsafe { pool.get(h) }, &content(seed, len)[..]);
            }
            for (h, _, _) in model.drain(..) {
                pool.free(h);
            }
            pool.shrink_slack(0);
            prop_assert_eq!((pool.stored_bytes(), pool.live_objects(), pool.footprint_bytes()), (0, 0, 0));
            prop_assert_eq!(pool.resident_bytes(), 0);
        }
    }

    fn thread_workload(pool: &ZPool, tid: u64, ops: usize, tolerate_full: bool) {
        let mut rng = splitmix(tid + 1);
        let mut next = move || {
            rng = splitmix(rng);
            rng
        };
        let mut mine: Vec<(PoolHandle, usize, u64)> = Vec::new();
        for _ in 0..ops {
            let r = next();
            match r % 100 {
                0..=49 if mine.len() < 64 => {
                    let len = match next() % 100 {
                        0..=69 => (next() % 4096) as usize,
                        70..=96 => 4096 + (next() % 61440) as usize,
                        _ => 65536 + (next() % (ZPool::MAX_OBJECT as u64 - 65535)) as usize,
                    };
                    let seed = next();
                    match pool.store(&content(seed, len)) {
                        Ok(h) => mine.push((h, len, seed)),
                        Err(PoolError::Full { .. }) if tolerate_full => {
                            if !mine.is_empty() {
                                let (h, len, seed) = mine.swap_remove(0);
                                // SAFETY: h is live (only this thread frees it).
                                assert_eq!(unsafe { pool.get(h) }, &content(seed, len)[..]);
                                pool.free(h);
                            }
                        }
                        Err(e) => panic!("thread {tid}: {e}"),
                    }
                }
                0..=84 if !mine.is_empty() => {
                    let (h, len, seed) = mine.swap_remove((next() % mine.len() as u64) as usize);
                    // SAFETY: h is live (only this thread frees it).
                    assert_eq!(unsafe { pool.get(h) }, &content(seed, len)[..]);
                    pool.free(h);
                }
                85..=89 => pool.shrink_slack(next() % (4 << 20)),
                _ if !mine.is_empty() => {
                    let (h, len, seed) = mine[(next() % mine.len() as u64) as usize];
                    // SAFETY: h is live (only this thread frees it).
                    assert_eq!(unsafe { pool.get(h) }, &content(seed, len)[..]);
                }
                _ => {}
            }
            assert!(pool.footprint_bytes() <= pool.cap());
        }
        for (h, len, seed) in mine {
            // SAFETY: h is live (only this thread frees it).
            assert_eq!(unsafe { pool.get(h) }, &content(seed, len)[..]);
            pool.free(h);
        }
    }

    #[test]
    fn threads_share_one_pool() {
        let pool = ZPool::new(u64::MAX);
        std::thread::scope(|s| {
            for tid in 0..4 {
                let pool = &pool;
                s.spawn(move || thread_workload(pool, tid, 3000, false));
            }
        });
        assert_eq!((pool.stored_bytes(), pool.live_objects()), (0, 0));
        pool.check_accounting();
        pool.shrink_slack(0);
        assert_eq!(pool.footprint_bytes(), 0);
        assert_eq!(pool.resident_bytes(), 0);
    }

    #[test]
    fn threads_under_a_tight_cap() {
        let pool = ZPool::new(6 * MIB);
        std::thread::scope(|s| {
            for tid in 0..4 {
                let pool = &pool;
                s.spawn(move || thread_workload(pool, 100 + tid, 2000, true));
            }
        });
        assert_eq!((pool.stored_bytes(), pool.live_objects()), (0, 0));
        assert!(pool.footprint_bytes() <= 6 * MIB);
        pool.check_accounting();
        pool.shrink_slack(0);
        assert_eq!(pool.footprint_bytes(), 0);
    }
}
