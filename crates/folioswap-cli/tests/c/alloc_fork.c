/*
 * alloc_fork.c TOTAL_MB THREADS: malloc/mmap/calloc/realloc memory, write it from
 * threads, fork, and check that parent and child each see their own copy.
 *
 * Allocates TOTAL_MB in all: half with malloc in 8 MiB blocks, half with
 * mmap(MAP_PRIVATE|MAP_ANONYMOUS) in 32 MiB regions; plus one calloc(16 MiB) checked
 * all-zero, and one malloc'd 4 MiB block realloc'd to 12 MiB whose first 4 MiB must
 * survive. THREADS threads write every 8-byte word of disjoint shares with
 * hash(block, word, generation) and everything is verified (generation 1). Then fork:
 *   child:  verify (gen 1); write gen 2 over the first half of each block; verify
 *           (first half gen 2, second half gen 1); print "child OK"; exit 0.
 *   parent: meanwhile rewrite the second half of each block with gen 3; wait for the
 *           child; verify (first half gen 1, second half gen 3); check the child exited
 *           0; print "parent OK"; free everything; exit 0.
 * Any mismatch prints block, word, got and expected, and exits 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB (1024UL * 1024UL)

enum kind { K_MALLOC, K_MMAP, K_CALLOC, K_REALLOC };

struct block {
    uint64_t *p;
    size_t bytes;
    size_t words;
    enum kind kind;
};

static struct block *blocks;
static size_t nblocks;
static unsigned nthreads;
static const char *who = "alloc_fork";

static atomic_ulong mismatches;

static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* splitmix64's stream for (block, generation), at position `word`. */
static inline uint64_t block_seed(size_t block, unsigned gen)
{
    return mix(((uint64_t)block << 8) ^ gen ^ 0x5A17F0125EEDULL);
}

static inline uint64_t value(uint64_t seed, size_t word)
{
    return mix(seed + (uint64_t)(word + 1) * 0x9E3779B97F4A7C15ULL);
}

static void die(const char *what)
{
    fprintf(stderr, "%s: %s: %s\n", who, what, strerror(errno));
    exit(1);
}

static void report(size_t block, size_t word, uint64_t got, uint64_t expected)
{
    unsigned long n = atomic_fetch_add(&mismatches, 1);
    if (n < 10)
        fprintf(stderr,
                "%s: MISMATCH block %zu word %zu (byte offset %zu): got %#018" PRIx64
                " expected %#018" PRIx64 "\n",
                who, block, word, word * 8, got, expected);
}

/* One pass over every block: thread `t` takes its share of each block's word range. The
 * first half of block b is words [0, words/2), the second half [words/2, words). A
 * generation of 0 in `write_gen[h]` leaves half h alone; `check_gen[h]` likewise. */
struct pass {
    unsigned write_gen[2];
    unsigned check_gen[2];
};

struct job {
    const struct pass *pass;
    unsigned t;
};

static void *worker(void *arg)
{
    const struct job *job = arg;
    const struct pass *pass = job->pass;
    for (size_t b = 0; b < nblocks; b++) {
        uint64_t *p = blocks[b].p;
        size_t n = blocks[b].words;
        size_t bounds[3] = {0, n / 2, n};
        for (int h = 0; h < 2; h++) {
            size_t lo = bounds[h], len = bounds[h + 1] - bounds[h];
            size_t from = lo + len * job->t / nthreads;
            size_t to = lo + len * (job->t + 1) / nthreads;
            if (pass->write_gen[h]) {
                uint64_t seed = block_seed(b, pass->write_gen[h]);
                for (size_t w = from; w < to; w++)
                    p[w] = value(seed, w);
            }
            if (pass->check_gen[h]) {
                uint64_t seed = block_seed(b, pass->check_gen[h]);
                for (size_t w = from; w < to; w++) {
                    uint64_t expected = value(seed, w);
                    if (p[w] != expected)
                        report(b, w, p[w], expected);
                }
            }
        }
    }
    return NULL;
}

static void run_pass(const struct pass *pass, const char *what)
{
    pthread_t tids[nthreads];
    struct job jobs[nthreads];
    for (unsigned t = 0; t < nthreads; t++) {
        jobs[t] = (struct job){pass, t};
        int rc = pthread_create(&tids[t], NULL, worker, &jobs[t]);
        if (rc) {
            errno = rc;
            die("pthread_create");
        }
    }
    for (unsigned t = 0; t < nthreads; t++)
        pthread_join(tids[t], NULL);
    unsigned long n = atomic_load(&mismatches);
    if (n) {
        fprintf(stderr, "%s: %s: %lu mismatched words\n", who, what, n);
        exit(1);
    }
}

