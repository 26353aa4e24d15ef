//! Engine configuration: builder methods and `FOLIOSWAP_*` environment variables.
//!
//! Every knob has one name used three ways: the builder method (`memory_high`), the
//! environment variable (`FOLIOSWAP_MEMORY_HIGH`) and the key in `Engine::stats()`'s
//! `config` section. A value that does not parse fails with an error naming the variable,
//! the value and what is accepted; an unknown `FOLIOSWAP_*` variable fails too, so that a
//! typo never silently runs with defaults.

use crate::error::{Error, Result};
use crate::size::{format_bytes, parse_bytes, FolioSize, PoolLimit};
use serde::Serialize;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// How a compressed folio is encoded in the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase", tag = "name")]
pub enum Compressor {
    Lz4,
    Zstd {
        level: i32,
    },
    /// Stores folios uncompressed: for tests and to measure the cost of compression.
    None,
}

impl Compressor {
    pub const ACCEPTED: &'static str = "lz4, zstd, zstd:LEVEL (1-19) or none";
    pub const ZSTD_DEFAULT_LEVEL: i32 = 3;
}

impl fmt::Display for Compressor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compressor::Lz4 => f.write_str("lz4"),
            Compressor::Zstd { level } => write!(f, "zstd:{level}"),
            Compressor::None => f.write_str("none"),
        }
    }
}

impl FromStr for Compressor {
    type Err = ();
    fn from_str(s: &str) -> std::result::Result<Self, ()> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "lz4" => Ok(Compressor::Lz4),
            "none" => Ok(Compressor::None),
            "zstd" => Ok(Compressor::Zstd { level: Self::ZSTD_DEFAULT_LEVEL }),
            _ => {
                let level = s.strip_prefix("zstd:").or_else(|| s.strip_prefix("zstd-")).ok_or(())?;
                let level: i32 = level.parse().map_err(|_| ())?;
                if (1..=19).contains(&level) {
                    Ok(Compressor::Zstd { level })
                } else {
                    Err(())
                }
            }
        }
    }
}

/// The second codec, for what the first leaves above 3/4 of its size (zram's
/// `recomp_algorithm`). `Auto`, the default, is none where a swap file takes what the
/// first codec cannot shrink (as zswap sends what it rejects to the swap device) and zstd:1
/// where the pool is the last tier, so that such data is kept in two thirds rather than
/// whole. With a swap file, GNU sort's text (which lz4 leaves whole and zstd:1 takes a
/// third off) ran 0.50-0.92x the time from the file at 0.55-0.7 of its footprint, where
/// recompressed it took room from the resident set in the charged pool, level at 0.8 and
/// 1.14x at 0.5 (BENCHMARKS.md, "A second codec only where there is no swap file").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recomp {
    Auto,
    Codec(Compressor),
}

impl Recomp {
    pub const ACCEPTED: &'static str = "auto, lz4, zstd, zstd:LEVEL (1-19) or none";
    /// What `Auto` is where the pool is the last tier.
    const WITHOUT_SWAP_FILE: Compressor = Compressor::Zstd { level: 1 };

    /// The codec an engine uses, given whether it has a swap file.
    pub fn resolve(self, swap_file: bool) -> Compressor {
        match self {
            Recomp::Auto if swap_file => Compressor::None,
            Recomp::Auto => Self::WITHOUT_SWAP_FILE,
            Recomp::Codec(c) => c,
        }
    }
}

impl fmt::Display for Recomp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Recomp::Auto => f.write_str("auto"),
            Recomp::Codec(c) => c.fmt(f),
        }
    }
}

impl FromStr for Recomp {
    type Err = ();
    fn from_str(s: &str) -> std::result::Result<Self, ()> {
        if s.trim().eq_ignore_ascii_case("auto") {
            return Ok(Recomp::Auto);
        }
        s.parse().map(Recomp::Codec)
    }
}

/// Who serves a fault on managed memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FaultMode {
    /// Dedicated fault threads read the userfaultfd (one per CPU). Works for every access,
    /// including the kernel's own (`read(2)` into managed memory, futexes, O_DIRECT).
    Thread,
    /// The faulting thread serves its own fault from a SIGBUS handler
    /// (`UFFD_FEATURE_SIGBUS`): no wake-up between CPUs, so small folios fault several
    /// times faster. Accesses made by the kernel on the program's behalf then fail with
    /// EFAULT instead of faulting, so use it only for memory the program touches itself.
    Signal,
}

impl FaultMode {
    pub const ACCEPTED: &'static str = "thread or signal";
}

impl fmt::Display for FaultMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FaultMode::Thread => "thread",
            FaultMode::Signal => "signal",
        })
    }
}

impl FromStr for FaultMode {
    type Err = ();
    fn from_str(s: &str) -> std::result::Result<Self, ()> {
        match s.trim().to_ascii_lowercase().as_str() {
            "thread" => Ok(FaultMode::Thread),
            "signal" => Ok(FaultMode::Signal),
            _ => Err(()),
        }
    }
}

/// How the LRU ages resident folios.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LruPolicy {
    /// Fault order: a folio joins the tail when installed and is evicted from the head.
    Fifo,
    /// Fault order on an inactive list, plus an active list for folios that refault
    /// within the working-set distance (evicted fewer pages ago than memory_high holds),
    /// as the kernel's workingset refault detection: hot folios a cold stream pushed out
    /// once are protected afterwards.
    Workingset,
}

impl LruPolicy {
    pub const ACCEPTED: &'static str = "fifo or workingset";
}

impl fmt::Display for LruPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LruPolicy::Fifo => "fifo",
            LruPolicy::Workingset => "workingset",
        })
    }
}

impl FromStr for LruPolicy {
    type Err = ();
    fn from_str(s: &str) -> std::result::Result<Self, ()> {
        match s.trim().to_ascii_lowercase().as_str() {
            "fifo" => Ok(LruPolicy::Fifo),
            "workingset" => Ok(LruPolicy::Workingset),
            _ => Err(()),
        }
    }
}

/// How much of a large folio a swap-in brings back (seed 000's `swapin_enabled`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SwapinPolicy {
    /// The whole folio, always; large folios are stored as one compressed stream.
    Always,
    /// Only the page that faulted: a large folio in the pool is split into 4 KiB pages,
    /// each fetched by its own fault, as the kernel swaps in without mTHP swap-in.
    Never,
    /// The whole folio when the fault looks sequential (at the folio's first or last
    /// page, where a stream enters it) or the folio is on the swap file and no larger
    /// than 64 KiB (one read brings all of it), else only the page.
    Adaptive,
}

impl SwapinPolicy {
    pub const ACCEPTED: &'static str = "always, never or adaptive";
}

impl fmt::Display for SwapinPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SwapinPolicy::Always => "always",
            SwapinPolicy::Never => "never",
            SwapinPolicy::Adaptive => "adaptive",
        })
    }
}

impl FromStr for SwapinPolicy {
    type Err = ();
    fn from_str(s: &str) -> std::result::Result<Self, ()> {
        match s.trim().to_ascii_lowercase().as_str() {
            "always" => Ok(SwapinPolicy::Always),
            "never" => Ok(SwapinPolicy::Never),
            "adaptive" => Ok(SwapinPolicy::Adaptive),
            _ => Err(()),
        }
    }
}

/// Where the swap file tier lives: a file path (created, refused if it exists) or a
/// directory (an unlinked `O_TMPFILE` is made there), and its size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SwapFileSpec {
    pub path: PathBuf,
    pub size: u64,
}

