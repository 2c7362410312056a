/*
 * symmetric.c: symmetric MemPools and their agreement protocol (DESIGN.md, "Symmetric MemPools").
 * Owns sp_symmetric_mempool_create, sp_symmetric_malloc and the allocator callbacks through
 * which the pool grows (the registrar makes the segment); the deadline-bounded rounds it runs
 * are sym_round.c's.
 *
 * The protocol, per sp_symmetric_malloc (all ranks take the same path, because every decision
 * is made from the same allreduced vector):
 *   round 1: ONE MPI_Iallreduce(MIN) over (size, call number, candidate found, candidate segment
 *            sequence number, candidate offset), each sent as the pair (x, -x) so the one MIN
 *            yields the minimum and the maximum of every field;
 *            sizes or call numbers differ -> SP_ERR_MISMATCH everywhere, nothing allocated, call
 *            numbers resynchronized to the largest so the pool stays usable;
 *            every rank has the same candidate -> take it (the common case: one allreduce).
 *   round 2: candidates differ or none -> each rank completes its pending frees, agree again.
 *   grow:    still different -> every rank grows one segment together, owned end to end here
 *            and with no pool or device lock held while ranks wait for each other: the ranks
 *            agree that every rank has room (pool/'s plan: limit, memory fraction), the
 *            registrar allocates and registers collectively, then ONE locked pool call adopts
 *            the segment and hands out its block at offset 0, and a last round confirms the
 *            outcome so no rank is left with a block the others lack. The size is checked and
 *            rounded once per call (sp__pool_sym_size); the growth uses that rounded size.
 * Everything is ordered by (segment sequence number, offset), never by address.
 *
 * Every round is world/agree.c's one message shape (operation, call number on the pool, "my
 * checks passed", fields), bounded by SYMPOOL_SYM_TIMEOUT; a rank in another call on the same
 * pool (empty cache, destroy) is reported as SP_ERR_MISMATCH naming both calls. On a timeout
 * the pool is marked broken: later collective calls on it return SP_ERR_INVALID_USAGE with the
 * saved reason, its live blocks stay valid and can be freed, and its segments are released at
 * sp_world_finalize. A rank that arrives after its peers gave up sees the round complete late
 * and breaks its pool too.
 *
 * Locking: the state's lock serializes this rank's calls on this pool and is held for a whole
 * call, across its rounds; it is the pool's own, so other pools, and every sp_malloc/sp_free
 * (the device lock, taken only inside pool/'s short calls), go on meanwhile; see sym_state.h.
 */
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "pool/pool.h"
#include "symmetric/sym_state.h"

/* The name of the operation for messages. `what` NULL means "this pool's current
 * sp_symmetric_malloc call": formatting that on every call would cost more than a cache hit's
 * bookkeeping, so it is done only when a message needs it. */
static const char *describe(const sp_sym_state_t *st, const char *what, char *buf, size_t n) {
    if (what)
        return what;
    snprintf(buf, n, "sp_symmetric_malloc call #%llu on pool \"%s\"",
             (unsigned long long)st->callno, st->name);
    return buf;
}

/* sp_agree_t's describe: the current sp_symmetric_malloc call, named only on an error path. */
static const char *describe_malloc(const void *ctx, char *buf, size_t n) {
    return describe(ctx, NULL, buf, n);
}

/* ---- create ------------------------------------------------------------------------------ */

static void free_new_state(sp_sym_state_t *st, sp_mempool_t *pool) {
    if (pool)
        sp__mempool_destroy_internal(pool);
    pthread_mutex_destroy(&st->lock);
    pthread_mutex_destroy(&st->recs_lock);
    free(st);
}

static _Atomic double s_test_pause_comms_s; /* sp__sym_test_pause_before_comms */

void sp__sym_test_pause_before_comms(double seconds) {
    s_test_pause_comms_s = seconds;
}

/* A timeout (or MPI failure) while the pool's communicator was being made: the world's
 * communicator may carry an abandoned duplicate, or this rank's peers may have abandoned theirs,
 * so its collectives are out of step for good. The world is broken (sp__world_break) and the
 * error says so. */
