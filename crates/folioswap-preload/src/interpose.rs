//! The libc symbols a preloaded libfolioswap.so takes over.
//!
//! Large blocks (`FOLIOSWAP_THRESHOLD`, 1 MiB by default) from the malloc family and
//! anonymous private read-write `mmap`s of that size become managed regions; all other
//! calls go to libc's allocator (`__libc_*`) or straight to the kernel. A managed block
//! starts on a folio boundary and is zero-filled, so `calloc` needs no memset and
//! `posix_memalign` up to the folio size is free.
//!
//! - `free`/`munmap` of a whole block drop its region; a partial `munmap` goes to the
//!   kernel and the engine learns of it from userfaultfd (UNMAP), the region going once
//!   all of it has.
//! - `realloc`/`mremap` of a block keep it when it is large enough, else move the data
//!   into a new block (`mremap` without MREMAP_MAYMOVE cannot grow one: ENOMEM).
//! - `madvise` THP advice on managed memory is ignored (the folio size decides); the rest
//!   reaches the kernel, and DONTNEED/FREE/REMOVE reach the engine as userfaultfd events.
//! - System calls that touch managed memory (read(2) into it, write(2) from it, O_DIRECT,
//!   futexes) fault inside the kernel and are served like any other fault, when the
//!   engine has a full userfaultfd in thread mode. Otherwise (an ordinary user gets a
//!   user-mode-only one) the kernel's fault fails the call with EFAULT: `syscalls.rs`
//!   makes the buffers of the common I/O calls resident first.

use crate::alloc::{__libc_calloc, __libc_free, __libc_malloc, __libc_memalign, __libc_realloc, libc_usable_size};
use crate::state::{self, Origin, BLOCKS, INTERPOSE, THRESHOLD};
use std::ffi::c_void;
use std::sync::atomic::Ordering;

const PAGE: usize = 4096;

/// Whether a request of `size` bytes is for the engine.
fn wanted(size: usize) -> bool {
    INTERPOSE.load(Ordering::Relaxed) && size >= THRESHOLD.load(Ordering::Relaxed) && !crate::inside::inside()
}

/// A managed block, or None (then the caller asks libc).
fn managed(size: usize, align: usize, origin: Origin) -> Option<*mut c_void> {
    if !wanted(size) {
        return None;
    }
    let mut st = state::lock();
    match st.map(size, align, origin) {
        Ok(p) => p,
        Err(e) => {
            // Out of address space or the like: libc may still manage.
            crate::inside::within(|| eprintln!("folioswap: cannot manage a block of {size} bytes: {e}"));
            None
        }
    }
}

/// Whether `p` might be a managed block (cheap test before taking the lock).
fn maybe_block(p: *mut c_void) -> bool {
    BLOCKS.load(Ordering::Relaxed) > 0 && (p as usize).is_multiple_of(PAGE) && !p.is_null()
}

/// The usable size of the managed block at `p`, if it is one.
fn block_len(p: *mut c_void) -> Option<usize> {
    if !maybe_block(p) {
        return None;
    }
    state::lock().block(p as usize).map(|b| b.len)
}

#[no_mangle]
pub extern "C" fn malloc(size: usize) -> *mut c_void {
    crate::threads::note_current();
    if let Some(p) = managed(size, 0, Origin::Malloc) {
        return p;
    }
    // SAFETY: libc's allocator, with the caller's arguments.
    unsafe { __libc_malloc(size) }
}

#[no_mangle]
pub extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    crate::threads::note_current();
    if let Some(total) = n.checked_mul(size) {
        // A new region reads as zeros.
        if let Some(p) = managed(total, 0, Origin::Malloc) {
            return p;
        }
    }
    // SAFETY: as in malloc; libc checks the overflow itself.
    unsafe { __libc_calloc(n, size) }
}

#[no_mangle]
pub extern "C" fn free(p: *mut c_void) {
    if maybe_block(p) && state::lock().release(p as usize) {
        return;
    }
    // SAFETY: not a managed block, so libc's (or null).
    unsafe { __libc_free(p) }
}

#[no_mangle]
pub extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    crate::threads::note_current();
    if p.is_null() {
        return malloc(size);
    }
    let old_len = match block_len(p) {
        Some(_) if size == 0 => {
            free(p);
            return std::ptr::null_mut();
        }
        Some(len) if size <= len => return p,
        Some(len) => len,
        // SAFETY: `p` is libc's, and stays below the threshold.
        None if !wanted(size) => return unsafe { __libc_realloc(p, size) },
        // Grown past the threshold: into a managed block.
        None => libc_usable_size(p),
    };
    let new = malloc(size);
    if !new.is_null() {
        // SAFETY: the old block holds `old_len` bytes, the new one `size`; they do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), new.cast::<u8>(), old_len.min(size)) };
        free(p);
    }
    new
}

fn aligned(align: usize, size: usize) -> *mut c_void {
    if let Some(p) = managed(size, align, Origin::Malloc) {
        return p;
    }
    // SAFETY: libc's allocator with the caller's (checked) alignment.
    unsafe { __libc_memalign(align, size) }
}

/// # Safety
/// `out` must be writable, as for posix_memalign(3).
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
    if !align.is_power_of_two() || !align.is_multiple_of(std::mem::size_of::<usize>()) {
        return libc::EINVAL;
    }
    let p = aligned(align, size);
    if p.is_null() && size != 0 {
        return libc::ENOMEM;
    }
    // SAFETY: per the function contract.
    unsafe { *out = p };
    0
}