impl FromStr for SwapFileSpec {
    type Err = String;
    /// `PATH:SIZE`, e.g. `/var/tmp/app.swap:8G` or `/var/tmp:8G`.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let (path, size) = s.rsplit_once(':').ok_or("no :SIZE after the path")?;
        SwapFileSpec::new(PathBuf::from(path), size)
    }
}

impl SwapFileSpec {
    /// `path` as given (any bytes, `:` included) and a size like `8G`; why not, if not.
    pub fn new(path: PathBuf, size: &str) -> std::result::Result<Self, String> {
        if path.as_os_str().is_empty() {
            return Err("the path is empty".into());
        }
        let size = parse_bytes(size).map_err(|e| e.reason)?;
        if size < SwapFileSpec::MIN_SIZE {
            return Err(format!("the size must be at least {}", format_bytes(SwapFileSpec::MIN_SIZE)));
        }
        if size > SwapFileSpec::MAX_SIZE {
            return Err(format!("the size must be at most {}", format_bytes(SwapFileSpec::MAX_SIZE)));
        }
        Ok(SwapFileSpec { path, size })
    }

    pub const ACCEPTED: &'static str =
        "PATH:SIZE, a file to create or a directory, and a size from 2M to 16T (e.g. /var/tmp:8G); or auto (the default: made on demand), or none";
    /// One 2 MiB cluster.
    pub const MIN_SIZE: u64 = 2 << 20;
    /// 2^32 slots of 4 KiB: a swapped folio's handle word keeps its slot in 32 bits.
    pub const MAX_SIZE: u64 = 1 << 44;
}

/// The engine's configuration. Start from [`Config::default`] or [`Config::from_env`] and
/// refine with the builder methods.
#[derive(Clone, Debug, Serialize)]
pub struct Config {
    /// Resident managed bytes (plus pool bytes with `charge_pool`) the engine keeps under,
    /// as cgroup v2's memory.high. `None` is "max": no limit, nothing is swapped.
    pub memory_high: Option<u64>,
    /// Cap of the compressed pool, as zswap's `max_pool_percent`.
    #[serde(serialize_with = "serialize_display")]
    pub max_pool: PoolLimit,
    /// Count pool bytes against `memory_high` too, as cgroup v2 charges zswap to the
    /// memcg (the default). It takes effect only with a swap file to send what does not
    /// fit to: without one, the pool stays outside the limit (see `auto_swap_file`).
    pub charge_pool: bool,
    /// Default folio size of new regions: 64K. 2 MiB folios are THPs, and sequential passes
    /// swap them fastest, but their first eviction is blind to which of their 512 pages are
    /// in use: programs that access at random ran faster with 64K, or as fast, at every
    /// limit measured (BENCHMARKS.md, "64 KiB folios by default"). Ask for 2M where the
    /// access streams.
    #[serde(serialize_with = "serialize_display")]
    pub folio_size: FolioSize,
    pub compressor: Compressor,
    /// The second codec for what `compressor` leaves above 3/4 of its size (zram's
    /// `recomp_algorithm`): the smaller result is stored. [`Recomp`] says what `auto` is.
    #[serde(serialize_with = "serialize_display")]
    pub recomp_algorithm: Recomp,
    /// Swap large folios out and in as independent 4 KiB pages, as the kernel did before
    /// THP swap (seed 000's "before"): the baseline every benchmark compares against.
    pub split_swap: bool,
    /// How much of a large folio a swap-in brings back; a region may set its own
    /// (`RegionOptions::swapin_enabled`). Not `always`: large folios are stored in the
    /// pool as 4 KiB pieces so that one page can come back alone.
    pub swapin_enabled: SwapinPolicy,
    pub fault_mode: FaultMode,
    /// Move pages with `UFFDIO_MOVE` where the kernel has it (6.8+; the default). Off, or
    /// on an older kernel, the engine installs by `UFFDIO_COPY` and evicts by
    /// write-protect, copy and `MADV_DONTNEED` (`InstallMode::Copy`); `Engine::stats()`
    /// says which it uses (`install`).
    pub uffd_move: bool,
    /// Fault threads in thread mode; 0 means one per CPU.
    pub fault_threads: usize,
    /// Background reclaim (kswapd) threads, which also compress; 0 means one per CPU.
    pub reclaim_threads: usize,
    pub lru: LruPolicy,
    /// The swap file behind the pool; `None`: see `auto_swap_file`.
    pub swap_file: Option<SwapFileSpec>,
    /// With no `swap_file`, create one when the engine starts (with a memory_high): an
    /// unlinked, sparse file in the first disk-backed temporary directory (`/var/tmp`,
    /// then `$TMPDIR`, then `/tmp`; never tmpfs, which is memory), so that what does not
    /// compress, and what the pool cannot hold, leaves memory too and memory_high bounds
    /// the whole cost. `FOLIOSWAP_SWAP_FILE=none` turns it off: then the pool is the only
    /// place evicted folios go, and it is not charged to memory_high.
    pub auto_swap_file: bool,
    /// Once the pool has hit `max_pool` it accepts folios again only when it has shrunk
    /// under this percentage of it (zswap's `accept_threshold_percent`); meanwhile folios
    /// go to the swap file and the pool's coldest entries are written back there.
    pub accept_threshold_percent: u8,
    /// With a swap file, a folio that does not compress at least this much (original
    /// size over compressed size) goes straight to the file instead of the pool.
    pub min_compression_ratio: f64,
    /// With a swap file: while the pool only passes folios through to it (full, and
    /// serving under 1/16 of the swap-ins), send them to the file directly
    /// (`pool_bypass.rs`).
    pub pool_bypass: bool,
    /// While reclaim runs, read resident folios and evict the all-zero ones first
    /// (`zero_scan.rs`). Off by default: it cut the faults of a CPython dict at 0.8 of its
    /// footprint by 40-55% but gained it no time measurable here, and on memory that is
    /// never zero it costs reads (BENCHMARKS.md, "Zeros leave first").
    pub zero_scan: bool,
    /// Give folios written since eviction last looked at them a second chance, as the
    /// kernel does folios whose accessed bits are set: regions under 2 MiB folios are
    /// registered async write-protect (Linux 6.7+, move mode), eviction harvests their
    /// written bits with `PAGEMAP_SCAN` every memory_high/32 of evictions (`written.rs`),
    /// and reads them at the inactive head (`evict.rs`, `pick_victim`).
    pub written_aging: bool,
    /// In thread mode, a fault thread kept on a CPU wakes a faulting thread at
    /// SCHED_IDLE while the program runs one thread, so that the scheduler leaves that
    /// thread on its CPU instead of moving it to the idle one (`local_wake.rs`).
    pub local_wake: bool,
    /// Order-0 swap slots a thread caches, allocated and returned in batches of this many
    /// (the kernel's per-CPU swap slot cache); 0 turns the caches off.
    pub slot_cache: usize,
    /// Swap readahead by virtual address (seed 002): on a swap-in, bring the faulting
    /// folio's neighbours in its region into the swap cache. Off: neighbours in swap-slot
    /// order (eviction order), the kernel's older cluster readahead.
    pub vma_ra_enabled: bool,
    /// Readahead window cap as a power of two of folios (the kernel's `page-cluster`);
    /// 0 turns readahead off. 7, not the kernel's 3: the window only opens for a stream
    /// (no hits, no window), and for a stream a longer window reads the swap file in fewer,
    /// longer reads: 32 folios sped 4 KiB sequential swapping up by a quarter over 8
    /// (BENCHMARKS.md, "A miss on the file reads its window with it"), 128 by a sixth over
    /// 32 once writeback runs lay a stream's pages end to end ("Eviction batches that look
    /// past the LRU head"). Folios of 64 KiB and up stop at the 2 MiB block either way.
    pub page_cluster: u32,
    /// Eviction clustering, as a power of two of 4 KiB pages: a 4 KiB folio evicted takes
    /// along the resident pages next to it in its aligned block of 2^N pages that did not
    /// come in within the last memory_high/16 of evictions, in one MOVE and so one TLB
    /// shootdown (`evict.rs`); 0 turns it off. 4 (64 KiB): random access evicts pages
    /// that lie apart, and alone each cost a shootdown; with 16-page blocks the dict took
    /// a quarter less time, `sort` a sixth less, and 4K random writes went a sixth faster
    /// (BENCHMARKS.md, "Evicting a page's neighbours with it").
    pub evict_cluster: u32,
    /// Also detect a constant stride between a region's faults (a majority vote over its
    /// recent fault deltas) and read ahead along it.
    pub ra_stride: bool,
    /// Readahead on a helper thread: the faulting thread waits only for its own folio.
    pub ra_async: bool,
    /// Share `memory_high` with every process that names the same file here (as the
    /// processes of one cgroup share its memory.high); `folioswap run` sets it.
    pub shared_limit: Option<PathBuf>,
    /// A Redis or Valkey cluster that takes the swap file's place behind the pool
    /// (`remote.rs`): what the pool writes back or refuses goes there, encrypted.
    #[serde(serialize_with = "serialize_option_display")]
    pub remote_tier: Option<crate::remote::RemoteSpec>,
    /// The most time one remote request may take, retries and a failover included,
    /// before it fails (a fault then gets SIGBUS naming the tier and the key).
    pub remote_timeout_ms: u64,
    /// Encrypt and authenticate every page written to the swap file (`swapfile/sealed.rs`).
    pub encrypt: bool,
}

