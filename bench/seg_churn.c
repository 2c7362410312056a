/*
 * seg_churn.c: what a process keeps of segments made and released. Each round is sp_malloc,
 * sp_free and sp_empty_cache on the default pool (one segment made, then released to the
 * device); after the rounds, one JSON line with the growth of resident memory (VmRSS, RssAnon),
 * of the struct arena's committed bytes (sp_x_struct_bytes), of page tables (VmPTE), of mappings
 * (lines of /proc/self/maps) and of malloc's in-use bytes (mallinfo2), from after one warm-up
 * round to the end.
 *
 * The library is dlopen'ed from the path given, so that one binary measures two builds (main's
 * and a branch's) in alternation, in processes alike but for the library:
 *   SYMPOOL_DEVICE=host bench_seg_churn LIBSYMPOOL.so ROUNDS [SIZE]
 * bench/seg_churn_builds.sh runs it over builds and round counts.
 */
#include <dlfcn.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*init_fn)(void);
typedef int (*malloc_fn)(size_t, int, void *, void **);
typedef int (*free_fn)(void *);
typedef int (*empty_fn)(void);
typedef size_t (*bytes_fn)(void);
typedef const char *(*err_fn)(void);

/* A "Key:   N kB" field of /proc/self/status, in kB (-1 when absent). */
static long status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    long v = -1;
    size_t k = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, k) == 0 && line[k] == ':') {
            v = atol(line + k + 1);
            break;
        }
    fclose(f);
    return v;
}

/* Mappings of the process: lines of /proc/self/maps. */
static long maps_count(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return -1;
    long n = 0;
    int c;
    while ((c = fgetc(f)) != EOF)
        n += c == '\n';
    fclose(f);
    return n;
}

typedef struct sample {
    long rss_kb, anon_kb, pte_kb, maps;
    size_t struct_bytes, heap_used;
} sample_t;

static sample_t sample(bytes_fn struct_bytes) {
    struct mallinfo2 mi = mallinfo2();
    sample_t s = {status_kb("VmRSS"), status_kb("RssAnon"), status_kb("VmPTE"),
                  maps_count(),       struct_bytes(),       mi.uordblks};
    return s;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s LIBSYMPOOL.so ROUNDS [SIZE]\n", argv[0]);
        return 2;
    }
    long rounds = atol(argv[2]);
    size_t size = argc > 3 ? strtoull(argv[3], NULL, 0) : (size_t)1 << 20;
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
        return 1;
    }
    /* POSIX lets a dlsym result be cast to the function pointer type it names. */
    init_fn init = (init_fn)dlsym(lib, "sp_init");
    malloc_fn mal = (malloc_fn)dlsym(lib, "sp_malloc");
    free_fn fre = (free_fn)dlsym(lib, "sp_free");
    empty_fn empty = (empty_fn)dlsym(lib, "sp_empty_cache");
    bytes_fn struct_bytes = (bytes_fn)dlsym(lib, "sp_x_struct_bytes");
    err_fn last = (err_fn)dlsym(lib, "sp_last_error");
    if (!init || !mal || !fre || !empty || !struct_bytes || !last) {
        fprintf(stderr, "%s lacks a symbol this bench calls\n", argv[1]);
        return 1;
    }
    if (init() != 0) {
        fprintf(stderr, "sp_init: %s\n", last());
        return 1;
    }
    sample_t a = {0};
    for (long r = 0; r <= rounds; r++) {
        void *p;
        if (mal(size, 0, NULL, &p) != 0 || fre(p) != 0 || empty() != 0) {
            fprintf(stderr, "round %ld: %s\n", r, last());
            return 1;
        }
        if (r == 0)
            a = sample(struct_bytes); /* after the warm-up round: first-use costs left out */
    }
    sample_t b = sample(struct_bytes);
    printf(
        "{\"bench\":\"seg_churn\",\"rounds\":%ld,\"size\":%zu,\"rss_kb\":%ld,\"rss_growth_kb\":%ld,"
        "\"anon_growth_kb\":%ld,\"struct_bytes_growth\":%zu,\"bytes_per_round\":%.1f,"
        "\"pte_growth_kb\":%ld,\"maps_growth\":%ld,\"heap_used_growth\":%ld}\n",
        rounds, size, b.rss_kb, b.rss_kb - a.rss_kb, b.anon_kb - a.anon_kb,
        b.struct_bytes - a.struct_bytes,
        rounds ? (double)(b.anon_kb - a.anon_kb) * 1024.0 / (double)rounds : 0.0,
        b.pte_kb - a.pte_kb, b.maps - a.maps, (long)b.heap_used - (long)a.heap_used);
    return 0;
}
