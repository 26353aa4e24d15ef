//! The I/O calls that copy to or from the program's memory, for when the engine cannot
//! serve the kernel's own faults.
//!
//! As an ordinary user the engine gets a user-mode-only userfaultfd (and in signal mode
//! it serves only the program's own accesses): a system call that meets a swapped-out
//! or never-touched page of managed memory fails with EFAULT instead of faulting it in
//! (`kernel_access.rs` in the engine). These wrappers make the managed parts of the
//! buffers resident first, by touching every page in user mode, then call libc:
//!
//! - `read`, `pread`/`pread64`, `readv`, `preadv`/`preadv64`, `preadv2`/`preadv64v2`,
//!   `recv`, `recvfrom`, `recvmsg`, `fread`, `fread_unlocked` (buffers the kernel writes);
//! - `write`, `pwrite`/`pwrite64`, `writev`, `pwritev`/`pwritev64`,
//!   `pwritev2`/`pwritev64v2`, `send`, `sendto`, `sendmsg`, `fwrite`, `fwrite_unlocked`
//!   (buffers it reads);
//! - the `_FORTIFY_SOURCE` forms `__read_chk`, `__pread_chk`, `__pread64_chk`,
//!   `__recv_chk`, `__recvfrom_chk`, `__fread_chk`, `__fread_unlocked_chk`.
//!
//! Only the data buffers are made resident, not the small structures beside them
//! (socket addresses, `msghdr`, control data, iovec arrays are read by these wrappers
//! themselves, so they are resident anyway).
//!
//! **Nothing pins a page** between the touch and the call, so eviction may take one back
//! in between. The call then fails with EFAULT having transferred nothing: reads and
//! writes on files, pipes and stream sockets copy nothing before the fault, or return the
//! short count of what they copied, which the loop below carries on from. The wrapper
//! touches the buffer again and retries, at most [`RETRIES`] times: the touch faults the
//! buffer in onto the active list (`Mm::prefaulting`), behind which the inactive list is
//! evicted first, so a second EFAULT needs about memory_high's worth of evictions
//! between the touch and the call, or an EFAULT that
//! is not about managed memory (another bad pointer); retrying that for ever would hang
//! the program, so after the last retry the EFAULT is the caller's. One exception: a
//! datagram socket drops a datagram that fails to copy (UDP counts it as a receive
//! error), so datagrams are received into a buffer of the library's own and copied into
//! place in user mode instead (`bounced`), at the cost of one copy.
//!
//! **Buffers larger than memory_high** cannot be resident at once, so a managed buffer
//! longer than a chunk (memory_high / 16, at least 256 KiB) is transferred a chunk at a
//! time: files (regular files and block devices) and writes to pipes and stream sockets
//! are looped over chunk by chunk, returning the total as one call would; reads from
//! anything else are one call with the first chunk resident (the kernel stops at what
//! it has, or at the first missing page with a short count, as those descriptors may);
//! a datagram is sent whole. A write to a regular file larger than a chunk is therefore
//! several writes, no longer atomic against other writers of the same file.
//!
//! An `fread` or `fwrite` shorter than the stream's buffer goes through that buffer, in
//! user mode, and is passed on as it is (`through_buffer_below`).
//!
//! Whether a buffer holds managed memory is asked of the engine's address map without
//! blocking (`kernel_buffer_probe`): a signal handler that writes to a pipe from its
//! stack never waits on a lock here. When the map is busy the call is made as it is (a
//! datagram read through the library's buffer) and only an EFAULT sends it down the
//! careful path. With a full userfaultfd in thread mode none of this runs: each wrapper
//! is one relaxed load, then libc.

use engine::{kernel_buffer_probe, prefault_for_kernel, Engine, KernelBuffer};
use libc::{c_int, c_void, iovec, off_t, size_t, ssize_t, FILE};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Whether the engine needs these wrappers (it does not serve the kernel's faults).
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// Bytes of managed buffer made resident for one call (usize::MAX: no limit).
static CHUNK: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Retries of a call that failed with EFAULT on managed memory (see the module comment).
pub const RETRIES: u32 = 8;
/// A transfer larger than a chunk goes through at most this many iovecs per call.
const WINDOW: usize = 64;

/// The engine has started: turn the wrappers on if it needs them.
pub fn engine_started(engine: &Engine) {
    let active = !engine.serves_kernel_faults();
    let chunk = match engine.config().memory_high {
        Some(high) => ((high / 16) as usize).max(256 << 10) & !4095,
        None => usize::MAX,
    };
    CHUNK.store(chunk, Ordering::Relaxed);
    ACTIVE.store(active, Ordering::Release);
}

/// The engine is gone (a forked child abandons its parent's).
pub fn engine_gone() {
    ACTIVE.store(false, Ordering::Release);
}

fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

fn errno() -> c_int {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() }
}

/// libc's definition of `name` (NUL-terminated), found once.
pub(crate) fn resolve(slot: &AtomicUsize, name: &str) -> usize {
    let mut f = slot.load(Ordering::Relaxed);
    if f == 0 {
        // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT finds the definition after
        // this library's, libc's.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) } as usize;
        if f == 0 {
            let msg = format!("folioswap: cannot find libc's {}\n", name.trim_end_matches('\0'));
            // SAFETY: a raw write(2) of a live buffer (not the interposed write), then abort.
            unsafe {
                libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len());
                libc::abort();
            }
        }
        slot.store(f, Ordering::Relaxed);
    }
    f
}

/// `real!(name: type)`: libc's `name` as a function pointer of `type`.
macro_rules! real {
    ($name:ident : $ty:ty) => {{
        static SLOT: AtomicUsize = AtomicUsize::new(0);
        let f = resolve(&SLOT, concat!(stringify!($name), "\0"));
        // SAFETY: `f` is libc's function of that name, whose C signature `$ty` spells out.
        unsafe { std::mem::transmute::<usize, $ty>(f) }
    }};
}
pub(crate) use real;

