// Does process_madvise(MADV_DONTNEED) over many ranges pay one TLB shootdown, where one
// madvise per range pays one each? A second thread keeps the mm live on the other CPU;
// shootdowns are read from the TLB line of /proc/interrupts (2 CPUs).
// Build and run: cc -O2 -pthread -o /tmp/tlb_batch bench/tlb_batch.c && /tmp/tlb_batch
// (BENCHMARKS.md, "Where a 4K random fault's time goes").
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>
#include <pthread.h>
#include <time.h>
#include <stdatomic.h>
static atomic_int stop;
static void *spin(void *p) { volatile char *m = p; while (!atomic_load(&stop)) m[0]++; return 0; }
static long tlb_ipis(void) {
  FILE *f = fopen("/proc/interrupts", "r"); char line[4096]; long total = 0;
  while (fgets(line, sizeof line, f)) {
    char *p = line; while (*p == ' ') p++;
    if (strncmp(p, "TLB:", 4) == 0) { p += 4; for (int c = 0; c < 2; c++) total += strtol(p, &p, 10); }
  }
  fclose(f); return total;
}
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
int main(void) {
  const int N = 256; size_t len = 4096 * 4 * N;
  char *m = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  madvise(m, len, MADV_NOHUGEPAGE);
  char *other = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  pthread_t t; pthread_create(&t, 0, spin, other);
  int pidfd = syscall(SYS_pidfd_open, getpid(), 0);
  struct iovec iov[256];
  for (int round = 0; round < 3; round++) {
    memset(m, 1, len);
    long i0 = tlb_ipis(); double t0 = now();
    for (int i = 0; i < N; i++) madvise(m + (size_t)i * 4 * 4096, 4096, MADV_DONTNEED);
    double t1 = now(); long i1 = tlb_ipis();
    memset(m, 1, len);
    for (int i = 0; i < N; i++) { iov[i].iov_base = m + (size_t)i * 4 * 4096; iov[i].iov_len = 4096; }
    long i2 = tlb_ipis(); double t2 = now();
    long r = syscall(SYS_process_madvise, pidfd, iov, N, MADV_DONTNEED, 0);
    double t3 = now(); long i3 = tlb_ipis();
    printf("%d ranges: madvise each %ld IPIs %.0f us | process_madvise (ret %ld) %ld IPIs %.0f us\n", N, i1 - i0, (t1 - t0) * 1e6, r, i3 - i2, (t3 - t2) * 1e6);
  }
  atomic_store(&stop, 1); pthread_join(t, 0); return 0;
}