static sp_status_t comms_failed(sp_world_t *w, sp_status_t s, const char *what) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", sp_last_error());
    char why[320];
    snprintf(why, sizeof why,
             "%s did not complete on every rank in time: check that every rank makes the same "
             "sp_symmetric_mempool_create calls and none is stopped or gone",
             what);
    sp__world_break(w, why);
    return sp__error(s, SP_SUB_SYM,
                     "%s; the world is broken: every later collective call on it fails, "
                     "finalize it",
                     msg);
}

/* The pool's own communicators (collective over the world; every rank has agreed to create):
 * a duplicate of the world's communicator bounded by the deadline (a rank that never comes is a
 * timeout on the others, not a hang), then one round on it whose late rule makes a duplicate
 * completed after a rank's deadline a timeout on every rank that has it, before the node split
 * below blocks with no deadline. `what` names the create call. */
static sp_status_t make_comms(sp_world_t *w, sp_sym_state_t *st, const char *create_what) {
    double pause = s_test_pause_comms_s;
    if (pause > 0) {
        struct timespec ts = {(time_t)pause, (long)((pause - (double)(time_t)pause) * 1e9)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    char what[160];
    snprintf(what, sizeof what, "%s: duplicating the world's communicator for the pool",
             create_what);
    bool abandoned = false;
    sp_status_t s = sp__agree_dup(sp__world_comm(w), &st->comm, what, &abandoned);
    if (s != SP_SUCCESS)
        return abandoned ? comms_failed(w, s, what) : s;
    MPI_Comm_set_errhandler(st->comm, MPI_ERRORS_RETURN);
    sp_agree_t a = {.op = SP_AGREE_POOL_COMMS, .ok = true};
    s = sp__agree_ranked(st->comm, st->rank, sp__world_size(w), &a, what, &abandoned);
    if (s == SP_SUCCESS)
        s = sp__agree_check(&a, what);
    if (s != SP_SUCCESS) {
        s = comms_failed(w, s, what);
        if (!sp__agree_pending(st->comm)) /* else MPI may still progress a round on it */
            MPI_Comm_free(&st->comm);
        return s;
    }
    s = sp__world_mpi_status(MPI_Comm_split_type(st->comm, MPI_COMM_TYPE_SHARED, st->rank,
                                                 MPI_INFO_NULL, &st->node_comm),
                             "MPI_Comm_split_type for a symmetric pool");
    if (s != SP_SUCCESS) {
        MPI_Comm_free(&st->comm);
        return s;
    }
    MPI_Comm_set_errhandler(st->node_comm, MPI_ERRORS_RETURN);
    return SP_SUCCESS;
}

/* A pool's name as a round's field (FNV-1a): ranks that create two pools in swapped orders have
 * the same creation numbers and flags, and only the names tell the pools apart. */
static int64_t name_hash(const char *name) {
    uint64_t h = 14695981039346656037ull;
    for (const unsigned char *c = (const unsigned char *)(name ? name : ""); *c; c++)
        h = (h ^ *c) * 1099511628211ull;
    return (int64_t)h;
}

/* The create's one world round: this rank's creation number `serial`, flags and name's hash, `ok`
 * false when its local work failed. The creation numbers stay in step whatever the outcome: a round
 * that failed (a rank in another call, a timeout) counted as a creation on no rank, and after
 * numbers that differ every rank continues from the largest, so one mistake is one error, not an
 * error at every later create. */
static sp_status_t create_round(sp_world_t *w, uint64_t serial, const sp_mempool_params_t *p,
                                bool ok, const char *what, sp_agree_t *a) {
    *a = (sp_agree_t){.op = SP_AGREE_POOL_CREATE,
                      .ok = ok,
                      .f = {(int64_t)serial, p->use_on_oom, p->no_split, name_hash(p->name)}};
    sp_status_t s = sp__world_agree(w, a, what);
    if (s != SP_SUCCESS)
        sp__world_set_pool_serial(w, serial - 1);
    else if (a->lo[0] != a->hi[0])
        sp__world_set_pool_serial(w, (uint64_t)a->hi[0]);
    return s;
}

/* A rank with no host memory for the pool's state still takes part in the create's round, as a
 * rank that failed: its peers learn it there and fail too, instead of waiting for it until their
 * deadline. */
static sp_status_t create_without_state(sp_world_t *w, const sp_mempool_params_t *p,
                                        const char *fn) {
    uint64_t serial = sp__world_next_pool_serial(w);
    char what[96];
    snprintf(what, sizeof what, "%s #%llu", fn, (unsigned long long)serial);
    SP_WARN(SP_SUB_SYM, "%s: out of host memory for the pool's state", what);
    sp_agree_t a;
    SP_CHECK(create_round(w, serial, p, false, what, &a));
    return sp__error(SP_ERR_SYSTEM, SP_SUB_SYM,
                     "%s: out of host memory for the pool's state; no rank has the pool", what);
}

SP_EXPORT sp_status_t sp_symmetric_mempool_create(sp_world_t *w, const sp_mempool_params_t *params,
                                                  sp_mempool_t **pool_p) {
    static const char fn[] = "sp_symmetric_mempool_create";
    SP_CHECK(sp__world_check(w, fn));
    sp_mempool_params_t p;
    sp_mempool_params_init(&p);
    if (params)
        p = *params;
    sp_sym_state_t *st = sp__sym_test_no_host ? NULL : calloc(1, sizeof *st);
    if (!st)
        return create_without_state(w, &p, fn);
    pthread_mutex_init(&st->lock, NULL);
    pthread_mutex_init(&st->recs_lock, NULL);
    st->world = w;
    st->comm = st->node_comm = MPI_COMM_NULL;
    st->device = sp_world_device(w);
    st->rank = sp_world_rank(w);
    st->serial = sp__world_next_pool_serial(w);
    snprintf(st->name, sizeof st->name, "%s", p.name ? p.name : "");

    /* Local work first (argument checks, registrar choice, the MemPool itself), then ONE
     * agreement that also checks every rank is in the same create call with the same flags; a
     * bad argument or failure on any rank undoes the local work everywhere. */
    sp_status_t ls = SP_SUCCESS;
    if (!pool_p)
        ls = sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_SYM, "%s: pool_p is NULL", fn);
    else if (p.allocator)
        ls = sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_SYM,
                       "%s: params->allocator must be NULL (a symmetric pool's segments come "
                       "from its registrar)",
                       fn);
    else if (p.use_on_oom)
        /* A loan to another thread's sp_malloc that hit OOM can land between a symmetric
         * malloc's agreement and its take, on one rank only: the ranks' caches diverge. */
        ls = sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_SYM,
                       "%s: params->use_on_oom must be false (a symmetric pool's blocks are "
                       "never lent: a loan on one rank would make the ranks' caches differ)",
                       fn);
    if (ls == SP_SUCCESS)
        ls = sp__registrar_select(w, &st->reg);
    sp_mempool_t *pool = NULL;
    if (ls == SP_SUCCESS) {
        sp_allocator_t cb = {.alloc = sp__sym_seg_alloc, .free = sp__sym_seg_free, .ctx = st};
        p.allocator = &cb;
        p.device = st->device;
        ls = sp__mempool_create_symmetric(&p, st, &pool);
    }
    char what[96], why[200];
    snprintf(what, sizeof what, "%s #%llu", fn, (unsigned long long)st->serial);
    snprintf(why, sizeof why, "%s", ls == SP_SUCCESS ? "" : sp_last_error());
    sp_agree_t a;
    sp_status_t s = create_round(w, st->serial, &p, ls == SP_SUCCESS, what, &a);
    if (s == SP_SUCCESS && a.lo[0] != a.hi[0])
        s = sp__error(SP_ERR_MISMATCH, SP_SUB_SYM,
                      "%s: ranks are at different symmetric pool creations (#%lld..#%lld): "
                      "every rank must create the same pools in the same order",
                      what, (long long)a.lo[0], (long long)a.hi[0]);
    /* A rank that could not create the pool (its own arguments, its local work) joins with what
     * it had, perhaps no name and default flags: its peers are told that it failed, not that
     * the flags or names differ. */
    else if (s == SP_SUCCESS && a.nbad) {
        char ranks[96];
        s = ls != SP_SUCCESS ? sp__error(ls, SP_SUB_SYM, "%s", why)
                             : sp__error(SP_ERR_INVALID_USAGE, SP_SUB_SYM,
                                         "%s: %s could not create the pool (its log "
                                         "says why); no rank has it",
                                         what, sp__agree_bad_ranks(&a, ranks, sizeof ranks));
    } else if (s == SP_SUCCESS && (a.lo[1] != a.hi[1] || a.lo[2] != a.hi[2]))
        s = sp__error(SP_ERR_MISMATCH, SP_SUB_SYM,
                      "%s: ranks pass different use_on_oom/no_split flags", what);
    else if (s == SP_SUCCESS && a.lo[3] != a.hi[3])
        /* Before, two pools created in swapped orders were both made, and each one's first
         * malloc waited on the other pool's ranks until the timeout broke both. */
        s = sp__error(SP_ERR_MISMATCH, SP_SUB_SYM,
                      "%s: ranks create pools of different names (this rank's \"%s\"): every "
                      "rank must create the same pools, named alike, in the same order",
                      what, st->name);
    if (s == SP_SUCCESS)
        s = make_comms(w, st, what);
    if (s != SP_SUCCESS) {
        free_new_state(st, pool);
        return s;
    }
    st->pool = pool;
    sp__sym_register(st);
    sp__symc_add(st->device, SP_SYMC_POOLS, 1);
    SP_INFO(SP_SUB_SYM, "symmetric pool #%llu \"%s\" on device %d, registrar %s",
            (unsigned long long)st->serial, st->name, st->device, st->reg->name);
    *pool_p = pool;
    return SP_SUCCESS;
}

