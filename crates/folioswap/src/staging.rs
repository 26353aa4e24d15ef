//! Staging: where folios live while they are neither mapped nor stored.
//!
//! One area per folio size, each a run of naturally aligned slots, registered in
//! write-protect mode only (the engine reads and writes slots like ordinary memory). In
//! move mode they are registered on the *region's* userfaultfd, so that a slot is a valid
//! destination of a `UFFDIO_MOVE` issued there: an eviction moves a folio out of its
//! region into a slot atomically, and the kernel checks only the destination's
//! registration and the `mmap_changing` count of the userfaultfd the move is issued on.
//! Issued on any other userfaultfd, a move out after a program's `munmap` whose UNMAP
//! event is still unread would take whatever another thread mapped in the hole meanwhile
//! (the test `move_out_unmap` shows it, and the stress test saw the engine's own heap
//! zeroed that way); on the region's it fails with EAGAIN until the event is read.
//!
//! A `MADV_DONTNEED` on memory registered with the region's userfaultfd would raise a
//! REMOVE event there and wait until it is read, so in move mode staging is never zapped
//! in place: [`Staging::empty`] moves the pages into the *trash*, a small area registered
//! on a second userfaultfd without events, emptied with one `MADV_DONTNEED` each time it
//! fills. In copy mode (no MOVE) staging is registered on that second userfaultfd and
//! emptied in place. 2 MiB areas and the trash are `MADV_HUGEPAGE`, so a THP moved out
//! stays a THP and one moved in arrives PMD-mapped.
//!
//! A free slot is either a *hole* (nothing mapped: the only valid MOVE destination) or
//! *filled* (pages present, possibly zero-page mappings). Evictions take holes and leave
//! them filled once their folio is stored; swap-ins take filled slots (decompressing into
//! memory that is already there avoids page faults and, for THPs, 2 MiB of zeroing) and
//! leave holes after moving the folio in. In steady state the two balance; a reserve of
//! filled slots is kept, bounded engine-wide and charged to memory_high, and the rest are
//! emptied. Under memory pressure the reserve is emptied before any fault is refused.
//!
//! Folios below 2 MiB are evicted in *batches*: a run of address-contiguous folios from
//! the LRU head moves out with one UFFDIO_MOVE into a 2 MiB batch slot, because every MOVE
//! flushes the TLB of every CPU the process runs on, and an inter-processor interrupt is
//! a VM exit here: 256 separate 4 KiB moves cost 232 shootdowns and 3.2 ms, one 1 MiB
//! move of the same pages one shootdown and 41 µs. Runs are appended to one *open* batch
//! slot until it is full (`take_batch_space`), each at pages never used before in it (a
//! MOVE needs an empty destination), so that emptying it, one move into the trash (or
//! MADV_DONTNEED) and so one more shootdown, is paid per 2 MiB evicted rather than per
//! run: with random access a run is often a single 4 KiB folio. Each member is compressed
//! from its offset; the slot is emptied once it is closed (full, or `close_open_batch`
//! when memory is short) and its last member is done.

use crate::memcg::{Component, MemCg};
use crate::size::{FolioSize, HUGE_SIZE, PAGE_SIZE};
use crate::uffd::{PageMap, Uffd, REGISTER_MODE_WP};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

/// A staging slot: folio order and index within that order's area.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    pub order: u32,
    pub index: u32,
}

/// Where an evicted folio's bytes sit while it is in the swap cache: `page` pages into a
/// slot. A 2 MiB folio owns a slot of its own; smaller ones share a 2 MiB batch slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Staged {
    pub slot: Slot,
    pub page: u32,
}

impl Staged {
    pub fn to_raw(self) -> u64 {
        ((self.slot.order as u64) << 56) | ((self.page as u64) << 32) | self.slot.index as u64
    }
    pub fn from_raw(raw: u64) -> Staged {
        Staged { slot: Slot { order: (raw >> 56) as u32, index: raw as u32 }, page: ((raw >> 32) & 0xFF_FFFF) as u32 }
    }
}

/// A slot handed out to be filled (`take_filled`, `take_zeroed_huge`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Taken {
    pub slot: Slot,
    /// It came from the reserve of filled slots: its StagingFree charge passes to the
    /// taker, who uncharges it (the folio it receives is charged on its own).
    pub from_reserve: bool,
    /// Its pages are one THP.
    pub huge: bool,
}

/// A batch slot's members still referring to it, and the staging memory they left in it.
struct Batch {
    members: u32,
    left_bytes: u64,
}

