//! `folioswap stat`: the live counters of every running `folioswap run`, one line per
//! interval with the deltas, like vmstat.
//!
//! 1. Find the processes: each process of a run whose engine has started listens on the
//!    abstract unix socket `folioswap-stat/<run>/<pid>` (libfolioswap.so's
//!    `stat_server.rs`), so their names in `/proc/net/unix` are the list, from any shell
//!    and with no flag (processes in another network namespace are not seen).
//! 2. Ask each for its counters (one line of JSON: `Engine::stats()` and the fault
//!    latency histogram), every interval; the list is read again each time, so processes
//!    that start later join and those that end drop out.
//! 3. Print what moved since the last time: counters per second, summed over the
//!    processes; memory figures as they are now; fault latency percentiles of the faults
//!    served in the interval (the histograms' difference, merged over the processes).

use folioswap::{format_bytes, LatencyHistogram, STAT_SOCKET_PREFIX};
use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(clap::Args, Debug)]
pub struct StatArgs {
    /// Seconds between lines.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
    /// Print this many lines, then exit (default: until interrupted or every run ended).
    #[arg(long)]
    count: Option<u64>,
    /// One JSON object per line instead of the table.
    #[arg(long)]
    json: bool,
    /// Only the run whose `folioswap run` has this pid.
    #[arg(long)]
    run: Option<u32>,
}

/// Counters shown per second, in the units of their names (4 KiB pages, faults).
const RATES: &[&str] = &["pgfault", "pgmajfault", "zswpin", "zswpout", "pswpin", "pswpout", "zswpwb", "swap_ra_hit", "oom_kill"];

/// The remote tier's counters (`stats.swap.io.remote`), shown like `RATES` where a
/// process has one.
const REMOTE_RATES: &[&str] = &["remote_swpin", "remote_swpout", "remote_errors"];

/// The remote tier's state in one process.
#[derive(Serialize, Clone)]
struct RemoteState {
    nodes: String,
    keys: u64,
    bytes: u64,
    /// Why it takes no writes now, if it does not.
    down: Option<String>,
}

/// One process's answer.
struct Sample {
    run: u32,
    command: String,
    counters: BTreeMap<&'static str, u64>,
    resident_bytes: u64,
    pool_total_bytes: u64,
    pool_compressed_bytes: u64,
    pool_share_bytes: u64,
    charged_bytes: u64,
    anon_huge_bytes: u64,
    latency: LatencyHistogram,
    remote: Option<RemoteState>,
}

/// The sockets of the processes listening now: (run, pid).
fn listening(only_run: Option<u32>) -> Result<BTreeSet<(u32, u32)>, String> {
    let table = std::fs::read_to_string("/proc/net/unix").map_err(|e| format!("cannot read /proc/net/unix: {e}"))?;
    let prefix = format!("@{STAT_SOCKET_PREFIX}");
    let mut found = BTreeSet::new();
    for line in table.lines().skip(1) {
        let Some(name) = line.split_whitespace().nth(7) else { continue };
        let Some(rest) = name.strip_prefix(&prefix) else { continue };
        let Some((run, pid)) = rest.split_once('/') else { continue };
        if let (Ok(run), Ok(pid)) = (run.parse::<u32>(), pid.parse::<u32>()) {
            if only_run.is_none_or(|r| r == run) {
                found.insert((run, pid));
            }
        }
    }
    Ok(found)
}

/// Ask one process; `None` if it ended meanwhile or did not answer in time.
fn ask(run: u32, pid: u32) -> Option<Sample> {
    let name = format!("{STAT_SOCKET_PREFIX}{run}/{pid}");
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).ok()?;
    let mut conn = UnixStream::connect_addr(&addr).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let mut text = String::new();
    conn.read_to_string(&mut text).ok()?;
    let v: Value = serde_json::from_str(text.trim()).ok()?;
    let stats = &v["stats"];
    let memory = &stats["memory"];
    let num = |x: &Value| x.as_u64().unwrap_or(0);
    let remote = &stats["swap"]["io"]["remote"];
    let mut counters: BTreeMap<&'static str, u64> = RATES.iter().map(|&name| (name, num(&stats[name]))).collect();
    if remote.is_object() {
        counters.extend(REMOTE_RATES.iter().map(|&name| (name, num(&remote[name]))));
    }
    Some(Sample {
        run,
        command: v["command"].as_str().unwrap_or("").to_string(),
        counters,
        remote: remote.is_object().then(|| RemoteState {
            nodes: remote["nodes"].as_str().unwrap_or("").to_string(),
            keys: num(&remote["keys"]),
            bytes: num(&remote["bytes"]),
            down: remote["down"].as_str().map(str::to_string),
        }),
        resident_bytes: num(&memory["resident_bytes"]),
        pool_total_bytes: num(&memory["pool_total_bytes"]),
        pool_compressed_bytes: num(&memory["pool_compressed_bytes"]),
        pool_share_bytes: num(&memory["pool_share_bytes"]),
        charged_bytes: num(&memory["charged_bytes"]),
        anon_huge_bytes: num(&v["anon_huge_bytes"]),
        latency: serde_json::from_value(v["fault_latency_histogram"].clone()).unwrap_or_default(),
    })
}

