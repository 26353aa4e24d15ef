//! Which fault threads poll the userfaultfd (thread mode, one fault thread kept on each
//! CPU). State and policy only; the loop that polls is `fault::fault_thread`.
//!
//! The kernel wakes every thread polling a userfaultfd at each fault, from the faulting
//! thread, before it sleeps. A fault thread on an idle CPU is woken by an IPI, and in
//! this machine's KVM guest the faulting thread pays for sending it with interrupts off:
//! the dict program at 41M spent a sixth of its own CPU time there (BENCHMARKS.md, "One
//! fault thread polls"), to wake a thread that finds nothing to read, since the one on the
//! faulting thread's own CPU reads the message first. So while one thread faults alone,
//! only the fault thread kept on its CPU polls the userfaultfd (it holds the token); the
//! others sleep on their own eventfd and on the engine's kick.
//!
//! 1. At every fault of a thread that registered its rseq area (`thread_cpu.rs`;
//!    libfolioswap.so registers the program's threads), the server reads the CPU the
//!    thread faulted on, at no cost. For any other thread, every `SAMPLE`th fault a fault
//!    thread serves while one thread holds the token (every `SAMPLE_ALL`th while all
//!    poll), the server reads the CPU the faulting thread last ran on
//!    (`/proc/self/task/TID/stat`: a read costs about 6 µs, 16 with the open). Sampled
//!    every eighth fault, a thread the scheduler moved was served from the other CPU for
//!    five to seven faults in a row, each at about three times the cost of one served
//!    on its own CPU (BENCHMARKS.md, "The token follows at the first fault").
//! 2. `STREAK` samples in a row from one thread on one CPU: the token goes to the fault
//!    thread kept there.
//! 3. The same thread as the sample before, on another CPU: the scheduler moved it (a
//!    wake-up finds the CPU it slept on busy with the fault thread that woke it, and
//!    places it on the idle one), and the token follows it at once.
//! 4. Another thread, or a fault of another thread read right after one was served (two
//!    threads faulting at once, which one server would take in turn): every thread polls
//!    again, until 2. holds once more. A program whose threads fault in turn keeps every
//!    fault thread polling, as before the token.
//!
//! The counters are updated without a lock: a lost update only delays a decision. A fault
//! read by a thread that no longer holds the token is served all the same.

use std::cell::{Cell, RefCell};
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

/// One fault in this many has its thread's CPU read while one thread polls: the token
/// must follow a thread the scheduler moves within a few faults.
const SAMPLE: u32 = 8;
/// One fault in this many while every thread polls (four times fewer reads of procfs
/// for a program whose threads fault together, where they cost most).
const SAMPLE_ALL: u32 = 32;
/// Samples in a row from one thread on one CPU before only the fault thread kept there
/// polls: long enough that two threads faulting in turn almost never look like one
/// (half to the power of `STREAK - 1`).
const STREAK: u32 = 16;
/// `holder` when every thread polls.
const ALL: usize = usize::MAX;

pub(crate) struct Pollers {
    /// The CPU each fault thread is kept on, by slot; empty where the fault threads are
    /// not kept one on each CPU (then every one polls, always).
    cpus: Vec<usize>,
    /// Written to make the thread of a slot look at the token again.
    wakes: Vec<OwnedFd>,
    /// Slots a fault thread has taken (`claim_slot`).
    claimed: Vec<AtomicBool>,
    /// The slot whose thread polls, or `ALL`.
    holder: AtomicUsize,
    /// The thread and CPU of the last sample, and how many samples in a row came from
    /// that thread on that CPU.
    last_tid: AtomicU32,
    last_cpu: AtomicUsize,
    streak: AtomicU32,
}

impl Pollers {
    /// Every thread polls, always: threads not kept on CPUs, or only one.
    pub fn everyone() -> Pollers {
        Pollers {
            cpus: Vec::new(),
            wakes: Vec::new(),
            claimed: Vec::new(),
            holder: AtomicUsize::new(ALL),
            last_tid: AtomicU32::new(0),
            last_cpu: AtomicUsize::new(ALL),
            streak: AtomicU32::new(0),
        }
    }

