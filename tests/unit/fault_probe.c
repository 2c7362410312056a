/*
 * fault_probe.c: makes the n-th call to chosen C library functions fail, for the tests of what
 * the public API does when the host's resources fail (test_host_faults.cc). The test binary is
 * linked with -Wl,--wrap=<function> for each function here, so every call from the objects
 * linked into it (the static library and the test's own C) comes through __wrap_<function>;
 * the C and C++ runtimes' own calls do not, so GoogleTest and std:: containers never see a
 * failure. Under ASan the wrappers call ASan's functions (__real_malloc is malloc, which ASan
 * provides), so its leak check still sees every block.
 * It also counts the heap blocks handed out through the wrappers and not yet freed: a failing
 * call must leave that count as it found it. FP_TRACE=1 in the environment prints the stack of
 * each failed call (addr2line turns its offsets into lines). The table of live blocks is mapped
 * memory (the probe cannot use the heap it watches), guarded by a spin lock: calls come from any
 * thread.
 */
#define _GNU_SOURCE
#include "fault_probe.h"

#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
void *__real_aligned_alloc(size_t a, size_t n);
void __real_free(void *p);
void *__real_mmap(void *a, size_t n, int prot, int flags, int fd, off_t off);
int __real_munmap(void *a, size_t n);
int __real_mprotect(void *a, size_t n, int prot);
int __real_open(const char *path, int flags, ...);
ssize_t __real_write(int fd, const void *buf, size_t n);
int __real_rename(const char *from, const char *to);
int __real_fsync(int fd);
int __real_pthread_key_create(pthread_key_t *key, void (*destructor)(void *));

static atomic_uint g_mask;  /* functions counted; 0: disarmed */
static atomic_long g_count; /* calls counted since fp_arm */
static long g_nth;          /* the call that fails */
static int g_err;           /* its errno; 0: the function's usual one */
static atomic_int g_fired;
static const char *_Atomic g_fired_name = "";

void fp_arm(unsigned mask, long nth, int err) {
    atomic_store(&g_mask, 0);
    g_nth = nth;
    g_err = err;
    atomic_store(&g_count, 0);
    atomic_store(&g_fired, 0);
    atomic_store(&g_fired_name, "");
    atomic_store(&g_mask, mask);
}

long fp_disarm(void) {
    atomic_store(&g_mask, 0);
    return atomic_load(&g_count);
}

int fp_fired(void) {
    return atomic_load(&g_fired);
}

const char *fp_fired_name(void) {
    return atomic_load(&g_fired_name);
}

/* True when this call is the armed one: errno is then set. */
static int fail_now(unsigned bit, const char *name, int usual) {
    if (!(atomic_load_explicit(&g_mask, memory_order_relaxed) & bit))
        return 0;
    if (atomic_fetch_add(&g_count, 1) + 1 != g_nth)
        return 0;
    atomic_store(&g_fired_name, name);
    atomic_store(&g_fired, 1);
    if (getenv("FP_TRACE") != NULL) { /* where the failure lands, for a person reading a run */
        void *bt[16];
        backtrace_symbols_fd(bt, backtrace(bt, 16), 2);
        (void)__real_write(2, "--\n", 3);
    }
    errno = g_err ? g_err : usual;
    return 1;
}

/* ---- live heap blocks: an open-addressing set of addresses ---------------------------------- */

#define SLOTS (1u << 20)
static uintptr_t *g_slot; /* 0: empty */
static atomic_flag g_spin = ATOMIC_FLAG_INIT;
static long g_live;

static void lock(void) {
    while (atomic_flag_test_and_set_explicit(&g_spin, memory_order_acquire))
        ;
}
static void unlock(void) {
    atomic_flag_clear_explicit(&g_spin, memory_order_release);
}

static size_t home(uintptr_t p) {
    return (size_t)((p >> 4) * 0x9E3779B97F4A7C15ull >> 44) & (SLOTS - 1);
}

