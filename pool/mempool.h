/*
 * mempool.h: private to pool/: mempool.c's entry points for the rest of the allocator (MemPool
 * structs, per-thread routing). The public MemPool API is in sympool/mempool.h.
 */
#ifndef SP_POOL_MEMPOOL_H
#define SP_POOL_MEMPOOL_H

#include <stdatomic.h>
#include <stdbool.h>

#include "pool/allocator.h"

sp_mempool_t *sp__mempool_new(sp_devalloc_t *d, const sp_mempool_params_t *params, bool is_default,
                              bool symmetric);
/* sp_shutdown: free what the pool owns but keep the struct, so that its handle stays readable
 * and recognizably stale (handles.c). */
void sp__mempool_retire(sp_mempool_t *pool);
/* A destroyed pool that holds no segment any more (not symmetric): out of its device's list,
 * its handle refused from now on, its struct released once no call is inside the gate
 * (handles.c). Nothing for any other pool. Under d->lock. */
void sp__mempool_drop(sp_devalloc_t *d, sp_mempool_t *pool);
/* Threads with a non-empty routing stack (mempool.c): sp_malloc calls sp__mempool_routed
 * only when it is not 0. */
extern atomic_int sp__routing_threads;
/* The calling thread's innermost routed pool on `device`, or NULL. */
sp_mempool_t *sp__mempool_routed(int device);
/* Forget the calling thread's routing (sp_shutdown). */
void sp__mempool_routing_reset(void);
/* fork() child (fork.c), device locks held: drop the routings of the threads fork did not copy
 * from the use counts and the routing count. */
void sp__mempool_fork_child(void);

#endif /* SP_POOL_MEMPOOL_H */
