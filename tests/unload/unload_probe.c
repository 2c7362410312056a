/*
 * unload_probe.c: a thread that used the library outlives it (dlclose): its exit must not call
 * into the unloaded code. Each pthread key the library makes with a destructor stays set for the
 * thread's life once the thread used what it serves, so without the key deleted at unload, glibc
 * calls the destructor at an address that is no longer mapped (a segfault at the thread's exit).
 * The thread does what sets one key:
 *   route   sp_mempool_begin/end (the routing key: a dying thread's routings end);
 *   cache   a malloc and free with SYMPOOL_THREAD_CACHE on (the thread cache's key: its idle
 *           blocks go back);
 *   rebias  malloc/free pairs on a device lock biased to the main thread, until the lock is
 *           re-biased to this thread (the lock records' key: the record goes back).
 * Prints "unload-probe: ok" at the end.
 *
 * Usage: unload_probe LIBSYMPOOL.so [route|cache|rebias] (SYMPOOL_DEVICE=host).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

typedef int (*create_fn)(const void *, void **);
typedef int (*pool_fn)(void *);
typedef int (*void_fn)(void);
typedef int (*malloc_fn)(size_t, int, void *, void **);

/* LeakSanitizer's builds: what the library keeps for the process's life (across sp_shutdown) is
 * unreachable once it is unloaded, which is this test's point, not a leak of its calls. */
int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void) {
    return 1;
}

static void *g_lib;
static const char *g_mode = "route";
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_stage; /* 1: the thread did its part; 2: the library is gone, the thread may exit */
static int g_failed;

static void *sym(const char *name) {
    void *p = dlsym(g_lib, name);
    if (!p) {
        fprintf(stderr, "unload-probe: FAIL: no %s\n", name);
        g_failed = 1;
    }
    return p;
}

static void set_stage(int s) {
    pthread_mutex_lock(&g_mu);
    g_stage = s;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

static void wait_stage(int s) {
    pthread_mutex_lock(&g_mu);
    while (g_stage != s)
        pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
}

/* n malloc/free pairs of 512 bytes on device 0; false when one failed. */
static int pairs(long n) {
    malloc_fn mal = (malloc_fn)sym("sp_malloc");
    pool_fn fre = (pool_fn)sym("sp_free");
    for (long i = 0; mal && fre && i < n; i++) {
        void *p = NULL;
        if (mal(512, 0, NULL, &p) != 0 || fre(p) != 0) {
            fprintf(stderr, "unload-probe: FAIL: malloc/free\n");
            return 0;
        }
    }
    return mal && fre;
}

static void *using_thread(void *unused) {
    (void)unused;
    if (strcmp(g_mode, "route") == 0) {
        create_fn create = (create_fn)sym("sp_mempool_create");
        pool_fn begin = (pool_fn)sym("sp_mempool_begin"), end = (pool_fn)sym("sp_mempool_end");
        void *pool = NULL;
        if (create && begin && end &&
            (create(NULL, &pool) != 0 || begin(pool) != 0 || end(pool) != 0)) {
            fprintf(stderr, "unload-probe: FAIL: create/begin/end\n");
            g_failed = 1;
        }
    } else if (strcmp(g_mode, "cache") == 0) {
        if (!pairs(1))
            g_failed = 1;
    } else {
        /* The revocation, then streaks of takes with nobody waiting: far more than the longest
         * streak (32767 takes), so that the lock is re-biased to this thread. */
        if (!pairs(200000))
            g_failed = 1;
    }
    set_stage(1);
    wait_stage(2);
    return NULL; /* the thread's keys' destructors run now, the library unloaded */
}

int main(int argc, char **argv) {
    if (argc != 2 && argc != 3)
        return 2;
    if (argc == 3)
        g_mode = argv[2];
    if (strcmp(g_mode, "route") != 0 && strcmp(g_mode, "cache") != 0 &&
        strcmp(g_mode, "rebias") != 0)
        return 2;
    g_lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!g_lib) {
        fprintf(stderr, "unload-probe: FAIL: %s\n", dlerror());
        return 1;
    }
    void_fn init = (void_fn)sym("sp_init"), shutdown = (void_fn)sym("sp_shutdown");
    if (!init || init() != 0)
        return 1;
    if (strcmp(g_mode, "rebias") == 0 && !pairs(1)) /* the device lock biased to this thread */
        return 1;
    pthread_t t;
    if (pthread_create(&t, NULL, using_thread, NULL) != 0)
        return 1;
    wait_stage(1);
    if (shutdown)
        (void)shutdown();
    if (dlclose(g_lib) != 0)
        return 1;
    /* Whether glibc really unmapped it: the test means nothing otherwise. */
    if (dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD) != NULL)
        fprintf(stderr, "unload-probe: note: the library stayed loaded\n");
    set_stage(2);
    pthread_join(t, NULL);
    if (g_failed)
        return 1;
    printf("unload-probe: ok\n");
    return 0;
}
