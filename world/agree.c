/*
 * agree.c: the agreement round every collective sympool call starts with (symmetric pools'
 * create, malloc, growth, empty-cache and destroy; the collectives; the statistics), and its
 * deadline.
 *
 * One message shape for every kind of round (sp_agree_t): the operation, its call number on the
 * communicator, whether this rank's own checks passed, eight operation fields, and this rank's
 * deadline. Every rank computes from all of them the minimum and the maximum of every field, the
 * set and count of ranks whose checks failed, and the earliest deadline with its rank (how the
 * records travel: below). Because every round has the same length and names its operation, a
 * rank that is in another call than its peers is matched against their round and every rank
 * sees both operations (SP_ERR_MISMATCH), never an MPI truncation.
 *
 * Deadline (SYMPOOL_SYM_TIMEOUT): a rank polls its request until CLOCK_REALTIME passes its own
 * deadline, then abandons it (MPI cannot cancel a collective): the request and its buffer go to
 * the graveyard, are never freed while pending, and the communicator they are on must never be
 * freed (sp__agree_pending). A round that a rank entered too late is a timeout on the ranks that
 * see it complete too: that is how a rank that arrives late (after its peers gave up) learns it,
 * instead of going on alone into a data transfer nobody else joins. The late rule is decided
 * from the round's data alone, the same on every rank: each record carries the time it was sent,
 * and the round is late when the latest comes within a margin of the earliest deadline (a tenth
 * of the shortest span from a record's sending to its rank's deadline, at most LATE_MARGIN_NS).
 * A rank gives up only at its own deadline, and a round whose last record was sent a margin
 * before it reaches every rank first unless MPI or the scheduler stalls it for longer (a rank
 * that waited for a buffer sends the time it sent, not the time it entered). Deciding by each
 * rank's own clock when it saw the round complete split the ranks: one at its deadline timed out
 * while a peer that saw the round complete a moment earlier went on into MPI_Allreduce, and hung.
 * Real time, not monotonic time: times are compared across ranks (same clock on one node;
 * NTP-close across nodes, far below any useful deadline).
 * The same deadline and graveyard bound the steps that are not rounds: the free-segment bitmap's
 * MPI_BAND (sp__agree_band_buf), the communicator duplicates (sp__agree_dup) and the nccl
 * registrar's gather of the node's GPU table (sp__agree_gather_buf). They carry no deadlines, so
 * the late rule does not apply to them: a rank late to one learns that its peers gave up at its
 * next round, which they never join.
 *
 * Small worlds (at most P2P_MAX_RANKS ranks) exchange their records point to point: every rank
 * sends its own inputs (R_* layout below: op, call number, fields, ok, deadline, then any payload)
 * to every other rank and receives theirs on the same communicator and tag, then computes the
 * outputs locally from all of them in rank order, so every rank computes the same result. MPI's
 * non-overtaking rule matches the k-th record a rank sends to a peer with the k-th receive that
 * peer posts, which is exactly the matching a collective gives (and abandoned requests keep their
 * place, as an abandoned collective does). On one node that costs what a bare 8-byte
 * MPI_Allreduce does, where a nonblocking collective costs about three times that. A record is
 * sent only as long as its payload needs; every receive is posted for the longest record, so a
 * rank in another call (or with another count) is a mismatch and never an MPI truncation.
 *
 * Larger worlds use a collective. Every round first goes out in the SHORT form, which MPI reduces
 * with its built-in MPI_MAX (a user-defined op costs a call per element and keeps MPI off its tuned
 * paths): each value v travels as v and ~v, and since ~ reverses the order of int64, the maximum
 * of ~v is ~min(v). So one MPI_MAX gives the min and max of the op, the call number and every
 * field, whether any rank's checks failed, the lowest failed rank, the earliest deadline (to the
 * ns: the late rule below must see exactly the deadline a rank gave up at) and, for messages, the
 * rank that set it (a key of the deadline in ms above 21 bits of rank: the lowest rank among
 * those whose deadline falls in the earliest millisecond).
 * Only when some rank's checks failed does a FULL round follow (the same inputs, the user-defined
 * op, W_* layout below) for the count and the set of failed ranks; every rank sees the same
 * short result, so every rank takes the second round or none does.
 *
 * Host memory: a round never needs the heap to take part. A thread's round buffer (made at its
 * first round) or a duplicate's cell that malloc refuses is replaced, for that round, by one of
 * a few static spares, so a rank short of memory still sends its record (its caller's ok flag
 * then says what failed) instead of leaving its peers to time out.
 *
 * Locking: s_grave_lock guards the graveyard; the MPI op is created once under s_op_lock; a
 * spare is taken and given back with one atomic exchange/store each.
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

/* Short wire layout: int64 words, all reduced by MPI_MAX (see the top of the file). */
enum {
    S_OP,                              /* op */
    S_NOT_OP,                          /* ~op: the max is ~(smallest op) */
    S_CALL,                            /* call number */
    S_NOT_CALL,                        /* ~call number */
    S_F,                               /* the fields */
    S_NOT_F = S_F + SP_AGREE_NF,       /* ~fields */
    S_ANY_BAD = S_NOT_F + SP_AGREE_NF, /* 1 when this rank's checks failed */
    S_NOT_BAD_RANK,                    /* ~rank when they failed, else INT64_MIN */
    S_NOT_DEADLINE,                    /* ~deadline in ns (INT64_MAX when none) */
    S_NOT_LATE_KEY,                    /* ~(deadline ms << 21 | rank), INT64_MIN for none */
    S_POST,                            /* sending time in ns: the max is the latest */
    S_NOT_SPAN,                        /* ~(deadline - sending), ~INT64_MAX when none */
    S_COUNT
};
#define S_RANK_BITS 21
#define S_RANK_MASK (((int64_t)1 << S_RANK_BITS) - 1)
/* Deadlines in ms below 2^42 (until the year 2109) fit above the rank bits. */
#define S_DEADLINE_MS_MAX ((int64_t)1 << (62 - S_RANK_BITS))