type ReadFn = unsafe extern "C" fn(c_int, *mut c_void, size_t) -> ssize_t;
type WriteFn = unsafe extern "C" fn(c_int, *const c_void, size_t) -> ssize_t;
type PreadFn = unsafe extern "C" fn(c_int, *mut c_void, size_t, off_t) -> ssize_t;
type PwriteFn = unsafe extern "C" fn(c_int, *const c_void, size_t, off_t) -> ssize_t;
type VecFn = unsafe extern "C" fn(c_int, *const iovec, c_int) -> ssize_t;
type PvecFn = unsafe extern "C" fn(c_int, *const iovec, c_int, off_t) -> ssize_t;
type Pvec2Fn = unsafe extern "C" fn(c_int, *const iovec, c_int, off_t, c_int) -> ssize_t;
type RecvFn = unsafe extern "C" fn(c_int, *mut c_void, size_t, c_int) -> ssize_t;
type SendFn = unsafe extern "C" fn(c_int, *const c_void, size_t, c_int) -> ssize_t;
type RecvfromFn = unsafe extern "C" fn(c_int, *mut c_void, size_t, c_int, *mut libc::sockaddr, *mut libc::socklen_t) -> ssize_t;
type SendtoFn = unsafe extern "C" fn(c_int, *const c_void, size_t, c_int, *const libc::sockaddr, libc::socklen_t) -> ssize_t;
type RecvmsgFn = unsafe extern "C" fn(c_int, *mut libc::msghdr, c_int) -> ssize_t;
type SendmsgFn = unsafe extern "C" fn(c_int, *const libc::msghdr, c_int) -> ssize_t;
type FreadFn = unsafe extern "C" fn(*mut c_void, size_t, size_t, *mut FILE) -> size_t;
type FwriteFn = unsafe extern "C" fn(*const c_void, size_t, size_t, *mut FILE) -> size_t;

// ---- the careful path ---------------------------------------------------------------

/// Which way the data goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    /// The kernel writes the buffers (read, recv).
    Into,
    /// The kernel reads them (write, send).
    From,
}

/// What a descriptor does with a long transfer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FdKind {
    /// Regular file or block device: a short count means the end (or a fault).
    File,
    /// Pipe, FIFO, stream socket, terminal, character device.
    Stream,
    /// Datagram or sequenced-packet socket: one call, one message.
    Message,
}

/// The descriptor's kind, asked once and only when a transfer needs it.
struct Kind {
    fd: c_int,
    kind: Option<FdKind>,
}

impl Kind {
    fn new(fd: c_int) -> Kind {
        Kind { fd, kind: None }
    }

    fn get(&mut self) -> FdKind {
        let fd = self.fd;
        *self.kind.get_or_insert_with(|| {
            // SAFETY: fstat and getsockopt write only into the live locals they are given.
            unsafe {
                let mut st: libc::stat = std::mem::zeroed();
                if libc::fstat(fd, &mut st) != 0 {
                    return FdKind::Stream;
                }
                match st.st_mode & libc::S_IFMT {
                    libc::S_IFREG | libc::S_IFBLK => FdKind::File,
                    libc::S_IFSOCK => {
                        let mut ty: c_int = 0;
                        let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
                        let ok = libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_TYPE, (&mut ty as *mut c_int).cast(), &mut len) == 0;
                        if ok && ty != libc::SOCK_STREAM {
                            FdKind::Message
                        } else {
                            FdKind::Stream
                        }
                    }
                    _ => FdKind::Stream,
                }
            }
        })
    }
}

fn total_len(iov: &[iovec]) -> usize {
    iov.iter().fold(0usize, |sum, v| sum.saturating_add(v.iov_len))
}

/// Whether the buffers hold managed memory that needs touching (never blocks).
fn probe(iov: &[iovec]) -> KernelBuffer {
    let mut unknown = false;
    for v in iov {
        match kernel_buffer_probe(v.iov_base as *const u8, v.iov_len) {
            KernelBuffer::NeedsPrefault => return KernelBuffer::NeedsPrefault,
            KernelBuffer::Unknown => unknown = true,
            KernelBuffer::Unaffected => {}
        }
    }
    if unknown {
        KernelBuffer::Unknown
    } else {
        KernelBuffer::Unaffected
    }
}

/// Touch the managed memory in the first `reach` bytes of the buffers; whether any was.
fn prefault(iov: &[iovec], mut reach: usize, retry: bool) -> bool {
    let mut managed = false;
    for v in iov {
        if reach == 0 {
            break;
        }
        let len = v.iov_len.min(reach);
        managed |= prefault_for_kernel(v.iov_base as *const u8, len, retry);
        reach -= len;
    }
    managed
}

/// Make the first `reach` bytes resident and call; retry an EFAULT on managed memory.
fn with_retries(iov: &[iovec], reach: usize, mut call: impl FnMut() -> ssize_t) -> ssize_t {
    let mut attempt = 0;
    loop {
        let managed = prefault(iov, reach, attempt > 0);
        let r = call();
        if r >= 0 || attempt == RETRIES || !managed {
            return r;
        }
        let e = errno();
        if e != libc::EFAULT {
            return r;
        }
        attempt += 1;
    }
}

/// Up to `max` bytes of the buffers from byte `skip` on, as at most WINDOW iovecs in
/// `out`: how many, and their bytes.
fn window(iov: &[iovec], mut skip: usize, max: usize, out: &mut [iovec; WINDOW]) -> (usize, usize) {
    let (mut n, mut bytes) = (0, 0);
    for v in iov {
        if skip >= v.iov_len {
            skip -= v.iov_len;
            continue;
        }
        if n == WINDOW || bytes == max {
            break;
        }
        let len = (v.iov_len - skip).min(max - bytes);
        // SAFETY: `skip` < iov_len, so the base stays inside the caller's buffer.
        out[n] = iovec { iov_base: unsafe { v.iov_base.cast::<u8>().add(skip) }.cast(), iov_len: len };
        n += 1;
        bytes += len;
        skip = 0;
    }
    (n, bytes)
}

