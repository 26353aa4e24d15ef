//! `folioswap run`: real programs under the preloaded engine (libfolioswap.so).
//!
//! The C programs in tests/c and bench/usemem.c are compiled with `cc` into
//! CARGO_TARGET_TMPDIR; python3 and GNU sort must be installed. Each test bounds its
//! memory (a few hundred MiB at most, most of it swapped out), changes no system setting,
//! and checks results, never timings. The tests run one at a time (see [`serial`]).
//!
//! `folioswap run` preloads libfolioswap.so from next to its own executable: build it with
//! `cargo build -p folioswap-preload`, or run `cargo test --workspace`, which builds it.
//!
//! The tests "as nobody" (root needed) run `folioswap run` and `folioswap bench` as user
//! nobody, for whom userfaultfd is root-only on most systems: the engine falls back to a
//! user-mode-only userfaultfd and the library makes I/O buffers resident before the
//! kernel copies to or from them. They run copies of the binaries from a directory
//! nobody can reach (`NobodyDir`).

use serde_json::Value;
use std::ffi::OsStr;
use std::fs;
use std::io::{self, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

const FOLIOSWAP: &str = env!("CARGO_BIN_EXE_folioswap");
const TMP: &str = env!("CARGO_TARGET_TMPDIR");
const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

/// A run that takes longer than this is killed (with its whole process group) and fails:
/// a safety net against hangs, far above what any of these runs needs.
const HANG_LIMIT: Duration = Duration::from_secs(600);

const TMPFS_MAGIC: i64 = 0x0102_1994;

// ---- helpers ------------------------------------------------------------------------

/// One test at a time: each pushes a few hundred MiB through the engine (and some run an
/// unmanaged reference too), which is fine once but not times the CPU count.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The folioswap binary, after checking that the library it preloads was built.
fn folioswap() -> &'static str {
    let beside = Path::new(FOLIOSWAP).with_file_name("libfolioswap.so");
    let in_deps = Path::new(FOLIOSWAP).with_file_name("deps").join("libfolioswap.so");
    assert!(
        beside.is_file() || in_deps.is_file(),
        "{} (or {}) is missing: `folioswap run` preloads it from next to the folioswap binary.\n\
         Build it first with `cargo build -p folioswap-preload` (`cargo test --workspace` builds it too).",
        beside.display(),
        in_deps.display()
    );
    FOLIOSWAP
}

