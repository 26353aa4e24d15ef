//! SIGBUS kept deliverable and handled in signal mode: the calls that set signal masks and
//! SIGBUS's handler.
//!
//! In signal mode (`FOLIOSWAP_FAULT_MODE=signal`) a thread serves its own faults on
//! managed memory from a SIGBUS handler. The kernel sends a fault's SIGBUS to the faulting
//! thread by force: when the thread blocks SIGBUS, it resets the handler to the default
//! and the process dies (`force_sig_info_to_task`). Programs block signals often: worker
//! threads that block every signal so that one thread takes them all, handlers installed
//! with a full `sa_mask`. So while signal mode is on, these wrappers take SIGBUS out of
//! the set before libc sees it:
//!
//! - `sigprocmask` and `pthread_sigmask` with `SIG_BLOCK` or `SIG_SETMASK`;
//! - `sigaction`'s `sa_mask` for every signal but SIGBUS (a handler may touch managed
//!   memory while it runs).
//!
//! And once the engine's SIGBUS handler is installed, a program's `sigaction(SIGBUS, …)`
//! (Python's `faulthandler`, a crash reporter) does not replace it: the program's handler
//! becomes the one that SIGBUS signals other than managed faults are passed on to, and
//! the program reads back what it set. `signal(SIGBUS, …)` goes through libc's internal
//! sigaction, which no wrapper sees, and still replaces it.
//!
//! A SIGBUS the program raises itself is then never held back; that is the price. Masks
//! set without libc's exported functions (raw `rt_sigprocmask` system calls,
//! `siglongjmp`/`setcontext` restoring a saved mask, a mask inherited through exec) are
//! not seen here; the engine unblocks SIGBUS on the thread that loads the library.
//! Otherwise each wrapper is one relaxed load, then libc.

use libc::{c_int, sigset_t};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::syscalls::{real, resolve};

/// Whether SIGBUS must stay deliverable (signal mode configured).
static SIGNAL_MODE: AtomicBool = AtomicBool::new(false);

/// Signal mode is configured: keep SIGBUS out of masks from now on, and unblock it on
/// this thread (a mask inherited through exec may hold it).
pub fn signal_mode_on() {
    SIGNAL_MODE.store(true, Ordering::Release);
    let unmask = real!(pthread_sigmask: MaskFn);
    // SAFETY: a set built on the stack with sigemptyset/sigaddset; SIG_UNBLOCK of SIGBUS
    // on the calling thread only.
    unsafe {
        let mut set: sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGBUS);
        unmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

fn signal_mode() -> bool {
    SIGNAL_MODE.load(Ordering::Relaxed)
}

type MaskFn = unsafe extern "C" fn(c_int, *const sigset_t, *mut sigset_t) -> c_int;
type SigactionFn = unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int;

/// `set` without SIGBUS, if it blocks SIGBUS and signal mode is on; `None`: pass it as is.
///
/// # Safety
/// `set` is null or points to a readable `sigset_t`.
unsafe fn without_sigbus(how: c_int, set: *const sigset_t) -> Option<sigset_t> {
    if !signal_mode() || set.is_null() || (how != libc::SIG_BLOCK && how != libc::SIG_SETMASK) {
        return None;
    }
    // SAFETY: `set` is non-null and readable (the caller's contract, as libc's).
    let mut copy = unsafe { *set };
    // SAFETY: `copy` is a valid sigset_t on our stack.
    if unsafe { libc::sigismember(&copy, libc::SIGBUS) } != 1 {
        return None;
    }
    // SAFETY: as above.
    unsafe { libc::sigdelset(&mut copy, libc::SIGBUS) };
    Some(copy)
}

/// # Safety
/// As libc's `pthread_sigmask`.
#[no_mangle]
pub unsafe extern "C" fn pthread_sigmask(how: c_int, set: *const sigset_t, old: *mut sigset_t) -> c_int {
    let real = real!(pthread_sigmask: MaskFn);
    // SAFETY: the caller passes what libc's pthread_sigmask accepts.
    unsafe { set_mask(real, how, set, old) }
}

/// # Safety
/// As libc's `sigprocmask`.
#[no_mangle]
pub unsafe extern "C" fn sigprocmask(how: c_int, set: *const sigset_t, old: *mut sigset_t) -> c_int {
    let real = real!(sigprocmask: MaskFn);
    // SAFETY: the caller passes what libc's sigprocmask accepts.
    unsafe { set_mask(real, how, set, old) }
}

/// `real(how, set, old)`, with SIGBUS taken out of `set` where it would be blocked.
///
/// # Safety
/// As `real`'s (libc's pthread_sigmask or sigprocmask).
unsafe fn set_mask(real: MaskFn, how: c_int, set: *const sigset_t, old: *mut sigset_t) -> c_int {
    // SAFETY: the caller's arguments, or a copy of `set` on our stack.
    unsafe {
        match without_sigbus(how, set) {
            Some(copy) => real(how, &copy, old),
            None => real(how, set, old),
        }
    }
}

/// # Safety
/// As libc's `sigaction`.
#[no_mangle]
pub unsafe extern "C" fn sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int {
    let real = real!(sigaction: SigactionFn);
    // SAFETY: the caller passes what libc's sigaction accepts; `act`, when non-null, is
    // readable and `old`, when non-null, writable; the copy lives on our stack for the call.
    unsafe {
        if sig == libc::SIGBUS {
            // Signal mode's handler stays; the program's becomes the one it chains to.
            let action = if act.is_null() { None } else { Some(&*act) };
            if let Some(replaced) = engine::replace_chained_sigbus(action) {
                if !old.is_null() {
                    *old = replaced;
                }
                return 0;
            }
        }
        if signal_mode() && sig != libc::SIGBUS && !act.is_null() && libc::sigismember(&(*act).sa_mask, libc::SIGBUS) == 1 {
            let mut copy = *act;
            libc::sigdelset(&mut copy.sa_mask, libc::SIGBUS);
            return real(sig, &copy, old);
        }
        real(sig, act, old)
    }
}
