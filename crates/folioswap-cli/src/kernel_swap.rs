//! `folioswap bench usemem --against kernel`: the yardstick, the kernel's own swap.
//!
//! After the usual run under the engine, the same workload runs on plain anonymous memory
//! in a child process (this executable again, `--plain-memory`, hidden) placed in a memory
//! cgroup with the same limit, with the kernel's swap set up for it: zram (lz4), a swap
//! file in /var/tmp, or that file behind zswap (lz4); THP/mTHP set so that the kernel
//! uses the run's folio size. Both sides are verified and printed side by side.
//!
//! [`KernelSwap`] records every setting before it changes it and undoes them in reverse:
//! in [`KernelSwap::restore`] (which reports what failed) and, should that not be reached,
//! in `Drop`. SIGINT, SIGTERM and SIGHUP only set a flag while the kernel side is set up
//! and runs: the parent then kills the child, restores and exits with 128 + the signal
//! (130 for Ctrl-C).

use crate::usemem::{self, KernelSwapKind, Outcome, UsememArgs, Workload};
use folioswap::{format_bytes, FolioSize};
use serde::Serialize;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

const THP: &str = "/sys/kernel/mm/transparent_hugepage";
const ZRAM: &str = "/sys/block/zram0";
const ZRAM_DEV: &str = "/dev/zram0";
const ZSWAP: &str = "/sys/module/zswap/parameters";
const SWAP_DIR: &str = "/var/tmp";
/// The cgroup, and the swap file, are named with this and the parent's pid.
pub const NAME_PREFIX: &str = "folioswap-kernel-";
const SWAP_PRIORITY: i32 = 100;
const SWAP_FLAG_PREFER: i32 = 0x8000;
const SWAP_FLAG_PRIO_MASK: i32 = 0x7fff;
const TMPFS_MAGIC: i64 = 0x0102_1994;
const PAGE: u64 = 4096;

// ---- settings files ---------------------------------------------------------------------

/// A setting's value: the bracketed choice of files like THP's `always [madvise] never`,
/// else the trimmed contents.
fn parse_setting(text: &str) -> String {
    match (text.find('['), text.find(']')) {
        (Some(a), Some(b)) if a < b => text[a + 1..b].to_string(),
        _ => text.trim().to_string(),
    }
}

fn read_setting(path: &Path) -> Result<String, String> {
    fs::read_to_string(path).map(|t| parse_setting(&t)).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// Write an existing file (sysfs, cgroup), creating nothing.
fn write_file(path: &Path, value: &str) -> Result<(), String> {
    fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(|e| format!("cannot write {value:?} to {}: {e}", path.display()))
}

/// The swap areas in use, as /proc/swaps names them.
pub(crate) fn active_swaps() -> Result<Vec<String>, String> {
    let text = fs::read_to_string("/proc/swaps").map_err(|e| format!("cannot read /proc/swaps: {e}"))?;
    Ok(text.lines().skip(1).filter_map(|l| l.split_whitespace().next()).map(str::to_string).collect())
}

// ---- cgroups ----------------------------------------------------------------------------

#[derive(Clone, Debug, Serialize)]
struct CgroupSpec {
    version: u8,
    /// Where the run's cgroup is made.
    root: PathBuf,
    limit_file: &'static str,
}

/// The memory controller: v1 at /sys/fs/cgroup/memory, else v2 at /sys/fs/cgroup (or
/// /sys/fs/cgroup/unified in hybrid setups).
fn detect_cgroup() -> Result<CgroupSpec, String> {
    let v1 = Path::new("/sys/fs/cgroup/memory");
    if v1.join("memory.limit_in_bytes").is_file() {
        return Ok(CgroupSpec { version: 1, root: v1.to_path_buf(), limit_file: "memory.limit_in_bytes" });
    }
    for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        let controllers = fs::read_to_string(Path::new(root).join("cgroup.controllers")).unwrap_or_default();
        if controllers.split_whitespace().any(|c| c == "memory") {
            return Ok(CgroupSpec { version: 2, root: PathBuf::from(root), limit_file: "memory.max" });
        }
    }
    Err("no memory cgroup controller (neither v1 /sys/fs/cgroup/memory nor v2 /sys/fs/cgroup with memory in cgroup.controllers)".into())
}

/// A counter line `NAME N` of a flat-keyed cgroup file.
fn keyed(path: &Path, name: &str) -> Option<u64> {
    let text = fs::read_to_string(path).ok()?;
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

// ---- THP --------------------------------------------------------------------------------

/// Whether a size's `enabled` value gives THPs of that size to a MADV_HUGEPAGE mapping,
/// with the top-level `enabled` being `top`.
fn gives_madvised(value: &str, top: &str) -> bool {
    match value {
        "always" | "madvise" => true,
        "inherit" => top == "always" || top == "madvise",
        _ => false,
    }
}

/// The per-size `enabled` values to write so that a MADV_HUGEPAGE mapping gets folios of
/// `folio` (a kernel label, `64kB`) and of no other size: that size on (`madvise`) if it is
/// not already, every other that would apply `never`.
fn thp_plan(top: &str, sizes: &[(String, String)], folio: &str) -> Vec<(String, &'static str)> {
    let mut plan = Vec::new();
    for (label, value) in sizes {
        let on = gives_madvised(value, top);
        if label == folio && !on {
            plan.push((label.clone(), "madvise"));
        } else if label != folio && on {
            plan.push((label.clone(), "never"));
        }
    }
    plan
}

/// The sizes with an `enabled` file (`64kB`, …) and their values.
fn thp_sizes() -> Vec<(String, String)> {
    let mut sizes: Vec<(u64, String, String)> = fs::read_dir(THP)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let label = name.strip_prefix("hugepages-")?.to_string();
            let kb: u64 = label.strip_suffix("kB")?.parse().ok()?;
            let value = read_setting(&e.path().join("enabled")).ok()?;
            Some((kb, label, value))
        })
        .collect();
    sizes.sort();
    sizes.into_iter().map(|(_, l, v)| (l, v)).collect()
}