/* ---- the allocator callbacks -------------------------------------------------------------- */

/* pool/ never grows a symmetric pool itself (symmetric/ owns growth: plan, registrar, adopt);
 * this callback only answers a request that would bypass that. */
void *sp__sym_seg_alloc(size_t size, int device, void *stream, void *ctx) {
    (void)device;
    (void)stream;
    sp_sym_state_t *st = ctx;
    SP_INFO(SP_SUB_SYM,
            "symmetric pool \"%s\": a %zu-byte segment outside a collective growth "
            "was refused",
            st->name, size);
    return NULL;
}

/* pool/ lets go of a segment on its own only when the pool is destroyed with segments still in
 * it, or at sp_shutdown: releasing the registration now would enter a collective alone, so it
 * is kept (orphaned) until the next collective release of the pool or sp_world_finalize. */
void sp__sym_seg_free(void *ptr, size_t size, int device, void *stream, void *ctx) {
    (void)size;
    (void)device;
    (void)stream;
    sp_sym_state_t *st = ctx;
    sp__sym_enter(); /* a live state's memory stays until sp__sym_leave (sp__sym_retire) */
    if (!sp__sym_is_live(st)) {
        sp__sym_leave();
        return; /* the world was finalized: the registrar already released it */
    }
    pthread_mutex_lock(&st->recs_lock);
    for (sp_sym_rec_t *rec = st->recs; rec; rec = rec->next)
        if (rec->seg.base == ptr) {
            rec->orphan = true;
            SP_INFO(SP_SUB_SYM,
                    "symmetric pool \"%s\": segment %p released locally; its registration is "
                    "dropped at the next collective release",
                    st->name, ptr);
        }
    pthread_mutex_unlock(&st->recs_lock);
    sp__sym_leave();
}