fn serialize_option_display<T: fmt::Display, S: serde::Serializer>(v: &Option<T>, s: S) -> std::result::Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.collect_str(v),
        None => s.serialize_none(),
    }
}

fn serialize_display<T: fmt::Display, S: serde::Serializer>(v: &T, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.collect_str(v)
}

impl Default for Config {
    fn default() -> Self {
        Config {
            memory_high: None,
            max_pool: PoolLimit::Percent(20.0),
            charge_pool: true,
            folio_size: FolioSize::K64,
            compressor: Compressor::Lz4,
            recomp_algorithm: Recomp::Auto,
            split_swap: false,
            swapin_enabled: SwapinPolicy::Adaptive,
            fault_mode: FaultMode::Thread,
            uffd_move: true,
            fault_threads: 0,
            reclaim_threads: 0,
            lru: LruPolicy::Workingset,
            swap_file: None,
            auto_swap_file: true,
            accept_threshold_percent: 90,
            min_compression_ratio: 1.0,
            pool_bypass: true,
            zero_scan: false,
            written_aging: false,
            local_wake: true,
            slot_cache: 64,
            vma_ra_enabled: true,
            page_cluster: 7,
            evict_cluster: 4,
            ra_stride: false,
            ra_async: true,
            shared_limit: None,
            remote_tier: None,
            remote_timeout_ms: 5000,
            encrypt: false,
        }
    }
}

/// The environment variables [`Config::from_env`] reads, with what each accepts.
pub const ENV_VARS: &[(&str, &str)] = &[
    ("FOLIOSWAP_MEMORY_HIGH", "a size like 512M or 4G, or max"),
    ("FOLIOSWAP_MAX_POOL", "a size like 256M or a percentage of RAM like 20%"),
    ("FOLIOSWAP_CHARGE_POOL", "1/0, true/false, yes/no or on/off"),
    ("FOLIOSWAP_FOLIO_SIZE", FolioSize::ACCEPTED),
    ("FOLIOSWAP_COMPRESSOR", Compressor::ACCEPTED),
    ("FOLIOSWAP_RECOMP_ALGORITHM", Recomp::ACCEPTED),
    ("FOLIOSWAP_SPLIT_SWAP", "1/0, true/false, yes/no or on/off"),
    ("FOLIOSWAP_SWAPIN_ENABLED", SwapinPolicy::ACCEPTED),
    ("FOLIOSWAP_FAULT_MODE", FaultMode::ACCEPTED),
    ("FOLIOSWAP_UFFD_MOVE", "1/0, true/false, yes/no or on/off"),
    ("FOLIOSWAP_FAULT_THREADS", "a thread count from 0 (one per CPU) to 1024"),
    ("FOLIOSWAP_RECLAIM_THREADS", "a thread count from 0 (one per CPU) to 1024"),
    ("FOLIOSWAP_LRU", LruPolicy::ACCEPTED),
    ("FOLIOSWAP_SWAP_FILE", SwapFileSpec::ACCEPTED),
    ("FOLIOSWAP_ACCEPT_THRESHOLD_PERCENT", "a percentage of max_pool from 0 to 100"),
    ("FOLIOSWAP_MIN_COMPRESSION_RATIO", "a ratio from 1.0 to 100, like 1.5"),
    ("FOLIOSWAP_SLOT_CACHE", "a slot count from 0 (no caches) to 4096"),
    ("FOLIOSWAP_VMA_RA_ENABLED", "1/0, true/false, yes/no or on/off"),
    ("FOLIOSWAP_PAGE_CLUSTER", "a window of 2^N folios, N from 0 (no readahead) to 9"),
    ("FOLIOSWAP_EVICT_CLUSTER", "a block of 2^N pages, N from 0 (off) to 9"),
    ("FOLIOSWAP_RA_STRIDE", "1/0, true/false, yes/no or on/off"),
    ("FOLIOSWAP_RA_ASYNC", "1/0, true/false, yes/no or on/off"),
    ("FOLIOSWAP_POOL_BYPASS", "1/0, true/false, yes/no or on/off"),
    ("FOLIOSWAP_ZERO_SCAN", "1/0, true/false, yes/no or on/off"),
    ("FOLIOSWAP_WRITTEN_AGING", "1/0, true/false, yes/no or on/off"),
    ("FOLIOSWAP_LOCAL_WAKE", "1/0, true/false, yes/no or on/off"),
    ("FOLIOSWAP_SHARED_LIMIT", "the path of a file through which processes share memory_high"),
    ("FOLIOSWAP_REMOTE_TIER", crate::remote::RemoteSpec::ACCEPTED),
    ("FOLIOSWAP_REMOTE_TIMEOUT_MS", "milliseconds from 100 to 600000"),
    ("FOLIOSWAP_ENCRYPT", "1/0, true/false, yes/no or on/off"),
];

/// Variables of libfolioswap.so (the preloaded library) and of `folioswap run`, not of the
/// engine: `from_env` leaves them alone.
pub const PRELOAD_VARS: &[(&str, &str)] = &[
    ("FOLIOSWAP_THRESHOLD", "a size like 1M: malloc blocks and mmaps at least this large are managed"),
    ("FOLIOSWAP_FALLBACK", "1/0: run unmanaged (with a warning) when the engine cannot start"),
    ("FOLIOSWAP_INTERPOSE", "1/0: manage the program's malloc and mmap (default: on when preloaded)"),
    ("FOLIOSWAP_STATS_DIR", "a directory each process writes its counters to at exit (stats-PID.json)"),
    (
        "FOLIOSWAP_RUN",
        "the pid of the `folioswap run` that started the process: `folioswap stat` groups a run's processes by it (set by `folioswap run`)",
    ),
    ("FOLIOSWAP_WARNED", "1: the launcher has said what the configuration cannot do (no swap file); the engines it starts stay quiet"),
    ("FOLIOSWAP_LIB", "the libfolioswap.so that `folioswap run` preloads (default: beside the executable, or in ../lib)"),
];

