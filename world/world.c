/*
 * world.c: the MPI world. Owns sp_world_t: the duplicated communicator, the node communicator,
 * local rank and device choice, the NCCL communicator on the cuda backend, the finalize hooks,
 * and whether sympool initialized MPI (and so must finalize it).
 *
 * Invariants: a world's communicators are our own duplicates with MPI_ERRORS_RETURN, so an MPI
 * failure on them comes back as SP_ERR_MPI instead of aborting the job; MPI is finalized only by
 * the last sp_world_finalize of a world whose sp_world_init initialized it (Sandia OpenSHMEM's
 * rule: never finalize what you did not initialize).
 *
 * Two communicators per world: `comm` carries the data of collectives, `agree_comm` only the
 * agreement rounds (agree.c) that start every collective call. A round abandoned at a timeout
 * stays pending on agree_comm, so the data path never matches a stale round, and finalize never
 * frees a communicator that still carries one (MPI would progress it on a freed communicator).
 * A world is broken (sp__world_break) when a collective step on `comm` itself was abandoned at
 * its deadline (a symmetric pool's MPI_Comm_idup of it that not every rank joined in time): its
 * collectives are then out of step with the peers' for good, so every later world-level call
 * (sp__world_check) refuses at once, and sp_world_finalize frees this rank's part without a round.
 *
 * Locking: s_lock guards the hook table, the live-world list and the init bookkeeping;
 * nccl_lock serializes this process's NCCL calls on the world's communicator (NCCL forbids
 * concurrent use of one communicator), held across one NCCL call at a time and never across an
 * MPI round; order_lock (a leaf) guards the window registrations' tickets and turn
 * (sp__world_nccl_ticket) and the gate that orders the world's NCCL collectives with them
 * (sp__world_nccl_coll_enter), and an abort takes it after nccl_lock is let go. A world itself is
 * used by the thread(s) of its rank under MPI's own rules for collectives (the caller orders them).
 *
 * fork(): s_lock is held across MPI_Init_thread (which waits for the other processes of the
 * job), nccl_lock across NCCL calls that wait for the other ranks, and a symmetric pool's lock
 * across its rounds, so a fork handler that took them could hang the parent for good; and MPI
 * and NCCL communicators do not survive fork() anyway. So no handler takes them: the child of a
 * process that had started a world call is marked (forked_child) and refuses every world,
 * symmetric and collective call before touching any of those locks (sp__world_forked); a child
 * of a process that never started one may make its own world.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "world/world.h"
#include "sympool/pool.h"

#if defined(SP_HAVE_NCCL)
#include <cuda_runtime.h>
#include <nccl.h>
#endif

#define MAX_HOOKS 8

struct sp_world {
    MPI_Comm comm;              /* our duplicate of the user's communicator (ERRORS_RETURN) */
    MPI_Comm agree_comm;        /* another duplicate, for agreement rounds only */
    uint64_t callno;            /* world-level collective calls on this rank (atomic) */
    struct sp_world *next_live; /* live-world list (s_lock) */
    pthread_mutex_t nccl_lock;  /* serializes NCCL calls on nccl_comm */
    /* The order of window registrations (sp__world_nccl_ticket): */
    pthread_mutex_t order_lock; /* guards the three below and coll_*; a leaf lock, short steps */
    pthread_cond_t order_cv;    /* signalled when order_turn moves, the order is broken or the
                                 * gate moves */
    uint64_t order_next;        /* rank 0: the next ticket to hand out */
    uint64_t order_turn;        /* the ticket whose registration may run now on this rank */
    char order_broken[200];     /* why no turn comes any more ("" while it does) */
    MPI_Comm node_comm;         /* ranks of comm that share memory with this one */
    int rank;                   /* rank in comm */
    int size;                   /* ranks in comm */
    int local_rank;             /* rank in node_comm */
    int local_size;             /* ranks in node_comm */
    int device;                 /* local_rank % sp_device_count() */
    int *node_rank_of;          /* [size]: world rank -> node rank, -1 on other nodes */
    int nnodes;                 /* node communicators in the world */
    int *node_of;               /* [size]: world rank -> node index (by each node's lowest rank) */
    char (*node_name)[SP_WORLD_NODE_NAME]; /* [nnodes]: host name of each node's lowest rank */
    bool is_cuda;                          /* backend is "cuda" and an NCCL communicator was made */
    bool from_init;         /* made by sp_world_init (counts towards finalizing MPI) */
    void *nccl_comm;        /* ncclComm_t, NULL on host or after an abort (atomic, nccl_lock) */
    char nccl_why[160];     /* why nccl_comm is NULL on cuda ("" otherwise) (nccl_lock) */
    uint64_t pool_serial;   /* symmetric pool creations on this world (caller's thread) */
    uint64_t coll_eligible; /* collectives whose buffers could use symmetric kernels (atomic) */
    uint64_t coll_fallback; /* collectives that could not (atomic) */
    int nccl_sym;           /* NCCL symmetric support: 0 not known yet, 1 on, 2 off (atomic) */
    char nccl_sym_why[160]; /* why it is off; written once, before nccl_sym says 2 */
    char broken_why[320];   /* s_lock: why the world is broken (sp__world_break); "" if not */
    bool finalizing;        /* s_lock: an sp_world_finalize owns it (one per world) */
    /* The gate between the world's NCCL collectives and a registration (sp__world_nccl_gate_*),
     * under order_lock too: */
    uint64_t coll_entered; /* NCCL collectives past the gate on this rank so far */
    uint64_t coll_gate;    /* none passes once coll_entered reaches it (UINT64_MAX: open) */
    int coll_inside;       /* collectives past the gate still in their NCCL call */
};

static pthread_mutex_t s_lock = PTHREAD_MUTEX_INITIALIZER;
static sp_world_finalize_hook_t s_hooks[MAX_HOOKS]; /* s_lock */
static int s_nhooks;                                /* s_lock */
static sp_world_nccl_end_hook_t s_nccl_end;         /* s_lock: sp__world_on_nccl_end's */
static bool s_we_initialized_mpi;                   /* s_lock: MPI_Init_thread was ours */
static int s_init_worlds;                           /* s_lock: live worlds from sp_world_init */
static sp_world_t *s_live;                          /* s_lock: every live world */
static uint64_t s_live_gen; /* changes to s_live so far (written under s_lock; atomic) */
/* This thread's last world found live by sp__world_check, and s_live_gen then: while no world
 * was made or finalized since, it is still live, and a collective call skips the lock and the
 * walk. */
static _Thread_local const sp_world_t *t_world;
static _Thread_local uint64_t t_world_gen;
/* MPI_Finalize has started (sp__world_mpi_gone): set once by self_deleted (atomic). */
static bool s_mpi_gone;
static int s_self_key = MPI_KEYVAL_INVALID; /* s_lock: the MPI_COMM_SELF attribute's key */
#define MAX_NOTICES 4
static void (*s_notices[MAX_NOTICES])(void); /* s_lock */
static int s_nnotices;                       /* s_lock */
static _Atomic int s_test_fail_table;        /* sp__world_test_fail_host_tables */
static bool s_used;                          /* a world call has started in this process (atomic) */
static bool s_forked; /* fork child of a process where s_used was set (atomic) */

/* The pthread_atfork child handler (one thread, every other lock state unknown): no lock. */
static void forked_child(void) {
    if (!__atomic_load_n(&s_used, __ATOMIC_RELAXED))
        return;
    __atomic_store_n(&s_forked, true, __ATOMIC_RELAXED);
    /* The forking thread's cached liveness check (t_world) misses from now on. */
    __atomic_fetch_add(&s_live_gen, 1, __ATOMIC_RELEASE);
}

__attribute__((constructor)) static void register_fork_child(void) {
    int rc = pthread_atfork(NULL, NULL, forked_child);
    if (rc != 0)
        SP_WARN(SP_SUB_BOOT,
                "pthread_atfork failed (%d): a fork child of a process that used a world may "
                "hang in world and symmetric calls instead of refusing them",
                rc);
}

bool sp__world_forked(void) {
    return __atomic_load_n(&s_forked, __ATOMIC_RELAXED);
}

sp_status_t sp__world_fork_error(const char *fn) {
    return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_BOOT,
                     "%s: this process was forked from one that used sympool's MPI world; MPI "
                     "and NCCL communicators do not survive fork(), so world, symmetric pool and "
                     "collective calls are refused here (the plain allocator still works on the "
                     "host backend); make worlds in processes started with spawn/exec, or fork "
                     "before the first sp_world_init/sp_world_from_comm",
                     fn);
}

static bool is_live_locked(const sp_world_t *w) {
    for (sp_world_t *x = s_live; x; x = x->next_live)
        if (x == w)
            return true;
    return false;
}

