/*
 * symmetric.c: symmetric MemPools and their agreement protocol (DESIGN.md, "Symmetric MemPools").
 * Owns sp_symmetric_mempool_create, sp_symmetric_malloc, the deadline-bounded agreement rounds
 * and the allocator callbacks through which the pool grows (the registrar makes the segment).
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
 *   grow:    still different -> every rank grows one segment together: inside the allocator
 *            callback the ranks agree that every rank can grow (a rank whose pool refuses before
 *            calling back contributes its "no" to that same allreduce from outside), then the
 *            registrar allocates and registers collectively, then one more allreduce confirms
 *            the outcome so no rank is left with a block the others lack.
 * Everything is ordered by (segment sequence number, offset), never by address.
 *
 * Deadline: every round is an MPI_Iallreduce polled until SYMPOOL_SYM_TIMEOUT; on expiry the
 * call fails with SP_ERR_TIMEOUT naming the call. The pending request cannot be cancelled (MPI
 * forbids cancelling collectives), so the pool is marked broken: its private communicator and
 * buffers are abandoned, later collective calls on it return SP_ERR_INVALID_USAGE, its live
 * blocks stay valid and can be freed, and its segments are released at sp_world_finalize.
 *
 * Locking: the state's lock is held for a whole call; see sym_state.h.
 */
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "pool/pool.h"
#include "symmetric/sym_state.h"

/* ---- the agreement primitive ------------------------------------------------------------- */

static sp_sym_grave_t *s_graves; /* abandoned requests (never freed: MPI may still write) */
static pthread_mutex_t s_grave_lock = PTHREAD_MUTEX_INITIALIZER;

/* The name of the operation for messages. `what` NULL means "this pool's current
 * sp_symmetric_malloc call": formatting that on every call would cost more than a cache hit's
 * bookkeeping, so it is done only when a message needs it. */
static const char *describe(const sp_sym_state_t *st, const char *what, char *buf, size_t n) {
    if (what)
        return what;
    snprintf(buf, n, "sp_symmetric_malloc call #%llu on pool \"%s\"",
             st ? (unsigned long long)st->callno : 0ull, st ? st->name : "");
    return buf;
}

static sp_status_t wait_deadline(sp_sym_state_t *st, MPI_Request *req, void *heap,
                                 const char *what) {
    char wbuf[128];
    double limit = sp__option_double(SP_OPT_SYM_TIMEOUT);
    uint64_t start = sp__now_ns();
    uint64_t deadline = limit > 0 ? start + (uint64_t)(limit * 1e9) : UINT64_MAX;
    for (unsigned spins = 0;; spins++) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return sp__world_mpi_status(rc, describe(st, what, wbuf, sizeof wbuf));
        if (done)
            return SP_SUCCESS;
        if (spins >= 64) {
            if (sp__now_ns() >= deadline)
                break;
            sched_yield(); /* oversubscribed ranks must let the late one run */
        }
    }
    sp_sym_grave_t *g = calloc(1, sizeof *g);
    if (g) {
        g->req = *req;
        g->buf = heap;
        pthread_mutex_lock(&s_grave_lock);
        g->next = s_graves;
        s_graves = g;
        pthread_mutex_unlock(&s_grave_lock);
    }
    sp_status_t s = sp__error(SP_ERR_TIMEOUT, SP_SUB_SYM,
                              "%s: not every rank arrived within %g s (SYMPOOL_SYM_TIMEOUT); a "
                              "rank stopped calling or calls in another order. %s",
                              describe(st, what, wbuf, sizeof wbuf), limit,
                              st ? "The pool is broken: free its blocks, do not "
                                   "make further collective calls on it"
                                 : "");
    if (st) {
        st->broken = true;
        snprintf(st->broken_why, sizeof st->broken_why, "%s", sp_last_error());
    }
    return s;
}

sp_status_t sp__sym_agree(sp_sym_state_t *st, MPI_Comm comm, const void *sbuf, void *rbuf,
                          int count, MPI_Datatype type, MPI_Op op, void *heap, const char *what) {
    MPI_Request req;
    int rc = MPI_Iallreduce(sbuf, rbuf, count, type, op, comm, &req);
    char wbuf[128];
    if (rc != MPI_SUCCESS)
        return sp__world_mpi_status(rc, describe(st, what, wbuf, sizeof wbuf));
    return wait_deadline(st, &req, heap, what);
}