/// The batch slots with members, and the open one runs are appended to: its index and
/// its next unused page.
#[derive(Default)]
struct Batches {
    slots: HashMap<u32, Batch>,
    open: Option<(u32, u32)>,
}

struct FreeLists {
    holes: Vec<u32>,
    /// Filled slots and whether their pages are one THP.
    filled: Vec<(u32, bool)>,
    /// Threads asleep in `Area::wait_for_slot`: a slot given back wakes one only if there
    /// is one, since a condition variable's notify is a futex call whether anyone waits or
    /// not, and a swap-in gives a slot back at every fault.
    waiting: u32,
}

struct Area {
    base: usize,
    slot_bytes: usize,
    /// Debug builds: whether each slot is handed out, to catch double release.
    owned: Vec<std::sync::atomic::AtomicBool>,
    free: Mutex<FreeLists>,
    /// Signalled when a slot comes back while `FreeLists::waiting` is not zero.
    available: Condvar,
}

/// Where move mode's emptied staging pages go (module comment): `TRASH_BYTES` of address
/// space, emptied when full.
struct Trash {
    uffd: Uffd,
    base: usize,
    /// Bytes from `base` holding pages moved in since it was last emptied. Held across
    /// each move in, so that emptying never meets a move in flight.
    used: Mutex<usize>,
}

/// The trash's size: pieces are freed with one `MADV_DONTNEED` once they fill it (a whole
/// 2 MiB slot at once), so less than this waits there, uncharged.
const TRASH_BYTES: usize = HUGE_SIZE;

/// How often one emptying tries a move into the trash that the kernel answers "busy, try
/// again" before it gives the slot up (said on stderr): each try yields the CPU, so this
/// is a long wait for something that passes in microseconds.
const EMPTY_TRIES: u32 = 100_000;

pub(crate) struct Staging {
    /// The userfaultfd the areas are registered on (in move mode a second descriptor of
    /// the region's).
    uffd: Uffd,
    /// Move mode only: where emptied pages go.
    trash: Option<Trash>,
    pagemap: PageMap,
    /// Budget for filled slots kept across all areas, and what they hold now.
    reserve_bytes: u64,
    reserved: AtomicU64,
    /// Pages of a batch slot that runs fill before it is closed: all 512 under a large
    /// limit; under a small one fewer, since the pages of members already stored stay
    /// charged (as StagingFree) until the slot is emptied.
    batch_pages: u32,
    areas: [OnceLock<Area>; 10],
    batches: Mutex<Batches>,
    /// Moves into the trash that met a busy page and were tried again (`empty`).
    retries: AtomicU64,
}

fn madvise(addr: usize, len: usize, advice: i32) -> io::Result<()> {
    // SAFETY: the range lies inside a staging area this engine mapped and never exposes
    // as a Rust reference across the call; madvise changes only its page-table state.
    if unsafe { crate::sys::madvise(addr as *mut libc::c_void, len, advice) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn slots_for(folio: FolioSize) -> u32 {
    if folio.bytes() <= 64 << 10 {
        1024
    } else {
        256
    }
}

impl Area {
    fn hand_out(&self, index: u32) {
        if let Some(o) = self.owned.get(index as usize) {
            assert!(!o.swap(true, Ordering::SeqCst), "staging slot {index} handed out twice");
        }
    }
    fn give_back(&self, index: u32) {
        if let Some(o) = self.owned.get(index as usize) {
            assert!(o.swap(false, Ordering::SeqCst), "staging slot {index} returned twice");
        }
    }

    /// Sleep until a slot of this area comes back (or spuriously: callers look again).
    fn wait_for_slot<'a>(&self, mut free: MutexGuard<'a, FreeLists>) -> MutexGuard<'a, FreeLists> {
        free.waiting += 1;
        let mut free = self.available.wait(free).unwrap();
        free.waiting -= 1;
        free
    }

    /// Put a slot on the free lists (`put` does) and wake one thread waiting for a slot,
    /// if one waits. A waiter counts itself under the lock before it sleeps, so a slot put
    /// back after that sees it, and one put back before it is found by its next look.
    fn put_free(&self, put: impl FnOnce(&mut FreeLists)) {
        let mut free = self.free.lock().unwrap();
        put(&mut free);
        let wake = free.waiting > 0;
        drop(free);
        if wake {
            self.available.notify_one();
        }
    }
}

