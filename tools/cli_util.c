/*
 * cli_util.c: option parsing shared by the `sympool` subcommands: getopt_long with messages that
 * name the subcommand, and strict number and file-name checks (a value that is not entirely a
 * number in range is refused, never read as 0), and the heap made ready for loading a large
 * trace (cli_heap_prepare).
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#include <sys/mman.h>
#endif

#include "tools/cli.h"

/* Whether getopt's error on `opt_val` (its optopt, renamed: the global is in scope) is `word`
 * ("--name=value", name or a prefix of it) giving a value to a long option that takes none. Not
 * merely a word that starts with "--": an unknown short option inside a cluster ("-xj") leaves
 * optind on it, so argv[optind - 1] is then the word before, which may be any long option
 * ("--json -xj" was "'--json' takes no value"). */
static bool takes_no_value(const char *word, int opt_val, const struct option *longopts) {
    if (strncmp(word, "--", 2) != 0 || strchr(word, '=') == NULL)
        return false;
    size_t len = strcspn(word + 2, "=");
    for (const struct option *o = longopts; o != NULL && o->name != NULL; o++)
        if (o->has_arg == no_argument && o->flag == NULL && o->val == opt_val &&
            strncmp(o->name, word + 2, len) == 0)
            return true;
    return false;
}

/* Whether word ("--name" or "--name=value") abbreviates more than one of longopts, which getopt
 * refuses (it cannot tell which was meant) with the '?' of an unknown option. */
static bool ambiguous(const char *word, const struct option *longopts) {
    if (strncmp(word, "--", 2) != 0 || word[2] == '\0' || longopts == NULL)
        return false;
    size_t len = strcspn(word + 2, "="), n = 0;
    for (const struct option *o = longopts; o->name != NULL; o++)
        n += strncmp(o->name, word + 2, len) == 0;
    return n > 1;
}

int cli_getopt(int argc, char **argv, const char *cmd, const char *shortopts,
               const struct option *longopts) {
    /* A leading ':' (after an optional '+' or '-') makes getopt tell a missing value (':') from an
     * unknown option ('?'); opterr = 0 leaves the messages to us, naming the subcommand. */
    char spec[64];
    bool mode = shortopts[0] == '+' || shortopts[0] == '-'; /* must stay first */
    snprintf(spec, sizeof(spec), "%.*s:%s", mode ? 1 : 0, shortopts, shortopts + (mode ? 1 : 0));
    opterr = 0;
    int c = getopt_long(argc, argv, spec, longopts, NULL);
    if (c != '?' && c != ':')
        return c;
    char who[48]; /* "sympool replay" or, for the global options, "sympool" */
    snprintf(who, sizeof(who), "sympool%s%s", cmd[0] ? " " : "", cmd);
    const char *word = optind > 0 && optind - 1 < argc ? argv[optind - 1] : "?";
    if (c == ':') {
        if (strncmp(word, "--", 2) == 0)
            fprintf(stderr, "%s: option '%s' needs a value\n", who, word);
        else
            fprintf(stderr, "%s: option '-%c' needs a value\n", who, optopt);
    } else if (optopt != 0 && takes_no_value(word, optopt, longopts)) {
        /* A known long option given a value it does not take ("--json=1"): getopt names it by
         * its short letter, and it was called the unknown option '-j'. */
        fprintf(stderr, "%s: option '%.*s' takes no value ('%s') (see %s --help)\n", who,
                (int)strcspn(word, "="), word, word, who);
    } else if (optopt != 0) {
        fprintf(stderr, "%s: unknown option '-%c' (see %s --help)\n", who, optopt, who);
    } else if (ambiguous(word, longopts)) {
        /* getopt_long refuses a prefix of several options ("--co": --conf, --compare) as it
         * refuses an unknown one; it was called unknown, though each option it abbreviates is
         * known. */
        fprintf(stderr, "%s: option '%.*s' is ambiguous:", who, (int)strcspn(word, "="), word);
        for (const struct option *o = longopts; o->name != NULL; o++)
            if (strncmp(o->name, word + 2, strcspn(word + 2, "=")) == 0)
                fprintf(stderr, " --%s", o->name);
        fprintf(stderr, " (see %s --help)\n", who);
    } else {
        fprintf(stderr, "%s: unknown option '%s' (see %s --help)\n", who, word, who);
    }
    return '?';
}

bool cli_once(const char *cmd, const char *opt, const char **seen, const char *value) {
    if (*seen != NULL) {
        fprintf(stderr, "sympool %s: %s given twice ('%s', then '%s'): give it once\n", cmd, opt,
                *seen, value);
        return false;
    }
    *seen = value;
    return true;
}

