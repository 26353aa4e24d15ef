/*
 * crash.c MB: malloc MB MiB, write every 4 KiB page (all of it, with incompressible
 * data, so that a small compressed pool overflows to the swap file), print "allocated",
 * then die by SIGKILL, so that nothing at exit (atexit handlers, destructors) cleans up.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: crash MB\n");
        return 2;
    }
    long mb = strtol(argv[1], NULL, 10);
    if (mb < 1) {
        fprintf(stderr, "crash: MB must be >= 1\n");
        return 2;
    }
    size_t size = (size_t)mb << 20;
    uint64_t *p = malloc(size);
    if (!p) {
        perror("crash: malloc");
        return 1;
    }
    uint64_t x = 0x9E3779B97F4A7C15ULL; /* xorshift64 */
    for (size_t w = 0; w < size / 8; w++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[w] = x;
    }
    printf("allocated\n");
    fflush(stdout);
    raise(SIGKILL);
    return 1;
}
