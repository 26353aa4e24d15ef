//! `folioswap run`: an unmodified program under folioswap, through libfolioswap.so.
//!
//! The command checks the options and that an engine can start here (userfaultfd
//! permission, kernel features, the swap file), then runs the program with the library
//! preloaded and the options as `FOLIOSWAP_*` variables. Every process of the run
//! (children included) shares one memory_high through a file in the run's directory
//! (`FOLIOSWAP_SHARED_LIMIT`), and writes its counters there at exit; when the program
//! is done they are summed and printed (or written as JSON). The exit status is the
//! program's (128 + N if signal N killed it).
//!
//! As an ordinary user (no permission for a full userfaultfd here) the engine runs with
//! a user-mode-only one; the run says so once on stderr, and libfolioswap.so makes the
//! buffers of the common I/O calls resident before the kernel copies to or from them
//! (`crates/folioswap-preload/src/syscalls.rs`).

use folioswap::{format_bytes, parse_bytes, Config, Engine, UffdMode};
use serde_json::{json, Map, Value};
use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(clap::Args)]
#[command(trailing_var_arg = true, after_help = AS_A_USER)]
pub struct RunArgs {
    /// Resident memory all processes of the run share, like a cgroup's memory.high
    /// (e.g. 1G); without it nothing is swapped, only counted.
    #[arg(long)]
    memory_high: Option<String>,
    /// Folio size of managed memory: 4K … 2M.
    #[arg(long)]
    folio: Option<String>,
    /// Pool compressor (lz4, zstd, …).
    #[arg(long)]
    compressor: Option<String>,
    /// Swap file behind the pool, PATH:SIZE (a directory gets an anonymous file); auto
    /// (the default): a sparse file made in /var/tmp; none: no file (then memory_high
    /// cannot hold for data that does not compress).
    #[arg(long)]
    swap_file: Option<String>,
    /// A Redis or Valkey cluster in the swap file's place: redis://HOST:PORT[,HOST:PORT…];
    /// what leaves memory goes there, encrypted with a key that never leaves the process.
    #[arg(long)]
    remote_tier: Option<String>,
    /// Encrypt and authenticate every page written to the swap file.
    #[arg(long)]
    encrypt: bool,
    /// Cap of the compressed pool (a size, or a percentage of RAM).
    #[arg(long)]
    max_pool: Option<String>,
    /// malloc blocks and anonymous mmaps at least this large are managed.
    #[arg(long, default_value = "1M")]
    threshold: String,
    /// Write the counters as JSON to this file: {"processes", "total", "per_process"}.
    #[arg(long)]
    stats_json: Option<PathBuf>,
    /// If folioswap cannot work here, run the program unmanaged (with a warning) instead
    /// of failing.
    #[arg(long)]
    fallback: bool,
    /// No counters summary (and no user-mode-only notice) on stderr.
    #[arg(long)]
    quiet: bool,
    /// The program and its arguments.
    #[arg(required = true, value_name = "PROGRAM")]
    command: Vec<OsString>,
}

const AS_A_USER: &str = "\
As an ordinary user: where userfaultfd is root-only (vm.unprivileged_userfaultfd=0 and no
access to /dev/userfaultfd) the engine uses a user-mode-only userfaultfd (Linux 5.11+),
which sees only the program's own accesses. The library then makes the buffers of read,
pread, readv, preadv, write, pwrite, writev, pwritev, recv, recvfrom, recvmsg, send,
sendto, sendmsg, fread and fwrite resident before each call; other system calls that copy
into or out of swapped-out managed memory (stat, getdents, io_uring, ...) and futexes whose
page was just evicted fail with EFAULT. See README.md, \"Running as an ordinary user\".";

/// Where libfolioswap.so is: $FOLIOSWAP_LIB, else beside this executable (a cargo target
/// directory), else in ../lib (an installation).
fn find_library() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("FOLIOSWAP_LIB") {
        let p = PathBuf::from(p);
        return if p.is_file() { Ok(p) } else { Err(format!("FOLIOSWAP_LIB={} is not a file", p.display())) };
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let candidates = [dir.join("libfolioswap.so"), dir.join("deps/libfolioswap.so"), dir.join("../lib/libfolioswap.so")];
    candidates.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        format!(
            "libfolioswap.so not found beside {} (looked in {}); build it with `cargo build --release -p folioswap-preload` or set FOLIOSWAP_LIB",
            exe.display(),
            candidates.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        )
    })
}

