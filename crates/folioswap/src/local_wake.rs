//! Waking a faulting thread on the CPU it faulted on (thread mode, one fault thread kept
//! on each CPU): the fault thread that served the fault runs at SCHED_IDLE for the
//! wake-up, so that the scheduler sees that CPU as free. State and policy only:
//! `install::wake_folio` wakes through [`LocalWake::wake`], and `fault::fault_thread`
//! watches for a fault thread left at idle priority while a fault waits for it.
//!
//! Why. The fault thread on the faulting thread's CPU serves the fault (`pollers.rs`), and
//! wakes the thread while it still runs there itself. A woken thread goes back to the CPU
//! it slept on only where that CPU is idle or runs SCHED_IDLE tasks alone; else the
//! scheduler puts it on an idle CPU (`select_idle_sibling`). So the program changed CPUs
//! at about every tenth fault: CPython's dict at 41M migrated 375-856 times in a run of
//! 7 k faults, and each move cost a fault served from the other CPU (two wake-ups across
//! CPUs, `pollers.rs`) and TLB shootdowns of both CPUs at the reclaimers' moves. The
//! whole run confined to one CPU (`taskset`) took 0.86 of the time, which a launcher
//! cannot do to a program. Dropping to SCHED_IDLE for the wake-up keeps the program where it was
//! (16-50 migrations a run): it preempts the fault thread at once, and the fault thread
//! takes its policy back when it next runs (BENCHMARKS.md, "The program stays on its
//! CPU").
//!
//! What it costs. A SCHED_IDLE thread beside a busy one waits long: 1.4 s between two
//! slices beside a busy loop on this machine. Here the fault thread left preempted at idle
//! priority runs again when the program thread next faults or blocks, so nothing waits
//! for it as long as that thread is the only one that can fault. Hence:
//!
//! 1. The drop is made only while the process runs exactly one thread besides the
//!    engine's own (`fsw-*`, and libfolioswap.so's `folioswap-*`), counted from
//!    `/proc/self/task` at most every [`RECOUNT_MS`] (a program with more threads than
//!    [`MAX_COUNTED`] is never counted), and only by a thread that can take its policy
//!    back: SCHED_OTHER to begin with, and CAP_SYS_NICE or an RLIMIT_NICE that allows its
//!    nice value (the kernel refuses the way back from SCHED_IDLE otherwise).
//! 2. A thread the program starts after a drop could still fault while the fault thread
//!    waits at idle priority behind a busy program thread. So while drops are being made,
//!    the other fault threads wake every [`RESCUE_MS`] (they sleep otherwise, since only
//!    the fault thread on the faulting CPU polls the userfaultfd), and where a message
//!    waits while a fault thread is still at idle priority, give it its policy back
//!    (`fault_wake_rescued`): it then gets its share of the CPU within a slice.
//! 3. After [`WATCH_SPAN_MS`] without a drop they sleep again until the next one wakes
//!    them (`watchers_asleep`).

use crate::stats::Counters;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

/// How old the count of the program's threads may be.
pub(crate) const RECOUNT_MS: u64 = 10;
/// A process with more threads than this is not counted: never alone.
pub(crate) const MAX_COUNTED: usize = 64;
/// How often the other fault threads look for a fault thread stuck at idle priority.
pub(crate) const RESCUE_MS: i32 = 10;
/// How long after the last drop they keep looking.
pub(crate) const WATCH_SPAN_MS: u64 = 1000;