    /// Fault threads kept on `cpus`, one each.
    pub fn kept_on(cpus: &[Option<usize>]) -> std::io::Result<Pollers> {
        let Some(cpus) = cpus.iter().copied().collect::<Option<Vec<usize>>>().filter(|c| c.len() > 1) else {
            return Ok(Pollers::everyone());
        };
        let wakes = cpus.iter().map(|_| crate::eventfd::new()).collect::<std::io::Result<Vec<_>>>()?;
        let claimed = cpus.iter().map(|_| AtomicBool::new(false)).collect();
        Ok(Pollers { cpus, wakes, claimed, ..Pollers::everyone() })
    }

    /// Take a slot for the calling fault thread: the one of the CPU it runs on, or, where
    /// that is taken or there is none (keeping the thread on its CPU failed), any slot
    /// left, so that every slot the token can go to has a thread. None when all are
    /// taken: that thread always polls.
    pub fn claim_slot(&self) -> Option<usize> {
        // SAFETY: sched_getcpu(3) takes no arguments; -1 on failure.
        let cpu = unsafe { libc::sched_getcpu() };
        let here = usize::try_from(cpu).ok().and_then(|cpu| self.slot_of(cpu));
        here.into_iter().chain(0..self.cpus.len()).find(|&slot| !self.claimed[slot].swap(true, Ordering::AcqRel))
    }

    /// The slot of the fault thread kept on `cpu`.
    fn slot_of(&self, cpu: usize) -> Option<usize> {
        self.cpus.iter().position(|&c| c == cpu)
    }

    /// How many fault threads are kept on CPUs, one slot each (0: every thread polls).
    pub fn kept_slots(&self) -> usize {
        self.cpus.len()
    }

    /// Make every fault thread but the one of `slot` look at the token, and at its
    /// timeout (`local_wake.rs`), again.
    pub fn wake_others(&self, slot: usize) {
        (0..self.wakes.len()).filter(|&s| s != slot).for_each(|s| crate::eventfd::signal(self.wakes[s].as_raw_fd()));
    }

    /// Whether the thread of `slot` polls the userfaultfd now.
    pub fn polls(&self, slot: Option<usize>) -> bool {
        let holder = self.holder.load(Ordering::Acquire);
        holder == ALL || slot.is_none_or(|s| s == holder)
    }

    /// The descriptors it holds (a forked child closes them: `fork.rs`).
    pub fn raw_fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        self.wakes.iter().map(|fd| fd.as_raw_fd())
    }

    /// The eventfd that tells the thread of `slot` to look at the token again (-1, which
    /// poll(2) skips, for none).
    pub fn wake_fd(&self, slot: Option<usize>) -> RawFd {
        slot.and_then(|s| self.wakes.get(s)).map_or(-1, |fd| fd.as_raw_fd())
    }

    /// A fault of thread `tid` was served; `faulted_on`, the CPU it faulted on where its
    /// rseq area says (`thread_cpu.rs`), is a sample at no cost, taken at every fault.
    /// True where the threads that poll changed.
    pub fn note_served(&self, tid: u32, faulted_on: Option<usize>) -> bool {
        if self.cpus.is_empty() || tid == 0 {
            return false;
        }
        if faulted_on.is_some() {
            return self.note_sample(tid, || faulted_on);
        }
        let period = if self.holder.load(Ordering::Relaxed) == ALL { SAMPLE_ALL } else { SAMPLE };
        // Counted per fault thread: one counter shared by threads on two CPUs would move
        // its cache line between them at every fault.
        let served = SERVED.with(|n| {
            n.set(n.get().wrapping_add(1));
            n.get()
        });
        if !served.is_multiple_of(period) {
            return false;
        }
        self.note_sample(tid, || cpu_of_thread(tid))
    }

    /// Two threads fault at once: every thread polls. True where that is a change.
    pub fn note_concurrent(&self) -> bool {
        self.streak.store(0, Ordering::Relaxed);
        self.give(ALL)
    }

    /// One sample: thread `tid`, on the CPU `cpu` reads. The CPU is read only where the
    /// thread is the one sampled before: another thread means every fault thread polls,
    /// wherever it runs, and a program whose threads fault in turn reads procfs seldom.
    fn note_sample(&self, tid: u32, cpu: impl FnOnce() -> Option<usize>) -> bool {
        if self.last_tid.swap(tid, Ordering::Relaxed) != tid {
            self.last_cpu.store(ALL, Ordering::Relaxed);
            self.streak.store(0, Ordering::Relaxed);
            return self.give(ALL);
        }
        let Some(cpu) = cpu() else { return false };
        let streak = match self.last_cpu.swap(cpu, Ordering::Relaxed) {
            before if before == cpu => self.streak.fetch_add(1, Ordering::Relaxed) + 1,
            ALL => {
                self.streak.store(1, Ordering::Relaxed);
                1
            }
            _moved => {
                self.streak.store(STREAK, Ordering::Relaxed);
                STREAK
            }
        };
        match self.slot_of(cpu) {
            Some(slot) if streak >= STREAK => self.give(slot),
            _ => false,
        }
    }

    /// Make `to` the holder, waking every thread whose polling changes. True where it
    /// was not already.
    fn give(&self, to: usize) -> bool {
        let from = self.holder.swap(to, Ordering::AcqRel);
        if from == to {
            return false;
        }
        // From ALL the others stop at their next wake-up; to ALL they must start now.
        let wake = |slot: usize| crate::eventfd::signal(self.wakes[slot].as_raw_fd());
        match to {
            ALL => (0..self.wakes.len()).filter(|&s| s != from).for_each(wake),
            slot => wake(slot),
        }
        true
    }

    #[cfg(test)]
    fn holder(&self) -> Option<usize> {
        Some(self.holder.load(Ordering::Relaxed)).filter(|&h| h != ALL)
    }
}

