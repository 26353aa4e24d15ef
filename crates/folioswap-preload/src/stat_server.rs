//! Live counters for `folioswap stat`: a process whose engine has started answers on an
//! abstract unix socket, `folioswap-stat/<run>/<pid>` (`engine::STAT_SOCKET_PREFIX`; run
//! is `FOLIOSWAP_RUN`, the pid of the `folioswap run` that started it, 0 outside one),
//! which `folioswap stat` finds in `/proc/net/unix` from any shell, with no flag.
//!
//! Each connection gets one line of JSON and is closed:
//! `{"pid", "run", "command", "anon_huge_bytes", "stats", "fault_latency_histogram"}`,
//! `stats` being `Engine::stats()`. Why this shape:
//! - an abstract name vanishes with the last descriptor, so a process that dies leaves
//!   nothing behind; the listener is close-on-exec, and a forked child closes its copy of
//!   the parent's (`forget_in_child`), so the name always means the live process;
//! - an abstract socket has no file permissions: only the process's own user and root
//!   are answered (`SO_PEERCRED`), the others are closed on without a word;
//! - one thread per process, asleep in `accept` until asked; it runs marked inside the
//!   library, so what it allocates never becomes managed memory.

use crate::inside::within;
use engine::Engine;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

/// The listener's descriptor, -1 when none: a forked child closes the one it inherited.
static LISTENER: AtomicI32 = AtomicI32::new(-1);

/// The managed ranges `(address, length)` to count huge pages in, in address order.
pub type Ranges = fn() -> Vec<(usize, usize)>;

/// Start answering for `engine`, whose memory `ranges` gives (once per process; again in
/// a forked child).
pub fn start(engine: &Engine, ranges: Ranges) {
    if LISTENER.load(Ordering::Acquire) >= 0 {
        return;
    }
    let run: u32 = std::env::var("FOLIOSWAP_RUN").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(0);
    let pid = std::process::id();
    let name = format!("{}{run}/{pid}", engine::STAT_SOCKET_PREFIX);
    let listener = match SocketAddr::from_abstract_name(name.as_bytes()).and_then(|addr| UnixListener::bind_addr(&addr)) {
        Ok(l) => l,
        Err(e) => {
            // The program runs on; only the live view of it is missing.
            eprintln!("folioswap: cannot listen on @{name} for `folioswap stat` ({e}); its counters show at exit only");
            return;
        }
    };
    LISTENER.store(listener.as_raw_fd(), Ordering::Release);
    let engine = engine.clone();
    let spawned = std::thread::Builder::new().name("folioswap-stat".into()).spawn(move || {
        within(|| serve(listener, engine, ranges, run));
    });
    if let Err(e) = spawned {
        LISTENER.store(-1, Ordering::Release);
        eprintln!("folioswap: cannot start the thread that answers `folioswap stat` ({e})");
    }
}

/// In a forked child: the parent's listener is not ours (the thread that served it did
/// not come across the fork). Only async-signal-safe calls.
pub fn forget_in_child() {
    let fd = LISTENER.swap(-1, Ordering::AcqRel);
    if fd >= 0 {
        // SAFETY: `fd` is the listener inherited from the parent; no thread of the child
        // uses it (the serving thread exists only in the parent), so closing it here
        // cannot pull a descriptor from under anyone.
        unsafe { libc::close(fd) };
    }
}

fn serve(listener: UnixListener, engine: Engine, ranges: Ranges, run: u32) {
    let command = command_line();
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        if !peer_may_read(&conn) {
            continue;
        }
        let reply = reply(&engine, ranges, run, &command);
        let _ = conn.set_write_timeout(Some(Duration::from_secs(2)));
        let _ = conn.write_all(reply.as_bytes());
    }
}

/// The asking process runs as this process's user, or as root.
fn peer_may_read(conn: &UnixStream) -> bool {
    let mut cred = libc::ucred { pid: 0, uid: u32::MAX, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes at most `len` bytes, the size of `cred`, which lives
    // through the call; the descriptor is the connection's, open while `conn` lives.
    let rc = unsafe {
        libc::getsockopt(conn.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len)
    };
    // SAFETY: getuid has no preconditions.
    let own = unsafe { libc::getuid() };
    rc == 0 && (cred.uid == 0 || cred.uid == own)
}

fn reply(engine: &Engine, ranges: Ranges, run: u32, command: &str) -> String {
    // The ranges are copied under the library's lock, and smaps read after it.
    let anon_huge = engine::anon_huge_bytes_of(&ranges()).unwrap_or(0);
    let mut line = serde_json::json!({
        "pid": std::process::id(),
        "run": run,
        "command": command,
        "anon_huge_bytes": anon_huge,
        "stats": engine.stats(),
        "fault_latency_histogram": engine.fault_latency_histogram(),
    })
    .to_string();
    line.push('\n');
    line
}

/// The program's command line, shortened for one column.
fn command_line() -> String {
    let raw = std::fs::read("/proc/self/cmdline").unwrap_or_default();
    let words: Vec<String> = raw.split(|&b| b == 0).filter(|w| !w.is_empty()).map(|w| String::from_utf8_lossy(w).into_owned()).collect();
    let mut line = words.join(" ");
    if line.chars().count() > 120 {
        line = line.chars().take(117).collect::<String>() + "...";
    }
    line
}