sp_status_t sp__sym_barrier(sp_sym_state_t *st, MPI_Comm comm, const char *what) {
    MPI_Request req;
    int rc = MPI_Ibarrier(comm, &req);
    char wbuf[128];
    if (rc != MPI_SUCCESS)
        return sp__world_mpi_status(rc, describe(st, what, wbuf, sizeof wbuf));
    return wait_deadline(st, &req, NULL, what);
}

/* ---- create ------------------------------------------------------------------------------ */

SP_EXPORT sp_status_t sp_symmetric_mempool_create(sp_world_t *w, const sp_mempool_params_t *params,
                                                  sp_mempool_t **pool_p) {
    SP_ARG_CHECK(w, SP_SUB_SYM, "sp_symmetric_mempool_create: world is NULL");
    SP_ARG_CHECK(pool_p, SP_SUB_SYM, "sp_symmetric_mempool_create: pool_p is NULL");
    sp_mempool_params_t p;
    sp_mempool_params_init(&p);
    if (params)
        p = *params;
    SP_ARG_CHECK(!p.allocator, SP_SUB_SYM,
                 "sp_symmetric_mempool_create: params->allocator must be NULL (a symmetric "
                 "pool's segments come from its registrar)");
    const sp_registrar_ops_t *reg = NULL;
    sp_status_t rs = sp__registrar_select(w, &reg);

    sp_sym_state_t *st = calloc(1, sizeof *st);
    if (!st)
        return sp__error(SP_ERR_SYSTEM, SP_SUB_SYM, "out of host memory for a symmetric pool");
    pthread_mutex_init(&st->lock, NULL);
    st->world = w;
    st->reg = reg;
    st->comm = MPI_COMM_NULL;
    st->device = sp_world_device(w);
    st->rank = sp_world_rank(w);
    st->serial = sp__world_next_pool_serial(w);
    snprintf(st->name, sizeof st->name, "%s", p.name ? p.name : "");

    /* Local work first (registrar choice, the MemPool itself), then ONE agreement that also
     * checks every rank is in the same create call with the same flags; any failure or
     * mismatch undoes the local work everywhere. */
    sp_mempool_t *pool = NULL;
    sp_status_t ls = rs;
    if (ls == SP_SUCCESS) {
        sp_allocator_t cb = {.alloc = sp__sym_seg_alloc, .free = sp__sym_seg_free, .ctx = st};
        p.allocator = &cb;
        p.device = st->device;
        ls = sp__mempool_create_symmetric(&p, st, &pool);
    }
    /* Heap buffers: if the agreement times out, MPI may still write them later. */
    struct {
        int64_t v[8], r[8];
    } *b = calloc(1, sizeof *b);
    if (!b) {
        if (pool)
            sp_mempool_destroy(pool);
        pthread_mutex_destroy(&st->lock);
        free(st);
        return sp__error(SP_ERR_SYSTEM, SP_SUB_SYM, "out of host memory for a symmetric pool");
    }
    int64_t ok = ls == SP_SUCCESS;
    int64_t v[8] = {(int64_t)st->serial, -(int64_t)st->serial, p.use_on_oom, -(int64_t)p.use_on_oom,
                    p.no_split,          -(int64_t)p.no_split, ok,           -ok};
    memcpy(b->v, v, sizeof v);
    int64_t *r = b->r;
    char what[96];
    snprintf(what, sizeof what, "sp_symmetric_mempool_create #%llu",
             (unsigned long long)st->serial);
    sp_status_t s =
        sp__sym_agree(NULL, sp__world_comm(w), b->v, b->r, 8, MPI_INT64_T, MPI_MIN, b, what);
    if (s == SP_ERR_TIMEOUT)
        b = NULL; /* the graveyard owns it now */
    if (s == SP_SUCCESS) {
        if (r[0] != -r[1])
            s = sp__error(SP_ERR_MISMATCH, SP_SUB_SYM,
                          "%s: ranks are at different symmetric pool creations (#%lld..#%lld): "
                          "every rank must create the same pools in the same order",
                          what, (long long)r[0], (long long)-r[1]);
        else if (r[2] != -r[3] || r[4] != -r[5])
            s = sp__error(SP_ERR_MISMATCH, SP_SUB_SYM,
                          "%s: ranks pass different use_on_oom/no_split flags", what);
        else if (ls != SP_SUCCESS)
            s = ls;
        else if (r[6] == 0)
            s = sp__error(SP_ERR_INVALID_USAGE, SP_SUB_SYM,
                          "%s: another rank could not create its pool (see its log)", what);
    }
    if (s == SP_SUCCESS)
        s = sp__world_mpi_status(MPI_Comm_dup(sp__world_comm(w), &st->comm),
                                 "MPI_Comm_dup for a symmetric pool");
    free(b);
    if (s != SP_SUCCESS) {
        if (pool)
            sp_mempool_destroy(pool);
        pthread_mutex_destroy(&st->lock);
        free(st);
        return s;
    }
    MPI_Comm_set_errhandler(st->comm, MPI_ERRORS_RETURN);
    st->pool = pool;
    sp__sym_register(st);
    sp__symc_add(st->device, SP_SYMC_POOLS, 1);
    SP_INFO(SP_SUB_SYM, "symmetric pool #%llu \"%s\" on device %d, registrar %s",
            (unsigned long long)st->serial, st->name, st->device, reg->name);
    *pool_p = pool;
    return SP_SUCCESS;
}

