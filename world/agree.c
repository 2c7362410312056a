/*
 * agree.c: the agreement round every collective sympool call starts with (symmetric pools'
 * create, malloc, growth, empty-cache and destroy; the collectives; the statistics), and its
 * deadline.
 *
 * One message shape for every kind of round (sp_agree_t): the operation, its call number on the
 * communicator, whether this rank's own checks passed, eight operation fields, and this rank's
 * deadline. It is reduced by ONE MPI_Iallreduce with a user-defined op into the minimum and the
 * maximum of every field, the set and count of ranks whose checks failed, and the earliest
 * deadline with its rank. Because every round has the same length and names its operation, a
 * rank that is in another call than its peers is matched against their round and every rank
 * sees both operations (SP_ERR_MISMATCH), never an MPI truncation.
 *
 * Deadline (SYMPOOL_SYM_TIMEOUT): a rank polls its request until CLOCK_REALTIME passes its own
 * deadline, then abandons it (MPI cannot cancel a collective): the request and its buffer go to
 * the graveyard, are never freed while pending, and the communicator they are on must never be
 * freed (sp__agree_pending). A round that completes after the earliest contributor's deadline
 * is a timeout on the rank that sees it too: that is how a rank that arrives late (after its
 * peers gave up) learns it, instead of going on alone into a data transfer nobody else joins.
 * Every rank applies the same rule to the same reduced deadline, so they agree except when the
 * round completes within MPI's progress latency of that deadline. Real time, not monotonic
 * time: the deadline is compared across ranks (same clock on one node; NTP-close across nodes,
 * far below any useful deadline).
 *
 * Locking: s_grave_lock guards the graveyard; the MPI op is created once under s_op_lock.
 */
#include <pthread.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "world/world.h"

/* Wire layout: int64 words, each reduced by its own rule (see combine). */
enum {
    W_OP_LO,
    W_OP_HI,
    W_CALL_LO,
    W_CALL_HI,
    W_F_LO,
    W_F_HI = W_F_LO + SP_AGREE_NF,
    W_NBAD = W_F_HI + SP_AGREE_NF,
    W_BAD_LO,
    W_SET,
    W_DEADLINE = W_SET + SP_AGREE_SET_WORDS,
    W_DEADLINE_RANK,
    W_COUNT
};

typedef struct sp_grave {
    MPI_Request req;       /* abandoned, maybe still pending */
    MPI_Comm comm;         /* the communicator it is on */
    int64_t *buf;          /* its send and receive buffers */
    struct sp_grave *next; /* s_grave_lock */
} sp_grave_t;

static pthread_mutex_t s_grave_lock = PTHREAD_MUTEX_INITIALIZER;
static sp_grave_t *s_graves; /* s_grave_lock */
static pthread_mutex_t s_op_lock = PTHREAD_MUTEX_INITIALIZER;
static MPI_Op s_op = MPI_OP_NULL; /* s_op_lock, then constant */
static bool s_op_ready;           /* s_op is created (atomic) */
static uint64_t s_rounds;         /* rounds started by this process (relaxed atomic) */

uint64_t sp__agree_rounds(void) {
    return __atomic_load_n(&s_rounds, __ATOMIC_RELAXED);
}

static const char *const op_names[SP_AGREE_OP_COUNT] = {
    "(none)",
    "sp_symmetric_mempool_create",
    "sp_symmetric_malloc",
    "sp_symmetric_malloc (growth)",
    "sp_symmetric_malloc (segment registration)",
    "sp_symmetric_empty_cache",
    "sp_symmetric_mempool_destroy",
    "sp_allreduce",
    "sp_allgather",
    "sp_reduce_scatter",
    "sp_broadcast",
    "sp_stats_aggregate",
    "sp_stats_report",
    "NCCL set-up (every rank ready)",
    "symmetric segment release",
};

const char *sp__agree_op_name(int64_t op) {
    return op >= 0 && op < SP_AGREE_OP_COUNT ? op_names[op] : "(an unknown sympool call)";
}

