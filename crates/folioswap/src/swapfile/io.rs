//! Swap file I/O: creating the file, whole-folio reads and writes, checksums, and a
//! fault-injecting wrapper for the tests.
//!
//! The file. A swap file holds memory that was taken away from a process, so nobody else may
//! read it and nothing may outlive the process. It is created mode 0600 and never has a name
//! for longer than it takes to open it: given a directory, it is an `O_TMPFILE` (no name at
//! all, ever); given a path, it is created with `O_CREAT | O_EXCL` (an existing file is
//! refused, never overwritten) and unlinked right after the open. Either way a crash, a kill
//! or a plain exit leaves no swap file behind: the space is returned when the descriptor
//! closes. (In path mode there is a window of one system call between create and unlink in
//! which a crash leaves an empty, mode-0600 file at that path.) The descriptor is
//! `O_CLOEXEC`, so programs the host executes do not inherit it. The size is rounded down to
//! whole 2 MiB clusters (the allocator's unit, seed 003) and reserved up front with
//! `fallocate`, so a swap-out never discovers a full disk half way through a folio; where
//! the filesystem has no `fallocate` the file is only `ftruncate`d (sparse) and writes can
//! still fail with ENOSPC later (`is_preallocated` says which). Nothing is ever fsynced:
//! the contents have no meaning after the process ends.
//!
//! O_DIRECT. The kernel's own swap writes pages straight to the device, never through the
//! page cache, and so does this file where the filesystem allows it. Buffered I/O would keep
//! a second copy of exactly the memory we are trying to free in the page cache, whose
//! reclaim then competes with the memory pressure that caused the swap-out; and swapped
//! data is read at most once (the swap-in copies it into the process), so caching it buys
//! nothing. Direct I/O needs aligned buffers, offsets and lengths: offsets and lengths are
//! whole 4 KiB slots, and the engine's buffers are page-aligned staging memory; an
//! unaligned buffer is bounced through an aligned copy rather than refused. O_DIRECT is not
//! requested at `open`: on a filesystem without it the open fails with EINVAL only *after*
//! an `O_EXCL` create (the file would then exist and a retry would see EEXIST), and an
//! `O_TMPFILE` cannot be reopened by name. The file is therefore opened buffered and
//! switched with `fcntl(F_SETFL, O_DIRECT)`, then a 4 KiB aligned write and read at offset
//! 0 prove that direct I/O really works; if any step fails with EINVAL (or the data does
//! not come back), the file stays buffered. In buffered mode every write and read is
//! followed by `posix_fadvise(DONTNEED)` on its range: for a read this drops the now
//! useless cached copy at once; for a write it starts writeback, and the pages are dropped
//! once clean (by a later DONTNEED or ordinary reclaim). On tmpfs the page cache *is* the
//! storage and the advice does nothing; a swap file there only makes sense for tests.
//! Readahead is folioswap's own business (seed 002: by virtual address, not file offset),
//! so losing the kernel's file readahead costs nothing.
//!
//! Checksums. The kernel trusts the block layer; folioswap takes a CRC-32C
//! ([`folio_checksum`]) of every folio it writes, keeps it in memory beside the slot (the
//! tier's metadata, not this file) and checks it on swap-in, so a torn write, a bad block,
//! another writer or an allocator bug surfaces as a clear error naming the folio instead of
//! silently corrupt memory. CRC-32C runs on the SSE4.2 `crc32` instruction: 15–24 GB/s on a
//! 2 MiB folio on this VM (90–130 µs), as fast as xxh3 measured beside it, eight times the
//! disk (2.4 GB/s sequential write) and twenty times the lz4 codec (about 1 GB/s). It
//! detects every burst error up to 32 bits.
//!
//! I/O goes through the small [`SwapIo`] trait so that tests can put a [`FaultInjector`]
//! between the engine and the file. Statistics (counts, bytes, latency per call) are kept
//! with relaxed atomics and read with [`SwapFile::stats`].

use crate::stats::{Histogram, Latency};
use serde::Serialize;
use std::ffi::CString;
use std::fmt;
use std::io;
use std::ops::{Deref, DerefMut, Range};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Bytes per swap slot: one 4 KiB page.
pub const SLOT_SIZE: u64 = 4096;
/// Bytes per cluster: 512 slots, the unit the file is sized and allocated in.
pub const CLUSTER_SIZE: u64 = 2 << 20;
/// Alignment that direct I/O needs of buffers, offsets and lengths. 4 KiB covers every
/// logical block size in use (512 B and 4 KiB).
const DIO_ALIGN: usize = 4096;
/// Most iovecs one `pwritev` takes (Linux's UIO_MAXIOV).
const IOV_MAX: usize = 1024;

/// Whether [`SwapFile`] may use direct I/O.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DirectIo {
    /// O_DIRECT where the filesystem allows it, buffered I/O otherwise.
    #[default]
    Auto,
    /// Always buffered (page cache dropped after each I/O). For tests and filesystems
    /// whose direct I/O is known to be slow.
    Off,
}

/// Whether a new swap file's space is reserved up front.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Space {
    /// `fallocate`d (or sparse where the filesystem cannot).
    Reserve,
    /// Sparse: blocks are allocated as slots are written.
    Sparse,
}

/// Why a swap file could not be created.
#[derive(Debug)]
pub enum SwapFileError {
    /// The path names an existing file (or symlink); it is never overwritten.
    Exists { path: PathBuf },
    /// The size is under one cluster (2 MiB).
    TooSmall { size: u64 },
    /// The filesystem does not have `size` bytes free (`free` bytes are available).
    NoSpace { path: PathBuf, size: u64, free: u64 },
    /// The file could not be created or opened.
    Open { path: PathBuf, source: io::Error },
    /// A system call on the new file failed.
    Io { what: String, source: io::Error },
}

impl fmt::Display for SwapFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::size::format_bytes;
        match self {
            SwapFileError::Exists { path } => write!(
                f,
                "{} already exists, and folioswap never overwrites a file: name a path that does not \
                 exist (the swap file is unlinked as soon as it is open), or a directory to create an \
                 anonymous swap file in",
                path.display()
            ),
            SwapFileError::TooSmall { size } => write!(
                f,
                "a swap file of {} is smaller than one {} cluster: give at least {}",
                format_bytes(*size),
                format_bytes(CLUSTER_SIZE),
                format_bytes(CLUSTER_SIZE)
            ),
            SwapFileError::NoSpace { path, size, free } => write!(
                f,
                "no room for a {} swap file at {}: the filesystem has {} free. Free space there, \
                 choose a smaller swap file, or put it on another filesystem",
                format_bytes(*size),
                path.display(),
                format_bytes(*free)
            ),
            SwapFileError::Open { path, source } => {
                let hint = match source.raw_os_error() {
                    Some(libc::EACCES | libc::EPERM) => "this user may not create files there: choose a directory it can write to",
                    Some(libc::ENOENT | libc::ENOTDIR) => "its directory does not exist: create it or choose another path",
                    Some(libc::EROFS) => "the filesystem is read-only: choose a writable one",
                    Some(libc::EDQUOT) => "the disk quota is exhausted: free space or choose another filesystem",
                    _ => "choose another path",
                };
                write!(f, "cannot create a swap file at {}: {source} ({hint})", path.display())
            }
            SwapFileError::Io { what, source } => write!(f, "{what}: {source}"),
        }
    }
}

