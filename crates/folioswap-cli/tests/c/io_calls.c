/*
 * io_calls.c DIR SIZE_MB: every I/O call family libfolioswap.so wraps, each made on
 * malloc'd (managed) memory that is swapped out at the moment of the call.
 *
 * As an ordinary user the engine's userfaultfd is user-mode-only, so the kernel cannot
 * fault such memory in itself: without the library's wrappers these calls fail with
 * EFAULT (or stop short). Before each call the buffers are pushed out by writing a
 * separate SIZE_MB buffer (run it with a memory_high well below SIZE_MB), and mincore(2)
 * must show pages of them missing, else the check proves nothing and the program fails.
 * Each transfer is a single call of the whole SIZE_MB (or a part of it), larger than the
 * wrappers' chunk, so their chunking is exercised too.
 *
 *   read:     DIR/data (SIZE_MB of a known pattern) into a buffer with one read(2);
 *   write:    that buffer to DIR/copy with one write(2) (the caller compares the files);
 *   pread/pwrite: the second half of DIR/data with one pread(2), written to DIR/copy-p
 *             at offset 0 with one pwrite(2);
 *   readv/writev, preadv/pwritev: three buffers, one call each way, to DIR/copy-v;
 *   send/recv, sendmsg/recvmsg: SIZE_MB through a stream socketpair, a thread sending
 *             from one buffer, the main thread receiving into another;
 *   sendto/recvfrom: 64 KiB datagrams through a datagram socketpair;
 *   fread/fwrite: one fread(3) of DIR/data and one fwrite(3) to DIR/copy-f;
 *   O_DIRECT: one read(2) of DIR/data opened O_DIRECT into posix_memalign'd memory
 *             ("O_DIRECT unsupported on DIR" if the open fails with EINVAL).
 *
 * Every copy written is read back through a small static buffer and checked. Prints
 * "<name> OK (<percent> swapped out)" per family; exits 1 with a message on any failure.
 * DIR/data and the copies (DIR/copy, DIR/copy-p, DIR/copy-v, DIR/copy-f) are left for
 * the caller.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define MIB (1024UL * 1024UL)
#define PAGE 4096UL
#define DGRAM (64UL * 1024UL)

static size_t size;
static char *pusher;
static unsigned push_round;
static const char *dir;

static void die(const char *what)
{
    fprintf(stderr, "io_calls: %s: %s\n", what, strerror(errno));
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

/* `len` bytes at file offset `off` in `buf` (both multiples of 8) hold the pattern. */
static void check_pattern(const char *what, const void *buf, size_t off, size_t len)
{
    const uint64_t *w = buf;
    for (size_t k = 0; k < len / 8; k++) {
        uint64_t i = off / 8 + k;
        if (w[k] != pattern(i)) {
            fprintf(stderr, "io_calls: %s: byte offset %" PRIu64 ": got %#018" PRIx64
                    " expected %#018" PRIx64 "\n", what, i * 8, w[k], pattern(i));
            exit(1);
        }
    }
}

static void fill_pattern(void *buf, size_t off, size_t len)
{
    uint64_t *w = buf;
    for (size_t k = 0; k < len / 8; k++)
        w[k] = pattern(off / 8 + k);
}

static void *buffer(size_t len, int byte)
{
    char *p = malloc(len);
    if (!p)
        die("malloc");
    memset(p, byte, len);
    return p;
}

/* Write every page of the pusher: what was touched before is evicted. */
static void push_out(void)
{
    push_round++;
    for (size_t i = 0; i < size; i += PAGE)
        pusher[i] = (char)(push_round + i / PAGE);
}

