//! The engine: starting one (its userfaultfds, staging, tiers, reclaimers and fault
//! servers) and the public [`Engine`] handle.
//!
//! Everything the engine's threads work on is one [`Mm`] (`mm.rs`); the handles own a
//! `Lifetime` whose drop stops and joins the threads once the engine and all its regions
//! are gone. Mapping and dropping regions is `region.rs`; fork is `fork.rs`.

use crate::config::SwapFileSpec;
use crate::config::{Config, FaultMode};
use crate::error::{Error, Result};
use crate::event_queue::EventQueue;
use crate::gate::kick;
use crate::local_wake::LocalWake;
use crate::lru::Lru;
use crate::memcg::{Component, MemCg};
use crate::mm::{Mm, ReclaimHooks};
use crate::own_zaps::OwnZaps;
use crate::pollers::Pollers;
use crate::ra_cache::Readahead;
use crate::reclaim_ctl::ReclaimCtl;
use crate::remote::RemoteTier;
use crate::size::format_bytes;
use crate::size::{physical_memory, FolioSize};
use crate::staging::Staging;
use crate::stats::{Counters, LatencyHistogram, MemoryStat, Stats};
use crate::swapfile::io::{on_demand_dir, SwapFile, SwapIo};
use crate::swapfile::sealed::SealedIo;
use crate::swapfile::SwapDevice;
use crate::tier::Tiers;
use crate::uffd::{self, InstallMode, OpenError, PageMap, Uffd};
use crate::written::Harvest;
use crate::zswap::Zswap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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

/// The swap file behind the pool, and who asked for it.
enum SwapTier {
    Configured(Box<dyn SwapIo>),
    /// Made by the engine: no swap file was configured (`Config::auto_swap_file`).
    OnDemand(Box<dyn SwapIo>),
}

impl SwapTier {
    /// The same file, every page encrypted and authenticated (`encrypt`).
    fn sealed(self) -> Result<SwapTier> {
        let seal =
            |io| SealedIo::new(io).map(|s| Box::new(s) as Box<dyn SwapIo>).map_err(|e| Error::sys("no key to encrypt the swap file", e));
        Ok(match self {
            SwapTier::Configured(io) => SwapTier::Configured(seal(io)?),
            SwapTier::OnDemand(io) => SwapTier::OnDemand(seal(io)?),
        })
    }
}

/// A sparse swap file in the first disk-backed temporary directory, as large as twice
/// the machine's memory or the free space there, whichever is less (it takes disk only
/// as folios are written). None, said once on stderr, where there is no such directory.
fn swap_file_on_demand() -> Option<Box<dyn SwapIo>> {
    let made = match on_demand_dir() {
        Some((dir, free)) => {
            let size = free.min(2 * physical_memory()).min(SwapFileSpec::MAX_SIZE);
            SwapFile::create_sparse(&dir, size).map_err(|e| e.to_string())
        }
        None => Err("no writable, disk-backed directory among /var/tmp, $TMPDIR and /tmp (tmpfs is memory)".into()),
    };
    match made {
        Ok(file) => Some(Box::new(file)),
        Err(why) => {
            once_on_stderr(format!(
                "folioswap: no swap file could be made on demand: {why}. Evicted folios go to the compressed pool only; \
                 set FOLIOSWAP_SWAP_FILE=PATH:SIZE on a disk, or =none to silence this"
            ));
            None
        }
    }
}

/// Say, once per process, that memory_high cannot bound data that does not compress.
fn warn_no_swap_file(config: &Config) {
    let high = config.memory_high.map(format_bytes).unwrap_or_default();
    once_on_stderr(format!(
        "folioswap: no swap file: memory_high={high} bounds resident memory only; the compressed pool grows outside it, \
         by as much as the data that does not compress (memory.limit_overrun_bytes in the stats)"
    ));
}

/// Say `message` once per process; not at all under a launcher that has said it
/// already (`folioswap run` sets FOLIOSWAP_WARNED for the processes it starts).
fn once_on_stderr(message: String) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        if !matches!(std::env::var_os("FOLIOSWAP_WARNED").as_deref(), Some(v) if v == "1") {
            eprintln!("{message}");
        }
    });
}

/// Threads that serve faults at once: the fault threads in thread mode; in signal mode
/// the faulting threads themselves, counted as one per CPU.
fn fault_servers(config: &Config) -> usize {
    match (config.fault_mode, config.fault_threads) {
        (FaultMode::Thread, n) if n > 0 => n,
        _ => ncpu(),
    }
}