thread_local! {
    /// Faults this fault thread has served.
    static SERVED: Cell<u32> = const { Cell::new(0) };
    /// The stat file of the thread this fault thread sampled last, kept open: a program
    /// with one thread is sampled through one descriptor.
    static STAT: RefCell<Option<(u32, File)>> = const { RefCell::new(None) };
}

/// The CPU thread `tid` of this process last ran on: field 39 of its stat (the fields
/// after the command's closing parenthesis start at field 3).
fn cpu_of_thread(tid: u32) -> Option<usize> {
    STAT.with(|kept| {
        let mut kept = kept.borrow_mut();
        if kept.as_ref().is_none_or(|(t, _)| *t != tid) {
            *kept = File::open(format!("/proc/self/task/{tid}/stat")).ok().map(|f| (tid, f));
        }
        let mut buf = [0u8; 1024];
        let read = kept.as_ref()?.1.read_at(&mut buf, 0);
        let Ok(n) = read else {
            // Gone (its number may come back as another thread's): open afresh next time.
            *kept = None;
            return None;
        };
        let stat = std::str::from_utf8(&buf[..n]).ok()?;
        stat.rsplit_once(')')?.1.split_whitespace().nth(39 - 3)?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_cpus() -> Pollers {
        Pollers::kept_on(&[Some(0), Some(1)]).expect("two eventfds")
    }

    fn pending(p: &Pollers, slot: usize) -> bool {
        crate::eventfd::drain(p.wakes[slot].as_raw_fd())
    }

    /// `n` samples of thread `tid` on `cpu`; how many changed the threads that poll.
    fn samples(p: &Pollers, n: u32, tid: u32, cpu: usize) -> usize {
        (0..n).filter(|_| p.note_sample(tid, || Some(cpu))).count()
    }

    #[test]
    fn faults_of_one_thread_on_one_cpu_give_the_token_to_the_fault_thread_there() {
        let p = two_cpus();
        assert!(p.polls(Some(0)) && p.polls(Some(1)), "everyone polls at first");
        // The first sample of a thread only names it; then a streak on one CPU.
        assert_eq!(samples(&p, STREAK, 7, 1), 0, "not before a streak");
        assert_eq!(p.holder(), None);
        assert_eq!(samples(&p, 1, 7, 1), 1);
        assert_eq!(p.holder(), Some(1));
        assert!(p.polls(Some(1)) && !p.polls(Some(0)));
        assert!(pending(&p, 1) && !pending(&p, 0), "only the new holder is woken");
    }

    /// The token held by the fault thread on CPU 0, for thread 7, its wake taken.
    fn held_on_cpu0() -> Pollers {
        let p = two_cpus();
        samples(&p, STREAK + 1, 7, 0);
        assert_eq!(p.holder(), Some(0));
        assert!(pending(&p, 0));
        p
    }

    #[test]
    fn the_token_follows_a_thread_the_scheduler_moves() {
        let p = held_on_cpu0();
        samples(&p, 1, 7, 1);
        assert_eq!(p.holder(), Some(1), "at once");
        assert!(pending(&p, 1) && !pending(&p, 0));
    }

    #[test]
    fn a_cpu_read_at_the_fault_is_a_sample_at_every_fault() {
        let p = two_cpus();
        // Served faults that carry the CPU sample each one: the token goes after a streak
        // of faults, not of every `SAMPLE`th...
        let moves = (0..=STREAK).filter(|_| p.note_served(7, Some(1))).count();
        assert_eq!((moves, p.holder()), (1, Some(1)));
        // ...and follows the thread at its first fault from another CPU.
        assert!(p.note_served(7, Some(0)));
        assert_eq!(p.holder(), Some(0));
    }

    #[test]
    fn another_thread_or_a_concurrent_fault_makes_everyone_poll() {
        let p = held_on_cpu0();
        let mut read = false;
        p.note_sample(8, || {
            read = true;
            Some(1)
        });
        assert!(!read, "another thread's CPU is not read");
        assert_eq!(p.holder(), None);
        assert!(pending(&p, 1) && !pending(&p, 0), "the one that did not poll is woken");
        // The streak starts again with the new thread.
        samples(&p, STREAK, 8, 1);
        assert_eq!(p.holder(), Some(1));
        // Two threads faulting in turn keep everyone polling.
        assert_eq!((0..4 * STREAK).filter(|i| p.note_sample(8 + i % 2, || Some(1))).count(), 1, "one move, to all");
        assert_eq!(p.holder(), None);
        samples(&p, STREAK + 1, 8, 1);
        assert_eq!(p.holder(), Some(1));
        assert!(p.note_concurrent());
        assert!(!p.note_concurrent(), "already all");
        assert!(p.polls(Some(0)) && p.polls(Some(1)));
        samples(&p, STREAK - 1, 8, 1);
        assert_eq!(p.holder(), None, "a concurrent fault restarts the streak");
        samples(&p, 1, 8, 1);
        assert_eq!(p.holder(), Some(1));
    }

    #[test]
    fn every_slot_gets_one_thread_wherever_the_threads_run() {
        // Both claims from this one thread, on one CPU: the second gets the other slot.
        let p = two_cpus();
        let mut slots = [p.claim_slot(), p.claim_slot()];
        slots.sort();
        assert_eq!(slots, [Some(0), Some(1)]);
        assert_eq!(p.claim_slot(), None, "a thread beyond the slots always polls");
        assert!(p.polls(None));
    }

    #[test]
    fn its_descriptors_are_the_slots_eventfds() {
        let p = two_cpus();
        assert_eq!(p.raw_fds().collect::<Vec<_>>(), [p.wake_fd(Some(0)), p.wake_fd(Some(1))]);
        assert!(p.raw_fds().all(|fd| fd >= 0));
        assert_eq!(Pollers::everyone().raw_fds().count(), 0);
    }

    #[test]
    fn threads_not_kept_on_cpus_always_poll() {
        let p = Pollers::kept_on(&[Some(0), None]).unwrap();
        assert!(!(0..10 * STREAK * SAMPLE).any(|_| p.note_served(std::process::id(), None)));
        assert!(p.polls(Some(0)) && p.polls(Some(1)) && p.polls(None));
        assert_eq!(p.wake_fd(Some(0)), -1);
        let one = Pollers::kept_on(&[Some(0)]).unwrap();
        assert!(one.cpus.is_empty(), "a single fault thread has nobody to hand the token to");
    }

    #[test]
    fn a_threads_cpu_is_read_from_its_stat() {
        // Keep this thread on the CPU it runs on, so that the answer cannot change.
        // SAFETY: sched_getcpu(3) takes no arguments.
        let here = unsafe { libc::sched_getcpu() };
        assert!(here >= 0, "sched_getcpu failed: {}", std::io::Error::last_os_error());
        // SAFETY: a zeroed cpu_set_t with one CPU below CPU_SETSIZE set, passed with its
        // size, for the calling thread only.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(here as usize, &mut set);
            assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0);
        }
        // SAFETY: gettid(2) takes no arguments.
        let tid = unsafe { libc::gettid() } as u32;
        assert_eq!(cpu_of_thread(tid), Some(here as usize));
        assert_eq!(cpu_of_thread(u32::MAX), None, "no such thread");
    }
}
