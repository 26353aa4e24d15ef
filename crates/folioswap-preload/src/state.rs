//! The managed blocks, the engine behind them, and the process lifecycle.
//!
//! One engine per process, started on first use from `FOLIOSWAP_*` (and, through the C
//! API, settings made before it starts). Every managed block is a region of it, keyed by
//! its address. Regions are made `keep_on_fork`: around `fork()` the engine brings every
//! swapped folio back so that the child inherits exactly the parent's memory. The child
//! keeps those blocks as plain memory (freeing one unmaps it) and starts a new engine
//! when it next needs one; exec starts clean. At exit the counters go to
//! `FOLIOSWAP_STATS_DIR/stats-PID.json` for `folioswap run`; the engine's threads are not
//! joined (exit ends them), so exit cannot hang on them. While the engine runs, the
//! process answers `folioswap stat` (`stat_server`).

use crate::alloc;
use crate::inside::within;
use engine::{Config, Engine, FolioSize, Region, RegionOptions};
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Whether the program's malloc and mmap are managed (preloaded), or only the C API is.
pub static INTERPOSE: AtomicBool = AtomicBool::new(false);
/// Blocks at least this large are managed.
pub static THRESHOLD: AtomicUsize = AtomicUsize::new(1 << 20);
/// Managed blocks alive: lets `free` skip the lookup in the common case.
pub static BLOCKS: AtomicUsize = AtomicUsize::new(0);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    Malloc,
    Mmap,
    Api,
}

pub struct Block {
    /// None in a forked child: the memory is inherited, no engine serves it.
    pub region: Option<Region>,
    /// Bytes of the mapping (the request rounded up to the folio size).
    pub len: usize,
    /// Bytes the program asked for.
    pub requested: usize,
    pub origin: Origin,
    /// Bytes the program munmapped piecemeal; the region goes when it has all gone.
    pub unmapped: usize,
}

pub struct State {
    engine: Option<Engine>,
    /// Settings made through the C API before the engine started.
    pending: Option<Config>,
    /// The engine could not start and FOLIOSWAP_FALLBACK allows running unmanaged.
    unmanaged: bool,
    pub blocks: BTreeMap<usize, Block>,
}

static STATE: Mutex<State> = Mutex::new(State { engine: None, pending: None, unmanaged: false, blocks: BTreeMap::new() });

pub fn lock() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn env_flag(name: &str) -> Option<bool> {
    let v = std::env::var(name).ok()?;
    Some(matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
}

/// Called when the library is loaded.
pub fn init() {
    alloc::resolve_usable_size();
    let preloaded = std::env::var("LD_PRELOAD").is_ok_and(|p| p.contains("libfolioswap"));
    let interpose = env_flag("FOLIOSWAP_INTERPOSE").unwrap_or(preloaded);
    if let Ok(v) = std::env::var("FOLIOSWAP_THRESHOLD") {
        match engine::parse_bytes(&v) {
            Ok(n) if n > 0 => THRESHOLD.store(n as usize, Ordering::Relaxed),
            _ => fatal(&format!("FOLIOSWAP_THRESHOLD={v:?} is not valid: expected a size like 1M or 256K")),
        }
    }
    if interpose {
        // A bad setting stops the program now, not at its first large allocation.
        match Config::from_env() {
            Ok(c) if c.fault_mode == engine::FaultMode::Signal => crate::sigmask::signal_mode_on(),
            Ok(_) => crate::threads::REGISTER_THREADS.store(true, Ordering::Relaxed),
            Err(e) => fatal(&e.to_string()),
        }
        // SAFETY: registers plain extern "C" functions of this library, which stays loaded.
        unsafe {
            libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child));
            libc::atexit(at_exit);
        }
        INTERPOSE.store(true, Ordering::Release);
    }
}

/// Stop the program with a message: it asked for managed memory that cannot be had.
fn fatal(msg: &str) -> ! {
    eprintln!("folioswap: {msg}");
    // SAFETY: ends the process at once; nothing of ours needs unwinding.
    unsafe { libc::_exit(127) }
}

