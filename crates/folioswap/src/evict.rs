//! One eviction (the kernel's `shrink_folio_list`), top to bottom:
//! 1. **pick** the coldest evictable folio off the LRU, locked (`pick_victim`);
//! 2. **batch** (folios under 2 MiB): the folios that continue it in the address space,
//!    found among the 32 coldest LRU entries behind it, join it (`extend_batch`), up to
//!    2 MiB; around a 4 KiB victim, the resident pages next to it in its aligned block of
//!    2^`evict_cluster` pages that did not come in lately join it too
//!    (`cluster_neighbours`, counted in `pgsteal_cluster`);
//! 3. **move out** the run with one UFFDIO_MOVE into a staging hole (`move_out`): atomic,
//!    from that instant an access faults and waits on the folio lock (copy mode, without
//!    UFFDIO_MOVE: write-protect, copy out, zap, `copy_out`); then mark each member
//!    SwapCache+WRITEBACK and unlock it;
//! 4. **store** each member (`store_member`, or `store_batch` when file writes go out in
//!    one submission) into the tiers (`tier.rs`) without any lock held;
//! 5. **publish** under the lock again (`finish_eviction` → `publish`), unless a fault
//!    wanted the folio back meanwhile (then the work is dropped and the fault moves the
//!    folio straight back), or **put back** a folio no tier would take (`put_back`): no
//!    data is ever dropped for lack of room;
//! 6. **apply** any event marked on a member while it was stored, once the whole batch
//!    is out of flight (`events::apply_pending_after_store`).
//!
//! One MOVE of a run costs one TLB shootdown where a MOVE per folio costs one each: 256
//! 4 KiB moves took 232 IPIs and 3.2 ms, one 1 MiB move 1 IPI and 41 µs. Runs are
//! appended to one open batch slot (`Staging::take_batch_space`), emptied once it is full
//! and its last member has left (`Staging::end_batch_member`), so that emptying it costs
//! one more shootdown per 2 MiB evicted, not per run; which is also why small folios are
//! installed back by UFFDIO_COPY, leaving the slot's pages put.
//!
//! Random access leaves no runs on the LRU: its coldest pages lie apart, and each one
//! evicted alone cost a shootdown of its own, an IPI to every CPU running the program (a
//! VM exit each here). The cluster is the eviction side of MGLRU's look-around: where the
//! kernel, finding one young page, looks at its neighbours' accessed bits, an eviction
//! here takes the victim's resident neighbours with it, in one MOVE and one shootdown,
//! unless they came in within the last memory_high/16 of evictions (a page just faulted in
//! is the likeliest to be touched again). User space sees no accessed bits, so among the
//! older pages a neighbour is as good a guess as the LRU's next one: on random access
//! the faults did not rise (BENCHMARKS.md, "Evicting a page's neighbours with it").

use crate::addrmap::ADDRESS_MAP;
use crate::config::SwapinPolicy;
use crate::event_queue::Action;
use crate::events::{apply_pending_after_store, apply_pending_locked};
use crate::folio::{Kind, State, HUGE, PENDING, SPLIT, WANTED, WRITEBACK};
use crate::gate::pump_events;
use crate::install::{install_copy, install_slot, transfer, wake_folio, HaltReason, Transfer};
use crate::lru::LruEntry;
use crate::memcg::Component;
use crate::mm::{Mm, Reclaimed};
use crate::own_zaps::{programs_pieces, vma_starts};
use crate::release::{release_after_install, release_staged};
use crate::size::{FolioSize, HUGE_SIZE, PAGE_SIZE};
use crate::stages::{self, Stage};
use crate::staging::Staged;
use crate::table::FolioTable;
use crate::tier::{Evicted, Placed, SwapOutError, WriteBatch};
use crate::uffd::InstallMode;
use crate::written::Harvest;
use crate::zswap::CodecScratch;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// EBUSY/EAGAIN answers in a row at one page before an eviction gives the folio up for now.
const MOVE_BUSY_RETRIES: u32 = 64;

/// Who evicts: counted as `pgsteal_kswapd` or `pgsteal_direct`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reclaimer {
    Kswapd,
    Direct,
}

/// Why a run could not be moved out of its region.
#[derive(Debug, PartialEq, Eq)]
enum MoveOutError {
    /// Busy, pending an event, or unmapped with the event unread: try again later
    /// (the folios go back on the LRU).
    TryLater,
    /// The kernel refused for good: the folios stay where they are, off the LRU.
    Failed,
}

/// A member of a run that left memory: its LRU entry, where it is staged, whether its
/// pages are one THP.
struct Member {
    victim: LruEntry,
    at: Staged,
    huge: bool,
}

/// Evict from the LRU head: one 2 MiB folio, or a batch of smaller ones.
pub(crate) fn shrink_one(mm: &Mm, scratch: &mut CodecScratch, who: Reclaimer) -> Reclaimed {
    let outer = stages::begin();
    let outcome = shrink_one_timed(mm, scratch, who);
    stages::end(outer);
    outcome
}