/* A small world's record: one rank's own inputs, as it sends them to every peer. */
enum {
    R_OP,                      /* op */
    R_CALL,                    /* call number */
    R_F,                       /* the fields */
    R_CMP = R_F + SP_AGREE_NF, /* words R_OP..R_CMP-1 get a min and a max over the ranks */
    R_OK = R_CMP,              /* 1 when this rank's checks passed */
    R_DEADLINE,                /* deadline in ns (INT64_MAX when none) */
    R_POST,                    /* sending time in ns */
    R_COUNT                    /* the payload follows, in whole words */
};

#define P2P_MAX_RANKS SP_AGREE_P2P_MAX_RANKS
#define P2P_TAG 0x5350 /* the agreement communicators carry nothing else point to point */
/* The requests of one round: a collective's one, or a send and a receive per peer. */
#define MAX_REQS (2 * (P2P_MAX_RANKS - 1))
/* A thread's round buffer: one record (with room for the largest payload) per rank of a small
 * world, or the collective's send and receive halves. */
#define P2P_WORDS (R_COUNT + SP_AGREE_PAYLOAD_MAX / 8)
#define BUF_WORDS (P2P_MAX_RANKS * P2P_WORDS)
_Static_assert(BUF_WORDS >= 2 * (int)W_COUNT && (int)W_COUNT >= (int)S_COUNT,
               "round buffer too small");

typedef struct sp_grave {
    MPI_Request reqs[MAX_REQS]; /* abandoned, maybe still pending */
    int nreqs;
    MPI_Comm comm;         /* the communicator they are on */
    int64_t *buf;          /* their send and receive buffers */
    struct sp_grave *next; /* s_grave_lock */
} sp_grave_t;

static void buf_free(void *p);

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
    "sp_world_finalize",
    "SYMPOOL_REPORT at sp_world_finalize",
    "world creation (every rank's duplicates in time)",
    "sp_symmetric_mempool_create (the pool's communicator in time)",
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

/* How close to the earliest deadline the latest record's sending may come (the late rule, top
 * of the file): a tenth of the shortest span from sending to deadline, and at most this. */
#define LATE_MARGIN_NS ((int64_t)250 * 1000000)

/* A round's time span from entry to deadline, INT64_MAX for none. */
static int64_t span_of(int64_t post, int64_t deadline) {
    return deadline == INT64_MAX ? INT64_MAX : deadline - post;
}

/* This rank's deadline in ns since the epoch; INT64_MAX when there is none. The option is at
 * most one year, so the sum cannot overflow. */
static int64_t deadline_ns(double limit) {
    return limit > 0.0 ? realtime_ns() + (int64_t)(limit * 1e9) : INT64_MAX;
}

static void bury(const MPI_Request *reqs, int nreqs, MPI_Comm comm, int64_t *buf) {
    sp_grave_t *g = malloc(sizeof *g);
    if (!g)
        return; /* the buffer then leaks with the requests: never freed, still safe */
    memcpy(g->reqs, reqs, (size_t)nreqs * sizeof *reqs);
    g->nreqs = nreqs;
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
        if (g->comm == comm &&
            MPI_Testall(g->nreqs, g->reqs, &done, MPI_STATUSES_IGNORE) == MPI_SUCCESS && done) {
            *pp = g->next; /* a late rank completed it: nothing is left to protect */
            buf_free(g->buf);
            free(g);
            continue;
        }
        pending = pending || g->comm == comm;
        pp = &g->next;
    }
    pthread_mutex_unlock(&s_grave_lock);
    return pending;
}