/* ---- the allocator callbacks -------------------------------------------------------------- */

void *sp__sym_seg_alloc(size_t size, int device, void *stream, void *ctx) {
    (void)stream;
    sp_sym_state_t *st = ctx;
    if (!sp__sym_is_live(st))
        return NULL;
    /* Only a growth the protocol started may allocate, and only once per growth: anything else
     * would make this rank enter a collective the others are not in. */
    if (!st->in_grow || st->grow_called) {
        SP_INFO(SP_SUB_SYM,
                "symmetric pool \"%s\": segment request outside a collective growth "
                "refused",
                st->name);
        return NULL;
    }
    st->grow_called = true;
    /* The record is allocated before the agreement so that a host-memory failure here is this
     * rank's "cannot grow" rather than a rank missing from the registrar's collectives. */
    sp_sym_rec_t *rec = calloc(1, sizeof *rec);
    st->sbuf[0] = rec != NULL;
    st->sbuf[1] = (int64_t)size;
    st->sbuf[2] = -(int64_t)size;
    st->sbuf[3] = rec ? INT64_MAX : st->rank; /* lowest rank that cannot grow */
    char what[96];
    snprintf(what, sizeof what, "sp_symmetric_malloc call #%llu (growth)",
             (unsigned long long)st->callno);
    sp_status_t s =
        sp__sym_agree(st, st->comm, st->sbuf, st->rbuf, 4, MPI_INT64_T, MPI_MIN, NULL, what);
    if (s == SP_SUCCESS && st->rbuf[0] == 0)
        s = sp__error_quiet(SP_ERR_OUT_OF_MEMORY, SP_SUB_SYM,
                            "%s: rank %lld cannot grow the pool, so no rank does", what,
                            (long long)st->rbuf[3]);
    else if (s == SP_SUCCESS && st->rbuf[1] != -st->rbuf[2])
        s = sp__error(SP_ERR_MISMATCH, SP_SUB_SYM,
                      "%s: ranks want segments of different sizes (%lld..%lld bytes): their "
                      "allocator settings differ (SYMPOOL_ALLOC_CONF, SYMPOOL_LARGE_SEGMENT_SIZE, "
                      "...); give every rank the same ones",
                      what, (long long)st->rbuf[1], (long long)-st->rbuf[2]);
    /* From here every rank takes the same branch: the registrar's collectives follow. */
    if (s == SP_SUCCESS)
        s = st->reg->alloc(st->world, st->comm, device, size, &rec->seg);
    if (s != SP_SUCCESS) {
        free(rec);
        st->grow_status = s;
        snprintf(st->grow_why, sizeof st->grow_why, "%s", sp_last_error());
        return NULL;
    }
    rec->seq = UINT64_MAX;
    sp_sym_rec_t **tail = &st->recs;
    while (*tail)
        tail = &(*tail)->next;
    *tail = rec;
    sp__symc_add(st->device, SP_SYMC_REGISTRATIONS, 1);
    return rec->seg.base;
}

void sp__sym_seg_free(void *ptr, size_t size, int device, void *stream, void *ctx) {
    (void)size;
    (void)device;
    (void)stream;
    sp_sym_state_t *st = ctx;
    if (!sp__sym_is_live(st))
        return; /* the world was finalized: the registrar already released it */
    sp_sym_rec_t **pp = &st->recs;
    while (*pp && (*pp)->seg.base != ptr)
        pp = &(*pp)->next;
    sp_sym_rec_t *rec = *pp;
    if (!rec)
        return;
    if (!st->in_release) {
        /* Released outside a collective call (sp_mempool_destroy, sp_shutdown): releasing it
         * now would enter a collective alone. Keep it; it goes at the next collective release
         * (sp_symmetric_mempool_destroy or sp_world_finalize). */
        rec->orphan = true;
        SP_INFO(SP_SUB_SYM,
                "symmetric pool \"%s\": segment %p released locally; its "
                "registration is dropped at the next collective release",
                st->name, ptr);
        return;
    }
    sp_status_t s = st->reg->release(st->world, st->comm, st->device, &rec->seg);
    if (s != SP_SUCCESS && st->release_status == SP_SUCCESS)
        st->release_status = s;
    *pp = rec->next;
    free(rec);
    sp__symc_add(st->device, SP_SYMC_DEREGISTRATIONS, 1);
}