fn shrink_one_timed(mm: &Mm, scratch: &mut CodecScratch, who: Reclaimer) -> Reclaimed {
    let times = &mm.counters.stages;
    let Some(_active) = mm.reclaim.begin_work(&mm.memcg) else {
        return Reclaimed::Nothing;
    };
    // 1. Pick.
    let (victim, s) = match pick_victim(mm) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let folio = victim.folio();
    if !mm.tiers.can_store(folio.bytes() as u64 / 2) {
        victim.table.entry(victim.page).unlock();
        mm.lru.requeue(victim);
        return Reclaimed::PoolFull;
    }
    // 2. Batch.
    let mut run = vec![(victim, s)];
    let mut neighbours = (0, 0);
    if !folio.is_huge() {
        extend_batch(mm, &mut run, folio);
        if folio == FolioSize::K4 {
            neighbours = cluster_neighbours(mm, &mut run);
        }
    }
    stages::lap(times, Stage::EvictPick);
    // 3. Move out: a 2 MiB folio into a slot of its own, a run of smaller ones into the
    // open batch slot.
    let count = run.len();
    let space = if folio.is_huge() {
        mm.staging.take_hole(folio.order(), &mm.memcg).map(|slot| Staged { slot, page: 0 })
    } else {
        mm.staging.take_batch_space((count * folio.pages()) as u32, count as u32, &mm.memcg)
    };
    let at = match space {
        Ok(at) => at,
        Err(err) => {
            eprintln!("folioswap: no staging for eviction: {err}");
            unlock_run(mm, run, neighbours, true);
            return Reclaimed::Nothing;
        }
    };
    let (table, head) = (run[0].0.table.clone(), run[0].0.page);
    let dst = mm.staging.staged_addr(at);
    let out = match mm.install {
        InstallMode::Move => move_out(mm, &table, head, folio, count, dst),
        InstallMode::Copy => copy_out(mm, &table, head, folio, count, dst),
    };
    if let Err(err) = out {
        // The space is empty again (moved back, or its copy discarded).
        if folio.is_huge() {
            mm.staging.put_hole(at.slot);
        } else {
            (0..count).for_each(|_| mm.staging.end_batch_member(at.slot, 0, &mm.memcg));
        }
        unlock_run(mm, run, neighbours, err == MoveOutError::TryLater);
        return Reclaimed::Busy;
    }
    // A run that fills a whole 2 MiB batch is a stream's, and needs the gap a 2 MiB folio
    // does; any shorter one frees a folio at a time.
    let run_bytes = count * folio.bytes();
    mm.memcg.note_eviction(if run_bytes >= HUGE_SIZE { run_bytes } else { folio.bytes() } as u64);
    let members = into_swap_cache(mm, &table, head, folio, at, run);
    mm.counters.vm.pgsteal_cluster.add((neighbours.0 + neighbours.1) as u64);
    // A large folio goes into the pool as pieces unless its region always swaps in whole.
    let pieced = folio.order() > 0 && table.swapin != SwapinPolicy::Always;
    stages::lap(times, Stage::EvictMoveOut);
    // 4. Store. With a swap file, the members (or split pages) bound for it are written
    // in one submission before any is published; otherwise each member is published as
    // soon as it is stored, so that a fault wanting it back waits for its own store only.
    let mut stored = match mm.tiers.file {
        Some(_) if members.len() > 1 || mm.config.split_swap => store_batch(mm, &members, folio, pieced, scratch),
        _ => Vec::new(),
    }
    .into_iter();
    if stored.len() > 0 {
        stages::lap(times, Stage::EvictStore);
    }
    // 5. Publish or put back. Progress if any member left memory; PoolFull only if the
    // tiers refused them all.
    let mut outcome = Reclaimed::Busy;
    for m in &members {
        let result = stored.next().unwrap_or_else(|| {
            let r = store_member(mm, m.at, folio, pieced, scratch, None);
            stages::lap(times, Stage::EvictStore);
            r
        });
        let finished = finish_eviction(mm, m, folio, result, who);
        stages::lap(times, Stage::EvictPublish);
        match finished {
            Reclaimed::Freed => outcome = Reclaimed::Freed,
            Reclaimed::PoolFull if outcome != Reclaimed::Freed => outcome = Reclaimed::PoolFull,
            _ => {}
        }
        table.evicting.fetch_sub(1, Ordering::AcqRel);
        mm.reclaim.end_store();
    }
    // 6. Apply any event marked on a member while it was stored, the whole batch out of
    // flight (`apply_pending_after_store` says why not at its publish).
    for m in &members {
        apply_pending_after_store(mm, &m.victim.table, m.victim.page, folio);
    }
    outcome
}

/// Written folios one pick sends round again before it takes the next candidate whatever
/// its bits say: the kernel's reclaim too evicts referenced folios when it finds no others.
const MAX_SECOND_CHANCES: usize = 256;

/// Take the coldest evictable folio off the LRU, locked: a folio found written since
/// eviction last looked at it (`written_aging`) goes round the inactive list once more,
/// and onto the active list when found written again, as the kernel's
/// `folio_check_references` treats accessed bits.
fn pick_victim(mm: &Mm) -> Result<(LruEntry, State), Reclaimed> {
    harvest_written_if_due(mm);
    let mut budget = mm.lru.len();
    let mut second_chances = MAX_SECOND_CHANCES;
    let mut busy = false;
    while budget > 0 {
        budget -= 1;
        let Some(v) = mm.lru.pop() else { break };
        if v.table.dead.load(Ordering::Relaxed) {
            continue;
        }
        let e = v.table.entry(v.page);
        let Some(s) = e.try_lock() else {
            mm.lru.requeue(v);
            busy = true;
            continue;
        };
        let current = v.is_current(s);
        if current && !s.has(PENDING) {
            // Read (and clear) the bits even of a folio evicted now: they were its own.
            if written_since_seen(&v) && second_chances > 0 {
                // A folio sent round is still a candidate: it takes none of the budget,
                // which bounds the folios found busy or stale.
                second_chances -= 1;
                budget += 1;
                e.unlock();
                if v.referenced {
                    mm.counters.vm.pgactivate.inc();
                    mm.lru.activate(v);
                } else {
                    mm.counters.vm.pgrotated.inc();
                    mm.lru.requeue(LruEntry { referenced: true, ..v });
                }
                continue;
            }
            return Ok((v, s));
        }
        e.unlock();
        if current {
            // An event is about to change it; look again later.
            mm.lru.requeue(v);
            busy = true;
        }
    }
    Err(if busy { Reclaimed::Busy } else { Reclaimed::Nothing })
}

/// Whether the candidate's pages were found written at a harvest since eviction last
/// looked at it; clears the finding.
fn written_since_seen(v: &LruEntry) -> bool {
    v.table.written.as_ref().is_some_and(|w| w.take(v.page, 1 << v.order))
}

/// Every `interval` evictions, harvest the written bits (`written.rs`). One reclaimer
/// harvests; the others go on.
fn harvest_written_if_due(mm: &Mm) {
    if let Some(harvest) = mm.written.as_ref().filter(|h| h.claim(mm.lru.now())) {
        harvest_written(mm, harvest);
    }
}

/// Read and clear the written bits of every region that has them into the region's map.
fn harvest_written(mm: &Mm, harvest: &Harvest) {
    let mut addr = 0;
    while let Some((start, piece)) = ADDRESS_MAP.next_piece(mm.id, addr) {
        addr = piece.end;
        let Some(map) = &piece.table.written else { continue };
        // A piece unmapped or moved since the lookup fails the scan (EPERM: not
        // registered) or marks another region's pages: either only changes which folio
        // is evicted first.
        let _ = harvest.pagemap.take_written(start, piece.end - start, |lo, hi| {
            map.mark(piece.page + (lo - start) / PAGE_SIZE, (hi - lo) / PAGE_SIZE);
        });
    }
    mm.counters.vm.written_harvest.inc();
}

/// Add to `run` the LRU candidates near the head that follow it in the address space,
/// up to 2 MiB and no more than the watermark gap: one run takes usage at most a gap
/// under the low watermark, whatever the limit.
fn extend_batch(mm: &Mm, run: &mut Vec<(LruEntry, State)>, folio: FolioSize) {
    let max = (HUGE_SIZE as u64).min(mm.memcg.watermark_gap()) as usize / folio.bytes();
    while run.len() < max {
        let (table, next, order) = {
            let last = &run.last().expect("nonempty").0;
            (last.table.clone(), last.page + folio.pages(), last.order)
        };
        let Some(v) = mm.lru.pop_near_front_if(|c| Arc::ptr_eq(&c.table, &table) && c.page == next && c.order == order) else {
            break;
        };
        let e = v.table.entry(v.page);
        match e.try_lock() {
            Some(s) if v.is_current(s) && !s.has(PENDING) => run.push((v, s)),
            Some(s) => {
                // A stale entry (the folio left or came back since) is dropped; a current
                // one with an event pending goes back, as `pick_victim` does, or the folio
                // would stay resident and charged with no LRU entry to evict it by.
                e.unlock();
                if v.is_current(s) {
                    mm.lru.requeue(v);
                }
                break;
            }
            None => {
                mm.lru.requeue(v);
                break;
            }
        }
    }
}