impl std::error::Error for SwapFileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SwapFileError::Open { source, .. } | SwapFileError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Whole-folio I/O on swap slots. Offsets are in 4 KiB slots; every buffer is a whole
/// number of slots (a folio: 4 KiB << order). Buffers should be 4 KiB-aligned (the
/// engine's staging memory is); others work, at the cost of a copy under direct I/O.
pub trait SwapIo: Send + Sync {
    /// Write the folio `data` at slot `slot`.
    fn write_at(&self, slot: u64, data: &[u8]) -> io::Result<()>;
    /// Write several folios in one submission: entries that continue each other on disk
    /// (in the order given) go out in one `pwritev`, others in one write each. On error the
    /// contents of every slot in the batch are undefined.
    fn write_batch(&self, ios: &[(u64, &[u8])]) -> io::Result<()> {
        ios.iter().try_for_each(|&(slot, data)| self.write_at(slot, data))
    }
    /// Read the folio at slot `slot` into `dst` (its whole length).
    fn read_at(&self, slot: u64, dst: &mut [u8]) -> io::Result<()>;
    /// Read several folios in one submission (readahead): entries that continue each other
    /// on disk (in the order given) come in with one `preadv`. On error the contents of
    /// every buffer are undefined.
    fn read_batch(&self, ios: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        ios.iter_mut().try_for_each(|(slot, dst)| self.read_at(*slot, dst))
    }
    /// Slots in the file.
    fn slots(&self) -> u64;
    /// Whether reads and writes bypass the page cache (O_DIRECT).
    fn is_direct(&self) -> bool {
        false
    }
    /// Counts, bytes and latency of the I/O so far (empty for a backend that keeps none).
    fn stats(&self) -> SwapIoStats {
        SwapIoStats::default()
    }
    /// The descriptor behind the backend, if it has one: a forked child closes it.
    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    /// Where the file was made (the directory, or the path it was created at and
    /// unlinked from), if the backend is a file.
    fn location(&self) -> Option<&Path> {
        None
    }
    /// Bytes of disk the backend occupies now (less than its size while a sparse file
    /// has holes), if known.
    fn disk_bytes(&self) -> Option<u64> {
        None
    }
    /// The data at the `pages` slots from `slot` is dead (its folio was loaded back,
    /// discarded or unmapped): a backend that holds copies elsewhere lets them go. A file
    /// needs nothing: the slots are simply written again.
    fn discard(&self, _slot: u64, _pages: u64) {}
    /// Whether the slots are not a medium of their own but names (the remote tier's): a
    /// failed write says nothing about the slot, which is freed rather than marked bad.
    fn is_remote(&self) -> bool {
        false
    }
    /// Why the backend takes no writes now, if it does not (the remote tier while its
    /// cluster fails writes): no slot is handed out meanwhile, so reclaim does not wait
    /// on writes that cannot succeed.
    fn down(&self) -> Option<String> {
        None
    }
    /// The process is exiting without dropping the engine: let go now of what lives
    /// outside the process (the remote tier's keys). Reads fail from then on.
    fn close(&self) {}
}

/// A backend shared with whoever else holds it (a test that arms a [`FaultInjector`]
/// while the engine uses it): every call goes to the one inside.
impl<I: SwapIo + ?Sized> SwapIo for std::sync::Arc<I> {
    fn write_at(&self, slot: u64, data: &[u8]) -> io::Result<()> {
        (**self).write_at(slot, data)
    }
    fn write_batch(&self, ios: &[(u64, &[u8])]) -> io::Result<()> {
        (**self).write_batch(ios)
    }
    fn read_at(&self, slot: u64, dst: &mut [u8]) -> io::Result<()> {
        (**self).read_at(slot, dst)
    }
    fn read_batch(&self, ios: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        (**self).read_batch(ios)
    }
    fn slots(&self) -> u64 {
        (**self).slots()
    }
    fn is_direct(&self) -> bool {
        (**self).is_direct()
    }
    fn stats(&self) -> SwapIoStats {
        (**self).stats()
    }
    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        (**self).raw_fd()
    }
    fn location(&self) -> Option<&Path> {
        (**self).location()
    }
    fn disk_bytes(&self) -> Option<u64> {
        (**self).disk_bytes()
    }
    fn discard(&self, slot: u64, pages: u64) {
        (**self).discard(slot, pages)
    }
    fn is_remote(&self) -> bool {
        (**self).is_remote()
    }
    fn down(&self) -> Option<String> {
        (**self).down()
    }
    fn close(&self) {
        (**self).close()
    }
}

/// The CRC-32C (Castagnoli) of a folio, as stored beside its slot and checked on swap-in.
pub fn folio_checksum(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// What the swap file has done, since it was created.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SwapIoStats {
    /// Folios read and written (a batch counts each of its folios).
    pub reads: u64,
    pub writes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Calls whose I/O failed (a failed batch counts once; calls refused for bad arguments
    /// before any I/O are not counted).
    pub errors: u64,
    /// Latency of one call (`read_at`, `write_at`, or a whole `write_batch`); `None` before
    /// the first.
    pub read_latency: Option<Latency>,
    pub write_latency: Option<Latency>,
    /// Pages are sealed (`encrypt`, and always on the remote tier).
    pub encrypted: bool,
    /// The remote tier's own state, when the backend is one (`remote.rs`).
    pub remote: Option<crate::stats::RemoteStat>,
}

#[derive(Default)]
struct IoCounters {
    reads: AtomicU64,
    writes: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    errors: AtomicU64,
    read_ns: Histogram,
    write_ns: Histogram,
}

/// An unlinked, preallocated swap file.
pub struct SwapFile {
    fd: OwnedFd,
    /// The path or directory it was created at, for messages.
    path: PathBuf,
    slots: u64,
    direct: bool,
    preallocated: bool,
    counters: IoCounters,
}

impl fmt::Debug for SwapFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SwapFile")
            .field("path", &self.path)
            .field("fd", &self.fd.as_raw_fd())
            .field("slots", &self.slots)
            .field("direct", &self.direct)
            .field("preallocated", &self.preallocated)
            .finish()
    }
}

impl SwapFile {
    /// Create a swap file of `size` bytes (rounded down to whole 2 MiB clusters) at `path`:
    /// an anonymous `O_TMPFILE` if `path` is a directory, else a new file that is unlinked
    /// at once. Direct I/O where the filesystem allows it.
    pub fn create(path: &Path, size: u64) -> Result<SwapFile, SwapFileError> {
        SwapFile::create_with(path, size, DirectIo::Auto)
    }

    /// [`SwapFile::create`], choosing whether direct I/O may be used.
    pub fn create_with(path: &Path, size: u64, direct: DirectIo) -> Result<SwapFile, SwapFileError> {
        SwapFile::create_inner(path, size, direct, Space::Reserve)
    }

    /// A sparse swap file of `size` nominal bytes in `dir`: disk space is taken only as
    /// folios are written (a full filesystem then shows as ENOSPC on a write), so a large
    /// file costs nothing until it is used. What the engine makes on demand.
    pub fn create_sparse(dir: &Path, size: u64) -> Result<SwapFile, SwapFileError> {
        SwapFile::create_inner(dir, size, DirectIo::Auto, Space::Sparse)
    }

