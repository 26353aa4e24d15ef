//! The engine: starting one (its userfaultfds, staging, tiers, reclaimers and fault
//! servers) and the public [`Engine`] handle.
//!
//! Everything the engine's threads work on is one [`Mm`] (`mm.rs`); the handles own a
//! `Lifetime` whose drop stops and joins the threads once the engine and all its regions
//! are gone. Mapping and dropping regions is `region.rs`; fork is `fork.rs`.

use crate::config::{Config, FaultMode};
use crate::error::{Error, Result};
use crate::event_queue::EventQueue;
use crate::gate::kick;
use crate::lru::Lru;
use crate::memcg::{Component, MemCg};
use crate::mm::{Mm, ReclaimHooks};
use crate::ra_cache::Readahead;
use crate::reclaim_ctl::ReclaimCtl;
use crate::size::physical_memory;
use crate::staging::Staging;
use crate::stats::{Counters, MemoryStat, Stats};
use crate::swapfile::io::{SwapFile, SwapIo};
use crate::swapfile::SwapDevice;
use crate::tier::Tiers;
use crate::uffd::{self, OpenError, Uffd};
use crate::zswap::Zswap;
use std::collections::VecDeque;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;

static NEXT_ENGINE_ID: AtomicU64 = AtomicU64::new(1);

/// The folioswap engine. Cheap to clone; the engine lives until it and every region it
/// mapped are dropped.
#[derive(Clone)]
pub struct Engine {
    mm: Arc<Mm>,
    /// Held for its drop: the last handle (engine or region) stops the threads.
    _life: Arc<Lifetime>,
}

/// Stops and joins the engine's threads when the last handle goes.
struct Lifetime {
    mm: Arc<Mm>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Lifetime {
    fn drop(&mut self) {
        self.mm.stop.store(true, Ordering::SeqCst);
        self.mm.reclaim.wake_all();
        self.mm.ra.wake_all();
        kick(&self.mm);
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
        let tiers = Tiers::new(Zswap::new(config.compressor, max_pool), io.map(|io| SwapDevice::new(io, config.slot_cache)), &config);
        let mm = Arc::new(Mm {
            id: NEXT_ENGINE_ID.fetch_add(1, Ordering::Relaxed),
            uffd,
            staging,
            tiers,
            memcg,
            lru: Lru::default(),
            reclaim: ReclaimCtl::default(),
            counters: Counters::default(),
            ra: Readahead::new(&config),
            gate: RwLock::new(()),
            events: EventQueue::default(),
            deferred_faults: Mutex::new(VecDeque::new()),
            // SAFETY: `kick` was just created and is owned by nobody else.
            kick_fd: unsafe { OwnedFd::from_raw_fd(kick) },
            stop: AtomicBool::new(false),
            managed_bytes: AtomicU64::new(0),
            regions: AtomicU64::new(0),
            hooks: ReclaimHooks { direct_reclaim: crate::reclaim::direct_reclaim, shrink_caches: crate::reclaim::shrink_caches },
            config,
        });
        if mm.config.fault_mode == FaultMode::Signal {
            crate::fault::install_sigbus_handler();
        }
        let mut threads = Vec::new();
        let spawn = |name: String, f: fn(Arc<Mm>), threads: &mut Vec<JoinHandle<()>>| -> Result<()> {
            let s = mm.clone();
            let t = std::thread::Builder::new().name(name).spawn(move || f(s)).map_err(|e| Error::sys("starting an engine thread", e))?;
            threads.push(t);
            Ok(())
        };
        let reclaimers = match mm.config.reclaim_threads {
            0 => ncpu(),
            n => n,
        };
        for i in 0..reclaimers {
            spawn(format!("fsw-kswapd{i}"), crate::reclaim::kswapd, &mut threads)?;
        }
        let servers = match (mm.config.fault_mode, mm.config.fault_threads) {
            (FaultMode::Signal, _) => 1,
            (FaultMode::Thread, 0) => ncpu(),
            (FaultMode::Thread, n) => n,
        };
        for i in 0..servers {
            spawn(format!("fsw-fault{i}"), crate::fault::fault_thread, &mut threads)?;
        }
        if mm.config.page_cluster > 0 && mm.config.ra_async {
            spawn("fsw-readahead".to_string(), crate::readahead::ra_worker, &mut threads)?;
        }
        let life = Arc::new(Lifetime { mm: mm.clone(), threads: Mutex::new(threads) });
        Ok(Engine { mm, _life: life })
    }

    pub fn config(&self) -> &Config {
        &self.mm.config
    }

    pub(crate) fn mm(&self) -> &Arc<Mm> {
        &self.mm
    }

    /// A snapshot of the counters, memory and latency figures.
    pub fn stats(&self) -> Stats {
        stats(&self.mm)
    }

    /// Give this process's share of a shared limit (`shared_limit`) back, for good: at
    /// exit, so that the processes still running need not wait for it to be noticed dead.
    pub fn leave_shared_limit(&self) {
        if let Some(shared) = self.mm.memcg.shared() {
            shared.detach();
        }
    }
}

/// A snapshot of an engine's counters, memory and latency figures.
fn stats(mm: &Mm) -> Stats {
    let pool = &mm.tiers.zswap.pool;
    let memory = MemoryStat {
        memory_high: mm.config.memory_high,
        charged_bytes: mm.memcg.usage(pool.footprint_bytes()),
        resident_bytes: mm.memcg.get(Component::Resident),
        swapcache_bytes: mm.memcg.get(Component::SwapCache),
        readahead_bytes: mm.ra.cache.bytes(),
        staging_free_bytes: mm.memcg.get(Component::StagingFree),
        pool_total_bytes: pool.footprint_bytes(),
        pool_compressed_bytes: pool.stored_bytes(),
        pool_stored_bytes: mm.tiers.pool_folio_bytes(),
        pool_entries: pool.live_objects(),
        max_pool_bytes: pool.cap(),
        managed_bytes: mm.managed_bytes.load(Ordering::Relaxed),
        regions: mm.regions.load(Ordering::Relaxed),
        shared_charged_bytes: mm.memcg.shared().map(|s| s.total().load(Ordering::Relaxed)),
    };
    Stats::collect(mm.uffd.mode(), &mm.counters, memory, mm.tiers.file.as_ref().map(SwapDevice::stat))
}