/// MADV_HUGEPAGE where the kernel has anonymous THPs of the folio's size, else
/// MADV_NOHUGEPAGE (4K, or a size like 8K the kernel lacks).
fn thp_advice(folio: FolioSize) -> libc::c_int {
    let enabled = Path::new(THP).join(format!("hugepages-{}", folio.kernel_label())).join("enabled");
    if folio != FolioSize::K4 && enabled.is_file() {
        libc::MADV_HUGEPAGE
    } else {
        libc::MADV_NOHUGEPAGE
    }
}

fn advice_name(advice: libc::c_int) -> &'static str {
    if advice == libc::MADV_HUGEPAGE {
        "MADV_HUGEPAGE"
    } else {
        "MADV_NOHUGEPAGE"
    }
}

// ---- swap areas -------------------------------------------------------------------------

/// A version-1 swap header (what mkswap writes) for an area of `size` bytes.
fn swap_header(size: u64) -> Vec<u8> {
    let mut h = vec![0u8; PAGE as usize];
    h[1024..1028].copy_from_slice(&1u32.to_ne_bytes());
    h[1028..1032].copy_from_slice(&((size / PAGE - 1) as u32).to_ne_bytes());
    h[PAGE as usize - 10..].copy_from_slice(b"SWAPSPACE2");
    h
}

fn write_swap_header(path: &Path, size: u64) -> Result<(), String> {
    let f = fs::OpenOptions::new().write(true).open(path).map_err(|e| format!("mkswap {}: {e}", path.display()))?;
    f.write_all_at(&swap_header(size), 0).and_then(|()| f.sync_all()).map_err(|e| format!("mkswap {}: {e}", path.display()))
}

fn c_path(path: &Path) -> Result<CString, String> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| format!("{}: NUL in path", path.display()))
}

fn swapon(path: &Path, priority: i32) -> Result<(), String> {
    let c = c_path(path)?;
    // SAFETY: a NUL-terminated path alive across the call.
    if unsafe { libc::swapon(c.as_ptr(), SWAP_FLAG_PREFER | (priority & SWAP_FLAG_PRIO_MASK)) } != 0 {
        return Err(format!("swapon {}: {}", path.display(), io::Error::last_os_error()));
    }
    Ok(())
}

fn swapoff(path: &Path) -> Result<(), String> {
    let active = active_swaps()?;
    if !active.iter().any(|s| Path::new(s) == path) {
        return Ok(());
    }
    let c = c_path(path)?;
    // SAFETY: as in swapon.
    if unsafe { libc::swapoff(c.as_ptr()) } != 0 {
        return Err(format!("swapoff {}: {}", path.display(), io::Error::last_os_error()));
    }
    Ok(())
}

/// Allocate `size` bytes of `file` (zeros written where fallocate is not supported).
fn allocate(file: &fs::File, size: u64) -> Result<(), String> {
    // SAFETY: fallocate on a file descriptor we own.
    let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, size as libc::off_t) };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
        return Err(format!("fallocate: {e}"));
    }
    let zeros = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < size {
        let n = (size - at).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..n], at).map_err(|e| format!("writing zeros: {e}"))?;
        at += n as u64;
    }
    Ok(())
}

// ---- the setup and its undoing ----------------------------------------------------------

/// One thing to undo.
#[derive(Debug)]
enum Undo {
    /// Write `value` back, unless the file holds it already.
    Setting {
        path: PathBuf,
        value: String,
    },
    /// `-memory` into a v2 cgroup's `cgroup.subtree_control`.
    SubtreeControl(PathBuf),
    ZramReset,
    Swapoff(PathBuf),
    RemoveFile(PathBuf),
    /// Kill what runs in the cgroup, then remove it.
    Cgroup(PathBuf),
}

fn undo(u: &Undo) -> Result<(), String> {
    match u {
        Undo::Setting { path, value } => {
            if read_setting(path)? != *value {
                write_file(path, value)?;
            }
            Ok(())
        }
        Undo::SubtreeControl(root) => write_file(&root.join("cgroup.subtree_control"), "-memory"),
        Undo::ZramReset => {
            // Busy for a moment after swapoff on some kernels.
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match write_file(&Path::new(ZRAM).join("reset"), "1") {
                    Ok(()) => return Ok(()),
                    Err(e) if Instant::now() >= deadline => return Err(e),
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        }
        Undo::Swapoff(path) => swapoff(path),
        Undo::RemoveFile(path) => match fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(format!("cannot remove {}: {e}", path.display())),
            _ => Ok(()),
        },
        Undo::Cgroup(dir) => remove_cgroup(dir),
    }
}