impl State {
    /// The engine, started now if need be. `None`: running unmanaged (fallback).
    pub fn engine(&mut self) -> Result<Option<&Engine>, engine::Error> {
        if self.engine.is_none() && !self.unmanaged {
            let config = match self.pending.take() {
                Some(c) => c,
                None => Config::from_env()?,
            };
            match within(|| Engine::new(config)) {
                Ok(e) => {
                    crate::syscalls::engine_started(&e);
                    if e.config().fault_mode == engine::FaultMode::Signal {
                        crate::sigmask::signal_mode_on();
                    }
                    within(|| crate::stat_server::start(&e, managed_ranges));
                    if INTERPOSE.load(Ordering::Relaxed) && e.config().memory_high.is_some() {
                        within(|| crate::outside::start(&e));
                    }
                    self.engine = Some(e);
                }
                Err(e) if INTERPOSE.load(Ordering::Relaxed) => {
                    if env_flag("FOLIOSWAP_FALLBACK") == Some(true) {
                        eprintln!("folioswap: {e}; running unmanaged (FOLIOSWAP_FALLBACK)");
                        self.unmanaged = true;
                    } else {
                        fatal(&format!("{e} (set FOLIOSWAP_FALLBACK=1 to run unmanaged instead)"));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(self.engine.as_ref())
    }

    pub fn started(&self) -> bool {
        self.engine.is_some()
    }

    /// Settings for the engine to come (C API).
    pub fn pending(&mut self) -> Result<&mut Config, engine::Error> {
        if self.pending.is_none() {
            self.pending = Some(Config::from_env()?);
        }
        Ok(self.pending.as_mut().expect("just set"))
    }

    /// Map a managed block of at least `len` bytes aligned to `align`. `Ok(None)`: not
    /// managed (unmanaged fallback, or an alignment the folio size does not give).
    pub fn map(&mut self, len: usize, align: usize, origin: Origin) -> Result<Option<*mut c_void>, engine::Error> {
        let Some(engine) = self.engine()? else { return Ok(None) };
        let most = engine.config().folio_size;
        if align > most.bytes() {
            return Ok(None);
        }
        // A block's folio size fits its length (`FolioSize::fitting`), and its alignment.
        let aligned = FolioSize::from_bytes(align.next_power_of_two() as u64).unwrap_or(FolioSize::K4);
        let folio = FolioSize::fitting(len, most).max(aligned);
        let region = within(|| engine.map(len, RegionOptions::default().folio(folio).keep_on_fork(true)))?;
        let addr = region.as_ptr() as usize;
        let block = Block { len: region.len(), requested: len, origin, unmapped: 0, region: Some(region) };
        self.blocks.insert(addr, block);
        BLOCKS.fetch_add(1, Ordering::Relaxed);
        Ok(Some(addr as *mut c_void))
    }

    /// The block starting exactly at `addr`.
    pub fn block(&self, addr: usize) -> Option<&Block> {
        self.blocks.get(&addr)
    }

    /// The block containing `addr`, with its start.
    pub fn block_containing(&mut self, addr: usize) -> Option<(usize, &mut Block)> {
        let (&start, block) = self.blocks.range_mut(..=addr).next_back()?;
        (addr < start + block.len).then_some((start, block))
    }

    /// Release the block at `addr`: drop its region (the engine unmaps it), or unmap an
    /// inherited one.
    pub fn release(&mut self, addr: usize) -> bool {
        let Some(block) = self.blocks.remove(&addr) else { return false };
        BLOCKS.fetch_sub(1, Ordering::Relaxed);
        match block.region {
            Some(region) => within(|| drop(region)),
            // SAFETY: an inherited block's whole mapping, which the program let go of.
            None => unsafe {
                libc::syscall(libc::SYS_munmap, addr, block.len);
            },
        }
        true
    }

    /// The engine's counters as JSON, with `unmanaged_anon_peak_bytes` (`outside`) where
    /// this process sampled it.
    pub fn stats_json(&mut self) -> Result<Option<String>, engine::Error> {
        let Some(engine) = self.engine()? else { return Ok(None) };
        let mut stats = serde_json::to_value(engine.stats()).expect("stats serialise");
        if let (Some(peak), Some(fields)) = (crate::outside::peak_now(engine), stats.as_object_mut()) {
            fields.insert("unmanaged_anon_peak_bytes".into(), peak.into());
        }
        Ok(Some(serde_json::to_string(&stats).expect("stats serialise")))
    }
}

/// The managed blocks' ranges `(address, length)`, in address order, that this process's
/// engine serves (not those a forked child inherited): `folioswap stat`'s THP share.
fn managed_ranges() -> Vec<(usize, usize)> {
    lock().blocks.iter().filter(|(_, b)| b.region.is_some()).map(|(&a, b)| (a, b.len)).collect()
}

/// What `fork_prepare` holds until the fork is done. Only the forking thread touches it,
/// between its own fork handlers.
static mut FORK_HELD: Option<(MutexGuard<'static, State>, Option<engine::ForkGuard>)> = None;

extern "C" fn fork_prepare() {
    let state = lock();
    let guard = state.engine.as_ref().map(|e| within(|| e.prepare_fork()));
    // SAFETY: fork handlers run in the forking thread, in order (prepare, then parent or
    // child), and nothing else uses FORK_HELD.
    unsafe { *std::ptr::addr_of_mut!(FORK_HELD) = Some((state, guard)) };
}

extern "C" fn fork_parent() {
    // SAFETY: as in fork_prepare.
    let held = unsafe { (*std::ptr::addr_of_mut!(FORK_HELD)).take() };
    if let Some((state, guard)) = held {
        if let Some(g) = guard {
            within(|| g.parent());
        }
        drop(state);
    }
}

extern "C" fn fork_child() {
    // SAFETY: as in fork_prepare; the child has only this thread.
    let held = unsafe { (*std::ptr::addr_of_mut!(FORK_HELD)).take() };
    if let Some((mut state, guard)) = held {
        if let Some(g) = guard {
            within(|| g.child());
        }
        // The parent's engine and regions are not ours to run or release.
        crate::syscalls::engine_gone();
        crate::stat_server::forget_in_child();
        crate::outside::in_child();
        within(crate::threads::in_child);
        std::mem::forget(state.engine.take());
        for block in state.blocks.values_mut() {
            std::mem::forget(block.region.take());
        }
        state.unmanaged = false;
        drop(state);
    }
}

extern "C" fn at_exit() {
    let mut state = lock();
    let Some(engine) = state.engine.as_ref() else { return };
    engine.leave_shared_limit();
    if let (Some(dir), Ok(Some(stats))) = (std::env::var_os("FOLIOSWAP_STATS_DIR"), state.stats_json()) {
        let path = std::path::Path::new(&dir).join(format!("stats-{}.json", std::process::id()));
        if let Err(e) = std::fs::write(&path, stats) {
            eprintln!("folioswap: cannot write {}: {e}", path.display());
        }
    }
    // Last: the remote tier's keys, which would otherwise wait for their lease to expire.
    if let Some(engine) = state.engine.as_ref() {
        engine.close_tiers();
    }
}
