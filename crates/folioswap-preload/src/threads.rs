//! The program's threads, made known to the engine's fault threads at their first call
//! into the allocator, and forgotten at their exit: with a thread's rseq area registered
//! (`engine::register_faulting_thread`), the fault thread that serves it reads the
//! CPU it faulted on at every fault, and in thread mode the poll token follows a thread
//! the scheduler moved at its first fault from the other CPU.
//!
//! The exit is seen by a `pthread_key` destructor, which glibc runs before it frees the
//! thread's TLS (where the rseq area is). Signal mode has no poll token: nothing is
//! registered there, nor where the library is linked rather than preloaded.

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// Set by `state::init` when the program's threads are to be registered.
pub static REGISTER_THREADS: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Whether this thread has been looked at (registered, or found unable to be).
    static SEEN: Cell<bool> = const { Cell::new(false) };
}

/// The key whose destructor forgets an exiting thread; None where none could be made.
static EXIT_KEY: OnceLock<Option<libc::pthread_key_t>> = OnceLock::new();

/// From each allocator entry point: register the calling thread the first time.
#[inline]
pub fn note_current() {
    if !REGISTER_THREADS.load(Ordering::Relaxed) || SEEN.with(|seen| seen.replace(true)) {
        return;
    }
    crate::inside::within(register_current);
}

/// Register the calling thread and arm its exit destructor (also the forking thread in
/// a child, under its new id, once the parent's threads are forgotten).
pub fn register_current() {
    let Some(key) = *EXIT_KEY.get_or_init(make_exit_key) else { return };
    if !engine::register_faulting_thread() {
        return;
    }
    // SAFETY: gettid(2) takes no arguments and cannot fail.
    let tid = unsafe { libc::gettid() } as usize;
    // SAFETY: a key made by pthread_key_create; the value, the thread id, is never null
    // and only ever read back as a number. A key in the first 32 allocates nothing; one
    // beyond allocates with calloc, which comes back here with SEEN already set.
    unsafe { libc::pthread_setspecific(key, tid as *const c_void) };
}

fn make_exit_key() -> Option<libc::pthread_key_t> {
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: `key` is written by the call; the destructor is a plain extern "C" fn of
    // this library, which stays loaded.
    (unsafe { libc::pthread_key_create(&mut key, Some(forget_at_exit)) } == 0).then_some(key)
}

extern "C" fn forget_at_exit(tid: *mut c_void) {
    engine::forget_faulting_thread(tid as usize as u32);
}

/// In a forked child: the parent's other threads are gone, and this one has a new id.
pub fn in_child() {
    engine::forget_faulting_threads();
    // SEEN is set only where threads are registered at all (`note_current`).
    if SEEN.with(|seen| seen.get()) {
        register_current();
    }
}
