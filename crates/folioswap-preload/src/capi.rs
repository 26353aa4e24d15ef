//! The C API (`include/folioswap.h`): one engine per process, shared with the
//! interposed allocator when the library is preloaded.
//!
//! No panic leaves these functions: each body runs under [`guard`], which turns a panic
//! (a bug) into `FOLIOSWAP_E_INTERNAL` and a last-error message, since unwinding into C
//! would abort the program; only `folioswap_strerror` and `folioswap_last_error` do
//! without, having no panic path. Arguments are checked first, and every error message
//! names the function and the argument (or the address) that was wrong.

use crate::alloc::__libc_malloc;
use crate::state::{self, Origin};
use engine::{Config, ENV_VARS, PRELOAD_VARS};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{self, AssertUnwindSafe};

const OK: c_int = 0;
const E_CONFIG: c_int = -1;
const E_PERMISSION: c_int = -2;
const E_KERNEL: c_int = -3;
const E_NOMEM: c_int = -4;
const E_INVALID: c_int = -5;
const E_STARTED: c_int = -6;
const E_SWAP_FILE: c_int = -7;
const E_SYSTEM: c_int = -8;
const E_INTERNAL: c_int = -9;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Remember `msg` as this thread's last error and return `code`. Cannot panic: a thread
/// whose thread-locals are being torn down just keeps no message.
fn fail(code: c_int, msg: impl Into<String>) -> c_int {
    let msg = CString::new(msg.into().replace('\0', "\\0")).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|last| {
        if let Ok(mut last) = last.try_borrow_mut() {
            *last = msg;
        }
    });
    code
}

/// Run the body of the exported function `func`. A panic in it (a bug) returns
/// `on_panic` with an E_INTERNAL last error instead of unwinding into C.
fn guard<T>(func: &str, on_panic: T, body: impl FnOnce() -> T) -> T {
    match panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(v) => v,
        Err(payload) => {
            let what = payload.downcast_ref::<&str>().copied().or_else(|| payload.downcast_ref::<String>().map(String::as_str));
            fail(E_INTERNAL, format!("{func}: internal error, a bug in folioswap (please report it): {}", what.unwrap_or("a panic")));
            on_panic
        }
    }
}

/// The C string argument `arg` of `func`, or E_INVALID naming it when it is NULL or not
/// UTF-8.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string that outlives `'a`.
unsafe fn str_arg<'a>(func: &str, arg: &str, p: *const c_char) -> Result<&'a str, c_int> {
    if p.is_null() {
        return Err(fail(E_INVALID, format!("{func}: {arg} is NULL")));
    }
    // SAFETY: per this function's contract.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map_err(|e| fail(E_INVALID, format!("{func}: {arg} {:?} is not valid UTF-8 (at byte {})", s.to_string_lossy(), e.valid_up_to())))
}

fn code_of(e: &engine::Error) -> c_int {
    match e {
        engine::Error::Config { .. } => E_CONFIG,
        engine::Error::UserfaultfdUnavailable { errno } if *errno == libc::ENOSYS || *errno == libc::ENOENT => E_KERNEL,
        engine::Error::UserfaultfdUnavailable { .. } => E_PERMISSION,
        engine::Error::KernelTooOld { .. } => E_KERNEL,
        engine::Error::Map { .. } => E_NOMEM,
        engine::Error::InvalidRegion(_) => E_INVALID,
        engine::Error::SwapFile(_) => E_SWAP_FILE,
        _ => E_SYSTEM,
    }
}

fn fail_with(func: &str, e: engine::Error) -> c_int {
    fail(code_of(&e), format!("{func}: {e}"))
}

const UNMANAGED: &str = "the engine could not start and FOLIOSWAP_FALLBACK runs this process unmanaged";

