//! The eventfds the engine's threads are woken through: the engine's kick (stop, deferred
//! faults, events to apply) and each fault thread's own wake for the poll token
//! (`pollers.rs`). Made, signalled and drained here only.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// A new eventfd, close-on-exec and non-blocking.
pub(crate) fn new() -> std::io::Result<OwnedFd> {
    // SAFETY: eventfd(2) with flags only; returns a new descriptor or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Wake whoever polls `fd`. A full counter only means a wake is already pending.
pub(crate) fn signal(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd of ours.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Take the wakes pending on `fd`: true where there were any (it never blocks).
pub(crate) fn drain(fd: RawFd) -> bool {
    let mut count = 0u64;
    // SAFETY: reads the 8-byte eventfd counter into a live u64.
    unsafe { libc::read(fd, (&mut count as *mut u64).cast(), 8) == 8 }
}