/* ---- malloc ------------------------------------------------------------------------------ */

enum { F_SIZE, F_CALL, F_FOUND, F_SEG, F_OFF, NF };

/* One agreement round on (size, call, candidate). Fills lo[]/hi[] with min and max. */
static sp_status_t round_(sp_sym_state_t *st, size_t size, sp_stream_t stream, const char *what,
                          int64_t lo[NF], int64_t hi[NF]) {
    bool found = false;
    uint64_t seg = 0;
    size_t off = 0;
    /* A local failure must not keep this rank out of the allreduce the others are in: it
     * contributes "no candidate", which at worst makes every rank grow. */
    if (size > 0 && sp__pool_sym_find(st->pool, size, stream, &found, &seg, &off) != SP_SUCCESS)
        found = false;
    int64_t f[NF] = {size > (size_t)INT64_MAX ? INT64_MAX : (int64_t)size, (int64_t)st->callno,
                     found, found ? (int64_t)seg : -1, found ? (int64_t)off : -1};
    for (int i = 0; i < NF; i++) {
        st->sbuf[2 * i] = f[i];
        st->sbuf[2 * i + 1] = -f[i];
    }
    sp__symc_add(st->device, SP_SYMC_ROUNDS, 1);
    SP_CHECK(
        sp__sym_agree(st, st->comm, st->sbuf, st->rbuf, 2 * NF, MPI_INT64_T, MPI_MIN, NULL, what));
    for (int i = 0; i < NF; i++) {
        lo[i] = st->rbuf[2 * i];
        hi[i] = -st->rbuf[2 * i + 1];
    }
    return SP_SUCCESS;
}

static bool same_candidate(const int64_t lo[NF], const int64_t hi[NF]) {
    return lo[F_FOUND] == 1 && lo[F_SEG] == hi[F_SEG] && lo[F_OFF] == hi[F_OFF];
}

static sp_status_t take(sp_sym_state_t *st, size_t size, sp_stream_t stream, const int64_t lo[NF],
                        void **ptr_p) {
    sp_status_t s =
        sp__pool_sym_take(st->pool, size, stream, (uint64_t)lo[F_SEG], (size_t)lo[F_OFF], ptr_p);
    char wbuf[128];
    if (s != SP_SUCCESS)
        return sp__error(SP_ERR_INTERNAL, SP_SUB_SYM,
                         "%s: the agreed block (segment %lld, offset %lld) could not be taken "
                         "here (%s); was the pool used from another thread meanwhile?",
                         describe(st, NULL, wbuf, sizeof wbuf), (long long)lo[F_SEG],
                         (long long)lo[F_OFF], sp_status_name(s));
    return SP_SUCCESS;
}