static void combine(void *in_v, void *io_v, int *len, MPI_Datatype *type) {
    (void)type;
    const int64_t *in = in_v;
    int64_t *io = io_v;
    for (int m = 0; m + W_COUNT <= *len; m += W_COUNT, in += W_COUNT, io += W_COUNT) {
        for (int i = 0; i < W_COUNT; i++) {
            bool is_lo =
                i == W_OP_LO || i == W_CALL_LO || i == W_BAD_LO || (i >= W_F_LO && i < W_F_HI);
            bool is_hi = i == W_OP_HI || i == W_CALL_HI || (i >= W_F_HI && i < W_NBAD);
            if (is_lo)
                io[i] = in[i] < io[i] ? in[i] : io[i];
            else if (is_hi)
                io[i] = in[i] > io[i] ? in[i] : io[i];
            else if (i == W_NBAD)
                io[i] += in[i];
            else if (i >= W_SET && i < W_DEADLINE)
                io[i] |= in[i];
        }
        /* The earliest deadline, the lowest rank on ties: independent of the reduction order. */
        if (in[W_DEADLINE] < io[W_DEADLINE] ||
            (in[W_DEADLINE] == io[W_DEADLINE] && in[W_DEADLINE_RANK] < io[W_DEADLINE_RANK])) {
            io[W_DEADLINE] = in[W_DEADLINE];
            io[W_DEADLINE_RANK] = in[W_DEADLINE_RANK];
        }
    }
}

static MPI_Op agree_op(void) {
    /* Created once; every later round reads it without the lock. */
    if (__atomic_load_n(&s_op_ready, __ATOMIC_ACQUIRE))
        return s_op;
    pthread_mutex_lock(&s_op_lock);
    if (s_op == MPI_OP_NULL && MPI_Op_create(combine, 1, &s_op) != MPI_SUCCESS)
        s_op = MPI_OP_NULL;
    MPI_Op op = s_op;
    if (op != MPI_OP_NULL)
        __atomic_store_n(&s_op_ready, true, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&s_op_lock);
    return op;
}

static int64_t realtime_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

double sp__agree_timeout_s(void) {
    double t = sp__option_double(SP_OPT_SYM_TIMEOUT);
    return t > 0.0 && t <= 31536000.0 ? t : 0.0; /* the option's check bounds it; 0 = none */
}

/* This rank's deadline in ns since the epoch; INT64_MAX when there is none. The option is at
 * most one year, so the sum cannot overflow. */
static int64_t deadline_ns(double limit) {
    return limit > 0.0 ? realtime_ns() + (int64_t)(limit * 1e9) : INT64_MAX;
}

static void bury(MPI_Request req, MPI_Comm comm, int64_t *buf) {
    sp_grave_t *g = malloc(sizeof *g);
    if (!g)
        return; /* the buffer then leaks with the request: never freed, still safe */
    g->req = req;
    g->comm = comm;
    g->buf = buf;
    pthread_mutex_lock(&s_grave_lock);
    g->next = s_graves;
    s_graves = g;
    pthread_mutex_unlock(&s_grave_lock);
}

