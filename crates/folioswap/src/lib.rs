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
//! One module per kernel concept; `ARCHITECTURE.md` at the repository root maps them:
//! `folio` (the state machine), `region` (VMAs and folio tables), `fault` (do_swap_page),
//! `reclaim` (LRU, kswapd, direct reclaim), `memcg` (charging and watermarks), `staging`
//! and the swap cache, `zswap` (the compressed pool), `events` (DONTNEED/munmap/mremap),
//! `uffd` (the raw ioctls), `stats` (counters under the kernel's names).

mod config;
mod engine;
mod error;
mod events;
mod fault;
mod folio;
mod fork;
mod memcg;
mod page_io;
mod readahead;
mod reclaim;
mod region;
mod size;
mod smaps;
mod staging;
mod stats;
mod sys;
pub mod swapfile;
mod uffd;
mod zswap;

pub use config::{Compressor, Config, FaultMode, LruPolicy, SwapFileSpec, ENV_VARS, PRELOAD_VARS};
pub use engine::{Engine, Region};
pub use fork::ForkGuard;
pub use error::{Error, Result};
pub use region::RegionOptions;
pub use size::{format_bytes, parse_bytes, physical_memory, FolioSize, PoolLimit, SizeError, HUGE_SIZE, PAGE_SIZE};
pub use smaps::anon_huge_bytes;
pub use stats::{Latency, MemoryStat, RegionReadahead, SizeStat, Stats, SwapIoStats, SwapStat, VmStat};
pub use zswap::{Codec, CodecScratch};
