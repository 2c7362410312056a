/*
 * process.c: who this process is, for log lines and file names: its rank, short host name and
 * pid, and the one expansion of %h, %p, %r and %% in a path pattern (SYMPOOL_DEBUG_FILE,
 * sp_dump_snapshot's path).
 *
 * One rank source: the rank the world set (sp__log_set_rank, from world/: the process's rank in
 * MPI_COMM_WORLD, whatever communicator the world is on, so that it names one process), else the
 * rank the MPI launchers export (mpirun, srun, sympoolrun: so pool/, below launch/, and lines
 * logged before sp_world_init agree with it), else unknown (-1). The rank is process-wide; relaxed
 * atomics.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"

static int world_rank = -1; /* set by the world, -1 = not set (relaxed atomics) */
static char host[64];       /* short host name, filled once (host_once) */
static pthread_once_t host_once = PTHREAD_ONCE_INIT;

void sp__process_host_read(char *out, size_t cap) {
    /* Room for the longest name Linux has (HOST_NAME_MAX, 64) and more: gethostname() into 64
     * bytes refused a 64-character name (ENAMETOOLONG), and every node was "unknown", though its
     * short name ("gpu01" of a long FQDN) fits. */
    char name[256];
    if (cap == 0)
        return;
    if (gethostname(name, sizeof name) != 0) {
        snprintf(out, cap, "unknown");
        return;
    }
    name[sizeof name - 1] = '\0';
    char *dot = strchr(name, '.'); /* NCCL shows the short name too */
    if (dot != NULL)
        *dot = '\0';
    size_t n = strnlen(name, cap - 1); /* cut to what the caller keeps, as world.h says */
    /* ...at a character's boundary: a cut through one left a lone lead byte, which made the
     * reports' JSON and Prometheus text invalid UTF-8 (a stray byte stays one byte). */
    size_t keep = 0;
    while (keep < n) {
        size_t k = sp__utf8_len((const unsigned char *)name + keep);
        k = k ? k : 1;
        if (keep + k > n)
            break;
        keep += k;
    }
    memcpy(out, name, keep);
    out[keep] = '\0';
}

static void host_init(void) {
    sp__process_host_read(host, sizeof host);
}

const char *sp__process_host(void) {
    pthread_once(&host_once, host_init);
    return host;
}

void sp__process_set_rank(int rank) {
    __atomic_store_n(&world_rank, rank, __ATOMIC_RELAXED);
}

/* A launcher variable's rank: a whole number from 0 to INT_MAX, else -1 (atoi read "7x" as 7,
 * "x" as 0, and a number past int is undefined for it: each would name another rank's file). */
static int parse_rank(const char *v) {
    char *end;
    errno = 0;
    long r = strtol(v, &end, 10);
    if (end == v || *end != '\0' || errno != 0 || r < 0 || r > INT_MAX)
        return -1;
    return (int)r;
}

/* The launchers' rank variables, read each time: a test may set them. One that holds no rank is
 * passed over for the next. */
static int launcher_rank(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK",
                                       "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        int rank = v != NULL ? parse_rank(v) : -1;
        if (rank >= 0)
            return rank;
    }
    return -1;
}

int sp__process_rank(void) {
    int r = __atomic_load_n(&world_rank, __ATOMIC_RELAXED);
    return r >= 0 ? r : launcher_rank();
}

sp_expand_t sp__path_expand(const char *pattern, int unknown_rank, char *out, size_t cap) {
    size_t n = 0;
    int rank = sp__process_rank();
    if (rank < 0)
        rank = unknown_rank;
    for (const char *p = pattern; *p != '\0'; p++) {
        char piece[80];
        const char *add = piece;
        if (p[0] == '%' && p[1] != '\0') {
            p++;
            switch (*p) {
            case 'h':
                add = sp__process_host();
                break;
            case 'p':
                snprintf(piece, sizeof piece, "%ld", (long)getpid());
                break;
            case 'r':
                if (rank < 0)
                    return SP_EXPAND_NO_RANK;
                snprintf(piece, sizeof piece, "%d", rank);
                break;
            case '%':
                add = "%";
                break;
            default: /* not ours: kept as written */
                snprintf(piece, sizeof piece, "%%%c", *p);
                break;
            }
        } else {
            piece[0] = *p;
            piece[1] = '\0';
        }
        size_t len = strlen(add);
        if (n + len + 1 > cap)
            return SP_EXPAND_TOO_LONG;
        memcpy(out + n, add, len);
        n += len;
    }
    if (cap == 0)
        return SP_EXPAND_TOO_LONG;
    out[n] = '\0';
    return SP_EXPAND_OK;
}
