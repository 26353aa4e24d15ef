//! The only home of raw userfaultfd (and PAGEMAP_SCAN) ioctls.
//!
//! Debian 12's headers predate `UFFDIO_MOVE` (Linux 6.8) and `PAGEMAP_SCAN` (6.7), and the
//! `userfaultfd` crate predates MOVE too, so the ABI is written out here from
//! `include/uapi/linux/userfaultfd.h` and `include/uapi/linux/fs.h`. Everything above this
//! module speaks in addresses, lengths and [`IoctlError`]s; nothing else calls `ioctl`.
//!
//! The engine opens two userfaultfds (see `ARCHITECTURE.md` in this repository):
//! one registered in MISSING mode on application regions (faults and REMOVE/UNMAP/REMAP
//! events arrive there; in copy mode WP too, for evictions), and one registered in WP
//! mode on staging areas, which makes them valid `UFFDIO_MOVE` destinations without
//! turning the engine's own accesses to staging into userfaults or its own
//! `MADV_DONTNEED`s into events. Where the kernel lacks `UFFD_FEATURE_MOVE` (before 6.8)
//! neither asks for it and the engine runs in copy mode ([`InstallMode::Copy`]).
//!
//! **Who may open one.** The plain `userfaultfd(2)` needs CAP_SYS_PTRACE or
//! `vm.unprivileged_userfaultfd=1`; `/dev/userfaultfd` (Linux 6.1+) needs access to the
//! device. Where both are refused, as for an ordinary user on most distributions, a
//! descriptor opened with `UFFD_USER_MODE_ONLY` (Linux 5.11+) is still allowed: it gets
//! the faults the program's own instructions take, but a fault the kernel takes while
//! copying to or from user memory for a system call (read(2) into a missing page, GUP,
//! O_DIRECT, futexes) fails with EFAULT instead of waiting for the engine. Each [`Uffd`]
//! records which it got ([`UffdMode`]).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const UFFDIO: u64 = 0xAA;
const UFFD_API: u64 = 0xAA;

const fn ioc(dir: u64, ty: u64, nr: u64, size: u64) -> u64 {
    (dir << 30) | (size << 16) | (ty << 8) | nr
}
const IOC_READ: u64 = 2;
const IOC_RW: u64 = 3;

const UFFDIO_API: u64 = ioc(IOC_RW, UFFDIO, 0x3F, 24);
const UFFDIO_REGISTER: u64 = ioc(IOC_RW, UFFDIO, 0x00, 32);
const UFFDIO_UNREGISTER: u64 = ioc(IOC_READ, UFFDIO, 0x01, 16);
const UFFDIO_WAKE: u64 = ioc(IOC_READ, UFFDIO, 0x02, 16);
const UFFDIO_COPY: u64 = ioc(IOC_RW, UFFDIO, 0x03, 40);
const UFFDIO_MOVE: u64 = ioc(IOC_RW, UFFDIO, 0x05, 40);
const UFFDIO_WRITEPROTECT: u64 = ioc(IOC_RW, UFFDIO, 0x06, 24);
/// `/dev/userfaultfd`'s `USERFAULTFD_IOC_NEW` (`_IO(0xAA, 0x00)`).
const USERFAULTFD_IOC_NEW: u64 = ioc(0, UFFDIO, 0x00, 0);
const PAGEMAP_SCAN: u64 = ioc(IOC_RW, b'f' as u64, 16, 96);

pub const FEATURE_EVENT_REMAP: u64 = 1 << 2;
pub const FEATURE_EVENT_REMOVE: u64 = 1 << 3;
pub const FEATURE_EVENT_UNMAP: u64 = 1 << 6;
pub const FEATURE_SIGBUS: u64 = 1 << 7;
pub const FEATURE_THREAD_ID: u64 = 1 << 8;
pub const FEATURE_WP_ASYNC: u64 = 1 << 15;
pub const FEATURE_MOVE: u64 = 1 << 16;

pub const REGISTER_MODE_MISSING: u64 = 1 << 0;
pub const REGISTER_MODE_WP: u64 = 1 << 1;

const COPY_MODE_DONTWAKE: u64 = 1 << 0;
const MOVE_MODE_DONTWAKE: u64 = 1 << 0;
const MOVE_MODE_ALLOW_SRC_HOLES: u64 = 1 << 1;
const WRITEPROTECT_MODE_WP: u64 = 1 << 0;