impl Staging {
    /// Staging registered on `uffd`; with `trash_uffd` (move mode, where `uffd` is the
    /// region's), emptied through a trash registered on that one.
    pub fn new(uffd: Uffd, trash_uffd: Option<Uffd>, reserve_bytes: usize, batch_bytes: usize) -> io::Result<Staging> {
        let trash = match trash_uffd {
            Some(trash_uffd) => {
                let base = crate::sys::map_aligned(TRASH_BYTES, HUGE_SIZE).map_err(io::Error::from_raw_os_error)?;
                madvise(base, TRASH_BYTES, libc::MADV_HUGEPAGE)?;
                madvise(base, TRASH_BYTES, libc::MADV_DONTFORK)?;
                trash_uffd.register(base, TRASH_BYTES, REGISTER_MODE_WP)?;
                Some(Trash { uffd: trash_uffd, base, used: Mutex::new(0) })
            }
            None => None,
        };
        Ok(Staging {
            uffd,
            trash,
            pagemap: PageMap::open()?,
            reserve_bytes: reserve_bytes as u64,
            reserved: AtomicU64::new(0),
            batch_pages: (batch_bytes / PAGE_SIZE).clamp(1, HUGE_SIZE / PAGE_SIZE) as u32,
            areas: Default::default(),
            batches: Mutex::new(Batches::default()),
            retries: AtomicU64::new(0),
        })
    }

    /// The descriptors this staging area holds: its userfaultfd(s) and pagemap.
    pub fn raw_fds(&self) -> Vec<std::os::fd::RawFd> {
        let mut fds = vec![self.uffd.raw_fd(), self.pagemap.raw_fd()];
        fds.extend(self.trash.as_ref().map(|t| t.uffd.raw_fd()));
        fds
    }

    fn area(&self, order: u32) -> io::Result<&Area> {
        if let Some(area) = self.areas[order as usize].get() {
            return Ok(area);
        }
        let folio = FolioSize::from_order(order).expect("valid order");
        let area = self.map_area(folio)?;
        // Two threads may race to create it; the loser unmaps its copy.
        if let Err(spare) = self.areas[order as usize].set(area) {
            let len = spare.slot_bytes * slots_for(folio) as usize;
            // Unregistered first: unmapping memory registered with the region's
            // userfaultfd would wait for its UNMAP event to be read.
            let _ = self.uffd.unregister(spare.base, len);
            // SAFETY: `spare` was mapped by map_area and never handed out.
            unsafe { crate::sys::munmap(spare.base as *mut libc::c_void, len) };
        }
        Ok(self.areas[order as usize].get().expect("just set"))
    }

    fn map_area(&self, folio: FolioSize) -> io::Result<Area> {
        let nslots = slots_for(folio);
        let bytes = folio.bytes() * nslots as usize;
        let base = crate::sys::map_aligned(bytes, folio.bytes().max(HUGE_SIZE)).map_err(io::Error::from_raw_os_error)?;
        madvise(base, bytes, if folio.is_huge() { libc::MADV_HUGEPAGE } else { libc::MADV_NOHUGEPAGE })?;
        madvise(base, bytes, libc::MADV_DONTFORK)?;
        self.uffd.register(base, bytes, REGISTER_MODE_WP)?;
        Ok(Area {
            base,
            slot_bytes: folio.bytes(),
            owned: (0..if cfg!(debug_assertions) { nslots } else { 0 }).map(|_| Default::default()).collect(),
            free: Mutex::new(FreeLists { holes: (0..nslots).rev().collect(), filled: Vec::new(), waiting: 0 }),
            available: Condvar::new(),
        })
    }

    pub fn addr(&self, slot: Slot) -> usize {
        let area = self.areas[slot.order as usize].get().expect("slot of a mapped area");
        area.base + slot.index as usize * area.slot_bytes
    }

    pub fn staged_addr(&self, at: Staged) -> usize {
        self.addr(at.slot) + at.page as usize * PAGE_SIZE
    }