/// Refuse a memory_high that cannot hold two folios of `folio` for every thread serving
/// faults (one being installed, one on its way out): faults would then have to fail.
pub(crate) fn check_limit_fits(config: &Config, folio: FolioSize) -> Result<()> {
    let Some(high) = config.memory_high else { return Ok(()) };
    let servers = fault_servers(config);
    let min = 2 * folio.bytes() as u64 * servers as u64;
    if high >= min {
        return Ok(());
    }
    Err(Error::config(
        "memory_high",
        format_bytes(high),
        format!(
            "at least {} for {folio} folios with {servers} fault thread{} (two folios per fault thread): raise \
             memory_high, use smaller folios (folio_size), or fewer fault threads (FOLIOSWAP_FAULT_THREADS)",
            format_bytes(min),
            if servers == 1 { "" } else { "s" }
        ),
    ))
}

pub(crate) fn ncpu() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// The CPUs the calling thread may run on (its affinity, which the engine's threads
/// inherit), in order; one unnamed CPU where the kernel will not say.
fn allowed_cpus() -> Vec<Option<usize>> {
    // SAFETY: a zeroed cpu_set_t of the size passed, which the kernel fills.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return vec![None; ncpu()];
        }
        set
    };
    // SAFETY: every `cpu` passed is below CPU_SETSIZE, the set's size.
    let cpus: Vec<Option<usize>> = (0..libc::CPU_SETSIZE as usize).filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) }).map(Some).collect();
    if cpus.is_empty() {
        vec![None]
    } else {
        cpus
    }
}

/// Keep the calling thread on `cpu` (none: leave it where the scheduler puts it). A
/// refusal (a cpuset changed meanwhile) leaves it unpinned, which only costs speed.
fn pin_to_cpu(cpu: Option<usize>) {
    let Some(cpu) = cpu else { return };
    // SAFETY: a zeroed cpu_set_t with one CPU below CPU_SETSIZE set, passed with its size,
    // for the calling thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// End the process after an engine thread panicked: the program's faults would otherwise
/// wait forever on a thread that is gone (and poison locks the others need). The message
/// goes to the real stderr, not through `eprintln!`: a test harness captures a spawned
/// thread's printing too, and the abort would lose it with the panic's own message.
fn abort_after_panic(payload: &(dyn std::any::Any + Send)) -> ! {
    use std::io::Write;
    let what = match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(text), _) => text,
        (_, Some(text)) => text.as_str(),
        _ => "a panic without a message",
    };
    let name = std::thread::current().name().unwrap_or("engine thread").to_string();
    let _ = writeln!(
        std::io::stderr().lock(),
        "folioswap: {name} panicked: {what}\nfolioswap: the engine cannot serve faults without it, so the process aborts"
    );
    std::process::abort();
}

impl Engine {
    /// Start an engine: opens its userfaultfds and its swap file (the configured one, or
    /// one made on demand: `Config::auto_swap_file`), and starts its reclaim threads (and
    /// fault threads in thread mode).
    pub fn new(config: Config) -> Result<Engine> {
        if let Some(remote) = &config.remote_tier {
            if let Some(file) = &config.swap_file {
                return Err(Error::config(
                    "FOLIOSWAP_REMOTE_TIER",
                    remote.to_string(),
                    format!(
                        "no swap file beside it: the remote tier takes the swap file's place, and {} is configured too \
                         (set FOLIOSWAP_SWAP_FILE=auto or none)",
                        file.path.display()
                    ),
                ));
            }
            let timeout = std::time::Duration::from_millis(config.remote_timeout_ms);
            let io = RemoteTier::connect(remote, timeout).map_err(|e| Error::RemoteTier(e.to_string()))?;
            return Self::start(config, Some(SwapTier::Configured(Box::new(io))));
        }
        let tier = match &config.swap_file {
            Some(spec) => Some(SwapTier::Configured(Box::new(SwapFile::create(&spec.path, spec.size).map_err(Error::SwapFile)?))),
            None if config.auto_swap_file && config.memory_high.is_some() => swap_file_on_demand().map(SwapTier::OnDemand),
            None => None,
        };
        let tier = match tier {
            Some(tier) if config.encrypt => Some(tier.sealed()?),
            tier => tier,
        };
        Self::start(config, tier)
    }

