/*
 * sym_round.c: the floor of symmetric/ that everything above it stands on: the per-pool
 * agreement rounds (sp__sym_round, sp__sym_band, with the rule that a timeout breaks the pool),
 * the process-wide registry of live symmetric states, and the counters of symmetric.h. The
 * registrars (reg_mpi.c, reg_nccl.c), the protocol (symmetric.c) and the release paths
 * (sym_release.c) call down into it; it calls nothing of theirs.
 *
 * Locking: s_reg_lock guards the registry lists and is never held while calling out; a state's
 * own lock is taken by sp__sym_acquire and held for the caller's whole call. Counters are
 * relaxed atomics.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "pool/pool.h"
#include "symmetric/sym_state.h"
#include "symmetric/symmetric.h"

static pthread_mutex_t s_reg_lock = PTHREAD_MUTEX_INITIALIZER;
static sp_sym_state_t *s_states; /* live states (s_reg_lock) */
static sp_sym_state_t *s_broken; /* states of pools broken by a timeout: kept, never freed,
                                    because an abandoned request may still write their
                                    buffers (s_reg_lock) */
static uint64_t s_reg_gen;       /* registry changes so far (written under s_reg_lock; atomic) */
/* This thread's last sp__sym_acquire lookup: t_pool's state was t_state while the registry was
 * at generation t_gen. While it still is, t_state is still registered, and still t_pool's (a
 * pool's state changes only at its destroy, which unregisters it, or at sp_shutdown, after
 * which the pool's handle fails sp__mempool_check): a cache hit's call skips the lock and the
 * walk. */
static _Thread_local const sp_mempool_t *t_pool;
static _Thread_local sp_sym_state_t *t_state;
static _Thread_local uint64_t t_gen;

/* ---- counters ----------------------------------------------------------------------------- */

#define COUNTER_DEVICES 64
static int64_t s_counters[COUNTER_DEVICES][SP_SYMC_COUNT]; /* relaxed atomics */

void sp__symc_add(int device, sp_symc_t which, int64_t delta) {
    int d = device < 0 ? 0 : device >= COUNTER_DEVICES ? COUNTER_DEVICES - 1 : device;
    __atomic_fetch_add(&s_counters[d][which], delta, __ATOMIC_RELAXED);
}

void sp__symmetric_counters(int device, sp_sym_counters_t *c) {
    if (!c)
        return;
    int64_t v[SP_SYMC_COUNT] = {0};
    for (int d = 0; d < COUNTER_DEVICES; d++) {
        if (device >= 0 && d != (device >= COUNTER_DEVICES ? COUNTER_DEVICES - 1 : device))
            continue;
        for (int k = 0; k < SP_SYMC_COUNT; k++)
            v[k] += __atomic_load_n(&s_counters[d][k], __ATOMIC_RELAXED);
    }
#define X(e, field, help) c->field = v[SP_SYMC_##e];
    SP_SYMC_LIST(X)
#undef X
}

/* ---- registry ----------------------------------------------------------------------------- */

void sp__sym_register(sp_sym_state_t *st) {
    pthread_mutex_lock(&s_reg_lock);
    st->next = s_states;
    s_states = st;
    __atomic_fetch_add(&s_reg_gen, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&s_reg_lock);
}

void sp__sym_unregister(sp_sym_state_t *st) {
    pthread_mutex_lock(&s_reg_lock);
    for (sp_sym_state_t **pp = &s_states; *pp; pp = &(*pp)->next)
        if (*pp == st) {
            *pp = st->next;
            break;
        }
    if (st->broken) {
        st->next = s_broken;
        s_broken = st;
    }
    __atomic_fetch_add(&s_reg_gen, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&s_reg_lock);
}

void sp__sym_forget_pool(sp_sym_state_t *st) {
    pthread_mutex_lock(&s_reg_lock);
    st->pool = NULL;
    pthread_mutex_unlock(&s_reg_lock);
}

bool sp__sym_is_live(const sp_sym_state_t *st) {
    bool live = false;
    pthread_mutex_lock(&s_reg_lock);
    for (sp_sym_state_t *s = s_states; s && !live; s = s->next)
        live = s == st;
    pthread_mutex_unlock(&s_reg_lock);
    return live;
}

sp_sym_state_t *sp__sym_find(const sp_mempool_t *pool) {
    void *want = pool ? sp__mempool_sym_state(pool) : NULL;
    sp_sym_state_t *found = NULL;
    if (!want)
        return NULL;
    pthread_mutex_lock(&s_reg_lock);
    for (sp_sym_state_t *s = s_states; s && !found; s = s->next)
        if (s == want && s->pool == pool)
            found = s;
    pthread_mutex_unlock(&s_reg_lock);
    return found;
}