/* Percent of `buf`'s pages that are not mapped now; fails if none is missing. */
static int require_swapped(const char *what, void *buf, size_t len)
{
    uintptr_t start = (uintptr_t)buf & ~(PAGE - 1);
    size_t pages = ((uintptr_t)buf + len - start + PAGE - 1) / PAGE;
    unsigned char *vec = malloc(pages);
    if (!vec || mincore((void *)start, pages * PAGE, vec) != 0)
        die("mincore");
    size_t missing = 0;
    for (size_t i = 0; i < pages; i++)
        missing += !(vec[i] & 1);
    free(vec);
    if (missing == 0) {
        fprintf(stderr, "io_calls: %s: the buffer is fully resident before the call; run with a "
                "memory_high below SIZE_MB\n", what);
        exit(1);
    }
    return (int)(100 * missing / pages);
}

static int open_in_dir(const char *name, int flags)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, flags, 0644);
    if (fd < 0)
        die(path);
    return fd;
}

/* DIR/name is `len` bytes: the pattern from file offset `data_off` on, then (if `twice`)
 * the same again. Read through a small static buffer, not managed memory. */
static void check_file(const char *name, size_t data_off, size_t len, int twice)
{
    static uint64_t buf[8192];
    int fd = open_in_dir(name, O_RDONLY);
    struct stat st;
    if (fstat(fd, &st) != 0)
        die("fstat");
    size_t total = twice ? 2 * len : len;
    if ((size_t)st.st_size != total) {
        fprintf(stderr, "io_calls: DIR/%s has %lld bytes, expected %zu\n", name, (long long)st.st_size, total);
        exit(1);
    }
    for (size_t pos = 0, n; pos < total; pos += n) {
        n = total - pos < sizeof buf ? total - pos : sizeof buf;
        if (n > len - pos % len)
            n = len - pos % len; /* stop at the seam of a doubled copy */
        if (pread(fd, buf, n, (off_t)pos) != (ssize_t)n)
            die("pread a copy");
        check_pattern(name, buf, data_off + pos % len, n);
    }
    close(fd);
}

static void expect(const char *what, ssize_t got, size_t want)
{
    if (got < 0)
        die(what);
    if ((size_t)got != want) {
        fprintf(stderr, "io_calls: %s: transferred %zd of %zu bytes in one call\n", what, got, want);
        exit(1);
    }
}

/* ---- sockets ------------------------------------------------------------------------ */

struct sender {
    int fd;
    const char *buf;
    size_t len;
    int use_msg; /* sendmsg with two iovecs, else send */
};

