//! `folioswap bench slots`: the swap slot allocator under contention (seed 003's scalability).
//!
//! N threads share one simulated swap file. Each first fills its share of half the file with
//! runs (untimed), then loops: allocate a batch of runs, orders cycling through `--order-mix`,
//! then free runs picked at random from its working set until it is back to its share, so the
//! file stays about half full and clusters keep moving between the free, partly used and full
//! lists. A run that gets `None` is split as the engine would split the folio: allocated as 2^k
//! single slots, and counted as a fallback. The figure is allocation and free calls per second
//! over the wall time of the timed loops, the median of `--passes`, each pass on a fresh map;
//! after each pass every slot is freed and the map must be empty again. `--baseline` measures
//! seed 003's "before" (one global lock, no slot caches); `--sweep` measures both allocators for
//! 1..=N threads in one table.

use folioswap::format_bytes;
use folioswap::swapfile::cluster::{GlobalLockMap, SlotAllocator, SlotCache, SwapMap, MAX_ORDER, SLOT_SIZE};
use serde::Serialize;
use std::sync::{Arc, Barrier};
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct SlotsArgs {
    /// Worker threads (default: one per CPU); with --sweep, the largest count.
    #[arg(long)]
    threads: Option<usize>,
    /// Size of the simulated swap file (e.g. 1G).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    size: u64,
    /// Allocation and free calls per thread per pass.
    #[arg(long, default_value_t = 2_000_000)]
    ops: u64,
    /// Orders to allocate, comma-separated, taken in turn (0 = 4 KiB … 4 = 64 KiB … 9 = 2 MiB).
    #[arg(long, default_value = "0")]
    order_mix: String,
    /// Runs allocated per batch before freeing back to the working set.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Timed passes per measurement (the median is reported).
    #[arg(long, default_value_t = 3)]
    passes: usize,
    /// Seed 003's "before": one global lock, no slot caches.
    #[arg(long)]
    baseline: bool,
    /// Both allocators for 1..=threads threads, as one table.
    #[arg(long)]
    sweep: bool,
    /// Print one JSON array instead of the table.
    #[arg(long)]
    json: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    folioswap::parse_bytes(s).map_err(|e| e.to_string())
}

#[derive(Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Allocator {
    /// One mutex over the whole map, no slot caches.
    GlobalLock,
    /// A lock per cluster, per-thread current clusters and slot caches.
    Clusters,
}

impl Allocator {
    fn describe(self) -> &'static str {
        match self {
            Allocator::GlobalLock => "global lock, no slot caches",
            Allocator::Clusters => "cluster locks + slot caches",
        }
    }
}

#[derive(Serialize)]
struct Row {
    allocator: Allocator,
    threads: usize,
    /// Median over the passes.
    ops_per_s: f64,
    passes_ops_per_s: Vec<f64>,
    /// Allocations of order > 0 that found no run and were split (all passes).
    fallbacks: u64,
    /// Single-slot allocations that found nothing (all passes).
    order0_failures: u64,
}

/// What one thread allocates and frees through.
enum Front {
    Clusters(SlotCache),
    GlobalLock(Arc<GlobalLockMap>),
}

impl Front {
    fn alloc(&mut self, order: u32) -> Option<u64> {
        match self {
            Front::Clusters(cache) => cache.alloc_run(order),
            Front::GlobalLock(map) => map.alloc(order),
        }
    }

    fn free(&mut self, first: u64, order: u32) {
        match self {
            Front::Clusters(cache) => cache.free_run(first, order),
            Front::GlobalLock(map) => map.free(first, order),
        }
    }
}

/// A run as 4 bytes, so that picking random victims in a large working set stays in cache (the
/// benchmark's own memory traffic would otherwise dominate): a run of order k starts at a
/// multiple m·2^k, stored as (2m + 1)·2^k, whose trailing zeros give k back.
fn pack(first: u64, order: u32) -> u32 {
    ((first << 1) + (1 << order)) as u32
}

fn unpack(run: u32) -> (u64, u32) {
    let order = run.trailing_zeros();
    (u64::from(run - (1 << order)) >> 1, order)
}

/// The file size `pack` can describe.
const MAX_SIZE: u64 = (1 << 31) * SLOT_SIZE;

/// One thread's runs and its deterministic random choices.
struct WorkingSet {
    runs: Vec<u32>,
    slots: u64,
    rng: u64,
}

impl WorkingSet {
    /// Allocates one run of `order`, or its 2^order single slots when that fails (the engine
    /// splits the folio). Returns the allocation calls made.
    fn alloc(&mut self, front: &mut Front, order: u32) -> u64 {
        if let Some(first) = front.alloc(order) {
            self.runs.push(pack(first, order));
            self.slots += 1 << order;
            return 1;
        }
        let mut calls = 1;
        if order > 0 {
            for _ in 0..1u32 << order {
                calls += 1;
                let Some(slot) = front.alloc(0) else { break };
                self.runs.push(pack(slot, 0));
                self.slots += 1;
            }
        }
        calls
    }

    /// Frees one run picked at random.
    fn free_random(&mut self, front: &mut Front) {
        // xorshift64
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let (first, order) = unpack(self.runs.swap_remove((self.rng % self.runs.len() as u64) as usize));
        front.free(first, order);
        self.slots -= 1 << order;
    }
}