    fn create_inner(path: &Path, size: u64, direct: DirectIo, space: Space) -> Result<SwapFile, SwapFileError> {
        if size < CLUSTER_SIZE {
            return Err(SwapFileError::TooSmall { size });
        }
        let size = size / CLUSTER_SIZE * CLUSTER_SIZE;
        let fd = if path.is_dir() { create_in_dir(path)? } else { create_at_path(path)? };
        let preallocated = match space {
            Space::Reserve => reserve(&fd, path, size)?,
            Space::Sparse => {
                truncate(&fd, path, size)?;
                false
            }
        };
        let mut file = SwapFile {
            fd,
            path: path.to_path_buf(),
            slots: size / SLOT_SIZE,
            direct: false,
            preallocated,
            counters: IoCounters::default(),
        };
        if direct == DirectIo::Auto {
            file.direct = file.try_direct()?;
        }
        Ok(file)
    }

    /// Whether I/O bypasses the page cache (O_DIRECT).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Whether the space was reserved with `fallocate` (else the file is sparse, and a
    /// write can fail with ENOSPC when the filesystem fills up).
    pub fn is_preallocated(&self) -> bool {
        self.preallocated
    }

    /// Bytes in the file (whole clusters).
    pub fn size(&self) -> u64 {
        self.slots * SLOT_SIZE
    }

    /// The path or directory the file was created at (it has no name of its own).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Counts, bytes and latencies so far.
    pub fn stats(&self) -> SwapIoStats {
        let c = &self.counters;
        SwapIoStats {
            reads: c.reads.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
            bytes_read: c.bytes_read.load(Ordering::Relaxed),
            bytes_written: c.bytes_written.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            read_latency: c.read_ns.summary(),
            write_latency: c.write_ns.summary(),
            ..SwapIoStats::default()
        }
    }

    fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Switch to O_DIRECT and prove it with a 4 KiB write and read at offset 0 (the file is
    /// new: its contents do not matter yet, and the probe leaves zeros). Returns whether
    /// direct I/O is on; only errors other than "not supported here" are errors.
    fn try_direct(&self) -> Result<bool, SwapFileError> {
        let fd = self.raw();
        let io_err = |what: &str, source| SwapFileError::Io { what: format!("{what} on the swap file at {}", self.path.display()), source };
        // SAFETY: F_GETFL on a descriptor we own; no memory is passed.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(io_err("fcntl(F_GETFL)", io::Error::last_os_error()));
        }
        // SAFETY: F_SETFL with an integer flag set on a descriptor we own.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_DIRECT) } < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EINVAL) => Ok(false),
                _ => Err(io_err("fcntl(F_SETFL, O_DIRECT)", e)),
            };
        }
        let out = AlignedBuf::zeroed(DIO_ALIGN);
        let mut back = AlignedBuf::zeroed(DIO_ALIGN);
        back.fill(0xff);
        let probe = pwrite_all(fd, &out, 0).and_then(|()| pread_all(fd, &mut back, 0));
        #[cfg(test)]
        let probe = if tests::PROBE_EINVAL.get() { Err(io::Error::from_raw_os_error(libc::EINVAL)) } else { probe };
        let works = match probe {
            Ok(()) => back[..] == out[..],
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => false,
            Err(e) => return Err(io_err("testing direct I/O", e)),
        };
        if !works {
            // SAFETY: as above; restores the flags read before.
            if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } < 0 {
                return Err(io_err("fcntl(F_SETFL) clearing O_DIRECT", io::Error::last_os_error()));
            }
        }
        Ok(works)
    }

    /// Byte offset of `slot` after checking that `len` bytes there are whole slots inside
    /// the file.
    fn offset(&self, slot: u64, len: usize) -> io::Result<u64> {
        if len == 0 || !(len as u64).is_multiple_of(SLOT_SIZE) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("swap I/O of {len} bytes: folios are whole 4 KiB slots")));
        }
        let end = slot.checked_add(len as u64 / SLOT_SIZE);
        if end.is_none_or(|end| end > self.slots) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("swap I/O of {len} bytes at slot {slot} goes past the end of the swap file ({} slots)", self.slots),
            ));
        }
        Ok(slot * SLOT_SIZE)
    }

    fn needs_bounce(&self, buf: &[u8]) -> bool {
        self.direct && !(buf.as_ptr() as usize).is_multiple_of(DIO_ALIGN)
    }

    /// One folio out, bounced if direct I/O cannot take the buffer as it is.
    fn write_one(&self, off: u64, data: &[u8]) -> io::Result<()> {
        if self.needs_bounce(data) {
            let mut bounce = AlignedBuf::zeroed(data.len());
            bounce.copy_from_slice(data);
            pwrite_all(self.raw(), &bounce, off)?;
        } else {
            pwrite_all(self.raw(), data, off)?;
        }
        self.drop_cache(off, data.len());
        Ok(())
    }

    /// Buffered mode: let the page cache go (see the top of the file). Advisory: a failure
    /// changes nothing that matters, so it is ignored.
    fn drop_cache(&self, off: u64, len: usize) {
        if !self.direct {
            // SAFETY: posix_fadvise takes integers only; the descriptor is ours.
            unsafe { libc::posix_fadvise(self.raw(), off as libc::off_t, len as libc::off_t, libc::POSIX_FADV_DONTNEED) };
        }
    }

    fn account(&self, write: bool, folios: u64, bytes: u64, start: Instant, ok: bool) {
        let c = &self.counters;
        let ns = start.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        if !ok {
            c.errors.fetch_add(1, Ordering::Relaxed);
        } else if write {
            c.writes.fetch_add(folios, Ordering::Relaxed);
            c.bytes_written.fetch_add(bytes, Ordering::Relaxed);
            c.write_ns.record(ns);
        } else {
            c.reads.fetch_add(folios, Ordering::Relaxed);
            c.bytes_read.fetch_add(bytes, Ordering::Relaxed);
            c.read_ns.record(ns);
        }
    }

    fn write_batch_inner(&self, ios: &[(u64, &[u8])]) -> io::Result<()> {
        let mut i = 0;
        while i < ios.len() {
            let (slot, data) = ios[i];
            if self.needs_bounce(data) {
                self.write_one(slot * SLOT_SIZE, data)?;
                i += 1;
                continue;
            }
            // The longest run continuing this folio on disk, up to IOV_MAX iovecs.
            let mut next = slot + data.len() as u64 / SLOT_SIZE;
            let mut j = i + 1;
            while j < ios.len() && j - i < IOV_MAX && ios[j].0 == next && !self.needs_bounce(ios[j].1) {
                next += ios[j].1.len() as u64 / SLOT_SIZE;
                j += 1;
            }
            let off = slot * SLOT_SIZE;
            if j == i + 1 {
                self.write_one(off, data)?;
            } else {
                let mut iovs: Vec<libc::iovec> =
                    ios[i..j].iter().map(|&(_, d)| libc::iovec { iov_base: d.as_ptr() as *mut libc::c_void, iov_len: d.len() }).collect();
                pwritev_all(self.raw(), &mut iovs, off)?;
                self.drop_cache(off, ((next - slot) * SLOT_SIZE) as usize);
            }
            i = j;
        }
        Ok(())
    }
}