#[no_mangle]
pub extern "C" fn folioswap_strerror(error: c_int) -> *const c_char {
    // No panic path: a match on constants.
    let s: &'static CStr = match error {
        OK => c"success",
        E_CONFIG => c"a configuration name or value was not understood",
        E_PERMISSION => c"userfaultfd is not permitted for this process",
        E_KERNEL => c"the kernel lacks userfaultfd features folioswap needs (Linux 6.8+)",
        E_NOMEM => c"the address space could not hold the mapping",
        E_INVALID => c"invalid argument",
        E_STARTED => c"the engine has started; configuration can no longer change",
        E_SWAP_FILE => c"the swap file could not be set up",
        E_SYSTEM => c"a system call failed",
        E_INTERNAL => c"an internal error in folioswap (a bug; see folioswap_last_error)",
        _ => c"unknown folioswap error code",
    };
    s.as_ptr()
}

#[no_mangle]
pub extern "C" fn folioswap_last_error() -> *const c_char {
    // The string lives in this thread's slot until its next error. No panic path: the
    // slot is only borrowed mutably inside `fail`, and `try_with` survives teardown.
    LAST_ERROR.try_with(|last| last.try_borrow().map(|s| s.as_ptr()).unwrap_or(c"".as_ptr())).unwrap_or(c"".as_ptr())
}

/// Set option `name` (as the caller wrote it, for messages) to `value` for the engine to
/// come: folioswap_set and its shorthands, `func` being the one called.
fn set(func: &str, name: &str, value: &str) -> c_int {
    let upper = name.trim().to_ascii_uppercase();
    let var = if upper.starts_with("FOLIOSWAP_") { upper } else { format!("FOLIOSWAP_{upper}") };
    if !ENV_VARS.iter().any(|(n, _)| *n == var) {
        let known: Vec<String> = ENV_VARS.iter().map(|(n, _)| n.strip_prefix("FOLIOSWAP_").unwrap_or(n).to_ascii_lowercase()).collect();
        let preload = if PRELOAD_VARS.iter().any(|(n, _)| *n == var) {
            format!(" ({var} is read from the environment by the preloaded library, not set here)")
        } else {
            String::new()
        };
        return fail(
            E_CONFIG,
            format!(
                "{func}: unknown option name {name:?}{preload}; expected one of {} (or FOLIOSWAP_ and the same, in any case)",
                known.join(", ")
            ),
        );
    }
    // A bad value is E_CONFIG whether or not the engine has started: each knob's value
    // is checked on its own, so the defaults serve to check it.
    if let Err(e) = Config::default().set(&var, value) {
        return fail_with(func, e);
    }
    let mut st = state::lock();
    if st.started() {
        return fail(
            E_STARTED,
            format!("{func}: {var}: the engine has started; set options before the first folioswap_map or folioswap_init"),
        );
    }
    let config = match st.pending() {
        Ok(c) => c,
        Err(e) => return fail_with(func, e),
    };
    match config.clone().set(&var, value) {
        Ok(c) => {
            *config = c;
            OK
        }
        Err(e) => fail_with(func, e),
    }
}

/// # Safety
/// `name` and `value` are NULL (refused) or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn folioswap_set(name: *const c_char, value: *const c_char) -> c_int {
    const F: &str = "folioswap_set";
    guard(F, E_INTERNAL, || {
        // SAFETY: per the function contract.
        let name = match unsafe { str_arg(F, "name", name) } {
            Ok(n) => n,
            Err(rc) => return rc,
        };
        // SAFETY: per the function contract.
        match unsafe { str_arg(F, &format!("value for {name:?}"), value) } {
            Ok(value) => set(F, name, value),
            Err(rc) => rc,
        }
    })
}

/// A shorthand `func(arg)`: folioswap_set(`var`, `value`).
///
/// # Safety
/// `value` is NULL (refused) or a NUL-terminated string.
unsafe fn set_shorthand(func: &str, arg: &str, var: &str, value: *const c_char) -> c_int {
    guard(func, E_INTERNAL, || {
        // SAFETY: per this function's contract.
        match unsafe { str_arg(func, arg, value) } {
            Ok(value) => set(func, var, value),
            Err(rc) => rc,
        }
    })
}

#[no_mangle]
pub extern "C" fn folioswap_set_memory_high(bytes: u64) -> c_int {
    const F: &str = "folioswap_set_memory_high";
    guard(F, E_INTERNAL, || set(F, "FOLIOSWAP_MEMORY_HIGH", &bytes.to_string()))
}