/// One thread of a pass: fill, wait, the timed loop, wait, free everything. Returns its calls.
fn worker(mut front: Front, args: &SlotsArgs, orders: &[u32], share: u64, seed: u64, timed: &Barrier) -> u64 {
    let mut set = WorkingSet { runs: Vec::new(), slots: 0, rng: seed | 1 };
    let mut turn = 0;
    let mut next_order = || {
        turn += 1;
        orders[turn % orders.len()]
    };
    while set.slots < share {
        let before = set.slots;
        set.alloc(&mut front, next_order());
        if set.slots == before {
            break; // the file is full (the other threads took more than their share)
        }
    }
    timed.wait();
    let mut calls = 0;
    while calls < args.ops {
        for _ in 0..args.batch {
            calls += set.alloc(&mut front, next_order());
        }
        while set.slots > share && !set.runs.is_empty() {
            set.free_random(&mut front);
            calls += 1;
        }
    }
    timed.wait();
    while !set.runs.is_empty() {
        set.free_random(&mut front);
    }
    calls
}

/// One pass on a fresh map: allocation and free calls per second, fallbacks, order-0 failures.
fn pass(allocator: Allocator, threads: usize, args: &SlotsArgs, orders: &[u32]) -> Result<(f64, u64, u64), String> {
    let slots = args.size / SLOT_SIZE;
    let (clusters, global) = match allocator {
        Allocator::Clusters => (Some(Arc::new(SwapMap::new(slots))), None),
        Allocator::GlobalLock => (None, Some(Arc::new(GlobalLockMap::new(slots)))),
    };
    let map: Arc<dyn SlotAllocator> = match (&clusters, &global) {
        (Some(map), _) => map.clone(),
        (None, Some(map)) => map.clone(),
        (None, None) => unreachable!("one allocator is made per pass"),
    };
    let front = || match (&clusters, &global) {
        (Some(map), _) => Front::Clusters(SlotCache::new(map.clone())),
        (None, _) => Front::GlobalLock(global.clone().expect("one allocator is made per pass")),
    };
    let share = map.total_slots() / 2 / threads as u64;
    let timed = Barrier::new(threads + 1);
    let (elapsed, calls) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let front = front();
                let timed = &timed;
                s.spawn(move || worker(front, args, orders, share, 0x9E37_79B9_7F4A_7C15 * (t as u64 + 1), timed))
            })
            .collect();
        timed.wait();
        let start = Instant::now();
        timed.wait();
        let elapsed = start.elapsed().as_secs_f64();
        let calls: u64 = handles.into_iter().map(|h| h.join().expect("a worker panicked")).sum();
        (elapsed, calls)
    });
    if map.used_slots() != 0 {
        return Err(format!("{} slots still allocated after every thread freed everything", map.used_slots()));
    }
    let fallbacks = (1..=MAX_ORDER).map(|o| map.fallbacks(o)).sum();
    Ok((calls as f64 / elapsed, fallbacks, map.fallbacks(0)))
}

fn measure(allocator: Allocator, threads: usize, args: &SlotsArgs, orders: &[u32]) -> Result<Row, String> {
    let mut rates = Vec::with_capacity(args.passes);
    let (mut fallbacks, mut order0_failures) = (0, 0);
    for _ in 0..args.passes {
        let (rate, f, z) = pass(allocator, threads, args, orders)?;
        rates.push(rate);
        fallbacks += f;
        order0_failures += z;
    }
    let mut sorted = rates.clone();
    sorted.sort_by(f64::total_cmp);
    Ok(Row { allocator, threads, ops_per_s: sorted[sorted.len() / 2], passes_ops_per_s: rates, fallbacks, order0_failures })
}

pub fn run(args: SlotsArgs) -> Result<bool, String> {
    let orders = args
        .order_mix
        .split(',')
        .map(|o| match o.trim().parse::<u32>() {
            Ok(order) if order <= MAX_ORDER => Ok(order),
            _ => Err(format!("--order-mix: {o:?} is not an order from 0 to {MAX_ORDER}")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if threads == 0 || args.passes == 0 || args.batch == 0 {
        return Err("--threads, --passes and --batch must be at least 1".into());
    }
    if args.size > MAX_SIZE {
        return Err(format!("--size must be at most {}", format_bytes(MAX_SIZE)));
    }
    let clusters = args.size / SLOT_SIZE / 512;
    if clusters < 2 * threads as u64 {
        return Err(format!("--size {} is too small: give each thread at least two 2 MiB clusters", args.size));
    }
    let mut rows = Vec::new();
    if args.sweep {
        for t in 1..=threads {
            rows.push(measure(Allocator::GlobalLock, t, &args, &orders)?);
            rows.push(measure(Allocator::Clusters, t, &args, &orders)?);
        }
    } else {
        let allocator = if args.baseline { Allocator::GlobalLock } else { Allocator::Clusters };
        rows.push(measure(allocator, threads, &args, &orders)?);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?);
        return Ok(true);
    }
    println!(
        "swap slots: {} file ({} slots), orders {}, about half full, {} calls per thread, median of {} passes",
        format_bytes(clusters * 512 * SLOT_SIZE),
        clusters * 512,
        args.order_mix,
        args.ops,
        args.passes
    );
    if args.sweep {
        println!("{:>7} {:>18} {:>18} {:>8} {:>22}", "threads", "global lock M/s", "clusters M/s", "speedup", "fallbacks (glob/clus)");
        for pair in rows.chunks_exact(2) {
            let (before, after) = (&pair[0], &pair[1]);
            println!(
                "{:>7} {:>18.2} {:>18.2} {:>7.2}x {:>22}",
                before.threads,
                before.ops_per_s / 1e6,
                after.ops_per_s / 1e6,
                after.ops_per_s / before.ops_per_s,
                format!("{}/{}", before.fallbacks, after.fallbacks)
            );
        }
    } else {
        let row = &rows[0];
        println!(
            "{}, {} threads: {:.2} M allocs+frees/s; {} fallbacks (split), {} order-0 failures",
            row.allocator.describe(),
            row.threads,
            row.ops_per_s / 1e6,
            row.fallbacks,
            row.order0_failures
        );
    }
    Ok(true)
}
