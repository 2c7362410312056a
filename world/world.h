/*
 * world/world.h: the world's internals that symmetric/ and collectives/ use: world.c owns the
 * world, agree.c the agreement round every collective call makes.
 */
#ifndef SP_WORLD_INT_H
#define SP_WORLD_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <mpi.h>

#include "sympool/world.h"

#ifdef __cplusplus
extern "C" {
#endif

MPI_Comm sp__world_comm(const sp_world_t *w);      /* duplicate of the user's communicator */
MPI_Comm sp__world_node_comm(const sp_world_t *w); /* ranks sharing this node (shared memory) */
int sp__world_local_size(const sp_world_t *w);
/* The NCCL communicator (ncclComm_t) on the cuda backend, NULL elsewhere. */
void *sp__world_nccl_comm(const sp_world_t *w);
bool sp__world_is_cuda(const sp_world_t *w);
/* Serialize this process's NCCL calls on the world's communicator (NCCL forbids using one
 * communicator from two threads at once). Held across the NCCL call only: never across an MPI
 * agreement, so a rank waiting for its peers' rounds never holds it. An NCCL call itself can
 * wait for the peers' inside NCCL; the calls that do come in one order on every rank (the
 * turns and the gate below). */
void sp__world_nccl_lock(sp_world_t *w);
void sp__world_nccl_unlock(sp_world_t *w);
/* Abort the world's NCCL communicator (ncclCommAbort, never ncclCommDestroy on an error path:
 * it could wait for peers); later NCCL calls on the world fail with `why`. Takes nccl_lock. */
void sp__world_nccl_abort(sp_world_t *w, const char *why);
/* The order of NCCL window registrations (and of deregistrations, which change where NCCL places
 * the next window: symmetric/reg_nccl.c) on the world's communicator. ncclCommWindowRegister
 * is collective (every rank, in the same order) and waits inside NCCL for the peers, so the
 * order is agreed before any rank holds a lock: world rank 0 hands out tickets (0, 1, 2, ...:
 * sp__world_nccl_ticket, rank 0 only) once every rank has reached the registration, the
 * registration's agreement round carries the ticket to every rank, and every rank issues the
 * registrations in ticket order (sp__world_nccl_wait_turn, then the NCCL call under
 * nccl_lock, then sp__world_nccl_end_turn, also for a registration agreed away). A turn that
 * never comes is SYMPOOL_SYM_TIMEOUT's error; after sp__world_nccl_order_break (an abort, or a
 * ticket this rank could not learn) every wait fails at once with the reason. order_lock is a
 * leaf lock held for short steps only. */
uint64_t sp__world_nccl_ticket(sp_world_t *w);
sp_status_t sp__world_nccl_wait_turn(sp_world_t *w, uint64_t ticket, const char *what);
void sp__world_nccl_end_turn(sp_world_t *w, uint64_t ticket);
void sp__world_nccl_order_break(sp_world_t *w, const char *why);
/* The gate that puts the world's NCCL collectives in one order with a registration on every
 * rank. Both wait inside NCCL for the peers (the registration always, a collective at least when
 * NCCL 2.28 makes its connections at its first use of an algorithm: src/enqueue.cc:453,
 * src/group.cc:149), each holding its rank's nccl_lock: ordered by that lock alone, a rank whose
 * collective took it first and a rank whose registration did wait for each other for good. So a
 * collective passes the gate (sp__world_nccl_coll_enter; sp__world_nccl_coll_leave once out of
 * its NCCL call) before it asks for nccl_lock, and the registration, once every rank holds its
 * turn (so no rank still waits for its lock in an earlier turn), closes the gate
 * (sp__world_nccl_gate_close: this rank's collectives past it so far), the ranks agree on the
 * largest such count n, and each lets its collectives through up to the n-th and waits until
 * they are out of NCCL (sp__world_nccl_gate_drain; SP_ERR_TIMEOUT past SYMPOOL_SYM_TIMEOUT)
 * before it registers: the first n collectives come before the registration on every rank, the
 * others after (sp__world_nccl_gate_open, once the registration's outcome is known). The
 * world's NCCL collectives are one sequence on every rank (the caller orders them), so the n-th
 * is the same call everywhere. */
void sp__world_nccl_coll_enter(sp_world_t *w);
void sp__world_nccl_coll_leave(sp_world_t *w);
uint64_t sp__world_nccl_gate_close(sp_world_t *w);
sp_status_t sp__world_nccl_gate_drain(sp_world_t *w, uint64_t n, const char *what);
void sp__world_nccl_gate_open(sp_world_t *w);
/* Tests: a hook run by sp__world_nccl_gate_drain before it lets collectives through. */
void sp__world_nccl_test_at_drain(void (*hook)(void));
/* Why the world has no NCCL communicator ("aborted after: ..."). */
const char *sp__world_nccl_why(const sp_world_t *w);

/* Modules above world/ (collectives: the SYMPOOL_REPORT table; symmetric: registered segments)
 * register work to run in sp_world_finalize, after every rank agreed (with the deadline) that it
 * is finalizing. `in_step` is false when that round failed (a rank is late, gone, or in another
 * call): a hook must then make no collective call and only let go of what is local. A hook
 * returns what it could not do (its message set); finalize returns the first such status. At
 * most 8 hooks; SP_ERR_INTERNAL past that. Registered from a library constructor, so it is
 * thread-safe by construction, and the order is the same on every rank. */
typedef sp_status_t (*sp_world_finalize_hook_t)(sp_world_t *w, bool in_step);
sp_status_t sp__world_on_finalize(sp_world_finalize_hook_t hook);

/* One module above world/ (symmetric/'s nccl registrar: what a refused release kept) may also
 * run work around the end of the world's NCCL communicator in sp_world_finalize: after the
 * finalize hooks, right before ncclCommDestroy/ncclCommAbort (`gone` false, the communicator
 * still there unless an abort took it earlier), and right after it (`gone` true: the
 * communicator is gone, or on a world finalized after MPI_Finalize will never be destroyed, and
 * the world's memory goes next). Local work only, no collective call. Its status is finalize's
 * when nothing failed before. Registered once, from a library constructor; SP_ERR_INTERNAL for
 * a second. */
typedef sp_status_t (*sp_world_nccl_end_hook_t)(sp_world_t *w, bool gone);
sp_status_t sp__world_on_nccl_end(sp_world_nccl_end_hook_t hook);

/* MPI finalized while sympool's worlds were live (the user called MPI_Finalize first): every
 * collective call must then be refused, never enter MPI (Open MPI aborts the process for a call
 * after MPI_Finalize). MPI tells us as its MPI_Finalize starts: the world keeps an attribute on
 * MPI_COMM_SELF, whose delete callback runs first thing in MPI_Finalize. The flag is set there;
 * sp__world_check refuses every world from then on. `notice`s (at most 4, registered from a
 * library constructor) run there too, so that a module can drop its own caches (symmetric/
 * makes its pools' calls look them up again). */
bool sp__world_mpi_gone(void);
sp_status_t sp__world_on_mpi_gone(void (*notice)(void));

/* This process is a fork() child of one that had started a world call (sp_world_init or
 * sp_world_from_comm): MPI and NCCL communicators do not survive fork(), and the world's and the
 * symmetric pools' locks may have been held by other threads at the fork, some of them across a
 * wait for other ranks (so no fork handler may wait for them). Every world, symmetric and
 * collective entry point asks first and refuses with sp__world_fork_error, before it takes any
 * lock of its layer. A relaxed load; set by world.c's pthread_atfork child handler. */
bool sp__world_forked(void);
/* SP_ERR_INVALID_USAGE naming fn and saying the above (logged, last error set). */
sp_status_t sp__world_fork_error(const char *fn);

/* Rank of world rank `world_rank` in the node communicator, -1 if it is on another node (or out
 * of range). Local: the table is computed once at world creation. */
int sp__world_node_rank_of(const sp_world_t *w, int world_rank);

/* Per-world counts of collectives (with data to move) whose buffers could use symmetric kernels
 * (both in registered symmetric segments, and on cuda a call NCCL's symmetric kernels take)
 * and of those that could not. Thread-safe (atomic). */
void sp__world_count_collective(sp_world_t *w, bool eligible);
void sp__world_collective_counts(const sp_world_t *w, uint64_t *eligible_p, uint64_t *fallback_p);

/* Whether NCCL runs symmetric kernels on this world's windows at all (its comm->symmetricSupport,
 * which 2.28 offers no query for): the nccl registrar infers it at its first window and says so
 * here; the first answer stands for the world's life, as NCCL's does from the communicator's
 * creation. sp__world_nccl_no_symmetric: NULL while on or not known yet, else a sentence saying
 * why not. Thread-safe (atomic). */
void sp__world_set_nccl_symmetric(sp_world_t *w, bool on, const char *why);
const char *sp__world_nccl_no_symmetric(const sp_world_t *w);

/* A per-world counter of symmetric pool creations (symmetric/ checks that every rank calls
 * sp_symmetric_mempool_create the same number of times). Returns the new value (from 1). */
uint64_t sp__world_next_pool_serial(sp_world_t *w);
/* Set the count of pool creations that counted on this rank: the last number every rank agreed
 * on (a create whose agreement round failed, with ranks in other calls, did not count). */
void sp__world_set_pool_serial(sp_world_t *w, uint64_t serial);

/* Translate an MPI return code: SP_SUCCESS for MPI_SUCCESS, else sp__error(SP_ERR_MPI) naming
 * `fn` (the sympool call, may be NULL), `what` (the MPI call) and MPI_Error_string's text,
 * logged under `subsys`. The one place MPI errors become sympool errors (mpi_error.c). */
sp_status_t sp__mpi_status_at(int rc, unsigned subsys, const char *fn, const char *what,
                              const char *file, int line);
#define sp__mpi_status(rc, subsys, fn, what)                                                       \
    sp__mpi_status_at((rc), (subsys), (fn), (what), __FILE__, __LINE__)
/* The world's own MPI calls (subsystem BOOT, no sympool call named). */
#define sp__world_mpi_status(rc, what) sp__mpi_status((rc), SP_SUB_BOOT, NULL, (what))

/* ---- agreement rounds (agree.c) ------------------------------------------------------- */

/* What every collective sympool call agrees on first; the op names both sides of a mix-up. */
typedef enum sp_agree_op {
    SP_AGREE_NONE,
    SP_AGREE_POOL_CREATE,
    SP_AGREE_SYM_MALLOC,
    SP_AGREE_SYM_GROW,
    SP_AGREE_SYM_REGISTER,
    SP_AGREE_SYM_EMPTY_CACHE,
    SP_AGREE_SYM_DESTROY,
    SP_AGREE_ALLREDUCE,
    SP_AGREE_ALLGATHER,
    SP_AGREE_REDUCE_SCATTER,
    SP_AGREE_BROADCAST,
    SP_AGREE_STATS_AGGREGATE,
    SP_AGREE_STATS_REPORT,
    SP_AGREE_NCCL_READY,
    SP_AGREE_SYM_RELEASE,
    SP_AGREE_WORLD_FINALIZE,
    SP_AGREE_FINALIZE_REPORT,
    SP_AGREE_WORLD_CREATE,
    SP_AGREE_POOL_COMMS,
    SP_AGREE_OP_COUNT
} sp_agree_op_t;

#define SP_AGREE_NF 8            /* operation fields per round */
#define SP_AGREE_SET_WORDS 4     /* ranks 0..255 are named individually in the "not ok" set */
#define SP_AGREE_PAYLOAD_MAX 64  /* bytes of data a round can carry (sp__agree_carries_payload) */
#define SP_AGREE_P2P_MAX_RANKS 8 /* worlds up to this size agree point to point (agree.c) */

/* One agreement round: the caller fills the inputs; sp__agree fills the outputs. */
typedef struct sp_agree {
    /* in */
    int64_t op;             /* sp_agree_op_t */
    uint64_t callno;        /* this call's number on the communicator (from 1) */
    bool ok;                /* this rank's own checks passed */
    int64_t f[SP_AGREE_NF]; /* operation fields, compared across ranks */
    /* Names the call for messages when sp__agree's `what` is NULL: formatting the name costs
     * more than a cache hit's bookkeeping, so it is done only on an error path. */
    const char *(*describe)(const void *ctx, char *buf, size_t n);
    const void *describe_ctx;
    /* Optional data that travels with the round where sp__agree_carries_payload says so (a
     * small collective's whole input): payload_bytes <= SP_AGREE_PAYLOAD_MAX, and `gathered`
     * (a slot of SP_AGREE_PAYLOAD_MAX bytes per rank, rank order) receives the first
     * payload_bytes of every rank's slot. A peer's is meaningful only when the round says every
     * rank passed its checks with the same fields (so the same length); otherwise its slot may
     * hold anything. */
    const void *payload;
    size_t payload_bytes;
    void *gathered;
    /* out */
    int64_t op_lo, op_hi;                     /* smallest and largest op over ranks */
    uint64_t call_lo, call_hi;                /* smallest and largest call number */
    int64_t lo[SP_AGREE_NF], hi[SP_AGREE_NF]; /* min and max of each field */
    int nbad;                                 /* ranks whose ok was false */
    int bad_lo;                               /* the lowest of them, -1 if none */
    uint64_t bad_set[SP_AGREE_SET_WORDS];     /* ranks < 256 whose ok was false */
    int late_rank;                            /* the rank with the earliest deadline */
    int64_t post;        /* when this rank's record went out (ns of CLOCK_REALTIME; agree.c's) */
    int64_t latest_post; /* the latest entry over the ranks */
    int64_t min_span;    /* the shortest deadline - entry over the ranks (INT64_MAX: none) */
    bool late;           /* some rank entered too close to the earliest deadline (SP_ERR_TIMEOUT) */
    bool payload_gathered; /* `gathered` was filled (a payload was sent) */
} sp_agree_t;

/* One deadline-bounded agreement round over comm (collective; every round has this shape).
 * SP_SUCCESS: the outputs are filled; check them with sp__agree_check. SP_ERR_TIMEOUT: this
 * rank's deadline passed (*abandoned_p: its request stays pending on comm, which must then never
 * be freed) or the round completed after another rank's deadline. SP_ERR_MPI, SP_ERR_SYSTEM. */
sp_status_t sp__agree(MPI_Comm comm, sp_agree_t *a, const char *what, bool *abandoned_p);
/* sp__agree for a caller that knows this rank's rank in comm and comm's size (a world, a
 * symmetric pool): no MPI call to ask. */
sp_status_t sp__agree_ranked(MPI_Comm comm, int rank, int size, sp_agree_t *a, const char *what,
                             bool *abandoned_p);
/* Do rounds on comm carry a payload (small worlds, which exchange records point to point)? */
bool sp__agree_carries_payload(MPI_Comm comm);
/* The call's name: `what`, else a->describe's. */
const char *sp__agree_name(const sp_agree_t *a, const char *what, char *buf, size_t n);
/* SP_ERR_MISMATCH (naming both operations or call numbers) unless every rank was in the same op
 * and call. Local. */
sp_status_t sp__agree_check(const sp_agree_t *a, const char *what);
/* "1, 3 and 4": the ranks whose ok was false. */
const char *sp__agree_bad_ranks(const sp_agree_t *a, char *buf, size_t len);
const char *sp__agree_op_name(int64_t op);
/* SYMPOOL_SYM_TIMEOUT in seconds; 0 when there is no deadline. */
double sp__agree_timeout_s(void);
/* A deadline-bounded in-place MPI_BAND allreduce of `words` 64-bit words: the follow-up round
 * of an operation whose first round already agreed on its length (the free-segment bitmap),
 * on a buffer the caller allocated before its first round (so that a rank that cannot allocate
 * says so in that round, instead of leaving its peers to time out in this one):
 * buf holds 2 * words words, the input in the first half; the result lands in the second.
 * *abandoned_p: buf went to the graveyard with the pending request; the caller must not free
 * it. Otherwise the caller frees it. */
sp_status_t sp__agree_band_buf(MPI_Comm comm, uint64_t *buf, size_t words, const char *what,
                               bool *abandoned_p);
/* A deadline-bounded MPI_Allgather of `bytes` bytes from every rank of comm, for a step that
 * follows rounds whose outcome can differ between ranks near the deadline (a rank that failed
 * the round before never posts its part): buf (heap, allocated before that round, so that a
 * rank without it says so in the round) holds this rank's input in its first `bytes` and, on
 * SP_SUCCESS, every rank's in rank order after it (buf + bytes + r * bytes). A peer that never
 * arrives is SP_ERR_TIMEOUT. *abandoned_p: buf went to the graveyard with the pending request
 * (comm must then never be freed while sp__agree_pending says so); the caller must not free
 * it. Otherwise the caller frees it. */
sp_status_t sp__agree_gather_buf(MPI_Comm comm, char *buf, size_t bytes, const char *what,
                                 bool *abandoned_p);
/* A deadline-bounded MPI_Comm_idup of comm into *out (MPI_COMM_NULL unless SP_SUCCESS):
 * collective over comm, so a rank that never makes the call, or makes it on another
 * communicator, is SP_ERR_TIMEOUT on the ranks that wait for it (*abandoned_p: the duplicate
 * stays pending on comm). */
sp_status_t sp__agree_dup(MPI_Comm comm, MPI_Comm *out, const char *what, bool *abandoned_p);
/* Tests only: the calling thread's agreement rounds find no host memory for a new round buffer
 * or duplicate cell (as malloc refusing it would), so they use a spare. */
void sp__agree_test_fail_host(bool on);
/* Tests only: world creation waits this long (seconds; 0: not at all, the default) between its
 * two duplicates of the communicator, as a rank descheduled there would. */
void sp__world_test_pause_between_dups(double seconds);
/* Tests only: world creation on this process treats its host table `which` (1 the rank table,
 * 2 the node table, 3 the node names, 4 the GPU table; 0: none, the default) as not allocated,
 * as host malloc refusing it would. */
#define SP_WORLD_TEST_TABLES 4
void sp__world_test_fail_host_tables(int which);
/* Agreement rounds this process has started (sp__agree and sp__agree_band_buf), for tests. */
uint64_t sp__agree_rounds(void);
/* Does comm still carry a request abandoned at a timeout? (Completed ones are reaped.) */
bool sp__agree_pending(MPI_Comm comm);
/* Test every abandoned request for at most limit_s; drop those that complete (MPI_Finalize). */
void sp__agree_drain(double limit_s);

/* A world-level round (create, collectives, statistics) on the world's own agreement
 * communicator, numbered by the world's call counter. SP_ERR_INVALID_USAGE if w is not a live
 * world. Then sp__agree_check. */
sp_status_t sp__world_agree(sp_world_t *w, sp_agree_t *a, const char *what);
/* A deadline-bounded MPI_BAND round of `words` words on the world's agreement communicator
 * (sp__agree_band_buf), after a world round that agreed on the length: buf (heap, 2 * words
 * words, allocated before that round) holds the input in its first half and, on SP_SUCCESS, the
 * result in its second (the caller frees it); on failure buf is gone (freed, or kept with an
 * abandoned request). */
sp_status_t sp__world_band(sp_world_t *w, uint64_t *buf, size_t words, const char *what);
/* Do w's agreement rounds carry a payload (sp__agree_carries_payload)? w is live. */
bool sp__world_agree_payload(const sp_world_t *w);
/* sp__world_agree for a world the caller has just checked live (sp__world_check), so that a
 * collective's hot path checks it once. */
sp_status_t sp__world_agree_live(sp_world_t *w, sp_agree_t *a, const char *what);
/* Rank, size and device of a world the caller has checked live: the public accessors check
 * liveness under the world lock on every call, which a collective's hot path does once. */
int sp__world_rank(const sp_world_t *w);
int sp__world_size(const sp_world_t *w);
int sp__world_device(const sp_world_t *w);
/* SP_ERR_INVALID_USAGE (naming fn) unless w is a live world (not NULL, not finalized, not
 * broken). */
sp_status_t sp__world_check(const sp_world_t *w, const char *fn);
/* Marks w broken, `why` saying what happened: a collective step on the world's own communicator
 * was abandoned at its deadline (an MPI_Comm_idup of it that not every rank joined), so its
 * collectives are out of step with the peers' for good. Every later world-level call on w
 * (sp__world_check: pool creation, collectives, statistics) then fails at once with
 * SP_ERR_INVALID_USAGE and the reason (existing pools keep their own communicators);
 * sp_world_finalize only frees this rank's part (no round, no collective release) and returns that
 * error. */
void sp__world_break(sp_world_t *w, const char *why);

#ifdef __cplusplus
}
#endif

#endif /* SP_WORLD_INT_H */
