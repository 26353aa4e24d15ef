/*
 * map_example.c: the folioswap C API in one page.
 *
 * Maps 256 MiB of managed memory while at most 64 MiB may stay resident, writes every
 * 8-byte word, verifies them all (most of the region is faulted back in from the
 * compressed pool on the way), prints the engine's counters and unmaps.
 *
 * Build:  cc -O2 -Iinclude examples/c/map_example.c -o map_example \
 *             -Ltarget/release -lfolioswap
 *   (or:  cc examples/c/map_example.c $(pkg-config --cflags --libs folioswap))
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "folioswap.h"

#define MIB (1024ULL * 1024ULL)
#define REGION_BYTES (256 * MIB)

/* Print what failed and exit. */
static void fail(const char *what, int rc)
{
    fprintf(stderr, "map_example: %s failed: %s (%d)\n", what, folioswap_strerror(rc), rc);
    const char *detail = folioswap_last_error();
    if (detail && *detail)
        fprintf(stderr, "map_example: %s\n", detail);
    exit(1);
}

#define CHECK(call)                    \
    do {                               \
        int rc_ = (call);              \
        if (rc_ != FOLIOSWAP_OK)       \
            fail(#call, rc_);          \
    } while (0)

int main(void)
{
    /* A value folioswap cannot parse is refused with FOLIOSWAP_E_CONFIG and a message
     * saying what it accepts. Configuration must come before the engine starts. */
    int rc = folioswap_set("memory_high", "lots");
    if (rc != FOLIOSWAP_E_CONFIG) {
        fprintf(stderr, "map_example: folioswap_set(\"memory_high\", \"lots\") returned %d, "
                        "expected FOLIOSWAP_E_CONFIG\n", rc);
        return 1;
    }
    printf("expected error: %s: %s\n", folioswap_strerror(rc), folioswap_last_error());

    CHECK(folioswap_set_memory_high(64 * MIB));
    CHECK(folioswap_set_folio_size("2M"));

    void *addr = NULL;
    CHECK(folioswap_map(REGION_BYTES, &addr));

    uint64_t *words = addr;
    size_t nwords = REGION_BYTES / sizeof(uint64_t);
    for (size_t i = 0; i < nwords; i++)
        words[i] = (uint64_t)i * 0x9E3779B97F4A7C15ULL;
    for (size_t i = 0; i < nwords; i++) {
        uint64_t expected = (uint64_t)i * 0x9E3779B97F4A7C15ULL;
        if (words[i] != expected) {
            fprintf(stderr, "map_example: word %zu holds %#llx, expected %#llx\n", i,
                    (unsigned long long)words[i], (unsigned long long)expected);
            return 1;
        }
    }
    printf("verified %zu words\n", nwords);

    char *stats = folioswap_stats_json();
    if (!stats) {
        fprintf(stderr, "map_example: folioswap_stats_json failed: %s\n", folioswap_last_error());
        return 1;
    }
    printf("%s\n", stats);
    free(stats);

    CHECK(folioswap_unmap(addr));
    return 0;
}