bool sp__world_mpi_gone(void) {
    return __atomic_load_n(&s_mpi_gone, __ATOMIC_ACQUIRE);
}

sp_status_t sp__world_on_mpi_gone(void (*notice)(void)) {
    if (!notice)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_BOOT, "MPI finalize notice is NULL");
    pthread_mutex_lock(&s_lock);
    sp_status_t st = SP_SUCCESS;
    if (s_nnotices >= MAX_NOTICES)
        st = sp__error(SP_ERR_INTERNAL, SP_SUB_BOOT, "more than %d MPI finalize notices",
                       MAX_NOTICES);
    else
        s_notices[s_nnotices++] = notice;
    pthread_mutex_unlock(&s_lock);
    return st;
}

/* MPI_Finalize deletes MPI_COMM_SELF's attributes before anything else (MPI-3.1 8.7.1), so this
 * runs while MPI still works, in whichever thread finalizes. Every thread's cached liveness
 * check misses from now on (the generation moves), and the slow path refuses. */
static int self_deleted(MPI_Comm comm, int key, void *value, void *extra) {
    (void)comm, (void)key, (void)value, (void)extra;
    __atomic_store_n(&s_mpi_gone, true, __ATOMIC_RELEASE);
    __atomic_fetch_add(&s_live_gen, 1, __ATOMIC_RELEASE);
    if (sp__world_forked())
        return MPI_SUCCESS; /* a fork child's MPI_Finalize: s_lock may be held for good */
    pthread_mutex_lock(&s_lock);
    int n = s_nnotices;
    void (*notices[MAX_NOTICES])(void);
    memcpy(notices, s_notices, sizeof notices);
    pthread_mutex_unlock(&s_lock);
    for (int i = 0; i < n; i++)
        notices[i]();
    /* A round or duplicate abandoned at its deadline but matched by every rank completes with a
     * little progress; left pending, it is erroneous at MPI_Finalize (a crash in Open MPI 4).
     * One that a peer never matched is given up after a second, as before. */
    sp__agree_drain(1.0);
    return MPI_SUCCESS;
}

/* MPI keeps self_deleted's address until MPI_Finalize, which may come after the program
 * unloaded this library (dlclose): it then called an address no longer mapped. So once MPI holds
 * it, the library stays loaded for the process's life (a reference never given back, and the
 * object marked never to unload). Statically linked, dladdr names the object it is part of.
 * Called with no lock held: dlopen takes the loader's lock, under which constructors run. */
static pthread_once_t s_stay_once = PTHREAD_ONCE_INIT;

static void stay_loaded_once(void) {
    Dl_info self;
    if (dladdr((void *)(uintptr_t)&self_deleted, &self) && self.dli_fname)
        (void)dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}

static void stay_loaded(void) {
    (void)pthread_once(&s_stay_once, stay_loaded_once);
}

/* Ask MPI to tell us when it is finalized (once per process; s_lock held). Local MPI calls.
 * Whether MPI holds self_deleted now (the caller then keeps the library loaded, stay_loaded). */
static bool watch_mpi_finalize_locked(void) {
    if (s_self_key != MPI_KEYVAL_INVALID)
        return true;
    int key = MPI_KEYVAL_INVALID;
    if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, self_deleted, &key, NULL) != MPI_SUCCESS)
        return false; /* then a call after the user's MPI_Finalize is MPI's to refuse, as before */
    if (MPI_Comm_set_attr(MPI_COMM_SELF, key, NULL) != MPI_SUCCESS) {
        MPI_Comm_free_keyval(&key);
        return false;
    }
    s_self_key = key;
    return true;
}

/* sp__world_check; a broken world passes when allow_broken (sp_world_finalize). */
static inline __attribute__((always_inline)) sp_status_t
check_world(const sp_world_t *w, const char *fn, bool allow_broken) {
    if (sp__in_callback())
        return sp__callback_refused(fn);
    if (!w)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_BOOT, "%s: world is NULL", fn);
    if (w == t_world && __atomic_load_n(&s_live_gen, __ATOMIC_ACQUIRE) == t_world_gen)
        return SP_SUCCESS;
    if (sp__world_forked())
        return sp__world_fork_error(fn);
    pthread_mutex_lock(&s_lock);
    bool live = is_live_locked(w);
    bool gone = live && sp__world_mpi_gone();
    char why[sizeof w->broken_why] = "";
    if (live && !gone && w->broken_why[0])
        memcpy(why, w->broken_why, sizeof why);
    else if (live && !gone) { /* a broken world is never cached: every call sees it */
        t_world = w;
        t_world_gen = __atomic_load_n(&s_live_gen, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&s_lock);
    if (why[0] && !allow_broken)
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_BOOT,
                         "%s: the world is broken (%s); no collective call can run on it any "
                         "more: finalize it",
                         fn, why);
    if (gone)
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_BOOT,
                         "%s: MPI was finalized while world %p was live, so no collective call "
                         "can run any more; call sp_world_finalize before MPI_Finalize",
                         fn, (const void *)w);
    if (!live)
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_BOOT,
                         "%s: %p is not a live world (already finalized, or not from "
                         "sp_world_init/sp_world_from_comm)",
                         fn, (const void *)w);
    return SP_SUCCESS;
}

sp_status_t sp__world_check(const sp_world_t *w, const char *fn) {
    return check_world(w, fn, false);
}

void sp__world_break(sp_world_t *w, const char *why) {
    pthread_mutex_lock(&s_lock);
    if (!w->broken_why[0])
        snprintf(w->broken_why, sizeof w->broken_why, "%s", why[0] ? why : "a timeout");
    /* Every thread's cached liveness check misses from now on: the slow path refuses. */
    __atomic_fetch_add(&s_live_gen, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&s_lock);
}

sp_status_t sp__world_agree(sp_world_t *w, sp_agree_t *a, const char *what) {
    SP_CHECK(sp__world_check(w, what));
    return sp__world_agree_live(w, a, what);
}

sp_status_t sp__world_agree_live(sp_world_t *w, sp_agree_t *a, const char *what) {
    a->callno = __atomic_add_fetch(&w->callno, 1, __ATOMIC_RELAXED);
    bool abandoned = false;
    SP_CHECK(sp__agree_ranked(w->agree_comm, w->rank, w->size, a, what, &abandoned));
    sp_status_t s = sp__agree_check(a, what);
    /* A rank skipped or added a call: every rank continues from the largest number, so one
     * mistake is one error on every rank, not an error at every later call. */
    if (s == SP_ERR_MISMATCH && a->call_hi > a->callno)
        __atomic_store_n(&w->callno, a->call_hi, __ATOMIC_RELAXED);
    return s;
}

sp_status_t sp__world_band(sp_world_t *w, uint64_t *buf, size_t words, const char *what) {
    sp_status_t s = sp__world_check(w, what);
    bool abandoned = false;
    if (s == SP_SUCCESS)
        s = sp__agree_band_buf(w->agree_comm, buf, words, what, &abandoned);
    if (s != SP_SUCCESS && !abandoned)
        free(buf); /* an abandoned round's buffer stays with its pending request */
    return s;
}

bool sp__world_agree_payload(const sp_world_t *w) {
    /* agree_comm is a duplicate of comm: sp__agree_carries_payload(agree_comm) without the
     * MPI call. */
    return w->size <= SP_AGREE_P2P_MAX_RANKS;
}

int sp__world_rank(const sp_world_t *w) {
    return w->rank;
}
int sp__world_size(const sp_world_t *w) {
    return w->size;
}
int sp__world_device(const sp_world_t *w) {
    return w->device;
}

void sp__world_nccl_abort(sp_world_t *w, const char *why) {
    pthread_mutex_lock(&w->nccl_lock);
#if defined(SP_HAVE_NCCL)
    if (w->nccl_comm) {
        SP_WARN(SP_SUB_BOOT, "aborting the world's NCCL communicator after: %s", why);
        ncclCommAbort((ncclComm_t)w->nccl_comm);
        __atomic_store_n(&w->nccl_comm, NULL, __ATOMIC_RELEASE);
        snprintf(w->nccl_why, sizeof w->nccl_why, "aborted after: %s", why);
    }
#endif
    pthread_mutex_unlock(&w->nccl_lock);
    /* No registration runs on an aborted communicator: whoever waits for a turn fails now, told
     * that the communicator is gone (`why` alone is often the description of the registration
     * that failed, which reads as if that pool were the reason). */
    char broken[sizeof w->order_broken];
    snprintf(broken, sizeof broken, "its NCCL communicator was aborted after: %.150s",
             why && *why ? why : "unknown");
    sp__world_nccl_order_break(w, broken);
}

uint64_t sp__world_nccl_ticket(sp_world_t *w) {
    pthread_mutex_lock(&w->order_lock);
    uint64_t t = w->order_next++;
    pthread_mutex_unlock(&w->order_lock);
    return t;
}