fn ask_all(only_run: Option<u32>) -> Result<BTreeMap<u32, Sample>, String> {
    Ok(listening(only_run)?.into_iter().filter_map(|(run, pid)| ask(run, pid).map(|s| (pid, s))).collect())
}

/// What moved in one interval, over a set of processes.
#[derive(Serialize, Default)]
struct Line {
    processes: usize,
    /// Counters per second (4 KiB pages for the swap counters, faults for pgfault).
    per_s: BTreeMap<&'static str, f64>,
    /// Counters since each process's engine started, summed.
    total: BTreeMap<&'static str, u64>,
    resident_bytes: u64,
    pool_total_bytes: u64,
    /// Of `pool_total_bytes`, the compressed objects the pool holds (the rest is free space
    /// in pages it still holds).
    pool_compressed_bytes: u64,
    /// With the pool charged: the share of memory_high it may hold before writeback
    /// (`pool_share.rs`), summed over the processes.
    pool_share_bytes: u64,
    charged_bytes: u64,
    anon_huge_bytes: u64,
    /// Of the resident managed memory, the share mapped as transparent huge pages.
    thp_pct: f64,
    /// Of the faults served in the interval (`null`: none).
    fault_latency: Option<folioswap::Latency>,
    /// The remote tiers of the processes that have one, as they are now.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    remote: Vec<RemoteState>,
}

impl Line {
    /// `now` against `before`; a process not seen before counts from its start.
    fn of<'a>(now: impl Iterator<Item = (&'a u32, &'a Sample)>, before: &BTreeMap<u32, Sample>, seconds: f64) -> Line {
        let mut line = Line::default();
        let mut latency = LatencyHistogram::default();
        for (pid, s) in now {
            let prev = before.get(pid);
            line.processes += 1;
            for (&name, &value) in &s.counters {
                let then = prev.and_then(|p| p.counters.get(name)).copied().unwrap_or(0);
                *line.per_s.entry(name).or_default() += value.saturating_sub(then) as f64 / seconds;
                *line.total.entry(name).or_default() += value;
            }
            line.resident_bytes += s.resident_bytes;
            line.pool_total_bytes += s.pool_total_bytes;
            line.pool_compressed_bytes += s.pool_compressed_bytes;
            line.pool_share_bytes += s.pool_share_bytes;
            line.charged_bytes += s.charged_bytes;
            line.anon_huge_bytes += s.anon_huge_bytes;
            line.remote.extend(s.remote.clone());
            latency.merge(&match prev {
                Some(p) => s.latency.since(&p.latency),
                None => s.latency.clone(),
            });
        }
        line.thp_pct = if line.resident_bytes > 0 { 100.0 * line.anon_huge_bytes as f64 / line.resident_bytes as f64 } else { 0.0 };
        line.fault_latency = latency.summary();
        line
    }
}

#[derive(Serialize)]
struct RunLine {
    run: u32,
    pids: Vec<u32>,
    commands: Vec<String>,
    #[serde(flatten)]
    line: Line,
}

#[derive(Serialize)]
struct JsonLine {
    /// Seconds since the epoch.
    time: f64,
    interval_s: f64,
    runs: usize,
    #[serde(flatten)]
    total: Line,
    per_run: Vec<RunLine>,
}

const HEADER: &str = "    time runs procs  faults/s  zswpin/s zswpout/s  pswpin/s pswpout/s  resident      pool  thp%  p50us  p99us";

fn rate(x: f64) -> String {
    if x >= 10_000_000.0 {
        format!("{:.0}M", x / 1e6)
    } else {
        format!("{x:.0}")
    }
}