/* ---- malloc ------------------------------------------------------------------------------ */

enum { F_SIZE, F_FOUND, F_SEG, F_OFF };

/* A size as an agreement field and back. The fields are int64 (min and max over ranks), and a
 * size past INT64_MAX clamped to it made a mismatch name a size no rank asked for (SIZE_MAX as
 * 9223372036854775807). Shifted by 2^63 instead, every size_t has a field of its own in the same
 * order, so the smallest and largest fields are the smallest and largest sizes. */
_Static_assert(sizeof(size_t) <= sizeof(uint64_t), "a size fits an agreement field");
#define SIZE_SHIFT ((uint64_t)1 << 63)

static int64_t size_field(size_t size) {
    uint64_t u = (uint64_t)size;
    return u >= SIZE_SHIFT ? (int64_t)(u - SIZE_SHIFT) : (int64_t)u - INT64_MAX - 1;
}

static uint64_t field_size(int64_t f) {
    return f >= 0 ? (uint64_t)f + SIZE_SHIFT : (uint64_t)(f + INT64_MAX + 1);
}

/* One agreement round on (size, candidate); ok false carries this rank's bad argument. */
static sp_status_t round_(sp_sym_state_t *st, size_t size, size_t rounded, sp_stream_t stream,
                          bool ok, const char *what, sp_agree_t *a) {
    bool found = false;
    uint64_t seg = 0;
    size_t off = 0;
    if (ok && rounded > 0)
        (void)sp__pool_sym_find(st->pool, rounded, stream, &found, &seg, &off);
    *a = (sp_agree_t){
        .op = SP_AGREE_SYM_MALLOC,
        .ok = ok,
        .f = {size_field(size), found, found ? (int64_t)seg : -1, found ? (int64_t)off : -1},
        .describe = describe_malloc,
        .describe_ctx = st};
    sp__symc_add(st->device, SP_SYMC_ROUNDS, 1);
    return sp__sym_round(st, a, what);
}

