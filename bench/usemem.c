/*
 * usemem.c: a standalone clone of vm-scalability's usemem, for running under
 * `folioswap run` (or anything else) and comparing with the kernel's swap.
 *
 *   usemem [-n PROCS] [-r ROUNDS] [-R] [-s SEED] [-v] SIZE
 *
 * The parent forks PROCS processes (default 1) before allocating anything. Each child
 * maps SIZE bytes (K/M/G suffixes accepted) of private anonymous memory with mmap() and,
 * for each of ROUNDS rounds (default 1), writes every 8-byte word: word i gets the value
 * i + round * nwords, so every round stores new values. The order is sequential, or with
 * -R a random permutation of the 4 KiB pages (seeded by -s and the process index), all
 * words of each page written in turn. Only the write rounds are timed, and each child
 * prints one line as usemem does:
 *
 *   BYTES bytes / USECS usecs = KBPS KB/s
 *
 * where BYTES = SIZE * ROUNDS. After timing, each child verifies that every word holds
 * the last round's value; a mismatch prints "usemem: verify failed at word N: got X
 * expected Y" to stderr and fails the child. With -v a child that verified prints
 * "verified N words". The parent waits for all children and exits 1 if any failed or
 * was killed (saying which), else 0.
 *
 * Differences from vm-scalability's usemem: only the options above exist (no -f file
 * mappings, -U/-A/-H/-S variants, --detach, --sleep, --step, --readonly ...); children
 * are always forked, even for -n 1; the written values are per-word and per-round (not
 * a constant) and are always verified afterwards, which the original does not do.
 *
 * Build: cc -O2 -Wall -Wextra -pthread -o usemem bench/usemem.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PAGE_BYTES 4096UL
#define PAGE_WORDS (PAGE_BYTES / sizeof(uint64_t))

static void usage(void)
{
    fprintf(stderr,
            "usage: usemem [-n PROCS] [-r ROUNDS] [-R] [-s SEED] [-v] SIZE\n"
            "  SIZE    bytes per process, with an optional K, M or G suffix\n"
            "  -n      processes to fork (default 1)\n"
            "  -r      write rounds (default 1)\n"
            "  -R      visit 4 KiB pages in random order\n"
            "  -s      random seed for -R (default 0)\n"
            "  -v      print \"verified N words\" per process\n");
    exit(2);
}

static int parse_u64(const char *s, uint64_t *out, int allow_suffix)
{
    char *end;
    errno = 0;
    if (*s == '-' || *s == '\0')
        return -1;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s)
        return -1;
    uint64_t mult = 1;
    if (allow_suffix && *end) {
        switch (*end) {
        case 'k': case 'K': mult = 1ULL << 10; break;
        case 'm': case 'M': mult = 1ULL << 20; break;
        case 'g': case 'G': mult = 1ULL << 30; break;
        case 't': case 'T': mult = 1ULL << 40; break;
        default: return -1;
        }
        end++;
        if (*end == 'b' || *end == 'B')
            end++;
    }
    if (*end)
        return -1;
    if (v > UINT64_MAX / mult)
        return -1;
    *out = v * mult;
    return 0;
}

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint64_t now_usecs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000ULL + (uint64_t)ts.tv_nsec / 1000ULL;
}

static int child(unsigned idx, uint64_t size, uint64_t rounds, int random_order,
                 uint64_t seed, int verbose)
{
    uint64_t nwords = size / sizeof(uint64_t);
    uint64_t npages = (nwords + PAGE_WORDS - 1) / PAGE_WORDS;

    uint64_t *perm = NULL;
    if (random_order && npages > 0) {
        perm = malloc(npages * sizeof(*perm));
        if (!perm) {
            fprintf(stderr, "usemem: process %u: cannot allocate the page order: %s\n", idx,
                    strerror(errno));
            return 1;
        }
        for (uint64_t p = 0; p < npages; p++)
            perm[p] = p;
        uint64_t state = seed * 0x100000001B3ULL + idx;
        for (uint64_t p = npages - 1; p > 0; p--) {
            uint64_t j = splitmix64(&state) % (p + 1);
            uint64_t t = perm[p];
            perm[p] = perm[j];
            perm[j] = t;
        }
    }

    uint64_t *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        fprintf(stderr, "usemem: process %u: mmap of %" PRIu64 " bytes failed: %s\n", idx, size,
                strerror(errno));
        free(perm);
        return 1;
    }

    uint64_t start = now_usecs();
    for (uint64_t r = 0; r < rounds; r++) {
        uint64_t base = r * nwords;
        if (!perm) {
            for (uint64_t i = 0; i < nwords; i++)
                mem[i] = i + base;
        } else {
            for (uint64_t p = 0; p < npages; p++) {
                uint64_t first = perm[p] * PAGE_WORDS;
                uint64_t last = first + PAGE_WORDS;
                if (last > nwords)
                    last = nwords;
                for (uint64_t i = first; i < last; i++)
                    mem[i] = i + base;
            }
        }
    }
    uint64_t usecs = now_usecs() - start;
    if (usecs == 0)
        usecs = 1;

    uint64_t bytes = size * rounds;
    printf("%lu bytes / %lu usecs = %lu KB/s\n", (unsigned long)bytes, (unsigned long)usecs,
           (unsigned long)((double)bytes / 1024.0 * 1e6 / (double)usecs));
    fflush(stdout);

    int failed = 0;
    if (rounds > 0) {
        uint64_t base = (rounds - 1) * nwords;
        for (uint64_t i = 0; i < nwords; i++) {
            if (mem[i] != i + base) {
                fprintf(stderr, "usemem: verify failed at word %" PRIu64 ": got %" PRIu64
                        " expected %" PRIu64 "\n", i, mem[i], i + base);
                failed = 1;
                break;
            }
        }
    }
    if (!failed && verbose) {
        printf("verified %" PRIu64 " words\n", rounds > 0 ? nwords : 0);
        fflush(stdout);
    }

    if (munmap(mem, size) != 0) {
        fprintf(stderr, "usemem: process %u: munmap failed: %s\n", idx, strerror(errno));
        failed = 1;
    }
    free(perm);
    return failed;
}

int main(int argc, char **argv)
{
    uint64_t procs = 1, rounds = 1, seed = 0, size = 0;
    int random_order = 0, verbose = 0, opt;

    while ((opt = getopt(argc, argv, "n:r:Rs:vh")) != -1) {
        switch (opt) {
        case 'n':
            if (parse_u64(optarg, &procs, 0) || procs == 0 || procs > 4096) {
                fprintf(stderr, "usemem: bad process count '%s'\n", optarg);
                return 2;
            }
            break;
        case 'r':
            if (parse_u64(optarg, &rounds, 0)) {
                fprintf(stderr, "usemem: bad round count '%s'\n", optarg);
                return 2;
            }
            break;
        case 'R':
            random_order = 1;
            break;
        case 's':
            if (parse_u64(optarg, &seed, 0)) {
                fprintf(stderr, "usemem: bad seed '%s'\n", optarg);
                return 2;
            }
            break;
        case 'v':
            verbose = 1;
            break;
        default:
            usage();
        }
    }
    if (optind != argc - 1)
        usage();
    if (parse_u64(argv[optind], &size, 1) || size == 0) {
        fprintf(stderr, "usemem: bad size '%s' (bytes, with an optional K, M or G suffix)\n",
                argv[optind]);
        return 2;
    }
    if (rounds > 0 && size > UINT64_MAX / rounds) {
        fprintf(stderr, "usemem: size * rounds overflows\n");
        return 2;
    }

    fflush(stdout);
    pid_t *pids = calloc(procs, sizeof(*pids));
    if (!pids) {
        perror("usemem: calloc");
        return 1;
    }
    int failed = 0;
    uint64_t started = 0;
    for (uint64_t i = 0; i < procs; i++) {
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "usemem: fork of process %" PRIu64 " failed: %s\n", i, strerror(errno));
            failed = 1;
            break;
        }
        if (pid == 0) {
            free(pids);
            exit(child((unsigned)i, size, rounds, random_order, seed, verbose));
        }
        pids[i] = pid;
        started++;
    }

    for (uint64_t i = 0; i < started; i++) {
        int status;
        pid_t r;
        do {
            r = waitpid(pids[i], &status, 0);
        } while (r < 0 && errno == EINTR);
        if (r < 0) {
            fprintf(stderr, "usemem: waitpid for process %" PRIu64 " (pid %d) failed: %s\n", i,
                    (int)pids[i], strerror(errno));
            failed = 1;
        } else if (WIFSIGNALED(status)) {
            fprintf(stderr, "usemem: process %" PRIu64 " (pid %d) was killed by signal %d (%s)\n",
                    i, (int)pids[i], WTERMSIG(status), strsignal(WTERMSIG(status)));
            failed = 1;
        } else if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
            fprintf(stderr, "usemem: process %" PRIu64 " (pid %d) failed (exit status %d)\n", i,
                    (int)pids[i], WEXITSTATUS(status));
            failed = 1;
        }
    }
    free(pids);
    return failed ? 1 : 0;
}
