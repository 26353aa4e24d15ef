//! The C API (`include/folioswap.h`): one engine per process, shared with the
//! interposed allocator when the library is preloaded.

use crate::alloc::__libc_malloc;
use crate::state::{self, Origin};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};

const OK: c_int = 0;
const E_CONFIG: c_int = -1;
const E_PERMISSION: c_int = -2;
const E_KERNEL: c_int = -3;
const E_NOMEM: c_int = -4;
const E_INVALID: c_int = -5;
const E_STARTED: c_int = -6;
const E_SWAP_FILE: c_int = -7;
const E_SYSTEM: c_int = -8;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Remember `msg` as this thread's last error and return `code`.
fn fail(code: c_int, msg: impl Into<String>) -> c_int {
    let msg = CString::new(msg.into().replace('\0', " ")).expect("no NUL left");
    LAST_ERROR.with(|l| *l.borrow_mut() = msg);
    code
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

fn fail_with(e: engine::Error) -> c_int {
    fail(code_of(&e), e.to_string())
}

#[no_mangle]
pub extern "C" fn folioswap_strerror(error: c_int) -> *const c_char {
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
        _ => c"unknown folioswap error code",
    };
    s.as_ptr()
}

#[no_mangle]
pub extern "C" fn folioswap_last_error() -> *const c_char {
    // The string lives in this thread's slot until its next error.
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}

/// # Safety
/// `name` and `value` are NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn folioswap_set(name: *const c_char, value: *const c_char) -> c_int {
    if name.is_null() || value.is_null() {
        return fail(E_INVALID, "folioswap_set: name and value must not be NULL");
    }
    // SAFETY: per the function contract.
    let (name, value) = unsafe { (CStr::from_ptr(name).to_string_lossy(), CStr::from_ptr(value).to_string_lossy()) };
    let upper = name.trim().to_ascii_uppercase();
    let var = if upper.starts_with("FOLIOSWAP_") { upper } else { format!("FOLIOSWAP_{upper}") };
    let mut st = state::lock();
    if st.started() {
        return fail(E_STARTED, format!("{var}: the engine has started; set options before the first folioswap_map"));
    }
    let config = match st.pending() {
        Ok(c) => c,
        Err(e) => return fail_with(e),
    };
    match config.clone().set(&var, &value) {
        Ok(c) => {
            *config = c;
            OK
        }
        Err(e) => fail_with(e),
    }
}

fn set_str(name: &CStr, value: *const c_char) -> c_int {
    // SAFETY: `name` is a literal; `value` is the caller's string, checked by folioswap_set.
    unsafe { folioswap_set(name.as_ptr(), value) }
}

#[no_mangle]
pub extern "C" fn folioswap_set_memory_high(bytes: u64) -> c_int {
    let v = CString::new(bytes.to_string()).expect("digits");
    set_str(c"FOLIOSWAP_MEMORY_HIGH", v.as_ptr())
}

#[no_mangle]
pub extern "C" fn folioswap_set_folio_size(size: *const c_char) -> c_int {
    set_str(c"FOLIOSWAP_FOLIO_SIZE", size)
}

#[no_mangle]
pub extern "C" fn folioswap_set_compressor(name: *const c_char) -> c_int {
    set_str(c"FOLIOSWAP_COMPRESSOR", name)
}

#[no_mangle]
pub extern "C" fn folioswap_set_swap_file(spec: *const c_char) -> c_int {
    set_str(c"FOLIOSWAP_SWAP_FILE", spec)
}

#[no_mangle]
pub extern "C" fn folioswap_init() -> c_int {
    match state::lock().engine() {
        Ok(_) => OK,
        Err(e) => fail_with(e),
    }
}

/// # Safety
/// `addr` is writable.
#[no_mangle]
pub unsafe extern "C" fn folioswap_map(len: usize, addr: *mut *mut c_void) -> c_int {
    if addr.is_null() || len == 0 {
        return fail(E_INVALID, "folioswap_map: len must be positive and addr not NULL");
    }
    match state::lock().map(len, 0, Origin::Api) {
        Ok(Some(p)) => {
            // SAFETY: per the function contract.
            unsafe { *addr = p };
            OK
        }
        Ok(None) => fail(E_PERMISSION, "the engine could not start and FOLIOSWAP_FALLBACK runs this process unmanaged"),
        Err(e) => fail_with(e),
    }
}

#[no_mangle]
pub extern "C" fn folioswap_unmap(addr: *mut c_void) -> c_int {
    let mut st = state::lock();
    if !st.block(addr as usize).is_some_and(|b| b.origin == Origin::Api) {
        return fail(E_INVALID, format!("folioswap_unmap: {addr:p} is not an address folioswap_map returned"));
    }
    st.release(addr as usize);
    OK
}

#[no_mangle]
pub extern "C" fn folioswap_stats_json() -> *mut c_char {
    let json = match state::lock().stats_json() {
        Ok(Some(j)) => j,
        Ok(None) => {
            fail(E_PERMISSION, "the engine could not start and FOLIOSWAP_FALLBACK runs this process unmanaged");
            return std::ptr::null_mut();
        }
        Err(e) => {
            fail_with(e);
            return std::ptr::null_mut();
        }
    };
    // In libc's heap, so that the caller's free() releases it.
    // SAFETY: a fresh block of len+1 bytes, filled and NUL-terminated before it is returned.
    unsafe {
        let p = __libc_malloc(json.len() + 1).cast::<u8>();
        if p.is_null() {
            fail(E_NOMEM, "out of memory for the statistics string");
            return std::ptr::null_mut();
        }
        std::ptr::copy_nonoverlapping(json.as_ptr(), p, json.len());
        *p.add(json.len()) = 0;
        p.cast()
    }
}