/// # Safety
/// `size` is NULL (refused) or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn folioswap_set_folio_size(size: *const c_char) -> c_int {
    // SAFETY: per the function contract.
    unsafe { set_shorthand("folioswap_set_folio_size", "size", "FOLIOSWAP_FOLIO_SIZE", size) }
}

/// # Safety
/// `name` is NULL (refused) or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn folioswap_set_compressor(name: *const c_char) -> c_int {
    // SAFETY: per the function contract.
    unsafe { set_shorthand("folioswap_set_compressor", "name", "FOLIOSWAP_COMPRESSOR", name) }
}

/// # Safety
/// `spec` is NULL (refused) or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn folioswap_set_swap_file(spec: *const c_char) -> c_int {
    // SAFETY: per the function contract.
    unsafe { set_shorthand("folioswap_set_swap_file", "spec", "FOLIOSWAP_SWAP_FILE", spec) }
}

#[no_mangle]
pub extern "C" fn folioswap_init() -> c_int {
    const F: &str = "folioswap_init";
    guard(F, E_INTERNAL, || match state::lock().engine() {
        Ok(_) => OK,
        Err(e) => fail_with(F, e),
    })
}

/// # Safety
/// `addr` is NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn folioswap_map(len: usize, addr: *mut *mut c_void) -> c_int {
    const F: &str = "folioswap_map";
    guard(F, E_INTERNAL, || {
        if addr.is_null() {
            return fail(E_INVALID, format!("{F}: addr is NULL; pass the address of a void * to receive the mapping"));
        }
        if len == 0 {
            return fail(E_INVALID, format!("{F}: len is 0; a mapping must be at least one byte long"));
        }
        let mapped = state::lock().map(len, 0, Origin::Api);
        match mapped {
            Ok(Some(p)) => {
                // SAFETY: per the function contract.
                unsafe { *addr = p };
                OK
            }
            Ok(None) => fail(E_PERMISSION, format!("{F}: {UNMANAGED}")),
            Err(e) => fail(code_of(&e), format!("{F}: len {len}: {e}")),
        }
    })
}

/// Who hands out blocks of `origin`, and what gives them back.
fn origin_names(origin: Origin) -> (&'static str, &'static str) {
    match origin {
        Origin::Api => ("folioswap_map", "folioswap_unmap"),
        Origin::Malloc => ("the malloc family", "free"),
        Origin::Mmap => ("mmap", "munmap"),
    }
}

#[no_mangle]
pub extern "C" fn folioswap_unmap(addr: *mut c_void) -> c_int {
    const F: &str = "folioswap_unmap";
    guard(F, E_INTERNAL, || {
        if addr.is_null() {
            return fail(E_INVALID, format!("{F}: addr is NULL; pass an address folioswap_map returned"));
        }
        let at = addr as usize;
        let mut st = state::lock();
        let why = match st.block(at).map(|b| b.origin) {
            Some(Origin::Api) => {
                st.release(at);
                return OK;
            }
            Some(origin) => {
                let (from, release) = origin_names(origin);
                format!("{addr:p} is a block the program got from {from}, not from folioswap_map; release it with {release}")
            }
            None => match st.block_containing(at) {
                Some((start, block)) => format!(
                    "{addr:p} lies inside the block of {} bytes at {:p} from {}; only the address a block starts at releases it",
                    block.len,
                    start as *const c_void,
                    origin_names(block.origin).0
                ),
                None => format!("{addr:p} is not an address folioswap_map returned, or it was unmapped already"),
            },
        };
        drop(st);
        fail(E_INVALID, format!("{F}: {why}; nothing was unmapped"))
    })
}

#[no_mangle]
pub extern "C" fn folioswap_stats_json() -> *mut c_char {
    const F: &str = "folioswap_stats_json";
    guard(F, std::ptr::null_mut(), || {
        let json = match state::lock().stats_json() {
            Ok(Some(j)) => j,
            Ok(None) => {
                fail(E_PERMISSION, format!("{F}: {UNMANAGED}"));
                return std::ptr::null_mut();
            }
            Err(e) => {
                fail_with(F, e);
                return std::ptr::null_mut();
            }
        };
        // In libc's heap, so that the caller's free() releases it.
        // SAFETY: a fresh block of len+1 bytes, filled and NUL-terminated before it is returned.
        unsafe {
            let p = __libc_malloc(json.len() + 1).cast::<u8>();
            if p.is_null() {
                fail(E_NOMEM, format!("{F}: out of memory for the statistics string"));
                return std::ptr::null_mut();
            }
            std::ptr::copy_nonoverlapping(json.as_ptr(), p, json.len());
            *p.add(json.len()) = 0;
            p.cast()
        }
    })
}

