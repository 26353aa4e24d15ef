/*
 * threads_come_and_go.c MB ROUNDS THREADS: managed memory rewritten, round after round,
 * by threads that live for one round each (thread ids are reused, thread-local storage
 * freed and made again), while it swaps. libfolioswap.so registers each thread's rseq area
 * with the engine at its first allocation and forgets it at its exit; fault threads read
 * it at every fault (`thread_cpu.rs`). Half the threads allocate first (registered), half
 * never do (served through the procfs sample). Every round each thread checks that its
 * words hold the last round's version and writes the next; after each round a forked
 * child checks every word (its forking thread registered anew under its new id). Prints
 * "OK ROUNDS rounds, N threads, bad words 0" when every word verified.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t *words;
static size_t nwords;
static int nthreads;

static uint64_t version(size_t w, int round) { return ((uint64_t)w * 0x9E3779B97F4A7C15ULL) ^ ((uint64_t)round << 48) ^ 0x5bd1e995; }

struct job {
    int index, round;
    size_t bad;
};

static void *rewrite(void *arg)
{
    struct job *job = arg;
    if (job->index % 2 == 0)
        free(malloc(64 + job->index)); /* registered at this call */
    for (size_t w = job->index; w < nwords; w += nthreads) {
        job->bad += words[w] != version(w, job->round);
        words[w] = version(w, job->round + 1);
    }
    return NULL;
}

static size_t check_all(int round)
{
    size_t bad = 0;
    for (size_t w = 0; w < nwords; w++)
        bad += words[w] != version(w, round);
    return bad;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s MB ROUNDS THREADS\n", argv[0]);
        return 2;
    }
    nwords = (size_t)atoi(argv[1]) << 17;
    int rounds = atoi(argv[2]);
    nthreads = atoi(argv[3]);
    words = malloc(nwords * sizeof *words);
    if (!words)
        return 2;
    for (size_t w = 0; w < nwords; w++)
        words[w] = version(w, 0);
    size_t bad = 0;
    pthread_t *threads = calloc(nthreads, sizeof *threads);
    struct job *jobs = calloc(nthreads, sizeof *jobs);
    for (int round = 0; round < rounds; round++) {
        for (int i = 0; i < nthreads; i++) {
            jobs[i] = (struct job){ .index = i, .round = round };
            if (pthread_create(&threads[i], NULL, rewrite, &jobs[i]) != 0) {
                perror("pthread_create");
                return 2;
            }
        }
        for (int i = 0; i < nthreads; i++) {
            pthread_join(threads[i], NULL);
            bad += jobs[i].bad;
        }
        pid_t child = fork();
        if (child == 0)
            _exit(check_all(round + 1) == 0 ? 0 : 1);
        int status = 0;
        if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            printf("FAILED: the child of round %d found bad words (status %d)\n", round, status);
            return 1;
        }
    }
    bad += check_all(rounds);
    printf("%s %d rounds, %d threads, bad words %zu\n", bad == 0 ? "OK" : "FAILED", rounds, rounds * nthreads, bad);
    return bad != 0;
}
