/*
 * io_syscalls.c DIR SIZE_MB: system calls on malloc'd memory that may be swapped out.
 *
 *   read:   DIR/data (SIZE_MB of a known pattern) is read(2) into one malloc(SIZE_MB)
 *           buffer in 1 MiB calls, and the buffer checked against the pattern.
 *   write:  a second malloc(SIZE_MB) buffer is touched fully (pushing the first one out
 *           when the limit is smaller), then the first buffer is write(2)n to DIR/copy,
 *           and DIR/copy compared with DIR/data through small stack buffers.
 *   O_DIRECT: DIR/data is read with O_DIRECT into a posix_memalign(4096, SIZE_MB)
 *           buffer and checked; skipped ("O_DIRECT unsupported on DIR") if the open
 *           fails with EINVAL.
 *   futex:  a mutex, a condition variable and a counter live inside a malloc'd 4 MiB
 *           block; two threads ping-pong 20000 times each while a third keeps writing
 *           over a separate 2 x SIZE_MB buffer so that pages get evicted meanwhile.
 *
 * Prints "read OK", "write OK", "O_DIRECT OK" (or the skip line) and "futex OK"; exits
 * non-zero with a message on any failure. DIR/data and DIR/copy are left for the caller.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define MIB (1024UL * 1024UL)
#define PATTERN_CHUNK (64UL * 1024UL)
#define ROUNDTRIPS 20000

static void die(const char *what)
{
    fprintf(stderr, "io_syscalls: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void fail(const char *fmt, const char *detail)
{
    fprintf(stderr, "io_syscalls: ");
    fprintf(stderr, fmt, detail);
    fprintf(stderr, "\n");
    exit(1);
}

/* The file's word at byte offset 8*i. */
static inline uint64_t pattern(uint64_t i)
{
    uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Check `len` bytes at file offset `off` held in `buf` (both multiples of 8). */
static int check_pattern(const char *what, const uint64_t *buf, size_t off, size_t len)
{
    for (size_t w = 0; w < len / 8; w++) {
        uint64_t i = off / 8 + w;
        if (buf[w] != pattern(i)) {
            fprintf(stderr, "io_syscalls: %s: byte offset %" PRIu64 ": got %#018" PRIx64
                    " expected %#018" PRIx64 "\n", what, i * 8, buf[w], pattern(i));
            return -1;
        }
    }
    return 0;
}

static void write_all(int fd, const void *buf, size_t len, const char *what)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            die(what);
        if (n == 0)
            fail("%s: write returned 0", what);
        p += n;
        len -= (size_t)n;
    }
}