/// One transfer through `call(buffers, done)`, which makes the system call for the part
/// of the buffers given, `done` bytes into the transfer.
fn transfer(fd: c_int, dir: Dir, iov: &[iovec], mut call: impl FnMut(&[iovec], usize) -> ssize_t) -> ssize_t {
    if !active() {
        return call(iov, 0);
    }
    match probe(iov) {
        KernelBuffer::Unaffected => return call(iov, 0),
        KernelBuffer::NeedsPrefault => {}
        KernelBuffer::Unknown => {
            // The map is busy (being written, perhaps by the thread a signal handler of
            // this one interrupted): do not wait for it. A datagram goes through the
            // library's buffer (an EFAULT would lose it); anything else is tried as it is,
            // and only an EFAULT sends it down the careful path.
            if dir == Dir::Into && Kind::new(fd).get() == FdKind::Message {
                return bounced(iov, call);
            }
            let r = call(iov, 0);
            if r >= 0 || errno() != libc::EFAULT {
                return r;
            }
        }
    }
    careful(fd, dir, iov, call)
}

fn careful(fd: c_int, dir: Dir, iov: &[iovec], mut call: impl FnMut(&[iovec], usize) -> ssize_t) -> ssize_t {
    let total = total_len(iov);
    let chunk = CHUNK.load(Ordering::Relaxed);
    let mut kind = Kind::new(fd);
    if dir == Dir::Into && kind.get() == FdKind::Message {
        return bounced(iov, call);
    }
    if total > chunk {
        match (dir, kind.get()) {
            // The kernel fills a read from the start and stops at what it has (or at the
            // first missing page, short): the first chunk resident is enough.
            (Dir::Into, FdKind::Stream) => return with_retries(iov, chunk, || call(iov, 0)),
            // A datagram goes whole or not at all.
            (Dir::From, FdKind::Message) => return with_retries(iov, total, || call(iov, 0)),
            _ => {}
        }
    }
    let mut out = [iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; WINDOW];
    let mut done = 0usize;
    loop {
        let (part, bytes) = if done == 0 && total <= chunk {
            (iov, total)
        } else {
            let (n, bytes) = window(iov, done, chunk, &mut out);
            (&out[..n], bytes)
        };
        let r = with_retries(part, bytes, || call(part, done));
        if r < 0 {
            return if done > 0 { done as ssize_t } else { r };
        }
        done += r as usize;
        if r == 0 || done >= total {
            return done as ssize_t;
        }
        match kind.get() {
            // A short count from a file: the end (the next call returns 0) or a page
            // evicted under the copy (the next call goes on from it).
            FdKind::File => {}
            FdKind::Stream if dir == Dir::From && r as usize == bytes => {}
            _ => return done as ssize_t,
        }
    }
}

thread_local! {
    /// This thread's buffer for datagrams received on behalf of managed memory.
    static BOUNCE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The longest datagram received whole into managed memory (`bounced`).
const BOUNCE_MAX: usize = 4 << 20;

/// Receive a datagram into a buffer of the library's own, then copy it into the caller's
/// buffers in user mode (where the engine serves the faults). Touching the caller's
/// buffers first would not do: a page evicted before the kernel's copy makes the kernel
/// drop the datagram (UDP counts a receive error; a Unix datagram is lost too), and a
/// retry would wait for the next one. Only a datagram longer than BOUNCE_MAX (4 MiB, far
/// beyond UDP's 64 KiB and Unix sockets' default 208 KiB) comes back truncated where the
/// caller's buffer was longer.
fn bounced(iov: &[iovec], mut call: impl FnMut(&[iovec], usize) -> ssize_t) -> ssize_t {
    let cap = total_len(iov).min(BOUNCE_MAX);
    let mut receive = |buf: &mut Vec<u8>| {
        if buf.len() < cap {
            buf.resize(cap, 0);
        }
        let tmp = [iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: cap }];
        let r = call(&tmp, 0);
        if r > 0 {
            let e = errno();
            let mut from = &buf[..(r as usize).min(cap)];
            for v in iov {
                let n = from.len().min(v.iov_len);
                // SAFETY: `v` is one of the caller's buffers, at least `n` bytes long,
                // which cannot overlap the library's own.
                unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), v.iov_base.cast::<u8>(), n) };
                from = &from[n..];
            }
            // SAFETY: errno is this thread's; the copy's faults must not change it.
            unsafe { *libc::__errno_location() = e };
        }
        r
    };
    // A signal handler that receives while this thread is in here gets a buffer of its own.
    BOUNCE.with(|b| match b.try_borrow_mut() {
        Ok(mut buf) => receive(&mut buf),
        Err(_) => receive(&mut Vec::new()),
    })
}

fn one(buf: *const c_void, len: size_t) -> [iovec; 1] {
    [iovec { iov_base: buf as *mut c_void, iov_len: len }]
}

/// The program's iovec array, or None for a count the kernel refuses itself.
///
/// # Safety
/// `iov` must point to `count` iovecs, as for readv(2).
unsafe fn iovecs<'a>(iov: *const iovec, count: c_int) -> Option<&'a [iovec]> {
    if count <= 0 || count as usize > libc::UIO_MAXIOV as usize || iov.is_null() {
        return None;
    }
    // SAFETY: per the function contract.
    Some(unsafe { std::slice::from_raw_parts(iov, count as usize) })
}

fn off(base: off_t, done: usize) -> off_t {
    base.wrapping_add(done as off_t)
}

// ---- read, write and their positional and vectored forms ---------------------------