fn remove_cgroup(dir: &Path) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if !dir.exists() {
            return Ok(());
        }
        let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        let pids: Vec<i32> = procs.lines().filter_map(|l| l.trim().parse().ok()).collect();
        for &pid in &pids {
            // SAFETY: kill has no memory effects; these are the processes of our cgroup.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let err = if pids.is_empty() {
            match fs::remove_dir(dir) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) => format!("cannot remove cgroup {}: {e}", dir.display()),
            }
        } else {
            format!("cgroup {} still has processes {pids:?}", dir.display())
        };
        if Instant::now() >= deadline {
            return Err(err);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A setting written for the run: what it held before, what it was set to.
#[derive(Debug, Serialize)]
struct Change {
    path: String,
    before: String,
    after: String,
}

/// What the kernel side runs with (`kernel_setup` in the JSON).
#[derive(Debug, Default, Serialize)]
pub(crate) struct Setup {
    swap: String,
    device: String,
    device_bytes: u64,
    priority: i32,
    /// zram's comp_algorithm or zswap's compressor.
    #[serde(skip_serializing_if = "Option::is_none")]
    compressor: Option<String>,
    zswap: String,
    cgroup: String,
    cgroup_version: u8,
    limit_file: String,
    limit_bytes: u64,
    /// The advice the workload gives its memory.
    thp_advice: String,
    /// The size's own `enabled` setting during the run (after any change).
    #[serde(skip_serializing_if = "Option::is_none")]
    thp_size_enabled: Option<String>,
    /// Every file written, in order; each was restored afterwards.
    changed: Vec<Change>,
}

/// The kernel's swap and a memory cgroup, set up for one run and undone after.
pub(crate) struct KernelSwap {
    kind: KernelSwapKind,
    undo: Vec<Undo>,
    setup: Setup,
    cgroup: Option<(PathBuf, CgroupSpec)>,
}

impl KernelSwap {
    pub(crate) fn new(kind: KernelSwapKind) -> KernelSwap {
        KernelSwap { kind, undo: Vec::new(), setup: Setup::default(), cgroup: None }
    }

    /// Set `path` to `value`, recording what it held first; nothing if it holds it.
    fn set(&mut self, path: &Path, value: &str) -> Result<(), String> {
        let before = read_setting(path)?;
        if before == value {
            return Ok(());
        }
        self.undo.push(Undo::Setting { path: path.to_path_buf(), value: before.clone() });
        write_file(path, value)?;
        self.setup.changed.push(Change { path: path.display().to_string(), before, after: value.to_string() });
        Ok(())
    }

    /// Everything for a run of `total` bytes of folios of `folio` under `limit`.
    pub(crate) fn set_up(&mut self, folio: FolioSize, limit: u64, total: u64) -> Result<(), String> {
        let spec = preflight(self.kind)?;
        self.thp(folio)?;
        self.zswap()?;
        match self.kind {
            KernelSwapKind::Zram => self.zram(total)?,
            KernelSwapKind::File | KernelSwapKind::Zswap => self.swap_file(total)?,
        }
        self.make_cgroup(spec, limit)
    }

    fn thp(&mut self, folio: FolioSize) -> Result<(), String> {
        let advice = thp_advice(folio);
        self.setup.thp_advice = advice_name(advice).into();
        if advice != libc::MADV_HUGEPAGE {
            return Ok(());
        }
        let top = read_setting(&Path::new(THP).join("enabled"))?;
        let sizes = thp_sizes();
        for (label, value) in thp_plan(&top, &sizes, folio.kernel_label()) {
            self.set(&Path::new(THP).join(format!("hugepages-{label}")).join("enabled"), value)?;
        }
        self.setup.thp_size_enabled =
            read_setting(&Path::new(THP).join(format!("hugepages-{}", folio.kernel_label())).join("enabled")).ok();
        Ok(())
    }

    /// zswap on (lz4) for `zswap`; off for the others, which swap to their device alone.
    fn zswap(&mut self) -> Result<(), String> {
        let enabled = Path::new(ZSWAP).join("enabled");
        if self.kind == KernelSwapKind::Zswap {
            let compressor = Path::new(ZSWAP).join("compressor");
            // zswap takes its compressors from the crypto API, which may lack lz4 where
            // zram (with its own backends) has it: then zswap keeps the one it has.
            if let Err(e) = self.set(&compressor, "lz4") {
                eprintln!("folioswap: zswap cannot use lz4 here ({e}); the kernel side keeps zswap's compressor");
            }
            if read_setting(&enabled)? != "Y" {
                // The setting comes back; the kernel's memory of it does not.
                eprintln!(
                    "folioswap: note: turning zswap on (it is turned off again afterwards) also stops the kernel from \
                     swapping large folios in whole until the next reboot (mm/memory.c: zswap_never_enabled()): later \
                     kernel-side runs with 16K to 1M folios then swap in 4 KiB pages"
                );
            }
            self.set(&enabled, "Y")?;
            let used = read_setting(&compressor)?;
            self.setup.zswap = format!("on ({used})");
            self.setup.compressor = Some(used);
        } else if enabled.is_file() {
            self.set(&enabled, "N")?;
            self.setup.zswap = "off".into();
        } else {
            self.setup.zswap = "absent".into();
        }
        Ok(())
    }

    fn zram(&mut self, total: u64) -> Result<(), String> {
        let size = (2 * total).max(64 << 20).next_multiple_of(PAGE);
        self.set(&Path::new(ZRAM).join("comp_algorithm"), "lz4")?;
        self.undo.push(Undo::ZramReset);
        write_file(&Path::new(ZRAM).join("disksize"), &size.to_string())?;
        write_swap_header(Path::new(ZRAM_DEV), size)?;
        self.undo.push(Undo::Swapoff(ZRAM_DEV.into()));
        swapon(Path::new(ZRAM_DEV), SWAP_PRIORITY)?;
        self.setup.swap = "zram".into();
        self.setup.device = ZRAM_DEV.into();
        self.setup.device_bytes = size;
        self.setup.priority = SWAP_PRIORITY;
        self.setup.compressor = Some("lz4".into());
        Ok(())
    }

    fn swap_file(&mut self, total: u64) -> Result<(), String> {
        let size = (total + (64 << 20)).next_multiple_of(1 << 20);
        let path = Path::new(SWAP_DIR).join(format!("{NAME_PREFIX}{}.swap", std::process::id()));
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| format!("cannot create the swap file {}: {e}", path.display()))?;
        self.undo.push(Undo::RemoveFile(path.clone()));
        allocate(&file, size).map_err(|e| format!("swap file {}: {e}", path.display()))?;
        drop(file);
        write_swap_header(&path, size)?;
        self.undo.push(Undo::Swapoff(path.clone()));
        swapon(&path, SWAP_PRIORITY)?;
        self.setup.swap = if self.kind == KernelSwapKind::Zswap { "zswap + file" } else { "file" }.into();
        self.setup.device = path.display().to_string();
        self.setup.device_bytes = size;
        self.setup.priority = SWAP_PRIORITY;
        Ok(())
    }

    fn make_cgroup(&mut self, spec: CgroupSpec, limit: u64) -> Result<(), String> {
        if spec.version == 2 {
            let control = spec.root.join("cgroup.subtree_control");
            let enabled = fs::read_to_string(&control).map_err(|e| format!("cannot read {}: {e}", control.display()))?;
            if !enabled.split_whitespace().any(|c| c == "memory") {
                self.undo.push(Undo::SubtreeControl(spec.root.clone()));
                write_file(&control, "+memory")?;
                self.setup.changed.push(Change {
                    path: control.display().to_string(),
                    before: enabled.trim().into(),
                    after: "+memory".into(),
                });
            }
        }
        let dir = spec.root.join(format!("{NAME_PREFIX}{}", std::process::id()));
        fs::create_dir(&dir).map_err(|e| format!("cannot create the cgroup {}: {e}", dir.display()))?;
        self.undo.push(Undo::Cgroup(dir.clone()));
        write_file(&dir.join(spec.limit_file), &limit.to_string())?;
        self.setup.cgroup = dir.display().to_string();
        self.setup.cgroup_version = spec.version;
        self.setup.limit_file = spec.limit_file.into();
        self.setup.limit_bytes = limit;
        self.cgroup = Some((dir, spec));
        Ok(())
    }

    /// OOM kills in the cgroup so far.
    fn oom_kills(&self) -> u64 {
        match &self.cgroup {
            Some((dir, spec)) if spec.version == 1 => keyed(&dir.join("memory.oom_control"), "oom_kill").unwrap_or(0),
            Some((dir, _)) => keyed(&dir.join("memory.events"), "oom_kill").unwrap_or(0),
            None => 0,
        }
    }

    /// The cgroup's peak memory use, where the kernel keeps it.
    fn peak_bytes(&self) -> Option<u64> {
        let (dir, spec) = self.cgroup.as_ref()?;
        let file = if spec.version == 1 { "memory.max_usage_in_bytes" } else { "memory.peak" };
        fs::read_to_string(dir.join(file)).ok()?.trim().parse().ok()
    }

    /// Undo everything, newest first; every undo is tried, the failures are reported.
    pub(crate) fn restore(&mut self) -> Result<(), String> {
        let mut errors = Vec::new();
        while let Some(u) = self.undo.pop() {
            if let Err(e) = undo(&u) {
                errors.push(e);
            }
        }
        self.cgroup = None;
        if errors.is_empty() {
            Ok(())
        } else {
            Err(format!("could not restore every setting: {}", errors.join("; ")))
        }
    }
}