fn unique(name: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{name}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// A fresh directory, removed with everything in it when dropped.
struct TempDir(PathBuf);

impl TempDir {
    /// Under CARGO_TARGET_TMPDIR.
    fn new(name: &str) -> TempDir {
        TempDir::new_in(Path::new(TMP), name)
    }

    fn new_in(parent: &Path, name: &str) -> TempDir {
        loop {
            let path = parent.join(unique(&format!("folioswap-run-{name}")));
            match fs::create_dir(&path) {
                Ok(()) => return TempDir(path),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => panic!("cannot create the directory {}: {e}", path.display()),
            }
        }
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// The names of the entries left in the directory.
    fn entries(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(&self.0)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", self.0.display()))
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap_or_else(|| panic!("{} is not UTF-8", path.display()))
}

/// Compile one C file with `cc -O2 -pthread` into CARGO_TARGET_TMPDIR/NAME.
fn compile(source: &Path, name: &str) -> PathBuf {
    let out = Path::new(TMP).join(name);
    // Built under a unique name and renamed into place: tests sharing a program can race.
    let tmp = Path::new(TMP).join(unique(&format!(".{name}.building")));
    let result = Command::new("cc").args(["-O2", "-Wall", "-pthread", "-o"]).arg(&tmp).arg(source).output();
    match result {
        Err(e) if e.kind() == io::ErrorKind::NotFound => panic!(
            "`cc` was not found: these tests compile C programs ({}); install a C compiler \
             (e.g. `apt-get install gcc`)",
            source.display()
        ),
        Err(e) => panic!("cannot run cc: {e}"),
        Ok(o) if !o.status.success() => {
            panic!("cc -O2 -Wall -pthread {} failed ({}):\n{}", source.display(), o.status, String::from_utf8_lossy(&o.stderr))
        }
        Ok(_) => {}
    }
    fs::rename(&tmp, &out).unwrap_or_else(|e| panic!("cannot move {} into place: {e}", tmp.display()));
    out
}

/// A program from tests/c.
fn test_program(name: &str) -> PathBuf {
    compile(&Path::new(MANIFEST_DIR).join("tests/c").join(format!("{name}.c")), name)
}

/// bench/usemem.c.
fn usemem() -> PathBuf {
    compile(&Path::new(MANIFEST_DIR).join("../../bench/usemem.c"), "usemem")
}

/// Fail clearly if `tool` is not installed.
fn require_tool(tool: &str, test: &str) {
    match Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            panic!("`{tool}` was not found: {test} needs it installed and on PATH")
        }
        Err(e) => panic!("cannot run {tool}: {e}"),
        Ok(_) => {}
    }
}

/// What a finished run left.
struct Run {
    cmdline: String,
    code: i32,
    stdout: String,
    stderr: String,
    /// The --stats-json file, if one was asked for and written.
    stats: Option<Value>,
}

impl Run {
    /// Everything about the run, for assertion messages.
    fn describe(&self) -> String {
        let stats = match &self.stats {
            Some(v) => serde_json::to_string_pretty(v).unwrap(),
            None => "(none)".into(),
        };
        format!(
            "command: {}\nexit code: {}\n--- stdout ---\n{}\n--- stderr ---\n{}\n--- stats ---\n{}",
            self.cmdline,
            self.code,
            tail(&self.stdout),
            tail(&self.stderr),
            tail(&stats)
        )
    }

    fn assert_code(&self, code: i32) {
        assert_eq!(self.code, code, "unexpected exit code\n{}", self.describe());
    }

    fn assert_success(&self) {
        self.assert_code(0);
    }

    fn assert_stdout_line(&self, line: &str) {
        assert!(self.stdout.lines().any(|l| l.trim_end() == line), "stdout has no line {line:?}\n{}", self.describe());
    }

    fn stats(&self) -> &Value {
        self.stats.as_ref().unwrap_or_else(|| panic!("no --stats-json file was written\n{}", self.describe()))
    }

    /// A counter summed over the processes ("total" of the stats file).
    fn total(&self, key: &str) -> u64 {
        self.stats()["total"][key].as_u64().unwrap_or_else(|| panic!("stats total has no numeric {key:?}\n{}", self.describe()))
    }

    /// The number the program printed after `key` on a line of its own.
    fn figure(&self, key: &str) -> u64 {
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {key} line\n{}", self.describe()))
    }

    fn assert_total_positive(&self, key: &str) {
        assert!(self.total(key) > 0, "expected total {key} > 0\n{}", self.describe());
    }

    /// A program that faulted with one thread was woken by fault threads at SCHED_IDLE,
    /// so that it stayed on its CPU (`local_wake.rs`).
    fn assert_woken_at_idle_priority(&self) {
        assert!(
            self.total("fault_wake_local") > 0,
            "a single-threaded program was never woken at SCHED_IDLE (needs thread mode, two CPUs or more, and root or CAP_SYS_NICE, which the way back from SCHED_IDLE needs)\n{}",
            self.describe()
        );
    }
}

/// The last 8000 characters of `text`.
fn tail(text: &str) -> &str {
    let mut start = text.len().saturating_sub(8000);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

fn quote(arg: &OsStr) -> String {
    let a = arg.to_string_lossy();
    if !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:=+,".contains(c)) {
        a.into_owned()
    } else {
        format!("'{}'", a.replace('\'', r"'\''"))
    }
}

/// Run `cmd` to completion, its output captured. It runs in its own process group, so that
/// a hung run can be killed with everything it started.
fn run_command(mut cmd: Command, stats_json: Option<&Path>) -> Run {
    let cmdline = std::iter::once(cmd.get_program()).chain(cmd.get_args()).map(quote).collect::<Vec<_>>().join(" ");
    // No FOLIOSWAP_* setting of the caller's environment may change what is tested.
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("FOLIOSWAP_") {
            cmd.env_remove(&name);
        }
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {cmdline}: {e}"));
    let pid = child.id() as libc::pid_t;
    let reader = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = reader(Box::new(child.stdout.take().unwrap()));
    let err = reader(Box::new(child.stderr.take().unwrap()));

    // Wait for the exit without reaping (the pid, hence the process group id, stays ours),
    // then kill whatever the run left in its group, then reap.
    let deadline = Instant::now() + HANG_LIMIT;
    let mut timed_out = false;
    loop {
        // SAFETY: siginfo_t is plain data; all-zero is a valid value.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid writes into `info`, a live siginfo_t, and reaps nothing (WNOWAIT).
        let r = unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOWAIT | libc::WNOHANG) };
        if r != 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            panic!("waitid on {cmdline}: {e}");
        }
        // SAFETY: waitid filled `info` (or left it zeroed); si_pid reads a plain field.
        if unsafe { info.si_pid() } != 0 {
            break;
        }
        if Instant::now() >= deadline {
            timed_out = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill only sends a signal, to the process group this test started.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    let status = child.wait().unwrap();
    let stdout = out.join().unwrap();
    let stderr = err.join().unwrap();

    let stats = stats_json.and_then(|path| match fs::read_to_string(path) {
        Ok(text) => Some(serde_json::from_str(&text).unwrap_or_else(|e| {
            panic!("{} is not JSON: {e}\n{text}\ncommand: {cmdline}\n--- stderr ---\n{}", path.display(), tail(&stderr))
        })),
        Err(_) => None,
    });
    let code = status.code().unwrap_or_else(|| {
        use std::os::unix::process::ExitStatusExt;
        128 + status.signal().unwrap_or(0)
    });
    let run = Run { cmdline, code, stdout, stderr, stats };
    assert!(!timed_out, "the run did not finish in {} s and was killed\n{}", HANG_LIMIT.as_secs(), run.describe());
    run
}

/// `folioswap run OPTS [--stats-json STATS] -- PROGRAM...`.
fn under<S: AsRef<OsStr>>(opts: &[&str], stats_json: Option<&Path>, program: &[S]) -> Run {
    under_env(opts, stats_json, program, &[])
}

fn under_env<S: AsRef<OsStr>>(opts: &[&str], stats_json: Option<&Path>, program: &[S], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(folioswap());
    cmd.arg("run").args(opts);
    if let Some(path) = stats_json {
        cmd.arg("--stats-json").arg(path);
    }
    cmd.arg("--").args(program);
    cmd.envs(env.iter().copied());
    run_command(cmd, stats_json)
}

/// PROGRAM... directly, without folioswap.
fn direct<S: AsRef<OsStr>>(program: &[S], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(&program[0]);
    cmd.args(&program[1..]).envs(env.iter().copied());
    run_command(cmd, None)
}