/// Grow the run of 4 KiB folios with the resident pages that adjoin it inside the first
/// member's aligned block of 2^`evict_cluster` pages, forward then back, as long as each
/// next one is evictable now (resident, unlocked, no event pending, a page of its own)
/// and not young. Their LRU entries stay queued, stale once they leave. Returns how many
/// joined before the run and after it.
fn cluster_neighbours(mm: &Mm, run: &mut Vec<(LruEntry, State)>) -> (usize, usize) {
    let block = 1usize << mm.config.evict_cluster;
    if block <= run.len() {
        return (0, 0);
    }
    let table = run[0].0.table.clone();
    let young = mm.memcg.limit.unwrap_or(u64::MAX) / PAGE_SIZE as u64 / 16;
    let start = run[0].0.page & !(block - 1);
    let end = (start + block).min(table.pages);
    let take = |page: usize| -> Option<(LruEntry, State)> {
        // A page of a large folio is a folio of its own only once that folio is split
        // (which is never undone, so reading the flag unlocked is safe).
        let head = page & !(table.folio.pages() - 1);
        if table.folio != FolioSize::K4 && !table.entry(head).load().has(SPLIT) {
            return None;
        }
        let e = table.entry(page);
        let s = e.try_lock()?;
        if s.kind() == Kind::Resident && !s.has(PENDING) && mm.lru.distance_since(e.installed_at()) >= young {
            Some((LruEntry { table: table.clone(), page, order: 0, gen: s.gen(), referenced: false }, s))
        } else {
            e.unlock();
            None
        }
    };
    let mut after = 0;
    while run.len() < block {
        let next = run.last().expect("nonempty").0.page + 1;
        let Some(member) = (next < end).then(|| take(next)).flatten() else { break };
        run.push(member);
        after += 1;
    }
    let mut before = Vec::new();
    let mut first = run[0].0.page;
    while run.len() + before.len() < block && first > start {
        let Some(member) = take(first - 1) else { break };
        first -= 1;
        before.push(member);
    }
    let joined = (before.len(), after);
    if !before.is_empty() {
        before.reverse();
        run.splice(0..0, before);
    }
    joined
}

/// Unlock a run that stays resident; with `requeue`, its members go back on the LRU, but
/// for the `(before, after)` neighbours that joined it from the table, whose own LRU
/// entries are still queued.
fn unlock_run(mm: &Mm, run: Vec<(LruEntry, State)>, (before, after): (usize, usize), requeue: bool) {
    let from_lru = before..run.len() - after;
    for (i, (v, _)) in run.into_iter().enumerate() {
        v.table.entry(v.page).unlock();
        if requeue && from_lru.contains(&i) {
            mm.lru.requeue(v);
        }
    }
}

/// Whether an event is marked against any of the `count` folios from `head` (then the
/// eviction leaves them to whoever applies it).
fn run_has_pending_event(table: &FolioTable, head: usize, folio: FolioSize, count: usize) -> bool {
    (0..count).any(|i| table.entry(head + i * folio.pages()).load().has(PENDING))
}

/// MOVE `count` consecutive folios out of their region into staging at `dst`, under the
/// gate. On failure whatever moved is moved back, so the folios stay whole where they were.
fn move_out(mm: &Mm, table: &Arc<FolioTable>, head: usize, folio: FolioSize, count: usize, dst: usize) -> Result<(), MoveOutError> {
    let gate = mm.gate.read().unwrap();
    if run_has_pending_event(table, head, folio, count) {
        return Err(MoveOutError::TryLater);
    }
    let Some(addr) = table.folio_addr(head, count * folio.pages()) else {
        return Err(MoveOutError::TryLater);
    };
    let len = count * folio.bytes();
    if let Some(hook) = BEFORE_MOVE_OUT.get() {
        hook(addr, len);
    }
    let mut done = 0;
    // MOVE takes only pages this process owns alone; after a fork they are shared with
    // the child until one of the two writes them (and stay marked shared after the child
    // has gone, until the parent writes them): unshare them at the first EBUSY at a page,
    // even if EAGAINs (a folio lock held elsewhere) came first there. Pinned pages
    // (O_DIRECT in flight) or a large folio the kernel cannot split now stay busy: then
    // give the folio up for now and try other folios first.
    let mut unshared_at = usize::MAX;
    let mut on_busy = |at: usize, times: u32, errno: i32| {
        if errno == libc::EBUSY && unshared_at != at {
            unshared_at = at;
            if !break_cow(mm, addr + at, len - at) {
                return false;
            }
        }
        times < MOVE_BUSY_RETRIES
    };
    let Err(halt) = transfer(mm, Transfer::MoveOut, dst, addr, len, &mut done, &mut on_busy) else {
        return Ok(());
    };
    drop(move_back(mm, table, (head, folio), addr, dst, halt.done, gate));
    match halt.why {
        // An event is queued (the region's userfaultfd refuses every move until it is
        // read): read it, since every fault thread may be in direct reclaim waiting for
        // this eviction.
        HaltReason::EventQueued => {
            pump_events(mm);
            Err(MoveOutError::TryLater)
        }
        // ENOENT/EINVAL: the program unmapped (part of) the range and the kernel's UNMAP
        // event is not read yet; the event will drop the folio.
        HaltReason::Busy | HaltReason::Unmapped => Err(MoveOutError::TryLater),
        HaltReason::Failed(err) => {
            eprintln!("folioswap: evicting {len} bytes at {addr:#x} failed: {err}");
            Err(MoveOutError::Failed)
        }
    }
}

/// Copy mode's `move_out`, for kernels without UFFDIO_MOVE: copy `count` consecutive
/// folios out into `slot`, then zap them from the region, losing no write made meanwhile.
/// 1. Under the gate: write-protect the run (a write from now on waits in a userfault),
///    check that every page is mapped (a read of a missing page would fault to this
///    engine while the caller holds the folios' locks), and copy it out through the
///    kernel (`process_vm_readv`: a page unmapped meanwhile ends the copy short instead
///    of killing the process). Count the zap to come on the table (`zapping`), so that a
///    drop of the region waits for it before it gives the addresses back.
/// 2. Without the gate (the zap's REMOVE events must be read, under the gate, before the
///    kernel zaps): write-protect the run once more, then at once `MADV_DONTNEED` it,
///    with the zap registered in `own_zaps` so that its events are not taken for the
///    program's. `MADV_DONTNEED` zaps whatever is mapped at an address, and the kernel
///    lets a program's `munmap` return, and anything be mapped in the hole, once its
///    UNMAP event is read, which may happen as soon as step 1 lets go of the gate. The
///    second write-protect is the zap's licence: UFFDIO_WRITEPROTECT fails with ENOENT
///    where a mapping in the range is not registered for write-protect faults, and with
///    EAGAIN while an event (an UNMAP) is queued, so its success says the run is still
///    the region's an instant before the zap (after an EAGAIN the queue is read and the
///    licence asked again, unless the event marked the run). What is left between the
///    two calls is the window the kernel's own `madvise` has where it drops `mmap_lock`
///    to wait for a REMOVE event to be read.
/// 3. A REMOVE of the program's inside the run, read while the zap ran, came after the
///    copy: zero those pages in the copy, as the program asked.
///
/// A write that waited on the protection faults again on the zapped page and is served
/// once the folio is published. Before the zap every failure gives the run back
/// untouched; its protection is lifted where the kernel still lets us, and a write to a
/// page left protected lifts it itself (`fault::fill_hole`).
fn copy_out(mm: &Mm, table: &FolioTable, head: usize, folio: FolioSize, count: usize, dst: usize) -> Result<(), MoveOutError> {
    let len = count * folio.bytes();
    let addr = {
        let gate = mm.gate.read().unwrap();
        if run_has_pending_event(table, head, folio, count) {
            return Err(MoveOutError::TryLater);
        }
        let Some(addr) = table.folio_addr(head, count * folio.pages()) else {
            return Err(MoveOutError::TryLater);
        };
        if let Err(err) = mm.uffd.writeprotect(addr, len, true) {
            drop(gate);
            return Err(protect_failed(mm, addr, len, err.errno));
        }
        // SAFETY: `dst` is staging space this eviction owns, `len` bytes no reference
        // points into.
        let copied = mm.staging.all_mapped(addr, len) && unsafe { crate::sys::read_own_memory(dst, addr, len) } == len;
        if !copied {
            let _ = mm.uffd.writeprotect(addr, len, false);
            mm.staging.discard(dst, len);
            return Err(MoveOutError::TryLater);
        }
        table.zapping.fetch_add(1, Ordering::AcqRel);
        addr
    };
    let zapped = zap_copied_run(mm, table, head, folio, count, addr, len);
    if zapped.is_err() {
        // Still counted in `zapping`: the addresses are still the region's, or given
        // to nobody yet.
        let _ = mm.uffd.writeprotect(addr, len, false);
    }
    table.zapping.fetch_sub(1, Ordering::AcqRel);
    let pieces = match zapped {
        Ok(pieces) => pieces,
        Err(outcome) => {
            mm.staging.discard(dst, len);
            return Err(outcome);
        }
    };
    let mut starts = None;
    let is_vma_start = |a: usize| starts.get_or_insert_with(vma_starts).contains(&a);
    for (start, end) in programs_pieces(addr, pieces, is_vma_start) {
        // SAFETY: inside the staging space this eviction owns; nothing else references it.
        unsafe { std::ptr::write_bytes((dst + (start - addr)) as *mut u8, 0, end - start) };
    }
    Ok(())
}