impl Drop for KernelSwap {
    fn drop(&mut self) {
        if !self.undo.is_empty() {
            if let Err(e) = self.restore() {
                eprintln!("folioswap: RESTORE FAILED: {e}");
            }
        }
    }
}

/// Refuse, saying why, unless the kernel side can run here: root, no swap active, the
/// device free, a memory cgroup controller.
fn preflight(kind: KernelSwapKind) -> Result<CgroupSpec, String> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err("refusing: --against kernel needs root: it sets up the kernel's swap (zram or a swap file, swapon), \
             a memory cgroup and THP settings (all restored afterwards)"
            .into());
    }
    let swaps = active_swaps()?;
    if !swaps.is_empty() {
        return Err(format!(
            "refusing: a swap device is already active ({}, see /proc/swaps); the kernel side must have its own swap alone: swapoff it first",
            swaps.join(", ")
        ));
    }
    match kind {
        KernelSwapKind::Zram => {
            if !Path::new(ZRAM).join("disksize").is_file() {
                return Err("no /sys/block/zram0: zram is not built in or loaded (modprobe zram), or use --kernel-swap file".into());
            }
            let size = read_setting(&Path::new(ZRAM).join("disksize"))?;
            if size != "0" {
                return Err(format!("refusing: zram0 is in use (disksize {size}); reset it or use --kernel-swap file"));
            }
        }
        KernelSwapKind::File | KernelSwapKind::Zswap => {
            let c = c_path(Path::new(SWAP_DIR))?;
            // SAFETY: statfs fills the struct it is given.
            let mut st: libc::statfs = unsafe { std::mem::zeroed() };
            // SAFETY: a NUL-terminated path and a live, writable struct.
            if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
                return Err(format!("{SWAP_DIR}: {}", io::Error::last_os_error()));
            }
            if st.f_type as i64 == TMPFS_MAGIC {
                return Err(format!("{SWAP_DIR} is tmpfs: a swap file needs a disk-backed file system"));
            }
            if kind == KernelSwapKind::Zswap && !Path::new(ZSWAP).join("enabled").is_file() {
                return Err("no zswap in this kernel (/sys/module/zswap/parameters/enabled)".into());
            }
        }
    }
    detect_cgroup()
}