#[no_mangle]
pub extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    aligned(align, size)
}

#[no_mangle]
pub extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    aligned(align.max(1).next_power_of_two(), size)
}

#[no_mangle]
pub extern "C" fn valloc(size: usize) -> *mut c_void {
    aligned(PAGE, size)
}

#[no_mangle]
pub extern "C" fn pvalloc(size: usize) -> *mut c_void {
    aligned(PAGE, size.max(1).next_multiple_of(PAGE))
}

#[no_mangle]
pub extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    block_len(p).unwrap_or_else(|| libc_usable_size(p))
}

fn set_errno(e: i32) {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = e };
}

/// Flags of an mmap the engine can stand in for: private, anonymous, nothing placed.
fn manageable_mmap(addr: *mut c_void, prot: i32, flags: i32, fd: i32) -> bool {
    /// MAP_TYPE: MAP_SHARED, MAP_PRIVATE or MAP_SHARED_VALIDATE.
    const MAP_TYPE: i32 = 0x0f;
    const REFUSED: i32 = libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE | libc::MAP_STACK | libc::MAP_GROWSDOWN | libc::MAP_HUGETLB;
    addr.is_null()
        && fd == -1
        && prot == libc::PROT_READ | libc::PROT_WRITE
        && flags & MAP_TYPE == libc::MAP_PRIVATE
        && flags & libc::MAP_ANONYMOUS != 0
        && flags & REFUSED == 0
}

/// # Safety
/// As mmap(2).
#[no_mangle]
pub unsafe extern "C" fn mmap(addr: *mut c_void, len: usize, prot: i32, flags: i32, fd: i32, off: libc::off_t) -> *mut c_void {
    if manageable_mmap(addr, prot, flags, fd) {
        if let Some(p) = managed(len, 0, Origin::Mmap) {
            return p;
        }
    }
    // SAFETY: per the function contract.
    unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void }
}

/// # Safety
/// As mmap(2).
#[no_mangle]
pub unsafe extern "C" fn mmap64(addr: *mut c_void, len: usize, prot: i32, flags: i32, fd: i32, off: libc::off_t) -> *mut c_void {
    // SAFETY: per the function contract.
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

/// # Safety
/// As munmap(2).
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> i32 {
    if BLOCKS.load(Ordering::Relaxed) > 0 {
        let mut st = state::lock();
        let start = addr as usize;
        if let Some((block_start, block)) = st.block_containing(start) {
            let whole = start == block_start && len >= block.requested;
            if !whole {
                block.unmapped += len.min(block_start + block.len - start);
            }
            if whole || block.unmapped >= block.requested {
                // The rest of the block (if any) goes with its region.
                if start == block_start {
                    st.release(block_start);
                    return 0;
                }
                // SAFETY: per the function contract, then the region lets go of the rest.
                let rc = unsafe { libc::syscall(libc::SYS_munmap, addr, len) } as i32;
                st.release(block_start);
                return rc;
            }
        }
    }
    // SAFETY: per the function contract.
    unsafe { libc::syscall(libc::SYS_munmap, addr, len) as i32 }
}

/// # Safety
/// As mremap(2). libc declares it variadic (`new_addr` comes only with MREMAP_FIXED);
/// stable Rust cannot define a variadic function, but on x86-64 and AArch64 Linux a
/// variadic pointer argument travels in the same register as a fixed one, so it is
/// declared fixed here and read only when MREMAP_FIXED says it was passed.
#[no_mangle]
pub unsafe extern "C" fn mremap(old: *mut c_void, old_len: usize, new_len: usize, flags: i32, new_addr: *mut c_void) -> *mut c_void {
    let new_addr = if flags & libc::MREMAP_FIXED != 0 { new_addr } else { std::ptr::null_mut() };
    if let Some(len) = block_len(old) {
        if flags & libc::MREMAP_FIXED == 0 && new_len <= len {
            return old;
        }
        if flags & libc::MREMAP_MAYMOVE == 0 || flags & libc::MREMAP_FIXED != 0 {
            set_errno(libc::ENOMEM);
            return libc::MAP_FAILED;
        }
        let new = managed(new_len, 0, Origin::Mmap).unwrap_or_else(|| {
            // SAFETY: a fresh anonymous mapping; checked below.
            unsafe {
                libc::syscall(
                    libc::SYS_mmap,
                    0usize,
                    new_len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                ) as *mut c_void
            }
        });
        if new == libc::MAP_FAILED {
            return new;
        }
        // SAFETY: the old block has `old_len.min(len)` readable bytes, the new one `new_len`.
        unsafe { std::ptr::copy_nonoverlapping(old.cast::<u8>(), new.cast::<u8>(), old_len.min(len).min(new_len)) };
        state::lock().release(old as usize);
        return new;
    }
    // SAFETY: per the function contract.
    unsafe { libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new_addr) as *mut c_void }
}

/// # Safety
/// As madvise(2).
#[no_mangle]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: usize, advice: i32) -> i32 {
    if matches!(advice, libc::MADV_HUGEPAGE | libc::MADV_NOHUGEPAGE) && BLOCKS.load(Ordering::Relaxed) > 0 {
        let mut st = state::lock();
        if st.block_containing(addr as usize).is_some_and(|(_, b)| b.region.is_some()) {
            return 0;
        }
    }
    // SAFETY: per the function contract.
    unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice) as i32 }
}