/// # Safety
/// As read(2).
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    let f = real!(read: ReadFn);
    // SAFETY: libc's read, given a part of the caller's buffer.
    transfer(fd, Dir::Into, &one(buf, count), |w, _| unsafe { f(fd, w[0].iov_base, w[0].iov_len) })
}

/// # Safety
/// As write(2).
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    let f = real!(write: WriteFn);
    // SAFETY: libc's write, given a part of the caller's buffer.
    transfer(fd, Dir::From, &one(buf, count), |w, _| unsafe { f(fd, w[0].iov_base, w[0].iov_len) })
}

fn pread_with(f: PreadFn, fd: c_int, buf: *mut c_void, count: size_t, offset: off_t) -> ssize_t {
    // SAFETY: libc's pread, given a part of the caller's buffer at the matching offset.
    transfer(fd, Dir::Into, &one(buf, count), |w, done| unsafe { f(fd, w[0].iov_base, w[0].iov_len, off(offset, done)) })
}

fn pwrite_with(f: PwriteFn, fd: c_int, buf: *const c_void, count: size_t, offset: off_t) -> ssize_t {
    // SAFETY: as pread_with.
    transfer(fd, Dir::From, &one(buf, count), |w, done| unsafe { f(fd, w[0].iov_base, w[0].iov_len, off(offset, done)) })
}

/// # Safety
/// As pread(2).
#[no_mangle]
pub unsafe extern "C" fn pread(fd: c_int, buf: *mut c_void, count: size_t, offset: off_t) -> ssize_t {
    pread_with(real!(pread: PreadFn), fd, buf, count, offset)
}

/// # Safety
/// As pread(2).
#[no_mangle]
pub unsafe extern "C" fn pread64(fd: c_int, buf: *mut c_void, count: size_t, offset: off_t) -> ssize_t {
    pread_with(real!(pread64: PreadFn), fd, buf, count, offset)
}

/// # Safety
/// As pwrite(2).
#[no_mangle]
pub unsafe extern "C" fn pwrite(fd: c_int, buf: *const c_void, count: size_t, offset: off_t) -> ssize_t {
    pwrite_with(real!(pwrite: PwriteFn), fd, buf, count, offset)
}

/// # Safety
/// As pwrite(2).
#[no_mangle]
pub unsafe extern "C" fn pwrite64(fd: c_int, buf: *const c_void, count: size_t, offset: off_t) -> ssize_t {
    pwrite_with(real!(pwrite64: PwriteFn), fd, buf, count, offset)
}

/// # Safety
/// As readv(2).
#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, count: c_int) -> ssize_t {
    let f = real!(readv: VecFn);
    // SAFETY: per the function contract.
    match unsafe { iovecs(iov, count) } {
        // SAFETY: libc's readv, given (part of) the caller's buffers.
        Some(v) if active() => transfer(fd, Dir::Into, v, |w, _| unsafe { f(fd, w.as_ptr(), w.len() as c_int) }),
        // SAFETY: per the function contract.
        _ => unsafe { f(fd, iov, count) },
    }
}

/// # Safety
/// As writev(2).
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, count: c_int) -> ssize_t {
    let f = real!(writev: VecFn);
    // SAFETY: per the function contract.
    match unsafe { iovecs(iov, count) } {
        // SAFETY: libc's writev, given (part of) the caller's buffers.
        Some(v) if active() => transfer(fd, Dir::From, v, |w, _| unsafe { f(fd, w.as_ptr(), w.len() as c_int) }),
        // SAFETY: per the function contract.
        _ => unsafe { f(fd, iov, count) },
    }
}

/// # Safety
/// `iov` as for preadv(2).
unsafe fn pvec_with(f: PvecFn, dir: Dir, fd: c_int, iov: *const iovec, count: c_int, offset: off_t) -> ssize_t {
    // SAFETY: per the function contract.
    match unsafe { iovecs(iov, count) } {
        // SAFETY: libc's preadv/pwritev, given (part of) the caller's buffers at the matching offset.
        Some(v) if active() => transfer(fd, dir, v, |w, done| unsafe { f(fd, w.as_ptr(), w.len() as c_int, off(offset, done)) }),
        // SAFETY: per the function contract.
        _ => unsafe { f(fd, iov, count, offset) },
    }
}

/// # Safety
/// `iov` as for preadv2(2). An offset of -1 means the file position, which moves by
/// itself between the parts of a long transfer.
unsafe fn pvec2_with(f: Pvec2Fn, dir: Dir, fd: c_int, iov: *const iovec, count: c_int, offset: off_t, flags: c_int) -> ssize_t {
    let at = |done: usize| if offset == -1 { -1 } else { off(offset, done) };
    // SAFETY: per the function contract.
    match unsafe { iovecs(iov, count) } {
        // SAFETY: as pvec_with.
        Some(v) if active() => transfer(fd, dir, v, |w, done| unsafe { f(fd, w.as_ptr(), w.len() as c_int, at(done), flags) }),
        // SAFETY: per the function contract.
        _ => unsafe { f(fd, iov, count, offset, flags) },
    }
}

/// # Safety
/// As preadv(2).
#[no_mangle]
pub unsafe extern "C" fn preadv(fd: c_int, iov: *const iovec, count: c_int, offset: off_t) -> ssize_t {
    let f = real!(preadv: PvecFn);
    // SAFETY: per the function contract.
    unsafe { pvec_with(f, Dir::Into, fd, iov, count, offset) }
}

/// # Safety
/// As preadv(2).
#[no_mangle]
pub unsafe extern "C" fn preadv64(fd: c_int, iov: *const iovec, count: c_int, offset: off_t) -> ssize_t {
    let f = real!(preadv64: PvecFn);
    // SAFETY: per the function contract.
    unsafe { pvec_with(f, Dir::Into, fd, iov, count, offset) }
}