static bool same_candidate(const sp_agree_t *a) {
    return a->lo[F_FOUND] == 1 && a->lo[F_SEG] == a->hi[F_SEG] && a->lo[F_OFF] == a->hi[F_OFF];
}

static sp_status_t take(sp_sym_state_t *st, size_t rounded, size_t size, sp_stream_t stream,
                        const sp_agree_t *a, void **ptr_p) {
    sp_status_t s = sp__pool_sym_take(st->pool, rounded, size, stream, (uint64_t)a->lo[F_SEG],
                                      (size_t)a->lo[F_OFF], ptr_p);
    char what[128];
    if (s != SP_SUCCESS)
        return sp__error(SP_ERR_INTERNAL, SP_SUB_SYM,
                         "%s: the agreed block (segment %lld, offset %lld) could not be taken "
                         "here (%s); was the pool used from another thread meanwhile?",
                         describe(st, NULL, what, sizeof what), (long long)a->lo[F_SEG],
                         (long long)a->lo[F_OFF], sp_status_name(s));
    return SP_SUCCESS;
}

static void append_rec(sp_sym_state_t *st, sp_sym_rec_t *rec) {
    pthread_mutex_lock(&st->recs_lock); /* a query may be walking the list */
    sp_sym_rec_t **tail = &st->recs;
    while (*tail)
        tail = &(*tail)->next;
    *tail = rec;
    pthread_mutex_unlock(&st->recs_lock);
    sp__symc_add(st->device, SP_SYMC_REGISTRATIONS, 1);
}

/* Undo a growth some rank could not adopt: give the block back, take the segment out of the
 * pool where it went in, and release the registration on every rank (the registrar's release
 * is collective; every rank reaches here from the same agreed outcome). */
static void undo_growth(sp_sym_state_t *st, sp_sym_rec_t *rec, void *p, uint64_t seq,
                        sp_stream_t stream) {
    if (p) {
        void *base;
        size_t size;
        (void)sp_free(p);
        (void)sp__pool_sym_detach(st->pool, seq, &base, &size, &stream);
    }
    (void)st->reg->release(st, &rec->seg, stream);
    free(rec);
}

/* A test hook (sym_state.h): seconds this thread sleeps before a growth's first round. */
_Thread_local double sp__sym_test_grow_delay_s;
void sp__sym_test_set_grow_delay(double seconds) {
    sp__sym_test_grow_delay_s = seconds;
}

/* Every rank grows one segment together. The ranks agree that every rank has room (no pool lock
 * held: a thread's sp_malloc on this device goes on meanwhile), the registrar allocates and
 * registers collectively (no pool lock held), then one locked pool call adopts the segment and
 * hands out its block, and a last round confirms it everywhere. */
