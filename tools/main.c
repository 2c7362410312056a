/*
 * main.c: the `sympool` command: global options (--version, --help), then one subcommand
 * (info, replay, plot, summary; one file each) that parses its own options with getopt_long.
 * Options that configure the library (--conf, --capacity) are applied by the subcommand before
 * its first sympool call.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sympool/experimental.h>
#include <sympool/sympool.h>

#include "tools/cli.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: sympool [--version] [--help] <command> [options]\n"
            "\n"
            "Commands:\n"
            "  info [--json] [TRACE]      backend, devices, options (with sources), versions;\n"
            "                             with TRACE, what a snapshot holds; --json: the same\n"
            "                             as one JSON object\n"
            "  replay TRACE [options]     replay a PyTorch memory snapshot through sympool\n"
            "  plot SNAPSHOT... -o OUT.svg\n"
            "                             memory timeline; several snapshots (one per rank) on\n"
            "                             one chart\n"
            "  summary SNAPSHOT           the memory summary table of a snapshot's state\n"
            "  help [COMMAND]             this text, or COMMAND's (= sympool COMMAND --help)\n"
            "\n"
            "Every command takes --help (e.g. sympool replay --help). A TRACE or SNAPSHOT\n"
            "of - is standard input (gunzip -c t.pickle.gz | sympool replay -).\n");
}

static void version(void) {
    printf("sympool %d.%d.%d\n", SP_VERSION_MAJOR, SP_VERSION_MINOR, SP_VERSION_PATCH);
}

/* SYMPOOL_DEBUG_FILE naming a file the command reads or writes (the trace, a snapshot, the
 * chart): the library would append its log lines to it. Refused before anything is opened. */
static bool debug_file_is_an_argument(int nsub, char **sub) {
    const char *pattern = getenv("SYMPOOL_DEBUG_FILE");
    char path[4096];
    if (pattern == NULL || pattern[0] == '\0' || !sp_x_path_expand(pattern, path, sizeof path))
        return false;
    for (int i = 1; i < nsub; i++) {
        /* A word, or an option's value written into it: --output=FILE, -oFILE. A word that
         * starts with '-' is also taken whole: a file after "--" (`replay -- -t.pickle`) or an
         * option's separate value (`-o -t.svg`); only its value was looked at. */
        const char *file = sub[i];
        /* "-" is standard input (cli_input): a log appended to the file it reads from is the
         * same clobbered input as one named by its path. A file only: a terminal or /dev/null
         * on both sides clobbers nothing. */
        struct stat in;
        if (strcmp(file, "-") == 0 && fstat(STDIN_FILENO, &in) == 0 && S_ISREG(in.st_mode) &&
            cli_same_file(cli_input(file), path)) {
            fprintf(stderr,
                    "sympool: SYMPOOL_DEBUG_FILE=%s names the standard input this command "
                    "reads: its log lines would be appended to it; log elsewhere\n",
                    pattern);
            return true;
        }
        if (file[0] == '-' && file[1] == '-')
            file = strchr(file, '=') ? strchr(file, '=') + 1 : "";
        else if (file[0] == '-')
            file = file[1] != '\0' ? file + 2 : "";
        if (file != sub[i] && !(file[0] != '\0' && cli_same_file(file, path)))
            file = sub[i];
        if (file[0] != '\0' && cli_same_file(file, path)) {
            fprintf(stderr,
                    "sympool: SYMPOOL_DEBUG_FILE=%s names %s, a file this command reads or "
                    "writes: its log lines would be appended to it; log elsewhere\n",
                    pattern, file);
            return true;
        }
    }
    return false;
}

/* stdout goes through a stream of ours (out_install) whose writes keep the errno of the first
 * write(2) that failed: stdio does not keep it, and a write that failed inside one of the many
 * printf calls' buffer flushes had its errno overwritten long before finish() learned of it
 * from ferror (`sympool info T > /dev/full` said "cannot write the output" without why). */
static int out_errno; /* the first failed write's errno, 0: none */

