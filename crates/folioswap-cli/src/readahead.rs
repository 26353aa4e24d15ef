//! `folioswap bench readahead`: seed 002's combined workload, one mode after another.
//!
//! Per mode, a fresh engine under `--limit` maps SEQ (larger than the limit, one region per
//! sequential thread, as usemem's processes each map their own) and RAND. Phase 1, not
//! measured, fills both once, which swaps most of them out. Phase 2 runs for `--duration`
//! seconds: sequential threads each walk their SEQ region in rounds,
//! folio by folio in address order (or along `--stride`), timing their first access to each
//! folio (the one that faults), then checking the folio still holds the previous round's
//! pattern and writing this round's; beside them random threads rewrite random 4 KiB pages
//! of RAND that they own, checking each page's previous version first. So every byte
//! written is verified on its next visit. Modes differ only in the readahead knobs.

use crate::pattern::value;
use folioswap::{format_bytes, Config, Engine, FolioSize, Region, RegionOptions, RegionReadahead, Stats};
use serde::ser::SerializeMap;
use serde::Serialize;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

const PAGE: usize = 4096;
const PAGE_WORDS: usize = PAGE / 8;
/// The `worker` argument of `pattern::value` per region, so that the two never read alike.
const SEQ_ID: u64 = 0;
const RAND_ID: u64 = 1;
const PERCENTILES: [u32; 7] = [50, 60, 70, 80, 90, 95, 99];

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Sequential and random threads together.
    Combined,
    /// The random threads alone.
    Random,
    /// The sequential threads alone.
    Sequential,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Readahead by virtual address.
    Vma,
    /// Readahead in swap-slot (eviction) order.
    Cluster,
    /// No readahead (page_cluster 0).
    Off,
    /// VMA readahead with stride detection.
    Stride,
    /// VMA readahead on the faulting thread (ra_async off).
    VmaSync,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Vma => "vma",
            Mode::Cluster => "cluster",
            Mode::Off => "off",
            Mode::Stride => "stride",
            Mode::VmaSync => "vma-sync",
        }
    }

    /// Every readahead knob, so that FOLIOSWAP_* variables cannot blur the modes.
    fn configure(self, c: Config, page_cluster: u32) -> folioswap::Result<Config> {
        let (vma, cluster, stride, asynchronous) = match self {
            Mode::Vma => (true, page_cluster, false, true),
            Mode::Cluster => (false, page_cluster, false, true),
            Mode::Off => (true, 0, false, true),
            Mode::Stride => (true, page_cluster, true, true),
            Mode::VmaSync => (true, page_cluster, false, false),
        };
        Ok(c.vma_ra_enabled(vma).page_cluster(cluster)?.ra_stride(stride).ra_async(asynchronous))
    }
}

#[derive(clap::Args, Debug)]
pub struct ReadaheadArgs {
    /// memory_high for the engine (e.g. 256M).
    #[arg(long, default_value = "256M")]
    limit: String,
    /// The region the sequential threads walk; it should exceed --limit.
    #[arg(long, default_value = "768M", value_parser = parse_size)]
    seq_size: u64,
    /// The region the random threads write.
    #[arg(long, default_value = "384M", value_parser = parse_size)]
    rand_size: u64,
    /// Sequential threads, each owning a contiguous share of the sequential region.
    #[arg(long, default_value_t = 2)]
    seq_threads: usize,
    /// Random threads, thread t owning the random region's pages t, t+T, t+2T …
    #[arg(long, default_value_t = 2)]
    rand_threads: usize,
    /// Seconds measured per mode (after the fill).
    #[arg(long, default_value_t = 15.0)]
    duration: f64,
    /// Folio size of both regions: 4K … 2M.
    #[arg(long, default_value = "4K")]
    folio: String,
    /// lz4, zstd, zstd:LEVEL or none.
    #[arg(long, default_value = "lz4")]
    compressor: String,
    /// Readahead window cap of every mode but off: 2^N folios, N from 0 to 9.
    #[arg(long, default_value_t = 3)]
    page_cluster: u32,
    /// Sequential rounds visit folios k, k+K, k+2K … for each start k in 0..K (K = stride).
    #[arg(long, default_value_t = 1)]
    stride: usize,
    /// Comma-separated: vma, cluster (slot order), off, stride (vma + stride detection),
    /// vma-sync (vma with ra_async off).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "vma,cluster,off")]
    modes: Vec<Mode>,
    /// Which threads run.
    #[arg(long, value_enum, default_value_t = Workload::Combined)]
    workload: Workload,
    /// A swap file behind the pool: PATH:SIZE, a file to create or a directory
    /// (default: FOLIOSWAP_SWAP_FILE, or none). `--max-pool 0` then turns the pool off.
    #[arg(long)]
    swap_file: Option<String>,
    /// Cap of the compressed pool (size or percentage of RAM).
    #[arg(long)]
    max_pool: Option<String>,
    /// thread or signal.
    #[arg(long)]
    fault_mode: Option<String>,
    /// Print one JSON object keyed by mode instead of the table (the configuration goes to stderr).
    #[arg(long)]
    json: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    folioswap::parse_bytes(s).map_err(|e| e.to_string())
}

