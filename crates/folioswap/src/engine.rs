//! The engine: configuration, the two userfaultfds, the pool, the reclaimers and the
//! fault servers, and the public `Engine`/`Region` handles.
//!
//! `Shared` is everything the engine's threads (and, in signal mode, the faulting threads
//! themselves) work on; the handles own a `Lifetime` whose drop stops and joins the
//! threads once the engine and all its regions are gone. Behaviour lives in the modules
//! named after the kernel concepts: `fault.rs` (do_swap_page), `reclaim.rs` (LRU, kswapd,
//! direct reclaim), `events.rs` (REMOVE/UNMAP/REMAP), `zswap/` (the pool).

use crate::config::{Config, FaultMode};
use crate::error::{Error, Result};
use crate::folio::{Kind, CACHED, PENDING, SPLIT, WRITEBACK};
use crate::memcg::{Component, MemCg};
use crate::reclaim::{Lru, ReclaimCtl};
use crate::region::{AddressMap, FolioTable, MapEntry, RegionOptions};
use crate::size::{format_bytes, physical_memory, FolioSize, PAGE_SIZE};
use crate::staging::{Staged, Staging};
use crate::stats::{Counters, MemoryStat, Stats};
use crate::uffd::{self, OpenError, Uffd};
use crate::swapfile::io::{SwapFile, SwapIo};
use crate::swapfile::SwapDevice;
use crate::zswap::Zswap;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;

/// Every managed mapping of this process, whichever engine owns it.
pub(crate) static ADDRESS_MAP: std::sync::LazyLock<AddressMap> = std::sync::LazyLock::new(AddressMap::default);

static NEXT_ENGINE_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) struct Shared {
    pub id: u64,
    pub config: Config,
    /// Registered MISSING on regions; faults and events arrive here.
    pub uffd: Uffd,
    pub staging: Staging,
    pub zswap: Zswap,
    /// The pool's entries oldest first, for writeback to the swap file.
    pub pool_lru: crate::page_io::PoolLru,
    /// The swap file tier behind the pool, if configured.
    pub swap: Option<SwapDevice>,
    pub memcg: MemCg,
    pub lru: Lru,
    pub reclaim: ReclaimCtl,
    pub counters: Counters,
    /// Swap readahead: the copies read ahead, the slot-order state, the helper's queue.
    pub ra: crate::readahead::Readahead,
    /// The event gate: shared around every ioctl that maps a page to an address in a
    /// region; exclusive around reading the userfaultfd and changing the address map.
    pub gate: RwLock<()>,
    pub events: crate::events::EventQueue,
    /// Faults read by a thread that could not serve them at once (thread mode).
    pub deferred_faults: Mutex<VecDeque<(usize, u32)>>,
    /// Wakes the fault/event threads: stop, deferred faults, events to apply.
    pub kick_fd: OwnedFd,
    pub stop: AtomicBool,
    pub managed_bytes: AtomicU64,
    pub regions: AtomicU64,
}

/// The folioswap engine. Cheap to clone; the engine lives until it and every region it
/// mapped are dropped.
#[derive(Clone)]
pub struct Engine {
    shared: Arc<Shared>,
    life: Arc<Lifetime>,
}

/// Stops and joins the engine's threads when the last handle goes.
struct Lifetime {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Lifetime {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.reclaim.wake_all();
        self.shared.ra.wake_all();
        self.shared.kick();
        for t in self.threads.lock().unwrap().drain(..) {
            let _ = t.join();
        }
    }
}

fn open_error(e: OpenError) -> Error {
    match e {
        OpenError::Unavailable { errno } => Error::UserfaultfdUnavailable { errno },
        OpenError::MissingFeatures { missing } => Error::KernelTooOld { missing },
    }
}

pub(crate) fn ncpu() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

impl Engine {
    /// Start an engine: opens its userfaultfds and its swap file (if configured), and
    /// starts its reclaim threads (and fault threads in thread mode).
    pub fn new(config: Config) -> Result<Engine> {
        let io: Option<Box<dyn SwapIo>> = match &config.swap_file {
            Some(spec) => Some(Box::new(SwapFile::create(&spec.path, spec.size).map_err(Error::SwapFile)?)),
            None => None,
        };
        Self::start(config, io)
    }

    /// Start an engine whose swap tier is `io` instead of the configured swap file: for
    /// tests that inject faults (`swapfile::io::FaultInjector`) and for other backends.
    pub fn with_swap_io(config: Config, io: Box<dyn SwapIo>) -> Result<Engine> {
        Self::start(config, Some(io))
    }

