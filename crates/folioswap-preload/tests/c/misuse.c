/*
 * misuse.c: the folioswap C API called wrongly (tests/c_api.rs builds and runs it).
 *
 * NULL arguments, strings that are not UTF-8, unknown option names and bad values, a
 * zero or overflowing length, unmapping addresses folioswap_map() never returned
 * (inside a block, on the heap, on the stack, in static data) and unmapping twice: each
 * call must return its documented error code and leave a last-error message naming
 * what was wrong. Meanwhile a 64 MiB block under a 16 MiB memory_high, so mostly
 * swapped out, holds a pattern that must come through it all: every word is verified
 * at the end. Exits 1 at the first failed check; at the end prints the number of
 * checks, the verified words and the engine's counters.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "folioswap.h"

#define MIB (1024ULL * 1024ULL)
#define LIMIT_BYTES (16 * MIB)
#define BLOCK_BYTES (64 * MIB)

static int checks;

static uint64_t pattern(size_t i)
{
    return ((uint64_t)i * 0x9E3779B97F4A7C15ULL) ^ 0x5A5A5A5AULL;
}

/* `what` returned `rc`: it must be `want`, with a last error that mentions `needle`
 * (and `needle2`, unless NULL). */
static void expect(const char *what, int rc, int want, const char *needle, const char *needle2)
{
    const char *msg = folioswap_last_error();
    if (rc != want) {
        fprintf(stderr, "misuse: %s returned %d (%s), expected %d (%s); last error: %s\n", what, rc,
                folioswap_strerror(rc), want, folioswap_strerror(want), msg ? msg : "(NULL)");
        exit(1);
    }
    if (!msg || !*msg) {
        fprintf(stderr, "misuse: %s left no last error\n", what);
        exit(1);
    }
    if (!strstr(msg, needle) || (needle2 && !strstr(msg, needle2))) {
        fprintf(stderr, "misuse: %s: the last error \"%s\" does not mention \"%s\"%s%s%s\n", what, msg,
                needle, needle2 ? " and \"" : "", needle2 ? needle2 : "", needle2 ? "\"" : "");
        exit(1);
    }
    checks++;
}

#define EXPECT(call, want, needle, needle2) expect(#call, (call), (want), (needle), (needle2))