const EVENT_PAGEFAULT: u8 = 0x12;
const EVENT_FORK: u8 = 0x13;
const EVENT_REMAP: u8 = 0x14;
const EVENT_REMOVE: u8 = 0x15;
const EVENT_UNMAP: u8 = 0x16;

/// `userfaultfd(2)` flag (Linux 5.11+): handle only faults taken in user mode. Allowed
/// without privilege; Debian 12's headers predate it.
const UFFD_USER_MODE_ONLY: libc::c_int = 1;

const PAGE: usize = 4096;
const PAGE_IS_HUGE: u64 = 1 << 6;
const PAGE_IS_WRITTEN: u64 = 1 << 1;
const PM_SCAN_WP_MATCHING: u64 = 1 << 0;
const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;
const PAGE_IS_PRESENT: u64 = 1 << 3;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}
#[repr(C)]
struct UffdioRange {
    start: u64,
    len: u64,
}
#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}
#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}
#[repr(C)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}
#[repr(C)]
struct UffdioMove {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    moved: i64,
}
/// `struct uffd_msg`: an event byte, padding, then a 24-byte union.
#[repr(C)]
#[derive(Clone, Copy)]
struct RawMsg {
    event: u8,
    _reserved1: u8,
    _reserved2: u16,
    _reserved3: u32,
    arg: [u64; 3],
}
#[repr(C)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

/// One message read from a userfaultfd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Msg {
    /// A thread touched a missing page at `addr`; `tid` is the faulting thread.
    PageFault { addr: usize, write: bool, tid: u32 },
    /// `madvise(MADV_DONTNEED/MADV_FREE/MADV_REMOVE)`: the kernel zaps `[start, end)` once this is read.
    Remove { start: usize, end: usize },
    /// `munmap` (or an `mremap` shrink) removed `[start, end)` from the address space.
    Unmap { start: usize, end: usize },
    /// `mremap` moved `[from, from + len)` to `[to, to + len)`.
    Remap { from: usize, to: usize, len: usize },
    /// An event this engine did not ask for.
    Other(u8),
}

/// A failed userfaultfd ioctl: the errno and how many bytes it did before failing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoctlError {
    pub errno: i32,
    pub done: usize,
}

impl IoctlError {
    pub fn is(&self, errno: i32) -> bool {
        self.errno == errno
    }
}

impl std::fmt::Display for IoctlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} after {} bytes", io::Error::from_raw_os_error(self.errno), self.done)
    }
}

fn last_errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// Why a userfaultfd could not be had.
#[derive(Debug)]
pub enum OpenError {
    /// Neither the syscall nor `/dev/userfaultfd` gave a descriptor.
    Unavailable { errno: i32 },
    /// The kernel lacks features the engine needs (names listed).
    MissingFeatures { missing: Vec<&'static str> },
}

/// Which faults a userfaultfd receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UffdMode {
    /// Every fault on a registered range, including those the kernel takes on the
    /// program's behalf inside system calls (root, CAP_SYS_PTRACE,
    /// `vm.unprivileged_userfaultfd=1`, or access to `/dev/userfaultfd`).
    #[default]
    Full,
    /// `UFFD_USER_MODE_ONLY`: only faults of the program's own instructions; a system call
    /// that touches a missing page of a registered range fails with EFAULT. What an
    /// unprivileged process gets where the other ways are refused.
    UserModeOnly,
}

impl std::fmt::Display for UffdMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            UffdMode::Full => "full",
            UffdMode::UserModeOnly => "user-mode-only",
        })
    }
}

/// How the engine puts pages into regions and takes them out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum InstallMode {
    /// `UFFDIO_MOVE` (Linux 6.8+): evictions move page-table entries out whole, 2 MiB
    /// folios move back in as THPs.
    #[default]
    Move,
    /// `UFFDIO_COPY` in, and out by write-protect, copy, `MADV_DONTNEED` (`evict.rs`
    /// `copy_out`); 2 MiB folios become THPs again by `MADV_COLLAPSE` (Linux 6.1+). What
    /// kernels 5.7 to 6.7 get, or any kernel with `uffd_move` off.
    Copy,
}

impl std::fmt::Display for InstallMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            InstallMode::Move => "move",
            InstallMode::Copy => "copy",
        })
    }
}