/// Whether `path` is on tmpfs.
fn on_tmpfs(path: &Path) -> bool {
    let c = std::ffi::CString::new(s(path)).unwrap();
    // SAFETY: statfs is plain data; all-zero is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a live statfs to write into.
    let r = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    assert_eq!(r, 0, "statfs {}: {}", path.display(), io::Error::last_os_error());
    st.f_type as i64 == TMPFS_MAGIC
}

/// Compare two files byte for byte, saying where they first differ.
fn assert_same_file(got: &Path, expected: &Path, context: &dyn Fn() -> String) {
    let a = fs::read(got).unwrap_or_else(|e| panic!("cannot read {}: {e}\n{}", got.display(), context()));
    let b = fs::read(expected).unwrap_or_else(|e| panic!("cannot read {}: {e}", expected.display()));
    if a != b {
        let at = a.iter().zip(&b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
        panic!(
            "{} ({} bytes) differs from {} ({} bytes) first at byte {at}\n{}",
            got.display(),
            a.len(),
            expected.display(),
            b.len(),
            context()
        );
    }
}

// ---- tests --------------------------------------------------------------------------

/// malloc, mmap, calloc and realloc'd memory written from threads, then fork: parent and
/// child each see their own copy, all of it swapped through the pool.
#[test]
fn alloc_fork_under_run() {
    let _serial = serial();
    let prog = test_program("alloc_fork");
    let dir = TempDir::new("alloc_fork");
    let stats = dir.join("stats.json");
    let run = under(&["--memory-high", "64M", "--folio", "2M"], Some(&stats), &[s(&prog), "256", "4"]);
    run.assert_success();
    run.assert_stdout_line("child OK");
    run.assert_stdout_line("parent OK");
    run.assert_total_positive("zswpout");
    run.assert_total_positive("zswpin");
}

/// As above with 64 KiB folios and a pool too small for the data: the rest goes to the
/// swap file, which is gone when the run ends.
#[test]
fn alloc_fork_swap_file_under_run() {
    let _serial = serial();
    let prog = test_program("alloc_fork");
    let dir = TempDir::new("alloc_fork_swap");
    let swap_dir = TempDir::new("alloc_fork_swapdir");
    let stats = dir.join("stats.json");
    let swap_spec = format!("{}:512M", s(swap_dir.path()));
    let run = under(
        &["--memory-high", "64M", "--folio", "64K", "--swap-file", &swap_spec, "--max-pool", "8M"],
        Some(&stats),
        &[s(&prog), "256", "4"],
    );
    run.assert_success();
    run.assert_stdout_line("child OK");
    run.assert_stdout_line("parent OK");
    run.assert_total_positive("pswpout");
    assert!(swap_dir.entries().is_empty(), "the swap directory still holds {:?} after the run\n{}", swap_dir.entries(), run.describe());
}

/// read(2), write(2), O_DIRECT and futexes on managed memory that is being swapped.
#[test]
fn io_syscalls_under_run() {
    let _serial = serial();
    let prog = test_program("io_syscalls");
    // /var/tmp rather than the target dir or /tmp: usually a disk file system, where
    // O_DIRECT works.
    let var_tmp = Path::new("/var/tmp");
    let parent = if var_tmp.is_dir() { var_tmp } else { Path::new(TMP) };
    let dir = TempDir::new_in(parent, "io_syscalls");
    let stats_dir = TempDir::new("io_syscalls_stats");
    let stats = stats_dir.join("stats.json");
    let tmpfs = on_tmpfs(dir.path());

    let run = under(&["--memory-high", "32M", "--folio", "64K"], Some(&stats), &[s(&prog), s(dir.path()), "96"]);
    run.assert_success();
    run.assert_stdout_line("read OK");
    run.assert_stdout_line("write OK");
    assert!(run.stdout.lines().any(|l| l.starts_with("futex OK")), "stdout has no \"futex OK\" line\n{}", run.describe());
    if !tmpfs {
        run.assert_stdout_line("O_DIRECT OK");
    } else {
        assert!(
            run.stdout.lines().any(|l| l == "O_DIRECT OK" || l.starts_with("O_DIRECT unsupported")),
            "stdout has no O_DIRECT line\n{}",
            run.describe()
        );
    }
    run.assert_total_positive("zswpout");
}

/// Signal mode: threads that block every signal and a handler installed with a full
/// `sa_mask` read swapped-out memory back, and a program started with SIGBUS blocked
/// does too. Each read is a swap-in served by a SIGBUS handler on the reading thread, so
/// libfolioswap.so must keep SIGBUS out of those masks (the kernel kills a thread that
/// blocks the SIGBUS of its own fault), while the other signals stay blocked as asked.
/// Then the program installs a SIGBUS handler of its own: faults are still served, and
/// its handler gets the SIGBUS it raises.
#[test]
fn signal_mode_survives_threads_that_block_signals() {
    let _serial = serial();
    let prog = test_program("masked_threads");
    for exec in [false, true] {
        let dir = TempDir::new("masked_threads");
        let stats = dir.join("stats.json");
        let mut args = vec![s(&prog), "96"];
        if exec {
            args.push("exec");
        }
        let run = under_env(&["--memory-high", "32M", "--folio", "4K"], Some(&stats), &args, &[("FOLIOSWAP_FAULT_MODE", "signal")]);
        run.assert_success();
        run.assert_stdout_line("SIGBUS deliverable at start");
        run.assert_stdout_line("pthread_sigmask OK, SIGBUS deliverable (bad words 0, SIGUSR2 blocked)");
        run.assert_stdout_line("sigprocmask OK, SIGBUS deliverable (bad words 0, SIGUSR2 blocked)");
        run.assert_stdout_line("handler OK (bad words 0)");
        run.assert_stdout_line("chained OK (bad words 0, sigaction reports it, raised SIGBUS reached it)");
        // The words do not compress: they come back from the swap file.
        assert!(run.total("zswpin") + run.total("pswpin") > 0, "nothing was swapped in\n{}", run.describe());
    }
}

/// Threads that live one round each rewrite managed memory while it swaps (thread mode):
/// libfolioswap.so registers each one's rseq area at its first allocation and forgets it
/// at its exit, and the fault threads read it at every fault of a registered thread. Thread
/// ids come back, thread-local storage is freed and made again, half the threads never
/// allocate (never registered), and a child forked after every round checks every word.
#[test]
fn threads_that_come_and_go_while_swapping_verify_every_word() {
    let _serial = serial();
    let prog = test_program("threads_come_and_go");
    let dir = TempDir::new("threads_come_and_go");
    let stats = dir.join("stats.json");
    let run = under(&["--memory-high", "16M", "--folio", "4K"], Some(&stats), &[s(&prog), "48", "8", "4"]);
    run.assert_success();
    run.assert_stdout_line("OK 8 rounds, 32 threads, bad words 0");
    assert!(run.total("pgmajfault") > 10_000, "too few faults to have swapped every round\n{}", run.describe());
}

/// A thread started while the only other one computes on the same CPU: the fault thread
/// that woke that one at SCHED_IDLE may still wait behind it when the new thread faults
/// (`local_wake.rs`). Every word verified, before and after the new thread's writes, and
/// the run ends. (How soon the new thread was served is not asserted: that is timing.)
#[test]
fn a_thread_started_beside_a_busy_one_is_served() {
    let _serial = serial();
    let prog = test_program("late_thread");
    let dir = TempDir::new("late_thread");
    let stats = dir.join("stats.json");
    let run = under(&["--memory-high", "16M", "--folio", "4K"], Some(&stats), &[s(&prog), "64"]);
    run.assert_success();
    run.assert_stdout_line("OK late thread, bad words 0");
    run.assert_total_positive("pgmajfault");
    run.assert_woken_at_idle_priority();
}

/// CPython's bytearray (malloc/realloc) filled, hashed, and the digest compared with a run
/// without folioswap; its one thread woken by fault threads at idle priority.
#[test]
fn python_bytearray_under_run() {
    let _serial = serial();
    require_tool("python3", "python_bytearray_under_run");
    let script = "import hashlib\n\
                  b = bytearray(256 << 20)\n\
                  for i in range(256):\n    \
                      b[i << 20:(i + 1) << 20] = hashlib.shake_256(i.to_bytes(4, 'little')).digest(1 << 20)\n\
                  print(hashlib.sha256(b).hexdigest())\n";
    let expected = direct(&["python3", "-c", script], &[]);
    expected.assert_success();
    let digest = expected.stdout.trim();
    assert!(
        digest.len() == 64 && digest.chars().all(|c| c.is_ascii_hexdigit()),
        "the reference run printed no digest\n{}",
        expected.describe()
    );

    let dir = TempDir::new("python");
    let stats = dir.join("stats.json");
    let run = under(&["--memory-high", "64M", "--folio", "2M"], Some(&stats), &["python3", "-c", script]);
    run.assert_success();
    assert_eq!(run.stdout.trim(), digest, "the digest differs from the run without folioswap\n{}", run.describe());
    run.assert_total_positive("zswpout");
    run.assert_woken_at_idle_priority();
    // Its buffer is managed: what the interpreter keeps outside stays under the allowance.
    assert!(!run.stderr.contains(UNBOUNDED_WARNING), "a warning for a program whose memory is managed\n{}", run.describe());
}

/// Blocks of 1 MiB, such as CPython's arenas, under a 2 MiB cap (`--folio 2M`): each is a
/// region of 1 MiB folios (`FolioSize::fitting`), so writing one costs 1 MiB of resident
/// memory, not the whole 2 MiB THP it was rounded up to before (peak RSS 94 MB against 54
/// MB unmanaged for a CPython dict). Then, at a limit under the blocks' total, every byte
/// written is read back after they have swapped.
#[test]
fn mebibyte_blocks_cost_a_mebibyte() {
    let _serial = serial();
    require_tool("python3", "mebibyte_blocks_cost_a_mebibyte");
    // 48 private anonymous mmaps of 1 MiB, each page written with its block's and its own number;
    // VmRSS before and after the writes, then every page checked.
    let script = "import mmap, struct\n\
                  def rss():\n    return int([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1]) << 10\n\
                  blocks = [mmap.mmap(-1, 1 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) for _ in range(48)]\n\
                  before = rss()\n\
                  for b, m in enumerate(blocks):\n    \
                      for p in range(256):\n        m[p << 12:(p << 12) + 4096] = struct.pack('<II', b, p) * 512\n\
                  grown = rss() - before\n\
                  bad = sum(m[p << 12:(p << 12) + 4096] != struct.pack('<II', b, p) * 512 for b, m in enumerate(blocks) for p in range(256))\n\
                  print('GROWN', grown)\n\
                  print('BAD', bad)\n";
    let dir = TempDir::new("mebibyte");
    let stats = dir.join("stats.json");
    let run = under(&["--folio", "2M"], Some(&stats), &["python3", "-c", script]);
    run.assert_success();
    assert_eq!(run.figure("BAD "), 0, "pages read back differ\n{}", run.describe());
    // 48 MiB written; 8 MiB of slack for the interpreter's own pages touched meanwhile.
    let grown = run.figure("GROWN ");
    assert!(grown <= (48 + 8) << 20, "writing 48 blocks of 1 MiB grew RSS by {} MiB\n{}", grown >> 20, run.describe());
    let per_size = &run.stats()["per_process"][0]["stats"]["per_size"];
    assert!(per_size["1024kB"]["anon_fault_alloc"].as_u64().unwrap_or(0) >= 48, "the blocks were not 1 MiB folios\n{}", run.describe());

    let stats = dir.join("stats-limited.json");
    let run = under(&["--memory-high", "24M", "--folio", "2M"], Some(&stats), &["python3", "-c", script]);
    run.assert_success();
    assert_eq!(run.figure("BAD "), 0, "pages read back differ after swapping\n{}", run.describe());
    assert!(run.total("zswpout") + run.total("pswpout") > 0, "nothing swapped at 24M\n{}", run.describe());
    assert!(run.total("pgmajfault") > 0, "nothing swapped back in at 24M\n{}", run.describe());
}

/// A program writing 640 MiB that does not compress under `--memory-high 256M` and no
/// other flag: the pool is charged and what does not compress goes to a swap file made
/// on demand, so the program's peak RSS stays under the limit plus a stated slack. With
/// `--swap-file none` the engine says once that the limit cannot hold, and counts it.
#[test]
fn incompressible_data_stays_under_the_limit_with_no_flag() {
    let _serial = serial();
    require_tool("python3", "incompressible_data_stays_under_the_limit_with_no_flag");
    // Python's own memory before the big buffer, then the buffer filled with shake_256
    // output (incompressible), hashed; VmHWM is the peak RSS of the whole process.
    let script = |mib: u32| {
        format!(
            "import hashlib\n\
             def hwm():\n    return int([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]) << 10\n\
             base = hwm()\n\
             b = bytearray({mib} << 20)\n\
             for i in range({mib}):\n    b[i << 20:(i + 1) << 20] = hashlib.shake_256(i.to_bytes(4, 'little')).digest(1 << 20)\n\
             print(hashlib.sha256(b).hexdigest())\n\
             print('BASE', base)\n\
             print('PEAK', hwm())\n"
        )
    };
    let expected = direct(&["python3", "-c", &script(640)], &[]);
    expected.assert_success();
    let digest = expected.stdout.lines().next().unwrap_or_default().to_string();

    let dir = TempDir::new("incompressible");
    let stats = dir.join("stats.json");
    let run = under(&["--memory-high", "256M"], Some(&stats), &["python3", "-c", &script(640)]);
    run.assert_success();
    assert_eq!(run.stdout.lines().next().unwrap_or_default(), digest, "the digest differs\n{}", run.describe());
    run.assert_total_positive("pswpout");
    // The slack: the interpreter's own memory before the buffer (BASE) and 32 MiB for the
    // engine's tables, thread stacks and per-thread buffers, which no limit charges. The
    // peak passed limit + base by 4.3-31.9 MiB in six runs of this command at cebb59e
    // (debug build, 2 CPUs), and by 32 MiB once in CI, most likely from 2 MiB staging
    // slots that a move into the trash could not empty (EAGAIN, EBUSY): they were lost,
    // resident and uncharged. Since they are retried, 3.7-7.9 MiB in six runs. A pool left outside the limit
    // would pass it by hundreds of MiB.
    let (base, peak) = (run.figure("BASE "), run.figure("PEAK "));
    assert!(
        peak <= base + (256 << 20) + (32 << 20),
        "peak RSS {} MiB over 256M + base {} MiB + 32M slack\n{}",
        peak >> 20,
        base >> 20,
        run.describe()
    );

    let stats = dir.join("stats-none.json");
    let run = under(&["--memory-high", "64M", "--swap-file", "none"], Some(&stats), &["python3", "-c", &script(128)]);
    run.assert_success();
    assert_eq!(run.stderr.matches("folioswap: no swap file").count(), 1, "said once\n{}", run.describe());
    let overrun = run.stats()["per_process"][0]["stats"]["memory"]["limit_overrun_peak_bytes"].as_u64().unwrap_or(0);
    assert!(overrun > 0, "the overrun is counted\n{}", run.describe());
}

/// ~96 MiB of deterministic pseudo-random text lines.
fn write_lines(path: &Path, bytes: usize) {
    use std::io::Write;
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut out = io::BufWriter::with_capacity(1 << 20, fs::File::create(path).unwrap());
    let prefixes: [&[u8]; 4] = [b"", b"alpha ", b"alpha beta ", b"zeta "];
    let mut written = 0;
    let mut line = Vec::with_capacity(256);
    while written < bytes {
        line.clear();
        let r = next();
        line.extend_from_slice(prefixes[(r & 3) as usize]);
        let len = 4 + (r >> 8) as usize % 100;
        for _ in 0..len {
            let c = next() % 40;
            line.push(match c {
                0..=25 => b'a' + c as u8,
                26..=35 => b'0' + (c - 26) as u8,
                36 => b' ',
                37 => b'-',
                38 => b'A' + (next() % 26) as u8,
                _ => b'_',
            });
        }
        line.push(b'\n');
        out.write_all(&line).unwrap();
        written += line.len();
    }
    out.flush().unwrap();
}

/// GNU sort with a limit of about half its footprint (16 MiB of lines take 43 MiB resident
/// without a limit), in its big malloc'd buffer (sorting it is random access over the
/// whole buffer, so 4K folios), output compared with sort run directly. A smaller limit
/// only thrashes: 48 MiB of lines at 40M took a minute of the suite for a million faults.
#[test]
fn sort_under_run() {
    let _serial = serial();
    require_tool("sort", "sort_under_run");
    let dir = TempDir::new("sort");
    let input = dir.join("input.txt");
    let expected = dir.join("expected.txt");
    let output = dir.join("output.txt");
    let stats = dir.join("stats.json");
    write_lines(&input, 16 << 20);
    let env = [("LC_ALL", "C")];

    let reference = direct(&["sort", "-S", "128M", "-T", s(dir.path()), s(&input), "-o", s(&expected)], &env);
    reference.assert_success();

    let run = under_env(
        &["--memory-high", "24M", "--folio", "4K"],
        Some(&stats),
        &["sort", "-S", "128M", "-T", s(dir.path()), s(&input), "-o", s(&output)],
        &env,
    );
    run.assert_success();
    assert_same_file(&output, &expected, &|| run.describe());
    assert!(
        run.total("zswpout") > 0,
        "sort's buffer was not swapped out (is it malloc'd in one block >= 1 MiB and interposed?)\n{}",
        run.describe()
    );
}

/// A program killed by SIGKILL while its memory is in the swap file: the run reports
/// 128+9 and leaves nothing in the swap directory, given as a directory or as a file.
#[test]
fn crash_leaves_no_swap_file() {
    let _serial = serial();
    let prog = test_program("crash");
    for as_file in [false, true] {
        let swap_dir = TempDir::new("crash_swapdir");
        let spec = if as_file { format!("{}:256M", s(&swap_dir.join("swapfile"))) } else { format!("{}:256M", s(swap_dir.path())) };
        let run = under(&["--memory-high", "32M", "--swap-file", &spec, "--max-pool", "4M"], None, &[s(&prog), "128"]);
        run.assert_stdout_line("allocated");
        run.assert_code(128 + libc::SIGKILL);
        assert!(
            swap_dir.entries().is_empty(),
            "--swap-file {spec}: the directory still holds {:?} after the program was killed\n{}",
            swap_dir.entries(),
            run.describe()
        );
    }
}

/// The words of the warning `folioswap run` gives where memory_high did not bound the
/// program (`warn_if_unbounded`).
const UNBOUNDED_WARNING: &str = "of anonymous memory that folioswap did not manage";

/// A heap of blocks under the 1 MiB threshold stays outside the engine: the run says that
/// memory_high did not bound it (even with `--quiet`), once, with the amount, which the
/// stats carry as `unmanaged_anon_peak_bytes`; every word of the small blocks and of the
/// managed one reads back. A program that allocates nothing managed is told that the limit
/// bounded nothing.
#[test]
fn memory_outside_the_engine_is_reported() {
    let _serial = serial();
    let prog = test_program("small_blocks");
    let dir = TempDir::new("outside");
    let stats = dir.join("stats.json");
    // 96 blocks of 512 KiB (48 MiB) outside, 4 MiB managed, under a 16M limit.
    let run = under(&["--quiet", "--memory-high", "16M"], Some(&stats), &[s(&prog), "96", "4"]);
    run.assert_success();
    assert_eq!(run.figure("BAD "), 0, "words read back differ\n{}", run.describe());
    assert_eq!(
        run.stderr.matches(UNBOUNDED_WARNING).count(),
        1,
        "no single warning that memory_high did not bound the blocks\n{}",
        run.describe()
    );
    let outside = run.total("unmanaged_anon_peak_bytes");
    assert!(
        outside >= 48 << 20,
        "48 MiB of small blocks held at exit, {} MiB counted outside the engine\n{}",
        outside >> 20,
        run.describe()
    );

    let run = under(&["--memory-high", "16M"], None, &["true"]);
    run.assert_success();
    assert!(run.stderr.contains("memory_high bounded nothing"), "a run that managed nothing does not say so\n{}", run.describe());
}

/// Bad option values and a missing program fail with a message, and don't run anything.
#[test]
fn bad_options_fail_clearly() {
    let _serial = serial();
    for (opt, value) in [("--memory-high", "lots"), ("--folio", "3K")] {
        let run = under(&[opt, value], None, &["true"]);
        assert_ne!(run.code, 0, "{opt} {value} was accepted\n{}", run.describe());
        assert!(run.stderr.contains(value), "the error does not name the bad value {value:?}\n{}", run.describe());
    }
    for program in ["/nonexistent-folioswap-dir/no-such-program", "folioswap-no-such-program"] {
        let run = under(&["--quiet"], None, &[program]);
        run.assert_code(127);
        assert!(run.stderr.contains("no-such-program"), "the error does not name the missing program\n{}", run.describe());
    }
}

/// `FOLIOSWAP_LIB` names the library to preload, as the README says: the engine's own
/// check for unknown `FOLIOSWAP_*` variables leaves it alone, and a path that is not a
/// file is refused by name.
#[test]
fn folioswap_lib_names_the_library() {
    let _serial = serial();
    let exe = Path::new(folioswap());
    let lib = [exe.with_file_name("libfolioswap.so"), exe.with_file_name("deps").join("libfolioswap.so")]
        .into_iter()
        .find(|p| p.is_file())
        .expect("folioswap() checked that the library was built");
    let prog = test_program("alloc_fork");
    let stats = TempDir::new("folioswap_lib");
    let stats = stats.join("stats.json");
    let run = under_env(&["--memory-high", "64M"], Some(&stats), &[s(&prog), "128", "2"], &[("FOLIOSWAP_LIB", s(&lib))]);
    run.assert_success();
    run.assert_stdout_line("parent OK");
    run.assert_total_positive("zswpout");
    let run = under_env(&["--quiet"], None, &["true"], &[("FOLIOSWAP_LIB", "/nonexistent-folioswap-dir/libfolioswap.so")]);
    assert_ne!(run.code, 0, "{}", run.describe());
    assert!(run.stderr.contains("FOLIOSWAP_LIB=/nonexistent-folioswap-dir"), "{}", run.describe());
}

/// The usemem clone: two processes of 96 MiB, two rounds each, under one 64 MiB limit.
#[test]
fn usemem_clone_under_run() {
    let _serial = serial();
    let prog = usemem();
    let dir = TempDir::new("usemem");
    let stats = dir.join("stats.json");
    let run = under(&["--memory-high", "64M", "--folio", "64K"], Some(&stats), &[s(&prog), "-n", "2", "-r", "2", "-v", "96M"]);
    run.assert_success();
    let verified = run.stdout.lines().filter(|l| l.starts_with("verified ")).count();
    let speed = run.stdout.lines().filter(|l| l.ends_with(" KB/s")).count();
    assert_eq!((verified, speed), (2, 2), "expected two \"verified\" and two \"KB/s\" lines\n{}", run.describe());
    let processes = run.stats()["processes"].as_u64();
    assert!(processes.is_some_and(|n| n >= 2), "expected the stats of at least 2 processes\n{}", run.describe());
    run.assert_total_positive("zswpout");
}

/// Whether an unprivileged user can open a userfaultfd here (the sysctl, or a
/// world-accessible /dev/userfaultfd).
fn unprivileged_userfaultfd() -> bool {
    use std::os::unix::fs::PermissionsExt;
    let sysctl = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").map(|v| v.trim() == "1").unwrap_or(false);
    let dev = std::fs::metadata("/dev/userfaultfd").map(|m| m.permissions().mode() & 0o006 == 0o006).unwrap_or(false);
    sysctl || dev
}

// ---- as an ordinary user ---------------------------------------------------------------

/// The user these tests drop to.
const NOBODY: u32 = 65534;

/// A directory user nobody can use, removed when dropped: root's, mode 0755, on a disk
/// file system if /var/tmp is one, holding copies of the folioswap binary and
/// libfolioswap.so (the target directory may lie where nobody cannot reach) and of the
/// programs to run, and `work/`, owned by nobody, for what the programs write.
struct NobodyDir {
    dir: TempDir,
}

impl NobodyDir {
    fn new(name: &str) -> NobodyDir {
        use std::os::unix::fs::PermissionsExt;
        let var_tmp = Path::new("/var/tmp");
        let dir = TempDir::new_in(if var_tmp.is_dir() { var_tmp } else { Path::new("/tmp") }, name);
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let nb = NobodyDir { dir };
        let exe = Path::new(folioswap());
        let lib = [exe.with_file_name("libfolioswap.so"), exe.with_file_name("deps").join("libfolioswap.so")]
            .into_iter()
            .find(|p| p.is_file())
            .expect("folioswap() checked that the library exists");
        nb.add(exe);
        nb.add(&lib);
        let work = nb.work();
        fs::create_dir(&work).unwrap();
        std::os::unix::fs::chown(&work, Some(NOBODY), Some(NOBODY)).unwrap();
        fs::set_permissions(&work, fs::Permissions::from_mode(0o700)).unwrap();
        nb
    }

    /// A copy of `file` in the directory, mode 0755.
    fn add(&self, file: &Path) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let to = self.dir.join(file.file_name().unwrap().to_str().unwrap());
        fs::copy(file, &to).unwrap_or_else(|e| panic!("cannot copy {} to {}: {e}", file.display(), to.display()));
        fs::set_permissions(&to, fs::Permissions::from_mode(0o755)).unwrap();
        to
    }

    fn work(&self) -> PathBuf {
        self.dir.join("work")
    }

    /// `folioswap ARGS` as user nobody (no supplementary groups), in `work/`.
    fn folioswap<S: AsRef<OsStr>>(&self, args: &[S]) -> Command {
        let mut cmd = Command::new(self.dir.join("folioswap"));
        cmd.args(args).uid(NOBODY).gid(NOBODY).current_dir(self.work()).env("TMPDIR", "/tmp");
        cmd
    }
}