impl SwapFile {
    fn read_batch_inner(&self, ios: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        let mut i = 0;
        while i < ios.len() {
            let slot = ios[i].0;
            if self.needs_bounce(ios[i].1) {
                let (slot, dst) = &mut ios[i];
                let mut bounce = AlignedBuf::zeroed(dst.len());
                pread_all(self.raw(), &mut bounce, *slot * SLOT_SIZE)?;
                dst.copy_from_slice(&bounce);
                i += 1;
                continue;
            }
            let mut next = slot + ios[i].1.len() as u64 / SLOT_SIZE;
            let mut j = i + 1;
            while j < ios.len() && j - i < IOV_MAX && ios[j].0 == next && !self.needs_bounce(ios[j].1) {
                next += ios[j].1.len() as u64 / SLOT_SIZE;
                j += 1;
            }
            let off = slot * SLOT_SIZE;
            let mut iovs: Vec<libc::iovec> = ios[i..j]
                .iter_mut()
                .map(|(_, d)| libc::iovec { iov_base: d.as_mut_ptr() as *mut libc::c_void, iov_len: d.len() })
                .collect();
            preadv_all(self.raw(), &mut iovs, off)?;
            self.drop_cache(off, ((next - slot) * SLOT_SIZE) as usize);
            i = j;
        }
        Ok(())
    }
}

impl SwapIo for SwapFile {
    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.fd.as_raw_fd())
    }
    fn location(&self) -> Option<&Path> {
        Some(&self.path)
    }
    fn disk_bytes(&self) -> Option<u64> {
        // SAFETY: stat is plain old data; all-zero is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat fills `st` from a descriptor this file owns.
        (unsafe { libc::fstat(self.fd.as_raw_fd(), &mut st) } == 0).then(|| st.st_blocks as u64 * 512)
    }
    fn write_at(&self, slot: u64, data: &[u8]) -> io::Result<()> {
        let off = self.offset(slot, data.len())?;
        let start = Instant::now();
        let r = self.write_one(off, data);
        self.account(true, 1, data.len() as u64, start, r.is_ok());
        r
    }

    fn write_batch(&self, ios: &[(u64, &[u8])]) -> io::Result<()> {
        // Check everything before writing anything.
        let mut bytes = 0u64;
        for &(slot, data) in ios {
            self.offset(slot, data.len())?;
            bytes += data.len() as u64;
        }
        if ios.is_empty() {
            return Ok(());
        }
        let start = Instant::now();
        let r = self.write_batch_inner(ios);
        self.account(true, ios.len() as u64, bytes, start, r.is_ok());
        r
    }

    fn read_at(&self, slot: u64, dst: &mut [u8]) -> io::Result<()> {
        let off = self.offset(slot, dst.len())?;
        let start = Instant::now();
        let r = if self.needs_bounce(dst) {
            let mut bounce = AlignedBuf::zeroed(dst.len());
            pread_all(self.raw(), &mut bounce, off).map(|()| dst.copy_from_slice(&bounce))
        } else {
            pread_all(self.raw(), dst, off)
        };
        if r.is_ok() {
            self.drop_cache(off, dst.len());
        }
        self.account(false, 1, dst.len() as u64, start, r.is_ok());
        r
    }

    fn read_batch(&self, ios: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        let mut bytes = 0u64;
        for (slot, dst) in ios.iter() {
            self.offset(*slot, dst.len())?;
            bytes += dst.len() as u64;
        }
        if ios.is_empty() {
            return Ok(());
        }
        let start = Instant::now();
        let r = self.read_batch_inner(ios);
        self.account(false, ios.len() as u64, bytes, start, r.is_ok());
        r
    }

    fn slots(&self) -> u64 {
        self.slots
    }

    fn is_direct(&self) -> bool {
        SwapFile::is_direct(self)
    }

    fn stats(&self) -> SwapIoStats {
        SwapFile::stats(self)
    }
}

fn cstring(path: &Path) -> Result<CString, SwapFileError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| SwapFileError::Open {
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidInput, "the path contains a NUL byte"),
    })
}

/// `open(2)` that retries EINTR and returns an owned descriptor.
fn open(path: &CString, flags: libc::c_int) -> io::Result<OwnedFd> {
    loop {
        // SAFETY: `path` is a NUL-terminated string that outlives the call; the mode
        // argument is read only with O_CREAT/O_TMPFILE, and is always passed.
        let fd = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC, 0o600 as libc::c_uint) };
        if fd >= 0 {
            // SAFETY: `fd` was just returned by open and nothing else owns it.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn unlink(path: &CString) -> io::Result<()> {
    // SAFETY: `path` is a NUL-terminated string that outlives the call.
    if unsafe { libc::unlink(path.as_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Path mode: a new file, unlinked at once.
fn create_at_path(path: &Path) -> Result<OwnedFd, SwapFileError> {
    let c = cstring(path)?;
    let fd = open(&c, libc::O_CREAT | libc::O_EXCL | libc::O_RDWR).map_err(|source| {
        if source.raw_os_error() == Some(libc::EEXIST) {
            SwapFileError::Exists { path: path.to_path_buf() }
        } else {
            SwapFileError::Open { path: path.to_path_buf(), source }
        }
    })?;
    // O_EXCL made this file ours, so unlinking the name cannot remove anyone else's file.
    unlink(&c).map_err(|source| SwapFileError::Io { what: format!("unlinking the new swap file {}", path.display()), source })?;
    Ok(fd)
}

/// Directory mode: an `O_TMPFILE`, which never has a name. On a filesystem without
/// O_TMPFILE, a uniquely named file that is unlinked at once.
fn create_in_dir(dir: &Path) -> Result<OwnedFd, SwapFileError> {
    match open(&cstring(dir)?, libc::O_TMPFILE | libc::O_RDWR) {
        Ok(fd) => Ok(fd),
        // EOPNOTSUPP: the filesystem has no O_TMPFILE; EISDIR: the kernel predates it.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {
            static SEQ: AtomicU64 = AtomicU64::new(0);
            loop {
                let name = format!(".folioswap-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
                match create_at_path(&dir.join(name)) {
                    Err(SwapFileError::Exists { .. }) => continue,
                    other => return other,
                }
            }
        }
        Err(source) => Err(SwapFileError::Open { path: dir.to_path_buf(), source }),
    }
}

/// Reserve `size` bytes: `fallocate`, or `ftruncate` where the filesystem cannot. Returns
/// whether the space is really allocated.
fn reserve(fd: &OwnedFd, path: &Path, size: u64) -> Result<bool, SwapFileError> {
    let raw = fd.as_raw_fd();
    let len = libc::off_t::try_from(size).map_err(|_| SwapFileError::Io {
        what: format!("sizing the swap file at {}", path.display()),
        source: io::Error::from_raw_os_error(libc::EFBIG),
    })?;
    let err = loop {
        // SAFETY: integers only, on a descriptor we own.
        if unsafe { libc::fallocate(raw, 0, 0, len) } == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            break e;
        }
    };
    match err.raw_os_error() {
        Some(libc::ENOSPC) => Err(SwapFileError::NoSpace { path: path.to_path_buf(), size, free: free_space(raw) }),
        Some(libc::EOPNOTSUPP | libc::ENOSYS) => truncate(fd, path, size).map(|()| false),
        _ => Err(SwapFileError::Io {
            what: format!("reserving {} for the swap file at {} (fallocate)", crate::size::format_bytes(size), path.display()),
            source: err,
        }),
    }
}

/// Give the file its size without allocating blocks (a sparse file).
fn truncate(fd: &OwnedFd, path: &Path, size: u64) -> Result<(), SwapFileError> {
    let sizing = |source| SwapFileError::Io { what: format!("sizing the swap file at {} (ftruncate)", path.display()), source };
    let len = libc::off_t::try_from(size).map_err(|_| sizing(io::Error::from_raw_os_error(libc::EFBIG)))?;
    // SAFETY: integers only, on a descriptor we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
        return Err(sizing(io::Error::last_os_error()));
    }
    Ok(())
}

/// Filesystems that keep their files in memory: a swap file there frees nothing.
const MEMORY_FILESYSTEMS: [i64; 2] = [0x0102_1994 /* tmpfs */, 0x8584_58f6u32 as i64 /* ramfs */];

/// Where a swap file made on demand goes: the first of `/var/tmp`, `$TMPDIR` and `/tmp`
/// that is a writable directory on a disk-backed filesystem, with the bytes free there.
/// None if there is no such directory.
pub fn on_demand_dir() -> Option<(PathBuf, u64)> {
    let tmpdir = std::env::var_os("TMPDIR").map(PathBuf::from);
    let candidates = [Some(PathBuf::from("/var/tmp")), tmpdir, Some(PathBuf::from("/tmp"))];
    candidates.into_iter().flatten().find_map(|dir| {
        let c = CString::new(dir.as_os_str().as_bytes()).ok()?;
        // SAFETY: `c` is a NUL-terminated path; access only reads it.
        if !dir.is_dir() || unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
            return None;
        }
        // SAFETY: statfs is plain old data; all-zero is a valid value.
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is a NUL-terminated path and `fs` a live statfs to fill.
        if unsafe { libc::statfs(c.as_ptr(), &mut fs) } != 0 || MEMORY_FILESYSTEMS.contains(&(fs.f_type as i64)) {
            return None;
        }
        Some((dir, (fs.f_bavail as u64).saturating_mul(fs.f_bsize as u64)))
    })
}

