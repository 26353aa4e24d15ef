//! The program's anonymous memory that the engine does not manage, sampled: what
//! memory_high does not bound, reported at exit as `unmanaged_anon_peak_bytes` for
//! `folioswap run`, which warns when it grew large.
//!
//! Only heap blocks of `FOLIOSWAP_THRESHOLD` and up and anonymous read-write mmaps of
//! that size become managed (`interpose`). A program whose heap is made of small blocks
//! (perl's hashes, SQLite's page cache), or that reserves address space PROT_NONE and
//! commits it later with `mprotect` or a `MAP_FIXED` mmap (V8, the JVM), keeps its
//! memory outside the engine, and the limit holds none of it. Such a run used to end
//! with a summary that read like any other, its peak RSS twice the limit.
//!
//! The figure: the process's anonymous resident memory (`/proc/self/statm`, resident
//! less shared pages) less what the engine holds (`Engine::held_bytes`). What is left is
//! the program's own memory outside the engine, plus the library's own heap, the engine's
//! tables and thread stacks, which `folioswap run` allows for before it warns.
//!
//! A thread (`folioswap-rss`, running inside the library, so that nothing it allocates
//! is managed) samples every [`INTERVAL`] while a preloaded engine with a limit runs; the
//! exit handler takes one last sample, so that memory still held at exit is always seen.

use crate::inside::within;
use engine::Engine;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Between samples. One sample reads a line of /proc and a few atomics: a few
/// microseconds every 100 ms.
const INTERVAL: Duration = Duration::from_millis(100);

static PEAK: AtomicU64 = AtomicU64::new(0);
static STARTED: AtomicBool = AtomicBool::new(false);

/// Start sampling for `engine` (once per process).
pub fn start(engine: &Engine) {
    if STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    let engine = engine.clone();
    let spawned = std::thread::Builder::new().name("folioswap-rss".into()).spawn(move || loop {
        within(|| sample(&engine));
        std::thread::sleep(INTERVAL);
    });
    if let Err(e) = spawned {
        eprintln!("folioswap: cannot start the thread that watches memory outside the engine ({e}); only the exit is sampled");
    }
}

/// Take one sample: raise the peak if the memory outside the engine is above it.
fn sample(engine: &Engine) {
    if let Some(anon) = anon_resident_bytes() {
        PEAK.fetch_max(anon.saturating_sub(engine.held_bytes()), Ordering::Relaxed);
    }
}

/// The most anonymous memory seen outside the engine, a sample taken now included (at
/// exit: all the program still holds), if this process samples it.
pub fn peak_now(engine: &Engine) -> Option<u64> {
    if !STARTED.load(Ordering::Acquire) {
        return None;
    }
    within(|| sample(engine));
    Some(PEAK.load(Ordering::Relaxed))
}

/// In a forked child: the parent's sampler did not come across the fork, and the child's
/// own memory is measured from now (what it inherited counts as outside its engine, as it
/// is). Only async-signal-safe work: two atomic stores.
pub fn in_child() {
    STARTED.store(false, Ordering::Release);
    PEAK.store(0, Ordering::Relaxed);
}

/// Resident anonymous bytes of this process: `/proc/self/statm`'s resident pages less
/// its shared (file-backed and shmem) ones.
fn anon_resident_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/statm").ok()?;
    let mut fields = text.split_whitespace().skip(1).map(|f| f.parse::<u64>().ok());
    let resident = fields.next()??;
    let shared = fields.next()??;
    // SAFETY: sysconf(3) reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(resident.saturating_sub(shared) * u64::try_from(page).ok()?)
}
