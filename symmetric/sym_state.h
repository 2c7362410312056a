/*
 * sym_state.h: the per-pool state of a symmetric MemPool, shared by the agreement protocol
 * (symmetric.c), the rounds and registry (sym_round.c), the collective release paths
 * (sym_release.c) and the queries (sym_query.c). Internal to symmetric/.
 *
 * Lifetime: a state is created by sp_symmetric_mempool_create and lives in a process-wide
 * registry until sp_symmetric_mempool_destroy or the world's finalize hook retires it; a retired
 * state's memory stays while a call that found it may still hold it (sp__sym_retire). Because
 * the pool may outlive it (a pool never destroyed collectively, released by sp_shutdown after
 * sp_world_finalize), every entry point finds its state through the registry (sp__sym_acquire)
 * instead of trusting the pointer the pool holds.
 *
 * Locking: `lock` serializes this rank's calls on the pool (collective calls must in any case be
 * made in the same order on every rank) and is held across their agreement rounds and the
 * registrar's work; it is this pool's alone, so no other pool and no sp_malloc/sp_free waits
 * for it. No pool or device lock is ever held while ranks wait for each other: growth and
 * release call pool/ only for short locked steps (plan, adopt, detach). `recs_lock` guards the
 * list of registered segments alone and is held for short steps only (link, unlink, a lookup):
 * the local queries (sp_symmetric_window, sp_symmetric_peer_ptr, and the window probe of every
 * collective) take it and never `lock`, so they answer while a call on the pool waits for a late
 * rank (with `lock` they waited for it, and a collective whose peers had already gone on to the
 * data transfer left that call to time out). Order: `lock`, then the device lock, then
 * `recs_lock`; under `recs_lock` only leaf locks are taken (sp_symmetric_peer_ptr's answer asks the
 * world's live list, as every sp_world_* accessor does, logs, and makes MPI's local
 * MPI_Win_shared_query), never `lock`, a device lock or the world's NCCL lock (a registrar's
 * release runs after the record is unlinked). The allocator callbacks (only the orphan notice,
 * sp__sym_seg_free) run under the device lock and touch `recs` only.
 */
#ifndef SP_SYM_STATE_H
#define SP_SYM_STATE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "world/world.h"
#include "symmetric/registrar.h"
#include "sympool/symmetric.h"

/* One registered segment, kept in creation order (identical on every rank). */
typedef struct sp_sym_rec {
    sp_sym_seg_t seg;        /* what the registrar made */
    uint64_t seq;            /* the pool's segment sequence number (from the adopt) */
    bool orphan;             /* the pool let go of it outside a collective release */
    struct sp_sym_rec *next; /* creation order */
} sp_sym_rec_t;

typedef struct sp_sym_state {
    struct sp_sym_state *next;     /* registry list (registry lock) */
    sp_world_t *world;             /* the world it was created on */
    sp_mempool_t *pool;            /* the MemPool (pool/ owns it) */
    const sp_registrar_ops_t *reg; /* nccl or mpi */
    MPI_Comm comm;                 /* private duplicate of the world communicator: this pool's
                                      agreement rounds and its registrar's collectives */
    MPI_Comm node_comm;            /* this pool's own node communicator (shared windows), so two
                                      pools growing at once never interleave on one */
    int device;                    /* the world's device */
    int rank;                      /* world rank */
    uint64_t serial;               /* creation number on this world, identical on every rank */
    char name[64];                 /* for messages ("" if unnamed) */
    pthread_mutex_t lock;          /* serializes this rank's calls on the pool */
    uint64_t callno;               /* collective calls on this pool on this rank (lock) */
    pthread_mutex_t recs_lock;     /* guards recs' links (short steps only, see above) */
    sp_sym_rec_t *recs;            /* registered segments, creation order (changed under lock
                                      and recs_lock both; read under either) */
    bool broken;                   /* a collective timed out: no further collective calls */
    bool abandoned;                /* a round of ours is still pending on comm: never free it */
    char broken_why[256];          /* what timed out, repeated to later callers */
} sp_sym_state_t;

/* Find the live state of `pool` and lock it; NULL (with sp__error) when pool is not a live
 * symmetric pool. Release with sp__sym_release_state. */
