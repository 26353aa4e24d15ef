/*
 * late_thread.c MB: a program that faults alone, then starts a thread that faults while
 * the first one computes without touching managed memory, both on one CPU. Under
 * `folioswap run` the fault thread that served the first one's last fault woke it at
 * SCHED_IDLE (`local_wake.rs`) and may still wait at that priority behind it, its CPU
 * never free, when the late thread's first fault comes: another fault thread must give it
 * its policy back (`fault_wake_rescued`), or the late thread waits for the scheduler's
 * rare slice of a SCHED_IDLE thread. Every word is checked, before and after the late
 * thread's writes. Prints "OK late thread, bad words 0" when all hold.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t *words;
static size_t nwords;
static atomic_int done;
/* The late thread touches one page in this many. */
#define LATE_STRIDE_PAGES 64
#define WORDS_PER_PAGE 512

static uint64_t version(size_t w, int round) { return ((uint64_t)w * 0x9E3779B97F4A7C15ULL) ^ ((uint64_t)round << 56); }

static int touched_late(size_t w) { return w % (LATE_STRIDE_PAGES * WORDS_PER_PAGE) == 0; }

static void *late(void *arg) {
    size_t *bad = arg;
    for (size_t w = 0; w < nwords; w += LATE_STRIDE_PAGES * WORDS_PER_PAGE) {
        if (words[w] != version(w, 0))
            (*bad)++;
        words[w] = version(w, 1);
    }
    atomic_store(&done, 1);
    return NULL;
}

int main(int argc, char **argv) {
    size_t mb = argc > 1 ? strtoul(argv[1], NULL, 10) : 64;
    nwords = (mb << 20) / sizeof(uint64_t);
    words = malloc(mb << 20);
    if (!words) {
        perror("malloc");
        return 1;
    }
    for (size_t w = 0; w < nwords; w++)
        words[w] = version(w, 0);
    /* From here on one CPU: the engine has started, with a fault thread kept on each. */
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu() < 0 ? 0 : sched_getcpu(), &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0) {
        perror("sched_setaffinity");
        return 1;
    }
    size_t bad = 0, late_bad = 0;
    /* Faults alone: read back every page. */
    for (size_t w = 0; w < nwords; w++)
        if (words[w] != version(w, 0))
            bad++;
    pthread_t thread;
    if (pthread_create(&thread, NULL, late, &late_bad) != 0) {
        perror("pthread_create");
        return 1;
    }
    /* Compute, touching no managed memory, until the late thread is done. */
    volatile unsigned long spins = 0;
    while (!atomic_load(&done))
        spins++;
    pthread_join(thread, NULL);
    for (size_t w = 0; w < nwords; w++)
        if (words[w] != version(w, touched_late(w)))
            bad++;
    bad += late_bad;
    printf("OK late thread, bad words %zu\n", bad);
    return bad != 0;
}