/* Every rank grows one segment together (see the file comment). */
static sp_status_t grow(sp_sym_state_t *st, size_t size, sp_stream_t stream, const char *what,
                        void **ptr_p) {
    void *p = NULL;
    st->in_grow = true;
    st->grow_called = false;
    st->grow_status = SP_SUCCESS;
    sp_status_t s = sp__pool_sym_grow(st->pool, size, stream, &p);
    st->in_grow = false;
    if (st->broken)
        return sp__error(SP_ERR_TIMEOUT, SP_SUB_SYM, "%s", st->broken_why);
    if (!st->grow_called) {
        /* The pool refused before asking us (a limit, host memory): the others are waiting in
         * the callback's allreduce, so answer it from here with "cannot grow". */
        st->sbuf[0] = 0;
        st->sbuf[1] = (int64_t)size;
        st->sbuf[2] = -(int64_t)size;
        st->sbuf[3] = st->rank;
        SP_CHECK(
            sp__sym_agree(st, st->comm, st->sbuf, st->rbuf, 4, MPI_INT64_T, MPI_MIN, NULL, what));
    }
    int64_t v[2] = {s == SP_SUCCESS, s == SP_SUCCESS ? INT64_MAX : st->rank};
    memcpy(st->sbuf, v, sizeof v);
    SP_CHECK(sp__sym_agree(st, st->comm, st->sbuf, st->rbuf, 2, MPI_INT64_T, MPI_MIN, NULL, what));
    if (st->rbuf[0] == 1) {
        sp_block_info_t bi;
        if (sp__pool_lookup(p, &bi) == SP_SUCCESS)
            for (sp_sym_rec_t *r = st->recs; r; r = r->next)
                if (r->seg.base == bi.segment_base)
                    r->seq = bi.segment_seq;
        sp__symc_add(st->device, SP_SYMC_GROWTHS, 1);
        SP_INFO(SP_SUB_SYM,
                "%s: every rank grew a registered segment (%s registrar) for %zu "
                "bytes",
                what, st->reg->name, size);
        *ptr_p = p;
        return SP_SUCCESS;
    }
    if (s == SP_SUCCESS) {
        sp_free(p); /* the block goes back to the cache; its segment stays registered */
        return sp__error(SP_ERR_OUT_OF_MEMORY, SP_SUB_SYM,
                         "%s: rank %lld could not grow the pool, so no rank allocates", what,
                         (long long)st->rbuf[1]);
    }
    if (st->grow_status != SP_SUCCESS && st->grow_status != SP_ERR_OUT_OF_MEMORY)
        return sp__error(st->grow_status, SP_SUB_SYM, "%s: growing a segment failed: %s", what,
                         st->grow_why);
    return sp__error(SP_ERR_OUT_OF_MEMORY, SP_SUB_SYM,
                     "%s: cannot grow symmetric pool \"%s\" by a segment for %zu bytes (rank "
                     "%lld cannot), nothing allocated on any rank",
                     what, st->name, size, (long long)st->rbuf[1]);
}

SP_EXPORT sp_status_t sp_symmetric_malloc(sp_mempool_t *pool, size_t size, sp_stream_t stream,
                                          void **ptr_p) {
    sp_sym_state_t *st;
    SP_CHECK(sp__sym_acquire(pool, "sp_symmetric_malloc", &st));
    /* The call counts even if it fails locally below: a rank that skipped the collective part
     * is then caught by the call numbers at the next call. */
    ++st->callno;
    char wbuf[128];
#define WHAT describe(st, NULL, wbuf, sizeof wbuf)
    sp_status_t s;
    int64_t lo[NF], hi[NF];
    void *p = NULL;
    if (!ptr_p) {
        s = sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_SYM,
                      "%s: ptr_p is NULL (this rank did not take part; the next call will "
                      "report a mismatch)",
                      WHAT);
        goto out;
    }
    SP_CHECK_GOTO(round_(st, size, stream, NULL, lo, hi), s, out);
    if (lo[F_SIZE] != hi[F_SIZE] || lo[F_CALL] != hi[F_CALL]) {
        s = sp__error(SP_ERR_MISMATCH, SP_SUB_SYM,
                      "%s: ranks disagree: sizes from %lld to %lld bytes, call numbers from "
                      "#%lld to #%lld. Every rank must make the same sp_symmetric_malloc calls "
                      "in the same order; nothing was allocated",
                      WHAT, (long long)lo[F_SIZE], (long long)hi[F_SIZE], (long long)lo[F_CALL],
                      (long long)hi[F_CALL]);
        st->callno = (uint64_t)hi[F_CALL]; /* every rank continues from the same number */
        goto out;
    }
    if (size == 0) {
        s = SP_SUCCESS; /* p stays NULL, as sp_malloc(0) */
        goto out;
    }
    if (same_candidate(lo, hi)) {
        s = take(st, size, stream, lo, &p);
        goto out;
    }
    /* The caches differ (events completed at different times, a block lent on OOM): complete
     * this rank's pending frees and look again before paying for a growth. */
    if (sp__pool_sync_pending(pool) != SP_SUCCESS)
        SP_INFO(SP_SUB_SYM, "%s: completing pending frees failed: %s", WHAT, sp_last_error());
    SP_CHECK_GOTO(round_(st, size, stream, NULL, lo, hi), s, out);
    if (same_candidate(lo, hi))
        s = take(st, size, stream, lo, &p);
    else
        s = grow(st, size, stream, WHAT, &p);
out:
    if (s == SP_SUCCESS) {
        sp__symc_add(st->device, SP_SYMC_MALLOCS, 1);
        *ptr_p = p;
    }
    sp__sym_release_state(st);
    return s;
#undef WHAT
}
