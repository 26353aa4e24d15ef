// How a disk shares itself between O_DIRECT readers and writers, as the swap file's reads
// (faults, readahead) and writes (evictions, writeback) meet on it: R reader threads issue
// reads of RK KiB and W writer threads writes of WK KiB at random aligned offsets of a
// 2 GiB file in DIR for 4 s; prints each side's MB/s. The file is made first, and removed.
// With `holes`, the writers write instead into a sparse tail past those 2 GiB, one new
// block after another, so that every write allocates (as a swap-out does into a hole of
// the on-demand swap file, or into a fallocated extent never written).
// Build and run (BENCHMARKS.md, "The sequential targets on a slow disk", and "Swap slots
// written before, used again first"):
//   cc -O2 -pthread -o /tmp/disk_mix bench/disk_mix.c
//   /tmp/disk_mix /var/tmp 1 512 1 2048      # one reader of 512K, one writer of 2M
//   /tmp/disk_mix /var/tmp 1 128 1 2048 holes
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define FILE_SIZE (2UL << 30)
static int fd;
static atomic_int stop;
static atomic_long read_bytes, written_bytes;
static size_t read_size, write_size;
#define HOLES_SIZE (16UL << 30)
static int holes;
static atomic_ulong next_hole = FILE_SIZE;
static uint64_t next(uint64_t *x) { *x ^= *x << 13; *x ^= *x >> 7; *x ^= *x << 17; return *x; }
static void *reader(void *seed) {
  char *buf; if (posix_memalign((void **)&buf, 4096, read_size)) return 0;
  uint64_t x = (uintptr_t)seed * 7919 + 1; long n = 0;
  while (!atomic_load(&stop)) {
    off_t at = (off_t)(next(&x) % (FILE_SIZE / read_size) * read_size);
    if (pread(fd, buf, read_size, at) == (ssize_t)read_size) n += read_size;
  }
  atomic_fetch_add(&read_bytes, n); free(buf); return 0;
}
static void *writer(void *seed) {
  char *buf; if (posix_memalign((void **)&buf, 4096, write_size)) return 0;
  memset(buf, 0x5a, write_size);
  uint64_t x = (uintptr_t)seed * 104729 + 3; long n = 0;
  while (!atomic_load(&stop)) {
    off_t at = (off_t)(next(&x) % (FILE_SIZE / write_size) * write_size);
    if (holes) {
      at = (off_t)atomic_fetch_add(&next_hole, write_size);
      if ((size_t)at + write_size > FILE_SIZE + HOLES_SIZE) break;
    }
    if (pwrite(fd, buf, write_size, at) == (ssize_t)write_size) n += write_size;
  }
  atomic_fetch_add(&written_bytes, n); free(buf); return 0;
}
int main(int argc, char **argv) {
  holes = argc == 7 && strcmp(argv[6], "holes") == 0;
  if (argc != 6 && !holes) { fprintf(stderr, "usage: %s DIR READERS READ_KIB WRITERS WRITE_KIB [holes]\n", argv[0]); return 2; }
  int readers = atoi(argv[2]), writers = atoi(argv[4]);
  read_size = strtoul(argv[3], 0, 10) << 10; write_size = strtoul(argv[5], 0, 10) << 10;
  if (readers < 0 || writers < 0 || readers + writers > 32 || !read_size || !write_size || read_size % 4096 ||
      write_size % 4096 || read_size > FILE_SIZE || write_size > FILE_SIZE) {
    fprintf(stderr, "at most 32 threads; sizes in KiB, multiples of 4, at most 2 GiB\n"); return 2;
  }
  char path[4096]; snprintf(path, sizeof path, "%s/disk_mix.XXXXXX", argv[1]);
  int tmp = mkstemp(path);
  if (tmp < 0) { perror("mkstemp"); return 1; }
  close(tmp);
  fd = open(path, O_RDWR | O_DIRECT);
  if (fd < 0) { perror("open O_DIRECT"); unlink(path); return 1; }
  char *fill; if (posix_memalign((void **)&fill, 4096, 2UL << 20)) return 1;
  memset(fill, 1, 2UL << 20);
  for (size_t at = 0; at < FILE_SIZE; at += 2UL << 20)
    if (pwrite(fd, fill, 2UL << 20, (off_t)at) != (ssize_t)(2UL << 20)) { perror("filling the file"); unlink(path); return 1; }
  if (holes && ftruncate(fd, (off_t)(FILE_SIZE + HOLES_SIZE))) { perror("ftruncate"); unlink(path); return 1; }
  pthread_t threads[32]; int count = 0;
  for (int i = 0; i < readers; i++) pthread_create(&threads[count++], 0, reader, (void *)(uintptr_t)(i + 1));
  for (int i = 0; i < writers; i++) pthread_create(&threads[count++], 0, writer, (void *)(uintptr_t)(i + 1));
  sleep(4);
  atomic_store(&stop, 1);
  for (int i = 0; i < count; i++) pthread_join(threads[i], 0);
  unlink(path);
  printf("readers %d x %zuK, writers %d x %zuK%s: read %.0f MB/s, write %.0f MB/s, total %.0f MB/s\n", readers,
         read_size >> 10, writers, write_size >> 10, holes ? " into holes" : "", atomic_load(&read_bytes) / 4e6, atomic_load(&written_bytes) / 4e6,
         (atomic_load(&read_bytes) + atomic_load(&written_bytes)) / 4e6);
  return 0;
}