fn clock() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    format!("{:02}:{:02}:{:02}", secs / 3600 % 24, secs / 60 % 60, secs % 60)
}

fn table_line(runs: usize, l: &Line) -> String {
    let (p50, p99) = match &l.fault_latency {
        Some(lat) => (format!("{:.1}", lat.p50_us), format!("{:.1}", lat.p99_us)),
        None => ("-".into(), "-".into()),
    };
    let r = |name| rate(l.per_s.get(name).copied().unwrap_or(0.0));
    format!(
        "{} {runs:>4} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>5.0} {p50:>6} {p99:>6}",
        clock(),
        l.processes,
        r("pgfault"),
        r("zswpin"),
        r("zswpout"),
        r("pswpin"),
        r("pswpout"),
        format_bytes(l.resident_bytes),
        format_bytes(l.pool_total_bytes),
        l.thp_pct,
    )
}

/// The remote tiers under a table line: what went there and came back per second, what
/// they hold, and whether they take writes.
fn remote_line(l: &Line) -> String {
    let r = |name| rate(l.per_s.get(name).copied().unwrap_or(0.0));
    let mut nodes: Vec<&str> = l.remote.iter().map(|t| t.nodes.as_str()).collect();
    nodes.dedup();
    let keys: u64 = l.remote.iter().map(|t| t.keys).sum();
    let bytes: u64 = l.remote.iter().map(|t| t.bytes).sum();
    let down: Vec<&str> = l.remote.iter().filter_map(|t| t.down.as_deref()).collect();
    format!(
        "         remote {}: remote_swpin/s {} remote_swpout/s {} remote_errors {} keys {keys} ({}){}",
        nodes.join(" "),
        r("remote_swpin"),
        r("remote_swpout"),
        l.total.get("remote_errors").copied().unwrap_or(0),
        format_bytes(bytes),
        if down.is_empty() { String::new() } else { format!("; takes no writes: {}", down[0]) }
    )
}

pub fn run(args: StatArgs) -> Result<bool, String> {
    if !(args.interval.is_finite() && args.interval >= 0.05) {
        return Err(format!("--interval {} is not valid: expected seconds, at least 0.05", args.interval));
    }
    if args.count == Some(0) {
        return Err("--count 0 is not valid: expected at least 1 line".into());
    }
    let mut before = ask_all(args.run)?;
    if before.is_empty() {
        return Err(match args.run {
            Some(run) => format!("no process of run {run} answers (no @{STAT_SOCKET_PREFIX}{run}/* in /proc/net/unix): it has ended, or its engine has not started yet"),
            None => format!(
                "no folioswap run is running (no @{STAT_SOCKET_PREFIX}* in /proc/net/unix; a process's engine starts with its first managed allocation, and processes in another network namespace are not seen)"
            ),
        });
    }
    let mut taken = Instant::now();
    let mut printed = 0u64;
    loop {
        std::thread::sleep(Duration::from_secs_f64(args.interval));
        let now = ask_all(args.run)?;
        let seconds = taken.elapsed().as_secs_f64();
        taken = Instant::now();
        if now.is_empty() {
            if !args.json {
                eprintln!("folioswap stat: every run has ended");
            }
            return Ok(true);
        }
        let runs: BTreeSet<u32> = now.values().map(|s| s.run).collect();
        let total = Line::of(now.iter(), &before, seconds);
        if args.json {
            let per_run = runs
                .iter()
                .map(|&run| {
                    let members: Vec<(&u32, &Sample)> = now.iter().filter(|(_, s)| s.run == run).collect();
                    RunLine {
                        run,
                        pids: members.iter().map(|(&pid, _)| pid).collect(),
                        commands: members.iter().map(|(_, s)| s.command.clone()).collect(),
                        line: Line::of(members.into_iter(), &before, seconds),
                    }
                })
                .collect();
            let time = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
            let line = JsonLine { time, interval_s: seconds, runs: runs.len(), total, per_run };
            println!("{}", serde_json::to_string(&line).expect("json"));
        } else {
            if printed.is_multiple_of(20) {
                println!("{HEADER}");
            }
            println!("{}", table_line(runs.len(), &total));
            if !total.remote.is_empty() {
                println!("{}", remote_line(&total));
            }
        }
        printed += 1;
        before = now;
        if args.count.is_some_and(|n| printed >= n) {
            return Ok(true);
        }
    }
}