thread_local! {
    /// This fault thread's poller slot (`pollers.rs`), set when it starts: only fault
    /// threads kept on a CPU drop their policy.
    static FAULT_SLOT: Cell<Option<usize>> = const { Cell::new(None) };
    /// When this thread last began a wake-up. A fault's latency ends there: a fault
    /// thread that dropped is preempted by the thread it woke until that one faults or
    /// blocks again, which is the program's time, not the fault's.
    static WOKEN_AT: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// When this thread last began a wake-up, left for [`take_woken_at`].
pub(crate) fn woken_at() -> Option<Instant> {
    WOKEN_AT.with(|w| w.get())
}

/// When this thread last began a wake-up, forgotten.
pub(crate) fn take_woken_at() -> Option<Instant> {
    WOKEN_AT.with(|w| w.take())
}

pub(crate) struct LocalWake {
    /// Configured (`local_wake`) and allowed (SCHED_OTHER, may come back from SCHED_IDLE).
    enabled: bool,
    epoch: Instant,
    /// Whether the last count found one program thread, and when it was made (ms since
    /// `epoch`, plus one: 0 means never).
    alone: AtomicBool,
    counted_at: AtomicU64,
    counting: AtomicBool,
    /// Per poller slot: the thread id of the fault thread while it runs at SCHED_IDLE, or 0.
    dropped: Vec<AtomicU32>,
    /// When the last drop was made (ms since `epoch`).
    last_drop: AtomicU64,
    /// The watchers went to sleep without a timeout: the next drop wakes them.
    watchers_asleep: AtomicBool,
}

impl LocalWake {
    /// For `slots` fault threads kept on CPUs; `configured`: the `local_wake` setting.
    pub fn new(configured: bool, slots: usize) -> LocalWake {
        LocalWake {
            enabled: configured && slots > 1 && may_leave_sched_idle(),
            epoch: Instant::now(),
            alone: AtomicBool::new(false),
            counted_at: AtomicU64::new(0),
            counting: AtomicBool::new(false),
            dropped: (0..slots).map(|_| AtomicU32::new(0)).collect(),
            last_drop: AtomicU64::new(0),
            watchers_asleep: AtomicBool::new(true),
        }
    }

    /// Called by a fault thread when it starts, with its poller slot.
    pub fn join(slot: Option<usize>) {
        FAULT_SLOT.with(|s| s.set(slot));
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Wake the threads waiting on `[addr, addr + len)`, at SCHED_IDLE where this is a
    /// fault thread kept on a CPU and the program runs one thread; a drop after the
    /// watchers went to sleep wakes them (`wake_others`, given this thread's slot).
    pub fn wake(&self, uffd: &crate::uffd::Uffd, addr: usize, len: usize, counters: &Counters, wake_others: impl FnOnce(usize)) {
        let slot = FAULT_SLOT.with(|s| s.get()).filter(|&s| s < self.dropped.len());
        let Some(slot) = slot.filter(|_| self.enabled && self.program_alone()) else {
            WOKEN_AT.with(|w| w.set(Some(Instant::now())));
            uffd.wake(addr, len);
            return;
        };
        // SAFETY: gettid(2) takes no arguments and cannot fail.
        let tid = unsafe { libc::gettid() } as u32;
        self.dropped[slot].store(tid, Ordering::SeqCst);
        self.last_drop.store(self.now_ms(), Ordering::SeqCst);
        if self.watchers_asleep.swap(false, Ordering::SeqCst) {
            wake_others(slot);
        }
        set_policy(0, libc::SCHED_IDLE);
        WOKEN_AT.with(|w| w.set(Some(Instant::now())));
        uffd.wake(addr, len);
        // Preempted here by the thread just woken, until it faults or blocks again.
        set_policy(0, libc::SCHED_OTHER);
        self.dropped[slot].store(0, Ordering::SeqCst);
        counters.vm.fault_wake_local.inc();
    }

    /// Whether the process runs one thread besides the engines' own, by a count at most
    /// `RECOUNT_MS` old (one thread counts at a time; the others use the last count).
    fn program_alone(&self) -> bool {
        let now = self.now_ms() + 1;
        let counted = self.counted_at.load(Ordering::Relaxed);
        if (counted == 0 || now.saturating_sub(counted) >= RECOUNT_MS) && !self.counting.swap(true, Ordering::Acquire) {
            self.alone.store(count_program_threads(2) == Some(1), Ordering::Relaxed);
            self.counted_at.store(now, Ordering::Relaxed);
            self.counting.store(false, Ordering::Release);
        }
        self.alone.load(Ordering::Relaxed)
    }

    /// How long a fault thread that does not poll the userfaultfd may sleep: `RESCUE_MS`
    /// while drops are being made, else until woken (-1).
    pub fn watch_timeout(&self) -> i32 {
        if !self.enabled {
            return -1;
        }
        let recent = |this: &LocalWake| this.now_ms().saturating_sub(this.last_drop.load(Ordering::SeqCst)) < WATCH_SPAN_MS;
        if recent(self) {
            return RESCUE_MS;
        }
        self.watchers_asleep.store(true, Ordering::SeqCst);
        // A drop between the test and the flag would not have woken us: look again.
        if recent(self) {
            RESCUE_MS
        } else {
            -1
        }
    }

    /// A watcher's timeout: where a fault waits (`message_waits`) while a fault thread is
    /// still at idle priority, give that thread its policy back.
    pub fn rescue(&self, message_waits: impl Fn() -> bool, counters: &Counters) {
        for dropped in &self.dropped {
            let tid = dropped.load(Ordering::SeqCst);
            if tid != 0 && message_waits() && set_policy(tid, libc::SCHED_OTHER) {
                counters.vm.fault_wake_rescued.inc();
            }
        }
    }
}

/// Set the scheduling policy of thread `tid` (0: the caller) to `policy`, priority 0.
fn set_policy(tid: u32, policy: libc::c_int) -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler(2) with a live sched_param; `tid` is 0 or a thread of this
    // process, and a normal or idle policy needs no priority.
    unsafe { libc::sched_setscheduler(tid as libc::pid_t, policy, &param) == 0 }
}

/// Whether the calling thread runs SCHED_OTHER and may come back to it from SCHED_IDLE:
/// the kernel allows it with CAP_SYS_NICE, or where RLIMIT_NICE covers the thread's nice
/// value (`can_nice`: 20 - nice <= the limit).
fn may_leave_sched_idle() -> bool {
    // SAFETY: sched_getscheduler(2) of the caller; getpriority(2) of the calling process;
    // getrlimit(2) into a live rlimit.
    let (policy, nice, limit) = unsafe {
        let nice = libc::getpriority(libc::PRIO_PROCESS, 0);
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        libc::getrlimit(libc::RLIMIT_NICE, &mut limit);
        (libc::sched_getscheduler(0), nice, limit.rlim_cur)
    };
    policy == libc::SCHED_OTHER && (has_cap_sys_nice() || (20 - nice as i64) <= limit as i64)
}

/// CAP_SYS_NICE (23) in the effective set, from `/proc/self/status`.
fn has_cap_sys_nice() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 23) != 0)
}