#[cfg(test)]
mod tests {
    //! The C API's misuse from Rust, in this process (the C side: tests/c_api.rs). Only
    //! refused settings are made here, so the engine (started by one test's map) runs on
    //! the FOLIOSWAP_* environment's configuration whatever the order of the tests.

    use super::*;
    use std::ptr::{null, null_mut};

    fn last_error() -> String {
        // SAFETY: folioswap_last_error returns a NUL-terminated string valid until this
        // thread's next error.
        unsafe { CStr::from_ptr(folioswap_last_error()) }.to_string_lossy().into_owned()
    }

    /// `rc` is `code`, and the last error mentions each of `needles`.
    #[track_caller]
    fn assert_error(rc: c_int, code: c_int, needles: &[&str]) {
        let msg = last_error();
        assert_eq!(rc, code, "last error: {msg}");
        for needle in needles {
            assert!(msg.contains(needle), "{msg:?} does not mention {needle:?}");
        }
    }

    #[test]
    fn null_and_non_utf8_arguments_are_named() {
        let sentinel = std::ptr::NonNull::<c_void>::dangling().as_ptr();
        let mut out = sentinel;
        // SAFETY: every pointer is NULL or a NUL-terminated literal; `out` is writable.
        unsafe {
            assert_error(folioswap_set(null(), c"16M".as_ptr()), E_INVALID, &["folioswap_set: name is NULL"]);
            assert_error(folioswap_set(c"memory_high".as_ptr(), null()), E_INVALID, &["value for \"memory_high\" is NULL"]);
            assert_error(folioswap_set(null(), null()), E_INVALID, &["name is NULL"]);
            assert_error(folioswap_set(c"memory_high".as_ptr(), c"\xff16M".as_ptr()), E_INVALID, &["value for \"memory_high\"", "UTF-8"]);
            assert_error(folioswap_set(c"memory_\xfehigh".as_ptr(), c"16M".as_ptr()), E_INVALID, &["name", "UTF-8", "at byte 7"]);
            assert_error(folioswap_set_folio_size(null()), E_INVALID, &["folioswap_set_folio_size: size is NULL"]);
            assert_error(folioswap_set_compressor(null()), E_INVALID, &["folioswap_set_compressor: name is NULL"]);
            assert_error(folioswap_set_swap_file(null()), E_INVALID, &["folioswap_set_swap_file: spec is NULL"]);
            assert_error(folioswap_set_swap_file(c"/var/tmp/\xff:8G".as_ptr()), E_INVALID, &["spec", "UTF-8"]);
            assert_error(folioswap_map(4096, null_mut()), E_INVALID, &["folioswap_map: addr is NULL"]);
            assert_error(folioswap_map(0, &mut out), E_INVALID, &["folioswap_map: len is 0"]);
        }
        assert_eq!(out, sentinel, "a refused map wrote *addr");
        assert_error(folioswap_unmap(null_mut()), E_INVALID, &["folioswap_unmap: addr is NULL"]);
    }