static sp_status_t grow(sp_sym_state_t *st, size_t rounded, size_t size, sp_stream_t stream,
                        const char *what, void **ptr_p) {
    size_t alloc_size = 0;
    if (sp__sym_test_grow_delay_s > 0) /* tests: this rank is late inside a growth */
        nanosleep(&(struct timespec){(time_t)sp__sym_test_grow_delay_s,
                                     (long)((sp__sym_test_grow_delay_s -
                                             (double)(time_t)sp__sym_test_grow_delay_s) *
                                            1e9)},
                  NULL);
    sp_status_t ps = sp__pool_sym_plan(st->pool, rounded, stream, &alloc_size);
    sp_sym_rec_t *rec = ps == SP_SUCCESS ? calloc(1, sizeof *rec) : NULL;
    if (ps == SP_SUCCESS && !rec)
        ps = sp__error(SP_ERR_SYSTEM, SP_SUB_SYM, "%s: out of host memory", what);
    char why[200], ranks[96];
    snprintf(why, sizeof why, "%s", ps == SP_SUCCESS ? "" : sp_last_error());
    sp_agree_t a = {.op = SP_AGREE_SYM_GROW, .ok = ps == SP_SUCCESS, .f = {(int64_t)alloc_size}};
    sp_status_t s = sp__sym_round(st, &a, what);
    if (s == SP_SUCCESS && a.nbad && ps == SP_ERR_NOT_SUPPORTED)
        s = sp__error(ps, SP_SUB_SYM, "%s: %s", what, why); /* e.g. a capturing stream */
    else if (s == SP_SUCCESS && a.nbad)
        s = sp__error(SP_ERR_OUT_OF_MEMORY, SP_SUB_SYM,
                      "%s: cannot grow symmetric pool \"%s\" by a segment for %zu bytes: it "
                      "cannot grow on %s, so no rank grows it%s%s",
                      what, st->name, size, sp__agree_bad_ranks(&a, ranks, sizeof ranks),
                      ps == SP_SUCCESS ? "" : "; here: ", why);
    else if (s == SP_SUCCESS && a.lo[0] != a.hi[0])
        s = sp__error(SP_ERR_MISMATCH, SP_SUB_SYM,
                      "%s: ranks want segments of different sizes (%lld..%lld bytes): their "
                      "allocator settings differ (SYMPOOL_ALLOC_CONF, SYMPOOL_LARGE_SEGMENT_SIZE, "
                      "...); give every rank the same ones",
                      what, (long long)a.lo[0], (long long)a.hi[0]);
    /* From here every rank takes the same branch: the registrar's collectives follow. */
    if (s == SP_SUCCESS)
        s = st->reg->alloc(st, alloc_size, &rec->seg);
    if (s != SP_SUCCESS) {
        free(rec);
        return s;
    }
    void *p = NULL;
    uint64_t seq = 0;
    sp_status_t as =
        sp__pool_sym_adopt(st->pool, rec->seg.base, alloc_size, rounded, size, stream, &p, &seq);
    snprintf(why, sizeof why, "%s", as == SP_SUCCESS ? "" : sp_last_error());
    a = (sp_agree_t){.op = SP_AGREE_SYM_GROW, .ok = as == SP_SUCCESS};
    s = sp__sym_round(st, &a, what);
    if (s == SP_SUCCESS && !a.nbad) {
        rec->seq = seq;
        append_rec(st, rec);
        sp__symc_add(st->device, SP_SYMC_GROWTHS, 1);
        SP_INFO(SP_SUB_SYM, "%s: every rank grew a registered segment (%s registrar) of %zu bytes",
                what, st->reg->name, alloc_size);
        *ptr_p = p;
        return SP_SUCCESS;
    }
    if (s != SP_SUCCESS) {
        /* The outcome is unknown (the pool is broken now): keep what this rank made, so its
         * block stays valid and sp_world_finalize releases the registration. */
        rec->seq = seq;
        append_rec(st, rec);
        if (as == SP_SUCCESS)
            (void)sp_free(p);
        return s;
    }
    undo_growth(st, rec, as == SP_SUCCESS ? p : NULL, seq, stream);
    return sp__error(SP_ERR_SYSTEM, SP_SUB_SYM,
                     "%s: the new segment could not be adopted on %s (host memory), so no rank "
                     "keeps it%s%s",
                     what, sp__agree_bad_ranks(&a, ranks, sizeof ranks),
                     as == SP_SUCCESS ? "" : "; here: ", why);
}

/* This rank's own argument checks (the one size check and rounding of the call included), made
 * before the first round so a bad argument on one rank is an error on every rank
 * (SP_ERR_INVALID_ARGUMENT) instead of a rank missing from it. *stream_p: the caller's stream,
 * CUDA's pseudo handles mapped as sp_malloc maps them (the legacy stream's blocks are the default
 * stream's; cudaStreamPerThread, a different stream on every thread, cannot key them). */
