/*
 * sym_state.h: the per-pool state of a symmetric MemPool, shared by the agreement protocol
 * (symmetric.c) and the collective release paths (sym_release.c). Internal to symmetric/.
 *
 * Lifetime: a state is created by sp_symmetric_mempool_create and lives in a process-wide
 * registry until sp_symmetric_mempool_destroy or the world's finalize hook frees it. Because
 * the pool may outlive it (a pool never destroyed collectively, released by sp_shutdown after
 * sp_world_finalize), every entry point finds its state through the registry (sp__sym_acquire)
 * instead of trusting the pointer the pool holds.
 *
 * Locking: `lock` serializes this rank's calls on the pool (collective calls must in any case be
 * made in the same order on every rank). The allocator callbacks run under the device
 * allocator's lock, inside sp__pool_sym_grow / sp__pool_release_segment, on the thread that
 * holds `lock`; they touch only the fields marked (lock).
 */
#ifndef SP_SYM_STATE_H
#define SP_SYM_STATE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "symmetric/registrar.h"
#include "sympool/symmetric.h"

/* One registered segment, kept in creation order (identical on every rank). */
typedef struct sp_sym_rec {
    sp_sym_seg_t seg;        /* what the registrar made */
    uint64_t seq;            /* the pool's segment sequence number; UINT64_MAX until known */
    bool orphan;             /* the pool let go of it outside a collective release */
    struct sp_sym_rec *next; /* creation order */
} sp_sym_rec_t;

/* A nonblocking collective abandoned at a timeout: its buffers must outlive it. */
typedef struct sp_sym_grave {
    MPI_Request req;           /* never completed when abandoned */
    void *buf;                 /* send+receive buffers the request may still write */
    struct sp_sym_grave *next; /* graveyard list (s_reg_lock) */
} sp_sym_grave_t;

typedef struct sp_sym_state {
    struct sp_sym_state *next;     /* registry list (registry lock) */
    sp_world_t *world;             /* the world it was created on */
    sp_mempool_t *pool;            /* the MemPool (pool/ owns it) */
    const sp_registrar_ops_t *reg; /* nccl or mpi */
    MPI_Comm comm;                 /* private duplicate of the world communicator */
    int device;                    /* the world's device */
    int rank;                      /* world rank */
    uint64_t serial;               /* creation number on this world, identical on every rank */
    char name[64];                 /* for messages ("" if unnamed) */
    pthread_mutex_t lock;          /* serializes this rank's calls on the pool */
    uint64_t callno;               /* sp_symmetric_malloc calls on this rank (lock) */
    bool in_grow;                  /* inside sp__pool_sym_grow for us (lock) */
    bool grow_called;              /* the alloc callback ran during this growth (lock) */
    sp_status_t grow_status;       /* why the alloc callback returned NULL (lock) */
    char grow_why[200];            /* its message (sp_last_error is overwritten by pool/) */
    bool in_release;               /* inside a collective release (lock) */
    sp_status_t release_status;    /* first registrar failure of that release (lock) */
    sp_sym_rec_t *recs;            /* registered segments, creation order (lock) */
    bool broken;                   /* a collective timed out: no further collective calls */
    char broken_why[160];          /* the timeout message, repeated to later callers */
    int64_t sbuf[16];              /* send buffer of the agreement rounds (lock) */
    int64_t rbuf[16];              /* receive buffer of the agreement rounds (lock) */
} sp_sym_state_t;

/* Find the live state of `pool` and lock it; NULL (with sp__error) when pool is not a live
 * symmetric pool. Release with sp__sym_release_state. */
sp_status_t sp__sym_acquire(const sp_mempool_t *pool, const char *fn, sp_sym_state_t **st_p);
void sp__sym_release_state(sp_sym_state_t *st);

/* Registry (sym_release.c). */
void sp__sym_register(sp_sym_state_t *st);
void sp__sym_unregister(sp_sym_state_t *st);
/* Is `st` a live state? Caller holds nothing; answer valid while the state's owner runs. */
bool sp__sym_is_live(const sp_sym_state_t *st);

/* Agreement with a deadline: MPI_Iallreduce(sbuf -> rbuf) on comm, polled until done or
 * SYMPOOL_SYM_TIMEOUT. On expiry returns SP_ERR_TIMEOUT with "<what>: ..." and, if st is
 * given, marks it broken. `heap` (may be NULL) is a buffer the request uses that must be
 * kept alive on timeout; on success the caller still owns it. */
sp_status_t sp__sym_agree(sp_sym_state_t *st, MPI_Comm comm, const void *sbuf, void *rbuf,
                          int count, MPI_Datatype type, MPI_Op op, void *heap, const char *what);
/* A barrier with the same deadline. */
sp_status_t sp__sym_barrier(sp_sym_state_t *st, MPI_Comm comm, const char *what);

/* Release every registered segment still recorded, in creation order (collective over `comm`,
 * which the nccl registrar's barrier uses). */
sp_status_t sp__sym_release_recs(sp_sym_state_t *st, MPI_Comm comm);

/* The allocator callbacks the pool calls (symmetric.c). */
void *sp__sym_seg_alloc(size_t size, int device, void *stream, void *ctx);
void sp__sym_seg_free(void *ptr, size_t size, int device, void *stream, void *ctx);

#endif /* SP_SYM_STATE_H */