pub fn run(args: RunArgs) -> Result<std::process::ExitCode, String> {
    let mut vars: Vec<(&str, String)> = Vec::new();
    for (var, value) in [
        ("FOLIOSWAP_MEMORY_HIGH", &args.memory_high),
        ("FOLIOSWAP_FOLIO_SIZE", &args.folio),
        ("FOLIOSWAP_COMPRESSOR", &args.compressor),
        ("FOLIOSWAP_SWAP_FILE", &args.swap_file),
        ("FOLIOSWAP_MAX_POOL", &args.max_pool),
        ("FOLIOSWAP_REMOTE_TIER", &args.remote_tier),
    ] {
        if let Some(v) = value {
            vars.push((var, v.clone()));
        }
    }
    if args.encrypt {
        vars.push(("FOLIOSWAP_ENCRYPT", "1".into()));
    }
    let threshold = parse_bytes(&args.threshold)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("--threshold={:?} is not valid: expected a size like 1M or 256K", args.threshold))?;
    let env_vars = std::env::vars().filter(|(n, _)| !vars.iter().any(|(v, _)| v == n));
    let config = Config::from_vars(env_vars.chain(vars.iter().map(|(n, v)| (n.to_string(), v.clone())))).map_err(|e| e.to_string())?;

    let program = &args.command[0];
    let mut cmd = Command::new(program);
    cmd.args(&args.command[1..]);
    let mut run_dir = None;
    match find_library().and_then(|lib| Engine::new(config.clone()).map(|e| (lib, e.uffd_mode())).map_err(|e| e.to_string())) {
        Ok((lib, mode)) => {
            if mode == UffdMode::UserModeOnly && !args.quiet {
                eprintln!(
                    "folioswap: no permission to handle the kernel's faults on userfaultfd here (vm.unprivileged_userfaultfd=0, \
                     /dev/userfaultfd not accessible): running user-mode-only. read/write/recv/send/fread/fwrite and their \
                     variants on managed memory are made resident first; other system calls that copy into swapped-out \
                     memory fail with EFAULT (see \"Running as an ordinary user\" in README.md)"
                );
            }
            let dir = tempdir()?;
            let preload = match std::env::var_os("LD_PRELOAD") {
                Some(old) if !old.is_empty() => {
                    let mut p = lib.into_os_string();
                    p.push(" ");
                    p.push(old);
                    p
                }
                _ => lib.into_os_string(),
            };
            cmd.env("LD_PRELOAD", preload)
                .env("FOLIOSWAP_INTERPOSE", "1")
                .env("FOLIOSWAP_THRESHOLD", threshold.to_string())
                .env("FOLIOSWAP_STATS_DIR", &dir)
                // `folioswap stat` groups this run's processes by it.
                .env("FOLIOSWAP_RUN", std::process::id().to_string())
                // The engine started above has said (once) what the configuration cannot
                // do; the program's engines need not say it again.
                .env("FOLIOSWAP_WARNED", "1");
            if config.memory_high.is_some() {
                cmd.env("FOLIOSWAP_SHARED_LIMIT", dir.join("limit"));
            }
            if args.fallback {
                cmd.env("FOLIOSWAP_FALLBACK", "1");
            }
            for (var, value) in &vars {
                cmd.env(var, value);
            }
            run_dir = Some(dir);
        }
        Err(e) if args.fallback => eprintln!("folioswap: {e}; running {} unmanaged (--fallback)", program.to_string_lossy()),
        Err(e) => return Err(format!("{e} (use --fallback to run the program unmanaged instead)")),
    }

    // The terminal sends these to the program too; the run outlives it to report.
    // SAFETY: ignoring signals in this process only; the child gets default handlers back
    // through exec (ignored signals stay ignored, so they are restored in pre_exec).
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
    }
    // SAFETY: the closure runs in the child between fork and exec and only calls
    // async-signal-safe signal(2).
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGQUIT, libc::SIG_DFL);
            Ok(())
        });
    }
    let status = match cmd.status() {
        Ok(s) => s,
        Err(e) => {
            if let Some(dir) = &run_dir {
                let _ = std::fs::remove_dir_all(dir);
            }
            let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
            eprintln!("folioswap: cannot run {}: {e}", program.to_string_lossy());
            return Ok(std::process::ExitCode::from(code));
        }
    };
    let code = match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(sig)) => 128 + sig,
        _ => 1,
    };
    if let Some(dir) = run_dir {
        let report = collect(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        let report = report?;
        if !args.quiet {
            summarise(&report, &config, threshold);
        }
        warn_if_unbounded(&report, &config, threshold);
        if let Some(path) = &args.stats_json {
            let text = serde_json::to_string_pretty(&report).expect("json");
            std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
    }
    Ok(std::process::ExitCode::from(code.clamp(0, 255) as u8))
}

/// A fresh private directory for the run's shared limit and counters.
fn tempdir() -> Result<PathBuf, String> {
    let base = std::env::var_os("TMPDIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp"));
    let dir = base.join(format!("folioswap-run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    Ok(dir)
}

/// Sum every process's counters: `{"processes", "total", "per_process"}`.
fn collect(dir: &Path) -> Result<Value, String> {
    let mut per_process = Vec::new();
    let mut total = Map::new();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let Some(pid) = name.strip_prefix("stats-").and_then(|n| n.strip_suffix(".json")).and_then(|n| n.parse::<u64>().ok()) else {
            continue;
        };
        let text = std::fs::read_to_string(entry.path()).map_err(|e| format!("cannot read {name}: {e}"))?;
        let stats: Value = serde_json::from_str(&text).map_err(|e| format!("{name} is not valid JSON: {e}"))?;
        if let Value::Object(fields) = &stats {
            for (k, v) in fields {
                if let Some(n) = v.as_u64() {
                    let sum = total.get(k).and_then(Value::as_u64).unwrap_or(0) + n;
                    total.insert(k.clone(), json!(sum));
                }
            }
        }
        per_process.push(json!({"pid": pid, "stats": stats}));
    }
    per_process.sort_by_key(|p| p["pid"].as_u64());
    Ok(json!({"processes": per_process.len(), "total": total, "per_process": per_process}))
}

/// Memory outside the engine that `warn_if_unbounded` lets pass: the library's own heap,
/// the engine's tables and stacks, and the small blocks a program keeps beside its
/// managed ones (CPython: about 4 MiB) stay under it.
const OUTSIDE_ALLOWANCE: u64 = 32 << 20;

/// Say so where memory_high did not bound the program: one of its processes held more
/// anonymous memory outside the engine than the allowance and a quarter of the limit
/// (`unmanaged_anon_peak_bytes`; the largest process's, since the sum over processes that
/// come and go would count memory never held at once). Printed even with `--quiet`: it is
/// a warning, not the summary.
fn warn_if_unbounded(report: &Value, config: &Config, threshold: u64) {
    let Some(high) = config.memory_high else { return };
    let processes = report["per_process"].as_array().map(Vec::as_slice).unwrap_or_default();
    let outside = processes.iter().filter_map(|p| p["stats"]["unmanaged_anon_peak_bytes"].as_u64()).max().unwrap_or(0);
    if outside <= OUTSIDE_ALLOWANCE.max(high / 4) {
        return;
    }
    eprintln!(
        "folioswap: warning: a process of the program held up to {} MiB of anonymous memory that folioswap did not manage, which memory_high {} does not bound. \
         Only blocks and anonymous read-write mmaps of --threshold {} and up are managed: a heap of smaller blocks (perl, SQLite's page cache) \
         or memory reserved PROT_NONE and committed later (the JVM, V8) stays outside (README, \"Running unmodified programs\")",
        outside >> 20,
        format_bytes(high),
        format_bytes(threshold)
    );
}

fn summarise(report: &Value, config: &Config, threshold: u64) {
    let total = &report["total"];
    let n = |k: &str| total[k].as_u64().unwrap_or(0);
    let pages = |k: &str| format!("{k} {} ({})", n(k), format_bytes(n(k) * 4096));
    let limit = config.memory_high.map(|m| format!("memory_high {} shared", format_bytes(m))).unwrap_or("no memory_high".into());
    eprintln!("folioswap: {} process(es) managed memory, {limit}, {} folios", report["processes"], config.folio_size);
    if report["processes"].as_u64() == Some(0) && config.memory_high.is_some() {
        eprintln!(
            "  so memory_high bounded nothing: no process allocated a block of --threshold {} or more through libfolioswap.so (a statically linked program, Go's for one, never loads it)",
            format_bytes(threshold)
        );
    }
    eprintln!("  out: {}, {}", pages("zswpout"), pages("pswpout"));
    eprintln!("  in:  {}, {}", pages("zswpin"), pages("pswpin"));
    eprintln!(
        "  faults {}, major {}; thp_swpout {}, thp_swpout_fallback {}; swap_ra {}, swap_ra_hit {}",
        n("pgfault"),
        n("pgmajfault"),
        n("thp_swpout"),
        n("thp_swpout_fallback"),
        n("swap_ra"),
        n("swap_ra_hit")
    );
    let extra: Vec<String> = [
        "fork_swapin",
        "cow_unshare",
        "memory_high_overrun",
        "oom_kill",
        "swap_read_error",
        "swap_checksum_error",
        "syscall_prefault",
        "syscall_retry",
    ]
    .iter()
    .filter(|k| n(k) > 0)
    .map(|k| format!("{k} {}", n(k)))
    .collect();
    if !extra.is_empty() {
        eprintln!("  {}", extra.join(", "));
    }
}