/* An absolute CLOCK_REALTIME time `s` seconds from now (pthread_cond_timedwait's clock). */
static struct timespec realtime_in(double s) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    time_t whole = (time_t)s;
    t.tv_sec += whole;
    t.tv_nsec += (long)((s - (double)whole) * 1e9);
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

sp_status_t sp__world_nccl_wait_turn(sp_world_t *w, uint64_t ticket, const char *what) {
    double limit = sp__agree_timeout_s();
    struct timespec until = realtime_in(limit);
    int rc = 0;
    pthread_mutex_lock(&w->order_lock);
    /* Every rank reached this registration's round before the ticket was handed out, and every
     * earlier ticket's likewise: the wait is for registrations already under way, never for a
     * call a user has yet to make. The deadline still bounds it (a peer may die meanwhile). */
    while (w->order_turn != ticket && !w->order_broken[0] && rc != ETIMEDOUT)
        rc = limit > 0.0 ? pthread_cond_timedwait(&w->order_cv, &w->order_lock, &until)
                         : pthread_cond_wait(&w->order_cv, &w->order_lock);
    bool turn = w->order_turn == ticket && !w->order_broken[0];
    char why[sizeof w->order_broken];
    snprintf(why, sizeof why, "%s", w->order_broken);
    uint64_t at = w->order_turn;
    pthread_mutex_unlock(&w->order_lock);
    if (turn)
        return SP_SUCCESS;
    if (why[0])
        return sp__error(SP_ERR_NCCL, SP_SUB_SYM,
                         "%s: no NCCL window registration can run on this world any more: %s", what,
                         why);
    return sp__error(SP_ERR_TIMEOUT, SP_SUB_SYM,
                     "%s: timed out after %g s (SYMPOOL_SYM_TIMEOUT) waiting for its turn to "
                     "register (turn %llu; registration %llu still runs on this rank)",
                     what, limit, (unsigned long long)ticket, (unsigned long long)at);
}

void sp__world_nccl_end_turn(sp_world_t *w, uint64_t ticket) {
    pthread_mutex_lock(&w->order_lock);
    if (w->order_turn == ticket)
        w->order_turn = ticket + 1;
    pthread_cond_broadcast(&w->order_cv);
    pthread_mutex_unlock(&w->order_lock);
}

void sp__world_nccl_order_break(sp_world_t *w, const char *why) {
    pthread_mutex_lock(&w->order_lock);
    if (!w->order_broken[0])
        snprintf(w->order_broken, sizeof w->order_broken, "%s", why && *why ? why : "unknown");
    pthread_cond_broadcast(&w->order_cv);
    pthread_mutex_unlock(&w->order_lock);
}

static void (*_Atomic s_test_at_drain)(void); /* sp__world_nccl_test_at_drain */

void sp__world_nccl_test_at_drain(void (*hook)(void)) {
    s_test_at_drain = hook;
}

void sp__world_nccl_coll_enter(sp_world_t *w) {
    pthread_mutex_lock(&w->order_lock);
    /* No deadline: a registration that closed the gate opens it again on every path, once its
     * outcome is known on this rank (symmetric/reg_nccl.c). */
    while (w->coll_entered >= w->coll_gate)
        pthread_cond_wait(&w->order_cv, &w->order_lock);
    w->coll_entered++;
    w->coll_inside++;
    pthread_mutex_unlock(&w->order_lock);
}

void sp__world_nccl_coll_leave(sp_world_t *w) {
    pthread_mutex_lock(&w->order_lock);
    w->coll_inside--;
    pthread_cond_broadcast(&w->order_cv);
    pthread_mutex_unlock(&w->order_lock);
}

uint64_t sp__world_nccl_gate_close(sp_world_t *w) {
    pthread_mutex_lock(&w->order_lock);
    w->coll_gate = w->coll_entered;
    uint64_t n = w->coll_entered;
    pthread_mutex_unlock(&w->order_lock);
    return n;
}

sp_status_t sp__world_nccl_gate_drain(sp_world_t *w, uint64_t n, const char *what) {
    void (*hook)(void) = s_test_at_drain;
    if (hook)
        hook();
    double limit = sp__agree_timeout_s();
    struct timespec until = realtime_in(limit);
    int rc = 0;
    pthread_mutex_lock(&w->order_lock);
    w->coll_gate = n;
    pthread_cond_broadcast(&w->order_cv);
    /* The collectives up to the n-th have passed their agreement on every rank (a peer took the
     * n-th into NCCL): this rank's come, and the deadline only bounds a peer that died. */
    while ((w->coll_entered < n || w->coll_inside > 0) && rc != ETIMEDOUT)
        rc = limit > 0.0 ? pthread_cond_timedwait(&w->order_cv, &w->order_lock, &until)
                         : pthread_cond_wait(&w->order_cv, &w->order_lock);
    bool done = w->coll_entered >= n && w->coll_inside == 0;
    uint64_t entered = w->coll_entered;
    pthread_mutex_unlock(&w->order_lock);
    if (done)
        return SP_SUCCESS;
    return sp__error(SP_ERR_TIMEOUT, SP_SUB_SYM,
                     "%s: timed out after %g s (SYMPOOL_SYM_TIMEOUT) waiting for this rank's NCCL "
                     "collectives that a peer had already taken into NCCL (%llu of %llu here)",
                     what, limit, (unsigned long long)entered, (unsigned long long)n);
}

void sp__world_nccl_gate_open(sp_world_t *w) {
    pthread_mutex_lock(&w->order_lock);
    w->coll_gate = UINT64_MAX;
    pthread_cond_broadcast(&w->order_cv);
    pthread_mutex_unlock(&w->order_lock);
}

const char *sp__world_nccl_why(const sp_world_t *w) {
    return w && w->nccl_why[0] ? w->nccl_why : "no NCCL communicator in this world";
}

void sp__world_nccl_lock(sp_world_t *w) {
    pthread_mutex_lock(&w->nccl_lock);
}
void sp__world_nccl_unlock(sp_world_t *w) {
    pthread_mutex_unlock(&w->nccl_lock);
}

sp_status_t sp__world_on_finalize(sp_world_finalize_hook_t hook) {
    if (!hook)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_BOOT, "finalize hook is NULL");
    pthread_mutex_lock(&s_lock);
    sp_status_t st = SP_SUCCESS;
    if (s_nhooks >= MAX_HOOKS)
        st =
            sp__error(SP_ERR_INTERNAL, SP_SUB_BOOT, "more than %d world finalize hooks", MAX_HOOKS);
    else
        s_hooks[s_nhooks++] = hook;
    pthread_mutex_unlock(&s_lock);
    return st;
}

sp_status_t sp__world_on_nccl_end(sp_world_nccl_end_hook_t hook) {
    if (!hook)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_BOOT, "NCCL end hook is NULL");
    pthread_mutex_lock(&s_lock);
    sp_status_t st = SP_SUCCESS;
    if (s_nccl_end)
        st = sp__error(SP_ERR_INTERNAL, SP_SUB_BOOT, "a second NCCL end hook");
    else
        s_nccl_end = hook;
    pthread_mutex_unlock(&s_lock);
    return st;
}

static sp_world_nccl_end_hook_t nccl_end_hook(void) {
    pthread_mutex_lock(&s_lock);
    sp_world_nccl_end_hook_t h = s_nccl_end;
    pthread_mutex_unlock(&s_lock);
    return h;
}

#if defined(SP_HAVE_NCCL)
/* NCCL failures carry two texts: the code's generic string and the last detailed message. */
static sp_status_t nccl_status(ncclResult_t r, ncclComm_t comm, const char *what) {
    if (r == ncclSuccess)
        return SP_SUCCESS;
    const char *last = ncclGetLastError(comm);
    return sp__error(SP_ERR_NCCL, SP_SUB_BOOT, "%s failed: %s%s%s", what, ncclGetErrorString(r),
                     last && *last ? ": " : "", last ? last : "");
}

/* Wait for a nonblocking NCCL call's outcome: r is what the call returned; while it is
 * ncclInProgress, `watch` (the communicator the call runs on) says the outcome through
 * ncclCommGetAsyncError (NCCL 2.28.9 src/init.cc:2706-2711; set at the job's end, src/group.cc:
 * 608-612). Bounded by `end` (sp__now_ns; 0: none): *late says the deadline came first. */