bool sp__agree_pending(MPI_Comm comm) {
    bool pending = false;
    pthread_mutex_lock(&s_grave_lock);
    for (sp_grave_t **pp = &s_graves; *pp;) {
        sp_grave_t *g = *pp;
        int done = 0;
        if (g->comm == comm && MPI_Test(&g->req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
            *pp = g->next; /* a late rank completed it: nothing is left to protect */
            free(g->buf);
            free(g);
            continue;
        }
        pending = pending || g->comm == comm;
        pp = &g->next;
    }
    pthread_mutex_unlock(&s_grave_lock);
    return pending;
}

static void pack(const sp_agree_t *a, int rank, int64_t deadline, int64_t *w) {
    memset(w, 0, W_COUNT * sizeof *w);
    w[W_OP_LO] = w[W_OP_HI] = a->op;
    w[W_CALL_LO] = w[W_CALL_HI] = (int64_t)a->callno;
    for (int i = 0; i < SP_AGREE_NF; i++)
        w[W_F_LO + i] = w[W_F_HI + i] = a->f[i];
    w[W_NBAD] = !a->ok;
    w[W_BAD_LO] = a->ok ? INT64_MAX : rank;
    if (!a->ok && rank < SP_AGREE_SET_WORDS * 64)
        w[W_SET + rank / 64] = (int64_t)(1ull << (rank % 64));
    w[W_DEADLINE] = deadline;
    w[W_DEADLINE_RANK] = rank;
}

static void unpack(const int64_t *w, sp_agree_t *a) {
    a->op_lo = w[W_OP_LO];
    a->op_hi = w[W_OP_HI];
    a->call_lo = (uint64_t)w[W_CALL_LO];
    a->call_hi = (uint64_t)w[W_CALL_HI];
    for (int i = 0; i < SP_AGREE_NF; i++) {
        a->lo[i] = w[W_F_LO + i];
        a->hi[i] = w[W_F_HI + i];
    }
    a->nbad = (int)w[W_NBAD];
    a->bad_lo = a->nbad ? (int)w[W_BAD_LO] : -1;
    for (int i = 0; i < SP_AGREE_SET_WORDS; i++)
        a->bad_set[i] = (uint64_t)w[W_SET + i];
    a->late_rank = (int)w[W_DEADLINE_RANK];
}

/* Each thread's round buffer, kept between rounds (a cache hit's round must not cost a malloc):
 * heap memory, because if this rank gives up MPI may still write it when a late rank arrives;
 * then it goes to the graveyard and the thread makes a new one. Freed at thread exit. */
static pthread_key_t s_buf_key;
static pthread_once_t s_buf_once = PTHREAD_ONCE_INIT;

static void make_buf_key(void) {
    (void)pthread_key_create(&s_buf_key, free);
}

static int64_t *round_buf(void) {
    pthread_once(&s_buf_once, make_buf_key);
    int64_t *buf = pthread_getspecific(s_buf_key);
    if (!buf && (buf = malloc(2 * W_COUNT * sizeof *buf)) != NULL &&
        pthread_setspecific(s_buf_key, buf) != 0) {
        free(buf);
        buf = NULL;
    }
    return buf;
}

/* The buffer is now the graveyard's: the thread's next round makes a new one. */
static void give_up_buf(void) {
    (void)pthread_setspecific(s_buf_key, NULL);
}

const char *sp__agree_name(const sp_agree_t *a, const char *what, char *buf, size_t n) {
    if (what)
        return what;
    return a->describe ? a->describe(a->describe_ctx, buf, n) : "a collective sympool call";
}

sp_status_t sp__agree(MPI_Comm comm, sp_agree_t *a, const char *what_in, bool *abandoned_p) {
    *abandoned_p = false;
    char wbuf[160];
#define what sp__agree_name(a, what_in, wbuf, sizeof wbuf)
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    double limit = sp__agree_timeout_s();
    int64_t deadline = deadline_ns(limit);
    MPI_Op op = agree_op();
    int64_t *buf = round_buf();
    if (!buf || op == MPI_OP_NULL) {
        /* Nothing was sent: the peers will time out, which is what a missing rank looks like. */
        return sp__error(SP_ERR_SYSTEM, SP_SUB_BOOT, "%s: %s", what,
                         op == MPI_OP_NULL ? "MPI_Op_create for the agreement failed"
                                           : "out of host memory for the agreement");
    }
    pack(a, rank, deadline, buf);
    __atomic_fetch_add(&s_rounds, 1, __ATOMIC_RELAXED);
    MPI_Request req;
    int rc = MPI_Iallreduce(buf, buf + W_COUNT, W_COUNT, MPI_INT64_T, op, comm, &req);
    if (rc != MPI_SUCCESS)
        return sp__world_mpi_status(rc, what);
    for (unsigned spins = 0;; spins++) {
        int done = 0;
        rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            give_up_buf();
            bury(req, comm, buf); /* an erroneous request may still be live */
            *abandoned_p = true;
            return sp__world_mpi_status(rc, what);
        }
        if (done)
            break;
        if (spins >= 64) {
            if (realtime_ns() >= deadline) {
                give_up_buf();
                bury(req, comm, buf);
                *abandoned_p = true;
                return sp__error(SP_ERR_TIMEOUT, SP_SUB_BOOT,
                                 "%s: timed out: not every rank arrived within %g s "
                                 "(SYMPOOL_SYM_TIMEOUT); a rank stopped calling, died, or calls "
                                 "in another order",
                                 what, limit);
            }
            sched_yield(); /* oversubscribed ranks must let the late one run */
        }
    }
    unpack(buf + W_COUNT, a);
    int64_t earliest = buf[W_COUNT + W_DEADLINE];
    if (earliest != INT64_MAX && realtime_ns() > earliest) {
        a->late = true;
        return sp__error(SP_ERR_TIMEOUT, SP_SUB_BOOT,
                         "%s: timed out: rank %d stopped waiting at its deadline (SYMPOOL_SYM_"
                         "TIMEOUT) before every rank arrived; the ranks were in %s%s%s",
                         what, a->late_rank, sp__agree_op_name(a->op_lo),
                         a->op_lo == a->op_hi ? "" : " and ",
                         a->op_lo == a->op_hi ? "" : sp__agree_op_name(a->op_hi));
    }
    return SP_SUCCESS;
}
#undef what