fn accepted(var: &str) -> &'static str {
    ENV_VARS.iter().find(|(name, _)| *name == var).map(|(_, a)| *a).unwrap_or("a valid value")
}

fn parse_bool(var: &str, value: &str) -> Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(Error::config(var, value, accepted("FOLIOSWAP_CHARGE_POOL"))),
    }
}

/// A power of two's exponent from 0 to `max`; refused with what `env` accepts.
fn parse_exponent(var: &str, value: &str, max: u32, env: &str) -> Result<u32> {
    value.trim().parse::<u32>().ok().filter(|&n| n <= max).ok_or_else(|| Error::config(var, value, accepted(env)))
}

fn parse_threads(var: &str, value: &str) -> Result<usize> {
    value.trim().parse::<usize>().ok().filter(|&n| n <= 1024).ok_or_else(|| Error::config(var, value, accepted("FOLIOSWAP_FAULT_THREADS")))
}

impl Config {
    /// Defaults overridden by every `FOLIOSWAP_*` variable that is set.
    pub fn from_env() -> Result<Config> {
        Self::from_vars(std::env::vars())
    }

    /// As [`Config::from_env`], from an explicit list of variables (for tests and launchers).
    pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Result<Config> {
        let mut config = Config::default();
        for (name, value) in vars {
            if !name.starts_with("FOLIOSWAP_") || PRELOAD_VARS.iter().any(|(n, _)| *n == name) {
                continue;
            }
            config = config.set(&name, &value)?;
        }
        Ok(config)
    }

    /// Set one knob by its environment variable name.
    pub fn set(self, var: &str, value: &str) -> Result<Config> {
        let config = match var {
            "FOLIOSWAP_MEMORY_HIGH" => self.parse_memory_high(var, value)?,
            "FOLIOSWAP_MAX_POOL" => self.parse_max_pool(var, value)?,
            "FOLIOSWAP_CHARGE_POOL" => self.charge_pool(parse_bool(var, value)?),
            "FOLIOSWAP_FOLIO_SIZE" => self.parse_folio_size(var, value)?,
            "FOLIOSWAP_COMPRESSOR" => self.parse_compressor(var, value)?,
            "FOLIOSWAP_RECOMP_ALGORITHM" => self.parse_recomp_algorithm(var, value)?,
            "FOLIOSWAP_SPLIT_SWAP" => self.split_swap(parse_bool(var, value)?),
            "FOLIOSWAP_SWAPIN_ENABLED" => {
                let policy = value.parse().map_err(|_| Error::config(var, value, SwapinPolicy::ACCEPTED))?;
                self.swapin_enabled(policy)
            }
            "FOLIOSWAP_FAULT_MODE" => {
                let mode = value.parse().map_err(|_| Error::config(var, value, FaultMode::ACCEPTED))?;
                self.fault_mode(mode)
            }
            "FOLIOSWAP_UFFD_MOVE" => self.uffd_move(parse_bool(var, value)?),
            "FOLIOSWAP_FAULT_THREADS" => self.fault_threads(parse_threads(var, value)?),
            "FOLIOSWAP_RECLAIM_THREADS" => self.reclaim_threads(parse_threads(var, value)?),
            "FOLIOSWAP_LRU" => {
                let lru = value.parse().map_err(|_| Error::config(var, value, LruPolicy::ACCEPTED))?;
                self.lru(lru)
            }
            "FOLIOSWAP_SWAP_FILE" => self.parse_swap_file(var, value)?,
            "FOLIOSWAP_ACCEPT_THRESHOLD_PERCENT" => self.parse_accept_threshold(var, value)?,
            "FOLIOSWAP_MIN_COMPRESSION_RATIO" => self.parse_min_ratio(var, value)?,
            "FOLIOSWAP_SLOT_CACHE" => self.parse_slot_cache(var, value)?,
            "FOLIOSWAP_VMA_RA_ENABLED" => self.vma_ra_enabled(parse_bool(var, value)?),
            "FOLIOSWAP_PAGE_CLUSTER" => self.parse_page_cluster(var, value)?,
            "FOLIOSWAP_EVICT_CLUSTER" => self.parse_evict_cluster(var, value)?,
            "FOLIOSWAP_RA_STRIDE" => self.ra_stride(parse_bool(var, value)?),
            "FOLIOSWAP_RA_ASYNC" => self.ra_async(parse_bool(var, value)?),
            "FOLIOSWAP_POOL_BYPASS" => self.pool_bypass(parse_bool(var, value)?),
            "FOLIOSWAP_ZERO_SCAN" => self.zero_scan(parse_bool(var, value)?),
            "FOLIOSWAP_WRITTEN_AGING" => self.written_aging(parse_bool(var, value)?),
            "FOLIOSWAP_LOCAL_WAKE" => self.local_wake(parse_bool(var, value)?),
            // Empty is no path: refused here rather than when the engine cannot open it.
            "FOLIOSWAP_SHARED_LIMIT" if value.is_empty() => return Err(Error::config(var, value, accepted(var))),
            "FOLIOSWAP_SHARED_LIMIT" => self.shared_limit(value),
            "FOLIOSWAP_REMOTE_TIER" if value.trim() == "none" => Config { remote_tier: None, ..self },
            "FOLIOSWAP_REMOTE_TIER" => {
                let spec = value.parse().map_err(|e| Error::config(var, value, format!("{} ({e})", accepted(var))))?;
                self.remote_tier(spec)
            }
            "FOLIOSWAP_REMOTE_TIMEOUT_MS" => match value.trim().parse::<u64>() {
                Ok(ms) if (100..=600_000).contains(&ms) => self.remote_timeout_ms(ms),
                _ => return Err(Error::config(var, value, accepted(var))),
            },
            "FOLIOSWAP_ENCRYPT" => self.encrypt(parse_bool(var, value)?),
            _ => {
                let known: Vec<&str> = ENV_VARS.iter().map(|(n, _)| *n).collect();
                return Err(Error::config(var, value, format!("a known variable: {}", known.join(", "))));
            }
        };
        Ok(config)
    }

    fn parse_memory_high(mut self, var: &str, value: &str) -> Result<Config> {
        if value.trim().eq_ignore_ascii_case("max") {
            self.memory_high = None;
            return Ok(self);
        }
        let bytes =
            parse_bytes(value).map_err(|e| Error::config(var, value, format!("{} ({})", accepted("FOLIOSWAP_MEMORY_HIGH"), e.reason)))?;
        if bytes < Self::MIN_MEMORY_HIGH {
            return Err(Error::config(var, value, format!("at least {}", format_bytes(Self::MIN_MEMORY_HIGH))));
        }
        self.memory_high = Some(bytes);
        Ok(self)
    }

    fn parse_max_pool(mut self, var: &str, value: &str) -> Result<Config> {
        self.max_pool = value
            .parse()
            .map_err(|e: crate::size::SizeError| Error::config(var, value, format!("{} ({})", accepted("FOLIOSWAP_MAX_POOL"), e.reason)))?;
        Ok(self)
    }

    fn parse_folio_size(mut self, var: &str, value: &str) -> Result<Config> {
        self.folio_size = value.parse().map_err(|_| Error::config(var, value, FolioSize::ACCEPTED))?;
        Ok(self)
    }

    fn parse_compressor(mut self, var: &str, value: &str) -> Result<Config> {
        self.compressor = value.parse().map_err(|_| Error::config(var, value, Compressor::ACCEPTED))?;
        Ok(self)
    }

    fn parse_recomp_algorithm(mut self, var: &str, value: &str) -> Result<Config> {
        self.recomp_algorithm = value.parse().map_err(|_| Error::config(var, value, Recomp::ACCEPTED))?;
        Ok(self)
    }

