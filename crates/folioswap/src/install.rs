//! Every page the engine puts into a region or takes out of one goes through [`transfer`]:
//! the one place that knows how the kernel's UFFDIO_MOVE and UFFDIO_COPY answer, and
//! what to do about each answer.
//!
//! - `EEXIST`: a COPY found the page present already (a zap raced an earlier install, or
//!   an earlier try copied it): step over it. A MOVE on this kernel can fail with EEXIST
//!   for a page it *did* move (it retries a page internally and then finds its own work
//!   at the destination): step over it when pagemap shows the move happened.
//! - `EBUSY`: the kernel could not take the page now (shared after fork, pinned by
//!   O_DIRECT, a large folio it cannot split this instant): the caller's `on_busy`
//!   decides whether to retry (after a yield) or stop.
//! - `EAGAIN`: an event is queued on the region's userfaultfd and unread (every transfer
//!   is issued on it, a move out into staging too: see `staging.rs`): stop, so that the
//!   caller drops the gate and pumps events (`gate::pump_events`).
//! - `ENOENT`/`EINVAL`/`EFAULT`: the range is not mapped (any more).
//!
//! On top of it, the installs of the fault path and of a put-back ([`install_slot`],
//! [`install_move`], [`install_copy`], [`install_zero`]) hold the gate shared, check
//! the folio's PENDING flag, and find the folio's address, so that no install lands on a
//! folio an event is changing.

use crate::folio::PENDING;
use crate::gate::pump_events;
use crate::mm::Mm;
use crate::size::{FolioSize, PAGE_SIZE};
use crate::staging::Slot;
use crate::table::FolioTable;
use crate::uffd::InstallMode;
use crate::uffd::IoctlError;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

/// Zeros to copy from for first touches of folios up to 1 MiB (2 MiB ones are moved in
/// from a kernel-zeroed THP instead).
static ZERO: [u8; 1 << 20] = [0; 1 << 20];

/// Which ioctl, in which direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transfer {
    /// UFFDIO_MOVE of staging pages into a region; `wake` wakes threads waiting there.
    MoveIn { wake: bool },
    /// UFFDIO_COPY into a region; `wake` wakes threads waiting there.
    CopyIn { wake: bool },
    /// UFFDIO_MOVE of a region's pages out into a staging slot (eviction), issued on the
    /// region's userfaultfd like the others (`staging.rs` says why).
    MoveOut,
}

/// Why a transfer stopped short; the bytes before `done` were transferred, `present` of
/// their pages by stepping over a page a COPY found mapped already.
#[derive(Debug)]
pub(crate) struct Halt {
    pub done: usize,
    pub present: usize,
    pub why: HaltReason,
}

#[derive(Debug)]
pub(crate) enum HaltReason {
    /// An event is queued and unread on the region's userfaultfd.
    EventQueued,
    /// `on_busy` gave up on a busy page.
    Busy,
    /// The range is not mapped (ENOENT, EINVAL, EFAULT).
    Unmapped,
    /// Any other refusal.
    Failed(IoctlError),
}

/// Move or copy `[src + done, src + len)` to `[dst + done, dst + len)`, advancing `done`,
/// by the rules in the module comment. `on_busy(done, times, errno)` is asked at each busy
/// answer (`times`: how often in a row at this page before) whether to retry. Done, it
/// says how many pages a COPY stepped over because they were mapped already.
pub(crate) fn transfer(
    mm: &Mm,
    how: Transfer,
    dst: usize,
    src: usize,
    len: usize,
    done: &mut usize,
    on_busy: &mut dyn FnMut(usize, u32, i32) -> bool,
) -> Result<usize, Halt> {
    let (mut busy_at, mut busy_times) = (usize::MAX, 0u32);
    let mut present = 0;
    while *done < len {
        let (d, s, n) = (dst + *done, src + *done, len - *done);
        let result = match how {
            Transfer::MoveIn { wake } => mm.uffd.move_pages(d, s, n, wake),
            Transfer::CopyIn { wake } => mm.uffd.copy(d, s as *const u8, n, wake),
            Transfer::MoveOut => mm.uffd.move_pages(d, s, n, false),
        };
        let Err(err) = result else {
            *done = len;
            return Ok(present);
        };
        *done += err.done;
        let halt = |why| Err(Halt { done: *done, present, why });
        let errno = err.errno;
        match (errno, how) {
            (libc::EEXIST, Transfer::CopyIn { .. }) => {
                *done += PAGE_SIZE;
                present += 1;
            }
            (libc::EEXIST, _) if mm.staging.moved_anyway(dst + *done, src + *done) => *done += PAGE_SIZE,
            (libc::EAGAIN, _) => return halt(HaltReason::EventQueued),
            (libc::EBUSY, _) => {
                busy_times = if busy_at == *done { busy_times + 1 } else { 0 };
                busy_at = *done;
                if !on_busy(*done, busy_times, errno) {
                    return halt(HaltReason::Busy);
                }
                std::thread::yield_now();
            }
            (libc::ENOENT | libc::EINVAL | libc::EFAULT, _) => return halt(HaltReason::Unmapped),
            _ => return halt(HaltReason::Failed(err)),
        }
    }
    *done = len.min(*done);
    Ok(present)
}