/* MPI_Finalize is erroneous while a request is pending (MPI-3.1 8.7), and Open MPI 4 crashes in
 * it (mca_pml_ob1_del_comm) when an abandoned MPI_Comm_idup completes meanwhile: every rank
 * posted it, but the deadline (SYMPOOL_SYM_TIMEOUT below the duplicate's few progress rounds)
 * passed first. Called as MPI_Finalize starts: the graves are tested, which progresses them, for
 * at most limit_s; what completes is dropped, what a peer never matched stays. */
void sp__agree_drain(double limit_s) {
    int64_t until = realtime_ns() + (int64_t)(limit_s * 1e9);
    pthread_mutex_lock(&s_grave_lock);
    for (;;) {
        bool pending = false;
        for (sp_grave_t **pp = &s_graves; *pp;) {
            sp_grave_t *g = *pp;
            int done = 0;
            if (MPI_Testall(g->nreqs, g->reqs, &done, MPI_STATUSES_IGNORE) == MPI_SUCCESS && done) {
                *pp = g->next;
                buf_free(g->buf);
                free(g);
                continue;
            }
            pending = true;
            pp = &g->next;
        }
        if (!pending || realtime_ns() >= until)
            break;
        sched_yield();
    }
    pthread_mutex_unlock(&s_grave_lock);
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

static void pack_short(const sp_agree_t *a, int rank, int64_t deadline, int64_t *w) {
    w[S_OP] = a->op;
    w[S_NOT_OP] = ~a->op;
    w[S_CALL] = (int64_t)a->callno;
    w[S_NOT_CALL] = ~(int64_t)a->callno;
    for (int i = 0; i < SP_AGREE_NF; i++) {
        w[S_F + i] = a->f[i];
        w[S_NOT_F + i] = ~a->f[i];
    }
    w[S_ANY_BAD] = !a->ok;
    w[S_NOT_BAD_RANK] = a->ok ? INT64_MIN : ~(int64_t)rank;
    w[S_NOT_DEADLINE] = ~deadline;
    int64_t ms = deadline == INT64_MAX ? S_DEADLINE_MS_MAX : deadline / 1000000;
    int64_t r = rank < (int)S_RANK_MASK ? rank : S_RANK_MASK;
    w[S_NOT_LATE_KEY] = ms >= S_DEADLINE_MS_MAX ? INT64_MIN : ~(ms << S_RANK_BITS | r);
    w[S_POST] = a->post;
    w[S_NOT_SPAN] = ~span_of(a->post, deadline);
}

/* The outputs of a short round; *earliest_p gets the earliest deadline (ns, INT64_MAX: none).
 * Whether the full round must follow is w[S_ANY_BAD]. */
static void unpack_short(const int64_t *w, sp_agree_t *a, int64_t *earliest_p) {
    a->op_lo = ~w[S_NOT_OP];
    a->op_hi = w[S_OP];
    a->call_lo = (uint64_t)~w[S_NOT_CALL];
    a->call_hi = (uint64_t)w[S_CALL];
    for (int i = 0; i < SP_AGREE_NF; i++) {
        a->lo[i] = ~w[S_NOT_F + i];
        a->hi[i] = w[S_F + i];
    }
    a->nbad = 0;
    a->bad_lo = w[S_ANY_BAD] ? (int)~w[S_NOT_BAD_RANK] : -1;
    memset(a->bad_set, 0, sizeof a->bad_set);
    *earliest_p = ~w[S_NOT_DEADLINE];
    a->late_rank = w[S_NOT_LATE_KEY] == INT64_MIN ? 0 : (int)(~w[S_NOT_LATE_KEY] & S_RANK_MASK);
    a->latest_post = w[S_POST];
    a->min_span = ~w[S_NOT_SPAN];
}

/* Each thread's round buffer, kept between rounds (a cache hit's round must not cost a malloc):
 * heap memory, because if this rank gives up MPI may still write it when a late rank arrives;
 * then it goes to the graveyard and the thread makes a new one. t_buf is the fast way to it;
 * the key only frees it at thread exit. */
static pthread_key_t s_buf_key;
static pthread_once_t s_buf_once = PTHREAD_ONCE_INIT;
/* Whether s_buf_key was made: pthread_key_create fails once the process holds PTHREAD_KEYS_MAX
 * keys, and s_buf_key is then no key of ours (its zero is the process's first key, another
 * library's); rounds then take the spares, as when the heap has no buffer. */
static bool s_buf_key_made;
static _Thread_local int64_t *t_buf;
static _Thread_local bool t_test_no_host; /* sp__agree_test_fail_host */

void sp__agree_test_fail_host(bool on) {
    t_test_no_host = on;
}

static void make_buf_key(void) {
    s_buf_key_made = pthread_key_create(&s_buf_key, free) == 0;
}

/* The handle MPI_Comm_idup writes when it completes: its own cell (heap or a spare), because an
 * abandoned duplicate may complete after the caller has returned (the graveyard keeps the cell). */
typedef union {
    MPI_Comm comm;
    int64_t words[(sizeof(MPI_Comm) + 7) / 8];
} dup_cell_t;

/* Spares: static buffers for a round (or a duplicate's cell) whose heap allocation failed, so
 * that a rank short of host memory still takes part in the round instead of leaving its peers to
 * wait for it until their deadline. A spare is taken for one round and given back after it; one
 * abandoned goes to the graveyard like a heap buffer and comes back when its grave is dropped. */
#define SPARES 4
typedef union {
    int64_t words[BUF_WORDS];
    dup_cell_t cell;
} spare_t;
static spare_t s_spares[SPARES];
static bool s_spare_used[SPARES]; /* atomic */

static int spare_index(const void *p) {
    uintptr_t a = (uintptr_t)p, lo = (uintptr_t)s_spares;
    if (a < lo || a >= lo + sizeof s_spares)
        return -1;
    return (int)((a - lo) / sizeof s_spares[0]);
}

/* A free spare, waiting until `deadline` while other threads' rounds hold them all (a round
 * gives its spare back by its own deadline); NULL when none came back in time. */
static spare_t *spare_take(int64_t deadline) {
    for (;;) {
        for (int i = 0; i < SPARES; i++)
            if (!__atomic_exchange_n(&s_spare_used[i], true, __ATOMIC_ACQUIRE))
                return &s_spares[i];
        if (realtime_ns() >= deadline)
            return NULL;
        sched_yield();
    }
}

/* Gives a spare back (p is one). */
static void spare_put(const void *p) {
    __atomic_store_n(&s_spare_used[spare_index(p)], false, __ATOMIC_RELEASE);
}

/* Frees a graveyard's buffer or cell: a spare goes back to the spares, heap memory to the heap.
 * (Callers that know which one they hold call spare_put or free: inlined here, a spare's known
 * origin makes GCC warn about the free branch.) */
static void buf_free(void *p) {
    if (spare_index(p) >= 0)
        spare_put(p);
    else
        free(p);
}

/* The thread's round buffer; a spare (*spare_p) when the heap has none for it, which the caller
 * gives back after the round unless the round was abandoned; NULL only when no spare came back
 * before `deadline` either. */
static int64_t *round_buf(int64_t deadline, bool *spare_p) {
    *spare_p = false;
    if (SP_LIKELY(t_buf != NULL))
        return t_buf;
    pthread_once(&s_buf_once, make_buf_key);
    int64_t *buf = t_test_no_host || !s_buf_key_made ? NULL : malloc(BUF_WORDS * sizeof *buf);
    if (buf && pthread_setspecific(s_buf_key, buf) != 0) {
        free(buf);
        buf = NULL;
    }
    if (SP_LIKELY(buf != NULL))
        return t_buf = buf;
    spare_t *spare = spare_take(deadline);
    *spare_p = spare != NULL;
    return spare ? spare->words : NULL;
}

/* The buffer is now the graveyard's: the thread's next round makes a new one. */
static void give_up_buf(void) {
    t_buf = NULL;
    (void)pthread_setspecific(s_buf_key, NULL);
}

const char *sp__agree_name(const sp_agree_t *a, const char *what, char *buf, size_t n) {
    if (what)
        return what;
    return a && a->describe ? a->describe(a->describe_ctx, buf, n) : "a collective sympool call";
}

/* The name of the call for a message, formatted only on the error path that needs it (a cache
 * hit's round must not pay for a snprintf): WHAT(a, what_in) in a function with char wbuf[160]. */
#define WHAT(a, what_in) sp__agree_name((a), (what_in), wbuf, sizeof wbuf)

/* Wait for one round's requests until this rank's deadline. On an MPI error or the deadline the
 * requests and buf go to the graveyard (*abandoned_p). `a` (may be NULL) and `what` name the
 * call in the message. */
/* How long a round polls before it starts yielding the CPU between polls. */
#define SPIN_NS 50000
/* How long it yields between polls before it sleeps between them instead: a sched_yield with
 * nothing else runnable returns at once, so a rank waiting seconds for a late peer (a rank in a
 * checkpoint, the deadline of SYMPOOL_SYM_TIMEOUT) burnt its core the whole time, a core the
 * late rank, a data loader or, on a shared machine, another job could have used. Past this, each
 * sleep is a sixteenth of the time waited so far, at most SLEEP_MAX_NS: a peer arriving then is
 * seen at most about 6% (or 1 ms) later than by polling, and a round whose ranks are all there
 * never gets here. */
#define YIELD_NS 2000000
#define SLEEP_MAX_NS 1000000

static void sleep_ns(int64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
    nanosleep(&ts, NULL); /* a signal cutting it short only means an earlier poll */
}

/* How long to sleep before the next poll, having waited since `start`, with `deadline` ahead;
 * 0: yield instead. */
static int64_t backoff_ns(int64_t start, int64_t now, int64_t deadline) {
    int64_t waited = now - start;
    if (waited < YIELD_NS)
        return 0;
    int64_t ns = waited / 16;
    if (ns > SLEEP_MAX_NS)
        ns = SLEEP_MAX_NS;
    if (deadline != INT64_MAX && deadline - now < ns)
        ns = deadline - now; /* wake for the deadline, not past it */
    return ns > 0 ? ns : 0;
}

static sp_status_t wait_round(int nreqs, MPI_Request *reqs, MPI_Comm comm, int64_t *buf,
                              int64_t deadline, double limit, bool thread_buf, const sp_agree_t *a,
                              const char *what, bool *abandoned_p) {
    int64_t spin_until = 0; /* real time until which this rank polls without yielding */
    int64_t start = 0;      /* when it began to look at the clock: what backoff_ns measures */
    for (unsigned spins = 0;; spins++) {
        int done = 0;
        int rc = nreqs == 1 ? MPI_Test(reqs, &done, MPI_STATUS_IGNORE)
                            : MPI_Testall(nreqs, reqs, &done, MPI_STATUSES_IGNORE);
        if (SP_LIKELY(done && rc == MPI_SUCCESS))
            return SP_SUCCESS;
        int64_t now = !done && spins >= 64 ? realtime_ns() : 0;
        if (now && !spin_until) {
            start = now;
            spin_until = now + SPIN_NS;
        }
        bool expired = now && now >= deadline;
        if (rc != MPI_SUCCESS || expired) {
            if (thread_buf)
                give_up_buf();
            bury(reqs, nreqs, comm, buf); /* an erroneous request may still be live */
            *abandoned_p = true;
            char wbuf[160];
            if (rc != MPI_SUCCESS)
                return sp__world_mpi_status(rc, WHAT(a, what));
            return sp__error(SP_ERR_TIMEOUT, SP_SUB_BOOT,
                             "%s: timed out: not every rank arrived within %g s "
                             "(SYMPOOL_SYM_TIMEOUT); a rank stopped calling, died, or calls "
                             "in another order",
                             WHAT(a, what), limit);
        }
        /* Oversubscribed ranks must let the late one run, but a yield on a busy machine gives
         * the CPU away for a whole time slice: poll a while first, as MPI's own blocking calls
         * do, so that a peer a few microseconds late costs microseconds; then sleep (above). */
        if (now >= spin_until && now) {
            int64_t ns = backoff_ns(start, now, deadline);
            if (ns > 0)
                sleep_ns(ns);
            else
                sched_yield();
        }
    }
}

/* The late rule (top of the file): the latest entry within the margin of the earliest deadline,
 * decided from the round's data, so the same on every rank. */
static sp_status_t check_late(sp_agree_t *a, int64_t earliest, const char *what) {
    /* A span below 0 (a record sent after its own deadline) is no margin at all. */
    int64_t tenth = a->min_span > 0 ? a->min_span / 10 : 0;
    int64_t margin = tenth < LATE_MARGIN_NS ? tenth : LATE_MARGIN_NS;
    if (earliest == INT64_MAX || a->latest_post < earliest - margin)
        return SP_SUCCESS;
    a->late = true;
    char wbuf[160];
    return sp__error(SP_ERR_TIMEOUT, SP_SUB_BOOT,
                     "%s: timed out: rank %d stopped waiting at its deadline (SYMPOOL_SYM_"
                     "TIMEOUT) before every rank arrived; the ranks were in %s%s%s",
                     WHAT(a, what), a->late_rank, sp__agree_op_name(a->op_lo),
                     a->op_lo == a->op_hi ? "" : " and ",
                     a->op_lo == a->op_hi ? "" : sp__agree_op_name(a->op_hi));
}

/* The outputs of a small world's round from every rank's record (buf + p * P2P_WORDS, rank
 * order): the same computation on every rank. The earliest deadline goes to *earliest_p; its
 * rank, the lowest on ties (strict <, ranks in order), to a->late_rank. */
static inline __attribute__((always_inline)) void outputs_p2p(const int64_t *buf, int size,
                                                              sp_agree_t *a, int64_t *earliest_p) {
    int64_t lo[R_CMP], hi[R_CMP];
    memcpy(lo, buf, sizeof lo);
    memcpy(hi, buf, sizeof hi);
    int nbad = 0, bad_lo = -1, late_rank = 0;
    int64_t earliest = INT64_MAX, latest_post = INT64_MIN, min_span = INT64_MAX;
    memset(a->bad_set, 0, sizeof a->bad_set);
    for (int p = 0; p < size; p++) {
        const int64_t *r = buf + (size_t)p * P2P_WORDS;
        /* lo and hi start as rank 0's record: one equal to it (every rank in the same call with
         * the same fields, the common case) changes neither. */
        if (p && memcmp(r, buf, sizeof lo) != 0)
            for (int i = 0; i < R_CMP; i++) {
                lo[i] = r[i] < lo[i] ? r[i] : lo[i];
                hi[i] = r[i] > hi[i] ? r[i] : hi[i];
            }
        if (!r[R_OK]) {
            bad_lo = nbad++ ? bad_lo : p;
            a->bad_set[p / 64] |= 1ull << (p % 64); /* p < P2P_MAX_RANKS <= 256 */
        }
        if (r[R_DEADLINE] < earliest) {
            earliest = r[R_DEADLINE];
            late_rank = p;
        }
        int64_t span = span_of(r[R_POST], r[R_DEADLINE]);
        latest_post = r[R_POST] > latest_post ? r[R_POST] : latest_post;
        min_span = span < min_span ? span : min_span;
    }
    a->op_lo = lo[R_OP];
    a->op_hi = hi[R_OP];
    a->call_lo = (uint64_t)lo[R_CALL];
    a->call_hi = (uint64_t)hi[R_CALL];
    memcpy(a->lo, lo + R_F, sizeof a->lo);
    memcpy(a->hi, hi + R_F, sizeof a->hi);
    a->nbad = nbad;
    a->bad_lo = bad_lo;
    a->late_rank = late_rank;
    a->latest_post = latest_post;
    a->min_span = min_span;
    *earliest_p = earliest;
}

/* A small world's round: this rank's record to every peer, theirs received, the outputs
 * computed locally (top of the file). Record p (and its payload) lives at buf + p * P2P_WORDS. */
static inline __attribute__((always_inline)) sp_status_t
agree_p2p(MPI_Comm comm, sp_agree_t *a, int rank, int size, int64_t deadline, double limit,
          int64_t *buf, const char *what, bool *abandoned_p) {
    int64_t *mine = buf + (size_t)rank * P2P_WORDS;
    mine[R_OP] = a->op;
    mine[R_CALL] = (int64_t)a->callno;
    memcpy(mine + R_F, a->f, sizeof a->f);
    mine[R_OK] = a->ok;
    mine[R_DEADLINE] = deadline;
    mine[R_POST] = a->post;
    int words = R_COUNT;
    if (a->payload_bytes) {
        words += (int)((a->payload_bytes + 7) / 8);
        mine[words - 1] = 0; /* the padding of the last word: no uninitialized bytes sent */
        memcpy(mine + R_COUNT, a->payload, a->payload_bytes);
    }
    __atomic_fetch_add(&s_rounds, 1, __ATOMIC_RELAXED);
    MPI_Request reqs[MAX_REQS];
    int n = 0;
    for (int p = 0; p < size; p++) {
        if (p == rank)
            continue;
        reqs[n] = reqs[n + 1] = MPI_REQUEST_NULL; /* a failed post leaves its request undefined */
        int rc = MPI_Irecv(buf + (size_t)p * P2P_WORDS, P2P_WORDS, MPI_INT64_T, p, P2P_TAG, comm,
                           &reqs[n]);
        if (rc != MPI_SUCCESS)
            reqs[n] = MPI_REQUEST_NULL;
        else if ((rc = MPI_Isend(mine, words, MPI_INT64_T, p, P2P_TAG, comm, &reqs[n + 1])) !=
                 MPI_SUCCESS)
            reqs[n + 1] = MPI_REQUEST_NULL;
        if (rc != MPI_SUCCESS) {
            /* The requests already posted may be live: they keep the buffer. */
            give_up_buf();
            bury(reqs, n + 2, comm, buf);
            *abandoned_p = true;
            char wbuf[160];
            return sp__world_mpi_status(rc, WHAT(a, what));
        }
        n += 2;
    }
    SP_CHECK(wait_round(n, reqs, comm, buf, deadline, limit, true, a, what, abandoned_p));
    int64_t earliest;
    outputs_p2p(buf, size, a, &earliest);
    /* A rank's payload is read only after the round (the caller uses it only once every rank's
     * checks passed and the fields, so the lengths, agree). */
    if (a->gathered && a->payload_bytes)
        for (int p = 0; p < size; p++)
            memcpy((char *)a->gathered + (size_t)p * SP_AGREE_PAYLOAD_MAX,
                   buf + (size_t)p * P2P_WORDS + R_COUNT, a->payload_bytes);
    a->payload_gathered = a->gathered != NULL && a->payload_bytes;
    return check_late(a, earliest, what);
}

bool sp__agree_carries_payload(MPI_Comm comm) {
    int size = 1;
    MPI_Comm_size(comm, &size);
    return size <= P2P_MAX_RANKS;
}

sp_status_t sp__agree(MPI_Comm comm, sp_agree_t *a, const char *what, bool *abandoned_p) {
    int rank = 0, size = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    return sp__agree_ranked(comm, rank, size, a, what, abandoned_p);
}

/* One round in buf (the thread's buffer or a spare); the inputs and outputs as sp__agree_ranked. */
static inline __attribute__((always_inline)) sp_status_t agree_in(MPI_Comm comm, int rank, int size,
                                                                  sp_agree_t *a, const char *what,
                                                                  int64_t *buf, int64_t deadline,
                                                                  double limit, bool *abandoned_p) {
    char wbuf[160];
    /* The entry time the late rule compares is taken now, with the buffer in hand and the
     * record about to go, also without a deadline of ours (a peer's may be near): stamped
     * before the buffer, a rank that waited for a spare until past a peer's deadline sent a
     * time that said it was early, and went on where that peer had given up. */
    a->post = realtime_ns();
    if (size <= P2P_MAX_RANKS)
        return agree_p2p(comm, a, rank, size, deadline, limit, buf, what, abandoned_p);
    pack_short(a, rank, deadline, buf);
    __atomic_fetch_add(&s_rounds, 1, __ATOMIC_RELAXED);
    MPI_Request req;
    int rc = MPI_Iallreduce(buf, buf + W_COUNT, S_COUNT, MPI_INT64_T, MPI_MAX, comm, &req);
    if (rc != MPI_SUCCESS)
        return sp__world_mpi_status(rc, WHAT(a, what));
    SP_CHECK(wait_round(1, &req, comm, buf, deadline, limit, true, a, what, abandoned_p));
    int64_t earliest = INT64_MAX;
    unpack_short(buf + W_COUNT, a, &earliest);
    bool any_bad = buf[W_COUNT + S_ANY_BAD] != 0;
    SP_CHECK(check_late(a, earliest, what));
    if (SP_LIKELY(!any_bad))
        return SP_SUCCESS;

    /* Some rank's checks failed: the full round names them (same inputs, same deadline). */
    MPI_Op op = agree_op();
    if (op == MPI_OP_NULL)
        return sp__error(SP_ERR_SYSTEM, SP_SUB_BOOT, "%s: MPI_Op_create for the agreement failed",
                         WHAT(a, what));
    pack(a, rank, deadline, buf);
    __atomic_fetch_add(&s_rounds, 1, __ATOMIC_RELAXED);
    rc = MPI_Iallreduce(buf, buf + W_COUNT, W_COUNT, MPI_INT64_T, op, comm, &req);
    if (rc != MPI_SUCCESS)
        return sp__world_mpi_status(rc, WHAT(a, what));
    SP_CHECK(wait_round(1, &req, comm, buf, deadline, limit, true, a, what, abandoned_p));
    unpack(buf + W_COUNT, a);
    return SP_SUCCESS;
}

/* A round of a thread with no buffer yet: it makes one, or takes a spare (given back after the
 * round unless the round was abandoned: then the grave gives it back). */
static __attribute__((noinline)) sp_status_t agree_new_buf(MPI_Comm comm, int rank, int size,
                                                           sp_agree_t *a, const char *what,
                                                           int64_t deadline, double limit,
                                                           bool *abandoned_p) {
    bool spare = false;
    int64_t *buf = round_buf(deadline, &spare);
    if (!buf) {
        /* No heap memory, and every spare held by other threads' rounds until this deadline:
         * nothing was sent, so the peers time out, which is what a missing rank looks like. */
        char wbuf[160];
        return sp__error(SP_ERR_SYSTEM, SP_SUB_BOOT,
                         "%s: out of host memory for the agreement round, and its %d spare "
                         "buffers stayed in use by other threads' rounds until the deadline",
                         WHAT(a, what), SPARES);
    }
    sp_status_t s = agree_in(comm, rank, size, a, what, buf, deadline, limit, abandoned_p);
    if (spare && !*abandoned_p) /* else the graveyard gives it back when the grave is dropped */
        spare_put(buf);
    return s;
}

sp_status_t sp__agree_ranked(MPI_Comm comm, int rank, int size, sp_agree_t *a, const char *what,
                             bool *abandoned_p) {
    *abandoned_p = false;
    a->payload_gathered = false;
    a->late = false;
    double limit = sp__agree_timeout_s();
    int64_t deadline = deadline_ns(limit);
    int64_t *buf = t_buf;
    if (SP_LIKELY(buf != NULL)) /* every round but a thread's first, or its first after a timeout */
        return agree_in(comm, rank, size, a, what, buf, deadline, limit, abandoned_p);
    return agree_new_buf(comm, rank, size, a, what, deadline, limit, abandoned_p);
}

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

sp_status_t sp__agree_dup(MPI_Comm comm, MPI_Comm *out, const char *what, bool *abandoned_p) {
    *abandoned_p = false;
    *out = MPI_COMM_NULL;
    double limit = sp__agree_timeout_s();
    int64_t deadline = deadline_ns(limit);
    dup_cell_t *cell = t_test_no_host ? NULL : calloc(1, sizeof *cell);
    bool spared = cell == NULL;
    if (spared) { /* a rank short of memory still duplicates, in a spare cell */
        spare_t *spare = spare_take(deadline);
        if (!spare) /* nothing posted: the peers time out, as for a missing rank */
            return sp__error(SP_ERR_SYSTEM, SP_SUB_BOOT,
                             "%s: out of host memory, and every spare cell stayed in use by "
                             "other threads' rounds until the deadline",
                             what);
        cell = &spare->cell;
    }
    cell->comm = MPI_COMM_NULL;
    __atomic_fetch_add(&s_rounds, 1, __ATOMIC_RELAXED);
    MPI_Request req;
    int rc = MPI_Comm_idup(comm, &cell->comm, &req);
    if (rc != MPI_SUCCESS) {
        spared ? spare_put(cell) : free(cell);
        return sp__world_mpi_status(rc, what);
    }
    SP_CHECK(
        wait_round(1, &req, comm, cell->words, deadline, limit, false, NULL, what, abandoned_p));
    *out = cell->comm;
    spared ? spare_put(cell) : free(cell);
    return SP_SUCCESS;
}

sp_status_t sp__agree_band_buf(MPI_Comm comm, uint64_t *buf, size_t words, const char *what,
                               bool *abandoned_p) {
    *abandoned_p = false;
    if (words > (size_t)INT_MAX / 2)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_BOOT, "%s: %zu words is too many", what,
                         words);
    double limit = sp__agree_timeout_s();
    int64_t deadline = deadline_ns(limit);
    __atomic_fetch_add(&s_rounds, 1, __ATOMIC_RELAXED);
    MPI_Request req;
    int rc = MPI_Iallreduce(buf, buf + words, (int)words, MPI_UINT64_T, MPI_BAND, comm, &req);
    if (rc != MPI_SUCCESS)
        return sp__world_mpi_status(rc, what);
    return wait_round(1, &req, comm, (int64_t *)buf, deadline, limit, false, NULL, what,
                      abandoned_p);
}

sp_status_t sp__agree_gather_buf(MPI_Comm comm, char *buf, size_t bytes, const char *what,
                                 bool *abandoned_p) {
    *abandoned_p = false;
    if (bytes > (size_t)INT_MAX)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_BOOT, "%s: %zu bytes is too many", what,
                         bytes);
    double limit = sp__agree_timeout_s();
    int64_t deadline = deadline_ns(limit);
    __atomic_fetch_add(&s_rounds, 1, __ATOMIC_RELAXED);
    MPI_Request req;
    int rc =
        MPI_Iallgather(buf, (int)bytes, MPI_CHAR, buf + bytes, (int)bytes, MPI_CHAR, comm, &req);
    if (rc != MPI_SUCCESS)
        return sp__world_mpi_status(rc, what);
    /* A peer that never posts its part (it failed the round before, late at its deadline) is a
     * timeout here, never a wait for good: buf then stays with the request in the graveyard. */
    return wait_round(1, &req, comm, (int64_t *)(void *)buf, deadline, limit, false, NULL, what,
                      abandoned_p);
}