bool cli_output_ok(const char *cmd, const char *opt, const char *path) {
    struct stat sb;
    int rs = stat(path, &sb), err = errno;
    /* What the writer refuses only at the end, after the whole run: a name longer than the file
     * system takes (whose message, the path written twice, was cut before its reason), a loop of
     * links, a link to nothing. Refused here, before any input is read. A missing name or folder
     * (ENOENT, ENOTDIR) is the usual case and the folder's check below. */
    if (rs != 0 && err != ENOENT && err != ENOTDIR) {
        fprintf(stderr, "sympool %s: %s %s: %s\n", cmd, opt, path, strerror(err));
        return false;
    }
    if (rs != 0 && lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode)) {
        fprintf(stderr,
                "sympool %s: %s %s is a symbolic link to nothing that exists; files are written "
                "through a link only to an existing regular file\n",
                cmd, opt, path);
        return false;
    }
    if (rs == 0 && !S_ISREG(sb.st_mode)) {
        fprintf(stderr, "sympool %s: %s %s is %s, not a regular file; refusing to replace it\n",
                cmd, opt, path,
                S_ISDIR(sb.st_mode)    ? "a directory"
                : S_ISFIFO(sb.st_mode) ? "a FIFO"
                                       : "a special file");
        return false;
    }
    /* A file this process may not replace (mode 0444, another user's), as the writer refuses
     * it: after the whole run. */
    if (rs == 0 && faccessat(AT_FDCWD, path, W_OK, AT_EACCESS) != 0 && errno == EACCES) {
        fprintf(stderr, "sympool %s: %s %s: %s (it is not writable)\n", cmd, opt, path,
                strerror(EACCES));
        return false;
    }
    const char *slash = strrchr(path, '/');
    char dir[4096] = ".";
    size_t n = slash == NULL ? 0 : slash == path ? 1 : (size_t)(slash - path);
    if (n >= sizeof dir)
        return true; /* left to the writer, which names the failure */
    if (slash != NULL) {
        memcpy(dir, path, n);
        dir[n] = '\0';
    }
    rs = stat(dir, &sb);
    err = errno;
    if (rs != 0 || !S_ISDIR(sb.st_mode)) {
        /* errno only where stat failed: after a success it is whatever came before. */
        fprintf(stderr, "sympool %s: %s %s: its folder %s %s\n", cmd, opt, path, dir,
                rs == 0 || err == ENOTDIR ? "is not a folder"
                : err == ENOENT           ? "does not exist"
                                          : strerror(err));
        return false;
    }
    /* The temporary is created in the folder: one this process may not write in (read-only,
     * another user's, a read-only file system) failed only after the whole run. (Through a link,
     * the writer works in the folder of the file it names, not this one.) */
    bool link = lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode);
    if (!link && faccessat(AT_FDCWD, dir, W_OK | X_OK, AT_EACCESS) != 0 &&
        (errno == EACCES || errno == EROFS)) {
        fprintf(stderr, "sympool %s: %s %s: cannot create files in its folder %s: %s\n", cmd, opt,
                path, dir, strerror(errno));
        return false;
    }
    return true;
}

