/*
 * handles.h: private to pool/: where MemPool structs live (handles.c), so that a handle is
 * checked before it is read: one sympool never gave out is recognized without touching it, one
 * from an earlier session (before sp_shutdown) by its generation, and one of a released pool by
 * generation 0. Slots are never reused, so a handle never names a later pool.
 */
#ifndef SP_POOL_HANDLES_H
#define SP_POOL_HANDLES_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* Bytes of one pool struct's slot (mempool.c asserts the struct fits, with a link after it). */
#define SP_HANDLE_SLOT 512

/* A zeroed slot for a new pool struct, never handed out before; NULL when out of memory or of
 * reserved address space. */
void *sp__handles_new(void);
/* Was this address ever given out as a pool handle? Lock-free; never reads *pool. */
bool sp__handles_known(const void *pool);
/* A slot its pool marked released (generation 0, under its device lock): release it once no
 * call can still read it (the shutdown gate's last call to leave, api.c). */
void sp__handles_release_later(void *slot);
/* Slots waiting for release: the gate reads it on leaving (relaxed), and takes the list only
 * when it is not 0. */
extern atomic_int sp__handles_npending;
/* Take the waiting slots (the caller then releases them, or puts them back). */
void *sp__handles_take_pending(void);
/* Wait until no thread holds the device lock a taken list's pools were dropped under (the
 * ungated malloc/free paths read a pool they dropped until they unlock): before a release. */
void sp__handles_wait_droppers(void *list);
/* mempool.c: take and give back the slot's pool's device lock. */
void sp__mempool_slot_wait(void *slot);
void sp__handles_put_back(void *list);
/* Release a taken list: each slot's owned memory (sp__mempool_slot_free), then every page whose
 * slots are all released goes back to the kernel. */
void sp__handles_release(void *list);
/* mempool.c: free what a released slot's struct owns. */
void sp__mempool_slot_free(void *slot);
/* The current generation: pools carry the one they were made in; sp_shutdown starts the next. */
uint64_t sp__handles_generation(void);
void sp__handles_next_generation(void);
/* fork() (pool/fork.c): hold the slots' lock across fork(). */
void sp__handles_fork_lock(void);
void sp__handles_fork_unlock(void);

#endif /* SP_POOL_HANDLES_H */