/* "rank 1", "ranks 1, 3 and 4"; "5 ranks (the lowest 2)" when they do not all fit. */
const char *sp__agree_bad_ranks(const sp_agree_t *a, char *buf, size_t len) {
    size_t at = (size_t)snprintf(buf, len, "%s", a->nbad == 1 ? "rank " : "ranks ");
    int listed = 0;
    for (int r = 0; r < SP_AGREE_SET_WORDS * 64 && at + 16 < len; r++) {
        if (!(a->bad_set[r / 64] >> (r % 64) & 1))
            continue;
        listed++;
        at += (size_t)snprintf(buf + at, len - at, "%s%d",
                               listed == 1         ? ""
                               : listed == a->nbad ? " and "
                                                   : ", ",
                               r);
    }
    if (listed != a->nbad)
        snprintf(buf, len, "%d ranks (the lowest %d)", a->nbad, a->bad_lo);
    return buf;
}

sp_status_t sp__agree_check(const sp_agree_t *a, const char *what_in) {
    char wbuf[160];
    const char *what = a->op_lo == a->op_hi && a->call_lo == a->call_hi
                           ? ""
                           : sp__agree_name(a, what_in, wbuf, sizeof wbuf);
    if (a->op_lo != a->op_hi)
        return sp__error(SP_ERR_MISMATCH, SP_SUB_BOOT,
                         "%s: ranks are in different collective calls: %s (call #%llu) and %s "
                         "(call #%llu); every rank must make the same sympool collective calls "
                         "in the same order",
                         what, sp__agree_op_name(a->op_lo), (unsigned long long)a->call_lo,
                         sp__agree_op_name(a->op_hi), (unsigned long long)a->call_hi);
    if (a->call_lo != a->call_hi)
        return sp__error(SP_ERR_MISMATCH, SP_SUB_BOOT,
                         "%s: ranks are at different calls (from #%llu to #%llu): a rank skipped "
                         "or added a collective call",
                         what, (unsigned long long)a->call_lo, (unsigned long long)a->call_hi);
    return SP_SUCCESS;
}

sp_status_t sp__agree_band(MPI_Comm comm, uint64_t *bits, size_t words, const char *what,
                           bool *abandoned_p) {
    *abandoned_p = false;
    if (words > (size_t)INT_MAX / 2)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_BOOT, "%s: %zu words is too many", what,
                         words);
    double limit = sp__agree_timeout_s();
    int64_t deadline = deadline_ns(limit);
    uint64_t *buf = malloc(2 * words * sizeof *buf);
    if (!buf)
        return sp__error(SP_ERR_SYSTEM, SP_SUB_BOOT, "%s: out of host memory", what);
    memcpy(buf, bits, words * sizeof *buf);
    __atomic_fetch_add(&s_rounds, 1, __ATOMIC_RELAXED);
    MPI_Request req;
    int rc = MPI_Iallreduce(buf, buf + words, (int)words, MPI_UINT64_T, MPI_BAND, comm, &req);
    if (rc != MPI_SUCCESS) {
        free(buf);
        return sp__world_mpi_status(rc, what);
    }
    for (unsigned spins = 0;; spins++) {
        int done = 0;
        rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS || (!done && spins >= 64 && realtime_ns() >= deadline)) {
            bury(req, comm, (int64_t *)buf);
            *abandoned_p = true;
            if (rc != MPI_SUCCESS)
                return sp__world_mpi_status(rc, what);
            return sp__error(SP_ERR_TIMEOUT, SP_SUB_BOOT,
                             "%s: timed out: not every rank arrived within %g s "
                             "(SYMPOOL_SYM_TIMEOUT)",
                             what, limit);
        }
        if (done)
            break;
        if (spins >= 64)
            sched_yield();
    }
    memcpy(bits, buf + words, words * sizeof *buf);
    free(buf);
    return SP_SUCCESS;
}
