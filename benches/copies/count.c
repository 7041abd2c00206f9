/*
 * Counts the bytes every call site copies with memcpy/memmove, for benches/copies/count.sh.
 *
 * Loaded with LD_PRELOAD in front of libc. While MC_ON is set, each call is recorded under
 * its return address (as an offset into the main executable, so addr2line can name it): the
 * number of calls and the bytes. At exit the table goes to MC_OUT, one site a line:
 * "offset calls bytes". The copy itself is a plain loop: the point is the count, not the speed.
 */
#define _GNU_SOURCE
#include <link.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define SITES (1 << 16)

static struct {
    uintptr_t site;
    unsigned long long calls, bytes;
} table[SITES];
static int on;

static void record(uintptr_t site, size_t n)
{
    if (!on)
        return;
    size_t h = (size_t)((site * 0x9E3779B97F4A7C15ull) >> 48);
    for (size_t i = 0; i < SITES; i++) {
        size_t j = (h + i) & (SITES - 1);
        if (table[j].site == site || table[j].site == 0) {
            table[j].site = site;
            table[j].calls++;
            table[j].bytes += n;
            return;
        }
    }
}

static void copy(unsigned char *d, const unsigned char *s, size_t n)
{
    if (d < s)
        while (n--)
            *d++ = *s++;
    else
        while (n--)
            d[n] = s[n];
}

void *memcpy(void *d, const void *s, size_t n)
{
    record((uintptr_t)__builtin_return_address(0), n);
    copy(d, s, n);
    return d;
}

void *memmove(void *d, const void *s, size_t n)
{
    record((uintptr_t)__builtin_return_address(0), n);
    copy(d, s, n);
    return d;
}

static uintptr_t base;

static int first_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    (void)data;
    base = info->dlpi_addr;
    return 1;
}

__attribute__((constructor)) static void start(void) { on = getenv("MC_ON") != NULL; }

__attribute__((destructor)) static void finish(void)
{
    on = 0;
    dl_iterate_phdr(first_object, NULL);
    const char *path = getenv("MC_OUT");
    FILE *f = fopen(path ? path : "copies.txt", "w");
    if (!f)
        return;
    for (size_t j = 0; j < SITES; j++)
        if (table[j].site)
            fprintf(f, "%lx %llu %llu\n", (unsigned long)(table[j].site - base),
                    table[j].calls, table[j].bytes);
    fclose(f);
}