    /// Start an engine whose swap tier is `io` instead of the configured swap file: for
    /// tests that inject faults (`swapfile::io::FaultInjector`) and for other backends.
    pub fn with_swap_io(config: Config, io: Box<dyn SwapIo>) -> Result<Engine> {
        Self::start(config, Some(SwapTier::Configured(io)))
    }

    fn start(config: Config, tier: Option<SwapTier>) -> Result<Engine> {
        check_limit_fits(&config, config.folio_size)?;
        // UFFDIO_MOVE where the kernel has it (6.8+) and the configuration allows it;
        // otherwise every install is a COPY and evictions copy out (`InstallMode::Copy`).
        let install = if config.uffd_move && Uffd::available_features().map_err(open_error)? & uffd::FEATURE_MOVE != 0 {
            InstallMode::Move
        } else {
            InstallMode::Copy
        };
        let move_feature = if install == InstallMode::Move { uffd::FEATURE_MOVE } else { 0 };
        let mut features =
            move_feature | uffd::FEATURE_EVENT_REMOVE | uffd::FEATURE_EVENT_UNMAP | uffd::FEATURE_EVENT_REMAP | uffd::FEATURE_THREAD_ID;
        if config.fault_mode == FaultMode::Signal {
            features |= uffd::FEATURE_SIGBUS;
        }
        // Written bits need async write-protect (6.7+; `Uffd::open` names it if missing),
        // which rules out copy mode's synchronous write-protect while it copies a folio out.
        if config.written_aging {
            match install {
                InstallMode::Move => features |= uffd::FEATURE_WP_ASYNC,
                InstallMode::Copy if config.uffd_move => {
                    return Err(Error::KernelTooOld {
                        missing: vec!["UFFD_FEATURE_MOVE (UFFDIO_MOVE, Linux 6.8+), which written_aging needs"],
                    })
                }
                InstallMode::Copy => {
                    return Err(Error::config(
                        "FOLIOSWAP_WRITTEN_AGING",
                        "on",
                        "off while FOLIOSWAP_UFFD_MOVE is off: written bits need move mode",
                    ))
                }
            }
        }
        let uffd = Uffd::open(features).map_err(open_error)?;
        let written = match config.written_aging {
            true => Some(Harvest::new(PageMap::open().map_err(|e| Error::sys("opening /proc/self/pagemap", e))?, config.memory_high)),
            false => None,
        };
        // Move mode: staging on the region's userfaultfd, so that a move out fails while
        // an UNMAP is unread, emptied through a trash on a second one (`staging.rs`).
        let (staging_uffd, trash_uffd) = match install {
            InstallMode::Move => (
                uffd.try_clone().map_err(|e| Error::sys("duplicating the userfaultfd", e))?,
                Some(Uffd::open(move_feature).map_err(open_error)?),
            ),
            InstallMode::Copy => (Uffd::open(0).map_err(open_error)?, None),
        };
        // Both are charged to memory_high, so under a small limit both shrink with it: the
        // reserve to 256 KiB (a 4 KiB swap-in takes one filled slot and leaves one, so a
        // few are all it keeps busy; at 41M the former floor of 2M was a twentieth of the
        // dict's limit, BENCHMARKS.md, "The staging reserve's floor"), a batch slot to
        // 256 KiB filled (an emptying, one TLB shootdown, per 64 evicted 4 KiB folios
        // instead of 512).
        let reserve = config.memory_high.map(|m| (m / 128).clamp(256 << 10, 32 << 20)).unwrap_or(32 << 20);
        let batch_bytes = config.memory_high.map(|m| (m / 64).clamp(256 << 10, 2 << 20)).unwrap_or(2 << 20);
        let staging = Staging::new(staging_uffd, trash_uffd, reserve as usize, batch_bytes as usize)
            .map_err(|e| Error::sys("setting up staging (pagemap, trash)", e))?;
        let max_pool = config.max_pool.resolve(physical_memory());
        // The pool is charged only where what does not fit can leave memory (a swap file);
        // without one, charging it would turn incompressible data into a fault that fails.
        if tier.is_none() && config.memory_high.is_some() {
            warn_no_swap_file(&config);
        }
        let mut memcg = MemCg::new(config.memory_high, config.charge_pool && tier.is_some());
        if let Some(path) = &config.shared_limit {
            memcg = memcg.with_shared(path).map_err(|e| Error::sys(format!("sharing memory_high through {}", path.display()), e))?;
        }
        let kick = crate::eventfd::new().map_err(|e| Error::sys("eventfd", e))?;
        let file = tier.map(|t| match t {
            SwapTier::Configured(io) => SwapDevice::new(io, config.slot_cache, false),
            SwapTier::OnDemand(io) => SwapDevice::new(io, config.slot_cache, true),
        });
        let recomp = config.recomp_algorithm.resolve(file.is_some());
        let tiers = Tiers::new(Zswap::new(config.compressor, recomp, max_pool), file, &config);
        // Thread mode's default: one fault thread kept on each CPU the engine may use.
        let fault_cpus = allowed_cpus();
        let pollers = match (config.fault_mode, config.fault_threads) {
            (FaultMode::Thread, 0) => Pollers::kept_on(&fault_cpus).map_err(|e| Error::sys("eventfd", e))?,
            _ => Pollers::everyone(),
        };
        let local_wake = LocalWake::new(config.local_wake && config.fault_mode == FaultMode::Thread, pollers.kept_slots());
        let mm = Arc::new(Mm {
            id: NEXT_ENGINE_ID.fetch_add(1, Ordering::Relaxed),
            uffd,
            install,
            written,
            own_zaps: OwnZaps::default(),
            staging,
            tiers,
            memcg,
            lru: Lru::default(),
            zero_scan: Default::default(),
            reclaim: ReclaimCtl::default(),
            counters: Counters::default(),
            ra: Readahead::new(&config),
            gate: RwLock::new(()),
            events: EventQueue::default(),
            deferred_faults: Mutex::new(VecDeque::new()),
            unserved: Default::default(),
            prefaulting: AtomicUsize::new(0),
            kick_fd: kick,
            pollers,
            local_wake,
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
        // Each thread says when it runs under its name: `new` returns only then, so a
        // caller that counts the process's threads right after sees all of the engine's
        // (a new thread takes its name itself, a moment after `spawn` returns).
        let (started, all_started) = std::sync::mpsc::channel::<()>();
        // A thread running `f`, kept on `cpu` if one is given.
        let spawn_on = |name: String, cpu: Option<usize>, f: fn(Arc<Mm>), threads: &mut Vec<JoinHandle<()>>| -> Result<()> {
            let s = mm.clone();
            let started = started.clone();
            let run = move || {
                pin_to_cpu(cpu);
                let _ = started.send(());
                if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(s))) {
                    abort_after_panic(payload.as_ref());
                }
            };
            let t = std::thread::Builder::new().name(name).spawn(run).map_err(|e| Error::sys("starting an engine thread", e))?;
            threads.push(t);
            Ok(())
        };
        let spawn = |name: String, f: fn(Arc<Mm>), threads: &mut Vec<JoinHandle<()>>| spawn_on(name, None, f, threads);
        let reclaimers = match mm.config.reclaim_threads {
            0 => ncpu(),
            n => n,
        };
        for i in 0..reclaimers {
            spawn(format!("fsw-kswapd{i}"), crate::reclaim::kswapd, &mut threads)?;
        }
        match (mm.config.fault_mode, mm.config.fault_threads) {
            (FaultMode::Signal, _) => spawn("fsw-fault0".to_string(), crate::fault::fault_thread, &mut threads)?,
            (FaultMode::Thread, 0) => {
                // One fault thread on each CPU the engine may use: the one on the faulting
                // thread's CPU, which that thread has just left, usually gets there first,
                // and the wake-ups back and forth then stay on one CPU (BENCHMARKS.md,
                // "Fault threads, one on each CPU"). While one thread faults alone, only
                // that one polls (`pollers.rs`).
                for (i, cpu) in fault_cpus.into_iter().enumerate() {
                    spawn_on(format!("fsw-fault{i}"), cpu, crate::fault::fault_thread, &mut threads)?;
                }
            }
            (FaultMode::Thread, n) => {
                for i in 0..n {
                    spawn(format!("fsw-fault{i}"), crate::fault::fault_thread, &mut threads)?;
                }
            }
        }
        if mm.install == InstallMode::Copy {
            spawn("fsw-zapread".to_string(), crate::gate::read_for_own_zaps, &mut threads)?;
        }
        if mm.config.page_cluster > 0 && mm.config.ra_async {
            spawn("fsw-readahead".to_string(), crate::readahead::ra_worker, &mut threads)?;
        }
        drop(started);
        for _ in 0..threads.len() {
            // An error means every thread has sent or gone (a panic aborts the process).
            if all_started.recv().is_err() {
                break;
            }
        }
        let life = Arc::new(Lifetime { mm: mm.clone(), threads: Mutex::new(threads) });
        Ok(Engine { mm, _life: life })
    }

