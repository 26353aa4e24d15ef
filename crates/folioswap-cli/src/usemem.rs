//! `folioswap bench usemem`: vm-scalability's usemem, inside the engine.
//!
//! N workers each map a region of SIZE and write every 8-byte word, in order (seq) or in
//! a random permutation (rand), for R rounds: round 1 swaps out, later rounds swap in and
//! out. Then every word is verified against the value its last write must have left.
//! Throughput is the bytes the workers wrote over the wall time of the rounds (usemem
//! also credits allocation; this does not).

use crate::pattern::{value, Permutation};
use folioswap::{format_bytes, Config, Engine, FolioSize, Region, RegionOptions, Stats};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    Seq,
    Rand,
    /// Per round: the cold part in 16 sequential chunks, the hot part (the first
    /// --hot-fraction of the region) rewritten after every chunk.
    Hotcold,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Against {
    /// The kernel's own swap, same workload, same limit.
    Kernel,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelSwapKind {
    /// zram0 with lz4, the only swap device.
    Zram,
    /// A swap file in /var/tmp (zswap off).
    File,
    /// The swap file behind zswap (lz4 where the kernel's crypto API has it).
    Zswap,
}

#[derive(clap::Args, Debug)]
pub struct UsememArgs {
    /// Worker threads, each with its own region.
    #[arg(long, default_value_t = 2)]
    pub(crate) threads: usize,
    /// Region size per worker (e.g. 1G).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub(crate) size: u64,
    /// memory_high for the engine (e.g. 512M), or "max".
    #[arg(long, default_value = "512M")]
    pub(crate) limit: String,
    /// Folio size: 4K … 2M (default: FOLIOSWAP_FOLIO_SIZE or 64K).
    #[arg(long)]
    pub(crate) folio: Option<String>,
    /// Rounds over the whole region.
    #[arg(long, default_value_t = 4)]
    pub(crate) rounds: u32,
    /// Write order.
    #[arg(long, value_enum, default_value_t = Pattern::Seq)]
    pub(crate) pattern: Pattern,
    /// lz4, zstd, zstd:LEVEL or none (default: FOLIOSWAP_COMPRESSOR or lz4).
    #[arg(long)]
    compressor: Option<String>,
    /// Swap large folios as 4 KiB pages, as the kernel did before THP swap.
    #[arg(long)]
    split: bool,
    /// How much of a large folio a swap-in brings back: always, never or adaptive
    /// (default: FOLIOSWAP_SWAPIN_ENABLED or adaptive).
    #[arg(long)]
    swapin: Option<String>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Cap of the compressed pool (size or percentage of RAM).
    #[arg(long)]
    max_pool: Option<String>,
    /// Count pool memory against the limit too (the default wherever there is a swap
    /// file, which there is unless `--swap-file none`).
    #[arg(long)]
    charge_pool: bool,
    /// thread or signal.
    #[arg(long)]
    fault_mode: Option<String>,
    /// hotcold: the share of each region that is hot.
    #[arg(long, default_value_t = 0.125)]
    pub(crate) hot_fraction: f64,
    /// Coldness policy: fifo or workingset (default: FOLIOSWAP_LRU or workingset).
    #[arg(long)]
    lru: Option<String>,
    /// rand: writes per worker per round (default: one per word, as usemem).
    #[arg(long, value_parser = parse_size)]
    pub(crate) writes: Option<u64>,
    /// rand: end a round after this many seconds even if its writes are not done.
    #[arg(long, default_value_t = 10.0)]
    pub(crate) round_time: f64,
    /// Background reclaim threads (0: one per CPU).
    #[arg(long)]
    reclaim_threads: Option<usize>,
    /// Fault threads in thread mode (0: one per CPU).
    #[arg(long)]
    fault_threads: Option<usize>,
    /// A swap file behind the pool: PATH:SIZE, a file to create or a directory; auto (the
    /// default, or FOLIOSWAP_SWAP_FILE): a sparse file made in /var/tmp; none: no file,
    /// the pool alone (uncharged). `--max-pool 0` with a file turns the pool off.
    #[arg(long)]
    swap_file: Option<String>,
    /// A Redis or Valkey cluster in the swap file's place: redis://HOST:PORT[,HOST:PORT…]
    /// (or FOLIOSWAP_REMOTE_TIER). What the pool writes back or refuses goes there,
    /// encrypted; a write waits for a replica where the masters have one.
    #[arg(long)]
    remote_tier: Option<String>,
    /// Encrypt and authenticate every page written to the swap file (FOLIOSWAP_ENCRYPT).
    #[arg(long)]
    encrypt: bool,
    /// Percent of max_pool under which a full pool accepts folios again.
    #[arg(long)]
    accept_threshold: Option<String>,
    /// With a swap file: folios compressing less than this go straight to the file.
    #[arg(long)]
    min_compression_ratio: Option<String>,
    /// Then run the same workload on plain memory under the kernel's own swap, with the
    /// same limit (a memory cgroup), and print both side by side (root; restores every
    /// setting it touches).
    #[arg(long, value_enum)]
    pub(crate) against: Option<Against>,
    /// With --against kernel: zram (lz4, the default), a swap file in /var/tmp, or that
    /// file behind zswap (lz4 where the kernel's crypto API has it).
    #[arg(long, value_enum, requires = "against")]
    pub(crate) kernel_swap: Option<KernelSwapKind>,
    /// The kernel side of --against kernel: the workload on plain anonymous memory.
    #[arg(long, hide = true, conflicts_with = "against")]
    pub(crate) plain_memory: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    folioswap::parse_bytes(s).map_err(|e| e.to_string())
}

struct Worker {
    /// Write positions at the end of each round (rand) or words per round (seq).
    bounds: Vec<u64>,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct Mismatch {
    worker: usize,
    word: u64,
    expected: String,
    found: String,
}

/// What a run reports whatever memory it ran on (engine regions or plain memory).
#[derive(Serialize, Deserialize)]
pub(crate) struct Outcome {
    pub throughput_mb_s: f64,
    pub wall_s: f64,
    pub verified: bool,
    pub bytes_written: u64,
    pub writes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writes_per_s: Option<f64>,
    pub words_verified: u64,
    pub mismatches: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub first_mismatches: Vec<Mismatch>,
    pub anon_huge_bytes: u64,
    pub resident_bytes: u64,
    pub anon_huge_pct_of_resident: f64,
    pub round_s: Vec<f64>,
    /// CPU time the process used during the rounds, and that as a share of every CPU.
    pub cpu_s: f64,
    pub cpu_utilization_pct: f64,
}

#[derive(Serialize)]
pub(crate) struct Report {
    #[serde(flatten)]
    pub outcome: Outcome,
    pub pool_bytes: u64,
    pub config: RunConfig,
    pub stats: Stats,
}

#[derive(Serialize)]
pub(crate) struct RunConfig {
    pub threads: usize,
    pub size: u64,
    pub memory_high: Option<u64>,
    pub folio: String,
    pub rounds: u32,
    pub pattern: Pattern,
    pub compressor: String,
    split_swap: bool,
    swapin_enabled: String,
    fault_mode: String,
    /// The engine's userfaultfd: "full", or "user-mode-only" (an ordinary user).
    uffd: String,
    /// "move" (UFFDIO_MOVE) or "copy" (UFFDIO_COPY: kernels before 6.8, or FOLIOSWAP_UFFD_MOVE=0).
    install: String,
    lru: String,
    max_pool: String,
    charge_pool: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap_file: Option<String>,
}

fn build_config(args: &UsememArgs) -> folioswap::Result<Config> {
    let mut c = Config::from_env()?.memory_high(&args.limit)?;
    if let Some(f) = &args.folio {
        c = c.folio_size(f)?;
    }
    if let Some(comp) = &args.compressor {
        c = c.compressor(comp)?;
    }
    if let Some(p) = &args.max_pool {
        c = c.max_pool(p)?;
    }
    if let Some(m) = &args.fault_mode {
        c = c.set("FOLIOSWAP_FAULT_MODE", m)?;
    }
    if let Some(l) = &args.lru {
        c = c.set("FOLIOSWAP_LRU", l)?;
    }
    if let Some(n) = args.reclaim_threads {
        c = c.reclaim_threads(n);
    }
    if let Some(n) = args.fault_threads {
        c = c.fault_threads(n);
    }
    if args.split {
        c = c.split_swap(true);
    }
    if let Some(p) = &args.swapin {
        c = c.set("FOLIOSWAP_SWAPIN_ENABLED", p)?;
    }
    if args.charge_pool {
        c = c.charge_pool(true);
    }
    if let Some(f) = &args.swap_file {
        c = c.set("FOLIOSWAP_SWAP_FILE", f)?;
    }
    if let Some(r) = &args.remote_tier {
        c = c.set("FOLIOSWAP_REMOTE_TIER", r)?;
    }
    if args.encrypt {
        c = c.encrypt(true);
    }
    if let Some(t) = &args.accept_threshold {
        c = c.accept_threshold_percent(t)?;
    }
    if let Some(r) = &args.min_compression_ratio {
        c = c.min_compression_ratio(r)?;
    }
    Ok(c)
}

/// A region seen as words (regions are page aligned, so there is no unaligned prefix).
fn words(region: &Region) -> &[u64] {
    // SAFETY: any bytes are valid u64s; align_to only reinterprets.
    let (head, words, _) = unsafe { region.as_slice().align_to::<u64>() };
    debug_assert!(head.is_empty());
    words
}

fn words_mut(region: &mut Region) -> &mut [u64] {
    // SAFETY: as above.
    let (head, words, _) = unsafe { region.as_mut_slice().align_to_mut::<u64>() };
    debug_assert!(head.is_empty());
    words
}

const CHUNK: usize = 1 << 15;

/// One worker's view of its region while writing.
struct Writer<'a> {
    words: &'a mut [u64],
    worker: u64,
    progress: &'a AtomicU64,
}

impl Writer<'_> {
    fn seq(&mut self, round: u64) {
        self.range(0, self.words.len(), round);
    }

    /// Write words `[from, to)` in order; returns how many.
    fn range(&mut self, from: usize, to: usize, round: u64) -> u64 {
        for (c, chunk) in self.words[from..to].chunks_mut(CHUNK).enumerate() {
            let base = (from + c * CHUNK) as u64;
            for (i, w) in chunk.iter_mut().enumerate() {
                *w = value(self.worker, base + i as u64, round);
            }
            self.progress.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
        (to - from) as u64
    }

    /// The cold part in 16 chunks, the hot part (the first `hot` words) after each.
    fn hotcold(&mut self, hot: usize, round: u64) -> u64 {
        let n = self.words.len();
        let chunk = (n - hot).div_ceil(16);
        let mut written = 0;
        let mut at = hot;
        while at < n {
            let end = (at + chunk).min(n);
            written += self.range(at, end, round);
            written += self.range(0, hot, round);
            at = end;
        }
        written
    }

    /// `target` writes at the permutation's positions from `*pos` on, or until `deadline`.
    fn rand(&mut self, perm: &Permutation, pos: &mut u64, target: u64, deadline: Instant, round: u64) {
        let n = self.words.len() as u64;
        let end = *pos + target;
        while *pos < end {
            let batch = (end - *pos).min(256);
            for _ in 0..batch {
                let j = perm.apply(*pos % n);
                self.words[j as usize] = value(self.worker, j, round);
                *pos += 1;
            }
            self.progress.fetch_add(batch, Ordering::Relaxed);
            if Instant::now() >= deadline {
                break;
            }
        }
    }
}

/// What word `j` must hold after a random run that ended at `total` writes.
fn expected_rand(perm: &Permutation, bounds: &[u64], n: u64, worker: u64, j: u64) -> u64 {
    let total = *bounds.last().unwrap_or(&0);
    let q = perm.invert(j);
    if q >= total {
        return 0;
    }
    let last = q + n * ((total - 1 - q) / n);
    let round = bounds.iter().position(|&b| last < b).unwrap_or(bounds.len() - 1);
    value(worker, j, round as u64)
}

fn verify(words: &[u64], worker: usize, pattern: Pattern, w: &Worker, rounds: u32, bad: &mut Vec<Mismatch>) -> (u64, u64) {
    let n = words.len() as u64;
    let perm = Permutation::new(n, worker as u64 + 1);
    let mut mismatches = 0;
    for (j, &found) in words.iter().enumerate() {
        let j = j as u64;
        let expected = match pattern {
            Pattern::Seq | Pattern::Hotcold => value(worker as u64, j, rounds as u64 - 1),
            Pattern::Rand => expected_rand(&perm, &w.bounds, n, worker as u64, j),
        };
        if found != expected {
            mismatches += 1;
            if bad.len() < 8 {
                bad.push(Mismatch { worker, word: j, expected: format!("{expected:#x}"), found: format!("{found:#x}") });
            }
        }
    }
    (n, mismatches)
}

/// User plus system CPU time of this process so far.
fn process_cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given and nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above, with a live, writable struct.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// The workload's shape: the same whatever memory it runs on.
pub(crate) struct Workload {
    pattern: Pattern,
    rounds: u32,
    hot_words: usize,
    writes_per_round: u64,
    round_time: Duration,
}

impl Workload {
    pub(crate) fn new(args: &UsememArgs, words_per_region: u64) -> Result<Workload, String> {
        if !(0.0..1.0).contains(&args.hot_fraction) {
            return Err("--hot-fraction must be at least 0 and below 1".into());
        }
        let hot_words = ((words_per_region as f64 * args.hot_fraction) as usize) & !511;
        let writes_per_round = match args.pattern {
            Pattern::Seq => words_per_region,
            Pattern::Rand => args.writes.unwrap_or(words_per_region),
            Pattern::Hotcold => words_per_region + 15 * hot_words as u64,
        };
        Ok(Workload {
            pattern: args.pattern,
            rounds: args.rounds,
            hot_words,
            writes_per_round,
            round_time: Duration::from_secs_f64(args.round_time),
        })
    }
}

/// What the rounds did: where each worker's rounds ended, and their times.
pub(crate) struct Rounds {
    workers: Vec<Worker>,
    wall: f64,
    cpu_s: f64,
    round_s: Vec<f64>,
}

/// The rounds, one worker thread per memory (each `memories[t]` is worker t's words):
/// the one code path for engine regions and plain memory alike.
pub(crate) fn write_rounds(memories: Vec<&mut [u64]>, w: &Workload) -> Rounds {
    let threads = memories.len();
    let progress: Vec<AtomicU64> = (0..threads).map(|_| AtomicU64::new(0)).collect();
    let barrier = Barrier::new(threads + 1);
    let round_ends: Vec<Vec<AtomicU64>> = (0..threads).map(|_| (0..w.rounds).map(|_| AtomicU64::new(0)).collect()).collect();
    let done = AtomicBool::new(false);
    let bar = crate::progress::bar(threads as u64 * w.rounds as u64 * w.writes_per_round, "usemem");

    let mut cpu_at_start = 0.0;
    let mut wall = 0.0;
    let workers: Vec<Worker> = std::thread::scope(|scope| {
        let handles: Vec<_> = memories
            .into_iter()
            .enumerate()
            .map(|(t, words)| {
                let (progress, barrier, round_ends) = (&progress, &barrier, &round_ends);
                scope.spawn(move || {
                    let mut writer = Writer { words, worker: t as u64, progress: &progress[t] };
                    let n = writer.words.len() as u64;
                    let perm = Permutation::new(n, t as u64 + 1);
                    let mut pos = 0u64;
                    let mut bounds = Vec::new();
                    barrier.wait();
                    let t0 = Instant::now();
                    for r in 0..w.rounds as u64 {
                        match w.pattern {
                            Pattern::Seq => {
                                writer.seq(r);
                                pos += n;
                            }
                            Pattern::Hotcold => pos += writer.hotcold(w.hot_words, r),
                            Pattern::Rand => {
                                let deadline = Instant::now() + w.round_time;
                                writer.rand(&perm, &mut pos, w.writes_per_round, deadline, r);
                            }
                        }
                        bounds.push(pos);
                        round_ends[t][r as usize].store(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    }
                    Worker { bounds }
                })
            })
            .collect();
        let monitor = scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                bar.set_position(progress.iter().map(|p| p.load(Ordering::Relaxed)).sum());
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        cpu_at_start = process_cpu_seconds();
        barrier.wait();
        let t0 = Instant::now();
        let workers: Vec<Worker> = handles.into_iter().map(|h| h.join().expect("worker panicked")).collect();
        wall = t0.elapsed().as_secs_f64();
        done.store(true, Ordering::Relaxed);
        monitor.join().unwrap();
        workers
    });
    let cpu_s = process_cpu_seconds() - cpu_at_start;
    bar.finish_and_clear();
    let round_s: Vec<f64> = (0..w.rounds as usize)
        .map(|r| round_ends.iter().map(|ends| ends[r].load(Ordering::Relaxed)).max().unwrap_or(0) as f64 / 1e9)
        .collect();
    Rounds { workers, wall, cpu_s, round_s }
}

/// Verify every word (`memories[t]` as worker t left it), then sum up the run.
pub(crate) fn verify_rounds(memories: Vec<&[u64]>, w: &Workload, rounds: Rounds, anon_huge_bytes: u64, resident_bytes: u64) -> Outcome {
    let vbar = crate::progress::bar(memories.len() as u64, "verify");
    let results: Vec<(u64, u64, Vec<Mismatch>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = memories
            .into_iter()
            .zip(&rounds.workers)
            .enumerate()
            .map(|(t, (words, worker))| {
                let vbar = &vbar;
                scope.spawn(move || {
                    let mut bad = Vec::new();
                    let (n, m) = verify(words, t, w.pattern, worker, w.rounds, &mut bad);
                    vbar.inc(1);
                    (n, m, bad)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("verifier panicked")).collect()
    });
    vbar.finish_and_clear();
    let words_verified: u64 = results.iter().map(|r| r.0).sum();
    let mismatches: u64 = results.iter().map(|r| r.1).sum();
    let first_mismatches: Vec<Mismatch> = results.into_iter().flat_map(|r| r.2).take(8).collect();
    let writes: u64 = rounds.workers.iter().map(|w| *w.bounds.last().unwrap_or(&0)).sum();
    let bytes_written = writes * 8;
    let wall = rounds.wall;
    let ncpu = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as f64;
    Outcome {
        throughput_mb_s: bytes_written as f64 / wall / 1e6,
        wall_s: wall,
        verified: mismatches == 0,
        bytes_written,
        writes,
        writes_per_s: (w.pattern == Pattern::Rand).then(|| writes as f64 / wall),
        words_verified,
        mismatches,
        first_mismatches,
        anon_huge_bytes,
        resident_bytes,
        anon_huge_pct_of_resident: if resident_bytes > 0 { 100.0 * anon_huge_bytes as f64 / resident_bytes as f64 } else { 0.0 },
        round_s: rounds.round_s,
        cpu_s: rounds.cpu_s,
        cpu_utilization_pct: 100.0 * rounds.cpu_s / (wall * ncpu),
    }
}

/// The arguments make a workload at all (whichever memory it then runs on).
pub(crate) fn check_args(args: &UsememArgs) -> Result<(), String> {
    if args.threads == 0 || args.rounds == 0 || args.size < 8 {
        return Err("--threads, --rounds and --size must be positive".into());
    }
    Ok(())
}

/// The workload under the engine, printed as a table or JSON (`--against` and
/// `--plain-memory` are `kernel_swap.rs`'s).
pub fn run(args: &UsememArgs) -> Result<bool, String> {
    let report = run_engine(args)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?);
    } else {
        print_table(&report);
    }
    Ok(report.outcome.verified)
}

/// The workload in engine regions.
pub(crate) fn run_engine(args: &UsememArgs) -> Result<Report, String> {
    let config = build_config(args).map_err(|e| e.to_string())?;
    let engine = Engine::new(config.clone()).map_err(|e| e.to_string())?;
    let folio = args.folio.as_deref().map(|f| f.parse::<FolioSize>().unwrap()).unwrap_or(config.folio_size);
    let mut regions: Vec<Region> = (0..args.threads)
        .map(|_| engine.map(args.size as usize, RegionOptions::default().folio(folio)))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let workload = Workload::new(args, regions[0].len() as u64 / 8)?;
    let rounds = write_rounds(regions.iter_mut().map(words_mut).collect(), &workload);

    let stats = engine.stats();
    let anon_huge: u64 = regions.iter().map(|r| r.anon_huge_bytes().unwrap_or(0)).sum();
    let resident = stats.memory.resident_bytes;
    let outcome = verify_rounds(regions.iter().map(words).collect(), &workload, rounds, anon_huge, resident);
    Ok(Report {
        outcome,
        pool_bytes: stats.memory.pool_total_bytes,
        config: RunConfig {
            threads: args.threads,
            size: regions[0].len() as u64,
            memory_high: config.memory_high,
            folio: folio.to_string(),
            rounds: args.rounds,
            pattern: args.pattern,
            compressor: config.compressor.to_string(),
            split_swap: config.split_swap,
            swapin_enabled: config.swapin_enabled.to_string(),
            fault_mode: config.fault_mode.to_string(),
            uffd: engine.uffd_mode().to_string(),
            install: engine.install_mode().to_string(),
            lru: config.lru.to_string(),
            max_pool: config.max_pool.to_string(),
            charge_pool: config.charge_pool && stats.swap.is_some(),
            swap_file: stats.swap.as_ref().map(|sw| {
                let at = format!("{}:{}", sw.path.as_deref().unwrap_or("?"), format_bytes(sw.size_bytes));
                let at = if sw.io.encrypted { format!("{at} encrypted") } else { at };
                if let Some(remote) = &sw.io.remote {
                    format!("remote tier {}", remote.nodes)
                } else if sw.on_demand {
                    format!("auto {at}")
                } else {
                    at
                }
            }),
        },
        stats,
    })
}

fn print_table(r: &Report) {
    let c = &r.config;
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1 << 20) as f64);
    println!(
        "usemem: {} threads x {}, memory_high {}, folio {}, {}, swap-in {}, {:?}, {} rounds, {}, fault mode {}, uffd {} ({}), lru {}",
        c.threads,
        format_bytes(c.size),
        c.memory_high.map(format_bytes).unwrap_or_else(|| "max".into()),
        c.folio,
        if c.split_swap { "split swap (4K pages)" } else { "whole-folio swap" },
        c.swapin_enabled,
        c.pattern,
        c.rounds,
        c.compressor,
        c.fault_mode,
        c.uffd,
        c.install,
        c.lru
    );
    let mbs = if r.outcome.throughput_mb_s >= 10.0 {
        format!("{:.1}", r.outcome.throughput_mb_s)
    } else {
        format!("{:.3}", r.outcome.throughput_mb_s)
    };
    println!("  throughput   {:>10} MB/s  ({} written in {:.2} s)", mbs, format_bytes(r.outcome.bytes_written), r.outcome.wall_s);
    if let Some(w) = r.outcome.writes_per_s {
        println!("  writes       {:>10.0} /s", w);
    }
    println!("  rounds       {}", r.outcome.round_s.iter().map(|s| format!("{s:.2}s")).collect::<Vec<_>>().join(" "));
    println!("  cpu          {:.2} s ({:.0}% of all CPUs during the rounds)", r.outcome.cpu_s, r.outcome.cpu_utilization_pct);
    println!(
        "  verified     {}  ({} words, {} mismatches)",
        if r.outcome.verified { "yes" } else { "NO" },
        r.outcome.words_verified,
        r.outcome.mismatches
    );
    for m in &r.outcome.first_mismatches {
        println!("    worker {} word {}: expected {} found {}", m.worker, m.word, m.expected, m.found);
    }
    println!(
        "  resident     {}  AnonHugePages {} ({:.1}% of resident)",
        mib(r.outcome.resident_bytes),
        mib(r.outcome.anon_huge_bytes),
        r.outcome.anon_huge_pct_of_resident
    );
    let m = &r.stats.memory;
    println!(
        "  pool         {} holding {} of folios ({} compressed, {} entries)",
        mib(m.pool_total_bytes),
        mib(m.pool_stored_bytes),
        mib(m.pool_compressed_bytes),
        m.pool_entries
    );
    if let (Some(sw), Some(file)) = (&r.stats.swap, &c.swap_file) {
        let lat =
            |l: &Option<folioswap::Latency>| l.as_ref().map(|l| format!("p50 {:.0}us p99 {:.0}us", l.p50_us, l.p99_us)).unwrap_or_default();
        println!(
            "  swap file    {} {}: {} of {} slots used ({} bad), {} written ({}), {} read ({})",
            file,
            match (&sw.io.remote, sw.direct_io) {
                (Some(_), _) => "sealed",
                (None, true) => "O_DIRECT",
                (None, false) => "buffered",
            },
            sw.slots_used,
            sw.slots_total,
            sw.slots_bad,
            mib(sw.io.bytes_written),
            lat(&sw.io.write_latency),
            mib(sw.io.bytes_read),
            lat(&sw.io.read_latency)
        );
        if let Some(t) = &sw.io.remote {
            println!(
                "  remote       {} masters, WAIT {}: {} keys ({}) live, {} deleted; remote_swpout {} remote_swpin {} remote_errors {}",
                t.masters,
                t.wait_replicas,
                t.keys,
                mib(t.bytes),
                t.keys_deleted,
                t.remote_swpout,
                t.remote_swpin,
                t.remote_errors
            );
            for (what, by_size) in [("fetch", &t.fetch_latency), ("store", &t.store_latency)] {
                for (size, l) in by_size {
                    println!(
                        "  {what} {size:>5} n={} mean {:.1}us p50 {:.1}us p90 {:.1}us p99 {:.1}us max {:.1}us",
                        l.count, l.mean_us, l.p50_us, l.p90_us, l.p99_us, l.max_us
                    );
                }
            }
        }
        let v = &r.stats.vm;
        println!(
            "               zswpwb {} thp_swpout {} thp_swpout_fallback {} reject_compress_poor {} write_error {} read_error {}",
            v.zswpwb, v.thp_swpout, v.thp_swpout_fallback, v.zswap_reject_compress_poor, v.swap_write_error, v.swap_read_error
        );
    }
    let v = &r.stats.vm;
    println!(
        "  vmstat       pgfault {} pgmajfault {} zswpout {} zswpin {} pswpout {} pswpin {} thp_swpout_fallback {} thp_split_page {}",
        v.pgfault, v.pgmajfault, v.zswpout, v.zswpin, v.pswpout, v.pswpin, v.thp_swpout_fallback, v.thp_split_page
    );
    println!(
        "               pgsteal_kswapd {} pgsteal_direct {} pgsteal_cluster {} allocstall {} zswap_pool_limit_hit {} same_filled {} fault_raced {}",
        v.pgsteal_kswapd, v.pgsteal_direct, v.pgsteal_cluster, v.allocstall, v.zswap_pool_limit_hit, v.zswap_same_filled, v.fault_raced
    );
    println!(
        "               workingset_refault_anon {} workingset_activate_anon {} swapcache_hit {} staging_reused {} staging_populated {}",
        v.workingset_refault_anon, v.workingset_activate_anon, v.swapcache_hit, v.staging_reused, v.staging_populated
    );
    for (size, s) in &r.stats.per_size {
        println!(
            "  {:>7}      anon_fault_alloc {} anon_fault_fallback {} zswpout {} zswpin {} swpout {} swpin {} swpout_fallback {} split {}",
            size, s.anon_fault_alloc, s.anon_fault_fallback, s.zswpout, s.zswpin, s.swpout, s.swpin, s.swpout_fallback, s.split
        );
    }
    for (size, l) in &r.stats.fault_latency {
        println!(
            "  latency {:>7} n={} mean {:.1}us p50 {:.1}us p90 {:.1}us p99 {:.1}us p99.9 {:.1}us max {:.1}us",
            size, l.count, l.mean_us, l.p50_us, l.p90_us, l.p99_us, l.p999_us, l.max_us
        );
    }
}