// ---- signals ----------------------------------------------------------------------------

static CAUGHT: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    CAUGHT.store(sig, Ordering::SeqCst);
}

/// SIGINT, SIGTERM and SIGHUP only noted while this lives (the previous handlers after).
struct Signals {
    old: Vec<(libc::c_int, libc::sigaction)>,
}

impl Signals {
    fn catch() -> Signals {
        CAUGHT.store(0, Ordering::SeqCst);
        let mut old = Vec::new();
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: a zeroed sigaction is valid; the handler only stores to an atomic,
            // which is async-signal-safe.
            unsafe {
                let mut act: libc::sigaction = std::mem::zeroed();
                act.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
                act.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut act.sa_mask);
                let mut prev: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, &act, &mut prev) == 0 {
                    old.push((sig, prev));
                }
            }
        }
        Signals { old }
    }

    fn caught() -> Option<i32> {
        Some(CAUGHT.load(Ordering::SeqCst)).filter(|&s| s != 0)
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        for (sig, prev) in &self.old {
            // SAFETY: reinstalls the action sigaction returned for this signal.
            unsafe { libc::sigaction(*sig, prev, std::ptr::null_mut()) };
        }
    }
}

// ---- the kernel side: plain memory in a child process -----------------------------------

/// A private anonymous mapping of exactly `len` bytes at an `align`ed address.
struct Anon {
    base: *mut u8,
    len: usize,
}

impl Anon {
    fn new(len: usize, align: usize, advice: libc::c_int) -> Result<Anon, String> {
        let start = folioswap::map_aligned(len, align)
            .map_err(|errno| format!("mmap of {}: {}", format_bytes((len + align) as u64), io::Error::from_raw_os_error(errno)))?;
        let anon = Anon { base: start as *mut u8, len };
        // SAFETY: advice about our own mapping.
        if unsafe { libc::madvise(start as *mut libc::c_void, len, advice) } != 0 && advice == libc::MADV_HUGEPAGE {
            return Err(format!("madvise(MADV_HUGEPAGE): {}", io::Error::last_os_error()));
        }
        Ok(anon)
    }

    fn words_mut(&mut self) -> &mut [u64] {
        // SAFETY: `len` bytes, page aligned, readable and writable, owned by self; any
        // bytes are valid u64s.
        unsafe { std::slice::from_raw_parts_mut(self.base as *mut u64, self.len / 8) }
    }

    fn words(&self) -> &[u64] {
        // SAFETY: as in words_mut.
        unsafe { std::slice::from_raw_parts(self.base as *const u64, self.len / 8) }
    }
}

impl Drop for Anon {
    fn drop(&mut self) {
        // SAFETY: the mapping this owns; no slice of it outlives self.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// The /proc/vmstat counters the kernel side reports (deltas over the rounds), named as
/// the engine names its own.
const VMSTAT: &[&str] = &[
    "pgfault",
    "pgmajfault",
    "pswpin",
    "pswpout",
    "zswpin",
    "zswpout",
    "zswpwb",
    "swap_ra",
    "swap_ra_hit",
    "thp_swpout",
    "thp_swpout_fallback",
    "thp_fault_alloc",
    "thp_fault_fallback",
    "thp_split_page",
    "pgsteal_kswapd",
    "pgsteal_direct",
    "oom_kill",
    "workingset_refault_anon",
    "workingset_activate_anon",
];

/// System-wide counters: /proc/vmstat and every `hugepages-*/stats/*`.
struct Counters {
    vm: BTreeMap<String, u64>,
    per_size: BTreeMap<String, BTreeMap<String, u64>>,
}

impl Counters {
    fn read() -> Counters {
        let vm = fs::read_to_string("/proc/vmstat")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_string(), v.trim().parse().ok()?))
            })
            .collect();
        let mut per_size = BTreeMap::new();
        for entry in fs::read_dir(THP).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(label) = name.strip_prefix("hugepages-") else { continue };
            let mut stats = BTreeMap::new();
            for stat in fs::read_dir(entry.path().join("stats")).into_iter().flatten().flatten() {
                if let Some(n) = fs::read_to_string(stat.path()).ok().and_then(|t| t.trim().parse().ok()) {
                    stats.insert(stat.file_name().to_string_lossy().into_owned(), n);
                }
            }
            per_size.insert(label.to_string(), stats);
        }
        Counters { vm, per_size }
    }

    /// The deltas since `before`, as the engine's `stats` object spells them (sizes with no
    /// activity left out).
    fn since(&self, before: &Counters) -> Value {
        let delta = |now: &BTreeMap<String, u64>, then: &BTreeMap<String, u64>, k: &str| {
            now.get(k).copied().unwrap_or(0).saturating_sub(then.get(k).copied().unwrap_or(0))
        };
        let mut out = Map::new();
        for &k in VMSTAT {
            out.insert(k.into(), delta(&self.vm, &before.vm, k).into());
        }
        let allocstall: u64 = self.vm.keys().filter(|k| k.starts_with("allocstall_")).map(|k| delta(&self.vm, &before.vm, k)).sum();
        out.insert("allocstall".into(), allocstall.into());
        let empty = BTreeMap::new();
        let mut per_size = Map::new();
        for (label, stats) in &self.per_size {
            let then = before.per_size.get(label).unwrap_or(&empty);
            let d: Map<String, Value> =
                stats.keys().filter(|k| !k.starts_with("nr_")).map(|k| (k.clone(), delta(stats, then, k).into())).collect();
            if d.values().any(|v| v.as_u64() != Some(0)) {
                per_size.insert(label.clone(), Value::Object(d));
            }
        }
        out.insert("per_size".into(), Value::Object(per_size));
        Value::Object(out)
    }
}

