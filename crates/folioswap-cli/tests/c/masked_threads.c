/*
 * masked_threads.c MB [exec]: managed memory read back by threads that block every
 * signal, and by a signal handler installed with a full sa_mask: in folioswap's signal
 * mode each of those reads is a swap-in served by a SIGBUS handler on the reading thread,
 * which the kernel would kill if the thread blocked SIGBUS. Prints one "... OK" line per
 * reader that verified every word, and checks that the masks still block the other
 * signals. Then it installs a SIGBUS handler of its own with sigaction, reads everything
 * again, and checks that sigaction reports its handler and that a SIGBUS it raises reaches
 * it ("chained OK"). With "exec", it first blocks SIGBUS with the raw system call (no libc wrapper
 * sees it) and execs itself, so that the program starts with SIGBUS blocked.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static uint64_t *words;
static size_t nwords;
static volatile sig_atomic_t handler_bad = -1;

static uint64_t expected(size_t w) { return (w + 1) * 0x9E3779B97F4A7C15ULL; }

static size_t count_bad(void)
{
    size_t bad = 0;
    for (size_t w = 0; w < nwords; w++)
        bad += words[w] != expected(w);
    return bad;
}

/* Whether this thread's mask blocks SIGUSR2 (it must: the program asked), and whether it
 * blocks SIGBUS. */
static int usr2_blocked(void)
{
    sigset_t cur;
    pthread_sigmask(SIG_SETMASK, NULL, &cur);
    return sigismember(&cur, SIGUSR2) == 1;
}

static const char *sigbus_state(void)
{
    sigset_t cur;
    pthread_sigmask(SIG_SETMASK, NULL, &cur);
    return sigismember(&cur, SIGBUS) ? "blocked" : "deliverable";
}

static void report(const char *who)
{
    size_t bad = count_bad();
    printf("%s %s, SIGBUS %s (bad words %zu, SIGUSR2 %s)\n", who, bad == 0 && usr2_blocked() ? "OK" : "FAILED",
           sigbus_state(), bad, usr2_blocked() ? "blocked" : "not blocked");
}

static void *blocked_by_pthread_sigmask(void *arg)
{
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    report("pthread_sigmask");
    return NULL;
}

static void *blocked_by_sigprocmask(void *arg)
{
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    report("sigprocmask");
    return NULL;
}

static volatile sig_atomic_t own_sigbus;

static void on_own_sigbus(int sig, siginfo_t *info, void *context)
{
    (void)sig;
    (void)context;
    if (info->si_code > 0) {
        /* A fault's SIGBUS: the engine's handler was replaced, and returning would
         * fault again for ever. */
        static const char msg[] = "chained FAILED: the program's handler got a fault on managed memory\n";
        write(1, msg, sizeof msg - 1);
        _exit(3);
    }
    own_sigbus = 1;
}

static void on_usr1(int sig)
{
    (void)sig;
    handler_bad = (sig_atomic_t)count_bad();
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: masked_threads MB [exec]\n");
        return 2;
    }
    if (argc > 2 && strcmp(argv[2], "exec") == 0) {
        uint64_t set = 1ULL << (SIGBUS - 1);
        if (syscall(SYS_rt_sigprocmask, SIG_BLOCK, &set, NULL, 8) != 0) {
            perror("masked_threads: rt_sigprocmask");
            return 1;
        }
        char *args[] = {argv[0], argv[1], NULL};
        execv("/proc/self/exe", args);
        perror("masked_threads: execv");
        return 1;
    }
    sigset_t cur;
    pthread_sigmask(SIG_SETMASK, NULL, &cur);
    printf("SIGBUS %s at start\n", sigismember(&cur, SIGBUS) ? "blocked" : "deliverable");

    size_t size = (size_t)strtol(argv[1], NULL, 10) << 20;
    nwords = size / 8;
    words = malloc(size);
    if (!words) {
        perror("masked_threads: malloc");
        return 1;
    }
    for (size_t w = 0; w < nwords; w++)
        words[w] = expected(w);

    pthread_t t;
    pthread_create(&t, NULL, blocked_by_pthread_sigmask, NULL);
    pthread_join(t, NULL);
    pthread_create(&t, NULL, blocked_by_sigprocmask, NULL);
    pthread_join(t, NULL);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigfillset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    raise(SIGUSR1);
    printf("handler %s (bad words %ld)\n", handler_bad == 0 ? "OK" : "FAILED", (long)handler_bad);

    struct sigaction own, got;
    memset(&own, 0, sizeof own);
    own.sa_sigaction = on_own_sigbus;
    own.sa_flags = SA_SIGINFO;
    sigemptyset(&own.sa_mask);
    sigaction(SIGBUS, &own, NULL);
    size_t bad = count_bad();
    sigaction(SIGBUS, NULL, &got);
    raise(SIGBUS);
    int reported = got.sa_sigaction == on_own_sigbus && (got.sa_flags & SA_SIGINFO);
    printf("chained %s (bad words %zu, sigaction %s, raised SIGBUS %s)\n", bad == 0 && reported && own_sigbus ? "OK" : "FAILED",
           bad, reported ? "reports it" : "does not report it", own_sigbus ? "reached it" : "lost");
    free(words);
    return 0;
}