/// Tests only (`folioswap::testing::set_before_move_out`): called by an eviction in move
/// mode under the gate, with its run's address and length, right before the MOVE, where a
/// test plays a program thread that unmaps the run and maps something else there.
static BEFORE_MOVE_OUT: std::sync::OnceLock<fn(usize, usize)> = std::sync::OnceLock::new();

/// Install the test hook above, once per process; whether this call installed it.
pub fn set_before_move_out(hook: fn(usize, usize)) -> bool {
    BEFORE_MOVE_OUT.set(hook).is_ok()
}

/// Tests only (`folioswap::testing::set_before_copy_zap`): called by a copy-mode eviction
/// with its run's address and length between the copy and the zap, where a test plays a
/// program thread that changes its mappings at that moment.
static BEFORE_COPY_ZAP: std::sync::OnceLock<fn(usize, usize)> = std::sync::OnceLock::new();

/// Install the test hook above, once per process; whether this call installed it.
pub fn set_before_copy_zap(hook: fn(usize, usize)) -> bool {
    BEFORE_COPY_ZAP.set(hook).is_ok()
}

/// Step 2 of `copy_out`: zap the copied run of `count` folios at `head`, `[addr, addr +
/// len)`, if it is still the region's; the REMOVE pieces read while the zap ran.
fn zap_copied_run(
    mm: &Mm,
    table: &FolioTable,
    head: usize,
    folio: FolioSize,
    count: usize,
    addr: usize,
    len: usize,
) -> Result<Vec<(usize, usize)>, MoveOutError> {
    if let Some(hook) = BEFORE_COPY_ZAP.get() {
        hook(addr, len);
    }
    loop {
        match mm.uffd.writeprotect(addr, len, true) {
            Ok(()) => break,
            // An event is queued, most often another eviction's own zap (a REMOVE): read
            // it. Unless it was the program's and marked this run, the copy still holds
            // (giving it up here cost a sixth of copy mode's 4K random throughput).
            Err(err) if err.errno == libc::EAGAIN => {
                pump_events(mm);
                if run_has_pending_event(table, head, folio, count) {
                    return Err(MoveOutError::TryLater);
                }
            }
            Err(err) => return Err(protect_failed(mm, addr, len, err.errno)),
        }
    }
    let ticket = mm.own_zaps.begin(addr, addr + len);
    // SAFETY: the run is copied out and write-protected, and the write-protect just now
    // found every mapping in it registered and no event queued: its contents may go. A
    // part the program unmapped meanwhile (ENOMEM) is skipped.
    let zapped = unsafe { crate::sys::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTNEED) } == 0;
    let errno = std::io::Error::last_os_error().raw_os_error();
    // The kernel let the zap go on as soon as its events were read; whoever read them
    // holds the gate until it has handed them to `own_zaps`.
    drop(mm.gate.read().unwrap());
    let pieces = mm.own_zaps.finish(ticket);
    if !zapped && errno != Some(libc::ENOMEM) {
        // The kernel would not zap it (an mlock'ed range, say): pages it kept stay
        // write-protected until a write to one lifts it (`fault::fill_hole`); the copy
        // is what they hold, so the eviction goes on.
        eprintln!(
            "folioswap: zapping {len} bytes at {addr:#x} after copying them out failed: {}",
            std::io::Error::from_raw_os_error(errno.unwrap_or(0))
        );
    }
    Ok(pieces)
}

/// Write-protecting a run for copy mode's eviction failed with `errno`: what becomes of
/// the eviction. Called without the gate.
fn protect_failed(mm: &Mm, addr: usize, len: usize, errno: i32) -> MoveOutError {
    match errno {
        // An event is queued on the region's userfaultfd, and until it is read no
        // write-protect (so no copy-mode eviction) can succeed: read it now, since every
        // fault thread may be in direct reclaim waiting for this eviction.
        libc::EAGAIN => {
            pump_events(mm);
            MoveOutError::TryLater
        }
        // The range changed under us: (part of) it is unmapped, or mapped anew and not
        // the region's; the UNMAP event will drop the folios.
        libc::ENOENT | libc::EINVAL | libc::EFAULT => MoveOutError::TryLater,
        _ => {
            let err = std::io::Error::from_raw_os_error(errno);
            eprintln!("folioswap: write-protecting {len} bytes at {addr:#x} for eviction failed: {err}");
            MoveOutError::Failed
        }
    }
}

/// What `move_back` has made of one page moved out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fate {
    Undecided,
    Back,
    /// Stays out of the region: it is emptied from staging.
    Out,
}