#[derive(Serialize)]
struct Mismatch {
    region: &'static str,
    /// Byte offset in the region of the first bad word.
    offset: u64,
    expected: String,
    found: String,
}

/// What one worker thread did in phase 2.
#[derive(Default)]
struct Done {
    bytes: u64,
    /// Folios (sequential) or pages (random) rewritten.
    visits: u64,
    /// Whole rounds completed (sequential).
    rounds: u64,
    /// First-touch latency of every folio visited (sequential), ns.
    lat_ns: Vec<u64>,
    mismatches: u64,
    bad: Vec<Mismatch>,
}

impl Done {
    /// Check that `words` (starting at word `start` of region `id`) hold round `old`, and write `new`.
    fn check_and_write(&mut self, words: &mut [u64], id: u64, start: usize, old: u64, new: u64) {
        for (i, w) in words.iter_mut().enumerate() {
            let j = (start + i) as u64;
            let expected = value(id, j, old);
            if *w != expected {
                self.mismatches += 1;
                if self.bad.len() < 4 {
                    let region = if id == SEQ_ID { "seq" } else { "rand" };
                    self.bad.push(Mismatch { region, offset: j * 8, expected: format!("{expected:#x}"), found: format!("{w:#x}") });
                }
            }
            *w = value(id, j, new);
        }
    }
}

struct Ctx<'a> {
    barrier: &'a Barrier,
    stop: &'a AtomicBool,
    folio_words: usize,
    stride: usize,
}

/// One round's folio order: k, k+K, k+2K … for each start k in 0..K; each folio once.
fn visit_order(folios: usize, stride: usize) -> impl Iterator<Item = usize> {
    (0..stride.min(folios)).flat_map(move |k| (k..folios).step_by(stride))
}

fn seq_worker(region: &Region, folios: Range<usize>, ctx: &Ctx) -> Done {
    let fw = ctx.folio_words;
    let base = region.as_ptr() as *mut u64;
    let mut done = Done { lat_ns: Vec::with_capacity(folios.len()), ..Done::default() };
    let folio = |f: usize| base.wrapping_add((folios.start + f) * fw);
    for f in 0..folios.len() {
        // SAFETY: folio f lies inside the region, which outlives this thread; regions are
        // page aligned, so the words are aligned; any bytes are valid u64s; and this thread
        // is the only one touching its share of the region.
        let words = unsafe { std::slice::from_raw_parts_mut(folio(f), fw) };
        for (i, w) in words.iter_mut().enumerate() {
            *w = value(SEQ_ID, ((folios.start + f) * fw + i) as u64, 0);
        }
    }
    ctx.barrier.wait();
    'run: for round in 1u64.. {
        for f in visit_order(folios.len(), ctx.stride) {
            if ctx.stop.load(Ordering::Relaxed) {
                break 'run;
            }
            let t = Instant::now();
            // SAFETY: as above; this read is the access that faults the folio in.
            let _ = unsafe { std::ptr::read_volatile(folio(f)) };
            done.lat_ns.push(t.elapsed().as_nanos() as u64);
            // SAFETY: as above.
            let words = unsafe { std::slice::from_raw_parts_mut(folio(f), fw) };
            done.check_and_write(words, SEQ_ID, (folios.start + f) * fw, round - 1, round);
            done.bytes += (fw * 8) as u64;
            done.visits += 1;
        }
        done.rounds = round;
    }
    done
}