sp_status_t sp__sym_acquire(const sp_mempool_t *pool, const char *fn, sp_sym_state_t **st_p);
void sp__sym_release_state(sp_sym_state_t *st);

/* Registry (sym_round.c). */
void sp__sym_register(sp_sym_state_t *st);
void sp__sym_unregister(sp_sym_state_t *st);
/* Clear st->pool (under the state's lock, at its destroy): under the registry's lock too, as
 * sp__sym_find reads it under that lock alone. */
void sp__sym_forget_pool(sp_sym_state_t *st);
/* Is `st` a live state? Caller holds nothing; answer valid while the state's owner runs. */
bool sp__sym_is_live(const sp_sym_state_t *st);
/* The live state of `pool`, or NULL; the caller locks it before use. */
sp_sym_state_t *sp__sym_find(const sp_mempool_t *pool);
/* The live states of world `w`, oldest first (lowest serial: the same order on every rank), in
 * a new array (caller frees; NULL when none). False when out of host memory. */
bool sp__sym_of_world(const sp_world_t *w, sp_sym_state_t ***v_p, size_t *n_p);

/* Test hook: seconds the calling thread sleeps at the start of each growth, before its first
 * round (0: none), so a test can make one rank late inside a growth. Thread-local. */
extern _Thread_local double sp__sym_test_grow_delay_s;
/* Test hook (sp__sym_test_fail_host): the calling thread's symmetric calls find no host memory
 * for their own state (create's pool state, the free-segment rounds' bitmap). Thread-local. */
extern _Thread_local bool sp__sym_test_no_host;

/* A destroyed pool's state, kept (its memory and locks) while a call may still hold it:
 * another thread may have found it just before the destroy and still be waiting for its lock.
 * Such a call is counted from before its lookup (sp__sym_enter) until it has checked the state
 * under its lock, or let go of recs_lock (sp__sym_leave); sp__sym_retire frees every retired
 * state when none is, and sp__sym_free_retired(world) the world's rest at its finalize (when
 * none is either: else the next retire that sees none frees them). The world's finalize hook is
 * counted too, from its listing of the world's states until it has checked each under its lock,
 * since another thread's destroy may retire one meanwhile. */
void sp__sym_enter(void);
void sp__sym_leave(void);
void sp__sym_retire(sp_sym_state_t *st);
void sp__sym_free_retired(const sp_world_t *w);
/* How many retired states are kept (tests). */
size_t sp__sym_retired_count(void);

/* One agreement round on the pool's communicator, numbered with the pool's current call
 * (sp__agree + sp__agree_check). A timeout breaks the pool (later collective calls are refused
 * with the saved reason); a mismatch resynchronizes the call number to the largest, so the pool
 * stays usable. */
sp_status_t sp__sym_round(sp_sym_state_t *st, sp_agree_t *a, const char *what);
/* The free-segment bitmap's follow-up round (sp__agree_band_buf), with the same timeout rule:
 * buf (heap, 2 * words words, allocated before the first round) holds the input in its first
 * half and, on SP_SUCCESS, the result in its second (the caller frees it); on failure buf is
 * gone (freed, or kept with an abandoned request). */
sp_status_t sp__sym_band(sp_sym_state_t *st, uint64_t *buf, size_t words, const char *what);

/* A deadline-bounded all-gather of `bytes` bytes per rank over the pool's node communicator
 * (sp__agree_gather_buf), with the same timeout rule as a round (a peer that never arrives breaks
 * the pool): buf (heap, (node ranks + 1) * bytes, allocated before the round that precedes it)
 * holds the input in its first `bytes` and, on SP_SUCCESS, the node's ranks' after it (the caller
 * frees it); on failure buf is gone (freed, or kept with an abandoned request). */
sp_status_t sp__sym_node_gather(sp_sym_state_t *st, char *buf, size_t bytes, const char *what);

/* Release every registered segment still recorded, in creation order (collective). */
sp_status_t sp__sym_release_recs(sp_sym_state_t *st);

/* The allocator callbacks the pool calls (symmetric.c). */
void *sp__sym_seg_alloc(size_t size, int device, void *stream, void *ctx);
void sp__sym_seg_free(void *ptr, size_t size, int device, void *stream, void *ctx);

#endif /* SP_SYM_STATE_H */
