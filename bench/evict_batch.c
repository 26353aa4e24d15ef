// What one scattered 4 KiB eviction costs, three ways, with another thread of the process
// running on the other CPU (so every TLB flush is a shootdown IPI):
//   move   UFFDIO_MOVE of each page into a registered staging area (move mode today);
//   batch  UFFDIO_WRITEPROTECT of the page's whole 2 MiB span, copy of the victims, one
//          process_madvise(MADV_DONTNEED) over all of them, write-protect lifted again: the
//          kernel's one flush per batch (TTU_BATCH_FLUSH), done from user space;
//   each   UFFDIO_WRITEPROTECT, copy and madvise(MADV_DONTNEED) per page (copy mode today).
// K victims are taken from each 2 MiB span of a 256 MiB region, spread evenly over it. With
// REMOVE events on (as the engine must register them, to see a program's own
// MADV_DONTNEED), each zapped range raises an event that a reader thread must take before
// the madvise returns. Prints microseconds per page evicted.
// Build and run (BENCHMARKS.md, "The sequential targets on a slow disk"):
//   cc -O2 -pthread -o /tmp/evict_batch bench/evict_batch.c
//   /tmp/evict_batch move|batch|each K REMOVE_EVENTS(0|1) WRITERS(0|1)
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#ifndef UFFDIO_MOVE // Debian 12's headers predate it (Linux 6.8).
struct uffdio_move { __u64 dst, src, len, mode; __s64 move; };
#define UFFDIO_MOVE _IOWR(UFFDIO, 0x05, struct uffdio_move)
#endif
#define FEATURE_MOVE (1ULL << 16)
#define PAGE 4096UL
#define SPAN (2UL << 20)
#define REGION (256UL << 20)
static int uffd;
static atomic_int stop;
static atomic_long removes;
// Read after each copy, so that no compiler drops the copies as dead stores.
static volatile char copied;
static char *other;
static const size_t OTHER = 64UL << 20;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void pin(int cpu) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(cpu, &s); sched_setaffinity(0, sizeof s, &s); }
static void die(const char *what) { perror(what); exit(1); }
// Keeps the process live on CPU 0, writing memory outside the region.
static void *writer(void *unused) {
  (void)unused; pin(0); uint64_t x = 88172645463325252ULL;
  while (!atomic_load(&stop)) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; other[(x % (OTHER / 8)) * 8]++; }
  return 0;
}
// Takes the REMOVE events the zaps raise (each madvise waits for its own to be read).
static void *events(void *unused) {
  (void)unused; pin(0); struct pollfd p = {uffd, POLLIN, 0}; struct uffd_msg m;
  while (!atomic_load(&stop)) {
    if (poll(&p, 1, 100) <= 0) continue;
    while (read(uffd, &m, sizeof m) == sizeof m) if (m.event == UFFD_EVENT_REMOVE) atomic_fetch_add(&removes, 1);
  }
  return 0;
}
static void protect(char *at, size_t len, int on) {
  struct uffdio_writeprotect wp = {{(uintptr_t)at, len}, on ? UFFDIO_WRITEPROTECT_MODE_WP : 0};
  if (ioctl(uffd, UFFDIO_WRITEPROTECT, &wp)) die("UFFDIO_WRITEPROTECT");
}
int main(int argc, char **argv) {
  if (argc != 5) { fprintf(stderr, "usage: %s move|batch|each K REMOVE_EVENTS WRITERS\n", argv[0]); return 2; }
  const char *mode = argv[1]; int k = atoi(argv[2]), remove_events = atoi(argv[3]), writers = atoi(argv[4]);
  if (k < 1 || k > 512 || 512 % k) { fprintf(stderr, "K must divide 512\n"); return 2; }
  uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
  if (uffd < 0) die("userfaultfd (root, or vm.unprivileged_userfaultfd=1)");
  struct uffdio_api api = {.api = UFFD_API, .features = (remove_events ? UFFD_FEATURE_EVENT_REMOVE : 0) | FEATURE_MOVE};
  if (ioctl(uffd, UFFDIO_API, &api)) die("UFFDIO_API (UFFDIO_MOVE needs Linux 6.8)");
  char *raw = mmap(0, REGION + SPAN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  char *region = (char *)(((uintptr_t)raw + SPAN - 1) & ~(SPAN - 1));
  char *staging = mmap(0, REGION, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  other = mmap(0, OTHER, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED || staging == MAP_FAILED || other == MAP_FAILED) die("mmap");
  madvise(region, REGION, MADV_NOHUGEPAGE); madvise(staging, REGION, MADV_NOHUGEPAGE);
  memset(other, 1, OTHER);
  for (size_t o = 0; o < REGION; o += PAGE) region[o] = (char)(o / PAGE);
  struct uffdio_register reg = {{(uintptr_t)region, REGION}, UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP, 0};
  if (ioctl(uffd, UFFDIO_REGISTER, &reg)) die("UFFDIO_REGISTER region");
  struct uffdio_register sreg = {{(uintptr_t)staging, REGION}, UFFDIO_REGISTER_MODE_MISSING, 0};
  if (ioctl(uffd, UFFDIO_REGISTER, &sreg)) die("UFFDIO_REGISTER staging");
  pthread_t w, e;
  if (writers) pthread_create(&w, 0, writer, 0);
  pthread_create(&e, 0, events, 0);
  pin(1); usleep(100000);
  int pidfd = syscall(SYS_pidfd_open, getpid(), 0);
  char *copy = malloc(PAGE * k); struct iovec *iov = malloc(sizeof *iov * k);
  int step = 512 / k; long pages = 0; double t0 = now();
  for (size_t s = 0; s < REGION / SPAN; s++) {
    char *span = region + s * SPAN; int first = (int)(s * 7919 % step);
    if (!strcmp(mode, "move")) {
      for (int i = 0; i < k; i++) {
        char *p = span + (first + i * step) * PAGE;
        struct uffdio_move mv = {(uintptr_t)(staging + (p - region)), (uintptr_t)p, PAGE, 0, 0};
        if (ioctl(uffd, UFFDIO_MOVE, &mv)) die("UFFDIO_MOVE");
      }
    } else if (!strcmp(mode, "batch")) {
      protect(span, SPAN, 1);
      for (int i = 0; i < k; i++) {
        char *p = span + (first + i * step) * PAGE;
        memcpy(copy + i * PAGE, p, PAGE); iov[i].iov_base = p; iov[i].iov_len = PAGE;
      }
      copied = copy[(k - 1) * PAGE];
      long r = syscall(SYS_process_madvise, pidfd, iov, k, MADV_DONTNEED, 0);
      if (r != (long)(k * PAGE)) die("process_madvise (MADV_DONTNEED on itself needs Linux 6.13)");
      protect(span, SPAN, 0);
    } else if (!strcmp(mode, "each")) {
      for (int i = 0; i < k; i++) {
        char *p = span + (first + i * step) * PAGE;
        protect(p, PAGE, 1); memcpy(copy, p, PAGE); copied = copy[0];
        if (madvise(p, PAGE, MADV_DONTNEED)) die("madvise");
      }
    } else { fprintf(stderr, "mode: move, batch or each\n"); return 2; }
    pages += k;
  }
  double took = now() - t0;
  atomic_store(&stop, 1);
  if (writers) pthread_join(w, 0);
  pthread_join(e, 0);
  printf("%s K=%d remove_events=%d writers=%d: %ld pages, %.2f us per page, %ld REMOVE events\n", mode, k, remove_events,
         writers, pages, took * 1e6 / pages, atomic_load(&removes));
  return 0;
}