/// # Safety
/// As pwritev(2).
#[no_mangle]
pub unsafe extern "C" fn pwritev(fd: c_int, iov: *const iovec, count: c_int, offset: off_t) -> ssize_t {
    let f = real!(pwritev: PvecFn);
    // SAFETY: per the function contract.
    unsafe { pvec_with(f, Dir::From, fd, iov, count, offset) }
}

/// # Safety
/// As pwritev(2).
#[no_mangle]
pub unsafe extern "C" fn pwritev64(fd: c_int, iov: *const iovec, count: c_int, offset: off_t) -> ssize_t {
    let f = real!(pwritev64: PvecFn);
    // SAFETY: per the function contract.
    unsafe { pvec_with(f, Dir::From, fd, iov, count, offset) }
}

/// # Safety
/// As preadv2(2).
#[no_mangle]
pub unsafe extern "C" fn preadv2(fd: c_int, iov: *const iovec, count: c_int, offset: off_t, flags: c_int) -> ssize_t {
    let f = real!(preadv2: Pvec2Fn);
    // SAFETY: per the function contract.
    unsafe { pvec2_with(f, Dir::Into, fd, iov, count, offset, flags) }
}

/// # Safety
/// As preadv2(2).
#[no_mangle]
pub unsafe extern "C" fn preadv64v2(fd: c_int, iov: *const iovec, count: c_int, offset: off_t, flags: c_int) -> ssize_t {
    let f = real!(preadv64v2: Pvec2Fn);
    // SAFETY: per the function contract.
    unsafe { pvec2_with(f, Dir::Into, fd, iov, count, offset, flags) }
}

/// # Safety
/// As pwritev2(2).
#[no_mangle]
pub unsafe extern "C" fn pwritev2(fd: c_int, iov: *const iovec, count: c_int, offset: off_t, flags: c_int) -> ssize_t {
    let f = real!(pwritev2: Pvec2Fn);
    // SAFETY: per the function contract.
    unsafe { pvec2_with(f, Dir::From, fd, iov, count, offset, flags) }
}

/// # Safety
/// As pwritev2(2).
#[no_mangle]
pub unsafe extern "C" fn pwritev64v2(fd: c_int, iov: *const iovec, count: c_int, offset: off_t, flags: c_int) -> ssize_t {
    let f = real!(pwritev64v2: Pvec2Fn);
    // SAFETY: per the function contract.
    unsafe { pvec2_with(f, Dir::From, fd, iov, count, offset, flags) }
}

// ---- sockets -------------------------------------------------------------------------

/// # Safety
/// As recv(2).
#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t {
    let f = real!(recv: RecvFn);
    // SAFETY: libc's recv, given the caller's buffer.
    transfer(fd, Dir::Into, &one(buf, len), |w, _| unsafe { f(fd, w[0].iov_base, w[0].iov_len, flags) })
}

/// # Safety
/// As send(2).
#[no_mangle]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t {
    let f = real!(send: SendFn);
    // SAFETY: libc's send, given (part of) the caller's buffer.
    transfer(fd, Dir::From, &one(buf, len), |w, _| unsafe { f(fd, w[0].iov_base, w[0].iov_len, flags) })
}

/// # Safety
/// As recvfrom(2).
#[no_mangle]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    addr: *mut libc::sockaddr,
    addrlen: *mut libc::socklen_t,
) -> ssize_t {
    let f = real!(recvfrom: RecvfromFn);
    // SAFETY: libc's recvfrom with the caller's arguments, the buffer perhaps the
    // library's (reads from sockets are never split, so the address is the data's).
    transfer(fd, Dir::Into, &one(buf, len), |w, _| unsafe { f(fd, w[0].iov_base, w[0].iov_len, flags, addr, addrlen) })
}

/// # Safety
/// As sendto(2).
#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    addr: *const libc::sockaddr,
    addrlen: libc::socklen_t,
) -> ssize_t {
    let f = real!(sendto: SendtoFn);
    // SAFETY: libc's sendto with (part of) the caller's buffer and its address.
    transfer(fd, Dir::From, &one(buf, len), |w, _| unsafe { f(fd, w[0].iov_base, w[0].iov_len, flags, addr, addrlen) })
}

/// # Safety
/// As recvmsg(2).
#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> ssize_t {
    let f = real!(recvmsg: RecvmsgFn);
    if !active() || msg.is_null() {
        // SAFETY: per the function contract.
        return unsafe { f(fd, msg, flags) };
    }
    // SAFETY: `msg` is the caller's msghdr, its iovecs as for readv.
    let Some(iov) = (unsafe { iovecs((*msg).msg_iov, (*msg).msg_iovlen as c_int) }) else {
        // SAFETY: per the function contract.
        return unsafe { f(fd, msg, flags) };
    };
    transfer(fd, Dir::Into, iov, |w, _| {
        // SAFETY: the caller's msghdr, copied with `w` (its buffers, or the library's for
        // a datagram) as the data; what the kernel reports back is copied back.
        unsafe {
            let mut m = *msg;
            m.msg_iov = w.as_ptr() as *mut iovec;
            m.msg_iovlen = w.len() as _;
            let r = f(fd, &mut m, flags);
            (*msg).msg_namelen = m.msg_namelen;
            (*msg).msg_controllen = m.msg_controllen;
            (*msg).msg_flags = m.msg_flags;
            r
        }
    })
}

/// # Safety
/// As sendmsg(2).
#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t {
    let f = real!(sendmsg: SendmsgFn);
    if !active() || msg.is_null() {
        // SAFETY: per the function contract.
        return unsafe { f(fd, msg, flags) };
    }
    // SAFETY: `msg` is the caller's msghdr, its iovecs as for writev.
    let Some(iov) = (unsafe { iovecs((*msg).msg_iov, (*msg).msg_iovlen as c_int) }) else {
        // SAFETY: per the function contract.
        return unsafe { f(fd, msg, flags) };
    };
    // SAFETY: as above; the copy is a plain struct.
    let base = unsafe { *msg };
    transfer(fd, Dir::From, iov, |w, done| {
        let mut m = base;
        m.msg_iov = w.as_ptr() as *mut iovec;
        m.msg_iovlen = w.len() as _;
        if done > 0 {
            // A stream split in parts: its control data (descriptors, credentials) went
            // with the first.
            m.msg_control = std::ptr::null_mut();
            m.msg_controllen = 0;
        }
        // SAFETY: libc's sendmsg with the caller's msghdr, (part of) its buffers.
        unsafe { f(fd, &m, flags) }
    })
}