static sp_status_t nccl_settle(ncclResult_t r, ncclComm_t watch, uint64_t end, const char *what,
                               bool *late) {
    long pause_ns = 20000; /* the first polls come soon: a set-up often ends within ms */
    while (r == ncclInProgress && watch) {
        ncclResult_t q = ncclInProgress;
        ncclResult_t g = ncclCommGetAsyncError(watch, &q);
        if (g != ncclSuccess)
            return nccl_status(g, NULL, "ncclCommGetAsyncError");
        r = q;
        if (r != ncclInProgress)
            break;
        if (end && sp__now_ns() >= end) {
            *late = true;
            return SP_ERR_TIMEOUT; /* the caller says what (it knows which rank failed) */
        }
        struct timespec ts = {0, pause_ns};
        nanosleep(&ts, NULL);
        if (pause_ns < 10000000)
            pause_ns *= 2;
    }
    return nccl_status(r, NULL, what);
}

/* Rank 0 makes the unique id and broadcasts it together with its status, so a failure there
 * fails every rank instead of leaving them waiting in NCCL. Every rank then agrees that every
 * rank has its device set (a rank whose device set-up failed never joins NCCL's set-up).
 *
 * NCCL's set-up is collective and, blocking, waits inside NCCL where no deadline reaches: a rank
 * whose set-up fails locally (a bad NCCL_SOCKET_IFNAME, out of memory, a CUDA error) left its
 * peers in NCCL's bootstrap for good while it waited for them in the MPI_Allreduce below. So it
 * runs nonblocking (ncclConfig_t.blocking = 0: the call returns ncclInProgress and its outcome
 * comes through ncclCommGetAsyncError), bounded by SYMPOOL_SYM_TIMEOUT, and a rank that fails or
 * reaches the deadline aborts what it has (ncclCommAbort stops a pending set-up and joins it:
 * src/init.cc:2513-2519, :376-377) and meets the others in the MPI_Allreduce, where every rank
 * learns the outcome and which rank failed.
 *
 * A nonblocking communicator stays nonblocking (config.blocking is set only at creation:
 * src/init.cc:1936, :1647-1649): every later collective and window registration on it would run
 * on a thread of NCCL's and may return ncclInProgress (src/group.cc:706-738, src/enqueue.cc:
 * 2658, src/dev_runtime.cc:891-919), and a call made before the previous one settled fails
 * (src/init.cc:373-390). So the world's communicator is a blocking child of the
 * nonblocking one: ncclCommSplit with blocking = 1 runs as its parent's job, nonblocking like
 * every job on that parent (src/group.cc:52-59, init.cc:2626), its outcome in the parent's
 * state and the child in *newcomm once complete (src/init.cc:1612-1614), and the child takes the
 * config given (init.cc:2598-2601). The parent is destroyed once every rank has the child. */
static sp_status_t nccl_bootstrap(sp_world_t *w) {
    struct {
        int ok;
        ncclUniqueId id;
    } msg;
    memset(&msg, 0, sizeof msg);
    sp_status_t st = SP_SUCCESS;
    if (w->rank == 0) {
        st = nccl_status(ncclGetUniqueId(&msg.id), NULL, "ncclGetUniqueId");
        msg.ok = st == SP_SUCCESS;
    }
    SP_CHECK(sp__world_mpi_status(MPI_Bcast(&msg, (int)sizeof msg, MPI_BYTE, 0, w->comm),
                                  "MPI_Bcast of the NCCL unique id"));
    if (!msg.ok)
        return w->rank == 0 ? st
                            : sp__error(SP_ERR_NCCL, SP_SUB_BOOT,
                                        "rank 0 could not create the NCCL unique id");
    cudaError_t ce = cudaSetDevice(w->device);
    if (ce != cudaSuccess) {
        st = sp__error(SP_ERR_DEVICE, SP_SUB_BOOT, "cudaSetDevice(%d) failed: %s", w->device,
                       cudaGetErrorString(ce));
        if (cudaPeekAtLastError() == ce) /* ours only: a caller's pending error stays theirs */
            (void)cudaGetLastError();
    }
    int ok = st == SP_SUCCESS, all = 0;
    SP_CHECK(sp__world_mpi_status(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, w->comm),
                                  "MPI_Allreduce before ncclCommInitRankConfig"));
    if (!all)
        return st != SP_SUCCESS ? st
                                : sp__error(SP_ERR_DEVICE, SP_SUB_BOOT,
                                            "another rank could not set its device up, so no "
                                            "rank enters NCCL's set-up");
    double limit = sp__agree_timeout_s();
    uint64_t end = limit > 0.0 ? sp__now_ns() + (uint64_t)(limit * 1e9) : 0;
    bool late = false;
    const char *step = "ncclCommInitRankConfig";
    ncclComm_t init = NULL, comm = NULL;
    ncclConfig_t nb = NCCL_CONFIG_INITIALIZER;
    nb.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&init, w->size, msg.id, w->rank, &nb);
    st = nccl_settle(r, init, end, step, &late);
    if (st == SP_SUCCESS) {
        step = "ncclCommSplit";
        ncclConfig_t bl = NCCL_CONFIG_INITIALIZER;
        bl.blocking = 1;
        r = ncclCommSplit(init, 0, w->rank, &comm, &bl);
        st = nccl_settle(r, init, end, step, &late);
        if (st == SP_SUCCESS && !comm)
            st = sp__error(SP_ERR_NCCL, SP_SUB_BOOT, "ncclCommSplit made no communicator");
    }
    /* MAXLOC over {0 ok, 1 at the deadline, 2 failed here}: the lowest rank of the worst. */
    int mine[2] = {st == SP_SUCCESS ? 0 : late ? 1 : 2, w->rank}, worst[2] = {0, 0};
    sp_status_t mst =
        sp__world_mpi_status(MPI_Allreduce(mine, worst, 1, MPI_2INT, MPI_MAXLOC, w->comm),
                             "MPI_Allreduce after NCCL's set-up");
    if (mst == SP_SUCCESS && worst[0] == 0) {
        __atomic_store_n(&w->nccl_comm, (void *)comm, __ATOMIC_RELEASE);
        /* The child holds resources of its own (splitShare unset); a blocking destroy
         * (destroyFlag makes the group blocking: src/group.cc:52-53), local. */
        r = ncclCommDestroy(init);
        if (r != ncclSuccess) {
            SP_WARN(SP_SUB_BOOT, "ncclCommDestroy of the set-up communicator failed (%s); aborted",
                    ncclGetErrorString(r));
            ncclCommAbort(init);
        }
    } else {
        if (comm)
            ncclCommAbort(comm);
        if (init)
            ncclCommAbort(init); /* also a set-up still in progress (see above) */
        if (late) {
            char why[96];
            if (mst != SP_SUCCESS)
                snprintf(why, sizeof why, "the ranks could not compare their outcomes");
            else if (worst[0] == 2)
                snprintf(why, sizeof why, "it failed on rank %d", worst[1]);
            else
                snprintf(why, sizeof why, "no rank saw it fail (rank %d waited too)", worst[1]);
            st = sp__error(SP_ERR_TIMEOUT, SP_SUB_BOOT,
                           "NCCL's set-up: %s did not complete within %g s (SYMPOOL_SYM_TIMEOUT): "
                           "%s",
                           step, limit, why);
        } else if (st == SP_SUCCESS)
            st = mst != SP_SUCCESS
                     ? mst
                     : sp__error(SP_ERR_NCCL, SP_SUB_BOOT, "NCCL's set-up failed on rank %d (%s)",
                                 worst[1],
                                 worst[0] == 2 ? "an error there" : "its deadline came first");
    }
    SP_INFO(SP_SUB_BOOT, "NCCL communicator: %s (%d ranks, device %d)",
            st == SP_SUCCESS ? "ready" : "failed", w->size, w->device);
    return st;
}
#endif

/* The bytes of a GPU's name in the GPU table: a PCI bus id ("0000:3b:00.0", 13 with the NUL). */
#define GPU_ID 32

/* The node table's record: one per rank, gathered by node_table. */
typedef struct {
    int leader;                    /* world rank of this rank's node's lowest rank; -1: failed */
    char host[SP_WORLD_NODE_NAME]; /* this rank's host name */
} node_rec_t;

/* Creation's scratch: the host memory its collectives gather into, freed when it returns. */
typedef struct {
    int *ranks;       /* [size]: 0..size-1, for MPI_Group_translate_ranks */
    node_rec_t *recs; /* [size]: the node table's MPI_Allgather */
    int *index;       /* [size]: node index of each node's lowest rank, -1 for the others */
    char *gpu_ids;    /* [size * GPU_ID]: node_gpus's MPI_Allgather (local_size <= size) */
} scratch_t;

static void scratch_free(scratch_t *s) {
    free(s->ranks);
    free(s->recs);
    free(s->index);
    free(s->gpu_ids);
}

/* Every host table world creation needs, allocated before its agreement round, whose ok flag
 * carries the outcome: a rank that cannot allocate one must not return alone while its peers
 * wait for it in a collective with no deadline (the node table's MPI_Allgather), so every
 * collective after the round finds its memory already there. Sized by the world (the GPU table
 * too: the node's size is known only after the split, which comes after the round); node_name
 * shrinks to the nodes found once they are known. Returns the name of the first table that could
 * not be had, NULL when all were. Local. */