/// Bytes an unprivileged user may still allocate on the filesystem of `fd` (0 if unknown).
fn free_space(fd: RawFd) -> u64 {
    // SAFETY: statvfs is plain old data; all-zero is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid, writable statvfs for the call's duration.
    if unsafe { libc::fstatvfs(fd, &mut st) } != 0 {
        return 0;
    }
    (st.f_bavail as u64).saturating_mul(st.f_frsize as u64)
}

/// `pwrite` all of `data` at `off`, through short writes and EINTR.
fn pwrite_all(fd: RawFd, data: &[u8], off: u64) -> io::Result<()> {
    let mut iov = [libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() }];
    pwritev_all(fd, &mut iov, off)
}

/// `pwritev` every byte the iovecs describe at `off`, through short writes and EINTR. The
/// iovecs are consumed (advanced) as bytes go out.
fn pwritev_all(fd: RawFd, iovs: &mut [libc::iovec], off: u64) -> io::Result<()> {
    vectored_all(fd, iovs, off, true)
}

/// `preadv` every byte the iovecs describe from `off`, through short reads and EINTR.
fn preadv_all(fd: RawFd, iovs: &mut [libc::iovec], off: u64) -> io::Result<()> {
    vectored_all(fd, iovs, off, false)
}

/// The loop under `pwritev_all` and `preadv_all`: issue the call for what is left,
/// advancing the iovecs past what each call moved.
fn vectored_all(fd: RawFd, iovs: &mut [libc::iovec], mut off: u64, write: bool) -> io::Result<()> {
    let mut first = 0;
    while first < iovs.len() {
        let rest = &iovs[first..];
        // SAFETY: every iovec points into a slice the caller borrows for this whole call
        // (advanced only within it below): writable for preadv, read only by pwritev.
        let n = unsafe {
            if write {
                libc::pwritev(fd, rest.as_ptr(), rest.len() as libc::c_int, off as libc::off_t)
            } else {
                libc::preadv(fd, rest.as_ptr(), rest.len() as libc::c_int, off as libc::off_t)
            }
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(if write {
                io::Error::new(io::ErrorKind::WriteZero, format!("the swap file took no bytes at offset {off}"))
            } else {
                let msg = format!("the swap file ends at byte {off}: it was truncated behind folioswap's back");
                io::Error::new(io::ErrorKind::UnexpectedEof, msg)
            });
        }
        let mut n = n as usize;
        off += n as u64;
        while n > 0 {
            let iov = &mut iovs[first];
            if n >= iov.iov_len {
                n -= iov.iov_len;
                first += 1;
            } else {
                // SAFETY: n < iov_len, so the advanced pointer stays inside the same slice.
                iov.iov_base = unsafe { (iov.iov_base as *mut u8).add(n) } as *mut libc::c_void;
                iov.iov_len -= n;
                n = 0;
            }
        }
        // Skip iovecs that were empty to begin with.
        while first < iovs.len() && iovs[first].iov_len == 0 {
            first += 1;
        }
    }
    Ok(())
}

/// `pread` all of `dst` from `off`, through short reads and EINTR; the end of the file
/// before `dst` is full is an `UnexpectedEof` error.
fn pread_all(fd: RawFd, dst: &mut [u8], off: u64) -> io::Result<()> {
    let mut done = 0;
    while done < dst.len() {
        let rest = &mut dst[done..];
        // SAFETY: `rest` is a live, writable slice of exactly `rest.len()` bytes.
        let n = unsafe { libc::pread(fd, rest.as_mut_ptr() as *mut libc::c_void, rest.len(), (off + done as u64) as libc::off_t) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "the swap file ends at byte {} but {} bytes were to be read from {off}: it was truncated \
                     behind folioswap's back",
                    off + done as u64,
                    dst.len()
                ),
            ));
        }
        done += n as usize;
    }
    Ok(())
}

/// A zeroed heap buffer aligned for direct I/O (bounce buffers, tests).
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

impl AlignedBuf {
    /// `len` must be positive.
    pub(crate) fn zeroed(len: usize) -> AlignedBuf {
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size (checked in `layout`).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }

