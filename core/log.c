/*
 * log.c: one formatted line per event, NCCL-style:
 *     host:pid:tid [r3 d1] SYMPOOL WARN pool.c:212 message
 * The level (sp__log_level) and subsystem mask (sp__log_mask) are globals that the SP_WARN/
 * SP_INFO/SP_TRACE macros test before any argument is formatted, so a disabled line costs one
 * load and a compare; relaxed atomic loads, as sp_shutdown resets the level while other threads
 * may be logging. config.c sets them (and the output file pattern) through
 * sp__log_configure() when it reads SYMPOOL_DEBUG, SYMPOOL_DEBUG_SUBSYS and SYMPOOL_DEBUG_FILE;
 * until then the level is SP_LOG_UNREAD, which sends the first line through sp__log_wanted
 * (config.c) to read them. This file writes lines and calls nothing above it.
 *
 * Output goes to stderr unless SYMPOOL_DEBUG_FILE names a file pattern (%h host, %p pid, %r rank,
 * expanded by process.c). The file is opened lazily at the first line. A pattern with %r cannot be
 * expanded before the rank is known, so until it is (sp__log_set_rank, or the launcher's
 * variables) those lines go to stderr; setting (or changing) the rank closes the file so the next
 * line opens the per-rank file.
 *
 * The rank is process-wide (one rank per process). The device is per thread (_Thread_local),
 * like CUDA's current device: a thread that works on device 1 logs "d1" even while another
 * thread logs "d0".
 *
 * Lock: log_lock serializes writing, the test hook and the file state, so every line reaches the
 * file whole in one fwrite+fflush. Formatting happens before the lock.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/core.h"

int sp__log_level = SP_LOG_UNREAD;
unsigned sp__log_mask = SP_SUB_ALL;
int sp__log_level_configured = SP_LOG_UNREAD;

#define LOG_LINE_MAX 2048   /* longest line written; longer messages end in "..." */
#define LOG_PATTERN_MAX 512 /* longest SYMPOOL_DEBUG_FILE pattern */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *log_file;                    /* opened file, NULL = none open (log_lock) */
static char log_pattern[LOG_PATTERN_MAX]; /* SYMPOOL_DEBUG_FILE, "" = stderr (log_lock) */
static bool log_open_failed;              /* the pattern could not be opened; stderr (log_lock) */
/* The file last said not to open (log_lock): a program writing the lines itself to the file the
 * log would open (sp_x_log_set_fn, sympool's CLI) fails on it as well, and says so here. "" once
 * the log opens its file. */
static char log_said_path[PATH_MAX];      /* a program's file may be longer than the log's */
static sp_log_fn_t log_fn;                /* test hook, NULL = file (log_lock) */
static void *log_fn_arg;                  /* its argument (log_lock) */
static _Thread_local int log_device = -1; /* this thread's device, -1 = unknown */
static _Thread_local bool in_log_fn;      /* this thread is inside log_fn */

static const char *const level_names[] = {"NONE", "VERSION", "WARN", "INFO", "TRACE"};

/* Subsystem names in bit order, for SYMPOOL_DEBUG_SUBSYS. */
static const struct {
    const char *name; /* upper case, as users write it */
    unsigned bit;     /* SP_SUB_* */
} subsys_names[] = {
    {"INIT", SP_SUB_INIT}, {"POOL", SP_SUB_POOL}, {"DEVICE", SP_SUB_DEVICE},
    {"SYM", SP_SUB_SYM},   {"BOOT", SP_SUB_BOOT}, {"COLL", SP_SUB_COLL},
    {"ENV", SP_SUB_ENV},   {"API", SP_SUB_API},   {"HISTORY", SP_SUB_HISTORY},
    {"ALL", SP_SUB_ALL},
};