static const char *alloc_tables(sp_world_t *w, scratch_t *s) {
    size_t n = (size_t)w->size;
    w->node_rank_of = malloc(n * sizeof *w->node_rank_of);
    w->node_of = malloc(n * sizeof *w->node_of);
    w->node_name = malloc(n * sizeof *w->node_name);
    s->ranks = malloc(n * sizeof *s->ranks);
    s->recs = malloc(n * sizeof *s->recs);
    s->index = malloc(n * sizeof *s->index);
    s->gpu_ids = malloc(n * GPU_ID);
    int fail = s_test_fail_table;
    if (!w->node_rank_of || !s->ranks || fail == 1)
        return "rank table";
    if (!w->node_of || !s->recs || !s->index || fail == 2)
        return "node table";
    if (!w->node_name || fail == 3)
        return "node names";
    if (!s->gpu_ids || fail == 4)
        return "GPU table";
    return NULL;
}

/* The outcome of alloc_tables on every rank, after the round that carried it: this rank's own
 * failure, or the ranks that failed (the round's bad set: nothing else sets ok false there). */
static sp_status_t tables_status(const sp_world_t *w, const char *short_of, const sp_agree_t *a) {
    if (short_of)
        return sp__error(SP_ERR_SYSTEM, SP_SUB_BOOT,
                         "world creation: out of host memory for the %s (%d ranks), so no rank "
                         "goes on",
                         short_of, w->size);
    if (a->nbad == 0)
        return SP_SUCCESS;
    char ranks[96];
    return sp__error(SP_ERR_SYSTEM, SP_SUB_BOOT,
                     "world creation: %s could not allocate the world's host tables (out of host "
                     "memory; its log says which), so no rank goes on",
                     sp__agree_bad_ranks(a, ranks, sizeof ranks));
}

/* Whether two ranks of this node would be on one GPU, which NCCL refuses (2.28.9 src/init.cc:
 * "Duplicate GPU detected" when two ranks have equal host hashes and PCI bus ids). Every rank of
 * the node takes part (a collective on node_comm, into s->gpu_ids); `mine`: this rank names its
 * GPU (cuda with NCCL, a device chosen).
 * The GPU is named by its PCI bus id, not its ordinal: ranks started with one GPU each through
 * CUDA_VISIBLE_DEVICES (SLURM's --gpus-per-task=1) all see device 0, on different GPUs. Where a
 * bus id cannot be had, the ordinals' count is the rule: more ranks than visible devices. */
static sp_status_t node_gpus(sp_world_t *w, const scratch_t *s, bool mine, bool *crowded_p,
                             int *gpus_p) {
    char id[GPU_ID] = {0};
    int ndev = sp_device_count();
    (void)mine; /* only a cuda build with NCCL names GPUs */
#if defined(SP_HAVE_NCCL)
    if (mine) {
        cudaError_t pending = cudaPeekAtLastError();
        if (cudaDeviceGetPCIBusId(id, GPU_ID, w->device) != cudaSuccess) {
            id[0] = '\0';
            if (pending == cudaSuccess) /* ours only: a caller's pending error stays theirs */
                (void)cudaGetLastError();
        }
    }
#endif
    char *all = s->gpu_ids;
    SP_CHECK(sp__world_mpi_status(
        MPI_Allgather(id, GPU_ID, MPI_CHAR, all, GPU_ID, MPI_CHAR, w->node_comm),
        "MPI_Allgather of GPU ids"));
    int distinct = 0, named = 0;
    for (int i = 0; i < w->local_size; i++) {
        const char *a = all + (size_t)i * GPU_ID;
        if (a[0] == '\0')
            continue;
        named++;
        bool seen = false;
        for (int j = 0; j < i && !seen; j++)
            seen = strncmp(a, all + (size_t)j * GPU_ID, GPU_ID) == 0;
        distinct += !seen;
    }
    /* Decided from the table every rank of the node holds, so the node's ranks agree. */
    if (named == w->local_size) {
        *crowded_p = distinct < w->local_size;
        *gpus_p = distinct;
    } else {
        *crowded_p = w->local_size > ndev;
        *gpus_p = ndev;
    }
    return SP_SUCCESS;
}

/* World rank -> node rank (w->node_rank_of, -1 on other nodes), so peer pointers can name
 * shared-window ranks. Local MPI calls. */
static sp_status_t rank_table(sp_world_t *w, const scratch_t *s) {
    MPI_Group wg, ng;
    MPI_Comm_group(w->comm, &wg);
    MPI_Comm_group(w->node_comm, &ng);
    for (int i = 0; i < w->size; i++)
        s->ranks[i] = i;
    int rc = MPI_Group_translate_ranks(wg, w->size, s->ranks, ng, w->node_rank_of);
    MPI_Group_free(&wg);
    MPI_Group_free(&ng);
    SP_CHECK(sp__world_mpi_status(rc, "MPI_Group_translate_ranks"));
    for (int i = 0; i < w->size; i++)
        if (w->node_rank_of[i] == MPI_UNDEFINED)
            w->node_rank_of[i] = -1;
    return SP_SUCCESS;
}

/* The node table: which node every rank is on, and each node's host name. A node is what MPI
 * puts in one MPI_COMM_TYPE_SHARED communicator (Open MPI: the ranks of one daemon, i.e. one host
 * of the hostfile); its name is the host name its lowest rank reports. One MPI_Allgather of a
 * fixed record per rank at world creation; afterwards every query is local. Nodes are numbered
 * by their lowest world rank, so the numbering is the same on every rank.
 * `mine`: this rank's rank table failed (rank_table's status). Such a rank still joins the
 * gather, with leader -1, so that every rank fails here naming it instead of waiting for it. */
static sp_status_t node_table(sp_world_t *w, const scratch_t *s, sp_status_t mine) {
    int leader = w->rank;
    for (int i = 0; mine == SP_SUCCESS && i < w->size; i++)
        if (w->node_rank_of[i] >= 0) {
            leader = i; /* the lowest world rank on this node */
            break;
        }
    node_rec_t rec;
    memset(&rec, 0, sizeof rec);
    rec.leader = mine == SP_SUCCESS ? leader : -1;
    snprintf(rec.host, sizeof rec.host, "%s", sp__process_host());
    node_rec_t *all = s->recs;
    SP_CHECK(sp__world_mpi_status(
        MPI_Allgather(&rec, (int)sizeof rec, MPI_BYTE, all, (int)sizeof rec, MPI_BYTE, w->comm),
        "MPI_Allgather of the node table"));
    if (mine != SP_SUCCESS)
        return mine;
    for (int i = 0; i < w->size; i++)
        if (all[i].leader < 0 || all[i].leader >= w->size)
            return sp__error(SP_ERR_MPI, SP_SUB_BOOT,
                             "world creation: rank %d could not make its rank table "
                             "(MPI_Group_translate_ranks failed; its log says why)",
                             i);
    w->nnodes = 0;
    for (int i = 0; i < w->size; i++)
        s->index[i] = all[i].leader == i ? w->nnodes++ : -1;
    for (int i = 0; i < w->size; i++) {
        int l = all[i].leader;
        w->node_of[i] = s->index[l];
        if (l == i) {
            memcpy(w->node_name[s->index[i]], all[i].host, SP_WORLD_NODE_NAME);
            w->node_name[s->index[i]][SP_WORLD_NODE_NAME - 1] = '\0';
        }
    }
    /* node_name was sized for a node per rank; keep what the nodes use (a refused shrink keeps
     * the larger block, which is as good). A rank's own record leads itself or a lower rank, so
     * rank 0 always leads: nnodes >= 1. */
    void *names = realloc(w->node_name, (size_t)w->nnodes * sizeof *w->node_name);
    if (names)
        w->node_name = names;
    return SP_SUCCESS;
}

static _Atomic double s_test_pause_s; /* sp__world_test_pause_between_dups */

void sp__world_test_pause_between_dups(double seconds) {
    s_test_pause_s = seconds;
}

void sp__world_test_fail_host_tables(int which) {
    s_test_fail_table = which;
}