// ---- _FORTIFY_SOURCE forms -------------------------------------------------------------

/// # Safety
/// As glibc's __read_chk.
#[no_mangle]
pub unsafe extern "C" fn __read_chk(fd: c_int, buf: *mut c_void, count: size_t, buflen: size_t) -> ssize_t {
    if count > buflen {
        let check = real!(__read_chk: unsafe extern "C" fn(c_int, *mut c_void, size_t, size_t) -> ssize_t);
        // SAFETY: libc's check fails the program, as it would have.
        return unsafe { check(fd, buf, count, buflen) };
    }
    // SAFETY: per the function contract.
    unsafe { read(fd, buf, count) }
}

/// # Safety
/// As glibc's __pread_chk.
#[no_mangle]
pub unsafe extern "C" fn __pread_chk(fd: c_int, buf: *mut c_void, count: size_t, offset: off_t, buflen: size_t) -> ssize_t {
    if count > buflen {
        let check = real!(__pread_chk: unsafe extern "C" fn(c_int, *mut c_void, size_t, off_t, size_t) -> ssize_t);
        // SAFETY: as in __read_chk.
        return unsafe { check(fd, buf, count, offset, buflen) };
    }
    pread_with(real!(pread: PreadFn), fd, buf, count, offset)
}

/// # Safety
/// As glibc's __pread64_chk.
#[no_mangle]
pub unsafe extern "C" fn __pread64_chk(fd: c_int, buf: *mut c_void, count: size_t, offset: off_t, buflen: size_t) -> ssize_t {
    if count > buflen {
        let check = real!(__pread64_chk: unsafe extern "C" fn(c_int, *mut c_void, size_t, off_t, size_t) -> ssize_t);
        // SAFETY: as in __read_chk.
        return unsafe { check(fd, buf, count, offset, buflen) };
    }
    pread_with(real!(pread64: PreadFn), fd, buf, count, offset)
}

/// # Safety
/// As glibc's __recv_chk.
#[no_mangle]
pub unsafe extern "C" fn __recv_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t, flags: c_int) -> ssize_t {
    if len > buflen {
        let check = real!(__recv_chk: unsafe extern "C" fn(c_int, *mut c_void, size_t, size_t, c_int) -> ssize_t);
        // SAFETY: as in __read_chk.
        return unsafe { check(fd, buf, len, buflen, flags) };
    }
    // SAFETY: per the function contract.
    unsafe { recv(fd, buf, len, flags) }
}

/// # Safety
/// As glibc's __recvfrom_chk.
#[no_mangle]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    buflen: size_t,
    flags: c_int,
    addr: *mut libc::sockaddr,
    addrlen: *mut libc::socklen_t,
) -> ssize_t {
    type ChkFn = unsafe extern "C" fn(c_int, *mut c_void, size_t, size_t, c_int, *mut libc::sockaddr, *mut libc::socklen_t) -> ssize_t;
    if len > buflen {
        let check = real!(__recvfrom_chk: ChkFn);
        // SAFETY: as in __read_chk.
        return unsafe { check(fd, buf, len, buflen, flags, addr, addrlen) };
    }
    // SAFETY: per the function contract.
    unsafe { recvfrom(fd, buf, len, flags, addr, addrlen) }
}

// ---- stdio ---------------------------------------------------------------------------

/// fread/fwrite of `size * n` bytes at `buf` through `call(part, bytes)`, libc's function
/// with an item size of 1 (which returns bytes; glibc's own fread and fwrite count items
/// the same way, bytes done / size). stdio reads and writes large transfers straight
/// between the caller's buffer and the descriptor, so they meet the same EFAULT; a retry
/// clears the error the EFAULT left on the stream (only if the stream had none before).
///
/// # Safety
/// `stream` must be a valid FILE.
unsafe fn stdio(
    buf: *const c_void,
    size: size_t,
    n: size_t,
    stream: *mut FILE,
    mut call: impl FnMut(*const c_void, size_t) -> size_t,
    direct: impl FnOnce() -> size_t,
) -> size_t {
    let Some(total) = size.checked_mul(n) else { return direct() };
    // SAFETY: per the function contract.
    if !active() || total == 0 || total < unsafe { through_buffer_below(stream) } {
        return direct();
    }
    if kernel_buffer_probe(buf.cast(), total) == KernelBuffer::Unaffected {
        return direct();
    }
    let chunk = CHUNK.load(Ordering::Relaxed);
    let mut done = 0usize;
    while done < total {
        let len = (total - done).min(chunk);
        let mut attempt = 0;
        let mut got = 0;
        loop {
            // SAFETY: `done + got` < total, inside the caller's buffer.
            let at = unsafe { buf.cast::<u8>().add(done + got) };
            let managed = prefault_for_kernel(at, len - got, attempt > 0);
            // SAFETY: per the function contract.
            let had_error = unsafe { libc::ferror(stream) } != 0;
            got += call(at.cast(), len - got);
            if got == len {
                break;
            }
            let e = errno();
            // SAFETY: per the function contract.
            let efault = unsafe { libc::ferror(stream) != 0 && libc::feof(stream) == 0 } && e == libc::EFAULT;
            if !(efault && managed && !had_error && attempt < RETRIES) {
                return (done + got) / size;
            }
            // SAFETY: per the function contract.
            unsafe { libc::clearerr(stream) };
            attempt += 1;
        }
        done += len;
    }
    n
}