static void *send_all(void *arg)
{
    struct sender *s = arg;
    size_t done = 0;
    while (done < s->len) {
        ssize_t n;
        if (s->use_msg) {
            size_t rest = s->len - done, half = rest / 2;
            struct iovec iov[2] = {{(char *)s->buf + done, half}, {(char *)s->buf + done + half, rest - half}};
            struct msghdr m = {.msg_iov = iov, .msg_iovlen = 2};
            n = sendmsg(s->fd, &m, 0);
        } else {
            n = send(s->fd, s->buf + done, s->len - done, 0);
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            die(s->use_msg ? "sendmsg" : "send");
        done += (size_t)n;
    }
    return NULL;
}

/* SIZE bytes of pattern from one swapped-out buffer to another through a stream socket. */
static void stream_pair(int use_msg)
{
    const char *name = use_msg ? "sendmsg/recvmsg" : "send/recv";
    char *src = buffer(size, 0);
    fill_pattern(src, 0, size);
    char *dst = buffer(size, 0x11);
    push_out();
    int pct = require_swapped(name, src, size);
    require_swapped(name, dst, size);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        die("socketpair");
    struct sender s = {sv[0], src, size, use_msg};
    pthread_t t;
    if (pthread_create(&t, NULL, send_all, &s) != 0)
        die("pthread_create");
    size_t got = 0;
    while (got < size) {
        ssize_t n;
        if (use_msg) {
            struct iovec iov = {dst + got, size - got};
            struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
            n = recvmsg(sv[1], &m, 0);
        } else {
            n = recv(sv[1], dst + got, size - got, 0);
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            die(use_msg ? "recvmsg" : "recv");
        got += (size_t)n;
    }
    pthread_join(t, NULL);
    close(sv[0]);
    close(sv[1]);
    check_pattern(name, dst, 0, size);
    printf("%s OK (%d%% swapped out)\n", name, pct);
    free(src);
    free(dst);
}

/* 64 KiB datagrams from a swapped-out buffer into another, one at a time. */
static void dgram_pair(void)
{
    size_t len = size / 2 / DGRAM * DGRAM;
    char *src = buffer(len, 0);
    fill_pattern(src, 0, len);
    char *dst = buffer(len, 0x22);
    push_out();
    int pct = require_swapped("sendto/recvfrom", src, len);
    require_swapped("sendto/recvfrom", dst, len);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_DGRAM, 0, sv) != 0)
        die("socketpair");
    for (size_t off = 0; off < len; off += DGRAM) {
        expect("sendto", sendto(sv[0], src + off, DGRAM, 0, NULL, 0), DGRAM);
        struct sockaddr_storage from;
        socklen_t fromlen = sizeof from;
        /* The whole rest of the buffer offered: only one datagram comes. */
        expect("recvfrom", recvfrom(sv[1], dst + off, len - off, 0, (struct sockaddr *)&from, &fromlen), DGRAM);
    }
    close(sv[0]);
    close(sv[1]);
    check_pattern("sendto/recvfrom", dst, 0, len);
    printf("sendto/recvfrom OK (%d%% swapped out)\n", pct);
    free(src);
    free(dst);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: io_calls DIR SIZE_MB\n");
        return 2;
    }
    dir = argv[1];
    long size_mb = strtol(argv[2], NULL, 10);
    if (size_mb < 4) {
        fprintf(stderr, "io_calls: SIZE_MB must be >= 4\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    size = (size_t)size_mb * MIB;
    pusher = buffer(size, 0);

    /* DIR/data from a small static buffer. */
    static uint64_t chunk[8192];
    int fd = open_in_dir("data", O_WRONLY | O_CREAT | O_TRUNC);
    for (size_t off = 0; off < size; off += sizeof chunk) {
        fill_pattern(chunk, off, sizeof chunk);
        expect("write DIR/data", write(fd, chunk, sizeof chunk), sizeof chunk);
    }
    if (fsync(fd) != 0 || close(fd) != 0)
        die("fsync/close DIR/data");

    /* read(2) and write(2). */
    char *a = buffer(size, 0x33);
    push_out();
    int pct = require_swapped("read", a, size);
    fd = open_in_dir("data", O_RDONLY);
    expect("read", read(fd, a, size), size);
    close(fd);
    check_pattern("read", a, 0, size);
    printf("read OK (%d%% swapped out)\n", pct);
    push_out();
    pct = require_swapped("write", a, size);
    fd = open_in_dir("copy", O_WRONLY | O_CREAT | O_TRUNC);
    expect("write", write(fd, a, size), size);
    if (close(fd) != 0)
        die("close DIR/copy");
    check_file("copy", 0, size, 0);
    printf("write OK (%d%% swapped out)\n", pct);
    free(a);

    /* pread(2) and pwrite(2): the second half of the file. */
    size_t half = size / 2;
    char *b = buffer(half, 0x44);
    push_out();
    pct = require_swapped("pread", b, half);
    fd = open_in_dir("data", O_RDONLY);
    expect("pread", pread(fd, b, half, (off_t)half), half);
    close(fd);
    check_pattern("pread", b, half, half);
    push_out();
    require_swapped("pwrite", b, half);
    fd = open_in_dir("copy-p", O_WRONLY | O_CREAT | O_TRUNC);
    expect("pwrite", pwrite(fd, b, half, 0), half);
    if (close(fd) != 0)
        die("close DIR/copy-p");
    check_file("copy-p", half, half, 0);
    printf("pread/pwrite OK (%d%% swapped out)\n", pct);
    free(b);

    /* readv/writev and preadv/pwritev over three buffers. */
    size_t third = size / 3 / PAGE * PAGE;
    struct iovec iov[3];
    for (int i = 0; i < 3; i++)
        iov[i] = (struct iovec){buffer(third, 0x55 + i), third};
    push_out();
    pct = require_swapped("readv", iov[1].iov_base, third);
    fd = open_in_dir("data", O_RDONLY);
    expect("readv", readv(fd, iov, 3), 3 * third);
    for (int i = 0; i < 3; i++)
        check_pattern("readv", iov[i].iov_base, i * third, third);
    push_out();
    require_swapped("preadv", iov[0].iov_base, third);
    expect("preadv", preadv(fd, iov, 3, (off_t)(size - 3 * third)), 3 * third);
    close(fd);
    for (int i = 0; i < 3; i++)
        check_pattern("preadv", iov[i].iov_base, size - 3 * third + i * third, third);
    push_out();
    require_swapped("writev", iov[2].iov_base, third);
    fd = open_in_dir("copy-v", O_WRONLY | O_CREAT | O_TRUNC);
    expect("writev", writev(fd, iov, 3), 3 * third);
    push_out();
    require_swapped("pwritev", iov[0].iov_base, third);
    expect("pwritev", pwritev(fd, iov, 3, (off_t)(3 * third)), 3 * third);
    if (close(fd) != 0)
        die("close DIR/copy-v");
    check_file("copy-v", size - 3 * third, 3 * third, 1);
    printf("readv/writev/preadv/pwritev OK (%d%% swapped out)\n", pct);
    for (int i = 0; i < 3; i++)
        free(iov[i].iov_base);

    /* Sockets. */
    stream_pair(0);
    stream_pair(1);
    dgram_pair();

    /* fread(3) and fwrite(3). */
    char *f = buffer(size, 0x66);
    push_out();
    pct = require_swapped("fread", f, size);
    char path[4096];
    snprintf(path, sizeof path, "%s/data", dir);
    FILE *in = fopen(path, "r");
    if (!in)
        die(path);
    size_t items = fread(f, 8, size / 8, in);
    if (items != size / 8) {
        fprintf(stderr, "io_calls: fread: %zu of %zu items (error %d, eof %d)\n", items, size / 8, ferror(in), feof(in));
        return 1;
    }
    fclose(in);
    check_pattern("fread", f, 0, size);
    push_out();
    require_swapped("fwrite", f, size);
    snprintf(path, sizeof path, "%s/copy-f", dir);
    FILE *out = fopen(path, "w");
    if (!out)
        die(path);
    items = fwrite(f, 8, size / 8, out);
    if (items != size / 8 || fclose(out) != 0) {
        fprintf(stderr, "io_calls: fwrite: %zu of %zu items\n", items, size / 8);
        return 1;
    }
    check_file("copy-f", 0, size, 0);
    printf("fread/fwrite OK (%d%% swapped out)\n", pct);
    free(f);

    /* O_DIRECT through read(2). */
    void *d = NULL;
    int rc = posix_memalign(&d, PAGE, size);
    if (rc) {
        errno = rc;
        die("posix_memalign");
    }
    memset(d, 0x77, size);
    push_out();
    pct = require_swapped("O_DIRECT", d, size);
    snprintf(path, sizeof path, "%s/data", dir);
    fd = open(path, O_RDONLY | O_DIRECT);
    if (fd < 0 && errno == EINVAL) {
        printf("O_DIRECT unsupported on %s\n", dir);
    } else if (fd < 0) {
        die("open DIR/data with O_DIRECT");
    } else {
        expect("read with O_DIRECT", read(fd, d, size), size);
        close(fd);
        check_pattern("O_DIRECT", d, 0, size);
        printf("O_DIRECT OK (%d%% swapped out)\n", pct);
    }
    free(d);
    free(pusher);
    return 0;
}