/* Build a world on `comm` (MPI is initialized). Collective over comm. */
static sp_status_t world_create(MPI_Comm comm, bool from_init, sp_world_t **world_p) {
    /* A rank without host memory for its world still takes part in the duplicates and the
     * agreement round below, in a stand-in on the stack, and fails creation there on every rank
     * (as alloc_tables' failures do): returning alone, it left its peers in their first duplicate
     * until the deadline, and its next creation on comm completed that abandoned duplicate, one
     * collective step behind its peers, so that every later creation timed out. */
    sp_world_t stand_in;
    sp_world_t *w = calloc(1, sizeof *w);
    bool no_world = w == NULL;
    if (no_world) {
        memset(&stand_in, 0, sizeof stand_in);
        w = &stand_in;
    }
    w->comm = w->node_comm = w->agree_comm = MPI_COMM_NULL;
    w->from_init = from_init;
    pthread_mutex_init(&w->nccl_lock, NULL);
    pthread_mutex_init(&w->order_lock, NULL);
    pthread_cond_init(&w->order_cv, NULL);
    w->coll_gate = UINT64_MAX;
    sp_status_t st;
    scratch_t s = {0};
    /* The duplicates are the first collective steps: bounded by the deadline, so a rank that
     * never comes (or passes another communicator) is a timeout on the ranks waiting for it, not
     * a hang. A rank that comes after they gave up completes its first duplicate against theirs
     * and times out on the second. Past them every rank is in the same calls. */
    const char *what = from_init ? "sp_world_init: duplicating MPI_COMM_WORLD"
                                 : "sp_world_from_comm: duplicating the communicator (every "
                                   "rank of it must call sp_world_from_comm on it)";
    bool abandoned = false;
    /* Watched before the duplicates: one abandoned here must be drained at MPI_Finalize even
     * when creation fails (self_deleted). */
    pthread_mutex_lock(&s_lock);
    bool watched = watch_mpi_finalize_locked();
    pthread_mutex_unlock(&s_lock);
    if (watched)
        stay_loaded();
    SP_CHECK_GOTO(sp__agree_dup(comm, &w->comm, what, &abandoned), st, fail);
    MPI_Comm_set_errhandler(w->comm, MPI_ERRORS_RETURN);
    double pause = s_test_pause_s;
    if (pause > 0) {
        struct timespec ts = {(time_t)pause, (long)((pause - (double)(time_t)pause) * 1e9)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    SP_CHECK_GOTO(sp__agree_dup(comm, &w->agree_comm, what, &abandoned), st, fail);
    MPI_Comm_set_errhandler(w->agree_comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(w->comm, &w->rank);
    MPI_Comm_size(w->comm, &w->size);
    /* The duplicates' waits have no late rule: a rank whose second duplicate timed out has
     * returned, and a peer that posted its own late can still complete it against the one the
     * first abandoned, then went on alone into MPI_Comm_split_type below and waited there for
     * good. One agreement round, whose late rule makes a round completed after any rank's
     * deadline a timeout on every rank, decides for all of them whether creation goes on. Its ok
     * flag says whether this rank has its host tables (alloc_tables), so that a rank short of
     * host memory fails creation on every rank here instead of leaving its peers in a gather. */
    const char *short_of = no_world ? "world" : alloc_tables(w, &s);
    sp_agree_t agreed = {.op = SP_AGREE_WORLD_CREATE, .ok = short_of == NULL};
    SP_CHECK_GOTO(sp__world_agree_live(w, &agreed, what), st, fail);
    SP_CHECK_GOTO(tables_status(w, short_of, &agreed), st, fail);
    SP_CHECK_GOTO(sp__world_mpi_status(MPI_Comm_split_type(w->comm, MPI_COMM_TYPE_SHARED, w->rank,
                                                           MPI_INFO_NULL, &w->node_comm),
                                       "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)"),
                  st, fail);
    MPI_Comm_set_errhandler(w->node_comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(w->node_comm, &w->local_rank);
    MPI_Comm_size(w->node_comm, &w->local_size);
    /* The process's rank for log lines and "%r" in file names is its rank in the job (what the
     * launcher exports, history.h), not in this world: a world on a subset of the job shares
     * each of its ranks between several processes, whose files would overwrite each other. */
    int job_rank = -1;
    if (MPI_Comm_rank(MPI_COMM_WORLD, &job_rank) == MPI_SUCCESS)
        sp__log_set_rank(job_rank);
    /* A rank whose rank table failed still joins the node table's gather (node_table). */
    SP_CHECK_GOTO(node_table(w, &s, rank_table(w, &s)), st, fail);

    /* Device by local rank. Every rank checks its own count, then all agree, so a rank whose
     * backend failed does not leave the others waiting in the NCCL bootstrap. */
    int ndev = sp_device_count();
    int ok = ndev > 0;
    if (ok)
        w->device = w->local_rank % ndev;
    sp__log_set_device(ok ? w->device : -1);
    /* NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected", from
     * inside ncclCommInitRank, on some ranks only): two ranks of a node on one GPU (node_gpus)
     * are refused here, on every rank, with what to do instead. The host backend and a cuda
     * build without NCCL share devices fine. */
    bool cuda = strcmp(sp_backend_name(), "cuda") == 0, nccl_world = false;
#if defined(SP_HAVE_NCCL)
    nccl_world = cuda;
#endif
    int gpus = ndev; /* the distinct GPUs this node's ranks are on, as far as known */
    bool crowded = false;
    SP_CHECK_GOTO(node_gpus(w, &s, ok && nccl_world, &crowded, &gpus), st, fail);
    crowded = crowded && ok && nccl_world;
    /* MAX over the ranks: [0] a rank without a device, [1]/[2] the most crowded node's ranks
     * and devices, [3]/[4] a rank on the cuda / the host backend. Ranks on different backends
     * (SYMPOOL_DEVICE, or auto with no GPU visible to some ranks) are refused on every rank: the
     * cuda ones would wait in the NCCL set-up below, which the host ones skip. */
    int mine[5] = {!ok, crowded ? w->local_size : 0, crowded ? gpus : 0, cuda, !cuda};
    int worst[5] = {0, 0, 0, 0, 0};
    SP_CHECK_GOTO(sp__world_mpi_status(MPI_Allreduce(mine, worst, 5, MPI_INT, MPI_MAX, w->comm),
                                       "MPI_Allreduce of the device check"),
                  st, fail);
    if (worst[3] && worst[4]) {
        st = sp__error(SP_ERR_DEVICE, SP_SUB_BOOT,
                       "ranks run different backends (this rank: %s, another: %s); give every "
                       "rank the same SYMPOOL_DEVICE, and with auto a GPU on every rank (check "
                       "CUDA_VISIBLE_DEVICES)",
                       sp_backend_name(), cuda ? "host" : "cuda");
        goto fail;
    }
    if (worst[0]) {
        st = sp__error(SP_ERR_DEVICE, SP_SUB_BOOT,
                       "%s: no usable device (backend %s, %d devices); set SYMPOOL_DEBUG=INFO",
                       ok ? "another rank" : "this rank", sp_backend_name(), ndev);
        goto fail;
    }
    if (worst[1]) {
        st = sp__error(SP_ERR_INVALID_USAGE, SP_SUB_BOOT,
                       "%s: %d ranks on one node share %d GPU(s), and NCCL refuses two ranks of "
                       "one communicator on one GPU. Give each rank of a node its own GPU (ranks "
                       "take device local rank %% visible devices; check CUDA_VISIBLE_DEVICES), "
                       "start at most %d rank(s) per node (mpirun -np %d on one node, or "
                       "--map-by ppr:%d:node), or run the host backend (SYMPOOL_DEVICE=host)",
                       crowded ? "this node" : "another node", worst[1], worst[2], worst[2],
                       worst[2], worst[2]);
        goto fail;
    }
    if (w->local_size > gpus)
        SP_INFO(SP_SUB_BOOT, "%d ranks on this node share %d device(s)", w->local_size, gpus);

#if defined(SP_HAVE_NCCL)
    if (strcmp(sp_backend_name(), "cuda") == 0) {
        SP_CHECK_GOTO(nccl_bootstrap(w), st, fail);
        w->is_cuda = true;
    }
#endif
    SP_INFO(SP_SUB_BOOT,
            "world: rank %d of %d, local rank %d of %d on node %d of %d (%s), device %d, "
            "backend %s",
            w->rank, w->size, w->local_rank, w->local_size, w->node_of[w->rank], w->nnodes,
            w->node_name[w->node_of[w->rank]], w->device, sp_backend_name());
    pthread_mutex_lock(&s_lock);
    watched = watch_mpi_finalize_locked();
    w->next_live = s_live;
    s_live = w;
    __atomic_fetch_add(&s_live_gen, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&s_lock);
    if (watched)
        stay_loaded();
    scratch_free(&s);
    *world_p = w;
    return SP_SUCCESS;

fail:
    scratch_free(&s);
    /* A round abandoned on agree_comm may still be progressed by MPI: left allocated (a small
     * leak) rather than freed under it, as sp_world_finalize does. */
    if (w->agree_comm != MPI_COMM_NULL && !sp__agree_pending(w->agree_comm))
        MPI_Comm_free(&w->agree_comm);
    if (w->node_comm != MPI_COMM_NULL)
        MPI_Comm_free(&w->node_comm);
    if (w->comm != MPI_COMM_NULL)
        MPI_Comm_free(&w->comm);
    free(w->node_rank_of);
    free(w->node_of);
    free(w->node_name);
    pthread_mutex_destroy(&w->nccl_lock);
    pthread_mutex_destroy(&w->order_lock);
    pthread_cond_destroy(&w->order_cv);
    if (!no_world)
        free(w);
    return st;
}

SP_EXPORT sp_status_t sp_world_init(int *argc, char ***argv, sp_world_t **world_p) {
    SP_ARG_CHECK(world_p, SP_SUB_BOOT, "sp_world_init: world_p is NULL");
    SP_ARG_CHECK((argc == NULL) == (argv == NULL), SP_SUB_BOOT,
                 "sp_world_init: pass both argc and argv, or neither");
    if (sp__world_forked())
        return sp__world_fork_error("sp_world_init");
    __atomic_store_n(&s_used, true, __ATOMIC_SEQ_CST); /* before s_lock: see forked_child */
    int inited = 0, finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized)
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_BOOT,
                         "sp_world_init: MPI was already finalized in this process");
    pthread_mutex_lock(&s_lock);
    MPI_Initialized(&inited);
    if (!inited) {
        /* THREAD_MULTIPLE lets the user's threads call sympool's collectives (serialized per
         * pool); if the MPI library gives less we go on with what we got and say so. */
        int provided = MPI_THREAD_SINGLE;
        int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS) {
            pthread_mutex_unlock(&s_lock);
            return sp__world_mpi_status(rc, "MPI_Init_thread");
        }
        s_we_initialized_mpi = true;
        if (provided < MPI_THREAD_MULTIPLE)
            SP_INFO(SP_SUB_BOOT,
                    "MPI provides thread level %d, not MPI_THREAD_MULTIPLE: call "
                    "sympool's collectives from one thread at a time",
                    provided);
    }
    pthread_mutex_unlock(&s_lock);
    sp_world_t *w = NULL;
    sp_status_t st = world_create(MPI_COMM_WORLD, true, &w);
    /* A failed creation leaves MPI initialized (and ours: a later sp_world_init uses it, and the
     * finalize of its world finalizes it). MPI_Finalize is collective over the job (Open MPI
     * 4.1's waits in a PMIx fence for every process), so after a timeout, where a peer may
     * never come, finalizing here would wait for that peer instead of returning the error. */
    if (st != SP_SUCCESS)
        return st;
    pthread_mutex_lock(&s_lock);
    s_init_worlds++;
    pthread_mutex_unlock(&s_lock);
    *world_p = w;
    return st;
}

SP_EXPORT sp_status_t sp_world_from_comm(MPI_Comm comm, sp_world_t **world_p) {
    SP_ARG_CHECK(world_p, SP_SUB_BOOT, "sp_world_from_comm: world_p is NULL");
    if (sp__world_forked())
        return sp__world_fork_error("sp_world_from_comm");
    __atomic_store_n(&s_used, true, __ATOMIC_SEQ_CST); /* before any world lock */
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized)
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_BOOT,
                         "sp_world_from_comm: MPI is %s; initialize it first or use sp_world_init",
                         finalized ? "already finalized" : "not initialized");
    SP_ARG_CHECK(comm != MPI_COMM_NULL, SP_SUB_BOOT, "sp_world_from_comm: comm is MPI_COMM_NULL");
    /* A world is one group (its node split, rounds and collectives): an intercommunicator has
     * two, and Open MPI crashes splitting one by type. Local, the same answer on every rank. */
    int inter = 0;
    SP_CHECK(sp__world_mpi_status(MPI_Comm_test_inter(comm, &inter), "MPI_Comm_test_inter"));
    SP_ARG_CHECK(!inter, SP_SUB_BOOT,
                 "sp_world_from_comm: comm is an intercommunicator; a world needs an "
                 "intracommunicator (merge it with MPI_Intercomm_merge)");
    return world_create(comm, false, world_p);
}