/// xorshift64, seeded per thread (the same seeds in every mode).
struct XorShift(u64);

impl XorShift {
    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

fn rand_worker(region: &Region, t: usize, threads: usize, ctx: &Ctx) -> Done {
    let owned = (region.len() / PAGE - t).div_ceil(threads);
    let base = region.as_ptr() as *mut u64;
    let page_words = |k: usize| {
        let at = (t + k * threads) * PAGE_WORDS;
        // SAFETY: page t + k·threads lies inside the region, which outlives this thread;
        // pages are aligned; any bytes are valid u64s; only thread t owns this page.
        (at, unsafe { std::slice::from_raw_parts_mut(base.wrapping_add(at), PAGE_WORDS) })
    };
    let mut version = vec![0u32; owned];
    for k in 0..owned {
        let (at, words) = page_words(k);
        for (i, w) in words.iter_mut().enumerate() {
            *w = value(RAND_ID, (at + i) as u64, 0);
        }
    }
    let mut rng = XorShift((t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut done = Done::default();
    ctx.barrier.wait();
    while !ctx.stop.load(Ordering::Relaxed) {
        let k = (rng.next_u64() % owned as u64) as usize;
        let (at, words) = page_words(k);
        let v = version[k] as u64;
        done.check_and_write(words, RAND_ID, at, v, v + 1);
        version[k] += 1;
        done.bytes += PAGE as u64;
        done.visits += 1;
    }
    done
}

/// Nearest rank: the smallest sample with at least `p` percent of them at or below it.
fn percentile(sorted: &[u64], p: u32) -> Option<u64> {
    let rank = (p as usize * sorted.len()).div_ceil(100).max(1);
    sorted.get(rank - 1).copied()
}

#[derive(Serialize)]
struct LatencyUs {
    avg: f64,
    p50: f64,
    p60: f64,
    p70: f64,
    p80: f64,
    p90: f64,
    p95: f64,
    p99: f64,
}

impl LatencyUs {
    fn from_samples(mut ns: Vec<u64>) -> Option<LatencyUs> {
        ns.sort_unstable();
        let avg = ns.iter().sum::<u64>() as f64 / ns.len() as f64 / 1e3;
        let p = PERCENTILES.map(|p| percentile(&ns, p).map(|v| v as f64 / 1e3));
        let [p50, p60, p70, p80, p90, p95, p99] = p;
        Some(LatencyUs { avg, p50: p50?, p60: p60?, p70: p70?, p80: p80?, p90: p90?, p95: p95?, p99: p99? })
    }

    const ROWS: [&'static str; 8] =
        ["latency.average", "latency.50th", "latency.60th", "latency.70th", "latency.80th", "latency.90th", "latency.95th", "latency.99th"];

    fn values(&self) -> [f64; 8] {
        [self.avg, self.p50, self.p60, self.p70, self.p80, self.p90, self.p95, self.p99]
    }
}

#[derive(Serialize)]
struct ModeReport {
    /// Sequential bytes written over the measured seconds (null without sequential threads).
    throughput_mb_s: Option<f64>,
    /// SEQ's swap_ra_hit / swap_ra in percent (null when nothing was read ahead).
    ra_hit_pct: Option<f64>,
    swap_ra: u64,
    swap_ra_hit: u64,
    swap_ra_waste: u64,
    rand_writes_per_s: Option<f64>,
    verified: bool,
    latency_us: Option<LatencyUs>,
    latency_samples: usize,
    seq_bytes: u64,
    seq_rounds_completed: u64,
    rand_writes: u64,
    major_faults: u64,
    fill_s: f64,
    measured_s: f64,
    mismatches: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    first_mismatches: Vec<Mismatch>,
    /// SEQ's readahead (null without sequential threads), then RAND's.
    region: Option<RegionReadahead>,
    rand_region: Option<RegionReadahead>,
    stats: Stats,
}

/// The modes as one JSON object, in the order they ran.
struct ByMode<'a>(&'a [(Mode, ModeReport)]);

impl Serialize for ByMode<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (mode, report) in self.0 {
            map.serialize_entry(mode.name(), report)?;
        }
        map.end()
    }
}

fn base_config(args: &ReadaheadArgs) -> folioswap::Result<Config> {
    let mut c = Config::from_env()?.memory_high(&args.limit)?.folio_size(&args.folio)?.compressor(&args.compressor)?;
    if let Some(p) = &args.max_pool {
        c = c.max_pool(p)?;
    }
    if let Some(m) = &args.fault_mode {
        c = c.set("FOLIOSWAP_FAULT_MODE", m)?;
    }
    if let Some(f) = &args.swap_file {
        c = c.set("FOLIOSWAP_SWAP_FILE", f)?;
    }
    Ok(c)
}

fn run_mode(args: &ReadaheadArgs, mode: Mode, config: Config) -> Result<ModeReport, String> {
    let folio: FolioSize = config.folio_size;
    let engine = Engine::new(config).map_err(|e| e.to_string())?;
    let map = |on: bool, size: u64| -> Result<Option<Region>, String> {
        on.then(|| engine.map(size as usize, RegionOptions::default().folio(folio))).transpose().map_err(|e| e.to_string())
    };
    // One SEQ region per sequential thread, as usemem's processes each map their own:
    // readahead state is per region (per VMA), and one stream per VMA is what the seed ran.
    let seq: Vec<Region> = if args.workload != Workload::Random {
        let each = (args.seq_size / args.seq_threads as u64).next_multiple_of(folio.bytes() as u64);
        (0..args.seq_threads).map(|_| map(true, each).map(|r| r.expect("mapped"))).collect::<Result<_, _>>()?
    } else {
        Vec::new()
    };
    let rand = map(args.workload != Workload::Sequential, args.rand_size)?;
    let seq_threads = seq.len();
    let rand_threads = if rand.is_some() { args.rand_threads } else { 0 };
    let (barrier, stop) = (Barrier::new(seq_threads + rand_threads + 1), AtomicBool::new(false));
    let ctx = &Ctx { barrier: &barrier, stop: &stop, folio_words: folio.bytes() / 8, stride: args.stride };
    let duration = Duration::from_secs_f64(args.duration);
    eprintln!("readahead [{}]: filling, then measuring for {} s", mode.name(), args.duration);
    let fill_start = Instant::now();
    let (seq_done, rand_done, fill, measured) = std::thread::scope(|s| {
        let seq_handles: Vec<_> = seq.iter().map(|r| s.spawn(move || seq_worker(r, 0..r.len() / folio.bytes(), ctx))).collect();
        let rand_handles: Vec<_> = rand
            .iter()
            .flat_map(|r| (0..rand_threads).map(move |t| (r, t)))
            .map(|(r, t)| s.spawn(move || rand_worker(r, t, rand_threads, ctx)))
            .collect();
        barrier.wait();
        let fill = fill_start.elapsed();
        let bar = crate::progress::bar(duration.as_millis() as u64, mode.name());
        let t0 = Instant::now();
        while let Some(left) = duration.checked_sub(t0.elapsed()).filter(|d| !d.is_zero()) {
            bar.set_position(t0.elapsed().as_millis() as u64);
            std::thread::sleep(left.min(Duration::from_millis(100)));
        }
        stop.store(true, Ordering::Relaxed);
        let join = |h: Vec<std::thread::ScopedJoinHandle<Done>>| -> Vec<Done> {
            h.into_iter().map(|h| h.join().expect("worker panicked")).collect()
        };
        let (seq_done, rand_done) = (join(seq_handles), join(rand_handles));
        let measured = t0.elapsed().as_secs_f64();
        bar.finish_and_clear();
        (seq_done, rand_done, fill, measured)
    });
    let stats = engine.stats();
    let region = (!seq.is_empty()).then(|| {
        seq.iter().map(|r| r.readahead_stats()).fold(RegionReadahead::default(), |a, b| RegionReadahead {
            swap_ra: a.swap_ra + b.swap_ra,
            swap_ra_hit: a.swap_ra_hit + b.swap_ra_hit,
            swap_ra_waste: a.swap_ra_waste + b.swap_ra_waste,
            window: a.window.max(b.window),
            stride: if a.stride != 0 { a.stride } else { b.stride },
        })
    });
    let rand_region = rand.as_ref().map(|r| r.readahead_stats());
    drop((seq, rand, engine));

    let sum = |d: &[Done], f: fn(&Done) -> u64| d.iter().map(f).sum::<u64>();
    let seq_bytes = sum(&seq_done, |d| d.bytes);
    let rand_writes = sum(&rand_done, |d| d.visits);
    let mismatches = sum(&seq_done, |d| d.mismatches) + sum(&rand_done, |d| d.mismatches);
    let mut all: Vec<Done> = seq_done.into_iter().chain(rand_done).collect();
    let seq_rounds_completed = all[..seq_threads].iter().map(|d| d.rounds).min().unwrap_or(0);
    let lat_ns: Vec<u64> = all.iter_mut().flat_map(|d| std::mem::take(&mut d.lat_ns)).collect();
    let ra = region.clone().unwrap_or_default();
    let report = ModeReport {
        throughput_mb_s: (seq_threads > 0).then(|| seq_bytes as f64 / measured / 1e6),
        ra_hit_pct: (ra.swap_ra > 0).then(|| 100.0 * ra.swap_ra_hit as f64 / ra.swap_ra as f64),
        swap_ra: ra.swap_ra,
        swap_ra_hit: ra.swap_ra_hit,
        swap_ra_waste: ra.swap_ra_waste,
        rand_writes_per_s: (rand_threads > 0).then(|| rand_writes as f64 / measured),
        verified: mismatches == 0,
        latency_samples: lat_ns.len(),
        latency_us: LatencyUs::from_samples(lat_ns),
        seq_bytes,
        seq_rounds_completed,
        rand_writes,
        major_faults: stats.vm.pgmajfault,
        fill_s: fill.as_secs_f64(),
        measured_s: measured,
        mismatches,
        first_mismatches: all.into_iter().flat_map(|d| d.bad).take(8).collect(),
        region,
        rand_region,
        stats,
    };
    eprintln!(
        "readahead [{}]: filled in {:.1} s; {} MB/s sequential, {} random writes/s, ra hit {}, {} major faults, {}",
        mode.name(),
        report.fill_s,
        report.throughput_mb_s.map_or("-".into(), |t| format!("{t:.1}")),
        report.rand_writes_per_s.map_or("-".into(), |w| format!("{w:.0}")),
        report.ra_hit_pct.map_or("-".into(), |p| format!("{p:.1}%")),
        report.major_faults,
        if report.verified { "verified" } else { "VERIFICATION FAILED" }
    );
    Ok(report)
}

fn validate(args: &ReadaheadArgs, config: &Config) -> Result<(), String> {
    if !(args.duration.is_finite() && args.duration > 0.0) {
        return Err("--duration must be a positive number of seconds".into());
    }
    if args.stride == 0 {
        return Err("--stride must be at least 1".into());
    }
    if let Some(m) = args.modes.iter().enumerate().find_map(|(i, m)| args.modes[..i].contains(m).then_some(m)) {
        return Err(format!("--modes names {} twice", m.name()));
    }
    let folio = config.folio_size.bytes() as u64;
    let limit = config.memory_high;
    if args.workload != Workload::Random {
        if args.seq_threads == 0 || args.seq_size.div_ceil(folio) < args.seq_threads as u64 {
            return Err(format!("--seq-threads must be at least 1 and --seq-size hold a {} folio per thread", config.folio_size));
        }
        if !matches!(limit, Some(l) if args.seq_size > l) {
            eprintln!(
                "readahead: warning: --seq-size {} does not exceed --limit {}: the sequential walk will not swap",
                format_bytes(args.seq_size),
                args.limit
            );
        }
    }
    if args.workload != Workload::Sequential {
        if args.rand_threads == 0 || args.rand_size.div_ceil(PAGE as u64) < args.rand_threads as u64 {
            return Err("--rand-threads must be at least 1 and --rand-size hold a page per thread".into());
        }
        if args.workload == Workload::Random && !matches!(limit, Some(l) if args.rand_size > l) {
            eprintln!(
                "readahead: warning: --rand-size {} does not exceed --limit {}: nothing will swap",
                format_bytes(args.rand_size),
                args.limit
            );
        }
    }
    if args.page_cluster == 0 && args.modes.iter().any(|&m| m != Mode::Off) {
        eprintln!("readahead: warning: --page-cluster 0 turns readahead off in every mode");
    }
    Ok(())
}

pub fn run(args: ReadaheadArgs) -> Result<bool, String> {
    let base = base_config(&args).map_err(|e| e.to_string())?;
    validate(&args, &base)?;
    let configs: Vec<Config> =
        args.modes.iter().map(|m| m.configure(base.clone(), args.page_cluster)).collect::<Result<_, _>>().map_err(|e| e.to_string())?;
    let seq = args.workload != Workload::Random;
    let rand = args.workload != Workload::Sequential;
    let header = format!(
        "readahead: {} workload, limit {}; {}{}; folio {}, {}, page_cluster {}, {} s per mode; fault mode {}, lru {}, max_pool {}, {}",
        format!("{:?}", args.workload).to_lowercase(),
        base.memory_high.map(format_bytes).unwrap_or_else(|| "max".into()),
        if seq {
            format!("SEQ {} x {} threads (stride {})", format_bytes(args.seq_size), args.seq_threads, args.stride)
        } else {
            String::new()
        },
        if rand {
            format!("{}RAND {} x {} threads", if seq { ", " } else { "" }, format_bytes(args.rand_size), args.rand_threads)
        } else {
            String::new()
        },
        base.folio_size,
        base.compressor,
        args.page_cluster,
        args.duration,
        base.fault_mode,
        base.lru,
        base.max_pool,
        base.swap_file.as_ref().map_or("no swap file".into(), |f| format!("swap file {}:{}", f.path.display(), format_bytes(f.size))),
    );
    if args.json {
        eprintln!("{header}");
    } else {
        println!("{header}");
    }
    let mut reports = Vec::new();
    for (&mode, config) in args.modes.iter().zip(configs) {
        reports.push((mode, run_mode(&args, mode, config)?));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&ByMode(&reports)).map_err(|e| e.to_string())?);
    } else {
        print_table(&reports);
    }
    Ok(reports.iter().all(|(_, r)| r.verified))
}

