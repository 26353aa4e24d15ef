//! The library's own heap: glibc's allocator under its internal names, which the
//! interposed `malloc` family never sees. Rust's global allocator in this library is
//! built on it, so that the engine's allocations never come back as the program's.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

extern "C" {
    pub fn __libc_malloc(size: usize) -> *mut c_void;
    pub fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    pub fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void;
    pub fn __libc_free(p: *mut c_void);
    pub fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
}

/// glibc's alignment of plain malloc.
const MALLOC_ALIGN: usize = 16;

pub struct LibcHeap;

// SAFETY: each method forwards to glibc's allocator with a size and alignment that honour
// `layout`, and frees only what it allocated.
unsafe impl GlobalAlloc for LibcHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: glibc's malloc/memalign accept any size and a power-of-two alignment.
        unsafe {
            if layout.align() <= MALLOC_ALIGN {
                __libc_malloc(layout.size()).cast()
            } else {
                __libc_memalign(layout.align(), layout.size()).cast()
            }
        }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= MALLOC_ALIGN {
            // SAFETY: as above; calloc zeroes.
            return unsafe { __libc_calloc(1, layout.size()).cast() };
        }
        // SAFETY: as above; the new block is `size` bytes long.
        unsafe {
            let p = self.alloc(layout);
            if !p.is_null() {
                std::ptr::write_bytes(p, 0, layout.size());
            }
            p
        }
    }
    unsafe fn dealloc(&self, p: *mut u8, _layout: Layout) {
        // SAFETY: `p` came from this allocator.
        unsafe { __libc_free(p.cast()) }
    }
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= MALLOC_ALIGN {
            // SAFETY: `p` came from __libc_malloc/calloc (alignment ≤ 16).
            return unsafe { __libc_realloc(p.cast(), new_size).cast() };
        }
        // SAFETY: a new block of the same alignment, the common prefix copied, then the
        // old one freed: GlobalAlloc's default, spelled out.
        unsafe {
            let new = self.alloc(Layout::from_size_align_unchecked(new_size, layout.align()));
            if !new.is_null() {
                std::ptr::copy_nonoverlapping(p, new, layout.size().min(new_size));
                self.dealloc(p, layout);
            }
            new
        }
    }
}

/// The real `malloc_usable_size` (glibc exports no internal name for it).
static REAL_USABLE_SIZE: AtomicUsize = AtomicUsize::new(0);

pub fn resolve_usable_size() {
    // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT finds the next definition (libc's).
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"malloc_usable_size".as_ptr()) };
    REAL_USABLE_SIZE.store(f as usize, Ordering::Release);
}

/// libc's answer for a block libc allocated.
pub fn libc_usable_size(p: *mut c_void) -> usize {
    let f = REAL_USABLE_SIZE.load(Ordering::Acquire);
    if f == 0 || p.is_null() {
        return 0;
    }
    // SAFETY: `f` is libc's malloc_usable_size, resolved by dlsym; `p` is a libc block.
    let f: extern "C" fn(*mut c_void) -> usize = unsafe { std::mem::transmute(f) };
    f(p)
}