static ssize_t out_write(void *cookie, const char *buf, size_t n) {
    (void)cookie;
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(STDOUT_FILENO, buf + done, n - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (out_errno == 0)
                out_errno = w < 0 ? errno : EIO;
            return done > 0 ? (ssize_t)done : -1;
        }
        done += (size_t)w;
    }
    return (ssize_t)done;
}

/* Before anything is written: the same buffering as the C library's stdout (lines to a
 * terminal, blocks otherwise). Without memory for the stream, stdout stays as it is. */
static void out_install(void) {
    cookie_io_functions_t io = {NULL, out_write, NULL, NULL};
    FILE *f = fopencookie(NULL, "w", io);
    if (f == NULL)
        return;
    if (setvbuf(f, NULL, isatty(STDOUT_FILENO) ? _IOLBF : _IOFBF, BUFSIZ) != 0) {
        fclose(f);
        return;
    }
    stdout = f;
}

/* The command's exit status once its output is out: a write to stdout that failed (a full disk,
 * a closed descriptor) fails the command, which would otherwise report success over a
 * truncated or missing output (`sympool replay T --json > out.json` on a full disk). The
 * reason is the first failed write's (out_errno), else the flush's. */
static int finish(int rc) {
    bool failed = ferror(stdout) != 0;
    int e = 0;
    errno = 0;
    if (fflush(stdout) != 0) {
        failed = true;
        e = errno;
    }
    if (out_errno != 0)
        e = out_errno;
    if (failed && rc == 0) {
        fprintf(stderr, "sympool: cannot write the output to stdout%s%s\n", e ? ": " : "",
                e ? strerror(e) : "");
        return 1;
    }
    return rc;
}

static int run(int argc, char **argv);

int main(int argc, char **argv) {
    /* Started with stdin, stdout or stderr closed, the first file the command opens (the trace,
     * the SYMPOOL_DEBUG_FILE log, a snapshot's temporary file) would take that descriptor and
     * receive what is written to stdout or stderr. /dev/null, read-only, holds the place: a
     * write there fails, and finish() reports a closed stdout. */
    for (int fd = 0; fd <= 2; fd++)
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF && open("/dev/null", O_RDONLY) != fd)
            return 1;
    /* Ctrl-C or a kill while a snapshot or chart is written leaves no temporary behind. */
    cli_temp_cleanup_install();
    out_install();
    return finish(run(argc, argv));
}

static int run(int argc, char **argv) {
    static const struct option opts[] = {
        {"version", no_argument, NULL, 'V'}, {"help", no_argument, NULL, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 0;
    /* '+': stop at the command; its options are its own. */
    while ((c = cli_getopt(argc, argv, "", "+Vh", opts)) != -1) {
        if (c == 'V') {
            version();
            return 0;
        }
        if (c == 'h') {
            usage(stdout);
            return 0;
        }
        usage(stderr);
        return 2;
    }
    if (optind >= argc) {
        usage(stderr);
        return 2;
    }
    char **sub = argv + optind;
    int nsub = argc - optind;
    const char *cmd = sub[0];
    optind = 0; /* the subcommand's getopt starts afresh */
    /* `sympool help replay` is `sympool replay --help`, as git and pip read it; `sympool help
     * --help` (every command takes --help) is the usage, as `sympool help` is. */
    char *help_argv[3] = {NULL, "--help", NULL};
    bool help_of_help = nsub > 1 && (strcmp(sub[1], "help") == 0 || strcmp(sub[1], "--help") == 0 ||
                                     strcmp(sub[1], "-h") == 0);
    if (strcmp(cmd, "help") == 0 && nsub > 1 && !help_of_help) {
        help_argv[0] = sub[1];
        sub = help_argv;
        nsub = 2;
        cmd = sub[0];
    }
    if (debug_file_is_an_argument(nsub, sub))
        return 2;
    if (strcmp(cmd, "info") == 0)
        return sp_cli_info(nsub, sub);
    if (strcmp(cmd, "replay") == 0)
        return sp_cli_replay(nsub, sub);
    if (strcmp(cmd, "plot") == 0)
        return sp_cli_plot(nsub, sub);
    if (strcmp(cmd, "summary") == 0)
        return sp_cli_summary(nsub, sub);
    if (strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "version") == 0) {
        version();
        return 0;
    }
    fprintf(stderr, "sympool: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