/// Whether a thread named `comm` is one of folioswap's own.
fn is_own_thread(comm: &[u8]) -> bool {
    comm.starts_with(b"fsw-") || comm.starts_with(b"folioswap-")
}

/// The threads of this process that are not folioswap's own, counted up to `cap` (None:
/// more than `MAX_COUNTED` threads, or no procfs). A thread whose name cannot be read
/// counts as the program's. Names are read only until the count reaches `cap`: a program
/// with many threads costs a few reads, not one per thread.
fn count_program_threads(cap: usize) -> Option<usize> {
    let tasks: Vec<_> = std::fs::read_dir("/proc/self/task").ok()?.take(MAX_COUNTED + 1).collect();
    if tasks.len() > MAX_COUNTED {
        return None;
    }
    let names = tasks.into_iter().map(|entry| entry.ok().and_then(|e| std::fs::read(e.path().join("comm")).ok()).unwrap_or_default());
    count_program(names, cap)
}

/// Of threads named `names`, how many are not folioswap's own, up to `cap`; None past
/// `MAX_COUNTED` names.
fn count_program(names: impl Iterator<Item = Vec<u8>>, cap: usize) -> Option<usize> {
    let mut program = 0;
    for (seen, comm) in names.enumerate() {
        if seen >= MAX_COUNTED {
            return None;
        }
        program += usize::from(!is_own_thread(&comm));
        if program >= cap {
            return Some(cap);
        }
    }
    Some(program)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_threads_are_named_by_folioswap() {
        for own in ["fsw-fault0\n", "fsw-kswapd1\n", "fsw-readahead\n", "folioswap-stat\n"] {
            assert!(is_own_thread(own.as_bytes()), "{own}");
        }
        for program in ["python3\n", "fsw\n", "", "folio\n"] {
            assert!(!is_own_thread(program.as_bytes()), "{program:?}");
        }
    }

    #[test]
    fn only_program_threads_are_counted() {
        let names = |list: &[&str]| list.iter().map(|n| n.as_bytes().to_vec()).collect::<Vec<_>>().into_iter();
        assert_eq!(count_program(names(&["python3\n", "fsw-fault0\n", "fsw-kswapd0\n", "folioswap-stat\n"]), 2), Some(1));
        assert_eq!(count_program(names(&["python3\n", "worker\n", "fsw-fault0\n"]), 2), Some(2));
        assert_eq!(count_program(names(&["python3\n", "worker\n", "fsw-fault0\n", "more\n"]), 8), Some(3));
        // A thread that exited between the listing and the read counts as the program's.
        assert_eq!(count_program(names(&["fsw-fault0\n", ""]), 2), Some(1));
        let many: Vec<String> = (0..=MAX_COUNTED).map(|i| format!("fsw-kswapd{i}\n")).collect();
        assert_eq!(count_program(many.iter().map(|n| n.as_bytes().to_vec()), 2), None, "past MAX_COUNTED, never alone");
        // This test process: the harness's threads at least.
        assert!(count_program_threads(2).is_some_and(|n| n >= 1));
    }

    /// A watcher gives a fault thread left at SCHED_IDLE its policy back where a fault
    /// waits, and leaves it where none does.
    #[test]
    fn a_watcher_rescues_a_fault_thread_left_at_idle_priority() {
        let wake = LocalWake { enabled: true, ..LocalWake::new(false, 2) };
        let counters = Counters::default();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let stuck = std::thread::spawn(move || {
            assert!(set_policy(0, libc::SCHED_IDLE), "this test needs to set SCHED_IDLE");
            // SAFETY: gettid(2) takes no arguments and cannot fail.
            tid_tx.send(unsafe { libc::gettid() } as u32).unwrap();
            done_rx.recv().unwrap();
            // SAFETY: sched_getscheduler(2) of the caller.
            unsafe { libc::sched_getscheduler(0) }
        });
        let tid = tid_rx.recv().unwrap();
        wake.dropped[1].store(tid, Ordering::SeqCst);
        wake.rescue(|| false, &counters);
        assert_eq!(counters.vm.fault_wake_rescued.get(), 0, "no fault waits: nothing to rescue");
        wake.rescue(|| true, &counters);
        assert_eq!(counters.vm.fault_wake_rescued.get(), 1);
        done_tx.send(()).unwrap();
        assert_eq!(stuck.join().unwrap(), libc::SCHED_OTHER, "the rescued thread runs SCHED_OTHER again");
    }

    /// The watchers look every RESCUE_MS while drops are being made, and sleep once none
    /// was made for WATCH_SPAN_MS, saying so for the next drop to wake them.
    #[test]
    fn watchers_look_while_drops_are_made_and_sleep_after() {
        let off = LocalWake::new(false, 2);
        assert_eq!(off.watch_timeout(), -1, "never where the drop is off");
        let wake = LocalWake { enabled: true, ..LocalWake::new(false, 2) };
        wake.last_drop.store(wake.now_ms(), Ordering::SeqCst);
        wake.watchers_asleep.store(false, Ordering::SeqCst);
        assert_eq!(wake.watch_timeout(), RESCUE_MS);
        assert!(!wake.watchers_asleep.load(Ordering::SeqCst));
        let long_ago = LocalWake {
            enabled: true,
            epoch: Instant::now() - std::time::Duration::from_millis(2 * WATCH_SPAN_MS),
            ..LocalWake::new(false, 2)
        };
        assert_eq!(long_ago.watch_timeout(), -1);
        assert!(long_ago.watchers_asleep.load(Ordering::SeqCst), "the next drop must wake them");
    }

    /// A thread dropped to SCHED_IDLE takes SCHED_OTHER back (as root, where CI runs: the
    /// engine makes no drop where it could not).
    #[test]
    fn a_thread_comes_back_from_sched_idle() {
        std::thread::spawn(|| {
            assert!(may_leave_sched_idle(), "this test needs SCHED_OTHER and CAP_SYS_NICE (root) or RLIMIT_NICE >= 20");
            let policy = || {
                // SAFETY: sched_getscheduler(2) of the caller.
                unsafe { libc::sched_getscheduler(0) }
            };
            assert!(set_policy(0, libc::SCHED_IDLE));
            assert_eq!(policy(), libc::SCHED_IDLE);
            assert!(set_policy(0, libc::SCHED_OTHER));
            assert_eq!(policy(), libc::SCHED_OTHER);
        })
        .join()
        .unwrap();
    }
}