bool sp__log_parse_mask(const char *text, unsigned *mask_p) {
    const char *p = text;
    while (isspace((unsigned char)*p))
        p++;
    bool negate = false;
    if (*p == '^') {
        negate = true;
        p++;
    }
    unsigned mask = 0;
    int words = 0;
    while (*p != '\0') {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len > 0 && isspace((unsigned char)*p)) {
            p++;
            len--;
        }
        while (len > 0 && isspace((unsigned char)p[len - 1]))
            len--;
        bool found = false;
        for (size_t i = 0; i < sizeof subsys_names / sizeof subsys_names[0]; i++) {
            if (strlen(subsys_names[i].name) == len &&
                strncasecmp(p, subsys_names[i].name, len) == 0) {
                mask |= subsys_names[i].bit;
                found = true;
                break;
            }
        }
        if (!found)
            return false; /* an empty word ("INIT,,POOL") is malformed too */
        words++;
        if (end == NULL)
            break;
        p = end + 1;
        if (*p == '\0')
            return false; /* trailing comma */
    }
    if (words == 0)
        return false;
    *mask_p = negate ? (SP_SUB_ALL & ~mask) : mask;
    return true;
}

const char *sp__log_level_name(int level) {
    if (level < 0 || level > SP_LOG_TRACE)
        return "?";
    return level_names[level];
}

/* Closes the current file (not stderr) so the next line reopens from the pattern. log_lock held. */
static void close_file_locked(void) {
    if (log_file != NULL)
        fclose(log_file);
    log_file = NULL;
    log_open_failed = false;
}

void sp__log_configure(int level, unsigned mask, const char *file_pattern) {
    __atomic_store_n(&sp__log_level_configured, level, __ATOMIC_RELAXED);
    __atomic_store_n(&sp__log_level, level, __ATOMIC_RELAXED);
    __atomic_store_n(&sp__log_mask, mask, __ATOMIC_RELAXED);
    if (file_pattern == NULL)
        file_pattern = "";
    pthread_mutex_lock(&log_lock);
    if (strcmp(file_pattern, log_pattern) != 0) {
        close_file_locked();
        snprintf(log_pattern, sizeof log_pattern, "%s", file_pattern);
    }
    pthread_mutex_unlock(&log_lock);
}

/* Whether a and b name one file: the same inode when both exist, the same name in the same
 * folder (through any name of it) when neither does; false when only one exists. */