/// `2 us`, `13 us`, `1.34 ms`, and two decimals under a microsecond.
fn format_us(us: f64) -> String {
    if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else if us >= 10.0 {
        format!("{us:.0} us")
    } else if us >= 1.0 {
        format!("{us:.1} us")
    } else {
        format!("{us:.2} us")
    }
}

fn print_table(reports: &[(Mode, ModeReport)]) {
    let row = |label: &str, cell: &dyn Fn(&ModeReport) -> String| {
        let cells: String = reports.iter().map(|(_, r)| format!(" {:>12}", cell(r))).collect();
        println!("{label:<18}{cells}");
    };
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    println!("{:<18}{}", "", reports.iter().map(|(m, _)| format!(" {:>12}", m.name())).collect::<String>());
    row("throughput", &|r| opt(r.throughput_mb_s.map(|t| format!("{t:.1} MB/s"))));
    for (i, label) in LatencyUs::ROWS.iter().enumerate() {
        row(label, &|r| opt(r.latency_us.as_ref().map(|l| format_us(l.values()[i]))));
    }
    row("ra_hit%", &|r| opt(r.ra_hit_pct.map(|p| format!("{p:.1}%"))));
    row("swap_ra", &|r| opt(r.region.as_ref().map(|ra| ra.swap_ra.to_string())));
    row("swap_ra_hit", &|r| opt(r.region.as_ref().map(|ra| ra.swap_ra_hit.to_string())));
    row("swap_ra_waste", &|r| opt(r.region.as_ref().map(|ra| ra.swap_ra_waste.to_string())));
    if reports.iter().any(|(_, r)| r.rand_region.is_some()) {
        row("rand swap_ra", &|r| opt(r.rand_region.as_ref().map(|ra| ra.swap_ra.to_string())));
        row("rand swap_ra_waste", &|r| opt(r.rand_region.as_ref().map(|ra| ra.swap_ra_waste.to_string())));
    }
    row("rand writes/s", &|r| opt(r.rand_writes_per_s.map(|w| format!("{w:.0}"))));
    row("major faults", &|r| r.major_faults.to_string());
    row("verified", &|r| if r.verified { "yes".into() } else { format!("NO ({})", r.mismatches) });
    for (mode, r) in reports {
        for m in &r.first_mismatches {
            println!("  {}: {} offset {:#x}: expected {} found {}", mode.name(), m.region, m.offset, m.expected, m.found);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let s = [15, 20, 35, 40, 50];
        assert_eq!(percentile(&s, 5), Some(15));
        assert_eq!(percentile(&s, 30), Some(20));
        assert_eq!(percentile(&s, 40), Some(20));
        assert_eq!(percentile(&s, 50), Some(35));
        assert_eq!(percentile(&s, 100), Some(50));
        let hundred: Vec<u64> = (1..=100).collect();
        for p in 1..=100 {
            assert_eq!(percentile(&hundred, p), Some(p as u64));
        }
        assert_eq!(percentile(&[7], 99), Some(7));
        assert_eq!(percentile(&[], 50), None);
        let l = LatencyUs::from_samples(vec![3000, 1000, 2000]).unwrap();
        assert_eq!((l.avg, l.p50, l.p99), (2.0, 2.0, 3.0));
        assert!(LatencyUs::from_samples(Vec::new()).is_none());
    }

    #[test]
    fn stride_visits_every_folio_once_per_round() {
        assert_eq!(visit_order(7, 1).collect::<Vec<_>>(), (0..7).collect::<Vec<_>>());
        assert_eq!(visit_order(7, 3).collect::<Vec<_>>(), [0, 3, 6, 1, 4, 2, 5]);
        for n in [0, 1, 2, 5, 64, 1000] {
            for stride in [1, 2, 3, 7, 64, 1500] {
                let mut seen = vec![0u32; n];
                visit_order(n, stride).for_each(|f| seen[f] += 1);
                assert!(seen.iter().all(|&c| c == 1), "n={n} stride={stride}");
            }
        }
    }

    #[test]
    fn a_stale_word_is_reported_once_and_rewritten() {
        let mut words: Vec<u64> = (0..PAGE_WORDS as u64).map(|j| value(RAND_ID, 512 + j, 4)).collect();
        words[7] ^= 1;
        let mut done = Done::default();
        done.check_and_write(&mut words, RAND_ID, 512, 4, 5);
        assert_eq!(done.mismatches, 1);
        assert_eq!((done.bad[0].region, done.bad[0].offset), ("rand", (512 + 7) * 8));
        done.check_and_write(&mut words, RAND_ID, 512, 5, 6);
        assert_eq!(done.mismatches, 1);
    }
}
