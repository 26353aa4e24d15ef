//! System calls on managed memory when the engine cannot serve the kernel's own faults.
//!
//! The kernel copies to and from the program's memory inside system calls (`read(2)`
//! into a buffer, `write(2)` from one, O_DIRECT's page pinning, a futex word). When such
//! a copy meets a missing page of a region, the fault reaches the engine only in thread
//! mode with a full userfaultfd. With a user-mode-only one ([`UffdMode::UserModeOnly`],
//! all an ordinary user gets where `vm.unprivileged_userfaultfd` is 0) or in signal mode,
//! the kernel gives up instead: the system call fails with EFAULT, or stops short at the
//! page if it had copied something before it.
//!
//! So whoever hands managed memory to the kernel makes it resident first:
//! [`prefault_for_kernel`] touches every page of the managed parts of a buffer in user
//! mode (a volatile read: a read fault installs the whole folio, writable), which is
//! served like the program's own access. Nothing pins the pages afterwards, so one may
//! be evicted again before the kernel gets to it; a call that still fails with EFAULT is
//! made resident again and retried. libfolioswap.so does this around the common I/O
//! calls (`crates/folioswap-preload/src/syscalls.rs`); a program using the library
//! directly does it itself, for the system calls it makes on regions.
//!
//! A read suffices for buffers the kernel writes into: a region is registered for
//! missing pages only, so once a page is mapped the kernel's write to it (even one that
//! must break copy on write after a fork) is an ordinary fault the kernel serves alone.

use crate::addrmap::ADDRESS_MAP;
use crate::config::FaultMode;
use crate::engine::Engine;
use crate::mm::Mm;
use crate::size::PAGE_SIZE;
use crate::uffd::UffdMode;
use std::sync::atomic::Ordering;

/// What [`kernel_buffer_probe`] found in a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelBuffer {
    /// No managed memory the kernel could not fault in itself: pass it to any system call.
    Unaffected,
    /// Some: make it resident first ([`prefault_for_kernel`]).
    NeedsPrefault,
    /// The address map was busy (being written, perhaps by the very thread a signal
    /// handler interrupted); the range was not looked at.
    Unknown,
}

impl Engine {
    /// Which userfaultfd this engine got: `Full`, or `UserModeOnly` where this process
    /// may not have one that handles the kernel's faults (an ordinary user on most
    /// distributions).
    pub fn uffd_mode(&self) -> UffdMode {
        self.mm().uffd.mode()
    }

    /// Whether the faults the kernel takes on this engine's regions inside system calls
    /// are served (thread mode with a full userfaultfd). When false, a system call that
    /// reads or writes a swapped-out or never-touched page of a region fails with EFAULT:
    /// make its buffer resident first with [`prefault_for_kernel`].
    pub fn serves_kernel_faults(&self) -> bool {
        serves_kernel_faults(self.mm())
    }
}

fn serves_kernel_faults(mm: &Mm) -> bool {
    mm.uffd.mode() == UffdMode::Full && mm.config.fault_mode == FaultMode::Thread
}

fn span(addr: *const u8, len: usize) -> (usize, usize) {
    let start = addr as usize;
    (start, start.saturating_add(len))
}

/// Whether `[addr, addr + len)` holds managed memory of an engine (of this process) that
/// does not serve the kernel's faults. Never blocks and allocates nothing, so a signal
/// handler may ask (`Unknown` when the address map is busy).
pub fn kernel_buffer_probe(addr: *const u8, len: usize) -> KernelBuffer {
    let (start, end) = span(addr, len);
    if start == end {
        return KernelBuffer::Unaffected;
    }
    match ADDRESS_MAP.try_any_in(start, end, |mm| !serves_kernel_faults(mm)) {
        Some(true) => KernelBuffer::NeedsPrefault,
        Some(false) => KernelBuffer::Unaffected,
        None => KernelBuffer::Unknown,
    }
}

/// Make the managed parts of `[addr, addr + len)` resident for a system call, where their
/// engine does not serve the kernel's faults: every page is touched in user mode and
/// faults in as the program's own access would (a page that cannot be served fails the
/// way such an access does: SIGBUS, with the reason on stderr). Returns whether the range
/// held any such memory; `false` means an EFAULT from the call is not the engine's.
///
/// `retry`: the call failed with EFAULT after an earlier prefault (a page was evicted in
/// between); counted as `syscall_retry` rather than `syscall_prefault`. May block briefly
/// on the address map; unmapping the range meanwhile is the caller's race, as for any
/// access.
pub fn prefault_for_kernel(addr: *const u8, len: usize, retry: bool) -> bool {
    let (start, end) = span(addr, len);
    if start == end {
        return false;
    }
    let ranges = ADDRESS_MAP.ranges_in(start, end, |mm| !serves_kernel_faults(mm));
    for (lo, hi, mm) in &ranges {
        let vm = &mm.counters.vm;
        if retry {
            vm.syscall_retry.inc();
        } else {
            vm.syscall_prefault.inc();
        }
        let first = lo & !(PAGE_SIZE - 1);
        mm.prefaulting.fetch_add(1, Ordering::Relaxed);
        // A page brought back alone (partial swap-in) may be evicted again while the next
        // ones fault in, where memory_high leaves little resident: touch what is missing
        // again, a few times, so that the whole buffer is resident together.
        for _ in 0..PREFAULT_PASSES {
            let mut page = first;
            let mut touched = false;
            while page < *hi {
                if !is_resident(page) {
                    // SAFETY: `page` lies in a managed mapping (regions are page aligned,
                    // so rounding `lo` down stays inside), readable while it is mapped; a
                    // volatile read of one byte only faults the page in.
                    unsafe { std::ptr::read_volatile(page as *const u8) };
                    touched = true;
                }
                page += PAGE_SIZE;
            }
            if !touched {
                break;
            }
        }
        mm.prefaulting.fetch_sub(1, Ordering::Relaxed);
    }
    !ranges.is_empty()
}

/// Passes `prefault_for_kernel` makes over a buffer at most.
const PREFAULT_PASSES: usize = 8;

/// Whether the page at `addr` is mapped now (`mincore`; an error reads as not).
fn is_resident(addr: usize) -> bool {
    let mut vec = [0u8; 1];
    // SAFETY: mincore reads the page table for one page-aligned page and writes one byte
    // into `vec`; it never faults the page.
    unsafe { libc::mincore(addr as *mut libc::c_void, PAGE_SIZE, vec.as_mut_ptr()) == 0 && vec[0] & 1 != 0 }
}
