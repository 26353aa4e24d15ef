//! libfolioswap.so: folioswap for programs that were not written for it.
//!
//! Preloaded (`LD_PRELOAD=libfolioswap.so`, or `folioswap run`), it interposes the
//! program's `mmap`/`munmap`/`mremap`/`madvise` and its `malloc` family: anonymous
//! private read-write mappings and heap blocks of at least `FOLIOSWAP_THRESHOLD` (1 MiB)
//! become managed regions of one engine per process, configured from `FOLIOSWAP_*`;
//! everything else goes to libc untouched. Linked instead (`-lfolioswap`), it offers the
//! C API of `include/folioswap.h` and leaves malloc and mmap alone.
//!
//! The pieces, one file each:
//! - `inside`: which threads run the library's own code (their calls go to libc);
//! - `alloc`: the library's own heap (libc's `__libc_*` functions, never the interposed
//!   ones) and the real `malloc_usable_size`;
//! - `state`: the managed blocks, the engine started on first use, and the process
//!   lifecycle: fork (the child inherits exactly the parent's memory, `fork.rs` in the
//!   engine), exit (counters written for `folioswap run`, the shared limit given back);
//! - `interpose`: the exported libc symbols of the allocator and the address space;
//! - `syscalls`: the exported I/O calls (read, write, recv, send, fread, …), which make
//!   managed buffers resident before the kernel copies to or from them when the engine
//!   cannot serve the kernel's own faults (an ordinary user's user-mode-only
//!   userfaultfd, or signal mode), and pass straight through otherwise;
//! - `sigmask`: the calls that set signal masks, which keep SIGBUS deliverable in signal
//!   mode (a thread that blocks it would be killed at its first swap-in);
//! - `capi`: `folioswap_map` and the rest of the C API;
//! - `stat_server`: the live counters `folioswap stat` asks each process for;
//! - `outside`: the program's anonymous memory the engine does not manage, sampled, for
//!   the warning `folioswap run` gives where memory_high did not bound it;
//! - `threads`: the program's threads, registered with the engine at their first
//!   allocation so that a fault thread can read the CPU each one faulted on.
//!
//! Why no recursion and no deadlock: the engine maps its own memory with raw system
//! calls and allocates through `alloc`, so nothing it does comes back here; the library's
//! lock is never held while calling into libc's malloc except through `__libc_*`, and
//! libc never calls back into it with its own locks held (its internal mmap calls do not
//! go through the interposed symbol).

#[cfg(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))))]
compile_error!("libfolioswap.so interposes libc on x86-64 and AArch64 Linux only (see mremap in interpose.rs)");

mod alloc;
mod capi;
mod inside;
mod interpose;
mod outside;
mod sigmask;
mod stat_server;
mod state;
mod syscalls;
mod threads;

#[global_allocator]
static HEAP: alloc::LibcHeap = alloc::LibcHeap;

/// Runs when the library is loaded, before the program's `main`.
extern "C" fn on_load() {
    state::init();
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;