bool sp__sym_pool_gone(const sp_mempool_t *pool) {
    return pool && sp__mempool_sym_state(pool) != NULL && sp__sym_find(pool) == NULL;
}

static int by_serial(const void *x, const void *y) {
    const sp_sym_state_t *a = *(sp_sym_state_t *const *)x, *b = *(sp_sym_state_t *const *)y;
    return a->serial < b->serial ? -1 : a->serial > b->serial;
}

bool sp__sym_of_world(const sp_world_t *w, sp_sym_state_t ***v_p, size_t *n_p) {
    size_t n = 0, cap = 0;
    pthread_mutex_lock(&s_reg_lock);
    for (sp_sym_state_t *s = s_states; s; s = s->next)
        cap += s->world == w;
    sp_sym_state_t **v = cap ? malloc(cap * sizeof *v) : NULL;
    for (sp_sym_state_t *s = s_states; s && v; s = s->next)
        if (s->world == w)
            v[n++] = s;
    pthread_mutex_unlock(&s_reg_lock);
    if (cap && !v)
        return false;
    if (n > 1)
        qsort(v, n, sizeof *v, by_serial); /* oldest first: the same order on every rank */
    *v_p = v;
    *n_p = n;
    return true;
}

/* The lookup of sp__sym_acquire's slow path: none at all once MPI is finalized, when no pool
 * call may enter MPI any more (the notice below moved the generation, so every call comes here:
 * the cached path pays nothing for the check). */
static sp_sym_state_t *find_usable(const sp_mempool_t *pool) {
    return sp__world_mpi_gone() ? NULL : sp__sym_find(pool);
}

sp_status_t sp__sym_acquire(const sp_mempool_t *pool, const char *fn, sp_sym_state_t **st_p) {
    /* NULL or garbage: SP_ERR_INVALID_ARGUMENT; a handle from before sp_shutdown:
     * SP_ERR_INVALID_USAGE; neither is read through (pool/handles.c). */
    SP_CHECK(sp__mempool_check(pool, fn));
    /* A fork child: the pool's lock may be held for good (a call holds it across its rounds),
     * and its communicators are the parent's. Refused before the registry and the lock. */
    if (sp__world_forked())
        return sp__world_fork_error(fn);
    /* Counted while it holds a state pointer not yet checked under the state's lock (a retired
     * state is freed only when no call is: sp__sym_retire). Entered before the generation is
     * read, which is read before the walk: a change during it makes the next call walk. */
    sp__sym_enter();
    uint64_t gen = __atomic_load_n(&s_reg_gen, __ATOMIC_SEQ_CST);
    sp_sym_state_t *st = pool == t_pool && gen == t_gen ? t_state : find_usable(pool);
    if (st) {
        t_pool = pool;
        t_state = st;
        t_gen = gen;
    }
    if (!st)
        sp__sym_leave(); /* nothing held */
    if (!st && sp__world_mpi_gone())
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_SYM,
                         "%s: MPI was finalized while this symmetric pool was live, so no "
                         "collective call can run any more; destroy the pool and call "
                         "sp_world_finalize before MPI_Finalize",
                         fn);
    if (!st)
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_SYM,
                         "%s: not a live symmetric pool (an ordinary MemPool, one that "
                         "sp_symmetric_mempool_destroy destroyed, or one whose world was "
                         "finalized)",
                         fn);
    pthread_mutex_lock(&st->lock);
    /* Another thread's sp_symmetric_mempool_destroy may have held the lock meanwhile: it
     * clears st->pool under it, and the state stays readable (retired, sp__sym_retire) until
     * this call leaves it. */
    bool mine = st->pool == pool;
    if (!mine)
        pthread_mutex_unlock(&st->lock);
    sp__sym_leave(); /* a live state stays live while its lock is held (destroy takes it) */
    if (!mine) {
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_SYM,
                         "%s: not a live symmetric pool (another thread destroyed it while this "
                         "call waited for it)",
                         fn);
    }
    if (st->broken) {
        sp_status_t s = sp__error(SP_ERR_INVALID_USAGE, SP_SUB_SYM,
                                  "%s: pool broken by timeout (%s)", fn, st->broken_why);
        pthread_mutex_unlock(&st->lock);
        return s;
    }
    *st_p = st;
    return SP_SUCCESS;
}

/* States of destroyed pools (s_reg_lock): a thread that found a state just before its pool's
 * destroy unregistered it may still be waiting for its lock, or about to take it, so the memory
 * (and the locks) must outlive the destroy. Such a thread is counted in s_users from before it
 * reads the registry's generation until it has checked the state under its lock (or, for a
 * query, until it lets go of recs_lock): a state retired while s_users is 0 can be reached by no
 * call (one that enters later reads the new generation, and the walk no longer finds it), so
 * every retired state is freed the first time a retire sees no call in flight; the rest go with
 * their world's finalize. They were all kept until then: a world that created and destroyed
 * pools in a loop grew by one state each time. The counter and the generation are sequentially
 * consistent: a call's enter and a retire's look at s_users are ordered one way or the other,
 * and in the second case the call's read of the generation follows the unregister's change. */