static bool same_file_or_name(const char *a, const char *b) {
    struct stat sa, sb;
    int ra = stat(a, &sa), rb = stat(b, &sb);
    if (ra == 0 || rb == 0)
        return ra == 0 && rb == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    const char *ba = strrchr(a, '/'), *bb = strrchr(b, '/');
    if (strcmp(ba ? ba + 1 : a, bb ? bb + 1 : b) != 0)
        return false;
    char da[PATH_MAX], db[PATH_MAX];
    snprintf(da, sizeof da, "%.*s", ba ? (int)(ba - a) + 1 : 1, ba ? a : ".");
    snprintf(db, sizeof db, "%.*s", bb ? (int)(bb - b) + 1 : 1, bb ? b : ".");
    return stat(da, &sa) == 0 && stat(db, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* A pattern with %r while the rank is unknown: the log writes to stderr for now, and opens the
 * pattern's file of whatever rank comes (sp__log_set_rank, at sp_world_init). Let through, a file
 * written to that name before (a snapshot at log.3) took the log's lines once the rank became 3.
 * So path is the log's when the pattern names it for some rank: each number in path is tried as
 * the rank (the name the pattern makes holds the rank's digits). */
static bool some_rank_file(const char *pattern, const char *path) {
    char log_path[LOG_PATTERN_MAX + 128];
    for (const char *p = path; *p != '\0';) {
        if (!isdigit((unsigned char)*p)) {
            p++;
            continue;
        }
        char *end;
        errno = 0;
        long rank = strtol(p, &end, 10);
        if (errno == 0 && rank <= INT_MAX &&
            sp__path_expand(pattern, (int)rank, log_path, sizeof log_path) == SP_EXPAND_OK &&
            same_file_or_name(path, log_path))
            return true;
        p = end;
    }
    return false;
}

bool sp__log_pattern_names(const char *pattern, const char *path) {
    char log_path[LOG_PATTERN_MAX + 128];
    sp_expand_t x = sp__path_expand(pattern, -1, log_path, sizeof log_path);
    if (x == SP_EXPAND_OK)
        return same_file_or_name(path, log_path);
    return x == SP_EXPAND_NO_RANK && some_rank_file(pattern, path);
}

bool sp__log_is_file(const char *path, char *pattern, size_t cap) {
    sp__options_ensure(); /* SYMPOOL_DEBUG_FILE is read with the other options */
    pthread_mutex_lock(&log_lock);
    snprintf(pattern, cap, "%s", log_pattern);
    struct stat open_st, st;
    /* The file open now (its name may have been replaced since), then the one the next line
     * would open. */
    bool named = log_file != NULL && fstat(fileno(log_file), &open_st) == 0 &&
                 stat(path, &st) == 0 && st.st_dev == open_st.st_dev && st.st_ino == open_st.st_ino;
    if (!named && log_pattern[0] != '\0')
        named = sp__log_pattern_names(log_pattern, path);
    pthread_mutex_unlock(&log_lock);
    return named;
}

void sp__log_set_rank(int rank) {
    pthread_mutex_lock(&log_lock);
    int before = sp__process_rank();
    sp__process_set_rank(rank);
    if (sp__process_rank() != before) {
        if (strstr(log_pattern, "%r") != NULL)
            close_file_locked(); /* reopen as the per-rank file at the next line */
    }
    pthread_mutex_unlock(&log_lock);
}

void sp__log_set_device(int device) {
    log_device = device;
}

void sp__log_set_fn(sp_log_fn_t fn, void *arg) {
    if (in_log_fn) { /* from the log function itself: this thread holds log_lock already */
        log_fn = fn;
        log_fn_arg = arg;
        return;
    }
    pthread_mutex_lock(&log_lock);
    log_fn = fn;
    log_fn_arg = arg;
    pthread_mutex_unlock(&log_lock);
}

/* Open path for appending, only if it is (or becomes) a regular file. O_NONBLOCK: opening a FIFO
 * for writing would otherwise wait, with log_lock held, until some process opens it for reading
 * (forever, for most); a FIFO, socket, device or directory is refused with *why set. */
static FILE *open_regular(const char *path, const char **why) {
    /* 0666 less the umask, as fopen(path, "a") gives (NCCL_DEBUG_FILE's way) and as the snapshot
     * files get: 0644 took the group's write bit that a umask of 002 grants. */
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0666);
    if (fd < 0) {
        *why = errno == ENXIO ? "it is a FIFO with no reader, not a regular file" : strerror(errno);
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        *why = strerror(errno);
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        *why = S_ISFIFO(st.st_mode)   ? "it is a FIFO, not a regular file"
               : S_ISSOCK(st.st_mode) ? "it is a socket, not a regular file"
               : S_ISCHR(st.st_mode)  ? "it is a character device, not a regular file"
                                      : "it is not a regular file";
        close(fd);
        return NULL;
    }
    (void)fcntl(fd, F_SETFL, O_APPEND); /* writes may block like any file's */
    FILE *f = fdopen(fd, "a");
    if (f == NULL) {
        *why = strerror(errno);
        close(fd);
    }
    return f;
}

/* Say on stderr that path cannot be opened for the log (why), unless it was the file said last:
 * one line about one file, whoever opened it first (the log itself, or a program writing the
 * lines it routes to the same file). log_lock held. */
static bool cannot_open_locked(const char *path, const char *why) {
    if (strcmp(path, log_said_path) == 0)
        return false;
    snprintf(log_said_path, sizeof log_said_path, "%s", path);
    fprintf(stderr,
            "%s:%ld SYMPOOL WARN cannot open SYMPOOL_DEBUG_FILE '%s': %s; logging to stderr\n",
            sp__process_host(), (long)getpid(), path, why);
    return true;
}

bool sp__log_cannot_open(const char *path, const char *why) {
    if (in_log_fn) /* from the log function itself: this thread holds log_lock already */
        return cannot_open_locked(path, why);
    pthread_mutex_lock(&log_lock);
    bool said = cannot_open_locked(path, why);
    pthread_mutex_unlock(&log_lock);
    return said;
}

/* The stream for the next line: the pattern's file if it can be opened, else stderr. log_lock held.
 */
static FILE *stream_locked(void) {
    if (log_file != NULL)
        return log_file;
    if (log_pattern[0] == '\0' || log_open_failed)
        return stderr;
    char path[LOG_PATTERN_MAX + 128];
    sp_expand_t x = sp__path_expand(log_pattern, -1, path, sizeof path);
    if (x == SP_EXPAND_NO_RANK)
        return stderr; /* %r before the rank is known */
    const char *why = "the expanded name is too long";
    if (x == SP_EXPAND_OK)
        log_file = open_regular(path, &why);
    if (x == SP_EXPAND_TOO_LONG)
        snprintf(path, sizeof path, "%s", log_pattern);
    if (log_file == NULL) {
        /* Say it once, on stderr, then keep logging there: losing the log silently is worse. */
        log_open_failed = true;
        (void)cannot_open_locked(path, why);
        return stderr;
    }
    log_said_path[0] = '\0'; /* a later failure to open it again is news */
    return log_file;
}

void sp__log_at(sp_log_level_t level, unsigned subsys, const char *file, int line, const char *fmt,
                ...) {
    char buf[LOG_LINE_MAX];
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;

    char rank_s[16] = "-", dev_s[16] = "-";
    int rank = sp__process_rank();
    if (rank >= 0)
        snprintf(rank_s, sizeof rank_s, "%d", rank);
    if (log_device >= 0)
        snprintf(dev_s, sizeof dev_s, "%d", log_device);

    int n = snprintf(buf, sizeof buf, "%s:%ld:%ld [r%s d%s] SYMPOOL %s %s:%d ", sp__process_host(),
                     (long)getpid(), (long)syscall(SYS_gettid), rank_s, dev_s,
                     sp__log_level_name(level), base, line);
    if (n < 0)
        return;
    if ((size_t)n < sizeof buf) {
        va_list ap;
        va_start(ap, fmt);
        int m = vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
        va_end(ap);
        if (m > 0)
            n += m;
    }
    size_t len = (size_t)n;
    if (len >= sizeof buf - 1) { /* truncated: say so, and leave room for the newline */
        len = sizeof buf - 2;
        memcpy(buf + len - 3, "...", 3);
    }
    while (len > 0 && buf[len - 1] == '\n') /* one line per event, whatever the caller wrote */
        len--;
    buf[len] = '\0';

    if (SP_UNLIKELY(in_log_fn)) {
        /* A line logged from inside the log function (a sympool call it made, refused): log_lock
         * is this thread's already, and the function would see itself called again. */
        buf[len] = '\n';
        fwrite(buf, 1, len + 1, stderr);
        return;
    }
    pthread_mutex_lock(&log_lock);
    if (log_fn != NULL) {
        char saved[SP_ERROR_TEXT_MAX];
        sp__error_swap_out(saved);
        in_log_fn = true;
        sp__callback_enter();
        log_fn(level, buf, log_fn_arg);
        sp__callback_leave();
        in_log_fn = false;
        sp__error_swap_in(saved);
    } else {
        FILE *out = stream_locked();
        buf[len] = '\n';
        fwrite(buf, 1, len + 1, out);
        fflush(out);
    }
    pthread_mutex_unlock(&log_lock);
}

void sp__log_fork_lock(void) {
    pthread_mutex_lock(&log_lock);
}

void sp__log_fork_unlock(void) {
    pthread_mutex_unlock(&log_lock);
}