/// Retry busy pages for as long as they stay busy: installs wait for the kernel.
pub(crate) fn always_retry(_: usize, _: u32, _: i32) -> bool {
    true
}

/// How an install placed the folio.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Installed {
    /// The slot's pages were moved into the region: the slot is a hole now.
    Moved,
    /// The slot's contents were copied: the slot still holds its pages, for reuse.
    Copied,
    /// Copied (copy mode), then made one THP by MADV_COLLAPSE.
    Collapsed,
}

impl Installed {
    /// Whether the folio is one THP in the region now, given whether its staging slot
    /// held one.
    pub fn thp(self, staged_huge: bool) -> bool {
        match self {
            Installed::Moved => staged_huge,
            Installed::Copied => false,
            Installed::Collapsed => true,
        }
    }
}

/// Why an install did not happen.
#[derive(Debug)]
pub(crate) enum InstallError {
    /// An event is pending on the folio: apply it, then retry.
    Pending,
    /// The folio's address range is gone (or split across mappings).
    Unmapped,
    /// The kernel refused for another reason.
    Failed { op: &'static str, addr: usize, len: usize, err: Option<IoctlError> },
}

impl fmt::Display for InstallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InstallError::Pending => write!(f, "an event is pending on the folio"),
            InstallError::Unmapped => write!(f, "the folio's range is no longer mapped"),
            InstallError::Failed { op, addr, len, err: Some(err) } => write!(f, "{op} into {addr:#x} ({len} bytes) failed: {err}"),
            InstallError::Failed { op, addr, len, err: None } => write!(f, "{op} into {addr:#x} ({len} bytes) failed"),
        }
    }
}

/// Put the folio in `slot` in its place in the region. 2 MiB folios move in (and arrive
/// as THPs); smaller ones are copied: a MOVE clears the source PTEs and so flushes the
/// TLB of every CPU the process runs on, an inter-processor interrupt that is a VM exit
/// here, while COPY leaves the slot mapped and filled for the next decompression, at
/// about 1 µs per 4 KiB. In copy mode a 2 MiB folio is copied too (as 4 KiB pages, all
/// UFFDIO_COPY makes) and then collapsed into a THP.
pub(crate) fn install_slot(mm: &Mm, table: &FolioTable, head: usize, folio: FolioSize, slot: Slot) -> Result<Installed, InstallError> {
    if !folio.is_huge() {
        return install_copy(mm, table, head, folio, mm.staging.addr(slot)).map(|()| Installed::Copied);
    }
    if mm.install == InstallMode::Copy {
        install_copy(mm, table, head, folio, mm.staging.addr(slot))?;
        return Ok(if collapse(mm, table, head, folio) { Installed::Collapsed } else { Installed::Copied });
    }
    install_move(mm, table, head, folio, slot).map(|()| Installed::Moved)
}

/// Make the 2 MiB folio at `head`, just copied in as 4 KiB pages, one THP with
/// MADV_COLLAPSE (Linux 6.1+; where the kernel refuses the advice it is not asked again).
/// Under the gate with no event pending, so the range is the folio's; the kernel itself
/// refuses a range with a missing or write-protected page of a userfaultfd region, so
/// a collapse never fills a hole the program made.
fn collapse(mm: &Mm, table: &FolioTable, head: usize, folio: FolioSize) -> bool {
    static UNSUPPORTED: AtomicBool = AtomicBool::new(false);
    if UNSUPPORTED.load(Ordering::Relaxed) {
        return false;
    }
    let _gate = mm.gate.read().unwrap();
    if table.entry(head).load().has(PENDING) {
        return false;
    }
    let Some(addr) = table.folio_addr(head, folio.pages()) else {
        return false;
    };
    // SAFETY: the range is the folio's, resident and locked by the caller; COLLAPSE
    // changes how it is mapped, not what it holds.
    if unsafe { crate::sys::madvise(addr as *mut libc::c_void, folio.bytes(), crate::sys::MADV_COLLAPSE) } == 0 {
        mm.counters.vm.thp_collapse_alloc.inc();
        return true;
    }
    if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
        UNSUPPORTED.store(true, Ordering::Relaxed);
    }
    mm.counters.vm.thp_collapse_alloc_failed.inc();
    false
}