extern "C" {
    /// The size of the stream's buffer, 0 before stdio has given it one (`stdio_ext.h`;
    /// glibc and musl).
    fn __fbufsize(stream: *mut FILE) -> size_t;
}

/// Transfers shorter than this go through the stream's own buffer, never straight
/// between the caller's memory and the kernel: glibc's `_IO_file_xsputn` and
/// `_IO_file_xsgetn` copy between the two buffers in user mode (where the engine serves
/// the faults, as for any access of the program's) and call write(2) or read(2) on the
/// caller's memory only for whole blocks of the buffer's size, or for any length where
/// the buffer is under 128 bytes (an unbuffered stream's is one byte). 0 where the
/// stream has no buffer yet. GNU sort writes its output a line at a time with fwrite:
/// made resident first, every line cost a page's `mincore` and an address-map lookup,
/// 1.04 million of them at 59M, and signal mode took 1.42 times the default's time
/// (BENCHMARKS.md, "Small stdio transfers").
///
/// # Safety
/// `stream` must be a valid FILE.
unsafe fn through_buffer_below(stream: *mut FILE) -> size_t {
    // SAFETY: per the function contract.
    let size = unsafe { __fbufsize(stream) };
    if size >= 128 {
        size
    } else {
        0
    }
}

/// # Safety
/// As fread(3).
#[no_mangle]
pub unsafe extern "C" fn fread(buf: *mut c_void, size: size_t, n: size_t, stream: *mut FILE) -> size_t {
    let f = real!(fread: FreadFn);
    // SAFETY: libc's fread with the caller's arguments, or bytes of its buffer.
    unsafe { stdio(buf, size, n, stream, |p, len| f(p as *mut c_void, 1, len, stream), || f(buf, size, n, stream)) }
}

/// # Safety
/// As fread_unlocked(3).
#[no_mangle]
pub unsafe extern "C" fn fread_unlocked(buf: *mut c_void, size: size_t, n: size_t, stream: *mut FILE) -> size_t {
    let f = real!(fread_unlocked: FreadFn);
    // SAFETY: as in fread.
    unsafe { stdio(buf, size, n, stream, |p, len| f(p as *mut c_void, 1, len, stream), || f(buf, size, n, stream)) }
}

/// # Safety
/// As fwrite(3).
#[no_mangle]
pub unsafe extern "C" fn fwrite(buf: *const c_void, size: size_t, n: size_t, stream: *mut FILE) -> size_t {
    let f = real!(fwrite: FwriteFn);
    // SAFETY: libc's fwrite with the caller's arguments, or bytes of its buffer.
    unsafe { stdio(buf, size, n, stream, |p, len| f(p, 1, len, stream), || f(buf, size, n, stream)) }
}

/// # Safety
/// As fwrite_unlocked(3).
#[no_mangle]
pub unsafe extern "C" fn fwrite_unlocked(buf: *const c_void, size: size_t, n: size_t, stream: *mut FILE) -> size_t {
    let f = real!(fwrite_unlocked: FwriteFn);
    // SAFETY: as in fwrite.
    unsafe { stdio(buf, size, n, stream, |p, len| f(p, 1, len, stream), || f(buf, size, n, stream)) }
}

/// # Safety
/// As glibc's __fread_chk.
#[no_mangle]
pub unsafe extern "C" fn __fread_chk(buf: *mut c_void, buflen: size_t, size: size_t, n: size_t, stream: *mut FILE) -> size_t {
    if !matches!(size.checked_mul(n), Some(total) if total <= buflen) {
        let check = real!(__fread_chk: unsafe extern "C" fn(*mut c_void, size_t, size_t, size_t, *mut FILE) -> size_t);
        // SAFETY: as in __read_chk.
        return unsafe { check(buf, buflen, size, n, stream) };
    }
    // SAFETY: per the function contract.
    unsafe { fread(buf, size, n, stream) }
}