static void add_block(void *p, size_t bytes, enum kind kind)
{
    blocks[nblocks++] = (struct block){p, bytes, bytes / sizeof(uint64_t), kind};
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: alloc_fork TOTAL_MB THREADS\n");
        return 2;
    }
    long total_mb = strtol(argv[1], NULL, 10);
    long threads = strtol(argv[2], NULL, 10);
    if (total_mb < 2 || threads < 1 || threads > 256) {
        fprintf(stderr, "alloc_fork: TOTAL_MB must be >= 2 and THREADS in 1..256\n");
        return 2;
    }
    nthreads = (unsigned)threads;
    setvbuf(stdout, NULL, _IOLBF, 0);

    size_t malloc_bytes = (size_t)total_mb / 2 * MIB;
    size_t mmap_bytes = (size_t)total_mb * MIB - malloc_bytes;
    size_t max_blocks = malloc_bytes / (8 * MIB) + 1 + mmap_bytes / (32 * MIB) + 1 + 2;
    blocks = calloc(max_blocks, sizeof(*blocks));
    if (!blocks)
        die("calloc of the block table");

    for (size_t done = 0; done < malloc_bytes;) {
        size_t bytes = malloc_bytes - done < 8 * MIB ? malloc_bytes - done : 8 * MIB;
        void *p = malloc(bytes);
        if (!p)
            die("malloc");
        add_block(p, bytes, K_MALLOC);
        done += bytes;
    }
    for (size_t done = 0; done < mmap_bytes;) {
        size_t bytes = mmap_bytes - done < 32 * MIB ? mmap_bytes - done : 32 * MIB;
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            die("mmap");
        add_block(p, bytes, K_MMAP);
        done += bytes;
    }

    /* calloc: all zero. */
    size_t calloc_bytes = 16 * MIB;
    uint64_t *c = calloc(calloc_bytes / 8, 8);
    if (!c)
        die("calloc");
    for (size_t w = 0; w < calloc_bytes / 8; w++) {
        if (c[w] != 0) {
            fprintf(stderr, "alloc_fork: calloc'd block not zero at word %zu: got %#" PRIx64 "\n",
                    w, c[w]);
            return 1;
        }
    }
    add_block(c, calloc_bytes, K_CALLOC);

    /* realloc 4 MiB -> 12 MiB: the first 4 MiB survive. */
    size_t r_before = 4 * MIB, r_after = 12 * MIB;
    uint64_t *r = malloc(r_before);
    if (!r)
        die("malloc for realloc");
    uint64_t rseed = block_seed(nblocks, 0);
    for (size_t w = 0; w < r_before / 8; w++)
        r[w] = value(rseed, w);
    uint64_t *r2 = realloc(r, r_after);
    if (!r2)
        die("realloc");
    for (size_t w = 0; w < r_before / 8; w++) {
        if (r2[w] != value(rseed, w)) {
            fprintf(stderr, "alloc_fork: realloc lost data at word %zu: got %#" PRIx64
                    " expected %#" PRIx64 "\n", w, r2[w], value(rseed, w));
            return 1;
        }
    }
    add_block(r2, r_after, K_REALLOC);

    /* malloc_usable_size: at least what was asked for. */
    for (size_t b = 0; b < nblocks; b++) {
        if (blocks[b].kind == K_MMAP)
            continue;
        size_t usable = malloc_usable_size(blocks[b].p);
        if (usable < blocks[b].bytes) {
            fprintf(stderr, "alloc_fork: malloc_usable_size of block %zu is %zu, below the %zu "
                    "bytes requested\n", b, usable, blocks[b].bytes);
            return 1;
        }
    }

    /* Generation 1 everywhere, verified. */
    run_pass(&(struct pass){{1, 1}, {0, 0}}, "write gen 1");
    run_pass(&(struct pass){{0, 0}, {1, 1}}, "verify gen 1");
    printf("generation 1 verified: %zu blocks, %zu MiB\n", nblocks,
           (size_t)total_mb + (calloc_bytes + r_after) / MIB);

    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        who = "alloc_fork child";
        run_pass(&(struct pass){{0, 0}, {1, 1}}, "child verify gen 1");
        run_pass(&(struct pass){{2, 0}, {0, 0}}, "child write gen 2");
        run_pass(&(struct pass){{0, 0}, {2, 1}}, "child verify gen 2/1");
        printf("child OK\n");
        fflush(stdout);
        _exit(0);
    }

    who = "alloc_fork parent";
    run_pass(&(struct pass){{0, 3}, {0, 0}}, "parent write gen 3");
    int status;
    pid_t w;
    do {
        w = waitpid(pid, &status, 0);
    } while (w < 0 && errno == EINTR);
    if (w < 0)
        die("waitpid");
    run_pass(&(struct pass){{0, 0}, {1, 3}}, "parent verify gen 1/3");
    if (WIFSIGNALED(status)) {
        fprintf(stderr, "alloc_fork parent: the child was killed by signal %d (%s)\n",
                WTERMSIG(status), strsignal(WTERMSIG(status)));
        return 1;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "alloc_fork parent: the child failed (status %#x)\n", status);
        return 1;
    }
    printf("parent OK\n");

    for (size_t b = 0; b < nblocks; b++) {
        if (blocks[b].kind == K_MMAP) {
            if (munmap(blocks[b].p, blocks[b].bytes) != 0)
                die("munmap");
        } else {
            free(blocks[b].p);
        }
    }
    free(blocks);
    return 0;
}