static bool check_args(sp_sym_state_t *st, size_t size, sp_stream_t *stream_p, void **ptr_p,
                       size_t *rounded_p, char *why, size_t len) {
    sp_status_t s = SP_SUCCESS;
    char what[128];
    if (!ptr_p)
        s = sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_SYM, "%s: ptr_p is NULL",
                      describe(st, NULL, what, sizeof what));
    else if ((s = sp__pool_sym_size(st->pool, size, rounded_p)) != SP_SUCCESS) {
        /* pool/'s text names the pool only: the message says which call it refused too. */
        char m[1024]; /* a whole message (SP_LAST_ERROR_MAX): the pool name may be long */
        snprintf(m, sizeof m, "%s", sp_last_error());
        s = sp__error_quiet(s, SP_SUB_SYM, "%s: %s", describe(st, NULL, what, sizeof what), m);
    }
    if (s == SP_SUCCESS && size > 0 && *stream_p) {
        describe(st, NULL, what, sizeof what);
        s = sp__alloc_map_stream(what, stream_p);
        if (s == SP_SUCCESS && *stream_p)
            s = sp__pool_check_stream(st->pool, *stream_p, what);
    }
    if (s == SP_SUCCESS)
        return true;
    snprintf(why, len, "%s", sp_last_error());
    return false;
}

SP_EXPORT sp_status_t sp_symmetric_malloc(sp_mempool_t *pool, size_t size, sp_stream_t stream,
                                          void **ptr_p) {
    sp_sym_state_t *st;
    SP_CHECK(sp__sym_acquire(pool, "sp_symmetric_malloc", &st));
    ++st->callno;
    /* The call's name is formatted only when a message or a growth needs it (WHAT). */
    char what[128], why[256], ranks[96];
    what[0] = '\0'; /* not the whole array: a cache hit never formats it */
#define WHAT (what[0] ? what : describe(st, NULL, what, sizeof what))
    size_t rounded = 0;
    bool ok = check_args(st, size, &stream, ptr_p, &rounded, why, sizeof why);
    sp_agree_t a;
    void *p = NULL;
    sp_status_t s;
    SP_CHECK_GOTO(round_(st, size, rounded, stream, ok, NULL, &a), s, out);
    if (a.lo[F_SIZE] != a.hi[F_SIZE]) {
        s = sp__error(SP_ERR_MISMATCH, SP_SUB_SYM,
                      "%s: ranks disagree: sizes from %llu to %llu bytes. Every rank must make "
                      "the same sp_symmetric_malloc calls in the same order; nothing was "
                      "allocated",
                      WHAT, (unsigned long long)field_size(a.lo[F_SIZE]),
                      (unsigned long long)field_size(a.hi[F_SIZE]));
        goto out;
    }
    if (a.nbad) {
        s = !ok ? sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_SYM, "%s (no rank allocated)", why)
                : sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_SYM,
                            "%s: %s rejected its arguments (its log says why); no rank "
                            "allocated",
                            WHAT, sp__agree_bad_ranks(&a, ranks, sizeof ranks));
        goto out;
    }
    if (size == 0) {
        s = SP_SUCCESS; /* p stays NULL, as sp_malloc(0) */
        goto out;
    }
    if (same_candidate(&a)) {
        s = take(st, rounded, size, stream, &a, &p);
        goto out;
    }
    /* The caches differ (events completed at different times, a block lent on OOM): complete
     * this rank's pending frees and look again before paying for a growth. */
    if (sp__pool_sync_pending(pool) != SP_SUCCESS)
        SP_INFO(SP_SUB_SYM, "%s: completing pending frees failed: %s", WHAT, sp_last_error());
    SP_CHECK_GOTO(round_(st, size, rounded, stream, true, NULL, &a), s, out);
    if (same_candidate(&a))
        s = take(st, rounded, size, stream, &a, &p);
    else
        s = grow(st, rounded, size, stream, WHAT, &p);
out:
    if (s == SP_SUCCESS) {
        sp__symc_add(st->device, SP_SYMC_MALLOCS, 1);
        *ptr_p = p;
    }
    sp__sym_release_state(st);
    return s;
#undef WHAT
}