    fn start(config: Config, io: Option<Box<dyn SwapIo>>) -> Result<Engine> {
        let mut features = uffd::FEATURE_MOVE
            | uffd::FEATURE_EVENT_REMOVE
            | uffd::FEATURE_EVENT_UNMAP
            | uffd::FEATURE_EVENT_REMAP
            | uffd::FEATURE_THREAD_ID;
        if config.fault_mode == FaultMode::Signal {
            features |= uffd::FEATURE_SIGBUS;
        }
        let uffd = Uffd::open(features).map_err(open_error)?;
        let staging_uffd = Uffd::open(uffd::FEATURE_MOVE).map_err(open_error)?;
        let reserve = config.memory_high.map(|m| (m / 32).clamp(4 << 20, 32 << 20)).unwrap_or(32 << 20);
        let staging = Staging::new(staging_uffd, reserve as usize).map_err(|e| Error::sys("opening /proc/self/pagemap", e))?;
        let max_pool = config.max_pool.resolve(physical_memory());
        let mut memcg = MemCg::new(config.memory_high, config.charge_pool);
        if let Some(path) = &config.shared_limit {
            memcg = memcg.with_shared(path).map_err(|e| Error::sys(format!("sharing memory_high through {}", path.display()), e))?;
        }
        // SAFETY: eventfd(2) with flags only; returns a new descriptor or -1.
        let kick = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if kick < 0 {
            return Err(Error::sys("eventfd", std::io::Error::last_os_error()));
        }
        let shared = Arc::new(Shared {
            id: NEXT_ENGINE_ID.fetch_add(1, Ordering::Relaxed),
            uffd,
            staging,
            zswap: Zswap::new(config.compressor, max_pool),
            pool_lru: Default::default(),
            swap: io.map(|io| SwapDevice::new(io, config.slot_cache)),
            memcg,
            lru: Lru::default(),
            reclaim: ReclaimCtl::default(),
            counters: Counters::default(),
            ra: crate::readahead::Readahead::new(&config),
            gate: RwLock::new(()),
            events: Default::default(),
            deferred_faults: Mutex::new(VecDeque::new()),
            // SAFETY: `kick` was just created and is owned by nobody else.
            kick_fd: unsafe { OwnedFd::from_raw_fd(kick) },
            stop: AtomicBool::new(false),
            managed_bytes: AtomicU64::new(0),
            regions: AtomicU64::new(0),
            config,
        });
        if shared.config.fault_mode == FaultMode::Signal {
            crate::fault::install_sigbus_handler();
        }
        let mut threads = Vec::new();
        let spawn = |name: String, f: fn(Arc<Shared>), threads: &mut Vec<JoinHandle<()>>| -> Result<()> {
            let s = shared.clone();
            let t = std::thread::Builder::new()
                .name(name)
                .spawn(move || f(s))
                .map_err(|e| Error::sys("starting an engine thread", e))?;
            threads.push(t);
            Ok(())
        };
        let reclaimers = match shared.config.reclaim_threads {
            0 => ncpu(),
            n => n,
        };
        for i in 0..reclaimers {
            spawn(format!("fsw-kswapd{i}"), crate::reclaim::kswapd, &mut threads)?;
        }
        let servers = match (shared.config.fault_mode, shared.config.fault_threads) {
            (FaultMode::Signal, _) => 1,
            (FaultMode::Thread, 0) => ncpu(),
            (FaultMode::Thread, n) => n,
        };
        for i in 0..servers {
            spawn(format!("fsw-fault{i}"), crate::fault::fault_thread, &mut threads)?;
        }
        if shared.config.page_cluster > 0 && shared.config.ra_async {
            spawn("fsw-readahead".to_string(), crate::readahead::ra_worker, &mut threads)?;
        }
        let life = Arc::new(Lifetime { shared: shared.clone(), threads: Mutex::new(threads) });
        Ok(Engine { shared, life })
    }

    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Map `len` bytes (rounded up to the folio size) of managed, zero-filled memory.
    pub fn map(&self, len: usize, options: RegionOptions) -> Result<Region> {
        let shared = &self.shared;
        let folio = options.folio_size.unwrap_or(shared.config.folio_size);
        // Config::MIN_MEMORY_HIGH holds four folios of the largest size, so any folio size fits.
        if len == 0 {
            return Err(Error::InvalidRegion("a region must be at least one byte long".into()));
        }
        let len = len.checked_next_multiple_of(folio.bytes()).filter(|&l| l <= isize::MAX as usize);
        let Some(len) = len else {
            return Err(Error::Map { len: usize::MAX, errno: libc::ENOMEM });
        };
        let addr = crate::region::map_aligned(len, folio.bytes().max(PAGE_SIZE)).map_err(|errno| Error::Map { len, errno })?;
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
                Arc::new(t)
            }
            Err(errno) => {
                unmap();
                return Err(Error::Map { len, errno });
            }
        };
        if let Err(e) = shared.uffd.register(addr, len, uffd::REGISTER_MODE_MISSING) {
            unmap();
            return Err(Error::sys("registering a region with userfaultfd", e));
        }
        {
            let _gate = shared.gate.write().unwrap();
            ADDRESS_MAP.insert(addr, MapEntry { end: addr + len, table: table.clone(), page: 0, engine: shared.clone() });
        }
        shared.managed_bytes.fetch_add(len as u64, Ordering::Relaxed);
        shared.regions.fetch_add(1, Ordering::Relaxed);
        Ok(Region { engine: self.clone(), table, addr, len })
    }

    /// A snapshot of the counters, memory and latency figures.
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// Give this process's share of a shared limit (`shared_limit`) back, for good: at
    /// exit, so that the processes still running need not wait for it to be noticed dead.
    pub fn leave_shared_limit(&self) {
        if let Some(shared) = self.shared.memcg.shared() {
            shared.detach();
        }
    }
}