/// Undo the first `done` bytes of a `move_out` of the run of `folio`s from `head` at
/// `addr`: move them back from `dst`, under the gate (taken as `gate`, handed back). While
/// an event is queued the kernel refuses (EAGAIN): then read the queue without the gate,
/// and leave out the pages an event marked on the run now removes or unmaps, since the
/// kernel zaps what the program asked as soon as its event is read and a page moved back
/// after that would bring old data back. What does not go back is emptied from staging.
fn move_back<'m>(
    mm: &'m Mm,
    table: &Arc<FolioTable>,
    (head, folio): (usize, FolioSize),
    addr: usize,
    dst: usize,
    done: usize,
    gate: std::sync::RwLockReadGuard<'m, ()>,
) -> std::sync::RwLockReadGuard<'m, ()> {
    let mut fate = vec![Fate::Undecided; done / PAGE_SIZE];
    let mut gate = gate;
    while move_undecided_back(mm, addr, dst, &mut fate) {
        drop(gate);
        pump_events(mm);
        gate = mm.gate.read().unwrap();
        for f in 0..fate.len().div_ceil(folio.pages()) {
            let at = head + f * folio.pages();
            if !table.entry(at).load().has(PENDING) {
                continue;
            }
            let actions = mm.events.actions(table, at, folio).pages;
            for (page, action) in (f * folio.pages()..fate.len()).zip(actions) {
                if action != Action::Keep && fate[page] == Fate::Undecided {
                    fate[page] = Fate::Out;
                }
            }
        }
    }
    for (start, end) in runs_of(&fate, Fate::Out) {
        mm.staging.discard(dst + start * PAGE_SIZE, (end - start) * PAGE_SIZE);
    }
    gate
}

/// Move the undecided pages of `fate` back from `dst` to `addr`, deciding each; whether an
/// event queued stopped it (then some may still be undecided). A page the kernel will not
/// take back (unmapped meanwhile: its UNMAP event drops the folio) stays out.
fn move_undecided_back(mm: &Mm, addr: usize, dst: usize, fate: &mut [Fate]) -> bool {
    for (start, end) in runs_of(fate, Fate::Undecided) {
        let (at, from, len) = (addr + start * PAGE_SIZE, dst + start * PAGE_SIZE, (end - start) * PAGE_SIZE);
        let mut done = 0;
        loop {
            let first = start + done / PAGE_SIZE;
            let result = transfer(mm, Transfer::MoveIn { wake: true }, at, from, len, &mut done, &mut |_, _, _| false);
            let page = start + done / PAGE_SIZE;
            fate[first..page.min(end)].fill(Fate::Back);
            let Err(halt) = result else { break };
            match halt.why {
                HaltReason::EventQueued => return true,
                HaltReason::Unmapped => {}
                why => eprintln!("folioswap: moving page {:#x} back after a failed eviction: {why:?}", addr + page * PAGE_SIZE),
            }
            fate[page] = Fate::Out;
            done += PAGE_SIZE;
            if done >= len {
                break;
            }
        }
    }
    false
}

/// The runs `[start, end)` of consecutive pages whose fate is `which`.
fn runs_of(fate: &[Fate], which: Fate) -> Vec<(usize, usize)> {
    let mut runs = Vec::new();
    let mut p = 0;
    while p < fate.len() {
        if fate[p] != which {
            p += 1;
            continue;
        }
        let end = (p..fate.len()).find(|&q| fate[q] != which).unwrap_or(fate.len());
        runs.push((p, end));
        p = end;
    }
    runs
}

/// Give this process its own copy of the pages in `[addr, addr + len)` (the kernel's
/// copy on write, as if the program wrote them), so that MOVE may take them. Only when
/// every page is present: a missing one would fault to this engine while the caller
/// holds the folio's lock.
fn break_cow(mm: &Mm, addr: usize, len: usize) -> bool {
    if !mm.staging.all_present(addr, len) {
        return false;
    }
    mm.counters.vm.cow_unshare.inc();
    // SAFETY: the range lies in a live region (the caller holds the gate and the folios'
    // locks) and is fully present; POPULATE_WRITE changes no contents.
    unsafe { crate::sys::madvise(addr as *mut libc::c_void, len, crate::sys::MADV_POPULATE_WRITE) == 0 }
}

/// The run is in staging from `first` on: advance the eviction clock, and make each member
/// SwapCache under WRITEBACK (its copy being stored), charged as swap cache, unlocked.
fn into_swap_cache(mm: &Mm, table: &FolioTable, head: usize, folio: FolioSize, first: Staged, run: Vec<(LruEntry, State)>) -> Vec<Member> {
    let pages = folio.pages();
    let clock = mm.lru.tick((run.len() * pages) as u32);
    mm.reclaim.begin_store(run.len());
    table.evicting.fetch_add(run.len(), Ordering::AcqRel);
    let first_addr = mm.ra.log.as_ref().and_then(|_| table.folio_addr(head, run.len() * pages));
    let mut members = Vec::with_capacity(run.len());
    for (i, (victim, s)) in run.into_iter().enumerate() {
        let e = victim.table.entry(victim.page);
        let at = Staged { slot: first.slot, page: first.page + (i * pages) as u32 };
        let evicted_at = clock.wrapping_add((i * pages) as u32);
        e.set_evicted_at(evicted_at);
        if let (Some(log), Some(addr)) = (&mm.ra.log, first_addr) {
            log.record(evicted_at, addr + i * folio.bytes());
        }
        e.set_handle(at.to_raw());
        e.set_locked(s.with_kind(Kind::SwapCache).with(WRITEBACK, true));
        mm.memcg.transfer(Component::Resident, Component::SwapCache, folio.bytes() as u64);
        e.unlock();
        members.push(Member { victim, at, huge: folio.is_huge() && s.has(HUGE) });
    }
    members
}

/// Store the members of an eviction batch, queueing their file writes and issuing them
/// in one submission.
fn store_batch(
    mm: &Mm,
    members: &[Member],
    folio: FolioSize,
    pieced: bool,
    scratch: &mut CodecScratch,
) -> Vec<Result<Vec<Placed>, SwapOutError>> {
    let mut batch = WriteBatch::new();
    let mut spans = Vec::with_capacity(members.len());
    let mut results = Vec::with_capacity(members.len());
    for m in members {
        let start = batch.len();
        results.push(store_member(mm, m.at, folio, pieced, scratch, Some(&mut batch)));
        spans.push(start..batch.len());
    }
    mm.tiers.write_batch(&batch, &spans, &mut results, &mm.counters);
    results
}

/// Store a staged folio: whole, or (split mode) as independent 4 KiB pages. File writes
/// go to `batch` when given (see `store_batch`).
fn store_member<'a>(
    mm: &'a Mm,
    at: Staged,
    folio: FolioSize,
    pieced: bool,
    scratch: &mut CodecScratch,
    mut batch: Option<&mut WriteBatch<'a>>,
) -> Result<Vec<Placed>, SwapOutError> {
    // SAFETY: the folio is SwapCache+WRITEBACK with this staged copy: nothing moves its
    // pages away or writes them until finish_eviction takes the lock again.
    let data: &[u8] = unsafe { mm.staging.staged_slice(at, folio.bytes()) };
    if !(mm.config.split_swap && folio.order() > 0) {
        return mm.tiers.store(Evicted { data, folio, pieced }, scratch, batch, &mm.counters, &mm.reclaim);
    }
    let mut placed = Vec::with_capacity(folio.pages());
    let queued = batch.as_ref().map_or(0, |b| b.len());
    for page in data.chunks(PAGE_SIZE) {
        let page = Evicted { data: page, folio: FolioSize::K4, pieced: false };
        match mm.tiers.store(page, scratch, batch.as_deref_mut(), &mm.counters, &mm.reclaim) {
            Ok(p) => placed.extend(p),
            Err(err) => {
                // Unqueue this folio's writes before its slots are freed.
                if let Some(b) = batch.as_deref_mut() {
                    b.truncate(queued);
                }
                mm.tiers.free_placed(&placed, FolioSize::K4);
                return Err(err);
            }
        }
    }
    Ok(placed)
}

