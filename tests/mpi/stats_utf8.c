/*
 * stats_utf8.c: host names are bytes (sethostname takes any), but the JSON and Prometheus reports
 * must be UTF-8. Each rank renames its host in a UTS namespace of its own before MPI starts, the
 * ranks' node named by rank 0's: "node", a 0xFF byte, 57 'x' and an e-acute (64 bytes, which the
 * world's 63-byte names cut). The cut kept a lone lead byte and the 0xFF went through raw: both
 * reports were invalid UTF-8 (Python's json.load and promtool refuse them). Now the cut keeps
 * whole characters and a byte that starts none is U+FFFD.
 *
 * Every rank prints "stats-utf8: ok rank R" or "stats-utf8: FAIL ..."; where a rank cannot have
 * a UTS namespace (not root) they say "ok" with "skipped" and test nothing.
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sympool/collectives.h>
#include <sympool/sympool.h>

static int failures;

/* Whether s is valid UTF-8 (RFC 3629: no overlong form, no surrogate, nothing past U+10FFFF). */
static bool utf8_valid(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k = c < 0x80                 ? 1
                   : c >= 0xc2 && c <= 0xdf ? 2
                   : c >= 0xe0 && c <= 0xef ? 3
                   : c >= 0xf0 && c <= 0xf4 ? 4
                                            : 0;
        if (k == 0 || i + k > n)
            return false;
        for (size_t j = 1; j < k; j++)
            if ((s[i + j] & 0xc0) != 0x80)
                return false;
        if ((c == 0xe0 && s[i + 1] < 0xa0) || (c == 0xed && s[i + 1] >= 0xa0) ||
            (c == 0xf0 && s[i + 1] < 0x90) || (c == 0xf4 && s[i + 1] >= 0x90))
            return false;
        i += k;
    }
    return true;
}

/* The report rank 0 writes, read back ("" on other ranks). */
static size_t report(sp_world_t *w, sp_report_format_t fmt, char *text, size_t len) {
    FILE *f = tmpfile();
    size_t got = 0;
    if (!f || sp_stats_report(w, 0, f, fmt) != SP_SUCCESS) {
        printf("stats-utf8: FAIL report: %s\n", sp_last_error());
        failures++;
    }
    if (f) {
        rewind(f);
        got = fread(text, 1, len - 1, f);
        fclose(f);
    }
    text[got] = '\0';
    return got;
}

static void check(const char *what, const char *text, size_t n, const char *want) {
    if (!utf8_valid((const unsigned char *)text, n)) {
        printf("stats-utf8: FAIL rank 0: the %s report is not UTF-8\n", what);
        failures++;
    }
    if (strstr(text, want) == NULL) {
        printf("stats-utf8: FAIL rank 0: no \"%s\" in the %s report\n", want, what);
        failures++;
    }
}

int main(int argc, char **argv) {
    char name[65];
    memcpy(name, "node\xff", 5);
    memset(name + 5, 'x', 57);
    memcpy(name + 62, "\xc3\xa9", 3); /* 64 bytes and the terminator */
    bool renamed = unshare(CLONE_NEWUTS) == 0 && sethostname(name, strlen(name)) == 0;
    MPI_Init(&argc, &argv);
    int rank = 0, all_renamed = 0, mine = renamed;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Allreduce(&mine, &all_renamed, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    sp_world_t *w = NULL;
    if (sp_world_from_comm(MPI_COMM_WORLD, &w) != SP_SUCCESS) {
        printf("stats-utf8: FAIL rank %d: world (%s)\n", rank, sp_last_error());
        return 1;
    }
    static char text[1 << 20];
    char json_name[80] = "\"node\\ufffd", prom_name[80] = "node=\"node\xef\xbf\xbd";
    memset(json_name + strlen(json_name), 'x', 57);
    strcat(json_name, "\""); /* the e-acute is cut whole */
    memset(prom_name + strlen(prom_name), 'x', 57);
    strcat(prom_name, "\"");
    size_t n = report(w, SP_REPORT_JSON, text, sizeof text);
    if (rank == 0 && all_renamed)
        check("JSON", text, n, json_name);
    n = report(w, SP_REPORT_PROMETHEUS, text, sizeof text);
    if (rank == 0 && all_renamed)
        check("Prometheus", text, n, prom_name);
    if (sp_world_finalize(w) != SP_SUCCESS) {
        printf("stats-utf8: FAIL rank %d: finalize (%s)\n", rank, sp_last_error());
        failures++;
    }
    if (!failures)
        printf("stats-utf8: ok rank %d%s\n", rank,
               all_renamed ? "" : " (skipped: no UTS namespace)");
    fflush(stdout);
    MPI_Finalize();
    return failures ? 1 : 0;
}