    fn layout(len: usize) -> std::alloc::Layout {
        assert!(len > 0, "an empty I/O buffer");
        std::alloc::Layout::from_size_align(len, DIO_ALIGN).expect("I/O buffer size overflows")
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is a live, initialised (zeroed) allocation of `len` bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with exactly this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads, like &[u8].
unsafe impl Sync for AlignedBuf {}

/// A test tool: wraps a [`SwapIo`] and makes chosen I/O fail, to check that the engine
/// handles a failing swap device (keeps the folio, reports the error, frees the slot).
///
/// Three kinds of fault, checked in this order: every read or write touching a slot in a
/// range given to [`fail_slots`](Self::fail_slots) (until [`clear`](Self::clear)); then the
/// next `n` reads ([`fail_reads`](Self::fail_reads)) or writes
/// ([`fail_writes`](Self::fail_writes)), each folio of a batch counting as one write. A
/// failed I/O does nothing and returns `errno` (EIO, ENOSPC, …) as an `io::Error`; in a
/// batch, the folios before the first failing one are written (a partial failure, as a
/// real device can produce).
pub struct FaultInjector<I> {
    inner: I,
    plan: Mutex<FaultPlan>,
    injected: AtomicU64,
}

#[derive(Default)]
struct FaultPlan {
    reads: (u64, i32),
    writes: (u64, i32),
    slots: Vec<(Range<u64>, i32)>,
}

impl<I: SwapIo> FaultInjector<I> {
    pub fn new(inner: I) -> FaultInjector<I> {
        FaultInjector { inner, plan: Mutex::new(FaultPlan::default()), injected: AtomicU64::new(0) }
    }

    /// Fail the next `n` reads with `errno`.
    pub fn fail_reads(&self, n: u64, errno: i32) {
        self.plan().reads = (n, errno);
    }

    /// Fail the next `n` folio writes with `errno`.
    pub fn fail_writes(&self, n: u64, errno: i32) {
        self.plan().writes = (n, errno);
    }

    /// Fail every read and write touching a slot in `slots` with `errno`, until `clear`.
    pub fn fail_slots(&self, slots: Range<u64>, errno: i32) {
        self.plan().slots.push((slots, errno));
    }

    /// Inject nothing more.
    pub fn clear(&self) {
        *self.plan() = FaultPlan::default();
    }

    /// Failures injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    pub fn inner(&self) -> &I {
        &self.inner
    }

    pub fn into_inner(self) -> I {
        self.inner
    }

    fn plan(&self) -> std::sync::MutexGuard<'_, FaultPlan> {
        self.plan.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The errno to fail an I/O of `len` bytes at `slot` with, if any (consuming a count).
    fn fault(&self, write: bool, slot: u64, len: usize) -> Option<io::Error> {
        let mut plan = self.plan();
        let end = slot.saturating_add((len as u64).div_ceil(SLOT_SIZE).max(1));
        let errno = plan.slots.iter().find(|(r, _)| r.start < end && slot < r.end).map(|&(_, e)| e).or_else(|| {
            let (n, errno) = if write { &mut plan.writes } else { &mut plan.reads };
            (*n > 0).then(|| {
                *n -= 1;
                *errno
            })
        })?;
        self.injected.fetch_add(1, Ordering::Relaxed);
        Some(io::Error::from_raw_os_error(errno))
    }
}

impl<I: SwapIo> SwapIo for FaultInjector<I> {
    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.raw_fd()
    }
    fn write_at(&self, slot: u64, data: &[u8]) -> io::Result<()> {
        match self.fault(true, slot, data.len()) {
            Some(e) => Err(e),
            None => self.inner.write_at(slot, data),
        }
    }

    fn write_batch(&self, ios: &[(u64, &[u8])]) -> io::Result<()> {
        for (i, &(slot, data)) in ios.iter().enumerate() {
            if let Some(e) = self.fault(true, slot, data.len()) {
                if i > 0 {
                    self.inner.write_batch(&ios[..i])?;
                }
                return Err(e);
            }
        }
        self.inner.write_batch(ios)
    }

    fn read_at(&self, slot: u64, dst: &mut [u8]) -> io::Result<()> {
        match self.fault(false, slot, dst.len()) {
            Some(e) => Err(e),
            None => self.inner.read_at(slot, dst),
        }
    }

    fn read_batch(&self, ios: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        for (slot, dst) in ios.iter() {
            if let Some(e) = self.fault(false, *slot, dst.len()) {
                return Err(e);
            }
        }
        self.inner.read_batch(ios)
    }

    fn slots(&self) -> u64 {
        self.inner.slots()
    }

    fn is_direct(&self) -> bool {
        self.inner.is_direct()
    }