/// Publish a member's store under the folio lock, or give the work up.
fn finish_eviction(mm: &Mm, m: &Member, folio: FolioSize, result: Result<Vec<Placed>, SwapOutError>, who: Reclaimer) -> Reclaimed {
    let (table, head, at, huge) = (&m.victim.table, m.victim.page, m.at, m.huge);
    let e = table.entry(head);
    let s = e.lock();
    let ours = s.kind() == Kind::SwapCache && s.has(WRITEBACK) && e.handle() == at.to_raw();
    if !ours {
        // Discarded (REMOVE/UNMAP/drop) while we stored it: the staged copy and its
        // charge are ours to release.
        e.unlock();
        if let Ok(placed) = &result {
            mm.tiers.free_placed(placed, folio);
        }
        release_staged(mm, at, folio, huge);
        return Reclaimed::Freed;
    }
    if s.has(WANTED) {
        // A fault wants it back: drop the work; the fault moves the folio back in.
        if let Ok(placed) = &result {
            mm.tiers.free_placed(placed, folio);
        }
        e.set_locked(s.with(WRITEBACK, false));
        e.clear_locked(WANTED);
        e.unlock();
        return Reclaimed::Busy;
    }
    let Ok(placed) = result else {
        // Nowhere to put it (the reason is counted where it was found).
        put_back(mm, table, head, folio, at, huge);
        e.unlock();
        return Reclaimed::PoolFull;
    };
    #[cfg(test)]
    tests::BEFORE_PUBLISH.with(|hook| hook.take().map(|hook| hook(mm)));
    publish(mm, table, head, folio, s, &placed);
    let pages = folio.pages() as u64;
    match who {
        Reclaimer::Direct => mm.counters.vm.pgsteal_direct.add(pages),
        Reclaimer::Kswapd => mm.counters.vm.pgsteal_kswapd.add(pages),
    }
    e.unlock();
    release_staged(mm, at, folio, huge);
    mm.memcg.note_overrun(mm.tiers.pool_bytes());
    Reclaimed::Freed
}

/// Publish where a locked folio's data went, as its new state: one entry for the folio,
/// or one per 4 KiB page, after which the folio is split. `s` is the state the folio had
/// when locked. Used by eviction and by pool writeback.
pub(crate) fn publish(mm: &Mm, table: &Arc<FolioTable>, head: usize, folio: FolioSize, s: State, placed: &[Placed]) {
    if placed.len() > 1 {
        return publish_split(mm, table, head, folio, placed);
    }
    let kind = mm.tiers.record(table, head, folio, s.gen(), placed[0], &mm.counters);
    table.entry(head).set_locked(s.with_kind(kind).with(WRITEBACK, false).with(HUGE, false));
}

/// The folio went out as 4 KiB pages (split mode, or no contiguous run on the swap
/// file): each page becomes an order-0 folio with its own entry. Done under the gate so
/// that no event is marked against the unsplit folio meanwhile.
fn publish_split(mm: &Mm, table: &Arc<FolioTable>, head: usize, folio: FolioSize, placed: &[Placed]) {
    let _gate = mm.gate.read().unwrap();
    table.split_into_pages(head, placed.len(), |i, ps, clock| {
        let kind = mm.tiers.record(table, head + i, FolioSize::K4, ps.gen(), placed[i], &mm.counters);
        (ps.with_kind(kind).with(WRITEBACK, false).with(HUGE, false), clock.wrapping_add(i as u32))
    });
    let sc = mm.counters.size(folio);
    sc.split.inc();
    sc.swpout_fallback.inc();
    if folio.is_huge() {
        mm.counters.vm.thp_swpout_fallback.inc();
        mm.counters.vm.thp_split_page.inc();
    }
}