    fn parse_swap_file(mut self, var: &str, value: &str) -> Result<Config> {
        match value.trim() {
            "none" => (self.swap_file, self.auto_swap_file) = (None, false),
            "auto" => (self.swap_file, self.auto_swap_file) = (None, true),
            _ => {
                let spec =
                    value.parse::<SwapFileSpec>().map_err(|e| Error::config(var, value, format!("{} ({e})", SwapFileSpec::ACCEPTED)))?;
                self.swap_file = Some(spec);
            }
        }
        Ok(self)
    }

    fn parse_accept_threshold(mut self, var: &str, value: &str) -> Result<Config> {
        self.accept_threshold_percent = value
            .trim()
            .trim_end_matches('%')
            .parse::<u8>()
            .ok()
            .filter(|&p| p <= 100)
            .ok_or_else(|| Error::config(var, value, accepted("FOLIOSWAP_ACCEPT_THRESHOLD_PERCENT")))?;
        Ok(self)
    }

    fn parse_min_ratio(mut self, var: &str, value: &str) -> Result<Config> {
        self.min_compression_ratio = value
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|r| (1.0..=100.0).contains(r))
            .ok_or_else(|| Error::config(var, value, accepted("FOLIOSWAP_MIN_COMPRESSION_RATIO")))?;
        Ok(self)
    }

    fn parse_slot_cache(mut self, var: &str, value: &str) -> Result<Config> {
        self.slot_cache = value
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|&n| n <= 4096)
            .ok_or_else(|| Error::config(var, value, accepted("FOLIOSWAP_SLOT_CACHE")))?;
        Ok(self)
    }

    fn parse_page_cluster(mut self, var: &str, value: &str) -> Result<Config> {
        self.page_cluster = parse_exponent(var, value, Self::MAX_PAGE_CLUSTER, "FOLIOSWAP_PAGE_CLUSTER")?;
        Ok(self)
    }

    fn parse_evict_cluster(mut self, var: &str, value: &str) -> Result<Config> {
        self.evict_cluster = parse_exponent(var, value, Self::MAX_EVICT_CLUSTER, "FOLIOSWAP_EVICT_CLUSTER")?;
        Ok(self)
    }

    /// An eviction run never passes 2 MiB: 2^9 pages.
    pub const MAX_EVICT_CLUSTER: u32 = 9;

    /// A window never leaves the 2 MiB around the fault: 2^9 pages.
    pub const MAX_PAGE_CLUSTER: u32 = 9;

    /// The smallest `memory_high` accepted: room for a few 2 MiB folios in flight.
    pub const MIN_MEMORY_HIGH: u64 = 8 << 20;

    /// `"512M"`, `"4G"` or `"max"`.
    pub fn memory_high(self, value: &str) -> Result<Config> {
        self.parse_memory_high("memory_high", value)
    }
    pub fn memory_high_bytes(self, bytes: u64) -> Result<Config> {
        self.parse_memory_high("memory_high", &bytes.to_string())
    }
    /// `"256M"` or `"20%"`.
    pub fn max_pool(self, value: &str) -> Result<Config> {
        self.parse_max_pool("max_pool", value)
    }
    pub fn charge_pool(mut self, on: bool) -> Config {
        self.charge_pool = on;
        self
    }
    /// `"4K"` … `"2M"`.
    pub fn folio_size(self, value: &str) -> Result<Config> {
        self.parse_folio_size("folio_size", value)
    }
    /// `"lz4"`, `"zstd"`, `"zstd:5"` or `"none"`.
    pub fn compressor(self, value: &str) -> Result<Config> {
        self.parse_compressor("compressor", value)
    }
    /// The secondary codec: `"auto"` (the default: none with a swap file, zstd:1 without),
    /// any value `compressor` takes, or `"none"` for no second try.
    pub fn recomp_algorithm(self, value: &str) -> Result<Config> {
        self.parse_recomp_algorithm("recomp_algorithm", value)
    }
    pub fn split_swap(mut self, on: bool) -> Config {
        self.split_swap = on;
        self
    }
    pub fn fault_mode(mut self, mode: FaultMode) -> Config {
        self.fault_mode = mode;
        self
    }
    /// `false`: install by UFFDIO_COPY even where the kernel has UFFDIO_MOVE.
    pub fn uffd_move(mut self, on: bool) -> Config {
        self.uffd_move = on;
        self
    }
    pub fn fault_threads(mut self, n: usize) -> Config {
        self.fault_threads = n;
        self
    }
    pub fn reclaim_threads(mut self, n: usize) -> Config {
        self.reclaim_threads = n;
        self
    }
    pub fn swapin_enabled(mut self, policy: SwapinPolicy) -> Config {
        self.swapin_enabled = policy;
        self
    }
    pub fn lru(mut self, policy: LruPolicy) -> Config {
        self.lru = policy;
        self
    }
    /// A swap file behind the pool: `path` is a file to create or a directory to make an
    /// unlinked one in; `size` like `"8G"`.
    pub fn swap_file(mut self, path: impl Into<PathBuf>, size: &str) -> Result<Config> {
        // The path is kept as given: through `PATH:SIZE` text a non-UTF-8 path would be
        // mangled, and a size holding a `:` would move part of it into the path.
        let path = path.into();
        let spec = SwapFileSpec::new(path.clone(), size)
            .map_err(|e| Error::config("swap_file", format!("{}:{size}", path.display()), format!("{} ({e})", SwapFileSpec::ACCEPTED)))?;
        self.swap_file = Some(spec);
        Ok(self)
    }
    /// No swap file at all, not even one made on demand: the pool is the only place
    /// evicted folios go, and memory_high cannot hold for data that does not compress.
    pub fn no_swap_file(mut self) -> Config {
        (self.swap_file, self.auto_swap_file) = (None, false);
        self
    }
    /// `"90"`: percent of max_pool under which a full pool accepts folios again.
    pub fn accept_threshold_percent(self, value: &str) -> Result<Config> {
        self.parse_accept_threshold("accept_threshold_percent", value)
    }
    /// `"1.5"`: with a swap file, folios compressing less than this go to the file.
    pub fn min_compression_ratio(self, value: &str) -> Result<Config> {
        self.parse_min_ratio("min_compression_ratio", value)
    }
    pub fn slot_cache(self, slots: usize) -> Result<Config> {
        self.parse_slot_cache("slot_cache", &slots.to_string())
    }
    /// Readahead by virtual address (true, the default) or by swap-slot order (false).
    pub fn vma_ra_enabled(mut self, on: bool) -> Config {
        self.vma_ra_enabled = on;
        self
    }
    /// Readahead window cap, 2^`n` folios (0: no readahead; at most 9).
    pub fn page_cluster(self, n: u32) -> Result<Config> {
        self.parse_page_cluster("page_cluster", &n.to_string())
    }
    /// Eviction clustering, blocks of 2^`n` pages (0: off; at most 9).
    pub fn evict_cluster(self, n: u32) -> Result<Config> {
        self.parse_evict_cluster("evict_cluster", &n.to_string())
    }
    pub fn ra_stride(mut self, on: bool) -> Config {
        self.ra_stride = on;
        self
    }
    pub fn shared_limit(mut self, path: impl Into<PathBuf>) -> Config {
        self.shared_limit = Some(path.into());
        self
    }
    pub fn remote_tier(mut self, spec: crate::remote::RemoteSpec) -> Config {
        self.remote_tier = Some(spec);
        self
    }
    pub fn remote_timeout_ms(mut self, ms: u64) -> Config {
        self.remote_timeout_ms = ms;
        self
    }
    pub fn encrypt(mut self, on: bool) -> Config {
        self.encrypt = on;
        self
    }
    pub fn ra_async(mut self, on: bool) -> Config {
        self.ra_async = on;
        self
    }
    pub fn pool_bypass(mut self, on: bool) -> Config {
        self.pool_bypass = on;
        self
    }
    pub fn zero_scan(mut self, on: bool) -> Config {
        self.zero_scan = on;
        self
    }
    pub fn written_aging(mut self, on: bool) -> Config {
        self.written_aging = on;
        self
    }
    pub fn local_wake(mut self, on: bool) -> Config {
        self.local_wake = on;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::size::format_bytes_exact;
    use proptest::prelude::*;
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;

    fn vars(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    #[test]
    fn reads_every_variable() {
        let c = Config::from_vars(vars(&[
            ("FOLIOSWAP_MEMORY_HIGH", "512M"),
            ("FOLIOSWAP_MAX_POOL", "25%"),
            ("FOLIOSWAP_CHARGE_POOL", "yes"),
            ("FOLIOSWAP_FOLIO_SIZE", "64K"),
            ("FOLIOSWAP_COMPRESSOR", "zstd:7"),
            ("FOLIOSWAP_SPLIT_SWAP", "1"),
            ("FOLIOSWAP_FAULT_MODE", "signal"),
            ("FOLIOSWAP_FAULT_THREADS", "3"),
            ("FOLIOSWAP_RECLAIM_THREADS", "0"),
            ("FOLIOSWAP_LRU", "fifo"),
            ("FOLIOSWAP_SWAP_FILE", "/var/tmp/app.swap:8G"),
            ("FOLIOSWAP_ACCEPT_THRESHOLD_PERCENT", "80"),
            ("FOLIOSWAP_MIN_COMPRESSION_RATIO", "1.5"),
            ("FOLIOSWAP_SLOT_CACHE", "0"),
            ("FOLIOSWAP_VMA_RA_ENABLED", "off"),
            ("FOLIOSWAP_PAGE_CLUSTER", "5"),
            ("FOLIOSWAP_EVICT_CLUSTER", "0"),
            ("FOLIOSWAP_RA_STRIDE", "on"),
            ("FOLIOSWAP_RA_ASYNC", "0"),
            ("FOLIOSWAP_POOL_BYPASS", "off"),
            ("FOLIOSWAP_ZERO_SCAN", "yes"),
            ("FOLIOSWAP_RECOMP_ALGORITHM", "none"),
            ("FOLIOSWAP_LIB", "/opt/folioswap/lib/libfolioswap.so"),
            ("PATH", "/usr/bin"),
        ]))
        .unwrap();
        assert_eq!(c.memory_high, Some(512 << 20));
        assert_eq!(c.max_pool, PoolLimit::Percent(25.0));
        assert!(c.charge_pool && c.split_swap);
        assert_eq!(c.folio_size, FolioSize::K64);
        assert_eq!(c.compressor, Compressor::Zstd { level: 7 });
        assert_eq!(c.recomp_algorithm, Recomp::Codec(Compressor::None));
        assert_eq!(c.fault_mode, FaultMode::Signal);
        assert_eq!(c.fault_threads, 3);
        assert_eq!(c.lru, LruPolicy::Fifo);
        assert_eq!(c.swap_file, Some(SwapFileSpec { path: "/var/tmp/app.swap".into(), size: 8 << 30 }));
        assert_eq!(c.accept_threshold_percent, 80);
        assert_eq!(c.min_compression_ratio, 1.5);
        assert_eq!(c.slot_cache, 0);
        assert!(!c.vma_ra_enabled && c.ra_stride && !c.ra_async && !c.pool_bypass && c.zero_scan);
        assert_eq!(c.page_cluster, 5);
        assert_eq!(c.evict_cluster, 0);
    }

    #[test]
    fn recomp_auto_is_none_with_a_swap_file_and_zstd_without() {
        assert_eq!(Config::default().recomp_algorithm, Recomp::Auto);
        for (text, value) in [("auto", Recomp::Auto), (" AUTO ", Recomp::Auto), ("zstd:1", Recomp::Codec(Compressor::Zstd { level: 1 }))] {
            assert_eq!(text.parse::<Recomp>(), Ok(value), "{text:?}");
        }
        assert_eq!(Recomp::Auto.to_string(), "auto");
        assert_eq!(Recomp::Codec(Compressor::None).to_string(), "none");
        assert_eq!(Recomp::Auto.resolve(true), Compressor::None);
        assert_eq!(Recomp::Auto.resolve(false), Compressor::Zstd { level: 1 });
        // What the user names is what the engine uses, file or not.
        for c in [Compressor::None, Compressor::Lz4, Compressor::Zstd { level: 1 }] {
            assert_eq!(Recomp::Codec(c).resolve(true), c);
            assert_eq!(Recomp::Codec(c).resolve(false), c);
        }
        let err = Config::from_vars(vars(&[("FOLIOSWAP_RECOMP_ALGORITHM", "sometimes")])).unwrap_err().to_string();
        assert!(err.contains("FOLIOSWAP_RECOMP_ALGORITHM") && err.contains("auto, lz4"), "{err}");
    }

    #[test]
    fn bad_values_name_variable_value_and_accepted() {
        for (var, value, needle) in [
            ("FOLIOSWAP_MEMORY_HIGH", "lots", "512M"),
            ("FOLIOSWAP_MEMORY_HIGH", "1M", "at least 8M"),
            ("FOLIOSWAP_MAX_POOL", "120%", "percentage"),
            ("FOLIOSWAP_CHARGE_POOL", "maybe", "true/false"),
            ("FOLIOSWAP_FOLIO_SIZE", "3K", "64K"),
            ("FOLIOSWAP_COMPRESSOR", "gzip", "zstd:LEVEL"),
            ("FOLIOSWAP_COMPRESSOR", "zstd:40", "zstd:LEVEL"),
            ("FOLIOSWAP_FAULT_MODE", "fast", "thread or signal"),
            ("FOLIOSWAP_FAULT_THREADS", "-1", "thread count"),
            ("FOLIOSWAP_LRU", "clock", "fifo or workingset"),
            ("FOLIOSWAP_SWAP_FILE", "/var/tmp", "PATH:SIZE"),
            ("FOLIOSWAP_SWAP_FILE", "/var/tmp:1M", "at least 2M"),
            ("FOLIOSWAP_SWAP_FILE", "/var/tmp:17T", "at most 16T"),
            ("FOLIOSWAP_SWAP_FILE", ":8G", "path is empty"),
            ("FOLIOSWAP_ACCEPT_THRESHOLD_PERCENT", "120", "percentage"),
            ("FOLIOSWAP_MIN_COMPRESSION_RATIO", "0.5", "ratio"),
            ("FOLIOSWAP_SLOT_CACHE", "lots", "slot count"),
            ("FOLIOSWAP_PAGE_CLUSTER", "10", "2^N folios"),
            ("FOLIOSWAP_EVICT_CLUSTER", "10", "2^N pages"),
            ("FOLIOSWAP_RA_ASYNC", "sometimes", "true/false"),
            ("FOLIOSWAP_MEMORY_HGIH", "1G", "FOLIOSWAP_MEMORY_HIGH"),
        ] {
            let err = Config::from_vars(vars(&[(var, value)])).unwrap_err().to_string();
            assert!(err.contains(var) && err.contains(value) && err.contains(needle), "{err}");
        }
    }

    #[test]
    fn builder_errors_name_the_method() {
        let err = Config::default().memory_high("12 apples").unwrap_err().to_string();
        assert!(err.starts_with("memory_high=\"12 apples\""), "{err}");
        let err = Config::default().folio_size("5M").unwrap_err().to_string();
        assert!(err.starts_with("folio_size="), "{err}");
        assert_eq!(Config::default().memory_high("max").unwrap().memory_high, None);
    }

    #[test]
    fn swap_file_builder_keeps_the_path_as_given() {
        let c = Config::default().swap_file("/var/tmp/a:b", "8G").unwrap();
        assert_eq!(c.swap_file, Some(SwapFileSpec { path: "/var/tmp/a:b".into(), size: 8 << 30 }));
        // Once joined as "/var/tmp/x:2M:4M" and split at the last ':': a 4M file at
        // "/var/tmp/x:2M".
        let err = Config::default().swap_file("/var/tmp/x", "2M:4M").unwrap_err().to_string();
        assert!(err.starts_with("swap_file=\"/var/tmp/x:2M:4M\"") && err.contains("unknown suffix"), "{err}");
        // Once lossily converted to "/var/tmp/\u{FFFD}".
        let odd = PathBuf::from(OsString::from_vec(b"/var/tmp/\xff".to_vec()));
        assert_eq!(Config::default().swap_file(odd.clone(), "8G").unwrap().swap_file.unwrap().path, odd);
        let err = Config::default().swap_file("", "8G").unwrap_err().to_string();
        assert!(err.contains("path is empty"), "{err}");
    }

    #[test]
    fn empty_shared_limit_is_refused() {
        let err = Config::from_vars(vars(&[("FOLIOSWAP_SHARED_LIMIT", "")])).unwrap_err().to_string();
        assert!(err.starts_with("FOLIOSWAP_SHARED_LIMIT=\"\"") && err.contains("the path of a file"), "{err}");
    }

    #[test]
    fn every_knob_has_a_text_form() {
        let c = Config::default().swap_file("/var/tmp", "1G").unwrap().shared_limit("/tmp/limit").memory_high("1536M").unwrap();
        for (var, _) in ENV_VARS {
            let text = value_text(&c, var);
            let again = Config::default().set(var, &text).unwrap_or_else(|e| panic!("{var}={text:?}: {e}"));
            assert_eq!(value_text(&again, var), text, "{var}");
        }
    }

    /// The knob `var` of `c` as text that [`Config::set`] reads back as exactly that value.
    fn value_text(c: &Config, var: &str) -> String {
        let path = |p: &std::path::Path| p.to_str().expect("UTF-8 paths in these tests").to_string();
        match var {
            "FOLIOSWAP_MEMORY_HIGH" => c.memory_high.map(format_bytes_exact).unwrap_or_else(|| "max".into()),
            "FOLIOSWAP_MAX_POOL" => c.max_pool.to_string(),
            "FOLIOSWAP_CHARGE_POOL" => c.charge_pool.to_string(),
            "FOLIOSWAP_FOLIO_SIZE" => c.folio_size.to_string(),
            "FOLIOSWAP_COMPRESSOR" => c.compressor.to_string(),
            "FOLIOSWAP_RECOMP_ALGORITHM" => c.recomp_algorithm.to_string(),
            "FOLIOSWAP_SPLIT_SWAP" => c.split_swap.to_string(),
            "FOLIOSWAP_SWAPIN_ENABLED" => c.swapin_enabled.to_string(),
            "FOLIOSWAP_FAULT_MODE" => c.fault_mode.to_string(),
            "FOLIOSWAP_UFFD_MOVE" => c.uffd_move.to_string(),
            "FOLIOSWAP_FAULT_THREADS" => c.fault_threads.to_string(),
            "FOLIOSWAP_RECLAIM_THREADS" => c.reclaim_threads.to_string(),
            "FOLIOSWAP_LRU" => c.lru.to_string(),
            "FOLIOSWAP_SWAP_FILE" => match &c.swap_file {
                Some(f) => format!("{}:{}", path(&f.path), f.size),
                None if c.auto_swap_file => "auto".into(),
                None => "none".into(),
            },
            "FOLIOSWAP_ACCEPT_THRESHOLD_PERCENT" => c.accept_threshold_percent.to_string(),
            "FOLIOSWAP_MIN_COMPRESSION_RATIO" => c.min_compression_ratio.to_string(),
            "FOLIOSWAP_SLOT_CACHE" => c.slot_cache.to_string(),
            "FOLIOSWAP_VMA_RA_ENABLED" => c.vma_ra_enabled.to_string(),
            "FOLIOSWAP_PAGE_CLUSTER" => c.page_cluster.to_string(),
            "FOLIOSWAP_EVICT_CLUSTER" => c.evict_cluster.to_string(),
            "FOLIOSWAP_RA_STRIDE" => c.ra_stride.to_string(),
            "FOLIOSWAP_RA_ASYNC" => c.ra_async.to_string(),
            "FOLIOSWAP_POOL_BYPASS" => c.pool_bypass.to_string(),
            "FOLIOSWAP_ZERO_SCAN" => c.zero_scan.to_string(),
            "FOLIOSWAP_WRITTEN_AGING" => c.written_aging.to_string(),
            "FOLIOSWAP_LOCAL_WAKE" => c.local_wake.to_string(),
            "FOLIOSWAP_SHARED_LIMIT" => c.shared_limit.as_deref().map(path).unwrap_or_default(),
            "FOLIOSWAP_REMOTE_TIER" => c.remote_tier.as_ref().map(|r| r.to_string()).unwrap_or_else(|| "none".into()),
            "FOLIOSWAP_REMOTE_TIMEOUT_MS" => c.remote_timeout_ms.to_string(),
            "FOLIOSWAP_ENCRYPT" => c.encrypt.to_string(),
            _ => panic!("value_text does not know {var}: add the new knob here"),
        }
    }

    fn json(c: &Config) -> serde_json::Value {
        serde_json::to_value(c).expect("a config serialises")
    }

    fn known(var: &str) -> Option<&'static str> {
        ENV_VARS.iter().find(|(n, _)| *n == var).map(|(_, a)| *a)
    }

    /// `e` is a configuration error naming `name` (a variable or builder method) and
    /// `value`, and saying what is accepted: what ENV_VARS lists for `var`, if known.
    fn assert_config_error(e: &Error, name: &str, value: &str, var: &str) -> std::result::Result<(), TestCaseError> {
        let Error::Config { var: got_var, value: got_value, accepted } = e else {
            return Err(TestCaseError::fail(format!("{name}={value:?}: not a configuration error: {e}")));
        };
        prop_assert_eq!(got_var, name);
        prop_assert_eq!(got_value, value);
        let msg = e.to_string();
        prop_assert!(msg.contains(name) && msg.contains(&format!("{value:?}")) && msg.contains("expected "), "{}", msg);
        match known(var) {
            Some(text) => prop_assert!(
                accepted.contains(text) || (var == "FOLIOSWAP_MEMORY_HIGH" && accepted.starts_with("at least ")),
                "{} does not say what {} accepts ({})",
                msg,
                var,
                text
            ),
            None => prop_assert!(accepted.contains("a known variable") && accepted.contains("FOLIOSWAP_MEMORY_HIGH"), "{}", msg),
        }
        Ok(())
    }

    /// Values near what the knobs accept (sizes, percentages, numbers, names in any case,
    /// PATH:SIZE) and arbitrary text.
    fn any_value() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            "[ ]?[0-9]{0,21}(\\.[0-9]{0,4})?[ ]?([kKmMgGtTbB%]|[kKmMgGtT]i?[bB])?[ ]?",
            "[+-]?[0-9]{0,4}(\\.[0-9]{0,3})?(e[+-]?[0-9])?%{0,2}",
            "[ ]?(lz4|LZ4|zstd|ZStd|none|NONE|thread|Signal|fifo|FIFO|workingset|max|MAX|on|Off|yes|no|true|FALSE|NaN|inf|-inf)([:-][+-]?[0-9]{1,3})?[ ]?",
            "[/a-z: .]{0,10}:[0-9]{1,6}[kKmMgGtT]?",
        ]
    }

    fn any_var() -> impl Strategy<Value = String> {
        let names: Vec<String> = ENV_VARS.iter().chain(PRELOAD_VARS).map(|(n, _)| n.to_string()).collect();
        prop_oneof![
            6 => prop::sample::select(names),
            1 => "FOLIOSWAP_[A-Z_]{0,12}",
            1 => "(folioswap_memory_high|PATH|HOME|FOLIOSWAP)",
            1 => any::<String>(),
        ]
    }

    proptest! {
        /// Any variable, any value: no panic; an accepted value reads back from its text
        /// form to the same configuration; a refused one names the variable and the value
        /// and says what is accepted.
        #[test]
        fn set_accepts_or_explains(var in any_var(), value in any_value()) {
            match Config::default().set(&var, &value) {
                Ok(c) => {
                    prop_assert!(known(&var).is_some(), "{}={:?} accepted", var, value);
                    let text = value_text(&c, &var);
                    let again = Config::default().set(&var, &text).map_err(|e| {
                        TestCaseError::fail(format!("{var}={value:?} is accepted, its text form {text:?} is not: {e}"))
                    })?;
                    prop_assert_eq!(json(&again), json(&c), "{}={:?} read back from {:?}", var, value, text);
                }
                Err(e) => assert_config_error(&e, &var, &value, &var)?,
            }
        }

        /// The builder methods taking text accept and refuse exactly what their variables
        /// do, with the method's name in the error.
        #[test]
        fn builders_agree_with_the_variables(value in any_value()) {
            type Build = fn(Config, &str) -> Result<Config>;
            let builders: [(&str, &str, Build); 7] = [
                ("memory_high", "FOLIOSWAP_MEMORY_HIGH", Config::memory_high),
                ("max_pool", "FOLIOSWAP_MAX_POOL", Config::max_pool),
                ("folio_size", "FOLIOSWAP_FOLIO_SIZE", Config::folio_size),
                ("compressor", "FOLIOSWAP_COMPRESSOR", Config::compressor),
                ("recomp_algorithm", "FOLIOSWAP_RECOMP_ALGORITHM", Config::recomp_algorithm),
                ("accept_threshold_percent", "FOLIOSWAP_ACCEPT_THRESHOLD_PERCENT", Config::accept_threshold_percent),
                ("min_compression_ratio", "FOLIOSWAP_MIN_COMPRESSION_RATIO", Config::min_compression_ratio),
            ];
            for (method, var, build) in builders {
                match (build(Config::default(), &value), Config::default().set(var, &value)) {
                    (Ok(by_method), Ok(by_var)) => prop_assert_eq!(json(&by_method), json(&by_var)),
                    (Err(by_method), Err(by_var)) => {
                        assert_config_error(&by_method, method, &value, var)?;
                        assert_config_error(&by_var, var, &value, var)?;
                    }
                    (by_method, by_var) => {
                        return Err(TestCaseError::fail(format!("{method}({value:?}) gave {by_method:?}, {var} {by_var:?}")));
                    }
                }
            }
        }

        /// The builder methods taking numbers: in range accepted as given, out of range
        /// refused naming the method and the number.
        #[test]
        fn numeric_builders(bytes in prop_oneof![any::<u64>(), 0u64..(64 << 20)], slots in prop_oneof![any::<usize>(), 0usize..8192], cluster in prop_oneof![any::<u32>(), 0u32..16]) {
            match Config::default().memory_high_bytes(bytes) {
                Ok(c) => prop_assert!(bytes >= Config::MIN_MEMORY_HIGH && c.memory_high == Some(bytes)),
                Err(e) => {
                    prop_assert!(bytes < Config::MIN_MEMORY_HIGH);
                    assert_config_error(&e, "memory_high", &bytes.to_string(), "FOLIOSWAP_MEMORY_HIGH")?;
                }
            }
            match Config::default().slot_cache(slots) {
                Ok(c) => prop_assert!(slots <= 4096 && c.slot_cache == slots),
                Err(e) => {
                    prop_assert!(slots > 4096);
                    assert_config_error(&e, "slot_cache", &slots.to_string(), "FOLIOSWAP_SLOT_CACHE")?;
                }
            }
            match Config::default().page_cluster(cluster) {
                Ok(c) => prop_assert!(cluster <= Config::MAX_PAGE_CLUSTER && c.page_cluster == cluster),
                Err(e) => {
                    prop_assert!(cluster > Config::MAX_PAGE_CLUSTER);
                    assert_config_error(&e, "page_cluster", &cluster.to_string(), "FOLIOSWAP_PAGE_CLUSTER")?;
                }
            }
            match Config::default().evict_cluster(cluster) {
                Ok(c) => prop_assert!(cluster <= Config::MAX_EVICT_CLUSTER && c.evict_cluster == cluster),
                Err(e) => {
                    prop_assert!(cluster > Config::MAX_EVICT_CLUSTER);
                    assert_config_error(&e, "evict_cluster", &cluster.to_string(), "FOLIOSWAP_EVICT_CLUSTER")?;
                }
            }
        }

        /// swap_file(path, size): any path bytes are kept exactly; the size is checked as
        /// FOLIOSWAP_SWAP_FILE's is.
        #[test]
        fn swap_file_builder(path in prop::collection::vec(any::<u8>(), 0..24), size in any_value()) {
            let path = PathBuf::from(OsString::from_vec(path));
            match Config::default().swap_file(path.clone(), &size) {
                Ok(c) => {
                    let spec = c.swap_file.expect("a swap file");
                    prop_assert_eq!(&spec.path, &path);
                    prop_assert_eq!(spec.size, parse_bytes(&size).unwrap());
                    prop_assert!((SwapFileSpec::MIN_SIZE..=SwapFileSpec::MAX_SIZE).contains(&spec.size));
                }
                Err(e) => {
                    let value = format!("{}:{size}", path.display());
                    assert_config_error(&e, "swap_file", &value, "FOLIOSWAP_SWAP_FILE")?;
                    let size_ok = parse_bytes(&size).is_ok_and(|n| (SwapFileSpec::MIN_SIZE..=SwapFileSpec::MAX_SIZE).contains(&n));
                    prop_assert!(path.as_os_str().is_empty() || !size_ok, "{}", e);
                }
            }
        }

        /// from_vars skips what is not the engine's and fails on a bad FOLIOSWAP_*
        /// variable, naming it and its value.
        #[test]
        fn from_vars_names_the_bad_variable(list in prop::collection::vec((any_var(), any_value()), 0..6)) {
            let engine_vars: Vec<&(String, String)> =
                list.iter().filter(|(n, _)| n.starts_with("FOLIOSWAP_") && !PRELOAD_VARS.iter().any(|(p, _)| *p == n.as_str())).collect();
            match Config::from_vars(list.clone()) {
                Ok(c) => {
                    prop_assert!(engine_vars.iter().all(|(n, v)| Config::default().set(n, v).is_ok()));
                    if engine_vars.is_empty() {
                        prop_assert_eq!(json(&c), json(&Config::default()));
                    }
                }
                Err(e) => {
                    let Error::Config { var, value, .. } = &e else { return Err(TestCaseError::fail(format!("not a configuration error: {e}"))) };
                    let first_bad = engine_vars.iter().find(|(n, v)| Config::default().set(n, v).is_err());
                    prop_assert_eq!(first_bad.map(|(n, v)| (n, v)), Some((var, value)));
                    assert_config_error(&e, var, value, var)?;
                }
            }
        }
    }
}
