//! The CPU a thread of this process faulted on, read from its rseq area without a system
//! call. State only: which threads can be read, and the read; `fault.rs` registers them.
//!
//! glibc (2.35 and later) registers a `struct rseq` for every thread, at `__rseq_offset`
//! from the thread pointer, and the kernel rewrites its `cpu_id` whenever the thread
//! returns to user space on another CPU. A thread blocked in a userfault therefore names
//! the CPU its fault came from, and the fault thread serving it can tell whether it serves
//! from another CPU (`pollers.rs`: the token then follows at once). procfs gives the same
//! answer for about 6 µs a read, too dear to ask at every fault.
//!
//! Only registered threads are read: a thread registers itself (the address of its own
//! `cpu_id`), and its entry must be removed before its thread-local storage is freed
//! (libfolioswap.so does both: at a thread's first call into its allocator, and from a
//! `pthread_key` destructor at its exit). The read takes the registry's read lock, so a
//! removal never interleaves with it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::sync::{OnceLock, RwLock};

type Registry = RwLock<HashMap<u32, usize>>;

/// Registered threads: thread id → address of the thread's `rseq.cpu_id`. Behind a
/// pointer so that a forked child can start a new one: a thread of the parent may have
/// held the lock at the fork, and it does not exist in the child to release it.
static REGISTRY: AtomicPtr<Registry> = AtomicPtr::new(std::ptr::null_mut());

fn registry() -> &'static Registry {
    let current = REGISTRY.load(Ordering::Acquire);
    if !current.is_null() {
        // SAFETY: a registry, once published, is leaked: it lives as long as the process.
        return unsafe { &*current };
    }
    let fresh = Box::into_raw(Box::default());
    match REGISTRY.compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: just published, and leaked from here on.
        Ok(_) => unsafe { &*fresh },
        Err(theirs) => {
            // SAFETY: `fresh` was never published; `theirs` is leaked like any registry.
            unsafe {
                drop(Box::from_raw(fresh));
                &*theirs
            }
        }
    }
}

/// `cpu_id` is the second u32 of `struct rseq` (after `cpu_id_start`).
const CPU_ID_OFFSET: usize = 4;

/// The offset of a thread's rseq area from its thread pointer, where the C library
/// registered one (`__rseq_size` covers `cpu_id`).
fn rseq_offset() -> Option<isize> {
    static OFFSET: OnceLock<Option<isize>> = OnceLock::new();
    *OFFSET.get_or_init(|| {
        // SAFETY: dlsym with a NUL-terminated name; a null result means no such symbol.
        let (offset, size) = unsafe {
            (libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr()), libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr()))
        };
        if offset.is_null() || size.is_null() {
            return None;
        }
        // SAFETY: glibc exports `ptrdiff_t __rseq_offset` and `unsigned int __rseq_size`,
        // written once before any thread starts and constant after.
        let (offset, size) = unsafe { (*(offset as *const isize), *(size as *const u32)) };
        (size as usize >= CPU_ID_OFFSET + 4).then_some(offset)
    })
}

/// The calling thread's thread pointer (the TCB glibc's TLS offsets count from).
fn thread_pointer() -> usize {
    let tp: usize;
    // SAFETY: reads a register (AArch64) or the TCB's self pointer at fs:0 (x86-64, which
    // glibc sets up for every thread before any user code runs); no memory is written.
    unsafe {
        #[cfg(target_arch = "x86_64")]
        std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags));
        #[cfg(target_arch = "aarch64")]
        std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nostack, nomem, preserves_flags));
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        tp = 0; // Never used: `current_cpu_id_addr` gives up first.
    }
    tp
}

/// The address of the calling thread's `rseq.cpu_id`, where glibc registered its rseq
/// area and the kernel filled it in (not -1, unregistered, nor -2, registration failed).
pub(crate) fn current_cpu_id_addr() -> Option<usize> {
    if !cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
        return None;
    }
    let addr = thread_pointer().wrapping_add_signed(rseq_offset()?) + CPU_ID_OFFSET;
    // SAFETY: the calling thread's own rseq area, inside its live TLS block.
    unsafe { read_cpu_id(addr) }.map(|_| addr)
}

/// The CPU in the `rseq.cpu_id` at `addr`; None for -1 (unregistered) and -2
/// (registration failed).
///
/// # Safety
/// `addr` must be a live thread's `rseq.cpu_id`, which the kernel writes: the atomic
/// load reads it whole.
unsafe fn read_cpu_id(addr: usize) -> Option<usize> {
    // SAFETY: the caller's promise.
    let cpu = unsafe { (*(addr as *const AtomicU32)).load(Ordering::Relaxed) };
    (cpu < u32::MAX - 1).then_some(cpu as usize)
}

/// Record that thread `tid`'s `cpu_id` is at `addr`, until [`forget`].
pub(crate) fn register(tid: u32, addr: usize) {
    registry().write().unwrap().insert(tid, addr);
}

/// Thread `tid` is exiting: its rseq area is about to be freed.
pub(crate) fn forget(tid: u32) {
    registry().write().unwrap().remove(&tid);
}

/// In a forked child, which has only the thread that forked: forget every thread, with a
/// new registry (the parent's may have been locked at the fork; it is left unused).
pub(crate) fn forget_all_in_child() {
    let fresh = Box::into_raw(Box::<Registry>::default());
    REGISTRY.store(fresh, Ordering::Release);
}

/// The CPU registered thread `tid` last returned to user space on: for a thread blocked
/// in a fault, the CPU it faulted on. None for a thread not registered.
pub(crate) fn cpu_of(tid: u32) -> Option<usize> {
    // Nobody ever registered (the engine used as a library): no lock to take.
    if REGISTRY.load(Ordering::Relaxed).is_null() {
        return None;
    }
    let registry = registry().read().unwrap();
    let &addr = registry.get(&tid)?;
    // SAFETY: a registered address is that thread's rseq.cpu_id, in its TLS block, which
    // stays allocated until its exit removes the entry; the read lock keeps that removal
    // from interleaving.
    unsafe { read_cpu_id(addr) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gettid() -> u32 {
        // SAFETY: gettid(2) takes no arguments and cannot fail.
        unsafe { libc::gettid() as u32 }
    }

    #[test]
    fn a_registered_thread_reads_the_cpu_it_runs_on() {
        let Some(addr) = current_cpu_id_addr() else {
            panic!("glibc registered no rseq area for this thread (glibc before 2.35, or GLIBC_TUNABLES=glibc.pthread.rseq=0)");
        };
        let tid = gettid();
        assert_eq!(cpu_of(tid), None, "not registered yet");
        register(tid, addr);
        // Pinned to one CPU, the thread returns to user space there: rseq says so. The
        // CPUs tried are the first and last this thread may run on.
        // SAFETY: a zeroed cpu_set_t filled in by the kernel, its size passed.
        let before = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set), 0);
            set
        };
        // SAFETY: CPU_ISSET reads the set within CPU_SETSIZE.
        let allowed = (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &before) }).collect::<Vec<_>>();
        for cpu in [allowed[0], allowed[allowed.len() - 1]] {
            // SAFETY: a zeroed cpu_set_t with one bit set, its size passed.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0);
            }
            std::thread::yield_now();
            assert_eq!(cpu_of(tid), Some(cpu));
        }
        // SAFETY: the set read above, its size passed: the thread may run where it could.
        unsafe { assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &before), 0) };
        forget(tid);
        assert_eq!(cpu_of(tid), None, "forgotten");
    }
}
