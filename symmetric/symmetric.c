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
 * Every round is launch/agree.c's one message shape (operation, call number on the pool, "my
 * checks passed", fields), bounded by SYMPOOL_SYM_TIMEOUT; a rank in another call on the same
 * pool (empty cache, destroy) is reported as SP_ERR_MISMATCH naming both calls. On a timeout
 * the pool is marked broken: later collective calls on it return SP_ERR_INVALID_USAGE with the
 * saved reason, its live blocks stay valid and can be freed, and its segments are released at
 * sp_world_finalize. A rank that arrives after its peers gave up sees the round complete late
 * and breaks its pool too.
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

/* ---- rounds --------------------------------------------------------------------------- */

static void break_pool(sp_sym_state_t *st, bool abandoned, const char *what) {
    st->broken = true;
    st->abandoned = st->abandoned || abandoned;
    snprintf(st->broken_why, sizeof st->broken_why,
             "%s timed out (SYMPOOL_SYM_TIMEOUT=%g s; 0 = none)", what, sp__agree_timeout_s());
}

sp_status_t sp__sym_round(sp_sym_state_t *st, sp_agree_t *a, const char *what) {
    a->callno = st->callno;
    bool abandoned = false;
    sp_status_t s = sp__agree(st->comm, a, what, &abandoned);
    if (s == SP_ERR_TIMEOUT)
        break_pool(st, abandoned, what);
    if (s != SP_SUCCESS)
        return s;
    s = sp__agree_check(a, what);
    if (s == SP_ERR_MISMATCH && a->call_hi > st->callno)
        st->callno = a->call_hi; /* every rank continues from the same number */
    return s;
}

sp_status_t sp__sym_band(sp_sym_state_t *st, uint64_t *bits, size_t words, const char *what) {
    bool abandoned = false;
    sp_status_t s = sp__agree_band(st->comm, bits, words, what, &abandoned);
    if (s == SP_ERR_TIMEOUT)
        break_pool(st, abandoned, what);
    return s;
}

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

/* ---- create ------------------------------------------------------------------------------ */

static void free_new_state(sp_sym_state_t *st, sp_mempool_t *pool) {
    if (pool)
        sp__mempool_destroy_internal(pool);
    pthread_mutex_destroy(&st->lock);
    free(st);
}

/* The pool's own communicators (collective over the world; every rank has agreed to create). */
static sp_status_t make_comms(sp_world_t *w, sp_sym_state_t *st) {
    SP_CHECK(sp__world_mpi_status(MPI_Comm_dup(sp__world_comm(w), &st->comm),
                                  "MPI_Comm_dup for a symmetric pool"));
    MPI_Comm_set_errhandler(st->comm, MPI_ERRORS_RETURN);
    sp_status_t s = sp__world_mpi_status(
        MPI_Comm_split_type(st->comm, MPI_COMM_TYPE_SHARED, st->rank, MPI_INFO_NULL,
                            &st->node_comm),
        "MPI_Comm_split_type for a symmetric pool");
    if (s != SP_SUCCESS) {
        MPI_Comm_free(&st->comm);
        return s;
    }
    MPI_Comm_set_errhandler(st->node_comm, MPI_ERRORS_RETURN);
    return SP_SUCCESS;
}