/// # Safety
/// As glibc's __fread_unlocked_chk.
#[no_mangle]
pub unsafe extern "C" fn __fread_unlocked_chk(buf: *mut c_void, buflen: size_t, size: size_t, n: size_t, stream: *mut FILE) -> size_t {
    if !matches!(size.checked_mul(n), Some(total) if total <= buflen) {
        let check = real!(__fread_unlocked_chk: unsafe extern "C" fn(*mut c_void, size_t, size_t, size_t, *mut FILE) -> size_t);
        // SAFETY: as in __read_chk.
        return unsafe { check(buf, buflen, size, n, stream) };
    }
    // SAFETY: per the function contract.
    unsafe { fread_unlocked(buf, size, n, stream) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::{Config, FaultMode, RegionOptions};
    use std::sync::Mutex;

    /// The tests below change CHUNK and ACTIVE, which are process-wide.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn iov_of(buf: &mut [u8]) -> iovec {
        iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() }
    }

    #[test]
    fn a_window_is_a_chunk_from_an_offset() {
        let (mut a, mut b, mut c) = ([0u8; 100], [0u8; 0], [0u8; 300]);
        let iov = [iov_of(&mut a), iov_of(&mut b), iov_of(&mut c)];
        let mut out = [iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; WINDOW];
        let (n, bytes) = window(&iov, 60, 200, &mut out);
        assert_eq!((n, bytes), (2, 200));
        assert_eq!((out[0].iov_base as usize - a.as_ptr() as usize, out[0].iov_len), (60, 40));
        assert_eq!((out[1].iov_base as usize, out[1].iov_len), (c.as_ptr() as usize, 160));
        let (n, bytes) = window(&iov, 250, 1000, &mut out);
        assert_eq!((n, bytes), (1, 150));
        assert_eq!(out[0].iov_base as usize - c.as_ptr() as usize, 150);
    }

    /// A call that fails with EFAULT on managed memory its engine does not serve (signal
    /// mode here, which any user may run) is retried after touching the buffer again, at
    /// most RETRIES times; an EFAULT on other memory, or another error, is not retried.
    #[test]
    fn efault_is_retried_on_managed_memory_only() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let engine = Engine::new(Config::default().memory_high("16M").unwrap().fault_mode(FaultMode::Signal)).unwrap();
        assert!(!engine.serves_kernel_faults());
        let region = engine.map(1 << 20, RegionOptions::default().folio_size("64K").unwrap()).unwrap();
        let managed = one(region.as_ptr().cast(), 8192);
        let mut stack = [0u8; 64];
        let unmanaged = [iov_of(&mut stack)];
        fn failing(fails: u32, errno: c_int, calls: &std::cell::Cell<u32>) -> impl FnMut() -> ssize_t + '_ {
            move || {
                calls.set(calls.get() + 1);
                if calls.get() <= fails {
                    // SAFETY: errno is this thread's.
                    unsafe { *libc::__errno_location() = errno };
                    -1
                } else {
                    8192
                }
            }
        }
        let calls = std::cell::Cell::new(0);
        assert_eq!(with_retries(&managed, 8192, failing(3, libc::EFAULT, &calls)), 8192);
        assert_eq!(calls.get(), 4, "three EFAULTs, then success");
        calls.set(0);
        assert_eq!(with_retries(&managed, 8192, failing(u32::MAX, libc::EFAULT, &calls)), -1);
        assert_eq!((calls.get(), errno()), (RETRIES + 1, libc::EFAULT), "the retries are bounded and the EFAULT returned");
        calls.set(0);
        assert_eq!(with_retries(&managed, 8192, failing(u32::MAX, libc::EINVAL, &calls)), -1);
        assert_eq!(calls.get(), 1, "only EFAULT is retried");
        calls.set(0);
        assert_eq!(with_retries(&unmanaged, 64, failing(u32::MAX, libc::EFAULT, &calls)), -1);
        assert_eq!(calls.get(), 1, "an EFAULT on memory that is not managed is the caller's");
        let vm = engine.stats().vm;
        assert_eq!(vm.syscall_retry, 3 + RETRIES as u64);
        assert_eq!(vm.syscall_prefault, 3, "one prefault per managed call, the rest were retries");
    }

    /// A transfer longer than a chunk: files loop chunk by chunk and return the total;
    /// writes to a pipe too, while each chunk goes whole; a read from a pipe is one call
    /// with the whole buffer; a datagram is one call either way, received through a
    /// buffer of the library's own.
    #[test]
    fn long_transfers_are_split_by_descriptor_kind() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let chunk = 4096;
        let saved = CHUNK.swap(chunk, Ordering::Relaxed);
        let mut buf = vec![0u8; 10 * 1024];
        let iov = [iov_of(&mut buf)];
        let total = buf.len();
        let path = std::env::temp_dir().join(format!("folioswap-syscalls-{}", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let mut pipe = [0; 2];
        let mut dgram = [0; 2];
        // SAFETY: pipe2 and socketpair write two descriptors each into live arrays.
        unsafe {
            assert_eq!(libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC), 0);
            assert_eq!(libc::socketpair(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0, dgram.as_mut_ptr()), 0);
        }
        use std::os::fd::AsRawFd;
        // Each call transfers all it is given and reports the window sizes.
        let run = |fd: c_int, dir: Dir| {
            let mut calls = Vec::new();
            let r = careful(fd, dir, &iov, |w, done| {
                let bytes = total_len(w);
                calls.push((done, bytes));
                bytes as ssize_t
            });
            (r, calls)
        };
        let split = vec![(0, 4096), (4096, 4096), (8192, 2048)];
        assert_eq!(run(file.as_raw_fd(), Dir::Into), (total as ssize_t, split.clone()), "file read");
        assert_eq!(run(file.as_raw_fd(), Dir::From), (total as ssize_t, split.clone()), "file write");
        assert_eq!(run(pipe[1], Dir::From), (total as ssize_t, split), "pipe write");
        assert_eq!(run(pipe[0], Dir::Into), (total as ssize_t, vec![(0, total)]), "pipe read");
        assert_eq!(run(dgram[0], Dir::From), (total as ssize_t, vec![(0, total)]), "datagram");
        // A datagram read goes through the library's buffer, then into place.
        let mut seen = Vec::new();
        let r = careful(dgram[1], Dir::Into, &iov, |w, _| {
            seen.push((w.len(), w[0].iov_base as usize, w[0].iov_len));
            // SAFETY: the window is at least 3000 bytes long.
            unsafe { std::ptr::write_bytes(w[0].iov_base.cast::<u8>(), 0xab, 3000) };
            3000
        });
        assert_eq!(r, 3000);
        assert_eq!(seen.len(), 1, "one call");
        assert_eq!(seen[0].2, total, "the library's buffer, as long as the caller's");
        assert_ne!(seen[0].1, iov[0].iov_base as usize, "not the caller's buffer");
        assert!(buf[..3000].iter().all(|&b| b == 0xab) && buf[3000..].iter().all(|&b| b == 0), "copied into place");
        // A short count: a file reads on from it (here the next call says the end), a
        // pipe returns it.
        let mut calls = 0;
        let r = careful(file.as_raw_fd(), Dir::Into, &iov, |_, _| {
            calls += 1;
            if calls == 1 {
                1000
            } else {
                0
            }
        });
        assert_eq!((r, calls), (1000, 2));
        let mut calls = 0;
        let r = careful(pipe[0], Dir::Into, &iov, |_, _| {
            calls += 1;
            1000
        });
        assert_eq!((r, calls), (1000, 1));
        // SAFETY: our own descriptors.
        unsafe {
            for fd in pipe.into_iter().chain(dgram) {
                libc::close(fd);
            }
        }
        CHUNK.store(saved, Ordering::Relaxed);
    }
}