static void track(void *p) {
    if (p == NULL)
        return;
    lock();
    if (g_slot == NULL) {
        void *m = __real_mmap(NULL, SLOTS * sizeof(uintptr_t), PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        g_slot = m == MAP_FAILED ? NULL : m;
    }
    if (g_slot != NULL && g_live < (long)(SLOTS / 2)) {
        size_t i = home((uintptr_t)p);
        while (g_slot[i] != 0)
            i = (i + 1) & (SLOTS - 1);
        g_slot[i] = (uintptr_t)p;
        g_live++;
    }
    unlock();
}

static void untrack(void *p) {
    if (p == NULL)
        return;
    lock();
    if (g_slot != NULL) {
        size_t i = home((uintptr_t)p);
        while (g_slot[i] != 0 && g_slot[i] != (uintptr_t)p)
            i = (i + 1) & (SLOTS - 1);
        if (g_slot[i] != 0) {
            /* Backward-shift deletion keeps every probe chain unbroken. */
            size_t j = i;
            for (;;) {
                g_slot[i] = 0;
                for (;;) {
                    j = (j + 1) & (SLOTS - 1);
                    if (g_slot[j] == 0)
                        goto done;
                    size_t h = home(g_slot[j]);
                    /* j's entry may move to i when its home is not cyclically in (i, j]. */
                    if (i <= j ? (h <= i || h > j) : (h <= i && h > j))
                        break;
                }
                g_slot[i] = g_slot[j];
                i = j;
            }
        done:
            g_live--;
        }
    }
    unlock();
}

long fp_live_blocks(void) {
    lock();
    long n = g_live;
    unlock();
    return n;
}

/* ---- the wrappers --------------------------------------------------------------------------- */

void *__wrap_malloc(size_t n) {
    if (fail_now(FP_MALLOC, "malloc", ENOMEM))
        return NULL;
    void *p = __real_malloc(n);
    track(p);
    return p;
}

void *__wrap_calloc(size_t k, size_t n) {
    if (fail_now(FP_CALLOC, "calloc", ENOMEM))
        return NULL;
    void *p = __real_calloc(k, n);
    track(p);
    return p;
}

void *__wrap_realloc(void *old, size_t n) {
    if (fail_now(FP_REALLOC, "realloc", ENOMEM))
        return NULL; /* the old block stays, as realloc leaves it */
    void *p = __real_realloc(old, n);
    if (p != NULL || n == 0) {
        untrack(old);
        track(p);
    }
    return p;
}

char *__wrap_strdup(const char *s) {
    if (fail_now(FP_STRDUP, "strdup", ENOMEM))
        return NULL;
    char *p = __real_strdup(s);
    track(p);
    return p;
}

void *__wrap_aligned_alloc(size_t a, size_t n) {
    if (fail_now(FP_ALIGNED_ALLOC, "aligned_alloc", ENOMEM))
        return NULL;
    void *p = __real_aligned_alloc(a, n);
    track(p);
    return p;
}

void __wrap_free(void *p) {
    untrack(p);
    __real_free(p);
}

/* Bytes mapped through the wrappers and not unmapped (a MAP_FIXED mapping replaces pages). */
static atomic_llong g_mapped;

static long long page_round(size_t n) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (long long)((n + page - 1) / page * page);
}

void *__wrap_mmap(void *a, size_t n, int prot, int flags, int fd, off_t off) {
    if (fail_now(FP_MMAP, "mmap", ENOMEM))
        return MAP_FAILED;
    void *p = __real_mmap(a, n, prot, flags, fd, off);
    if (p != MAP_FAILED && !(flags & MAP_FIXED))
        atomic_fetch_add(&g_mapped, page_round(n));
    return p;
}

int __wrap_munmap(void *a, size_t n) {
    int rc = __real_munmap(a, n);
    if (rc == 0)
        atomic_fetch_sub(&g_mapped, page_round(n));
    return rc;
}

long long fp_mapped_bytes(void) {
    return atomic_load(&g_mapped);
}

int __wrap_mprotect(void *a, size_t n, int prot) {
    if (fail_now(FP_MPROTECT, "mprotect", ENOMEM))
        return -1;
    return __real_mprotect(a, n, prot);
}

int __wrap_open(const char *path, int flags, ...) {
    int mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = va_arg(ap, int);
        va_end(ap);
    }
    if (fail_now(FP_OPEN, "open", EACCES))
        return -1;
    return __real_open(path, flags, mode);
}

ssize_t __wrap_write(int fd, const void *buf, size_t n) {
    if (fail_now(FP_WRITE, "write", ENOSPC))
        return -1;
    return __real_write(fd, buf, n);
}

int __wrap_rename(const char *from, const char *to) {
    if (fail_now(FP_RENAME, "rename", EXDEV))
        return -1;
    return __real_rename(from, to);
}

int __wrap_fsync(int fd) {
    if (fail_now(FP_FSYNC, "fsync", EIO))
        return -1;
    return __real_fsync(fd);
}

int __wrap_pthread_key_create(pthread_key_t *key, void (*destructor)(void *)) {
    if (fail_now(FP_PTHREAD_KEY, "pthread_key_create", EAGAIN))
        return EAGAIN; /* returned, not set in errno (POSIX) */
    return __real_pthread_key_create(key, destructor);
}