#define CHECK(call)                                                                        \
    do {                                                                                   \
        int rc_ = (call);                                                                  \
        if (rc_ != FOLIOSWAP_OK) {                                                         \
            fprintf(stderr, "misuse: %s failed: %s: %s\n", #call, folioswap_strerror(rc_), \
                    folioswap_last_error());                                               \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

/* folioswap_unmap(addr) is refused, naming addr and saying `why`. */
static void expect_unmap_refused(void *addr, const char *why)
{
    char text[32];
    snprintf(text, sizeof text, "%p", addr);
    EXPECT(folioswap_unmap(addr), FOLIOSWAP_E_INVALID, text, why);
    if (!strstr(folioswap_last_error(), "nothing was unmapped")) {
        fprintf(stderr, "misuse: unmapping %s: \"%s\" does not say that nothing was unmapped\n", text,
                folioswap_last_error());
        exit(1);
    }
}

static int local_static;

int main(void)
{
    char text[64];

    /* Settings, before the engine starts. */
    EXPECT(folioswap_set(NULL, "16M"), FOLIOSWAP_E_INVALID, "folioswap_set: name is NULL", NULL);
    EXPECT(folioswap_set("memory_high", NULL), FOLIOSWAP_E_INVALID, "value for \"memory_high\" is NULL", NULL);
    EXPECT(folioswap_set(NULL, NULL), FOLIOSWAP_E_INVALID, "name is NULL", NULL);
    EXPECT(folioswap_set("memory_high", "\xff" "16M"), FOLIOSWAP_E_INVALID, "value for \"memory_high\"", "UTF-8");
    EXPECT(folioswap_set("memory_" "\xfe" "high", "16M"), FOLIOSWAP_E_INVALID, "name", "UTF-8");
    EXPECT(folioswap_set("", "1"), FOLIOSWAP_E_CONFIG, "unknown option name \"\"", "memory_high");
    EXPECT(folioswap_set("no_such_knob", "1"), FOLIOSWAP_E_CONFIG, "\"no_such_knob\"", "memory_high");
    EXPECT(folioswap_set("threshold", "1M"), FOLIOSWAP_E_CONFIG, "\"threshold\"", "environment");
    EXPECT(folioswap_set("memory_high", "lots"), FOLIOSWAP_E_CONFIG, "FOLIOSWAP_MEMORY_HIGH=\"lots\"", "512M");
    EXPECT(folioswap_set("memory_high", "-16M"), FOLIOSWAP_E_CONFIG, "\"-16M\"", "512M");
    EXPECT(folioswap_set("MAX_POOL", "150%"), FOLIOSWAP_E_CONFIG, "FOLIOSWAP_MAX_POOL=\"150%\"", "percentage");
    EXPECT(folioswap_set_memory_high(1), FOLIOSWAP_E_CONFIG, "folioswap_set_memory_high", "at least 8M");
    EXPECT(folioswap_set_folio_size(NULL), FOLIOSWAP_E_INVALID, "folioswap_set_folio_size: size is NULL", NULL);
    EXPECT(folioswap_set_folio_size("3K"), FOLIOSWAP_E_CONFIG, "\"3K\"", "64K");
    EXPECT(folioswap_set_compressor(NULL), FOLIOSWAP_E_INVALID, "folioswap_set_compressor: name is NULL", NULL);
    EXPECT(folioswap_set_compressor("gzip"), FOLIOSWAP_E_CONFIG, "\"gzip\"", "zstd");
    EXPECT(folioswap_set_swap_file(NULL), FOLIOSWAP_E_INVALID, "folioswap_set_swap_file: spec is NULL", NULL);
    EXPECT(folioswap_set_swap_file("/var/tmp"), FOLIOSWAP_E_CONFIG, "\"/var/tmp\"", "PATH:SIZE");
    EXPECT(folioswap_set_swap_file("/var/tmp:1M"), FOLIOSWAP_E_CONFIG, "\"/var/tmp:1M\"", "at least 2M");

    /* A refused map must leave *addr alone. */
    void *sentinel = &local_static;
    void *p = sentinel;
    EXPECT(folioswap_map(4096, NULL), FOLIOSWAP_E_INVALID, "folioswap_map: addr is NULL", NULL);
    EXPECT(folioswap_map(0, &p), FOLIOSWAP_E_INVALID, "folioswap_map: len is 0", NULL);
    EXPECT(folioswap_unmap(NULL), FOLIOSWAP_E_INVALID, "folioswap_unmap: addr is NULL", NULL);

    /* The refused settings changed nothing: these are the ones that apply. */
    CHECK(folioswap_set_memory_high(LIMIT_BYTES));
    CHECK(folioswap_set_folio_size("64K"));

    /* Lengths the address space cannot hold (the first starts the engine). */
    const size_t huge[] = {SIZE_MAX, SIZE_MAX - 4095, (size_t)PTRDIFF_MAX, (size_t)PTRDIFF_MAX + 1, (size_t)1 << 62};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        snprintf(text, sizeof text, "len %zu", huge[i]);
        EXPECT(folioswap_map(huge[i], &p), FOLIOSWAP_E_NOMEM, "folioswap_map", text);
    }
    if (p != sentinel) {
        fprintf(stderr, "misuse: a refused folioswap_map wrote *addr\n");
        return 1;
    }

    /* Once started, a valid setting is too late; a bad one is still a bad one. */
    EXPECT(folioswap_set("memory_high", "32M"), FOLIOSWAP_E_STARTED, "FOLIOSWAP_MEMORY_HIGH", "has started");
    EXPECT(folioswap_set("memory_high", "lots"), FOLIOSWAP_E_CONFIG, "\"lots\"", "512M");

    /* The block: four times memory_high, so most of it is swapped out. */
    void *block = NULL;
    CHECK(folioswap_map(BLOCK_BYTES, &block));
    uint64_t *words = block;
    size_t nwords = BLOCK_BYTES / sizeof(uint64_t);
    for (size_t i = 0; i < nwords; i++)
        words[i] = pattern(i);

    /* Addresses folioswap_map() did not return. */
    char *base = block;
    char start[32];
    snprintf(start, sizeof start, "at %p", block);
    void *inside[] = {base + 1, base + 4096, base + BLOCK_BYTES / 2, base + BLOCK_BYTES - 8};
    for (size_t i = 0; i < sizeof inside / sizeof inside[0]; i++) {
        expect_unmap_refused(inside[i], "lies inside the block");
        if (!strstr(folioswap_last_error(), start)) {
            fprintf(stderr, "misuse: \"%s\" does not name the block %s\n", folioswap_last_error(), start);
            return 1;
        }
    }
    void *heap = malloc(64);
    int on_stack = 0;
    expect_unmap_refused(heap, "not an address folioswap_map returned");
    expect_unmap_refused(&on_stack, "not an address folioswap_map returned");
    expect_unmap_refused(&local_static, "not an address folioswap_map returned");
    free(heap);

    /* Unmapping twice. */
    void *other = NULL;
    CHECK(folioswap_map(MIB, &other));
    memset(other, 0xab, MIB);
    CHECK(folioswap_unmap(other));
    expect_unmap_refused(other, "unmapped already");

    /* Nothing was lost. */
    for (size_t i = 0; i < nwords; i++) {
        if (words[i] != pattern(i)) {
            fprintf(stderr, "misuse: word %zu holds %#llx, expected %#llx\n", i, (unsigned long long)words[i],
                    (unsigned long long)pattern(i));
            return 1;
        }
    }
    printf("verified %zu words\n", nwords);

    char *stats = folioswap_stats_json();
    if (!stats) {
        fprintf(stderr, "misuse: folioswap_stats_json failed: %s\n", folioswap_last_error());
        return 1;
    }
    printf("%s\n", stats);
    free(stats);

    CHECK(folioswap_unmap(block));
    expect_unmap_refused(block, "unmapped already");

    /* Every code has a description; other numbers are unknown. */
    for (int code = FOLIOSWAP_OK; code >= FOLIOSWAP_E_INTERNAL; code--) {
        const char *s = folioswap_strerror(code);
        if (!s || !*s || strstr(s, "unknown")) {
            fprintf(stderr, "misuse: folioswap_strerror(%d) is \"%s\"\n", code, s ? s : "(NULL)");
            return 1;
        }
    }
    if (!strstr(folioswap_strerror(-100), "unknown") || !strstr(folioswap_strerror(1), "unknown")) {
        fprintf(stderr, "misuse: folioswap_strerror of an unknown code does not say so\n");
        return 1;
    }

    printf("misuse: %d checks passed\n", checks);
    return 0;
}
