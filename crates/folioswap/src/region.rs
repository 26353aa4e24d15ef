//! Regions: what `Engine::map` hands out, from mapping to drop.
//!
//! A [`Region`] is an anonymous mapping registered with the engine's userfaultfd, whose
//! every page has an entry in a folio table (`table.rs`), found from its addresses
//! through the process-wide address map (`addrmap.rs`). Mapping it: reserve aligned
//! address space, advise it (THP or not, DONTFORK unless it is kept on fork), build its
//! table, register it, enter it in the address map under the gate. Dropping it: leave the
//! address map under the gate, unregister and unmap every piece, release every folio's
//! storage, and wait for evictions in flight on it to let go.

use crate::addrmap::{MapEntry, ADDRESS_MAP};
use crate::config::SwapinPolicy;
use crate::engine::{check_limit_fits, Engine};
use crate::error::{Error, Result};
use crate::folio::{Kind, CACHED, PENDING, SPLIT, WRITEBACK};
use crate::mm::Mm;
use crate::readahead::forget_readahead;
use crate::reclaim_ctl::Wait;
use crate::release::drop_storage;
use crate::size::{FolioSize, PAGE_SIZE};
use crate::table::FolioTable;
use crate::uffd::{self, InstallMode};
use crate::written::WrittenMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Per-region policy.
#[derive(Clone, Debug, Default)]
pub struct RegionOptions {
    pub(crate) folio_size: Option<FolioSize>,
    pub(crate) keep_on_fork: bool,
    pub(crate) swapin_enabled: Option<SwapinPolicy>,
}

impl RegionOptions {
    /// The folio size the region swaps in: `"4K"` … `"2M"`.
    pub fn folio_size(mut self, size: &str) -> crate::Result<Self> {
        let folio = size.parse().map_err(|_| crate::Error::config("folio_size", size, FolioSize::ACCEPTED))?;
        self.folio_size = Some(folio);
        Ok(self)
    }

    /// Let a forked child inherit the region's memory (by default it does not, as with
    /// MADV_DONTFORK). The child then gets exactly what the region held at the fork only
    /// if the fork happens between [`Engine::prepare_fork`](crate::Engine::prepare_fork)
    /// and its guard's `parent`/`child`, which bring the swapped-out folios back first.
    pub fn keep_on_fork(mut self, on: bool) -> Self {
        self.keep_on_fork = on;
        self
    }

    /// How much of a large folio a swap-in brings back in this region (default: the
    /// engine's `swapin_enabled`).
    pub fn swapin_enabled(mut self, policy: SwapinPolicy) -> Self {
        self.swapin_enabled = Some(policy);
        self
    }

    pub fn folio(mut self, folio: FolioSize) -> Self {
        self.folio_size = Some(folio);
        self
    }
}

impl Engine {
    /// Map `len` bytes (rounded up to the folio size) of managed, zero-filled memory.
    pub fn map(&self, len: usize, options: RegionOptions) -> Result<Region> {
        let mm = self.mm();
        let folio = options.folio_size.unwrap_or(mm.config.folio_size);
        check_limit_fits(&mm.config, folio)?;
        if len == 0 {
            return Err(Error::InvalidRegion("a region must be at least one byte long".into()));
        }
        let len = len.checked_next_multiple_of(folio.bytes()).filter(|&l| l <= isize::MAX as usize);
        let Some(len) = len else {
            return Err(Error::Map { len: usize::MAX, errno: libc::ENOMEM });
        };
        let addr = crate::sys::map_aligned(len, folio.bytes().max(PAGE_SIZE)).map_err(|errno| Error::Map { len, errno })?;
        let unmap = || {
            // SAFETY: the mapping was created above and handed to nobody.
            unsafe { crate::sys::munmap(addr as *mut libc::c_void, len) };
        };
        let advice = if folio.is_huge() { libc::MADV_HUGEPAGE } else { libc::MADV_NOHUGEPAGE };
        // SAFETY: advice on the fresh mapping only changes paging policy. DONTFORK unless
        // asked otherwise: a child inherits neither the engine nor the swapped-out data,
        // so without `prepare_fork` it would see a half of this memory (`fork.rs`).
        let advised = unsafe {
            crate::sys::madvise(addr as *mut libc::c_void, len, advice) == 0
                && (options.keep_on_fork || crate::sys::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTFORK) == 0)
        };
        if !advised {
            let e = std::io::Error::last_os_error();
            unmap();
            return Err(Error::sys("madvise on a new region", e));
        }
        let table = match FolioTable::new(folio, len / PAGE_SIZE, addr) {
            Ok(mut t) => {
                t.keep_on_fork = options.keep_on_fork;
                t.swapin = options.swapin_enabled.unwrap_or(mm.config.swapin_enabled);
                // Not on 2 MiB folios: the first write to a protected THP splits its mapping.
                if mm.written.is_some() && !folio.is_huge() {
                    t.written = Some(WrittenMap::new(t.pages));
                }
                Arc::new(t)
            }
            Err(errno) => {
                unmap();
                return Err(Error::Map { len, errno });
            }
        };
        // Copy mode write-protects a folio while it copies it out (`evict.rs`).
        let mode = match mm.install {
            InstallMode::Move if table.written.is_some() => uffd::REGISTER_MODE_MISSING | uffd::REGISTER_MODE_WP,
            InstallMode::Move => uffd::REGISTER_MODE_MISSING,
            InstallMode::Copy => uffd::REGISTER_MODE_MISSING | uffd::REGISTER_MODE_WP,
        };
        if let Err(e) = mm.uffd.register(addr, len, mode) {
            unmap();
            return Err(Error::sys("registering a region with userfaultfd", e));
        }
        {
            let _gate = mm.gate.write().unwrap();
            ADDRESS_MAP.insert(addr, MapEntry { end: addr + len, table: table.clone(), page: 0, engine: mm.clone() });
        }
        mm.managed_bytes.fetch_add(len as u64, Ordering::Relaxed);
        mm.regions.fetch_add(1, Ordering::Relaxed);
        Ok(Region { engine: self.clone(), table, addr, len })
    }
}