/* Read exactly `len` bytes unless EOF comes first; returns the count. */
static size_t read_full(int fd, void *buf, size_t len, const char *what)
{
    char *p = buf;
    size_t done = 0;
    while (done < len) {
        ssize_t n = read(fd, p + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            die(what);
        if (n == 0)
            break;
        done += (size_t)n;
    }
    return done;
}

/* ---- futex ping-pong --------------------------------------------------------------- */

struct shared {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    uint64_t counter; /* incremented by both players, alternately */
    int turn;         /* whose move: 0 or 1 */
};

static struct shared *shared;
static atomic_int players_done;

static void *player(void *arg)
{
    int me = (int)(intptr_t)arg;
    for (int i = 0; i < ROUNDTRIPS; i++) {
        pthread_mutex_lock(&shared->lock);
        while (shared->turn != me)
            pthread_cond_wait(&shared->cond, &shared->lock);
        if (shared->counter % 2 != (uint64_t)me) {
            fprintf(stderr, "io_syscalls: futex: player %d saw counter %" PRIu64 " on its turn\n",
                    me, shared->counter);
            exit(1);
        }
        shared->counter++;
        shared->turn = 1 - me;
        pthread_cond_broadcast(&shared->cond);
        pthread_mutex_unlock(&shared->lock);
    }
    atomic_fetch_add(&players_done, 1);
    return NULL;
}

struct churn {
    uint64_t *buf;
    size_t words;
    uint64_t passes;
};

/* Keep writing over the churn buffer until both players are done, and at least one full
 * pass, so that eviction really happens during the ping-pong whatever the timing. */
static void *churner(void *arg)
{
    struct churn *c = arg;
    do {
        for (size_t w = 0; w < c->words; w += 512)
            c->buf[w] = c->passes + w;
        c->passes++;
    } while (atomic_load(&players_done) < 2);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: io_syscalls DIR SIZE_MB\n");
        return 2;
    }
    const char *dir = argv[1];
    long size_mb = strtol(argv[2], NULL, 10);
    if (size_mb < 1) {
        fprintf(stderr, "io_syscalls: SIZE_MB must be >= 1\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    size_t size = (size_t)size_mb * MIB;

    char data_path[4096], copy_path[4096];
    snprintf(data_path, sizeof data_path, "%s/data", dir);
    snprintf(copy_path, sizeof copy_path, "%s/copy", dir);

    /* DIR/data from a small static buffer. */
    static uint64_t chunk[PATTERN_CHUNK / 8];
    int fd = open(data_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        die(data_path);
    for (size_t off = 0; off < size; off += PATTERN_CHUNK) {
        for (size_t w = 0; w < PATTERN_CHUNK / 8; w++)
            chunk[w] = pattern(off / 8 + w);
        write_all(fd, chunk, PATTERN_CHUNK, "write DIR/data");
    }
    if (fsync(fd) != 0 || close(fd) != 0)
        die("fsync/close DIR/data");

    /* read(2) into malloc'd memory, 1 MiB per call. */
    uint64_t *buf1 = malloc(size);
    if (!buf1)
        die("malloc buffer 1");
    fd = open(data_path, O_RDONLY);
    if (fd < 0)
        die(data_path);
    for (size_t off = 0; off < size; off += MIB) {
        size_t n = read_full(fd, (char *)buf1 + off, MIB, "read DIR/data");
        if (n != MIB) {
            fprintf(stderr, "io_syscalls: read DIR/data: short file at offset %zu\n", off + n);
            return 1;
        }
    }
    close(fd);
    if (check_pattern("read", buf1, 0, size))
        return 1;
    printf("read OK\n");

    /* Touch a second buffer fully: buffer 1 gets swapped out under a small limit. */
    uint64_t *buf2 = malloc(size);
    if (!buf2)
        die("malloc buffer 2");
    for (size_t w = 0; w < size / 8; w++)
        buf2[w] = ~pattern(w);

    /* write(2) from buffer 1 (swapped out) to DIR/copy, then compare with DIR/data. */
    fd = open(copy_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        die(copy_path);
    write_all(fd, buf1, size, "write DIR/copy");
    if (fsync(fd) != 0 || close(fd) != 0)
        die("fsync/close DIR/copy");
    int fa = open(data_path, O_RDONLY), fb = open(copy_path, O_RDONLY);
    if (fa < 0 || fb < 0)
        die("open for compare");
    for (size_t off = 0;; off += 4096) {
        char a[4096], b[4096];
        size_t na = read_full(fa, a, sizeof a, "read DIR/data");
        size_t nb = read_full(fb, b, sizeof b, "read DIR/copy");
        if (na != nb) {
            fprintf(stderr, "io_syscalls: write: DIR/copy and DIR/data differ in size near "
                    "offset %zu\n", off);
            return 1;
        }
        if (na == 0)
            break;
        if (memcmp(a, b, na) != 0) {
            size_t i = 0;
            while (a[i] == b[i])
                i++;
            fprintf(stderr, "io_syscalls: write: DIR/copy differs from DIR/data at byte %zu: "
                    "got %#04x expected %#04x\n", off + i, (unsigned char)b[i],
                    (unsigned char)a[i]);
            return 1;
        }
    }
    close(fa);
    close(fb);
    for (size_t w = 0; w < size / 8; w++) {
        if (buf2[w] != ~pattern(w)) {
            fprintf(stderr, "io_syscalls: buffer 2 word %zu: got %#018" PRIx64 " expected %#018"
                    PRIx64 "\n", w, buf2[w], ~pattern(w));
            return 1;
        }
    }
    printf("write OK\n");
    free(buf1);
    free(buf2);

    /* O_DIRECT into posix_memalign'd memory. */
    void *dbuf = NULL;
    int rc = posix_memalign(&dbuf, 4096, size);
    if (rc) {
        errno = rc;
        die("posix_memalign");
    }
    fd = open(data_path, O_RDONLY | O_DIRECT);
    if (fd < 0 && errno == EINVAL) {
        printf("O_DIRECT unsupported on %s\n", dir);
    } else if (fd < 0) {
        die("open DIR/data with O_DIRECT");
    } else {
        size_t n = read_full(fd, dbuf, size, "read DIR/data with O_DIRECT");
        if (n != size) {
            fprintf(stderr, "io_syscalls: O_DIRECT: read %zu of %zu bytes\n", n, size);
            return 1;
        }
        close(fd);
        if (check_pattern("O_DIRECT", dbuf, 0, size))
            return 1;
        printf("O_DIRECT OK\n");
    }
    free(dbuf);

    /* Futexes in malloc'd memory while other memory is being evicted. */
    char *block = malloc(4 * MIB);
    if (!block)
        die("malloc futex block");
    memset(block, 0xA5, 4 * MIB);
    /* Off any page or folio boundary, in the middle of the block. */
    shared = (struct shared *)(block + 2 * MIB + 1000 * 64);
    memset(shared, 0, sizeof *shared);
    if (pthread_mutex_init(&shared->lock, NULL) || pthread_cond_init(&shared->cond, NULL))
        fail("%s", "pthread_mutex_init/pthread_cond_init failed");

    struct churn churn = {NULL, 2 * size / 8, 0};
    churn.buf = malloc(2 * size);
    if (!churn.buf)
        die("malloc churn buffer");
    pthread_t tp[2], tc;
    if (pthread_create(&tc, NULL, churner, &churn) ||
        pthread_create(&tp[0], NULL, player, (void *)(intptr_t)0) ||
        pthread_create(&tp[1], NULL, player, (void *)(intptr_t)1))
        fail("%s", "pthread_create failed");
    pthread_join(tp[0], NULL);
    pthread_join(tp[1], NULL);
    pthread_join(tc, NULL);
    if (shared->counter != 2 * ROUNDTRIPS || shared->turn != 0) {
        fprintf(stderr, "io_syscalls: futex: counter %" PRIu64 " (expected %d), turn %d\n",
                shared->counter, 2 * ROUNDTRIPS, shared->turn);
        return 1;
    }
    for (size_t i = 0; i < 4 * MIB; i++) {
        if ((block + i < (char *)shared || block + i >= (char *)(shared + 1)) &&
            (unsigned char)block[i] != 0xA5) {
            fprintf(stderr, "io_syscalls: futex block byte %zu changed to %#04x\n", i,
                    (unsigned char)block[i]);
            return 1;
        }
    }
    pthread_cond_destroy(&shared->cond);
    pthread_mutex_destroy(&shared->lock);
    printf("futex OK (%" PRIu64 " churn passes over %zu MiB)\n", churn.passes, 2 * size / MIB);
    free(churn.buf);
    free(block);
    return 0;
}