static sp_sym_state_t *s_retired;
static uint64_t s_users; /* calls holding a state pointer not yet checked (atomic) */

void sp__sym_enter(void) {
    __atomic_fetch_add(&s_users, 1, __ATOMIC_SEQ_CST);
}

void sp__sym_leave(void) {
    __atomic_fetch_sub(&s_users, 1, __ATOMIC_SEQ_CST);
}

static void free_states(sp_sym_state_t *list) {
    while (list) {
        sp_sym_state_t *st = list;
        list = st->next;
        pthread_mutex_destroy(&st->lock);
        pthread_mutex_destroy(&st->recs_lock);
        free(st);
    }
}

void sp__sym_retire(sp_sym_state_t *st) {
    pthread_mutex_lock(&s_reg_lock);
    st->next = s_retired;
    s_retired = st;
    sp_sym_state_t *all = NULL;
    if (__atomic_load_n(&s_users, __ATOMIC_SEQ_CST) == 0) {
        all = s_retired; /* each was unregistered before this look */
        s_retired = NULL;
    }
    pthread_mutex_unlock(&s_reg_lock);
    free_states(all);
}

size_t sp__sym_retired_count(void) {
    size_t n = 0;
    pthread_mutex_lock(&s_reg_lock);
    for (sp_sym_state_t *s = s_retired; s; s = s->next)
        n++;
    pthread_mutex_unlock(&s_reg_lock);
    return n;
}

void sp__sym_free_retired(const sp_world_t *w) {
    sp_sym_state_t *mine = NULL;
    pthread_mutex_lock(&s_reg_lock);
    /* A call in flight may still hold one (another thread's call on a pool, waiting for the lock
     * the world's finalize held): they then go with the next retire that sees none. */
    bool in_flight = __atomic_load_n(&s_users, __ATOMIC_SEQ_CST) != 0;
    for (sp_sym_state_t **pp = &s_retired; *pp && !in_flight;) {
        sp_sym_state_t *st = *pp;
        if (st->world != w) {
            pp = &st->next;
            continue;
        }
        *pp = st->next;
        st->next = mine;
        mine = st;
    }
    pthread_mutex_unlock(&s_reg_lock);
    free_states(mine);
}

void sp__sym_release_state(sp_sym_state_t *st) {
    pthread_mutex_unlock(&st->lock);
}

/* MPI_Finalize has started (world.c's notice): every thread's next sp__sym_acquire misses its
 * cache and refuses. */
static void mpi_gone(void) {
    pthread_mutex_lock(&s_reg_lock);
    __atomic_fetch_add(&s_reg_gen, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&s_reg_lock);
}

__attribute__((constructor)) static void register_mpi_gone(void) {
    (void)sp__world_on_mpi_gone(mpi_gone);
}

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
    /* st->comm is a duplicate of the world's communicator: the world's rank and size. */
    sp_status_t s =
        sp__agree_ranked(st->comm, st->rank, sp__world_size(st->world), a, what, &abandoned);
    char wbuf[160];
    if (s == SP_ERR_TIMEOUT)
        break_pool(st, abandoned, sp__agree_name(a, what, wbuf, sizeof wbuf));
    if (s != SP_SUCCESS)
        return s;
    s = sp__agree_check(a, what);
    if (s == SP_ERR_MISMATCH && a->call_hi > st->callno)
        st->callno = a->call_hi; /* every rank continues from the same number */
    return s;
}

sp_status_t sp__sym_node_gather(sp_sym_state_t *st, char *buf, size_t bytes, const char *what) {
    bool abandoned = false;
    sp_status_t s = sp__agree_gather_buf(st->node_comm, buf, bytes, what, &abandoned);
    if (s == SP_ERR_TIMEOUT)
        break_pool(st, abandoned, what); /* free_state then keeps node_comm while it is pending */
    if (s != SP_SUCCESS && !abandoned)
        free(buf); /* an abandoned gather's buffer stays with its pending request */
    return s;
}

sp_status_t sp__sym_band(sp_sym_state_t *st, uint64_t *buf, size_t words, const char *what) {
    bool abandoned = false;
    sp_status_t s = sp__agree_band_buf(st->comm, buf, words, what, &abandoned);
    if (s == SP_ERR_TIMEOUT)
        break_pool(st, abandoned, what);
    if (s != SP_SUCCESS && !abandoned)
        free(buf); /* an abandoned round's buffer stays with its pending request */
    return s;
}