    /// How this engine puts pages into regions and takes them out: `Move` where the
    /// kernel has UFFDIO_MOVE (6.8+) and `uffd_move` is on, else `Copy`.
    pub fn install_mode(&self) -> InstallMode {
        self.mm.install
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

    /// Bytes of this process's memory the engine holds now: what it charges (resident
    /// managed memory, the swap cache, populated staging) plus the pool's footprint,
    /// charged or not. Cheap (a few atomic loads), for callers that sample it often.
    pub fn held_bytes(&self) -> u64 {
        self.mm.memcg.usage(0) + self.mm.tiers.zswap.pool.footprint_bytes()
    }

    /// What the trace ring (feature `trace`, `trace.rs`) holds for the managed page at
    /// `addr`, oldest first: changes to its entry and to its folio's head entry, and the
    /// events read over it. Empty for an address no region holds. Any engine answers for
    /// every engine's pages (the ring and the address map are process-wide).
    #[cfg(feature = "trace")]
    pub fn trace_history(addr: usize) -> Vec<String> {
        let Some((entry, page)) = crate::addrmap::ADDRESS_MAP.lookup(addr) else {
            return Vec::new();
        };
        let table = &entry.table;
        let key = |p: usize| table.entry(p) as *const crate::folio::PageEntry as usize;
        let head = table.head_of(page);
        let mut entries = vec![("page", key(page))];
        if head != page {
            entries.push(("head", key(head)));
        }
        crate::trace::lines(&entries, addr & !(crate::size::PAGE_SIZE - 1), |word| crate::folio::State(word as u32).to_string())
    }

    /// Every fault's service time so far, as a histogram that snapshots can be subtracted
    /// from and merged with (`folioswap stat`'s interval percentiles).
    pub fn fault_latency_histogram(&self) -> LatencyHistogram {
        crate::stats::fault_latency_histogram(&self.mm.counters)
    }

    /// Hold the engine still: while the guard lives no eviction, pool writeback or
    /// readahead starts, and those in flight have finished when this returns. Faults are
    /// still served (charging past memory_high meanwhile), so the counters then move only
    /// with the program's own accesses: take [`stats`](Engine::stats) under the guard
    /// for a consistent snapshot (tests, monitoring), and drop it soon.
    pub fn quiesce(&self) -> Quiesced<'_> {
        self.mm.memcg.suspend();
        self.mm.reclaim.quiesce();
        Quiesced { engine: self }
    }