/* Take w off the live list: the one finalize that succeeds here owns its teardown; a second
 * call (or a pointer that never was a world) is refused before anything is touched. */
static bool take_live(sp_world_t *w) {
    pthread_mutex_lock(&s_lock);
    bool live = false;
    for (sp_world_t **pp = &s_live; *pp; pp = &(*pp)->next_live)
        if (*pp == w) {
            *pp = w->next_live;
            live = true;
            __atomic_fetch_add(&s_live_gen, 1, __ATOMIC_RELEASE);
            break;
        }
    pthread_mutex_unlock(&s_lock);
    return live;
}

static void free_world(sp_world_t *w) {
    pthread_mutex_destroy(&w->nccl_lock);
    pthread_mutex_destroy(&w->order_lock);
    pthread_cond_destroy(&w->order_cv);
    free(w->node_rank_of);
    free(w->node_of);
    free(w->node_name);
    free(w);
}

SP_EXPORT sp_status_t sp_world_finalize(sp_world_t *w) {
    SP_ARG_CHECK(w, SP_SUB_BOOT, "sp_world_finalize: world is NULL");
    if (sp__world_forked())
        return sp__world_fork_error("sp_world_finalize"); /* the parent's world: not ours */
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized && !sp__in_callback()) {
        /* Nothing MPI can be undone any more; free what is ours and say what happened. */
        if (!take_live(w))
            return sp__world_check(w, "sp_world_finalize"); /* not a live world */
        /* Its communicator is never destroyed now; what was kept on it goes with the world. */
        sp_world_nccl_end_hook_t end = nccl_end_hook();
        if (end)
            (void)end(w, true);
        free_world(w);
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_BOOT,
                         "sp_world_finalize: MPI was finalized before the world; call "
                         "sp_world_finalize before MPI_Finalize");
    }
    /* Run the hooks while the world is still live (they make collective calls on it). */
    SP_CHECK(check_world(w, "sp_world_finalize", true));
    /* One finalize per world: a second call another thread makes meanwhile passed the check
     * above too, and running the hooks twice freed the pools' states twice. The claim is made
     * under s_lock while the world is live, so its memory is still there to read. */
    pthread_mutex_lock(&s_lock);
    bool claimed = is_live_locked(w) && !w->finalizing;
    char broken[sizeof w->broken_why] = "";
    if (claimed) {
        w->finalizing = true;
        memcpy(broken, w->broken_why, sizeof broken);
    }
    pthread_mutex_unlock(&s_lock);
    if (!claimed)
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_BOOT,
                         "sp_world_finalize: %p is not a live world (another call is finalizing "
                         "it, or did)",
                         (const void *)w);
    pthread_mutex_lock(&s_lock);
    int n = s_nhooks;
    sp_world_finalize_hook_t hooks[MAX_HOOKS];
    memcpy(hooks, s_hooks, sizeof hooks);
    pthread_mutex_unlock(&s_lock);
    /* Agree first, with the deadline: the hooks' collective work (the report, MPI_Win_free of
     * symmetric segments) blocks with no deadline of its own, so a late, gone or busy rank
     * must be known before any of it starts. Without that round a healthy rank waited forever
     * in MPI_Win_free for a peer that had left its broken pool to process exit. */
    sp_agree_t a = {.op = SP_AGREE_WORLD_FINALIZE, .ok = true};
    /* A broken world runs no round (its peers may be out of step on its communicators): it is
     * finalized locally, as a world out of step is, and says why. */
    sp_status_t st = broken[0] ? sp__error(SP_ERR_INVALID_USAGE, SP_SUB_BOOT,
                                           "sp_world_finalize: the world is broken (%s)", broken)
                               : sp__world_agree(w, &a, "sp_world_finalize");
    bool in_step = st == SP_SUCCESS;
    char first_msg[512] = "";
    if (!in_step)
        snprintf(first_msg, sizeof first_msg,
                 "%s; nothing collective was released (registered symmetric segments stay until "
                 "the process exits)",
                 sp_last_error());
    /* Hooks run while the communicators still work. The first failure is what finalize
     * returns; later hooks still let go of what is theirs. */
    for (int i = 0; i < n; i++) {
        sp_status_t h = hooks[i](w, in_step);
        if (h != SP_SUCCESS && st == SP_SUCCESS) {
            st = h;
            snprintf(first_msg, sizeof first_msg, "%s", sp_last_error());
        }
    }
    if (!take_live(w))
        return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_BOOT,
                         "sp_world_finalize: the world was finalized by another call meanwhile");

    sp_status_t s2;
    /* What a refused release kept (symmetric/): tried once more while the communicator is
     * there, then, once it is gone with its windows, freed. */
    sp_world_nccl_end_hook_t end = nccl_end_hook();
    if (end && (s2 = end(w, false)) != SP_SUCCESS && st == SP_SUCCESS) {
        st = s2;
        snprintf(first_msg, sizeof first_msg, "%s", sp_last_error());
    }
