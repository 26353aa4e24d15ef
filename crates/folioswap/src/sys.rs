//! The engine's own mappings, made with raw system calls (and `map_aligned`, the one
//! helper that reserves aligned address space with them).
//!
//! When libfolioswap.so is preloaded it interposes `mmap`, `munmap` and `madvise` for the
//! program; calls the engine makes for itself (staging, the pool, region reservations)
//! must not come back to it as managed allocations. Going to the kernel directly keeps
//! them out of any interposer. Same signatures and error convention (-1 or MAP_FAILED
//! with errno set) as the libc functions they replace.

/// `madvise` advice (Linux 5.14+) the libc crate does not name: fault a range in as a
/// write would (breaking copy on write), without touching it.
pub(crate) const MADV_POPULATE_WRITE: i32 = 23;

/// `madvise` advice (Linux 6.1+): make a range one THP now, synchronously.
pub(crate) const MADV_COLLAPSE: i32 = 25;

/// Copy `len` bytes of this process's memory at `src` to `dst` through the kernel
/// (`process_vm_readv` on ourselves): a page unmapped meanwhile ends the copy short
/// instead of killing the process, as a plain load would. Returns the bytes copied.
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes that no Rust reference covers.
pub(crate) unsafe fn read_own_memory(dst: usize, src: usize, len: usize) -> usize {
    let local = libc::iovec { iov_base: dst as *mut libc::c_void, iov_len: len };
    let remote = libc::iovec { iov_base: src as *mut libc::c_void, iov_len: len };
    // SAFETY: both iovecs describe `len` bytes; the kernel writes only into `dst`, which
    // the caller vouches for, and reads `src` with the checks of a remote access.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    n.max(0) as usize
}

/// Copy the first `each` bytes of every `stride`-th byte of `[src, src + len)` of this
/// process's memory into `dst`, one after the other, through the kernel as
/// `read_own_memory` does, in one call (at most 1024 pieces). Returns the bytes copied.
///
/// # Safety
/// `dst` must be valid for writes of `len / stride * each` bytes that no Rust reference
/// covers.
pub(crate) unsafe fn read_own_samples(dst: usize, src: usize, len: usize, stride: usize, each: usize) -> usize {
    let n = (len / stride).min(1024);
    let local = libc::iovec { iov_base: dst as *mut libc::c_void, iov_len: n * each };
    let remote: Vec<libc::iovec> =
        (0..n).map(|i| libc::iovec { iov_base: (src + i * stride) as *mut libc::c_void, iov_len: each }).collect();
    // SAFETY: the local iovec describes `n * each` bytes the caller vouches for; the
    // remote ones are read with the checks of a remote access; `remote` outlives the call.
    let got = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, remote.as_ptr(), n as libc::c_ulong, 0) };
    got.max(0) as usize
}

/// # Safety
/// As `mmap(2)`: the caller owns whatever range the kernel may replace (none without MAP_FIXED).
pub(crate) unsafe fn mmap(addr: *mut libc::c_void, len: usize, prot: i32, flags: i32, fd: i32, off: libc::off_t) -> *mut libc::c_void {
    // SAFETY: per the function contract; the syscall reads only its integer arguments.
    unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut libc::c_void }
}

/// # Safety
/// As `munmap(2)`: nothing may use the range afterwards.
pub(crate) unsafe fn munmap(addr: *mut libc::c_void, len: usize) -> i32 {
    // SAFETY: per the function contract.
    unsafe { libc::syscall(libc::SYS_munmap, addr, len) as i32 }
}

/// # Safety
/// As `madvise(2)`: destructive advice (DONTNEED) only on memory whose contents may go.
pub(crate) unsafe fn madvise(addr: *mut libc::c_void, len: usize, advice: i32) -> i32 {
    // SAFETY: per the function contract.
    unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice) as i32 }
}

/// Reserve `len` bytes of address space aligned to `align` (a power of two): private
/// anonymous read-write memory, not reserved against overcommit. Returns the address or
/// the errno of the failed mmap. The caller unmaps it.
pub fn map_aligned(len: usize, align: usize) -> Result<usize, i32> {
    let total = len.checked_add(align).ok_or(libc::ENOMEM)?;
    // SAFETY: an anonymous private mapping at a kernel-chosen address touches no existing memory.
    let p = unsafe {
        mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::ENOMEM));
    }
    let start = p as usize;
    let aligned = (start + align - 1) & !(align - 1);
    // SAFETY: both trims lie inside the mapping just created and nothing refers to them.
    unsafe {
        if aligned > start {
            munmap(p, aligned - start);
        }
        let end = start + total;
        if end > aligned + len {
            munmap((aligned + len) as *mut libc::c_void, end - (aligned + len));
        }
    }
    Ok(aligned)
}