/// Move the folio's pages from `slot` into the region.
fn install_move(mm: &Mm, table: &FolioTable, head: usize, folio: FolioSize, slot: Slot) -> Result<(), InstallError> {
    install(mm, table, head, folio, Transfer::MoveIn { wake: false }, mm.staging.addr(slot)).map(drop)
}

/// Copy `folio.bytes()` from `src` into the folio's place.
pub(crate) fn install_copy(mm: &Mm, table: &FolioTable, head: usize, folio: FolioSize, src: usize) -> Result<(), InstallError> {
    install(mm, table, head, folio, Transfer::CopyIn { wake: false }, src).map(drop)
}

/// Copy zeros into a folio's place from `zeros` ([`zero_page`] below 2 MiB, a zeroed
/// staging slot for a 2 MiB folio, which then arrives as 4 KiB pages): one UFFDIO_COPY.
/// Says how many of its pages were mapped already, which the copy left as they were.
pub(crate) fn install_zero(mm: &Mm, table: &FolioTable, head: usize, folio: FolioSize, zeros: usize) -> Result<usize, InstallError> {
    install(mm, table, head, folio, Transfer::CopyIn { wake: false }, zeros)
}

/// The address of zeros to copy a folio below 2 MiB from.
pub(crate) fn zero_page() -> *const u8 {
    ZERO.as_ptr()
}

/// Under the gate, with no event pending on the folio, at the folio's address now:
/// transfer, pumping events whenever the kernel asks. A copy checks for events before
/// every try (the source keeps its data, so it can stop anywhere); a move only before
/// anything moved (once part of a folio is in, the rest must follow; an event marked
/// meanwhile is applied after, by whoever locks the folio next). Says how many pages a copy
/// found mapped already and stepped over.
fn install(mm: &Mm, table: &FolioTable, head: usize, folio: FolioSize, how: Transfer, src: usize) -> Result<usize, InstallError> {
    let copy = matches!(how, Transfer::CopyIn { .. });
    let (op, len) = (if copy { "UFFDIO_COPY" } else { "UFFDIO_MOVE" }, folio.bytes());
    let (mut done, mut present) = (0, 0);
    loop {
        let gate = mm.gate.read().unwrap();
        if (done == 0 || copy) && table.entry(head).load().has(PENDING) {
            return Err(InstallError::Pending);
        }
        let Some(addr) = table.folio_addr(head, folio.pages()) else {
            return Err(InstallError::Unmapped);
        };
        let halt = match transfer(mm, how, addr, src, len, &mut done, &mut always_retry) {
            Ok(stepped) => return Ok(present + stepped),
            Err(halt) => halt,
        };
        present += halt.present;
        match halt.why {
            HaltReason::EventQueued => {
                drop(gate);
                pump_events(mm);
            }
            HaltReason::Unmapped if halt.done == 0 => return Err(InstallError::Unmapped),
            HaltReason::Failed(err) => return Err(InstallError::Failed { op, addr, len, err: Some(err) }),
            HaltReason::Unmapped | HaltReason::Busy => return Err(InstallError::Failed { op, addr, len, err: None }),
        }
    }
}

/// Wake the threads waiting on a folio, once its state and counters are published
/// (installs do not wake, so that whoever resumes sees the fault accounted); from a fault
/// thread, so that the woken thread stays on its CPU (`local_wake.rs`). Signal mode has
/// nobody waiting.
///
/// Without the gate: a wake changes no memory, and one that an UNMAP or REMAP read
/// meanwhile sends to an address the folio has left only makes whatever waits there
/// fault again.
pub(crate) fn wake_folio(mm: &Mm, table: &FolioTable, target: usize, folio: FolioSize) {
    if mm.config.fault_mode != crate::config::FaultMode::Thread {
        return;
    }
    if let Some(addr) = table.folio_addr(target, folio.pages()) {
        mm.local_wake.wake(&mm.uffd, addr, folio.bytes(), &mm.counters, |slot| mm.pollers.wake_others(slot));
    }
}