#[derive(Serialize)]
struct PlainConfig {
    threads: usize,
    size: u64,
    limit: String,
    folio: String,
    rounds: u32,
    pattern: usemem::Pattern,
    thp_advice: &'static str,
}

#[derive(Serialize)]
struct PlainReport {
    #[serde(flatten)]
    outcome: Outcome,
    swap_bytes: u64,
    config: PlainConfig,
    /// System-wide /proc/vmstat and per-size THP counters over the rounds.
    stats: Value,
}

/// `--plain-memory`: the workload on plain anonymous memory (the kernel side's child),
/// one JSON object on stdout.
pub(crate) fn run_plain(args: &UsememArgs) -> Result<bool, String> {
    let folio: FolioSize = args.folio.as_deref().unwrap_or("4K").parse().map_err(|e: folioswap::SizeError| e.to_string())?;
    let advice = thp_advice(folio);
    let len = (args.size as usize).next_multiple_of(folio.bytes());
    let mut memories: Vec<Anon> = (0..args.threads).map(|_| Anon::new(len, folio.bytes(), advice)).collect::<Result<_, _>>()?;
    memories.sort_by_key(|m| m.base as usize);
    let workload = Workload::new(args, len as u64 / 8)?;
    let before = Counters::read();
    let rounds = usemem::write_rounds(memories.iter_mut().map(Anon::words_mut).collect(), &workload);
    let stats = Counters::read().since(&before);
    let mut ranges: Vec<(usize, usize)> = memories.iter().map(|m| (m.base as usize, m.len)).collect();
    ranges.sort_unstable();
    let folioswap::SmapsSums { rss_bytes: rss, anon_huge_bytes: anon_huge, swap_bytes: swap } =
        folioswap::smaps_of(&ranges).unwrap_or_default();
    let outcome = usemem::verify_rounds(memories.iter().map(Anon::words).collect(), &workload, rounds, anon_huge, rss);
    let report = PlainReport {
        outcome,
        swap_bytes: swap,
        config: PlainConfig {
            threads: args.threads,
            size: len as u64,
            limit: args.limit.clone(),
            folio: folio.to_string(),
            rounds: args.rounds,
            pattern: args.pattern,
            thp_advice: advice_name(advice),
        },
        stats,
    };
    println!("{}", serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?);
    Ok(report.outcome.verified)
}

/// How the kernel side ended short of a report.
enum Stop {
    Signal(i32),
    Error(String),
}

/// The kernel side's result: its report, or why it has none (OOM-killed, crashed).
enum KernelSide {
    Done(Value),
    Failed(String),
}

fn value_name<T: clap::ValueEnum>(v: T) -> String {
    v.to_possible_value().map(|p| p.get_name().to_string()).unwrap_or_default()
}

/// Run the child in the cgroup and wait for it, or for a signal.
fn run_child(ks: &KernelSwap, args: &UsememArgs, folio: FolioSize, size: u64, limit: u64) -> Result<KernelSide, Stop> {
    let (dir, _) = ks.cgroup.as_ref().ok_or_else(|| Stop::Error("no cgroup".into()))?;
    let procs = c_path(&dir.join("cgroup.procs")).map_err(Stop::Error)?;
    let exe = std::env::current_exe().map_err(|e| Stop::Error(format!("cannot find this executable: {e}")))?;
    let mut cmd = Command::new(exe);
    cmd.args(["bench", "usemem", "--plain-memory", "--json"])
        .args(["--threads", &args.threads.to_string(), "--size", &size.to_string(), "--folio", folio.label()])
        .args(["--rounds", &args.rounds.to_string(), "--pattern", &value_name(args.pattern)])
        .args(["--hot-fraction", &args.hot_fraction.to_string(), "--round-time", &args.round_time.to_string()])
        .args(["--limit", &limit.to_string()]);
    if let Some(w) = args.writes {
        cmd.args(["--writes", &w.to_string()]);
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped());
    // SAFETY: between fork and exec the closure makes only async-signal-safe calls
    // (open, write, close) on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // "0": the writing process itself.
            let n = libc::write(fd, b"0".as_ptr() as *const libc::c_void, 1);
            let err = io::Error::last_os_error();
            libc::close(fd);
            if n != 1 {
                return Err(err);
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| Stop::Error(format!("cannot start the kernel side in its cgroup: {e}")))?;
    let mut stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(sig) = Signals::caught() {
            let _ = child.kill();
            let _ = child.wait();
            let _ = reader.join();
            return Err(Stop::Signal(sig));
        }
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(Stop::Error(format!("waiting for the kernel side: {e}"))),
        }
    };
    let out = reader.join().unwrap_or_default();
    if let Some(sig) = Signals::caught() {
        return Err(Stop::Signal(sig));
    }
    let oom = ks.oom_kills();
    if matches!(status.code(), Some(0 | 1)) {
        if let Ok(Value::Object(mut v)) = serde_json::from_str::<Value>(&out) {
            v.insert("oom_kill".into(), oom.into());
            if let Some(peak) = ks.peak_bytes() {
                v.insert("cgroup_peak_bytes".into(), peak.into());
            }
            return Ok(KernelSide::Done(Value::Object(v)));
        }
    }
    Ok(KernelSide::Failed(if oom > 0 {
        format!("OOM-killed: the kernel's OOM killer ended the workload at the cgroup's limit ({oom} oom_kill, {status})")
    } else if let Some(sig) = status.signal() {
        format!("killed by signal {sig}")
    } else {
        format!("the kernel side failed ({status})")
    }))
}