SP_EXPORT sp_status_t sp_symmetric_mempool_create(sp_world_t *w, const sp_mempool_params_t *params,
                                                  sp_mempool_t **pool_p) {
    static const char fn[] = "sp_symmetric_mempool_create";
    SP_CHECK(sp__world_check(w, fn));
    sp_mempool_params_t p;
    sp_mempool_params_init(&p);
    if (params)
        p = *params;
    sp_sym_state_t *st = calloc(1, sizeof *st);
    if (!st) /* the peers time out: this rank cannot even take part */
        return sp__error(SP_ERR_SYSTEM, SP_SUB_SYM, "%s: out of host memory", fn);
    pthread_mutex_init(&st->lock, NULL);
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
    sp_agree_t a = {.op = SP_AGREE_POOL_CREATE,
                    .ok = ls == SP_SUCCESS,
                    .f = {(int64_t)st->serial, p.use_on_oom, p.no_split}};
    sp_status_t s = sp__world_agree(w, &a, what);
    if (s == SP_SUCCESS && a.lo[0] != a.hi[0])
        s = sp__error(SP_ERR_MISMATCH, SP_SUB_SYM,
                      "%s: ranks are at different symmetric pool creations (#%lld..#%lld): "
                      "every rank must create the same pools in the same order",
                      what, (long long)a.lo[0], (long long)a.hi[0]);
    else if (s == SP_SUCCESS && (a.lo[1] != a.hi[1] || a.lo[2] != a.hi[2]))
        s = sp__error(SP_ERR_MISMATCH, SP_SUB_SYM,
                      "%s: ranks pass different use_on_oom/no_split flags", what);
    else if (s == SP_SUCCESS && a.nbad) {
        char ranks[96];
        s = ls != SP_SUCCESS ? sp__error(ls, SP_SUB_SYM, "%s", why)
                             : sp__error(SP_ERR_INVALID_USAGE, SP_SUB_SYM,
                                         "%s: %s could not create the pool (its log "
                                         "say why); no rank has it",
                                         what, sp__agree_bad_ranks(&a, ranks, sizeof ranks));
    }
    if (s == SP_SUCCESS)
        s = make_comms(w, st);
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

void *sp__sym_seg_alloc(size_t size, int device, void *stream, void *ctx) {
    (void)stream;
    (void)device;
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
    char what[160];
    snprintf(what, sizeof what, "sp_symmetric_malloc call #%llu (growth) on pool \"%s\"",
             (unsigned long long)st->callno, st->name);
    sp_agree_t a = {.op = SP_AGREE_SYM_GROW, .ok = rec != NULL, .f = {(int64_t)size}};
    sp_status_t s = sp__sym_round(st, &a, what);
    char ranks[96];
    if (s == SP_SUCCESS && a.nbad)
        s = sp__error_quiet(SP_ERR_OUT_OF_MEMORY, SP_SUB_SYM,
                            "%s: the pool cannot grow on %s, so no rank grows it", what,
                            sp__agree_bad_ranks(&a, ranks, sizeof ranks));
    else if (s == SP_SUCCESS && a.lo[0] != a.hi[0])
        s = sp__error(SP_ERR_MISMATCH, SP_SUB_SYM,
                      "%s: ranks want segments of different sizes (%lld..%lld bytes): their "
                      "allocator settings differ (SYMPOOL_ALLOC_CONF, SYMPOOL_LARGE_SEGMENT_SIZE, "
                      "...); give every rank the same ones",
                      what, (long long)a.lo[0], (long long)a.hi[0]);
    /* From here every rank takes the same branch: the registrar's collectives follow. */
    if (s == SP_SUCCESS)
        s = st->reg->alloc(st, size, &rec->seg);
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
    sp_status_t s = st->reg->release(st, &rec->seg, stream);
    if (s != SP_SUCCESS && st->release_status == SP_SUCCESS)
        st->release_status = s;
    *pp = rec->next;
    free(rec);
    sp__symc_add(st->device, SP_SYMC_DEREGISTRATIONS, 1);
}

/* ---- malloc ------------------------------------------------------------------------------ */

enum { F_SIZE, F_FOUND, F_SEG, F_OFF };

/* One agreement round on (size, candidate); ok false carries this rank's bad argument. */
static sp_status_t round_(sp_sym_state_t *st, size_t size, sp_stream_t stream, bool ok,
                          const char *what, sp_agree_t *a) {
    bool found = false;
    uint64_t seg = 0;
    size_t off = 0;
    /* A local failure must not keep this rank out of the round the others are in: it
     * contributes "no candidate", which at worst makes every rank grow. */
    if (ok && size > 0 &&
        sp__pool_sym_find(st->pool, size, stream, &found, &seg, &off) != SP_SUCCESS)
        found = false;
    *a = (sp_agree_t){.op = SP_AGREE_SYM_MALLOC,
                      .ok = ok,
                      .f = {size > (size_t)INT64_MAX ? INT64_MAX : (int64_t)size, found,
                            found ? (int64_t)seg : -1, found ? (int64_t)off : -1}};
    sp__symc_add(st->device, SP_SYMC_ROUNDS, 1);
    return sp__sym_round(st, a, what);
}

static bool same_candidate(const sp_agree_t *a) {
    return a->lo[F_FOUND] == 1 && a->lo[F_SEG] == a->hi[F_SEG] && a->lo[F_OFF] == a->hi[F_OFF];
}

static sp_status_t take(sp_sym_state_t *st, size_t size, sp_stream_t stream, const sp_agree_t *a,
                        const char *what, void **ptr_p) {
    sp_status_t s = sp__pool_sym_take(st->pool, size, stream, (uint64_t)a->lo[F_SEG],
                                      (size_t)a->lo[F_OFF], ptr_p);
    if (s != SP_SUCCESS)
        return sp__error(SP_ERR_INTERNAL, SP_SUB_SYM,
                         "%s: the agreed block (segment %lld, offset %lld) could not be taken "
                         "here (%s); was the pool used from another thread meanwhile?",
                         what, (long long)a->lo[F_SEG], (long long)a->lo[F_OFF],
                         sp_status_name(s));
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
    sp_agree_t a;
    char ranks[96];
    if (!st->grow_called) {
        /* The pool refused before asking us (a limit, host memory): the others are waiting in
         * the callback's round, so answer it from here with "cannot grow". */
        a = (sp_agree_t){.op = SP_AGREE_SYM_GROW, .ok = false, .f = {(int64_t)size}};
        SP_CHECK(sp__sym_round(st, &a, what));
    }
    a = (sp_agree_t){.op = SP_AGREE_SYM_GROW, .ok = s == SP_SUCCESS};
    SP_CHECK(sp__sym_round(st, &a, what));
    if (!a.nbad) {
        sp_block_info_t bi;
        if (sp__pool_lookup(p, &bi) == SP_SUCCESS)
            for (sp_sym_rec_t *r = st->recs; r; r = r->next)
                if (r->seg.base == bi.segment_base)
                    r->seq = bi.segment_seq;
        sp__symc_add(st->device, SP_SYMC_GROWTHS, 1);
        SP_INFO(SP_SUB_SYM, "%s: every rank grew a registered segment (%s registrar) for %zu bytes",
                what, st->reg->name, size);
        *ptr_p = p;
        return SP_SUCCESS;
    }
    sp__agree_bad_ranks(&a, ranks, sizeof ranks);
    if (s == SP_SUCCESS) {
        sp_free(p); /* the block goes back to the cache; its segment stays registered */
        return sp__error(SP_ERR_OUT_OF_MEMORY, SP_SUB_SYM,
                         "%s: the pool could not grow on %s, so no rank allocates", what,
                         ranks);
    }
    if (st->grow_status != SP_SUCCESS && st->grow_status != SP_ERR_OUT_OF_MEMORY)
        return sp__error(st->grow_status, SP_SUB_SYM, "%s: growing a segment failed: %s", what,
                         st->grow_why);
    return sp__error(SP_ERR_OUT_OF_MEMORY, SP_SUB_SYM,
                     "%s: cannot grow symmetric pool \"%s\" by a segment for %zu bytes (it cannot on "
                     "%s), nothing allocated on any rank",
                     what, st->name, size, ranks);
}

/* This rank's own argument checks, made before the first round so a bad argument on one rank
 * is an error on every rank (SP_ERR_INVALID_ARGUMENT) instead of a rank missing from it. */
static bool check_args(sp_sym_state_t *st, size_t size, sp_stream_t stream, void **ptr_p,
                       const char *what, char *why, size_t len) {
    sp_status_t s = SP_SUCCESS;
    if (!ptr_p)
        s = sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_SYM, "%s: ptr_p is NULL", what);
    else if (size > 0)
        s = sp__pool_check_stream(st->pool, stream, what);
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
    char what[128], why[256];
    describe(st, NULL, what, sizeof what);
    bool ok = check_args(st, size, stream, ptr_p, what, why, sizeof why);
    sp_agree_t a;
    void *p = NULL;
    char ranks[96];
    sp_status_t s;
    SP_CHECK_GOTO(round_(st, size, stream, ok, what, &a), s, out);
    if (a.lo[F_SIZE] != a.hi[F_SIZE]) {
        s = sp__error(SP_ERR_MISMATCH, SP_SUB_SYM,
                      "%s: ranks disagree: sizes from %lld to %lld bytes. Every rank must make "
                      "the same sp_symmetric_malloc calls in the same order; nothing was "
                      "allocated",
                      what, (long long)a.lo[F_SIZE], (long long)a.hi[F_SIZE]);
        goto out;
    }
    if (a.nbad) {
        s = !ok ? sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_SYM, "%s (no rank allocated)", why)
                : sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_SYM,
                            "%s: %s rejected its arguments (its log says why); no "
                            "rank allocated",
                            what, sp__agree_bad_ranks(&a, ranks, sizeof ranks));
        goto out;
    }
    if (size == 0) {
        s = SP_SUCCESS; /* p stays NULL, as sp_malloc(0) */
        goto out;
    }
    if (same_candidate(&a)) {
        s = take(st, size, stream, &a, what, &p);
        goto out;
    }
    /* The caches differ (events completed at different times, a block lent on OOM): complete
     * this rank's pending frees and look again before paying for a growth. */
    if (sp__pool_sync_pending(pool) != SP_SUCCESS)
        SP_INFO(SP_SUB_SYM, "%s: completing pending frees failed: %s", what, sp_last_error());
    SP_CHECK_GOTO(round_(st, size, stream, true, what, &a), s, out);
    if (same_candidate(&a))
        s = take(st, size, stream, &a, what, &p);
    else
        s = grow(st, size, stream, what, &p);
out:
    if (s == SP_SUCCESS) {
        sp__symc_add(st->device, SP_SYMC_MALLOCS, 1);
        *ptr_p = p;
    }
    sp__sym_release_state(st);
    return s;
}
