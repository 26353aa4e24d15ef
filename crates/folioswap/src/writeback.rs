//! Pool writeback (mm/zswap.c `zswap_writeback_entry`, `shrink_worker`): when a store
//! finds the pool full, the reclaimers write its oldest entries back to the swap file
//! until it is under the accept threshold; with `charge_pool` they also keep the pool
//! under half of memory_high, so that resident memory is not squeezed out by compressed
//! memory (`Tiers::needs_writeback`).
//!
//! One entry, top to bottom (`writeback_one`): pop the oldest entry of the pool's FIFO;
//! `try_lock` its folio and check it is still that Pool entry (else skip it); decompress
//! it into a per-thread O_DIRECT buffer; write it to the file; free the pool entry;
//! publish the new place (`evict::publish`, counted `zswpwb`); apply any event marked
//! meanwhile; unlock.

use crate::events::apply_pending_after_publish;
use crate::evict::publish;
use crate::folio::{Kind, CACHED, PENDING, SPLIT};
use crate::mm::Mm;
use crate::size::{FolioSize, HUGE_SIZE};
use crate::tier::{LoadError, SwapOutError};
use std::sync::atomic::Ordering;

thread_local! {
    /// A 2 MiB page-aligned buffer per thread for writeback (decompressed data headed for
    /// an O_DIRECT write).
    static WRITEBACK_BUF: std::cell::RefCell<Option<AlignedBuf>> = const { std::cell::RefCell::new(None) };
}

/// Page-aligned anonymous memory, for O_DIRECT.
struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> std::io::Result<AlignedBuf> {
        // SAFETY: an anonymous private mapping with no address hint; checked for failure.
        let ptr = unsafe {
            crate::sys::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(AlignedBuf { ptr: ptr.cast(), len })
    }
    fn as_mut_slice(&mut self, len: usize) -> &mut [u8] {
        assert!(len <= self.len);
        // SAFETY: the mapping is `self.len` bytes, owned by this buffer, and `&mut self`
        // makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`, which nothing references now.
        unsafe { crate::sys::munmap(self.ptr.cast(), self.len) };
    }
}

/// Why one entry could not be written back.
enum WritebackError {
    /// No memory for the per-thread buffer.
    NoBuffer(std::io::Error),
    /// The entry does not decompress.
    Load(LoadError),
    /// The file is full, or its write failed (reported where it happened).
    FileRefused,
}

/// Write the pool's oldest entry back to the swap file. Returns whether an entry left
/// the pool.
pub(crate) fn writeback_one(mm: &Mm) -> bool {
    let Some(dev) = &mm.tiers.file else { return false };
    if !dev.has_free_slots() {
        return false;
    }
    let Some(_active) = mm.reclaim.begin_work(&mm.memcg) else { return false };
    let lru = &mm.tiers.pool_lru;
    let mut budget = lru.len();
    while budget > 0 {
        budget -= 1;
        let Some(v) = lru.pop() else { return false };
        if v.table.dead.load(Ordering::Relaxed) {
            continue;
        }
        let e = v.table.entry(v.page);
        // A locked entry is being loaded (it leaves the pool anyway) or changed by an
        // event: skip it.
        let Some(s) = e.try_lock() else { continue };
        let current = s.kind() == Kind::Pool && s.gen() == v.gen && (v.order == 0 || !s.has(SPLIT));
        if !current || s.has(PENDING) {
            e.unlock();
            continue;
        }
        if s.has(CACHED) {
            // A readahead copy is about to be used (or dropped): writing the entry back
            // now is likely waste. Look at it again later.
            e.unlock();
            lru.push_back(v);
            continue;
        }
        let folio = FolioSize::from_order(v.order as u32).expect("valid order");
        let handle = e.handle();
        let written = WRITEBACK_BUF.with(|cell| {
            let mut cell = cell.borrow_mut();
            if cell.is_none() {
                *cell = Some(AlignedBuf::new(HUGE_SIZE).map_err(WritebackError::NoBuffer)?);
            }
            let buf = cell.as_mut().expect("just set").as_mut_slice(folio.bytes());
            mm.tiers.load(Kind::Pool, handle, buf, &mm.counters).map_err(WritebackError::Load)?;
            mm.tiers.write_to_file(buf, folio, None, &mm.counters).map_err(|_: SwapOutError| WritebackError::FileRefused)
        });
        let placed = match written {
            Ok(placed) => placed,
            Err(err) => {
                e.unlock();
                match err {
                    WritebackError::NoBuffer(err) => eprintln!("folioswap: no memory for a writeback buffer: {err}"),
                    WritebackError::Load(err) => eprintln!("folioswap: writing a pool entry back failed: {err}"),
                    // Write errors are reported where they happen; no space just ends writeback.
                    WritebackError::FileRefused => {}
                }
                lru.push_front(v);
                return false;
            }
        };
        mm.tiers.free(Kind::Pool, handle, folio);
        mm.counters.vm.zswpwb.add(folio.pages() as u64);
        publish(mm, &v.table, v.page, folio, s, &placed);
        apply_pending_after_publish(mm, &v.table, v.page, folio);
        e.unlock();
        return true;
    }
    false
}
