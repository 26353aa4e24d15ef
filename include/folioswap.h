/*
 * folioswap.h: the C API of libfolioswap.so.
 *
 * Memory from folioswap_map() behaves like anonymous memory (zero-filled, readable and
 * writable from any thread, usable by system calls) while no more than memory_high of
 * all managed memory stays resident: the rest is swapped out in whole folios to a
 * compressed pool (and a swap file, if configured) and faults back in transparently.
 *
 * One engine serves the whole process. It starts on the first folioswap_map() (or
 * folioswap_init()), configured from the FOLIOSWAP_* environment variables and then the
 * folioswap_set*() calls made before it started. Every function is thread-safe.
 *
 * Linking this library does not manage the program's malloc or mmap: that happens only
 * when the library is preloaded (LD_PRELOAD=libfolioswap.so, or `folioswap run`).
 *
 * Build: cc prog.c $(pkg-config --cflags --libs folioswap)
 */
#ifndef FOLIOSWAP_H
#define FOLIOSWAP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Error codes: every int-returning function returns FOLIOSWAP_OK or one of these. */
enum folioswap_error {
    FOLIOSWAP_OK = 0,
    /* A configuration name or value was not understood. */
    FOLIOSWAP_E_CONFIG = -1,
    /* No userfaultfd could be opened: not root, no /dev/userfaultfd access, or
     * vm.unprivileged_userfaultfd=0. */
    FOLIOSWAP_E_PERMISSION = -2,
    /* The kernel lacks userfaultfd features folioswap needs (Linux 6.8+). */
    FOLIOSWAP_E_KERNEL = -3,
    /* The address space could not hold the mapping. */
    FOLIOSWAP_E_NOMEM = -4,
    /* A bad argument: zero length, or an address folioswap_map() did not return. */
    FOLIOSWAP_E_INVALID = -5,
    /* The engine has started; configuration can no longer change. */
    FOLIOSWAP_E_STARTED = -6,
    /* The swap file could not be set up. */
    FOLIOSWAP_E_SWAP_FILE = -7,
    /* A system call failed. */
    FOLIOSWAP_E_SYSTEM = -8,
};

/* A static description of an error code. */
const char *folioswap_strerror(int error);

/* The full message of this thread's last error (what went wrong and what to do), or ""
 * if none. Valid until this thread's next folioswap call. */
const char *folioswap_last_error(void);

/* Set one option before the engine starts. `name` is an environment variable's name
 * (FOLIOSWAP_MEMORY_HIGH) or the same without the prefix, in any case (memory_high);
 * `value` is what that variable accepts ("512M", "2M", "lz4", "/var/tmp:4G", ...). */
int folioswap_set(const char *name, const char *value);

/* Shorthands for folioswap_set(). */
int folioswap_set_memory_high(uint64_t bytes);
int folioswap_set_folio_size(const char *size);      /* "4K", "16K", ..., "2M" */
int folioswap_set_compressor(const char *name);      /* "lz4", "zstd", ... */
int folioswap_set_swap_file(const char *spec);       /* "PATH:SIZE", e.g. "/var/tmp:4G" */

/* Start the engine now (otherwise the first folioswap_map() starts it). */
int folioswap_init(void);

/* Map `len` bytes (rounded up to the folio size) of managed, zero-filled memory at
 * *addr. */
int folioswap_map(size_t len, void **addr);

/* Unmap memory from folioswap_map(), releasing everything the engine holds for it. */
int folioswap_unmap(void *addr);

/* The engine's counters (pswpin, pswpout, zswpin, zswpout, thp_swpout, swap_ra, ...),
 * memory and latency figures as a JSON object, in a string the caller frees with
 * free(). NULL (see folioswap_last_error) if the engine could not start. */
char *folioswap_stats_json(void);

#ifdef __cplusplus
}
#endif

#endif /* FOLIOSWAP_H */
