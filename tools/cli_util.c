/*
 * cli_util.c: option parsing shared by the `sympool` subcommands: getopt_long with messages that
 * name the subcommand, and strict number and file-name checks (a value that is not entirely a
 * number in range is refused, never read as 0).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"

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
    } else if (optopt != 0) {
        fprintf(stderr, "%s: unknown option '-%c' (see %s --help)\n", who, optopt, who);
    } else {
        fprintf(stderr, "%s: unknown option '%s' (see %s --help)\n", who, word, who);
    }
    return '?';
}

bool cli_parse_long(const char *s, long lo, long hi, long *out) {
    if (s == NULL || *s == '\0')
        return false;
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

bool cli_has_suffix(const char *path, const char *suffix) {
    size_t n = strlen(path), k = strlen(suffix);
    return n >= k && strcmp(path + n - k, suffix) == 0;
}
