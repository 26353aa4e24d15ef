//! folioswap: the Linux kernel's modern swap design, in user space.
//!
//! Memory from [`Engine::map`] behaves like ordinary anonymous memory while no more than
//! `memory_high` of it stays resident: the rest is swapped out in whole folios (4 KiB up to
//! 2 MiB) to a compressed pool, and faults back in through userfaultfd, a 2 MiB folio as a
//! PMD-mapped transparent huge page.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = folioswap::Engine::new(folioswap::Config::from_env()?.memory_high("512M")?)?;
//! let mut region = engine.map(4 << 30, folioswap::RegionOptions::default().folio_size("2M")?)?;
//! region.as_mut_slice()[12345] = 7;
//! println!("{}", serde_json::to_string_pretty(&engine.stats())?);
//! # Ok(()) }
//! ```
//!
//! The modules, from the ground up (each imports only modules listed before it;
//! `ARCHITECTURE.md` at the repository root walks a fault and an eviction through them):
//!
//! - primitives: `sys` (raw mappings), `eventfd` (the threads' wakes), `size`, `uffd`
//!   (the raw ioctls), `smaps`, `config`, `error`, `stats` (counters under the kernel's
//!   names), `stages` (the sampled stage times of swap-ins and evictions), `thread_cpu`
//!   (the CPU a thread faulted on, from its rseq area), `trace` (a ring of state
//!   changes, feature `trace` only);
//! - state, no behaviour beyond its own invariants: `folio` (the state machine),
//!   `ra_window`, `table` (a region's folio table), `memcg` (charges and watermarks),
//!   `staging`, `lru`, `reclaim_ctl`, `zero_pace` (the zero scan's place and pace),
//!   `pollers` (which fault threads poll the userfaultfd), `local_wake` (a woken thread
//!   kept on its CPU: the fault thread at SCHED_IDLE for the wake-up), `event_queue`, `own_zaps`, `ra_cache`, `zswap/` (the pool), `seal`
//!   (page encryption), `swapfile/` (the swap file, `--encrypt`), `remote` (a Redis/Valkey
//!   cluster in the swap file's place), `pool_share` (how much of the limit a charged
//!   pool holds), `pool_bypass` (when the pool only passes folios through to the file),
//!   `tier` (the tiers behind one face);
//! - the context: `mm` (fields only, and the lock order);
//! - what the paths share: `addrmap`, `gate` (the event gate), `install` (every
//!   MOVE/COPY), `charge`, `release`;
//! - the paths: `readahead`, `events` (DONTNEED/munmap/mremap), `evict`, `writeback`,
//!   `zero_scan` (all-zero folios evicted first), `reclaim` (kswapd, direct reclaim),
//!   `fault` (do_swap_page);
//! - the public face: `engine`, `region`, `fork`, `kernel_access` (system calls on
//!   managed memory when the kernel's faults are not served: user-mode-only
//!   userfaultfd, signal mode).

mod config;
mod error;
mod eventfd;
mod size;
mod smaps;
mod stages;
mod stats;
mod sys;
mod thread_cpu;
#[cfg(feature = "trace")]
mod trace;
mod uffd;
mod written;

mod event_queue;
mod folio;
mod local_wake;
mod lru;
mod memcg;
mod own_zaps;
mod pollers;
mod pool_bypass;
mod pool_share;
mod ra_cache;
mod ra_window;
mod reclaim_ctl;
pub mod remote;
mod seal;
mod staging;
pub mod swapfile;
mod table;
mod tier;
mod zero_pace;
mod zswap;

mod mm;

mod addrmap;
mod charge;
mod compact;
mod gate;
mod install;
mod release;

mod events;
mod evict;
mod fault;
mod readahead;
mod reclaim;
mod writeback;
mod zero_scan;

mod engine;
mod fork;
mod kernel_access;
mod region;

/// Hooks for the crate's own tests, not part of its interface.
#[doc(hidden)]
pub mod testing {
    pub use crate::evict::{set_before_copy_zap, set_before_move_out};
}

pub use config::{Compressor, Config, FaultMode, LruPolicy, Recomp, SwapFileSpec, SwapinPolicy, ENV_VARS, PRELOAD_VARS};
pub use engine::{Engine, Quiesced};
pub use error::{Error, Result};
pub use fault::{forget_faulting_thread, forget_faulting_threads, register_faulting_thread, replace_chained_sigbus};
pub use fork::ForkGuard;
pub use kernel_access::{kernel_buffer_probe, prefault_for_kernel, KernelBuffer};
pub use region::Region;
pub use region::RegionOptions;
pub use size::{format_bytes, parse_bytes, physical_memory, FolioSize, PoolLimit, SizeError, HUGE_SIZE, PAGE_SIZE};
pub use smaps::{anon_huge_bytes, anon_huge_bytes_of, smaps_of, SmapsSums};
pub use stages::{StageMean, StageStat};
pub use stats::{
    Latency, LatencyHistogram, MemoryStat, RegionReadahead, RemoteStat, SizeStat, Stats, SwapIoStats, SwapStat, VmStat, STAT_SOCKET_PREFIX,
};
pub use sys::map_aligned;
pub use uffd::{InstallMode, UffdMode};
pub use zswap::{Codec, CodecScratch};
