// Async write-protect as a written bit (`written_aging`, BENCHMARKS.md "Written bits"):
// registers a region MISSING|WP on a userfaultfd with UFFD_FEATURE_WP_ASYNC and checks
// that UFFDIO_MOVE and UFFDIO_COPY work into it and out of it, that a page moved or copied
// in reads as written, that PAGEMAP_SCAN with PM_SCAN_WP_MATCHING reports exactly the
// pages written since it last protected them (reads do not count), and times a scan with
// re-protection of 16 MiB of written 4 KiB pages and the kernel's write-protect fault on
// the first write after it. Root (or /dev/userfaultfd access), Linux 6.8+.
//   cc -O2 -o /tmp/wp_async_probe bench/wp_async_probe.c && /tmp/wp_async_probe
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <errno.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <linux/userfaultfd.h>
#include <linux/fs.h>
#include <time.h>
#ifndef UFFD_FEATURE_MOVE
#define UFFD_FEATURE_MOVE (1<<16)
struct uffdio_move { uint64_t dst, src, len, mode; int64_t move; };
#define UFFDIO_MOVE _IOWR(UFFDIO, 0x05, struct uffdio_move)
#endif
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1<<15)
#endif
struct page_region { uint64_t start, end, categories; };
struct pm_scan_arg { uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages, category_inverted, category_mask, category_anyof_mask, return_mask; };
#define PAGEMAP_SCAN _IOWR('f', 16, struct pm_scan_arg)
#define PM_SCAN_WP_MATCHING (1<<0)
#define PM_SCAN_CHECK_WPASYNC (1<<1)
#define PAGE_IS_WPALLOWED (1<<0)
#define PAGE_IS_WRITTEN (1<<1)
#define PAGE_IS_PRESENT (1<<3)
#define PG 4096
int uffd, pm;
long scan(char *a, size_t len, int wp, struct page_region *v, int vl) {
  struct pm_scan_arg s = {sizeof s, wp ? (PM_SCAN_WP_MATCHING|PM_SCAN_CHECK_WPASYNC) : 0, (uint64_t)a, (uint64_t)a+len, 0, (uint64_t)v, vl, 0, 0, PAGE_IS_WRITTEN|PAGE_IS_PRESENT, 0, PAGE_IS_WRITTEN};
  long n = ioctl(pm, PAGEMAP_SCAN, &s); if (n<0) perror("scan"); return n;
}
long written(char *a, size_t len, int wp) { struct page_region v[512]; long n=scan(a,len,wp,v,512); long p=0; for(int i=0;i<n;i++) p+=(v[i].end-v[i].start)/PG; return p; }
double now(){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec*1e9+t.tv_nsec;}
int main() { setvbuf(stdout,0,_IONBF,0);
  uffd = syscall(SYS_userfaultfd, O_CLOEXEC|O_NONBLOCK);
  struct uffdio_api api = {UFFD_API, UFFD_FEATURE_MOVE|UFFD_FEATURE_WP_ASYNC|UFFD_FEATURE_EVENT_REMOVE|UFFD_FEATURE_EVENT_UNMAP|UFFD_FEATURE_EVENT_REMAP|UFFD_FEATURE_THREAD_ID};
  if (ioctl(uffd, UFFDIO_API, &api)) { perror("api"); return 1; }
  pm = open("/proc/self/pagemap", O_RDONLY);
  size_t len = 64*PG;
  char *r = mmap(0, len, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
  char *st = mmap(0, len, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
  struct uffdio_register reg = {{(uint64_t)r, len}, UFFDIO_REGISTER_MODE_MISSING|UFFDIO_REGISTER_MODE_WP};
  if (ioctl(uffd, UFFDIO_REGISTER, &reg)) { perror("reg"); return 1; }
  struct uffdio_register reg2 = {{(uint64_t)st, len}, UFFDIO_REGISTER_MODE_WP};
  if (ioctl(uffd, UFFDIO_REGISTER, &reg2)) { perror("reg2"); return 1; }
  // fill staging, move into region pages 0..15
  memset(st, 7, len);
  struct uffdio_move mv = {(uint64_t)r, (uint64_t)st, 16*PG, 0};
  if (ioctl(uffd, UFFDIO_MOVE, &mv)) { perror("move in"); return 1; }
  printf("after move-in written=%ld (expect 16)\n", written(r,len,0));
  printf("scan+wp written=%ld\n", written(r,len,1));
  printf("after wp written=%ld (expect 0)\n", written(r,len,0));
  r[0]=1; r[5*PG]=2; volatile char x = r[7*PG]; (void)x;
  printf("after 2 writes 1 read written=%ld (expect 2)\n", written(r,len,0));
  // COPY into page 20
  char buf[PG]; memset(buf,3,PG);
  struct uffdio_copy cp = {(uint64_t)r+20*PG, (uint64_t)buf, PG, 0, 0};
  if (ioctl(uffd, UFFDIO_COPY, &cp)) perror("copy");
  printf("after copy written=%ld (expect 3)\n", written(r,len,1));
  // move out page 5 (write-protected since the last scan) to staging page 8 (empty: moved in above)
  struct uffdio_move mo = {(uint64_t)st+8*PG, (uint64_t)r+5*PG, PG, 0};
  if (ioctl(uffd, UFFDIO_MOVE, &mo)) perror("move out wp'd page");
  else printf("move out ok, staging byte %d\n", st[8*PG]);
  // move back in
  struct uffdio_move mb = {(uint64_t)r+5*PG, (uint64_t)st+8*PG, PG, 0};
  if (ioctl(uffd, UFFDIO_MOVE, &mb)) perror("move back");
  printf("after move back written=%ld, byte %d\n", written(r,len,0), r[5*PG]);
  r[5*PG]=9; printf("write ok %d\n", r[5*PG]);
  // timing: async wp fault cost
  size_t big = 4096*PG; char *b = mmap(0, big, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
  memset(b,1,big);
  struct uffdio_register reg3 = {{(uint64_t)b, big}, UFFDIO_REGISTER_MODE_MISSING|UFFDIO_REGISTER_MODE_WP};
  if (ioctl(uffd, UFFDIO_REGISTER, &reg3)) { perror("reg3"); return 1; }
  for (int it=0; it<3; it++) {
  double t0=now(); long w=written(b,big,1); double t1=now();
  for (size_t i=0;i<big;i+=PG) b[i]++;
  double t2=now(); long w2=written(b,big,0); double t3=now();
  printf("scan+wp %ld pages %.0f us; writes %.2f us/page; scan-only %ld %.0f us\n", w, (t1-t0)/1e3, (t2-t1)/1e3/4096, w2, (t3-t2)/1e3);
  }
  return 0;
}
