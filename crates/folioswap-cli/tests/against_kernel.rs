//! `folioswap bench usemem --against kernel`: both sides verified, and every system setting
//! it touches (THP and mTHP `enabled`, zram0, zswap's parameters, swap, the memory cgroup,
//! the swap file) the same afterwards as before: after a run, after Ctrl-C in the middle
//! of the kernel side, and after a refusal.
//!
//! These tests need root, zram (/sys/block/zram0, free), zswap, a memory cgroup controller
//! and no swap active; they fail saying which is missing. They run one at a time, bound
//! their memory (32 MiB regions), and never look at timings. Should folioswap leave a
//! setting changed, the test fails and [`SystemGuard`] puts the setting back anyway.

use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

const FOLIOSWAP: &str = env!("CARGO_BIN_EXE_folioswap");
const THP: &str = "/sys/kernel/mm/transparent_hugepage";
const ZRAM: &str = "/sys/block/zram0";
const ZSWAP: &str = "/sys/module/zswap/parameters";
const PREFIX: &str = "folioswap-kernel-";
const CGROUP_ROOTS: [&str; 3] = ["/sys/fs/cgroup/memory", "/sys/fs/cgroup", "/sys/fs/cgroup/unified"];

/// One test at a time: they all change (and restore) the same system settings.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn read(path: impl AsRef<Path>) -> String {
    fs::read_to_string(path.as_ref()).map(|s| s.trim().to_string()).unwrap_or_else(|e| format!("<{e}>"))
}

fn active_swaps() -> Vec<String> {
    read("/proc/swaps").lines().skip(1).filter_map(|l| l.split_whitespace().next()).map(str::to_string).collect()
}

/// What these tests need, checked before anything runs.
fn require(test: &str) {
    // SAFETY: geteuid cannot fail.
    assert_eq!(unsafe { libc::geteuid() }, 0, "{test} needs root (zram, swapon, a memory cgroup, THP settings)");
    assert!(Path::new(ZRAM).join("disksize").is_file(), "{test} needs zram: no /sys/block/zram0 (modprobe zram)");
    assert_eq!(read(Path::new(ZRAM).join("disksize")), "0", "{test} needs zram0 free (its disksize is not 0)");
    assert!(Path::new(ZSWAP).join("enabled").is_file(), "{test} needs zswap (/sys/module/zswap/parameters)");
    assert!(
        Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").is_file()
            || ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
                .iter()
                .any(|r| read(Path::new(r).join("cgroup.controllers")).contains("memory")),
        "{test} needs a memory cgroup controller (v1 or v2)"
    );
    let swaps = active_swaps();
    assert!(swaps.is_empty(), "{test} needs no swap active, but {swaps:?} is (/proc/swaps)");
}

/// Everything `--against kernel` may touch, as text.
#[derive(Debug, PartialEq, Eq, Clone)]
struct Snapshot(BTreeMap<String, String>);

impl Snapshot {
    fn take() -> Snapshot {
        let mut m = BTreeMap::new();
        m.insert("/proc/swaps".into(), active_swaps().join(" "));
        for f in ["disksize", "comp_algorithm"] {
            m.insert(format!("{ZRAM}/{f}"), read(Path::new(ZRAM).join(f)));
        }
        for e in fs::read_dir(ZSWAP).unwrap().flatten() {
            m.insert(e.path().display().to_string(), read(e.path()));
        }
        for f in ["enabled", "defrag"] {
            m.insert(format!("{THP}/{f}"), read(Path::new(THP).join(f)));
        }
        for e in fs::read_dir(THP).unwrap().flatten() {
            if e.file_name().to_string_lossy().starts_with("hugepages-") && e.path().join("enabled").is_file() {
                m.insert(e.path().join("enabled").display().to_string(), read(e.path().join("enabled")));
            }
        }
        for root in CGROUP_ROOTS {
            let control = Path::new(root).join("cgroup.subtree_control");
            if control.is_file() {
                m.insert(control.display().to_string(), read(&control));
            }
        }
        m.insert("left behind".into(), left_behind().iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" "));
        Snapshot(m)
    }
}