impl Shared {
    pub fn stats(&self) -> Stats {
        let pool = &self.zswap.pool;
        let memory = MemoryStat {
            memory_high: self.config.memory_high,
            charged_bytes: self.memcg.usage(pool.footprint_bytes()),
            resident_bytes: self.memcg.get(Component::Resident),
            swapcache_bytes: self.memcg.get(Component::SwapCache),
            readahead_bytes: self.ra.cache.bytes(),
            staging_free_bytes: self.memcg.get(Component::StagingFree),
            pool_total_bytes: pool.footprint_bytes(),
            pool_compressed_bytes: pool.stored_bytes(),
            pool_stored_bytes: self.reclaim.pool_folio_bytes.load(Ordering::Relaxed),
            pool_entries: pool.live_objects(),
            max_pool_bytes: pool.cap(),
            managed_bytes: self.managed_bytes.load(Ordering::Relaxed),
            regions: self.regions.load(Ordering::Relaxed),
            shared_charged_bytes: self.memcg.shared().map(|s| s.total().load(Ordering::Relaxed)),
        };
        Stats::collect(&self.counters, memory, self.swap.as_ref().map(SwapDevice::stat))
    }

    /// Wake the fault/event threads (stop, deferred faults, events to apply).
    pub fn kick(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd; a full counter only
        // means a kick is already pending.
        unsafe { libc::write(self.kick_fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Reserve `bytes` of resident memory for a fault, reclaiming directly when that would
    /// pass memory_high. Fails only when nothing can be evicted or stored and no reclaim is
    /// in flight: the pool is full and there is no swap file.
    pub fn reserve(&self, bytes: u64) -> std::result::Result<(), String> {
        /// Milliseconds a fault waits for other processes sharing the limit to reclaim.
        const SHARED_WAIT: u32 = 200;
        let mut stalled = false;
        let mut waited = 0;
        loop {
            let pool = self.zswap.pool.footprint_bytes();
            if self.memcg.try_charge(Component::Resident, bytes, pool) {
                if self.memcg.above_high(pool) {
                    self.reclaim.wake_one();
                }
                return Ok(());
            }
            if !stalled {
                self.counters.vm.allocstall.inc();
                stalled = true;
            }
            self.reclaim.wake_all();
            if self.reclaim_direct() {
                continue;
            }
            if self.reclaim.wait_for_progress() {
                continue;
            }
            if self.staging.drain_reserve(&self.memcg) > 0 || self.drain_readahead() > 0 {
                continue;
            }
            if let Some(shared) = self.memcg.shared() {
                // Nothing of ours to reclaim: the other processes sharing the limit must
                // make room. Give them time, then go past the limit rather than fail.
                let pool_stuck = self.reclaim.pool_is_full() && self.swap.is_none();
                if !pool_stuck && shared.reap_dead() == 0 && waited < SHARED_WAIT {
                    waited += 1;
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    continue;
                }
                if !pool_stuck {
                    self.counters.vm.memory_high_overrun.inc();
                    self.memcg.charge(Component::Resident, bytes);
                    return Ok(());
                }
            }
            return Err(self.oom_reason());
        }
    }

    /// Why memory_high cannot be kept: the message a refused fault carries.
    fn oom_reason(&self) -> String {
        let pool = &self.zswap.pool;
        let fp = pool.footprint_bytes();
        let limit = format_bytes(self.memcg.limit.unwrap_or(0));
        let usage = format!(
            "{} charged: {} resident, {} in the swap cache, {} pool{}",
            format_bytes(self.memcg.usage(fp)),
            format_bytes(self.memcg.get(Component::Resident)),
            format_bytes(self.memcg.get(Component::SwapCache)),
            format_bytes(fp),
            if self.memcg.charge_pool { " (charged)" } else { "" }
        );
        if let Some(dev) = self.swap.as_ref().filter(|dev| !dev.has_free_slots()) {
            let stat = dev.stat();
            format!(
                "cannot keep memory_high={limit} ({usage}): the swap file has no room ({} of {} slots used, \
                 {} bad) and the compressed pool cannot take the rest ({} of max_pool {}); use a larger \
                 swap file, or raise max_pool or memory_high",
                stat.slots_used,
                stat.slots_total,
                stat.slots_bad,
                format_bytes(fp),
                format_bytes(pool.cap())
            )
        } else if self.reclaim.pool_is_full() && self.swap.is_none() {
            format!(
                "cannot keep memory_high={limit} ({usage}): the compressed pool is full ({} of max_pool {}) \
                 and there is no swap file to write back to; configure one (FOLIOSWAP_SWAP_FILE), \
                 or raise max_pool or memory_high",
                format_bytes(fp),
                format_bytes(pool.cap())
            )
        } else {
            format!(
                "cannot keep memory_high={limit} ({usage}): every resident folio is in use by a fault in \
                 progress; raise memory_high or use a smaller folio size"
            )
        }
    }

    /// Release whatever a folio holds (its storage and its charge), leaving its kind to the
    /// caller. Called under the folio's lock.
    pub fn drop_storage(&self, kind: Kind, handle: u64, folio: FolioSize, writeback: bool) {
        let bytes = folio.bytes() as u64;
        match kind {
            Kind::Resident => self.memcg.uncharge(Component::Resident, bytes),
            // Under writeback the compressor owns the slot and its charge: it sees the
            // folio changed and releases both when it finishes.
            Kind::SwapCache if writeback => {}
            Kind::SwapCache => self.release_staged(Staged::from_raw(handle), folio, false),
            Kind::Pool | Kind::Swapped => self.free_swapped(kind, handle, folio),
            Kind::Untouched | Kind::ZeroSwapped | Kind::Gone => {}
        }
    }

    /// Drop a region: take it out of the address map, unmap it, release every folio.
    fn unmap_table(&self, table: &Arc<FolioTable>) {
        let pieces = {
            let _gate = self.gate.write().unwrap();
            table.dead.store(true, Ordering::SeqCst);
            ADDRESS_MAP.remove_table(table)
        };
        for p in &pieces {
            let len = p.pages * PAGE_SIZE;
            // Unregistering first keeps munmap from raising an UNMAP event at ourselves.
            let _ = self.uffd.unregister(p.addr, len);
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
                    self.drop_storage(ps.kind(), pe.handle(), FolioSize::K4, ps.has(WRITEBACK));
                    pe.set_locked(ps.with_kind(Kind::Gone).with(WRITEBACK, false));
                    pe.clear_locked(PENDING);
                    pe.unlock();
                }
            } else {
                self.forget_readahead(table, head);
                self.drop_storage(s.kind(), e.handle(), folio, s.has(WRITEBACK));
                e.set_locked(s.with_kind(Kind::Gone).with(WRITEBACK, false).with(CACHED, false));
                e.clear_locked(PENDING);
                e.unlock();
            }
            head += folio.pages();
        }
        // Evictions in flight release what they hold when they see the folio gone; wait
        // for them so that everything is returned when the drop returns.
        while table.evicting.load(Ordering::Acquire) > 0 {
            if !self.reclaim.wait_for_progress() {
                std::thread::yield_now();
            }
        }
        self.managed_bytes.fetch_sub((table.pages * PAGE_SIZE) as u64, Ordering::Relaxed);
        self.regions.fetch_sub(1, Ordering::Relaxed);
        self.reclaim.notify_progress();
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
    /// This region's swap readahead: folios read ahead, hits, waste, and its window now.
    pub fn readahead_stats(&self) -> crate::stats::RegionReadahead {
        self.table.ra.snapshot()
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.engine.shared.unmap_table(&self.table);
        let _ = &self.engine.life;
    }
}

// SAFETY: a region is a handle to memory the engine serves from any thread; its raw
// pointer is only an address.
unsafe impl Send for Region {}
// SAFETY: as above; shared references hand out only `&[u8]`.
unsafe impl Sync for Region {}
