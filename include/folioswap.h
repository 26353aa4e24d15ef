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

/* Error codes: every int-returning function returns FOLIOSWAP_OK or one of these, and
 * on error sets this thread's folioswap_last_error() to a message naming the function
 * and the argument (or address) that was wrong. No function ever lets a failure escape
 * another way: an internal fault (a bug) comes back as FOLIOSWAP_E_INTERNAL, never as
 * an abort or an exception. */
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
    /* A bad argument: NULL, a string that is not UTF-8, a zero length, or an address
     * folioswap_map() did not return. Nothing was changed. */
    FOLIOSWAP_E_INVALID = -5,
    /* The engine has started; configuration can no longer change. */
    FOLIOSWAP_E_STARTED = -6,
    /* The swap file could not be set up. */
    FOLIOSWAP_E_SWAP_FILE = -7,
    /* A system call failed. */
    FOLIOSWAP_E_SYSTEM = -8,
    /* An internal error in folioswap (a bug): the call did not complete; the message
     * says where. Please report it. */
    FOLIOSWAP_E_INTERNAL = -9,
};

/* A static description of an error code ("unknown folioswap error code" for any other
 * number). Never NULL. */
const char *folioswap_strerror(int error);

/* The full message of this thread's last error (what went wrong and what to do), or ""
 * if none. Never NULL. A successful call does not clear it. The string stays valid until
 * this thread's next folioswap call. */
const char *folioswap_last_error(void);

/* Set one option before the engine starts. `name` is an environment variable's name
 * (FOLIOSWAP_MEMORY_HIGH) or the same without the prefix, in any case (memory_high);
 * `value` is what that variable accepts ("512M", "2M", "lz4", "/var/tmp:4G", ...).
 * Errors:
 *   FOLIOSWAP_E_INVALID  name or value is NULL or not UTF-8;
 *   FOLIOSWAP_E_CONFIG   an unknown name, or a value it does not accept (the message
 *                        names both and says what is accepted), or a bad FOLIOSWAP_*
 *                        variable in the environment;
 *   FOLIOSWAP_E_STARTED  a valid setting, but the engine has started.
 * On error the configuration is unchanged. */
int folioswap_set(const char *name, const char *value);

/* Shorthands for folioswap_set(), with its errors; a NULL or non-UTF-8 argument is
 * FOLIOSWAP_E_INVALID naming it (size, name, spec). */
int folioswap_set_memory_high(uint64_t bytes);       /* at least 8 MiB */
int folioswap_set_folio_size(const char *size);      /* "4K", "16K", ..., "2M" */
int folioswap_set_compressor(const char *name);      /* "lz4", "zstd", ... */
int folioswap_set_swap_file(const char *spec);       /* "PATH:SIZE", e.g. "/var/tmp:4G" */

/* Start the engine now (otherwise the first folioswap_map() starts it).
 * Errors: FOLIOSWAP_E_CONFIG (a bad FOLIOSWAP_* variable), FOLIOSWAP_E_PERMISSION,
 * FOLIOSWAP_E_KERNEL, FOLIOSWAP_E_SWAP_FILE, FOLIOSWAP_E_SYSTEM. */
int folioswap_init(void);

/* Map `len` bytes (rounded up to the folio size) of managed, zero-filled memory at
 * *addr. Starts the engine if need be (with folioswap_init()'s errors).
 * Errors:
 *   FOLIOSWAP_E_INVALID  addr is NULL, or len is 0;
 *   FOLIOSWAP_E_NOMEM    len is more than the address space holds (SIZE_MAX, anything
 *                        over PTRDIFF_MAX once rounded up) or is not free: the message
 *                        gives len;
 *   FOLIOSWAP_E_PERMISSION  the engine could not start and FOLIOSWAP_FALLBACK runs
 *                        this process unmanaged.
 * On error *addr is not changed. */
int folioswap_map(size_t len, void **addr);

/* Unmap memory from folioswap_map(), releasing everything the engine holds for it.
 * Errors: FOLIOSWAP_E_INVALID when addr is NULL or is not the start of a block that
 * folioswap_map() returned and that is still mapped: an address inside a block, one
 * from malloc or mmap, one never mapped, or a second unmap of the same block. The
 * message gives the address (and the block it lies in, if any); nothing is unmapped
 * and every block keeps its contents. */
int folioswap_unmap(void *addr);

/* The engine's counters (pswpin, pswpout, zswpin, zswpout, thp_swpout, swap_ra, ...),
 * memory and latency figures as a JSON object, in a string the caller frees with
 * free(). Starts the engine if need be. NULL (see folioswap_last_error) if the engine
 * could not start or the string could not be allocated. */
char *folioswap_stats_json(void);

#ifdef __cplusplus
}
#endif

#endif /* FOLIOSWAP_H */