/// `--against kernel`: the engine's run, then the kernel's, side by side.
pub(crate) fn against_kernel(args: &UsememArgs) -> Result<bool, String> {
    let kind = args.kernel_swap.unwrap_or(KernelSwapKind::Zram);
    let limit = folioswap::parse_bytes(&args.limit)
        .map_err(|_| format!("--against kernel needs a byte --limit (the cgroup's limit), not {:?}", args.limit))?;
    preflight(kind)?;
    eprintln!("folioswap: usemem under folioswap ...");
    let report = usemem::run_engine(args)?;
    let folio: FolioSize = report.config.folio.parse().map_err(|e: folioswap::SizeError| e.to_string())?;
    let size = report.config.size;
    eprintln!("folioswap: usemem under the kernel's swap ({}) ...", value_name(kind));

    let _signals = Signals::catch();
    let mut ks = KernelSwap::new(kind);
    let side = ks.set_up(folio, limit, size * args.threads as u64).map_err(Stop::Error).and_then(|()| match Signals::caught() {
        Some(sig) => Err(Stop::Signal(sig)),
        None => run_child(&ks, args, folio, size, limit),
    });
    let restored = ks.restore();
    if let Err(e) = &restored {
        eprintln!("folioswap: RESTORE FAILED: {e}");
    }
    if let Some(sig) = Signals::caught() {
        eprintln!(
            "folioswap: interrupted (signal {sig}); {}",
            if restored.is_ok() { "every setting it touched is restored" } else { "see the failures above" }
        );
        std::process::exit(128 + sig);
    }
    restored?;
    let side = match side {
        Ok(side) => side,
        Err(Stop::Error(e)) => return Err(e),
        Err(Stop::Signal(sig)) => std::process::exit(128 + sig),
    };

    let fs_value = serde_json::to_value(&report).map_err(|e| e.to_string())?;
    let kernel_outcome = match &side {
        KernelSide::Done(v) => serde_json::from_value::<Outcome>(v.clone()).ok(),
        KernelSide::Failed(_) => None,
    };
    let ratio = kernel_outcome.as_ref().filter(|k| k.throughput_mb_s > 0.0).map(|k| report.outcome.throughput_mb_s / k.throughput_mb_s);
    let kernel_verified = kernel_outcome.as_ref().is_some_and(|k| k.verified);
    if let KernelSide::Failed(why) = &side {
        eprintln!("folioswap: the kernel side failed: {why}");
    }
    if args.json {
        let kernel = match &side {
            KernelSide::Done(v) => v.clone(),
            KernelSide::Failed(why) => json!({ "verified": false, "failed": why }),
        };
        let all = json!({ "folioswap": fs_value, "kernel": kernel, "kernel_setup": ks.setup, "ratio": ratio });
        println!("{}", serde_json::to_string_pretty(&all).map_err(|e| e.to_string())?);
    } else {
        print_side_by_side(&report, &fs_value, &side, kernel_outcome.as_ref(), &ks.setup, folio, ratio);
    }
    Ok(report.outcome.verified && kernel_verified)
}

/// Swap-outs and -ins in pages (device plus zswap), and of the folio size: swapped out
/// whole, and split first (fallback). `stats` is either side's `stats` object.
fn swap_counts(stats: &Value, folio: FolioSize) -> [u64; 4] {
    let n = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let size = stats.get("per_size").and_then(|p| p.get(folio.kernel_label())).cloned().unwrap_or(Value::Null);
    [
        n(stats, "pswpout") + n(stats, "zswpout"),
        n(stats, "pswpin") + n(stats, "zswpin"),
        n(&size, "swpout") + n(&size, "zswpout"),
        n(&size, "swpout_fallback"),
    ]
}