/// An open userfaultfd after the `UFFDIO_API` handshake.
pub struct Uffd {
    fd: OwnedFd,
    mode: UffdMode,
}

const FEATURE_NAMES: &[(u64, &str)] = &[
    (FEATURE_EVENT_REMAP, "UFFD_FEATURE_EVENT_REMAP"),
    (FEATURE_EVENT_REMOVE, "UFFD_FEATURE_EVENT_REMOVE"),
    (FEATURE_EVENT_UNMAP, "UFFD_FEATURE_EVENT_UNMAP"),
    (FEATURE_SIGBUS, "UFFD_FEATURE_SIGBUS"),
    (FEATURE_THREAD_ID, "UFFD_FEATURE_THREAD_ID"),
    (FEATURE_MOVE, "UFFD_FEATURE_MOVE (UFFDIO_MOVE, Linux 6.8+)"),
    (FEATURE_WP_ASYNC, "UFFD_FEATURE_WP_ASYNC (Linux 6.7+)"),
];

/// `userfaultfd(2)` with `flags`: the new descriptor, or the errno.
fn syscall_userfaultfd(flags: libc::c_int) -> Result<OwnedFd, i32> {
    // SAFETY: userfaultfd(2) takes only a flags argument and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) } as RawFd;
    if fd < 0 {
        return Err(last_errno());
    }
    // SAFETY: the syscall just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A new userfaultfd through `/dev/userfaultfd` (Linux 6.1+), which hands them to whoever
/// may open the device, whatever `vm.unprivileged_userfaultfd` says.
fn dev_userfaultfd(flags: libc::c_int) -> Result<OwnedFd, i32> {
    let path = c"/dev/userfaultfd";
    // SAFETY: `path` is a NUL-terminated string literal; open returns a descriptor or -1.
    let dev = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if dev < 0 {
        return Err(last_errno());
    }
    // SAFETY: `dev` is an open descriptor we own; the ioctl takes the new fd's flags by value.
    let fd = unsafe { libc::ioctl(dev, USERFAULTFD_IOC_NEW as _, flags) };
    let errno = last_errno();
    // SAFETY: `dev` is ours and no longer needed.
    unsafe { libc::close(dev) };
    if fd < 0 {
        return Err(errno);
    }
    // SAFETY: the ioctl returned a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A new userfaultfd, full if this process may have one, else user-mode-only. The
/// error, if even that fails, is the plain syscall's (it names the permission missing).
fn open_raw() -> Result<(OwnedFd, UffdMode), OpenError> {
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    let syscall_errno = match syscall_userfaultfd(flags) {
        Ok(fd) => return Ok((fd, UffdMode::Full)),
        Err(errno) => errno,
    };
    if let Ok(fd) = dev_userfaultfd(flags) {
        return Ok((fd, UffdMode::Full));
    }
    if matches!(syscall_errno, libc::EPERM | libc::EACCES) {
        if let Ok(fd) = syscall_userfaultfd(flags | UFFD_USER_MODE_ONLY) {
            return Ok((fd, UffdMode::UserModeOnly));
        }
    }
    Err(OpenError::Unavailable { errno: syscall_errno })
}

impl Uffd {
    /// The features this kernel offers (a throwaway descriptor answers `UFFDIO_API` with 0).
    pub fn available_features() -> Result<u64, OpenError> {
        let (fd, _) = open_raw()?;
        let mut api = UffdioApi { api: UFFD_API, features: 0, ioctls: 0 };
        // SAFETY: `api` is a properly laid out struct uffdio_api that outlives the call.
        if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, &mut api) } != 0 {
            return Err(OpenError::Unavailable { errno: last_errno() });
        }
        Ok(api.features)
    }

    /// Open a userfaultfd with exactly `features`, failing with their names if any is missing.
    pub fn open(features: u64) -> Result<Uffd, OpenError> {
        let available = Self::available_features()?;
        let missing: Vec<&'static str> =
            FEATURE_NAMES.iter().filter(|(bit, _)| features & bit != 0 && available & bit == 0).map(|(_, name)| *name).collect();
        if !missing.is_empty() {
            return Err(OpenError::MissingFeatures { missing });
        }
        let (fd, mode) = open_raw()?;
        let mut api = UffdioApi { api: UFFD_API, features, ioctls: 0 };
        // SAFETY: as above; the kernel fills `api` in place.
        if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, &mut api) } != 0 {
            return Err(OpenError::Unavailable { errno: last_errno() });
        }
        Ok(Uffd { fd, mode })
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// A second descriptor for the same userfaultfd (registrations and ioctls through
    /// either act on one context).
    pub fn try_clone(&self) -> io::Result<Uffd> {
        Ok(Uffd { fd: self.fd.try_clone()?, mode: self.mode })
    }

    /// Whether this descriptor also gets the faults the kernel takes inside system calls.
    pub fn mode(&self) -> UffdMode {
        self.mode
    }

    /// Register `[start, start + len)` (page aligned) in `mode`.
    pub fn register(&self, start: usize, len: usize, mode: u64) -> io::Result<()> {
        let mut reg = UffdioRegister { range: UffdioRange { start: start as u64, len: len as u64 }, mode, ioctls: 0 };
        // SAFETY: `reg` is a valid struct uffdio_register; the range is only read by the kernel.
        if unsafe { libc::ioctl(self.raw_fd(), UFFDIO_REGISTER as _, &mut reg) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn unregister(&self, start: usize, len: usize) -> io::Result<()> {
        let mut range = UffdioRange { start: start as u64, len: len as u64 };
        // SAFETY: `range` is a valid struct uffdio_range.
        if unsafe { libc::ioctl(self.raw_fd(), UFFDIO_UNREGISTER as _, &mut range) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Wake threads waiting on faults in `[start, start + len)`.
    pub fn wake(&self, start: usize, len: usize) {
        let mut range = UffdioRange { start: start as u64, len: len as u64 };
        // SAFETY: `range` is a valid struct uffdio_range. Waking a range nobody waits on is a
        // no-op, so the result carries no information worth returning.
        unsafe { libc::ioctl(self.raw_fd(), UFFDIO_WAKE as _, &mut range) };
    }

    /// Install a copy of `[src, src + len)` at `dst` (4 KiB pages, always). Stops at the first
    /// page already present with EEXIST.
    pub fn copy(&self, dst: usize, src: *const u8, len: usize, wake: bool) -> Result<(), IoctlError> {
        let mut c =
            UffdioCopy { dst: dst as u64, src: src as u64, len: len as u64, mode: if wake { 0 } else { COPY_MODE_DONTWAKE }, copy: 0 };
        // SAFETY: `c` is a valid struct uffdio_copy. The kernel only reads `src` (which the
        // caller keeps mapped and readable for `len` bytes) and writes into `dst`, a range
        // registered with this descriptor; it never touches our Rust-visible memory otherwise.
        if unsafe { libc::ioctl(self.raw_fd(), UFFDIO_COPY as _, &mut c) } == 0 {
            return Ok(());
        }
        let errno = last_errno();
        Err(IoctlError { errno, done: c.copy.max(0) as usize })
    }

    /// Move the pages of `[src, src + len)` to `dst` (which must be registered with this
    /// descriptor). Holes in the source are allowed and leave holes.
    pub fn move_pages(&self, dst: usize, src: usize, len: usize, wake: bool) -> Result<(), IoctlError> {
        let mut m = UffdioMove {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            mode: MOVE_MODE_ALLOW_SRC_HOLES | if wake { 0 } else { MOVE_MODE_DONTWAKE },
            moved: 0,
        };
        // SAFETY: `m` is a valid struct uffdio_move. The kernel remaps page-table entries
        // between two ranges the engine owns; the caller guarantees no Rust reference points
        // into either range across the call (both are raw managed or staging memory).
        if unsafe { libc::ioctl(self.raw_fd(), UFFDIO_MOVE as _, &mut m) } == 0 {
            return Ok(());
        }
        let errno = last_errno();
        Err(IoctlError { errno, done: m.moved.max(0) as usize })
    }

    /// Write-protect `[start, start + len)` (registered in WP mode), or lift the
    /// protection, which also wakes the threads waiting on a write there.
    pub fn writeprotect(&self, start: usize, len: usize, protect: bool) -> Result<(), IoctlError> {
        let mut wp = UffdioWriteprotect {
            range: UffdioRange { start: start as u64, len: len as u64 },
            mode: if protect { WRITEPROTECT_MODE_WP } else { 0 },
        };
        // SAFETY: `wp` is a valid struct uffdio_writeprotect; the kernel changes only the
        // protection of page-table entries in a range registered with this descriptor.
        if unsafe { libc::ioctl(self.raw_fd(), UFFDIO_WRITEPROTECT as _, &mut wp) } == 0 {
            return Ok(());
        }
        Err(IoctlError { errno: last_errno(), done: 0 })
    }

    /// Whether a message is queued now, asked without reading it (poll(2) with no wait).
    pub fn has_message(&self) -> bool {
        let mut fd = libc::pollfd { fd: self.raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: `fd` is one valid pollfd that outlives the call; a zero timeout never blocks.
        unsafe { libc::poll(&mut fd, 1, 0) == 1 && fd.revents & libc::POLLIN != 0 }
    }

    /// Read one message without blocking; `Ok(None)` when the queue is empty.
    pub fn read_msg(&self) -> io::Result<Option<Msg>> {
        let mut raw = RawMsg { event: 0, _reserved1: 0, _reserved2: 0, _reserved3: 0, arg: [0; 3] };
        let size = std::mem::size_of::<RawMsg>();
        // SAFETY: `raw` is a 32-byte buffer matching struct uffd_msg; read writes at most `size`.
        let n = unsafe { libc::read(self.raw_fd(), (&mut raw as *mut RawMsg).cast(), size) };
        if n < 0 {
            let err = io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
                _ => Err(err),
            };
        }
        if n as usize != size {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short userfaultfd message"));
        }
        Ok(Some(match raw.event {
            EVENT_PAGEFAULT => Msg::PageFault { addr: raw.arg[1] as usize, write: raw.arg[0] & 1 != 0, tid: raw.arg[2] as u32 },
            EVENT_REMOVE => Msg::Remove { start: raw.arg[0] as usize, end: raw.arg[1] as usize },
            EVENT_UNMAP => Msg::Unmap { start: raw.arg[0] as usize, end: raw.arg[1] as usize },
            EVENT_REMAP => Msg::Remap { from: raw.arg[0] as usize, to: raw.arg[1] as usize, len: raw.arg[2] as usize },
            EVENT_FORK => Msg::Other(EVENT_FORK),
            other => Msg::Other(other),
        }))
    }
}

/// `PAGEMAP_SCAN` over `/proc/self/pagemap`: asks the kernel how ranges are mapped.
pub struct PageMap {
    fd: OwnedFd,
}

impl PageMap {
    pub fn open() -> io::Result<PageMap> {
        let path = c"/proc/self/pagemap";
        // SAFETY: NUL-terminated literal path; open returns a descriptor or -1.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh descriptor owned by nobody else.
        Ok(PageMap { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Whether every page of `[start, start + len)` has a page-table entry (present, or
    /// swapped out by the kernel), so that reading it cannot take a missing-page fault.
    /// Reads `/proc/self/pagemap` itself (Linux 2.6.25+), not PAGEMAP_SCAN (6.7+).
    pub fn all_mapped(&self, start: usize, len: usize) -> bool {
        const PM_PRESENT: u64 = 1 << 63;
        const PM_SWAP: u64 = 1 << 62;
        let mut entries = [0u64; 512];
        let mut page = start / PAGE;
        let end = (start + len).div_ceil(PAGE);
        while page < end {
            let n = (end - page).min(entries.len());
            // SAFETY: reads at most `n` u64 entries into `entries`, which holds 512.
            let got = unsafe { libc::pread(self.fd.as_raw_fd(), entries.as_mut_ptr().cast(), n * 8, (page * 8) as libc::off_t) };
            if got != (n * 8) as isize {
                return false;
            }
            if entries[..n].iter().any(|e| e & (PM_PRESENT | PM_SWAP) == 0) {
                return false;
            }
            page += n;
        }
        true
    }

    /// Bytes of `[start, start + len)` mapped by huge (PMD) entries.
    pub fn huge_bytes(&self, start: usize, len: usize) -> io::Result<usize> {
        self.scan_bytes(start, len, PAGE_IS_HUGE | PAGE_IS_PRESENT)
    }

    /// Bytes of `[start, start + len)` that are present.
    pub fn present_bytes(&self, start: usize, len: usize) -> io::Result<usize> {
        self.scan_bytes(start, len, PAGE_IS_PRESENT)
    }

    /// Report each run of present pages in `[start, start + len)` written since it was
    /// last write-protected (or since it was mapped) to `written(start, end)`, and
    /// write-protect them again: the written bits read and cleared, as the kernel's
    /// `folio_referenced` reads and clears accessed bits. The range must be registered WP
    /// on a `FEATURE_WP_ASYNC` userfaultfd (EPERM otherwise).
    pub fn take_written(&self, start: usize, len: usize, written: impl FnMut(usize, usize)) -> io::Result<()> {
        self.scan(start, len, PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC, PAGE_IS_WRITTEN | PAGE_IS_PRESENT, written)
    }

    fn scan_bytes(&self, start: usize, len: usize, required: u64) -> io::Result<usize> {
        let mut total = 0usize;
        self.scan(start, len, 0, required, |lo, hi| total += hi - lo)?;
        Ok(total)
    }

    /// `PAGEMAP_SCAN` with `flags` over `[start, start + len)`: each run of pages in every
    /// category of `required`, to `each(start, end)`.
    fn scan(&self, start: usize, len: usize, flags: u64, required: u64, mut each: impl FnMut(usize, usize)) -> io::Result<()> {
        let mut regions = [PageRegion::default(); 64];
        let end = (start + len) as u64;
        let mut pos = start as u64;
        while pos < end {
            let mut arg = PmScanArg {
                size: std::mem::size_of::<PmScanArg>() as u64,
                flags,
                start: pos,
                end,
                walk_end: 0,
                vec: regions.as_mut_ptr() as u64,
                vec_len: regions.len() as u64,
                max_pages: 0,
                category_inverted: 0,
                category_mask: required,
                category_anyof_mask: 0,
                return_mask: required,
            };
            // SAFETY: `arg` is a valid struct pm_scan_arg whose `vec` points at `regions`
            // (vec_len entries) which outlive the call; the kernel writes only there, and
            // with PM_SCAN_WP_MATCHING sets write-protect bits, never a page's contents.
            let n = unsafe { libc::ioctl(self.fd.as_raw_fd(), PAGEMAP_SCAN as _, &mut arg) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            for r in &regions[..n as usize] {
                each(r.start as usize, r.end as usize);
            }
            // The kernel may stop short of `end` on a full vector; only then is there more.
            if (n as usize) < regions.len() || arg.walk_end <= pos {
                break;
            }
            pos = arg.walk_end;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `has_message` says whether a fault is queued without taking it: false before the
    /// fault, true (twice) once it is queued, false again once it is read.
    #[test]
    fn has_message_sees_a_queued_fault_without_reading_it() {
        let uffd = Uffd::open(FEATURE_THREAD_ID).unwrap_or_else(|e| panic!("this test needs a userfaultfd (root): {e:?}"));
        let len = 4096;
        // SAFETY: a fresh private anonymous mapping, unmapped at the end of the test.
        let addr = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        assert_ne!(addr, libc::MAP_FAILED, "mmap: {}", io::Error::last_os_error());
        let addr = addr as usize;
        uffd.register(addr, len, REGISTER_MODE_MISSING).expect("register");
        assert!(!uffd.has_message(), "nothing has faulted yet");
        let toucher = std::thread::spawn(move || {
            // SAFETY: the page is mapped; the read blocks in a userfault until the test
            // copies the page in.
            unsafe { std::ptr::read_volatile(addr as *const u8) }
        });
        let mut fd = libc::pollfd { fd: uffd.raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd; no timeout: this waits for the fault to be queued.
        assert_eq!(unsafe { libc::poll(&mut fd, 1, -1) }, 1);
        assert!(uffd.has_message(), "a fault is queued");
        assert!(uffd.has_message(), "asking does not take the message");
        match uffd.read_msg().expect("read") {
            Some(Msg::PageFault { addr: at, .. }) => assert_eq!(at & !(len - 1), addr),
            _ => panic!("expected the page fault"),
        }
        assert!(!uffd.has_message(), "the only message was read");
        let page = [0x5Au8; 4096];
        uffd.copy(addr, page.as_ptr(), len, true).expect("copy");
        assert_eq!(toucher.join().expect("the touching thread"), 0x5A);
        // SAFETY: the mapping made above, no longer used.
        unsafe { libc::munmap(addr as *mut libc::c_void, len) };
    }
}