    /// At process exit, when the engine will not be dropped (a preloaded library's):
    /// let go of what the tiers keep outside the process, the remote tier's keys.
    /// Swapped-out memory on that tier cannot be read back afterwards.
    pub fn close_tiers(&self) {
        if let Some(dev) = &self.mm.tiers.file {
            dev.io.close();
        }
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
        pool_slack_bytes: pool.slack_bytes(),
        pool_stored_bytes: mm.tiers.pool_folio_bytes(),
        pool_entries: pool.live_objects(),
        max_pool_bytes: pool.cap(),
        pool_share_bytes: mm.tiers.charged_pool_share(mm.memcg.limit),
        managed_bytes: mm.managed_bytes.load(Ordering::Relaxed),
        regions: mm.regions.load(Ordering::Relaxed),
        shared_charged_bytes: mm.memcg.shared().map(|s| s.total().load(Ordering::Relaxed)),
        limit_overrun_bytes: mm.memcg.note_overrun(pool.footprint_bytes()),
        limit_overrun_peak_bytes: mm.memcg.overrun_peak(),
    };
    Stats::collect(mm.uffd.mode(), mm.install, &mm.counters, memory, mm.tiers.file.as_ref().map(SwapDevice::stat))
}

/// An engine held still by [`Engine::quiesce`]; dropping it lets reclaim run again.
#[must_use = "the engine resumes when this is dropped"]
pub struct Quiesced<'a> {
    engine: &'a Engine,
}

impl Drop for Quiesced<'_> {
    fn drop(&mut self) {
        self.engine.mm.memcg.resume();
        self.engine.mm.reclaim.wake_all();
    }
}