fn print_side_by_side(
    report: &usemem::Report,
    fs_value: &Value,
    side: &KernelSide,
    kernel: Option<&Outcome>,
    setup: &Setup,
    folio: FolioSize,
    ratio: Option<f64>,
) {
    let c = &report.config;
    let f = &report.outcome;
    println!(
        "usemem against the kernel: {} threads x {}, limit {}, folio {}, {}, {} rounds",
        c.threads,
        format_bytes(c.size),
        format_bytes(setup.limit_bytes),
        folio,
        value_name(c.pattern),
        c.rounds
    );
    println!("  folioswap: pool {}{}", c.compressor, c.swap_file.as_deref().map(|s| format!(", swap file {s}")).unwrap_or_default());
    println!(
        "  kernel:    {} {} ({}, priority {}{}), zswap {}, cgroup v{} {}={}, {}{}",
        setup.swap,
        setup.device,
        format_bytes(setup.device_bytes),
        setup.priority,
        setup.compressor.as_deref().map(|c| format!(", {c}")).unwrap_or_default(),
        setup.zswap,
        setup.cgroup_version,
        setup.limit_file,
        format_bytes(setup.limit_bytes),
        setup.thp_advice,
        setup.thp_size_enabled.as_deref().map(|e| format!(" (hugepages-{} {e})", folio.kernel_label())).unwrap_or_default()
    );
    let kernel_stats = match side {
        KernelSide::Done(v) => v.get("stats").cloned().unwrap_or(Value::Null),
        KernelSide::Failed(_) => Value::Null,
    };
    let row = |name: &str, a: String, b: Option<String>| {
        println!("  {name:<26} {a:>14} {:>14}", b.unwrap_or_else(|| "-".into()));
    };
    println!("  {:<26} {:>14} {:>14}", "", "folioswap", "kernel");
    let mbs = |v: f64| if v >= 10.0 { format!("{v:.1}") } else { format!("{v:.3}") };
    row("throughput MB/s", mbs(f.throughput_mb_s), kernel.map(|k| mbs(k.throughput_mb_s)));
    if let Some(w) = f.writes_per_s {
        row("writes/s", format!("{w:.0}"), kernel.and_then(|k| k.writes_per_s).map(|w| format!("{w:.0}")));
    }
    row("wall s", format!("{:.2}", f.wall_s), kernel.map(|k| format!("{:.2}", k.wall_s)));
    row("cpu s", format!("{:.2}", f.cpu_s), kernel.map(|k| format!("{:.2}", k.cpu_s)));
    let yes = |v: bool| if v { "yes" } else { "NO" }.to_string();
    row("verified", yes(f.verified), Some(kernel.map(|k| yes(k.verified)).unwrap_or_else(|| "FAILED".into())));
    row("THP % of resident", format!("{:.1}", f.anon_huge_pct_of_resident), kernel.map(|k| format!("{:.1}", k.anon_huge_pct_of_resident)));
    let mib = |b: u64| format!("{:.1}", b as f64 / (1 << 20) as f64);
    row("resident MiB", mib(f.resident_bytes), kernel.map(|k| mib(k.resident_bytes)));
    let a = swap_counts(&fs_value["stats"], folio);
    let b = (!kernel_stats.is_null()).then(|| swap_counts(&kernel_stats, folio));
    row("swap-out pages", a[0].to_string(), b.map(|b| b[0].to_string()));
    row("swap-in pages", a[1].to_string(), b.map(|b| b[1].to_string()));
    if folio != FolioSize::K4 {
        row(&format!("{folio} folios out whole"), a[2].to_string(), b.map(|b| b[2].to_string()));
        row(&format!("{folio} folios split to swap"), a[3].to_string(), b.map(|b| b[3].to_string()));
    }
    if let KernelSide::Failed(why) = side {
        println!("  kernel side FAILED: {why}");
    }
    match ratio {
        Some(r) => println!("  ratio folioswap/kernel (throughput; >1: folioswap faster): {r:.2}"),
        None => println!("  ratio folioswap/kernel: none (the kernel side has no figures)"),
    }
    if !setup.changed.is_empty() {
        println!(
            "  settings changed for the kernel side, all restored: {}",
            setup.changed.iter().map(|c| format!("{} {} -> {}", c.path, c.before, c.after)).collect::<Vec<_>>().join(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_read_the_bracketed_choice() {
        assert_eq!(parse_setting("always [madvise] never\n"), "madvise");
        assert_eq!(parse_setting("[lzo-rle] lzo lz4 \n"), "lzo-rle");
        assert_eq!(parse_setting("N\n"), "N");
        assert_eq!(parse_setting("0\n"), "0");
    }

    #[test]
    fn thp_plan_turns_on_the_folio_size_alone() {
        let sizes = |v: &[(&str, &str)]| v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<Vec<_>>();
        let s = sizes(&[("16kB", "never"), ("64kB", "never"), ("2048kB", "inherit")]);
        // 2M with top-level madvise: nothing to change.
        assert!(thp_plan("madvise", &s, "2048kB").is_empty());
        // 2M with top-level never: set explicitly.
        assert_eq!(thp_plan("never", &s, "2048kB"), vec![("2048kB".to_string(), "madvise")]);
        // 64K: on, and 2M (inheriting madvise) off.
        assert_eq!(thp_plan("madvise", &s, "64kB"), vec![("64kB".to_string(), "madvise"), ("2048kB".to_string(), "never")]);
        // Already always: left alone; others on: off.
        let s = sizes(&[("16kB", "madvise"), ("64kB", "always"), ("2048kB", "never")]);
        assert_eq!(thp_plan("never", &s, "64kB"), vec![("16kB".to_string(), "never")]);
    }

    #[test]
    fn swap_header_is_mkswaps() {
        let h = swap_header(64 << 20);
        assert_eq!(h.len(), 4096);
        assert_eq!(&h[4086..], b"SWAPSPACE2");
        assert_eq!(u32::from_ne_bytes(h[1024..1028].try_into().unwrap()), 1);
        assert_eq!(u32::from_ne_bytes(h[1028..1032].try_into().unwrap()), (64 << 20) / 4096 - 1);
    }

    #[test]
    fn smaps_counts_plain_memory() {
        let mut m = Anon::new(4 << 20, 2 << 20, libc::MADV_NOHUGEPAGE).unwrap();
        m.words_mut()[..(1 << 20) / 8].fill(1);
        let folioswap::SmapsSums { rss_bytes: rss, anon_huge_bytes: huge, .. } = folioswap::smaps_of(&[(m.base as usize, m.len)]).unwrap();
        assert!((1 << 20..2 << 20).contains(&rss), "{rss}");
        assert_eq!(huge, 0);
        assert_eq!(m.base as usize % (2 << 20), 0);
    }
}