#if defined(SP_HAVE_NCCL)
    if (w->nccl_comm) {
        /* ncclCommDestroy waits for the peers; a world out of step aborts instead. */
        ncclComm_t nc = (ncclComm_t)w->nccl_comm;
        ncclResult_t r = in_step ? ncclCommDestroy(nc) : ncclCommAbort(nc);
        if (r != ncclSuccess && st == SP_SUCCESS) {
            st = nccl_status(r, NULL, in_step ? "ncclCommDestroy" : "ncclCommAbort");
            snprintf(first_msg, sizeof first_msg, "%s", sp_last_error());
        }
        /* NCCL 2.28.9's ncclCommDestroy fails only before it hands the communicator over to be
         * freed (src/init.cc: its group start, ncclCommEnsureReady, a calloc and the job's
         * launch; commReclaim, which frees it, returns success whatever it meets), so a failed
         * destroy leaves the communicator whole: aborted then, which frees it (its device
         * memory, proxy thread and sockets) without waiting for any peer. */
        if (r != ncclSuccess && in_step && ncclCommAbort(nc) != ncclSuccess)
            SP_WARN(SP_SUB_BOOT, "sp_world_finalize: ncclCommAbort after the failed "
                                 "ncclCommDestroy failed too; the communicator stays allocated");
        __atomic_store_n(&w->nccl_comm, NULL, __ATOMIC_RELEASE);
    }
#endif
    if (end && (s2 = end(w, true)) != SP_SUCCESS && st == SP_SUCCESS) {
        st = s2;
        snprintf(first_msg, sizeof first_msg, "%s", sp_last_error());
    }
    s2 = sp__world_mpi_status(MPI_Comm_free(&w->node_comm), "MPI_Comm_free(node)");
    if (st == SP_SUCCESS)
        st = s2;
    /* A duplicate abandoned on comm (sp__world_break) may still be progressed by MPI: comm is
     * left allocated then, as agree_comm below. */
    s2 = sp__agree_pending(w->comm)
             ? SP_SUCCESS
             : sp__world_mpi_status(MPI_Comm_free(&w->comm), "MPI_Comm_free");
    if (st == SP_SUCCESS)
        st = s2;
    /* A round abandoned at a timeout that no late rank completed: MPI may still progress it,
     * so its communicator is left allocated (a small leak, instead of a use after free). */
    if (sp__agree_pending(w->agree_comm))
        SP_WARN(SP_SUB_BOOT, "sp_world_finalize: an agreement round abandoned at a timeout is "
                             "still pending; its communicator is left allocated");
    else
        MPI_Comm_free(&w->agree_comm);
    /* MPI is finalized only when every rank agreed in time that it is finalizing: MPI_Finalize
     * waits for every process of the job (sp_world_init), so after a failed round, where a peer
     * may never come, it would wait for that peer instead of returning the error. MPI then stays
     * initialized and ours, for a later world's finalize (or the user) to finalize. */
    bool finalize_mpi = false;
    pthread_mutex_lock(&s_lock);
    if (w->from_init && --s_init_worlds == 0 && s_we_initialized_mpi && in_step) {
        s_we_initialized_mpi = false;
        finalize_mpi = true;
    }
    pthread_mutex_unlock(&s_lock);
    free_world(w);
    sp__log_set_rank(-1);
    if (finalize_mpi) {
        s2 = sp__world_mpi_status(MPI_Finalize(), "MPI_Finalize");
        if (st == SP_SUCCESS)
            st = s2;
    }
    if (first_msg[0]) /* the first failure's text, which later steps may have overwritten */
        (void)sp__error_quiet(st, SP_SUB_BOOT, "%s", first_msg);
    return st;
}

/* ---- accessors (NULL-safe) ---------------------------------------------------------------- */

/* A finalized world's memory is freed: the accessors look the pointer up among the live worlds
 * before reading it, so a stale pointer answers like NULL instead of reading freed memory. */
static const sp_world_t *live_or_null(const sp_world_t *w) {
    if (!w || sp__world_forked()) /* no world is live in a fork child (sp__world_forked) */
        return NULL;
    pthread_mutex_lock(&s_lock);
    bool live = is_live_locked(w);
    pthread_mutex_unlock(&s_lock);
    return live ? w : NULL;
}

SP_EXPORT int sp_world_rank(const sp_world_t *w) {
    w = live_or_null(w);
    return w ? w->rank : -1;
}
SP_EXPORT int sp_world_size(const sp_world_t *w) {
    w = live_or_null(w);
    return w ? w->size : 0;
}
SP_EXPORT int sp_world_local_rank(const sp_world_t *w) {
    w = live_or_null(w);
    return w ? w->local_rank : -1;
}
SP_EXPORT int sp_world_device(const sp_world_t *w) {
    w = live_or_null(w);
    return w ? w->device : -1;
}
SP_EXPORT int sp_world_local_size(const sp_world_t *w) {
    w = live_or_null(w);
    return w ? w->local_size : 0;
}
SP_EXPORT int sp_world_node_count(const sp_world_t *w) {
    w = live_or_null(w);
    return w ? w->nnodes : 0;
}
SP_EXPORT int sp_world_node(const sp_world_t *w, int rank) {
    w = live_or_null(w);
    if (!w || rank < 0 || rank >= w->size)
        return -1;
    return w->node_of[rank];
}
SP_EXPORT const char *sp_world_node_name(const sp_world_t *w, int node) {
    w = live_or_null(w);
    if (!w || node < 0 || node >= w->nnodes)
        return NULL;
    return w->node_name[node];
}

MPI_Comm sp__world_comm(const sp_world_t *w) {
    return w ? w->comm : MPI_COMM_NULL;
}
MPI_Comm sp__world_node_comm(const sp_world_t *w) {
    return w ? w->node_comm : MPI_COMM_NULL;
}
int sp__world_local_size(const sp_world_t *w) {
    return w ? w->local_size : 0;
}
void *sp__world_nccl_comm(const sp_world_t *w) {
    /* Read without nccl_lock too (whether the world still has it): an abort stores NULL. */
    return w ? __atomic_load_n(&w->nccl_comm, __ATOMIC_ACQUIRE) : NULL;
}
bool sp__world_is_cuda(const sp_world_t *w) {
    return w && w->is_cuda;
}

int sp__world_node_rank_of(const sp_world_t *w, int world_rank) {
    if (!w || world_rank < 0 || world_rank >= w->size)
        return -1;
    return w->node_rank_of[world_rank];
}

void sp__world_count_collective(sp_world_t *w, bool eligible) {
    if (w)
        __atomic_add_fetch(eligible ? &w->coll_eligible : &w->coll_fallback, 1, __ATOMIC_RELAXED);
}

void sp__world_collective_counts(const sp_world_t *w, uint64_t *eligible_p, uint64_t *fallback_p) {
    *eligible_p = w ? __atomic_load_n(&w->coll_eligible, __ATOMIC_RELAXED) : 0;
    *fallback_p = w ? __atomic_load_n(&w->coll_fallback, __ATOMIC_RELAXED) : 0;
}

void sp__world_set_nccl_symmetric(sp_world_t *w, bool on, const char *why) {
    if (!w)
        return;
    /* The first answer stands, as NCCL's own stands from the communicator's creation; the text
     * is written before the state that publishes it, by the one caller that claimed it. */
    int unknown = 0, claimed = 3;
    if (!__atomic_compare_exchange_n(&w->nccl_sym, &unknown, claimed, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        /* Another thread's growth claimed it: wait the few instructions until it publishes, so
         * that this caller's sp__world_nccl_no_symmetric reads the answer that stands, not "on"
         * while the claimer is about to say "off" (two pools growing at once). */
        while (__atomic_load_n(&w->nccl_sym, __ATOMIC_ACQUIRE) == claimed)
            sched_yield();
        return;
    }
    if (!on)
        snprintf(w->nccl_sym_why, sizeof w->nccl_sym_why,
                 "NCCL has no symmetric support in this world (%s): its windows are local "
                 "buffer registrations",
                 why && *why ? why : "unknown reason");
    __atomic_store_n(&w->nccl_sym, on ? 1 : 2, __ATOMIC_RELEASE);
}

const char *sp__world_nccl_no_symmetric(const sp_world_t *w) {
    return w && __atomic_load_n(&w->nccl_sym, __ATOMIC_ACQUIRE) == 2 ? w->nccl_sym_why : NULL;
}

uint64_t sp__world_next_pool_serial(sp_world_t *w) {
    return w ? ++w->pool_serial : 0;
}

void sp__world_set_pool_serial(sp_world_t *w, uint64_t serial) {
    if (w)
        w->pool_serial = serial;
}
