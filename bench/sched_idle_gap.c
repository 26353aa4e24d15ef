/* How long a SCHED_IDLE thread waits for its CPU beside a busy SCHED_OTHER one: the
 * reason `local_wake.rs` drops a fault thread to SCHED_IDLE only while nothing else can
 * need it (BENCHMARKS.md, "The program stays on its CPU").
 *
 * A child spins at SCHED_OTHER; the parent, at SCHED_IDLE, reads the clock in a loop for
 * SECONDS; both are kept on CPU 1 (CPU 0 where there is one). Every jump of the clock over
 * 0.5 ms between two reads is a time the parent did not run. Prints how many, the
 * longest, and how long the parent ran in all.
 *
 * Build: cc -O2 -Wall -Wextra -o sched_idle_gap bench/sched_idle_gap.c
 * Usage: sched_idle_gap [SECONDS]   (default 3)
 */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 3.0;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(sysconf(_SC_NPROCESSORS_ONLN) > 1 ? 1 : 0, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
        perror("sched_setaffinity");
        return 1;
    }
    pid_t busy = fork();
    if (busy < 0) {
        perror("fork");
        return 1;
    }
    if (busy == 0) {
        for (;;) {
        }
    }
    struct sched_param param = {0};
    if (sched_setscheduler(0, SCHED_IDLE, &param) != 0) {
        perror("sched_setscheduler(SCHED_IDLE)");
        kill(busy, SIGKILL);
        return 1;
    }
    double start = now(), last = start, longest = 0, ran = 0;
    long gaps = 0;
    while (now() - start < seconds) {
        double t = now(), gap = t - last;
        if (gap > 0.0005) {
            gaps++;
            if (gap > longest)
                longest = gap;
        } else {
            ran += gap;
        }
        last = t;
    }
    kill(busy, SIGKILL);
    waitpid(busy, NULL, 0);
    printf("%.1f s beside a busy thread on one CPU: %ld waits, the longest %.1f ms; ran %.1f ms\n", seconds, gaps,
           longest * 1e3, ran * 1e3);
    return 0;
}