    #[test]
    fn bad_names_and_values_are_config_errors() {
        // SAFETY: NUL-terminated literals.
        unsafe {
            assert_error(folioswap_set(c"".as_ptr(), c"1".as_ptr()), E_CONFIG, &["unknown option name \"\"", "memory_high"]);
            assert_error(folioswap_set(c"no_such_knob".as_ptr(), c"1".as_ptr()), E_CONFIG, &["\"no_such_knob\"", "folio_size"]);
            assert_error(folioswap_set(c"threshold".as_ptr(), c"1M".as_ptr()), E_CONFIG, &["\"threshold\"", "environment"]);
            assert_error(
                folioswap_set(c"memory_high".as_ptr(), c"lots".as_ptr()),
                E_CONFIG,
                &["folioswap_set: FOLIOSWAP_MEMORY_HIGH=\"lots\"", "512M"],
            );
            assert_error(folioswap_set(c"Folioswap_Lru".as_ptr(), c"clock".as_ptr()), E_CONFIG, &["FOLIOSWAP_LRU=\"clock\"", "fifo"]);
            assert_error(folioswap_set_folio_size(c"3K".as_ptr()), E_CONFIG, &["folioswap_set_folio_size", "\"3K\"", "64K"]);
            assert_error(folioswap_set_compressor(c"gzip".as_ptr()), E_CONFIG, &["folioswap_set_compressor", "\"gzip\"", "zstd"]);
            assert_error(folioswap_set_swap_file(c"/var/tmp".as_ptr()), E_CONFIG, &["\"/var/tmp\"", "PATH:SIZE"]);
        }
        assert_error(folioswap_set_memory_high(1), E_CONFIG, &["folioswap_set_memory_high", "\"1\"", "at least 8M"]);
    }

    #[test]
    fn panics_become_errors() {
        let rc = guard("folioswap_test", E_INTERNAL, || -> c_int { panic!("boom") });
        assert_error(rc, E_INTERNAL, &["folioswap_test: internal error", "boom"]);
        let p = guard("folioswap_test_ptr", null_mut::<c_char>(), || panic!("{}", String::from("bang")));
        let msg = last_error();
        assert!(p.is_null() && msg.contains("folioswap_test_ptr: internal error") && msg.contains("bang"), "{msg}");
        // SAFETY: strerror returns a static NUL-terminated string.
        let text = unsafe { CStr::from_ptr(folioswap_strerror(E_INTERNAL)) };
        assert!(text.to_str().unwrap().contains("internal error"));
    }

    #[test]
    fn unmap_misuse_loses_nothing() {
        const LEN: usize = 8 << 20;
        let mut block = null_mut();
        // SAFETY: `block` is writable.
        let rc = unsafe { folioswap_map(LEN, &mut block) };
        assert_eq!(rc, OK, "{}", last_error());
        // SAFETY: the block is LEN bytes of managed memory, ours until unmapped.
        let words = unsafe { std::slice::from_raw_parts_mut(block.cast::<u64>(), LEN / 8) };
        for (i, w) in words.iter_mut().enumerate() {
            *w = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
        let heap = Box::into_raw(Box::new(7u64));
        let on_stack = 0u64;
        let at = |offset: usize| block.cast::<u8>().wrapping_add(offset).cast::<c_void>();
        for (addr, why) in [
            (at(4096), "lies inside the block"),
            (at(1), "lies inside the block"),
            (at(LEN - 8), "lies inside the block"),
            (heap.cast(), "not an address folioswap_map returned"),
            (std::ptr::addr_of!(on_stack).cast_mut().cast(), "not an address folioswap_map returned"),
            (0x1000 as *mut c_void, "not an address folioswap_map returned"),
        ] {
            assert_error(folioswap_unmap(addr), E_INVALID, &[&format!("{addr:p}"), why, "nothing was unmapped"]);
        }
        assert_error(folioswap_unmap(at(4096)), E_INVALID, &[&format!("at {block:p}")]);

        let mut other = null_mut();
        // SAFETY: `other` is writable.
        assert_eq!(unsafe { folioswap_map(1 << 20, &mut other) }, OK, "{}", last_error());
        assert_eq!(folioswap_unmap(other), OK, "{}", last_error());
        assert_error(folioswap_unmap(other), E_INVALID, &[&format!("{other:p}"), "unmapped already"]);

        for (i, w) in words.iter().enumerate() {
            assert_eq!(*w, (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15), "word {i} changed");
        }
        // SAFETY: made by Box::into_raw above.
        assert_eq!(unsafe { *Box::from_raw(heap) }, 7);
        assert_eq!(folioswap_unmap(block), OK, "{}", last_error());
        assert_error(folioswap_unmap(block), E_INVALID, &[&format!("{block:p}"), "unmapped already"]);
    }
}