    /// The bytes of a staged folio of `len` bytes.
    ///
    /// # Safety
    /// As `slice_mut`: the caller owns the folio's staged copy (it holds the folio's lock,
    /// or the folio is under WRITEBACK by this thread) and nothing moves those pages away.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn staged_slice(&self, at: Staged, len: usize) -> &mut [u8] {
        // SAFETY: inside a live staging area; exclusivity per the contract above.
        unsafe { std::slice::from_raw_parts_mut(self.staged_addr(at) as *mut u8, len) }
    }

    /// Room for an eviction run of `pages` pages and `members` folios in the open batch
    /// slot, at pages not used before (a valid MOVE destination); a full open slot (past
    /// `batch_pages`) is closed and a fresh 2 MiB hole opened, which takes a run of any
    /// length up to 2 MiB. Each member leaves with `end_batch_member`.
    pub fn take_batch_space(&self, pages: u32, members: u32, memcg: &MemCg) -> io::Result<Staged> {
        debug_assert!(pages as usize <= HUGE_SIZE / PAGE_SIZE);
        loop {
            {
                let mut b = self.batches.lock().unwrap();
                if let Some((index, next)) = b.open {
                    if next + pages <= self.batch_pages.max(pages) {
                        b.open = Some((index, next + pages));
                        b.slots.get_mut(&index).expect("the open batch").members += members;
                        return Ok(Staged { slot: Slot { order: FolioSize::M2.order(), index }, page: next });
                    }
                    let done = self.close_locked(&mut b);
                    drop(b);
                    if let Some((index, bytes)) = done {
                        self.release_batch(index, bytes, memcg);
                    }
                }
            }
            // No lock held: taking a hole may wait for one.
            let slot = self.take_hole(FolioSize::M2.order(), memcg)?;
            let mut b = self.batches.lock().unwrap();
            if b.open.is_some() {
                // Another evictor opened one meanwhile: use it, give this hole back.
                drop(b);
                self.put_hole(slot);
                continue;
            }
            b.slots.insert(slot.index, Batch { members: 0, left_bytes: 0 });
            b.open = Some((slot.index, 0));
        }
    }

    /// Close the open batch slot (memory is short): it is emptied as soon as its last
    /// member is done, at once if none is left.
    pub fn close_open_batch(&self, memcg: &MemCg) -> u64 {
        let done = self.close_locked(&mut self.batches.lock().unwrap());
        match done {
            Some((index, bytes)) => {
                self.release_batch(index, bytes, memcg);
                bytes
            }
            None => 0,
        }
    }

    /// Close the open slot; if no member is left in it, forget it and return what to release.
    fn close_locked(&self, b: &mut Batches) -> Option<(u32, u64)> {
        let (index, _) = b.open.take()?;
        (b.slots[&index].members == 0).then(|| (index, b.slots.remove(&index).expect("present").left_bytes))
    }

    /// A member of a batch is done with the slot, leaving `left_bytes` of staging memory
    /// in it (its pages, unless it moved them out) charged as StagingFree. The last member
    /// of a closed slot empties it and gives back what they all left.
    pub fn end_batch_member(&self, slot: Slot, left_bytes: u64, memcg: &MemCg) {
        let done = {
            let mut b = self.batches.lock().unwrap();
            let open = b.open.map(|(index, _)| index);
            let batch = b.slots.get_mut(&slot.index).expect("a batch for this slot");
            batch.members -= 1;
            batch.left_bytes += left_bytes;
            (batch.members == 0 && open != Some(slot.index)).then(|| b.slots.remove(&slot.index).expect("present").left_bytes)
        };
        if let Some(bytes) = done {
            self.release_batch(slot.index, bytes, memcg);
        }
    }

    /// Empty a batch slot nobody refers to any more and give back the `bytes` left in it.
    fn release_batch(&self, index: u32, bytes: u64, memcg: &MemCg) {
        memcg.uncharge(Component::StagingFree, bytes);
        let slot = Slot { order: FolioSize::M2.order(), index };
        let area = self.areas[slot.order as usize].get().expect("mapped");
        area.give_back(slot.index);
        self.empty_into_holes(area, slot);
    }

    /// The slot's memory. The caller owns the slot (took it and has not put it back), so
    /// nobody else reads or writes it meanwhile.
    ///
    /// # Safety
    /// No other reference to this slot's memory may exist while the returned one lives,
    /// and no MOVE may take its pages away meanwhile.
    // Exclusive access comes from slot ownership (a runtime protocol), not from `&mut self`.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, slot: Slot) -> &mut [u8] {
        let len = FolioSize::from_order(slot.order).expect("valid").bytes();
        // SAFETY: the slot lies inside a mapping that lives as long as the engine, and the
        // caller guarantees exclusive access per the function's contract.
        unsafe { std::slice::from_raw_parts_mut(self.addr(slot) as *mut u8, len) }
    }

    /// A hole to move a folio out into. Waits while every slot is busy.
    pub fn take_hole(&self, order: u32, memcg: &MemCg) -> io::Result<Slot> {
        let area = self.area(order)?;
        let mut free = area.free.lock().unwrap();
        loop {
            if let Some(index) = free.holes.pop() {
                area.hand_out(index);
                drop(free);
                let slot = Slot { order, index };
                debug_assert_eq!(
                    self.pagemap.present_bytes(self.addr(slot), area.slot_bytes).unwrap_or(0),
                    0,
                    "free staging hole {slot:?} has pages mapped"
                );
                return Ok(slot);
            }
            if let Some((index, _)) = free.filled.pop() {
                drop(free);
                area.hand_out(index);
                self.reserved.fetch_sub(area.slot_bytes as u64, Ordering::Relaxed);
                memcg.uncharge(Component::StagingFree, area.slot_bytes as u64);
                let slot = Slot { order, index };
                self.empty(self.addr(slot), area.slot_bytes)?;
                return Ok(slot);
            }
            free = area.wait_for_slot(free);
        }
    }

    /// A slot to fill (decompress into, or zero). Prefers a filled slot from the reserve
    /// (its charge passes to the caller, who uncharges StagingFree); otherwise a hole that
    /// the caller's writes will populate. For 2 MiB folios a hole is populated here with a
    /// THP if the kernel has one.
    pub fn take_filled(&self, order: u32) -> io::Result<Taken> {
        let area = self.area(order)?;
        let mut free = area.free.lock().unwrap();
        loop {
            if let Some((index, huge)) = free.filled.pop() {
                area.hand_out(index);
                self.reserved.fetch_sub(area.slot_bytes as u64, Ordering::Relaxed);
                return Ok(Taken { slot: Slot { order, index }, from_reserve: true, huge });
            }
            if let Some(index) = free.holes.pop() {
                area.hand_out(index);
                drop(free);
                let slot = Slot { order, index };
                let huge = area.slot_bytes == HUGE_SIZE && self.populate_huge(slot)?;
                return Ok(Taken { slot, from_reserve: false, huge });
            }
            free = area.wait_for_slot(free);
        }
    }

    /// As `take_filled`, but never waits: None when every slot of this size is out
    /// (readahead, which is optional, must not hold up faults and evictions).
    pub fn try_take_filled(&self, order: u32) -> io::Result<Option<Taken>> {
        let area = self.area(order)?;
        let mut free = area.free.lock().unwrap();
        if let Some((index, huge)) = free.filled.pop() {
            area.hand_out(index);
            self.reserved.fetch_sub(area.slot_bytes as u64, Ordering::Relaxed);
            return Ok(Some(Taken { slot: Slot { order, index }, from_reserve: true, huge }));
        }
        let Some(index) = free.holes.pop() else { return Ok(None) };
        area.hand_out(index);
        drop(free);
        let slot = Slot { order, index };
        let huge = area.slot_bytes == HUGE_SIZE && self.populate_huge(slot)?;
        Ok(Some(Taken { slot, from_reserve: false, huge }))
    }

    /// Slots of each size: readahead keeps at most half of them.
    pub fn slots_of(folio: FolioSize) -> u32 {
        slots_for(folio)
    }

    /// A zero-filled 2 MiB slot for a first touch: a hole populated by the kernel, which
    /// zeroes it.
    pub fn take_zeroed_huge(&self) -> io::Result<Taken> {
        let order = FolioSize::M2.order();
        let area = self.area(order)?;
        let mut free = area.free.lock().unwrap();
        loop {
            let (index, from_reserve) = if let Some(index) = free.holes.pop() {
                (index, false)
            } else if let Some((index, _)) = free.filled.pop() {
                self.reserved.fetch_sub(area.slot_bytes as u64, Ordering::Relaxed);
                (index, true)
            } else {
                free = area.wait_for_slot(free);
                continue;
            };
            drop(free);
            area.hand_out(index);
            let slot = Slot { order, index };
            if from_reserve {
                self.empty(self.addr(slot), area.slot_bytes)?;
            }
            let huge = self.populate_huge(slot)?;
            return Ok(Taken { slot, from_reserve, huge });
        }
    }

    fn populate_huge(&self, slot: Slot) -> io::Result<bool> {
        let addr = self.addr(slot);
        madvise(addr, HUGE_SIZE, crate::sys::MADV_POPULATE_WRITE)?;
        Ok(self.pagemap.huge_bytes(addr, HUGE_SIZE).unwrap_or(0) == HUGE_SIZE)
    }

    /// Return a slot whose pages were all moved away (or never populated): a hole again.
    pub fn put_hole(&self, slot: Slot) {
        let area = self.areas[slot.order as usize].get().expect("mapped");
        debug_assert_eq!(
            self.pagemap.present_bytes(self.addr(slot), area.slot_bytes).unwrap_or(0),
            0,
            "staging slot {slot:?} returned as a hole with pages mapped"
        );
        area.give_back(slot.index);
        area.put_free(|free| free.holes.push(slot.index));
    }

    /// Return a slot that still holds pages (its folio was stored). It stays filled for a
    /// later swap-in while the reserve has room, or when the reserve is empty, so that one
    /// slot of any size can be kept under a reserve smaller than it (then it is charged as
    /// StagingFree); otherwise it is emptied. 2 MiB slots that are not one THP are always
    /// emptied, so that swap-ins keep getting huge pages.
    pub fn put_filled(&self, slot: Slot, huge: bool, memcg: &MemCg) {
        let area = self.areas[slot.order as usize].get().expect("mapped");
        let bytes = area.slot_bytes as u64;
        area.give_back(slot.index);
        let keep_shape = area.slot_bytes != HUGE_SIZE || huge;
        if keep_shape
            && self
                .reserved
                .fetch_add(bytes, Ordering::Relaxed)
                .checked_add(bytes)
                .is_some_and(|after| after <= self.reserve_bytes || after == bytes)
        {
            memcg.charge(Component::StagingFree, bytes);
            area.put_free(|free| free.filled.push((slot.index, huge)));
            return;
        }
        if keep_shape {
            self.reserved.fetch_sub(bytes, Ordering::Relaxed);
        }
        self.empty_into_holes(area, slot);
    }

    /// Empty a slot nobody holds and make it a hole again. Emptying fails only on a kernel
    /// error; the slot is then unusable and is lost, said on stderr, since a lost slot
    /// leaves fewer for the faults that wait for one.
    fn empty_into_holes(&self, area: &Area, slot: Slot) {
        match self.empty(self.addr(slot), area.slot_bytes) {
            Ok(()) => area.put_free(|free| free.holes.push(slot.index)),
            Err(err) => eprintln!("folioswap: emptying staging slot {slot:?} failed, the slot is lost: {err}"),
        }
    }

    /// UFFDIO_MOVE on this kernel can fail with EEXIST for a page it did move (it retries
    /// a page internally and then finds its own work at the destination). True when the
    /// page at `src` is gone and the one at `dst` is there: the move happened.
    pub fn moved_anyway(&self, dst: usize, src: usize) -> bool {
        let present = |a: usize| self.pagemap.present_bytes(a, PAGE_SIZE).unwrap_or(0) == PAGE_SIZE;
        !present(src) && present(dst)
    }

    /// Whether every page of `[addr, addr + len)` has a page-table entry (any kernel).
    pub fn all_mapped(&self, addr: usize, len: usize) -> bool {
        self.pagemap.all_mapped(addr, len)
    }

    /// Whether any page of `[addr, addr + len)` is present.
    pub fn any_present(&self, addr: usize, len: usize) -> bool {
        self.pagemap.present_bytes(addr, len).is_ok_and(|n| n > 0)
    }

    /// Whether no page of `[addr, addr + len)` is present: false where the page tables
    /// could not be read, for a caller that must not miss a present page.
    pub fn none_present(&self, addr: usize, len: usize) -> bool {
        self.pagemap.present_bytes(addr, len).is_ok_and(|n| n == 0)
    }

    /// Whether every page of `[addr, addr + len)` is present.
    pub fn all_present(&self, addr: usize, len: usize) -> bool {
        self.pagemap.present_bytes(addr, len).is_ok_and(|n| n == len)
    }

    /// Empty every kept slot and give its charge back: memory is short.
    pub fn drain_reserve(&self, memcg: &MemCg) -> u64 {
        let mut released = 0;
        for area in self.areas.iter().filter_map(|a| a.get()) {
            let kept: Vec<(u32, bool)> = std::mem::take(&mut area.free.lock().unwrap().filled);
            for (index, _) in kept {
                let bytes = area.slot_bytes as u64;
                let addr = area.base + index as usize * area.slot_bytes;
                self.reserved.fetch_sub(bytes, Ordering::Relaxed);
                memcg.uncharge(Component::StagingFree, bytes);
                released += bytes;
                if self.empty(addr, area.slot_bytes).is_ok() {
                    area.put_free(|free| free.holes.push(index));
                }
            }
        }
        released
    }

    /// Empty `[addr, addr + len)` of staging this thread holds (a copy given up).
    pub fn discard(&self, addr: usize, len: usize) {
        if let Err(err) = self.empty(addr, len) {
            eprintln!("folioswap: emptying {len} bytes of staging at {addr:#x} failed: {err}");
        }
    }

    /// Empty a slot's pages in `[offset, offset + len)` (used to punch removed pages out).
    pub fn discard_range(&self, slot: Slot, offset: usize, len: usize) -> io::Result<()> {
        self.empty(self.addr(slot) + offset, len)
    }

    /// Free the pages of `[addr, addr + len)` of staging: zapped in place in copy mode,
    /// moved into the trash in move mode (module comment), which is emptied whenever the
    /// next piece would not fit.
    fn empty(&self, addr: usize, len: usize) -> io::Result<()> {
        let Some(trash) = &self.trash else {
            return madvise(addr, len, libc::MADV_DONTNEED);
        };
        let mut used = trash.used.lock().unwrap();
        let mut done = 0;
        while done < len {
            let piece = (len - done).min(TRASH_BYTES);
            // A 2 MiB-aligned destination lets a THP move whole (one PMD, no split).
            let mut at = used.next_multiple_of(if piece >= HUGE_SIZE { HUGE_SIZE } else { PAGE_SIZE });
            if at + piece > TRASH_BYTES {
                madvise(trash.base, TRASH_BYTES, libc::MADV_DONTNEED)?;
                at = 0;
            }
            let (dst, src) = (trash.base + at, addr + done);
            let (mut moved, mut tries) = (0, 0);
            while moved < piece {
                match trash.uffd.move_pages(dst + moved, src + moved, piece - moved, false) {
                    Ok(()) => moved = piece,
                    Err(err) => {
                        moved += err.done;
                        // EBUSY: the page is still pinned by the O_DIRECT read that
                        // filled it (the kernel wakes the reader before it unpins the
                        // pages, and defers that to a workqueue when a page is not yet
                        // dirty). EAGAIN: answered now and then for a 2 MiB THP slot
                        // (5 times in 19 runs of 640M through a 256M limit; the trash's
                        // userfaultfd has no events, so it is a race in the move, not a
                        // queued event). Both pass; a slot given up instead is lost for
                        // good, resident and uncharged, and once every 4 KiB slot was
                        // lost a swap-in waited for one forever.
                        if matches!(err.errno, libc::EBUSY | libc::EAGAIN) && tries < EMPTY_TRIES {
                            tries += 1;
                            self.retries.fetch_add(1, Ordering::Relaxed);
                            std::thread::yield_now();
                            continue;
                        }
                        if !(err.errno == libc::EEXIST && self.moved_anyway(dst + moved, src + moved)) {
                            *used = at + moved;
                            return Err(io::Error::from_raw_os_error(err.errno));
                        }
                        moved += PAGE_SIZE;
                    }
                }
            }
            *used = at + piece;
            done += piece;
            if *used == TRASH_BYTES {
                // Full: free it now rather than at the next use, so that at most one
                // slot's worth of small pieces waits there uncharged.
                madvise(trash.base, TRASH_BYTES, libc::MADV_DONTNEED)?;
                *used = 0;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::uffd::FEATURE_MOVE;
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::sync::atomic::AtomicBool;

    /// A long-term pin of user pages, as the O_DIRECT read that fills a staging slot holds
    /// for a moment: an io_uring with the range registered as a fixed buffer. Unpinned
    /// when dropped.
    struct Pin {
        ring: OwnedFd,
    }

    const IORING_REGISTER_BUFFERS: libc::c_long = 0;
    const IORING_UNREGISTER_BUFFERS: libc::c_long = 1;

    impl Pin {
        fn new(addr: usize, len: usize) -> Pin {
            // struct io_uring_params: 120 bytes the kernel fills in.
            let mut params = [0u64; 15];
            // SAFETY: io_uring_setup writes at most sizeof(struct io_uring_params), 120
            // bytes, into `params`.
            let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1, params.as_mut_ptr()) };
            assert!(
                fd >= 0,
                "io_uring_setup failed ({}): this test pins a page with an io_uring fixed buffer; \
                 enable io_uring (sysctl kernel.io_uring_disabled=0) to run it",
                io::Error::last_os_error()
            );
            // SAFETY: `fd` was just returned by io_uring_setup and is owned by nobody else.
            let ring = unsafe { OwnedFd::from_raw_fd(fd as i32) };
            let iov = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: len };
            // SAFETY: the kernel reads one iovec and pins the pages it names, which stay
            // mapped for the test's duration.
            let r = unsafe { libc::syscall(libc::SYS_io_uring_register, fd, IORING_REGISTER_BUFFERS, &iov, 1) };
            assert_eq!(r, 0, "registering a fixed buffer (a pin) failed: {}", io::Error::last_os_error());
            Pin { ring }
        }
    }

    impl Drop for Pin {
        fn drop(&mut self) {
            use std::os::fd::AsRawFd;
            // SAFETY: unregistering takes no argument; it unpins the pages at once.
            let r = unsafe { libc::syscall(libc::SYS_io_uring_register, self.ring.as_raw_fd(), IORING_UNREGISTER_BUFFERS, 0, 0) };
            assert_eq!(r, 0, "unregistering the fixed buffer failed: {}", io::Error::last_os_error());
        }
    }

    fn move_mode_staging(reserve_bytes: usize) -> Staging {
        let open = |features| {
            Uffd::open(features).unwrap_or_else(|e| panic!("this test needs a userfaultfd with UFFDIO_MOVE (root, 6.8+): {e:?}"))
        };
        Staging::new(open(FEATURE_MOVE), Some(open(FEATURE_MOVE)), reserve_bytes, HUGE_SIZE).expect("staging")
    }

    /// A thread that finds every slot out sleeps until one comes back and is woken by
    /// it: a slot given back wakes a thread only where one counted itself waiting, so a
    /// waiter not counted would sleep on.
    #[test]
    fn a_thread_waiting_for_a_slot_is_woken_when_one_comes_back() {
        let staging = move_mode_staging(0);
        let memcg = MemCg::new(None, false);
        let order = FolioSize::K4.order();
        let out: Vec<Slot> = (0..slots_for(FolioSize::K4)).map(|_| staging.take_hole(order, &memcg).unwrap()).collect();
        let area = staging.areas[order as usize].get().unwrap();
        let (staging, memcg) = (&staging, &memcg);
        std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::channel();
            s.spawn(move || tx.send(staging.take_hole(order, memcg).unwrap()).unwrap());
            // Give one back only once the taker sleeps, so that only the wake can free it.
            while area.free.lock().unwrap().waiting == 0 {
                std::thread::yield_now();
            }
            staging.put_hole(out[7]);
            let got = rx.recv_timeout(std::time::Duration::from_secs(120));
            if got.is_err() {
                // Let the taker go, so that the test fails instead of hanging in the join.
                area.available.notify_all();
            }
            assert_eq!(got.expect("the waiting thread was never woken"), out[7]);
        });
        assert_eq!(area.free.lock().unwrap().waiting, 0);
    }

    /// A filled 4 KiB slot given back past the reserve is emptied into the trash; while
    /// its page is still pinned (the O_DIRECT read that filled it not yet unpinned) the
    /// move fails with EBUSY. It must wait for the pin and come back as a hole: once
    /// every slot was lost that way, a swap-in waited for one forever (a CI hang).
    #[test]
    fn a_slot_emptied_while_pinned_waits_for_the_pin_and_is_not_lost() {
        let staging = move_mode_staging(0);
        let memcg = MemCg::new(None, false);
        let page = FolioSize::K4.order();
        let kept = staging.take_filled(page).unwrap().slot;
        let pinned = staging.take_filled(page).unwrap().slot;
        for slot in [kept, pinned] {
            // SAFETY: both slots are ours until put back.
            unsafe { staging.slice_mut(slot) }.fill(0xA5);
        }
        // The first fills the (empty) reserve; the second is past it and must be emptied.
        staging.put_filled(kept, false, &memcg);
        let pin = Pin::new(staging.addr(pinned), PAGE_SIZE);
        let returned = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                // Unpin only once the emptying has met the pin (or given up: then the
                // assertions below fail).
                while staging.retries.load(Ordering::Relaxed) == 0 && !returned.load(Ordering::Relaxed) {
                    std::thread::yield_now();
                }
                drop(pin);
            });
            staging.put_filled(pinned, false, &memcg);
            returned.store(true, Ordering::Relaxed);
        });
        assert!(staging.retries.load(Ordering::Relaxed) > 0, "emptying never met the pinned page");
        let area = staging.areas[page as usize].get().unwrap();
        assert!(area.free.lock().unwrap().holes.contains(&pinned.index), "the pinned slot was lost, not made a hole again");
        assert_eq!(staging.pagemap.present_bytes(staging.addr(pinned), PAGE_SIZE).unwrap(), 0, "the hole still has its page");
        assert_eq!(memcg.get(Component::StagingFree), PAGE_SIZE as u64, "only the kept slot is charged");
    }
}