bool cli_parse_long(const char *s, long lo, long hi, long *out) {
    /* strtol skips leading white space and takes a '+': "--repeat ' 3'" and "-d +1" were read
     * as numbers. Only digits, after an optional '-', are one. */
    if (s == NULL ||
        !(isdigit((unsigned char)s[0]) || (s[0] == '-' && isdigit((unsigned char)s[1]))))
        return false;
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* replay --snapshot hands OUT to sp_dump_snapshot, which expands it so: the file named here is
 * the one it writes. plot -o expands the same way, so that one pattern names both outputs. */
bool cli_output_path(const char *pattern, char *out, size_t cap) {
    if (sp_x_path_expand(pattern, out, cap))
        return true;
    /* pattern with %r as 0, the rest for sp_x_path_expand. As long as the pattern may need: cut
     * at a fixed size, it named another file (a path that fits, "%%" shrinking to "%"), which
     * plot wrote its chart to, under a name it was never given. */
    char *p0 = malloc(strlen(pattern) + 1); /* no part grows: "%r" -> "0", "%%" stays */
    size_t k = 0;
    if (p0 == NULL) {
        snprintf(out, cap, "%s", pattern);
        return false;
    }
    for (const char *c = pattern; *c != '\0'; c++) {
        if (c[0] == '%' && (c[1] == '%' || c[1] == 'r')) {
            if (c[1] == 'r') {
                p0[k++] = '0';
            } else {
                p0[k++] = '%';
                p0[k++] = '%';
            }
            c++;
        } else {
            p0[k++] = *c;
        }
    }
    p0[k] = '\0';
    bool ok = sp_x_path_expand(p0, out, cap);
    free(p0);
    if (!ok)
        snprintf(out, cap, "%s", pattern); /* for messages only */
    return ok;
}

const char *cli_input(const char *word) {
    return strcmp(word, "-") == 0 ? "/dev/stdin" : word;
}

bool cli_same_file(const char *in, const char *out) {
    struct stat a, b;
    return stat(in, &a) == 0 && stat(out, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* The folder part of path (".", "/" or what comes before its last '/') into dir, and its last
 * component; false when the folder does not fit. */
static bool split_path(const char *path, char *dir, size_t cap, const char **base) {
    const char *slash = strrchr(path, '/');
    size_t n = slash == NULL ? 0 : slash == path ? 1 : (size_t)(slash - path);
    *base = slash == NULL ? path : slash + 1;
    if (slash == NULL)
        return snprintf(dir, cap, ".") < (int)cap;
    if (n >= cap)
        return false;
    memcpy(dir, path, n);
    dir[n] = '\0';
    return true;
}

bool cli_same_target(const char *a, const char *b) {
    struct stat sa, sb;
    int ra = stat(a, &sa), rb = stat(b, &sb);
    if (ra == 0 || rb == 0)
        return ra == 0 && rb == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    /* Neither exists yet: the same name in the same folder (through any other name of it) is
     * the file both would create. */
    char da[4096], db[4096];
    const char *ba, *bb;
    return split_path(a, da, sizeof da, &ba) && split_path(b, db, sizeof db, &bb) &&
           ba[0] != '\0' && strcmp(ba, bb) == 0 && stat(da, &sa) == 0 && stat(db, &sb) == 0 &&
           sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

bool cli_output_not_log(const char *cmd, const char *opt, const char *file) {
    const char *pattern = getenv("SYMPOOL_DEBUG_FILE");
    char log[4096];
    if (pattern == NULL || pattern[0] == '\0')
        return true;
    /* Compared as the log and the writer name their files: both patterns expanded (the output's
     * already is). */
    bool expanded = sp_x_path_expand(pattern, log, sizeof log);
    if (!expanded && sp_x_path_names(pattern, file)) {
        /* The library's writers (sp_dump_snapshot, sp_x_file_write_atomic) refuse it, but only
         * after the whole run. */
        fprintf(stderr,
                "sympool %s: SYMPOOL_DEBUG_FILE=%s names %s, the file %s writes, for a rank not "
                "known yet (the log opens that rank's file once it is, and sympool refuses to "
                "write any rank's); log elsewhere\n",
                cmd, pattern, file, opt);
        return false;
    }
    if (!expanded || !cli_same_target(file, log))
        return true;
    fprintf(stderr,
            "sympool %s: SYMPOOL_DEBUG_FILE=%s names %s, the file %s writes: its log lines "
            "would be appended to it; log elsewhere\n",
            cmd, pattern, file, opt);
    return false;
}

/* Where the CLI's log filters put the lines they pass (cli_log_line): SYMPOOL_DEBUG_FILE's
 * file, opened as the library opens it (appended to, a regular file only), else stderr. Set by
 * cli_log_open outside any filter: inside one no sympool call may be made. */
static FILE *g_log;
static char g_log_path[4096]; /* g_log's file */

bool cli_option(const char *name, sp_x_option_info_t *oi) {
    for (int i = 0; sp_x_option_info(i, oi); i++)
        if (strcmp(oi->name, name) == 0)
            return true;
    return false;
}

/* The value SYMPOOL_DEBUG_FILE has in force (the environment's, or a replay --compare
 * configuration's item): into out, "" when unset. */
static void debug_file_option(char *out, size_t cap) {
    sp_x_option_info_t info;
    out[0] = '\0';
    if (cli_option("SYMPOOL_DEBUG_FILE", &info))
        snprintf(out, cap, "%s", info.value);
}

void cli_log_open(void) {
    char pattern[600], path[4096] = "";
    debug_file_option(pattern, sizeof pattern);
    if (pattern[0] != '\0' && !sp_x_path_expand(pattern, path, sizeof path))
        path[0] = '\0'; /* %r with no rank, or too long: stderr, as the library does */
    if (g_log != NULL && strcmp(path, g_log_path) == 0)
        return;
    if (g_log != NULL)
        fclose(g_log);
    g_log = NULL;
    snprintf(g_log_path, sizeof g_log_path, "%s", path);
    if (path[0] == '\0')
        return;
    /* O_NONBLOCK: a FIFO without a reader is not waited on (and not taken: not regular). */
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0644);
    int open_errno = errno;
    struct stat sb;
    bool regular = fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode);
    if (regular && fcntl(fd, F_SETFL, O_WRONLY | O_APPEND) == 0 &&
        (g_log = fdopen(fd, "a")) != NULL)
        return;
    const char *why = fd < 0     ? strerror(open_errno)
                      : !regular ? "it is not a regular file"
                                 : strerror(errno);
    if (fd >= 0)
        close(fd);
    /* The lines go to stderr instead. Without a word, a log asked for in a missing folder was on
     * stderr unexplained; said by the library, which says it once per file for both of us (the
     * library's own lines, logged while no filter is set, fail on the same file: it was said
     * twice). */
    (void)sp_x_log_cannot_open(path, why);
}

void cli_log_line(const char *line) {
    FILE *f = g_log != NULL ? g_log : stderr;
    fprintf(f, "%s\n", line);
    fflush(f); /* as the library's lines: each whole in the file before the next is written */
}

bool cli_has_suffix(const char *path, const char *suffix) {
    size_t n = strlen(path), k = strlen(suffix);
    return n >= k && strcmp(path + n - k, suffix) == 0;
}

void cli_heap_prepare(const char *path) {
#if defined(__GLIBC__) && defined(MADV_HUGEPAGE)
    /* Loading a trace and replaying it touch a few fresh MB of heap that nothing else uses: a
     * fault per 4 KiB page costs a microsecond or more on a VM, a huge page about a tenth of
     * that per 4 KiB. The heap is grown once, by what the load will need, and that range is
     * offered for huge pages; the large arrays (memo, event arrays, address maps) are kept on
     * the heap instead of mmaps of their own, and nothing is trimmed back. Only a hint: without
     * THP, or if the heap is not where glibc's sbrk put it, nothing changes but the tunables.
     * It pays where the load touches more than about a quarter of a huge page: a huge page is
     * zeroed whole on its first touch (~0.2 ms in a fresh process on this VM, ~0.04 ms in a
     * warm one), which is what ~130 4 KiB faults cost. How much heap a trace needs is not its
     * size (a state-only snapshot's 172 KB took 950 KB, another's 212 KB 260 KB), so the line
     * is where every trace measured below it was faster without (process CPU, 21 runs
     * alternated, 2026-11-30-s24-proc): 70-126 KB files, 200-600 KB of heap, 0.07-0.16 ms
     * faster on 4 KiB pages; from 172 KB up 5 of 9 were faster on huge ones (0.19-0.82 ms)
     * and 4 slower (0.05-0.10 ms). */
    const size_t huge = (size_t)2 << 20; /* up to 128 MB files: 4 * want fits mallopt's int */
    struct stat sb;
    if (path == NULL || stat(path, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < (1 << 17) ||
        (uint64_t)sb.st_size > ((uint64_t)1 << 27))
        return;
    size_t want = ((size_t)sb.st_size * 2 + 4 * huge + huge - 1) & ~(huge - 1);
    if (mallopt(M_MMAP_THRESHOLD, 32 << 20) != 1 ||
        mallopt(M_TRIM_THRESHOLD, (int)(4 * want)) != 1 || mallopt(M_TOP_PAD, (int)want) != 1)
        return;
    /* A request below the mmap threshold that the top of the heap cannot hold grows the heap by
     * itself plus the top pad: p then starts at least `want` bytes of fresh heap. */
    size_t first = want < ((size_t)16 << 20) ? want : ((size_t)16 << 20);
    char *lo = sbrk(0);
    void *p = malloc(first);
    char *hi = sbrk(0);
    /* p is the heap's (not a mmap of its own) when it ends where the heap grew to. */
    if (p == NULL || lo == (char *)-1 || hi == (char *)-1 || (char *)p + first <= lo ||
        (char *)p + first > hi || (size_t)(hi - (char *)p) < want) {
        free(p);
        return;
    }
    uintptr_t a = ((uintptr_t)p + huge - 1) & ~(uintptr_t)(huge - 1);
    uintptr_t b = (uintptr_t)hi & ~(uintptr_t)(huge - 1);
    /* Not the huge page where p's chunk ends: malloc wrote the header of the top chunk there
     * (free(p) below moves the top back, but the page is touched), and offered for a huge page
     * that one write zeroed 2 MB the load never used (nhf: a third huge page in 1 run of 3,
     * as the heap's start fell). */
    uintptr_t end = ((uintptr_t)p + first - 64) & ~(uintptr_t)(huge - 1);
    b = b < end ? b : end;
    size_t below = a - (uintptr_t)p; /* p's bytes below the first huge page */
    if (b > a)
        (void)madvise((void *)a, b - a, MADV_HUGEPAGE);
    free(p);
    /* What is allocated next comes from where p was: the space below the first huge page is
     * held by a block of its own (kept for the process), so that it is not on 4 KiB pages. A
     * chunk takes its request plus 8 bytes of header, in 16-byte steps, and p's chunk began 16
     * bytes below p. */
    static void *pad;
    if (pad == NULL && below >= 64)
        pad = malloc(below + 8);
#else
    (void)path;
#endif
}
