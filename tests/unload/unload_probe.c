/*
 * unload_probe.c: a thread that routed through sp_mempool_begin/end outlives the library
 * (dlclose): its exit must not call into the unloaded code. sp_mempool_begin arms a pthread key
 * whose destructor ends a dying thread's routings; the key's value stays set for the thread's
 * life, so without the key deleted at unload, glibc calls the destructor at an address that is no
 * longer mapped (a segfault at the thread's exit). Prints "unload-probe: ok" at the end.
 *
 * Usage: unload_probe LIBSYMPOOL.so (SYMPOOL_DEVICE=host).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

typedef int (*create_fn)(const void *, void **);
typedef int (*pool_fn)(void *);
typedef int (*void_fn)(void);

/* LeakSanitizer's builds: what the library keeps for the process's life (across sp_shutdown) is
 * unreachable once it is unloaded, which is this test's point, not a leak of its calls. */
int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void) {
    return 1;
}

static void *g_lib;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_stage; /* 1: the thread routed; 2: the library is gone, the thread may exit */
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

static void *routing_thread(void *unused) {
    (void)unused;
    create_fn create = (create_fn)sym("sp_mempool_create");
    pool_fn begin = (pool_fn)sym("sp_mempool_begin"), end = (pool_fn)sym("sp_mempool_end");
    void *pool = NULL;
    if (create && begin && end &&
        (create(NULL, &pool) != 0 || begin(pool) != 0 || end(pool) != 0)) {
        fprintf(stderr, "unload-probe: FAIL: create/begin/end\n");
        g_failed = 1;
    }
    set_stage(1);
    wait_stage(2);
    return NULL; /* the thread's keys' destructors run now, the library unloaded */
}

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    g_lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!g_lib) {
        fprintf(stderr, "unload-probe: FAIL: %s\n", dlerror());
        return 1;
    }
    void_fn init = (void_fn)sym("sp_init"), shutdown = (void_fn)sym("sp_shutdown");
    if (!init || init() != 0)
        return 1;
    pthread_t t;
    if (pthread_create(&t, NULL, routing_thread, NULL) != 0)
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