    fn stats(&self) -> SwapIoStats {
        self.inner.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// Makes this thread's direct I/O probes fail as on a filesystem without O_DIRECT
        /// (every filesystem on a Linux 6.6+ test machine, tmpfs included, accepts it).
        pub(super) static PROBE_EINVAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    const K4: usize = 4096;
    const K64: usize = 64 << 10;
    const M2: usize = 2 << 20;
    const FILE: u64 = 8 << 20;

    /// A fresh directory, removed with everything in it when dropped.
    struct TestDir(PathBuf);

    impl TestDir {
        fn new(base: &str, name: &str) -> TestDir {
            let dir = Path::new(base).join(format!("folioswap-io-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
            TestDir(dir)
        }

        fn listing(&self) -> Vec<String> {
            let mut names: Vec<String> =
                std::fs::read_dir(&self.0).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
            names.sort();
            names
        }
    }

    impl Drop for TestDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// An aligned buffer of `len` bytes of a pattern unique to `seed`.
    fn pattern(seed: u64, len: usize) -> AlignedBuf {
        let mut buf = AlignedBuf::zeroed(len);
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        for chunk in buf.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
        buf
    }

    fn assert_same(slot: u64, got: &[u8], want: &[u8]) {
        if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
            panic!("folio at slot {slot}: byte {i} reads {:#x}, wrote {:#x}", got[i], want[i]);
        }
        assert_eq!(got.len(), want.len());
    }

    /// Folios of 4K, 64K and 2M at several slots (cluster edges and the file's end
    /// included), written one by one, then read back and compared byte for byte.
    fn round_trip(file: &SwapFile) {
        let layout: [(u64, usize); 7] = [(0, K4), (1, K4), (511, K4), (16, K64), (1008, K64), (1024, M2), (1536, M2)];
        let bufs: Vec<AlignedBuf> = layout.iter().map(|&(slot, len)| pattern(slot + 1, len)).collect();
        for (&(slot, _), buf) in layout.iter().zip(&bufs) {
            file.write_at(slot, buf).unwrap_or_else(|e| panic!("write at slot {slot}: {e}"));
        }
        for (&(slot, len), buf) in layout.iter().zip(&bufs) {
            let mut back = AlignedBuf::zeroed(len);
            file.read_at(slot, &mut back).unwrap_or_else(|e| panic!("read at slot {slot}: {e}"));
            assert_same(slot, &back, buf);
        }
        let st = file.stats();
        let bytes: u64 = layout.iter().map(|&(_, len)| len as u64).sum();
        assert_eq!((st.writes, st.reads, st.errors), (7, 7, 0), "{st:?}");
        assert_eq!((st.bytes_written, st.bytes_read), (bytes, bytes), "{st:?}");
        assert_eq!(st.write_latency.as_ref().map(|l| l.count), Some(7), "{st:?}");
        assert_eq!(st.read_latency.as_ref().map(|l| l.count), Some(7), "{st:?}");
    }

    #[test]
    fn round_trip_on_var_tmp_is_direct() {
        let dir = TestDir::new("/var/tmp", "rt-direct");
        let file = SwapFile::create(&dir.0, FILE).unwrap();
        assert_eq!((file.size(), file.slots()), (FILE, FILE / SLOT_SIZE));
        assert!(
            file.is_direct(),
            "the filesystem under /var/tmp does not allow O_DIRECT on this machine, so the swap file \
             fell back to buffered I/O (it still works; this test expects an ext4/xfs disk there)"
        );
        assert!(file.is_preallocated());
        round_trip(&file);
    }

    #[test]
    fn round_trip_on_dev_shm() {
        // tmpfs: O_DIRECT is refused before Linux 6.6 (the buffered fallback) and accepted
        // after; either way the data must come back.
        let dir = TestDir::new("/dev/shm", "rt-shm");
        let file = SwapFile::create(&dir.0, FILE).unwrap();
        eprintln!("swap file on /dev/shm: direct I/O {}", if file.is_direct() { "on" } else { "off (fallback)" });
        round_trip(&file);
    }

    #[test]
    fn round_trip_buffered() {
        let dir = TestDir::new("/var/tmp", "rt-buffered");
        let file = SwapFile::create_with(&dir.0, FILE, DirectIo::Off).unwrap();
        assert!(!file.is_direct());
        round_trip(&file);
    }

    #[test]
    fn falls_back_to_buffered_when_direct_io_fails() {
        let dir = TestDir::new("/var/tmp", "fallback");
        PROBE_EINVAL.set(true);
        let file = SwapFile::create(&dir.0, FILE);
        PROBE_EINVAL.set(false);
        let file = file.unwrap();
        assert!(!file.is_direct());
        // SAFETY: F_GETFL on the file's own descriptor.
        let flags = unsafe { libc::fcntl(file.fd.as_raw_fd(), libc::F_GETFL) };
        assert_eq!(flags & libc::O_DIRECT, 0, "O_DIRECT must be cleared again");
        round_trip(&file);
    }

    #[test]
    fn unaligned_buffers_bounce_under_direct_io() {
        let dir = TestDir::new("/var/tmp", "bounce");
        for mode in [DirectIo::Auto, DirectIo::Off] {
            let file = SwapFile::create_with(&dir.0, FILE, mode).unwrap();
            let src = pattern(7, K64 + K4);
            let data = &src[1..1 + K64];
            assert_ne!(data.as_ptr() as usize % DIO_ALIGN, 0);
            file.write_at(3, data).unwrap();
            let other = pattern(8, K4 + K4);
            file.write_batch(&[(20, &other[5..5 + K4]), (21, &src[..K4]), (22, &src[K4..2 * K4])]).unwrap();

            let mut dst = AlignedBuf::zeroed(K64 + K4);
            file.read_at(3, &mut dst[9..9 + K64]).unwrap();
            assert_same(3, &dst[9..9 + K64], data);
            file.read_at(20, &mut dst[1..1 + K4]).unwrap();
            assert_same(20, &dst[1..1 + K4], &other[5..5 + K4]);
            let mut two = AlignedBuf::zeroed(2 * K4);
            file.read_at(21, &mut two).unwrap();
            assert_same(21, &two, &src[..2 * K4]);
        }
    }

    #[test]
    fn write_batch_contiguous_and_scattered_runs() {
        let dir = TestDir::new("/var/tmp", "batch");
        for mode in [DirectIo::Auto, DirectIo::Off] {
            let file = SwapFile::create_with(&dir.0, FILE, mode).unwrap();
            // Runs: 10..13 (three 4K), 100..132 (two 64K), 5 (alone, backwards), 512..1024 +
            // 1024..1040 (a 2M then a 64K across a cluster edge), 40 (alone).
            let layout: [(u64, usize); 9] =
                [(10, K4), (11, K4), (12, K4), (100, K64), (116, K64), (5, K4), (512, M2), (1024, K64), (40, K4)];
            let bufs: Vec<AlignedBuf> = layout.iter().map(|&(slot, len)| pattern(slot + 100, len)).collect();
            let ios: Vec<(u64, &[u8])> = layout.iter().zip(&bufs).map(|(&(slot, _), b)| (slot, &b[..])).collect();
            file.write_batch(&ios).unwrap();
            file.write_batch(&[]).unwrap();
            for (&(slot, len), buf) in layout.iter().zip(&bufs) {
                let mut back = AlignedBuf::zeroed(len);
                file.read_at(slot, &mut back).unwrap();
                assert_same(slot, &back, buf);
            }
            let st = file.stats();
            assert_eq!((st.writes, st.reads), (9, 9), "{st:?}");
            assert_eq!(st.write_latency.map(|l| l.count), Some(1), "a batch is one latency sample");
            // A batch with one bad entry writes nothing and says why.
            let bad = file.write_batch(&[(0, &bufs[0][..]), (FILE / SLOT_SIZE, &bufs[1][..])]).unwrap_err();
            assert_eq!(bad.kind(), io::ErrorKind::InvalidInput, "{bad}");
        }
    }

    #[test]
    fn read_batch_contiguous_and_scattered_runs() {
        let dir = TestDir::new("/var/tmp", "rbatch");
        for mode in [DirectIo::Auto, DirectIo::Off] {
            let file = SwapFile::create_with(&dir.0, FILE, mode).unwrap();
            let layout: [(u64, usize); 7] = [(10, K4), (11, K4), (12, K4), (100, K64), (116, K64), (5, K4), (40, K4)];
            for &(slot, len) in &layout {
                file.write_at(slot, &pattern(slot + 7, len)).unwrap();
            }
            let mut bufs: Vec<AlignedBuf> = layout.iter().map(|&(_, len)| AlignedBuf::zeroed(len)).collect();
            // One unaligned buffer takes the bounce path inside a batch.
            let mut odd = vec![0u8; K4 + 1];
            {
                let mut ios: Vec<(u64, &mut [u8])> = layout.iter().zip(bufs.iter_mut()).map(|(&(slot, _), b)| (slot, &mut b[..])).collect();
                ios.push((40, &mut odd[1..]));
                file.read_batch(&mut ios).unwrap();
            }
            for (&(slot, _), buf) in layout.iter().zip(&bufs) {
                assert_same(slot, buf, &pattern(slot + 7, buf.len()));
            }
            assert_same(40, &odd[1..], &pattern(47, K4));
            let st = file.stats();
            assert_eq!(st.reads, 8, "{st:?}");
            assert_eq!(st.read_latency.map(|l| l.count), Some(1), "a batch is one latency sample");
            let mut far = AlignedBuf::zeroed(K4);
            let bad = file.read_batch(&mut [(FILE / SLOT_SIZE, &mut far[..])]).unwrap_err();
            assert_eq!(bad.kind(), io::ErrorKind::InvalidInput, "{bad}");
        }
    }

    #[test]
    fn directory_mode_leaves_no_name() {
        let dir = TestDir::new("/var/tmp", "dirmode");
        std::fs::write(dir.0.join("other"), b"x").unwrap();
        let before = dir.listing();
        let file = SwapFile::create(&dir.0, FILE).unwrap();
        assert_eq!(dir.listing(), before, "an O_TMPFILE swap file has no name");
        // SAFETY: a zeroed stat is valid, and fstat fills it from a descriptor we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::fstat(file.fd.as_raw_fd(), &mut st) }, 0);
        assert_eq!(st.st_mode & 0o077, 0, "mode {:o}: nobody else may read swapped memory", st.st_mode);
        assert_eq!(st.st_nlink, 0);
        let data = pattern(1, K4);
        file.write_at(0, &data).unwrap();
        drop(file);
        assert_eq!(dir.listing(), before);
    }

    #[test]
    fn path_mode_unlinks_at_once_and_refuses_an_existing_file() {
        let dir = TestDir::new("/var/tmp", "pathmode");
        let path = dir.0.join("swap");
        let file = SwapFile::create(&path, FILE).unwrap();
        assert!(!path.exists(), "the swap file must be unlinked as soon as it is open");
        assert!(dir.listing().is_empty(), "{:?}", dir.listing());
        // SAFETY: a zeroed stat is valid, and fstat fills it from a descriptor we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::fstat(file.fd.as_raw_fd(), &mut st) }, 0);
        assert_eq!((st.st_mode & 0o077, st.st_nlink), (0, 0), "mode {:o}", st.st_mode);
        round_trip(&file);

        let keep = dir.0.join("keep");
        std::fs::write(&keep, b"a user's file").unwrap();
        let err = SwapFile::create(&keep, FILE).unwrap_err();
        assert!(matches!(&err, SwapFileError::Exists { path } if *path == keep), "{err:?}");
        assert!(err.to_string().contains(&*keep.to_string_lossy()), "{err}");
        assert_eq!(std::fs::read(&keep).unwrap(), b"a user's file");

        let missing = dir.0.join("no-such-dir").join("swap");
        let err = SwapFile::create(&missing, FILE).unwrap_err();
        assert!(matches!(&err, SwapFileError::Open { source, .. } if source.raw_os_error() == Some(libc::ENOENT)));
        assert!(err.to_string().contains("does not exist"), "{err}");
    }

    #[test]
    fn size_is_whole_clusters() {
        let dir = TestDir::new("/var/tmp", "size");
        for size in [0, 4096, CLUSTER_SIZE - 1] {
            let err = SwapFile::create(&dir.0, size).unwrap_err();
            assert!(matches!(err, SwapFileError::TooSmall { size: s } if s == size), "{err:?}");
            assert!(err.to_string().contains("at least 2"), "{err}");
        }
        let file = SwapFile::create(&dir.0, 2 * CLUSTER_SIZE + 12345).unwrap();
        assert_eq!((file.size(), file.slots()), (2 * CLUSTER_SIZE, 1024));
    }

    #[test]
    fn no_space_names_path_size_and_free_space() {
        // tmpfs refuses a fallocate larger than the whole filesystem before allocating
        // anything (shmem_fallocate), so asking for its total size + 1 GiB costs no memory.
        // Asking for just over the *free* space would allocate it all before failing.
        let dir = TestDir::new("/dev/shm", "nospace");
        // SAFETY: a zeroed statvfs is valid, and statvfs fills it.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        let c = CString::new("/dev/shm").unwrap();
        // SAFETY: as above: `c` is a NUL-terminated path, `st` a live statvfs.
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
        if st.f_blocks == 0 {
            eprintln!("SKIPPED no_space_names_path_size_and_free_space: /dev/shm has no size limit");
            return;
        }
        let total = st.f_blocks as u64 * st.f_frsize as u64;
        let size = (total + (1 << 30)).div_ceil(CLUSTER_SIZE) * CLUSTER_SIZE;
        match SwapFile::create(&dir.0, size) {
            Ok(file) if !file.is_preallocated() => {
                eprintln!("SKIPPED no_space_names_path_size_and_free_space: no fallocate on /dev/shm");
            }
            Ok(file) => panic!("a {size}-byte swap file fit in a {total}-byte tmpfs: {file:?}"),
            Err(SwapFileError::NoSpace { path, size: s, free }) => {
                assert_eq!((path.as_path(), s), (dir.0.as_path(), size));
                assert!(free <= total, "free {free} of {total}");
                let msg = SwapFileError::NoSpace { path, size: s, free }.to_string();
                assert!(msg.contains(&*dir.0.to_string_lossy()) && msg.contains("free"), "{msg}");
            }
            Err(e) => panic!("expected NoSpace, got {e:?}: {e}"),
        }
        assert!(dir.listing().is_empty());
    }

    #[test]
    fn bad_ranges_and_truncation_are_errors() {
        let dir = TestDir::new("/var/tmp", "eof");
        let file = SwapFile::create(&dir.0, 2 * CLUSTER_SIZE).unwrap();
        let mut buf = AlignedBuf::zeroed(2 * K4);
        let e = file.read_at(1024, &mut buf[..K4]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        let e = file.write_at(1023, &buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        let e = file.write_at(0, &buf[..100]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");

        // Cut the file to one cluster behind its back: reads past the new end are short.
        // SAFETY: integers only, on the file's own descriptor.
        assert_eq!(unsafe { libc::ftruncate(file.fd.as_raw_fd(), CLUSTER_SIZE as libc::off_t) }, 0);
        let e = file.read_at(512, &mut buf[..K4]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
        let e = file.read_at(511, &mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
        assert!(e.to_string().contains("truncated"), "{e}");
        file.read_at(511, &mut buf[..K4]).unwrap();
        assert_eq!(file.stats().errors, 2);
    }

    #[test]
    fn fault_injector_fails_what_it_is_told_to() {
        let dir = TestDir::new("/var/tmp", "faults");
        let io = FaultInjector::new(SwapFile::create(&dir.0, FILE).unwrap());
        let a = pattern(1, K64);
        let b = pattern(2, K4);
        let mut back = AlignedBuf::zeroed(K64);

        io.write_at(0, &a).unwrap();
        io.fail_reads(1, libc::EIO);
        assert_eq!(io.read_at(0, &mut back).unwrap_err().raw_os_error(), Some(libc::EIO));
        io.read_at(0, &mut back).unwrap();
        assert_same(0, &back, &a);

        io.fail_writes(2, libc::ENOSPC);
        assert_eq!(io.write_at(32, &a).unwrap_err().raw_os_error(), Some(libc::ENOSPC));
        let e = io.write_batch(&[(48, &b), (49, &b)]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
        io.write_at(32, &a).unwrap();
        io.fail_writes(1, libc::EIO);
        assert_eq!(io.write_at(32, &b).unwrap_err().raw_os_error(), Some(libc::EIO));
        assert_eq!(io.injected(), 4);

        // Slot faults hit reads and writes that touch the range, and nothing else.
        io.fail_slots(100..101, libc::EIO);
        assert_eq!(io.write_at(96, &a).unwrap_err().raw_os_error(), Some(libc::EIO), "96..112 covers 100");
        assert_eq!(io.read_at(100, &mut back[..K4]).unwrap_err().raw_os_error(), Some(libc::EIO));
        io.write_at(80, &a).unwrap(); // 80..96
        io.write_at(101, &b).unwrap();
        let e = io.write_batch(&[(60, &b), (100, &b), (61, &b)]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        io.read_at(60, &mut back[..K4]).unwrap();
        assert_same(60, &back[..K4], &b);
        assert_eq!(io.injected(), 7);

        io.clear();
        io.write_at(96, &a).unwrap();
        io.read_at(96, &mut back).unwrap();
        assert_same(96, &back, &a);
        assert_eq!(io.injected(), 7);
        assert_eq!(io.slots(), FILE / SLOT_SIZE);
        assert_eq!(io.inner().stats().errors, 0, "injected faults never reach the file");
    }

    #[test]
    fn checksum_is_crc32c_and_catches_one_flipped_bit() {
        // The CRC-32C check value and the iSCSI test vectors (RFC 3720, B.4).
        assert_eq!(folio_checksum(b"123456789"), 0xe306_9283);
        assert_eq!(folio_checksum(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(folio_checksum(&[0xffu8; 32]), 0x62a8_ab43);

        let mut folio = pattern(42, M2);
        let sum = folio_checksum(&folio);
        let mut copy = vec![0u8; M2 + 1];
        copy[1..].copy_from_slice(&folio);
        assert_eq!(sum, folio_checksum(&copy[1..]), "same bytes anywhere, same sum");
        for bit in [0, 1, 7, 4096 * 8 + 3, M2 * 4, M2 * 8 - 1] {
            folio[bit / 8] ^= 1 << (bit % 8);
            assert_ne!(folio_checksum(&folio), sum, "bit {bit} flipped went unnoticed");
            folio[bit / 8] ^= 1 << (bit % 8);
        }
        assert_eq!(folio_checksum(&folio), sum);
    }

    #[test]
    fn errors_say_what_to_do() {
        let e = SwapFileError::Open { path: "/x".into(), source: io::Error::from_raw_os_error(libc::EACCES) };
        assert!(e.to_string().contains("/x") && e.to_string().contains("choose a directory"), "{e}");
        assert!(std::error::Error::source(&e).is_some());
        let e = SwapFileError::TooSmall { size: 4096 };
        assert!(std::error::Error::source(&e).is_none());
    }
}