/// Managed memory from [`Engine::map`]. Reads and writes like anonymous memory from any
/// thread; dropping it unmaps it and releases everything the engine holds for it.
///
/// If the program `mremap`s part of the region elsewhere, that part stays managed and is
/// released with the region; `as_ptr`/`len` keep describing the original mapping.
pub struct Region {
    engine: Engine,
    table: Arc<FolioTable>,
    addr: usize,
    len: usize,
}

impl Region {
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn folio_size(&self) -> FolioSize {
        self.table.folio
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is readable for `len` bytes while the region lives; missing
        // pages fault and are served by the engine. Concurrent writers must use raw pointers.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes this the only reference handed out.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.len) }
    }
    /// The region's bytes mapped as transparent huge pages now (AnonHugePages in smaps).
    pub fn anon_huge_bytes(&self) -> std::io::Result<u64> {
        crate::smaps::anon_huge_bytes(self.addr, self.len)
    }
    pub fn engine(&self) -> &Engine {
        &self.engine
    }
    #[cfg(test)]
    pub(crate) fn table(&self) -> &Arc<FolioTable> {
        &self.table
    }
    /// This region's swap readahead: folios read ahead, hits, waste, and its window now.
    pub fn readahead_stats(&self) -> crate::stats::RegionReadahead {
        self.table.ra.snapshot()
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        unmap(self.engine.mm(), &self.table);
    }
}

// SAFETY: a region is a handle to memory the engine serves from any thread; its raw
// pointer is only an address.
unsafe impl Send for Region {}
// SAFETY: as above; shared references hand out only `&[u8]`.
unsafe impl Sync for Region {}

/// Drop a region: take it out of the address map, unmap it, release every folio.
fn unmap(mm: &Mm, table: &Arc<FolioTable>) {
    let pieces = {
        let _gate = mm.gate.write().unwrap();
        table.dead.store(true, Ordering::SeqCst);
        ADDRESS_MAP.remove_table(table)
    };
    // A copy-mode eviction that passed the gate before it was taken zaps its run
    // without it: let it finish before the addresses are given back, or its zap would
    // land on whatever the process maps there next. It waits for nothing of ours.
    while table.zapping.load(Ordering::Acquire) > 0 {
        std::thread::yield_now();
    }
    for p in &pieces {
        let len = p.pages * PAGE_SIZE;
        // Unregistering first keeps munmap from raising an UNMAP event at ourselves.
        let _ = mm.uffd.unregister(p.addr, len);
        // SAFETY: the piece is a mapping this region owns; it left the address map
        // under the gate, so no ioctl of the engine targets it any more.
        unsafe { crate::sys::munmap(p.addr as *mut libc::c_void, len) };
    }
    let folio = table.folio;
    let mut head = 0;
    while head < table.pages {
        let e = table.entry(head);
        let s = e.lock();
        if s.has(SPLIT) {
            e.unlock();
            for page in head..head + folio.pages() {
                let pe = table.entry(page);
                let ps = pe.lock();
                forget_readahead(mm, table, page);
                drop_storage(mm, ps.kind(), pe.handle(), FolioSize::K4, ps.has(WRITEBACK));
                pe.set_locked(ps.with_kind(Kind::Gone).with(WRITEBACK, false).with(CACHED, false));
                pe.clear_locked(PENDING);
                pe.unlock();
            }
        } else {
            forget_readahead(mm, table, head);
            drop_storage(mm, s.kind(), e.handle(), folio, s.has(WRITEBACK));
            e.set_locked(s.with_kind(Kind::Gone).with(WRITEBACK, false).with(CACHED, false));
            e.clear_locked(PENDING);
            e.unlock();
        }
        head += folio.pages();
    }
    // Evictions in flight release what they hold when they see the folio gone; wait
    // for them so that everything is returned when the drop returns.
    while table.evicting.load(Ordering::Acquire) > 0 {
        if mm.reclaim.wait_for_progress() == Wait::NothingInFlight {
            std::thread::yield_now();
        }
    }
    mm.managed_bytes.fetch_sub((table.pages * PAGE_SIZE) as u64, Ordering::Relaxed);
    mm.regions.fetch_sub(1, Ordering::Relaxed);
    mm.reclaim.notify_progress();
}