/// Cgroups and swap files named like the ones `--against kernel` makes.
fn left_behind() -> Vec<PathBuf> {
    let mut found = Vec::new();
    for dir in CGROUP_ROOTS.iter().chain(["/var/tmp"].iter()) {
        for e in fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with(PREFIX) {
                found.push(e.path());
            }
        }
    }
    found.sort();
    found
}

fn write(path: &str, value: &str) {
    if let Err(e) = fs::OpenOptions::new().write(true).open(path).and_then(|mut f| f.write_all(value.as_bytes())) {
        eprintln!("SystemGuard: cannot write {value:?} to {path}: {e}");
    }
}

/// The system's settings as they were when made; if they differ when dropped (a test
/// failed, or folioswap left something), they are put back as well as can be.
struct SystemGuard {
    before: Snapshot,
}

impl SystemGuard {
    fn new() -> SystemGuard {
        SystemGuard { before: Snapshot::take() }
    }
}

impl Drop for SystemGuard {
    fn drop(&mut self) {
        let now = Snapshot::take();
        if now == self.before {
            return;
        }
        eprintln!("SystemGuard: settings differ from before the test; restoring");
        for path in left_behind() {
            let procs = path.join("cgroup.procs");
            for pid in read(&procs).lines().filter_map(|l| l.parse::<i32>().ok()) {
                // SAFETY: kill has no memory effects.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let was_active = self.before.0["/proc/swaps"].split(' ').map(str::to_string).collect::<Vec<_>>();
        for swap in active_swaps() {
            if !was_active.contains(&swap) {
                let c = std::ffi::CString::new(swap.as_bytes()).unwrap();
                // SAFETY: a NUL-terminated path.
                unsafe { libc::swapoff(c.as_ptr()) };
            }
        }
        if self.before.0[&format!("{ZRAM}/disksize")] == "0" && read(Path::new(ZRAM).join("disksize")) != "0" {
            write(&format!("{ZRAM}/reset"), "1");
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for path in left_behind() {
            while path.exists() && Instant::now() < deadline {
                let _ = if path.is_dir() { fs::remove_dir(&path) } else { fs::remove_file(&path) };
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        for (path, value) in &self.before.0 {
            if now.0.get(path) != Some(value) && path.starts_with('/') && !path.starts_with("/proc") && !path.ends_with("disksize") {
                let value = if path.ends_with("subtree_control") {
                    "-memory".to_string()
                } else if value.contains('[') {
                    value[value.find('[').unwrap() + 1..value.find(']').unwrap()].to_string()
                } else {
                    value.clone()
                };
                write(path, &value);
            }
        }
    }
}

/// A child killed (with its process group) when dropped, should the test fail first.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            // SAFETY: kill has no memory effects; the child leads its own process group.
            unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
            let _ = self.0.wait();
        }
    }
}

fn folioswap(args: &[&str]) -> Command {
    let mut cmd = Command::new(FOLIOSWAP);
    cmd.args(args).stdin(Stdio::null()).env("TMPDIR", "/var/tmp").process_group(0);
    cmd
}

fn run(args: &[&str]) -> Output {
    let out = folioswap(args).output().expect("run folioswap");
    eprintln!("folioswap {}: {}\n{}", args.join(" "), out.status, String::from_utf8_lossy(&out.stderr));
    out
}

const SMALL: [&str; 10] = ["bench", "usemem", "--threads", "1", "--size", "32M", "--limit", "16M", "--against", "kernel"];

/// Small runs with zram (64K folios: mTHP settings changed; 4K random writes) and a swap
/// file (2M): the folioswap side verified, every setting as before, and the kernel side
/// either verified or reported as OOM-killed (status 1, no ratio): the kernel's hard
/// cgroup v1 limit kills where its reclaim falls behind, which depends on timing (a run
/// of the 4K random case against a swap file was killed once), so both outcomes are its
/// own; the kernel side's workload and verification are checked without a limit in
/// `plain_memory_runs_the_same_workload_and_verifies`. Not zswap: once turned on, the
/// kernel stops swapping large folios in whole until the next reboot
/// (`zswap_never_enabled()`), a change no test may leave behind.
#[test]
fn against_kernel_verifies_both_sides_and_restores_every_setting() {
    let _serial = serial();
    require("against_kernel_verifies_both_sides_and_restores_every_setting");
    let guard = SystemGuard::new();
    let cases: [(&str, &[&str]); 3] = [
        ("zram", &["--folio", "64K", "--rounds", "2"]),
        ("file", &["--folio", "2M", "--rounds", "2"]),
        ("zram", &["--folio", "4K", "--rounds", "2", "--pattern", "rand", "--writes", "1M"]),
    ];
    for (swap, extra) in cases {
        let mut args = SMALL.to_vec();
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--kernel-swap", swap, "--json"]);
        let out = run(&args);
        assert_eq!(Snapshot::take(), guard.before, "{swap}: a setting was not restored");
        let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
        if let Some(why) = v["kernel"]["failed"].as_str() {
            assert!(why.starts_with("OOM-killed"), "{swap}: the kernel side failed otherwise: {why}");
            assert_eq!(out.status.code(), Some(1), "{swap}: a failed side must give status 1");
            assert_eq!(v["folioswap"]["verified"], true, "{swap}: {}", v["folioswap"]);
            assert!(v["ratio"].is_null(), "{swap}: a ratio without kernel figures: {}", v["ratio"]);
            continue;
        }
        assert!(out.status.success(), "{swap}: {}", out.status);
        for side in ["folioswap", "kernel"] {
            assert_eq!(v[side]["verified"], true, "{swap}: {side} side not verified: {}", v[side]);
            assert!(v[side]["throughput_mb_s"].as_f64().unwrap() > 0.0, "{swap}: {side}");
            assert!(v[side]["wall_s"].as_f64().is_some() && v[side]["round_s"].is_array(), "{swap}: {side}");
            assert!(v[side]["stats"]["pswpout"].is_u64(), "{swap}: {side} has no stats.pswpout");
        }
        assert_eq!(v["kernel"]["words_verified"], v["folioswap"]["words_verified"], "{swap}");
        assert!(v["ratio"].as_f64().unwrap() > 0.0, "{swap}");
        let setup = &v["kernel_setup"];
        assert!(setup["swap"].as_str().unwrap().contains(swap), "{swap}: {setup}");
        assert_eq!(setup["limit_bytes"], 16 << 20, "{swap}");
        assert_eq!(v["kernel"]["config"]["folio"], v["folioswap"]["config"]["folio"], "{swap}");
        let advice = if extra[1] == "4K" { "MADV_NOHUGEPAGE" } else { "MADV_HUGEPAGE" };
        assert_eq!(setup["thp_advice"], advice, "{swap}");
        assert!(!setup["zswap"].as_str().unwrap_or("").starts_with("on"), "{swap}: zswap was turned on: {setup}");
    }
}

/// The kernel side's workload alone (`--plain-memory`, what `--against kernel` runs in its
/// cgroup), without a limit: the same words written and every one verified. Changes no
/// setting.
#[test]
fn plain_memory_runs_the_same_workload_and_verifies() {
    for pattern in ["seq", "rand", "hotcold"] {
        let args = [
            "bench",
            "usemem",
            "--plain-memory",
            "--threads",
            "2",
            "--size",
            "8M",
            "--rounds",
            "2",
            "--folio",
            "64K",
            "--pattern",
            pattern,
            "--json",
        ];
        let out = run(&args);
        assert!(out.status.success(), "{pattern}: {}", out.status);
        let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
        assert_eq!(v["verified"], true, "{pattern}: {v}");
        assert_eq!(v["mismatches"], 0, "{pattern}: {v}");
        assert_eq!(v["words_verified"], 2 * (8 << 20) / 8, "{pattern}: {v}");
    }
}

/// SIGINT while the kernel side runs: the child is killed, every setting restored, exit 130.
#[test]
fn ctrl_c_during_the_kernel_side_restores_and_exits_130() {
    let _serial = serial();
    require("ctrl_c_during_the_kernel_side_restores_and_exits_130");
    let guard = SystemGuard::new();
    // Random writes with a round time: every round lasts 2 s whatever the machine's speed.
    let mut args = SMALL.to_vec();
    args.extend_from_slice(&["--folio", "64K", "--rounds", "5", "--pattern", "rand", "--writes", "1G", "--round-time", "2"]);
    let mut child = ChildGuard(folioswap(&args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap());
    let name = format!("{PREFIX}{}", child.0.id());
    let deadline = Instant::now() + Duration::from_secs(300);
    let worker = loop {
        let procs = CGROUP_ROOTS.iter().map(|r| read(Path::new(r).join(&name).join("cgroup.procs"))).find(|p| !p.starts_with('<'));
        if let Some(pid) = procs.and_then(|p| p.lines().next().and_then(|l| l.parse::<i32>().ok())) {
            break pid;
        }
        assert!(child.0.try_wait().unwrap().is_none(), "folioswap ended before its kernel side was seen running");
        assert!(Instant::now() < deadline, "the kernel side did not start within 300 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!active_swaps().is_empty(), "the kernel side runs without swap");
    // SAFETY: kill has no memory effects; the signal goes to folioswap alone, not its child.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "folioswap did not exit within 120 s of SIGINT");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.0.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    eprintln!("{stderr}");
    assert_eq!(status.code(), Some(130), "{status} (signal {:?})", status.signal());
    assert!(stderr.contains("interrupted"), "{stderr}");
    // SAFETY: kill with signal 0 only checks that the process exists.
    assert!(unsafe { libc::kill(worker, 0) } != 0, "the kernel side's process {worker} still runs");
    assert_eq!(Snapshot::take(), guard.before, "a setting was not restored after SIGINT");
}

/// A swap file of `size` bytes, active while this lives.
struct TempSwap(PathBuf);

impl TempSwap {
    fn new(size: u64) -> TempSwap {
        let path = PathBuf::from(format!("/var/tmp/folioswap-test-swap-{}", std::process::id()));
        let f = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&path).unwrap();
        let swap = TempSwap(path);
        f.write_all_at(&vec![0u8; size as usize], 0).unwrap();
        let mut header = vec![0u8; 4096];
        header[1024..1028].copy_from_slice(&1u32.to_ne_bytes());
        header[1028..1032].copy_from_slice(&((size / 4096 - 1) as u32).to_ne_bytes());
        header[4086..].copy_from_slice(b"SWAPSPACE2");
        f.write_all_at(&header, 0).unwrap();
        f.sync_all().unwrap();
        let c = std::ffi::CString::new(swap.0.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path; lowest priority (the flags carry none).
        let r = unsafe { libc::swapon(c.as_ptr(), 0) };
        assert_eq!(r, 0, "swapon {}: {}", swap.0.display(), std::io::Error::last_os_error());
        swap
    }
}

impl Drop for TempSwap {
    fn drop(&mut self) {
        let c = std::ffi::CString::new(self.0.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        if unsafe { libc::swapoff(c.as_ptr()) } != 0 {
            eprintln!("swapoff {}: {}", self.0.display(), std::io::Error::last_os_error());
        }
        let _ = fs::remove_file(&self.0);
    }
}

/// Refusals, exit status 2, nothing changed: a swap device already active (a small swap
/// file of the test's own, always switched off again), not root, --kernel-swap alone.
#[test]
fn refuses_with_swap_active_or_without_root() {
    let _serial = serial();
    require("refuses_with_swap_active_or_without_root");
    let guard = SystemGuard::new();
    {
        let swap = TempSwap::new(8 << 20);
        let with_swap = Snapshot::take();
        let mut args = SMALL.to_vec();
        args.extend_from_slice(&["--folio", "64K", "--rounds", "1"]);
        let out = run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("already active") && stderr.contains(&*swap.0.to_string_lossy()), "{stderr}");
        assert_eq!(Snapshot::take(), with_swap);
    }
    assert_eq!(Snapshot::take(), guard.before);

    // As user nobody, from a copy of the binary nobody can reach.
    let dir = PathBuf::from(format!("/var/tmp/folioswap-test-nobody-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    let exe = dir.join("folioswap");
    fs::copy(FOLIOSWAP, &exe).unwrap();
    let out = Command::new(&exe).args(SMALL).args(["--rounds", "1"]).uid(65534).gid(65534).current_dir("/").stdin(Stdio::null()).output();
    let _ = fs::remove_dir_all(&dir);
    let out = out.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("needs root"), "{stderr}");

    let out = run(&["bench", "usemem", "--kernel-swap", "zram"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--against"));
    assert_eq!(Snapshot::take(), guard.before);
}
