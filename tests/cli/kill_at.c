/*
 * kill_at.c: an LD_PRELOAD shim for killed_while_writing.sh. It sends the process a signal at a
 * chosen point of the atomic writer's life, deterministically (no timing): SP_KILL_SIG names
 * the signal (its number), SP_KILL_AT the point, where "TMP" is a file whose name holds ".tmp.":
 *   open     right after the temporary TMP was created (open with O_CREAT returned it)
 *   write:N  right before the N-th write(2) to TMP (N from 1): the signal arrives mid-write
 *   rename   right before TMP is renamed over its target
 * The signal is sent with kill(2) to the process itself and is then handled (or blocked) like
 * one from another process: the program cannot tell. A signal ignored at start (a test runner
 * that ignores SIGINT) is set back to its default first, so that the program sees what a shell
 * in a terminal gives it (unless SP_KILL_KEEP_IGNORED is set: nohup's case).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int g_sig;      /* the signal to send; 0: none */
static char g_at[16];  /* "open", "write" or "rename" */
static long g_nth = 1; /* write:N's N */
static long g_writes;  /* writes to a temporary so far */

__attribute__((constructor)) static void init(void) {
    const char *sig = getenv("SP_KILL_SIG"), *at = getenv("SP_KILL_AT");
    if (sig == NULL || at == NULL)
        return;
    g_sig = atoi(sig);
    snprintf(g_at, sizeof g_at, "%.*s", (int)strcspn(at, ":"), at);
    if (strchr(at, ':') != NULL)
        g_nth = atol(strchr(at, ':') + 1);
    struct sigaction old;
    if (getenv("SP_KILL_KEEP_IGNORED") == NULL && sigaction(g_sig, NULL, &old) == 0 &&
        old.sa_handler == SIG_IGN)
        signal(g_sig, SIG_DFL);
}

static int is_tmp(const char *path) {
    return path != NULL && strstr(path, ".tmp.") != NULL;
}

static int fd_is_tmp(int fd) {
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0)
        return 0;
    path[n] = '\0';
    return is_tmp(path);
}

static void fire(const char *at) {
    if (g_sig != 0 && strcmp(g_at, at) == 0)
        kill(getpid(), g_sig);
}

static int open_common(const char *name, const char *path, int flags, mode_t mode) {
    int (*real)(const char *, int, ...) = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, name);
    int fd = real(path, flags, mode);
    if (fd >= 0 && (flags & O_CREAT) && is_tmp(path))
        fire("open");
    return fd;
}

int open(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = (flags & O_CREAT) ? (mode_t)va_arg(ap, int) : 0;
    va_end(ap);
    return open_common("open", path, flags, mode);
}

int open64(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = (flags & O_CREAT) ? (mode_t)va_arg(ap, int) : 0;
    va_end(ap);
    return open_common("open64", path, flags, mode);
}

ssize_t write(int fd, const void *buf, size_t len) {
    ssize_t (*real)(int, const void *, size_t) =
        (ssize_t(*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    if (g_sig != 0 && strcmp(g_at, "write") == 0 && fd > 2 && fd_is_tmp(fd) && ++g_writes == g_nth)
        fire("write");
    return real(fd, buf, len);
}

int rename(const char *from, const char *to) {
    int (*real)(const char *, const char *) =
        (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename");
    if (is_tmp(from))
        fire("rename");
    return real(from, to);
}
