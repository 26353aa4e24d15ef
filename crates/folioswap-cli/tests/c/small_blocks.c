/*
 * small_blocks.c N MANAGED_MB: malloc N blocks of 512 KiB (under `folioswap run`'s
 * 1 MiB threshold, so they stay outside the engine, as a heap of small blocks does) and
 * one of MANAGED_MB MiB (managed), write every 8-byte word of all of them with its own
 * index and its block's number, read every word back, print "BAD <words that differ>",
 * and exit without freeing anything, so that the memory is still held at exit.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define SMALL (512 << 10)

static void fill(uint64_t *p, size_t bytes, uint64_t block)
{
    for (size_t w = 0; w < bytes / 8; w++)
        p[w] = (block << 40) ^ w;
}

static uint64_t check(const uint64_t *p, size_t bytes, uint64_t block)
{
    uint64_t bad = 0;
    for (size_t w = 0; w < bytes / 8; w++)
        bad += p[w] != ((block << 40) ^ w);
    return bad;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: small_blocks N MANAGED_MB\n");
        return 2;
    }
    long n = strtol(argv[1], NULL, 10);
    long mb = strtol(argv[2], NULL, 10);
    if (n < 1 || mb < 1) {
        fprintf(stderr, "small_blocks: N and MANAGED_MB must be >= 1\n");
        return 2;
    }
    uint64_t **small = calloc((size_t)n, sizeof *small);
    size_t managed_bytes = (size_t)mb << 20;
    uint64_t *managed = malloc(managed_bytes);
    if (!small || !managed) {
        perror("small_blocks: malloc");
        return 1;
    }
    for (long b = 0; b < n; b++) {
        small[b] = malloc(SMALL);
        if (!small[b]) {
            perror("small_blocks: malloc");
            return 1;
        }
        fill(small[b], SMALL, (uint64_t)b);
    }
    fill(managed, managed_bytes, (uint64_t)n);
    uint64_t bad = check(managed, managed_bytes, (uint64_t)n);
    for (long b = 0; b < n; b++)
        bad += check(small[b], SMALL, (uint64_t)b);
    printf("BAD %llu\n", (unsigned long long)bad);
    return 0;
}