/// No tier took the folio: put it back into place, resident again (a 2 MiB folio by
/// MOVE from its own slot, a batch member by COPY from its share of the batch slot).
fn put_back(mm: &Mm, table: &Arc<FolioTable>, head: usize, folio: FolioSize, at: Staged, huge: bool) {
    let e = table.entry(head);
    let s = e.load();
    let bytes = folio.bytes() as u64;
    let installed = if folio.is_huge() {
        install_slot(mm, table, head, folio, at.slot).map(|how| {
            mm.memcg.transfer(Component::SwapCache, Component::Resident, bytes);
            release_after_install(mm, at.slot, how, huge);
            how.thp(huge)
        })
    } else {
        install_copy(mm, table, head, folio, mm.staging.staged_addr(at)).map(|()| {
            mm.memcg.charge(Component::Resident, bytes);
            release_staged(mm, at, folio, huge);
            false
        })
    };
    match installed {
        Ok(thp) => {
            e.set_installed_at(mm.lru.now());
            let next = e.set_locked(s.with_kind(Kind::Resident).with(WRITEBACK, false).with(HUGE, thp).next_gen());
            mm.lru.push(table.clone(), head, folio, next.gen(), false);
            // A fault may be waiting (it found WRITEBACK and asked for the folio).
            wake_folio(mm, table, head, folio);
        }
        Err(_) => {
            // An event or unmap got there first: leave it in the swap cache, where the
            // event (or the next fault) finds it.
            e.set_locked(s.with(WRITEBACK, false));
            if e.load().has(PENDING) {
                let _ = apply_pending_locked(mm, table, head, folio);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::folio::LOCKED;
    use crate::writeback::tests::{applied_once_memory_is_back, check_data, run_with_hook};
    use crate::{Config, Engine, RegionOptions};
    use std::cell::Cell;

    /// Wait for the engine's threads to bring about what a test checks next; a minute
    /// without it fails the test with `what`.
    fn wait_until(what: &str, done: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "not within a minute: {what}");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    thread_local! {
        /// Run once, by the next eviction to publish a folio, before it publishes it (the
        /// folio locked, the batch counted in flight); then cleared.
        pub(super) static BEFORE_PUBLISH: Cell<Option<fn(&Mm)>> = const { Cell::new(None) };
    }

    /// With written_aging, a harvest finds exactly the pages written since the one
    /// before (a page mapped since counts as written), and a pick sends those round the
    /// inactive list while it takes the others; found written a second time, they go onto
    /// the active list, and are taken once nothing colder is left.
    #[test]
    fn written_pages_are_sent_round_and_the_others_picked() {
        let config = Config::default().memory_high("64M").unwrap().reclaim_threads(1).no_swap_file().written_aging(true);
        let engine = Engine::new(config).unwrap_or_else(|e| {
            panic!("cannot start the engine (written_aging needs async write-protect, Linux 6.7+, and UFFDIO_MOVE, 6.8+): {e}")
        });
        let mut region = engine.map(16 * PAGE_SIZE, RegionOptions::default().folio_size("4K").unwrap()).unwrap();
        let (mm, table) = (engine.mm(), region.table().clone());
        let harvest = mm.written.as_ref().expect("written_aging is on");
        let map = table.written.as_ref().expect("a region of 4 KiB folios has written bits");
        region.as_mut_slice().iter_mut().step_by(PAGE_SIZE).for_each(|b| *b = 1);
        wait_until("all 16 pages resident", || (0..16).all(|p| table.entry(p).load().kind() == Kind::Resident));
        harvest_written(mm, harvest);
        assert!((0..16).all(|p| map.take(p, 1)), "a page mapped since the last harvest reads as written");

        // Pages 4..8 written, 8..12 only read.
        (4..8).for_each(|p| region.as_mut_slice()[p * PAGE_SIZE + 9] = 2);
        let read: u32 = (8..12).map(|p| region.as_slice()[p * PAGE_SIZE] as u32).sum();
        assert_eq!(read, 4);
        harvest_written(mm, harvest);
        assert_eq!((0..16).filter(|&p| map.is_marked(p)).collect::<Vec<_>>(), (4..8).collect::<Vec<_>>());

        // No helper of the engine's may hold a page's lock during the picks: a page found
        // busy goes back behind the pages sent round, and one of those would then be taken
        // before it (page 10 was, once in 10-20 runs, without this wait).
        let _still = engine.quiesce();
        wait_until("no page locked", || (0..16).all(|p| !table.entry(p).load().has(LOCKED)));
        let pick = || {
            let (v, _) = pick_victim(mm).unwrap_or_else(|r| panic!("no victim: {r:?}"));
            v.table.entry(v.page).unlock();
            v.page
        };
        let sorted = |mut pages: Vec<usize>| {
            pages.sort_unstable();
            pages
        };
        let first = sorted((0..12).map(|_| pick()).collect());
        let states = || (0..16).map(|p| table.entry(p).load().to_string()).collect::<Vec<_>>();
        assert_eq!(first, (0..4).chain(8..16).collect::<Vec<_>>(), "pages now: {:?}", states());
        assert_eq!(mm.counters.vm.pgrotated.get(), 4);

        (4..8).for_each(|p| region.as_mut_slice()[p * PAGE_SIZE + 9] = 3);
        harvest_written(mm, harvest);
        let rest = sorted((0..4).map(|_| pick()).collect());
        assert_eq!(rest, (4..8).collect::<Vec<_>>());
        assert_eq!(mm.counters.vm.pgactivate.get(), 4);
        let expected = |p: usize| (1, if (4..8).contains(&p) { 3 } else { 0 });
        assert!((0..16).all(|p| (region.as_slice()[p * PAGE_SIZE], region.as_slice()[p * PAGE_SIZE + 9]) == expected(p)));
    }

    #[test]
    fn runs_of_finds_each_run_once() {
        use Fate::{Back, Out, Undecided};
        let fate = [Out, Out, Back, Undecided, Out, Back, Back, Out];
        assert_eq!(runs_of(&fate, Out), vec![(0, 2), (4, 5), (7, 8)]);
        assert_eq!(runs_of(&fate, Undecided), vec![(3, 4)]);
        assert!(runs_of(&[], Back).is_empty());
    }

    /// A 4 KiB victim's run grows over the resident pages next to it in its aligned block,
    /// forward then back, and stops at a page that came in lately, one that is not
    /// resident, one locked by someone else, and the block's edge.
    #[test]
    fn a_cluster_takes_the_older_resident_neighbours_in_the_block() {
        let config = Config::default().memory_high("64M").unwrap().reclaim_threads(1).no_swap_file();
        let engine = Engine::new(config).unwrap_or_else(|e| panic!("cannot start the engine: {e}"));
        let mut region = engine.map(64 * PAGE_SIZE, RegionOptions::default().folio_size("4K").unwrap()).unwrap();
        let (mm, table) = (engine.mm(), region.table().clone());
        let young = (64u32 << 20) / PAGE_SIZE as u32 / 16;
        // The clock has moved before the pages come in: they record where it stood.
        mm.lru.tick(3 * young);
        // Pages 0..40 resident, the rest untouched: touched from the top down, since first
        // touches upwards would have the pages above 40 zeroed ahead (`fault.rs` `zero_ahead`).
        region.as_mut_slice()[..40 * PAGE_SIZE].iter_mut().step_by(PAGE_SIZE).rev().for_each(|b| *b = 1);
        // Now and then a page above 40 is zeroed ahead all the same (about 1 run in 70 beside the
        // other tests): discard them, so that they stop a run as untouched or pending pages.
        // SAFETY: inside the live region; DONTNEED only drops those pages.
        let r = unsafe { libc::madvise(region.as_ptr().add(40 * PAGE_SIZE) as *mut libc::c_void, 24 * PAGE_SIZE, libc::MADV_DONTNEED) };
        assert_eq!(r, 0, "madvise(DONTNEED): {}", std::io::Error::last_os_error());
        // The discard reaches the engine as a REMOVE event, which the fault thread marks on
        // those pages after madvise has returned (pages 40 and 41 still read as plain
        // resident pages and joined a run, about 1 run in 40): wait until each is gone or
        // marked.
        wait_until("pages 40..64 discarded or marked pending", || {
            (40..64).all(|p| {
                let s = table.entry(p).load();
                s.kind() != Kind::Resident || s.has(PENDING)
            })
        });
        let victim = |page: usize| {
            let s = table.entry(page).try_lock().expect("nobody holds it");
            assert_eq!(s.kind(), Kind::Resident);
            vec![(LruEntry { table: table.clone(), page, order: 0, gen: s.gen(), referenced: false }, s)]
        };
        let pages = |run: &[(LruEntry, State)]| run.iter().map(|(v, _)| v.page).collect::<Vec<_>>();
        let release = |run: Vec<(LruEntry, State)>| run.into_iter().for_each(|(v, _)| v.table.entry(v.page).unlock());

        // Everything came in just now: nothing joins.
        let mut run = victim(20);
        let joined = cluster_neighbours(mm, &mut run);
        release(run);
        assert_eq!(joined, (0, 0));

        // Once memory_high/16 has been evicted since, the whole block [16, 32) joins, the
        // victim in its place.
        mm.lru.tick(young);
        let mut run = victim(20);
        let (joined, taken) = (cluster_neighbours(mm, &mut run), pages(&run));
        release(run);
        assert_eq!(joined, (4, 11));
        assert_eq!(taken, (16..32).collect::<Vec<_>>());

        // A page that came in lately (22), one locked (18): the run stops at each.
        table.entry(22).set_installed_at(mm.lru.now());
        assert!(table.entry(18).try_lock().is_some());
        let mut run = victim(20);
        let (joined, taken) = (cluster_neighbours(mm, &mut run), pages(&run));
        release(run);
        table.entry(18).unlock();
        assert_eq!(joined, (1, 1));
        assert_eq!(taken, vec![19, 20, 21]);

        // An untouched page stops it too, and the block's edge.
        let mut run = victim(39);
        let (joined, taken) = (cluster_neighbours(mm, &mut run), pages(&run));
        release(run);
        assert_eq!(
            (joined, &taken),
            ((7, 0), &(32..40).collect::<Vec<_>>()),
            "pages now: {:?}",
            (32..48).map(|p| table.entry(p).load().to_string()).collect::<Vec<_>>()
        );
        assert!(region.as_slice()[..40 * PAGE_SIZE].iter().step_by(PAGE_SIZE).all(|&b| b == 1));

        // Off: nothing joins.
        let off = Engine::new(Config::default().memory_high("64M").unwrap().evict_cluster(0).unwrap().no_swap_file()).unwrap();
        let mut other = off.map(16 * PAGE_SIZE, RegionOptions::default().folio_size("4K").unwrap()).unwrap();
        other.as_mut_slice().iter_mut().step_by(PAGE_SIZE).for_each(|b| *b = 1);
        off.mm().lru.tick(1 << 20);
        let t = other.table().clone();
        let s = t.entry(3).try_lock().unwrap();
        let mut run = vec![(LruEntry { table: t.clone(), page: 3, order: 0, gen: s.gen(), referenced: false }, s)];
        let joined = cluster_neighbours(off.mm(), &mut run);
        t.entry(3).unlock();
        assert_eq!(joined, (0, 0));
    }

    /// A run of small folios evicted together stops at the watermark gap (the gap of a
    /// 16M limit with nothing evicted yet is 256K: four 64 KiB folios), so that one
    /// eviction cannot take usage far under the low watermark of a small limit.
    #[test]
    fn a_batch_is_no_longer_than_the_watermark_gap() {
        let config = Config::default().memory_high("16M").unwrap().reclaim_threads(1).no_swap_file();
        let engine = Engine::new(config).unwrap_or_else(|e| panic!("cannot start the engine: {e}"));
        let mut region = engine.map(2 << 20, RegionOptions::default().folio_size("64K").unwrap()).unwrap();
        let mm = engine.mm();
        assert_eq!(mm.memcg.watermark_gap(), 256 << 10);
        // 32 folios, in address order on the LRU: each continues the one before.
        region.as_mut_slice().iter_mut().step_by(64 << 10).for_each(|b| *b = 7);
        let (victim, s) = pick_victim(mm).unwrap_or_else(|_| panic!("no victim on the LRU"));
        assert_eq!(victim.page, 0);
        let mut run = vec![(victim, s)];
        extend_batch(mm, &mut run, FolioSize::K64);
        let heads: Vec<usize> = run.iter().map(|(v, _)| v.page).collect();
        // Unlocked before the check, so that a failure reports instead of hanging the
        // region's teardown on locked folios.
        for (v, _) in run {
            v.table.entry(v.page).unlock();
            mm.lru.requeue(v);
        }
        assert_eq!(heads, vec![0, 16, 32, 48]);
        assert!(region.as_slice().iter().step_by(64 << 10).all(|&b| b == 7));
    }

    /// A run that fills a whole 2 MiB batch is a stream's: it counts as a 2 MiB folio, and
    /// the watermark gap grows from its floor as a 2 MiB stream's does (at 512M).
    #[test]
    fn full_batches_widen_the_gap_as_huge_folios_do() {
        let config = Config::default().memory_high("512M").unwrap().reclaim_threads(1).no_swap_file();
        let engine = Engine::new(config).unwrap_or_else(|e| panic!("cannot start the engine: {e}"));
        let mut region = engine.map(16 << 20, RegionOptions::default().folio_size("64K").unwrap()).unwrap();
        let mm = engine.mm();
        let floor = mm.memcg.watermark_gap();
        assert_eq!(floor, 4 << 20);
        let byte = |i: usize| (i % 251) as u8 | 1;
        region.as_mut_slice().iter_mut().step_by(PAGE_SIZE).enumerate().for_each(|(i, b)| *b = byte(i));
        // A folio zeroed ahead goes on the LRU after it is mapped, so the writer can be done
        // before the last ones are there (the last batch then had 30 folios, about 1 run in
        // 40 beside the other tests): wait until all 256 are.
        wait_until("all 256 folios on the LRU", || mm.lru.len() == (16 << 20) / (64 << 10));
        let mut scratch = CodecScratch::new();
        // Eight runs of 32 contiguous cold folios, oldest first.
        for _ in 0..8 {
            assert_eq!(shrink_one(mm, &mut scratch, Reclaimer::Kswapd), Reclaimed::Freed);
        }
        assert!(mm.memcg.watermark_gap() > 2 * floor, "gap {} after 8 full batches", mm.memcg.watermark_gap());
        // Every byte: the one written in each page, zeros in the rest.
        let bad = region.as_slice().chunks(PAGE_SIZE).enumerate().position(|(i, p)| p[0] != byte(i) || p[1..].iter().any(|&b| b != 0));
        assert_eq!(bad, None, "a page came back wrong");
    }

    /// A folio the pool cannot take is put back where it was, whole: never dropped.
    #[test]
    fn pool_store_failure_keeps_the_folio() {
        let config = Config::default().memory_high("64M").unwrap().max_pool("128K").unwrap().reclaim_threads(1).no_swap_file();
        let engine = Engine::new(config).unwrap_or_else(|e| panic!("cannot start the engine: {e}"));
        let mut region = engine.map(1 << 20, RegionOptions::default().folio_size("64K").unwrap()).unwrap();
        // Incompressible data, so every folio needs a raw 64K object: the pool holds two.
        let mut x = 0x1234_5678_9abc_def0u64;
        let words: Vec<u64> = (0..(1 << 20) / 8)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            })
            .collect();
        for (dst, src) in region.as_mut_slice().chunks_mut(8).zip(&words) {
            dst.copy_from_slice(&src.to_le_bytes());
        }
        let mm = engine.mm();
        let mut scratch = CodecScratch::new();
        let mut outcomes = Vec::new();
        for _ in 0..8 {
            outcomes.push(shrink_one(mm, &mut scratch, Reclaimer::Direct));
        }
        assert!(outcomes.contains(&Reclaimed::Freed), "{outcomes:?}");
        assert!(outcomes.contains(&Reclaimed::PoolFull), "{outcomes:?}");
        let stats = engine.stats();
        assert!(stats.vm.zswap_pool_limit_hit >= 1, "{:?}", stats.vm);
        assert!(stats.memory.pool_total_bytes <= 128 << 10);
        for (i, (got, want)) in region.as_slice().chunks(8).zip(&words).enumerate() {
            assert_eq!(got, &want.to_le_bytes(), "word {i}");
        }
    }

    /// An event marked on a folio while it is stored, with memory_high full and nothing
    /// else to free, where the split must bring the folio back (its region always swaps
    /// in whole, so the pool holds it as one stream): the eviction returns, the folio
    /// keeps the event, and the split is made once memory is back. Before, the publish
    /// applied it with the eviction's batch in flight, and `reserve` waited on that batch
    /// for as long as memory stayed full.
    #[test]
    fn an_event_during_an_eviction_waits_for_memory_not_for_its_batch() {
        let config = Config::default().memory_high("16M").unwrap().no_swap_file();
        let engine = Engine::new(config).unwrap_or_else(|e| panic!("cannot start the engine: {e}"));
        let options = RegionOptions::default().folio_size("64K").unwrap().swapin_enabled(SwapinPolicy::Always);
        let mut region = engine.map(1 << 20, options).unwrap();
        region.as_mut_slice().fill(7);
        let (mm, table) = (engine.mm(), region.table().clone());
        let head = table.head_of(0);
        let freed = run_with_hook(mm, &BEFORE_PUBLISH, region.as_ptr() as usize + PAGE_SIZE, |mm| {
            shrink_one(mm, &mut CodecScratch::new(), Reclaimer::Kswapd)
        });
        assert_eq!(freed, Reclaimed::Freed);
        applied_once_memory_is_back(mm, &table, head, Kind::Pool);
        check_data(&region, 7);
    }
}