fn expected_uffd() -> &'static str {
    if unprivileged_userfaultfd() {
        "full"
    } else {
        "user-mode-only"
    }
}

fn require_root(test: &str) {
    // SAFETY: geteuid cannot fail.
    assert_eq!(unsafe { libc::geteuid() }, 0, "{test} needs root, to run folioswap as user nobody");
}

/// As user nobody, where userfaultfd is root-only, `folioswap run` no longer refuses: the
/// engine falls back to a user-mode-only userfaultfd, the run says so once on stderr
/// (not with --quiet), and the program runs managed, with or without --fallback.
#[test]
fn as_nobody_runs_user_mode_only() {
    let _serial = serial();
    require_root("as_nobody_runs_user_mode_only");
    let nb = NobodyDir::new("nobody");
    let user_mode_only = expected_uffd() == "user-mode-only";
    let cases: [&[&str]; 3] = [&[], &["--fallback"], &["--quiet"]];
    for extra in cases {
        let mut args = vec!["run", "--memory-high", "64M"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", "echo ran"]);
        let run = run_command(nb.folioswap(&args), None);
        run.assert_success();
        run.assert_stdout_line("ran");
        assert!(!run.stderr.contains("unmanaged"), "the program ran unmanaged\n{}", run.describe());
        let notice = run.stderr.contains("running user-mode-only");
        let quiet = extra.contains(&"--quiet");
        assert_eq!(notice, user_mode_only && !quiet, "the user-mode-only notice is wrong\n{}", run.describe());
    }
}

/// As user nobody: every I/O call family libfolioswap.so wraps, each on malloc'd memory
/// swapped out at the time of the call (tests/c/io_calls.c checks it with mincore), in
/// single calls larger than the library's chunk; everything read is checked and every
/// copy written compared byte for byte with the source. 64 KiB folios, and 2 MiB ones,
/// of which a 12 MiB limit holds so few that pages touched for a call are often evicted
/// again before it (the retries).
#[test]
fn io_calls_as_nobody() {
    let _serial = serial();
    require_root("io_calls_as_nobody");
    let nb = NobodyDir::new("io_calls");
    let prog = nb.add(&test_program("io_calls"));
    let work = nb.work();
    let stats = work.join("stats.json");
    for folio in ["64K", "2M"] {
        let run = run_command(
            // The pool alone (uncharged), as this test was sized for: with the pool charged
            // and a swap file, 12M leaves room for one 2M folio resident at a time.
            nb.folioswap(&[
                "run",
                "--memory-high",
                "12M",
                "--swap-file",
                "none",
                "--folio",
                folio,
                "--stats-json",
                s(&stats),
                "--",
                s(&prog),
                s(&work),
                "24",
            ]),
            Some(&stats),
        );
        run.assert_success();
        for family in [
            "read",
            "write",
            "pread/pwrite",
            "readv/writev/preadv/pwritev",
            "send/recv",
            "sendmsg/recvmsg",
            "sendto/recvfrom",
            "fread/fwrite",
        ] {
            let ok = format!("{family} OK");
            assert!(run.stdout.lines().any(|l| l.starts_with(&ok)), "{folio}: stdout has no {ok:?} line\n{}", run.describe());
        }
        let o_direct = run.stdout.lines().any(|l| l.starts_with("O_DIRECT OK"));
        assert!(
            o_direct || (on_tmpfs(&work) && run.stdout.contains("O_DIRECT unsupported")),
            "{folio}: no O_DIRECT line\n{}",
            run.describe()
        );
        for copy in ["copy", "copy-f"] {
            assert_same_file(&work.join(copy), &work.join("data"), &|| run.describe());
        }
        let per_process = run.stats()["per_process"].as_array().cloned().unwrap_or_default();
        assert!(!per_process.is_empty(), "{folio}: no process reported\n{}", run.describe());
        for p in &per_process {
            assert_eq!(p["stats"]["uffd"], expected_uffd(), "{folio}: the engine's userfaultfd mode\n{}", run.describe());
        }
        run.assert_total_positive("zswpout");
        if expected_uffd() == "user-mode-only" {
            run.assert_total_positive("syscall_prefault");
        }
    }
}

/// GNU sort as user nobody: it fread()s its input into its big malloc'd buffer, which
/// is swapped out under the limit (stdio reads straight into it); output compared with
/// sort run directly.
#[test]
fn sort_as_nobody() {
    let _serial = serial();
    require_root("sort_as_nobody");
    require_tool("sort", "sort_as_nobody");
    let nb = NobodyDir::new("sort");
    let work = nb.work();
    let (input, expected, output, stats) =
        (work.join("input.txt"), work.join("expected.txt"), work.join("output.txt"), work.join("stats.json"));
    write_lines(&input, 16 << 20);
    let env = [("LC_ALL", "C")];
    let reference = direct(&["sort", "-S", "128M", "-T", s(&work), s(&input), "-o", s(&expected)], &env);
    reference.assert_success();
    let mut cmd = nb.folioswap(&[
        "run",
        "--memory-high",
        "24M",
        "--folio",
        "4K",
        "--stats-json",
        s(&stats),
        "--",
        "sort",
        "-S",
        "128M",
        "-T",
        s(&work),
        s(&input),
        "-o",
        s(&output),
    ]);
    cmd.envs(env);
    let run = run_command(cmd, Some(&stats));
    run.assert_success();
    assert_same_file(&output, &expected, &|| run.describe());
    run.assert_total_positive("zswpout");
    if expected_uffd() == "user-mode-only" {
        run.assert_total_positive("syscall_prefault");
        // sort writes its output a line at a time with fwrite, through stdio's buffer:
        // only its large freads of the input need the buffer made resident first.
        let lines = std::fs::read(&input).unwrap().iter().filter(|&&b| b == b'\n').count() as u64;
        let prefaults = run.stats()["total"]["syscall_prefault"].as_u64().unwrap_or(0);
        assert!(
            prefaults < lines / 100,
            "{prefaults} prefaults for {lines} lines: small stdio writes were made resident\n{}",
            run.describe()
        );
    }
}

/// `folioswap bench usemem` as user nobody: it runs, verifies every word, and its JSON
/// names the userfaultfd mode (user-mode-only where userfaultfd is root-only).
#[test]
fn bench_usemem_as_nobody() {
    let _serial = serial();
    require_root("bench_usemem_as_nobody");
    let nb = NobodyDir::new("bench");
    let args = ["bench", "usemem", "--threads", "2", "--size", "32M", "--limit", "16M", "--folio", "64K", "--rounds", "2", "--json"];
    let run = run_command(nb.folioswap(&args), None);
    run.assert_success();
    let report: Value = serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("the report is not JSON: {e}\n{}", run.describe()));
    assert_eq!(report["verified"], true, "{}", run.describe());
    assert_eq!(report["config"]["uffd"], expected_uffd(), "{}", run.describe());
    assert_eq!(report["stats"]["uffd"], expected_uffd(), "{}", run.describe());
    assert!(report["stats"]["zswpout"].as_u64().is_some_and(|n| n > 0), "nothing was swapped out\n{}", run.describe());
}
